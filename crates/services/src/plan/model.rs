//! The model's `config.json`, found the way the engines find it (a local
//! directory or the Hugging Face cache), and what the KV arithmetic needs:
//! attention kind and shape, layers, dtype, context length, multimodal, the
//! quant config's KV dtype, and the checkpoint's size.
//!
//! Rules, from SGLang 0.5.9 (`configs/model_config.py`,
//! `utils/hf_transformers_utils.py`) and vLLM 0.26.0
//! (`transformers_utils/model_arch_config_convertor.py`,
//! `utils/torch_utils.py`):
//! - the text model's fields come from `text_config` when present
//!   (`get_hf_text_config`);
//! - MLA (SGLang): the architecture is in SGLang's MLA list and the text
//!   config has `kv_lora_rank`; MLA (vLLM): the text config's `model_type`
//!   is in vLLM's list and it has `kv_lora_rank`;
//! - `head_dim` defaults to `hidden_size / num_attention_heads`,
//!   `v_head_dim` to `head_dim`, `num_key_value_heads` to
//!   `num_attention_heads`;
//! - the context length is the first of `max_sequence_length`,
//!   `seq_length`, `max_seq_len`, `model_max_length`,
//!   `max_position_embeddings`, times the rope-scaling factor unless the
//!   scaling has `original_max_position_embeddings` or is `llama3`;
//! - the KV cache is FP8 under `--kv-cache-dtype auto` when a ModelOpt
//!   quant config says so (`kv_cache_quant_algo` / `kv_cache_scheme`).

use super::PlanError;
use super::launch::{Engine, Launch};
use super::version::Rules;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The largest config.json read (real ones are a few KiB).
const CONFIG_MAX: u64 = 4 << 20;
/// The largest `model.safetensors.index.json` read (Kimi-K2.5's is ~2 MiB).
const INDEX_MAX: u64 = 64 << 20;
/// The largest safetensors header read: the format's own limit (100 MB).
const HEADER_MAX: u64 = 100_000_000;
/// At most this many safetensors files are opened for their headers.
const SAFETENSORS_FILES_MAX: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Attention {
    Mla {
        kv_lora_rank: u64,
        qk_rope_head_dim: u64,
    },
    Mha {
        kv_heads: u64,
        head_dim: u64,
        v_head_dim: u64,
    },
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Model {
    pub config_path: PathBuf,
    /// `architectures[0]` of the top-level config.
    pub architecture: String,
    /// The attention as SGLang 0.5.9 sees it.
    pub attention: Attention,
    pub layers: u64,
    /// Bytes per element of the model dtype the engines run (2 for
    /// bfloat16 and float16; a float32 config also runs in 16 bits under
    /// `--dtype auto`).
    pub dtype_bytes: u64,
    /// The context length the engines derive from the config.
    pub max_position: Option<u64>,
    /// In SGLang's multimodal architecture list (its default mem fraction
    /// is lowered for these).
    pub multimodal: bool,
    pub kv_fp8_from_quant: bool,
    /// Total checkpoint bytes, from the safetensors index or headers, else
    /// estimated from the config's shapes (`weights_from_config`).
    pub weights_bytes: Option<u64>,
    /// Whether `weights_bytes` is `config_weights`' estimate: no index and
    /// no safetensors beside the config.
    pub weights_from_config: bool,
    /// The attention as vLLM 0.26.0 sees it (differs from `attention` only
    /// where the two engines' MLA lists differ).
    pub attention_vllm: Attention,
    /// The vision tower's (layers, hidden size), for SGLang's VLM factor.
    pub vision: Option<(u64, u64)>,
    /// `num_nextn_predict_layers` (MTP layers), not counted in `layers`.
    pub nextn_layers: u64,
    /// ESTIMATE: the attention projections' bytes over all layers, at the
    /// model dtype (2 bytes a weight; a checkpoint that quantizes attention
    /// holds less). DP attention divides these by attention-TP, not TP.
    pub attention_bytes: u64,
    /// ESTIMATE: the weights every TP rank holds whole, at the model dtype:
    /// MLA's `q_a` and `kv_a` projections (SGLang's `ReplicatedLinear`
    /// `fused_qkv_a_proj_with_mqa`), over all layers. 0 for MHA.
    pub replicated_bytes: u64,
    /// The layers vLLM 0.26.0 gives a sliding-window KV spec
    /// (`SlidingWindowSpec`); `None`: every layer full attention.
    pub window_vllm: Option<Window>,
    /// The layers SGLang 0.5.9 puts in its SWA pool (`is_hybrid_swa`);
    /// `None`: one full pool.
    pub window_sglang: Option<Window>,
    /// The window layers' own KV shape where it is not the full layers'
    /// (MiMo-V2-Flash's `swa_num_key_value_heads`, `swa_head_dim`,
    /// `swa_v_head_dim`: SGLang `get_swa_num_kv_heads`, `swa_head_dim`);
    /// `None`: the same shape.
    pub window_kv: Option<Attention>,
    /// Gated-delta-net (linear attention) layers, which hold a fixed state
    /// per request instead of KV; `None` for none.
    pub linear: Option<Linear>,
    /// DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5): an indexer
    /// key cache in every layer beside MLA's; `None` for none.
    pub sparse: Option<Sparse>,
    /// The shapes vLLM's profile run allocates by (`engine::vllm_activation_peak`).
    #[serde(skip)]
    pub mlp: Mlp,
}

/// What the activations of a forward pass and of the sampler are sized
/// by: `hidden_size`, `vocab_size`, the widest dense MLP (`intermediate_size`
/// of the dense layers, or the shared experts' width), and for MoE the
/// routed experts' `moe_intermediate_size`, `num_experts_per_tok` and count,
/// and the query heads (`num_attention_heads`) the attention scratch is
/// sized by. 0 where the config does not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mlp {
    pub hidden: u64,
    pub vocab: u64,
    pub dense_width: u64,
    /// `(top_k, expert width)`; `None` for a dense model.
    pub moe: Option<(u64, u64)>,
    pub heads: u64,
}

/// `Mlp` from the text config (the same fields `config_weights` reads).
fn mlp(text: &serde_json::Value) -> Mlp {
    let field = |name: &str| u64_field(text, name);
    let experts = field("n_routed_experts")
        .or_else(|| field("num_local_experts"))
        .or_else(|| field("num_experts"))
        .filter(|experts| *experts > 1);
    let dense = field("intermediate_size").unwrap_or(0);
    let moe = experts.map(|_| {
        let top_k = field("num_experts_per_tok").unwrap_or(1);
        (top_k, field("moe_intermediate_size").unwrap_or(dense))
    });
    // A MoE model's dense MLPs: DeepSeek's `first_k_dense_replace` layers
    // at `intermediate_size`, the shared experts otherwise.
    let dense_width = match moe {
        None => dense,
        Some((_, width)) => {
            let dense_layers = field("first_k_dense_replace").unwrap_or(0);
            let shared = field("shared_expert_intermediate_size")
                .or_else(|| field("n_shared_experts").map(|count| count * width))
                .unwrap_or(0);
            if dense_layers > 0 {
                dense.max(shared)
            } else {
                shared
            }
        }
    };
    Mlp {
        hidden: field("hidden_size").unwrap_or(0),
        vocab: field("vocab_size").unwrap_or(0),
        dense_width,
        moe,
        heads: field("num_attention_heads").unwrap_or(0),
    }
}

/// Layers that hold a fixed state per request instead of (or beside) KV:
/// linear attention and Mamba. How many hold a state, how many hold KV,
/// the state's shape, and the dtype of its temporal (SSM, recurrent) part
/// as each engine settles it. The conv part is the model dtype on vLLM
/// (`--mamba-cache-dtype auto`) and bfloat16 on SGLang
/// (`SGLANG_MAMBA_CONV_DTYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Linear {
    /// The layers holding a state.
    pub layers: u64,
    /// The layers holding KV: the full-attention layers (Nemotron-H's
    /// MLP-only layers hold neither; Falcon-H1's layers hold both; none for
    /// a pure Mamba model).
    pub attention_layers: u64,
    pub shape: StateShape,
    /// vLLM's temporal-state bytes under `--mamba-ssm-cache-dtype auto`
    /// (`VerifyAndUpdateConfig` of the model: Qwen3.5's `mamba_ssm_dtype`,
    /// Nemotron-H's `mamba_ssm_cache_dtype` else float32; KDA float32);
    /// `None`: the conv state's dtype (the model's).
    pub vllm_ssm_bytes: Option<u64>,
    /// SGLang's temporal-state bytes (`mamba2_state_dtype`: the config's
    /// `mamba_ssm_dtype`, else float32).
    pub sglang_ssm_bytes: u64,
    /// vLLM `ModelConfig.get_mamba_chunk_size`: `mamba_chunk_size`, else
    /// `chunk_size`, else 2048 (the block alignment of mamba cache mode
    /// `all`).
    pub chunk_size: u64,
    /// The MLP layers of a family whose layers are not each one MLP (or
    /// MoE after `first_k_dense_replace` dense ones); `None`: they are.
    pub mlp: Option<MlpLayers>,
}

/// ESTIMATE input (`config_weights`): which layers hold a dense MLP and
/// which a MoE block, and the matrices of each MLP or expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MlpLayers {
    pub dense: u64,
    pub moe: u64,
    /// 3 for a gated MLP (gate, up, down), 2 for Nemotron-H's relu²
    /// (`up_proj`, `down_proj`, vLLM 0.26.0 `nemotron_h.py`).
    pub matrices: u64,
}

/// The per-layer state of each family, as the engines shape it
/// (vLLM `MambaStateShapeCalculator`, SGLang `Mamba2StateShape.create` /
/// `KimiLinearStateShape.create`): a conv state of `conv_dim ÷ TP` ×
/// `(kernel − 1)` elements and a temporal state, both split over TP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum StateShape {
    /// Gated DeltaNet (Qwen3-Next, Qwen3.5): conv `k_dim·k_heads·2 +
    /// v_dim·v_heads`, recurrent `v_heads × v_dim × k_dim`. SGLang sizes it
    /// as Mamba2 with `n_groups` = the key heads (extra groups at a TP
    /// that does not divide them), vLLM without.
    GatedDeltaNet {
        k_heads: u64,
        v_heads: u64,
        k_dim: u64,
        v_dim: u64,
        conv_kernel: u64,
    },
    /// Mamba2 (Nemotron-H, Falcon-H1, Mamba2): conv `intermediate + 2 ×
    /// groups × state` (groups raised to TP when TP does not divide them:
    /// `extra_groups_for_head_shards`), temporal `heads × head_dim ×
    /// state`.
    Mamba2 {
        intermediate: u64,
        groups: u64,
        heads: u64,
        head_dim: u64,
        state_size: u64,
        conv_kernel: u64,
    },
    /// Mamba1 (Jamba, Mamba): conv `intermediate`, temporal `intermediate
    /// × state`.
    Mamba1 {
        intermediate: u64,
        state_size: u64,
        conv_kernel: u64,
    },
    /// Kimi Delta Attention (Kimi-Linear): conv `3 × heads × head_dim`,
    /// recurrent `heads × head_dim × head_dim`.
    Kda {
        heads: u64,
        head_dim: u64,
        conv_kernel: u64,
    },
}

/// `extra_groups_for_head_shards` (both engines): groups that TP does not
/// divide are raised to TP, so that each head shard holds its group.
fn sharded_groups(groups: u64, tp: u64) -> u64 {
    if groups.is_multiple_of(tp) {
        groups
    } else {
        tp
    }
}

