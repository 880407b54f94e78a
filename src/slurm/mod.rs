//! The Slurm front end: the programs a site names in slurm.conf.
//!
//! `epilog` frees what an ended job left on its GPUs (the job's processes,
//! by `SLURM_JOB_ID` in their environment or, naming no job, by uid, and
//! their descendants; never a process that names another job)
//! with `reap::free`, and drains the node when a GPU stays held; `prolog`
//! refuses a job GPUs that are not clean; `healthcheck` drains a node whose
//! memory no running job explains and resumes one gpureap drained once it is
//! clean again. Slurm acts on the exit code (non-zero drains the node) and
//! the drain reason is the operator's only message, so every reason starts
//! with `gpureap:` and says what and where on one line. docs/slurm.md.

pub mod audit;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use crate::driver::evidence::{self, Hardware};
use crate::driver::{self, BackendChoice, Driver};
use crate::exit::Exit;
use crate::proc::{self, ProcessRecord};
use crate::reap::{self, Fate, Options};
use crate::reset;
use crate::select::{Guard, JobScope, Scope};
use crate::signal::Sig;
use crate::snapshot::Snapshot;
use crate::units::{Bytes, Elapsed, Field};
use crate::units::{GpuRef, parse_gpu_refs};
use crate::verify::{self, Holding, Reason};

use crate::scontrol::{self, JobInfo, Scontrol};
use audit::Audit;

/// Every drain reason gpureap sets starts with this; `healthcheck` resumes
/// only a node drained with such a reason.
pub const REASON_PREFIX: &str = "gpureap:";

/// How long the epilog's free verifies after the grace, unless memory is
/// still going down: the driver gives memory back within a second of the
/// last holder's exit (measured: 206 ms for 100 GiB on an H200).
const VERIFY: Duration = Duration::from_secs(5);

/// Job states in which a job's processes may hold its GPUs.
const LIVE_JOB_STATES: [&str; 6] = [
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "CONFIGURING",
    "STAGE_OUT",
    "SIGNALING",
];

/// Where a hook's outcome goes: to `main`, which ends the command with the
/// first one it gets, the hook's own or its deadline's (`Context::bound`).
type Outcome = mpsc::Sender<Ended>;

/// How a hook ended: by itself (or by panicking), or by its deadline.
enum Ended {
    Hook(std::thread::Result<Exit>),
    Deadline(Exit),
}

/// Runs the hook on its own thread and returns the outcome that comes
/// first: the hook's exit code, or its deadline's when the hook is still
/// running then (hung in a D-state /proc read, a driver call, scontrol).
/// No thread ends the process: the exit is `main`'s, through the table.
pub fn main(backend: &BackendChoice, command: &Hook) -> Exit {
    let (outcome, first) = mpsc::channel();
    let hook = {
        let (backend, command, outcome) = (backend.clone(), command.clone(), outcome.clone());
        move || {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run(&backend, &command, &outcome)
            }));
            let _ = outcome.send(Ended::Hook(code));
        }
    };
    if let Err(error) = std::thread::Builder::new()
        .name("hook".to_string())
        .spawn(hook)
    {
        eprintln!("gpureap: cannot start the hook's thread ({error}); running without --timeout");
        return run(backend, command, &outcome);
    }
    drop(outcome);
    loop {
        match first.recv() {
            // Done just as the deadline passed: its drain and exit code count.
            Ok(Ended::Hook(_)) if scontrol::deadline_passed() => continue,
            Ok(Ended::Hook(Ok(code)) | Ended::Deadline(code)) => return code,
            Ok(Ended::Hook(Err(panic))) => std::panic::resume_unwind(panic),
            // Every sender is gone without a word: cannot happen while the
            // hook's thread holds one until it has sent.
            Err(_) => return Exit::Incomplete,
        }
    }
}

fn run(backend: &BackendChoice, command: &Hook, outcome: &Outcome) -> Exit {
    match command {
        Hook::Epilog(args) => epilog(backend, args, outcome),
        Hook::Prolog(args) => prolog(backend, args, outcome),
        Hook::Healthcheck(args) => healthcheck(backend, args, outcome),
    }
}

/// The Slurm hook to run and its flags, typed by config.
#[derive(Debug, Clone)]
pub enum Hook {
    Epilog(EpilogConfig),
    Prolog(PrologConfig),
    Healthcheck(HealthcheckConfig),
}

