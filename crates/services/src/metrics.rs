//! The Prometheus metric families gpureap exposes, from one snapshot.
//!
//! `gpureap exporter` serves them, `gpureap status --prometheus` prints them
//! once (for node_exporter's textfile collector), and `gpureap check` reads
//! the same figures to give its verdict. They are derived with the functions
//! `status` and `free` use, not re-derived: unattributed memory and whether
//! it makes a GPU held are `Snapshot::held_by_no_process` (the UNATTRIBUTED
//! column, the one rule every command judges by), orphaned memory is what
//! `select` takes for `--orphans`, per-process rows are `status --json`'s
//! holders. The exposition is encoded by `prometheus-client`, never by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::driver::evidence::Recovery;
use crate::report::{self, ContainerJson};
use crate::select::{self, Guard, Scope};
use crate::snapshot::{GpuState, Snapshot};
use crate::units::one_line;

/// The content type of the OpenMetrics exposition `prometheus-client` writes.
pub(crate) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the Prometheus text format (`text_format`).
pub(crate) const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An exposition in both formats: OpenMetrics for scrapers that ask for
/// it (Prometheus does), the Prometheus text format for everything else
/// (node_exporter's textfile collector, promtool, curl).
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    pub openmetrics: String,
    pub text: String,
}

impl Exposition {
    pub fn new(openmetrics: String) -> Exposition {
        Exposition {
            text: text_format(&openmetrics),
            openmetrics,
        }
    }
}

/// The Prometheus text format (0.0.4) of an OpenMetrics exposition that
/// `prometheus-client` encoded. The samples are the same; what differs is
/// the metadata: a counter's HELP and TYPE name its samples' `_total` name
/// (OpenMetrics names the family without it), and there are no `# UNIT`
/// and `# EOF` lines. Without this, promtool and node_exporter's textfile
/// collector read every counter as a metric without help.
pub(crate) fn text_format(openmetrics: &str) -> String {
    let counters: BTreeSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut text = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let metadata = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|prefix| Some((prefix, line.strip_prefix(prefix)?)));
        match metadata {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                text.push_str(prefix);
                text.push_str(name);
                if counters.contains(name) {
                    text.push_str("_total");
                }
                text.push(' ');
                text.push_str(tail);
            }
            None => text.push_str(line),
        }
        text.push('\n');
    }
    text
}

mod mig;

/// Labels of one sample, in the order they are written.
type Labels = Vec<(&'static str, String)>;
type Gauges = Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>;

/// What the scans so far add up to; the exporter keeps it across scans.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanFigures {
    /// Snapshots taken since the start.
    pub scans: u64,
    /// Of those, how many found the driver failing or /proc unreadable.
    pub errors: u64,
    /// How long the last one took.
    pub last_duration: Duration,
}

impl ScanFigures {
    /// Counts one more snapshot.
    pub fn count(&mut self, snapshot: &Snapshot, took: Duration) {
        self.scans += 1;
        if scan_failed(snapshot) {
            self.errors += 1;
        }
        self.last_duration = took;
    }
}

/// A scan counts as an error when the driver could not list GPUs, or when
/// /proc itself could not be read (a partial scan, some processes unreadable,
/// is normal in containers and shown by `gpureap_scan_unreadable_processes`).
pub fn scan_failed(snapshot: &Snapshot) -> bool {
    snapshot.driver_error.is_some() || snapshot.unreadable.iter().any(|entry| entry.pid == 0)
}

/// What to expose.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Only these GPUs (all when `None`).
    pub gpus: Option<BTreeSet<u32>>,
    /// One series per process and GPU: the cardinality grows with the host.
    pub per_process: bool,
}

/// Memory that orphaned holders hold on one GPU: what `gpureap free
/// --orphans` would free, and what it spares by name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Orphaned {
    /// What the driver reports for them (a process whose memory it does not report adds nothing).
    pub bytes: u64,
    /// Orphaned processes the driver lists on this GPU.
    pub processes: usize,
}