impl StateShape {
    /// (conv elements, temporal elements) of one layer on one of `tp`
    /// ranks, as vLLM 0.26.0 shapes them (`divide` is exact in the engine;
    /// integer division here).
    fn vllm_elements(&self, tp: u64) -> (u64, u64) {
        match *self {
            StateShape::GatedDeltaNet {
                k_heads,
                v_heads,
                k_dim,
                v_dim,
                conv_kernel,
            } => (
                (k_dim * k_heads * 2 + v_dim * v_heads) / tp * conv_kernel.saturating_sub(1),
                v_heads / tp * v_dim * k_dim,
            ),
            StateShape::Mamba2 {
                intermediate,
                groups,
                heads,
                head_dim,
                state_size,
                conv_kernel,
            } => mamba2_elements(
                intermediate,
                groups,
                heads,
                head_dim,
                state_size,
                conv_kernel,
                tp,
            ),
            StateShape::Mamba1 {
                intermediate,
                state_size,
                conv_kernel,
            } => (
                intermediate / tp * conv_kernel.saturating_sub(1),
                intermediate / tp * state_size,
            ),
            StateShape::Kda {
                heads,
                head_dim,
                conv_kernel,
            } => (
                3 * heads * head_dim / tp * conv_kernel.saturating_sub(1),
                heads / tp * head_dim * head_dim,
            ),
        }
    }

    /// The same as SGLang 0.5.9 shapes them: gated DeltaNet through
    /// `Mamba2StateShape.create` (so with extra groups); KDA's three conv
    /// states split one by one.
    fn sglang_elements(&self, tp: u64) -> (u64, u64) {
        match *self {
            StateShape::GatedDeltaNet {
                k_heads,
                v_heads,
                k_dim,
                v_dim,
                conv_kernel,
            } => mamba2_elements(
                v_dim * v_heads,
                k_heads,
                v_heads,
                v_dim,
                k_dim,
                conv_kernel,
                tp,
            ),
            StateShape::Kda {
                heads,
                head_dim,
                conv_kernel,
            } => (
                3 * (heads * head_dim / tp) * conv_kernel.saturating_sub(1),
                heads / tp * head_dim * head_dim,
            ),
            _ => self.vllm_elements(tp),
        }
    }
}

/// Mamba2's (conv, temporal) elements on one of `tp` ranks
/// (`mamba2_state_shape`, `Mamba2StateShape.create`).
fn mamba2_elements(
    intermediate: u64,
    groups: u64,
    heads: u64,
    head_dim: u64,
    state_size: u64,
    conv_kernel: u64,
    tp: u64,
) -> (u64, u64) {
    let conv_dim = intermediate + 2 * sharded_groups(groups, tp) * state_size;
    (
        conv_dim / tp * conv_kernel.saturating_sub(1),
        heads / tp * head_dim * state_size,
    )
}

impl Linear {
    /// ESTIMATE: one state layer's weights, counted in 16-bit weights
    /// (float32 parameters as two), from vLLM 0.26.0's layers:
    /// - gated DeltaNet (`layers/mamba/gdn/qwen_gdn_linear_attn.py`):
    ///   `in_proj_qkvz` hidden × (2·key_dim + 2·value_dim), `in_proj_ba`
    ///   hidden × 2·v_heads, `conv1d` (2·key_dim + value_dim) × kernel,
    ///   `dt_bias` and float32 `A_log` v_heads, the gated norm v_dim,
    ///   `out_proj` value_dim × hidden (key_dim = k_heads·k_dim,
    ///   value_dim = v_heads·v_dim);
    /// - Mamba2 (`layers/mamba/mamba_mixer2.py`): `in_proj` hidden ×
    ///   (intermediate + conv_dim + heads), `conv1d` conv_dim × kernel,
    ///   `A`, `D`, `dt_bias` heads (float32), the gated norm intermediate,
    ///   `out_proj` intermediate × hidden (conv_dim = intermediate + 2 ×
    ///   groups × state);
    /// - Mamba1 (`layers/mamba/mamba_mixer.py`): `in_proj` hidden × 2I,
    ///   `conv1d` I × kernel, `x_proj` I × (dt_rank + 2·state), `dt_proj`
    ///   dt_rank × I, float32 `A` I × state, `D` I, `out_proj` I × hidden,
    ///   dt_rank ⌈hidden / 16⌉;
    /// - KDA (`layers/kda.py`): q, k, v and o projections hidden ×
    ///   heads·head_dim, `conv1d` 3·heads·head_dim × kernel, the decay and
    ///   gate low-rank pairs 2 × (hidden + heads)·head_dim, `b_proj` hidden
    ///   × heads.
    ///
    /// Biases and norms beside these are left out.
    pub(crate) fn weights(&self, hidden: u64) -> u64 {
        let sum = |terms: &[u64]| {
            terms
                .iter()
                .fold(0u64, |sum, term| sum.saturating_add(*term))
        };
        match self.shape {
            StateShape::GatedDeltaNet {
                k_heads,
                v_heads,
                k_dim,
                v_dim,
                conv_kernel,
            } => {
                let key_dim = k_heads.saturating_mul(k_dim);
                let value_dim = v_heads.saturating_mul(v_dim);
                sum(&[
                    hidden.saturating_mul(2 * key_dim + 2 * value_dim),
                    hidden.saturating_mul(2 * v_heads),
                    (2 * key_dim + value_dim).saturating_mul(conv_kernel),
                    3 * v_heads + v_dim,
                    value_dim.saturating_mul(hidden),
                ])
            }
            StateShape::Mamba2 {
                intermediate,
                groups,
                heads,
                state_size,
                conv_kernel,
                ..
            } => {
                let conv_dim = intermediate.saturating_add(2 * groups * state_size);
                sum(&[
                    hidden.saturating_mul(intermediate + conv_dim + heads),
                    conv_dim.saturating_mul(conv_kernel),
                    6 * heads + intermediate,
                    intermediate.saturating_mul(hidden),
                ])
            }
            StateShape::Mamba1 {
                intermediate,
                state_size,
                conv_kernel,
            } => {
                let dt_rank = hidden.div_ceil(16);
                sum(&[
                    hidden.saturating_mul(2 * intermediate),
                    intermediate.saturating_mul(conv_kernel),
                    intermediate.saturating_mul(dt_rank + 2 * state_size),
                    dt_rank.saturating_mul(intermediate),
                    2 * intermediate * state_size + intermediate,
                    intermediate.saturating_mul(hidden),
                ])
            }
            StateShape::Kda {
                heads,
                head_dim,
                conv_kernel,
            } => {
                let width = heads.saturating_mul(head_dim);
                sum(&[
                    4 * hidden.saturating_mul(width),
                    (3 * width).saturating_mul(conv_kernel),
                    2 * (hidden + width).saturating_mul(head_dim),
                    hidden.saturating_mul(heads),
                ])
            }
        }
    }

    /// vLLM's state bytes of one layer per request on one of `tp` ranks
    /// (`MambaSpec.page_size_bytes` before padding): the conv state at
    /// `conv_bytes` an element, the temporal state at `ssm_bytes`
    /// (`engine::vllm_state_bytes` settles both).
    pub(crate) fn state_bytes(&self, tp: u64, conv_bytes: u64, ssm_bytes: u64) -> u64 {
        let (conv, temporal) = self.shape.vllm_elements(tp.max(1));
        conv * conv_bytes + temporal * ssm_bytes
    }

    /// SGLang's state bytes per request over every state layer
    /// (`BaseLinearStateParams.mamba_cache_per_req`), on one of
    /// `attention_tp` ranks, the conv state at `conv_bytes` an element
    /// (`SGLANG_MAMBA_CONV_DTYPE`, bfloat16) and the temporal one at
    /// `ssm_bytes` (`engine::sglang_state_slots` settles both).
    pub(crate) fn sglang_state_bytes(
        &self,
        attention_tp: u64,
        conv_bytes: u64,
        ssm_bytes: u64,
    ) -> u64 {
        let (conv, temporal) = self.shape.sglang_elements(attention_tp.max(1));
        (conv * conv_bytes + temporal * ssm_bytes) * self.layers
    }
}

/// DeepSeek sparse attention's indexer (`index_topk` in the config of
/// `DeepseekV32ForCausalLM`, `GlmMoeDsaForCausalLM`, or
/// `DeepseekV3ForCausalLM`): every layer keeps, beside its MLA latent, one
/// indexer key per token of `index_head_dim` FP8 bytes and a float32 scale
/// per 128 of them, `index_head_dim + index_head_dim / 128 × 4` bytes
/// (vLLM 0.26.0 `deepseek_v2.py` `Indexer`: `DeepseekV32IndexerCache(head_dim
/// = head_dim + head_dim // quant_block_size * 4, dtype=torch.uint8)`;
/// SGLang 0.5.9 `get_cell_size_per_token`: `NSATokenToKVPool.quant_block_size`
/// 128, `index_k_with_scale_buffer_dtype` uint8), replicated on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Sparse {
    pub index_head_dim: u64,
}

impl Sparse {
    /// The indexer's bytes per token in one layer.
    pub(crate) fn indexer_bytes(self) -> u64 {
        const QUANT_BLOCK: u64 = 128;
        self.index_head_dim + self.index_head_dim / QUANT_BLOCK * 4
    }
}

/// Sliding-window (or chunked local) attention layers, as one engine sizes
/// them: how many of the layers, and the window in tokens. The other
/// layers are full attention with the same KV shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Window {
    pub layers: u64,
    pub tokens: u64,
}

impl Model {
    /// The attention as the given engine sees it.
    pub(crate) fn attention_for(&self, engine: Engine) -> Attention {
        match engine {
            Engine::Sglang => self.attention,
            Engine::Vllm => self.attention_vllm,
        }
    }

    /// The sliding-window layers as the given engine sizes them.
    pub(crate) fn window_for(&self, engine: Engine) -> Option<Window> {
        match engine {
            Engine::Sglang => self.window_sglang,
            Engine::Vllm => self.window_vllm,
        }
    }
}

/// Refuses, by name, a linear-attention or Mamba model the command's
/// engine at the version whose rules apply does not serve, or serves by
/// rules plan does not model (`check_engine`'s first check). Read from
/// each release's model registry:
/// - SGLang 0.5.9 has no Jamba, Mamba or Mamba2 model (`srt/models/` has
///   none of them); 0.5.23 has Mamba and Mamba2 (`models/mamba.py`,
///   `mamba2.py`), whose state-only pool plan does not model, and no
///   Jamba.
fn refuse_unserved(launch: &Launch, model: &Model) -> Result<(), PlanError> {
    let why = match (launch.engine, model.architecture.as_str()) {
        (Engine::Sglang, "JambaForCausalLM") => {
            "SGLang has no Jamba model (no srt/models/jamba.py in 0.5.9 or 0.5.23); vLLM serves it"
        }
        (Engine::Sglang, "MambaForCausalLM" | "Mamba2ForCausalLM")
            if matches!(launch.rules, Rules::Sglang0_5_9 | Rules::Sglang0_5_14) =>
        {
            "SGLang 0.5.9 and 0.5.14 have no pure Mamba model (srt/models/mamba.py and mamba2.py arrive in later releases); vLLM serves it"
        }
        (Engine::Sglang, "MambaForCausalLM" | "Mamba2ForCausalLM") => {
            "the state-only pool of a model without attention layers (srt/models/mamba.py, mamba2.py) is not modelled for SGLang"
        }
        _ => return Ok(()),
    };
    let name = match launch.engine {
        Engine::Sglang => "SGLang",
        Engine::Vllm => "vLLM",
    };
    Err(PlanError::NotServed {
        architecture: model.architecture.clone(),
        engine: format!("{name} {}", launch.rules.version()),
        why,
    })
}

