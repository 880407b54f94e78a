//! `free --container`, `--pod` and `--cgroup`: real processes moved into
//! real cgroup v2 directories laid out as docker, containerd/CRI and the
//! kubelet lay them out (under a root of this test's own in the v2 mount),
//! holding simulated GPUs. A scope takes its container's (pod's, cgroup's)
//! processes and nothing else: a neighbour container's holder survives;
//! `--dry-run` signals nothing; a value that names nothing, or two things,
//! exits 2 with nothing signalled. `-H` is in tests/fleet.rs.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use gpureap_core::driver::sim::incident::{Holder, Incident};
use serde_json::Value;

use crate::harness::*;

/// Starts a holder (or a plain process, with no GPUs) inside a cgroup;
/// it is in there before it is recorded.
pub fn hold_in(incident: &mut Incident, root: &Cgroups, cgroup: &str, holder: &Holder) -> u32 {
    let script = format!("{}{}", root.enter(cgroup), holder.script());
    incident.spawn(&script, 1).expect("holder starts");
    incident.pid_of(&holder.title).expect("holder recorded")
}

/// A 64-hex container id of this test process's own: its PID in hex, then
/// `tag` (4 hex digits), so that the first 12 digits name it alone, even
/// beside other tests' containers; then `fill`.
fn container_id(tag: &str, fill: char) -> String {
    let mut id = format!("{:08x}{tag}", std::process::id());
    while id.len() < 64 {
        id.push(fill);
    }
    id
}

/// A pod UID of this test process's own.
fn pod_uid(tag: &str) -> String {
    format!("{:08x}-{tag}-4000-8000-000000000000", std::process::id())
}

/// A process with no GPU node open, recorded under its title.
fn plain(incident: &mut Incident, root: &Cgroups, cgroup: &str, title: &str) -> u32 {
    let script = format!(
        "{}echo \"$BASHPID {title}\" >> \"$D/pids\"; exec -a '{title}' sleep 100000",
        root.enter(cgroup)
    );
    incident.spawn(&script, 1).expect("process starts");
    incident.pid_of(title).expect("process recorded")
}

fn targets(report: &Value) -> Vec<(u32, String)> {
    let mut found: Vec<(u32, String)> = report["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .map(|target| {
            (
                target["pid"].as_u64().expect("pid") as u32,
                target["because"].as_str().expect("because").to_string(),
            )
        })
        .collect();
    found.sort();
    found
}

fn sorted(mut pids: Vec<(u32, &str)>) -> Vec<(u32, String)> {
    pids.sort();
    pids.into_iter()
        .map(|(pid, because)| (pid, because.to_string()))
        .collect()
}

/// Two docker containers (systemd driver layout) on GPU 0, and a holder in
/// no container.
struct Docker {
    a: String,
    b: String,
    a_holder: u32,
    a_idle: u32,
    a_monitor: u32,
    b_holder: u32,
    outside: u32,
}

/// `tag` is 3 hex digits; the two ids differ in the 12th.
fn two_containers(incident: &mut Incident, root: &Cgroups, tag: &str) -> Docker {
    let a = container_id(&format!("{tag}7"), 'a');
    let b = container_id(&format!("{tag}8"), 'b');
    let a_cgroup = root.make(format!("system.slice/docker-{a}.scope"));
    let b_cgroup = root.make(format!("system.slice/docker-{b}.scope"));
    Docker {
        a_holder: hold_in(
            incident,
            root,
            &a_cgroup,
            &Holder::new("python3 -m vllm.entrypoints.openai.api_server").on(0, 20 * GIB),
        ),
        a_idle: plain(incident, root, &a_cgroup, "tini -- serve"),
        // Nodes open, no context: a monitor, which a container scope spares.
        a_monitor: hold_in(incident, root, &a_cgroup, &Holder::new("dcgm-exporter")),
        b_holder: hold_in(
            incident,
            root,
            &b_cgroup,
            &Holder::new("python3 neighbour.py").on(0, 10 * GIB),
        ),
        outside: incident.hold(Holder::new("python3 outside.py").on(1, 5 * GIB)),
        a,
        b,
    }
}

