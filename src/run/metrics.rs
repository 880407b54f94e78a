//! `gpureap run --metrics ADDR:PORT`: the supervisor's view as Prometheus
//! metrics: starts, ready, hangs and crashes by kind, restarts, and how long
//! the last start took to be ready. Served by the exporter's bounded,
//! read-only server; the GPU figures are `gpureap exporter`'s.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::http;
use crate::metrics::Exposition;

/// How a start hung.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HangKind {
    /// No log output for --stall-timeout before ready.
    Stall,
    /// Not ready by --startup-timeout.
    StartupTimeout,
    /// Health checks failing after ready.
    Unhealthy,
}

impl HangKind {
    fn label(self) -> &'static str {
        match self {
            HangKind::Stall => "stall",
            HangKind::StartupTimeout => "startup_timeout",
            HangKind::Unhealthy => "unhealthy",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// The supervisor's metrics, once `--metrics` has started serving them.
/// One supervisor per process: the functions below are no-ops without it.
static METRICS: OnceLock<RunMetrics> = OnceLock::new();

/// The supervisor's metrics; cheap to clone, shared with the server thread.
#[derive(Clone)]
struct RunMetrics {
    registry: Arc<Registry>,
    starts: Counter,
    ready: Gauge,
    hangs: Family<KindLabel, Counter>,
    crashes: Family<KindLabel, Counter>,
    restarts: Counter,
    last_ready: Gauge<f64, AtomicU64>,
    planned_tokens: Gauge,
    logged_tokens: Gauge,
}

impl RunMetrics {
    fn new() -> RunMetrics {
        let mut registry = Registry::with_prefix("gpureap_run");
        let starts = Counter::default();
        registry.register("starts", "Times the server was started", starts.clone());
        let ready = Gauge::default();
        registry.register(
            "ready",
            "1 while the current start is ready, else 0",
            ready.clone(),
        );
        let hangs = Family::<KindLabel, Counter>::default();
        registry.register(
            "hangs",
            "Starts that hung, by kind: stall (no log output before ready), startup_timeout, unhealthy (health failing after ready)",
            hangs.clone(),
        );
        let crashes = Family::<KindLabel, Counter>::default();
        registry.register(
            "crashes",
            "Starts that ended on their own with a failure, by kind: exit_code (any code, 0 included, when nobody asked it to stop) or signal",
            crashes.clone(),
        );
        let restarts = Counter::default();
        registry.register(
            "restarts",
            "Times the server was restarted after it ended",
            restarts.clone(),
        );
        let last_ready = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "last_time_to_ready",
            "How long the last start that became ready took to be ready",
            Unit::Seconds,
            last_ready.clone(),
        );
        let planned_tokens = Gauge::default();
        registry.register(
            "kv_tokens_planned",
            "KV-cache tokens per rank --plan predicted for the current start (0 without --plan)",
            planned_tokens.clone(),
        );
        let logged_tokens = Gauge::default();
        registry.register(
            "kv_tokens_logged",
            "KV-cache tokens per rank the engine logged for the current start (0 until it has)",
            logged_tokens.clone(),
        );
        // Every kind is there from the start, at 0, so that rate() sees the first one.
        for kind in [
            HangKind::Stall,
            HangKind::StartupTimeout,
            HangKind::Unhealthy,
        ] {
            let _ = hangs.get_or_create(&KindLabel { kind: kind.label() });
        }
        for kind in ["exit_code", "signal"] {
            let _ = crashes.get_or_create(&KindLabel { kind });
        }
        RunMetrics {
            registry: Arc::new(registry),
            starts,
            ready,
            hangs,
            crashes,
            restarts,
            last_ready,
            planned_tokens,
            logged_tokens,
        }
    }

    fn encode(&self) -> String {
        let mut text = String::new();
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// Starts serving the metrics on `address`; a bind failure is the caller's.
pub fn serve(address: SocketAddr) -> std::io::Result<()> {
    let listener = http::bind(address)?;
    let metrics = METRICS.get_or_init(RunMetrics::new).clone();
    let local = listener.local_addr()?;
    http::serve_in_background(listener, move || {
        Arc::new(Exposition::new(metrics.encode()))
    })?;
    super::event(&format!("metrics: http://{local}/metrics"));
    Ok(())
}

fn with(update: impl FnOnce(&RunMetrics)) {
    if let Some(metrics) = METRICS.get() {
        update(metrics);
    }
}

/// A start began, with the KV-cache tokens per rank `--plan` predicted for it.
pub fn started(planned_tokens: Option<u64>) {
    with(|metrics| {
        metrics.starts.inc();
        metrics.ready.set(0);
        metrics
            .planned_tokens
            .set(gauge_value(planned_tokens.unwrap_or(0)));
        metrics.logged_tokens.set(0);
    });
}

/// The engine logged its KV-cache size for the current start.
pub fn logged_capacity(tokens: u64) {
    with(|metrics| {
        metrics.logged_tokens.set(gauge_value(tokens));
    });
}

fn gauge_value(tokens: u64) -> i64 {
    i64::try_from(tokens).unwrap_or(i64::MAX)
}

/// The current start became ready after `seconds`.
pub fn became_ready(seconds: f64) {
    with(|metrics| {
        metrics.ready.set(1);
        metrics.last_ready.set(seconds);
    });
}

/// The current start hung.
pub fn hung(kind: HangKind) {
    with(|metrics| {
        metrics.ready.set(0);
        metrics
            .hangs
            .get_or_create(&KindLabel { kind: kind.label() })
            .inc();
    });
}

/// The current start ended on its own; `failure` as `run` judged it (an
/// end nobody asked for, exit code 0 included).
pub fn ended(status: rustix::process::WaitStatus, failure: bool) {
    with(|metrics| {
        metrics.ready.set(0);
        if !failure {
            return;
        }
        let kind = if status.terminating_signal().is_some() {
            "signal"
        } else {
            "exit_code"
        };
        metrics.crashes.get_or_create(&KindLabel { kind }).inc();
    });
}

/// The current start was stopped (gpureap was asked to stop).
pub fn stopped() {
    with(|metrics| {
        metrics.ready.set(0);
    });
}

/// The server is being restarted.
pub fn restarted() {
    with(|metrics| {
        metrics.restarts.inc();
    });
}
