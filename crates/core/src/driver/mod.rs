//! The GPU driver, behind one small trait with owned return types.
//!
//! Everything else in gpureap asks the driver how many GPUs there are, what
//! each one holds (memory and the processes it lists), and which device node
//! a path from `/proc/PID/fd` is; besides, how much memory it keeps for its
//! own bookkeeping (the tolerance of the one rule for memory held by no
//! process), what each GPU is doing (`Activity`: utilization, temperature,
//! power), to wait until memory figures move, and to reset a GPU. Its
//! errors are typed (`DriverError`, with its kind). Three backends answer: the
//! real NVML library, the simulated driver used by tests and the demo, and
//! `none`. It imports only the base (`proc`, `signal`, `exit`).

pub mod evidence;
pub mod mig;
mod none;
mod nvml;
pub mod sim;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::proc::Node;

pub(crate) use none::NoDriver;
pub(crate) use nvml::NvmlDriver;
pub use sim::SimDriver;

/// What the driver says about one GPU.
///
/// Contract for every backend: a value the driver could not report is `None`,
/// never 0. Process memory of `None` means "unknown", not "uses nothing".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub memory_total: Option<u64>,
    pub memory_used: Option<u64>,
    /// Memory the driver sets aside that no program can allocate (NVML's
    /// `reserved`: 480 MiB on an H100, 616 MiB on an H200): what CUDA, and
    /// so an engine, calls the GPU's total is `memory_total` less this. Not
    /// in `memory_used` (NVML's v2 memory query, as nvidia-smi shows it;
    /// the v1 query's `used`, which older tools read, includes it). `None`
    /// where the driver does not say (the simulated driver without
    /// `DIR/reserved`).
    pub memory_reserved: Option<u64>,
    /// The processes the driver lists as using this GPU, bogus PIDs removed.
    pub processes: Vec<DriverProcess>,
    /// The GPU's PCI bus id as the driver gives it (`00000000:3B:00.0`):
    /// how the kernel log's Xid lines name it.
    pub pci_bus_id: Option<String>,
    /// Whether the GPU is in MIG mode: `Some(false)` off, `None` where the
    /// driver does not say (docs/mig.md).
    pub mig_mode: Option<bool>,
    /// Its MIG instances, in MIG device index order (none where MIG is off).
    /// With MIG on, `processes` lists each holder with its memory `None`:
    /// the parent cannot say it; each instance's own list does.
    pub instances: Vec<MigInstance>,
    /// The PIDs of `processes` the driver lists as MPS clients, from the
    /// same answer (`nvmlDeviceGetMPSComputeRunningProcesses_v3`; the
    /// simulated driver: `DIR/mps/PID.N`): which of its processes reach the
    /// GPU through an MPS server (docs/mps.md). Empty where the driver
    /// cannot say.
    pub mps_clients: BTreeSet<u32>,
}

/// One MIG instance of a GPU (docs/mig.md): named `G:I` by its parent's
/// index and `index`, its MIG device index as NVML numbers them
/// (`nvmlDeviceGetMigDeviceHandleByIndex`), or by its `MIG-` UUID.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MigInstance {
    pub index: u32,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// The profile's name, as nvidia-smi prints it: `1g.18gb`, `3g.71gb`.
    pub profile: Option<String>,
    pub uuid: Option<String>,
    pub memory_total: Option<u64>,
    pub memory_used: Option<u64>,
    /// The processes with a context on this instance, each with its memory.
    #[serde(skip)]
    pub processes: Vec<DriverProcess>,
}

impl MigInstance {
    /// Memory in use that no listed process explains: `None` when the
    /// figure or a listed process's share is unknown.
    pub fn unattributed(&self) -> Option<u64> {
        let used = self.memory_used?;
        let mut explained = 0u64;
        for process in &self.processes {
            explained = explained.saturating_add(process.used_memory?);
        }
        Some(used.saturating_sub(explained))
    }

