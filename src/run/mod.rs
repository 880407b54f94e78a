//! `gpureap run`: supervise a server so that it can never leave a GPU held.
//!
//! Each start is contained (`contain`), its output passed through and counted
//! (`output`), its readiness and health probed (`ready`), its progress compared
//! with remembered good starts (`baseline`). A crash or a hang writes a
//! diagnostic bundle (`bundle`), then the whole contained tree is freed with
//! the core's escalation and verification, then the server is restarted with
//! exponential backoff. Ctrl-C or SIGTERM stops it gracefully, then by force,
//! and verifies. SIGUSR1 writes a bundle on demand and changes nothing else.

pub mod baseline;
pub mod capacity;
pub mod contain;
pub mod leftovers;
pub mod metrics;
pub mod ondemand;
pub mod output;
pub mod plan;
pub mod ready;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::process::WaitStatus;

use crate::bundle::{Bundle, CpuSamples};
use crate::driver::Driver;
use crate::exit::Exit;
use crate::file::{LogError, LogFile};
use crate::reap::{self, FreeReport, Options};
use crate::select::{Guard, Scope};
use crate::snapshot::Snapshot;
use crate::state::{StateDir, StateDirError};
use crate::supervised::SUPERVISOR_ENV;
use crate::units::Elapsed;
use baseline::{GoodStart, History};
use capacity::CapacityWatch;
use contain::Containment;
use leftovers::RunRecord;
use output::{LogState, Outputs, SharedLog};
use ready::Readiness;

/// When a server is restarted (`--restart`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    Never,
    OnFailure,
    Always,
}

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub command: Vec<String>,
    pub readiness: Readiness,
    pub startup_timeout: Duration,
    pub stall_timeout: Duration,
    pub health_interval: Duration,
    pub restart: Restart,
    pub max_restarts: u32,
    pub backoff: Duration,
    pub grace: Duration,
    pub stop_timeout: Duration,
    pub log: Option<PathBuf>,
    pub state_dir: PathBuf,
    pub allow_cgroup: bool,
    /// `--metrics`: serve the supervisor's metrics here.
    pub metrics: Option<std::net::SocketAddr>,
    /// `--plan`: plan each start first (`plan::gate`).
    pub plan: Option<plan::PlanGate>,
}

impl RunConfig {
    /// How a stop frees what the run started: --grace, then --stop-timeout
    /// to verify, by the one formula (`reap::Options`).
    pub fn stop_options(&self) -> Options {
        Options::new(self.grace, self.stop_timeout)
    }
}

/// Consecutive failed health checks after ready that make a hang.
const HEALTH_FAILURES: u32 = 3;
/// How often readiness is probed before ready.
const PROBE_EVERY: Duration = Duration::from_millis(200);
/// The longest pause between restarts.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Why one start ended.
#[derive(Debug)]
enum Ended {
    Exited(WaitStatus),
    Hung(String),
    Stopped,
}

use output::event;

fn describe_status(status: WaitStatus) -> String {
    if let Some(code) = status.exit_status() {
        format!("exited with code {code}")
    } else if let Some(signal) = status.terminating_signal() {
        format!("was killed by signal {signal}")
    } else {
        "ended".to_string()
    }
}

/// A clean end: exit code 0, or the default end on SIGTERM.
fn ended_cleanly(status: WaitStatus) -> bool {
    Exit::succeeded(status.exit_status()) || status.terminating_signal() == Some(libc::SIGTERM)
}

/// The server's main process and its exit status, once reaped. Everything
/// reaped goes through here, so the status is never lost to another wait.
struct MainProcess {
    pid: u32,
    status: Option<WaitStatus>,
}

impl MainProcess {
    fn reap(&mut self) {
        for (pid, status) in contain::reap_children() {
            if pid == self.pid {
                self.status = Some(status);
            }
        }
    }
}

/// If anything below panics, the contained tree is still ended.
struct SweepOnPanic<'a>(&'a Containment);

impl Drop for SweepOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.sweep(Duration::from_secs(5));
        }
    }
}

/// A start that stayed ready this long resets the restart count: the
/// restarts budget is for crash loops, not for a server's whole life.
const HEALTHY_RUN: Duration = Duration::from_secs(600);
/// How long the output pipes may stay open after the tree is gone.
const PIPE_DRAIN: Duration = Duration::from_secs(2);

