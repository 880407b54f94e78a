//! Which container, and which Kubernetes pod, a process runs in: read from
//! its cgroup path, the one record of it every runtime leaves in the kernel.
//!
//! Every runtime names the cgroup it makes after the container's id, in a
//! few spellings (cgroup v2 and v1 alike): docker's `/docker/<id>`
//! (cgroupfs driver) and `docker-<id>.scope` (systemd driver); podman's
//! `libpod-<id>.scope` (also with a `/container` child when the container
//! has its own cgroup namespace), `/libpod_parent/libpod-<id>`, and the same
//! under `user@UID.service` when rootless; containerd's
//! `cri-containerd-<id>.scope` and nerdctl's `nerdctl-<id>.scope`; cri-o's
//! `crio-<id>.scope`. A kubelet puts each pod's containers under the pod's
//! cgroup, whose name holds the pod's UID: `kubepods-<class>-pod<uid>.slice`
//! with underscores for dashes (systemd driver), `pod<uid>` with dashes
//! (cgroupfs driver, where the container's cgroup is its bare id and the
//! runtime is not told: `Runtime::Kubernetes`).
//!
//! A path is read by components, never anchored: it may sit under a prefix
//! (a test's root, a cgroup namespace's view, `/docker/<node>` for a
//! Kubernetes node that is itself a container). The deepest component that
//! names a container wins, since that is the one the process is in; a pod
//! UID counts when a pod component comes before it. The monitors podman and
//! cri-o run beside each container (`libpod-conmon-<id>.scope`,
//! `crio-conmon-<id>.scope`) are not containers: their processes hold no GPU
//! of the container's, and freeing them would not free it.
//!
//! Names, namespaces, and whether the container still exists come from the
//! node's own sources, afterwards; this module gives what the kernel says.

use std::collections::BTreeSet;
use std::fs;
use std::sync::OnceLock;

/// Which runtime the cgroup path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Runtime {
    Docker,
    Containerd,
    CriO,
    Podman,
    /// A kubepods path whose runtime the path does not tell (cgroupfs
    /// driver, a bare id under the pod's cgroup).
    Kubernetes,
}

impl Runtime {
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Docker => "docker",
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Podman => "podman",
            Runtime::Kubernetes => "kubernetes",
        }
    }
}

/// What a holder's container is: from its cgroup path, then named and
/// judged by the node's sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub runtime: Runtime,
    /// The runtime's full id as the path spells it (64 lowercase hex).
    pub id: String,
    /// Pod UID, canonical: lowercase, dashed (kubepods `_` spellings turned to `-`).
    pub pod_uid: Option<String>,
    /// The PID as the container sees it: the last `NSpid:` entry of
    /// /proc/PID/status when there is more than one; None otherwise or
    /// unreadable.
    pub local_pid: Option<u32>,
    /// Pod name, from the node's sources; None until they answer.
    pub pod: Option<String>,
    /// Pod namespace, from the node's sources; None until they answer.
    pub namespace: Option<String>,
    /// Container name (docker/podman name, or the Kubernetes container name).
    pub name: Option<String>,
    pub presence: Presence,
    /// GPUs (indexes) this holder uses that its pod was never allocated
    /// (kubelet pod-resources).
    pub unrequested_gpus: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Presence {
    /// No source could tell (none readable, or none knows this runtime).
    #[default]
    Unknown,
    Present,
    /// A source that would list it does not: `source` names it ("kubelet
    /// pod-resources", "/var/lib/docker/containers", "containerd state").
    Gone {
        source: String,
    },
}

impl Container {
    /// A container as its cgroup path names it, nothing known yet of its name.
    pub fn new(runtime: Runtime, id: String, pod_uid: Option<String>) -> Container {
        Container {
            runtime,
            id,
            pod_uid,
            local_pid: None,
            pod: None,
            namespace: None,
            name: None,
            presence: Presence::Unknown,
            unrequested_gpus: Vec::new(),
        }
    }
}

/// The container `pid` runs in, from its /proc/PID/cgroup (`cgroup_file`,
/// already read by the caller) and /proc/PID/status (`NSpid`). None when no
/// line names a container, or when the file is not one the kernel could
/// have written (see `from_cgroup_file`).
pub(crate) fn of_process(pid: u32, cgroup_file: &str) -> Option<Container> {
    let (runtime, id, pod_uid) = from_cgroup_file(cgroup_file, hierarchies())?;
    let mut container = Container::new(runtime, id, pod_uid);
    container.local_pid = fs::read(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| local_pid(&status));
    Some(container)
}

