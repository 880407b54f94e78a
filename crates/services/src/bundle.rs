//! The diagnostic bundle written when a supervised server hangs or crashes:
//! what a person would otherwise collect by hand before killing it.
//!
//! One folder per event under `STATE_DIR/bundles/`: `summary.txt` (what
//! happened and how far the start got against good starts), `processes.txt`
//! (the contained tree with states, wchan and CPU use over the last seconds),
//! `stacks.txt` (where each process waits: `crate::stacks`), `log-tail.txt`
//! (the last 200 log lines), `gpu.txt` (gpureap status), and `bundle.json`
//! with all of it for programs. `gpureap dump` writes the same bundle for
//! processes gpureap did not start. The folder and its files are
//! private to their owner (0700, 0600): they hold the server's command line
//! and log, and with them its API keys and tokens.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::proc;
use crate::report;
use crate::snapshot::Snapshot;
use crate::stacks::{self, Capture};
use crate::state::StateDir;
use crate::tree::ProcessTree;
use crate::units::{Field, one_line};

/// How many CPU samples are kept per process (one every half second: the
/// last five seconds or so).
const CPU_SAMPLES: usize = 11;

/// Recent CPU time of each contained process, sampled about twice a second.
#[derive(Debug, Default)]
pub struct CpuSamples {
    samples: HashMap<u32, VecDeque<(Instant, u64)>>,
}

impl CpuSamples {
    pub fn sample(&mut self, pids: &BTreeSet<u32>) {
        let now = Instant::now();
        self.samples.retain(|pid, _| pids.contains(pid));
        for &pid in pids {
            let Some(ticks) = proc::cpu_ticks(pid) else {
                continue;
            };
            let history = self.samples.entry(pid).or_default();
            if history.len() == CPU_SAMPLES {
                history.pop_front();
            }
            history.push_back((now, ticks));
        }
    }

    /// Percent of one core over the sampled window, `None` with fewer than two samples.
    pub fn percent(&self, pid: u32) -> Option<f64> {
        let history = self.samples.get(&pid)?;
        let (&(first_at, first), &(last_at, last)) = (history.front()?, history.back()?);
        let seconds = last_at.duration_since(first_at).as_secs_f64();
        (seconds > 0.0).then(|| {
            (last.saturating_sub(first)) as f64 / proc::ticks_per_second() as f64 / seconds * 100.0
        })
    }

    /// Seconds the window covers for this process.
    pub fn window(&self, pid: u32) -> f64 {
        self.samples
            .get(&pid)
            .and_then(|history| {
                Some(
                    history
                        .back()?
                        .0
                        .duration_since(history.front()?.0)
                        .as_secs_f64(),
                )
            })
            .unwrap_or(0.0)
    }
}

#[derive(Debug, Serialize)]
pub struct Member {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub sid: Option<u32>,
    pub state: Option<String>,
    pub wchan: Option<String>,
    pub cpu_percent: Option<f64>,
    pub cpu_window_seconds: f64,
    pub cmdline: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Bundle {
    pub schema_version: u32,
    pub kind: &'static str,
    pub reason: String,
    pub progress: String,
    pub start: u32,
    pub lines: u64,
    pub seconds: f64,
    pub containment: String,
    pub command: String,
    pub members: Vec<Member>,
    pub log_tail: Vec<String>,
    pub gpu: serde_json::Value,
    /// Each member's stacks, read before anything was signalled.
    pub stacks: Capture,
}

impl Bundle {
    pub fn members(snapshot: &Snapshot, pids: &BTreeSet<u32>, cpu: &CpuSamples) -> Vec<Member> {
        pids.iter()
            .map(|&pid| {
                let record = snapshot.processes.get(&pid);
                Member {
                    pid,
                    ppid: record.map(|r| r.ppid),
                    sid: record.map(|r| r.sid),
                    state: record.map(|r| r.state.to_string()),
                    wchan: proc::wchan(pid),
                    cpu_percent: cpu.percent(pid),
                    cpu_window_seconds: cpu.window(pid),
                    cmdline: record.map(|_| proc::cmdline(pid)),
                }
            })
            .collect()
    }

