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
pub(crate) fn supervision_of(
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn the_run_and_its_supervisor_come_from_the_cgroup_path() {
        assert_eq!(
            run_of_cgroup("/gpureap.run-1234-2"),
            Some(("gpureap.run-1234-2", 1234))
        );
        assert_eq!(
            run_of_cgroup("/system.slice/x.service/gpureap.run-77-1/inner"),
            Some(("gpureap.run-77-1", 77))
        );
        for other in [
            "/",
            "/gpureap.run-x-1",
            "/gpureap.run-12",
            "/my-gpureap.run-1-1",
        ] {
            assert_eq!(run_of_cgroup(other), None, "{other}");
        }
    }

    #[test]
    fn a_supervisor_is_alive_only_as_a_gpureap_older_than_what_it_started() {
        let me = std::process::id();
        let my_start = proc::start_time(me).expect("own start time");
        // This test binary is named gpureap-<hash>: a gpureap, as old as itself.
        assert_eq!(gone(me, Some(my_start)), None);
        let younger = gone(me, Some(my_start.saturating_sub(1))).expect("younger");
        assert!(younger.contains("started after"), "{younger}");
        let mut sleep = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let deadline = Instant::now() + Duration::from_secs(10);
        while proc::glance(sleep.id()).is_none_or(|glance| glance.comm != "sleep") {
            assert!(Instant::now() < deadline, "exec did not happen");
            std::thread::sleep(Duration::from_millis(5));
        }
        let gone_why = gone(sleep.id(), None);
        let _ = sleep.kill();
        let _ = sleep.wait();
        let gone_why = gone_why.expect("not gpureap");
        assert!(gone_why.contains("is now sleep, not gpureap"), "{gone_why}");
        assert!(gone(u32::MAX, None).is_some_and(|why| why.ends_with("has exited")));
    }

    /// A build named for its platform is still gpureap: its comm is the
    /// file's name, cut to 15 bytes.
    #[test]
    fn a_supervisor_renamed_for_its_platform_still_supervises() {
        let dir = tempfile::tempdir().expect("dir");
        let copy = dir.path().join("gpureap-x86_64-linux-glibc2.17");
        // Copied by cp, not from this process: a descriptor of the copy open
        // for writing here would be inherited by a child another test forks
        // meanwhile, and the exec below would fail with ETXTBSY.
        let copied = std::process::Command::new("cp")
            .arg("/bin/sleep")
            .arg(&copy)
            .status()
            .expect("cp runs");
        assert!(copied.success(), "copy sleep");
        let mut child = std::process::Command::new(&copy)
            .arg("30")
            .spawn()
            .expect("spawn");
        let pid = child.id();
        // Until the exec has happened, its comm is the test binary's.
        let deadline = Instant::now() + Duration::from_secs(10);
        while proc::glance(pid).is_none_or(|glance| glance.comm != "gpureap-x86_64-") {
            assert!(Instant::now() < deadline, "exec did not happen");
            std::thread::sleep(Duration::from_millis(5));
        }
        let verdict = gone(pid, None);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(verdict, None);
    }
}
