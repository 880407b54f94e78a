//! The figures README.md and docs/install.md quote (build times, sizes, test
//! counts) come from a run of `scripts/measure-docs`, recorded in
//! docs/measured.json, never from typing: each quoted figure must say what
//! that file says.

use std::process::Command;

#[test]
fn the_figures_the_docs_quote_are_the_measured_ones() {
    let root = env!("CARGO_MANIFEST_DIR");
    let measured = std::path::Path::new(root).join("docs/measured.json");
    let document: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&measured).expect("docs/measured.json: run scripts/measure-docs"),
    )
    .expect("docs/measured.json is JSON");
    for key in ["date", "commit", "machine", "steps"] {
        assert!(
            document.get(key).is_some(),
            "docs/measured.json has no {key}"
        );
    }
    let output = Command::new("python3")
        .args(["-B", "scripts/measure-docs", "--check"])
        .current_dir(root)
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "the docs quote figures that are not docs/measured.json's:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for quoting in ["README.md", "docs/install.md"] {
        let text = std::fs::read_to_string(std::path::Path::new(root).join(quoting))
            .expect("the docs are readable");
        assert!(
            text.contains("<!-- measured:"),
            "{quoting} quotes no measured figure"
        );
    }
}
