//! Unit tests of the hybrid sliding windows with their own layer patterns:
//! Step-3.5 (`Step3p5ForCausalLM`) and MiMo-V2-Flash
//! (`MiMoV2FlashForCausalLM`). The expected figures come from the engines'
//! own functions, copied into scripts/plan_reference_dsa.py
//! (`vllm_step3p5`: vLLM 0.26.0 `step3p5.py`, `kv_cache_interface.py`,
//! `kv_cache_utils.py`; `sglang_hybrid_swa`: SGLang 0.5.9
//! `get_hybrid_layer_ids`, `get_cell_size_per_token`,
//! `set_num_tokens_hybrid_swa`), which prints them. The configs
//! (tests/fixtures/models/step-3.5-flash, mimo-v2-flash) were written from
//! the published ones without the hub at hand.

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
    // Its experts (moe_num_experts) are not read by the config estimate:
    // no weights from the config (--weights or a checkpoint index gives
    // them), rather than a dense model's few GiB.
    assert_eq!(step.weights_bytes, None);
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
            state_blocks: Some(0),
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
}

#[test]
fn sglang_weighs_mimo_window_layers_at_their_own_kv_shape() {
    // plan_reference_dsa.py sglang_mimo, rest 40 GiB: 8 full layers of 4 KV
    // heads and 40 window layers of 8, K 192 + V 128. TP4: cell (1 × 320 ×
    // 8 + 2 × 320 × 40) × 2 = 56,320 B, 762,600 tokens profiled, full pool
    // 932,066, window pool 745,652. TP8: one head of each on a rank, cell
    // 30,720 B, pools 1,677,721 and 1,342,176.
    let mimo = load("mimo-v2-flash");
    assert_eq!(
        mimo.window_sglang,
        Some(Window {
            layers: 40,
            tokens: 128
        })
    );
    for (tp, cell, full, window) in [
        (4, 56_320, 932_066, 745_652),
        (8, 30_720, 1_677_721, 1_342_176),
    ] {
        let launch = parse(&format!("sglang serve --model-path m --tp {tp}"));
        let device = engine::device(&launch, &mimo, &h100_kv(40 * GIB), None);
        assert_eq!(device.bytes_per_token, cell, "tp {tp}");
        match device.hybrid {
            Some(Hybrid::Sglang {
                full_tokens,
                window_tokens,
                ..
            }) => assert_eq!((full_tokens, window_tokens), (full, window), "tp {tp}"),
            other => panic!("{other:?}"),
        }
    }
    // On vLLM: refused by name (DiffKV backends, pages unified by block).
    let error = model::check_engine(&parse("vllm serve m"), &mimo).expect_err("refused");
    assert!(
        error.to_string().contains("MiMoV2FlashForCausalLM on vLLM"),
        "{error}"
    );
    assert!(model::check_engine(&parse("sglang serve --model-path m"), &mimo).is_ok());
}
