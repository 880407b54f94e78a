//! The user's own engine command line (what follows `--`), read the way the
//! engine's argument parser reads it: SGLang 0.5.9 (`server_args.py`,
//! argparse with prefix abbreviations, so `--tp` is `--tp-size`) and vLLM
//! 0.26.0 (`engine/arg_utils.py`, `FlexibleArgumentParser`: `_` and `-`
//! alike in names, the model as the first positional of `vllm serve`).
//!
//! Understood command forms: `python3 -m sglang.launch_server …`,
//! `sglang serve …`, `vllm serve MODEL …`,
//! `python3 -m vllm.entrypoints.openai.api_server --model MODEL …`; the
//! interpreter may be `python`, `python3`, `python3.X` or a path to one,
//! with its own options (`-u`, `-X opt`, …) before `-m`; `env [-i] [-u NAME]
//! A=B …` and bare `A=B` prefixes set the engine's environment; `uv run
//! [uv options] COMMAND` (`uv run -m MODULE` as `python -m MODULE`) runs
//! the command in uv's environment (`UvRun`, followed by `version::detect`).
//!
//! Understood flags (both `--flag value` and `--flag=value`):
//!
//! | flag (aliases) | engine | what it changes |
//! |---|---|---|
//! | `--model-path` (SGLang), `--model`, vLLM's first positional | both | the model |
//! | `--revision`, `--download-dir` | both | which config.json is read |
//! | `--tensor-parallel-size`; SGLang `--tp-size`, `--tp`; vLLM `-tp` | both | TP ranks: KV heads per rank, weights per GPU, GPUs |
//! | `--pipeline-parallel-size`; SGLang `--pp-size`; vLLM `-pp` | both | layers per rank, GPUs |
//! | `--data-parallel-size`; SGLang `--dp-size`, `--dp`; vLLM `-dp` | both | replicas / DP-attention ranks, GPUs |
//! | `--enable-dp-attention` | SGLang | attention TP = TP / DP, one pool per DP rank |
//! | `--decode-context-parallel-size`, `-dcp` | vLLM | KV sharded over DCP ranks |
//! | `--mem-fraction-static` / `--gpu-memory-utilization` | SGLang / vLLM | the budget fraction |
//! | `--kv-cache-dtype` | both | bytes per KV element |
//! | `--dtype` | both | the model dtype (KV bytes when the KV dtype is auto) |
//! | `--page-size`, `--block-size` | both | token rounding |
//! | `--attention-backend`, `--decode-attention-backend`, `--prefill-attention-backend` | both | the page/block size the backend forces |
//! | `--max-total-tokens` | SGLang | token cap |
//! | `--context-length`, `--max-model-len` | SGLang / vLLM | the request cap default, concurrency at full context |
//! | `--max-running-requests`, `--max-num-seqs` | SGLang / vLLM | request cap |
//! | `--kv-cache-memory-bytes` | vLLM | KV bytes, skipping the budget rule |
//! | `--chunked-prefill-size`, `--max-prefill-tokens`, `--cuda-graph-max-bs`, `--cuda-graph-bs` | SGLang | the default mem fraction |
//! | `--max-num-batched-tokens` | vLLM | the default max-num-seqs cap |
//! | `--speculative-algorithm` | SGLang | the default mem fraction (draft reservation) |
//! | `--enforce-eager` | vLLM | no CUDA-graph reservation |
//! | `--swa-full-tokens-ratio` | SGLang | the window pool's size beside the full pool |
//! | `--max-mamba-cache-size`, `--mamba-full-memory-ratio`, `--disable-radix-cache` | SGLang | the linear-attention and Mamba state slots beside the KV pool, and the request cap they set |
//! | `--disable-overlap-schedule` | SGLang | 0.5.23: the state slots a running request holds (the radix cache's strategy) |
//! | `--enable-prefix-caching`, `--no-enable-prefix-caching` | vLLM | a hybrid's mamba cache mode: its block size and the state blocks a request holds |
//! | `--mamba-cache-dtype`, `--mamba-ssm-cache-dtype`; `--mamba-ssm-dtype` | vLLM; SGLang | the linear-attention and Mamba state's dtypes |
//! | `--disable-hybrid-swa-memory`, `--disable-hybrid-kv-cache-manager` | SGLang / vLLM | sliding-window layers held as full attention |
//! | `--enable-hierarchical-cache`, `--hicache-ratio`, `--hicache-size` | SGLang | host tier |
//! | `--kv-offloading-size` | vLLM | host tier |
//! | `--num-gpu-blocks-override` | vLLM | the pool's blocks, exactly |
//! | `--cpu-offload-gb` | both | weights per GPU (that much kept in host memory) |
//! | `--base-gpu-id`, `--gpu-id-step` | SGLang | which GPUs |
//! | `--nnodes` | SGLang | how many of the ranks are on this host |
//! | `--device-ids` | vLLM | which GPUs |
//! | `CUDA_VISIBLE_DEVICES` (environment) | both | which GPUs |
//!
//! Flags that cannot change the answer (`--host`, `--port`,
//! `--served-model-name`, `--trust-remote-code`, logging, …) are accepted
//! silently; an understood flag of the other engine only (`SGLANG_ONLY`,
//! `VLLM_ONLY`) is refused as the engine's parser refuses it; any other
//! flag is listed in `Launch::ignored`: it may change the pool, and the
//! plan is as without it. The engines'
//! switches (flags that take no value) are known from their parsers, so a
//! switch never swallows the next token; an unknown flag takes the next
//! token as its value unless that token is itself a flag.

use super::PlanError;
use super::version::Rules;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Sglang,
    Vllm,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Sglang => "sglang",
            Engine::Vllm => "vllm",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvDtype {
    /// The model's dtype, or FP8 when the quant config quantizes the KV cache.
    Auto,
    Bf16,
    Fp16,
    Fp8E4m3,
    Fp8E5m2,
    /// SGLang `fp4_e2m1`, vLLM `nvfp4`: half a byte per element plus one
    /// scale byte per 16 elements (engine.rs).
    Fp4E2m1,
}

