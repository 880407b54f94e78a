//! Bad input ends with exit code 2, a message that says what was wrong, and
//! nothing signalled.

use gpureap_core::driver::sim::incident::{Incident, SimHost};

use crate::harness::*;

fn staged() -> (SimHost, Incident, u32) {
    let (host, mut incident) = Sim::gpus(2).stage();
    let holder = incident.hold(scheduler(0, 10 * GIB));
    (host, incident, holder)
}

fn refused(host: &SimHost, args: &[&str], message: &str) {
    let result = run(host, args);
    assert_eq!(
        result.code, 2,
        "{args:?} should exit 2: {}{}",
        result.stdout, result.stderr
    );
    assert!(
        result.stderr.contains(message),
        "{args:?}: expected {message:?} in stderr, got: {}",
        result.stderr
    );
    assert!(
        result.stdout.is_empty(),
        "{args:?} printed a report: {}",
        result.stdout
    );
}

#[test]
fn bad_input_exits_2_and_signals_nothing() {
    let (host, _incident, holder) = staged();
    // The test process runs gpureap: naming it must be refused, not kill the tests.
    let parent = std::process::id().to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["free", "--yes"], "refusing to free without a scope"),
        (
            &["free", "--gpu", "7", "--yes"],
            "no GPU with index 7 (this host has 2 GPUs: 0-1)",
        ),
        (
            &["free", "--gpu", "zero", "--yes"],
            "invalid GPU list 'zero'",
        ),
        (
            &["free", "--match", "sglang(", "--yes"],
            "invalid --match regex 'sglang('",
        ),
        (
            &["free", "--gpu", "0", "--grace", "5 parsecs", "--yes"],
            "invalid duration '5 parsecs'",
        ),
        (
            &["free", "--gpu", "0", "--timeout", "10", "--yes"],
            "invalid duration '10'",
        ),
        (
            &["free", "--pid", "4194999", "--yes"],
            "no process with PID 4194999",
        ),
        (&["free", "--pid", "abc", "--yes"], "invalid PID 'abc'"),
        (
            &["free", "--user", "no-such-user-here", "--yes"],
            "no user named 'no-such-user-here'",
        ),
        (
            &["free", "--gpu", "0", "--all", "--yes"],
            "cannot be used with",
        ),
        (
            &["free", "--gpu", "0", "--bogus"],
            "unexpected argument '--bogus'",
        ),
        (
            &["free", "--gpu", "0"],
            "stdin is not a terminal; pass --yes",
        ),
        // Nothing in scope now, but re-scans could still find something: it asks all the same.
        (
            &["free", "--gpu", "1"],
            "stdin is not a terminal; pass --yes",
        ),
        (
            &["free", "--pid", "1", "--yes"],
            "refusing --pid 1: it is PID 1",
        ),
        (
            &["free", "--pid", &parent, "--yes"],
            "it is an ancestor of gpureap",
        ),
        (&["wait", "--below", "lots"], "invalid size 'lots'"),
        (&["wait", "--below", "0"], "give a size above 0"),
        (
            &["free", "--gpu", "0", "--grace", "300000000000y", "--yes"],
            "longer than the 30 days a flag accepts",
        ),
        (
            &[
                "free",
                "--gpu",
                "0",
                "--timeout",
                "99999999999999999999d",
                "--yes",
            ],
            "invalid duration",
        ),
        (
            &["free", "--gpu", "0", "--grace", "-5s", "--yes"],
            "cannot be negative",
        ),
        (&["wait", "--timeout", "-1s"], "cannot be negative"),
        (
            &["free", "--match", "", "--yes"],
            "use --all if that is what you mean",
        ),
        (&["free", "--pid", "0", "--yes"], "PID 0 is the kernel's"),
        (
            &["status", "--gpu", "0-4294967295"],
            "GPU index 4294967295 is out of range",
        ),
        (
            &["free", "--gpu", "0", "--gpu", "5", "--dry-run"],
            "no GPU with index 5",
        ),
        (&["wait", "--gpu", "2"], "no GPU with index 2"),
        (
            &["status", "--gpu", "0-9"],
            "no GPU with index 2, 3, 4, 5, 6, 7, 8, 9",
        ),
    ];
    for (args, message) in cases {
        refused(&host, args, message);
    }
    assert!(alive(holder), "bad input signalled the holder");
}

