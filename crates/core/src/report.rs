//! Rendering: tables for people, versioned JSON for programs (docs/json.md).
//! Reports go to stdout as one stream; diagnostics go to stderr elsewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use comfy_table::presets::NOTHING;
use comfy_table::{Cell, CellAlignment, Table};
use serde::Serialize;

use crate::container::Container;
use crate::driver::evidence::Evidence;
use crate::driver::{Activity, DriverError};
use crate::exit::Exit;
use crate::members::{Found, short_id};

pub mod mig;
use crate::proc::Unreadable;
use crate::reap::{Fate, FreeReport, GpuOutcome, Handled};
use crate::select::Because;
use crate::select::{DEFAULT_PROTECTED, protected_name};
use crate::signal::{Delivery, Sig};
use crate::snapshot::mps::Role as MpsRole;
use crate::snapshot::{Descriptors, Snapshot};
use crate::tree::ProcessTree;
use crate::units::{Age, Bytes, Elapsed, Field, GpuRanges, MaybeBytes, one_line, short};
use crate::verify::Reason;
use crate::wait::WaitGpu;

/// Bumped on any incompatible change to a JSON document's shape.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Serialize)]
pub(crate) struct StatusJson<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    pub backend: &'a str,
    pub taken_at_unix_ms: u64,
    pub driver_error: Option<&'a DriverError>,
    pub scan: ScanJson<'a>,
    pub gpus: Vec<GpuJson>,
    pub holders: Vec<HolderJson>,
    /// What the node's container sources could not tell (a kubelet that
    /// did not answer, a runtime's state that could not be read).
    pub container_notes: &'a [String],
    pub visibility: VisibilityJson,
}

/// What this gpureap can see of the holders the driver lists (docs/json.md).
#[derive(Debug, Serialize)]
pub(crate) struct VisibilityJson {
    /// Whether it runs in the host's PID namespace; `false` in a container
    /// without the host's PIDs; `null` when it cannot tell.
    pub host_pids: Option<bool>,
    /// The PIDs the driver lists that are no process here (`hidden`).
    pub hidden: Vec<u32>,
    /// Why they are hidden and what to do, as `status` says it; `null` when
    /// none is.
    pub note: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ScanJson<'a> {
    pub processes: usize,
    pub complete: bool,
    pub unreadable: Vec<UnreadableJson<'a>>,
    /// Whose descriptors were read: `all`, or `listed` (`Descriptors`).
    pub descriptors: &'static str,
}

#[derive(Debug, Serialize)]
pub struct GpuJson {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub memory_total: Option<u64>,
    pub memory_used: Option<u64>,
    /// What the driver sets aside, in none of the figures above (NVML's v2
    /// `reserved`; its v1 `used` counts it as used).
    pub memory_reserved: Option<u64>,
    pub memory_unattributed: Option<u64>,
    /// What the GPU is doing (`Activity`); each `null` where the driver
    /// does not say, or it was not read.
    pub utilization_percent: Option<u32>,
    pub temperature_celsius: Option<u32>,
    pub power_draw_watts: Option<f64>,
    pub power_limit_watts: Option<f64>,
    /// Whether `memory_unattributed` makes the GPU held: the one rule
    /// (`Snapshot::held_by_no_process`), which `status -H` reads.
    /// `null` where it cannot be told: unseen from a PID namespace of its own.
    pub held_by_no_process: Option<bool>,
    /// What the one rule calls `memory_unattributed`: `bookkeeping`,
    /// `held_by_no_process` or `unseen` (`UnattributedKind`).
    pub unattributed_kind: Option<&'static str>,
    pub error: Option<DriverError>,
    pub processes: Vec<GpuProcessJson>,
    /// The driver's hardware evidence for this GPU (Xids since boot, ECC,
    /// row remapping, recovery action); `None` where it was not read.
    pub evidence: Option<Evidence>,
    /// What the evidence implies, one sentence each (`Evidence::advice`).
    pub advice: Vec<String>,
    /// Whether the GPU is in MIG mode; `null` where the driver does not say.
    pub mig_mode: Option<bool>,
    /// Its MIG instances, each judged on its own (docs/mig.md).
    pub instances: Vec<mig::InstanceJson>,
}

#[derive(Debug, Serialize)]
pub struct GpuProcessJson {
    pub pid: u32,
    pub memory: Option<u64>,
    pub listed_by_driver: bool,
    pub node_open: bool,
    /// Its SM utilization on this GPU over the last second
    /// (`Snapshot::sm_percent`); `null` where the driver gives none.
    pub sm_utilization_percent: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct HolderJson {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub pgid: Option<u32>,
    pub sid: Option<u32>,
    pub uid: Option<u32>,
    pub user: Option<String>,
    pub state: Option<String>,
    pub wchan: Option<String>,
    pub start_time_ticks: Option<u64>,
    pub age_seconds: Option<u64>,
    pub age_ms: Option<u64>,
    pub comm: Option<String>,
    pub cmdline: Option<String>,
    pub cgroup: Option<String>,
    /// The container (and pod) it runs in; `null` when in none.
    pub container: Option<ContainerJson>,
    pub gpus: Vec<HolderGpuJson>,
    pub control_node: bool,
    pub flags: Vec<&'static str>,
    /// Why it counts as orphaned, where it does.
    pub orphan: Option<String>,
    /// The protected name it answers to: `free` leaves it alone unless it
    /// is named with `--pid`.
    pub protected: Option<String>,
    /// Set when it was started under `gpureap run`.
    pub supervisor: Option<SupervisorJson>,
    /// Its part in MPS (docs/mps.md); `null` when it has none.
    pub mps: Option<MpsJson>,
}

/// A holder's part in MPS (`holders[].mps`, docs/json.md).
#[derive(Debug, Serialize)]
pub struct MpsJson {
    /// `control`, `server` or `client`.
    pub role: &'static str,
    /// The server a client goes through; `null` for a server, or where it
    /// cannot be told.
    pub server: Option<u32>,
    /// The control daemon: a server's parent, a client's by pipe directory.
    pub daemon: Option<u32>,
    pub pipe_directory: Option<String>,
    /// Whether the driver lists it as an MPS client.
    pub listed_by_driver: bool,
}

/// `container_label` of a holder's container (the notes, `check`).
pub fn label_of(container: &Container) -> String {
    ContainerJson::of(container).label()
}

/// A holder's container (docs/json.md): what its cgroup path says, and the
/// names the node's sources give (`null` until they do).
#[derive(Debug, Serialize)]
pub struct ContainerJson {
    pub runtime: &'static str,
    pub id: String,
    pub pod_uid: Option<String>,
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub local_pid: Option<u32>,
    /// The source that says the container or its pod no longer exists
    /// (`"kubelet pod-resources"`, `"/var/lib/docker/containers"`, ...);
    /// `null` while it exists or no source can tell.
    pub gone: Option<String>,
    /// GPUs it uses that the kubelet never allocated to its container.
    pub unrequested_gpus: Vec<u32>,
}

impl ContainerJson {
    fn of(container: &Container) -> ContainerJson {
        ContainerJson {
            runtime: container.runtime.name(),
            id: container.id.clone(),
            pod_uid: container.pod_uid.clone(),
            pod: container.pod.clone(),
            namespace: container.namespace.clone(),
            name: container.name.clone(),
            local_pid: container.local_pid,
            gone: match &container.presence {
                crate::container::Presence::Gone { source } => Some(source.clone()),
                _ => None,
            },
            unrequested_gpus: container.unrequested_gpus.clone(),
        }
    }

    /// The table's and the tree's label: `namespace/pod` when the sources
    /// named the pod, then the container's name, else its runtime and
    /// short id (`docker:3f4a8e1b2c9d`).
    pub fn label(&self) -> String {
        container_label(
            self.runtime,
            &self.id,
            self.pod.as_deref(),
            self.namespace.as_deref(),
            self.name.as_deref(),
        )
    }
}

/// A container as a table cell or a label: `namespace/pod` when its pod is
/// named, then its name, else its runtime and short id
/// (`containerd:3f4a8e1b2c9d`). `status` and `status -H` (from a host's
/// JSON) say it alike.
pub fn container_label(
    runtime: &str,
    id: &str,
    pod: Option<&str>,
    namespace: Option<&str>,
    name: Option<&str>,
) -> String {
    let container = match name {
        Some(name) => name.to_string(),
        None => format!("{runtime}:{}", id.get(..12).unwrap_or(id)),
    };
    match (namespace, pod) {
        (Some(namespace), Some(pod)) => format!("{namespace}/{pod} {container}"),
        (None, Some(pod)) => format!("{pod} {container}"),
        _ => container,
    }
}

#[derive(Debug, Serialize)]
pub struct SupervisorJson {
    /// The supervising gpureap's PID.
    pub pid: u32,
    /// Why it no longer supervises this process; `null` while it does.
    pub gone: Option<String>,
}

/// Read back too: `top -H` places a host's holders from its document.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct HolderGpuJson {
    pub index: u32,
    pub memory: Option<u64>,
    /// In the driver's process list for this GPU: it has a context there.
    pub listed_by_driver: bool,
    /// Has this GPU's device node open, as every CUDA process has every GPU's.
    #[serde(default)]
    pub node_open: bool,
    /// The MIG instances of this GPU whose lists have it (their device
    /// indexes: `0:1` is `index` 0, instance 1); empty where MIG is off.
    #[serde(default)]
    pub mig_instances: Vec<u32>,
    /// Its SM utilization on this GPU (`Snapshot::sm_percent`).
    pub sm_utilization_percent: Option<u32>,
}