/// The flags every Slurm hook takes.
#[derive(Debug, Clone)]
pub struct CommonConfig {
    /// scontrol to drain and resume with; `None` for the first of the usual places, then PATH.
    pub scontrol: Option<PathBuf>,
    /// Also append every decision as a JSON line to this file.
    pub log: Option<PathBuf>,
    /// Report what would be done; signal, reset, drain and resume nothing.
    pub dry_run: bool,
    /// Give up after this long in all: drain the node with a reason and exit 1.
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct EpilogConfig {
    pub common: CommonConfig,
    /// How long the job's leftovers get after SIGTERM before SIGSTOP+SIGKILL.
    pub grace: Duration,
    /// Reset a GPU whose only holder is driver-held memory, instead of draining.
    pub reset: bool,
}

#[derive(Debug, Clone)]
pub struct PrologConfig {
    pub common: CommonConfig,
    /// How long to wait for a release in progress before refusing the GPUs.
    pub wait: Duration,
}

#[derive(Debug, Clone)]
pub struct HealthcheckConfig {
    pub common: CommonConfig,
    /// The node to drain or resume; `None` for $SLURMD_NODENAME, else the short host name.
    pub node: Option<String>,
    /// Reset a GPU whose only holder is driver-held memory, instead of draining.
    pub reset: bool,
    /// The Xids that drain the node once the kernel logged one for a GPU.
    pub drain_xids: BTreeSet<u32>,
}

/// The job slurmd describes in the prolog's and epilog's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: u64,
    pub uid: Option<u32>,
    /// The job's GPUs on this node, as slurmd numbers them (host indexes).
    pub gpus: Vec<GpuRef>,
    pub node: Option<String>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|value| value.trim().to_string())
        .filter(|value| !value.is_empty())
}

impl Job {
    /// Reads the job from slurmd's variables; an error says which is wrong.
    pub fn from_env() -> Result<Job, String> {
        let id = env("SLURM_JOB_ID").ok_or(
            "SLURM_JOB_ID is not set: run this from slurm.conf's Prolog= or Epilog=, \
             or set SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_GPUS and SLURMD_NODENAME to try it",
        )?;
        let id = id
            .parse::<u64>()
            .map_err(|_| format!("SLURM_JOB_ID='{id}' is not a job number"))?;
        let uid = env("SLURM_JOB_UID")
            .map(|uid| {
                uid.parse::<u32>()
                    .map_err(|_| format!("SLURM_JOB_UID='{uid}' is not a uid"))
            })
            .transpose()?;
        let (variable, list) = match env("SLURM_JOB_GPUS") {
            Some(list) => ("SLURM_JOB_GPUS", Some(list)),
            None => ("CUDA_VISIBLE_DEVICES", env("CUDA_VISIBLE_DEVICES")),
        };
        let gpus = match list {
            Some(list) => parse_gpu_refs(&list).map_err(|error| format!("{variable}: {error}"))?,
            None => Vec::new(),
        };
        Ok(Job {
            id,
            uid,
            gpus,
            node: env("SLURMD_NODENAME"),
        })
    }
}

/// What one command needs to drain, resume and log, however it ends.
struct Context {
    audit: Arc<Audit>,
    node: Option<String>,
    scontrol: Option<PathBuf>,
    dry_run: bool,
}

impl Context {
    fn new(
        command: &'static str,
        common: &CommonConfig,
        job: Option<u64>,
        node: Option<String>,
    ) -> Context {
        Context {
            audit: Arc::new(Audit::new(
                command,
                common.log.as_deref(),
                job,
                node.clone(),
            )),
            node,
            scontrol: common.scontrol.clone(),
            dry_run: common.dry_run,
        }
    }

    fn say(&self, action: &str, gpu: Option<u32>, pid: Option<u32>, message: &str) {
        self.audit.say(action, gpu, pid, message);
    }

    fn scontrol(&self) -> Result<Scontrol, String> {
        Scontrol::find(self.scontrol.as_deref())
    }

    /// Drains the node with `gpureap: <reason>`; whether Slurm took it.
    /// The GPU driver; one that cannot be opened is said, drained on, and
    /// "could not complete".
    fn open_driver(&self, backend: &BackendChoice) -> Result<Box<dyn Driver>, Exit> {
        driver::open(backend).map_err(|error| {
            self.say(
                "error",
                None,
                None,
                &format!("cannot open the GPU driver: {error}"),
            );
            self.drain(&format!("cannot check the GPUs: {error}"));
            Exit::Incomplete
        })
    }

    fn drain(&self, reason: &str) -> bool {
        let reason = format!("{REASON_PREFIX} {reason}");
        let Some(node) = &self.node else {
            self.say(
                "error",
                None,
                None,
                &format!(
                    "cannot drain: SLURMD_NODENAME is not set; would drain with reason \"{reason}\""
                ),
            );
            return false;
        };
        if self.dry_run {
            self.say(
                "drain",
                None,
                None,
                &format!("--dry-run: would drain {node}: {reason}"),
            );
            return true;
        }
        match self
            .scontrol()
            .and_then(|scontrol| scontrol.drain(node, &reason))
        {
            Ok(()) => {
                self.say("drain", None, None, &format!("drained {node}: {reason}"));
                true
            }
            Err(error) => {
                self.say(
                    "error",
                    None,
                    None,
                    &format!("cannot drain {node} (\"{reason}\"): {error}"),
                );
                false
            }
        }
    }

