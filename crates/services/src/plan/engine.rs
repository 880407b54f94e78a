//! The engines' own KV-cache arithmetic, pure: no GPU, no files.
//!
//! Read from the released packages (the package wins over ENGINES.md):
//! - SGLang **0.5.9**: `model_executor/model_runner_kv_cache_mixin.py`
//!   (`get_cell_size_per_token`, `profile_max_num_token`,
//!   `init_memory_pool`), `model_executor/model_runner.py`
//!   (`max_running_requests`), `server_args.py`
//!   (`_handle_gpu_memory_settings`, `adjust_mem_fraction_for_vlm`,
//!   `_handle_attention_backend_compatibility`, `_handle_page_size`),
//!   `layers/dp_attention.py`, `mem_cache/memory_pool_host.py`
//!   (`HostKVCache`). 0.5.23 keeps the same pool arithmetic under new names
//!   (`pool_configurator.py`) and changes the request-cap default and the
//!   host budget (split over co-located ranks); those are not modelled.
//! - vLLM **0.26.0**: `v1/worker/utils.py` (`request_memory`),
//!   `v1/worker/gpu_worker.py` (`determine_available_memory`),
//!   `v1/core/kv_cache_utils.py` (`get_num_blocks`, MIN over ranks),
//!   `v1/kv_cache_interface.py` (page sizes, MLA as one head),
//!   `config/cache.py` (`gpu_memory_utilization` default **0.92**, block
//!   size 16), `engine/arg_utils.py` (`max_num_seqs` default),
//!   `v1/kv_offload/cpu/spec.py` (offload: one copy per worker).
//!
//! Where the packages differ from /work/shared/ENGINES.md (the package is
//! followed):
//! - SGLang 0.5.9 caps the default request limit at `tokens // 2` too
//!   (`model_runner.py`: `min(tokens // 2, pool)`), and a given
//!   `--max-running-requests` is divided by the attention-DP size.
//! - SGLang's VLM factor for Kimi-K2.5 is `0.95 × (1 − 0.1 × (27·1152² /
//!   (24·1024²) − 1)) ≈ 0.910`, not 0.95: default f ≈ 0.816 on H200, 0.771
//!   on H20-96GB, 0.744 on H100-80GB.
//! - vLLM 0.26.0 checks `free ≥ ceil(utilization × total)` even with
//!   `--kv-cache-memory-bytes`, and refuses a pool that cannot hold one
//!   request of `max_model_len` (unless `--max-model-len auto`).
//! - vLLM 0.26.0's CPU offload stores every block once per worker (MLA
//!   too): no `replicated_layout` yet.
//! - vLLM 0.26.0 on Hopper picks FLASH_ATTN_MLA for MLA (blocks of 16);
//!   FLASHINFER_MLA's preferred block is 32.
//!
//! Exact: the cell size, the budget rules, the rounding, the caps, the
//! defaults. ESTIMATES (named constants below, each replaced by a measured
//! figure through `--from-log`, `--weights`, `--kv-memory` or `--gpu-free`):
//! weights per GPU, the CUDA context, vLLM's profile-run peak and its
//! CUDA-graph reservation.

use super::launch::{Engine, HostTierRequest, KvDtype, Launch};
use super::model::{Attention, Model, Window};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// ESTIMATE: what each engine process holds on its GPU before the engine
/// measures free memory (the CUDA context, NCCL's buffers, cuBLAS): the
/// free memory the engine sees at start is the driver's free memory less
/// this. ENGINES.md §4.2 takes ~1 GiB; `--gpu-free` replaces it.
pub(crate) const CUDA_CONTEXT_BYTES: u64 = GIB;

/// ESTIMATE: SGLang allocates, between its two free-memory measurements,
/// a little besides the weights (buffers created while loading); ~1 GiB
/// for Kimi-K2.5 at TP8 (ENGINES.md §4.2). `Load weight end … mem usage`
/// in a log replaces weights and this together.
pub(crate) const SGLANG_LOAD_OVERHEAD_BYTES: u64 = GIB;

/// MEASURED (SGLang 0.5.14, one H100, TP1, dummy weights): what a start on
/// one GPU allocates while loading besides the checkpoint's bytes, the
/// logged `Load weight end … mem usage` less them: Qwen3-4B 7.56 GiB
/// against 7.49, Llama-3.1-8B 15.02 against 14.96 (0.06–0.07 GiB, the
/// log's 0.01 rounding aside). No communicator buffers at TP1; at TP > 1
/// `SGLANG_LOAD_OVERHEAD_BYTES` stays.
pub(crate) const SGLANG_LOAD_OVERHEAD_TP1_BYTES: u64 = 64 * MIB;

/// ESTIMATE: vLLM's non-torch growth during its profile run
/// (`memory_profiling`'s `non_torch_increase`: cuBLAS and CUDA
/// workspaces, NCCL buffers at TP > 1), which no vLLM source line sizes:
/// every start of the corpus (TP1, H100, vLLM 0.26.0) logged 0.22 GiB
/// (`non-torch forward increase memory`). A log replaces it.
pub(crate) const VLLM_NON_TORCH_BYTES: u64 = 225 * MIB;

/// ESTIMATE: the CUDA driver's device memory for one more captured graph
/// (the graph exec's kernel parameters), which vLLM 0.26.0 measures as the
/// free-memory drop of its second capture of each mode
/// (`GPUModelRunner.profile_cudagraph_memory`, at least 1 MiB) and no
/// source sizes: a FULL graph (the whole forward, one exec) one 2 MiB
/// page of driver memory, a PIECEWISE capture size one exec per piece at
/// 128 KiB each. The one V1 start with graphs in the corpus (Qwen3-30B-A3B,
/// 48 layers, H100, driver 580) measured 2 MiB per FULL graph and 6 MiB per
/// PIECEWISE size of 49 pieces.
pub(crate) const VLLM_FULL_GRAPH_BYTES: u64 = 2 * MIB;
/// See `VLLM_FULL_GRAPH_BYTES`: one piece graph of a PIECEWISE size.
pub(crate) const VLLM_PIECE_GRAPH_BYTES: u64 = 128 * 1024;

/// vLLM 0.26.0 `AttentionConfig.flash_attn_max_num_splits_for_cuda_graph`:
/// the splits FlashAttention 3 is given under full CUDA graphs, whose
/// float32 accumulators (`out_accum`, `softmax_lse_accum`) are allocated at
/// that many splits during capture (v1/attention/backends/flash_attn.py
/// `FlashAttentionMetadataBuilder.__init__` and `build`).
const VLLM_FA3_GRAPH_SPLITS: u64 = 32;

/// The streaming multiprocessors of an H100 or H200 SXM: vLLM's Triton
/// top-k/top-p sampler keeps a float32 buffer of `min(next_pow2(min(SMs,
/// rows)), SMs)` vocabulary rows (v1/sample/ops/topk_topp_triton.py
/// `apply_top_k_top_p_triton`, `num_compute_units`). The GPU's name is not
/// known offline; the Hopper SXM count is taken (an A100's 108 moves the
/// buffer by 24 rows of the vocabulary).
const VLLM_SAMPLER_SMS: u64 = 132;

/// vLLM 0.26.0's `fp8_ds_mla` bytes per token and layer
/// (`MLAAttentionSpec.real_page_size_bytes`, DeepSeek-V3.2's layout).
const VLLM_FP8_DS_MLA_BYTES: u64 = 656;

/// The page (block) size both engines force for sparse attention on CUDA:
/// SGLang 0.5.9 `_handle_model_specific_adjustments` (`page_size = 64`
/// for DeepSeek DSA, whatever `--page-size` says); vLLM 0.26.0's sparse
/// MLA and indexer backends support only blocks of 64
/// (`get_supported_kernel_block_sizes`), so `get_preferred_block_size`
/// picks 64 unless `--block-size` is given.
const DSA_PAGE: u32 = 64;

/// SGLang's guard on host memory for HiCache: `psutil.available − 10 GiB`.
pub(crate) const HOST_GUARD_BYTES: u64 = 10 * GIB;

/// SGLang's HiCache ratio when neither `--hicache-ratio` nor
/// `--hicache-size` is given.
pub(crate) const SGLANG_HICACHE_RATIO: f64 = 2.0;

/// SGLang 0.5.23 `--hicache-host-memory-fraction` default
/// (`arg_groups/fields/memory.py`): the share of a rank's host budget its
/// auto-sized HiCache pools may take.
pub(crate) const SGLANG_HICACHE_HOST_MEMORY_FRACTION: f64 = 0.8;

/// SGLang 0.5.23 `hicache_auto_size.py` `_ALLOCATION_SLACK_FRACTION`.
pub(crate) const SGLANG_HICACHE_ALLOCATION_SLACK: f64 = 0.05;

/// SGLang 0.5.9 `ServerArgs.swa_full_tokens_ratio` default.
pub(crate) const SGLANG_SWA_FULL_TOKENS_RATIO: f64 = 0.8;

/// vLLM 0.26.0 `CacheConfig.gpu_memory_utilization` default.
pub(crate) const VLLM_DEFAULT_UTILIZATION: f64 = 0.92;

