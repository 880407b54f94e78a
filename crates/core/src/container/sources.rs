//! Names and presence of the holders' containers, from the node's own sources,
//! read-only and each optional: the kubelet's pod-resources socket
//! (`kubelet.rs`), and what the node keeps on disk under HOST_ROOT:
//!
//! | source | gives | says "gone" |
//! |---|---|---|
//! | `var/lib/docker/containers/<id>/config.v2.json` | docker's container name | the folder lacks the id |
//! | `run/containerd/io.containerd.runtime.v2.task/<ns>/<id>/config.json` | the CRI annotations: container, pod, namespace, pod UID | no namespace has the id |
//! | `var/lib/containers/storage/overlay-containers/containers.json` | podman's and cri-o's names | cri-o's id missing (podman's rootless store is elsewhere: never) |
//! | `var/log/containers/<pod>_<ns>_<container>-<id>.log` | pod, namespace, container by id | never |
//! | `var/log/pods/<ns>_<pod>_<uid>/` | pod and namespace by pod UID | the kubelet cannot be asked and no folder has the UID |
//! | the kubelet's `List` | every pod it runs, each container's GPUs | it answered and lists no pod of that name |
//!
//! A source is consulted only when a holder's container needs it (no socket
//! call when no holder is in a pod), and what cannot be read is a note, never
//! an error: a container no readable source lists is `Presence::Unknown`,
//! never gone. The whole consultation has a fixed budget
//! (`Sources::BUDGET`): the files are read first (a few named files and
//! folders), the kubelet gets what is left of it, connection included.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::kubelet;
use super::{Container, Presence, Runtime, Sources};

/// A state file larger than this is not read (a docker config.v2.json with a
/// huge environment, a planted file): the container's name stays unknown.
const MAX_STATE_FILE: u64 = 8 << 20;

/// The kubelet never gets less than this, even when the files took the rest.
const KUBELET_FLOOR: Duration = Duration::from_millis(200);

const DOCKER: &str = "var/lib/docker/containers";
const CONTAINERD: &str = "run/containerd/io.containerd.runtime.v2.task";
const STORAGE: &str = "var/lib/containers/storage/overlay-containers/containers.json";
const LOG_CONTAINERS: &str = "var/log/containers";
const LOG_PODS: &str = "var/log/pods";

/// Names a Kubernetes source gives for a container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Names {
    namespace: Option<String>,
    pod: Option<String>,
    name: Option<String>,
    pod_uid: Option<String>,
}

impl Names {
    /// Keeps what is known, adds what `found` knows besides.
    fn merge(&mut self, found: Names) {
        self.namespace = self.namespace.take().or(found.namespace);
        self.pod = self.pod.take().or(found.pod);
        self.name = self.name.take().or(found.name);
        self.pod_uid = self.pod_uid.take().or(found.pod_uid);
    }
}

/// What the sources said, read once for all the holders of one snapshot.
#[derive(Debug, Default)]
pub(crate) struct Knowledge {
    host_root: PathBuf,
    /// Pods the kubelet lists; `None` when it was not asked or did not answer.
    kubelet: Option<Vec<kubelet::Pod>>,
    /// Docker's container ids.
    docker: Option<BTreeSet<String>>,
    /// containerd's tasks: id -> the task's config.json.
    containerd: Option<BTreeMap<String, PathBuf>>,
    /// containers/storage's containers (podman, cri-o): id -> names.
    storage: Option<BTreeMap<String, Vec<String>>>,
    /// Kubernetes names by container id, from the kubelet's log links.
    log_containers: Option<BTreeMap<String, Names>>,
    /// (namespace, pod) by pod UID, from the kubelet's pod log folders.
    log_pods: Option<BTreeMap<String, (String, String)>>,
    /// What could not be read, for the report.
    pub notes: Vec<String>,
}

