//! `status`, `free` and `wait` with `-H`, against real sshd hosts in
//! network namespaces (tests/sshd_lab.rs), each with its own processes and
//! its own simulated driver.

use std::time::Duration;

use gpureap_core::driver::sim::incident::Holder;
use serde_json::Value;

use crate::harness::{GIB, target_pids};
use crate::plan_fixture::{llama_8b_in, sglang, within_512_mib};
use crate::says::says;
use crate::sshd_lab::{Kind, Lab, host_entry};

fn worker(tp: u32, gpu: u32) -> Holder {
    Holder::new(&format!("sglang::scheduler_TP{tp}")).on(gpu, 30 * GIB)
}

fn holder_pids(status: &Value) -> Vec<u64> {
    let mut pids: Vec<u64> = status["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .filter(|holder| {
            !holder["flags"]
                .as_array()
                .expect("flags")
                .contains(&"monitor".into())
        })
        .map(|holder| holder["pid"].as_u64().expect("pid"))
        .collect();
    pids.sort_unstable();
    pids
}

#[test]
fn holders_on_several_hosts_are_seen_freed_and_verified_per_host() {
    let lab = Lab::new(&[Kind::Up, Kind::Up, Kind::Up]);
    let tp0 = lab.hold("h1", &worker(0, 0));
    let tp1 = lab.hold("h1", &worker(1, 1));
    let h2_worker = lab.hold("h2", &worker(0, 1));
    let notebook = lab.hold("h2", &Holder::new("python3 notebook.py").on(0, 6 * GIB));

    // One table with a HOST column; the idle host folded into a line.
    let status = lab.run(&["status", "-H", "h1", "-H", "h[1-3]"]);
    assert_eq!(status.code, 0, "{}{}", status.stdout, status.stderr);
    let rows: Vec<&str> = status.stdout.lines().collect();
    for (host, pid) in [
        ("h1", tp0),
        ("h1", tp1),
        ("h2", h2_worker),
        ("h2", notebook),
    ] {
        assert!(
            rows.iter()
                .any(|row| row.trim_start().starts_with(host) && row.contains(&format!(" {pid} "))),
            "no row for {host} pid {pid}:\n{}",
            status.stdout
        );
    }
    says(&status.stdout, &["Nothing held on 1 host (2 GPUs): h3"]);

    let json = lab.run(&["status", "-H", "h1,h2,h3", "--json"]).json();
    assert_eq!(json["kind"], "fleet");
    assert_eq!(json["command"], "status");
    assert_eq!(json["exit_code"], 0);
    assert_eq!(holder_pids(&host_entry(&json, "h1")["report"]), {
        let mut pids = vec![tp0 as u64, tp1 as u64];
        pids.sort_unstable();
        pids
    });
    assert_eq!(
        host_entry(&json, "h3")["report"]["holders"],
        serde_json::json!([])
    );
    assert_eq!(host_entry(&json, "h3")["error"], Value::Null);

    // Each host frees its own sglang workers and verifies on its own driver;
    // the notebook on h2 is out of scope and stays.
    let free = lab.run(&[
        "free", "-H", "h[1-3]", "--match", "sglang::", "--grace", "0", "--yes", "--json",
    ]);
    let document = free.json();
    assert_eq!(free.code, 0, "{document:#}\n{}", free.stderr);
    assert_eq!(document["command"], "free");
    let h1 = &host_entry(&document, "h1")["report"];
    assert_eq!(target_pids(h1), {
        let mut pids = vec![tp0, tp1];
        pids.sort_unstable();
        pids
    });
    assert!(
        h1["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .all(|gpu| gpu["freed"] == true)
    );
    let h2 = &host_entry(&document, "h2")["report"];
    assert_eq!(target_pids(h2), [h2_worker]);
    assert_eq!(
        host_entry(&document, "h3")["report"]["targets"],
        serde_json::json!([])
    );

    let after = lab.run(&["status", "-H", "h1,h2", "--json"]).json();
    assert_eq!(
        holder_pids(&host_entry(&after, "h1")["report"]),
        Vec::<u64>::new()
    );
    assert_eq!(
        holder_pids(&host_entry(&after, "h2")["report"]),
        [notebook as u64]
    );
}

#[test]
fn the_text_of_free_ends_with_one_line_per_host_and_gpu() {
    let lab = Lab::new(&[Kind::Up, Kind::Up]);
    lab.hold("h1", &worker(0, 0));
    lab.hold("h2", &worker(0, 1).ignoring_sigterm());
    let free = lab.run(&[
        "free", "-H", "h1,h2", "--match", "sglang", "--grace", "200ms", "--yes",
    ]);
    assert_eq!(free.code, 0, "{}{}", free.stdout, free.stderr);
    let lines: Vec<&str> = free.stdout.lines().collect();
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with("h1: GPU 0: freed 30.0 GiB")),
        "{}",
        free.stdout
    );
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with("h2: GPU 1: freed 30.0 GiB")),
        "{}",
        free.stdout
    );
    // The SIGTERM-ignorer on h2 needed the escalation.
    assert!(
        lines
            .iter()
            .any(|line| line.trim_start().starts_with("h2")
                && line.contains("SIGTERM,SIGSTOP,SIGKILL")),
        "{}",
        free.stdout
    );
}

