//! The incidents users live, staged with real processes on the simulated
//! driver. Each test asserts exactly who was signalled, who survived, and the
//! outcome per GPU.

use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, Incident, LAUNCHER, SimHost};

use crate::harness::*;

#[test]
fn sglang_orphans_are_freed_and_only_they_are_signalled() {
    let (host, mut incident) = Sim::gpus(3).stage();
    let (launcher, workers) = incident.sglang_tree([
        scheduler(0, 70 * GIB),
        scheduler(1, 70 * GIB).ignoring_sigterm(),
        scheduler(2, 70 * GIB),
    ]);
    let detokenizer = incident.pid_of("sglang::detokenizer").expect("detokenizer");
    let notebook = incident.hold(Holder::new("jupyter-kernel colleague").on(2, 5 * GIB));
    let monitor = incident.hold(Holder::new("gpu_exporter --port 9400"));
    incident.orphan(launcher, &workers);

    // --monitors: the monitor is shown although the lists explain every byte.
    let status = run(&host, &["status", "--json", "--monitors"]).json();
    let holder = |pid: u32| holder_of(&status, pid);
    assert_eq!(holder(workers[0])["flags"], serde_json::json!(["orphaned"]));
    assert_eq!(holder(monitor)["flags"], serde_json::json!(["monitor"]));
    assert_eq!(holder(notebook)["flags"], serde_json::json!([]));
    // Like CUDA, each worker has every GPU's node open; the driver lists it on its own GPU only.
    assert_eq!(
        holder(workers[1])["gpus"],
        serde_json::json!([
            {"index": 0, "memory": null, "listed_by_driver": false, "node_open": true, "mig_instances": [], "sm_utilization_percent": null},
            {"index": 1, "memory": 70 * GIB, "listed_by_driver": true, "node_open": true, "mig_instances": [], "sm_utilization_percent": null},
            {"index": 2, "memory": null, "listed_by_driver": false, "node_open": true, "mig_instances": [], "sm_utilization_percent": null},
        ])
    );

    let result = run(
        &host,
        &["free", "--orphans", "--grace", "500ms", "--yes", "--json"],
    );
    let report = result.json();
    assert_eq!(result.code, 0, "{}", result.stdout);
    let mut expected = workers.to_vec();
    expected.sort_unstable();
    assert_eq!(target_pids(&report), expected);
    assert_eq!(signals(&report, workers[0]), ["SIGTERM"]);
    assert_eq!(
        signals(&report, workers[1]),
        ["SIGTERM", "SIGSTOP", "SIGKILL"]
    );
    assert_eq!(signals(&report, workers[2]), ["SIGTERM"]);
    for pid in workers {
        assert!(!alive(pid), "worker {pid} survived");
    }
    for (pid, who) in [
        (notebook, "notebook"),
        (monitor, "monitor"),
        (detokenizer, "detokenizer"),
    ] {
        assert!(alive(pid), "the {who} was killed");
    }
    for index in 0..3 {
        assert_eq!(gpu(&report, index)["freed"], true, "{report:#}");
        assert!(reasons(&report, index).is_empty());
    }
    assert_eq!(gpu(&report, 0)["freed_bytes"], 70 * GIB);
    assert_eq!(
        gpu(&report, 2)["memory_after"],
        5 * GIB,
        "the notebook's memory stays"
    );
}

#[test]
fn match_scope_frees_the_server_and_tells_a_human_what_happened() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let launcher = incident
        .sglang(&[scheduler(0, 40 * GIB), scheduler(1, 40 * GIB)])
        .expect("sglang tree");
    let other = incident.hold(Holder::new("python3 train.py").on(1, 8 * GIB));

    let result = run(
        &host,
        &[
            "free",
            "--match",
            "sglang::scheduler",
            "--grace",
            "1s",
            "--yes",
        ],
    );
    assert_eq!(result.code, 0, "{}{}", result.stdout, result.stderr);
    assert_contains(&result.stdout, "GPU 0: freed 40.0 GiB");
    assert_contains(&result.stdout, "GPU 1: freed 40.0 GiB");
    assert_contains(&result.stdout, "(8.0 GiB used now)");
    assert!(
        alive(launcher),
        "the launcher holds no GPU and did not match"
    );
    assert!(alive(other));
}

#[test]
fn a_setsid_grandchild_holding_a_gpu_is_found_and_killed() {
    let (host, mut incident) = Sim::gpus(2).stage();
    // A worker whose child double-forks and calls setsid: it leaves the
    // worker's session and process group, and its parent is PID 1.
    let escapee = Holder::new("sglang::escapee").on(1, 20 * GIB);
    let script = format!(
        "( ( exec setsid bash -c {escapee} ) & ); {worker}",
        escapee = shell_quote(&escapee.script()),
        worker = scheduler(0, 30 * GIB).script()
    );
    incident.spawn(&script, 2).expect("staged");
    let worker = incident.pid_of("sglang::scheduler_TP0").expect("worker");
    let grandchild = incident.pid_of("sglang::escapee").expect("escapee");
    let session = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        stat.rsplit(')')
            .next()
            .expect("fields")
            .split_whitespace()
            .nth(3)
            .map(str::to_string)
    };
    assert_ne!(
        session(worker),
        session(grandchild),
        "the grandchild has its own session"
    );

    let report = run(
        &host,
        &[
            "free", "--gpu", "0,1", "--grace", "300ms", "--yes", "--json",
        ],
    )
    .json();
    assert_eq!(target_pids(&report), {
        let mut pids = vec![worker, grandchild];
        pids.sort_unstable();
        pids
    });
    assert!(!alive(grandchild) && !alive(worker));
    assert_eq!(gpu(&report, 1)["freed"], true);
    assert_eq!(report["exit_code"], 0);
}

