//! `gpureap reap [--watch]` with real processes on the simulated driver:
//! what a policy frees, what it must never touch, its decision log, and its
//! behaviour under faults and SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};
use serde_json::Value;

use crate::harness::*;

/// An SGLang server with one worker on `gpu`, its launcher killed: the
/// worker, an orphan.
fn orphaned_worker(incident: &mut Incident, title: &str, gpu: u32) -> u32 {
    let [worker] = incident.orphaned_sglang([Holder::new(title).on(gpu, 30 * GIB)]);
    worker
}

/// Seconds since boot, in clock ticks.
fn uptime_ticks() -> u64 {
    let uptime = std::fs::read_to_string("/proc/uptime").expect("uptime");
    let seconds: f64 = uptime
        .split_whitespace()
        .next()
        .and_then(|seconds| seconds.parse().ok())
        .expect("uptime");
    (seconds * rustix::param::clock_ticks_per_second() as f64) as u64
}

/// Waits until `pid` is at least `age` old, as the kernel counts it.
fn wait_until_older(pid: u32, age: Duration) {
    let per_second = rustix::param::clock_ticks_per_second();
    let wanted = (age.as_millis() as u64 * per_second).div_ceil(1000) + 1;
    let deadline = Instant::now() + age + Duration::from_secs(10);
    while uptime_ticks().saturating_sub(start_ticks(pid)) < wanted {
        assert!(Instant::now() < deadline, "{pid} does not age");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The decision log's lines, each checked against the published schema.
fn decisions(log: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let validator = crate::schema::schema();
    text.lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
            crate::schema::conforms(&validator, "a reap decision line", &value);
            value
        })
        .collect()
}

fn of_pid(lines: &[Value], pid: u32) -> Vec<&Value> {
    lines
        .iter()
        .filter(|line| line["target"]["pid"] == pid)
        .collect()
}

/// The signals a log line says were sent to its target, in order.
fn signals_of(line: &Value) -> Vec<&str> {
    line["target"]["signals"]
        .as_array()
        .expect("signals")
        .iter()
        .map(|event| event["signal"].as_str().expect("signal"))
        .collect()
}

