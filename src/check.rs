//! `gpureap check`: one health verdict for the node, in node-problem-detector's
//! custom-plugin protocol (exit 0 healthy, 1 problem, anything else unknown;
//! the first line of stdout is the condition's message). gpureap says "could
//! not tell" with 3 (`Exit::Unknown`), as every other command does, and bad
//! usage with 2: node-problem-detector reads both as unknown.
//!
//! A problem is something only a person or `gpureap free` fixes: memory held
//! by no process (the one rule, `Snapshot::held_by_no_process`: beyond the
//! driver's bookkeeping, with `status`'s figure), orphaned processes
//! holding memory, a GPU the driver lost. The driver being unavailable is not
//! a problem of the GPUs but an unknown: nothing can be said about them. The
//! figures are the exporter's (`metrics`), from the same snapshot `status`
//! takes, so the check, the metrics and `status` never disagree.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::driver::{DriverError, LOST};
use crate::exit::Exit;
use crate::metrics;
use crate::snapshot::Snapshot;
use crate::units::{Bytes, Field, GpuRanges};

/// node-problem-detector's reading of the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    Problem,
    Unknown,
}

impl Verdict {
    /// The exit code: 0 and 1 as node-problem-detector reads them, and 3
    /// (could not tell) for unknown, which it reads as unknown, as it does
    /// bad usage's 2.
    pub fn exit(self) -> Exit {
        match self {
            Verdict::Healthy => Exit::Success,
            Verdict::Problem => Exit::StillHeld,
            Verdict::Unknown => Exit::Unknown,
        }
    }
}

/// The verdict and what to print: the first line is the message a node
/// condition shows, short; the details follow on their own lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub verdict: Verdict,
    pub message: String,
    pub details: Vec<String>,
}

impl Check {
    /// The message, then the details, one per line.
    pub fn text(&self) -> String {
        let mut text = self.message.clone();
        text.push('\n');
        for line in &self.details {
            let _ = writeln!(text, "{line}");
        }
        text
    }
}

/// The longest first line: node-problem-detector cuts plugin output at
/// `max_output_length` (80 by default), and a node condition is read in a
/// table cell.
pub const MESSAGE_LIMIT: usize = 80;

fn cut(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(limit.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// One problem `check` found on a GPU, by kind: the kind picks the hint, the
/// text is only printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The driver's error for this GPU (lost, failed, not answering).
    Driver { index: u32, error: DriverError },
    /// Memory held by no process, by the one rule.
    HeldByNoProcess { index: u32, bytes: u64 },
    /// Orphaned processes holding memory (those whose container is gone
    /// are `ContainerGone`'s, not counted twice).
    Orphaned {
        index: u32,
        bytes: u64,
        processes: usize,
    },
    /// Processes whose container or pod no longer exists, holding memory.
    ContainerGone {
        index: u32,
        bytes: u64,
        processes: usize,
    },
    /// A process using the GPU though its pod was never allocated it.
    UnrequestedGpu {
        index: u32,
        pid: u32,
        /// Its container, as `status` names it (`namespace/pod container`).
        container: String,
    },
}

/// What a person can do about a kind of finding; in this order in the details.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Hint {
    Orphans,
    ContainerGone,
    UnrequestedGpu,
    HeldByNoProcess,
}

impl Hint {
    pub fn text(self) -> &'static str {
        match self {
            Hint::Orphans => {
                "orphans: `gpureap free --orphans --dry-run` shows what freeing them would signal"
            }
            Hint::ContainerGone => {
                "container gone: its container or pod was removed and the process lives on; `gpureap free --orphans --dry-run` shows what freeing them would signal"
            }
            Hint::UnrequestedGpu => {
                "unrequested GPU: the kubelet never allocated it to the pod (a privileged container, NVIDIA_VISIBLE_DEVICES=all): the scheduler may give it to another pod"
            }
            Hint::HeldByNoProcess => {
                "memory held by no process: only a GPU reset or a reboot clears it"
            }
        }
    }
}

