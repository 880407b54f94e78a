//! The release artifacts, installed as a user would install them.
//!
//! install.sh against a release it builds itself (a tarball of this build's gpureap, its
//! SHA256SUMS), from a folder and from a server on the loopback, and its refusals (a tampered
//! tarball, an architecture with no build, an old glibc, musl) with `uname` and `ldd` put first
//! on PATH. Then what scripts/release left in dist/ (.ci/run runs it first): the wheel into a
//! fresh virtual environment, the .deb into a throwaway root through dpkg, the x86_64 tarball
//! through install.sh, the aarch64 binary under qemu-aarch64-static, and SHA256SUMS over all.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::dist_docs::pages;
use crate::harness::*;
use crate::portable::{
    keeps_its_symbols_not_its_debug_sections, lays_out_the_ordered_functions_first, modified,
    needs_only_libc_of_glibc_2_17, newer_source,
};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn sh(command: &mut Command) -> Run {
    command
        .stdin(Stdio::null())
        .output()
        .expect("the command runs")
        .into()
}

fn sha256sums(folder: &Path, names: &[&str]) {
    let sums = sh(Command::new("sha256sum").args(names).current_dir(folder));
    assert_eq!(sums.code, 0, "{}", sums.stderr);
    std::fs::write(folder.join("SHA256SUMS"), sums.stdout).expect("SHA256SUMS");
}

/// A release of this build's gpureap for `arch`, as scripts/release lays it out: the
/// tarball (binary, README, CHANGELOG, licences, man pages, completions), install.sh and
/// SHA256SUMS, in `folder`. The tarball's name.
fn small_release(folder: &Path, arch: &str) -> String {
    let name = format!("gpureap-{VERSION}-{arch}-linux");
    let unpacked = folder.join("stage").join(&name);
    std::fs::create_dir_all(&unpacked).expect("stage");
    // This build's binary without its debug sections (a tenth of its size: faster to pack).
    let strip = sh(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(env!("CARGO_BIN_EXE_gpureap"))
        .arg(unpacked.join("gpureap")));
    assert_eq!(strip.code, 0, "objcopy (binutils): {}", strip.stderr);
    for doc in ["README.md", "CHANGELOG.md", "LICENSE-MIT", "LICENSE-APACHE"] {
        std::fs::copy(Path::new(ROOT).join(doc), unpacked.join(doc)).expect("doc");
    }
    pages::man_pages(&unpacked.join("man")).expect("man pages");
    pages::completions(&unpacked.join("completions")).expect("completions");
    let tarball = format!("{name}.tar.gz");
    let tar = sh(Command::new("tar")
        .arg("-czf")
        .arg(folder.join(&tarball))
        .arg("-C")
        .arg(folder.join("stage"))
        .arg(&name));
    assert_eq!(tar.code, 0, "{}", tar.stderr);
    std::fs::remove_dir_all(folder.join("stage")).expect("stage removed");
    std::fs::copy(
        Path::new(ROOT).join("install.sh"),
        folder.join("install.sh"),
    )
    .expect("copy");
    sha256sums(folder, &[&tarball, "install.sh"]);
    tarball
}

/// `sh install.sh ARGS` with `path_first` (fake `uname`, `ldd`) before PATH.
fn install_sh(script: &Path, args: &[&str], path_first: Option<&Path>) -> Run {
    let mut command = Command::new("sh");
    command.arg(script).args(args);
    if let Some(first) = path_first {
        let path = std::env::var("PATH").unwrap_or_default();
        command.env("PATH", format!("{}:{path}", first.display()));
    }
    sh(&mut command)
}

/// What install.sh put under `prefix`, checked: a gpureap that runs and prints `version`,
/// a page per command, the completions, the licences.
fn installed(prefix: &Path, version: &str) {
    let run = sh(Command::new(prefix.join("bin/gpureap")).arg("--version"));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout.trim(), version);
    for page in ["gpureap.1", "gpureap-status.1", "gpureap-slurm-epilog.1"] {
        assert!(prefix.join("share/man/man1").join(page).is_file(), "{page}");
    }
    for file in [
        "share/bash-completion/completions/gpureap",
        "share/zsh/site-functions/_gpureap",
        "share/fish/vendor_completions.d/gpureap.fish",
        "share/doc/gpureap/LICENSE-MIT",
        "share/doc/gpureap/LICENSE-APACHE",
    ] {
        assert!(prefix.join(file).is_file(), "{file}");
    }
}

