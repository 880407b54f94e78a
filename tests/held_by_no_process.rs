//! One rule for memory held by no process: every command that judges it
//! gives the same figure and the same verdict, with the tolerance the driver
//! declares (`DIR/bookkeeping` on the simulated driver: 0 without it).
//! `status -H` is in tests/fleet.rs, the Slurm hooks in tests/slurm.rs.

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};

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

    let free = run(host, &free_json(&["--gpu", &label], "0", "200ms"));
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
        let host = Sim::gpus(2).build();
        if tolerance > 0 {
            host.declare_bookkeeping(tolerance).expect("bookkeeping");
        }
        host.leak(0, 100 * MIB).expect("leak");
        host.leak(1, 300 * MIB).expect("leak");
        let mut incident = Incident::new(&host);
        let protected = incident.hold(Holder::new("nvidia-persistenced").on(1, GIB));

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
pub(crate) fn wait_until(mut ready: impl FnMut() -> bool) -> bool {
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
    let host = Sim::gpus(2).build();
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

/// `reset --plan` names every staged blocker of a reset by role, what to do
/// and what `reset` does about it, signals and resets nothing, and says by
/// its exit code whether a reset could run now.
#[test]
fn reset_plan_names_each_blocker_by_role_and_resets_nothing() {
    let (host, mut incident) = Sim::gpus(3).stage();
    let persistenced = incident.hold(Holder::new(
        "/usr/bin/nvidia-persistenced --user nvidia-persistenced",
    ));
    let dcgm = incident.hold(Holder::new("nv-hostengine -n"));
    let xorg = incident.hold(Holder::new("Xorg :0").on(0, 100 * MIB));
    let cuda = incident.hold(Holder::new("python3 serve.py").on(0, 20 * GIB));
    host.leak(0, GIB).expect("leak");
    host.health(0, "persistence_mode on\n").expect("health");
    std::fs::write(
        host.path().join("modules"),
        "nvidia_uvm 1536000 3 - Live 0x0000000000000000\nnvidia_drm 114688 2 - Live 0x0000000000000000\nnvidia 11280384 40 nvidia_uvm,nvidia_drm, Live 0x0000000000000000\next4 1 0 - Live 0x0\n",
    )
    .expect("modules");
    let plan = run(&host, &["reset", "--plan", "--gpu", "0"]);
    assert_eq!(plan.code, 1, "{}{}", plan.stdout, plan.stderr);
    let out = &plan.stdout;
    assert!(
        out.starts_with("GPU 0: a reset cannot run now (read-only: nothing was reset)"),
        "{out}"
    );
    assert!(out.contains("persistence mode: on"), "{out}");
    for expected in [
        format!(
            "blocker pid {persistenced} (nvidia-persistenced, persistence daemon): stop it for the reset (systemctl stop nvidia-persistenced)"
        ),
        format!("blocker pid {dcgm} (nv-hostengine, DCGM): stop DCGM for the reset"),
        format!("blocker pid {xorg} (Xorg, display server): stop the display manager"),
        format!(
            "blocker pid {cuda} (python3, CUDA user): free it first (gpureap free --gpu 0); gpureap reset refuses the reset while it has the GPU's device node open"
        ),
        "blocker nvidia_drm: 2 user(s) of nvidia_drm".to_string(),
        "note: nvidia_uvm: 3 user(s) of nvidia_uvm".to_string(),
    ] {
        assert!(out.contains(&expected), "{expected}\nnot in\n{out}");
    }
    // The same plan for programs: one document, the same blockers and exit.
    let json = run(&host, &["reset", "--plan", "--gpu", "0", "--json"]);
    assert_eq!(json.code, 1, "{}{}", json.stdout, json.stderr);
    let document = json.json();
    assert_eq!(document["kind"], "reset_plan", "{document:#}");
    assert_eq!(document["exit_code"], 1, "{document:#}");
    let plan = &document["plans"][0];
    assert_eq!(plan["index"], 0, "{document:#}");
    assert_eq!(plan["could_reset"], false, "{document:#}");
    assert_eq!(plan["persistence_mode"], true, "{document:#}");
    let blockers = plan["blockers"].as_array().expect("blockers");
    for (pid, role) in [
        (persistenced, "persistence_daemon"),
        (dcgm, "dcgm"),
        (xorg, "display_server"),
        (cuda, "cuda_user"),
    ] {
        assert!(
            blockers
                .iter()
                .any(|b| b["pid"] == pid && b["role"] == role && b["blocks"] == true),
            "pid {pid} as {role} not in {document:#}"
        );
    }
    assert!(
        blockers
            .iter()
            .any(|b| b["kind"] == "module" && b["name"] == "nvidia_uvm" && b["blocks"] == false),
        "{document:#}"
    );
    // Read-only: everything still there.
    for pid in [persistenced, dcgm, xorg, cuda] {
        assert!(alive(pid), "{pid} signalled");
    }
    assert!(host.path().join("leak.0").exists(), "reset");

    // Every CUDA process opens every GPU's node: GPU 2 is blocked by them too.
    let plan = run(&host, &["reset", "--plan", "--gpu", "2"]);
    assert_eq!(plan.code, 1, "{}", plan.stdout);
    assert_contains(
        &plan.stdout,
        &format!("blocker pid {cuda} (python3, CUDA user)"),
    );
    drop(incident);
    for pid in [persistenced, dcgm, xorg, cuda] {
        assert!(wait_until(|| !alive(pid)), "{pid} still there");
    }
    // GPU 2, used by nobody now, but the display holds nvidia_drm: blocked.
    let plan = run(&host, &["reset", "--plan", "--gpu", "2"]);
    assert_eq!(plan.code, 1, "{}", plan.stdout);
    std::fs::write(host.path().join("modules"), "nvidia 1 40 - Live 0x0\n").expect("modules");
    let plan = run(&host, &["reset", "--plan", "--gpu", "2"]);
    assert_eq!(plan.code, 0, "{}{}", plan.stdout, plan.stderr);
    assert!(
        plan.stdout.starts_with("GPU 2: a reset could run now"),
        "{}",
        plan.stdout
    );
    // On NVSwitches, CUDA work on another GPU of the fabric blocks it: a
    // process with only GPU 0's node open (a 1 GiB context there).
    std::fs::write(host.path().join("nvswitch"), "").expect("nvswitch");
    let mut other = std::process::Command::new("bash")
        .current_dir(host.path())
        .args([
            "-c",
            "exec 3<nvidia0 4<nvidiactl; exec -a 'python3 other.py' sleep 1000",
        ])
        .spawn()
        .expect("holder");
    let listed = || {
        run(&host, &["status", "--json"])
            .stdout
            .contains(&format!("\"pid\": {},", other.id()))
    };
    assert!(wait_until(listed), "not listed");
    let plan = run(&host, &["reset", "--plan", "--gpu", "2"]);
    let _ = other.kill();
    let _ = other.wait();
    assert_eq!(plan.code, 1, "{}", plan.stdout);
    assert_contains(
        &plan.stdout,
        "CUDA processes on GPU(s) 0 share the NVLink fabric",
    );
    // A lost GPU: a reboot, not a reset.
    host.lose(1).expect("lose");
    let plan = run(&host, &["reset", "--plan", "--gpu", "1"]);
    assert_eq!(plan.code, 1, "{}", plan.stdout);
    assert_contains(&plan.stdout, "comes back only with a reboot");
}

/// `wait` and `free --dry-run` on a GPU whose memory only the driver holds
/// say at once what `free` and `check` say: held by no process, only a
/// reset or a reboot clears it. `wait` exits 1 within seconds instead of
/// running its timeout to say the holders "are listed above" (there are
/// none); `--keep-waiting` waits the timeout out and names it then. A GPU a
/// process holds is waited for as before.
#[test]
fn wait_and_a_dry_run_say_at_once_that_no_process_holds_the_memory() {
    use std::time::{Duration, Instant};
    let host = Sim::gpus(2).build();
    host.leak(0, 5 * GIB).expect("leak");
    let said =
        "GPU 0: 5.0 GiB held by no process (driver-held); only a GPU reset or a reboot clears it";

    let started = Instant::now();
    let wait = run(&host, &["wait", "--gpu", "0", "--timeout", "60s"]);
    let took = started.elapsed();
    assert_eq!(wait.code, 1, "{}{}", wait.stdout, wait.stderr);
    assert!(took < Duration::from_secs(15), "waited {took:?}");
    assert!(wait.stderr.contains(said), "{}", wait.stderr);
    assert!(wait.stderr.contains("--keep-waiting"), "{}", wait.stderr);
    assert!(!wait.stderr.contains("listed above"), "{}", wait.stderr);
    // What `check` says of the same GPU.
    let check = run(&host, &["check", "--gpu", "0"]);
    assert_eq!(check.code, 1, "{}", check.stdout);
    assert!(
        check
            .stdout
            .starts_with("GPU 0: 5.0 GiB held by no process")
            && check
                .stdout
                .contains("only a GPU reset or a reboot clears it"),
        "{}",
        check.stdout
    );

    let plan = run(&host, &["free", "--gpu", "0", "--dry-run"]);
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    assert_contains(&plan.stdout, "Nothing in scope to signal.");
    assert!(plan.stdout.contains(said), "{}", plan.stdout);
    let json = run(&host, &["free", "--gpu", "0", "--dry-run", "--json"]).json();
    assert_eq!(reasons(&json, 0), ["driver_held"], "{json:#}");

    let started = Instant::now();
    let kept = run(
        &host,
        &["wait", "--gpu", "0", "--timeout", "2s", "--keep-waiting"],
    );
    assert_eq!(kept.code, 1, "{}", kept.stderr);
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_contains(&kept.stderr, said);
    assert_contains(&kept.stderr, "timed out after");
    assert!(!kept.stderr.contains("listed above"), "{}", kept.stderr);

    // A process's memory is waited for, and its holder listed.
    let mut incident = Incident::new(&host);
    let holder = incident.hold(Holder::new("python3 train.py").on(1, 10 * GIB));
    let busy = run(&host, &["wait", "--gpu", "1", "--timeout", "3s"]);
    assert_eq!(busy.code, 1, "{}", busy.stderr);
    assert_contains(&busy.stderr, "timed out after");
    assert_contains(&busy.stderr, "listed above");
    assert!(busy.stdout.contains(&holder.to_string()), "{}", busy.stdout);
    assert!(
        !busy.stderr.contains("held by no process"),
        "{}",
        busy.stderr
    );
}
