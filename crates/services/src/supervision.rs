//! What `gpureap run` leaves on a host, from the supervisor's side: the
//! cgroup v2 mount its cgroups go under, the stale runs a gone supervisor
//! left, and their removal. Reading the marks (is this process supervised,
//! and is its supervisor gone?) is the snapshot's part: `supervised`.
//!
//! What a gone supervisor left in its cgroups is a stale run:
//! `status` flags it, `free --stale-runs` frees it and removes the cgroups,
//! and the next `gpureap run` with the same state directory does the same
//! for its own.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::proc::{self, ProcessId};
use crate::reap::FreeReport;
use crate::select::{Guard, Scope};
// The marks a run leaves, and what the snapshot reads from them, live on the
// pipeline's side (`supervised`); this side writes them and cleans up after
// a supervisor that is gone.
use crate::supervised::in_our_pid_namespace;
use crate::supervised::{Removal, gone, run_of_cgroup};

/// How deep cgroup trees are searched for run cgroups, and run cgroups for
/// the cgroups a server made inside its own.
const MAX_CGROUP_DEPTH: usize = 32;

/// Where cgroup v2 is mounted, from /proc/self/mountinfo.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mount_point = left.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(mount_point))
    })
}

/// A run cgroup whose supervisor is gone, and what is still in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleRun {
    pub cgroup: PathBuf,
    /// The cgroup directory's inode when it was examined: a live gpureap
    /// that made a cgroup of the same name since made another directory.
    pub inode: u64,
    pub supervisor: u32,
    pub gone: String,
    /// Every live process in it and in the cgroups below it.
    pub members: BTreeSet<ProcessId>,
}

/// The PIDs in a cgroup and the cgroups below it.
fn cgroup_pids(path: &Path) -> BTreeSet<u32> {
    let mut pids = BTreeSet::new();
    let mut folders = vec![(path.to_path_buf(), 0)];
    while let Some((folder, depth)) = folders.pop() {
        pids.extend(
            fs::read_to_string(folder.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|line| line.trim().parse::<u32>().ok()),
        );
        if depth < MAX_CGROUP_DEPTH {
            folders.extend(subfolders(&folder).into_iter().map(|sub| (sub, depth + 1)));
        }
    }
    pids
}

fn subfolders(path: &Path) -> Vec<PathBuf> {
    fs::read_dir(path)
        .map(|entries| {
            entries
                .flatten()
                .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
                .map(|entry| entry.path())
                .collect()
        })
        .unwrap_or_default()
}

/// The stale run at `path`, if it is a run cgroup whose supervisor is gone.
/// An empty one is stale only if its PID names no gpureap at all.
pub fn examine(path: &Path) -> Option<StaleRun> {
    let name = path.file_name()?.to_str()?;
    let (_, supervisor) = run_of_cgroup(name)?;
    let inode = inode_of(path)?;
    let members: BTreeSet<ProcessId> = cgroup_pids(path)
        .into_iter()
        .filter_map(proc::identity)
        .collect();
    if members.iter().any(|id| !in_our_pid_namespace(id.pid)) {
        return None;
    }
    let started_by = members.iter().map(|id| id.start_time).min();
    let gone = gone(supervisor, started_by)?;
    Some(StaleRun {
        cgroup: path.to_path_buf(),
        inode,
        supervisor,
        gone,
        members,
    })
}

/// The inode of a directory, not through a link.
fn inode_of(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(path)
        .ok()
        .filter(fs::Metadata::is_dir)
        .map(|metadata| metadata.ino())
}

/// Every stale run on this host: run cgroups anywhere in the cgroup v2
/// tree whose supervisor is gone.
pub fn stale_runs() -> Vec<StaleRun> {
    let Some(mount) = cgroup2_mount() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut folders = vec![(mount, 0)];
    while let Some((folder, depth)) = folders.pop() {
        for sub in subfolders(&folder) {
            let is_run = sub
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| run_of_cgroup(name).is_some());
            if is_run {
                found.extend(examine(&sub));
            } else if depth < MAX_CGROUP_DEPTH {
                folders.push((sub, depth + 1));
            }
        }
    }
    found.sort_by(|a, b| a.cgroup.cmp(&b.cgroup));
    found
}

