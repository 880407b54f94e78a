//! The flat look (docs/performance.md, "Seeing"): on a driver that finds
//! its processes through their claims, as NVML finds its contexts
//! (`SimHost::claims_only`), `status` and `plan` read /proc only for the
//! processes the driver lists and their families where its lists explain
//! every GPU's memory, whatever else runs on the host; every process's
//! descriptors where they do not, and with `--monitors`, so that a holder
//! the driver does not list is still found.

use gpureap_core::driver::sim::incident::{Holder, SimHost};
use serde_json::Value;

use crate::harness::*;
use crate::held_by_no_process::wait_until;

/// Idle processes that are no business of gpureap's, ended when dropped.
struct Crowd(Vec<std::process::Child>);

impl Crowd {
    fn new(count: usize) -> Crowd {
        Crowd(
            (0..count)
                .map(|_| {
                    std::process::Command::new("sleep")
                        .arg("1000")
                        .spawn()
                        .expect("sleep")
                })
                .collect(),
        )
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A process with GPU `gpu`'s node open and no claim file: no context,
/// so a driver that lists its contexts does not list it. Ended when dropped.
fn node_only(host: &SimHost, gpu: u32) -> Crowd {
    Crowd(vec![
        std::process::Command::new("bash")
            .current_dir(host.path())
            .args([
                "-c",
                &format!("exec 3<nvidia{gpu}; exec -a 'python3 bare.py' sleep 1000"),
            ])
            .spawn()
            .expect("node holder"),
    ])
}

fn holder_pids(status: &Value) -> Vec<u64> {
    let mut pids: Vec<u64> = status["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|holder| holder["pid"].as_u64().expect("pid"))
        .collect();
    pids.sort_unstable();
    pids
}

/// The processes the snapshot read, from `GPUREAP_LOG=debug`'s
/// `snapshot processes=N` line.
fn processes_read(stderr: &str) -> usize {
    let plain: String = stderr
        .split('\x1b')
        .map(|part| {
            part.strip_prefix('[')
                .map_or(part, |p| p.split_once('m').map_or(p, |(_, rest)| rest))
        })
        .collect();
    let line = plain
        .lines()
        .find(|line| line.contains(" snapshot ") && line.contains("processes="))
        .unwrap_or_else(|| panic!("no snapshot line:\n{stderr}"));
    line.split_once("processes=")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("{line}"))
}

/// An orphaned SGLang-like server (its launcher SIGKILLed), 30 GiB on each
/// of two GPUs, a process with GPU 0's node open and no context, and 300
/// idle processes: the driver lists the two workers, whose memory explains
/// every byte, so `status` reads them and their families only, and still
/// tells they are orphaned; the process with no context is not listed
/// (found through the claims, the driver does not look at it), and
/// `--monitors` finds it by reading every process.
#[test]
fn where_the_lists_explain_the_memory_only_the_listed_and_their_families_are_read() {
    let (host, mut incident) = Sim::gpus(2).claims_only().stage();
    let (launcher, workers) =
        incident.sglang_tree([scheduler(0, 30 * GIB), scheduler(1, 30 * GIB)]);
    incident.kill(launcher).expect("launcher killed");
    let bare = node_only(&host, 0);
    let _crowd = Crowd::new(300);
    let bare_open = || {
        std::fs::read_link(format!("/proc/{}/fd/3", bare.0[0].id()))
            .is_ok_and(|target| target.ends_with("nvidia0"))
    };
    assert!(wait_until(bare_open), "the node is never opened");

    let look: Run = gpureap(&host)
        .env("GPUREAP_LOG", "gpureap=debug")
        .args(["status", "--json"])
        .output()
        .expect("status runs")
        .into();
    assert_eq!(look.code, 0, "{}", look.stderr);
    let status = look.json();
    assert_eq!(status["scan"]["descriptors"], "listed", "{status:#}");
    let mut expected: Vec<u64> = workers.iter().map(|&pid| u64::from(pid)).collect();
    expected.sort_unstable();
    assert_eq!(holder_pids(&status), expected, "{status:#}");
    assert_eq!(status["gpus"][0]["memory_used"], 30 * GIB, "{status:#}");
    for holder in status["holders"].as_array().expect("holders") {
        assert!(holder["flags"].to_string().contains("orphan"), "{holder:#}");
    }
    let read = processes_read(&look.stderr);
    assert!(read < 300, "{read} processes read for two listed ones");
    assert_eq!(status["scan"]["processes"], read, "{status:#}");

    let everything = run(&host, &["status", "--json", "--monitors"]).json();
    assert_eq!(everything["scan"]["descriptors"], "all", "{everything:#}");
    assert!(
        holder_pids(&everything).contains(&u64::from(bare.0[0].id())),
        "{everything:#}"
    );
}

/// Memory on GPU 1 that no listed process explains, and a process with
/// GPU 1's node open that the driver does not list (no context: its memory
/// is not its to report): `status` reads every process's descriptors by
/// itself and finds it.
#[test]
fn memory_the_lists_do_not_explain_is_looked_for_in_every_process() {
    let (host, mut incident) = Sim::gpus(2).claims_only().stage();
    let worker = incident.hold(scheduler(0, 30 * GIB));
    let bare = node_only(&host, 1);
    let bare_open = || {
        std::fs::read_link(format!("/proc/{}/fd/3", bare.0[0].id()))
            .is_ok_and(|target| target.ends_with("nvidia1"))
    };
    assert!(wait_until(bare_open), "the node is never opened");
    host.leak(1, 2 * GIB).expect("leak");

    let status = run(&host, &["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status = status.json();
    assert_eq!(status["scan"]["descriptors"], "all", "{status:#}");
    let mut expected = vec![u64::from(worker), u64::from(bare.0[0].id())];
    expected.sort_unstable();
    assert_eq!(holder_pids(&status), expected, "{status:#}");
    let found = status["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|holder| holder["pid"] == bare.0[0].id())
        .expect("found");
    assert!(
        found["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .all(|gpu| gpu["listed_by_driver"] == false),
        "{status:#}"
    );
}

/// `plan` on a live host weighs what the driver lists: with 300 idle
/// processes beside one worker it reads the worker and its family, and
/// names it.
#[test]
fn plan_on_a_live_host_reads_the_listed_and_their_families_only() {
    let (host, mut incident) = Sim::gpus(2).named("Simulated H100").claims_only().stage();
    incident.hold(Holder::new("python3 -m ipykernel_launcher").on(1, 6 * GIB));
    let _crowd = Crowd::new(300);
    let model = tempfile::tempdir().expect("model dir");
    std::fs::write(model.path().join("config.json"), crate::plan::LLAMA_8B).expect("config.json");
    let planned: Run = gpureap(&host)
        .env("GPUREAP_LOG", "gpureap=debug")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .args([
            "plan",
            "--weights",
            "8GiB",
            "--",
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            &model.path().display().to_string(),
            "--tp",
            "2",
        ])
        .output()
        .expect("plan runs")
        .into();
    assert!(
        planned.stdout.contains("ipykernel_launcher"),
        "{}{}",
        planned.stdout,
        planned.stderr
    );
    let read = processes_read(&planned.stderr);
    assert!(read < 300, "{read} processes read for one listed");
}
