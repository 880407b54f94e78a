//! One consistent view of who holds each GPU: the driver's process lists merged
//! with a /proc scan of descriptors on the device nodes.
//!
//! Neither source is enough alone. The driver knows memory but not parents,
//! sessions or states, and misses processes without a GPU context; /proc knows
//! the tree but not memory, and cannot see into other PID namespaces.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub mod mps;

use crate::container::{self, Container, Presence};
use crate::driver::evidence::Evidence;
use crate::driver::{Activity, BackendChoice, Driver, DriverError, MigInstance};
use crate::proc::{self, Node, ProcessRecord, State, Unreadable};
use crate::supervised::{self, Supervision};
use crate::tree::ProcessTree;

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub backend: String,
    pub taken_at_unix_ms: u64,
    pub gpus: Vec<GpuState>,
    /// Every process visible in this PID namespace, by PID.
    pub processes: BTreeMap<u32, ProcessRecord>,
    /// Processes whose descriptors could not be read: the scan is partial.
    pub unreadable: Vec<Unreadable>,
    /// Why the driver could not list GPUs at all, if it could not.
    pub driver_error: Option<DriverError>,
    /// Details read only for holders, to keep the scan cheap.
    pub details: BTreeMap<u32, Details>,
    pub uptime_ticks: Option<u64>,
    /// Memory the driver keeps for itself that no process list explains
    /// (`Driver::bookkeeping_slack`): the tolerance of the one rule for
    /// memory held by no process (`Snapshot::held_by_no_process`).
    pub bookkeeping_slack: u64,
    /// Each GPU's hardware evidence (Xids, ECC, row remapping), read only
    /// where a verdict is reported (`read_evidence`): empty until then.
    pub evidence: BTreeMap<u32, Evidence>,
    /// What reading the evidence left unknown (a kernel log not readable).
    pub evidence_note: Option<String>,
    /// What each GPU is doing (utilization, temperature, power, each
    /// process's SM), read beside the snapshot where it is shown
    /// (`read_activity`, `take_with_evidence`): empty until then.
    pub activity: BTreeMap<u32, Activity>,
    /// What the node's container sources could not tell
    /// (`Snapshot::attribute_containers`): shown with the holders.
    pub container_notes: Vec<String>,
    /// Whether gpureap saw the host's PIDs when the snapshot was taken
    /// (`container::sees_host_pids`): `Some(false)` in a PID namespace of its
    /// own, where a driver that omits other namespaces' processes from its
    /// lists (NVML 580) leaves their memory unexplained. The one rule reads
    /// it (`Snapshot::held_by_no_process`); `None` when it could not tell.
    pub host_pids: Option<bool>,
    /// Whether the driver's lists may leave out other PID namespaces'
    /// processes (`Driver::may_omit_other_namespaces`), as it said.
    pub lists_may_omit: bool,
    /// Whose descriptors were read: every process's, or only those of the
    /// processes the driver lists (`Snapshot::see`, `take_listed`).
    pub descriptors: Descriptors,
}

/// Whose descriptors a snapshot read (status JSON `scan.descriptors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Descriptors {
    /// Every process's: monitors, and processes with a node open that the
    /// driver does not list, are seen.
    All,
    /// Only those of the processes the driver lists, whose lists explained
    /// every GPU's memory (`Snapshot::lists_explain_all`): a process it does
    /// not list holds no memory; monitors were not looked for.
    Listed,
}

impl Descriptors {
    /// The name in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Descriptors::All => "all",
            Descriptors::Listed => "listed",
        }
    }
}

/// Memory held by no process on one GPU, as the one rule judges it
/// (`Snapshot::held_by_no_process`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unattributed {
    /// Memory in use that no listed process explains: `status`'s
    /// UNATTRIBUTED, the figure every command names.
    pub bytes: u64,
    /// What it is, as the one rule says.
    pub kind: UnattributedKind,
}

/// What memory no listed process explains is, by the one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnattributedKind {
    /// No more than the driver declares it keeps for its own bookkeeping:
    /// it does not make the GPU held.
    Bookkeeping,
    /// More, seen from the host's PID namespace: held by no process
    /// (driver-held); only a GPU reset or a reboot clears it.
    NoProcess,
    /// More, seen from a PID namespace of its own (a container without the
    /// host's PIDs): processes of other namespaces, which a driver may omit
    /// from its lists (NVML 580 does), may hold it. Neither driver-held nor
    /// a case for a reset: only the host's PIDs can tell.
    Unseen,
}

impl Unattributed {
    /// Whether it makes the GPU held, or may: more than the bookkeeping.
    pub fn holds(&self) -> bool {
        self.kind != UnattributedKind::Bookkeeping
    }

    /// Whether it is held by no process (driver-held): a reset may clear it.
    pub fn driver_held(&self) -> bool {
        self.kind == UnattributedKind::NoProcess
    }

    /// Whether processes gpureap cannot see may hold it.
    pub fn unseen(&self) -> bool {
        self.kind == UnattributedKind::Unseen
    }

    /// The verdict as the status JSON's `held_by_no_process` and the
    /// exporter's gauge give it: whether it is held by no process, `None`
    /// where that cannot be told (unseen).
    pub fn verdict(&self) -> Option<bool> {
        (!self.unseen()).then_some(self.driver_held())
    }