/// The hierarchy ids this host has, as /proc/self/cgroup lists them (the
/// same for every process): read once.
fn hierarchies() -> Option<&'static BTreeSet<u32>> {
    static IDS: OnceLock<Option<BTreeSet<u32>>> = OnceLock::new();
    IDS.get_or_init(|| {
        let text = crate::proc::cgroup_file(std::process::id())?;
        let ids: BTreeSet<u32> = lines(&text)?.into_iter().map(|(id, _)| id).collect();
        Some(ids)
    })
    .as_ref()
}

/// Each line of a /proc/PID/cgroup (`ID:CONTROLLERS:PATH`, cgroups(7)) as
/// its hierarchy id and path; None when a line is not of that form or an id
/// comes twice. The kernel writes a cgroup's path as it is; it refuses
/// a newline in a cgroup's name (mkdir gives EINVAL, tried on this
/// project's machine), but should a kernel allow one, a cgroup `x\n0::`
/// with `docker/<id>` below it would add a line claiming a container: it
/// would show as a second line of its hierarchy, and is refused.
fn lines(text: &str) -> Option<Vec<(u32, &str)>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for line in text.lines().filter(|line| !line.is_empty()) {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let id: u32 = id.parse().ok()?;
        if !path.starts_with('/') || !seen.insert(id) {
            return None;
        }
        out.push((id, path));
    }
    Some(out)
}

/// The container a whole /proc/PID/cgroup names: the first line, in the
/// file's order, whose path names one. On a hybrid host (v1 hierarchies and
/// a v2 mount beside them) the v2 line (`0::`) is often just `/` while the
/// v1 hierarchies hold the runtime's path, and the kernel lists v1 first:
/// the first v1 hierarchy's path that names a container decides. The
/// shown cgroup (`proc::cgroup`) stays the v2 path. None when a line is
/// malformed, an id repeats, or (with `known`, this host's hierarchy ids)
/// names a hierarchy the host does not have: such a file is not one the
/// kernel wrote for a plain name, and attribution is refused rather than
/// guessed.
pub(crate) fn from_cgroup_file(
    text: &str,
    known: Option<&BTreeSet<u32>>,
) -> Option<(Runtime, String, Option<String>)> {
    let lines = lines(text)?;
    if let Some(known) = known
        && lines.iter().any(|(id, _)| !known.contains(id))
    {
        return None;
    }
    lines.iter().find_map(|(_, path)| parse_cgroup_path(path))
}

/// Pure: runtime, id and pod UID from one cgroup path (v2 `0::` path or a
/// v1 hierarchy's). None when the path names no container, or holds a `.`
/// or `..` component or a control character (no cgroup path the kernel
/// shows does).
pub(crate) fn parse_cgroup_path(path: &str) -> Option<(Runtime, String, Option<String>)> {
    if path.chars().any(char::is_control) {
        return None;
    }
    let components: Vec<&str> = path.split('/').filter(|part| !part.is_empty()).collect();
    if components.iter().any(|part| *part == "." || *part == "..") {
        return None;
    }
    let mut pod_uid: Option<String> = None;
    let mut in_kubepods = false;
    let mut found = None;
    let mut previous = Previous::Other;
    for component in components {
        if component == "kubepods" || component == "kubepods.slice" {
            in_kubepods = true;
            previous = Previous::Other;
            continue;
        }
        if let Some(uid) = pod_component(component, in_kubepods) {
            in_kubepods = true;
            pod_uid = Some(uid);
            previous = Previous::Pod;
            continue;
        }
        let before = previous;
        previous = if component == "docker" {
            Previous::Docker
        } else {
            Previous::Other
        };
        if let Some((runtime, id, uid)) = container_component(component, before) {
            if uid.is_some() {
                pod_uid = uid;
            }
            found = Some((runtime, id, pod_uid.clone()));
        }
    }
    found
}

/// What the component before a bare id was: a bare id is a container's
/// only under `docker` (cgroupfs driver) or a pod's cgroup.
#[derive(Clone, Copy)]
enum Previous {
    Docker,
    Pod,
    Other,
}