/// Memory held on each GPU by orphaned holders, as `--orphans` defines them:
/// the GPU users `free --orphans` selects (orphans, and servers whose
/// `gpureap run` is gone), with their descendants. What it spares by name
/// still counts: a name keeps a process from signals, not its memory from
/// this figure (`Selection::counts`, the one rule).
pub fn orphaned(snapshot: &Snapshot) -> BTreeMap<u32, Orphaned> {
    let scope = Scope {
        orphans: true,
        containers_gone: select::gone_containers(snapshot),
        ..Scope::default()
    };
    let selection = select::select(snapshot, &scope, &Guard::for_this_process(&[]));
    snapshot
        .gpus
        .iter()
        .filter(|gpu| gpu.driver_answered())
        .map(|gpu| {
            let mut orphaned = Orphaned::default();
            for user in gpu
                .users
                .iter()
                .filter(|user| user.listed && !user.hidden && selection.counts(user.pid))
            {
                orphaned.processes += 1;
                orphaned.bytes = orphaned.bytes.saturating_add(user.memory.unwrap_or(0));
            }
            (gpu.index, orphaned)
        })
        .collect()
}

/// Processes holding a GPU, as `status` counts them: those the driver lists
/// on it; where no driver answered for it, those with its node open.
pub fn holders(gpu: &GpuState) -> usize {
    if gpu.driver_answered() {
        gpu.users.iter().filter(|user| user.listed).count()
    } else {
        gpu.users.len()
    }
}

/// Memory held by no process where it makes the GPU held: the one rule
/// (`Snapshot::held_by_no_process`), whose figure is `status`'s
/// UNATTRIBUTED, as `free`, Slurm and `reset` judge a GPU held. Not what
/// is unseen from a PID namespace of its own (`unseen`).
pub fn held_by_no_process(snapshot: &Snapshot, gpu: &GpuState) -> Option<u64> {
    snapshot
        .held_by_no_process(gpu)
        .filter(|unattributed| unattributed.driver_held())
        .map(|unattributed| unattributed.bytes)
}

/// Memory no listed process explains, beyond the bookkeeping, that
/// processes unseen from this PID namespace may hold (the one rule's
/// `Unseen`): whether it is held cannot be told from here.
pub fn unseen(snapshot: &Snapshot, gpu: &GpuState) -> Option<u64> {
    snapshot
        .held_by_no_process(gpu)
        .filter(|unattributed| unattributed.unseen())
        .map(|unattributed| unattributed.bytes)
}

fn gauge_family(registry: &mut Registry, name: &str, help: &str, unit: Option<Unit>) -> Gauges {
    let family = Gauges::default();
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, family.clone()),
        None => registry.register(name, help, family.clone()),
    }
    family
}

fn set(family: &Gauges, labels: Labels, value: f64) {
    family.get_or_create(&labels).set(value);
}

/// A byte count as a sample value; exact up to 2^53 bytes (8 PiB).
fn bytes(value: u64) -> f64 {
    value as f64
}

/// The exposition of one snapshot.
pub fn encode_snapshot(
    snapshot: &Snapshot,
    figures: &ScanFigures,
    options: &Options,
) -> Exposition {
    encode_snapshot_with(snapshot, figures, options, &|_| {})
}

/// The exposition of one snapshot, with the families `more` registers
/// beside them (`reap --watch --listen`: the watch's own counters), in one
/// registry, so that the document has one end.
pub fn encode_snapshot_with(
    snapshot: &Snapshot,
    figures: &ScanFigures,
    options: &Options,
    more: &dyn Fn(&mut Registry),
) -> Exposition {
    let mut registry = Registry::with_prefix("gpureap");
    encode_scan(&mut registry, snapshot, figures);
    encode_gpus(&mut registry, snapshot, options);
    mig::encode_instances(&mut registry, snapshot, options);
    encode_activity(&mut registry, snapshot, options);
    encode_evidence(&mut registry, snapshot, options);
    encode_containers(&mut registry, snapshot, options);
    if options.per_process {
        encode_processes(&mut registry, snapshot, options);
    }
    more(&mut registry);
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut text, &registry);
    Exposition::new(text)
}

