//! From typed flags to what the program acts on: the rules that involve
//! several flags or the host (GPU indexes the driver reports, PIDs that
//! exist, user names). Every error here is the user's input, said plainly,
//! and ends the run with exit code 2 before anything is signalled.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::cli::{FreeArgs, RunArgs, WaitArgs};
use crate::reap::Options;
use crate::run::RunConfig;
use crate::run::ready::Readiness;
use crate::select::{Guard, Scope};
use crate::snapshot::Snapshot;
use crate::supervision::StaleRun;
use crate::units::GpuList;

/// A mistake in the command line; printed as is, exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

impl From<String> for UsageError {
    fn from(message: String) -> Self {
        UsageError(message)
    }
}

/// Resolves the `--gpu` lists (their union) against the GPUs the driver
/// reports; `None` when no list was given.
pub fn gpus(lists: &[GpuList], gpu_count: u32) -> Result<Option<BTreeSet<u32>>, UsageError> {
    match GpuList::union(lists) {
        None => Ok(None),
        Some(list) => Ok(Some(list.resolve(gpu_count)?)),
    }
}

/// What `free` was asked, with everything that needs no driver and no
/// /proc scan already checked: user names resolved, the scope not empty.
pub struct FreeRequest {
    uids: BTreeSet<u32>,
}

impl FreeRequest {
    /// Checks the flags of `free` that need neither the driver nor /proc.
    pub fn new(args: &FreeArgs) -> Result<FreeRequest, UsageError> {
        check_scope(args)?;
        let mut uids = BTreeSet::new();
        for name in &args.user {
            let uid = match name.parse::<u32>() {
                Ok(uid) => uid,
                Err(_) => uzers::get_user_by_name(name)
                    .map(|user| user.uid())
                    .ok_or_else(|| UsageError(format!("no user named '{name}' on this host")))?,
            };
            uids.insert(uid);
        }
        Ok(FreeRequest { uids })
    }
}

/// `free` needs a scope: here, and before a fleet asks any host.
pub fn check_scope(args: &FreeArgs) -> Result<(), UsageError> {
    let no_scope = args.gpu.is_empty()
        && args.pid.is_empty()
        && args.patterns.is_empty()
        && args.user.is_empty()
        && !args.orphans
        && !args.stale_runs
        && !args.all;
    if no_scope {
        return Err(UsageError(
                "refusing to free without a scope: give one or more of --gpu LIST, --pid PID, --match REGEX, --user NAME, --orphans, --stale-runs, --all (try --dry-run first)"
                    .to_string(),
            ));
    }
    Ok(())
}

pub struct FreeConfig {
    pub scope: Scope,
    pub options: Options,
}

/// Builds the scope for `free` against the host: GPU indexes must exist,
/// named PIDs must be live processes that may be signalled. `stale_runs` are
/// the runs found for `--stale-runs`.
pub fn free(
    args: &FreeArgs,
    request: FreeRequest,
    gpu_count: u32,
    snapshot: &Snapshot,
    guard: &Guard,
    stale_runs: Option<&[StaleRun]>,
) -> Result<FreeConfig, UsageError> {
    let gpus = gpus(&args.gpu, gpu_count)?;
    if gpus.as_ref().is_some_and(BTreeSet::is_empty) {
        return Err(UsageError(
            "--gpu names no GPU: the driver reports none on this host (see `gpureap status`)"
                .to_string(),
        ));
    }
    let mut pids = BTreeSet::new();
    for &pid in &args.pid {
        let Some(record) = snapshot.processes.get(&pid) else {
            return Err(UsageError(format!(
                "no process with PID {pid} (it may have exited already); see `gpureap status`"
            )));
        };
        if let Some(reason) = guard.spare_reason(snapshot, record, true) {
            return Err(UsageError(format!(
                "refusing --pid {pid}: it is {reason}, and neither it nor what runs under it may be signalled"
            )));
        }
        pids.insert(record.id);
    }
    Ok(FreeConfig {
        scope: Scope {
            gpus,
            pids,
            patterns: args.patterns.clone(),
            uids: request.uids,
            orphans: args.orphans,
            all: args.all,
            stale_runs: stale_runs.map(|runs| {
                runs.iter()
                    .flat_map(|run| run.members.iter().copied())
                    .collect()
            }),
            job: None,
        },
        options: Options {
            grace: args.grace,
            timeout: args.timeout,
            poll: Duration::from_millis(5),
        },
    })
}

pub struct WaitConfig {
    pub gpus: BTreeSet<u32>,
    pub below: u64,
    pub timeout: Duration,
}

pub fn wait(args: &WaitArgs, gpu_count: u32) -> Result<WaitConfig, UsageError> {
    let gpus = gpus(&args.gpu, gpu_count)?.unwrap_or_default();
    if gpus.is_empty() {
        return Err(UsageError(
            "no GPUs to wait for: the driver reports none (is this a GPU host? see `gpureap status`)".to_string(),
        ));
    }
    Ok(WaitConfig {
        gpus,
        below: args.below,
        timeout: args.timeout,
    })
}

/// Where the server's program is, as `exec` will find it: a path as given,
/// or the first executable of that name on PATH. Checked before anything is
/// started, so that a typo is reported as one and not as a containment
/// failure.
fn find_program(program: &str) -> Result<std::path::PathBuf, UsageError> {
    use rustix::fs::{Access, access};
    let executable =
        |path: &std::path::Path| path.is_file() && access(path, Access::EXEC_OK).is_ok();
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

pub fn run(args: &RunArgs) -> Result<RunConfig, UsageError> {
    if let Some(program) = args.command.first() {
        find_program(program)?;
    }
    let readiness = if let Some(url) = &args.ready_url {
        Readiness::Url(url.clone())
    } else if let Some(port) = args.ready_port {
        Readiness::Port(port)
    } else if let Some(regex) = &args.ready_log {
        Readiness::Log(regex.clone())
    } else {
        Readiness::Started
    };
    let state_dir = match &args.state_dir {
        Some(dir) => dir.clone(),
        None => default_state_dir(&args.command),
    };
    Ok(RunConfig {
        command: args.command.clone(),
        readiness,
        startup_timeout: args.startup_timeout,
        stall_timeout: args.stall_timeout,
        health_interval: args.health_interval,
        restart: args.restart,
        max_restarts: args.max_restarts,
        backoff: args.backoff,
        grace: args.grace,
        stop_timeout: args.stop_timeout,
        log: args.log.clone(),
        state_dir,
        allow_cgroup: !args.no_cgroup,
        metrics: args.metrics,
    })
}

/// One state directory per command line, so that each server is compared
/// with its own good starts.
fn default_state_dir(command: &[String]) -> std::path::PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".local/state"))
        })
        .unwrap_or_else(|| std::path::PathBuf::from("/var/lib"));
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
