//! `gpureap check` in node-problem-detector's protocol, against staged
//! incidents: exit 0 healthy, 1 problem, 3 unknown (could not tell), 2 bad
//! usage (unknown too, to node-problem-detector), the message first.

use std::process::Command;

use gpureap_core::driver::sim::incident::Holder;

use crate::harness::*;

fn first_line(result: &Run) -> &str {
    result.stdout.lines().next().unwrap_or("")
}

#[test]
fn a_healthy_node_exits_0_with_a_short_message() {
    let (host, mut incident) = Sim::gpus(4).stage();
    // A healthy user and a monitor: neither is a problem.
    incident.hold(Holder::new("python3 train.py").on(1, 40 * GIB));
    incident.hold(Holder::new("dcgm-exporter"));
    let result = run(&host, &["check"]);
    assert_eq!(result.code, 0, "{}{}", result.stdout, result.stderr);
    assert_eq!(
        first_line(&result),
        "GPUs 0-3: no memory held by no process, no orphans"
    );
}

#[test]
fn memory_held_by_no_process_is_a_problem() {
    let host = Sim::gpus(2).build();
    host.leak(1, 5 * GIB).expect("leak");
    let result = run(&host, &["check"]);
    assert_eq!(result.code, 1, "{}", result.stdout);
    assert_eq!(first_line(&result), "GPU 1: 5.0 GiB held by no process");
    assert!(
        result
            .stdout
            .contains("only a GPU reset or a reboot clears it")
    );
    // Checking only GPU 0: healthy.
    assert_eq!(run(&host, &["check", "--gpu", "0"]).code, 0);
}

#[test]
fn orphans_holding_memory_are_a_problem() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let (launcher, workers) = incident.sglang_tree([
        scheduler(0, 20 * GIB),
        Holder::new("sglang::scheduler_TP1").on(0, 10 * GIB),
    ]);
    // Before the launcher dies: healthy.
    assert_eq!(run(&host, &["check"]).code, 0);
    incident.orphan(launcher, &workers);
    let result = run(&host, &["check"]);
    assert_eq!(result.code, 1, "{}", result.stdout);
    assert_eq!(
        first_line(&result),
        "GPU 0: 30.0 GiB held by 2 orphaned processes"
    );
    assert!(result.stdout.contains("gpureap free --orphans --dry-run"));
    // Read-only: they still hold it.
    assert!(workers.iter().all(|&pid| alive(pid)));
}

/// A protected name spares a process from signals, not its memory from the
/// verdict: an orphan titled nvidia-smi holding 23 GiB is a problem for
/// `check` and orphaned memory for the exporter, as any orphan is, while
/// `free --orphans` still leaves it alone (named with --pid, it is freed).
#[test]
fn an_orphan_under_a_protected_name_holding_memory_is_still_a_problem() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let (launcher, [orphan]) = incident.sglang_tree([Holder::new("nvidia-smi").on(1, 23 * GIB)]);
    incident.orphan(launcher, &[orphan]);
    let result = run(&host, &["check"]);
    assert_eq!(result.code, 1, "{}", result.stdout);
    assert_eq!(
        first_line(&result),
        "GPU 1: 23.0 GiB held by 1 orphaned process"
    );
    let metrics = run(&host, &["status", "--prometheus"]);
    let found = crate::exporter::samples(&metrics.stdout);
    assert_eq!(
        crate::exporter::value(&found, "gpureap_gpu_orphaned_memory_bytes", &[("gpu", "1")]),
        Some((23 * GIB) as f64),
        "{}",
        metrics.stdout
    );
    let plan = run(&host, &["free", "--orphans", "--dry-run", "--json"]).json();
    assert_eq!(plan["targets"], serde_json::json!([]), "{plan:#}");
    assert_eq!(plan["spared"][0]["pid"], orphan, "{plan:#}");
    assert_eq!(plan["spared"][0]["reason"], "protected", "{plan:#}");
    assert!(alive(orphan));
}

#[test]
fn a_lost_gpu_is_a_problem_and_several_problems_are_counted() {
    let host = Sim::gpus(3).build();
    host.lose(2).expect("lost");
    host.leak(0, 2 * GIB).expect("leak");
    let result = run(&host, &["check"]);
    assert_eq!(result.code, 1, "{}", result.stdout);
    assert_eq!(
        first_line(&result),
        "GPU 0: 2.0 GiB held by no process (+1 more)"
    );
    assert_contains(
        &result.stdout,
        "GPU 2: lost (fallen off the bus or otherwise inaccessible)",
    );
    assert!(first_line(&result).chars().count() <= 80);
}

/// node-problem-detector shows the first line; the details follow it and
/// do not say it again (they did: one problem was printed twice), unless
/// the first line had to cut it.
#[test]
fn the_first_line_is_printed_once() {
    let host = Sim::gpus(3).build();
    host.leak(1, 5 * GIB).expect("leak");
    let one = run(&host, &["check"]);
    assert_eq!(one.code, 1, "{}", one.stdout);
    assert_eq!(
        one.stdout
            .lines()
            .filter(|line| line.contains("GPU 1:"))
            .count(),
        1,
        "{}",
        one.stdout
    );
    host.lose(2).expect("lost");
    let two = run(&host, &["check"]);
    assert_eq!(two.code, 1, "{}", two.stdout);
    assert_eq!(
        first_line(&two),
        "GPU 1: 5.0 GiB held by no process (+1 more)"
    );
    assert_eq!(
        two.stdout
            .lines()
            .filter(|line| line.contains("GPU 1:"))
            .count(),
        1,
        "{}",
        two.stdout
    );
    assert!(two.stdout.contains("\nGPU 2: lost"), "{}", two.stdout);
}

