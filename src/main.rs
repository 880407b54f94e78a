//! The gpureap binary: parse, compose the library's stages, print, exit.

use std::io::{self, BufRead, IsTerminal, Write};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

use gpureap::cli::{Cli, Command, RunArgs};
use gpureap::config::{self, UsageError};
use gpureap::fleet;
use gpureap_core::container::Sources;
use gpureap_core::driver::{self, BackendChoice, Driver};
use gpureap_core::exit::{Exit, Failure};
use gpureap_core::members::{self, Found, Wanted};
use gpureap_core::reap;
use gpureap_core::report;
use gpureap_core::select::Guard;
use gpureap_core::snapshot::Snapshot;
use gpureap_services::supervision::{self, StaleRun};

fn main() -> ! {
    // The demo's simulated processes are this binary under other command lines.
    gpureap_core::driver::sim::stand_in::run_if_asked();
    let mut matches = Cli::command().get_matches();
    // `reap --config FILE`: its keys become flags, parsed as typed ones are.
    if let Some(("reap", reap)) = matches.subcommand()
        && let Some(file) = reap.get_one::<std::path::PathBuf>("config")
    {
        let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
        match config::reap_argv(&argv, file) {
            Ok(merged) => {
                matches = Cli::command()
                    .try_get_matches_from(merged)
                    .unwrap_or_else(|error| error.exit());
            }
            Err(error) => {
                eprintln!("gpureap: {}", gpureap_core::units::one_line(&error.0));
                Exit::Usage.exit();
            }
        }
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    // An explicit --backend goes to the hosts too; GPUREAP_BACKEND is this machine's.
    let remote_backend = (matches.value_source("backend") == Some(ValueSource::CommandLine))
        .then(|| matches.get_raw("backend"))
        .flatten()
        .and_then(|mut raw| raw.next())
        .map(|raw| raw.to_string_lossy().into_owned());
    // GPUREAP_LOG=debug prints where the time goes (snapshots, free rounds) on stderr.
    if std::env::var_os("GPUREAP_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("GPUREAP_LOG"))
            .with_writer(io::stderr)
            .with_timer(tracing_subscriber::fmt::time::uptime())
            .init();
    }
    few_malloc_arenas(&cli.command);
    if let Err(error) = meaningless_flags(&matches, &cli) {
        eprintln!("gpureap: {}", gpureap_core::units::one_line(&error.0));
        Exit::Usage.exit();
    }
    let result = match &cli.command {
        // One config per command, the same here and with -H.
        Command::Status(args) => {
            let request = config::StatusRequest::new(args);
            match fleet(&args.fleet, &remote_backend, args.json) {
                Ok(Some(fleet)) => fleet_output(fleet::commands::status(&fleet, &request)),
                Ok(None) => status(&cli.backend, &request),
                Err(error) => Err(error),
            }
        }
        Command::Free(args) => match fleet(&args.fleet, &remote_backend, args.json)
            .and_then(|fleet| Ok((fleet, config::FreeRequest::new(args)?)))
        {
            Ok((Some(fleet), request)) => fleet_output(fleet::commands::free(
                &fleet,
                &request,
                ask_fleet,
                can_ask(),
            )),
            Ok((None, request)) => free(&cli.backend, &request),
            Err(error) => Err(error),
        },
        Command::Wait(args) => {
            let request = config::WaitRequest::new(args);
            match fleet(&args.fleet, &remote_backend, args.json) {
                Ok(Some(fleet)) => fleet_output(fleet::commands::wait(&fleet, &request)),
                Ok(None) => wait(&cli.backend, &request),
                Err(error) => Err(error),
            }
        }
        Command::Run(args) => run(&cli.backend, args),
        Command::Push(args) => push(args),
        Command::Demo(args) if args.top => demo_top(),
        Command::Demo(args) => {
            gpureap::demo::run(args.json, &mut io::stdout().lock()).map_err(Failure::from)
        }
        Command::Top(args) => top(&cli.backend, args, &remote_backend),
        Command::Exporter(args) => exporter(&cli.backend, args),
        Command::Check(args) => check(&cli.backend, args),
        Command::Slurm(command) => slurm(&cli.backend, command),
        Command::Reset(args) => reset(&cli.backend, args),
        Command::Dump(args) => dump(&cli.backend, &config::dump(args)),
        Command::Reap(args) => reap_watch(&cli.backend, args),
        Command::Plan(args) => match fleet(&args.fleet, &remote_backend, args.json)
            .and_then(|fleet| Ok((fleet, config::plan(args)?)))
        {
            Ok((Some(fleet), request)) => fleet_output(fleet::commands::plan(&fleet, &request)),
            Ok((None, request)) => plan(&cli.backend, &request),
            Err(error) => Err(error),
        },
    };
    tracing::debug!("command done");
    exit_code(result).exit()
}

/// How many arenas glibc's malloc may make in the modes left running
/// (exporter, reap, top, run). By default it gives each thread that
/// allocates an arena of its own, up to eight per core, and each keeps what
/// was freed in it: the /proc scan's threads (up to 32) and NVML's each left
/// one, holding memory in a long run (docs/bench/history.md, "Round 7"). Not in
/// one-shot commands: on the H200's 16 cores, sixteen scanning threads queued
/// on one arena's lock made `status --monitors` at 20,000 processes 542 ms
/// instead of 109 (Round 8), for some 100 KiB saved.
#[cfg(target_env = "gnu")]
const MALLOC_ARENAS: libc::c_int = 1;

/// Caps glibc's arenas at [`MALLOC_ARENAS`] for the modes left running,
/// before any thread starts; unless the environment already sets the cap (`MALLOC_ARENA_MAX`,
/// or `arena_max` in `GLIBC_TUNABLES`), which stands.
fn few_malloc_arenas(command: &Command) {
    // A one-shot command keeps glibc's arenas: its threads would otherwise
    // queue on one arena's lock.
    let left_running = matches!(
        command,
        Command::Exporter(_) | Command::Reap(_) | Command::Top(_) | Command::Run(_)
    );
    #[cfg(target_env = "gnu")]
    if left_running {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() && !tunables.contains("arena_max") {
            // Safety: mallopt only sets a parameter of the allocator; no
            // other thread runs yet.
            unsafe { libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS) };
        }
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = left_running;
}

/// The one place an error becomes an exit code: the user's input is 2,
/// anything else that stopped the command is 3, never 1 ("still held").
fn exit_code(result: Result<Exit, Failure>) -> Exit {
    match result {
        Ok(code) => code,
        Err(failure) => {
            // One line, whatever the error quotes (a path, a host's
            // answer, a file's name with a newline in it).
            if failure.class() != Exit::Success {
                eprintln!(
                    "gpureap: {}",
                    gpureap_core::units::one_line(&format!("{:#}", failure.error()))
                );
            }
            failure.class()
        }
    }
}

/// Refuses a flag that means nothing for the subcommand it was given to, so
/// that nothing runs as if it had been obeyed: the global `--backend` where
/// no driver is opened (`demo` stages its own, `push` opens none), and
/// `--ssh` given on the command line to `status`, `free` or `wait` without
/// `-H` (GPUREAP_SSH in the environment is a default, never refused).
fn meaningless_flags(matches: &clap::ArgMatches, cli: &Cli) -> Result<(), UsageError> {
    let given = |matches: &clap::ArgMatches, id: &str| {
        matches.value_source(id) == Some(ValueSource::CommandLine)
    };
    match &cli.command {
        Command::Demo(_) | Command::Push(_) if given(matches, "backend") => {
            let name = if matches!(cli.command, Command::Demo(_)) {
                "demo stages its own simulated driver"
            } else {
                "push opens no GPU driver (the hosts' gpureap uses theirs)"
            };
            return Err(UsageError(format!(
                "--backend means nothing here: {name}; drop it"
            )));
        }
        Command::Plan(args) if args.gpu_memory.is_some() && given(matches, "backend") => {
            return Err(UsageError(
                "--backend means nothing with --gpu-memory: a hypothetical box reads no GPU; drop one of them"
                    .to_string(),
            ));
        }
        _ => {}
    }
    let hosts_given = match &cli.command {
        Command::Status(args) => Some(!args.fleet.hosts.is_empty()),
        Command::Free(args) => Some(!args.fleet.hosts.is_empty()),
        Command::Wait(args) => Some(!args.fleet.hosts.is_empty()),
        Command::Plan(args) => Some(!args.fleet.hosts.is_empty()),
        _ => None,
    };
    if let (Some(false), Some((name, sub))) = (hosts_given, matches.subcommand())
        && given(sub, "ssh")
    {
        return Err(UsageError(format!(
            "--ssh means nothing without -H: `{name}` runs on this host; give the hosts with -H LIST"
        )));
    }
    Ok(())
}

/// The hosts of `-H`, or `None` to run here.
fn fleet(
    args: &gpureap::cli::HostsArgs,
    backend: &Option<String>,
    json: bool,
) -> Result<Option<gpureap_services::remote::Fleet>, Failure> {
    let hosts = config::fleet(args)?;
    Ok(gpureap_services::remote::Fleet::new(&hosts, backend.clone(), json).map_err(UsageError)?)
}

fn fleet_output(output: Result<fleet::commands::Output, UsageError>) -> Result<Exit, Failure> {
    let output = output?;
    emit(&output.text)?;
    Ok(output.exit)
}

/// Shows the fleet's plan on the terminal and asks once.
fn ask_fleet(plan: &str) -> Result<(), UsageError> {
    match ask(plan) {
        Ok(true) => Ok(()),
        Ok(false) => Err(UsageError("aborted: nothing was signalled".to_string())),
        Err(error) => Err(UsageError(format!(
            "aborted: cannot read the answer: {error}"
        ))),
    }
}

/// Whether there is someone to ask: stdin and stderr are a terminal.
fn can_ask() -> bool {
    io::stdin().is_terminal() && io::stderr().is_terminal()
}

/// Shows `question` on stderr; whether the answer on stdin is yes. The
/// question quotes processes and hosts: it is escaped as a report is.
fn ask(question: &str) -> io::Result<bool> {
    eprint!("{}", gpureap_core::units::printable(question));
    let mut answer = String::new();
    io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

fn push(args: &gpureap::cli::PushArgs) -> Result<Exit, Failure> {
    let request = config::push(args)?;
    let Some(fleet) = fleet(&args.fleet, &None, request.json)? else {
        return Err(UsageError("push needs the hosts: -H LIST".into()).into());
    };
    let bin = match &request.bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe()?,
    };
    let output = fleet::push::push(
        &fleet,
        &fleet::push::PushRequest {
            bin: &bin,
            to: request.to.as_deref(),
            force: request.force,
            json: request.json,
        },
    )?;
    emit(&output.text)?;
    Ok(output.exit)
}

fn open_driver(choice: &BackendChoice) -> Result<Box<dyn Driver>, Failure> {
    let driver = driver::open(choice).map_err(UsageError)?;
    tracing::debug!(backend = driver.describe(), "driver opened");
    Ok(driver)
}

/// `open_driver` for a report that says itself that there is no driver.
fn open_driver_quietly(choice: &BackendChoice) -> Result<Box<dyn Driver>, Failure> {
    let driver = driver::open_quietly(choice).map_err(UsageError)?;
    tracing::debug!(backend = driver.describe(), "driver opened");
    Ok(driver)
}

fn gpu_count(driver: &dyn Driver) -> u32 {
    driver.gpu_count().unwrap_or(0)
}

/// Writes a report for people to stdout, escaped (`units::printable`).
fn emit(text: &str) -> io::Result<()> {
    emit_encoded(&gpureap_core::units::printable(text))
}

/// Writes a document for programs (JSON, a Prometheus exposition) to stdout
/// as its encoder wrote it, in one piece; a closed pipe ends quietly. Each
/// encoder keeps control characters out (`report::to_json`, `metrics`):
/// escaping them here would make `\r` of a raw CR, an escape neither format has.
fn emit_encoded(text: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    let written = stdout
        .write_all(text.as_bytes())
        .and_then(|()| {
            if text.ends_with('\n') {
                Ok(())
            } else {
                stdout.write_all(b"\n")
            }
        })
        .and_then(|()| stdout.flush());
    match written {
        // `gpureap free ... | head`: the reader left; the command's exit code still stands.
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

fn status(backend: &BackendChoice, args: &config::StatusRequest) -> Result<Exit, Failure> {
    let sources = args.sources.sources()?;
    // How long the snapshot took, for `status --prometheus`'s scan figures.
    // Every process's descriptors are read where asked (--monitors) or
    // where the driver's lists do not explain every GPU's memory
    // (`Snapshot::take_seen`); --prometheus counts what the driver lists.
    let (driver, mut snapshot, took, gpu) =
        if (args.prometheus || args.monitors) && !config::names_by_driver(&args.gpu) {
            // NVML starts while /proc is read (`Snapshot::open_and_take`).
            let (driver, mut snapshot, took) =
                Snapshot::open_and_take(backend, args.prometheus).map_err(UsageError)?;
            snapshot.read_evidence(driver.as_ref());
            snapshot.read_activity(driver.as_ref());
            (driver, snapshot, took, args.gpu.clone())
        } else {
            // The driver first: its lists decide what is read, and it
            // resolves the names only it knows (docs/mig.md).
            let (driver, gpu) = config::gpu_names(open_driver_quietly(backend)?, &args.gpu)?;
            // The hardware evidence and the activity are read beside it
            // (`take_with_evidence`).
            let mut took = std::time::Duration::ZERO;
            let snapshot = Snapshot::take_with_evidence(driver.as_ref(), |driver| {
                let started = std::time::Instant::now();
                let snapshot = match (args.prometheus, args.monitors) {
                    (true, _) => Snapshot::take_listed(driver),
                    (false, true) => Snapshot::take(driver),
                    (false, false) => Snapshot::take_seen(driver),
                };
                took = started.elapsed();
                snapshot
            });
            (driver, snapshot, took, gpu)
        };
    tracing::debug!("evidence read");
    snapshot.attribute_containers(&sources);
    tracing::debug!("containers attributed");
    let gpus = config::gpus(&gpu, gpu_count(driver.as_ref()))?;
    if args.prometheus {
        let mut figures = gpureap_services::metrics::ScanFigures::default();
        figures.count(&snapshot, took);
        let options = gpureap_services::metrics::Options {
            gpus: gpus.clone(),
            per_process: args.per_process,
        };
        emit_encoded(
            &gpureap_services::metrics::encode_snapshot(&snapshot, &figures, &options).text,
        )?;
    } else if args.json {
        emit_encoded(&report::status_json(&snapshot, &gpus))?;
    } else if args.tree {
        emit(&report::status_tree(&snapshot, &gpus))?;
    } else {
        emit(&report::status_table(&snapshot, &gpus))?;
    }
    // The exposition says what could not be read (gpureap_driver_up,
    // gpureap_gpu_up): its writer (`... > f.tmp && mv f.tmp f.prom`) must
    // not keep the last file instead because of the exit code.
    if args.prometheus {
        return Ok(Exit::Success);
    }
    Ok(status_exit(&snapshot, &gpus))
}

/// `status` shows what it could read, and exits 3 (could not tell) when
/// that is not everything: no driver, a GPU in scope it could not read, or
/// one whose memory no listed process explains while gpureap does not see
/// the host's PIDs (`metrics::unseen`: processes it cannot see may hold it,
/// or none). Not 1: `status` finds no problems, it shows (memory held by no
/// process exits 0 here, 1 in `check`); and `check` and `free` exit 3 for
/// the same memory.
fn status_exit(snapshot: &Snapshot, gpus: &Option<std::collections::BTreeSet<u32>>) -> Exit {
    let unreadable = snapshot.driver_error.is_some()
        || snapshot
            .gpus
            .iter()
            .filter(|gpu| gpus.as_ref().is_none_or(|set| set.contains(&gpu.index)))
            .any(|gpu| {
                gpu.error.is_some() || gpureap_services::metrics::unseen(snapshot, gpu).is_some()
            });
    if unreadable {
        Exit::Unknown
    } else {
        Exit::Success
    }
}

fn free(backend: &BackendChoice, args: &config::FreeRequest) -> Result<Exit, Failure> {
    let uids = args.users()?;
    let sources = args.sources.sources()?;
    let (driver, gpu) = config::gpu_names(open_driver(backend)?, &args.gpu)?;
    let args = &config::FreeRequest {
        gpu,
        ..args.clone()
    };
    let gpu_count = gpu_count(driver.as_ref());
    // GPU indexes are checked before the scan; named processes' families need command lines too.
    config::gpus(&args.gpu, gpu_count)?;
    // Found before the snapshot, so that every member found is in it.
    let stale_runs = args.stale_runs.then(supervision::stale_runs);
    let cgroup_scopes = cgroup_scopes(&args.cgroups, &sources)?;
    // Named processes and the members of a container, pod or cgroup, GPU
    // users or not: their command lines and uids are read too.
    let named = args
        .pid
        .iter()
        .copied()
        .chain(
            cgroup_scopes
                .iter()
                .flatten()
                .flat_map(|found| found.members.iter().map(|id| id.pid)),
        )
        .collect();
    let mut snapshot = Snapshot::take_focused(driver.as_ref(), &named);
    // Names and "container gone" (which --orphans takes), judged once here.
    snapshot.attribute_containers(&sources);
    let mut guard = Guard::for_this_process(&args.protect);
    let config = config::free(
        args,
        uids,
        gpu_count,
        &snapshot,
        &guard,
        stale_runs.as_deref(),
        cgroup_scopes.as_deref(),
    )?;
    // `--mps-server`: the one way past the MPS protection.
    guard.mps_servers = config.scope.mps_servers.clone();
    let mut plan = reap::plan(&snapshot, &config.scope, &guard);
    let stale_runs: Option<Vec<StaleRun>> =
        stale_runs.map(|runs| supervision::in_scope(runs, &plan, &config.scope));
    plan.stale_runs = stale_runs
        .iter()
        .flatten()
        .map(supervision::planned)
        .collect();
    plan.cgroup_scopes = cgroup_scopes.clone().unwrap_or_default();

    if args.dry_run {
        emit(&if args.json {
            report::free_json(&plan, Exit::Success)
        } else {
            report::free_plan(&plan)
        })?;
        return Ok(Exit::Success);
    }
    // Even an empty plan asks: re-scans may find holders in scope later.
    if !args.yes {
        confirm(&plan)?;
    }

    let spinner = progress_bar(args.json);
    let mut outcome = reap::free(
        driver.as_ref(),
        &config.scope,
        &guard,
        snapshot,
        config.options,
        &mut |progress| {
            if let Some(bar) = &spinner {
                bar.set_message(report::progress_text(progress));
                bar.tick();
            }
        },
    );
    if let Some(runs) = &stale_runs {
        outcome.stale_runs =
            supervision::remove_after_free(runs, &outcome, &guard, config.options.timeout());
    }
    outcome.cgroup_scopes = cgroup_scopes.unwrap_or_default();
    if let Some(bar) = spinner {
        bar.finish_and_clear();
    }
    outcome.attach_advice(driver.as_ref());
    let code = outcome.exit();
    emit(&if args.json {
        report::free_json(&outcome, code)
    } else {
        report::free_outcome(&outcome)
    })?;
    Ok(code)
}

/// The members of `--container`, `--pod` and `--cgroup` on this host, from
/// every process's cgroups, before the snapshot; `None` without them. A
/// value that names nothing here, or more than one thing, is bad input.
fn cgroup_scopes(wanted: &[Wanted], sources: &Sources) -> Result<Option<Vec<Found>>, UsageError> {
    if wanted.is_empty() {
        return Ok(None);
    }
    let placed = members::scan();
    let known = members::known(sources, wanted, &placed);
    members::find(wanted, &placed, &known)
        .map(Some)
        .map_err(UsageError)
}

/// `top` draws on a terminal and reads keys from it.
#[cfg(feature = "top")]
fn terminal_for_top() -> Result<(), Failure> {
    if io::stdin().is_terminal() && io::stdout().is_terminal() {
        return Ok(());
    }
    Err(UsageError(
        "top needs a terminal (stdin and stdout); for a script use `gpureap status --json`"
            .to_string(),
    )
    .into())
}

/// `demo --top`: the crashed host staged, shown in the live view.
#[cfg(feature = "top")]
fn demo_top() -> Result<Exit, Failure> {
    terminal_for_top()?;
    gpureap::demo::staged_for(|driver| gpureap::top::live::run(driver, &config::TopRequest::demo()))
        .map_err(Failure::from)
}

#[cfg(not(feature = "top"))]
fn demo_top() -> Result<Exit, Failure> {
    Err(without_live_view())
}

/// What a build without the `top` feature says where the live view is asked
/// for: it could not be done here (3), and what still works.
#[cfg(not(feature = "top"))]
fn without_live_view() -> Failure {
    Failure::new(
        Exit::Incomplete,
        UsageError(
            "this gpureap was built without the live view (cargo feature \"top\"); \
             `gpureap top --json` and `gpureap status` work"
                .to_string(),
        ),
    )
}

/// The live view: it needs a terminal on both ends, and a driver to watch,
/// here or (-H) on the one host named. `--json` needs neither terminal.
fn top(
    backend: &BackendChoice,
    args: &gpureap::cli::TopArgs,
    remote_backend: &Option<String>,
) -> Result<Exit, Failure> {
    let request = config::TopRequest::new(args);
    let host = config::top_host(args)?;
    if request.json {
        let driver = open_driver_quietly(backend)?;
        return Ok(gpureap::top::stream::emit(
            std::sync::Arc::from(driver),
            request.interval,
        )?);
    }
    #[cfg(not(feature = "top"))]
    {
        let _ = (host, remote_backend);
        Err(without_live_view())
    }
    #[cfg(feature = "top")]
    {
        terminal_for_top()?;
        if let Some(host) = host {
            let fleet = gpureap_services::remote::Fleet::new(&host, remote_backend.clone(), false)
                .map_err(UsageError)?
                .ok_or_else(|| UsageError("top -H: no host".to_string()))?;
            return Ok(gpureap::top::live::run_remote(fleet, &request)?);
        }
        let driver = open_driver_quietly(backend)?;
        Ok(gpureap::top::live::run(
            std::sync::Arc::from(driver),
            &request,
        )?)
    }
}

/// Asks on the terminal; refuses to go on without one unless --yes was given.
fn confirm(plan: &reap::FreeReport) -> Result<(), Failure> {
    if !can_ask() {
        return Err(UsageError(
            "refusing to signal without confirmation: stdin is not a terminal; pass --yes (see the plan with --dry-run)"
                .to_string(),
        )
        .into());
    }
    if ask(&format!("{}Proceed? [y/N] ", report::free_plan(plan)))? {
        Ok(())
    } else {
        Err(UsageError("aborted: nothing was signalled".to_string()).into())
    }
}

fn progress_bar(json: bool) -> Option<indicatif::ProgressBar> {
    if json || !io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.enable_steady_tick(Duration::from_millis(100));
    Some(bar)
}

fn wait(backend: &BackendChoice, args: &config::WaitRequest) -> Result<Exit, Failure> {
    let (driver, gpu) = config::gpu_names(open_driver(backend)?, &args.gpu)?;
    let args = &config::WaitRequest {
        gpu,
        ..args.clone()
    };
    let config = config::wait(args, gpu_count(driver.as_ref()))?;
    // Without a driver there is no memory figure to wait for: say so at once
    // rather than time out as if the GPUs were held.
    if let Some(why) = driver.unavailable() {
        return Err(
            anyhow::anyhow!("cannot wait: the driver reports no GPU memory ({why})").into(),
        );
    }
    let outcome = gpureap_core::wait::wait(
        driver.as_ref(),
        &config.gpus,
        config.below,
        config.timeout,
        config.keep_waiting,
    );
    let waited_ms = outcome.waited.as_millis() as u64;
    let busy = Some(outcome.busy());
    // The holders, read as `status` reads them: from the driver's lists where they explain
    // every GPU's memory, else from every process (`Snapshot::take_seen`).
    let holders = (!outcome.ready).then(|| Snapshot::take_seen(driver.as_ref()));
    if args.json {
        emit(&report::to_json(&report::WaitJson {
            schema_version: report::SCHEMA_VERSION,
            kind: "wait",
            ready: outcome.ready,
            waited_ms,
            below: config.below,
            gpus: &outcome.gpus,
            holders: holders
                .as_ref()
                .map(|snapshot| report::holders_json(snapshot, &busy))
                .unwrap_or_default(),
        }))?;
    } else {
        let mut text = report::wait_lines(&outcome.gpus, config.below, waited_ms);
        if let Some(snapshot) = &holders {
            text.push('\n');
            text.push_str(&report::status_table(snapshot, &busy));
        }
        emit(&text)?;
    }
    if let Some(lost) = outcome.failed().next() {
        eprintln!(
            "gpureap: cannot wait: GPU {}: {}; the driver cannot tell when it is free",
            lost.index,
            gpureap_core::units::one_line(
                &lost
                    .error
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            )
        );
        Ok(Exit::Incomplete)
    } else if outcome.ready {
        Ok(Exit::Success)
    } else if !outcome.held_by_no_process.is_empty() {
        for (index, reason) in &outcome.held_by_no_process {
            eprintln!("gpureap: GPU {index}: {reason}");
        }
        eprintln!(
            "gpureap: not waiting: whatever exits, that memory keeps the GPU at or above {} (--keep-waiting waits anyway)",
            gpureap_core::units::Bytes(config.below)
        );
        Ok(Exit::StillHeld)
    } else {
        // What no process holds is said as such; "listed above" only where
        // the table lists a holder of a GPU that was not ready.
        let (mut held, mut listed) = (Vec::new(), false);
        if let Some(snapshot) = &holders {
            held = gpureap_core::wait::held_by_no_process(snapshot, &outcome.gpus, config.below);
            listed = busy.iter().flatten().any(|&index| {
                snapshot
                    .gpu(index)
                    .is_some_and(|gpu| gpureap_services::metrics::holders(gpu) > 0)
            });
        }
        for (index, reason) in &held {
            eprintln!("gpureap: GPU {index}: {reason}");
        }
        eprintln!(
            "gpureap: timed out after {}{}",
            gpureap_core::units::Elapsed(outcome.waited),
            if listed {
                "; the holders are listed above"
            } else {
                ""
            }
        );
        Ok(Exit::StillHeld)
    }
}

fn run(backend: &BackendChoice, args: &RunArgs) -> Result<Exit, Failure> {
    let config = match config::run(args)? {
        config::RunRequest::Supervise(config) => config,
        config::RunRequest::Dump { state_dir } => return run_dump(&state_dir),
    };
    let driver = open_driver(backend)?;
    Ok(gpureap::run::supervise(&config, driver.as_ref())?)
}

/// `run --dump`: the supervisor's bundle, asked for and waited for.
fn run_dump(state_dir: &std::path::Path) -> Result<Exit, Failure> {
    use gpureap::run::ondemand::{self, RequestError};
    match ondemand::request(state_dir, ondemand::WAIT) {
        Ok(folders) => {
            let text: String = folders
                .iter()
                .map(|folder| format!("gpureap run: diagnostic bundle: {}\n", folder.display()))
                .collect();
            emit(&text)?;
            Ok(Exit::Success)
        }
        Err(error @ (RequestError::Refused(_) | RequestError::NoSupervisor(_))) => {
            Err(UsageError(error.to_string()).into())
        }
        Err(error) => Err(Failure::new(Exit::Incomplete, error)),
    }
}

// Monitoring: `exporter` and `check` (docs/monitoring.md).

fn exporter(backend: &BackendChoice, args: &gpureap::cli::ExporterArgs) -> Result<Exit, Failure> {
    let sources = config::SourcesRequest::new(&args.sources).sources()?;
    let driver = open_driver(backend)?;
    let config = gpureap::exporter::ExporterConfig {
        listen: args.listen,
        interval: args.interval,
        options: gpureap_services::metrics::Options {
            gpus: None,
            per_process: args.per_process,
        },
        sources,
    };
    Ok(gpureap::exporter::run(&config, driver)?)
}

/// `reap [--watch]`: the policy checked before the watch starts (exit 2).
fn reap_watch(backend: &BackendChoice, args: &gpureap::cli::ReapArgs) -> Result<Exit, Failure> {
    let (driver, gpu) = config::gpu_names(open_driver(backend)?, &args.gpu)?;
    let config = config::reap(args, &gpu, gpu_count(driver.as_ref()))?;
    Ok(gpureap::watch::run(&config, driver.as_ref())?)
}

fn check(backend: &BackendChoice, args: &gpureap::cli::CheckArgs) -> Result<Exit, Failure> {
    let sources = config::SourcesRequest::new(&args.sources).sources()?;
    // Its first line says there is no driver, once.
    let (driver, gpu) = config::gpu_names(open_driver_quietly(backend)?, &args.gpu)?;
    let gpus = config::gpus(&gpu, gpu_count(driver.as_ref()))?;
    let mut snapshot = Snapshot::take_listed(driver.as_ref());
    snapshot.attribute_containers(&sources);
    let indexes = snapshot.gpus.iter().map(|gpu| gpu.index).collect();
    let hardware = gpureap_core::driver::evidence::Hardware::gather(
        driver.as_ref(),
        &indexes,
        args.xids.drain_xids.0.clone(),
    );
    let verdict = gpureap::check::check(&snapshot, &gpus, &hardware);
    emit(&verdict.text())?;
    Ok(verdict.verdict.exit())
}

fn slurm(backend: &BackendChoice, command: &gpureap::cli::SlurmCommand) -> Result<Exit, Failure> {
    Ok(gpureap::slurm::main(backend, &config::slurm(command)))
}

/// `plan`: a snapshot of what the driver lists (none for a hypothetical
/// box): a plan weighs what the driver lists, so descriptors are read only
/// for those processes, and of the process tree only their families
/// (`Snapshot::take_listed_families`); then the plan, its report, and the
/// verdict's code.
fn plan(
    backend: &BackendChoice,
    config: &gpureap_services::plan::fit::PlanConfig,
) -> Result<Exit, Failure> {
    let snapshot = match config.hypothetical {
        Some(_) => None,
        None => {
            let driver = open_driver_quietly(backend)?;
            Some(Snapshot::take_listed_families(driver.as_ref()))
        }
    };
    let outcome = gpureap_services::plan::fit::evaluate(config, snapshot.as_ref())?;
    if config.json {
        emit_encoded(&gpureap_services::plan::render::json(&outcome))?;
    } else {
        emit(&gpureap_services::plan::render::text(&outcome))?;
    }
    Ok(outcome.exit())
}

/// `dump`: the processes in scope, chosen as `free` chooses (nothing is
/// signalled), their stacks and the bundle; the folder and where they wait
/// are printed.
fn dump(backend: &BackendChoice, request: &config::DumpRequest) -> Result<Exit, Failure> {
    // gpu.txt says itself when there is no driver.
    let (driver, gpu) = config::gpu_names(open_driver_quietly(backend)?, &request.gpu)?;
    let request = &config::DumpRequest {
        gpu,
        ..request.clone()
    };
    let gpu_count = gpu_count(driver.as_ref());
    config::gpus(&request.gpu, gpu_count)?;
    let named = request.pid.iter().copied().collect();
    let snapshot = Snapshot::take_focused(driver.as_ref(), &named);
    let guard = Guard::for_this_process(&[]);
    let scope = config::dump_scope(request, gpu_count, &snapshot, &guard)?;
    let pids: std::collections::BTreeSet<u32> =
        gpureap_core::select::select(&snapshot, &scope, &guard)
            .targets
            .into_keys()
            .collect();
    let mut asked: Vec<String> = request
        .pid
        .iter()
        .map(|pid| format!("--pid {pid}"))
        .collect();
    asked.extend(
        request
            .patterns
            .iter()
            .map(|regex| format!("--match {regex}")),
    );
    if let Some(gpus) = &scope.gpus {
        let gpus: Vec<String> = gpus.iter().map(u32::to_string).collect();
        asked.push(format!("--gpu {}", gpus.join(",")));
    }
    let asked = asked.join(" ");
    if pids.is_empty() {
        return Err(UsageError(format!(
            "nothing to dump: no process is in scope of {}; --match and --gpu take GPU users (see `gpureap status`), --pid any process",
            gpureap_core::units::one_line(&asked)
        ))
        .into());
    }
    match gpureap::dump::write(&snapshot, &pids, &request.out, &asked) {
        Ok(dumped) => {
            let mut text = format!(
                "gpureap dump: {} process(es): {}\nstacks: {}\n",
                dumped.processes,
                dumped.folder.display(),
                dumped.stacks.summary
            );
            for note in &dumped.stacks.notes {
                text.push_str(&format!("note: {note}\n"));
            }
            emit(&text)?;
            Ok(Exit::Success)
        }
        Err(error @ gpureap::dump::DumpError::Refused { .. }) => {
            Err(UsageError(error.to_string()).into())
        }
        Err(error) => Err(Failure::new(Exit::Incomplete, error)),
    }
}

fn reset(backend: &BackendChoice, args: &gpureap::cli::ResetArgs) -> Result<Exit, Failure> {
    if let Some(instances) = config::names_instances(&args.gpu) {
        return Err(UsageError(format!(
            "reset resets whole GPUs, every MIG instance on them: name the GPU, not the instance {instances} (docs/mig.md)"
        ))
        .into());
    }
    let (driver, gpu) = config::gpu_names(open_driver(backend)?, &args.gpu)?;
    // --gpu is required (clap): `None` cannot come back.
    let gpus = config::named_gpus(&gpu, gpu_count(driver.as_ref()))?
        .ok_or_else(|| UsageError("--gpu is required".to_string()))?;
    if args.plan {
        let snapshot = Snapshot::take(driver.as_ref());
        let platform = driver.platform();
        let plans: Vec<_> = gpus
            .iter()
            .map(|&index| gpureap_core::reset::plan(driver.as_ref(), &snapshot, &platform, index))
            .collect();
        let code = gpureap_core::reset::plan_exit(&plans);
        if args.json {
            emit(&format!(
                "{}\n",
                gpureap_core::report::reset_plan_json(&plans, code)
            ))?;
        } else {
            emit(&plans.iter().map(ToString::to_string).collect::<String>())?;
        }
        return Ok(code);
    }
    let outcomes: Vec<_> = gpus
        .iter()
        .map(|&index| gpureap_core::reset::reset(driver.as_ref(), index))
        .collect();
    emit(
        &outcomes
            .iter()
            .map(|outcome| format!("{outcome}\n"))
            .collect::<String>(),
    )?;
    Ok(gpureap_core::reset::exit(&outcomes))
}
