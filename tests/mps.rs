//! MPS on the simulated driver (docs/mps.md): real processes whose argv[0]
//! and comm are `nvidia-cuda-mps-control` and `nvidia-cuda-mps-server` (run
//! through links of those names, so the kernel cuts their comm to
//! `nvidia-cuda-mps` as it does the real ones'), a server that is the
//! daemon's child, and clients in the daemon's pipe directory that the
//! driver lists as MPS clients (`DIR/mps/PID.N`).

use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};
use serde_json::Value;

use crate::harness::*;

const MIB: u64 = 1 << 20;
const SERVER_MEMORY: u64 = 64 * MIB;

/// The links the daemon and server run through, and the daemon's script:
/// it starts the server (claims, every node, a context on `gpu`) as its
/// child, records itself, then waits on it, or exits at once when `exits`
/// (a daemon that died and left its server re-parented).
fn prepare(host: &SimHost, gpu: u32, exits: bool) -> String {
    let server = Holder::new(gpureap_core::snapshot::mps::SERVER)
        .on(gpu, SERVER_MEMORY)
        .script()
        .replace(" sleep 100000", " \"$D/bin/nvidia-cuda-mps-server\" 100000");
    // The daemon then becomes sleep, still its server's parent, under its
    // name: a bash that waited would end with its server.
    let end = if exits {
        "exit 0"
    } else {
        "exec -a nvidia-cuda-mps-control \"$D/bin/nvidia-cuda-mps-control-daemon\" 100000"
    };
    let script =
        format!("( {server} ) &\necho \"$$ nvidia-cuda-mps-control\" >> \"$D/pids\"\n{end}\n");
    let bin = host.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    std::fs::create_dir_all(host.path().join("mps")).expect("mps");
    std::fs::write(bin.join("control.sh"), script).expect("control.sh");
    let link = |target: &str, name: &str| {
        let path = bin.join(name);
        let _ = std::fs::remove_file(&path);
        let found = which(target);
        std::os::unix::fs::symlink(found, path).expect("link");
    };
    link("bash", "nvidia-cuda-mps-control");
    link("sleep", "nvidia-cuda-mps-server");
    link("sleep", "nvidia-cuda-mps-control-daemon");
    "export CUDA_MPS_PIPE_DIRECTORY=\"$D/pipe\"; exec -a nvidia-cuda-mps-control \"$D/bin/nvidia-cuda-mps-control\" \"$D/bin/control.sh\""
        .to_string()
}

fn which(program: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("{program} not on PATH"))
}

/// An MPS daemon with its server on `gpu`: (daemon, server).
fn mps(incident: &mut Incident, host: &SimHost, gpu: u32) -> (u32, u32) {
    let script = prepare(host, gpu, false);
    let daemon = incident.spawn(&script, 2).expect("MPS daemon and server");
    let server = incident
        .pid_of(gpureap_core::snapshot::mps::SERVER)
        .expect("server");
    assert_eq!(
        ppid(server),
        Some(daemon),
        "the server is the daemon's child"
    );
    (daemon, server)
}

/// A client on `gpu` with `bytes`, in `pipe` (relative to the host), listed
/// by the driver as an MPS client when `listed`.
fn client(incident: &mut Incident, title: &str, gpu: u32, bytes: u64, pipe: &str) -> u32 {
    let script = format!(
        "export CUDA_MPS_PIPE_DIRECTORY=\"$D/{pipe}\"; : > \"$D/mps/$BASHPID.{gpu}\"; {}",
        Holder::new(title).on(gpu, bytes).script()
    );
    incident.spawn(&script, 1).expect("client");
    incident.pid_of(title).expect("client pid")
}

