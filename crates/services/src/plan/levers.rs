//! What would give the server a larger pool, each lever computed with the
//! engine's own rule on clean GPUs: fp8 KV cache, a higher memory fraction
//! (and the headroom it leaves), DP attention (SGLang) or decode context
//! parallel (vLLM), more GPUs; and with `--concurrency N`, how many of N
//! requests the server holds at once and which levers, alone or together,
//! reach N, or what hardware would.

use super::engine::{self, Budget, Device};
use super::fit;
use super::launch::{Engine, KvDtype, Launch};
use super::model::{Attention, Model};
use super::render;

const GIB: f64 = (1u64 << 30) as f64;

/// What a lever is computed from: the launch, its model, and the budget
/// and pool on clean GPUs.
pub struct Context<'a> {
    pub launch: &'a Launch,
    pub model: &'a Model,
    /// The budget on clean GPUs (every holder freed).
    pub budget: &'a Budget,
    pub clean: &'a Device,
    pub now: &'a Device,
    pub averages: Option<(u64, u64)>,
    /// Tokens one request needs (averages, else the context length).
    pub request_tokens: Option<u64>,
    /// Whether the weights are the checkpoint's estimate, so that a lever
    /// that changes them (DP attention, more GPUs) can estimate them again.
    pub weights_from_estimate: bool,
    /// What others hold on the engine's GPUs now, to be given back; `None`
    /// when nothing is.
    pub freeing: Option<fit::Freeing>,
}

/// One change to the launch.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Change {
    /// Free what others hold (and reset driver-held memory).
    Free,
    /// KV cache in FP8.
    Fp8Kv,
    /// A higher memory fraction (SGLang) or GPU utilization (vLLM).
    MemFraction { to: f64 },
    /// SGLang DP attention over all the TP ranks: each rank its own requests.
    DpAttention { dp: u32 },
    /// vLLM decode context parallel: the KV cache sharded over the TP ranks.
    DecodeContextParallel { size: u32 },
    /// Twice the GPUs of this kind, at twice the TP.
    MoreGpus { tp: u32 },
}

/// One lever and its computed effect.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Lever {
    /// `free`, `fp8_kv`, `mem_fraction`, `dp_attention`,
    /// `decode_context_parallel` or `more_gpus`.
    pub name: &'static str,
    #[serde(skip)]
    pub change: Change,
    /// The flag (or command) that pulls it.
    pub how: String,
    pub tokens_per_rank: u64,
    pub ranks: u32,
    /// Requests held at once with it (null without a request size).
    pub concurrency: Option<f64>,
    /// Whether the engine still starts with it.
    pub starts: bool,
    /// What it costs or leaves: headroom, extra weights, the caveat.
    pub note: String,
}

/// `--concurrency N`: how many the server holds at once, the rest queued,
/// and which levers reach N.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Demand {
    pub wanted: u64,
    /// Held at once as the server would start now (on clean GPUs when it
    /// would not start now); `null` without a request size.
    pub held: Option<u64>,
    pub queued: Option<u64>,
    /// The smallest sets of levers on this hardware that reach `wanted`,
    /// by name (more GPUs is other hardware: `more_gpus_reach`).
    pub reached_by: Vec<Vec<&'static str>>,
    /// When none does: whether twice the GPUs of this kind (with the
    /// other levers) would.
    pub more_gpus_reach: Option<bool>,
    /// When none does: the memory each GPU would need, at this TP, KV
    /// dtype and fraction.
    pub needs_gpu_memory: Option<u64>,
}

/// The levers that apply to this launch, each alone on clean GPUs.
pub fn levers(context: &Context) -> Vec<Lever> {
    let mut found = Vec::new();
    if context.freeing.is_some() {
        found.push(lever(context, &[Change::Free]));
    }
    for change in changes(context) {
        found.push(lever(context, &[change]));
    }
    found
}