#[test]
fn free_container_takes_that_container_s_processes_and_spares_its_neighbour() {
    let Some(root) = Cgroups::v2("scopes") else {
        return skip("cannot make a cgroup under the cgroup v2 mount (needs root or delegation)");
    };
    let (host, mut incident) = Sim::gpus(2).named("NVIDIA H100 80GB HBM3").stage();
    let docker = two_containers(&mut incident, &root, "a01");
    let prefix = &docker.a[..12];

    // --dry-run: the plan names the container's processes, and signals nothing.
    let plan = run(
        &host,
        &["free", "--container", prefix, "--dry-run", "--json"],
    );
    assert_eq!(plan.code, 0, "{}{}", plan.stdout, plan.stderr);
    let plan = plan.json();
    let schema = crate::schema::schema();
    crate::schema::conforms(&schema, "free --container --dry-run", &plan);
    assert_eq!(
        targets(&plan),
        sorted(vec![(docker.a_holder, "member"), (docker.a_idle, "member")]),
        "{plan:#}"
    );
    assert_eq!(
        spared(&plan, docker.a_monitor).as_deref(),
        Some("protected")
    );
    // A member that holds no GPU is shown by its command line too.
    assert_eq!(
        target(&plan, docker.a_idle).map(|idle| idle["cmdline"].clone()),
        Some("tini -- serve 100000".into()),
        "{plan:#}"
    );
    let scope = &plan["cgroup_scopes"][0];
    assert_eq!(scope["kind"], "container");
    assert_eq!(scope["given"], prefix);
    assert_eq!(scope["runtime"], "docker");
    assert_eq!(scope["id"], docker.a.as_str());
    assert_eq!(scope["members"].as_array().map(Vec::len), Some(3));
    for pid in [
        docker.a_holder,
        docker.a_idle,
        docker.a_monitor,
        docker.b_holder,
    ] {
        assert!(alive(pid), "a dry run signalled {pid}");
    }
    let text = run(&host, &["free", "--container", prefix, "--dry-run"]);
    assert_contains(
        &text.stdout,
        &format!(
            "--container {prefix}: docker container {prefix}, 3 process(es) in {}/system.slice/docker-{}.scope",
            root.path, docker.a
        ),
    );

    // The free: the container's two, verified on GPU 0, where the neighbour's
    // memory is what is left.
    let free = run(
        &host,
        &[
            "free",
            "--container",
            prefix,
            "--grace",
            "0",
            "--yes",
            "--json",
        ],
    );
    let report = free.json();
    assert_eq!(free.code, 0, "{report:#}\n{}", free.stderr);
    crate::schema::conforms(&schema, "free --container", &report);
    assert_eq!(
        targets(&report),
        sorted(vec![(docker.a_holder, "member"), (docker.a_idle, "member")])
    );
    assert_eq!(gpu(&report, 0)["freed"], true, "{report:#}");
    assert!(!alive(docker.a_holder) && !alive(docker.a_idle));
    for pid in [docker.a_monitor, docker.b_holder, docker.outside] {
        assert!(alive(pid), "{pid} was out of scope: {report:#}");
    }

    // By full id, narrowed by --gpu: the neighbour's holder on GPU 0 only.
    let narrowed = run(
        &host,
        &[
            "free",
            "--container",
            &docker.b,
            "--gpu",
            "1",
            "--dry-run",
            "--json",
        ],
    );
    assert_eq!(narrowed.code, 0, "{}", narrowed.stderr);
    assert_eq!(targets(&narrowed.json()), []);
}

