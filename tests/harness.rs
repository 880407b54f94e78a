//! A small harness: run the gpureap binary against a simulated host and read
//! its JSON, and ask /proc whether a staged process is still alive.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::SimHost;
use serde_json::Value;

pub const GIB: u64 = 1 << 30;

/// The gpureap binary, pointed at a simulated host, with no stdin.
pub fn gpureap(host: &SimHost) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpureap"));
    command
        .arg("--backend")
        .arg(host.backend())
        .env_remove("GPUREAP_BACKEND")
        .stdin(Stdio::null());
    command
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|error| {
            panic!(
                "stdout is not JSON ({error}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

impl From<Output> for Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

pub fn run(host: &SimHost, args: &[&str]) -> Run {
    gpureap(host)
        .args(args)
        .output()
        .expect("gpureap runs")
        .into()
}

/// Alive and not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// The signals gpureap delivered to one PID, in order.
pub fn signals(report: &Value, pid: u32) -> Vec<String> {
    target(report, pid)
        .map(|target| {
            target["signals"]
                .as_array()
                .expect("signals array")
                .iter()
                .filter(|event| event["delivery"] == "sent")
                .map(|event| event["signal"].as_str().expect("signal name").to_string())
                .collect()
        })
        .unwrap_or_default()
}

pub fn target(report: &Value, pid: u32) -> Option<&Value> {
    report["targets"]
        .as_array()
        .expect("targets array")
        .iter()
        .find(|target| target["pid"] == pid)
}

pub fn target_pids(report: &Value) -> Vec<u32> {
    let mut pids: Vec<u32> = report["targets"]
        .as_array()
        .expect("targets array")
        .iter()
        .map(|target| target["pid"].as_u64().expect("pid") as u32)
        .collect();
    pids.sort_unstable();
    pids
}

pub fn spared(report: &Value, pid: u32) -> Option<String> {
    report["spared"]
        .as_array()
        .expect("spared array")
        .iter()
        .find(|entry| entry["pid"] == pid)
        .map(|entry| entry["reason"].as_str().expect("reason").to_string())
}

pub fn gpu(report: &Value, index: u32) -> &Value {
    report["gpus"]
        .as_array()
        .expect("gpus array")
        .iter()
        .find(|gpu| gpu["index"] == index)
        .unwrap_or_else(|| panic!("GPU {index} not in report: {report:#}"))
}

pub fn reasons(report: &Value, index: u32) -> Vec<String> {
    gpu(report, index)["reasons"]
        .as_array()
        .expect("reasons array")
        .iter()
        .map(|reason| reason["reason"].as_str().expect("reason tag").to_string())
        .collect()
}

pub fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Runs gpureap against a simulated host as user nobody, which may read
/// neither root's descriptors nor files only root may read. The host's
/// directory is made world-readable first, as a shared sim directory would be.
pub fn run_as_nobody(host: &SimHost, args: &[&str]) -> Run {
    let mut permissions = std::fs::metadata(host.path()).expect("dir").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(host.path(), permissions).expect("chmod");
    run_as_nobody_unchanged(host, args)
}

/// A copy of gpureap that any uid can run: the checkout may sit in a folder
/// only root may enter (a clone under a private temporary directory), where
/// a test that runs gpureap as nobody would test only that exec fails.
/// Copied once per test binary; removed when it exits.
pub fn reachable_gpureap() -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    static PLACE: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let place = PLACE.get_or_init(|| {
        let place = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(place.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let binary = place.path().join("gpureap");
        std::fs::copy(env!("CARGO_BIN_EXE_gpureap"), &binary).expect("copy");
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        place
    });
    place.path().join("gpureap")
}

/// As `run_as_nobody`, leaving the directory's mode as it is.
pub fn run_as_nobody_unchanged(host: &SimHost, args: &[&str]) -> Run {
    std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(reachable_gpureap())
        .arg("--backend")
        .arg(host.backend())
        .args(args)
        .env_remove("GPUREAP_BACKEND")
        .stdin(Stdio::null())
        .output()
        .expect("setpriv runs")
        .into()
}

/// Runs `command` to its end, or kills it after `limit` and fails: for a
/// command that must end without waiting out a long timeout of its own.
pub fn ends_within(command: &mut Command, limit: Duration, what: &str) -> Run {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpureap starts");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output");
            panic!(
                "{what}: still running after {limit:?} (killed); it waits out its timeout\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output").into()
}

/// The kernel function the process `pid` sleeps in (`/proc/PID/wchan`):
/// `None` when it is gone, `"0"` while it runs or is runnable.
pub fn wchan(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).ok()
}