#[test]
fn a_zombie_child_is_shown_and_not_waited_for() {
    let (host, mut incident) = Sim::gpus(1).stage();
    // A hung parent holding GPU 0 whose child exited and is never reaped.
    let script = format!(
        "( echo \"$BASHPID -\" >> \"$D/pids\"; sleep 0.3; exit 0 ) & {}",
        Holder::new("sglang::hung_parent").on(0, 10 * GIB).script()
    );
    incident.spawn(&script, 2).expect("staged");
    let parent = incident.pid_of("sglang::hung_parent").expect("parent");
    let zombie = incident.pid_of("-").expect("zombie");
    assert!(!alive(zombie), "the child should be a zombie by now");

    let tree = run(&host, &["status", "--tree"]);
    let zombie_line = tree
        .stdout
        .lines()
        .find(|line| line.contains(&format!("{zombie} [Z]")))
        .unwrap_or_else(|| panic!("zombie not shown in the tree:\n{}", tree.stdout));
    assert!(zombie_line.contains("zombie"), "{zombie_line}");

    let report = run(
        &host,
        &["free", "--gpu", "0", "--grace", "300ms", "--yes", "--json"],
    )
    .json();
    assert_eq!(signals(&report, parent), ["SIGTERM"]);
    assert_eq!(
        signals(&report, zombie),
        Vec::<String>::new(),
        "nothing to signal in a zombie"
    );
    assert_eq!(
        target(&report, zombie).expect("zombie is a target")["fate"],
        "zombie"
    );
    assert_eq!(gpu(&report, 0)["freed"], true);
    assert_eq!(report["exit_code"], 0);
}

/// A parent that ignores SIGTERM and restarts its worker whenever it dies.
fn respawner(incident: &mut Incident) -> u32 {
    let worker = scheduler(0, 30 * GIB).script();
    let script = format!(
        "trap '' TERM; echo \"$$ bash\" >> \"$D/pids\"; while :; do ( {worker} ) & wait; done"
    );
    incident.spawn(&script, 2).expect("staged")
}

#[test]
fn a_respawning_parent_out_of_scope_is_named() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let parent = respawner(&mut incident);
    let first = incident.pid_of("sglang::scheduler_TP0").expect("worker");

    let result = run(&host, &free_json(&["--gpu", "0"], "200ms", "1s"));
    let report = result.json();
    assert_eq!(result.code, 1, "{report:#}");
    assert!(!alive(first));
    assert!(alive(parent), "the parent was out of scope");
    let respawned = gpu(&report, 0)["reasons"]
        .as_array()
        .expect("reasons")
        .iter()
        .find(|reason| reason["reason"] == "respawned")
        .unwrap_or_else(|| panic!("no respawn reason: {report:#}"))
        .clone();
    assert_eq!(respawned["parent_pid"], parent);
    assert!(respawned["times"].as_u64().expect("times") >= 1);
    // The verdict comes from a look after the last signal: a worker killed
    // in the last round is not reported alive.
    for reason in gpu(&report, 0)["reasons"].as_array().expect("reasons") {
        if reason["reason"] == "still_alive" {
            let pid = reason["pid"].as_u64().expect("pid") as u32;
            assert!(
                alive(pid),
                "pid {pid} is reported alive but is gone: {report:#}"
            );
        }
    }
    assert!(
        report["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .any(|t| t["late"] == true),
        "respawned workers are found by the re-scan"
    );
}

#[test]
fn naming_the_respawning_parent_stops_it_before_killing() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let parent = respawner(&mut incident);
    let first = incident.pid_of("sglang::scheduler_TP0").expect("worker");

    let result = run(
        &host,
        &[
            "free",
            "--pid",
            &parent.to_string(),
            "--grace",
            "300ms",
            "--yes",
            "--json",
        ],
    );
    let report = result.json();
    assert_eq!(result.code, 0, "{report:#}");
    assert_eq!(signals(&report, parent), ["SIGTERM", "SIGSTOP", "SIGKILL"]);
    assert_eq!(target(&report, parent).expect("parent")["because"], "named");
    assert!(signals(&report, first).contains(&"SIGTERM".to_string()));
    assert!(!alive(parent) && !alive(first));
    assert_eq!(gpu(&report, 0)["freed"], true);
    assert_eq!(gpu(&report, 0)["memory_after"], 0);
}

#[test]
fn a_monitor_survives_all_unless_named() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let user = incident.hold(Holder::new("python3 serve.py").on(0, 4 * GIB));
    let monitor = incident.hold(Holder::new("gpu_exporter"));

    let report = run(
        &host,
        &["free", "--all", "--grace", "300ms", "--yes", "--json"],
    )
    .json();
    assert_eq!(target_pids(&report), [user]);
    assert_eq!(spared(&report, monitor).as_deref(), Some("monitor"));
    assert!(alive(monitor) && !alive(user));
    assert_eq!(report["exit_code"], 0);

    let report = run(
        &host,
        &[
            "free",
            "--pid",
            &monitor.to_string(),
            "--grace",
            "300ms",
            "--yes",
            "--json",
        ],
    )
    .json();
    assert_eq!(signals(&report, monitor), ["SIGTERM"]);
    assert!(!alive(monitor));
}

#[test]
fn a_protected_name_is_never_signalled() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let daemon = incident.hold(Holder::new("nv-hostengine -n").on(0, GIB));
    let custom = incident.hold(Holder::new("my-dcgm-sidecar").on(0, GIB));

    let result = run(
        &host,
        &[
            "free",
            "--gpu",
            "0",
            "--protect",
            "my-dcgm-sidecar",
            "--grace",
            "200ms",
            "--timeout",
            "500ms",
            "--yes",
            "--json",
        ],
    );
    let report = result.json();
    assert_eq!(result.code, 1);
    assert!(target_pids(&report).is_empty());
    assert_eq!(spared(&report, daemon).as_deref(), Some("protected"));
    assert_eq!(spared(&report, custom).as_deref(), Some("protected"));
    assert!(alive(daemon) && alive(custom));
    assert_eq!(reasons(&report, 0), ["protected", "protected"]);
}