    /// Ends the command, draining the node, if it is still running after
    /// `limit`: an epilog must end well inside Slurm's own timeout, whatever
    /// hangs (a D-state /proc read, a driver call, scontrol). The outcome
    /// goes to `main` (`outcome`), which ends the command with it.
    fn bound(&self, command: &'static str, limit: Duration, outcome: &Outcome) {
        let context = Context {
            audit: Arc::clone(&self.audit),
            node: self.node.clone(),
            scontrol: self.scontrol.clone(),
            dry_run: self.dry_run,
        };
        let outcome = outcome.clone();
        let spawned = std::thread::Builder::new()
            .name("deadline".to_string())
            .spawn(move || {
                std::thread::sleep(limit);
                // A hung scontrol (and whatever it forked) ends here, and no
                // new one starts but this thread's drain.
                scontrol::end_calls();
                context.say(
                    "error",
                    None,
                    None,
                    &format!("did not finish within {}", Elapsed(limit)),
                );
                context.drain(&format!(
                    "{command} did not finish within {} (see slurmd's log)",
                    Elapsed(limit)
                ));
                let _ = outcome.send(Ended::Deadline(Exit::StillHeld));
            });
        if let Err(error) = spawned {
            self.say(
                "error",
                None,
                None,
                &format!("cannot start the deadline thread ({error}); running without --timeout"),
            );
        }
    }
}

/// Opens the driver and resolves the job's GPUs to its indexes.
fn job_gpus(
    context: &Context,
    backend: &BackendChoice,
    job: &Job,
) -> Result<(Box<dyn Driver>, BTreeSet<u32>), Exit> {
    let driver = context.open_driver(backend)?;
    // MIG instances (`MIG-<uuid>`) are judged on their own: the hooks see
    // the GPU through the job's instances (docs/mig.md).
    let resolved = match driver::mig::resolve(driver.as_ref(), &job.gpus) {
        Ok(resolved) => resolved,
        Err(error) => {
            let count = driver.gpu_count().unwrap_or(0);
            let reason = format!(
                "job {}'s {error} ({} reports {count} GPUs); check gres.conf",
                job.id,
                driver.describe()
            );
            context.say("error", None, None, &reason);
            context.drain(&reason);
            return Err(Exit::Incomplete);
        }
    };
    let gpus = resolved.indexes();
    let driver = driver::mig::InstanceView::wrap(driver, resolved.instances);
    Ok((driver, gpus))
}

/// What keeps a GPU from being clean: the verifier's value (`verify::holding`),
/// and what a reset under `--reset` made of it. The log line and the drain
/// reason are rendered from these values (`text`).
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub gpu: u32,
    pub holding: Holding,
    /// A reset was tried and did not leave the GPU clean.
    pub reset: Option<ResetFailed>,
}

/// How a reset under `--reset` failed to clean a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetFailed {
    InUse,
    StillHeld,
    Failed,
}

impl ResetFailed {
    fn of(outcome: &reset::Reset) -> ResetFailed {
        match outcome {
            reset::Reset::InUse { .. } => ResetFailed::InUse,
            reset::Reset::StillHeld { .. } => ResetFailed::StillHeld,
            _ => ResetFailed::Failed,
        }
    }

    fn word(self) -> &'static str {
        match self {
            ResetFailed::InUse => "refused, in use",
            ResetFailed::StillHeld => "still held after",
            ResetFailed::Failed => "failed",
        }
    }
}

impl Finding {
    pub fn pid(&self) -> Option<u32> {
        self.holding.pid()
    }

    /// Only driver-held memory: a reset may clear it.
    pub fn driver_held(&self) -> bool {
        self.holding.driver_held()
    }

    /// One line, for the log and the drain reason (`GPU 1: ...`).
    pub fn text(&self) -> String {
        let index = self.gpu;
        let holds = |memory: &Option<u64>| {
            memory
                .map(|bytes| format!(" holds {}", Bytes(bytes)))
                .unwrap_or_else(|| " holds memory".to_string())
        };
        let text = match &self.holding {
            Holding::NotReported => format!("GPU {index}: not reported by the driver"),
            Holding::Reason(Reason::DriverError { message }) => {
                format!("GPU {index}: driver error: {}", Field(message))
            }
            Holding::Reason(Reason::Hidden { pid, memory }) => format!(
                "GPU {index}: pid {pid} in another PID namespace{}",
                holds(memory)
            ),
            Holding::Reason(Reason::DriverHeld { bytes, .. }) => format!(
                "GPU {index}: {} held by no process (driver-held)",
                Bytes(*bytes)
            ),
            Holding::Reason(reason) => format!("GPU {index}: {reason}"),
            Holding::Xid { xid, at } => format!(
                "GPU {index}: Xid {xid}{} ({})",
                at.map(|at| format!(" at {}", evidence::clock(at)))
                    .unwrap_or_default(),
                evidence::meaning(*xid).unwrap_or("not in gpureap's list")
            ),
            Holding::Process {
                pid,
                comm,
                user,
                state,
                memory,
                why,
            } => format!(
                "GPU {index}: pid {pid} ({}, {}, state {}){}: {why}",
                Field(comm),
                user.as_deref().unwrap_or("unknown user"),
                state.letter(),
                holds(memory)
            ),
        };
        match self.reset {
            Some(failed) => format!("{text} (reset: {})", failed.word()),
            None => text,
        }
    }
}

