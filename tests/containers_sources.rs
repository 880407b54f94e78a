//! Names, presence and allocated GPUs from the node's real sources
//! (`container::sources`): a kubelet pod-resources server stood up here from the
//! vendored proto by Python's grpcio (independent of our generated code),
//! staged node state under a temporary HOST_ROOT, and real processes in real
//! cgroup v2 directories laid out like kubepods, holding simulated GPUs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};
use serde_json::{Value, json};

use crate::harness::*;

const PROTO_ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");
const PROTO: &str = "k8s.io/kubelet/pkg/apis/podresources/v1/api.proto";
const GENERATED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/crates/core/src/container/pod_resources.rs"
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
        "crates/core/src/container/pod_resources.rs differs from what the proto makes: \
         GPUREAP_REGENERATE=1 cargo test --test tests containers_sources::generated_code_matches_the_proto"
    );
}

fn generated_header() -> String {
    format!(
        "//! Generated from proto/{PROTO} by protox and tonic-prost-build\n\
         //! (tests/containers_sources.rs regenerates it and compares; do not edit).\n\n"
    )
}

const ID: &str = "4e1f0c2d9b8a7f6e5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291807f6e";
const OTHER_ID: &str = "9a8b7c6d5e4f30211203f4e5d6c7b8a99a8b7c6d5e4f30211203f4e5d6c7b8a9";
const POD_UID: &str = "7d3c2b1a-0f9e-4d8c-b7a6-554433221100";
#[cfg(feature = "kubelet")]
const GPU0: &str = "GPU-sim-00000000";
#[cfg(feature = "kubelet")]
const GPU1: &str = "GPU-sim-00000001";

/// The kubepods path (systemd driver) of a containerd container of the pod.
fn kubepods_path(uid: &str, id: &str) -> String {
    let uid = uid.replace('-', "_");
    format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-{id}.scope"
    )
}

