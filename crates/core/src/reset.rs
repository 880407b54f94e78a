//! Resetting a GPU: the one remedy for memory that no process holds.
//!
//! Driver-held memory (a context the driver never tore down) survives every
//! signal; only a GPU reset or a reboot clears it. A reset is never implicit
//! (`gpureap reset`, or `--reset` in the Slurm epilog and health check), and
//! never of a GPU that any process still uses: the snapshot must show no
//! process with the GPU's device node open and none listed by the driver,
//! must have read every process but this gpureap's own ancestors (one it
//! could not inspect may have the node open), and the driver checks again. The result is verified through the driver.
//! Nor from a PID namespace of its own (a container without the host's
//! PIDs): a driver that omits other namespaces' processes from its lists
//! (NVML 580) shows a GPU in use there as one held by no process.

use std::fmt;

use crate::driver::evidence::Platform;
use crate::driver::{Driver, DriverErrorKind};
use crate::exit::Exit;
use crate::snapshot::Snapshot;
use crate::units::{Bytes, Field};

/// What became of one GPU's reset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reset {
    /// Reset, and the driver now reports no memory held by no process
    /// beyond its bookkeeping. `held`: what was held by no process before.
    Done { index: u32, held: Option<u64> },
    /// Nothing held that a reset would clear: not reset. `unattributed`:
    /// the memory no process explains, within the driver's bookkeeping.
    NothingHeld { index: u32, unattributed: u64 },
    /// Not reset: a process uses the GPU.
    InUse { index: u32, users: Vec<String> },
    /// Not reset: the scan could not inspect every process, so whether one
    /// has the GPU's device node open cannot be told.
    Unscanned {
        index: u32,
        unreadable: usize,
        example: String,
    },
    /// Not reset: gpureap runs in a PID namespace of its own, so the
    /// processes of other namespaces, which the driver may omit from its
    /// lists, may use the GPU (`UnattributedKind::Unseen`). `unattributed`:
    /// the memory no listed process explains.
    Unseen {
        index: u32,
        unattributed: Option<u64>,
    },
    /// The driver refused or failed the reset, or could not be read.
    Failed { index: u32, message: String },
    /// Reset, but memory is still held afterwards.
    StillHeld { index: u32, bytes: u64 },
}

impl Reset {
    pub fn index(&self) -> u32 {
        match self {
            Reset::Done { index, .. }
            | Reset::NothingHeld { index, .. }
            | Reset::InUse { index, .. }
            | Reset::Unscanned { index, .. }
            | Reset::Unseen { index, .. }
            | Reset::Failed { index, .. }
            | Reset::StillHeld { index, .. } => *index,
        }
    }

    /// Whether the GPU is clean now.
    pub fn clean(&self) -> bool {
        matches!(self, Reset::Done { .. } | Reset::NothingHeld { .. })
    }
}

impl fmt::Display for Reset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reset::Done { index, held } => match held {
                Some(bytes) => write!(f, "GPU {index}: reset; {} cleared", Bytes(*bytes)),
                None => write!(f, "GPU {index}: reset"),
            },
            Reset::NothingHeld {
                index,
                unattributed,
            } => write!(
                f,
                "GPU {index}: {} held by no process, within the driver's bookkeeping; not reset",
                Bytes(*unattributed)
            ),
            Reset::InUse { index, users } => write!(
                f,
                "GPU {index}: not reset: in use by {}; free it first (gpureap free --gpu {index})",
                users.join(", ")
            ),
            Reset::Unscanned {
                index,
                unreadable,
                example,
            } => write!(
                f,
                "GPU {index}: not reset: {unreadable} process(es) could not be inspected (e.g. {example}), and any of them may have its device node open; run as root with CAP_SYS_PTRACE"
            ),
            Reset::Unseen {
                index,
                unattributed,
            } => write!(
                f,
                "GPU {index}: not reset: gpureap runs in a PID namespace of its own (a container without the host's PIDs), and the driver may omit other namespaces' processes from its lists, so {} may be held by processes it cannot see; run gpureap reset on the host, or with the host's PIDs (`docker run --pid=host`, `hostPID: true`)",
                match unattributed {
                    Some(bytes) => format!("the {} no listed process explains", Bytes(*bytes)),
                    None => "the GPU".to_string(),
                }
            ),
            Reset::Failed { index, message } => {
                write!(f, "GPU {index}: reset failed: {}", Field(message))
            }
            Reset::StillHeld { index, bytes } => {
                write!(f, "GPU {index}: reset, but {} is still held", Bytes(*bytes))
            }
        }
    }
}

