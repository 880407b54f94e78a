//! The helpers of the GPU validation scripts (scripts/gpuval.py) are checked
//! by their own unit tests, which need no GPU: run here so that `cargo test`
//! (and with it `.ci/run`) keeps them green.

use std::process::Command;

#[test]
fn the_validation_scripts_unit_tests_pass() {
    let scripts = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts");
    let output = Command::new("python3")
        .args(["-B", "-m", "unittest", "discover", "-s", scripts])
        .current_dir(scripts)
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said}");
    assert!(
        said.lines()
            .any(|line| line.starts_with("Ran ") && !line.starts_with("Ran 0 ")),
        "no test ran: {said}"
    );
}
