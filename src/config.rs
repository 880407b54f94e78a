//! From typed flags to what the program acts on: each command's request
//! (the services' `request` types, which the front ends take) made from its
//! flags once, and the rules that involve several flags. The rules that
//! involve the host (GPU indexes the driver reports, PIDs that exist, user
//! names) are `request`'s. Every error here is the user's input, said
//! plainly, and ends the run with exit code 2 before anything is signalled.

use std::time::Duration;

use crate::cli::{
    CheckArgs, DumpArgs, FreeArgs, HostsArgs, PlanArgs, PushArgs, ReapArgs, ResetArgs, RestartArg,
    RunArgs, SignalArgs, SlurmCommand, SlurmCommonArgs, SourcesArgs, StatusArgs, TopArgs, WaitArgs,
};
use crate::file::NotRead;
use crate::hostlist;
use crate::members::Wanted;
use crate::plan::fit::{Hypothetical, Overrides, PlanConfig};
use crate::reap::Options;
use crate::remote::{DEFAULT_REMOTE_BIN, FleetConfig};
use crate::request::{
    self, CheckRequest, DumpRequest, FreeRequest, ResetRequest, Signalling, SourcesRequest,
    StatusRequest, TopRequest, UsageError, WaitRequest,
};
use crate::run::ready::Readiness;
use crate::run::{Restart, RunConfig};
use crate::slurm;
use crate::units::GpuList;

/// `--host-root` and `--kubelet-socket` as given: checked and made into
/// `container::Sources` on the host that reads them
/// (`SourcesRequest::sources`); `-H` passes them on as they are
/// (`fleet::commands::sources_flags`).
pub fn sources_request(args: &SourcesArgs) -> SourcesRequest {
    let SourcesArgs {
        host_root,
        kubelet_socket,
    } = args;
    SourcesRequest {
        host_root: host_root.clone(),
        kubelet_socket: kubelet_socket.clone(),
    }
}

/// `--grace`, `--timeout` and `--protect` typed (`cli::SignalArgs`): the
/// one conversion for `free` (here and on each host of `-H`), the frees
/// `top` starts and `reap`'s.
pub fn signalling(args: &SignalArgs) -> Signalling {
    let SignalArgs {
        grace,
        timeout,
        protect,
    } = args;
    Signalling {
        options: Options::new(*grace, *timeout),
        protect: protect.clone(),
    }
}

/// What `status` was asked: the one config of `status`, here and with `-H`.
pub fn status(args: &StatusArgs) -> StatusRequest {
    let StatusArgs {
        gpu,
        tree,
        json,
        prometheus,
        per_process,
        monitors,
        sources: given,
        fleet: _,
    } = args;
    StatusRequest {
        gpu: gpu.clone(),
        tree: *tree,
        json: *json,
        prometheus: *prometheus,
        per_process: *per_process,
        monitors: *monitors,
        sources: sources_request(given),
    }
}

/// What `free` was asked: the flags of `free` that need neither the driver
/// nor /proc checked (the scope is not empty).
pub fn free(args: &FreeArgs) -> Result<FreeRequest, UsageError> {
    // Every flag, named: one added to `free` must be carried here, and
    // from here to the hosts of `-H` (`fleet::commands::free_flags`).
    let FreeArgs {
        gpu,
        pid,
        patterns,
        user,
        orphans,
        stale_runs,
        container,
        pod,
        cgroup,
        mps_server,
        all,
        signal,
        dry_run,
        yes,
        json,
        sources: given,
        fleet: _,
    } = args;
    let Signalling { options, protect } = signalling(signal);
    let cgroups = container
        .iter()
        .cloned()
        .map(Wanted::Container)
        .chain(pod.iter().cloned().map(Wanted::Pod))
        .chain(cgroup.iter().cloned().map(Wanted::Cgroup))
        .collect();
    let request = FreeRequest {
        gpu: gpu.clone(),
        pid: pid.clone(),
        patterns: patterns.clone(),
        user: user.clone(),
        orphans: *orphans,
        stale_runs: *stale_runs,
        cgroups,
        mps_server: mps_server.clone(),
        all: *all,
        options,
        protect,
        dry_run: *dry_run,
        yes: *yes,
        json: *json,
        sources: sources_request(given),
    };
    request::check_scope(&request)?;
    Ok(request)
}

