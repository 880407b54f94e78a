//! From a scope to the exact set of processes to signal.
//!
//! The rule (docs/architecture.md): targets are the GPU users in scope and all their
//! descendants; `--pid` names processes directly, GPU users or not. Then the
//! guard removes what must never be signalled, and says why for each.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use regex::Regex;

use crate::proc::{ProcessId, ProcessRecord};
use crate::snapshot::Snapshot;
use crate::snapshot::mps::Role as MpsRole;
use crate::tree::ProcessTree;

/// Names protected by default: the driver's daemons, monitoring, and displays.
pub const DEFAULT_PROTECTED: [&str; 6] = [
    "nvidia-persistenced",
    "nv-hostengine",
    "dcgm-exporter",
    "nvidia-smi",
    "Xorg",
    "Xwayland",
];

/// What the user asked to free. Different kinds of filter narrow each other;
/// several values of one kind widen it (`--pid 1 --pid 2` is either).
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub gpus: Option<BTreeSet<u32>>,
    /// Named processes, by identity (PID and start time).
    pub pids: BTreeSet<ProcessId>,
    pub patterns: Vec<Regex>,
    pub uids: BTreeSet<u32>,
    pub orphans: bool,
    pub all: bool,
    /// `--stale-runs`: every process in a run cgroup whose supervisor is
    /// gone, found before the snapshot (`supervision::stale_runs`), by
    /// identity. Like `pids`, these are taken whether or not they use a GPU.
    pub stale_runs: Option<BTreeSet<ProcessId>>,
    /// `--container`, `--pod`, `--cgroup`: every process found in them (and
    /// the cgroups below) before the snapshot (`members::find`), by
    /// identity. Taken GPU user or not, like `stale_runs`, but the guard
    /// still spares a protected name or a monitor among them: being in a
    /// container is not being named.
    pub members: Option<BTreeSet<ProcessId>>,
    /// A Slurm job's processes (`gpureap slurm epilog`): a filter like `--user`.
    pub job: Option<JobScope>,
    /// `reap --older-than`: the age floor. A process younger than this (or
    /// whose age cannot be read) is never a target, named, in scope or a
    /// descendant: it is spared (`Spared::Young`), and nothing is reached
    /// through it.
    pub min_age: Option<Duration>,
    /// `reap --supervisor-gone`: holders of a `gpureap run` whose
    /// supervisor is gone (the `supervisor_gone` flag), a filter.
    pub supervisor_gone: bool,
    /// Only these processes, by identity, may be holders in scope (a
    /// filter: `reap` confirms what the scan before found, and gives the
    /// processes of ended Slurm jobs); their descendants go with them.
    pub within: Option<BTreeSet<ProcessId>>,
    /// Holders whose container or pod a node source says is gone
    /// (`docker rm -f`, a deleted pod), by identity, each with why
    /// (`gone_containers`): found once, before selection, from a snapshot the
    /// sources named (`Snapshot::attribute_containers`); `--orphans` takes
    /// them as it takes orphans.
    pub containers_gone: BTreeMap<ProcessId, String>,
    /// `free --mps-server`: MPS servers to stop deliberately, by identity,
    /// each with the clients that go through it (`Snapshot::mps_clients_of`,
    /// looked up in every look). The guard lets only these servers through
    /// (`Guard::mps_servers`); the control daemon never.
    pub mps_servers: BTreeSet<ProcessId>,
}

/// What belongs to one Slurm job: processes whose environment carries
/// `SLURM_JOB_ID=<id>`, and those whose environment names no job and that
/// run as the job's user. A process whose environment names another job is
/// never the job's, whoever runs it. The environment is read before
/// selection (`members`, `others`), so that selection stays pure.
#[derive(Debug, Clone, Default)]
pub struct JobScope {
    /// The job's uid; `None` for a job run as root, whose uid also owns the
    /// host's daemons: then only the environment marks the job's processes.
    pub uid: Option<u32>,
    /// Processes found with the job's `SLURM_JOB_ID` in their environment.
    pub members: BTreeSet<ProcessId>,
    /// Processes found with another job's `SLURM_JOB_ID` in their environment.
    pub others: BTreeSet<ProcessId>,
    /// The job's uid as Slurm gave it, root included (`uid` leaves root out).
    pub owner: Option<u32>,
}

impl JobScope {
    pub fn admits(&self, record: &ProcessRecord) -> bool {
        self.members.contains(&record.id)
            || (!self.others.contains(&record.id) && self.uid.is_some() && record.uid == self.uid)
    }