/// The changes that apply to this launch (beside freeing).
fn changes(context: &Context) -> Vec<Change> {
    let launch = context.launch;
    let mut changes = Vec::new();
    let fp8_already = matches!(
        launch.kv_dtype,
        KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 | KvDtype::Fp4E2m1
    ) || (launch.kv_dtype == KvDtype::Auto && context.model.kv_fp8_from_quant);
    // A model without attention layers (Mamba) has no KV to shrink.
    let no_kv = context
        .model
        .linear
        .is_some_and(|linear| linear.attention_layers == 0);
    if !fp8_already && !no_kv {
        changes.push(Change::Fp8Kv);
    }
    // A KV pool given (the command's `--kv-cache-memory-bytes`, plan's
    // `--kv-memory`) skips the budget rule: no fraction moves it.
    let fraction = context.clean.mem_fraction;
    let kv_given = launch.kv_cache_memory_bytes.is_some() || context.budget.kv_memory.is_some();
    if fraction < 0.95 && !kv_given {
        let to = ((fraction + 0.05).min(0.95) * 100.0).round() / 100.0;
        changes.push(Change::MemFraction { to });
    }
    let mla = matches!(context.model.attention, Attention::Mla { .. });
    match launch.engine {
        Engine::Sglang if launch.tp > 1 && !launch.dp_attention => {
            changes.push(Change::DpAttention { dp: launch.tp });
        }
        Engine::Vllm if launch.tp > 1 && mla && launch.dcp <= 1 => {
            changes.push(Change::DecodeContextParallel { size: launch.tp });
        }
        _ => {}
    }
    changes.push(Change::MoreGpus { tp: launch.tp * 2 });
    changes
}

/// The pool with `changes` applied together, on clean GPUs.
fn apply(context: &Context, changes: &[Change]) -> (Device, Launch, Budget, String) {
    let mut launch = context.launch.clone();
    let mut budget = *context.budget;
    let mut notes = Vec::new();
    let weights_of = |launch: &Launch| fit::weights_estimate(launch, context.model);
    for change in changes {
        match *change {
            Change::Free => {}
            Change::Fp8Kv => launch.kv_dtype = KvDtype::Fp8E4m3,
            Change::MemFraction { to } => launch.mem_fraction = Some(to),
            Change::DpAttention { dp } => {
                // The attention weights DP attention splits over attention-TP
                // instead of TP: the difference of the estimates, which does
                // not depend on the checkpoint's total (given weights too).
                let mut sized = context.model.clone();
                sized.weights_bytes = sized.weights_bytes.or(Some(sized.attention_bytes));
                let before = engine::weights_per_gpu(&launch, &sized);
                launch.dp = dp;
                launch.dp_attention = true;
                let after = engine::weights_per_gpu(&launch, &sized);
                let extra = after
                    .zip(before)
                    .map_or(0, |(after, before)| after.saturating_sub(before));
                budget.weights_per_gpu = budget.weights_per_gpu.saturating_add(extra);
                budget.non_kv = budget.non_kv.map(|non_kv| non_kv.saturating_add(extra));
                notes.push(format!(
                    "attention weights replicated: +{:.1} GiB per GPU (estimated from the config)",
                    extra as f64 / GIB
                ));
            }
            Change::DecodeContextParallel { size } => launch.dcp = size,
            Change::MoreGpus { tp } => {
                let old = launch.tp.max(1);
                launch.tp = tp;
                let count = launch.gpu_count() * tp / old;
                launch.gpus = (0..count).collect();
                launch.gpu_uuids.clear();
                let weights = match (context.weights_from_estimate, weights_of(&launch)) {
                    (true, Some(weights)) => weights,
                    // Weights given or logged: split over twice the GPUs.
                    // old < tp: the quotient fits in u64 whatever the weights.
                    _ => u64::try_from(
                        u128::from(budget.weights_per_gpu) * u128::from(old) / u128::from(tp),
                    )
                    .unwrap_or(u64::MAX),
                };
                // A measured non-KV part keeps what is not weights.
                budget.non_kv = budget
                    .non_kv
                    .map(|non_kv| non_kv.saturating_sub(budget.weights_per_gpu) + weights);
                budget.weights_per_gpu = weights;
            }
        }
    }
    let device = engine::device(&launch, context.model, &budget, context.averages);
    (device, launch, budget, notes.join("; "))
}

