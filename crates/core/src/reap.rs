//! Signal escalation, and the loop that watches until the GPUs are verified free.
//!
//! SIGTERM everything first, so servers can shut down cleanly; after the grace
//! period SIGSTOP the survivors before SIGKILL, so a parent cannot respawn its
//! children between two kills; then keep re-scanning for new holders in scope
//! until the driver says the memory is back, or the timeout passes. Every
//! signal goes through `signal::send` (a pidfd opened before checking the
//! start time), so a recycled PID is never hit.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::driver::Driver;
use crate::exit::Exit;
use crate::proc::{self, ProcessId, Unreadable};
use crate::select::{Because, Guard, Scope, Selection, Spared, select};
/// What happened to one signal (`SignalEvent::delivery`); it lives in `signal`.
use crate::signal::Delivery;
use crate::signal::{Sig, may_signal, send};
use crate::snapshot::{Orphaned, Snapshot};
use crate::verify::{self, Ledger, Reason, Trend};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalEvent {
    pub signal: Sig,
    pub at_ms: u64,
    pub delivery: Delivery,
}

/// What became of a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    pub pid: u32,
    pub start_time: u64,
    pub ppid: u32,
    pub comm: String,
    pub cmdline: String,
    /// Why it was a target.
    pub because: Because,
    /// Why it counts as orphaned, where it does (`--orphans` takes only these).
    pub orphan: Option<Orphaned>,
    /// Why its container counts as gone, where `--orphans` took it for that
    /// (`Scope::containers_gone`).
    pub container_gone: Option<String>,
    pub gpus: BTreeSet<u32>,
    pub signals: Vec<SignalEvent>,
    pub fate: Fate,
    pub exited_after_ms: Option<u64>,
    /// Found on a re-scan after the first pass (respawned or late).
    pub late: bool,
}

impl Handled {
    /// A process as a scope finds it in `snapshot`, before any signal.
    pub fn found(
        snapshot: &Snapshot,
        scope: &Scope,
        record: &crate::proc::ProcessRecord,
        because: Because,
        late: bool,
    ) -> Handled {
        let pid = record.id.pid;
        Handled {
            pid,
            start_time: record.id.start_time,
            ppid: record.ppid,
            comm: record.comm.clone(),
            cmdline: record.cmdline.clone(),
            because,
            orphan: snapshot.orphaned(pid),
            container_gone: scope
                .orphans
                .then(|| scope.containers_gone.get(&record.id).cloned())
                .flatten(),
            gpus: snapshot.gpus_used_by(pid),
            signals: Vec::new(),
            fate: if record.state.has_exited() {
                Fate::Zombie
            } else {
                Fate::Alive
            },
            exited_after_ms: None,
            late,
        }
    }

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

    /// The signals it was sent, in order (one that failed does not count).
    pub fn sent(&self) -> impl Iterator<Item = Sig> {
        self.signals
            .iter()
            .filter(|event| event.delivery == Delivery::Sent)
            .map(|event| event.signal)
    }

    /// A SIGKILL was delivered (one that failed does not count, and is retried).
    pub fn killed(&self) -> bool {
        self.sent().any(|signal| signal == Sig::Kill)
    }

    fn is_open(&self) -> bool {
        self.fate == Fate::Alive
    }
}

/// A process in scope that was left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparedEntry {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    pub reason: Spared,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GpuOutcome {
    pub index: u32,
    pub freed: bool,
    /// The driver could report on this GPU. When it could not (lost, no
    /// driver), it is never called freed and the command exits 3.
    pub checked: bool,
    pub memory_before: Option<u64>,
    pub memory_after: Option<u64>,
    /// Bytes that came back; `None` when the driver reports no memory.
    pub freed_bytes: Option<u64>,
    /// From the command's start to the first snapshot that verified it free.
    pub freed_after_ms: Option<u64>,
    pub reasons: Vec<Reason>,
    /// On a GPU still held: the processes out of scope that the driver lists
    /// there, so that what is used adds up (the text names them; the JSON's
    /// `status` lists them).
    pub others: Vec<OutOfScope>,
    /// What the hardware evidence implies for a GPU held by no process or
    /// lost (`Evidence::advice`); filled by the command after the free
    /// (`attach_advice`), empty otherwise.
    pub advice: Vec<String>,
}

