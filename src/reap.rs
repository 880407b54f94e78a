//! Signal escalation, and the loop that watches until the GPUs are verified free.
//!
//! SIGTERM everything first, so servers can shut down cleanly; after the grace
//! period SIGSTOP the survivors before SIGKILL, so a parent cannot respawn its
//! children between two kills; then keep re-scanning for new holders in scope
//! until the driver says the memory is back, or the timeout passes. Every
//! signal goes through a pidfd opened before checking the start time, so a
//! recycled PID is never hit.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, Signal, kill_process, pidfd_open, pidfd_send_signal};

use crate::driver::Driver;
use crate::proc::{self, ProcessId, Unreadable};
use crate::select::{Because, Guard, Scope, Selection, select};
use crate::snapshot::Snapshot;
use crate::verify::{self, Ledger, Reason, Trend};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sig {
    Term,
    Stop,
    Kill,
}

impl Sig {
    pub fn name(self) -> &'static str {
        match self {
            Sig::Term => "SIGTERM",
            Sig::Stop => "SIGSTOP",
            Sig::Kill => "SIGKILL",
        }
    }

    fn signal(self) -> Signal {
        match self {
            Sig::Term => Signal::TERM,
            Sig::Stop => Signal::STOP,
            Sig::Kill => Signal::KILL,
        }
    }
}

/// What happened to one signal.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    Sent,
    /// The process had exited, or its PID now names another process.
    Gone,
    PermissionDenied,
    Failed(String),
}

/// Sends a signal to exactly the process `id` names, or to nothing.
pub fn send(id: ProcessId, sig: Sig) -> Delivery {
    let Some(pid) = Pid::from_raw(id.pid as i32) else {
        return Delivery::Gone;
    };
    match pidfd_open(pid, PidfdFlags::empty()) {
        Ok(pidfd) => {
            // The pidfd pins the process it was opened on: if the start time
            // still matches now, the pidfd is the process we mean.
            if proc::start_time(id.pid) != Some(id.start_time) {
                return Delivery::Gone;
            }
            delivery(pidfd_send_signal(&pidfd, sig.signal()))
        }
        Err(Errno::SRCH) => Delivery::Gone,
        Err(Errno::NOSYS) => {
            // Kernels before 5.3: the same check, with a small race left open.
            if proc::start_time(id.pid) != Some(id.start_time) {
                return Delivery::Gone;
            }
            delivery(kill_process(pid, sig.signal()))
        }
        Err(Errno::PERM | Errno::ACCESS) => Delivery::PermissionDenied,
        Err(error) => Delivery::Failed(error.to_string()),
    }
}

fn delivery(result: rustix::io::Result<()>) -> Delivery {
    match result {
        Ok(()) => Delivery::Sent,
        Err(Errno::SRCH) => Delivery::Gone,
        Err(Errno::PERM | Errno::ACCESS) => Delivery::PermissionDenied,
        Err(error) => Delivery::Failed(error.to_string()),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SignalEvent {
    pub signal: &'static str,
    pub at_ms: u64,
    pub delivery: Delivery,
}

/// What became of a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// Still running (for now).
    Alive,
    Exited,
    /// Had exited already when found; nothing to signal.
    Zombie,
    /// The kernel refused our signals.
    PermissionDenied,
}

/// One process the reaper handled, and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Handled {
    pub pid: u32,
    pub start_time: u64,
    pub ppid: u32,
    pub comm: String,
    pub cmdline: String,
    /// Why it was a target: named, in_scope, or descendant.
    pub because: String,
    pub gpus: BTreeSet<u32>,
    pub signals: Vec<SignalEvent>,
    pub fate: Fate,
    pub exited_after_ms: Option<u64>,
    /// Found on a re-scan after the first pass (respawned or late).
    pub late: bool,
}

impl Handled {
    fn id(&self) -> ProcessId {
        ProcessId {
            pid: self.pid,
            start_time: self.start_time,
        }
    }

    fn denied(&self) -> bool {
        self.signals
            .iter()
            .any(|event| event.delivery == Delivery::PermissionDenied)
    }

