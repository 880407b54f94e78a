//! `gpureap exporter`: the snapshot `status` shows, as Prometheus metrics,
//! read-only.
//!
//! A background thread looks at the host every `--interval` through
//! `pace::Pace`: a full look (a snapshot, encoded by `metrics`) when the
//! driver's figures moved (at once, not at the interval), a process of the
//! holders' context died, the last look found a fault, or every
//! `FULL_LOOK_EVERY` intervals; otherwise the last snapshot stays, still
//! true, encoded again with each GPU's activity (utilization, temperature,
//! power) read afresh, since that moves when nothing else does. A scrape is served the last encoding and never scans, so any number
//! of scrapers cost at most one scan per interval. The server (`http`) is
//! bounded and times out idle clients. A driver that fails shows as
//! `gpureap_driver_up 0` and the exporter keeps serving. SIGTERM or SIGINT
//! ends it cleanly (exit 0).

use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::container::Sources;
use crate::driver::Driver;
use crate::exit::Exit;
use crate::http::{self, Page};
use crate::metrics::{self, Exposition, Options, ScanFigures};
use crate::pace::Pace;
use crate::snapshot::Snapshot;

#[derive(Debug, Clone)]
pub struct ExporterConfig {
    pub listen: SocketAddr,
    pub interval: Duration,
    pub options: Options,
    /// The node's container sources, consulted after each snapshot (a scan
    /// then takes up to `Sources::BUDGET` longer while the kubelet hangs).
    pub sources: Sources,
}

/// Takes one snapshot and encodes it, counting it in `figures`; `pace`
/// remembers what it saw, and whether it found a fault.
fn scan(
    driver: &dyn Driver,
    figures: &mut ScanFigures,
    options: &Options,
    sources: &Sources,
    pace: &mut Pace,
) -> (Snapshot, Exposition, bool) {
    let started = Instant::now();
    let mut snapshot = Snapshot::take_listed(driver);
    figures.count(&snapshot, started.elapsed());
    pace.looked(&snapshot);
    let failed = metrics::scan_failed(&snapshot);
    // Not in the scan's duration: the kernel log is the driver's evidence.
    snapshot.read_evidence(driver);
    snapshot.read_activity(driver);
    // The container sources are asked only on a full look: at most once
    // per interval, and no more often than the holders change or
    // `FULL_LOOK_EVERY` intervals pass.
    snapshot.attribute_containers(sources);
    let exposition = metrics::encode_snapshot(&snapshot, figures, options);
    (snapshot, exposition, failed)
}

/// How soon after a look that a change caused the next look follows.
const SETTLE: Duration = Duration::from_millis(250);

/// Runs the exporter until SIGTERM or SIGINT.
pub fn run(config: &ExporterConfig, driver: Box<dyn Driver>) -> io::Result<Exit> {
    let listener = http::bind(config.listen)?;
    let (stop, stop_write) = UnixStream::pair()?;
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::low_level::pipe::register(signal, stop_write.try_clone()?)?;
    }
    // The first scrape already finds a snapshot.
    let mut figures = ScanFigures::default();
    let mut pace = Pace::default();
    driver.will_wait();
    let (mut last, first, mut failed) = scan(
        driver.as_ref(),
        &mut figures,
        &config.options,
        &config.sources,
        &mut pace,
    );
    let latest = Arc::new(Mutex::new(Arc::new(first)));
    // A closed or broken stderr must not stop a daemon: these lines are best effort.
    let _ = writeln!(
        io::stderr(),
        "gpureap exporter: serving http://{}/metrics ({}, a snapshot every {})",
        listener.local_addr()?,
        driver.describe(),
        crate::units::Elapsed(config.interval)
    );
    {
        let latest = Arc::clone(&latest);
        let interval = config.interval;
        let options = config.options.clone();
        let sources = config.sources.clone();
        std::thread::Builder::new()
            .name("gpureap-scan".to_string())
            .spawn(move || {
                let mut next = Instant::now() + interval;
                loop {
                    // Until the next interval, the driver's figures are
                    // watched: a change does not wait for it.
                    while !pace.changed() {
                        let left = next.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break;
                        }
                        pace.wait(driver.as_ref(), left);
                    }
                    // A change is looked at again a moment later (a holder
                    // caught between its first step and its context).
                    let settle = pace.changed();
                    // A scan longer than the interval is followed by the next at once, not by a backlog.
                    next = (next + interval).max(Instant::now());
                    // Between full looks the last snapshot stays: it is still
                    // true (the figures and the holders' context unchanged),
                    // and never older than FULL_LOOK_EVERY intervals; only
                    // the activity is read again, at most once an interval.
                    let body = if pace.full_look_due(failed) {
                        let (snapshot, body, fault) =
                            scan(driver.as_ref(), &mut figures, &options, &sources, &mut pace);
                        last = snapshot;
                        failed = fault;
                        body
                    } else {
                        last.read_activity(driver.as_ref());
                        metrics::encode_snapshot(&last, &figures, &options)
                    };
                    if let Ok(mut slot) = latest.lock() {
                        *slot = Arc::new(body);
                    }
                    if settle {
                        next = next.min(Instant::now() + SETTLE);
                        failed = true;
                    }
                }
            })?;
    }
    let page = || -> Page {
        latest
            .lock()
            .map(|slot| Arc::clone(&slot))
            .unwrap_or_else(|poisoned| Arc::clone(&poisoned.into_inner()))
    };
    http::serve(listener, Some(&stop), &page)?;
    let _ = writeln!(io::stderr(), "gpureap exporter: stopped by a signal");
    Ok(Exit::Success)
}
