//! `wait`: the preflight before a launch. Polls the driver's memory figures
//! until every GPU asked for is below the threshold, or the timeout passes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::driver::{Driver, DriverError, Figures};

/// How often the driver's memory figures are polled, where the backend
/// polls (`Driver::wait_for_change`).
const POLL: Duration = Duration::from_millis(5);
/// The longest single wait on the driver; waiting goes on after it while
/// nothing changed (a trace line marks each).
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// One GPU's last reading in a wait; `wait --json` writes it as is (the
/// `gpus` of docs/json.md, "wait").
#[derive(Debug, Serialize)]
pub struct WaitGpu {
    pub index: u32,
    pub memory_used: Option<u64>,
    pub ready: bool,
    pub error: Option<DriverError>,
}

/// What a wait found: each GPU's last reading, and how long it took.
pub struct WaitOutcome {
    pub ready: bool,
    pub waited: Duration,
    pub gpus: Vec<WaitGpu>,
}

impl WaitOutcome {
    /// A GPU the driver could not report on (lost, an NVML error): its
    /// memory can never be seen to go below the limit, so the wait ended at
    /// once (exit 3, as `free` and `reset` for the same GPU).
    pub fn failed(&self) -> impl Iterator<Item = &WaitGpu> {
        self.gpus.iter().filter(|gpu| gpu.error.is_some())
    }

    /// The GPUs that were not ready at the end.
    pub fn busy(&self) -> BTreeSet<u32> {
        self.gpus
            .iter()
            .filter(|gpu| !gpu.ready)
            .map(|gpu| gpu.index)
            .collect()
    }
}

/// Each GPU's state from one reading of the driver.
fn states(figures: Figures, below: u64) -> Vec<WaitGpu> {
    figures
        .into_iter()
        .map(|(index, used)| match used {
            Ok(used) => WaitGpu {
                index,
                memory_used: used,
                ready: used.is_some_and(|used| used < below),
                error: None,
            },
            Err(error) => WaitGpu {
                index,
                memory_used: None,
                ready: false,
                error: Some(error),
            },
        })
        .collect()
}

/// Returns as soon as every GPU in `gpus` uses less than `below`, when the
/// driver cannot report on one of them (`WaitOutcome::failed`), or when
/// `timeout` has passed. Between readings it waits on the driver
/// (`Driver::wait_for_change`), so it reacts within a poll of a release and
/// costs almost nothing while memory stays put.
pub fn wait(
    driver: &dyn Driver,
    gpus: &BTreeSet<u32>,
    below: u64,
    timeout: Duration,
) -> WaitOutcome {
    wait_until(driver, gpus, below, timeout, |readings| {
        readings.iter().all(|gpu| gpu.ready)
    })
}

/// The one waiting loop: reads the memory of `gpus` (each GPU `ready` when
/// it uses less than `below`) and returns as soon as `done` says the
/// readings are enough, when the driver cannot report on one of them, or
/// when `timeout` has passed. `done` is asked again only when the figures
/// changed (`Driver::wait_for_change`): `wait` asks whether every GPU is
/// below the limit, `run --plan --wait-for-fit` whether the server now fits.
pub fn wait_until(
    driver: &dyn Driver,
    gpus: &BTreeSet<u32>,
    below: u64,
    timeout: Duration,
    mut done: impl FnMut(&[WaitGpu]) -> bool,
) -> WaitOutcome {
    let start = Instant::now();
    let judge = |readings: &[WaitGpu], done: &mut dyn FnMut(&[WaitGpu]) -> bool| {
        let failed = readings.iter().any(|gpu| gpu.error.is_some());
        (failed, !failed && done(readings))
    };
    driver.will_wait();
    let mut readings = states(driver.memory_used_of(gpus), below);
    let (mut failed, mut ready) = judge(&readings, &mut done);
    loop {
        tracing::trace!(
            elapsed_ms = start.elapsed().as_secs_f64() * 1e3,
            ready,
            "wait poll"
        );
        let waited = start.elapsed();
        if ready || failed || waited >= timeout {
            return WaitOutcome {
                ready,
                waited,
                gpus: readings,
            };
        }
        let last = readings
            .iter()
            .map(|gpu| (gpu.index, gpu.memory_used))
            .collect();
        // The figures that changed are the next reading. No change means
        // the reading and its verdict stand (every backend's
        // `wait_for_change` says when memory may have moved): reading again
        // would cost a /proc scan on the simulated driver for nothing.
        let Some(figures) =
            driver.wait_for_change(&last, POLL, (timeout - waited).min(LONGEST_PAUSE))
        else {
            continue;
        };
        readings = states(figures, below);
        (failed, ready) = judge(&readings, &mut done);
    }
}
