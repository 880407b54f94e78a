//! Unit tests of Step-3.5's hybrid sliding window (`Step3p5ForCausalLM`).
//! The expected figures come from the engines' own functions, copied into
//! scripts/plan_reference_dsa.py (`vllm_step3p5`: vLLM 0.26.0
//! `step3p5.py`, `kv_cache_interface.py`, `kv_cache_utils.py`;
//! `sglang_step3p5`: SGLang 0.5.9 `get_hybrid_layer_ids`,
//! `get_cell_size_per_token`, `set_num_tokens_hybrid_swa`), which prints
//! them. The config (tests/fixtures/models/step-3.5-flash) was written from
//! the published one without the hub at hand.

use super::PlanError;
use super::engine::{self, Hybrid};
use super::launch::HostTierRequest;
use super::model::{self, Attention, Window};
use super::tests::{fixture, h100_kv, load, parse};
use std::path::Path;

const GIB: u64 = 1 << 30;

#[test]
fn step35_is_read_with_its_window_layers_and_kv_groups() {
    // 45 layers; layer_types (48 entries, the MTP layers' too) has a full
    // layer in four: 12 full, 33 sliding, window 512, in both engines; KV
    // heads from num_attention_groups (8), not the 64 query heads.
    let step = load("step-3.5-flash");
    let window = Some(Window {
        layers: 33,
        tokens: 512,
    });
    assert_eq!((step.window_vllm, step.window_sglang), (window, window));
    let gqa = Attention::Mha {
        kv_heads: 8,
        head_dim: 128,
        v_head_dim: 128,
    };
    assert_eq!((step.attention, step.attention_vllm), (gqa, gqa));
    assert_eq!(step.max_position, Some(262_144));
}

#[test]
fn vllm_groups_step35_window_layers() {
    // plan_reference_dsa.py vllm_step3p5, TP4, 40 GiB, 32,768 tokens: page
    // 16 × 2 heads × 256 × 2 B = 16,384 B; 12 full and 33 window layers:
    // groups of 12, 1 full + 3 window; 40 GiB // 16,384 // 12 = 218,453
    // blocks; a request 2,048 + 3 × (⌈(511 + 16,384)/16⌉ + 1) = 5,219
    // blocks; concurrency 41.857…, 1,371,578 tokens logged.
    let step = load("step-3.5-flash");
    let launch = parse("vllm serve m --tensor-parallel-size 4 --max-model-len 32768");
    let device = engine::device(&launch, &step, &h100_kv(40 * GIB), None);
    assert_eq!(
        device.hybrid,
        Some(Hybrid::Vllm {
            full_groups: 1,
            window_groups: 3,
            state_groups: 0,
            group_size: 12,
            window: Some(512),
            in_flight_tokens: 16_384,
            blocks: 218_453,
            blocks_per_request: 5_219,
        })
    );
    let logged = device.logged.expect("starts");
    assert_eq!(logged.kv_cache_tokens, 1_371_578);
    assert_eq!(logged.max_concurrency, Some(218_453.0 / 5_219.0));
}

#[test]
fn sglang_splits_step35_into_full_and_window_pools() {
    // plan_reference_dsa.py sglang_step3p5, TP4, rest 40 GiB: cell (12 + 33)
    // × 2 heads × 256 × 2 B = 46,080 B; 932,067 tokens profiled; full pool
    // 1,092,266, window pool 873,812 (ratio 0.8).
    let step = load("step-3.5-flash");
    let launch = parse("sglang serve --model-path m --tp 4");
    let device = engine::device(&launch, &step, &h100_kv(40 * GIB), None);
    assert_eq!(device.bytes_per_token, 46_080);
    match device.hybrid {
        Some(Hybrid::Sglang {
            full_tokens,
            window_tokens,
            window,
            ..
        }) => assert_eq!(
            (full_tokens, window_tokens, window),
            (1_092_266, 873_812, 512)
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(device.tokens_per_rank, 1_092_266);
    // With HiCache SGLang turns hybrid SWA memory off for Step-3.5
    // (server_args.py): one pool of every layer, 932,067 tokens.
    let mut hicache = launch.clone();
    hicache.host_tier = Some(HostTierRequest::SglangRatio(2.0));
    let device = engine::device(&hicache, &step, &h100_kv(40 * GIB), None);
    assert_eq!(device.hybrid, None);
    assert_eq!(device.tokens_per_rank, 932_067);
}

#[test]
fn step35_window_layers_of_another_kv_shape_are_refused_by_name() {
    let mut config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("step-3.5-flash").join("config.json")).expect("fixture"),
    )
    .expect("json");
    config["attention_other_setting"]["num_attention_groups"] = serde_json::json!(4);
    let error = model::parse_config(Path::new("config.json"), &config).expect_err("refused");
    assert!(
        matches!(&error, PlanError::UnknownArchitecture(text)
            if text.contains("Step3p5ForCausalLM") && text.contains("of their own")),
        "{error}"
    );
    // MiMo-V2-Flash stays refused by name.
    config["architectures"] = serde_json::json!(["MiMoV2FlashForCausalLM"]);
    let error = model::parse_config(Path::new("config.json"), &config).expect_err("refused");
    assert!(
        error.to_string().contains("MiMoV2FlashForCausalLM"),
        "{error}"
    );
}
