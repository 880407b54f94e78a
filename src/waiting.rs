//! `gpureap wait` on this host: the driver polled until the GPUs are below
//! the limit (the pipeline's `wait`), then the report, the holders of what
//! is still held, and why not waiting longer. `wait -H` is the fleet's
//! (`fleet::commands::wait`), from the same request.

use crate::driver::BackendChoice;
use crate::exit::{Exit, Failure};
use crate::report;
use crate::request;
use crate::snapshot::Snapshot;
use crate::stdout::emit;

pub fn wait(backend: &BackendChoice, args: &request::WaitRequest) -> Result<Exit, Failure> {
    let (driver, gpu) = request::gpu_names(request::open_driver(backend)?, &args.gpu)?;
    let args = &request::WaitRequest {
        gpu,
        ..args.clone()
    };
    let config = request::wait(args, request::gpu_count(driver.as_ref()))?;
    // Without a driver there is no memory figure to wait for: say so at once
    // rather than time out as if the GPUs were held.
    if let Some(why) = driver.unavailable() {
        return Err(
            anyhow::anyhow!("cannot wait: the driver reports no GPU memory ({why})").into(),
        );
    }
    let outcome = crate::wait::wait(
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
            crate::units::one_line(
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
            crate::units::Bytes(config.below)
        );
        Ok(Exit::StillHeld)
    } else {
        // What no process holds is said as such; "listed above" only where
        // the table lists a holder of a GPU that was not ready.
        let (mut held, mut listed) = (Vec::new(), false);
        if let Some(snapshot) = &holders {
            held = crate::wait::held_by_no_process(snapshot, &outcome.gpus, config.below);
            listed = busy.iter().flatten().any(|&index| {
                snapshot
                    .gpu(index)
                    .is_some_and(|gpu| crate::metrics::holders(gpu) > 0)
            });
        }
        for (index, reason) in &held {
            eprintln!("gpureap: GPU {index}: {reason}");
        }
        eprintln!(
            "gpureap: timed out after {}{}",
            crate::units::Elapsed(outcome.waited),
            if listed {
                "; the holders are listed above"
            } else {
                ""
            }
        );
        Ok(Exit::StillHeld)
    }
}
