//! MIG instances in the status report (docs/mig.md): rows under their GPU
//! in the table, `gpus[].instances` in JSON, `0:1` where a holder is placed.

use comfy_table::{Cell, CellAlignment, Table};
use serde::Serialize;

use crate::snapshot::{GpuState, Snapshot};
use crate::units::{MaybeBytes, short};

/// One MIG instance in the status JSON.
#[derive(Debug, Serialize)]
pub struct InstanceJson {
    /// Its MIG device index on its GPU: `--gpu 0:1` names index 1 of GPU 0.
    pub index: u32,
    /// How gpureap names it: `0:1`.
    pub name: String,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    pub profile: Option<String>,
    pub uuid: Option<String>,
    pub memory_total: Option<u64>,
    pub memory_used: Option<u64>,
    /// Used memory that no process listed on this instance explains.
    pub memory_unattributed: Option<u64>,
    /// The one rule, per instance (`Snapshot::held_by_no_process_in`).
    pub held_by_no_process: Option<bool>,
    pub unattributed_kind: Option<&'static str>,
    pub processes: Vec<InstanceProcessJson>,
}

/// A process listed on an instance, with its memory there.
#[derive(Debug, Serialize)]
pub struct InstanceProcessJson {
    pub pid: u32,
    pub memory: Option<u64>,
}

/// `G:I`, how an instance is named everywhere.
pub(crate) fn instance_name(gpu: u32, index: u32) -> String {
    format!("{gpu}:{index}")
}

pub(crate) fn instances_json(snapshot: &Snapshot, gpu: &GpuState) -> Vec<InstanceJson> {
    gpu.instances
        .iter()
        .map(|instance| {
            let judged = snapshot.held_by_no_process_in(gpu, instance);
            InstanceJson {
                index: instance.index,
                name: instance_name(gpu.index, instance.index),
                gpu_instance_id: instance.gpu_instance_id,
                compute_instance_id: instance.compute_instance_id,
                profile: instance.profile.clone(),
                uuid: instance.uuid.clone(),
                memory_total: instance.memory_total,
                memory_used: instance.memory_used,
                memory_unattributed: judged.map(|unattributed| unattributed.bytes),
                held_by_no_process: judged.and_then(|unattributed| unattributed.verdict()),
                unattributed_kind: judged.map(|unattributed| unattributed.kind_name()),
                processes: instance
                    .processes
                    .iter()
                    .map(|process| InstanceProcessJson {
                        pid: process.pid,
                        memory: process.used_memory,
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The instances of `gpu` whose lists have `pid`.
pub(crate) fn instances_of(gpu: &GpuState, pid: u32) -> Vec<u32> {
    gpu.instances
        .iter()
        .filter(|instance| instance.lists(pid))
        .map(|instance| instance.index)
        .collect()
}

/// Where the holders table and tree place a holder: `0`, or `0:1`.
pub(crate) fn place_name(gpu: u32, instances: &[u32]) -> String {
    if instances.is_empty() {
        return gpu.to_string();
    }
    instances
        .iter()
        .map(|&index| instance_name(gpu, index))
        .collect::<Vec<_>>()
        .join(",")
}

/// One row per instance under its GPU's row: `0:1`, profile and ids,
/// memory, what no holder explains, holders.
pub(crate) fn add_instance_rows(table: &mut Table, snapshot: &Snapshot, gpu: &GpuState) {
    if gpu.error.is_some() {
        return;
    }
    for instance in &gpu.instances {
        let id = |id: Option<u32>| id.map_or("?".to_string(), |id| id.to_string());
        let label = format!(
            "MIG {} (gi {}, ci {})",
            instance.profile.as_deref().unwrap_or("?"),
            id(instance.gpu_instance_id),
            id(instance.compute_instance_id)
        );
        table.add_row(vec![
            Cell::new(format!(" {}", instance_name(gpu.index, instance.index))),
            Cell::new(short(&label, 40)),
            Cell::new(MaybeBytes(instance.memory_used)).set_alignment(CellAlignment::Right),
            Cell::new(MaybeBytes(instance.memory_total)).set_alignment(CellAlignment::Right),
            Cell::new(MaybeBytes(
                snapshot
                    .held_by_no_process_in(gpu, instance)
                    .map(|unattributed| unattributed.bytes),
            ))
            .set_alignment(CellAlignment::Right),
            Cell::new(instance.processes.len()),
        ]);
    }
}

/// What the table cannot show: a GPU in MIG mode with no instance.
pub fn notes(gpu: &GpuState) -> Option<String> {
    (gpu.error.is_none() && gpu.mig_mode == Some(true) && gpu.instances.is_empty()).then(|| {
        format!(
            "GPU {} is in MIG mode with no instances: nothing can use it until one is created",
            gpu.index
        )
    })
}
