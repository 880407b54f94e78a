//! `reap --watch --listen ADDR`: the watch's own metrics, served beside the
//! exporter's GPU series by the exporter's bounded, read-only server.
//!
//! The GPU families come from the watch's last full look, encoded by
//! `metrics::encode_snapshot_with` exactly as `gpureap exporter` encodes
//! its own (`gpureap_snapshot_timestamp_seconds` says how old that look
//! is); the watch adds what it did: `gpureap_reaped_total{reason,outcome}`
//! (one per process, by rule and verdict), `gpureap_reaped_bytes_total{reason}`
//! (GPU memory verified back), `gpureap_reap_last_run_timestamp_seconds`,
//! the scans it took and the faults that stopped it. Label values are the
//! watch's own words, never a process's text.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::metrics::{self, Exposition, Options, ScanFigures};
use crate::snapshot::Snapshot;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reaped {
    reason: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

/// The watch's counters; cheap to clone (they share their values).
#[derive(Clone, Default)]
pub struct WatchMetrics {
    reaped: Family<Reaped, Counter>,
    bytes: Family<Reason, Counter>,
    last_run: Gauge<f64, AtomicU64>,
    cycles: Counter,
    faults: Counter,
    /// The page the server hands out, re-encoded after each cycle.
    page: Arc<Mutex<Arc<Exposition>>>,
    /// The last full look, whose GPU families the page shows.
    last: Option<Arc<Snapshot>>,
}

impl WatchMetrics {
    /// A process handled by `rule`, with its verdict (`freed`, `would_free`, ...).
    pub fn reaped(&self, rule: &'static str, outcome: &'static str) {
        self.reaped
            .get_or_create(&Reaped {
                reason: rule,
                outcome,
            })
            .inc();
    }

    /// GPU memory verified back after a free by `rule`.
    pub fn freed_bytes(&self, rule: &'static str, bytes: u64) {
        self.bytes
            .get_or_create(&Reason { reason: rule })
            .inc_by(bytes);
    }

    pub fn fault(&self) {
        self.faults.inc();
    }

    /// Keeps a full look for the page's GPU families.
    pub fn looked(&mut self, snapshot: &Snapshot) {
        self.last = Some(Arc::new(snapshot.clone()));
    }

    /// One cycle done, now: the page is encoded again.
    pub fn ran(&self, figures: &ScanFigures) {
        self.cycles.inc();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        self.last_run.set(now);
        if let Some(snapshot) = &self.last {
            self.publish(snapshot, figures);
        }
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "reaped",
            "Processes the watch handled, by rule (reason) and verdict (outcome: freed, exited, still_held, permission_denied, unchecked, would_free, refused; a single pass's seen_once, spared)",
            self.reaped.clone(),
        );
        registry.register_with_unit(
            "reaped",
            "GPU memory the watch's frees gave back, verified through the driver, by rule",
            Unit::Bytes,
            self.bytes.clone(),
        );
        registry.register_with_unit(
            "reap_last_run_timestamp",
            "When the watch last finished a cycle (a look at the host)",
            Unit::Seconds,
            self.last_run.clone(),
        );
        registry.register(
            "reap_cycles",
            "Cycles the watch ran (each one an interval)",
            self.cycles.clone(),
        );
        registry.register(
            "reap_faults",
            "Full looks in which the driver failed, a GPU was lost or /proc was partly unreadable (nothing was signalled)",
            self.faults.clone(),
        );
    }

    /// Re-encodes the page from the last full look and these counters.
    fn publish(&self, snapshot: &Snapshot, figures: &ScanFigures) {
        let page = metrics::encode_snapshot_with(snapshot, figures, &Options::default(), &|r| {
            self.register(r)
        });
        if let Ok(mut slot) = self.page.lock() {
            *slot = Arc::new(page);
        }
    }

    /// What a scrape is served now.
    pub fn page(&self) -> Arc<Exposition> {
        self.page
            .lock()
            .map(|slot| Arc::clone(&slot))
            .unwrap_or_else(|poisoned| Arc::clone(&poisoned.into_inner()))
    }
}