#[test]
fn unreachable_hosts_are_listed_last_with_their_reason_and_the_run_is_incomplete() {
    let lab = Lab::new(&[Kind::Up, Kind::Refusing, Kind::UnknownKey]);
    lab.hold("h1", &worker(0, 0));
    let status = lab.run(&["status", "-H", "h1,h2,h3"]);
    assert_eq!(status.code, 3, "{}{}", status.stdout, status.stderr);
    let failed_at = status
        .stdout
        .find("Failed on 2 of 3 hosts:")
        .unwrap_or_else(|| panic!("no failure section:\n{}", status.stdout));
    let failures = &status.stdout[failed_at..];
    assert!(failures.contains("h2: ssh: connect to host"), "{failures}");
    assert!(failures.contains("Connection refused"), "{failures}");
    // An unknown key is refused, never accepted.
    assert!(
        failures.contains("h3: Host key verification failed"),
        "{failures}"
    );
    // h1's holder is still reported above the failures.
    assert!(
        status.stdout[..failed_at]
            .lines()
            .any(|line| line.trim_start().starts_with("h1 "))
    );

    let json = lab.run(&["status", "-H", "h1,h2,h3", "--json"]).json();
    assert_eq!(json["exit_code"], 3);
    assert_eq!(host_entry(&json, "h1")["exit_code"], 0);
    for host in ["h2", "h3"] {
        let entry = host_entry(&json, host);
        assert_eq!(entry["exit_code"], 3);
        assert_eq!(entry["report"], Value::Null);
        assert!(entry["error"].is_string());
    }
    // The key was not added to the known hosts.
    // By the host field of each line: a key's base64 may spell "h3" by chance.
    let known = std::fs::read_to_string(lab.path().join("known_hosts")).expect("known_hosts");
    assert!(
        !known
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .any(|hosts| hosts.split(',').any(|host| host.contains("h3"))),
        "{known}"
    );
}

#[test]
fn a_missing_remote_gpureap_says_so() {
    let lab = Lab::new(&[Kind::Up]);
    let run: crate::harness::Run =
        lab.run_as_given(&["status", "-H", "h1", "--remote-bin", "/nonexistent/gpureap"]);
    assert_eq!(run.code, 3);
    says(
        &run.stdout,
        &["h1: /nonexistent/gpureap not found on the host (check --remote-bin)"],
    );
    // Something that is not gpureap answering is not taken for a report.
    let run: crate::harness::Run =
        lab.run_as_given(&["status", "-H", "h1", "--remote-bin", "/bin/echo"]);
    assert_eq!(run.code, 3);
    says(
        &run.stdout,
        &["h1: answered something that is not gpureap's JSON"],
    );
    // Another schema, or a document missing what is shown: said, never shown as nothing held.
    for (document, says) in [
        (
            r#"{"schema_version":2,"kind":"status"}"#,
            "h1: remote gpureap speaks schema 2, this one 1",
        ),
        (
            r#"{"schema_version":1,"kind":"status","gpus":"x","holders":[]}"#,
            "h1: answered a status report this gpureap cannot read",
        ),
        (
            r#"{"schema_version":1,"kind":"free"}"#,
            "h1: answered a document that is not a status report",
        ),
    ] {
        let fake = lab.path().join("fake-gpureap");
        std::fs::write(&fake, format!("#!/bin/sh\ncat <<'EOF'\n{document}\nEOF\n")).expect("fake");
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let run: crate::harness::Run = lab.run_as_given(&[
            "status",
            "-H",
            "h1",
            "--remote-bin",
            fake.to_str().expect("a UTF-8 path"),
        ]);
        assert_eq!(run.code, 3, "{}", run.stdout);
        assert!(run.stdout.contains(says), "{}", run.stdout);
        assert!(!run.stdout.contains("Nothing held"), "{}", run.stdout);
    }
}

