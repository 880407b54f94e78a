//! `status`, `free`, `wait` and `plan` across a fleet: the flags each host
//! gets, the time each may take, and for `free` the plan shown (and asked
//! about) once before any host signals anything.

use std::time::{Duration, Instant};

use crate::exit::Exit;
use crate::plan::fit::{Hypothetical, Overrides, PlanConfig};
use crate::remote::render;
use crate::remote::{Fleet, HostResult, duration_arg, fleet_json, gpu_args, remaining, worst};
use crate::request::{FreeRequest, SourcesRequest, StatusRequest, UsageError, WaitRequest};

/// What a fleet command prints, and its exit code.
pub struct Output {
    pub text: String,
    pub exit: Exit,
}

pub fn status(fleet: &Fleet, request: &StatusRequest) -> Result<Output, UsageError> {
    let StatusRequest {
        gpu,
        tree,
        json,
        prometheus,
        // Only with --prometheus, which is refused here.
        per_process: _,
        monitors,
        sources,
    } = request;
    if *tree {
        return Err(UsageError(
            "--tree shows one host's process trees: run `gpureap status --tree` on that host (ssh HOST gpureap status --tree)"
                .to_string(),
        ));
    }
    if *prometheus {
        return Err(UsageError(
            "--prometheus is one host's metrics: run `gpureap exporter` on each host and let Prometheus scrape them (docs/monitoring.md)"
                .to_string(),
        ));
    }
    let remote = fleet.remote_args("status", status_flags(gpu, sources, *monitors));
    let limit = fleet.limit(Duration::ZERO);
    let results = fleet.fan_out("status", &fleet.hosts, |_| (remote.clone(), limit));
    Ok(finish(&results, *json, "status", render::status))
}

pub fn wait(fleet: &Fleet, request: &WaitRequest) -> Result<Output, UsageError> {
    // One deadline for the whole fleet: a host started late gets what is left.
    let deadline = Instant::now() + request.timeout;
    let results = fleet.fan_out("wait", &fleet.hosts, |_| {
        let left = remaining(deadline);
        (
            fleet.remote_args("wait", wait_flags(request, left)),
            fleet.limit(left),
        )
    });
    Ok(finish(&results, request.json, "wait", render::wait))
}

/// The flags of `wait` each host gets, from the one config of `wait`: the
/// host waits for what is `left` of the fleet's deadline. Every field is
/// named, so that one added to `wait` cannot be left behind here.
pub fn wait_flags(request: &WaitRequest, left: Duration) -> Vec<String> {
    let WaitRequest {
        gpu,
        below,
        // The fleet's deadline, of which each host gets what is left.
        timeout: _,
        keep_waiting,
        // Each host answers in JSON (`Fleet::remote_args`); this side renders.
        json: _,
    } = request;
    let mut flags = gpu_args(gpu);
    flags.extend([
        "--below".to_string(),
        below.to_string(),
        "--timeout".to_string(),
        duration_arg(left),
    ]);
    if *keep_waiting {
        flags.push("--keep-waiting".to_string());
    }
    flags
}

