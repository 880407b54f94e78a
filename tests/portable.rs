//! The portable release binary (scripts/build-portable, run by .ci/run
//! before the tests): it must start on glibc 2.17 and need nothing but libc's
//! own libraries, and it must work. Read from the binary itself with
//! readelf, and run on a simulated host. Also `--version`'s commit and date.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use crate::harness::*;

/// The newest glibc the portable binary may ask for (CentOS 7's).
const GLIBC: (u32, u32) = (2, 17);

/// Libraries the binary may need at start: glibc's own (libnvidia-ml is
/// opened at run time, when there is one).
const LIBC_PARTS: [&str; 6] = [
    "libc.so.",
    "libm.so.",
    "libpthread.so.",
    "libdl.so.",
    "librt.so.",
    "ld-linux",
];

/// Where scripts/build-portable leaves the binary, in the same target folder
/// as the binary under test.
fn portable_binary() -> PathBuf {
    let debug = Path::new(env!("CARGO_BIN_EXE_gpureap"));
    let target = debug
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/PROFILE/");
    let binary = target.join("portable/gpureap");
    assert!(
        binary.is_file(),
        "{} is missing: run scripts/build-portable (.ci/run does)",
        binary.display()
    );
    if let Some(newer) = newer_source(modified(&binary)) {
        panic!(
            "{} is older than {}: run scripts/build-portable (.ci/run does)",
            binary.display(),
            newer.display()
        );
    }
    binary
}

pub fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path)
        .and_then(|metadata| metadata.modified())
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// A source of the binary changed after `built`, if one did.
pub fn newer_source(built: SystemTime) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pending: Vec<PathBuf> = ["src", "crates", "build.rs", "Cargo.toml", "Cargo.lock"]
        .iter()
        .map(|name| root.join(name))
        .collect();
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            let entries = std::fs::read_dir(&path).expect("source folder");
            pending.extend(entries.flatten().map(|entry| entry.path()));
        } else if modified(&path) > built {
            return Some(path);
        }
    }
    None
}

fn readelf(binary: &Path, args: &[&str]) -> String {
    let output = Command::new("readelf")
        .args(args)
        .arg(binary)
        .output()
        .expect("readelf runs (binutils)");
    assert!(output.status.success(), "readelf {args:?} failed");
    String::from_utf8(output.stdout).expect("readelf prints text")
}

/// The libraries in the dynamic section's NEEDED entries
/// (`0x0000000000000001 (NEEDED)  Shared library: [libc.so.6]`).
fn needed(dynamic: &str) -> Vec<String> {
    dynamic
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| {
            let start = line.find('[')? + 1;
            let end = line.rfind(']')?;
            line.get(start..end).map(str::to_string)
        })
        .collect()
}

/// Every glibc version named in readelf's output, as (major, minor[,
/// patch]) numbers: dynamic symbols (`memcpy@GLIBC_2.14 (3)`) and version
/// needs (`Name: GLIBC_2.2.5  Flags: none  Version: 2`).
fn glibc_versions(symbols: &str) -> Vec<Vec<u32>> {
    let mut versions: Vec<Vec<u32>> = symbols
        .split(|c: char| c.is_whitespace() || c == '@' || c == '(' || c == ')')
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .filter_map(|number| number.split('.').map(|part| part.parse().ok()).collect())
        .collect();
    versions.sort();
    versions.dedup();
    versions
}

#[test]
fn readelf_output_is_read_as_glibc_shows_it() {
    let dynamic = " 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]\n \
                   0x0000000000000001 (NEEDED)             Shared library: [ld-linux-x86-64.so.2]\n \
                   0x000000000000000c (INIT)               0x1000\n";
    assert_eq!(needed(dynamic), ["libc.so.6", "ld-linux-x86-64.so.2"]);
    let symbols = "     1: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND memcpy@GLIBC_2.14 (3)\n\
                   \x20    2: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND free@GLIBC_2.2.5 (2)\n\
                   \x20    3: 0000000000000000     0 FUNC    WEAK   DEFAULT  UND gettid@GLIBC_2.30\n\
                   \x20    4: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND __cxa_thread_atexit_impl\n\
                   \x20 0x00e0:   Name: GLIBC_2.17  Flags: none  Version: 9\n";
    assert_eq!(
        glibc_versions(symbols),
        [vec![2, 2, 5], vec![2, 14], vec![2, 17], vec![2, 30]]
    );
}

#[test]
fn the_portable_binary_needs_glibc_2_17_and_nothing_but_libc() {
    needs_only_libc_of_glibc_2_17(&portable_binary());
}

#[test]
fn the_portable_binary_keeps_its_symbols_not_its_debug_sections() {
    keeps_its_symbols_not_its_debug_sections(&portable_binary());
}

/// A portable binary has a symbol table (function names in a backtrace) and no debug
/// sections (scripts/build-portable's llvm-objcopy --strip-debug).
pub fn keeps_its_symbols_not_its_debug_sections(binary: &Path) {
    let sections = readelf(binary, &["-S", "-W"]);
    assert!(
        sections.contains(" .symtab "),
        "{} has no symbol table",
        binary.display()
    );
    assert!(
        !sections.contains(" .debug_"),
        "{} keeps debug sections",
        binary.display()
    );
}

#[test]
fn the_portable_binary_lays_out_the_ordered_functions_first() {
    lays_out_the_ordered_functions_first(&portable_binary());
}

