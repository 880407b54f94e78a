//! `gpureap reap [--watch]`: frees, unattended, what a policy names.
//!
//! A policy is a set of rules (`Rule`), each a `select::Scope` (orphans, a
//! gone supervisor, an ended Slurm job), narrowed alike by `--match`,
//! `--user` and `--gpu`, with an age floor (`Scope::min_age`): nothing
//! younger is touched. Every cycle (`--interval`) it decides whether to look
//! at the host in full (`pace`); a full look takes a snapshot, and a holder a
//! rule names is acted on only when the full look before named it too (by
//! identity): a state that flips between two scans is checked again before
//! anything is signalled. A single pass (no `--watch`) ends with what it
//! did not act on said (`held`, exit 1): a holder seen by its last look only,
//! and one the guard spares for a reason that does not excuse its memory
//! (`Spared::excuses_memory`: a protected name). The act is `reap::free`, the one implementation of
//! freeing (guard, escalation, verification through the driver), with a
//! scope that takes exactly the confirmed holders (`Scope::within`) and
//! their descendants; without `--enforce`, `reap::plan`, which signals
//! nothing.
//!
//! Never on bad evidence: a snapshot where the driver failed, a GPU was lost
//! or /proc could not be read whole frees nothing, and forgets what the look
//! before found (`Fault`). A rule that names more than `--max-share` of a
//! GPU's holders frees nothing that cycle and says so. SIGTERM, SIGINT and
//! SIGHUP are only noted: a free in progress runs to its verdict (its
//! SIGSTOP and SIGKILL go out together, so nothing is left stopped), and the
//! watch ends between cycles; SIGHUP does not end it (the log is reopened for
//! every line anyway). Each decision is one JSON line (`log`), and with
//! `--listen` the counters are served (`metrics`). docs/watch.md.

pub mod log;
pub mod metrics;
mod slurm;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use regex::Regex;

use crate::driver::Driver;
use crate::exit::Exit;
use crate::pace::Pace;
use crate::proc::ProcessId;
use crate::reap::{self, FreeReport, Handled};
use crate::select::{Because, Guard, Scope, Selection, Spared, select};
use crate::snapshot::Snapshot;
use crate::units::{Bytes, Elapsed, one_line};
use log::{Action, Decision, DecisionLog};
use metrics::WatchMetrics;

/// One rule of a policy: what makes a holder the watch's to free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// `--orphans`: as `free --orphans` (a crashed launcher's workers, and
    /// runs whose supervisor is gone).
    Orphaned,
    /// `--supervisor-gone`: started by a `gpureap run` that is gone.
    SupervisorGone,
    /// `--slurm-ended`: the Slurm job its environment names has ended.
    SlurmEnded,
    /// `--container-gone`: a node source says its container or pod is gone
    /// (`select::gone_containers`, after `Snapshot::attribute_containers`).
    ContainerGone,
}

impl Rule {
    /// The rule's name in the log and the metrics' `reason` label.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Orphaned => "orphaned",
            Rule::SupervisorGone => "supervisor_gone",
            Rule::SlurmEnded => "slurm_ended",
            Rule::ContainerGone => "container_gone",
        }
    }
}

/// `reap`'s typed config (`config::reap` builds it).
#[derive(Debug, Clone)]
pub struct ReapConfig {
    pub watch: bool,
    pub rules: Vec<Rule>,
    pub patterns: Vec<Regex>,
    pub uids: BTreeSet<u32>,
    /// `--gpu`, resolved against the driver's count.
    pub gpus: Option<BTreeSet<u32>>,
    pub older_than: Duration,
    pub interval: Duration,
    pub options: reap::Options,
    pub protect: Vec<String>,
    pub max_share: f64,
    pub enforce: bool,
    pub log: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub scontrol: Option<PathBuf>,
    /// Where `--container-gone` reads the node's containers (`--host-root`, `--kubelet-socket`).
    pub sources: crate::container::Sources,
}

