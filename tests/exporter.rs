//! Monitoring, for real: `gpureap exporter` scraped by a real Prometheus,
//! its output and the rules judged by the real promtool, the manifests by
//! kubernetes-validate, and the server's limits (concurrent scrapes, idle
//! connections, other methods, a driver failing mid-run, SIGTERM).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};

use crate::harness::*;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

/// One sample of an exposition: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// The samples of a Prometheus text exposition (label values without
/// escapes, as the staged ones are).
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("sample value");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let rest = rest.strip_suffix('}').expect("closing brace");
                    let labels = rest
                        .split("\",")
                        .filter(|pair| !pair.is_empty())
                        .map(|pair| {
                            let (key, value) = pair.split_once("=\"").expect("label");
                            (key.to_string(), value.trim_end_matches('"').to_string())
                        })
                        .collect();
                    (name.to_string(), labels)
                }
                None => (series.to_string(), BTreeMap::new()),
            };
            Sample {
                name,
                labels,
                value: value.parse().expect("number"),
            }
        })
        .collect()
}

/// The value of the one sample of `name` whose labels include `labels`.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<&Sample> = samples
        .iter()
        .filter(|sample| {
            sample.name == name
                && labels
                    .iter()
                    .all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(value))
        })
        .collect();
    assert!(
        matching.len() <= 1,
        "several {name} {labels:?}: {matching:?}"
    );
    matching.first().map(|sample| sample.value)
}

/// A running `gpureap exporter`, killed when dropped.
pub struct Exporter {
    child: Child,
    pub address: SocketAddr,
}