/// SGLang 0.5.9 `_derive_model_shapes`: architectures whose attention is
/// MLA (read from the text config; MiniCPM3 and KimiLinear from the top
/// level). `DeepseekVL2ForCausalLM` is MLA unless `use_mla` is false.
const SGLANG_MLA: &[&str] = &[
    "DeepseekV2ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV3ForCausalLMNextN",
    "Glm4MoeLiteForCausalLM",
    "GlmMoeDsaForCausalLM",
    "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN",
    "DotsVLMForCausalLM",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
    "MistralLarge3ForCausalLMEagle",
    "KimiK25ForConditionalGeneration",
    "MiniCPM3ForCausalLM",
    "DeepseekVL2ForCausalLM",
    "KimiVLForConditionalGeneration",
    "BailingMoeV2_5ForCausalLM",
    "BailingMoeForCausalLMNextN",
    "KimiLinearForCausalLM",
];

/// vLLM 0.26.0 `is_deepseek_mla`: text-config model types that are MLA
/// when `kv_lora_rank` is set.
const VLLM_MLA: &[&str] = &[
    "axk1",
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
    "deepseek_mtp",
    "glm_moe_dsa",
    "glm4_moe_lite",
    "glm4_moe_lite_mtp",
    "kimi_k2",
    "kimi_linear",
    "longcat_flash",
    "longcat_flash_ngram",
    "pangu_ultra_moe",
    "pangu_ultra_moe_mtp",
];

/// Architectures whose KV cache is not one uniform full-attention pool
/// and whose pools `plan` does not model: refused by name.
const HYBRID: &[&str] = &[
    // Ling 2.5: MLA layers beside lightning linear-attention layers (both
    // engines load it from `bailing_moe_linear.py`), not the DSA indexer.
    "BailingMoeV2_5ForCausalLM",
];

/// SGLang 0.5.9 `multimodal_model_archs`, less the architectures whose
/// multimodal side it turns off unless `--enable-multimodal` (Gemma3,
/// Llama4, Step3VL).
const SGLANG_MULTIMODAL: &[&str] = &[
    "CLIPModel",
    "DeepseekVL2ForCausalLM",
    "Ernie4_5_VLMoeForConditionalGeneration",
    "Gemma3nForConditionalGeneration",
    "Glm4vForConditionalGeneration",
    "Glm4vMoeForConditionalGeneration",
    "GlmAsrForConditionalGeneration",
    "Grok1VForCausalLM",
    "Grok1AForCausalLM",
    "LlavaLlamaForCausalLM",
    "Llama4ForConditionalGeneration",
    "LlavaMistralForCausalLM",
    "LlavaQwenForCausalLM",
    "LlavaForConditionalGeneration",
    "LlavaVidForCausalLM",
    "LightOnOCRForConditionalGeneration",
    "MiniCPMO",
    "MiniCPMV",
    "Mistral3ForConditionalGeneration",
    "MultiModalityCausalLM",
    "MllamaForConditionalGeneration",
    "NemotronH_Nano_VL_V2",
    "PixtralForConditionalGeneration",
    "Qwen2AudioForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3OmniMoeForConditionalGeneration",
    "KimiVLForConditionalGeneration",
    "InternVLChatModel",
    "InternS1ForConditionalGeneration",
    "InternS1ProForConditionalGeneration",
    "Phi4MMForCausalLM",
    "POINTSV15ChatModel",
    "DotsVLMForCausalLM",
    "DotsOCRForCausalLM",
    "Sarashina2VisionForCausalLM",
    "NVILAForConditionalGeneration",
    "NVILALiteForConditionalGeneration",
    "DeepseekOCRForCausalLM",
    "JetVLMForConditionalGeneration",
    "PaddleOCRVLForConditionalGeneration",
    "MiDashengLMModel",
    "StepVLForConditionalGeneration",
    "KimiK25ForConditionalGeneration",
];

/// Finds and reads the model's config (`--model-config` when given).
#[cfg(test)]
pub(crate) fn locate(
    model: &str,
    override_config: Option<&Path>,
    env: &BTreeMap<String, String>,
) -> Result<Model, PlanError> {
    locate_at(model, None, None, override_config, env)
}

/// `locate` with what the launch says about where the engine reads the
/// model from (`--revision`, vLLM's `--download-dir`) and the engine's
/// own environment (its `HF_HOME` and friends).
pub(crate) fn locate_for(
    launch: &Launch,
    override_config: Option<&Path>,
) -> Result<Model, PlanError> {
    let model = locate_at(
        &launch.model,
        launch.revision.as_deref(),
        launch.download_dir.as_deref().map(Path::new),
        override_config,
        &launch.env,
    )?;
    Ok(model)
}

/// The Hugging Face hub cache directories, in the order huggingface_hub
/// reads them: `HF_HUB_CACHE` (or the older `HUGGINGFACE_HUB_CACHE`), else
/// `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`, else
/// `~/.cache/huggingface/hub`.
pub(crate) fn hub_caches(env: &BTreeMap<String, String>) -> Vec<PathBuf> {
    let set = |name: &str| env.get(name).filter(|value| !value.is_empty());
    if let Some(hub) = set("HF_HUB_CACHE").or_else(|| set("HUGGINGFACE_HUB_CACHE")) {
        return vec![PathBuf::from(hub)];
    }
    if let Some(home) = set("HF_HOME") {
        return vec![Path::new(home).join("hub")];
    }
    if let Some(cache) = set("XDG_CACHE_HOME") {
        return vec![Path::new(cache).join("huggingface").join("hub")];
    }
    match set("HOME") {
        Some(home) => vec![Path::new(home).join(".cache/huggingface/hub")],
        None => vec![PathBuf::from("/root/.cache/huggingface/hub")],
    }
}

pub(crate) fn locate_at(
    model: &str,
    revision: Option<&str>,
    download_dir: Option<&Path>,
    override_config: Option<&Path>,
    env: &BTreeMap<String, String>,
) -> Result<Model, PlanError> {
    if let Some(path) = override_config {
        // A directory given to --model-config means its config.json.
        let path = match std::fs::metadata(path) {
            Ok(metadata) if metadata.is_dir() => path.join("config.json"),
            _ => path.to_path_buf(),
        };
        return read_model(&path);
    }
    let mut looked = Vec::new();
    let local = Path::new(model);
    if std::fs::metadata(local).is_ok_and(|metadata| metadata.is_dir()) {
        let path = local.join("config.json");
        if std::fs::symlink_metadata(&path).is_ok() {
            return read_model(&path);
        }
        looked.push(path);
        return Err(PlanError::ModelNotFound {
            model: model.to_string(),
            looked,
        });
    }
    let mut caches = Vec::new();
    if let Some(dir) = download_dir {
        caches.push(dir.to_path_buf());
    }
    caches.extend(hub_caches(env));
    // A repository id is ORG/NAME (or NAME); anything else is a path that
    // does not exist.
    let is_repo_id = !model.is_empty()
        && !model.starts_with('/')
        && !model.starts_with('.')
        && model.split('/').count() <= 2
        && model.split('/').all(|part| !part.is_empty());
    if is_repo_id {
        for cache in caches {
            let repo = cache.join(format!("models--{}", model.replace('/', "--")));
            match snapshot_config(&repo, revision)? {
                Ok(path) => return read_model(&path),
                Err(path) => looked.push(path),
            }
        }
    } else {
        looked.push(local.to_path_buf());
    }
    Err(PlanError::ModelNotFound {
        model: model.to_string(),
        looked,
    })
}

/// `REPO/snapshots/<rev>/config.json`, the revision from `refs/<name>`
/// (`main` by default) or a commit hash; with no ref and one snapshot,
/// that one. `Ok(Err(path))`: not there, `path` is where it looked. A ref
/// that cannot be read or names no commit, a revision that climbs out of
/// the repository (`../..`), a repository that cannot be read, and a
/// config that leads outside the repository (a link to elsewhere) are
/// errors naming them: never read silently in its place.
fn snapshot_config(
    repo: &Path,
    revision: Option<&str>,
) -> Result<Result<PathBuf, PathBuf>, PlanError> {
    match std::fs::symlink_metadata(repo) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Err(repo.to_path_buf()));
        }
        Err(error) => return Err(unreadable(repo, error)),
        Ok(_) => {}
    }
    let plain = |name: &str| {
        !name.is_empty()
            && Path::new(name)
                .components()
                .all(|part| matches!(part, std::path::Component::Normal(_)))
    };
    if let Some(revision) = revision.filter(|revision| !plain(revision)) {
        return Err(PlanError::BadValue {
            flag: "--revision".to_string(),
            value: revision.to_string(),
            why: "not a branch, tag or commit of the repository".to_string(),
        });
    }
    let name = revision.unwrap_or("main");
    let reference = repo.join("refs").join(name);
    let commit = match std::fs::symlink_metadata(&reference) {
        Ok(_) => {
            let (_, bytes) = crate::file::read_regular(&reference, 4096)
                .map_err(|why| unreadable(&reference, why))?;
            let text = String::from_utf8_lossy(&bytes).trim().to_string();
            // A commit hash (40 hex digits for git, 64 for some hubs).
            if text.is_empty()
                || text.len() > 64
                || !text.chars().all(|c| c.is_ascii_alphanumeric())
            {
                // Not quoted: the file may be anything (a link elsewhere).
                return Err(unreadable(&reference, "names no commit"));
            }
            text
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => match revision {
            Some(revision) => revision.to_string(),
            None => {
                let snapshots = repo.join("snapshots");
                let mut names = match std::fs::read_dir(&snapshots) {
                    Ok(entries) => entries
                        .filter_map(Result::ok)
                        .map(|entry| entry.file_name().to_string_lossy().into_owned())
                        .take(2)
                        .collect::<Vec<_>>(),
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                    Err(error) => return Err(unreadable(&snapshots, error)),
                };
                if names.len() != 1 {
                    return Ok(Err(reference));
                }
                names.remove(0)
            }
        },
        Err(error) => return Err(unreadable(&reference, error)),
    };
    let path = repo.join("snapshots").join(&commit).join("config.json");
    match std::fs::metadata(&path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Err(path)),
        Err(error) => return Err(unreadable(&path, error)),
        Ok(_) => {}
    }
    // The hub's own links (snapshots/REV/config.json → ../../blobs/HASH)
    // stay inside the repository; one that leads elsewhere is not read.
    let real = std::fs::canonicalize(&path).map_err(|error| unreadable(&path, error))?;
    let real_repo = std::fs::canonicalize(repo).map_err(|error| unreadable(repo, error))?;
    if !real.starts_with(&real_repo) {
        return Err(unreadable(
            &path,
            format!(
                "leads outside the cache's repository, to {}: not read (give --model-config PATH to read that file)",
                real.display()
            ),
        ));
    }
    Ok(Ok(path))
}

