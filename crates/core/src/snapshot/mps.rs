//! NVIDIA's Multi-Process Service: which holders are MPS clients, and the
//! server each goes through (docs/mps.md).
//!
//! Under MPS a control daemon (`nvidia-cuda-mps-control -d`) starts a server
//! (`nvidia-cuda-mps-server`, its child) that holds the GPU context; each
//! CUDA process whose pipe directory (`CUDA_MPS_PIPE_DIRECTORY`, else
//! `/tmp/nvidia-mps`) is a live daemon's becomes a client and reaches the
//! GPU through that daemon's server. Freeing a client is safe; taking the
//! server or the daemon takes every client down with it, so `select::Guard`
//! spares both by name, and `free --mps-server` is the deliberate stop.
//!
//! The rule, from what the kernel and the driver record:
//!
//! - the daemon and the server are known by name (argv[0]'s basename, or a
//!   comm of `nvidia-cuda-mps`, which the kernel cuts both names to);
//! - a daemon's pipe directory is the one in its environment; a server's is
//!   its parent daemon's;
//! - a GPU user is a client when the driver lists it as an MPS process
//!   (`GpuInfo::mps_clients`), or, where the driver lists none on its GPUs,
//!   when its own pipe directory is a live daemon's;
//! - its server is the one of that daemon (a server with its uid first, as
//!   the daemon starts one server per user, then one on a GPU it uses); a
//!   client the driver lists whose pipe directory cannot be read goes
//!   through the one server on its GPUs, if there is exactly one. Otherwise
//!   the server is not known (`null`): the client is still a client.
//!
//! Environments are read only where a daemon or a server runs, or the
//! driver lists an MPS process: a host without MPS pays nothing.

use std::collections::{BTreeMap, BTreeSet};

use crate::proc::{self, ProcessRecord};

use super::Snapshot;

/// The control daemon's program name.
pub const CONTROL: &str = "nvidia-cuda-mps-control";
/// The server's program name.
pub const SERVER: &str = "nvidia-cuda-mps-server";
/// What the kernel's 15-byte comm makes of both names.
pub const COMM: &str = "nvidia-cuda-mps";
/// The variable that names the pipe directory of a daemon and its clients.
pub(crate) const PIPE_VARIABLE: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// The pipe directory where the variable is not set.
pub(crate) const DEFAULT_PIPE_DIRECTORY: &str = "/tmp/nvidia-mps";

/// An MPS server as `free --mps-server` names it: by PID, or every server
/// on a GPU (`gpu:N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerRef {
    Pid(u32),
    Gpu(u32),
}

impl ServerRef {
    pub fn parse(text: &str) -> Result<ServerRef, String> {
        let bad = || {
            format!(
                "invalid MPS server '{text}': expected the server's PID (`gpureap status` lists it, flag mps_server) or gpu:N"
            )
        };
        match text.strip_prefix("gpu:") {
            Some(index) => index.parse().map(ServerRef::Gpu).map_err(|_| bad()),
            None => match text.parse::<u32>() {
                Ok(pid) if pid > 0 => Ok(ServerRef::Pid(pid)),
                _ => Err(bad()),
            },
        }
    }
}

impl std::fmt::Display for ServerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerRef::Pid(pid) => write!(f, "{pid}"),
            ServerRef::Gpu(index) => write!(f, "gpu:{index}"),
        }
    }
}

/// A process's part in MPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Control,
    Server,
    Client,
}

impl Role {
    /// The name JSON gives it (`holders[].mps.role`).
    pub fn code(self) -> &'static str {
        match self {
            Role::Control => "control",
            Role::Server => "server",
            Role::Client => "client",
        }
    }
}

/// The MPS role a process's name says it has (daemon or server), if any:
/// argv[0]'s basename, else a comm of `nvidia-cuda-mps` (either, cut to 15
/// bytes: the daemon, the more cautious reading, unless the command line
/// says otherwise). Clients have no name of their own.
pub fn role_by_name(record: &ProcessRecord) -> Option<Role> {
    match record.program() {
        CONTROL => Some(Role::Control),
        SERVER => Some(Role::Server),
        _ if record.comm == COMM => Some(Role::Control),
        _ => None,
    }
}