#[test]
fn status_lists_each_client_with_its_server() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let (daemon, server) = mps(&mut incident, &host, 0);
    let a = client(&mut incident, "client-a", 0, 2 * GIB, "pipe");
    let b = client(&mut incident, "client-b", 0, 3 * GIB, "pipe");
    // Another CUDA process on the same GPU, in no daemon's pipe directory.
    let plain = incident.hold(Holder::new("plain-cuda").on(0, GIB));

    let status = run(&host, &["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let json = status.json();
    crate::schema::conforms(&crate::schema::schema(), "status with MPS", &json);
    let pipe = host.path().join("pipe").display().to_string();
    for pid in [a, b] {
        let mps = &holder_of(&json, pid)["mps"];
        assert_eq!(mps["role"], "client", "{json:#}");
        assert_eq!(mps["server"], server, "{json:#}");
        assert_eq!(mps["daemon"], daemon, "{json:#}");
        assert_eq!(mps["pipe_directory"], pipe.as_str(), "{json:#}");
        assert_eq!(mps["listed_by_driver"], true, "{json:#}");
        assert!(flags(holder_of(&json, pid)).contains(&"mps_client".to_string()));
    }
    let server_json = holder_of(&json, server);
    assert_eq!(server_json["mps"]["role"], "server", "{json:#}");
    assert_eq!(server_json["mps"]["daemon"], daemon, "{json:#}");
    assert_eq!(server_json["gpus"][0]["memory"], SERVER_MEMORY);
    assert_eq!(holder_of(&json, plain)["mps"], Value::Null, "{json:#}");
    // The server's memory is a holder's, not held by no process.
    assert_eq!(json["gpus"][0]["memory_unattributed"], 0, "{json:#}");
    assert_eq!(json["gpus"][0]["held_by_no_process"], false, "{json:#}");

    let table = run(&host, &["status"]);
    assert_contains(
        &table.stdout,
        &format!("MPS server {server} serves clients: {a}, {b}."),
    );
    let metrics = run(&host, &["status", "--prometheus", "--per-process"]);
    assert_eq!(metrics.code, 0, "{}", metrics.stderr);
    for pid in [a, b] {
        let series = metrics
            .stdout
            .lines()
            .find(|line| {
                line.starts_with("gpureap_process_gpu_memory_bytes{")
                    && line.contains(&format!("pid=\"{pid}\""))
            })
            .unwrap_or_else(|| panic!("no series for {pid}:\n{}", metrics.stdout));
        assert!(
            series.contains(&format!("mps_server=\"{server}\""))
                && series.contains("flags=\"mps_client\""),
            "{series}"
        );
    }
    let tree = run(&host, &["status", "--tree"]);
    for pid in [a, b] {
        let line = tree
            .stdout
            .lines()
            .find(|line| line.contains(&format!("{pid} [")))
            .unwrap_or_else(|| panic!("{pid} not in the tree:\n{}", tree.stdout));
        assert!(
            line.contains(&format!("[MPS client of server {server}]")),
            "{}",
            tree.stdout
        );
    }
}

/// Where the driver's MPS list names only the server (or no client), a
/// process in the daemon's pipe directory is still its client: the list
/// settles who is a client only through the clients it names.
#[test]
fn a_server_in_the_drivers_mps_list_does_not_hide_the_clients() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let (_, server) = mps(&mut incident, &host, 0);
    std::fs::write(host.path().join("mps").join(format!("{server}.0")), "").expect("marker");
    let script = format!(
        "export CUDA_MPS_PIPE_DIRECTORY=\"$D/pipe/\"; {}",
        Holder::new("unmarked-client").on(0, GIB).script()
    );
    incident.spawn(&script, 1).expect("client");
    let client = incident.pid_of("unmarked-client").expect("client pid");
    let status = run(&host, &["status", "--json"]).json();
    let mps = &holder_of(&status, client)["mps"];
    assert_eq!(mps["role"], "client", "{status:#}");
    assert_eq!(mps["server"], server, "{status:#}");
    assert_eq!(mps["listed_by_driver"], false, "{status:#}");
}

fn spared_reason(plan: &Value, pid: u32) -> Option<String> {
    spared(plan, pid)
}