/// Resets GPU `index` if, and only if, memory is held on it by no process
/// (the one rule, `Snapshot::held_by_no_process`: beyond the driver's
/// bookkeeping) and no process uses it; then checks by the same rule.
pub fn reset(driver: &dyn Driver, index: u32) -> Reset {
    let before = Snapshot::take(driver);
    let Some(gpu) = before.gpu(index) else {
        return Reset::Failed {
            index,
            message: "the driver does not report this GPU".to_string(),
        };
    };
    if let Some(error) = &gpu.error {
        return Reset::Failed {
            index,
            message: error.to_string(),
        };
    }
    // From a PID namespace of its own the driver's lists may leave out
    // what uses the GPU: never reset from there.
    if before.may_miss_holders() {
        return Reset::Unseen {
            index,
            unattributed: before.held_by_no_process(gpu).map(|held| held.bytes),
        };
    }
    let users: Vec<String> = gpu
        .users
        .iter()
        .filter(|user| user.listed || user.node_open)
        .filter(|user| {
            before
                .processes
                .get(&user.pid)
                .is_none_or(|process| !process.state.has_exited())
        })
        .map(|user| match before.processes.get(&user.pid) {
            Some(process) => format!("pid {} ({})", user.pid, Field(&process.comm)),
            None => format!("pid {} (another PID namespace)", user.pid),
        })
        .collect();
    if !users.is_empty() {
        return Reset::InUse { index, users };
    }
    // The chain that started this gpureap (init, sshd, sudo, slurmd) is
    // not counted: a root gpureap in a container may be unable to read
    // init's descriptors, and that chain is the caller's own.
    let ancestors = crate::proc::ancestors_of_self();
    let unreadable: Vec<_> = before
        .unreadable
        .iter()
        .filter(|entry| !ancestors.contains(&entry.pid))
        .collect();
    if let Some(first) = unreadable.first() {
        return Reset::Unscanned {
            index,
            unreadable: unreadable.len(),
            example: format!("pid {} {}: {}", first.pid, Field(&first.comm), first.reason),
        };
    }
    // No process uses the GPU: all it uses is held by no process. Where the
    // driver gives no figure, the reset goes ahead.
    let held = before.held_by_no_process(gpu);
    if let Some(unattributed) = held.filter(|unattributed| !unattributed.holds()) {
        return Reset::NothingHeld {
            index,
            unattributed: unattributed.bytes,
        };
    }
    if let Err(error) = driver.reset(index) {
        return Reset::Failed {
            index,
            message: error.to_string(),
        };
    }
    let after = Snapshot::take(driver);
    let Some(gpu) = after.gpu(index) else {
        return Reset::Failed {
            index,
            message: "reset, but the driver no longer reports this GPU".to_string(),
        };
    };
    if let Some(error) = &gpu.error {
        return Reset::Failed {
            index,
            message: format!("reset, but the driver cannot say what is held now: {error}"),
        };
    }
    match after.held_by_no_process(gpu) {
        Some(unattributed) if unattributed.holds() => Reset::StillHeld {
            index,
            bytes: unattributed.bytes,
        },
        _ => Reset::Done {
            index,
            held: held.map(|unattributed| unattributed.bytes),
        },
    }
}

/// The exit code of `gpureap reset`: the worst of its GPUs. A GPU that
/// could not be checked (the driver failed, or the scan could not tell
/// whether a process uses it) is 3, could not complete.
pub fn exit(outcomes: &[Reset]) -> Exit {
    Exit::worst(outcomes.iter().map(|outcome| match outcome {
        Reset::Done { .. } | Reset::NothingHeld { .. } => Exit::Success,
        Reset::InUse { .. } | Reset::StillHeld { .. } => Exit::StillHeld,
        Reset::Unscanned { .. } | Reset::Unseen { .. } | Reset::Failed { .. } => Exit::Incomplete,
    }))
}