fn version_line(binary: &Path) -> String {
    let run = sh(Command::new(binary).arg("--version"));
    assert_eq!(run.code, 0, "{}", run.stderr);
    run.stdout.trim().to_string()
}

/// `python3 -m http.server` on the loopback, serving `folder`; its port.
struct Server(Child, u16);

impl Server {
    fn start(folder: &Path) -> Server {
        let mut child = Command::new("python3")
            .args(["-u", "-m", "http.server", "--bind", "127.0.0.1", "0"])
            .current_dir(folder)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("http.server says its port");
        // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
        let port = line
            .split_whitespace()
            .skip_while(|word| *word != "port")
            .nth(1)
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("http.server said {line:?}"));
        Server(child, port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn install_sh_installs_from_a_folder_and_from_a_loopback_server() {
    let work = tempfile::tempdir().expect("tempdir");
    let release = work.path().join("release");
    small_release(&release, "x86_64");
    let version = version_line(Path::new(env!("CARGO_BIN_EXE_gpureap")));
    let script = release.join("install.sh");

    // From a folder, named.
    let prefix = work.path().join("from-folder");
    let prefix_arg = prefix.to_str().expect("path");
    let from = release.to_str().expect("path");
    let run = install_sh(&script, &["--from", from, "--prefix", prefix_arg], None);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("checksum verified"), "{}", run.stdout);
    installed(&prefix, &version);

    // From the folder it sits in, by default; again over what is there (replaced whole).
    let run = install_sh(&script, &[&format!("--prefix={prefix_arg}")], None);
    assert_eq!(run.code, 0, "{}", run.stderr);
    installed(&prefix, &version);

    // From a server on the loopback.
    let server = Server::start(&release);
    let url = format!("http://127.0.0.1:{}/", server.1);
    let prefix = work.path().join("from-url");
    let prefix_arg = prefix.to_str().expect("path");
    let outside = work.path().join("install.sh");
    std::fs::copy(&script, &outside).expect("copy");
    let run = install_sh(&outside, &["--from", &url, "--prefix", prefix_arg], None);
    assert_eq!(run.code, 0, "{}", run.stderr);
    installed(&prefix, &version);

    // A URL that serves no release.
    let run = install_sh(
        &outside,
        &["--from", &format!("{url}nothing"), "--prefix", prefix_arg],
        None,
    );
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("could not download"), "{}", run.stderr);
}

/// A folder of fake commands: `uname -m` printing `machine`, `ldd --version` printing `ldd`.
fn fakes(folder: &Path, machine: &str, ldd: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = folder.join(format!("fake-{machine}-{}", ldd.len()));
    std::fs::create_dir_all(&bin).expect("fakes");
    let uname =
        format!("#!/bin/sh\n[ \"$1\" = -m ] && echo {machine} && exit 0\nexec /bin/uname \"$@\"\n");
    let ldd = format!("#!/bin/sh\nprintf '%s\\n' '{ldd}'\n");
    for (name, text) in [("uname", uname), ("ldd", ldd)] {
        std::fs::write(bin.join(name), text).expect("fake");
        std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755))
            .expect("mode");
    }
    bin
}

#[test]
fn install_sh_refuses_a_tampered_tarball_an_unknown_architecture_and_an_old_glibc() {
    let work = tempfile::tempdir().expect("tempdir");
    let release = work.path().join("release");
    let tarball = small_release(&release, "x86_64");
    let script = release.join("install.sh");
    let prefix = work.path().join("prefix");
    let args = ["--prefix", prefix.to_str().expect("path")];
    let glibc = "ldd (Debian GLIBC 2.36-9+deb12u4) 2.36";

    let refusals = [
        ("riscv64", glibc, "architecture 'riscv64'"),
        (
            "aarch64",
            glibc,
            "lists no gpureap-VERSION-aarch64-linux.tar.gz",
        ),
        (
            "x86_64",
            "ldd (GNU libc) 2.12",
            "glibc 2.12; gpureap needs glibc 2.17",
        ),
        (
            "x86_64",
            "ldd (GNU libc) 2.5",
            "glibc 2.5; gpureap needs glibc 2.17",
        ),
        ("x86_64", "musl libc (x86_64)", "is musl"),
        (
            "x86_64",
            "ldd: something else",
            "cannot tell this machine's glibc",
        ),
    ];
    for (machine, ldd, said) in refusals {
        let run = install_sh(&script, &args, Some(&fakes(work.path(), machine, ldd)));
        assert_eq!(run.code, 1, "{machine} {ldd}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(said), "{machine} {ldd}: {}", run.stderr);
        assert!(!prefix.exists(), "{machine} {ldd} installed something");
    }
    // The control: the same fakes, saying what this machine is, install.
    let run = install_sh(&script, &args, Some(&fakes(work.path(), "x86_64", glibc)));
    assert_eq!(run.code, 0, "{}", run.stderr);
    std::fs::remove_dir_all(&prefix).expect("removed");

    // One byte more in the tarball.
    let path = release.join(&tarball);
    let mut bytes = std::fs::read(&path).expect("tarball");
    bytes.push(0);
    std::fs::write(&path, bytes).expect("tampered");
    let run = install_sh(&script, &args, None);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        run.stderr
            .contains(&format!("checksum mismatch: {tarball}"))
            && run.stderr.contains("nothing installed"),
        "{}",
        run.stderr
    );
    assert!(!prefix.exists());
}