/// What `top` was asked: the view's refresh and the options of the frees it starts.
pub fn top(args: &TopArgs) -> TopRequest {
    let Signalling { options, protect } = signalling(&args.signal);
    TopRequest {
        readonly: args.readonly,
        interval: args.interval,
        protect,
        options,
        json: args.json,
    }
}

/// `gpureap demo --top`: `gpureap top` as given no flag.
pub fn top_demo() -> TopRequest {
    top(&crate::cli::defaults::<TopArgs>())
}

/// What `wait` was asked: the one config of `wait`, here and with `-H`.
pub fn wait(args: &WaitArgs) -> WaitRequest {
    let WaitArgs {
        gpu,
        below,
        timeout,
        keep_waiting,
        json,
        fleet: _,
    } = args;
    WaitRequest {
        gpu: gpu.clone(),
        below: *below,
        timeout: *timeout,
        keep_waiting: *keep_waiting,
        json: *json,
    }
}

/// What `check` was asked: the GPUs, the Xids that make a problem, where
/// the node's containers are read.
pub fn check(args: &CheckArgs) -> CheckRequest {
    let CheckArgs { gpu, xids, sources } = args;
    CheckRequest {
        gpu: gpu.clone(),
        drain_xids: xids.drain_xids.0.clone(),
        sources: sources_request(sources),
    }
}

/// What `reset` was asked: whole GPUs, each reset or (`--plan`) planned.
pub fn reset(args: &ResetArgs) -> ResetRequest {
    let ResetArgs { gpu, plan, json } = args;
    ResetRequest {
        gpu: gpu.clone(),
        plan: *plan,
        json: *json,
    }
}

/// The hosts of `-H`: several lists are their union, in order, each host once.
pub fn fleet(args: &HostsArgs) -> Result<FleetConfig, UsageError> {
    let HostsArgs {
        hosts,
        ssh,
        remote_bin,
        parallel,
        connect_timeout,
        host_timeout,
    } = args;
    let mut names = Vec::new();
    if !hosts.is_empty() {
        let named: Vec<String> = hosts
            .iter()
            .flat_map(|list| list.0.iter().cloned())
            .collect();
        hostlist::one_user_each(&named)?;
        names = hostlist::unique(named);
        if names.len() > hostlist::MAX_HOSTS {
            return Err(UsageError(format!(
                "the host lists name more than {} hosts: check their ranges",
                hostlist::MAX_HOSTS
            )));
        }
    }
    Ok(FleetConfig {
        hosts: names,
        ssh: ssh.clone(),
        remote_bin: remote_bin.clone(),
        parallel: *parallel,
        connect_timeout: *connect_timeout,
        host_timeout: *host_timeout,
    })
}

/// What `push` was asked, checked: it installs at `--to`, so a
/// `--remote-bin` (the gpureap the other commands run) is refused.
#[derive(Debug, Clone)]
pub struct PushConfig {
    /// The binary to push; `None` for this gpureap.
    pub bin: Option<std::path::PathBuf>,
    pub to: Option<String>,
    pub force: bool,
    pub json: bool,
}

pub fn push(args: &PushArgs) -> Result<PushConfig, UsageError> {
    if args.fleet.remote_bin != DEFAULT_REMOTE_BIN {
        return Err(UsageError(
            "push takes --to PATH (where to install), not --remote-bin".into(),
        ));
    }
    Ok(PushConfig {
        bin: args.bin.clone(),
        to: args.to.clone(),
        force: args.force,
        json: args.json,
    })
}

/// `reap`'s flags as its typed config. `gpu_count` resolves `--gpu`; user
/// names are resolved on this host; `--log` is checked (never through a
/// link, a plain file of ours) before anything runs.
/// `gpu`: `--gpu` as `gpu_names` resolved it against the driver (indexes,
/// the watch then looking through the instances' view where some are named).
pub fn reap(
    args: &ReapArgs,
    gpu: &[GpuList],
    gpu_count: u32,
) -> Result<crate::watch::ReapConfig, UsageError> {
    use crate::watch::Rule;
    let ReapArgs {
        watch,
        config: _,
        orphans,
        supervisor_gone,
        slurm_ended,
        patterns,
        user,
        gpu: _,
        older_than,
        interval,
        signal,
        max_share,
        enforce,
        log,
        listen,
        scontrol,
        container_gone,
        sources,
    } = args;
    let rules: Vec<Rule> = [
        (*orphans, Rule::Orphaned),
        (*supervisor_gone, Rule::SupervisorGone),
        (*slurm_ended, Rule::SlurmEnded),
        (*container_gone, Rule::ContainerGone),
    ]
    .into_iter()
    .filter_map(|(given, rule)| given.then_some(rule))
    .collect();
    if rules.is_empty() {
        return Err(UsageError(
            "reap needs a rule: one or more of --orphans, --supervisor-gone, --slurm-ended, --container-gone (or their keys in --config)"
                .to_string(),
        ));
    }
    let gpus = request::named_gpus(gpu, gpu_count)?;
    let signal = signalling(signal);
    if let Some(path) = log {
        crate::file::LogFile::check(path).map_err(|error| UsageError(error.to_string()))?;
    }
    Ok(crate::watch::ReapConfig {
        watch: *watch,
        rules,
        patterns: patterns.clone(),
        uids: request::uids_of(user)?,
        gpus,
        older_than: *older_than,
        interval: *interval,
        options: signal.options,
        protect: signal.protect,
        max_share: *max_share,
        enforce: *enforce,
        log: log.clone(),
        listen: *listen,
        scontrol: scontrol.clone(),
        sources: sources_request(sources).sources()?,
    })
}