/// Opens the state directory. One that others could tamper with is refused;
/// one that cannot be made or opened only costs the history and the bundles.
fn open_state_dir(path: &std::path::Path) -> Result<Option<StateDir>, StateDirError> {
    match StateDir::open(path) {
        Ok(dir) => Ok(Some(dir)),
        Err(error @ StateDirError::Unsafe { .. }) => Err(error),
        Err(error @ StateDirError::Io { .. }) => {
            event(&format!(
                "{error}; good starts are not remembered and no bundle is written"
            ));
            Ok(None)
        }
    }
}

/// What is remembered across starts: the state directory, when usable, and
/// the good starts read from it.
struct Remembered {
    dir: Option<StateDir>,
    history: History,
}

impl Remembered {
    fn load(dir: Option<StateDir>) -> Remembered {
        let history = match &dir {
            Some(dir) => History::load(dir).unwrap_or_else(|error| {
                event(&format!(
                    "good starts ignored: {error}; the next good start replaces them"
                ));
                History::default()
            }),
            None => History::default(),
        };
        Remembered { dir, history }
    }

    fn record(&mut self, good: GoodStart) {
        let Some(dir) = &self.dir else {
            self.history.remember(good);
            return;
        };
        if let Err(error) = self.history.record(dir, good) {
            event(&format!("cannot record this start: {error}"));
        }
    }
}

/// How long, at the end, our stdout, stderr and the log may take to catch up.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// Supervises the server until it ends for good, or gpureap is stopped.
pub fn supervise(config: &RunConfig, driver: &dyn Driver) -> std::io::Result<Exit> {
    let refused = |error: LogError| {
        event(&error.to_string());
        match error {
            LogError::Refused(_) => Exit::Usage,
            LogError::Failed(_) => Exit::Incomplete,
        }
    };
    // The log is checked first, and made last: a refused log leaves no
    // state directory behind, and a refused state directory no empty log.
    let checked = match config.log.as_deref().map(LogFile::check).transpose() {
        Ok(checked) => checked,
        Err(error) => return Ok(refused(error)),
    };
    let state_dir = match open_state_dir(&config.state_dir) {
        Ok(dir) => dir,
        Err(error) => {
            event(&error.to_string());
            return Ok(Exit::Usage);
        }
    };
    let log = match checked {
        Some(checked) => {
            let shown = checked.path().display().to_string();
            match checked.open() {
                Ok(file) => Some((file, shown)),
                Err(error) => return Ok(refused(error)),
            }
        }
        None => None,
    };
    let outputs = Outputs::start(log);
    let result = supervise_with(config, driver, &outputs, state_dir);
    outputs.finish(OUTPUT_DRAIN);
    result
}

fn supervise_with(
    config: &RunConfig,
    driver: &dyn Driver,
    outputs: &Outputs,
    state_dir: Option<StateDir>,
) -> std::io::Result<Exit> {
    let (stop, dump) = prepare(config)?;
    let mut remembered = Remembered::load(state_dir);
    let stop_options = config.stop_options();
    if let Some(dir) = &remembered.dir
        && !leftovers::clean(dir, driver, stop_options)
    {
        event(
            "not starting: GPU memory a leftover of an earlier run held is not verified free (see above)",
        );
        return Ok(Exit::StillHeld);
    }
    let mut record = RunRecord::new(remembered.dir.as_ref());
    // `run --dump` finds us here while we run.
    let _registered = ondemand::Registered::new(remembered.dir.as_ref());
    let mut restarts = 0u32;
    let mut start_number = 0u32;
    loop {
        start_number += 1;
        let planned = match plan::gate(config.plan.as_ref(), driver, &stop) {
            plan::Gate::Start { planned } => planned,
            plan::Gate::Refused(exit) => return Ok(exit),
        };
        let Some((containment, spawned)) = start(config, outputs, &mut record, start_number) else {
            return Ok(Exit::Usage);
        };
        let served = serve(
            config,
            driver,
            &containment,
            spawned,
            (&stop, &dump),
            &mut remembered,
            (start_number, planned),
        );
        record.released(&containment);
        let outcome = match next_step(config, &served, &mut restarts) {
            Step::Done(exit) => return Ok(exit),
            Step::Restart(outcome) => outcome,
        };
        if !back_off(config, &stop, restarts) {
            return Ok(outcome);
        }
    }
}

