#!/usr/bin/env python3
"""Reference figures for `gpureap plan` on sparse-attention (DSA) models
and on Step-3.5's hybrid sliding window.

The engines' own pure-Python functions, copied from the released packages
with torch dtypes replaced by their byte sizes, run on the shapes of
tests/fixtures/models/{deepseek-v3.2,glm-5,step-3.5-flash}. The unit tests
in crates/services/src/plan/tests_sparse.rs and tests_step.rs pin the
numbers this prints; plan's own formula is not used here (the Step-3.5
sources are listed at its section below).

Sources (copied verbatim, dtype objects replaced by byte counts):
- vLLM 0.26.0 vllm/model_executor/models/deepseek_v2.py: Indexer.__init__
  (the k_cache head_dim, dtype uint8) and DeepseekV32IndexerCache.
  get_kv_cache_spec; vllm/v1/kv_cache_interface.py:
  MLAAttentionSpec.real_page_size_bytes, UniformTypeKVCacheSpecs.
  page_size_bytes / max_memory_usage_bytes, FullAttentionSpec.
  max_memory_usage_bytes; vllm/v1/core/kv_cache_utils.py:
  get_kv_cache_config_from_groups (the UniformTypeKVCacheSpecs branch),
  get_max_concurrency_for_kv_cache_config, get_kv_cache_capacity;
  vllm/v1/attention/backend.py AttentionBackend.get_preferred_block_size
  with FlashAttnMLASparseBackend / FlashMLASparseBackend
  .get_supported_kernel_block_sizes ([64]).
- SGLang 0.5.9 sglang/srt/model_executor/model_runner_kv_cache_mixin.py:
  get_cell_size_per_token (MLA branch with the NSA indexer term),
  profile_max_num_token's `int(rest * (1 << 30)) // cell_size`;
  mem_cache/memory_pool.py NSATokenToKVPool.quant_block_size (128),
  index_k_with_scale_buffer_dtype (uint8); server_args.py
  _handle_model_specific_adjustments (page_size = 64) and
  _set_default_nsa_kv_cache_dtype (bfloat16 below SM100);
  model_runner_kv_cache_mixin.py init_memory_pool's page floor.
- SGLang 0.5.23 sglang/srt/mem_cache/kv_cache_configurator.py
  calculate_mla_kv_cache_dim and model_executor/pool_configurator.py
  _compute_cell_size / _compute_dsa_indexer_cell_size (below).

Run: python3 scripts/plan_reference_dsa.py
"""

GIB = 1 << 30