    /// The kind's name in JSON (`gpus[].unattributed_kind`).
    pub(crate) fn kind_name(&self) -> &'static str {
        match self.kind {
            UnattributedKind::Bookkeeping => "bookkeeping",
            UnattributedKind::NoProcess => "held_by_no_process",
            UnattributedKind::Unseen => "unseen",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuState {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub memory_total: Option<u64>,
    pub memory_used: Option<u64>,
    /// What the driver sets aside that nothing can allocate ([`GpuInfo`]'s).
    pub memory_reserved: Option<u64>,
    /// The driver's error for this GPU (lost, NVML failure); the rest is then unknown.
    pub error: Option<DriverError>,
    pub users: Vec<GpuUser>,
    /// Whether the GPU is in MIG mode, as the driver says (docs/mig.md).
    pub mig_mode: Option<bool>,
    /// Its MIG instances, each with its own process list and memory: a
    /// user's `memory` on a MIG GPU is the sum of its memory on them.
    pub instances: Vec<MigInstance>,
}

/// A process the driver lists on a GPU, or that has the GPU's node open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuUser {
    pub pid: u32,
    pub memory: Option<u64>,
    /// In the driver's process list for this GPU.
    pub listed: bool,
    /// Has this GPU's device node open (as /proc shows).
    pub node_open: bool,
    /// Listed by the driver but not a process of this /proc: absent here, or
    /// a local process with the same PID number that has no NVIDIA node open
    /// (the driver's PID is from another PID namespace).
    pub hidden: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Details {
    pub user: Option<String>,
    pub wchan: Option<String>,
    pub cgroup: Option<String>,
    /// The container (and pod) the process runs in, from the first line of
    /// its /proc/PID/cgroup that names one (`container::from_cgroup_file`:
    /// on a hybrid host a v1 hierarchy's, while `cgroup` shows the v2
    /// path), and its PID as the container sees it.
    pub container: Option<Container>,
    /// Started under `gpureap run` (its cgroup is one of a run's, or its
    /// environment names the supervising gpureap), and whether that
    /// supervisor is still there.
    pub supervision: Option<Supervision>,
    /// Its part in MPS (a client and the server it goes through, a server
    /// and its daemon), where it has one (`mps::attach`, docs/mps.md).
    pub mps: Option<mps::MpsLink>,
}

/// The flags a holder can carry (docs/json.md names them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    pub orphaned: bool,
    pub zombie: bool,
    pub uninterruptible: bool,
    pub hidden: bool,
    pub monitor: bool,
    /// Started under a `gpureap run` that still supervises it.
    pub supervised: bool,
    /// Started under a `gpureap run` that is gone (SIGKILLed, OOM-killed).
    pub supervisor_gone: bool,
    /// Its container or pod no longer exists, as a source that would list
    /// it says (`docker rm -f`, a deleted pod): `Presence::Gone`.
    pub container_gone: bool,
    /// It uses a GPU its Kubernetes container was never allocated.
    pub unrequested_gpu: bool,
}

impl Flags {
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.orphaned, "orphaned"),
            (self.zombie, "zombie"),
            (self.uninterruptible, "uninterruptible"),
            (self.hidden, "hidden"),
            (self.monitor, "monitor"),
            (self.supervised, "supervised"),
            (self.supervisor_gone, "supervisor_gone"),
            (self.container_gone, "container_gone"),
            (self.unrequested_gpu, "unrequested_gpu"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

impl GpuState {
    /// Memory in use that no listed process explains: `None` when the total
    /// or any listed process's share is unknown.
    pub fn unattributed(&self) -> Option<u64> {
        let used = self.memory_used?;
        let mut explained = 0u64;
        for user in self.users.iter().filter(|user| user.listed) {
            explained = explained.saturating_add(user.memory?);
        }
        Some(used.saturating_sub(explained))
    }

    /// Whether the driver, having answered for this GPU, lists this local
    /// process on it: it has a context here.
    pub fn lists(&self, pid: u32) -> bool {
        self.driver_answered()
            && self
                .users
                .iter()
                .any(|user| user.pid == pid && user.listed && !user.hidden)
    }

    /// Whether this process has this GPU's device node open.
    pub(crate) fn node_open_by(&self, pid: u32) -> bool {
        self.users
            .iter()
            .any(|user| user.pid == pid && user.node_open)
    }

    /// Whether the driver answered for this GPU, so that its list can be trusted.
    pub fn driver_answered(&self) -> bool {
        self.error.is_none()
    }
}

/// What each of these GPUs is doing, as the driver says.
fn activity_of(driver: &dyn Driver, indexes: &BTreeSet<u32>) -> BTreeMap<u32, Activity> {
    indexes
        .iter()
        .map(|&index| (index, driver.activity(index)))
        .collect()
}

impl Snapshot {
    /// Reads every GPU's hardware evidence from the driver (one read of the
    /// kernel log): for the commands that report a verdict, not every look.
    pub fn read_evidence(&mut self, driver: &dyn Driver) {
        let indexes = self.gpus.iter().map(|gpu| gpu.index).collect();
        let (evidence, note) = driver.evidence(&indexes);
        self.evidence = evidence;
        self.evidence_note = note;
    }

    /// Reads what every GPU is doing (`Driver::activity`): for the
    /// commands that show it, and again between full looks (`top`, the
    /// exporter), since it moves when nothing else does.
    pub fn read_activity(&mut self, driver: &dyn Driver) {
        let indexes: BTreeSet<u32> = self.gpus.iter().map(|gpu| gpu.index).collect();
        self.activity = activity_of(driver, &indexes);
    }

    /// A snapshot `take` gives, with every GPU's hardware evidence and
    /// activity read beside it on a thread of its own (the kernel log and
    /// NVML's health and activity queries overlap the process lists and the
    /// /proc reads): what `read_evidence` and `read_activity` after `take`
    /// would give, sooner. Read again after `take` where the GPUs it
    /// found are not those the driver counted.
    pub fn take_with_evidence(
        driver: &dyn Driver,
        take: impl FnOnce(&dyn Driver) -> Snapshot,
    ) -> Snapshot {
        std::thread::scope(|scope| {
            let reading = scope.spawn(|| {
                let indexes: BTreeSet<u32> = (0..driver.gpu_count().unwrap_or(0)).collect();
                let (evidence, note) = driver.evidence(&indexes);
                // After the evidence, on the same thread: NVML answers one
                // call at a time, so a thread of its own would overlap
                // nothing there, and costs a malloc arena (measured on the
                // simulated host: 4 arenas instead of 2, 50 KiB more anonymous memory).
                let activity = activity_of(driver, &indexes);
                (indexes, evidence, note, activity)
            });
            let mut snapshot = take(driver);
            let found: BTreeSet<u32> = snapshot.gpus.iter().map(|gpu| gpu.index).collect();
            match reading.join() {
                Ok((indexes, evidence, note, activity)) if indexes == found => {
                    tracing::debug!("evidence and activity read beside the snapshot");
                    snapshot.evidence = evidence;
                    snapshot.evidence_note = note;
                    snapshot.activity = activity;
                }
                _ => {
                    snapshot.read_evidence(driver);
                    snapshot.read_activity(driver);
                }
            }
            snapshot
        })
    }

    /// A GPU user's SM utilization there (`Activity::sm_percent`): only of
    /// a process the driver lists on it, where its activity was read.
    pub(crate) fn sm_percent(&self, index: u32, user: &GpuUser) -> Option<u32> {
        if !user.listed {
            return None;
        }
        self.activity.get(&index)?.sm_percent(user.pid)
    }

    /// The one rule for memory held by no process: each GPU's figure
    /// (`GpuState::unattributed`) and whether it makes the GPU held, past the
    /// tolerance the driver declares (`Driver::bookkeeping_slack`: 0 on the
    /// simulated driver unless `DIR/bookkeeping` says otherwise, NVML's
    /// bookkeeping allowance on nvml). `None` where the driver gives no figure
    /// for the GPU or for one of its listed processes: the process list alone
    /// then decides. verify, `check`, the exporter, Slurm, `reset` and the
    /// status JSON (which `status -H` reads) all judge through it. Beyond
    /// the tolerance, it is held by no process only where gpureap sees the
    /// host's PIDs (or cannot tell whether it does, as before namespaces had
    /// links), or where the driver lists every namespace's processes: in a
    /// PID namespace of its own, with a driver that may omit the others'
    /// (NVML's default), it is `Unseen`.
    pub fn held_by_no_process(&self, gpu: &GpuState) -> Option<Unattributed> {
        if !gpu.driver_answered() {
            return None;
        }
        self.judge_unattributed(gpu.unattributed()?)
    }

    /// The one rule for one MIG instance of an answered GPU: its memory
    /// used less what its listed holders explain, with the same tolerance
    /// and kinds as a whole GPU's (docs/mig.md).
    pub fn held_by_no_process_in(
        &self,
        gpu: &GpuState,
        instance: &MigInstance,
    ) -> Option<Unattributed> {
        if !gpu.driver_answered() {
            return None;
        }
        self.judge_unattributed(instance.unattributed()?)
    }

    fn judge_unattributed(&self, bytes: u64) -> Option<Unattributed> {
        let kind = if bytes <= self.bookkeeping_slack {
            UnattributedKind::Bookkeeping
        } else if self.may_miss_holders() {
            UnattributedKind::Unseen
        } else {
            UnattributedKind::NoProcess
        };
        Some(Unattributed { bytes, kind })
    }

    /// Whether the driver's lists explain every GPU's memory: the driver
    /// answered for each GPU (and there is one), and what its listed
    /// processes leave unexplained is within its bookkeeping by the one rule
    /// (`held_by_no_process`), on each GPU and each of its MIG instances.
    /// Then a process it does not list holds no GPU memory, and reading every
    /// process's descriptors could only add monitors (`Snapshot::see`).
    pub(crate) fn lists_explain_all(&self) -> bool {
        let within = |unattributed: Option<Unattributed>| {
            unattributed.is_some_and(|unattributed| !unattributed.holds())
        };
        self.driver_error.is_none()
            && !self.gpus.is_empty()
            && self.gpus.iter().all(|gpu| {
                within(self.held_by_no_process(gpu))
                    && gpu
                        .instances
                        .iter()
                        .all(|instance| within(self.held_by_no_process_in(gpu, instance)))
            })
    }

    /// Whether the driver's lists may leave out processes that hold GPUs:
    /// gpureap does not see the host's PIDs, and the driver may omit other
    /// namespaces' processes. Then memory no listed process explains is
    /// `Unseen`, and `reset` refuses.
    pub fn may_miss_holders(&self) -> bool {
        self.host_pids == Some(false) && self.lists_may_omit
    }

    /// Opens the driver of `backend` and takes the snapshot that suits it,
    /// with how long the snapshot took when that is asked (`listed`: the
    /// metrics count what the driver lists, the exporter's snapshot; else
    /// zero). On `/dev/nvidia*` nodes (NVML, none) the driver starts while
    /// /proc is scanned; the simulator's nodes need it open first. Only
    /// the simulator says on stderr that there is no driver: the report
    /// says it itself.
    pub fn open_and_take(
        backend: &BackendChoice,
        listed: bool,
    ) -> Result<(Box<dyn Driver>, Snapshot, Duration), String> {
        let opened = |driver: Box<dyn Driver>| {
            tracing::debug!(backend = driver.describe(), "driver opened");
            driver
        };
        match backend {
            _ if listed => {
                let driver = opened(crate::driver::open_quietly(backend)?);
                let started = std::time::Instant::now();
                let snapshot = Snapshot::take_listed(driver.as_ref());
                Ok((driver, snapshot, started.elapsed()))
            }
            BackendChoice::Auto | BackendChoice::Nvml | BackendChoice::None => {
                let (driver, snapshot) = Snapshot::take_while_opening(|| {
                    crate::driver::open_quietly(backend).map(opened)
                })?;
                Ok((driver, snapshot, Duration::ZERO))
            }
            BackendChoice::Sim(_) => {
                let driver = opened(crate::driver::open(backend)?);
                let snapshot = Snapshot::take(driver.as_ref());
                Ok((driver, snapshot, Duration::ZERO))
            }
        }
    }

    /// Takes a snapshot: one driver pass and one /proc pass.
    pub fn take(driver: &dyn Driver) -> Snapshot {
        Snapshot::take_focused(driver, &BTreeSet::new())
    }

    /// Takes a snapshot: one /proc pass, then one driver pass. Command lines
    /// and uids are read only where they are used: for holders, their
    /// ancestors and descendants, and `roots` (processes named by `--pid`)
    /// with their descendants.
    pub fn take_focused(driver: &dyn Driver, roots: &BTreeSet<u32>) -> Snapshot {
        let started = std::time::Instant::now();
        let scan = proc::scan(&|path| driver.classify_node(path));
        Snapshot::from_scan(driver, scan, roots, started)
    }

    /// The snapshot of a scan begun at `started`: the driver answers for the
    /// same moment, and a backend that reads /proc (the simulated driver)
    /// reads this scan, not a second one.
    fn from_scan(
        driver: &dyn Driver,
        scan: std::io::Result<proc::ProcScan>,
        roots: &BTreeSet<u32>,
        started: std::time::Instant,
    ) -> Snapshot {
        let scanned = started.elapsed();
        let (scan, answer) = match scan {
            Ok(scan) => {
                let (scan, answer) = proc::during(scan, || driver.gpus());
                (Ok(scan), answer)
            }
            Err(error) => (Err(error), driver.gpus()),
        };
        let timing = Timing {
            started,
            scanned,
            queried: started.elapsed(),
        };
        Snapshot::assemble(driver, scan, answer, roots, timing)
    }

    /// Opens the driver on a thread of its own while /proc is scanned, then
    /// takes the snapshot from that scan: NVML's start-up (26–29 ms on an
    /// H200) and the scan overlap instead of adding up. For backends whose
    /// device nodes are `/dev/nvidiaN` (NVML, none): the scan classifies a
    /// node by its minor number, and the driver, once open, maps each minor
    /// to its GPU index as a scan of its own would have (a minor it does not
    /// know is then no GPU node, as before).
    pub(crate) fn take_while_opening<E: Send>(
        open: impl FnOnce() -> Result<Box<dyn Driver>, E> + Send,
    ) -> Result<(Box<dyn Driver>, Snapshot), E> {
        let started = std::time::Instant::now();
        let by_minor = |path: &Path| crate::driver::classify_dev_node(path, Some);
        let (driver, scan) = std::thread::scope(|scope| {
            let opening = scope.spawn(open);
            let scan = proc::scan(&by_minor);
            let driver = opening
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (driver, scan)
        });
        let driver = driver?;
        let scan = scan.map(|mut scan| {
            // The driver opened its nodes while this very process was being
            // scanned: read them again, so that this process's own row does
            // not depend on which came first.
            let this = BTreeSet::from([std::process::id()]);
            proc::read_nodes_of(&mut scan, &this, &by_minor);
            renumber(&mut scan, driver.as_ref());
            scan
        });
        let snapshot = Snapshot::from_scan(driver.as_ref(), scan, &BTreeSet::new(), started);
        Ok((driver, snapshot))
    }

    /// Takes a snapshot of what the driver lists, for watching: the
    /// exporter, `check` and `status --prometheus` count the processes the
    /// driver lists, never those that only have a device node open
    /// (monitors). So where the driver answers for every GPU, descriptors
    /// are read only for the processes it lists (to tell a local process from
    /// a PID of another namespace, `hidden`); the rest of /proc is read for
    /// the process tree alone, which costs a fraction of reading every
    /// process's descriptors. Where the driver fails, or fails for one GPU,
    /// an open node is the only evidence left and every process's
    /// descriptors are read, as `take` does.
    pub fn take_listed(driver: &dyn Driver) -> Snapshot {
        Snapshot::listed(driver, false)
    }

    /// `plan`'s snapshot: as `take_listed`, of the process tree only the
    /// listed processes' families (`proc::scan_family`): a plan weighs the
    /// GPUs' memory and names their holders, at a cost that does not grow
    /// with the host's processes.
    pub fn take_listed_families(driver: &dyn Driver) -> Snapshot {
        Snapshot::listed(driver, true)
    }

    /// `take_listed`, with of the tree the listed processes' families alone
    /// (`families`) or the whole.
    fn listed(driver: &dyn Driver, families: bool) -> Snapshot {
        let started = std::time::Instant::now();
        // The driver first: a process it lists was started before the scan,
        // so the scan finds it unless it has exited meanwhile.
        let answer = driver.gpus();
        let queried = started.elapsed();
        let listed = listed_pids(&answer);
        let classify = |path: &Path| driver.classify_node(path);
        let scan = match &listed {
            Some(pids) => match families {
                true => proc::scan_family(pids).unwrap_or_else(proc::scan_tree),
                false => proc::scan_tree(),
            }
            .map(|mut scan| {
                proc::read_nodes_of(&mut scan, pids, &classify);
                scan
            }),
            None => proc::scan(&classify),
        };
        let done = started.elapsed();
        let timing = Timing {
            started,
            scanned: done - queried,
            queried: done,
        };
        let mut snapshot = Snapshot::assemble(driver, scan, answer, &BTreeSet::new(), timing);
        if listed.is_some() {
            snapshot.descriptors = Descriptors::Listed;
        }
        snapshot
    }

    /// `status`'s snapshot: the driver's answer first, then `see` decides
    /// whose descriptors to read.
    pub fn take_seen(driver: &dyn Driver) -> Snapshot {
        let started = std::time::Instant::now();
        Snapshot::see(driver, driver.gpus(), started)
    }

    /// From the driver's answer: where it answered for every GPU and each
    /// PID it lists is a process here, the listed processes' descriptors
    /// alone, and of the process tree only their families
    /// (`proc::scan_family`: ancestors, descendants, group and session
    /// leaders); kept where its lists then explain every GPU's memory
    /// (`lists_explain_all`), since a process it does not list holds none,
    /// whatever it has open. Otherwise (memory held by no listed process, a
    /// GPU or the driver not answering, a listed PID not in this namespace)
    /// every process's, as `take` reads them: that is how holders the driver
    /// does not list are found, and none is ever missed for speed.
    fn see(
        driver: &dyn Driver,
        answer: crate::driver::Answer,
        started: std::time::Instant,
    ) -> Snapshot {
        let classify = |path: &Path| driver.classify_node(path);
        let queried = started.elapsed();
        if let Some(pids) = listed_pids(&answer) {
            let family = proc::scan_family(&pids).unwrap_or_else(proc::scan_tree);
            if let Ok(mut scan) = family {
                let found = scan
                    .processes
                    .iter()
                    .filter(|record| pids.contains(&record.id.pid))
                    .count();
                if found == pids.len() {
                    proc::read_nodes_of(&mut scan, &pids, &classify);
                    let timing = Timing {
                        started,
                        scanned: started.elapsed() - queried,
                        queried: started.elapsed(),
                    };
                    let snapshot = Snapshot::assemble(
                        driver,
                        Ok(scan),
                        answer.clone(),
                        &BTreeSet::new(),
                        timing,
                    );
                    if snapshot.lists_explain_all() {
                        tracing::debug!(listed = pids.len(), "descriptors read: the listed only");
                        return Snapshot {
                            descriptors: Descriptors::Listed,
                            ..snapshot
                        };
                    }
                }
            }
        }
        tracing::debug!("descriptors read: every process's");
        let scanning = std::time::Instant::now();
        let scan = proc::scan(&classify);
        let timing = Timing {
            started,
            scanned: scanning.elapsed(),
            queried: started.elapsed(),
        };
        Snapshot::assemble(driver, scan, answer, &BTreeSet::new(), timing)
    }

    /// A snapshot from a scan and the driver's answer: merged, then command
    /// lines, uids and details read for the processes that matter (see
    /// `take_focused`).
    fn assemble(
        driver: &dyn Driver,
        scan: std::io::Result<proc::ProcScan>,
        answer: Result<Vec<Result<crate::driver::GpuInfo, DriverError>>, DriverError>,
        roots: &BTreeSet<u32>,
        timing: Timing,
    ) -> Snapshot {
        let (scan, scan_error) = match scan {
            Ok(scan) => (scan, None),
            Err(error) => (proc::ProcScan::default(), Some(error)),
        };
        let (infos, driver_error) = match answer {
            Ok(infos) => (infos, None),
            Err(error) => (Vec::new(), Some(error)),
        };
        let mps_listed: BTreeMap<u32, BTreeSet<u32>> = infos
            .iter()
            .flatten()
            .filter(|info| !info.mps_clients.is_empty())
            .map(|info| (info.index, info.mps_clients.clone()))
            .collect();
        let mut unreadable = scan.unreadable;
        if let Some(error) = scan_error {
            unreadable.push(Unreadable {
                pid: 0,
                comm: "/proc".to_string(),
                reason: error.to_string(),
            });
        }
        let processes = keyed(scan.processes);
        let mut snapshot = Snapshot {
            backend: driver.describe(),
            taken_at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_millis() as u64),
            gpus: merge(infos, &processes),
            processes,
            unreadable,
            driver_error,
            details: BTreeMap::new(),
            uptime_ticks: proc::uptime_ticks(),
            bookkeeping_slack: driver.bookkeeping_slack(),
            evidence: BTreeMap::new(),
            evidence_note: None,
            activity: BTreeMap::new(),
            container_notes: Vec::new(),
            host_pids: container::sees_host_pids(),
            lists_may_omit: driver.may_omit_other_namespaces(),
            descriptors: Descriptors::All,
        };
        // A GPU that did not answer is still named by the UUID the driver knew.
        for gpu in snapshot.gpus.iter_mut().filter(|gpu| gpu.uuid.is_none()) {
            gpu.uuid = driver.known_uuid(gpu.index);
        }
        let holders = snapshot.holders();
        let tree = snapshot.tree();
        let mut focus: BTreeSet<u32> = BTreeSet::new();
        for &pid in holders.iter().chain(roots) {
            focus.insert(pid);
            focus.extend(tree.descendants(pid));
            focus.extend(tree.ancestors(pid));
        }
        for pid in focus {
            let Some(record) = snapshot.processes.get_mut(&pid) else {
                continue;
            };
            record.cmdline = proc::cmdline(pid);
            // The real uid: /proc/PID is owned by root for non-dumpable processes.
            record.uid = proc::real_uid(pid);
        }
        // A user's name is looked up once: each lookup reads /etc/passwd.
        let mut users = BTreeMap::new();
        for pid in holders {
            if let Some(record) = snapshot.processes.get(&pid) {
                let details = read_details(record, &snapshot.processes, &mut users);
                snapshot.details.insert(pid, details);
            }
        }
        mps::attach(&mut snapshot, mps_listed);
        tracing::debug!(
            processes = snapshot.processes.len(),
            scan_ms = timing.scanned.as_secs_f64() * 1e3,
            driver_ms = (timing.queried - timing.scanned).as_secs_f64() * 1e3,
            details_ms = (timing.started.elapsed() - timing.queried).as_secs_f64() * 1e3,
            "snapshot"
        );
        snapshot
    }

    pub fn gpu(&self, index: u32) -> Option<&GpuState> {
        self.gpus.iter().find(|gpu| gpu.index == index)
    }

    /// The GPUs a local process uses: those whose driver lists it. Holding a
    /// node is not enough where the driver answered: monitors do, and so
    /// does every CUDA process for every GPU.
    pub fn gpus_used_by(&self, pid: u32) -> BTreeSet<u32> {
        let listed: BTreeSet<u32> = self
            .gpus
            .iter()
            .filter(|gpu| gpu.lists(pid))
            .map(|gpu| gpu.index)
            .collect();
        if !listed.is_empty() {
            return listed;
        }
        // Where the driver cannot answer, an open node is the only evidence
        // there is, and it counts: a holder that cannot be checked is never
        // taken for gone. A process the driver lists elsewhere has its
        // context there: the CUDA runtime opens every GPU's node.
        self.gpus
            .iter()
            .filter(|gpu| !gpu.driver_answered() && gpu.node_open_by(pid))
            .map(|gpu| gpu.index)
            .collect()
    }

    /// A process using at least one GPU (not merely watching).
    pub(crate) fn is_gpu_user(&self, pid: u32) -> bool {
        !self.gpus_used_by(pid).is_empty()
    }

    /// A monitor: has device nodes open, but the driver, which answered for
    /// the GPUs it holds, lists it nowhere (nvidia-smi, DCGM, exporters,
    /// gpureap itself).
    pub fn is_monitor(&self, pid: u32) -> bool {
        let Some(record) = self.processes.get(&pid) else {
            return false;
        };
        let answered = |index: u32| self.gpu(index).is_some_and(GpuState::driver_answered);
        !record.nodes.is_empty()
            && !self.is_gpu_user(pid)
            && self.driver_error.is_none()
            && record.nodes.iter().all(|node| match node {
                Node::Gpu(index) => answered(*index),
                Node::Control => true,
            })
    }

    /// Driver-listed users that are not processes of this /proc, by GPU.
    pub(crate) fn hidden_users(&self) -> Vec<(u32, GpuUser)> {
        self.gpus
            .iter()
            .flat_map(|gpu| {
                gpu.users
                    .iter()
                    .filter(|user| user.hidden)
                    .map(|user| (gpu.index, *user))
            })
            .collect()
    }

    /// Every local PID that uses a GPU or has a node open, in PID order.
    /// Hidden users are not among them (see `hidden_users`).
    pub fn holders(&self) -> Vec<u32> {
        let mut pids: BTreeSet<u32> = self
            .gpus
            .iter()
            .flat_map(|gpu| {
                gpu.users
                    .iter()
                    .filter(|user| !user.hidden)
                    .map(|user| user.pid)
            })
            .collect();
        pids.extend(
            self.processes
                .values()
                .filter(|record| !record.nodes.is_empty())
                .map(|record| record.id.pid),
        );
        pids.into_iter().collect()
    }

    pub fn flags(&self, pid: u32) -> Flags {
        match self.processes.get(&pid) {
            None => Flags {
                hidden: true,
                ..Flags::default()
            },
            Some(_)
                if !self.is_gpu_user(pid)
                    && self.hidden_users().iter().any(|(_, user)| user.pid == pid) =>
            {
                Flags {
                    hidden: true,
                    ..Flags::default()
                }
            }
            Some(record) => Flags {
                orphaned: self.orphaned(pid).is_some(),
                zombie: record.state == State::Zombie,
                uninterruptible: record.state == State::Uninterruptible,
                hidden: false,
                monitor: self.is_monitor(pid),
                supervised: self
                    .details
                    .get(&pid)
                    .and_then(|details| details.supervision.as_ref())
                    .is_some_and(|supervision| supervision.gone.is_none()),
                supervisor_gone: self.supervisor_gone(pid).is_some(),
                container_gone: self.container_gone(pid).is_some(),
                unrequested_gpu: self
                    .container(pid)
                    .is_some_and(|container| !container.unrequested_gpus.is_empty()),
            },
        }
    }

    /// How `pid` is supervised, when it was started under a `gpureap run`
    /// that is gone: its server runs on, unsupervised. Known for holders.
    pub fn supervisor_gone(&self, pid: u32) -> Option<&Supervision> {
        self.details
            .get(&pid)?
            .supervision
            .as_ref()
            .filter(|supervision| supervision.gone.is_some())
    }

    /// The container a process runs in, as far as its cgroup path and the
    /// node's sources tell. Known for holders.
    pub fn container(&self, pid: u32) -> Option<&Container> {
        self.details.get(&pid)?.container.as_ref()
    }

    /// The container `pid` runs in, when a source says it is gone (its
    /// `Presence::Gone` source names which): the holder lives on after
    /// `docker rm -f` or its pod's deletion.
    pub fn container_gone(&self, pid: u32) -> Option<&Container> {
        self.container(pid)
            .filter(|container| matches!(container.presence, Presence::Gone { .. }))
    }

    /// Names the holders' containers, judges whether they still exist and
    /// which GPUs their pods were allocated, from the node's sources
    /// (`container::sources`): what every front end that shows or acts on
    /// containers calls after taking its snapshot. Asks nothing when no
    /// holder is in a container. What could not be read becomes
    /// `container_notes` (also returned), never an error; it takes at most
    /// `Sources::BUDGET`.
    pub fn attribute_containers(&mut self, sources: &container::Sources) -> Vec<String> {
        let wanted: Vec<&Container> = self
            .details
            .values()
            .filter_map(|details| details.container.as_ref())
            .collect();
        if wanted.is_empty() {
            return Vec::new();
        }
        let knowledge = container::sources::consult(sources, &wanted);
        // Each holder's GPUs, with the UUID the kubelet's device ids name.
        let used: BTreeMap<u32, Vec<(u32, Option<String>)>> = self
            .details
            .keys()
            .map(|&pid| {
                let gpus = self
                    .gpus_used_by(pid)
                    .into_iter()
                    .map(|index| (index, self.gpu(index).and_then(|gpu| gpu.uuid.clone())))
                    .collect();
                (pid, gpus)
            })
            .collect();
        for (pid, details) in &mut self.details {
            let Some(container) = details.container.as_mut() else {
                continue;
            };
            knowledge.apply(container);
            if let Some(allocated) = knowledge.allocated(container) {
                container.unrequested_gpus = used
                    .get(pid)
                    .into_iter()
                    .flatten()
                    .filter_map(|(index, uuid)| {
                        let uuid = uuid.as_ref()?;
                        (!allocated.contains(uuid)).then_some(*index)
                    })
                    .collect();
            }
        }
        self.container_notes = knowledge.notes;
        self.container_notes.clone()
    }

    /// Whether, and why, a process is orphaned (see `Orphaned`).
    pub fn orphaned(&self, pid: u32) -> Option<Orphaned> {
        let record = self.processes.get(&pid)?;
        if pid == 1 || record.kernel_thread || record.pgid == pid || record.pgid == 0 {
            return None;
        }
        // A zombie leader has exited as well; a live process with the
        // leader's PID that leads another group is a stranger.
        let leader_alive = self
            .processes
            .get(&record.pgid)
            .is_some_and(|leader| leader.pgid == record.pgid && !leader.state.has_exited());
        if leader_alive {
            return None;
        }
        // Re-parented: to PID 1, or to a process of another session. A child
        // that does not lead its group never left its parent's session, so a
        // parent in another session is not the one it was born to: a
        // subreaper took it in.
        let parent = record.ppid;
        let reparented = parent == 1
            || self
                .processes
                .get(&parent)
                .is_some_and(|parent| parent.sid != record.sid);
        reparented.then_some(Orphaned {
            group_leader: record.pgid,
            parent,
        })
    }

    /// The process tree of this snapshot, for walks.
    pub fn tree(&self) -> ProcessTree {
        ProcessTree::new(self.processes.values())
    }

    /// Age of a process, to the clock tick (10 ms on most kernels), if the
    /// uptime could be read.
    pub fn age(&self, pid: u32) -> Option<std::time::Duration> {
        let record = self.processes.get(&pid)?;
        let ticks = self.uptime_ticks?.saturating_sub(record.id.start_time);
        Some(std::time::Duration::from_millis(
            ticks.saturating_mul(1000) / proc::ticks_per_second().max(1),
        ))
    }

    /// The memory a process uses on one GPU, as the driver reports it.
    pub fn memory_of(&self, pid: u32, gpu: u32) -> Option<u64> {
        self.gpu(gpu)?
            .users
            .iter()
            .find(|user| user.pid == pid)
            .and_then(|user| user.memory)
    }

    /// Whether any process was left out of the scan.
    pub fn is_partial(&self) -> bool {
        !self.unreadable.is_empty()
    }
}

/// Why a process counts as orphaned: the worker of a launcher that died.
///
/// An orphan is re-parented (to PID 1, or to a subreaper such as
/// `systemd --user`), stays in a process group whose leader is gone, and does
/// not lead a group of its own. An SGLang worker keeps its dead launcher's
/// group; a job started from an interactive shell (`nohup python train.py &`)
/// leads its own group and is not an orphan however its shell ended, nor is a
/// service or daemon, which leads its own session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Orphaned {
    /// The process group whose leader is gone.
    pub group_leader: u32,
    /// The process it was re-parented to.
    pub parent: u32,
}

