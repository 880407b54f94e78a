//! Unit tests of sparse attention with an indexer cache (DeepSeek-V3.2,
//! GLM-5). Every expected figure comes from the engines' own functions,
//! copied into scripts/plan_reference_dsa.py (vLLM 0.26.0
//! `kv_cache_interface.py` / `kv_cache_utils.py` / `deepseek_v2.py`, SGLang
//! 0.5.9 `get_cell_size_per_token`, SGLang 0.5.23 `_compute_cell_size`),
//! which prints them; none is worked out with plan's own formula. The
//! configs (tests/fixtures/models/deepseek-v3.2, glm-5) were written from
//! the published ones without the hub at hand.

use super::PlanError;
use super::engine::{self, Cap};
use super::fit::{self, FitError};
use super::launch::KvDtype;
use super::model::{self, Attention};
use super::tests::{fixture, h100_kv, load, on_box, parse};
use super::version::Rules;
use std::path::Path;

const GIB: u64 = 1 << 30;

#[test]
fn sparse_attention_models_are_read_as_mla_with_their_indexer() {
    for (name, layers) in [("deepseek-v3.2", 61), ("glm-5", 78)] {
        let model = load(name);
        let mla = Attention::Mla {
            kv_lora_rank: 512,
            qk_rope_head_dim: 64,
        };
        assert_eq!(
            (model.attention, model.attention_vllm),
            (mla, mla),
            "{name}"
        );
        assert_eq!(model.layers, layers, "{name}");
        assert_eq!(
            model.sparse,
            Some(model::Sparse {
                index_head_dim: 128
            }),
            "{name}"
        );
        assert_eq!((model.window_vllm, model.window_sglang), (None, None));
    }
    // DeepSeek-V3.2's yarn scaling names its original length: 163,840.
    assert_eq!(load("deepseek-v3.2").max_position, Some(163_840));
    // The indexer's projections, which every rank holds whole, join the
    // replicated (and attention) weights: plan_reference_dsa.py
    // vllm_indexer_weight_bytes, at 2 bytes a weight (the estimate's).
    for (name, indexer) in [("deepseek-v3.2", 1_703_018_496), ("glm-5", 1_461_977_088)] {
        let sparse = load(name);
        let mut config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixture(name).join("config.json")).expect("fixture"),
        )
        .expect("json");
        config.as_object_mut().expect("object").remove("index_topk");
        let dense = model::parse_config(Path::new("config.json"), &config).expect(name);
        assert_eq!(dense.sparse, None);
        assert_eq!(
            sparse.replicated_bytes - dense.replicated_bytes,
            indexer,
            "{name}"
        );
        assert_eq!(
            sparse.attention_bytes - dense.attention_bytes,
            indexer,
            "{name}"
        );
    }
}

#[test]
fn vllm_sizes_sparse_mla_with_its_indexer_in_blocks_of_64() {
    // plan_reference_dsa.py vllm_dsa: 61 layers of (MLA 576 × 2 B + the
    // indexer's 132 B) × 64 tokens: UniformTypeKVCacheSpecs page
    // 5,012,736 B; 40 GiB // it = 8,568 blocks; a request of 32,768
    // tokens takes 512; concurrency 16.734375, 548,352 tokens logged.
    let v32 = load("deepseek-v3.2");
    let launch = parse("vllm serve m --tensor-parallel-size 8 --max-model-len 32768");
    let device = engine::device(&launch, &v32, &h100_kv(40 * GIB), Some((2000, 1000)));
    assert_eq!(device.page_size, 64);
    assert_eq!(device.bytes_per_token, 5_012_736 / 64);
    assert_eq!(device.hybrid, None);
    let logged = device.logged.expect("starts");
    assert_eq!(logged.kv_cache_tokens, 548_352);
    assert_eq!(logged.max_concurrency, Some(16.734375));
    assert_eq!(device.tokens_per_rank, 8_568 * 64);
    // Requests of 3,000 tokens: 548,352 / 3,000 at once, bound by the pool.
    let (at_once, cap) = engine::requests_at_once(&device, 3000);
    assert!((at_once - 548_352.0 / 3000.0).abs() < 1e-9);
    assert_eq!(cap, Cap::Pool);
    // --kv-cache-dtype fp8: FLASHMLA_SPARSE's fp8_ds_mla, 656 B a token and
    // layer: page 3,076,352 B, 13,961 blocks, 893,504 tokens, 27.267578125.
    let fp8 =
        parse("vllm serve m --tensor-parallel-size 8 --max-model-len 32768 --kv-cache-dtype fp8");
    let device = engine::device(&fp8, &v32, &h100_kv(40 * GIB), None);
    assert_eq!(device.bytes_per_token, 3_076_352 / 64);
    let logged = device.logged.expect("starts");
    assert_eq!(logged.kv_cache_tokens, 893_504);
    assert_eq!(logged.max_concurrency, Some(27.267578125));
    // GLM-5, 78 layers: page 6,409,728 B, 6,700 blocks, 428,800 tokens.
    let glm = load("glm-5");
    let device = engine::device(&launch, &glm, &h100_kv(40 * GIB), None);
    assert_eq!(device.bytes_per_token, 6_409_728 / 64);
    let logged = device.logged.expect("starts");
    assert_eq!(logged.kv_cache_tokens, 428_800);
    assert_eq!(logged.max_concurrency, Some(13.0859375));
    // --block-size is taken as given.
    let given = parse("vllm serve m --max-model-len 32768 --block-size 128");
    assert_eq!(
        engine::device(&given, &v32, &h100_kv(40 * GIB), None).page_size,
        128
    );
}

