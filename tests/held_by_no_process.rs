//! One rule for memory held by no process: every command that judges it
//! gives the same figure and the same verdict, with the tolerance the driver
//! declares (`DIR/bookkeeping` on the simulated driver: 0 without it).
//! `status -H` is in tests/fleet.rs, the Slurm hooks in tests/slurm.rs.

use gpureap::driver::sim::incident::{Holder, Incident, SimHost};

use crate::exporter::{samples, value};
use crate::harness::*;

const MIB: u64 = 1 << 20;

/// What the status document and the exporter say about one GPU with `bytes`
/// held by no process: `held` is the verdict expected.
fn judged_alike(host: &SimHost, gpu: u32, bytes: u64, held: bool) {
    let label = gpu.to_string();
    let status = run(host, &["status", "--json"]).json();
    assert_eq!(
        gpu_of(&status, gpu)["memory_unattributed"],
        bytes,
        "{status:#}"
    );
    assert_eq!(
        gpu_of(&status, gpu)["held_by_no_process"],
        held,
        "status --json: {status:#}"
    );

    let exposition = run(host, &["status", "--prometheus"]);
    let found = samples(&exposition.stdout);
    let on = [("gpu", label.as_str())];
    assert_eq!(
        value(&found, "gpureap_gpu_memory_unattributed_bytes", &on),
        Some(bytes as f64),
        "{}",
        exposition.stdout
    );
    assert_eq!(
        value(&found, "gpureap_gpu_held_by_no_process", &on),
        Some(if held { 1.0 } else { 0.0 }),
        "{}",
        exposition.stdout
    );
}

/// What `check` and `free` say about the same GPU; `free`'s exit code and
/// report, for what else a test reads of it.
fn judged_alike_by_check_and_free(
    host: &SimHost,
    gpu: u32,
    bytes: u64,
    held: bool,
) -> (i32, serde_json::Value) {
    let shown = format!("{} MiB", bytes / MIB);
    let label = gpu.to_string();
    let check = run(host, &["check", "--gpu", &label]);
    let named = format!("GPU {gpu}: {shown} held by no process");
    assert_eq!(
        check.stdout.contains(&named),
        held,
        "check: {}{}",
        check.stdout,
        check.stderr
    );

    let free = run(
        host,
        &[
            "free",
            "--gpu",
            &label,
            "--grace",
            "0",
            "--timeout",
            "200ms",
            "--yes",
            "--json",
        ],
    );
    let report = free.json();
    let driver_held: Vec<&serde_json::Value> = gpu_of(&report, gpu)["reasons"]
        .as_array()
        .map(|reasons| {
            reasons
                .iter()
                .filter(|reason| reason["reason"] == "driver_held")
                .collect()
        })
        .unwrap_or_default();
    if held {
        assert_eq!(driver_held.len(), 1, "free: {report:#}");
        assert_eq!(driver_held[0]["bytes"], bytes, "free: {report:#}");
        assert_eq!(free.code, 1, "free: {report:#}");
    } else {
        assert!(driver_held.is_empty(), "free: {report:#}");
    }
    (free.code, report)
}

fn gpu_of(report: &serde_json::Value, index: u32) -> &serde_json::Value {
    report["gpus"]
        .as_array()
        .and_then(|gpus| gpus.iter().find(|gpu| gpu["index"] == index))
        .unwrap_or_else(|| panic!("no GPU {index} in {report:#}"))
}

/// 100 MiB left by no process on GPU 0; a protected holder and 300 MiB held
/// by no process on GPU 1. With no tolerance both are held, and `free` names
/// the 300 MiB next to the protected holder; with a tolerance of 512 MiB
/// neither is, for any of them. `reset` goes by the same rule.
#[test]
fn memory_held_by_no_process_gets_one_figure_and_one_verdict_everywhere() {
    for (tolerance, held) in [(0, true), (512 * MIB, false)] {
        let host = SimHost::new(2, 80 * GIB, "Simulated H200").expect("sim host");
        if tolerance > 0 {
            host.declare_bookkeeping(tolerance).expect("bookkeeping");
        }
        host.leak(0, 100 * MIB).expect("leak");
        host.leak(1, 300 * MIB).expect("leak");
        let mut incident = Incident::new(&host);
        let protected = incident
            .holder(&Holder::new("nvidia-persistenced").on(1, GIB))
            .expect("protected holder");

        judged_alike_by_check_and_free(&host, 0, 100 * MIB, held);
        let (code, report) = judged_alike_by_check_and_free(&host, 1, 300 * MIB, held);
        judged_alike(&host, 0, 100 * MIB, held);
        judged_alike(&host, 1, 300 * MIB, held);
        // The protected holder is named either way, and left alone.
        assert!(
            reasons(&report, 1).contains(&"protected".to_string()),
            "{report:#}"
        );
        assert_eq!(code, 1, "{report:#}");
        assert!(alive(protected));

        // reset: the protected holder has every node open (as CUDA does).
        drop(incident);
        let gone = wait_until(|| !alive(protected));
        assert!(gone, "the protected holder {protected} did not end");
        let reset = run(&host, &["reset", "--gpu", "0"]);
        assert_eq!(reset.code, 0, "{}{}", reset.stdout, reset.stderr);
        let expected = if held {
            "GPU 0: reset; 100 MiB cleared".to_string()
        } else {
            "GPU 0: 100 MiB held by no process, within the driver's bookkeeping; not reset"
                .to_string()
        };
        assert_eq!(reset.stdout.trim_end(), expected, "{}", reset.stderr);
    }
}

/// Polls `ready` until it holds (true) or 10 s pass (false).
fn wait_until(mut ready: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// `free` on a GPU left held by no process gives the advice its hardware
/// evidence implies (an Xid 48 logged for it: a reset), in text and JSON;
/// a GPU it freed gets none.
#[test]
fn free_gives_the_advice_of_the_evidence_for_memory_held_by_no_process() {
    let host = SimHost::new(2, 80 * GIB, "Simulated H200").expect("sim host");
    host.leak(1, 2 * GIB).expect("leak");
    host.xid(1, 48, 2_000_000, "An uncorrectable double bit error (DBE)")
        .expect("xid");
    host.xid(0, 48, 2_000_000, "An uncorrectable double bit error (DBE)")
        .expect("xid");
    let text = run(&host, &["free", "--gpu", "all", "--yes"]);
    assert_eq!(text.code, 1, "{}{}", text.stdout, text.stderr);
    assert!(
        text.stdout.contains(
            "  - Xid 48 at "
        ) && text.stdout.contains(
            "(double-bit (uncorrectable) ECC error): reset the GPU once nothing uses it (gpureap reset --plan --gpu 1), else reboot the node"
        ),
        "{}",
        text.stdout
    );
    let json = run(&host, &["free", "--gpu", "all", "--yes", "--json"]);
    let document: serde_json::Value = serde_json::from_str(&json.stdout).expect("json");
    assert_eq!(document["gpus"][0]["advice"], serde_json::json!([]));
    let advice = document["gpus"][1]["advice"][0]
        .as_str()
        .unwrap_or_default();
    assert!(advice.starts_with("Xid 48 at "), "{advice}");
}