#[test]
fn a_regex_with_shell_metacharacters_arrives_intact() {
    let lab = Lab::new(&[Kind::Up]);
    let tp0 = lab.hold("h1", &worker(0, 0));
    let tp1 = lab.hold("h1", &Holder::new("vllm serve llama").on(1, GIB));
    lab.hold("h1", &Holder::new("python3 train.py").on(1, GIB));
    let canary = lab.path().join("canary");
    let pattern = format!(
        "sglang::|vllm|$(touch {}) ; `touch {}` 'x\"",
        canary.display(),
        canary.display()
    );
    let plan = lab.run(&[
        "free",
        "-H",
        "h1",
        "--match",
        &pattern,
        "--dry-run",
        "--json",
    ]);
    let document = plan.json();
    assert_eq!(plan.code, 0, "{document:#}\n{}", plan.stderr);
    let mut expected = vec![tp0, tp1];
    expected.sort_unstable();
    assert_eq!(
        target_pids(&host_entry(&document, "h1")["report"]),
        expected
    );
    assert!(!canary.exists(), "the remote shell expanded the regex");
    // A value starting with '-' stays a value.
    let plan = lab.run(&["free", "-H", "h1", "--match=-x|vllm", "--dry-run", "--json"]);
    assert_eq!(plan.code, 0, "{}{}", plan.stdout, plan.stderr);
    assert_eq!(
        target_pids(&host_entry(&plan.json(), "h1")["report"]),
        [tp1]
    );
}