/// Per GPU, bytes; every step can be overridden by a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Budget {
    /// Device total (the smallest of the engine's GPUs).
    pub gpu_total: u64,
    /// MIN over the engine's GPUs of free memory before load (what the
    /// engine measures: the driver's free less `CUDA_CONTEXT_BYTES`).
    pub free_at_start: u64,
    /// W': SGLang, everything allocated between the two measurements
    /// (`weights_per_gpu` estimates it); vLLM, the weights as loaded
    /// (`Model loading took`), to which `device` adds vLLM's profile peak
    /// and CUDA-graph estimates (unless `non_kv` gives them measured).
    pub weights_per_gpu: u64,
    /// `--kv-memory` (or `--kv-cache-memory-bytes`): the KV bytes per
    /// GPU, skipping the budget rule.
    pub kv_memory: Option<u64>,
    /// vLLM: what the requested memory holds besides the KV cache (the
    /// weights, the profile run's activation peak, non-torch memory, CUDA
    /// graphs) as a previous start measured it: its requested memory less
    /// its `Available KV cache memory` (`--from-log`). It replaces the
    /// weights and the estimates of the rest; the KV cache is what a
    /// utilization leaves beside it, so a higher one adds its share of
    /// the total. `None`: the weights and the estimates.
    pub non_kv: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Start {
    Starts,
    /// SGLang's `RuntimeError("Not enough memory. Please try to increase
    /// --mem-fraction-static")`, with the smallest fraction (to the
    /// hundredth) that gives one page of tokens, if one below 1 does.
    NotEnoughMemory {
        raise_fraction_to: Option<f64>,
    },
    /// vLLM's `ValueError("Free memory on device … is less than desired
    /// GPU memory utilization")`: `needed` = ceil(utilization × total).
    RefusesFree {
        needed: u64,
        free: u64,
    },
    /// The weights alone are larger than the free memory.
    WeightsTooLarge,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Device {
    /// KV bytes per token per GPU (SGLang's `cell_size`; vLLM's page size
    /// per token summed over layers).
    pub bytes_per_token: u64,
    /// The KV budget per GPU (0 when it is not positive).
    pub kv_bytes_per_rank: u64,
    /// Tokens per GPU after rounding and caps (0 when it would not start).
    pub tokens_per_rank: u64,
    /// Ranks that each hold their own pool of distinct requests: DP
    /// attention ranks (SGLang) or data-parallel replicas (both).
    pub ranks: u32,
    /// SGLang's page size / vLLM's block size, as the engine settles it.
    pub page_size: u32,
    /// Effective, the engine's default when the flag is absent.
    pub mem_fraction: f64,
    /// The running-request cap per rank.
    pub max_running_requests: u64,
    /// Decode concurrency per rank: tokens ÷ (prompt + output), capped by
    /// the request cap; None without averages.
    pub concurrency: Option<f64>,
    pub start: Start,
    /// The KV dtype the engine settles on (`auto` resolved).
    pub kv_dtype: KvDtype,
    /// The KV pool before the page floor and the caps (SGLang's profiled
    /// `max_total_num_tokens`; vLLM's blocks × block size), negative when
    /// the budget is.
    pub profiled_tokens: i64,
    /// SGLang's context length as the engine uses it (`--context-length`,
    /// else the config's), for the request-cap default.
    pub context_length: Option<u64>,
    /// The pools of a model with sliding-window layers, as the engine
    /// splits them; `None`: one pool of full-attention layers.
    pub hybrid: Option<Hybrid>,
    /// The engine's own figures for its pool, computed as it computes them
    /// before it logs them; `None` when it would not start.
    pub logged: Option<EngineLog>,
}

/// How an engine holds a model whose layers are partly sliding-window.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "engine")]
pub enum Hybrid {
    /// vLLM 0.26.0 (`v1/core/kv_cache_utils.py`
    /// `_get_kv_cache_groups_uniform_page_size`): the layers of each kind
    /// split into groups of `group_size` layers (the smaller kind's count,
    /// or the larger's when it is under 1.5 times the smaller); one pool of
    /// `blocks` blocks, each block `group_size` pages, shared by every
    /// group; a request takes blocks in each group: a full group one per
    /// `page_size` tokens, a window group at most `window − 1 +
    /// in_flight_tokens` tokens' worth plus one (`SlidingWindowSpec`).
    Vllm {
        full_groups: u64,
        window_groups: u64,
        /// Groups of linear-attention layers: one block each per request
        /// (`MambaSpec`, `--mamba-cache-mode none`, the default without
        /// prefix caching, which vLLM leaves off for hybrid models).
        state_groups: u64,
        /// Blocks a request holds in each state group
        /// (`MambaSpec.max_memory_usage_bytes` ÷ the page): 1 in mamba
        /// cache mode `none`, 2 (3 with FlashInfer's GDN prefill
        /// checkpoints) in `align`; `None` in `all`: one per block of
        /// tokens, as a full group.
        #[serde(skip)]
        state_blocks: Option<u64>,
        group_size: u64,
        /// The window in tokens; `None` without window layers.
        window: Option<u64>,
        /// `max_concurrent_batches × max_num_batched_tokens`
        /// (`VllmConfig.max_in_flight_tokens`).
        in_flight_tokens: u64,
        blocks: u64,
        /// Blocks one request of `max_model_len` takes over all groups.
        blocks_per_request: u64,
    },
    /// SGLang 0.5.9 (`model_runner_kv_cache_mixin.py`
    /// `set_num_tokens_hybrid_swa`): the profiled tokens' memory split into
    /// a full pool and a window pool `ratio` times its size.
    Sglang {
        full_tokens: u64,
        window_tokens: u64,
        window: u64,
        ratio: f64,
    },
    /// SGLang 0.5.9 with linear-attention layers (`handle_max_mamba_cache`):
    /// the full-attention pool beside `state_slots` request states of
    /// `state_bytes_per_request` each, which cap the running requests at
    /// `state_request_cap`.
    SglangState {
        full_tokens: u64,
        state_slots: u64,
        state_bytes_per_request: u64,
        state_request_cap: u64,
    },
}

/// What the engine logs about its pool: vLLM's `GPU KV cache size: N
/// tokens` and `Maximum concurrency for L tokens per request: X` (both from
/// `get_kv_cache_capacity`: N = int(X × L)); SGLang's
/// `max_total_num_tokens` (the full pool of a hybrid model).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct EngineLog {
    pub kv_cache_tokens: u64,
    /// vLLM's maximum concurrency at `max_model_len`; `None` for SGLang.
    pub max_concurrency: Option<f64>,
    pub max_model_len: Option<u64>,
}

/// What bounds the requests a pool holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Cap {
    /// The one pool (full attention, or vLLM's shared block pool).
    Pool,
    /// SGLang's full-attention pool of a hybrid model.
    FullPool,
    /// SGLang's sliding-window pool.
    WindowPool,
    /// SGLang's linear-attention state slots (its request cap).
    StateSlots,
    /// The running-request limit (`--max-running-requests` /
    /// `--max-num-seqs`).
    RunningRequests,
}

/// Layers one pipeline stage holds (the largest stage; the engines take
/// the MIN of tokens over stages).
fn stage_layers(launch: &Launch, model: &Model) -> u64 {
    kv_layers(model).div_ceil(u64::from(launch.pp.max(1)))
}

/// The layers that hold KV: every layer, or a linear-attention or Mamba
/// model's attention layers (the others hold a state, or nothing).
fn kv_layers(model: &Model) -> u64 {
    model.linear.map_or(model.layers, |linear| {
        linear.attention_layers.min(model.layers)
    })
}

/// The KV dtype `auto` resolves to: FP8 (e4m3) when the quant config
/// quantizes the KV cache, else the model dtype. SGLang 0.5.9 sets a
/// sparse-attention model's `auto` to bfloat16 below SM100 before it reads
/// the quant config (`server_args.py` `_set_default_nsa_kv_cache_dtype`;
/// fp8_e4m3 on Blackwell, not modelled: plan takes Hopper).
pub(crate) fn kv_dtype(launch: &Launch, model: &Model) -> KvDtype {
    match launch.kv_dtype {
        KvDtype::Auto if launch.engine == Engine::Sglang && model.sparse.is_some() => KvDtype::Bf16,
        KvDtype::Auto if model.kv_fp8_from_quant => KvDtype::Fp8E4m3,
        KvDtype::Auto => match launch.model_dtype_bytes.unwrap_or(model.dtype_bytes) {
            4 => KvDtype::Auto,
            _ => KvDtype::Bf16,
        },
        other => other,
    }
}

fn element_bytes(dtype: KvDtype, launch: &Launch, model: &Model) -> u64 {
    dtype
        .bytes()
        .unwrap_or_else(|| launch.model_dtype_bytes.unwrap_or(model.dtype_bytes))
}

/// KV bytes per token per GPU, the engine's way.
///
/// SGLang `get_cell_size_per_token`: MLA `(kv_lora_rank +
/// qk_rope_head_dim) × layers × kv_size`, the same on every TP rank; MHA
/// `max(1, kv_heads // attn_tp) × (head_dim + v_head_dim) × layers ×
/// kv_size`; FP4 halves it and adds one scale byte per 16 elements.
/// vLLM: MLA one head of `kv_lora_rank + qk_rope_head_dim`; MHA
/// `max(1, kv_heads // tp)` heads of `head_size + head_size_v`; nvfp4
/// `head/2 + head/16` bytes per head dimension.
///
/// Sparse attention (`Model::sparse`) adds the indexer's key
/// (`Sparse::indexer_bytes`) in every layer. vLLM (0.26.0; 0.33.0 alike,
/// `mla_attention.py` `state_content_bytes`) stores an FP8 KV
/// cache of a sparse model as `fp8_ds_mla` (`FLASHMLA_SPARSE`, the Hopper
/// backend that takes FP8: `_canonicalize_sparse_mla_kv_cache_dtype`),
/// 656 bytes a token and layer (`MLAAttentionSpec.real_page_size_bytes`:
/// 512 FP8 NoPE, 4 float32 scales, 64 bf16 RoPE); SGLang 0.5.9 counts its
/// FP8 cell as `kv_lora_rank + qk_rope_head_dim` bytes, though its pool
/// stores 656 (`calculate_mla_kv_cache_dim`): the count is what sizes it;
/// 0.5.23 counts the 656 (`Rules::sglang_dsa_fp8_cell_is_stored_layout`).
pub fn bytes_per_token(launch: &Launch, model: &Model) -> u64 {
    let dtype = kv_dtype(launch, model);
    let size = element_bytes(dtype, launch, model);
    let layers = stage_layers(launch, model);
    let fp4 = dtype == KvDtype::Fp4E2m1;
    match model.attention_for(launch.engine) {
        Attention::Mla {
            kv_lora_rank,
            qk_rope_head_dim,
        } => {
            let width = kv_lora_rank + qk_rope_head_dim;
            let cell = width * layers * size;
            let cell = if fp4 {
                cell / 2 + (width / 16) * layers * size
            } else {
                cell
            };
            match model.sparse {
                None => cell,
                Some(sparse) => {
                    let main = match (launch.engine, size) {
                        (Engine::Vllm, 1) => VLLM_FP8_DS_MLA_BYTES * layers,
                        (Engine::Sglang, 1)
                            if launch.rules.sglang_dsa_fp8_cell_is_stored_layout() =>
                        {
                            (kv_lora_rank + kv_lora_rank / 128 * 4 + qk_rope_head_dim * 2) * layers
                        }
                        _ => cell,
                    };
                    main + sparse.indexer_bytes() * layers
                }
            }
        }
        Attention::Mha {
            kv_heads,
            head_dim,
            v_head_dim,
        } => {
            let tp = match launch.engine {
                Engine::Sglang => launch.attention_tp(),
                Engine::Vllm => launch.tp,
            };
            let heads = (kv_heads / u64::from(tp.max(1))).max(1);
            let cell = match sglang_window_shapes(launch, model) {
                // get_cell_size_per_token, is_hybrid_swa: each kind at its
                // own shape, over the whole model's layers of that kind.
                Some((window, full, swa)) => {
                    let full_layers = model.layers.saturating_sub(window.layers);
                    (full * full_layers + swa * window.layers) * size
                }
                None => heads * (head_dim + v_head_dim) * layers * size,
            };
            match (fp4, launch.engine) {
                (false, _) => cell,
                (true, Engine::Sglang) => cell / 2 + (heads * head_dim * layers * 2 * size) / 16,
                (true, Engine::Vllm) => {
                    heads
                        * (head_dim / 2 + head_dim / 16 + v_head_dim / 2 + v_head_dim / 16)
                        * layers
                }
            }
        }
    }
}