/// Sets up what lasts for the whole run: the server's orphans come back
/// to us, the stop signals are noted, the metrics are served. Returns the
/// flag a stop signal sets, and the one SIGUSR1 (a bundle on demand) sets.
fn prepare(config: &RunConfig) -> std::io::Result<(Arc<AtomicBool>, Arc<AtomicBool>)> {
    // Orphans of the server come back to us rather than to PID 1.
    if let Err(error) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        event(&format!("cannot become child subreaper: {error}"));
    }
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGQUIT,
    ] {
        signal_hook::flag::register(signal, Arc::clone(&stop))?;
    }
    let dump = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, Arc::clone(&dump))?;
    if let Some(address) = config.metrics {
        metrics::serve(address)?;
    }
    if matches!(config.readiness, Readiness::Started) {
        event(
            "no readiness check given: the server counts as ready once started, so --stall-timeout and --startup-timeout do not apply",
        );
    }
    Ok((stop, dump))
}

/// Starts the server in its containment, recorded; in a cgroup if it can,
/// else once more without one. `None` when it cannot start at all (said).
fn start(
    config: &RunConfig,
    outputs: &Outputs,
    record: &mut RunRecord,
    start_number: u32,
) -> Option<(Containment, Spawned)> {
    let mut containment = Containment::prepare(config.allow_cgroup, start_number);
    record.made(&containment);
    event(&format!("containment: {containment}"));
    match spawn(config, &containment, outputs) {
        Ok(spawned) => Some((containment, spawned)),
        Err(error) if matches!(containment, Containment::Cgroup { .. }) => {
            // The command may be fine and the cgroup the problem: try without it.
            containment.release();
            record.released(&containment);
            containment = Containment::Fallback {
                why: format!("starting inside the cgroup failed: {error}"),
            };
            event(&format!("containment: {containment}"));
            match spawn(config, &containment, outputs) {
                Ok(spawned) => Some((containment, spawned)),
                Err(error) => {
                    event(&format!("cannot start {}: {error}", config.command[0]));
                    None
                }
            }
        }
        Err(error) => {
            containment.release();
            record.released(&containment);
            event(&format!("cannot start {}: {error}", config.command[0]));
            None
        }
    }
}

/// How one start of the server went, once its tree is stopped.
struct Served {
    /// A stop signal to gpureap ended it.
    stopped: bool,
    /// It crashed or hung.
    failure: bool,
    /// The GPU memory it held is verified free.
    freed: bool,
    /// It and its tree stopped without being forced.
    clean_stop: bool,
    ready_at: Option<Instant>,
}

/// Watches one start of the server until it ends, writes a bundle when
/// it failed, then stops its tree and frees its GPU memory.
fn serve(
    config: &RunConfig,
    driver: &dyn Driver,
    containment: &Containment,
    spawned: Spawned,
    (stop, dump): (&AtomicBool, &AtomicBool),
    remembered: &mut Remembered,
    (start_number, planned): (u32, Option<u64>),
) -> Served {
    let _sweep = SweepOnPanic(containment);
    metrics::started(planned);
    let mut main = MainProcess {
        pid: spawned.pid,
        status: None,
    };
    event(&format!(
        "start {start_number}: pid {}: {}; ready when {}",
        main.pid,
        config.command.join(" "),
        config.readiness
    ));

    let mut cpu = CpuSamples::default();
    let started = Instant::now();
    let mut capacity = CapacityWatch::new(start_number, planned);
    // A SIGUSR1 before this start is not about it.
    dump.store(false, Ordering::Relaxed);
    let mut on_demand = |cpu: &mut CpuSamples, remembered: &Remembered| {
        event(
            "SIGUSR1 (gpureap run --dump): writing a diagnostic bundle; the server is left as it is",
        );
        write_bundle(
            config,
            driver,
            containment,
            &spawned.log,
            cpu,
            remembered,
            "dump: on demand (SIGUSR1 to gpureap run, or gpureap run --dump)",
            start_number,
            started.elapsed().as_secs_f64(),
        );
    };
    let (ended, ready_at) = watch(
        config,
        containment,
        &mut main,
        &spawned.log,
        (stop, dump, &mut on_demand),
        &mut cpu,
        remembered,
        &mut capacity,
    );
    let seconds = started.elapsed().as_secs_f64();
    let (failure, summary) = judge(config, &ended);
    event(&summary);
    if failure {
        // A crash's last words may still be in the pipes: let them arrive first.
        output::wait_for_quiet(
            &spawned.log,
            Duration::from_millis(100),
            Duration::from_secs(1),
        );
        write_bundle(
            config,
            driver,
            containment,
            &spawned.log,
            &mut cpu,
            remembered,
            &summary,
            start_number,
            seconds,
        );
    }

    let (freed, forced) = stop_tree(config, driver, containment, &mut main);
    output::join(spawned.pumps, PIPE_DRAIN);
    main.reap();
    Served {
        stopped: matches!(ended, Ended::Stopped),
        failure,
        freed,
        clean_stop: !forced && main.status.is_none_or(ended_cleanly),
        ready_at,
    }
}

