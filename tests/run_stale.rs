//! A `gpureap run` that is SIGKILLed (or OOM-killed) leaves its server
//! running in its cgroup. `status` must say the supervisor is gone,
//! `free --orphans`, `--pid`, `--match` and `--stale-runs` must take such a
//! tree, and the next `run` with the same state directory must free it and
//! remove the cgroup; a cgroup whose supervisor lives is never touched, and
//! a reused PID does not count as a live supervisor.
//!
//! `--stale-runs` looks at the whole host, so these tests take turns.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};
use serde_json::Value;

use crate::harness::*;
use crate::run::{
    Supervisor, bash_server, cgroup2_present, nothing_left, setup, supervised_by, used,
};

static STALE_RUNS: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    assert!(cgroup2_present(), "these tests need cgroup v2");
    STALE_RUNS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Where cgroup v2 is mounted.
fn cgroup2_mount() -> PathBuf {
    gpureap_services::supervision::cgroup2_mount().expect("a cgroup2 mount")
}

/// The cgroup `gpureap run` with this PID made for its first start.
fn run_cgroup(gpureap: u32) -> PathBuf {
    let own = own_cgroup(|line| line.strip_prefix("0::")).expect("a v2 cgroup");
    let path = cgroup2_mount()
        .join(own.trim_start_matches('/'))
        .join(format!("gpureap.run-{gpureap}-1"));
    assert!(path.is_dir(), "{} is not there", path.display());
    path
}

/// SIGKILLs a supervising gpureap, as the OOM killer would; returns its PID
/// and what it supervised, which runs on.
fn sigkill(mut supervisor: Supervisor) -> (u32, BTreeSet<u32>) {
    let pid = supervisor.child.id();
    let tree = supervised_by(pid);
    assert!(
        tree.len() >= 4,
        "launcher, detokenizer, two workers: {tree:?}"
    );
    supervisor.child.kill().expect("SIGKILL gpureap");
    supervisor.child.wait().expect("gpureap ends");
    // What its death does to them (re-parenting; a parent-death signal,
    // SIGHUP to an orphaned job) the kernel has done by the time wait
    // returns: each still runs, adopted, and no signal is on its way to end it.
    assert_eq!(supervised_by(pid), tree, "the server runs on without it");
    for &member in &tree {
        assert_ne!(ppid(member), Some(pid), "{member} was not re-parented");
        let pending = fatal_signals_pending(member);
        assert_eq!(pending, 0, "{member} has signals {pending:#x} on their way");
    }
    (pid, tree)
}

/// The signals pending for the process `pid` (its threads' and its own),
/// as a mask (bit N-1 for signal N), those whose default is to be ignored
/// (SIGCHLD, SIGCONT, SIGURG, SIGWINCH) left out.
fn fatal_signals_pending(pid: u32) -> u64 {
    let harmless: u64 = [17, 18, 23, 28]
        .iter()
        .map(|signal| 1 << (signal - 1))
        .sum();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .filter_map(|line| {
            line.strip_prefix("SigPnd:")
                .or_else(|| line.strip_prefix("ShdPnd:"))
        })
        .map(|mask| u64::from_str_radix(mask.trim(), 16).expect("a signal mask"))
        .fold(0, |all, mask| all | mask)
        & !harmless
}

fn targets(report: &Value) -> BTreeSet<u32> {
    target_pids(report).into_iter().collect()
}

fn holders(status: &Value) -> Vec<Value> {
    status["holders"].as_array().expect("holders").clone()
}

/// The process of `tree` whose parent is not in it: what gpureap started.
fn top_of(tree: &BTreeSet<u32>) -> u32 {
    *tree
        .iter()
        .find(|&&pid| ppid(pid).is_some_and(|parent| !tree.contains(&parent)))
        .expect("a top")
}

/// `gpureap free --stale-runs ARGS --yes --json`, after a dry run proves
/// that it would signal only `ours`: the host is shared, and a leftover of
/// someone else's is not these tests' to kill.
fn free_stale_runs(host: &SimHost, args: &[&str], ours: &BTreeSet<u32>) -> Run {
    let plan = run(
        host,
        &[&["free", "--stale-runs", "--dry-run", "--json"], args].concat(),
    )
    .json();
    assert!(
        targets(&plan).is_subset(ours),
        "another stale run is on this host; not freeing it: {plan:#}"
    );
    run(
        host,
        &[&["free", "--stale-runs", "--yes", "--json"], args].concat(),
    )
}