/// Why the GPUs in `gpus` are not clean, as the verifier names it.
/// `unexpected` says what is wrong with a process the driver lists on a
/// GPU, or `None` when it may stay.
fn findings(
    snapshot: &Snapshot,
    gpus: &BTreeSet<u32>,
    unexpected: &mut dyn FnMut(u32, &ProcessRecord) -> Option<String>,
) -> Vec<Finding> {
    gpus.iter()
        .flat_map(|&gpu| {
            verify::holding(snapshot, gpu, unexpected)
                .into_iter()
                .map(move |holding| Finding {
                    gpu,
                    holding,
                    reset: None,
                })
        })
        .collect()
}

/// With `--reset`: resets each GPU whose only finding is driver-held memory,
/// and drops the findings of those that came back clean.
fn reset_driver_held(context: &Context, driver: &dyn Driver, found: Vec<Finding>) -> Vec<Finding> {
    let mut by_gpu: BTreeMap<u32, Vec<Finding>> = BTreeMap::new();
    for finding in found {
        by_gpu.entry(finding.gpu).or_default().push(finding);
    }
    let mut left = Vec::new();
    for (index, gpu_findings) in by_gpu {
        if !gpu_findings.iter().all(Finding::driver_held) {
            left.extend(gpu_findings);
            continue;
        }
        if context.dry_run {
            context.say(
                "reset",
                Some(index),
                None,
                &format!("--dry-run: would reset GPU {index}"),
            );
            left.extend(gpu_findings);
            continue;
        }
        let outcome = reset::reset(driver, index);
        context.say("reset", Some(index), None, &outcome.to_string());
        if !outcome.clean() {
            let failed = ResetFailed::of(&outcome);
            left.extend(gpu_findings.into_iter().map(|finding| Finding {
                reset: Some(failed),
                ..finding
            }));
        }
    }
    left
}

/// Drains with every finding in the reason, logging each; exit 1.
fn drain_for(context: &Context, found: &[Finding]) -> Exit {
    let texts: Vec<String> = found.iter().map(Finding::text).collect();
    for (finding, text) in found.iter().zip(&texts) {
        context.say("held", Some(finding.gpu), finding.pid(), text);
    }
    let reason: Vec<&str> = texts.iter().map(String::as_str).collect();
    context.drain(&reason.join("; "));
    Exit::StillHeld
}

fn list(gpus: &BTreeSet<u32>) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The job of a process, from `SLURM_JOB_ID` in its environment. A value
/// that is not a job number names no job: the process is then judged by
/// its uid, so such a value hides it from no epilog.
fn job_of(pid: u32) -> Option<u64> {
    proc::env_value(pid, "SLURM_JOB_ID").and_then(|id| id.trim().parse().ok())
}

/// Whether Slurm shows `job` live on `node`, run by `uid`, and given `gpu`
/// there where it says which GPUs the job has: `None` if so, else why a
/// process that names the job may not hold that GPU.
fn not_running_here(
    info: Option<&JobInfo>,
    job: u64,
    node: &str,
    uid: Option<u32>,
    gpu: u32,
) -> Option<String> {
    let Some(info) = info else {
        return Some(format!("job {job}'s, which Slurm no longer knows"));
    };
    if let Some(why) = &info.unreadable {
        return Some(format!(
            "names job {job}, whose description by Slurm gpureap cannot read ({why})"
        ));
    }
    if !LIVE_JOB_STATES
        .iter()
        .any(|live| info.state.starts_with(live))
    {
        return Some(format!("job {job}'s, which is {}", info.state));
    }
    let shown =
        |uid: Option<u32>| uid.map_or("an unknown uid".to_string(), |uid| format!("uid {uid}"));
    if info.uid.is_none() || info.uid != uid {
        return Some(format!(
            "names job {job}, which Slurm runs as {}, not as this process's {}",
            shown(info.uid),
            shown(uid)
        ));
    }
    match info.on_node(node) {
        None => Some(format!("names job {job}, which does not run on {node}")),
        Some(Some(gpus)) if !gpus.contains(&gpu) => Some(format!(
            "names job {job}, which Slurm gave GPU {} on {node}, not GPU {gpu}",
            if gpus.is_empty() {
                "none".to_string()
            } else {
                list(gpus)
            }
        )),
        Some(_) => None,
    }
}

/// What Slurm says of each job asked about, asked once a job.
#[derive(Default)]
struct SlurmJobs {
    asked: BTreeMap<u64, Result<Option<JobInfo>, String>>,
}

impl SlurmJobs {
    fn get(
        &mut self,
        scontrol: Result<&Scontrol, &String>,
        job: u64,
    ) -> Result<Option<&JobInfo>, &str> {
        self.asked
            .entry(job)
            .or_insert_with(|| match scontrol {
                Ok(scontrol) => scontrol.job(job),
                Err(error) => Err(error.clone()),
            })
            .as_ref()
            .map(Option::as_ref)
            .map_err(String::as_str)
    }

    /// Logs each job Slurm could not be asked about.
    fn log_errors(&self, context: &Context, judged: &str) {
        for (job, answer) in &self.asked {
            if let Err(error) = answer {
                context.say(
                    "error",
                    None,
                    None,
                    &format!(
                        "cannot ask Slurm about job {job}, so its processes are {judged}: {error}"
                    ),
                );
            }
        }
    }
}