impl std::fmt::Display for Orphaned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "group leader {} is gone; re-parented to ",
            self.group_leader
        )?;
        if self.parent == 1 {
            write!(f, "PID 1")
        } else {
            write!(f, "subreaper {}", self.parent)
        }
    }
}

/// Turns the GPU nodes of a scan classified by minor number (`/dev/nvidiaN`
/// is `Gpu(N)`) into what `driver` makes of `/dev/nvidiaN`: its GPU index, or
/// no GPU node at all for a minor it does not know.
fn renumber(scan: &mut proc::ProcScan, driver: &dyn Driver) {
    for record in &mut scan.processes {
        record.nodes = std::mem::take(&mut record.nodes)
            .into_iter()
            .filter_map(|node| match node {
                Node::Gpu(minor) => driver.classify_node(Path::new(&format!("/dev/nvidia{minor}"))),
                Node::Control => Some(Node::Control),
            })
            .collect();
    }
}

/// Every PID the driver lists on some GPU, where it answered for every GPU
/// (and there is one); `None` otherwise.
fn listed_pids(answer: &crate::driver::Answer) -> Option<BTreeSet<u32>> {
    match answer {
        Ok(infos) if !infos.is_empty() => infos.iter().map(|info| info.as_ref().ok()).try_fold(
            BTreeSet::new(),
            |mut pids, info| {
                pids.extend(info?.processes.iter().map(|process| process.pid));
                Some(pids)
            },
        ),
        _ => None,
    }
}

