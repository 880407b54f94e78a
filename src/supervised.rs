//! Whether a process was started under `gpureap run`, and whether the
//! supervisor is still there: a fact of the snapshot (`ProcessDetails::
//! supervision`), read here from the marks a run leaves. `supervision` (the
//! supervisor's side) writes the marks and removes what a gone supervisor
//! left; the outcome of a removal (`Removal`) is reported with `free`.
//!
//! A run marks what it starts twice: a cgroup named `gpureap.run-<pid>-<n>`
//! after the supervising gpureap, and `GPUREAP_SUPERVISOR=<pid>` in the
//! environment. Both outlive a supervisor that is SIGKILLed or OOM-killed,
//! and its PID may then be given to another process. So a supervisor counts
//! as alive only while that PID is a gpureap that started no later than what
//! it supervises.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;

use crate::proc::{self, ProcessRecord};

/// The name every supervised cgroup starts with.
pub const CGROUP_PREFIX: &str = "gpureap.run-";
/// Set in the server's environment (inherited by everything it starts) to
/// the supervising gpureap's PID.
pub const SUPERVISOR_ENV: &str = "GPUREAP_SUPERVISOR";

/// How a process started under `gpureap run` is supervised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Supervision {
    /// The supervising gpureap's PID.
    pub supervisor: u32,
    /// The run's cgroup (as /proc/PID/cgroup names it), when it has one.
    pub cgroup: Option<String>,
    /// Why that gpureap no longer supervises this process; `None` while it does.
    pub gone: Option<String>,
    /// With the supervisor gone: the topmost live process of the same run
    /// at or above this one, the command the run started. Itself otherwise.
    pub top: u32,
}

/// The run component of a cgroup path (`gpureap.run-1234-2`), and the
/// supervisor's PID it names. A cgroup the server made inside its own
/// still belongs to the run.
pub fn run_of_cgroup(cgroup: &str) -> Option<(&str, u32)> {
    cgroup.split('/').find_map(|component| {
        let rest = component.strip_prefix(CGROUP_PREFIX)?;
        let (pid, start) = rest.split_once('-')?;
        start.parse::<u32>().ok()?;
        Some((component, pid.parse().ok()?))
    })
}

/// Why the gpureap with PID `supervisor` no longer supervises what it
/// started, or `None` while it does. `started_by` is the start time (clock
/// ticks since boot) of a process it started, when one is known: a gpureap
/// younger than that is not its supervisor but a stranger with its PID.
pub fn gone(supervisor: u32, started_by: Option<u64>) -> Option<String> {
    let exited = format!("gpureap {supervisor} has exited");
    let Some(now) = proc::glance(supervisor) else {
        return Some(exited);
    };
    if now.state.has_exited() {
        return Some(exited);
    }
    // `gpureap`, or a build named for its platform (`gpureap-x86_64-linux-glibc2.17`).
    if !now.comm.starts_with("gpureap") {
        return Some(format!(
            "{exited}; PID {supervisor} is now {}, not gpureap",
            now.comm
        ));
    }
    if started_by.is_some_and(|start| now.id.start_time > start) {
        return Some(format!(
            "{exited}; PID {supervisor} is now a gpureap started after what it supervised"
        ));
    }
    None
}

/// Whether `pid` lives in our PID namespace, as far as we can tell. PIDs in
/// a run's cgroup name and environment are those of the supervisor's
/// namespace: from another one (a container's processes seen from the
/// host), they cannot be judged, and such runs are taken as supervised.
pub fn in_our_pid_namespace(pid: u32) -> bool {
    let ours = fs::read_link("/proc/self/ns/pid");
    let theirs = fs::read_link(format!("/proc/{pid}/ns/pid"));
    match (ours, theirs) {
        (Ok(ours), Ok(theirs)) => ours == theirs,
        _ => true,
    }
}

/// How `record` (whose cgroup is `cgroup`) is supervised, if it was started
/// under `gpureap run`. `processes` is the scan it comes from, to find the
/// top of its run when the supervisor is gone.
pub fn supervision_of(
    record: &ProcessRecord,
    cgroup: Option<&str>,
    processes: &BTreeMap<u32, ProcessRecord>,
) -> Option<Supervision> {
    let pid = record.id.pid;
    let run = cgroup.and_then(run_of_cgroup);
    let supervisor = match run {
        Some((_, supervisor)) => supervisor,
        None => proc::env_value(pid, SUPERVISOR_ENV)?.parse().ok()?,
    };
    let gone = if in_our_pid_namespace(pid) {
        gone(supervisor, Some(record.id.start_time))
    } else {
        None
    };
    let same_run = |parent: u32| match run {
        Some((component, _)) => proc::cgroup(parent)
            .as_deref()
            .and_then(run_of_cgroup)
            .is_some_and(|(theirs, _)| theirs == component),
        None => proc::env_value(parent, SUPERVISOR_ENV) == Some(supervisor.to_string()),
    };
    let mut top = pid;
    if gone.is_some() {
        let mut seen = BTreeSet::from([pid]);
        while let Some(parent) = processes.get(&top).map(|record| record.ppid) {
            if parent <= 1 || !processes.contains_key(&parent) || !seen.insert(parent) {
                break;
            }
            if !same_run(parent) {
                break;
            }
            top = parent;
        }
    }
    Some(Supervision {
        supervisor,
        cgroup: run.and(cgroup.map(str::to_string)),
        gone,
        top,
    })
}

/// What became of one stale run's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    pub cgroup: String,
    pub supervisor: u32,
    pub gone: String,
    /// The cgroup (and any below it) is gone.
    pub removed: bool,
    /// Why it is not, when it is not.
    pub error: Option<String>,
}