/// Whether a holder belongs in a report on `gpus`: the driver lists it on
/// one of them, or it has one's node open where that is all there is to go
/// on: no driver answered for that GPU, or it is a monitor, which watches
/// what it opens. A process with a context elsewhere that merely has the
/// node open does not use the GPU.
fn shown(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>, pid: u32) -> bool {
    let Some(set) = gpus else {
        return true;
    };
    let monitor = snapshot.is_monitor(pid);
    snapshot
        .gpus
        .iter()
        .filter(|gpu| set.contains(&gpu.index))
        .any(|gpu| {
            gpu.users.iter().any(|user| {
                user.pid == pid
                    && !user.hidden
                    && (user.listed || monitor || !gpu.driver_answered())
            })
        })
}

fn holder_json(snapshot: &Snapshot, pid: u32) -> HolderJson {
    let record = snapshot.processes.get(&pid);
    let details = snapshot.details.get(&pid);
    let protected = record
        .and_then(|record| protected_name(record, DEFAULT_PROTECTED))
        .map(str::to_string);
    let mut flags = snapshot.flags(pid).names();
    if protected.is_some() {
        flags.push("protected");
    }
    let mps = snapshot.mps(pid);
    if let Some(link) = mps {
        flags.push(match link.role {
            MpsRole::Control => "mps_control",
            MpsRole::Server => "mps_server",
            MpsRole::Client => "mps_client",
        });
    }
    HolderJson {
        pid,
        ppid: record.map(|r| r.ppid),
        pgid: record.map(|r| r.pgid),
        sid: record.map(|r| r.sid),
        uid: record.and_then(|r| r.uid),
        user: details.and_then(|d| d.user.clone()),
        state: record.map(|r| r.state.to_string()),
        wchan: details.and_then(|d| d.wchan.clone()),
        start_time_ticks: record.map(|r| r.id.start_time),
        age_seconds: snapshot.age(pid).map(|age| age.as_secs()),
        age_ms: snapshot.age(pid).map(|age| age.as_millis() as u64),
        comm: record.map(|r| r.comm.clone()),
        cmdline: record.map(|r| r.cmdline.clone()),
        cgroup: details.and_then(|d| d.cgroup.clone()),
        container: details
            .and_then(|d| d.container.as_ref())
            .map(ContainerJson::of),
        gpus: snapshot
            .gpus
            .iter()
            .filter_map(|gpu| {
                let user = gpu
                    .users
                    .iter()
                    .find(|user| user.pid == pid && !user.hidden)?;
                Some(HolderGpuJson {
                    index: gpu.index,
                    memory: user.memory,
                    listed_by_driver: user.listed,
                    node_open: user.node_open,
                    mig_instances: mig::instances_of(gpu, pid),
                    sm_utilization_percent: snapshot.sm_percent(gpu.index, user),
                })
            })
            .collect(),
        control_node: record.is_some_and(|r| r.nodes.contains(&crate::proc::Node::Control)),
        flags,
        orphan: snapshot.orphaned(pid).map(|orphan| orphan.to_string()),
        protected,
        supervisor: details
            .and_then(|d| d.supervision.as_ref())
            .map(|supervision| SupervisorJson {
                pid: supervision.supervisor,
                gone: supervision.gone.clone(),
            }),
        mps: mps.map(|link| MpsJson {
            role: link.role.code(),
            server: link.server,
            daemon: link.daemon,
            pipe_directory: link.pipe_directory.clone(),
            listed_by_driver: link.listed_by_driver,
        }),
    }
}

