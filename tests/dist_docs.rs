//! The man pages and completions of the release artifacts (examples/dist-docs, from the clap
//! definitions of src/cli.rs): every command that `--help` lists has its page, and each page
//! names every flag that command's `--help` shows, read from the real binary.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

#[path = "../examples/dist-docs/pages.rs"]
pub mod pages;

/// `gpureap WORDS --help`, run.
fn help(words: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(words)
        .arg("--help")
        .output()
        .expect("gpureap runs");
    assert!(output.status.success(), "gpureap {words:?} --help failed");
    String::from_utf8(output.stdout).expect("help is UTF-8")
}

/// The subcommands a help text lists under `Commands:`, but `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// The long flags a help text shows (`--gpu <LIST>`, `-y, --yes`).
fn flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with('-'))
        .flat_map(|line| line.split([' ', ',', '=', '[', '<']))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(str::to_string)
        .collect()
}

/// Every command reachable from `gpureap --help`, as the words that call it.
fn commands() -> Vec<Vec<String>> {
    let mut found = vec![Vec::new()];
    let mut pending = vec![Vec::<String>::new()];
    while let Some(words) = pending.pop() {
        let words_ref: Vec<&str> = words.iter().map(String::as_str).collect();
        for sub in subcommands(&help(&words_ref)) {
            let mut deeper = words.clone();
            deeper.push(sub);
            found.push(deeper.clone());
            pending.push(deeper);
        }
    }
    found
}

#[test]
fn every_command_has_a_man_page_naming_each_flag_of_its_help() {
    let folder = tempfile::tempdir().expect("tempdir");
    let written = pages::man_pages(folder.path()).expect("pages written");
    let commands = commands();
    assert!(commands.len() > 15, "{commands:?}");
    let mut expected = BTreeSet::new();
    for words in &commands {
        let name = std::iter::once("gpureap")
            .chain(words.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join("-");
        let page = folder.path().join(format!("{name}.1"));
        let text = std::fs::read_to_string(&page).unwrap_or_else(|error| {
            panic!("{words:?} has no man page {}: {error}", page.display())
        });
        assert!(
            text.contains(&format!(".TH {name} 1 ")),
            "{}: no title line",
            page.display()
        );
        let words_ref: Vec<&str> = words.iter().map(String::as_str).collect();
        for flag in flags(&help(&words_ref)) {
            let roff = flag.replace('-', "\\-");
            assert!(
                text.contains(&roff),
                "{} does not name {flag}, which `gpureap {} --help` shows",
                page.display(),
                words.join(" ")
            );
        }
        expected.insert(page);
    }
    // No page for a command that --help does not list (a hidden one, clap's `help`).
    assert_eq!(written.into_iter().collect::<BTreeSet<_>>(), expected);
}

#[test]
fn completions_for_bash_zsh_and_fish_name_every_subcommand() {
    let folder = tempfile::tempdir().expect("tempdir");
    let written = pages::completions(folder.path()).expect("completions written");
    assert_eq!(written.len(), pages::SHELLS.len());
    let top = subcommands(&help(&[]));
    for path in &written {
        let text = std::fs::read_to_string(path).expect("completion readable");
        for sub in &top {
            assert!(
                text.contains(sub.as_str()),
                "{} lacks {sub}",
                path.display()
            );
        }
    }
    // bash parses its file: a syntax error would break every completion of the shell.
    let bash = Command::new("bash")
        .arg("-n")
        .arg(folder.path().join("gpureap.bash"))
        .status()
        .expect("bash runs");
    assert!(bash.success());
    assert!(Path::new(&folder.path().join("_gpureap")).is_file());
}