/// Who a process that keeps a GPU from a reset is, by what it is: the role
/// says how the operator deals with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    PersistenceDaemon,
    Dcgm,
    FabricManager,
    DisplayServer,
    CudaUser,
    Monitor,
    OtherNamespace,
}

impl Role {
    /// By its program (argv[0]'s basename) or its comm (15 characters at
    /// most), and whether the driver lists it (a context: a CUDA user).
    fn of(process: &crate::proc::ProcessRecord, listed: bool) -> Role {
        [process.program(), process.comm.as_str()]
            .into_iter()
            .map(|name| Role::named(name, listed))
            .find(|role| !matches!(role, Role::CudaUser | Role::Monitor))
            .unwrap_or(if listed {
                Role::CudaUser
            } else {
                Role::Monitor
            })
    }

    fn named(comm: &str, listed: bool) -> Role {
        const DISPLAY: [&str; 6] = [
            "Xorg",
            "X",
            "Xwayland",
            "gnome-shell",
            "kwin_wayland",
            "sway",
        ];
        if comm.starts_with("nvidia-persiste") {
            Role::PersistenceDaemon
        } else if comm.starts_with("nv-hostengine") || comm.starts_with("dcgm") {
            Role::Dcgm
        } else if comm.starts_with("nv-fabricmanage") || comm.starts_with("nvidia-fabricm") {
            Role::FabricManager
        } else if DISPLAY.contains(&comm) {
            Role::DisplayServer
        } else if listed {
            Role::CudaUser
        } else {
            Role::Monitor
        }
    }

    /// What the operator does about it, for GPU `index`.
    fn remedy(self, index: u32) -> String {
        match self {
            Role::PersistenceDaemon => {
                "stop it for the reset (systemctl stop nvidia-persistenced), start it after".to_string()
            }
            Role::Dcgm => {
                "stop DCGM for the reset (systemctl stop nvidia-dcgm; scale the dcgm-exporter DaemonSet off this node)".to_string()
            }
            Role::FabricManager => {
                "keep it running: on NVSwitch systems the reset goes through it; it should not hold the GPU's node: check its version".to_string()
            }
            Role::DisplayServer => {
                "stop the display manager (systemctl stop display-manager) or move the display to another GPU".to_string()
            }
            Role::CudaUser => format!("free it first (gpureap free --gpu {index})"),
            Role::Monitor => "stop the monitor for the reset (it holds no memory)".to_string(),
            Role::OtherNamespace => {
                "find its container (the driver lists a PID this /proc does not show) and stop it".to_string()
            }
        }
    }
}

/// One thing that keeps a GPU from being reset now, or that the operator
/// should know before one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Blocker {
    /// `process`, `module`, `gpu`, `scan`, `platform`.
    pub kind: &'static str,
    pub role: Option<Role>,
    pub pid: Option<u32>,
    /// What it is (a process's comm, a module's name): untrusted, escaped when shown.
    pub name: String,
    /// Whether it stops a reset now (else a note).
    pub blocks: bool,
    /// What the operator does about it.
    pub remedy: String,
    /// What `gpureap reset` does about it.
    pub reset_does: String,
}

/// `gpureap reset --plan` for one GPU: read-only.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    pub index: u32,
    pub persistence_mode: Option<bool>,
    pub blockers: Vec<Blocker>,
    /// `Some(true)` when nothing blocks a reset now; `None` when it cannot be told.
    pub could_reset: Option<bool>,
}

const REFUSES: &str = "refuses the reset while it has the GPU's device node open";