/// A stale run's entry before anything is done (a dry run).
pub fn planned(run: &StaleRun) -> Removal {
    Removal {
        cgroup: run.cgroup.display().to_string(),
        supervisor: run.supervisor,
        gone: run.gone.clone(),
        removed: false,
        error: None,
    }
}

/// The stale runs whose cgroups a free with `scope` may remove: all of
/// them, unless another filter narrows the scope; then only those whose
/// members the plan takes whole, so that nothing outside the scope is
/// ended with its cgroup.
pub fn in_scope(runs: Vec<StaleRun>, plan: &FreeReport, scope: &Scope) -> Vec<StaleRun> {
    if !scope.narrowed() {
        return runs;
    }
    let targeted = |id: &ProcessId| {
        plan.targets
            .iter()
            .any(|target| target.pid == id.pid && target.start_time == id.start_time)
    };
    runs.into_iter()
        .filter(|run| run.members.iter().all(targeted))
        .collect()
}

/// The processes a stale run's removal must never end: this process, its
/// ancestors, init, and those the free (`outcome`, `None` when there was
/// nothing to free) spared. A cgroup that holds one of them is kept.
pub fn never_ended(outcome: Option<&FreeReport>, guard: &Guard) -> BTreeSet<u32> {
    outcome
        .into_iter()
        .flat_map(|outcome| outcome.spared.iter().map(|entry| entry.pid))
        .chain(guard.ancestors.iter().copied())
        .chain([guard.self_pid, 1])
        .collect()
}

/// Removes the stale runs' cgroups once the free (`outcome`) is done with
/// their processes; never one that holds a process in `never_ended`.
pub fn remove_after_free(
    runs: &[StaleRun],
    outcome: &FreeReport,
    guard: &Guard,
    timeout: Duration,
) -> Vec<Removal> {
    let spared = never_ended(Some(outcome), guard);
    runs.iter()
        .map(|run| remove(run, &spared, timeout))
        .collect()
}

/// Ends whatever is still in a stale run's cgroup (`cgroup.kill`, which no
/// process in it can escape), waits up to `timeout` for it to empty, and
/// removes it with the cgroups below it. Nothing is killed while it holds a
/// process in `spared` (gpureap, its ancestors, a protected process).
pub fn remove(run: &StaleRun, spared: &BTreeSet<u32>, timeout: Duration) -> Removal {
    let mut removal = planned(run);
    let fail = |mut removal: Removal, error: String| {
        removal.error = Some(error);
        removal
    };
    // A supervisor never comes back, but its cgroup may have been removed
    // since, and one of the same name made by a gpureap that got its PID.
    match inode_of(&run.cgroup) {
        None => {
            removal.removed = true;
            return removal;
        }
        Some(inode) if inode != run.inode => {
            return fail(
                removal,
                "it was removed and made again since; left as is".to_string(),
            );
        }
        Some(_) => {}
    }
    let members = cgroup_pids(&run.cgroup);
    let kept: Vec<u32> = members
        .iter()
        .copied()
        .filter(|pid| spared.contains(pid))
        .collect();
    if !kept.is_empty() {
        return fail(
            removal,
            format!("it holds {kept:?}, which may not be signalled; left as is"),
        );
    }
    if !members.is_empty()
        && let Err(error) = fs::write(run.cgroup.join("cgroup.kill"), "1")
    {
        return fail(removal, format!("cgroup.kill: {error}"));
    }
    let deadline = Instant::now() + timeout;
    loop {
        let left = cgroup_pids(&run.cgroup);
        // A killed process leaves cgroup.procs at once, but keeps the cgroup
        // busy until its parent reaps it: removal is retried until then.
        let error = if left.is_empty() {
            match remove_tree(&run.cgroup, 0) {
                Ok(()) => {
                    removal.removed = true;
                    return removal;
                }
                Err(error) if error.raw_os_error() == Some(libc::EBUSY) => error.to_string(),
                Err(error) => return fail(removal, error.to_string()),
            }
        } else {
            format!("still holds {left:?}")
        };
        if Instant::now() >= deadline {
            return fail(removal, format!("{error} after {}s", timeout.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Removes an empty cgroup and the cgroups below it, deepest first.
fn remove_tree(path: &Path, depth: usize) -> std::io::Result<()> {
    if depth < MAX_CGROUP_DEPTH {
        for sub in subfolders(path) {
            remove_tree(&sub, depth + 1)?;
        }
    }
    match fs::remove_dir(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}
