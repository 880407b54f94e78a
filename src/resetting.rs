//! `gpureap reset` on this host: the GPUs named resolved against the
//! driver, then each reset and checked through the driver (the pipeline's
//! `reset`), or with `--plan` what blocks a reset of each, and the report.

use crate::driver::BackendChoice;
use crate::exit::{Exit, Failure};
use crate::report;
use crate::request::{self, UsageError};
use crate::reset;
use crate::snapshot::Snapshot;
use crate::stdout::emit;

/// `reset` here: each GPU reset, or (`--plan`) what blocks a reset of each.
pub fn reset(backend: &BackendChoice, args: &request::ResetRequest) -> Result<Exit, Failure> {
    if let Some(instances) = request::names_instances(&args.gpu) {
        return Err(UsageError(format!(
            "reset resets whole GPUs, every MIG instance on them: name the GPU, not the instance {instances} (docs/mig.md)"
        ))
        .into());
    }
    let (driver, gpu) = request::gpu_names(request::open_driver(backend)?, &args.gpu)?;
    // --gpu is required (clap): `None` cannot come back.
    let gpus = request::named_gpus(&gpu, request::gpu_count(driver.as_ref()))?
        .ok_or_else(|| UsageError("--gpu is required".to_string()))?;
    if args.plan {
        let snapshot = Snapshot::take(driver.as_ref());
        let platform = driver.platform();
        let plans: Vec<_> = gpus
            .iter()
            .map(|&index| reset::plan(driver.as_ref(), &snapshot, &platform, index))
            .collect();
        let code = reset::plan_exit(&plans);
        if args.json {
            emit(&format!("{}\n", report::reset_plan_json(&plans, code)))?;
        } else {
            emit(&plans.iter().map(ToString::to_string).collect::<String>())?;
        }
        return Ok(code);
    }
    let outcomes: Vec<_> = gpus
        .iter()
        .map(|&index| reset::reset(driver.as_ref(), index))
        .collect();
    emit(
        &outcomes
            .iter()
            .map(|outcome| format!("{outcome}\n"))
            .collect::<String>(),
    )?;
    Ok(reset::exit(&outcomes))
}
