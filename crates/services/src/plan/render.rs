//! The plan for people (text) and for programs (JSON, `kind: "plan"`,
//! docs/json.md), and the short forms of it that `run --plan`, `plan -H`
//! and the demo say, so that a holder, a pool and a verdict read the same
//! wherever they are told. Every piece of anyone's text in it (a holder's
//! command line, a path, a flag not understood) is one line
//! (`units::one_line`).

use serde::Serialize;

use super::engine::{self, Budget, Cap, Device, EngineLog, Hybrid, Start};
use super::fit::{Cost, Freeing, Holder, NEGLIGIBLE_SHARE, Outcome, Reason, Source, Verdict};
use super::launch::{Engine, HostTierRequest, KvDtype, Launch};
use super::levers::{Demand, Lever};
use super::model::{Attention, Model};
use super::version::{EngineVersion, Found};
use crate::report::{self, SCHEMA_VERSION};
use crate::units::{Bytes, Field, GpuRanges};

const GIB: f64 = (1u64 << 30) as f64;

/// Thousands separated by commas, as the engines' logs are read by people.
pub(crate) fn count(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (at, digit) in digits.chars().enumerate() {
        if at > 0 && (digits.len() - at).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn engine_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Sglang => "SGLang",
        Engine::Vllm => "vLLM",
    }
}

fn source(source: Source) -> &'static str {
    match source {
        Source::Snapshot => "this host's GPUs now, the least free of them",
        Source::Hypothetical => "--gpu-memory, a clean GPU",
        Source::Flag => "given",
        Source::Log => "--from-log",
        Source::Estimate => "estimated from the checkpoint",
        Source::ConfigEstimate => "ESTIMATE from config.json: no safetensors index or files",
        Source::Meminfo => "MemAvailable",
    }
}

fn kv_dtype(dtype: KvDtype) -> &'static str {
    match dtype {
        KvDtype::Auto => "auto",
        KvDtype::Bf16 => "bf16",
        KvDtype::Fp16 => "fp16",
        KvDtype::Fp8E4m3 => "fp8_e4m3",
        KvDtype::Fp8E5m2 => "fp8_e5m2",
        KvDtype::Fp4E2m1 => "fp4_e2m1",
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB)
}

fn start_text(start: &Start) -> String {
    match start {
        Start::Starts => "starts".to_string(),
        Start::NotEnoughMemory {
            raise_fraction_to: Some(to),
        } => format!("does not start: \"Not enough memory\" (raise the fraction to {to:.3})"),
        Start::NotEnoughMemory {
            raise_fraction_to: None,
        } => "does not start: \"Not enough memory\" (no KV pool is left)".to_string(),
        Start::RefusesFree { needed, free } => format!(
            "refuses to start: free memory {} is less than the {} its utilization asks",
            Bytes(*free),
            Bytes(*needed)
        ),
        Start::WeightsTooLarge => {
            "does not start: the weights are larger than the free memory at start".to_string()
        }
    }
}

fn concurrency_text(concurrency: Option<f64>) -> String {
    concurrency.map_or("?".to_string(), |c| format!("{c:.1}"))
}

/// The verdict in words, wherever a plan is told (`plan`, `plan -H`, the demo).
pub(crate) fn verdict_text(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Fits => "fits now",
        Verdict::FitsAfterFree => "fits only after freeing what others hold",
        Verdict::DoesNotFit => "does not fit on this hardware, even on clean GPUs",
    }
}

/// The plan as a report for people: its sections, each followed by a
/// blank line, then the verdict.
pub fn text(outcome: &Outcome) -> String {
    let sections = [
        launch_section(outcome),
        budget_section(outcome),
        pool_section(outcome),
        holders_section(outcome),
        host_tier_section(outcome),
        levers_section(outcome),
        outcome
            .demand
            .as_ref()
            .map(demand_text)
            .into_iter()
            .collect(),
        calibration_section(outcome),
        ignored_section(outcome),
    ];
    let mut out = String::new();
    for section in sections.iter().filter(|lines| !lines.is_empty()) {
        for line in section {
            out.push_str(line);
            out.push('\n');
        }
        out.push('\n');
    }
    out.push_str(&verdict_line(outcome));
    out.push('\n');
    out
}

/// `Verdict: fits now (exit 0)`, in the words of its reason
/// (`Outcome::decision`, where the verdict is decided).
pub fn verdict_line(outcome: &Outcome) -> String {
    format!(
        "Verdict: {} (exit {})",
        verdict_words(outcome),
        outcome.exit().code()
    )
}

/// The verdict in the words of its reason: `fits only after a reset of
/// the memory held by no process (no process to free)`.
pub fn verdict_words(outcome: &Outcome) -> String {
    let (verdict, reason) = outcome.decision();
    match reason {
        Reason::StartsAsAsked if outcome.holders.is_empty() => verdict_text(verdict).to_string(),
        Reason::StartsAsAsked => format!(
            "{}: what others hold costs it at most {:.0}% of the pool",
            verdict_text(verdict),
            NEGLIGIBLE_SHARE * 100.0
        ),
        Reason::Freeing(Freeing::Processes { and_reset: false }) | Reason::EngineRefuses => {
            verdict_text(verdict).to_string()
        }
        Reason::Freeing(Freeing::Processes { and_reset: true }) => format!(
            "{}, and a reset of the memory held by no process",
            verdict_text(verdict)
        ),
        Reason::Freeing(Freeing::Reset) => {
            "fits only after a reset of the memory held by no process (no process to free)"
                .to_string()
        }
        Reason::Freeing(Freeing::Unseen) => {
            "fits only after freeing memory unseen from this PID namespace (run gpureap with the host's PIDs to name its holders)".to_string()
        }
        Reason::TooFewAtOnce => format!(
            "does not hold --concurrency {} at once on this hardware, even on clean GPUs",
            outcome
                .demand
                .as_ref()
                .map_or("N".to_string(), |demand| count(demand.wanted))
        ),
        Reason::HostTier => {
            "the host tier does not fit this host's memory: more than the engine may take (see Host tier)"
                .to_string()
        }
        Reason::HostTierSmallerThanDevice => {
            "does not start: SGLang's host tier must be larger than its device pool (see Host tier)"
                .to_string()
        }
    }
}