    /// Whether the process carries the job's context (its `SLURM_JOB_ID`)
    /// and runs as the job's uid: then it is the job's whatever its name,
    /// and a protected name does not spare it. Without either it looks like
    /// the daemon it is named after (one a prolog started carries the job's
    /// id, as root). Root's process under a protected name always does: root
    /// owns the host's daemons, so a root job's context cannot tell them from
    /// its leftovers; it is reported (the node drained), never signalled.
    pub fn owns(&self, record: &ProcessRecord) -> bool {
        self.members.contains(&record.id)
            && record.uid.is_some_and(|uid| uid != 0)
            && self.owner.is_none_or(|owner| record.uid == Some(owner))
    }
}

impl Scope {
    pub fn is_empty(&self) -> bool {
        self.gpus.is_none()
            && self.pids.is_empty()
            && self.patterns.is_empty()
            && self.uids.is_empty()
            && !self.orphans
            && !self.all
            && self.stale_runs.is_none()
            && self.members.is_none()
            && self.job.is_none()
            && !self.supervisor_gone
            && self.within.is_none()
            && self.mps_servers.is_empty()
    }

    /// Whether a filter narrows what `--pid` and `--stale-runs` name
    /// (`--gpu`, `--match`, `--user`, `--orphans`).
    pub fn narrowed(&self) -> bool {
        self.gpus.is_some()
            || !self.patterns.is_empty()
            || !self.uids.is_empty()
            || self.orphans
            || self.job.is_some()
            || self.supervisor_gone
            || self.within.is_some()
    }

    /// Why a process is named by this scope itself (`--pid`, `--stale-runs`,
    /// a member of `--container`, `--pod` or `--cgroup`), if it is.
    fn names(&self, record: &ProcessRecord) -> Option<Because> {
        let holds = |set: &Option<BTreeSet<ProcessId>>| {
            set.as_ref()
                .is_some_and(|members| members.contains(&record.id))
        };
        if self.pids.contains(&record.id) {
            Some(Because::Named)
        } else if holds(&self.stale_runs) {
            Some(Because::StaleRun)
        } else if holds(&self.members) {
            Some(Because::Member)
        } else {
            None
        }
    }

    /// Why a process is spared by the age floor (`min_age`), if it is: younger
    /// than it, or of an age the snapshot cannot tell.
    fn too_young(&self, snapshot: &Snapshot, record: &ProcessRecord) -> Option<Spared> {
        let floor = self.min_age?;
        match snapshot.age(record.id.pid) {
            Some(age) if age >= floor => None,
            age => Some(Spared::Young { age, floor }),
        }
    }

    /// Whether the scope names this process in a way that overrides the
    /// guard's guesses (protected names, monitors): `--pid` and a stale
    /// run's own members do; a container's, pod's or cgroup's do not.
    fn overrides_guard(&self, record: &ProcessRecord) -> bool {
        self.names(record)
            .is_some_and(|because| because != Because::Member)
    }

    /// Whether a process passes every filter other than `--pid`.
    fn admits(&self, snapshot: &Snapshot, record: &ProcessRecord) -> bool {
        let pid = record.id.pid;
        if let Some(gpus) = &self.gpus
            && snapshot.gpus_used_by(pid).is_disjoint(gpus)
        {
            return false;
        }
        if !self.patterns.is_empty()
            && !self
                .patterns
                .iter()
                .any(|pattern| pattern.is_match(&record.cmdline) || pattern.is_match(&record.comm))
        {
            return false;
        }
        if !self.uids.is_empty() && !record.uid.is_some_and(|uid| self.uids.contains(&uid)) {
            return false;
        }
        if self.job.as_ref().is_some_and(|job| !job.admits(record)) {
            return false;
        }
        if self
            .within
            .as_ref()
            .is_some_and(|within| !within.contains(&record.id))
        {
            return false;
        }
        if self.supervisor_gone && snapshot.supervisor_gone(pid).is_none() {
            return false;
        }
        // A run whose supervisor died is orphaned as a whole: its top process
        // leads a session of its own, so it is never orphaned by the rule itself.
        if self.orphans
            && snapshot.orphaned(pid).is_none()
            && snapshot.supervisor_gone(pid).is_none()
            && !self.containers_gone.contains_key(&record.id)
        {
            return false;
        }
        true
    }
}

/// The holders of `snapshot` whose container is gone, by identity, with the
/// reason (`Scope::containers_gone`).
pub fn gone_containers(snapshot: &Snapshot) -> BTreeMap<ProcessId, String> {
    snapshot
        .details
        .keys()
        .filter_map(|&pid| {
            let reason = snapshot.container_gone(pid)?.gone_reason()?;
            Some((snapshot.processes.get(&pid)?.id, reason))
        })
        .collect()
}

