//! The real driver, through NVML loaded at run time.
//!
//! nvml-wrapper opens libnvidia-ml with dlopen, so the binary starts on hosts
//! without the driver; `open` failing is how we learn there is none.

use std::collections::{BTreeMap, HashMap};
use std::mem::ManuallyDrop;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::structs::device::FieldId;

use super::evidence::{Health, Recovery};
use super::{
    Activity, Driver, DriverError, DriverProcess, GpuInfo, MigInstance, classify_dev_node,
};
use crate::proc::Node;

// NVML's field ids (nvml.h): remapped rows pending and failed, the recovery action.
const NVML_FI_DEV_REMAPPED_PENDING: u32 = 144;
const NVML_FI_DEV_REMAPPED_FAILURE: u32 = 145;
const NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: u32 = 230;

/// A field's value as an unsigned number, whatever type NVML gave it.
fn sample_u64(value: SampleValue) -> Option<u64> {
    match value {
        SampleValue::U32(v) => Some(u64::from(v)),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::F64(_) => None,
    }
}

/// How far back the per-process samples are taken: about six of NVML's
/// sample periods, as nvitop looks back.
const PROCESS_SAMPLES_SINCE: std::time::Duration = std::time::Duration::from_secs(1);

/// Each process's SM utilization over `PROCESS_SAMPLES_SINCE`, the newest
/// sample of each PID; `None` where the driver does not give them (MIG
/// mode, an older GPU). NVML answers "not found" where no process had a
/// sample that is not 0: an answer too, with nobody in it.
fn process_sm(device: &nvml_wrapper::Device) -> Option<BTreeMap<u32, u32>> {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .saturating_sub(PROCESS_SAMPLES_SINCE)
        .as_micros();
    let samples = match device.process_utilization_stats(u64::try_from(since).ok()?) {
        Ok(samples) => samples,
        Err(NvmlError::NotFound) => Vec::new(),
        Err(_) => return None,
    };
    let mut newest: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
    for sample in samples {
        if BOGUS_PIDS.contains(&sample.pid) {
            continue;
        }
        let entry = newest.entry(sample.pid).or_insert((0, 0));
        if sample.timestamp >= entry.0 {
            *entry = (sample.timestamp, sample.sm_util.min(100));
        }
    }
    Some(
        newest
            .into_iter()
            .map(|(pid, (_, percent))| (pid, percent))
            .collect(),
    )
}

/// PIDs some drivers put in process lists that belong to no process.
const BOGUS_PIDS: [u32; 2] = [0, u32::MAX];

pub(crate) struct NvmlDriver {
    /// Never shut down: the process ends right after its report, and
    /// nvmlShutdown would only add milliseconds to every command.
    nvml: ManuallyDrop<Nvml>,
    /// `/dev/nvidiaN` is named by the device's minor number, which need not
    /// equal NVML's index (ordered by PCI bus id).
    index_for_minor: HashMap<u32, u32>,
    /// Name and UUID by index, read once: they do not change, and every NVML
    /// call can block for milliseconds while the driver tears a context down.
    identities: Vec<(Option<String>, Option<String>)>,
    /// PCI bus id by index, read once (a lost GPU's Xid still names it).
    pci_bus_ids: Vec<Option<String>>,
    /// Cleared for a GPU whose driver does not support graphics process
    /// lists (most datacenter GPUs), so that polling skips the call.
    graphics_lists: Vec<AtomicBool>,
    description: String,
}

impl NvmlDriver {
    pub fn open() -> Result<NvmlDriver, NvmlError> {
        let nvml = Nvml::init()?;
        let count = nvml.device_count()?;
        let mut index_for_minor = HashMap::new();
        let mut identities = Vec::new();
        let mut pci_bus_ids = Vec::new();
        for index in 0..count {
            let Ok(device) = nvml.device_by_index(index) else {
                identities.push((None, None));
                pci_bus_ids.push(None);
                continue;
            };
            pci_bus_ids.push(device.pci_info().ok().map(|info| info.bus_id));
            // A device whose minor number cannot be read is still queried by
            // index; only its /proc descriptors go unattributed.
            if let Ok(minor) = device.minor_number() {
                index_for_minor.insert(minor, index);
            }
            identities.push((device.name().ok(), device.uuid().ok()));
        }
        let description = match nvml.sys_driver_version() {
            Ok(version) => format!("nvml (driver {version})"),
            Err(_) => "nvml".to_string(),
        };
        Ok(NvmlDriver {
            nvml: ManuallyDrop::new(nvml),
            index_for_minor,
            graphics_lists: (0..count).map(|_| AtomicBool::new(true)).collect(),
            identities,
            pci_bus_ids,
            description,
        })
    }
}