fn unreadable(path: &Path, why: impl ToString) -> PlanError {
    PlanError::Unreadable {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

fn read_json(path: &Path, max: u64) -> Result<serde_json::Value, PlanError> {
    let (_, bytes) = crate::file::read_regular(path, max).map_err(|why| unreadable(path, why))?;
    serde_json::from_slice(&bytes).map_err(|error| unreadable(path, format!("not JSON: {error}")))
}

fn read_model(path: &Path) -> Result<Model, PlanError> {
    let config = read_json(path, CONFIG_MAX)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    check_numbers(path, &config)?;
    let mut model = parse_config(path, &config)?;
    if !model.kv_fp8_from_quant
        && let Ok(quant) = read_json(&dir.join("hf_quant_config.json"), CONFIG_MAX)
    {
        model.kv_fp8_from_quant = modelopt_kv_fp8(&quant);
    }
    model.weights_bytes = weights(dir)?;
    if model.weights_bytes.is_none() {
        model.weights_bytes = config_weights(&config, &model);
        model.weights_from_config = model.weights_bytes.is_some();
    }
    Ok(model)
}

fn u64_field(config: &serde_json::Value, name: &str) -> Option<u64> {
    let value = config.get(name)?;
    value.as_u64().or_else(|| {
        value
            .as_f64()
            // 2^64 and above would saturate to u64::MAX: not the file's value.
            .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 18_446_744_073_709_551_616.0)
            .map(|f| f as u64)
    })
}

/// The numeric fields of a text (or vision) config the arithmetic reads,
/// each with the values a real model can have. A field given as a string,
/// a negative, a fraction, `1e308` or far beyond any model is refused by
/// name (rather than read as absent, which would put the engine's default
/// in its place, or multiplied into an overflow); `null` is absent, as the
/// engines read it.
const NUMBERS: &[(&str, u64, u64)] = &[
    ("num_hidden_layers", 1, 1 << 12),
    ("num_attention_heads", 1, 1 << 16),
    ("num_key_value_heads", 1, 1 << 16),
    ("num_attention_groups", 1, 1 << 16),
    ("hidden_size", 1, 1 << 20),
    ("head_dim", 1, 1 << 16),
    ("v_head_dim", 1, 1 << 16),
    ("qk_rope_head_dim", 1, 1 << 16),
    ("qk_nope_head_dim", 0, 1 << 16),
    ("kv_lora_rank", 1, 1 << 20),
    ("q_lora_rank", 0, 1 << 20),
    ("num_nextn_predict_layers", 0, 1 << 12),
    ("max_sequence_length", 1, 1 << 40),
    ("seq_length", 1, 1 << 40),
    ("max_seq_len", 1, 1 << 40),
    ("model_max_length", 1, 1 << 40),
    ("max_position_embeddings", 1, 1 << 40),
    // 0: no window (vLLM reads 0 as None).
    ("sliding_window", 0, 1 << 40),
    ("sliding_window_pattern", 1, 1 << 12),
    ("attention_chunk_size", 1, 1 << 40),
    ("full_attention_interval", 1, 1 << 12),
    ("linear_num_key_heads", 1, 1 << 16),
    ("linear_num_value_heads", 1, 1 << 16),
    ("linear_key_head_dim", 1, 1 << 16),
    ("linear_value_head_dim", 1, 1 << 16),
    ("linear_conv_kernel_dim", 1, 1 << 10),
    ("mamba_num_heads", 1, 1 << 16),
    ("mamba_head_dim", 1, 1 << 16),
    ("n_groups", 1, 1 << 16),
    ("ssm_state_size", 1, 1 << 16),
    ("conv_kernel", 1, 1 << 10),
    ("mamba_n_heads", 1, 1 << 16),
    ("mamba_n_groups", 1, 1 << 16),
    ("mamba_d_ssm", 1, 1 << 20),
    ("mamba_d_state", 1, 1 << 16),
    ("mamba_d_conv", 1, 1 << 10),
    ("mamba_expand", 1, 1 << 6),
    ("expand", 1, 1 << 6),
    ("state_size", 1, 1 << 16),
    ("num_heads", 1, 1 << 16),
    ("attn_layer_period", 1, 1 << 12),
    ("attn_layer_offset", 0, 1 << 12),
    ("expert_layer_period", 1, 1 << 12),
    ("expert_layer_offset", 0, 1 << 12),
    ("mamba_chunk_size", 1, 1 << 20),
    ("chunk_size", 1, 1 << 20),
    ("sliding_window_size", 0, 1 << 40),
    ("swa_num_key_value_heads", 1, 1 << 16),
    ("swa_head_dim", 1, 1 << 16),
    ("swa_v_head_dim", 1, 1 << 16),
    ("index_head_dim", 1, 1 << 16),
    ("index_n_heads", 1, 1 << 16),
];

/// The largest rope-scaling factor taken (real ones are up to a few hundred).
const ROPE_FACTOR_MAX: f64 = 1e6;

/// Refuses a config whose numbers no model has (`NUMBERS`), in the text
/// config (top level and `text_config`) and the vision config.
fn check_numbers(path: &Path, config: &serde_json::Value) -> Result<(), PlanError> {
    let sections = [
        Some(config),
        config.get("text_config").filter(|text| text.is_object()),
        config
            .get("vision_config")
            .filter(|vision| vision.is_object()),
    ];
    for (section, (name, low, high)) in sections
        .into_iter()
        .flatten()
        .flat_map(|section| NUMBERS.iter().map(move |number| (section, number)))
    {
        let Some(value) = section.get(*name).filter(|value| !value.is_null()) else {
            continue;
        };
        if !u64_field(section, name).is_some_and(|number| (*low..=*high).contains(&number)) {
            return Err(unreadable(
                path,
                format!(
                    "\"{name}\" is {}: not a whole number from {low} to {high}",
                    crate::units::short(&value.to_string(), 40)
                ),
            ));
        }
    }
    for section in sections.into_iter().flatten() {
        for scaling in ["rope_scaling", "rope_parameters"] {
            let Some(factor) = section.get(scaling).and_then(|s| s.get("factor")) else {
                continue;
            };
            if !factor.is_null()
                && !factor
                    .as_f64()
                    .is_some_and(|factor| factor > 0.0 && factor <= ROPE_FACTOR_MAX)
            {
                return Err(unreadable(
                    path,
                    format!(
                        "{scaling}.factor is {}: not a number above 0 and at most {ROPE_FACTOR_MAX}",
                        crate::units::short(&factor.to_string(), 40)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The attention of a model with no attention layer: no KV head.
const NO_ATTENTION: Attention = Attention::Mha {
    kv_heads: 0,
    head_dim: 0,
    v_head_dim: 0,
};

/// The fields the arithmetic needs, from a parsed config.json.
pub(crate) fn parse_config(path: &Path, config: &serde_json::Value) -> Result<Model, PlanError> {
    if !config.is_object() {
        return Err(unreadable(path, "not a JSON object"));
    }
    let architectures = architectures(path, config)?;
    let architecture = architectures[0].to_string();
    let text = config
        .get("text_config")
        .filter(|text| text.is_object())
        .unwrap_or(config);
    let layers = u64_field(text, "num_hidden_layers").ok_or_else(|| PlanError::MissingField {
        path: path.to_path_buf(),
        field: "num_hidden_layers",
    })?;
    let linear = linear(path, text, &architectures, layers)?;
    // A model without attention layers (Mamba) holds no KV: its attention
    // is of zero width.
    let (attention, attention_vllm) = match linear {
        Some(linear) if linear.attention_layers == 0 => (NO_ATTENTION, NO_ATTENTION),
        _ => attentions(path, text, &architectures)?,
    };
    let dtype_bytes = dtype_bytes(path, config, text)?;
    let quant = text
        .get("quantization_config")
        .or_else(|| config.get("quantization_config"));
    let kv_fp8_from_quant = quant.is_some_and(modelopt_kv_fp8);
    let multimodal = architectures
        .iter()
        .any(|name| SGLANG_MULTIMODAL.contains(name));
    let vision = vision(config, &architecture);
    let (window_vllm, window_sglang) = windows(path, text, &architectures, layers)?;
    let window_kv = window_kv(text, &architectures, attention);
    let (attention_bytes, replicated_bytes) = attention_weights(text, attention, layers, linear);
    let sparse = sparse(path, text, &architectures, attention, attention_vllm)?;
    let indexer = sparse.map_or(0, |sparse| indexer_weights(text, sparse, layers));
    let (attention_bytes, replicated_bytes) = (
        attention_bytes.saturating_add(indexer),
        replicated_bytes.saturating_add(indexer),
    );
    Ok(Model {
        config_path: path.to_path_buf(),
        architecture,
        attention,
        layers,
        dtype_bytes,
        max_position: context_length(text),
        multimodal,
        kv_fp8_from_quant,
        weights_bytes: None,
        weights_from_config: false,
        attention_vllm,
        vision,
        nextn_layers: u64_field(text, "num_nextn_predict_layers").unwrap_or(0),
        attention_bytes,
        replicated_bytes,
        window_vllm,
        window_sglang,
        window_kv,
        linear,
        sparse,
        mlp: mlp(text),
    })
}

/// Refuses, by name, what plan does not model for the engine asked: a
/// linear-attention or Mamba model the engine does not serve
/// (`refuse_unserved`); MiMo-V2-Flash on vLLM, which runs K and V of different sizes on its
/// DiffKV backends (`mimo_v2.py`) and whose window layers' pages differ
/// from the full layers' (`window_kv`), so vLLM 0.26.0 scales one kind's
/// block size to unify them (`kv_cache_utils.py`
/// `unify_kv_cache_spec_page_size`); and a
/// sparse-attention model the engine would not start with the KV dtype
/// asked:
/// - SGLang asserts its KV dtype is bf16 or fp8_e4m3 (0.5.9
///   `_set_default_nsa_kv_cache_dtype`: "DeepSeek DSA only supports
///   bf16/bfloat16 or fp8_e4m3 kv_cache_dtype");
/// - vLLM 0.26.0's sparse MLA backends on Hopper take bf16/fp16
///   (`FLASH_ATTN_MLA_SPARSE`) or FP8 as `fp8_ds_mla` (`FLASHMLA_SPARSE`):
///   fp8_e5m2 and nvfp4 find no backend (0.33.0's `nvfp4_ds_mla` is for
///   SM100 only).
pub(crate) fn check_engine(launch: &Launch, model: &Model) -> Result<(), PlanError> {
    use super::launch::KvDtype;
    refuse_unserved(launch, model)?;
    if launch.engine == Engine::Vllm && model.architecture == "MiMoV2FlashForCausalLM" {
        return Err(PlanError::UnknownArchitecture(format!(
            "{} on vLLM (DiffKV backends, window pages unified by scaling one kind's block: not modelled; SGLang is)",
            model.architecture
        )));
    }
    if model.sparse.is_none() {
        return Ok(());
    }
    let refused_dtype = match launch.engine {
        Engine::Sglang => matches!(launch.kv_dtype, KvDtype::Fp8E5m2 | KvDtype::Fp4E2m1)
            .then_some("SGLang runs DeepSeek sparse attention (DSA) with a bf16 or fp8_e4m3 KV cache only"),
        Engine::Vllm => matches!(launch.kv_dtype, KvDtype::Fp8E5m2 | KvDtype::Fp4E2m1)
            .then_some("vLLM's sparse MLA backends on Hopper take a bf16, fp16 or fp8 (fp8_ds_mla) KV cache only"),
    };
    if let Some(why) = refused_dtype {
        return Err(PlanError::BadValue {
            flag: "--kv-cache-dtype".to_string(),
            value: launch.kv_dtype.name().to_string(),
            why: format!("{why}, not for {}", model.architecture),
        });
    }
    Ok(())
}

/// DeepSeek sparse attention (`Sparse`): the architectures both engines
/// build an indexer for when the config has `index_topk` (SGLang 0.5.9
/// `is_deepseek_nsa`; vLLM 0.26.0 `deepseek_v2.py`: `is_v32 =
/// hasattr(config, "index_topk")`), read as MLA by both. A config that
/// shares one indexer between layers (`index_topk_freq` above 1,
/// `index_topk_pattern`) or pools index keys (`index_kpool` above 1) is
/// refused by name: the engines size those differently, and plan does not
/// model it.
fn sparse(
    path: &Path,
    text: &serde_json::Value,
    architectures: &[&str],
    attention: Attention,
    attention_vllm: Attention,
) -> Result<Option<Sparse>, PlanError> {
    const DSA: &[&str] = &[
        "DeepseekV32ForCausalLM",
        "GlmMoeDsaForCausalLM",
        "DeepseekV3ForCausalLM",
    ];
    let dsa = DSA.contains(&architectures[0])
        && text.get("index_topk").is_some_and(|topk| !topk.is_null());
    if !dsa {
        return Ok(None);
    }
    let mla = |attention| matches!(attention, Attention::Mla { .. });
    let shared = u64_field(text, "index_topk_freq").is_some_and(|freq| freq > 1)
        || text
            .get("index_topk_pattern")
            .is_some_and(|pattern| !pattern.is_null())
        || u64_field(text, "index_kpool").is_some_and(|pool| pool > 1);
    if shared || !mla(attention) || !mla(attention_vllm) {
        return Err(PlanError::UnknownArchitecture(format!(
            "{} (a sparse-attention indexer shared between layers, pooled, or beside no MLA: not modelled)",
            architectures[0]
        )));
    }
    let index_head_dim = u64_field(text, "index_head_dim")
        .filter(|dim| *dim > 0)
        .ok_or_else(|| PlanError::MissingField {
            path: path.to_path_buf(),
            field: "index_head_dim",
        })?;
    Ok(Some(Sparse { index_head_dim }))
}

/// ESTIMATE: the weights' bytes as the engine loads them, from the
/// config alone: parameters (embeddings `vocab × hidden`, the LM head
/// unless `tie_word_embeddings`; per layer the attention projections
/// (`attention_weights`), the MLP `3 × hidden × intermediate` (MoE: every
/// routed expert at `moe_intermediate_size`, the shared experts, the
/// router `hidden × experts`; DeepSeek's `first_k_dense_replace` layers
/// dense) and two norms; the final norm) times the bytes a weight takes in
/// the checkpoint's format (`quantization_config`):
/// - none: the model dtype (2 bytes);
/// - `fp8`: 1 byte a linear weight (block scales ignored);
/// - `awq`, `gptq`, `compressed-tensors` with `num_bits` 4 (or 8): the
///   bits ÷ 8 and a 16-bit scale per group (`group_size`, 128 by default);
///   what the config's ignore list names stays 16-bit: the attention
///   (`attn`), the dense MLPs and shared experts (`mlp`, `shared_expert`);
/// - `mxfp4` (gpt-oss): the experts at 4 bits and a one-byte scale per 32,
///   the rest 16 bits.
///
/// Embeddings and the LM head stay 16 bits. Linear-attention layers are
/// counted as attention layers (an estimate). `None` without `vocab_size`,
/// `hidden_size` or an MLP width, and for Step-3's experts.
pub(crate) fn config_weights(config: &serde_json::Value, model: &Model) -> Option<u64> {
    let text = config
        .get("text_config")
        .filter(|text| text.is_object())
        .unwrap_or(config);
    let (attention_bytes, layers, dtype_bytes) =
        (model.attention_bytes, model.layers, model.dtype_bytes);
    let field = |name: &str| u64_field(text, name);
    // Step-3's experts (`moe_num_experts`, `moe_layers_enum`) are not read
    // here: no estimate rather than a dense model's.
    if text.get("moe_num_experts").is_some() {
        return None;
    }
    let hidden = field("hidden_size")? as f64;
    let vocab = field("vocab_size")? as f64;
    let layers_f = layers as f64;
    let tied = text
        .get("tie_word_embeddings")
        .or_else(|| config.get("tie_word_embeddings"))
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    let embeddings = vocab * hidden * if tied { 1.0 } else { 2.0 };
    let attention = attention_bytes as f64 / 2.0;
    let experts = field("n_routed_experts")
        .or_else(|| field("num_local_experts"))
        .or_else(|| field("num_experts"))
        .filter(|experts| *experts > 1);
    let dense_width = field("intermediate_size");
    // A linear-attention or Mamba family's own MLP layout; else every layer
    // an MLP (the first `first_k_dense_replace` dense before MoE ones).
    let layout = model.linear.and_then(|linear| linear.mlp);
    let matrices = layout.map_or(3.0, |layout| layout.matrices as f64);
    let (dense_mlp, expert_mlp) = match experts {
        None => {
            let mlp_layers = layout.map_or(layers, |layout| layout.dense + layout.moe);
            let width = if mlp_layers == 0 { 0 } else { dense_width? };
            (matrices * hidden * width as f64 * mlp_layers as f64, 0.0)
        }
        Some(experts) => {
            let width = field("moe_intermediate_size").or(dense_width)? as f64;
            let (dense_layers, moe_layers) = match layout {
                Some(layout) => (layout.dense as f64, layout.moe as f64),
                None => {
                    let dense = field("first_k_dense_replace").unwrap_or(0).min(layers) as f64;
                    (dense, layers_f - dense)
                }
            };
            let shared = match (
                field("n_shared_experts"),
                field("shared_expert_intermediate_size"),
            ) {
                (Some(count), _) => count as f64 * width,
                (None, Some(shared)) => shared as f64,
                (None, None) => 0.0,
            };
            // Qwen2-MoE and Qwen3-Next gate their shared expert by a
            // hidden × 1 `shared_expert_gate` (vLLM 0.26.0 qwen2_moe.py,
            // qwen3_next.py `Qwen3NextSparseMoeBlock`).
            let shared_gate = match field("shared_expert_intermediate_size") {
                Some(_) => hidden,
                None => 0.0,
            };
            let dense = matrices * hidden * dense_width.unwrap_or(0) as f64 * dense_layers
                + (matrices * hidden * shared + hidden * experts as f64 + shared_gate) * moe_layers;
            (
                dense,
                matrices * hidden * width * experts as f64 * moe_layers,
            )
        }
    };
    let norms = hidden * (2.0 * layers_f + 1.0);
    let sixteen = dtype_bytes as f64;
    let quant = text
        .get("quantization_config")
        .or_else(|| config.get("quantization_config"));
    let method = quant
        .and_then(|quant| quant.get("quant_method"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    // (bytes an attention weight, bytes an MLP or expert weight).
    let (attention_each, mlp_each, expert_each) = match method {
        "" => (sixteen, sixteen, sixteen),
        "fp8" => (1.0, 1.0, 1.0),
        "mxfp4" => (sixteen, sixteen, 4.25 / 8.0),
        "awq" | "gptq" | "compressed-tensors" => {
            let quant = quant?;
            let group = quant
                .pointer("/config_groups/group_0/weights")
                .unwrap_or(quant);
            let bits = u64_field(group, "num_bits")
                .or_else(|| u64_field(quant, "bits"))
                .or_else(|| u64_field(quant, "w_bit"))
                .unwrap_or(4) as f64;
            let group_size = u64_field(group, "group_size")
                .or_else(|| u64_field(quant, "q_group_size"))
                .filter(|size| *size > 0)
                .unwrap_or(128) as f64;
            let each = bits / 8.0 + 2.0 / group_size;
            let ignores = |part: &str| {
                quant
                    .get("ignore")
                    .or_else(|| quant.get("modules_to_not_convert"))
                    .and_then(serde_json::Value::as_array)
                    .is_some_and(|ignored| {
                        ignored
                            .iter()
                            .filter_map(serde_json::Value::as_str)
                            .any(|name| name.contains(part))
                    })
            };
            let attention = if ignores("attn") { sixteen } else { each };
            let dense = if ignores("shared_expert") || ignores("mlp") {
                sixteen
            } else {
                each
            };
            (attention, dense, each)
        }
        _ => return None,
    };
    let bytes = (embeddings + norms) * sixteen
        + attention * attention_each
        + dense_mlp * mlp_each
        + expert_mlp * expert_each;
    (bytes.is_finite() && bytes >= 0.0).then_some(bytes as u64)
}

/// The state layers of a linear-attention or Mamba model, read as the
/// engines read them (vLLM 0.26.0 `get_mamba_state_shape_from_config` of
/// each model, SGLang 0.5.9 `configs/*.py` `mamba2_cache_params`):
/// - Qwen3-Next, Qwen3.5 (gated DeltaNet, from the text config): the
///   `layer_types` entries `linear_attention`, else every
///   `full_attention_interval`-th layer (4) full, the others linear; the
///   `linear_*` head fields. vLLM's temporal state: Qwen3.5's
///   `mamba_ssm_dtype` (`Qwen3_5ForConditionalGenerationConfig`), the
///   model dtype for Qwen3-Next.
/// - Nemotron-H: `hybrid_override_pattern`, `M` Mamba2 and `*` attention
///   (`-` and `E` MLP layers hold neither); `mamba_num_heads ×
///   mamba_head_dim`, `n_groups`, `ssm_state_size`, `conv_kernel`. vLLM's
///   temporal state: `mamba_ssm_cache_dtype`, else float32
///   (`NemotronHForCausalLMConfig`).
/// - Falcon-H1: Mamba2 and attention in every layer; `mamba_d_ssm` (else
///   `mamba_expand × hidden_size`), `mamba_n_groups`, `mamba_n_heads`,
///   `mamba_d_head` (`auto`: the intermediate ÷ heads), `mamba_d_state`,
///   `mamba_d_conv`.
/// - Jamba: attention where `i % attn_layer_period == attn_layer_offset`,
///   Mamba1 elsewhere (`mamba_expand × hidden_size`, `mamba_d_state`,
///   `mamba_d_conv`).
/// - Mamba (Mamba1: `intermediate_size`, `state_size`, `conv_kernel`) and
///   Mamba2 (`expand × hidden_size`, `n_groups`, `num_heads`, `head_dim`,
///   `state_size`, `conv_kernel`): every layer a state, no attention.
/// - Kimi-Linear: `linear_attn_config.kda_layers` (numbered from 1) are
///   KDA (`num_heads`, `head_dim`, `short_conv_kernel_size`), the others
///   MLA; the recurrent state float32 on both engines.
///
/// `None` for any other architecture.
fn linear(
    path: &Path,
    text: &serde_json::Value,
    architectures: &[&str],
    layers: u64,
) -> Result<Option<Linear>, PlanError> {
    let field = |name: &'static str| {
        u64_field(text, name)
            .filter(|value| *value > 0)
            .ok_or_else(|| PlanError::MissingField {
                path: path.to_path_buf(),
                field: name,
            })
    };
    let take = usize::try_from(layers).unwrap_or(usize::MAX);
    let ssm_dtype = |name: &str| match text.get(name).and_then(serde_json::Value::as_str) {
        Some("float32") => Some(4),
        Some("bfloat16" | "float16") => Some(2),
        _ => None,
    };
    // SGLang's `mamba2_state_dtype`: the config's `mamba_ssm_dtype`, else
    // float32.
    let sglang_ssm_bytes = ssm_dtype("mamba_ssm_dtype").unwrap_or(4);
    let chunk_size = u64_field(text, "mamba_chunk_size")
        .or_else(|| u64_field(text, "chunk_size"))
        .filter(|chunk| *chunk > 0)
        .unwrap_or(2048);
    let is = |name: &str| architectures.contains(&name);
    let linear = if is("Qwen3NextForCausalLM")
        || is("Qwen3_5ForConditionalGeneration")
        || is("Qwen3_5MoeForConditionalGeneration")
    {
        let count = match text
            .get("layer_types")
            .and_then(serde_json::Value::as_array)
        {
            Some(types) => types
                .iter()
                .take(take)
                .filter(|kind| kind.as_str() == Some("linear_attention"))
                .count() as u64,
            None => {
                let interval = u64_field(text, "full_attention_interval")
                    .unwrap_or(4)
                    .max(1);
                layers - layers / interval
            }
        };
        Linear {
            layers: count,
            attention_layers: layers - count.min(layers),
            shape: StateShape::GatedDeltaNet {
                k_heads: field("linear_num_key_heads")?,
                v_heads: field("linear_num_value_heads")?,
                k_dim: field("linear_key_head_dim")?,
                v_dim: field("linear_value_head_dim")?,
                conv_kernel: field("linear_conv_kernel_dim")?,
            },
            vllm_ssm_bytes: if is("Qwen3NextForCausalLM") {
                None
            } else {
                ssm_dtype("mamba_ssm_dtype")
            },
            sglang_ssm_bytes,
            chunk_size,
            mlp: None,
        }
    } else if is("NemotronHForCausalLM") {
        let pattern = text
            .get("hybrid_override_pattern")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| PlanError::MissingField {
                path: path.to_path_buf(),
                field: "hybrid_override_pattern",
            })?;
        let count = |kind: char| pattern.chars().take(take).filter(|c| *c == kind).count() as u64;
        let (heads, head_dim) = (field("mamba_num_heads")?, field("mamba_head_dim")?);
        Linear {
            layers: count('M'),
            attention_layers: count('*'),
            shape: StateShape::Mamba2 {
                intermediate: heads * head_dim,
                groups: field("n_groups")?,
                heads,
                head_dim,
                state_size: field("ssm_state_size")?,
                conv_kernel: field("conv_kernel")?,
            },
            vllm_ssm_bytes: Some(ssm_dtype("mamba_ssm_cache_dtype").unwrap_or(4)),
            sglang_ssm_bytes,
            chunk_size,
            // `-` a relu² MLP, `E` a MoE block.
            mlp: Some(MlpLayers {
                dense: count('-'),
                moe: count('E'),
                matrices: 2,
            }),
        }
    } else if is("FalconH1ForCausalLM") {
        let heads = field("mamba_n_heads")?;
        let intermediate = match u64_field(text, "mamba_d_ssm") {
            Some(ssm) => ssm,
            None => {
                let expand = text
                    .get("mamba_expand")
                    .and_then(serde_json::Value::as_f64)
                    .unwrap_or(2.0);
                (expand * field("hidden_size")? as f64) as u64
            }
        };
        Linear {
            layers,
            attention_layers: layers,
            shape: StateShape::Mamba2 {
                intermediate,
                groups: field("mamba_n_groups")?,
                heads,
                head_dim: u64_field(text, "mamba_d_head").unwrap_or(intermediate / heads),
                state_size: field("mamba_d_state")?,
                conv_kernel: field("mamba_d_conv")?,
            },
            vllm_ssm_bytes: None,
            sglang_ssm_bytes,
            chunk_size,
            mlp: None,
        }
    } else if is("JambaForCausalLM") {
        let period = field("attn_layer_period")?;
        let offset = u64_field(text, "attn_layer_offset").unwrap_or(0);
        let attention = (0..layers).filter(|i| i % period == offset).count() as u64;
        // MoE where `i % expert_layer_period == expert_layer_offset`.
        let moe_period = u64_field(text, "expert_layer_period").unwrap_or(2).max(1);
        let moe_offset = u64_field(text, "expert_layer_offset").unwrap_or(1);
        let moe = (0..layers).filter(|i| i % moe_period == moe_offset).count() as u64;
        Linear {
            layers: layers - attention,
            attention_layers: attention,
            shape: StateShape::Mamba1 {
                intermediate: field("mamba_expand")? * field("hidden_size")?,
                state_size: field("mamba_d_state")?,
                conv_kernel: field("mamba_d_conv")?,
            },
            vllm_ssm_bytes: None,
            sglang_ssm_bytes,
            chunk_size,
            mlp: Some(MlpLayers {
                dense: layers - moe,
                moe,
                matrices: 3,
            }),
        }
    } else if is("MambaForCausalLM") {
        Linear {
            layers,
            attention_layers: 0,
            shape: StateShape::Mamba1 {
                intermediate: field("intermediate_size")?,
                state_size: field("state_size")?,
                conv_kernel: field("conv_kernel")?,
            },
            vllm_ssm_bytes: None,
            sglang_ssm_bytes,
            chunk_size,
            mlp: Some(MlpLayers {
                dense: 0,
                moe: 0,
                matrices: 3,
            }),
        }
    } else if is("Mamba2ForCausalLM") {
        Linear {
            layers,
            attention_layers: 0,
            shape: StateShape::Mamba2 {
                intermediate: field("expand")? * field("hidden_size")?,
                groups: field("n_groups")?,
                heads: field("num_heads")?,
                head_dim: field("head_dim")?,
                state_size: field("state_size")?,
                conv_kernel: field("conv_kernel")?,
            },
            vllm_ssm_bytes: None,
            sglang_ssm_bytes,
            chunk_size,
            mlp: Some(MlpLayers {
                dense: 0,
                moe: 0,
                matrices: 3,
            }),
        }
    } else if is("KimiLinearForCausalLM") {
        let missing = || PlanError::MissingField {
            path: path.to_path_buf(),
            field: "linear_attn_config",
        };
        let config = text.get("linear_attn_config").ok_or_else(missing)?;
        let inner = |name: &str| u64_field(config, name).filter(|value| *value > 0);
        let kda = config
            .get("kda_layers")
            .and_then(serde_json::Value::as_array)
            .ok_or_else(missing)?
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .filter(|layer| (1..=layers).contains(layer))
            .collect::<std::collections::BTreeSet<u64>>()
            .len() as u64;
        let heads = inner("num_heads").ok_or_else(missing)?;
        Linear {
            layers: kda,
            attention_layers: layers - kda,
            shape: StateShape::Kda {
                heads,
                head_dim: inner("head_dim").ok_or_else(missing)?,
                conv_kernel: inner("short_conv_kernel_size").unwrap_or(4),
            },
            // vLLM `kda_state_dtype`, SGLang `KimiLinearCacheParams`
            // (`mamba2_state_dtype(None)`): float32, whatever the config.
            vllm_ssm_bytes: Some(4),
            sglang_ssm_bytes: 4,
            chunk_size,
            mlp: None,
        }
    } else {
        return Ok(None);
    };
    Ok(Some(linear))
}

/// The sliding-window layers each engine sizes apart, (vLLM 0.26.0,
/// SGLang 0.5.9), from the text config:
/// - Gemma-2 and Gemma-3 (`model_executor/models/gemma2.py`, `gemma3.py`):
///   the layers whose `layer_types` entry is `sliding_attention`; without
///   `layer_types`, transformers' default: every `sliding_window_pattern`-th
///   layer (Gemma-3, default 6; Gemma-2, 2) is global, the others slide.
///   SGLang turns its hybrid SWA memory off for both
///   (`server_args.py`: "Disable hybrid SWA memory for … as it is not yet
///   supported"): one full pool.
/// - gpt-oss: vLLM slides the even layers (`gpt_oss.py`: `layer_idx % 2 ==
///   0`); SGLang the `layer_types` entries `sliding_attention`
///   (`configs/model_config.py` `get_hybrid_layer_ids`).
/// - Llama-4: vLLM disables its hybrid KV-cache manager for chunked local
///   attention by default (`config/vllm.py`, unless
///   `VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1`), so every layer
///   is full; SGLang's SWA pool holds the layers `(i + 1) % 4 != 0` with the
///   window `attention_chunk_size` (`model_runner.py`).
/// - Mistral (`model_type` `mistral`) with a `sliding_window`: vLLM slides
///   every layer (`CacheConfig.sliding_window`); SGLang: one full pool.
///
/// Any other config whose layers slide (`layer_types` with
/// `sliding_attention`, or a `sliding_window` not turned off by
/// `use_sliding_window: false`) is refused by name: its pools are not
/// modelled, and full attention would be wrong.
fn windows(
    path: &Path,
    text: &serde_json::Value,
    architectures: &[&str],
    layers: u64,
) -> Result<(Option<Window>, Option<Window>), PlanError> {
    let missing = |field: &'static str| PlanError::MissingField {
        path: path.to_path_buf(),
        field,
    };
    let window = || u64_field(text, "sliding_window").filter(|window| *window > 0);
    let layer_types = text
        .get("layer_types")
        .and_then(serde_json::Value::as_array);
    let sliding_types = || {
        layer_types.map(|types| {
            types
                .iter()
                .take(usize::try_from(layers).unwrap_or(usize::MAX))
                .filter(|kind| kind.as_str() == Some("sliding_attention"))
                .count() as u64
        })
    };
    let model_type = text
        .get("model_type")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    let is = |name: &str| architectures.contains(&name);
    let some = |layers: u64, tokens: u64| (layers > 0).then_some(Window { layers, tokens });
    if is("Gemma2ForCausalLM") || is("Gemma3ForCausalLM") || is("Gemma3ForConditionalGeneration") {
        let tokens = window().ok_or_else(|| missing("sliding_window"))?;
        let pattern = if is("Gemma2ForCausalLM") {
            2
        } else {
            u64_field(text, "sliding_window_pattern")
                .unwrap_or(6)
                .max(1)
        };
        let sliding = sliding_types().unwrap_or(layers - layers / pattern);
        return Ok((some(sliding, tokens), None));
    }
    if is("GptOssForCausalLM") {
        let tokens = window().ok_or_else(|| missing("sliding_window"))?;
        let sglang = sliding_types().ok_or_else(|| missing("layer_types"))?;
        return Ok((some(layers.div_ceil(2), tokens), some(sglang, tokens)));
    }
    if is("Step3p5ForCausalLM") {
        return step3p5_windows(path, text, layers);
    }
    if is("MiMoV2FlashForCausalLM") {
        // mimo_v2.py `is_compressed_softmax_layer`, SGLang
        // `get_hybrid_layer_ids`: `hybrid_layer_pattern[i] == 1` slides, over
        // `sliding_window_size` (SGLang: else `sliding_window`).
        let tokens = u64_field(text, "sliding_window_size")
            .or_else(window)
            .filter(|window| *window > 0)
            .ok_or_else(|| missing("sliding_window_size"))?;
        let pattern = text
            .get("hybrid_layer_pattern")
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| missing("hybrid_layer_pattern"))?;
        let sliding = pattern
            .iter()
            .take(usize::try_from(layers).unwrap_or(usize::MAX))
            .filter(|kind| kind.as_u64() == Some(1))
            .count() as u64;
        return Ok((some(sliding, tokens), some(sliding, tokens)));
    }
    if is("Llama4ForConditionalGeneration") {
        let chunk = u64_field(text, "attention_chunk_size")
            .filter(|chunk| *chunk > 0)
            .ok_or_else(|| missing("attention_chunk_size"))?;
        return Ok((None, some(layers - layers / 4, chunk)));
    }
    let turned_off = text
        .get("use_sliding_window")
        .and_then(serde_json::Value::as_bool)
        == Some(false);
    let slides = sliding_types().map_or(window().is_some(), |sliding| sliding > 0);
    if turned_off || !slides {
        return Ok((None, None));
    }
    if model_type == "mistral" && layer_types.is_none() {
        let tokens = window().ok_or_else(|| missing("sliding_window"))?;
        return Ok((some(layers, tokens), None));
    }
    Err(PlanError::UnknownArchitecture(format!(
        "{} (sliding-window attention layers: their KV pools follow rules gpureap plan does not model for this architecture)",
        architectures[0]
    )))
}

/// The window layers' KV shape where the config gives them one of their
/// own (`swa_num_key_value_heads`, `swa_head_dim`, `swa_v_head_dim`, each
/// defaulting to the full layers' as SGLang 0.5.9's `ModelConfig` does),
/// for MiMo-V2-Flash; `None` when it is the full layers' shape.
fn window_kv(
    text: &serde_json::Value,
    architectures: &[&str],
    attention: Attention,
) -> Option<Attention> {
    let Attention::Mha {
        kv_heads,
        head_dim,
        v_head_dim,
    } = attention
    else {
        return None;
    };
    if !architectures.contains(&"MiMoV2FlashForCausalLM") {
        return None;
    }
    let swa_head_dim = u64_field(text, "swa_head_dim").unwrap_or(head_dim);
    let shape = Attention::Mha {
        kv_heads: u64_field(text, "swa_num_key_value_heads").unwrap_or(kv_heads),
        head_dim: swa_head_dim,
        v_head_dim: u64_field(text, "swa_v_head_dim").unwrap_or(v_head_dim),
    };
    (shape != attention).then_some(shape)
}

/// Step-3.5 (vLLM 0.26.0 `step3p5.py`, SGLang 0.5.9
/// `configs/model_config.py` `get_hybrid_layer_ids`): the layers whose
/// `layer_types` entry is `sliding_attention` (of the first
/// `num_hidden_layers`: the list also names the MTP layers) slide over
/// `sliding_window` tokens, in both engines (vLLM without `layer_types`
/// slides the even layers). The window layers' own attention setting
/// (`attention_other_setting`) may give them other KV heads or head size:
/// refused by name then, as their pages would differ from the full
/// layers' (not modelled); more query heads change nothing here.
fn step3p5_windows(
    path: &Path,
    text: &serde_json::Value,
    layers: u64,
) -> Result<(Option<Window>, Option<Window>), PlanError> {
    let tokens = u64_field(text, "sliding_window")
        .filter(|window| *window > 0)
        .ok_or_else(|| PlanError::MissingField {
            path: path.to_path_buf(),
            field: "sliding_window",
        })?;
    let sliding = match text
        .get("layer_types")
        .and_then(serde_json::Value::as_array)
    {
        Some(types) => types
            .iter()
            .take(usize::try_from(layers).unwrap_or(usize::MAX))
            .filter(|kind| kind.as_str() == Some("sliding_attention"))
            .count() as u64,
        None => layers.div_ceil(2),
    };
    if let Some(other) = text
        .get("attention_other_setting")
        .filter(|other| other.is_object())
    {
        let same = |field: &str| {
            other
                .get(field)
                .is_none_or(|value| value.as_u64() == u64_field(text, field))
        };
        if !same("num_attention_groups") || !same("head_dim") {
            return Err(PlanError::UnknownArchitecture(
                "Step3p5ForCausalLM (window layers with KV heads or a head size of their own: not modelled)".to_string(),
            ));
        }
    }
    let window = (sliding > 0).then_some(Window {
        layers: sliding,
        tokens,
    });
    Ok((window, window))
}

/// The config's `architectures`, at least one; a hybrid one (whose KV
/// pools follow other rules) is refused.
fn architectures<'a>(
    path: &Path,
    config: &'a serde_json::Value,
) -> Result<Vec<&'a str>, PlanError> {
    let architectures: Vec<&str> = config
        .get("architectures")
        .and_then(serde_json::Value::as_array)
        .map(|list| list.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    if architectures.is_empty() {
        return Err(PlanError::MissingField {
            path: path.to_path_buf(),
            field: "architectures",
        });
    }
    if let Some(hybrid) = architectures.iter().find(|name| HYBRID.contains(name)) {
        return Err(PlanError::UnknownArchitecture(format!(
            "{hybrid} (hybrid, sliding-window or sparse attention: its KV pools follow rules gpureap plan does not model)"
        )));
    }
    Ok(architectures)
}

/// The attention as SGLang reads the model, and as vLLM does: MLA where
/// the engine's list of MLA models has it and the config has
/// `kv_lora_rank`, else MHA/GQA from the head fields.
fn attentions(
    path: &Path,
    text: &serde_json::Value,
    architectures: &[&str],
) -> Result<(Attention, Attention), PlanError> {
    let missing = |field: &'static str| PlanError::MissingField {
        path: path.to_path_buf(),
        field,
    };
    let kv_lora_rank = u64_field(text, "kv_lora_rank");
    let sglang_mla = kv_lora_rank.is_some()
        && architectures.iter().any(|name| SGLANG_MLA.contains(name))
        && !(architectures.contains(&"DeepseekVL2ForCausalLM")
            && text.get("use_mla").and_then(serde_json::Value::as_bool) == Some(false));
    let text_type = text
        .get("model_type")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    let vllm_mla = kv_lora_rank.is_some() && VLLM_MLA.contains(&text_type);
    let mla = match kv_lora_rank {
        Some(kv_lora_rank) if sglang_mla || vllm_mla => Some(Attention::Mla {
            kv_lora_rank,
            qk_rope_head_dim: u64_field(text, "qk_rope_head_dim")
                .ok_or_else(|| missing("qk_rope_head_dim"))?,
        }),
        _ => None,
    };
    // MHA/GQA: needed unless both engines read the model as MLA.
    let mha = if sglang_mla && vllm_mla {
        None
    } else {
        mha(path, text, architectures[0], mla.is_some())?
    };
    let pick = |is_mla: bool| match (is_mla, mla, mha) {
        (true, Some(mla), _) => Ok(mla),
        (false, _, Some(mha)) => Ok(mha),
        _ => Err(missing("num_attention_heads")),
    };
    Ok((pick(sglang_mla)?, pick(vllm_mla)?))
}

/// MHA/GQA from `num_attention_heads`, `num_key_value_heads` (else every
/// head), `head_dim` (else hidden ÷ heads) and `v_head_dim` (else
/// `head_dim`); `None` without heads where MLA is read instead.
fn mha(
    path: &Path,
    text: &serde_json::Value,
    architecture: &str,
    has_mla: bool,
) -> Result<Option<Attention>, PlanError> {
    let missing = |field: &'static str| PlanError::MissingField {
        path: path.to_path_buf(),
        field,
    };
    match (
        u64_field(text, "num_attention_heads"),
        u64_field(text, "hidden_size"),
    ) {
        (Some(heads), hidden) if heads > 0 => {
            let head_dim = match u64_field(text, "head_dim") {
                Some(dim) => dim,
                // Both engines' NemotronHConfig default `head_dim` to 128
                // (the published configs name it `attention_head_dim`).
                None if architecture == "NemotronHForCausalLM" => 128,
                None => hidden.ok_or_else(|| missing("hidden_size"))? / heads,
            };
            if head_dim == 0 {
                return Err(missing("head_dim"));
            }
            Ok(Some(Attention::Mha {
                // Step-3 names its KV heads `num_attention_groups`
                // (both engines read it: SGLang `get_total_num_kv_heads`,
                // vLLM `model_arch_config_convertor.py`).
                kv_heads: u64_field(text, "num_key_value_heads")
                    .or_else(|| u64_field(text, "num_attention_groups"))
                    .unwrap_or(heads)
                    .max(1),
                head_dim,
                v_head_dim: u64_field(text, "v_head_dim").unwrap_or(head_dim),
            }))
        }
        _ if !has_mla => Err(PlanError::UnknownArchitecture(format!(
            "{architecture} (its config has neither kv_lora_rank nor num_attention_heads)"
        ))),
        _ => Ok(None),
    }
}

/// ESTIMATE (see `Model::replicated_bytes`): the sparse-attention
/// indexer's projections over all layers, 2 bytes a weight, which every
/// rank holds whole (vLLM 0.26.0 `deepseek_v2.py` `Indexer`: `wq_b` a
/// `ReplicatedLinear(q_lora_rank, index_head_dim × index_n_heads)`, `wk` and
/// `weights_proj` fused, `hidden_size → index_head_dim + index_n_heads`,
/// `disable_tp`; SGLang 0.5.9 `nsa_indexer.py`: the same three as
/// `ReplicatedLinear`). Its `k_norm` is not counted.
fn indexer_weights(text: &serde_json::Value, sparse: Sparse, layers: u64) -> u64 {
    let field = |name: &str| u64_field(text, name).unwrap_or(0);
    let heads = field("index_n_heads");
    let dim = sparse.index_head_dim;
    let per_layer = field("q_lora_rank")
        .saturating_mul(dim)
        .saturating_mul(heads)
        .saturating_add(field("hidden_size").saturating_mul(dim.saturating_add(heads)));
    per_layer.saturating_mul(layers).saturating_mul(2)
}

/// The model dtype's bytes (`torch_dtype` or `dtype`, the text config's
/// first; bfloat16 when absent).
fn dtype_bytes(
    path: &Path,
    config: &serde_json::Value,
    text: &serde_json::Value,
) -> Result<u64, PlanError> {
    let dtype = text
        .get("torch_dtype")
        .or_else(|| text.get("dtype"))
        .or_else(|| config.get("torch_dtype"))
        .or_else(|| config.get("dtype"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("bfloat16");
    match dtype {
        "bfloat16" | "float16" | "half" | "float32" | "float" => Ok(2),
        other => Err(PlanError::UnknownDtype {
            path: path.to_path_buf(),
            dtype: other.to_string(),
        }),
    }
}

/// The vision tower's (layers, hidden size), for SGLang's VLM fraction
/// factor; `None` without a `vision_config`.
fn vision(config: &serde_json::Value, architecture: &str) -> Option<(u64, u64)> {
    config
        .get("vision_config")
        .filter(|vision| vision.is_object())
        .map(|vision| {
            // SGLang reads the config object, whose class fills absent
            // fields: Kimi-K2.5's vision config defaults to 27 × 1152.
            let (layers, hidden) = match architecture {
                "KimiK25ForConditionalGeneration" => (27, 1152),
                _ => (24, 1024),
            };
            (
                u64_field(vision, "num_hidden_layers").unwrap_or(layers),
                u64_field(vision, "hidden_size").unwrap_or(hidden),
            )
        })
}

/// ESTIMATE (see `Model::attention_bytes`): (attention bytes, replicated
/// bytes) over all layers, from the projection shapes, 2 bytes a weight.
/// A linear-attention or Mamba model counts the attention over its
/// attention layers and `Linear::weights` over its state layers; with
/// gated-delta-net layers (Qwen3-Next, Qwen3.5) the full-attention layers'
/// `qkv_proj` carries an output gate as wide as the queries (vLLM 0.26.0
/// model_executor/models/qwen3_next.py `Qwen3NextAttention`:
/// `total_num_heads * (1 + attn_output_gate)`, the gate on by default).
fn attention_weights(
    text: &serde_json::Value,
    attention: Attention,
    layers: u64,
    linear: Option<Linear>,
) -> (u64, u64) {
    const BYTES: u64 = 2;
    // Saturating: an estimate, from numbers anyone may write in a config.
    let product = |factors: &[u64]| {
        factors
            .iter()
            .fold(1u64, |product, factor| product.saturating_mul(*factor))
    };
    let sum = |terms: &[u64]| {
        terms
            .iter()
            .fold(0u64, |sum, term| sum.saturating_add(*term))
    };
    let field = |name: &str| u64_field(text, name).unwrap_or(0);
    let hidden = field("hidden_size");
    let heads = field("num_attention_heads");
    let (per_layer, replicated) = match attention {
        Attention::Mla {
            kv_lora_rank,
            qk_rope_head_dim,
        } => {
            let q_lora = field("q_lora_rank");
            let nope = field("qk_nope_head_dim");
            let v = u64_field(text, "v_head_dim").unwrap_or(nope);
            let qk = nope.saturating_add(qk_rope_head_dim);
            let q = match q_lora {
                0 => product(&[hidden, heads, qk]),
                q_lora => sum(&[product(&[hidden, q_lora]), product(&[q_lora, heads, qk])]),
            };
            let kv_a = product(&[hidden, kv_lora_rank.saturating_add(qk_rope_head_dim)]);
            let kv_b = product(&[kv_lora_rank, heads, nope.saturating_add(v)]);
            let o = product(&[heads, v, hidden]);
            (
                sum(&[q, kv_a, kv_b, o]),
                sum(&[product(&[hidden, q_lora]), kv_a]),
            )
        }
        Attention::Mha {
            kv_heads,
            head_dim,
            v_head_dim,
        } => {
            let gated = linear
                .is_some_and(|linear| matches!(linear.shape, StateShape::GatedDeltaNet { .. }))
                && text
                    .get("attn_output_gate")
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(true);
            let query_heads = if gated {
                heads.saturating_mul(2)
            } else {
                heads
            };
            (
                sum(&[
                    product(&[hidden, query_heads, head_dim]),
                    product(&[hidden, kv_heads, head_dim.saturating_add(v_head_dim)]),
                    product(&[heads, v_head_dim, hidden]),
                ]),
                0,
            )
        }
    };
    // The attention layers (Falcon-H1's hold a state too; Nemotron-H's MLP
    // layers neither) and the state layers.
    let attention_layers = linear.map_or(layers, |linear| linear.attention_layers.min(layers));
    let linear_layers = linear.map_or(0, |linear| linear.layers.min(layers));
    let linear_weights = linear.map_or(0, |linear| linear.weights(hidden));
    (
        sum(&[
            product(&[per_layer, attention_layers, BYTES]),
            product(&[linear_weights, linear_layers, BYTES]),
        ]),
        product(&[replicated, attention_layers, BYTES]),
    )
}

/// SGLang's `get_context_length` (vLLM reads the same keys). Gemma-3's
/// text config takes transformers' default `max_position_embeddings`
/// (131,072) when the file omits it, and vLLM applies no rope factor to
/// it (`config/model.py` skips `gemma3` model types); SGLang would (its
/// context length sets only the request-cap default).
fn context_length(text: &serde_json::Value) -> Option<u64> {
    let gemma3 = text
        .get("model_type")
        .and_then(serde_json::Value::as_str)
        .is_some_and(|model_type| model_type.starts_with("gemma3"));
    if gemma3 {
        return Some(u64_field(text, "max_position_embeddings").unwrap_or(131_072));
    }
    let scaling = text
        .get("rope_scaling")
        .filter(|scaling| scaling.is_object())
        .or_else(|| {
            text.get("rope_parameters")
                .filter(|p| p.get("factor").is_some())
        });
    let factor = match scaling {
        Some(scaling)
            if scaling.get("original_max_position_embeddings").is_none()
                && scaling.get("rope_type").and_then(serde_json::Value::as_str)
                    != Some("llama3") =>
        {
            scaling
                .get("factor")
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(1.0)
        }
        _ => 1.0,
    };
    [
        "max_sequence_length",
        "seq_length",
        "max_seq_len",
        "model_max_length",
        "max_position_embeddings",
    ]
    .iter()
    .find_map(|key| u64_field(text, key))
    .map(|length| (factor * length as f64) as u64)
}

/// A ModelOpt quant config that puts the KV cache in FP8: flat
/// (`quant_algo` + `kv_cache_scheme` of 8-bit floats, or
/// `kv_cache_quant_algo: "FP8"`) or nested (`quantization: {…}`, the
/// hf_quant_config.json form).
fn modelopt_kv_fp8(quant: &serde_json::Value) -> bool {
    let inner = quant.get("quantization").unwrap_or(quant);
    let method = quant
        .get("quant_method")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    let modelopt = method.starts_with("modelopt")
        || inner.get("quant_algo").is_some()
        || quant
            .get("producer")
            .and_then(|p| p.get("name"))
            .and_then(serde_json::Value::as_str)
            == Some("modelopt");
    if !modelopt {
        return false;
    }
    let scheme = inner
        .get("kv_cache_scheme")
        .or_else(|| quant.get("kv_cache_scheme"))
        .or_else(|| inner.get("kv_cache_quant_algo"))
        .or_else(|| quant.get("kv_cache_quant_algo"));
    match scheme {
        Some(serde_json::Value::String(name)) => {
            matches!(name.trim().to_ascii_uppercase().as_str(), "FP8" | "FLOAT8")
        }
        Some(scheme @ serde_json::Value::Object(_)) => {
            scheme.get("type").and_then(serde_json::Value::as_str) == Some("float")
                && scheme.get("num_bits").and_then(serde_json::Value::as_u64) == Some(8)
        }
        _ => false,
    }
}

/// The checkpoint's total bytes: `model.safetensors.index.json`
/// `metadata.total_size`, else the sum over the directory's
/// `*.safetensors` headers; `None` when there are neither.
fn weights(dir: &Path) -> Result<Option<u64>, PlanError> {
    let index = dir.join("model.safetensors.index.json");
    if std::fs::symlink_metadata(&index).is_ok() {
        // Typed: the weight map (most of the file) and anything else is
        // skipped unbuilt; total_size is kept as its text.
        #[derive(serde::Deserialize)]
        struct Metadata {
            total_size: Option<Box<serde_json::value::RawValue>>,
        }
        #[derive(serde::Deserialize)]
        struct Index {
            metadata: Option<Metadata>,
        }
        let (_, bytes) =
            crate::file::read_regular(&index, INDEX_MAX).map_err(|why| unreadable(&index, why))?;
        let json: Index = serde_json::from_slice(&bytes)
            .map_err(|error| unreadable(&index, format!("not a checkpoint index: {error}")))?;
        let total = json
            .metadata
            .and_then(|metadata| metadata.total_size)
            .map(|raw| match raw.get().len() {
                // A number is short; anything longer is not one.
                ..=64 => serde_json::from_str(raw.get()).unwrap_or(serde_json::Value::Null),
                _ => serde_json::Value::String("…".to_string()),
            });
        let metadata = serde_json::json!({ "total_size": total });
        if let Some(total) = metadata.get("total_size").filter(|total| !total.is_null()) {
            return u64_field(&metadata, "total_size").map(Some).ok_or_else(|| {
                unreadable(
                    &index,
                    format!(
                        "metadata.total_size is {}: not a whole number of bytes",
                        crate::units::short(&total.to_string(), 40)
                    ),
                )
            });
        }
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(None);
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "safetensors"))
        .take(SAFETENSORS_FILES_MAX + 1)
        .collect();
    if files.is_empty() {
        return Ok(None);
    }
    if files.len() > SAFETENSORS_FILES_MAX {
        return Err(unreadable(
            dir,
            format!("more than {SAFETENSORS_FILES_MAX} safetensors files"),
        ));
    }
    files.sort();
    let mut total = 0u64;
    for file in files {
        total = total.saturating_add(safetensors_bytes(&file)?);
    }
    Ok(Some(total))
}

/// Bytes per element of a safetensors dtype, in bits (sub-byte types).
fn dtype_bits(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F64" | "I64" | "U64" | "C64" => 64,
        "F32" | "I32" | "U32" => 32,
        "F16" | "BF16" | "I16" | "U16" => 16,
        "F8_E4M3" | "F8_E5M2" | "F8_E8M0" | "I8" | "U8" | "BOOL" => 8,
        "F6_E2M3" | "F6_E3M2" => 6,
        "F4" => 4,
        _ => return None,
    })
}

/// The tensor bytes one safetensors file holds, from its header alone:
/// the 8-byte little-endian header length, then that much JSON; each
/// tensor's dtype size × the product of its shape (its `data_offsets`
/// span for a dtype not known here). The tensors are never read.
pub(crate) fn safetensors_bytes(path: &Path) -> Result<u64, PlanError> {
    let header = read_header(path)?;
    serde_json::from_slice::<HeaderBytes>(&header)
        .map(|sum| sum.0)
        .map_err(|error| unreadable(path, format!("not a safetensors header: {error}")))
}

/// The tensor bytes of a safetensors header, summed while it is parsed:
/// one tensor's fields at a time, never the header as a tree (a 100 MB
/// header of tiny entries would be gigabytes as one).
struct HeaderBytes(u64);

impl<'de> serde::Deserialize<'de> for HeaderBytes {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = HeaderBytes;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object of tensors")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<HeaderBytes, A::Error> {
                let mut total = 0u64;
                while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let tensor: Tensor = map.next_value()?;
                    if name == "__metadata__" {
                        continue;
                    }
                    let bytes = tensor.bytes().ok_or_else(|| {
                        serde::de::Error::custom(format!(
                            "tensor \"{}\" has no readable dtype and shape",
                            crate::units::short(&name, 80)
                        ))
                    })?;
                    total = total.saturating_add(bytes);
                }
                Ok(HeaderBytes(total))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// One entry of a safetensors header; other fields (and `__metadata__`'s
/// strings) are skipped unbuilt.
#[derive(serde::Deserialize)]
struct Tensor {
    dtype: Option<String>,
    shape: Option<Vec<u64>>,
    data_offsets: Option<(u64, u64)>,
}

impl Tensor {
    /// Its dtype size × the product of its shape (its `data_offsets`
    /// span for a dtype not known here).
    fn bytes(&self) -> Option<u64> {
        let by_shape = self
            .dtype
            .as_deref()
            .and_then(dtype_bits)
            .zip(self.shape.as_ref())
            .and_then(|(bits, shape)| {
                let elements = shape
                    .iter()
                    .try_fold(1u64, |product, dim| product.checked_mul(*dim))?;
                Some(elements.checked_mul(bits)?.div_ceil(8))
            });
        by_shape.or_else(|| {
            let (begin, end) = self.data_offsets?;
            end.checked_sub(begin)
        })
    }
}

/// The JSON header of a safetensors file: a regular file, opened without
/// waiting, of which only the first 8 + N bytes are read (N at most the
/// format's 100 MB).
fn read_header(path: &Path) -> Result<Vec<u8>, PlanError> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|error| unreadable(path, error))?;
    let metadata = file.metadata().map_err(|error| unreadable(path, error))?;
    if !metadata.is_file() {
        return Err(unreadable(path, "not a regular file"));
    }
    let mut length = [0u8; 8];
    (&file)
        .read_exact(&mut length)
        .map_err(|error| unreadable(path, format!("no safetensors header: {error}")))?;
    let length = u64::from_le_bytes(length);
    if length > HEADER_MAX || length.saturating_add(8) > metadata.len() {
        return Err(unreadable(
            path,
            format!(
                "safetensors header length {length} is not plausible for a {}-byte file",
                metadata.len()
            ),
        ));
    }
    let mut header = Vec::new();
    (&file)
        .take(length)
        .read_to_end(&mut header)
        .map_err(|error| unreadable(path, error))?;
    if header.len() as u64 != length {
        return Err(unreadable(path, "the safetensors header is cut short"));
    }
    Ok(header)
}