/// What may never be signalled, whatever the scope says.
#[derive(Debug, Clone)]
pub struct Guard {
    pub self_pid: u32,
    /// The shells and scripts that ran gpureap, up to PID 1.
    pub ancestors: BTreeSet<u32>,
    pub protected_names: BTreeSet<String>,
    /// The MPS servers `free --mps-server` stops on purpose: the one way
    /// past the MPS protection, which no `--pid` overrides.
    pub mps_servers: BTreeSet<ProcessId>,
}

impl Guard {
    /// The guard for this process, with the default protected names plus `extra`.
    pub fn for_this_process(extra: &[String]) -> Guard {
        let mut protected_names: BTreeSet<String> = DEFAULT_PROTECTED
            .iter()
            .map(|name| name.to_string())
            .collect();
        protected_names.extend(extra.iter().cloned());
        Guard {
            self_pid: std::process::id(),
            ancestors: crate::proc::ancestors_of_self(),
            protected_names,
            mps_servers: BTreeSet::new(),
        }
    }

    /// Why a process must be spared, or `None` if it may be signalled.
    pub fn spare_reason(
        &self,
        snapshot: &Snapshot,
        record: &ProcessRecord,
        named: bool,
    ) -> Option<Spared> {
        let pid = record.id.pid;
        if pid == self.self_pid {
            return Some(Spared::Itself);
        }
        if pid == 1 {
            return Some(Spared::Init);
        }
        if self.ancestors.contains(&pid) {
            return Some(Spared::Ancestor);
        }
        if record.kernel_thread {
            return Some(Spared::KernelThread);
        }
        // The MPS daemon and server carry every client: neither a name
        // (`--pid`) nor a job's context overrides that; only `--mps-server`
        // stops a server, deliberately.
        if let Some(role) = crate::snapshot::mps::role_by_name(record)
            && !(role == MpsRole::Server && self.mps_servers.contains(&record.id))
        {
            return Some(Spared::Mps(role));
        }
        // Naming a process overrides what is only a guess from its name or
        // its descriptors; nothing overrides the rules above.
        if named {
            return None;
        }
        if let Some(name) = protected_name(record, self.protected_names.iter().map(String::as_str))
        {
            return Some(Spared::Protected(name.to_string()));
        }
        if snapshot.is_monitor(pid) {
            return Some(Spared::Monitor);
        }
        None
    }
}

/// The protected name a process answers to, if any: its program (argv[0]'s
/// basename) or its comm, which the kernel cuts to 15 bytes
/// (nvidia-persistenced shows as nvidia-persiste).
pub(crate) fn protected_name<'a>(
    record: &ProcessRecord,
    names: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let program = record.program();
    names
        .into_iter()
        .find(|name| program == *name || record.comm == name.chars().take(15).collect::<String>())
}

/// Why a process in scope is left alone.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Spared {
    Itself,
    Ancestor,
    Init,
    KernelThread,
    Protected(String),
    Monitor,
    /// The MPS control daemon or server (docs/mps.md).
    Mps(MpsRole),
    /// Younger than the age floor (`reap --older-than`); `age` is `None`
    /// when it could not be read.
    Young {
        age: Option<Duration>,
        floor: Duration,
    },
}

impl std::fmt::Display for Spared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Spared::Itself => write!(f, "gpureap itself"),
            Spared::Ancestor => write!(
                f,
                "an ancestor of gpureap (the shell or script that ran it)"
            ),
            Spared::Init => write!(f, "PID 1"),
            Spared::KernelThread => write!(f, "a kernel thread"),
            Spared::Protected(name) => write!(
                f,
                "protected by name ({name}); name it with --pid to free it"
            ),
            Spared::Monitor => write!(
                f,
                "a monitor (no GPU context, no memory); name it with --pid to include it"
            ),
            Spared::Mps(MpsRole::Server) => write!(
                f,
                "an MPS server (nvidia-cuda-mps-server): every client of it would fail; stop it deliberately with --mps-server PID"
            ),
            Spared::Mps(_) => write!(
                f,
                "the MPS control daemon (nvidia-cuda-mps-control): stop it with `echo quit | nvidia-cuda-mps-control` in its CUDA_MPS_PIPE_DIRECTORY"
            ),
            Spared::Young {
                age: Some(age),
                floor,
            } => write!(
                f,
                "younger ({}) than the age floor ({})",
                crate::units::Elapsed(*age),
                crate::units::Elapsed(*floor)
            ),
            Spared::Young { age: None, floor } => write!(
                f,
                "of an age that cannot be read, so not known to be older than {}",
                crate::units::Elapsed(*floor)
            ),
        }
    }
}