/// `free -H`: every host plans (`--dry-run`), the plan is shown and asked
/// about once, then the hosts that planned free for real, each verifying
/// on its own driver.
pub fn free(
    fleet: &Fleet,
    args: &FreeRequest,
    confirm: impl FnOnce(&str) -> Result<(), UsageError>,
    ask_possible: bool,
) -> Result<Output, UsageError> {
    if !args.pid.is_empty() && fleet.hosts.len() > 1 {
        return Err(UsageError(
            "--pid names a process on one host: with --pid, give a single host to -H".to_string(),
        ));
    }
    if !args.dry_run && !args.yes && !ask_possible {
        return Err(UsageError(
            "refusing to signal on the hosts without confirmation: stdin is not a terminal; pass --yes (see the plan with --dry-run)"
                .to_string(),
        ));
    }
    let flags = free_flags(args);
    let plan_args = {
        let mut plan = flags.clone();
        plan.push("--dry-run".to_string());
        fleet.remote_args("free", plan)
    };
    let plan_limit = fleet.limit(Duration::ZERO);
    let plans = fleet.fan_out("free", &fleet.hosts, |_| (plan_args.clone(), plan_limit));
    if let Some(signal) = crate::remote::interrupt::signal() {
        // Interrupted while planning: no host is asked to free.
        let mut output = finish(&plans, args.json, "free", render::free_plan);
        if !args.json {
            output.text = format!(
                "Interrupted by {} while the hosts planned: no host was asked to free, nothing was signalled.\n\n{}",
                crate::remote::interrupt::name(signal),
                output.text
            );
        }
        output.exit = Exit::Incomplete;
        return Ok(output);
    }
    if args.dry_run {
        return Ok(finish(&plans, args.json, "free", render::free_plan));
    }
    if !args.yes {
        let answered = plans
            .iter()
            .filter(|plan| plan.answer.report.is_some())
            .count();
        confirm(&format!(
            "{}Proceed on {answered} host{}? [y/N] ",
            render::free_plan(&plans),
            if answered == 1 { "" } else { "s" }
        ))?;
    }
    // Hosts that could not plan are not asked to free: their plan's error stands.
    let ready: Vec<String> = plans
        .iter()
        .filter(|plan| plan.answer.report.is_some())
        .map(|plan| plan.host.clone())
        .collect();
    let run_args = {
        let mut run = flags;
        run.push("--yes".to_string());
        fleet.remote_args("free", run)
    };
    // The remote free may take as long as its options let it (the one
    // formula, `reap::Options::longest`).
    let limit = fleet.limit(args.options.longest());
    let mut freed = fleet
        .fan_out("free", &ready, |_| (run_args.clone(), limit))
        .into_iter();
    let results: Vec<HostResult> = plans
        .into_iter()
        .map(|plan| {
            if plan.answer.report.is_some() {
                freed.next().unwrap_or(plan)
            } else {
                plan
            }
        })
        .collect();
    Ok(finish(&results, args.json, "free", render::free_outcome))
}

/// The flags of `free` each host gets, from the one config of `free` (the
/// same a local `free` acts on). Every field is named: one added to `free`
/// and not carried to the hosts does not compile (tests/fleet_flags.rs
/// parses these back and compares).
pub fn free_flags(request: &FreeRequest) -> Vec<String> {
    let FreeRequest {
        gpu,
        pid,
        patterns,
        user,
        orphans,
        stale_runs,
        cgroups,
        mps_server,
        all,
        options,
        protect,
        // The fleet plans everywhere (`--dry-run`), asks once here, then
        // sends `--yes`: `free` adds these itself.
        dry_run: _,
        yes: _,
        // Each host answers in JSON (`Fleet::remote_args`); this side renders.
        json: _,
        sources,
    } = request;
    let mut flags = gpu_args(gpu);
    flags.extend(sources_flags(sources));
    // `--match=-x`: joined, so that a value starting with '-' stays a value.
    let repeated = |flag: &str, values: Vec<String>| -> Vec<String> {
        values
            .into_iter()
            .map(|value| format!("{flag}={value}"))
            .collect()
    };
    flags.extend(repeated("--pid", pid.iter().map(u32::to_string).collect()));
    flags.extend(repeated(
        "--match",
        patterns
            .iter()
            .map(|regex| regex.as_str().to_string())
            .collect(),
    ));
    flags.extend(repeated("--user", user.clone()));
    flags.extend(repeated("--protect", protect.clone()));
    flags.extend(repeated(
        "--mps-server",
        mps_server.iter().map(ToString::to_string).collect(),
    ));
    // Each host resolves ids, names and paths against its own processes.
    flags.extend(
        cgroups
            .iter()
            .map(|wanted| format!("{}={}", wanted.flag(), wanted.given())),
    );
    for (set, flag) in [
        (orphans, "--orphans"),
        (stale_runs, "--stale-runs"),
        (all, "--all"),
    ] {
        if *set {
            flags.push(flag.to_string());
        }
    }
    flags.extend([
        "--grace".to_string(),
        duration_arg(options.grace()),
        "--timeout".to_string(),
        duration_arg(options.timeout()),
    ]);
    flags
}

/// The flags of `status` each host gets: the GPUs and the container sources
/// (`--tree` and `--prometheus` are refused with `-H`; JSON is added by
/// `Fleet::remote_args`).
pub fn status_flags(
    gpu: &[crate::units::GpuList],
    sources: &SourcesRequest,
    monitors: bool,
) -> Vec<String> {
    let mut flags = gpu_args(gpu);
    flags.extend(sources_flags(sources));
    if monitors {
        flags.push("--monitors".to_string());
    }
    flags
}

