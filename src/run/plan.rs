//! `run --plan`: before each start, the server's own command line is planned
//! on this host's GPUs (`plan::fit::evaluate`, the same plan `gpureap plan`
//! gives), and nothing is started while memory others hold would shrink its
//! KV cache (SGLang) or stop it starting (vLLM), or while it cannot fit at
//! all. `--wait-for-fit` waits for the holders to go (the one waiting loop,
//! `wait::wait_until`); `--accept-shrink` starts anyway, saying what it
//! costs.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::output::event;
use crate::driver::Driver;
use crate::exit::{Exit, Failure};
use crate::plan::engine::Device;
use crate::plan::fit::{self, Outcome, PlanConfig, Reason, Verdict};
use crate::plan::render;
use crate::snapshot::Snapshot;
use crate::units::{Bytes, Elapsed};

/// What `run --plan` does while others' memory is in the way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenHeld {
    /// Refuse to start (exit 1), naming the holders and what they cost.
    Refuse,
    /// `--wait-for-fit`: wait this long for them to go, then start.
    WaitForFit(Duration),
    /// `--accept-shrink`: start anyway, saying what it costs.
    AcceptShrink,
}

/// `run --plan`, typed (`config::run`).
#[derive(Debug, Clone)]
pub struct PlanGate {
    /// The server's command line and environment, planned as `gpureap plan` would.
    pub plan: PlanConfig,
    pub when_held: WhenHeld,
}

/// Whether a start may go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Start, with the tokens per rank the plan gives this start (`None`
    /// without `--plan`).
    Start { planned: Option<u64> },
    /// Not started: the run ends with this code.
    Refused(Exit),
}

/// How often a wait for fit looks again when nothing moved, so that a stop
/// signal is heeded.
const STOP_CHECK: Duration = Duration::from_secs(1);

/// Plans the next start, and says whether it may go ahead (and waits, with
/// `--wait-for-fit`). Every refusal is said in an event; nothing is started.
pub fn gate(gate: Option<&PlanGate>, driver: &dyn Driver, stop: &AtomicBool) -> Gate {
    let Some(gate) = gate else {
        return Gate::Start { planned: None };
    };
    let outcome = match plan_here(&gate.plan, driver) {
        Ok(outcome) => outcome,
        Err(failure) => {
            event(&format!(
                "not starting: --plan cannot plan this command: {:#}",
                failure.error()
            ));
            return Gate::Refused(failure.class());
        }
    };
    match outcome.verdict() {
        Verdict::Fits => {
            event(&format!(
                "plan: fits: {}",
                device_line(&outcome, &outcome.now)
            ));
            Gate::Start {
                planned: Some(outcome.now.tokens_per_rank),
            }
        }
        Verdict::DoesNotFit => {
            let why = match outcome.decision().1 {
                Reason::EngineRefuses => {
                    render::start_problem(outcome.launch.engine, &outcome.clean)
                }
                _ => render::verdict_words(&outcome),
            };
            event(&format!(
                "not starting: the plan says it cannot fit on this hardware, even on clean GPUs: {why}"
            ));
            Gate::Refused(Exit::CannotFit)
        }
        Verdict::FitsAfterFree => match gate.when_held {
            WhenHeld::Refuse => {
                event(&format!(
                    "not starting: {}; start anyway with --accept-shrink, or wait for them with --wait-for-fit DURATION",
                    held_summary(&outcome)
                ));
                Gate::Refused(Exit::StillHeld)
            }
            WhenHeld::AcceptShrink if fit::starts(&outcome.now) => {
                event(&format!(
                    "starting anyway (--accept-shrink): {}",
                    held_summary(&outcome)
                ));
                Gate::Start {
                    planned: Some(outcome.now.tokens_per_rank),
                }
            }
            WhenHeld::AcceptShrink => {
                event(&format!(
                    "not starting, even with --accept-shrink: {}",
                    held_summary(&outcome)
                ));
                Gate::Refused(Exit::StillHeld)
            }
            WhenHeld::WaitForFit(limit) => wait_for_fit(&gate.plan, driver, stop, outcome, limit),
        },
    }
}

/// The plan on this host as it is now, from what the driver lists (as
/// `gpureap plan` takes it).
fn plan_here(plan: &PlanConfig, driver: &dyn Driver) -> Result<Outcome, Failure> {
    let snapshot = Snapshot::take_listed(driver);
    Ok(fit::evaluate(plan, Some(&snapshot))?)
}