/// ESTIMATE: the weights one GPU holds once loaded, plus, for SGLang, the
/// load overhead (`SGLANG_LOAD_OVERHEAD_BYTES`). From the checkpoint's
/// total (index or headers): `(total − replicated) / (TP·PP) + replicated
/// / PP`, where `replicated` is what every TP rank holds whole (MLA's
/// `q_a`/`kv_a`), and, with SGLang's DP attention, the attention
/// projections split over attention-TP instead of TP: `+ (attention −
/// replicated) × (1/attn_tp − 1/tp) / PP`. Experts and the rest are taken
/// as evenly split. None without a checkpoint size.
pub fn weights_per_gpu(launch: &Launch, model: &Model) -> Option<u64> {
    let total = model.weights_bytes? as f64;
    let tp = f64::from(launch.tp.max(1));
    let pp = f64::from(launch.pp.max(1));
    let replicated = (model.replicated_bytes as f64).min(total);
    let mut bytes = (total - replicated) / (tp * pp) + replicated / pp;
    if launch.engine == Engine::Sglang && launch.dp_attention {
        let attn_tp = f64::from(launch.attention_tp().max(1));
        let split = (model.attention_bytes as f64 - replicated).max(0.0);
        bytes += split * (1.0 / attn_tp - 1.0 / tp) / pp;
    }
    if launch.engine == Engine::Sglang {
        let one_gpu = launch.tp.max(1) * launch.pp.max(1) == 1;
        bytes += match one_gpu && launch.rules.sglang_load_overhead_measured_at_tp1() {
            true => SGLANG_LOAD_OVERHEAD_TP1_BYTES,
            false => SGLANG_LOAD_OVERHEAD_BYTES,
        } as f64;
    }
    Some(bytes as u64)
}

/// The page size SGLang 0.5.9 settles on: `--page-size` (default 1; 64
/// for sparse attention, `DSA_PAGE`, whatever the flag says), then
/// what the attention backend forces (`_handle_attention_backend_compatibility`):
/// FlashMLA 64, cutlass MLA 128, trtllm_mla 32 or 64 (else 64), trtllm_mha
/// 16, 32 or 64 (else 64), FA4 prefill on a non-MLA model 128. Without
/// `--attention-backend` the default backend on Hopper (fa3 / flashinfer /
/// triton) forces nothing; on Blackwell SGLang picks trtllm_mla for
/// DeepSeek-V3/Kimi-K2.5 (page 64): pass `--attention-backend` to plan for
/// that.
pub(crate) fn sglang_page_size(launch: &Launch, model: &Model) -> u32 {
    let mut page = match model.sparse {
        Some(_) => DSA_PAGE,
        None => launch.page_size.unwrap_or(1),
    };
    let is = |name: &str| {
        launch.attention_backend.as_deref() == Some(name)
            || launch.decode_attention_backend.as_deref() == Some(name)
    };
    if is("flashmla") {
        page = 64;
    }
    if is("cutlass_mla") {
        page = 128;
    }
    if is("trtllm_mla") && page != 32 && page != 64 {
        page = 64;
    }
    if (is("trtllm_mha") || launch.prefill_attention_backend.as_deref() == Some("trtllm_mha"))
        && ![16, 32, 64].contains(&page)
    {
        page = 64;
    }
    let mla = matches!(model.attention, Attention::Mla { .. });
    if launch.prefill_attention_backend.as_deref() == Some("fa4") && !mla {
        page = 128;
    }
    page
}

/// The block size vLLM 0.26.0 settles on: `--block-size`, else the
/// preferred size of the attention backend: 16 (`DEFAULT_BLOCK_SIZE`) when
/// the backend supports it, else its smallest kernel size: FLASHMLA 64,
/// CUTLASS_MLA 128, FLASHINFER_MLA 32. Without `--attention-backend` the
/// Hopper default (FLASH_ATTN / FLASH_ATTN_MLA) takes 16; sparse attention
/// 64 (`DSA_PAGE`).
pub(crate) fn vllm_block_size(launch: &Launch, model: &Model) -> u32 {
    if let Some(block) = launch.page_size {
        return block;
    }
    if model.sparse.is_some() {
        return DSA_PAGE;
    }
    match launch
        .attention_backend
        .as_deref()
        .map(str::to_ascii_uppercase)
        .as_deref()
    {
        Some("FLASHMLA") => 64,
        Some("CUTLASS_MLA") => 128,
        Some("FLASHINFER_MLA") => 32,
        _ => 16,
    }
}

/// SGLang 0.5.9's default `--mem-fraction-static`
/// (`_handle_gpu_memory_settings`), for a GPU of `gpu_total` bytes
/// (nvidia-smi's memory.total; 0 when unknown, giving 0.88):
/// `reserved_MiB = 512 + max(chunked_prefill, 2048)·1.5 +
/// cuda_graph_max_bs·2 + tp·pp/8·1024` (with DP attention also
/// `cuda_graph_max_bs·dp·3`, and `·1.5` more above bs 300), at least 10,240 on GPUs over 60 GiB, plus 2 GiB
/// for EAGLE-style speculative decoding (6 GiB STANDALONE, none NGRAM);
/// `f = round((gpu − reserved) / gpu, 3)`; then, for a multimodal model,
/// `adjust_mem_fraction_for_vlm`.
pub(crate) fn sglang_default_fraction(launch: &Launch, model: &Model, gpu_total: u64) -> f64 {
    if gpu_total == 0 {
        return 0.88;
    }
    // nvidia-smi reports whole MiB.
    let gpu = (gpu_total / MIB) as f64;
    let large_tp = launch.tp >= 4;
    let (chunked_default, graph_default) = if gpu < 20.0 * 1024.0 {
        (2048, 8)
    } else if gpu < 35.0 * 1024.0 {
        (2048, if large_tp { 80 } else { 24 })
    } else if gpu < 60.0 * 1024.0 {
        (4096, if large_tp { 160 } else { 32 })
    } else if gpu < 160.0 * 1024.0 {
        (8192, if large_tp { 512 } else { 256 })
    } else {
        (16384, 512)
    };
    let chunked = launch.chunked_prefill_size.unwrap_or(chunked_default) as f64;
    let graph_bs = launch.cuda_graph_max_bs.unwrap_or(graph_default) as f64;
    let mut reserved = 512.0;
    reserved += if chunked > 0.0 {
        chunked.max(2048.0) * 1.5
    } else {
        // ServerArgs.max_prefill_tokens defaults to 16384.
        (launch.max_prefill_tokens.unwrap_or(16384) as f64).max(2048.0) * 1.5
    };
    reserved += graph_bs * 2.0;
    reserved += f64::from(launch.tp) * f64::from(launch.pp) / 8.0 * 1024.0;
    if launch.dp_attention {
        reserved += graph_bs * f64::from(launch.dp) * 3.0;
        if graph_bs > 300.0 {
            reserved += graph_bs * f64::from(launch.dp) * 1.5;
        }
    }
    if launch.rules.sglang_prefill_graph_reserve() && sglang_prefill_graphs(launch) {
        reserved += match model.attention {
            Attention::Mla { .. } => 1.5 * 1024.0,
            _ => sglang_prefill_graph_sizes(launch, chunked) as f64 * 8.0,
        };
    }
    if gpu > 60.0 * 1024.0 {
        reserved = reserved.max(10.0 * 1024.0);
    }
    match launch.speculative_algorithm.as_deref() {
        None | Some("NGRAM") => {}
        Some("STANDALONE") => reserved += 6.0 * 1024.0,
        Some(_) => reserved += 2.0 * 1024.0,
    }
    let mut fraction = ((gpu - reserved) / gpu * 1000.0).round() / 1000.0;
    if model.multimodal {
        fraction *= sglang_vlm_factor(model);
    }
    fraction
}

/// SGLang 0.5.14 captures prefill CUDA graphs (`tc_piecewise`) unless
/// `--cuda-graph-backend-prefill disabled`, or without that flag
/// `--disable-cuda-graph` / `--disable-prefill-cuda-graph`, or what
/// `_disable_tc_piecewise_cudagraph_if_incompatible` turns them off for and
/// plan reads: DP attention, PP > 1, CPU offload, HiCache.
fn sglang_prefill_graphs(launch: &Launch) -> bool {
    let on = match launch.prefill_graph_backend.as_deref() {
        Some(backend) => backend != "disabled",
        None => !launch.prefill_graph_switch_off,
    };
    on && !launch.dp_attention
        && launch.pp <= 1
        && launch.cpu_offload_bytes == 0
        && launch.host_tier.is_none()
}

/// How many prefill graph sizes SGLang 0.5.14 captures for a non-MLA model
/// (`_generate_prefill_cuda_graph_batch_sizes`): 4…32 by 4, 48…256 by 16,
/// 288…512 by 32, 576…1024 by 64, 1280…4096 by 256, then by 512, up to the
/// largest, the chunked-prefill size capped by `--max-total-tokens`, 4096
/// for a `llama-2` model path, and `--context-length`.
fn sglang_prefill_graph_sizes(launch: &Launch, chunked: f64) -> usize {
    let mut largest = chunked as u64;
    if let Some(total) = launch.max_total_tokens {
        largest = largest.min(total);
    }
    if launch.model.to_ascii_lowercase().contains("llama-2") {
        largest = largest.min(4096);
    }
    if let Some(context) = launch.context_length {
        largest = largest.min(context);
    }
    let steps: [(u64, u64, u64); 6] = [
        (4, 32, 4),
        (48, 256, 16),
        (288, 512, 32),
        (576, 1024, 64),
        (1280, 4096, 256),
        (4608, u64::MAX, 512),
    ];
    steps
        .iter()
        .map(|&(from, to, step)| {
            let last = to.min(largest);
            if last < from {
                0
            } else {
                ((last - from) / step + 1) as usize
            }
        })
        .sum()
}

/// SGLang 0.5.9 `adjust_mem_fraction_for_vlm`: `0.95 × clamp(1 − 0.1 ×
/// (layers·hidden² / (24·1024²) − 1), 0.8, 1.05)` from the vision tower
/// (1 when the config has no vision_config).
pub(crate) fn sglang_vlm_factor(model: &Model) -> f64 {
    let Some((layers, hidden)) = model.vision else {
        return 1.0;
    };
    let ratio = (layers as f64 * (hidden as f64).powi(2)) / (24.0 * 1024.0 * 1024.0);
    let dynamic = (1.0 - 0.1 * (ratio - 1.0)).clamp(0.8, 1.05);
    0.95 * dynamic
}

/// The effective mem fraction / utilization: the flag, else the default.
pub fn mem_fraction(launch: &Launch, model: &Model, gpu_total: u64) -> f64 {
    match (launch.mem_fraction, launch.engine) {
        (Some(fraction), _) => fraction,
        (None, Engine::Sglang) => sglang_default_fraction(launch, model, gpu_total),
        (None, Engine::Vllm) => VLLM_DEFAULT_UTILIZATION,
    }
}

/// The device pool per rank, the engine's way.
pub fn device(
    launch: &Launch,
    model: &Model,
    budget: &Budget,
    averages: Option<(u64, u64)>,
) -> Device {
    let mut device = match launch.engine {
        Engine::Sglang => sglang(launch, model, budget),
        Engine::Vllm => vllm(launch, model, budget),
    };
    device.concurrency =
        averages.map(|(prompt, output)| concurrency(&device, prompt.saturating_add(output)));
    device
}

/// Requests decoding at once per rank when each holds `tokens_per_request`
/// tokens: tokens ÷ tokens per request, capped by the request cap (§1.5:
/// an upper bound; SGLang reserves 0.7 of the remaining output at first).
pub fn concurrency(device: &Device, tokens_per_request: u64) -> f64 {
    requests_at_once(device, tokens_per_request).0
}