impl KvDtype {
    /// Bytes per element; `None` for `Auto` (the model decides). FP4 is
    /// stored in one-byte elements that each pack two values (torch's
    /// `float4_e2m1fn_x2`); engine.rs halves it and adds the scales.
    pub fn bytes(self) -> Option<u64> {
        match self {
            KvDtype::Auto => None,
            KvDtype::Bf16 | KvDtype::Fp16 => Some(2),
            KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 | KvDtype::Fp4E2m1 => Some(1),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::Auto => "auto",
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp16 => "fp16",
            KvDtype::Fp8E4m3 => "fp8_e4m3",
            KvDtype::Fp8E5m2 => "fp8_e5m2",
            KvDtype::Fp4E2m1 => "fp4_e2m1",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostTierRequest {
    /// SGLang `--hicache-ratio` (host pool = ratio × device pool, per rank).
    SglangRatio(f64),
    /// SGLang HiCache on with neither `--hicache-ratio` nor `--hicache-size`:
    /// the ratio 2.0, which 0.5.23 lowers until the host pools fit
    /// (`engine::host_tier`).
    SglangDefaultRatio,
    /// SGLang `--hicache-size` (decimal GB, per rank).
    SglangSizeGb(u64),
    /// vLLM `--kv-offloading-size` (GiB, total over the TP ranks).
    VllmOffloadGib(f64),
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Launch {
    pub engine: Engine,
    pub model: String,
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub dp_attention: bool,
    /// SGLang `--mem-fraction-static` / vLLM `--gpu-memory-utilization`.
    pub mem_fraction: Option<f64>,
    pub kv_dtype: KvDtype,
    /// SGLang `--page-size` / vLLM `--block-size`.
    pub page_size: Option<u32>,
    /// `--attention-backend` (vLLM also `VLLM_ATTENTION_BACKEND`).
    pub attention_backend: Option<String>,
    pub max_total_tokens: Option<u64>,
    /// SGLang `--context-length` / vLLM `--max-model-len` (`auto`: none).
    pub context_length: Option<u64>,
    /// SGLang `--max-running-requests` / vLLM `--max-num-seqs`.
    pub max_running_requests: Option<u64>,
    /// vLLM `--kv-cache-memory-bytes`.
    pub kv_cache_memory_bytes: Option<u64>,
    /// SGLang `--chunked-prefill-size` (0 when disabled with -1 or 0) /
    /// vLLM `--max-num-batched-tokens`.
    pub chunked_prefill_size: Option<u64>,
    /// SGLang `--cuda-graph-max-bs` (or the largest of `--cuda-graph-bs`).
    pub cuda_graph_max_bs: Option<u64>,
    pub host_tier: Option<HostTierRequest>,
    /// The physical GPU indices the engine will use, in rank order:
    /// CUDA_VISIBLE_DEVICES (or vLLM's `--device-ids`) applied to the
    /// engine's own GPU ids (SGLang: `--base-gpu-id`, `--gpu-id-step`).
    /// Empty when CUDA_VISIBLE_DEVICES names GPUs by UUID: see `gpu_uuids`.
    pub gpus: Vec<u32>,
    /// Flags not understood (listed in the output), as written.
    pub ignored: Vec<String>,
    /// SGLang `--decode-attention-backend`.
    pub decode_attention_backend: Option<String>,
    /// SGLang `--prefill-attention-backend`.
    pub prefill_attention_backend: Option<String>,
    /// vLLM `--decode-context-parallel-size` (1 when absent).
    pub dcp: u32,
    /// `--dtype` as bytes (None for `auto`).
    pub model_dtype_bytes: Option<u64>,
    /// SGLang `--max-prefill-tokens` (used in the default mem fraction when
    /// chunked prefill is off).
    pub max_prefill_tokens: Option<u64>,
    /// SGLang `--speculative-algorithm` (upper-cased).
    pub speculative_algorithm: Option<String>,
    /// vLLM `--enforce-eager`: no CUDA graphs, no graph reservation.
    pub enforce_eager: bool,
    /// SGLang `--nnodes` (1 when absent): the ranks are spread over that
    /// many hosts; `gpus` are this host's.
    pub nnodes: u32,
    /// vLLM `--max-model-len auto` (or -1): the length is fitted to the
    /// pool, so a pool smaller than one full-length request still starts.
    pub max_model_len_auto: bool,
    /// `--revision`: the Hugging Face revision (branch, tag or commit).
    pub revision: Option<String>,
    /// vLLM `--download-dir`: the cache directory the model is read from.
    pub download_dir: Option<String>,
    /// vLLM `--num-gpu-blocks-override`: the pool's blocks, whatever the
    /// memory would give (`kv_cache_utils.may_override_num_blocks`).
    pub num_gpu_blocks_override: Option<u64>,
    /// `--cpu-offload-gb` in bytes (GiB per GPU, both engines): weights
    /// the loader keeps in host memory, parameter by parameter until that
    /// much is moved (vLLM 0.26.0 `UVAOffloadConfig.cpu_offload_gb`,
    /// SGLang 0.5.9 `OffloaderV1`); 0 when absent.
    pub cpu_offload_bytes: u64,
    /// When CUDA_VISIBLE_DEVICES (or `--device-ids`) names GPUs by UUID
    /// (`GPU-…`, `MIG-…`, possibly a unique prefix as CUDA allows): the
    /// engine's GPUs in rank order, as written; the front resolves them
    /// against the snapshot. Empty otherwise.
    pub gpu_uuids: Vec<String>,
    /// The environment the engine would see (the caller's, with `env`
    /// and `A=B` prefixes applied).
    pub env: BTreeMap<String, String>,
    /// SGLang `--swa-full-tokens-ratio` (default 0.8).
    pub swa_full_tokens_ratio: Option<f64>,
    /// SGLang `--max-mamba-cache-size`.
    pub max_mamba_cache_size: Option<u64>,
    /// SGLang `--mamba-full-memory-ratio` (default 0.9).
    pub mamba_full_memory_ratio: Option<f64>,
    /// SGLang `--disable-radix-cache`.
    pub disable_radix_cache: bool,
    /// SGLang `--disable-overlap-schedule` (0.5.23: the mamba radix
    /// cache's strategy follows it).
    pub disable_overlap_schedule: bool,
    /// vLLM `--mamba-cache-dtype` (the conv state's bytes, and the
    /// temporal state's under `--mamba-ssm-cache-dtype auto`); `None`:
    /// `auto`, the model dtype.
    pub mamba_cache_dtype: Option<u64>,
    /// vLLM `--mamba-ssm-cache-dtype`, SGLang `--mamba-ssm-dtype`: the
    /// temporal (SSM) state's bytes; `None`: `auto` / the config's.
    pub mamba_ssm_dtype: Option<u64>,
    /// vLLM `--enable-prefix-caching` (`Some(true)`) or
    /// `--no-enable-prefix-caching` (`Some(false)`): a hybrid model's mamba
    /// cache mode follows it; `None`, the version's default.
    pub prefix_caching: Option<bool>,
    /// SGLang `--disable-hybrid-swa-memory` / vLLM
    /// `--disable-hybrid-kv-cache-manager`: sliding-window layers are held
    /// as full attention.
    pub disable_hybrid_kv: bool,
    /// SGLang `--disable-cuda-graph` / `--disable-prefill-cuda-graph`: no
    /// prefill (piecewise) CUDA graphs, unless `--cuda-graph-backend-prefill`
    /// names a backend (it wins whatever the order).
    #[serde(skip)]
    pub prefill_graph_switch_off: bool,
    /// SGLang 0.5.14 `--cuda-graph-backend-prefill` (`tc_piecewise`,
    /// `breakable`, `disabled`).
    #[serde(skip)]
    pub prefill_graph_backend: Option<String>,
    /// The command's first word after its environment: the interpreter
    /// (`python3`, `/venv/bin/python`) or the console script (`vllm`),
    /// as written; `version::detect` finds the engine's version from it.
    #[serde(skip)]
    pub program: String,
    /// `uv run`'s options when the command starts with it.
    #[serde(skip)]
    pub uv_run: Option<UvRun>,
    /// The engine version's rules plan applies (`version::Rules`): the
    /// default until `fit::evaluate` finds the version or is given one.
    #[serde(skip)]
    pub rules: Rules,
}

impl Launch {
    /// How many GPUs the engine uses on this host.
    pub fn gpu_count(&self) -> u32 {
        match self.engine {
            Engine::Sglang => {
                let (pp_here, tp_here) = self.sglang_per_node();
                let replicas = if self.dp_attention || self.nnodes > 1 {
                    1
                } else {
                    self.dp
                };
                pp_here * tp_here * replicas
            }
            Engine::Vllm => self.tp * self.pp * self.dp,
        }
    }

    /// SGLang 0.5.9 `engine.py` over `--nnodes`: (PP stages, TP ranks) on
    /// one node: `max(pp // nnodes, 1)` and `tp // max(nnodes // pp, 1)`.
    fn sglang_per_node(&self) -> (u32, u32) {
        let nnodes = self.nnodes.max(1);
        let pp_here = (self.pp / nnodes).max(1);
        let per_pp_rank = (nnodes / self.pp.max(1)).max(1);
        (pp_here, (self.tp / per_pp_rank).max(1))
    }

    /// The attention-TP size (SGLang `compute_dp_attention_world_info`:
    /// `tp / dp` with DP attention, else `tp`).
    pub(crate) fn attention_tp(&self) -> u32 {
        if self.dp_attention && self.engine == Engine::Sglang {
            (self.tp / self.dp.max(1)).max(1)
        } else {
            self.tp
        }
    }
}

/// Reads an engine command line with its environment.
pub fn parse(argv: &[String], env: &BTreeMap<String, String>) -> Result<Launch, PlanError> {
    let mut env = env.clone();
    let (uv_run, command) = strip_uv(strip_env(argv, &mut env)?)?;
    let program = command.as_slice();
    let (engine, rest) = engine_of(program)?;
    let mut launch = Launch {
        engine,
        model: String::new(),
        tp: 1,
        pp: 1,
        dp: 1,
        dp_attention: false,
        mem_fraction: None,
        kv_dtype: KvDtype::Auto,
        page_size: None,
        attention_backend: None,
        max_total_tokens: None,
        context_length: None,
        max_running_requests: None,
        kv_cache_memory_bytes: None,
        chunked_prefill_size: None,
        cuda_graph_max_bs: None,
        host_tier: None,
        gpus: Vec::new(),
        ignored: Vec::new(),
        decode_attention_backend: None,
        prefill_attention_backend: None,
        dcp: 1,
        model_dtype_bytes: None,
        max_prefill_tokens: None,
        speculative_algorithm: None,
        enforce_eager: false,
        nnodes: 1,
        max_model_len_auto: false,
        revision: None,
        download_dir: None,
        gpu_uuids: Vec::new(),
        num_gpu_blocks_override: None,
        cpu_offload_bytes: 0,
        env: BTreeMap::new(),
        swa_full_tokens_ratio: None,
        max_mamba_cache_size: None,
        mamba_full_memory_ratio: None,
        disable_radix_cache: false,
        disable_overlap_schedule: false,
        prefix_caching: None,
        mamba_cache_dtype: None,
        mamba_ssm_dtype: None,
        disable_hybrid_kv: false,
        prefill_graph_switch_off: false,
        prefill_graph_backend: None,
        program: program.first().cloned().unwrap_or_default(),
        uv_run,
        rules: Rules::default_for(engine),
    };
    let mut state = Flags::default();
    read_flags(engine, rest, &mut launch, &mut state)?;
    if launch.model.is_empty() {
        return Err(PlanError::NoModel);
    }
    if engine == Engine::Vllm && launch.attention_backend.is_none() {
        launch.attention_backend = env.get("VLLM_ATTENTION_BACKEND").cloned();
    }
    launch.host_tier = match engine {
        Engine::Sglang if state.hierarchical_cache => Some(match state.hicache_size {
            Some(size) if size > 0 => HostTierRequest::SglangSizeGb(size),
            _ => state.hicache_ratio.map_or(
                HostTierRequest::SglangDefaultRatio,
                HostTierRequest::SglangRatio,
            ),
        }),
        Engine::Sglang => None,
        Engine::Vllm => state
            .offloading_gib
            .filter(|gib| *gib > 0.0)
            .map(HostTierRequest::VllmOffloadGib),
    };
    if launch.dp_attention && !launch.tp.is_multiple_of(launch.dp) {
        return Err(PlanError::BadValue {
            flag: "--dp-size".to_string(),
            value: launch.dp.to_string(),
            why: format!(
                "with --enable-dp-attention the DP size must divide the TP size ({})",
                launch.tp
            ),
        });
    }
    check_sizes(&launch, &state)?;
    assign_gpus(
        &mut launch,
        &env,
        state.base_gpu_id,
        state.gpu_id_step,
        state.device_ids,
    )?;
    launch.env = env;
    Ok(launch)
}

/// The most ranks (TP × PP × DP, over every node) a command may ask for:
/// far above any deployment, low enough that no product of them, nor a
/// GPU id made from them, overflows.
const MAX_RANKS: u32 = 1 << 16;

/// The parallel sizes and GPU ids a command asks for, within what a host
/// (`units::MAX_GPU_INDEX`) and a deployment can have: `--tp 99999`,
/// `--dp 4000000000` or `--base-gpu-id 4294967295` are refused here, before
/// any arithmetic or list is made from them.
fn check_sizes(launch: &Launch, state: &Flags) -> Result<(), PlanError> {
    let max_gpus = crate::units::MAX_GPU_INDEX + 1;
    let (tp, pp, dp) = (launch.tp, launch.pp, launch.dp);
    let sizes = || bad_sizes(format!("TP {tp} × PP {pp} × DP {dp}"));
    let ranks = u64::from(tp) * u64::from(pp) * u64::from(dp);
    if ranks > u64::from(MAX_RANKS) {
        return Err(sizes()(format!(
            "{ranks} ranks, more than the {MAX_RANKS} gpureap plans for"
        )));
    }
    if launch.nnodes > MAX_RANKS {
        return Err(bad(
            "--nnodes",
            &launch.nnodes.to_string(),
            &format!("more than the {MAX_RANKS} ranks gpureap plans for"),
        ));
    }
    if launch.gpu_count() > max_gpus {
        return Err(sizes()(format!(
            "the engine would use {} GPUs on this host; a host has at most {max_gpus}",
            launch.gpu_count()
        )));
    }
    if launch.dcp > tp || !tp.is_multiple_of(launch.dcp) {
        return Err(bad(
            "--decode-context-parallel-size",
            &launch.dcp.to_string(),
            &format!(
                "the KV is sharded over DCP ranks inside the TP group: DCP must divide TP ({tp})"
            ),
        ));
    }
    if state.base_gpu_id > crate::units::MAX_GPU_INDEX {
        return Err(bad(
            "--base-gpu-id",
            &state.base_gpu_id.to_string(),
            &format!("not a GPU index (0 to {})", crate::units::MAX_GPU_INDEX),
        ));
    }
    if let Some(step) = state.gpu_id_step.filter(|step| *step > max_gpus) {
        return Err(bad(
            "--gpu-id-step",
            &step.to_string(),
            &format!("more than the {max_gpus} GPUs a host has"),
        ));
    }
    check_amounts(launch, state)
}

/// The largest page or block size taken (the engines' are at most 256).
const MAX_PAGE: u32 = 1 << 16;
/// The longest context taken, as in a config (model::NUMBERS).
const MAX_CONTEXT: u64 = 1 << 40;
/// The largest host tier taken: GB per rank (SGLang) or GiB (vLLM).
const MAX_HOST_TIER: f64 = (1u64 << 30) as f64;

/// Token and memory amounts within what any host has, so that the pool's
/// and the host tier's arithmetic stays in range: `--page-size 4294967295`,
/// `--max-model-len 18446744073709551615`, `--hicache-ratio 1e308`,
/// `--kv-offloading-size inf` are refused by name.
fn check_amounts(launch: &Launch, state: &Flags) -> Result<(), PlanError> {
    if let Some(page) = launch.page_size.filter(|page| *page > MAX_PAGE) {
        return Err(bad(
            "--page-size/--block-size",
            &page.to_string(),
            &format!("more than {MAX_PAGE} tokens a page"),
        ));
    }
    if let Some(context) = launch.context_length.filter(|length| *length > MAX_CONTEXT) {
        return Err(bad(
            "--context-length/--max-model-len",
            &context.to_string(),
            &format!("more than {MAX_CONTEXT} tokens"),
        ));
    }
    let host_tier = [
        (
            "--hicache-ratio",
            state.hicache_ratio.map(|ratio| (ratio, ratio.to_string())),
        ),
        (
            "--hicache-size",
            state.hicache_size.map(|gb| (gb as f64, gb.to_string())),
        ),
        (
            "--kv-offloading-size",
            state.offloading_gib.map(|gib| (gib, gib.to_string())),
        ),
    ];
    for (flag, amount) in host_tier {
        // NaN and infinity are refused too.
        let in_range = |amount: f64| amount.is_finite() && amount <= MAX_HOST_TIER;
        if let Some((_, text)) = amount.filter(|(amount, _)| !in_range(*amount)) {
            return Err(bad(
                flag,
                &crate::units::short(&text, 40),
                &format!("not a number up to {MAX_HOST_TIER}"),
            ));
        }
    }
    Ok(())
}

/// The error for parallel sizes that are too large together.
fn bad_sizes(value: String) -> impl Fn(String) -> PlanError {
    move |why| bad("--tp-size/--pp-size/--dp-size", &value, &why)
}

/// What the flags set that `Launch` keeps in another shape.
#[derive(Default)]
struct Flags {
    hierarchical_cache: bool,
    hicache_ratio: Option<f64>,
    hicache_size: Option<u64>,
    offloading_gib: Option<f64>,
    base_gpu_id: u32,
    gpu_id_step: Option<u32>,
    device_ids: Option<Vec<String>>,
}

/// `env [-i] [-u NAME] A=B … cmd` and `A=B … cmd`: the variables set, the
/// command left.
fn strip_env<'a>(
    argv: &'a [String],
    env: &mut BTreeMap<String, String>,
) -> Result<&'a [String], PlanError> {
    let mut rest = argv;
    loop {
        let Some(first) = rest.first() else {
            return Err(PlanError::UnknownEngine(String::new()));
        };
        if basename(first) == "env" {
            rest = &rest[1..];
            while let Some(option) = rest.first() {
                match option.as_str() {
                    "-i" | "--ignore-environment" | "-" => {
                        env.clear();
                        rest = &rest[1..];
                    }
                    "-u" | "--unset" => {
                        if let Some(name) = rest.get(1) {
                            env.remove(name);
                        }
                        rest = rest.get(2..).unwrap_or_default();
                    }
                    "--" => {
                        rest = &rest[1..];
                        break;
                    }
                    other if other.starts_with("--unset=") => {
                        env.remove(&other["--unset=".len()..]);
                        rest = &rest[1..];
                    }
                    _ => break,
                }
            }
            continue;
        }
        match assignment(first) {
            Some((name, value)) => {
                env.insert(name.to_string(), value.to_string());
                rest = &rest[1..];
            }
            None => return Ok(rest),
        }
    }
}

/// `uv run`'s options that choose the environment the command runs in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UvRun {
    /// `--project DIR`: where the project is looked for.
    pub project: Option<String>,
    /// `--directory DIR`: the working directory uv changes to first.
    pub directory: Option<String>,
    /// `--active`: the active virtual environment (`VIRTUAL_ENV`) first.
    pub active: bool,
    /// `--no-sync`: the environment as it is, not first synced to `uv.lock`.
    pub no_sync: bool,
    /// The first option that makes the environment one uv builds at the
    /// start (`--with vllm==0.33.0`, `--isolated`, `--no-project`), as
    /// written.
    pub ephemeral: Option<String>,
}

/// `uv run` options (uv's own and its global ones) that take a value: any
/// other option is a switch.
const UV_VALUED: &[&str] = &[
    "--allow-insecure-host",
    "--cache-dir",
    "--color",
    "--config-file",
    "--config-setting",
    "--config-settings-package",
    "--default-index",
    "--directory",
    "--env-file",
    "--exclude-newer",
    "--exclude-newer-package",
    "--extra",
    "--extra-index-url",
    "--find-links",
    "--fork-strategy",
    "--group",
    "--index",
    "--index-strategy",
    "--index-url",
    "--keyring-provider",
    "--link-mode",
    "--no-binary-package",
    "--no-build-isolation-package",
    "--no-build-package",
    "--no-extra",
    "--no-group",
    "--only-group",
    "--package",
    "--prerelease",
    "--project",
    "--python",
    "--python-platform",
    "--python-preference",
    "--refresh-package",
    "--reinstall-package",
    "--resolution",
    "--upgrade-package",
    "--with",
    "--with-editable",
    "--with-requirements",
    "-C",
    "-P",
    "-f",
    "-i",
    "-p",
];

/// `uv run` options after which the command runs in an environment uv
/// builds at the start, whose packages no file tells beforehand.
const UV_EPHEMERAL: &[&str] = &[
    "--gui-script",
    "--isolated",
    "--no-project",
    "--script",
    "--with",
    "--with-editable",
    "--with-requirements",
    "-s",
];

/// `uv [options] run [options] COMMAND …`: uv's options, and the command it
/// runs (`-m MODULE …` as `python -m MODULE …`); any other command as it
/// is.
fn strip_uv(argv: &[String]) -> Result<(Option<UvRun>, Vec<String>), PlanError> {
    if argv.first().is_none_or(|first| basename(first) != "uv") {
        return Ok((None, argv.to_vec()));
    }
    let unknown =
        || PlanError::UnknownEngine(argv.iter().take(4).cloned().collect::<Vec<_>>().join(" "));
    let mut uv = UvRun::default();
    let (mut run, mut module) = (false, false);
    let mut index = 1;
    while let Some(word) = argv.get(index) {
        index += 1;
        if !run && word == "run" {
            run = true;
            continue;
        }
        if word == "--" || !word.starts_with('-') || word == "-" {
            index -= usize::from(word != "--");
            break;
        }
        let (name, inline) = match word.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (word.as_str(), None),
        };
        let value = match inline {
            None if UV_VALUED.contains(&name) => {
                index += 1;
                argv.get(index - 1).cloned()
            }
            value => value,
        };
        match name {
            "--project" => uv.project = value,
            "--directory" => uv.directory = value,
            "--active" => uv.active = true,
            "--no-sync" => uv.no_sync = true,
            "-m" | "--module" => module = true,
            ephemeral if UV_EPHEMERAL.contains(&ephemeral) && uv.ephemeral.is_none() => {
                uv.ephemeral = Some(match value {
                    Some(value) => format!("{name} {value}"),
                    None => name.to_string(),
                });
            }
            _ => {}
        }
    }
    let rest = argv.get(index..).unwrap_or_default();
    if !run || rest.is_empty() {
        return Err(unknown());
    }
    let command = if module {
        ["python".to_string(), "-m".to_string()]
            .into_iter()
            .chain(rest.iter().cloned())
            .collect()
    } else {
        rest.to_vec()
    };
    Ok((Some(uv), command))
}

