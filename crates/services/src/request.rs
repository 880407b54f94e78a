//! What a front end is asked, typed, and its resolution against this host.
//!
//! The entry (`config`) makes each request from the command line once;
//! the front ends take it: a command here (`status`, `free`, `wait`,
//! `reset`, `check`, `dump`, `top`) resolves it against the driver and
//! /proc (`gpu_names`, `gpus`, `free`, `wait`, `dump_scope`), and `fleet`
//! sends the same request to each host of `-H`, which resolves it there.
//! A mistake in what was asked is a `UsageError` (exit 2).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use regex::Regex;

use crate::container;
use crate::members::{self, Found, Wanted};
use crate::reap::Options;
use crate::select::{Guard, Scope};
use crate::snapshot::Snapshot;
use crate::snapshot::mps::{self, ServerRef};
use crate::supervision::StaleRun;
use crate::units::GpuList;

/// `--host-root` and `--kubelet-socket` as given: checked and made into
/// `container::Sources` on the host that reads them (`sources`); `-H` passes
/// them on as they are (`fleet::commands::sources_flags`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourcesRequest {
    pub host_root: Option<std::path::PathBuf>,
    pub kubelet_socket: Option<std::path::PathBuf>,
}

impl SourcesRequest {
    /// The node's sources: `--host-root` must be a folder (a typo would
    /// otherwise make every source silently absent); the kubelet's socket may
    /// be missing, which the report notes.
    pub fn sources(&self) -> Result<container::Sources, UsageError> {
        let host_root = self
            .host_root
            .clone()
            .unwrap_or_else(|| std::path::PathBuf::from("/"));
        if !host_root.is_dir() {
            return Err(UsageError(format!(
                "--host-root {}: not a folder; give where the node's root is mounted (e.g. /host)",
                host_root.display()
            )));
        }
        Ok(container::Sources::new(
            host_root,
            self.kubelet_socket.clone(),
        ))
    }
}

/// `--grace`, `--timeout` and `--protect` typed (`cli::SignalArgs`): the
/// one conversion for `free` (here and on each host of `-H`), the frees
/// `top` starts and `reap`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signalling {
    /// SIGTERM, the grace, SIGSTOP+SIGKILL, then verification: the one
    /// formula (`reap::Options`).
    pub options: Options,
    /// Names spared besides the fixed ones (`Guard::for_this_process`).
    pub protect: Vec<String>,
}

/// A mistake in the command line; printed as is, exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

impl From<String> for UsageError {
    fn from(message: String) -> Self {
        UsageError(message)
    }
}

/// Bad usage or input is its own class in the exit table.
impl From<UsageError> for crate::exit::Failure {
    fn from(error: UsageError) -> Self {
        crate::exit::Failure::new(crate::exit::Exit::Usage, error)
    }
}

/// The driver `--backend` names (`driver::open`); one that cannot be
/// opened is bad input.
pub fn open_driver(
    choice: &crate::driver::BackendChoice,
) -> Result<Box<dyn crate::driver::Driver>, UsageError> {
    let driver = crate::driver::open(choice).map_err(UsageError)?;
    tracing::debug!(backend = driver.describe(), "driver opened");
    Ok(driver)
}

/// `open_driver` for a report that says itself that there is no driver.
pub fn open_driver_quietly(
    choice: &crate::driver::BackendChoice,
) -> Result<Box<dyn crate::driver::Driver>, UsageError> {
    let driver = crate::driver::open_quietly(choice).map_err(UsageError)?;
    tracing::debug!(backend = driver.describe(), "driver opened");
    Ok(driver)
}

/// The GPUs `--gpu` is resolved against: the driver's count, none where it
/// cannot tell.
pub fn gpu_count(driver: &dyn crate::driver::Driver) -> u32 {
    driver.gpu_count().unwrap_or(0)
}

/// `--gpu` against the driver's count, refusing a list that names no GPU
/// here (`None`: every GPU).
pub fn named_gpus(lists: &[GpuList], gpu_count: u32) -> Result<Option<BTreeSet<u32>>, UsageError> {
    let gpus = gpus(lists, gpu_count)?;
    if gpus.as_ref().is_some_and(BTreeSet::is_empty) {
        return Err(UsageError(
            "--gpu names no GPU: the driver reports none on this host (see `gpureap status`)"
                .to_string(),
        ));
    }
    Ok(gpus)
}