    /// Whether the instance lists this process.
    pub fn lists(&self, pid: u32) -> bool {
        self.processes.iter().any(|process| process.pid == pid)
    }
}

/// One entry of a driver's process list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverProcess {
    pub pid: u32,
    pub used_memory: Option<u64>,
}

/// What a GPU is doing now: the figures nvidia-smi's first lines, nvitop
/// and nvtop show. Each is `None` where the driver does not say, never 0
/// (an idle GPU's 0 % is `Some(0)`). Read beside a snapshot, never on its
/// path (`Snapshot::take_with_evidence`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activity {
    /// The share of the last sample period in which a kernel ran, in
    /// percent (NVML's `gpu` utilization, nvidia-smi's `utilization.gpu`).
    pub utilization_percent: Option<u32>,
    /// The GPU's temperature in °C (nvidia-smi's `temperature.gpu`).
    pub temperature_celsius: Option<u32>,
    /// The power drawn, in milliwatts as NVML gives it (`power.draw`).
    pub power_draw_milliwatts: Option<u32>,
    /// The power limit the GPU is held to, in milliwatts (`power.limit`).
    pub power_limit_milliwatts: Option<u32>,
    /// Each process's SM utilization over the last second, in percent, by
    /// PID (NVML's per-process samples). `None` where the driver gives
    /// none (MIG mode, GPUs before Maxwell). Where it gives them, a process
    /// it lists on the GPU and leaves out here used no SM in that second:
    /// NVML returns only samples that are not 0.
    pub process_sm_percent: Option<BTreeMap<u32, u32>>,
}

impl Activity {
    /// The SM utilization of a process the driver lists on this GPU;
    /// `None` where the driver gives no per-process figures.
    pub(crate) fn sm_percent(&self, pid: u32) -> Option<u32> {
        self.process_sm_percent
            .as_ref()
            .map(|samples| samples.get(&pid).copied().unwrap_or(0))
    }
}

/// What the driver could not do. It travels typed through the snapshot
/// (`Snapshot::driver_error`, `GpuState::error`) until a front end prints it
/// (`Display`) or decides on it (`DriverError::kind`).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DriverError {
    #[error("GPU {index} is {LOST}")]
    GpuLost { index: u32 },
    /// A GPU whose device node a process has open but that no driver listed
    /// (backend `none`): its memory is unknown.
    #[error("no driver answered for this GPU")]
    NoAnswer,
    #[error("NVML call failed: {0}")]
    Nvml(String),
    #[error("simulated driver: {0}")]
    Sim(String),
    #[error("{0}")]
    Unavailable(String),
}

/// Written in JSON as its message, the text `Display` gives.
impl serde::Serialize for DriverError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// What a lost GPU is, after "GPU N is ".
pub const LOST: &str = "lost (fallen off the bus or otherwise inaccessible)";

/// The kind of a driver's error, for the decisions made on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverErrorKind {
    /// The GPU fell off the bus or is otherwise inaccessible.
    Lost,
    /// No driver could be asked (not loaded, not installed, not answering).
    Unavailable,
    /// The driver answered with a failure.
    Failed,
}

impl DriverError {
    pub fn kind(&self) -> DriverErrorKind {
        match self {
            DriverError::GpuLost { .. } => DriverErrorKind::Lost,
            DriverError::NoAnswer | DriverError::Unavailable(_) => DriverErrorKind::Unavailable,
            DriverError::Nvml(_) | DriverError::Sim(_) => DriverErrorKind::Failed,
        }
    }
}

/// The driver's answer for every GPU (`Driver::gpus`).
pub type Answer = Result<Vec<Result<GpuInfo, DriverError>>, DriverError>;

/// Memory used per GPU, as one reading of several GPUs answers it.
pub type Figures = BTreeMap<u32, Result<Option<u64>, DriverError>>;

/// Whether a reading differs from the figures before it (an error reads as unknown).
pub(crate) fn changed(now: &Figures, last: &BTreeMap<u32, Option<u64>>) -> bool {
    now.iter().any(|(index, used)| {
        used.as_ref().ok().copied().flatten() != last.get(index).copied().flatten()
    })
}

