//! `gpureap slurm` against a real Slurm (munged, slurmctld, slurmd started by
//! this test process, see `cluster`), and `gpureap reset` on the simulated
//! driver, whose device nodes are character devices here as on a real host.

mod cluster;

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};

use crate::harness::{GIB, Sim, Staging, alive, assert_contains, reap_now, run};
use cluster::{Cluster, SCONTROL, cluster, wait_for};

/// The PID a staged process recorded under `title` in the host's pids file.
fn recorded(host: &SimHost, title: &str) -> Option<u32> {
    fs::read_to_string(host.path().join("pids"))
        .unwrap_or_default()
        .lines()
        .rev()
        .find_map(|line| {
            let (pid, recorded) = line.split_once(' ')?;
            (recorded == title).then(|| pid.parse().ok())?
        })
}

/// Writes a holder's script where a job can run it.
fn holder_script(cluster: &Cluster, name: &str, holder: &Holder) -> String {
    let path = cluster.dir.join(format!("{name}.sh"));
    fs::write(&path, holder.script()).expect("holder script");
    path.display().to_string()
}

/// Shell that waits until the holder titled `title` (no `'` in it) is
/// recorded in `$D/pids` and runs under its title: it has claimed its GPU
/// memory, opened the nodes and exec'd (`Holder::script`), so the job may end.
fn running_as(title: &str) -> String {
    format!(
        "until grep -q ' {title}$' \"$D/pids\"; do sleep 0.05; done\n\
         pid=$(grep ' {title}$' \"$D/pids\" | head -n1 | cut -d' ' -f1)\n\
         until [ \"$(tr '\\0' '\\n' < /proc/$pid/cmdline | head -n1)\" = '{title}' ]; do sleep 0.05; done"
    )
}

/// `gpureap slurm healthcheck` as HealthCheckProgram= would run it.
fn healthcheck(cluster: &Cluster, extra: &[&str]) -> crate::harness::Run {
    Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", &cluster.sim.backend()])
        .args([
            "slurm",
            "healthcheck",
            "--node",
            &cluster.node,
            "--scontrol",
            SCONTROL,
        ])
        .arg("--log")
        .arg(cluster.dir.join("audit.jsonl"))
        .args(extra)
        .env("SLURM_CONF", cluster.conf())
        .env_remove("SLURMD_NODENAME")
        .env_remove("GPUREAP_BACKEND")
        .stdin(Stdio::null())
        .output()
        .expect("gpureap runs")
        .into()
}

