//! Resetting a GPU: the one remedy for memory that no process holds.
//!
//! Driver-held memory (a context the driver never tore down) survives every
//! signal; only a GPU reset or a reboot clears it. A reset is never implicit
//! (`gpureap reset`, or `--reset` in the Slurm epilog and health check), and
//! never of a GPU that any process still uses: the snapshot must show no
//! process with the GPU's device node open and none listed by the driver,
//! must have read every process but this gpureap's own ancestors (one it
//! could not inspect may have the node open), and the driver checks again. The result is verified through the driver.
//! Nor from a PID namespace of its own (a container without the host's
//! PIDs): a driver that omits other namespaces' processes from its lists
//! (NVML 580) shows a GPU in use there as one held by no process.

use std::fmt;

use crate::driver::Driver;
use crate::exit::Exit;
use crate::snapshot::Snapshot;
use crate::units::{Bytes, Field};

/// What became of one GPU's reset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reset {
    /// Reset, and the driver now reports no memory held by no process
    /// beyond its bookkeeping. `held`: what was held by no process before.
    Done { index: u32, held: Option<u64> },
    /// Nothing held that a reset would clear: not reset. `unattributed`:
    /// the memory no process explains, within the driver's bookkeeping.
    NothingHeld { index: u32, unattributed: u64 },
    /// Not reset: a process uses the GPU.
    InUse { index: u32, users: Vec<String> },
    /// Not reset: the scan could not inspect every process, so whether one
    /// has the GPU's device node open cannot be told.
    Unscanned {
        index: u32,
        unreadable: usize,
        example: String,
    },
    /// Not reset: gpureap runs in a PID namespace of its own, so the
    /// processes of other namespaces, which the driver may omit from its
    /// lists, may use the GPU (`UnattributedKind::Unseen`). `unattributed`:
    /// the memory no listed process explains.
    Unseen {
        index: u32,
        unattributed: Option<u64>,
    },
    /// The driver refused or failed the reset, or could not be read.
    Failed { index: u32, message: String },
    /// Reset, but memory is still held afterwards.
    StillHeld { index: u32, bytes: u64 },
}

impl Reset {
    pub fn index(&self) -> u32 {
        match self {
            Reset::Done { index, .. }
            | Reset::NothingHeld { index, .. }
            | Reset::InUse { index, .. }
            | Reset::Unscanned { index, .. }
            | Reset::Unseen { index, .. }
            | Reset::Failed { index, .. }
            | Reset::StillHeld { index, .. } => *index,
        }
    }

    /// Whether the GPU is clean now.
    pub fn clean(&self) -> bool {
        matches!(self, Reset::Done { .. } | Reset::NothingHeld { .. })
    }
}

impl fmt::Display for Reset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reset::Done { index, held } => match held {
                Some(bytes) => write!(f, "GPU {index}: reset; {} cleared", Bytes(*bytes)),
                None => write!(f, "GPU {index}: reset"),
            },
            Reset::NothingHeld {
                index,
                unattributed,
            } => write!(
                f,
                "GPU {index}: {} held by no process, within the driver's bookkeeping; not reset",
                Bytes(*unattributed)
            ),
            Reset::InUse { index, users } => write!(
                f,
                "GPU {index}: not reset: in use by {}; free it first (gpureap free --gpu {index})",
                users.join(", ")
            ),
            Reset::Unscanned {
                index,
                unreadable,
                example,
            } => write!(
                f,
                "GPU {index}: not reset: {unreadable} process(es) could not be inspected (e.g. {example}), and any of them may have its device node open; run as root with CAP_SYS_PTRACE"
            ),
            Reset::Unseen {
                index,
                unattributed,
            } => write!(
                f,
                "GPU {index}: not reset: gpureap runs in a PID namespace of its own (a container without the host's PIDs), and the driver may omit other namespaces' processes from its lists, so {} may be held by processes it cannot see; run gpureap reset on the host, or with the host's PIDs (`docker run --pid=host`, `hostPID: true`)",
                match unattributed {
                    Some(bytes) => format!("the {} no listed process explains", Bytes(*bytes)),
                    None => "the GPU".to_string(),
                }
            ),
            Reset::Failed { index, message } => {
                write!(f, "GPU {index}: reset failed: {}", Field(message))
            }
            Reset::StillHeld { index, bytes } => {
                write!(f, "GPU {index}: reset, but {} is still held", Bytes(*bytes))
            }
        }
    }
}

