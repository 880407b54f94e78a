//! Deciding, from one snapshot, whether a GPU is back to what out-of-scope
//! holders explain, and if not, why not.
//!
//! "Freed" is a claim about the driver, never about our signals: no process in
//! scope is listed any more and the memory used is what the remaining,
//! out-of-scope processes account for.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::proc::{ProcessId, ProcessRecord, State};
use crate::select::Selection;
use crate::signal::Sig;
use crate::snapshot::{GpuState, GpuUser, Snapshot, UnattributedKind};

/// Why memory on a GPU is still held, as a report names it.
#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// In scope, alive, in state D: the kernel will not deliver SIGKILL until
    /// the call it is blocked in returns.
    Uninterruptible {
        pid: u32,
        comm: String,
        wchan: Option<String>,
    },
    /// Came into scope after the last signal was sent (respawned, or
    /// started late), so it was never signalled.
    Appeared { pid: u32, comm: String },
    /// In scope and alive past the timeout despite the signals sent.
    StillAlive {
        pid: u32,
        comm: String,
        state: State,
        signals: Vec<Sig>,
    },
    /// Exited but not reaped; its parent has not called wait.
    Zombie {
        pid: u32,
        parent_pid: u32,
        parent_comm: String,
    },
    /// Listed by the driver but absent from this /proc: another PID namespace.
    /// `memory`: what the driver says it holds, where it says.
    Hidden { pid: u32, memory: Option<u64> },
    /// In scope but never signalled: protected, an ancestor, or gpureap itself.
    Protected { pid: u32, comm: String, why: String },
    /// The kernel refused our signal.
    PermissionDenied { pid: u32, comm: String },
    /// Killed holders kept coming back: their parent, out of scope, respawns them.
    Respawned {
        parent_pid: u32,
        parent_comm: String,
        times: u32,
    },
    /// No process in scope is left, and memory is still going down.
    StillReleasing { bytes: u64, bytes_per_second: u64 },
    /// No process holds it: only a GPU reset or a reboot clears it.
    /// `before`: how much of it was already held by no process when `free`
    /// started (what it signalled did not leave it); `None` when none was.
    DriverHeld { bytes: u64, before: Option<u64> },
    /// No listed process explains it, but gpureap runs in a PID namespace
    /// of its own: processes of other namespaces, which the driver may omit
    /// from its lists, may hold it (`UnattributedKind::Unseen`). Not
    /// driver-held: only the host's PIDs can tell, and `free` exits 3.
    Unseen { bytes: u64 },
    /// The driver did not answer for this GPU.
    DriverError { message: String },
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::units::{Bytes, Field};
        match self {
            Reason::Uninterruptible { pid, comm, wchan } => write!(
                f,
                "pid {pid} ({}) is in uninterruptible sleep (state D){}; SIGKILL lands when that call returns",
                Field(comm),
                wchan
                    .as_ref()
                    .map(|w| format!(" in {}", Field(w)))
                    .unwrap_or_default()
            ),
            Reason::Appeared { pid, comm } => write!(
                f,
                "pid {pid} ({}) came into scope after the last signal and was not signalled; run free again, or free its parent with --pid",
                Field(comm)
            ),
            Reason::StillAlive {
                pid,
                comm,
                state,
                signals,
            } => write!(
                f,
                "pid {pid} ({}) is still alive in state {state} after {}",
                Field(comm),
                signals
                    .iter()
                    .map(|signal| signal.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Reason::Zombie {
                pid,
                parent_pid,
                parent_comm,
            } => write!(
                f,
                "pid {pid} is a zombie: its parent {parent_pid} ({}) does not reap it; free the parent with --pid {parent_pid}",
                Field(parent_comm)
            ),
            Reason::Hidden { pid, .. } => write!(
                f,
                "pid {pid} is listed by the driver but not visible in this /proc (another PID namespace, e.g. a container); run gpureap on the host or inside that container"
            ),
            Reason::Protected { pid, comm, why } => {
                write!(f, "pid {pid} ({}) is in scope but is {why}", Field(comm))
            }
            Reason::PermissionDenied { pid, comm } => write!(
                f,
                "pid {pid} ({}): permission denied to signal it; run as its owner or as root",
                Field(comm)
            ),
            Reason::Respawned {
                parent_pid,
                parent_comm,
                times,
            } => write!(
                f,
                "holders were respawned {times} time(s) by pid {parent_pid} ({}), which is out of scope; free it with --pid {parent_pid}",
                Field(parent_comm)
            ),
            Reason::StillReleasing {
                bytes,
                bytes_per_second,
            } => write!(
                f,
                "{} still being released by the driver at {}/s",
                Bytes(*bytes),
                Bytes(*bytes_per_second)
            ),
            Reason::DriverHeld { bytes, before } => match before {
                Some(before) if before >= bytes => write!(
                    f,
                    "{} held by no process (driver-held) since before free started; only a GPU reset or a reboot clears it",
                    Bytes(*bytes)
                ),
                Some(before) => write!(
                    f,
                    "{} held by no process (driver-held), {} of it since before free started; only a GPU reset or a reboot clears it",
                    Bytes(*bytes),
                    Bytes(*before)
                ),
                None => write!(
                    f,
                    "{} held by no process (driver-held); only a GPU reset or a reboot clears it",
                    Bytes(*bytes)
                ),
            },
            Reason::Unseen { bytes } => write!(f, "{}", unseen_text(*bytes)),
            Reason::DriverError { message } => write!(f, "driver error: {}", Field(message)),
        }
    }
}