/// What keeps GPU `index` from a reset now, each by role, from one snapshot
/// and what the driver and platform tell. Signals and resets nothing.
pub fn plan(driver: &dyn Driver, snapshot: &Snapshot, platform: &Platform, index: u32) -> Plan {
    let mut blockers = Vec::new();
    let mut unknown = false;
    match snapshot.gpu(index) {
        None => {
            unknown = true;
            blockers.push(gpu_blocker(
                "the driver does not report this GPU".to_string(),
            ));
        }
        Some(gpu) => {
            if let Some(error) = &gpu.error {
                if error.kind() != DriverErrorKind::Lost {
                    unknown = true;
                }
                blockers.push(gpu_blocker(Field(&error.to_string()).to_string()));
            }
            blockers.extend(process_blockers(snapshot, gpu, index));
        }
    }
    let ancestors = crate::proc::ancestors_of_self();
    let unreadable = snapshot
        .unreadable
        .iter()
        .filter(|entry| !ancestors.contains(&entry.pid))
        .count();
    if unreadable > 0 {
        unknown = true;
        blockers.push(Blocker {
            kind: "scan",
            role: None,
            pid: None,
            name: format!("{unreadable} process(es) not inspected"),
            blocks: true,
            remedy: "run as root with CAP_SYS_PTRACE: any of them may have the node open"
                .to_string(),
            reset_does: "refuses the reset while the scan is partial".to_string(),
        });
    }
    blockers.extend(platform_blockers(snapshot, platform, index));
    let blocks = blockers.iter().any(|blocker| blocker.blocks);
    Plan {
        index,
        persistence_mode: driver.persistence_mode(index),
        blockers,
        could_reset: if blocks {
            Some(false)
        } else if unknown {
            None
        } else {
            Some(true)
        },
    }
}

fn gpu_blocker(name: String) -> Blocker {
    Blocker {
        kind: "gpu",
        role: None,
        pid: None,
        name,
        blocks: true,
        remedy: "a lost GPU comes back only with a reboot of the node".to_string(),
        reset_does: "refuses: the driver cannot reach the GPU".to_string(),
    }
}

/// Every live process with the GPU's node open or listed on it, by role.
fn process_blockers(
    snapshot: &Snapshot,
    gpu: &crate::snapshot::GpuState,
    index: u32,
) -> Vec<Blocker> {
    // This gpureap opens the node to ask the driver: it is no blocker (a
    // reset it ran would be done by it), as seen on an H200 through NVML.
    let this = std::process::id();
    gpu.users
        .iter()
        .filter(|user| (user.listed || user.node_open) && user.pid != this)
        .filter_map(|user| {
            let process = snapshot.processes.get(&user.pid);
            if process.is_some_and(|process| process.state.has_exited()) {
                return None;
            }
            let (role, name) = match process {
                // A CUDA process opens every GPU's node: one with a context
                // on any GPU is a CUDA user of this one too.
                Some(process) if !user.hidden => (
                    Role::of(process, listed_anywhere(snapshot, user.pid)),
                    process.program().to_string(),
                ),
                _ => (Role::OtherNamespace, String::new()),
            };
            Some(Blocker {
                kind: "process",
                role: Some(role),
                pid: Some(user.pid),
                name,
                blocks: true,
                remedy: role.remedy(index),
                reset_does: REFUSES.to_string(),
            })
        })
        .collect()
}

fn listed_anywhere(snapshot: &Snapshot, pid: u32) -> bool {
    snapshot
        .gpus
        .iter()
        .any(|gpu| gpu.users.iter().any(|user| user.pid == pid && user.listed))
}