/// One pool in a few words, as the short forms of a plan say it (`run
/// --plan`, `plan -H`, the demo): `410308 tokens per rank × 2 pools,
/// 102.6 requests at once`, or `would not start`.
pub(crate) fn pool_summary(
    tokens_per_rank: u64,
    starts: bool,
    ranks: u32,
    concurrency: Option<f64>,
) -> String {
    if !starts {
        return "would not start".to_string();
    }
    let mut text = format!("{tokens_per_rank} tokens per rank");
    if ranks > 1 {
        text.push_str(&format!(" × {ranks} pools"));
    }
    if let Some(concurrency) = concurrency {
        text.push_str(&format!(", {concurrency:.1} requests at once"));
    }
    text
}

/// `pool_summary` of one of the plan's pools (`now` or `clean`), with the
/// requests at once only where averages were given, as in the JSON.
pub fn device_summary(outcome: &Outcome, device: &Device) -> String {
    pool_summary(
        device.tokens_per_rank,
        super::fit::starts(device),
        device.ranks,
        outcome.averages.and_then(|_| outcome.concurrency(device)),
    )
}

/// One holder in one line, as the short forms of a plan say it:
/// `GPU 0: pid 4242 (python3 notebook.py) holds 10.0 GiB: costs every rank
/// 68485 tokens`.
pub fn holder_summary(holder: &Holder) -> String {
    let who = match holder.pid {
        Some(pid) => format!("pid {pid} ({})", crate::units::short(&holder.name, 50)),
        None => crate::units::one_line(&holder.name).into_owned(),
    };
    let bytes = holder
        .bytes
        .map_or("an unknown amount".to_string(), |bytes| {
            Bytes(bytes).to_string()
        });
    let cost = match holder.cost {
        Cost::Tokens { per_rank } => format!("costs every rank {per_rank} tokens"),
        Cost::RefusesStart => "alone stops the start".to_string(),
        Cost::Nothing => "costs nothing".to_string(),
        Cost::Unknown => "costs what cannot be told (no figure from the driver)".to_string(),
    };
    format!("GPU {}: {who} holds {bytes}: {cost}", holder.gpu)
}

/// The engine's GPUs as ranges: `0-3,6`.
pub fn gpus_text(outcome: &Outcome) -> String {
    let indexes = outcome.gpus.iter().map(|gpu| gpu.index).collect();
    GpuRanges(&indexes).to_string()
}

/// Why the engine would not start with this pool, the engine named:
/// `SGLang does not start: "Not enough memory" (raise the fraction to 0.930)`.
pub fn start_problem(engine: Engine, device: &Device) -> String {
    match device.start {
        Start::Starts => "no KV cache would be left".to_string(),
        _ => format!("{} {}", engine_name(engine), start_text(&device.start)),
    }
}

/// The engine, the model, what each token costs and the GPUs planned on.
fn launch_section(outcome: &Outcome) -> Vec<String> {
    let launch = &outcome.launch;
    let model = &outcome.model;
    let mut lines = vec![format!(
        "{} serving {} (TP {}{}{})",
        engine_name(launch.engine),
        Field(&launch.model),
        launch.tp,
        if launch.pp > 1 {
            format!(", PP {}", launch.pp)
        } else {
            String::new()
        },
        if launch.dp_attention {
            format!(", DP attention {}", launch.dp)
        } else {
            String::new()
        }
    )];
    lines.push(format!(
        "  version   {}",
        version_text(launch.engine, &outcome.engine_version)
    ));
    lines.push(format!(
        "  model     {} ({})",
        Field(&model.config_path.display().to_string()),
        if model.architecture.is_empty() {
            "architecture not named".to_string()
        } else {
            crate::units::one_line(&model.architecture).into_owned()
        }
    ));
    lines.push(format!("  per token {}", attention_text(model)));
    lines.push(gpus_line(outcome));
    lines
}

/// Which version plan found or was given, and whose rules it applied.
fn version_text(engine: Engine, version: &EngineVersion) -> String {
    let engine = engine_name(engine);
    let rules = version.rules.version();
    let applied = if version.other_rules() {
        format!("planned with {rules}'s rules, the nearest kept")
    } else {
        "planned with its rules".to_string()
    };
    match &version.found {
        Found::Metadata {
            version, metadata, ..
        } => format!(
            "{engine} {} found ({}); {applied}",
            crate::units::short(version, 64),
            Field(&metadata.display().to_string())
        ),
        Found::Flag { version } => format!(
            "{engine} {} (--engine-version); {applied}",
            crate::units::short(version, 64)
        ),
        Found::None { why } => format!(
            "no {engine} version found ({}); planned with {rules}'s rules (the default: the version the real starts of docs/plan.md were measured with)",
            crate::units::short(why, 200)
        ),
    }
}

