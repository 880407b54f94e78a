//! gpureap on the kernels of RHEL/Rocky 8 (Linux 4.18): no pidfd system
//! calls, and often no cgroup v2. Nothing in gpureap is switched for the
//! test: `free` and `run` run under tests/no_pidfd.py, a seccomp filter that
//! answers ENOSYS to pidfd_open, pidfd_send_signal and pidfd_getfd and logs
//! each call it refused, and `run` also in a mount namespace whose
//! /sys/fs/cgroup has no cgroup2 mount. The tests check that the targets were
//! freed and verified, and, from the filter's log, that gpureap did ask for a
//! pidfd and was refused, so its signals went out through the fallback.

use std::path::Path;
use std::process::{Command, Stdio};

use gpureap_core::driver::sim::incident::Holder;

use crate::harness::*;
use crate::run::{Supervisor, bundles, nothing_left};

/// Debian's Python, where python3-seccomp is installed (a pyenv python3
/// earlier on PATH may not have it).
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

fn wrapper() -> String {
    format!("{}/tests/no_pidfd.py", env!("CARGO_MANIFEST_DIR"))
}

/// `command` run under the filter, logging refused calls to `log`.
fn without_pidfd(log: &Path, command: &[&str]) -> Command {
    let mut wrapped = Command::new(SYSTEM_PYTHON);
    wrapped
        .arg(wrapper())
        .arg("--log")
        .arg(log)
        .arg("--")
        .args(command)
        .stdin(Stdio::null());
    wrapped
}

/// The calls the filter refused, as (name, caller's PID).
fn refused(log: &Path) -> Vec<(String, u32)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        !text.contains("listener failed"),
        "the filter's listener failed:\n{text}"
    );
    text.lines()
        .map(|line| {
            let (name, pid) = line
                .split_once(' ')
                .unwrap_or_else(|| panic!("bad log line {line:?}"));
            (name.to_string(), pid.parse().expect("caller's PID"))
        })
        .collect()
}

/// How many times `pid` asked for each pidfd call and was refused.
fn refused_to(log: &Path, pid: u32, call: &str) -> usize {
    refused(log)
        .iter()
        .filter(|(name, caller)| name == call && *caller == pid)
        .count()
}

const PROBE: &str = "import os, sys
try:
    os.close(os.pidfd_open(os.getpid()))
    print('opened')
except OSError as error:
    print(error.errno)
";

/// The control for the tests below: pidfd_open works on this kernel, and
/// under the filter it fails with ENOSYS (38) and is logged, also for a
/// process the wrapped command starts. Without this, a fallback that
/// "works" under the filter could be the pidfd path after all.
#[test]
fn the_filter_answers_enosys_to_pidfd_open_and_logs_it() {
    let plain = Command::new(SYSTEM_PYTHON)
        .args(["-c", PROBE])
        .output()
        .expect("python3 runs");
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout).trim(),
        "opened",
        "this kernel has no pidfd_open itself: the tests below would show nothing"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("refused.log");
    let script = format!(
        "import subprocess, sys\n{PROBE}sys.stdout.flush()\nsubprocess.run([sys.executable, '-c', {PROBE:?}])"
    );
    let output = without_pidfd(&log, &[SYSTEM_PYTHON, "-c", &script])
        .output()
        .expect("wrapper runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .collect::<Vec<_>>(),
        ["38", "38"],
        "{stderr}"
    );
    let calls = refused(&log);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls.iter().all(|(name, _)| name == "pidfd_open"),
        "{calls:?}"
    );
    assert_ne!(calls[0].1, calls[1].1, "one call from each process");
}

