//! Who is in a container, a pod or a cgroup: the members of `free
//! --container`, `--pod` and `--cgroup`, found from every process's
//! /proc/PID/cgroup (every line: cgroup v2 and each v1 hierarchy) before the
//! snapshot, by identity (PID and start time), as `--stale-runs` finds the
//! runs' members. Selection then stays pure: it only sees the set.
//!
//! What a scope takes (docs/containers.md, "Freeing by container"): every
//! process found in the container, pod or cgroup (and below it), GPU user
//! or not, as the roots of the free; their descendants go with them, like
//! any target's. Other filters narrow it (`--gpu 0` keeps only the members
//! that use GPU 0). Unlike `--pid`, being a member does not override the
//! guard: a protected name or a monitor in a container is spared, and says
//! so. Verification is on the GPUs the members held.
//!
//! A value that names nothing known (no process in it, and no source or
//! cgroup directory that knows it) is bad input, as an id prefix that two
//! containers share is: exit 2, before anything is signalled. One that a
//! source or the cgroup file system knows but that holds no process is an
//! empty scope with a note: nothing to free.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use crate::container::{self, Container, Presence, Runtime, Sources, sources};
use crate::proc::{self, ProcessId};

/// The shortest id prefix `--container` takes, as `docker ps` shows ids.
pub(crate) const MIN_ID_PREFIX: usize = 12;

/// How many candidates an ambiguous value lists.
const LISTED: usize = 8;

/// `--container ID|NAME` as typed: an id (a prefix of at least
/// `MIN_ID_PREFIX` hex digits, lowercased) or a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerRef {
    Id(String),
    Name(String),
}

impl ContainerRef {
    pub fn parse(text: &str) -> Result<ContainerRef, String> {
        check_printable(text, "a container id or name")?;
        let hex = text.chars().all(|c| c.is_ascii_hexdigit());
        if hex && text.len() > 64 {
            return Err(format!(
                "'{text}' is longer than a container id (64 hex digits)"
            ));
        }
        if hex && text.len() >= MIN_ID_PREFIX {
            Ok(ContainerRef::Id(text.to_ascii_lowercase()))
        } else {
            Ok(ContainerRef::Name(text.to_string()))
        }
    }
}

impl fmt::Display for ContainerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContainerRef::Id(id) => f.write_str(id),
            ContainerRef::Name(name) => f.write_str(name),
        }
    }
}

/// `--pod NAMESPACE/NAME|UID` as typed; a UID canonical (lowercase, dashed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodRef {
    Uid(String),
    Name { namespace: String, name: String },
}

impl PodRef {
    pub fn parse(text: &str) -> Result<PodRef, String> {
        check_printable(text, "a pod")?;
        if let Some((namespace, name)) = text.split_once('/') {
            if namespace.is_empty() || name.is_empty() || name.contains('/') {
                return Err(format!(
                    "'{text}' is not NAMESPACE/NAME (e.g. default/llama-0)"
                ));
            }
            return Ok(PodRef::Name {
                namespace: namespace.to_string(),
                name: name.to_string(),
            });
        }
        canonical_uid(text).map(PodRef::Uid).ok_or_else(|| {
            format!(
                "'{text}' is neither NAMESPACE/NAME nor a pod UID (8-4-4-4-12 hex digits, e.g. 0f6b7c1e-2d7a-4b8e-9c3d-5a1f2e3d4c5b, or a static pod's 32)"
            )
        })
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PodRef::Uid(uid) => f.write_str(uid),
            PodRef::Name { namespace, name } => write!(f, "{namespace}/{name}"),
        }
    }
}

/// A pod UID, lowercase and dashed, from either kubepods spelling; or the
/// 32 hex digits of a static pod's UID (a hash of its manifest).
pub(crate) fn canonical_uid(text: &str) -> Option<String> {
    let uid = text.to_ascii_lowercase().replace('_', "-");
    let groups: Vec<&str> = uid.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|group| group.len()).collect();
    let hex = groups
        .iter()
        .all(|group| group.chars().all(|c| c.is_ascii_hexdigit()));
    (hex && (lengths == [8, 4, 4, 4, 12] || lengths == [32])).then_some(uid)
}

