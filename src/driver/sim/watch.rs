//! How the simulated driver waits for a change without scanning /proc.
//!
//! A scan of /proc costs about 0.2 s of CPU with 5,000 processes, and `wait`
//! and free's verification wait on the driver for minutes. Memory on the
//! simulated driver changes only when a holder closes its node or exits, or
//! when a file of the directory changes (a leak, a lost GPU, a new claim), so
//! the driver remembers, from its last answer, the figures it gave, the
//! holders behind them and those files' state; waiting then watches only
//! those: each holder's pidfd (an exit wakes the wait at once), its
//! descriptors at every poll, and a few `stat`s. A wait that starts from
//! other figures than the last answer's scans once, as before.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::process::{Pid, PidfdFlags, pidfd_open};

use super::Node;
use crate::proc::{self, Classify, ProcessId};

/// A file's identity for change detection: modification time and size.
pub(super) type FileState = Option<(i64, i64, u64)>;

/// What the simulated driver answered last, and what stood behind it.
#[derive(Debug, Clone, Default)]
pub(super) struct Known {
    /// Memory used per GPU, for the GPUs it answered for.
    pub figures: BTreeMap<u32, Option<u64>>,
    /// Processes with a GPU's node open, and which node.
    pub holders: Vec<(ProcessId, Node)>,
    /// Holders whose descriptors we may not read (their claim file stands
    /// for the node): watched for their exit only.
    pub hidden: Vec<ProcessId>,
    /// Each GPU's leak and lost markers.
    pub files: BTreeMap<u32, Vec<FileState>>,
    /// The claims directory: a new holder writes its claim there.
    pub claims: FileState,
}

impl Known {
    /// Whether these are the figures of this answer for every GPU of `last`.
    pub fn matches(&self, last: &BTreeMap<u32, Option<u64>>) -> bool {
        last.iter()
            .all(|(index, used)| self.figures.get(index) == Some(used))
    }

    /// This answer narrowed to the GPUs of `last`.
    pub fn narrowed(&self, last: &BTreeMap<u32, Option<u64>>) -> Known {
        Known {
            figures: BTreeMap::new(),
            holders: self
                .holders
                .iter()
                .filter(|(_, node)| matches!(node, Node::Gpu(index) if last.contains_key(index)))
                .copied()
                .collect(),
            hidden: self.hidden.clone(),
            files: self
                .files
                .iter()
                .filter(|(index, _)| last.contains_key(index))
                .map(|(index, states)| (*index, states.clone()))
                .collect(),
            claims: self.claims,
        }
    }
}

/// A pidfd on the process `id` names, or `None` when that process has gone
/// (its PID may now name another one).
fn pidfd(id: ProcessId) -> Result<Option<OwnedFd>, ()> {
    let Some(pid) = Pid::from_raw(id.pid as i32) else {
        return Err(());
    };
    match pidfd_open(pid, PidfdFlags::empty()) {
        // The pidfd pins what it was opened on: the start time says whether
        // that is still the process we mean.
        Ok(fd) if proc::start_time(id.pid) == Some(id.start_time) => Ok(Some(fd)),
        Ok(_) => Err(()),
        Err(rustix::io::Errno::SRCH) => Err(()),
        // No pidfds (kernels before 5.3): polled all the same, by sleeping.
        Err(_) => Ok(None),
    }
}

/// The descriptors of process `pid` that point at `node`, by number.
fn node_fds(pid: u32, node: Node, classify: Classify) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            std::fs::read_link(entry.path()).is_ok_and(|target| classify(&target) == Some(node))
        })
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect()
}

/// One holder being watched: its pidfd, when the kernel has them, and the
/// descriptors it had on the node.
struct Watched {
    id: ProcessId,
    node: Node,
    pidfd: Option<OwnedFd>,
    fds: Vec<String>,
}

impl Watched {
    /// Whether it still has its node open. With a pidfd (which ends the
    /// wait when the process exits, so its PID cannot have been reused
    /// unseen) one `readlink` of a descriptor known to point there is
    /// enough; else, or when that descriptor has gone, all are read again.
    fn holds(&mut self, classify: Classify) -> bool {
        if self.pidfd.is_some() {
            let still = self.fds.iter().any(|fd| {
                std::fs::read_link(format!("/proc/{}/fd/{fd}", self.id.pid))
                    .is_ok_and(|target| classify(&target) == Some(self.node))
            });
            if still {
                return true;
            }
        }
        let holds =
            proc::nodes_of(self.id, classify).is_some_and(|nodes| nodes.contains(&self.node));
        if holds {
            self.fds = node_fds(self.id.pid, self.node, classify);
        }
        holds
    }
}

/// Watches until a holder closes its node or exits, one of the files
/// changes (`files_now` reads them again), or `limit` passes. Returns
/// whether something changed.
pub(super) fn changed_within(
    known: &Known,
    classify: Classify,
    files_now: impl Fn() -> (BTreeMap<u32, Vec<FileState>>, FileState),
    poll_every: Duration,
    limit: Duration,
) -> bool {
    let deadline = Instant::now() + limit;
    let mut holders = Vec::new();
    for &(id, node) in &known.holders {
        match pidfd(id) {
            Ok(pidfd) => holders.push(Watched {
                id,
                node,
                pidfd,
                fds: Vec::new(),
            }),
            Err(()) => return true,
        }
    }
    let mut hidden = Vec::new();
    for &id in &known.hidden {
        match pidfd(id) {
            Ok(pidfd) => hidden.push((id, pidfd)),
            Err(()) => return true,
        }
    }
    let gone = |id: &ProcessId| proc::state_of(*id).is_none_or(|state| state.has_exited());
    let files = (known.files.clone(), known.claims);
    loop {
        if !holders.iter_mut().all(|holder| holder.holds(classify))
            || hidden.iter().any(|(id, _)| gone(id))
            || files_now() != files
        {
            return true;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return false;
        }
        // An exit makes its pidfd readable: the wait ends at once. A node
        // closed by a living holder is seen at the next poll.
        let pause = poll_every.min(remaining);
        let mut fds: Vec<PollFd> = holders
            .iter()
            .filter_map(|holder| holder.pidfd.as_ref())
            .chain(hidden.iter().filter_map(|(_, pidfd)| pidfd.as_ref()))
            .map(|fd| PollFd::new(fd, PollFlags::IN))
            .collect();
        let timeout = Timespec::try_from(pause).ok();
        if fds.is_empty() || poll(&mut fds, timeout.as_ref()).is_err() {
            std::thread::sleep(pause);
        }
    }
}
