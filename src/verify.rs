//! Deciding, from one snapshot, whether a GPU is back to what out-of-scope
//! holders explain, and if not, why not.
//!
//! "Freed" is a claim about the driver, never about our signals: no process in
//! scope is listed any more and the memory used is what the remaining,
//! out-of-scope processes account for.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::select::Selection;
use crate::snapshot::{GpuState, Snapshot};

/// Why memory on a GPU is still held, as a report names it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Reason {
    /// In scope, alive, in state D: the kernel will not deliver SIGKILL until
    /// the call it is blocked in returns.
    Uninterruptible {
        pid: u32,
        comm: String,
        wchan: Option<String>,
    },
    /// In scope and alive past the timeout despite the signals sent.
    StillAlive {
        pid: u32,
        comm: String,
        state: char,
        signals: Vec<String>,
    },
    /// Exited but not reaped; its parent has not called wait.
    Zombie {
        pid: u32,
        parent_pid: u32,
        parent_comm: String,
    },
    /// Listed by the driver but absent from this /proc: another PID namespace.
    Hidden { pid: u32 },
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
    DriverHeld { bytes: u64 },
    /// The driver did not answer for this GPU.
    DriverError { message: String },
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::units::Bytes;
        match self {
            Reason::Uninterruptible { pid, comm, wchan } => write!(
                f,
                "pid {pid} ({comm}) is in uninterruptible sleep (state D){}; SIGKILL lands when that call returns",
                wchan
                    .as_ref()
                    .map(|w| format!(" in {w}"))
                    .unwrap_or_default()
            ),
            Reason::StillAlive {
                pid,
                comm,
                state,
                signals,
            } => write!(
                f,
                "pid {pid} ({comm}) is still alive in state {state} after {}",
                signals.join(", ")
            ),
            Reason::Zombie {
                pid,
                parent_pid,
                parent_comm,
            } => write!(
                f,
                "pid {pid} is a zombie: its parent {parent_pid} ({parent_comm}) does not reap it; free the parent with --pid {parent_pid}"
            ),
            Reason::Hidden { pid } => write!(
                f,
                "pid {pid} is listed by the driver but not visible in this /proc (another PID namespace, e.g. a container); run gpureap on the host or inside that container"
            ),
            Reason::Protected { pid, comm, why } => {
                write!(f, "pid {pid} ({comm}) is in scope but is {why}")
            }
            Reason::PermissionDenied { pid, comm } => write!(
                f,
                "pid {pid} ({comm}): permission denied to signal it; run as its owner or as root"
            ),
            Reason::Respawned {
                parent_pid,
                parent_comm,
                times,
            } => write!(
                f,
                "holders were respawned {times} time(s) by pid {parent_pid} ({parent_comm}), which is out of scope; free it with --pid {parent_pid}"
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
            Reason::DriverHeld { bytes } => write!(
                f,
                "{} held by no process (driver-held); only a GPU reset or a reboot clears it",
                Bytes(*bytes)
            ),
            Reason::DriverError { message } => write!(f, "driver error: {message}"),
        }
    }
}

/// Memory the real driver uses that no process list explains, for its own
/// bookkeeping: 9 MiB with one context and 27 MiB with four on an H200,
/// driver 580 (docs/gpu-validation.md). Unexplained memory up to this much is
/// not called held; anything more is named (driver-held, or still releasing).
pub const BOOKKEEPING_SLACK: u64 = 256 << 20;

/// One GPU as seen in one snapshot against the scope.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    pub freed: bool,
    pub memory_used: Option<u64>,
    /// Memory the out-of-scope holders account for; `None` if any is unknown.
    pub explained: Option<u64>,
    /// In-scope PIDs the driver still lists (or that hold the node when the driver is silent).
    pub remaining: Vec<u32>,
}

/// What the reaper knows about each process it handled, for naming reasons.
pub trait Ledger {
    fn signals_sent(&self, pid: u32) -> Vec<String>;
    fn permission_denied(&self, pid: u32) -> bool;
    fn was_target(&self, pid: u32) -> bool;
}