/// What a holder is to MPS (`Details::mps`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsLink {
    pub role: Role,
    /// The pipe directory it belongs to; `None` where its environment (a
    /// server: its daemon's) could not be read.
    pub pipe_directory: Option<String>,
    /// The control daemon: a server's parent; a client's, the daemon of its
    /// pipe directory.
    pub daemon: Option<u32>,
    /// A client's server; `None` for a server or daemon, or where it cannot
    /// be told (the rule above).
    pub server: Option<u32>,
    /// Whether the driver lists it as an MPS client on a GPU.
    pub listed_by_driver: bool,
}

/// A process's pipe directory: its `CUDA_MPS_PIPE_DIRECTORY`, the default
/// where it sets none, `None` where its environment cannot be read.
fn pipe_directory(pid: u32) -> Option<String> {
    let environ = proc::read_small(&format!("/proc/{pid}/environ"), u64::MAX).ok()?;
    let found = environ.split(|&byte| byte == 0).find_map(|entry| {
        let value = entry
            .strip_prefix(PIPE_VARIABLE.as_bytes())?
            .strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(value).into_owned())
    });
    Some(normalise(
        found
            .filter(|value| !value.is_empty())
            .as_deref()
            .unwrap_or(DEFAULT_PIPE_DIRECTORY),
    ))
}

/// A directory as compared: without trailing slashes.
fn normalise(path: &str) -> String {
    match path.trim_end_matches('/') {
        "" => "/".to_string(),
        trimmed => trimmed.to_string(),
    }
}

/// The daemons and servers of one snapshot, as found by name.
#[derive(Default)]
struct Found {
    /// Daemon PID → its pipe directory.
    daemons: BTreeMap<u32, Option<String>>,
    /// Server PID → (its daemon, its pipe directory).
    servers: BTreeMap<u32, (Option<u32>, Option<String>)>,
}

/// Finds daemons and servers by name, reading the command line of a
/// process whose comm is `nvidia-cuda-mps` (both names, cut) where the scan
/// left it unread, so that the guard and the report see which it is.
fn find(snapshot: &mut Snapshot) -> Found {
    let mut found = Found::default();
    let mut servers = Vec::new();
    for (&pid, record) in snapshot.processes.iter_mut() {
        if record.comm != COMM && role_by_name(record).is_none() {
            continue;
        }
        if record.cmdline.is_empty() {
            record.cmdline = proc::cmdline(pid);
        }
        match role_by_name(record) {
            Some(Role::Control) => {
                found.daemons.insert(pid, pipe_directory(pid));
            }
            Some(Role::Server) => servers.push((pid, record.ppid)),
            _ => {}
        }
    }
    for (pid, ppid) in servers {
        let (daemon, pipe) = match found.daemons.get(&ppid) {
            Some(pipe) => (Some(ppid), pipe.clone()),
            None => (None, pipe_directory(pid)),
        };
        found.servers.insert(pid, (daemon, pipe));
    }
    found
}

/// Fills `Details::mps` for the holders that are part of MPS (the rule in
/// the module's comment), from the MPS clients each answered GPU's answer
/// listed (`GpuInfo::mps_clients`). Called once a snapshot's details are read.
pub(super) fn attach(snapshot: &mut Snapshot, listed: BTreeMap<u32, BTreeSet<u32>>) {
    let found = find(snapshot);
    // Only clients count as the driver's MPS list: a driver that listed a
    // server there too must not make "listed" mean "everyone".
    let listed: BTreeMap<u32, BTreeSet<u32>> = listed
        .into_iter()
        .map(|(gpu, pids)| {
            let clients = pids
                .into_iter()
                .filter(|pid| !found.servers.contains_key(pid) && !found.daemons.contains_key(pid))
                .collect::<BTreeSet<u32>>();
            (gpu, clients)
        })
        .filter(|(_, pids)| !pids.is_empty())
        .collect();
    if found.daemons.is_empty() && found.servers.is_empty() && listed.is_empty() {
        return;
    }
    let mut links: BTreeMap<u32, MpsLink> = BTreeMap::new();
    for (&pid, pipe) in &found.daemons {
        links.insert(pid, link(Role::Control, pipe.clone(), None, None));
    }
    for (&pid, (daemon, pipe)) in &found.servers {
        links.insert(pid, link(Role::Server, pipe.clone(), *daemon, None));
    }
    for pid in snapshot.holders() {
        if links.contains_key(&pid) || !snapshot.is_gpu_user(pid) {
            continue;
        }
        if let Some(client) = client(snapshot, &found, &listed, pid) {
            links.insert(pid, client);
        }
    }
    for (pid, link) in links {
        if let Some(details) = snapshot.details.get_mut(&pid) {
            details.mps = Some(link);
        }
    }
}