/// Whether the server was told to stop by a signal it did not catch:
/// SIGTERM (`kill`, systemd, Slurm) or SIGINT (Ctrl-C). gpureap sends none
/// before it judges the start, so it came from someone else.
fn told_to_stop(status: WaitStatus) -> bool {
    matches!(
        status.terminating_signal(),
        Some(libc::SIGTERM | libc::SIGINT)
    )
}

/// How a start ended: whether that is a failure, and its summary; counted.
/// A server is meant to run until it is told to stop, so an end nobody
/// asked for is a failure whatever its code (vLLM exits 0 when its engine
/// core dies): only with `--restart never`, a command run once, is exit 0
/// a clean end.
fn judge(config: &RunConfig, ended: &Ended) -> (bool, String) {
    let status = match ended {
        Ended::Hung(reason) => return (true, reason.clone()),
        Ended::Stopped => {
            metrics::stopped();
            return (false, "stop requested (signal to gpureap)".to_string());
        }
        Ended::Exited(status) => *status,
    };
    let succeeded = Exit::succeeded(status.exit_status());
    let (failure, summary) = if told_to_stop(status) {
        (
            false,
            format!(
                "server {}: told to stop by someone other than gpureap",
                describe_status(status)
            ),
        )
    } else if succeeded && config.restart == Restart::Never {
        (false, format!("server {}", describe_status(status)))
    } else if succeeded {
        (
            true,
            format!(
                "crash: server {}, and nobody asked it to stop",
                describe_status(status)
            ),
        )
    } else {
        (true, format!("crash: server {}", describe_status(status)))
    };
    metrics::ended(status, failure);
    (failure, summary)
}

/// What follows a start: the run ends with an exit code, or the server
/// restarts (with the code the run ends with if a stop comes first).
enum Step {
    Done(Exit),
    Restart(Exit),
}

/// Decides, by `--restart` and `--max-restarts`, whether the server starts
/// again; counts the restart (`restarts`) when it does.
fn next_step(config: &RunConfig, served: &Served, restarts: &mut u32) -> Step {
    if served.stopped {
        return Step::Done(if served.freed && served.clean_stop {
            Exit::Success
        } else {
            Exit::StillHeld
        });
    }
    let outcome = if served.freed && !served.failure {
        Exit::Success
    } else {
        Exit::StillHeld
    };
    let restart = match config.restart {
        Restart::Never => false,
        Restart::OnFailure => served.failure,
        Restart::Always => true,
    };
    if !restart {
        return Step::Done(outcome);
    }
    if !served.freed {
        event("not restarting: GPU memory the server held is not verified free (see above)");
        return Step::Done(Exit::StillHeld);
    }
    if served
        .ready_at
        .is_some_and(|at| at.elapsed() >= HEALTHY_RUN)
    {
        *restarts = 0;
    }
    if *restarts >= config.max_restarts {
        event(&format!(
            "giving up: {restarts} restart(s) used of --max-restarts {}",
            config.max_restarts
        ));
        return Step::Done(outcome);
    }
    *restarts += 1;
    metrics::restarted();
    Step::Restart(outcome)
}

/// Waits before restart number `restarts` (the backoff doubles each time,
/// up to `MAX_BACKOFF`); false when a stop signal comes meanwhile.
fn back_off(config: &RunConfig, stop: &AtomicBool, restarts: u32) -> bool {
    let pause = config
        .backoff
        .checked_mul(1u32 << (restarts - 1).min(16))
        .unwrap_or(MAX_BACKOFF)
        .min(MAX_BACKOFF);
    event(&format!(
        "restarting in {} (restart {restarts} of {})",
        Elapsed(pause),
        config.max_restarts
    ));
    let resume = Instant::now() + pause;
    loop {
        if stop.load(Ordering::Relaxed) {
            event("stop requested: not restarting");
            return false;
        }
        if Instant::now() >= resume {
            return true;
        }
        std::thread::sleep(
            Duration::from_millis(20).min(resume.saturating_duration_since(Instant::now())),
        );
    }
}