#[test]
fn free_across_hosts_asks_first_and_a_dry_run_signals_nothing() {
    let lab = Lab::new(&[Kind::Up, Kind::Up]);
    let tp0 = lab.hold("h1", &worker(0, 0));
    let tp1 = lab.hold("h2", &worker(1, 1));
    // No terminal, no --yes: refused before any host is asked.
    let refused = lab.run(&["free", "-H", "h1,h2", "--match", "sglang"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    says(&refused.stderr, &["pass --yes"]);
    let plan = lab.run(&["free", "-H", "h1,h2", "--match", "sglang"]);
    assert_eq!(plan.code, 2);
    let plan = lab.run(&["free", "-H", "h1,h2", "--match", "sglang", "--dry-run"]);
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    for (host, pid) in [("h1", tp0), ("h2", tp1)] {
        assert!(
            plan.stdout
                .lines()
                .any(|line| line.trim_start().starts_with(host)
                    && line.contains(&format!(" {pid} "))),
            "{}",
            plan.stdout
        );
    }
    let status = lab.run(&["status", "-H", "h1,h2", "--json"]).json();
    assert_eq!(
        holder_pids(&host_entry(&status, "h1")["report"]),
        [tp0 as u64]
    );
    assert_eq!(
        holder_pids(&host_entry(&status, "h2")["report"]),
        [tp1 as u64]
    );
}

#[test]
fn wait_returns_when_every_host_is_below_and_names_the_hosts_still_held() {
    let lab = Lab::new(&[Kind::Up, Kind::Up]);
    let tp0 = lab.hold("h1", &worker(0, 0));
    lab.hold("h2", &worker(1, 1));
    let timed_out = lab.run(&["wait", "-H", "h1,h2", "--timeout", "1s"]);
    assert_eq!(
        timed_out.code, 1,
        "{}{}",
        timed_out.stdout, timed_out.stderr
    );
    says(
        &timed_out.stdout,
        &[
            "h1: GPU 0: busy, 30.0 GiB used",
            "h2: GPU 1: busy, 30.0 GiB used",
        ],
    );
    // ... and who holds them.
    assert!(
        timed_out
            .stdout
            .lines()
            .any(|line| line.trim_start().starts_with("h1") && line.contains(&format!(" {tp0} "))),
        "{}",
        timed_out.stdout
    );

    // Free h2 now; h1 a little later, while the fleet wait runs.
    lab.run(&["free", "-H", "h2", "--all", "--grace", "0", "--yes"]);
    let waiting = lab
        .gpureap()
        .args(["wait", "-H", "h1,h2", "--timeout", "60s", "--json"])
        .args(["--remote-bin", env!("CARGO_BIN_EXE_gpureap")])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("wait starts");
    // Free h1 once the wait there has read GPU 0 busy: it then waits on the
    // driver for a change.
    let places = crate::harness::WAITING_ON_THE_DRIVER.join("\\|");
    let waits_on_h1 = || {
        let script = format!(
            "for p in $(pgrep -x gpureap); do grep -q '{places}' /proc/$p/wchan && exit 0; done; exit 1"
        );
        lab.on("h1", &script).code == 0
    };
    assert!(
        eventually(Duration::from_secs(30), waits_on_h1),
        "the wait on h1 never waited"
    );
    let killed = lab.on("h1", &format!("kill -9 {tp0}"));
    assert_eq!(killed.code, 0, "{}", killed.stderr);
    let output = waiting.wait_with_output().expect("wait ends");
    let document: Value = serde_json::from_slice(&output.stdout).expect("fleet JSON");
    assert_eq!(output.status.code(), Some(0), "{document:#}");
    for host in ["h1", "h2"] {
        assert_eq!(host_entry(&document, host)["report"]["ready"], true);
    }
}

#[test]
fn a_hanging_host_costs_its_timeout_and_no_more() {
    let lab = Lab::new(&[Kind::Up, Kind::Up]);
    lab.hold("h1", &worker(0, 0));
    // h2 accepts connections and never says a word.
    lab.freeze("h2");
    let run = lab.run(&[
        "status",
        "-H",
        "h1,h2",
        "--connect-timeout",
        "1s",
        "--host-timeout",
        "3s",
        "--json",
    ]);
    let document = run.json();
    assert_eq!(run.code, 3, "{document:#}");
    assert_eq!(host_entry(&document, "h1")["exit_code"], 0);
    let h2 = host_entry(&document, "h2");
    assert_eq!(h2["report"], Value::Null);
    let error = h2["error"].as_str().expect("error");
    assert!(
        error.contains("timed out") || error.contains("Connection timed out"),
        "{error}"
    );
    assert!(
        h2["elapsed_ms"].as_u64().expect("elapsed") < 3_000 + 2_000,
        "{h2:#}"
    );

    // A gpureap that hangs on the host: the command timeout ends it.
    let hang = lab.path().join("hang.sh");
    std::fs::write(&hang, "#!/bin/sh\nsleep 1000\n").expect("script");
    std::fs::set_permissions(&hang, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let run: crate::harness::Run = lab.run_as_given(&[
        "status",
        "-H",
        "h1",
        "--host-timeout",
        "1s",
        "--remote-bin",
        hang.to_str().expect("a UTF-8 path"),
    ]);
    assert_eq!(run.code, 3);
    says(&run.stdout, &["h1: no answer within 1.0s (timed out"]);
}

/// A host that rejects its arguments (here: `--gpu 1` on a host with one GPU;
/// an older or wrapped gpureap that does not know a flag is the same) while
/// the others free: the fleet did signal, so it never says "nothing
/// signalled" (2); it could not complete (3), and a host still held (1) is
/// never hidden behind the refusal.
#[test]
fn a_host_refusing_its_arguments_while_others_free_is_not_nothing_signalled() {
    let lab = Lab::new(&[Kind::Up, Kind::Up, Kind::Up]);
    let h1_worker = lab.hold("h1", &worker(0, 1));
    let h2_worker = lab.hold("h2", &worker(1, 1));
    // h3 has one GPU: `--gpu 1` is a usage error there, and nothing is signalled on it.
    std::fs::remove_file(lab.host("h3").sim.path().join("nvidia1")).expect("one GPU on h3");

    let free = lab.run(&[
        "free", "-H", "h[1-3]", "--gpu", "1", "--grace", "200ms", "--yes", "--json",
    ]);
    let document = free.json();
    assert_eq!(host_entry(&document, "h3")["exit_code"], 2, "{document:#}");
    for (host, pid) in [("h1", h1_worker), ("h2", h2_worker)] {
        let entry = host_entry(&document, host);
        assert_eq!(entry["exit_code"], 0, "{document:#}");
        assert_eq!(target_pids(&entry["report"]), [pid], "{document:#}");
    }
    assert_eq!(free.code, 3, "{}{}", free.stdout, free.stderr);
    assert_eq!(document["exit_code"], 3);

    // h2 keeps a holder in scope that free spares (a protected name): 1 stands.
    let h1_worker = lab.hold("h1", &worker(0, 1));
    lab.hold("h2", &Holder::new("keeper").on(1, 2 * GIB));
    let free = lab.run(&[
        "free",
        "-H",
        "h[1-3]",
        "--gpu",
        "1",
        "--protect",
        "keeper",
        "--grace",
        "200ms",
        "--timeout",
        "1s",
        "--yes",
        "--json",
    ]);
    let document = free.json();
    assert_eq!(host_entry(&document, "h1")["exit_code"], 0, "{document:#}");
    assert_eq!(
        target_pids(&host_entry(&document, "h1")["report"]),
        [h1_worker]
    );
    assert_eq!(host_entry(&document, "h2")["exit_code"], 1, "{document:#}");
    assert_eq!(host_entry(&document, "h3")["exit_code"], 2, "{document:#}");
    assert_eq!(free.code, 1, "{}{}", free.stdout, free.stderr);

    // Every host refusing: nothing was sent anywhere, and that is 2.
    let refused = lab.run(&["free", "-H", "h3", "--gpu", "1", "--yes", "--json"]);
    assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
}

/// A GPU the driver lost on one host: `wait -H` ends at once with 3, as a
/// local `wait` and `free` do, instead of waiting out its timeout.
#[test]
fn wait_across_hosts_on_a_lost_gpu_exits_3_at_once() {
    let lab = Lab::new(&[Kind::Up, Kind::Up]);
    lab.host("h2").sim.lose(1).expect("lose");
    let mut command = lab.gpureap();
    command.args(["wait", "-H", "h1,h2", "--timeout", "1h", "--json"]);
    command.args(["--remote-bin", env!("CARGO_BIN_EXE_gpureap")]);
    let result = crate::harness::ends_within(
        &mut command,
        Duration::from_secs(60),
        "wait -H on a lost GPU",
    );
    let document = result.json();
    assert_eq!(host_entry(&document, "h1")["exit_code"], 0, "{document:#}");
    assert_eq!(host_entry(&document, "h2")["exit_code"], 3, "{document:#}");
    assert_eq!(result.code, 3, "{}", result.stderr);
}

/// A GPU the driver lost on one host: `free -H` ends at once with 3 for
/// that host and for the run, as a local `free` does; the other host is
/// freed (0), never reported still held.
#[test]
fn free_across_hosts_on_a_lost_gpu_exits_3_at_once() {
    let lab = Lab::new(&[Kind::Up, Kind::Up]);
    lab.host("h2").sim.lose(1).expect("lose");
    let mut command = lab.gpureap();
    command.args([
        "free",
        "-H",
        "h1,h2",
        "--gpu",
        "1",
        "--yes",
        "--timeout",
        "1h",
        "--json",
    ]);
    command.args(["--remote-bin", env!("CARGO_BIN_EXE_gpureap")]);
    let result = crate::harness::ends_within(
        &mut command,
        Duration::from_secs(60),
        "free -H on a lost GPU",
    );
    let document = result.json();
    assert_eq!(host_entry(&document, "h1")["exit_code"], 0, "{document:#}");
    assert_eq!(host_entry(&document, "h2")["exit_code"], 3, "{document:#}");
    assert_eq!(result.code, 3, "{}", result.stderr);
}

/// gpureap with `args`, no ssh reachable, in at most 512 MiB of address
/// space: a parser that expands before it bounds fails here, not the machine.
fn bounded_run(args: &[&str]) -> (crate::harness::Run, Duration) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"));
    within_512_mib(&mut command)
        .args(args)
        .args(["--ssh", "false"])
        .env_remove("GPUREAP_BACKEND")
        .stdin(std::process::Stdio::null());
    let started = std::time::Instant::now();
    let run = command.output().expect("gpureap runs").into();
    (run, started.elapsed())
}

#[test]
fn host_lists_are_bounded_before_they_expand_and_never_echo_a_files_lines() {
    let dir = tempfile::tempdir().expect("dir");
    let deep = format!("x{}", "[1]".repeat(30_000));
    let file = dir.path().join("one-name");
    std::fs::write(&file, format!("x{}\n", "[1]".repeat(300_000))).expect("file");
    let file = format!("@{}", file.display());
    let wide = "n[1-9][1-9][1-9][1-9][1-9][1-9][1-9]";
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let fifo = format!("@{}", fifo.display());
    let mut wrong = Vec::new();
    for (list, says) in [
        (deep.as_str(), "a name of 90001 characters"),
        ("x[1][1][1][1][1][1][1][1][1]", "more than 8 bracket groups"),
        (file.as_str(), "line 1: a name of 900001 characters"),
        (wide, "more than 100000 hosts"),
        ("@/proc/kallsyms", "larger than 1 MiB"),
        ("@/dev/zero", "not a regular file"),
        (fifo.as_str(), "not a regular file"),
        ("h2,@h1", "the user not empty"),
        ("alice@h1,bob@h1", "named with two users"),
    ] {
        let (run, took) = bounded_run(&["status", "-H", list]);
        let shown: String = list.chars().take(40).collect();
        let tail: Vec<char> = run.stderr.chars().rev().take(200).collect();
        let tail: String = tail.into_iter().rev().collect();
        if run.code != 2 || !run.stderr.contains(says) || took > Duration::from_secs(10) {
            wrong.push(format!("{shown}: exit {} in {took:?}: {tail}", run.code));
        }
    }
    // The same list four times over: each -H within the bound, not their sum.
    let (run, _) = bounded_run(&[
        "status",
        "-H",
        "n[1-30000]",
        "-H",
        "m[1-30000]",
        "-H",
        "o[1-30000]",
        "-H",
        "p[1-30000]",
    ]);
    if run.code != 2 || !run.stderr.contains("more than 100000 hosts") {
        wrong.push(format!("four -H: exit {}: {}", run.code, run.stderr));
    }

    // A host file's bad line is named by number; its text, a secret perhaps, is not shown.
    let secrets = dir.path().join("hosts");
    std::fs::write(&secrets, "h1\n# fine\nh2\npassword=hunter2 x\n").expect("file");
    let (run, _) = bounded_run(&["status", "-H", &format!("@{}", secrets.display())]);
    if run.code != 2 || !run.stderr.contains("line 4") || run.stderr.contains("hunter2") {
        wrong.push(format!("secret: exit {}: {}", run.code, run.stderr));
    }

    // `h1` and `root@h1` are the one host ssh connects to: run once.
    let (run, _) = bounded_run(&["status", "-H", "h1,root@h1,H1", "--json"]);
    let hosts = serde_json::from_str::<Value>(&run.stdout)
        .ok()
        .and_then(|document| document["hosts"].as_array().map(Vec::len));
    if run.code != 3 || hosts != Some(1) {
        wrong.push(format!("h1,root@h1,H1: exit {}, {hosts:?} hosts", run.code));
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Runs `command` to its end: its output, and its own peak resident memory
/// (VmHWM, its high-water mark, read from /proc/PID/status until it exits;
/// ssh, its child, is not counted).
fn peak_memory(mut command: std::process::Command) -> (crate::harness::Run, u64) {
    use std::io::Read;
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gpureap runs");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let status = loop {
        if let Some(kib) = std::fs::read_to_string(&status_file).ok().and_then(|text| {
            let line = text
                .lines()
                .find(|line| line.starts_with("VmHWM:"))?
                .to_string();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        }) {
            peak = peak.max(kib * 1024);
        }
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let run = crate::harness::Run {
        code: status.code().unwrap_or(-1),
        stdout: out.join().expect("stdout"),
        stderr: err.join().expect("stderr"),
    };
    (run, peak)
}

#[test]
fn a_host_answering_a_huge_document_costs_little_memory_here() {
    let lab = Lab::new(&[Kind::Up]);
    // A "gpureap" on h1 that answers a status document made of small values:
    // `scan.unreadable` holding COUNT zeros, or COUNT small holders.
    let staged = lab.on(
        "h1",
        r#"cat > /usr/local/hostile <<'END'
#!/bin/sh
count=$(cat /usr/local/count)
case $(cat /usr/local/shape) in
zeros)
  printf '{"schema_version":1,"kind":"status","gpus":[],"holders":[],"scan":{"complete":false,"unreadable":['
  yes 0, | head -n "$count" | tr -d '\n'
  printf '0]}}\n' ;;
holders)
  printf '{"schema_version":1,"kind":"status","gpus":[],"scan":{"complete":true,"unreadable":[]},"holders":['
  yes '{"pid":1,"flags":["a","a","a","a"]},' | head -n "$count" | tr -d '\n'
  printf '{"pid":1}]}\n' ;;
esac
END
chmod 755 /usr/local/hostile"#,
    );
    assert_eq!(staged.code, 0, "{}", staged.stderr);
    const MIB: u64 = 1 << 20;
    // Just under the cap on answers (4 MiB), and far above it but under the old one (64 MiB).
    for (shape, count, json, says) in [
        (
            "zeros",
            2_000_000,
            false,
            "h1: partial scan, 2000001 process",
        ),
        ("zeros", 2_000_000, true, ""),
        (
            "holders",
            110_000,
            false,
            "h1: 108977 more holders listed than are shown here (1024)",
        ),
        (
            "zeros",
            30_000_000,
            false,
            "h1: answered more than 4 MiB: not a gpureap report",
        ),
    ] {
        lab.on(
            "h1",
            &format!("echo {count} > /usr/local/count; echo {shape} > /usr/local/shape"),
        );
        let mut command = lab.gpureap();
        command.args(["status", "-H", "h1", "--remote-bin", "/usr/local/hostile"]);
        if json {
            command.arg("--json");
        }
        let (run, peak) = peak_memory(command);
        eprintln!("{count} {shape} (--json: {json}): peak {} MiB", peak / MIB);
        let tail: String = run.stdout.chars().take(300).collect();
        assert!(
            peak < 100 * MIB,
            "{count} {shape} (--json: {json}): gpureap peaked at {} MiB\n{tail}{}",
            peak / MIB,
            run.stderr
        );
        if json {
            let document = run.json();
            let entry = host_entry(&document, "h1");
            let unreadable = entry["report"]["scan"]["unreadable"]
                .as_array()
                .map(Vec::len);
            assert_eq!(unreadable, Some(count + 1), "{}", entry["error"]);
        } else {
            assert!(run.stdout.contains(says), "{tail}");
        }
    }
}

#[test]
fn a_thread_that_cannot_start_is_exit_3_naming_the_hosts_not_run() {
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new(crate::harness::reachable_gpureap());
    command
        .args(["status", "-H", "h1,h2", "--ssh", "false"])
        .env_remove("GPUREAP_BACKEND")
        .current_dir("/")
        .stdin(std::process::Stdio::null());
    // As a uid of its own, allowed one process: this one. No thread can start.
    let uid = 60_000 + std::process::id() % 5_000;
    unsafe {
        command.pre_exec(move || {
            let one = libc::rlimit {
                rlim_cur: 1,
                rlim_max: 1,
            };
            if libc::setrlimit(libc::RLIMIT_NPROC, &one) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let run: crate::harness::Run = command.output().expect("gpureap runs").into();
    assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
    for host in ["h1", "h2"] {
        assert!(
            run.stdout
                .contains(&format!("{host}: not run: cannot start a thread")),
            "{}{}",
            run.stdout,
            run.stderr
        );
    }
}

/// Polls `check` until it holds, for at most `limit`.
fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ctrl_c_or_sigterm_during_free_stops_every_host_and_reports_it() {
    let lab = Lab::new(&[Kind::Up, Kind::Up]);
    // Holders that ignore SIGTERM: a free that ran on would SIGKILL them after its grace.
    let holders: Vec<(&str, u32)> = ["h1", "h2"]
        .into_iter()
        .map(|host| (host, lab.hold(host, &worker(0, 0).ignoring_sigterm())))
        .collect();
    let remote_free = |host: &str| lab.on(host, "pgrep -f -- '--y[e]s --json'").code == 0;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let child = lab
            .gpureap()
            .args([
                "free",
                "-H",
                "h1,h2",
                "--match",
                "sglang::",
                "--grace",
                "15s",
                "--timeout",
                "20s",
                "--yes",
                "--remote-bin",
            ])
            .arg(env!("CARGO_BIN_EXE_gpureap"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("gpureap runs");
        // Both hosts are freeing (they sent SIGTERM and wait out the grace).
        assert!(
            eventually(Duration::from_secs(20), || remote_free("h1")
                && remote_free("h2")),
            "the frees did not start"
        );
        let started = std::time::Instant::now();
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let run: crate::harness::Run = child.wait_with_output().expect("output").into();
        // The remote frees end, well before their grace would, and signal nothing more.
        for (host, pid) in &holders {
            assert!(
                eventually(Duration::from_secs(6), || !remote_free(host)),
                "{host}: the remote free runs on after the abort"
            );
            let alive = lab.on(host, &format!("kill -0 {pid}"));
            assert_eq!(
                alive.code, 0,
                "{host}: holder {pid} was killed after the abort"
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
        let name = if signal == libc::SIGINT {
            "SIGINT"
        } else {
            "SIGTERM"
        };
        for host in ["h1", "h2"] {
            assert!(
                run.stdout
                    .contains(&format!("{host}: interrupted by {name} before it answered")),
                "{}{}",
                run.stdout,
                run.stderr
            );
        }
    }
}

#[test]
fn a_remote_command_past_its_host_timeout_is_ended_there() {
    let lab = Lab::new(&[Kind::Up]);
    let hang = lab.path().join("hang-remote.sh");
    std::fs::write(&hang, "#!/bin/sh\nsleep 1001\n").expect("script");
    std::fs::set_permissions(&hang, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let run = lab.run_as_given(&[
        "status",
        "-H",
        "h1",
        "--host-timeout",
        "2s",
        "--remote-bin",
        hang.to_str().expect("a UTF-8 path"),
    ]);
    assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
    says(&run.stdout, &["timed out"]);
    // Not only the local ssh: the command on the host is gone too.
    let running = || lab.on("h1", "pgrep -f 'sleep 100[1]'").code == 0;
    assert!(
        eventually(Duration::from_secs(5), || !running()),
        "the remote command outlived its host timeout: {}",
        lab.on("h1", "ps -eo pid,pgid,args").stdout
    );
}

/// The fleet table reads each host's own verdict on memory held by no
/// process: 100 MiB is held on a host whose driver declares no bookkeeping
/// (as `status`, `check` and the drain reason there say), and not on one
/// that declares 512 MiB. No allowance of the fleet's own hides it.
#[test]
fn status_h_shows_memory_held_by_no_process_as_each_host_judges_it() {
    const MIB: u64 = 1 << 20;
    let lab = Lab::new(&[Kind::Up, Kind::Up]);
    lab.host("h1").sim.leak(0, 100 * MIB).expect("leak");
    lab.host("h2").sim.leak(0, 100 * MIB).expect("leak");
    lab.host("h2")
        .sim
        .declare_bookkeeping(512 * MIB)
        .expect("bookkeeping");

    let status = lab.run(&["status", "-H", "h1,h2"]);
    assert_eq!(status.code, 0, "{}{}", status.stdout, status.stderr);
    let row = status
        .stdout
        .lines()
        .find(|line| line.trim_start().starts_with("h1"))
        .unwrap_or_else(|| panic!("no row for h1's GPU 0:\n{}", status.stdout));
    assert!(
        row.split_whitespace().nth(1) == Some("0") && row.trim_end().ends_with("100 MiB"),
        "{}",
        status.stdout
    );
    says(&status.stdout, &["Nothing held on 1 host (2 GPUs): h2"]);
    let json = lab.run(&["status", "-H", "h1,h2", "--json"]).json();
    for (host, held) in [("h1", true), ("h2", false)] {
        let gpu = &host_entry(&json, host)["report"]["gpus"][0];
        assert_eq!(gpu["memory_unattributed"], 100 * MIB, "{host}: {gpu:#}");
        assert_eq!(gpu["held_by_no_process"], held, "{host}: {gpu:#}");
    }
}

/// A Llama-3.1-8B-shaped model where every lab host reads it (the lab's
/// directory), and SGLang's command line for it on one GPU.
fn planned_engine(lab: &Lab) -> Vec<String> {
    sglang(llama_8b_in(lab.path()), &["--tp", "1"])
}

#[test]
fn plan_on_each_host_reads_its_own_holders_one_section_per_host() {
    let lab = Lab::new(&[Kind::Up, Kind::Up, Kind::Refusing]);
    let notebook = lab.hold("h2", &Holder::new("python3 notebook.py").on(0, 10 * GIB));
    let engine = planned_engine(&lab);
    let plan = |hosts: &str, json: bool| {
        let mut args = vec!["plan", "-H", hosts, "--avg-prompt", "1000", "--avg-output"];
        args.extend(["3000", "--remote-bin", env!("CARGO_BIN_EXE_gpureap")]);
        if json {
            args.push("--json");
        }
        args.push("--");
        args.extend(engine.iter().map(String::as_str));
        lab.run_as_given(&args)
    };

    // h1 is clean, h2 has a notebook on the engine's GPU, h3 refuses ssh:
    // 0, 1 and 3 merge into 3.
    let text = plan("h[1-3]", false);
    assert_eq!(text.code, 3, "{}{}", text.stdout, text.stderr);
    let out = &text.stdout;
    assert!(out.contains("h1: fits now (exit 0)"), "{out}");
    assert!(
        out.contains("h2: fits only after freeing what others hold (exit 1)"),
        "{out}"
    );
    assert!(
        out.contains(&format!("GPU 0: pid {notebook} (python3 notebook.py")),
        "{out}"
    );
    assert!(out.contains("costs every rank"), "{out}");
    assert!(
        out.contains(&format!(
            "free them: gpureap free -H h2 --gpu 0 --pid {notebook}"
        )),
        "{out}"
    );
    assert!(out.contains("Failed on 1 of 3 hosts:\n  h3:"), "{out}");
    assert!(
        out.find("h1:") < out.find("h2:") && out.find("h2:") < out.find("Failed"),
        "one section per host, in order, failures last:\n{out}"
    );

    let document = plan("h1,h2", true);
    assert_eq!(document.code, 1, "{}", document.stderr);
    let json = document.json();
    crate::schema::conforms(&crate::schema::schema(), "plan -H", &json);
    assert_eq!(json["kind"], "fleet");
    assert_eq!(json["command"], "plan");
    assert_eq!(json["exit_code"], 1);
    let h1 = &host_entry(&json, "h1")["report"];
    let h2 = &host_entry(&json, "h2")["report"];
    assert_eq!(h1["kind"], "plan");
    assert_eq!(h1["fit"]["verdict"], "fits");
    assert_eq!(h2["fit"]["verdict"], "fits_after_free");
    assert_eq!(h2["fit"]["holders"][0]["pid"], notebook);
    // Each host planned on its own GPUs: the same pool on h1 as h2 has once freed.
    assert_eq!(
        h1["device"]["tokens_per_rank"],
        h2["device_clean"]["tokens_per_rank"]
    );
    assert!(
        h2["device"]["tokens_per_rank"].as_u64() < h1["device"]["tokens_per_rank"].as_u64(),
        "{json:#}"
    );
}

/// The fleet's runner (ssh, and the local programs push runs) ends the
/// child's whole process group once the child is done: a child it forked
/// that holds the output pipe neither holds up the answer nor outlives it.
#[test]
fn a_program_that_answers_and_leaves_a_child_on_its_pipe_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let pid_file = dir.path().join("pid");
    let script = format!(
        "sleep 60 & echo $! > '{}'; echo answered",
        pid_file.display()
    );
    let argv: Vec<std::ffi::OsString> = ["sh", "-c", &script].iter().map(Into::into).collect();
    let (code, stdout) =
        gpureap_services::remote::ssh::run_local(&argv, Duration::from_secs(20), 1 << 20)
            .expect("it ran");
    assert_eq!(code, Some(0));
    assert_eq!(stdout, b"answered\n");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .expect("the script wrote its child's pid")
        .trim()
        .parse()
        .expect("a pid");
    // SIGKILLed with its group: gone as soon as the kernel has delivered it.
    let started = std::time::Instant::now();
    while crate::harness::alive(pid) && started.elapsed() < Duration::from_secs(5) {
        std::thread::yield_now();
    }
    assert!(
        !crate::harness::alive(pid),
        "the child's child {pid} outlived the call"
    );
}
