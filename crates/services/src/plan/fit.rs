//! Whether a server fits on the GPUs it will use, now and once what others
//! hold there is gone: the engine's GPUs read through the same snapshot as
//! `status`, the device pool computed twice (as the GPUs are now, and on
//! clean GPUs), what each holder costs every rank, and the verdict that
//! becomes `plan`'s exit code. `run --plan` and `plan -H` take the same
//! `evaluate`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::PlanError;
use super::calibrate::{self, Logged};
use super::engine::{self, Budget, Device, HostTier, Start};
use super::launch::{self, Launch};
use super::levers::{self, Demand, Lever};
use super::model::{self, Model};
use super::version::{self, EngineVersion};
use crate::exit::{Exit, Failure};
use crate::snapshot::{Snapshot, Unattributed};
use crate::units;

/// `--gpu-memory SIZE [--gpus N]`: a clean box of such GPUs, instead of
/// this host's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hypothetical {
    pub gpu_memory: u64,
    /// How many; `None`: as many as the command uses.
    pub gpus: Option<u32>,
}

/// The steps of the budget the user gives instead of measuring or estimating.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Free memory per GPU as the engine measures it at start, after its
    /// own context (the MIN over its GPUs; SGLang's "avail mem" before load).
    pub gpu_free: Option<u64>,
    /// Weights (everything loaded before the KV pool) per GPU.
    pub weights: Option<u64>,
    /// The KV pool per GPU: the budget rule is skipped.
    pub kv_memory: Option<u64>,
    /// Host memory available for a host KV tier.
    pub host_memory: Option<u64>,
}

/// What `plan` was asked, typed (`config::plan` builds it).
#[derive(Debug, Clone)]
pub struct PlanConfig {
    /// The engine's command line, as the user would start it.
    pub command: Vec<String>,
    /// The environment the engine would start with (CUDA_VISIBLE_DEVICES,
    /// HF_HUB_CACHE, HF_HOME, HOME).
    pub env: BTreeMap<String, String>,
    /// Average prompt and output tokens per request.
    pub averages: Option<(u64, u64)>,
    /// `--concurrency N`: the requests the clients send at once.
    pub concurrency: Option<u64>,
    pub hypothetical: Option<Hypothetical>,
    pub overrides: Overrides,
    pub from_log: Option<PathBuf>,
    pub model_config: Option<PathBuf>,
    /// `--engine-version X`: the engine version to plan with, instead of
    /// the one the command's interpreter has installed.
    pub engine_version: Option<String>,
    pub json: bool,
}

impl PlanConfig {
    /// A plan of this command line in this environment with nothing else
    /// asked (no averages, no overrides, this host's GPUs): what `run
    /// --plan` and the demo plan.
    pub fn of_command(command: Vec<String>, env: BTreeMap<String, String>) -> PlanConfig {
        PlanConfig {
            command,
            env,
            averages: None,
            concurrency: None,
            hypothetical: None,
            overrides: Overrides::default(),
            from_log: None,
            model_config: None,
            engine_version: None,
            json: false,
        }
    }
}

/// Fits now, fits only once others' memory is freed, or not on this hardware.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Fits,
    FitsAfterFree,
    DoesNotFit,
}

impl Verdict {
    pub fn exit(self) -> Exit {
        match self {
            Verdict::Fits => Exit::Success,
            Verdict::FitsAfterFree => Exit::StillHeld,
            Verdict::DoesNotFit => Exit::CannotFit,
        }
    }
}

/// Why `evaluate` gave no plan: the input (exit 2), or GPUs it could not
/// read (exit 3).
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error(transparent)]
    Input(#[from] PlanError),
    #[error(
        "cannot read the engine's GPUs: {0}; plan for a clean box instead with --gpu-memory SIZE"
    )]
    Unreadable(String),
}

impl From<FitError> for Failure {
    fn from(error: FitError) -> Failure {
        let class = match error {
            FitError::Input(_) => Exit::Usage,
            FitError::Unreadable(_) => Exit::Unknown,
        };
        Failure::new(class, error)
    }
}

/// Where a figure of the budget came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Read from this host's GPUs (the snapshot).
    Snapshot,
    /// `--gpu-memory`: a hypothetical clean GPU.
    Hypothetical,
    /// Given by a flag (`--gpu-free`, `--weights`, `--kv-memory`, `--host-memory`).
    Flag,
    /// Measured by a previous start (`--from-log`).
    Log,
    /// Estimated from the checkpoint (docs/plan.md).
    Estimate,
    /// Estimated from the config's shapes: no checkpoint index beside it.
    ConfigEstimate,
    /// `/proc/meminfo`'s MemAvailable.
    Meminfo,
}