fn attention_text(model: &Model) -> String {
    // The layers that hold KV: a linear-attention or Mamba model's
    // attention layers; its other layers hold a state per request.
    let (layers, state) = match model.linear {
        Some(linear) if linear.attention_layers == 0 => {
            return format!(
                "no attention layer, no KV: {} Mamba layers hold a state per request",
                linear.layers
            );
        }
        Some(linear) => (
            linear.attention_layers,
            format!(
                "; {} linear-attention or Mamba layers hold a state per request",
                linear.layers
            ),
        ),
        None => (model.layers, String::new()),
    };
    match model.attention {
        Attention::Mla {
            kv_lora_rank,
            qk_rope_head_dim,
        } => match model.sparse {
            None => format!(
                "MLA: ({kv_lora_rank} + {qk_rope_head_dim}) × {layers} layers × KV bytes, the same on every rank{state}"
            ),
            Some(sparse) => format!(
                "sparse MLA (DSA): (({kv_lora_rank} + {qk_rope_head_dim}) × KV bytes, or 656 for an FP8 cache where the engine counts its stored layout, + an indexer key of {} bytes) × {layers} layers, the same on every rank{state}",
                sparse.indexer_bytes(),
            ),
        },
        Attention::Mha {
            kv_heads,
            head_dim,
            v_head_dim,
        } => format!(
            "{kv_heads} KV heads ÷ attention TP (at least 1) × ({head_dim} + {v_head_dim}) × {layers} layers × KV bytes{state}"
        ),
    }
}

/// The hypothetical box, or this host's GPUs by the smallest of them.
fn gpus_line(outcome: &Outcome) -> String {
    match outcome.hypothetical {
        Some(box_) => format!(
            "  GPUs      {} × {} (hypothetical, clean; no GPU read)",
            box_.gpus.unwrap_or(outcome.launch.gpu_count()),
            gib(box_.gpu_memory)
        ),
        None => {
            let name = outcome
                .gpus
                .first()
                .and_then(|gpu| gpu.name.clone())
                .unwrap_or_else(|| "GPU".to_string());
            format!(
                "  GPUs      {} ({}, {} total, the smallest)",
                gpus_text(outcome),
                Field(&name),
                gib(outcome.budget.gpu_total)
            )
        }
    }
}

/// The engine's budget rule per GPU, each figure with where it came from.
fn budget_section(outcome: &Outcome) -> Vec<String> {
    let launch = &outcome.launch;
    let budget = &outcome.budget;
    let sglang = launch.engine == Engine::Sglang;
    let mut lines = vec![if sglang {
        "Budget per GPU (SGLang: KV = fraction × free at start − weights; free is the MIN over the ranks)".to_string()
    } else {
        "Budget per GPU (vLLM: KV = utilization × total − weights and activations; refuses to start when free < utilization × total)".to_string()
    }];
    lines.push(format!(
        "  free at start   {:>10}  ({})",
        gib(budget.free_at_start),
        source(outcome.free_source)
    ));
    lines.push(format!(
        "  weights         {:>10}  ({})",
        gib(budget.weights_per_gpu),
        source(outcome.weights_source)
    ));
    lines.push(format!(
        "  {:<15} {:>10}  ({})",
        if sglang {
            "mem fraction"
        } else {
            "utilization"
        },
        format!("{:.3}", outcome.now.mem_fraction),
        if launch.mem_fraction.is_some() {
            "from the command"
        } else {
            "the engine's default"
        }
    ));
    if let Some(kv) = budget.kv_memory {
        lines.push(format!(
            "  KV memory       {:>10}  (given: the budget rule is skipped)",
            gib(kv)
        ));
    }
    lines.push(format!(
        "  KV dtype        {:>10}",
        kv_dtype(launch.kv_dtype)
    ));
    lines
}

/// The device pool, now and on clean GPUs, and the requests it holds.
fn pool_section(outcome: &Outcome) -> Vec<String> {
    let mut lines = vec!["Device pool".to_string()];
    if outcome.hypothetical.is_some() {
        lines.push(pool_line("clean GPUs", &outcome.clean, &outcome.launch));
    } else {
        lines.push(pool_line("now", &outcome.now, &outcome.launch));
        if outcome.clean != outcome.now {
            lines.push(pool_line("clean GPUs", &outcome.clean, &outcome.launch));
        }
    }
    let shown = if outcome.hypothetical.is_some() {
        &outcome.clean
    } else {
        &outcome.now
    };
    lines.extend(engine_log_line(outcome.launch.engine, shown.logged));
    lines.extend(hybrid_line(shown));
    lines.push(concurrency_line(outcome));
    lines.push(
        "  an upper bound: decode concurrency is tokens ÷ tokens per request, while requests grow"
            .to_string(),
    );
    lines
}

/// What vLLM would log about its pool, as it prints it (SGLang's
/// `max_total_num_tokens` is the pool's tokens, or the full pool that the
/// `SWA pools` line shows: the JSON's `engine_log` carries it).
fn engine_log_line(engine: Engine, logged: Option<EngineLog>) -> Option<String> {
    let logged = logged?;
    match (engine, logged.max_concurrency, logged.max_model_len) {
        (Engine::Vllm, Some(concurrency), Some(length)) => Some(format!(
            "  engine log     \"GPU KV cache size: {} tokens\", \"Maximum concurrency for {} tokens per request: {concurrency:.2}x\"",
            count(logged.kv_cache_tokens),
            count(length)
        )),
        _ => None,
    }
}