pub fn status_json(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> String {
    let document = StatusJson {
        schema_version: SCHEMA_VERSION,
        kind: "status",
        backend: &snapshot.backend,
        taken_at_unix_ms: snapshot.taken_at_unix_ms,
        driver_error: snapshot.driver_error.as_ref(),
        scan: ScanJson {
            processes: snapshot.processes.len(),
            complete: !snapshot.is_partial(),
            unreadable: unreadable_json(&snapshot.unreadable),
            descriptors: snapshot.descriptors.name(),
        },
        gpus: snapshot
            .gpus
            .iter()
            .filter(|gpu| gpus.as_ref().is_none_or(|set| set.contains(&gpu.index)))
            .map(|gpu| {
                let activity = snapshot.activity.get(&gpu.index);
                let watts = |milliwatts: Option<u32>| milliwatts.map(|mw| f64::from(mw) / 1000.0);
                GpuJson {
                    index: gpu.index,
                    name: gpu.name.clone(),
                    uuid: gpu.uuid.clone(),
                    memory_total: gpu.memory_total,
                    memory_used: gpu.memory_used,
                    memory_reserved: gpu.memory_reserved,
                    utilization_percent: activity.and_then(|a| a.utilization_percent),
                    temperature_celsius: activity.and_then(|a| a.temperature_celsius),
                    power_draw_watts: watts(activity.and_then(|a| a.power_draw_milliwatts)),
                    power_limit_watts: watts(activity.and_then(|a| a.power_limit_milliwatts)),
                    memory_unattributed: snapshot
                        .held_by_no_process(gpu)
                        .map(|unattributed| unattributed.bytes),
                    held_by_no_process: snapshot
                        .held_by_no_process(gpu)
                        .and_then(|unattributed| unattributed.verdict()),
                    unattributed_kind: snapshot
                        .held_by_no_process(gpu)
                        .map(|unattributed| unattributed.kind_name()),
                    error: gpu.error.clone(),
                    processes: gpu
                        .users
                        .iter()
                        .map(|user| GpuProcessJson {
                            pid: user.pid,
                            memory: user.memory,
                            listed_by_driver: user.listed,
                            node_open: user.node_open,
                            sm_utilization_percent: snapshot.sm_percent(gpu.index, user),
                        })
                        .collect(),
                    evidence: snapshot.evidence.get(&gpu.index).cloned(),
                    advice: snapshot
                        .evidence
                        .get(&gpu.index)
                        .map(|evidence| evidence.advice(gpu.index))
                        .unwrap_or_default(),
                    mig_mode: gpu.mig_mode,
                    instances: mig::instances_json(snapshot, gpu),
                }
            })
            .collect(),
        holders: holders_json(snapshot, gpus),
        container_notes: &snapshot.container_notes,
        visibility: VisibilityJson {
            host_pids: snapshot.host_pids,
            hidden: hidden_pids(snapshot, gpus),
            note: visibility_note(snapshot, gpus),
        },
    };
    to_json(&document)
}

/// Every holder of the given GPUs (all GPUs when `None`), as JSON objects.
pub fn holders_json(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> Vec<HolderJson> {
    let mut holders: Vec<HolderJson> = snapshot
        .holders()
        .into_iter()
        .filter(|&pid| shown(snapshot, gpus, pid))
        .map(|pid| holder_json(snapshot, pid))
        .collect();
    // Listed by the driver, not a process of this /proc: all we know is the
    // driver's PID and memory.
    for (index, user) in snapshot.hidden_users() {
        if gpus.as_ref().is_some_and(|set| !set.contains(&index)) {
            continue;
        }
        holders.push(HolderJson {
            pid: user.pid,
            ppid: None,
            pgid: None,
            sid: None,
            uid: None,
            user: None,
            state: None,
            wchan: None,
            start_time_ticks: None,
            age_seconds: None,
            age_ms: None,
            comm: None,
            cmdline: None,
            cgroup: None,
            container: None,
            gpus: vec![HolderGpuJson {
                index,
                memory: user.memory,
                listed_by_driver: true,
                node_open: false,
                mig_instances: Vec::new(),
                sm_utilization_percent: snapshot.sm_percent(index, &user),
            }],
            control_node: false,
            flags: vec!["hidden"],
            orphan: None,
            protected: None,
            supervisor: None,
            mps: None,
        });
    }
    holders
}

/// A document for programs: JSON, with nothing in it a terminal acts on
/// (`units::json_safe`), so that it can be written as it is.
pub fn to_json<T: Serialize>(value: &T) -> String {
    crate::units::json_safe(
        serde_json::to_string_pretty(value)
            .unwrap_or_else(|error| format!("{{\"error\": \"{error}\"}}")),
    )
}

pub fn new_table(headers: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_style(NOTHING);
    table.set_header(headers.iter().map(Cell::new));
    table
}

pub fn age_text(millis: Option<u64>) -> String {
    millis.map_or("?".to_string(), |ms| {
        Age(std::time::Duration::from_millis(ms)).to_string()
    })
}

/// A GPU's activity as the table shows it: utilization, temperature and
/// power draw of its limit (`87%`, `64°C`, `312/700 W`), `?` for each the
/// driver did not say.
fn activity_cells(activity: Option<&Activity>) -> [String; 3] {
    let known =
        |value: Option<u32>, unit: &str| value.map_or("?".to_string(), |v| format!("{v}{unit}"));
    let watts = |milliwatts: Option<u32>| {
        milliwatts.map_or("?".to_string(), |mw| {
            format!("{}", (f64::from(mw) / 1000.0).round())
        })
    };
    let activity = activity.cloned().unwrap_or_default();
    [
        known(activity.utilization_percent, "%"),
        known(activity.temperature_celsius, "°C"),
        format!(
            "{}/{} W",
            watts(activity.power_draw_milliwatts),
            watts(activity.power_limit_milliwatts)
        ),
    ]
}

fn gpu_table(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> String {
    let wanted = |index: &u32| gpus.as_ref().is_none_or(|set| set.contains(index));
    // The activity's columns where the driver said any of it (a backend that
    // says nothing, as the simulated driver without `activity.N`, keeps the table as it was).
    let active = snapshot.activity.iter().any(|(index, activity)| {
        wanted(index)
            && (activity.utilization_percent.is_some()
                || activity.temperature_celsius.is_some()
                || activity.power_draw_milliwatts.is_some()
                || activity.power_limit_milliwatts.is_some())
    });
    let mut headers = vec!["GPU", "NAME", "USED", "TOTAL", "UNATTRIBUTED", "HOLDERS"];
    if active {
        headers.extend(["UTIL", "TEMP", "POWER"]);
    }
    let mut table = new_table(&headers);
    for gpu in snapshot.gpus.iter().filter(|gpu| wanted(&gpu.index)) {
        let users = gpu.users.iter().filter(|user| user.listed).count();
        let mut row = match &gpu.error {
            Some(_) => vec![
                Cell::new(gpu.index),
                Cell::new("error (below)"),
                Cell::new("?"),
                Cell::new("?"),
                Cell::new("?"),
                Cell::new(gpu.users.len()),
            ],
            None => vec![
                Cell::new(gpu.index),
                Cell::new(short(gpu.name.as_deref().unwrap_or("?"), 40)),
                Cell::new(MaybeBytes(gpu.memory_used)).set_alignment(CellAlignment::Right),
                Cell::new(MaybeBytes(gpu.memory_total)).set_alignment(CellAlignment::Right),
                Cell::new(MaybeBytes(
                    snapshot
                        .held_by_no_process(gpu)
                        .map(|unattributed| unattributed.bytes),
                ))
                .set_alignment(CellAlignment::Right),
                Cell::new(users),
            ],
        };
        if active {
            row.extend(
                activity_cells(snapshot.activity.get(&gpu.index))
                    .into_iter()
                    .map(|text| Cell::new(text).set_alignment(CellAlignment::Right)),
            );
        }
        table.add_row(row);
        mig::add_instance_rows(&mut table, snapshot, gpu);
    }
    let mut out = table.trim_fmt();
    for gpu in snapshot
        .gpus
        .iter()
        .filter(|gpu| gpus.as_ref().is_none_or(|set| set.contains(&gpu.index)))
    {
        if let Some(error) = &gpu.error {
            let _ = write!(
                out,
                "\n{}",
                wrap(&format!(
                    "GPU {} error: {}",
                    gpu.index,
                    Field(&error.to_string())
                ))
            );
        }
        if let Some(note) = mig::notes(gpu) {
            let _ = write!(out, "\n{}", wrap(&note));
        }
    }
    out
}

/// Where the holders table puts a process, by the strongest evidence there is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// The driver lists it on this GPU: it has a context there (`name`:
    /// the GPU's index, or its MIG instances', `0:1`).
    Listed {
        index: u32,
        name: String,
        memory: Option<u64>,
    },
    /// It has these GPUs' nodes open, and no driver answered for them.
    NodesOnly(BTreeSet<u32>),
    /// Listed nowhere: a monitor, or a process with only control nodes open.
    Nowhere,
}

impl Place {
    /// Rows by GPU, as nvidia-smi lists processes; then node-only evidence;
    /// then monitors.
    fn order(&self) -> (u8, u32) {
        match self {
            Place::Listed { index, .. } => (0, *index),
            Place::NodesOnly(indexes) => (1, indexes.first().copied().unwrap_or(0)),
            Place::Nowhere => (2, 0),
        }
    }

    /// What the holder holds here, where that is known. A monitor is in no
    /// driver list: it holds no GPU memory.
    pub fn memory(&self, monitor: bool) -> Option<u64> {
        match self {
            Place::Listed { memory, .. } => *memory,
            Place::NodesOnly(_) => None,
            Place::Nowhere => monitor.then_some(0),
        }
    }

    /// The GPU and GPU MEM cells of this place, as `status` and `top` show
    /// them.
    pub fn cells(&self, monitor: bool) -> (String, String) {
        match self {
            Place::Listed { name, memory, .. } => (name.clone(), MaybeBytes(*memory).to_string()),
            Place::NodesOnly(indexes) => {
                (format!("({})", GpuRanges(indexes)), "unknown".to_string())
            }
            Place::Nowhere if monitor => ("-".to_string(), Bytes(0).to_string()),
            Place::Nowhere => ("-".to_string(), "-".to_string()),
        }
    }
}

/// One holder's GPU and GPU MEM cells on one line (`places_cells`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacesCells {
    pub gpus: String,
    pub memory: String,
    /// The memory in bytes, where known (to sort by).
    pub bytes: Option<u64>,
}

/// One holder's places on one line, as `top` shows a holder: the GPU cells
/// joined, the memory summed where every place's is known.
pub fn places_cells(places: &[Place], monitor: bool) -> PlacesCells {
    if let [place] = places {
        let (gpus, memory) = place.cells(monitor);
        return PlacesCells {
            gpus,
            memory,
            bytes: place.memory(monitor),
        };
    }
    let bytes = places
        .iter()
        .map(|place| place.memory(monitor))
        .sum::<Option<u64>>();
    PlacesCells {
        gpus: places
            .iter()
            .map(|place| place.cells(monitor).0)
            .collect::<Vec<_>>()
            .join(","),
        memory: MaybeBytes(bytes).to_string(),
        bytes,
    }
}

/// Every place of one holder among the GPUs shown. A process the driver
/// lists on some GPUs is not placed on others merely because it has their
/// nodes open: the CUDA runtime opens every GPU's node. `top` places its
/// rows by it too.
pub fn places(
    snapshot: &Snapshot,
    holder: &HolderJson,
    gpus: &Option<BTreeSet<u32>>,
) -> Vec<Place> {
    places_of(
        &holder.gpus,
        |index| gpus.as_ref().is_none_or(|set| set.contains(&index)),
        |index| {
            snapshot
                .gpu(index)
                .is_some_and(|state| state.driver_answered())
        },
    )
}

/// `places`, from a holder's GPUs as `status --json` gives them (`wanted`:
/// the GPUs shown; `answered`: whether the driver answered for a GPU), so
/// that a host's document is placed as a snapshot here is.
pub fn places_of(
    gpus: &[HolderGpuJson],
    wanted: impl Fn(u32) -> bool,
    answered: impl Fn(u32) -> bool,
) -> Vec<Place> {
    let mut places: Vec<Place> = gpus
        .iter()
        .filter(|gpu| gpu.listed_by_driver && wanted(gpu.index))
        .map(|gpu| Place::Listed {
            index: gpu.index,
            name: mig::place_name(gpu.index, &gpu.mig_instances),
            memory: gpu.memory,
        })
        .collect();
    let unanswered: BTreeSet<u32> = gpus
        .iter()
        .filter(|gpu| !gpu.listed_by_driver && gpu.node_open && wanted(gpu.index))
        .filter(|gpu| !answered(gpu.index))
        .map(|gpu| gpu.index)
        .collect();
    if !unanswered.is_empty() {
        places.push(Place::NodesOnly(unanswered));
    }
    if places.is_empty() {
        places.push(Place::Nowhere);
    }
    places
}

/// The widest a table may be: it must read in a 120-column terminal and in
/// a log pasted into an issue.
const TABLE_WIDTH: usize = 120;

/// Cuts columns until every line of the table fits `TABLE_WIDTH`. `steps`
/// are (column, narrowest it may become), tried in order.
fn fit(headers: &[&str], rows: &mut [Vec<String>], steps: &[(usize, usize)]) {
    let width = |rows: &[Vec<String>], column: usize| {
        rows.iter()
            .map(|row| row[column].chars().count())
            .chain([headers[column].chars().count()])
            .max()
            .unwrap_or(0)
    };
    for &(column, narrowest) in steps {
        // The NOTHING style pads every column with one space on each side;
        // the last one's is trimmed.
        let total: usize = (0..headers.len())
            .map(|c| width(rows, c) + 2)
            .sum::<usize>()
            - 1;
        let Some(over) = total.checked_sub(TABLE_WIDTH).filter(|&over| over > 0) else {
            return;
        };
        let current = width(rows, column);
        let target = current.saturating_sub(over).max(narrowest);
        if target < current {
            for row in rows.iter_mut() {
                row[column] = short(&row[column], target);
            }
        }
    }
}

pub fn status_table(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> String {
    let mut out = String::new();
    if snapshot.gpus.is_empty() {
        let _ = writeln!(out, "{}", no_gpus(snapshot));
    } else {
        let _ = writeln!(out, "{}", gpu_table(snapshot, gpus));
    }
    let holders = holders_json(snapshot, gpus);
    let _ = writeln!(out);
    if holders.is_empty() {
        let _ = writeln!(out, "{}", no_holders(snapshot));
        notes(snapshot, gpus, &mut out);
        return out;
    }
    const HEADERS: [&str; 12] = [
        "GPU",
        "PID",
        "PPID",
        "PGID",
        "SID",
        "USER",
        "S",
        "AGE",
        "GPU MEM",
        "FLAGS",
        "CONTAINER",
        "COMMAND",
    ];
    const MEMORY: usize = 8;
    const CONTAINER: usize = 10;
    const COMMAND: usize = 11;
    let mut unknown_memory = false;
    let mut nodes_only = false;
    let mut rows: Vec<(Place, u32, Vec<String>)> = Vec::new();
    for holder in &holders {
        let number = |value: Option<u32>| value.map_or("?".to_string(), |v| v.to_string());
        let monitor = holder.flags.contains(&"monitor");
        for place in places(snapshot, holder, gpus) {
            match &place {
                Place::Listed { memory, .. } => unknown_memory |= memory.is_none(),
                Place::NodesOnly(_) => nodes_only = true,
                Place::Nowhere => {}
            }
            let (gpu, memory) = place.cells(monitor);
            let row = vec![
                gpu,
                holder.pid.to_string(),
                number(holder.ppid),
                number(holder.pgid),
                number(holder.sid),
                one_line(holder.user.as_deref().unwrap_or("?")).into_owned(),
                one_line(holder.state.as_deref().unwrap_or("?")).into_owned(),
                age_text(holder.age_ms),
                memory,
                holder.flags.join(","),
                short(
                    &holder
                        .container
                        .as_ref()
                        .map_or("-".to_string(), ContainerJson::label),
                    28,
                ),
                one_line(holder.cmdline.as_deref().unwrap_or("(not visible here)")).into_owned(),
            ];
            rows.push((place, holder.pid, row));
        }
    }
    rows.sort_by_key(|(place, pid, _)| (place.order(), *pid));
    let mut cells: Vec<Vec<String>> = rows.into_iter().map(|(_, _, row)| row).collect();
    fit(
        &HEADERS,
        &mut cells,
        &[(COMMAND, 24), (CONTAINER, 12), (COMMAND, 12)],
    );
    let mut table = new_table(&HEADERS);
    for row in cells {
        table.add_row(row.into_iter().enumerate().map(|(column, text)| {
            let cell = Cell::new(text);
            if column == MEMORY {
                cell.set_alignment(CellAlignment::Right)
            } else {
                cell
            }
        }));
    }
    let _ = writeln!(out, "{}", table.trim_fmt());
    evidence_notes(unknown_memory, nodes_only, &mut out);
    protected_note(&holders, &mut out);
    mps_note(&holders, &mut out);
    notes(snapshot, gpus, &mut out);
    out
}

/// Which server each MPS client goes through, and that `free` spares the
/// servers and daemons.
fn mps_note(holders: &[HolderJson], out: &mut String) {
    let mut servers: BTreeMap<Option<u32>, Vec<u32>> = BTreeMap::new();
    for holder in holders {
        match holder.mps.as_ref() {
            Some(link) if link.role == "client" => {
                servers.entry(link.server).or_default().push(holder.pid)
            }
            Some(link) if link.role == "server" => {
                servers.entry(Some(holder.pid)).or_default();
            }
            _ => {}
        }
    }
    for (server, clients) in servers {
        let clients = if clients.is_empty() {
            "no client".to_string()
        } else {
            clients
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let text = match server {
            Some(server) => format!(
                "MPS server {server} serves clients: {clients}. `free` spares MPS servers and control daemons; `free --mps-server {server}` stops this one and its clients."
            ),
            None => format!("MPS clients whose server cannot be told: {clients}."),
        };
        note(out, &text);
    }
}

/// Says why holders flagged `protected` are left alone by `free`.
fn protected_note(holders: &[HolderJson], out: &mut String) {
    let protected: Vec<String> = holders
        .iter()
        .filter_map(|holder| {
            let name = holder.protected.as_deref()?;
            Some(format!("{} ({})", holder.pid, Field(name)))
        })
        .collect();
    if !protected.is_empty() {
        note(
            out,
            &format!(
                "Protected by name: {}. `free` leaves these alone unless named with --pid.",
                protected.join(", ")
            ),
        );
    }
}

/// What a reader must know to weigh the rows: why memory is unknown, and
/// that an open node is weaker evidence than a driver's process list.
fn evidence_notes(unknown_memory: bool, nodes_only: bool, out: &mut String) {
    if unknown_memory {
        note(
            out,
            &format!(
                "unknown: the driver lists the process on that GPU but reports no memory figure for it, as NVML does for GPUs in MIG mode and for processes the caller may not inspect{}.",
                if rustix::process::geteuid().is_root() {
                    ""
                } else {
                    " (gpureap is not running as root)"
                }
            ),
        );
    }
    if nodes_only {
        note(
            out,
            "GPUs in parentheses: no driver answered for them, so all that is known is that the process has their device nodes open. That is weaker evidence than a driver's process list: the CUDA runtime opens every GPU's node, and monitors open them too.",
        );
    }
}

/// The line of a status without holders: where the driver's lists may
/// leave out other namespaces' processes, only none seen from here.
fn no_holders(snapshot: &Snapshot) -> &'static str {
    if snapshot.descriptors == Descriptors::Listed {
        "No process holds these GPUs."
    } else if snapshot.may_miss_holders() {
        "No process seen from this PID namespace holds or watches these GPUs (see the note)."
    } else {
        "No process holds or watches these GPUs."
    }
}

/// The first line of a status without GPUs: without a driver, that is all
/// there is to say of them, said once (`notes` does not repeat it).
fn no_gpus(snapshot: &Snapshot) -> String {
    match &snapshot.driver_error {
        Some(error) => wrap(&format!("No GPU driver: {}.", Field(&error.to_string()))),
        None => format!("No GPUs reported by the driver ({}).", snapshot.backend),
    }
}

fn notes(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>, out: &mut String) {
    supervisor_gone_notes(snapshot, out);
    if let Some(hidden) = visibility_note(snapshot, gpus) {
        note(out, &hidden);
    }
    for line in evidence_lines(snapshot, gpus) {
        note(out, &line);
    }
    container_notes(snapshot, out);
    if snapshot.descriptors == Descriptors::Listed {
        note(
            out,
            "Monitors not looked for: the driver's list explains every GPU's memory, so only the processes it lists were inspected. `gpureap status --monitors` lists monitors too.",
        );
    }
    if let Some(error) = &snapshot.driver_error
        && !snapshot.gpus.is_empty()
    {
        note(out, &format!("Driver error: {}", Field(&error.to_string())));
    }
    if snapshot.is_partial() {
        note(
            out,
            &format!(
                "Partial scan: {} process(es) could not be inspected (e.g. pid {} {}: {}); holders among them are not shown.",
                snapshot.unreadable.len(),
                snapshot.unreadable[0].pid,
                Field(&snapshot.unreadable[0].comm),
                Field(&snapshot.unreadable[0].reason)
            ),
        );
    }
}

/// What the container sources found (holders whose container is gone, GPUs
/// a pod was never allocated) and what they could not read.
fn container_notes(snapshot: &Snapshot, out: &mut String) {
    for pid in snapshot.holders() {
        let Some(container) = snapshot.container(pid) else {
            continue;
        };
        if let Some(reason) = container.gone_reason() {
            note(
                out,
                &format!(
                    "Container gone: PID {pid}: {}; `gpureap free --orphans` frees it.",
                    Field(&reason)
                ),
            );
        }
        if !container.unrequested_gpus.is_empty() {
            let gpus: BTreeSet<u32> = container.unrequested_gpus.iter().copied().collect();
            note(
                out,
                &format!(
                    "Unrequested GPU: PID {pid} in {} uses GPU {}, which the kubelet never allocated to its pod.",
                    Field(&label_of(container)),
                    GpuRanges(&gpus)
                ),
            );
        }
    }
    for text in &snapshot.container_notes {
        note(out, &format!("Containers: {}", Field(text)));
    }
}

/// The PIDs the driver lists on the given GPUs that are no process of this
/// /proc (`hidden`), each once.
fn hidden_pids(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> Vec<u32> {
    let pids: BTreeSet<u32> = snapshot
        .hidden_users()
        .into_iter()
        .filter(|(index, _)| gpus.as_ref().is_none_or(|set| set.contains(index)))
        .map(|(_, user)| user.pid)
        .collect();
    pids.into_iter().collect()
}

/// Which holders are hidden, why, and the remedy, for `status` (text and
/// JSON) and `check`; None when none is. In a PID namespace of its own (a
/// container without the host's PIDs) gpureap cannot see, name or free
/// what the driver lists: the remedy is the host's PIDs. In the host's, a
/// hidden PID is another namespace's process whose number the driver gave
/// (or one that exited since it was listed).
pub fn hidden_note(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> Option<String> {
    let mut listed: Vec<String> = Vec::new();
    for (index, user) in snapshot.hidden_users() {
        if gpus.as_ref().is_some_and(|set| !set.contains(&index)) {
            continue;
        }
        listed.push(format!(
            "{} (GPU {index}, {})",
            user.pid,
            MaybeBytes(user.memory)
        ));
    }
    if listed.is_empty() {
        return None;
    }
    let which = format!(
        "no process here has PID {}, which the driver lists",
        listed.join(", ")
    );
    Some(match snapshot.host_pids {
        Some(false) => format!(
            "Hidden: {which}. gpureap runs in a PID namespace of its own (a container without the host's PIDs), so it cannot see, attribute or free those holders. Run it on the host, or give its container the host's PIDs: `docker run --pid=host`, or `hostPID: true` in a Kubernetes pod spec."
        ),
        _ => format!(
            "Hidden: {which}: they are processes of another PID namespace whose numbers the driver gave (or have exited since it listed them). Run gpureap in the PID namespace that started them to see and free them."
        ),
    })
}

/// The advice each GPU's hardware evidence implies (`GPU 1: Xid 79 at …`),
/// for the GPUs given (all when `None`), and what reading it left unknown.
/// Xid details are the kernel's text: escaped.
pub(crate) fn evidence_lines(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> Vec<String> {
    let mut lines: Vec<String> = snapshot
        .evidence
        .iter()
        .filter(|(index, _)| gpus.as_ref().is_none_or(|set| set.contains(index)))
        .flat_map(|(index, evidence)| {
            evidence
                .advice(*index)
                .into_iter()
                .map(move |line| format!("GPU {index}: {}", Field(&line)))
        })
        .collect();
    if let Some(note) = &snapshot.evidence_note {
        lines.push(Field(note).to_string());
    }
    lines
}

/// What this gpureap cannot see, for `status` (text and JSON's
/// `visibility.note`): the hidden holders (`hidden_note`), then, seen from a
/// PID namespace of its own, each shown GPU's memory that processes unseen
/// from here may hold (the one rule's `Unseen`), with the remedy.
pub(crate) fn visibility_note(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> Option<String> {
    let unseen: Vec<String> = snapshot
        .gpus
        .iter()
        .filter(|gpu| gpus.as_ref().is_none_or(|set| set.contains(&gpu.index)))
        .filter_map(|gpu| {
            let unattributed = snapshot.held_by_no_process(gpu)?;
            unattributed.unseen().then(|| {
                format!(
                    "Unseen: GPU {}: {}.",
                    gpu.index,
                    crate::verify::unseen_text(unattributed.bytes)
                )
            })
        })
        .collect();
    let notes: Vec<String> = hidden_note(snapshot, gpus)
        .into_iter()
        .chain(unseen)
        .collect();
    (!notes.is_empty()).then(|| notes.join(" "))
}

/// One note per `gpureap run` that is gone while its server holds GPUs:
/// which holders it left, why it counts as gone, and how to free them.
fn supervisor_gone_notes(snapshot: &Snapshot, out: &mut String) {
    let mut runs: BTreeMap<u32, (Vec<u32>, &crate::supervised::Supervision)> = BTreeMap::new();
    for pid in snapshot.holders() {
        if let Some(supervision) = snapshot.supervisor_gone(pid) {
            runs.entry(supervision.supervisor)
                .or_insert_with(|| (Vec::new(), supervision))
                .0
                .push(pid);
        }
    }
    for (supervisor, (pids, supervision)) in runs {
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let free = if supervision.cgroup.is_some() {
            "`gpureap free --stale-runs` frees its cgroup and removes it"
        } else {
            "`gpureap free --orphans` frees its whole tree"
        };
        note(
            out,
            &format!(
                "Supervisor gone: PID {} started under `gpureap run` (PID {supervisor}), which no longer supervises them ({}); {free}.",
                pids.join(", "),
                Field(supervision.gone.as_deref().unwrap_or("gone")),
            ),
        );
    }
}

/// Writes a paragraph after a blank line.
fn note(out: &mut String, text: &str) {
    let _ = writeln!(out, "\n{}", wrap(text));
}

/// Wraps text at spaces so that its lines fit `TABLE_WIDTH`.
fn wrap(text: &str) -> String {
    let mut wrapped = String::new();
    let mut line_length = 0;
    for word in text.split(' ') {
        let length = word.chars().count();
        if line_length > 0 && line_length + 1 + length > TABLE_WIDTH {
            wrapped.push('\n');
            line_length = 0;
        } else if line_length > 0 {
            wrapped.push(' ');
            line_length += 1;
        }
        wrapped.push_str(word);
        line_length += length;
    }
    wrapped
}

/// Holders inside their process trees: each tree from its topmost ancestor
/// below PID 1, with the holders' own descendants.
pub fn status_tree(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> String {
    let mut out = String::new();
    if !snapshot.gpus.is_empty() {
        let _ = writeln!(out, "{}\n", gpu_table(snapshot, gpus));
    } else if snapshot.driver_error.is_some() {
        let _ = writeln!(out, "{}\n", no_gpus(snapshot));
    }
    let holders: BTreeSet<u32> = snapshot
        .holders()
        .into_iter()
        .filter(|&pid| shown(snapshot, gpus, pid))
        .collect();
    let processes = snapshot.tree();
    let mut included: BTreeSet<u32> = BTreeSet::new();
    let mut roots: BTreeSet<u32> = BTreeSet::new();
    for &pid in &holders {
        included.insert(pid);
        included.extend(processes.descendants(pid));
        // The tree starts at the topmost ancestor below PID 1.
        let chain: Vec<u32> = processes
            .ancestors(pid)
            .into_iter()
            .take_while(|&parent| parent > 1)
            .collect();
        included.extend(&chain);
        roots.insert(chain.last().copied().unwrap_or(pid));
    }
    if holders.is_empty() {
        let _ = writeln!(out, "{}", no_holders(snapshot));
    }
    let mut tree = Tree {
        snapshot,
        gpus,
        processes,
        holders,
        included,
        unknown_memory: false,
        nodes_only: false,
        out,
    };
    for root in roots {
        tree.lines(root, "", "");
    }
    let Tree {
        mut out,
        unknown_memory,
        nodes_only,
        ..
    } = tree;
    evidence_notes(unknown_memory, nodes_only, &mut out);
    notes(snapshot, gpus, &mut out);
    out
}

/// A tree being printed: what it shows, and what is left to print.
struct Tree<'a> {
    snapshot: &'a Snapshot,
    gpus: &'a Option<BTreeSet<u32>>,
    processes: ProcessTree,
    holders: BTreeSet<u32>,
    /// Processes still to print; each is printed once, which also ends any parent loop.
    included: BTreeSet<u32>,
    unknown_memory: bool,
    nodes_only: bool,
    out: String,
}

impl Tree<'_> {
    fn lines(&mut self, pid: u32, lead: &str, branch: &str) {
        if !self.included.remove(&pid) {
            return;
        }
        let holder = holder_json(self.snapshot, pid);
        let mut line = format!(
            "{lead}{branch}{pid} [{}] {}",
            Field(holder.state.as_deref().unwrap_or("?")),
            short(
                holder.cmdline.as_deref().unwrap_or("(not visible here)"),
                70
            )
        );
        if self.holders.contains(&pid) {
            for place in places(self.snapshot, &holder, self.gpus) {
                match place {
                    Place::Listed { name, memory, .. } => {
                        self.unknown_memory |= memory.is_none();
                        let _ = write!(line, "  GPU {name}: {}", MaybeBytes(memory));
                    }
                    Place::NodesOnly(indexes) => {
                        self.nodes_only = true;
                        let _ = write!(line, "  GPU ({}): nodes open", GpuRanges(&indexes));
                    }
                    Place::Nowhere => {}
                }
            }
        }
        if !holder.flags.is_empty() {
            let _ = write!(line, "  ({})", holder.flags.join(", "));
        }
        if let Some(container) = &holder.container {
            let _ = write!(line, "  [container {}]", Field(&container.label()));
        }
        match holder.mps.as_ref().map(|link| (link.role, link.server)) {
            Some(("client", Some(server))) => {
                let _ = write!(line, "  [MPS client of server {server}]");
            }
            Some(("client", None)) => {
                let _ = write!(line, "  [MPS client, server unknown]");
            }
            _ => {}
        }
        let _ = writeln!(self.out, "{line}");
        let kids: Vec<u32> = self
            .processes
            .children(pid)
            .iter()
            .copied()
            .filter(|kid| self.included.contains(kid))
            .collect();
        let child_lead = format!(
            "{lead}{}",
            match branch {
                "" => "",
                "└─ " => "   ",
                _ => "│  ",
            }
        );
        for (position, kid) in kids.iter().enumerate() {
            let branch = if position + 1 == kids.len() {
                "└─ "
            } else {
                "├─ "
            };
            self.lines(*kid, &child_lead, branch);
        }
    }
}

/// `free`'s document (docs/json.md). Mapped field by field from the
/// reaper's own types, so that renaming those cannot change the document.
#[derive(Serialize)]
struct FreeJson<'a> {
    schema_version: u32,
    kind: &'static str,
    exit_code: Exit,
    backend: &'a str,
    dry_run: bool,
    elapsed_ms: u64,
    targets: Vec<TargetJson<'a>>,
    spared: Vec<SparedJson<'a>>,
    gpus: Vec<GpuOutcomeJson<'a>>,
    unreadable: Vec<UnreadableJson<'a>>,
    stale_runs: Vec<StaleRunJson<'a>>,
    cgroup_scopes: Vec<CgroupScopeJson<'a>>,
}

/// What one `--container`, `--pod` or `--cgroup` resolved to.
#[derive(Serialize)]
struct CgroupScopeJson<'a> {
    kind: &'static str,
    given: String,
    runtime: Option<&'static str>,
    id: Option<&'a str>,
    pod_uid: Option<&'a str>,
    cgroups: &'a BTreeSet<String>,
    members: Vec<u32>,
    note: Option<&'a str>,
}

fn cgroup_scope_json(found: &Found) -> CgroupScopeJson<'_> {
    CgroupScopeJson {
        kind: found.wanted.kind(),
        given: found.wanted.given(),
        runtime: found.container.as_ref().map(|(runtime, _)| runtime.name()),
        id: found.container.as_ref().map(|(_, id)| id.as_str()),
        pod_uid: found.pod_uid.as_deref(),
        cgroups: &found.cgroups,
        members: found.members.iter().map(|id| id.pid).collect(),
        note: found.note.as_deref(),
    }
}

#[derive(Serialize)]
struct StaleRunJson<'a> {
    cgroup: &'a str,
    supervisor: u32,
    gone: &'a str,
    removed: bool,
    error: Option<&'a str>,
}

#[derive(Serialize)]
pub struct TargetJson<'a> {
    pid: u32,
    start_time: u64,
    ppid: u32,
    comm: &'a str,
    cmdline: &'a str,
    because: String,
    orphan: Option<String>,
    /// Why its container counts as gone, where `--orphans` took it for that.
    container_gone: Option<&'a str>,
    gpus: &'a BTreeSet<u32>,
    signals: Vec<SignalJson<'a>>,
    fate: &'static str,
    exited_after_ms: Option<u64>,
    late: bool,
}