impl Exporter {
    pub fn start(host: &SimHost, flags: &[&str]) -> Exporter {
        let mut child = gpureap(host)
            .args(["exporter", "--listen", "127.0.0.1:0"])
            .args(flags)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("exporter starts");
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let mut line = String::new();
        stderr.read_line(&mut line).expect("first line");
        let address = http_address(&line);
        // Keep draining, so that the exporter never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stderr.read_to_string(&mut rest);
        });
        Exporter { child, address }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn scrape(&self) -> String {
        let (status, body) = http(self.address, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Scrapes until `done` holds for the samples (the exporter refreshes in
    /// the background), for at most 30 s.
    pub fn scrape_until(&self, what: &str, done: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = samples(&self.scrape());
            if done(&found) {
                return found;
            }
            assert!(Instant::now() < deadline, "never saw {what}: {found:#?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends a raw request; returns the status and the body (the server closes
/// every connection after its answer).
pub fn http(address: SocketAddr, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    stream.write_all(request.as_bytes()).expect("request sent");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response read");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response}"));
    (status, body.to_string())
}

/// Runs a tool CI installs (`.ci/run`); its absence fails the test.
fn tool(program: &str, args: &[&str], stdin: Option<&str>) -> Run {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("{program} ({error}): .ci/run installs it"));
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("stdin written");
    }
    child.wait_with_output().expect("tool runs").into()
}

/// An orphaned two-worker server (20 GiB on GPU 0, 30 GiB on GPU 1), a
/// colleague's 5 GiB notebook on GPU 1, 3 GiB held by no process on GPU 2.
fn staged_incident(host: &SimHost) -> (Incident, Vec<u32>, u32) {
    let mut incident = Incident::new(host);
    let (launcher, workers) =
        incident.sglang_tree([scheduler(0, 20 * GIB), scheduler(1, 30 * GIB)]);
    let notebook = incident.hold(Holder::new("jupyter-kernel colleague").on(1, 5 * GIB));
    incident.orphan(launcher, &workers);
    host.leak(2, 3 * GIB).expect("leak");
    (incident, workers.to_vec(), notebook)
}

#[test]
fn status_prometheus_passes_promtool_and_says_what_status_says() {
    let host = Sim::gpus(3).build();
    let (_incident, workers, notebook) = staged_incident(&host);
    let exposition = run(&host, &["status", "--prometheus", "--per-process"]);
    assert_eq!(exposition.code, 0, "{}", exposition.stderr);
    let lint = tool("promtool", &["check", "metrics"], Some(&exposition.stdout));
    assert_eq!(
        (lint.code, lint.stdout.as_str(), lint.stderr.as_str()),
        (0, "", ""),
        "promtool check metrics found problems in:\n{}",
        exposition.stdout
    );
    // HELP on every family.
    for line in exposition
        .stdout
        .lines()
        .filter(|l| l.starts_with("# TYPE "))
    {
        let name = line.split(' ').nth(2).expect("name");
        assert!(
            exposition.stdout.contains(&format!("# HELP {name} ")),
            "{name} has no HELP"
        );
    }

    let status = run(&host, &["status", "--json"]).json();
    let found = samples(&exposition.stdout);
    for index in 0..3u32 {
        let gpu = gpu(&status, index);
        let labels = [
            ("gpu", &*index.to_string()),
            ("uuid", gpu["uuid"].as_str().expect("uuid")),
        ];
        for (metric, field) in [
            ("gpureap_gpu_memory_used_bytes", "memory_used"),
            ("gpureap_gpu_memory_total_bytes", "memory_total"),
            (
                "gpureap_gpu_memory_unattributed_bytes",
                "memory_unattributed",
            ),
        ] {
            assert_eq!(
                value(&found, metric, &labels),
                Some(gpu[field].as_u64().expect(field) as f64),
                "{metric} on GPU {index}"
            );
        }
    }
    fn on(index: &str) -> [(&str, &str); 1] {
        [("gpu", index)]
    }
    assert_eq!(
        value(&found, "gpureap_gpu_memory_unattributed_bytes", &on("2")),
        Some((3 * GIB) as f64)
    );
    assert_eq!(value(&found, "gpureap_gpu_holders", &on("0")), Some(1.0));
    assert_eq!(value(&found, "gpureap_gpu_holders", &on("1")), Some(2.0));
    assert_eq!(value(&found, "gpureap_gpu_holders", &on("2")), Some(0.0));
    // The orphaned workers' memory, not the colleague's notebook.
    assert_eq!(
        value(&found, "gpureap_gpu_orphaned_memory_bytes", &on("0")),
        Some((20 * GIB) as f64)
    );
    assert_eq!(
        value(&found, "gpureap_gpu_orphaned_memory_bytes", &on("1")),
        Some((30 * GIB) as f64)
    );
    assert_eq!(
        value(&found, "gpureap_gpu_orphaned_memory_bytes", &on("2")),
        Some(0.0)
    );
    assert_eq!(
        value(&found, "gpureap_driver_up", &[("backend", "sim")]),
        Some(1.0)
    );
    assert_eq!(value(&found, "gpureap_scans_total", &[]), Some(1.0));
    assert_eq!(value(&found, "gpureap_scan_errors_total", &[]), Some(0.0));
    // Per process: the driver-listed rows, with the flags status gives.
    let worker = workers[1].to_string();
    assert_eq!(
        value(
            &found,
            "gpureap_process_gpu_memory_bytes",
            &[("pid", &worker), ("gpu", "1"), ("flags", "orphaned")]
        ),
        Some((30 * GIB) as f64)
    );
    let notebook = notebook.to_string();
    assert_eq!(
        value(
            &found,
            "gpureap_process_gpu_memory_bytes",
            &[
                ("pid", &notebook),
                ("gpu", "1"),
                ("flags", ""),
                ("user", "root")
            ]
        ),
        Some((5 * GIB) as f64)
    );
    assert_eq!(
        found
            .iter()
            .filter(|s| s.name == "gpureap_process_gpu_memory_bytes")
            .count(),
        3,
        "one row per driver-listed process and GPU"
    );

    // Without --per-process, no per-process series.
    let plain = run(&host, &["status", "--prometheus"]);
    assert!(!plain.stdout.contains("gpureap_process_gpu_memory_bytes"));
    // --gpu narrows the GPU series.
    let narrowed = samples(&run(&host, &["status", "--prometheus", "--gpu", "2"]).stdout);
    assert!(
        narrowed
            .iter()
            .filter(|s| s.labels.contains_key("gpu"))
            .all(|s| s.labels["gpu"] == "2")
    );
}

/// A comm and a command line may hold any byte. `status --prometheus` ran
/// the exposition through the terminal escaping, which made `\r` of a raw
/// CR, an escape the text format does not have: promtool refused the whole
/// exposition (and node_exporter's textfile collector drops every metric
/// of such a file). Now the label values are anyone's text written out as
/// `status` shows it, which prometheus-client then encodes: valid whatever
/// the bytes, and nothing in it a terminal acts on.
#[test]
fn any_byte_in_a_comm_keeps_the_exposition_valid() {
    let (host, mut incident) = Sim::gpus(1).stage();
    incident
        .spawn(
            &named_holder("p", b"p\r\n\\\"\xff\x1b[2K", b"a\r\n\\\"\xff", 0),
            1,
        )
        .expect("holder");
    // Written out (\r, \n), then encoded (\\ and \"); the byte that is not
    // UTF-8 reads as U+FFFD.
    let comm = &format!(r#"comm="a\\r\\n\\\"{}""#, '\u{fffd}');
    let exposition = run(&host, &["status", "--prometheus", "--per-process"]);
    assert_eq!(exposition.code, 0, "{}", exposition.stderr);
    let exporter = Exporter::start(&host, &["--per-process", "--interval", "1h"]);
    let (status, openmetrics) = http(
        exporter.address,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n",
    );
    assert_eq!(status, 200);
    for (what, text) in [
        ("status --prometheus", exposition.stdout.as_str()),
        ("the exporter", &exporter.scrape()),
        ("the exporter's OpenMetrics", &openmetrics),
    ] {
        if what != "the exporter's OpenMetrics" {
            let lint = tool("promtool", &["check", "metrics"], Some(text));
            assert_eq!(
                (lint.code, lint.stdout.as_str(), lint.stderr.as_str()),
                (0, "", ""),
                "promtool check metrics refused {what}:\n{text}"
            );
        }
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{what} wrote a control character: {text:?}"
        );
        assert!(text.contains(comm), "{what}: {text}");
    }
}

#[test]
fn exporter_output_passes_promtool_and_post_changes_nothing() {
    let host = Sim::gpus(2).build();
    let (_incident, workers, _) = staged_incident(&host);
    let exporter = Exporter::start(&host, &["--per-process", "--interval", "1h"]);
    let lint = tool("promtool", &["check", "metrics"], Some(&exporter.scrape()));
    assert_eq!(
        (lint.code, lint.stdout.as_str(), lint.stderr.as_str()),
        (0, "", "")
    );
    // Prometheus asks for OpenMetrics and gets it.
    let (status, body) = http(
        exporter.address,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n",
    );
    assert_eq!(status, 200);
    assert!(body.ends_with("# EOF\n"), "{body}");

    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        let (status, _) = http(
            exporter.address,
            &format!("{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nkill"),
        );
        assert_eq!(status, 405, "{method}");
    }
    for path in ["/", "/free", "/metrics/../free", "/metricsx"] {
        let (status, _) = http(
            exporter.address,
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"),
        );
        assert_eq!(status, 404, "{path}");
    }
    let (status, _) = http(exporter.address, "NONSENSE\r\n\r\n");
    assert_eq!(status, 400);
    // Nothing was signalled: the orphans still hold their memory.
    assert!(workers.iter().all(|&pid| alive(pid)));
    assert_eq!(
        run(&host, &["status", "--json"]).json()["gpus"][1]["memory_used"],
        35 * GIB
    );
}