struct Spawned {
    pid: u32,
    log: SharedLog,
    pumps: Vec<std::thread::JoinHandle<()>>,
}

fn spawn(
    config: &RunConfig,
    containment: &Containment,
    outputs: &Outputs,
) -> std::io::Result<Spawned> {
    let mut command = Command::new(&config.command[0]);
    command
        .args(&config.command[1..])
        .env(SUPERVISOR_ENV, std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Python servers block-buffer a pipe: ask for lines, so nothing is lost at a crash.
    if std::env::var_os("PYTHONUNBUFFERED").is_none() {
        command.env("PYTHONUNBUFFERED", "1");
    }
    let procs_file = containment.apply(&mut command)?;
    let mut child = command.spawn()?;
    drop(procs_file);
    let log = SharedLog::new(Mutex::new(LogState::new()));
    let ready_regex = match &config.readiness {
        Readiness::Log(regex) => Some(regex.clone()),
        _ => None,
    };
    let streams: [(Option<Box<dyn std::io::Read + Send>>, &output::Sink); 2] = [
        (
            child.stdout.take().map(|out| Box::new(out) as _),
            &outputs.stdout,
        ),
        (
            child.stderr.take().map(|err| Box::new(err) as _),
            &outputs.stderr,
        ),
    ];
    let pumps = streams
        .into_iter()
        .filter_map(|(source, pass_through)| {
            Some(output::pump(
                source?,
                pass_through.clone(),
                outputs.log.clone(),
                log.clone(),
                ready_regex.clone(),
            ))
        })
        .collect();
    // The child is reaped with wait() later, together with adopted orphans.
    Ok(Spawned {
        pid: child.id(),
        log,
        pumps,
    })
}

#[allow(clippy::too_many_arguments)]
fn write_bundle(
    config: &RunConfig,
    driver: &dyn Driver,
    containment: &Containment,
    log: &SharedLog,
    cpu: &mut CpuSamples,
    remembered: &Remembered,
    summary: &str,
    start_number: u32,
    seconds: f64,
) {
    let members = containment.members();
    // The stacks first: nearest the moment the start was judged, and before
    // anything is signalled.
    let stacks = crate::stacks::capture(
        &members.iter().copied().collect::<Vec<_>>(),
        crate::stacks::Limits::default(),
    );
    let snapshot = Snapshot::take_focused(driver, &members);
    let (lines, log_tail) = log
        .lock()
        .map(|state| (state.lines, state.tail.iter().cloned().collect()))
        .unwrap_or_default();
    // One last sample, so the CPU figures reach up to this moment.
    cpu.sample(&members);
    let bundle = Bundle {
        schema_version: crate::report::SCHEMA_VERSION,
        kind: "bundle",
        reason: summary.to_string(),
        progress: format!(
            "at log line {lines} after {seconds:.1}s; {}",
            remembered.history.summary()
        ),
        start: start_number,
        lines,
        seconds,
        containment: containment.to_string(),
        command: config.command.join(" "),
        members: Bundle::members(&snapshot, &members, cpu),
        log_tail,
        gpu: serde_json::from_str(&crate::report::status_json(&snapshot, &None))
            .unwrap_or_default(),
        stacks,
    };
    let Some(dir) = &remembered.dir else {
        event("no diagnostic bundle: the state directory is not usable (see above)");
        return;
    };
    // After a crash that took the whole tree with it, no process is left to read.
    if !bundle.stacks.summary.is_empty() {
        event(&format!(
            "stacks: {}",
            crate::units::Field(&bundle.stacks.summary)
        ));
    }
    for note in &bundle.stacks.notes {
        event(&format!("stacks: {}", crate::units::Field(note)));
    }
    match dir
        .subdir("bundles")
        .and_then(|bundles| bundle.write(&bundles, &snapshot))
    {
        Ok(dir) => event(&format!("diagnostic bundle: {}", dir.display())),
        Err(error) => event(&format!("cannot write the diagnostic bundle: {error}")),
    }
}

/// Writes a bundle on demand (SIGUSR1), from the samples and history `watch` keeps.
type OnDemand<'a> = &'a mut dyn FnMut(&mut CpuSamples, &Remembered);

/// Watches one start until it exits, hangs, or gpureap is asked to stop.
/// Also returns when it became ready, if it did. Once ready, the engine's
/// logged capacity is looked for in its output (`capacity`).
#[allow(clippy::too_many_arguments)]
fn watch(
    config: &RunConfig,
    containment: &Containment,
    main: &mut MainProcess,
    log: &SharedLog,
    (stop, dump, on_demand): (&AtomicBool, &AtomicBool, OnDemand),
    cpu: &mut CpuSamples,
    remembered: &mut Remembered,
    capacity: &mut CapacityWatch,
) -> (Ended, Option<Instant>) {
    let mut watching = Watching::new(config);
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if stop.load(Ordering::Relaxed) {
            return (Ended::Stopped, watching.ready_at);
        }
        if dump.swap(false, Ordering::Relaxed) {
            on_demand(cpu, remembered);
        }
        main.reap();
        if let Some(status) = main.status {
            return (Ended::Exited(status), watching.ready_at);
        }
        let now = Instant::now();
        watching.sample_cpu(now, cpu, containment);
        if let Some(at) = watching.ready_at {
            capacity.look(log, at, now, remembered.dir.as_ref());
        }
        let seen = match log.lock() {
            Ok(state) => Seen {
                lines: state.lines,
                last_output: state.last_output,
                ready_at_line: state.ready_at_line,
            },
            Err(_) => Seen {
                lines: 0,
                last_output: now,
                ready_at_line: None,
            },
        };
        let hung = if watching.ready_at.is_none() {
            watching.before_ready(config, now, &seen, remembered)
        } else {
            watching.after_ready(config, now)
        };
        if let Some(hung) = hung {
            return hung;
        }
    }
}

