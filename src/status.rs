//! `gpureap status` on this host: the driver and /proc read as the flags
//! ask (the driver's lists first, or every process's descriptors), the
//! containers attributed, then the table, the tree, the JSON or the
//! Prometheus exposition, and the exit code of what could not be read.
//! `status -H` is the fleet's (`fleet::commands::status`), from the same
//! request.

use crate::driver::BackendChoice;
use crate::exit::{Exit, Failure};
use crate::report;
use crate::request::{self, UsageError};
use crate::snapshot::Snapshot;
use crate::stdout::{emit, emit_encoded};

pub fn status(backend: &BackendChoice, args: &request::StatusRequest) -> Result<Exit, Failure> {
    let sources = args.sources.sources()?;
    // How long the snapshot took, for `status --prometheus`'s scan figures.
    // Every process's descriptors are read where asked (--monitors) or
    // where the driver's lists do not explain every GPU's memory
    // (`Snapshot::take_seen`); --prometheus counts what the driver lists.
    let (driver, mut snapshot, took, gpu) = if (args.prometheus || args.monitors)
        && !request::names_by_driver(&args.gpu)
    {
        // NVML starts while /proc is read (`Snapshot::open_and_take`).
        let (driver, mut snapshot, took) =
            Snapshot::open_and_take(backend, args.prometheus).map_err(UsageError)?;
        snapshot.read_evidence(driver.as_ref());
        snapshot.read_activity(driver.as_ref());
        (driver, snapshot, took, args.gpu.clone())
    } else {
        // The driver first: its lists decide what is read, and it
        // resolves the names only it knows (docs/mig.md).
        let (driver, gpu) = request::gpu_names(request::open_driver_quietly(backend)?, &args.gpu)?;
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
    let gpus = request::gpus(&gpu, request::gpu_count(driver.as_ref()))?;
    if args.prometheus {
        let mut figures = crate::metrics::ScanFigures::default();
        figures.count(&snapshot, took);
        let options = crate::metrics::Options {
            gpus: gpus.clone(),
            per_process: args.per_process,
        };
        emit_encoded(&crate::metrics::encode_snapshot(&snapshot, &figures, &options).text)?;
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
            .any(|gpu| gpu.error.is_some() || crate::metrics::unseen(snapshot, gpu).is_some());
    if unreadable {
        Exit::Unknown
    } else {
        Exit::Success
    }
}