/// When a snapshot's parts were done, for the debug log.
#[derive(Clone, Copy)]
struct Timing {
    started: std::time::Instant,
    /// How long the /proc scan took.
    scanned: std::time::Duration,
    /// Since `started`, when both the scan and the driver's answer were in.
    queried: std::time::Duration,
}

/// A holder of a MIG GPU, whose memory the parent cannot say: the sum of
/// its memory on the instances that list it (`None` where one cannot say).
fn from_instances(mut user: GpuUser, instances: &[MigInstance]) -> GpuUser {
    if user.memory.is_none() && !instances.is_empty() {
        user.memory = instances
            .iter()
            .flat_map(|instance| &instance.processes)
            .filter(|process| process.pid == user.pid)
            .try_fold(0u64, |sum, process| {
                process.used_memory.map(|bytes| sum.saturating_add(bytes))
            });
    }
    user
}

/// The scan's records by PID, with this gpureap's device nodes left out: it
/// has them open when its driver is NVML (it asks the driver through them),
/// and is no one's holder or monitor. Seen on an H200: `status` listed
/// itself as a monitor.
fn keyed(records: Vec<ProcessRecord>) -> BTreeMap<u32, ProcessRecord> {
    let this = std::process::id();
    records
        .into_iter()
        .map(|mut record| {
            if record.id.pid == this {
                record.nodes.clear();
            }
            (record.id.pid, record)
        })
        .collect()
}