/// Reads the sources the `containers` need, within `Sources::BUDGET`.
pub(crate) fn consult(sources: &Sources, containers: &[&Container]) -> Knowledge {
    let started = Instant::now();
    let wants = |runtimes: &[Runtime]| {
        containers
            .iter()
            .any(|container| runtimes.contains(&container.runtime))
    };
    let in_pods = containers
        .iter()
        .any(|container| container.pod_uid.is_some());
    let root = &sources.host_root;
    let mut knowledge = Knowledge {
        host_root: root.clone(),
        ..Knowledge::default()
    };
    if wants(&[Runtime::Docker, Runtime::Kubernetes]) {
        knowledge.docker = knowledge.noted(
            wants(&[Runtime::Docker]),
            "docker's containers",
            DOCKER,
            read_ids(&root.join(DOCKER)),
        );
    }
    if wants(&[Runtime::Containerd, Runtime::Kubernetes]) {
        knowledge.containerd = knowledge.noted(
            wants(&[Runtime::Containerd]),
            "containerd's containers",
            CONTAINERD,
            read_containerd(&root.join(CONTAINERD)),
        );
    }
    if wants(&[Runtime::Podman, Runtime::CriO, Runtime::Kubernetes]) {
        knowledge.storage = knowledge.noted(
            wants(&[Runtime::Podman, Runtime::CriO]),
            "podman's and cri-o's containers",
            STORAGE,
            read_storage(&root.join(STORAGE)),
        );
    }
    if in_pods {
        knowledge.log_containers = read_log_containers(&root.join(LOG_CONTAINERS)).ok();
        let log_pods = read_log_pods(&root.join(LOG_PODS));
        let limit = Sources::BUDGET
            .saturating_sub(started.elapsed())
            .max(KUBELET_FLOOR);
        match kubelet::list(&sources.kubelet_socket, limit) {
            Ok(pods) => knowledge.kubelet = Some(pods),
            Err(failure) => knowledge.notes.push(format!(
                "kubelet pod-resources ({}): {failure}; pods are named from the node's files \
                 only, and GPUs a pod was never allocated are not found",
                sources.kubelet_socket.display()
            )),
        }
        knowledge.log_pods =
            knowledge.noted(knowledge.kubelet.is_none(), "pods", LOG_PODS, log_pods);
    }
    knowledge
}

impl Knowledge {
    /// A source's reading, with a note when it could not be read and a
    /// holder's container depended on it (`needed`).
    fn noted<T>(
        &mut self,
        needed: bool,
        what: &str,
        place: &str,
        reading: std::io::Result<T>,
    ) -> Option<T> {
        match reading {
            Ok(value) => Some(value),
            Err(error) => {
                if needed {
                    self.notes.push(format!(
                        "{what}: cannot read {} ({error}); their names and whether they still \
                         exist are unknown",
                        self.host_root.join(place).display()
                    ));
                }
                None
            }
        }
    }

    /// Fills what the sources say of one container: names it lacks, and its presence.
    pub fn apply(&self, container: &mut Container) {
        let names = self.names(container);
        let fill = |slot: &mut Option<String>, value: Option<String>| {
            if slot.is_none() {
                *slot = value.filter(|value| !value.is_empty());
            }
        };
        fill(&mut container.name, names.name);
        fill(&mut container.pod, names.pod);
        fill(&mut container.namespace, names.namespace);
        fill(&mut container.pod_uid, names.pod_uid);
        container.presence = self.presence(container);
    }

    /// What every source that knows the container by id calls it.
    fn names(&self, container: &Container) -> Names {
        let id = &container.id;
        let mut names = Names::default();
        if let Some(config) = self.containerd.as_ref().and_then(|tasks| tasks.get(id)) {
            names.merge(containerd_names(config));
        }
        if self.docker.as_ref().is_some_and(|ids| ids.contains(id)) {
            names.merge(Names {
                name: docker_name(&self.host_root.join(DOCKER).join(id)),
                ..Names::default()
            });
        }
        if let Some(found) = self.storage.as_ref().and_then(|store| store.get(id)) {
            names.merge(storage_names(found));
        }
        if let Some(found) = self.log_containers.as_ref().and_then(|logs| logs.get(id)) {
            names.merge(found.clone());
        }
        let uid = container.pod_uid.clone().or(names.pod_uid.clone());
        if let Some((namespace, pod)) = uid
            .as_ref()
            .and_then(|uid| self.log_pods.as_ref()?.get(uid))
        {
            names.merge(Names {
                namespace: Some(namespace.clone()),
                pod: Some(pod.clone()),
                ..Names::default()
            });
        }
        names
    }

