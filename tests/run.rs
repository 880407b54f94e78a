//! `gpureap run` against a fake SGLang server (tests/fake_sglang.py) on the
//! simulated driver: containment, readiness, each fault's detection, the
//! bundle, nothing left holding a GPU, restart, and the learned baseline.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::SimHost;

use crate::harness::*;

/// A running `gpureap run`, with its stderr events collected as they come.
pub(crate) struct Supervisor {
    pub(crate) child: Child,
    events: Arc<Mutex<Vec<String>>>,
    stdout: Arc<Mutex<String>>,
    /// The threads reading gpureap's stderr and stdout, to their end.
    readers: Vec<std::thread::JoinHandle<()>>,
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

pub(crate) fn fake_server() -> String {
    format!("{}/tests/fake_sglang.py", env!("CARGO_MANIFEST_DIR"))
}

pub(crate) struct Setup {
    pub(crate) host: SimHost,
    pub(crate) port: u16,
    pub(crate) state: PathBuf,
}

pub(crate) fn setup(gpus: u32) -> Setup {
    let host = Sim::gpus(gpus).build();
    let state = host.path().join("state");
    Setup {
        host,
        port: free_port(),
        state,
    }
}

impl Setup {
    /// Starts `gpureap run` with fast timings, extra flags, and the fake
    /// server with `server_args`.
    pub(crate) fn run(&self, flags: &[&str], server_args: &[&str]) -> Supervisor {
        let mut command = gpureap(&self.host);
        command.args(self.run_args(flags, server_args));
        Supervisor::start(command)
    }

    /// `run`'s arguments, from `run` on: fast timings, then `flags`, then
    /// the fake server with `server_args`.
    pub(crate) fn run_args(&self, flags: &[&str], server_args: &[&str]) -> Vec<String> {
        let port = self.port.to_string();
        let ready_url = format!("http://127.0.0.1:{port}/health");
        let state = self.state.to_str().expect("utf-8 path");
        let sim = self.host.path().to_str().expect("utf-8 path");
        let server = fake_server();
        let timings = [
            "--grace",
            "500ms",
            "--stop-timeout",
            "10s",
            "--backoff",
            "100ms",
            "--stall-timeout",
            "1500ms",
            "--startup-timeout",
            "30s",
        ];
        let run = ["run", "--ready-url", &ready_url, "--state-dir", state];
        let command = [
            "python3", &server, "--port", &port, "--tp", "2", "--sim", sim,
        ];
        [&run[..], &timings, flags, &["--"], &command, server_args]
            .concat()
            .into_iter()
            .map(str::to_string)
            .collect()
    }
}

impl Setup {
    /// Like `run`, with the server's `fault` on its first start only.
    pub(crate) fn run_faulty_once(&self, flags: &[&str], fault: &str) -> Supervisor {
        let marker = self.host.path().join("fault-once");
        self.run(
            flags,
            &[
                "--fault",
                fault,
                "--fault-once",
                marker.to_str().expect("path"),
            ],
        )
    }
}

impl Supervisor {
    /// Starts a `gpureap run` command and collects its events as they come.
    pub(crate) fn start(command: std::process::Command) -> Supervisor {
        Supervisor::start_with_stdout(command, Stdio::piped())
    }