fn lever(context: &Context, changes: &[Change]) -> Lever {
    let (device, launch, budget, mut note) = apply(context, changes);
    let change = changes[0];
    let sglang = context.launch.engine == Engine::Sglang;
    let (name, how) = match change {
        Change::Free => (
            "free",
            match context.freeing {
                Some(fit::Freeing::Reset) => "reset the GPUs (the command above)",
                Some(fit::Freeing::Unseen) => "free what is unseen (with the host's PIDs)",
                Some(fit::Freeing::Processes { and_reset: true }) => {
                    "free the holders and reset (the commands above)"
                }
                _ => "free the holders (the commands above)",
            }
            .to_string(),
        ),
        Change::Fp8Kv => (
            "fp8_kv",
            if sglang {
                "--kv-cache-dtype fp8_e4m3".to_string()
            } else {
                "--kv-cache-dtype fp8".to_string()
            },
        ),
        Change::MemFraction { to } => (
            "mem_fraction",
            if sglang {
                format!("--mem-fraction-static {to}")
            } else {
                format!("--gpu-memory-utilization {to}")
            },
        ),
        Change::DpAttention { dp } => ("dp_attention", format!("--enable-dp-attention --dp {dp}")),
        Change::DecodeContextParallel { size } => (
            "decode_context_parallel",
            format!("--decode-context-parallel-size {size}"),
        ),
        Change::MoreGpus { tp } => ("more_gpus", format!("--tp {tp} on {tp} GPUs of this kind")),
    };
    if let Change::MemFraction { to } = change {
        let base = if sglang {
            budget.free_at_start
        } else {
            budget.gpu_total
        };
        let left = (1.0 - to) * base as f64 / GIB;
        let before = (1.0 - context.clean.mem_fraction) * base as f64 / GIB;
        push(
            &mut note,
            format!(
                "leaves {left:.1} GiB per GPU for CUDA graphs and activations, instead of {before:.1}: less room against OOM"
            ),
        );
    }
    if let Change::DecodeContextParallel { .. } = change {
        push(
            &mut note,
            "where the attention backend supports it (MLA backends do)".to_string(),
        );
    }
    if let Change::MoreGpus { .. } = change {
        let why = if matches!(context.model.attention, Attention::Mla { .. }) {
            "MLA keeps a whole copy of each token on every rank: only the smaller weights per GPU help"
        } else {
            "the KV heads and the weights are split over twice the ranks"
        };
        push(&mut note, why.to_string());
    }
    let _ = launch;
    if let Some(worse) = worse_than_without(context, &device) {
        push(&mut note, worse);
    }
    Lever {
        name,
        change,
        how,
        tokens_per_rank: device.tokens_per_rank,
        ranks: device.ranks,
        concurrency: fit::concurrency(&device, context.request_tokens),
        starts: fit::starts(&device),
        note,
    }
}

/// What a lever that starts takes away: fewer tokens over all its pools,
/// or fewer requests at once, than the command as it is on clean GPUs.
fn worse_than_without(context: &Context, device: &Device) -> Option<String> {
    let clean = context.clean;
    if !fit::starts(device) || !fit::starts(clean) {
        return None;
    }
    let total =
        |device: &Device| u128::from(device.tokens_per_rank) * u128::from(device.ranks.max(1));
    let at_once = |device: &Device| fit::concurrency(device, context.request_tokens);
    if total(device) < total(clean) {
        let count = |tokens: u128| render::count(u64::try_from(tokens).unwrap_or(u64::MAX));
        Some(format!(
            "WORSE than without it: {} tokens over its {} pool{} instead of {}",
            count(total(device)),
            device.ranks,
            if device.ranks == 1 { "" } else { "s" },
            count(total(clean))
        ))
    } else if let (Some(with), Some(without)) = (at_once(device), at_once(clean))
        && with < without
    {
        Some(format!(
            "WORSE than without it: {with:.1} requests at once instead of {without:.1}"
        ))
    } else {
        None
    }
}