fn actions(lines: &[serde_json::Value]) -> Vec<String> {
    lines
        .iter()
        .map(|line| line["action"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn epilog_frees_an_escaped_holder_and_spares_a_bystander() {
    let (cluster, _turn) = cluster();
    let mut incident = Incident::new(&cluster.sim);
    let bystander = incident.hold(Holder::new("bystander_on_gpu1").on(1, 3 * GIB));
    // The job's worker escapes the job: setsid + nohup, still running when
    // the batch script ends (proctrack/linuxproc does not catch it).
    let worker = holder_script(
        cluster,
        "escaped",
        &Holder::new("escaped_worker").on(0, 2 * GIB),
    );
    let job = cluster.sbatch(
        &["--uid=nobody", "--gres=gpu:1"],
        &format!(
            "[ \"$SLURM_JOB_GPUS\" = 0 ] || exit 7\n\
             setsid nohup bash {worker} </dev/null >/dev/null 2>&1 &\n\
             {}",
            running_as("escaped_worker")
        ),
    );
    let lines = cluster.wait_for_hook(job, "epilog");
    let escaped = recorded(&cluster.sim, "escaped_worker").expect("the job staged its worker");
    assert!(actions(&lines).contains(&"clean".to_string()), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|line| line["action"] == "signal" && line["pid"] == escaped),
        "the escaped worker {escaped} was freed by the epilog: {lines:#?}"
    );
    assert!(
        wait_for(Duration::from_secs(5), || !alive(escaped)).is_ok(),
        "escaped worker {escaped} still alive"
    );
    assert!(alive(bystander), "the bystander on GPU 1 was spared");
    let (state, _) = cluster.node_state().expect("node state");
    assert!(!state.contains("DRAIN"), "node stays in service: {state}");
}

#[test]
fn epilog_drains_the_node_on_driver_held_memory() {
    let (cluster, _turn) = cluster();
    let job = cluster.sbatch(
        &["--gres=gpu:1"],
        "echo $((5 << 30)) > \"$D/leak.$SLURM_JOB_GPUS\"",
    );
    let lines = cluster.wait_for_hook(job, "epilog");
    assert!(actions(&lines).contains(&"drain".to_string()), "{lines:#?}");
    assert_eq!(
        cluster.drain_reason().as_deref(),
        Some("gpureap: GPU 0: 5.0 GiB held by no process (driver-held)")
    );
}

/// The health check and the epilog judge memory held by no process by the
/// one rule: 100 MiB drains the node where the driver declares no
/// bookkeeping, with the figure `status` and `check` give, and does not
/// where it declares 512 MiB.
#[test]
fn healthcheck_and_epilog_judge_memory_held_by_no_process_by_the_drivers_tolerance() {
    const MIB: u64 = 1 << 20;
    let (cluster, _turn) = cluster();
    let leak = |index: u32| fs::remove_file(cluster.sim.path().join(format!("leak.{index}")));

    // The health check: held without a tolerance, not held with one.
    cluster.sim.leak(0, 100 * MIB).expect("leak");
    let held = healthcheck(cluster, &[]);
    assert_eq!(held.code, 1, "{}", held.stderr);
    assert_eq!(
        cluster.drain_reason().as_deref(),
        Some("gpureap: GPU 0: 100 MiB held by no process (driver-held)")
    );
    cluster
        .sim
        .declare_bookkeeping(512 * MIB)
        .expect("bookkeeping");
    let tolerated = healthcheck(cluster, &[]);
    assert_eq!(tolerated.code, 0, "{}", tolerated.stderr);
    let (state, _) = cluster.node_state().expect("state");
    assert!(!state.contains("DRAIN"), "{state}");
    leak(0).expect("leak removed");

    // The epilog: a job leaves 100 MiB held by no process on its GPU.
    let script = "echo $((100 << 20)) > \"$D/leak.$SLURM_JOB_GPUS\"";
    let job = cluster.sbatch(&["--gres=gpu:1"], script);
    let lines = cluster.wait_for_hook(job, "epilog");
    assert!(actions(&lines).contains(&"clean".to_string()), "{lines:#?}");
    let (state, _) = cluster.node_state().expect("state");
    assert!(!state.contains("DRAIN"), "{state}");
    for index in 0..2 {
        let _ = leak(index);
    }
    fs::remove_file(cluster.sim.path().join("bookkeeping")).expect("bookkeeping removed");
    let job = cluster.sbatch(&["--gres=gpu:1"], script);
    let lines = cluster.wait_for_hook(job, "epilog");
    assert!(actions(&lines).contains(&"drain".to_string()), "{lines:#?}");
    let reason = cluster.drain_reason().unwrap_or_default();
    assert!(
        reason.starts_with("gpureap: GPU ")
            && reason.ends_with(": 100 MiB held by no process (driver-held)"),
        "{reason}"
    );
}

#[test]
fn prolog_refuses_a_dirty_gpu_and_the_job_does_not_run() {
    let (cluster, _turn) = cluster();
    cluster.sim.leak(1, 5 * GIB).expect("leak");
    let marker = cluster.dir.join("prolog-job-ran");
    let job = cluster.sbatch(&["--gres=gpu:2"], &format!("touch {}", marker.display()));
    let lines = cluster.wait_for_hook(job, "prolog");
    assert!(actions(&lines).contains(&"drain".to_string()), "{lines:#?}");
    assert_eq!(
        cluster.drain_reason().as_deref(),
        Some("gpureap: GPU 1: 5.0 GiB held by no process (driver-held)")
    );
    let requeued = wait_for(Duration::from_secs(20), || {
        cluster.job_state(job) == "PENDING"
    });
    assert!(
        requeued.is_ok(),
        "job {job} not requeued: {}",
        cluster.job_state(job)
    );
    assert!(!marker.exists(), "the job ran on a dirty GPU");
}

#[test]
fn healthcheck_drains_resumes_its_own_drain_and_leaves_an_admins() {
    let (cluster, _turn) = cluster();
    let reason = |cluster: &Cluster| cluster.node_state().and_then(|(_, reason)| reason);

    // A process of no job holds GPU 0: drained, with gpureap's reason.
    let mut incident = Incident::new(&cluster.sim);
    let stray = incident.hold(Holder::new("stray_holder").on(0, GIB));
    let first = healthcheck(cluster, &[]);
    assert_eq!(first.code, 1, "{}", first.stderr);
    let drained = reason(cluster).unwrap_or_default();
    assert!(
        drained.starts_with(&format!(
            "gpureap: GPU 0: pid {stray} (sleep, root, state S) holds 1.0 GiB: no job's"
        )),
        "{drained}"
    );
    assert!(alive(stray), "the health check signals nothing");

    // Clean again: gpureap's own drain is undone.
    drop(incident);
    assert!(wait_for(Duration::from_secs(5), || !alive(stray)).is_ok());
    let second = healthcheck(cluster, &[]);
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert!(second.stderr.contains("resume"), "{}", second.stderr);
    let (state, _) = cluster.node_state().expect("state");
    assert!(!state.contains("DRAIN"), "{state}");

    // An admin's drain stays, clean GPUs or not, and keeps its reason.
    cluster.scontrol(&[
        "update",
        &format!("nodename={}", cluster.node),
        "state=drain",
        "reason=disk replacement",
    ]);
    let clean = healthcheck(cluster, &[]);
    assert_eq!(clean.code, 0, "{}", clean.stderr);
    cluster.sim.leak(1, 5 * GIB).expect("leak");
    let dirty = healthcheck(cluster, &[]);
    assert_eq!(dirty.code, 1, "{}", dirty.stderr);
    assert!(dirty.stderr.contains("left as it is"), "{}", dirty.stderr);
    let (state, admin) = cluster.node_state().expect("state");
    assert!(state.contains("DRAIN"), "{state}");
    assert_eq!(admin.as_deref(), Some("disk replacement"));
}

/// A comm is anyone's text. slurmd logs the health check's stderr line by
/// line, and the drain reason is read in `sinfo -R`: a comm with a newline
/// and an escape sequence stays written out on the line that names it.
#[test]
fn healthcheck_keeps_a_hostile_comm_on_its_line_in_the_log_and_the_reason() {
    let (cluster, _turn) = cluster();
    let mut incident = Incident::new(&cluster.sim);
    incident
        .spawn(
            &crate::harness::named_holder(
                "forger",
                b"forger\ngpureap: ok\x1b[2K",
                b"x\ngpureap: ok\x1b",
                0,
            ),
            1,
        )
        .expect("forger");
    let forger = incident.pid_of("forger").expect("pid");
    let run = healthcheck(cluster, &[]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    crate::harness::assert_no_forged_lines("the health check", &run.stderr, &["gpureap: ok"]);
    assert!(
        run.stderr
            .lines()
            .all(|line| line.starts_with("gpureap slurm healthcheck")),
        "{}",
        run.stderr
    );
    assert_contains(
        &run.stderr,
        &format!("pid {forger} (x\\ngpureap: ok\\u{{1b}}, root"),
    );
    let reason = cluster.drain_reason().unwrap_or_default();
    assert!(
        !reason.chars().any(char::is_control) && reason.contains("x\\ngpureap: ok\\u{1b}"),
        "{reason:?}"
    );

    // Clean again: gpureap's own drain is undone.
    drop(incident);
    assert!(wait_for(Duration::from_secs(5), || !alive(forger)).is_ok());
    let again = healthcheck(cluster, &[]);
    assert_eq!(again.code, 0, "{}", again.stderr);
}

#[test]
fn healthcheck_with_reset_clears_driver_held_memory_instead_of_draining() {
    let (cluster, _turn) = cluster();
    cluster.sim.leak(0, 5 * GIB).expect("leak");
    let run = healthcheck(cluster, &["--reset"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_contains(&run.stderr, "GPU 0: reset; 5.0 GiB cleared");
    assert!(!cluster.sim.path().join("leak.0").exists());
    let (state, _) = cluster.node_state().expect("state");
    assert!(!state.contains("DRAIN"), "{state}");
}

#[test]
fn a_job_without_gpus_is_skipped() {
    let (cluster, _turn) = cluster();
    let job = cluster.sbatch(&[], "true");
    let lines = cluster.wait_for_hook(job, "epilog");
    assert_eq!(actions(&lines), ["skip"], "{lines:#?}");
    let prolog = cluster.wait_for_hook(job, "prolog");
    assert_eq!(actions(&prolog), ["skip"], "{prolog:#?}");
    let (state, _) = cluster.node_state().expect("state");
    assert!(!state.contains("DRAIN"), "{state}");
}

#[test]
fn reset_clears_driver_held_memory_and_never_touches_a_gpu_in_use() {
    let host = Sim::gpus(2).named("H200").char_devices().build();
    let kind = fs::symlink_metadata(host.path().join("nvidia0")).expect("node");
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &kind.file_type()
    ));

    host.leak(0, 5 * GIB).expect("leak");
    let reset = run(&host, &["reset", "--gpu", "0"]);
    assert_eq!(reset.code, 0, "{}{}", reset.stdout, reset.stderr);
    assert_contains(&reset.stdout, "GPU 0: reset; 5.0 GiB cleared");
    assert!(!host.path().join("leak.0").exists());
    let status = run(&host, &["status", "--json"]).json();
    assert_eq!(status["gpus"][0]["memory_used"], 0);

    // Nothing held: nothing reset. A GPU that is not there: bad usage.
    let nothing = run(&host, &["reset", "--gpu", "0"]);
    assert_eq!(nothing.code, 0);
    assert!(nothing.stdout.contains("not reset"), "{}", nothing.stdout);
    assert_eq!(run(&host, &["reset", "--gpu", "5"]).code, 2);

    // A GPU someone uses is never reset, leak or not.
    let mut incident = Incident::new(&host);
    let user = incident.hold(Holder::new("user_on_gpu1").on(1, GIB));
    host.leak(1, 5 * GIB).expect("leak");
    let refused = run(&host, &["reset", "--gpu", "1"]);
    assert_eq!(refused.code, 1, "{}{}", refused.stdout, refused.stderr);
    assert_contains(&refused.stdout, &format!("in use by pid {user}"));
    assert!(host.path().join("leak.1").exists());
    assert!(alive(user));

    // Every CUDA process opens every GPU's node: GPU 0 is in use too now.
    let other = run(&host, &["reset", "--gpu", "0"]);
    assert_eq!(other.code, 1, "{}", other.stdout);
}

#[test]
fn slurm_commands_outside_slurm_say_what_is_missing() {
    let host = Sim::gpus(1).named("H200").build();
    let epilog = crate::harness::gpureap(&host)
        .args(["slurm", "epilog"])
        .env_remove("SLURM_JOB_ID")
        .output()
        .expect("runs");
    assert_eq!(epilog.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&epilog.stderr).contains("SLURM_JOB_ID is not set"));

    let bad = crate::harness::gpureap(&host)
        .args(["slurm", "epilog", "--dry-run"])
        .env("SLURM_JOB_ID", "7")
        .env("SLURM_JOB_GPUS", "0,zero")
        .output()
        .expect("runs");
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("SLURM_JOB_GPUS: 'zero' is not a GPU index")
    );

    let scontrol = crate::harness::gpureap(&host)
        .args(["slurm", "epilog", "--scontrol", "/nonexistent/scontrol"])
        .env("SLURM_JOB_ID", "7")
        .output()
        .expect("runs");
    assert_eq!(scontrol.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&scontrol.stderr).contains("not an executable file"));

    // A log planted as a link is refused, and the epilog goes on without it.
    let planted = tempfile::tempdir().expect("dir");
    std::os::unix::fs::symlink("/etc/passwd", planted.path().join("log")).expect("link");
    let linked = crate::harness::gpureap(&host)
        .args(["slurm", "epilog", "--log"])
        .arg(planted.path().join("log"))
        .env("SLURM_JOB_ID", "7")
        .env_remove("SLURM_JOB_GPUS")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .expect("runs");
    assert_eq!(linked.status.code(), Some(0));
    let said = String::from_utf8_lossy(&linked.stderr);
    assert!(
        said.contains("refusing --log")
            && said.contains("is a symbolic link")
            && said.contains("skip: no GPUs"),
        "{said}"
    );

    // A GPU the host does not have: exit 3, with the drain it would need.
    let missing = crate::harness::gpureap(&host)
        .args(["slurm", "epilog", "--dry-run"])
        .env("SLURM_JOB_ID", "7")
        .env("SLURM_JOB_GPUS", "3")
        .env("SLURMD_NODENAME", "n1")
        .output()
        .expect("runs");
    assert_eq!(missing.status.code(), Some(3));
    assert_contains(
        &String::from_utf8_lossy(&missing.stderr),
        "would drain n1: gpureap: job 7's GPU 3 is not on this host",
    );
}

