//! `gpureap demo`: the facts it reports (from `--json`, and the same facts in
//! its transcript), and that nothing it started outlives it, on Ctrl-C or
//! SIGKILL too. Wording is not checked, save that each note every command
//! repeats is said once, with what it means.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{GIB, alive, gpu, reasons, signals, target_pids};

/// The demo, with its temporary files (the simulated host) under `tmp`, so
/// that its stand-ins can be told from those of demos run elsewhere.
fn demo(tmp: &std::path::Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpureap"));
    command
        .arg("demo")
        .args(args)
        .env_remove("GPUREAP_BACKEND")
        .env("TMPDIR", tmp)
        .stdin(Stdio::null());
    command
}

fn pids(list: &Value) -> BTreeSet<u32> {
    list.as_array()
        .expect("array")
        .iter()
        .map(|pid| pid.as_u64().expect("pid") as u32)
        .collect()
}

fn role<'a>(facts: &'a Value, role: &str) -> Vec<&'a Value> {
    facts["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|process| process["role"] == role)
        .collect()
}

fn pid_of(process: &Value) -> u32 {
    process["pid"].as_u64().expect("pid") as u32
}

/// The stand-ins staged under `tmp` that are alive now: their environment
/// names the simulated host, which is under `tmp`. (PID, start time, cmdline.)
fn stand_ins_under(tmp: &std::path::Path) -> Vec<(u32, u64, String)> {
    let marker = format!("GPUREAP_SIM_STAND_IN={{\"dir\":\"{}", tmp.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let ours = environ
            .split(|&byte| byte == 0)
            .any(|variable| variable.starts_with(marker.as_bytes()));
        if ours && alive(pid) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            found.push((
                pid,
                start_time(pid),
                String::from_utf8_lossy(&cmdline).replace('\0', " "),
            ));
        }
    }
    found
}