/// One GPU driver. Implementations must be cheap to call repeatedly: `free`
/// and `wait` poll `memory_used` every few milliseconds.
pub trait Driver: Send + Sync {
    /// A short description for reports: `nvml (driver 580.95.05)`, `sim:/tmp/x`, `none`.
    fn describe(&self) -> String;

    fn gpu_count(&self) -> Result<u32, DriverError>;

    /// Everything about one GPU, including its process list.
    fn gpu(&self, index: u32) -> Result<GpuInfo, DriverError>;

    /// The GPU's UUID as the driver knew it when it opened: also for a GPU
    /// lost since, so that what names it (a metric's `uuid` label, a
    /// report) stays the same while it is down.
    fn known_uuid(&self, _index: u32) -> Option<String> {
        None
    }

    /// Every GPU, each with its own result, so that one lost GPU does not hide
    /// the others. Backends for which one pass is cheaper than N override this.
    fn gpus(&self) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
        Ok((0..self.gpu_count()?)
            .map(|index| self.gpu(index))
            .collect())
    }

    /// Every GPU's identity and MIG layout (UUID, MIG mode, instances with
    /// their UUIDs), for resolving names (`mig::resolve`): process lists
    /// and figures may be left out. The default asks `gpus`; a backend for
    /// which that costs a /proc scan (the simulated driver) answers from
    /// what it read at open.
    fn layout(&self) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
        self.gpus()
    }

    /// Memory used on one GPU, for polling. `Ok(None)` when the driver cannot say.
    fn memory_used(&self, index: u32) -> Result<Option<u64>, DriverError> {
        Ok(self.gpu(index)?.memory_used)
    }

    /// Memory used on each of these GPUs. Backends that answer for every
    /// GPU in one pass (the simulated driver reads /proc once) override it.
    fn memory_used_of(&self, indexes: &BTreeSet<u32>) -> Figures {
        indexes
            .iter()
            .map(|&index| (index, self.memory_used(index)))
            .collect()
    }

    /// Classifies a descriptor target; `None` for anything that is not a GPU node.
    /// Called once per open descriptor on the host, so it must be cheap.
    fn classify_node(&self, path: &Path) -> Option<Node>;

    /// Says that `wait_for_change` will follow: a backend that watches for
    /// changes starts watching now, so that its next reading is the one its
    /// watching counts from (the simulated driver's inotify, which a command
    /// that only looks never pays for). Callers that wait call it before
    /// their first reading; a wait without it reads once more first.
    fn will_wait(&self) {}

    /// Blocks until the memory used on any of these GPUs differs from `last`
    /// (or may have: a backend that cannot tell cheaply says so), or until
    /// `limit` passes. Returns the figures it saw change (`memory_used_of`'s
    /// answer for the GPUs of `last`), or `None` when nothing changed in
    /// time. Verification loops and `wait` call this between readings, so
    /// that they react at once to a release and otherwise cost nothing. The
    /// default polls `memory_used_of` every `poll`.
    fn wait_for_change(
        &self,
        last: &BTreeMap<u32, Option<u64>>,
        poll: Duration,
        limit: Duration,
    ) -> Option<Figures> {
        let deadline = Instant::now() + limit;
        let gpus: BTreeSet<u32> = last.keys().copied().collect();
        loop {
            let now = self.memory_used_of(&gpus);
            if changed(&now, last) {
                return Some(now);
            }
            let at = Instant::now();
            if at >= deadline {
                return None;
            }
            std::thread::sleep(poll.min(deadline - at));
        }
    }

    /// Why this backend can report nothing at all about GPUs (no driver),
    /// or `None` for a driver that can. Asked without any I/O.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// Memory the driver keeps for its own bookkeeping that no process list
    /// explains: the tolerance of the one rule for memory held by no process
    /// (`Snapshot::held_by_no_process`); unexplained memory up to this much
    /// is not called held. 0 unless the backend declares more (NVML: 256 MiB;
    /// the simulated driver: `DIR/bookkeeping`).
    fn bookkeeping_slack(&self) -> u64 {
        0
    }

    /// The GPU's PCI bus id as the driver knew it when it opened (also for a
    /// GPU lost since: its Xid 79 names that address).
    fn pci_bus_id(&self, _index: u32) -> Option<String> {
        None
    }

    /// What the driver counts about a GPU's health (ECC, retired pages,
    /// remapped rows, recovery action); `None` for each it cannot say.
    fn health(&self, _index: u32) -> evidence::Health {
        evidence::Health::default()
    }

    /// The kernel log's Xids, newest first: the host's (`/dev/kmsg`, else
    /// `journalctl -k`) unless the backend stands in for it.
    fn kernel_log(&self) -> evidence::KernelLog {
        evidence::host_kernel_log()
    }

    /// What the GPU is doing now (`Activity`): every backend says what it
    /// knows, and `Activity::default()` (all unknown) where it knows
    /// nothing. No default here, so that a backend or a view of one
    /// (`mig::InstanceView`) cannot leave it out unnoticed.
    fn activity(&self, index: u32) -> Activity;

    /// Whether the GPU is in persistence mode; `None` where not known.
    fn persistence_mode(&self, _index: u32) -> Option<bool> {
        None
    }

    /// The driver's modules and NVSwitches, for `reset --plan`: the
    /// host's unless the backend stands in for it.
    fn platform(&self) -> evidence::Platform {
        evidence::host_platform()
    }

    /// Each of these GPUs' hardware evidence, from one read of the kernel
    /// log, and what that read left unknown.
    fn evidence(
        &self,
        indexes: &BTreeSet<u32>,
    ) -> (BTreeMap<u32, evidence::Evidence>, Option<String>) {
        // No GPU, no log to read (a host without a driver pays nothing).
        if indexes.is_empty() {
            return (BTreeMap::new(), None);
        }
        let log = self.kernel_log();
        let found = indexes
            .iter()
            .map(|&index| {
                let pci_bus_id = self.pci_bus_id(index);
                let mut found = evidence::Evidence {
                    health: self.health(index),
                    ..evidence::Evidence::default()
                };
                let address = pci_bus_id.as_deref().and_then(evidence::PciAddress::parse);
                evidence::attach(&mut found, address, &log);
                found.pci_bus_id = pci_bus_id;
                (index, found)
            })
            .collect();
        (found, log.note)
    }

    /// Whether this driver's process lists may leave out the processes of
    /// PID namespaces other than the caller's, while their memory still
    /// counts as used. NVML 580 does (measured on an H200 from a PID
    /// namespace of its own: docs/gpu-validation.md, "What the real
    /// driver does"); older drivers list
    /// host PIDs instead, and which one answers cannot be told from here, so
    /// the default is yes. The simulated driver says what it models
    /// (`DIR/omit-other-namespaces`). Read by the one rule, only where
    /// gpureap does not see the host's PIDs (`Snapshot::held_by_no_process`).
    fn may_omit_other_namespaces(&self) -> bool {
        true
    }

    /// Resets one GPU, clearing memory that no process holds (driver-held).
    /// Never implicit: only `gpureap reset` and `--reset` call it, and only
    /// after checking that no process has the GPU's device node open; a
    /// backend re-checks what it can and refuses a GPU still in use. The
    /// default: this backend cannot reset.
    fn reset(&self, index: u32) -> Result<(), DriverError> {
        Err(DriverError::Unavailable(format!(
            "{} cannot reset GPU {index}",
            self.describe()
        )))
    }
}