def cdiv(a, b):
    return -(a // -b)


# ---------------------------------------------------------------- vLLM 0.26.0


class MLAAttentionSpec:
    """vllm/v1/kv_cache_interface.py (fp8_ds_mla and plain branches)."""

    def __init__(self, block_size, num_kv_heads, head_size, dtype_size,
                 cache_dtype_str=None, model_version=None):
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.dtype_size = dtype_size
        self.cache_dtype_str = cache_dtype_str
        self.model_version = model_version
        self.compress_ratio = 1

    @property
    def storage_block_size(self):
        return self.block_size // self.compress_ratio

    @property
    def real_page_size_bytes(self):
        if self.cache_dtype_str == "fp8_ds_mla":
            if self.model_version == "deepseek_v4":
                return self.storage_block_size * 584
            return self.block_size * 656
        head_dim = self.head_size
        return (
            self.storage_block_size
            * self.num_kv_heads
            * head_dim
            * self.dtype_size
        )

    @property
    def page_size_bytes(self):
        return self.real_page_size_bytes

    def max_memory_usage_bytes(self, max_model_len, dcp_world_size=1):
        # FullAttentionSpec.max_memory_usage_bytes
        max_model_len = cdiv(max_model_len, dcp_world_size)
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes


class UniformTypeKVCacheSpecs:
    def __init__(self, block_size, kv_cache_specs):
        self.block_size = block_size
        self.kv_cache_specs = kv_cache_specs

    @property
    def page_size_bytes(self):
        return sum(spec.page_size_bytes for spec in self.kv_cache_specs.values())

    def max_memory_usage_bytes(self, max_model_len):
        max_num_pages = max(
            cdiv(spec.max_memory_usage_bytes(max_model_len), spec.page_size_bytes)
            for spec in self.kv_cache_specs.values()
        )
        return max_num_pages * self.page_size_bytes


def get_preferred_block_size(supported_sizes, default_block_size=16):
    # AttentionBackend.get_preferred_block_size / supports_block_size
    if not supported_sizes:
        return default_block_size
    if any(default_block_size % s == 0 for s in supported_sizes):
        return default_block_size
    return min(supported_sizes)


def vllm_dsa(layers, kv_lora_rank, qk_rope_head_dim, index_head_dim,
             cache_dtype, available_memory, max_model_len):
    """cache_dtype: 'auto' (bf16 model) or 'fp8' (FLASHMLA_SPARSE,
    canonicalized to fp8_ds_mla)."""
    block_size = get_preferred_block_size([64])
    head_size = kv_lora_rank + qk_rope_head_dim  # MLAAttention.head_size
    specs = {}
    for i in range(layers):
        # Indexer.__init__: DeepseekV32IndexerCache(head_dim=self.head_dim +
        # self.head_dim // self.quant_block_size * 4, dtype=torch.uint8)
        quant_block_size = 128
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = MLAAttentionSpec(
            block_size=block_size,
            num_kv_heads=1,
            head_size=index_head_dim + index_head_dim // quant_block_size * 4,
            dtype_size=1,
        )
        if cache_dtype == "fp8":
            specs[f"model.layers.{i}.self_attn.attn"] = MLAAttentionSpec(
                block_size=block_size, num_kv_heads=1, head_size=head_size,
                dtype_size=1, cache_dtype_str="fp8_ds_mla")
        else:
            specs[f"model.layers.{i}.self_attn.attn"] = MLAAttentionSpec(
                block_size=block_size, num_kv_heads=1, head_size=head_size,
                dtype_size=2, cache_dtype_str="auto")
    spec = UniformTypeKVCacheSpecs(block_size=block_size, kv_cache_specs=specs)
    # get_kv_cache_config_from_groups, UniformTypeKVCacheSpecs branch
    num_blocks = available_memory // spec.page_size_bytes
    # get_max_concurrency_for_kv_cache_config
    num_layer_per_group = len(specs)
    max_memory_usage_per_request = num_layer_per_group * spec.max_memory_usage_bytes(
        max_model_len)
    memory_per_block = spec.page_size_bytes * num_layer_per_group
    num_block_per_request = cdiv(max_memory_usage_per_request, memory_per_block)
    max_concurrency = num_blocks / num_block_per_request
    # get_kv_cache_capacity
    tokens = int(max_concurrency * max_model_len)
    return dict(block_size=block_size, page_size_bytes=spec.page_size_bytes,
                num_blocks=num_blocks, num_block_per_request=num_block_per_request,
                max_concurrency=max_concurrency, kv_cache_tokens=tokens)


def vllm_indexer_weight_bytes(layers, hidden_size, q_lora_rank, index_head_dim,
                              index_n_heads, bytes_per_weight=2):
    """The indexer's linear weights (vLLM 0.26.0 deepseek_v2.py Indexer:
    wq_b ReplicatedLinear(q_lora_rank, head_dim * n_head); wk_weights_proj
    MergedColumnParallelLinear(hidden_size, [head_dim, n_head],
    disable_tp=True)), every rank holding them whole; k_norm left out."""
    wq_b = q_lora_rank * (index_head_dim * index_n_heads)
    wk_weights_proj = hidden_size * (index_head_dim + index_n_heads)
    return (wq_b + wk_weights_proj) * layers * bytes_per_weight


# ---------------------------------------------------------------- vLLM 0.33.0
# vllm/v1/kv_cache_interface.py: AttentionSpec.state_content_size_bytes /
# unpadded_page_size_bytes / page_size_bytes, KVCacheSpec.num_states /
# get_block_stride_alignment, FullAttentionSpec.max_memory_usage_bytes,
# MLAAttentionSpec.head_size_v = 0; model_executor/layers/attention/
# mla_attention.py MLAAttention.get_kv_cache_spec (state_content_bytes
# {"fp8_ds_mla": 656}); deepseek_v2.py DeepseekV32IndexerCache.
# get_kv_cache_spec; v1/worker/utils.py customize_attention_spec and the
# backends' customize_spec (MultipleOf(64) / align_blocks_to_rows);
# platforms/interface.py _preferred_block_size_for_backends;
# v1/core/kv_cache_planning.py _get_kv_cache_bytes_per_block,
# get_kv_cache_configs (num_blocks = available // bytes_per_block);
# v1/core/kv_cache_utils.py get_max_concurrency_for_kv_cache_config,
# get_kv_cache_capacity.


def round_up(x, y):
    return ((x + y - 1) // y) * y


class MultipleOf:
    def __init__(self, base):
        self.base = base


class AttentionSpec033:
    def __init__(self, block_size, num_kv_heads, head_size, dtype_size,
                 state_content_bytes=None, block_stride_alignment=None):
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.head_size_v = 0  # MLAAttentionSpec.head_size_v
        self.dtype_size = dtype_size
        self.state_content_bytes = state_content_bytes
        self.block_stride_alignment = block_stride_alignment
        self.tokens_per_state = 1
        self.num_head_slots = None

    @property
    def num_heads(self):
        if self.num_head_slots is not None:
            return self.num_head_slots
        return self.num_kv_heads

    @property
    def num_states(self):
        return self.get_num_kernel_states(self.block_size)

    def get_num_kernel_states(self, kernel_block_size):
        if self.tokens_per_state > 0:
            return kernel_block_size // self.tokens_per_state
        return 1

    @property
    def state_content_size_bytes(self):
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        return (self.head_size + self.head_size_v) * self.dtype_size

    @property
    def page_size_bytes(self):
        return self.num_heads * self.num_states * self.state_content_size_bytes

    def copy_with_new_block_size(self, block_size):
        return AttentionSpec033(block_size, self.num_kv_heads, self.head_size,
                                self.dtype_size, self.state_content_bytes,
                                self.block_stride_alignment)

    def get_block_stride_alignment(self):
        alignment = self.block_stride_alignment
        if not isinstance(alignment, MultipleOf):
            return alignment or 1
        import math
        kernel_block_size = math.gcd(alignment.base, self.block_size)
        if kernel_block_size == self.block_size:
            return 1
        return self.copy_with_new_block_size(kernel_block_size).page_size_bytes

    def max_memory_usage_bytes(self, max_model_len):
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes


def vllm_0_33_dsa(layers, kv_lora_rank, qk_rope_head_dim, index_head_dim,
                  cache_dtype, available_memory, max_model_len):
    # _preferred_block_size_for_backends: FLASH_ATTN_MLA_SPARSE (or
    # FLASHMLA_SPARSE) [MultipleOf(64)] and DEEPSEEK_V32_INDEXER [64]: the
    # smallest LCM both accept, 64.
    block_size = 64
    specs = []
    for _ in range(layers):
        if cache_dtype == "fp8":
            # FLASHMLA_SPARSE, fp8_ds_mla; customize_spec off SM100:
            # block_stride_alignment=MultipleOf(64)
            main = AttentionSpec033(block_size, 1, kv_lora_rank + qk_rope_head_dim, 1,
                                    state_content_bytes=656,
                                    block_stride_alignment=MultipleOf(64))
        else:
            # FLASH_ATTN_MLA_SPARSE customize_spec: align_blocks_to_rows
            main = AttentionSpec033(block_size, 1, kv_lora_rank + qk_rope_head_dim, 2)
            main.block_stride_alignment = 1 * main.state_content_size_bytes
        # customize_attention_spec: fixed kernel sizes [64] ->
        # block_stride_alignment = MultipleOf(64)
        indexer = AttentionSpec033(block_size, 1, index_head_dim + index_head_dim // 128 * 4, 1,
                                   block_stride_alignment=MultipleOf(64))
        specs += [indexer, main]
    # _get_kv_cache_bytes_per_block, layer-outer layout (each layer's stride
    # its own padded page)
    bytes_per_block = sum(round_up(spec.page_size_bytes, spec.get_block_stride_alignment())
                          for spec in specs)
    num_blocks = available_memory // bytes_per_block
    # get_max_concurrency_for_kv_cache_config: one UniformTypeKVCacheSpecs group
    group_page = sum(spec.page_size_bytes for spec in specs)
    group_max = max(cdiv(spec.max_memory_usage_bytes(max_model_len), spec.page_size_bytes)
                    for spec in specs) * group_page
    num_blocks_per_request = cdiv(group_max, group_page)
    max_concurrency = num_blocks / num_blocks_per_request
    return dict(bytes_per_block=bytes_per_block, num_blocks=num_blocks,
                max_concurrency=max_concurrency,
                kv_cache_tokens=int(max_concurrency * max_model_len))


# -------------------------------------------------------------- SGLang 0.5.9


def sglang_dsa(layers, kv_lora_rank, qk_rope_head_dim, index_head_dim,
               kv_size, rest_gib):
    # get_cell_size_per_token, use_mla_backend branch
    num_layers = layers
    cell_size = (kv_lora_rank + qk_rope_head_dim) * num_layers * kv_size
    # NSATokenToKVPool.quant_block_size, index_k_with_scale_buffer_dtype
    quant_block_size = 128
    indexer_size_per_token = index_head_dim + index_head_dim // quant_block_size * 4
    element_size = 1
    cell_size += indexer_size_per_token * num_layers * element_size
    # profile_max_num_token
    max_num_token = int(rest_gib * (1 << 30)) // cell_size
    # server_args: page_size = 64 for DeepSeek DSA on CUDA;
    # init_memory_pool: floor to the page
    page_size = 64
    max_total_num_tokens = max_num_token // page_size * page_size
    return dict(cell_size=cell_size, profiled=max_num_token,
                max_total_num_tokens=max_total_num_tokens, page_size=page_size)


# ------------------------------------------------------------- SGLang 0.5.23
# sglang/srt/mem_cache/kv_cache_configurator.py calculate_mla_kv_cache_dim
# (the CUDA, non-trtllm, non-TileLang branch: Hopper's fp8 default backend
# is flashmla_kv, arg_groups/overrides.py) and
# model_executor/pool_configurator.py _compute_cell_size (MLA branch, no
# hisparse, no CP layer split) / _compute_dsa_indexer_cell_size (index_kpool
# 1, every layer computes its own top-k).


def calculate_mla_kv_cache_dim(kv_lora_rank, qk_rope_head_dim, is_fp8):
    kv_cache_dim = kv_lora_rank + qk_rope_head_dim
    quant_block_size = 128  # DSATokenToKVPool.quant_block_size
    rope_storage_itemsize = 2  # DSATokenToKVPool.rope_storage_dtype bfloat16
    if is_fp8:
        return (
            kv_lora_rank
            + kv_lora_rank // quant_block_size * 4
            + qk_rope_head_dim * rope_storage_itemsize
        )
    return kv_cache_dim


def sglang_0_5_23_dsa(layers, kv_lora_rank, qk_rope_head_dim, index_head_dim,
                      kv_size, rest_gib):
    effective_num_layers = layers
    cell_size = (
        calculate_mla_kv_cache_dim(kv_lora_rank, qk_rope_head_dim, kv_size == 1)
        * effective_num_layers
        * kv_size
    )
    index_kpool = 1
    indexer_size_per_token = cdiv(index_head_dim + index_head_dim // 128 * 4, index_kpool)
    element_size = 1
    num_indexer_layers = layers
    indexer_ratio = 1
    cell_size += int(indexer_size_per_token * num_indexer_layers * element_size * indexer_ratio)
    max_num_token = int(rest_gib * (1 << 30)) // cell_size
    page_size = 64 * index_kpool
    return dict(cell_size=cell_size, profiled=max_num_token,
                max_total_num_tokens=max_num_token // page_size * page_size)


# ------------------------------------------- Step-3.5 (hybrid sliding window)
# vLLM 0.26.0: model_executor/models/step3p5.py (Step3p5DecoderLayer: KV
# heads num_attention_groups, or attention_other_setting's for the
# layer_types entries of its attention_type; Step3p5Attention: a layer
# slides when layer_types[i] == "sliding_attention", window
# config.sliding_window); v1/kv_cache_interface.py FullAttentionSpec /
# SlidingWindowSpec (page_size_bytes, max_admission_blocks_per_request);
# v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size,
# get_kv_cache_config_from_groups (general case), get_num_blocks,
# _max_memory_usage_bytes_from_groups / get_max_concurrency_for_kv_cache_config,
# get_kv_cache_capacity; config/vllm.py max_concurrent_batches (V1 runner,
# async scheduling, no PP: 2), max_in_flight_tokens.
# SGLang 0.5.9: configs/model_config.py get_hybrid_layer_ids (Step3p5),
# get_num_kv_heads / get_swa_num_kv_heads (attention_other_setting);
# model_runner_kv_cache_mixin.py get_cell_size_per_token (is_hybrid_swa
# branch), set_num_tokens_hybrid_swa.


def step3p5_layers(layer_types, num_hidden_layers):
    swa = [i for i, x in enumerate(layer_types)
           if x == "sliding_attention" and i < num_hidden_layers]
    full = [i for i, x in enumerate(layer_types)
            if x == "full_attention" and i < num_hidden_layers]
    return full, swa


def vllm_step3p5(layer_types, num_hidden_layers, kv_heads, head_dim, tp,
                 sliding_window, available_memory, max_model_len,
                 max_num_batched_tokens=8192):
    block_size = 16  # FLASH_ATTN on Hopper: CacheConfig.DEFAULT_BLOCK_SIZE
    num_kv_heads = max(1, kv_heads // tp)
    page_size = block_size * num_kv_heads * (head_dim + head_dim) * 2  # bf16
    full, swa = step3p5_layers(layer_types, num_hidden_layers)
    same_type_layers = {"full": full, "swa": swa}
    # _get_kv_cache_groups_uniform_page_size
    min_num_layers = min([len(layers) for layers in same_type_layers.values()])
    group_size = min_num_layers
    max_num_layers = max([len(layers) for layers in same_type_layers.values()])
    if max_num_layers < min_num_layers * 1.5:
        group_size = max_num_layers
    groups = []
    for kind, layers in same_type_layers.items():
        num_groups = cdiv(len(layers), group_size)
        for i in range(num_groups):
            groups.append((kind, layers[i::num_groups]))
    # get_kv_cache_config_from_groups, general case; get_num_blocks
    group_size = max(len(g[1]) for g in groups)
    num_blocks = int(available_memory // page_size // group_size)
    # max_memory_usage_bytes per group spec
    max_in_flight_tokens = 2 * max_num_batched_tokens

    def max_memory_usage_bytes(kind):
        if kind == "full":
            return cdiv(max_model_len, block_size) * page_size
        num_tokens = min(sliding_window - 1 + max_in_flight_tokens, max_model_len)
        return (cdiv(num_tokens, block_size) + 1) * page_size

    # get_max_concurrency_for_kv_cache_config
    num_layer_per_group = max(len(g[1]) for g in groups)
    max_memory_usage_per_request = num_layer_per_group * sum(
        max_memory_usage_bytes(kind) for kind, _ in groups)
    memory_per_block = page_size * num_layer_per_group
    num_block_per_request = cdiv(max_memory_usage_per_request, memory_per_block)
    max_concurrency = num_blocks / num_block_per_request
    return dict(full_groups=sum(1 for k, _ in groups if k == "full"),
                window_groups=sum(1 for k, _ in groups if k == "swa"),
                group_size=group_size, page_size=page_size, num_blocks=num_blocks,
                blocks_per_request=num_block_per_request,
                max_concurrency=max_concurrency,
                kv_cache_tokens=int(max_concurrency * max_model_len))


def sglang_hybrid_swa(full_layers_num, swa_layers_num, kv_heads, head_dim,
                      v_head_dim, swa_kv_heads, swa_head_dim, swa_v_head_dim, tp,
                      rest_gib, swa_full_tokens_ratio=0.8, page_size=1, kv_size=2):
    # get_cell_size_per_token, is_hybrid_swa branch
    full_per_token = max(1, kv_heads // tp) * (head_dim + v_head_dim)
    swa_per_token = max(1, swa_kv_heads // tp) * (swa_head_dim + swa_v_head_dim)
    cell_size = (full_per_token * full_layers_num + swa_per_token * swa_layers_num) * kv_size
    # profile_max_num_token, init_memory_pool's page floor
    max_total_num_tokens = int(rest_gib * (1 << 30)) // cell_size
    max_total_num_tokens = max_total_num_tokens // page_size * page_size
    # set_num_tokens_hybrid_swa
    full_per_token = max(1, kv_heads // tp) * (head_dim + v_head_dim) * kv_size
    swa_per_token = max(1, swa_kv_heads // tp) * (swa_head_dim + swa_v_head_dim) * kv_size
    total_memory = max_total_num_tokens * (
        full_per_token * full_layers_num + swa_per_token * swa_layers_num)
    denominator = (full_per_token * full_layers_num
                   + swa_full_tokens_ratio * swa_per_token * swa_layers_num)
    full_max_total_num_tokens = int(total_memory / denominator)
    swa_max_total_num_tokens = int(full_max_total_num_tokens * swa_full_tokens_ratio)

    def align_page_size(x):
        return (x // page_size) * page_size

    return dict(cell_size=cell_size, profiled=max_total_num_tokens,
                full_tokens=align_page_size(full_max_total_num_tokens),
                swa_tokens=align_page_size(swa_max_total_num_tokens))


def sglang_step3p5(layer_types, num_hidden_layers, kv_heads, swa_kv_heads,
                   head_dim, tp, rest_gib):
    full, swa = step3p5_layers(layer_types, num_hidden_layers)
    return sglang_hybrid_swa(len(full), len(swa), kv_heads, head_dim, head_dim,
                             swa_kv_heads, head_dim, head_dim, tp, rest_gib)


# MiMo-V2-Flash (SGLang 0.5.9 get_hybrid_layer_ids: hybrid_layer_pattern[i]
# == 1 is SWA; ModelConfig swa_head_dim / swa_v_head_dim,
# get_swa_num_kv_heads: swa_num_key_value_heads).
MIMO_PATTERN = [0 if i % 6 == 0 else 1 for i in range(48)]


def sglang_mimo(tp, rest_gib):
    swa = [i for i in range(48) if MIMO_PATTERN[i] == 1]
    full = [i for i in range(48) if MIMO_PATTERN[i] == 0]
    return sglang_hybrid_swa(len(full), len(swa), 4, 192, 128, 8, 192, 128, tp, rest_gib)


STEP3P5_LAYER_TYPES = ["full_attention" if i % 4 == 0 else "sliding_attention"
                       for i in range(48)]


if __name__ == "__main__":
    # DeepSeek-V3.2: 61 layers, kv_lora_rank 512, rope 64, index_head_dim 128.
    # GLM-5: 78 layers, the same MLA and indexer widths.
    for name, layers in (("deepseek-v3.2", 61), ("glm-5", 78)):
        for dtype in ("auto", "fp8"):
            print(name, "vllm", dtype, "40 GiB, max_model_len 32768",
                  vllm_dsa(layers, 512, 64, 128, dtype, 40 * GIB, 32768))
        for kv_size, label in ((2, "bfloat16"), (1, "fp8_e4m3")):
            print(name, "sglang", label, "rest 40 GiB",
                  sglang_dsa(layers, 512, 64, 128, kv_size, 40.0))
    print("deepseek-v3.2 sglang 0.5.23 fp8_e4m3 rest 40 GiB",
          sglang_0_5_23_dsa(61, 512, 64, 128, 1, 40.0))
    print("deepseek-v3.2 sglang 0.5.23 bfloat16 rest 40 GiB",
          sglang_0_5_23_dsa(61, 512, 64, 128, 2, 40.0))
    for dtype in ("auto", "fp8"):
        print("deepseek-v3.2 vllm 0.33.0", dtype, "40 GiB, max_model_len 32768",
              vllm_0_33_dsa(61, 512, 64, 128, dtype, 40 * GIB, 32768))
    print("deepseek-v3.2 indexer weights, 2 B a weight",
          vllm_indexer_weight_bytes(61, 7168, 1536, 128, 64))
    print("glm-5 indexer weights, 2 B a weight",
          vllm_indexer_weight_bytes(78, 6144, 2048, 128, 32))
    print("step-3.5-flash vllm tp4 40 GiB, max_model_len 32768",
          vllm_step3p5(STEP3P5_LAYER_TYPES, 45, 8, 128, 4, 512, 40 * GIB, 32768))
    print("step-3.5-flash sglang tp4 rest 40 GiB",
          sglang_step3p5(STEP3P5_LAYER_TYPES, 45, 8, 8, 128, 4, 40.0))
    print("mimo-v2-flash sglang tp4 rest 40 GiB", sglang_mimo(4, 40.0))
    print("mimo-v2-flash sglang tp8 rest 40 GiB", sglang_mimo(8, 40.0))
