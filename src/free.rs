//! `gpureap free` on this host: the request resolved against the driver and
//! /proc (GPUs, named processes, stale runs, the members of containers, pods
//! and cgroups), the plan, asked about, then `reap::free`'s signals and
//! verification, the stale runs' cgroups removed, and the report. `free -H`
//! is the fleet's (`fleet::commands::free`), from the same request.

use std::io::{self, IsTerminal};
use std::time::Duration;

use crate::container::Sources;
use crate::driver::BackendChoice;
use crate::exit::{Exit, Failure};
use crate::members::{self, Found, Wanted};
use crate::reap;
use crate::report;
use crate::request::{self, UsageError};
use crate::select::Guard;
use crate::snapshot::Snapshot;
use crate::stdout::emit;
use crate::supervision::{self, StaleRun};

/// `free` here: `confirm` is asked the plan's question (the plan, then
/// "Proceed? [y/N] ") unless `--yes` or `--dry-run`, and refuses by an error.
pub fn free(
    backend: &BackendChoice,
    args: &request::FreeRequest,
    confirm: impl FnOnce(&str) -> Result<(), Failure>,
) -> Result<Exit, Failure> {
    let uids = args.users()?;
    let sources = args.sources.sources()?;
    let (driver, gpu) = request::gpu_names(request::open_driver(backend)?, &args.gpu)?;
    let args = &request::FreeRequest {
        gpu,
        ..args.clone()
    };
    let gpu_count = request::gpu_count(driver.as_ref());
    // GPU indexes are checked before the scan; named processes' families need command lines too.
    request::gpus(&args.gpu, gpu_count)?;
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
    let config = request::free(
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
        confirm(&format!("{}Proceed? [y/N] ", report::free_plan(&plan)))?;
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

fn progress_bar(json: bool) -> Option<indicatif::ProgressBar> {
    if json || !io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.enable_steady_tick(Duration::from_millis(100));
    Some(bar)
}