/// Every broad way to name holders spares the daemon and the server; a
/// client is taken by each that admits it.
#[test]
fn every_broad_selector_spares_the_server_and_the_daemon() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let (daemon, server) = mps(&mut incident, &host, 0);
    let a = client(&mut incident, "client-a", 0, 2 * GIB, "pipe");
    let me = rustix::process::getuid().as_raw().to_string();
    for scope in [
        &["--gpu", "0"][..],
        &["--all"],
        &["--match", "nvidia-cuda-mps|client"],
        &["--user", &me],
    ] {
        let mut args = vec!["free", "--dry-run", "--json"];
        args.extend(scope);
        let plan = run(&host, &args);
        assert_eq!(plan.code, 0, "{scope:?}: {}", plan.stderr);
        let json = plan.json();
        let targets = target_pids(&json);
        assert!(targets.contains(&a), "{scope:?}: {json:#}");
        assert!(!targets.contains(&server), "{scope:?}: {json:#}");
        assert!(!targets.contains(&daemon), "{scope:?}: {json:#}");
        assert_eq!(
            spared_reason(&json, server).as_deref(),
            Some("mps"),
            "{scope:?}: {json:#}"
        );
    }
    // Naming them is refused, before anything is signalled.
    for pid in [server, daemon] {
        let named = run(&host, &["free", "--pid", &pid.to_string(), "--yes"]);
        assert_eq!(named.code, 2, "{}", named.stderr);
        assert!(named.stderr.contains("MPS"), "{}", named.stderr);
    }
    // Freeing everything for real leaves both running.
    let freed = run(
        &host,
        &["free", "--gpu", "0", "--yes", "--grace", "1s", "--json"],
    );
    assert!(!alive(a), "{}", freed.stdout);
    assert!(alive(server) && alive(daemon), "{}", freed.stdout);
}

/// A daemon that died leaves its server re-parented and in a group whose
/// leader is gone: an orphan by the rule, still never taken by
/// `free --orphans` nor by the watch's orphan rule.
#[test]
fn an_orphaned_server_is_spared_by_orphans_and_by_the_watch() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let script = format!("set -m; ( {} ) & wait", prepare(&host, 0, true));
    incident.spawn(&script, 2).expect("MPS daemon that exits");
    let server = incident
        .pid_of(gpureap_core::snapshot::mps::SERVER)
        .expect("server");
    let deadline = Instant::now() + Duration::from_secs(5);
    while ppid(server) == Some(incident.pid_of("nvidia-cuda-mps-control").expect("daemon")) {
        assert!(Instant::now() < deadline, "the server was not re-parented");
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = run(&host, &["status", "--json"]).json();
    assert!(
        flags(holder_of(&status, server)).contains(&"orphaned".to_string()),
        "the stage must make an orphan: {status:#}"
    );
    let plan = run(&host, &["free", "--orphans", "--dry-run", "--json"]).json();
    assert!(!target_pids(&plan).contains(&server), "{plan:#}");
    assert_eq!(
        spared_reason(&plan, server).as_deref(),
        Some("mps"),
        "{plan:#}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("reap.jsonl");
    let log_arg = log.to_str().expect("path");
    let policy = reap_now(
        "--orphans",
        &["--enforce", "--grace", "1s", "--log", log_arg],
    );
    let reap = run(&host, &policy);
    assert_eq!(reap.code, 0, "{}", reap.stderr);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.contains(&format!("\"pid\":{server},")) || !text.contains("\"action\":\"freed\""),
        "{text}"
    );
    assert!(
        alive(server),
        "the watch took the server:\n{text}\n{}",
        reap.stderr
    );
}

#[test]
fn freeing_one_client_leaves_the_other_client_the_server_and_the_daemon() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let (daemon, server) = mps(&mut incident, &host, 0);
    let a = client(&mut incident, "client-a", 0, 2 * GIB, "pipe");
    let b = client(&mut incident, "client-b", 0, 3 * GIB, "pipe");
    let freed = run(
        &host,
        &[
            "free",
            "--pid",
            &a.to_string(),
            "--yes",
            "--grace",
            "1s",
            "--json",
        ],
    );
    assert_eq!(freed.code, 0, "{}\n{}", freed.stdout, freed.stderr);
    assert_eq!(target_pids(&freed.json()), vec![a]);
    assert!(!alive(a));
    for pid in [b, server, daemon] {
        assert!(alive(pid), "{pid} was taken: {}", freed.stdout);
    }
    let status = run(&host, &["status", "--json"]).json();
    assert_eq!(status["gpus"][0]["memory_used"], 3 * GIB + SERVER_MEMORY);
    assert_eq!(holder_of(&status, b)["mps"]["server"], server);
}