fn start_time(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit(')')
                .next()?
                .split_whitespace()
                .nth(19)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Still the same process: alive with the start time it had.
fn still_running(pid: u32, started: u64) -> bool {
    alive(pid) && start_time(pid) == started
}

#[test]
fn the_demo_reports_both_halves_of_the_incident_as_facts() {
    let tmp = tempfile::tempdir().expect("tmp");
    let _leftovers = KillLeftovers(tmp.path());
    let output = demo(tmp.path(), &["--json"]).output().expect("demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let facts: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(facts["kind"], "demo");
    // The documents it embeds are the real ones, as published.
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/json.schema.json"
        ))
        .expect("docs/json.schema.json"),
    )
    .expect("schema");
    let validator = jsonschema::validator_for(&schema).expect("schema");
    for document in ["plan_before", "status_before", "free", "status_after"] {
        let errors: Vec<String> = validator
            .iter_errors(&facts[document])
            .map(|error| error.to_string())
            .collect();
        assert!(errors.is_empty(), "{document}: {errors:?}");
    }
    assert_eq!(facts["as_designed"], true, "{:#}", facts["differences"]);
    let demo_pid = facts["demo_pid"].as_u64().expect("demo pid") as u32;

    // The host: a launcher with a real command line, killed; 8 TP workers, each on its own GPU.
    let launcher = role(&facts, "launcher");
    assert_eq!(launcher.len(), 1);
    let launcher_pid = pid_of(launcher[0]);
    assert_eq!(
        launcher[0]["cmdline"],
        "python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct --tp 8"
    );
    let workers = role(&facts, "worker");
    assert_eq!(workers.len(), 8);
    let worker_pids: BTreeSet<u32> = workers.iter().map(|w| pid_of(w)).collect();
    let status = &facts["status_before"];
    for (rank, worker) in workers.iter().enumerate() {
        // Exactly the title: no stray argument.
        assert_eq!(worker["cmdline"], format!("sglang::scheduler_TP{rank}"));
        // Survived the launcher's SIGKILL, re-parented away, still in its group.
        assert_ne!(worker["ppid"], launcher_pid);
        assert_ne!(worker["ppid"], demo_pid);
        assert_eq!(worker["pgid"], launcher_pid);
        let holder = status["holders"]
            .as_array()
            .expect("holders")
            .iter()
            .find(|holder| holder["pid"] == pid_of(worker))
            .expect("worker is a holder");
        assert!(
            holder["flags"]
                .as_array()
                .expect("flags")
                .contains(&"orphaned".into())
        );
        // Its name as setproctitle sets it: the title cut to the kernel's 15 bytes.
        assert_eq!(holder["comm"], "sglang::schedul");
        // Every node open, memory on its own GPU only.
        let places = holder["gpus"].as_array().expect("gpus");
        assert_eq!(places.len(), 8, "{holder:#}");
        assert!(places.iter().all(|place| place["node_open"] == true));
        let listed: Vec<u64> = places
            .iter()
            .filter(|place| place["listed_by_driver"] == true)
            .map(|place| place["index"].as_u64().expect("index"))
            .collect();
        assert_eq!(listed, [rank as u64]);
    }
    let detokenizer = role(&facts, "detokenizer");
    assert_eq!(detokenizer.len(), 1);
    assert_eq!(detokenizer[0]["cmdline"], "sglang::detokenizer");
    assert_ne!(detokenizer[0]["ppid"], launcher_pid);

    // The bystanders: their own sessions, not the demo's children.
    let notebook = role(&facts, "notebook");
    let exporter = role(&facts, "exporter");
    assert_eq!((notebook.len(), exporter.len()), (1, 1));
    let (notebook, exporter) = (notebook[0], exporter[0]);
    let bystanders: BTreeSet<u32> = [pid_of(notebook), pid_of(exporter)].into();
    for bystander in [notebook, exporter] {
        assert_eq!(bystander["sid"], bystander["pid"], "{bystander:#}");
        assert_ne!(bystander["ppid"], demo_pid);
    }
    assert_eq!(
        notebook["cmdline"],
        "python3 -m ipykernel_launcher -f /home/colleague/.local/share/jupyter/runtime/kernel-7d3e.json"
    );
    assert_eq!(
        exporter["cmdline"],
        "nvidia_gpu_exporter --web.listen-address=:9835"
    );
    assert_eq!(notebook["gpu_memory"], 6 * GIB);

    // The first half: before the restart, the plan for the launcher's own
    // command line on this box. The leftovers cost every rank; once freed it fits.
    let plan = &facts["plan_before"];
    assert_eq!(plan["kind"], "plan");
    assert_eq!(plan["engine"], "sglang");
    assert_eq!(plan["fit"]["verdict"], "fits_after_free", "{plan:#}");
    assert_eq!(plan["exit_code"], 1);
    assert_eq!(plan["device_clean"]["starts"], true);
    let clean_tokens = plan["device_clean"]["tokens_per_rank"]
        .as_u64()
        .expect("tokens");
    let costs: Vec<(u32, u64, Option<u64>)> = plan["fit"]["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|holder| {
            (
                holder["pid"].as_u64().expect("a process") as u32,
                holder["gpu"].as_u64().expect("gpu"),
                holder["tokens_lost_per_rank"].as_u64(),
            )
        })
        .collect();
    // Every worker and the notebook, on its GPU, each costing every rank tokens.
    let mut expected: Vec<(u32, u64)> = workers
        .iter()
        .enumerate()
        .map(|(rank, worker)| (pid_of(worker), rank as u64))
        .chain([(pid_of(notebook), 3)])
        .collect();
    expected.sort_unstable();
    let mut found: Vec<(u32, u64)> = costs.iter().map(|&(pid, gpu, _)| (pid, gpu)).collect();
    found.sort_unstable();
    assert_eq!(found, expected, "{plan:#}");
    for (pid, _, lost) in &costs {
        let lost = lost.unwrap_or_else(|| panic!("pid {pid}: no token cost: {plan:#}"));
        assert!(lost > 0 && lost < clean_tokens, "pid {pid} costs {lost}");
    }

    // Who was signalled: the workers only; TP2 needed SIGKILL.
    let free = &facts["free"];
    assert_eq!(
        target_pids(free).into_iter().collect::<BTreeSet<_>>(),
        worker_pids
    );
    for (rank, worker) in workers.iter().enumerate() {
        let expected: &[&str] = if rank == 2 {
            &["SIGTERM", "SIGSTOP", "SIGKILL"]
        } else {
            &["SIGTERM"]
        };
        assert_eq!(signals(free, pid_of(worker)), expected, "TP{rank}");
        assert_eq!(worker["alive_after_free"], false);
    }
    // Who survived: the bystanders, never signalled, and the detokenizer (no GPU).
    for survivor in [notebook, exporter, detokenizer[0]] {
        assert_eq!(survivor["alive_after_free"], true, "{survivor:#}");
        assert!(signals(free, pid_of(survivor)).is_empty());
    }
    let after = &facts["status_after"];
    let holders_after: BTreeSet<u32> = after["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|holder| holder["pid"].as_u64().expect("pid") as u32)
        .collect();
    assert_eq!(holders_after, bystanders);

    // The second half: GPU 3 keeps 92 GiB that no process holds; the free exits 1.
    assert_eq!(free["exit_code"], 1);
    for index in 0..8 {
        assert_eq!(gpu(free, index)["freed"], index != 3, "GPU {index}");
    }
    assert_eq!(reasons(free, 3), ["driver_held"]);
    assert_eq!(gpu(free, 3)["reasons"][0]["bytes"], 92 * GIB);
    assert_eq!(gpu(after, 3)["memory_used"], 98 * GIB);
    assert_eq!(gpu(after, 3)["memory_unattributed"], 92 * GIB);
    assert_eq!(facts["driver_held"][0]["gpu"], 3);
    assert_eq!(facts["driver_held"][0]["bytes"], 92 * GIB);
    // What the driver says about GPU 3: the staged Xid 48 and pending row
    // remap, read by status and attached to free's result; and what keeps
    // GPU 3 from the reset it needs: the notebook and the exporter.
    assert_eq!(facts["evidence"]["xids_staged"], serde_json::json!([48]));
    let evidence = &gpu(status, 3)["evidence"];
    assert_eq!(evidence["xid_counts"]["48"], 1, "{evidence:#}");
    assert_eq!(evidence["row_remap_pending"], true, "{evidence:#}");
    assert_eq!(evidence["ecc_volatile_uncorrected"], 1, "{evidence:#}");
    let advice: Vec<&str> = gpu(free, 3)["advice"]
        .as_array()
        .expect("advice")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        advice.iter().any(|line| line.starts_with("Xid 48 at "))
            && advice
                .iter()
                .any(|line| line.starts_with("row remap pending")),
        "{advice:?}"
    );
    let reset_plan = &facts["evidence"]["reset_plan"];
    assert!(validator.is_valid(reset_plan), "{reset_plan:#}");
    assert_eq!(reset_plan["exit_code"], 1, "{reset_plan:#}");
    let plan3 = &reset_plan["plans"][0];
    assert_eq!(
        (&plan3["index"], &plan3["could_reset"]),
        (&serde_json::json!(3), &serde_json::json!(false))
    );
    for (bystander, role) in [(notebook, "cuda_user"), (exporter, "monitor")] {
        assert!(
            plan3["blockers"]
                .as_array()
                .expect("blockers")
                .iter()
                .any(|b| b["pid"] == bystander["pid"] && b["role"] == role),
            "{role} {bystander:#} not a blocker in {plan3:#}"
        );
    }

    // The comparison, from the same host: fuser would have killed every
    // process with a node open, bystanders included, then slept 5 s blind.
    let fuser = &facts["comparison"]["fuser"];
    let with_nodes_open: BTreeSet<u32> = status["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .filter(|holder| {
            holder["control_node"] == true
                || holder["gpus"]
                    .as_array()
                    .is_some_and(|gpus| gpus.iter().any(|g| g["node_open"] == true))
        })
        .map(|holder| holder["pid"].as_u64().expect("pid") as u32)
        .collect();
    assert_eq!(pids(&fuser["would_kill"]), with_nodes_open);
    assert_eq!(
        with_nodes_open,
        worker_pids.union(&bystanders).copied().collect()
    );
    assert_eq!(pids(&fuser["bystanders_killed"]), bystanders);
    assert_eq!(fuser["bystander_memory_lost"], 6 * GIB);
    assert_eq!(fuser["blind_wait_ms"], 5000);
    assert_eq!(fuser["driver_held_noticed"], false);
    let ours = &facts["comparison"]["gpureap"];
    assert_eq!(pids(&ours["signalled"]), worker_pids);
    assert!(pids(&ours["bystanders_signalled"]).is_empty());
    assert_eq!(ours["elapsed_ms"], free["elapsed_ms"]);
    assert_eq!(ours["exit_code"], 1);
    let freed: BTreeSet<u64> = ours["freed"]
        .as_array()
        .expect("freed")
        .iter()
        .map(|gpu| gpu["gpu"].as_u64().expect("gpu"))
        .collect();
    assert_eq!(freed, [0, 1, 2, 4, 5, 6, 7].into());
    for entry in ours["freed"].as_array().expect("freed") {
        let index = entry["gpu"].as_u64().expect("gpu") as u32;
        assert_eq!(entry["after_ms"], gpu(free, index)["freed_after_ms"]);
    }
    assert_eq!(ours["driver_held"], facts["driver_held"]);

    // Nothing it started outlives it.
    assert!(stand_ins_under(tmp.path()).is_empty());
    for process in facts["processes"].as_array().expect("processes") {
        let pid = pid_of(process);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !alive(pid)
                || String::from_utf8_lossy(&cmdline).replace('\0', " ") != process["cmdline"],
            "{process:#} still runs"
        );
    }
    assert_eq!(std::fs::read_dir(tmp.path()).expect("tmp").count(), 0);
}