#[test]
fn concurrent_scrapes_cost_one_scan() {
    let host = Sim::gpus(1).build();
    let exporter = Exporter::start(&host, &["--interval", "1h"]);
    let address = exporter.address;
    let scrapers: Vec<_> = (0..16)
        .map(|_| {
            std::thread::spawn(move || {
                (0..10)
                    .map(|_| {
                        let (status, body) = http(address, "GET /metrics HTTP/1.1\r\n\r\n");
                        assert_eq!(status, 200);
                        value(&samples(&body), "gpureap_scans_total", &[]).expect("scans_total")
                    })
                    .collect::<Vec<f64>>()
            })
        })
        .collect();
    for scraper in scrapers {
        assert_eq!(scraper.join().expect("scraper"), vec![1.0; 10]);
    }
}

#[test]
fn two_hundred_idle_connections_do_not_stop_a_scrape() {
    let host = Sim::gpus(1).build();
    let exporter = Exporter::start(&host, &["--interval", "1h"]);
    // Idle clients: half say nothing, half start a request and stall.
    let idle: Vec<TcpStream> = (0..200)
        .map(|index| {
            let mut stream = TcpStream::connect(exporter.address).expect("idle connection");
            if index % 2 == 1 {
                stream.write_all(b"GET /metr").expect("partial request");
            }
            stream
        })
        .collect();
    let scrape = exporter.scrape();
    assert!(scrape.contains("gpureap_driver_up"));
    // The server kept at most 64: the longest-waiting idle ones were closed for the others.
    let closed = idle
        .iter()
        .filter(|stream| {
            stream.set_nonblocking(true).expect("nonblocking");
            matches!((&**stream).read(&mut [0u8; 16]), Ok(0))
        })
        .count();
    assert!(
        closed >= 200 - 64,
        "only {closed} idle connections were closed"
    );
}