/// dist/ as scripts/release left it, checked fresh (no source newer), as .ci/run builds it.
fn dist() -> PathBuf {
    let dist = Path::new(ROOT).join("dist");
    let sums = dist.join("SHA256SUMS");
    assert!(
        sums.is_file(),
        "{} is missing: run scripts/release (.ci/run does)",
        sums.display()
    );
    if let Some(newer) = newer_source(modified(&sums)) {
        panic!(
            "{} is older than {}: run scripts/release (.ci/run does)",
            sums.display(),
            newer.display()
        );
    }
    dist
}

fn dist_file(dist: &Path, name: &str) -> PathBuf {
    let path = dist.join(name);
    assert!(path.is_file(), "scripts/release left no {}", path.display());
    path
}

fn wheel_name(arch: &str) -> String {
    format!("gpureap-{VERSION}-py3-none-manylinux_2_17_{arch}.manylinux2014_{arch}.whl")
}

#[test]
fn sha256sums_covers_every_artifact_and_each_matches() {
    let dist = dist();
    let check = sh(Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&dist));
    assert_eq!(check.code, 0, "{}{}", check.stdout, check.stderr);
    let mut expected = vec!["install.sh".to_string()];
    for (arch, deb) in [("x86_64", "amd64"), ("aarch64", "arm64")] {
        expected.push(format!("gpureap-{VERSION}-{arch}-linux.tar.gz"));
        expected.push(format!("gpureap_{VERSION}_{deb}.deb"));
        expected.push(wheel_name(arch));
    }
    expected.sort();
    let mut listed: Vec<String> = check
        .stdout
        .lines()
        .filter_map(|line| line.strip_suffix(": OK"))
        .map(str::to_string)
        .collect();
    listed.sort();
    assert_eq!(listed, expected);
    let mut present: Vec<String> = std::fs::read_dir(&dist)
        .expect("dist")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name != "SHA256SUMS")
        .collect();
    present.sort();
    assert_eq!(
        present, expected,
        "dist/ holds files SHA256SUMS does not cover"
    );
}

#[test]
fn the_wheel_installs_into_a_fresh_venv_and_runs_the_demo() {
    let dist = dist();
    let wheel = dist_file(&dist, &wheel_name("x86_64"));
    let work = tempfile::tempdir().expect("tempdir");
    let venv = work.path().join("venv");
    let made = sh(Command::new("python3").arg("-m").arg("venv").arg(&venv));
    assert_eq!(made.code, 0, "python3 -m venv: {}", made.stderr);
    let pip = sh(Command::new(venv.join("bin/python"))
        .args([
            "-m",
            "pip",
            "install",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
        ])
        .arg(&wheel));
    assert_eq!(pip.code, 0, "pip install: {}{}", pip.stdout, pip.stderr);
    let gpureap = venv.join("bin/gpureap");
    assert!(version_line(&gpureap).starts_with(&format!("gpureap {VERSION} (")));
    let demo = sh(Command::new(&gpureap)
        .arg("demo")
        .env_remove("GPUREAP_BACKEND")
        .env("TMPDIR", work.path()));
    assert_eq!(demo.code, 0, "{}{}", demo.stdout, demo.stderr);
    assert_contains(&demo.stdout, "sglang::scheduler_TP0");
    // pip knows what it installed, and removes it.
    let removed = sh(Command::new(venv.join("bin/python")).args([
        "-m",
        "pip",
        "uninstall",
        "-y",
        "-q",
        "gpureap",
    ]));
    assert_eq!(removed.code, 0, "{}", removed.stderr);
    assert!(!gpureap.exists());
}