/// How much of a `reap --config` file is read: a policy is a few lines.
const CONFIG_MAX: u64 = 1 << 20;

/// The command line with `reap --config FILE`'s keys put in as flags, right
/// after `reap`, so that flags typed after them win and every value goes
/// through the same parser: `key = true` is `--key`, `key = false` is left
/// out, a string or a number is `--key=VALUE`, an array repeats the flag.
/// `config` is not a key.
///
/// The file is root's policy: read by the one rule of a path root may trust
/// (`file::read_trusted`, at most `CONFIG_MAX` bytes). A file that is not
/// TOML is named with the line where it stops being TOML and nothing of
/// its text: it may be any file root can read (`/etc/shadow`,
/// `/proc/self/environ`), as a host file's bad line is not shown either.
pub fn reap_argv(
    argv: &[std::ffi::OsString],
    file: &std::path::Path,
) -> Result<Vec<std::ffi::OsString>, UsageError> {
    let shown = file.display().to_string();
    let (_, bytes) = crate::file::read_trusted(file, CONFIG_MAX).map_err(|error| match error {
        NotRead::Untrusted(why) => UsageError(format!(
            "refusing --config {shown}: {why}; give --config a file only you or root can write, in directories only you or root can write"
        )),
        NotRead::Unreadable(why) => UsageError(format!("--config {shown}: {why}")),
    })?;
    let text = String::from_utf8(bytes)
        .map_err(|_| UsageError(format!("--config {shown}: not UTF-8 text")))?;
    let table: toml::Table = text.parse().map_err(|error: toml::de::Error| {
        let line = error.span().map_or(1, |span| {
            text[..span.start.min(text.len())].matches('\n').count() + 1
        });
        UsageError(format!(
            "--config {shown}: not TOML at line {line} (the file is not shown)"
        ))
    })?;
    let mut flags: Vec<std::ffi::OsString> = Vec::new();
    for (key, value) in &table {
        if key == "config" || key.starts_with('-') {
            return Err(UsageError(format!(
                "--config {shown}: '{key}' is not a key of the file: give --{key} on the command line"
            )));
        }
        let values = match value {
            toml::Value::Array(items) => items.iter().collect(),
            _ => vec![value],
        };
        for value in values {
            match value {
                toml::Value::Boolean(true) => flags.push(format!("--{key}").into()),
                toml::Value::Boolean(false) => {}
                toml::Value::String(text) => flags.push(format!("--{key}={text}").into()),
                toml::Value::Integer(n) => flags.push(format!("--{key}={n}").into()),
                toml::Value::Float(x) => flags.push(format!("--{key}={x}").into()),
                _ => {
                    return Err(UsageError(format!(
                        "--config {shown}: '{key}' must be true, a string, a number, or an array of those"
                    )));
                }
            }
        }
    }
    // Checked alone first, so that an error names the file.
    let alone = [
        std::ffi::OsString::from("gpureap"),
        "reap".into(),
        "--watch".into(),
    ]
    .into_iter()
    .chain(flags.iter().cloned());
    if let Err(error) = <crate::cli::Cli as clap::Parser>::try_parse_from(alone) {
        let text = error.to_string();
        let first = text
            .lines()
            .next()
            .unwrap_or("")
            .trim_start_matches("error: ");
        return Err(UsageError(format!("--config {shown}: {first}")));
    }
    let at = argv
        .iter()
        .enumerate()
        .position(|(index, arg)| arg == "reap" && (index == 0 || argv[index - 1] != "--backend"))
        .ok_or_else(|| UsageError("reap --config: no `reap` on the command line".to_string()))?;
    let mut merged = argv[..=at].to_vec();
    merged.extend(flags);
    merged.extend_from_slice(&argv[at + 1..]);
    Ok(merged)
}