/// A pod's cgroup: `pod<uid>` (cgroupfs, under kubepods), or
/// `kubepods-pod<uid>.slice`, `kubepods-<class>-pod<uid>.slice` (systemd).
fn pod_component(component: &str, in_kubepods: bool) -> Option<String> {
    if let Some(slice) = component
        .strip_prefix("kubepods-")
        .and_then(|rest| rest.strip_suffix(".slice"))
    {
        let uid = ["pod", "burstable-pod", "besteffort-pod"]
            .iter()
            .find_map(|prefix| slice.strip_prefix(prefix))?;
        return pod_uid(uid);
    }
    in_kubepods
        .then(|| component.strip_prefix("pod"))
        .flatten()
        .and_then(pod_uid)
}

/// A pod UID, canonical (lowercase, dashed): a UUID in either spelling, or
/// the 32 hex digits a static pod's UID is (a hash of its manifest).
fn pod_uid(text: &str) -> Option<String> {
    let uid = text.replace('_', "-").to_ascii_lowercase();
    let hex = |part: &str| !part.is_empty() && part.bytes().all(|byte| byte.is_ascii_hexdigit());
    let groups: Vec<&str> = uid.split('-').collect();
    let uuid = groups.iter().map(|group| group.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|group| hex(group));
    let static_pod = uid.len() == 32 && hex(&uid);
    (uuid || static_pod).then_some(uid)
}

/// A container id as runtimes spell it: 64 lowercase hex digits.
fn container_id(text: &str) -> Option<String> {
    (text.len() == 64
        && text
            .bytes()
            .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte)))
    .then(|| text.to_string())
}

/// A component that is a container's cgroup, with the pod UID it names
/// itself (only containerd's `<pod slice>:cri-containerd:<id>` does).
fn container_component(
    component: &str,
    previous: Previous,
) -> Option<(Runtime, String, Option<String>)> {
    // containerd on cgroup v1 with the systemd driver shows the cgroupsPath
    // it was given, `kubepods-…-pod<uid>.slice:cri-containerd:<id>`, under
    // containerd.service for the hierarchies systemd does not manage.
    if let Some((slice, rest)) = component.split_once(':') {
        let (prefix, id) = rest.split_once(':')?;
        let runtime = match prefix {
            "cri-containerd" => Runtime::Containerd,
            "crio" => Runtime::CriO,
            "docker" => Runtime::Docker,
            _ => return None,
        };
        return Some((runtime, container_id(id)?, pod_component(slice, false)));
    }
    let base = component.strip_suffix(".scope").unwrap_or(component);
    if base.starts_with("libpod-conmon-") || base.starts_with("crio-conmon-") {
        return None;
    }
    const PREFIXES: [(&str, Runtime); 5] = [
        ("docker-", Runtime::Docker),
        ("libpod-", Runtime::Podman),
        ("cri-containerd-", Runtime::Containerd),
        ("nerdctl-", Runtime::Containerd),
        ("crio-", Runtime::CriO),
    ];
    if let Some((runtime, id)) = PREFIXES
        .iter()
        .find_map(|(prefix, runtime)| Some((*runtime, base.strip_prefix(prefix)?)))
    {
        return Some((runtime, container_id(id)?, None));
    }
    let id = container_id(component)?;
    match previous {
        Previous::Docker => Some((Runtime::Docker, id, None)),
        Previous::Pod => Some((Runtime::Kubernetes, id, None)),
        Previous::Other => None,
    }
}

/// The inode of the initial PID namespace, the host's (`PROC_PID_INIT_INO`
/// in the kernel: the same on every kernel since namespaces have inodes).
const HOST_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Whether gpureap sees the host's PIDs: its PID namespace is the initial
/// one. `Some(false)` in a container without the host's PIDs (no
/// `--pid=host`, no `hostPID: true`), where the driver's PIDs name no
/// process here; None when /proc/self/ns/pid cannot be read.
pub(crate) fn sees_host_pids() -> Option<bool> {
    let link = fs::read_link("/proc/self/ns/pid").ok()?;
    Some(link.to_str() == Some(HOST_PID_NAMESPACE))
}