    /// Gone when a source that would list the container was read and does
    /// not; present when one lists it; unknown when none could tell.
    fn presence(&self, container: &Container) -> Presence {
        let id = &container.id;
        let mut present = false;
        let mut judge = |known: Option<bool>, may_say_gone: bool, source: &str| match known {
            Some(true) => {
                present = true;
                None
            }
            Some(false) if may_say_gone => Some(Presence::Gone {
                source: source.to_string(),
            }),
            _ => None,
        };
        let docker = self.docker.as_ref().map(|ids| ids.contains(id));
        let containerd = self.containerd.as_ref().map(|tasks| tasks.contains_key(id));
        let storage = self.storage.as_ref().map(|store| store.contains_key(id));
        let verdicts = [
            judge(docker, container.runtime == Runtime::Docker, DOCKER_SOURCE),
            judge(
                containerd,
                container.runtime == Runtime::Containerd,
                CONTAINERD_SOURCE,
            ),
            judge(storage, container.runtime == Runtime::CriO, STORAGE_SOURCE),
        ];
        let pod = self.pod_presence(container);
        if let Some(gone) = verdicts.into_iter().flatten().next() {
            return gone;
        }
        match pod {
            Some(Presence::Gone { source }) => Presence::Gone { source },
            Some(Presence::Present) => Presence::Present,
            _ if present => Presence::Present,
            _ => Presence::Unknown,
        }
    }

    /// Whether the container's pod still exists, where it is in one: the
    /// kubelet's word when it answered (it lists pods by name, so a pod of
    /// that name under another UID in the log folders is a newer pod of the
    /// same name, as a StatefulSet makes), else the pod log folders' (by
    /// UID). The log folders speak only when they hold some pod: a node
    /// whose kubelet writes its logs elsewhere leaves /var/log/pods empty.
    fn pod_presence(&self, container: &Container) -> Option<Presence> {
        let uid = container.pod_uid.as_ref()?;
        let gone = |source: &str| {
            Some(Presence::Gone {
                source: source.to_string(),
            })
        };
        let folders = self.log_pods.as_ref().filter(|folders| !folders.is_empty());
        let in_folders = folders.map(|folders| folders.contains_key(uid));
        let Some(pods) = &self.kubelet else {
            return match in_folders? {
                true => Some(Presence::Present),
                false => gone(LOG_PODS_SOURCE),
            };
        };
        let (Some(namespace), Some(name)) = (&container.namespace, &container.pod) else {
            // No name for this UID (no folder has it): the kubelet cannot
            // be asked about it, the folders say it is gone.
            return match in_folders? {
                true => None,
                false => gone(LOG_PODS_SOURCE),
            };
        };
        if !pods
            .iter()
            .any(|pod| &pod.namespace == namespace && &pod.name == name)
        {
            return gone(KUBELET_SOURCE);
        }
        let renewed = in_folders == Some(false)
            && folders.is_some_and(|folders| {
                folders
                    .values()
                    .any(|(in_namespace, pod)| in_namespace == namespace && pod == name)
            });
        if renewed {
            gone(LOG_PODS_SOURCE)
        } else {
            Some(Presence::Present)
        }
    }

    /// The GPUs (UUIDs) the kubelet allocated to this Kubernetes container,
    /// when it answered and lists the container with GPUs it can name.
    pub fn allocated(&self, container: &Container) -> Option<&BTreeSet<String>> {
        container.pod_uid.as_ref()?;
        // A gone pod's name may be a newer pod's, allocated other GPUs.
        if matches!(container.presence, Presence::Gone { .. }) {
            return None;
        }
        let (namespace, pod, name) = (
            container.namespace.as_ref()?,
            container.pod.as_ref()?,
            container.name.as_ref()?,
        );
        let listed = self
            .kubelet
            .as_ref()?
            .iter()
            .find(|listed| &listed.namespace == namespace && &listed.name == pod)?
            .containers
            .iter()
            .find(|listed| &listed.name == name)?;
        (!listed.opaque).then_some(&listed.gpus)
    }
}