    /// A SIGKILL was delivered (one that failed does not count, and is retried).
    pub fn killed(&self) -> bool {
        self.signals
            .iter()
            .any(|event| event.signal == "SIGKILL" && event.delivery == Delivery::Sent)
    }

    fn is_open(&self) -> bool {
        self.fate == Fate::Alive
    }
}

/// A process in scope that was left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SparedEntry {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    pub reason: &'static str,
    pub why: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GpuOutcome {
    pub index: u32,
    pub freed: bool,
    pub memory_before: Option<u64>,
    pub memory_after: Option<u64>,
    /// Bytes that came back; `None` when the driver reports no memory.
    pub freed_bytes: Option<u64>,
    /// From the command's start to the first snapshot that verified it free.
    pub freed_after_ms: Option<u64>,
    pub reasons: Vec<Reason>,
}

/// Everything `free` did and found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FreeReport {
    pub backend: String,
    pub dry_run: bool,
    pub elapsed_ms: u64,
    pub targets: Vec<Handled>,
    pub spared: Vec<SparedEntry>,
    pub gpus: Vec<GpuOutcome>,
    pub unreadable: Vec<Unreadable>,
    /// With `--stale-runs`: each stale run's cgroup, and whether it was removed.
    pub stale_runs: Vec<crate::supervision::Removal>,
}

impl FreeReport {
    /// Every GPU in scope verified free, no target we were refused, and
    /// every stale run's cgroup removed.
    pub fn all_freed(&self) -> bool {
        self.gpus.iter().all(|gpu| gpu.freed)
            && !self.targets.iter().any(Handled::denied)
            && self.stale_runs.iter().all(|run| run.removed)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub grace: Duration,
    pub timeout: Duration,
    /// How often the driver and /proc are re-read while waiting.
    pub poll: Duration,
}

/// What the progress line shows.
pub struct Progress<'a> {
    pub phase: &'static str,
    pub elapsed: Duration,
    pub alive: usize,
    pub gpus: &'a [(u32, Option<u64>, bool)],
}

#[derive(Default)]
struct Reaper {
    handled: BTreeMap<ProcessId, Handled>,
    spared: BTreeMap<u32, SparedEntry>,
    start: Option<Instant>,
    /// Parents that respawned holders after we killed their children, by GPU.
    respawns: BTreeMap<u32, BTreeMap<u32, u32>>,
}