/// Requests at once per rank of `tokens_per_request` tokens each, and what
/// binds them. One pool: its tokens ÷ the request. vLLM hybrid: the blocks
/// ÷ the blocks a request takes over the groups (a window group holds
/// `min(⌈n/B⌉, ⌈min(window − 1 + in-flight, n)/B⌉ + 1)` blocks,
/// `SlidingWindowSpec.max_admission_blocks_per_request`). SGLang hybrid:
/// the full pool ÷ n and the window pool ÷ min(n, window), the smaller
/// (ESTIMATE for the window pool: SGLang frees window tokens as the window
/// passes them, in chunks). Then the running-request limit.
pub(crate) fn requests_at_once(device: &Device, tokens_per_request: u64) -> (f64, Cap) {
    let n = tokens_per_request.max(1);
    let (by_pool, cap) = match device.hybrid {
        Some(Hybrid::Vllm {
            full_groups,
            window_groups,
            state_groups,
            state_blocks,
            window,
            in_flight_tokens,
            blocks,
            ..
        }) => {
            let block = u64::from(device.page_size.max(1));
            let full = n.div_ceil(block);
            let state = state_blocks.unwrap_or(full);
            let windowed = (window
                .unwrap_or(0)
                .saturating_sub(1)
                .saturating_add(in_flight_tokens))
            .min(n)
            .div_ceil(block)
                + 1;
            let per_request =
                full_groups * full + window_groups * full.min(windowed) + state_groups * state;
            (blocks as f64 / per_request.max(1) as f64, Cap::Pool)
        }
        Some(Hybrid::Sglang {
            full_tokens,
            window_tokens,
            window,
            ..
        }) => {
            let full = full_tokens as f64 / n as f64;
            let windowed = window_tokens as f64 / n.min(window.max(1)) as f64;
            if windowed < full {
                (windowed, Cap::WindowPool)
            } else {
                (full, Cap::FullPool)
            }
        }
        Some(Hybrid::SglangState { full_tokens, .. }) => {
            (full_tokens as f64 / n as f64, Cap::FullPool)
        }
        None => (device.tokens_per_rank as f64 / n as f64, Cap::Pool),
    };
    let limit = device.max_running_requests as f64;
    match device.hybrid {
        _ if limit >= by_pool => (by_pool, cap),
        Some(Hybrid::SglangState {
            state_request_cap, ..
        }) if state_request_cap == device.max_running_requests => (limit, Cap::StateSlots),
        _ => (limit, Cap::RunningRequests),
    }
}

/// A KV pool given by size (`--kv-memory`, vLLM's
/// `--kv-cache-memory-bytes`) that, with the weights, is more than the
/// GPU holds: the engine allocates it as given, and no GPU of this kind
/// has the room, whoever else holds memory.
fn given_kv_too_large(budget: &Budget, kv: Option<u64>) -> bool {
    budget.gpu_total > 0
        && kv.is_some_and(|kv| budget.weights_per_gpu.saturating_add(kv) > budget.gpu_total)
}

fn sglang(launch: &Launch, model: &Model, budget: &Budget) -> Device {
    let cell = bytes_per_token(launch, model).max(1);
    let fraction = mem_fraction(launch, model, budget.gpu_total);
    let page = sglang_page_size(launch, model).max(1);
    let context = launch.context_length.or(model.max_position);
    // profile_max_num_token: rest = available − F0·(1 − f), in GiB floats,
    // then int(rest · 2^30) // cell (Python floor division).
    let rest_gib = match budget.kv_memory {
        Some(kv) => kv as f64 / GIB as f64,
        None => {
            let free = budget.free_at_start as f64 / GIB as f64;
            let available =
                budget.free_at_start.saturating_sub(budget.weights_per_gpu) as f64 / GIB as f64;
            available - free * (1.0 - fraction)
        }
    };
    // handle_max_mamba_cache: the linear layers' state slots come out of
    // the rest first.
    let (rest_gib, state) = sglang_state_slots(launch, model, rest_gib);
    let rest = (rest_gib * GIB as f64) as i128;
    let profiled = rest.div_euclid(cell as i128) as i64;
    // init_memory_pool: the ReqToTokenPool size (the request cap's bound)
    // from the profiled count, then the --max-total-tokens cap and the
    // page floor.
    let mut pool_requests = match launch.max_running_requests {
        Some(requests) => requests,
        None => {
            let per_context = profiled as f64 / context.unwrap_or(2048).max(1) as f64 * 512.0;
            (per_context as i64).clamp(2048, 4096) as u64
        }
    };
    if let Some((_, _, state_cap)) = state {
        pool_requests = pool_requests.min(state_cap);
    }
    let mut tokens = profiled;
    if let Some(cap) = launch.max_total_tokens {
        tokens = tokens.min(i64::try_from(cap).unwrap_or(i64::MAX));
    }
    tokens = tokens.div_euclid(i64::from(page)) * i64::from(page);
    // set_num_tokens_hybrid_swa: the pool's memory split into a full pool
    // and a window pool; max_total_num_tokens is then the full pool.
    let hybrid =
        sglang_hybrid(launch, model, tokens, cell, page).or(state.map(|(slots, bytes, cap)| {
            Hybrid::SglangState {
                full_tokens: u64::try_from(tokens).unwrap_or(0),
                state_slots: slots,
                state_bytes_per_request: bytes,
                state_request_cap: cap,
            }
        }));
    if let Some(Hybrid::Sglang { full_tokens, .. }) = hybrid {
        tokens = i64::try_from(full_tokens).unwrap_or(i64::MAX);
    }
    let start = sglang_start(budget, tokens, cell, page);
    let tokens = tokens.max(0) as u64;
    let max_running_requests = sglang_max_running_requests(launch, tokens, pool_requests);
    Device {
        bytes_per_token: cell,
        kv_bytes_per_rank: rest.max(0) as u64,
        tokens_per_rank: if start == Start::Starts { tokens } else { 0 },
        ranks: launch.dp,
        page_size: page,
        mem_fraction: fraction,
        max_running_requests,
        concurrency: None,
        start,
        kv_dtype: kv_dtype(launch, model),
        profiled_tokens: profiled,
        context_length: context,
        hybrid: hybrid.filter(|_| start == Start::Starts),
        logged: (start == Start::Starts).then_some(EngineLog {
            kv_cache_tokens: tokens,
            max_concurrency: None,
            max_model_len: context,
        }),
    }
}

/// Whether SGLang starts with `tokens` in its pool (of `cell` bytes a
/// token, `page` tokens a page), and else why not: its own checks, in its
/// order, kept apart from the pool's arithmetic.
fn sglang_start(budget: &Budget, tokens: i64, cell: u64, page: u32) -> Start {
    let weights_fit = budget.kv_memory.is_some() || budget.weights_per_gpu < budget.free_at_start;
    if !weights_fit {
        Start::WeightsTooLarge
    } else if given_kv_too_large(budget, budget.kv_memory) {
        Start::NotEnoughMemory {
            raise_fraction_to: None,
        }
    } else if tokens <= 0 {
        // The smallest f with f·F0 − W' ≥ one page of cells.
        let needed = (budget.weights_per_gpu as f64 + (u64::from(page) * cell) as f64)
            / budget.free_at_start.max(1) as f64;
        let hundredths = (needed * 100.0).ceil() / 100.0;
        // A KV pool given by size skips the fraction: none raises it.
        Start::NotEnoughMemory {
            raise_fraction_to: (budget.kv_memory.is_none() && hundredths < 1.0)
                .then_some(hundredths),
        }
    } else {
        Start::Starts
    }
}

/// SGLang's request cap (`model_runner`): min(tokens // 2 or the flag //
/// attention-DP size, the request pool), a rule of its own that changed
/// between versions.
fn sglang_max_running_requests(launch: &Launch, tokens: u64, pool_requests: u64) -> u64 {
    let dp = if launch.dp_attention {
        u64::from(launch.dp)
    } else {
        1
    };
    match launch.max_running_requests {
        // 0.5.23 resolve_max_num_reqs: max(1, n // DP), at most tokens // 2.
        Some(requests) if launch.rules.sglang_given_requests_capped() => {
            (requests / dp.max(1)).max(1).min(tokens / 2)
        }
        Some(requests) => requests / dp.max(1),
        None => tokens / 2,
    }
    .min(pool_requests)
}

/// SGLang's `handle_max_mamba_cache` and `init_memory_pool` for a model
/// with linear-attention or Mamba layers: the state slots
/// (`max_mamba_cache_size`: `--max-mamba-cache-size` ÷ the attention-DP
/// size; with `--disable-radix-cache`, `--max-running-requests` ÷ it (at
/// least 1 on 0.5.23); else from the budget `rest · r/(1 + r)`, r
/// `--mamba-full-memory-ratio` 0.9, in GiB floats as Python computes
/// them: 0.5.9 `int(budget // per_request)`, 0.5.23 `int((budget −
/// per_request) // per_request)`) come out of the rest (0.5.23 allocates
/// one padding slot more), and cap the running requests at `slots //
/// ratio`: 1 with the radix cache off (`--disable-radix-cache`; 0.5.9
/// turns it off itself for Kimi-Linear); else 0.5.9 3
/// (`MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO`), 0.5.23 3 plus the
/// radix cache's `extra_buffer` tracking slots: 2 with the overlap
/// scheduler (the default), 1 without it but with pages of more than one
/// token, none otherwise (`_mamba_radix_cache_resolution`: every model
/// modelled here is in `_MAMBA_EXTRA_BUFFER_ARCHS`, the linear-attention
/// backend `triton` by default). Returns the rest left for the KV pool and
/// (slots, state bytes per request, request cap); the rest unchanged
/// without state layers.
fn sglang_state_slots(
    launch: &Launch,
    model: &Model,
    rest_gib: f64,
) -> (f64, Option<(u64, u64, u64)>) {
    let Some(linear) = model.linear else {
        return (rest_gib, None);
    };
    let newest = launch.rules.sglang_mamba_padding_slot_and_extra_buffer();
    // mamba2_state_dtype: SGLANG_MAMBA_CONV_DTYPE (bfloat16); the
    // temporal state SGLANG_MAMBA_SSM_DTYPE (which `--mamba-ssm-dtype`
    // sets), else the config's (KDA: float32).
    let env_bytes = |name: &str| match launch.env.get(name).map(String::as_str) {
        Some("float32") => Some(4),
        Some("bfloat16" | "float16") => Some(2),
        _ => None,
    };
    let conv = env_bytes("SGLANG_MAMBA_CONV_DTYPE").unwrap_or(2);
    let ssm = launch
        .mamba_ssm_dtype
        .or_else(|| env_bytes("SGLANG_MAMBA_SSM_DTYPE"))
        .unwrap_or(linear.sglang_ssm_bytes);
    let per_request = linear
        .sglang_state_bytes(u64::from(launch.attention_tp()), conv, ssm)
        .max(1);
    let dp = if launch.dp_attention {
        u64::from(launch.dp.max(1))
    } else {
        1
    };
    // SGLang 0.5.9 `_handle_mamba_radix_cache` turns the radix cache off
    // for Kimi-Linear ("not yet supported": `support_mamba_cache=False`);
    // 0.5.23 supports it.
    let no_radix =
        launch.disable_radix_cache || (!newest && model.architecture == "KimiLinearForCausalLM");
    let slots = match (
        launch.max_mamba_cache_size,
        no_radix,
        launch.max_running_requests,
    ) {
        (Some(size), _, _) => size / dp,
        (None, true, Some(requests)) if newest => (requests / dp).max(1),
        (None, true, Some(requests)) => requests / dp,
        _ => {
            let ratio = launch.mamba_full_memory_ratio.unwrap_or(0.9);
            let budget = rest_gib * ratio / (1.0 + ratio) * GIB as f64;
            let padding = if newest { per_request as f64 } else { 0.0 };
            ((budget - padding) / per_request as f64).floor().max(0.0) as u64
        }
    };
    let allocated = if newest { slots + 1 } else { slots };
    let state_gib = allocated as f64 * per_request as f64 / GIB as f64;
    let ratio = if no_radix {
        1
    } else if !newest {
        3
    } else if !launch.disable_overlap_schedule {
        3 + 2
    } else if launch.page_size.is_some_and(|page| page > 1) {
        3 + 1
    } else {
        3
    };
    (
        rest_gib - state_gib,
        Some((slots, per_request, slots / ratio)),
    )
}