/// How a model with sliding-window layers is pooled.
fn hybrid_line(device: &Device) -> Option<String> {
    Some(match device.hybrid? {
        Hybrid::Vllm {
            full_groups,
            window_groups,
            state_groups,
            state_blocks,
            group_size,
            window,
            blocks,
            blocks_per_request,
            ..
        } => {
            let mut kinds = vec![format!("{full_groups} full")];
            if let Some(window) = window {
                kinds.push(format!(
                    "{window_groups} sliding-window (window {})",
                    count(window)
                ));
            }
            if state_groups > 0 {
                // Per request: vLLM's mamba cache mode (`none` one block,
                // `align` 2 or 3, `all` one per block of tokens).
                let held = match state_blocks {
                    Some(1) => "one block a request".to_string(),
                    Some(blocks) => format!("{blocks} blocks a request"),
                    None => "a block per block of tokens".to_string(),
                };
                kinds.push(format!(
                    "{state_groups} linear-attention or Mamba state ({held})"
                ));
            }
            format!(
                "  KV groups      {} of {group_size} layers each, sharing {} blocks of {} tokens; one request of the full length takes {} blocks",
                kinds.join(" + "),
                count(blocks),
                device.page_size,
                count(blocks_per_request)
            )
        }
        Hybrid::Sglang {
            full_tokens,
            window_tokens,
            window,
            ratio,
        } => format!(
            "  SWA pools      full_layer_tokens={full_tokens}, swa_layer_tokens={window_tokens} (--swa-full-tokens-ratio {ratio}, window {})",
            count(window)
        ),
        Hybrid::SglangState {
            full_tokens,
            state_slots,
            state_bytes_per_request,
            state_request_cap,
        } => format!(
            "  state slots    {} full-attention tokens beside max_mamba_cache_size={state_slots} request states of {} each, which cap the running requests at {}",
            count(full_tokens),
            Bytes(state_bytes_per_request),
            count(state_request_cap)
        ),
    })
}

fn cap_text(cap: Cap) -> &'static str {
    match cap {
        Cap::Pool => "the KV pool",
        Cap::FullPool => "the full-attention pool",
        Cap::WindowPool => "the sliding-window pool",
        Cap::StateSlots => "the linear-attention or Mamba state slots",
        Cap::RunningRequests => "the running-request limit",
    }
}

fn pool_line(label: &str, device: &Device, launch: &Launch) -> String {
    if !super::fit::starts(device) {
        return format!(
            "  {label:<14} no pool: {} ({} bytes per token, page {})",
            start_text(&device.start),
            count(device.bytes_per_token),
            device.page_size
        );
    }
    format!(
        "  {label:<14} {} tokens per rank × {}, {} bytes per token, {} of KV per rank, page {}: {}",
        count(device.tokens_per_rank),
        pools_text(device.ranks, launch),
        count(device.bytes_per_token),
        gib(device.kv_bytes_per_rank),
        device.page_size,
        start_text(&device.start)
    )
}

/// What the pools of a device are, counted, so that "per rank × 1" is
/// not read as one GPU: `1 pool of 8 TP ranks (each holds every token of
/// its pool)`, `8 DP-attention pools`, `2 data-parallel pools of 4 TP
/// ranks (…)`.
fn pools_text(pools: u32, launch: &Launch) -> String {
    let what = if launch.dp_attention && launch.engine == Engine::Sglang {
        "DP-attention pool"
    } else if pools > 1 {
        "data-parallel pool"
    } else {
        "pool"
    };
    let plural = if pools == 1 { "" } else { "s" };
    let ranks = launch.attention_tp();
    if ranks > 1 {
        format!("{pools} {what}{plural} of {ranks} TP ranks (each holds every token of its pool)")
    } else {
        format!("{pools} {what}{plural}")
    }
}

fn concurrency_line(outcome: &Outcome) -> String {
    match (outcome.request_tokens, outcome.averages) {
        (Some(tokens), Some((prompt, output))) => format!(
            "  concurrency    {} requests at once of {} tokens (prompt {} + output {}), bound by {}{}; at most {} running per rank",
            concurrency_text(outcome.concurrency(&outcome.now)),
            count(tokens),
            count(prompt),
            count(output),
            cap_text(engine::requests_at_once(&outcome.now, tokens).1),
            if outcome.clean != outcome.now {
                format!(
                    ", {} on clean GPUs",
                    concurrency_text(outcome.concurrency(&outcome.clean))
                )
            } else {
                String::new()
            },
            count(outcome.now.max_running_requests)
        ),
        (Some(tokens), None) => format!(
            "  concurrency    {} requests at once at the full context length ({} tokens); give --avg-prompt and --avg-output for real requests",
            concurrency_text(outcome.concurrency(&outcome.now)),
            count(tokens)
        ),
        (None, _) => "  concurrency    unknown: give --avg-prompt and --avg-output".to_string(),
    }
}