/// Memory no listed process explains, seen from a PID namespace of its
/// own, in words: not driver-held, and the remedy. One text for `free`,
/// `status`, `check` and Slurm.
pub(crate) fn unseen_text(bytes: u64) -> String {
    format!(
        "{} not explained by any process listed here: gpureap runs in a PID namespace of its own (a container without the host's PIDs), and the driver may omit other namespaces' processes from its lists, so processes it cannot see may hold it (not driver-held: do not reset); run gpureap on the host, or give its container the host's PIDs (`docker run --pid=host`, `hostPID: true` in a Kubernetes pod spec)",
        crate::units::Bytes(bytes)
    )
}

/// One GPU as seen in one snapshot against the scope.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    pub freed: bool,
    /// The driver answered for this GPU. When it did not, nothing can be
    /// verified: `freed` is false, and `remaining` are the in-scope
    /// processes that still have its device node open.
    pub checked: bool,
    pub memory_used: Option<u64>,
    /// Memory the out-of-scope holders account for; `None` if any is unknown.
    pub explained: Option<u64>,
    /// In-scope PIDs the driver still lists (or that hold the node when the driver is silent).
    pub remaining: Vec<u32>,
    /// The out-of-scope PIDs the driver lists, with their memory: what
    /// `explained` adds up.
    pub others: Vec<(u32, Option<u64>)>,
}

impl Assessment {
    /// No process in scope is left and what is still used beyond what the
    /// out-of-scope holders explain was held by no process before `free`
    /// started (`held_before`: what the one rule,
    /// `Snapshot::held_by_no_process`, called held then): what was signalled
    /// has been released, and waiting longer cannot change that.
    pub(crate) fn only_held_before(&self, held_before: u64) -> bool {
        held_before > 0
            && self.checked
            && self.remaining.is_empty()
            && matches!(
                (self.memory_used, self.explained),
                (Some(used), Some(explained))
                    if used <= explained.saturating_add(held_before)
            )
    }
}

/// What the reaper knows about each process it handled, for naming reasons.
/// Processes are known by identity: a PID reused by another process is not
/// the target that had it.
pub trait Ledger {
    fn signals_sent(&self, id: ProcessId) -> Vec<Sig>;
    fn permission_denied(&self, id: ProcessId) -> bool;
    fn was_target(&self, id: ProcessId) -> bool;
    /// Whether some target had this PID: for a driver entry whose process
    /// has already left /proc.
    fn had_target_pid(&self, pid: u32) -> bool;
}