/// The window layers SGLang 0.5.9 pools apart (`is_hybrid_swa`): none with
/// `--disable-hybrid-swa-memory`, nor with HiCache for Step-3.5 and
/// MiMo-V2-Flash (`server_args.py` turns hybrid SWA memory off for them).
fn sglang_window(launch: &Launch, model: &Model) -> Option<Window> {
    const SWA_OFF_WITH_HICACHE: [&str; 2] = ["MiMoV2FlashForCausalLM", "Step3p5ForCausalLM"];
    let hicache = matches!(
        launch.host_tier,
        Some(
            HostTierRequest::SglangRatio(_)
                | HostTierRequest::SglangDefaultRatio
                | HostTierRequest::SglangSizeGb(_)
        )
    );
    let off_with_hicache = hicache && SWA_OFF_WITH_HICACHE.contains(&model.architecture.as_str());
    model
        .window_for(Engine::Sglang)
        .filter(|_| !(launch.disable_hybrid_kv || off_with_hicache))
}

/// For SGLang with window layers of a KV shape of their own
/// (`Model::window_kv`, pooled apart): the window, and the elements a
/// token takes in one full layer and in one window layer on a rank
/// (`get_num_kv_heads` / `get_swa_num_kv_heads` over attention TP, each at
/// least 1, × head + V sizes). `None` otherwise.
fn sglang_window_shapes(launch: &Launch, model: &Model) -> Option<(Window, u64, u64)> {
    if launch.engine != Engine::Sglang {
        return None;
    }
    let Some(Attention::Mha {
        kv_heads: swa_heads,
        head_dim: swa_head,
        v_head_dim: swa_v,
    }) = model.window_kv
    else {
        return None;
    };
    let Attention::Mha {
        kv_heads,
        head_dim,
        v_head_dim,
    } = model.attention
    else {
        return None;
    };
    let window = sglang_window(launch, model)?;
    let tp = u64::from(launch.attention_tp().max(1));
    let per_rank = |heads: u64| (heads / tp).max(1);
    Some((
        window,
        per_rank(kv_heads) * (head_dim + v_head_dim),
        per_rank(swa_heads) * (swa_head + swa_v),
    ))
}

/// SGLang 0.5.9 `set_num_tokens_hybrid_swa`, for a model in its hybrid SWA
/// list (`is_hybrid_swa_model`) without `--disable-hybrid-swa-memory`:
/// with F the per-token bytes of a layer, n_f full and n_s window layers
/// and r `--swa-full-tokens-ratio` (default 0.8), `full = int(tokens ·
/// F·(n_f + n_s) / (F·n_f + r·F·n_s))`, `window = int(full · r)`, each
/// floored to the page. Every layer window (n_f 0): the whole pool is the
/// window pool, and the full pool 0. With HiCache, SGLang turns hybrid SWA
/// memory off for Step-3.5 and MiMo-V2-Flash (`server_args.py`): one pool.
fn sglang_hybrid(
    launch: &Launch,
    model: &Model,
    tokens: i64,
    cell: u64,
    page: u32,
) -> Option<Hybrid> {
    let window = sglang_window(launch, model)?;
    let tokens = u64::try_from(tokens).ok()?;
    let ratio = launch
        .swa_full_tokens_ratio
        .unwrap_or(SGLANG_SWA_FULL_TOKENS_RATIO);
    let page = u64::from(page.max(1));
    let align = |tokens: u64| tokens / page * page;
    let layers = stage_layers(launch, model).max(1);
    let full_layers = model.layers.saturating_sub(window.layers);
    if full_layers == 0 {
        return Some(Hybrid::Sglang {
            full_tokens: 0,
            window_tokens: align(tokens),
            window: window.tokens,
            ratio,
        });
    }
    // Python: total_memory (int) / denominator (float), then int(). F and
    // S: a full and a window layer's bytes a token (the same but for
    // window layers of their own shape).
    let element = element_bytes(kv_dtype(launch, model), launch, model);
    let (full_per_token, swa_per_token) = match sglang_window_shapes(launch, model) {
        Some((_, full, swa)) => ((full * element) as f64, (swa * element) as f64),
        None => ((cell / layers) as f64, (cell / layers) as f64),
    };
    let total_memory = tokens as f64
        * (full_per_token * full_layers as f64 + swa_per_token * window.layers as f64);
    let denominator =
        full_per_token * full_layers as f64 + ratio * swa_per_token * window.layers as f64;
    let full = (total_memory / denominator) as u64;
    let window_tokens = (full as f64 * ratio) as u64;
    Some(Hybrid::Sglang {
        full_tokens: align(full),
        window_tokens: align(window_tokens),
        window: window.tokens,
        ratio,
    })
}

fn vllm(launch: &Launch, model: &Model, budget: &Budget) -> Device {
    // 0 for a model without attention layers (Mamba): it holds no KV.
    let kv_per_token = bytes_per_token(launch, model);
    let per_token = kv_per_token.max(1);
    let utilization = mem_fraction(launch, model, budget.gpu_total);
    let per_layer = per_token / stage_layers(launch, model).max(1);
    let block = vllm_hybrid_block_size(
        launch,
        model,
        vllm_block_size(launch, model).max(1),
        per_layer,
    );
    let memory = vllm_memory(launch, model, budget, utilization);
    let kv = memory.kv;
    // get_kv_cache_config_from_groups: available // page_size //
    // group_size, the page one block of one layer (block × per-layer
    // bytes), group_size the layers of a group (every layer for one group);
    // MIN over ranks (the same here).
    let context = launch.context_length.or(model.max_position);
    let layers = stage_layers(launch, model).max(1);
    let groups = vllm_groups(launch, model, budget.gpu_total);
    let group_size = groups.map_or(layers, |groups| groups.group_size);
    // A block of one layer; a model without attention layers (Mamba): one
    // layer's state (`MambaSpec.page_size_bytes`, unpadded).
    let page_bytes = match model.linear {
        Some(linear) if kv_layers(model) == 0 => vllm_state_bytes(launch, model, &linear),
        _ => u64::from(block).saturating_mul(per_layer),
    };
    let group_bytes = page_bytes.saturating_mul(group_size).max(1);
    let memory_blocks = if kv > 0 { (kv as u64) / group_bytes } else { 0 };
    // `--num-gpu-blocks-override` replaces the count the memory gives
    // (`may_override_num_blocks`); the memory checks stay the memory's.
    let blocks = launch.num_gpu_blocks_override.unwrap_or(memory_blocks);
    // DCP spreads each block over the DCP ranks.
    let dcp = u64::from(launch.dcp.max(1));
    let pool_tokens = blocks.saturating_mul(u64::from(block)).saturating_mul(dcp);
    // The blocks one request of max_model_len takes over the groups
    // (`_max_memory_usage_bytes_from_groups`): it must fit (`--max-model-len
    // auto` fits the length to the pool instead), and the logged
    // concurrency is the blocks ÷ it.
    let blocks_per_request =
        context.map(|length| vllm_blocks_per_request(groups, block, dcp, length));
    let one_request_blocks = match (launch.max_model_len_auto, blocks_per_request) {
        (false, Some(needed)) => needed,
        _ => 0,
    };
    let block_bytes = group_bytes;
    let start = vllm_start(
        launch,
        budget,
        &memory,
        block_bytes,
        memory_blocks,
        one_request_blocks,
    );
    let max_running_requests = vllm_max_running_requests(launch, budget.gpu_total);
    // The pool is what is allocated: the override's blocks where given.
    let kv_bytes = match launch.num_gpu_blocks_override {
        Some(blocks) => blocks.saturating_mul(block_bytes),
        None => kv.max(0) as u64,
    };
    let logged = match (context, blocks_per_request) {
        (Some(length), Some(per_request)) if start == Start::Starts => {
            Some(vllm_logged(blocks, per_request, length))
        }
        _ => None,
    };
    let hybrid = groups
        .filter(|_| start == Start::Starts)
        .map(|groups| vllm_hybrid(&groups, blocks, blocks_per_request.unwrap_or(0)));
    // A hybrid pool has no one token count: the engine's own figure.
    let tokens = match (hybrid, logged) {
        (Some(_), Some(logged)) => logged.kv_cache_tokens,
        _ => pool_tokens,
    };
    Device {
        bytes_per_token: kv_per_token,
        kv_bytes_per_rank: kv_bytes,
        tokens_per_rank: if start == Start::Starts { tokens } else { 0 },
        ranks: launch.dp,
        page_size: block,
        mem_fraction: utilization,
        max_running_requests,
        concurrency: None,
        start,
        kv_dtype: kv_dtype(launch, model),
        profiled_tokens: i64::try_from(tokens).unwrap_or(i64::MAX),
        context_length: context,
        hybrid,
        logged,
    }
}

/// A started hybrid pool's groups as the report shows them.
fn vllm_hybrid(groups: &VllmGroups, blocks: u64, blocks_per_request: u64) -> Hybrid {
    Hybrid::Vllm {
        full_groups: groups.full_groups,
        window_groups: groups.window_groups,
        state_groups: groups.state_groups,
        state_blocks: groups.state_blocks,
        group_size: groups.group_size,
        window: groups.window,
        in_flight_tokens: groups.in_flight_tokens,
        blocks,
        blocks_per_request,
    }
}

/// The memory vLLM asks for and how it splits: the KV cache's share is
/// what the blocks, the start checks and the pool's size all read.
struct VllmMemory {
    /// request_memory: ceil(total × utilization).
    requested: u64,
    /// What vLLM takes out of the requested memory besides the KV cache.
    not_kv: u64,
    /// The KV cache's bytes, negative when the rest leaves none.
    kv: i128,
}