impl Ledger for Reaper {
    fn signals_sent(&self, pid: u32) -> Vec<String> {
        self.latest(pid)
            .map(|handled| {
                handled
                    .signals
                    .iter()
                    .filter(|event| event.delivery == Delivery::Sent)
                    .map(|event| event.signal.to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn permission_denied(&self, pid: u32) -> bool {
        self.latest(pid).is_some_and(Handled::denied)
    }

    fn was_target(&self, pid: u32) -> bool {
        self.latest(pid).is_some()
    }
}

impl Reaper {
    fn latest(&self, pid: u32) -> Option<&Handled> {
        self.handled
            .values()
            .rev()
            .find(|handled| handled.pid == pid)
    }

    fn elapsed_ms(&self) -> u64 {
        self.start
            .map_or(0, |start| start.elapsed().as_millis() as u64)
    }

    /// Records the targets and spared processes of a selection; returns the
    /// identities that are new.
    fn adopt(&mut self, snapshot: &Snapshot, selection: &Selection, late: bool) -> Vec<ProcessId> {
        let mut new = Vec::new();
        for (&pid, because) in &selection.targets {
            let Some(record) = snapshot.processes.get(&pid) else {
                continue;
            };
            if self.handled.contains_key(&record.id) {
                continue;
            }
            let zombie = record.state == 'Z';
            self.handled.insert(
                record.id,
                Handled {
                    pid,
                    start_time: record.id.start_time,
                    ppid: record.ppid,
                    comm: record.comm.clone(),
                    cmdline: record.cmdline.clone(),
                    because: match because {
                        Because::Named => "named".to_string(),
                        Because::StaleRun => "stale_run".to_string(),
                        Because::InScope => "in_scope".to_string(),
                        Because::Descendant { of } => format!("descendant of {of}"),
                    },
                    gpus: snapshot.gpus_used_by(pid),
                    signals: Vec::new(),
                    fate: if zombie { Fate::Zombie } else { Fate::Alive },
                    exited_after_ms: None,
                    late,
                },
            );
            if !zombie {
                new.push(record.id);
            }
        }
        for (&pid, reason) in &selection.spared {
            let Some(record) = snapshot.processes.get(&pid) else {
                continue;
            };
            self.spared.entry(pid).or_insert_with(|| SparedEntry {
                pid,
                comm: record.comm.clone(),
                cmdline: record.cmdline.clone(),
                reason: reason.code(),
                why: reason.to_string(),
            });
        }
        new
    }

    /// Notes parents that brought back holders we had already killed.
    fn note_respawns(&mut self, snapshot: &Snapshot, new: &[ProcessId]) {
        let killed_parents: BTreeSet<u32> = self
            .handled
            .values()
            .filter(|handled| {
                !handled.late && handled.signals.iter().any(|e| e.delivery == Delivery::Sent)
            })
            .map(|handled| handled.ppid)
            .collect();
        for id in new {
            let Some(record) = snapshot.processes.get(&id.pid) else {
                continue;
            };
            let parent_is_target = self
                .handled
                .values()
                .any(|h| h.pid == record.ppid && h.fate != Fate::Exited);
            if record.ppid > 1 && killed_parents.contains(&record.ppid) && !parent_is_target {
                for gpu in snapshot.gpus_used_by(id.pid) {
                    *self
                        .respawns
                        .entry(gpu)
                        .or_default()
                        .entry(record.ppid)
                        .or_insert(0) += 1;
                }
            }
        }
    }

    fn signal(&mut self, id: ProcessId, sig: Sig) {
        let at_ms = self.elapsed_ms();
        let Some(handled) = self.handled.get_mut(&id) else {
            return;
        };
        if !handled.is_open() || handled.denied() {
            return;
        }
        let delivery = send(id, sig);
        match delivery {
            Delivery::Gone => {
                handled.fate = Fate::Exited;
                handled.exited_after_ms.get_or_insert(at_ms);
            }
            Delivery::PermissionDenied => handled.fate = Fate::PermissionDenied,
            _ => {}
        }
        handled.signals.push(SignalEvent {
            signal: sig.name(),
            at_ms,
            delivery,
        });
    }

    /// SIGSTOP every open target first, then SIGKILL them: a stopped parent
    /// cannot respawn a child we are about to kill.
    fn stop_and_kill(&mut self, ids: &[ProcessId]) {
        for &id in ids {
            self.signal(id, Sig::Stop);
        }
        for &id in ids {
            self.signal(id, Sig::Kill);
        }
    }

    /// Re-reads the state of every open target; returns how many are alive.
    fn refresh(&mut self) -> usize {
        let at_ms = self.elapsed_ms();
        let mut alive = 0;
        for handled in self.handled.values_mut().filter(|h| h.is_open()) {
            match proc::state_of(handled.id()) {
                None | Some('Z') | Some('X') => {
                    handled.fate = Fate::Exited;
                    handled.exited_after_ms = Some(at_ms);
                }
                Some(_) => alive += 1,
            }
        }
        alive
    }

    fn open_ids(&self) -> Vec<ProcessId> {
        self.handled
            .values()
            .filter(|handled| handled.is_open() && !handled.killed())
            .map(Handled::id)
            .collect()
    }

    /// Whether a live process other than PID 1 is the parent of something we
    /// killed: it might respawn it, so a freed GPU is watched a little longer.
    fn parent_may_respawn(&self) -> bool {
        self.handled.values().any(|handled| {
            handled.ppid > 1
                && !self.handled.values().any(|other| other.pid == handled.ppid)
                && proc::start_time(handled.ppid).is_some()
        })
    }
}

/// Whether every user of this GPU is in scope, hidden ones included.
fn whole_gpu(scope: &Scope, index: u32) -> bool {
    scope.all
        || scope
            .gpus
            .as_ref()
            .is_some_and(|gpus| gpus.contains(&index))
}

/// How long a freed GPU is watched for respawned holders when a parent that
/// could respawn them is alive.
const SETTLE: Duration = Duration::from_millis(300);

/// Lists what `free` would do, signalling nothing.
pub fn plan(snapshot: &Snapshot, scope: &Scope, guard: &Guard) -> FreeReport {
    let selection = select(snapshot, scope, guard);
    let mut reaper = Reaper::default();
    reaper.adopt(snapshot, &selection, false);
    let gpus = scope
        .gpus
        .clone()
        .unwrap_or_else(|| verify::gpus_touched(snapshot, &selection));
    FreeReport {
        backend: snapshot.backend.clone(),
        dry_run: true,
        elapsed_ms: 0,
        targets: reaper.handled.into_values().collect(),
        spared: reaper.spared.into_values().collect(),
        gpus: gpus
            .into_iter()
            .map(|index| {
                let used = snapshot.gpu(index).and_then(|gpu| gpu.memory_used);
                GpuOutcome {
                    index,
                    freed: false,
                    memory_before: used,
                    memory_after: used,
                    freed_bytes: None,
                    freed_after_ms: None,
                    reasons: Vec::new(),
                }
            })
            .collect(),
        unreadable: snapshot.unreadable.clone(),
        stale_runs: Vec::new(),
    }
}

/// Frees the scope: escalates, re-scans, and verifies through the driver.
pub fn free(
    driver: &dyn Driver,
    scope: &Scope,
    guard: &Guard,
    first: Snapshot,
    options: Options,
    progress: &mut dyn FnMut(&Progress),
) -> FreeReport {
    let start = Instant::now();
    let mut reaper = Reaper {
        start: Some(start),
        ..Reaper::default()
    };
    let memory_before: BTreeMap<u32, Option<u64>> = first
        .gpus
        .iter()
        .map(|gpu| (gpu.index, gpu.memory_used))
        .collect();
    let mut gpus_in_scope = scope.gpus.clone().unwrap_or_default();
    let mut unreadable: Vec<Unreadable> = Vec::new();
    let grace_end = start + options.grace;
    // --timeout counts from the escalation, so at least one round follows the SIGKILL.
    let deadline = grace_end + options.timeout;
    let hard_deadline = deadline + options.timeout.max(Duration::from_secs(60));
    let mut trends: BTreeMap<u32, Trend> = BTreeMap::new();
    let mut freed_at: BTreeMap<u32, Instant> = BTreeMap::new();
    let mut all_freed_since: Option<Instant> = None;
    let mut escalated = false;
    let named: BTreeSet<u32> = scope.pids.iter().map(|id| id.pid).collect();
    let mut next = Some(first);
    let mut round = 0u32;

    // Each round: re-scan, adopt holders in scope that appeared (respawned,
    // late orphans), signal per the phase, and ask the driver what is left.
    let (snapshot, selection) = loop {
        let snapshot = next
            .take()
            .unwrap_or_else(|| Snapshot::take_focused(driver, &named));
        let selection = select(&snapshot, scope, guard);
        let new = reaper.adopt(&snapshot, &selection, round > 0);
        round += 1;
        reaper.note_respawns(&snapshot, &new);
        gpus_in_scope.extend(verify::gpus_touched(&snapshot, &selection));
        for entry in &snapshot.unreadable {
            if !unreadable.contains(entry) {
                unreadable.push(entry.clone());
            }
        }
        let now = Instant::now();
        if now < grace_end {
            for id in new {
                reaper.signal(id, Sig::Term);
            }
        } else {
            // Pass 2, and every round after: stop, then kill, whatever is open.
            escalated = true;
            reaper.refresh();
            reaper.stop_and_kill(&reaper.open_ids());
        }

        let mut shown = Vec::new();
        let mut all_freed = true;
        for &index in &gpus_in_scope {
            let freed = match snapshot.gpu(index) {
                Some(gpu) => {
                    trends
                        .entry(index)
                        .or_default()
                        .record(now, gpu.memory_used);
                    verify::assess(gpu, &snapshot, &selection, &reaper, whole_gpu(scope, index))
                        .freed
                }
                None => false,
            };
            if freed {
                freed_at.entry(index).or_insert(now);
            } else {
                freed_at.remove(&index);
            }
            all_freed &= freed;
            shown.push((
                index,
                snapshot.gpu(index).and_then(|gpu| gpu.memory_used),
                freed,
            ));
        }
        let alive = reaper.refresh();
        tracing::debug!(
            round,
            elapsed_ms = start.elapsed().as_secs_f64() * 1e3,
            alive,
            all_freed,
            gpus = ?shown,
            "free round"
        );
        progress(&Progress {
            phase: if escalated {
                "verifying"
            } else {
                "waiting for SIGTERM"
            },
            elapsed: start.elapsed(),
            alive,
            gpus: &shown,
        });

        if all_freed {
            let since = *all_freed_since.get_or_insert(now);
            let settled = !reaper.parent_may_respawn() || now.duration_since(since) >= SETTLE;
            // Targets holding no GPU get until the grace ends, then a second.
            let stragglers_done =
                alive == 0 || (escalated && now.duration_since(since) >= Duration::from_secs(1));
            if settled && stragglers_done {
                break (snapshot, selection);
            }
        } else {
            all_freed_since = None;
        }
        if now >= deadline {
            let releasing = gpus_in_scope.iter().any(|index| {
                !freed_at.contains_key(index)
                    && trends
                        .get(index)
                        .is_some_and(|trend| trend.release_rate().is_some())
            });
            if !releasing || now >= hard_deadline {
                break (snapshot, selection);
            }
        }
        let pause = if escalated {
            options.poll
        } else {
            options
                .poll
                .min(grace_end.saturating_duration_since(Instant::now()))
        };
        std::thread::sleep(pause);
    };

    let gpus = gpus_in_scope
        .iter()
        .map(|&index| {
            let gpu = snapshot.gpu(index);
            let memory_after = gpu.and_then(|gpu| gpu.memory_used);
            let memory_before = memory_before.get(&index).copied().flatten();
            let respawner_alive = reaper.respawns.get(&index).is_some_and(|parents| {
                parents
                    .keys()
                    .any(|&parent| proc::start_time(parent).is_some())
            });
            let freed_after_ms = freed_at
                .get(&index)
                .filter(|_| !respawner_alive)
                .map(|at| at.duration_since(start).as_millis() as u64);
            let reasons = match (gpu, freed_after_ms) {
                (_, Some(_)) => Vec::new(),
                (None, None) => vec![Reason::DriverError {
                    message: format!("GPU {index} is not reported by the driver"),
                }],
                (Some(gpu), None) => {
                    let assessment = verify::assess(
                        gpu,
                        &snapshot,
                        &selection,
                        &reaper,
                        whole_gpu(scope, index),
                    );
                    let trend = trends.get(&index).cloned().unwrap_or_default();
                    let respawns = reaper.respawns.get(&index).cloned().unwrap_or_default();
                    verify::explain(
                        gpu,
                        &assessment,
                        &snapshot,
                        &selection,
                        &reaper,
                        &trend,
                        &respawns,
                    )
                }
            };
            GpuOutcome {
                index,
                freed: freed_after_ms.is_some(),
                memory_before,
                memory_after,
                freed_bytes: match (memory_before, memory_after) {
                    (Some(before), Some(after)) => Some(before.saturating_sub(after)),
                    _ => None,
                },
                freed_after_ms,
                reasons,
            }
        })
        .collect();

    reaper.refresh();
    FreeReport {
        backend: snapshot.backend.clone(),
        dry_run: false,
        elapsed_ms: start.elapsed().as_millis() as u64,
        targets: reaper.handled.into_values().collect(),
        spared: reaper.spared.into_values().collect(),
        gpus,
        unreadable,
        stale_runs: Vec::new(),
    }
}
