//! MIG instances named where a GPU is named (docs/mig.md): resolving
//! `0:1`, `MIG-<uuid>` and `GPU-<uuid>` against the driver, and the view
//! of the driver a scope that names instances works through.
//!
//! A scope that names MIG instances of a GPU sees that GPU through
//! `InstanceView`: its memory is the named instances' (total and used), its
//! process list theirs, with each process's memory there. Everything that
//! works by GPU index (select, verify, the one rule, reports, the Slurm
//! hooks) then judges the instances and nothing else of the GPU: a holder
//! of another instance is not listed on it (its node open, like any CUDA
//! process's, is no context), and another instance's memory is not in the
//! figures. A GPU named whole stays whole.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use super::evidence::{self, Health, KernelLog, Platform};
use super::{Activity, Driver, DriverError, DriverProcess, Figures, GpuInfo};
use crate::proc::Node;
use crate::units::GpuRef;

/// What a list of `GpuRef`s names on this host: whole GPUs, and instances
/// (by GPU, their MIG device indexes) of GPUs not named whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    pub gpus: BTreeSet<u32>,
    pub instances: BTreeMap<u32, BTreeSet<u32>>,
}

impl Resolved {
    /// Every GPU named, whole or by some of its instances.
    pub fn indexes(&self) -> BTreeSet<u32> {
        self.gpus
            .iter()
            .chain(self.instances.keys())
            .copied()
            .collect()
    }
}

/// Why a name does not resolve here: always bad input (exit 2), or for
/// the Slurm hooks, a GPU the job was given that this host does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotHere(pub String);

/// Resolves each name against the driver's GPUs, asked once. An index
/// past the last GPU, a UUID this host has not, an instance a GPU has not
/// (or of a GPU not in MIG mode, or in MIG mode with no instances) is
/// refused with what there is.
pub fn resolve(driver: &dyn Driver, refs: &[GpuRef]) -> Result<Resolved, NotHere> {
    let count = driver
        .gpu_count()
        .map_err(|error| NotHere(format!("cannot list GPUs: {error}")))?;
    let needs_driver = refs.iter().any(|gpu| !matches!(gpu, GpuRef::Index(_)));
    let infos: Vec<Result<GpuInfo, DriverError>> = if needs_driver {
        driver
            .layout()
            .map_err(|error| NotHere(format!("cannot list GPUs: {error}")))?
    } else {
        Vec::new()
    };
    let answered = || infos.iter().filter_map(|info| info.as_ref().ok());
    let mut resolved = Resolved::default();
    for gpu in refs {
        match gpu {
            GpuRef::Index(index) if *index < count => {
                resolved.gpus.insert(*index);
            }
            GpuRef::Index(index) => {
                return Err(NotHere(format!("GPU {index} is not on this host")));
            }
            GpuRef::Uuid(uuid) => {
                let info = answered()
                    .find(|info| info.uuid.as_deref() == Some(uuid.as_str()))
                    .ok_or_else(|| NotHere(format!("GPU {uuid} is not on this host")))?;
                resolved.gpus.insert(info.index);
            }
            GpuRef::MigUuid(uuid) => {
                let (gpu, index) = answered()
                    .find_map(|info| {
                        info.instances
                            .iter()
                            .find(|instance| instance.uuid.as_deref() == Some(uuid.as_str()))
                            .map(|instance| (info.index, instance.index))
                    })
                    .ok_or_else(|| NotHere(format!("MIG instance {uuid} is not on this host")))?;
                resolved.instances.entry(gpu).or_default().insert(index);
            }
            GpuRef::Instance(gpu, index) => {
                let info = infos
                    .get(*gpu as usize)
                    .ok_or_else(|| {
                        NotHere(format!("GPU {gpu} (of {gpu}:{index}) is not on this host"))
                    })?
                    .as_ref()
                    .map_err(|error| NotHere(format!("GPU {gpu}: {error}")))?;
                check_instance(info, *index)?;
                resolved.instances.entry(*gpu).or_default().insert(*index);
            }
        }
    }
    // A GPU named whole is whole, whatever of its instances is named too.
    let whole = resolved.gpus.clone();
    resolved.instances.retain(|gpu, _| !whole.contains(gpu));
    Ok(resolved)
}