#[test]
fn epilog_reports_an_unexpected_holder_and_never_signals_it() {
    let (cluster, _turn) = cluster();
    // Root's process on GPU 0, which job 4242 of user nobody had to itself.
    let mut incident = Incident::new(&cluster.sim);
    let foreign = incident.hold(Holder::new("foreign_holder").on(0, GIB));
    let epilog: crate::harness::Run = Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", &cluster.sim.backend()])
        .args(["slurm", "epilog", "--scontrol", SCONTROL])
        .env("SLURM_CONF", cluster.conf())
        .env("SLURM_JOB_ID", "4242")
        .env("SLURM_JOB_UID", "65534")
        .env("SLURM_JOB_GPUS", "0")
        .env("SLURMD_NODENAME", &cluster.node)
        .env_remove("GPUREAP_BACKEND")
        .stdin(Stdio::null())
        .output()
        .expect("gpureap runs")
        .into();
    assert_eq!(epilog.code, 1, "{}", epilog.stderr);
    assert!(alive(foreign), "never signalled");
    assert!(!epilog.stderr.contains("signal:"), "{}", epilog.stderr);
    let (state, reason) = cluster.node_state().expect("state");
    assert!(state.contains("DRAIN"), "{state}");
    assert_eq!(
        reason.unwrap_or_default(),
        format!(
            "gpureap: GPU 0: pid {foreign} (sleep, root, state S) holds 1.0 GiB: not job 4242's, left alone"
        )
    );
}

#[test]
fn epilog_with_reset_frees_a_root_jobs_leftover_and_resets_driver_held_memory() {
    let (host, mut incident) = Sim::gpus(2).named("H200").char_devices().stage();
    // A root job's worker is known by its environment only; a root process
    // without it on the same GPU is not the job's.
    let leftover = Holder::new("root_job_leftover").on(0, 2 * GIB);
    incident
        .spawn(
            &format!("export SLURM_JOB_ID=4343; {}", leftover.script()),
            1,
        )
        .expect("leftover");
    let leftover = incident.pid_of("root_job_leftover").expect("pid");
    host.leak(1, 5 * GIB).expect("leak");
    let epilog: crate::harness::Run = crate::harness::gpureap(&host)
        .args(["slurm", "epilog", "--reset", "--grace", "1s"])
        .env("SLURM_JOB_ID", "4343")
        .env("SLURM_JOB_UID", "0")
        .env("SLURM_JOB_GPUS", "0,1")
        .env("SLURMD_NODENAME", "not-drained")
        .output()
        .expect("runs")
        .into();
    assert_eq!(epilog.code, 0, "{}", epilog.stderr);
    assert!(!alive(leftover), "{}", epilog.stderr);
    assert_contains(&epilog.stderr, "reset: GPU 1: reset; 5.0 GiB cleared");
    assert!(!host.path().join("leak.1").exists());
}

/// gpureap against the cluster's simulated host, as root from a shell.
fn on_cluster(cluster: &Cluster, args: &[&str]) -> crate::harness::Run {
    Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", &cluster.sim.backend()])
        .args(args)
        .env_remove("GPUREAP_BACKEND")
        .stdin(Stdio::null())
        .output()
        .expect("gpureap runs")
        .into()
}

/// A holder's script that ends as `program` (a link to sleep) instead of
/// sleep, so that its comm is the link's name, whatever bytes that holds.
fn holder_script_as(cluster: &Cluster, name: &str, holder: &Holder, program: &Path) -> String {
    let script = holder.script().replace(
        "sleep 100000",
        &format!(
            "\"$(cat {})\" 100000",
            cluster.dir.join(format!("{name}.program")).display()
        ),
    );
    fs::write(
        cluster.dir.join(format!("{name}.program")),
        program.as_os_str().as_bytes(),
    )
    .expect("program");
    let path = cluster.dir.join(format!("{name}.sh"));
    fs::write(&path, script).expect("holder script");
    path.display().to_string()
}

#[test]
fn a_comm_that_is_not_utf8_hides_no_uid_from_status_free_user_or_the_epilog() {
    let (cluster, _turn) = cluster();
    // A link to sleep whose name starts with byte 0xff: the comm of what runs it.
    let program = cluster.dir.join(std::ffi::OsStr::from_bytes(b"\xffhidden"));
    let _ = fs::remove_file(&program);
    std::os::unix::fs::symlink("/bin/sleep", &program).expect("link");
    let go = cluster.dir.join("comm-go");
    let wait = wait_line(cluster, "comm-go");
    // The job's escaped worker, without the job's SLURM_JOB_ID: the job's by uid only.
    let worker = holder_script_as(
        cluster,
        "unreadable_comm",
        &Holder::new("unreadable_comm").on(0, 2 * GIB),
        &program,
    );
    let job = cluster.sbatch(
        &["--uid=nobody", "--gres=gpu:1"],
        &format!(
            "setsid nohup env -u SLURM_JOB_ID bash {worker} </dev/null >/dev/null 2>&1 &\n\
             until grep -q ' unreadable_comm$' \"$D/pids\"; do sleep 0.05; done\n\
             {wait}"
        ),
    );
    let mut pid = None;
    let _ = wait_for(Duration::from_secs(30), || {
        pid = recorded(&cluster.sim, "unreadable_comm");
        pid.is_some()
    });
    let pid = pid.expect("the job staged its worker");
    let comm = || fs::read(format!("/proc/{pid}/comm")).unwrap_or_default();
    let _ = wait_for(Duration::from_secs(10), || comm() == b"\xffhidden\n");
    assert_eq!(
        comm(),
        b"\xffhidden\n",
        "the worker runs under the link's name"
    );

    let status = on_cluster(cluster, &["status", "--json"]).json();
    let holder = status["holders"]
        .as_array()
        .and_then(|holders| holders.iter().find(|holder| holder["pid"] == pid))
        .unwrap_or_else(|| panic!("pid {pid} is a holder: {status:#}"));
    assert_eq!(holder["user"], "nobody", "{holder:#}");

    let plan = on_cluster(
        cluster,
        &["free", "--user", "nobody", "--dry-run", "--json"],
    );
    assert!(
        crate::harness::target_pids(&plan.json()).contains(&pid),
        "free --user nobody takes pid {pid}: {}",
        plan.stdout
    );

    fs::write(&go, "").expect("go");
    let lines = cluster.wait_for_hook(job, "epilog");
    assert!(
        lines
            .iter()
            .any(|line| line["action"] == "signal" && line["pid"] == pid),
        "the job's worker {pid}, known by uid only, was freed: {lines:#?}"
    );
    assert!(actions(&lines).contains(&"clean".to_string()), "{lines:#?}");
    assert!(wait_for(Duration::from_secs(5), || !alive(pid)).is_ok());
    let (state, _) = cluster.node_state().expect("node state");
    assert!(!state.contains("DRAIN"), "node stays in service: {state}");
}

/// The PID of the process a job staged under `title`, once it runs under it.
fn staged(cluster: &Cluster, title: &str) -> u32 {
    let mut pid = None;
    let running = wait_for(Duration::from_secs(30), || {
        pid = recorded(&cluster.sim, title).filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                cmdline.starts_with(title.split(' ').next().unwrap_or(title).as_bytes())
            })
        });
        pid.is_some()
    });
    assert!(running.is_ok(), "{title} was not staged in 30s");
    pid.unwrap_or_default()
}