#[test]
fn an_unknown_or_ambiguous_container_is_bad_input_and_nothing_is_signalled() {
    let Some(root) = Cgroups::v2("scopes") else {
        return skip("cannot make a cgroup under the cgroup v2 mount (needs root or delegation)");
    };
    let (host, mut incident) = Sim::gpus(2).named("NVIDIA H100 80GB HBM3").stage();
    let docker = two_containers(&mut incident, &root, "b01");
    let everyone = [
        docker.a_holder,
        docker.a_idle,
        docker.b_holder,
        docker.outside,
    ];

    // Both ids share 11 digits: too few to be an id, and as a name nothing
    // has them.
    let short = run(&host, &["free", "--container", &docker.a[..11], "--yes"]);
    assert_eq!(short.code, 2, "{}", short.stderr);
    assert_contains(&short.stderr, "at least 12 hex digits");
    // A 12-digit prefix both share cannot exist (they differ at the 12th),
    // so an ambiguous one needs a third container.
    let c = container_id("b017", 'c');
    let c_cgroup = root.make(format!("system.slice/docker-{c}.scope"));
    let c_holder = hold_in(
        &mut incident,
        &root,
        &c_cgroup,
        &Holder::new("python3 third.py").on(1, GIB),
    );
    let ambiguous = run(
        &host,
        &["free", "--container", &docker.a[..12], "--yes", "--json"],
    );
    assert_eq!(ambiguous.code, 2, "{}", ambiguous.stderr);
    assert_contains(&ambiguous.stderr, "ambiguous");
    assert!(ambiguous.stderr.contains(&docker.a) && ambiguous.stderr.contains(&c));
    let unknown = run(
        &host,
        &["free", "--container", &container_id("b019", '1'), "--yes"],
    );
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    assert_contains(&unknown.stderr, "no process is in a container");
    let named = run(&host, &["free", "--container", "no-such-name", "--yes"]);
    assert_eq!(named.code, 2, "{}", named.stderr);
    for bad in [
        vec!["--container", ""],
        vec!["--container", &"f".repeat(65)],
        vec!["--pod", "not-a-uid"],
        vec!["--pod", "ns/"],
        vec!["--pod", &pod_uid("b019")],
        vec!["--cgroup", "relative/path"],
        vec!["--cgroup", "/"],
        vec!["--cgroup", "/a/../b"],
        vec!["--cgroup", "/no-such-cgroup/anywhere"],
        vec!["--cgroup", &root.mount.display().to_string()],
        vec!["--container", &docker.a, "--all"],
    ] {
        let mut args = vec!["free", "--yes"];
        args.extend(bad.iter().copied());
        let refused = run(&host, &args);
        assert_eq!(
            refused.code, 2,
            "{bad:?}: {}{}",
            refused.stdout, refused.stderr
        );
    }
    for pid in everyone.into_iter().chain([c_holder]) {
        assert!(alive(pid), "bad input signalled {pid}");
    }
}

/// A kubepods layout (systemd driver, burstable QoS, the UID's `_`
/// spelling): a pod of two containers, one on GPU 0, and a neighbour pod.
struct Pods {
    uid: String,
    worker: u32,
    sidecar: u32,
    neighbour: u32,
}

fn two_pods(incident: &mut Incident, root: &Cgroups) -> Pods {
    let uid = pod_uid("c001");
    let other = &pod_uid("c002");
    let slice = |uid: &str| {
        format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        )
    };
    let worker_cgroup = root.make(format!(
        "{}/cri-containerd-{}.scope",
        slice(&uid),
        container_id("c001", 'a')
    ));
    let sidecar_cgroup = root.make(format!(
        "{}/cri-containerd-{}.scope",
        slice(&uid),
        container_id("c002", 'b')
    ));
    let neighbour_cgroup = root.make(format!(
        "{}/cri-containerd-{}.scope",
        slice(other),
        container_id("c003", 'c')
    ));
    Pods {
        worker: hold_in(
            incident,
            root,
            &worker_cgroup,
            &Holder::new("python3 -m sglang.launch_server").on(0, 30 * GIB),
        ),
        sidecar: plain(
            incident,
            root,
            &sidecar_cgroup,
            "envoy --config sidecar.yaml",
        ),
        neighbour: hold_in(
            incident,
            root,
            &neighbour_cgroup,
            &Holder::new("python3 neighbour_pod.py").on(0, 8 * GIB),
        ),
        uid,
    }
}