impl GpuOutcome {
    /// A GPU as a plan sees it in `snapshot`, before anything is signalled:
    /// its one reason is memory held by no process there, which no signal
    /// frees (`verify::driver_held`).
    pub fn planned(snapshot: &Snapshot, index: u32) -> GpuOutcome {
        let gpu = snapshot.gpu(index);
        let used = gpu.and_then(|gpu| gpu.memory_used);
        GpuOutcome {
            index,
            freed: false,
            checked: gpu.is_some_and(|gpu| gpu.driver_answered()),
            memory_before: used,
            memory_after: used,
            freed_bytes: None,
            freed_after_ms: None,
            reasons: gpu
                .filter(|gpu| gpu.error.is_none())
                .and_then(|gpu| verify::driver_held(snapshot, gpu, 0))
                .into_iter()
                .collect(),
            others: Vec::new(),
            advice: Vec::new(),
        }
    }
}

/// A process out of scope that holds memory on a GPU in scope.
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfScope {
    pub pid: u32,
    /// `None` for a process in another PID namespace.
    pub comm: Option<String>,
    pub memory: Option<u64>,
}

/// Everything `free` did and found.
#[derive(Debug, Clone, PartialEq)]
pub struct FreeReport {
    pub backend: String,
    pub dry_run: bool,
    pub elapsed_ms: u64,
    pub targets: Vec<Handled>,
    pub spared: Vec<SparedEntry>,
    pub gpus: Vec<GpuOutcome>,
    pub unreadable: Vec<Unreadable>,
    /// With `--stale-runs`: each stale run's cgroup, and whether it was removed.
    pub stale_runs: Vec<crate::supervised::Removal>,
    /// With `--container`, `--pod`, `--cgroup`: what each resolved to on
    /// this host (its members and cgroups), filled by the command.
    pub cgroup_scopes: Vec<crate::members::Found>,
}

impl FreeReport {
    /// Reads the hardware evidence of each GPU left held by no process or
    /// that the driver could not report on, and attaches its advice.
    pub fn attach_advice(&mut self, driver: &dyn Driver) {
        let wanted: BTreeSet<u32> = self
            .gpus
            .iter()
            .filter(|gpu| {
                !gpu.freed
                    && (!gpu.checked
                        || gpu.reasons.iter().any(|reason| {
                            matches!(
                                reason,
                                Reason::DriverHeld { .. } | Reason::DriverError { .. }
                            )
                        }))
            })
            .map(|gpu| gpu.index)
            .collect();
        if wanted.is_empty() {
            return;
        }
        let (evidence, _) = driver.evidence(&wanted);
        for gpu in self.gpus.iter_mut() {
            if let Some(found) = evidence.get(&gpu.index) {
                gpu.advice = found.advice(gpu.index);
            }
        }
    }

    /// Every GPU in scope verified free, no target we were refused, and
    /// every stale run's cgroup removed.
    pub fn all_freed(&self) -> bool {
        self.gpus.iter().all(|gpu| gpu.freed)
            && !self.targets.iter().any(Handled::denied)
            && self.stale_runs.iter().all(|run| run.removed)
    }