/// What others hold on the engine's GPUs, and the commands that give it
/// back; nothing for a hypothetical box.
fn holders_section(outcome: &Outcome) -> Vec<String> {
    if outcome.hypothetical.is_some() {
        return Vec::new();
    }
    if outcome.free_source == Source::Flag {
        return vec![
            "Held by others on the engine's GPUs: not looked at (--gpu-free says what the engine finds free)"
                .to_string(),
        ];
    }
    if outcome.holders.is_empty() {
        return vec!["Held by others on the engine's GPUs: nothing".to_string()];
    }
    let sglang = outcome.launch.engine == Engine::Sglang;
    let mut lines = vec!["Held by others on the engine's GPUs".to_string()];
    for holder in &outcome.holders {
        let mut line = format!("  {}", holder_text(holder, sglang));
        if matches!(holder.cost, Cost::Tokens { .. }) && outcome.negligible(holder) {
            line.push_str(&format!(
                " (at most {:.0}% of the pool: reported, it does not change the verdict)",
                NEGLIGIBLE_SHARE * 100.0
            ));
        }
        lines.push(line);
    }
    if let Some(command) = &outcome.free_command {
        lines.push(format!("  free them:  {command}"));
    }
    if let Some(command) = &outcome.reset_command {
        lines.push(format!(
            "  reset:      {command}   (memory held by no process; only a reset or a reboot clears it)"
        ));
    }
    lines
}

/// The host-memory tier, when the command enables one.
fn host_tier_section(outcome: &Outcome) -> Vec<String> {
    let Some(tier) = &outcome.host_tier else {
        return Vec::new();
    };
    let what = match outcome.launch.host_tier {
        Some(HostTierRequest::SglangRatio(ratio)) => {
            format!("SGLang HiCache, --hicache-ratio {ratio}")
        }
        Some(HostTierRequest::SglangDefaultRatio)
            if outcome.launch.rules.sglang_hicache_auto_size() =>
        {
            format!(
                "SGLang HiCache, the ratio {} lowered to fit {} of this host's memory per rank",
                engine::SGLANG_HICACHE_RATIO,
                engine::SGLANG_HICACHE_HOST_MEMORY_FRACTION
            )
        }
        Some(HostTierRequest::SglangDefaultRatio) => {
            format!(
                "SGLang HiCache, the default --hicache-ratio {}",
                engine::SGLANG_HICACHE_RATIO
            )
        }
        Some(HostTierRequest::SglangSizeGb(gb)) => {
            format!("SGLang HiCache, --hicache-size {gb} (decimal GB per rank)")
        }
        Some(HostTierRequest::VllmOffloadGib(gib)) => {
            format!("vLLM --kv-offloading-size {gib} (GiB, over all TP ranks)")
        }
        None => "host tier".to_string(),
    };
    let mut lines = vec![
        format!("Host tier ({what})"),
        format!(
            "  {} tokens per rank, {} per rank, {} in all",
            count(tier.tokens_per_rank),
            Bytes(tier.bytes_per_rank),
            Bytes(tier.bytes_total)
        ),
    ];
    if let Some((bytes, from)) = outcome.host_memory {
        lines.push(format!(
            "  host memory {} ({}), budget {} after the engine's 10 GiB guard: {}",
            Bytes(bytes),
            source(from),
            Bytes(tier.budget),
            if tier.fits {
                "fits"
            } else {
                "DOES NOT FIT: the engine refuses, or the host runs out of memory"
            }
        ));
    }
    if outcome.launch.engine == Engine::Sglang
        && !tier.larger_than_device
        && !outcome
            .launch
            .rules
            .sglang_host_smaller_than_device_refused()
    {
        lines.push(format!(
            "  the host pool holds no more than the device pool's {} tokens per rank: SGLang {} starts, warning that the host tier helps less",
            count(outcome.clean.tokens_per_rank),
            outcome.launch.rules.version()
        ));
    } else if outcome.launch.engine == Engine::Sglang && !tier.larger_than_device {
        lines.push(format!(
            "  SGLang does not start: the host pool must hold more than the device pool's {} tokens per rank (\"The host memory should be larger than the device memory\")",
            count(outcome.clean.tokens_per_rank)
        ));
    }
    lines.push(
        "  it raises prefix-cache capacity, not concurrency: the running requests' KV must be on the GPU".to_string(),
    );
    lines
}

fn levers_section(outcome: &Outcome) -> Vec<String> {
    if outcome.levers.is_empty() {
        return Vec::new();
    }
    let mut lines = vec![match outcome.freeing() {
        None => "Levers".to_string(),
        Some(Freeing::Reset) => "Levers (each after the reset)".to_string(),
        Some(_) => "Levers (each after freeing the holders)".to_string(),
    }];
    lines.extend(
        outcome
            .levers
            .iter()
            .map(|lever| format!("  {}", lever_text(lever))),
    );
    lines
}

/// What `--from-log` measured, and the tokens the rule predicts from it
/// against the tokens the engine logged.
fn calibration_section(outcome: &Outcome) -> Vec<String> {
    let Some(calibration) = &outcome.calibration else {
        return Vec::new();
    };
    let logged = calibration.logged;
    let figures = [
        logged
            .free_before_load
            .map(|bytes| format!("free before load {}", gib(bytes))),
        logged
            .weights_per_gpu
            .map(|bytes| format!("weights {}", gib(bytes))),
        logged.kv_bytes.map(|bytes| format!("KV {}", gib(bytes))),
    ];
    let figures: Vec<String> = figures.into_iter().flatten().collect();
    let mut lines = vec![format!(
        "From the log: {}",
        if figures.is_empty() {
            "no figure found (the lines docs/plan.md names)".to_string()
        } else {
            figures.join(", ")
        }
    )];
    match (logged.tokens, calibration.predicted_tokens) {
        (Some(logged), Some(predicted)) => {
            let difference = (predicted as f64 - logged as f64) / (logged.max(1) as f64) * 100.0;
            lines.push(format!(
                "  predicted {} tokens from the logged figures, logged {} ({difference:+.2}%)",
                count(predicted),
                count(logged)
            ));
        }
        (Some(logged), None) => lines.push(format!(
            "  logged {} tokens (the log lacks the figures to predict them)",
            count(logged)
        )),
        _ => {}
    }
    lines.extend(
        missing_figures(&outcome.launch, &logged)
            .into_iter()
            .map(|missing| format!("  missing: {missing}")),
    );
    lines
}

