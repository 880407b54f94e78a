//! The gpureap binary: parse the flags, dispatch each command to one function (a front end's
//! for status, free, wait, reset, check and dump, with -H the fleet's; one here for the others), exit with
//! the code it returns.

use std::io::{self, BufRead, IsTerminal};

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

use gpureap::cli::{Cli, Command, RunArgs};
use gpureap::config;
use gpureap::fleet;
use gpureap_core::driver::BackendChoice;
use gpureap_core::exit::{Exit, Failure};
use gpureap_core::snapshot::Snapshot;
use gpureap_core::stdout::{emit, emit_encoded};
use gpureap_services::request::{self, UsageError};

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
            let request = config::status(args);
            match fleet(&args.fleet, &remote_backend, args.json) {
                Ok(Some(fleet)) => fleet_output(fleet::commands::status(&fleet, &request)),
                Ok(None) => gpureap::status::status(&cli.backend, &request),
                Err(error) => Err(error),
            }
        }
        Command::Free(args) => match fleet(&args.fleet, &remote_backend, args.json)
            .and_then(|fleet| Ok((fleet, config::free(args)?)))
        {
            Ok((Some(fleet), request)) => fleet_output(fleet::commands::free(
                &fleet,
                &request,
                ask_fleet,
                can_ask(),
            )),
            Ok((None, request)) => gpureap::free::free(&cli.backend, &request, confirm),
            Err(error) => Err(error),
        },
        Command::Wait(args) => {
            let request = config::wait(args);
            match fleet(&args.fleet, &remote_backend, args.json) {
                Ok(Some(fleet)) => fleet_output(fleet::commands::wait(&fleet, &request)),
                Ok(None) => gpureap::waiting::wait(&cli.backend, &request),
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
        Command::Check(args) => gpureap::check::main(&cli.backend, &config::check(args)),
        Command::Slurm(command) => slurm(&cli.backend, command),
        Command::Reset(args) => gpureap::resetting::reset(&cli.backend, &config::reset(args)),
        Command::Dump(args) => gpureap::dump::dump(&cli.backend, &config::dump(args)),
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

/// Asks on the terminal; refuses to go on without one unless --yes was given.
fn confirm(question: &str) -> Result<(), Failure> {
    if !can_ask() {
        return Err(UsageError(
            "refusing to signal without confirmation: stdin is not a terminal; pass --yes (see the plan with --dry-run)"
                .to_string(),
        )
        .into());
    }
    if ask(question)? {
        Ok(())
    } else {
        Err(UsageError("aborted: nothing was signalled".to_string()).into())
    }
}

/// `demo --top`: the crashed host staged, shown in the live view.
#[cfg(feature = "top")]
fn demo_top() -> Result<Exit, Failure> {
    gpureap::top::terminal()?;
    gpureap::demo::staged_for(|driver| gpureap::top::live::run(driver, &config::top_demo()))
        .map_err(Failure::from)
}

#[cfg(not(feature = "top"))]
fn demo_top() -> Result<Exit, Failure> {
    Err(gpureap::top::without_live_view())
}

fn top(
    backend: &BackendChoice,
    args: &gpureap::cli::TopArgs,
    remote_backend: &Option<String>,
) -> Result<Exit, Failure> {
    let request = config::top(args);
    let host = config::top_host(args)?;
    gpureap::top::main(backend, &request, host, remote_backend)
}

fn run(backend: &BackendChoice, args: &RunArgs) -> Result<Exit, Failure> {
    let config = match config::run(args)? {
        config::RunRequest::Supervise(config) => config,
        config::RunRequest::Dump { state_dir } => return run_dump(&state_dir),
    };
    let driver = request::open_driver(backend)?;
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
    let sources = config::sources_request(&args.sources).sources()?;
    let driver = request::open_driver(backend)?;
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
    let (driver, gpu) = request::gpu_names(request::open_driver(backend)?, &args.gpu)?;
    let config = config::reap(args, &gpu, request::gpu_count(driver.as_ref()))?;
    Ok(gpureap::watch::run(&config, driver.as_ref())?)
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
            let driver = request::open_driver_quietly(backend)?;
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
