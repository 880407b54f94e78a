//! The simulated driver's own input: files in the sim directory are input
//! like any other, and a bad one is a clear error naming it, never a silent
//! default, a wrapped number, or a file read through a symbolic link.

use gpureap_core::driver::sim::incident::Holder;

use crate::harness::*;

/// The error the status JSON gives for one GPU, or "" when it has none.
fn gpu_error(status: &serde_json::Value, index: u32) -> String {
    gpu(status, index)["error"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn huge_claims_and_a_leak_saturate_instead_of_wrapping() {
    let (host, mut incident) = Sim::gpus(1).stage();
    incident.hold(Holder::new("python3 a.py").on(0, u64::MAX));
    incident.hold(Holder::new("python3 b.py").on(0, u64::MAX));
    let target = incident.hold(Holder::new("python3 c.py").on(0, GIB));
    host.leak(0, 5).expect("leak");

    let status = run(&host, &["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status = status.json();
    assert_eq!(gpu(&status, 0)["memory_used"], u64::MAX, "{status:#}");
    assert_eq!(gpu(&status, 0)["memory_unattributed"], 0, "{status:#}");
    let table = run(&host, &["status"]);
    assert_eq!(table.code, 0, "{}", table.stderr);

    // Verification sums what out-of-scope holders explain: it must not wrap either.
    let report = run(
        &host,
        &free_json(&["--pid", &target.to_string()], "0", "300ms"),
    );
    assert_eq!(report.code, 0, "{}{}", report.stdout, report.stderr);
    assert_eq!(gpu(&report.json(), 0)["freed"], true);
}

#[test]
fn sim_files_are_never_read_through_a_symbolic_link() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let holder = incident.hold(Holder::new("python3 serve.py").on(1, 4 * GIB));
    let passwd = std::fs::read_to_string("/etc/passwd").expect("passwd");
    let first_line = passwd.lines().next().expect("a line");
    std::os::unix::fs::symlink("/etc/passwd", host.path().join("leak.0")).expect("symlink");
    let claim = host.path().join(format!("claims/{holder}.1"));
    std::fs::remove_file(&claim).expect("claim");
    std::os::unix::fs::symlink("/etc/passwd", &claim).expect("symlink");

    for args in [
        &["status"][..],
        &["status", "--json"],
        &["status", "--tree"],
    ] {
        let result = run(&host, args);
        assert!(
            !result.stdout.contains(first_line) && !result.stderr.contains(first_line),
            "{args:?} printed /etc/passwd:\n{}{}",
            result.stdout,
            result.stderr
        );
    }
    let status = run(&host, &["status", "--json"]).json();
    let leak_error = gpu_error(&status, 0);
    assert!(
        leak_error.contains("leak.0") && leak_error.contains("symbolic link"),
        "{status:#}"
    );
    let claim_error = gpu_error(&status, 1);
    assert!(
        claim_error.contains(&format!("claims/{holder}.1"))
            && claim_error.contains("symbolic link"),
        "{status:#}"
    );
}

#[test]
fn binary_oversized_and_unreadable_claims_are_errors_naming_the_file() {
    let (host, mut incident) = Sim::gpus(3).stage();
    let binary = incident.hold(Holder::new("python3 binary.py").on(0, 4 * GIB));
    let oversized = incident.hold(Holder::new("python3 oversized.py").on(1, 4 * GIB));
    let unreadable = incident.hold(Holder::new("python3 unreadable.py").on(2, 4 * GIB));
    let claim = |pid: u32, gpu: u32| host.path().join(format!("claims/{pid}.{gpu}"));
    std::fs::write(claim(binary, 0), [0xff, 0x00, 0x12, 0x80]).expect("binary claim");
    std::fs::write(claim(oversized, 1), "7".repeat(1 << 20)).expect("big claim");
    let mut permissions = std::fs::metadata(claim(unreadable, 2))
        .expect("claim")
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o000);
    std::fs::set_permissions(claim(unreadable, 2), permissions).expect("chmod");

    // The GPUs that cannot be read are shown with their error: could not tell (3).
    let status = run(&host, &["status", "--json"]);
    assert_eq!(status.code, 3, "{}", status.stderr);
    let status = status.json();
    let error = gpu_error(&status, 0);
    assert!(
        error.contains(&format!("claims/{binary}.0")) && error.contains("byte count"),
        "{status:#}"
    );
    let error = gpu_error(&status, 1);
    assert!(
        error.contains(&format!("claims/{oversized}.1")) && error.len() < 300,
        "{status:#}"
    );
    // Root reads a mode-000 file; nobody does not, and must not take it for 1 GiB.
    let as_nobody = run_as_nobody(&host, &["status", "--json"]);
    assert_eq!(as_nobody.code, 3, "{}", as_nobody.stderr);
    let as_nobody = as_nobody.json();
    let error = gpu_error(&as_nobody, 2);
    assert!(
        error.contains(&format!("claims/{unreadable}.2")) && error.contains("ermission denied"),
        "{as_nobody:#}"
    );
}

#[test]
fn a_bad_gpus_file_is_refused_naming_the_file() {
    let host = Sim::gpus(2).build();
    std::fs::write(host.path().join("gpus"), "85899345920 H200\nlots H200\n").expect("gpus");
    let result = run(&host, &["status"]);
    assert_eq!(result.code, 2, "{}{}", result.stdout, result.stderr);
    assert_contains(&result.stderr, "gpus line 2");
    assert_contains(&result.stderr, "'lots'");
}

/// `DIR/bookkeeping` is input like `gpus`: a bad one or a symbolic link
/// refuses the driver, naming the file, rather than judge by a default.
#[test]
fn a_bad_bookkeeping_file_is_refused_naming_the_file() {
    let host = Sim::gpus(1).build();
    let path = host.path().join("bookkeeping");
    std::fs::write(&path, "lots").expect("bookkeeping");
    let result = run(&host, &["status"]);
    assert_eq!(result.code, 2, "{}{}", result.stdout, result.stderr);
    assert_contains(
        &result.stderr,
        "bookkeeping: expected a byte count, found 'lots'",
    );
    std::fs::remove_file(&path).expect("removed");
    std::os::unix::fs::symlink("/etc/passwd", &path).expect("symlink");
    let result = run(&host, &["status"]);
    assert_eq!(result.code, 2, "{}{}", result.stdout, result.stderr);
    assert_contains(&result.stderr, "bookkeeping is a symbolic link");
}

#[test]
fn an_unreadable_sim_directory_says_it_cannot_be_read() {
    let host = Sim::gpus(1).build();
    let mut permissions = std::fs::metadata(host.path()).expect("dir").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o000);
    std::fs::set_permissions(host.path(), permissions).expect("chmod");
    let result = run_as_nobody_unchanged(&host, &["status"]);
    assert_eq!(result.code, 2, "{}{}", result.stdout, result.stderr);
    assert!(
        result.stderr.contains("cannot read")
            && result.stderr.contains(&host.path().display().to_string())
            && !result.stderr.contains("has no nvidia0"),
        "{}",
        result.stderr
    );
}

/// A test binary that ran gpureap as nobody (through the copy every uid can
/// run) leaves nothing in the temporary directory once it has exited: not
/// the copy, not the simulated host.
#[test]
fn a_test_run_leaves_nothing_in_the_temporary_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "sim::an_unreadable_sim_directory_says_it_cannot_be_read",
        ])
        .env("TMPDIR", tmp.path())
        .output()
        .expect("the test binary runs");
    assert!(
        child.status.success(),
        "{}",
        String::from_utf8_lossy(&child.stdout)
    );
    assert_contains(&String::from_utf8_lossy(&child.stdout), "1 passed");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("tmp")
        .flatten()
        .map(|entry| entry.path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
