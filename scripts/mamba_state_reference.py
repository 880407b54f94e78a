#!/usr/bin/env python3
"""The figures the linear-attention and Mamba tests of crates/services/src/plan/tests.rs pin,
computed by the engines' own functions, not by plan's.

Each function below is copied from the released package named above it (vLLM 0.26.0, SGLang
0.5.9), with what needs torch or a running engine replaced: a torch dtype by its size in bytes
(bfloat16 2, float32 4), `divide` by its exact integer division, a config object by the
fixture's config.json read as the engine's config class reads it. The arithmetic lines are the
engines'. Run from the repository root; it prints one line per figure the tests pin.

Usage: scripts/mamba_state_reference.py
"""
import json
import math
from collections import defaultdict
from pathlib import Path

FIXTURES = Path("tests/fixtures/models")
BF16, F32 = 2, 4
GIB = 1 << 30


def config(name):
    """The text config the engines read (`get_hf_text_config`: `text_config` when present)."""
    raw = json.loads((FIXTURES / name / "config.json").read_text())
    return raw.get("text_config", raw)


class Obj:
    def __init__(self, fields):
        self.__dict__.update(fields)


def divide(numerator, denominator):  # vllm.distributed.divide / sglang divide
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
    return numerator // denominator


def cdiv(a, b):  # vllm.utils.math_utils.cdiv
    return -(a // -b)


# --------------------------------------------------------------- vLLM 0.26.0
# model_executor/layers/mamba/mamba_utils.py, MambaStateShapeCalculator (conv layout "SD").


class MambaStateShapeCalculator:
    @classmethod
    def _orient_conv_shape(cls, dim, state_len):
        return (state_len, dim)

    @classmethod
    def mamba1_state_shape(cls, tp_world_size, intermediate_size, state_size, conv_kernel):
        conv_dim = divide(intermediate_size, tp_world_size)
        conv_state_shape = cls._orient_conv_shape(conv_dim, conv_kernel - 1)

        temporal_state_shape = (divide(intermediate_size, tp_world_size), state_size)

        return conv_state_shape, temporal_state_shape

    @classmethod
    def mamba2_state_shape(cls, tp_world_size, intermediate_size, n_groups, num_heads, head_dim,
                           state_size, conv_kernel, num_spec=0):
        # if n_groups is not divisible by world_size, need to extend the shards
        # to ensure all groups needed by a head is sharded along with it
        n_groups = n_groups + cls.extra_groups_for_head_shards(n_groups, tp_world_size)
        # heads and n_groups are TP-ed
        conv_dim = intermediate_size + 2 * n_groups * state_size

        conv_state_shape = cls._orient_conv_shape(
            divide(conv_dim, tp_world_size), conv_kernel - 1 + num_spec
        )

        temporal_state_shape = (divide(num_heads, tp_world_size), head_dim, state_size)
        return conv_state_shape, temporal_state_shape

    @classmethod
    def extra_groups_for_head_shards(cls, ngroups, tp_size):
        if ngroups % tp_size == 0:
            return 0
        return tp_size - ngroups

    @classmethod
    def gated_delta_net_state_shape(cls, tp_world_size, num_k_heads, num_v_heads, head_k_dim,
                                    head_v_dim, conv_kernel_size, num_spec=0):
        conv_dim = head_k_dim * num_k_heads * 2 + head_v_dim * num_v_heads
        conv_state_shape = cls._orient_conv_shape(
            divide(conv_dim, tp_world_size),
            conv_kernel_size - 1 + num_spec,
        )

        temporal_state_shape = (
            divide(num_v_heads, tp_world_size),
            head_v_dim,
            head_k_dim,
        )
        return conv_state_shape, temporal_state_shape

    @classmethod
    def kda_state_shape(cls, tp_world_size, num_heads, head_dim, num_k_heads=None,
                        head_k_dim=None, conv_kernel_size=4, num_spec=0):
        if num_k_heads is None:
            num_k_heads = num_heads
        if head_k_dim is None:
            head_k_dim = head_dim

        proj_size = num_heads * head_dim
        proj_k_size = num_k_heads * head_k_dim

        conv_dim = proj_size + 2 * proj_k_size
        conv_state_shape = cls._orient_conv_shape(
            divide(conv_dim, tp_world_size), conv_kernel_size - 1
        )
        recurrent_state_shape = (divide(num_heads, tp_world_size), head_dim, head_dim)
        return (conv_state_shape, recurrent_state_shape)


# MambaStateDtypeCalculator._mamba_state_dtype, with get_kv_cache_torch_dtype("auto", model)
# the model dtype (bfloat16 here: float32 configs are downcast, config/model.py
# _resolve_auto_dtype) and STR_DTYPE_TO_TORCH_DTYPE as sizes.
SIZES = {"float32": F32, "bfloat16": BF16, "float16": BF16}


def _mamba_state_dtype(model_dtype, mamba_cache_dtype, mamba_ssm_cache_dtype):
    conv_state_dtype = model_dtype  # get_kv_cache_torch_dtype("auto", model_dtype)
    if mamba_ssm_cache_dtype == "auto":
        temporal_state_dtype = conv_state_dtype
    else:
        temporal_state_dtype = SIZES[mamba_ssm_cache_dtype]

    return (conv_state_dtype, temporal_state_dtype)


def kda_state_dtype(model_dtype, mamba_cache_dtype):
    state_dtype = model_dtype
    return (state_dtype, F32)


GIVEN = {"mamba_ssm_cache_dtype": "auto"}  # --mamba-ssm-cache-dtype


def mamba_cache_ssm_dtype(arch, text):
    """`cache_config.mamba_ssm_cache_dtype` after the model's VerifyAndUpdateConfig
    (model_executor/models/config.py): Qwen3.5 its `mamba_ssm_dtype`, Nemotron-H its
    `mamba_ssm_cache_dtype` else float32, each only when the flag is "auto"; "auto" for the
    others."""
    if GIVEN["mamba_ssm_cache_dtype"] != "auto":
        return GIVEN["mamba_ssm_cache_dtype"]
    if arch.startswith("Qwen3_5"):
        return text.get("mamba_ssm_dtype") or "auto"
    if arch == "NemotronHForCausalLM":
        return text.get("mamba_ssm_cache_dtype", "float32")
    return "auto"


def vllm_state(arch, text, tp):
    """(shapes, dtypes) of one state layer: each model's get_mamba_state_shape_from_config and
    get_mamba_state_dtype_from_config (model_executor/models/*.py)."""
    c = Obj(text)
    S = MambaStateShapeCalculator
    ssm = mamba_cache_ssm_dtype(arch, text)
    if arch in ("Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",
                "Qwen3_5MoeForConditionalGeneration"):
        shapes = S.gated_delta_net_state_shape(tp, c.linear_num_key_heads, c.linear_num_value_heads,
                                               c.linear_key_head_dim, c.linear_value_head_dim,
                                               c.linear_conv_kernel_dim, 0)
        return shapes, _mamba_state_dtype(BF16, "auto", ssm)
    if arch == "NemotronHForCausalLM":
        intermediate_size = c.mamba_num_heads * c.mamba_head_dim
        shapes = S.mamba2_state_shape(intermediate_size=intermediate_size, tp_world_size=tp,
                                      n_groups=c.n_groups, num_heads=c.mamba_num_heads,
                                      head_dim=c.mamba_head_dim, state_size=c.ssm_state_size,
                                      conv_kernel=c.conv_kernel, num_spec=0)
        return shapes, _mamba_state_dtype(BF16, "auto", ssm)
    if arch == "FalconH1ForCausalLM":
        mamba_d_ssm = getattr(c, "mamba_d_ssm", None)
        intermediate_size = (
            int(c.mamba_expand * c.hidden_size) if mamba_d_ssm is None else mamba_d_ssm
        )
        shapes = S.mamba2_state_shape(intermediate_size=intermediate_size, tp_world_size=tp,
                                      n_groups=c.mamba_n_groups, num_heads=c.mamba_n_heads,
                                      head_dim=c.mamba_d_head, state_size=c.mamba_d_state,
                                      conv_kernel=c.mamba_d_conv)
        return shapes, _mamba_state_dtype(BF16, "auto", ssm)
    if arch == "JambaForCausalLM":
        shapes = S.mamba1_state_shape(tp_world_size=tp, intermediate_size=c.mamba_expand * c.hidden_size,
                                      state_size=c.mamba_d_state, conv_kernel=c.mamba_d_conv)
        return shapes, _mamba_state_dtype(BF16, "auto", ssm)
    if arch == "MambaForCausalLM":
        shapes = S.mamba1_state_shape(tp_world_size=tp, intermediate_size=c.intermediate_size,
                                      state_size=c.state_size, conv_kernel=c.conv_kernel)
        return shapes, _mamba_state_dtype(BF16, "auto", ssm)
    if arch == "Mamba2ForCausalLM":
        intermediate_size = c.expand * c.hidden_size
        shapes = S.mamba2_state_shape(intermediate_size=intermediate_size, tp_world_size=tp,
                                      n_groups=c.n_groups, num_heads=c.num_heads, head_dim=c.head_dim,
                                      state_size=c.state_size, conv_kernel=c.conv_kernel, num_spec=0)
        return shapes, _mamba_state_dtype(BF16, "auto", ssm)
    if arch == "KimiLinearForCausalLM":
        la = c.linear_attn_config
        shapes = S.kda_state_shape(tp, la["num_heads"], la["head_dim"],
                                   conv_kernel_size=la["short_conv_kernel_size"], num_spec=0)
        return shapes, kda_state_dtype(BF16, "auto")
    raise ValueError(arch)


def mamba_page_size_bytes(shapes, dtypes):  # v1/kv_cache_interface.py MambaSpec.page_size_bytes
    return sum(math.prod(shape) * size for (shape, size) in zip(shapes, dtypes))


def attn_page_size_1_token(text, tp, mla):
    """FullAttentionSpec(block_size=1).page_size_bytes: 2 (K and V) × heads × head size × dtype;
    MLAAttentionSpec: one head of kv_lora_rank + qk_rope_head_dim (v1/kv_cache_interface.py)."""
    if mla:
        return 1 * 1 * (text["kv_lora_rank"] + text["qk_rope_head_dim"]) * BF16
    heads = max(1, text["num_key_value_heads"] // tp)
    head = text.get("head_dim") or text.get("attention_head_dim") or 128
    return 2 * 1 * heads * head * BF16


def align_hybrid_block_size(block_size, mamba_page_size, attn_page_1, kernel_min=16):
    """platforms/interface.py _align_hybrid_block_size, mamba_cache_mode "none"."""
    kernel_block_alignment_size = max(kernel_min, block_size)
    attn_block_size = kernel_block_alignment_size * cdiv(
        mamba_page_size,
        kernel_block_alignment_size * attn_page_1,
    )
    if block_size < attn_block_size:
        block_size = attn_block_size
    return block_size


def align_hybrid_block_size_0_26_all(block_size, mamba_page_size, attn_page_1, base_chunk_size,
                                     kernel_min=16):
    """vLLM 0.26.0 _align_hybrid_block_size, mamba_cache_mode "all" (prefix caching on, a model
    with SupportsMambaPrefixCaching); base_chunk_size = model_config.get_mamba_chunk_size()."""
    kernel_block_alignment_size = max(kernel_min, block_size)
    attn_tokens_per_mamba_state = cdiv(mamba_page_size, attn_page_1)
    chunk_size = math.lcm(base_chunk_size, kernel_block_alignment_size)
    attn_block_size = chunk_size * cdiv(attn_tokens_per_mamba_state, chunk_size)
    if block_size < attn_block_size:
        block_size = attn_block_size
    return block_size


def align_hybrid_block_size_0_33(block_size, mamba_page_size, attn_page_1, use_mla,
                                 mamba_cache_mode, checkpoint_alignment, kernel_min=16,
                                 backend_block_alignment=16):
    """vLLM 0.33.0 platforms/interface.py _align_hybrid_block_size; checkpoint_alignment is
    get_mamba_prefill_checkpoint_alignment (None unless every Mamba layer declares one: 64,
    FLASHINFER_GDN_CHECKPOINT_ALIGNMENT, for gated DeltaNet on Hopper)."""
    kernel_block_alignment_size = max(kernel_min, block_size)
    if use_mla:
        kernel_block_alignment_size = max(kernel_block_alignment_size, 128)
    if mamba_cache_mode == "align":
        kernel_block_alignment_size = math.lcm(
            kernel_block_alignment_size,
            checkpoint_alignment or 1,
        )
    attn_block_size = kernel_block_alignment_size * cdiv(
        mamba_page_size,
        kernel_block_alignment_size * attn_page_1,
    )
    attn_block_size = backend_block_alignment * cdiv(attn_block_size, backend_block_alignment)
    if block_size < attn_block_size:
        block_size = attn_block_size
    return block_size


def mamba_max_memory_pages(mode, max_model_len, block_size, num_prefill_checkpoint_blocks=0,
                           num_speculative_blocks=0):
    """MambaSpec.max_memory_usage_bytes ÷ page_size_bytes (0.33.0's; 0.26.0's lacks the
    checkpoint blocks)."""
    if mode == "all":
        return cdiv(max_model_len, block_size) + num_speculative_blocks
    elif mode == "align":
        return 2 + num_speculative_blocks + num_prefill_checkpoint_blocks
    else:
        return 1 + num_speculative_blocks


def group_size_of(counts):
    """v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size: the group size, and
    the number of groups of each kind."""
    min_num_layers = min(counts)
    group_size = min_num_layers
    max_num_layers = max(counts)
    if max_num_layers < min_num_layers * 1.5:
        group_size = max_num_layers
    return group_size, [cdiv(n, group_size) for n in counts]


def vllm(name, arch, kinds, tp, kv_bytes, max_model_len, mla=False, version="0.26.0",
         prefix_caching=None):
    """kinds: (attention layers, state layers). Returns the figures vLLM logs. version 0.33.0
    turns prefix caching on for hybrids by default (engine/arg_utils.py), so mamba cache mode
    "align" (MambaModelConfig); 0.26.0 keeps it off ("none"), or with --enable-prefix-caching
    "all" for SupportsMambaPrefixCaching models, else "align"."""
    text = config(name)
    shapes, dtypes = vllm_state(arch, text, tp)
    state = mamba_page_size_bytes(shapes, dtypes)
    attention, states = kinds
    if prefix_caching is None:
        prefix_caching = version == "0.33.0"
    gdn = arch.startswith("Qwen3")
    if not prefix_caching:
        mode = "none"
    elif version == "0.33.0":
        mode = "align"
    else:
        mode = "all" if arch in ("FalconH1ForCausalLM", "JambaForCausalLM",
                                 "NemotronHForCausalLM") else "align"
    checkpoint = 64 if (version == "0.33.0" and mode == "align" and gdn) else None
    if attention and mode != "none":
        a1 = attn_page_size_1_token(text, tp, mla)
        if version == "0.33.0":
            block = align_hybrid_block_size_0_33(16, state, a1, mla, mode, checkpoint)
        elif mode == "all":
            chunk = text.get("mamba_chunk_size") or text.get("chunk_size") or 2048
            block = align_hybrid_block_size_0_26_all(16, state, a1, chunk)
        else:
            block = align_hybrid_block_size(16, state, a1)
        page = block * a1
        group_size, (full_groups, state_groups) = group_size_of([attention, states])
        state_pages = mamba_max_memory_pages(mode, max_model_len, block,
                                             num_prefill_checkpoint_blocks=int(bool(checkpoint)))
        per_request = full_groups * cdiv(max_model_len, block) + state_groups * state_pages
        num_blocks = int(kv_bytes // page // group_size)
        max_concurrency = num_blocks / per_request
        tokens = int(max_concurrency * max_model_len)
        print(f"vLLM {version} {name} TP{tp} mode {mode}: state {state} B; block {block}; "
              f"page {page}; group size {group_size}; blocks {num_blocks}; blocks a request of "
              f"{max_model_len}: {per_request}; concurrency {max_concurrency:.4f}; KV cache "
              f"{tokens} tokens")
        return state, block, num_blocks, per_request, tokens
    if attention == 0:
        # Attention-free: one uniform group of MambaSpec layers (is_kv_cache_spec_uniform),
        # page = the state, one block a request (max_memory_usage_bytes, mode "none").
        page, group_size, block = state, states, None
        per_request = 1
    else:
        a1 = attn_page_size_1_token(text, tp, mla)
        block = align_hybrid_block_size(16, state, a1)
        page = block * a1
        assert page >= state
        group_size, (full_groups, state_groups) = group_size_of([attention, states])
        # get_max_concurrency_for_kv_cache_config: Σ max_memory_usage_bytes ÷ the block
        per_request = cdiv(
            group_size * (full_groups * cdiv(max_model_len, block) * page + state_groups * page),
            page * group_size,
        )
    num_blocks = int(kv_bytes // page // group_size)  # get_num_blocks
    max_concurrency = num_blocks / per_request
    tokens = int(max_concurrency * max_model_len)  # get_kv_cache_capacity
    print(f"vLLM 0.26.0 {name} TP{tp}: state {state} B a layer ({shapes}, {dtypes}); block {block}; "
          f"page {page}; group size {group_size}; blocks {num_blocks}; blocks a request of "
          f"{max_model_len}: {per_request}; concurrency {max_concurrency:.4f}; KV cache {tokens} tokens")
    return state, block, num_blocks, per_request, tokens


# --------------------------------------------------------------- SGLang 0.5.9
# configs/mamba_utils.py


def extra_groups_for_head_shards(ngroups, tp_size):
    if ngroups % tp_size == 0:
        return 0
    return tp_size - ngroups


def mamba2_state_shape_create(*, tp_world_size, intermediate_size, n_groups, num_heads, head_dim,
                              state_size, conv_kernel):
    """Mamba2StateShape.create (conv, temporal)."""
    if n_groups % tp_world_size != 0:
        extra_groups = extra_groups_for_head_shards(n_groups, tp_world_size)
        n_groups += extra_groups
    conv_dim = intermediate_size + 2 * n_groups * state_size

    conv_state_shape = divide(conv_dim, tp_world_size), conv_kernel - 1

    temporal_state_shape = (divide(num_heads, tp_world_size), head_dim, state_size)
    return [conv_state_shape], temporal_state_shape


def kimi_linear_state_shape_create(*, tp_world_size, num_heads, head_dim, num_k_heads=None,
                                   head_k_dim=None, conv_kernel_size=4, num_spec=0):
    """KimiLinearStateShape.create (conv, temporal)."""
    if num_k_heads is None:
        num_k_heads = num_heads
    if head_k_dim is None:
        head_k_dim = head_dim

    proj_size = num_heads * head_dim
    proj_k_size = num_k_heads * head_k_dim

    conv_state_shape = (divide(proj_size, tp_world_size), conv_kernel_size - 1)
    conv_state_k_shape = (divide(proj_k_size, tp_world_size), conv_kernel_size - 1)
    temporal_state_shape = (divide(num_heads, tp_world_size), head_dim, head_dim)

    conv_state_shape = conv_state_shape[1], conv_state_shape[0]
    conv_state_k_shape = conv_state_k_shape[1], conv_state_k_shape[0]
    return [conv_state_shape, conv_state_k_shape, conv_state_k_shape], temporal_state_shape


ENV = {}  # SGLANG_MAMBA_SSM_DTYPE, which --mamba-ssm-dtype sets (server_args.py)


def mamba2_state_dtype(text):
    """mamba2_state_dtype: conv bfloat16 (SGLANG_MAMBA_CONV_DTYPE), temporal the config's
    mamba_ssm_dtype, else float32; SGLANG_MAMBA_SSM_DTYPE over both."""
    ssm_dtype = SIZES.get(text.get("mamba_ssm_dtype"), F32)
    env_ssm_dtype = ENV.get("SGLANG_MAMBA_SSM_DTYPE")
    if env_ssm_dtype is not None:
        ssm_dtype = SIZES[env_ssm_dtype]
    return BF16, ssm_dtype


def mamba_cache_per_req(conv, temporal, dtype, layers):
    """BaseLinearStateParams.mamba_cache_per_req."""
    conv_numel = int(sum(math.prod(conv_shape) for conv_shape in conv))
    ssm_numel = int(math.prod(temporal))
    return (conv_numel * dtype[0] + ssm_numel * dtype[1]) * layers


def sglang_params(arch, text, tp):
    """Each config's mamba2_cache_params (configs/qwen3_next.py, nemotron_h.py, falcon_h1.py,
    kimi_linear.py): (conv, temporal, dtype, state layers, full-attention layers)."""
    c = Obj(text)
    n = c.num_hidden_layers
    if arch in ("Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",
                "Qwen3_5MoeForConditionalGeneration"):
        # Qwen3NextConfig.layers_block_type (Qwen3_5TextConfig inherits it)
        linear = [l for l in range(n) if (l + 1) % c.full_attention_interval != 0]
        conv, temporal = mamba2_state_shape_create(
            tp_world_size=tp, intermediate_size=c.linear_value_head_dim * c.linear_num_value_heads,
            n_groups=c.linear_num_key_heads, num_heads=c.linear_num_value_heads,
            head_dim=c.linear_value_head_dim, state_size=c.linear_key_head_dim,
            conv_kernel=c.linear_conv_kernel_dim)
        return conv, temporal, mamba2_state_dtype(text), len(linear), n - len(linear)
    if arch == "NemotronHForCausalLM":
        mamba = [i for i in range(n) if c.hybrid_override_pattern[i] == "M"]
        full = [i for i in range(n) if c.hybrid_override_pattern[i] == "*"]
        conv, temporal = mamba2_state_shape_create(
            tp_world_size=tp, intermediate_size=c.mamba_num_heads * c.mamba_head_dim,
            n_groups=c.n_groups, num_heads=c.mamba_num_heads, head_dim=c.mamba_head_dim,
            state_size=c.ssm_state_size, conv_kernel=c.conv_kernel)
        return conv, temporal, mamba2_state_dtype(text), len(mamba), len(full)
    if arch == "FalconH1ForCausalLM":
        mamba_d_ssm = getattr(c, "mamba_d_ssm", None)
        mamba_intermediate = c.mamba_expand * c.hidden_size if mamba_d_ssm is None else mamba_d_ssm
        conv, temporal = mamba2_state_shape_create(
            tp_world_size=tp, intermediate_size=mamba_intermediate, n_groups=c.mamba_n_groups,
            num_heads=c.mamba_n_heads, head_dim=c.mamba_d_head, state_size=c.mamba_d_state,
            conv_kernel=c.mamba_d_conv)
        return conv, temporal, mamba2_state_dtype(text), n, n
    if arch == "KimiLinearForCausalLM":
        la = c.linear_attn_config
        kda = [i for i in range(n) if (i + 1) in la["kda_layers"]]
        conv, temporal = kimi_linear_state_shape_create(
            tp_world_size=tp, num_heads=la["num_heads"], head_dim=la["head_dim"],
            conv_kernel_size=la["short_conv_kernel_size"])
        # KimiLinearCacheParams keeps the default dtype, mamba2_state_dtype(None).
        return conv, temporal, (BF16, F32), len(kda), n - len(kda)
    raise ValueError(arch)


def calculate_mamba_ratio_0_5_23(disable_radix_cache, extra_buffer, overlap):
    """SGLang 0.5.23 kv_cache_configurator.py _calculate_mamba_ratio (SGLANG_OPT_MAMBA_SKIP_
    DECODE_LOCK off) with allocation_sizing.get_mamba_tracking_slots."""
    MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3
    if disable_radix_cache:
        return 1
    base = MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO
    additional_ratio = 0
    if extra_buffer:
        additional_ratio = 2 if overlap else 1  # get_mamba_tracking_slots, not lazy
    return base + additional_ratio


def sglang_0_5_23(name, arch, tp, rest_gib, mla=False):
    """SGLang 0.5.23 _handle_max_mamba_cache, ratio path, no speculative decoding, PP 1: the
    pool's padding slot; the request cap max_mamba_cache_size // _calculate_mamba_ratio(), the
    radix cache's strategy resolved to extra_buffer (_mamba_radix_cache_resolution: overlap
    scheduler on, the architecture in _MAMBA_EXTRA_BUFFER_ARCHS, linear_attn_backend triton)."""
    text = config(name)
    conv, temporal, dtype, state_layers, full_layers = sglang_params(arch, text, tp)
    per_req = mamba_cache_per_req(conv, temporal, dtype, state_layers)
    stage_per_req = int(per_req * 1.0)
    extra_per_slot = 0
    replayssm_fixed_bytes = 0
    mamba_full_memory_ratio = 0.9
    total_rest_memory = rest_gib
    mamba_budget = total_rest_memory * mamba_full_memory_ratio / (1 + mamba_full_memory_ratio)
    mamba_budget_bytes = mamba_budget * (1 << 30)
    per_slot = stage_per_req + extra_per_slot
    max_mamba_cache_size = int((mamba_budget_bytes - replayssm_fixed_bytes - per_slot) // per_slot)
    mamba_state_memory = (
        (max_mamba_cache_size + 1) * (stage_per_req + extra_per_slot) + replayssm_fixed_bytes
    ) / (1 << 30)
    rest_memory = total_rest_memory - mamba_state_memory
    if mla:
        cell_size = (text["kv_lora_rank"] + text["qk_rope_head_dim"]) * full_layers * BF16
    else:
        heads = max(1, text["num_key_value_heads"] // tp)
        head = text.get("head_dim") or 128
        cell_size = heads * head * 2 * full_layers * BF16
    tokens = int(rest_memory * (1 << 30)) // cell_size
    cap = max_mamba_cache_size // calculate_mamba_ratio_0_5_23(False, True, True)
    print(f"SGLang 0.5.23 {name} TP{tp}: state {per_req} B a request; slots "
          f"{max_mamba_cache_size}; cell {cell_size}; tokens {tokens}; request cap {cap}")
    return per_req, max_mamba_cache_size, cell_size, tokens, cap


def sglang(name, arch, tp, rest_gib, mla=False):
    """model_executor/model_runner_kv_cache_mixin.py: profile_max_num_token with
    handle_max_mamba_cache (ratio 0.9, no speculative decoding), and model_runner.py's request
    cap min(4096 or 2048 …, max_mamba_cache_size // 3)."""
    text = config(name)
    conv, temporal, dtype, state_layers, full_layers = sglang_params(arch, text, tp)
    per_req = mamba_cache_per_req(conv, temporal, dtype, state_layers)
    mamba_full_memory_ratio = 0.9
    total_rest_memory = rest_gib
    mamba_state_memory_raw = (
        total_rest_memory * mamba_full_memory_ratio / (1 + mamba_full_memory_ratio)
    )
    max_mamba_cache_size = int((mamba_state_memory_raw * (1 << 30)) // per_req)
    mamba_state_memory = max_mamba_cache_size * per_req / (1 << 30)
    rest_memory = total_rest_memory - mamba_state_memory
    # get_cell_size_per_token(num_layers = the full-attention layers)
    if mla:
        cell_size = (text["kv_lora_rank"] + text["qk_rope_head_dim"]) * full_layers * BF16
    else:
        heads = max(1, text["num_key_value_heads"] // tp)
        head = text.get("head_dim") or 128
        cell_size = heads * head * 2 * full_layers * BF16
    tokens = int(rest_memory * (1 << 30)) // cell_size
    # server_args.py _handle_mamba_radix_cache: Kimi-Linear support_mamba_cache=False, so
    # disable_radix_cache = True; model_runner_kv_cache_mixin.py: ratio 1 then, else
    # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO (3; the no_buffer strategy adds nothing).
    disable_radix_cache = arch in ("KimiLinearForCausalLM", "BailingMoeV2_5ForCausalLM")
    ratio = 1 if disable_radix_cache else 3
    cap = max_mamba_cache_size // ratio
    print(f"SGLang 0.5.9 {name} TP{tp}: state {per_req} B a request ({conv}, {temporal}, {dtype}, "
          f"{state_layers} layers); slots {max_mamba_cache_size}; cell {cell_size}; "
          f"max_total_num_tokens {tokens}; request cap {cap}")
    return per_req, max_mamba_cache_size, cell_size, tokens, cap


if __name__ == "__main__":
    kv = 20 * GIB
    vllm("qwen3.5-35b-a3b", "Qwen3_5MoeForConditionalGeneration", (10, 30), 1, kv, 8192)
    vllm("qwen3.5-27b", "Qwen3_5ForConditionalGeneration", (16, 48), 2, kv, 8192)
    vllm("nemotron-h-8b", "NemotronHForCausalLM", (4, 24), 1, kv, 8192)
    vllm("falcon-h1-1.5b", "FalconH1ForCausalLM", (24, 24), 1, kv, 8192)
    vllm("jamba-v0.1", "JambaForCausalLM", (4, 28), 1, kv, 8192)
    vllm("mamba-2.8b", "MambaForCausalLM", (0, 64), 1, kv, 8192)
    vllm("mamba-codestral-7b", "Mamba2ForCausalLM", (0, 64), 1, kv, 8192)
    vllm("kimi-linear-48b-a3b", "KimiLinearForCausalLM", (7, 20), 1, kv, 8192, mla=True)
    sglang("qwen3.5-35b-a3b", "Qwen3_5MoeForConditionalGeneration", 1, 20.0)
    sglang("nemotron-h-8b", "NemotronHForCausalLM", 1, 20.0)
    sglang("falcon-h1-1.5b", "FalconH1ForCausalLM", 1, 20.0)
    sglang("kimi-linear-48b-a3b", "KimiLinearForCausalLM", 1, 20.0, mla=True)
    vllm("qwen3.5-35b-a3b", "Qwen3_5MoeForConditionalGeneration", (10, 30), 1, kv, 8192,
         version="0.33.0")
    vllm("nemotron-h-8b", "NemotronHForCausalLM", (4, 24), 1, kv, 8192, version="0.33.0")
    vllm("kimi-linear-48b-a3b", "KimiLinearForCausalLM", (7, 20), 1, kv, 8192, mla=True,
         version="0.33.0")
    vllm("nemotron-h-8b", "NemotronHForCausalLM", (4, 24), 1, kv, 8192, prefix_caching=True)
    vllm("qwen3.5-35b-a3b", "Qwen3_5MoeForConditionalGeneration", (10, 30), 1, kv, 8192,
         prefix_caching=True)
    sglang_0_5_23("qwen3.5-35b-a3b", "Qwen3_5MoeForConditionalGeneration", 1, 20.0)
    sglang_0_5_23("nemotron-h-8b", "NemotronHForCausalLM", 1, 20.0)
    sglang_0_5_23("kimi-linear-48b-a3b", "KimiLinearForCausalLM", 1, 20.0, mla=True)
    GIVEN["mamba_ssm_cache_dtype"] = "bfloat16"
    vllm("nemotron-h-8b", "NemotronHForCausalLM", (4, 24), 1, kv, 8192)
    ENV["SGLANG_MAMBA_SSM_DTYPE"] = "bfloat16"
    sglang("qwen3.5-35b-a3b", "Qwen3_5MoeForConditionalGeneration", 1, 20.0)
