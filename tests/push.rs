//! `gpureap push`, against real sshd hosts (tests/sshd_lab.rs), each with
//! its own /usr/local, /var/lib and /root: installed where none was, skipped
//! where the same build is, a file push did not put there left alone, an
//! unreachable host reported; then `status -H` finds the pushed binary with
//! no --remote-bin, although /usr/local/bin is not on the hosts' PATH.

use serde_json::Value;

use crate::harness::Run;
use crate::says::says;
use crate::sshd_lab::{Kind, Lab, host_entry};

const BIN: &str = env!("CARGO_BIN_EXE_gpureap");

fn push(lab: &Lab, args: &[&str]) -> Run {
    let mut args = args.to_vec();
    args.insert(0, "push");
    lab.run_as_given(&args)
}

fn action(document: &Value, host: &str) -> String {
    host_entry(document, host)["report"]["action"]
        .as_str()
        .unwrap_or_else(|| panic!("{host} has no action: {document:#}"))
        .to_string()
}

#[test]
fn push_installs_skips_refuses_and_the_fleet_then_finds_it() {
    let lab = Lab::new(&[Kind::Up, Kind::Up, Kind::Up, Kind::Refusing]);
    let on_path = lab.on("h1", "command -v gpureap; echo PATH=$PATH");
    assert!(
        !on_path.stdout.contains("/usr/local/bin"),
        "{}",
        on_path.stdout
    );
    // Before any push, the hosts have no gpureap.
    let status = lab.run_as_given(&["status", "-H", "h1"]);
    assert_eq!(status.code, 3);
    says(
        &status.stdout,
        &["h1: gpureap not found on the host (install it or pass --remote-bin)"],
    );

    let first = push(&lab, &["-H", "h2", "--json"]);
    assert_eq!(first.code, 0, "{}{}", first.stdout, first.stderr);
    assert_eq!(action(&first.json(), "h2"), "installed");
    // A file push did not put there.
    let foreign = lab.on("h3", "mkdir -p /usr/local/bin && printf '#!/bin/sh\\necho site wrapper\\n' > /usr/local/bin/gpureap && chmod 755 /usr/local/bin/gpureap");
    assert_eq!(foreign.code, 0, "{}", foreign.stderr);

    let all = push(&lab, &["-H", "h[1-4]", "--json"]);
    let document = all.json();
    assert_eq!(all.code, 3, "{document:#}");
    assert_eq!(action(&document, "h1"), "installed");
    assert_eq!(action(&document, "h2"), "up_to_date");
    assert_eq!(action(&document, "h3"), "refused");
    assert_eq!(host_entry(&document, "h3")["exit_code"], 1);
    assert!(
        host_entry(&document, "h4")["error"]
            .as_str()
            .is_some_and(|e| e.contains("Connection refused"))
    );
    let version = std::process::Command::new(BIN)
        .arg("--version")
        .output()
        .expect("version");
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    assert_eq!(
        host_entry(&document, "h1")["report"]["version"],
        version.as_str()
    );
    assert_eq!(
        host_entry(&document, "h1")["report"]["path"],
        "/usr/local/bin/gpureap"
    );
    // The site's file is untouched, and nothing was left beside it.
    let there = lab.on("h3", "cat /usr/local/bin/gpureap; ls -A /usr/local/bin");
    assert_eq!(there.stdout, "#!/bin/sh\necho site wrapper\ngpureap\n");
    // The same bytes on h1 as here.
    let sum = lab.on("h1", "sha256sum < /usr/local/bin/gpureap");
    assert!(
        sum.stdout.starts_with(
            host_entry(&document, "h1")["report"]["sha256"]
                .as_str()
                .expect("sha")
        )
    );

    // Text: one line per host that changed, the rest summed up, failures last.
    let text = push(&lab, &["-H", "h[1-4]"]);
    says(
        &text.stdout,
        &[
            "Up to date on 2 hosts: h[1-2]",
            "a different file is at /usr/local/bin/gpureap",
            "h4: ssh: connect to host",
        ],
    );

    let forced = push(&lab, &["-H", "h3", "--force", "--json"]);
    assert_eq!(forced.code, 0, "{}", forced.stdout);
    assert_eq!(action(&forced.json(), "h3"), "updated");

    // The fleet finds it without --remote-bin.
    let status = lab.run_as_given(&["status", "-H", "h[1-3]", "--json"]);
    assert_eq!(status.code, 0, "{}{}", status.stdout, status.stderr);
    for host in ["h1", "h2", "h3"] {
        assert_eq!(host_entry(&status.json(), host)["report"]["kind"], "status");
    }
}