impl Spared {
    /// Whether a holder spared for this reason is also left out of a
    /// verdict on what holds the GPUs: the Slurm health check's "clean",
    /// `check`'s and the exporter's orphaned memory, a one-pass `reap`'s
    /// "nothing left to free". The one rule, for every front end: sparing
    /// keeps a process from signals, and hides the memory the driver lists
    /// for it only where that memory is no leftover's: an MPS server's
    /// context serves its clients (docs/mps.md), and a holder younger than
    /// `reap --older-than` is not the rule's yet. A name never does: a real
    /// nvidia-smi, DCGM or exporter has no context, so anything the driver
    /// lists with memory is a holder whatever its name; nor does being a
    /// monitor, gpureap's ancestor or gpureap itself.
    pub fn excuses_memory(&self) -> bool {
        matches!(self, Spared::Mps(_) | Spared::Young { .. })
    }

    /// A short machine-readable name for JSON.
    pub fn code(&self) -> &'static str {
        match self {
            Spared::Itself => "self",
            Spared::Ancestor => "ancestor",
            Spared::Init => "init",
            Spared::KernelThread => "kernel_thread",
            Spared::Protected(_) => "protected",
            Spared::Monitor => "monitor",
            Spared::Mps(_) => "mps",
            Spared::Young { .. } => "young",
        }
    }
}

/// Why a process is a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Because {
    /// Named with `--pid`.
    Named,
    /// In a run cgroup whose supervisor is gone (`--stale-runs`).
    StaleRun,
    /// In the container, pod or cgroup of `--container`, `--pod`, `--cgroup`.
    Member,
    /// A GPU user matching the scope; with `--orphans`, also the top of a
    /// run whose supervisor is gone, above such a GPU user.
    InScope,
    /// A descendant of a target (its parent chain leads to `of`).
    Descendant { of: u32 },
    /// Named with `--mps-server`: an MPS server stopped deliberately.
    MpsServer,
    /// A client of an MPS server named with `--mps-server`: it goes down
    /// with its server.
    MpsClient { server: u32 },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub targets: BTreeMap<u32, Because>,
    pub spared: BTreeMap<u32, Spared>,
}

impl Selection {
    /// Whether a verdict counts `pid`'s memory as the scope's: a target, or
    /// spared for a reason that does not excuse memory (`Spared::excuses_memory`).
    pub fn counts(&self, pid: u32) -> bool {
        self.targets.contains_key(&pid)
            || self
                .spared
                .get(&pid)
                .is_some_and(|spared| !spared.excuses_memory())
    }
}

/// Without named roots: every GPU holder the scope admits (and the top of
/// a run whose supervisor is gone, with --orphans); a monitor in scope is
/// spared, and its children are not targets.
fn holders_in_scope(
    snapshot: &Snapshot,
    scope: &Scope,
    guard: &Guard,
    selection: &mut Selection,
) -> BTreeMap<u32, Because> {
    let mut chosen: BTreeMap<u32, Because> = BTreeMap::new();
    for pid in snapshot.holders() {
        let Some(record) = snapshot.processes.get(&pid) else {
            continue;
        };
        if !scope.admits(snapshot, record) {
            continue;
        }
        if snapshot.is_gpu_user(pid) {
            chosen.insert(pid, Because::InScope);
            // The rest of a run whose supervisor is gone goes with it: its
            // launcher would otherwise live on, and may start workers again.
            if scope.orphans
                && let Some(supervision) = snapshot.supervisor_gone(pid)
            {
                chosen.entry(supervision.top).or_insert(Because::InScope);
            }
        } else if snapshot.is_monitor(pid)
            && let Some(reason) = guard.spare_reason(snapshot, record, false)
        {
            // A monitor in scope: reported as spared, and its children are not targets.
            selection.spared.insert(pid, reason);
        }
    }
    chosen
}