    /// The exit code this outcome earns: done only when everything was
    /// verified free; a GPU the driver could not report on means the work
    /// could not be completed, whatever else happened. Where all that keeps
    /// it from done is memory unseen from a PID namespace of its own
    /// (`Reason::Unseen`), whether it is still held cannot be told: 3 too.
    pub fn exit(&self) -> Exit {
        let only_unseen = |gpu: &GpuOutcome| {
            gpu.freed
                || (!gpu.reasons.is_empty()
                    && gpu
                        .reasons
                        .iter()
                        .all(|reason| matches!(reason, Reason::Unseen { .. })))
        };
        if self.gpus.iter().any(|gpu| !gpu.checked) {
            Exit::Incomplete
        } else if self.all_freed() {
            Exit::Success
        } else if self.gpus.iter().all(only_unseen)
            && !self.targets.iter().any(Handled::denied)
            && self.stale_runs.iter().all(|run| run.removed)
        {
            Exit::Incomplete
        } else {
            Exit::StillHeld
        }
    }
}

/// How long a `free` signals and verifies: the one grace/deadline formula.
/// Built only by `Options::new` (a command's --grace and --timeout) or
/// `Options::within` (a budget, as the Slurm epilog has); `longest` is how
/// long such a free may take, which the fleet's per-host limit is made of.
/// The fields are private: no second formula can be written beside these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    grace: Duration,
    timeout: Duration,
    /// How long past `timeout` verification may wait while some GPU's
    /// memory is still going down.
    release: Duration,
}

impl Options {
    /// How often the driver and /proc are re-read while waiting.
    pub(crate) const POLL: Duration = Duration::from_millis(5);

    /// SIGTERM, `grace`, SIGSTOP+SIGKILL, then verification for `timeout`,
    /// and past it only while memory is still going down, for `timeout` or
    /// `RELEASE_EXTENSION` more, whichever is longer.
    pub fn new(grace: Duration, timeout: Duration) -> Options {
        Options {
            grace,
            timeout,
            release: timeout.max(RELEASE_EXTENSION),
        }
    }

    /// Options whose free ends within `budget`: `grace` up to half of it,
    /// verification up to `verify`, and the release extension only in
    /// what is left (`longest() <= budget`).
    pub fn within(grace: Duration, verify: Duration, budget: Duration) -> Options {
        let grace = grace.min(budget / 2);
        let timeout = budget.saturating_sub(grace).min(verify);
        Options {
            grace,
            timeout,
            release: budget.saturating_sub(grace).saturating_sub(timeout),
        }
    }

    pub fn grace(&self) -> Duration {
        self.grace
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The longest a free with these options may take.
    pub fn longest(&self) -> Duration {
        self.grace + self.timeout + self.release
    }
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
    fn signals_sent(&self, id: ProcessId) -> Vec<Sig> {
        self.handled
            .get(&id)
            .map(|handled| handled.sent().collect())
            .unwrap_or_default()
    }

    fn permission_denied(&self, id: ProcessId) -> bool {
        self.handled.get(&id).is_some_and(Handled::denied)
    }

    fn was_target(&self, id: ProcessId) -> bool {
        self.handled.contains_key(&id)
    }

    fn had_target_pid(&self, pid: u32) -> bool {
        self.handled.keys().any(|id| id.pid == pid)
    }
}

impl Reaper {
    fn elapsed_ms(&self) -> u64 {
        self.start
            .map_or(0, |start| start.elapsed().as_millis() as u64)
    }

    /// Records the targets and spared processes of a selection; returns the
    /// identities that are new.
    fn adopt(
        &mut self,
        snapshot: &Snapshot,
        scope: &Scope,
        selection: &Selection,
        late: bool,
    ) -> Vec<ProcessId> {
        let mut new = Vec::new();
        for (&pid, because) in &selection.targets {
            let Some(record) = snapshot.processes.get(&pid) else {
                continue;
            };
            if self.handled.contains_key(&record.id) {
                continue;
            }
            let zombie = record.state.has_exited();
            self.handled.insert(
                record.id,
                Handled::found(snapshot, scope, record, *because, late),
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
                reason: reason.clone(),
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
            signal: sig,
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
                Some(state) if !state.has_exited() => alive += 1,
                _ => {
                    handled.fate = Fate::Exited;
                    handled.exited_after_ms = Some(at_ms);
                }
            }
        }
        alive
    }