/// A legacy-mangled Rust name without its hash: `…17h0123456789abcdefE` -> `…`.
fn unhashed(name: &str) -> &str {
    let bytes = name.as_bytes();
    let hashed = bytes.len() > 20
        && bytes.ends_with(b"E")
        && bytes[bytes.len() - 20..].starts_with(b"17h")
        && bytes[bytes.len() - 17..bytes.len() - 1]
            .iter()
            .all(u8::is_ascii_hexdigit);
    if hashed {
        &name[..name.len() - 20]
    } else {
        name
    }
}

/// scripts/portable-cc relinked the binary with link/text-order.txt's functions first: of its
/// functions (by address), those the file names (matched without their hash, as the script
/// matches them) lie at the start of the text, nine in ten of them within the first one and a
/// half times their number. zig cc's own link leaves them where the compiler put them (42 % so
/// placed, measured on 1683dc0), as does a build that bypassed the script.
pub fn lays_out_the_ordered_functions_first(binary: &Path) {
    let order =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("link/text-order.txt"))
            .expect("link/text-order.txt");
    let ordered: std::collections::HashSet<&str> = order
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(unhashed)
        .collect();
    let mut functions: Vec<(u64, String)> = readelf(binary, &["-s", "-W"])
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 8 && fields[3] == "FUNC" && fields[2] != "0" && fields[6] != "UND")
                .then(|| {
                    Some((
                        u64::from_str_radix(fields[1], 16).ok()?,
                        fields[7].to_string(),
                    ))
                })
                .flatten()
        })
        .collect();
    functions.sort();
    let mut addresses: Vec<u64> = functions.iter().map(|(address, _)| *address).collect();
    addresses.dedup();
    let mut placed: Vec<usize> = functions
        .iter()
        .filter(|(_, name)| ordered.contains(unhashed(name)))
        .map(|(address, _)| addresses.partition_point(|a| a < address))
        .collect();
    placed.dedup();
    assert!(
        placed.len() > 300,
        "{}: only {} of its functions are named by link/text-order.txt",
        binary.display(),
        placed.len()
    );
    let first = placed
        .iter()
        .filter(|&&rank| rank < placed.len() * 3 / 2)
        .count();
    assert!(
        first * 10 >= placed.len() * 9,
        "{}: {first} of the {} ordered functions lie at the start of its text: \
         not relinked by scripts/portable-cc",
        binary.display(),
        placed.len()
    );
}

/// What the portable binaries may ask of the system at start (any architecture: readelf reads
/// each): only libc's own libraries, no glibc symbol version above 2.17.
pub fn needs_only_libc_of_glibc_2_17(binary: &Path) {
    let libraries = needed(&readelf(binary, &["-d", "-W"]));
    assert!(libraries.iter().any(|name| name.starts_with("libc.so.")));
    for library in &libraries {
        assert!(
            LIBC_PARTS.iter().any(|part| library.starts_with(part)),
            "{} needs {library} at start: {libraries:?}",
            binary.display()
        );
    }
    // The symbols' versions, and the version needs the dynamic loader checks.
    let versions = glibc_versions(&readelf(binary, &["--dyn-syms", "-V", "-W"]));
    let newest = versions.last().expect("the binary asks glibc for versions");
    assert!(
        newest[..] <= [GLIBC.0, GLIBC.1][..],
        "{} asks for GLIBC_{}, newer than {}.{}",
        binary.display(),
        newest
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join("."),
        GLIBC.0,
        GLIBC.1
    );
}

#[test]
fn the_portable_binary_runs_status_and_free_on_a_simulated_host() {
    let binary = portable_binary();
    let version = Command::new(&binary)
        .arg("--version")
        .output()
        .expect("runs");
    assert!(version.status.success());
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(version.starts_with("gpureap 0."), "{version}");

    let (host, mut incident) = Sim::gpus(2).stage();
    let holder = incident.hold(scheduler(1, 40 * GIB));
    let portable = |args: &[&str]| -> Run {
        against(Command::new(&binary), &host)
            .args(args)
            .output()
            .expect("the portable binary runs")
            .into()
    };
    let status = portable(&["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status = status.json();
    assert_eq!(status["gpus"][1]["memory_used"], 40 * GIB);
    assert_eq!(status["holders"][0]["pid"], holder, "{status:#}");

    let pid = holder.to_string();
    let freed = portable(&["free", "--pid", &pid, "--grace", "1s", "--yes", "--json"]);
    let report = freed.json();
    assert_eq!(freed.code, 0, "{report:#}\n{}", freed.stderr);
    assert_eq!(gpu(&report, 1)["freed"], true);
    assert!(!alive(holder));
}

/// `gpureap --version`: `gpureap 0.1.0 (abc1234 2026-11-30)`, the commit
/// being the checkout's (with `-dirty` when src/ or the manifests differ
/// from it), or "unknown" outside git.
#[test]
fn version_names_the_commit_and_the_build_date() {
    let output = Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .arg("--version")
        .output()
        .expect("runs");
    assert!(output.status.success());
    let line = String::from_utf8(output.stdout).expect("utf-8");
    let pattern = regex::Regex::new(
        r"^gpureap (\d+\.\d+\.\d+) \(([0-9a-f]{7,40}(-dirty)?|unknown) (\d{4}-\d{2}-\d{2})\)\n$",
    )
    .expect("regex");
    let parts = pattern
        .captures(&line)
        .unwrap_or_else(|| panic!("--version printed {line:?}"));
    assert_eq!(&parts[1], env!("CARGO_PKG_VERSION"));
    let head = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match head {
        Ok(head) if head.status.success() => {
            let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
            assert_eq!(parts[2].trim_end_matches("-dirty"), head, "{line}");
        }
        _ => assert_eq!(&parts[2], "unknown", "{line}"),
    }
}