/// One of the engine's GPUs as the snapshot shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuFit {
    pub index: u32,
    pub name: Option<String>,
    /// What CUDA, and so the engine, calls the GPU's total: the driver's
    /// total less what it reserves (615 MiB on an H200), the figure vLLM's
    /// `utilization × total` multiplies.
    pub total: u64,
    pub used: u64,
    /// `total − used`: what the engine would find free now.
    pub free: u64,
    /// What a clean GPU has free: all but the memory the driver keeps for
    /// its own bookkeeping (`Snapshot::held_by_no_process`).
    pub clean_free: u64,
    /// Memory held by no process, by the one rule.
    pub held_by_no_process: Option<Unattributed>,
}

/// What one holder costs the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Cost {
    /// SGLang: every rank's pool is this many tokens smaller (the MIN rule:
    /// the dirtiest GPU sets the pool of every rank).
    Tokens { per_rank: u64 },
    /// The engine would not start with it there (vLLM below its
    /// utilization, SGLang with no memory left for the pool).
    RefusesStart,
    /// Nothing: it fits in the margin the engine leaves (vLLM's `1 − util`).
    Nothing,
    /// The driver reports no figure for it (MIG): its memory is in the
    /// GPU's used memory, so the pool now counts it, but its own share
    /// cannot be told.
    Unknown,
}

/// Something that holds memory on one of the engine's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// `None`: memory held by no process (driver-held), which only a reset clears.
    pub pid: Option<u32>,
    /// Its command line (or comm), anyone's text: escape it to show it.
    pub name: String,
    pub gpu: u32,
    /// `None` where the driver does not report its memory.
    pub bytes: Option<u64>,
    /// What it alone costs, every other GPU clean.
    pub cost: Cost,
    /// With `pid` `None`: memory no listed process explains seen from a PID
    /// namespace of its own (the one rule's `Unseen`), which processes
    /// gpureap cannot see may hold: not driver-held, and no reset is offered.
    pub unseen: bool,
}

/// `--from-log`: what a previous start logged, and what the engine's rule
/// predicts from the figures it logged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    pub logged: Logged,
    /// Tokens the rule gives from the logged free memory and weights; `None`
    /// when the log lacks one of them.
    pub predicted_tokens: Option<u64>,
}

/// The plan: what the server gets here, now and on clean GPUs, who costs
/// it what, and the levers.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub launch: Launch,
    /// The engine version the command would run, and whose rules apply.
    pub engine_version: EngineVersion,
    pub model: Model,
    pub hypothetical: Option<Hypothetical>,
    /// The engine's GPUs as read now; empty for a hypothetical box.
    pub gpus: Vec<GpuFit>,
    pub budget: Budget,
    /// The pool with the GPUs as they are now.
    pub now: Device,
    pub clean_budget: Budget,
    /// The pool on clean GPUs: every holder freed, driver-held memory reset.
    pub clean: Device,
    pub free_source: Source,
    pub weights_source: Source,
    pub kv_source: Option<Source>,
    pub host_tier: Option<HostTier>,
    pub host_memory: Option<(u64, Source)>,
    pub holders: Vec<Holder>,
    pub levers: Vec<Lever>,
    pub demand: Option<Demand>,
    pub calibration: Option<Calibration>,
    pub averages: Option<(u64, u64)>,
    /// The tokens one request needs: the averages' sum, else the context length.
    pub request_tokens: Option<u64>,
    /// `gpureap free --gpu … --pid …` that frees the holders, if any hold memory.
    pub free_command: Option<String>,
    /// `gpureap reset --gpu …` for memory held by no process, if any.
    pub reset_command: Option<String>,
}

/// A holder that costs every rank at most this share of the clean pool's
/// tokens (and does not stop the start) is reported but does not change the
/// verdict; neither do several such together, while what they cost in all
/// stays within it. 1 %: below the plan's own error against the engines'
/// logs (docs/plan.md), and far above a stray CUDA context's few tokens.
pub(crate) const NEGLIGIBLE_SHARE: f64 = 0.01;