/// `NAME=value` with a shell variable name.
fn assignment(word: &str) -> Option<(&str, &str)> {
    let (name, value) = word.split_once('=')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    let valid = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then_some((name, value))
}

fn basename(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

/// `python`, `python3`, `python3.11`, or a path to one.
pub(super) fn is_python(word: &str) -> bool {
    let name = basename(word);
    let Some(version) = name.strip_prefix("python") else {
        return false;
    };
    version.chars().all(|c| c.is_ascii_digit() || c == '.')
}

/// The engine, and the arguments its parser sees.
fn engine_of(argv: &[String]) -> Result<(Engine, &[String]), PlanError> {
    let unknown =
        || PlanError::UnknownEngine(argv.iter().take(4).cloned().collect::<Vec<_>>().join(" "));
    let first = argv.first().ok_or_else(unknown)?;
    if is_python(first) {
        // The interpreter's own options, up to `-m MODULE`.
        let mut index = 1;
        while let Some(word) = argv.get(index) {
            match word.as_str() {
                "-m" => {
                    let module = argv.get(index + 1).ok_or_else(unknown)?;
                    let rest = argv.get(index + 2..).unwrap_or_default();
                    return match module.as_str() {
                        "sglang.launch_server" => Ok((Engine::Sglang, rest)),
                        "vllm.entrypoints.openai.api_server" => Ok((Engine::Vllm, rest)),
                        "sglang.cli.main" | "sglang"
                            if rest.first().is_some_and(|w| w == "serve") =>
                        {
                            Ok((Engine::Sglang, &rest[1..]))
                        }
                        "vllm.entrypoints.cli.main" | "vllm"
                            if rest.first().is_some_and(|w| w == "serve") =>
                        {
                            Ok((Engine::Vllm, &rest[1..]))
                        }
                        _ => Err(unknown()),
                    };
                }
                // Options that take a value.
                "-X" | "-W" | "-Q" => index += 2,
                option if option.starts_with('-') => index += 1,
                _ => return Err(unknown()),
            }
        }
        return Err(unknown());
    }
    let serve = argv.get(1).is_some_and(|word| word == "serve");
    match basename(first) {
        "sglang" if serve => Ok((Engine::Sglang, &argv[2..])),
        "vllm" if serve => Ok((Engine::Vllm, &argv[2..])),
        _ => Err(unknown()),
    }
}

/// SGLang 0.5.9 switches (`action="store_true"` in `server_args.py`).
const SGLANG_SWITCHES: &[&str] = &[
    "--abort-on-priority-when-disabled",
    "--allow-auto-truncate",
    "--checkpoint-engine-wait-weights-before-ready",
    "--collect-tokens-histogram",
    "--constrained-json-disable-any-whitespace",
    "--delete-ckpt-after-loading",
    "--disable-chunked-prefix-cache",
    "--disable-cuda-graph",
    "--disable-cuda-graph-padding",
    "--disable-custom-all-reduce",
    "--disable-fast-image-processor",
    "--disable-flashinfer-autotune",
    "--disable-flashinfer-cutlass-moe-fp4-allgather",
    "--disable-hicache-numa-detect",
    "--disable-hybrid-swa-memory",
    "--disable-outlines-disk-cache",
    "--disable-overlap-schedule",
    "--disable-radix-cache",
    "--disable-shared-experts-fusion",
    "--disable-tokenizer-batch-decode",
    "--disaggregation-decode-enable-offload-kvcache",
    "--enable-attn-tp-input-scattered",
    "--enable-broadcast-mm-inputs-process",
    "--enable-cache-report",
    "--enable-cudagraph-gc",
    "--enable-custom-logit-processor",
    "--enable-deterministic-inference",
    "--enable-double-sparsity",
    "--enable-dp-attention",
    "--enable-dp-lm-head",
    "--enable-draft-weights-cpu-backup",
    "--enable-dynamic-batch-tokenizer",
    "--enable-dynamic-chunking",
    "--enable-eplb",
    "--enable-expert-distribution-metrics",
    "--enable-flashinfer-allreduce-fusion",
    "--enable-fp32-lm-head",
    "--enable-fused-qk-norm-rope",
    "--enable-hierarchical-cache",
    "--enable-layerwise-nvtx-marker",
    "--enable-lmcache",
    "--enable-lora",
    "--enable-lora-overlap-loading",
    "--enable-memory-saver",
    "--enable-metrics",
    "--enable-metrics-for-all-schedulers",
    "--enable-mixed-chunk",
    "--enable-mscclpp",
    "--enable-multi-layer-eagle",
    "--enable-multimodal",
    "--enable-nan-detection",
    "--enable-nccl-nvls",
    "--enable-nsa-prefill-context-parallel",
    "--enable-p2p-check",
    "--enable-pdmux",
    "--enable-piecewise-cuda-graph",
    "--enable-precise-embedding-interpolation",
    "--enable-prefill-delayer",
    "--enable-prefix-mm-cache",
    "--enable-priority-scheduling",
    "--enable-profile-cuda-graph",
    "--enable-request-time-stats-logging",
    "--enable-return-hidden-states",
    "--enable-return-routed-experts",
    "--enable-single-batch-overlap",
    "--enable-symm-mem",
    "--enable-tokenizer-batch-encode",
    "--enable-torch-compile",
    "--enable-torch-compile-debug-mode",
    "--enable-torch-symm-mem",
    "--enable-trace",
    "--enable-two-batch-overlap",
    "--enable-weights-cpu-backup",
    "--encoder-only",
    "--export-metrics-to-file",
    "--flashinfer-mla-disable-ragged",
    "--grpc-mode",
    "--is-embedding",
    "--keep-mm-feature-on-device",
    "--language-only",
    "--log-requests",
    "--mm-enable-dp-encoder",
    "--quantize-and-serve",
    "--remote-instance-weight-loader-start-seed-via-transfer-engine",
    "--schedule-low-priority-values-first",
    "--show-time-cost",
    "--skip-server-warmup",
    "--skip-tokenizer-init",
    "--sleep-on-idle",
    "--stream-output",
    "--triton-attention-reduce-in-fp32",
    "--trust-remote-code",
    "--weight-loader-disable-mmap",
];
/// vLLM 0.26.0 switches (boolean fields of `EngineArgs` and the
/// frontend; each also has a `--no-NAME` form).
const VLLM_SWITCHES: &[&str] = &[
    "--aggregate-engine-logging",
    "--allow-credentials",
    "--allow-deprecated-quantization",
    "--async-scheduling",
    "--calculate-kv-scales",
    "--cudagraph-metrics",
    "--data-parallel-external-lb",
    "--data-parallel-hybrid-lb",
    "--data-parallel-multi-port-external-lb",
    "--disable-cascade-attn",
    "--disable-chunked-mm-input",
    "--disable-custom-all-reduce",
    "--disable-fastapi-docs",
    "--disable-hybrid-kv-cache-manager",
    "--disable-log-stats",
    "--disable-nccl-for-dp-synchronization",
    "--disable-sliding-window",
    "--disable-uvicorn-access-log",
    "--enable-auto-tool-choice",
    "--enable-bf16x3-router-gemm",
    "--enable-chunked-prefill",
    "--enable-cumem-allocator",
    "--enable-dbo",
    "--enable-elastic-ep",
    "--enable-ep-weight-filter",
    "--enable-eplb",
    "--enable-expert-parallel",
    "--enable-flash-late-interaction",
    "--enable-flashinfer-autotune",
    "--enable-force-include-usage",
    "--enable-layerwise-nvtx-tracing",
    "--enable-log-deltas",
    "--enable-log-outputs",
    "--enable-log-requests",
    "--enable-logging-iteration-details",
    "--enable-lora",
    "--enable-mamba-cache-stochastic-rounding",
    "--enable-mfu-metrics",
    "--enable-mixed-moe-lora-format",
    "--enable-mm-embeds",
    "--enable-mm-processor-stats",
    "--enable-moe-shared-loras",
    "--enable-offline-docs",
    "--enable-per-request-metrics",
    "--enable-prefix-caching",
    "--enable-prompt-embeds",
    "--enable-prompt-tokens-details",
    "--enable-request-id-headers",
    "--enable-return-routed-experts",
    "--enable-server-load-tracking",
    "--enable-sleep-mode",
    "--enable-ssl-refresh",
    "--enable-tokenizer-info-endpoint",
    "--enable-tower-connector-lora",
    "--enforce-eager",
    "--exclude-tools-when-tool-choice-none",
    "--fail-on-environ-validation",
    "--fully-sharded-loras",
    "--grpc",
    "--headless",
    "--interleave-mm-strings",
    "--jit-monitor-verbose",
    "--kv-cache-metrics",
    "--kv-sharing-fast-prefill",
    "--language-model-only",
    "--log-error-stack",
    "--mm-encoder-only",
    "--numa-bind",
    "--ray-workers-use-nsight",
    "--return-tokens-as-token-ids",
    "--scheduler-reserve-full-isl",
    "--skip-mm-profiling",
    "--skip-tokenizer-init",
    "--specialize-active-lora",
    "--tokens-only",
    "--trust-remote-code",
    "--trust-request-chat-template",
    "--use-fp64-gumbel",
    "--use-tqdm-on-load",
    "-dpm",
];

/// Flags of SGLang 0.5.9 that take one or more values (`nargs='+'`/`'*'`).
const SGLANG_LISTS: &[&str] = &[
    "--bucket-e2e-request-latency",
    "--bucket-inter-token-latency",
    "--bucket-time-to-first-token",
    "--cuda-graph-bs",
    "--custom-weight-loader",
    "--debug-tensor-dump-layers",
    "--encoder-urls",
    "--generation-tokens-buckets",
    "--log-requests-target",
    "--lora-paths",
    "--lora-target-modules",
    "--numa-node",
    "--piecewise-cuda-graph-tokens",
    "--prefill-delayer-forward-passes-buckets",
    "--prefill-delayer-wait-seconds-buckets",
    "--prompt-tokens-buckets",
    "--tokenizer-metrics-allowed-custom-labels",
    "--uvicorn-access-log-exclude-prefixes",
];

/// Flags of vLLM 0.26.0 that take one or more values (list-typed fields).
const VLLM_LISTS: &[&str] = &[
    "--allowed-headers",
    "--allowed-media-domains",
    "--allowed-methods",
    "--allowed-origins",
    "--api-key",
    "--collect-detailed-traces",
    "--cpu-offload-params",
    "--cudagraph-capture-sizes",
    "--ignore-patterns",
    "--kv-cache-dtype-skip-layers",
    "--logits-processors",
    "--lora-modules",
    "--lora-target-modules",
    "--middleware",
    "--numa-bind-cpus",
    "--numa-bind-nodes",
    "--offload-params",
    "--served-model-name",
    "--type-hints",
];

/// Value flags that cannot change the answer: accepted without a mention.
const HARMLESS: &[&str] = &[
    "--host",
    "--port",
    "--served-model-name",
    "--api-key",
    "--admin-api-key",
    "--log-level",
    "--log-level-http",
    "--uvicorn-log-level",
    "--tokenizer",
    "--tokenizer-path",
    "--tokenizer-mode",
    "--chat-template",
    "--reasoning-parser",
    "--tool-call-parser",
    "--load-format",
    "--random-seed",
    "--seed",
    "--nccl-port",
    "--dist-init-addr",
    "--watchdog-timeout",
    "--dist-timeout",
    "--grammar-backend",
    "--sampling-backend",
    "--schedule-policy",
    "--stream-interval",
    "--decode-log-interval",
    "--crash-dump-folder",
    "--root-path",
    "--ssl-keyfile",
    "--ssl-certfile",
];

/// Understood flags: the canonical name for every alias.
const ALIASES: &[(&str, &str)] = &[
    ("--model-path", "model"),
    ("--model", "model"),
    ("--revision", "revision"),
    ("--download-dir", "download-dir"),
    ("--tp-size", "tp"),
    ("--tp", "tp"),
    ("--tensor-parallel-size", "tp"),
    ("-tp", "tp"),
    ("--pp-size", "pp"),
    ("--pipeline-parallel-size", "pp"),
    ("-pp", "pp"),
    ("--dp-size", "dp"),
    ("--dp", "dp"),
    ("--data-parallel-size", "dp"),
    ("-dp", "dp"),
    ("--decode-context-parallel-size", "dcp"),
    ("-dcp", "dcp"),
    ("--enable-dp-attention", "dp-attention"),
    ("--mem-fraction-static", "fraction"),
    ("--gpu-memory-utilization", "fraction"),
    ("--kv-cache-dtype", "kv-dtype"),
    ("--dtype", "dtype"),
    ("--page-size", "page"),
    ("--block-size", "page"),
    ("--attention-backend", "backend"),
    ("--decode-attention-backend", "decode-backend"),
    ("--prefill-attention-backend", "prefill-backend"),
    ("--max-total-tokens", "max-total-tokens"),
    ("--context-length", "context"),
    ("--max-model-len", "context"),
    ("--max-running-requests", "max-requests"),
    ("--max-num-seqs", "max-requests"),
    ("--kv-cache-memory-bytes", "kv-bytes"),
    ("--kv-cache-memory", "kv-bytes"),
    ("--chunked-prefill-size", "chunked"),
    ("--max-num-batched-tokens", "chunked"),
    ("--max-prefill-tokens", "max-prefill"),
    ("--cuda-graph-max-bs", "graph-bs"),
    ("--cuda-graph-bs", "graph-bs-list"),
    ("--speculative-algorithm", "speculative"),
    ("--enforce-eager", "eager"),
    ("--disable-cuda-graph", "no-prefill-graph"),
    ("--disable-prefill-cuda-graph", "no-prefill-graph"),
    ("--cuda-graph-backend-prefill", "prefill-graph-backend"),
    ("--swa-full-tokens-ratio", "swa-ratio"),
    ("--max-mamba-cache-size", "mamba-size"),
    ("--mamba-full-memory-ratio", "mamba-ratio"),
    ("--disable-radix-cache", "no-radix"),
    ("--disable-overlap-schedule", "no-overlap"),
    ("--enable-prefix-caching", "prefix-caching"),
    ("--mamba-cache-dtype", "mamba-dtype"),
    ("--mamba-ssm-cache-dtype", "mamba-ssm-dtype"),
    ("--mamba-ssm-dtype", "mamba-ssm-dtype"),
    ("--disable-hybrid-swa-memory", "no-hybrid-kv"),
    ("--disable-hybrid-kv-cache-manager", "no-hybrid-kv"),
    ("--enable-hierarchical-cache", "hicache"),
    ("--hicache-ratio", "hicache-ratio"),
    ("--hicache-size", "hicache-size"),
    ("--kv-offloading-size", "offload"),
    ("--base-gpu-id", "base-gpu-id"),
    ("--gpu-id-step", "gpu-id-step"),
    ("--device-ids", "device-ids"),
    ("--nnodes", "nnodes"),
    ("--num-gpu-blocks-override", "gpu-blocks"),
    ("--cpu-offload-gb", "cpu-offload"),
];

/// Understood flags of one engine only: the other's parser refuses them
/// ("unrecognized arguments"), so a plan of them is refused too. Read from
/// the parsers of SGLang 0.5.9 (`server_args.py`, whose argparse also takes
/// a unique prefix: `--tp` is `--tp-size`, while `-tp` is no flag of it)
/// and vLLM 0.26.0 (`engine/arg_utils.py`, `entrypoints/openai/cli_args.py`).
const SGLANG_ONLY: &[&str] = &[
    "--model-path",
    // vLLM has no flag `--tp` begins, and several `--dp` begins (`--dp-supervisor-…`).
    "--tp",
    "--dp",
    "--tp-size",
    "--pp-size",
    "--dp-size",
    "--enable-dp-attention",
    "--mem-fraction-static",
    "--page-size",
    "--decode-attention-backend",
    "--prefill-attention-backend",
    "--max-total-tokens",
    "--context-length",
    "--max-running-requests",
    "--chunked-prefill-size",
    "--max-prefill-tokens",
    "--cuda-graph-max-bs",
    "--cuda-graph-bs",
    "--speculative-algorithm",
    "--enable-hierarchical-cache",
    "--hicache-ratio",
    "--hicache-size",
    "--base-gpu-id",
    "--gpu-id-step",
    "--disable-overlap-schedule",
    "--mamba-ssm-dtype",
    // SGLang's CUDA-graph switches (vLLM's is --enforce-eager; 0.26.0's
    // parser has none of these, nor a flag they abbreviate).
    "--disable-cuda-graph",
    "--disable-prefill-cuda-graph",
    "--cuda-graph-backend-prefill",
];
const VLLM_ONLY: &[&str] = &[
    "-tp",
    "-pp",
    "-dp",
    "--decode-context-parallel-size",
    "-dcp",
    "--gpu-memory-utilization",
    "--block-size",
    "--max-model-len",
    "--max-num-seqs",
    "--kv-cache-memory-bytes",
    "--kv-cache-memory",
    "--max-num-batched-tokens",
    "--enforce-eager",
    "--kv-offloading-size",
    "--device-ids",
    "--num-gpu-blocks-override",
    "--enable-prefix-caching",
    "--mamba-cache-dtype",
    "--mamba-ssm-cache-dtype",
];

/// The most host memory a `--cpu-offload-gb` may name: 2^20 GiB.
const MAX_OFFLOAD_GIB: f64 = (1u64 << 20) as f64;

/// Canonical names that take no value.
const UNDERSTOOD_SWITCHES: &[&str] = &[
    "dp-attention",
    "eager",
    "hicache",
    "no-hybrid-kv",
    "no-radix",
    "no-overlap",
    "no-prefill-graph",
    "prefix-caching",
];

fn is_flag(word: &str) -> bool {
    word.starts_with('-') && word.len() > 1 && word.parse::<f64>().is_err()
}

/// The name a flag has for the engine: vLLM treats `_` as `-` in long
/// names; SGLang's argparse accepts a unique prefix of a long name, which
/// is resolved here against the understood flags.
fn canonical(engine: Engine, name: &str) -> String {
    let name = match engine {
        Engine::Vllm if name.starts_with("--") => name.replace('_', "-"),
        _ => name.to_string(),
    };
    if ALIASES.iter().any(|(alias, _)| *alias == name) {
        return name;
    }
    if engine == Engine::Sglang && name.starts_with("--") && name.len() > 3 {
        let known = ALIASES
            .iter()
            .map(|(alias, _)| *alias)
            .filter(|alias| !VLLM_ONLY.contains(alias))
            .chain(SGLANG_SWITCHES.iter().copied())
            .chain(SGLANG_LISTS.iter().copied())
            .chain(HARMLESS.iter().copied())
            .filter(|long| long.starts_with(name.as_str()))
            .collect::<Vec<_>>();
        if let [only] = known.as_slice() {
            return only.to_string();
        }
    }
    name
}

fn is_switch(engine: Engine, name: &str) -> bool {
    match engine {
        Engine::Sglang => SGLANG_SWITCHES.contains(&name),
        Engine::Vllm => {
            VLLM_SWITCHES.contains(&name)
                || name
                    .strip_prefix("--no-")
                    .is_some_and(|rest| VLLM_SWITCHES.contains(&format!("--{rest}").as_str()))
        }
    }
}

fn is_list(engine: Engine, name: &str) -> bool {
    match engine {
        Engine::Sglang => SGLANG_LISTS.contains(&name),
        Engine::Vllm => VLLM_LISTS.contains(&name),
    }
}

fn read_flags(
    engine: Engine,
    argv: &[String],
    launch: &mut Launch,
    state: &mut Flags,
) -> Result<(), PlanError> {
    let mut index = 0;
    let mut positional_only = false;
    while let Some(word) = argv.get(index) {
        index += 1;
        if positional_only || !is_flag(word) {
            positional(engine, word, launch);
            continue;
        }
        if word == "--" {
            positional_only = true;
            continue;
        }
        // vLLM's `-O3` / `-O=3` (the optimization level) is one token.
        if engine == Engine::Vllm && word.starts_with("-O") && word.len() > 2 {
            launch.ignored.push(word.clone());
            continue;
        }
        let (written, inline) = match word.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (word.as_str(), None),
        };
        let name = canonical(engine, written);
        if name == "--config" {
            // Both engines merge a YAML file of flags: its flags would
            // change the answer and plan does not read it.
            return Err(bad(
                written,
                inline
                    .as_deref()
                    .or(argv.get(index).map(String::as_str))
                    .unwrap_or(""),
                "gpureap plan does not read engine config files: give the flags on the command line",
            ));
        }
        let foreign = match engine {
            Engine::Sglang => VLLM_ONLY.contains(&name.as_str()),
            Engine::Vllm => SGLANG_ONLY.contains(&name.as_str()),
        };
        if foreign {
            let (this, other) = match engine {
                Engine::Sglang => ("SGLang 0.5.9", "vLLM"),
                Engine::Vllm => ("vLLM 0.26.0", "SGLang"),
            };
            let value = inline
                .as_deref()
                .or(argv
                    .get(index)
                    .map(String::as_str)
                    .filter(|next| !is_flag(next)))
                .unwrap_or("");
            return Err(bad(
                written,
                value,
                &format!(
                    "not a flag of {this} (it is {other}'s): the engine refuses the command (\"unrecognized arguments\")"
                ),
            ));
        }
        let understood = ALIASES
            .iter()
            .find(|(alias, _)| *alias == name)
            .map(|(_, key)| *key);
        if let Some(key) = understood.filter(|key| UNDERSTOOD_SWITCHES.contains(key)) {
            understood_switch(key, written, inline, launch, state)?;
            continue;
        }
        if understood.is_none() && inline.is_none() && is_switch(engine, &name) {
            other_switch(&name, written, launch);
            continue;
        }
        let values = values_of(engine, &name, inline, argv, &mut index);
        match understood {
            Some(key) => set_values(engine, key, written, &values, launch, state)?,
            // HiCache's layout, transfer and storage options do not change
            // the host pool's size.
            None if HARMLESS.contains(&name.as_str()) || name.starts_with("--hicache-") => {}
            None => launch.ignored.push(match values.is_empty() {
                true => written.to_string(),
                false => format!("{written} {}", values.join(" ")),
            }),
        }
    }
    Ok(())
}