impl Container {
    /// Why this container counts as gone, in words, when a source says it
    /// is: `container gone: docker container web (0123456789ab) is not
    /// listed by /var/lib/docker/containers`, and its pod where it has one.
    pub(crate) fn gone_reason(&self) -> Option<String> {
        let Presence::Gone { source } = &self.presence else {
            return None;
        };
        let id = self.id.get(..12).unwrap_or(&self.id);
        let mut what = match &self.name {
            Some(name) => format!("{} container {name} ({id})", self.runtime.name()),
            None => format!("{} container {id}", self.runtime.name()),
        };
        let pod = match (&self.namespace, &self.pod) {
            (Some(namespace), Some(pod)) => Some(format!("{namespace}/{pod}")),
            _ => self.pod.clone().or_else(|| self.pod_uid.clone()),
        };
        if let Some(pod) = pod {
            what.push_str(&format!(" of pod {pod}"));
        }
        Some(format!("container gone: {what} is not listed by {source}"))
    }
}

/// How each source is named where it says a container is gone (`Presence::Gone`).
pub(crate) const KUBELET_SOURCE: &str = "kubelet pod-resources";
pub(crate) const DOCKER_SOURCE: &str = "/var/lib/docker/containers";
pub(crate) const CONTAINERD_SOURCE: &str = "containerd state";
pub(crate) const STORAGE_SOURCE: &str = "/var/lib/containers/storage";
pub(crate) const LOG_PODS_SOURCE: &str = "/var/log/pods";

/// A file's text, if it is no larger than `MAX_STATE_FILE`.
fn read_bounded(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_STATE_FILE + 1)
        .read_to_string(&mut text)
        .ok()?;
    (text.len() as u64 <= MAX_STATE_FILE).then_some(text)
}

/// The names of a folder's entries.
fn read_ids(folder: &Path) -> std::io::Result<BTreeSet<String>> {
    Ok(std::fs::read_dir(folder)?
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect())
}

/// containerd's tasks, in every containerd namespace (`k8s.io`, `moby`, `default`).
fn read_containerd(root: &Path) -> std::io::Result<BTreeMap<String, PathBuf>> {
    let mut tasks = BTreeMap::new();
    for namespace in std::fs::read_dir(root)?.filter_map(Result::ok) {
        let Ok(entries) = std::fs::read_dir(namespace.path()) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            tasks.insert(
                entry.file_name().to_string_lossy().into_owned(),
                entry.path().join("config.json"),
            );
        }
    }
    Ok(tasks)
}

/// The CRI's annotations in a task's OCI config (and nerdctl's name).
fn containerd_names(config: &Path) -> Names {
    let Some(document) =
        read_bounded(config).and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
    else {
        return Names::default();
    };
    let annotation = |key: &str| {
        document
            .get("annotations")?
            .get(key)?
            .as_str()
            .map(str::to_string)
    };
    Names {
        namespace: annotation("io.kubernetes.cri.sandbox-namespace"),
        pod: annotation("io.kubernetes.cri.sandbox-name"),
        name: annotation("io.kubernetes.cri.container-name").or_else(|| annotation("nerdctl/name")),
        pod_uid: annotation("io.kubernetes.cri.sandbox-uid"),
    }
}

/// Docker's name for a container (`"Name": "/web"` in config.v2.json).
fn docker_name(folder: &Path) -> Option<String> {
    let text = read_bounded(&folder.join("config.v2.json"))?;
    let document: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(
        document
            .get("Name")?
            .as_str()?
            .trim_start_matches('/')
            .to_string(),
    )
}

/// containers/storage's list: `[{"id": "...", "names": ["..."]}, ...]`.
fn read_storage(path: &Path) -> std::io::Result<BTreeMap<String, Vec<String>>> {
    let text = read_bounded(path).ok_or_else(|| {
        std::fs::metadata(path).err().unwrap_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "unreadable or too large")
        })
    })?;
    let document: serde_json::Value = serde_json::from_str(&text)
        .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))?;
    Ok(document
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let id = entry.get("id")?.as_str()?.to_string();
            let names = entry
                .get("names")
                .and_then(|names| names.as_array())
                .into_iter()
                .flatten()
                .filter_map(|name| name.as_str().map(str::to_string))
                .collect();
            Some((id, names))
        })
        .collect())
}