/// `--cgroup PATH` as typed: absolute, without `.` or `..`, without a
/// trailing slash. Either a path as /proc/PID/cgroup spells it, or the
/// cgroup's directory under a cgroup mount (`/sys/fs/cgroup/...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupRef(String);

impl CgroupRef {
    pub fn parse(text: &str) -> Result<CgroupRef, String> {
        check_printable(text, "a cgroup path")?;
        if !text.starts_with('/') {
            return Err(format!(
                "'{text}' is not absolute: give the path as /proc/PID/cgroup spells it (e.g. /system.slice/docker-ID.scope) or its directory under the cgroup mount"
            ));
        }
        let dotted = text.split('/').any(|part| part == "." || part == "..");
        if dotted {
            return Err(format!("'{text}' has . or .. in it"));
        }
        let trimmed = text.trim_end_matches('/');
        if trimmed.is_empty() {
            return Err(ROOT_REFUSED.to_string());
        }
        Ok(CgroupRef(trimmed.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CgroupRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

const ROOT_REFUSED: &str =
    "refusing the root cgroup: every process on the host is in it (use --all for every GPU user)";

fn check_printable(text: &str, what: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err(format!("empty: give {what}"));
    }
    if text.chars().any(char::is_control) {
        return Err(format!("{what} with a control character in it"));
    }
    Ok(())
}

/// One scope of `free` found by its cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    Container(ContainerRef),
    Pod(PodRef),
    Cgroup(CgroupRef),
}

impl Wanted {
    /// The flag that gave it, for messages and reports.
    pub fn flag(&self) -> &'static str {
        match self {
            Wanted::Container(_) => "--container",
            Wanted::Pod(_) => "--pod",
            Wanted::Cgroup(_) => "--cgroup",
        }
    }

    /// `container`, `pod` or `cgroup` (JSON's `kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Wanted::Container(_) => "container",
            Wanted::Pod(_) => "pod",
            Wanted::Cgroup(_) => "cgroup",
        }
    }

    /// The value as typed (canonical).
    pub fn given(&self) -> String {
        match self {
            Wanted::Container(value) => value.to_string(),
            Wanted::Pod(value) => value.to_string(),
            Wanted::Cgroup(value) => value.to_string(),
        }
    }
}

/// What one `--container`, `--pod` or `--cgroup` resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub wanted: Wanted,
    /// The container's runtime and full id (`--container`).
    pub container: Option<(Runtime, String)>,
    /// The pod's UID (`--pod`, or the container's pod).
    pub pod_uid: Option<String>,
    /// The cgroups its members were found in, as /proc/PID/cgroup spells them.
    pub cgroups: BTreeSet<String>,
    /// Every live process in it when it was looked for.
    pub members: BTreeSet<ProcessId>,
    /// Why it holds nothing, or how a name was resolved.
    pub note: Option<String>,
}

/// What the node's sources (`container::sources`) say that the values
/// need: names resolved (`--container NAME` to ids, `--pod NAMESPACE/NAME`
/// to UIDs), and ids or UIDs a source lists whether or not a process is in
/// them now (a container or pod with nothing in it, rather than unknown).
#[derive(Debug, Clone, Default)]
pub struct Known {
    /// Container name → full ids with that name.
    pub container_names: BTreeMap<String, BTreeSet<String>>,
    /// Container ids a source lists.
    pub container_ids: BTreeSet<String>,
    /// (namespace, pod name) → pod UIDs.
    pub pod_names: BTreeMap<(String, String), BTreeSet<String>>,
    /// Pod UIDs a source lists.
    pub pod_uids: BTreeSet<String>,
    /// Whether the sources were consulted at all.
    pub consulted: bool,
    /// What could not be read, in the sources' own words.
    pub notes: Vec<String>,
}

/// Runtimes a bare id may be of, for asking the sources whether they list it.
const RUNTIMES: [Runtime; 4] = [
    Runtime::Docker,
    Runtime::Containerd,
    Runtime::CriO,
    Runtime::Podman,
];