/// The figures `--from-log` reads that the log lacks, each with what the
/// plan takes instead and so what it cannot check, and at another TP what
/// the log cannot carry there.
fn missing_figures(
    launch: &super::launch::Launch,
    logged: &super::calibrate::Logged,
) -> Vec<&'static str> {
    let engine = launch.engine;
    let mut missing = Vec::new();
    match engine {
        Engine::Sglang => {
            if logged.free_before_load.is_none() {
                missing.push("\"Load weight begin. avail mem\": the free memory at start is this plan's, not the start's, and the prediction is not checked");
            }
            if logged.weights_per_gpu.is_none() {
                missing.push("\"Load weight end. … mem usage\": the weights are not W' as measured (the estimate, or --weights)");
            }
        }
        Engine::Vllm => {
            if logged.weights_per_gpu.is_none() {
                missing.push("\"Model loading took\": the weights are not the start's (the estimate, or --weights)");
            }
            if logged.kv_bytes.is_none() {
                missing.push("\"Available KV cache memory\": the activation peak and CUDA graphs stay the estimates, and the prediction is not checked");
            } else if logged.requested.is_none() && logged.utilization.is_none() {
                missing.push("\"Desired GPU memory utilization\" and the utilization in \"non-default args\": the start is taken to have run at the command's utilization on a GPU of this size; a log of another is off by the difference");
            }
            if logged.kv_bytes.is_some() && logged.run.batched_tokens.is_none() {
                missing.push("\"Chunked prefill is enabled with max_num_batched_tokens\": the start is taken to have run at the command's batch limit; its activation peak is not moved to another");
            }
            if logged.kv_bytes.is_some() && !logged.run.args {
                missing.push("\"non-default args\": the start is taken to have run with the command's --max-num-seqs, --enforce-eager and TP; its activation peak and CUDA-graph estimate are not moved to others");
            }
            let tp = u64::from(launch.tp.max(1));
            if logged.kv_bytes.is_some() && logged.run.tp_or(tp) != tp {
                missing.push(if logged.weights_per_gpu.is_some() {
                    "the non-torch memory at the command's TP: the log's, of another TP, is kept (NCCL's and the custom all-reduce's buffers are not foretold); its weights are split by the TPs' ratio and its activation peak and CUDA-graph estimate moved by the estimates'"
                } else {
                    "\"Model loading took\" at another TP: the non-KV memory cannot be carried to the command's TP without the weights, and the estimates are used"
                });
            }
        }
    }
    if logged.tokens.is_none() {
        missing.push(match engine {
            Engine::Sglang => {
                "\"KV Cache is allocated. #tokens\": nothing to check the prediction against"
            }
            Engine::Vllm => "\"GPU KV cache size\": nothing to check the prediction against",
        });
    }
    missing
}

/// The engine's flags plan does not model: each may change the pool, and
/// is written out cut to 200 characters (as errors quote anyone's text).
fn ignored_section(outcome: &Outcome) -> Vec<String> {
    let launch = &outcome.launch;
    if launch.ignored.is_empty() {
        return Vec::new();
    }
    let ignored: Vec<String> = launch
        .ignored
        .iter()
        .map(|flag| crate::units::short(flag, 200))
        .collect();
    vec![format!(
        "Not modelled (they may change the pool: the plan is as without them; docs/plan.md lists what is read): {}",
        ignored.join(" ")
    )]
}

fn holder_text(holder: &Holder, sglang: bool) -> String {
    let who = match holder.pid {
        Some(pid) => format!("PID {pid} {}", crate::units::short(&holder.name, 50)),
        None if holder.unseen => format!("memory {}", holder.name),
        None => "memory held by no process (driver-held)".to_string(),
    };
    let bytes = crate::units::MaybeBytes(holder.bytes);
    let cost = match holder.cost {
        Cost::Tokens { per_rank } => format!(
            "costs every rank {} tokens{}",
            count(per_rank),
            if sglang {
                " (the MIN rule: the dirtiest GPU sets every rank's pool)"
            } else {
                ""
            }
        ),
        Cost::RefusesStart => {
            if sglang {
                "with it there the engine does not start (\"Not enough memory\")".to_string()
            } else {
                "with it there vLLM would refuse to start (free < utilization × total)".to_string()
            }
        }
        Cost::Unknown => {
            "costs what the driver does not say (no memory figure for it; the pool now counts it)"
                .to_string()
        }
        Cost::Nothing => {
            if sglang {
                "costs nothing".to_string()
            } else {
                "costs nothing: it fits in the 1 − utilization margin".to_string()
            }
        }
    };
    format!("GPU {}: {who}, {bytes}: {cost}", holder.gpu)
}

fn lever_text(lever: &Lever) -> String {
    format!(
        "{:<24} {:<44} {:>12} tokens/rank{}{}{}",
        lever.name,
        lever.how,
        count(lever.tokens_per_rank),
        lever
            .concurrency
            .map(|c| format!(", {c:.1} at once"))
            .unwrap_or_default(),
        if lever.starts { "" } else { ", does not start" },
        if lever.note.is_empty() {
            String::new()
        } else {
            format!(" ({})", lever.note)
        }
    )
}