/// A podman name, or cri-o's `k8s_<container>_<pod>_<namespace>_<uid>_<attempt>`.
fn storage_names(names: &[String]) -> Names {
    let Some(first) = names.first() else {
        return Names::default();
    };
    let parts: Vec<&str> = first.split('_').collect();
    match parts.as_slice() {
        ["k8s", container, pod, namespace, uid, _attempt] => Names {
            namespace: Some(namespace.to_string()),
            pod: Some(pod.to_string()),
            name: Some(container.to_string()),
            pod_uid: Some(uid.to_string()),
        },
        _ => Names {
            name: Some(first.clone()),
            ..Names::default()
        },
    }
}

/// The kubelet's log links: `<pod>_<namespace>_<container>-<id>.log`.
fn read_log_containers(folder: &Path) -> std::io::Result<BTreeMap<String, Names>> {
    Ok(read_ids(folder)?
        .iter()
        .filter_map(|file| parse_log_container(file))
        .collect())
}

fn parse_log_container(file: &str) -> Option<(String, Names)> {
    let (names, id) = file.strip_suffix(".log")?.rsplit_once('-')?;
    let mut parts = names.splitn(3, '_');
    let (pod, namespace, container) = (parts.next()?, parts.next()?, parts.next()?);
    Some((
        id.to_string(),
        Names {
            namespace: Some(namespace.to_string()),
            pod: Some(pod.to_string()),
            name: Some(container.to_string()),
            pod_uid: None,
        },
    ))
}

/// The kubelet's pod log folders: `<namespace>_<pod>_<uid>` (names and
/// namespaces never hold `_`; the UID is the last part).
fn read_log_pods(folder: &Path) -> std::io::Result<BTreeMap<String, (String, String)>> {
    Ok(read_ids(folder)?
        .iter()
        .filter_map(|name| parse_log_pod(name))
        .collect())
}