#[test]
fn a_driver_failing_mid_run_shows_as_down_and_the_exporter_keeps_serving() {
    let host = Sim::gpus(2).build();
    let exporter = Exporter::start(&host, &["--interval", "100ms"]);
    let up = |found: &[Sample], name: &str, labels: &[(&str, &str)]| value(found, name, labels);
    let first = samples(&exporter.scrape());
    assert_eq!(up(&first, "gpureap_driver_up", &[]), Some(1.0));

    let uuid_of = |found: &[Sample], gpu: &str| -> Option<String> {
        found
            .iter()
            .find(|sample| {
                sample.name == "gpureap_gpu_up"
                    && sample.labels.get("gpu").map(String::as_str) == Some(gpu)
            })
            .and_then(|sample| sample.labels.get("uuid").cloned())
    };
    let uuid = uuid_of(&first, "1").expect("GPU 1 has a uuid label");

    // GPU 1 falls off the bus.
    host.lose(1).expect("lost");
    let found = exporter.scrape_until("GPU 1 down", |found| {
        up(found, "gpureap_gpu_up", &[("gpu", "1")]) == Some(0.0)
    });
    // Still the same series: the lost GPU keeps its uuid label.
    assert_eq!(uuid_of(&found, "1"), Some(uuid), "{found:#?}");
    assert_eq!(up(&found, "gpureap_gpu_up", &[("gpu", "0")]), Some(1.0));
    assert_eq!(up(&found, "gpureap_driver_up", &[]), Some(1.0));
    assert_eq!(
        up(&found, "gpureap_gpu_memory_used_bytes", &[("gpu", "1")]),
        None,
        "unknown is not 0"
    );

    // The whole driver fails (its claims directory is replaced by a symlink, which it refuses).
    let claims = host.path().join("claims");
    std::fs::rename(&claims, host.path().join("claims.away")).expect("claims moved");
    std::os::unix::fs::symlink("/nonexistent", &claims).expect("symlink");
    let down = exporter.scrape_until("driver down", |found| {
        up(found, "gpureap_driver_up", &[]) == Some(0.0)
    });
    assert!(up(&down, "gpureap_scan_errors_total", &[]).expect("errors") >= 1.0);
    assert!(
        down.iter()
            .all(|sample| !sample.name.starts_with("gpureap_gpu_memory")),
        "no memory figures without a driver: {down:#?}"
    );

    // It comes back, and so does the exporter's view.
    std::fs::remove_file(&claims).expect("symlink removed");
    std::fs::rename(host.path().join("claims.away"), &claims).expect("claims back");
    std::fs::remove_file(host.path().join("lost.1")).expect("found");
    exporter.scrape_until("driver and GPU 1 back", |found| {
        up(found, "gpureap_driver_up", &[]) == Some(1.0)
            && up(found, "gpureap_gpu_up", &[("gpu", "1")]) == Some(1.0)
    });
    assert!(alive(exporter.pid()));
}

/// The limit is on the request head, not on one read: a head of 8,200
/// bytes that arrives whole is refused as one that trickles in.
#[test]
fn request_heads_over_8_kib_are_refused_even_in_one_read() {
    let host = Sim::gpus(1).build();
    let exporter = Exporter::start(&host, &[]);
    let head = |size: usize| {
        let start = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ";
        let end = "\r\n\r\n";
        format!("{start}{}{end}", "a".repeat(size - start.len() - end.len()))
    };
    let (status, body) = http(exporter.address, &head(8200));
    assert_eq!(status, 431, "{body}");
    // A head of exactly 8 KiB is still answered.
    let (status, body) = http(exporter.address, &head(8 << 10));
    assert_eq!(status, 200, "{body}");
}