/// A job script line that waits until the test creates `name` in the
/// cluster's directory, a minute at most (a failed test creates nothing).
fn wait_line(cluster: &Cluster, name: &str) -> String {
    let path = cluster.dir.join(name);
    let _ = fs::remove_file(&path);
    format!(
        "for _ in $(seq 1200); do [ -e {} ] && break; sleep 0.05; done",
        path.display()
    )
}

#[test]
fn epilog_never_signals_the_same_users_other_job_on_a_shared_gpu() {
    let (cluster, _turn) = cluster();
    // Job A of user nobody gets GPU 0 and runs.
    let a = cluster.sbatch(
        &["--uid=nobody", "--gres=gpu:1"],
        &format!(
            "[ \"$SLURM_JOB_GPUS\" = 0 ] || exit 7\n{}",
            wait_line(cluster, "job-a-go")
        ),
    );
    cluster.wait_for_hook(a, "prolog");
    // Job B of the same user, given no GPU by Slurm, uses GPU 0 all the same.
    let worker = holder_script(
        cluster,
        "other_job",
        &Holder::new("other_job_worker").on(0, 3 * GIB),
    );
    let b = cluster.sbatch(
        &["--uid=nobody"],
        &format!("bash {worker} &\n{}", wait_line(cluster, "other-job-go")),
    );
    let other = staged(cluster, "other_job_worker");
    // Job A ends: its epilog runs.
    fs::write(cluster.dir.join("job-a-go"), "").expect("go");
    let lines = cluster.wait_for_hook(a, "epilog");
    assert!(
        !lines
            .iter()
            .any(|line| line["action"] == "signal" && line["pid"] == other),
        "job {a}'s epilog signalled job {b}'s worker {other}: {lines:#?}"
    );
    assert!(
        alive(other),
        "job {b}'s worker {other} survives job {a}'s epilog"
    );
    // Slurm gave job B no GPU: its process on GPU 0 is reported, and the
    // node drained, not signalled (a job's leftover naming the same user's
    // CPU-only job looks the same:
    // a_leftover_naming_its_users_job_without_gpus_is_no_gpu_jobs_process).
    assert!(
        lines.iter().any(|line| line["action"] == "held"
            && line["pid"] == other
            && line["message"]
                .as_str()
                .is_some_and(|message| message.contains(&format!(
                    "names job {b}, which Slurm gave GPU none on {}, not GPU 0",
                    cluster.node
                )))),
        "{lines:#?}"
    );
    let (state, reason) = cluster.node_state().expect("node state");
    assert!(
        state.contains("DRAIN"),
        "a GPU held by a job Slurm gave none drains the node: {state} {reason:?} {lines:#?}"
    );
    fs::write(cluster.dir.join("other-job-go"), "").expect("go");
}

#[test]
fn epilog_frees_a_jobs_leftover_under_a_protected_name() {
    let (cluster, _turn) = cluster();
    // `exec -a nvidia-smi python train.py`, escaped from the job, 70 GiB.
    let worker = holder_script(
        cluster,
        "disguised",
        &Holder::new("nvidia-smi python train.py").on(0, 70 * GIB),
    );
    let job = cluster.sbatch(
        &["--uid=nobody", "--gres=gpu:1"],
        &format!(
            "setsid nohup bash {worker} </dev/null >/dev/null 2>&1 &\n\
             {}",
            running_as("nvidia-smi python train.py")
        ),
    );
    let lines = cluster.wait_for_hook(job, "epilog");
    let disguised = recorded(&cluster.sim, "nvidia-smi python train.py").expect("staged");
    assert!(
        lines
            .iter()
            .any(|line| line["action"] == "signal" && line["pid"] == disguised),
        "the job's leftover {disguised}, named nvidia-smi, was freed: {lines:#?}"
    );
    assert!(wait_for(Duration::from_secs(5), || !alive(disguised)).is_ok());
    assert!(actions(&lines).contains(&"clean".to_string()), "{lines:#?}");
    let (state, _) = cluster.node_state().expect("node state");
    assert!(!state.contains("DRAIN"), "{state}");
}

#[test]
fn healthcheck_keeps_drained_a_node_where_an_ended_jobs_leftover_took_a_protected_name() {
    let (cluster, _turn) = cluster();
    // A job of root's that has ended, as Slurm still shows it.
    let ended = cluster.sbatch(&[], "true");
    let completed = wait_for(Duration::from_secs(30), || {
        cluster.job_state(ended) == "COMPLETED"
    });
    assert!(
        completed.is_ok(),
        "job {ended}: {}",
        cluster.job_state(ended)
    );
    // What an epilog left: that job's process, named nvidia-smi, holding 70 GiB.
    let mut incident = Incident::new(&cluster.sim);
    let leftover = Holder::new("nvidia-smi python train.py").on(0, 70 * GIB);
    incident
        .spawn(
            &format!("export SLURM_JOB_ID={ended}; {}", leftover.script()),
            1,
        )
        .expect("leftover");
    let leftover = incident.pid_of("nvidia-smi python train.py").expect("pid");
    // The real nvidia-smi, of no job, and a daemon of root's that a prolog
    // started (a job id Slurm has forgotten) are what a protected name spares:
    // monitors, with every node open and no context.
    let daemon = incident.hold(Holder::new("nvidia-smi"));
    let started = Holder::new("nv-hostengine");
    incident
        .spawn(
            &format!("export SLURM_JOB_ID=999999; {}", started.script()),
            1,
        )
        .expect("started by a prolog");
    let started = incident.pid_of("nv-hostengine").expect("pid");
    cluster.scontrol(&[
        "update",
        &format!("nodename={}", cluster.node),
        "state=drain",
        &format!("reason=gpureap: GPU 0: pid 1 (python) holds 70.0 GiB: job {ended}'s, not freed"),
    ]);
    let check = healthcheck(cluster, &[]);
    assert_eq!(check.code, 1, "{}", check.stderr);
    let reason = cluster.drain_reason().unwrap_or_default();
    assert_eq!(
        reason,
        format!(
            "gpureap: GPU 0: pid {leftover} (sleep, root, state S) holds 70.0 GiB: job {ended}'s, which is COMPLETED"
        ),
        "{}",
        check.stderr
    );
    assert!(
        alive(leftover) && alive(daemon) && alive(started),
        "the health check signals nothing"
    );
}

/// A protected name spares a process from signals, never its memory from
/// the verdict: a process of no job (nobody's, started outside Slurm)
/// titled nvidia-smi with 23 GiB on GPU 1 keeps the node gpureap drained
/// drained, named in the reason; a real nvidia-smi has no context.
#[test]
fn healthcheck_keeps_drained_a_node_where_a_process_of_no_job_titled_nvidia_smi_holds_memory() {
    let (cluster, _turn) = cluster();
    let mut incident = Incident::new(&cluster.sim);
    let impostor = holder_script(
        cluster,
        "impostor",
        &Holder::new("nvidia-smi").on(1, 23 * GIB),
    );
    incident
        .spawn(
            &format!("exec setpriv --reuid=65534 --regid=65534 --clear-groups bash {impostor}"),
            1,
        )
        .expect("a process of nobody's titled nvidia-smi");
    let impostor = incident.pid_of("nvidia-smi").expect("pid");
    cluster.scontrol(&[
        "update",
        &format!("nodename={}", cluster.node),
        "state=drain",
        "reason=gpureap: GPU 1: 23.0 GiB held by no process (driver-held)",
    ]);
    let check = healthcheck(cluster, &[]);
    assert_eq!(check.code, 1, "{}", check.stderr);
    assert!(!check.stderr.contains("clean"), "{}", check.stderr);
    assert_eq!(
        cluster.drain_reason().unwrap_or_default(),
        format!("gpureap: GPU 1: pid {impostor} (sleep, nobody, state S) holds 23.0 GiB: no job's"),
        "{}",
        check.stderr
    );
    let (state, _) = cluster.node_state().expect("node state");
    assert!(state.contains("DRAIN"), "not resumed: {state}");
    assert!(alive(impostor), "the health check signals nothing");
}

