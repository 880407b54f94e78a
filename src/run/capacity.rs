//! Planned against actual: once the server is ready, the KV-cache capacity
//! the engine logged (`plan::calibrate::read_log` on the server's own
//! output: SGLang's `KV Cache is allocated. #tokens: N`, vLLM's `GPU KV cache
//! size: N tokens`) is compared with what `--plan` predicted for this start.
//! It is said as an event, kept in the state directory (`capacity.json`) and
//! served in the metrics.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::metrics;
use super::output::{SharedLog, event};
use crate::plan::calibrate;
use crate::plan::launch::Engine;
use crate::state::StateDir;

/// How often the kept output is read again while the capacity line has not
/// come (only when new lines came since).
const LOOK_EVERY: Duration = Duration::from_millis(500);
/// How long after ready the capacity line is waited for. A server ready by
/// a port or a URL logged it long before; one that counts as ready once
/// started may still be loading its weights.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30 * 60);
/// The file in the state directory with the last start's comparison.
pub const FILE: &str = "capacity.json";

/// The last start's planned and logged capacity (`capacity.json`,
/// docs/run.md).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Comparison {
    pub start: u32,
    pub engine: Option<Engine>,
    /// Tokens per rank `--plan` predicted for this start; `None` without `--plan`.
    pub planned_tokens_per_rank: Option<u64>,
    /// Tokens per rank the engine logged.
    pub logged_tokens_per_rank: u64,
    /// (logged − planned) / planned, in percent; `None` without a plan.
    pub difference_percent: Option<f64>,
    pub at_unix: u64,
}

impl Comparison {
    fn new(start: u32, planned: Option<u64>, logged: &calibrate::Logged, tokens: u64) -> Self {
        let difference_percent = planned.filter(|&planned| planned > 0).map(|planned| {
            ((tokens as f64 - planned as f64) / planned as f64 * 1000.0).round() / 10.0
        });
        Comparison {
            start,
            engine: logged.engine,
            planned_tokens_per_rank: planned,
            logged_tokens_per_rank: tokens,
            difference_percent,
            at_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// The event line: `capacity: planned 412000 tokens per rank, the engine logged 412345 (+0.1%)`.
    pub fn line(&self) -> String {
        let logged = self.logged_tokens_per_rank;
        match (self.planned_tokens_per_rank, self.difference_percent) {
            (Some(planned), Some(percent)) => format!(
                "capacity: planned {planned} tokens per rank, the engine logged {logged} ({percent:+.1}%)"
            ),
            (Some(planned), None) => {
                format!("capacity: planned {planned} tokens per rank, the engine logged {logged}")
            }
            _ => format!(
                "capacity: the engine logged {logged} tokens per rank (--plan compares it with the plan)"
            ),
        }
    }
}

/// Looks for the engine's logged capacity in one start's output, from the
/// moment the server is ready until it is found or given up on.
pub struct CapacityWatch {
    start: u32,
    planned: Option<u64>,
    lines_read: u64,
    last_look: Option<Instant>,
    done: bool,
}

impl CapacityWatch {
    /// For start number `start`, with the tokens per rank `--plan` predicted.
    pub fn new(start: u32, planned: Option<u64>) -> CapacityWatch {
        CapacityWatch {
            start,
            planned,
            lines_read: 0,
            last_look: None,
            done: false,
        }
    }

    /// Called on each turn of the watch once the server is ready (`ready_at`):
    /// reads the kept output when lines came since the last look; once the
    /// capacity is found, says it, records it in `state` and the metrics,
    /// and stops keeping the output.
    pub fn look(
        &mut self,
        log: &SharedLog,
        ready_at: Instant,
        now: Instant,
        state: Option<&StateDir>,
    ) {
        if self.done
            || self
                .last_look
                .is_some_and(|at| now.duration_since(at) < LOOK_EVERY)
        {
            return;
        }
        self.last_look = Some(now);
        let Ok(mut kept) = log.lock() else {
            self.done = true;
            return;
        };
        if now.duration_since(ready_at) >= GIVE_UP_AFTER {
            kept.capacity.close();
            self.done = true;
            drop(kept);
            if self.planned.is_some() {
                event(
                    "capacity: the engine logged no KV-cache size (SGLang's 'KV Cache is allocated. #tokens', vLLM's 'GPU KV cache size') in its output; planned vs actual not shown",
                );
            }
            return;
        }
        if kept.lines == self.lines_read {
            return;
        }
        self.lines_read = kept.lines;
        let logged = calibrate::read_log(&kept.capacity.text());
        let Some(tokens) = logged.tokens else {
            return;
        };
        kept.capacity.close();
        drop(kept);
        self.done = true;
        let comparison = Comparison::new(self.start, self.planned, &logged, tokens);
        // Recorded first, then said: whoever sees the event finds the file
        // and the metrics up to date.
        metrics::logged_capacity(tokens);
        if let Some(state) = state {
            let written = serde_json::to_string_pretty(&comparison)
                .map_err(std::io::Error::other)
                .and_then(|text| state.replace(FILE, text.as_bytes()));
            if let Err(error) = written {
                event(&format!("cannot record the capacity: {error}"));
            }
        }
        event(&comparison.line());
    }
}