/// Consults the node's sources, once and bounded (`Sources::BUDGET`), when a
/// value needs them: a name, or an id or UID no process is in now (to tell
/// a container or pod with nothing in it from an unknown one). Names come
/// from the containers processes are in (a container with no process has
/// nothing to free, whatever its name).
pub fn known(sources: &Sources, wanted: &[Wanted], placed: &[Placed]) -> Known {
    let seen: BTreeMap<String, (Runtime, Option<String>)> = placed
        .iter()
        .flat_map(containers_of)
        .map(|(runtime, id, pod_uid)| (id, (runtime, pod_uid)))
        .collect();
    let seen_uids: BTreeSet<&String> = seen.values().filter_map(|(_, uid)| uid.as_ref()).collect();
    let mut asked: Vec<Container> = Vec::new();
    let mut names_needed = false;
    for value in wanted {
        match value {
            Wanted::Container(ContainerRef::Name(_)) | Wanted::Pod(PodRef::Name { .. }) => {
                names_needed = true;
            }
            Wanted::Container(ContainerRef::Id(prefix))
                if prefix.len() == 64 && !seen.contains_key(prefix) =>
            {
                asked.extend(
                    RUNTIMES
                        .iter()
                        .map(|runtime| Container::new(*runtime, prefix.clone(), None)),
                );
            }
            Wanted::Container(ContainerRef::Id(prefix))
                if !seen.keys().any(|id| id.starts_with(prefix.as_str())) =>
            {
                names_needed = true;
            }
            Wanted::Pod(PodRef::Uid(uid)) if !seen_uids.contains(uid) => {
                asked.push(Container::new(
                    Runtime::Kubernetes,
                    String::new(),
                    Some(uid.clone()),
                ));
            }
            _ => {}
        }
    }
    if names_needed {
        asked.extend(
            seen.iter()
                .map(|(id, (runtime, uid))| Container::new(*runtime, id.clone(), uid.clone())),
        );
    }
    if asked.is_empty() {
        return Known::default();
    }
    let knowledge = sources::consult(sources, &asked.iter().collect::<Vec<_>>());
    let mut known = Known {
        consulted: true,
        notes: knowledge.notes.clone(),
        ..Known::default()
    };
    for mut container in asked {
        knowledge.apply(&mut container);
        let present = container.presence == Presence::Present;
        if let Some(name) = &container.name
            && !container.id.is_empty()
        {
            known
                .container_names
                .entry(name.clone())
                .or_default()
                .insert(container.id.clone());
        }
        if let (Some(namespace), Some(pod), Some(uid)) =
            (&container.namespace, &container.pod, &container.pod_uid)
        {
            known
                .pod_names
                .entry((namespace.clone(), pod.clone()))
                .or_default()
                .insert(uid.clone());
        }
        if present && !container.id.is_empty() {
            known.container_ids.insert(container.id.clone());
        }
        if present && let Some(uid) = &container.pod_uid {
            known.pod_uids.insert(uid.clone());
        }
    }
    known
}

/// One line of /proc/PID/cgroup: its hierarchy (`0` is cgroup v2), the
/// controllers of a v1 hierarchy, and the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLine {
    pub hierarchy: String,
    pub controllers: String,
    pub path: String,
}

impl CgroupLine {
    fn is_v2(&self) -> bool {
        self.hierarchy == "0" && self.controllers.is_empty()
    }
}

/// Every line of a /proc/PID/cgroup text; malformed lines are skipped.
/// A cgroup name holding a newline adds lines (the kernel writes names as
/// they are): they are kept, so that such a process is still a member of
/// every cgroup above its real one (it cannot leave a scope that way), and
/// may also show in the one its forged line names, where a free would end
/// only that process, the forger's own. Attribution (`container`) refuses
/// such a file instead: it names nothing there.
pub(crate) fn parse_lines(text: &str) -> Vec<CgroupLine> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let hierarchy = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            (!hierarchy.is_empty()
                && hierarchy.chars().all(|c| c.is_ascii_digit())
                && path.starts_with('/'))
            .then(|| CgroupLine {
                hierarchy: hierarchy.to_string(),
                controllers: controllers.to_string(),
                path: path.to_string(),
            })
        })
        .collect()
}

/// A process and the lines of its /proc/PID/cgroup.
#[derive(Debug, Clone)]
pub struct Placed {
    pub id: ProcessId,
    pub lines: Vec<CgroupLine>,
}