/// A node's state under a temporary HOST_ROOT, staged file by file as the
/// kubelet, containerd and docker leave it.
struct Node {
    root: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        Node {
            root: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    fn root(&self) -> String {
        self.root.path().display().to_string()
    }

    fn dir(&self, relative: &str) -> PathBuf {
        let path = self.path(relative);
        std::fs::create_dir_all(&path).expect("mkdir");
        path
    }

    /// The kubelet's log folder of a pod, and the link of one container's log.
    fn pod_logs(&self, namespace: &str, pod: &str, uid: &str, container: &str, id: &str) {
        self.dir(&format!("var/log/pods/{namespace}_{pod}_{uid}/{container}"));
        let links = self.dir("var/log/containers");
        std::fs::write(
            links.join(format!("{pod}_{namespace}_{container}-{id}.log")),
            "",
        )
        .expect("log link");
    }

    /// containerd's task folder (namespace k8s.io) exists; with `id`, that
    /// task's OCI config carrying the CRI's annotations.
    #[cfg(feature = "kubelet")]
    fn containerd(&self, task: Option<(&str, &str, &str, &str, &str)>) {
        let tasks = self.dir("run/containerd/io.containerd.runtime.v2.task/k8s.io");
        if let Some((id, namespace, pod, uid, container)) = task {
            let folder = tasks.join(id);
            std::fs::create_dir_all(&folder).expect("task folder");
            let config = json!({
                "ociVersion": "1.1.0",
                "annotations": {
                    "io.kubernetes.cri.container-type": "container",
                    "io.kubernetes.cri.container-name": container,
                    "io.kubernetes.cri.sandbox-name": pod,
                    "io.kubernetes.cri.sandbox-namespace": namespace,
                    "io.kubernetes.cri.sandbox-uid": uid,
                }
            });
            std::fs::write(folder.join("config.json"), config.to_string()).expect("config.json");
        }
    }

    /// Docker's containers folder exists; with `id`, that container named `name`.
    fn docker(&self, container: Option<(&str, &str)>) {
        let containers = self.dir("var/lib/docker/containers");
        if let Some((id, name)) = container {
            let folder = containers.join(id);
            std::fs::create_dir_all(&folder).expect("container folder");
            let config = json!({"ID": id, "Name": format!("/{name}")});
            std::fs::write(folder.join("config.v2.json"), config.to_string()).expect("config");
        }
    }

    /// Where the kubelet puts its pod-resources socket under this root.
    fn socket(&self) -> PathBuf {
        self.dir("var/lib/kubelet/pod-resources")
            .join("kubelet.sock")
    }
}

/// The kubelet's pod-resources server (tests/kubelet_pod_resources.py),
/// stopped by its PID when dropped.
struct Kubelet {
    child: Child,
    /// Where a `hang` or `garbage` server records each connection it accepts.
    accepted: PathBuf,
    /// Its temporary directory (`TMPDIR`), which it must leave empty.
    tmp: tempfile::TempDir,
}

impl Kubelet {
    /// Starts it in `mode` on `socket`, serving `pods` (`serve` mode); `None`
    /// (the test skipped) where Python's grpcio is not installed.
    fn start(mode: &str, socket: &Path, pods: &Value) -> Option<Kubelet> {
        let probe = Command::new("python3")
            .args(["-c", "import grpc, grpc_tools"])
            .stderr(Stdio::null())
            .status();
        if !probe.is_ok_and(|status| status.success()) {
            skip("python3 with grpcio and grpcio-tools is needed (.ci/run installs them)");
            return None;
        }
        let pods_file = socket.with_extension("pods.json");
        std::fs::write(&pods_file, pods.to_string()).expect("pods file");
        // Its temporary files go here, to check that none outlives the start:
        // the test kills it with SIGKILL, which no clean-up at exit survives.
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/kubelet_pod_resources.py"
            ))
            .arg(mode)
            .arg(socket)
            .arg(&pods_file)
            .env("TMPDIR", tmp.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout).read_line(&mut line).expect("read");
        // Built first, so that a failed check still stops it.
        let kubelet = Kubelet {
            child,
            accepted: PathBuf::from(format!("{}.accepted", socket.display())),
            tmp,
        };
        assert_eq!(line.trim(), "ready", "the kubelet server did not start");
        let left: Vec<_> = std::fs::read_dir(kubelet.tmp.path())
            .expect("tmp")
            .flatten()
            .map(|entry| entry.file_name())
            .collect();
        assert!(
            left.is_empty(),
            "the kubelet server leaves {left:?} in /tmp"
        );
        Some(kubelet)
    }

    /// Whether a client connected to a `hang` or `garbage` server.
    fn was_called(&self) -> bool {
        self.accepted.exists()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A holder of 4 GiB on GPU 0 in the cgroup `path` (under `cgroups`' root).
fn holder_in(incident: &mut Incident, cgroups: &Cgroups, title: &str, path: &str) -> u32 {
    let pid = incident.hold(Holder::new(title).on(0, 4 * GIB));
    cgroups.move_in(path, pid);
    pid
}

/// `gpureap ARGS --host-root ROOT` (and the kubelet's socket, when given).
fn run_on(host: &SimHost, node: &Node, socket: Option<&Path>, args: &[&str]) -> Run {
    let mut command = gpureap(host);
    command.args(args).arg("--host-root").arg(node.root());
    if let Some(socket) = socket {
        command.arg("--kubelet-socket").arg(socket);
    }
    command.output().expect("gpureap runs").into()
}

fn container_of(status: &Value, pid: u32) -> Value {
    let holder = holder_of(status, pid);
    assert!(
        holder["container"].is_object(),
        "holder {pid} has no container: {holder:#}"
    );
    let mut container = holder["container"].clone();
    container["flags"] = holder["flags"].clone();
    container
}

fn flags(container: &Value) -> Vec<&str> {
    container["flags"]
        .as_array()
        .expect("flags")
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

/// One pod as the kubelet lists it: its containers and their GPUs.
#[cfg(feature = "kubelet")]
fn pod(namespace: &str, name: &str, containers: &[(&str, &[&str])]) -> Value {
    json!({
        "namespace": namespace,
        "name": name,
        "containers": containers.iter().map(|(container, gpus)| json!({
            "name": container,
            "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": gpus}],
        })).collect::<Vec<_>>(),
    })
}

#[cfg(feature = "kubelet")]
#[test]
fn the_kubelet_and_the_node_name_a_pod_and_find_nothing_wrong() {
    let node = Node::new();
    node.containerd(Some((ID, "llm", "server-0", POD_UID, "vllm")));
    node.pod_logs("llm", "server-0", POD_UID, "vllm", ID);
    let socket = node.socket();
    let pods = json!([pod("llm", "server-0", &[("vllm", &[GPU0])])]);
    let Some(_kubelet) = Kubelet::start("serve", &socket, &pods) else {
        return;
    };
    let Some(cgroups) = Cgroups::v2("sources") else {
        return skip(NO_CGROUPS);
    };
    let (host, mut incident) = Sim::gpus(2).stage();
    let pid = holder_in(
        &mut incident,
        &cgroups,
        "vllm-worker",
        &kubepods_path(POD_UID, ID),
    );

    let status = run_on(&host, &node, None, &["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let json = status.json();
    let container = container_of(&json, pid);
    assert_eq!(container["name"], "vllm", "{container:#}");
    assert_eq!(container["pod"], "server-0");
    assert_eq!(container["namespace"], "llm");
    assert_eq!(container["pod_uid"], POD_UID);
    assert_eq!(container["gone"], Value::Null);
    assert_eq!(container["unrequested_gpus"], json!([]));
    assert!(flags(&container).is_empty(), "{container:#}");
    assert_eq!(json["container_notes"], json!([]), "{json:#}");

    let table = run_on(&host, &node, None, &["status"]);
    assert!(table.stdout.contains("llm/server-0"), "{}", table.stdout);
    let check = run_on(&host, &node, None, &["check"]);
    assert_eq!(check.code, 0, "{}{}", check.stdout, check.stderr);
}

#[cfg(feature = "kubelet")]
#[test]
fn a_deleted_pod_is_container_gone_checked_and_freed_by_orphans() {
    let node = Node::new();
    // containerd still has the task; the kubelet no longer has its pod.
    node.containerd(Some((ID, "llm", "server-0", POD_UID, "vllm")));
    let socket = node.socket();
    let pods = json!([pod("llm", "other-0", &[("vllm", &[GPU1])])]);
    let Some(_kubelet) = Kubelet::start("serve", &socket, &pods) else {
        return;
    };
    let Some(cgroups) = Cgroups::v2("sources") else {
        return skip(NO_CGROUPS);
    };
    let (host, mut incident) = Sim::gpus(2).stage();
    let pid = holder_in(
        &mut incident,
        &cgroups,
        "vllm-worker",
        &kubepods_path(POD_UID, ID),
    );

    let json = run_on(&host, &node, None, &["status", "--json"]).json();
    let container = container_of(&json, pid);
    assert_eq!(container["gone"], "kubelet pod-resources", "{container:#}");
    assert!(
        flags(&container).contains(&"container_gone"),
        "{container:#}"
    );
    let table = run_on(&host, &node, None, &["status"]).stdout;
    assert!(
        table.contains("Container gone: PID") && table.contains("free --orphans"),
        "{table}"
    );

    let check = run_on(&host, &node, None, &["check"]);
    assert_eq!(check.code, 1, "{}{}", check.stdout, check.stderr);
    assert!(
        check
            .stdout
            .starts_with("GPU 0: 4.0 GiB held by 1 process whose container is gone"),
        "{}",
        check.stdout
    );
    assert_contains(&check.stdout, "container gone: its container or pod");

    let metrics = run_on(&host, &node, None, &["status", "--prometheus"]).stdout;
    assert!(
        metrics.lines().any(
            |line| line.starts_with("gpureap_gpu_container_gone_memory_bytes{")
                && line.contains("gpu=\"0\"")
                && line
                    .rsplit(' ')
                    .next()
                    .and_then(|value| value.parse::<f64>().ok())
                    == Some((4 * GIB) as f64)
        ),
        "{metrics}"
    );

    // Where no source can tell (an empty node root), nothing is gone and
    // --orphans takes nothing: absence is never "gone".
    let empty = Node::new();
    let plan = run_on(
        &host,
        &empty,
        None,
        &["free", "--orphans", "--dry-run", "--json"],
    )
    .json();
    assert!(!target_pids(&plan).contains(&pid), "{plan:#}");

    let freed = run_on(
        &host,
        &node,
        None,
        &["free", "--orphans", "--yes", "--json", "--grace", "1s"],
    );
    assert_eq!(freed.code, 0, "{}\n{}", freed.stdout, freed.stderr);
    let report = freed.json();
    let target = target(&report, pid).unwrap_or_else(|| panic!("{report:#}"));
    let reason = target["container_gone"].as_str().expect("reason");
    assert!(
        reason.starts_with(
            "container gone: containerd container vllm (4e1f0c2d9b8a) of pod llm/server-0"
        ),
        "{reason}"
    );
    assert!(!alive(pid), "{pid} survived");
}

#[test]
fn docker_rm_is_container_gone_and_a_live_container_is_named() {
    let node = Node::new();
    node.docker(Some((OTHER_ID, "web")));
    let Some(cgroups) = Cgroups::v2("sources") else {
        return skip(NO_CGROUPS);
    };
    let (host, mut incident) = Sim::gpus(2).stage();
    let removed = holder_in(
        &mut incident,
        &cgroups,
        "removed-worker",
        &format!("system.slice/docker-{ID}.scope"),
    );
    let live = holder_in(
        &mut incident,
        &cgroups,
        "live-worker",
        &format!("system.slice/docker-{OTHER_ID}.scope"),
    );
    let json = run_on(&host, &node, None, &["status", "--json"]).json();
    let gone = container_of(&json, removed);
    assert_eq!(gone["gone"], "/var/lib/docker/containers", "{gone:#}");
    assert!(flags(&gone).contains(&"container_gone"));
    let named = container_of(&json, live);
    assert_eq!(named["name"], "web", "{named:#}");
    assert_eq!(named["gone"], Value::Null);
    assert!(flags(&named).is_empty());
    assert_eq!(json["container_notes"], json!([]), "{json:#}");
}

#[cfg(feature = "kubelet")]
#[test]
fn a_gpu_the_pod_was_never_allocated_is_unrequested() {
    let node = Node::new();
    node.containerd(Some((ID, "llm", "server-0", POD_UID, "vllm")));
    let socket = node.socket();
    // Allocated GPU 1; it uses GPU 0.
    let pods = json!([pod("llm", "server-0", &[("vllm", &[GPU1])])]);
    let Some(_kubelet) = Kubelet::start("serve", &socket, &pods) else {
        return;
    };
    let Some(cgroups) = Cgroups::v2("sources") else {
        return skip(NO_CGROUPS);
    };
    let (host, mut incident) = Sim::gpus(2).stage();
    let pid = holder_in(
        &mut incident,
        &cgroups,
        "vllm-worker",
        &kubepods_path(POD_UID, ID),
    );

    let json = run_on(&host, &node, None, &["status", "--json"]).json();
    let container = container_of(&json, pid);
    assert_eq!(container["unrequested_gpus"], json!([0]), "{container:#}");
    assert_eq!(container["gone"], Value::Null);
    assert!(
        flags(&container).contains(&"unrequested_gpu"),
        "{container:#}"
    );
    let table = run_on(&host, &node, None, &["status"]).stdout;
    assert!(table.contains("Unrequested GPU: PID"), "{table}");
    let check = run_on(&host, &node, None, &["check"]);
    assert_eq!(check.code, 1, "{}{}", check.stdout, check.stderr);
    assert!(
        check.stdout.starts_with(&format!(
            "GPU 0: used by PID {pid} in llm/server-0 vllm, never allocated to its pod"
        )),
        "{}",
        check.stdout
    );
}

/// Status with the kubelet in `mode`; the holder's pod named from the node's
/// files. Returns the status document and how long it took.
fn status_with_kubelet(mode: &str) -> Option<(Value, Duration, bool)> {
    let node = Node::new();
    node.pod_logs("llm", "server-0", POD_UID, "vllm", ID);
    let socket = node.socket();
    let kubelet = match mode {
        "absent" => None,
        _ => Some(Kubelet::start(mode, &socket, &json!([]))?),
    };
    let Some(cgroups) = Cgroups::v2("sources") else {
        skip(NO_CGROUPS);
        return None;
    };
    let (host, mut incident) = Sim::gpus(2).stage();
    let pid = holder_in(
        &mut incident,
        &cgroups,
        "vllm-worker",
        &kubepods_path(POD_UID, ID),
    );
    let started = Instant::now();
    let status = run_on(&host, &node, None, &["status", "--json"]);
    let took = started.elapsed();
    assert_eq!(status.code, 0, "{}", status.stderr);
    let json = status.json();
    let container = container_of(&json, pid);
    // The node's files still name it, and it is not taken for gone.
    assert_eq!(container["pod"], "server-0", "{container:#}");
    assert_eq!(container["name"], "vllm", "{container:#}");
    assert_eq!(container["gone"], Value::Null, "{container:#}");
    let called = kubelet.as_ref().is_some_and(Kubelet::was_called);
    Some((json, took, called))
}

fn kubelet_note(json: &Value) -> String {
    json["container_notes"]
        .as_array()
        .expect("notes")
        .iter()
        .filter_map(Value::as_str)
        .find(|note| note.starts_with("kubelet pod-resources"))
        .unwrap_or_else(|| panic!("no kubelet note: {json:#}"))
        .to_string()
}

#[test]
fn an_absent_kubelet_socket_is_a_note() {
    let Some((json, _, _)) = status_with_kubelet("absent") else {
        return;
    };
    assert!(kubelet_note(&json).contains("no socket there"), "{json:#}");
}

#[cfg(feature = "kubelet")]
#[test]
fn a_kubelet_that_never_answers_costs_the_budget_and_a_note() {
    let Some((json, took, called)) = status_with_kubelet("hang") else {
        return;
    };
    assert!(called, "the kubelet was never asked");
    assert!(
        kubelet_note(&json).contains("no answer within 2.0 s"),
        "{json:#}"
    );
    // The budget (2 s) plus the scan and a loaded machine's slack.
    assert!(took < Duration::from_secs(6), "status took {took:?}");
}

#[cfg(feature = "kubelet")]
#[test]
fn garbage_from_the_kubelet_is_a_note() {
    let Some((json, _, called)) = status_with_kubelet("garbage") else {
        return;
    };
    assert!(called, "the kubelet was never asked");
    let note = kubelet_note(&json);
    assert!(!note.contains("no socket there"), "{note}");
    assert!(!note.chars().any(char::is_control), "{note:?}");
}

/// A build without the kubelet client (`--no-default-features`): a socket
/// that is there is not asked, and the note says why in words; the node's
/// files still name the pod.
#[cfg(not(feature = "kubelet"))]
#[test]
fn without_the_kubelet_client_a_socket_that_is_there_is_a_note() {
    let Some((json, _, called)) = status_with_kubelet("serve") else {
        return;
    };
    assert!(!called, "a build without the client asked the kubelet");
    assert!(
        kubelet_note(&json).contains(
            "this gpureap was built without the kubelet client (cargo feature \"kubelet\")"
        ),
        "{json:#}"
    );
}

/// No holder in a container: the kubelet is not asked at all.
#[test]
fn no_holder_in_a_container_asks_no_kubelet() {
    let node = Node::new();
    let socket = node.socket();
    let Some(kubelet) = Kubelet::start("hang", &socket, &json!([])) else {
        return;
    };
    let (host, mut incident) = Sim::gpus(2).stage();
    let pid = incident.hold(Holder::new("bare-worker").on(0, GIB));
    let json = run_on(&host, &node, None, &["status", "--json"]).json();
    assert!(
        json["holders"]
            .as_array()
            .expect("holders")
            .iter()
            .any(|holder| holder["pid"] == pid),
        "{json:#}"
    );
    assert_eq!(json["container_notes"], json!([]));
    assert!(!kubelet.was_called(), "the kubelet was asked");
}

#[cfg(feature = "kubelet")]
#[test]
fn hostile_pod_and_container_names_are_escaped() {
    let evil_pod = "web\"0\u{1b}[31m\\x";
    let evil_container = "vllm\nGPU 9 FORGED";
    let node = Node::new();
    node.containerd(Some((ID, "llm", evil_pod, POD_UID, evil_container)));
    let socket = node.socket();
    let pods = json!([pod("llm", evil_pod, &[(evil_container, &[GPU1])])]);
    let Some(_kubelet) = Kubelet::start("serve", &socket, &pods) else {
        return;
    };
    let Some(cgroups) = Cgroups::v2("sources") else {
        return skip(NO_CGROUPS);
    };
    let (host, mut incident) = Sim::gpus(2).stage();
    let pid = holder_in(
        &mut incident,
        &cgroups,
        "vllm-worker",
        &kubepods_path(POD_UID, ID),
    );
    let json = run_on(&host, &node, None, &["status", "--json"]).json();
    let container = container_of(&json, pid);
    assert_eq!(container["pod"], evil_pod, "{container:#}");
    assert_eq!(container["name"], evil_container);
    assert_eq!(container["unrequested_gpus"], json!([0]));
    for args in [&["status"][..], &["status", "--tree"], &["check"]] {
        let text = run_on(&host, &node, None, args).stdout;
        assert_no_forged_lines(&args.join(" "), &text, &["GPU 9 FORGED"]);
    }
}

/// A node root that is not a folder, or an empty path, is bad usage (exit 2)
/// before anything runs, on every command that reads the sources.
#[test]
fn bad_source_flags_exit_2_before_anything_runs() {
    let host = Sim::gpus(2).build();
    let missing = "/nonexistent/gpureap-host-root";
    for args in [
        &["status", "--host-root", missing][..],
        &["check", "--host-root", missing],
        &["exporter", "--host-root", missing],
        &["free", "--orphans", "--yes", "--host-root", missing],
        &["status", "--host-root", ""],
        &["status", "--kubelet-socket", ""],
    ] {
        let result = run(&host, args);
        assert_eq!(result.code, 2, "{args:?}: {}", result.stderr);
        assert!(result.stdout.is_empty(), "{args:?}: {}", result.stdout);
    }
    let named = run(&host, &["status", "--host-root", missing]);
    assert!(named.stderr.contains("--host-root"), "{}", named.stderr);
}

#[test]
fn a_real_crun_container_holding_a_gpu_is_attributed_and_named() {
    if let Some(why) = Crun::unavailable() {
        return skip(why);
    }
    let Some(cgroups) = Cgroups::v2("sources") else {
        return skip(NO_CGROUPS);
    };
    let host = Sim::gpus(2).build();
    let container = Crun::start(ID, host.path());
    // With its cgroup manager off, crun leaves the container in its
    // caller's cgroup: it is moved into podman's (whose runtime is crun).
    cgroups.move_in(format!("machine.slice/libpod-{ID}.scope"), container.pid);
    let node = Node::new();
    node.dir("var/lib/containers/storage/overlay-containers");
    std::fs::write(
        node.path("var/lib/containers/storage/overlay-containers/containers.json"),
        json!([{"id": ID, "names": ["vllm-crun"]}]).to_string(),
    )
    .expect("containers.json");

    let json = run_on(&host, &node, None, &["status", "--json"]).json();
    let attributed = container_of(&json, container.pid);
    assert_eq!(attributed["runtime"], "podman", "{attributed:#}");
    assert_eq!(attributed["id"], ID);
    assert_eq!(attributed["name"], "vllm-crun");
    // Its own PID namespace: it is PID 1 there.
    assert_eq!(attributed["local_pid"], 1);
    assert_eq!(attributed["gone"], Value::Null);
    let table = run_on(&host, &node, None, &["status"]).stdout;
    assert!(table.contains("vllm-crun"), "{table}");
}