/// `--host-root` and `--kubelet-socket` as given: each host checks and reads
/// its own (they name the host's paths, not this one's).
pub fn sources_flags(sources: &SourcesRequest) -> Vec<String> {
    let SourcesRequest {
        host_root,
        kubelet_socket,
    } = sources;
    [
        ("--host-root", host_root),
        ("--kubelet-socket", kubelet_socket),
    ]
    .into_iter()
    .filter_map(|(flag, path)| {
        // Joined: a path starting with '-' stays a value.
        path.as_ref()
            .map(|path| format!("{flag}={}", path.display()))
    })
    .collect()
}

/// `plan -H`: each host plans the command on its own GPUs, model cache and
/// holders (`gpureap plan --json -- COMMAND` there); one section per host.
pub fn plan(fleet: &Fleet, request: &PlanConfig) -> Result<Output, UsageError> {
    let remote = fleet.remote_args_then("plan", plan_flags(request), &request.command);
    let limit = fleet.limit(Duration::ZERO);
    let results = fleet.fan_out("plan", &fleet.hosts, |_| (remote.clone(), limit));
    Ok(finish(&results, request.json, "plan", render::plan))
}

/// The flags of `plan` each host gets, from the one config of `plan` (the
/// same a local `plan` acts on). Every field is named: one added to `plan`
/// and not carried to the hosts does not compile (tests/fleet_flags.rs
/// parses these back and compares). Paths (`--from-log`,
/// `--model-config`) are read on each host, as a shared file system names them.
pub fn plan_flags(request: &PlanConfig) -> Vec<String> {
    let PlanConfig {
        // Sent after the flags, behind `--` (`Fleet::remote_args_then`).
        command: _,
        // Each host plans with its own environment: its CUDA_VISIBLE_DEVICES,
        // its Hugging Face cache. An `env A=B` prefix in the command goes along.
        env: _,
        averages,
        concurrency,
        hypothetical,
        overrides:
            Overrides {
                gpu_free,
                weights,
                kv_memory,
                host_memory,
            },
        from_log,
        model_config,
        engine_version,
        // Each host answers in JSON (`Fleet::remote_args`); this side renders.
        json: _,
    } = request;
    let mut flags = Vec::new();
    let mut flag = |name: &str, value: String| {
        flags.push(format!("{name}={value}"));
    };
    // Either average alone is the other at 0 (`config::plan`), and 0 is
    // not a value either flag takes: only the ones given are sent.
    if let Some((prompt, output)) = averages {
        for (name, tokens) in [("--avg-prompt", prompt), ("--avg-output", output)] {
            if *tokens > 0 {
                flag(name, tokens.to_string());
            }
        }
    }
    if let Some(concurrency) = concurrency {
        flag("--concurrency", concurrency.to_string());
    }
    if let Some(Hypothetical { gpu_memory, gpus }) = hypothetical {
        flag("--gpu-memory", gpu_memory.to_string());
        if let Some(gpus) = gpus {
            flag("--gpus", gpus.to_string());
        }
    }
    for (name, size) in [
        ("--gpu-free", gpu_free),
        ("--weights", weights),
        ("--kv-memory", kv_memory),
        ("--host-memory", host_memory),
    ] {
        if let Some(size) = size {
            flag(name, size.to_string());
        }
    }
    for (name, path) in [("--from-log", from_log), ("--model-config", model_config)] {
        if let Some(path) = path {
            flag(name, path.to_string_lossy().into_owned());
        }
    }
    // Each host finds the version its own interpreter has installed,
    // unless one is given.
    if let Some(version) = engine_version {
        flag("--engine-version", version.clone());
    }
    flags
}

fn finish(
    results: &[HostResult],
    json: bool,
    command: &'static str,
    render: fn(&[HostResult]) -> String,
) -> Output {
    let exit = worst(results);
    let mut text = if json {
        fleet_json(command, results, exit)
    } else {
        render(results)
    };
    if let Some(signal) = crate::remote::interrupt::signal()
        && !json
    {
        let _ = std::fmt::Write::write_fmt(
            &mut text,
            format_args!(
                "\nInterrupted by {}: the hosts that had not answered were stopped (their ssh and their gpureap there ended, nothing signalled there after that) and are listed as failed.\n",
                crate::remote::interrupt::name(signal)
            ),
        );
    }
    Output { text, exit }
}
