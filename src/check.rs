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

/// The node's verdict from one snapshot, for the GPUs given (all when `None`).
pub fn check(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> Check {
    if let Some(error) = &snapshot.driver_error {
        let whole = format!("GPU driver unavailable: {}", Field(error));
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
    let orphans = metrics::orphaned(snapshot);
    let mut problems = Vec::new();
    let mut checked = BTreeSet::new();
    for gpu in snapshot
        .gpus
        .iter()
        .filter(|gpu| gpus.as_ref().is_none_or(|set| set.contains(&gpu.index)))
    {
        checked.insert(gpu.index);
        let index = gpu.index;
        if let Some(error) = &gpu.error {
            // "GPU 3 is lost (...)" reads "GPU 3: lost (...)".
            let prefix = format!("GPU {index} is ");
            problems.push(match error.strip_prefix(&prefix) {
                Some(rest) => format!("GPU {index}: {}", Field(rest)),
                None => format!("GPU {index}: {}", Field(error)),
            });
            continue;
        }
        if let Some(held) = metrics::held_by_no_process(snapshot, gpu) {
            problems.push(format!("GPU {index}: {} held by no process", Bytes(held)));
        }
        if let Some(orphaned) = orphans
            .get(&index)
            .filter(|orphaned| orphaned.processes > 0)
        {
            problems.push(format!(
                "GPU {index}: {} held by {} orphaned process{}",
                Bytes(orphaned.bytes),
                orphaned.processes,
                if orphaned.processes == 1 { "" } else { "es" }
            ));
        }
    }
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
    if problems.is_empty() {
        let message = if checked.is_empty() {
            "no GPUs to check".to_string()
        } else {
            format!(
                "{} {}: no memory held by no process, no orphans",
                if checked.len() == 1 { "GPU" } else { "GPUs" },
                GpuRanges(&checked)
            )
        };
        return Check {
            verdict: Verdict::Healthy,
            message: cut(&message, MESSAGE_LIMIT),
            details,
        };
    }
    let first = if problems.len() == 1 {
        problems[0].clone()
    } else {
        format!("{} (+{} more)", problems[0], problems.len() - 1)
    };
    if problems.iter().any(|problem| problem.contains("orphaned")) {
        details.push(
            "orphans: `gpureap free --orphans --dry-run` shows what freeing them would signal"
                .to_string(),
        );
    }
    if problems
        .iter()
        .any(|problem| problem.contains("held by no process"))
    {
        details
            .push("memory held by no process: only a GPU reset or a reboot clears it".to_string());
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_marks_the_cut() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("0123456789abc", 10).chars().count(), 10);
        assert!(cut("0123456789abc", 10).ends_with('…'));
    }

    #[test]
    fn verdicts_are_node_problem_detector_codes() {
        assert_eq!(
            [Verdict::Healthy, Verdict::Problem, Verdict::Unknown].map(|v| v.exit().code()),
            [0, 1, 3]
        );
    }
}