fn link(role: Role, pipe: Option<String>, daemon: Option<u32>, server: Option<u32>) -> MpsLink {
    MpsLink {
        role,
        pipe_directory: pipe,
        daemon,
        server,
        listed_by_driver: false,
    }
}

/// A GPU user as an MPS client, with its server, if it is one.
fn client(
    snapshot: &Snapshot,
    found: &Found,
    listed: &BTreeMap<u32, BTreeSet<u32>>,
    pid: u32,
) -> Option<MpsLink> {
    let gpus = snapshot.gpus_used_by(pid);
    let by_driver = gpus
        .iter()
        .any(|gpu| listed.get(gpu).is_some_and(|pids| pids.contains(&pid)));
    // The driver's list settles it where it lists anyone on these GPUs.
    let driver_says = gpus.iter().any(|gpu| listed.contains_key(gpu));
    if found.daemons.is_empty() && !by_driver {
        return None;
    }
    let pipe = pipe_directory(pid);
    let daemon = pipe.as_ref().and_then(|pipe| {
        found
            .daemons
            .iter()
            .find(|(_, theirs)| theirs.as_ref() == Some(pipe))
            .map(|(&daemon, _)| daemon)
    });
    if !by_driver && (driver_says || daemon.is_none()) {
        return None;
    }
    let uid = snapshot.processes.get(&pid).and_then(|record| record.uid);
    let candidates: Vec<u32> = found
        .servers
        .iter()
        .filter(|(_, (_, theirs))| match &pipe {
            Some(pipe) => theirs.as_ref() == Some(pipe),
            None => true,
        })
        .map(|(&server, _)| server)
        .filter(|&server| !snapshot.gpus_used_by(server).is_disjoint(&gpus) || pipe.is_some())
        .collect();
    let server = only(&candidates, |server| {
        snapshot
            .processes
            .get(&server)
            .is_some_and(|record| record.uid == uid)
            && !snapshot.gpus_used_by(server).is_disjoint(&gpus)
    })
    .or_else(|| {
        only(&candidates, |server| {
            !snapshot.gpus_used_by(server).is_disjoint(&gpus)
        })
    })
    .or_else(|| (candidates.len() == 1).then(|| candidates[0]));
    Some(MpsLink {
        role: Role::Client,
        pipe_directory: pipe,
        daemon,
        server,
        listed_by_driver: by_driver,
    })
}

/// The one candidate that passes `test`, if exactly one does.
fn only(candidates: &[u32], test: impl Fn(u32) -> bool) -> Option<u32> {
    let mut passing = candidates.iter().copied().filter(|&pid| test(pid));
    match (passing.next(), passing.next()) {
        (Some(pid), None) => Some(pid),
        _ => None,
    }
}

impl Snapshot {
    /// What this holder is to MPS, if anything.
    pub fn mps(&self, pid: u32) -> Option<&MpsLink> {
        self.details.get(&pid)?.mps.as_ref()
    }

    /// The MPS servers on a GPU (by the driver's list), by PID.
    pub fn mps_servers_on(&self, gpu: u32) -> Vec<u32> {
        self.mps_linked(|link| link.role == Role::Server)
            .filter(|&pid| self.gpus_used_by(pid).contains(&gpu))
            .collect()
    }

    /// The clients that go through this server, by PID.
    pub(crate) fn mps_clients_of(&self, server: u32) -> Vec<u32> {
        self.mps_linked(|link| link.role == Role::Client && link.server == Some(server))
            .collect()
    }

    /// The PIDs whose link to MPS is of this kind.
    fn mps_linked(&self, wanted: impl Fn(&MpsLink) -> bool) -> impl Iterator<Item = u32> {
        self.details
            .iter()
            .filter(move |(_, details)| details.mps.as_ref().is_some_and(&wanted))
            .map(|(&pid, _)| pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_refs() {
        assert_eq!(ServerRef::parse("5120"), Ok(ServerRef::Pid(5120)));
        assert_eq!(ServerRef::parse("gpu:3"), Ok(ServerRef::Gpu(3)));
        for bad in ["0", "-1", "gpu:", "gpu:x", "server", ""] {
            assert!(ServerRef::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(ServerRef::Gpu(3).to_string(), "gpu:3");
    }

    #[test]
    fn pipe_directories_compare_without_trailing_slashes() {
        assert_eq!(normalise("/tmp/nvidia-mps/"), "/tmp/nvidia-mps");
        assert_eq!(normalise("/"), "/");
    }
}
