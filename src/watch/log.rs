//! The record of every decision `reap` takes: one JSON line per action in
//! `--log FILE` (docs/json.md, kind `reap`), and a short line for people on
//! stderr.
//!
//! The file is opened for each line, as `slurm --log` opens its log
//! (`file::open_log`: by the one rule of a path root may trust, appended
//! to, created 0600, never through a link, an existing file only when it is
//! a plain file of ours that only we may write, with one name), and
//! closed after it: logrotate may move or truncate it at any time, and the
//! next line goes to whatever is at the path then. One `write` per line, so
//! that lines never interleave. A line that cannot be written is said on
//! stderr and does not stop the watch.

use std::io::Write;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::report::{GpuOutcomeJson, TargetJson};
use crate::units::one_line;

/// The version of the decision line (docs/json.md).
const SCHEMA_VERSION: u32 = 1;

/// What a decision was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// The watch started, with its policy in `message`.
    Started,
    /// A dry run: what would be freed (once per process).
    WouldFree,
    /// A process was signalled and the outcome verified.
    Freed,
    /// A rule named too large a share of a GPU's holders: nothing signalled.
    Refused,
    /// A single pass ended without acting on a holder a rule names: seen
    /// by its last look only, or spared by the guard though it holds memory.
    Held,
    /// The driver failed, a GPU was lost or /proc was partly unreadable:
    /// nothing signalled in this scan.
    Fault,
    /// The scans are whole again after a fault.
    Recovered,
    /// The watch ended (SIGTERM, SIGINT, or the end of a single pass).
    Stopped,
}

impl Action {
    fn word(self) -> &'static str {
        match self {
            Action::Started => "started",
            Action::WouldFree => "would free",
            Action::Freed => "freed",
            Action::Refused => "refused",
            Action::Held => "held",
            Action::Fault => "fault",
            Action::Recovered => "recovered",
            Action::Stopped => "stopped",
        }
    }
}

/// One line of the log.
#[derive(Serialize)]
pub struct Decision<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    pub time_unix_ms: u64,
    pub action: Action,
    /// `true` without `--enforce`.
    pub dry_run: bool,
    /// The rule that named the process: `orphaned`, `supervisor_gone`, `slurm_ended`.
    pub rule: Option<&'static str>,
    /// Why the rule named it, in words (the orphan's dead group leader, the gone supervisor, the ended job).
    pub why: Option<String>,
    /// The process, as `free --json` writes a target: identity, signals, fate.
    pub target: Option<TargetJson<'a>>,
    /// Its age when the rule matched, in milliseconds.
    pub age_ms: Option<u64>,
    /// The owner's uid.
    pub uid: Option<u32>,
    /// The GPUs it used, as `free --json` writes them: memory before and after, bytes back, when.
    pub gpus: Vec<GpuOutcomeJson<'a>>,
    /// `freed`, `exited` (gone, the GPU not verified free), `still_held`,
    /// `permission_denied`, `unchecked` (the driver could not say), `would_free`, `refused`,
    /// and for `held`: `seen_once` or `spared`.
    pub verdict: Option<&'static str>,
    /// The line for people, as stderr shows it.
    pub message: String,
}

impl<'a> Decision<'a> {
    pub fn new(action: Action, dry_run: bool, message: String) -> Decision<'a> {
        Decision {
            schema_version: SCHEMA_VERSION,
            kind: "reap",
            time_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as u64),
            action,
            dry_run,
            rule: None,
            why: None,
            target: None,
            age_ms: None,
            uid: None,
            gpus: Vec::new(),
            verdict: None,
            message,
        }
    }
}

/// Where decisions go: stderr always, the file of `--log` when given.
pub struct DecisionLog {
    path: Option<PathBuf>,
}

impl DecisionLog {
    pub fn new(path: Option<PathBuf>) -> DecisionLog {
        DecisionLog { path }
    }

    /// Writes one decision: its message on stderr, the JSON line to the file.
    pub fn record(&self, decision: &Decision) {
        // A closed stderr must not stop a daemon: best effort.
        let _ = writeln!(
            std::io::stderr(),
            "gpureap reap: {}: {}",
            decision.action.word(),
            one_line(&decision.message)
        );
        let Some(path) = &self.path else {
            return;
        };
        let Ok(text) = serde_json::to_string(decision) else {
            return;
        };
        let mut line = crate::units::json_safe(text);
        line.push('\n');
        // Opened for each line: a rotated log is followed at once.
        let written = crate::file::open_log(path)
            .map_err(|error| error.to_string())
            .and_then(|mut file| {
                file.write_all(line.as_bytes())
                    .map_err(|error| error.to_string())
            });
        if let Err(error) = written {
            let _ = writeln!(
                std::io::stderr(),
                "gpureap reap: cannot write to --log {}: {}",
                one_line(&path.display().to_string()),
                one_line(&error)
            );
        }
    }
}