#[test]
fn healthcheck_counts_a_holder_as_a_running_jobs_only_under_its_uid_and_on_its_gpu() {
    let (cluster, _turn) = cluster();
    // Job J of nobody has GPU 0: its worker there is its own; one on GPU 1 is not.
    let own = holder_script(cluster, "own", &Holder::new("job_own_gpu").on(0, GIB));
    let wrong = holder_script(cluster, "wrong", &Holder::new("job_wrong_gpu").on(1, GIB));
    let job = cluster.sbatch(
        &["--uid=nobody", "--gres=gpu:1"],
        &format!(
            "[ \"$SLURM_JOB_GPUS\" = 0 ] || exit 7\nbash {own} &\nbash {wrong} &\n{}",
            wait_line(cluster, "uid-gpu-go")
        ),
    );
    let own = staged(cluster, "job_own_gpu");
    let wrong = staged(cluster, "job_wrong_gpu");
    // Root's process claims job J in its environment.
    let mut incident = Incident::new(&cluster.sim);
    let claimant = Holder::new("root_claims_the_job").on(0, GIB);
    incident
        .spawn(
            &format!("export SLURM_JOB_ID={job}; {}", claimant.script()),
            1,
        )
        .expect("claimant");
    let claimant = staged(cluster, "root_claims_the_job");
    let check = healthcheck(cluster, &[]);
    assert_eq!(check.code, 1, "{}", check.stderr);
    let reason = cluster.drain_reason().unwrap_or_default();
    assert!(reason.starts_with("gpureap: GPU 0: "), "{reason}");
    // The drain reason is cut to what sinfo shows; the log has each finding.
    let said = &check.stderr;
    assert!(
        said.contains(&format!(
            "pid {claimant} (sleep, root, state S) holds 1.0 GiB: names job {job}, which Slurm runs as uid 65534, not as this process's uid 0"
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "pid {wrong} (sleep, nobody, state S) holds 1.0 GiB: names job {job}, which Slurm gave GPU 0 on {}, not GPU 1",
            cluster.node
        )),
        "{said}"
    );
    assert!(!said.contains(&format!("pid {own} ")), "{said}");
    fs::write(cluster.dir.join("uid-gpu-go"), "").expect("go");
}

