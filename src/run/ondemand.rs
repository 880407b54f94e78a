//! Bundles on demand (`gpureap run --dump`). Each supervisor registers
//! itself in its state directory, `supervisors/<pid>.json` with its PID and
//! start time, for as long as it runs; `run --dump` reads the
//! registrations, sends each supervisor still alive SIGUSR1 by identity
//! (`signal::send`: a recycled PID is never hit), and waits for the
//! bundles they write (`STATE_DIR/bundles/<ms>-start<N>-dump/`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::output::event;
use crate::proc::{self, ProcessId};
use crate::signal::{self, Delivery, Sig};
use crate::state::{StateDir, StateDirError};

const DIR: &str = "supervisors";
/// A registration is two numbers; anything much larger is not one.
const MAX_RECORD_BYTES: u64 = 4 << 10;
/// How long `run --dump` waits for the bundles: the stacks' own limit
/// (`stacks::TOTAL`), and time for the snapshot and the files.
pub const WAIT: Duration = Duration::from_secs(crate::stacks::TOTAL.as_secs() + 30);

#[derive(Debug, Serialize, Deserialize)]
struct Registration {
    pid: u32,
    start_time: u64,
}

/// This supervisor's registration, removed when it is dropped.
pub struct Registered {
    dir: Option<StateDir>,
    name: String,
}

impl Registered {
    pub fn new(state: Option<&StateDir>) -> Registered {
        let pid = std::process::id();
        let name = format!("{pid}.json");
        let registration = Registration {
            pid,
            start_time: proc::start_time(pid).unwrap_or(0),
        };
        let dir = state.and_then(|state| {
            let written = state.subdir(DIR).and_then(|dir| {
                let text = serde_json::to_vec(&registration).map_err(std::io::Error::other)?;
                dir.replace(&name, &text)?;
                Ok(dir)
            });
            written
                .map_err(|error| {
                    event(&format!(
                        "cannot register for `gpureap run --dump` (SIGUSR1 still writes a bundle): {error}"
                    ))
                })
                .ok()
        });
        Registered { dir, name }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = dir.remove(&self.name);
        }
    }
}

/// Why no bundle came.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The state directory could be tampered with, or is not there (exit 2).
    #[error("{0}")]
    Refused(String),
    /// Nothing supervises with it (exit 2).
    #[error(
        "no gpureap run is supervising with the state directory {0}; for a server gpureap did not start: gpureap dump --pid PID"
    )]
    NoSupervisor(PathBuf),
    /// Asked, and no bundle came in time, or an I/O error (exit 3).
    #[error("{0}")]
    Failed(String),
}

/// Asks every supervisor registered in the state directory at `path` for a
/// bundle, and waits up to `within` for them; the new bundles' folders.
pub fn request(path: &Path, within: Duration) -> Result<Vec<PathBuf>, RequestError> {
    if !path.is_dir() {
        return Err(RequestError::Refused(format!(
            "no state directory at {}: no gpureap run has used it (give the --state-dir it runs with)",
            path.display()
        )));
    }
    let state = StateDir::open(path).map_err(|error| match error {
        StateDirError::Unsafe { .. } => RequestError::Refused(error.to_string()),
        StateDirError::Io { .. } => RequestError::Failed(error.to_string()),
    })?;
    let failed = |error: std::io::Error| RequestError::Failed(error.to_string());
    let bundles = state.subdir("bundles").map_err(failed)?;
    let before: BTreeSet<String> = bundles.list().map_err(failed)?.into_iter().collect();
    let supervisors = live(&state.subdir(DIR).map_err(failed)?);
    let mut asked = 0;
    let mut refused = Vec::new();
    for id in &supervisors {
        match signal::send(*id, Sig::Usr1) {
            Delivery::Sent => asked += 1,
            Delivery::Gone => {}
            Delivery::PermissionDenied => {
                refused.push(format!("gpureap {}: permission denied", id.pid))
            }
            Delivery::Failed(why) => refused.push(format!("gpureap {}: {why}", id.pid)),
        }
    }
    if asked == 0 {
        if refused.is_empty() {
            return Err(RequestError::NoSupervisor(path.to_path_buf()));
        }
        return Err(RequestError::Failed(format!(
            "cannot signal the supervisor: {}",
            refused.join("; ")
        )));
    }
    let deadline = Instant::now() + within;
    loop {
        let written: Vec<PathBuf> = bundles
            .list()
            .map_err(failed)?
            .into_iter()
            .filter(|name| name.ends_with("-dump") && !before.contains(name))
            .map(|name| bundles.path().join(name))
            .filter(|folder| folder.join("bundle.json").exists())
            .collect();
        if written.len() >= asked {
            return Ok(written);
        }
        if Instant::now() >= deadline {
            return Err(RequestError::Failed(format!(
                "asked {asked} gpureap run(s) for a bundle; {} written within {}s (a supervisor writes one only while its server runs, not while it plans, starts or waits to restart)",
                written.len(),
                within.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The registered supervisors still alive (same PID and start time); the
/// registrations of those gone (SIGKILLed) are removed.
fn live(dir: &StateDir) -> Vec<ProcessId> {
    let names = dir.list().unwrap_or_default();
    let mut alive = Vec::new();
    for name in names.iter().filter(|name| name.ends_with(".json")) {
        let registration = dir
            .read(name, MAX_RECORD_BYTES)
            .ok()
            .flatten()
            .and_then(|text| serde_json::from_slice::<Registration>(&text).ok());
        match registration {
            Some(found)
                if found.pid != std::process::id()
                    && proc::start_time(found.pid) == Some(found.start_time) =>
            {
                alive.push(ProcessId {
                    pid: found.pid,
                    start_time: found.start_time,
                });
            }
            _ => {
                let _ = dir.remove(name);
            }
        }
    }
    alive
}