/// A `gpureap reap --watch` running in the background; SIGKILLed if still
/// running when dropped (only this child).
struct Watching {
    child: Option<Child>,
    log: PathBuf,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Watching {
    fn start(host: &SimHost, args: &[&str]) -> Watching {
        Watching::spawn(host, &["--watch"], args)
    }

    /// A single pass (no `--watch`) in the background.
    fn once(host: &SimHost, args: &[&str]) -> Watching {
        Watching::spawn(host, &[], args)
    }

    fn spawn(host: &SimHost, watch: &[&str], args: &[&str]) -> Watching {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("reap.jsonl");
        let stderr = dir.path().join("stderr");
        let child = gpureap(host)
            .arg("reap")
            .args(watch)
            .arg("--log")
            .arg(&log)
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("gpureap reap starts");
        Watching {
            child: Some(child),
            log,
            stderr,
            _dir: dir,
        }
    }

    /// A sample of the watch's metrics (`--listen 127.0.0.1:0`: the address
    /// it says on stderr).
    fn metric(&self, name: &str) -> f64 {
        let body = self.body();
        body.lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{body}"))
    }

    /// The whole exposition (text format).
    fn body(&self) -> String {
        use std::io::{Read, Write};
        let address = self.address();
        let mut stream = std::net::TcpStream::connect(&address).expect("connect");
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
            .expect("request");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("response");
        response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .expect("a body")
    }

    fn address(&self) -> String {
        poll(
            Duration::from_secs(10),
            Duration::from_millis(10),
            || {
                let stderr = self.stderr();
                let (_, rest) = stderr.split_once("metrics on http://")?;
                Some(rest.split('/').next().expect("address").to_string())
            },
            || format!("no metrics address:\n{}", self.stderr()),
        )
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits until the log has a line `found` accepts; returns every line.
    fn until(&mut self, what: &str, found: impl Fn(&Value) -> bool) -> Vec<Value> {
        let Watching {
            child, log, stderr, ..
        } = self;
        let (log, stderr): (&Path, &Path) = (log, stderr);
        let stderr = || std::fs::read_to_string(stderr).unwrap_or_default();
        poll(
            Duration::from_secs(30),
            Duration::from_millis(20),
            || {
                let lines = decisions(log);
                if lines.iter().any(&found) {
                    return Some(lines);
                }
                if let Some(status) = child.as_mut().and_then(|child| child.try_wait().ok()?) {
                    panic!("the watch ended ({status}) before {what}:\n{}", stderr());
                }
                None
            },
            || {
                let lines = decisions(log);
                format!("no {what} in 30 s; log: {lines:#?}\nstderr:\n{}", stderr())
            },
        )
    }

    /// The exit code of a single pass that ends by itself within `limit`.
    fn ended(&mut self, limit: Duration) -> i32 {
        let mut child = self.child.take().expect("running");
        poll(
            limit,
            Duration::from_millis(10),
            || Some(child.try_wait().expect("try_wait")?.code().unwrap_or(-1)),
            || format!("the pass did not end within {limit:?}:\n{}", self.stderr()),
        )
    }

    /// SIGTERM, then the exit code, within `limit`.
    fn terminate(&mut self, limit: Duration) -> i32 {
        let mut child = self.child.take().expect("running");
        let pid = rustix::process::Pid::from_child(&child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status.code().unwrap_or(-1);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the watch did not end within {limit:?} of SIGTERM:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The state letter of a process (`T` stopped), if it is there.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// An orphan older than the rule is freed and logged, with its figures; a
/// younger orphan, a nohup job whose shell exited and a monitor survive
/// (each is staged before the watch looks, and the watch looks twice before
/// it frees anything).
#[test]
fn an_orphan_older_than_the_rule_is_freed_and_logged_and_nothing_else_is() {
    let (host, mut incident) = Sim::gpus(4).stage();
    let old = orphaned_worker(&mut incident, "sglang::scheduler_TP0", 0);
    let job = Holder::new("python train.py --epochs 90").on(2, 20 * GIB);
    let script = format!(
        "set -m; ( exec nohup bash -c {} >/dev/null 2>&1 ) & exit 0",
        shell_quote(&job.script())
    );
    incident.spawn(&script, 1).expect("nohup job");
    let training = incident.pid_of("python train.py --epochs 90").expect("job");
    let monitor = incident.hold(Holder::new("gpu_exporter --port 9400"));
    wait_until_older(old, Duration::from_secs(10));
    let young = orphaned_worker(&mut incident, "vllm::worker_rank1", 1);

    let mut watch = Watching::start(
        &host,
        &[
            "--orphans",
            "--older-than",
            "10s",
            "--interval",
            "200ms",
            "--grace",
            "200ms",
            "--enforce",
        ],
    );
    watch.until("the old orphan freed", |line| {
        line["action"] == "freed" && line["target"]["pid"] == old
    });
    // Its age now, in ticks: the watch stops next, so it was never older while watched.
    let young_age = uptime_ticks().saturating_sub(start_ticks(young));
    assert_eq!(watch.terminate(Duration::from_secs(10)), 0);
    let lines = decisions(&watch.log);

    assert!(!alive(old), "the old orphan survived");
    if young_age < 10 * rustix::param::clock_ticks_per_second() {
        assert!(
            alive(young),
            "an orphan younger than --older-than was signalled"
        );
        assert!(of_pid(&lines, young).is_empty(), "{lines:#?}");
    } else {
        // A machine so loaded that the watch took longer than the floor:
        // whatever was done to it was done once it was old enough.
        for line in of_pid(&lines, young) {
            assert!(line["age_ms"].as_u64().expect("age") >= 10_000, "{line:#}");
        }
    }
    assert!(alive(training), "the nohup job was signalled");
    assert!(alive(monitor), "the monitor was signalled");
    for pid in [training, monitor] {
        assert!(
            of_pid(&lines, pid).is_empty(),
            "{pid} was named: {lines:#?}"
        );
    }
    let freed = of_pid(&lines, old);
    assert_eq!(freed.len(), 1, "{lines:#?}");
    let line = freed[0];
    assert_eq!(line["kind"], "reap");
    assert_eq!(line["rule"], "orphaned");
    assert_eq!(line["verdict"], "freed");
    assert_eq!(line["dry_run"], false);
    assert!(
        line["why"].as_str().expect("why").contains("group leader"),
        "{line:#}"
    );
    let signals = signals_of(line);
    // SIGTERM first (on a loaded machine the escalation may come before its exit is seen).
    assert_eq!(signals.first(), Some(&"SIGTERM"), "{line:#}");
    assert!(line["age_ms"].as_u64().expect("age") >= 10_000, "{line:#}");
    assert_eq!(line["gpus"][0]["index"], 0);
    assert_eq!(line["gpus"][0]["freed"], true);
    assert_eq!(line["gpus"][0]["freed_bytes"], 30 * GIB);
    assert!(line["gpus"][0]["freed_after_ms"].is_u64(), "{line:#}");
    assert_eq!(lines.first().expect("lines")["action"], "started");
    assert_eq!(lines.last().expect("lines")["action"], "stopped");
    assert_contains(
        &watch.stderr(),
        &format!("gpureap reap: freed: pid {old} ("),
    );
}

/// Without --enforce nothing is signalled: the plan is logged once per
/// process, as `would_free`.
#[test]
fn a_dry_run_signals_nothing_and_says_what_it_would_free() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let worker = orphaned_worker(&mut incident, "sglang::scheduler_TP0", 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("reap.jsonl");
    let log_arg = log.to_str().expect("path");
    let result = run(&host, &reap_now("--orphans", &["--log", log_arg]));
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert!(alive(worker), "a dry run signalled");
    let lines = decisions(&log);
    let planned = of_pid(&lines, worker);
    assert_eq!(planned.len(), 1, "{lines:#?}\n{}", result.stderr);
    assert_eq!(planned[0]["action"], "would_free");
    assert_eq!(planned[0]["verdict"], "would_free");
    assert_eq!(planned[0]["dry_run"], true);
    assert_eq!(planned[0]["target"]["signals"], serde_json::json!([]));
    assert_contains(&result.stderr, "would free: pid");
    assert_contains(&result.stderr, "holds 30.0 GiB");
}

/// A single pass that acts on nothing is not a clean host: an orphan that
/// starts holding 10 GiB between the two looks (its claim written 2 s after
/// the first, 4 s before the second) is seen once and not acted on, and an orphan
/// titled nvidia-smi holding 23 GiB is spared by its name; the pass names
/// each (pid, GPU, memory, why it was left), in the log too, signals
/// neither, and exits 1.
#[test]
fn a_single_pass_names_what_it_saw_but_did_not_act_on_and_exits_1() {
    let (host, mut incident) = Sim::gpus(2).stage();
    // Every node open, no context yet: the first look sees no holder in it.
    let (launcher, [late]) = incident.sglang_tree([Holder::new("sglang::scheduler_TP0")]);
    incident.orphan(launcher, &[late]);
    let spared = orphaned_worker(&mut incident, "nvidia-smi", 1);
    let claim = host.path().join("claims").join(format!("{late}.0"));
    assert_eq!(
        std::fs::read_to_string(&claim).expect("claim").trim(),
        "none"
    );

    let mut pass = Watching::once(
        &host,
        &[
            "--orphans",
            "--older-than",
            "0s",
            "--interval",
            "6s",
            "--enforce",
            "--grace",
            "1s",
        ],
    );
    // The first look follows the `started` line at once (milliseconds); the
    // second comes 6 s later. Between them, the worker takes its 10 GiB.
    pass.until("the start", |line| line["action"] == "started");
    std::thread::sleep(Duration::from_secs(2));
    let written = host.path().join("claims").join(format!("{late}.0.new"));
    std::fs::write(&written, (10 * GIB).to_string()).expect("claim");
    std::fs::rename(&written, &claim).expect("claim");

    let code = pass.ended(Duration::from_secs(30));
    assert_eq!(code, 1, "{}", pass.stderr());
    assert!(alive(late) && alive(spared), "nothing is signalled");
    let lines = decisions(&pass.log);
    let held = |pid: u32| -> &Value {
        of_pid(&lines, pid)
            .into_iter()
            .find(|line| line["action"] == "held")
            .unwrap_or_else(|| panic!("no held line for {pid}: {lines:#?}"))
    };
    let once = held(late);
    assert_eq!(once["verdict"], "seen_once", "{once:#}");
    assert_eq!(once["rule"], "orphaned");
    assert_eq!(once["target"]["gpus"], serde_json::json!([0]));
    let message = once["message"].as_str().unwrap_or_default();
    for said in [
        format!("pid {late} "),
        "seen by the last look only".to_string(),
        "GPU 0 holds 10.0 GiB".to_string(),
    ] {
        assert!(message.contains(&said), "{said:?} in {message}");
    }
    let kept = held(spared);
    assert_eq!(kept["verdict"], "spared", "{kept:#}");
    let message = kept["message"].as_str().unwrap_or_default();
    for said in ["protected by name (nvidia-smi)", "GPU 1 holds 30.0 GiB"] {
        assert!(message.contains(said), "{said:?} in {message}");
    }
    let stderr = pass.stderr();
    assert!(
        stderr.contains(&format!("pid {late} ")) && stderr.contains("GPU 0 holds 10.0 GiB"),
        "{stderr}"
    );
}

/// A policy scoped to one user leaves another user's orphan alone; the same
/// policy for its owner frees it (one pass: two scans, then exit).
#[test]
fn a_policy_for_one_user_leaves_another_users_orphan() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let worker = orphaned_worker(&mut incident, "sglang::scheduler_TP0", 0);
    let policy = reap_now("--orphans", &["--grace", "100ms", "--enforce"]);
    let nobody = run(&host, &[&policy[..], &["--user", "65534"]].concat());
    assert_eq!(nobody.code, 0, "{}", nobody.stderr);
    assert!(alive(worker), "another user's orphan was signalled");
    assert!(!nobody.stderr.contains("freed: pid"), "{}", nobody.stderr);

    let root = run(&host, &[&policy[..], &["--user", "root"]].concat());
    assert_eq!(root.code, 0, "{}", root.stderr);
    assert!(!alive(worker), "its owner's policy did not free it");
}

/// A driver that fails (a GPU lost) while the watch runs: nothing is
/// signalled while it lasts, however long; once it is back, two whole scans
/// later, the orphan is freed.
#[test]
fn a_driver_failure_mid_watch_signals_nothing() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let (launcher, [worker]) = incident.sglang_tree([scheduler(0, 30 * GIB)]);
    let mut watch = Watching::start(
        &host,
        &at_once(
            "--orphans",
            &["--grace", "100ms", "--enforce", "--listen", "127.0.0.1:0"],
        ),
    );
    watch.until("the start", |line| line["action"] == "started");
    // GPU 1, not the orphan's: any GPU the driver cannot answer for stops every kill.
    host.lose(1).expect("lose GPU 1");
    watch.until("a fault", |line| line["action"] == "fault");
    incident.orphan(launcher, &[worker]);
    // Ten more full looks with the orphan in view, every one of them faulted.
    let faults = watch.metric("gpureap_reap_faults_total");
    let deadline = Instant::now() + Duration::from_secs(120);
    while watch.metric("gpureap_reap_faults_total") < faults + 10.0 {
        assert!(alive(worker), "signalled while the driver failed");
        assert!(Instant::now() < deadline, "the watch stopped looking");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(alive(worker), "signalled while the driver failed");
    let lines = decisions(&watch.log);
    assert!(of_pid(&lines, worker).is_empty(), "{lines:#?}");
    let fault = lines
        .iter()
        .find(|line| line["action"] == "fault")
        .expect("fault");
    assert!(
        fault["message"]
            .as_str()
            .expect("message")
            .contains("GPU 1"),
        "{fault:#}"
    );

    std::fs::remove_file(host.path().join("lost.1")).expect("GPU 1 back");
    watch.until("the orphan freed once the driver answers", |line| {
        line["action"] == "freed" && line["target"]["pid"] == worker
    });
    assert!(!alive(worker));
    let lines = decisions(&watch.log);
    assert!(
        lines.iter().any(|line| line["action"] == "recovered"),
        "{lines:#?}"
    );
    assert_eq!(watch.terminate(Duration::from_secs(10)), 0);
}

/// SIGTERM while a free waits out its grace: the free runs to its verdict
/// (SIGSTOP and SIGKILL together), the watch ends, and no process is left
/// stopped.
#[test]
fn sigterm_during_a_grace_period_leaves_no_stopped_process() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let (launcher, [worker]) = incident.sglang_tree([scheduler(0, 30 * GIB).ignoring_sigterm()]);
    let detokenizer = incident.pid_of("sglang::detokenizer").expect("detokenizer");
    incident.orphan(launcher, &[worker, detokenizer]);
    let mut watch = Watching::start(
        &host,
        &at_once("--orphans", &["--grace", "2s", "--enforce"]),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !watch.stderr().contains("freeing [orphaned]") {
        assert!(
            Instant::now() < deadline,
            "never freed:\n{}",
            watch.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // In the grace period: SIGTERM was sent, and ignored.
    assert!(alive(worker));
    assert_eq!(watch.terminate(Duration::from_secs(40)), 0);
    assert!(!alive(worker), "the worker outlived the watch");
    // The detokenizer holds no GPU: out of the rule, and not stopped either.
    assert!(alive(detokenizer));
    for pid in [worker, detokenizer] {
        assert_ne!(state(pid), Some('T'), "{pid} was left stopped");
    }
    let lines = decisions(&watch.log);
    let freed = of_pid(&lines, worker);
    assert_eq!(freed.len(), 1, "{lines:#?}");
    let signals = signals_of(freed[0]);
    assert_eq!(signals, ["SIGTERM", "SIGSTOP", "SIGKILL"]);
    assert_eq!(freed[0]["verdict"], "freed");
    let last = lines.last().expect("lines");
    assert_eq!(last["action"], "stopped");
    assert!(
        last["message"]
            .as_str()
            .expect("message")
            .contains("by a signal")
    );
}

/// An orphaned parent that respawns its GPU worker whenever it dies, and
/// ignores SIGTERM: the free takes the worker with it, adopts each respawned
/// worker, and stops the parent before killing it, so that it cannot start
/// another; the GPU is verified free.
#[test]
fn a_respawning_orphaned_parent_is_stopped_with_its_workers() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let worker = scheduler(0, 30 * GIB).script();
    let parent = format!(
        "trap '' TERM; echo {} > \"$D/claims/$BASHPID.0\"; exec {{fd}}<\"$D/nvidia0\"; \
         echo \"$BASHPID bash\" >> \"$D/pids\"; while :; do ( trap - TERM; {worker} ) & wait; done",
        GIB
    );
    let launcher = format!(
        "echo \"$$ respawning-launcher\" >> \"$D/pids\"; ( {parent} ) & exec -a respawning-launcher sleep 100000"
    );
    incident
        .spawn(
            &format!("setsid bash -c {} & wait", shell_quote(&launcher)),
            3,
        )
        .expect("staged");
    let launcher = incident.pid_of("respawning-launcher").expect("launcher");
    let first = incident.pid_of("sglang::scheduler_TP0").expect("worker");
    let respawner = ppid(first).expect("the worker's parent");
    incident.orphan(launcher, &[respawner]);

    let mut watch = Watching::start(
        &host,
        &at_once("--orphans", &["--grace", "300ms", "--enforce"]),
    );
    watch.until("the respawning parent freed", |line| {
        line["action"] == "freed" && line["target"]["pid"] == respawner
    });
    // A worker it started in the instant before its SIGSTOP outlives it, an
    // orphan then: the next cycles take it. Until the GPU is back.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = run(&host, &["status", "--json"]).json();
        if status["gpus"][0]["memory_used"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "GPU 0 stays held: {status:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(watch.terminate(Duration::from_secs(10)), 0);
    assert!(!alive(respawner), "the respawning parent lives");
    assert!(!alive(first));
    let lines = decisions(&watch.log);
    let parent_line = of_pid(&lines, respawner);
    assert_eq!(parent_line.len(), 1, "{lines:#?}");
    let signals = signals_of(parent_line[0]);
    // Stopped before it was killed, so that it could not start another.
    assert_eq!(signals, ["SIGTERM", "SIGSTOP", "SIGKILL"]);
    // Workers it respawned during the grace were adopted as they came (late).
    let late: Vec<u64> = lines
        .iter()
        .filter(|line| line["target"]["late"] == true)
        .filter_map(|line| line["target"]["pid"].as_u64())
        .collect();
    assert!(
        !late.is_empty(),
        "no respawned worker was adopted: {lines:#?}"
    );
    for line in lines.iter().filter(|line| line["target"].is_object()) {
        let pid = line["target"]["pid"].as_u64().expect("pid") as u32;
        assert!(!alive(pid), "{pid} lives: {line:#}");
    }
}

/// Bad policy values end the run with exit 2 before anything is looked at;
/// the config file's keys are the flags' own, and flags typed win.
#[test]
fn bad_policy_values_exit_2_and_the_config_file_takes_the_flags_keys() {
    let host = Sim::gpus(1).build();
    for args in [
        &["reap", "--older-than", "1m"][..],
        &["reap", "--orphans", "--max-share", "0"],
        &["reap", "--orphans", "--max-share", "1.5"],
        &["reap", "--orphans", "--interval", "10ms"],
        &["reap", "--orphans", "--older-than", "soon"],
        &["reap", "--orphans", "--listen", "9840"],
        &["reap", "--orphans", "--gpu", "7"],
        &["reap", "--orphans", "--user", "no-such-user-here"],
    ] {
        let result = run(&host, args);
        assert_eq!(result.code, 2, "{args:?}: {}", result.stderr);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // A log planted as a link is refused before anything runs.
    let planted = dir.path().join("planted.jsonl");
    std::os::unix::fs::symlink("/etc/passwd", &planted).expect("link");
    let linked = run(
        &host,
        &[
            "reap",
            "--orphans",
            "--log",
            planted.to_str().expect("path"),
        ],
    );
    assert_eq!(linked.code, 2, "{}", linked.stderr);
    let file = dir.path().join("reap.toml");
    let write = |text: &str| std::fs::write(&file, text).expect("config");
    let config = file.to_str().expect("path");
    for bad in [
        "orphans = true\nolder-than = \"soon\"\n",
        "orphans = true\nno-such-key = 1\n",
        "orphans = true\nconfig = \"/etc/gpureap/other.toml\"\n",
        "orphans = [true\n",
        "max-share = 2\norphans = true\n",
    ] {
        write(bad);
        let result = run(&host, &["reap", "--config", config]);
        assert_eq!(result.code, 2, "{bad}: {}", result.stderr);
        assert!(result.stderr.contains("--config"), "{}", result.stderr);
    }
    let mut incident = Incident::new(&host);
    let worker = orphaned_worker(&mut incident, "sglang::scheduler_TP0", 0);
    write(
        "orphans = true\nolder-than = \"0s\"\ninterval = \"100ms\"\ngrace = \"100ms\"\nmatch = [\"nothing-like-this\", \"nor-this\"]\n",
    );
    let result = run(&host, &["reap", "--config", config, "--enforce"]);
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert!(alive(worker), "the file's --match was not applied");
    // A list typed on the command line adds to the file's (a dry run says so).
    let log = dir.path().join("reap.jsonl");
    let result = run(
        &host,
        &[
            "reap",
            "--config",
            config,
            "--match",
            "scheduler",
            "--log",
            log.to_str().expect("path"),
        ],
    );
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert!(alive(worker));
    assert_eq!(of_pid(&decisions(&log), worker)[0]["action"], "would_free");
    write(
        "orphans = true\nolder-than = \"1h\"\ninterval = \"100ms\"\ngrace = \"100ms\"\nenforce = true\n",
    );
    let result = run(&host, &["reap", "--config", config]);
    assert!(alive(worker), "the file's --older-than was not applied");
    assert_eq!(result.code, 0, "{}", result.stderr);
    let result = run(&host, &["reap", "--config", config, "--older-than", "0s"]);
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert!(
        !alive(worker),
        "a flag given on the command line did not win over the file"
    );
}

/// The uid of `nobody`, the other user of these tests.
const NOBODY: u32 = 65534;

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A policy that would free every orphan at once, where another user could
/// have written it: the file writable by all, the file another user's, in a
/// directory anyone may write to without the sticky bit, below another
/// user's directory, through `..` out of an open directory, or a symbolic
/// link. Each is refused with exit 2, naming the path and what is unsafe,
/// before anything is looked at: the orphan lives. The same file where only
/// root can change it (in a sticky directory) frees it.
#[test]
fn a_policy_others_could_write_is_refused_and_frees_nothing() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let worker = orphaned_worker(&mut incident, "sglang::scheduler_TP0", 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path();
    let policy = "orphans = true\nenforce = true\nolder-than = \"0s\"\ngrace = \"100ms\"\ninterval = \"100ms\"\n";
    let write = |path: &Path, mode: u32| {
        std::fs::write(path, policy).expect("policy");
        chmod(path, mode);
    };
    write(&base.join("writable.toml"), 0o666);
    write(&base.join("theirs.toml"), 0o644);
    std::os::unix::fs::chown(base.join("theirs.toml"), Some(NOBODY), Some(NOBODY)).expect("chown");
    write(&base.join("reap.toml"), 0o644);
    let open = base.join("open");
    std::fs::create_dir(&open).expect("mkdir");
    write(&open.join("reap.toml"), 0o644);
    chmod(&open, 0o777);
    let home = base.join("home");
    std::fs::create_dir(&home).expect("mkdir");
    write(&home.join("reap.toml"), 0o644);
    std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).expect("chown");
    std::os::unix::fs::symlink("reap.toml", base.join("link.toml")).expect("symlink");
    for (config, why) in [
        (
            base.join("writable.toml"),
            format!(
                "others than its owner may write to {} (mode 0666)",
                base.join("writable.toml").display()
            ),
        ),
        (
            base.join("theirs.toml"),
            "belongs to uid 65534 (nobody), not to you or root".to_string(),
        ),
        (
            open.join("reap.toml"),
            format!(
                "others than its owner may write to {} (mode 0777, without the sticky bit)",
                open.display()
            ),
        ),
        (
            home.join("reap.toml"),
            format!("{} belongs to uid 65534 (nobody)", home.display()),
        ),
        (
            open.join("..").join("reap.toml"),
            "(mode 0777, without the sticky bit)".to_string(),
        ),
        (base.join("link.toml"), "it is a symbolic link".to_string()),
    ] {
        let result = run(&host, &["reap", "--config", config.to_str().expect("path")]);
        assert_eq!(result.code, 2, "{}: {}", config.display(), result.stderr);
        assert!(
            result
                .stderr
                .contains(&format!("refusing --config {}: ", config.display()))
                && result.stderr.contains(&why),
            "{}: {}",
            config.display(),
            result.stderr
        );
        assert!(
            alive(worker),
            "{}: the policy was applied",
            config.display()
        );
    }
    let sticky = base.join("sticky");
    std::fs::create_dir(&sticky).expect("mkdir");
    chmod(&sticky, 0o1777);
    write(&sticky.join("reap.toml"), 0o644);
    let result = run(
        &host,
        &[
            "reap",
            "--config",
            sticky.join("reap.toml").to_str().expect("path"),
        ],
    );
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert!(!alive(worker), "a policy root may trust was not applied");
}

/// `reap --log` where another user could rename the log away and plant
/// another: in a directory anyone may write to without the sticky bit (as
/// `dump --out` refuses), or named by the policy file. Refused with exit 2
/// before anything is looked at, in words of the log's own (not `run`'s
/// "server's output"), and nothing made there.
#[test]
fn a_log_others_could_redirect_is_refused_in_words_of_its_own() {
    let host = Sim::gpus(1).build();
    let dir = tempfile::tempdir().expect("tempdir");
    let open = dir.path().join("open");
    std::fs::create_dir(&open).expect("mkdir");
    chmod(&open, 0o777);
    let theirs = dir.path().join("theirs.jsonl");
    std::fs::write(&theirs, "").expect("log");
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).expect("chown");
    let in_open = open.join("reap.jsonl");
    let config = dir.path().join("reap.toml");
    std::fs::write(
        &config,
        format!("orphans = true\nlog = \"{}\"\n", in_open.display()),
    )
    .expect("policy");
    for (args, why) in [
        (
            vec!["reap", "--orphans", "--log", in_open.to_str().expect("path")],
            format!(
                "refusing --log {}: others than its owner may write to {} (mode 0777, without the sticky bit); give --log a file in directories only you or root can write",
                in_open.display(),
                open.display()
            ),
        ),
        (
            vec!["reap", "--config", config.to_str().expect("path")],
            format!("refusing --log {}: ", in_open.display()),
        ),
        (
            vec!["reap", "--orphans", "--log", theirs.to_str().expect("path")],
            "belongs to uid 65534 (nobody), not to you or root; gpureap appends only to a file of your own".to_string(),
        ),
    ] {
        let result = run(&host, &args);
        assert_eq!(result.code, 2, "{args:?}: {}", result.stderr);
        assert!(result.stderr.contains(&why), "{args:?}: {}", result.stderr);
        assert!(
            !result.stderr.contains("server"),
            "{args:?}: {}",
            result.stderr
        );
        assert!(!result.stderr.contains("started"), "{}", result.stderr);
    }
    assert_eq!(std::fs::read_dir(&open).expect("dir").count(), 0);
}

/// `reap --config` on what is not a policy: root can read any file, and
/// the error must not show it (a shadow line, an environment with its
/// tokens); what would hang or fill memory (a FIFO, /dev/zero, a file of
/// 4 GiB) is refused at once, unread.
#[test]
fn a_config_that_is_not_a_policy_is_neither_quoted_nor_read_whole() {
    let host = Sim::gpus(1).build();
    let dir = tempfile::tempdir().expect("tempdir");
    let shadow = dir.path().join("shadow");
    std::fs::write(
        &shadow,
        "root:$y$j9T$SHADOWSECRET:20228:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\n",
    )
    .expect("shadow");
    chmod(&shadow, 0o640);
    let fifo = dir.path().join("fifo.toml");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .expect("mkfifo");
    let huge = dir.path().join("huge.toml");
    std::fs::File::create(&huge)
        .and_then(|file| file.set_len(4 << 30))
        .expect("sparse file");
    for (config, why) in [
        (shadow.clone(), "not TOML at line 1 (the file is not shown)"),
        (
            PathBuf::from("/proc/self/environ"),
            "not TOML at line 1 (the file is not shown)",
        ),
        (fifo.clone(), "not a regular file"),
        (PathBuf::from("/dev/zero"), "not a regular file"),
        (huge.clone(), "larger than 1 MiB"),
    ] {
        let started = Instant::now();
        let result: Run = gpureap(&host)
            .args(["reap", "--config", config.to_str().expect("path")])
            .env("GPUREAP_TEST_TOKEN", "hf_ENVIRONSECRET")
            .output()
            .expect("gpureap runs")
            .into();
        assert_eq!(result.code, 2, "{}: {}", config.display(), result.stderr);
        assert!(
            result.stderr.contains(why),
            "{}: {}",
            config.display(),
            result.stderr
        );
        for secret in ["SHADOWSECRET", "daemon", "ENVIRONSECRET", "PATH="] {
            assert!(
                !result.stderr.contains(secret),
                "{}: quoted: {}",
                config.display(),
                result.stderr
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            config.display()
        );
    }
}

/// A rule that names more than --max-share of a GPU's holders frees nothing
/// there and says so.
#[test]
fn a_rule_naming_too_large_a_share_of_a_gpu_stops_and_reports() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let (launcher, [worker]) = incident.sglang_tree([scheduler(0, 30 * GIB)]);
    let other = incident.hold(Holder::new("python serve.py").on(0, 10 * GIB));
    incident.orphan(launcher, &[worker]);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("reap.jsonl");
    let log_arg = log.to_str().expect("path");
    let policy = reap_now(
        "--orphans",
        &["--grace", "100ms", "--enforce", "--log", log_arg],
    );
    // One of two holders: half.
    let refused = run(&host, &[&policy[..], &["--max-share", "0.4"]].concat());
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(alive(worker), "signalled past --max-share");
    let lines = decisions(&log);
    let line = lines
        .iter()
        .find(|line| line["action"] == "refused")
        .unwrap_or_else(|| panic!("no refusal: {lines:#?}"));
    assert!(
        line["message"]
            .as_str()
            .expect("message")
            .contains("1 of the 2 holders of GPU 0")
    );
    let allowed = run(&host, &[&policy[..], &["--max-share", "0.5"]].concat());
    assert_eq!(allowed.code, 0, "{}", allowed.stderr);
    assert!(!alive(worker));
    assert!(alive(other));
}

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

fn systemd_analyze(args: &[&str]) -> Run {
    Command::new("systemd-analyze")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("systemd-analyze ({error}): .ci/run installs it"))
        .into()
}

/// The unit as it would be installed, with this build's gpureap for
/// /usr/local/bin/gpureap (systemd-analyze checks that it is executable).
fn unit_here(dir: &Path, text: &str) -> PathBuf {
    let unit = dir.join("gpureap-reap.service");
    let text = text.replace("/usr/local/bin/gpureap", env!("CARGO_BIN_EXE_gpureap"));
    std::fs::write(&unit, text).expect("unit");
    unit
}

/// The systemd unit passes `systemd-analyze verify` without a word (it
/// only warns on a directive it cannot read, so any output fails), scores
/// at most 3.5 on `systemd-analyze security` offline, and keeps exactly the
/// three capabilities it needs.
#[test]
fn the_systemd_unit_passes_systemd_analyze() {
    let text = std::fs::read_to_string(deploy("systemd/gpureap-reap.service")).expect("unit");
    let dir = tempfile::tempdir().expect("tempdir");
    let unit = unit_here(dir.path(), &text);
    let unit_arg = unit.to_str().expect("path");
    let verify = systemd_analyze(&["verify", unit_arg]);
    assert_eq!(
        (verify.code, verify.stdout.as_str(), verify.stderr.as_str()),
        (0, "", ""),
        "systemd-analyze verify"
    );
    let security = systemd_analyze(&[
        "security",
        "--offline=yes",
        "--threshold=35",
        "--no-pager",
        unit_arg,
    ]);
    assert_eq!(security.code, 0, "{}{}", security.stdout, security.stderr);
    assert_contains(&security.stdout, "Overall exposure level");
    let capabilities: Vec<&str> = text
        .lines()
        .find_map(|line| line.strip_prefix("CapabilityBoundingSet="))
        .expect("CapabilityBoundingSet")
        .split_whitespace()
        .collect();
    assert_eq!(
        capabilities,
        ["CAP_KILL", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"]
    );
    for needed in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "KillMode=mixed",
    ] {
        assert!(text.lines().any(|line| line == needed), "{needed} missing");
    }
    assert!(
        !text
            .lines()
            .any(|line| line.starts_with("ProtectProc=") || line.starts_with("PrivatePIDs=")),
        "it must see every process"
    );
    // The check does fail: a directive systemd cannot read is reported.
    let bad = unit_here(
        dir.path(),
        &text.replace("ProtectSystem=strict", "ProtectSystem=stricter"),
    );
    let verify = systemd_analyze(&["verify", bad.to_str().expect("path")]);
    assert!(verify.stderr.contains("stricter"), "{}", verify.stderr);
}

/// Started for real where systemd runs this machine: the unit itself (its
/// hardening, its log directory), on a simulated host, comes up, logs its
/// start, and stops on `systemctl stop` with a `stopped` line. Not run on
/// the development machine, whose init is not systemd.
#[test]
fn the_systemd_unit_starts_where_systemd_runs() {
    if !Path::new("/run/systemd/system").is_dir() {
        return skip(
            "systemd is not this machine's init (no /run/systemd/system): the unit is only verified",
        );
    }
    let host = Sim::gpus(1).build();
    let name = format!("gpureap-reap-test-{}", std::process::id());
    let policy = PathBuf::from(format!("/run/{name}.toml"));
    std::fs::write(&policy, "orphans = true\ninterval = \"1s\"\n").expect("policy");
    let log = PathBuf::from(format!("/var/lib/gpureap/{name}.jsonl"));
    let text = std::fs::read_to_string(deploy("systemd/gpureap-reap.service")).expect("unit");
    let text = text
        .replace(
            "/usr/local/bin/gpureap",
            &format!(
                "{} --backend {}",
                env!("CARGO_BIN_EXE_gpureap"),
                host.backend()
            ),
        )
        .replace("/etc/gpureap/reap.toml", policy.to_str().expect("path"))
        .replace("/var/lib/gpureap/reap.jsonl", log.to_str().expect("path"))
        // The simulated host lives in the test's /tmp, which a private one would hide.
        .replace("PrivateTmp=yes", "PrivateTmp=no");
    let unit = PathBuf::from(format!("/run/systemd/system/{name}.service"));
    std::fs::write(&unit, text).expect("unit");
    let systemctl = |args: &[&str]| {
        Command::new("systemctl")
            .args(args)
            .output()
            .expect("systemctl")
    };
    systemctl(&["daemon-reload"]);
    let started = systemctl(&["start", &name]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut up = started.status.success();
    while up
        && !decisions(&log)
            .iter()
            .any(|line| line["action"] == "started")
    {
        up = Instant::now() < deadline;
        std::thread::sleep(Duration::from_millis(50));
    }
    let stopped = systemctl(&["stop", &name]);
    let lines = decisions(&log);
    let _ = std::fs::remove_file(&unit);
    let _ = std::fs::remove_file(&policy);
    let _ = std::fs::remove_file(&log);
    systemctl(&["daemon-reload"]);
    assert!(
        up,
        "the unit never logged its start: {}",
        String::from_utf8_lossy(&started.stderr)
    );
    assert!(stopped.status.success());
    assert_eq!(
        lines.last().expect("lines")["action"],
        "stopped",
        "{lines:#?}"
    );
}

/// The Kubernetes variant: the exporter's DaemonSet plus exactly KILL,
/// SYS_PTRACE and DAC_READ_SEARCH, and a policy (its ConfigMap) that `reap`
/// reads as it is, a dry run. (Every manifest also passes
/// kubernetes-validate --strict: tests/exporter.rs.)
#[test]
fn the_reap_daemonset_adds_only_what_signalling_needs_and_its_policy_parses() {
    let text = std::fs::read_to_string(deploy("kubernetes/gpureap-reap.yaml")).expect("read");
    for needed in [
        "hostPID: true",
        "readOnlyRootFilesystem: true",
        "allowPrivilegeEscalation: false",
        "drop: [\"ALL\"]",
        "add: [\"KILL\", \"SYS_PTRACE\", \"DAC_READ_SEARCH\"]",
        "nvidia.com/gpu.present: \"true\"",
        "\"--watch\"",
        "enforce = false",
        "container-gone = true",
        // The policy file alone: a ConfigMap volume's 0777 directory of links is refused.
        "mountPath: /etc/gpureap/reap.toml\n              subPath: reap.toml",
    ] {
        assert!(text.contains(needed), "{needed} missing");
    }
    assert!(!text.contains("privileged: true"));
    assert_eq!(text.matches("add:").count(), 1);
    // The policy, as the ConfigMap mounts it.
    let policy: String = text
        .split("reap.toml: |\n")
        .nth(1)
        .expect("reap.toml")
        .lines()
        .take_while(|line| line.starts_with("    ") || line.is_empty())
        .map(|line| format!("{}\n", line.trim_start()))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("reap.toml");
    std::fs::write(&file, &policy).expect("policy");
    let host = Sim::gpus(1).build();
    // Its --host-root (/host, the node mounted) is a staged one here: a flag wins over the file.
    let node = tempfile::tempdir().expect("node root");
    let result = run(
        &host,
        &[
            "reap",
            "--config",
            file.to_str().expect("path"),
            "--interval",
            "100ms",
            "--host-root",
            node.path().to_str().expect("path"),
        ],
    );
    assert_eq!(result.code, 0, "{policy}\n{}", result.stderr);
    assert_contains(&result.stderr, "older than 15m");
    assert!(result.stderr.contains("dry run"), "{}", result.stderr);
}

/// `--listen`: the watch's counters beside the exporter's GPU series, in one
/// exposition promtool accepts.
#[test]
fn the_watch_serves_what_it_freed_beside_the_gpu_series() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let worker = orphaned_worker(&mut incident, "sglang::scheduler_TP1", 1);
    let mut watch = Watching::start(
        &host,
        &at_once(
            "--orphans",
            &["--grace", "100ms", "--enforce", "--listen", "127.0.0.1:0"],
        ),
    );
    watch.until("the orphan freed", |line| {
        line["action"] == "freed" && line["target"]["pid"] == worker
    });
    let body = watch.body();
    let lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(body.as_bytes())
                .expect("written");
            child.wait_with_output().expect("promtool")
        })
        .unwrap_or_else(|error| panic!("promtool ({error}): .ci/run installs it"));
    assert!(
        lint.status.success() && lint.stdout.is_empty() && lint.stderr.is_empty(),
        "{}{}\n{body}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );
    assert_eq!(
        watch.metric("gpureap_reaped_total{reason=\"orphaned\",outcome=\"freed\"}"),
        1.0
    );
    assert_eq!(
        watch.metric("gpureap_reaped_bytes_total{reason=\"orphaned\"}"),
        (30 * GIB) as f64
    );
    assert_eq!(watch.metric("gpureap_driver_up{backend=\"sim\"}"), 1.0);
    assert!(watch.metric("gpureap_reap_last_run_timestamp_seconds") > 1.7e9);
    assert!(watch.metric("gpureap_reap_cycles_total") >= 2.0);
    assert!(body.contains("gpureap_gpu_memory_used_bytes{"), "{body}");
    assert_eq!(watch.terminate(Duration::from_secs(10)), 0);
}

/// `--container-gone`: a holder whose Docker container was removed
/// (`docker rm -f`: its folder under var/lib/docker/containers is gone, its
/// process lives on in the container's cgroup) is freed, with the source as
/// its reason; a holder of a live container is not, nor is anything when
/// the rule is not given.
#[test]
fn a_holder_whose_container_is_gone_is_freed_by_the_container_rule() {
    const GONE: &str = "4e1f0c2d9b8a7f6e5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291807f6e";
    const LIVE: &str = "9a8b7c6d5e4f30211203f4e5d6c7b8a99a8b7c6d5e4f30211203f4e5d6c7b8a9";
    let Some(cgroups) = Cgroups::v2("reap") else {
        return skip(NO_CGROUPS);
    };
    let node = tempfile::tempdir().expect("node root");
    let live_folder = node.path().join("var/lib/docker/containers").join(LIVE);
    std::fs::create_dir_all(&live_folder).expect("docker folder");
    std::fs::write(
        live_folder.join("config.v2.json"),
        serde_json::json!({"ID": LIVE, "Name": "/web"}).to_string(),
    )
    .expect("config");
    let (host, mut incident) = Sim::gpus(2).stage();
    let removed = incident.hold(Holder::new("removed-worker").on(0, 4 * GIB));
    cgroups.move_in(format!("system.slice/docker-{GONE}.scope"), removed);
    let live = incident.hold(Holder::new("live-worker").on(1, 4 * GIB));
    cgroups.move_in(format!("system.slice/docker-{LIVE}.scope"), live);
    let root = node.path().to_str().expect("path");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("reap.jsonl");
    let policy = [
        "reap",
        "--older-than",
        "0s",
        "--interval",
        "100ms",
        "--grace",
        "100ms",
        "--enforce",
        "--host-root",
        root,
        "--log",
        log.to_str().expect("path"),
    ];
    // Neither is an orphan (their parent, the stager, lives): only the container rule takes one.
    let orphans = run(&host, &[&policy[..], &["--orphans"]].concat());
    assert_eq!(orphans.code, 0, "{}", orphans.stderr);
    assert!(alive(removed) && alive(live));
    let result = run(&host, &[&policy[..], &["--container-gone"]].concat());
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert!(!alive(removed), "the gone container's holder lives");
    assert!(alive(live), "a live container's holder was signalled");
    let lines = decisions(&log);
    let freed = of_pid(&lines, removed);
    assert_eq!(freed.len(), 1, "{lines:#?}");
    assert_eq!(freed[0]["rule"], "container_gone");
    assert_eq!(freed[0]["verdict"], "freed");
    assert!(
        freed[0]["why"].as_str().expect("why").contains("docker"),
        "{:#}",
        freed[0]
    );
    assert!(of_pid(&lines, live).is_empty(), "{lines:#?}");
}