/// A job program (epilog, prolog) once started: its context, bounded in
/// time, the job from the environment, the driver and the job's GPUs.
struct Started {
    context: Context,
    job: Job,
    driver: Box<dyn Driver>,
    gpus: BTreeSet<u32>,
}

/// Starts a job program: reads the job, ends at once (exit 0) for a job
/// without GPUs, bounds the rest by `--timeout`, opens the driver and
/// resolves the job's GPUs. `Err` is the exit code to end with.
///
/// A job variable gpureap cannot read is bad usage by hand (exit 2). Run by
/// slurmd (`SLURMD_NODENAME` set), it drains the node with a `gpureap:`
/// reason naming the variable, and exits 3: Slurm's own "Epilog error"
/// drain is one the health check may never lift, this one it lifts once
/// the node's GPUs are clean.
fn start(
    command: &'static str,
    common: &CommonConfig,
    backend: &BackendChoice,
    outcome: &Outcome,
) -> Result<Started, Exit> {
    if let Err(error) = check_flags(common) {
        Context::new(command, common, None, None).say("error", None, None, &error);
        return Err(Exit::Usage);
    }
    let job = match Job::from_env() {
        Ok(job) => job,
        Err(error) => {
            let node = env("SLURMD_NODENAME");
            let id = env("SLURM_JOB_ID").and_then(|id| id.parse().ok());
            let context = Context::new(command, common, id, node.clone());
            context.say("error", None, None, &error);
            if node.is_none() {
                return Err(Exit::Usage);
            }
            context.bound(command, common.timeout, outcome);
            context.drain(&format!("{error}; {command} checked no GPU"));
            return Err(Exit::Incomplete);
        }
    };
    let context = Context::new(command, common, Some(job.id), job.node.clone());
    if job.gpus.is_empty() {
        context.say("skip", None, None, "no GPUs on this node; nothing to check");
        return Err(Exit::Success);
    }
    context.bound(command, common.timeout, outcome);
    let (driver, gpus) = job_gpus(&context, backend, &job)?;
    Ok(Started {
        context,
        job,
        driver,
        gpus,
    })
}

/// The flags' own mistakes, before anything is looked at: a `--timeout`
/// under a second would end the command before it looked, and a
/// `--scontrol` that cannot run would only show when a drain is needed.
fn check_flags(common: &CommonConfig) -> Result<(), String> {
    if let Some(path) = &common.scontrol {
        Scontrol::find(Some(path))?;
    }
    if common.timeout < Duration::from_secs(1) {
        return Err(format!(
            "--timeout {} is too short to check a GPU: give 1s or more (default 30s)",
            Elapsed(common.timeout)
        ));
    }
    Ok(())
}

fn epilog(backend: &BackendChoice, args: &EpilogConfig, outcome: &Outcome) -> Exit {
    let started = Instant::now();
    let Started {
        context,
        job,
        driver,
        gpus,
    } = match start("epilog", &args.common, backend, outcome) {
        Ok(started) => started,
        Err(code) => return code,
    };
    let snapshot = Snapshot::take(driver.as_ref());
    let job_scope = job_scope(&snapshot, &gpus, &job);
    let scope = Scope {
        gpus: Some(gpus.clone()),
        job: Some(job_scope.clone()),
        ..Scope::default()
    };
    let guard = Guard::for_this_process(&[]);
    let plan = reap::plan(&snapshot, &scope, &guard);
    for spared in &plan.spared {
        context.say(
            "spare",
            None,
            Some(spared.pid),
            &format!(
                "pid {} ({}) left alone: {}",
                spared.pid, spared.comm, spared.reason
            ),
        );
    }
    // A dry run signals nothing: what it would free is not held against the GPUs.
    let would_free: BTreeSet<u32> = if context.dry_run {
        plan.targets.iter().map(|target| target.pid).collect()
    } else {
        BTreeSet::new()
    };
    let after = if plan.targets.is_empty() {
        snapshot
    } else if context.dry_run {
        for target in &plan.targets {
            context.say(
                "signal",
                None,
                Some(target.pid),
                &format!(
                    "--dry-run: would free pid {} ({}) on GPU {}",
                    target.pid,
                    target.comm,
                    list(&target.gpus)
                ),
            );
        }
        snapshot
    } else {
        let outcome = reap::free(
            driver.as_ref(),
            &free_scope(&plan, &gpus, &scope),
            &guard,
            snapshot,
            free_options(args, started),
            &mut |_| {},
        );
        say_freed(&context, &outcome, job.id);
        Snapshot::take(driver.as_ref())
    };
    let mut found = epilog_findings(&context, &after, &gpus, &job, &job_scope, &would_free);
    if args.reset {
        found = reset_driver_held(&context, driver.as_ref(), found);
    }
    if !found.is_empty() {
        return drain_for(&context, &found);
    }
    context.say(
        "clean",
        None,
        None,
        &format!(
            "{}GPU {} clean after {}",
            if context.dry_run { "--dry-run: " } else { "" },
            list(&gpus),
            Elapsed(started.elapsed())
        ),
    );
    Exit::Success
}