fn convert(index: u32, error: NvmlError) -> DriverError {
    match error {
        NvmlError::GpuLost => DriverError::GpuLost { index },
        other => DriverError::Nvml(other.to_string()),
    }
}

fn is_missing_symbol(error: &NvmlError) -> bool {
    matches!(
        error,
        NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound | NvmlError::NotSupported
    )
}

/// Adds one NVML process list into `into`, dropping bogus PIDs. A process in
/// both the compute and the graphics list is counted once.
fn merge(into: &mut Vec<DriverProcess>, list: Vec<ProcessInfo>) {
    for info in list {
        if BOGUS_PIDS.contains(&info.pid) {
            continue;
        }
        let used_memory = match info.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => Some(bytes),
            UsedGpuMemory::Unavailable => None,
        };
        match into.iter_mut().find(|known| known.pid == info.pid) {
            Some(known) => {
                known.used_memory = match (known.used_memory, used_memory) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                }
            }
            None => into.push(DriverProcess {
                pid: info.pid,
                used_memory,
            }),
        }
    }
}

/// Whether the GPU is in MIG mode (`None` where the GPU does not support
/// MIG or the driver does not say), and its instances: each MIG device
/// handle up to the maximum count, those that exist, with their ids,
/// profile, UUID, memory and process list (docs/mig.md). Read-only: no
/// MIG setting is ever changed.
fn mig_instances(
    device: &nvml_wrapper::Device,
    index: u32,
) -> Result<(Option<bool>, Vec<MigInstance>), DriverError> {
    let mode = match device.mig_mode() {
        Ok(mode) => mode.current == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE,
        Err(NvmlError::GpuLost) => return Err(DriverError::GpuLost { index }),
        Err(_) => return Ok((None, Vec::new())),
    };
    if !mode {
        return Ok((Some(false), Vec::new()));
    }
    let most = device
        .mig_device_count()
        .map_err(|error| convert(index, error))?;
    let mut instances = Vec::new();
    for mig_index in 0..most {
        let mig = match device.mig_device_by_index(mig_index) {
            Ok(mig) => mig,
            // No instance at this index (NotFound): the indexes in use come first.
            Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
            Err(error) => return Err(convert(index, error)),
        };
        instances.push(mig_instance(&mig, mig_index, index)?);
    }
    Ok((Some(true), instances))
}

/// One MIG device's figures and process list.
fn mig_instance(
    mig: &nvml_wrapper::Device,
    mig_index: u32,
    index: u32,
) -> Result<MigInstance, DriverError> {
    let memory = mig.memory_info().ok();
    let compute = match mig.running_compute_processes() {
        Err(error) if is_missing_symbol(&error) => mig.running_compute_processes_v2(),
        other => other,
    }
    .map_err(|error| convert(index, error))?;
    let mut processes = Vec::new();
    merge(&mut processes, compute);
    let name = mig.name().ok();
    Ok(MigInstance {
        index: mig_index,
        gpu_instance_id: mig_id(mig, MigId::Gpu),
        compute_instance_id: mig_id(mig, MigId::Compute),
        profile: name.as_deref().and_then(profile_of).map(str::to_string),
        uuid: mig.uuid().ok(),
        memory_total: memory.as_ref().map(|memory| memory.total),
        memory_used: memory.as_ref().map(|memory| memory.used),
        processes,
    })
}

/// The profile in a MIG device's name: `NVIDIA H200 MIG 1g.18gb` gives `1g.18gb`.
fn profile_of(name: &str) -> Option<&str> {
    name.rsplit_once(" MIG ")
        .map(|(_, profile)| profile.trim())
        .filter(|profile| !profile.is_empty())
}

enum MigId {
    Gpu,
    Compute,
}