    /// Like `start`, with gpureap's stdout sent to `stdout` (collected only when piped).
    pub(crate) fn start_with_stdout(
        mut command: std::process::Command,
        stdout: Stdio,
    ) -> Supervisor {
        command.stdout(stdout).stderr(Stdio::piped());
        let mut child = command.spawn().expect("gpureap run starts");
        let events = Arc::new(Mutex::new(Vec::new()));
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = Arc::clone(&events);
        let mut readers = vec![std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("events").push(line);
            }
        })];
        if let Some(mut out) = child.stdout.take() {
            let sink = Arc::clone(&stdout);
            readers.push(std::thread::spawn(move || {
                let mut text = String::new();
                let _ = out.read_to_string(&mut text);
                sink.lock().expect("stdout").push_str(&text);
            }));
        }
        Supervisor {
            child,
            events,
            stdout,
            readers,
        }
    }

    /// Waits for the `nth` (1-based) event containing `text`; panics with all events on timeout.
    pub(crate) fn wait_for(&self, text: &str, nth: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let found = self
                .events
                .lock()
                .expect("events")
                .iter()
                .filter(|line| line.contains(text))
                .nth(nth - 1)
                .cloned();
            if let Some(line) = found {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no event {text:?} (#{nth}) within 40s; events:\n{}",
                self.events().join("\n")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub(crate) fn events(&self) -> Vec<String> {
        self.events.lock().expect("events").clone()
    }

    /// SIGTERM to gpureap, as systemd or a Ctrl-C would; returns its exit code.
    pub(crate) fn stop(self) -> (i32, Vec<String>, String) {
        self.stop_with(rustix::process::Signal::TERM)
    }

    /// Sends `signal` to gpureap and waits for it; then nothing it supervised may be left.
    pub(crate) fn stop_with(
        mut self,
        signal: rustix::process::Signal,
    ) -> (i32, Vec<String>, String) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("pid");
        rustix::process::kill_process(pid, signal).expect("signal gpureap");
        let status = self.child.wait().expect("gpureap ends");
        nothing_supervised_left(self.child.id());
        self.read_to_the_end();
        let stdout = self.stdout.lock().expect("stdout").clone();
        (status.code().unwrap_or(-1), self.events(), stdout)
    }

    pub(crate) fn wait_exit(mut self) -> (i32, Vec<String>) {
        let status = self.child.wait().expect("gpureap ends");
        nothing_supervised_left(self.child.id());
        self.read_to_the_end();
        (status.code().unwrap_or(-1), self.events())
    }

    /// Once gpureap has ended and nothing it supervised is left: everything
    /// it wrote has been read (its pipes are at their end).
    fn read_to_the_end(&mut self) {
        for reader in std::mem::take(&mut self.readers) {
            let _ = reader.join();
        }
    }
}

/// Every live process started under the gpureap with this PID (they all
/// carry its PID in their environment).
pub(crate) fn supervised_by(gpureap: u32) -> std::collections::BTreeSet<u32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| alive(pid))
        .filter(|&pid| {
            gpureap_core::proc::env_value(pid, "GPUREAP_SUPERVISOR").as_deref()
                == Some(&gpureap.to_string())
        })
        .collect()
}

/// After the gpureap with this PID ended: no process it started (they all
/// carry its PID in their environment) is alive, and none of its cgroups is left.
pub(crate) fn nothing_supervised_left(gpureap: u32) {
    let supervised = supervised_by(gpureap);
    assert!(
        supervised.is_empty(),
        "processes started under gpureap {gpureap} survive it: {supervised:?}"
    );
    let prefix = format!("gpureap.run-{gpureap}-");
    let mut folders = vec![PathBuf::from("/sys/fs/cgroup")];
    let mut left = Vec::new();
    for _ in 0..3 {
        let mut deeper = Vec::new();
        for folder in folders {
            for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    if entry.file_name().to_string_lossy().starts_with(&prefix) {
                        left.push(entry.path());
                    }
                    deeper.push(entry.path());
                }
            }
        }
        folders = deeper;
    }
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
}

impl Drop for Supervisor {
    /// A failed test still stops its server: SIGTERM lets gpureap free the
    /// contained tree; SIGKILL only if it does not end in time.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while let Ok(None) = self.child.try_wait() {
                if Instant::now() > deadline {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// GPU memory in use on the simulated host, through gpureap itself.
pub(crate) fn used(host: &SimHost, gpu: u32) -> u64 {
    let status = run(host, &["status", "--json"]).json();
    status["gpus"][gpu as usize]["memory_used"]
        .as_u64()
        .expect("memory")
}

pub(crate) fn cgroup2_present() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|text| text.contains(" - cgroup2 "))
}