/// Which backend the user asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Nvml,
    Sim(std::path::PathBuf),
    None,
}

impl BackendChoice {
    pub fn parse(text: &str) -> Result<BackendChoice, String> {
        match text {
            "auto" => Ok(BackendChoice::Auto),
            "nvml" => Ok(BackendChoice::Nvml),
            "none" => Ok(BackendChoice::None),
            _ => match text.strip_prefix("sim:") {
                Some(dir) if !dir.is_empty() => Ok(BackendChoice::Sim(dir.into())),
                _ => Err(format!(
                    "invalid backend '{text}': expected auto, nvml, none or sim:DIR"
                )),
            },
        }
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendChoice::Auto => write!(f, "auto"),
            BackendChoice::Nvml => write!(f, "nvml"),
            BackendChoice::Sim(dir) => write!(f, "sim:{}", dir.display()),
            BackendChoice::None => write!(f, "none"),
        }
    }
}

/// Opens the chosen backend. `auto` falls back to `none` when NVML does not
/// load, and says so once on stderr; an explicit `nvml` fails instead.
pub fn open(choice: &BackendChoice) -> Result<Box<dyn Driver>, String> {
    let driver = open_quietly(choice)?;
    if matches!(choice, BackendChoice::Auto)
        && let Some(why) = driver.unavailable()
    {
        eprintln!("gpureap: {why}; showing only processes with /dev/nvidia* open");
    }
    Ok(driver)
}