#[test]
fn free_pod_by_uid_takes_every_container_of_the_pod_and_no_other_pod() {
    let Some(root) = Cgroups::v2("scopes") else {
        return skip("cannot make a cgroup under the cgroup v2 mount (needs root or delegation)");
    };
    let (host, mut incident) = Sim::gpus(1).named("NVIDIA H100 80GB HBM3").stage();
    let pods = two_pods(&mut incident, &root);

    // Either spelling of the UID; the plan first.
    let underscored = pods.uid.replace('-', "_").to_uppercase();
    let plan = run(
        &host,
        &["free", "--pod", &underscored, "--dry-run", "--json"],
    );
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    let plan = plan.json();
    assert_eq!(
        targets(&plan),
        sorted(vec![(pods.worker, "member"), (pods.sidecar, "member")])
    );
    assert_eq!(plan["cgroup_scopes"][0]["pod_uid"], pods.uid.as_str());
    assert_eq!(
        plan["cgroup_scopes"][0]["cgroups"].as_array().map(Vec::len),
        Some(2)
    );
    assert!(alive(pods.worker) && alive(pods.sidecar));

    let free = run(
        &host,
        &[
            "free", "--pod", &pods.uid, "--grace", "0", "--yes", "--json",
        ],
    );
    let report = free.json();
    assert_eq!(free.code, 0, "{report:#}\n{}", free.stderr);
    assert_eq!(
        targets(&report),
        sorted(vec![(pods.worker, "member"), (pods.sidecar, "member")])
    );
    assert_eq!(gpu(&report, 0)["freed"], true, "{report:#}");
    assert!(!alive(pods.worker) && !alive(pods.sidecar));
    assert!(alive(pods.neighbour), "the neighbour pod was out of scope");
}

#[test]
fn free_cgroup_takes_the_cgroup_and_below_by_either_spelling_never_a_sibling() {
    let Some(root) = Cgroups::v2("scopes") else {
        return skip("cannot make a cgroup under the cgroup v2 mount (needs root or delegation)");
    };
    let (host, mut incident) = Sim::gpus(1).named("NVIDIA H100 80GB HBM3").stage();
    let job = root.make("jobs/a");
    let below = root.make("jobs/a/ranks");
    let sibling = root.make("jobs/ab");
    let empty = root.make("jobs/empty");
    let top = hold_in(
        &mut incident,
        &root,
        &job,
        &Holder::new("torchrun").on(0, GIB),
    );
    let rank = hold_in(
        &mut incident,
        &root,
        &below,
        &Holder::new("rank0").on(0, GIB),
    );
    let other = hold_in(
        &mut incident,
        &root,
        &sibling,
        &Holder::new("other").on(0, GIB),
    );

    let as_proc_spells_it = run(&host, &["free", "--cgroup", &job, "--dry-run", "--json"]);
    assert_eq!(as_proc_spells_it.code, 0, "{}", as_proc_spells_it.stderr);
    let expected = sorted(vec![(top, "member"), (rank, "member")]);
    assert_eq!(targets(&as_proc_spells_it.json()), expected);
    let directory = root.dir(&job).display().to_string();
    let free = run(
        &host,
        &[
            "free",
            "--cgroup",
            &format!("{directory}/"),
            "--grace",
            "0",
            "--yes",
            "--json",
        ],
    );
    let report = free.json();
    assert_eq!(free.code, 0, "{report:#}\n{}", free.stderr);
    assert_eq!(targets(&report), expected);
    assert!(!alive(top) && !alive(rank));
    assert!(
        alive(other),
        "a sibling whose name starts the same is another cgroup"
    );

    // A cgroup that holds no process: nothing to free, and it says so.
    let nothing = run(&host, &["free", "--cgroup", &empty, "--yes", "--json"]);
    assert_eq!(nothing.code, 0, "{}", nothing.stderr);
    let nothing = nothing.json();
    crate::schema::conforms(&crate::schema::schema(), "free --cgroup (empty)", &nothing);
    assert_eq!(targets(&nothing), []);
    let note = nothing["cgroup_scopes"][0]["note"]
        .as_str()
        .unwrap_or_default();
    assert!(note.contains("holds no process"), "{nothing:#}");
    assert!(alive(other));
}