/// vLLM's memory split at `utilization`: what is not KV cache is measured
/// by a previous start, else the weights and the estimates; the KV cache
/// is the size given, else the rest of the requested memory.
fn vllm_memory(launch: &Launch, model: &Model, budget: &Budget, utilization: f64) -> VllmMemory {
    let requested = (budget.gpu_total as f64 * utilization).ceil() as u64;
    let not_kv = budget.non_kv.unwrap_or(
        budget
            .weights_per_gpu
            .saturating_add(vllm_activation_peak(launch, model, budget.gpu_total))
            .saturating_add(VLLM_NON_TORCH_BYTES)
            .saturating_add(vllm_graph_reservation(launch, model, budget.gpu_total)),
    );
    let kv = match (launch.kv_cache_memory_bytes, budget.kv_memory) {
        (Some(bytes), _) | (None, Some(bytes)) => bytes as i128,
        (None, None) => requested as i128 - not_kv as i128,
    };
    VllmMemory {
        requested,
        not_kv,
        kv,
    }
}

/// Whether vLLM starts with `memory_blocks` blocks of `block_bytes` (one
/// request needs `one_request_blocks`), and else why not: its own checks,
/// in its order, kept apart from the pool's arithmetic.
fn vllm_start(
    launch: &Launch,
    budget: &Budget,
    memory: &VllmMemory,
    block_bytes: u64,
    memory_blocks: u64,
    one_request_blocks: u64,
) -> Start {
    // init_device calls request_memory before anything else, so the check
    // holds with --kv-cache-memory-bytes too: refused when free < it.
    if budget.free_at_start < memory.requested {
        Start::RefusesFree {
            needed: memory.requested,
            free: budget.free_at_start,
        }
    } else if budget.kv_memory.is_none()
        && launch.kv_cache_memory_bytes.is_none()
        && budget.weights_per_gpu >= budget.free_at_start
    {
        Start::WeightsTooLarge
    } else if given_kv_too_large(budget, launch.kv_cache_memory_bytes.or(budget.kv_memory)) {
        // The pool is allocated at the size given: CUDA runs out of memory.
        Start::NotEnoughMemory {
            raise_fraction_to: None,
        }
    } else if given_kv_too_large(
        budget,
        launch
            .num_gpu_blocks_override
            .map(|blocks| blocks.saturating_mul(block_bytes)),
    ) {
        // The blocks asked are allocated as asked: CUDA runs out of memory.
        Start::NotEnoughMemory {
            raise_fraction_to: None,
        }
    } else if memory.kv <= 0 || memory_blocks < one_request_blocks {
        // check_enough_kv_cache_memory: "No available memory for the cache
        // blocks", or less than one request of max_model_len needs ("To
        // serve at least one request with the model's max seq len"); with
        // the utilization that would hold one (none when the KV size is
        // given).
        let needed = one_request_blocks.max(1).saturating_mul(block_bytes);
        let total = (budget.gpu_total as f64).max(1.0);
        let used = memory.not_kv.saturating_add(needed) as f64;
        let raise = (used / total * 100.0).ceil() / 100.0;
        let fixed = launch.kv_cache_memory_bytes.is_some() || budget.kv_memory.is_some();
        Start::NotEnoughMemory {
            raise_fraction_to: (!fixed && raise <= 1.0).then_some(raise),
        }
    } else {
        Start::Starts
    }
}

/// What vLLM logs of its pool (`get_kv_cache_capacity`): concurrency =
/// blocks ÷ blocks per request, tokens = int(concurrency × max_model_len).
fn vllm_logged(blocks: u64, per_request: u64, length: u64) -> EngineLog {
    let concurrency = blocks as f64 / per_request.max(1) as f64;
    EngineLog {
        kv_cache_tokens: (concurrency * length as f64) as u64,
        max_concurrency: Some(concurrency),
        max_model_len: Some(length),
    }
}

/// vLLM 0.26.0's KV-cache groups of a model with sliding-window or
/// linear-attention layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VllmGroups {
    pub full_groups: u64,
    pub window_groups: u64,
    pub state_groups: u64,
    /// Blocks a request holds in each state group (`Hybrid::Vllm`).
    pub state_blocks: Option<u64>,
    pub group_size: u64,
    pub window: Option<u64>,
    pub in_flight_tokens: u64,
}

/// vLLM's state bytes of one state layer per request on one TP rank
/// (`MambaSpec.page_size_bytes`, unpadded): the conv state at
/// `--mamba-cache-dtype` (`auto`: the model dtype), the temporal state at
/// `--mamba-ssm-cache-dtype`, else the model's own choice
/// (`Linear::vllm_ssm_bytes`), else the conv state's
/// (`MambaStateDtypeCalculator`). KDA's recurrent state is float32 on
/// 0.26.0 whatever is given.
pub(crate) fn vllm_state_bytes(
    launch: &Launch,
    model: &Model,
    linear: &super::model::Linear,
) -> u64 {
    let conv = launch
        .mamba_cache_dtype
        .unwrap_or(launch.model_dtype_bytes.unwrap_or(model.dtype_bytes));
    let kda = matches!(linear.shape, super::model::StateShape::Kda { .. });
    let given = launch
        .mamba_ssm_dtype
        .filter(|_| !kda || launch.rules.vllm_kda_reads_ssm_cache_dtype());
    let ssm = given.or(linear.vllm_ssm_bytes).unwrap_or(conv);
    linear.state_bytes(u64::from(launch.tp), conv, ssm)
}

/// How vLLM holds a hybrid (attention + state) model's state, its
/// `mamba_cache_mode` (`MambaModelConfig.verify_and_update_config`):
/// `none` without prefix caching; with it, 0.26.0 takes `all` for the
/// models that support Mamba prefix caching (`SupportsMambaPrefixCaching`:
/// Falcon-H1, Jamba, Nemotron-H) and `align` for the others, 0.33.0
/// always `align`. Prefix caching is off by default for hybrids in 0.26.0
/// and on in 0.33.0 (`Rules::vllm_hybrid_prefix_caching_default`);
/// `--enable-prefix-caching` / `--no-enable-prefix-caching` decide.
/// A model without attention layers (Mamba) takes no prefix caching:
/// `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MambaCacheMode {
    None,
    /// `checkpoint`: the token alignment of the prefill checkpoints the
    /// state layers export (0.33.0: 64 for gated DeltaNet, whose prefill
    /// runs on FlashInfer on Hopper, `FLASHINFER_GDN_CHECKPOINT_ALIGNMENT`;
    /// 1 for the others, which export none), each taking one more block
    /// a request (`num_prefill_checkpoint_blocks`).
    Align {
        checkpoint: u64,
    },
    /// `chunk`: `get_mamba_chunk_size` (`mamba_chunk_size`, else
    /// `chunk_size`, else 2048).
    All {
        chunk: u64,
    },
}

impl MambaCacheMode {
    /// Blocks a request holds in each state group
    /// (`MambaSpec.max_memory_usage_bytes` ÷ the page): `none` 1, `align`
    /// 2 + the checkpoint block; `all` one per block of tokens (`None`).
    fn blocks_per_request(self) -> Option<u64> {
        match self {
            MambaCacheMode::None => Some(1),
            MambaCacheMode::Align { checkpoint } => Some(2 + u64::from(checkpoint > 1)),
            MambaCacheMode::All { .. } => None,
        }
    }
}

pub(crate) fn vllm_mamba_cache_mode(launch: &Launch, model: &Model) -> MambaCacheMode {
    const PREFIX_CACHING_ALL: [&str; 3] = [
        "FalconH1ForCausalLM",
        "JambaForCausalLM",
        "NemotronHForCausalLM",
    ];
    let Some(linear) = model.linear.filter(|_| kv_layers(model) > 0) else {
        return MambaCacheMode::None;
    };
    let newest = launch.rules.vllm_hybrid_prefix_caching_default();
    if !launch.prefix_caching.unwrap_or(newest) {
        return MambaCacheMode::None;
    }
    if newest {
        let checkpoint = match linear.shape {
            super::model::StateShape::GatedDeltaNet { .. } => 64,
            _ => 1,
        };
        MambaCacheMode::Align { checkpoint }
    } else if PREFIX_CACHING_ALL.contains(&model.architecture.as_str()) {
        MambaCacheMode::All {
            chunk: linear.chunk_size,
        }
    } else {
        MambaCacheMode::Align { checkpoint: 1 }
    }
}

/// The block size vLLM gives the attention layers of a model with
/// linear-attention or Mamba layers (`Platform._align_hybrid_block_size`):
/// with `a` the attention bytes of one token in one layer, `m` one state
/// layer's state bytes and `k` = max(the backend's smallest kernel block,
/// 16 for FLASH_ATTN, TRITON_ATTN and FLASH_ATTN_MLA; the block size),
/// the attention block is raised to `k · ⌈m / (k · a)⌉` when that is
/// larger, so that an attention page holds a state; the state page is then
/// padded to the attention page. Mode `all` (0.26.0): `c · ⌈⌈m / a⌉ / c⌉`
/// with `c` = lcm(the chunk size, k). 0.33.0 raises `k` to 128 for an MLA
/// model and, in mode `align`, to lcm(k, the prefill checkpoint
/// alignment), then rounds the block up to a multiple of every backend's
/// smallest kernel block (16). Other models: `block` unchanged.
pub(crate) fn vllm_hybrid_block_size(
    launch: &Launch,
    model: &Model,
    block: u32,
    per_layer: u64,
) -> u32 {
    // Only a hybrid (`ModelConfig.is_hybrid`): a model without attention
    // layers keeps its block.
    let Some(linear) = model.linear.filter(|_| kv_layers(model) > 0) else {
        return block;
    };
    let per_token_layer = per_layer.max(1);
    let state = vllm_state_bytes(launch, model, &linear);
    let newest = launch.rules.vllm_hybrid_prefix_caching_default();
    let mut kernel = u64::from(block.max(16));
    if newest && matches!(model.attention_vllm, Attention::Mla { .. }) {
        kernel = kernel.max(128);
    }
    let mode = vllm_mamba_cache_mode(launch, model);
    let aligned = match mode {
        MambaCacheMode::All { chunk } => {
            let chunk = lcm(chunk.max(1), kernel);
            chunk * state.div_ceil(per_token_layer).div_ceil(chunk)
        }
        MambaCacheMode::Align { checkpoint } if newest => {
            let kernel = lcm(kernel, checkpoint.max(1));
            kernel * state.div_ceil(kernel * per_token_layer)
        }
        _ => kernel * state.div_ceil(kernel * per_token_layer),
    };
    let aligned = if newest {
        aligned.div_ceil(16) * 16
    } else {
        aligned
    };
    u32::try_from(aligned).map_or(block, |aligned| block.max(aligned))
}

fn lcm(a: u64, b: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    a / gcd(a, b).max(1) * b
}