/// A MIG device's GPU-instance or compute-instance id; `None` where the
/// driver lacks the call or does not say.
fn mig_id(mig: &nvml_wrapper::Device, which: MigId) -> Option<u32> {
    let lib = mig.nvml().lib();
    let call = match which {
        MigId::Gpu => lib.nvmlDeviceGetGpuInstanceId.as_ref().ok()?,
        MigId::Compute => lib.nvmlDeviceGetComputeInstanceId.as_ref().ok()?,
    };
    let mut id: std::os::raw::c_uint = 0;
    // SAFETY: the handle is a live MIG device handle of this NVML instance,
    // the symbol was resolved from it, and `id` outlives the call, which
    // writes one unsigned int.
    let status = unsafe { call(mig.handle(), &mut id) };
    (status == nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS).then_some(id)
}

impl Driver for NvmlDriver {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn gpu_count(&self) -> Result<u32, DriverError> {
        self.nvml
            .device_count()
            .map_err(|error| DriverError::Nvml(error.to_string()))
    }

    fn gpu(&self, index: u32) -> Result<GpuInfo, DriverError> {
        let device = self
            .nvml
            .device_by_index(index)
            .map_err(|error| convert(index, error))?;
        let memory = device
            .memory_info()
            .map_err(|error| convert(index, error))?;

        // The _v3 symbol is missing from older drivers: fall back to _v2.
        let compute = match device.running_compute_processes() {
            Err(error) if is_missing_symbol(&error) => device.running_compute_processes_v2(),
            other => other,
        }
        .map_err(|error| convert(index, error))?;
        let mut processes = Vec::new();
        merge(&mut processes, compute);
        // MPS clients: listed here too where the compute list leaves them out.
        let mps = device.mps_running_compute_processes().unwrap_or_default();
        let mps_clients = mps
            .iter()
            .map(|info| info.pid)
            .filter(|pid| !BOGUS_PIDS.contains(pid))
            .collect();
        merge(&mut processes, mps);
        let graphics_list = self.graphics_lists.get(index as usize);
        if graphics_list.is_some_and(|supported| supported.load(Ordering::Relaxed)) {
            let graphics = match device.running_graphics_processes() {
                Err(error) if is_missing_symbol(&error) => device.running_graphics_processes_v2(),
                other => other,
            };
            match graphics {
                Ok(graphics) => merge(&mut processes, graphics),
                Err(NvmlError::NotSupported) => {
                    if let Some(supported) = graphics_list {
                        supported.store(false, Ordering::Relaxed);
                    }
                }
                // Graphics lists matter little on compute GPUs: a failure here is not the GPU's.
                Err(_) => {}
            }
        }
        let (name, uuid) = self
            .identities
            .get(index as usize)
            .cloned()
            .unwrap_or_default();
        let (mig_mode, instances) = mig_instances(&device, index)?;
        Ok(GpuInfo {
            index,
            name,
            uuid,
            memory_total: Some(memory.total),
            memory_used: Some(memory.used),
            memory_reserved: Some(memory.reserved),
            processes,
            pci_bus_id: self.pci_bus_id(index),
            mig_mode,
            instances,
            mps_clients,
        })
    }

    fn known_uuid(&self, index: u32) -> Option<String> {
        self.identities
            .get(index as usize)
            .and_then(|(_, uuid)| uuid.clone())
    }

    fn pci_bus_id(&self, index: u32) -> Option<String> {
        self.pci_bus_ids.get(index as usize).cloned().flatten()
    }

    /// ECC, retired pages, remapped rows and the recovery action; each
    /// `None` where this GPU or driver does not support it (no ECC, a
    /// driver before 550 for the recovery action).
    fn health(&self, index: u32) -> Health {
        let Ok(device) = self.nvml.device_by_index(index) else {
            return Health::default();
        };
        let ecc = |counter| {
            device
                .total_ecc_errors(MemoryError::Uncorrected, counter)
                .ok()
        };
        let fields = [
            FieldId(NVML_FI_DEV_REMAPPED_PENDING),
            FieldId(NVML_FI_DEV_REMAPPED_FAILURE),
            FieldId(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION),
        ];
        let values: Vec<Option<u64>> = match device.field_values_for(&fields) {
            Ok(samples) => samples
                .into_iter()
                .map(|sample| {
                    sample
                        .ok()
                        .and_then(|sample| sample.value.ok())
                        .and_then(sample_u64)
                })
                .collect(),
            Err(_) => vec![None; fields.len()],
        };
        let value = |n: usize| values.get(n).copied().flatten();
        Health {
            ecc_volatile_uncorrected: ecc(EccCounter::Volatile),
            ecc_aggregate_uncorrected: ecc(EccCounter::Aggregate),
            retired_pages_pending: device.are_pages_pending_retired().ok(),
            row_remap_pending: value(0).map(|v| v != 0),
            row_remap_failure: value(1).map(|v| v != 0),
            recovery_action: value(2).and_then(Recovery::from_nvml),
        }
    }

