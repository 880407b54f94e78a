//! MIG instances in the exposition (docs/mig.md, docs/monitoring.md): one
//! series per instance, labelled with its GPU and `gpu_instance`,
//! `compute_instance` and `profile`, beside the GPU's own, which keep
//! their labels; and each GPU's MIG mode.

use prometheus_client::registry::{Registry, Unit};

use super::{Labels, Options, bytes, gauge_family, set};
use crate::driver::MigInstance;
use crate::snapshot::{GpuState, Snapshot};

/// The instance's labels: its GPU's `gpu`, `instance` (`0:1`), the ids and
/// profile, and its `MIG-` UUID where the driver gives one.
fn instance_labels(gpu: &GpuState, instance: &MigInstance) -> Labels {
    let id = |id: Option<u32>| id.map_or_else(String::new, |id| id.to_string());
    let mut labels = vec![
        ("gpu", gpu.index.to_string()),
        ("instance", format!("{}:{}", gpu.index, instance.index)),
        ("gpu_instance", id(instance.gpu_instance_id)),
        ("compute_instance", id(instance.compute_instance_id)),
        ("profile", instance.profile.clone().unwrap_or_default()),
    ];
    if let Some(uuid) = &instance.uuid {
        labels.push(("uuid", uuid.clone()));
    }
    labels
}

pub(super) fn encode_instances(registry: &mut Registry, snapshot: &Snapshot, options: &Options) {
    let mode = gauge_family(
        registry,
        "gpu_mig_mode",
        "1 when the GPU is in MIG mode, 0 when not; absent where the driver does not say",
        None,
    );
    let used = gauge_family(
        registry,
        "mig_instance_memory_used",
        "MIG instance memory in use, as the driver reports it",
        Some(Unit::Bytes),
    );
    let total = gauge_family(
        registry,
        "mig_instance_memory_total",
        "MIG instance memory in all, as the driver reports it",
        Some(Unit::Bytes),
    );
    let unattributed = gauge_family(
        registry,
        "mig_instance_memory_unattributed",
        "Used memory of the MIG instance that no process the driver lists on it explains",
        Some(Unit::Bytes),
    );
    let held = gauge_family(
        registry,
        "mig_instance_held_by_no_process",
        "1 when memory no process explains makes the MIG instance held (the one rule, per instance); 0 when it does not; absent where it cannot be told",
        None,
    );
    let holders = gauge_family(
        registry,
        "mig_instance_holders",
        "Processes the driver lists on the MIG instance",
        None,
    );
    let wanted = |index: u32| options.gpus.as_ref().is_none_or(|set| set.contains(&index));
    for gpu in snapshot
        .gpus
        .iter()
        .filter(|gpu| wanted(gpu.index) && gpu.driver_answered())
    {
        if let Some(on) = gpu.mig_mode {
            set(&mode, super::gpu_labels(gpu), if on { 1.0 } else { 0.0 });
        }
        for instance in &gpu.instances {
            let labels = instance_labels(gpu, instance);
            set(&holders, labels.clone(), instance.processes.len() as f64);
            if let Some(value) = instance.memory_used {
                set(&used, labels.clone(), bytes(value));
            }
            if let Some(value) = instance.memory_total {
                set(&total, labels.clone(), bytes(value));
            }
            if let Some(judged) = snapshot.held_by_no_process_in(gpu, instance) {
                set(&unattributed, labels.clone(), bytes(judged.bytes));
                if let Some(verdict) = judged.verdict() {
                    set(&held, labels, if verdict { 1.0 } else { 0.0 });
                }
            }
        }
    }
}