impl ReapConfig {
    /// A rule's scope: the rule, the narrowing filters, the age floor, and
    /// `within` (holders by identity) where given.
    pub fn scope(&self, rule: Rule, within: Option<BTreeSet<ProcessId>>) -> Scope {
        Scope {
            patterns: self.patterns.clone(),
            uids: self.uids.clone(),
            orphans: rule == Rule::Orphaned,
            supervisor_gone: rule == Rule::SupervisorGone,
            min_age: Some(self.older_than),
            within,
            ..Scope::default()
        }
    }

    /// The policy in words, for the first line of the log.
    pub fn describe(&self) -> String {
        let rules: Vec<&str> = self.rules.iter().map(|rule| rule.name()).collect();
        let mut text = format!(
            "rules {}, older than {}, every {}, {}",
            rules.join(" + "),
            Elapsed(self.older_than),
            Elapsed(self.interval),
            if self.enforce {
                "enforcing"
            } else {
                "dry run (no --enforce): nothing is signalled"
            }
        );
        if !self.patterns.is_empty() {
            let patterns: Vec<&str> = self.patterns.iter().map(Regex::as_str).collect();
            text.push_str(&format!(", matching {}", patterns.join(" or ")));
        }
        if !self.uids.is_empty() {
            text.push_str(&format!(", uids {:?}", self.uids));
        }
        if let Some(gpus) = &self.gpus {
            text.push_str(&format!(", GPUs {gpus:?}"));
        }
        if self.max_share < 1.0 {
            text.push_str(&format!(", at most {} of a GPU's holders", self.max_share));
        }
        text
    }
}

/// Why a snapshot must not lead to a signal, if it must not: the driver
/// failed, a GPU did not answer, /proc could not be listed, or a process
/// the driver lists could not be read (whether it is local cannot be told).
/// Other unreadable processes matter only where a rule reaches them
/// (`unreadable_in_reach`): some are unreadable on many hosts for good
/// (a sandbox's PID 1), and they are never signalled.
pub fn fault(snapshot: &Snapshot) -> Option<String> {
    if let Some(error) = &snapshot.driver_error {
        return Some(format!("the driver failed: {error}"));
    }
    if let Some(gpu) = snapshot.gpus.iter().find(|gpu| gpu.error.is_some()) {
        let error = gpu
            .error
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        return Some(format!("GPU {} did not answer: {error}", gpu.index));
    }
    let listed = |pid: u32| {
        pid == 0
            || snapshot
                .gpus
                .iter()
                .any(|gpu| gpu.users.iter().any(|user| user.pid == pid))
    };
    snapshot
        .unreadable
        .iter()
        .find(|entry| listed(entry.pid))
        .map(|entry| unreadable_text(snapshot, entry))
}

fn unreadable_text(snapshot: &Snapshot, entry: &crate::proc::Unreadable) -> String {
    format!(
        "/proc was read in part ({} unreadable; PID {} {}: {})",
        snapshot.unreadable.len(),
        entry.pid,
        one_line(&entry.comm),
        entry.reason
    )
}

/// A process a selection would signal whose descriptors could not be read.
pub fn unreadable_in_reach(snapshot: &Snapshot, selection: &Selection) -> Option<String> {
    snapshot
        .unreadable
        .iter()
        .find(|entry| selection.targets.contains_key(&entry.pid))
        .map(|entry| unreadable_text(snapshot, entry))
}

/// The holders a rule names in a selection: the targets in scope (not the
/// descendants that go with them), on the GPUs of `--gpu` when given.
pub fn named_holders(
    snapshot: &Snapshot,
    selection: &Selection,
    gpus: &Option<BTreeSet<u32>>,
) -> BTreeSet<ProcessId> {
    let in_scope = selection
        .targets
        .iter()
        .filter(|(_, because)| **because == Because::InScope)
        .map(|(pid, _)| *pid);
    on_gpus(snapshot, in_scope, gpus)
}

/// The holders a rule's scope finds in a selection that the guard spares
/// for a reason that does not excuse their memory (`Spared::excuses_memory`:
/// a protected name, not an MPS server or a holder younger than the floor),
/// on the GPUs of `--gpu` when given: never signalled, still holders.
pub fn spared_holders(
    snapshot: &Snapshot,
    selection: &Selection,
    gpus: &Option<BTreeSet<u32>>,
) -> BTreeSet<ProcessId> {
    let holding = selection
        .spared
        .keys()
        .copied()
        .filter(|pid| selection.counts(*pid) && !snapshot.gpus_used_by(*pid).is_empty());
    on_gpus(snapshot, holding, gpus)
}