pub(crate) fn bundles(state: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(state.join("bundles"))
        .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
        .unwrap_or_default();
    found.sort();
    found
}

pub(crate) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// No process of the sim host's holders is alive, and no GPU memory is used.
pub(crate) fn nothing_left(host: &SimHost, gpus: u32) {
    for gpu in 0..gpus {
        assert_eq!(used(host, gpu), 0, "GPU {gpu} still held");
    }
    let status = run(host, &["status", "--json"]).json();
    assert_eq!(
        status["holders"],
        serde_json::json!([]),
        "holders left: {status:#}"
    );
}

#[test]
fn a_good_start_is_contained_marked_logged_and_stopped_cleanly() {
    let setup = setup(2);
    let log = setup.host.path().join("server.log");
    let supervisor = setup.run(&["--log", log.to_str().expect("path")], &[]);
    let containment = supervisor.wait_for("containment:", 1);
    if cgroup2_present() {
        assert!(containment.contains("cgroup v2"), "{containment}");
    }
    let ready = supervisor.wait_for("ready after", 1);
    assert!(ready.contains("no good start recorded yet"), "{ready}");

    let status = run(&setup.host, &["status", "--json"]).json();
    let workers: Vec<&serde_json::Value> = status["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .collect();
    assert_eq!(workers.len(), 2, "{status:#}");
    for worker in &workers {
        assert!(
            worker["cmdline"]
                .as_str()
                .expect("cmdline")
                .starts_with("sglang::scheduler_TP")
        );
        assert!(
            worker["flags"]
                .as_array()
                .expect("flags")
                .contains(&"supervised".into()),
            "{worker:#}"
        );
    }
    assert_eq!(used(&setup.host, 0), 20 * GIB);

    let (code, events, stdout) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
    assert!(
        events.iter().any(|e| e.contains("GPU 0: freed 20.0 GiB")),
        "{}",
        events.join("\n")
    );
    assert!(events.iter().any(|e| e.contains("nothing left behind")));
    assert!(
        !events.iter().any(|e| e.contains("SIGKILL needed")),
        "a clean shutdown needs no SIGKILL"
    );
    nothing_left(&setup.host, 2);

    // Output passed through and logged, line by line, in SGLang's order.
    let logged = read(&log);
    assert_eq!(
        stdout, logged,
        "the terminal and the log file saw the same lines"
    );
    let order = [
        "server_args=",
        "[TP0] Init torch distributed begin",
        "[TP0] Load weight end",
        "Uvicorn running",
        "ready to roll",
    ];
    let positions: Vec<usize> = order
        .iter()
        .map(|needle| {
            logged
                .find(needle)
                .unwrap_or_else(|| panic!("{needle} not logged:\n{logged}"))
        })
        .collect();
    assert!(
        positions.windows(2).all(|pair| pair[0] < pair[1]),
        "{logged}"
    );
    let history: serde_json::Value =
        serde_json::from_str(&read(&setup.state.join("starts.json"))).expect("json");
    assert_eq!(history["good_starts"].as_array().expect("starts").len(), 1);
}

#[test]
fn a_stall_after_load_weight_is_diagnosed_against_good_starts_then_recovered() {
    let setup = setup(2);
    // A good start first, to learn what good looks like.
    let first = setup.run(&[], &[]);
    let ready = first.wait_for("ready after", 1);
    let good_line: u64 = ready
        .split("at log line ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .and_then(|number| number.parse().ok())
        .expect("line number in the ready event");
    assert_eq!(first.stop().0, 0);

    let supervisor = setup.run_faulty_once(&[], "stall");
    let hang = supervisor.wait_for("hang: no log output", 1);
    assert!(hang.contains("stalled at log line"), "{hang}");
    assert!(
        hang.contains(&format!(
            "good starts (1) were ready at log line {good_line}"
        )),
        "{hang}"
    );
    let bundle_event = supervisor.wait_for("diagnostic bundle:", 1);
    supervisor.wait_for("nothing left behind", 1);
    supervisor.wait_for("restarting in", 1);
    let recovered = supervisor.wait_for("ready after", 1);
    assert!(
        recovered.contains(&format!(
            "good starts (1) were ready at log line {good_line}"
        )),
        "{recovered}"
    );

    let bundle = PathBuf::from(bundle_event.rsplit(": ").next().expect("path"));
    let tail = read(&bundle.join("log-tail.txt"));
    assert!(
        tail.trim_end()
            .lines()
            .any(|line| line.contains("Load weight end")),
        "{tail}"
    );
    assert!(
        !tail.contains("Uvicorn"),
        "the stalled start never got that far"
    );
    let processes = read(&bundle.join("processes.txt"));
    assert!(processes.contains("sglang::scheduler_TP0"), "{processes}");
    assert!(processes.contains("sglang::detokenizer"), "{processes}");
    let summary = read(&bundle.join("summary.txt"));
    assert!(summary.contains("hang: no log output"), "{summary}");
    let json: serde_json::Value =
        serde_json::from_str(&read(&bundle.join("bundle.json"))).expect("json");
    assert_eq!(
        json["gpu"]["gpus"][0]["memory_used"],
        20 * GIB,
        "GPU state at the hang"
    );
    let stalled = json["members"]
        .as_array()
        .expect("members")
        .iter()
        .find(|member| {
            member["cmdline"]
                .as_str()
                .is_some_and(|c| c.starts_with("sglang::scheduler_TP0"))
        })
        .expect("TP0 in the bundle")
        .clone();
    assert_eq!(stalled["state"], "S");
    assert!(
        stalled["cpu_percent"].as_f64().expect("cpu sampled") < 20.0,
        "{stalled:#}"
    );
    assert!(read(&bundle.join("gpu.txt")).contains("sglang::scheduler_TP1"));

    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
    nothing_left(&setup.host, 2);
}

#[test]
fn a_busy_spinning_start_is_a_hang_and_the_bundle_shows_the_cpu() {
    let setup = setup(2);
    let supervisor = setup.run(
        &["--stall-timeout", "2500ms", "--restart", "never"],
        &["--fault", "spin"],
    );
    supervisor.wait_for("hang: no log output", 1);
    let bundle_event = supervisor.wait_for("diagnostic bundle:", 1);
    let (code, events) = supervisor.wait_exit();
    assert_eq!(code, 1, "a hang is a failure: {}", events.join("\n"));
    let bundle = PathBuf::from(bundle_event.rsplit(": ").next().expect("path"));
    let json: serde_json::Value =
        serde_json::from_str(&read(&bundle.join("bundle.json"))).expect("json");
    let spinning = json["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter(|member| {
            member["cmdline"]
                .as_str()
                .is_some_and(|c| c.starts_with("sglang::scheduler_TP"))
        })
        // A spinner gets a core's share even on a loaded machine (25% at load 8 on
        // 2 cores); a sleeping process gets 0. 5% tells them apart under any load.
        .filter(|member| member["cpu_percent"].as_f64().is_some_and(|cpu| cpu > 5.0))
        .count();
    assert!(
        spinning >= 1,
        "the spinning workers' CPU use is in the bundle: {json:#}"
    );
    nothing_left(&setup.host, 2);
}

#[test]
fn a_rank_that_dies_leaves_the_rest_blocked_and_all_are_freed() {
    let setup = setup(2);
    let supervisor = setup.run_faulty_once(&[], "rank-dies");
    let hang = supervisor.wait_for("hang: no log output", 1);
    assert!(hang.contains("no good start recorded yet"), "{hang}");
    supervisor.wait_for("GPU 0: freed 20.0 GiB", 1);
    supervisor.wait_for("nothing left behind", 1);
    supervisor.wait_for("ready after", 1);
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
    nothing_left(&setup.host, 2);
}

#[test]
fn a_crash_leaving_a_worker_that_ignores_sigterm_is_freed_by_force_and_restarted() {
    let setup = setup(2);
    let supervisor = setup.run_faulty_once(&[], "ignore-term");
    let crash = supervisor.wait_for("crash: server exited with code 1", 1);
    assert!(crash.starts_with("gpureap run: crash"), "{crash}");
    let bundle_event = supervisor.wait_for("diagnostic bundle:", 1);
    let forced = supervisor.wait_for("SIGKILL needed for", 1);
    assert!(forced.contains("sglang::scheduler_TP0"), "{forced}");
    supervisor.wait_for("GPU 0: freed 20.0 GiB", 1);
    supervisor.wait_for("restarting in", 1);
    let second = supervisor.wait_for("ready after", 2);
    // The first start was ready before it crashed: it is remembered as good.
    assert!(second.contains("good starts (1)"), "{second}");
    let bundle = PathBuf::from(bundle_event.rsplit(": ").next().expect("path"));
    let tail = read(&bundle.join("log-tail.txt"));
    assert!(
        tail.contains("RuntimeError: CUDA error"),
        "the crash's last words are kept: {tail}"
    );
    assert!(read(&bundle.join("summary.txt")).contains("crash: server exited with code 1"));
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
    nothing_left(&setup.host, 2);
}

/// vLLM's API server exits 0 when its engine core dies (vllm#48966). Under
/// the default `--restart on-failure` an end nobody asked for is a crash
/// whatever its code: said with the code, a bundle, the workers it left
/// freed, a restart. (Before, exit 0 was a clean end: no bundle, no restart,
/// and gpureap itself exited 0 with the server gone.)
#[test]
fn a_server_that_exits_0_on_its_own_is_a_crash_and_restarted() {
    let setup = setup(2);
    let supervisor = setup.run_faulty_once(&[], "exit-0");
    supervisor.wait_for("ready after", 1);
    let crash = supervisor.wait_for("crash: server exited with code 0", 1);
    assert!(
        crash.starts_with("gpureap run: crash") && crash.contains("nobody asked it to stop"),
        "{crash}"
    );
    let bundle_event = supervisor.wait_for("diagnostic bundle:", 1);
    supervisor.wait_for("GPU 0: freed 20.0 GiB", 1);
    supervisor.wait_for("restarting in", 1);
    let second = supervisor.wait_for("ready after", 2);
    assert!(second.contains("good starts (1)"), "{second}");
    let bundle = PathBuf::from(bundle_event.rsplit(": ").next().expect("path"));
    let document: serde_json::Value =
        serde_json::from_str(&read(&bundle.join("bundle.json"))).expect("bundle.json");
    assert!(
        document["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("exited with code 0")),
        "{document:#}"
    );
    assert!(read(&bundle.join("log-tail.txt")).contains("died unexpectedly"));
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
    nothing_left(&setup.host, 2);
}

/// A server ended by a SIGTERM someone sent it (not gpureap, which sends
/// none before it judges the end) was told to stop: not restarted under
/// `on-failure`, and gpureap exits 0 once its tree is verified free.
/// (Before, the signal was a crash: a bundle and a restart.)
#[test]
fn a_server_a_user_stops_with_sigterm_is_not_restarted() {
    let host = Sim::gpus(1).build();
    let pid_file = host.path().join("server.pid");
    let server =
        "echo $$ > \"$D/server.pid\"; exec 3<\"$D/nvidia0\"; echo serving; exec sleep 100000";
    let supervisor = bash_server(&host, &["--ready-log", "serving"], server);
    supervisor.wait_for("ready after", 1);
    assert_eq!(used(&host, 0), GIB);
    let pid: i32 = read(&pid_file).trim().parse().expect("pid");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid).expect("pid"),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM to the server");
    let judged = supervisor.wait_for("server was killed by signal 15", 1);
    assert!(
        judged.ends_with(
            "server was killed by signal 15: told to stop by someone other than gpureap"
        ),
        "{judged}"
    );
    let (code, events) = supervisor.wait_exit();
    assert_eq!(code, 0, "{}", events.join("\n"));
    assert!(
        !events
            .iter()
            .any(|e| e.contains("restarting in") || e.contains("diagnostic bundle")),
        "{}",
        events.join("\n")
    );
    nothing_left(&host, 1);
}

/// `gpureap run` around a bash server on the simulated host.
pub(crate) fn bash_server(host: &SimHost, flags: &[&str], server: &str) -> Supervisor {
    let mut command = gpureap(host);
    command
        .arg("run")
        .args(["--grace", "300ms", "--state-dir"])
        .arg(host.path().join("state"))
        .args(flags)
        .args(["--", "bash", "-c", server])
        .env("D", host.path());
    Supervisor::start(command)
}

#[test]
fn a_server_that_ignores_sigterm_on_stop_is_killed_and_the_exit_code_says_so() {
    let host = Sim::gpus(1).build();
    let server =
        "exec 3<\"$D/nvidia0\"; trap '' TERM; echo serving; while :; do sleep 0.05 3<&-; done";
    let supervisor = bash_server(&host, &["--ready-log", "serving"], server);
    supervisor.wait_for("ready after", 1);
    assert_eq!(used(&host, 0), GIB);
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 1, "forced, so not clean: {}", events.join("\n"));
    assert!(
        events.iter().any(|e| e.contains("SIGKILL needed for")),
        "{}",
        events.join("\n")
    );
    assert!(
        events.iter().any(|e| e.contains("GPU 0: freed 1.0 GiB")),
        "{}",
        events.join("\n")
    );
    nothing_left(&host, 1);
}