fn parse_log_pod(name: &str) -> Option<(String, (String, String))> {
    let (rest, uid) = name.rsplit_once('_')?;
    let (namespace, pod) = rest.split_once('_')?;
    Some((
        uid.to_ascii_lowercase(),
        (namespace.to_string(), pod.to_string()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f1e2d3c-aaaa-bbbb-cccc-000000000001";
    const NEWER: &str = "0f1e2d3c-aaaa-bbbb-cccc-000000000002";

    fn in_pod(runtime: Runtime) -> Container {
        let mut container = Container::new(runtime, "ab".repeat(32), Some(UID.to_string()));
        container.namespace = Some("llm".to_string());
        container.pod = Some("web-0".to_string());
        container.name = Some("server".to_string());
        container
    }

    fn listed(pods: &[(&str, &str, &[&str], bool)]) -> Option<Vec<kubelet::Pod>> {
        Some(
            pods.iter()
                .map(|&(namespace, name, gpus, opaque)| kubelet::Pod {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    containers: vec![kubelet::Container {
                        name: "server".to_string(),
                        gpus: gpus.iter().map(|gpu| gpu.to_string()).collect(),
                        opaque,
                    }],
                })
                .collect(),
        )
    }

    fn folders(uids: &[(&str, &str)]) -> Option<BTreeMap<String, (String, String)>> {
        Some(
            uids.iter()
                .map(|&(uid, pod)| (uid.to_string(), ("llm".to_string(), pod.to_string())))
                .collect(),
        )
    }

    fn gone(source: &str) -> Presence {
        Presence::Gone {
            source: source.to_string(),
        }
    }

    #[test]
    fn a_pod_is_gone_only_where_a_source_read_says_so() {
        let container = in_pod(Runtime::Kubernetes);
        let judge = |knowledge: Knowledge| knowledge.presence(&container);
        let with = |kubelet, log_pods| Knowledge {
            kubelet,
            log_pods,
            ..Knowledge::default()
        };
        assert_eq!(judge(with(None, None)), Presence::Unknown);
        // An empty log folder says nothing (another podLogsDir).
        assert_eq!(judge(with(None, folders(&[]))), Presence::Unknown);
        assert_eq!(
            judge(with(None, folders(&[(NEWER, "other-0")]))),
            gone(LOG_PODS_SOURCE)
        );
        assert_eq!(
            judge(with(None, folders(&[(UID, "web-0")]))),
            Presence::Present
        );
        let web = listed(&[("llm", "web-0", &["GPU-1"], false)]);
        assert_eq!(judge(with(web.clone(), None)), Presence::Present);
        assert_eq!(
            judge(with(listed(&[("llm", "other-0", &[], false)]), None)),
            gone(KUBELET_SOURCE)
        );
        // A StatefulSet's new web-0: the kubelet lists the name, the log
        // folders have it under another UID only.
        assert_eq!(
            judge(with(web, folders(&[(NEWER, "web-0")]))),
            gone(LOG_PODS_SOURCE)
        );
    }

    #[test]
    fn runtimes_state_says_gone_only_for_its_own_containers() {
        let docker = Container::new(Runtime::Docker, "cd".repeat(32), None);
        let empty = Knowledge {
            docker: Some(BTreeSet::new()),
            containerd: Some(BTreeMap::new()),
            storage: Some(BTreeMap::new()),
            ..Knowledge::default()
        };
        assert_eq!(empty.presence(&docker), gone(DOCKER_SOURCE));
        assert_eq!(Knowledge::default().presence(&docker), Presence::Unknown);
        let crio = Container::new(Runtime::CriO, "cd".repeat(32), None);
        assert_eq!(empty.presence(&crio), gone(STORAGE_SOURCE));
        // Rootless podman keeps its state in the user's home: never gone.
        let podman = Container::new(Runtime::Podman, "cd".repeat(32), None);
        assert_eq!(empty.presence(&podman), Presence::Unknown);
        // A kubepods id whose runtime the path does not tell.
        let bare = Container::new(Runtime::Kubernetes, "cd".repeat(32), None);
        assert_eq!(empty.presence(&bare), Presence::Unknown);
    }

    #[test]
    fn allocated_gpus_only_where_the_kubelet_can_name_them() {
        let mut container = in_pod(Runtime::Containerd);
        let knowledge = |opaque| Knowledge {
            kubelet: listed(&[("llm", "web-0", &["GPU-1"], opaque)]),
            ..Knowledge::default()
        };
        let expected: BTreeSet<String> = ["GPU-1".to_string()].into();
        assert_eq!(knowledge(false).allocated(&container), Some(&expected));
        assert_eq!(knowledge(true).allocated(&container), None);
        assert_eq!(Knowledge::default().allocated(&container), None);
        container.presence = gone(KUBELET_SOURCE);
        assert_eq!(knowledge(false).allocated(&container), None);
        container.presence = Presence::Present;
        container.name = Some("sidecar".to_string());
        assert_eq!(knowledge(false).allocated(&container), None);
    }

    #[test]
    fn pod_log_folders() {
        assert_eq!(
            parse_log_pod("default_web-0_0f1e2d3c-aaaa-bbbb-cccc-000000000001"),
            Some((
                "0f1e2d3c-aaaa-bbbb-cccc-000000000001".to_string(),
                ("default".to_string(), "web-0".to_string())
            ))
        );
        assert_eq!(parse_log_pod("nounderscore"), None);
        assert_eq!(parse_log_pod("one_part"), None);
    }

    #[test]
    fn container_log_links() {
        let (id, names) = parse_log_container("web-0_default_server-0123abcd.log").expect("parsed");
        assert_eq!(id, "0123abcd");
        assert_eq!(names.pod.as_deref(), Some("web-0"));
        assert_eq!(names.namespace.as_deref(), Some("default"));
        assert_eq!(names.name.as_deref(), Some("server"));
        assert_eq!(parse_log_container("web.log"), None);
        assert_eq!(parse_log_container("a_b-c.log"), None);
    }

    #[test]
    fn crio_names_in_storage() {
        let names = storage_names(&["k8s_server_web-0_default_uid-1_0".to_string()]);
        assert_eq!(names.name.as_deref(), Some("server"));
        assert_eq!(names.pod.as_deref(), Some("web-0"));
        assert_eq!(names.namespace.as_deref(), Some("default"));
        assert_eq!(names.pod_uid.as_deref(), Some("uid-1"));
        let podman = storage_names(&["happy_turing".to_string()]);
        assert_eq!(podman.name.as_deref(), Some("happy_turing"));
        assert_eq!(storage_names(&[]), Names::default());
    }
}
