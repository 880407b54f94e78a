//! Which container and pod holds a GPU: real cgroups laid out the way
//! docker, podman, containerd, cri-o and the kubelet lay them out (under a
//! root of the test's own on this host's cgroup v2 mount, and on a cgroup v1
//! hierarchy), real processes moved into them that hold the simulated GPU,
//! and what `status` (JSON, table, `--tree`), the per-process metrics and
//! `check` say of them. Then gpureap itself in a PID namespace of its own,
//! as in a container without the host's PIDs: which holders it cannot see,
//! why, and the remedy.

use std::path::Path;

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};
use serde_json::Value;

use crate::harness::*;

const DOCKER_SYSTEMD: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const DOCKER_CGROUPFS: &str = "2222222222222222222222222222222222222222222222222222222222222222";
const PODMAN: &str = "3333333333333333333333333333333333333333333333333333333333333333";
const CONTAINERD: &str = "4444444444444444444444444444444444444444444444444444444444444444";
const KUBELET_CGROUPFS: &str = "5555555555555555555555555555555555555555555555555555555555555555";
const CRIO: &str = "66666666666666666666666666666666666666666666666666666666666666aa";
const CONMON: &str = "7777777777777777777777777777777777777777777777777777777777777777";
const POD: &str = "8c1f2a3b-4d5e-6f70-8192-a3b4c5d6e7f8";
const OTHER_POD: &str = "0a1b2c3d-0000-4111-8222-333344445555";