/// The scan's own families: whether the driver answered, how many scans,
/// their errors and duration, when the snapshot was taken, what was unreadable.
fn encode_scan(registry: &mut Registry, snapshot: &Snapshot, figures: &ScanFigures) {
    let driver_up = gauge_family(
        registry,
        "driver_up",
        "1 when the GPU driver answered the last scan, 0 when it failed or no driver is loaded",
        None,
    );
    set(
        &driver_up,
        vec![("backend", backend_kind(&snapshot.backend))],
        if snapshot.driver_error.is_some() {
            0.0
        } else {
            1.0
        },
    );

    let scans = Counter::<u64>::default();
    scans.inc_by(figures.scans);
    registry.register(
        "scans",
        "Snapshots taken (one /proc pass and one driver pass each); scrapes do not add to it",
        scans,
    );
    let errors = Counter::<u64>::default();
    errors.inc_by(figures.errors);
    registry.register(
        "scan_errors",
        "Snapshots in which the driver failed or /proc could not be read",
        errors,
    );
    let duration = gauge_family(
        registry,
        "scan_duration",
        "How long the last snapshot took",
        Some(Unit::Seconds),
    );
    set(&duration, Vec::new(), figures.last_duration.as_secs_f64());
    let taken = gauge_family(
        registry,
        "snapshot_timestamp",
        "When the snapshot served was taken, in seconds since the Unix epoch",
        Some(Unit::Seconds),
    );
    set(
        &taken,
        Vec::new(),
        snapshot.taken_at_unix_ms as f64 / 1000.0,
    );
    let unreadable = gauge_family(
        registry,
        "scan_unreadable_processes",
        "Processes whose descriptors the last scan needed and could not read (the driver-listed ones where the driver answers for every GPU)",
        None,
    );
    set(&unreadable, Vec::new(), snapshot.unreadable.len() as f64);
}

/// Each GPU's families: up, memory used and in all, unattributed and held
/// by no process (the one rule), holders, orphaned memory.
fn encode_gpus(registry: &mut Registry, snapshot: &Snapshot, options: &Options) {
    let gpu_up = gauge_family(
        registry,
        "gpu_up",
        "1 when the driver answered for this GPU, 0 when it is lost or failing",
        None,
    );
    let used = gauge_family(
        registry,
        "gpu_memory_used",
        "GPU memory in use, as the driver reports it: NVML's v2 figure, as nvidia-smi shows it, without the reserved memory (gpureap_gpu_memory_reserved_bytes) that NVML's v1 figure counts as used",
        Some(Unit::Bytes),
    );
    let reserved = gauge_family(
        registry,
        "gpu_memory_reserved",
        "GPU memory the driver sets aside that no program can allocate (NVML's reserved figure), not in gpureap_gpu_memory_used_bytes; NVML's v1 used figure is the sum of the two",
        Some(Unit::Bytes),
    );
    let total = gauge_family(
        registry,
        "gpu_memory_total",
        "GPU memory in all, as the driver reports it",
        Some(Unit::Bytes),
    );
    let unattributed = gauge_family(
        registry,
        "gpu_memory_unattributed",
        "Used GPU memory that no process the driver lists explains (status's UNATTRIBUTED): driver-held memory, and the driver's own bookkeeping",
        Some(Unit::Bytes),
    );
    let held_by_no_process = gauge_family(
        registry,
        "gpu_held_by_no_process",
        "1 when memory no process explains makes the GPU held (more than the driver keeps for its own bookkeeping): the verdict of free, check, Slurm and reset; 0 when it does not; absent where gpureap does not see the host's PIDs and the memory may be other namespaces' processes'",
        None,
    );
    let holders_count = gauge_family(
        registry,
        "gpu_holders",
        "Processes holding the GPU: listed by the driver on it (where no driver answers, with its device node open)",
        None,
    );
    let orphaned_memory = gauge_family(
        registry,
        "gpu_orphaned_memory",
        "GPU memory held by orphaned processes: what `gpureap free --orphans` would free, and orphans it spares by name (named with --pid, they are freed)",
        Some(Unit::Bytes),
    );
    let orphans = orphaned(snapshot);
    let wanted = |index: u32| options.gpus.as_ref().is_none_or(|set| set.contains(&index));
    for gpu in snapshot.gpus.iter().filter(|gpu| wanted(gpu.index)) {
        let labels = gpu_labels(gpu);
        set(
            &gpu_up,
            labels.clone(),
            if gpu.driver_answered() { 1.0 } else { 0.0 },
        );
        set(&holders_count, labels.clone(), holders(gpu) as f64);
        // Unknown is left out, never written as 0.
        if let Some(value) = gpu.memory_used {
            set(&used, labels.clone(), bytes(value));
        }
        if let Some(value) = gpu.memory_total {
            set(&total, labels.clone(), bytes(value));
        }
        if let Some(value) = gpu.memory_reserved {
            set(&reserved, labels.clone(), bytes(value));
        }
        if let Some(judged) = snapshot.held_by_no_process(gpu) {
            set(&unattributed, labels.clone(), bytes(judged.bytes));
            // Unseen from a PID namespace of its own: neither held by no
            // process nor not, so the verdict is left out.
            if let Some(held) = judged.verdict() {
                set(
                    &held_by_no_process,
                    labels.clone(),
                    if held { 1.0 } else { 0.0 },
                );
            }
        }
        if let Some(orphaned) = orphans.get(&gpu.index) {
            set(&orphaned_memory, labels, bytes(orphaned.bytes));
        }
    }
}

