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
//! a problem of the GPUs but an unknown: nothing can be said about them; so
//! is memory no listed process explains when gpureap does not see the
//! host's PIDs (the one rule's `Unseen`: processes of other namespaces,
//! which a driver may omit from its lists, may hold it). The
//! figures are the exporter's (`metrics`), from the same snapshot `status`
//! takes, so the check, the metrics and `status` never disagree.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::driver::evidence::{self, Hardware};
use crate::driver::{BackendChoice, DriverError, LOST};
use crate::exit::{Exit, Failure};
use crate::metrics;
use crate::request::{self, CheckRequest};
use crate::snapshot::Snapshot;
use crate::stdout::emit;
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
    /// Memory no listed process explains, seen from a PID namespace of its
    /// own: processes of other namespaces may hold it (the one rule's
    /// `Unseen`). Not a problem found: what it is cannot be told here.
    Unseen { index: u32, bytes: u64 },
    /// Orphaned processes holding memory (those whose container is gone
    /// are `ContainerGone`'s, not counted twice).
    Orphaned {
        index: u32,
        bytes: u64,
        processes: usize,
    },
    /// An Xid of the drain list, logged for this GPU since boot: its newest.
    Xid {
        index: u32,
        xid: u32,
        at: Option<u64>,
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
    Unseen,
    Xid,
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
            Hint::Unseen => {
                "memory no listed process explains, seen from a PID namespace of its own (a container without the host's PIDs): the driver may omit other namespaces' processes from its lists, so processes unseen here may hold it; it is not driver-held, do not reset. Run gpureap on the host, or give its container the host's PIDs: `docker run --pid=host`, or `hostPID: true` in a Kubernetes pod spec"
            }
            Hint::Xid => {
                "Xids: `gpureap reset --plan --gpu N` says whether a reset could run; docs/evidence.md gives each Xid's meaning"
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
            Finding::Unseen { .. } => Some(Hint::Unseen),
            Finding::Orphaned { .. } => Some(Hint::Orphans),
            Finding::Xid { .. } => Some(Hint::Xid),
            Finding::ContainerGone { .. } => Some(Hint::ContainerGone),
            Finding::UnrequestedGpu { .. } => Some(Hint::UnrequestedGpu),
        }
    }

    /// The GPU it is about.
    pub fn index(&self) -> u32 {
        match self {
            Finding::Driver { index, .. }
            | Finding::HeldByNoProcess { index, .. }
            | Finding::Orphaned { index, .. }
            | Finding::Xid { index, .. }
            | Finding::Unseen { index, .. }
            | Finding::ContainerGone { index, .. }
            | Finding::UnrequestedGpu { index, .. } => *index,
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
            Finding::Unseen { index, bytes } => format!(
                "GPU {index}: {} unexplained, may be unseen processes'",
                Bytes(*bytes)
            ),
            Finding::Orphaned {
                index,
                bytes,
                processes,
            } => format!(
                "GPU {index}: {} held by {processes} orphaned process{}",
                Bytes(*bytes),
                if *processes == 1 { "" } else { "es" }
            ),
            Finding::Xid { index, xid, at } => format!(
                "GPU {index}: Xid {xid}{} ({})",
                at.map(|at| format!(" at {}", evidence::clock(at)))
                    .unwrap_or_default(),
                evidence::meaning(*xid).unwrap_or("not in gpureap's list")
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
                    container: crate::report::label_of(container),
                })
        })
        .collect()
}

