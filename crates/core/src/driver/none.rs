//! No driver: no GPU list, but `/dev/nvidiaN` openers are still found by the
//! /proc scan, with the node's minor number taken as the GPU index. Every
//! question about GPUs is answered with why there is no driver, so reports
//! say so rather than show an empty, healthy-looking host.

use std::path::Path;

use super::{Activity, Driver, DriverError, GpuInfo, classify_dev_node};
use crate::proc::Node;

pub(crate) struct NoDriver {
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

    /// The GPUs the device nodes say there are (`/dev/nvidiaN`: N + 1 for the
    /// largest N), so that `--gpu N` can name a GPU whose holders only the
    /// nodes show; 0 when there are none.
    fn gpu_count(&self) -> Result<u32, DriverError> {
        let count = std::fs::read_dir("/dev")
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|entry| {
                        let name = entry.file_name();
                        let minor = name.to_str()?.strip_prefix("nvidia")?;
                        (!minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit()))
                            .then(|| minor.parse::<u32>().ok())
                            .flatten()
                    })
                    .max()
                    .map_or(0, |largest| largest.saturating_add(1))
            })
            .unwrap_or(0);
        Ok(count)
    }

    fn gpu(&self, _index: u32) -> Result<GpuInfo, DriverError> {
        Err(DriverError::Unavailable(self.why.clone()))
    }

    fn gpus(&self) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
        Err(DriverError::Unavailable(self.why.clone()))
    }

    fn unavailable(&self) -> Option<String> {
        Some(self.why.clone())
    }

    /// No driver, no figures: all unknown.
    fn activity(&self, _index: u32) -> Activity {
        Activity::default()
    }

    fn classify_node(&self, path: &Path) -> Option<Node> {
        classify_dev_node(path, Some)
    }
}
