//! Names, presence and allocated GPUs from the node's real sources
//! (`container::sources`): a kubelet pod-resources server stood up here from the
//! vendored proto by Python's grpcio (independent of our generated code),
//! staged node state under a temporary HOST_ROOT, and real processes in real
//! cgroup v2 directories laid out like kubepods, holding simulated GPUs.

use std::path::{Path, PathBuf};

const PROTO_ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");
const PROTO: &str = "k8s.io/kubelet/pkg/apis/podresources/v1/api.proto";
const GENERATED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/container/pod_resources.rs"
);

/// The committed client code is what protox and tonic-prost-build make of the
/// vendored proto today (`GPUREAP_REGENERATE=1` rewrites it instead).
#[test]
fn generated_code_matches_the_proto() {
    let descriptors = protox::compile([PROTO], [PROTO_ROOT]).expect("the proto compiles");
    let out = tempfile::tempdir().expect("tempdir");
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .out_dir(out.path())
        .compile_fds(descriptors)
        .expect("code generated");
    let made = std::fs::read_to_string(out.path().join("v1.rs")).expect("v1.rs");
    let committed = format!("{}{made}", generated_header());
    if std::env::var_os("GPUREAP_REGENERATE").is_some() {
        std::fs::write(GENERATED, &committed).expect("written");
    }
    let on_disk = std::fs::read_to_string(GENERATED).unwrap_or_default();
    assert!(
        on_disk == committed,
        "src/container/pod_resources.rs differs from what the proto makes: \
         GPUREAP_REGENERATE=1 cargo test --test tests containers_sources::generated_code_matches_the_proto"
    );
}

fn generated_header() -> String {
    format!(
        "//! Generated from proto/{PROTO} by protox and tonic-prost-build\n\
         //! (tests/containers_sources.rs regenerates it and compares; do not edit).\n\n"
    )
}

#[allow(dead_code)]
fn proto_path() -> PathBuf {
    Path::new(PROTO_ROOT).join(PROTO)
}
