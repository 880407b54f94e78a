//! The simulated driver's MPS list (`DIR/mps/PID.N`, docs/simulated-driver.md):
//! which processes it lists on GPU N as MPS clients, as NVML's
//! `nvmlDeviceGetMPSComputeRunningProcesses` does. A marker file a holder
//! writes, like its claims, before it opens the nodes; its content is not
//! read. Whether a process is listed on GPU N at all (and its memory) is
//! still its node and its claim.

use std::collections::BTreeSet;

use rustix::fs::OFlags;

use super::{SimDriver, open_in};

/// The PIDs with a marker `DIR/mps/PID.N` for GPU `index`. A `DIR/mps` that
/// is absent, a symbolic link or unreadable lists none: the driver says
/// nothing of MPS then, as a driver without the call.
pub(super) fn clients(driver: &SimDriver, index: u32) -> BTreeSet<u32> {
    let shown_as = driver.dir.join("mps");
    let Ok(Some(directory)) = open_in(&driver.directory, "mps", &shown_as, OFlags::DIRECTORY)
    else {
        return BTreeSet::new();
    };
    let Ok(entries) = rustix::fs::Dir::read_from(&directory) else {
        return BTreeSet::new();
    };
    let suffix = format!(".{index}");
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_str().ok()?.to_string();
            name.strip_suffix(&suffix)?.parse::<u32>().ok()
        })
        .collect()
}