#[test]
fn the_transcript_shows_the_gpu_trees_and_the_free_exit_code() {
    let tmp = tempfile::tempdir().expect("tmp");
    let _leftovers = KillLeftovers(tmp.path());
    let child = demo(tmp.path(), &[])
        .stdout(Stdio::piped())
        .spawn()
        .expect("demo runs");
    let demo_pid = child.id();
    let output = child.wait_with_output().expect("demo ends");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    // Read-only, after the second half: what blocks GPU 3's reset.
    let reset_plan = stdout
        .split("$ gpureap reset --plan --gpu 3\n")
        .nth(1)
        .and_then(|rest| rest.split("\nInstead of").next())
        .expect("a reset --plan section");
    assert!(
        reset_plan.starts_with("GPU 3: a reset cannot run now (read-only: nothing was reset)")
            && reset_plan.contains("(python3, CUDA user): free it first (gpureap free --gpu 3)")
            && reset_plan.contains("(nvidia_gpu_exporter, monitor)")
            && reset_plan.contains("persistence mode: on"),
        "{reset_plan}"
    );
    assert!(
        stdout.contains("GPU 3: Xid 48 at ")
            && stdout.contains("GPU 3: row remap pending: reset the GPU"),
        "{stdout}"
    );
    // The tree holds the GPU users' trees only: not the demo, nor what started it.
    let tree = stdout
        .split("$ gpureap status --tree")
        .nth(1)
        .and_then(|rest| rest.split("$ gpureap plan").next())
        .expect("a status --tree section");
    // Then the restart's plan, before the free: the launcher's own command
    // line, every leftover named with its PID.
    let plan = stdout
        .split("$ gpureap plan -- python3 -m sglang.launch_server")
        .nth(1)
        .and_then(|rest| rest.split("$ gpureap free").next())
        .expect("a plan section before the free");
    let tree_pids: BTreeSet<u32> = tree
        .lines()
        .filter_map(|line| {
            // A process line: PID [STATE] COMMAND ...
            let mut words = line
                .trim_start_matches([' ', '│', '├', '└', '─'])
                .split(' ');
            let pid = words.next()?.parse().ok()?;
            words.next()?.starts_with('[').then_some(pid)
        })
        .collect();
    assert_eq!(
        tree_pids.len(),
        10,
        "8 workers, the notebook, the exporter:\n{tree}"
    );
    assert!(!tree_pids.contains(&demo_pid), "{tree}");
    let plan_pids: BTreeSet<u32> = plan
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .filter(|pid| tree_pids.contains(pid))
        .collect();
    assert_eq!(
        plan_pids.len(),
        9,
        "8 workers and the notebook, each with its cost:\n{plan}"
    );
    // The demo's parent is this test; nor are its ancestors there.
    let mut ancestor = std::process::id();
    while ancestor > 1 {
        assert!(
            !tree_pids.contains(&ancestor),
            "ancestor {ancestor} in:\n{tree}"
        );
        ancestor = crate::harness::ppid(ancestor).unwrap_or(1);
    }
    // The free's table: every signalled process is a worker, TP2 signalled three times.
    let (free, after) = stdout
        .split("$ gpureap free")
        .nth(1)
        .and_then(|rest| rest.split_once("$ echo $?"))
        .expect("a free section, then its exit code");
    let signalled: Vec<(u32, String, String)> = free
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let pid = words.next()?.parse().ok()?;
            let signals = words.next()?.to_string();
            Some((pid, signals, words.last()?.to_string()))
        })
        .collect();
    assert_eq!(signalled.len(), 8, "{free}");
    for (_, signals, command) in &signalled {
        assert!(command.starts_with("sglang::scheduler_TP"), "{command}");
        let expected = if command == "sglang::scheduler_TP2" {
            "SIGTERM,SIGSTOP,SIGKILL"
        } else {
            "SIGTERM"
        };
        assert_eq!(signals, expected);
    }
    // The exit code a user gets from that free.
    let code = after.split_whitespace().next().expect("echo $?");
    assert_eq!(code, "1");
    assert!(stand_ins_under(tmp.path()).is_empty());
}