/// The groups vLLM 0.26.0 makes of a model with sliding-window layers
/// (`get_kv_cache_groups`), `None` for one group of full-attention layers
/// (or with `--disable-hybrid-kv-cache-manager`, which makes every window
/// layer full: `unify_hybrid_kv_cache_specs`). Every layer window: one
/// group of all of them (`is_kv_cache_spec_uniform`). Both kinds
/// (`_get_kv_cache_groups_uniform_page_size`): the group size is the
/// smaller count, or the larger when it is under 1.5 times the smaller;
/// each kind splits into ⌈count ÷ group size⌉ groups (the last padded).
/// The window and full pages are the same size (same heads, both blocks
/// of the backend's size, `unify_kv_cache_spec_page_size` otherwise
/// scales the window block). With PP, each stage's groups hold its share
/// of the layers.
pub(crate) fn vllm_groups(launch: &Launch, model: &Model, gpu_total: u64) -> Option<VllmGroups> {
    let pp = u64::from(launch.pp.max(1));
    // Linear layers: their own groups beside the full ones (the hybrid
    // KV-cache manager cannot be turned off for them).
    if let Some(linear) = model.linear {
        let state = linear.layers.min(model.layers);
        let (full_groups, state_groups, size) = group_counts(kv_layers(model), state);
        return Some(VllmGroups {
            full_groups,
            window_groups: 0,
            state_groups,
            state_blocks: vllm_mamba_cache_mode(launch, model).blocks_per_request(),
            group_size: size.div_ceil(pp).max(1),
            window: None,
            in_flight_tokens: 0,
        });
    }
    let window = model
        .window_for(Engine::Vllm)
        .filter(|_| !launch.disable_hybrid_kv)?;
    let sliding = window.layers.min(model.layers);
    let (full_groups, window_groups, group_size) = group_counts(model.layers - sliding, sliding);
    Some(VllmGroups {
        full_groups,
        window_groups,
        state_groups: 0,
        state_blocks: Some(0),
        group_size: group_size.div_ceil(pp).max(1),
        window: Some(window.tokens),
        in_flight_tokens: vllm_max_concurrent_batches(launch)
            .saturating_mul(vllm_max_num_batched_tokens(launch, gpu_total)),
    })
}

/// (full groups, other groups, group size) for `full` full-attention
/// layers beside `other` layers of one other kind
/// (`_get_kv_cache_groups_uniform_page_size`: the smaller count, or the
/// larger when it is under 1.5 times the smaller); no full layers: one
/// group of the other kind.
fn group_counts(full: u64, other: u64) -> (u64, u64, u64) {
    if full == 0 {
        return (0, 1, other.max(1));
    }
    if other == 0 {
        return (1, 0, full);
    }
    let (small, large) = (full.min(other), full.max(other));
    let size = if 2 * large < 3 * small { large } else { small };
    (full.div_ceil(size), other.div_ceil(size), size)
}

/// `VllmConfig.max_concurrent_batches`: async scheduling (on by default)
/// keeps 2 batches in flight without PP; with PP, the V1 model runner (the
/// one hybrid models run on) keeps PP of them.
fn vllm_max_concurrent_batches(launch: &Launch) -> u64 {
    match launch.pp {
        0 | 1 => 2,
        pp => u64::from(pp),
    }
}

/// vLLM 0.26.0 runs a model on its V2 model runner (`VllmConfig.
/// use_v2_model_runner`, config/vllm.py:550, `_is_default_v2_model_runner_model`
/// :605): a generating model that is not hybrid (linear-attention or Mamba
/// layers) and either not MoE or in `DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`
/// (:68). Every start of the corpus logged the runner this names.
pub(crate) fn vllm_v2_runner(model: &Model) -> bool {
    const DEFAULT_V2_MOE: [&str; 6] = [
        "DeepseekV2ForCausalLM",
        "GraniteMoeForCausalLM",
        "InklingForCausalLM",
        "InklingForConditionalGeneration",
        "LongcatFlashNgramForCausalLM",
        "Qwen2MoeForCausalLM",
    ];
    model.linear.is_none()
        && (model.mlp.moe.is_none() || DEFAULT_V2_MOE.contains(&model.architecture.as_str()))
}

/// The CUDA-graph memory vLLM 0.26.0 takes out of the KV budget: the V2
/// runner's `profile_cudagraph_memory` returns 0 (v1/worker/gpu/
/// model_runner.py:705), so its graphs come out of the margin the
/// utilization leaves (the corpus: Llama-3.1-8B at 0.5 got 23.49 GiB of KV
/// with graphs and without); the V1 runner's estimate is subtracted
/// (`determine_available_memory`); none with `--enforce-eager`.
///
/// The V1 runner's estimate (v1/worker/gpu_model_runner.py
/// `profile_cudagraph_memory`) captures the two largest graphs of each
/// mode of the default `FULL_AND_PIECEWISE` and extrapolates: the largest
/// first capture over the modes (they share one pool) plus, per mode,
/// (graphs − 1) × its second capture. Modelled:
/// - the graphs (config/vllm.py `_set_cudagraph_sizes`,
///   v1/cudagraph_dispatcher.py `initialize_cudagraph_keys`): the capture
///   sizes 1, 2, 4, 8 to 248 by 8, 256 up by 16, up to min(2 ×
///   max_num_seqs, 512, max_num_batched_tokens), and max_num_batched_tokens
///   when under that; PIECEWISE every size, FULL (uniform decode) the sizes
///   up to max_num_seqs;
/// - the first FULL capture: FlashAttention 3's split accumulators at the
///   largest FULL size `S`, `VLLM_FA3_GRAPH_SPLITS × S × heads ÷ TP ×
///   (v_head_dim + 1) × 4` bytes (MHA/GQA; the attention scratch of MLA
///   backends is not modelled);
/// - the first PIECEWISE capture (attention runs outside these graphs:
///   `_dummy_run` builds no attention metadata for them): the forward's
///   activations at the largest size, as in `vllm_activation_peak` (the
///   fused-MoE workspaces are the profile run's, kept);
/// - each further graph: `VLLM_FULL_GRAPH_BYTES`, and
///   `VLLM_PIECE_GRAPH_BYTES` per piece (a piece between two attention
///   layers: layers + 1 of them), the driver's (an ESTIMATE).
///
/// Not modelled: `--cudagraph-capture-sizes` and `-cc` (the defaults are
/// taken), speculative decoding's query length, the gated-delta-net and
/// MLA backends' graph buffers.
pub(crate) fn vllm_graph_reservation(launch: &Launch, model: &Model, gpu_total: u64) -> u64 {
    if launch.enforce_eager || vllm_v2_runner(model) {
        return 0;
    }
    let seqs = vllm_max_running_requests(launch, gpu_total);
    let tokens = vllm_max_num_batched_tokens(launch, gpu_total);
    let largest = seqs.saturating_mul(2).min(512).min(tokens).max(1);
    let mut sizes: Vec<u64> = [1, 2, 4]
        .into_iter()
        .filter(|size| *size <= largest)
        .collect();
    sizes.extend((8..=largest.min(255)).step_by(8));
    if largest >= 256 {
        sizes.extend((256..=largest).step_by(16));
    }
    if tokens <= largest {
        sizes.push(tokens);
    }
    sizes.sort_unstable();
    sizes.dedup();
    let full: Vec<u64> = sizes.iter().copied().filter(|size| *size <= seqs).collect();
    let tp = u64::from(launch.tp.max(1));
    let dtype = model.dtype_bytes.max(1);
    let mlp = model.mlp;
    let full_first = match (model.attention_vllm, full.last()) {
        (Attention::Mha { v_head_dim, .. }, Some(size)) => {
            VLLM_FA3_GRAPH_SPLITS * size * (mlp.heads / tp).max(1) * (v_head_dim + 1) * 4
        }
        _ => 0,
    };
    let piecewise_first = sizes.last().map_or(0, |size| {
        size * (3 * mlp.dense_width / tp + 4 * mlp.hidden) * dtype
    });
    let pieces = model.layers.div_ceil(u64::from(launch.pp.max(1))) + 1;
    let further = |graphs: usize, each: u64| (graphs.saturating_sub(1) as u64) * each;
    full_first.max(piecewise_first)
        + further(sizes.len(), pieces * VLLM_PIECE_GRAPH_BYTES)
        + further(full.len(), VLLM_FULL_GRAPH_BYTES)
}

/// ESTIMATE: the torch peak of vLLM 0.26.0's profile run
/// (`torch_peak_increase`, logged as "torch peak memory increase"):
/// `profile_run` runs the model on `max_num_batched_tokens` dummy tokens
/// T over R = min(T, max_num_seqs) requests (`_dummy_run`: `num_reqs =
/// min(num_tokens, self.max_num_reqs)`), then the sampler on the R last
/// hidden states. What is live at the peak, in the model dtype unless
/// said (TP divides the widths):
/// - the fused-MoE workspaces, kept by the workspace manager across the
///   run (fused_moe/modular_kernel.py:1105 `get_simultaneous`; the Triton
///   experts' shapes, experts/triton_moe.py:193: T·top_k·max(I, H) and
///   T·top_k·max(2I, H));
/// - then the larger of the forward pass and the sampler:
///   - forward: a dense MLP's `gate_up` output (T·2I) and its activation
///     (T·I) at once, with the residual stream (hidden states, residual,
///     normed input, the layer output: 4·T·H);
///   - sampler, V1 runner (gpu_model_runner.py `_dummy_sampler_run`,
///     run twice: the default path and, with a generator, the native one;
///     without FlashInfer both are `TopKTopPSampler.forward_native`): the
///     bf16 logits (`compute_logits`), their float32 copy (sample/
///     sampler.py `logits.to(torch.float32)`), the float32 probabilities
///     and exponential noise (ops/topk_topp_sampler.py `random_sample`),
///     R·V·(2 + 4 + 4 + 4) bytes; with R ≥ 8 rows the Triton top-k/top-p
///     kernel masks in place with a cached float32 buffer of
///     `min(next_pow2(min(SMs, R)), SMs)` rows (`apply_top_k_top_p_triton`,
///     `VLLM_SAMPLER_SMS`), under 8 PyTorch's sort adds the sorted values
///     and their int64 indices, two boolean masks and the sorted
///     probabilities (`apply_top_k_top_p_pytorch`: R·V·(4 + 8 + 1 + 1 + 4));
///     and live beside them, the profile forward's hidden states (T·H),
///     the gathered last ones and their `torch.rand_like` (2·R·H);
///   - sampler, V2 runner (gpu/model_runner.py:656): the logits, R·V·2;
///     its Triton sampling kernels work on them in place (not read line
///     by line: the corpus's Gemma-3-1B, whose 262K vocabulary makes the
///     sampler its peak, logged 0.55 GiB against this 0.50).
///
/// Not modelled: the allocator's rounding and fragmentation, the
/// torch.compile cache (Llama-3.1-8B logged 0.88 GiB on a cold compile
/// and 1.1 GiB on a cached one), attention scratch, the multimodal
/// encoder's profile (`skip_mm_profiling`).
pub(crate) fn vllm_activation_peak(launch: &Launch, model: &Model, gpu_total: u64) -> u64 {
    let tp = u64::from(launch.tp.max(1));
    let tokens = vllm_max_num_batched_tokens(launch, gpu_total);
    let requests = tokens.min(vllm_max_running_requests(launch, gpu_total));
    let dtype = model.dtype_bytes.max(1);
    let mlp = model.mlp;
    let workspace = mlp.moe.map_or(0, |(top_k, width)| {
        let width = width / tp;
        let hidden = mlp.hidden;
        tokens * top_k * (width.max(hidden) + (2 * width).max(hidden)) * dtype
    });
    let forward = tokens * (3 * mlp.dense_width / tp + 4 * mlp.hidden) * dtype;
    let sampler = if vllm_v2_runner(model) {
        requests * mlp.vocab * 2
    } else {
        let rows = requests * mlp.vocab;
        let top_k_top_p = if requests >= 8 {
            let programs = VLLM_SAMPLER_SMS.min(requests);
            programs.next_power_of_two().min(VLLM_SAMPLER_SMS) * mlp.vocab * 4
        } else {
            rows * (4 + 8 + 1 + 1 + 4)
        };
        rows * (2 + 4 + 4 + 4) + top_k_top_p + (tokens + 2 * requests) * mlp.hidden * dtype
    };
    workspace + forward.max(sampler)
}

