//! `gpureap exporter`: the snapshot `status` shows, as Prometheus metrics,
//! read-only.
//!
//! A background thread takes a snapshot every `--interval` and encodes it
//! (`metrics`); a scrape is served the last encoding and never scans, so any
//! number of scrapers cost one scan per interval. The server (`http`) is
//! bounded and times out idle clients. A driver that fails shows as
//! `gpureap_driver_up 0` and the exporter keeps serving. SIGTERM or SIGINT
//! ends it cleanly (exit 0).

pub mod http;

use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::container::Sources;
use crate::driver::Driver;
use crate::exit::Exit;
use crate::metrics::{self, Exposition, Options, ScanFigures};
use crate::snapshot::Snapshot;
use http::Page;

#[derive(Debug, Clone)]
pub struct ExporterConfig {
    pub listen: SocketAddr,
    pub interval: Duration,
    pub options: Options,
    /// The node's container sources, consulted after each snapshot (a scan
    /// then takes up to `Sources::BUDGET` longer while the kubelet hangs).
    pub sources: Sources,
}

/// Binds `address`, saying which address could not be bound and why.
pub fn bind(address: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(address).map_err(|error| {
        io::Error::new(error.kind(), format!("cannot listen on {address}: {error}"))
    })
}

/// Takes one snapshot and encodes it, counting it in `figures`.
fn scan(
    driver: &dyn Driver,
    figures: &mut ScanFigures,
    options: &Options,
    sources: &Sources,
) -> Exposition {
    let started = Instant::now();
    let mut snapshot = Snapshot::take_listed(driver);
    figures.count(&snapshot, started.elapsed());
    snapshot.attribute_containers(sources);
    metrics::encode_snapshot(&snapshot, figures, options)
}

/// Runs the exporter until SIGTERM or SIGINT.
pub fn run(config: &ExporterConfig, driver: Box<dyn Driver>) -> io::Result<Exit> {
    let listener = bind(config.listen)?;
    let (stop, stop_write) = UnixStream::pair()?;
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::low_level::pipe::register(signal, stop_write.try_clone()?)?;
    }
    // The first scrape already finds a snapshot.
    let mut figures = ScanFigures::default();
    let first = scan(
        driver.as_ref(),
        &mut figures,
        &config.options,
        &config.sources,
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
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    // A scan longer than the interval is followed by the next at once, not by a backlog.
                    next = (next + interval).max(Instant::now());
                    let body = Arc::new(scan(driver.as_ref(), &mut figures, &options, &sources));
                    if let Ok(mut slot) = latest.lock() {
                        *slot = body;
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

/// Serves a page built at each request on `listener`, from a thread of its
/// own, for as long as the process lives (`gpureap run --metrics`).
pub fn serve_in_background(
    listener: TcpListener,
    page: impl Fn() -> Page + Send + 'static,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("gpureap-metrics".to_string())
        .spawn(move || {
            if let Err(error) = http::serve(listener, None, &page) {
                tracing::warn!(%error, "the metrics server stopped");
            }
        })?;
    Ok(())
}