#[test]
fn the_deb_installs_into_a_throwaway_root_with_pages_and_units_not_enabled() {
    let dist = dist();
    let deb = dist_file(&dist, &format!("gpureap_{VERSION}_amd64.deb"));
    let work = tempfile::tempdir().expect("tempdir");
    let root = work.path().join("root");
    // A dpkg database of its own, that knows one package: this machine's libc6 (the .deb
    // depends on it), with no files.
    let admin = root.join("var/lib/dpkg");
    for folder in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(admin.join(folder)).expect("admin");
    }
    let libc6 = sh(Command::new("dpkg-query").args(["-s", "libc6"]));
    assert_eq!(libc6.code, 0, "{}", libc6.stderr);
    std::fs::write(admin.join("status"), &libc6.stdout).expect("status");
    let arch = sh(Command::new("dpkg").arg("--print-architecture"));
    std::fs::write(
        admin.join(format!("info/libc6:{}.list", arch.stdout.trim())),
        "",
    )
    .expect("list");
    std::fs::write(admin.join("available"), "").expect("available");
    let root_arg = format!("--root={}", root.display());
    let dpkg = |args: &[&str]| -> Run {
        sh(Command::new("dpkg")
            .arg(&root_arg)
            .arg("--log=/dev/null")
            .arg("--force-script-chrootless")
            .args(args))
    };
    let run = dpkg(&["-i", deb.to_str().expect("path")]);
    assert_eq!(run.code, 0, "dpkg -i: {}{}", run.stdout, run.stderr);
    let status = sh(Command::new("dpkg-query").arg(&root_arg).args([
        "-W",
        "-f=${Status} ${Version}",
        "gpureap",
    ]));
    assert_eq!(
        status.stdout,
        format!("install ok installed {VERSION}"),
        "{}",
        status.stderr
    );

    let binary = root.join("usr/bin/gpureap");
    assert!(version_line(&binary).starts_with(&format!("gpureap {VERSION} (")));
    let pages = root.join("usr/share/man/man1");
    for page in [
        "gpureap",
        "gpureap-status",
        "gpureap-free",
        "gpureap-exporter",
        "gpureap-reap",
    ] {
        let path = pages.join(format!("{page}.1.gz"));
        let text = sh(Command::new("gzip").arg("-dc").arg(&path));
        assert!(
            text.stdout.contains(&format!(".TH {page} 1 ")),
            "{}: {}",
            path.display(),
            text.stderr
        );
    }
    for file in [
        "usr/share/bash-completion/completions/gpureap",
        "usr/share/zsh/vendor-completions/_gpureap",
        "usr/share/fish/vendor_completions.d/gpureap.fish",
        "usr/share/doc/gpureap/copyright",
    ] {
        assert!(root.join(file).is_file(), "{file}");
    }
    // The units, as installed, pass systemd-analyze (the binary they name is the root's) and
    // are not enabled: nothing links them into a target.
    let units = root.join("usr/lib/systemd/system");
    for unit in ["gpureap-exporter.service", "gpureap-reap.service"] {
        let text = std::fs::read_to_string(units.join(unit)).expect("unit installed");
        assert!(text.contains("ExecStart=/usr/bin/gpureap "), "{unit}");
        let here = work.path().join(unit);
        std::fs::write(
            &here,
            text.replace("/usr/bin/gpureap", binary.to_str().expect("path")),
        )
        .expect("unit");
        let verify = sh(Command::new("systemd-analyze").arg("verify").arg(&here));
        assert_eq!(
            (verify.code, verify.stderr.as_str()),
            (0, ""),
            "systemd-analyze verify {unit}"
        );
    }
    assert!(
        !root.join("etc/systemd/system").exists(),
        "a unit was enabled"
    );

    // And it goes away whole.
    let run = dpkg(&["--purge", "gpureap"]);
    assert_eq!(run.code, 0, "dpkg --purge: {}{}", run.stdout, run.stderr);
    assert!(!binary.exists() && !units.join("gpureap-reap.service").exists());
}