    /// Waits until every target that was sent SIGKILL has left /proc (or
    /// is a zombie), at most `limit`.
    fn wait_for_exits(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.handled.values().any(|h| h.is_open() && h.killed()) && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(2));
            self.refresh();
        }
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
    reaper.adopt(snapshot, scope, &selection, false);
    // Say now what the kernel would refuse (another user's process, when
    // not root), rather than list it as if it would be signalled.
    for handled in reaper.handled.values_mut() {
        if handled.is_open() && !may_signal(handled.id()) {
            handled.fate = Fate::PermissionDenied;
        }
    }
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
            .map(|index| GpuOutcome::planned(snapshot, index))
            .collect(),
        unreadable: snapshot.unreadable.clone(),
        stale_runs: Vec::new(),
        cgroup_scopes: Vec::new(),
    }
}

/// The deadlines of one `free`, counted from its start. SIGTERM until
/// `grace_end` (--grace); verification until `deadline` (--timeout after the
/// grace); past that only while some GPU's memory is still going down, until
/// `release_limit` (--timeout or 60 s more, whichever is longer).
struct Deadlines {
    start: Instant,
    grace_end: Instant,
    deadline: Instant,
    release_limit: Instant,
}

impl Deadlines {
    fn new(start: Instant, options: &Options) -> Deadlines {
        let grace_end = start + options.grace;
        let deadline = grace_end + options.timeout;
        Deadlines {
            start,
            grace_end,
            deadline,
            release_limit: deadline + options.release,
        }
    }
}

/// How much longer than --timeout verification waits, at least, while a
/// GPU's memory is still going down.
pub(crate) const RELEASE_EXTENSION: Duration = Duration::from_secs(60);
/// The longest pause between two full looks (a /proc scan and the driver)
/// while the driver's figures do not move: stragglers that hold no GPU and
/// holders the driver does not show are found at this pace.
const LONGEST_PAUSE: Duration = Duration::from_secs(1);
/// While nothing moves and no target is left, a full look costs at most
/// this share of the time between two looks (1/40: 2.5% of a core): on a
/// host with 5,000 processes a look's /proc scan takes about 0.2 s of CPU,
/// so looks come every 8 s there, and every second (`LONGEST_PAUSE`) where
/// /proc is small.
const LOOK_SHARE: u32 = 40;

/// CPU time this process has used so far, all threads together.
fn cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Safety: clock_gettime writes the clock's value into `now`, nothing else.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        now.tv_sec.max(0) as u64,
        now.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}
/// After the last signal, how long the final look waits at most for killed
/// targets to leave /proc, so the verdict is not about processes already dying.
const LAST_LOOK_WAIT: Duration = Duration::from_millis(250);

/// One full look at the host: a snapshot, what the scope selects in it,
/// and each GPU in scope's verdict.
struct Look {
    snapshot: Snapshot,
    selection: Selection,
    at: Instant,
    verdicts: BTreeMap<u32, verify::Assessment>,
    /// Signals were sent after the snapshot was taken: it is stale.
    signalled: bool,
}

/// One `free` in progress: the reaper's ledger, the deadlines, and what the
/// looks so far have shown.
struct Freeing<'a> {
    driver: &'a dyn Driver,
    scope: &'a Scope,
    guard: &'a Guard,
    deadlines: Deadlines,
    reaper: Reaper,
    named: BTreeSet<u32>,
    gpus_in_scope: BTreeSet<u32>,
    unreadable: Vec<Unreadable>,
    trends: BTreeMap<u32, Trend>,
    /// Per GPU, memory held by no process before the free started
    /// (what `Snapshot::held_by_no_process` calls held in the first snapshot).
    held_before: BTreeMap<u32, u64>,
    freed_at: BTreeMap<u32, Instant>,
    settled_since: Option<Instant>,
    escalated: bool,
    looks: u32,
    /// CPU time the last full look's snapshot took.
    look_cost: Duration,
}