/// The PID in the innermost PID namespace, from a /proc/PID/status's
/// `NSpid:` line (read as bytes: the `Name:` line holds any bytes the
/// process chose): the last entry when there are several, None when there
/// is one (the process is in this namespace, or one without children).
pub fn local_pid(status: &[u8]) -> Option<u32> {
    let line = status
        .split(|&byte| byte == b'\n')
        .find_map(|line| line.strip_prefix(b"NSpid:"))?;
    let pids: Vec<u32> = std::str::from_utf8(line)
        .ok()?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    (pids.len() > 1).then(|| pids.last().copied()).flatten()
}

// Names, presence and allocated GPUs from the node's sources (`Sources`).
pub mod kubelet;
// Generated from the vendored proto (proto/README.md): not ours to lint.
#[cfg(feature = "kubelet")]
#[allow(clippy::all, clippy::pedantic)]
#[rustfmt::skip]
pub mod pod_resources;
pub mod sources;

/// Where the node's container sources are read (`--host-root`,
/// `--kubelet-socket`), built in `config`; `sources::consult` reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources {
    /// The node's root: `/`, or where a DaemonSet mounts the node (`/host`).
    pub host_root: std::path::PathBuf,
    /// The kubelet's pod-resources socket.
    pub kubelet_socket: std::path::PathBuf,
}

impl Sources {
    /// The most one consultation takes, all sources together: the kubelet
    /// gets what the node's files left of it (at least 200 ms). A source that
    /// has not answered by then is a note, and the command goes on.
    pub const BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

    /// The kubelet's socket under a node root (`--kubelet-socket`'s default).
    pub(crate) const KUBELET_SOCKET: &str = "var/lib/kubelet/pod-resources/kubelet.sock";

    /// The sources of the node at `host_root`, the kubelet's socket at
    /// `kubelet_socket` or, by default, where the kubelet puts it under that root.
    pub fn new(
        host_root: std::path::PathBuf,
        kubelet_socket: Option<std::path::PathBuf>,
    ) -> Sources {
        let kubelet_socket =
            kubelet_socket.unwrap_or_else(|| host_root.join(Sources::KUBELET_SOCKET));
        Sources {
            host_root,
            kubelet_socket,
        }
    }
}

#[cfg(test)]
mod tests {
    //! The layouts are the runtimes' own (docker's cgroupfs and systemd
    //! drivers, podman's, containerd's CRI plugin and nerdctl, cri-o, the
    //! kubelet's pod cgroups under both drivers), spelled as
    //! /proc/PID/cgroup shows them.
    use super::*;

    const ID: &str = "3f4a8e1b2c9d0e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f";
    const OTHER: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "8c1f2a3b-4d5e-6f70-8192-a3b4c5d6e7f8";
    const UID_UNDERSCORES: &str = "8c1f2a3b_4d5e_6f70_8192_a3b4c5d6e7f8";

    fn parsed(path: &str) -> Option<(Runtime, String, Option<String>)> {
        parse_cgroup_path(path)
    }

    fn expect(
        runtime: Runtime,
        id: &str,
        pod: Option<&str>,
    ) -> Option<(Runtime, String, Option<String>)> {
        Some((runtime, id.to_string(), pod.map(str::to_string)))
    }

    #[test]
    fn docker_cgroupfs_and_systemd() {
        assert_eq!(
            parsed(&format!("/docker/{ID}")),
            expect(Runtime::Docker, ID, None)
        );
        assert_eq!(
            parsed(&format!("/system.slice/docker-{ID}.scope")),
            expect(Runtime::Docker, ID, None)
        );
        // Not anchored: a prefix (a test root, a nested cgroup) is fine.
        assert_eq!(
            parsed(&format!("/gpureap-test-42/docker/{ID}/init.scope")),
            expect(Runtime::Docker, ID, None)
        );
        // Docker in docker: the deepest container is the one the process is in.
        assert_eq!(
            parsed(&format!("/docker/{OTHER}/docker/{ID}")),
            expect(Runtime::Docker, ID, None)
        );
    }

    #[test]
    fn podman_every_layout() {
        for path in [
            format!("/machine.slice/libpod-{ID}.scope"),
            format!("/machine.slice/libpod-{ID}.scope/container"),
            format!("/libpod_parent/libpod-{ID}"),
            format!(
                "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
            ),
        ] {
            assert_eq!(parsed(&path), expect(Runtime::Podman, ID, None), "{path}");
        }
        // conmon, the monitor beside the container, is no container.
        assert_eq!(
            parsed(&format!("/machine.slice/libpod-conmon-{ID}.scope")),
            None
        );
    }