/// What the log has shown of one start so far.
struct Seen {
    lines: u64,
    last_output: Instant,
    ready_at_line: Option<u64>,
}

/// What `watch` keeps between its looks at one start.
struct Watching {
    started: Instant,
    ready_at: Option<Instant>,
    last_probe: Instant,
    last_health: Instant,
    last_cpu: Option<Instant>,
    health_failures: u32,
}

impl Watching {
    fn new(config: &RunConfig) -> Watching {
        let started = Instant::now();
        let ready_at = matches!(config.readiness, Readiness::Started).then_some(started);
        if ready_at.is_some() {
            metrics::became_ready(0.0);
        }
        Watching {
            started,
            ready_at,
            last_probe: started,
            last_health: started,
            last_cpu: None,
            health_failures: 0,
        }
    }

    /// The contained processes' CPU, every half second.
    fn sample_cpu(&mut self, now: Instant, cpu: &mut CpuSamples, containment: &Containment) {
        if self
            .last_cpu
            .is_none_or(|at| now.duration_since(at) >= Duration::from_millis(500))
        {
            cpu.sample(&containment.members());
            self.last_cpu = Some(now);
        }
    }

    /// Before ready: probes readiness (and records a good start), else
    /// ends the start as hung once its log stalls or --startup-timeout passes.
    fn before_ready(
        &mut self,
        config: &RunConfig,
        now: Instant,
        seen: &Seen,
        remembered: &mut Remembered,
    ) -> Option<(Ended, Option<Instant>)> {
        let lines = seen.lines;
        if (now.duration_since(self.last_probe) >= PROBE_EVERY || seen.ready_at_line.is_some())
            && self.probe(config, now, seen, remembered)
        {
            return None;
        }
        let silence = now.duration_since(seen.last_output);
        let elapsed = now.duration_since(self.started);
        let history = || remembered.history.summary();
        if silence >= config.stall_timeout {
            metrics::hung(metrics::HangKind::Stall);
            return Some((
                Ended::Hung(format!(
                    "hang: no log output for {} before ready: stalled at log line {lines} after {:.1}s; {}",
                    Elapsed(silence),
                    elapsed.as_secs_f64(),
                    history()
                )),
                None,
            ));
        }
        if elapsed >= config.startup_timeout {
            metrics::hung(metrics::HangKind::StartupTimeout);
            return Some((
                Ended::Hung(format!(
                    "hang: not ready after {} (--startup-timeout): at log line {lines}; {}",
                    Elapsed(elapsed),
                    history()
                )),
                None,
            ));
        }
        None
    }