#[test]
fn the_deliberate_stop_names_the_clients_it_takes_down() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let (daemon, server) = mps(&mut incident, &host, 0);
    let a = client(&mut incident, "client-a", 0, 2 * GIB, "pipe");
    let b = client(&mut incident, "client-b", 0, 3 * GIB, "pipe");
    let other = incident.hold(Holder::new("plain-cuda").on(1, GIB));

    let plan = run(
        &host,
        &["free", "--mps-server", &server.to_string(), "--dry-run"],
    );
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    for pid in [a, b] {
        let line = plan
            .stdout
            .lines()
            .find(|line| line.contains(&pid.to_string()))
            .unwrap_or_else(|| panic!("{pid} not in the plan:\n{}", plan.stdout));
        assert!(
            line.contains(&format!("a client of MPS server {server}")),
            "{}",
            plan.stdout
        );
    }
    let by_gpu = run(
        &host,
        &["free", "--mps-server", "gpu:0", "--dry-run", "--json"],
    )
    .json();
    let mut targets = target_pids(&by_gpu);
    targets.sort();
    let mut expected = vec![server, a, b];
    expected.sort();
    assert_eq!(targets, expected, "{by_gpu:#}");
    assert_eq!(
        target(&by_gpu, server).expect("server")["because"],
        "mps_server"
    );
    assert_eq!(
        target(&by_gpu, a).expect("a")["because"],
        format!("mps_client of {server}")
    );

    let stopped = run(
        &host,
        &[
            "free",
            "--mps-server",
            &server.to_string(),
            "--yes",
            "--grace",
            "1s",
            "--json",
        ],
    );
    assert_eq!(stopped.code, 0, "{}\n{}", stopped.stdout, stopped.stderr);
    for pid in [server, a, b] {
        assert!(!alive(pid), "{pid} survived: {}", stopped.stdout);
    }
    assert!(
        alive(daemon),
        "the daemon is never taken: {}",
        stopped.stdout
    );
    assert!(alive(other));
}

#[test]
fn an_mps_server_that_is_not_one_is_bad_input() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let (daemon, server) = mps(&mut incident, &host, 0);
    let a = client(&mut incident, "client-a", 0, 2 * GIB, "pipe");
    for (value, says) in [
        (a.to_string(), "is not an MPS server"),
        (daemon.to_string(), "is not an MPS server"),
        ("gpu:1".to_string(), "GPU 1 has no MPS server"),
        ("gpu:7".to_string(), "there is no GPU 7"),
        ("4194305".to_string(), "no process with PID"),
        ("server".to_string(), "invalid MPS server"),
    ] {
        let result = run(&host, &["free", "--mps-server", &value, "--yes"]);
        assert_eq!(result.code, 2, "{value}: {}", result.stderr);
        assert!(result.stderr.contains(says), "{value}: {}", result.stderr);
    }
    for pid in [daemon, server, a] {
        assert!(alive(pid));
    }
}

/// The real-GPU check (scripts/gpu_mps_validate.py) in its `--sim` mode: its
/// own logic (start, find the daemon and server, the checks, the cleanup
/// by identity) run here, so that what the lead runs on the H200 is not
/// untested code.
#[test]
fn the_gpu_script_passes_on_the_simulated_driver() {
    let out = tempfile::tempdir().expect("tempdir");
    let output = std::process::Command::new("python3")
        .arg("-B")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/gpu_mps_validate.py"
        ))
        .arg(env!("CARGO_BIN_EXE_gpureap"))
        .arg("--sim")
        .arg("--out")
        .arg(out.path())
        .env_remove("GPUREAP_VALIDATE_SIM")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{said}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for check in [
        "PASS status lists the server with its daemon",
        "PASS the deliberate stop's plan names client 2",
        "PASS the daemon survives",
        "PASS the MPS daemon stops on quit",
    ] {
        assert!(said.contains(check), "{check}:\n{said}");
    }
    assert!(!said.contains("FAIL"), "{said}");
    assert!(out.path().join("mps.log").exists());
}