/// Every process now, with its cgroups. One that exits mid-scan, or whose
/// cgroup file cannot be read, is left out; one whose PID was reused while
/// it was read too (its start time is read on both sides).
pub fn scan() -> Vec<Placed> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let before = proc::identity(pid)?;
            // A cgroup's name may be any bytes: read lossily, so that a
            // process in a cgroup whose name is not UTF-8 is still a member
            // of the cgroups above it.
            let bytes = fs::read(format!("/proc/{pid}/cgroup")).ok()?;
            let after = proc::identity(pid)?;
            (before == after).then(|| Placed {
                id: before,
                lines: parse_lines(&String::from_utf8_lossy(&bytes)),
            })
        })
        .collect()
}

/// A cgroup file system mounted on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub point: PathBuf,
    /// The cgroup the mount shows at its top (`/` unless a subtree is mounted).
    pub root: String,
    /// None for cgroup v2; a v1 hierarchy's controllers (and `name=...`).
    pub controllers: Option<BTreeSet<String>>,
}

/// The cgroup mounts in a mountinfo text.
pub fn parse_mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut fields = left.split_whitespace();
            let root = fields.nth(3)?;
            let point = fields.next()?;
            let mut right = right.split_whitespace();
            let fstype = right.next()?;
            let options = right.nth(1).unwrap_or_default();
            let controllers = match fstype {
                "cgroup2" => None,
                "cgroup" => Some(
                    options
                        .split(',')
                        .filter(|option| !matches!(*option, "rw" | "ro" | "xattr"))
                        .map(str::to_string)
                        .collect(),
                ),
                _ => return None,
            };
            Some(Mount {
                point: PathBuf::from(unescape_octal(point)),
                root: unescape_octal(root),
                controllers,
            })
        })
        .collect()
}

/// mountinfo writes a space, tab, newline and backslash as `\ooo`.
fn unescape_octal(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let octal = bytes.get(index + 1..index + 4).and_then(|digits| {
            std::str::from_utf8(digits)
                .ok()
                .and_then(|digits| u8::from_str_radix(digits, 8).ok())
        });
        match (bytes[index], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                index += 4;
            }
            (byte, _) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn this_hosts_mounts() -> Vec<Mount> {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|text| parse_mounts(&text))
        .unwrap_or_default()
}

impl Mount {
    /// Whether a /proc/PID/cgroup line is of this mount's hierarchy.
    fn shows(&self, line: &CgroupLine) -> bool {
        match &self.controllers {
            None => line.is_v2(),
            Some(controllers) => {
                !line.is_v2()
                    && line
                        .controllers
                        .split(',')
                        .all(|controller| controllers.contains(controller))
            }
        }
    }

    /// The directory of a cgroup path under this mount, if it shows it.
    fn directory(&self, path: &str) -> Option<PathBuf> {
        let root = self.root.trim_end_matches('/');
        let rest = if root.is_empty() {
            path
        } else {
            path.strip_prefix(root)
                .filter(|rest| rest.is_empty() || rest.starts_with('/'))?
        };
        Some(self.point.join(rest.trim_start_matches('/')))
    }
}

/// A `--cgroup` value made a cgroup path, and the mount it was given under
/// (then only that hierarchy's lines count).
fn cgroup_path(wanted: &CgroupRef, mounts: &[Mount]) -> Result<(String, Option<Mount>), String> {
    let given = Path::new(wanted.as_str());
    // The deepest mount the value is under: /sys/fs/cgroup/unified is
    // under /sys/fs/cgroup too on a hybrid host.
    let under = mounts
        .iter()
        .filter_map(|mount| Some((mount, given.strip_prefix(&mount.point).ok()?)))
        .max_by_key(|(mount, _)| mount.point.components().count());
    let Some((mount, rest)) = under else {
        return Ok((wanted.as_str().to_string(), None));
    };
    let rest = rest.to_string_lossy();
    let root = mount.root.trim_end_matches('/');
    let path = if rest.is_empty() {
        if root.is_empty() { "/" } else { root }.to_string()
    } else {
        format!("{root}/{rest}")
    };
    if path == "/" {
        return Err(ROOT_REFUSED.to_string());
    }
    Ok((path, Some(mount.clone())))
}