/// Whether a GPU user is in scope: selected now, spared from selection, or
/// handled earlier. Hidden users count as in scope only when the whole GPU is.
fn in_scope(
    snapshot: &Snapshot,
    selection: &Selection,
    ledger: &dyn Ledger,
    whole_gpu: bool,
    pid: u32,
) -> bool {
    if !snapshot.processes.contains_key(&pid) {
        return whole_gpu;
    }
    selection.targets.contains_key(&pid)
        || selection.spared.contains_key(&pid)
        || ledger.was_target(pid)
}

pub fn assess(
    gpu: &GpuState,
    snapshot: &Snapshot,
    selection: &Selection,
    ledger: &dyn Ledger,
    whole_gpu: bool,
) -> Assessment {
    if !gpu.driver_answered() {
        return Assessment {
            freed: false,
            memory_used: None,
            explained: None,
            remaining: Vec::new(),
        };
    }
    let mut remaining = Vec::new();
    let mut explained = Some(0u64);
    for user in gpu.users.iter().filter(|user| user.listed) {
        // A zombie holds no memory (measured); a listed zombie is only a stale entry.
        let zombie = snapshot
            .processes
            .get(&user.pid)
            .is_some_and(|p| p.state == 'Z');
        if in_scope(snapshot, selection, ledger, whole_gpu, user.pid)
            && !(zombie && user.memory == Some(0))
        {
            remaining.push(user.pid);
        } else {
            explained = match (explained, user.memory) {
                (Some(sum), Some(bytes)) => Some(sum + bytes),
                _ => None,
            };
        }
    }
    let memory_fits = match (gpu.memory_used, explained) {
        (Some(used), Some(explained)) => used <= explained + BOOKKEEPING_SLACK,
        // Without per-process figures, the process list alone decides.
        _ => true,
    };
    Assessment {
        freed: remaining.is_empty() && memory_fits,
        memory_used: gpu.memory_used,
        explained,
        remaining,
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
    pub fn release_rate(&self) -> Option<u64> {
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
pub fn explain(
    gpu: &GpuState,
    assessment: &Assessment,
    snapshot: &Snapshot,
    selection: &Selection,
    ledger: &dyn Ledger,
    trend: &Trend,
    respawns: &BTreeMap<u32, u32>,
) -> Vec<Reason> {
    if let Some(message) = &gpu.error {
        return vec![Reason::DriverError {
            message: message.clone(),
        }];
    }
    let mut reasons = Vec::new();
    for &pid in &assessment.remaining {
        let Some(record) = snapshot.processes.get(&pid) else {
            reasons.push(Reason::Hidden { pid });
            continue;
        };
        let comm = record.comm.clone();
        if let Some(spared) = selection.spared.get(&pid) {
            reasons.push(Reason::Protected {
                pid,
                comm,
                why: spared.to_string(),
            });
        } else if ledger.permission_denied(pid) {
            reasons.push(Reason::PermissionDenied { pid, comm });
        } else if record.state == 'Z' {
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
        } else if record.state == 'D' {
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
                signals: ledger.signals_sent(pid),
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
    if assessment.remaining.is_empty()
        && let (Some(used), Some(explained)) = (assessment.memory_used, assessment.explained)
        && used > explained + BOOKKEEPING_SLACK
    {
        let bytes = used - explained;
        reasons.push(match trend.release_rate() {
            Some(bytes_per_second) => Reason::StillReleasing {
                bytes,
                bytes_per_second,
            },
            None => Reason::DriverHeld { bytes },
        });
    }
    reasons
}

/// GPUs a selection touches: used by a target or by a spared GPU user.
pub fn gpus_touched(snapshot: &Snapshot, selection: &Selection) -> BTreeSet<u32> {
    selection
        .targets
        .keys()
        .chain(selection.spared.keys())
        .flat_map(|&pid| snapshot.gpus_used_by(pid))
        .collect()
}