fn wait_until_gone(pids: &BTreeSet<u32>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&pid| alive(pid)) {
        assert!(Instant::now() < deadline, "still alive: {pids:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_sigkilled_run_is_flagged_supervisor_gone_and_free_stale_runs_frees_it() {
    let _turn = one_at_a_time();
    let setup = setup(2);
    let supervisor = setup.run(&[], &[]);
    supervisor.wait_for("ready after", 1);
    let cgroup = run_cgroup(supervisor.child.id());
    let _cleanup = RunCgroup(cgroup.clone());
    let (gpureap, tree) = sigkill(supervisor);
    assert_eq!(used(&setup.host, 0), 20 * GIB);

    let status = run(&setup.host, &["status", "--json"]).json();
    assert_eq!(holders(&status).len(), 2, "{status:#}");
    for holder in holders(&status) {
        let flags = flags(&holder);
        assert!(flags.contains(&"supervisor_gone".to_string()), "{holder:#}");
        assert!(!flags.contains(&"supervised".to_string()), "{holder:#}");
        assert_eq!(holder["supervisor"]["pid"], gpureap, "{holder:#}");
        let gone = holder["supervisor"]["gone"].as_str().expect("why gone");
        assert!(gone.contains("exited"), "{gone}");
    }
    let table = run(&setup.host, &["status"]).stdout;
    assert!(table.contains("supervisor_gone"), "{table}");
    assert!(table.contains("gpureap free --stale-runs"), "{table}");

    // A live supervised server next to it is no stale run.
    let live_host = Sim::gpus(1).build();
    let live = bash_server(
        &live_host,
        &["--ready-log", "serving"],
        "exec 3<\"$D/nvidia0\"; echo serving; exec sleep 100000",
    );
    live.wait_for("ready after", 1);
    let live_cgroup = run_cgroup(live.child.id());
    let live_tree = supervised_by(live.child.id());

    let plan = run(
        &setup.host,
        &["free", "--stale-runs", "--dry-run", "--json"],
    )
    .json();
    assert!(targets(&plan).is_superset(&tree), "{plan:#}");
    let result = free_stale_runs(&setup.host, &["--grace", "500ms"], &tree);
    assert_eq!(result.code, 0, "{}\n{}", result.stdout, result.stderr);
    let report = result.json();
    assert!(targets(&report).is_superset(&tree), "{report:#}");
    assert!(targets(&report).is_disjoint(&live_tree), "{report:#}");
    let removed = report["stale_runs"]
        .as_array()
        .expect("stale_runs")
        .iter()
        .find(|entry| entry["cgroup"] == cgroup.display().to_string())
        .unwrap_or_else(|| panic!("{} not reported: {report:#}", cgroup.display()))
        .clone();
    assert_eq!(removed["supervisor"], gpureap);
    assert_eq!(removed["removed"], true, "{removed:#}");
    assert!(!cgroup.exists(), "the stale cgroup is removed");
    wait_until_gone(&tree);
    nothing_left(&setup.host, 2);

    assert!(live_cgroup.is_dir(), "a live run's cgroup is untouched");
    assert!(live_tree.iter().all(|&pid| alive(pid)));
    let (code, events, _) = live.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
}

#[test]
fn free_orphans_takes_a_run_whose_supervisor_is_gone_launcher_and_all() {
    let _turn = one_at_a_time();
    let setup = setup(2);
    let supervisor = setup.run(&[], &[]);
    supervisor.wait_for("ready after", 1);
    let cgroup = run_cgroup(supervisor.child.id());
    let _cleanup = RunCgroup(cgroup.clone());
    let (_, tree) = sigkill(supervisor);

    let result = run(
        &setup.host,
        &["free", "--orphans", "--grace", "500ms", "--yes", "--json"],
    );
    assert_eq!(result.code, 0, "{}\n{}", result.stdout, result.stderr);
    assert_eq!(targets(&result.json()), tree, "{}", result.stdout);
    wait_until_gone(&tree);
    nothing_left(&setup.host, 2);

    // Its emptied cgroup is left for --stale-runs (or the next run).
    assert!(cgroup.is_dir());
    let result = free_stale_runs(&setup.host, &[], &BTreeSet::new());
    assert_eq!(result.code, 0, "{}\n{}", result.stdout, result.stderr);
    assert!(!cgroup.exists());
}

#[test]
fn without_a_cgroup_a_killed_run_is_still_flagged_and_free_orphans_takes_it() {
    let _turn = one_at_a_time();
    let setup = setup(2);
    let supervisor = setup.run(&["--no-cgroup"], &[]);
    supervisor.wait_for("ready after", 1);
    let (gpureap, tree) = sigkill(supervisor);
    let _cleanup = Unsupervised(gpureap);

    let status = run(&setup.host, &["status", "--json"]).json();
    for holder in holders(&status) {
        assert!(
            flags(&holder).contains(&"supervisor_gone".to_string()),
            "{holder:#}"
        );
        assert_eq!(holder["supervisor"]["pid"], gpureap, "{holder:#}");
    }
    let table = run(&setup.host, &["status"]).stdout;
    assert!(table.contains("gpureap free --orphans"), "{table}");

    let result = run(
        &setup.host,
        &["free", "--orphans", "--grace", "500ms", "--yes", "--json"],
    );
    assert_eq!(result.code, 0, "{}\n{}", result.stdout, result.stderr);
    assert_eq!(targets(&result.json()), tree, "{}", result.stdout);
    wait_until_gone(&tree);
    nothing_left(&setup.host, 2);
}

#[test]
fn free_pid_and_match_take_a_tree_whose_supervisor_is_gone() {
    let _turn = one_at_a_time();
    let setup = setup(2);
    let supervisor = setup.run(&[], &[]);
    supervisor.wait_for("ready after", 1);
    let cgroup = run_cgroup(supervisor.child.id());
    let _cleanup = RunCgroup(cgroup.clone());
    let (_, tree) = sigkill(supervisor);
    let launcher = top_of(&tree);

    let result = run(
        &setup.host,
        &[
            "free",
            "--match",
            "sglang::scheduler",
            "--grace",
            "500ms",
            "--yes",
            "--json",
        ],
    );
    assert_eq!(result.code, 0, "{}\n{}", result.stdout, result.stderr);
    let workers = targets(&result.json());
    assert_eq!(workers.len(), 2, "{}", result.stdout);
    assert_eq!(used(&setup.host, 0), 0);

    let result = run(
        &setup.host,
        &[
            "free",
            "--pid",
            &launcher.to_string(),
            "--grace",
            "500ms",
            "--yes",
            "--json",
        ],
    );
    assert_eq!(result.code, 0, "{}\n{}", result.stdout, result.stderr);
    // The rest of the tree, and the killed workers still unreaped (zombies, not signalled).
    let rest: BTreeSet<u32> = tree.difference(&workers).copied().collect();
    let named = targets(&result.json());
    assert!(
        named.contains(&launcher) && named.is_superset(&rest),
        "{}",
        result.stdout
    );
    assert!(named.is_subset(&tree), "{}", result.stdout);
    wait_until_gone(&tree);
    nothing_left(&setup.host, 2);

    let result = free_stale_runs(&setup.host, &[], &BTreeSet::new());
    assert_eq!(result.code, 0, "{}\n{}", result.stdout, result.stderr);
    assert!(!cgroup.exists());
}

#[test]
fn the_next_run_with_the_same_state_dir_frees_and_removes_the_leftover() {
    let _turn = one_at_a_time();
    let setup = setup(2);
    let first = setup.run(&[], &[]);
    first.wait_for("ready after", 1);
    let cgroup = run_cgroup(first.child.id());
    let _cleanup = RunCgroup(cgroup.clone());
    let (gpureap, tree) = sigkill(first);

    // Same state directory, same port and GPUs: it must clean up to start.
    let second = setup.run(&[], &[]);
    let leftover = second.wait_for("leftover of gpureap run", 1);
    assert!(leftover.contains(&gpureap.to_string()), "{leftover}");
    assert!(
        leftover.contains(&cgroup.display().to_string()),
        "{leftover}"
    );
    second.wait_for("GPU 0: freed 20.0 GiB", 1);
    let removed = second.wait_for("removed", 1);
    assert!(removed.contains(&cgroup.display().to_string()), "{removed}");
    second.wait_for("ready after", 1);
    assert!(!cgroup.exists());
    wait_until_gone(&tree);
    let (code, events, _) = second.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
    nothing_left(&setup.host, 2);
}

#[test]
fn a_run_never_touches_the_cgroup_of_a_live_run_with_the_same_state_dir() {
    let _turn = one_at_a_time();
    let host = Sim::gpus(2).build();
    let first = bash_server(
        &host,
        &["--ready-log", "serving"],
        "exec 3<\"$D/nvidia0\"; echo serving; exec sleep 100000",
    );
    first.wait_for("ready after", 1);
    let first_cgroup = run_cgroup(first.child.id());
    let first_tree = supervised_by(first.child.id());
    let second = bash_server(
        &host,
        &["--ready-log", "serving"],
        "exec 3<\"$D/nvidia1\"; echo serving; exec sleep 100000",
    );
    second.wait_for("ready after", 1);
    assert!(
        !second
            .events()
            .iter()
            .any(|event| event.contains("leftover")),
        "{}",
        second.events().join("\n")
    );
    assert!(first_cgroup.is_dir());
    assert!(first_tree.iter().all(|&pid| alive(pid)));
    assert_eq!(used(&host, 0), GIB);
    for supervisor in [first, second] {
        let (code, events, _) = supervisor.stop();
        assert_eq!(code, 0, "{}", events.join("\n"));
    }
    nothing_left(&host, 2);
}

/// A `gpureap wait` that never ends by itself: a live gpureap process.
/// A gpureap that stays running: waiting for a GPU of a host of its own
/// whose memory is held by no process, so it never becomes free.
fn live_gpureap() -> (Child, SimHost) {
    let busy = Sim::gpus(1).build();
    busy.leak(0, GIB).expect("leak");
    let child = gpureap(&busy)
        .args(["wait", "--gpu", "0", "--timeout", "120s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("gpureap wait");
    (child, busy)
}

/// A run cgroup that this test made or caused: whatever is still in it
/// when the test ends, passed or failed, is killed and the cgroup removed.
struct RunCgroup(PathBuf);

impl RunCgroup {
    /// A run cgroup named after `supervisor`, holding `member`.
    fn fake(supervisor: u32, member: u32) -> RunCgroup {
        let path = cgroup2_mount().join(format!("gpureap.run-{supervisor}-1"));
        std::fs::create_dir(&path).expect("mkdir cgroup");
        let cgroup = RunCgroup(path);
        std::fs::write(cgroup.0.join("cgroup.procs"), member.to_string())
            .expect("move into cgroup");
        cgroup
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::fs::remove_dir(&self.0).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// What the gpureap with this PID started and left without a cgroup,
/// killed when the test ends, passed or failed.
struct Unsupervised(u32);

impl Drop for Unsupervised {
    fn drop(&mut self) {
        for pid in supervised_by(self.0) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// A child process of the test, killed when the test ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_reused_supervisor_pid_is_no_live_supervisor_and_a_live_one_is_left_alone() {
    let _turn = one_at_a_time();
    let host = Sim::gpus(3).build();
    let (early, _early_host) = live_gpureap();
    let early = Killed(early);
    // Its "server" must be younger by its start time, counted in ticks.
    past_start_tick(early.0.id());
    let mut incident = Incident::new(&host);
    let under_imposter = incident.hold(Holder::new("server_under_imposter").on(0, 10 * GIB));
    let under_late = incident.hold(Holder::new("server_under_late_gpureap").on(1, 10 * GIB));
    let under_live = incident.hold(Holder::new("server_under_live_gpureap").on(2, 10 * GIB));
    // The supervisors' PIDs now name a sleep, and a gpureap younger than its "server".
    let imposter = Killed(Command::new("sleep").arg("1000").spawn().expect("sleep"));
    past_start_tick(under_late);
    let (late, _late_host) = live_gpureap();
    let late = Killed(late);
    let runs = [
        RunCgroup::fake(imposter.0.id(), under_imposter),
        RunCgroup::fake(late.0.id(), under_late),
        RunCgroup::fake(early.0.id(), under_live),
    ];

    let status = run(&host, &["status", "--json"]).json();
    let holder = |pid: u32| {
        holders(&status)
            .into_iter()
            .find(|holder| holder["pid"] == pid)
            .unwrap_or_else(|| panic!("{pid} not in {status:#}"))
    };
    for (pid, why) in [
        (under_imposter, "not gpureap"),
        (under_late, "started after"),
    ] {
        let holder = holder(pid);
        assert!(
            flags(&holder).contains(&"supervisor_gone".to_string()),
            "{holder:#}"
        );
        let gone = holder["supervisor"]["gone"].as_str().expect("why gone");
        assert!(gone.contains(why), "{gone}");
    }
    let holder = holder(under_live);
    assert!(
        flags(&holder).contains(&"supervised".to_string()),
        "{holder:#}"
    );
    assert_eq!(holder["supervisor"]["gone"], Value::Null);

    // Narrowed to GPU 0: only that stale run is freed and removed.
    let result = free_stale_runs(
        &host,
        &["--gpu", "0", "--grace", "300ms"],
        &BTreeSet::from([under_imposter]),
    );
    assert_eq!(result.code, 0, "{}\n{}", result.stdout, result.stderr);
    let report = result.json();
    assert_eq!(
        targets(&report),
        BTreeSet::from([under_imposter]),
        "{report:#}"
    );
    let listed: Vec<&Value> = report["stale_runs"]
        .as_array()
        .expect("stale_runs")
        .iter()
        .collect();
    assert_eq!(listed.len(), 1, "{report:#}");
    assert_eq!(listed[0]["cgroup"], runs[0].0.display().to_string());
    assert!(!runs[0].0.exists());
    assert!(alive(under_late), "outside the scope");
    assert!(runs[1].0.is_dir(), "outside the scope");

    let result = free_stale_runs(&host, &["--grace", "300ms"], &BTreeSet::from([under_late]));
    assert_eq!(result.code, 0, "{}\n{}", result.stdout, result.stderr);
    let report = result.json();
    assert_eq!(targets(&report), BTreeSet::from([under_late]), "{report:#}");
    assert!(!runs[1].0.exists());
    assert!(runs[2].0.is_dir(), "a live gpureap's cgroup is left alone");
    assert!(alive(under_live));
    assert_eq!(used(&host, 2), 10 * GIB);
}