#[derive(Serialize)]
struct SignalJson<'a> {
    signal: &'static str,
    at_ms: u64,
    delivery: DeliveryJson<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum DeliveryJson<'a> {
    Sent,
    Gone,
    PermissionDenied,
    Failed(&'a str),
}

#[derive(Serialize)]
struct SparedJson<'a> {
    pid: u32,
    comm: &'a str,
    cmdline: &'a str,
    reason: &'static str,
    why: String,
}

#[derive(Serialize)]
pub struct GpuOutcomeJson<'a> {
    index: u32,
    freed: bool,
    checked: bool,
    memory_before: Option<u64>,
    memory_after: Option<u64>,
    freed_bytes: Option<u64>,
    freed_after_ms: Option<u64>,
    reasons: Vec<ReasonTextJson<'a>>,
    advice: &'a [String],
}

/// A reason with its sentence, as `free` prints it: a client (the fleet
/// view) shows what the host would have said without knowing every kind.
#[derive(Serialize)]
struct ReasonTextJson<'a> {
    #[serde(flatten)]
    reason: ReasonJson<'a>,
    text: String,
}

/// Why a GPU is still held; `reason` names the kind (docs/json.md).
#[derive(Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
enum ReasonJson<'a> {
    Uninterruptible {
        pid: u32,
        comm: &'a str,
        wchan: Option<&'a str>,
    },
    Appeared {
        pid: u32,
        comm: &'a str,
    },
    StillAlive {
        pid: u32,
        comm: &'a str,
        state: String,
        signals: Vec<&'static str>,
    },
    Zombie {
        pid: u32,
        parent_pid: u32,
        parent_comm: &'a str,
    },
    Hidden {
        pid: u32,
    },
    Protected {
        pid: u32,
        comm: &'a str,
        why: &'a str,
    },
    PermissionDenied {
        pid: u32,
        comm: &'a str,
    },
    Respawned {
        parent_pid: u32,
        parent_comm: &'a str,
        times: u32,
    },
    StillReleasing {
        bytes: u64,
        bytes_per_second: u64,
    },
    DriverHeld {
        bytes: u64,
        /// Of `bytes`, what was held by no process before free started.
        #[serde(skip_serializing_if = "Option::is_none")]
        before_free: Option<u64>,
    },
    /// Memory no listed process explains, seen from a PID namespace of its
    /// own: processes gpureap cannot see may hold it (not driver-held).
    Unseen {
        bytes: u64,
    },
    DriverError {
        message: &'a str,
    },
}