fn merge(
    infos: Vec<Result<crate::driver::GpuInfo, DriverError>>,
    processes: &BTreeMap<u32, ProcessRecord>,
) -> Vec<GpuState> {
    let mut gpus: Vec<GpuState> = infos
        .into_iter()
        .enumerate()
        .map(|(position, info)| match info {
            Ok(info) => GpuState {
                mig_mode: info.mig_mode,
                index: info.index,
                name: info.name,
                uuid: info.uuid,
                memory_total: info.memory_total,
                memory_used: info.memory_used,
                memory_reserved: info.memory_reserved,
                error: None,
                users: info
                    .processes
                    .into_iter()
                    .map(|process| GpuUser {
                        pid: process.pid,
                        memory: process.used_memory,
                        listed: true,
                        node_open: false,
                        hidden: is_foreign(process.pid, processes),
                    })
                    .map(|user| from_instances(user, &info.instances))
                    .collect(),
                instances: info.instances,
            },
            Err(error) => GpuState {
                mig_mode: None,
                instances: Vec::new(),
                index: match error {
                    DriverError::GpuLost { index } => index,
                    _ => position as u32,
                },
                name: None,
                uuid: None,
                memory_total: None,
                memory_used: None,
                memory_reserved: None,
                error: Some(error),
                users: Vec::new(),
            },
        })
        .collect();

    for record in processes.values() {
        for node in &record.nodes {
            let Node::Gpu(index) = *node else { continue };
            let gpu = match gpus.iter_mut().find(|gpu| gpu.index == index) {
                Some(gpu) => gpu,
                None => {
                    // A node the driver did not report (backend `none`): show it, memory unknown.
                    gpus.push(GpuState {
                        mig_mode: None,
                        instances: Vec::new(),
                        index,
                        name: None,
                        uuid: None,
                        memory_total: None,
                        memory_used: None,
                        memory_reserved: None,
                        error: Some(DriverError::NoAnswer),
                        users: Vec::new(),
                    });
                    gpus.last_mut().expect("just pushed")
                }
            };
            match gpu.users.iter_mut().find(|user| user.pid == record.id.pid) {
                Some(user) => user.node_open = true,
                None => gpu.users.push(GpuUser {
                    pid: record.id.pid,
                    memory: None,
                    listed: false,
                    node_open: true,
                    hidden: false,
                }),
            }
        }
    }
    gpus.sort_by_key(|gpu| gpu.index);
    for gpu in &mut gpus {
        gpu.users.sort_by_key(|user| user.pid);
    }
    gpus
}

