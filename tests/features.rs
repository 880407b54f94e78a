//! A build without the default features (`cargo test --no-default-features`,
//! which .ci/run also runs) still runs what does not need them, and says in
//! words what it cannot do. With the features these tests are not built:
//! the features' own tests (tests/top.rs, the kubelet's in
//! tests/containers_sources.rs) cover them.

#![cfg(not(all(feature = "top", feature = "kubelet")))]

use crate::harness::*;

/// Without `top`: the live view and `demo --top` could not be done here
/// (3), naming the feature; status, wait and plan run as ever.
#[cfg(not(feature = "top"))]
#[test]
fn without_the_live_view_top_exits_3_in_words_and_the_rest_runs() {
    let host = Sim::gpus(2).build();
    // `demo` stages its own simulated driver: no --backend.
    let demo = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["demo", "--top"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("gpureap runs");
    for (args, ran) in [("top", run(&host, &["top"])), ("demo --top", demo.into())] {
        let ran: Run = ran;
        assert_eq!(ran.code, 3, "{args}: {}", ran.stderr);
        assert!(
            ran.stderr
                .contains("built without the live view (cargo feature \"top\")"),
            "{args}: {}",
            ran.stderr
        );
    }
    assert_eq!(run(&host, &["status", "--json"]).code, 0);
    assert_eq!(run(&host, &["wait", "--timeout", "1s"]).code, 0);
    let plan = run(
        &host,
        &[
            "plan",
            "--",
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/models/llama-3.1-8b"
            ),
        ],
    );
    assert_eq!(plan.code, 0, "{}", plan.stderr);
}