/// Several `--gpu` flags widen the list, as several `--pid` flags do.
#[test]
fn repeated_gpu_flags_are_combined() {
    let (host, _incident, holder) = staged();
    let status = run(&host, &["status", "--gpu", "0", "--gpu", "1", "--json"]).json();
    let shown: Vec<u64> = status["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|gpu| gpu["index"].as_u64().expect("index"))
        .collect();
    assert_eq!(shown, [0, 1]);
    let plan = run(
        &host,
        &["free", "--gpu", "1", "--gpu", "0", "--dry-run", "--json"],
    )
    .json();
    assert_eq!(target_pids(&plan), [holder]);
    assert!(alive(holder));
}

#[test]
fn a_bad_backend_is_refused() {
    let (_host, _incident, holder) = staged();
    let result = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", "cuda", "status"])
        .output()
        .expect("runs");
    assert_eq!(result.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&result.stderr).contains("invalid backend 'cuda'"));

    let result = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args([
            "--backend",
            "sim:/nonexistent/gpus",
            "free",
            "--all",
            "--yes",
        ])
        .output()
        .expect("runs");
    assert_eq!(result.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&result.stderr).contains("cannot open /nonexistent/gpus"));
    assert!(alive(holder));
}

#[test]
fn the_backend_can_come_from_the_environment() {
    let (host, _incident, holder) = staged();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["status", "--json"])
        .env("GPUREAP_BACKEND", host.backend())
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0));
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(status["schema_version"], 1);
    assert!(
        status["backend"]
            .as_str()
            .expect("backend")
            .starts_with("sim:")
    );
    assert_eq!(status["gpus"][0]["memory_used"], 10 * GIB);
    assert_eq!(status["gpus"][0]["processes"][0]["pid"], holder);
}

#[test]
fn a_partial_scan_says_so_and_permission_denied_is_reported() {
    let (host, _incident, holder) = staged();
    // An unprivileged user cannot read root's descriptors nor signal root's processes.
    let setpriv = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let mut permissions = std::fs::metadata(host.path()).expect("dir").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(host.path(), permissions).expect("chmod");

    let as_nobody = |args: &[&str]| -> Run {
        std::process::Command::new("setpriv")
            .args(setpriv)
            .arg(crate::harness::reachable_gpureap())
            .arg("--backend")
            .arg(host.backend())
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("setpriv runs")
            .into()
    };
    let status = as_nobody(&["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status = status.json();
    assert_eq!(status["scan"]["complete"], false);
    assert!(
        status["scan"]["unreadable"]
            .as_array()
            .expect("unreadable")
            .iter()
            .any(|entry| entry["pid"] == holder),
        "{status:#}"
    );
    let table = as_nobody(&["status"]);
    assert!(table.stdout.contains("Partial scan"), "{}", table.stdout);

    // The plan says up front that root's process cannot be signalled.
    let plan = as_nobody(&["free", "--pid", &holder.to_string(), "--dry-run"]);
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    assert!(
        plan.stdout.contains(&format!("{holder} (not permitted)"))
            && plan.stdout.contains("permission denied"),
        "{}",
        plan.stdout
    );
    let plan = as_nobody(&["free", "--pid", &holder.to_string(), "--dry-run", "--json"]).json();
    assert_eq!(
        target(&plan, holder).expect("target")["fate"],
        "permission_denied"
    );

    let result = as_nobody(&free_json(&["--pid", &holder.to_string()], "0", "300ms"));
    assert_eq!(result.code, 1, "{}{}", result.stdout, result.stderr);
    let report = result.json();
    assert_eq!(
        target(&report, holder).expect("target")["fate"],
        "permission_denied"
    );
    // The driver still sees the holder's memory, and the outcome says why it stays.
    assert_eq!(gpu(&report, 0)["freed"], false, "{report:#}");
    assert_eq!(reasons(&report, 0), ["permission_denied"]);
    assert!(alive(holder));
}

/// Without a driver the report says so, in the JSON as on stderr, and the
/// exit code says it could not tell (3).
#[test]
fn no_driver_is_said_in_the_json_too() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", "none", "status", "--json"])
        .env_remove("GPUREAP_BACKEND")
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(3));
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert!(
        status["driver_error"]
            .as_str()
            .is_some_and(|error| error.contains("--backend none")),
        "{status:#}"
    );
}

#[test]
fn a_gpu_scope_on_a_host_without_gpus_is_refused() {
    for args in [
        &["free", "--gpu", "all", "--yes"][..],
        &["reset", "--gpu", "all"],
        &["reset", "--plan", "--gpu", "all", "--json"],
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
            .args(["--backend", "none"])
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("runs");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("--gpu names no GPU"),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