/// `free` on a crashed SGLang server, one worker ignoring SIGTERM: every
/// signal (SIGTERM, then SIGSTOP and SIGKILL for the stubborn one) goes out
/// by the start-time-checked kill(2), and the GPUs are verified free.
#[test]
fn free_without_pidfd_signals_by_checked_kill_and_verifies() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let (launcher, workers) = incident.sglang_tree([
        scheduler(0, 70 * GIB),
        scheduler(1, 70 * GIB).ignoring_sigterm(),
    ]);
    let notebook = incident.hold(Holder::new("jupyter-kernel colleague").on(1, 5 * GIB));
    incident.orphan(launcher, &workers);

    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("refused.log");
    let backend = host.backend();
    let child = without_pidfd(
        &log,
        &[
            env!("CARGO_BIN_EXE_gpureap"),
            "--backend",
            &backend,
            "free",
            "--orphans",
            "--grace",
            "500ms",
            "--yes",
            "--json",
        ],
    )
    .env_remove("GPUREAP_BACKEND")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("gpureap runs");
    let gpureap = child.id();
    let result: Run = child.wait_with_output().expect("gpureap ends").into();
    let report = result.json();
    assert_eq!(result.code, 0, "{report:#}\n{}", result.stderr);
    assert_eq!(signals(&report, workers[0]), ["SIGTERM"]);
    assert_eq!(
        signals(&report, workers[1]),
        ["SIGTERM", "SIGSTOP", "SIGKILL"]
    );
    for pid in workers {
        assert!(!alive(pid), "worker {pid} survived");
    }
    assert!(alive(notebook), "the colleague's notebook was killed");
    for index in 0..2 {
        assert_eq!(gpu(&report, index)["freed"], true, "{report:#}");
    }
    assert_eq!(gpu(&report, 1)["memory_after"], 5 * GIB);

    // Each of the four signals first asked for a pidfd, and was refused.
    let asked = refused_to(&log, gpureap, "pidfd_open");
    assert!(asked >= 4, "gpureap asked for a pidfd {asked} times");
    assert_eq!(refused_to(&log, gpureap, "pidfd_send_signal"), 0);
}

/// The mount namespace of a host without cgroup v2 (RHEL/Rocky 8's default):
/// /sys/fs/cgroup is a tmpfs with a cgroup v1 hierarchy where the host has
/// one to spare, and no cgroup2 anywhere. Then the command.
const NO_CGROUP2: &str = r#"set -e
umount --recursive --lazy /sys/fs/cgroup
mount -t tmpfs -o mode=755 gpureap-old-kernel /sys/fs/cgroup
mkdir /sys/fs/cgroup/pids
mount -t cgroup -o pids cgroup /sys/fs/cgroup/pids 2>/dev/null || rmdir /sys/fs/cgroup/pids
if grep -q ' - cgroup2 ' /proc/self/mountinfo; then echo 'cgroup2 still mounted' >&2; exit 125; fi
exec "$@""#;

/// `run` on a kernel without pidfd and without cgroup v2: the server gets
/// its own session with gpureap as child subreaper, and a grandchild that
/// escaped with setsid and holds a GPU is still found, killed by checked
/// kill(2), and the GPU verified free, before the restart.
#[test]
fn run_without_pidfd_or_cgroup_v2_catches_a_setsid_escapee() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the old-kernel run test makes a mount namespace: run the suite as root"
    );
    let setup = crate::run::setup(3);
    let host = &setup.host;
    let log = host.path().join("refused.log");
    let marker = host.path().join("fault-once");
    let path = |path: &Path| path.to_str().expect("utf-8 path").to_string();
    let fault = ["--fault", "setsid", "--fault-once", &path(&marker)];
    let gpureap_args = [
        env!("CARGO_BIN_EXE_gpureap").to_string(),
        "--backend".to_string(),
        host.backend(),
    ]
    .into_iter()
    .chain(setup.run_args(&[], &fault));
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(NO_CGROUP2)
        .arg("sh")
        .args([SYSTEM_PYTHON, &wrapper(), "--log", &path(&log), "--"])
        .args(gpureap_args)
        .env_remove("GPUREAP_BACKEND")
        .stdin(Stdio::null());
    let supervisor = Supervisor::start(command);
    let gpureap = supervisor.child.id();

    let containment = supervisor.wait_for("containment:", 1);
    assert!(
        containment.contains("child subreaper (no cgroup2 mount)"),
        "{containment}"
    );
    supervisor.wait_for("crash: server exited with code 1", 1);
    supervisor.wait_for("GPU 2: freed 20.0 GiB", 1);
    supervisor.wait_for("nothing left behind", 1);
    supervisor.wait_for("ready after", 2);
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
    let escapees = std::fs::read_dir(host.path())
        .expect("dir")
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("escapee."))
        .count();
    assert!(escapees >= 1, "no setsid grandchild was started");
    assert!(!bundles(&setup.state).is_empty(), "{}", events.join("\n"));
    nothing_left(host, 3);

    let asked = refused_to(&log, gpureap, "pidfd_open");
    assert!(
        asked >= 1,
        "gpureap never asked for a pidfd: {:?}",
        refused(&log)
    );
    assert_eq!(refused_to(&log, gpureap, "pidfd_send_signal"), 0);
}