/// A switch `plan` reads (`UNDERSTOOD_SWITCHES`): one given a value is bad
/// input.
fn understood_switch(
    key: &str,
    written: &str,
    inline: Option<String>,
    launch: &mut Launch,
    state: &mut Flags,
) -> Result<(), PlanError> {
    if let Some(value) = inline {
        return Err(bad(written, &value, "this flag takes no value"));
    }
    match key {
        "dp-attention" => launch.dp_attention = true,
        "eager" => launch.enforce_eager = true,
        "no-hybrid-kv" => launch.disable_hybrid_kv = true,
        "no-radix" => launch.disable_radix_cache = true,
        "no-overlap" => launch.disable_overlap_schedule = true,
        "prefix-caching" => launch.prefix_caching = Some(true),
        "no-prefill-graph" => launch.prefill_graph_switch_off = true,
        _ => state.hierarchical_cache = true,
    }
    Ok(())
}

/// A switch of the engine's that `plan` does not read: `--no-enforce-eager`
/// undoes `--enforce-eager`; any other that could change the answer is
/// listed as ignored.
fn other_switch(name: &str, written: &str, launch: &mut Launch) {
    if name == "--no-enforce-eager" {
        launch.enforce_eager = false;
    } else if name == "--no-enable-prefix-caching" {
        launch.prefix_caching = Some(false);
    } else if !SGLANG_SWITCHES.contains(&name) && !VLLM_SWITCHES.contains(&name) {
        // A `--no-` form of a switch that is not understood.
        launch.ignored.push(written.to_string());
    } else if !is_harmless_switch(name) {
        launch.ignored.push(written.to_string());
    }
}