/// A process whose argv[0] is `nvidia-smi` holding 70 GiB is spared by a
/// scope, shown as protected by `status`, and freed when named with --pid.
#[test]
fn naming_a_protected_process_with_pid_frees_it() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let impostor = incident.hold(Holder::new("nvidia-smi").on(0, 70 * GIB));

    let status = run(&host, &["status", "--json"]).json();
    let holder = status["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|holder| holder["pid"] == impostor)
        .expect("listed")
        .clone();
    assert_eq!(holder["protected"], "nvidia-smi");
    assert!(
        holder["flags"]
            .as_array()
            .expect("flags")
            .contains(&"protected".into()),
        "{holder:#}"
    );
    let table = run(&host, &["status"]).stdout;
    assert!(
        table.contains(&format!("Protected by name: {impostor} (nvidia-smi)")),
        "{table}"
    );

    let scoped = run(&host, &free_json(&["--gpu", "0"], "0", "200ms"));
    assert_eq!(scoped.code, 1, "{}", scoped.stdout);
    assert_eq!(
        spared(&scoped.json(), impostor).as_deref(),
        Some("protected")
    );
    assert!(alive(impostor));

    let named = run(
        &host,
        &[
            "free",
            "--pid",
            &impostor.to_string(),
            "--grace",
            "200ms",
            "--yes",
            "--json",
        ],
    );
    assert_eq!(named.code, 0, "{}{}", named.stdout, named.stderr);
    let report = named.json();
    assert_eq!(target_pids(&report), [impostor]);
    assert_eq!(gpu(&report, 0)["freed"], true);
    assert!(!alive(impostor));
}

#[test]
fn gpureap_never_signals_its_own_ancestors() {
    let host = Sim::gpus(1).build();
    let _incident = Incident::new(&host);
    // The shell that runs gpureap holds GPU 0 itself, and so does gpureap
    // (it inherits the descriptor): both are in scope, neither is signalled.
    let script = "exec 3<\"$D/nvidia0\"; \"$GPUREAP\" --backend \"sim:$D\" free --gpu 0 --match bash --grace 200ms --timeout 500ms --yes --json; echo \"exit=$?\"; echo survived >&2";
    let output = std::process::Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("D", host.path())
        .env("GPUREAP", env!("CARGO_BIN_EXE_gpureap"))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("survived"),
        "the calling shell was killed: {stderr}"
    );
    let (json, tail) = stdout.rsplit_once("exit=").expect("exit code printed");
    assert_eq!(tail.trim(), "1");
    let report: serde_json::Value = serde_json::from_str(json).expect("json");
    assert!(target_pids(&report).is_empty(), "{report:#}");
    let reasons: Vec<&str> = gpu(&report, 0)["reasons"]
        .as_array()
        .expect("reasons")
        .iter()
        .map(|reason| reason["why"].as_str().unwrap_or(""))
        .collect();
    assert!(
        reasons.iter().any(|why| why.contains("ancestor")),
        "{reasons:?}"
    );
}

#[test]
fn memory_held_by_no_process_is_named_driver_held() {
    let (host, mut incident) = Sim::gpus(2).stage();
    host.leak(1, 5 * GIB).expect("leak");
    let holder = incident.hold(scheduler(1, 60 * GIB));

    let result = run(&host, &free_json(&["--gpu", "1"], "200ms", "500ms"));
    let report = result.json();
    assert_eq!(result.code, 1);
    assert!(!alive(holder));
    assert_eq!(reasons(&report, 1), ["driver_held"]);
    assert_eq!(gpu(&report, 1)["reasons"][0]["bytes"], 5 * GIB);
    assert_eq!(gpu(&report, 1)["memory_after"], 5 * GIB);

    let text = run(
        &host,
        &[
            "free",
            "--gpu",
            "1",
            "--grace",
            "0",
            "--timeout",
            "200ms",
            "--yes",
        ],
    );
    assert_eq!(text.code, 1);
    assert_contains(&text.stdout, "5.0 GiB held by no process (driver-held)");
}