#[test]
fn sigterm_ends_the_exporter_cleanly() {
    let host = Sim::gpus(1).build();
    let mut exporter = Exporter::start(&host, &[]);
    exporter.scrape();
    // Safety: a plain kill(2) of the child this test started and has not reaped.
    assert_eq!(
        unsafe { libc::kill(exporter.pid() as i32, libc::SIGTERM) },
        0
    );
    let status = exporter.child.wait().expect("exporter ends");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn exporter_flags_are_checked() {
    let host = Sim::gpus(1).build();
    for (flags, says) in [
        (&["exporter", "--listen", "9839"][..], "expected IP:PORT"),
        (&["exporter", "--listen", ":9839"][..], "expected IP:PORT"),
        (
            &["exporter", "--listen", "localhost:9839"][..],
            "expected IP:PORT",
        ),
        (&["exporter", "--interval", "10ms"][..], "at least 100ms"),
        (&["exporter", "--interval", "0"][..], "at least 100ms"),
        (
            &["status", "--prometheus", "--json"][..],
            "cannot be used with",
        ),
        (&["status", "--per-process"][..], "--prometheus"),
        (
            &["run", "--metrics", "nowhere", "--", "true"][..],
            "expected IP:PORT",
        ),
    ] {
        let result = run(&host, flags);
        assert_eq!(result.code, 2, "{flags:?}: {}", result.stderr);
        assert!(result.stderr.contains(says), "{flags:?}: {}", result.stderr);
    }
    // A port already taken: says which, and listens nowhere else.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = taken.local_addr().expect("address").to_string();
    let result = run(&host, &["exporter", "--listen", &address]);
    assert_eq!(result.code, 3, "{}", result.stderr);
    assert_contains(&result.stderr, &format!("cannot listen on {address}"));
}

/// A real Prometheus, on loopback, with its storage in a temporary
/// directory; killed (by its PID) when dropped.
struct Prometheus {
    child: Child,
    port: u16,
    _storage: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Prometheus {
        let storage = tempfile::Builder::new()
            .prefix("gpureap-prometheus-")
            .tempdir()
            .expect("storage");
        let config = storage.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: gpureap\n    static_configs:\n      - targets: ['{target}']\n",
                deploy("prometheus/gpureap-rules.yml").display()
            ),
        )
        .expect("config");
        let port = crate::run::free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                storage.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (.ci/run installs it)");
        Prometheus {
            child,
            port,
            _storage: storage,
        }
    }

    /// The value of an instant query with one result, once it has one
    /// satisfying `done` (the first scrape comes a few seconds after start).
    fn query_until(&self, query: &str, done: impl Fn(f64) -> bool) -> f64 {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .http_status_as_error(false)
            .build()
            .into();
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut last = String::new();
        loop {
            if let Ok(mut response) = agent
                .get(format!("http://127.0.0.1:{}/api/v1/query", self.port))
                .query("query", query)
                .call()
                && let Ok(body) = response.body_mut().read_to_string()
            {
                let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                if let Some(results) = json["data"]["result"].as_array()
                    && results.len() == 1
                    && let Some(value) =
                        results[0]["value"][1].as_str().and_then(|v| v.parse().ok())
                    && done(value)
                {
                    return value;
                }
                last = body;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus never answered {query}: {last}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_real_prometheus_scrapes_what_the_simulated_driver_holds() {
    let host = Sim::gpus(3).build();
    let (_incident, _workers, _) = staged_incident(&host);
    let exporter = Exporter::start(&host, &["--interval", "1s"]);
    let prometheus = Prometheus::start(exporter.address);
    let exact = |query: &str, expected: u64| {
        let got = prometheus.query_until(query, |value| value == expected as f64);
        assert_eq!(got, expected as f64, "{query}");
    };
    exact("up{job=\"gpureap\"}", 1);
    exact("gpureap_gpu_memory_used_bytes{gpu=\"1\"}", 35 * GIB);
    exact("gpureap_gpu_memory_total_bytes{gpu=\"0\"}", 80 * GIB);
    exact("gpureap_gpu_memory_unattributed_bytes{gpu=\"2\"}", 3 * GIB);
    exact("gpureap_gpu_orphaned_memory_bytes{gpu=\"0\"}", 20 * GIB);
    exact("gpureap_gpu_holders{gpu=\"1\"}", 2);
    exact("gpureap_driver_up", 1);
    // The counters arrive as counters: rate() works on them.
    prometheus.query_until("increase(gpureap_scans_total[1m])", |value| value > 0.0);
    // The rules load: the orphans' alert is pending (it fires after 2 minutes).
    exact(
        "count(ALERTS{alertname=\"GpuMemoryHeldByOrphans\", alertstate=\"pending\"})",
        2,
    );
}

#[test]
fn the_rules_pass_promtool_and_their_unit_tests() {
    let rules = deploy("prometheus/gpureap-rules.yml");
    let check = tool(
        "promtool",
        &["check", "rules", rules.to_str().expect("path")],
        None,
    );
    assert_eq!(check.code, 0, "{}{}", check.stdout, check.stderr);
    assert_contains(&check.stdout, "SUCCESS: 5 rules found");
    let tests = deploy("prometheus/gpureap-rules.test.yml");
    let test = tool(
        "promtool",
        &["test", "rules", tests.to_str().expect("path")],
        None,
    );
    assert_eq!(test.code, 0, "{}{}", test.stdout, test.stderr);
}

fn manifests() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(deploy("kubernetes"))
        .expect("deploy/kubernetes")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    found.sort();
    found
}

#[test]
fn every_manifest_passes_kubernetes_validate_strict() {
    let files = manifests();
    assert!(files.len() >= 2, "{files:?}");
    for file in &files {
        let result = tool(
            "kubernetes-validate",
            &["--strict", file.to_str().expect("path")],
            None,
        );
        assert_eq!(
            result.code,
            0,
            "{}: {}{}",
            file.display(),
            result.stdout,
            result.stderr
        );
    }
    // The validator does reject what it should: an unknown field.
    let scratch = tempfile::Builder::new()
        .prefix("gpureap-k8s-")
        .tempdir()
        .expect("dir");
    let bad = scratch.path().join("bad.yaml");
    let daemonset =
        std::fs::read_to_string(deploy("kubernetes/gpureap-exporter.yaml")).expect("read");
    std::fs::write(
        &bad,
        daemonset.replace("hostPID: true", "hostPID: true\n      hostPIDs: true"),
    )
    .expect("write");
    let result = tool(
        "kubernetes-validate",
        &["--strict", bad.to_str().expect("path")],
        None,
    );
    assert_ne!(result.code, 0, "{}", result.stdout);
}

#[test]
fn the_daemonset_is_read_only_and_on_gpu_nodes_only() {
    let text = std::fs::read_to_string(deploy("kubernetes/gpureap-exporter.yaml")).expect("read");
    for needed in [
        "hostPID: true",
        "readOnlyRootFilesystem: true",
        "allowPrivilegeEscalation: false",
        "drop: [\"ALL\"]",
        "nvidia.com/gpu.present: \"true\"",
        "\"exporter\"",
    ] {
        assert!(text.contains(needed), "{needed} missing");
    }
    assert!(
        !text.contains("add:"),
        "the exporter needs no added capability"
    );
    assert!(!text.contains("privileged: true"));
}

/// What the Python expression `json_text` (over `docs`, the YAML documents
/// of `file` read with PyYAML, kubernetes-validate's own dependency) prints,
/// read as JSON.
pub(crate) fn from_yaml(file: &std::path::Path, json_text: &str) -> serde_json::Value {
    let output = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sys, json, yaml; docs = list(yaml.safe_load_all(open(sys.argv[1]))); print({json_text})"
        ))
        .arg(file)
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{json_text} of {}: {error}", file.display()))
}

