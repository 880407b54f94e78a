//! Text that anyone controls (a process's argv[0] and comm, a host's
//! answers) on its way to a terminal, a report or a JSON document: written
//! out by one escaping step (`units::one_line`), never acted on, never a
//! line of its own (docs/security.md).

use std::io::Write;
use std::process::{Command, Stdio};

use gpureap_core::driver::sim::incident::Incident;
use gpureap_core::exit::Exit;

use crate::harness::*;
use crate::sshd_lab::{Kind, Lab};

/// The issue's example: an argv[0] that moves up and erases the two lines
/// above it (the plan), then writes a verdict of its own.
const ERASER: &str = "\x1b[1A\x1b[2K\x1b[1A\x1b[2KNothing in scope to signal.x";
/// What the hostile names try to make a person read as a line of gpureap's.
const FORGED: &str = "Nothing in scope to signal.";
/// A comm (15 bytes at most) that tries to start a line.
const LIAR_COMM: &[u8] = b"c\r\nFORGED-COMM";
const FORGED_COMM: &str = "FORGED-COMM";
/// An argv[0] with a newline, a carriage return and an escape sequence.
const LIAR: &[u8] = b"liar\nNothing in scope to signal.\r\x1b[2K";

/// The eraser and the liar, both on GPU 0: their PIDs.
fn stage(incident: &mut Incident) -> (u32, u32) {
    incident
        .spawn(&named_holder(ERASER, ERASER.as_bytes(), b"sleep", 0), 1)
        .expect("eraser");
    incident
        .spawn(&named_holder("liar", LIAR, LIAR_COMM, 0), 1)
        .expect("liar");
    (
        incident.pid_of(ERASER).expect("eraser's pid"),
        incident.pid_of("liar").expect("liar's pid"),
    )
}

/// Single quotes for sh.
fn quoted(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// Runs `argv` on a pseudo-terminal (util-linux `script`), typing `input`:
/// its exit code, and the bytes the terminal was sent, with the terminal's
/// own CR LF line ends read as LF.
fn on_a_terminal(command: &mut Command, argv: &[&str], input: &str) -> (i32, String) {
    let line: Vec<String> = argv.iter().map(|word| quoted(word)).collect();
    let mut child = command
        .args(["-qfec", &line.join(" "), "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("typed");
    let output = child.wait_with_output().expect("script ends");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).replace("\r\n", "\n"),
    )
}

/// `free`'s question on a terminal: the plan lists both processes, their
/// names written out, and nothing in them moves the cursor, erases the
/// plan or starts a line of its own. Answered `n`, nothing is signalled.
#[test]
fn free_asks_on_a_terminal_with_hostile_names_written_out() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let (eraser, liar) = stage(&mut incident);
    let (code, terminal) = on_a_terminal(
        &mut Command::new("script"),
        &[
            env!("CARGO_BIN_EXE_gpureap"),
            "--backend",
            &host.backend(),
            "free",
            "--gpu",
            "0",
        ],
        "n\n",
    );
    assert_no_forged_lines("free's question", &terminal, &[FORGED, FORGED_COMM]);
    assert_eq!(code, i32::from(Exit::Usage.code()), "{terminal}");
    assert!(terminal.contains("Proceed? [y/N]"), "{terminal}");
    for pid in [eraser, liar] {
        assert!(terminal.contains(&format!(" {pid} ")), "{pid}: {terminal}");
        assert!(alive(pid), "{pid} was signalled");
    }
    assert!(
        terminal.contains("\\u{1b}[1A\\u{1b}[2K\\u{1b}[1A\\u{1b}[2KNothing in scope"),
        "{terminal}"
    );
    assert!(
        terminal.contains("liar\\nNothing in scope to signal.\\r\\u{1b}[2K"),
        "{terminal}"
    );
}