/// `--pid`s by identity: each a live process the guard does not spare
/// (gpureap, its ancestors, PID 1, kernel threads); a refusal ends with
/// `what_then`, after `joint`.
fn named_pids(
    pids: &[u32],
    snapshot: &Snapshot,
    guard: &Guard,
    what_then: &str,
    joint: &str,
) -> Result<BTreeSet<crate::proc::ProcessId>, UsageError> {
    let mut named = BTreeSet::new();
    for &pid in pids {
        let Some(record) = snapshot.processes.get(&pid) else {
            return Err(UsageError(format!(
                "no process with PID {pid} (it may have exited already); see `gpureap status`"
            )));
        };
        if let Some(reason) = guard.spare_reason(snapshot, record, true) {
            return Err(UsageError(format!(
                "refusing --pid {pid}: it is {reason}{joint}{what_then}"
            )));
        }
        named.insert(record.id);
    }
    Ok(named)
}

/// `--gpu` lists that name GPUs by UUID (`GPU-…`) or MIG instances (`0:1`,
/// `MIG-…`), resolved against the driver (`driver::mig::resolve`): the
/// driver the command then works through (the instances' view where some
/// are named, docs/mig.md) and the lists as GPU indexes, which every rule
/// below (`gpus`, `named_gpus`) takes as before. Lists of indexes pass
/// unchanged; a name not on this host is bad input.
pub fn gpu_names(
    driver: Box<dyn crate::driver::Driver>,
    lists: &[GpuList],
) -> Result<(Box<dyn crate::driver::Driver>, Vec<GpuList>), UsageError> {
    let Some(GpuList::Refs(refs)) = GpuList::union(lists) else {
        return Ok((driver, lists.to_vec()));
    };
    let resolved = crate::driver::mig::resolve(driver.as_ref(), &refs)
        .map_err(|error| UsageError(format!("--gpu {}: {error}", crate::units::GpuRefs(&refs))))?;
    let indexes = GpuList::Some(resolved.indexes());
    Ok((
        crate::driver::mig::InstanceView::wrap(driver, resolved.instances),
        vec![indexes],
    ))
}

/// Whether the `--gpu` lists name a GPU only the driver can resolve (a
/// UUID, a MIG instance).
pub fn names_by_driver(lists: &[GpuList]) -> bool {
    lists.iter().any(|list| matches!(list, GpuList::Refs(_)))
}

/// Whether the `--gpu` lists name a MIG instance (`reset` refuses them: a
/// reset is of the whole GPU).
pub fn names_instances(lists: &[GpuList]) -> Option<String> {
    let Some(GpuList::Refs(refs)) = GpuList::union(lists) else {
        return None;
    };
    let instances: Vec<crate::units::GpuRef> = refs
        .into_iter()
        .filter(|gpu| {
            matches!(
                gpu,
                crate::units::GpuRef::Instance(..) | crate::units::GpuRef::MigUuid(_)
            )
        })
        .collect();
    (!instances.is_empty()).then(|| crate::units::GpuRefs(&instances).to_string())
}

/// What `check` was asked: the GPUs, the Xids that make a problem, where
/// the node's containers are read.
#[derive(Debug, Clone)]
pub struct CheckRequest {
    pub gpu: Vec<GpuList>,
    pub drain_xids: BTreeSet<u32>,
    pub sources: SourcesRequest,
}

/// What `reset` was asked: whole GPUs, each reset or (`--plan`) planned.
#[derive(Debug, Clone)]
pub struct ResetRequest {
    pub gpu: Vec<GpuList>,
    pub plan: bool,
    pub json: bool,
}

/// Resolves the `--gpu` lists (their union) against the GPUs the driver
/// reports; `None` when no list was given.
pub fn gpus(lists: &[GpuList], gpu_count: u32) -> Result<Option<BTreeSet<u32>>, UsageError> {
    match GpuList::union(lists) {
        None => Ok(None),
        Some(list) => Ok(Some(list.resolve(gpu_count)?)),
    }
}

/// What `status` was asked: the one config of `status`, here and with `-H`.
#[derive(Debug, Clone)]
pub struct StatusRequest {
    pub gpu: Vec<GpuList>,
    pub tree: bool,
    pub json: bool,
    pub prometheus: bool,
    pub per_process: bool,
    /// Every process's descriptors read (`status --monitors`).
    pub monitors: bool,
    pub sources: SourcesRequest,
}