impl<'a> From<&'a Reason> for ReasonJson<'a> {
    fn from(reason: &'a Reason) -> Self {
        match reason {
            Reason::Uninterruptible { pid, comm, wchan } => ReasonJson::Uninterruptible {
                pid: *pid,
                comm,
                wchan: wchan.as_deref(),
            },
            Reason::Appeared { pid, comm } => ReasonJson::Appeared { pid: *pid, comm },
            Reason::StillAlive {
                pid,
                comm,
                state,
                signals,
            } => ReasonJson::StillAlive {
                pid: *pid,
                comm,
                state: state.to_string(),
                signals: signals.iter().map(|signal| signal.name()).collect(),
            },
            Reason::Zombie {
                pid,
                parent_pid,
                parent_comm,
            } => ReasonJson::Zombie {
                pid: *pid,
                parent_pid: *parent_pid,
                parent_comm,
            },
            Reason::Hidden { pid, .. } => ReasonJson::Hidden { pid: *pid },
            Reason::Protected { pid, comm, why } => ReasonJson::Protected {
                pid: *pid,
                comm,
                why,
            },
            Reason::PermissionDenied { pid, comm } => {
                ReasonJson::PermissionDenied { pid: *pid, comm }
            }
            Reason::Respawned {
                parent_pid,
                parent_comm,
                times,
            } => ReasonJson::Respawned {
                parent_pid: *parent_pid,
                parent_comm,
                times: *times,
            },
            Reason::StillReleasing {
                bytes,
                bytes_per_second,
            } => ReasonJson::StillReleasing {
                bytes: *bytes,
                bytes_per_second: *bytes_per_second,
            },
            Reason::DriverHeld { bytes, before } => ReasonJson::DriverHeld {
                bytes: *bytes,
                before_free: *before,
            },
            Reason::Unseen { bytes } => ReasonJson::Unseen { bytes: *bytes },
            Reason::DriverError { message } => ReasonJson::DriverError { message },
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct UnreadableJson<'a> {
    pid: u32,
    comm: &'a str,
    reason: &'a str,
}

fn unreadable_json(unreadable: &[Unreadable]) -> Vec<UnreadableJson<'_>> {
    unreadable
        .iter()
        .map(|entry| UnreadableJson {
            pid: entry.pid,
            comm: &entry.comm,
            reason: &entry.reason,
        })
        .collect()
}