/// Why the verdict is what it is (`Outcome::decision`, the one place it is
/// decided).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The engine starts as asked (and holds `--concurrency N`), whatever
    /// others hold costing it at most `NEGLIGIBLE_SHARE`.
    StartsAsAsked,
    /// Freeing what is listed under the holders makes it so.
    Freeing(Freeing),
    /// Even on clean GPUs the engine does not start.
    EngineRefuses,
    /// It starts on clean GPUs but does not hold `--concurrency N` there.
    TooFewAtOnce,
    /// The host tier asked for is more than the host memory it may take.
    HostTier,
    /// SGLang's host tier is no larger than its device pool, which SGLang
    /// 0.5.9 asserts against at start (`HostKVCache`).
    HostTierSmallerThanDevice,
}

/// What would have to be given back for the server to start as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freeing {
    /// Processes, named (and driver-held memory, if any, reset).
    Processes { and_reset: bool },
    /// Only memory held by no process: a reset, not a `free`.
    Reset,
    /// Only memory unseen from this PID namespace: its holders are named
    /// only by a gpureap that sees the host's PIDs.
    Unseen,
}

impl Outcome {
    /// The verdict, and why: 0 when the engine starts as asked (and holds
    /// `--concurrency N`), others' memory costing it at most
    /// `NEGLIGIBLE_SHARE`; 1 only when freeing the listed holders, or a
    /// reset of driver-held memory, makes it so; 4 when nothing on this
    /// host does (the engine refuses even on clean GPUs, does not hold N
    /// there, or the host tier cannot be allocated).
    pub fn decision(&self) -> (Verdict, Reason) {
        if let Some(reason) = self.host_tier_refused() {
            return (Verdict::DoesNotFit, reason);
        }
        if !starts(&self.clean) {
            return (Verdict::DoesNotFit, Reason::EngineRefuses);
        }
        if !self.holds_wanted(&self.clean) {
            return (Verdict::DoesNotFit, Reason::TooFewAtOnce);
        }
        if starts(&self.now) && self.holds_wanted(&self.now) && self.loss_negligible() {
            return (Verdict::Fits, Reason::StartsAsAsked);
        }
        match self.freeing() {
            Some(freeing) => (Verdict::FitsAfterFree, Reason::Freeing(freeing)),
            // Nothing listed to give back: the pool now is all there is.
            None if !starts(&self.now) => (Verdict::DoesNotFit, Reason::EngineRefuses),
            None => (Verdict::DoesNotFit, Reason::TooFewAtOnce),
        }
    }

    pub fn verdict(&self) -> Verdict {
        self.decision().0
    }

    pub fn exit(&self) -> Exit {
        self.verdict().exit()
    }

    /// What freeing the listed holders means here; `None` when none is listed.
    pub fn freeing(&self) -> Option<Freeing> {
        freeing_of(&self.holders)
    }

    /// Whether the pool now is within `NEGLIGIBLE_SHARE` of the clean one.
    fn loss_negligible(&self) -> bool {
        let lost = self
            .clean
            .tokens_per_rank
            .saturating_sub(self.now.tokens_per_rank);
        lost as f64 <= self.clean.tokens_per_rank as f64 * NEGLIGIBLE_SHARE
    }

    /// Whether one holder alone costs at most `NEGLIGIBLE_SHARE` of the
    /// clean pool (reported, not counted against the verdict).
    pub fn negligible(&self, holder: &Holder) -> bool {
        match holder.cost {
            Cost::Nothing => true,
            Cost::Tokens { per_rank } => {
                per_rank as f64 <= self.clean.tokens_per_rank as f64 * NEGLIGIBLE_SHARE
            }
            Cost::RefusesStart | Cost::Unknown => false,
        }
    }

    /// Whether `device` holds the `--concurrency N` asked (true when none
    /// was, or without a request size to tell).
    fn holds_wanted(&self, device: &Device) -> bool {
        match (self.demand.as_ref(), self.concurrency(device)) {
            (Some(demand), Some(at_once)) => at_once.floor() >= demand.wanted as f64,
            _ => true,
        }
    }

    /// Why the host tier asked for stops the start: more than the host
    /// memory it may take (known only with that memory read or given), or
    /// SGLang's no larger than the device pool.
    fn host_tier_refused(&self) -> Option<Reason> {
        let tier = self.host_tier?;
        if self.host_memory.is_some() && !tier.fits {
            Some(Reason::HostTier)
        } else if self.launch.engine == launch::Engine::Sglang
            && !tier.larger_than_device
            && self.launch.rules.sglang_host_smaller_than_device_refused()
        {
            Some(Reason::HostTierSmallerThanDevice)
        } else {
            None
        }
    }

    /// Concurrency at the request size: `tokens ÷ request tokens`, capped by
    /// the engine's running-request limit; `None` without a request size.
    pub fn concurrency(&self, device: &Device) -> Option<f64> {
        concurrency(device, self.request_tokens)
    }
}