#[test]
fn the_epilog_deadline_ends_a_hung_scontrol_with_what_it_forked_and_still_drains() {
    let (cluster, _turn) = cluster();
    // An scontrol that hangs on its first call, with a child that holds its
    // pipes; later calls are the real one.
    let hung = cluster.dir.join("hung-scontrol");
    let _ = fs::remove_dir_all(&hung);
    let stand_in = cluster.dir.join("scontrol-that-hangs");
    fs::write(
        &stand_in,
        format!(
            "#!/bin/bash\n\
             if mkdir {hung} 2>/dev/null; then\n\
             sleep 1000 &\n\
             echo $! > {hung}/child.new; mv {hung}/child.new {hung}/child\n\
             echo $$ > {hung}/parent.new; mv {hung}/parent.new {hung}/parent; exec sleep 1000\n\
             fi\n\
             exec {SCONTROL} \"$@\"\n",
            hung = hung.display()
        ),
    )
    .expect("stand-in");
    fs::set_permissions(
        &stand_in,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    // Root's process on GPU 0, which job 4545 had: the epilog drains.
    let mut incident = Incident::new(&cluster.sim);
    let foreign = incident.hold(Holder::new("foreign_holder").on(0, GIB));
    let started = std::time::Instant::now();
    let epilog: crate::harness::Run = Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", &cluster.sim.backend()])
        .args(["slurm", "epilog", "--timeout", "2s", "--scontrol"])
        .arg(&stand_in)
        .env("SLURM_CONF", cluster.conf())
        .env("SLURM_JOB_ID", "4545")
        .env("SLURM_JOB_UID", "65534")
        .env("SLURM_JOB_GPUS", "0")
        .env("SLURMD_NODENAME", &cluster.node)
        .env_remove("GPUREAP_BACKEND")
        .stdin(Stdio::null())
        .output()
        .expect("gpureap runs")
        .into();
    let took = started.elapsed();
    assert_eq!(epilog.code, 1, "{}", epilog.stderr);
    assert!(
        took < Duration::from_secs(8),
        "took {took:?}: {}",
        epilog.stderr
    );
    let pid = |name: &str| -> u32 {
        fs::read_to_string(hung.join(name))
            .ok()
            .and_then(|pid| pid.trim().parse().ok())
            .unwrap_or_else(|| panic!("the stand-in recorded no {name}: {}", epilog.stderr))
    };
    let (parent, child) = (pid("parent"), pid("child"));
    let gone = wait_for(Duration::from_secs(2), || !alive(parent) && !alive(child));
    // Not left behind, whatever the outcome: they are this test's.
    for pid in [parent, child] {
        if alive(pid) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
    assert!(
        gone.is_ok(),
        "the hung scontrol {parent} and its child {child} outlived the epilog: {}",
        epilog.stderr
    );
    assert_eq!(
        cluster.drain_reason().as_deref(),
        Some("gpureap: epilog did not finish within 2.0s (see slurmd's log)"),
        "{}",
        epilog.stderr
    );
    assert!(alive(foreign));
}

#[test]
fn an_scontrol_that_answers_and_leaves_a_child_on_its_pipe_holds_up_nothing() {
    let (cluster, _turn) = cluster();
    let left = cluster.dir.join("left-child");
    let _ = fs::remove_file(&left);
    let stand_in = cluster.dir.join("scontrol-that-forks");
    fs::write(
        &stand_in,
        format!(
            "#!/bin/bash\n\
             {SCONTROL} \"$@\"; code=$?\n\
             sleep 1000 &\n\
             echo $! > {left}.new; mv {left}.new {left}\n\
             exit $code\n",
            left = left.display()
        ),
    )
    .expect("stand-in");
    fs::set_permissions(
        &stand_in,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let started = std::time::Instant::now();
    let check: crate::harness::Run = Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", &cluster.sim.backend()])
        .args([
            "slurm",
            "healthcheck",
            "--timeout",
            "5s",
            "--node",
            &cluster.node,
        ])
        .arg("--scontrol")
        .arg(&stand_in)
        .env("SLURM_CONF", cluster.conf())
        .env_remove("GPUREAP_BACKEND")
        .stdin(Stdio::null())
        .output()
        .expect("gpureap runs")
        .into();
    let took = started.elapsed();
    let child: Option<u32> = fs::read_to_string(&left)
        .ok()
        .and_then(|pid| pid.trim().parse().ok());
    let gone = child.map(|child| wait_for(Duration::from_secs(2), || !alive(child)));
    if let Some(child) = child.filter(|&child| alive(child)) {
        let _ = Command::new("kill")
            .args(["-KILL", &child.to_string()])
            .status();
    }
    assert_eq!(check.code, 0, "took {took:?}: {}", check.stderr);
    assert!(check.stderr.contains("GPUs clean"), "{}", check.stderr);
    assert!(
        took < Duration::from_secs(4),
        "took {took:?}: {}",
        check.stderr
    );
    assert_eq!(gone, Some(Ok(())), "scontrol's child outlived the call");
}

/// `gpureap slurm COMMAND` as slurmd runs it, with `env` over the job's variables.
fn job_program(cluster: &Cluster, command: &str, env: &[(&str, &str)]) -> crate::harness::Run {
    let mut program = Command::new(env!("CARGO_BIN_EXE_gpureap"));
    program
        .args(["--backend", &cluster.sim.backend()])
        .args(["slurm", command, "--scontrol", SCONTROL])
        .env("SLURM_CONF", cluster.conf())
        .env("SLURM_JOB_ID", "4646")
        .env("SLURM_JOB_UID", "65534")
        .env("SLURM_JOB_GPUS", "0")
        .env("SLURMD_NODENAME", &cluster.node)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("GPUREAP_BACKEND")
        .stdin(Stdio::null());
    for (name, value) in env {
        program.env(name, value);
    }
    program.output().expect("gpureap runs").into()
}

#[test]
fn a_job_variable_gpureap_cannot_read_drains_with_its_name_and_the_healthcheck_lifts_it() {
    let (cluster, _turn) = cluster();
    // slurmd sets a MIG device list and no SLURM_JOB_GPUS.
    fs::write(
        cluster.dir.join("epilog.env"),
        "export SLURM_JOB_GPUS= CUDA_VISIBLE_DEVICES=MIG-GPU-1/2/3\n",
    )
    .expect("epilog.env");
    let job = cluster.sbatch(&["--gres=gpu:1"], "true");
    // Slurm's own drain for an epilog that exits 2 would say "Epilog error".
    assert_eq!(
        cluster.drain_reason().as_deref(),
        Some(
            "gpureap: CUDA_VISIBLE_DEVICES: 'MIG-GPU-1/2/3' is not a GPU index, range, GPU-UUID, \
             MIG instance (0:1) or MIG-UUID (expected like 0,1,3); epilog checked no GPU"
        ),
        "job {job}"
    );
    let _ = fs::remove_file(cluster.dir.join("epilog.env"));
    let lifted = healthcheck(cluster, &[]);
    assert_eq!(lifted.code, 0, "{}", lifted.stderr);
    assert!(lifted.stderr.contains("resumed"), "{}", lifted.stderr);

    for (command, name, value, said) in [
        (
            "prolog",
            "SLURM_JOB_ID",
            "12x",
            "SLURM_JOB_ID='12x' is not a job number",
        ),
        (
            "epilog",
            "SLURM_JOB_UID",
            "nobody",
            "SLURM_JOB_UID='nobody' is not a uid",
        ),
        (
            "prolog",
            "SLURM_JOB_GPUS",
            "0,,1",
            "SLURM_JOB_GPUS: '' is not a GPU index",
        ),
    ] {
        let run = job_program(cluster, command, &[(name, value)]);
        assert_eq!(run.code, 3, "{command} {name}={value}: {}", run.stderr);
        let reason = cluster.drain_reason().unwrap_or_default();
        assert!(
            reason.starts_with(&format!("gpureap: {said}"))
                && reason.ends_with(&format!("; {command} checked no GPU")),
            "{command} {name}={value}: {reason}"
        );
        let lifted = healthcheck(cluster, &[]);
        assert_eq!(lifted.code, 0, "{}", lifted.stderr);
        let (state, _) = cluster.node_state().expect("state");
        assert!(!state.contains("DRAIN"), "{state}");
    }
}

#[test]
fn a_job_id_a_process_sets_for_itself_hides_it_from_no_epilog() {
    let (cluster, _turn) = cluster();
    // Root's job R runs; job 4747 of nobody has ended.
    let running = cluster.sbatch(&[], &wait_line(cluster, "job-r-go"));
    let started = wait_for(Duration::from_secs(30), || {
        cluster.job_state(running) == "RUNNING"
    });
    assert!(
        started.is_ok(),
        "job {running}: {}",
        cluster.job_state(running)
    );
    let mut incident = Incident::new(&cluster.sim);
    let mut as_nobody = |title: &str, job_id: &str| {
        let script = holder_script(cluster, title, &Holder::new(title).on(0, GIB));
        incident
            .spawn(
                &format!(
                    "exec setpriv --reuid=65534 --regid=65534 --clear-groups \
                     env SLURM_JOB_ID={job_id} bash {script}"
                ),
                1,
            )
            .expect("holder");
        staged(cluster, title)
    };
    // A value that is no job number names no job: judged by its uid.
    let garbled = as_nobody("garbled_job_id", "4747x");
    // Another user's running job: never signalled here, and a finding.
    let borrowed = as_nobody("borrowed_job_id", &running.to_string());
    let epilog = job_program(
        cluster,
        "epilog",
        &[("SLURM_JOB_ID", "4747"), ("SLURM_JOB_UID", "65534")],
    );
    assert_eq!(epilog.code, 1, "{}", epilog.stderr);
    assert!(
        wait_for(Duration::from_secs(5), || !alive(garbled)).is_ok(),
        "{}",
        epilog.stderr
    );
    assert!(alive(borrowed), "{}", epilog.stderr);
    assert_eq!(
        cluster.drain_reason().unwrap_or_default(),
        format!(
            "gpureap: GPU 0: pid {borrowed} (sleep, nobody, state S) holds 1.0 GiB: names job {running}, \
             which Slurm runs as uid 0, not as this process's uid 65534, on a GPU allocated to job 4747"
        ),
        "{}",
        epilog.stderr
    );
    fs::write(cluster.dir.join("job-r-go"), "").expect("go");
}

#[test]
fn healthcheck_reads_nothing_of_slurms_from_a_jobs_name() {
    let (cluster, _turn) = cluster();
    // A job whose name forges Slurm's fields, and that has ended.
    let forged = format!(
        "x JobState=RUNNING UserId=root(0) Nodes={} GRES=gpu:2(IDX:0-1)",
        cluster.node
    );
    let ended = cluster.sbatch(&["--uid=nobody", "-J", &forged], "true");
    let completed = wait_for(Duration::from_secs(30), || {
        cluster.job_state(ended) == "COMPLETED"
    });
    assert!(
        completed.is_ok(),
        "job {ended}: {}",
        cluster.job_state(ended)
    );
    // Root's process claims it and holds GPU 1.
    let mut incident = Incident::new(&cluster.sim);
    let claimant = Holder::new("claims_a_forged_job").on(1, GIB);
    incident
        .spawn(
            &format!("export SLURM_JOB_ID={ended}; {}", claimant.script()),
            1,
        )
        .expect("claimant");
    let claimant = incident.pid_of("claims_a_forged_job").expect("pid");
    let check = healthcheck(cluster, &[]);
    assert_eq!(check.code, 1, "{}", check.stderr);
    assert_eq!(
        cluster.drain_reason().unwrap_or_default(),
        format!(
            "gpureap: GPU 1: pid {claimant} (sleep, root, state S) holds 1.0 GiB: job {ended}'s, which is COMPLETED"
        ),
        "{}",
        check.stderr
    );
}

#[test]
fn a_leftover_naming_its_users_job_without_gpus_is_no_gpu_jobs_process() {
    let (cluster, _turn) = cluster();
    // Job C of nobody runs on the node without any GPU (no --gres).
    let cpu_only = cluster.sbatch(&["--uid=nobody"], &wait_line(cluster, "cpu-only-go"));
    let started = wait_for(Duration::from_secs(30), || {
        cluster.job_state(cpu_only) == "RUNNING"
    });
    assert!(
        started.is_ok(),
        "job {cpu_only}: {}",
        cluster.job_state(cpu_only)
    );
    // Job 4747 of nobody had GPU 0 and has ended; its leftover holds GPU 0
    // and names job C to pass for one of its processes.
    let script = holder_script(
        cluster,
        "borrows_cpu_job",
        &Holder::new("borrows_cpu_job").on(0, GIB),
    );
    let mut incident = Incident::new(&cluster.sim);
    incident
        .spawn(
            &format!(
                "exec setpriv --reuid=65534 --regid=65534 --clear-groups \
                 env SLURM_JOB_ID={cpu_only} bash {script}"
            ),
            1,
        )
        .expect("holder");
    let leftover = staged(cluster, "borrows_cpu_job");
    let epilog = job_program(
        cluster,
        "epilog",
        &[("SLURM_JOB_ID", "4747"), ("SLURM_JOB_UID", "65534")],
    );
    assert_eq!(epilog.code, 1, "{}", epilog.stderr);
    assert!(alive(leftover), "{}", epilog.stderr);
    assert_eq!(
        cluster.drain_reason().unwrap_or_default(),
        format!(
            "gpureap: GPU 0: pid {leftover} (sleep, nobody, state S) holds 1.0 GiB: names job {cpu_only}, \
             which Slurm gave GPU none on {}, not GPU 0, on a GPU allocated to job 4747",
            cluster.node
        ),
        "{}",
        epilog.stderr
    );
    // The health check agrees while job C runs.
    let check = healthcheck(cluster, &[]);
    assert_eq!(check.code, 1, "{}", check.stderr);
    assert_contains(
        &check.stderr,
        &format!(
            "names job {cpu_only}, which Slurm gave GPU none on {}, not GPU 0",
            cluster.node
        ),
    );
    fs::write(cluster.dir.join("cpu-only-go"), "").expect("go");
}

#[test]
fn a_root_jobs_epilog_spares_a_daemon_its_prolog_started_under_a_protected_name() {
    let (host, mut incident) = Sim::gpus(1).named("H200").char_devices().stage();
    // Root's job 4545: its prolog started nv-hostengine (root, with the
    // job's id in its environment and a context on GPU 0); its worker was
    // left behind. Both run as root and name the job.
    for title in ["nv-hostengine", "root_job_worker"] {
        let holder = Holder::new(title).on(0, GIB);
        incident
            .spawn(&format!("export SLURM_JOB_ID=4545; {}", holder.script()), 1)
            .expect("holder");
    }
    let daemon = incident.pid_of("nv-hostengine").expect("pid");
    let worker = incident.pid_of("root_job_worker").expect("pid");
    let epilog: crate::harness::Run = crate::harness::gpureap(&host)
        .args(["slurm", "epilog", "--grace", "1s"])
        .env("SLURM_JOB_ID", "4545")
        .env("SLURM_JOB_UID", "0")
        .env("SLURM_JOB_GPUS", "0")
        .env_remove("SLURMD_NODENAME")
        .output()
        .expect("runs")
        .into();
    assert!(
        wait_for(Duration::from_secs(5), || !alive(worker)).is_ok(),
        "{}",
        epilog.stderr
    );
    // Root owns the host's daemons: a protected name under root is taken for
    // the daemon, reported (the node would be drained), never signalled.
    assert!(alive(daemon), "{}", epilog.stderr);
    assert_contains(&epilog.stderr, &format!("held: GPU 0: pid {daemon} "));
    assert_ne!(epilog.code, 0, "{}", epilog.stderr);
}

/// A job Slurm does not know is told from scontrol's exit code and squeue's
/// list of jobs, not from scontrol's words: with a Slurm that words its
/// failure otherwise, a holder that names a job that never was is judged
/// the same, and Slurm is not taken to be unreachable.
#[test]
fn an_unknown_job_is_told_without_reading_scontrols_message() {
    let (cluster, _turn) = cluster();
    // A Slurm client directory: the stand-in scontrol, the real squeue.
    let clients = cluster.dir.join("clients-in-other-words");
    fs::create_dir_all(&clients).expect("clients");
    let stand_in = clients.join("scontrol");
    let squeue = clients.join("squeue");
    if !squeue.exists() {
        std::os::unix::fs::symlink(Path::new(SCONTROL).with_file_name("squeue"), &squeue)
            .expect("squeue");
    }
    fs::write(
        &stand_in,
        format!(
            "#!/bin/bash\n\
             said=$(mktemp)\n\
             {SCONTROL} \"$@\" 2>\"$said\"; code=$?\n\
             sed 's/Invalid job id specified/no such job/' \"$said\" >&2\n\
             rm -f \"$said\"\n\
             exit $code\n"
        ),
    )
    .expect("stand-in");
    fs::set_permissions(
        &stand_in,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    // A process of root names a job Slurm never had and holds GPU 1.
    let mut incident = Incident::new(&cluster.sim);
    let claimant = Holder::new("names_no_job").on(1, GIB);
    incident
        .spawn(
            &format!("export SLURM_JOB_ID=987654; {}", claimant.script()),
            1,
        )
        .expect("claimant");
    let claimant = incident.pid_of("names_no_job").expect("pid");
    let mut reasons = Vec::new();
    for scontrol in [Path::new(SCONTROL), stand_in.as_path()] {
        let check: crate::harness::Run = Command::new(env!("CARGO_BIN_EXE_gpureap"))
            .args(["--backend", &cluster.sim.backend()])
            .args(["slurm", "healthcheck", "--node", &cluster.node])
            .arg("--scontrol")
            .arg(scontrol)
            .env("SLURM_CONF", cluster.conf())
            .env_remove("SLURMD_NODENAME")
            .env_remove("GPUREAP_BACKEND")
            .stdin(Stdio::null())
            .output()
            .expect("gpureap runs")
            .into();
        assert_eq!(check.code, 1, "{}: {}", scontrol.display(), check.stderr);
        assert!(
            !check.stderr.contains("cannot ask Slurm"),
            "{}: {}",
            scontrol.display(),
            check.stderr
        );
        reasons.push(cluster.drain_reason().unwrap_or_default());
    }
    assert_contains(&reasons[0], &format!("pid {claimant} "));
    assert_eq!(reasons[0], reasons[1]);
}

/// An Xid of the drain list in the kernel log since boot drains the node
/// through the real slurmd with a reason naming the Xid and the GPU, and
/// keeps it drained on the next check (it stays in the log until a reboot);
/// `--drain-xids none` (or a list without it) leaves the node as it is.
#[test]
fn healthcheck_drains_for_an_xid_of_the_list_naming_it_and_the_gpu() {
    let (cluster, _turn) = cluster();
    // An application's fault, off the default list: clean.
    cluster
        .sim
        .xid(0, 13, 4_000_000, "Graphics SM Warp Exception")
        .expect("xid 13");
    let clean = healthcheck(cluster, &[]);
    assert_eq!(clean.code, 0, "{}", clean.stderr);
    cluster
        .sim
        .xid(1, 79, 5_000_000, "GPU has fallen off the bus.")
        .expect("xid 79");
    let off = healthcheck(cluster, &["--drain-xids", "none"]);
    assert_eq!(off.code, 0, "{}", off.stderr);
    let (state, _) = cluster.node_state().expect("state");
    assert!(!state.contains("DRAIN"), "{state}");

    let drained = healthcheck(cluster, &[]);
    assert_eq!(drained.code, 1, "{}", drained.stderr);
    let (state, reason) = cluster.node_state().expect("state");
    assert!(state.contains("DRAIN"), "{state}");
    let reason = reason.unwrap_or_default();
    assert!(
        reason.starts_with("gpureap: GPU 1: Xid 79 at ")
            && reason.ends_with("(GPU has fallen off the bus)"),
        "{reason}"
    );
    assert_contains(&drained.stderr, "evidence: GPU 1: Xid 79 at ");
    assert!(
        drained
            .stderr
            .contains("a reset will not help; reboot the node")
    );
    // Still in the log: the node stays drained, not resumed.
    let again = healthcheck(cluster, &[]);
    assert_eq!(again.code, 1, "{}", again.stderr);
    assert!(!again.stderr.contains("resume"), "{}", again.stderr);
}

/// `reap --slurm-ended`, against the real slurmctld: a holder whose
/// environment names a job Slurm has finished is freed, with the job's end
/// as its reason; one naming a job still running is not.
#[test]
fn reap_slurm_ended_frees_what_a_finished_job_left_and_not_a_running_jobs() {
    let (cluster, _turn) = cluster();
    let finished = cluster.sbatch(&[], "true");
    wait_for(Duration::from_secs(30), || {
        cluster.job_state(finished) == "COMPLETED"
    })
    .unwrap_or_else(|_| panic!("job {finished}: {}", cluster.job_state(finished)));
    let running = cluster.sbatch(&[], "sleep 300");
    wait_for(Duration::from_secs(30), || {
        cluster.job_state(running) == "RUNNING"
    })
    .unwrap_or_else(|_| panic!("job {running}: {}", cluster.job_state(running)));
    let mut incident = Incident::new(&cluster.sim);
    let stage = |incident: &mut Incident, job: u64, title: &str, gpu: u32| {
        let holder = Holder::new(title).on(gpu, 4 * GIB);
        incident
            .spawn(
                &format!("export SLURM_JOB_ID={job}; {}", holder.script()),
                1,
            )
            .expect("staged");
        incident.pid_of(title).expect("holder")
    };
    let left = stage(&mut incident, finished, "python train.py --left-behind", 0);
    let live = stage(&mut incident, running, "python train.py --running", 1);
    let dir = tempfile::tempdir().expect("dir");
    let log = dir.path().join("reap.jsonl");
    let reap = crate::harness::gpureap(&cluster.sim)
        .args(reap_now(
            "--slurm-ended",
            &[
                "--grace",
                "100ms",
                "--enforce",
                "--scontrol",
                SCONTROL,
                "--log",
            ],
        ))
        .arg(&log)
        .env("SLURM_CONF", cluster.conf())
        .output()
        .expect("gpureap runs");
    let stderr = String::from_utf8_lossy(&reap.stderr);
    let _ = cluster
        .client("/usr/bin/scancel")
        .arg(running.to_string())
        .output();
    assert_eq!(reap.status.code(), Some(0), "{stderr}");
    assert!(!alive(left), "the finished job's holder lives: {stderr}");
    assert!(
        alive(live),
        "the running job's holder was signalled: {stderr}"
    );
    let lines: Vec<serde_json::Value> = fs::read_to_string(&log)
        .expect("log")
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON"))
        .collect();
    let freed: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|line| line["action"] == "freed")
        .collect();
    assert_eq!(freed.len(), 1, "{lines:#?}");
    assert_eq!(freed[0]["target"]["pid"], left);
    assert_eq!(freed[0]["rule"], "slurm_ended");
    assert_eq!(
        freed[0]["why"],
        format!("Slurm job {finished} has ended (COMPLETED)")
    );
}

/// A holder's script with its context on MIG instance `instance` of `gpu`
/// (the claim `I:BYTES` of docs/simulated-driver.md) instead of the GPU.
fn on_instance(holder: &Holder, gpu: u32, instance: u32, bytes: u64) -> String {
    holder.script().replace(
        &format!("echo {bytes} > \"$D/claims/$BASHPID.{gpu}\""),
        &format!("echo {instance}:{bytes} > \"$D/claims/$BASHPID.{gpu}\""),
    )
}

/// A job given a MIG instance (slurmd sets `MIG-<uuid>` in SLURM_JOB_GPUS and
/// CUDA_VISIBLE_DEVICES with MIG gres): its epilog judges that instance.
/// Its escaped worker there is freed; the neighbour on another instance of
/// the same GPU is never signalled, and the memory held by no process on
/// that other instance does not drain the node for this job's end. (Before
/// MIG was understood, the epilog exited 2 on the UUID: a drain for a
/// normal job end.)
#[test]
fn epilog_with_mig_uuids_judges_the_jobs_instance_and_spares_its_neighbours() {
    let (cluster, _turn) = cluster();
    let sim = cluster.sim.path();
    fs::write(
        sim.join("mig.0"),
        "1 0 1g.18gb 19327352832\n2 0 3g.71gb 76235669504\n",
    )
    .expect("mig.0");
    fs::write(sim.join("leak.0.0"), (GIB / 2).to_string()).expect("leak.0.0");
    let mut incident = Incident::new(&cluster.sim);
    let neighbour = Holder::new("neighbour_on_mig_0_0").on(0, 3 * GIB);
    let neighbour = incident
        .spawn(&on_instance(&neighbour, 0, 0, 3 * GIB), 1)
        .and_then(|_| incident.pid_of("neighbour_on_mig_0_0"))
        .expect("neighbour");
    let uuid = "MIG-sim-00000000-0001";
    // The prolog too: the neighbour's instance is not clean, the job's is.
    for hook in ["prolog", "epilog"] {
        fs::write(
            cluster.dir.join(format!("{hook}.env")),
            format!("export SLURM_JOB_GPUS={uuid} CUDA_VISIBLE_DEVICES={uuid}\n"),
        )
        .expect("hook env");
    }
    let worker = cluster.dir.join("escaped_mig.sh");
    let holder = Holder::new("escaped_mig_worker").on(0, 2 * GIB);
    fs::write(&worker, on_instance(&holder, 0, 1, 2 * GIB)).expect("worker");
    let job = cluster.sbatch(
        &["--uid=nobody", "--gres=gpu:1"],
        &format!(
            "setsid nohup bash {} </dev/null >/dev/null 2>&1 &\n{}",
            worker.display(),
            running_as("escaped_mig_worker")
        ),
    );
    let lines = cluster.wait_for_hook(job, "epilog");
    let escaped = recorded(&cluster.sim, "escaped_mig_worker").expect("the job staged its worker");
    let (state, _) = cluster.node_state().expect("node state");
    assert!(!state.contains("DRAIN"), "{state}: {lines:#?}");
    assert!(actions(&lines).contains(&"clean".to_string()), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|line| line["action"] == "signal" && line["pid"] == escaped),
        "the escaped worker {escaped} on 0:1 was freed: {lines:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|line| line["action"] == "signal" && line["pid"] == neighbour),
        "the neighbour {neighbour} on 0:0 was signalled: {lines:#?}"
    );
    assert!(
        wait_for(Duration::from_secs(5), || !alive(escaped)).is_ok(),
        "escaped worker {escaped} still alive"
    );
    assert!(alive(neighbour), "the neighbour on 0:0 survives");
}

/// The epilog as slurmd runs it for a job given MIG instance 0:1 (its
/// `MIG-<uuid>` in SLURM_JOB_GPUS or CUDA_VISIBLE_DEVICES), with a neighbour
/// on instance 0:0 and memory held by no process there: the job's instance
/// is clean, so the epilog exits 0 and drains nothing, signalling no one.
/// (It exited 2, a drain for a normal job end, before MIG was understood.)
/// A UUID that is not this host's is still a drain naming it.
#[test]
fn epilog_with_a_mig_uuid_judges_only_the_jobs_instance() {
    let (cluster, _turn) = cluster();
    let sim = cluster.sim.path();
    fs::write(
        sim.join("mig.0"),
        "1 0 1g.18gb 19327352832\n2 0 3g.71gb 76235669504\n",
    )
    .expect("mig.0");
    fs::write(sim.join("leak.0.0"), (GIB / 2).to_string()).expect("leak.0.0");
    let mut incident = Incident::new(&cluster.sim);
    let neighbour = Holder::new("neighbour_on_mig_0_0").on(0, 3 * GIB);
    incident
        .spawn(&on_instance(&neighbour, 0, 0, 3 * GIB), 1)
        .expect("neighbour");
    let neighbour = incident.pid_of("neighbour_on_mig_0_0").expect("neighbour");
    let epilog = |variable: &str, value: &str| -> crate::harness::Run {
        Command::new(env!("CARGO_BIN_EXE_gpureap"))
            .args(["--backend", &cluster.sim.backend()])
            .args(["slurm", "epilog", "--scontrol", SCONTROL, "--timeout", "5m"])
            .arg("--log")
            .arg(cluster.dir.join("audit.jsonl"))
            .env("SLURM_CONF", cluster.conf())
            .env("SLURM_JOB_ID", "4747")
            .env("SLURM_JOB_UID", "65534")
            .env("SLURMD_NODENAME", &cluster.node)
            .env_remove("SLURM_JOB_GPUS")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env(variable, value)
            .env_remove("GPUREAP_BACKEND")
            .stdin(Stdio::null())
            .output()
            .expect("gpureap runs")
            .into()
    };
    for variable in ["SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"] {
        let ran = epilog(variable, "MIG-sim-00000000-0001");
        assert_eq!(ran.code, 0, "{variable}: {}{}", ran.stdout, ran.stderr);
        let (state, _) = cluster.node_state().expect("node state");
        assert!(
            !state.contains("DRAIN"),
            "{variable}: {state} {}",
            ran.stderr
        );
        assert!(alive(neighbour), "the neighbour on 0:0 was not signalled");
    }
    // The same GPU named whole is not clean: the neighbour and the leak.
    let whole = epilog("SLURM_JOB_GPUS", "0");
    assert_ne!(whole.code, 0, "{}{}", whole.stdout, whole.stderr);
    let _ = cluster.scontrol(&[
        "update",
        &format!("nodename={}", cluster.node),
        "state=resume",
    ]);
    // Another host's instance: a drain that names it, nothing signalled.
    let elsewhere = epilog(
        "CUDA_VISIBLE_DEVICES",
        "MIG-4b1e5c2a-7d0e-5f3b-9a1c-2e8d6f4a0b9c",
    );
    assert_eq!(
        elsewhere.code, 3,
        "{}{}",
        elsewhere.stdout, elsewhere.stderr
    );
    assert!(
        cluster.drain_reason().is_some_and(|reason| reason
            .contains("MIG instance MIG-4b1e5c2a-7d0e-5f3b-9a1c-2e8d6f4a0b9c is not on this host")),
        "{:?}",
        cluster.drain_reason()
    );
    assert!(alive(neighbour), "the neighbour on 0:0 was not signalled");
}