/// The driver's modules in use and NVSwitch constraints.
fn platform_blockers(snapshot: &Snapshot, platform: &Platform, index: u32) -> Vec<Blocker> {
    let mut blockers = Vec::new();
    for module in &platform.modules {
        let users = module.refcount.unwrap_or(0);
        let (blocks, remedy) = match module.name.as_str() {
            "nvidia_drm" if users > 0 => (
                true,
                format!(
                    "{users} user(s) of nvidia_drm (a display or DRM client): stop the display manager; with modeset=1 the driver refuses a reset of the GPU it drives"
                ),
            ),
            "nvidia_uvm" if users > 0 => (
                false,
                format!(
                    "{users} user(s) of nvidia_uvm: CUDA processes on this or another GPU; only those on this GPU block it"
                ),
            ),
            _ => continue,
        };
        blockers.push(Blocker {
            kind: "module",
            role: None,
            pid: None,
            name: module.name.clone(),
            blocks,
            remedy,
            reset_does: "does not check modules: the driver refuses the reset itself".to_string(),
        });
    }
    if platform.nvswitch == Some(true) {
        let elsewhere: Vec<String> = snapshot
            .gpus
            .iter()
            .filter(|other| other.index != index)
            .filter(|other| other.users.iter().any(|user| user.listed))
            .map(|other| other.index.to_string())
            .collect();
        blockers.push(Blocker {
            kind: "platform",
            role: Some(Role::FabricManager),
            pid: None,
            name: "NVSwitch (HGX)".to_string(),
            blocks: !elsewhere.is_empty(),
            remedy: if elsewhere.is_empty() {
                "GPUs joined by NVSwitches: keep nvidia-fabricmanager running; the driver may reset the GPUs of one NVLink domain together".to_string()
            } else {
                format!(
                    "GPUs joined by NVSwitches: CUDA processes on GPU(s) {} share the NVLink fabric; free them or reset the whole baseboard",
                    elsewhere.join(",")
                )
            },
            reset_does: "does not check the fabric: the driver refuses what it cannot reset".to_string(),
        });
    }
    blockers
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match self.could_reset {
            Some(true) => "a reset could run now",
            Some(false) => "a reset cannot run now",
            None => "whether a reset could run cannot be told",
        };
        writeln!(
            f,
            "GPU {}: {verdict} (read-only: nothing was reset)",
            self.index
        )?;
        let persistence = match self.persistence_mode {
            Some(true) => {
                "on (the driver stays loaded with no client; nvidia-persistenced, if it runs, holds the GPU open)"
            }
            Some(false) => "off",
            None => "unknown",
        };
        writeln!(f, "  persistence mode: {persistence}")?;
        for blocker in &self.blockers {
            let who = match (blocker.pid, &blocker.role) {
                (Some(pid), Some(role)) => format!(
                    "pid {pid} ({}, {})",
                    Field(if blocker.name.is_empty() {
                        "another PID namespace"
                    } else {
                        &blocker.name
                    }),
                    role_word(*role)
                ),
                _ => Field(&blocker.name).to_string(),
            };
            writeln!(
                f,
                "  {} {}: {}; gpureap reset {}",
                if blocker.blocks { "blocker" } else { "note:" },
                who,
                blocker.remedy,
                blocker.reset_does
            )?;
        }
        Ok(())
    }
}

fn role_word(role: Role) -> &'static str {
    match role {
        Role::PersistenceDaemon => "persistence daemon",
        Role::Dcgm => "DCGM",
        Role::FabricManager => "fabric manager",
        Role::DisplayServer => "display server",
        Role::CudaUser => "CUDA user",
        Role::Monitor => "monitor",
        Role::OtherNamespace => "another PID namespace",
    }
}

/// The exit code of `reset --plan`: 0 when a reset could run now on every
/// GPU, 1 when something blocks one, 3 when it cannot be told.
pub fn plan_exit(plans: &[Plan]) -> Exit {
    Exit::worst(plans.iter().map(|plan| match plan.could_reset {
        Some(true) => Exit::Success,
        Some(false) => Exit::StillHeld,
        None => Exit::Incomplete,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proc::ProcessRecord;
    use crate::snapshot::GpuUser;
    use std::collections::BTreeMap;

    /// The gpureap that plans has the GPU's node open (NVML opened it): on
    /// an idle H200 `reset --plan` named itself a monitor blocking the reset.
    #[test]
    fn the_planning_gpureap_is_no_blocker_of_its_own_plan() {
        let this = std::process::id();
        let record = ProcessRecord::sleeping;
        let user = |pid: u32, listed: bool| GpuUser {
            pid,
            memory: listed.then_some(1 << 30),
            listed,
            node_open: true,
            hidden: false,
        };
        let snapshot = Snapshot::one_gpu(
            1 << 30,
            vec![user(this, false), user(4242, true)],
            BTreeMap::from([
                (this, record(this, "gpureap")),
                (4242, record(4242, "python3")),
            ]),
        );
        let blockers = process_blockers(&snapshot, &snapshot.gpus[0], 0);
        let pids: Vec<Option<u32>> = blockers.iter().map(|blocker| blocker.pid).collect();
        assert_eq!(pids, vec![Some(4242)], "{blockers:?}");
    }
}