/// Where a gpureap that has read the driver once waits for the next reading
/// (`Driver::wait_for_change`): in poll(2) on its holders' pidfds, or asleep
/// where it has none to poll (no holders, kernels before 5.3).
pub const WAITING_ON_THE_DRIVER: &[&str] = &["poll", "nanosleep"];

/// Waits, for at most 30 s, until the process `pid` sleeps in a kernel
/// function whose name contains one of `places` (`"poll"`: blocked in
/// poll(2); `"wait_for_partner"`, `"fifo_open"` on older kernels: in the open
/// of a FIFO nobody has opened the other end of). `what` says what that
/// means, for the failure.
pub fn blocked_in(pid: u32, places: &[&str], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = wchan(pid);
        if now
            .as_deref()
            .is_some_and(|now| places.iter().any(|place| now.contains(place)))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: process {pid} never blocked in {places:?} within 30s (wchan {now:?})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// When the process `pid` started, in clock ticks since boot (the 22nd
/// field of `/proc/PID/stat`).
pub fn start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    stat.rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(19))
        .and_then(|ticks| ticks.parse().ok())
        .expect("start time")
}

/// Waits until the clock has passed the tick the process `pid` started in:
/// a process started from then on is younger by its start time too, which
/// the kernel counts in ticks.
pub fn past_start_tick(pid: u32) {
    let started = start_ticks(pid);
    let per_second = rustix::param::clock_ticks_per_second();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // Seconds since boot, by the same clock, to the hundredth.
        let uptime = std::fs::read_to_string("/proc/uptime").expect("uptime");
        let centiseconds: u64 = uptime
            .split_whitespace()
            .next()
            .and_then(|seconds| seconds.replace('.', "").parse().ok())
            .expect("uptime in hundredths");
        if centiseconds * per_second / 100 > started {
            return;
        }
        assert!(Instant::now() < deadline, "the clock stands still");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Where `skip` records the tests that did not run, one `SKIPPED: test:
/// reason` line each, for the end of the suite to count (`.ci/run` prints
/// them); `$GPUREAP_TEST_SKIPPED` names another file.
pub const SKIPPED: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/skipped.txt");

/// Reports the calling test skipped, with `reason`: a `SKIPPED: test:
/// reason` line on stderr, and the same line appended to `SKIPPED`. A test
/// that cannot run here calls `return skip(reason)` instead of returning in
/// silence.
pub fn skip(reason: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("unnamed test");
    let line = format!("SKIPPED: {test}: {reason}\n");
    eprint!("{line}");
    let file = std::env::var_os("GPUREAP_TEST_SKIPPED").map_or_else(
        || std::path::PathBuf::from(SKIPPED),
        std::path::PathBuf::from,
    );
    let recorded = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .and_then(|mut opened| opened.write_all(line.as_bytes()));
    if let Err(error) = recorded {
        panic!(
            "{test} is skipped ({reason}) and could not record it in {}: {error}",
            file.display()
        );
    }
}

/// Bash's `$'…'` quoting of any bytes (NUL aside): how a test puts bytes a
/// shell would otherwise act on into a script.
pub fn ansi_c(bytes: &[u8]) -> String {
    let mut quoted = String::from("$'");
    for byte in bytes {
        quoted.push_str(&format!("\\x{byte:02x}"));
    }
    quoted.push('\'');
    quoted
}

/// A script for `Incident::spawn` (`$D` the simulated host): a process with
/// a 1 GiB context on GPU `gpu` whose argv[0] is `title` and whose comm is
/// `comm`, any bytes but NUL and '/' (at most 15: it is the name of the
/// link to sleep it is run through), recorded under `record`, the plain
/// text `title` starts with.
pub fn named_holder(record: &str, title: &[u8], comm: &[u8], gpu: u32) -> String {
    assert!(title.starts_with(record.as_bytes()) && !record.contains('\n'));
    assert!(comm.len() <= 15 && !comm.contains(&b'/') && !comm.contains(&0));
    format!(
        "ln -sfn \"$(command -v sleep)\" \"$D\"/{comm}; exec 3<\"$D/nvidia{gpu}\"; \
         printf '%s %s\\n' \"$BASHPID\" {record} >> \"$D/pids\"; exec -a {title} \"$D\"/{comm} 100000",
        comm = ansi_c(comm),
        record = ansi_c(record.as_bytes()),
        title = ansi_c(title),
    )
}

/// Asserts that `text`, as a person would read it, holds no control
/// character but the newline, and that no line of it begins with one of
/// `forged`: text that a process or a host made up.
pub fn assert_no_forged_lines(what: &str, text: &str, forged: &[&str]) {
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "{what} wrote a control character:\n{text:?}"
    );
    for line in text.lines() {
        for forgery in forged {
            assert!(
                !line.trim_start().starts_with(forgery),
                "{what} let a name start a line ({forgery:?}):\n{text}"
            );
        }
    }
}