/// Whether a GPU user is in scope: handled earlier, selected now, or spared
/// from selection. Hidden users count as in scope only when the whole GPU is.
fn in_scope(
    snapshot: &Snapshot,
    selection: &Selection,
    ledger: &dyn Ledger,
    whole_gpu: bool,
    user: &GpuUser,
) -> bool {
    // The ledger first. A target the driver still lists is ours until its
    // memory is back: also once it has left /proc, and also while it tears
    // down (its descriptors are closed before the driver releases its
    // memory, so it has no node open and looks like another namespace's
    // process). A process that took a target's PID and opened a GPU node is
    // someone else.
    let ours = match snapshot.processes.get(&user.pid) {
        Some(record) if !user.hidden => ledger.was_target(record.id),
        _ => ledger.had_target_pid(user.pid),
    };
    if ours {
        return true;
    }
    if user.hidden {
        return whole_gpu;
    }
    selection.targets.contains_key(&user.pid) || selection.spared.contains_key(&user.pid)
}
pub fn assess(
    gpu: &GpuState,
    snapshot: &Snapshot,
    selection: &Selection,
    ledger: &dyn Ledger,
    whole_gpu: bool,
) -> Assessment {
    if !gpu.driver_answered() {
        // Only the device nodes speak for this GPU: what in scope still has
        // one open is all that can be said.
        let remaining = gpu
            .users
            .iter()
            .filter(|user| user.node_open)
            .filter(|user| {
                snapshot
                    .processes
                    .get(&user.pid)
                    .is_some_and(|process| !process.state.has_exited())
            })
            .filter(|user| in_scope(snapshot, selection, ledger, whole_gpu, user))
            .map(|user| user.pid)
            .collect();
        return Assessment {
            freed: false,
            checked: false,
            memory_used: None,
            explained: None,
            remaining,
            others: Vec::new(),
        };
    }
    let mut remaining = Vec::new();
    let mut others = Vec::new();
    let mut explained = Some(0u64);
    for user in gpu.users.iter().filter(|user| user.listed) {
        // A zombie holds no memory (measured); a listed zombie is only a stale entry.
        let zombie = snapshot
            .processes
            .get(&user.pid)
            .is_some_and(|p| p.state.has_exited());
        if in_scope(snapshot, selection, ledger, whole_gpu, user)
            && !(zombie && user.memory == Some(0))
        {
            remaining.push(user.pid);
        } else {
            others.push((user.pid, user.memory));
            explained = match (explained, user.memory) {
                (Some(sum), Some(bytes)) => Some(sum.saturating_add(bytes)),
                _ => None,
            };
        }
    }
    // With nothing in scope left, what the out-of-scope holders do not
    // explain is the GPU's memory held by no process: the one rule judges
    // it. Without per-process figures, the process list alone decides.
    let held = snapshot
        .held_by_no_process(gpu)
        .is_some_and(|unattributed| unattributed.holds());
    Assessment {
        freed: remaining.is_empty() && !held,
        checked: true,
        memory_used: gpu.memory_used,
        explained,
        remaining,
        others,
    }
}

/// Memory samples of one GPU over time, to tell "still going down" from "stuck".
#[derive(Debug, Default, Clone)]
pub struct Trend {
    samples: Vec<(Instant, u64)>,
}

/// How far back "still going down" looks.
const TREND_WINDOW: Duration = Duration::from_secs(1);

impl Trend {
    pub fn record(&mut self, at: Instant, used: Option<u64>) {
        if let Some(used) = used {
            self.samples.push((at, used));
            // Keep a little more than the window, so the oldest sample spans it.
            let horizon = at.checked_sub(TREND_WINDOW * 2);
            if let Some(horizon) = horizon {
                let keep_from = self.samples.partition_point(|(time, _)| *time < horizon);
                self.samples
                    .drain(..keep_from.min(self.samples.len().saturating_sub(2)));
            }
        }
    }

    /// Bytes per second released over the last window; `None` if not going down.
    pub(crate) fn release_rate(&self) -> Option<u64> {
        let &(now, latest) = self.samples.last()?;
        let since = now.checked_sub(TREND_WINDOW).unwrap_or(now);
        let &(then, earlier) = self
            .samples
            .iter()
            .find(|(time, _)| *time >= since)
            .or_else(|| self.samples.first())?;
        let seconds = now.duration_since(then).as_secs_f64();
        (earlier > latest && seconds > 0.0).then(|| ((earlier - latest) as f64 / seconds) as u64)
    }
}