/// Whether `path` is `cgroup` or below it.
fn within(path: &str, cgroup: &str) -> bool {
    path.strip_prefix(cgroup)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The container each line names (runtime, full id, pod UID), in line order.
fn containers_of(placed: &Placed) -> Vec<(Runtime, String, Option<String>)> {
    placed
        .lines
        .iter()
        .filter_map(|line| container::parse_cgroup_path(&line.path))
        .collect()
}

/// Resolves each value against the processes now (`scan`) and what the
/// node's sources know (`known`). An error is bad input (exit 2): nothing
/// has been signalled.
pub fn find(wanted: &[Wanted], placed: &[Placed], known: &Known) -> Result<Vec<Found>, String> {
    let mounts = this_hosts_mounts();
    wanted
        .iter()
        .map(|wanted| match wanted {
            Wanted::Cgroup(cgroup) => find_cgroup(cgroup, placed, &mounts),
            Wanted::Container(reference) => find_container(reference, placed, known),
            Wanted::Pod(reference) => find_pod(reference, placed, known),
        })
        .collect()
}

fn find_cgroup(wanted: &CgroupRef, placed: &[Placed], mounts: &[Mount]) -> Result<Found, String> {
    let (path, mount) = cgroup_path(wanted, mounts)?;
    let mut found = Found {
        wanted: Wanted::Cgroup(wanted.clone()),
        container: None,
        pod_uid: None,
        cgroups: BTreeSet::new(),
        members: BTreeSet::new(),
        note: None,
    };
    for process in placed {
        for line in &process.lines {
            let counts = mount.as_ref().is_none_or(|mount| mount.shows(line));
            if counts && within(&line.path, &path) {
                found.cgroups.insert(line.path.clone());
                found.members.insert(process.id);
            }
        }
    }
    if found.members.is_empty() {
        let exists = match &mount {
            Some(mount) => mount.directory(&path).is_some_and(|dir| dir.is_dir()),
            None => mounts
                .iter()
                .filter_map(|mount| mount.directory(&path))
                .any(|dir| dir.is_dir()),
        };
        if !exists {
            return Err(format!(
                "--cgroup {}: no process is in it and no cgroup mount has it (see /proc/PID/cgroup for how paths are spelled)",
                wanted
            ));
        }
        found.note = Some(format!("cgroup {path} holds no process: nothing to free"));
    }
    if mount.is_some() {
        found.note.get_or_insert_with(|| format!("cgroup {path}"));
    }
    Ok(found)
}

fn find_container(
    reference: &ContainerRef,
    placed: &[Placed],
    known: &Known,
) -> Result<Found, String> {
    let seen: BTreeMap<String, Runtime> = placed
        .iter()
        .flat_map(containers_of)
        .map(|(runtime, id, _)| (id.to_ascii_lowercase(), runtime))
        .collect();
    let mut candidates: BTreeSet<String> = BTreeSet::new();
    let mut note = None;
    if let ContainerRef::Id(prefix) = reference {
        candidates.extend(
            seen.keys()
                .chain(known.container_ids.iter())
                .filter(|id| id.starts_with(prefix.as_str()))
                .cloned(),
        );
    }
    if candidates.is_empty() {
        let name = reference.to_string();
        if let Some(ids) = known.container_names.get(&name) {
            candidates.extend(ids.iter().map(|id| id.to_ascii_lowercase()));
            note = Some(format!("named '{name}' by the node's sources"));
        }
    }
    let id = match candidates.len() {
        0 => return Err(unknown_container(reference, known)),
        1 => candidates.pop_first().unwrap_or_default(),
        _ => {
            return Err(format!(
                "--container {reference} is ambiguous: it could be {}; give more of the id",
                listed(&candidates)
            ));
        }
    };
    let mut found = Found {
        wanted: Wanted::Container(reference.clone()),
        container: seen.get(&id).map(|runtime| (*runtime, id.clone())),
        pod_uid: None,
        cgroups: BTreeSet::new(),
        members: BTreeSet::new(),
        note,
    };
    for process in placed {
        for line in &process.lines {
            if let Some((_, line_id, pod_uid)) = container::parse_cgroup_path(&line.path)
                && line_id.eq_ignore_ascii_case(&id)
            {
                found.cgroups.insert(line.path.clone());
                found.members.insert(process.id);
                found.pod_uid = found.pod_uid.take().or(pod_uid);
            }
        }
    }
    if found.members.is_empty() {
        found.note = Some(format!(
            "container {} holds no process: nothing to free",
            short_id(&id)
        ));
    }
    Ok(found)
}

fn unknown_container(reference: &ContainerRef, known: &Known) -> String {
    let short = match reference {
        ContainerRef::Name(name)
            if name.chars().all(|c| c.is_ascii_hexdigit()) && name.len() < MIN_ID_PREFIX =>
        {
            format!("; an id prefix needs at least {MIN_ID_PREFIX} hex digits")
        }
        _ => String::new(),
    };
    format!(
        "--container {reference}: no process is in a container with that id, and no container has that name{}{short}",
        sources_read(known)
    )
}

/// What the sources could not say, for messages.
fn sources_read(known: &Known) -> String {
    if known.notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", known.notes.join("; "))
    }
}