/// Whether a PID from the driver's list names no process of this /proc: none
/// has it, or the one that has it opened no NVIDIA node at all (every GPU
/// user holds the control node), so the driver means a process in another
/// PID namespace whose number only collides with a local one.
fn is_foreign(pid: u32, processes: &BTreeMap<u32, ProcessRecord>) -> bool {
    match processes.get(&pid) {
        None => true,
        Some(record) => record.fds_readable && record.nodes.is_empty(),
    }
}

fn read_details(
    record: &ProcessRecord,
    processes: &BTreeMap<u32, ProcessRecord>,
    users: &mut BTreeMap<u32, String>,
) -> Details {
    let pid = record.id.pid;
    let cgroup_file = proc::cgroup_file(pid);
    let cgroup = cgroup_file.as_deref().and_then(proc::cgroup_shown);
    let container = cgroup_file
        .as_deref()
        .and_then(|text| container::of_process(pid, text));
    let supervision = supervised::supervision_of(record, cgroup.as_deref(), processes);
    Details {
        user: record.uid.map(|uid| {
            users
                .entry(uid)
                .or_insert_with(|| {
                    uzers::get_user_by_uid(uid).map_or_else(
                        || uid.to_string(),
                        |user| user.name().to_string_lossy().into_owned(),
                    )
                })
                .clone()
        }),
        wchan: if matches!(record.state, State::Uninterruptible | State::Sleeping) {
            proc::wchan(pid)
        } else {
            None
        },
        cgroup,
        container,
        supervision,
        mps: None,
    }
}

