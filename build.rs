//! Stamps the binary with the commit it was built from and the day it was
//! built, for `gpureap --version`: on a fleet the version number alone does
//! not say which build a host runs, and `push` compares builds.
//!
//! The commit is `git rev-parse --short HEAD`, with `-dirty` when the files
//! that make the binary (src/, crates/, build.rs, Cargo.toml, Cargo.lock,
//! link/text-order.txt) differ from it; "unknown" without git (a tarball) or when the crate is not the top of
//! its repository. The date is today's in UTC, or SOURCE_DATE_EPOCH's for a
//! reproducible build. The script reruns only when HEAD, the branch it points
//! to, or those files change, so a build does not redo the crate every time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

/// The files whose changes make the binary differ from the commit.
const SOURCES: [&str; 6] = [
    "src",
    "crates",
    "build.rs",
    "Cargo.toml",
    "Cargo.lock",
    "link/text-order.txt",
];

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    for source in SOURCES {
        println!("cargo:rerun-if-changed={source}");
    }
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");

    let commit = match repository(&root) {
        Some(()) => {
            for file in git_files(&root) {
                println!("cargo:rerun-if-changed={}", file.display());
            }
            commit(&root)
        }
        None => None,
    };
    println!(
        "cargo:rustc-env=GPUREAP_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    println!("cargo:rustc-env=GPUREAP_BUILD_DATE={}", build_date());
    text_order(&root);
}

/// The release binary's functions that the one-shot commands run, laid out
/// first and together (`link/text-order.txt`, written by `scripts/order-text`):
/// the kernel maps a binary's text 64 KiB around each page a process
/// touches, so code spread over the whole text becomes resident almost
/// whole (docs/bench/history.md, "Issue 28, round 9"). Only where the
/// linker is the one that reads such a file: rust-lld, the default for
/// x86_64 Linux since Rust 1.90 (an older rustc links with the system's ld,
/// which does not), not a linker set apart (`-C linker=`, `-fuse-ld=`; the
/// portable build's scripts/portable-cc does the same for zig's linker). A name the binary lacks (a
/// file older than the code) is passed over. The same linker folds the
/// crates' identical copies of generic functions (`--icf=all`).
fn text_order(root: &Path) {
    // Rerun on its changes: it is one of SOURCES.
    const ORDER: &str = "link/text-order.txt";
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let flags = var("CARGO_ENCODED_RUSTFLAGS");
    let own_linker = std::env::var_os("RUSTC_LINKER").is_some()
        || ["linker", "fuse-ld"]
            .iter()
            .any(|flag| flags.contains(flag));
    let order = root.join(ORDER);
    if var("PROFILE") == "release"
        && var("TARGET") == "x86_64-unknown-linux-gnu"
        && !own_linker
        && links_with_rust_lld()
        && order.is_file()
    {
        // -Xlinker passes the path whole: -Wl, would split it at a comma.
        if let Some(order) = order.to_str() {
            println!("cargo:rustc-link-arg-bins=-Xlinker");
            println!("cargo:rustc-link-arg-bins=--symbol-ordering-file={order}");
            println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
        }
        // Each crate of the workspace instantiates the generic functions it
        // uses (Vec's, serde's) in copies of its own, byte for byte the same:
        // the linker folds them into one (identical code folding), so the
        // split into crates costs the binary nothing. Rust gives a function
        // no address identity (its functions are `unnamed_addr`). The
        // artifacts' build links through zig cc, which refuses the option:
        // scripts/portable-cc links it again with it, and with the order.
        println!("cargo:rustc-link-arg-bins=-Wl,--icf=all");
    }
}

/// Runs git in the crate's folder; its trimmed output, if it succeeded.
fn git(root: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("--no-optional-locks")
        .args(args)
        .current_dir(root)
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    Some(String::from_utf8(output.stdout).ok()?.trim().to_string())
}

/// Whether the crate is the top of a git work tree (not a tarball unpacked
/// inside some other repository, whose commit would say nothing about it).
fn repository(root: &Path) -> Option<()> {
    let top = PathBuf::from(git(root, &["rev-parse", "--show-toplevel"])?);
    let same = top.canonicalize().ok()? == root.canonicalize().ok()?;
    same.then_some(())
}

/// HEAD, the branch it points to and packed-refs, wherever git keeps them
/// (a worktree keeps its HEAD apart from the shared refs). Only files that
/// exist: cargo reruns the script on every build for one that does not.
fn git_files(root: &Path) -> Vec<PathBuf> {
    let mut names = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(root, &["symbolic-ref", "-q", "HEAD"]) {
        names.push(branch);
    }
    names
        .iter()
        .filter_map(|name| git(root, &["rev-parse", "--git-path", name]))
        .map(|path| root.join(path))
        .filter(|path| path.is_file())
        .collect()
}

fn commit(root: &Path) -> Option<String> {
    let hash = git(root, &["rev-parse", "--short", "HEAD"])?;
    let mut status = vec!["status", "--porcelain", "--"];
    status.extend(SOURCES);
    let dirty = !git(root, &status)?.is_empty();
    Some(if dirty { format!("{hash}-dirty") } else { hash })
}

/// YYYY-MM-DD in UTC: SOURCE_DATE_EPOCH's day when it is set, else today.
fn build_date() -> String {
    let when = match std::env::var("SOURCE_DATE_EPOCH") {
        // Empty counts as unset (a build system that exports it with no value).
        Ok(text) if !text.trim().is_empty() => {
            // The last second of 9999-12-31: a date must have four digits.
            let seconds = text
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&seconds| seconds <= 253_402_300_799)
                .unwrap_or_else(|| {
                    panic!(
                        "SOURCE_DATE_EPOCH={text:?} is not a number of seconds since 1970 \
                         (up to the year 9999)"
                    )
                });
            SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
        }
        _ => SystemTime::now(),
    };
    let stamp = humantime::format_rfc3339_seconds(when).to_string();
    stamp.split('T').next().unwrap_or(&stamp).to_string()
}

/// Whether this rustc links x86_64 Linux programs with its rust-lld by
/// default: from 1.90 on.
fn links_with_rust_lld() -> bool {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let Ok(output) = Command::new(rustc).arg("--version").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let mut numbers = text
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split(['.', '-'])
        .map(|part| part.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}
