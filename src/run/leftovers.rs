//! What a `gpureap run` leaves if it dies without stopping its server (the
//! OOM killer, `kill -9`), and how the next run with the same state
//! directory frees it before it starts its own.
//!
//! Each supervisor records the cgroups it made, for as long as they exist,
//! in `STATE_DIR/runs/<pid>.json` with its own identity (PID and start
//! time). A run that starts later reads the records of supervisors that no
//! longer exist, and frees and removes what their cgroups still hold, each
//! cgroup checked again by `supervision::examine`: one whose supervisor is
//! alive is never touched. Only its own state directory is looked at: a run
//! cleans up after the earlier runs of the same server, not after other
//! servers (that is `gpureap free --stale-runs`).

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::contain::Containment;
use super::output::event;
use crate::driver::Driver;
use crate::proc;
use crate::reap::{self, Options};
use crate::select::{Guard, Scope};
use crate::snapshot::Snapshot;
use crate::state::StateDir;
use crate::supervision::{self, StaleRun};

const DIR: &str = "runs";
/// A record lists a few cgroup paths; anything much larger is not one.
const MAX_RECORD_BYTES: u64 = 64 << 10;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    pid: u32,
    start_time: u64,
    cgroups: Vec<PathBuf>,
}

/// This supervisor's record of the cgroups it made and has not removed.
pub struct RunRecord {
    dir: Option<StateDir>,
    record: Record,
}

impl RunRecord {
    pub fn new(state: Option<&StateDir>) -> RunRecord {
        let pid = std::process::id();
        let dir = state.and_then(|state| match state.subdir(DIR) {
            Ok(dir) => Some(dir),
            Err(error) => {
                event(&format!(
                    "cannot record this run's cgroups, so a later run could not clean them up after a crash of gpureap: {error}"
                ));
                None
            }
        });
        RunRecord {
            dir,
            record: Record {
                pid,
                start_time: proc::start_time(pid).unwrap_or(0),
                cgroups: Vec::new(),
            },
        }
    }

    /// Notes a cgroup just made for a start.
    pub fn made(&mut self, containment: &Containment) {
        if let Containment::Cgroup { path } = containment {
            self.record.cgroups.push(path.clone());
            self.save();
        }
    }

    /// Forgets the containment's cgroup once it is removed.
    pub fn released(&mut self, containment: &Containment) {
        if let Containment::Cgroup { path } = containment
            && !path.exists()
        {
            self.record.cgroups.retain(|cgroup| cgroup != path);
            self.save();
        }
    }

    fn save(&self) {
        let Some(dir) = &self.dir else { return };
        let name = format!("{}.json", self.record.pid);
        let saved = if self.record.cgroups.is_empty() {
            dir.remove(&name)
        } else {
            serde_json::to_vec_pretty(&self.record)
                .map_err(std::io::Error::other)
                .and_then(|text| dir.replace(&name, &text))
        };
        if let Err(error) = saved {
            event(&format!("cannot record this run's cgroups: {error}"));
        }
    }
}

/// Whether `path` can be a cgroup that the gpureap with PID `pid` made: a
/// plain absolute path under the cgroup v2 mount, named after that PID.
fn made_by(path: &Path, pid: u32) -> bool {
    let plain = path.is_absolute()
        && path
            .components()
            .all(|component| matches!(component, Component::RootDir | Component::Normal(_)));
    plain
        && supervision::cgroup2_mount().is_some_and(|mount| path.starts_with(mount))
        && path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(crate::supervised::run_of_cgroup)
            .is_some_and(|(_, supervisor)| supervisor == pid)
}

/// Frees and removes what earlier runs with this state directory left in
/// their cgroups when their gpureap died. Returns false when GPU memory one
/// of them held is not verified free (the server should not start then).
pub fn clean(state: &StateDir, driver: &dyn Driver, options: Options) -> bool {
    let dir = match state.subdir(DIR) {
        Ok(dir) => dir,
        Err(error) => {
            event(&format!(
                "cannot look for leftovers of earlier runs: {error}"
            ));
            return true;
        }
    };
    let names = match dir.list() {
        Ok(names) => names,
        Err(error) => {
            event(&format!(
                "cannot look for leftovers of earlier runs: {error}"
            ));
            return true;
        }
    };
    let mut all_freed = true;
    for name in names
        .into_iter()
        .filter(|name| name.ends_with(".json") && !name.starts_with('.'))
    {
        let record: Record = match dir.read(&name, MAX_RECORD_BYTES).and_then(|bytes| {
            serde_json::from_slice(&bytes.unwrap_or_default()).map_err(std::io::Error::other)
        }) {
            Ok(record) => record,
            Err(error) => {
                event(&format!(
                    "ignoring {}: {error}",
                    dir.path().join(&name).display()
                ));
                continue;
            }
        };
        if proc::start_time(record.pid) == Some(record.start_time) {
            continue;
        }
        let mut kept = Vec::new();
        for cgroup in record.cgroups {
            if !made_by(&cgroup, record.pid) {
                event(&format!(
                    "ignoring {} in {}: not a cgroup of gpureap run {}",
                    cgroup.display(),
                    dir.path().join(&name).display(),
                    record.pid
                ));
                continue;
            }
            if !cgroup.exists() {
                continue;
            }
            match supervision::examine(&cgroup) {
                None => {
                    event(&format!(
                        "leaving {} alone: its supervisor gpureap {} looks alive",
                        cgroup.display(),
                        record.pid
                    ));
                    kept.push(cgroup);
                }
                Some(stale) => {
                    if !free_leftover(&stale, driver, options) {
                        all_freed = false;
                        kept.push(cgroup);
                    }
                }
            }
        }
        let saved = if kept.is_empty() {
            dir.remove(&name)
        } else {
            let record = Record {
                cgroups: kept,
                ..record
            };
            serde_json::to_vec_pretty(&record)
                .map_err(std::io::Error::other)
                .and_then(|text| dir.replace(&name, &text))
        };
        if let Err(error) = saved {
            event(&format!("cannot update {name}: {error}"));
        }
    }
    all_freed
}

/// Frees one leftover with the core's escalation and verification, then
/// removes its cgroup. Returns whether both happened.
fn free_leftover(stale: &StaleRun, driver: &dyn Driver, options: Options) -> bool {
    event(&format!(
        "leftover of gpureap run {} ({}): {} with {} process(es); freeing it",
        stale.supervisor,
        stale.gone,
        stale.cgroup.display(),
        stale.members.len()
    ));
    let guard = Guard::for_this_process(&[]);
    let mut report = None;
    if !stale.members.is_empty() {
        let pids = stale.members.iter().map(|id| id.pid).collect();
        let snapshot = Snapshot::take_focused(driver, &pids);
        let scope = Scope {
            pids: stale.members.clone(),
            ..Scope::default()
        };
        let outcome = reap::free(driver, &scope, &guard, snapshot, options, &mut |_| {});
        super::report_outcome(&outcome);
        report = Some(outcome);
    }
    let freed = report.as_ref().is_none_or(reap::FreeReport::all_freed);
    let spared = supervision::never_ended(report.as_ref(), &guard);
    let removal = supervision::remove(stale, &spared, options.timeout());
    match &removal.error {
        None => event(&format!("removed {}", stale.cgroup.display())),
        Some(error) => event(&format!(
            "cannot remove {}: {error}",
            stale.cgroup.display()
        )),
    }
    freed && removal.removed
}