/// Every report that quotes a process keeps its name on the line it
/// belongs to: the tables, the tree, the plan, `reset`'s refusal (which
/// names the comm) and `free`'s outcome.
#[test]
fn reports_keep_hostile_names_written_out_on_their_line() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let (_, liar) = stage(&mut incident);
    // The command line, where a report shows it; `reset` names the comm.
    let command_line = "liar\\nNothing in scope to signal.\\r\\u{1b}[2K";
    // The status table fits 120 columns: with five-digit PIDs its COMMAND
    // column is cut before the end, past the escapes that matter.
    let cut_to_fit = "liar\\nNothing in scope to signal.\\r";
    for (args, written_out) in [
        (&["status"][..], cut_to_fit),
        (&["status", "--tree"], command_line),
        (&["free", "--gpu", "0", "--dry-run"], command_line),
        (&["reset", "--gpu", "0"], "(c\\r\\nFORGED-COMM)"),
        (
            &["free", "--gpu", "0", "--yes", "--grace", "0"],
            command_line,
        ),
    ] {
        let result = run(&host, args);
        assert_no_forged_lines(
            &format!("{args:?}"),
            &format!("{}{}", result.stdout, result.stderr),
            &[FORGED, FORGED_COMM],
        );
        assert!(
            result.stdout.contains(written_out),
            "{args:?}:\n{}",
            result.stdout
        );
    }
    assert!(!alive(liar));
}

/// JSON is for programs, and stays JSON whatever a command line holds:
/// serde_json leaves DEL, C1 controls and bidirectional overrides raw, and
/// the terminal escaping made `\u{7f}` of them, which no JSON parser reads.
/// Now they are JSON escapes, and the value is the process's own.
#[test]
fn json_stays_json_whatever_a_command_line_holds() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let title = "json\u{7f}\u{9b}31m\u{202e}gnp.exe";
    incident
        .spawn(&named_holder("json", title.as_bytes(), b"sleep", 0), 1)
        .expect("holder");
    let pid = incident.pid_of("json").expect("pid");
    for args in [
        &["status", "--json"][..],
        &["free", "--gpu", "0", "--dry-run", "--json"],
    ] {
        let result = run(&host, args);
        assert!(
            !result
                .stdout
                .chars()
                .any(|c| c.is_control() && c != '\n' || c == '\u{202e}'),
            "{args:?} wrote a raw control character: {:?}",
            result.stdout
        );
        let document = result.json();
        let cmdline = document[if args[0] == "status" {
            "holders"
        } else {
            "targets"
        }]
        .as_array()
        .expect("array")
        .iter()
        .find(|entry| entry["pid"] == pid)
        .and_then(|entry| entry["cmdline"].as_str())
        .unwrap_or_else(|| panic!("{args:?}: pid {pid} not listed"))
        .to_string();
        assert_eq!(cmdline, format!("{title} 100000"), "{args:?}");
    }
}