/// Alive (not a zombie) on a lab host, as that host's /proc says.
fn alive_on(lab: &crate::sshd_lab::Lab, host: &str, pid: u32) -> bool {
    let state = lab.on(host, &format!("cut -d' ' -f3 /proc/{pid}/stat 2>/dev/null"));
    !state.stdout.trim().is_empty() && state.stdout.trim() != "Z"
}

#[test]
fn free_h_resolves_the_container_on_each_host_and_takes_only_its_processes() {
    use crate::sshd_lab::{Kind, Lab, host_entry};
    let Some(root) = Cgroups::v2("scopes-fleet") else {
        return skip("cannot make a cgroup under the cgroup v2 mount (needs root or delegation)");
    };
    let lab = Lab::new(&[Kind::Up, Kind::Up]);
    let a = container_id("d017", 'a');
    let b = container_id("d018", 'b');
    let a_cgroup = root.make(format!("system.slice/docker-{a}.scope"));
    let b_cgroup = root.make(format!("system.slice/docker-{b}.scope"));
    // `ip netns exec` gives each host a /sys of its own, without the cgroup
    // mounts: the host mounts cgroup v2 (the same hierarchy) in its private
    // /var/lib, and its processes enter their cgroups through it.
    let mounted = lab.on(
        "h1",
        "mkdir -p /var/lib/cgroup && mount -t cgroup2 none /var/lib/cgroup",
    );
    assert_eq!(mounted.code, 0, "{}", mounted.stderr);
    let in_cgroup = |host: &str, cgroup: &str, holder: &Holder| {
        let procs = format!("/var/lib/cgroup{cgroup}/cgroup.procs");
        let script = format!("echo $$ > {procs} && {}", holder.script());
        lab.hold_script(host, &holder.title, &script)
    };
    let a_holder = in_cgroup(
        "h1",
        &a_cgroup,
        &Holder::new("python3 a.py").on(0, 20 * GIB),
    );
    let b_holder = in_cgroup(
        "h1",
        &b_cgroup,
        &Holder::new("python3 b.py").on(0, 10 * GIB),
    );
    let h2_holder = lab.hold("h2", &Holder::new("python3 h2.py").on(0, 10 * GIB));
    let prefix = &a[..12];

    // The plan on both hosts: h1 finds the container; on h2 it names
    // nothing, which is bad input there (2), and nothing is signalled.
    let plan = lab.run(&[
        "free",
        "-H",
        "h1,h2",
        "--container",
        prefix,
        "--dry-run",
        "--json",
    ]);
    let document = plan.json();
    let h1 = host_entry(&document, "h1");
    assert_eq!(h1["exit_code"], 0, "{document:#}");
    assert_eq!(targets(&h1["report"]), sorted(vec![(a_holder, "member")]));
    assert_eq!(h1["report"]["cgroup_scopes"][0]["id"], a.as_str());
    assert_eq!(host_entry(&document, "h2")["exit_code"], 2, "{document:#}");
    assert!(alive_on(&lab, "h1", a_holder) && alive_on(&lab, "h2", h2_holder));
    // The text plan says what the value found on each host.
    let text = lab.run(&["free", "-H", "h1", "--container", prefix, "--dry-run"]);
    assert_eq!(text.code, 0, "{}", text.stderr);
    assert_contains(
        &text.stdout,
        &format!("h1: --container {prefix}: 1 process(es)"),
    );

    let free = lab.run(&[
        "free",
        "-H",
        "h1",
        "--container",
        prefix,
        "--grace",
        "0",
        "--yes",
        "--json",
    ]);
    let document = free.json();
    assert_eq!(free.code, 0, "{document:#}\n{}", free.stderr);
    let h1 = &host_entry(&document, "h1")["report"];
    assert_eq!(targets(h1), sorted(vec![(a_holder, "member")]));
    assert_eq!(gpu(h1, 0)["freed"], true, "{document:#}");
    assert!(!alive_on(&lab, "h1", a_holder));
    assert!(
        alive_on(&lab, "h1", b_holder),
        "the neighbour container was out of scope"
    );
    assert!(alive_on(&lab, "h2", h2_holder));
}