/// The job's processes and other jobs' among those the driver lists on
/// the job's GPUs and their descendants (what may be signalled), by the job
/// each names in its environment.
fn job_scope(snapshot: &Snapshot, gpus: &BTreeSet<u32>, job: &Job) -> JobScope {
    let tree = snapshot.tree();
    let listed: BTreeSet<u32> = gpus
        .iter()
        .filter_map(|&index| snapshot.gpu(index))
        .flat_map(|gpu| gpu.users.iter().filter(|user| user.listed && !user.hidden))
        .map(|user| user.pid)
        .collect();
    let mut members = BTreeSet::new();
    let mut others = BTreeSet::new();
    for pid in listed
        .iter()
        .flat_map(|&pid| std::iter::once(pid).chain(tree.descendants(pid)))
    {
        let Some(record) = snapshot.processes.get(&pid) else {
            continue;
        };
        match job_of(pid) {
            Some(named) if named == job.id => members.insert(record.id),
            Some(_) => others.insert(record.id),
            None => false,
        };
    }
    JobScope {
        // Root also owns the host's daemons: a root job's processes are known
        // by their environment only.
        uid: job.uid.filter(|&uid| uid != 0),
        members,
        others,
        owner: job.uid,
    }
}

/// How long the epilog's free may take: three quarters of the budget left
/// for freeing; the rest for the last look, a reset and the drain.
/// Verification waits past VERIFY only while memory is still going down,
/// and never past those three quarters: driver-held memory never comes
/// back, and is judged after.
fn free_options(args: &EpilogConfig, started: Instant) -> Options {
    let budget = (args.common.timeout * 3 / 4).saturating_sub(started.elapsed());
    Options::within(args.grace, VERIFY, budget)
}

/// What the epilog's free verifies: the GPUs the leftovers use; all the
/// job's when they use none (a GPU the job left only driver-held memory on
/// has nothing to wait for).
fn free_scope(plan: &reap::FreeReport, gpus: &BTreeSet<u32>, scope: &Scope) -> Scope {
    let touched: BTreeSet<u32> = plan
        .targets
        .iter()
        .flat_map(|target| target.gpus.iter().copied())
        .filter(|index| gpus.contains(index))
        .collect();
    Scope {
        gpus: Some(if touched.is_empty() {
            gpus.clone()
        } else {
            touched
        }),
        ..scope.clone()
    }
}

/// Says, for each process the epilog's free took, what it was sent and how it ended.
fn say_freed(context: &Context, outcome: &reap::FreeReport, job: u64) {
    for target in &outcome.targets {
        let signals: Vec<&str> = target.sent().map(Sig::name).collect();
        let fate = match (target.fate, target.exited_after_ms) {
            (Fate::Exited, Some(ms)) => format!("exited after {ms} ms"),
            (Fate::Exited, None) | (Fate::Zombie, _) => "exited".to_string(),
            (Fate::PermissionDenied, _) => "permission denied".to_string(),
            (Fate::Alive, _) => "still alive".to_string(),
        };
        context.say(
            "signal",
            target.gpus.first().copied(),
            Some(target.pid),
            &format!(
                "pid {} ({}) of job {}{}: {}; {fate}",
                target.pid,
                target.comm,
                job,
                if target.gpus.is_empty() {
                    String::new()
                } else {
                    format!(" on GPU {}", list(&target.gpus))
                },
                if signals.is_empty() {
                    "not signalled".to_string()
                } else {
                    signals.join(", ")
                }
            ),
        );
    }
}

/// What stays on the job's GPUs after the free: the verifier's reasons,
/// and each process that is not the job's judged by what Slurm says of
/// its own job.
fn epilog_findings(
    context: &Context,
    after: &Snapshot,
    gpus: &BTreeSet<u32>,
    job: &Job,
    job_scope: &JobScope,
    would_free: &BTreeSet<u32>,
) -> Vec<Finding> {
    // Another job's process is never signalled here. It may stay when Slurm
    // shows that job running on this node, under the process's uid, and on
    // that GPU where Slurm says: GPUs may be shared.
    let scontrol = context.scontrol();
    let mut slurm_jobs = SlurmJobs::default();
    let found = findings(after, gpus, &mut |gpu, record| {
        let pid = record.id.pid;
        if would_free.contains(&pid) {
            return None;
        }
        let named = job_of(pid);
        if job_scope.admits(record) || named == Some(job.id) {
            return Some(format!("job {}'s, not freed", job.id));
        }
        let Some(other) = named else {
            return Some(format!("not job {}'s, left alone", job.id));
        };
        let Some(node) = &job.node else {
            return Some(format!(
                "job {other}'s, on a GPU allocated to job {}",
                job.id
            ));
        };
        match slurm_jobs.get(scontrol.as_ref(), other) {
            Ok(info) => match not_running_here(info, other, node, record.uid, gpu) {
                None => {
                    context.say(
                        "leave",
                        Some(gpu),
                        Some(pid),
                        &format!(
                            "pid {pid} ({}) of job {other}, which runs here: left alone",
                            record.comm
                        ),
                    );
                    None
                }
                Some(why) => Some(format!("{why}, on a GPU allocated to job {}", job.id)),
            },
            Err(_) => Some(format!(
                "job {other}'s, on a GPU allocated to job {} (Slurm could not say more)",
                job.id
            )),
        }
    });
    slurm_jobs.log_errors(context, "reported");
    found
}