/// Names every reason a GPU is still held after the reaper gave up.
/// `held_before`: memory held by no process on it before `free` started.
#[allow(clippy::too_many_arguments)]
pub fn explain(
    gpu: &GpuState,
    assessment: &Assessment,
    snapshot: &Snapshot,
    selection: &Selection,
    ledger: &dyn Ledger,
    trend: &Trend,
    respawns: &BTreeMap<u32, u32>,
    held_before: u64,
) -> Vec<Reason> {
    let mut reasons = Vec::new();
    if let Some(message) = &gpu.error {
        reasons.push(Reason::DriverError {
            message: format!("{message}; whether its memory came back cannot be checked"),
        });
    }
    for &pid in &assessment.remaining {
        let hidden = gpu.users.iter().any(|user| user.pid == pid && user.hidden);
        let Some(record) = snapshot.processes.get(&pid).filter(|_| !hidden) else {
            reasons.push(Reason::Hidden {
                pid,
                memory: listed_memory(gpu, pid),
            });
            continue;
        };
        let comm = record.comm.clone();
        if let Some(spared) = selection.spared.get(&pid) {
            reasons.push(Reason::Protected {
                pid,
                comm,
                why: spared.to_string(),
            });
        } else if !ledger.was_target(record.id) {
            reasons.push(Reason::Appeared { pid, comm });
        } else if ledger.permission_denied(record.id) {
            reasons.push(Reason::PermissionDenied { pid, comm });
        } else if record.state.has_exited() {
            let parent_comm = snapshot
                .processes
                .get(&record.ppid)
                .map(|parent| parent.comm.clone())
                .unwrap_or_default();
            reasons.push(Reason::Zombie {
                pid,
                parent_pid: record.ppid,
                parent_comm,
            });
        } else if record.state == State::Uninterruptible {
            reasons.push(Reason::Uninterruptible {
                pid,
                comm,
                wchan: crate::proc::wchan(pid),
            });
        } else {
            reasons.push(Reason::StillAlive {
                pid,
                comm,
                state: record.state,
                signals: ledger.signals_sent(record.id),
            });
        }
    }
    for (&parent_pid, &times) in respawns {
        let parent_comm = snapshot
            .processes
            .get(&parent_pid)
            .map(|parent| parent.comm.clone())
            .unwrap_or_default();
        reasons.push(Reason::Respawned {
            parent_pid,
            parent_comm,
            times,
        });
    }
    // Memory held by no process is named whatever else holds the GPU (a
    // protected holder, a survivor): the figure is the one rule's, the one
    // `check`, the exporter and Slurm's drain reason give.
    if let Some(held) = driver_held(snapshot, gpu, held_before) {
        // Only what was there before is left: it is not being released.
        let releasing = if assessment.only_held_before(held_before) {
            None
        } else {
            trend.release_rate()
        };
        reasons.push(match (releasing, held) {
            (
                Some(bytes_per_second),
                Reason::DriverHeld { bytes, .. } | Reason::Unseen { bytes },
            ) => Reason::StillReleasing {
                bytes,
                bytes_per_second,
            },
            (_, held) => held,
        });
    }
    reasons
}

/// What the driver says `pid` holds on `gpu`, where it says.
fn listed_memory(gpu: &GpuState, pid: u32) -> Option<u64> {
    gpu.users
        .iter()
        .find(|user| user.pid == pid && user.listed)
        .and_then(|user| user.memory)
}

/// Memory on `gpu` held by no process as a reason, when the one rule
/// (`Snapshot::held_by_no_process`) says it holds the GPU: driver-held, or
/// unseen from a PID namespace of its own. `before`: how much of it was
/// held by no process before a `free` started. The one wording of it for
/// `free`, its plan, `wait` and Slurm.
pub fn driver_held(snapshot: &Snapshot, gpu: &GpuState, before: u64) -> Option<Reason> {
    let unattributed = snapshot.held_by_no_process(gpu)?;
    match unattributed.kind {
        UnattributedKind::Bookkeeping => None,
        UnattributedKind::Unseen => Some(Reason::Unseen {
            bytes: unattributed.bytes,
        }),
        UnattributedKind::NoProcess => Some(Reason::DriverHeld {
            bytes: unattributed.bytes,
            before: (before > 0).then_some(before.min(unattributed.bytes)),
        }),
    }
}

/// What holds one GPU, by one snapshot and no `free`: for a caller that
/// judges each process itself (Slurm's prolog, epilog and health check).
#[derive(Debug, Clone, PartialEq)]
pub enum Holding {
    /// What no judgement changes, as the verifier names it: the driver's
    /// error, a holder in another PID namespace, memory held by no process.
    Reason(Reason),
    /// The driver does not report this GPU at all.
    NotReported,
    /// A live process the driver lists, and why the caller says it may not
    /// hold the GPU.
    Process {
        pid: u32,
        comm: String,
        /// Its user's name, else `uid N`; `None` when neither is known.
        user: Option<String>,
        state: State,
        memory: Option<u64>,
        why: String,
    },
    /// An Xid of the caller's drain list the kernel logged for this GPU
    /// since boot (its newest): the hardware, not a process, is at fault.
    Xid { xid: u32, at: Option<u64> },
}

impl Holding {
    /// Only memory held by no process: a GPU reset may clear it.
    pub fn driver_held(&self) -> bool {
        matches!(self, Holding::Reason(Reason::DriverHeld { .. }))
    }

    /// The process it names, if any.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Holding::Reason(Reason::Hidden { pid, .. }) | Holding::Process { pid, .. } => {
                Some(*pid)
            }
            _ => None,
        }
    }
}