#[test]
fn the_tarball_installs_through_install_sh() {
    let dist = dist();
    let work = tempfile::tempdir().expect("tempdir");
    let prefix = work.path().join("prefix");
    let run = install_sh(
        &dist.join("install.sh"),
        &["--prefix", prefix.to_str().expect("path")],
        None,
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let version = version_line(&prefix.join("bin/gpureap"));
    assert!(
        version.starts_with(&format!("gpureap {VERSION} (")),
        "{version}"
    );
    installed(&prefix, &version);
    needs_only_libc_of_glibc_2_17(&prefix.join("bin/gpureap"));
}

/// The aarch64 binary out of its tarball, run by Debian's qemu-user-static with Debian's
/// aarch64 glibc (libc6-arm64-cross) as its root for libraries: `--version`, `status --json`
/// and `free` on a simulated host, then `demo --json` through qemu registered in binfmt_misc.
#[test]
fn the_aarch64_binary_runs_under_qemu_on_a_simulated_host() {
    let dist = dist();
    let tarball = dist_file(&dist, &format!("gpureap-{VERSION}-aarch64-linux.tar.gz"));
    let work = tempfile::tempdir().expect("tempdir");
    let untar = sh(Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(work.path()));
    assert_eq!(untar.code, 0, "{}", untar.stderr);
    let binary = work
        .path()
        .join(format!("gpureap-{VERSION}-aarch64-linux/gpureap"));
    let header = sh(Command::new("readelf").arg("-h").arg(&binary));
    assert!(header.stdout.contains("AArch64"), "{}", header.stdout);
    needs_only_libc_of_glibc_2_17(&binary);
    keeps_its_symbols_not_its_debug_sections(&binary);
    lays_out_the_ordered_functions_first(&binary);

    let qemu = |args: &[&str]| -> Command {
        let mut command = Command::new("qemu-aarch64-static");
        command
            .env("QEMU_LD_PREFIX", "/usr/aarch64-linux-gnu")
            .env_remove("GPUREAP_BACKEND")
            .env("TMPDIR", work.path())
            .arg(&binary)
            .args(args)
            .stdin(Stdio::null());
        command
    };
    let version = sh(&mut qemu(&["--version"]));
    assert_eq!(version.code, 0, "qemu-aarch64-static: {}", version.stderr);
    assert!(version.stdout.starts_with(&format!("gpureap {VERSION} (")));

    let (host, mut incident) = Sim::gpus(2).named("Simulated GH200").stage();
    let holder = incident.hold(scheduler(1, 40 * GIB));
    let backend = host.backend();
    let status = sh(&mut qemu(&["--backend", &backend, "status", "--json"]));
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status = status.json();
    assert_eq!(status["gpus"][1]["memory_used"], 40 * GIB);
    assert_eq!(status["holders"][0]["pid"], holder, "{status:#}");

    // A free through it, verified by the simulated driver.
    let pid = holder.to_string();
    let freed = sh(&mut qemu(&[
        "--backend",
        &backend,
        "free",
        "--pid",
        &pid,
        "--grace",
        "1s",
        "--yes",
        "--json",
    ]));
    assert_eq!(freed.code, 0, "{}{}", freed.stdout, freed.stderr);
    assert_eq!(gpu(&freed.json(), 1)["freed"], true);
    assert!(!alive(holder));

    // The demo starts this binary again as its SGLang stand-ins, which takes the kernel
    // running an aarch64 binary through qemu: binfmt_misc, here one of a user namespace's own
    // (Linux 6.7 and later), so nothing of the host's is registered or changed. Debian's
    // registration of qemu-aarch64 (/usr/share/binfmts/qemu-aarch64), with `F` (qemu opened
    // now) and `P` (argv[0] passed on: the stand-ins' titles).
    if let Some(why) = no_binfmt_misc_of_our_own() {
        return skip(&format!("{why}: the aarch64 demo's stand-ins cannot start"));
    }
    let register = work.path().join("register");
    std::fs::write(
        &register,
        ":gpureap-aarch64:M::\\x7fELF\\x02\\x01\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02\\x00\\xb7\\x00:\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\x00\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xfe\\xff\\xff\\xff:/usr/bin/qemu-aarch64-static:FP",
    )
    .expect("registration");
    let demo = sh(Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c"])
        .arg(
            "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc && \
             cat \"$1\" > /proc/sys/fs/binfmt_misc/register && exec \"$2\" demo --json",
        )
        .arg("sh")
        .arg(&register)
        .arg(&binary)
        .env("QEMU_LD_PREFIX", "/usr/aarch64-linux-gnu")
        .env_remove("GPUREAP_BACKEND")
        .env("TMPDIR", work.path())
        .stdin(Stdio::null()));
    assert_eq!(demo.code, 0, "{}{}", demo.stdout, demo.stderr);
    let facts = demo.json();
    assert_eq!(facts["as_designed"], true, "{:#}", facts["differences"]);
    let workers: Vec<&serde_json::Value> = facts["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|process| process["role"] == "worker")
        .collect();
    assert_eq!(workers.len(), 8, "{facts:#}");
    for (rank, worker) in workers.iter().enumerate() {
        assert_eq!(worker["cmdline"], format!("sglang::scheduler_TP{rank}"));
    }
}

/// The release workflow passes actionlint (.ci/run installs it), builds with scripts/release
/// and nothing else, and attaches dist/; a mistake in it is caught.
#[test]
fn the_release_workflow_passes_actionlint_and_runs_scripts_release() {
    let workflow = Path::new(ROOT).join(".github/workflows/release.yml");
    let actionlint = |path: &Path| -> Run {
        Command::new("actionlint")
            .arg("-no-color")
            .arg(path)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|error| panic!("actionlint ({error}): .ci/run installs it"))
            .into()
    };
    let run = actionlint(&workflow);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let text = std::fs::read_to_string(&workflow).expect("workflow");
    assert_eq!(text.matches("run: scripts/release\n").count(), 1);
    assert!(
        !text.contains("cargo "),
        "the workflow builds only through scripts/release"
    );
    assert!(text.contains("dist/*"));
    let work = tempfile::tempdir().expect("tempdir");
    let broken = work.path().join("release.yml");
    std::fs::write(
        &broken,
        text.replace("${{ github.token }}", "${{ github.tokn }}"),
    )
    .expect("copy");
    let run = actionlint(&broken);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stdout.contains("tokn"), "{}", run.stdout);
}