/// What each GPU is doing, where it was read (`Snapshot::read_activity`):
/// utilization, temperature, power and its limit. A value the driver does
/// not give is left out, never written as 0.
fn encode_activity(registry: &mut Registry, snapshot: &Snapshot, options: &Options) {
    let utilization = gauge_family(
        registry,
        "gpu_utilization",
        "Share of the last sample period in which a kernel ran on the GPU, 0 to 1 (NVML's GPU utilization, nvidia-smi's utilization.gpu / 100)",
        Some(Unit::Other("ratio".to_string())),
    );
    let temperature = gauge_family(
        registry,
        "gpu_temperature",
        "GPU temperature (nvidia-smi's temperature.gpu)",
        Some(Unit::Celsius),
    );
    let power = gauge_family(
        registry,
        "gpu_power",
        "Power the GPU draws (nvidia-smi's power.draw)",
        Some(Unit::Other("watts".to_string())),
    );
    let power_limit = gauge_family(
        registry,
        "gpu_power_limit",
        "Power limit the GPU is held to (nvidia-smi's power.limit)",
        Some(Unit::Other("watts".to_string())),
    );
    let wanted = |index: u32| options.gpus.as_ref().is_none_or(|set| set.contains(&index));
    let watts = |milliwatts: u32| f64::from(milliwatts) / 1000.0;
    for gpu in snapshot.gpus.iter().filter(|gpu| wanted(gpu.index)) {
        let Some(activity) = snapshot.activity.get(&gpu.index) else {
            continue;
        };
        let values = [
            (
                &utilization,
                activity
                    .utilization_percent
                    .map(|percent| f64::from(percent) / 100.0),
            ),
            (&temperature, activity.temperature_celsius.map(f64::from)),
            (&power, activity.power_draw_milliwatts.map(watts)),
            (&power_limit, activity.power_limit_milliwatts.map(watts)),
        ];
        for (family, value) in values {
            if let Some(value) = value {
                set(family, gpu_labels(gpu), value);
            }
        }
    }
}