fn prolog(backend: &BackendChoice, args: &PrologConfig, outcome: &Outcome) -> Exit {
    let started = Instant::now();
    let Started {
        context,
        job,
        driver,
        gpus,
    } = match start("prolog", &args.common, backend, outcome) {
        Ok(started) => started,
        Err(code) => return code,
    };
    let wait_until = started + args.wait;
    driver.will_wait();
    loop {
        let snapshot = Snapshot::take(driver.as_ref());
        let found = findings(&snapshot, &gpus, &mut |_, record| {
            Some(match job_of(record.id.pid) {
                Some(other) if other == job.id => format!("job {}'s, before it started", job.id),
                Some(other) => format!("job {other}'s"),
                None => "no job's".to_string(),
            })
        });
        if found.is_empty() {
            context.say(
                "clean",
                None,
                None,
                &format!(
                    "GPU {} clean after {}",
                    list(&gpus),
                    Elapsed(started.elapsed())
                ),
            );
            return Exit::Success;
        }
        let now = Instant::now();
        if now >= wait_until {
            return drain_for(&context, &found);
        }
        // A release in progress: look again as soon as the memory moves.
        let last = gpus
            .iter()
            .map(|&index| (index, snapshot.gpu(index).and_then(|gpu| gpu.memory_used)))
            .collect();
        driver.wait_for_change(
            &last,
            Duration::from_millis(5),
            (wait_until - now).min(Duration::from_millis(250)),
        );
    }
}

/// The node a health check is about: `--node`, `SLURMD_NODENAME`, else the
/// host's short name (what slurmd uses by default).
fn node_name(given: Option<&str>) -> Option<String> {
    given
        .map(str::to_string)
        .or_else(|| env("SLURMD_NODENAME"))
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .and_then(|name| name.trim().split('.').next().map(str::to_string))
                .filter(|name| !name.is_empty())
        })
}