fn push(note: &mut String, more: String) {
    if !note.is_empty() {
        note.push_str("; ");
    }
    note.push_str(&more);
}

/// How many of `wanted` requests the server holds at once, and which
/// levers, alone or together, reach `wanted`.
pub fn demand(context: &Context, levers: &[Lever], wanted: u64) -> Demand {
    let serving = if fit::starts(context.now) {
        context.now
    } else {
        context.clean
    };
    let held = fit::concurrency(serving, context.request_tokens)
        .map(|concurrency| (concurrency.floor() as u64).min(wanted));
    let mut reached_by: Vec<Vec<&'static str>> = Vec::new();
    let mut needs_gpu_memory = None;
    let mut more_gpus_reach = None;
    if let Some(request) = context.request_tokens {
        let reaches = |changes: &[Change]| {
            let (device, ..) = apply(context, changes);
            fit::starts(&device)
                && fit::concurrency(&device, Some(request)).is_some_and(|c| c >= wanted as f64)
        };
        let pool: Vec<&Lever> = levers
            .iter()
            .filter(|lever| !matches!(lever.change, Change::MoreGpus { .. }))
            .collect();
        // Every subset, smallest first: 2^6 at most.
        let mut subsets: Vec<Vec<&Lever>> = (1u32..(1 << pool.len()))
            .map(|mask| {
                pool.iter()
                    .enumerate()
                    .filter(|(bit, _)| mask & (1 << bit) != 0)
                    .map(|(_, lever)| *lever)
                    .collect()
            })
            .collect();
        subsets.sort_by_key(Vec::len);
        for subset in subsets {
            let names: Vec<&'static str> = subset.iter().map(|lever| lever.name).collect();
            // Only the smallest sets: a superset of one that reaches adds nothing.
            if reached_by
                .iter()
                .any(|found| found.iter().all(|name| names.contains(name)))
            {
                continue;
            }
            let changes: Vec<Change> = subset.iter().map(|lever| lever.change).collect();
            if reaches(&changes) {
                reached_by.push(names);
            }
        }
        if reached_by.is_empty() && held.is_none_or(|held| held < wanted) {
            needs_gpu_memory = gpu_memory_for(context, wanted, request);
            let mut all: Vec<Change> = levers.iter().map(|lever| lever.change).collect();
            if !all
                .iter()
                .any(|change| matches!(change, Change::MoreGpus { .. }))
            {
                all.push(Change::MoreGpus {
                    tp: context.launch.tp * 2,
                });
            }
            more_gpus_reach = Some(reaches(&all));
        }
    }
    Demand {
        wanted,
        held,
        queued: held.map(|held| wanted.saturating_sub(held)),
        reached_by,
        more_gpus_reach,
        needs_gpu_memory,
    }
}

/// The GPU memory each GPU would need for `wanted` requests of `request`
/// tokens at this launch's TP, KV dtype and fraction: solved from the
/// engine's rule, `f × free − weights = KV` (SGLang) or
/// `util × total − weights = KV` (vLLM; a logged start's whole non-KV part
/// in place of the weights), the free memory taken as the total.
fn gpu_memory_for(context: &Context, wanted: u64, request: u64) -> Option<u64> {
    let clean = context.clean;
    let ranks = u64::from(clean.ranks.max(1));
    let per_rank = wanted.div_ceil(ranks);
    if per_rank > clean.max_running_requests {
        return None;
    }
    let kv = per_rank as f64 * request as f64 * clean.bytes_per_token as f64;
    let fraction = clean.mem_fraction.max(0.01);
    let slack = context
        .budget
        .gpu_total
        .saturating_sub(context.budget.free_at_start) as f64;
    let not_kv = context
        .budget
        .non_kv
        .unwrap_or(context.budget.weights_per_gpu);
    Some(((kv + not_kv as f64) / fraction + slack) as u64)
}