/// What giving the holders' memory back takes: a `free` of processes, a
/// reset, or a look with the host's PIDs; `None` when none is listed.
pub(crate) fn freeing_of(holders: &[Holder]) -> Option<Freeing> {
    let processes = holders.iter().any(|holder| holder.pid.is_some());
    let reset = holders
        .iter()
        .any(|holder| holder.pid.is_none() && !holder.unseen);
    let unseen = holders.iter().any(|holder| holder.unseen);
    match (processes, reset, unseen) {
        (true, and_reset, _) => Some(Freeing::Processes { and_reset }),
        (false, true, _) => Some(Freeing::Reset),
        (false, false, true) => Some(Freeing::Unseen),
        (false, false, false) => None,
    }
}

/// Whether the engine starts with this pool.
pub fn starts(device: &Device) -> bool {
    device.start == Start::Starts && device.tokens_per_rank > 0
}

/// Requests a pool holds at once, each `request_tokens` long, over all its
/// ranks, capped by the engine's running-request limit (per rank).
pub fn concurrency(device: &Device, request_tokens: Option<u64>) -> Option<f64> {
    let request = request_tokens.filter(|&tokens| tokens > 0)?;
    let per_rank = engine::concurrency(device, request);
    Some(per_rank * f64::from(device.ranks.max(1)))
}

/// The plan for `config` on the GPUs of `snapshot` (`None`: the
/// hypothetical box of `config.hypothetical`, no GPU read).
pub fn evaluate(config: &PlanConfig, snapshot: Option<&Snapshot>) -> Result<Outcome, FitError> {
    let mut launch = launch::parse(&config.command, &config.env)?;
    let engine_version = match &config.engine_version {
        Some(given) => EngineVersion::given(launch.engine, given),
        None => {
            // The engine starts where plan is run, as the user would start it.
            let cwd = std::env::current_dir().ok();
            let starts_in = version::StartsIn {
                cwd: cwd.as_deref(),
                uv_run: launch.uv_run.as_ref(),
            };
            version::detect(launch.engine, &launch.program, &launch.env, starts_in)
        }
    };
    launch.rules = engine_version.rules;
    let model = model::locate_for(&launch, config.model_config.as_deref())?;
    model::check_engine(&launch, &model)?;
    let (gpus, hypothetical) = engine_gpus(config, &launch, snapshot)?;
    let free = free_memory(config, &gpus, hypothetical)?;
    let logged = match &config.from_log {
        Some(path) => {
            let against = calibrate::Against {
                gpu_total: free.gpu_total,
                utilization: engine::mem_fraction(&launch, &model, free.gpu_total),
            };
            Some(calibrate::read_log_for(path, launch.engine, against)?)
        }
        None => None,
    };
    let (weights_per_gpu, weights_source) = weights(config, &launch, &model, logged)?;
    let (kv_memory, kv_source) = kv_memory(config, &launch);
    let budget = Budget {
        gpu_total: free.gpu_total,
        free_at_start: free.now,
        weights_per_gpu,
        kv_memory,
        non_kv: logged_non_kv(config, &launch, &model, free.gpu_total, logged),
    };
    let clean_budget = Budget {
        free_at_start: free.clean,
        ..budget
    };
    let request_tokens = request_tokens(config, &launch, &model);
    let now = engine::device(&launch, &model, &budget, config.averages);
    let clean = engine::device(&launch, &model, &clean_budget, config.averages);

    let holders = match (hypothetical, snapshot) {
        (None, Some(snapshot)) if config.overrides.gpu_free.is_none() => {
            holders(&launch, &model, &gpus, snapshot, &clean_budget, &clean)
        }
        _ => Vec::new(),
    };
    let (free_command, reset_command) = commands(&holders);
    let (host_memory, host_tier) = host(config, &launch, &model, &clean);
    let calibration = logged.map(|logged| calibration(&launch, &model, &budget, logged));

    let context = levers::Context {
        launch: &launch,
        model: &model,
        budget: &clean_budget,
        clean: &clean,
        now: &now,
        averages: config.averages,
        request_tokens,
        weights_from_estimate: matches!(weights_source, Source::Estimate | Source::ConfigEstimate),
        freeing: freeing_of(&holders),
    };
    let levers = levers::levers(&context);
    let demand = config
        .concurrency
        .map(|wanted| levers::demand(&context, &levers, wanted));

    Ok(Outcome {
        launch,
        engine_version,
        model,
        hypothetical,
        gpus,
        budget,
        now,
        clean_budget,
        clean,
        free_source: free.source,
        weights_source,
        kv_source,
        host_tier,
        host_memory,
        holders,
        levers,
        demand,
        calibration,
        averages: config.averages,
        request_tokens,
        free_command,
        reset_command,
    })
}