/// How a target's reason to be one reads in JSON.
fn because_code(because: Because) -> String {
    match because {
        Because::MpsServer => "mps_server".to_string(),
        Because::MpsClient { server } => format!("mps_client of {server}"),
        Because::Named => "named".to_string(),
        Because::StaleRun => "stale_run".to_string(),
        Because::Member => "member".to_string(),
        Because::InScope => "in_scope".to_string(),
        Because::Descendant { of } => format!("descendant of {of}"),
    }
}

/// How a target's reason to be one reads in a table.
fn because_text(because: Because) -> String {
    match because {
        Because::MpsServer => "the MPS server named by --mps-server".to_string(),
        Because::MpsClient { server } => {
            format!("a client of MPS server {server}: it goes down with its server")
        }
        Because::Named => "named".to_string(),
        Because::StaleRun => "a stale run's".to_string(),
        Because::Member => "in the container/pod/cgroup".to_string(),
        Because::InScope => "in scope".to_string(),
        Because::Descendant { of } => format!("descendant of {of}"),
    }
}

fn fate_code(fate: Fate) -> &'static str {
    match fate {
        Fate::Alive => "alive",
        Fate::Exited => "exited",
        Fate::Zombie => "zombie",
        Fate::PermissionDenied => "permission_denied",
    }
}

/// One target as `free --json` writes it (`targets[]`); `reap`'s decision lines carry it too.
pub fn target_json(target: &Handled) -> TargetJson<'_> {
    TargetJson {
        pid: target.pid,
        start_time: target.start_time,
        ppid: target.ppid,
        comm: &target.comm,
        cmdline: &target.cmdline,
        because: because_code(target.because),
        orphan: target.orphan.map(|orphan| orphan.to_string()),
        container_gone: target.container_gone.as_deref(),
        gpus: &target.gpus,
        signals: target
            .signals
            .iter()
            .map(|event| SignalJson {
                signal: event.signal.name(),
                at_ms: event.at_ms,
                delivery: match &event.delivery {
                    Delivery::Sent => DeliveryJson::Sent,
                    Delivery::Gone => DeliveryJson::Gone,
                    Delivery::PermissionDenied => DeliveryJson::PermissionDenied,
                    Delivery::Failed(why) => DeliveryJson::Failed(why),
                },
            })
            .collect(),
        fate: fate_code(target.fate),
        exited_after_ms: target.exited_after_ms,
        late: target.late,
    }
}