/// A flag's values: `--flag=value`, `--flag value`, or for a list flag
/// every value up to the next flag; `index` moves past those taken.
fn values_of(
    engine: Engine,
    name: &str,
    inline: Option<String>,
    argv: &[String],
    index: &mut usize,
) -> Vec<String> {
    let mut values = Vec::new();
    if let Some(value) = inline {
        values.push(value);
    } else if is_list(engine, name) {
        while let Some(next) = argv.get(*index).filter(|next| !is_flag(next)) {
            values.push(next.clone());
            *index += 1;
        }
    } else if let Some(next) = argv.get(*index).filter(|next| !is_flag(next)) {
        values.push(next.clone());
        *index += 1;
    }
    values
}

/// An understood flag's values, read: the last one counts (argparse), and
/// `--cuda-graph-bs` takes the largest of its list.
fn set_values(
    engine: Engine,
    key: &str,
    written: &str,
    values: &[String],
    launch: &mut Launch,
    state: &mut Flags,
) -> Result<(), PlanError> {
    let Some(value) = values.last() else {
        return Err(bad(written, "", "the flag needs a value"));
    };
    if key == "graph-bs-list" {
        let mut largest = 0;
        for value in values.iter().flat_map(|value| value.split(',')) {
            largest = largest.max(whole(written, value)?);
        }
        launch.cuda_graph_max_bs = Some(largest);
        Ok(())
    } else {
        set(engine, key, written, value, launch, state)
    }
}