/// The Kubernetes manifests run the image of this version, by its tag.
#[test]
fn the_manifests_name_the_image_by_this_version() {
    let folder = Path::new(ROOT).join("deploy/kubernetes");
    let mut named = 0;
    for entry in std::fs::read_dir(&folder).expect("manifests").flatten() {
        let text = std::fs::read_to_string(entry.path()).expect("manifest");
        for image in text
            .lines()
            .filter_map(|line| line.trim().strip_prefix("image: "))
            .filter(|image| image.contains("gpureap"))
        {
            assert_eq!(
                image,
                format!("gpureap:{VERSION}"),
                "{}",
                entry.path().display()
            );
            named += 1;
        }
    }
    assert_eq!(named, 2, "the exporter's and the watch's DaemonSets");
}

/// The artifacts' profile (`dist`) inherits the release profile, its per-package settings
/// included, and those take precedence over `dist`'s own: every package the quick start's
/// release profile builds unoptimised is optimised again in `dist` (fully, or for size: code
/// that runs once per command, Cargo.toml says which), or an artifact would ship it so.
#[test]
fn the_dist_profile_optimises_every_package_the_release_profile_does_not() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml")).expect("Cargo.toml");
    let manifest: toml::Table = text.parse().expect("Cargo.toml parses");
    let profile = |name: &str| manifest["profile"][name].clone();
    let (release, dist) = (profile("release"), profile("dist"));
    assert_eq!(dist["inherits"].as_str(), Some("release"));
    assert_eq!(dist["opt-level"].as_integer(), Some(3));
    assert_eq!(dist["lto"].as_str(), Some("fat"));
    assert_eq!(dist["codegen-units"].as_integer(), Some(1));
    let packages = release
        .get("package")
        .and_then(toml::Value::as_table)
        .expect("the release profile's per-package settings");
    assert!(!packages.is_empty());
    for (package, settings) in packages {
        let settings = settings.as_table().expect("a table");
        for key in settings.keys() {
            assert_eq!(
                key, "opt-level",
                "{package}: only opt-level is set per package"
            );
        }
        let level = dist
            .get("package")
            .and_then(|all| all.get(package))
            .and_then(|own| own.get("opt-level"));
        assert!(
            level.and_then(toml::Value::as_integer) == Some(3)
                || level.and_then(toml::Value::as_str) == Some("s"),
            "[profile.dist.package.{package}]: opt-level = 3 or \"s\", not {level:?}"
        );
    }
}