/// vLLM: the weights a logged start loaded (`Model loading took`, per GPU
/// at the log's TP, `LoggedRun::tp_or`) at the command's TP: the sharded
/// part scales by the log's TP over the command's, what every rank holds
/// whole (`Model::replicated_bytes`, MLA's `q_a`/`kv_a`) stays. As in
/// `weights_per_gpu`: the KV projections vLLM replicates when TP exceeds
/// the KV heads, and the rotary caches, are taken as split.
pub(crate) fn vllm_weights_at_tp(
    logged_weights: u64,
    run: &super::calibrate::LoggedRun,
    launch: &Launch,
    model: &Model,
) -> u64 {
    let tp = u64::from(launch.tp.max(1));
    let from = run.tp_or(tp);
    if from == tp {
        return logged_weights;
    }
    let replicated = (model.replicated_bytes / u64::from(launch.pp.max(1))).min(logged_weights);
    let sharded = u128::from(logged_weights - replicated) * u128::from(from) / u128::from(tp);
    replicated.saturating_add(u64::try_from(sharded).unwrap_or(u64::MAX))
}

/// vLLM: the non-KV memory a logged start measured (its requested memory
/// less its `Available KV cache memory`: weights, activation peak,
/// non-torch memory and, on the V1 runner with graphs, the CUDA-graph
/// estimate), carried to the command's settings: the weights to the
/// command's TP (`vllm_weights_at_tp`); the activation peak moves by what
/// `vllm_activation_peak` gives at the command's batch limits and TP less
/// at the log's (`max_num_batched_tokens`, `max_num_seqs` and
/// `tensor_parallel_size`, from the log; the command's where it does not
/// say); the graph estimate the log took out (its logged one, else
/// `vllm_graph_reservation` of its `--enforce-eager`) is replaced by the
/// command's: none, the estimate, or with both on the logged one moved by
/// what the estimate moves. The KV dtype, the context length and the
/// utilization do not change it. The non-torch memory is the log's: at
/// another TP that is not foretold (NCCL's and the custom all-reduce's
/// buffers), and the report says so. `None` at another TP without the
/// logged weights (the estimates are used).
pub(crate) fn vllm_carried_non_kv(
    logged_non_kv: u64,
    logged_weights: Option<u64>,
    run: &super::calibrate::LoggedRun,
    launch: &Launch,
    model: &Model,
    gpu_total: u64,
) -> Option<u64> {
    let tp = u64::from(launch.tp.max(1));
    let mut logged = launch.clone();
    let weights_moved = match run.tp_or(tp) {
        from if from == tp => 0,
        from => {
            let weights = logged_weights?;
            logged.tp = u32::try_from(from).ok()?;
            i128::from(vllm_weights_at_tp(weights, run, launch, model)) - i128::from(weights)
        }
    };
    if let Some(tokens) = run.batched_tokens {
        logged.chunked_prefill_size = Some(tokens);
    }
    if run.args {
        logged.max_running_requests = run.max_num_seqs;
        logged.enforce_eager = run.enforce_eager;
    }
    let logged_estimate = i128::from(vllm_graph_reservation(&logged, model, gpu_total));
    let logged_graphs = run.graph_utilization.map_or(logged_estimate, |share| {
        (share * gpu_total as f64).round() as i128
    });
    let graphs = match (
        vllm_graph_reservation(launch, model, gpu_total),
        run.graph_utilization,
    ) {
        (0, _) => 0,
        (estimate, Some(_)) => logged_graphs + i128::from(estimate) - logged_estimate,
        (estimate, None) => i128::from(estimate),
    };
    let carried = i128::from(logged_non_kv) + weights_moved - logged_graphs
        + graphs
        + i128::from(vllm_activation_peak(launch, model, gpu_total))
        - i128::from(vllm_activation_peak(&logged, model, gpu_total));
    Some(carried.max(0) as u64)
}

/// `--max-num-batched-tokens`, else arg_utils' default for the API server:
/// 8192 on GPUs of 70 GiB or more, 2048 on smaller ones.
fn vllm_max_num_batched_tokens(launch: &Launch, gpu_total: u64) -> u64 {
    launch
        .chunked_prefill_size
        .unwrap_or(if gpu_total >= 70 * GIB { 8192 } else { 2048 })
}

/// The blocks one request of `length` tokens takes over the groups
/// (`FullAttentionSpec` / `SlidingWindowSpec.max_memory_usage_bytes` ÷ the
/// page): a full group ⌈⌈length ÷ DCP⌉ ÷ block⌉, a window group
/// ⌈min(window − 1 + in-flight, length) ÷ block⌉ + 1.
pub(crate) fn vllm_blocks_per_request(
    groups: Option<VllmGroups>,
    block: u32,
    dcp: u64,
    length: u64,
) -> u64 {
    let block = u64::from(block.max(1));
    let full = length.div_ceil(dcp.max(1)).div_ceil(block);
    match groups {
        None => full,
        Some(groups) => {
            let windowed = (groups.window.unwrap_or(0).saturating_sub(1))
                .saturating_add(groups.in_flight_tokens)
                .min(length)
                .div_ceil(block)
                + 1;
            groups.full_groups * full
                + groups.window_groups * windowed
                + groups.state_groups * groups.state_blocks.unwrap_or(full)
        }
    }
}

/// vLLM's running-request cap: `--max-num-seqs`, else arg_utils' default:
/// 1024 on GPUs of 70 GiB or more (256 on A100s and smaller GPUs; the GPU's
/// name is not known here), then at most max_num_batched_tokens (8192 for
/// the API server on those GPUs).
fn vllm_max_running_requests(launch: &Launch, gpu_total: u64) -> u64 {
    let large = gpu_total >= 70 * GIB;
    match launch.max_running_requests {
        Some(requests) => requests,
        None => {
            let default_seqs = if large { 1024 } else { 256 };
            default_seqs.min(vllm_max_num_batched_tokens(launch, gpu_total).max(1))
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct HostTier {
    /// Tokens the host pool of one rank holds.
    pub tokens_per_rank: u64,
    pub bytes_per_rank: u64,
    /// Over the ranks of this host (SGLang: every TP rank its own pool;
    /// vLLM: the `--kv-offloading-size` total).
    pub bytes_total: u64,
    /// MemAvailable − 10 GiB (SGLang's guard).
    pub budget: u64,
    pub fits: bool,
    /// SGLang 0.5.9 asserts the host pool is larger than the device pool
    /// ("The host memory should be larger than the device memory").
    pub larger_than_device: bool,
}

/// The host tier (HiCache / KV offloading), when enabled. SGLang 0.5.9
/// `HostKVCache`: per rank, `int(hicache_size·1e9 // size_per_token)`
/// (decimal GB) or `int(device_tokens × ratio)`, then `(size // page + 1)
/// × page`; MLA stored once per rank, so TP copies of the same tokens;
/// each rank checks `requested ≤ available − 10 GiB` on its own, so the
/// host needs the total. SGLang 0.5.23 with neither ratio nor size
/// (`hicache_auto_size.py` `auto_size_hicache`): the ratio is
/// `min(2.0, int(budget_rank × 0.8) × 0.95 ÷ device pool bytes)`, with
/// `budget_rank = (available − 10 GiB) // ranks on this host`
/// (`pool_host/base.py` `host_memory_budget_bytes`), and the pool checked
/// against that share (the device pool's page padding ignored). vLLM 0.26.0 native offload:
/// `--kv-offloading-size` GiB in total, each block stored for every worker
/// (`kv_bytes_per_block × world_size`, MLA included), chunk alignment
/// ignored; 0.33.0 stores a pure-MLA model's blocks once at TP > 1 with no
/// other parallelism (`Rules::vllm_mla_offload_single_copy`).
pub fn host_tier(
    launch: &Launch,
    model: &Model,
    device: &Device,
    host_available: u64,
) -> Option<HostTier> {
    let request = launch.host_tier?;
    let per_token = device.bytes_per_token.max(1);
    let ranks = u64::from(launch.gpu_count().max(1));
    let budget = host_available.saturating_sub(HOST_GUARD_BYTES);
    // SGLang 0.5.23's auto-sizing: what each rank of this host may take.
    let auto_budget = (request == HostTierRequest::SglangDefaultRatio
        && launch.rules.sglang_hicache_auto_size())
    .then(|| (budget / ranks) as f64 * SGLANG_HICACHE_HOST_MEMORY_FRACTION);
    let (tokens_per_rank, bytes_per_rank, bytes_total) = match request {
        HostTierRequest::SglangRatio(_)
        | HostTierRequest::SglangDefaultRatio
        | HostTierRequest::SglangSizeGb(_) => {
            let ratio = |ratio: f64| (device.tokens_per_rank as f64 * ratio) as u64;
            let size = match request {
                HostTierRequest::SglangSizeGb(gb) => {
                    ((gb as f64 * 1e9) / per_token as f64).floor() as u64
                }
                HostTierRequest::SglangRatio(given) => ratio(given),
                HostTierRequest::SglangDefaultRatio => match auto_budget {
                    Some(auto) => {
                        let device_bytes =
                            device.tokens_per_rank.saturating_mul(per_token).max(1) as f64;
                        ratio(SGLANG_HICACHE_RATIO.min(
                            auto.floor() * (1.0 - SGLANG_HICACHE_ALLOCATION_SLACK) / device_bytes,
                        ))
                    }
                    None => ratio(SGLANG_HICACHE_RATIO),
                },
                HostTierRequest::VllmOffloadGib(_) => 0,
            };
            let page = u64::from(device.page_size.max(1));
            let tokens = (size / page).saturating_add(1).saturating_mul(page);
            let bytes = tokens.saturating_mul(per_token);
            (tokens, bytes, bytes.saturating_mul(ranks))
        }
        HostTierRequest::VllmOffloadGib(gib) => {
            let total = (gib * GIB as f64) as u64;
            let world = u64::from((launch.tp * launch.pp).max(1));
            let single_copy = launch.rules.vllm_mla_offload_single_copy()
                && matches!(model.attention, Attention::Mla { .. })
                && launch.tp > 1
                && launch.pp == 1
                && launch.dcp == 1;
            let copies = if single_copy { 1 } else { world };
            let tokens = total / per_token.saturating_mul(copies);
            (
                tokens,
                total / world,
                total.saturating_mul(u64::from(launch.dp.max(1))),
            )
        }
    };
    Some(HostTier {
        tokens_per_rank,
        bytes_per_rank,
        bytes_total,
        budget,
        fits: match auto_budget {
            // Sized to fit: only a host with nothing left fails.
            Some(auto) => auto >= 1.0 && bytes_per_rank as f64 <= auto,
            None => bytes_total <= budget,
        },
        larger_than_device: tokens_per_rank > device.tokens_per_rank,
    })
}