    #[test]
    fn containerd_nerdctl_and_crio() {
        assert_eq!(
            parsed(&format!("/system.slice/cri-containerd-{ID}.scope")),
            expect(Runtime::Containerd, ID, None)
        );
        assert_eq!(
            parsed(&format!("/system.slice/nerdctl-{ID}.scope")),
            expect(Runtime::Containerd, ID, None)
        );
        assert_eq!(
            parsed(&format!("/system.slice/crio-{ID}.scope")),
            expect(Runtime::CriO, ID, None)
        );
        assert_eq!(
            parsed(&format!("/system.slice/crio-conmon-{ID}.scope")),
            None
        );
    }

    #[test]
    fn kubepods_systemd_every_qos_class() {
        for (class, runtime_scope, runtime) in [
            (
                "burstable",
                format!("cri-containerd-{ID}.scope"),
                Runtime::Containerd,
            ),
            ("besteffort", format!("crio-{ID}.scope"), Runtime::CriO),
            ("burstable", format!("docker-{ID}.scope"), Runtime::Docker),
        ] {
            let path = format!(
                "/kubepods.slice/kubepods-{class}.slice/kubepods-{class}-pod{UID_UNDERSCORES}.slice/{runtime_scope}"
            );
            assert_eq!(parsed(&path), expect(runtime, ID, Some(UID)), "{path}");
        }
        let guaranteed = format!(
            "/kubepods.slice/kubepods-pod{UID_UNDERSCORES}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(
            parsed(&guaranteed),
            expect(Runtime::Containerd, ID, Some(UID))
        );
    }

    #[test]
    fn kubepods_cgroupfs_is_kubernetes_with_a_dashed_uid() {
        assert_eq!(
            parsed(&format!("/kubepods/burstable/pod{UID}/{ID}")),
            expect(Runtime::Kubernetes, ID, Some(UID))
        );
        assert_eq!(
            parsed(&format!("/kubepods/pod{UID}/{ID}")),
            expect(Runtime::Kubernetes, ID, Some(UID))
        );
        // The pause (sandbox) container is a container like the others.
        assert_eq!(
            parsed(&format!("/kubepods/besteffort/pod{UID}/{OTHER}")),
            expect(Runtime::Kubernetes, OTHER, Some(UID))
        );
        // A node that is itself a container (kind, k3d): the pod's container wins.
        assert_eq!(
            parsed(&format!("/docker/{OTHER}/kubepods/burstable/pod{UID}/{ID}")),
            expect(Runtime::Kubernetes, ID, Some(UID))
        );
        // An upper-case UID is made canonical; a static pod's is 32 hex digits.
        let upper = UID.to_ascii_uppercase();
        assert_eq!(
            parsed(&format!("/kubepods/pod{upper}/{ID}")),
            expect(Runtime::Kubernetes, ID, Some(UID))
        );
        let hash = "6a4f2b0c9d8e7f6a5b4c3d2e1f0a9b8c";
        assert_eq!(
            parsed(&format!("/kubepods/burstable/pod{hash}/{ID}")),
            expect(Runtime::Kubernetes, ID, Some(hash))
        );
    }

    #[test]
    fn containerd_v1_cgroups_path_names_the_pod() {
        let path = format!(
            "/system.slice/containerd.service/kubepods-burstable-pod{UID_UNDERSCORES}.slice:cri-containerd:{ID}"
        );
        assert_eq!(parsed(&path), expect(Runtime::Containerd, ID, Some(UID)));
    }

    #[test]
    fn paths_that_name_no_container() {
        for path in [
            "/".to_string(),
            String::new(),
            "/user.slice/user-1000.slice/session-3.scope".to_string(),
            "/system.slice/docker.service".to_string(),
            "/process_api/cc7b4926f0b04b2675989d4f8f81f341".to_string(),
            // A bare id outside kubepods and docker: any cgroup could be named so.
            format!("/somewhere/{ID}"),
            // pod<uid> outside kubepods is just a name.
            format!("/pod{UID}/{ID}"),
            // Not hex, too short, too long, upper case.
            format!("/docker/{}", ID.replace('a', "g")),
            format!("/docker/{}", &ID[..63]),
            format!("/docker/{ID}0"),
            format!("/docker/{}", ID.to_ascii_uppercase()),
            format!("/system.slice/docker-{}.scope", &ID[..12]),
            format!("/kubepods/burstable/podnot-a-uid/{ID}"),
            "/kubepods/burstable/pod/".to_string(),
            "::::".to_string(),
        ] {
            assert_eq!(parsed(&path), None, "{path:?}");
        }
    }