fn demand_text(demand: &Demand) -> String {
    let mut text = match (demand.held, demand.queued) {
        (Some(held), Some(queued)) => format!(
            "Concurrency {}: the server holds {} at once, {} wait in the queue",
            count(demand.wanted),
            count(held),
            count(queued)
        ),
        _ => format!(
            "Concurrency {}: unknown without a request size (--avg-prompt, --avg-output)",
            count(demand.wanted)
        ),
    };
    if demand.held.is_some_and(|held| held >= demand.wanted) {
        text.push_str("\n  it holds them all");
    } else if demand.reached_by.is_empty() {
        text.push_str("\n  no lever on this hardware reaches it, alone or together");
        match demand.more_gpus_reach {
            Some(true) => {
                text.push_str("; twice the GPUs of this kind, with the levers above, would")
            }
            Some(false) => text.push_str("; not even twice the GPUs of this kind with every lever"),
            None => {}
        }
        if let Some(bytes) = demand.needs_gpu_memory {
            text.push_str(&format!(
                "\n  at this TP, KV dtype and fraction it needs GPUs of at least {} each",
                gib(bytes)
            ));
        }
    } else {
        let sets: Vec<String> = demand
            .reached_by
            .iter()
            .map(|set| set.join(" + "))
            .collect();
        text.push_str(&format!("\n  reached by: {}", sets.join("; ")));
    }
    text
}

#[derive(Serialize)]
struct PlanJson<'a> {
    schema_version: u32,
    kind: &'static str,
    engine: Engine,
    engine_version: VersionJson<'a>,
    model: ModelJson<'a>,
    launch: LaunchJson<'a>,
    budget: BudgetJson,
    device: DeviceJson<'a>,
    device_clean: DeviceJson<'a>,
    request_tokens: Option<u64>,
    host_tier: Option<HostTierJson>,
    fit: FitJson<'a>,
    levers: &'a [Lever],
    demand: Option<&'a Demand>,
    calibration: Option<CalibrationJson>,
    exit_code: crate::exit::Exit,
}

#[derive(Serialize)]
struct VersionJson<'a> {
    version: Option<&'a str>,
    source: &'static str,
    interpreter: Option<String>,
    metadata: Option<String>,
    why: Option<&'a str>,
    rules: &'static str,
    other_rules: bool,
}

fn version_json(version: &EngineVersion) -> VersionJson<'_> {
    let (source, interpreter, metadata, why) = match &version.found {
        Found::Metadata {
            interpreter,
            metadata,
            ..
        } => (
            "metadata",
            Some(interpreter.display().to_string()),
            Some(metadata.display().to_string()),
            None,
        ),
        Found::Flag { .. } => ("flag", None, None, None),
        Found::None { why } => ("none", None, None, Some(why.as_str())),
    };
    VersionJson {
        version: version.version(),
        source,
        interpreter,
        metadata,
        why,
        rules: version.rules.version(),
        other_rules: version.other_rules(),
    }
}

#[derive(Serialize)]
struct ModelJson<'a> {
    config_path: String,
    architecture: &'a str,
    attention: Attention,
    layers: u64,
    weights_bytes: Option<u64>,
}

#[derive(Serialize)]
struct LaunchJson<'a> {
    model: &'a str,
    tp: u32,
    pp: u32,
    dp: u32,
    dp_attention: bool,
    mem_fraction: Option<f64>,
    kv_dtype: KvDtype,
    gpus: &'a [u32],
    ignored: &'a [String],
}

#[derive(Serialize)]
struct BudgetJson {
    gpu_total: u64,
    free_at_start: u64,
    free_at_start_source: Source,
    weights_per_gpu: u64,
    weights_source: Source,
    kv_memory: Option<u64>,
}

#[derive(Serialize)]
struct DeviceJson<'a> {
    bytes_per_token: u64,
    kv_bytes_per_rank: u64,
    tokens_per_rank: u64,
    ranks: u32,
    page_size: u32,
    mem_fraction: f64,
    max_running_requests: u64,
    /// Requests at once at the averages; null without them.
    concurrency: Option<f64>,
    /// What bounds them; null without the averages.
    concurrency_cap: Option<Cap>,
    starts: bool,
    start: &'a Start,
    /// The engine's own pool figures, as it logs them; null when it would
    /// not start.
    engine_log: Option<EngineLog>,
    /// The pools of a model with sliding-window layers; null for one pool.
    hybrid: Option<Hybrid>,
}

#[derive(Serialize)]
struct HostTierJson {
    tokens_per_rank: u64,
    bytes_per_rank: u64,
    bytes_total: u64,
    budget: u64,
    fits: bool,
    host_memory: Option<u64>,
}

#[derive(Serialize)]
struct FitJson<'a> {
    verdict: Verdict,
    hypothetical: bool,
    gpus: Vec<GpuJson>,
    holders: Vec<HolderJson<'a>>,
    free_command: Option<&'a str>,
    reset_command: Option<&'a str>,
}

#[derive(Serialize)]
struct GpuJson {
    index: u32,
    memory_total: u64,
    memory_used: u64,
    memory_free: u64,
    memory_unattributed: Option<u64>,
    held_by_no_process: Option<bool>,
}