/// Of these PIDs, the processes that use a GPU of `--gpu` (all of them
/// when it is not given), by identity.
fn on_gpus(
    snapshot: &Snapshot,
    pids: impl Iterator<Item = u32>,
    gpus: &Option<BTreeSet<u32>>,
) -> BTreeSet<ProcessId> {
    pids.filter(|pid| {
        gpus.as_ref()
            .is_none_or(|gpus| !snapshot.gpus_used_by(*pid).is_disjoint(gpus))
    })
    .filter_map(|pid| snapshot.processes.get(&pid).map(|record| record.id))
    .collect()
}

/// When the first holder spared only for its age reaches the floor.
pub fn next_of_age(snapshot: &Snapshot, selection: &Selection) -> Option<Duration> {
    selection
        .spared
        .values()
        .filter_map(|spared| match spared {
            Spared::Young {
                age: Some(age),
                floor,
            } => Some(floor.saturating_sub(*age)),
            _ => None,
        })
        .min()
        .filter(|_| !snapshot.processes.is_empty())
}

/// The GPUs where a plan takes more than `max_share` of the holders the
/// driver lists: (GPU, taken, holders).
pub fn over_share(
    snapshot: &Snapshot,
    plan: &FreeReport,
    max_share: f64,
) -> Vec<(u32, usize, usize)> {
    let mut over = Vec::new();
    for gpu in &snapshot.gpus {
        let holders = crate::metrics::holders(gpu);
        let taken = plan
            .targets
            .iter()
            .filter(|target| {
                gpu.users
                    .iter()
                    .any(|user| user.pid == target.pid && (user.listed || !gpu.driver_answered()))
            })
            .count();
        if taken > 0 && taken as f64 > max_share * holders as f64 {
            over.push((gpu.index, taken, holders));
        }
    }
    over
}

/// A target's verdict, from the free's report.
fn verdict(target: &Handled, report: &FreeReport) -> &'static str {
    let gpus: Vec<_> = report
        .gpus
        .iter()
        .filter(|gpu| target.gpus.contains(&gpu.index))
        .collect();
    match target.fate {
        _ if report.dry_run => "would_free",
        reap::Fate::PermissionDenied => "permission_denied",
        _ if gpus.iter().any(|gpu| !gpu.checked) => "unchecked",
        reap::Fate::Exited | reap::Fate::Zombie if gpus.iter().all(|gpu| gpu.freed) => "freed",
        reap::Fate::Exited | reap::Fate::Zombie => "exited",
        reap::Fate::Alive => "still_held",
    }
}

/// The watch: its config, its memory of the last full look, its outputs.
struct Watch<'a> {
    config: &'a ReapConfig,
    driver: &'a dyn Driver,
    guard: Guard,
    log: DecisionLog,
    metrics: WatchMetrics,
    figures: crate::metrics::ScanFigures,
    pace: Pace,
    /// Per rule, the holders the last full look named (by identity).
    pending: BTreeMap<Rule, BTreeSet<ProcessId>>,
    /// Per rule, the holders the last full look found in its scope that the
    /// guard spares though they hold memory (`spared_holders`).
    spared: BTreeMap<Rule, BTreeSet<ProcessId>>,
    /// A single pass's last full look that was whole: what it says of the
    /// holders it did not act on is read from it (`None` under `--watch`).
    last: Option<Snapshot>,
    /// Processes already reported (a dry run's `would_free`) or already
    /// freed once and left as they were (refused by the kernel, in D): not
    /// reported or signalled again while they live.
    done: BTreeSet<ProcessId>,
    /// The fault last reported, while it lasts.
    fault: Option<String>,
    /// Memory ended jobs' ids, so that Slurm is asked about a job once after it ended.
    jobs: slurm::Jobs,
    /// Holders whose container is gone, with why, in the last full look.
    gone: BTreeMap<ProcessId, String>,
    stop: Arc<AtomicBool>,
    /// Of a single pass: a rule refused, something still held, a fault.
    outcome: Exit,
}