impl Freeing<'_> {
    /// A full look: adopts holders in scope that appeared (respawned, late
    /// orphans), signals as the phase says, and asks the driver what is left.
    fn look(&mut self, snapshot: Option<Snapshot>) -> Look {
        let snapshot = snapshot.unwrap_or_else(|| {
            let before = cpu_time();
            let snapshot = Snapshot::take_focused(self.driver, &self.named);
            self.look_cost = cpu_time().saturating_sub(before);
            snapshot
        });
        let selection = select(&snapshot, self.scope, self.guard);
        let new = self
            .reaper
            .adopt(&snapshot, self.scope, &selection, self.looks > 0);
        self.looks += 1;
        self.reaper.note_respawns(&snapshot, &new);
        self.gpus_in_scope
            .extend(verify::gpus_touched(&snapshot, &selection));
        for entry in &snapshot.unreadable {
            if !self.unreadable.contains(entry) {
                self.unreadable.push(entry.clone());
            }
        }
        let at = Instant::now();
        let signalled = self.signal(at, &new);
        let verdicts = self.assess(&snapshot, &selection, at);
        Look {
            snapshot,
            selection,
            at,
            verdicts,
            signalled,
        }
    }

    /// The phases: until the grace ends, SIGTERM each new target once; from
    /// then on, every look stops and then kills whatever is still open.
    /// Returns whether anything was signalled.
    fn signal(&mut self, now: Instant, new: &[ProcessId]) -> bool {
        if now < self.deadlines.grace_end {
            for &id in new {
                self.reaper.signal(id, Sig::Term);
            }
            !new.is_empty()
        } else {
            self.escalated = true;
            self.reaper.refresh();
            let open = self.reaper.open_ids();
            self.reaper.stop_and_kill(&open);
            !open.is_empty()
        }
    }

    fn assess(
        &mut self,
        snapshot: &Snapshot,
        selection: &Selection,
        at: Instant,
    ) -> BTreeMap<u32, verify::Assessment> {
        let mut verdicts = BTreeMap::new();
        for &index in &self.gpus_in_scope {
            let assessment = match snapshot.gpu(index) {
                Some(gpu) => {
                    self.trends
                        .entry(index)
                        .or_default()
                        .record(at, gpu.memory_used);
                    verify::assess(
                        gpu,
                        snapshot,
                        selection,
                        &self.reaper,
                        whole_gpu(self.scope, index),
                    )
                }
                None => verify::Assessment {
                    freed: false,
                    checked: false,
                    memory_used: None,
                    explained: None,
                    remaining: Vec::new(),
                    others: Vec::new(),
                },
            };
            if assessment.freed {
                self.freed_at.entry(index).or_insert(at);
            } else {
                self.freed_at.remove(&index);
            }
            verdicts.insert(index, assessment);
        }
        verdicts
    }

    /// Nothing more to wait for: every GPU freed (or, where the driver
    /// cannot say, nothing in scope still has its node open); watched a
    /// little longer where a live parent could respawn what was killed; and
    /// targets that hold no GPU gone, or given a second after that.
    fn settled(&mut self, look: &Look, alive: usize) -> bool {
        // Memory held by no process before the free started does not come
        // back by waiting: once only that is left, what was signalled is released.
        let done = look.verdicts.iter().all(|(index, verdict)| {
            verdict.freed
                || (!verdict.checked && verdict.remaining.is_empty())
                || verdict.only_held_before(self.held_before(*index))
        });
        if !done {
            self.settled_since = None;
            return false;
        }
        let since = *self.settled_since.get_or_insert(look.at);
        let watched = !self.reaper.parent_may_respawn() || look.at.duration_since(since) >= SETTLE;
        let stragglers_done = alive == 0
            || (self.escalated && look.at.duration_since(since) >= Duration::from_secs(1));
        watched && stragglers_done
    }

    fn held_before(&self, index: u32) -> u64 {
        self.held_before.get(&index).copied().unwrap_or(0)
    }

    /// Past the deadline, unless a GPU's memory is still going down; then
    /// until the release limit.
    fn out_of_time(&self, now: Instant) -> bool {
        if now < self.deadlines.deadline {
            return false;
        }
        let releasing = self.gpus_in_scope.iter().any(|index| {
            !self.freed_at.contains_key(index)
                && self
                    .trends
                    .get(index)
                    .is_some_and(|trend| trend.release_rate().is_some())
        });
        !releasing || now >= self.deadlines.release_limit
    }

    /// Waits for the next look: until the driver's figures for the GPUs in
    /// scope move, `pause` passes, the grace ends or the deadline comes.
    /// Returns whether they moved.
    fn pause(&self, look: &Look, pause: Duration) -> bool {
        let now = Instant::now();
        let mut limit = pause.min(self.deadlines.release_limit.saturating_duration_since(now));
        if now < self.deadlines.deadline {
            limit = limit.min(self.deadlines.deadline - now);
        }
        if !self.escalated {
            limit = limit.min(self.deadlines.grace_end.saturating_duration_since(now));
        }
        let last: BTreeMap<u32, Option<u64>> = self
            .gpus_in_scope
            .iter()
            .map(|&index| {
                (
                    index,
                    look.snapshot.gpu(index).and_then(|gpu| gpu.memory_used),
                )
            })
            .collect();
        self.driver
            .wait_for_change(&last, Options::POLL, limit)
            .is_some()
    }

    /// How long to wait on the driver before the next full look, `pause`
    /// at least: once every target has gone and no freed GPU is being
    /// watched, long enough that a full look costs at most a
    /// `LOOK_SHARE`th of the time. The wait ends at once when the driver's
    /// figures move, so this bounds only how often a host where nothing
    /// moves is looked at again.
    fn paced(&self, pause: Duration, alive: usize) -> Duration {
        if alive > 0 || self.settled_since.is_some() {
            return pause;
        }
        pause.max(self.look_cost * LOOK_SHARE)
    }

    /// One look after the last signal, for the verdict: it adopts and
    /// signals nothing, so what it finds in scope unsignalled is named so.
    fn last_look(&mut self) -> Look {
        self.reaper.wait_for_exits(LAST_LOOK_WAIT);
        let snapshot = Snapshot::take_focused(self.driver, &self.named);
        let selection = select(&snapshot, self.scope, self.guard);
        let at = Instant::now();
        let verdicts = self.assess(&snapshot, &selection, at);
        Look {
            snapshot,
            selection,
            at,
            verdicts,
            signalled: false,
        }
    }

    fn outcome(&self, look: &Look, index: u32, memory_before: Option<u64>) -> GpuOutcome {
        let gpu = look.snapshot.gpu(index);
        let memory_after = gpu.and_then(|gpu| gpu.memory_used);
        let respawner_alive = self.reaper.respawns.get(&index).is_some_and(|parents| {
            parents
                .keys()
                .any(|&parent| proc::start_time(parent).is_some())
        });
        let freed_after_ms = self
            .freed_at
            .get(&index)
            .filter(|_| !respawner_alive)
            .map(|at| at.duration_since(self.deadlines.start).as_millis() as u64);
        // The look already assessed every GPU in scope: explain that verdict.
        let reasons = match (gpu, freed_after_ms, look.verdicts.get(&index)) {
            (_, Some(_), _) => Vec::new(),
            (Some(gpu), None, Some(assessment)) => {
                let no_respawns = BTreeMap::new();
                verify::explain(
                    gpu,
                    assessment,
                    &look.snapshot,
                    &look.selection,
                    &self.reaper,
                    &self.trends.get(&index).cloned().unwrap_or_default(),
                    self.reaper.respawns.get(&index).unwrap_or(&no_respawns),
                    self.held_before(index),
                )
            }
            _ => vec![Reason::DriverError {
                message: format!("GPU {index} is not reported by the driver"),
            }],
        };
        let others = match (freed_after_ms, look.verdicts.get(&index)) {
            (None, Some(assessment)) => assessment
                .others
                .iter()
                .map(|&(pid, memory)| OutOfScope {
                    pid,
                    comm: gpu
                        .filter(|gpu| !gpu.users.iter().any(|user| user.pid == pid && user.hidden))
                        .and_then(|_| look.snapshot.processes.get(&pid))
                        .map(|record| record.comm.clone()),
                    memory,
                })
                .collect(),
            _ => Vec::new(),
        };
        GpuOutcome {
            index,
            freed: freed_after_ms.is_some(),
            checked: gpu.is_some_and(|gpu| gpu.driver_answered()),
            memory_before,
            memory_after,
            freed_bytes: match (memory_before, memory_after) {
                (Some(before), Some(after)) => Some(before.saturating_sub(after)),
                _ => None,
            },
            freed_after_ms,
            reasons,
            others,
            advice: Vec::new(),
        }
    }
}

