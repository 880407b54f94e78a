//! No driver: no GPU list, but `/dev/nvidiaN` openers are still found by the
//! /proc scan, with the node's minor number taken as the GPU index. Every
//! question about GPUs is answered with why there is no driver, so reports
//! say so rather than show an empty, healthy-looking host.

use std::path::Path;

use super::{Driver, DriverError, GpuInfo, Node, classify_dev_node};

pub struct NoDriver {
    /// Why no driver is used: asked for (`--backend none`), or not found.
    why: String,
}

impl NoDriver {
    pub fn new(why: impl Into<String>) -> NoDriver {
        NoDriver { why: why.into() }
    }
}

impl Driver for NoDriver {
    fn describe(&self) -> String {
        "none".to_string()
    }

    fn gpu_count(&self) -> Result<u32, DriverError> {
        Ok(0)
    }

    fn gpu(&self, _index: u32) -> Result<GpuInfo, DriverError> {
        Err(DriverError::Unavailable(self.why.clone()))
    }

    fn gpus(&self) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
        Err(DriverError::Unavailable(self.why.clone()))
    }

    fn classify_node(&self, path: &Path) -> Option<Node> {
        classify_dev_node(path, Some)
    }
}