/// What a holder's `container` must say: runtime, id, pod UID.
type Expected = (&'static str, &'static str, Option<&'static str>);

fn gpu_of(status: &Value, index: u32) -> &Value {
    status["gpus"]
        .as_array()
        .and_then(|gpus| gpus.iter().find(|gpu| gpu["index"] == index))
        .unwrap_or_else(|| panic!("GPU {index} in {status:#}"))
}

/// The lines of `text` that show `pid` as a holder.
fn lines_of(text: &str, pid: u32) -> Vec<String> {
    text.lines()
        .filter(|line| line.split_whitespace().any(|word| word == pid.to_string()))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_runtime_layout_is_attributed_in_every_output() {
    let Some(cgroups) = Cgroups::v2("test") else {
        return skip("no writable cgroup v2 mount: cannot make the runtimes' cgroups");
    };
    let (host, mut incident) = Sim::gpus(2).stage();
    let pod_systemd = POD.replace('-', "_");
    // (cgroup under the test's root, runtime, id, pod UID), as each lays it out.
    let layouts: Vec<(String, Option<Expected>)> = vec![
        (
            format!("system.slice/docker-{DOCKER_SYSTEMD}.scope"),
            Some(("docker", DOCKER_SYSTEMD, None)),
        ),
        (
            format!("docker/{DOCKER_CGROUPFS}"),
            Some(("docker", DOCKER_CGROUPFS, None)),
        ),
        (
            format!("machine.slice/libpod-{PODMAN}.scope/container"),
            Some(("podman", PODMAN, None)),
        ),
        (
            format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_systemd}.slice/cri-containerd-{CONTAINERD}.scope"
            ),
            Some(("containerd", CONTAINERD, Some(POD))),
        ),
        (
            format!("kubepods/besteffort/pod{OTHER_POD}/{KUBELET_CGROUPFS}"),
            Some(("kubernetes", KUBELET_CGROUPFS, Some(OTHER_POD))),
        ),
        (
            format!("system.slice/crio-{CRIO}.scope"),
            Some(("cri-o", CRIO, None)),
        ),
        // The monitor beside a podman container is no container.
        (format!("machine.slice/libpod-conmon-{CONMON}.scope"), None),
    ];
    let mut staged = Vec::new();
    for (at, (cgroup, expected)) in layouts.into_iter().enumerate() {
        let title = format!("ctr-worker-{at}");
        let pid = incident.hold(Holder::new(&title).on(at as u32 % 2, GIB));
        cgroups.move_in(&cgroup, pid);
        staged.push((pid, cgroup, expected));
    }
    let bare = incident.hold(Holder::new("host-worker").on(0, GIB));

    let status = run(&host, &["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status = status.json();
    for (pid, cgroup, expected) in &staged {
        let holder = holder_of(&status, *pid);
        assert!(
            holder["cgroup"]
                .as_str()
                .unwrap_or_default()
                .ends_with(cgroup.as_str()),
            "{pid}: the raw cgroup stays as it was: {holder:#}"
        );
        let container = &holder["container"];
        match expected {
            None => assert!(container.is_null(), "{cgroup}: {container:#}"),
            Some((runtime, id, pod_uid)) => {
                assert_eq!(container["runtime"], *runtime, "{cgroup}");
                assert_eq!(container["id"], *id, "{cgroup}");
                assert_eq!(container["pod_uid"].as_str(), *pod_uid, "{cgroup}");
                // Same PID namespace as gpureap; no source named them.
                for field in ["local_pid", "pod", "namespace", "name"] {
                    assert!(container[field].is_null(), "{cgroup}: {field}");
                }
            }
        }
    }
    assert!(holder_of(&status, bare)["container"].is_null());

    // The table's CONTAINER column, the tree's label.
    let table = run(&host, &["status"]);
    let tree = run(&host, &["status", "--tree"]);
    for (pid, _, expected) in &staged {
        let label = expected.map(|(runtime, id, _)| format!("{runtime}:{}", &id[..12]));
        let rows = lines_of(&table.stdout, *pid);
        let trees = lines_of(&tree.stdout, *pid);
        assert!(
            !rows.is_empty() && !trees.is_empty(),
            "{pid}:\n{}\n{}",
            table.stdout,
            tree.stdout
        );
        match &label {
            Some(label) => {
                assert!(
                    rows.iter().all(|row| row.contains(label.as_str())),
                    "{label}: {rows:?}"
                );
                let tagged = format!("[container {label}]");
                assert!(
                    trees.iter().any(|line| line.contains(&tagged)),
                    "{tagged}: {trees:?}"
                );
            }
            None => assert!(
                trees.iter().all(|line| !line.contains("[container")),
                "{trees:?}"
            ),
        }
    }
    assert!(table.stdout.contains("CONTAINER"), "{}", table.stdout);

    // The exporter's per-process series carry the labels.
    let metrics = run(&host, &["status", "--prometheus", "--per-process"]);
    assert_eq!(metrics.code, 0, "{}", metrics.stderr);
    let containerd = metrics
        .stdout
        .lines()
        .find(|line| {
            line.starts_with("gpureap_process_gpu_memory_bytes{")
                && line.contains(&format!("pid=\"{}\"", staged[3].0))
        })
        .unwrap_or_else(|| panic!("no series for the containerd holder:\n{}", metrics.stdout));
    for label in [
        "runtime=\"containerd\"".to_string(),
        format!("container_id=\"{CONTAINERD}\""),
        format!("pod_uid=\"{POD}\""),
        "pod=\"\"".to_string(),
        "namespace=\"\"".to_string(),
        "container=\"\"".to_string(),
    ] {
        assert!(containerd.contains(&label), "{label} in {containerd}");
    }
    let outside = metrics
        .stdout
        .lines()
        .find(|line| line.contains(&format!("pid=\"{bare}\"")))
        .expect("a series for the holder in no container");
    assert!(
        outside.contains("runtime=\"\"") && outside.contains("container_id=\"\""),
        "{outside}"
    );
    drop(incident);
}

#[test]
fn a_v1_hierarchy_names_the_container_when_the_v2_path_does_not() {
    let pids_mount = Path::new("/sys/fs/cgroup/pids");
    let Some(own) = own_cgroup(|line| {
        let (_, rest) = line.split_once(':')?;
        rest.strip_prefix("pids:")
    }) else {
        return skip("no cgroup v1 pids hierarchy here");
    };
    let Some(cgroups) =
        Cgroups::under(pids_mount.to_path_buf(), "test").map(|made| made.returning_to(&own))
    else {
        return skip("the cgroup v1 pids hierarchy is not writable here");
    };
    let (host, mut incident) = Sim::gpus(2).stage();
    let pid = incident.hold(Holder::new("v1-worker").on(0, GIB));
    cgroups.move_in(format!("docker/{DOCKER_CGROUPFS}"), pid);
    let status = run(&host, &["status", "--json"]).json();
    let holder = holder_of(&status, pid);
    assert_eq!(holder["container"]["runtime"], "docker", "{holder:#}");
    assert_eq!(holder["container"]["id"], DOCKER_CGROUPFS);
    // The shown cgroup is still the v2 path, which names no container.
    assert!(
        !holder["cgroup"]
            .as_str()
            .unwrap_or_default()
            .contains(DOCKER_CGROUPFS),
        "{holder:#}"
    );
    drop(incident);
}

#[test]
fn cgroup_paths_of_any_bytes_are_read_and_shown_written_out() {
    use std::os::unix::ffi::OsStrExt;
    let Some(cgroups) = Cgroups::v2("test") else {
        return skip("no writable cgroup v2 mount");
    };
    let (host, mut incident) = Sim::gpus(2).stage();
    let plain = incident.hold(Holder::new("bytes-worker").on(0, GIB));
    let escaping = incident.hold(Holder::new("escape-worker").on(1, GIB));
    // A prefix that is not UTF-8 above docker's layout: still docker's.
    let odd = std::ffi::OsStr::from_bytes(b"a\xff\xfeb");
    cgroups.move_in(Path::new(odd).join("docker").join(DOCKER_CGROUPFS), plain);
    // One that holds an escape: no runtime makes such a path, none is named.
    let escape = std::ffi::OsStr::from_bytes(b"c\x1b[2Jd");
    cgroups.move_in(
        Path::new(escape).join("docker").join(DOCKER_SYSTEMD),
        escaping,
    );
    let status = run(&host, &["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status = status.json();
    let holder = holder_of(&status, plain);
    assert_eq!(holder["container"]["id"], DOCKER_CGROUPFS, "{holder:#}");
    let cgroup = holder["cgroup"].as_str().expect("the raw cgroup is shown");
    assert!(cgroup.contains("a\u{fffd}\u{fffd}b/docker/"), "{cgroup:?}");
    let holder = holder_of(&status, escaping);
    assert!(holder["container"].is_null(), "{holder:#}");
    assert!(
        holder["cgroup"]
            .as_str()
            .unwrap_or_default()
            .contains("c\u{1b}[2Jd")
    );
    for args in [&["status"][..], &["status", "--tree"]] {
        let text = run(&host, args);
        assert!(!text.stdout.contains('\u{1b}'), "{}", text.stdout);
    }
    drop(incident);
}

#[test]
fn the_pid_a_container_sees_is_its_own_namespaces() {
    if !unshare_works() {
        return skip("unshare cannot make a PID namespace here (needs CAP_SYS_ADMIN)");
    }
    let Some(cgroups) = Cgroups::v2("test") else {
        return skip("no writable cgroup v2 mount");
    };
    let (host, mut incident) = Sim::gpus(2).stage();
    // PID 1 of its own namespace, as a container's first process is; its
    // host PID (from the host's /proc/self) is what it records.
    let script = "exec unshare --pid --fork bash -c 'read -r me _ < /proc/self/stat; \
                  exec 3<\"$D/nvidia0\"; echo \"$me ns-worker\" >> \"$D/pids\"; \
                  exec -a ns-worker sleep 100000'";
    incident
        .spawn(script, 1)
        .expect("a holder in its own PID namespace");
    let pid = incident.pid_of("ns-worker").expect("its PID");
    cgroups.move_in(format!("system.slice/docker-{DOCKER_SYSTEMD}.scope"), pid);
    let status = run(&host, &["status", "--json"]).json();
    let container = &holder_of(&status, pid)["container"];
    assert_eq!(container["id"], DOCKER_SYSTEMD, "{container:#}");
    assert_eq!(container["local_pid"], 1, "{container:#}");
    drop(incident);
}

#[test]
fn holders_that_exit_mid_scan_never_break_attribution() {
    let Some(cgroups) = Cgroups::v2("test") else {
        return skip("no writable cgroup v2 mount");
    };
    let (host, mut incident) = Sim::gpus(2).stage();
    // Every child of this loop holds GPU 0's node for the moment it lives:
    // holders that appear and exit while gpureap scans and reads their cgroups.
    let churn = "exec 3<\"$D/nvidia0\"; echo \"$BASHPID churner\" >> \"$D/pids\"; \
                 exec -a churner bash -c 'while :; do sleep 0.002 & sleep 0.003 & wait; done'";
    let pid = incident.spawn(churn, 1).expect("churner");
    cgroups.move_in(format!("docker/{DOCKER_CGROUPFS}"), pid);
    let mut seen_a_child = false;
    for _ in 0..40 {
        let status = run(&host, &["status", "--json"]);
        assert_eq!(status.code, 0, "{}", status.stderr);
        let status = status.json();
        for holder in status["holders"].as_array().expect("holders") {
            if holder["ppid"] == pid {
                seen_a_child = true;
                // A child read before it exited is its parent's container's.
                if !holder["container"].is_null() {
                    assert_eq!(holder["container"]["id"], DOCKER_CGROUPFS);
                }
            }
        }
        assert_eq!(holder_of(&status, pid)["container"]["id"], DOCKER_CGROUPFS);
    }
    // Not a condition of the test (a scheduler may starve the loop), but
    // said, so that a run that never raced is known.
    if !seen_a_child {
        eprintln!("no short-lived holder was caught mid-life in 40 scans");
    }
    drop(incident);
}

/// Whether this machine lets us make PID (and mount) namespaces.
pub fn unshare_works() -> bool {
    std::process::Command::new("unshare")
        .args(["--mount", "--pid", "--fork", "--mount-proc", "true"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// gpureap in a PID namespace of its own (`unshare --pid --mount-proc`), as
/// in a container without the host's PIDs; the simulated driver reads the
/// host's processes through `DIR/host-proc`, a bind mount of the host's
/// /proc made in a private mount namespace, as the real driver lists host
/// PIDs whatever namespace asks.
fn in_own_pid_namespace(host: &SimHost, args: &[&str]) -> Run {
    in_own_pid_namespace_after(host, None, args)
}

/// The same, with `first` run by the namespace's shell before gpureap
/// (`$0` is the simulated host's directory), to start processes there.
fn in_own_pid_namespace_after(host: &SimHost, first: Option<&str>, args: &[&str]) -> Run {
    let script = r#"dir=$1; shift; mount --bind /proc "$dir/host-proc" && exec unshare --pid --fork --mount-proc "$@""#;
    let inner = format!("{}; exec \"$@\"", first.unwrap_or(":"));
    let mut unshare = std::process::Command::new("unshare");
    unshare
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(host.path())
        .args(["sh", "-c", &inner])
        .arg(host.path())
        .arg(env!("CARGO_BIN_EXE_gpureap"));
    against(unshare, host)
        .args(args)
        .output()
        .expect("unshare runs")
        .into()
}

#[test]
fn in_a_container_without_host_pids_status_says_what_it_cannot_see() {
    if !unshare_works() {
        return skip("unshare cannot make PID and mount namespaces here (needs CAP_SYS_ADMIN)");
    }
    let host = Sim::gpus(2).build();
    std::fs::create_dir(host.path().join("host-proc")).expect("the mount point");
    let mut incident = Incident::new(&host);
    let server = incident.hold(Holder::new("vllm-worker").on(1, 12 * GIB));

    // From the host, the empty mount point changes nothing: the holder is seen.
    let outside = run(&host, &["status", "--json"]).json();
    assert!(
        !holder_of(&outside, server)["flags"]
            .to_string()
            .contains("hidden")
    );
    assert_eq!(outside["visibility"]["host_pids"], true, "{outside:#}");
    assert!(outside["visibility"]["note"].is_null());

    let status = in_own_pid_namespace(&host, &["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status = status.json();
    let visibility = &status["visibility"];
    assert_eq!(visibility["host_pids"], false, "{status:#}");
    assert_eq!(
        visibility["hidden"],
        serde_json::json!([server]),
        "{status:#}"
    );
    let note = visibility["note"].as_str().expect("a note");
    for said in [
        &format!("PID {server} (GPU 1, 12.0 GiB)"),
        "PID namespace of its own",
        "--pid=host",
        "hostPID: true",
    ] {
        assert!(note.contains(said), "{said:?} in {note}");
    }
    assert!(
        holder_of(&status, server)["flags"]
            .to_string()
            .contains("hidden")
    );

    let text = in_own_pid_namespace(&host, &["status"]);
    let flat = text.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("Hidden: no process here has PID"),
        "{}",
        text.stdout
    );
    assert!(flat.contains("docker run --pid=host"), "{}", text.stdout);
    // Only the GPUs asked about: the holder is on GPU 1.
    let other = in_own_pid_namespace(&host, &["status", "--gpu", "0"]);
    assert_eq!(other.code, 0, "{}", other.stderr);
    assert!(!other.stdout.contains("Hidden"), "{}", other.stdout);

    let check = in_own_pid_namespace(&host, &["check"]);
    let first = check.stdout.lines().next().unwrap_or_default();
    assert!(first.contains("holders hidden"), "{}", check.stdout);
    assert!(check.stdout.contains("hostPID: true"), "{}", check.stdout);
    drop(incident);
}

/// A driver that omits other PID namespaces' processes from its lists
/// (NVML 580, measured on an H200: docs/gpu-validation.md, "What the real
/// driver does"), staged with
/// `DIR/omit-other-namespaces`: from a PID namespace of its own, gpureap
/// sees the host's holder's memory used and no process listed for it. That
/// memory must not be called held by no process, nor lead to a reset:
/// status says processes unseen from here may hold it, `check` and `free`
/// cannot tell (3), and `reset` refuses (3) and leaves the holder alone.
#[test]
fn in_a_container_whose_driver_omits_host_pids_unexplained_memory_is_unseen_not_driver_held() {
    if !unshare_works() {
        return skip("unshare cannot make PID and mount namespaces here (needs CAP_SYS_ADMIN)");
    }
    let host = Sim::gpus(2).build();
    std::fs::create_dir(host.path().join("host-proc")).expect("the mount point");
    std::fs::write(host.path().join("omit-other-namespaces"), "").expect("the marker");
    let mut incident = Incident::new(&host);
    let server = incident.hold(Holder::new("vllm-worker").on(1, 12 * GIB));

    // From the host the marker changes nothing: the holder is listed.
    let outside = run(&host, &["status", "--json"]).json();
    assert_eq!(gpu_of(&outside, 1)["memory_unattributed"], 0, "{outside:#}");
    assert_eq!(gpu_of(&outside, 1)["held_by_no_process"], false);
    assert_eq!(holder_of(&outside, server)["pid"], server);

    // Whether that memory is held cannot be told from here: 3, as `check`
    // and `free` say for it below.
    let status = in_own_pid_namespace(&host, &["status", "--json"]);
    assert_eq!(status.code, 3, "{}", status.stderr);
    let status = status.json();
    let validator = crate::schema::schema();
    crate::schema::conforms(&validator, "status in a PID namespace of its own", &status);
    let gpu = gpu_of(&status, 1);
    assert_eq!(gpu["memory_unattributed"], 12 * GIB, "{status:#}");
    assert_eq!(gpu["held_by_no_process"], serde_json::Value::Null);
    assert_eq!(gpu["unattributed_kind"], "unseen");
    assert_eq!(status["visibility"]["host_pids"], false);
    assert_eq!(status["visibility"]["hidden"], serde_json::json!([]));
    let note = status["visibility"]["note"].as_str().expect("a note");
    for said in ["Unseen: GPU 1: 12.0 GiB", "--pid=host", "hostPID: true"] {
        assert!(note.contains(said), "{said:?} in {note}");
    }
    assert!(!note.contains("only a GPU reset"), "{note}");

    let text = in_own_pid_namespace(&host, &["status"]);
    assert_eq!(text.code, 3, "{}", text.stderr);
    // A scope without that GPU can tell.
    assert_eq!(
        in_own_pid_namespace(&host, &["status", "--gpu", "0"]).code,
        0
    );
    let flat = text.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("Unseen: GPU 1: 12.0 GiB"), "{}", text.stdout);
    assert!(
        flat.contains("No process seen from this PID namespace"),
        "{}",
        text.stdout
    );

    let exposition = in_own_pid_namespace(&host, &["status", "--prometheus"]);
    let found = crate::exporter::samples(&exposition.stdout);
    let on = [("gpu", "1")];
    let value = |name| crate::exporter::value(&found, name, &on);
    assert_eq!(
        value("gpureap_gpu_memory_unattributed_bytes"),
        Some((12 * GIB) as f64)
    );
    assert_eq!(
        value("gpureap_gpu_held_by_no_process"),
        None,
        "{}",
        exposition.stdout
    );

    let check = in_own_pid_namespace(&host, &["check"]);
    assert_eq!(check.code, 3, "{}", check.stdout);
    let first = check.stdout.lines().next().unwrap_or_default();
    assert!(
        first.contains("GPU 1: 12.0 GiB unexplained"),
        "{}",
        check.stdout
    );
    assert!(check.stdout.contains("hostPID: true"), "{}", check.stdout);
    assert!(
        !check.stdout.contains("held by no process"),
        "{}",
        check.stdout
    );
    assert!(
        !check.stdout.contains("reset or a reboot"),
        "{}",
        check.stdout
    );

    let free = in_own_pid_namespace(&host, &["free", "--gpu", "1", "--yes", "--json"]);
    assert_eq!(free.code, 3, "{}\n{}", free.stdout, free.stderr);
    let free = free.json();
    crate::schema::conforms(&validator, "free in a PID namespace of its own", &free);
    let reasons = free["gpus"][0]["reasons"].to_string();
    assert!(reasons.contains("\"unseen\""), "{free:#}");
    assert!(!reasons.contains("driver_held"), "{free:#}");

    let reset = in_own_pid_namespace(&host, &["reset", "--gpu", "1"]);
    assert_eq!(reset.code, 3, "{}\n{}", reset.stdout, reset.stderr);
    let said = format!("{}{}", reset.stdout, reset.stderr);
    assert!(said.contains("not reset"), "{said}");
    assert!(said.contains("PID namespace of its own"), "{said}");
    // The holder was neither signalled nor reset away.
    let after = run(&host, &["status", "--json"]).json();
    assert_eq!(holder_of(&after, server)["pid"], server, "{after:#}");
    assert_eq!(gpu_of(&after, 1)["memory_used"], 12 * GIB);
    assert_eq!(gpu_of(&after, 1)["unattributed_kind"], "bookkeeping");

    // A holder of gpureap's own namespace is listed, by its PID there: a
    // 1 GiB context on GPU 0 that explains all of GPU 0's use.
    let inside = in_own_pid_namespace_after(
        &host,
        // gpureap starts once the holder has the node open and runs sleep:
        // before, on a loaded machine, it could look first and see no holder.
        Some(
            r#"sleep 600 3<"$0/nvidia0" & p=$!; s=$(readlink -f "$(command -v sleep)"); for _ in $(seq 2000); do [ "$(readlink -f /proc/$p/exe)" = "$s" ] && [ -e /proc/$p/fd/3 ] && break; sleep 0.01; done; echo $p >&2"#,
        ),
        &["status", "--json", "--gpu", "0"],
    );
    assert_eq!(inside.code, 0, "{}", inside.stderr);
    let local: u32 = inside
        .stderr
        .lines()
        .next()
        .and_then(|line| line.trim().parse().ok())
        .expect("the local holder's PID");
    let inside = inside.json();
    assert_eq!(gpu_of(&inside, 0)["memory_used"], GIB, "{inside:#}");
    assert_eq!(gpu_of(&inside, 0)["memory_unattributed"], 0, "{inside:#}");
    let listed = holder_of(&inside, local);
    assert_eq!(listed["gpus"][0]["listed_by_driver"], true, "{inside:#}");
    assert!(
        !listed["flags"].to_string().contains("hidden"),
        "{inside:#}"
    );
    drop(incident);
}