/// Waits up to `limit` for the server to fit (every holder of its GPUs
/// gone), through the one waiting loop; re-plans each time the memory of
/// its GPUs moves.
fn wait_for_fit(
    plan: &PlanConfig,
    driver: &dyn Driver,
    stop: &AtomicBool,
    first: Outcome,
    limit: Duration,
) -> Gate {
    event(&format!(
        "waiting up to {} (--wait-for-fit) for the holders to go: {}",
        Elapsed(limit),
        held_summary(&first)
    ));
    let gpus: BTreeSet<u32> = first.gpus.iter().map(|gpu| gpu.index).collect();
    let started = Instant::now();
    let deadline = started + limit;
    let mut latest = Some(first);
    let mut problem: Option<Failure> = None;
    loop {
        if stop.load(Ordering::Relaxed) {
            event("stop requested while waiting for the GPUs: nothing was started");
            return Gate::Refused(Exit::Success);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        // The verdict is asked again whenever the memory of the engine's
        // GPUs moves; between, at least every STOP_CHECK for a stop.
        let waited = crate::wait::wait_until(driver, &gpus, u64::MAX, left.min(STOP_CHECK), |_| {
            match plan_here(plan, driver) {
                Ok(outcome) => {
                    let fits = outcome.verdict() == Verdict::Fits;
                    latest = Some(outcome);
                    fits
                }
                Err(failure) => {
                    problem = Some(failure);
                    // Ends the wait: the problem is said below.
                    true
                }
            }
        });
        if let Some(failure) = problem.take() {
            event(&format!(
                "not starting: --plan cannot plan this command: {:#}",
                failure.error()
            ));
            return Gate::Refused(failure.class());
        }
        if let Some(lost) = waited.failed().next() {
            event(&format!(
                "not starting: GPU {} cannot be read ({}); the driver cannot tell when it is free",
                lost.index,
                lost.error
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ));
            return Gate::Refused(Exit::Incomplete);
        }
        if waited.ready
            && let Some(outcome) = latest.as_ref()
        {
            event(&format!(
                "plan: fits after {}: {}",
                Elapsed(started.elapsed()),
                device_line(outcome, &outcome.now)
            ));
            return Gate::Start {
                planned: Some(outcome.now.tokens_per_rank),
            };
        }
        if Instant::now() >= deadline {
            let summary = latest
                .as_ref()
                .map(held_summary)
                .unwrap_or_else(|| "the GPUs are still held".to_string());
            event(&format!(
                "not starting: still not fitting after {} (--wait-for-fit): {summary}",
                Elapsed(started.elapsed())
            ));
            return Gate::Refused(Exit::StillHeld);
        }
    }
}

/// `412345 tokens per rank (27.3 GiB of KV cache per GPU) on GPUs 0-1`.
fn device_line(outcome: &Outcome, device: &Device) -> String {
    format!(
        "{} ({} of KV cache per GPU) on GPUs {}",
        render::device_summary(outcome, device),
        Bytes(device.kv_bytes_per_rank),
        render::gpus_text(outcome)
    )
}

/// What the holders cost: the pool now against clean GPUs, each holder
/// with its cost, and the commands that give the memory back.
fn held_summary(outcome: &Outcome) -> String {
    let mut text = if fit::starts(&outcome.now) {
        format!(
            "memory others hold shrinks the KV cache to {} tokens per rank, from {} on clean GPUs",
            outcome.now.tokens_per_rank, outcome.clean.tokens_per_rank
        )
    } else {
        format!(
            "with the memory others hold, {}; on clean GPUs it gets {} tokens per rank",
            render::start_problem(outcome.launch.engine, &outcome.now),
            outcome.clean.tokens_per_rank
        )
    };
    let holders: Vec<String> = outcome
        .holders
        .iter()
        .filter(|holder| !outcome.negligible(holder))
        .map(render::holder_summary)
        .collect();
    if !holders.is_empty() {
        let _ = write!(text, "; {}", holders.join("; "));
    }
    let commands: Vec<&str> = [&outcome.free_command, &outcome.reset_command]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
    if !commands.is_empty() {
        let _ = write!(text, "; to free it: {}", commands.join(" and "));
    }
    text
}
