//! One line per decision: to stderr, which slurmd keeps in its log, and with
//! `--log FILE` as JSON lines for auditing.
//!
//! The log file is opened as `gpureap run --log` opens its log
//! (`file::open_log`, by the one rule of a path root may trust): for
//! appending, created private (0600), in directories only root or the user
//! gpureap runs as may write, never through a symbolic link others could
//! have made, and an existing file only if it is a plain file of that user
//! with no other name: the epilog runs as root, and a link planted by
//! anyone else must not make it write elsewhere. A log that cannot be opened is said on
//! stderr and does not stop the epilog: the GPUs matter more.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

pub struct Audit {
    /// `epilog`, `prolog` or `healthcheck`.
    command: &'static str,
    job: Option<u64>,
    node: Option<String>,
    file: Mutex<Option<File>>,
}

/// One JSON line of `--log`.
#[derive(Serialize)]
struct Line<'a> {
    time_unix_ms: u64,
    command: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<&'a str>,
    /// What was decided or done: `skip`, `signal`, `spare`, `clean`, `held`,
    /// `reset`, `drain`, `resume`, `leave`, `error`.
    action: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pid: Option<u32>,
    message: &'a str,
}

impl Audit {
    pub fn new(
        command: &'static str,
        log: Option<&Path>,
        job: Option<u64>,
        node: Option<String>,
    ) -> Audit {
        let file = log.and_then(|path| {
            crate::file::open_log(path)
                .map_err(|error| {
                    eprintln!("gpureap slurm {command}: {error}; logging to stderr only");
                })
                .ok()
        });
        Audit {
            command,
            job,
            node,
            file: Mutex::new(file),
        }
    }

    /// Logs one decision.
    pub fn say(&self, action: &str, gpu: Option<u32>, pid: Option<u32>, message: &str) {
        let mut prefix = format!("gpureap slurm {}", self.command);
        if let Some(job) = self.job {
            prefix.push_str(&format!(" job {job}"));
        }
        // slurmd logs stderr line by line: a comm or a command line in the
        // message must not start a line of its own there.
        eprintln!("{prefix}: {action}: {}", crate::units::one_line(message));
        let Ok(mut file) = self.file.lock() else {
            return;
        };
        if let Some(file) = file.as_mut() {
            let line = Line {
                time_unix_ms: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |since| since.as_millis() as u64),
                command: self.command,
                job: self.job,
                node: self.node.as_deref(),
                action,
                gpu,
                pid,
                message,
            };
            if let Ok(text) = serde_json::to_string(&line) {
                let mut text = crate::units::json_safe(text);
                text.push('\n');
                // One write per line, so that concurrent epilogs' lines do not interleave.
                if let Err(error) = file.write_all(text.as_bytes()) {
                    eprintln!("{prefix}: cannot write to --log: {error}");
                }
            }
        }
    }
}