#[test]
fn push_refuses_what_is_not_a_gpureap_and_bad_destinations() {
    let lab = Lab::new(&[Kind::Up]);
    let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    for (args, says) in [
        (vec!["-H", "h1", "--bin", readme], "not an ELF executable"),
        (
            vec!["-H", "h1", "--bin", "/bin/true"],
            "does not say gpureap",
        ),
        (
            vec!["-H", "h1", "--bin", "/nonexistent"],
            "cannot read --bin",
        ),
        (vec!["-H", "h1", "--to", "relative/gpureap"], "invalid --to"),
        (vec!["-H", "h1", "--to", "/usr/local/bin/"], "invalid --to"),
        (vec!["--to", "/tmp/x"], "push needs the hosts"),
        (
            vec!["-H", "h1", "--remote-bin", "/opt/gpureap"],
            "push takes --to PATH (where to install), not --remote-bin",
        ),
    ] {
        let run = push(&lab, &args);
        assert_eq!(run.code, 2, "{args:?}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(says), "{args:?}: {}", run.stderr);
    }
    // A directory at the destination is refused, not replaced.
    lab.on("h1", "mkdir -p /usr/local/bin/gpureap");
    let run = push(&lab, &["-H", "h1", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert_eq!(action(&run.json(), "h1"), "refused");
    // --to elsewhere, then --remote-bin finds it there.
    let run = push(
        &lab,
        &["-H", "h1", "--to", "/usr/local/my tools/gpureap", "--json"],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(
        host_entry(&run.json(), "h1")["report"]["path"],
        "/usr/local/my tools/gpureap"
    );
    let status: Run = lab.run_as_given(&[
        "status",
        "-H",
        "h1",
        "--remote-bin",
        "/usr/local/my tools/gpureap",
        "--json",
    ]);
    assert_eq!(status.code, 0, "{}{}", status.stdout, status.stderr);
    lab.on("h1", "rm -rf '/usr/local/my tools'");
}

/// A small ELF program built here from C: a stand-in `--bin` that says
/// what `source` prints, or hangs.
fn tiny_elf(dir: &std::path::Path, name: &str, source: &str) -> String {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).expect("source");
    let out = dir.join(name);
    let built = std::process::Command::new("cc")
        .arg("-O")
        .arg("-o")
        .arg(&out)
        .arg(&c)
        .status()
        .expect("cc runs (the tests need a C compiler, as cargo does)");
    assert!(built.success());
    out.display().to_string()
}

/// C source of a program that prints `version` and exits 0.
fn printing(version: &str) -> String {
    format!("#include <stdio.h>\nint main(void) {{ puts(\"{version}\"); return 0; }}\n")
}

#[test]
fn push_runs_no_file_it_did_not_put_there_and_replaces_no_link() {
    let lab = Lab::new(&[Kind::Up]);
    // Another user's file, planted where a push is going: a shared, sticky directory.
    let planted = lab.on(
        "h1",
        "mkdir -p /usr/local/shared && chmod 1777 /usr/local/shared && printf '#!/bin/sh\\ntouch /usr/local/planted-ran\\necho gpureap 0.0.0\\n' > /usr/local/shared/gpureap && chmod 755 /usr/local/shared/gpureap && chown nobody /usr/local/shared/gpureap",
    );
    assert_eq!(planted.code, 0, "{}", planted.stderr);
    let ran = || {
        lab.on("h1", "test -e /usr/local/planted-ran && echo ran")
            .stdout
            .contains("ran")
    };
    let run = push(
        &lab,
        &["-H", "h1", "--to", "/usr/local/shared/gpureap", "--json"],
    );
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert_eq!(action(&run.json(), "h1"), "refused");
    assert!(!ran(), "push ran the planted file as root");
    let run = push(
        &lab,
        &[
            "-H",
            "h1",
            "--to",
            "/usr/local/shared/gpureap",
            "--force",
            "--json",
        ],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(action(&run.json(), "h1"), "updated");
    assert!(!ran(), "push --force ran the planted file as root");

    // A directory anyone may write to without the sticky bit: what push
    // leaves there could be swapped before it runs; refused.
    lab.on(
        "h1",
        "mkdir -p /usr/local/open && chmod 777 /usr/local/open",
    );
    let run = push(
        &lab,
        &["-H", "h1", "--to", "/usr/local/open/gpureap", "--json"],
    );
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let reason = host_entry(&run.json(), "h1")["report"]["reason"].to_string();
    assert!(
        reason.contains("can be changed by another user"),
        "{reason}"
    );
    let left = lab.on("h1", "ls -A /usr/local/open");
    assert_eq!(left.stdout, "", "left behind: {}", left.stdout);
    // Root's own directory below that one (or through it): the one rule
    // judges every directory on the way, as it does for a --log.
    lab.on("h1", "mkdir -m 755 /usr/local/open/bin");
    for to in [
        "/usr/local/open/bin/gpureap",
        "/usr/local/open/../bin/gpureap",
    ] {
        let run = push(&lab, &["-H", "h1", "--to", to, "--json"]);
        assert_eq!(run.code, 1, "{to}: {}{}", run.stdout, run.stderr);
        let reason = host_entry(&run.json(), "h1")["report"]["reason"].to_string();
        assert!(
            reason.contains("others than its owner may write to /usr/local/open (mode 0777, without the sticky bit)"),
            "{to}: {reason}"
        );
    }
    let left = lab.on("h1", "ls -A /usr/local/open/bin");
    assert_eq!(left.stdout, "", "left behind: {}", left.stdout);

    // --force onto a link to a directory: never "updated" with the binary
    // hidden inside the directory.
    lab.on(
        "h1",
        "mkdir -p /usr/local/bin /usr/local/lib/gpureap.d && ln -s /usr/local/lib/gpureap.d /usr/local/bin/gpureap",
    );
    let run = push(&lab, &["-H", "h1", "--force", "--json"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert_eq!(action(&run.json(), "h1"), "refused");
    let inside = lab.on("h1", "ls -A /usr/local/lib/gpureap.d");
    assert_eq!(
        inside.stdout, "",
        "hidden in the directory: {}",
        inside.stdout
    );

    // A --to with a newline could forge the look's answer: refused here.
    let run = push(
        &lab,
        &["-H", "h1", "--to", "/usr/local/x\nsha256=0", "--json"],
    );
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    says(&run.stderr, &["invalid --to"]);

    // A local --bin that never finishes its --version: bounded.
    let dir = tempfile::tempdir().expect("dir");
    let hangs = tiny_elf(
        dir.path(),
        "hangs",
        "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n",
    );
    let started = std::time::Instant::now();
    let run: Run = std::process::Command::new("timeout")
        .args(["-s", "KILL", "60", BIN, "push", "-H", "h1", "--bin", &hangs])
        .env("GPUREAP_SSH", lab.ssh())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("gpureap runs")
        .into();
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    says(&run.stderr, &["did not finish within"]);
    assert!(started.elapsed() < std::time::Duration::from_secs(40));
}

#[test]
fn concurrent_pushes_to_one_host_lose_no_record() {
    let lab = Lab::new(&[Kind::Up]);
    let dir = tempfile::tempdir().expect("dir");
    let first = tiny_elf(dir.path(), "first", &printing("gpureap 9.9.1 (test build)"));
    let second = tiny_elf(
        dir.path(),
        "second",
        &printing("gpureap 9.9.2 (test build)"),
    );
    const PUSHES: usize = 12;
    // A long ledger from earlier pushes: each update takes a while to
    // write, so that concurrent ones overlap.
    const EARLIER: usize = 300_000;
    let filled = lab.on(
        "h1",
        &format!("mkdir -p /var/lib/gpureap && seq {EARLIER} | awk '{{printf \"%064d /usr/local/old%d/gpureap\\n\", 0, $1}}' > /var/lib/gpureap/pushed"),
    );
    assert_eq!(filled.code, 0, "{}", filled.stderr);
    let concurrently = |bin: &str| -> Vec<Run> {
        let children: Vec<_> = (0..PUSHES)
            .map(|at| {
                lab.gpureap()
                    .args(["push", "-H", "h1", "--bin", bin, "--json", "--to"])
                    .arg(format!("/usr/local/t{at}/gpureap"))
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("gpureap runs")
            })
            .collect();
        children
            .into_iter()
            .map(|child| child.wait_with_output().expect("output").into())
            .collect()
    };
    for run in concurrently(&first) {
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        assert_eq!(action(&run.json(), "h1"), "installed");
    }
    let ledger = lab.on("h1", "cat /var/lib/gpureap/pushed");
    for at in 0..PUSHES {
        let path = format!("/usr/local/t{at}/gpureap");
        assert!(
            ledger
                .stdout
                .lines()
                .any(|line| line.ends_with(&format!(" {path}"))),
            "{path} is not in the ledger:\n{}",
            ledger.stdout
        );
    }
    // Each is then updated, not refused as "not put there by gpureap push".
    for run in concurrently(&second) {
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        assert_eq!(action(&run.json(), "h1"), "updated");
    }
    let ledger = lab.on("h1", "wc -l < /var/lib/gpureap/pushed");
    assert_eq!(ledger.stdout.trim(), (EARLIER + PUSHES).to_string());
}