/// The unit tests' host: GPU 0 of 80 GiB with `used` bytes in use by these
/// users, these processes, the host's PIDs seen, nothing else read; a test
/// changes what it is about with `..Snapshot::one_gpu(..)`.
#[cfg(test)]
impl Snapshot {
    pub(crate) fn one_gpu(
        used: u64,
        users: Vec<GpuUser>,
        processes: BTreeMap<u32, ProcessRecord>,
    ) -> Snapshot {
        Snapshot {
            backend: "test".to_string(),
            taken_at_unix_ms: 0,
            gpus: vec![GpuState {
                mig_mode: None,
                instances: Vec::new(),
                index: 0,
                name: None,
                uuid: None,
                memory_total: Some(80 << 30),
                memory_used: Some(used),
                memory_reserved: None,
                error: None,
                users,
            }],
            processes,
            unreadable: Vec::new(),
            driver_error: None,
            details: BTreeMap::new(),
            evidence: BTreeMap::new(),
            evidence_note: None,
            activity: BTreeMap::new(),
            uptime_ticks: None,
            bookkeeping_slack: 0,
            container_notes: Vec::new(),
            host_pids: Some(true),
            lists_may_omit: true,
            descriptors: Descriptors::All,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{DriverProcess, GpuInfo};
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A driver that lists what it is told to and counts the descriptors it
    /// is asked to classify: `node` plays GPU 0's device node.
    struct Listing {
        node: PathBuf,
        listed: Vec<u32>,
        lost: Option<u32>,
        classified: AtomicUsize,
    }

    impl Driver for Listing {
        fn describe(&self) -> String {
            "listing".to_string()
        }
        fn gpu_count(&self) -> Result<u32, DriverError> {
            Ok(2)
        }
        fn gpu(&self, index: u32) -> Result<GpuInfo, DriverError> {
            if self.lost == Some(index) {
                return Err(DriverError::GpuLost { index });
            }
            let processes: Vec<DriverProcess> = if index == 0 {
                self.listed
                    .iter()
                    .map(|&pid| DriverProcess {
                        pid,
                        used_memory: Some(1 << 30),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            Ok(GpuInfo {
                index,
                name: None,
                uuid: None,
                memory_total: Some(80 << 30),
                memory_used: Some(processes.len() as u64 * (1 << 30)),
                memory_reserved: None,
                processes,
                pci_bus_id: None,
                mig_mode: None,
                instances: Vec::new(),
                mps_clients: BTreeSet::new(),
            })
        }
        fn classify_node(&self, path: &Path) -> Option<Node> {
            self.classified.fetch_add(1, Ordering::Relaxed);
            (path == self.node).then_some(Node::Gpu(0))
        }
        fn activity(&self, _index: u32) -> Activity {
            Activity::default()
        }
    }

    /// A child with `node` open as its stdin, or nothing extra open.
    fn child(node: Option<&Path>) -> Child {
        let stdin = match node {
            Some(node) => Stdio::from(std::fs::File::open(node).expect("node")),
            None => Stdio::null(),
        };
        Command::new("sleep")
            .arg("30")
            .stdin(stdin)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sleep")
    }

    fn user(snapshot: &Snapshot, pid: u32) -> Option<GpuUser> {
        snapshot
            .gpu(0)?
            .users
            .iter()
            .find(|user| user.pid == pid)
            .copied()
    }

    /// A scan made before the driver was open numbers GPU nodes by minor;
    /// the driver's own numbering replaces it, and a minor it does not know
    /// is no GPU node.
    #[test]
    fn nodes_scanned_by_minor_take_the_drivers_numbering() {
        struct Minors;
        impl Driver for Minors {
            fn describe(&self) -> String {
                "minors".to_string()
            }
            fn gpu_count(&self) -> Result<u32, DriverError> {
                Ok(2)
            }
            fn gpu(&self, index: u32) -> Result<GpuInfo, DriverError> {
                Err(DriverError::GpuLost { index })
            }
            fn activity(&self, _index: u32) -> Activity {
                Activity::default()
            }
            // Minor 4 is GPU 0, minor 2 is GPU 1, as NVML may number them.
            fn classify_node(&self, path: &Path) -> Option<Node> {
                crate::driver::classify_dev_node(path, |minor| match minor {
                    4 => Some(0),
                    2 => Some(1),
                    _ => None,
                })
            }
        }
        let record = |pid: u32, nodes: &[Node]| crate::proc::ProcessRecord {
            uid: None,
            cmdline: String::new(),
            nodes: nodes.iter().copied().collect(),
            ..crate::proc::ProcessRecord::sleeping(pid, "python3")
        };
        let mut scan = proc::ProcScan {
            processes: vec![
                record(10, &[Node::Control, Node::Gpu(4), Node::Gpu(2)]),
                record(11, &[Node::Gpu(7)]),
                record(12, &[]),
            ],
            unreadable: Vec::new(),
        };
        renumber(&mut scan, &Minors);
        let nodes = |index: usize| {
            scan.processes[index]
                .nodes
                .iter()
                .copied()
                .collect::<Vec<_>>()
        };
        assert_eq!(nodes(0), vec![Node::Gpu(0), Node::Gpu(1), Node::Control]);
        assert_eq!(nodes(1), Vec::<Node>::new());
        assert_eq!(nodes(2), Vec::<Node>::new());
    }

    /// The gpureap that looks has the GPU nodes open (NVML opens them in its
    /// process): it is not among the GPU's users; another process is.
    #[test]
    fn the_looking_gpureap_is_no_user_of_the_gpus_it_asks_about() {
        let record = |pid: u32| crate::proc::ProcessRecord {
            uid: None,
            cmdline: String::new(),
            nodes: [Node::Control, Node::Gpu(0)].into_iter().collect(),
            ..crate::proc::ProcessRecord::sleeping(pid, "gpureap")
        };
        let this = std::process::id();
        let other = if this == 4242 { 4243 } else { 4242 };
        let processes = keyed(vec![record(this), record(other)]);
        let gpus = merge(vec![Err(DriverError::GpuLost { index: 0 })], &processes);
        let users: Vec<u32> = gpus[0].users.iter().map(|user| user.pid).collect();
        assert_eq!(users, vec![other]);
        // Nor a monitor, nor in the holders' table: it has no node at all.
        assert!(processes[&this].nodes.is_empty());
        assert_eq!(processes[&other].nodes.len(), 2);
    }

    /// What the watching snapshot reads: descriptors of the listed processes
    /// only, where the driver answers for every GPU; every process's where
    /// it does not. A listed PID with no node open stays a PID of another
    /// namespace (hidden), and a monitor is not a holder.
    #[test]
    fn a_listed_snapshot_reads_descriptors_of_listed_processes_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let node = dir.path().join("nvidia0");
        std::fs::write(&node, b"").expect("node");
        let mut holder = child(Some(&node));
        let mut monitor = child(Some(&node));
        let mut collision = child(None);
        let (holder_pid, monitor_pid, collision_pid) = (holder.id(), monitor.id(), collision.id());
        let mut driver = Listing {
            node: node.clone(),
            listed: vec![holder_pid, collision_pid],
            lost: None,
            classified: AtomicUsize::new(0),
        };

        let listed = Snapshot::take_listed(&driver);
        let read = driver.classified.swap(0, Ordering::Relaxed);
        let full = Snapshot::take(&driver);
        let read_by_full = driver.classified.swap(0, Ordering::Relaxed);
        for snapshot in [&listed, &full] {
            let holder = user(snapshot, holder_pid).expect("holder");
            assert!(holder.listed && holder.node_open && !holder.hidden);
            assert!(user(snapshot, collision_pid).expect("collision").hidden);
            assert!(snapshot.processes.contains_key(&std::process::id()));
            assert!(
                snapshot
                    .tree()
                    .ancestors(holder_pid)
                    .contains(&std::process::id())
            );
            assert_eq!(snapshot.gpu(0).and_then(GpuState::unattributed), Some(0));
        }
        let descriptors = |pid: u32| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .expect("fd")
                .count()
        };
        let of_listed = descriptors(holder_pid) + descriptors(collision_pid);
        assert_eq!(read, of_listed, "descriptors read for two listed processes");
        assert!(read_by_full > read, "the full scan read {read_by_full}");
        assert!(!listed.holders().contains(&monitor_pid));
        assert!(full.holders().contains(&monitor_pid) && full.is_monitor(monitor_pid));

        // GPU 1 lost: an open node is the only evidence there, so every
        // process's descriptors are read again.
        driver.lost = Some(1);
        let degraded = Snapshot::take_listed(&driver);
        assert!(driver.classified.load(Ordering::Relaxed) > of_listed);
        assert!(degraded.holders().contains(&monitor_pid));
        assert!(degraded.gpu(1).is_some_and(|gpu| !gpu.driver_answered()));

        for child in [&mut holder, &mut monitor, &mut collision] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A driver whose GPU count can drop between two asks (a GPU gone
    /// between them), and that counts the evidence reads.
    struct Evidencing {
        counted: AtomicUsize,
        shrinks: bool,
        evidence_reads: AtomicUsize,
    }

    impl Driver for Evidencing {
        fn describe(&self) -> String {
            "evidencing".to_string()
        }
        fn gpu_count(&self) -> Result<u32, DriverError> {
            let asked = self.counted.fetch_add(1, Ordering::SeqCst);
            Ok(if self.shrinks && asked > 0 { 1 } else { 2 })
        }
        fn gpu(&self, index: u32) -> Result<GpuInfo, DriverError> {
            Ok(GpuInfo {
                index,
                name: None,
                uuid: None,
                memory_total: Some(80 << 30),
                memory_used: Some(0),
                memory_reserved: None,
                processes: Vec::new(),
                pci_bus_id: None,
                mig_mode: None,
                instances: Vec::new(),
                mps_clients: BTreeSet::new(),
            })
        }
        fn classify_node(&self, _path: &Path) -> Option<Node> {
            None
        }
        fn activity(&self, index: u32) -> Activity {
            Activity {
                temperature_celsius: Some(40 + index),
                ..Activity::default()
            }
        }
        fn evidence(&self, indexes: &BTreeSet<u32>) -> (BTreeMap<u32, Evidence>, Option<String>) {
            self.evidence_reads.fetch_add(1, Ordering::SeqCst);
            let found = indexes
                .iter()
                .map(|&index| (index, Evidence::default()))
                .collect();
            (found, Some(format!("read for {indexes:?}")))
        }
    }

    /// The evidence read beside the snapshot is the snapshot's GPUs', read
    /// once; where the GPUs the snapshot found are not those counted when
    /// the read began, it is read again for those found.
    #[test]
    fn evidence_read_beside_a_snapshot_is_of_the_gpus_it_found() {
        let steady = Evidencing {
            counted: AtomicUsize::new(0),
            shrinks: false,
            evidence_reads: AtomicUsize::new(0),
        };
        let snapshot =
            Snapshot::take_with_evidence(&steady, |driver| Snapshot::take_listed(driver));
        assert_eq!(
            snapshot.evidence.keys().copied().collect::<Vec<_>>(),
            [0, 1]
        );
        assert_eq!(steady.evidence_reads.load(Ordering::SeqCst), 1);
        assert_eq!(snapshot.evidence_note.as_deref(), Some("read for {0, 1}"));
        let temperatures: Vec<Option<u32>> = snapshot
            .activity
            .values()
            .map(|activity| activity.temperature_celsius)
            .collect();
        assert_eq!(temperatures, [Some(40), Some(41)]);

        let shrinking = Evidencing {
            counted: AtomicUsize::new(0),
            shrinks: true,
            evidence_reads: AtomicUsize::new(0),
        };
        // The thread counts first (2 GPUs), the snapshot after (1).
        let snapshot = Snapshot::take_with_evidence(&shrinking, |driver| {
            while shrinking.counted.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            Snapshot::take_listed(driver)
        });
        let found: Vec<u32> = snapshot.gpus.iter().map(|gpu| gpu.index).collect();
        assert_eq!(found, [0]);
        assert_eq!(snapshot.evidence.keys().copied().collect::<Vec<_>>(), found);
        assert_eq!(snapshot.activity.keys().copied().collect::<Vec<_>>(), found);
        assert_eq!(shrinking.evidence_reads.load(Ordering::SeqCst), 2);
        assert_eq!(snapshot.evidence_note.as_deref(), Some("read for {0}"));
    }
}