fn find_pod(reference: &PodRef, placed: &[Placed], known: &Known) -> Result<Found, String> {
    let mut note = None;
    let uid = match reference {
        PodRef::Uid(uid) => uid.clone(),
        PodRef::Name { namespace, name } => {
            let key = (namespace.clone(), name.clone());
            let uids = known.pod_names.get(&key).cloned().unwrap_or_default();
            match uids.len() {
                0 => {
                    return Err(format!(
                        "--pod {reference}: no pod has that name{}; give its UID instead",
                        sources_read(known)
                    ));
                }
                1 => {
                    let uid = uids.first().cloned().unwrap_or_default();
                    note = Some(format!("pod UID {uid}"));
                    uid
                }
                _ => {
                    return Err(format!(
                        "--pod {reference} is ambiguous: pods {} have that name; give the UID",
                        listed(&uids)
                    ));
                }
            }
        }
    };
    let mut found = Found {
        wanted: Wanted::Pod(reference.clone()),
        container: None,
        pod_uid: Some(uid.clone()),
        cgroups: BTreeSet::new(),
        members: BTreeSet::new(),
        note,
    };
    for process in placed {
        for line in &process.lines {
            let in_pod = container::parse_cgroup_path(&line.path)
                .and_then(|(_, _, pod_uid)| pod_uid)
                .is_some_and(|pod_uid| pod_uid == uid);
            if in_pod {
                found.cgroups.insert(line.path.clone());
                found.members.insert(process.id);
            }
        }
    }
    if found.members.is_empty() {
        if !known.pod_uids.contains(&uid) && !matches!(reference, PodRef::Name { .. }) {
            return Err(format!(
                "--pod {reference}: no process is in a pod with that UID, and no source lists it{}",
                sources_read(known)
            ));
        }
        found.note = Some(format!("pod {uid} holds no process: nothing to free"));
    }
    Ok(found)
}

/// The first 12 characters of an id, as `docker ps` shows it.
pub fn short_id(id: &str) -> &str {
    id.get(..MIN_ID_PREFIX).unwrap_or(id)
}

fn listed(values: &BTreeSet<String>) -> String {
    let mut text: Vec<String> = values.iter().take(LISTED).cloned().collect();
    if values.len() > LISTED {
        text.push(format!("and {} more", values.len() - LISTED));
    }
    text.join(", ")
}

