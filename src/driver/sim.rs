//! The simulated driver: real processes, real descriptors, simulated memory.
//!
//! `DIR/nvidiaN` plays GPU N's device node, and a process holds the GPU while
//! any descriptor of it points there, exactly as the real driver keeps memory
//! until the last descriptor closes. Memory is the holders' claims
//! (`DIR/claims/PID.N`, default 1 GiB) plus `DIR/leak.N`. `DIR/gpus` gives
//! totals and names. One extension beyond DESIGN.md: `DIR/lost.N` makes GPU N
//! answer as fallen off the bus, to test a driver failing mid-run. A process
//! whose descriptors the caller may not read holds GPU N if it has a claim on
//! it: the real driver sees every process, whoever asks.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::{Driver, DriverError, DriverProcess, GpuInfo, Node};
use crate::proc;

const DEFAULT_TOTAL: u64 = 80 << 30;
const DEFAULT_CLAIM: u64 = 1 << 30;
const DEFAULT_NAME: &str = "Simulated GPU";

pub struct SimDriver {
    dir: PathBuf,
    /// `DIR/nvidia`, as a string, for a fast prefix test on descriptor targets.
    node_prefix: String,
    gpu_count: u32,
}

impl SimDriver {
    pub fn open(dir: &Path) -> Result<SimDriver, DriverError> {
        let dir = dir
            .canonicalize()
            .map_err(|error| DriverError::Sim(format!("cannot open {}: {error}", dir.display())))?;
        let gpu_count = (0..)
            .take_while(|index| dir.join(format!("nvidia{index}")).is_file())
            .count() as u32;
        if gpu_count == 0 {
            return Err(DriverError::Sim(format!(
                "{} has no nvidia0: create one empty file per GPU (nvidia0, nvidia1, ...) and nvidiactl",
                dir.display()
            )));
        }
        let node_prefix = format!("{}/nvidia", dir.display());
        Ok(SimDriver {
            dir,
            node_prefix,
            gpu_count,
        })
    }

    fn read_bytes(&self, name: &str) -> Result<Option<u64>, DriverError> {
        match fs::read_to_string(self.dir.join(name)) {
            Ok(text) => text.trim().parse().map(Some).map_err(|_| {
                DriverError::Sim(format!(
                    "{name}: expected a byte count, found '{}'",
                    text.trim()
                ))
            }),
            Err(_) => Ok(None),
        }
    }

    /// Line N of `DIR/gpus`: total bytes, then an optional name.
    fn total_and_name(&self, index: u32) -> (u64, String) {
        let text = fs::read_to_string(self.dir.join("gpus")).unwrap_or_default();
        let line = text.lines().nth(index as usize).unwrap_or("").trim();
        let (total, name) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let total = total.parse().unwrap_or(DEFAULT_TOTAL);
        let name = match name.trim() {
            "" => DEFAULT_NAME.to_string(),
            name => name.to_string(),
        };
        (total, name)
    }

    /// A scan of /proc classified by this driver: its own process lists.
    fn scan(&self) -> Result<proc::ProcScan, DriverError> {
        proc::scan(&|path| self.classify_node(path))
            .map_err(|error| DriverError::Sim(format!("cannot read /proc: {error}")))
    }

    /// The live holders of each node, from a scan classified by this driver.
    fn holders_in(&self, scan: &proc::ProcScan) -> Result<BTreeMap<u32, Vec<u32>>, DriverError> {
        let mut holders: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for process in scan.processes.iter().filter(|p| p.state != 'Z') {
            for node in &process.nodes {
                if let Node::Gpu(index) = node {
                    holders.entry(*index).or_default().push(process.id.pid);
                }
            }
        }
        // A real driver sees every process, also those whose descriptors the
        // caller may not read (an unprivileged gpureap): for those, a claim
        // file stands for the open node.
        let hidden_from_us: Vec<u32> = scan
            .unreadable
            .iter()
            .map(|entry| entry.pid)
            .filter(|&pid| {
                scan.processes
                    .iter()
                    .any(|p| p.id.pid == pid && p.state != 'Z')
            })
            .collect();
        if !hidden_from_us.is_empty()
            && let Ok(claims) = fs::read_dir(self.dir.join("claims"))
        {
            for claim in claims.flatten() {
                let name = claim.file_name();
                let Some((pid, index)) = name.to_str().and_then(|name| name.split_once('.')) else {
                    continue;
                };
                if let (Ok(pid), Ok(index)) = (pid.parse::<u32>(), index.parse::<u32>())
                    && hidden_from_us.contains(&pid)
                    && index < self.gpu_count
                {
                    holders.entry(index).or_default().push(pid);
                }
            }
        }
        Ok(holders)
    }
    fn build(&self, index: u32, pids: &[u32]) -> Result<GpuInfo, DriverError> {
        if self.dir.join(format!("lost.{index}")).exists() {
            return Err(DriverError::GpuLost { index });
        }
        let mut processes = Vec::with_capacity(pids.len());
        for &pid in pids {
            let used = self
                .read_bytes(&format!("claims/{pid}.{index}"))?
                .unwrap_or(DEFAULT_CLAIM);
            processes.push(DriverProcess {
                pid,
                used_memory: Some(used),
            });
        }
        let leak = self.read_bytes(&format!("leak.{index}"))?.unwrap_or(0);
        let used = processes.iter().filter_map(|p| p.used_memory).sum::<u64>() + leak;
        let (total, name) = self.total_and_name(index);
        Ok(GpuInfo {
            index,
            name: Some(name),
            uuid: Some(format!("GPU-sim-{index:08}")),
            memory_total: Some(total),
            memory_used: Some(used),
            processes,
        })
    }
}

impl Driver for SimDriver {
    fn describe(&self) -> String {
        format!("sim:{}", self.dir.display())
    }

    fn gpu_count(&self) -> Result<u32, DriverError> {
        Ok(self.gpu_count)
    }

    fn gpu(&self, index: u32) -> Result<GpuInfo, DriverError> {
        if index >= self.gpu_count {
            return Err(DriverError::Sim(format!("no GPU {index}")));
        }
        let holders = self.holders_in(&self.scan()?)?;
        self.build(index, holders.get(&index).map_or(&[][..], Vec::as_slice))
    }

    fn gpus_given_scan(
        &self,
        scan: &proc::ProcScan,
    ) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
        let holders = self.holders_in(scan)?;
        Ok((0..self.gpu_count)
            .map(|index| self.build(index, holders.get(&index).map_or(&[][..], Vec::as_slice)))
            .collect())
    }

    fn gpus(&self) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
        self.gpus_given_scan(&self.scan()?)
    }

    fn classify_node(&self, path: &Path) -> Option<Node> {
        let rest = path.to_str()?.strip_prefix(&self.node_prefix)?;
        if rest == "ctl" {
            return Some(Node::Control);
        }
        rest.parse()
            .ok()
            .filter(|&index| index < self.gpu_count)
            .map(Node::Gpu)
    }
}
