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
use super::events::Events;
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
    /// The scan behind this answer was this driver's own (not lent).
    pub complete: bool,
    /// Processes whose descriptors that scan could not read (PID 1 of a
    /// sandbox, to root): what they hold is not known.
    pub unreadable: Vec<ProcessId>,
    /// The latest start time among the processes scanned: one that started
    /// at or after it may be new since the scan.
    pub newest: u64,
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
            complete: self.complete,
            unreadable: self.unreadable.clone(),
            newest: self.newest,
        }
    }

    /// Whether no process that may be new since the scan has a GPU node of
    /// `gpus` open, among the descendants of the processes the scan could not
    /// read: a node they held, unseen, could have passed to a child forked
    /// since (which no release count would reveal). Each must still be
    /// there; a new descendant whose descriptors cannot be read either
    /// proves nothing.
    pub(crate) fn unreadable_pass_nothing_on(&self, gpus: &[u32], classify: Classify) -> bool {
        let mut stack: Vec<ProcessId> = Vec::new();
        for &id in &self.unreadable {
            if proc::state_of(id).is_none_or(|state| state.has_exited()) {
                return false;
            }
            stack.push(id);
        }
        let mut visited = 0usize;
        while let Some(parent) = stack.pop() {
            for child in children_of(parent.pid) {
                let Some(child) = proc::identity(child).filter(|id| id.start_time >= self.newest)
                else {
                    continue;
                };
                visited += 1;
                let nodes = proc::nodes_of(child, classify);
                let holds = nodes.as_ref().is_none_or(|nodes| {
                    nodes
                        .iter()
                        .any(|node| matches!(node, Node::Gpu(index) if gpus.contains(index)))
                });
                // Gone since (`None` for an exited one too) holds nothing; a bound on the walk.
                if (holds && proc::state_of(child).is_some()) || visited > 10_000 {
                    return false;
                }
                stack.push(child);
            }
        }
        true
    }
}

/// The children of every thread of `pid` (`/proc/PID/task/TID/children`).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|pid| pid.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
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

/// The holders the last wait watched to its end with nothing changed, kept
/// for the next wait on the same holders: their pidfds and the descriptors
/// they hold the node by. A mode left running waits in short pieces (the
/// watch looks at its stop flag every 200 ms), and opening and reading every
/// holder again for each piece cost more than the waiting.
#[derive(Default)]
pub(super) struct Kept(Vec<Watched>);