/// Frees the scope: SIGTERM, the grace, SIGSTOP and SIGKILL, re-scans for
/// holders that appear, and verification through the driver; the verdict
/// comes from one last look after the last signal.
pub fn free(
    driver: &dyn Driver,
    scope: &Scope,
    guard: &Guard,
    first: Snapshot,
    options: Options,
    progress: &mut dyn FnMut(&Progress),
) -> FreeReport {
    let start = Instant::now();
    driver.will_wait();
    let memory_before: BTreeMap<u32, Option<u64>> = first
        .gpus
        .iter()
        .map(|gpu| (gpu.index, gpu.memory_used))
        .collect();
    let held_before: BTreeMap<u32, u64> = first
        .gpus
        .iter()
        .map(|gpu| {
            (
                gpu.index,
                first
                    .held_by_no_process(gpu)
                    .filter(|unattributed| unattributed.holds())
                    .map_or(0, |unattributed| unattributed.bytes),
            )
        })
        .collect();
    let mut freeing = Freeing {
        driver,
        scope,
        guard,
        deadlines: Deadlines::new(start, &options),
        reaper: Reaper {
            start: Some(start),
            ..Reaper::default()
        },
        named: scope
            .pids
            .iter()
            .chain(scope.members.iter().flatten())
            .map(|id| id.pid)
            .collect(),
        gpus_in_scope: scope.gpus.clone().unwrap_or_default(),
        unreadable: Vec::new(),
        trends: BTreeMap::new(),
        held_before,
        freed_at: BTreeMap::new(),
        settled_since: None,
        escalated: false,
        looks: 0,
        // The first snapshot was taken before: what this process has used
        // so far is mostly its cost (an upper bound).
        look_cost: cpu_time(),
    };
    let look = freeing.until_done(first, progress);
    freeing.report(look, &memory_before)
}