/// The engine's GPUs read now (and no box), or a clean hypothetical box
/// (and no GPUs): `--gpus` below what the command uses is bad input.
fn engine_gpus(
    config: &PlanConfig,
    launch: &Launch,
    snapshot: Option<&Snapshot>,
) -> Result<(Vec<GpuFit>, Option<Hypothetical>), FitError> {
    let needed = launch.gpu_count().max(1);
    match (config.hypothetical, snapshot) {
        (Some(box_), _) => {
            if let Some(count) = box_.gpus
                && count < needed
            {
                return Err(PlanError::BadValue {
                    flag: "--gpus".to_string(),
                    value: count.to_string(),
                    why: format!(
                        "the command uses {needed} GPUs (tp {} × pp {}); give at least that many",
                        launch.tp, launch.pp
                    ),
                }
                .into());
            }
            Ok((Vec::new(), Some(box_)))
        }
        (None, Some(snapshot)) => Ok((read_gpus(launch, snapshot)?, None)),
        (None, None) => Err(FitError::Unreadable(
            "no snapshot of this host was taken".to_string(),
        )),
    }
}

/// Free memory per GPU as the engine would measure it at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FreeMemory {
    /// The engine's total: the smallest of its GPUs, or the box's.
    gpu_total: u64,
    /// With the GPUs as they are now.
    now: u64,
    /// On clean GPUs (a given `--gpu-free` stands for both).
    clean: u64,
    source: Source,
}

/// The free memory at start: `--gpu-free`, else the box's total less the
/// engine's context, else the MIN over the engine's GPUs (`engine_free`).
/// A `--gpu-free` stands for the GPUs now and clean alike (it is what the
/// user says the engine finds: nothing of it is anyone's to free), and one
/// above the GPU's total, the box's or this host's, is bad input.
fn free_memory(
    config: &PlanConfig,
    gpus: &[GpuFit],
    hypothetical: Option<Hypothetical>,
) -> Result<FreeMemory, PlanError> {
    let given = config.overrides.gpu_free;
    let (gpu_total, total_of) = match hypothetical {
        Some(box_) => (box_.gpu_memory, "--gpu-memory"),
        None => (
            gpus.iter().map(|gpu| gpu.total).min().unwrap_or(0),
            "the engine's smallest GPU",
        ),
    };
    if let Some(free) = given.filter(|free| *free > gpu_total) {
        return Err(PlanError::BadValue {
            flag: "--gpu-free".to_string(),
            value: units::Bytes(free).to_string(),
            why: format!(
                "more than {total_of} has in all ({}): a GPU cannot have more free than it has",
                units::Bytes(gpu_total)
            ),
        });
    }
    if let Some(free) = given {
        return Ok(FreeMemory {
            gpu_total,
            now: free,
            clean: free,
            source: Source::Flag,
        });
    }
    Ok(match hypothetical {
        Some(box_) => {
            let free = box_.gpu_memory.saturating_sub(engine::CUDA_CONTEXT_BYTES);
            FreeMemory {
                gpu_total,
                now: free,
                clean: free,
                source: Source::Hypothetical,
            }
        }
        None => FreeMemory {
            gpu_total,
            now: engine_free(gpus.iter().map(|gpu| gpu.free)),
            clean: engine_free(gpus.iter().map(|gpu| gpu.clean_free)),
            source: Source::Snapshot,
        },
    })
}

/// The weights per GPU: `--weights`, else the log's, else the estimate
/// from the checkpoint; none of them is bad input naming `--weights`.
fn weights(
    config: &PlanConfig,
    launch: &Launch,
    model: &Model,
    logged: Option<Logged>,
) -> Result<(u64, Source), PlanError> {
    if let Some(weights) = config.overrides.weights {
        return Ok((weights, Source::Flag));
    }
    if let Some(logged) = logged
        && let Some(weights) = logged.weights_per_gpu
    {
        // vLLM: the log's weights at the command's TP.
        let weights = match launch.engine {
            launch::Engine::Vllm => engine::vllm_weights_at_tp(weights, &logged.run, launch, model),
            launch::Engine::Sglang => weights,
        };
        return Ok((weights, Source::Log));
    }
    match weights_estimate(launch, model) {
        Some(weights) if model.weights_from_config => Ok((weights, Source::ConfigEstimate)),
        Some(weights) => Ok((weights, Source::Estimate)),
        None => Err(PlanError::NoWeights {
            dir: model
                .config_path
                .parent()
                .map_or_else(|| model.config_path.clone(), Path::to_path_buf),
        }),
    }
}

