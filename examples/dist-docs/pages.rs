//! The man pages and shell completions that the release artifacts carry, made from gpureap's
//! own clap definitions (src/cli.rs), so that they say what `--help` says. Used by
//! examples/dist-docs (scripts/release) and by tests/dist_docs.rs; never part of the binary.

use std::io;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_complete::Shell;

/// The shells whose completions ship, each with its file's name (what each shell's
/// completion directory expects: bash-completion's `gpureap`, zsh's `_gpureap`, fish's
/// `gpureap.fish`).
pub const SHELLS: [(Shell, &str); 3] = [
    (Shell::Bash, "gpureap.bash"),
    (Shell::Zsh, "_gpureap"),
    (Shell::Fish, "gpureap.fish"),
];

/// gpureap's command line, every deferred subcommand's arguments defined (src/cli.rs's
/// `Lazy`), without clap's `help` subcommand (no page of its own: `--help` is on every page).
fn command() -> clap::Command {
    let mut command = gpureap::cli::Cli::command().disable_help_subcommand(true);
    command.build();
    command
}

/// Writes `gpureap.1` and a page for every subcommand, nested ones included
/// (`gpureap-status.1`, `gpureap-slurm-epilog.1`), into `folder`; the pages written.
pub fn man_pages(folder: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(folder)?;
    let mut written = Vec::new();
    let mut pending = vec![command()];
    while let Some(command) = pending.pop() {
        pending.extend(
            command
                .get_subcommands()
                .filter(|sub| !sub.is_hide_set())
                .cloned(),
        );
        let page = clap_mangen::Man::new(command)
            .source(format!("gpureap {}", env!("CARGO_PKG_VERSION")))
            .manual("gpureap");
        written.push(page.generate_to(folder)?);
    }
    written.sort();
    Ok(written)
}

/// Writes the completions of every shell of `SHELLS` into `folder`; the files written.
pub fn completions(folder: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(folder)?;
    let mut written = Vec::new();
    for (shell, name) in SHELLS {
        let path = folder.join(name);
        let mut file = std::fs::File::create(&path)?;
        clap_complete::generate(shell, &mut command(), "gpureap", &mut file);
        written.push(path);
    }
    Ok(written)
}