/// Switches that cannot change the answer.
fn is_harmless_switch(name: &str) -> bool {
    [
        "--trust-remote-code",
        "--skip-server-warmup",
        "--enable-metrics",
        "--log-requests",
        "--disable-log-stats",
        "--disable-log-requests",
        "--enable-log-requests",
        "--enable-cache-report",
        "--show-time-cost",
        "--enable-auto-tool-choice",
        "--disable-uvicorn-access-log",
        "--disable-fastapi-docs",
        "--enable-request-id-headers",
        "--disable-radix-cache",
        "--disable-custom-all-reduce",
        "--enable-expert-parallel",
        "--enable-chunked-prefill",
        "--enable-mixed-chunk",
    ]
    .contains(&name)
}

fn positional(engine: Engine, word: &str, launch: &mut Launch) {
    // vLLM: `vllm serve MODEL`; `--model` wins when both are given (its
    // parser moves `--model` to the front).
    if engine == Engine::Vllm && launch.model.is_empty() {
        launch.model = word.to_string();
    } else {
        launch.ignored.push(word.to_string());
    }
}

fn bad(flag: &str, value: &str, why: &str) -> PlanError {
    PlanError::BadValue {
        flag: flag.to_string(),
        value: value.to_string(),
        why: why.to_string(),
    }
}