/// The DaemonSet's pod spec and the exporter's container, as JSON.
fn exporter_daemonset() -> serde_json::Value {
    from_yaml(
        &deploy("kubernetes/gpureap-exporter.yaml"),
        "json.dumps([d for d in docs if d['kind'] == 'DaemonSet'][0])",
    )
}

#[test]
fn the_daemonset_reads_the_nodes_container_sources_read_only_with_flags_gpureap_takes() {
    let daemonset = exporter_daemonset();
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    let container = &pod["containers"][0];
    let args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|arg| arg.as_str().expect("a string").to_string())
        .collect();
    // The arguments are the real command line's.
    let mut argv = vec!["gpureap".to_string()];
    argv.extend(args.iter().cloned());
    if let Err(error) = <gpureap::cli::Cli as clap::Parser>::try_parse_from(&argv) {
        panic!("{argv:?}: {error}");
    }
    let value_of = |flag: &str| {
        let at = args.iter().position(|arg| arg == flag);
        at.and_then(|at| args.get(at + 1))
            .unwrap_or_else(|| panic!("{flag} missing: {args:?}"))
            .clone()
    };
    let host_root = value_of("--host-root");
    let socket = value_of("--kubelet-socket");
    let mounts = container["volumeMounts"].as_array().expect("volumeMounts");
    let volumes = pod["volumes"].as_array().expect("volumes");
    for mount in mounts {
        assert_eq!(mount["readOnly"], true, "{mount}");
        let path = mount["mountPath"].as_str().expect("mountPath");
        let volume = volumes
            .iter()
            .find(|volume| volume["name"] == mount["name"])
            .unwrap_or_else(|| panic!("no volume for {mount}"));
        // Mounted under the host root at the node's own path.
        let node_path = volume["hostPath"]["path"].as_str().expect("a hostPath");
        assert_eq!(path, format!("{host_root}{node_path}"), "{volume}");
    }
    for needed in [
        "/var/lib/kubelet/pod-resources",
        "/var/log/pods",
        "/run/containerd/io.containerd.runtime.v2.task",
        "/var/lib/docker/containers",
    ] {
        assert!(
            volumes
                .iter()
                .any(|volume| volume["hostPath"]["path"] == needed),
            "{needed} is not mounted"
        );
    }
    let socket_dir = std::path::Path::new(&socket).parent().expect("a folder");
    assert!(
        mounts.iter().any(
            |mount| std::path::Path::new(mount["mountPath"].as_str().unwrap_or("")) == socket_dir
        ),
        "the socket's folder {} is not mounted",
        socket_dir.display()
    );
}