#[derive(Debug, Serialize)]
struct ResetPlanJson<'a> {
    schema_version: u32,
    kind: &'static str,
    exit_code: Exit,
    plans: &'a [crate::reset::Plan],
}

/// `gpureap reset --plan --json`: every GPU's plan (docs/json.md, kind
/// `reset_plan`); names the driver or /proc gave are escaped by `to_json`.
pub fn reset_plan_json(plans: &[crate::reset::Plan], exit_code: Exit) -> String {
    to_json(&ResetPlanJson {
        schema_version: SCHEMA_VERSION,
        kind: "reset_plan",
        exit_code,
        plans,
    })
}

pub fn free_json(report: &FreeReport, exit_code: Exit) -> String {
    to_json(&FreeJson {
        schema_version: SCHEMA_VERSION,
        kind: "free",
        exit_code,
        backend: &report.backend,
        dry_run: report.dry_run,
        elapsed_ms: report.elapsed_ms,
        targets: report.targets.iter().map(target_json).collect(),
        spared: report
            .spared
            .iter()
            .map(|spared| SparedJson {
                pid: spared.pid,
                comm: &spared.comm,
                cmdline: &spared.cmdline,
                reason: spared.reason.code(),
                why: spared.reason.to_string(),
            })
            .collect(),
        gpus: report.gpus.iter().map(gpu_outcome_json).collect(),
        unreadable: unreadable_json(&report.unreadable),
        stale_runs: report
            .stale_runs
            .iter()
            .map(|run| StaleRunJson {
                cgroup: &run.cgroup,
                supervisor: run.supervisor,
                gone: &run.gone,
                removed: run.removed,
                error: run.error.as_deref(),
            })
            .collect(),
        cgroup_scopes: report.cgroup_scopes.iter().map(cgroup_scope_json).collect(),
    })
}

/// One GPU's outcome as `free --json` writes it (`gpus[]`); `reap`'s decision lines carry it too.
pub fn gpu_outcome_json(gpu: &GpuOutcome) -> GpuOutcomeJson<'_> {
    GpuOutcomeJson {
        index: gpu.index,
        freed: gpu.freed,
        checked: gpu.checked,
        memory_before: gpu.memory_before,
        memory_after: gpu.memory_after,
        freed_bytes: gpu.freed_bytes,
        freed_after_ms: gpu.freed_after_ms,
        advice: &gpu.advice,
        reasons: gpu
            .reasons
            .iter()
            .map(|reason| ReasonTextJson {
                reason: ReasonJson::from(reason),
                text: reason.to_string(),
            })
            .collect(),
    }
}

/// The plan, for --dry-run and the confirmation prompt.
pub fn free_plan(report: &FreeReport) -> String {
    let mut out = String::new();
    if report.targets.is_empty() {
        let _ = writeln!(out, "Nothing in scope to signal.");
    } else {
        let _ = writeln!(out, "Would signal {} process(es):", report.targets.len());
        let mut table = new_table(&["PID", "PPID", "GPUS", "WHY", "COMMAND"]);
        for target in &report.targets {
            let pid = if target.fate == Fate::PermissionDenied {
                format!("{} (not permitted)", target.pid)
            } else {
                target.pid.to_string()
            };
            table.add_row(vec![
                Cell::new(pid),
                Cell::new(target.ppid),
                Cell::new(gpu_list(&target.gpus)),
                Cell::new(match (&target.orphan, &target.container_gone) {
                    (Some(orphan), _) => {
                        format!("{} (orphaned: {orphan})", because_text(target.because))
                    }
                    (None, Some(gone)) => {
                        format!("{} ({})", because_text(target.because), one_line(gone))
                    }
                    (None, None) => because_text(target.because),
                }),
                Cell::new(short(&target.cmdline, 70)),
            ]);
        }
        let _ = writeln!(out, "{}", table.trim_fmt());
    }
    spared_lines(report, &mut out);
    let refused = report
        .targets
        .iter()
        .filter(|target| target.fate == Fate::PermissionDenied)
        .count();
    if refused > 0 {
        let _ = writeln!(
            out,
            "{refused} of them could not be signalled: permission denied (they belong to another user); run as their owner or as root."
        );
    }
    let unchecked: Vec<String> = report
        .gpus
        .iter()
        .filter(|gpu| !gpu.checked)
        .map(|gpu| gpu.index.to_string())
        .collect();
    if !unchecked.is_empty() {
        let _ = writeln!(
            out,
            "The driver cannot list processes on GPU {}: processes with its device node open are taken as its users, weaker evidence (a monitor cannot be told apart), and whether the memory comes back cannot be verified.",
            unchecked.join(", ")
        );
    }
    stale_run_lines(report, &mut out);
    cgroup_scope_lines(report, &mut out);
    if !report.gpus.is_empty() {
        let summary: Vec<String> = report
            .gpus
            .iter()
            .map(|gpu| format!("GPU {} ({} used)", gpu.index, MaybeBytes(gpu.memory_before)))
            .collect();
        let _ = writeln!(out, "GPUs in scope: {}", summary.join(", "));
    }
    // What no signal frees, as `free` and `check` say it.
    for gpu in &report.gpus {
        for reason in &gpu.reasons {
            let _ = writeln!(out, "GPU {}: {}", gpu.index, Field(&reason.to_string()));
        }
    }
    out
}