    /// Members depth-first from those whose parent is not a member, with
    /// depths, along the snapshot's process tree.
    fn tree_order<'a>(&'a self, tree: &ProcessTree) -> Vec<(&'a Member, usize)> {
        let by_pid: BTreeMap<u32, &Member> = self
            .members
            .iter()
            .map(|member| (member.pid, member))
            .collect();
        let mut ordered = Vec::new();
        let mut stack: Vec<(u32, usize)> = self
            .members
            .iter()
            .filter(|member| {
                !tree
                    .parent(member.pid)
                    .is_some_and(|parent| by_pid.contains_key(&parent))
            })
            .rev()
            .map(|member| (member.pid, 0))
            .collect();
        let mut seen = BTreeSet::new();
        while let Some((pid, depth)) = stack.pop() {
            let Some(&member) = by_pid.get(&pid) else {
                continue;
            };
            if !seen.insert(pid) {
                continue;
            }
            ordered.push((member, depth));
            stack.extend(
                tree.children(pid)
                    .iter()
                    .rev()
                    .filter(|child| by_pid.contains_key(child))
                    .map(|&child| (child, depth + 1)),
            );
        }
        ordered
    }

    /// Writes the bundle in a folder of its own under `parent`; returns
    /// that folder.
    pub fn write(&self, parent: &StateDir, snapshot: &Snapshot) -> io::Result<PathBuf> {
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        // A folder name, whatever the reason says: no slash, no dot-dot.
        let kind: String = self
            .reason
            .split(':')
            .next()
            .unwrap_or("event")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        // A dump of processes gpureap did not start has no start number.
        let name = match self.start {
            0 => format!("{stamp}-{kind}"),
            start => format!("{stamp}-start{start}-{kind}"),
        };
        let dir = parent.new_subdir(&name)?;

        // Anyone's text (a command line, a log line in a reason) is written
        // out on its line, as `status` shows it: these files are read with cat.
        let mut summary = String::new();
        let _ = writeln!(summary, "{}", Field(&self.reason));
        let _ = writeln!(summary, "{}", Field(&self.progress));
        let _ = writeln!(summary, "start {} of: {}", self.start, Field(&self.command));
        let _ = writeln!(summary, "containment: {}", self.containment);
        let _ = writeln!(summary, "stacks: {}", Field(&self.stacks.summary));
        for note in &self.stacks.notes {
            let _ = writeln!(summary, "note: {}", Field(note));
        }
        dir.create("summary.txt", summary.as_bytes())?;
        dir.create("stacks.txt", stacks::text(&self.stacks).as_bytes())?;

        let mut processes = String::from(
            "PID      PPID     SID      S  CPU%    WCHAN                          COMMAND\n",
        );
        // In tree order, each command indented under its parent.
        for (member, depth) in self.tree_order(&snapshot.tree()) {
            let number = |value: Option<u32>| value.map_or("?".to_string(), |v| v.to_string());
            let _ = writeln!(
                processes,
                "{:<8} {:<8} {:<8} {:<2} {:<7} {:<30} {}{}",
                member.pid,
                number(member.ppid),
                number(member.sid),
                Field(member.state.as_deref().unwrap_or("?")),
                member
                    .cpu_percent
                    .map_or("?".to_string(), |cpu| format!("{cpu:.0}")),
                one_line(member.wchan.as_deref().unwrap_or("-")),
                "  ".repeat(depth),
                Field(member.cmdline.as_deref().unwrap_or(""))
            );
        }
        let _ = writeln!(
            processes,
            "\nCPU% is over the last {:.1}s of half-second samples.",
            self.members
                .iter()
                .map(|m| m.cpu_window_seconds)
                .fold(0.0, f64::max)
        );
        dir.create("processes.txt", processes.as_bytes())?;

        let mut tail = self.log_tail.join("\n");
        tail.push('\n');
        dir.create("log-tail.txt", tail.as_bytes())?;
        dir.create("gpu.txt", report::status_table(snapshot, &None).as_bytes())?;
        dir.create("bundle.json", report::to_json(self).as_bytes())?;
        Ok(dir.path().to_path_buf())
    }
}