/// Each GPU's hardware evidence, where it was read: the Xids logged for it
/// since boot by Xid, ECC, retired pages, row remapping, recovery action.
/// A value the driver does not give is left out, never written as 0.
fn encode_evidence(registry: &mut Registry, snapshot: &Snapshot, options: &Options) {
    let xids = Family::<Labels, Counter<u64>>::default();
    registry.register(
        "gpu_xid_events",
        "Xid events the kernel logged for this GPU since boot (of the newest 1024 Xids read), by Xid; docs/evidence.md gives each its meaning",
        xids.clone(),
    );
    let family =
        |registry: &mut Registry, name: &str, help: &str| gauge_family(registry, name, help, None);
    let volatile = family(
        registry,
        "gpu_ecc_uncorrected_volatile",
        "Uncorrectable ECC errors since the driver loaded (NVML volatile count)",
    );
    let aggregate = family(
        registry,
        "gpu_ecc_uncorrected_aggregate",
        "Uncorrectable ECC errors over the GPU's life (NVML aggregate count)",
    );
    let retired = family(
        registry,
        "gpu_retired_pages_pending",
        "1 when retired pages wait for a reset or reboot to take effect",
    );
    let remap_pending = family(
        registry,
        "gpu_row_remap_pending",
        "1 when remapped rows wait for a GPU reset to take effect",
    );
    let remap_failure = family(
        registry,
        "gpu_row_remap_failure",
        "1 when a row could not be remapped (the GPU needs service)",
    );
    let recovery = family(
        registry,
        "gpu_recovery_action",
        "The recovery action NVML asks for: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset",
    );
    let flag = |value: bool| if value { 1.0 } else { 0.0 };
    let wanted = |index: u32| options.gpus.as_ref().is_none_or(|set| set.contains(&index));
    for gpu in snapshot.gpus.iter().filter(|gpu| wanted(gpu.index)) {
        let Some(evidence) = snapshot.evidence.get(&gpu.index) else {
            continue;
        };
        let labels = gpu_labels(gpu);
        for (xid, count) in &evidence.xid_counts {
            let mut labels = labels.clone();
            labels.push(("xid", xid.to_string()));
            xids.get_or_create(&labels).inc_by(*count);
        }
        let health = &evidence.health;
        let values = [
            (&volatile, health.ecc_volatile_uncorrected.map(|v| v as f64)),
            (
                &aggregate,
                health.ecc_aggregate_uncorrected.map(|v| v as f64),
            ),
            (&retired, health.retired_pages_pending.map(flag)),
            (&remap_pending, health.row_remap_pending.map(flag)),
            (&remap_failure, health.row_remap_failure.map(flag)),
            (&recovery, health.recovery_action.map(recovery_code)),
        ];
        for (family, value) in values {
            if let Some(value) = value {
                set(family, labels.clone(), value);
            }
        }
    }
}

/// NVML's number for a recovery action.
fn recovery_code(action: Recovery) -> f64 {
    match action {
        Recovery::None => 0.0,
        Recovery::GpuReset => 1.0,
        Recovery::NodeReboot => 2.0,
        Recovery::DrainP2p => 3.0,
        Recovery::DrainAndReset => 4.0,
    }
}

/// Memory held on each GPU by processes whose container or pod is gone (a
/// node source that would list it does not: `docker rm -f`, a deleted pod),
/// which `free --orphans` takes. Written for every GPU the driver answered
/// for, 0 included: a gone container is a finding, its absence a fact.
fn encode_containers(registry: &mut Registry, snapshot: &Snapshot, options: &Options) {
    let gone = gauge_family(
        registry,
        "gpu_container_gone_memory",
        "GPU memory held by processes whose container or pod no longer exists (docker rm -f, a deleted pod), as a node source says; `gpureap free --orphans` frees them",
        Some(Unit::Bytes),
    );
    let wanted = |index: u32| options.gpus.as_ref().is_none_or(|set| set.contains(&index));
    let held_by_gone = container_gone(snapshot);
    for gpu in snapshot.gpus.iter().filter(|gpu| wanted(gpu.index)) {
        if let Some(held) = held_by_gone.get(&gpu.index) {
            set(&gone, gpu_labels(gpu), bytes(held.bytes));
        }
    }
}

/// Per GPU the driver answered for, the memory of the processes it lists
/// whose container or pod is gone (`Snapshot::container_gone`), and how many.
pub fn container_gone(snapshot: &Snapshot) -> BTreeMap<u32, Orphaned> {
    snapshot
        .gpus
        .iter()
        .filter(|gpu| gpu.driver_answered())
        .map(|gpu| {
            let mut gone = Orphaned::default();
            for user in gpu.users.iter().filter(|user| {
                user.listed && !user.hidden && snapshot.container_gone(user.pid).is_some()
            }) {
                gone.processes += 1;
                gone.bytes = gone.bytes.saturating_add(user.memory.unwrap_or(0));
            }
            (gpu.index, gone)
        })
        .collect()
}