impl Finding {
    /// The hint this kind of finding calls for, if any.
    pub fn hint(&self) -> Option<Hint> {
        match self {
            Finding::Driver { .. } => None,
            Finding::HeldByNoProcess { .. } => Some(Hint::HeldByNoProcess),
            Finding::Orphaned { .. } => Some(Hint::Orphans),
            Finding::ContainerGone { .. } => Some(Hint::ContainerGone),
            Finding::UnrequestedGpu { .. } => Some(Hint::UnrequestedGpu),
        }
    }

    /// The finding as one line: "GPU 3: lost (...)".
    pub fn text(&self) -> String {
        match self {
            Finding::Driver {
                index,
                error: DriverError::GpuLost { .. },
            } => format!("GPU {index}: {LOST}"),
            Finding::Driver { index, error } => {
                format!("GPU {index}: {}", Field(&error.to_string()))
            }
            Finding::HeldByNoProcess { index, bytes } => {
                format!("GPU {index}: {} held by no process", Bytes(*bytes))
            }
            Finding::Orphaned {
                index,
                bytes,
                processes,
            } => format!(
                "GPU {index}: {} held by {processes} orphaned process{}",
                Bytes(*bytes),
                if *processes == 1 { "" } else { "es" }
            ),
            Finding::ContainerGone {
                index,
                bytes,
                processes,
            } => format!(
                "GPU {index}: {} held by {processes} process{} whose container is gone",
                Bytes(*bytes),
                if *processes == 1 { "" } else { "es" }
            ),
            Finding::UnrequestedGpu {
                index,
                pid,
                container,
            } => format!(
                "GPU {index}: used by PID {pid} in {}, never allocated to its pod",
                Field(container)
            ),
        }
    }
}

/// The holders using GPU `index` that their pod was never allocated.
fn unrequested(snapshot: &Snapshot, index: u32) -> Vec<Finding> {
    snapshot
        .details
        .iter()
        .filter_map(|(&pid, details)| {
            let container = details.container.as_ref()?;
            container
                .unrequested_gpus
                .contains(&index)
                .then(|| Finding::UnrequestedGpu {
                    index,
                    pid,
                    container: crate::report::container_label(container),
                })
        })
        .collect()
}