/// What one full look came to.
enum Looked {
    Nothing,
    Acted,
}

impl Watch<'_> {
    fn decision(&self, action: Action, message: String) -> Decision<'static> {
        Decision::new(action, !self.config.enforce, message)
    }

    /// One full look: a snapshot, the faults, each rule's holders, and the
    /// act on those two looks agree on (one free a look: after it, the host
    /// has changed, and the next look starts again from what it sees).
    fn look(&mut self) -> Looked {
        let confirming = self.pending.values().any(|ids| !ids.is_empty());
        let started = Instant::now();
        // Before acting, every process's descriptors: monitors are told
        // apart and nothing in scope is missed; else what the driver lists.
        let mut snapshot = if confirming {
            Snapshot::take_focused(self.driver, &BTreeSet::new())
        } else {
            Snapshot::take_listed(self.driver)
        };
        if self.config.rules.contains(&Rule::ContainerGone) {
            snapshot.attribute_containers(&self.config.sources);
            self.gone = crate::select::gone_containers(&snapshot);
        }
        self.figures.count(&snapshot, started.elapsed());
        self.pace.looked(&snapshot);
        self.metrics.looked(&snapshot);
        if let Some(problem) = fault(&snapshot) {
            self.on_fault(problem);
            return Looked::Nothing;
        }
        if let Some(problem) = self.fault.take() {
            let message = format!("scans are whole again (after: {problem})");
            self.log.record(&self.decision(Action::Recovered, message));
        }
        let live: BTreeSet<ProcessId> = snapshot.processes.values().map(|r| r.id).collect();
        self.done.retain(|id| live.contains(id));
        let ended = self.jobs.ended(&snapshot, self.config);
        let mut found: BTreeMap<Rule, BTreeSet<ProcessId>> = BTreeMap::new();
        let mut spared: BTreeMap<Rule, BTreeSet<ProcessId>> = BTreeMap::new();
        let mut acted = None;
        let mut of_age: Option<Duration> = None;
        for &rule in &self.config.rules {
            let within = match rule {
                Rule::SlurmEnded => match &ended {
                    Ok(ids) => Some(ids.clone()),
                    Err(problem) => {
                        self.on_fault(problem.clone());
                        continue;
                    }
                },
                Rule::ContainerGone => Some(self.gone.keys().copied().collect()),
                _ => None,
            };
            let selection = select(
                &snapshot,
                &self.config.scope(rule, within.clone()),
                &self.guard,
            );
            if let Some(problem) = unreadable_in_reach(&snapshot, &selection) {
                self.on_fault(problem);
                return Looked::Nothing;
            }
            of_age = of_age
                .into_iter()
                .chain(next_of_age(&snapshot, &selection))
                .min();
            let named: BTreeSet<ProcessId> =
                named_holders(&snapshot, &selection, &self.config.gpus)
                    .difference(&self.done)
                    .copied()
                    .collect();
            let confirmed: BTreeSet<ProcessId> = named
                .intersection(self.pending.get(&rule).unwrap_or(&BTreeSet::new()))
                .copied()
                .collect();
            found.insert(rule, named);
            spared.insert(
                rule,
                spared_holders(&snapshot, &selection, &self.config.gpus)
                    .difference(&self.done)
                    .copied()
                    .collect(),
            );
            if acted.is_none() && !confirmed.is_empty() {
                acted = Some((rule, confirmed));
            }
        }
        self.pace.of_age(of_age);
        self.spared = spared;
        if !self.config.watch {
            self.last = Some(snapshot.clone());
        }
        let Some((rule, confirmed)) = acted else {
            self.pending = found;
            return Looked::Nothing;
        };
        // What the act handles is not pending any more; the rest is.
        for ids in found.values_mut() {
            ids.retain(|id| !confirmed.contains(id));
        }
        self.pending = found;
        self.act(rule, confirmed, snapshot);
        Looked::Acted
    }

    fn on_fault(&mut self, problem: String) {
        self.metrics.fault();
        self.pending.clear();
        self.spared.clear();
        self.outcome = Exit::Incomplete;
        if self.fault.as_deref() != Some(problem.as_str()) {
            let message = format!("{problem}; nothing is signalled until two whole scans agree");
            self.log.record(&self.decision(Action::Fault, message));
            self.fault = Some(problem);
        }
    }

    /// Frees (or, in a dry run, plans) the confirmed holders of one rule.
    fn act(&mut self, rule: Rule, confirmed: BTreeSet<ProcessId>, snapshot: Snapshot) {
        let scope = self.config.scope(rule, Some(confirmed));
        let plan = reap::plan(&snapshot, &scope, &self.guard);
        let over = over_share(&snapshot, &plan, self.config.max_share);
        if !over.is_empty() {
            self.refuse(rule, &plan, &over);
            return;
        }
        let report = if self.config.enforce {
            let wanted: Vec<String> = plan
                .targets
                .iter()
                .map(|target| format!("{} ({})", target.pid, one_line(&target.comm)))
                .collect();
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!(
                    "gpureap reap: freeing [{}]: {}\n",
                    rule.name(),
                    wanted.join(", ")
                )
                .as_bytes(),
            );
            reap::free(
                self.driver,
                &scope,
                &self.guard,
                snapshot.clone(),
                self.config.options,
                &mut |_| {},
            )
        } else {
            plan
        };
        self.record(rule, &snapshot, &report);
    }

    fn refuse(&mut self, rule: Rule, plan: &FreeReport, over: &[(u32, usize, usize)]) {
        self.outcome = Exit::worst([self.outcome, Exit::StillHeld]);
        for &(gpu, taken, holders) in over {
            let message = format!(
                "rule {} names {taken} of the {holders} holders of GPU {gpu}, more than --max-share {}: nothing is signalled; check the policy",
                rule.name(),
                self.config.max_share
            );
            let mut decision = self.decision(Action::Refused, message);
            decision.rule = Some(rule.name());
            decision.verdict = Some("refused");
            self.log.record(&decision);
        }
        for target in &plan.targets {
            self.metrics.reaped(rule.name(), "refused");
            self.done.insert(ProcessId {
                pid: target.pid,
                start_time: target.start_time,
            });
        }
    }

    /// One decision line per target of a free (or a plan), and the metrics.
    fn record(&mut self, rule: Rule, snapshot: &Snapshot, report: &FreeReport) {
        for target in &report.targets {
            let id = ProcessId {
                pid: target.pid,
                start_time: target.start_time,
            };
            let verdict = verdict(target, report);
            // Not named again while it lives: reported (a dry run), or
            // freed once and left as it was (refused by the kernel, in D).
            if !self.done.insert(id) && report.dry_run {
                continue;
            }
            if !matches!(verdict, "freed" | "would_free") {
                self.outcome = Exit::worst([self.outcome, Exit::StillHeld]);
            }
            self.metrics.reaped(rule.name(), verdict);
            let decision = self.target_decision(rule, snapshot, report, target, verdict);
            self.log.record(&decision);
        }
        for gpu in &report.gpus {
            if gpu.freed {
                self.metrics
                    .freed_bytes(rule.name(), gpu.freed_bytes.unwrap_or(0));
            }
        }
    }

    fn target_decision<'r>(
        &self,
        rule: Rule,
        snapshot: &Snapshot,
        report: &'r FreeReport,
        target: &'r Handled,
        verdict: &'static str,
    ) -> Decision<'r> {
        let why = self.why(rule, snapshot, target);
        let gpus: Vec<&reap::GpuOutcome> = report
            .gpus
            .iter()
            .filter(|gpu| target.gpus.contains(&gpu.index))
            .collect();
        let mut message = format!(
            "pid {} ({}) [{}]{}: {verdict}",
            target.pid,
            one_line(&target.comm),
            rule.name(),
            why.as_deref()
                .map(|why| format!(", {why}"))
                .unwrap_or_default()
        );
        for gpu in &gpus {
            match (gpu.freed_bytes, gpu.freed_after_ms) {
                (Some(bytes), Some(ms)) if gpu.freed => message.push_str(&format!(
                    "; GPU {} {} back in {}",
                    gpu.index,
                    Bytes(bytes),
                    Elapsed(Duration::from_millis(ms))
                )),
                _ if report.dry_run => message.push_str(&format!(
                    "; GPU {} holds {}",
                    gpu.index,
                    snapshot
                        .memory_of(target.pid, gpu.index)
                        .map_or("an unknown amount".to_string(), |bytes| Bytes(bytes)
                            .to_string())
                )),
                _ => message.push_str(&format!("; GPU {} not verified free", gpu.index)),
            }
        }
        let mut decision = Decision::new(
            if report.dry_run {
                Action::WouldFree
            } else {
                Action::Freed
            },
            report.dry_run,
            message,
        );
        decision.rule = Some(rule.name());
        decision.why = why;
        decision.target = Some(crate::report::target_json(target));
        decision.age_ms = snapshot.age(target.pid).map(|age| age.as_millis() as u64);
        decision.uid = snapshot.processes.get(&target.pid).and_then(|r| r.uid);
        decision.gpus = gpus
            .into_iter()
            .map(crate::report::gpu_outcome_json)
            .collect();
        decision.verdict = Some(verdict);
        decision
    }

    /// A single pass's last word on the holders it did not act on: one
    /// `held` line each, naming the process, its memory on each GPU and why
    /// it was left; any makes the pass exit 1. Not acting on them is right:
    /// saying the host is clean would not be.
    fn say_unacted(&mut self) {
        let Some(snapshot) = self.last.take() else {
            return;
        };
        let seen_once = std::mem::take(&mut self.pending);
        let spared = std::mem::take(&mut self.spared);
        let mut said = BTreeSet::new();
        let unacted = seen_once
            .iter()
            .flat_map(|(&rule, ids)| ids.iter().map(move |id| (rule, *id, true)))
            .chain(
                spared
                    .iter()
                    .flat_map(|(&rule, ids)| ids.iter().map(move |id| (rule, *id, false))),
            );
        for (rule, id, once) in unacted {
            let Some(record) = snapshot
                .processes
                .get(&id.pid)
                .filter(|record| record.id == id)
            else {
                continue;
            };
            if !said.insert(id) {
                continue;
            }
            let scope = self.config.scope(rule, None);
            let target = Handled::found(&snapshot, &scope, record, Because::InScope, false);
            let left = if once {
                "seen by the last look only: a holder is acted on when two looks in a row name it; run reap again, or with --watch".to_string()
            } else {
                match self.guard.spare_reason(&snapshot, record, false) {
                    Some(spared) => format!("spared: {spared}"),
                    None => "spared".to_string(),
                }
            };
            let why = self.why(rule, &snapshot, &target);
            let mut message = format!(
                "pid {} ({}) [{}]{}: not acted on, {left}",
                target.pid,
                one_line(&target.comm),
                rule.name(),
                why.as_deref()
                    .map(|why| format!(", {why}"))
                    .unwrap_or_default()
            );
            for &gpu in &target.gpus {
                message.push_str(&format!(
                    "; GPU {gpu} holds {}",
                    snapshot
                        .memory_of(target.pid, gpu)
                        .map_or("an unknown amount".to_string(), |bytes| Bytes(bytes)
                            .to_string())
                ));
            }
            let gpus: Vec<reap::GpuOutcome> = target
                .gpus
                .iter()
                .map(|&gpu| reap::GpuOutcome::planned(&snapshot, gpu))
                .collect();
            self.outcome = Exit::worst([self.outcome, Exit::StillHeld]);
            let verdict = if once { "seen_once" } else { "spared" };
            self.metrics.reaped(rule.name(), verdict);
            let mut decision = self.decision(Action::Held, message);
            decision.rule = Some(rule.name());
            decision.why = why;
            decision.target = Some(crate::report::target_json(&target));
            decision.age_ms = snapshot.age(target.pid).map(|age| age.as_millis() as u64);
            decision.uid = record.uid;
            decision.gpus = gpus.iter().map(crate::report::gpu_outcome_json).collect();
            decision.verdict = Some(verdict);
            self.log.record(&decision);
        }
    }

    /// Why `rule` named `target`, in words.
    fn why(&self, rule: Rule, snapshot: &Snapshot, target: &Handled) -> Option<String> {
        match rule {
            Rule::Orphaned => target
                .orphan
                .map(|orphan| format!("orphaned: {orphan}"))
                .or_else(|| {
                    snapshot
                        .supervisor_gone(target.pid)
                        .map(|_| "its gpureap run supervisor is gone".to_string())
                }),
            Rule::SupervisorGone => Some("its gpureap run supervisor is gone".to_string()),
            Rule::SlurmEnded => self.jobs.why(target.pid),
            Rule::ContainerGone => self
                .gone
                .get(&ProcessId {
                    pid: target.pid,
                    start_time: target.start_time,
                })
                .cloned(),
        }
        .or_else(|| match target.because {
            Because::Descendant { of } => Some(format!("a descendant of {of}")),
            _ => None,
        })
    }

    /// Waits out the rest of the cycle, watching the driver's figures and
    /// the stop flag; returns false once asked to stop.
    fn wait(&mut self, until: Instant) -> bool {
        while !self.stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            if now >= until {
                return true;
            }
            self.pace.wait(self.driver, (until - now).min(STOP_CHECK));
        }
        false
    }
}

