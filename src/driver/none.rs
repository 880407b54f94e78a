//! No driver: no GPU list, but `/dev/nvidiaN` openers are still found by the
//! /proc scan, with the node's minor number taken as the GPU index.

use std::path::Path;

use super::{Driver, DriverError, GpuInfo, Node, classify_dev_node};

pub struct NoDriver;

impl Driver for NoDriver {
    fn describe(&self) -> String {
        "none".to_string()
    }

    fn gpu_count(&self) -> Result<u32, DriverError> {
        Ok(0)
    }

    fn gpu(&self, index: u32) -> Result<GpuInfo, DriverError> {
        Err(DriverError::GpuLost { index })
    }

    fn classify_node(&self, path: &Path) -> Option<Node> {
        classify_dev_node(path, Some)
    }
}