/// Each GPU's findings, and the GPUs checked.
fn findings(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> (Vec<Finding>, BTreeSet<u32>) {
    let orphans = metrics::orphaned(snapshot);
    let gone = metrics::container_gone(snapshot);
    let mut findings = Vec::new();
    let mut checked = BTreeSet::new();
    for gpu in snapshot
        .gpus
        .iter()
        .filter(|gpu| gpus.as_ref().is_none_or(|set| set.contains(&gpu.index)))
    {
        checked.insert(gpu.index);
        let index = gpu.index;
        if let Some(error) = &gpu.error {
            findings.push(Finding::Driver {
                index,
                error: error.clone(),
            });
            continue;
        }
        if let Some(bytes) = metrics::held_by_no_process(snapshot, gpu) {
            findings.push(Finding::HeldByNoProcess { index, bytes });
        }
        let gone = gone.get(&index).copied().unwrap_or_default();
        if let Some(orphaned) = orphans
            .get(&index)
            .filter(|orphaned| orphaned.processes > gone.processes)
        {
            findings.push(Finding::Orphaned {
                index,
                bytes: orphaned.bytes.saturating_sub(gone.bytes),
                processes: orphaned.processes - gone.processes,
            });
        }
        if gone.processes > 0 {
            findings.push(Finding::ContainerGone {
                index,
                bytes: gone.bytes,
                processes: gone.processes,
            });
        }
        findings.extend(unrequested(snapshot, index));
    }
    (findings, checked)
}

/// The node's verdict from one snapshot, for the GPUs given (all when `None`).
pub fn check(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> Check {
    if let Some(error) = &snapshot.driver_error {
        let whole = format!("GPU driver unavailable: {}", Field(&error.to_string()));
        let message = cut(&whole, MESSAGE_LIMIT);
        // The details say it whole only where the first line had to cut it.
        let details = if message == whole {
            Vec::new()
        } else {
            vec![whole]
        };
        return Check {
            verdict: Verdict::Unknown,
            message,
            details,
        };
    }
    let (findings, checked) = findings(snapshot, gpus);
    let (mut details, hidden) = what_was_not_seen(snapshot, gpus);
    if findings.is_empty() {
        let message = if checked.is_empty() {
            "no GPUs to check".to_string()
        } else {
            format!(
                "{} {}: no memory held by no process, {}",
                if checked.len() == 1 { "GPU" } else { "GPUs" },
                GpuRanges(&checked),
                if hidden {
                    "holders hidden (see details)"
                } else {
                    "no orphans"
                }
            )
        };
        return Check {
            verdict: Verdict::Healthy,
            message: cut(&message, MESSAGE_LIMIT),
            details,
        };
    }
    // The hints by kind, each once, orphans first.
    let hints: BTreeSet<Hint> = findings.iter().filter_map(Finding::hint).collect();
    details.extend(hints.iter().map(|hint| hint.text().to_string()));
    let problems: Vec<String> = findings.iter().map(Finding::text).collect();
    let first = if problems.len() == 1 {
        problems[0].clone()
    } else {
        format!("{} (+{} more)", problems[0], problems.len() - 1)
    };
    let message = cut(&first, MESSAGE_LIMIT);
    // The first problem is in the first line; the details repeat it only
    // where that line had to cut it.
    let shown_whole = message.starts_with(problems[0].as_str());
    let mut lines: Vec<String> = problems
        .into_iter()
        .skip(usize::from(shown_whole))
        .collect();
    lines.extend(details);
    Check {
        verdict: Verdict::Problem,
        message,
        details: lines,
    }
}

/// What the scan could not see, as details: processes it could not
/// inspect, and holders of another PID namespace (whether they are orphans
/// cannot be told from here: the healthy message does not claim it; the
/// second value says there are some).
fn what_was_not_seen(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> (Vec<String>, bool) {
    let mut details = Vec::new();
    if snapshot.is_partial() {
        details.push(format!(
            "partial scan: {} process(es) could not be inspected{}",
            snapshot.unreadable.len(),
            if rustix::process::geteuid().is_root() {
                " (root without CAP_SYS_PTRACE, or under a security module's policy, may not read them)"
            } else {
                "; run as root to see them all"
            }
        ));
    }
    let hidden = crate::report::hidden_note(snapshot, gpus);
    let any_hidden = hidden.is_some();
    details.extend(hidden);
    (details, any_hidden)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_marks_the_cut() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("0123456789abc", 10).chars().count(), 10);
        assert!(cut("0123456789abc", 10).ends_with('…'));
    }

    /// The hint comes from the finding's kind, not from its text: a lost
    /// GPU has none, whatever its message says.
    #[test]
    fn hints_come_from_kinds() {
        let lost = Finding::Driver {
            index: 2,
            error: DriverError::GpuLost { index: 2 },
        };
        assert_eq!(lost.hint(), None);
        assert_eq!(
            lost.text(),
            "GPU 2: lost (fallen off the bus or otherwise inaccessible)"
        );
        // A driver's message that reads like another finding calls for no hint.
        let misleading = Finding::Driver {
            index: 0,
            error: DriverError::Sim("4 MiB held by no process, 1 orphaned process".to_string()),
        };
        assert_eq!(misleading.hint(), None);
        assert_eq!(
            Finding::HeldByNoProcess { index: 0, bytes: 1 }.hint(),
            Some(Hint::HeldByNoProcess)
        );
        assert_eq!(
            Finding::Orphaned {
                index: 0,
                bytes: 1,
                processes: 1
            }
            .hint(),
            Some(Hint::Orphans)
        );
    }

    #[test]
    fn verdicts_are_node_problem_detector_codes() {
        assert_eq!(
            [Verdict::Healthy, Verdict::Problem, Verdict::Unknown].map(|v| v.exit().code()),
            [0, 1, 3]
        );
    }
}