#[test]
fn names_and_empty_containers_and_pods_come_from_the_nodes_sources() {
    let Some(root) = Cgroups::v2("scopes") else {
        return skip("cannot make a cgroup under the cgroup v2 mount (needs root or delegation)");
    };
    let (host, mut incident) = Sim::gpus(2).named("NVIDIA H100 80GB HBM3").stage();
    let docker = two_containers(&mut incident, &root, "e01");
    let pods = {
        let uid = pod_uid("e002");
        let cgroup = root.make(format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{}.scope",
            uid.replace('-', "_"),
            container_id("e002", 'd')
        ));
        let worker = hold_in(
            &mut incident,
            &root,
            &cgroup,
            &Holder::new("python3 -m sglang.launch_server --tp 1").on(1, 12 * GIB),
        );
        (uid, worker)
    };
    // The node's state, staged: docker knows A by name and a stopped
    // container with nothing in it; /var/log/pods names the pod, and one
    // more pod with nothing in it.
    let node = tempfile::Builder::new()
        .prefix("gpureap-node-")
        .tempdir()
        .expect("node root");
    let stopped = container_id("e01f", 'f');
    for (id, name) in [(&docker.a, "vllm-llama"), (&stopped, "stopped")] {
        let folder = node.path().join("var/lib/docker/containers").join(id);
        fs::create_dir_all(&folder).expect("docker folder");
        fs::write(
            folder.join("config.v2.json"),
            format!("{{\"ID\": \"{id}\", \"Name\": \"/{name}\"}}"),
        )
        .expect("config.v2.json");
    }
    let empty_pod = pod_uid("e003");
    for (uid, pod) in [(&pods.0, "llama-0"), (&empty_pod, "idle-0")] {
        fs::create_dir_all(
            node.path()
                .join(format!("var/log/pods/ml_{pod}_{uid}/server")),
        )
        .expect("pod log folder");
    }
    let host_root = node.path().display().to_string();
    let with_root = |args: &[&str]| {
        let mut all = vec!["free", "--host-root", host_root.as_str()];
        all.extend(args);
        run(&host, &all)
    };

    // A docker name, a pod's NAMESPACE/NAME: the plan, then the free.
    let by_name = with_root(&["--container", "vllm-llama", "--dry-run", "--json"]);
    assert_eq!(by_name.code, 0, "{}", by_name.stderr);
    let plan = by_name.json();
    assert_eq!(
        targets(&plan),
        sorted(vec![(docker.a_holder, "member"), (docker.a_idle, "member")]),
        "{plan:#}"
    );
    assert_eq!(plan["cgroup_scopes"][0]["id"], docker.a.as_str());
    let by_pod = with_root(&["--pod", "ml/llama-0", "--grace", "0", "--yes", "--json"]);
    let report = by_pod.json();
    assert_eq!(by_pod.code, 0, "{report:#}\n{}", by_pod.stderr);
    assert_eq!(targets(&report), sorted(vec![(pods.1, "member")]));
    assert_eq!(report["cgroup_scopes"][0]["pod_uid"], pods.0.as_str());
    assert!(!alive(pods.1));

    // Known to a source, nothing in it: nothing to free, exit 0.
    for (args, what) in [
        (vec!["--container", stopped.as_str()], "container"),
        (vec!["--pod", empty_pod.as_str()], "pod"),
    ] {
        let mut args = args.clone();
        args.extend(["--yes", "--json"]);
        let nothing = with_root(&args);
        assert_eq!(nothing.code, 0, "{args:?}: {}", nothing.stderr);
        let nothing = nothing.json();
        assert_eq!(targets(&nothing), []);
        let note = nothing["cgroup_scopes"][0]["note"]
            .as_str()
            .unwrap_or_default();
        assert!(note.contains("holds no process"), "{what}: {nothing:#}");
    }
    // A name no source has, and the same stopped container without the
    // node's state: unknown, exit 2.
    let unknown = with_root(&["--pod", "ml/llama-9", "--yes"]);
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    assert_contains(&unknown.stderr, "no pod has that name");
    let unknown = run(&host, &["free", "--container", &stopped, "--yes"]);
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    for pid in [
        docker.a_holder,
        docker.a_idle,
        docker.b_holder,
        docker.outside,
    ] {
        assert!(alive(pid), "{pid} was out of every scope that freed");
    }
}