/// How often a wait looks at the stop flag: SIGTERM ends the watch within this.
const STOP_CHECK: Duration = Duration::from_millis(200);

/// The signals that end the watch between cycles (SIGHUP is caught and ignored).
fn catch_signals() -> std::io::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop))?;
    }
    signal_hook::flag::register(
        signal_hook::consts::SIGHUP,
        Arc::new(AtomicBool::new(false)),
    )?;
    Ok(stop)
}

/// Runs the watch (or, without `--watch`, one pass: two full looks an
/// interval apart) until SIGTERM or SIGINT.
pub fn run(config: &ReapConfig, driver: &dyn Driver) -> std::io::Result<Exit> {
    let stop = catch_signals()?;
    driver.will_wait();
    let mut watch = Watch {
        config,
        driver,
        guard: Guard::for_this_process(&config.protect),
        log: DecisionLog::new(config.log.clone()),
        metrics: WatchMetrics::default(),
        figures: crate::metrics::ScanFigures::default(),
        pace: Pace::default(),
        pending: BTreeMap::new(),
        spared: BTreeMap::new(),
        last: None,
        done: BTreeSet::new(),
        fault: None,
        jobs: slurm::Jobs::default(),
        gone: BTreeMap::new(),
        stop,
        outcome: Exit::Success,
    };
    if let Some(address) = config.listen {
        let listener = crate::http::bind(address)?;
        let local = listener.local_addr()?;
        let metrics = watch.metrics.clone();
        crate::http::serve_in_background(listener, move || metrics.page())?;
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!("gpureap reap: metrics on http://{local}/metrics\n").as_bytes(),
        );
    }
    let started = format!("{}; {}", config.describe(), driver.describe());
    watch.log.record(&watch.decision(Action::Started, started));
    let mut cycles = 0u32;
    loop {
        let next = Instant::now() + config.interval;
        let force = cycles == 0
            || !config.watch
            || watch.fault.is_some()
            || watch.pending.values().any(|ids| !ids.is_empty());
        if watch.pace.full_look_due(force) {
            watch.look();
        }
        watch.metrics.ran(&watch.figures);
        cycles += 1;
        let once_done = !config.watch && cycles >= 2;
        if once_done || !watch.wait(next) {
            break;
        }
    }
    if !config.watch {
        watch.say_unacted();
    }
    let how = if watch.stop.load(Ordering::SeqCst) {
        "by a signal, between scans"
    } else {
        "after one pass"
    };
    watch
        .log
        .record(&watch.decision(Action::Stopped, format!("stopped {how}")));
    Ok(if config.watch {
        Exit::Success
    } else {
        watch.outcome
    })
}