/// A worker names itself: the crash bundle's process list and summary
/// keep its name written out on its own row, as `status` shows it.
#[test]
fn a_crash_bundle_keeps_a_hostile_worker_name_on_its_row() {
    let host = Sim::gpus(1).build();
    let server = "( exec 3<\"$D/nvidia0\"; exec -a $'worker\\nFORGED-LINE\\e[2K' sleep 100000 ) & \
        until grep -q FORGED /proc/$!/cmdline 2>/dev/null; do sleep 0.01; done; exit 1";
    let supervisor = bash_server(&host, &[], server);
    let bundle_event = supervisor.wait_for("diagnostic bundle:", 1);
    let bundle = PathBuf::from(bundle_event.rsplit(": ").next().expect("path"));
    for file in ["processes.txt", "summary.txt", "gpu.txt"] {
        assert_no_forged_lines(file, &read(&bundle.join(file)), &["FORGED-LINE"]);
    }
    let processes = read(&bundle.join("processes.txt"));
    assert!(
        processes.contains("worker\\nFORGED-LINE\\u{1b}[2K 100000"),
        "{processes}"
    );
    supervisor.stop();
}

#[test]
fn a_progress_bar_redrawn_with_carriage_returns_is_not_silence() {
    let host = Sim::gpus(1).build();
    // Three seconds of tqdm-like progress, no newline, with a 1 s stall timeout.
    let server = "exec 3<\"$D/nvidia0\"; for i in $(seq 1 30); do printf '\\rLoading safetensors checkpoint shards: %d%%' $i; sleep 0.1; done; echo; echo serving; exec sleep 100000 3<&-";
    let supervisor = bash_server(
        &host,
        &["--ready-log", "serving", "--stall-timeout", "1s"],
        server,
    );
    let ready = supervisor.wait_for("ready after", 1);
    assert!(
        ready.contains("at log line 31"),
        "each redraw counts as a line: {ready}"
    );
    let (code, events, stdout) = supervisor.stop();
    assert!(
        !events.iter().any(|e| e.contains("hang")),
        "{}",
        events.join("\n")
    );
    assert!(
        stdout.contains("\rLoading safetensors checkpoint shards: 30%"),
        "passed through as written"
    );
    assert_eq!(code, 0, "{}", events.join("\n"));
}