/// ESTIMATE: the weights one GPU holds once loaded (`engine::weights_per_gpu`),
/// less what `--cpu-offload-gb` keeps in host memory: the loaders move
/// parameters until at least that much is moved (one parameter more at
/// most). `None` without a checkpoint size.
pub(crate) fn weights_estimate(launch: &Launch, model: &Model) -> Option<u64> {
    engine::weights_per_gpu(launch, model)
        .map(|weights| weights.saturating_sub(launch.cpu_offload_bytes))
}

/// The KV pool given instead of the budget rule: `--kv-memory`, else
/// `--kv-cache-memory-bytes`.
fn kv_memory(config: &PlanConfig, launch: &Launch) -> (Option<u64>, Option<Source>) {
    match config.overrides.kv_memory.or(launch.kv_cache_memory_bytes) {
        Some(bytes) => (Some(bytes), Some(Source::Flag)),
        None => (None, None),
    }
}

/// vLLM with a log (and no `--weights`): what the logged start's requested
/// memory held besides its KV cache (`Logged::vllm_non_kv`; at the
/// command's utilization when the log states neither what it requested
/// nor its utilization).
/// The logged `Available KV cache memory` is the budget rule's answer at
/// that start's utilization only: what it fixes is the rest.
fn logged_non_kv(
    config: &PlanConfig,
    launch: &Launch,
    model: &Model,
    gpu_total: u64,
    logged: Option<Logged>,
) -> Option<u64> {
    if launch.engine != launch::Engine::Vllm || config.overrides.weights.is_some() {
        return None;
    }
    let utilization = engine::mem_fraction(launch, model, gpu_total);
    let logged = logged?;
    let non_kv = logged.vllm_non_kv(gpu_total, utilization)?;
    engine::vllm_carried_non_kv(
        non_kv,
        logged.weights_per_gpu,
        &logged.run,
        launch,
        model,
        gpu_total,
    )
}

/// The tokens one request needs: the averages' sum, else the context
/// length (the command's, else the model's).
fn request_tokens(config: &PlanConfig, launch: &Launch, model: &Model) -> Option<u64> {
    config
        .averages
        .map(|(prompt, output)| prompt.saturating_add(output))
        .filter(|&tokens| tokens > 0)
        .or(launch.context_length)
        .or(model.max_position)
}

/// The host memory a host tier is checked against (`--host-memory`, else
/// MemAvailable) and the tier, when the command enables one.
fn host(
    config: &PlanConfig,
    launch: &Launch,
    model: &Model,
    clean: &Device,
) -> (Option<(u64, Source)>, Option<HostTier>) {
    let host_memory = match launch.host_tier {
        None => None,
        Some(_) => match config.overrides.host_memory {
            Some(bytes) => Some((bytes, Source::Flag)),
            None => mem_available().map(|bytes| (bytes, Source::Meminfo)),
        },
    };
    let host_tier = host_memory
        .and_then(|(bytes, _)| engine::host_tier(launch, model, clean, bytes))
        .or_else(|| {
            // MemAvailable unreadable: the tier's size is still the engine's.
            launch
                .host_tier
                .and_then(|_| engine::host_tier(launch, model, clean, 0))
        });
    (host_memory, host_tier)
}

/// What the log measured, and the tokens the rule gives from the logged
/// figures (`None` when the log lacks them): SGLang's from its free memory
/// before load and W'; vLLM's from its KV budget, on a GPU it started on.
fn calibration(launch: &Launch, model: &Model, budget: &Budget, logged: Logged) -> Calibration {
    let predict = |budget: Budget| engine::device(launch, model, &budget, None).tokens_per_rank;
    let predicted_tokens = match launch.engine {
        launch::Engine::Sglang => {
            logged
                .free_before_load
                .zip(logged.weights_per_gpu)
                .map(|(free, weights)| {
                    predict(Budget {
                        free_at_start: free,
                        weights_per_gpu: weights,
                        ..*budget
                    })
                })
        }
        // At the log's TP: its KV memory held that TP's share of a token.
        launch::Engine::Vllm => logged.kv_bytes.map(|kv| {
            let mut logged_launch = launch.clone();
            logged_launch.tp =
                u32::try_from(logged.run.tp_or(u64::from(launch.tp.max(1)))).unwrap_or(launch.tp);
            let budget = Budget {
                free_at_start: budget.gpu_total,
                kv_memory: Some(kv),
                ..*budget
            };
            engine::device(&logged_launch, model, &budget, None).tokens_per_rank
        }),
    };
    Calibration {
        logged,
        predicted_tokens,
    }
}