/// `open`, saying nothing of the fallback: for a report that says it itself
/// (`status`), so that it is said once.
pub fn open_quietly(choice: &BackendChoice) -> Result<Box<dyn Driver>, String> {
    match choice {
        BackendChoice::Nvml => NvmlDriver::open()
            .map(|driver| Box::new(driver) as Box<dyn Driver>)
            .map_err(|error| format!("cannot use NVML: {error}")),
        BackendChoice::Sim(dir) => SimDriver::open(dir)
            .map(|driver| Box::new(driver) as Box<dyn Driver>)
            .map_err(|error| error.to_string()),
        BackendChoice::None => Ok(Box::new(NoDriver::new(
            "--backend none: only processes with /dev/nvidia* open are shown",
        ))),
        BackendChoice::Auto => match NvmlDriver::open() {
            Ok(driver) => Ok(Box::new(driver)),
            Err(error) => Ok(Box::new(NoDriver::new(format!(
                "no NVIDIA driver found ({error})"
            )))),
        },
    }
}

/// Classifies paths under `/dev` the way the real driver names its nodes:
/// `/dev/nvidiaN` is the GPU whose minor number is N.
pub(crate) fn classify_dev_node(
    path: &Path,
    gpu_for_minor: impl Fn(u32) -> Option<u32>,
) -> Option<Node> {
    let name = path.to_str()?.strip_prefix("/dev/nvidia")?;
    if name.is_empty() {
        return None;
    }
    if name.bytes().all(|b| b.is_ascii_digit()) {
        return name.parse().ok().and_then(gpu_for_minor).map(Node::Gpu);
    }
    // nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset, nvidia-caps/...
    Some(Node::Control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_choices() {
        assert_eq!(BackendChoice::parse("auto"), Ok(BackendChoice::Auto));
        assert_eq!(
            BackendChoice::parse("sim:/tmp/x"),
            Ok(BackendChoice::Sim("/tmp/x".into()))
        );
        assert!(BackendChoice::parse("sim:").is_err());
        assert!(BackendChoice::parse("cuda").is_err());
    }

    #[test]
    fn dev_nodes() {
        let identity = |minor| Some(minor);
        assert_eq!(
            classify_dev_node(Path::new("/dev/nvidia3"), identity),
            Some(Node::Gpu(3))
        );
        assert_eq!(
            classify_dev_node(Path::new("/dev/nvidiactl"), identity),
            Some(Node::Control)
        );
        assert_eq!(
            classify_dev_node(Path::new("/dev/nvidia-uvm"), identity),
            Some(Node::Control)
        );
        assert_eq!(classify_dev_node(Path::new("/dev/null"), identity), None);
        assert_eq!(classify_dev_node(Path::new("/dev/nvidia"), identity), None);
        assert_eq!(classify_dev_node(Path::new("/dev/nvidia9"), |_| None), None);
    }
}
