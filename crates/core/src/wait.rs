//! `wait`: the preflight before a launch. Polls the driver's memory figures
//! until every GPU asked for is below the threshold, or the timeout passes;
//! or, once the figures stand still, until it is plain that no wait can
//! bring a GPU below the threshold: memory held by no process keeps it
//! there, and only a reset or a reboot clears that.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::driver::{Driver, DriverError, Figures};
use crate::snapshot::Snapshot;
use crate::verify::{self, Reason};

/// How often the driver's memory figures are polled, where the backend
/// polls (`Driver::wait_for_change`).
const POLL: Duration = Duration::from_millis(5);
/// The longest single wait on the driver; waiting goes on after it while
/// nothing changed (a trace line marks each).
const LONGEST_PAUSE: Duration = Duration::from_secs(1);
/// How long the figures must stand still before `wait` asks whether memory
/// held by no process keeps a GPU up: the driver gives a process's memory
/// back within a second of its exit (measured: 206 ms for 100 GiB on an
/// H200), and until then no listed process explains it.
const SETTLED: Duration = Duration::from_secs(1);

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
    /// Where the wait stopped before its timeout because no wait could do
    /// it: each GPU whose memory held by no process is at least the limit,
    /// with the one rule's reason (`held_by_no_process`). Empty otherwise.
    pub held_by_no_process: Vec<(u32, Reason)>,
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

/// The GPUs of `readings` that are not ready and whose memory held by no
/// process, by the one rule (`verify::driver_held`, the reason `free` and
/// `check` give), is at least `below`: whatever exits, their memory stays at
/// or above it. Memory unseen from a PID namespace of its own is not among
/// them: processes gpureap cannot see may still give it back.
pub fn held_by_no_process(
    snapshot: &Snapshot,
    readings: &[WaitGpu],
    below: u64,
) -> Vec<(u32, Reason)> {
    readings
        .iter()
        .filter(|reading| !reading.ready && reading.error.is_none())
        .filter_map(|reading| {
            let gpu = snapshot.gpu(reading.index)?;
            match verify::driver_held(snapshot, gpu, 0)? {
                reason @ Reason::DriverHeld { bytes, .. } if bytes >= below => {
                    Some((reading.index, reason))
                }
                _ => None,
            }
        })
        .collect()
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
/// costs almost nothing while memory stays put. Unless `keep_waiting`, once
/// the figures have stood still for a second it looks at the holders once
/// (until they move again), and returns when memory held by no process keeps
/// a GPU at or above `below` (`WaitOutcome::held_by_no_process`).
pub fn wait(
    driver: &dyn Driver,
    gpus: &BTreeSet<u32>,
    below: u64,
    timeout: Duration,
    keep_waiting: bool,
) -> WaitOutcome {
    let mut held = Vec::new();
    let mut outcome = wait_settling(
        driver,
        gpus,
        below,
        timeout,
        &mut |readings| readings.iter().all(|gpu| gpu.ready),
        &mut |readings| {
            if keep_waiting {
                return false;
            }
            held = held_by_no_process(&Snapshot::take_seen(driver), readings, below);
            !held.is_empty()
        },
    );
    outcome.held_by_no_process = held;
    outcome
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
    wait_settling(driver, gpus, below, timeout, &mut done, &mut |_| false)
}

/// `wait_until`, and `hopeless`, asked once the readings have stood still
/// for `SETTLED` (again after each change), ends the wait when it says no
/// wait can do it.
fn wait_settling(
    driver: &dyn Driver,
    gpus: &BTreeSet<u32>,
    below: u64,
    timeout: Duration,
    done: &mut dyn FnMut(&[WaitGpu]) -> bool,
    hopeless: &mut dyn FnMut(&[WaitGpu]) -> bool,
) -> WaitOutcome {
    let start = Instant::now();
    let judge = |readings: &[WaitGpu], done: &mut dyn FnMut(&[WaitGpu]) -> bool| {
        let failed = readings.iter().any(|gpu| gpu.error.is_some());
        (failed, !failed && done(readings))
    };
    driver.will_wait();
    let mut readings = states(driver.memory_used_of(gpus), below);
    let (mut failed, mut ready) = judge(&readings, done);
    // When the figures last moved, and whether `hopeless` was asked since.
    let (mut moved, mut asked) = (start, false);
    loop {
        tracing::trace!(
            elapsed_ms = start.elapsed().as_secs_f64() * 1e3,
            ready,
            "wait poll"
        );
        let waited = start.elapsed();
        let mut ended = ready || failed || waited >= timeout;
        if !ended && !asked && moved.elapsed() >= SETTLED {
            asked = true;
            ended = hopeless(&readings);
        }
        if ended {
            return WaitOutcome {
                ready,
                waited: start.elapsed(),
                gpus: readings,
                held_by_no_process: Vec::new(),
            };
        }
        let last = readings
            .iter()
            .map(|gpu| (gpu.index, gpu.memory_used))
            .collect();
        let mut pause = (timeout - waited).min(LONGEST_PAUSE);
        if !asked {
            pause = pause.min(SETTLED.saturating_sub(moved.elapsed()));
        }
        // The figures that changed are the next reading. No change means
        // the reading and its verdict stand (every backend's
        // `wait_for_change` says when memory may have moved): reading again
        // would cost a /proc scan on the simulated driver for nothing.
        let Some(figures) = driver.wait_for_change(&last, POLL, pause) else {
            continue;
        };
        readings = states(figures, below);
        (moved, asked) = (Instant::now(), false);
        (failed, ready) = judge(&readings, done);
    }
}
