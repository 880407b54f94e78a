//! Signals to one process known by identity (PID + start time), or to the
//! process group an unreaped child of ours leads, and nothing else: the leaf that `reap`, `run` and the simulator's incident builder
//! share. It imports nothing of the pipeline (only `proc`, for the start
//! time).
//!
//! Every signal goes through a pidfd opened before the start time is checked
//! again, so a recycled PID is never hit. Kernels without pidfd (before 5.3)
//! get `kill(2)` after the same check, with a small race left open
//! (docs/install.md, "Old kernels").

use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, Signal, kill_process, pidfd_open, pidfd_send_signal};

use crate::proc::{self, ProcessId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sig {
    Term,
    Stop,
    Kill,
    /// `gpureap run`'s request for a bundle (`run --dump`).
    Usr1,
}

impl Sig {
    pub fn name(self) -> &'static str {
        match self {
            Sig::Term => "SIGTERM",
            Sig::Stop => "SIGSTOP",
            Sig::Kill => "SIGKILL",
            Sig::Usr1 => "SIGUSR1",
        }
    }

    fn signal(self) -> Signal {
        match self {
            Sig::Term => Signal::TERM,
            Sig::Stop => Signal::STOP,
            Sig::Kill => Signal::KILL,
            Sig::Usr1 => Signal::USR1,
        }
    }
}

/// What happened to one signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    Sent,
    /// The process had exited, or its PID now names another process.
    Gone,
    PermissionDenied,
    Failed(String),
}

/// Sends a signal to exactly the process `id` names, or to nothing.
pub fn send(id: ProcessId, sig: Sig) -> Delivery {
    let Some(pid) = Pid::from_raw(id.pid as i32) else {
        return Delivery::Gone;
    };
    match pidfd_open(pid, PidfdFlags::empty()) {
        Ok(pidfd) => {
            // The pidfd pins the process it was opened on: if the start time
            // still matches now, the pidfd is the process we mean.
            if !still_running(id) {
                return Delivery::Gone;
            }
            delivery(pidfd_send_signal(&pidfd, sig.signal()))
        }
        Err(Errno::SRCH) => Delivery::Gone,
        Err(Errno::NOSYS) => {
            // Kernels before 5.3: the same check, with a small race left open.
            if !still_running(id) {
                return Delivery::Gone;
            }
            delivery(kill_process(pid, sig.signal()))
        }
        Err(Errno::PERM | Errno::ACCESS) => Delivery::PermissionDenied,
        Err(error) => Delivery::Failed(error.to_string()),
    }
}

/// The process `id` names is there and has not exited. The kernel accepts
/// a signal to a zombie its parent has not reaped (its pidfd opens), and it
/// does nothing: such a process had exited, and is not said to be signalled.
fn still_running(id: ProcessId) -> bool {
    proc::glance(id.pid).is_some_and(|now| now.id == id && !now.state.has_exited())
}

/// Whether the kernel would let us signal this process (signal 0 checks
/// permission and sends nothing). A process that has gone is not refused.
pub(crate) fn may_signal(id: ProcessId) -> bool {
    Pid::from_raw(id.pid as i32).is_none_or(|pid| {
        !matches!(
            rustix::process::test_kill_process(pid),
            Err(Errno::PERM | Errno::ACCESS)
        )
    })
}

fn delivery(result: rustix::io::Result<()>) -> Delivery {
    match result {
        Ok(()) => Delivery::Sent,
        Err(Errno::SRCH) => Delivery::Gone,
        Err(Errno::PERM | Errno::ACCESS) => Delivery::PermissionDenied,
        Err(error) => Delivery::Failed(error.to_string()),
    }
}

/// SIGKILLs the process group led by `leader`, a child this process started
/// with `process_group(0)` and has not reaped yet: while it is unreaped its
/// PID, the group's id, cannot have been reused. A group already gone is
/// no error.
pub fn kill_group(leader: u32) {
    if let Some(pid) = i32::try_from(leader).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    }
}