/// GPU 3's evidence (Xid 48, the pending row remap) and a partial scan (a
/// sandbox's PID 1 that root may not read, as on the machines these tests
/// run on) are notes every command repeats: the transcript shows each once,
/// followed by what it means. (Before: the partial scan five times,
/// unexplained, and the Xid 48 line three times.)
#[test]
fn the_transcript_says_each_repeated_note_once_and_explains_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let _leftovers = KillLeftovers(tmp.path());
    let output = demo(tmp.path(), &[])
        .stdout(Stdio::piped())
        .output()
        .expect("demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    for note in ["Xid 48 at ", "row remap pending"] {
        assert_eq!(stdout.matches(note).count(), 1, "{note:?} in:\n{stdout}");
    }
    let explained = stdout
        .split_once("GPU 3: Xid 48 at ")
        .map(|(_, after)| after)
        .expect("the Xid 48 note");
    assert!(
        explained.contains("GPU 3's lines are what the driver says happened there"),
        "{stdout}"
    );
    let partial = stdout.matches("Partial scan").count();
    assert!(partial <= 1, "{stdout}");
    if partial == 1 {
        let after = stdout
            .split_once("Partial scan")
            .map(|(_, after)| after)
            .expect("the note");
        assert!(
            after.contains("The partial scan is this machine's: gpureap could not read pid")
                && after.contains("nothing\nhere is missed"),
            "{stdout}"
        );
    }
    assert!(stand_ins_under(tmp.path()).is_empty());
}