fn gpu_list(gpus: &BTreeSet<u32>) -> String {
    if gpus.is_empty() {
        "-".to_string()
    } else {
        gpus.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The plan as `free_plan` gives it, one entry a line and narrow enough for
/// an 80-column view (`top`): each target's PID, GPUs, command and why, then
/// who is left alone and why, then the same notes.
pub fn free_plan_entries(report: &FreeReport) -> Vec<String> {
    let mut lines = Vec::new();
    if report.targets.is_empty() {
        lines.push("Nothing in scope to signal.".to_string());
    } else {
        lines.push(format!(
            "Would signal {} process(es):",
            report.targets.len()
        ));
    }
    for target in &report.targets {
        let why = match &target.orphan {
            Some(orphan) => format!("{} (orphaned: {orphan})", because_text(target.because)),
            None => because_text(target.because),
        };
        lines.push(format!(
            "  {}{} GPU {} {}: {}",
            target.pid,
            if target.fate == Fate::PermissionDenied {
                " (not permitted)"
            } else {
                ""
            },
            gpu_list(&target.gpus),
            short(&target.cmdline, 40),
            Field(&why)
        ));
    }
    let mut rest = String::new();
    spared_lines(report, &mut rest);
    lines.extend(rest.lines().map(str::to_string));
    lines
}

fn spared_lines(report: &FreeReport, out: &mut String) {
    for spared in &report.spared {
        let _ = writeln!(
            out,
            "Left alone: {} ({}): {}",
            spared.pid,
            short(&spared.cmdline, 50),
            Field(&spared.reason.to_string())
        );
    }
}

/// One line per `--container`, `--pod`, `--cgroup`: what it resolved to.
fn cgroup_scope_lines(report: &FreeReport, out: &mut String) {
    for found in &report.cgroup_scopes {
        let what = match (&found.container, &found.pod_uid) {
            (Some((runtime, id)), _) => format!("{} container {}", runtime.name(), short_id(id)),
            (None, Some(uid)) if found.wanted.kind() == "pod" => format!("pod {uid}"),
            _ => found.wanted.kind().to_string(),
        };
        let cgroups: Vec<&str> = found.cgroups.iter().map(String::as_str).collect();
        let place = match cgroups.as_slice() {
            [] => String::new(),
            [one] => format!(" in {}", Field(one)),
            [first, rest @ ..] => format!(" in {} and {} more cgroup(s)", Field(first), rest.len()),
        };
        let note = found
            .note
            .as_deref()
            .map(|note| format!(" ({})", Field(note)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{} {}: {what}, {} process(es){place}{note}",
            found.wanted.flag(),
            Field(&found.wanted.given()),
            found.members.len(),
        );
    }
}

/// One line per stale run's cgroup (`--stale-runs`).
fn stale_run_lines(report: &FreeReport, out: &mut String) {
    for run in &report.stale_runs {
        let outcome = match (&run.error, run.removed, report.dry_run) {
            (_, true, _) => "removed".to_string(),
            (Some(error), false, _) => format!("not removed: {}", Field(error)),
            (None, false, true) => "removed once empty".to_string(),
            (None, false, false) => "not removed".to_string(),
        };
        let _ = writeln!(
            out,
            "Stale run {} ({}): {outcome}",
            Field(&run.cgroup),
            Field(&run.gone)
        );
    }
}

/// What `free` did, then one outcome line per GPU.
pub fn free_outcome(report: &FreeReport) -> String {
    let mut out = String::new();
    if report.targets.is_empty() {
        let _ = writeln!(out, "Nothing in scope to signal.");
    } else {
        let mut table = new_table(&["PID", "SIGNALS", "RESULT", "COMMAND"]);
        for target in &report.targets {
            let signals: Vec<&str> = target.sent().map(Sig::name).collect();
            let result = match (target.fate, target.exited_after_ms) {
                (Fate::Exited, Some(ms)) => format!(
                    "exited after {}",
                    Elapsed(std::time::Duration::from_millis(ms))
                ),
                (Fate::Exited, None) => "exited".to_string(),
                (Fate::Zombie, _) => "zombie (already exited)".to_string(),
                (Fate::Alive, _) => "alive".to_string(),
                (Fate::PermissionDenied, _) => "permission denied".to_string(),
            };
            table.add_row(vec![
                Cell::new(target.pid),
                Cell::new(if signals.is_empty() {
                    "-".to_string()
                } else {
                    signals.join(",")
                }),
                Cell::new(result),
                Cell::new(short(&target.cmdline, 60)),
            ]);
        }
        let _ = writeln!(out, "{}", table.trim_fmt());
    }
    spared_lines(report, &mut out);
    stale_run_lines(report, &mut out);
    cgroup_scope_lines(report, &mut out);
    for line in gpu_outcome_lines(report) {
        let _ = writeln!(out, "{line}");
    }
    if !report.unreadable.is_empty() {
        let _ = writeln!(
            out,
            "Partial scan: {} process(es) could not be inspected; holders among them were not seen.",
            report.unreadable.len()
        );
    }
    out
}

/// What a free did to its targets, counted by what happened, then who it
/// left alone and why: `0 signalled, 1 had already exited, 1 left alone
/// (monitor)`. A target is signalled only when a signal reached it; one
/// that had exited (or whose PID names another process now) by the time
/// the free came to it was not.
pub fn free_counts(report: &FreeReport) -> String {
    let mut signalled = 0;
    let mut exited = 0;
    let mut denied = 0;
    let mut failed = 0;
    for target in &report.targets {
        let sent = target.sent().next().is_some();
        match target.fate {
            _ if sent => signalled += 1,
            Fate::Exited | Fate::Zombie => exited += 1,
            Fate::PermissionDenied => denied += 1,
            Fate::Alive => failed += 1,
        }
    }
    let mut parts = vec![format!("{signalled} signalled")];
    for (count, what) in [
        (exited, "had already exited"),
        (denied, "not permitted"),
        (failed, "could not be signalled"),
    ] {
        if count > 0 {
            parts.push(format!("{count} {what}"));
        }
    }
    if !report.spared.is_empty() {
        let mut why: BTreeMap<&str, usize> = BTreeMap::new();
        for spared in &report.spared {
            *why.entry(spared.reason.code()).or_default() += 1;
        }
        let why: Vec<String> = why
            .into_iter()
            .map(|(reason, count)| {
                if count > 1 {
                    format!("{count} {reason}")
                } else {
                    reason.to_string()
                }
            })
            .collect();
        parts.push(format!(
            "{} left alone ({})",
            report.spared.len(),
            why.join(", ")
        ));
    }
    parts.join(", ")
}

/// One outcome line per GPU, each still-held GPU followed by its reasons.
pub fn gpu_outcome_lines(report: &FreeReport) -> Vec<String> {
    let mut lines = Vec::new();
    for gpu in &report.gpus {
        if gpu.freed {
            lines.push(format!(
                "GPU {}: freed {} in {} ({} used now)",
                gpu.index,
                MaybeBytes(gpu.freed_bytes),
                Elapsed(std::time::Duration::from_millis(
                    gpu.freed_after_ms.unwrap_or(report.elapsed_ms)
                )),
                MaybeBytes(gpu.memory_after)
            ));
        } else if !gpu.checked {
            lines.push(format!(
                "GPU {}: not verified after {}: the driver cannot report on it",
                gpu.index,
                Elapsed(std::time::Duration::from_millis(report.elapsed_ms))
            ));
            lines.extend(
                gpu.reasons
                    .iter()
                    .map(|reason| format!("  - {}", Field(&reason.to_string()))),
            );
            lines.extend(gpu.advice.iter().map(|line| format!("  - {}", Field(line))));
        } else {
            lines.push(format!(
                "GPU {}: still held, {} used after {}",
                gpu.index,
                MaybeBytes(gpu.memory_after),
                Elapsed(std::time::Duration::from_millis(report.elapsed_ms))
            ));
            // What out of scope uses there, so that the figures add up.
            lines.extend(gpu.others.iter().map(|other| {
                format!(
                    "  - {} used by pid {} ({}), out of scope",
                    MaybeBytes(other.memory),
                    other.pid,
                    Field(other.comm.as_deref().unwrap_or("another PID namespace"))
                )
            }));
            lines.extend(
                gpu.reasons
                    .iter()
                    .map(|reason| format!("  - {}", Field(&reason.to_string()))),
            );
            lines.extend(gpu.advice.iter().map(|line| format!("  - {}", Field(line))));
        }
    }
    lines
}

#[derive(Debug, Serialize)]
pub struct WaitJson<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    pub ready: bool,
    pub waited_ms: u64,
    pub below: u64,
    pub gpus: &'a [WaitGpu],
    /// On timeout, who holds the GPUs that were not ready; empty when ready.
    pub holders: Vec<HolderJson>,
}

pub fn wait_lines(gpus: &[WaitGpu], below: u64, waited_ms: u64) -> String {
    let mut out = String::new();
    for gpu in gpus {
        let state = if gpu.ready { "ready" } else { "busy" };
        let _ = write!(
            out,
            "GPU {}: {state}, {} used (limit {}) after {}",
            gpu.index,
            MaybeBytes(gpu.memory_used),
            Bytes(below),
            Elapsed(std::time::Duration::from_millis(waited_ms))
        );
        if let Some(error) = &gpu.error {
            let _ = write!(out, " ({})", Field(&error.to_string()));
        }
        let _ = writeln!(out);
    }
    out
}

/// Total memory per GPU, for the progress line.
pub fn progress_text(progress: &crate::reap::Progress) -> String {
    let mut text = format!(
        "{} · {} alive · {}",
        progress.phase,
        progress.alive,
        Elapsed(progress.elapsed)
    );
    let memory: BTreeMap<u32, (Option<u64>, bool)> = progress
        .gpus
        .iter()
        .map(|&(index, used, freed)| (index, (used, freed)))
        .collect();
    for (index, (used, freed)) in memory {
        let _ = write!(
            text,
            " · GPU {index} {}{}",
            MaybeBytes(used),
            if freed { " ✓" } else { "" }
        );
    }
    text
}

#[cfg(test)]
mod tests {
    //! Container names, pods and namespaces come from the node's sources:
    //! anyone's text, escaped in every output as comms are.
    use super::*;
    use crate::container::{Container, Runtime};
    use crate::proc::ProcessRecord;
    use crate::snapshot::{Details, GpuUser};

    const ID: &str = "3f4a8e1b2c9d0e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f";

    fn holding(container: Container) -> Snapshot {
        let pid = 4242;
        let record = ProcessRecord {
            cmdline: "python3 -m vllm".to_string(),
            ..ProcessRecord::sleeping(pid, "python3")
        };
        let user = GpuUser {
            pid,
            memory: Some(1 << 30),
            listed: true,
            node_open: true,
            hidden: false,
        };
        Snapshot {
            details: BTreeMap::from([(
                pid,
                Details {
                    container: Some(container),
                    ..Details::default()
                },
            )]),
            ..Snapshot::one_gpu(1 << 30, vec![user], BTreeMap::from([(pid, record)]))
        }
    }

    #[test]
    fn names_from_the_sources_are_escaped_in_the_table_and_tree() {
        let mut container = Container::new(Runtime::Containerd, ID.to_string(), None);
        container.name = Some("evil\n0 1 2\u{1b}[31m".to_string());
        container.namespace = Some("ns\"x".to_string());
        container.pod = Some("pod\r".to_string());
        let snapshot = holding(container);
        for text in [
            status_table(&snapshot, &None),
            status_tree(&snapshot, &None),
        ] {
            assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text}");
            assert!(
                !text.lines().any(|line| line.starts_with("0 1 2")),
                "{text}"
            );
        }
        let json = status_json(&snapshot, &None);
        assert!(!json.contains('\u{1b}'), "{json}");
        let parsed: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(
            parsed["holders"][0]["container"]["name"],
            "evil\n0 1 2\u{1b}[31m"
        );
    }

    #[test]
    fn the_label_is_the_pod_and_name_else_runtime_and_short_id() {
        let mut container = Container::new(Runtime::CriO, ID.to_string(), None);
        assert_eq!(ContainerJson::of(&container).label(), "cri-o:3f4a8e1b2c9d");
        container.name = Some("vllm".to_string());
        assert_eq!(ContainerJson::of(&container).label(), "vllm");
        container.pod = Some("server-0".to_string());
        container.namespace = Some("llm".to_string());
        assert_eq!(ContainerJson::of(&container).label(), "llm/server-0 vllm");
        let table = status_table(&holding(container), &None);
        assert!(table.contains("llm/server-0 vllm"), "{table}");
    }
}