/// Whether `G:I` names an instance GPU G has.
fn check_instance(info: &GpuInfo, index: u32) -> Result<(), NotHere> {
    let gpu = info.index;
    if info.mig_mode != Some(true) {
        return Err(NotHere(format!(
            "GPU {gpu} is not in MIG mode: name it whole (--gpu {gpu})"
        )));
    }
    if info.instances.is_empty() {
        return Err(NotHere(format!(
            "GPU {gpu} is in MIG mode with no instances: there is no {gpu}:{index}"
        )));
    }
    if info
        .instances
        .iter()
        .any(|instance| instance.index == index)
    {
        return Ok(());
    }
    let there: Vec<String> = info
        .instances
        .iter()
        .map(|instance| format!("{gpu}:{}", instance.index))
        .collect();
    Err(NotHere(format!(
        "GPU {gpu} has no MIG instance {index} (it has {})",
        there.join(", ")
    )))
}

/// The driver as a scope that names MIG instances sees it (module doc).
pub struct InstanceView {
    inner: Box<dyn Driver>,
    /// By GPU, the instances named (MIG device indexes).
    named: BTreeMap<u32, BTreeSet<u32>>,
    /// The whole GPUs' memory used as `inner` last answered it: what
    /// `wait_for_change` hands `inner` to watch (any instance's change
    /// changes its GPU's figure), so that waiting costs what it costs there.
    parent_figures: std::sync::Mutex<BTreeMap<u32, Option<u64>>>,
}

impl InstanceView {
    /// `inner` itself where no instance is named.
    pub fn wrap(inner: Box<dyn Driver>, named: BTreeMap<u32, BTreeSet<u32>>) -> Box<dyn Driver> {
        if named.is_empty() {
            return inner;
        }
        Box::new(InstanceView {
            inner,
            named,
            parent_figures: std::sync::Mutex::default(),
        })
    }

    /// One GPU's answer as the view gives it.
    fn project(&self, info: GpuInfo) -> GpuInfo {
        let Some(named) = self.named.get(&info.index) else {
            return info;
        };
        if let Ok(mut figures) = self.parent_figures.lock() {
            figures.insert(info.index, info.memory_used);
        }
        let instances: Vec<_> = info
            .instances
            .into_iter()
            .filter(|instance| named.contains(&instance.index))
            .collect();
        let sum = |figure: &dyn Fn(&super::MigInstance) -> Option<u64>| {
            instances.iter().try_fold(0u64, |sum, instance| {
                Some(sum.saturating_add(figure(instance)?))
            })
        };
        let mut processes: Vec<DriverProcess> = Vec::new();
        for process in instances.iter().flat_map(|instance| &instance.processes) {
            match processes.iter_mut().find(|known| known.pid == process.pid) {
                Some(known) => {
                    known.used_memory = known
                        .used_memory
                        .zip(process.used_memory)
                        .map(|(a, b)| a.saturating_add(b));
                }
                None => processes.push(*process),
            }
        }
        let names: Vec<String> = instances
            .iter()
            .map(|instance| {
                format!(
                    "{}:{} {}",
                    info.index,
                    instance.index,
                    instance.profile.as_deref().unwrap_or("?")
                )
            })
            .collect();
        GpuInfo {
            name: Some(format!(
                "{} MIG {}",
                info.name.as_deref().unwrap_or("GPU"),
                names.join(", ")
            )),
            memory_total: sum(&|instance| instance.memory_total),
            memory_used: sum(&|instance| instance.memory_used),
            memory_reserved: None,
            processes,
            instances,
            ..info
        }
    }
}

/// Every method written out, none left to the trait's default: a default
/// would answer for the view instead of the driver it wraps (clippy names a
/// method left out; `tests::the_view_passes_every_method_to_the_driver`
/// fails for one that does not reach it).
#[deny(clippy::missing_trait_methods)]
impl Driver for InstanceView {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn gpu_count(&self) -> Result<u32, DriverError> {
        self.inner.gpu_count()
    }

    fn gpu(&self, index: u32) -> Result<GpuInfo, DriverError> {
        self.inner.gpu(index).map(|info| self.project(info))
    }

    fn known_uuid(&self, index: u32) -> Option<String> {
        self.inner.known_uuid(index)
    }