fn whole(flag: &str, value: &str) -> Result<u64, PlanError> {
    value
        .trim()
        .parse::<u64>()
        .map_err(|_| bad(flag, value, "not a whole number"))
}

fn positive(flag: &str, value: &str) -> Result<u32, PlanError> {
    match value.trim().parse::<u32>() {
        Ok(number) if number > 0 => Ok(number),
        _ => Err(bad(flag, value, "not a positive whole number")),
    }
}

fn fraction(flag: &str, value: &str) -> Result<f64, PlanError> {
    match value.trim().parse::<f64>() {
        Ok(number) if number > 0.0 && number <= 1.0 => Ok(number),
        _ => Err(bad(flag, value, "not a fraction in (0, 1]")),
    }
}

/// vLLM's `human_readable_int`: `25.6k` is 25,600 (k, m, g, t decimal),
/// `1K` is 1,024 (K, M, G, T binary, whole numbers only), else a plain
/// whole number.
fn human_int(flag: &str, value: &str) -> Result<u64, PlanError> {
    let value = value.trim();
    let Some(suffix) = value.chars().last() else {
        return Err(bad(flag, value, "empty"));
    };
    let number = &value[..value.len() - suffix.len_utf8()];
    let decimal = match suffix {
        'k' => Some(1e3),
        'm' => Some(1e6),
        'g' => Some(1e9),
        't' => Some(1e12),
        _ => None,
    };
    let binary = match suffix {
        'K' => Some(1u64 << 10),
        'M' => Some(1 << 20),
        'G' => Some(1 << 30),
        'T' => Some(1 << 40),
        _ => None,
    };
    let digits = |text: &str| {
        !text.is_empty()
            && text.chars().all(|c| c.is_ascii_digit() || c == '.')
            && text.matches('.').count() <= 1
            && !text.starts_with('.')
    };
    if let Some(multiplier) = decimal.filter(|_| digits(number)) {
        let parsed: f64 = number
            .parse()
            .map_err(|_| bad(flag, value, "not a number"))?;
        return Ok((parsed * multiplier) as u64);
    }
    if let Some(multiplier) = binary.filter(|_| digits(number)) {
        let parsed: u64 = number
            .parse()
            .map_err(|_| bad(flag, value, "decimals are not allowed with a binary suffix"))?;
        return parsed
            .checked_mul(multiplier)
            .ok_or_else(|| bad(flag, value, "too large"));
    }
    whole(flag, value)
}

fn kv_dtype(engine: Engine, flag: &str, value: &str) -> Result<KvDtype, PlanError> {
    let dtype = match (engine, value) {
        (_, "auto") => KvDtype::Auto,
        (Engine::Sglang, "bf16") | (_, "bfloat16") => KvDtype::Bf16,
        (Engine::Vllm, "float16") => KvDtype::Fp16,
        (_, "fp8_e4m3") | (Engine::Vllm, "fp8" | "fp8_inc") => KvDtype::Fp8E4m3,
        (_, "fp8_e5m2") => KvDtype::Fp8E5m2,
        (Engine::Sglang, "fp4_e2m1") | (Engine::Vllm, "nvfp4") => KvDtype::Fp4E2m1,
        (
            Engine::Vllm,
            "fp8_ds_mla" | "int4_per_token_head" | "int8_per_token_head" | "fp8_per_token_head",
        )
        | (
            Engine::Vllm,
            "turboquant_k8v4" | "turboquant_4bit_nc" | "turboquant_k3v4_nc" | "turboquant_3bit_nc",
        ) => {
            return Err(bad(
                flag,
                value,
                "this KV layout is not modelled by gpureap plan (use --kv-memory with a measured size)",
            ));
        }
        _ => {
            return Err(bad(
                flag,
                value,
                match engine {
                    Engine::Sglang => {
                        "SGLang accepts auto, fp8_e5m2, fp8_e4m3, bf16, bfloat16, fp4_e2m1"
                    }
                    Engine::Vllm => "not a vLLM KV cache dtype",
                },
            ));
        }
    };
    Ok(dtype)
}

fn model_dtype(flag: &str, value: &str) -> Result<Option<u64>, PlanError> {
    match value {
        "auto" => Ok(None),
        "half" | "float16" | "bfloat16" | "bf16" | "fp16" => Ok(Some(2)),
        "float" | "float32" => Ok(Some(4)),
        _ => Err(bad(
            flag,
            value,
            "not a model dtype (auto, half, float16, bfloat16, float, float32)",
        )),
    }
}

fn set(
    engine: Engine,
    key: &str,
    flag: &str,
    value: &str,
    launch: &mut Launch,
    state: &mut Flags,
) -> Result<(), PlanError> {
    match key {
        "model" => launch.model = value.to_string(),
        "revision" => launch.revision = Some(value.to_string()),
        "download-dir" => launch.download_dir = Some(value.to_string()),
        "tp" => launch.tp = positive(flag, value)?,
        "pp" => launch.pp = positive(flag, value)?,
        "dp" => launch.dp = positive(flag, value)?,
        "dcp" => launch.dcp = positive(flag, value)?,
        "nnodes" => launch.nnodes = positive(flag, value)?,
        "fraction" => launch.mem_fraction = Some(fraction(flag, value)?),
        "kv-dtype" => launch.kv_dtype = kv_dtype(engine, flag, value)?,
        "dtype" => launch.model_dtype_bytes = model_dtype(flag, value)?,
        "page" => launch.page_size = Some(positive(flag, value)?),
        "backend" => launch.attention_backend = Some(value.to_string()),
        "decode-backend" => launch.decode_attention_backend = Some(value.to_string()),
        "prefill-backend" => launch.prefill_attention_backend = Some(value.to_string()),
        "max-total-tokens" => launch.max_total_tokens = Some(whole(flag, value)?),
        "context" => {
            launch.context_length = match (engine, value) {
                (Engine::Vllm, "auto" | "-1") => {
                    launch.max_model_len_auto = true;
                    None
                }
                (Engine::Vllm, _) => Some(human_int(flag, value)?),
                (Engine::Sglang, _) => Some(whole(flag, value)?),
            }
        }
        "max-requests" => launch.max_running_requests = Some(whole(flag, value)?),
        "kv-bytes" => launch.kv_cache_memory_bytes = Some(human_int(flag, value)?),
        "chunked" => launch.chunked_prefill_size = Some(chunked_prefill(engine, flag, value)?),
        "max-prefill" => launch.max_prefill_tokens = Some(whole(flag, value)?),
        "graph-bs" => launch.cuda_graph_max_bs = Some(whole(flag, value)?),
        "prefill-graph-backend" => {
            launch.prefill_graph_backend = Some(value.trim().to_ascii_lowercase())
        }
        "speculative" => launch.speculative_algorithm = Some(value.to_ascii_uppercase()),
        "hicache-ratio" => match value.trim().parse::<f64>() {
            Ok(ratio) if ratio > 0.0 => state.hicache_ratio = Some(ratio),
            _ => return Err(bad(flag, value, "not a positive ratio")),
        },
        "hicache-size" => state.hicache_size = Some(whole(flag, value)?),
        "mamba-size" => launch.max_mamba_cache_size = Some(whole(flag, value)?),
        "mamba-dtype" => launch.mamba_cache_dtype = mamba_dtype(engine, flag, value)?,
        "mamba-ssm-dtype" => launch.mamba_ssm_dtype = mamba_dtype(engine, flag, value)?,
        "mamba-ratio" => match value.trim().parse::<f64>() {
            Ok(ratio) if ratio > 0.0 && ratio.is_finite() => {
                launch.mamba_full_memory_ratio = Some(ratio)
            }
            _ => return Err(bad(flag, value, "not a positive ratio")),
        },
        // server_args.py: 0 < ratio <= 1.
        "swa-ratio" => match value.trim().parse::<f64>() {
            Ok(ratio) if ratio > 0.0 && ratio <= 1.0 => launch.swa_full_tokens_ratio = Some(ratio),
            _ => return Err(bad(flag, value, "not a ratio above 0 and at most 1")),
        },
        "offload" => match value.trim().parse::<f64>() {
            Ok(gib) if gib >= 0.0 => state.offloading_gib = Some(gib),
            _ => return Err(bad(flag, value, "not a size in GiB")),
        },
        "base-gpu-id" => {
            state.base_gpu_id = value
                .trim()
                .parse()
                .map_err(|_| bad(flag, value, "not a GPU index"))?
        }
        "gpu-id-step" => state.gpu_id_step = Some(positive(flag, value)?),
        "gpu-blocks" => launch.num_gpu_blocks_override = Some(whole(flag, value)?),
        "cpu-offload" => launch.cpu_offload_bytes = cpu_offload_bytes(engine, flag, value)?,
        "device-ids" => {
            state.device_ids = Some(value.split(',').map(|id| id.trim().to_string()).collect())
        }
        _ => launch.ignored.push(format!("{flag} {value}")),
    }
    Ok(())
}