impl Freeing<'_> {
    /// Looks, signals and verifies until the scope is settled or the time is
    /// out; the look the verdict comes from (one more after the last signal).
    fn until_done(&mut self, first: Snapshot, progress: &mut dyn FnMut(&Progress)) -> Look {
        let start = self.deadlines.start;
        let mut next = Some(first);
        let mut pause = Options::POLL;
        let look = loop {
            let look = self.look(next.take());
            let alive = self.reaper.refresh();
            let shown: Vec<(u32, Option<u64>, bool)> = look
                .verdicts
                .iter()
                .map(|(&index, verdict)| (index, verdict.memory_used, verdict.freed))
                .collect();
            tracing::debug!(
                look = self.looks,
                elapsed_ms = start.elapsed().as_secs_f64() * 1e3,
                alive,
                gpus = ?shown,
                "free look"
            );
            progress(&Progress {
                phase: if self.escalated {
                    "verifying"
                } else {
                    "waiting for SIGTERM"
                },
                elapsed: start.elapsed(),
                alive,
                gpus: &shown,
            });
            if self.settled(&look, alive) || self.out_of_time(look.at) {
                break look;
            }
            // The driver's figures are cheap to poll; a full look is not. Look
            // again as soon as they move, else back off.
            pause = if self.pause(&look, self.paced(pause, alive)) {
                Options::POLL
            } else {
                (pause * 2).min(LONGEST_PAUSE)
            };
        };
        if look.signalled {
            self.last_look()
        } else {
            look
        }
    }

    /// The report of this free, from the look its verdict comes from.
    fn report(mut self, look: Look, memory_before: &BTreeMap<u32, Option<u64>>) -> FreeReport {
        let gpus = self
            .gpus_in_scope
            .iter()
            .map(|&index| self.outcome(&look, index, memory_before.get(&index).copied().flatten()))
            .collect();
        self.reaper.refresh();
        FreeReport {
            backend: look.snapshot.backend.clone(),
            dry_run: false,
            elapsed_ms: self.deadlines.start.elapsed().as_millis() as u64,
            targets: self.reaper.handled.into_values().collect(),
            spared: self.reaper.spared.into_values().collect(),
            gpus,
            unreadable: self.unreadable,
            stale_runs: Vec::new(),
            cgroup_scopes: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory unseen from a PID namespace of its own cannot be told held or
    /// not: alone, it makes the free "could not tell" (3); beside a survivor
    /// or driver-held memory on another GPU, the free is still held (1).
    #[test]
    fn a_free_left_only_with_unseen_memory_could_not_tell() {
        let gpu = |index: u32, reasons: Vec<Reason>| GpuOutcome {
            index,
            freed: reasons.is_empty(),
            checked: true,
            memory_before: None,
            memory_after: None,
            freed_bytes: None,
            freed_after_ms: None,
            reasons,
            others: Vec::new(),
            advice: Vec::new(),
        };
        let report = |gpus: Vec<GpuOutcome>| FreeReport {
            backend: "test".into(),
            dry_run: false,
            elapsed_ms: 0,
            targets: Vec::new(),
            spared: Vec::new(),
            gpus,
            unreadable: Vec::new(),
            stale_runs: Vec::new(),
            cgroup_scopes: Vec::new(),
        };
        let unseen = || Reason::Unseen { bytes: 1 << 30 };
        let held = Reason::DriverHeld {
            bytes: 1 << 30,
            before: None,
        };
        assert_eq!(
            report(vec![gpu(0, vec![]), gpu(1, vec![unseen()])]).exit(),
            Exit::Incomplete
        );
        assert_eq!(
            report(vec![gpu(0, vec![held.clone()]), gpu(1, vec![unseen()])]).exit(),
            Exit::StillHeld
        );
        assert_eq!(
            report(vec![gpu(0, vec![unseen(), held])]).exit(),
            Exit::StillHeld
        );
        assert_eq!(report(vec![gpu(0, vec![])]).exit(), Exit::Success);
    }

    /// One formula: a command's free may take its grace, its timeout and
    /// the release extension (what the fleet's per-host limit is made of),
    /// and a free fitted to a budget (the Slurm epilog's) never takes longer
    /// than the budget, whatever the grace asked for.
    #[test]
    fn the_longest_a_free_takes_is_one_formula_and_a_budget_bounds_it() {
        let s = Duration::from_secs;
        assert_eq!(Options::new(s(10), s(30)).longest(), s(10 + 30 + 60));
        assert_eq!(Options::new(s(1), s(90)).longest(), s(1 + 90 + 90));
        for budget in [0, 1, 3, 7, 22, 60, 600].map(s) {
            for grace in [0, 1, 10, 1000].map(s) {
                let options = Options::within(grace, s(5), budget);
                assert!(options.longest() <= budget, "{options:?} in {budget:?}");
                assert!(options.grace() <= grace && options.timeout() <= s(5));
            }
        }
        // The deadlines a free keeps are the options' own.
        let start = Instant::now();
        let options = Options::within(s(10), s(5), s(22));
        let deadlines = Deadlines::new(start, &options);
        assert_eq!(deadlines.release_limit - start, options.longest());
    }
}