/// Kills, when a test ends, whatever stand-in it staged under its `tmp`
/// that is still running (only after a failure: the tests check there are none).
struct KillLeftovers<'a>(&'a std::path::Path);

impl Drop for KillLeftovers<'_> {
    fn drop(&mut self) {
        for (pid, started, _) in stand_ins_under(self.0) {
            if still_running(pid, started) {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(pid as i32).expect("pid"),
                    rustix::process::Signal::KILL,
                );
            }
        }
    }
}

/// Starts the demo and returns once its free is under way (its stand-ins
/// all staged, the grace not over), with the stand-ins it staged.
fn demo_mid_free(tmp: &std::path::Path) -> (Child, Vec<(u32, u64, String)>) {
    let mut child = demo(tmp, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("demo runs");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut read_until = |prefix: &str| loop {
        let line = lines.next().expect("the demo gets there").expect("a line");
        if line.starts_with(prefix) {
            break;
        }
    };
    // Everything is staged before the status is shown, and nothing signalled yet.
    read_until("$ gpureap status --tree");
    let staged = stand_ins_under(tmp);
    // 8 workers, the detokenizer, the notebook, the exporter.
    assert_eq!(staged.len(), 11, "{staged:#?}");
    read_until("$ gpureap free");
    // Keep reading, so that the demo never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, staged)
}

#[test]
fn ctrl_c_mid_free_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().expect("tmp");
    let _leftovers = KillLeftovers(tmp.path());
    let (mut child, staged) = demo_mid_free(tmp.path());
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).expect("pid"),
        rustix::process::Signal::INT,
    )
    .expect("SIGINT");
    let status = child.wait().expect("demo ends");
    assert_eq!(status.code(), Some(130));
    // Gone by the time the demo has exited: it killed them before exiting.
    for (pid, started, cmdline) in &staged {
        assert!(!still_running(*pid, *started), "{pid} {cmdline} survived");
    }
    assert!(stand_ins_under(tmp.path()).is_empty());
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("tmp")
        .filter_map(|entry| entry.ok().map(|entry| entry.file_name()))
        .collect();
    assert!(left.is_empty(), "the simulated host is removed: {left:?}");
}