#[cfg(test)]
impl Kept {
    /// The kept holders' PIDs and pidfds (as numbers), for the tests.
    pub(super) fn pidfds(&self) -> Vec<(u32, i32)> {
        use std::os::fd::AsRawFd;
        self.0
            .iter()
            .filter_map(|held| Some((held.id.pid, held.pidfd.as_ref()?.as_raw_fd())))
            .collect()
    }
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
    /// Whether it still has its node open. With a pidfd, one `readlink` of
    /// a descriptor known to point there is enough, when the pidfd is not
    /// readable after it: the process had not exited when the link was
    /// read, so its PID was still its own. Else, or when that descriptor
    /// has gone, all are read again, by identity (`proc::nodes_of`).
    fn holds(&mut self, classify: Classify) -> bool {
        if let Some(pidfd) = &self.pidfd {
            let still = self.fds.iter().any(|fd| {
                std::fs::read_link(format!("/proc/{}/fd/{fd}", self.id.pid))
                    .is_ok_and(|target| classify(&target) == Some(self.node))
            });
            if still {
                return !any_readable([pidfd]);
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

/// The first watch after a baseline counts the descriptors each known
/// holder has on each watched GPU's node, while all are alive and hold
/// (`Events::count`); `None` when one has already let go.
fn count_descriptors(
    known: &Known,
    holders: &[Watched],
    classify: Classify,
) -> Option<BTreeMap<u32, u64>> {
    let mut counted: BTreeMap<u32, u64> = known.files.keys().map(|&index| (index, 0)).collect();
    for holder in holders {
        let Node::Gpu(index) = holder.node else {
            continue;
        };
        let fds = node_fds(holder.id.pid, holder.node, classify);
        if fds.is_empty() || proc::start_time(holder.id.pid) != Some(holder.id.start_time) {
            return None;
        }
        *counted.entry(index).or_default() += fds.len() as u64;
    }
    Some(counted)
}

/// Watches until a holder closes its node or exits, one of the files
/// changes (`files_now` reads them again), or `limit` passes. Returns
/// whether something changed. With `events`, a node's release or a file's
/// change wakes it at once, and the first watch after a scan counts the
/// holders' descriptors (`count_descriptors`).
pub(super) fn changed_within(
    known: &Known,
    classify: Classify,
    files_now: impl Fn() -> (BTreeMap<u32, Vec<FileState>>, FileState),
    poll_every: Duration,
    limit: Duration,
    events: Option<&Events>,
    kept: &std::sync::Mutex<Kept>,
) -> bool {
    let deadline = Instant::now() + limit;
    let mut earlier = kept
        .lock()
        .map(|mut kept| std::mem::take(&mut kept.0))
        .unwrap_or_default();
    let mut holders = Vec::new();
    for &(id, node) in &known.holders {
        // Kept only with its pidfd, which pins the process it was opened on.
        if let Some(at) = earlier
            .iter()
            .position(|held| held.id == id && held.node == node && held.pidfd.is_some())
        {
            holders.push(earlier.swap_remove(at));
            continue;
        }
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
    // A kept holder that exited since the last wait (its pidfd readable):
    // its PID may name another process by now, so nothing of it is read,
    // and no count can be taken for this baseline.
    if any_readable(holders.iter().filter_map(|holder| holder.pidfd.as_ref())) {
        if let Some(mut events) = events.and_then(Events::lock)
            && !events.counting()
        {
            events.count(None);
        }
        return true;
    }
    if let Some(mut events) = events.and_then(Events::lock)
        && !events.counting()
    {
        let counted = count_descriptors(known, &holders, classify);
        events.count(counted);
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
            if let Ok(mut kept) = kept.lock() {
                holders.retain(|holder| holder.pidfd.is_some());
                kept.0 = holders;
            }
            return false;
        }
        // An exit makes its pidfd readable: the wait ends at once. A node
        // released or a file changed makes the inotify descriptor readable:
        // what it queued is read (releases counted) and the holders and
        // files looked at again. Anything else is seen at the next poll.
        let pause = poll_every.min(remaining);
        let mut fds: Vec<PollFd> = holders
            .iter()
            .filter_map(|holder| holder.pidfd.as_ref())
            .chain(hidden.iter().filter_map(|(_, pidfd)| pidfd.as_ref()))
            .map(|fd| PollFd::new(fd, PollFlags::IN))
            .collect();
        if let Some(events) = events {
            fds.push(PollFd::from_borrowed_fd(events.as_fd(), PollFlags::IN));
        }
        let timeout = Timespec::try_from(pause).ok();
        if fds.is_empty() || poll(&mut fds, timeout.as_ref()).is_err() {
            std::thread::sleep(pause);
        }
        if let Some(mut events) = events.and_then(Events::lock) {
            events.drain();
        }
    }
}

/// Whether any of these pidfds is readable: its process exited. One poll
/// for all, without waiting.
fn any_readable<'a>(pidfds: impl IntoIterator<Item = &'a OwnedFd>) -> bool {
    let mut fds: Vec<PollFd> = pidfds
        .into_iter()
        .map(|fd| PollFd::new(fd, PollFlags::IN))
        .collect();
    if fds.is_empty() {
        return false;
    }
    let now = Timespec::try_from(Duration::ZERO).ok();
    poll(&mut fds, now.as_ref()).map_or(true, |ready| ready > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::{Command, Stdio};

    /// A kept holder whose process exited since the last wait ends the next
    /// one at once, even where its PID now names a process that holds the
    /// node by the same descriptor (faked here: the kept pidfd is a reaped
    /// child's, the PID and descriptor a live holder's). Without the check
    /// the wait would read the live process's link and run to its limit.
    #[test]
    fn a_kept_holder_that_exited_ends_the_wait_though_its_pid_holds_the_node() {
        let dir = tempfile::tempdir().expect("dir");
        let node_path = dir.path().join("nvidia0");
        std::fs::write(&node_path, b"").expect("node");
        let mut live = Command::new("sleep")
            .arg("30")
            .stdin(std::fs::File::open(&node_path).expect("open node"))
            .stdout(Stdio::null())
            .spawn()
            .expect("holder");
        let live_id = proc::identity(live.id()).expect("holder identity");
        let mut dead = Command::new("true").spawn().expect("child");
        let dead_pid = Pid::from_raw(dead.id() as i32).expect("pid");
        let dead_pidfd = pidfd_open(dead_pid, PidfdFlags::empty()).expect("pidfd");
        dead.wait().expect("reaped");
        let node = Node::Gpu(0);
        let kept = std::sync::Mutex::new(Kept(vec![Watched {
            id: live_id,
            node,
            pidfd: Some(dead_pidfd),
            fds: vec!["0".to_owned()],
        }]));
        let known = Known {
            holders: vec![(live_id, node)],
            complete: true,
            ..Known::default()
        };
        let canonical = node_path.canonicalize().expect("node path");
        let classify = move |path: &Path| (path == canonical).then_some(Node::Gpu(0));
        let wait = |kept: &std::sync::Mutex<Kept>, limit: Duration| {
            let files = || (BTreeMap::new(), None);
            changed_within(
                &known,
                &classify,
                files,
                Duration::from_millis(10),
                limit,
                None,
                kept,
            )
        };
        let changed = wait(&kept, Duration::from_secs(5));
        // The live holder still holds: a wait that opens its own pidfd sees nothing change.
        let unchanged = wait(&std::sync::Mutex::default(), Duration::from_millis(50));
        let _ = live.kill();
        let _ = live.wait();
        assert!(changed, "the exited holder's wait ran to its limit");
        assert!(!unchanged, "a live holder was taken for a change");
    }
}