    /// Probes readiness; when ready, says so and remembers the good start.
    fn probe(
        &mut self,
        config: &RunConfig,
        now: Instant,
        seen: &Seen,
        remembered: &mut Remembered,
    ) -> bool {
        self.last_probe = now;
        if !config.readiness.probe(seen.ready_at_line.is_some()) {
            return false;
        }
        self.ready_at = Some(now);
        let seconds = now.duration_since(self.started).as_secs_f64();
        metrics::became_ready(seconds);
        let at_line = seen.ready_at_line.unwrap_or(seen.lines);
        event(&format!(
            "ready after {seconds:.1}s at log line {at_line}; {}",
            remembered.history.summary()
        ));
        remembered.record(GoodStart {
            lines: at_line,
            seconds,
            at_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        });
        self.last_health = now;
        true
    }

    /// After ready: a health check every --health-interval; the start is
    /// unhealthy (hung) after HEALTH_FAILURES failures in a row.
    fn after_ready(
        &mut self,
        config: &RunConfig,
        now: Instant,
    ) -> Option<(Ended, Option<Instant>)> {
        if !config.readiness.checks_health()
            || now.duration_since(self.last_health) < config.health_interval
        {
            return None;
        }
        self.last_health = now;
        match config.readiness.health() {
            Ok(()) => {
                self.health_failures = 0;
                None
            }
            Err(why) => {
                self.health_failures += 1;
                event(&format!(
                    "health check failed ({}/{HEALTH_FAILURES}): {why}",
                    self.health_failures
                ));
                (self.health_failures >= HEALTH_FAILURES).then(|| {
                    metrics::hung(metrics::HangKind::Unhealthy);
                    (
                        Ended::Hung(format!(
                            "unhealthy: {HEALTH_FAILURES} health checks failed after ready (last: {why})"
                        )),
                        self.ready_at,
                    )
                })
            }
        }
    }
}

/// Frees the whole contained tree with the core's escalation and
/// verification, then sweeps the containment and proves it empty. Returns
/// (GPUs verified free and nothing left, some process needed SIGKILL).
fn stop_tree(
    config: &RunConfig,
    driver: &dyn Driver,
    containment: &Containment,
    main: &mut MainProcess,
) -> (bool, bool) {
    let mut all_freed = true;
    let mut forced = false;
    let members = containment.members();
    let snapshot = Snapshot::take_focused(driver, &members);
    // Only processes still ours in this snapshot: a member that exited since
    // the list was read may have left its PID to a stranger.
    let pids: BTreeSet<_> = members
        .iter()
        .filter(|&&pid| containment.owns(pid, &snapshot))
        .filter_map(|pid| snapshot.processes.get(pid).map(|record| record.id))
        .collect();
    if !pids.is_empty() {
        event(&format!("stopping {} contained process(es)", pids.len()));
        let scope = Scope {
            pids,
            ..Scope::default()
        };
        let options = config.stop_options();
        let report = reap::free(
            driver,
            &scope,
            &Guard::for_this_process(&[]),
            snapshot,
            options,
            &mut |_| main.reap(),
        );
        forced = report.targets.iter().any(reap::Handled::killed);
        report_outcome(&report);
        all_freed = report.all_freed();
    }
    let left = containment.sweep(config.stop_timeout);
    main.reap();
    if left.is_empty() {
        match containment {
            Containment::Cgroup { path } => event(&format!(
                "nothing left behind: {} is empty",
                path.join("cgroup.procs").display()
            )),
            Containment::Fallback { .. } => {
                event("nothing left behind: no descendant of gpureap is alive")
            }
        }
        containment.release();
    } else {
        all_freed = false;
        event(&format!("still alive after the sweep: {left:?}"));
    }
    (all_freed, forced)
}

fn report_outcome(report: &FreeReport) {
    let forced: Vec<String> = report
        .targets
        .iter()
        .filter(|target| target.killed())
        .map(|target| {
            format!(
                "{} ({})",
                target.pid,
                target.cmdline.split(' ').next().unwrap_or("")
            )
        })
        .collect();
    if !forced.is_empty() {
        event(&format!("SIGKILL needed for: {}", forced.join(", ")));
    }
    for spared in &report.spared {
        event(&format!(
            "left alone: {} ({}): {}",
            spared.pid, spared.comm, spared.reason
        ));
    }
    for line in crate::report::gpu_outcome_lines(report) {
        event(&line);
    }
}