#[test]
fn hostile_cgroup_names_are_escaped_and_a_non_utf8_one_keeps_its_process_a_member() {
    let Some(root) = Cgroups::v2("scopes") else {
        return skip("cannot make a cgroup under the cgroup v2 mount (needs root or delegation)");
    };
    let (host, mut incident) = Sim::gpus(1).named("NVIDIA H100 80GB HBM3").stage();
    // A cgroup name with an escape sequence and a carriage return (this
    // kernel refuses a newline in a cgroup name: EINVAL).
    let evil = root.make("jobs/x\u{1b}[31m\r0::/FORGED");
    let holder = hold_in(&mut incident, &root, &evil, &Holder::new("evil").on(0, GIB));
    let jobs = format!("{}/jobs", root.path);
    let plan = run(&host, &["free", "--cgroup", &jobs, "--dry-run"]);
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    assert_no_forged_lines("free --cgroup --dry-run", &plan.stdout, &["0::", "FORGED"]);
    assert!(plan.stdout.contains(&holder.to_string()), "{}", plan.stdout);
    // A cgroup whose name is not UTF-8: its process is still in /jobs.
    let bytes = root
        .dir(&jobs)
        .join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    fs::create_dir(&bytes).expect("a cgroup named with a Latin-1 byte");
    let latin = plain_in(&mut incident, &bytes, "latin1 holder");
    let json = run(&host, &["free", "--cgroup", &jobs, "--dry-run", "--json"]);
    assert!(
        !json.stdout.contains('\u{1b}'),
        "raw escape in JSON: {}",
        json.stdout
    );
    assert_eq!(
        targets(&json.json()),
        sorted(vec![(holder, "member"), (latin, "member")])
    );
    assert!(alive(holder) && alive(latin));
}

/// A process with no GPU node open, started in the cgroup directory `dir`
/// (any bytes in its name).
fn plain_in(incident: &mut Incident, dir: &Path, title: &str) -> u32 {
    let procs = dir.join("cgroup.procs");
    let script = format!(
        "echo $$ > {}; echo \"$BASHPID {title}\" >> \"$D/pids\"; exec -a '{title}' sleep 100000",
        ansi_c(procs.as_os_str().as_bytes())
    );
    incident.spawn(&script, 1).expect("process starts");
    incident.pid_of(title).expect("process recorded")
}