#[test]
fn run_metrics_show_the_supervisors_view() {
    let setup = crate::run::setup(2);
    let supervisor = setup.run_faulty_once(&["--metrics", "127.0.0.1:0"], "stall");
    let line = supervisor.wait_for("metrics: http://", 1);
    let address = http_address(&line);
    // The first start stalls (a hang), the second becomes ready.
    supervisor.wait_for("ready after", 1);
    let (status, body) = http(address, "GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200);
    let lint = tool("promtool", &["check", "metrics"], Some(&body));
    assert_eq!(
        (lint.code, lint.stdout.as_str(), lint.stderr.as_str()),
        (0, "", ""),
        "{body}"
    );
    let found = samples(&body);
    assert_eq!(value(&found, "gpureap_run_starts_total", &[]), Some(2.0));
    assert_eq!(value(&found, "gpureap_run_ready", &[]), Some(1.0));
    assert_eq!(
        value(&found, "gpureap_run_hangs_total", &[("kind", "stall")]),
        Some(1.0)
    );
    assert_eq!(
        value(&found, "gpureap_run_hangs_total", &[("kind", "unhealthy")]),
        Some(0.0)
    );
    assert_eq!(
        value(
            &found,
            "gpureap_run_crashes_total",
            &[("kind", "exit_code")]
        ),
        Some(0.0)
    );
    assert_eq!(value(&found, "gpureap_run_restarts_total", &[]), Some(1.0));
    assert!(
        value(&found, "gpureap_run_last_time_to_ready_seconds", &[]).expect("time to ready") > 0.0
    );
    let (status, _) = http(address, "POST /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, 405);
    let (code, _, _) = supervisor.stop();
    assert_eq!(code, 0);
}

/// The hardware evidence as metrics: Xids by number since boot (a user's
/// forged record not among them), row remapping and ECC where the driver
/// says, nothing (not 0) where it does not; promtool accepts the whole.
#[test]
fn hardware_evidence_is_exported_and_unknown_values_are_left_out() {
    let host = Sim::gpus(2).build();
    host.xid(1, 79, 1_000_000, "GPU has fallen off the bus.")
        .expect("xid");
    host.xid(1, 79, 2_000_000, "GPU has fallen off the bus.")
        .expect("xid");
    host.xid(1, 48, 3_000_000, "DBE").expect("xid");
    host.log_kernel(12, 4_000_000, "NVRM: Xid (PCI:0000:02:00): 95, forged")
        .expect("forged");
    host.health(
        1,
        "row_remap_pending yes\necc_volatile_uncorrected 3\nrecovery_action node_reboot\n",
    )
    .expect("health");
    let exposition = run(&host, &["status", "--prometheus"]);
    assert_eq!(exposition.code, 0, "{}", exposition.stderr);
    let lint = tool("promtool", &["check", "metrics"], Some(&exposition.stdout));
    assert_eq!(lint.code, 0, "{}{}", lint.stdout, lint.stderr);
    let found = samples(&exposition.stdout);
    let gpu1 = |extra: &[(&'static str, &'static str)]| {
        let mut labels = vec![("gpu", "1"), ("uuid", "GPU-sim-00000001")];
        labels.extend_from_slice(extra);
        labels
    };
    assert_eq!(
        value(
            &found,
            "gpureap_gpu_xid_events_total",
            &gpu1(&[("xid", "79")])
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &found,
            "gpureap_gpu_xid_events_total",
            &gpu1(&[("xid", "48")])
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &found,
            "gpureap_gpu_xid_events_total",
            &gpu1(&[("xid", "95")])
        ),
        None
    );
    assert_eq!(
        value(&found, "gpureap_gpu_row_remap_pending", &gpu1(&[])),
        Some(1.0)
    );
    assert_eq!(
        value(&found, "gpureap_gpu_ecc_uncorrected_volatile", &gpu1(&[])),
        Some(3.0)
    );
    assert_eq!(
        value(&found, "gpureap_gpu_recovery_action", &gpu1(&[])),
        Some(2.0)
    );
    assert_eq!(
        value(&found, "gpureap_gpu_row_remap_failure", &gpu1(&[])),
        None
    );
    assert_eq!(
        value(
            &found,
            "gpureap_gpu_row_remap_pending",
            &[("gpu", "0"), ("uuid", "GPU-sim-00000000")]
        ),
        None
    );
}

/// Between full looks the exporter watches the driver's figures
/// (`pace::Pace`): a holder that appears is served at once, not at the next
/// interval (an hour here), and no scan is taken while nothing changes.
#[test]
fn a_new_holder_is_served_before_the_interval_and_an_idle_host_is_not_rescanned() {
    let host = Sim::gpus(1).build();
    let exporter = Exporter::start(&host, &["--interval", "1h"]);
    let first = samples(&exporter.scrape());
    assert_eq!(value(&first, "gpureap_scans_total", &[]), Some(1.0));
    let mut incident = Incident::new(&host);
    incident.hold(Holder::new("late-worker").on(0, 3 * GIB));
    let found = exporter.scrape_until("the new holder's memory", |found| {
        value(found, "gpureap_gpu_memory_used_bytes", &[("gpu", "0")]) == Some((3 * GIB) as f64)
    });
    // One look for the change, and one a moment later at most (a holder
    // caught between its claim and its node): not one per scrape.
    let scans = value(&found, "gpureap_scans_total", &[]).expect("scans");
    assert!((2.0..=3.0).contains(&scans), "{scans} scans");
}

/// What each GPU is doing, beside its memory: utilization as a ratio,
/// temperature, power and its limit, and the memory the driver reserves
/// (not in gpureap_gpu_memory_used_bytes), in base units; nothing (not 0)
/// where the driver does not say; promtool accepts the whole, and the
/// running exporter serves a new reading.
#[test]
fn activity_and_reserved_memory_are_exported_in_base_units_and_unknown_values_left_out() {
    use gpureap_core::driver::sim::incident::H200_RESERVED;
    let host = Sim::gpus(2).build();
    host.reserve(H200_RESERVED).expect("reserved");
    let mut incident = Incident::new(&host);
    incident.hold(scheduler(0, 30 * GIB));
    host.activity(
        0,
        "utilization 87\ntemperature 64\npower 312.4\npower_limit 700\n",
    )
    .expect("activity");
    host.activity(1, "temperature 33\n").expect("activity");
    let exposition = run(&host, &["status", "--prometheus"]);
    assert_eq!(exposition.code, 0, "{}", exposition.stderr);
    let lint = tool("promtool", &["check", "metrics"], Some(&exposition.stdout));
    assert_eq!(
        (lint.code, lint.stdout.as_str(), lint.stderr.as_str()),
        (0, "", ""),
        "{}",
        exposition.stdout
    );
    let found = samples(&exposition.stdout);
    let gpu0 = [("gpu", "0"), ("uuid", "GPU-sim-00000000")];
    let gpu1 = [("gpu", "1"), ("uuid", "GPU-sim-00000001")];
    assert_eq!(
        value(&found, "gpureap_gpu_utilization_ratio", &gpu0),
        Some(0.87)
    );
    assert_eq!(
        value(&found, "gpureap_gpu_temperature_celsius", &gpu0),
        Some(64.0)
    );
    assert_eq!(value(&found, "gpureap_gpu_power_watts", &gpu0), Some(312.4));
    assert_eq!(
        value(&found, "gpureap_gpu_power_limit_watts", &gpu0),
        Some(700.0)
    );
    assert_eq!(
        value(&found, "gpureap_gpu_memory_reserved_bytes", &gpu0),
        Some(H200_RESERVED as f64)
    );
    assert_eq!(
        value(&found, "gpureap_gpu_memory_used_bytes", &gpu0),
        Some((30 * GIB) as f64)
    );
    assert_eq!(
        value(&found, "gpureap_gpu_temperature_celsius", &gpu1),
        Some(33.0)
    );
    for unknown in [
        "gpureap_gpu_utilization_ratio",
        "gpureap_gpu_power_watts",
        "gpureap_gpu_power_limit_watts",
    ] {
        assert_eq!(value(&found, unknown, &gpu1), None, "{unknown}");
    }
    assert_contains(
        &exposition.stdout,
        "# HELP gpureap_gpu_memory_used_bytes GPU memory in use, as the driver reports it: NVML's v2 figure",
    );

    let exporter = Exporter::start(&host, &["--interval", "200ms"]);
    exporter.scrape_until("GPU 0 at 87%", |found| {
        value(found, "gpureap_gpu_utilization_ratio", &gpu0) == Some(0.87)
    });
    host.activity(0, "utilization 12\ntemperature 64\n")
        .expect("activity");
    exporter.scrape_until("GPU 0 at 12%, its power unknown now", |found| {
        value(found, "gpureap_gpu_utilization_ratio", &gpu0) == Some(0.12)
            && value(found, "gpureap_gpu_power_watts", &gpu0).is_none()
    });
}