    fn gpus(&self) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
        Ok(self
            .inner
            .gpus()?
            .into_iter()
            .map(|info| info.map(|info| self.project(info)))
            .collect())
    }

    fn layout(&self) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
        self.inner.layout()
    }

    fn memory_used(&self, index: u32) -> Result<Option<u64>, DriverError> {
        if self.named.contains_key(&index) {
            return Ok(self.gpu(index)?.memory_used);
        }
        self.inner.memory_used(index)
    }

    /// One answer for all of them: the instances' figures come with it.
    fn memory_used_of(&self, indexes: &BTreeSet<u32>) -> Figures {
        if indexes.iter().all(|index| !self.named.contains_key(index)) {
            return self.inner.memory_used_of(indexes);
        }
        match self.gpus() {
            Ok(gpus) => indexes
                .iter()
                .map(|&index| {
                    let answer = match gpus.get(index as usize) {
                        Some(Ok(gpu)) => Ok(gpu.memory_used),
                        Some(Err(error)) => Err(error.clone()),
                        None => Err(DriverError::Unavailable(format!("no GPU {index}"))),
                    };
                    (index, answer)
                })
                .collect(),
            Err(error) => indexes
                .iter()
                .map(|&index| (index, Err(error.clone())))
                .collect(),
        }
    }

    fn classify_node(&self, path: &Path) -> Option<Node> {
        self.inner.classify_node(path)
    }

    fn unavailable(&self) -> Option<String> {
        self.inner.unavailable()
    }

    fn bookkeeping_slack(&self) -> u64 {
        self.inner.bookkeeping_slack()
    }

    fn pci_bus_id(&self, index: u32) -> Option<String> {
        self.inner.pci_bus_id(index)
    }

    fn health(&self, index: u32) -> Health {
        self.inner.health(index)
    }

    fn kernel_log(&self) -> KernelLog {
        self.inner.kernel_log()
    }

    /// The whole GPU's, as the driver gives them: one sensor, one power
    /// limit; NVML gives no utilization in MIG mode.
    fn activity(&self, index: u32) -> Activity {
        self.inner.activity(index)
    }

    fn persistence_mode(&self, index: u32) -> Option<bool> {
        self.inner.persistence_mode(index)
    }

    fn platform(&self) -> Platform {
        self.inner.platform()
    }

    fn evidence(
        &self,
        indexes: &BTreeSet<u32>,
    ) -> (BTreeMap<u32, evidence::Evidence>, Option<String>) {
        self.inner.evidence(indexes)
    }

    fn may_omit_other_namespaces(&self) -> bool {
        self.inner.may_omit_other_namespaces()
    }

    /// A reset takes the whole GPU, every instance with it: never through a
    /// scope that names instances.
    fn reset(&self, index: u32) -> Result<(), DriverError> {
        if let Some(named) = self.named.get(&index) {
            let names: Vec<String> = named.iter().map(|i| format!("{index}:{i}")).collect();
            return Err(DriverError::Unavailable(format!(
                "a reset is of the whole GPU {index}, every MIG instance with it, not of {}: name GPU {index} whole",
                names.join(", ")
            )));
        }
        self.inner.reset(index)
    }

    fn will_wait(&self) {
        self.inner.will_wait();
    }

    fn wait_for_change(
        &self,
        last: &BTreeMap<u32, Option<u64>>,
        poll: Duration,
        limit: Duration,
    ) -> Option<Figures> {
        if last.keys().all(|index| !self.named.contains_key(index)) {
            return self.inner.wait_for_change(last, poll, limit);
        }
        // The GPUs' own figures behind `last`, where the view last read them;
        // without them, one reading catches up first.
        let known = self.parent_figures.lock().ok().and_then(|figures| {
            last.keys()
                .map(|index| figures.get(index).map(|used| (*index, *used)))
                .collect::<Option<BTreeMap<u32, Option<u64>>>>()
        });
        let gpus: BTreeSet<u32> = last.keys().copied().collect();
        let Some(parents) = known else {
            let now = self.memory_used_of(&gpus);
            return super::changed(&now, last).then_some(now);
        };
        // A change of a whole GPU's figure may be of another instance: the
        // view's figures are read again, and said as a change (it may be).
        self.inner
            .wait_for_change(&parents, poll, limit)
            .map(|_| self.memory_used_of(&gpus))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A driver that records each of its methods called, answering as
    /// little as it can.
    struct Recording(Arc<Mutex<Vec<&'static str>>>);

    impl Recording {
        fn called(&self, method: &'static str) {
            self.0.lock().expect("calls").push(method);
        }
    }

    fn unanswered() -> DriverError {
        DriverError::Unavailable("a recording".to_string())
    }

    impl Driver for Recording {
        fn describe(&self) -> String {
            self.called("describe");
            String::new()
        }
        fn gpu_count(&self) -> Result<u32, DriverError> {
            self.called("gpu_count");
            Ok(2)
        }
        fn gpu(&self, _index: u32) -> Result<GpuInfo, DriverError> {
            self.called("gpu");
            Err(unanswered())
        }
        fn known_uuid(&self, _index: u32) -> Option<String> {
            self.called("known_uuid");
            None
        }
        fn gpus(&self) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
            self.called("gpus");
            Err(unanswered())
        }
        fn layout(&self) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
            self.called("layout");
            Err(unanswered())
        }
        fn memory_used(&self, _index: u32) -> Result<Option<u64>, DriverError> {
            self.called("memory_used");
            Ok(None)
        }
        fn memory_used_of(&self, _indexes: &BTreeSet<u32>) -> Figures {
            self.called("memory_used_of");
            Figures::new()
        }
        fn classify_node(&self, _path: &Path) -> Option<Node> {
            self.called("classify_node");
            None
        }
        fn will_wait(&self) {
            self.called("will_wait");
        }
        fn wait_for_change(
            &self,
            _last: &BTreeMap<u32, Option<u64>>,
            _poll: Duration,
            _limit: Duration,
        ) -> Option<Figures> {
            self.called("wait_for_change");
            None
        }
        fn unavailable(&self) -> Option<String> {
            self.called("unavailable");
            None
        }
        fn bookkeeping_slack(&self) -> u64 {
            self.called("bookkeeping_slack");
            0
        }
        fn pci_bus_id(&self, _index: u32) -> Option<String> {
            self.called("pci_bus_id");
            None
        }
        fn health(&self, _index: u32) -> Health {
            self.called("health");
            Health::default()
        }
        fn kernel_log(&self) -> KernelLog {
            self.called("kernel_log");
            KernelLog::default()
        }
        fn activity(&self, _index: u32) -> Activity {
            self.called("activity");
            Activity::default()
        }
        fn persistence_mode(&self, _index: u32) -> Option<bool> {
            self.called("persistence_mode");
            None
        }
        fn platform(&self) -> Platform {
            self.called("platform");
            Platform::default()
        }
        fn evidence(
            &self,
            _indexes: &BTreeSet<u32>,
        ) -> (BTreeMap<u32, evidence::Evidence>, Option<String>) {
            self.called("evidence");
            (BTreeMap::new(), None)
        }
        fn may_omit_other_namespaces(&self) -> bool {
            self.called("may_omit_other_namespaces");
            true
        }
        fn reset(&self, _index: u32) -> Result<(), DriverError> {
            self.called("reset");
            Err(unanswered())
        }
    }

    /// The methods of `Driver`, as its declaration in mod.rs names them.
    fn driver_methods() -> BTreeSet<&'static str> {
        let source = include_str!("mod.rs");
        let trait_at = source.find("\npub trait Driver").expect("the trait");
        let body = &source[trait_at..];
        let body = &body[..body.find("\n}\n").expect("the trait's end")];
        body.lines()
            .filter_map(|line| line.strip_prefix("    fn "))
            .filter_map(|rest| rest.split(['(', '<']).next())
            .collect()
    }

    /// Every method of `Driver`, called on a view of a GPU it names no
    /// instance of, reaches the driver the view wraps: a method added to
    /// the trait fails here until the view passes it on (and this test
    /// calls it), rather than answering with the trait's default.
    #[test]
    fn the_view_passes_every_method_to_the_driver() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let view = InstanceView::wrap(
            Box::new(Recording(Arc::clone(&calls))),
            BTreeMap::from([(0, BTreeSet::from([1]))]),
        );
        let whole = BTreeSet::from([1]);
        let last = BTreeMap::from([(1, Some(0))]);
        view.describe();
        let _ = view.gpu_count();
        let _ = view.gpu(1);
        view.known_uuid(1);
        let _ = view.gpus();
        let _ = view.layout();
        let _ = view.memory_used(1);
        view.memory_used_of(&whole);
        view.classify_node(Path::new("/dev/nvidia1"));
        view.will_wait();
        view.wait_for_change(&last, Duration::ZERO, Duration::ZERO);
        view.unavailable();
        view.bookkeeping_slack();
        view.pci_bus_id(1);
        view.health(1);
        view.kernel_log();
        view.activity(1);
        view.persistence_mode(1);
        view.platform();
        view.evidence(&whole);
        view.may_omit_other_namespaces();
        let _ = view.reset(1);
        let reached: BTreeSet<&str> = calls.lock().expect("calls").iter().copied().collect();
        let methods = driver_methods();
        let missed: Vec<&&str> = methods.difference(&reached).collect();
        assert!(
            missed.is_empty(),
            "the view answers these itself, not the driver it wraps: {missed:?}"
        );
        assert_eq!(reached, methods);
    }
}