    #[test]
    fn hostile_paths_never_panic_and_are_refused() {
        // `..` and `.` components, control characters and newlines.
        assert_eq!(parsed(&format!("/docker/../docker/{ID}")), None);
        assert_eq!(parsed(&format!("/./docker/{ID}")), None);
        assert_eq!(parsed(&format!("/x\n0::/docker/{ID}")), None);
        assert_eq!(parsed(&format!("/docker/{ID}\u{1b}[2J")), None);
        // Huge paths: a million components, and one huge component.
        let deep = "/a".repeat(1_000_000) + &format!("/docker/{ID}");
        assert_eq!(parsed(&deep), expect(Runtime::Docker, ID, None));
        let wide = format!("/docker-{}.scope", "f".repeat(1_000_000));
        assert_eq!(parsed(&wide), None);
        // Multi-byte characters where ids and UIDs are sliced.
        assert_eq!(parsed(&format!("/docker/{}é", &ID[..62])), None);
        assert_eq!(parsed("/kubepods/podé/x:y:z"), None);
        assert_eq!(parsed(":cri-containerd:"), None);
        assert_eq!(parsed("/\u{fffd}/docker/\u{fffd}"), None);
    }

    #[test]
    fn a_file_is_read_line_by_line_first_container_wins() {
        // A hybrid host: v1 hierarchies hold docker's path, the v2 line is `/`.
        let hybrid =
            format!("9:name=systemd:/docker/{ID}\n8:pids:/docker/{ID}\n4:memory:/\n0::/\n");
        assert_eq!(
            from_cgroup_file(&hybrid, None),
            expect(Runtime::Docker, ID, None)
        );
        let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(
            from_cgroup_file(&v2, None),
            expect(Runtime::Docker, ID, None)
        );
        assert_eq!(from_cgroup_file("0::/\n", None), None);
        assert_eq!(from_cgroup_file("", None), None);
    }

    #[test]
    fn a_file_the_kernel_could_not_have_written_is_refused() {
        // A cgroup name with a newline would add a line: a second `0::`.
        let forged = format!("0::/user.slice/x\n0::/docker/{ID}\n");
        assert_eq!(from_cgroup_file(&forged, None), None);
        // A hierarchy this host does not have.
        let known = BTreeSet::from([0]);
        let unknown = format!("12:fake:/docker/{ID}\n0::/\n");
        assert_eq!(from_cgroup_file(&unknown, Some(&known)), None);
        assert_eq!(
            from_cgroup_file(&format!("0::/docker/{ID}\n"), Some(&known)),
            expect(Runtime::Docker, ID, None)
        );
        // Malformed lines.
        for text in [
            format!("garbage\n0::/docker/{ID}\n"),
            format!("x::/docker/{ID}\n"),
            format!("0::docker/{ID}\n"),
            format!("-1::/docker/{ID}\n"),
            format!("0:/docker/{ID}\n"),
            "\u{fffd}\u{fffd}:\u{fffd}".to_string(),
        ] {
            assert_eq!(from_cgroup_file(&text, None), None, "{text:?}");
        }
    }

    #[test]
    fn local_pid_is_the_last_nspid_entry() {
        assert_eq!(local_pid(b"Name:\tx\nNSpid:\t4242\t17\t1\n"), Some(1));
        assert_eq!(local_pid(b"Name:\tx\nNSpid:\t4242\t17\n"), Some(17));
        assert_eq!(local_pid(b"NSpid:\t4242\n"), None);
        assert_eq!(local_pid(b"Name:\tx\n"), None);
        assert_eq!(local_pid(b"Name:\t\xff\xfe\nNSpid:\t4242\t9\n"), Some(9));
        assert_eq!(local_pid(b"NSpid:\t4242\tnine\n"), None);
        assert_eq!(local_pid(b"NSpid:"), None);
    }
}