/// Everything that holds GPU `index` in `snapshot`: the driver's error (and
/// nothing else then), each process the driver lists that `judge` does not
/// let stay (a zombie holds nothing: a stale entry), each holder in another
/// PID namespace, and memory held by no process by the one rule. `judge`
/// says why a live local process may not hold the GPU, `None` if it may.
pub fn holding(
    snapshot: &Snapshot,
    index: u32,
    judge: &mut dyn FnMut(u32, &ProcessRecord) -> Option<String>,
) -> Vec<Holding> {
    let Some(gpu) = snapshot.gpu(index) else {
        return vec![Holding::NotReported];
    };
    if let Some(error) = &gpu.error {
        return vec![Holding::Reason(Reason::DriverError {
            message: error.to_string(),
        })];
    }
    let mut held = Vec::new();
    for user in gpu.users.iter().filter(|user| user.listed) {
        let Some(record) = snapshot.processes.get(&user.pid).filter(|_| !user.hidden) else {
            held.push(Holding::Reason(Reason::Hidden {
                pid: user.pid,
                memory: user.memory,
            }));
            continue;
        };
        if record.state.has_exited() {
            continue;
        }
        let Some(why) = judge(index, record) else {
            continue;
        };
        held.push(Holding::Process {
            pid: user.pid,
            comm: record.comm.clone(),
            user: snapshot
                .details
                .get(&user.pid)
                .and_then(|details| details.user.clone())
                .or_else(|| record.uid.map(|uid| format!("uid {uid}"))),
            state: record.state,
            memory: user.memory,
            why,
        });
    }
    held.extend(driver_held(snapshot, gpu, 0).map(Holding::Reason));
    held
}