#[test]
fn a_sigkilled_demo_leaves_nothing_running() {
    let tmp = tempfile::tempdir().expect("tmp");
    let _leftovers = KillLeftovers(tmp.path());
    let (mut child, staged) = demo_mid_free(tmp.path());
    child.kill().expect("SIGKILL");
    child.wait().expect("demo ends");
    // No cleanup code ran: the stand-ins end by themselves when their
    // lifeline (a pipe only the demo wrote to) closes.
    let deadline = Instant::now() + Duration::from_secs(20);
    while staged
        .iter()
        .any(|(pid, started, _)| still_running(*pid, *started))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (pid, started, cmdline) in &staged {
        assert!(!still_running(*pid, *started), "{pid} {cmdline} survived");
    }
}

/// The containers act: a running container named from the staged docker
/// state, a removed one's engine flagged "container gone" by that same
/// reading and freed by `free --container`, the running one untouched, and
/// no cgroup left. Where no cgroup can be made, one line says why.
#[test]
fn the_demo_names_a_container_frees_a_removed_ones_leftover_and_leaves_no_cgroup() {
    let tmp = tempfile::tempdir().expect("tmp");
    let _leftovers = KillLeftovers(tmp.path());
    let output = demo(tmp.path(), &["--json"]).output().expect("demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    let facts: Value = serde_json::from_str(&stdout).expect("JSON");
    let act = &facts["containers"];
    if let Some(why) = act["skipped"].as_str() {
        return crate::harness::skip(&format!("the demo could not make cgroups: {why}"));
    }
    assert_eq!(act["running_name"], "vllm-llama", "{act:#}");
    assert_eq!(act["gone_source"], "/var/lib/docker/containers", "{act:#}");
    let free = &act["free"];
    crate::schema::conforms(
        &crate::schema::schema(),
        "the demo's free --container",
        free,
    );
    let removed = act["removed_pid"].as_u64().expect("removed pid") as u32;
    assert_eq!(target_pids(free), [removed]);
    assert_eq!(free["targets"][0]["because"], "member");
    assert_eq!(gpu(free, 6)["freed"], true, "{free:#}");
    assert_eq!(act["removed_alive_after"], false);
    assert_eq!(act["running_alive_after"], true);
    let demo_pid = facts["demo_pid"].as_u64().expect("demo pid");
    let mount = gpureap_services::supervision::cgroup2_mount().expect("a cgroup v2 mount");
    // In its own cgroup, which it shares with this test.
    let own = std::fs::read_to_string("/proc/self/cgroup").expect("cgroup");
    let own = own
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .expect("a v2 line");
    let root = mount
        .join(own.trim_start_matches('/'))
        .join(format!("gpureap-demo-{demo_pid}"));
    let cgroup = &free["cgroup_scopes"][0]["cgroups"][0];
    assert!(
        cgroup
            .as_str()
            .is_some_and(|path| path.contains(&format!("/gpureap-demo-{demo_pid}/"))),
        "{free:#}"
    );
    assert!(!root.exists(), "the demo left its cgroups");

    // Without a writable cgroup mount (a read-only one in a mount namespace
    // of its own): one line, and the rest of the demo as designed.
    let script = format!(
        "mount -o remount,ro,bind {} && exec \"$0\" demo",
        mount.display()
    );
    let skipped = Command::new("unshare")
        .args([
            "--mount",
            "sh",
            "-c",
            &script,
            env!("CARGO_BIN_EXE_gpureap"),
        ])
        .env_remove("GPUREAP_BACKEND")
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::null())
        .output()
        .expect("unshare runs");
    let text = String::from_utf8_lossy(&skipped.stdout);
    assert_eq!(skipped.status.code(), Some(0), "{text}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("Containers"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(
        lines[0].contains("skipped") && lines[0].contains("Read-only"),
        "{text}"
    );
}
