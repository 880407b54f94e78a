//! `gpureap top --json`, the stream a host writes for `top -H`, and the
//! checks of `top -H` made before any view: built with or without the live
//! view (the `top` feature).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};

use crate::harness::{GIB, Sim};

#[test]
fn top_h_takes_one_host_only_and_not_with_json() {
    for hosts in [
        &["-H", "a,b"][..],
        &["-H", "n[1-2]"],
        &["-H", "a", "-H", "b"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_gpureap"))
            .arg("top")
            .args(hosts)
            .stdin(Stdio::null())
            .output()
            .expect("gpureap runs");
        assert_eq!(output.status.code(), Some(2), "{hosts:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("top -H shows one host"), "{stderr}");
    }
    let output = Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["top", "-H", "a", "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("gpureap runs");
    assert_eq!(output.status.code(), Some(2));
}

/// Starts `top --json` on a simulated host and reads its first two
/// documents, each naming `holder`; the rest is drained.
fn stream(host: &SimHost, holder: u32) -> std::process::Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args([
            "--backend",
            &host.backend(),
            "top",
            "--json",
            "--interval",
            "100ms",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("gpureap runs");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    for _ in 0..2 {
        let line = lines.next().expect("a line").expect("readable");
        let document: serde_json::Value = serde_json::from_str(&line).expect("one document a line");
        assert_eq!(document["kind"], "status");
        assert_eq!(document["schema_version"], 1);
        assert!(
            document["holders"]
                .as_array()
                .expect("holders")
                .iter()
                .any(|entry| entry["pid"] == holder),
            "{line}"
        );
    }
    // The rest is not read: drained so that it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    child
}

fn exits_within(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status.code().unwrap_or_else(|| {
                128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
            }));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn top_json_writes_a_status_document_a_line_until_stdin_closes_or_sigterm() {
    let host = Sim::gpus(2).build();
    let mut incident = Incident::new(&host);
    let holder = incident
        .holder(&Holder::new("python3 train.py").on(0, 4 * GIB))
        .expect("holder");
    // Its reader gone (stdin's end, as ssh's channel closing): it ends, 0.
    let mut child = stream(&host, holder);
    drop(child.stdin.take());
    assert_eq!(exits_within(&mut child, Duration::from_secs(10)), Some(0));
    // SIGTERM (the fleet's watch, when the connection drops): 128 + 15.
    let mut child = stream(&host, holder);
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    assert_eq!(exits_within(&mut child, Duration::from_secs(10)), Some(143));
}