/// A state dtype's bytes: vLLM `MambaDType` ("auto", "float32", "float16",
/// "bfloat16"); SGLang's `--mamba-ssm-dtype` choices, without "auto".
fn mamba_dtype(engine: Engine, flag: &str, value: &str) -> Result<Option<u64>, PlanError> {
    match value.trim() {
        "auto" if engine == Engine::Vllm => Ok(None),
        "float32" => Ok(Some(4)),
        "float16" | "bfloat16" => Ok(Some(2)),
        _ => Err(bad(
            flag,
            value,
            "not one of the engine's choices (float32, float16, bfloat16; auto for vLLM)",
        )),
    }
}

/// The chunked-prefill size: the engines spell it differently (vLLM's
/// `human_readable_int`, SGLang's signed `int` where -1 or 0 disables it).
fn chunked_prefill(engine: Engine, flag: &str, value: &str) -> Result<u64, PlanError> {
    match engine {
        Engine::Vllm => human_int(flag, value),
        // SGLang: -1 (or 0) disables chunked prefill.
        Engine::Sglang => match value.trim().parse::<i64>() {
            Ok(number) => Ok(number.max(0) as u64),
            Err(_) => Err(bad(flag, value, "not a whole number")),
        },
    }
}

/// `--cpu-offload-gb` in bytes: SGLang's is an `int`, vLLM's a float, and
/// either is bounded so that the bytes cannot overflow.
fn cpu_offload_bytes(engine: Engine, flag: &str, value: &str) -> Result<u64, PlanError> {
    let gib = match (engine, value.trim().parse::<f64>()) {
        // SGLang's is an `int`.
        (Engine::Sglang, _) => whole(flag, value)? as f64,
        (Engine::Vllm, Ok(gib)) => gib,
        (Engine::Vllm, Err(_)) => return Err(bad(flag, value, "not a size in GiB")),
    };
    if !(0.0..=MAX_OFFLOAD_GIB).contains(&gib) {
        return Err(bad(
            flag,
            value,
            &format!("not a size in GiB from 0 to {MAX_OFFLOAD_GIB}"),
        ));
    }
    Ok((gib * (1u64 << 30) as f64) as u64)
}

/// The engine's GPU ids (its own numbering, before CUDA_VISIBLE_DEVICES),
/// in rank order. SGLang 0.5.9 (`engine.py`, `data_parallel_controller.py`,
/// one node): `base_gpu_id + dp_rank·tp·pp·step + pp_rank·tp +
/// tp_rank·step`, the DP term only without DP attention. vLLM: the first
/// `tp·pp·dp` devices (or `--device-ids`).
fn logical_gpus(launch: &Launch, base: u32, step: u32) -> Vec<u32> {
    let mut ids = Vec::new();
    match launch.engine {
        Engine::Sglang => {
            // One node's ranks (`--nnodes`): tp_rank % tp_per_node.
            let (pp_here, tp_here) = launch.sglang_per_node();
            let replicas = if launch.dp_attention || launch.nnodes > 1 {
                1
            } else {
                launch.dp
            };
            for dp_rank in 0..replicas {
                for pp_rank in 0..pp_here {
                    for tp_rank in 0..tp_here {
                        ids.push(
                            base + dp_rank * launch.tp * launch.pp * step
                                + pp_rank * tp_here
                                + tp_rank * step,
                        );
                    }
                }
            }
        }
        Engine::Vllm => ids.extend(0..launch.gpu_count()),
    }
    ids
}

fn is_uuid(id: &str) -> bool {
    id.starts_with("GPU-") || id.starts_with("MIG-")
}

/// The devices CUDA makes visible for `CUDA_VISIBLE_DEVICES=list`: the
/// entries up to the first it cannot use, an entry that is neither an
/// index nor a UUID, or one that repeats an earlier one (`0,0` is one GPU
/// to CUDA, not two).
fn cuda_visible(list: &str) -> Vec<String> {
    let mut visible: Vec<String> = Vec::new();
    for id in list.split(',').map(str::trim) {
        let id = match id.parse::<u32>() {
            Ok(index) => index.to_string(),
            Err(_) if is_uuid(id) => id.to_string(),
            Err(_) => break,
        };
        if visible.contains(&id) {
            break;
        }
        visible.push(id);
    }
    visible
}

fn assign_gpus(
    launch: &mut Launch,
    env: &BTreeMap<String, String>,
    base: u32,
    step: Option<u32>,
    device_ids: Option<Vec<String>>,
) -> Result<(), PlanError> {
    let logical = logical_gpus(launch, base, step.unwrap_or(1));
    // CUDA reads CUDA_VISIBLE_DEVICES up to the first entry it cannot
    // parse; the visible devices are those entries, in that order.
    let visible = env
        .get("CUDA_VISIBLE_DEVICES")
        .map(|list| cuda_visible(list));
    let visible_raw = env.get("CUDA_VISIBLE_DEVICES").map_or("", String::as_str);
    if let Some(visible) = &visible
        && visible.is_empty()
    {
        return Err(bad(
            "CUDA_VISIBLE_DEVICES",
            env.get("CUDA_VISIBLE_DEVICES").map_or("", String::as_str),
            "it makes no GPU visible to the engine",
        ));
    }
    let needed = launch.gpu_count();
    // vLLM's --device-ids: indices into CUDA_VISIBLE_DEVICES when set,
    // else physical ids; or UUIDs.
    let chosen: Vec<String> = match (&device_ids, &visible) {
        (Some(ids), _) if ids.iter().all(|id| is_uuid(id)) => ids.clone(),
        (Some(ids), visible) => {
            let mut out = Vec::new();
            for id in ids {
                let index: usize = id
                    .parse()
                    .map_err(|_| bad("--device-ids", id, "neither a GPU index nor a UUID"))?;
                out.push(match visible {
                    Some(visible) => visible.get(index).cloned().ok_or_else(|| {
                        bad(
                            "--device-ids",
                            id,
                            &format!(
                                "out of range for CUDA_VISIBLE_DEVICES ({} visible)",
                                visible.len()
                            ),
                        )
                    })?,
                    None => index.to_string(),
                });
            }
            if out.len() < needed as usize {
                return Err(bad(
                    "--device-ids",
                    &ids.join(","),
                    &format!("the engine needs {needed} GPUs"),
                ));
            }
            out.truncate(needed as usize);
            out
        }
        (None, Some(visible)) => {
            let mut out = Vec::new();
            for id in &logical {
                out.push(visible.get(*id as usize).cloned().ok_or_else(|| {
                    bad(
                        "CUDA_VISIBLE_DEVICES",
                        visible_raw,
                        &format!(
                            "the engine uses GPU #{id} of the visible ones (TP {} × PP {} × DP {}{}), only {} visible (CUDA reads the list up to an entry that is neither an index nor a UUID, or repeats one)",
                            launch.tp,
                            launch.pp,
                            launch.dp,
                            match launch.engine {
                                Engine::Sglang => ", --base-gpu-id, --gpu-id-step",
                                Engine::Vllm => "",
                            },
                            visible.len()
                        ),
                    )
                })?);
            }
            out
        }
        (None, None) => logical.iter().map(u32::to_string).collect(),
    };
    if chosen.iter().any(|id| is_uuid(id)) {
        launch.gpu_uuids = chosen;
    } else {
        launch.gpus = chosen.iter().filter_map(|id| id.parse().ok()).collect();
    }
    Ok(())
}