    /// `nvmlDeviceGetUtilizationRates`, `GetTemperature` (the GPU
    /// sensor), `GetPowerUsage`, `GetPowerManagementLimit` (nvidia-smi's
    /// `power.limit`) and `GetProcessUtilization`; each `None` where this
    /// GPU or driver does not support it (utilization in MIG mode).
    fn activity(&self, index: u32) -> Activity {
        let Ok(device) = self.nvml.device_by_index(index) else {
            return Activity::default();
        };
        Activity {
            utilization_percent: device.utilization_rates().ok().map(|rates| rates.gpu),
            temperature_celsius: device.temperature(TemperatureSensor::Gpu).ok(),
            power_draw_milliwatts: device.power_usage().ok(),
            power_limit_milliwatts: device.power_management_limit().ok(),
            process_sm_percent: process_sm(&device),
        }
    }

    fn persistence_mode(&self, index: u32) -> Option<bool> {
        self.nvml
            .device_by_index(index)
            .ok()?
            .is_in_persistent_mode()
            .ok()
    }

    fn memory_used(&self, index: u32) -> Result<Option<u64>, DriverError> {
        let device = self
            .nvml
            .device_by_index(index)
            .map_err(|error| convert(index, error))?;
        let memory = device
            .memory_info()
            .map_err(|error| convert(index, error))?;
        Ok(Some(memory.used))
    }

    fn classify_node(&self, path: &Path) -> Option<Node> {
        classify_dev_node(path, |minor| self.index_for_minor.get(&minor).copied())
    }

    /// Measured on an H200, driver 580: 9 MiB with one context, 27 MiB with
    /// four (docs/gpu-validation.md, "What the real driver does"); 256 MiB
    /// leaves room for eight GPUs' worth of contexts without hiding a real
    /// leak.
    fn bookkeeping_slack(&self) -> u64 {
        256 << 20
    }

    /// `nvidia-smi --gpu-reset`, found by absolute path (a Slurm epilog has
    /// no PATH), naming the GPU by UUID where NVML gave one, so that no
    /// numbering can differ between the two.
    fn reset(&self, index: u32) -> Result<(), DriverError> {
        let program = NVIDIA_SMI
            .iter()
            .map(Path::new)
            .find(|path| path.is_file())
            .ok_or_else(|| {
                DriverError::Unavailable(format!(
                    "cannot reset GPU {index}: nvidia-smi is in none of {}",
                    NVIDIA_SMI.join(", ")
                ))
            })?;
        let device = self
            .identities
            .get(index as usize)
            .and_then(|(_, uuid)| uuid.clone())
            .unwrap_or_else(|| index.to_string());
        let output = std::process::Command::new(program)
            .args(["--gpu-reset", "-i", &device])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|error| {
                DriverError::Nvml(format!("cannot run {}: {error}", program.display()))
            })?;
        if output.status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        Err(DriverError::Nvml(format!(
            "{} --gpu-reset -i {device} failed ({}): {}",
            program.display(),
            output.status,
            said.split_whitespace().collect::<Vec<_>>().join(" ")
        )))
    }
}

/// Where nvidia-smi is installed by the driver packages and the runfile.
const NVIDIA_SMI: [&str; 4] = [
    "/usr/bin/nvidia-smi",
    "/usr/local/bin/nvidia-smi",
    "/usr/local/nvidia/bin/nvidia-smi",
    "/bin/nvidia-smi",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: u32, used: UsedGpuMemory) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: used,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn bogus_pids_are_dropped_and_unknown_memory_stays_unknown() {
        let mut processes = Vec::new();
        merge(
            &mut processes,
            vec![
                info(0, UsedGpuMemory::Used(5)),
                info(u32::MAX, UsedGpuMemory::Used(5)),
                info(42, UsedGpuMemory::Unavailable),
                info(43, UsedGpuMemory::Used(1 << 30)),
            ],
        );
        merge(&mut processes, vec![info(43, UsedGpuMemory::Used(1 << 20))]);
        assert_eq!(
            processes,
            vec![
                DriverProcess {
                    pid: 42,
                    used_memory: None
                },
                DriverProcess {
                    pid: 43,
                    used_memory: Some(1 << 30)
                },
            ]
        );
    }
}
