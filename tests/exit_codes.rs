//! One exit-code table (crates/core/src/exit.rs): every `--help` prints its program's
//! rows, and the commands return what the table says, on a real /proc with
//! the simulated driver.

use std::process::{Command, Stdio};
use std::time::Duration;

use clap::CommandFactory;
use gpureap_core::driver::sim::incident::Holder;
use gpureap_core::exit::{self, Program};

use crate::harness::*;

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
        "every program has rows in crates/core/src/exit.rs, and no others"
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

    let (host, mut incident) = Sim::gpus(2).stage();
    let holder = incident.hold(Holder::new("python3 train.py").on(0, 10 * GIB));
    host.lose(1).expect("lose");
    let status = run(&host, &["status"]);
    assert_eq!(status.code, 3, "{}{}", status.stdout, status.stderr);
    // The table is still printed: the holder on GPU 0, the lost GPU 1.
    assert_contains(&status.stdout, &holder.to_string());
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
    let host = Sim::gpus(2).build();
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
    // --prometheus counts what the driver lists; monitors are not in it.
    let both = Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", "none", "status", "--monitors", "--prometheus"])
        .output()
        .expect("runs");
    assert_eq!(both.status.code(), Some(2));
    assert!(both.stdout.is_empty());
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with"));
    // GPUREAP_SSH in the environment is a default, not a flag given.
    let host = Sim::gpus(1).build();
    let status = gpureap(&host)
        .arg("status")
        .env("GPUREAP_SSH", "ssh -p 2222")
        .output()
        .expect("runs");
    assert_eq!(status.status.code(), Some(0));
}

/// Where a line of Rust picks an exit number by hand: a literal given to
/// `process::exit`, `_exit`, `ExitCode::from` or an `exit_code` field, a
/// process's or a remote's code compared with a literal or matched against
/// one, or `128 +` a signal. Comments are skipped, and so are the unit
/// tests at the end of a file.
fn hand_chosen_exit_numbers(source: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = source.lines().collect();
    let mut found = Vec::new();
    for (index, raw) in lines.iter().enumerate() {
        if raw.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let line = raw.split("//").next().unwrap_or("");
        let digit_after = |needle: &str| {
            line.match_indices(needle).any(|(at, _)| {
                line[at + needle.len()..]
                    .trim_start_matches("Some(")
                    .starts_with(|c: char| c.is_ascii_digit() || c == '-')
            })
        };
        let about_a_code = line.contains("code") || line.contains("exit_status");
        let arm = {
            let arm = line.trim_start().trim_start_matches("Some(");
            arm.starts_with(|c: char| c.is_ascii_digit()) && line.contains("=>")
        };
        // The `match` an arm belongs to: the nearest one above it.
        let matched_on_a_code = arm
            && lines[index.saturating_sub(40)..index]
                .iter()
                .rev()
                .find(|above| above.contains("match "))
                .is_some_and(|above| above.contains("code") || above.contains("status"));
        let chosen = ["process::exit(", "_exit(", "ExitCode::from(", "exit_code: "]
            .iter()
            .any(|call| digit_after(call))
            || (about_a_code && ["== ", "!= "].iter().any(|op| digit_after(op)))
            // 128 + a signal, not sums of numbers (`128 + 128` head sizes).
            || (line.contains("128 +") && !digit_after("128 + "))
            || line.match_indices("+ 128").any(|(at, _)| {
                !line[..at]
                    .trim_end()
                    .ends_with(|c: char| c.is_ascii_digit())
            })
            || line.contains("matches!(") && about_a_code && digit_after("Some(")
            || matched_on_a_code;
        if chosen {
            found.push((index + 1, raw.trim().to_string()));
        }
    }
    found
}

fn rust_files(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// No exit number is chosen outside the table (crates/core/src/exit.rs):
/// every command, front end,
/// thread and stand-in names its outcome there.
#[test]
fn no_exit_number_is_chosen_outside_the_table() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("crates"), &mut files);
    files.sort();
    let mut chosen = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(root).expect("under the root");
        if relative == std::path::Path::new("crates/core/src/exit.rs") {
            continue;
        }
        let source = std::fs::read_to_string(file).expect("readable");
        for (line, text) in hand_chosen_exit_numbers(&source) {
            chosen.push(format!("{}:{line}: {text}", relative.display()));
        }
    }
    assert!(
        chosen.is_empty(),
        "exit numbers chosen outside crates/core/src/exit.rs:\n{}",
        chosen.join("\n")
    );
}

/// The scan finds each shape a hand-chosen exit number has had.
#[test]
fn the_scan_finds_each_shape_of_a_hand_chosen_exit_number() {
    for shape in [
        "            std::process::exit(128 + signal);",
        "                    std::process::exit(143);",
        "    unsafe { libc::_exit(3) }",
        "    std::process::ExitCode::from(2)",
        "        exit_code: 3,",
        "            let code = if remote_code == 2 { 2 } else { 3 };",
        "    if code != Some(0) || !version.starts_with(\"gpureap \") {",
        "        Ok(look) if look.code == Some(0) => fields(&look.stdout),",
        "    status.exit_status() == Some(0) || status.terminating_signal() == Some(15)",
        "        match code {\n            Some(255) => {}\n            _ => {}\n        }",
        "        let code = match remote_code {\n            0..=3 => remote_code as u8,\n            _ => 3,\n        };",
    ] {
        assert!(
            !hand_chosen_exit_numbers(shape).is_empty(),
            "not found: {shape}"
        );
    }
    for fine in [
        "    std::process::exit(Exit::Signalled(signal).into());",
        "        exit_code: Exit::Incomplete,",
        "    // exit(3) in a comment",
        "        match unit {\n            1 => Some(0),\n        }",
        "#[cfg(test)]\nmod tests {\n    assert_eq!(code, 3);\n}",
    ] {
        assert!(hand_chosen_exit_numbers(fine).is_empty(), "flagged: {fine}");
    }
}

/// A GPU the driver lost is one class everywhere: `free`, `wait` and
/// `reset` each end at once with 3 ("could not complete or could not
/// tell"), never 1 ("still held") and never after a timeout.
#[test]
fn a_lost_gpu_gives_3_through_free_wait_and_reset() {
    let host = Sim::gpus(2).build();
    host.lose(1).expect("lose");
    for args in [
        &["free", "--gpu", "1", "--yes", "--timeout", "1h", "--json"][..],
        &["wait", "--gpu", "1", "--timeout", "1h", "--json"],
        &["reset", "--gpu", "1"],
    ] {
        let mut command = gpureap(&host);
        command.args(args);
        let result = ends_within(&mut command, Duration::from_secs(60), args[0]);
        assert_eq!(
            result.code, 3,
            "{args:?}:\n{}{}",
            result.stdout, result.stderr
        );
        assert!(
            format!("{}{}", result.stdout, result.stderr).contains("lost"),
            "{args:?} does not name the lost GPU:\n{}{}",
            result.stdout,
            result.stderr
        );
    }
}