#[test]
fn a_gpu_lost_mid_run_is_reported_without_a_panic() {
    let (host, mut incident) = Sim::gpus(1).stage();
    // The holder is the only process holding GPU 0, and it answers SIGTERM
    // at once, in itself: blocked in a read builtin (on a FIFO it holds both
    // ends of), the trap runs as the signal arrives and writes `got_term`
    // with a builtin. A helper it forked for that (`touch`) or a foreground
    // `sleep` with the node open would be targets of their own, SIGTERMed by
    // gpureap before they did anything, and the file would never come.
    let script = "exec 3<\"$D/nvidia0\"; trap ': > \"$D/got_term\"' TERM; \
        mkfifo \"$D/never\" 3<&-; exec 4<>\"$D/never\"; echo \"$$ bash\" >> \"$D/pids\"; \
        while :; do read -r -u 4 _; done";
    let holder = incident.spawn(script, 1).expect("staged");
    let child = gpureap(&host)
        .args([
            "free",
            "--gpu",
            "0",
            "--grace",
            "1s",
            "--timeout",
            "1500ms",
            "--yes",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gpureap runs");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !host.path().join("got_term").exists() {
        if Instant::now() >= deadline {
            let mut child = child;
            let _ = child.kill();
            let result: Run = child.wait_with_output().expect("gpureap ends").into();
            panic!(
                "SIGTERM never arrived\nstdout:\n{}\nstderr:\n{}",
                result.stdout, result.stderr
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    host.lose(0).expect("lose GPU 0");
    let result: Run = child.wait_with_output().expect("gpureap ends").into();
    // The memory cannot be verified: the command could not complete.
    assert_eq!(result.code, 3, "{}", result.stderr);
    assert!(!result.stderr.contains("panicked"), "{}", result.stderr);
    let report = result.json();
    assert_eq!(reasons(&report, 0), ["driver_error"]);
    assert!(
        gpu(&report, 0)["reasons"][0]["message"]
            .as_str()
            .expect("message")
            .contains("lost"),
        "{report:#}"
    );
    assert_eq!(signals(&report, holder), ["SIGTERM", "SIGSTOP", "SIGKILL"]);
    assert_eq!(target_pids(&report), [holder], "{report:#}");
    assert!(!alive(holder));
}

#[test]
fn wait_returns_when_the_memory_comes_back_and_lists_holders_on_timeout() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let holder = incident.hold(scheduler(0, 30 * GIB));

    let busy = run(&host, &["wait", "--gpu", "0", "--timeout", "300ms"]);
    assert_eq!(busy.code, 1);
    assert_contains(&busy.stdout, "GPU 0: busy, 30.0 GiB used");
    assert!(
        busy.stdout.contains(&holder.to_string()),
        "holders listed: {}",
        busy.stdout
    );
    assert!(busy.stdout.contains("sglang::scheduler_TP0"));

    let busy_json = run(
        &host,
        &["wait", "--gpu", "0", "--timeout", "100ms", "--json"],
    );
    assert_eq!(busy_json.code, 1);
    let busy_json = busy_json.json();
    assert_eq!(busy_json["ready"], false);
    assert_eq!(busy_json["holders"][0]["pid"], holder);

    assert_eq!(
        run(&host, &["wait", "--gpu", "1", "--timeout", "1s"]).code,
        0
    );

    let waiter = gpureap(&host)
        .args([
            "wait",
            "--gpu",
            "0",
            "--below",
            "1GiB",
            "--timeout",
            "20s",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("wait runs");
    // It has read GPU 0 busy once it waits on the driver for a change.
    blocked_in(
        waiter.id(),
        WAITING_ON_THE_DRIVER,
        "wait never waited on the driver",
    );
    incident.kill(holder).expect("kill holder");
    let result: Run = waiter.wait_with_output().expect("wait ends").into();
    assert_eq!(result.code, 0);
    let report = result.json();
    assert_eq!(report["ready"], true);
    assert_eq!(report["gpus"][0]["memory_used"], 0);
}

/// `wait` reads a release without scanning every process again: once the
/// only holder of GPU 0 exits and the simulated driver has seen its node's
/// description released (inotify), with no open of the node since its scan,
/// the figure is the leak alone (docs/architecture.md, "Between looks").
#[test]
fn wait_reads_a_release_without_another_scan() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let holder = incident.hold(scheduler(0, 30 * GIB));
    host.leak(0, 256 << 20).expect("leak");
    let waiter = gpureap(&host)
        .env("GPUREAP_LOG", "gpureap=debug")
        .args([
            "wait",
            "--gpu",
            "0",
            "--below",
            "1GiB",
            "--timeout",
            "20s",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("wait runs");
    blocked_in(
        waiter.id(),
        WAITING_ON_THE_DRIVER,
        "wait never waited on the driver",
    );
    incident.kill(holder).expect("kill holder");
    let result: Run = waiter.wait_with_output().expect("wait ends").into();
    assert_eq!(result.code, 0, "{}{}", result.stdout, result.stderr);
    assert_eq!(result.json()["gpus"][0]["memory_used"], 256u64 << 20);
    assert!(
        result.stderr.contains("read without a scan"),
        "the release was read by a scan: {}",
        result.stderr
    );
}

/// A holder that forks after `wait` has read the GPU busy leaves its child
/// the node (the description is shared, as a CUDA process's dataloader
/// workers share it): its exit releases nothing, so `wait` must not call
/// the GPU free. The child, with no claim of its own, holds 1 GiB here.
#[test]
fn wait_does_not_call_free_while_a_forked_child_keeps_the_node() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let go = host.path().join("go");
    let made = std::process::Command::new("mkfifo")
        .arg(&go)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    // The parent (recorded as the bash it is until then) holds 30 GiB; on a
    // line from `go` it forks a child that inherits its descriptor on GPU
    // 0's node, then sleeps on.
    let parent = incident
        .spawn(
            &format!(
                "echo {} > \"$D/claims/$BASHPID.0\"; exec 3<\"$D/nvidia0\"; \
                 echo \"$BASHPID bash\" >> \"$D/pids\"; read -r _ < \"$D/go\"; \
                 ( echo \"$BASHPID forked-child\" >> \"$D/pids\"; exec -a forked-child sleep 100000 ) & \
                 exec -a forking-holder sleep 100000",
                30 * GIB
            ),
            1,
        )
        .expect("parent");
    let waiter = gpureap(&host)
        .args([
            "wait",
            "--gpu",
            "0",
            "--below",
            "512MiB",
            "--timeout",
            "15s",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("wait runs");
    blocked_in(
        waiter.id(),
        WAITING_ON_THE_DRIVER,
        "wait never waited on the driver",
    );
    std::fs::write(&go, "go\n").expect("the parent forks");
    let deadline = Instant::now() + Duration::from_secs(20);
    let child = loop {
        if let Ok(child) = incident.pid_of("forked-child") {
            break child;
        }
        assert!(Instant::now() < deadline, "the parent never forked");
        std::thread::sleep(Duration::from_millis(10));
    };
    incident.kill(parent).expect("kill the parent");
    let result: Run = waiter.wait_with_output().expect("wait ends").into();
    assert_eq!(result.code, 1, "{}", result.stdout);
    let report = result.json();
    assert_eq!(report["ready"], false, "{report:#}");
    assert_eq!(report["gpus"][0]["memory_used"], GIB, "{report:#}");
    assert_eq!(report["holders"][0]["pid"], child, "{report:#}");
}

#[test]
fn dry_run_signals_nothing_and_shows_the_plan() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let (launcher, [worker]) = incident.sglang_tree([scheduler(0, 40 * GIB)]);

    let plan = run(
        &host,
        &["free", "--pid", &launcher.to_string(), "--dry-run"],
    );
    assert_eq!(plan.code, 0);
    assert_contains(&plan.stdout, "Would signal 3 process(es)");
    assert!(plan.stdout.contains(LAUNCHER));
    assert!(alive(launcher) && alive(worker));

    let json = run(&host, &["free", "--gpu", "0", "--dry-run", "--json"]).json();
    assert_eq!(json["dry_run"], true);
    assert_eq!(target_pids(&json), [worker]);
    assert!(signals(&json, worker).is_empty());
}

#[test]
fn a_grace_as_long_as_the_timeout_still_verifies_after_the_kill() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let stubborn = incident.hold(scheduler(0, 30 * GIB).ignoring_sigterm());
    let result = run(&host, &free_json(&["--gpu", "0"], "300ms", "300ms"));
    let report = result.json();
    assert_eq!(result.code, 0, "{report:#}");
    assert_eq!(
        signals(&report, stubborn),
        ["SIGTERM", "SIGSTOP", "SIGKILL"]
    );
    assert_eq!(gpu(&report, 0)["freed"], true);
    assert!(!alive(stubborn));
}

#[test]
fn a_service_under_pid_1_is_not_an_orphan() {
    let (host, mut incident) = Sim::gpus(1).stage();
    // A session leader whose parent is PID 1, as systemd starts services.
    let service = Holder::new("tritonserver --model-repository /models").on(0, 10 * GIB);
    let script = format!(
        "( ( exec setsid bash -c {} ) & )",
        shell_quote(&service.script())
    );
    incident.spawn(&script, 1).expect("staged");
    let pid = incident
        .pid_of("tritonserver --model-repository /models")
        .expect("service");
    assert_eq!(ppid(pid), Some(1));

    let status = run(&host, &["status", "--json"]).json();
    assert_eq!(
        status["holders"][0]["flags"],
        serde_json::json!([]),
        "{status:#}"
    );
    let report = run(&host, &free_json(&["--orphans"], "200ms", "300ms")).json();
    assert!(target_pids(&report).is_empty(), "{report:#}");
    assert!(alive(pid));
}

/// A training job started with `nohup ... &` from a shell with job control
/// leads its own process group; when the shell exits it is re-parented to
/// PID 1 like a crashed launcher's worker, but it is healthy: `--orphans`
/// takes the worker and leaves the job alone, and says why per target.
#[test]
fn a_nohup_job_whose_shell_exited_is_not_an_orphan() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let job = Holder::new("python train.py --epochs 90").on(1, 30 * GIB);
    // `set -m`: job control, as in an interactive shell; then the shell exits.
    let script = format!(
        "set -m; ( exec nohup bash -c {} >/dev/null 2>&1 ) & exit 0",
        shell_quote(&job.script())
    );
    incident.spawn(&script, 1).expect("staged");
    let training = incident
        .pid_of("python train.py --epochs 90")
        .expect("training job");
    let (launcher, [worker]) = incident.sglang_tree([scheduler(0, 70 * GIB)]);
    incident.orphan(launcher, &[worker]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while ppid(training) != Some(1) {
        assert!(Instant::now() < deadline, "the job was not re-parented");
        std::thread::sleep(Duration::from_millis(5));
    }

    let status = run(&host, &["status", "--json"]).json();
    let holder = |pid: u32| holder_of(&status, pid);
    assert_eq!(holder(training)["pgid"], training, "leads its own group");
    assert_eq!(holder(training)["flags"], serde_json::json!([]));
    assert_eq!(holder(training)["orphan"], serde_json::Value::Null);
    assert_eq!(holder(worker)["flags"], serde_json::json!(["orphaned"]));
    assert_eq!(
        holder(worker)["orphan"],
        format!("group leader {launcher} is gone; re-parented to PID 1")
    );

    let plan = run(&host, &["free", "--orphans", "--dry-run"]);
    assert_contains(
        &plan.stdout,
        &format!("orphaned: group leader {launcher} is gone"),
    );
    let result = run(
        &host,
        &["free", "--orphans", "--grace", "200ms", "--yes", "--json"],
    );
    assert_eq!(result.code, 0, "{}", result.stdout);
    let report = result.json();
    assert_eq!(target_pids(&report), [worker]);
    assert!(!alive(worker));
    assert!(alive(training), "the healthy nohup job was signalled");
}

/// Under a subreaper (`systemd --user`, a container's init shim), a crashed
/// launcher's worker is re-parented to the subreaper, not to PID 1: it is an
/// orphan all the same, and the subreaper is not.
#[test]
fn an_orphan_adopted_by_a_subreaper_is_an_orphan() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let worker = scheduler(0, 40 * GIB);
    // A login shell of its own session, where the launcher runs as a job.
    let shell = format!(
        "set -m; ( echo \"$BASHPID {LAUNCHER}\" >> \"$D/pids\"; ( {} ) & exec -a '{LAUNCHER} --tp 1' sleep 100000 ) & wait",
        worker.script()
    );
    // A subreaper in a session of its own, as systemd --user is, under
    // which that shell runs; it reaps whatever ends.
    let subreaper = format!(
        "import ctypes, os, signal, subprocess, time\n\
         ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\n\
         os.setsid()\n\
         signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n\
         title = open('/proc/self/cmdline').read().split(chr(0))[0]\n\
         open(os.environ['D'] + '/pids', 'a').write(f'{{os.getpid()}} {{title}}\\n')\n\
         subprocess.Popen(['bash', '-c', {shell:?}], start_new_session=True)\n\
         time.sleep(100000)\n"
    );
    incident
        .spawn(&format!("exec python3 -c {}", shell_quote(&subreaper)), 3)
        .expect("staged");
    let reaper = incident
        .records()
        .expect("records")
        .into_iter()
        .find(|(_, title)| title.contains("python"))
        .map(|(pid, _)| pid)
        .expect("subreaper");
    let launcher = incident.pid_of(LAUNCHER).expect("launcher");
    let worker = incident.pid_of("sglang::scheduler_TP0").expect("worker");
    incident.kill(launcher).expect("kill launcher");
    let deadline = Instant::now() + Duration::from_secs(5);
    while ppid(worker) != Some(reaper) {
        assert!(
            Instant::now() < deadline,
            "the worker was not adopted by the subreaper: parent {:?}",
            ppid(worker)
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    let result = run(
        &host,
        &["free", "--orphans", "--grace", "200ms", "--yes", "--json"],
    );
    assert_eq!(result.code, 0, "{}", result.stdout);
    let report = result.json();
    assert_eq!(target_pids(&report), [worker]);
    assert_eq!(
        target(&report, worker).expect("target")["orphan"],
        format!("group leader {launcher} is gone; re-parented to subreaper {reaper}")
    );
    assert!(alive(reaper), "the subreaper was signalled");
}

/// The driver cannot answer for a lost GPU: the processes with its node open
/// are still the targets a scope names (the only evidence there is), and
/// the GPU is never reported freed: the exit code says the work could not
/// be completed.
#[test]
fn a_holder_of_a_lost_gpu_is_a_target_and_the_gpu_is_never_called_freed() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let worker = incident.hold(scheduler(0, 70 * GIB));
    let notebook = incident.hold(Holder::new("jupyter-kernel colleague").on(1, 5 * GIB));
    host.lose(0).expect("lose GPU 0");

    let plan = run(&host, &["free", "--match", "sglang", "--dry-run"]);
    assert_eq!(plan.code, 0);
    assert_contains(&plan.stdout, "Would signal 1 process");
    assert!(plan.stdout.contains("weaker evidence"), "{}", plan.stdout);

    let result = run(&host, &free_json(&["--match", "sglang"], "200ms", "1s"));
    assert_eq!(result.code, 3, "{}{}", result.stdout, result.stderr);
    let report = result.json();
    assert_eq!(report["exit_code"], 3);
    assert_eq!(target_pids(&report), [worker]);
    assert_eq!(signals(&report, worker), ["SIGTERM"]);
    assert!(!alive(worker));
    assert!(alive(notebook), "out of scope");
    assert_eq!(gpu(&report, 0)["freed"], false);
    assert_eq!(gpu(&report, 0)["checked"], false);
    assert_eq!(reasons(&report, 0), ["driver_error"]);

    let text = run(&host, &["free", "--gpu", "0", "--yes"]);
    assert_eq!(text.code, 3, "{}", text.stdout);
    assert_contains(&text.stdout, "GPU 0: not verified");
}

/// `--grace 0 --timeout 0`: the verdict is not about a process that was
/// alive before the SIGKILL and gone after it.
#[test]
fn the_verdict_comes_from_a_look_after_the_last_signal() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let holder = incident.hold(scheduler(0, 20 * GIB));
    let result = run(&host, &free_json(&["--gpu", "0"], "0", "0"));
    let report = result.json();
    assert_eq!(result.code, 0, "{report:#}");
    assert_eq!(signals(&report, holder), ["SIGSTOP", "SIGKILL"]);
    assert_eq!(gpu(&report, 0)["freed"], true, "{report:#}");
    assert_eq!(gpu(&report, 0)["memory_after"], 0);
    assert!(!alive(holder));
}

/// Points the kernel's next PID at `pid` (root, in this PID namespace) and
/// starts `script` there; retries while another process takes the PID first.
fn spawn_at_pid(incident: &mut Incident, pid: u32, script: &str) -> bool {
    for _ in 0..50 {
        if std::fs::metadata(format!("/proc/{pid}")).is_ok() {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        if std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).is_err() {
            return false;
        }
        // A spawn that misses the PID (another test forked first) exits at
        // once instead of becoming a second holder.
        let only_there = format!(
            "[ \"$BASHPID\" = {pid} ] || {{ echo \"$BASHPID missed\" >> \"$D/pids\"; exit 0; }}; {script}"
        );
        let got = incident.spawn(&only_there, 1).expect("staged");
        if got == pid {
            return true;
        }
    }
    false
}

/// Where PIDs cannot be steered (a user namespace: not root in the initial
/// PID namespace), the PID-reuse test below says it is skipped, and why, and
/// records it for the end of the suite: it does not pass in silence.
#[test]
fn the_pid_reuse_test_reports_itself_skipped_where_pids_cannot_be_steered() {
    const TEST: &str = "incidents::a_process_that_takes_a_killed_targets_pid_is_not_blamed";
    let record = tempfile::tempdir().expect("tmp");
    let file = record.path().join("skipped.txt");
    let result: Run = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user"])
        .arg(std::env::current_exe().expect("this test binary"))
        .args(["--exact", TEST, "--nocapture", "--test-threads", "1"])
        .env("GPUREAP_TEST_SKIPPED", &file)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("unshare runs")
        .into();
    assert_eq!(result.code, 0, "{}{}", result.stdout, result.stderr);
    assert!(result.stdout.contains("1 passed"), "{}", result.stdout);
    let line = format!(
        "SKIPPED: {TEST}: cannot steer PIDs here (needs root in the initial PID namespace)\n"
    );
    assert!(result.stderr.contains(&line), "{}", result.stderr);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap_or_default(),
        line,
        "not recorded"
    );
}

/// A target exits during the grace and another process takes its PID and
/// opens the GPU: that process was never a target. It is spared, and then
/// it is an out-of-scope holder whose memory is explained, not a survivor
/// "still alive after" signals it never got.
#[test]
fn a_process_that_takes_a_killed_targets_pid_is_not_blamed() {
    let last_pid = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap_or_default();
    if std::fs::write("/proc/sys/kernel/ns_last_pid", last_pid.trim()).is_err() {
        return skip("cannot steer PIDs here (needs root in the initial PID namespace)");
    }
    let (host, mut incident) = Sim::gpus(1).stage();
    let [quick, stubborn] = incident.orphaned_sglang([
        scheduler(0, 30 * GIB),
        Holder::new("sglang::scheduler_TP1")
            .on(0, 10 * GIB)
            .ignoring_sigterm(),
    ]);
    let child = gpureap(&host)
        .args([
            "free",
            "--match",
            "sglang::scheduler",
            "--grace",
            "3s",
            "--timeout",
            "2s",
            "--yes",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gpureap runs");
    // TP0 ends on SIGTERM and is reaped by PID 1; TP1 keeps the grace going.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(format!("/proc/{quick}")).is_ok() {
        assert!(Instant::now() < deadline, "TP0 did not end on SIGTERM");
        std::thread::sleep(Duration::from_millis(2));
    }
    let decoy = Holder::new("jupyter-kernel colleague").on(0, GIB);
    let reused = spawn_at_pid(&mut incident, quick, &decoy.script());
    let result: Run = child.wait_with_output().expect("gpureap ends").into();
    assert!(reused, "could not make another process take PID {quick}");
    let report = result.json();
    assert_eq!(result.code, 0, "{report:#}");
    assert!(alive(quick), "the process now at PID {quick} was signalled");
    assert!(!alive(stubborn));
    assert_eq!(gpu(&report, 0)["freed"], true, "{report:#}");
    assert_eq!(gpu(&report, 0)["memory_after"], GIB);
    assert!(reasons(&report, 0).is_empty(), "{report:#}");
}

/// Sleeping processes that crowd /proc, as on a busy host; all in one
/// process group of their own, ended together when dropped.
pub(crate) struct Crowd {
    leader: std::process::Child,
}

impl Crowd {
    pub(crate) fn new(count: usize) -> Crowd {
        let mut command = std::process::Command::new("bash");
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let leader = command
            .arg("-c")
            .arg(format!(
                "for i in $(seq {count}); do sleep 1000 & done; echo up; wait"
            ))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("crowd");
        let mut crowd = Crowd { leader };
        let mut up = [0u8; 3];
        std::io::Read::read_exact(crowd.leader.stdout.as_mut().expect("stdout"), &mut up)
            .expect("crowd up");
        crowd
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        // Safety: a plain kill(2) of the group this test made.
        unsafe { libc::kill(-(self.leader.id() as i32), libc::SIGKILL) };
        let _ = self.leader.wait();
    }
}

/// CPU time a live process has used, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .expect("fields")
        .split_whitespace()
        .collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    ticks as f64 / 100.0
}

/// Runs gpureap with `args` for `seconds`, then returns the share of one
/// core it used meanwhile, and stops it.
fn cpu_share(host: &SimHost, args: &[&str], seconds: f64) -> f64 {
    let mut child = gpureap(host)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("gpureap runs");
    // Past start-up and its first look: waiting on the driver for a change.
    blocked_in(
        child.id(),
        WAITING_ON_THE_DRIVER,
        "gpureap never waited on the driver",
    );
    let before = cpu_seconds(child.id());
    let start = Instant::now();
    // What is measured: the CPU it uses over these seconds.
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let used = cpu_seconds(child.id()) - before;
    let share = used / start.elapsed().as_secs_f64();
    let _ = child.kill();
    let _ = child.wait();
    share
}

/// Waiting on a GPU that stays held, and verifying one that stays held, must
/// not rescan /proc every few milliseconds: with a crowded /proc that costs
/// a whole core. They wait on the driver instead.
#[test]
fn waiting_and_verifying_do_not_burn_a_core() {
    let (host, mut incident) = Sim::gpus(1).stage();
    incident.hold(scheduler(0, 70 * GIB));
    host.leak(0, 5 * GIB).expect("leak");
    let _crowd = Crowd::new(800);

    let wait = cpu_share(&host, &["wait", "--gpu", "0", "--timeout", "1m"], 2.0);
    // In scope but spared (a protected name), so the GPU stays held and
    // verification runs to its timeout. (Memory held by no process before the
    // free started is not waited for: it cannot come back.)
    let verify = cpu_share(
        &host,
        &[
            "free",
            "--gpu",
            "0",
            "--protect",
            "sglang::scheduler_TP0",
            "--grace",
            "0",
            "--timeout",
            "1m",
            "--yes",
        ],
        2.0,
    );
    assert!(wait < 0.25, "wait used {:.0}% of a core", wait * 100.0);
    assert!(
        verify < 0.25,
        "free's verification used {:.0}% of a core",
        verify * 100.0
    );
}

/// `reset` clears memory only on a GPU no process uses, and a scan that
/// could not read every process cannot say that: a process of another user
/// (root's, to a gpureap run as nobody) may have the device node open.
#[test]
fn reset_is_refused_while_the_scan_could_not_read_every_process() {
    let (host, mut incident) = Sim::gpus(1).stage();
    host.leak(0, 5 * GIB).expect("leak");
    // root's process with GPU 0's node open and no context: nobody cannot see its descriptors.
    let opener = incident.hold(Holder::new("nvtop-like-viewer"));
    // Anyone may change the directory, so that only gpureap's own check can refuse.
    let mut permissions = std::fs::metadata(host.path()).expect("dir").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o777);
    std::fs::set_permissions(host.path(), permissions).expect("chmod");

    let reset = run_as_nobody_unchanged(&host, &["reset", "--gpu", "0"]);
    assert_eq!(reset.code, 3, "{}{}", reset.stdout, reset.stderr);
    assert!(
        reset.stdout.contains("GPU 0: not reset")
            && reset.stdout.contains("could not be inspected"),
        "{}",
        reset.stdout
    );
    assert!(
        host.path().join("leak.0").exists(),
        "the memory was not cleared"
    );
    assert!(alive(opener));

    // root reads every process: it sees the opener and refuses for that.
    let as_root = run(&host, &["reset", "--gpu", "0"]);
    assert_eq!(as_root.code, 1, "{}", as_root.stdout);
    assert_contains(&as_root.stdout, &format!("pid {opener}"));
}

/// Memory held by no process before `free` started cannot come back by
/// waiting: `free` reports it as such and returns once what it signalled is
/// released, instead of waiting out `--timeout`. The GPU is still held: 1.
#[test]
fn memory_driver_held_before_free_is_reported_and_not_waited_out() {
    let (host, mut incident) = Sim::gpus(1).stage();
    host.leak(0, 5 * GIB).expect("leak");
    let a = incident.hold(Holder::new("python3 a.py").on(0, 10 * GIB));
    let b = incident.hold(Holder::new("python3 b.py").on(0, 10 * GIB));
    let (a_arg, b_arg) = (a.to_string(), b.to_string());
    let mut command = gpureap(&host);
    command.args([
        "free",
        "--pid",
        &a_arg,
        "--pid",
        &b_arg,
        "--grace",
        "1s",
        "--timeout",
        "1h",
        "--yes",
        "--json",
    ]);
    let result = ends_within(
        &mut command,
        Duration::from_secs(120),
        "free with memory held by no process before it started",
    );
    let report = result.json();
    assert_eq!(result.code, 1, "{report:#}");
    assert!(!alive(a) && !alive(b));
    assert_eq!(signals(&report, a), ["SIGTERM"]);
    assert_eq!(reasons(&report, 0), ["driver_held"], "{report:#}");
    let reason = &gpu(&report, 0)["reasons"][0];
    assert_eq!(reason["bytes"], 5 * GIB);
    assert_eq!(reason["before_free"], 5 * GIB);
    assert!(
        reason["text"]
            .as_str()
            .is_some_and(|text| text.contains("since before free started")),
        "{reason:#}"
    );
    assert_eq!(gpu(&report, 0)["memory_after"], 5 * GIB);
    assert_eq!(gpu(&report, 0)["freed_bytes"], 20 * GIB);

    // Memory a signalled process leaves held by no process as it exits is
    // not from before: only the 5 GiB are, of 8 GiB held by no process now.
    let host = self::Sim::gpus(1).build();
    host.leak(0, 5 * GIB).expect("leak");
    let mut stand_ins =
        Incident::with_stand_ins(&host, std::path::Path::new(env!("CARGO_BIN_EXE_gpureap")))
            .expect("stand-ins");
    let keeper = stand_ins
        .holder(
            &Holder::new("sglang::scheduler_TP5")
                .on(0, 10 * GIB)
                .leaving_driver_held(3 * GIB),
        )
        .expect("keeper");
    let keeper_arg = keeper.to_string();
    let left = run(&host, &free_json(&["--pid", &keeper_arg], "1s", "300ms"));
    let left = left.json();
    assert_eq!(reasons(&left, 0), ["driver_held"], "{left:#}");
    assert_eq!(gpu(&left, 0)["reasons"][0]["bytes"], 8 * GIB, "{left:#}");
    assert_eq!(
        gpu(&left, 0)["reasons"][0]["before_free"],
        5 * GIB,
        "{left:#}"
    );
}

/// A GPU still held accounts for all its memory: the outcome names each
/// holder out of scope (pid, memory) next to the driver-held rest, so that
/// the figures add up to what is used (the demo's GPU 3 showed 98.0 GiB
/// used and explained only 92.0 of it).
#[test]
fn a_gpu_still_held_names_its_out_of_scope_holders_so_the_figures_add_up() {
    let host = Sim::gpus(1).build();
    host.leak(0, 5 * GIB).expect("leak");
    let mut incident = Incident::new(&host);
    let worker = incident.hold(scheduler(0, 20 * GIB));
    let notebook = incident.hold(Holder::new("python3 notebook.py").on(0, 6 * GIB));
    let result = run(
        &host,
        &[
            "free",
            "--pid",
            &worker.to_string(),
            "--grace",
            "0",
            "--timeout",
            "500ms",
            "--yes",
        ],
    );
    assert_eq!(result.code, 1, "{}{}", result.stdout, result.stderr);
    let lines: Vec<&str> = result.stdout.lines().collect();
    let held = lines
        .iter()
        .position(|line| line.starts_with("GPU 0: still held, 11.0 GiB used"))
        .unwrap_or_else(|| panic!("{}", result.stdout));
    assert_eq!(
        lines[held + 1..held + 3],
        [
            format!("  - 6.0 GiB used by pid {notebook} (sleep), out of scope").as_str(),
            "  - 5.0 GiB held by no process (driver-held) since before free started; only a GPU reset or a reboot clears it",
        ],
        "{}",
        result.stdout
    );
    assert!(alive(notebook) && !alive(worker));
}
