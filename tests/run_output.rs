//! `gpureap run`'s output handling against what a real terminal and a real
//! server do: a reader that stops reading (a pager, a stalled ssh session)
//! must not make a healthy server look hung, nor stop gpureap from stopping
//! it; a server that writes without newlines must not grow gpureap's memory.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::SimHost;

use crate::harness::*;
use crate::run::{Supervisor, nothing_left, nothing_supervised_left, read, used};
use crate::run_state::peak_memory;

/// A server holding GPU 0 that prints 20 MB at once (and 2 MB on stderr
/// with $FLOOD_STDERR), then a line every 100 ms for 2.5 s (so it never
/// falls silent for the 1 s stall timeout), then is ready.
const CHATTY: &str = "exec 3<\"$D/nvidia0\"; yes 'INFO: loading shard, all is well' | head -c 20000000; echo; \
    if [ -n \"$FLOOD_STDERR\" ]; then yes 'WARN: noisy' | head -c 2000000 >&2; fi; \
    for i in $(seq 1 25); do echo \"progress $i\"; sleep 0.1; done; \
    echo serving; exec sleep 100000";

fn chatty(host: &SimHost, flags: &[&str]) -> std::process::Command {
    let mut command = gpureap(host);
    command
        .arg("run")
        .args(flags)
        .args(["--ready-log", "serving", "--stall-timeout", "1s"])
        .args(["--grace", "300ms", "--state-dir"])
        .arg(host.path().join("state"))
        .args(["--", "bash", "-c", CHATTY])
        .env("D", host.path());
    command
}

#[test]
fn a_stdout_nobody_reads_does_not_make_a_healthy_server_look_hung() {
    let host = Sim::gpus(1).build();
    let log = host.path().join("server.log");
    let command = chatty(&host, &["--log", log.to_str().expect("utf-8 path")]);
    // The read end stays open and is never read: a paused pager.
    let (stalled, writer) = std::io::pipe().expect("pipe");
    let supervisor = Supervisor::start_with_stdout(command, Stdio::from(writer));
    let ready = supervisor.wait_for("ready after", 1);
    let line: u64 = ready
        .split("at log line ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .and_then(|number| number.parse().ok())
        .expect("line number in the ready event");
    // 20 MB of 33-byte lines (the last one cut short), 25 more, then "serving".
    assert_eq!(
        line,
        20_000_000 / 33 + 1 + 25 + 1,
        "every line was counted while stdout was blocked: {ready}"
    );
    let notice = supervisor.wait_for("stdout is not keeping up", 1);
    assert!(notice.contains("--log"), "{notice}");
    assert_eq!(used(&host, 0), GIB, "the server still runs");
    let (code, events, _) = supervisor.stop();
    assert!(
        !events.iter().any(|event| event.contains("hang")),
        "{}",
        events.join("\n")
    );
    assert!(
        events.iter().any(
            |event| event.contains("dropped") && event.contains("bytes of the server's output")
        ),
        "the drop is counted: {}",
        events.join("\n")
    );
    assert_eq!(code, 0, "{}", events.join("\n"));
    assert!(
        read(&log).contains("progress 25\n"),
        "the log has all of it"
    );
    assert!(std::fs::metadata(&log).expect("log").len() > 20_000_000);
    nothing_left(&host, 1);
    drop(stalled);
}

#[test]
fn blocked_stdout_and_stderr_do_not_stop_gpureap_from_stopping_the_server() {
    let host = Sim::gpus(1).build();
    let mut command = chatty(&host, &[]);
    command.env("FLOOD_STDERR", "1");
    let (stalled_out, out) = std::io::pipe().expect("pipe");
    let (stalled_err, err) = std::io::pipe().expect("pipe");
    command.stdout(out).stderr(err);
    let mut child = command.spawn().expect("gpureap run starts");
    // Ready once the server has said so: it then holds the GPU and is quiet.
    let deadline = Instant::now() + Duration::from_secs(30);
    let ready = host.path().join("state");
    while used(&host, 0) == 0 || !ready.join("starts.json").exists() {
        assert!(
            Instant::now() < deadline,
            "never ready: gpureap blocked on its own output?"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("signal gpureap");
    let deadline = Instant::now() + Duration::from_secs(15);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gpureap did not stop the server within 15s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(50));
    nothing_supervised_left(child.id());
    nothing_left(&host, 1);
    drop((stalled_out, stalled_err));
}

#[test]
fn a_line_without_an_end_does_not_grow_gpureap_memory() {
    let host = Sim::gpus(1).build();
    let state = host.path().join("state");
    let mut command = gpureap(&host);
    command
        .arg("run")
        .args(["--ready-log", "serving", "--restart", "never"])
        .args(["--grace", "300ms", "--state-dir"])
        .arg(&state)
        .args([
            "--",
            "bash",
            "-c",
            "exec 3<\"$D/nvidia0\"; head -c 200000000 /dev/zero | tr '\\0' x; echo; \
             echo serving; until [ -e \"$D/measured\" ]; do sleep 0.01; done; exit 3",
        ])
        .env("D", host.path());
    let supervisor = Supervisor::start_with_stdout(command, Stdio::null());
    let ready = supervisor.wait_for("ready after", 1);
    assert!(
        ready.contains("at log line 2"),
        "the long line counts once: {ready}"
    );
    let peak = peak_memory(supervisor.child.id());
    // Measured while it runs: now the server crashes.
    std::fs::write(host.path().join("measured"), "").expect("measured");
    let bundle_event = supervisor.wait_for("diagnostic bundle:", 1);
    let (code, events) = supervisor.wait_exit();
    assert_eq!(code, 1, "a crash: {}", events.join("\n"));
    assert!(peak < 64 << 20, "gpureap run peaked at {} MiB", peak >> 20);
    let bundle = PathBuf::from(bundle_event.rsplit(": ").next().expect("path"));
    let tail = read(&bundle.join("log-tail.txt"));
    assert!(tail.len() < 64 << 10, "log tail of {} bytes", tail.len());
    assert!(tail.contains("serving"), "{tail}");
    assert!(
        tail.contains("bytes cut"),
        "the cut is said: {}",
        &tail[tail.len().saturating_sub(200)..]
    );
    nothing_left(&host, 1);
}

/// A crash that takes the whole tree with it leaves no process to read
/// stacks from: the events say nothing of stacks rather than an empty
/// `stacks:` line, and the bundle is still written.
#[test]
fn a_crash_that_leaves_no_process_prints_no_empty_stacks_line() {
    let host = Sim::gpus(1).build();
    let mut command = gpureap(&host);
    command
        .arg("run")
        .args(["--ready-log", "serving", "--restart", "never"])
        .args(["--grace", "300ms", "--state-dir"])
        .arg(host.path().join("state"))
        .args([
            "--",
            "bash",
            "-c",
            "exec 3<\"$D/nvidia0\"; echo serving; sleep 0.5; exit 3",
        ])
        .env("D", host.path());
    let supervisor = Supervisor::start(command);
    supervisor.wait_for("crash: server exited with code 3", 1);
    supervisor.wait_for("diagnostic bundle:", 1);
    let (code, events) = supervisor.wait_exit();
    assert_eq!(code, 1, "a crash: {}", events.join("\n"));
    assert!(
        !events
            .iter()
            .any(|event| event.trim_end() == "gpureap run: stacks:"),
        "{}",
        events.join("\n")
    );
    nothing_left(&host, 1);
}