/// Each checked GPU's findings, and which GPUs were checked.
fn findings_of(
    snapshot: &Snapshot,
    gpus: &Option<BTreeSet<u32>>,
    hardware: &Hardware,
) -> (Vec<Finding>, BTreeSet<u32>) {
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
        findings.extend(
            hardware
                .drain_events(index)
                .into_iter()
                .map(|event| Finding::Xid {
                    index,
                    xid: event.xid,
                    at: event.at,
                }),
        );
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
        if let Some(bytes) = metrics::unseen(snapshot, gpu) {
            findings.push(Finding::Unseen { index, bytes });
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

/// `gpureap check`: the listed holders, their containers and the hardware
/// evidence read, the verdict printed, its code returned.
pub fn main(backend: &BackendChoice, request: &CheckRequest) -> Result<Exit, Failure> {
    let sources = request.sources.sources()?;
    // Its first line says there is no driver, once.
    let (driver, gpu) = request::gpu_names(request::open_driver_quietly(backend)?, &request.gpu)?;
    let gpus = request::gpus(&gpu, request::gpu_count(driver.as_ref()))?;
    let mut snapshot = Snapshot::take_listed(driver.as_ref());
    snapshot.attribute_containers(&sources);
    let indexes = snapshot.gpus.iter().map(|gpu| gpu.index).collect();
    let hardware = Hardware::gather(driver.as_ref(), &indexes, request.drain_xids.clone());
    let verdict = check(&snapshot, &gpus, &hardware);
    emit(&verdict.text())?;
    Ok(verdict.verdict.exit())
}

/// The node's verdict from one snapshot and its GPUs' hardware evidence,
/// for the GPUs given (all when `None`). The evidence's advice follows the
/// findings of a GPU held by no process, lost, or with an Xid of the list.
pub fn check(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>, hardware: &Hardware) -> Check {
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
    let (findings, checked) = findings_of(snapshot, gpus, hardware);
    let mut details = Vec::new();
    // The advice of each GPU a finding names (the GPU, not the finding's kind,
    // calls for it: an Xid explains memory held by no process or a lost GPU).
    let named: BTreeSet<u32> = findings.iter().map(Finding::index).collect();
    for index in named {
        details.extend(hardware.advice(index));
    }
    if let Some(note) = &hardware.note {
        details.push(note.clone());
    }
    let (not_seen, hidden) = what_was_not_seen(snapshot, gpus);
    details.extend(not_seen);
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
    // Memory that processes unseen from here may hold is no problem found
    // but one that cannot be told: alone, it makes the verdict unknown.
    let unknown = findings
        .iter()
        .all(|finding| matches!(finding, Finding::Unseen { .. }));
    Check {
        verdict: if unknown {
            Verdict::Unknown
        } else {
            Verdict::Problem
        },
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

    /// Memory unseen from a PID namespace of its own, alone, makes the
    /// verdict unknown (3), never a problem with reset advice; beside a
    /// real problem (a lost GPU) the verdict is that problem.
    #[test]
    fn unseen_memory_alone_is_unknown_and_beside_a_problem_the_problem() {
        let gpu = |index: u32, error: Option<DriverError>| crate::snapshot::GpuState {
            mig_mode: None,
            instances: Vec::new(),
            index,
            name: None,
            uuid: None,
            memory_total: Some(80 << 30),
            memory_used: Some(3 << 30),
            memory_reserved: None,
            error,
            users: Vec::new(),
        };
        let snapshot = |gpus| Snapshot {
            backend: "test".into(),
            taken_at_unix_ms: 0,
            gpus,
            processes: Default::default(),
            unreadable: Vec::new(),
            driver_error: None,
            details: Default::default(),
            evidence: Default::default(),
            evidence_note: None,
            activity: std::collections::BTreeMap::new(),
            container_notes: Vec::new(),
            uptime_ticks: None,
            bookkeeping_slack: 0,
            host_pids: Some(false),
            lists_may_omit: true,
            descriptors: crate::snapshot::Descriptors::All,
        };
        let alone = check(&snapshot(vec![gpu(0, None)]), &None, &Hardware::default());
        assert_eq!(alone.verdict, Verdict::Unknown, "{alone:?}");
        assert_eq!(alone.verdict.exit(), Exit::Unknown);
        assert!(alone.message.starts_with("GPU 0: 3.0 GiB unexplained"));
        let text = alone.text();
        assert!(text.contains("hostPID: true"), "{text}");
        assert!(!text.contains("reset or a reboot"), "{text}");
        let lost = DriverError::GpuLost { index: 1 };
        let beside = check(
            &snapshot(vec![gpu(0, None), gpu(1, Some(lost))]),
            &None,
            &Hardware::default(),
        );
        assert_eq!(beside.verdict, Verdict::Problem, "{beside:?}");
    }

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