/// `top -H`'s host: one, never a list (the view shows one host); and not
/// with `--json`, which is the host's side of it.
pub fn top_host(args: &crate::cli::TopArgs) -> Result<Option<FleetConfig>, UsageError> {
    let hosts = fleet(&args.fleet)?;
    match hosts.hosts.len() {
        0 => Ok(None),
        _ if args.json => Err(UsageError(
            "top --json writes this host's documents: run it on the host (ssh HOST gpureap top --json)"
                .to_string(),
        )),
        1 => Ok(Some(hosts)),
        count => Err(UsageError(format!(
            "top -H shows one host, and this names {count}: give one host (for many, use gpureap status -H LIST)"
        ))),
    }
}

/// Where the server's program is, as `exec` will find it: a path as given,
/// or the first executable of that name on PATH. Checked before anything is
/// started, so that a typo is reported as one and not as a containment
/// failure.
fn find_program(program: &str) -> Result<std::path::PathBuf, UsageError> {
    use crate::file::executable;
    if program.contains('/') {
        let path = std::path::PathBuf::from(program);
        return if executable(&path) {
            Ok(path)
        } else if path.exists() {
            Err(UsageError(format!(
                "cannot start the server: {program} is not an executable file"
            )))
        } else {
            Err(UsageError(format!(
                "cannot start the server: {program} does not exist"
            )))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate))
        .ok_or_else(|| {
            UsageError(format!(
                "cannot start the server: no program named '{program}' on PATH"
            ))
        })
}

/// What `gpureap run` was asked: to supervise a server, or (`--dump`) to
/// ask the supervisor of a state directory for a bundle.
pub enum RunRequest {
    Supervise(Box<RunConfig>),
    Dump { state_dir: std::path::PathBuf },
}

pub fn run(args: &RunArgs) -> Result<RunRequest, UsageError> {
    if args.dump {
        let state_dir = match (&args.state_dir, args.command.is_empty()) {
            (Some(dir), _) => dir.clone(),
            (None, false) => default_state_dir(&args.command),
            (None, true) => {
                return Err(UsageError(
                    "run --dump needs the supervisor's state directory: --state-dir DIR, or the server's command after -- as it was started".to_string(),
                ));
            }
        };
        return Ok(RunRequest::Dump { state_dir });
    }
    supervise(args).map(|config| RunRequest::Supervise(Box::new(config)))
}

fn supervise(args: &RunArgs) -> Result<RunConfig, UsageError> {
    // Every flag, named: one added to `run` must be carried into its config.
    let RunArgs {
        ready_url,
        ready_port,
        ready_log,
        startup_timeout,
        stall_timeout,
        health_interval,
        restart,
        max_restarts,
        backoff,
        grace,
        stop_timeout,
        log,
        state_dir,
        no_cgroup,
        metrics,
        plan,
        wait_for_fit,
        accept_shrink,
        // `run` above: a dump supervises nothing.
        dump: _,
        command,
    } = args;
    if let Some(program) = command.first() {
        find_program(program)?;
    }
    let plan = plan.then(|| run_plan(command, *wait_for_fit, *accept_shrink));
    let readiness = if let Some(url) = ready_url {
        Readiness::Url(url.clone())
    } else if let Some(port) = ready_port {
        Readiness::Port(*port)
    } else if let Some(regex) = ready_log {
        Readiness::Log(regex.clone())
    } else {
        Readiness::Started
    };
    let state_dir = match state_dir {
        Some(dir) => dir.clone(),
        None => default_state_dir(command),
    };
    Ok(RunConfig {
        command: command.clone(),
        readiness,
        startup_timeout: *startup_timeout,
        stall_timeout: *stall_timeout,
        health_interval: *health_interval,
        restart: match restart {
            RestartArg::Never => Restart::Never,
            RestartArg::OnFailure => Restart::OnFailure,
            RestartArg::Always => Restart::Always,
        },
        max_restarts: *max_restarts,
        backoff: *backoff,
        grace: *grace,
        stop_timeout: *stop_timeout,
        log: log.clone(),
        state_dir,
        allow_cgroup: !no_cgroup,
        metrics: *metrics,
        plan,
    })
}