/// The engine's GPUs, as the snapshot shows them: `Launch::gpus`, or where
/// CUDA_VISIBLE_DEVICES names them by UUID (`Launch::gpu_uuids`, a unique
/// prefix as CUDA allows), the snapshot's GPU of that UUID.
fn read_gpus(launch: &Launch, snapshot: &Snapshot) -> Result<Vec<GpuFit>, FitError> {
    if let Some(error) = &snapshot.driver_error {
        return Err(FitError::Unreadable(error.to_string()));
    }
    let mut indexes = launch.gpus.clone();
    for uuid in &launch.gpu_uuids {
        let matching: Vec<u32> = snapshot
            .gpus
            .iter()
            .filter(|state| {
                state
                    .uuid
                    .as_deref()
                    .is_some_and(|known| known.starts_with(uuid.as_str()))
            })
            .map(|state| state.index)
            .collect();
        match matching[..] {
            [index] => indexes.push(index),
            _ => {
                return Err(PlanError::BadValue {
                    flag: "CUDA_VISIBLE_DEVICES".to_string(),
                    value: uuid.clone(),
                    why: if matching.is_empty() {
                        "no GPU of this host has that UUID (see `gpureap status --json`)"
                            .to_string()
                    } else {
                        "more than one GPU of this host has a UUID that starts so".to_string()
                    },
                }
                .into());
            }
        }
    }
    let mut found = Vec::new();
    for index in indexes {
        let Some(state) = snapshot.gpu(index) else {
            return Err(missing_gpu(launch, index, snapshot.gpus.len()).into());
        };
        if let Some(error) = &state.error {
            return Err(FitError::Unreadable(format!("GPU {index}: {error}")));
        }
        let (Some(total), Some(used)) = (state.memory_total, state.memory_used) else {
            return Err(FitError::Unreadable(format!(
                "GPU {index}: the driver reports no memory figures"
            )));
        };
        let total = total.saturating_sub(state.memory_reserved.unwrap_or(0));
        let held = snapshot.held_by_no_process(state);
        // Within the driver's bookkeeping, memory held by no process stays
        // on a clean GPU too.
        let kept = held
            .filter(|held| !held.holds())
            .map_or(0, |held| held.bytes);
        if !found.iter().any(|fit: &GpuFit| fit.index == index) {
            found.push(GpuFit {
                index,
                name: state.name.clone(),
                total,
                used,
                free: total.saturating_sub(used),
                clean_free: total.saturating_sub(kept),
                held_by_no_process: held,
            });
        }
    }
    Ok(found)
}

/// The engine would use GPU `index`, which this host (of `count` GPUs)
/// lacks: more GPUs than the host has, or ids moved past its last.
fn missing_gpu(launch: &Launch, index: u32, count: usize) -> PlanError {
    let needed = launch.gpu_count();
    let sizes = format!("TP {} × PP {} × DP {}", launch.tp, launch.pp, launch.dp);
    if needed as usize > count {
        return PlanError::BadValue {
            flag: "--tp-size/--pp-size/--dp-size".to_string(),
            value: sizes.clone(),
            why: format!(
                "the command uses {needed} GPUs ({sizes}) and this host has {count}: plan for a box of such GPUs with --gpu-memory SIZE --gpus {needed}"
            ),
        };
    }
    let moved_by = match launch.engine {
        launch::Engine::Sglang => "CUDA_VISIBLE_DEVICES, --base-gpu-id or --gpu-id-step",
        launch::Engine::Vllm => "CUDA_VISIBLE_DEVICES or --device-ids",
    };
    PlanError::BadValue {
        flag: "the engine's GPUs".to_string(),
        value: index.to_string(),
        why: format!(
            "the command's {needed} GPUs reach GPU {index}, and this host has GPUs 0 to {} (check {moved_by})",
            count.saturating_sub(1)
        ),
    }
}