#[test]
fn sglang_counts_the_nsa_indexer_in_its_cell_and_pages_of_64() {
    // plan_reference_dsa.py sglang_dsa: cell (512 + 64) × 61 × 2 + 132 × 61
    // = 78,324 B; int(40 × 2^30) // it = 548,359, floored to the page of
    // 64 (forced over --page-size 1): 548,352. `auto` is bfloat16 on Hopper.
    let v32 = load("deepseek-v3.2");
    let launch = parse("sglang serve --model-path m --tp 8 --page-size 1");
    let device = engine::device(&launch, &v32, &h100_kv(40 * GIB), None);
    assert_eq!(device.page_size, 64);
    assert_eq!(device.kv_dtype, KvDtype::Bf16);
    assert_eq!(device.bytes_per_token, 78_324);
    assert_eq!(device.profiled_tokens, 548_359);
    assert_eq!(device.tokens_per_rank, 548_352);
    assert_eq!(device.logged.expect("starts").kv_cache_tokens, 548_352);
    // fp8_e4m3: 0.5.9 counts (512 + 64) × 61 + 132 × 61 = 43,188 B,
    // 994,432 tokens; 0.5.23 counts the stored 656 B: 48,068 B, 893,504.
    let fp8 = parse("sglang serve --model-path m --tp 8 --kv-cache-dtype fp8_e4m3");
    let device = engine::device(&fp8, &v32, &h100_kv(40 * GIB), None);
    assert_eq!(device.bytes_per_token, 43_188);
    assert_eq!(device.tokens_per_rank, 994_432);
    let mut newest = fp8.clone();
    newest.rules = Rules::Sglang0_5_23;
    let device = engine::device(&newest, &v32, &h100_kv(40 * GIB), None);
    assert_eq!(device.bytes_per_token, 48_068);
    assert_eq!(device.tokens_per_rank, 893_504);
    // GLM-5, bfloat16: 100,152 B a token, 428,800 tokens.
    let glm = load("glm-5");
    let device = engine::device(&launch, &glm, &h100_kv(40 * GIB), None);
    assert_eq!(device.bytes_per_token, 100_152);
    assert_eq!(device.tokens_per_rank, 428_800);
}

#[test]
fn sparse_attention_the_engine_refuses_or_plan_does_not_model_is_refused_by_name() {
    let v32 = load("deepseek-v3.2");
    // SGLang asserts bf16 or fp8_e4m3 for DSA.
    let e5m2 = parse("sglang serve --model-path m --kv-cache-dtype fp8_e5m2");
    let error = model::check_engine(&e5m2, &v32).expect_err("refused");
    assert!(
        matches!(&error, PlanError::BadValue { flag, .. } if flag == "--kv-cache-dtype"),
        "{error}"
    );
    // vLLM's Hopper sparse backends take no fp8_e5m2.
    let e5m2 = parse("vllm serve m --kv-cache-dtype fp8_e5m2");
    assert!(model::check_engine(&e5m2, &v32).is_err());
    // An indexer shared between layers (IndexCache's index_topk_freq) is
    // refused by name, not sized as one per layer.
    let mut config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("glm-5").join("config.json")).expect("fixture"),
    )
    .expect("json");
    config["index_topk_freq"] = serde_json::json!(4);
    let error = model::parse_config(Path::new("config.json"), &config).expect_err("refused");
    assert!(
        error.to_string().contains("GlmMoeDsaForCausalLM"),
        "{error}"
    );
    // Ling 2.5 is a linear-attention hybrid in both engines: still refused.
    config["architectures"] = serde_json::json!(["BailingMoeV2_5ForCausalLM"]);
    let error = model::parse_config(Path::new("config.json"), &config).expect_err("refused");
    assert!(
        error.to_string().contains("BailingMoeV2_5ForCausalLM"),
        "{error}"
    );
}

#[test]
fn plan_runs_a_sparse_model_under_each_vllm_version() {
    // The whole plan on a 140 GiB box, DeepSeek-V3.2 at TP8: vLLM 0.33.0's
    // KV-cache planner (plan_reference_dsa.py vllm_0_33_dsa: each layer's
    // page padded to its block-stride alignment, 1 at blocks of 64; blocks
    // = available // Σ pages; concurrency over one UniformTypeKVCacheSpecs
    // group) gives 0.26.0's figures: 5,012,736 B a block of 64, and at 40
    // GiB 8,568 blocks, 548,352 tokens.
    let dir = fixture("deepseek-v3.2");
    let command = format!(
        "vllm serve {} --tensor-parallel-size 8 --max-model-len 32768",
        dir.display()
    );
    for version in ["0.26.0", "0.33.0"] {
        let config = fit::PlanConfig {
            engine_version: Some(version.to_string()),
            ..on_box(&command, 140 * GIB)
        };
        let outcome = fit::evaluate(&config, None).expect(version);
        assert_eq!(outcome.clean.page_size, 64, "{version}");
        assert_eq!(outcome.clean.bytes_per_token, 5_012_736 / 64, "{version}");
        let mut launch = parse("vllm serve m --tensor-parallel-size 8 --max-model-len 32768");
        launch.rules = outcome.launch.rules;
        let device = engine::device(&launch, &outcome.model, &h100_kv(40 * GIB), None);
        assert_eq!(
            device.logged.expect("starts").kv_cache_tokens,
            548_352,
            "{version}"
        );
    }
    // A KV dtype the engine refuses is refused by plan as a whole.
    let config = fit::PlanConfig {
        engine_version: Some("0.33.0".to_string()),
        ..on_box(&format!("{command} --kv-cache-dtype fp8_e5m2"), 140 * GIB)
    };
    assert!(matches!(
        fit::evaluate(&config, None),
        Err(FitError::Input(PlanError::BadValue { .. }))
    ));
}