#[test]
fn sighup_to_gpureap_stops_the_server_too() {
    let host = Sim::gpus(1).build();
    let supervisor = bash_server(
        &host,
        &["--ready-log", "serving"],
        "exec 3<\"$D/nvidia0\"; echo serving; exec sleep 100000",
    );
    supervisor.wait_for("ready after", 1);
    let (code, events, _) = supervisor.stop_with(rustix::process::Signal::HUP);
    assert_eq!(code, 0, "{}", events.join("\n"));
    assert!(
        events.iter().any(|e| e.contains("stop requested")),
        "{}",
        events.join("\n")
    );
    nothing_left(&host, 1);
}

#[test]
fn a_closed_stderr_does_not_stop_gpureap_from_stopping_the_server() {
    let host = Sim::gpus(1).build();
    let mut command = gpureap(&host);
    command
        .arg("run")
        .args(["--ready-log", "serving", "--grace", "300ms", "--state-dir"])
        .arg(host.path().join("state"))
        .args([
            "--",
            "bash",
            "-c",
            "exec 3<\"$D/nvidia0\"; echo serving; exec sleep 100000",
        ])
        .env("D", host.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("gpureap run starts");
    // Read the first event, then close the pipe: as a dropped ssh session does.
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut first = String::new();
    stderr.read_line(&mut first).expect("an event");
    drop(stderr);
    let deadline = Instant::now() + Duration::from_secs(20);
    while used(&host, 0) == 0 {
        assert!(Instant::now() < deadline, "the server never held the GPU");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("signal gpureap");
    let status = child.wait().expect("gpureap ends");
    assert_ne!(status.code(), Some(101), "gpureap panicked");
    nothing_supervised_left(child.id());
    nothing_left(&host, 1);
}

/// Returns the containment event of the first start.
fn escapee_is_caught(flags: &[&str]) -> String {
    let setup = setup(3);
    let supervisor = setup.run_faulty_once(flags, "setsid");
    let containment = supervisor.wait_for("containment:", 1);
    supervisor.wait_for("crash: server exited with code 1", 1);
    supervisor.wait_for("GPU 2: freed 20.0 GiB", 1);
    supervisor.wait_for("nothing left behind", 1);
    supervisor.wait_for("restarting in", 1);
    supervisor.wait_for("ready after", 2);
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
    // The setsid grandchild was created (and held GPU 2) before the crash.
    let escapees = std::fs::read_dir(setup.host.path())
        .expect("dir")
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("escapee."))
        .count();
    assert!(escapees >= 1, "{}", events.join("\n"));
    nothing_left(&setup.host, 3);
    containment
}

#[test]
fn a_setsid_grandchild_holding_a_gpu_is_caught_by_the_cgroup() {
    if !cgroup2_present() {
        panic!(
            "CI provides cgroup2 (at /sys/fs/cgroup/unified on this machine type); this host has none"
        );
    }
    let containment = escapee_is_caught(&[]);
    assert!(containment.contains("cgroup v2"), "{containment}");
}

#[test]
fn a_setsid_grandchild_is_caught_by_the_fallback_too() {
    let containment = escapee_is_caught(&["--no-cgroup"]);
    assert!(containment.contains("child subreaper"), "{containment}");
}

#[test]
fn health_turning_503_after_ready_is_a_hang() {
    let setup = setup(2);
    let supervisor = setup.run_faulty_once(&["--health-interval", "200ms"], "health-503");
    supervisor.wait_for("ready after", 1);
    let failed = supervisor.wait_for("health check failed (1/3)", 1);
    assert!(failed.contains("answered 503"), "{failed}");
    let unhealthy = supervisor.wait_for("unhealthy: 3 health checks failed", 1);
    assert!(unhealthy.contains("503"), "{unhealthy}");
    supervisor.wait_for("diagnostic bundle:", 1);
    supervisor.wait_for("nothing left behind", 1);
    let second = supervisor.wait_for("ready after", 2);
    assert!(
        second.contains("good starts (1)"),
        "the first start was ready before it went bad: {second}"
    );
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
    nothing_left(&setup.host, 2);
}

#[test]
fn a_startup_timeout_is_a_hang_and_restarts_are_bounded() {
    let setup = setup(2);
    let supervisor = setup.run(
        &[
            "--startup-timeout",
            "1s",
            "--stall-timeout",
            "1m",
            "--max-restarts",
            "1",
        ],
        &["--fault", "stall"],
    );
    let hang = supervisor.wait_for("hang: not ready after", 1);
    assert!(hang.contains("--startup-timeout"), "{hang}");
    supervisor.wait_for("restarting in", 1);
    supervisor.wait_for("hang: not ready after", 2);
    let (code, events) = supervisor.wait_exit();
    assert_eq!(code, 1, "{}", events.join("\n"));
    assert!(
        events
            .iter()
            .any(|e| e.contains("giving up: 1 restart(s) used of --max-restarts 1")),
        "{}",
        events.join("\n")
    );
    assert_eq!(bundles(&setup.state).len(), 2);
    nothing_left(&setup.host, 2);
}

#[test]
fn run_refuses_bad_input() {
    let host = Sim::gpus(1).build();
    let state = host.path().join("state").display().to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["run"], "required"),
        (
            &["run", "--restart", "sometimes", "--", "true"],
            "invalid value 'sometimes' for '--restart",
        ),
        (
            &["run", "--ready-port", "0", "--", "true"],
            "invalid value '0' for '--ready-port",
        ),
        (
            &["run", "--grace", "300000000000y", "--", "true"],
            "longer than the 30 days",
        ),
        (
            &["run", "--stop-timeout", "-5s", "--", "true"],
            "cannot be negative",
        ),
        (
            &["run", "--ready-log", "(", "--", "true"],
            "invalid --ready-log regex",
        ),
        (
            &["run", "--ready-url", "https://x/health", "--", "true"],
            "invalid --ready-url",
        ),
        (
            &["run", "--stall-timeout", "soon", "--", "true"],
            "invalid duration 'soon'",
        ),
        (
            &["run", "--ready-port", "1", "--ready-log", "x", "--", "true"],
            "cannot be used with",
        ),
        (
            &["run", "--state-dir", "/tmp", "--", "true"],
            "refusing the state directory /tmp: others than its owner may write to /tmp",
        ),
        (
            &["run", "--state-dir", &state, "--", "/nonexistent/server"],
            "cannot start the server: /nonexistent/server does not exist",
        ),
        (
            &["run", "--state-dir", &state, "--", "no-such-server-on-path"],
            "no program named 'no-such-server-on-path' on PATH",
        ),
    ];
    for (args, message) in cases {
        let result = run(&host, args);
        assert_eq!(result.code, 2, "{args:?}: {}", result.stderr);
        assert!(
            result.stderr.contains(message),
            "{args:?}: expected {message:?} in {}",
            result.stderr
        );
        // A command that cannot start is not blamed on containment.
        assert!(!result.stderr.contains("cgroup"), "{}", result.stderr);
    }
    // A --log that cannot be opened: the path is named, nothing starts, and
    // the exit code says "could not complete", not "still held".
    let result = run(
        &host,
        &[
            "run",
            "--state-dir",
            &state,
            "--log",
            "/nonexistent/x.log",
            "--",
            "true",
        ],
    );
    assert_eq!(result.code, 3, "{}", result.stderr);
    assert_contains(&result.stderr, "cannot open --log /nonexistent/x.log");
    assert!(!result.stderr.contains("start 1"), "{}", result.stderr);
}