#[derive(Serialize)]
struct HolderJson<'a> {
    pid: Option<u32>,
    name: &'a str,
    gpu: u32,
    bytes: Option<u64>,
    /// Tokens every rank loses to it; null when it stops the start instead,
    /// or when its memory is unknown.
    tokens_lost_per_rank: Option<u64>,
    cost: Cost,
}

#[derive(Serialize)]
struct CalibrationJson {
    logged_tokens: Option<u64>,
    logged_weights_per_gpu: Option<u64>,
    logged_free_before_load: Option<u64>,
    logged_kv_bytes: Option<u64>,
    /// vLLM: the TP the logged start ran at (`tensor_parallel_size` of its
    /// `non-default args`); null when the log does not say.
    logged_tp: Option<u64>,
    predicted_tokens: Option<u64>,
    /// What the log lacks or cannot carry to the command, as the text's
    /// `missing:` lines.
    missing: Vec<&'static str>,
}

fn device_json<'a>(device: &'a Device, outcome: &Outcome) -> DeviceJson<'a> {
    DeviceJson {
        bytes_per_token: device.bytes_per_token,
        kv_bytes_per_rank: device.kv_bytes_per_rank,
        tokens_per_rank: device.tokens_per_rank,
        ranks: device.ranks,
        page_size: device.page_size,
        mem_fraction: device.mem_fraction,
        max_running_requests: device.max_running_requests,
        concurrency: outcome.averages.and_then(|_| outcome.concurrency(device)),
        concurrency_cap: outcome
            .averages
            .and(outcome.request_tokens)
            .map(|tokens| engine::requests_at_once(device, tokens).1),
        starts: super::fit::starts(device),
        start: &device.start,
        engine_log: device.logged,
        hybrid: device.hybrid,
    }
}

fn budget_json(budget: &Budget, outcome: &Outcome) -> BudgetJson {
    BudgetJson {
        gpu_total: budget.gpu_total,
        free_at_start: budget.free_at_start,
        free_at_start_source: outcome.free_source,
        weights_per_gpu: budget.weights_per_gpu,
        weights_source: outcome.weights_source,
        kv_memory: budget.kv_memory,
    }
}

/// The plan as a JSON document (docs/json.md, kind "plan").
pub fn json(outcome: &Outcome) -> String {
    let launch = &outcome.launch;
    let model = &outcome.model;
    report::to_json(&PlanJson {
        schema_version: SCHEMA_VERSION,
        kind: "plan",
        engine: launch.engine,
        engine_version: version_json(&outcome.engine_version),
        model: ModelJson {
            config_path: model.config_path.display().to_string(),
            architecture: &model.architecture,
            attention: model.attention,
            layers: model.layers,
            weights_bytes: model.weights_bytes,
        },
        launch: LaunchJson {
            model: &launch.model,
            tp: launch.tp,
            pp: launch.pp,
            dp: launch.dp,
            dp_attention: launch.dp_attention,
            mem_fraction: launch.mem_fraction,
            kv_dtype: launch.kv_dtype,
            gpus: &launch.gpus,
            ignored: &launch.ignored,
        },
        budget: budget_json(&outcome.budget, outcome),
        device: device_json(&outcome.now, outcome),
        device_clean: device_json(&outcome.clean, outcome),
        request_tokens: outcome.request_tokens,
        host_tier: outcome.host_tier.map(|tier| HostTierJson {
            tokens_per_rank: tier.tokens_per_rank,
            bytes_per_rank: tier.bytes_per_rank,
            bytes_total: tier.bytes_total,
            budget: tier.budget,
            fits: tier.fits,
            host_memory: outcome.host_memory.map(|(bytes, _)| bytes),
        }),
        fit: FitJson {
            verdict: outcome.verdict(),
            hypothetical: outcome.hypothetical.is_some(),
            gpus: outcome
                .gpus
                .iter()
                .map(|gpu| GpuJson {
                    index: gpu.index,
                    memory_total: gpu.total,
                    memory_used: gpu.used,
                    memory_free: gpu.free,
                    memory_unattributed: gpu.held_by_no_process.map(|held| held.bytes),
                    held_by_no_process: gpu.held_by_no_process.and_then(|held| held.verdict()),
                })
                .collect(),
            holders: outcome
                .holders
                .iter()
                .map(|holder| HolderJson {
                    pid: holder.pid,
                    name: &holder.name,
                    gpu: holder.gpu,
                    bytes: holder.bytes,
                    tokens_lost_per_rank: match holder.cost {
                        Cost::Tokens { per_rank } => Some(per_rank),
                        Cost::Nothing => Some(0),
                        Cost::RefusesStart | Cost::Unknown => None,
                    },
                    cost: holder.cost,
                })
                .collect(),
            free_command: outcome.free_command.as_deref(),
            reset_command: outcome.reset_command.as_deref(),
        },
        levers: &outcome.levers,
        demand: outcome.demand.as_ref(),
        calibration: outcome.calibration.map(|calibration| CalibrationJson {
            logged_tokens: calibration.logged.tokens,
            logged_weights_per_gpu: calibration.logged.weights_per_gpu,
            logged_free_before_load: calibration.logged.free_before_load,
            logged_kv_bytes: calibration.logged.kv_bytes,
            logged_tp: match outcome.launch.engine {
                Engine::Vllm if calibration.logged.run.args => {
                    Some(calibration.logged.run.tp_or(1))
                }
                _ => None,
            },
            predicted_tokens: calibration.predicted_tokens,
            missing: missing_figures(&outcome.launch, &calibration.logged),
        }),
        exit_code: outcome.exit(),
    })
}