/// `run --plan`: the server's command line planned as `gpureap plan --
/// COMMAND` would plan it here, with this environment (the server inherits
/// it), and what to do while others' memory is in the way.
fn run_plan(
    command: &[String],
    wait_for_fit: Option<Duration>,
    accept_shrink: bool,
) -> crate::run::plan::PlanGate {
    use crate::run::plan::{PlanGate, WhenHeld};
    let when_held = match (wait_for_fit, accept_shrink) {
        (Some(limit), _) => WhenHeld::WaitForFit(limit),
        (None, true) => WhenHeld::AcceptShrink,
        (None, false) => WhenHeld::Refuse,
    };
    PlanGate {
        plan: PlanConfig::of_command(command.to_vec(), std::env::vars().collect()),
        when_held,
    }
}

/// What `gpureap dump` was asked, typed; its scope is made against the
/// host (`request::dump_scope`).
pub fn dump(args: &DumpArgs) -> DumpRequest {
    let DumpArgs {
        pid,
        patterns,
        gpu,
        out,
    } = args;
    DumpRequest {
        pid: pid.clone(),
        patterns: patterns.clone(),
        gpu: gpu.clone(),
        out: out
            .clone()
            .unwrap_or_else(|| state_base().join("gpureap").join("dumps")),
    }
}

/// `$XDG_STATE_HOME`, else `~/.local/state`, else `/var/lib`.
fn state_base() -> std::path::PathBuf {
    std::env::var_os("XDG_STATE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".local/state"))
        })
        .unwrap_or_else(|| std::path::PathBuf::from("/var/lib"))
}

/// One state directory per command line, so that each server is compared
/// with its own good starts.
fn default_state_dir(command: &[String]) -> std::path::PathBuf {
    let base = state_base();
    let line = command.join(" ");
    let readable: String = line
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(60)
        .collect();
    // The name is cut short; the hash keeps commands that differ only late
    // (--tp 4 and --tp 8) apart. FNV-1a: stable across builds and versions.
    let hash = line.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    base.join("gpureap").join(format!("{readable}-{hash:016x}"))
}

/// What `plan` was asked, typed: the engine's command line with this
/// process's environment (CUDA_VISIBLE_DEVICES, the Hugging Face cache
/// variables), the averages, and each step the user overrides. The command
/// line itself is the engine's, read by `plan::launch`.
pub fn plan(args: &PlanArgs) -> Result<PlanConfig, UsageError> {
    let PlanArgs {
        avg_prompt,
        avg_output,
        concurrency,
        gpu_memory,
        gpus,
        gpu_free,
        weights,
        kv_memory,
        host_memory,
        from_log,
        model_config,
        engine_version,
        json,
        // `-H`: the hosts each plan there (`fleet::commands::plan`).
        fleet: _,
        command,
    } = args;
    if command.is_empty() {
        return Err(UsageError(
            "plan needs the engine's command line after --, like: gpureap plan -- vllm serve MODEL"
                .to_string(),
        ));
    }
    // Either average alone still counts: the incident's 4,100 was the answer alone.
    let averages = (avg_prompt.is_some() || avg_output.is_some())
        .then(|| (avg_prompt.unwrap_or(0), avg_output.unwrap_or(0)));
    Ok(PlanConfig {
        command: command.clone(),
        env: std::env::vars().collect(),
        averages,
        concurrency: *concurrency,
        hypothetical: gpu_memory.map(|gpu_memory| Hypothetical {
            gpu_memory,
            gpus: *gpus,
        }),
        overrides: Overrides {
            gpu_free: *gpu_free,
            weights: *weights,
            kv_memory: *kv_memory,
            host_memory: *host_memory,
        },
        from_log: from_log.clone(),
        model_config: model_config.clone(),
        engine_version: engine_version.clone(),
        json: *json,
    })
}