#[test]
fn a_v1_hierarchy_s_lines_count_and_a_path_under_its_mount_is_that_hierarchy_s() {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let pids = gpureap_core::members::parse_mounts(&mountinfo)
        .into_iter()
        .find(|mount| {
            mount
                .controllers
                .as_ref()
                .is_some_and(|controllers| controllers.contains("pids"))
        });
    let Some(root) = pids.and_then(|mount| Cgroups::under(mount.point, "scopes-v1")) else {
        return skip("no writable cgroup v1 pids hierarchy here (a pure cgroup v2 host)");
    };
    let (host, mut incident) = Sim::gpus(1).named("NVIDIA H100 80GB HBM3").stage();
    // docker's cgroupfs layout, in the v1 pids hierarchy only.
    let id = container_id("f001", 'e');
    let cgroup = root.make(format!("docker/{id}"));
    let holder = hold_in(
        &mut incident,
        &root,
        &cgroup,
        &Holder::new("v1 holder").on(0, GIB),
    );

    let by_id = run(
        &host,
        &["free", "--container", &id[..12], "--dry-run", "--json"],
    );
    assert_eq!(by_id.code, 0, "{}", by_id.stderr);
    let by_id = by_id.json();
    assert_eq!(targets(&by_id), sorted(vec![(holder, "member")]));
    assert_eq!(by_id["cgroup_scopes"][0]["cgroups"][0], cgroup.as_str());
    let under_mount = root.dir(&format!("{}/docker", root.path));
    let by_dir = run(
        &host,
        &[
            "free",
            "--cgroup",
            &under_mount.display().to_string(),
            "--dry-run",
            "--json",
        ],
    );
    assert_eq!(by_dir.code, 0, "{}", by_dir.stderr);
    assert_eq!(targets(&by_dir.json()), sorted(vec![(holder, "member")]));
    // The same path under the v2 mount is another hierarchy, where it does not exist.
    let v2 = gpureap_services::supervision::cgroup2_mount().expect("v2 mount");
    let elsewhere = v2.join(format!("{}/docker", root.path.trim_start_matches('/')));
    let refused = run(
        &host,
        &[
            "free",
            "--cgroup",
            &elsewhere.display().to_string(),
            "--yes",
        ],
    );
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(alive(holder));
    // Spelled as /proc/PID/cgroup spells it: every hierarchy's lines count.
    let free = run(
        &host,
        &[
            "free",
            "--cgroup",
            &format!("{}/docker", root.path),
            "--grace",
            "0",
            "--yes",
            "--json",
        ],
    );
    let report = free.json();
    assert_eq!(free.code, 0, "{report:#}\n{}", free.stderr);
    assert_eq!(targets(&report), sorted(vec![(holder, "member")]));
    assert!(!alive(holder));
}

#[test]
fn free_container_ends_a_real_crun_container_and_only_it() {
    if let Some(why) = Crun::unavailable() {
        return skip(why);
    }
    let Some(root) = Cgroups::v2("scopes-crun") else {
        return skip("cannot make a cgroup under the cgroup v2 mount (needs root or delegation)");
    };
    let (host, mut incident) = Sim::gpus(1).named("NVIDIA H100 80GB HBM3").stage();
    let id = container_id("f0c0", '7');
    let neighbour_id = container_id("f0c1", '8');
    let container = Crun::start(&id, host.path());
    // crun's cgroup manager is off: the container is moved into the cgroup
    // docker's systemd driver would have made for it.
    let cgroup = root.make(format!("system.slice/docker-{id}.scope"));
    fs::write(
        root.dir(&cgroup).join("cgroup.procs"),
        container.pid.to_string(),
    )
    .expect("moved in");
    let neighbour_cgroup = root.make(format!("system.slice/docker-{neighbour_id}.scope"));
    let neighbour = hold_in(
        &mut incident,
        &root,
        &neighbour_cgroup,
        &Holder::new("python3 neighbour.py").on(0, GIB),
    );

    let free = run(
        &host,
        &[
            "free",
            "--container",
            &id[..12],
            "--grace",
            "0",
            "--timeout",
            "5s",
            "--yes",
            "--json",
        ],
    );
    let report = free.json();
    assert_eq!(free.code, 0, "{report:#}\n{}", free.stderr);
    assert_eq!(targets(&report), sorted(vec![(container.pid, "member")]));
    assert_eq!(gpu(&report, 0)["freed"], true, "{report:#}");
    assert!(!alive(container.pid), "the container's init survived");
    assert!(alive(neighbour), "the neighbour container was out of scope");
}