/// Every member of every value, for `Scope::members`.
pub fn all_members(found: &[Found]) -> BTreeSet<ProcessId> {
    found
        .iter()
        .flat_map(|found| found.members.iter().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_values_are_id_prefixes_of_twelve_hex_or_names() {
        assert_eq!(
            ContainerRef::parse("3F2A9C81D4E7"),
            Ok(ContainerRef::Id("3f2a9c81d4e7".to_string()))
        );
        assert_eq!(
            ContainerRef::parse("3f2a9c81d4e"),
            Ok(ContainerRef::Name("3f2a9c81d4e".to_string()))
        );
        assert_eq!(
            ContainerRef::parse("vllm"),
            Ok(ContainerRef::Name("vllm".to_string()))
        );
        assert!(ContainerRef::parse("").is_err());
        assert!(ContainerRef::parse("a\nb").is_err());
        assert!(ContainerRef::parse(&"a".repeat(65)).is_err());
    }

    #[test]
    fn pod_values_are_namespace_and_name_or_a_uid_in_either_spelling() {
        let uid = "0f6b7c1e-2d7a-4b8e-9c3d-5a1f2e3d4c5b";
        assert_eq!(PodRef::parse(uid), Ok(PodRef::Uid(uid.to_string())));
        assert_eq!(
            PodRef::parse("0F6B7C1E_2D7A_4B8E_9C3D_5A1F2E3D4C5B"),
            Ok(PodRef::Uid(uid.to_string()))
        );
        assert_eq!(
            PodRef::parse("ml/llama-0"),
            Ok(PodRef::Name {
                namespace: "ml".to_string(),
                name: "llama-0".to_string()
            })
        );
        let static_pod = "5f1c0a3e9b8d7c6a5f4e3d2c1b0a9f8e";
        assert_eq!(
            PodRef::parse(static_pod),
            Ok(PodRef::Uid(static_pod.to_string()))
        );
        for bad in [
            "llama-0",
            "/x",
            "ml/",
            "a/b/c",
            "0f6b7c1e-2d7a-4b8e-9c3d",
            "",
        ] {
            assert!(PodRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cgroup_values_are_absolute_and_never_the_root() {
        assert_eq!(
            CgroupRef::parse("/system.slice/x.scope/").map(|c| c.to_string()),
            Ok("/system.slice/x.scope".to_string())
        );
        for bad in ["/", "//", "relative/x", "/a/../b", "/a/./b", ""] {
            assert!(CgroupRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn malformed_cgroup_lines_are_skipped() {
        let lines = parse_lines(
            "0::/a\ngarbage\n4:memory:/b\n:x:/c\n5:pids:relative\n12:cpu,cpuacct:/d:e\n",
        );
        let paths: Vec<&str> = lines.iter().map(|line| line.path.as_str()).collect();
        assert_eq!(paths, ["/a", "/b", "/d:e"]);
        assert!(lines[0].is_v2());
        assert!(!lines[1].is_v2());
    }

    #[test]
    fn a_newline_in_a_cgroup_name_never_takes_a_process_out_of_its_real_ancestors() {
        // The cgroup /jobs/a holds one named "x\n0::/elsewhere".
        let lines = parse_lines("0::/jobs/a/x\n0::/elsewhere\n");
        assert!(lines.iter().any(|line| within(&line.path, "/jobs/a")));
    }

    #[test]
    fn a_path_under_a_mount_is_that_hierarchy_s_cgroup() {
        let mounts = parse_mounts(
            "30 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n\
             31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
             32 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
             33 30 0:29 /docker/abc /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n",
        );
        assert_eq!(mounts.len(), 3);
        let (path, mount) = cgroup_path(
            &CgroupRef::parse("/sys/fs/cgroup/unified/kubepods/pod1").expect("as written"),
            &mounts,
        )
        .expect("as written");
        assert_eq!(path, "/kubepods/pod1");
        assert!(mount.as_ref().expect("as written").controllers.is_none());
        let v2 = CgroupLine {
            hierarchy: "0".into(),
            controllers: String::new(),
            path: "/kubepods/pod1/c".into(),
        };
        let cpu = CgroupLine {
            hierarchy: "3".into(),
            controllers: "cpu,cpuacct".into(),
            path: "/kubepods/pod1/c".into(),
        };
        assert!(mount.as_ref().expect("as written").shows(&v2));
        assert!(!mount.as_ref().expect("as written").shows(&cpu));
        let (path, mount) = cgroup_path(
            &CgroupRef::parse("/sys/fs/cgroup/pids/x").expect("as written"),
            &mounts,
        )
        .expect("as written");
        assert_eq!(path, "/docker/abc/x");
        assert!(!mount.expect("as written").shows(&v2));
        assert!(
            cgroup_path(
                &CgroupRef::parse("/sys/fs/cgroup/unified").expect("as written"),
                &mounts
            )
            .is_err()
        );
        let (path, mount) =
            cgroup_path(&CgroupRef::parse("/kubepods").expect("as written"), &mounts)
                .expect("as written");
        assert_eq!((path.as_str(), mount), ("/kubepods", None));
    }

    #[test]
    fn within_is_the_cgroup_or_below_never_a_sibling_sharing_a_prefix() {
        assert!(within("/a/b", "/a/b"));
        assert!(within("/a/b/c", "/a/b"));
        assert!(!within("/a/bc", "/a/b"));
        assert!(!within("/a", "/a/b"));
    }

    #[test]
    fn mountinfo_escapes_are_read_back() {
        assert_eq!(unescape_octal(r"/mnt/a\040b\\"), "/mnt/a b\\\\");
        assert_eq!(unescape_octal(r"\134"), "\\");
    }
}