/// `free -H`'s question on a terminal is built from the hosts' answers: a
/// process there that names itself like the eraser and the liar is written
/// out, and a host whose gpureap says something hostile on stderr is quoted
/// the same way among the failures.
#[test]
fn free_h_asks_with_a_hosts_hostile_names_written_out() {
    let lab = Lab::new(&[Kind::Up]);
    let eraser = lab.hold_script(
        "h1",
        ERASER,
        &named_holder(ERASER, ERASER.as_bytes(), b"sleep", 0),
    );
    let liar = lab.hold_script("h1", "liar", &named_holder("liar", LIAR, LIAR_COMM, 0));
    let mut command = Command::new("script");
    command
        .env_remove("GPUREAP_BACKEND")
        .env("GPUREAP_SSH", lab.ssh());
    let (code, terminal) = on_a_terminal(
        &mut command,
        &[
            env!("CARGO_BIN_EXE_gpureap"),
            "free",
            "-H",
            "h1",
            "--gpu",
            "0",
            "--remote-bin",
            env!("CARGO_BIN_EXE_gpureap"),
        ],
        "n\n",
    );
    // What the terminal shows from the plan on; above it, gpureap's own
    // progress line redraws itself.
    let question = &terminal[terminal.find("Would signal").unwrap_or(0)..];
    assert_no_forged_lines("free -H's question", question, &[FORGED, FORGED_COMM]);
    assert_eq!(code, i32::from(Exit::Usage.code()), "{terminal}");
    assert!(terminal.contains("Proceed on 1 host? [y/N]"), "{terminal}");
    for pid in [eraser, liar] {
        assert!(terminal.contains(&format!(" {pid} ")), "{pid}: {terminal}");
    }
    assert!(terminal.contains("liar\\nNothing in scope"), "{terminal}");

    // A host's own words: the last line its gpureap wrote on stderr.
    let liar_bin = lab.path().join("liar-gpureap");
    std::fs::write(
        &liar_bin,
        "#!/bin/sh\nprintf '\\033[1A\\033[2KNothing in scope to signal.\\r\\n' >&2\nexit 3\n",
    )
    .expect("liar's gpureap");
    std::fs::set_permissions(
        &liar_bin,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let status = lab.run_as_given(&[
        "status",
        "-H",
        "h1",
        "--remote-bin",
        &liar_bin.display().to_string(),
    ]);
    assert_no_forged_lines(
        "status -H of a lying host",
        &format!("{}{}", status.stdout, status.stderr),
        &[FORGED],
    );
    assert_contains(
        &status.stdout,
        "h1: \\u{1b}[1A\\u{1b}[2KNothing in scope to signal.",
    );
}

/// A title and a comm made of characters a terminal shows nothing of: a
/// zero-width joiner, a left-to-right isolate (U+2066), a byte order mark
/// (U+FEFF) and a tag character (U+E0041, an invisible "A"). Each report
/// writes every one of them out (`\u{200d}`), so that two processes whose
/// names differ only by them do not read the same; JSON keeps the value
/// the process's own, as `\u` escapes. Before: all four reached the
/// terminal raw (the rule knew only controls, separators and bidi marks).
#[test]
fn invisible_characters_in_a_name_are_written_out() {
    const INVISIBLE: [char; 4] = ['\u{200d}', '\u{2066}', '\u{feff}', '\u{e0041}'];
    let (host, mut incident) = Sim::gpus(1).stage();
    let title = "zwj\u{200d}x\u{2066}y\u{feff}z\u{e0041}w";
    let comm = "z\u{200d}\u{2066}\u{feff}\u{e0041}";
    incident
        .spawn(
            &named_holder("zwj", title.as_bytes(), comm.as_bytes(), 0),
            1,
        )
        .expect("holder");
    let pid = incident.pid_of("zwj").expect("pid");
    let title_written = "zwj\\u{200d}x\\u{2066}y\\u{feff}z\\u{e0041}w";
    for (args, written_out) in [
        (&["status"][..], title_written),
        (&["status", "--tree"], title_written),
        (
            &["reset", "--gpu", "0"],
            "(z\\u{200d}\\u{2066}\\u{feff}\\u{e0041})",
        ),
    ] {
        let result = run(&host, args);
        let shown = format!("{}{}", result.stdout, result.stderr);
        assert!(
            !shown.contains(INVISIBLE),
            "{args:?} wrote an invisible character raw: {shown:?}"
        );
        assert!(result.stdout.contains(written_out), "{args:?}:\n{shown}");
    }
    let result = run(&host, &["status", "--json"]);
    assert!(
        !result.stdout.contains(INVISIBLE),
        "status --json wrote an invisible character raw: {:?}",
        result.stdout
    );
    assert!(
        result.stdout.contains("\\u200d") && result.stdout.contains("\\udb40\\udc41"),
        "{}",
        result.stdout
    );
    let document = result.json();
    let cmdline = document["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|holder| holder["pid"] == pid)
        .and_then(|holder| holder["cmdline"].as_str())
        .unwrap_or_else(|| panic!("pid {pid} not listed: {document}"));
    assert_eq!(cmdline, format!("{title} 100000"));
}