/// What `free` was asked, with everything that needs neither the driver nor
/// /proc nor this host already checked (the scope is not empty). The one
/// config of `free`: a local `free` resolves it against this host
/// (`FreeRequest::users`, then `free`); `free -H` sends it to each host
/// (`fleet::commands::free_flags`), which resolves it there.
#[derive(Debug, Clone)]
pub struct FreeRequest {
    pub gpu: Vec<GpuList>,
    pub pid: Vec<u32>,
    pub patterns: Vec<Regex>,
    pub user: Vec<String>,
    pub orphans: bool,
    pub stale_runs: bool,
    /// `--container`, `--pod`, `--cgroup`, in that order (`members::find`
    /// resolves them on the host that frees).
    pub cgroups: Vec<Wanted>,
    /// `--mps-server`: servers to stop on purpose (resolved on the host
    /// that frees: `mps_servers`).
    pub mps_server: Vec<ServerRef>,
    pub all: bool,
    /// The grace and deadline of this free: the one formula, here and on
    /// each host of `-H`, whose per-host limit is its `longest`.
    pub options: Options,
    pub protect: Vec<String>,
    pub dry_run: bool,
    pub yes: bool,
    pub json: bool,
    pub sources: SourcesRequest,
}

impl FreeRequest {
    /// The uids of `--user`, resolved on this host (a host of `-H` resolves
    /// the names itself).
    pub fn users(&self) -> Result<BTreeSet<u32>, UsageError> {
        uids_of(&self.user)
    }
}

/// The uids of `--user` names (or numbers), resolved on this host.
pub fn uids_of(names: &[String]) -> Result<BTreeSet<u32>, UsageError> {
    let mut uids = BTreeSet::new();
    for name in names {
        let uid = match name.parse::<u32>() {
            Ok(uid) => uid,
            Err(_) => uzers::get_user_by_name(name)
                .map(|user| user.uid())
                .ok_or_else(|| UsageError(format!("no user named '{name}' on this host")))?,
        };
        uids.insert(uid);
    }
    Ok(uids)
}

/// `free` needs a scope: here, and before a fleet asks any host.
pub fn check_scope(request: &FreeRequest) -> Result<(), UsageError> {
    let no_scope = request.gpu.is_empty()
        && request.pid.is_empty()
        && request.patterns.is_empty()
        && request.user.is_empty()
        && !request.orphans
        && !request.stale_runs
        && request.cgroups.is_empty()
        && request.mps_server.is_empty()
        && !request.all;
    if no_scope {
        return Err(UsageError(
                "refusing to free without a scope: give one or more of --gpu LIST, --pid PID, --match REGEX, --user NAME, --orphans, --stale-runs, --container ID, --pod NAMESPACE/NAME, --cgroup PATH, --mps-server PID, --all (try --dry-run first)"
                    .to_string(),
            ));
    }
    Ok(())
}

pub struct FreeConfig {
    pub scope: Scope,
    pub options: Options,
}

/// Builds the scope for `free` against the host: GPU indexes must exist,
/// named PIDs must be live processes that may be signalled. `stale_runs` are
/// the runs found for `--stale-runs`, `uids` those of `--user` on this host,
/// `members` what `--container`, `--pod` and `--cgroup` resolved to here.
pub fn free(
    request: &FreeRequest,
    uids: BTreeSet<u32>,
    gpu_count: u32,
    snapshot: &Snapshot,
    guard: &Guard,
    stale_runs: Option<&[StaleRun]>,
    members: Option<&[Found]>,
) -> Result<FreeConfig, UsageError> {
    let gpus = named_gpus(&request.gpu, gpu_count)?;
    let pids = named_pids(
        &request.pid,
        snapshot,
        guard,
        "and neither it nor what runs under it may be signalled",
        ", ",
    )?;
    Ok(FreeConfig {
        scope: Scope {
            gpus,
            pids,
            patterns: request.patterns.clone(),
            uids,
            orphans: request.orphans,
            all: request.all,
            stale_runs: stale_runs.map(|runs| {
                runs.iter()
                    .flat_map(|run| run.members.iter().copied())
                    .collect()
            }),
            members: members.map(members::all_members),
            job: None,
            min_age: None,
            supervisor_gone: false,
            within: None,
            containers_gone: if request.orphans {
                crate::select::gone_containers(snapshot)
            } else {
                BTreeMap::new()
            },
            mps_servers: mps_servers(&request.mps_server, gpu_count, snapshot)?,
        },
        options: request.options,
    })
}