/// The Slurm hook asked for, typed.
pub fn slurm(command: &SlurmCommand) -> slurm::Hook {
    let common = |args: &SlurmCommonArgs| slurm::CommonConfig {
        scontrol: args.scontrol.clone(),
        log: args.log.clone(),
        dry_run: args.dry_run,
        timeout: args.timeout,
    };
    match command {
        SlurmCommand::Epilog(args) => slurm::Hook::Epilog(slurm::EpilogConfig {
            common: common(&args.common),
            grace: args.grace,
            reset: args.reset,
        }),
        SlurmCommand::Prolog(args) => slurm::Hook::Prolog(slurm::PrologConfig {
            common: common(&args.common),
            wait: args.wait,
        }),
        SlurmCommand::Healthcheck(args) => slurm::Hook::Healthcheck(slurm::HealthcheckConfig {
            common: common(&args.common),
            node: args.node.clone(),
            reset: args.reset,
            drain_xids: args.xids.drain_xids.0.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use crate::exit::{Exit, Failure};
    use crate::request::UsageError;

    /// Every command that frees as `free` does (`free`, the frees `top` and
    /// `demo --top` start, `reap`) frees alike given no flag: 5s of grace,
    /// 30s to verify, nothing protected beyond the fixed rules. Any other
    /// command taking `--grace` keeps a default of its own only where
    /// listed here, for the reason given.
    #[test]
    fn every_command_that_frees_has_the_same_defaults() {
        use crate::cli::{Cli, Command};
        use crate::reap::Options;
        use crate::request::Signalling;
        use clap::{CommandFactory, Parser};
        use std::time::Duration;

        let parse = |line: &str| {
            Cli::try_parse_from(line.split_whitespace())
                .unwrap_or_else(|error| panic!("{line}: {error}"))
                .command
        };
        let Command::Free(free) = parse("gpureap free --all") else {
            unreachable!()
        };
        let free = super::free(&free).expect("a scope");
        let Command::Top(top) = parse("gpureap top") else {
            unreachable!()
        };
        let top = super::top(&top);
        let demo = super::top_demo();
        let Command::Reap(reap) = parse("gpureap reap --orphans") else {
            unreachable!()
        };
        let reap = super::reap(&reap, &[], 0).expect("a rule");
        let expected = Signalling {
            options: Options::new(Duration::from_secs(5), Duration::from_secs(30)),
            protect: Vec::new(),
        };
        for (command, options, protect) in [
            ("free", free.options, &free.protect),
            ("top", top.options, &top.protect),
            ("demo --top", demo.options, &demo.protect),
            ("reap", reap.options, &reap.protect),
        ] {
            let got = Signalling {
                options,
                protect: protect.clone(),
            };
            assert_eq!(got, expected, "{command} given no flag");
        }
        assert_eq!(format!("{demo:?}"), format!("{top:?}"), "demo --top is top");

        // Each command's --grace, --timeout and --protect as `--help` shows them.
        fn defaults(command: &clap::Command) -> Vec<(String, Vec<String>)> {
            ["grace", "timeout", "protect"]
                .into_iter()
                .filter_map(|id| command.get_arguments().find(|arg| arg.get_id() == id))
                .map(|arg| {
                    let values = arg.get_default_values().iter();
                    let values = values.map(|value| value.to_string_lossy().into_owned());
                    (arg.get_id().to_string(), values.collect())
                })
                .collect()
        }
        fn walk(command: &clap::Command, path: &str, found: &mut Vec<(String, clap::Command)>) {
            for sub in command.get_subcommands() {
                let path = format!("{path} {}", sub.get_name()).trim().to_string();
                if sub.get_arguments().any(|arg| arg.get_id() == "grace") {
                    found.push((path.clone(), sub.clone()));
                }
                walk(sub, &path, found);
            }
        }
        let mut cli = Cli::command();
        cli.build();
        let mut taking_grace = Vec::new();
        walk(&cli, "", &mut taking_grace);
        let shared = defaults(cli.find_subcommand("free").expect("free"));
        assert_eq!(shared.len(), 3, "free takes the group: {shared:?}");
        // A server stopping (`run`) gets longer; a job's leftovers within the
        // epilog's budget (`slurm epilog`, whose --timeout is the budget) less.
        let own = ["run", "slurm epilog"];
        let mut sharing = Vec::new();
        for (path, command) in &taking_grace {
            if own.contains(&path.as_str()) {
                continue;
            }
            assert_eq!(
                defaults(command),
                shared,
                "`gpureap {path}` takes --grace with defaults of its own: flatten cli::SignalArgs"
            );
            sharing.push(path.as_str());
        }
        assert_eq!(sharing, ["free", "top", "reap"]);
    }

    #[test]
    fn bad_usage_is_its_own_class() {
        let failure = Failure::from(UsageError("no such GPU".to_string()));
        assert_eq!(failure.class(), Exit::Usage);
        assert_eq!(failure.error().to_string(), "no such GPU");
    }
}