/// Each holder's memory on each GPU (`--per-process`).
fn encode_processes(registry: &mut Registry, snapshot: &Snapshot, options: &Options) {
    let wanted = |index: u32| options.gpus.as_ref().is_none_or(|set| set.contains(&index));
    let process_memory = gauge_family(
        registry,
        "process_gpu_memory",
        "GPU memory a process uses, as the driver reports it, with its container and pod where it runs in one (only with --per-process)",
        Some(Unit::Bytes),
    );
    for holder in report::holders_json(snapshot, &options.gpus) {
        for place in holder.gpus.iter().filter(|place| place.listed_by_driver) {
            let (Some(memory), true) = (place.memory, wanted(place.index)) else {
                continue;
            };
            let Some(gpu) = snapshot.gpu(place.index) else {
                continue;
            };
            let mut labels = gpu_labels(gpu);
            labels.push(("pid", holder.pid.to_string()));
            // Anyone's text, as `status` shows it (`units::one_line`): the
            // exposition then holds no control character, and
            // prometheus-client escapes the rest (\\ " and newline).
            let text = |text: Option<&str>| one_line(text.unwrap_or_default()).into_owned();
            labels.push(("comm", text(holder.comm.as_deref())));
            labels.push(("user", text(holder.user.as_deref())));
            labels.push(("flags", holder.flags.join(",")));
            let container = holder.container.as_ref();
            let of_container =
                |field: fn(&ContainerJson) -> Option<&str>| text(container.and_then(field));
            labels.push(("runtime", of_container(|c| Some(c.runtime))));
            labels.push(("container_id", of_container(|c| Some(&c.id))));
            labels.push(("pod_uid", of_container(|c| c.pod_uid.as_deref())));
            labels.push(("pod", of_container(|c| c.pod.as_deref())));
            labels.push(("namespace", of_container(|c| c.namespace.as_deref())));
            labels.push(("container", of_container(|c| c.name.as_deref())));
            // The server an MPS client goes through (docs/mps.md), else empty.
            let server = holder.mps.as_ref().and_then(|mps| mps.server);
            labels.push((
                "mps_server",
                server.map_or(String::new(), |pid| pid.to_string()),
            ));
            set(&process_memory, labels, bytes(memory));
        }
    }
}

/// `gpu` always; `uuid` where the driver gives one.
fn gpu_labels(gpu: &GpuState) -> Labels {
    let mut labels = vec![("gpu", gpu.index.to_string())];
    if let Some(uuid) = &gpu.uuid {
        labels.push(("uuid", uuid.clone()));
    }
    labels
}

/// `nvml`, `sim` or `none`: the backend without its details (a directory,
/// a driver version), so that the series stays the same across restarts.
fn backend_kind(describe: &str) -> String {
    describe
        .split([':', ' '])
        .next()
        .unwrap_or(describe)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_by_their_samples_in_the_text_format() {
        let openmetrics = "# HELP gpureap_scans Snapshots taken.\n# TYPE gpureap_scans counter\ngpureap_scans_total 3\n# HELP gpureap_scan_duration_seconds Last.\n# TYPE gpureap_scan_duration_seconds gauge\n# UNIT gpureap_scan_duration_seconds seconds\ngpureap_scan_duration_seconds 0.5\n# EOF\n";
        assert_eq!(
            text_format(openmetrics),
            "# HELP gpureap_scans_total Snapshots taken.\n# TYPE gpureap_scans_total counter\ngpureap_scans_total 3\n# HELP gpureap_scan_duration_seconds Last.\n# TYPE gpureap_scan_duration_seconds gauge\ngpureap_scan_duration_seconds 0.5\n"
        );
    }

    #[test]
    fn backend_kinds() {
        assert_eq!(backend_kind("nvml (driver 580.95.05)"), "nvml");
        assert_eq!(backend_kind("sim:/tmp/x y"), "sim");
        assert_eq!(backend_kind("none"), "none");
    }
}
