//! One exit-code table (src/exit.rs): every `--help` prints its program's
//! rows, and the commands return what the table says, on a real /proc with
//! the simulated driver.

use std::process::{Command, Stdio};
use std::time::Duration;

use clap::CommandFactory;
use gpureap::driver::sim::incident::{Holder, Incident, SimHost};
use gpureap::exit::{self, Program};

use crate::harness::*;

fn host(gpus: u32) -> SimHost {
    SimHost::new(gpus, 80 * GIB, "Simulated H200").expect("sim host")
}

/// Every program in the command tree, by the words that name it.
fn programs_in(command: &clap::Command, words: &mut Vec<String>, found: &mut Vec<Vec<String>>) {
    found.push(words.clone());
    for sub in command.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        words.push(sub.get_name().to_string());
        programs_in(sub, words, found);
        words.pop();
    }
}

#[test]
fn every_help_lists_the_codes_its_program_returns_from_the_one_table() {
    let mut found = Vec::new();
    programs_in(&gpureap::cli::Cli::command(), &mut Vec::new(), &mut found);
    let mut tabled: Vec<Vec<String>> = Program::ALL
        .iter()
        .map(|program| program.words().iter().map(|w| w.to_string()).collect())
        .collect();
    found.sort();
    tabled.sort();
    assert_eq!(
        found, tabled,
        "every program has rows in src/exit.rs, and no others"
    );
    for program in Program::ALL {
        let output = Command::new(env!("CARGO_BIN_EXE_gpureap"))
            .args(program.words())
            .arg("--help")
            .env_remove("GPUREAP_BACKEND")
            .output()
            .expect("runs");
        let help = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{program:?}: {help}");
        let block = exit::help(program);
        assert!(
            help.trim_end().ends_with(&block),
            "`gpureap {}` --help does not end with its exit codes:\n{block}\n---\n{help}",
            program.words().join(" ")
        );
        // Only one exit-code block, so no hand-written one disagrees with it.
        assert_eq!(
            help.matches("Exit codes").count(),
            1,
            "{program:?}:\n{help}"
        );
    }
}

#[test]
fn the_readme_shows_the_same_rows() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    for (exit, meaning) in exit::rows(Program::Gpureap) {
        let row = format!("| {} | {meaning} |", exit.code());
        assert!(readme.contains(&row), "README.md lacks the row `{row}`");
    }
}

#[test]
fn status_that_cannot_tell_exits_3_and_still_shows_what_it_read() {
    let none = Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", "none", "status"])
        .env_remove("GPUREAP_BACKEND")
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&none.stdout);
    assert_eq!(none.status.code(), Some(3), "{text}");
    assert!(text.contains("--backend none"), "{text}");

    let host = host(2);
    let mut incident = Incident::new(&host);
    let holder = incident
        .holder(&Holder::new("python3 train.py").on(0, 10 * GIB))
        .expect("holder");
    host.lose(1).expect("lose");
    let status = run(&host, &["status"]);
    assert_eq!(status.code, 3, "{}{}", status.stdout, status.stderr);
    // The table is still printed: the holder on GPU 0, the lost GPU 1.
    assert!(
        status.stdout.contains(&holder.to_string()),
        "{}",
        status.stdout
    );
    assert!(status.stdout.contains("lost"), "{}", status.stdout);
    let json = run(&host, &["status", "--json"]);
    assert_eq!(json.code, 3);
    assert_eq!(gpu(&json.json(), 0)["index"], 0);
    // A scope that leaves the lost GPU out can tell.
    assert_eq!(run(&host, &["status", "--gpu", "0"]).code, 0);
    // --prometheus says it in the metrics, and exits 0 so that the textfile
    // collector's `> f.tmp && mv f.tmp f.prom` writes them.
    let metrics = run(&host, &["status", "--prometheus"]);
    assert_eq!(metrics.code, 0, "{}", metrics.stderr);
    assert!(
        metrics
            .stdout
            .lines()
            .any(|line| line.starts_with("gpureap_gpu_up{gpu=\"1\"") && line.ends_with(" 0.0")),
        "{}",
        metrics.stdout
    );
}

#[test]
fn wait_on_a_lost_gpu_exits_3_at_once() {
    let host = host(2);
    host.lose(1).expect("lose");
    let mut command = gpureap(&host);
    command.args(["wait", "--gpu", "0,1", "--timeout", "1h", "--json"]);
    let result = ends_within(&mut command, Duration::from_secs(60), "wait on a lost GPU");
    assert_eq!(result.code, 3, "{}{}", result.stdout, result.stderr);
    let report = result.json();
    assert_eq!(report["ready"], false);
    assert!(
        gpu(&report, 1)["error"]
            .as_str()
            .is_some_and(|e| e.contains("lost"))
    );
    assert!(result.stderr.contains("GPU 1"), "{}", result.stderr);
}

#[test]
fn a_flag_that_means_nothing_for_the_subcommand_is_refused_with_2() {
    for args in [
        &["--backend", "none", "demo"][..],
        &["demo", "--backend", "none"],
        &["push", "--backend", "none", "-H", "nohost.invalid"],
        &["status", "--ssh", "ssh -p 2222"],
        &["free", "--ssh", "ssh", "--gpu", "0", "--dry-run"],
        &["wait", "--ssh", "ssh", "--timeout", "1s"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_gpureap"))
            .args(args)
            .env_remove("GPUREAP_BACKEND")
            .env_remove("GPUREAP_SSH")
            .stdin(Stdio::null())
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("means nothing"), "{args:?}: {stderr}");
        // Refused before anything ran: no demo transcript, no ssh.
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    // GPUREAP_SSH in the environment is a default, not a flag given.
    let host = host(1);
    let status = gpureap(&host)
        .arg("status")
        .env("GPUREAP_SSH", "ssh -p 2222")
        .output()
        .expect("runs");
    assert_eq!(status.status.code(), Some(0));
}