/// Resets GPU `index` if, and only if, memory is held on it by no process
/// (the one rule, `Snapshot::held_by_no_process`: beyond the driver's
/// bookkeeping) and no process uses it; then checks by the same rule.
pub fn reset(driver: &dyn Driver, index: u32) -> Reset {
    let before = Snapshot::take(driver);
    let Some(gpu) = before.gpu(index) else {
        return Reset::Failed {
            index,
            message: "the driver does not report this GPU".to_string(),
        };
    };
    if let Some(error) = &gpu.error {
        return Reset::Failed {
            index,
            message: error.to_string(),
        };
    }
    // From a PID namespace of its own the driver's lists may leave out
    // what uses the GPU: never reset from there.
    if before.may_miss_holders() {
        return Reset::Unseen {
            index,
            unattributed: before.held_by_no_process(gpu).map(|held| held.bytes),
        };
    }
    let users: Vec<String> = gpu
        .users
        .iter()
        .filter(|user| user.listed || user.node_open)
        .filter(|user| {
            before
                .processes
                .get(&user.pid)
                .is_none_or(|process| !process.state.has_exited())
        })
        .map(|user| match before.processes.get(&user.pid) {
            Some(process) => format!("pid {} ({})", user.pid, Field(&process.comm)),
            None => format!("pid {} (another PID namespace)", user.pid),
        })
        .collect();
    if !users.is_empty() {
        return Reset::InUse { index, users };
    }
    // The chain that started this gpureap (init, sshd, sudo, slurmd) is
    // not counted: a root gpureap in a container may be unable to read
    // init's descriptors, and that chain is the caller's own.
    let ancestors = crate::proc::ancestors_of_self();
    let unreadable: Vec<_> = before
        .unreadable
        .iter()
        .filter(|entry| !ancestors.contains(&entry.pid))
        .collect();
    if let Some(first) = unreadable.first() {
        return Reset::Unscanned {
            index,
            unreadable: unreadable.len(),
            example: format!("pid {} {}: {}", first.pid, Field(&first.comm), first.reason),
        };
    }
    // No process uses the GPU: all it uses is held by no process. Where the
    // driver gives no figure, the reset goes ahead.
    let held = before.held_by_no_process(gpu);
    if let Some(unattributed) = held.filter(|unattributed| !unattributed.holds()) {
        return Reset::NothingHeld {
            index,
            unattributed: unattributed.bytes,
        };
    }
    if let Err(error) = driver.reset(index) {
        return Reset::Failed {
            index,
            message: error.to_string(),
        };
    }
    let after = Snapshot::take(driver);
    let Some(gpu) = after.gpu(index) else {
        return Reset::Failed {
            index,
            message: "reset, but the driver no longer reports this GPU".to_string(),
        };
    };
    if let Some(error) = &gpu.error {
        return Reset::Failed {
            index,
            message: format!("reset, but the driver cannot say what is held now: {error}"),
        };
    }
    match after.held_by_no_process(gpu) {
        Some(unattributed) if unattributed.holds() => Reset::StillHeld {
            index,
            bytes: unattributed.bytes,
        },
        _ => Reset::Done {
            index,
            held: held.map(|unattributed| unattributed.bytes),
        },
    }
}

/// The exit code of `gpureap reset`: the worst of its GPUs. A GPU that
/// could not be checked (the driver failed, or the scan could not tell
/// whether a process uses it) is 3, could not complete.
pub fn exit(outcomes: &[Reset]) -> Exit {
    Exit::worst(outcomes.iter().map(|outcome| match outcome {
        Reset::Done { .. } | Reset::NothingHeld { .. } => Exit::Success,
        Reset::InUse { .. } | Reset::StillHeld { .. } => Exit::StillHeld,
        Reset::Unscanned { .. } | Reset::Unseen { .. } | Reset::Failed { .. } => Exit::Incomplete,
    }))
}