#[test]
fn no_driver_is_unknown() {
    let host = Sim::gpus(1).build();
    // The whole driver fails: its claims directory is a symlink, which it refuses.
    let claims = host.path().join("claims");
    std::fs::remove_dir(&claims).expect("claims removed");
    std::os::unix::fs::symlink("/nonexistent", &claims).expect("symlink");
    let result = run(&host, &["check"]);
    assert_eq!(result.code, 3, "{}", result.stdout);
    assert!(
        first_line(&result).starts_with("GPU driver unavailable: "),
        "{}",
        result.stdout
    );
    assert!(first_line(&result).chars().count() <= 80);

    let none = Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", "none", "check"])
        .env_remove("GPUREAP_BACKEND")
        .output()
        .expect("runs");
    assert_eq!(none.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&none.stdout).starts_with("GPU driver unavailable"));
}

#[test]
fn bad_input_is_unknown_to_node_problem_detector() {
    let host = Sim::gpus(2).build();
    let result = run(&host, &["check", "--gpu", "7"]);
    assert_eq!(result.code, 2, "{}", result.stderr);
    assert!(result.stderr.contains('7'), "{}", result.stderr);
}

#[test]
fn the_node_problem_detector_plugin_runs_gpureap_check() {
    // The plugin config inside the ConfigMap.
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/kubernetes/node-problem-detector-gpureap.yaml");
    let plugin = crate::exporter::from_yaml(&manifest, "docs[0]['data']['gpureap-check.json']");
    assert_eq!(plugin["plugin"], "custom");
    let rule = &plugin["rules"][0];
    assert_eq!(rule["args"], serde_json::json!(["check"]));
    assert!(rule["path"].as_str().expect("path").ends_with("/gpureap"));
    assert_eq!(rule["condition"], plugin["conditions"][0]["type"]);
    assert_eq!(plugin["pluginConfig"]["max_output_length"], 80);
}

/// An Xid of the drain list in the (simulated) kernel log is a problem
/// naming the Xid and the GPU, with its advice; one off the list, or one
/// a user forged through /dev/kmsg (facility 1), is not.
#[test]
fn an_xid_of_the_drain_list_is_a_problem_with_its_advice() {
    let host = Sim::gpus(2).build();
    host.xid(0, 13, 5_000_000, "Graphics SM Warp Exception")
        .expect("xid 13");
    // A user's write to /dev/kmsg carries facility 1: prio 11 (user.err).
    host.log_kernel(
        11,
        6_000_000,
        "NVRM: Xid (PCI:0000:02:00): 79, pid=1, name=x, forged",
    )
    .expect("forged");
    let result = run(&host, &["check"]);
    assert_eq!(result.code, 0, "{}{}", result.stdout, result.stderr);
    host.xid(1, 79, 7_000_000, "GPU has fallen off the bus.")
        .expect("xid 79");
    host.leak(1, 5 * GIB).expect("leak");
    let result = run(&host, &["check"]);
    assert_eq!(result.code, 1, "{}{}", result.stdout, result.stderr);
    assert!(
        first_line(&result).starts_with("GPU 1: Xid 79 at "),
        "{}",
        result.stdout
    );
    assert!(first_line(&result).ends_with("(GPU has fallen off the bus) (+1 more)"));
    assert_contains(
        &result.stdout,
        "(GPU has fallen off the bus): a reset will not help; reboot the node",
    );
    // Off the list (flag or environment): only the memory is a problem.
    let result = run(&host, &["check", "--drain-xids", "48,95"]);
    assert_eq!(first_line(&result), "GPU 1: 5.0 GiB held by no process");
    // The Xid 79 still explains it.
    assert_contains(&result.stdout, "reboot the node");
    for bad in ["", "79,x", "0", "-1", "10000"] {
        let result = run(&host, &["check", "--drain-xids", bad]);
        assert_eq!(result.code, 2, "{bad}: {}", result.stderr);
    }
    let result = run(&host, &["check", "--gpu", "0", "--drain-xids", "13"]);
    assert_eq!(result.code, 1, "{}", result.stdout);
    assert!(first_line(&result).starts_with("GPU 0: Xid 13 at "));
    assert!(result.stdout.contains("the GPU needs nothing"));
}

/// A lost GPU's finding comes with what its Xid says: a reboot.
#[test]
fn a_lost_gpu_gets_the_advice_of_its_xid() {
    let host = Sim::gpus(2).build();
    host.lose(1).expect("lose");
    let result = run(&host, &["check", "--drain-xids", "none"]);
    assert_eq!(result.code, 1, "{}", result.stdout);
    assert!(!result.stdout.contains("reboot"), "{}", result.stdout);
    host.xid(1, 79, 8_000_000, "GPU has fallen off the bus.")
        .expect("xid");
    let result = run(&host, &["check", "--drain-xids", "none"]);
    assert_eq!(result.code, 1, "{}", result.stdout);
    assert_eq!(
        first_line(&result),
        "GPU 1: lost (fallen off the bus or otherwise inaccessible)"
    );
    assert_contains(&result.stdout, "a reset will not help; reboot the node");
}