/// GPUs a selection touches: used by a target or by a spared GPU user.
pub(crate) fn gpus_touched(snapshot: &Snapshot, selection: &Selection) -> BTreeSet<u32> {
    selection
        .targets
        .keys()
        .chain(selection.spared.keys())
        .flat_map(|&pid| snapshot.gpus_used_by(pid))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::proc::{ProcessId, ProcessRecord};
    use crate::select::Spared;
    use crate::snapshot::{GpuUser, Snapshot};

    const GIB: u64 = 1 << 30;

    /// A reaper that signalled every local process it is asked about, and
    /// was refused by PID 40.
    struct NoLedger;

    impl Ledger for NoLedger {
        fn signals_sent(&self, _: ProcessId) -> Vec<Sig> {
            vec![Sig::Term, Sig::Stop, Sig::Kill]
        }
        fn permission_denied(&self, id: ProcessId) -> bool {
            id.pid == 40
        }
        fn was_target(&self, _: ProcessId) -> bool {
            true
        }
        fn had_target_pid(&self, _: u32) -> bool {
            false
        }
    }

    /// A reaper that signalled exactly these processes.
    struct Signalled(Vec<ProcessId>);

    impl Ledger for Signalled {
        fn signals_sent(&self, id: ProcessId) -> Vec<Sig> {
            if self.was_target(id) {
                vec![Sig::Kill]
            } else {
                Vec::new()
            }
        }
        fn permission_denied(&self, _: ProcessId) -> bool {
            false
        }
        fn was_target(&self, id: ProcessId) -> bool {
            self.0.contains(&id)
        }
        fn had_target_pid(&self, pid: u32) -> bool {
            self.0.iter().any(|id| id.pid == pid)
        }
    }

    fn record(pid: u32, ppid: u32, state: char, comm: &str) -> ProcessRecord {
        ProcessRecord {
            ppid,
            state: State::from_letter(state),
            ..ProcessRecord::sleeping(pid, comm)
        }
    }

    fn listed(pid: u32, memory: Option<u64>) -> GpuUser {
        GpuUser {
            pid,
            memory,
            listed: true,
            node_open: true,
            hidden: false,
        }
    }

    /// A snapshot as an NVML host would give it (256 MiB bookkeeping slack);
    /// listed PIDs absent from `processes` are hidden, as the merge makes them.
    fn snapshot(used: u64, users: Vec<GpuUser>, processes: Vec<ProcessRecord>) -> Snapshot {
        let processes: BTreeMap<u32, ProcessRecord> =
            processes.into_iter().map(|p| (p.id.pid, p)).collect();
        let users = users
            .into_iter()
            .map(|user| GpuUser {
                hidden: !processes.contains_key(&user.pid),
                ..user
            })
            .collect();
        Snapshot {
            bookkeeping_slack: 256 << 20,
            ..Snapshot::one_gpu(used, users, processes)
        }
    }
    fn targets(pids: &[u32]) -> Selection {
        Selection {
            targets: pids
                .iter()
                .map(|&pid| (pid, crate::select::Because::InScope))
                .collect(),
            spared: BTreeMap::new(),
        }
    }

    fn reasons(
        snapshot: &Snapshot,
        selection: &Selection,
        whole_gpu: bool,
        trend: &Trend,
    ) -> Vec<Reason> {
        let gpu = &snapshot.gpus[0];
        let assessment = assess(gpu, snapshot, selection, &NoLedger, whole_gpu);
        assert!(!assessment.freed);
        explain(
            gpu,
            &assessment,
            snapshot,
            selection,
            &NoLedger,
            trend,
            &BTreeMap::new(),
            0,
        )
    }

    #[test]
    fn each_remaining_holder_gets_its_reason() {
        let snapshot = snapshot(
            40 * GIB,
            vec![
                listed(10, Some(10 * GIB)),
                listed(20, Some(10 * GIB)),
                listed(30, Some(10 * GIB)),
                listed(40, Some(5 * GIB)),
                listed(50, Some(5 * GIB)),
            ],
            vec![
                record(10, 1, 'D', "sglang::TP0"),
                record(20, 9, 'Z', "sglang::TP1"),
                record(9, 1, 'S', "launcher"),
                record(30, 1, 'S', "sglang::TP2"),
                record(40, 1, 'S', "other-user"),
            ],
        );
        let selection = targets(&[10, 20, 30, 40]);
        let reasons = reasons(&snapshot, &selection, true, &Trend::default());
        assert!(
            matches!(&reasons[0], Reason::Uninterruptible { pid: 10, .. }),
            "{reasons:?}"
        );
        assert_eq!(
            reasons[1],
            Reason::Zombie {
                pid: 20,
                parent_pid: 9,
                parent_comm: "launcher".into()
            }
        );
        assert!(
            matches!(&reasons[2], Reason::StillAlive { pid: 30, state: State::Sleeping, signals, .. } if signals.len() == 3)
        );
        assert!(matches!(
            &reasons[3],
            Reason::PermissionDenied { pid: 40, .. }
        ));
        // PID 50 is listed by the driver but absent from /proc: another PID namespace.
        assert!(matches!(reasons[4], Reason::Hidden { pid: 50, .. }));
        assert_eq!(reasons.len(), 5);
    }

    /// A target was killed and another process took its PID and the GPU: the
    /// newcomer is an out-of-scope holder whose memory is explained, not a
    /// survivor of signals it never got. A target gone from /proc while the
    /// driver still lists its PID is still ours.
    #[test]
    fn a_process_that_took_a_targets_pid_is_not_the_target() {
        let target = ProcessId {
            pid: 10,
            start_time: 1,
        };
        let ledger = Signalled(vec![target]);
        let mut decoy = record(10, 1, 'S', "jupyter-kernel");
        decoy.id.start_time = 99;
        let reused = snapshot(GIB, vec![listed(10, Some(GIB))], vec![decoy]);
        let assessment = assess(&reused.gpus[0], &reused, &targets(&[]), &ledger, false);
        assert!(assessment.freed, "{assessment:?}");
        assert_eq!(assessment.explained, Some(GIB));

        let mut exiting = snapshot(GIB, vec![listed(10, Some(GIB))], vec![]);
        exiting.gpus[0].users[0].hidden = false;
        let assessment = assess(&exiting.gpus[0], &exiting, &targets(&[]), &ledger, false);
        assert_eq!(assessment.remaining, [10]);
    }

    /// Seen on an H200: a SIGTERMed CUDA process closes its descriptors
    /// before the driver releases its memory, and the driver still lists it.
    /// With no node open it looks like another namespace's process; it is
    /// still the target, and the GPU is not free.
    #[test]
    fn a_target_tearing_down_is_still_ours() {
        let target = record(20, 1, 'S', "python3");
        let ledger = Signalled(vec![target.id]);
        let mut tearing_down = snapshot(
            7 * GIB,
            vec![listed(10, Some(3 * GIB)), listed(20, Some(4 * GIB))],
            vec![record(10, 1, 'S', "python3 train.py"), target],
        );
        // As the merge marks it: listed, a process of this /proc, no node open.
        tearing_down.gpus[0].users[1].hidden = true;
        let assessment = assess(
            &tearing_down.gpus[0],
            &tearing_down,
            &targets(&[]),
            &ledger,
            false,
        );
        assert!(!assessment.freed, "{assessment:?}");
        assert_eq!(assessment.remaining, [20]);
    }

    /// A process in scope that the reaper never signalled (it came after the
    /// last round) is not "still alive after" anything.
    #[test]
    fn a_holder_never_signalled_is_named_as_appeared() {
        let snapshot = snapshot(
            GIB,
            vec![listed(30, Some(GIB))],
            vec![record(30, 1, 'S', "sglang::TP0")],
        );
        let gpu = &snapshot.gpus[0];
        let selection = targets(&[30]);
        let ledger = Signalled(Vec::new());
        let assessment = assess(gpu, &snapshot, &selection, &ledger, false);
        let reasons = explain(
            gpu,
            &assessment,
            &snapshot,
            &selection,
            &ledger,
            &Trend::default(),
            &BTreeMap::new(),
            0,
        );
        assert_eq!(
            reasons,
            [Reason::Appeared {
                pid: 30,
                comm: "sglang::TP0".into()
            }]
        );
    }

    #[test]
    fn sums_saturate_instead_of_wrapping() {
        let huge = snapshot(
            u64::MAX,
            vec![listed(60, Some(u64::MAX)), listed(61, Some(5 * GIB))],
            vec![record(60, 1, 'S', "a"), record(61, 1, 'S', "b")],
        );
        let nothing = Signalled(Vec::new());
        let assessment = assess(&huge.gpus[0], &huge, &targets(&[]), &nothing, false);
        assert_eq!(assessment.explained, Some(u64::MAX));
        assert!(assessment.freed);
    }

    #[test]
    fn hidden_holders_count_only_when_the_whole_gpu_is_in_scope() {
        let snapshot = snapshot(5 * GIB, vec![listed(50, Some(5 * GIB))], vec![]);
        let selection = targets(&[]);
        let gpu = &snapshot.gpus[0];
        assert!(assess(gpu, &snapshot, &selection, &NoLedger, false).freed);
        assert!(!assess(gpu, &snapshot, &selection, &NoLedger, true).freed);
    }

    #[test]
    fn spared_holders_are_named_as_protected() {
        let snapshot = snapshot(
            GIB,
            vec![listed(7, Some(GIB))],
            vec![record(7, 1, 'S', "bash")],
        );
        let mut selection = targets(&[]);
        selection.spared.insert(7, Spared::Ancestor);
        let reasons = reasons(&snapshot, &selection, false, &Trend::default());
        assert!(
            matches!(&reasons[0], Reason::Protected { pid: 7, why, .. } if why.contains("ancestor"))
        );
    }

    #[test]
    fn memory_going_down_is_still_releasing_and_flat_memory_is_driver_held() {
        let snapshot = snapshot(20 * GIB, vec![], vec![]);
        let selection = targets(&[]);
        let start = Instant::now();
        let mut falling = Trend::default();
        for step in 0..=10u64 {
            falling.record(
                start + Duration::from_millis(step * 100),
                Some((30 - step) * GIB),
            );
        }
        let reasons_falling = reasons(&snapshot, &selection, true, &falling);
        match &reasons_falling[0] {
            Reason::StillReleasing {
                bytes,
                bytes_per_second,
            } => {
                assert_eq!(*bytes, 20 * GIB);
                assert!(
                    (9 * GIB..=11 * GIB).contains(bytes_per_second),
                    "{bytes_per_second}"
                );
            }
            other => panic!("expected still releasing, got {other:?}"),
        }
        let mut flat = Trend::default();
        for step in 0..=10u64 {
            flat.record(start + Duration::from_millis(step * 100), Some(20 * GIB));
        }
        assert_eq!(
            reasons(&snapshot, &selection, true, &flat),
            vec![Reason::DriverHeld {
                bytes: 20 * GIB,
                before: None
            }]
        );
    }

    #[test]
    fn bookkeeping_memory_is_not_called_held() {
        let small = snapshot(
            5 * GIB + (27 << 20),
            vec![listed(60, Some(5 * GIB))],
            vec![record(60, 1, 'S', "notebook")],
        );
        let nothing = Signalled(Vec::new());
        let assessment = assess(&small.gpus[0], &small, &targets(&[]), &nothing, false);
        assert!(assessment.freed);
        let leak = snapshot(
            5 * GIB + (256 << 20) + 1,
            vec![listed(60, Some(5 * GIB))],
            vec![record(60, 1, 'S', "notebook")],
        );
        let assessment = assess(&leak.gpus[0], &leak, &targets(&[]), &nothing, false);
        assert!(!assessment.freed);
    }

    /// The one rule's kind: beyond the bookkeeping, memory no listed
    /// process explains is held by no process only where gpureap sees the
    /// host's PIDs (or cannot tell) or the driver lists every namespace's
    /// processes; else it is unseen, and neither `free` nor Slurm calls it
    /// driver-held.
    #[test]
    fn memory_unexplained_without_the_host_pids_is_unseen_not_driver_held() {
        let held = |host_pids: Option<bool>, lists_may_omit: bool, used: u64| {
            let snapshot = Snapshot {
                host_pids,
                lists_may_omit,
                ..snapshot(used, vec![], vec![])
            };
            snapshot
                .held_by_no_process(&snapshot.gpus[0])
                .expect("a figure")
                .kind
        };
        use UnattributedKind::*;
        assert_eq!(held(Some(true), true, 20 * GIB), NoProcess);
        assert_eq!(held(None, true, 20 * GIB), NoProcess);
        assert_eq!(held(Some(false), false, 20 * GIB), NoProcess);
        assert_eq!(held(Some(false), true, 20 * GIB), Unseen);
        assert_eq!(held(Some(false), true, 100 << 20), Bookkeeping);

        let unseen = Snapshot {
            host_pids: Some(false),
            ..snapshot(20 * GIB, vec![], vec![])
        };
        assert_eq!(
            reasons(&unseen, &targets(&[]), true, &Trend::default()),
            vec![Reason::Unseen { bytes: 20 * GIB }]
        );
        let found = holding(&unseen, 0, &mut |_, _| None);
        assert_eq!(
            found,
            vec![Holding::Reason(Reason::Unseen { bytes: 20 * GIB })]
        );
        assert!(!found[0].driver_held());
        let text = Reason::Unseen { bytes: 20 * GIB }.to_string();
        assert!(text.contains("hostPID: true"), "{text}");
        assert!(!text.contains("only a GPU reset"), "{text}");
    }

    #[test]
    fn unknown_process_memory_is_unknown_not_zero() {
        let snapshot = snapshot(
            12 * GIB,
            vec![listed(70, None), listed(71, Some(GIB))],
            vec![],
        );
        assert_eq!(snapshot.gpus[0].unattributed(), None);
        let assessment = assess(
            &snapshot.gpus[0],
            &snapshot,
            &targets(&[]),
            &NoLedger,
            false,
        );
        assert_eq!(assessment.explained, None);
    }

    /// Slurm's findings are the verifier's values: the memory held by no
    /// process and a holder in another namespace come out of `holding` as
    /// the reasons `explain` gives `free`, with the same figures.
    #[test]
    fn holding_names_what_the_verifier_names() {
        let snapshot = snapshot(
            30 * GIB,
            vec![
                listed(10, Some(10 * GIB)),
                listed(20, Some(10 * GIB)),
                listed(50, Some(5 * GIB)),
            ],
            vec![
                record(10, 1, 'S', "sglang::TP0"),
                record(20, 1, 'Z', "sglang::TP1"),
                record(11, 1, 'S', "daemon"),
            ],
        );
        let selection = targets(&[10]);
        let from_free = reasons(&snapshot, &selection, true, &Trend::default());
        let mut judged = Vec::new();
        let held = holding(&snapshot, 0, &mut |gpu, record| {
            judged.push((gpu, record.id.pid));
            Some("not the job's".to_string())
        });
        // The zombie holds nothing: never judged.
        assert_eq!(judged, vec![(0, 10)]);
        assert_eq!(
            held,
            vec![
                Holding::Process {
                    pid: 10,
                    comm: "sglang::TP0".into(),
                    user: Some("uid 0".into()),
                    state: State::Sleeping,
                    memory: Some(10 * GIB),
                    why: "not the job's".into(),
                },
                Holding::Reason(Reason::Hidden {
                    pid: 50,
                    memory: Some(5 * GIB),
                }),
                Holding::Reason(Reason::DriverHeld {
                    bytes: 5 * GIB,
                    before: None,
                }),
            ]
        );
        for reason in [&held[1], &held[2]] {
            let Holding::Reason(reason) = reason else {
                unreachable!()
            };
            assert!(from_free.contains(reason), "{reason:?} in {from_free:?}");
        }
        assert!(held[2].driver_held() && !held[1].driver_held());
        let lost = Snapshot {
            gpus: Vec::new(),
            ..snapshot
        };
        assert_eq!(
            holding(&lost, 0, &mut |_, _| None),
            vec![Holding::NotReported]
        );
    }
}