fn healthcheck(backend: &BackendChoice, args: &HealthcheckConfig, outcome: &Outcome) -> Exit {
    let started = Instant::now();
    let (context, node, scontrol, driver) = match open_healthcheck(backend, args, outcome) {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    let gpus: BTreeSet<u32> = (0..driver.gpu_count().unwrap_or(0)).collect();
    let snapshot = Snapshot::take(driver.as_ref());
    let mut found = healthcheck_findings(&context, &snapshot, &gpus, &scontrol, &node);
    if args.reset {
        found = reset_driver_held(&context, driver.as_ref(), found);
    }
    let hardware = Hardware::gather(driver.as_ref(), &gpus, args.drain_xids.clone());
    found.extend(xid_findings(&context, &hardware, &gpus));
    // What the evidence says of each GPU found held, lost or with an Xid.
    let named: BTreeSet<u32> = found.iter().map(|finding| finding.gpu).collect();
    for gpu in named {
        for line in hardware.advice(gpu) {
            context.say("evidence", Some(gpu), None, &line);
        }
    }
    let state = match scontrol.node(&node) {
        Ok(state) => state,
        Err(error) => {
            context.say(
                "error",
                None,
                None,
                &format!("cannot read node {node}: {error}"),
            );
            return if found.is_empty() {
                Exit::Incomplete
            } else {
                drain_for(&context, &found)
            };
        }
    };
    let ours = state
        .reason
        .as_deref()
        .is_some_and(|reason| reason.starts_with(REASON_PREFIX));
    if !found.is_empty() {
        return drain_unless_drained(&context, &found, &node, &state, ours);
    }
    if state.drained() && ours {
        return resume(&context, &scontrol, &node, &state);
    }
    if state.drained() {
        context.say(
            "leave",
            None,
            None,
            &format!(
                "GPUs clean; {node} stays drained: the reason is not gpureap's ({})",
                state.reason.as_deref().unwrap_or("none")
            ),
        );
    } else {
        context.say(
            "clean",
            None,
            None,
            &format!(
                "{} GPUs clean after {}",
                gpus.len(),
                Elapsed(started.elapsed())
            ),
        );
    }
    Exit::Success
}

/// The healthcheck's flags checked, this node named, scontrol found and
/// the driver opened; else the exit code, said (and drained for when the
/// GPUs cannot be checked).
fn open_healthcheck(
    backend: &BackendChoice,
    args: &HealthcheckConfig,
    outcome: &Outcome,
) -> Result<(Context, String, Scontrol, Box<dyn Driver>), Exit> {
    if let Err(error) = check_flags(&args.common) {
        Context::new("healthcheck", &args.common, None, None).say("error", None, None, &error);
        return Err(Exit::Usage);
    }
    let Some(node) = node_name(args.node.as_deref()) else {
        Context::new("healthcheck", &args.common, None, None).say(
            "error",
            None,
            None,
            "cannot tell this node's name: pass --node NAME or set SLURMD_NODENAME",
        );
        return Err(Exit::Usage);
    };
    let context = Context::new("healthcheck", &args.common, None, Some(node.clone()));
    context.bound("healthcheck", args.common.timeout, outcome);
    let scontrol = match context.scontrol() {
        Ok(scontrol) => scontrol,
        Err(error) => {
            context.say("error", None, None, &error);
            return Err(Exit::Incomplete);
        }
    };
    let driver = context.open_driver(backend)?;
    Ok((context, node, scontrol, driver))
}

/// What holds this node's GPUs: the verifier's reasons, and each process
/// judged by what Slurm says of the job in its environment.
fn healthcheck_findings(
    context: &Context,
    snapshot: &Snapshot,
    gpus: &BTreeSet<u32>,
    scontrol: &Scontrol,
    node: &str,
) -> Vec<Finding> {
    let mut slurm_jobs = SlurmJobs::default();
    let guard = Guard::for_this_process(&[]);
    let found = findings(snapshot, gpus, &mut |gpu, record| {
        // What the driver lists here has a context. The guard's reason for
        // sparing it excuses that memory only where the one rule says so
        // (`Spared::excuses_memory`: an MPS server or daemon, a site's
        // service); a protected name never does: a real nvidia-smi or DCGM
        // holds no memory, and one that does is a holder like any other.
        let excused = guard
            .spare_reason(snapshot, record, false)
            .is_some_and(|spared| spared.excuses_memory());
        // What is excused is spared where it looks like the service: no job
        // in its environment, or not the job's uid (a daemon a prolog
        // started carries the job's id, as root). Not a job's leftover that
        // took the name: that is judged like any holder.
        let Some(job) = job_of(record.id.pid) else {
            return (!excused).then(|| "no job's".to_string());
        };
        match slurm_jobs.get(Ok(scontrol), job) {
            Ok(info) => not_running_here(info, job, node, record.uid, gpu).filter(|_| {
                let daemon = match info {
                    Some(info) => info.unreadable.is_none() && info.uid != record.uid,
                    // Slurm no longer knows the job's uid: root's looks like a daemon.
                    None => record.uid == Some(0),
                };
                !(excused && daemon)
            }),
            // Slurm could not say: do not drain on a guess.
            Err(_) => None,
        }
    });
    slurm_jobs.log_errors(context, "not judged");
    found
}

/// A finding for the newest event of each Xid of the drain list the kernel
/// logged for each GPU since boot; a kernel log that could not be read is said.
fn xid_findings(context: &Context, hardware: &Hardware, gpus: &BTreeSet<u32>) -> Vec<Finding> {
    if let Some(note) = &hardware.note {
        context.say("note", None, None, note);
    }
    gpus.iter()
        .flat_map(|&gpu| {
            hardware
                .drain_events(gpu)
                .into_iter()
                .map(move |event| Finding {
                    gpu,
                    holding: Holding::Xid {
                        xid: event.xid,
                        at: event.at,
                    },
                    reset: None,
                })
        })
        .collect()
}

/// Drains the node for what holds its GPUs, unless someone else drained it
/// already: that drain is left as it is (exit 1, the GPUs still held).
fn drain_unless_drained(
    context: &Context,
    found: &[Finding],
    node: &str,
    state: &scontrol::NodeState,
    ours: bool,
) -> Exit {
    if state.drained() && !ours {
        for finding in found {
            context.say("held", Some(finding.gpu), finding.pid(), &finding.text());
        }
        context.say(
            "leave",
            None,
            None,
            &format!(
                "{node} is drained already by someone else (reason: {}); left as it is",
                state.reason.as_deref().unwrap_or("none")
            ),
        );
        return Exit::StillHeld;
    }
    drain_for(context, found)
}

/// Resumes the node gpureap drained, now that its GPUs are clean.
fn resume(context: &Context, scontrol: &Scontrol, node: &str, state: &scontrol::NodeState) -> Exit {
    let reason = state.reason.as_deref().unwrap_or_default();
    if context.dry_run {
        context.say(
            "resume",
            None,
            None,
            &format!("--dry-run: would resume {node} (drained: {reason})"),
        );
        return Exit::Success;
    }
    match scontrol.resume(node) {
        Ok(()) => {
            context.say(
                "resume",
                None,
                None,
                &format!("GPUs clean again; resumed {node} (drained: {reason})"),
            );
            Exit::Success
        }
        Err(error) => {
            context.say(
                "error",
                None,
                None,
                &format!("cannot resume {node}: {error}"),
            );
            Exit::Incomplete
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_lists_as_slurm_sets_them() {
        assert_eq!(
            parse_gpu_refs("0,2"),
            Ok(vec![GpuRef::Index(0), GpuRef::Index(2)])
        );
        assert_eq!(
            parse_gpu_refs("1-3"),
            Ok(vec![GpuRef::Index(1), GpuRef::Index(2), GpuRef::Index(3)])
        );
        assert_eq!(
            parse_gpu_refs("GPU-0f3c,1"),
            Ok(vec![GpuRef::Uuid("GPU-0f3c".to_string()), GpuRef::Index(1)])
        );
        assert_eq!(parse_gpu_refs("NoDevFiles"), Ok(Vec::new()));
        for bad in ["0,,1", "x", "-1", "3-1", "0-4294967295", "+1", "MIG-1/2/3"] {
            assert!(parse_gpu_refs(bad).is_err(), "{bad}");
        }
    }
}