/// Every process holding memory on one of the engine's GPUs, and memory
/// held by no process there, each with what it alone costs: the pool with
/// only it held, every other GPU clean.
fn holders(
    launch: &Launch,
    model: &Model,
    gpus: &[GpuFit],
    snapshot: &Snapshot,
    clean_budget: &Budget,
    clean: &Device,
) -> Vec<Holder> {
    let cost = |gpu: &GpuFit, bytes: u64| {
        // The MIN over the engine's GPUs: this GPU with only it held,
        // against the others clean.
        let frees = gpus.iter().map(|other| {
            if other.index == gpu.index {
                other.clean_free.saturating_sub(bytes)
            } else {
                other.clean_free
            }
        });
        let budget = Budget {
            free_at_start: engine_free(frees),
            ..*clean_budget
        };
        let device = engine::device(launch, model, &budget, None);
        if !starts(&device) {
            Cost::RefusesStart
        } else if device.tokens_per_rank >= clean.tokens_per_rank {
            Cost::Nothing
        } else {
            Cost::Tokens {
                per_rank: clean.tokens_per_rank - device.tokens_per_rank,
            }
        }
    };
    let mut found = Vec::new();
    for gpu in gpus {
        let Some(state) = snapshot.gpu(gpu.index) else {
            continue;
        };
        for user in state.users.iter().filter(|user| user.listed) {
            let name = match snapshot.processes.get(&user.pid) {
                Some(record) if !user.hidden && !record.cmdline.is_empty() => {
                    record.cmdline.clone()
                }
                Some(record) if !user.hidden => record.comm.clone(),
                _ => "(in another PID namespace)".to_string(),
            };
            found.push(Holder {
                pid: Some(user.pid),
                name,
                gpu: gpu.index,
                bytes: user.memory,
                // Unknown memory (MIG): it may cost anything; say the worst
                // that is known, nothing, only when it is known.
                cost: user.memory.map_or(Cost::Nothing, |bytes| cost(gpu, bytes)),
                unseen: false,
            });
        }
        if let Some(held) = gpu.held_by_no_process.filter(|held| held.holds()) {
            found.push(Holder {
                pid: None,
                name: if held.unseen() {
                    "unseen from this PID namespace (processes gpureap cannot see may hold it: run it with the host's PIDs)"
                } else {
                    "held by no process (driver-held)"
                }
                .to_string(),
                gpu: gpu.index,
                bytes: Some(held.bytes),
                cost: cost(gpu, held.bytes),
                unseen: held.unseen(),
            });
        }
    }
    found
}

/// What the engine finds free at start on GPUs with these free figures:
/// the MIN over them (SGLang all-reduces it; vLLM's ranks each check
/// theirs, so the dirtiest refuses), less its own context.
fn engine_free(frees: impl Iterator<Item = u64>) -> u64 {
    frees
        .min()
        .unwrap_or(0)
        .saturating_sub(engine::CUDA_CONTEXT_BYTES)
}

/// The commands that give the memory back: `gpureap free` for the
/// processes, `gpureap reset` for memory held by no process.
fn commands(holders: &[Holder]) -> (Option<String>, Option<String>) {
    let gpus = |with_pid: bool| -> std::collections::BTreeSet<u32> {
        holders
            .iter()
            .filter(|holder| holder.pid.is_some() == with_pid && !holder.unseen)
            .map(|holder| holder.gpu)
            .collect()
    };
    let pids: std::collections::BTreeSet<u32> =
        holders.iter().filter_map(|holder| holder.pid).collect();
    let free = (!pids.is_empty()).then(|| {
        let mut command = format!("gpureap free --gpu {}", units::GpuRanges(&gpus(true)));
        for pid in &pids {
            command.push_str(&format!(" --pid {pid}"));
        }
        command
    });
    let reset_gpus = gpus(false);
    let reset = (!reset_gpus.is_empty())
        .then(|| format!("gpureap reset --gpu {}", units::GpuRanges(&reset_gpus)));
    (free, reset)
}

/// MemAvailable of /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
}

#[cfg(test)]
mod unseen_tests {
    use super::*;

    /// Memory unseen from a PID namespace of its own is a holder whose GPU
    /// gets no `gpureap reset` command; driver-held memory's does.
    #[test]
    fn unseen_memory_gets_no_reset_command() {
        let holder = |gpu: u32, unseen: bool| Holder {
            pid: None,
            name: String::new(),
            gpu,
            bytes: Some(1 << 30),
            cost: Cost::Nothing,
            unseen,
        };
        assert_eq!(commands(&[holder(0, true)]), (None, None));
        assert_eq!(
            commands(&[holder(0, true), holder(1, false)]),
            (None, Some("gpureap reset --gpu 1".to_string()))
        );
    }
}