/// With named roots (--pid, stale runs, members of a container, pod or
/// cgroup): each root matched by identity, and its descendants the scope
/// admits; a root the guard spares takes nothing under it.
fn named_families(
    snapshot: &Snapshot,
    tree: &ProcessTree,
    scope: &Scope,
    guard: &Guard,
    selection: &mut Selection,
) -> BTreeMap<u32, Because> {
    let mut chosen: BTreeMap<u32, Because> = BTreeMap::new();
    let mps = mps_roots(snapshot, scope);
    let roots = scope
        .pids
        .iter()
        .chain(scope.stale_runs.iter().flatten())
        .chain(scope.members.iter().flatten())
        .chain(mps.keys());
    for id in roots {
        // Matched by identity: a recycled PID is not the process that was named.
        let Some(root) = snapshot
            .processes
            .get(&id.pid)
            .filter(|record| record.id == *id)
        else {
            continue;
        };
        if let Some(reason) = guard
            .spare_reason(snapshot, root, scope.overrides_guard(root))
            .or_else(|| scope.too_young(snapshot, root))
        {
            // Naming PID 1 or the calling shell must not reach what runs under it.
            selection.spared.insert(id.pid, reason);
            continue;
        }
        let root_because = scope
            .names(root)
            .or_else(|| mps.get(id).copied())
            .unwrap_or(Because::Named);
        let family = std::iter::once((id.pid, root_because)).chain(
            tree.descendants(id.pid)
                .into_iter()
                .map(|pid| (pid, Because::Descendant { of: id.pid })),
        );
        for (pid, because) in family {
            let record = &snapshot.processes[&pid];
            if scope.admits(snapshot, record) {
                // Named itself beats found under another.
                let because = scope.names(record).unwrap_or(because);
                let entry = chosen.entry(pid).or_insert(because);
                if scope.names(record).is_some() {
                    *entry = because;
                }
            }
        }
    }
    chosen
}

/// The servers of `--mps-server` (matched by identity) and their clients,
/// each with why it is a root.
fn mps_roots(snapshot: &Snapshot, scope: &Scope) -> BTreeMap<ProcessId, Because> {
    let mut roots = BTreeMap::new();
    for server in &scope.mps_servers {
        if snapshot
            .processes
            .get(&server.pid)
            .is_none_or(|record| record.id != *server)
        {
            continue;
        }
        roots.insert(*server, Because::MpsServer);
        for client in snapshot.mps_clients_of(server.pid) {
            if let Some(record) = snapshot.processes.get(&client) {
                roots
                    .entry(record.id)
                    .or_insert(Because::MpsClient { server: server.pid });
            }
        }
    }
    roots
}

/// Applies a scope to a snapshot. Pure: no I/O, so that it can be checked
/// against random process forests.
pub fn select(snapshot: &Snapshot, scope: &Scope, guard: &Guard) -> Selection {
    let tree = snapshot.tree();
    // Named, or carrying the Slurm job's own context: either overrides a
    // protected name (`exec -a nvidia-smi python train.py` is the job's).
    let named = |record: &ProcessRecord| {
        scope.overrides_guard(record) || scope.job.as_ref().is_some_and(|job| job.owns(record))
    };
    let mut selection = Selection::default();
    let chosen = if scope.pids.is_empty()
        && scope.stale_runs.is_none()
        && scope.members.is_none()
        && scope.mps_servers.is_empty()
    {
        holders_in_scope(snapshot, scope, guard, &mut selection)
    } else {
        named_families(snapshot, &tree, scope, guard, &mut selection)
    };

    // The guard first, then descendants of what survived it: a spared
    // process's children are not targets through it.
    let place = |selection: &mut Selection, pid: u32, because: Because| -> bool {
        let Some(record) = snapshot.processes.get(&pid) else {
            return false;
        };
        let reason = guard
            .spare_reason(snapshot, record, named(record))
            .or_else(|| scope.too_young(snapshot, record));
        match reason {
            Some(reason) => {
                selection.spared.insert(pid, reason);
                false
            }
            None => {
                selection.targets.insert(pid, because);
                true
            }
        }
    };
    let roots: Vec<u32> = chosen
        .into_iter()
        .filter(|&(pid, because)| place(&mut selection, pid, because))
        .map(|(pid, _)| pid)
        .collect();
    // In a Slurm job's scope, a descendant that is not the job's (it names
    // another job, or runs as another user with no job's context) is not a
    // target through its parent: the epilog reports it instead.
    let outside_job = |pid: u32| {
        scope.job.as_ref().is_some_and(|job| {
            snapshot
                .processes
                .get(&pid)
                .is_some_and(|record| !job.admits(record))
        })
    };
    for root in roots {
        for pid in tree.descendants(root) {
            if !selection.targets.contains_key(&pid)
                && !selection.spared.contains_key(&pid)
                && !outside_job(pid)
            {
                place(&mut selection, pid, Because::Descendant { of: root });
            }
        }
    }
    selection
}