/// `--mps-server` against this host, by identity: a PID must be a live MPS
/// server (`nvidia-cuda-mps-server`), and a GPU must exist and have one.
fn mps_servers(
    named: &[ServerRef],
    gpu_count: u32,
    snapshot: &Snapshot,
) -> Result<BTreeSet<crate::proc::ProcessId>, UsageError> {
    let mut servers = BTreeSet::new();
    for &wanted in named {
        let pids = match wanted {
            ServerRef::Pid(pid) => {
                let Some(record) = snapshot.processes.get(&pid) else {
                    return Err(UsageError(format!(
                        "--mps-server {pid}: no process with PID {pid} (it may have exited already); see `gpureap status`"
                    )));
                };
                if mps::role_by_name(record) != Some(mps::Role::Server) {
                    return Err(UsageError(format!(
                        "--mps-server {pid}: PID {pid} ({}) is not an MPS server (nvidia-cuda-mps-server); `gpureap status` flags servers mps_server",
                        crate::units::Field(record.program())
                    )));
                }
                vec![pid]
            }
            ServerRef::Gpu(index) => {
                if index >= gpu_count {
                    return Err(UsageError(format!(
                        "--mps-server gpu:{index}: there is no GPU {index} (this host has {gpu_count})"
                    )));
                }
                let found = snapshot.mps_servers_on(index);
                if found.is_empty() {
                    return Err(UsageError(format!(
                        "--mps-server gpu:{index}: GPU {index} has no MPS server"
                    )));
                }
                found
            }
        };
        servers.extend(
            pids.iter()
                .filter_map(|pid| snapshot.processes.get(pid))
                .map(|record| record.id),
        );
    }
    Ok(servers)
}

/// What `top` was asked: the view's refresh and the options of the frees it starts.
#[derive(Debug, Clone)]
pub struct TopRequest {
    pub readonly: bool,
    pub interval: Duration,
    pub protect: Vec<String>,
    /// The frees started from the view: `free`'s own formula.
    pub options: Options,
    /// `--json`: no view, a document a line (`top::stream`).
    pub json: bool,
}

/// What `wait` was asked: the one config of `wait`, here and with `-H`.
#[derive(Debug, Clone)]
pub struct WaitRequest {
    pub gpu: Vec<GpuList>,
    pub below: u64,
    pub timeout: Duration,
    pub keep_waiting: bool,
    pub json: bool,
}

pub struct WaitConfig {
    pub gpus: BTreeSet<u32>,
    pub below: u64,
    pub timeout: Duration,
    /// `--keep-waiting`: wait out the timeout even where memory held by no
    /// process keeps a GPU at or above `below`.
    pub keep_waiting: bool,
}

pub fn wait(request: &WaitRequest, gpu_count: u32) -> Result<WaitConfig, UsageError> {
    let gpus = gpus(&request.gpu, gpu_count)?.unwrap_or_default();
    if gpus.is_empty() {
        return Err(UsageError(
            "no GPUs to wait for: the driver reports none (is this a GPU host? see `gpureap status`)".to_string(),
        ));
    }
    Ok(WaitConfig {
        gpus,
        below: request.below,
        timeout: request.timeout,
        keep_waiting: request.keep_waiting,
    })
}

/// What `gpureap dump` was asked, typed; its scope is made against the
/// host (`dump_scope`).
#[derive(Debug, Clone)]
pub struct DumpRequest {
    pub pid: Vec<u32>,
    pub patterns: Vec<Regex>,
    pub gpu: Vec<GpuList>,
    pub out: std::path::PathBuf,
}

/// The scope of a dump against the host: GPU indexes must exist, named
/// PIDs must be live processes the guard does not spare (gpureap, its
/// ancestors, PID 1, kernel threads), as `free`'s.
pub fn dump_scope(
    request: &DumpRequest,
    gpu_count: u32,
    snapshot: &Snapshot,
    guard: &Guard,
) -> Result<Scope, UsageError> {
    let gpus = named_gpus(&request.gpu, gpu_count)?;
    let pids = named_pids(
        &request.pid,
        snapshot,
        guard,
        "name the server's own processes",
        "; ",
    )?;
    Ok(Scope {
        gpus,
        pids,
        patterns: request.patterns.clone(),
        ..Scope::default()
    })
}
