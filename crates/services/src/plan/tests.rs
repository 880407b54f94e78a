//! Unit tests of the plan core: each expected figure is worked out here
//! from the engine's own rule (the arithmetic is written out), on real
//! configs checked in under tests/fixtures/models/.

use super::PlanError;
use super::calibrate::{self, Logged};
use super::engine::{self, Budget, Start};
use super::fit;
use super::launch::{self, Engine, HostTierRequest, KvDtype, Launch};
use super::model::{self, Attention, Model};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

pub(super) fn argv(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

pub(super) fn no_env() -> BTreeMap<String, String> {
    BTreeMap::new()
}

pub(super) fn parse(line: &str) -> Launch {
    launch::parse(&argv(line), &no_env()).expect(line)
}

fn parse_err(line: &str) -> PlanError {
    launch::parse(&argv(line), &no_env()).expect_err(line)
}

pub(super) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models")
        .join(name)
}

pub(super) fn load(name: &str) -> Model {
    model::locate(fixture(name).to_str().expect("utf-8 path"), None, &no_env()).expect(name)
}

pub(super) fn gib(value: f64) -> u64 {
    (value * GIB as f64).round() as u64
}

// ---------------------------------------------------------------- launch

#[test]
fn launch_reads_the_four_forms() {
    let sglang = parse(
        "python3 -m sglang.launch_server --model-path moonshotai/Kimi-K2.5 --tp 8 \
         --mem-fraction-static 0.85 --trust-remote-code --host 0.0.0.0 --port 30000",
    );
    assert_eq!(sglang.engine, Engine::Sglang);
    assert_eq!(sglang.model, "moonshotai/Kimi-K2.5");
    assert_eq!((sglang.tp, sglang.pp, sglang.dp), (8, 1, 1));
    assert_eq!(sglang.mem_fraction, Some(0.85));
    assert_eq!(sglang.gpus, (0..8).collect::<Vec<_>>());
    assert!(sglang.ignored.is_empty(), "{:?}", sglang.ignored);

    let serve = parse("sglang serve --model=org/m --tp-size=4 --context-length 32768");
    assert_eq!(
        (serve.engine, serve.tp, serve.context_length),
        (Engine::Sglang, 4, Some(32768))
    );

    let vllm = parse(
        "vllm serve meta-llama/Llama-3.1-70B-Instruct -tp 4 --gpu-memory-utilization=0.9 --max-model-len 32k",
    );
    assert_eq!(vllm.engine, Engine::Vllm);
    assert_eq!(vllm.model, "meta-llama/Llama-3.1-70B-Instruct");
    assert_eq!(vllm.tp, 4);
    assert_eq!(vllm.mem_fraction, Some(0.9));
    // vLLM's human_readable_int: a lower-case k is decimal.
    assert_eq!(vllm.context_length, Some(32_000));

    let api = parse(
        "/opt/venv/bin/python3.11 -u -X faulthandler -m vllm.entrypoints.openai.api_server \
         --model org/m --tensor-parallel-size 2 --kv-cache-memory-bytes 8G",
    );
    assert_eq!(
        (api.engine, api.model.as_str(), api.tp),
        (Engine::Vllm, "org/m", 2)
    );
    // A capital G is binary.
    assert_eq!(api.kv_cache_memory_bytes, Some(8 * GIB));

    let python = parse("python -m sglang.launch_server --model-path /models/x");
    assert_eq!(python.model, "/models/x");
}

#[test]
fn launch_applies_env_prefixes_and_the_gpu_id_flags() {
    let launch = parse(
        "env HF_HOME=/data CUDA_VISIBLE_DEVICES=4,5,6,7 python3 -m sglang.launch_server \
         --model-path org/m --tp 2 --base-gpu-id 1 --gpu-id-step 2",
    );
    // SGLang: gpu_id = base + tp_rank·step = 1, 3, the 2nd and 4th visible GPUs.
    assert_eq!(launch.gpus, vec![5, 7]);
    assert_eq!(launch.env.get("HF_HOME").map(String::as_str), Some("/data"));

    let bare = parse("CUDA_VISIBLE_DEVICES=3 vllm serve org/m");
    assert_eq!(bare.gpus, vec![3]);

    let mut env = no_env();
    env.insert("CUDA_VISIBLE_DEVICES".to_string(), "0,1".to_string());
    let cleared = launch::parse(&argv("env -i vllm serve org/m -tp 2"), &env).expect("parse");
    assert_eq!(
        cleared.gpus,
        vec![0, 1],
        "env -i drops the caller's CUDA_VISIBLE_DEVICES"
    );

    // Data parallel without DP attention: replicas at base + dp_rank·tp·pp·step.
    let replicas = parse("python3 -m sglang.launch_server --model-path m --tp 2 --dp 2");
    assert_eq!(replicas.gpus, vec![0, 1, 2, 3]);
    // DP attention lives inside the TP group: TP8 uses 8 GPUs.
    let attention =
        parse("python3 -m sglang.launch_server --model-path m --tp 8 --dp 8 --enable-dp-attention");
    assert_eq!(attention.gpus.len(), 8);
    assert_eq!(attention.attention_tp(), 1);
    // Two nodes: TP16 puts 8 ranks on each.
    let nodes =
        parse("python3 -m sglang.launch_server --model-path m --tp 16 --nnodes 2 --node-rank 1");
    assert_eq!(nodes.gpus, (0..8).collect::<Vec<_>>());
    assert_eq!(nodes.gpu_count(), 8);
    // vLLM: TP × PP × DP.
    let vllm = parse("vllm serve m -tp 2 -pp 2 -dp 2");
    assert_eq!(vllm.gpus, (0..8).collect::<Vec<_>>());
    let ids = parse("CUDA_VISIBLE_DEVICES=2,3,4,5 vllm serve m -tp 2 --device-ids 1,3");
    assert_eq!(
        ids.gpus,
        vec![3, 5],
        "--device-ids index into CUDA_VISIBLE_DEVICES"
    );

    let uuids = parse("CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb vllm serve m -tp 2");
    assert!(uuids.gpus.is_empty());
    assert_eq!(uuids.gpu_uuids, vec!["GPU-aaaa", "GPU-bbbb"]);
}

#[test]
fn switches_do_not_swallow_the_next_token() {
    let launch = parse(
        "vllm serve --trust-remote-code -O3 meta/llama --enforce-eager --enable-prefix-caching -tp 2",
    );
    assert_eq!(launch.model, "meta/llama");
    assert!(launch.enforce_eager);
    assert_eq!(launch.tp, 2);
    let sglang = parse(
        "python3 -m sglang.launch_server --enable-dp-attention --model-path m --disable-cuda-graph \
         --tp 8 --dp 4 --enable-hierarchical-cache --hicache-size 37",
    );
    assert!(sglang.dp_attention);
    assert_eq!(sglang.model, "m");
    assert_eq!((sglang.tp, sglang.dp), (8, 4));
    assert_eq!(sglang.host_tier, Some(HostTierRequest::SglangSizeGb(37)));
    // Read: 0.5.14's default fraction reserves nothing for prefill graphs
    // without them; 0.5.9's and 0.5.23's pool does not depend on it.
    assert!(sglang.prefill_graph_switch_off);
    assert!(sglang.ignored.is_empty(), "{:?}", sglang.ignored);
}

#[test]
fn launch_lists_unknown_flags_and_reads_lists_and_aliases() {
    let launch = parse(
        "python3 -m sglang.launch_server --model-path m --tp 2 --cuda-graph-bs 1 2 4 8 \
         --some-new-flag value --mem-fraction 0.8 --kv-cache-dtype fp8_e4m3 --page-size 64",
    );
    assert_eq!(launch.cuda_graph_max_bs, Some(8));
    // argparse prefix: --mem-fraction is --mem-fraction-static.
    assert_eq!(launch.mem_fraction, Some(0.8));
    assert_eq!(launch.kv_dtype, KvDtype::Fp8E4m3);
    assert_eq!(launch.page_size, Some(64));
    assert_eq!(launch.ignored, vec!["--some-new-flag value"]);

    let vllm = parse(
        "vllm serve m --gpu_memory_utilization 0.8 --kv-cache-dtype fp8 --block-size 32 --max-num-seqs 64",
    );
    assert_eq!(vllm.mem_fraction, Some(0.8));
    assert_eq!(vllm.kv_dtype, KvDtype::Fp8E4m3);
    assert_eq!(
        (vllm.page_size, vllm.max_running_requests),
        (Some(32), Some(64))
    );

    let hicache = parse(
        "python3 -m sglang.launch_server --model-path m --enable-hierarchical-cache \
         --hicache-write-policy write_through --hicache-mem-layout page_first",
    );
    assert!(hicache.ignored.is_empty(), "{:?}", hicache.ignored);
    assert_eq!(hicache.host_tier, Some(HostTierRequest::SglangDefaultRatio));
    let no_hicache = parse("python3 -m sglang.launch_server --model-path m --hicache-ratio 4");
    assert_eq!(
        no_hicache.host_tier, None,
        "the ratio alone does not turn HiCache on"
    );
    let offload = parse("vllm serve m --kv-offloading-size 300");
    assert_eq!(
        offload.host_tier,
        Some(HostTierRequest::VllmOffloadGib(300.0))
    );
}

#[test]
fn launch_bad_input_is_named() {
    for (line, flag) in [
        (
            "python3 -m sglang.launch_server --model-path m --tp eight",
            "--tp",
        ),
        (
            "python3 -m sglang.launch_server --model-path m --tp",
            "--tp",
        ),
        (
            "python3 -m sglang.launch_server --model-path m --mem-fraction-static 1.5",
            "--mem-fraction-static",
        ),
        (
            "python3 -m sglang.launch_server --model-path m --kv-cache-dtype fp9",
            "--kv-cache-dtype",
        ),
        (
            "vllm serve m --kv-cache-dtype fp8_ds_mla",
            "--kv-cache-dtype",
        ),
        (
            "vllm serve m --kv-cache-memory-bytes 1.5G",
            "--kv-cache-memory-bytes",
        ),
        (
            "CUDA_VISIBLE_DEVICES=0,1 vllm serve m -tp 4",
            "CUDA_VISIBLE_DEVICES",
        ),
        ("CUDA_VISIBLE_DEVICES= vllm serve m", "CUDA_VISIBLE_DEVICES"),
        (
            "python3 -m sglang.launch_server --model-path m --enable-dp-attention=1",
            "--enable-dp-attention",
        ),
        ("vllm serve m --config serve.yaml", "--config"),
        (
            "python3 -m sglang.launch_server --model-path m --tp 8 --dp 3 --enable-dp-attention",
            "--dp-size",
        ),
        // Each engine's own flags, refused by the other's parser. Before:
        // read as the flag of the other engine (`-tp 2` was SGLang's TP 2).
        (
            "python3 -m sglang.launch_server --model-path m -tp 2",
            "-tp",
        ),
        (
            "python3 -m sglang.launch_server --model-path m --max-model-len 8192",
            "--max-model-len",
        ),
        (
            "vllm serve m --mem-fraction-static 0.8",
            "--mem-fraction-static",
        ),
        ("vllm serve m --tp 2", "--tp"),
        ("vllm serve m --context-length=8192", "--context-length"),
        // SGLang's graph switches, read since 0.5.14's rules: vLLM's
        // parser still refuses them (they were accepted silently).
        ("vllm serve m --disable-cuda-graph", "--disable-cuda-graph"),
        (
            "vllm serve m --cuda-graph-backend-prefill disabled",
            "--cuda-graph-backend-prefill",
        ),
    ] {
        match parse_err(line) {
            PlanError::BadValue { flag: named, .. } => assert_eq!(named, flag, "{line}"),
            other => panic!("{line}: {other:?}"),
        }
    }
    assert!(matches!(
        parse_err("python3 train.py --tp 8"),
        PlanError::UnknownEngine(_)
    ));
    assert!(matches!(
        parse_err("docker run sglang"),
        PlanError::UnknownEngine(_)
    ));
    assert!(matches!(
        parse_err("vllm bench m"),
        PlanError::UnknownEngine(_)
    ));
    assert!(matches!(
        parse_err("python3 -m sglang.launch_server --tp 8"),
        PlanError::NoModel
    ));
    assert!(matches!(
        parse_err("vllm serve --trust-remote-code"),
        PlanError::NoModel
    ));
    // One line, naming what is missing.
    let message =
        parse_err("python3 -m sglang.launch_server --model-path m --tp eight").to_string();
    assert!(
        message.contains("--tp") && message.contains("eight") && !message.contains('\n'),
        "{message}"
    );
}

// ----------------------------------------------------------------- model

#[test]
fn kimi_k25_is_mla_from_its_nested_text_config() {
    let kimi = load("kimi-k2.5");
    assert_eq!(kimi.architecture, "KimiK25ForConditionalGeneration");
    let mla = Attention::Mla {
        kv_lora_rank: 512,
        qk_rope_head_dim: 64,
    };
    assert_eq!(kimi.attention, mla);
    assert_eq!(
        kimi.attention_vllm, mla,
        "vLLM: text model_type kimi_k2 with kv_lora_rank"
    );
    assert_eq!(kimi.layers, 61);
    assert_eq!(kimi.dtype_bytes, 2);
    assert!(kimi.multimodal);
    // The yarn scaling has original_max_position_embeddings: factor 1.
    assert_eq!(kimi.max_position, Some(262_144));
    // KimiK25VisionConfig's own fields (num_hidden_layers 27, hidden 1152).
    assert_eq!(kimi.vision, Some((27, 1152)));
    assert!(
        !kimi.kv_fp8_from_quant,
        "compressed-tensors INT4 leaves the KV cache alone"
    );
    // No index beside it: the config's estimate, its INT4 experts at half
    // a byte and a 16-bit scale per 32 (compressed-tensors group_size),
    // attention, dense MLP and shared experts 16-bit (its ignore list):
    // 594.2 GB, as ENGINES.md §3 computes from the safetensors list.
    assert!(kimi.weights_from_config);
    assert_eq!(kimi.weights_bytes, Some(594_205_009_920));
    // q_a + kv_a, replicated: 61 × 7168 × (1536 + 512 + 64) × 2 bytes.
    assert_eq!(kimi.replicated_bytes, 61 * 7168 * (1536 + 512 + 64) * 2);
}

#[test]
fn gqa_models_read_heads_and_head_dim() {
    let llama = load("llama-3.1-70b");
    assert_eq!(
        llama.attention,
        Attention::Mha {
            kv_heads: 8,
            head_dim: 8192 / 64,
            v_head_dim: 128
        }
    );
    assert_eq!(llama.layers, 80);
    // llama3 rope scaling does not multiply the context.
    assert_eq!(llama.max_position, Some(131_072));
    assert!(!llama.multimodal);
    let qwen = load("qwen3-235b-a22b");
    // head_dim is given (128), not hidden/heads (4096/64 = 64).
    assert_eq!(
        qwen.attention,
        Attention::Mha {
            kv_heads: 4,
            head_dim: 128,
            v_head_dim: 128
        }
    );
    let small = load("llama-3.1-8b");
    assert_eq!(
        small.weights_bytes,
        Some(16_060_522_496),
        "metadata.total_size of the index"
    );
}

/// A Hugging Face cache tree: models--ORG--NAME/{refs/main, snapshots/REV/config.json}.
fn hub_tree(hub: &Path, repo: &str, revisions: &[(&str, &str)], main: Option<&str>) {
    let root = hub.join(format!("models--{}", repo.replace('/', "--")));
    for (revision, source) in revisions {
        let snapshot = root.join("snapshots").join(revision);
        std::fs::create_dir_all(&snapshot).expect("mkdir");
        std::fs::copy(
            fixture(source).join("config.json"),
            snapshot.join("config.json"),
        )
        .expect("copy");
    }
    if let Some(main) = main {
        std::fs::create_dir_all(root.join("refs")).expect("mkdir");
        std::fs::write(root.join("refs/main"), main).expect("write");
    }
}

#[test]
fn the_hugging_face_cache_is_found_as_huggingface_hub_finds_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hub = dir.path().join("hub-cache");
    hub_tree(
        &hub,
        "meta-llama/Llama-3.1-70B",
        &[("aaa", "llama-3.1-8b"), ("bbb", "llama-3.1-70b")],
        Some("bbb\n"),
    );
    let mut env = no_env();
    env.insert("HF_HUB_CACHE".to_string(), hub.display().to_string());
    let found = model::locate("meta-llama/Llama-3.1-70B", None, &env).expect("found");
    assert_eq!(found.layers, 80, "refs/main chooses the revision");
    assert!(found.config_path.ends_with("snapshots/bbb/config.json"));
    let pinned =
        model::locate_at("meta-llama/Llama-3.1-70B", Some("aaa"), None, None, &env).expect("found");
    assert_eq!(pinned.layers, 32, "--revision as a commit");

    // HF_HOME/hub, then ~/.cache/huggingface/hub.
    let home = dir.path().join("hf-home");
    hub_tree(
        &home.join("hub"),
        "Qwen/Qwen3-235B-A22B",
        &[("c1", "qwen3-235b-a22b")],
        Some("c1"),
    );
    let mut env = no_env();
    env.insert("HF_HOME".to_string(), home.display().to_string());
    assert_eq!(
        model::locate("Qwen/Qwen3-235B-A22B", None, &env)
            .expect("found")
            .layers,
        94
    );
    let user = dir.path().join("user");
    hub_tree(
        &user.join(".cache/huggingface/hub"),
        "moonshotai/Kimi-K2.5",
        &[("k", "kimi-k2.5")],
        None,
    );
    let mut env = no_env();
    env.insert("HOME".to_string(), user.display().to_string());
    assert_eq!(
        model::locate("moonshotai/Kimi-K2.5", None, &env)
            .expect("one snapshot, no ref")
            .layers,
        61
    );

    // Not found: every place looked is named.
    let error = model::locate("org/absent", None, &env).expect_err("absent");
    match &error {
        PlanError::ModelNotFound { model, looked } => {
            assert_eq!(model, "org/absent");
            assert_eq!(
                looked,
                &vec![user.join(".cache/huggingface/hub/models--org--absent")]
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(error.to_string().contains("models--org--absent"));
    // A launch's --download-dir is looked in first.
    let launch = parse(&format!(
        "vllm serve org/absent --download-dir {}",
        hub.display()
    ));
    match model::locate_for(&launch, None).expect_err("absent") {
        PlanError::ModelNotFound { looked, .. } => {
            assert_eq!(looked[0], hub.join("models--org--absent"))
        }
        other => panic!("{other:?}"),
    }
}

/// A real safetensors file: the 8-byte little-endian header length, the
/// JSON header, then the tensor bytes.
fn write_safetensors(path: &Path, header: &serde_json::Value, data_len: usize) {
    let mut header = serde_json::to_vec(header).expect("json");
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    bytes.extend(std::iter::repeat_n(0u8, data_len));
    std::fs::write(path, bytes).expect("write");
}

#[test]
fn weights_come_from_safetensors_headers_without_reading_tensors() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        fixture("llama-3.1-8b").join("config.json"),
        dir.path().join("config.json"),
    )
    .expect("copy");
    // BF16 [2, 3] = 12 bytes, F32 [4] = 16 bytes, F8_E4M3 [5] = 5 bytes.
    let header = serde_json::json!({
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [12, 28]},
        "c": {"dtype": "F8_E4M3", "shape": [5], "data_offsets": [28, 33]},
    });
    write_safetensors(
        &dir.path().join("model-00001-of-00002.safetensors"),
        &header,
        33,
    );
    // A second file whose tensor bytes are a 64 GiB hole: reading them
    // would not finish; the header says U8 [1024, 1024] = 1 MiB.
    let big = dir.path().join("model-00002-of-00002.safetensors");
    write_safetensors(
        &big,
        &serde_json::json!({"d": {"dtype": "U8", "shape": [1024, 1024], "data_offsets": [0, 1048576]}}),
        0,
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&big)
        .and_then(|file| file.set_len(64 * GIB))
        .expect("sparse");
    let found = model::locate(dir.path().to_str().expect("utf-8"), None, &no_env()).expect("found");
    assert_eq!(found.weights_bytes, Some(12 + 16 + 5 + 1024 * 1024));

    // A header that claims more than the file holds is refused, not read.
    let liar = dir.path().join("model-00003-of-00003.safetensors");
    let mut bytes = (1u64 << 40).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&liar, bytes).expect("write");
    assert!(matches!(
        model::locate(dir.path().to_str().expect("utf-8"), None, &no_env()),
        Err(PlanError::Unreadable { path, .. }) if path == liar
    ));
}

#[test]
fn model_bad_input_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    };
    let no_layers = write(
        "no-layers.json",
        r#"{"architectures": ["LlamaForCausalLM"], "num_attention_heads": 8}"#,
    );
    assert!(matches!(
        model::locate("x", Some(&no_layers), &no_env()),
        Err(PlanError::MissingField {
            field: "num_hidden_layers",
            ..
        })
    ));
    let no_arch = write("no-arch.json", r#"{"num_hidden_layers": 2}"#);
    assert!(matches!(
        model::locate("x", Some(&no_arch), &no_env()),
        Err(PlanError::MissingField {
            field: "architectures",
            ..
        })
    ));
    let headless = write(
        "headless.json",
        r#"{"architectures": ["FooForCausalLM"], "num_hidden_layers": 2}"#,
    );
    assert!(matches!(
        model::locate("x", Some(&headless), &no_env()),
        Err(PlanError::UnknownArchitecture(_))
    ));
    let hybrid = write(
        "hybrid.json",
        r#"{"architectures": ["BailingMoeV2_5ForCausalLM"], "num_hidden_layers": 32, "num_attention_heads": 32}"#,
    );
    assert!(matches!(
        model::locate("x", Some(&hybrid), &no_env()),
        Err(PlanError::UnknownArchitecture(_))
    ));
    let garbage = write("garbage.json", "{not json");
    assert!(matches!(
        model::locate("x", Some(&garbage), &no_env()),
        Err(PlanError::Unreadable { .. })
    ));
    // A FIFO named as the config is refused without waiting on it.
    let fifo = dir.path().join("fifo.json");
    let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    assert!(matches!(
        model::locate("x", Some(&fifo), &no_env()),
        Err(PlanError::Unreadable { why, .. }) if why.contains("not a regular file")
    ));
    // A local directory without config.json.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    assert!(matches!(
        model::locate(empty.to_str().expect("utf-8"), None, &no_env()),
        Err(PlanError::ModelNotFound { looked, .. }) if looked == vec![empty.join("config.json")]
    ));
}

#[test]
fn a_modelopt_fp8_kv_scheme_makes_auto_fp8() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fixture("llama-3.1-8b").join("config.json")).expect("read"),
    )
    .expect("json");
    config["quantization_config"] = serde_json::json!({
        "quant_method": "modelopt",
        "quant_algo": "FP8",
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": false},
    });
    let path = dir.path().join("config.json");
    std::fs::write(&path, serde_json::to_vec(&config).expect("json")).expect("write");
    let found = model::locate("x", Some(&path), &no_env()).expect("found");
    assert!(found.kv_fp8_from_quant);
    let launch = parse("python3 -m sglang.launch_server --model-path x");
    assert_eq!(engine::kv_dtype(&launch, &found), KvDtype::Fp8E4m3);
    // Llama-3.1-8B at FP8: 8 heads × 256 × 32 layers × 1 byte.
    assert_eq!(engine::bytes_per_token(&launch, &found), 8 * 256 * 32);
}

// ---------------------------------------------------------------- engine

#[test]
fn cell_sizes_u1_to_u4() {
    let kimi = load("kimi-k2.5");
    let sglang = |flags: &str| {
        parse(&format!(
            "python3 -m sglang.launch_server --model-path m {flags}"
        ))
    };
    // U1: MLA (kv_lora_rank + qk_rope_head_dim) × layers × 2 bytes, at any TP.
    assert_eq!(
        engine::bytes_per_token(&sglang("--tp 8"), &kimi),
        (512 + 64) * 61 * 2
    );
    assert_eq!(engine::bytes_per_token(&sglang("--tp 1"), &kimi), 70_272);
    // U2: FP8 halves it.
    assert_eq!(
        engine::bytes_per_token(&sglang("--tp 8 --kv-cache-dtype fp8_e4m3"), &kimi),
        576 * 61
    );
    assert_eq!(35_136, 576 * 61);
    // U3: Llama-3.1-70B at TP4: max(1, 8 // 4) heads × (128 + 128) × 80 × 2.
    let llama = load("llama-3.1-70b");
    assert_eq!(
        engine::bytes_per_token(&sglang("--tp 4"), &llama),
        2 * 256 * 80 * 2
    );
    assert_eq!(engine::bytes_per_token(&sglang("--tp 4"), &llama), 81_920);
    assert_eq!(
        engine::bytes_per_token(&sglang("--tp 8"), &llama),
        256 * 80 * 2
    );
    // U4: Qwen3-235B at TP8: max(1, 4 // 8) = 1 head: the same as TP4.
    let qwen = load("qwen3-235b-a22b");
    assert_eq!(
        engine::bytes_per_token(&sglang("--tp 8"), &qwen),
        256 * 94 * 2
    );
    assert_eq!(engine::bytes_per_token(&sglang("--tp 4"), &qwen), 48_128);
    // DP attention divides heads by attention-TP = tp / dp = 4: 2 heads.
    assert_eq!(
        engine::bytes_per_token(&sglang("--tp 8 --dp 2 --enable-dp-attention"), &llama),
        2 * 256 * 80 * 2
    );
    // Pipeline parallel: the largest stage's layers, ceil(61 / 2) = 31.
    assert_eq!(
        engine::bytes_per_token(&sglang("--tp 4 --pp-size 2"), &kimi),
        576 * 31 * 2
    );
    // FP4 (SGLang, MLA): cell // 2 + (576 // 16) × layers × 1.
    assert_eq!(
        engine::bytes_per_token(&sglang("--kv-cache-dtype fp4_e2m1"), &kimi),
        576 * 61 / 2 + (576 / 16) * 61
    );
    // vLLM: the same for MLA (one replicated head of 576) and for GQA.
    let vllm = parse("vllm serve m -tp 8");
    assert_eq!(engine::bytes_per_token(&vllm, &kimi), 70_272);
    assert_eq!(engine::bytes_per_token(&vllm, &qwen), 48_128);
}

/// SGLang's budget from the two measurements: F0 (free before load, GiB)
/// and what is left after the weights (GiB).
fn sglang_budget(total_mib: u64, free_gib: f64, after_load_gib: f64) -> Budget {
    Budget {
        gpu_total: total_mib * MIB,
        free_at_start: gib(free_gib),
        weights_per_gpu: gib(free_gib) - gib(after_load_gib),
        kv_memory: None,
        non_kv: None,
    }
}

#[test]
fn sglang_tokens_u5_to_u8() {
    let kimi = load("kimi-k2.5");
    let launch =
        parse("python3 -m sglang.launch_server --model-path m --tp 8 --mem-fraction-static 0.85");
    // U5 (the incident): rest = 21.78 − 94.58 × (1 − 0.85) = 7.593 GiB;
    // tokens = int(7.593 × 2^30) // 70,272 = 116,019 (ENGINES.md's 115,982
    // comes from unrounded F0 and W').
    let device = engine::device(
        &launch,
        &kimi,
        &sglang_budget(97_871, 94.58, 21.78),
        Some((0, 4100)),
    );
    let rest = 21.78 - 94.58 * (1.0 - 0.85);
    let expected = (rest * GIB as f64) as u64 / 70_272;
    assert_eq!(expected, 116_019);
    assert_eq!(device.tokens_per_rank, expected);
    assert_eq!(device.start, Start::Starts);
    assert_eq!(device.page_size, 1);
    assert_eq!(device.ranks, 1);
    // Concurrency at 4,100 tokens a request: 116,019 / 4,100 = 28.3.
    let concurrency = device.concurrency.expect("averages given");
    assert!(
        (concurrency - 116_019.0 / 4100.0).abs() < 1e-9,
        "{concurrency}"
    );
    // The request cap: min(tokens // 2, clamp(int(tokens / 262,144 × 512), 2048, 4096)) = 2048.
    assert_eq!(device.max_running_requests, 2048);

    // U6: 8×H200: rest = 66.60 − 139.40 × 0.15 = 45.69 GiB.
    let h200 = engine::device(&launch, &kimi, &sglang_budget(143_771, 139.40, 66.60), None);
    let rest = 66.60 - 139.40 * 0.15;
    assert_eq!(h200.tokens_per_rank, (rest * GIB as f64) as u64 / 70_272);
    assert!(
        (698_000..699_000).contains(&h200.tokens_per_rank),
        "{}",
        h200.tokens_per_rank
    );
    assert_eq!(h200.concurrency, None);
    let fp8 = parse(
        "python3 -m sglang.launch_server --model-path m --tp 8 --mem-fraction-static 0.85 --kv-cache-dtype fp8_e4m3",
    );
    let h200_fp8 = engine::device(&fp8, &kimi, &sglang_budget(143_771, 139.40, 66.60), None);
    assert_eq!(
        h200_fp8.tokens_per_rank,
        (rest * GIB as f64) as u64 / 35_136
    );

    // U7: H100-80GB: rest = 5.85 − 78.65 × 0.15 < 0: "Not enough memory";
    // the fraction that gives one page: (W' + 70,272 B) / F0 = 72.80 / 78.65 → 0.93.
    let h100 = engine::device(&launch, &kimi, &sglang_budget(81_559, 78.65, 5.85), None);
    assert_eq!(h100.tokens_per_rank, 0);
    let needed =
        ((gib(78.65) - gib(5.85) + 70_272) as f64 / gib(78.65) as f64 * 100.0).ceil() / 100.0;
    assert_eq!(needed, 0.93);
    assert_eq!(
        h100.start,
        Start::NotEnoughMemory {
            raise_fraction_to: Some(0.93)
        }
    );

    // U8: the page floor: 115,982 tokens at page 64 (FlashMLA forces 64) → 115,968.
    let flashmla =
        parse("python3 -m sglang.launch_server --model-path m --tp 8 --attention-backend flashmla");
    let budget = Budget {
        gpu_total: 97_871 * MIB,
        free_at_start: gib(94.58),
        weights_per_gpu: 0,
        kv_memory: Some(115_982 * 70_272 + 100),
        non_kv: None,
    };
    let paged = engine::device(&flashmla, &kimi, &budget, None);
    assert_eq!(paged.page_size, 64);
    assert_eq!(paged.tokens_per_rank, 115_982 / 64 * 64);
    assert_eq!(paged.tokens_per_rank, 115_968);
    // --max-total-tokens caps before the floor.
    let capped = parse(
        "python3 -m sglang.launch_server --model-path m --tp 8 --max-total-tokens 100000 --page-size 64",
    );
    assert_eq!(
        engine::device(&capped, &kimi, &budget, None).tokens_per_rank,
        100_000 / 64 * 64
    );
    // Weights larger than the free memory.
    let heavy = sglang_budget(81_559, 78.65, 0.0);
    let too_large = Budget {
        weights_per_gpu: heavy.free_at_start + GIB,
        ..heavy
    };
    assert_eq!(
        engine::device(&launch, &kimi, &too_large, None).start,
        Start::WeightsTooLarge
    );
}

#[test]
fn sglang_default_mem_fraction_follows_handle_gpu_memory_settings() {
    let kimi = load("kimi-k2.5");
    let llama = load("llama-3.1-8b");
    let tp8 = parse("python3 -m sglang.launch_server --model-path m --tp 8");
    // H200, TP8: chunked 8192, cuda_graph_max_bs 512:
    // reserved = 512 + 8192 × 1.5 + 512 × 2 + 8 × 1 / 8 × 1024 = 14,848 MiB.
    let reserved = 512.0 + 8192.0 * 1.5 + 512.0 * 2.0 + 8.0 / 8.0 * 1024.0;
    assert_eq!(reserved, 14_848.0);
    let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let h200 = round3((143_771.0 - reserved) / 143_771.0);
    assert_eq!(h200, 0.897);
    // Kimi-K2.5 is multimodal: × 0.95 × (1 − 0.1 × (27 × 1152² / (24 × 1024²) − 1)).
    let vlm = 0.95 * (1.0 - 0.1 * (27.0 * 1152.0 * 1152.0 / (24.0 * 1024.0 * 1024.0) - 1.0));
    assert!((engine::sglang_vlm_factor(&kimi) - vlm).abs() < 1e-12);
    assert!((vlm - 0.9097).abs() < 1e-4, "{vlm}");
    let fraction = engine::sglang_default_fraction(&tp8, &kimi, 143_771 * MIB);
    assert!((fraction - h200 * vlm).abs() < 1e-12, "{fraction}");
    // H20-96GB: round((97,871 − 14,848) / 97,871, 3) = 0.848.
    let h20 = engine::sglang_default_fraction(&tp8, &kimi, 97_871 * MIB);
    assert!((h20 - 0.848 * vlm).abs() < 1e-12, "{h20}");
    // Llama-3.1-8B, TP1 on an H100 (81,559 MiB): cuda_graph_max_bs 256;
    // reserved = 512 + 12,288 + 512 + 128 = 13,440 → 0.835; no VLM factor.
    let tp1 = parse("python3 -m sglang.launch_server --model-path m");
    assert_eq!(
        engine::sglang_default_fraction(&tp1, &llama, 81_559 * MIB),
        round3((81_559.0 - 13_440.0) / 81_559.0)
    );
    assert_eq!(
        engine::sglang_default_fraction(&tp1, &llama, 81_559 * MIB),
        0.835
    );
    // A 24 GB GPU (< 35 GiB): chunked 2048, bs 24: reserved = 512 + 3072 + 48 + 128 = 3760, no 10 GiB floor.
    assert_eq!(
        engine::sglang_default_fraction(&tp1, &llama, 24_564 * MIB),
        round3((24_564.0 - 3760.0) / 24_564.0)
    );
    // DP attention 8 on H200: + 512 × 8 × 3 + 512 × 8 × 1.5 (bs > 300).
    let dpa =
        parse("python3 -m sglang.launch_server --model-path m --tp 8 --dp 8 --enable-dp-attention");
    let reserved_dpa = reserved + 512.0 * 8.0 * 3.0 + 512.0 * 8.0 * 1.5;
    let expected = round3((143_771.0 - reserved_dpa) / 143_771.0) * vlm;
    assert!((engine::sglang_default_fraction(&dpa, &kimi, 143_771 * MIB) - expected).abs() < 1e-12);
    // EAGLE: + 2 GiB.
    let eagle =
        parse("python3 -m sglang.launch_server --model-path m --speculative-algorithm eagle");
    assert_eq!(
        engine::sglang_default_fraction(&eagle, &llama, 81_559 * MIB),
        round3((81_559.0 - 13_440.0 - 2048.0) / 81_559.0)
    );
    // The device uses the default when the flag is absent.
    let device = engine::device(&tp8, &kimi, &sglang_budget(143_771, 139.40, 66.60), None);
    assert!((device.mem_fraction - h200 * vlm).abs() < 1e-12);
}

#[test]
fn dp_attention_gives_each_rank_its_pool_and_costs_attention_weights() {
    let kimi = Model {
        weights_bytes: Some(594_000_000_000),
        ..load("kimi-k2.5")
    };
    let tp8 = parse("python3 -m sglang.launch_server --model-path m --tp 8");
    let dpa =
        parse("python3 -m sglang.launch_server --model-path m --tp 8 --dp 8 --enable-dp-attention");
    let replicated = (61u64 * 7168 * (1536 + 512 + 64) * 2) as f64;
    let plain = (594e9 - replicated) / 8.0 + replicated + GIB as f64;
    assert_eq!(engine::weights_per_gpu(&tp8, &kimi), Some(plain as u64));
    // Attention per layer: q_a 7168·1536 + q_b 1536·64·192 + kv_a 7168·576
    // + kv_b 512·64·256 + o 64·128·7168; with attention-TP 1 the part not
    // already replicated is whole on every GPU: + (A − R) × (1 − 1/8).
    let attention = (61u64
        * (7168 * 1536 + 1536 * 64 * 192 + 7168 * 576 + 512 * 64 * 256 + 64 * 128 * 7168)
        * 2) as f64;
    assert_eq!(kimi.attention_bytes as f64, attention);
    let extra = (attention - replicated) * (1.0 - 1.0 / 8.0);
    assert!(
        (9.0e9..9.5e9).contains(&extra),
        "ENGINES.md §3: ≈9.2 GB, got {extra}"
    );
    let with_dpa = engine::weights_per_gpu(&dpa, &kimi).expect("weights") as f64;
    assert!((with_dpa - (plain + extra)).abs() < 2.0, "{with_dpa}");
    let device = engine::device(&dpa, &kimi, &sglang_budget(143_771, 139.40, 60.0), None);
    assert_eq!(device.ranks, 8);
}

#[test]
fn vllm_budget_is_utilization_of_total_and_refuses_short_free_memory() {
    let llama = load("llama-3.1-70b");
    let launch = parse("vllm serve m -tp 4");
    let total = 81_559 * MIB;
    let weights = gib(32.9);
    let budget = Budget {
        gpu_total: total,
        free_at_start: total - GIB,
        weights_per_gpu: weights,
        kv_memory: None,
        non_kv: None,
    };
    let device = engine::device(&launch, &llama, &budget, None);
    // requested = ceil(total × 0.92) (the 0.26.0 default); available_kv =
    // requested − weights − profile peak − CUDA-graph estimate.
    let requested = (total as f64 * 0.92).ceil() as u64;
    // Llama runs on the V2 runner: no graph estimate comes out of the KV.
    let kv = requested
        - weights
        - engine::vllm_activation_peak(&launch, &llama, total)
        - engine::VLLM_NON_TORCH_BYTES;
    assert_eq!(device.mem_fraction, 0.92);
    assert_eq!(device.kv_bytes_per_rank, kv);
    // Blocks of 16 tokens × 81,920 bytes; tokens = blocks × 16.
    assert_eq!(device.page_size, 16);
    assert_eq!(device.tokens_per_rank, kv / (16 * 81_920) * 16);
    assert_eq!(
        device.max_running_requests, 1024,
        "≥ 70 GiB: 1024 sequences"
    );
    assert_eq!(device.start, Start::Starts);

    // Less free memory than utilization × total: vLLM refuses to start.
    let short = Budget {
        free_at_start: requested - 1,
        ..budget
    };
    assert_eq!(
        engine::device(&launch, &llama, &short, None).start,
        Start::RefusesFree {
            needed: requested,
            free: requested - 1
        }
    );
    // --enforce-eager: no graph estimate; --kv-cache-memory-bytes: the KV size as given.
    let eager = parse("vllm serve m -tp 4 --enforce-eager");
    assert_eq!(
        engine::device(&eager, &llama, &budget, None).kv_bytes_per_rank,
        requested
            - weights
            - engine::vllm_activation_peak(&eager, &llama, total)
            - engine::VLLM_NON_TORCH_BYTES
    );
    let fixed = parse("vllm serve m -tp 4 --kv-cache-memory-bytes 10G");
    let device = engine::device(&fixed, &llama, &budget, None);
    assert_eq!(device.tokens_per_rank, 10 * GIB / (16 * 81_920) * 16);
    // request_memory runs in init_device whatever the KV size: the
    // utilization check still refuses.
    assert!(matches!(
        engine::device(&fixed, &llama, &short, None).start,
        Start::RefusesFree { .. }
    ));
    // FlashMLA forces blocks of 64 for an MLA model.
    let kimi = load("kimi-k2.5");
    let mla = parse(
        "vllm serve m -tp 8 --attention-backend FLASHMLA --kv-cache-memory-bytes 1G --max-model-len 8192",
    );
    let device = engine::device(&mla, &kimi, &budget, None);
    assert_eq!(
        (device.page_size, device.tokens_per_rank),
        (64, GIB / (64 * 70_272) * 64)
    );
    // A 48 GB GPU: 256 sequences.
    let small = Budget {
        gpu_total: 46_068 * MIB,
        free_at_start: 45 * GIB,
        ..budget
    };
    assert_eq!(
        engine::device(&launch, &llama, &small, None).max_running_requests,
        256
    );
}

#[test]
fn vllm_refuses_a_pool_smaller_than_one_full_length_request() {
    let llama = load("llama-3.1-8b");
    // A 24 GB GPU: requested = ceil(24,564 MiB × 0.92); KV = requested −
    // 14.96 GiB of weights − profile peak − graphs ≈ 4 GiB, 131,072 B a
    // token: ~33K tokens, less than one 131,072-token request.
    let total = 24_564 * MIB;
    let budget = Budget {
        gpu_total: total,
        free_at_start: total - GIB,
        weights_per_gpu: gib(14.96),
        kv_memory: None,
        non_kv: None,
    };
    let requested = (total as f64 * 0.92).ceil() as u64;
    let overhead = engine::vllm_activation_peak(&parse("vllm serve m"), &llama, total)
        + engine::VLLM_NON_TORCH_BYTES;
    let kv = requested - gib(14.96) - overhead;
    let blocks = kv / (16 * 131_072);
    assert!(blocks < 131_072 / 16);
    let full = engine::device(&parse("vllm serve m"), &llama, &budget, None);
    // (overhead + weights + 8,192 blocks × 16 × 131,072 B) / total > 1: no
    // utilization helps.
    assert_eq!(
        full.start,
        Start::NotEnoughMemory {
            raise_fraction_to: None
        }
    );
    assert_eq!(full.tokens_per_rank, 0);
    // --max-model-len 8192: 512 blocks are enough.
    let short = engine::device(
        &parse("vllm serve m --max-model-len 8192"),
        &llama,
        &budget,
        None,
    );
    assert_eq!(short.start, Start::Starts);
    assert_eq!(short.tokens_per_rank, blocks * 16);
    // --max-model-len auto: vLLM fits the length to the pool.
    let auto = engine::device(
        &parse("vllm serve m --max-model-len auto"),
        &llama,
        &budget,
        None,
    );
    assert_eq!(auto.tokens_per_rank, blocks * 16);
    // At 32,768 tokens a request the utilization that holds one is named:
    // (overhead + weights + 2,048 blocks × 16 × 131,072 B) / total.
    let mid = engine::device(
        &parse("vllm serve m --max-model-len 32768 --gpu-memory-utilization 0.5"),
        &llama,
        &budget,
        None,
    );
    let used = (overhead + gib(14.96) + 2048 * 16 * 131_072) as f64;
    let raise = (used / total as f64 * 100.0).ceil() / 100.0;
    assert_eq!(
        mid.start,
        Start::NotEnoughMemory {
            raise_fraction_to: Some(raise)
        }
    );
    assert!(raise < 1.0);
}

#[test]
fn host_tier_u9_u10_and_vllm_offload() {
    let kimi = load("kimi-k2.5");
    let budget = Budget {
        gpu_total: 97_871 * MIB,
        free_at_start: gib(94.58),
        weights_per_gpu: 0,
        kv_memory: Some(115_982 * 70_272),
        non_kv: None,
    };
    // U9: --hicache-size 37: 37e9 // 70,272 = 526,525; (size // 1 + 1) × 1 = 526,526 per rank.
    let launch = parse(
        "python3 -m sglang.launch_server --model-path m --tp 8 --enable-hierarchical-cache --hicache-size 37",
    );
    let device = engine::device(&launch, &kimi, &budget, None);
    let tier = engine::host_tier(&launch, &kimi, &device, 1_000 * 1_000_000_000).expect("on");
    assert_eq!(37_000_000_000u64 / 70_272, 526_525);
    assert_eq!(tier.tokens_per_rank, 526_526);
    assert_eq!(tier.bytes_per_rank, 526_526 * 70_272);
    assert_eq!(
        tier.bytes_total,
        8 * 526_526 * 70_272,
        "every TP rank holds its own copy"
    );
    assert!(tier.fits);
    assert!(tier.larger_than_device);
    // U10: --hicache-size 300 on 8 ranks with MemAvailable 408 GB: 2.4 TB > 408 GB − 10 GiB.
    let big = parse(
        "python3 -m sglang.launch_server --model-path m --tp 8 --enable-hierarchical-cache --hicache-size 300",
    );
    let tier = engine::host_tier(&big, &kimi, &device, 408_000_000_000).expect("on");
    assert_eq!(tier.tokens_per_rank, 300_000_000_000 / 70_272 + 1);
    assert_eq!(
        tier.bytes_total,
        8 * (300_000_000_000 / 70_272 + 1) * 70_272
    );
    assert_eq!(tier.budget, 408_000_000_000 - 10 * GIB);
    assert!(!tier.fits);
    // The default ratio 2.0: int(115,982 × 2) // 1 + 1.
    let ratio =
        parse("python3 -m sglang.launch_server --model-path m --tp 8 --enable-hierarchical-cache");
    let tier = engine::host_tier(&ratio, &kimi, &device, 408_000_000_000).expect("on");
    assert_eq!(tier.tokens_per_rank, 115_982 * 2 + 1);
    // vLLM 0.26.0: 300 GiB in total, every block stored once per worker.
    let vllm = parse("vllm serve m -tp 8 --kv-offloading-size 300");
    let device = engine::device(&vllm, &kimi, &budget, None);
    let tier = engine::host_tier(&vllm, &kimi, &device, 408_000_000_000).expect("on");
    assert_eq!(tier.bytes_total, 300 * GIB);
    assert_eq!(tier.tokens_per_rank, 300 * GIB / (70_272 * 8));
    assert!(engine::host_tier(&parse("vllm serve m"), &kimi, &device, 0).is_none());
}

// ------------------------------------------------------------- calibrate

const SGLANG_LOG: &str = "\
[2026-07-01 10:00:00 TP0] Init torch distributed begin.
[2026-07-01 10:00:01 TP0] Load weight begin. avail mem=94.60 GB
[2026-07-01 10:00:01 TP1] Load weight begin. avail mem=94.58 GB
[2026-07-01 10:01:00 TP1] Load weight end. elapsed=59.1 s, type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16, avail mem=21.70 GB, mem usage=72.88 GB.
[2026-07-01 10:01:00 TP0] Load weight end. elapsed=59.0 s, type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16, avail mem=21.80 GB, mem usage=72.80 GB.
[2026-07-01 10:01:02 TP0] KV Cache is allocated. #tokens: 114913, KV size: 7.52 GB
[2026-07-01 10:01:02 TP0] Memory pool end. avail mem=13.30 GB
[2026-07-01 10:01:30 TP0] max_total_num_tokens=114913, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=2048, context_len=262144, available_gpu_mem=9.80 GB
[2026-07-01 11:00:00 TP0] Load weight begin. avail mem=80.00 GB
[2026-07-01 11:00:01 TP0] Load weight end. elapsed=59.0 s, type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16, avail mem=7.20 GB, mem usage=72.80 GB.
";

#[test]
fn sglang_log_gives_the_last_complete_start() {
    // Colours as a terminal log has them.
    let coloured = SGLANG_LOG.replace("Load weight end.", "\u{1b}[32mLoad weight end.\u{1b}[0m");
    let logged = calibrate::read_log(&coloured);
    assert_eq!(
        logged,
        Logged {
            // The largest W' and the smallest free memory over the ranks.
            weights_per_gpu: Some(gib(72.88)),
            free_before_load: Some(gib(94.58)),
            tokens: Some(114_913),
            kv_bytes: Some(gib(7.52)),
            requested: None,
            utilization: None,
            run: Default::default(),
            engine: Some(Engine::Sglang),
        }
    );
    let mut budget = Budget {
        gpu_total: 97_871 * MIB,
        free_at_start: 0,
        weights_per_gpu: 0,
        kv_memory: None,
        non_kv: None,
    };
    logged.calibrate(Engine::Sglang, 0.85, &mut budget);
    assert_eq!(
        (budget.free_at_start, budget.weights_per_gpu),
        (gib(94.58), gib(72.88))
    );
    // A MHA pool's K and V sizes add up.
    let mha = calibrate::read_log(
        "KV Cache is allocated. #tokens: 442000, K size: 27.0 GB, V size: 27.0 GB",
    );
    assert_eq!((mha.tokens, mha.kv_bytes), (Some(442_000), Some(gib(54.0))));
}

#[test]
fn vllm_log_reads_gib_and_thousands_separators() {
    let log = "\
(Worker_TP0 pid=11) INFO 07-01 10:00:00 [gpu_model_runner.py:5348] Model loading took 32.90 GiB memory and 40.123456 seconds
(Worker_TP1 pid=12) INFO 07-01 10:00:00 [gpu_model_runner.py:5348] Model loading took 32.95 GiB memory and 40.2 seconds
(Worker_TP0 pid=11) INFO 07-01 10:00:30 [gpu_worker.py:561] Available KV cache memory: 36.12 GiB
(Worker_TP1 pid=12) INFO 07-01 10:00:30 [gpu_worker.py:561] Available KV cache memory: 36.07 GiB
(EngineCore_DP0 pid=10) INFO 07-01 10:00:31 [kv_cache_utils.py:2177] GPU KV cache size: 472,768 tokens
";
    let logged = calibrate::read_log(log);
    assert_eq!(
        logged,
        Logged {
            weights_per_gpu: Some(gib(32.95)),
            free_before_load: None,
            tokens: Some(472_768),
            kv_bytes: Some(gib(36.07)),
            requested: None,
            utilization: None,
            run: Default::default(),
            engine: Some(Engine::Vllm),
        }
    );
    let mut budget = Budget {
        gpu_total: 81_559 * MIB,
        free_at_start: 80 * GIB,
        weights_per_gpu: 0,
        kv_memory: None,
        non_kv: None,
    };
    // The logged KV budget was the rule's answer at that start's
    // utilization: what it measured is the rest of the requested memory
    // (here not logged: the utilization's share of the total).
    logged.calibrate(Engine::Vllm, 0.9, &mut budget);
    assert_eq!(budget.kv_memory, None);
    let requested = (0.9 * (81_559 * MIB) as f64).ceil() as u64;
    assert_eq!(budget.non_kv, Some(requested - gib(36.07)));
    assert_eq!(budget.weights_per_gpu, gib(32.95));
    // vLLM 0.26.0 says what it requested; over ranks, the largest.
    let stated = calibrate::read_log(&format!(
        "{log}(Worker_TP0 pid=11) INFO 07-01 10:00:31 [gpu_worker.py:857] Free memory on device (79.10/79.65 GiB) on startup. Desired GPU memory utilization is (0.9, 71.68 GiB). Actual usage is 32.9 GiB for weight\n\
         (Worker_TP1 pid=12) INFO 07-01 10:00:31 [gpu_worker.py:857] Free memory on device (79.10/79.65 GiB) on startup. Desired GPU memory utilization is (0.9, 71.69 GiB). Actual usage is 32.95 GiB for weight\n"
    ));
    assert_eq!(stated.requested, Some(gib(71.69)));
    assert_eq!(stated.tokens, Some(472_768));
    assert_eq!(stated.vllm_non_kv(0, 0.0), Some(gib(71.69) - gib(36.07)));
    // Where it does not say so, the utilization its front end was given
    // (and the command's, where that is not said either).
    let args = "(APIServer pid=9) INFO 07-01 09:59:00 [api_utils.py:273] non-default args: \
                {'model': '/m', 'gpu_memory_utilization': 0.85, 'max_model_len': 8192}\n";
    let given = calibrate::read_log(&format!("{args}{log}"));
    assert_eq!(given.utilization, Some(0.85));
    let total = 81_559 * MIB;
    let at = |utilization: f64| (total as f64 * utilization).ceil() as u64;
    assert_eq!(given.vllm_non_kv(total, 0.5), Some(at(0.85) - gib(36.07)));
    assert_eq!(logged.vllm_non_kv(total, 0.5), Some(at(0.5) - gib(36.07)));
    // A second start's arguments are its own, not the first start's (the
    // last complete start is the one read).
    let two = calibrate::read_log(&format!("{args}{log}{}", args.replace("0.85", "0.6")));
    assert_eq!((two.utilization, two.tokens), (Some(0.85), Some(472_768)));
    // The new model runner's wording.
    let new = calibrate::read_log(
        "INFO [model_runner.py:306] Model loading took 4.5 GiB and 3.2 seconds",
    );
    assert_eq!(new.weights_per_gpu, Some(gib(4.5)));
    assert_eq!(calibrate::read_log("nothing here"), Logged::default());
}

/// `run` reads a live server's output, whose last line may be cut
/// anywhere: after a rank's first letter, or before a multi-byte character.
/// Seen on the H200: vLLM's output read mid-line panicked `run`.
#[test]
fn a_log_cut_mid_line_or_mid_character_is_read_without_a_panic() {
    let whole =
        "(EngineCore pid=717) INFO [kv_cache_utils.py:2177] GPU KV cache size: 440,688 tokens\n";
    for tail in [
        "Using FLASH_AT",
        "(Worker_TP",
        "[TP0] …",
        "PP\u{2026}",
        "D",
        "rank=",
        "rank=\u{e9}",
    ] {
        let logged = calibrate::read_log(&format!("{whole}{tail}"));
        assert_eq!(logged.tokens, Some(440_688), "{tail:?}");
    }
}

#[test]
fn a_log_file_is_read_from_its_tail_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("server.log");
    // 6 MiB of noise, then the start: only the last 4 MiB are read.
    let mut text = "x".repeat(6 << 20);
    text.push('\n');
    text.push_str(SGLANG_LOG);
    std::fs::write(&path, text).expect("write");
    assert_eq!(
        calibrate::read_log_file(&path).expect("read").tokens,
        Some(114_913)
    );
    assert!(matches!(
        calibrate::read_log_file(dir.path()),
        Err(PlanError::Unreadable { .. })
    ));
}

// ------------------------------------------------------- from-log levers

/// `plan --gpu-memory SIZE -- COMMAND`, as the CLI builds it.
pub(super) fn on_box(command: &str, gpu_memory: u64) -> fit::PlanConfig {
    fit::PlanConfig {
        command: argv(command),
        env: no_env(),
        averages: None,
        concurrency: None,
        hypothetical: Some(fit::Hypothetical {
            gpu_memory,
            gpus: None,
        }),
        overrides: fit::Overrides::default(),
        from_log: None,
        model_config: None,
        engine_version: None,
        json: false,
    }
}

/// `plan --gpu-memory SIZE --from-log LOG -- COMMAND`.
fn from_log(command: &str, gpu_memory: u64, log: &Path) -> fit::Outcome {
    let config = fit::PlanConfig {
        from_log: Some(log.to_path_buf()),
        ..on_box(command, gpu_memory)
    };
    fit::evaluate(&config, None).expect(command)
}

fn lever<'a>(outcome: &'a fit::Outcome, name: &str) -> &'a super::levers::Lever {
    outcome
        .levers
        .iter()
        .find(|lever| lever.name == name)
        .unwrap_or_else(|| panic!("no {name} lever: {:?}", outcome.levers))
}

/// A real vLLM 0.26.0 start on an H200 (Llama-3.1-8B, dummy weights,
/// `--gpu-memory-utilization 0.5 --max-model-len 8192 --enforce-eager`;
/// the lines kept in tests/fixtures/logs/) logged its whole KV budget,
/// `Available KV cache memory: 53.8 GiB`. What that fixes is the rest of
/// the memory it requested (`Desired GPU memory utilization is (0.5, 69.9
/// GiB)`): 69.9 − 53.8 GiB (15.0 GiB of weights, 0.88 of activation peak,
/// 0.22 non-torch, no graphs). A higher utilization adds its share of the
/// total as KV; the same command at vLLM's default 0.92 logged 921,696
/// tokens on the same GPU.
#[test]
fn a_vllm_log_fixes_what_is_not_kv_so_a_higher_utilization_adds_kv() {
    let log = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/logs/vllm-0.26.0-llama-3.1-8b-u05.log");
    // What CUDA counts on an H200 (the log's 139.8 GiB): nvidia-smi's
    // 143,771 MiB less the 615 MiB the driver reserves.
    let total = 143_156 * MIB;
    let command = |utilization: &str| {
        format!(
            "python3 -m vllm.entrypoints.openai.api_server --model {} --load-format dummy \
             --skip-tokenizer-init {utilization} --max-model-len 8192 --enforce-eager",
            fixture("llama-3.1-8b").display()
        )
    };
    // Llama-3.1-8B at TP1: 8 KV heads × (128 + 128) × 32 layers × 2 bytes
    // a token, blocks of 16 (FLASH_ATTN on Hopper).
    let block_bytes = 16 * 8 * (128 + 128) * 32 * 2;
    let requested = |utilization: f64| (utilization * total as f64).ceil() as u64;
    let not_kv = gib(69.9) - gib(53.8);
    let tokens_at = |utilization: f64| (requested(utilization) - not_kv) / block_bytes * 16;

    let half = from_log(&command("--gpu-memory-utilization 0.5"), total, &log);
    assert_eq!(half.now.tokens_per_rank, tokens_at(0.5));
    // The engine's own count at 0.5, within the log's rounding (0.01 GiB).
    assert!(
        tokens_at(0.5).abs_diff(440_688) <= 2 * 16,
        "{}",
        tokens_at(0.5)
    );
    // The log's own figures predict its count: 53.8 GiB in 2 MiB blocks.
    let calibration = half.calibration.expect("calibration");
    assert_eq!(calibration.logged.tokens, Some(440_688));
    assert_eq!(
        calibration.predicted_tokens,
        Some(gib(53.8) / block_bytes * 16)
    );
    let higher = lever(&half, "mem_fraction");
    assert_eq!(higher.how, "--gpu-memory-utilization 0.55");
    assert_eq!(
        higher.tokens_per_rank,
        tokens_at(0.55),
        "0.05 more of {total} bytes is KV: {higher:?}"
    );

    // The same server at the default utilization, planned from the 0.5
    // log: the real start at 0.92 logged 921,696 tokens.
    let default = from_log(&command(""), total, &log);
    assert_eq!(default.now.mem_fraction, 0.92);
    assert_eq!(default.now.tokens_per_rank, tokens_at(0.92));
    assert!(
        default.now.tokens_per_rank.abs_diff(921_696) <= 2 * 16,
        "planned {} against 921,696 logged",
        default.now.tokens_per_rank
    );

    // A log that does not say what it requested: the utilization its
    // front end was given (0.5) of the total.
    let dir = tempfile::tempdir().expect("tempdir");
    let older = dir.path().join("vllm.log");
    let text = std::fs::read_to_string(&log).expect("fixture");
    let kept: Vec<&str> = text
        .lines()
        .filter(|line| !line.contains("Desired GPU memory utilization"))
        .collect();
    std::fs::write(&older, kept.join("\n")).expect("log");
    let not_kv = requested(0.5) - gib(53.8);
    let from_older = from_log(&command(""), total, &older);
    assert_eq!(
        from_older.now.tokens_per_rank,
        (requested(0.92) - not_kv) / block_bytes * 16
    );
    assert!(from_older.now.tokens_per_rank.abs_diff(921_696) <= 2 * 16);
}

/// The same shape for SGLang: its log gives W' (`Load weight end … mem
/// usage`), the free memory stays the GPU's, and a higher fraction gives
/// `f × F0 − W'` more.
#[test]
fn an_sglang_log_fixes_the_weights_so_a_higher_fraction_adds_kv() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("sglang.log");
    std::fs::write(
        &log,
        "[2026-12-01 10:00:01 TP0] Load weight begin. avail mem=78.50 GB\n\
         [2026-12-01 10:00:31 TP0] Load weight end. elapsed=30.1 s, type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=62.50 GB, mem usage=16.00 GB.\n\
         [2026-12-01 10:00:32 TP0] KV Cache is allocated. #tokens: 411152, K size: 25.09 GB, V size: 25.09 GB\n",
    )
    .expect("log");
    let command = format!(
        "python3 -m sglang.launch_server --model-path {} --mem-fraction-static 0.85",
        fixture("llama-3.1-8b").display()
    );
    let outcome = from_log(&command, 80 * GIB, &log);
    assert_eq!(outcome.budget.weights_per_gpu, 16 * GIB);
    // F0: the clean 80 GiB GPU less the engine's CUDA context.
    let free = (80 * GIB - engine::CUDA_CONTEXT_BYTES) as f64 / GIB as f64;
    let cell = 8 * (128 + 128) * 32 * 2;
    let tokens_at = |fraction: f64| {
        let rest = (free - 16.0) - free * (1.0 - fraction);
        (rest * GIB as f64) as u64 / cell
    };
    assert_eq!(outcome.now.tokens_per_rank, tokens_at(0.85));
    let higher = lever(&outcome, "mem_fraction");
    assert_eq!(higher.how, "--mem-fraction-static 0.9");
    assert_eq!(higher.tokens_per_rank, tokens_at(0.90), "{higher:?}");
    assert!(higher.tokens_per_rank > outcome.now.tokens_per_rank);
}

/// A KV pool given to plan (`--kv-memory`) skips the budget rule as the
/// command's `--kv-cache-memory-bytes` does: no fraction lever is offered
/// that could not move it.
#[test]
fn a_given_kv_pool_offers_no_fraction_lever() {
    let sglang = format!(
        "python3 -m sglang.launch_server --model-path {} --mem-fraction-static 0.85",
        fixture("llama-3.1-8b").display()
    );
    let vllm = format!(
        "vllm serve {} --gpu-memory-utilization 0.5 --max-model-len 8192",
        fixture("llama-3.1-8b").display()
    );
    for command in [&sglang, &vllm] {
        let plain = fit::evaluate(&on_box(command, 80 * GIB), None).expect("plan");
        assert!(lever(&plain, "mem_fraction").tokens_per_rank > plain.clean.tokens_per_rank);
        let mut config = on_box(command, 80 * GIB);
        config.overrides.kv_memory = Some(40 * GIB);
        let given = fit::evaluate(&config, None).expect("plan");
        assert_eq!(given.clean.kv_bytes_per_rank, 40 * GIB);
        let names: Vec<&str> = given.levers.iter().map(|lever| lever.name).collect();
        assert!(
            !names.contains(&"mem_fraction"),
            "{command}: {:?}",
            given.levers
        );
    }
}

// ------------------------------------------------------ evaluate's steps

/// Each step of the budget takes the flag first, then the log, then the
/// estimate, and says which it took; the box must have the GPUs the
/// command uses; without a box, GPUs must have been read.
#[test]
fn evaluate_takes_each_step_from_the_flag_then_the_log_then_the_estimate() {
    let llama = fixture("llama-3.1-8b");
    let command = format!("vllm serve {} -tp 2 --max-model-len 8192", llama.display());
    let estimate = fit::evaluate(&on_box(&command, 80 * GIB), None).expect("plan");
    assert_eq!(
        (
            estimate.free_source,
            estimate.weights_source,
            estimate.kv_source
        ),
        (fit::Source::Hypothetical, fit::Source::Estimate, None)
    );
    assert_eq!(
        estimate.budget.free_at_start,
        80 * GIB - engine::CUDA_CONTEXT_BYTES
    );
    assert_eq!(
        estimate.budget.free_at_start,
        estimate.clean_budget.free_at_start
    );
    assert_eq!(
        Some(estimate.budget.weights_per_gpu),
        engine::weights_per_gpu(&estimate.launch, &estimate.model)
    );
    // Without averages a request is the context length; with them, their sum.
    assert_eq!(estimate.request_tokens, Some(8192));
    assert!(estimate.host_tier.is_none() && estimate.host_memory.is_none());

    let mut config = on_box(&format!("{command} --kv-offloading-size 64"), 80 * GIB);
    config.averages = Some((1000, 500));
    config.overrides = fit::Overrides {
        gpu_free: Some(70 * GIB),
        weights: Some(9 * GIB),
        kv_memory: Some(40 * GIB),
        host_memory: Some(200 * GIB),
    };
    let given = fit::evaluate(&config, None).expect("plan");
    assert_eq!(
        (given.free_source, given.weights_source, given.kv_source),
        (
            fit::Source::Flag,
            fit::Source::Flag,
            Some(fit::Source::Flag)
        )
    );
    assert_eq!(
        (
            given.budget.free_at_start,
            given.budget.weights_per_gpu,
            given.budget.kv_memory
        ),
        (70 * GIB, 9 * GIB, Some(40 * GIB))
    );
    assert_eq!(given.request_tokens, Some(1500));
    assert_eq!(given.host_memory, Some((200 * GIB, fit::Source::Flag)));
    let tier = given.host_tier.expect("the offload tier");
    assert_eq!(tier.budget, 200 * GIB - engine::HOST_GUARD_BYTES);

    // A box with fewer GPUs than the command uses, and no GPUs read at all.
    let mut small = on_box(&command, 80 * GIB);
    small.hypothetical = Some(fit::Hypothetical {
        gpu_memory: 80 * GIB,
        gpus: Some(1),
    });
    assert!(matches!(
        fit::evaluate(&small, None),
        Err(fit::FitError::Input(PlanError::BadValue { flag, .. })) if flag == "--gpus"
    ));
    let unread = fit::PlanConfig {
        hypothetical: None,
        ..on_box(&command, 80 * GIB)
    };
    assert!(matches!(
        fit::evaluate(&unread, None),
        Err(fit::FitError::Unreadable(_))
    ));
    // A checkpoint with no index and no safetensors: the weights are
    // estimated from the config, and said to be (Kimi-K2.5's INT4 experts:
    // 594.2 GB, as ENGINES.md §3 computes from the safetensors list).
    let kimi = format!(
        "python3 -m sglang.launch_server --model-path {} --tp 8",
        fixture("kimi-k2.5").display()
    );
    let outcome = fit::evaluate(&on_box(&kimi, 141 * GIB), None).expect("estimated");
    assert_eq!(outcome.weights_source, fit::Source::ConfigEstimate);
    assert!(outcome.model.weights_from_config);
    let estimate = outcome.model.weights_bytes.expect("estimate");
    assert!((585e9..595e9).contains(&(estimate as f64)), "{estimate}");
    // A config without the shapes to estimate from still names --weights.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256}"#,
    )
    .expect("config");
    let shapeless = format!("vllm serve {}", dir.path().display());
    let error = fit::evaluate(&on_box(&shapeless, 141 * GIB), None).expect_err("no weights");
    assert!(
        matches!(&error, fit::FitError::Input(PlanError::NoWeights { .. }))
            && error.to_string().contains("--weights"),
        "{error}"
    );
}

/// The switches plan reads and the `--no-` forms of vLLM's: the last one
/// written wins, a `--no-` form plan does not read is listed as ignored.
#[test]
fn vllm_no_forms_undo_or_are_listed() {
    let undone = parse("vllm serve m --enforce-eager --no-enforce-eager --trust-remote-code");
    assert!(!undone.enforce_eager);
    assert!(undone.ignored.is_empty(), "{:?}", undone.ignored);
    let listed = parse("vllm serve m --no-async-scheduling --no-enforce-eager --enforce-eager");
    assert!(listed.enforce_eager);
    assert_eq!(listed.ignored, vec!["--no-async-scheduling"]);
}

/// The config's steps each name what they lack: MLA without its rope
/// width, heads without a head size, an unknown dtype; DeepSeek-VL2 with
/// `use_mla: false` is read as MHA by SGLang.
#[test]
fn config_steps_name_what_they_lack() {
    let parse_json = |text: &str| {
        let value: serde_json::Value = serde_json::from_str(text).expect("json");
        model::parse_config(Path::new("config.json"), &value)
    };
    let missing = |text: &str| match parse_json(text) {
        Err(PlanError::MissingField { field, .. }) => field,
        other => panic!("{text}: {other:?}"),
    };
    assert_eq!(
        missing(
            r#"{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                "num_hidden_layers": 61, "kv_lora_rank": 512}"#
        ),
        "qk_rope_head_dim"
    );
    assert_eq!(
        missing(
            r#"{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 8}"#
        ),
        "hidden_size"
    );
    assert_eq!(
        missing(
            r#"{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 0}"#
        ),
        "head_dim"
    );
    let dtype = parse_json(
        r#"{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 8,
            "hidden_size": 1024, "torch_dtype": "float8_e4m3fn"}"#,
    );
    // Its own error, the dtype quoted once: it is no unknown architecture.
    // Before: "unknown architecture \"LlamaForCausalLM (model dtype
    // \\\"float8_e4m3fn\\\")\"", escaped twice.
    let error = dtype.expect_err("an unknown dtype").to_string();
    assert_eq!(
        error,
        "config.json: model dtype \"float8_e4m3fn\" is not one gpureap plan reads (bfloat16, float16, float32)"
    );
    let vl2 = parse_json(
        r#"{"architectures": ["DeepseekVL2ForCausalLM"], "num_hidden_layers": 12, "kv_lora_rank": 512,
            "qk_rope_head_dim": 64, "use_mla": false, "num_attention_heads": 10, "hidden_size": 1280,
            "vision_config": {"layers": 27}}"#,
    )
    .expect("DeepSeek-VL2");
    assert_eq!(
        vl2.attention,
        Attention::Mha {
            kv_heads: 10,
            head_dim: 128,
            v_head_dim: 128
        }
    );
    // Its vision config names no layers or width: the class's defaults.
    assert_eq!(vl2.vision, Some((24, 1024)));
}

// ------------------------------------------------------ sliding window

pub(super) fn h100_kv(kv: u64) -> Budget {
    Budget {
        gpu_total: 81_559 * MIB,
        free_at_start: 80 * GIB,
        weights_per_gpu: gib(30.0),
        kv_memory: Some(kv),
        non_kv: None,
    }
}

#[test]
fn sliding_window_layers_are_read_per_engine() {
    // Gemma-3-27B: 62 layers, every 6th global (transformers' default
    // sliding_window_pattern 6): 10 full, 52 window of 1,024. vLLM gives
    // them SlidingWindowSpec; SGLang 0.5.9 turns its hybrid SWA memory off
    // for Gemma (server_args.py): one full pool.
    let gemma = load("gemma-3-27b-it");
    assert_eq!(
        gemma.window_vllm,
        Some(model::Window {
            layers: 52,
            tokens: 1024
        })
    );
    assert_eq!(gemma.window_sglang, None);
    // Gemma3TextConfig's default max_position_embeddings, no rope factor
    // (vLLM skips it for gemma3).
    assert_eq!(gemma.max_position, Some(131_072));
    // gpt-oss-20b: vLLM slides the even layers (gpt_oss.py), SGLang the
    // layer_types entries sliding_attention: 12 of 24 each, window 128.
    let oss = load("gpt-oss-20b");
    let half = Some(model::Window {
        layers: 12,
        tokens: 128,
    });
    assert_eq!((oss.window_vllm, oss.window_sglang), (half, half));
    // Llama-3.1: no window.
    assert_eq!(load("llama-3.1-8b").window_vllm, None);
}

#[test]
fn vllm_groups_sliding_window_layers_and_logs_their_concurrency() {
    let gemma = load("gemma-3-27b-it");
    let launch = parse("vllm serve m --max-model-len 32768");
    let device = engine::device(&launch, &gemma, &h100_kv(40 * GIB), Some((2000, 1000)));
    // Page (one block of one layer): 16 KV heads × (128 + 128) × 2 B × 16
    // tokens = 131,072 B. _get_kv_cache_groups_uniform_page_size: 10 full
    // and 52 window layers; 52 ≥ 1.5 × 10, so groups of 10: 1 full group,
    // ⌈52/10⌉ = 6 window groups. get_num_blocks: 40 GiB // 131,072 // 10 =
    // 32,768 blocks.
    // Per request of max_model_len (_max_memory_usage_bytes_from_groups):
    // full ⌈32,768/16⌉ = 2,048 blocks; window (SlidingWindowSpec):
    // ⌈min(1,024 − 1 + 2 × 8,192, 32,768)/16⌉ + 1 = ⌈17,407/16⌉ + 1 =
    // 1,089 (in flight: 2 async batches × max_num_batched_tokens 8,192);
    // 2,048 + 6 × 1,089 = 8,582 blocks.
    assert_eq!(
        device.hybrid,
        Some(engine::Hybrid::Vllm {
            full_groups: 1,
            window_groups: 6,
            state_groups: 0,
            state_blocks: Some(0),
            group_size: 10,
            window: Some(1024),
            in_flight_tokens: 16_384,
            blocks: 32_768,
            blocks_per_request: 8_582,
        })
    );
    // get_kv_cache_capacity: concurrency 32,768 / 8,582 = 3.818…; "GPU KV
    // cache size" int(3.818… × 32,768) = 125,115 tokens.
    let logged = device.logged.expect("starts");
    assert_eq!(logged.kv_cache_tokens, 125_115);
    assert!((logged.max_concurrency.expect("vLLM logs it") - 32_768.0 / 8_582.0).abs() < 1e-12);
    assert_eq!(device.tokens_per_rank, 125_115);
    // Counted as full attention (the old rule) the same 40 GiB held
    // 40 GiB / (8,192 B × 62 layers) = 84,562 tokens: 32 % fewer.
    // Requests of 3,000 tokens: ⌈3,000/16⌉ = 188 blocks in every group
    // (the window holds up to 17,407 tokens): 7 × 188 = 1,316 blocks;
    // 32,768 / 1,316 = 24.9 at once, bound by the pool.
    let (at_once, cap) = engine::requests_at_once(&device, 3000);
    assert!((at_once - 32_768.0 / 1_316.0).abs() < 1e-9);
    assert_eq!(cap, engine::Cap::Pool);
    // --disable-hybrid-kv-cache-manager (unify_hybrid_kv_cache_specs):
    // every layer full, one group of 62: 40 GiB // (131,072 × 62) = 5,285
    // blocks, 84,560 tokens; logged int(5,285 / 2,048 × 32,768) = 84,560.
    let unified = parse("vllm serve m --max-model-len 32768 --disable-hybrid-kv-cache-manager");
    let device = engine::device(&unified, &gemma, &h100_kv(40 * GIB), None);
    assert_eq!(device.hybrid, None);
    assert_eq!(device.tokens_per_rank, 5_285 * 16);
    assert_eq!(device.logged.expect("starts").kv_cache_tokens, 84_560);
}

#[test]
fn vllm_window_groups_of_equal_kinds_take_the_larger_count() {
    // gpt-oss-20b: 12 full, 12 window; 12 < 1.5 × 12, so one group of
    // each, 12 layers a group. Page: 8 KV heads × 128 × 2 B × 16 = 32,768
    // B; 10 GiB // (32,768 × 12) = 27,306 blocks. Per request of 131,072:
    // 8,192 + ⌈min(127 + 16,384, 131,072)/16⌉ + 1 = 8,192 + 1,033 = 9,225
    // blocks; int(27,306 / 9,225 × 131,072) = 387,973 tokens.
    let oss = load("gpt-oss-20b");
    let device = engine::device(&parse("vllm serve m"), &oss, &h100_kv(10 * GIB), None);
    let Some(engine::Hybrid::Vllm {
        group_size,
        blocks,
        blocks_per_request,
        ..
    }) = device.hybrid
    else {
        panic!("{:?}", device.hybrid)
    };
    assert_eq!(
        (group_size, blocks, blocks_per_request),
        (12, 27_306, 9_225)
    );
    assert_eq!(
        device.logged.expect("starts").kv_cache_tokens,
        (27_306.0 / 9_225.0 * 131_072.0) as u64
    );
    assert_eq!(device.logged.expect("starts").kv_cache_tokens, 387_973);
}

#[test]
fn sglang_splits_a_hybrid_swa_pool_by_its_ratio() {
    // gpt-oss-20b on SGLang 0.5.9 (is_hybrid_swa_model): cell = 8 × (64 +
    // 64) × 24 × 2 B = 49,152 B; 10 GiB // 49,152 = 218,453 tokens.
    // set_num_tokens_hybrid_swa, F = 2,048 B a layer: full =
    // int(218,453 × F·24 / (F·12 + 0.8·F·12)) = 242,725; window =
    // int(242,725 × 0.8) = 194,180; max_total_num_tokens = the full pool.
    let oss = load("gpt-oss-20b");
    let launch = parse("python3 -m sglang.launch_server --model-path m");
    let device = engine::device(&launch, &oss, &h100_kv(10 * GIB), Some((3000, 1000)));
    assert_eq!(
        device.hybrid,
        Some(engine::Hybrid::Sglang {
            full_tokens: 242_725,
            window_tokens: 194_180,
            window: 128,
            ratio: 0.8,
        })
    );
    assert_eq!(device.tokens_per_rank, 242_725);
    assert_eq!(device.logged.expect("starts").kv_cache_tokens, 242_725);
    // model_runner: max_running_requests = min(tokens // 2, pool) with
    // the pool's default clamp(218,453 / 131,072 × 512, 2048, 4096) = 2048.
    assert_eq!(device.max_running_requests, 2048);
    // Requests of 4,000 tokens: full pool 242,725 / 4,000 = 60.7; window
    // pool 194,180 / min(4,000, 128) = 1,517: the full pool binds.
    let (at_once, cap) = engine::requests_at_once(&device, 4000);
    assert!((at_once - 242_725.0 / 4000.0).abs() < 1e-9);
    assert_eq!(cap, engine::Cap::FullPool);
    // --swa-full-tokens-ratio 0.5: full = int(218,453 × 24 / 18) =
    // 291,270, window 145,635.
    let half = parse("python3 -m sglang.launch_server --model-path m --swa-full-tokens-ratio 0.5");
    let Some(engine::Hybrid::Sglang {
        full_tokens,
        window_tokens,
        ..
    }) = engine::device(&half, &oss, &h100_kv(10 * GIB), None).hybrid
    else {
        panic!("no SWA pools")
    };
    assert_eq!((full_tokens, window_tokens), (291_270, 145_635));
    // --disable-hybrid-swa-memory: one pool of every layer.
    let one = parse("python3 -m sglang.launch_server --model-path m --disable-hybrid-swa-memory");
    let device = engine::device(&one, &oss, &h100_kv(10 * GIB), None);
    assert_eq!((device.hybrid, device.tokens_per_rank), (None, 218_453));
    // Gemma-3 on SGLang: one full pool of all 62 layers, as before.
    let gemma = load("gemma-3-27b-it");
    let device = engine::device(&launch, &gemma, &h100_kv(10 * GIB), None);
    assert_eq!(device.hybrid, None);
    assert_eq!(device.tokens_per_rank, 10 * GIB / (16 * 256 * 2 * 62));
}

#[test]
fn a_sliding_window_that_is_not_modelled_is_refused_by_name() {
    // Qwen2 with use_sliding_window true: transformers makes the layers
    // from max_window_layers on slide; plan does not model it.
    let config = serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "hidden_size": 3584,
        "sliding_window": 4096,
        "use_sliding_window": true,
        "max_window_layers": 21
    });
    let error = model::parse_config(Path::new("config.json"), &config).expect_err("refused");
    assert!(
        error.to_string().contains("Qwen2ForCausalLM")
            && error.to_string().contains("sliding-window"),
        "{error}"
    );
    // Turned off (Qwen2.5's published form), it is full attention.
    let mut off = config.clone();
    off["use_sliding_window"] = serde_json::json!(false);
    let model = model::parse_config(Path::new("config.json"), &off).expect("full attention");
    assert_eq!((model.window_vllm, model.window_sglang), (None, None));
}

// ------------------------------------------------------ linear attention

#[test]
fn vllm_pools_gated_delta_net_state_beside_full_attention() {
    // Qwen3-Next-80B-A3B: 48 layers, every 4th full attention
    // (full_attention_interval 4): 12 full, 36 gated-delta-net.
    let next = load("qwen3-next-80b-a3b");
    assert_eq!(
        next.linear,
        Some(model::Linear {
            layers: 36,
            attention_layers: 12,
            shape: model::StateShape::GatedDeltaNet {
                k_heads: 16,
                v_heads: 32,
                k_dim: 128,
                v_dim: 128,
                conv_kernel: 4,
            },
            vllm_ssm_bytes: None,
            sglang_ssm_bytes: 4,
            chunk_size: 2048,
            mlp: None,
        })
    );
    // One layer's state (gated_delta_net_state_shape, bf16): conv (128·16·2
    // + 128·32) × (4 − 1) = 24,576 and recurrent 32 × 128 × 128 = 524,288
    // elements: 1,097,728 B at TP1.
    assert_eq!(next.linear.expect("linear").state_bytes(1, 2, 2), 1_097_728);
    let launch = parse("vllm serve m --max-model-len 8192");
    let device = engine::device(&launch, &next, &h100_kv(20 * GIB), Some((6000, 2000)));
    // _align_hybrid_block_size: attention 2 KV heads × (256 + 256) × 2 B
    // = 2,048 B a token; block 16 × ⌈1,097,728 / (16 × 2,048)⌉ = 16 × 34 =
    // 544 tokens, page 544 × 2,048 = 1,114,112 B (the state padded to it).
    assert_eq!(device.page_size, 544);
    // Groups: 36 ≥ 1.5 × 12, so groups of 12: 1 full, 3 state. Blocks:
    // 20 GiB // (1,114,112 × 12) = 1,606. A request of 8,192: ⌈8,192/544⌉
    // = 16 full blocks + 1 state block in each of 3 groups (MambaSpec,
    // mamba_cache_mode none) = 19; concurrency 1,606 / 19 = 84.53, "GPU KV
    // cache size" int(84.53 × 8,192) = 692,439 tokens.
    let Some(engine::Hybrid::Vllm {
        full_groups,
        state_groups,
        group_size,
        blocks,
        blocks_per_request,
        ..
    }) = device.hybrid
    else {
        panic!("{:?}", device.hybrid)
    };
    assert_eq!(
        (
            full_groups,
            state_groups,
            group_size,
            blocks,
            blocks_per_request
        ),
        (1, 3, 12, 1_606, 19)
    );
    assert_eq!(device.logged.expect("starts").kv_cache_tokens, 692_439);
    // Requests of 8,000 tokens: ⌈8,000/544⌉ = 15 + 3 = 18 blocks: 89.2.
    let (at_once, cap) = engine::requests_at_once(&device, 8000);
    assert!((at_once - 1_606.0 / 18.0).abs() < 1e-9);
    assert_eq!(cap, engine::Cap::Pool);
    // TP4: 1 KV head a rank (2 // 4, at least 1): 1,024 B a token; the
    // state (2,048 × 3 + 8 × 128 × 128) × 2 = 274,432 B; block 16 ×
    // ⌈274,432 / 16,384⌉ = 272.
    let tp4 = parse("vllm serve m --max-model-len 8192 -tp 4");
    assert_eq!(next.linear.expect("linear").state_bytes(4, 2, 2), 274_432);
    assert_eq!(
        engine::device(&tp4, &next, &h100_kv(20 * GIB), None).page_size,
        272
    );
}

#[test]
fn sglang_takes_linear_attention_state_slots_out_of_the_pool() {
    // Qwen3-Next-80B-A3B on SGLang 0.5.9, TP1, 20 GiB left after the
    // fraction. State per request (mamba_cache_per_req): 36 layers × (conv
    // (128·32 + 2·16·128) × 3 in bf16 + recurrent 32 × 128 × 128 in float32)
    // = 36 × (49,152 + 2,097,152) = 77,266,944 B.
    let next = load("qwen3-next-80b-a3b");
    assert_eq!(
        next.linear.expect("linear").sglang_state_bytes(1, 2, 4),
        77_266_944
    );
    // handle_max_mamba_cache: max_mamba_cache_size = int(20 × 0.9/1.9 GiB //
    // 77,266,944) = 131; the rest 20 GiB − 131 × 77,266,944 B; cell: 12
    // full layers × 2 KV heads × (256 + 256) × 2 B = 24,576 B; tokens =
    // int(rest · 2^30) // 24,576 = 461,949 (Python's floats).
    let launch = parse("python3 -m sglang.launch_server --model-path m");
    let device = engine::device(&launch, &next, &h100_kv(20 * GIB), Some((6000, 2000)));
    assert_eq!(device.bytes_per_token, 24_576);
    assert_eq!(device.tokens_per_rank, 461_949);
    // init_memory_pool: the request pool min(2048, 131 // 3) = 43 (radix
    // cache on: MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO 3).
    assert_eq!(
        device.hybrid,
        Some(engine::Hybrid::SglangState {
            full_tokens: 461_949,
            state_slots: 131,
            state_bytes_per_request: 77_266_944,
            state_request_cap: 43,
        })
    );
    assert_eq!(device.max_running_requests, 43);
    // Requests of 8,000 tokens: the pool holds 57.7, the state slots 43.
    assert_eq!(
        engine::requests_at_once(&device, 8000),
        (43.0, engine::Cap::StateSlots)
    );
    // --max-mamba-cache-size 200 --disable-radix-cache: 200 slots, a cap
    // of 200; the rest 20 GiB − 200 × 77,266,944 B.
    let given = parse(
        "python3 -m sglang.launch_server --model-path m --max-mamba-cache-size 200 --disable-radix-cache",
    );
    let device = engine::device(&given, &next, &h100_kv(20 * GIB), None);
    let rest = 20.0 - 200.0 * 77_266_944.0 / GIB as f64;
    assert_eq!(
        device.tokens_per_rank,
        ((rest * GIB as f64) as u64) / 24_576
    );
    assert_eq!(device.max_running_requests, 200);
}

// ------------------------------------------- linear attention and Mamba
//
// The configs (tests/fixtures/models/README.md) are written from the
// published config.json of each model, the fields the engines read; the
// hub is not reachable from here. Every expected figure below is printed
// by scripts/mamba_state_reference.py, which runs the engines' own
// functions (vLLM 0.26.0 `MambaStateShapeCalculator`, the models'
// `get_mamba_state_*_from_config`, `_align_hybrid_block_size`, the KV-cache
// grouping and capacity; SGLang 0.5.9 `Mamba2StateShape.create`,
// `mamba_cache_per_req`, `handle_max_mamba_cache`, `profile_max_num_token`)
// on those configs, not plan's formulas.

/// vLLM 0.26.0 with 20 GiB of KV and `--max-model-len 8192`: (one state
/// layer's bytes, block size, blocks, blocks a request, logged tokens).
fn vllm_state_pool(name: &str, flags: &str) -> (u64, u32, u64, u64, u64) {
    let model = load(name);
    let launch = parse(&format!("vllm serve m --max-model-len 8192 {flags}"));
    let device = engine::device(&launch, &model, &h100_kv(20 * GIB), None);
    let Some(engine::Hybrid::Vllm {
        blocks,
        blocks_per_request,
        ..
    }) = device.hybrid
    else {
        panic!("{name}: {:?}", device.hybrid)
    };
    let state = engine::vllm_state_bytes(&launch, &model, &model.linear.expect("state layers"));
    (
        state,
        device.page_size,
        blocks,
        blocks_per_request,
        device.logged.expect("starts").kv_cache_tokens,
    )
}

/// SGLang 0.5.9 with 20 GiB left after the fraction, TP1: (state bytes a
/// request, slots, cell, max_total_num_tokens, request cap).
fn sglang_state_pool(name: &str) -> (u64, u64, u64, u64, u64) {
    let model = load(name);
    let launch = parse("python3 -m sglang.launch_server --model-path m");
    let device = engine::device(&launch, &model, &h100_kv(20 * GIB), None);
    let Some(engine::Hybrid::SglangState {
        full_tokens,
        state_slots,
        state_bytes_per_request,
        state_request_cap,
    }) = device.hybrid
    else {
        panic!("{name}: {:?}", device.hybrid)
    };
    assert_eq!(device.tokens_per_rank, full_tokens);
    assert_eq!(device.max_running_requests, state_request_cap);
    (
        state_bytes_per_request,
        state_slots,
        device.bytes_per_token,
        full_tokens,
        state_request_cap,
    )
}

#[test]
fn qwen3_5_pools_gated_delta_net_state_with_its_float32_ssm_dtype() {
    // Qwen3.5-35B-A3B: text_config, 40 layers, every 4th full: 30 linear.
    // Its mamba_ssm_dtype float32 makes vLLM's recurrent state float32
    // (Qwen3_5ForConditionalGenerationConfig), where Qwen3-Next's is bf16:
    // conv (3, 8,192) bf16 + (32, 128, 128) float32 = 2,146,304 B a layer;
    // block 1,056, 992 blocks, 8 + 3 blocks a request, 738,769 tokens.
    let moe = load("qwen3.5-35b-a3b");
    let linear = moe.linear.expect("linear");
    assert_eq!((linear.layers, linear.attention_layers), (30, 10));
    assert_eq!(
        vllm_state_pool("qwen3.5-35b-a3b", ""),
        (2_146_304, 1_056, 992, 11, 738_769)
    );
    // Qwen3.5-27B (dense) at TP2: (3, 5,120) bf16 + (24, 128, 128) float32.
    assert_eq!(
        vllm_state_pool("qwen3.5-27b", "-tp 2"),
        (1_603_584, 784, 835, 14, 488_594)
    );
    // SGLang 0.5.9: 64,389,120 B a request, 157 slots, cap 52.
    assert_eq!(
        sglang_state_pool("qwen3.5-35b-a3b"),
        (64_389_120, 157, 20_480, 554_968, 52)
    );
}

#[test]
fn nemotron_h_pools_mamba2_state_beside_its_attention_layers() {
    // Nemotron-H-8B: hybrid_override_pattern of 52 layers, 24 `M`, 4 `*`,
    // 24 MLP (`-`, neither KV nor state). vLLM keeps the temporal state in
    // float32 (NemotronHForCausalLMConfig): (3, 10,240) bf16 + (128, 64,
    // 128) float32 = 4,255,744 B; block 1,040, groups of 4: 1 full + 6
    // state; 8 + 6 blocks a request; 737,280 tokens.
    let nemotron = load("nemotron-h-8b");
    let linear = nemotron.linear.expect("mamba");
    assert_eq!((linear.layers, linear.attention_layers), (24, 4));
    assert_eq!(
        vllm_state_pool("nemotron-h-8b", ""),
        (4_255_744, 1_040, 1_260, 14, 737_280)
    );
    assert_eq!(
        sglang_state_pool("nemotron-h-8b"),
        (102_137_856, 99, 16_384, 693_554, 33)
    );
}

#[test]
fn falcon_h1_pools_mamba2_state_and_attention_in_every_layer() {
    // Falcon-H1: every layer holds KV and a Mamba2 state (mamba_d_ssm
    // 3,072, one group, 48 heads of 64, state 256). vLLM: the temporal
    // state in the model dtype: 1,594,368 B; block 1,568; one full and
    // one state group of 24.
    let falcon = load("falcon-h1-1.5b");
    let linear = falcon.linear.expect("mamba");
    assert_eq!((linear.layers, linear.attention_layers), (24, 24));
    assert_eq!(
        vllm_state_pool("falcon-h1-1.5b", ""),
        (1_594_368, 1_568, 557, 7, 651_849)
    );
    assert_eq!(
        sglang_state_pool("falcon-h1-1.5b"),
        (76_013_568, 133, 24_576, 462_444, 44)
    );
}

#[test]
fn jamba_pools_mamba1_state_on_vllm_and_sglang_refuses_it() {
    // Jamba-v0.1: attention where i % 8 == 4 (4 of 32), Mamba1 elsewhere:
    // conv (3, 8,192) + temporal (8,192, 16), bf16: 311,296 B; block 80.
    let jamba = load("jamba-v0.1");
    let linear = jamba.linear.expect("mamba");
    assert_eq!((linear.layers, linear.attention_layers), (28, 4));
    assert_eq!(
        vllm_state_pool("jamba-v0.1", ""),
        (311_296, 80, 16_384, 110, 1_220_161)
    );
    // SGLang has no Jamba model, in either kept release.
    for rules in [
        super::version::Rules::Sglang0_5_9,
        super::version::Rules::Sglang0_5_23,
    ] {
        let mut launch = parse("python3 -m sglang.launch_server --model-path m");
        launch.rules = rules;
        let refused = model::check_engine(&launch, &jamba)
            .expect_err("refused")
            .to_string();
        assert!(
            refused.starts_with("JambaForCausalLM on SGLang 0.5."),
            "{refused}"
        );
    }
    assert!(model::check_engine(&parse("vllm serve m"), &jamba).is_ok());
}

#[test]
fn pure_mamba_pools_only_state_on_vllm() {
    // No attention layer: no KV, one uniform group of every state layer,
    // the page the state itself, one block a request; "GPU KV cache size"
    // is the blocks × max_model_len.
    let mamba = load("mamba-2.8b");
    assert_eq!(mamba.linear.expect("mamba").attention_layers, 0);
    let (state, _, blocks, per_request, tokens) = vllm_state_pool("mamba-2.8b", "");
    assert_eq!(
        (state, blocks, per_request, tokens),
        (194_560, 1_724, 1, 14_123_008)
    );
    let (state, _, blocks, per_request, tokens) = vllm_state_pool("mamba-codestral-7b", "");
    assert_eq!(
        (state, blocks, per_request, tokens),
        (2_158_592, 155, 1, 1_269_760)
    );
    // SGLang 0.5.9 has no Mamba model; 0.5.23's pool is not modelled.
    for rules in [
        super::version::Rules::Sglang0_5_9,
        super::version::Rules::Sglang0_5_23,
    ] {
        let mut launch = parse("python3 -m sglang.launch_server --model-path m");
        launch.rules = rules;
        assert!(matches!(
            model::check_engine(&launch, &mamba),
            Err(PlanError::NotServed { .. })
        ));
    }
}

#[test]
fn kimi_linear_pools_kda_state_beside_mla() {
    // Kimi-Linear-48B-A3B: kda_layers (from 1) 20 of 27, the 7 others MLA
    // (kv_lora_rank 512 + rope 64, one head on both engines). KDA state:
    // conv (3, 12,288) bf16 + (32, 128, 128) float32 = 2,170,880 B.
    let kimi = load("kimi-linear-48b-a3b");
    assert_eq!(
        kimi.attention_for(Engine::Vllm),
        Attention::Mla {
            kv_lora_rank: 512,
            qk_rope_head_dim: 64
        }
    );
    assert_eq!(kimi.attention_for(Engine::Sglang), kimi.attention_vllm);
    let linear = kimi.linear.expect("kda");
    assert_eq!((linear.layers, linear.attention_layers), (20, 7));
    assert_eq!(
        vllm_state_pool("kimi-linear-48b-a3b", ""),
        (2_170_880, 1_888, 1_410, 8, 1_443_840)
    );
    // SGLang 0.5.9 turns the radix cache off for Kimi-Linear
    // (`_handle_mamba_radix_cache`, `support_mamba_cache=False`): the cap
    // is every slot, 234.
    assert_eq!(
        sglang_state_pool("kimi-linear-48b-a3b"),
        (43_417_600, 234, 8_064, 1_403_164, 234)
    );
}

#[test]
fn vllm_0_33_holds_hybrid_state_in_align_mode_by_default() {
    // vLLM 0.33.0 turns prefix caching on for hybrids by default: mamba
    // cache mode `align`, 2 state blocks a request in each state group, 3
    // for gated DeltaNet, whose FlashInfer prefill on Hopper exports a
    // checkpoint (and aligns blocks to 64); an MLA hybrid's blocks are
    // multiples of 128. The figures of scripts/mamba_state_reference.py.
    let pool = |name: &str, flags: &str| {
        let model = load(name);
        let mut launch = parse(&format!("vllm serve m --max-model-len 8192 {flags}"));
        launch.rules = super::version::Rules::Vllm0_33;
        let device = engine::device(&launch, &model, &h100_kv(20 * GIB), None);
        let Some(engine::Hybrid::Vllm {
            blocks,
            blocks_per_request,
            ..
        }) = device.hybrid
        else {
            panic!("{name}: {:?}", device.hybrid)
        };
        (
            device.page_size,
            blocks,
            blocks_per_request,
            device.logged.expect("starts").kv_cache_tokens,
        )
    };
    assert_eq!(pool("qwen3.5-35b-a3b", ""), (1_088, 963, 17, 464_052));
    assert_eq!(pool("nemotron-h-8b", ""), (1_040, 1_260, 20, 516_096));
    assert_eq!(
        pool("kimi-linear-48b-a3b", ""),
        (1_920, 1_387, 11, 1_032_936)
    );
    // --no-enable-prefix-caching: mode `none`, 0.26.0's pool.
    assert_eq!(
        pool("nemotron-h-8b", "--no-enable-prefix-caching"),
        (1_040, 1_260, 14, 737_280)
    );
    // vLLM 0.26.0 with --enable-prefix-caching: `all` for Nemotron-H (its
    // blocks aligned to chunk_size 128, a state block per block of
    // tokens), `align` for Qwen3.5 (2 state blocks a request).
    assert_eq!(
        vllm_state_pool("nemotron-h-8b", "--enable-prefix-caching"),
        (4_255_744, 1_152, 1_137, 56, 166_326)
    );
    assert_eq!(
        vllm_state_pool("qwen3.5-35b-a3b", "--enable-prefix-caching"),
        (2_146_304, 1_056, 992, 14, 580_461)
    );
}

#[test]
fn sglang_0_5_23_keeps_a_padding_slot_and_five_slots_a_running_request() {
    // SGLang 0.5.23 _handle_max_mamba_cache: (budget − per request) //
    // per request slots and one padding slot allocated; the radix cache's
    // extra_buffer strategy (overlap scheduler on) caps the requests at
    // slots // 5. Figures of scripts/mamba_state_reference.py.
    let pool = |name: &str, flags: &str| {
        let model = load(name);
        let mut launch = parse(&format!(
            "python3 -m sglang.launch_server --model-path m {flags}"
        ));
        launch.rules = super::version::Rules::Sglang0_5_23;
        let device = engine::device(&launch, &model, &h100_kv(20 * GIB), None);
        let Some(engine::Hybrid::SglangState {
            full_tokens,
            state_slots,
            state_request_cap,
            ..
        }) = device.hybrid
        else {
            panic!("{name}: {:?}", device.hybrid)
        };
        (state_slots, full_tokens, state_request_cap)
    };
    assert_eq!(pool("qwen3.5-35b-a3b", ""), (156, 554_968, 31));
    assert_eq!(pool("nemotron-h-8b", ""), (98, 693_554, 19));
    // 0.5.23 keeps Kimi-Linear's radix cache (extra_buffer): 233 // 5.
    assert_eq!(pool("kimi-linear-48b-a3b", ""), (233, 1_403_164, 46));
    // Without the overlap scheduler, pages of one token: no_buffer, // 3.
    assert_eq!(
        pool("nemotron-h-8b", "--disable-overlap-schedule"),
        (98, 693_554, 32)
    );
}

#[test]
fn the_state_dtype_flags_change_the_state() {
    // vLLM --mamba-ssm-cache-dtype bfloat16 over Nemotron-H's float32
    // default (NemotronHForCausalLMConfig updates only "auto"): 2,158,592 B
    // a layer, block 528. SGLang --mamba-ssm-dtype bfloat16 (it sets
    // SGLANG_MAMBA_SSM_DTYPE, over the config's mamba_ssm_dtype) halves
    // Qwen3.5's recurrent state: 32,931,840 B a request, 308 slots. The
    // figures of scripts/mamba_state_reference.py.
    assert_eq!(
        vllm_state_pool("nemotron-h-8b", "--mamba-ssm-cache-dtype bfloat16"),
        (2_158_592, 528, 2_482, 22, 924_206)
    );
    let qwen = load("qwen3.5-35b-a3b");
    let launch = parse("python3 -m sglang.launch_server --model-path m --mamba-ssm-dtype bfloat16");
    let device = engine::device(&launch, &qwen, &h100_kv(20 * GIB), None);
    assert_eq!(
        device.hybrid,
        Some(engine::Hybrid::SglangState {
            full_tokens: 553_312,
            state_slots: 308,
            state_bytes_per_request: 32_931_840,
            state_request_cap: 102,
        })
    );
    // The environment variable does the same; an engine's refusal of a
    // value is bad input.
    let mut env = no_env();
    env.insert("SGLANG_MAMBA_SSM_DTYPE".to_string(), "bfloat16".to_string());
    let by_env = launch::parse(
        &argv("python3 -m sglang.launch_server --model-path m"),
        &env,
    )
    .expect("parses");
    assert_eq!(
        engine::device(&by_env, &qwen, &h100_kv(20 * GIB), None).hybrid,
        device.hybrid
    );
    assert!(matches!(
        parse_err("vllm serve m --mamba-ssm-cache-dtype fp8"),
        PlanError::BadValue { .. }
    ));
}

#[test]
fn state_models_weights_from_the_config_match_their_published_sizes() {
    // No checkpoint beside these configs: the weights are the config's
    // estimate (embeddings, attention over the attention layers, each
    // family's mixer (`Linear::weights`) over its state layers, the MLP
    // layers its layout has: Nemotron-H's relu² `-` layers, none for
    // Mamba, Jamba's MoE every other layer). Against the parameter counts
    // the model cards give (written from memory: the hub is not
    // reachable), within 2 %.
    for (name, published) in [
        ("nemotron-h-8b", 8.1e9),
        ("mamba-2.8b", 2.77e9),
        ("mamba-codestral-7b", 7.29e9),
        ("falcon-h1-1.5b", 1.55e9),
        ("jamba-v0.1", 51.6e9),
    ] {
        let model = load(name);
        assert!(model.weights_from_config, "{name}");
        let parameters = model.weights_bytes.expect(name) as f64 / 2.0;
        assert!(
            (parameters / published - 1.0).abs() < 0.02,
            "{name}: {parameters} parameters against {published}"
        );
    }
}

// ------------------------------------------------ weights from the config

#[test]
fn weights_are_estimated_from_the_config_without_a_checkpoint_index() {
    let config = |name: &str| -> serde_json::Value {
        let path = fixture(name).join("config.json");
        serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("JSON")
    };
    let estimate = |name: &str| {
        let json = config(name);
        let model = model::parse_config(Path::new("config.json"), &json).expect(name);
        model::config_weights(&json, &model)
    };
    // Llama-3.1-8B: embeddings and LM head 2 × 128,256 × 4,096; per layer
    // q and o 4,096², k and v 2 × 4,096 × 1,024, MLP 3 × 4,096 × 14,336, two
    // norms; the final norm: 8,030,261,248 parameters × 2 B, the published
    // index's total_size to the byte.
    assert_eq!(estimate("llama-3.1-8b"), Some(16_060_522_496));
    assert_eq!(load("llama-3.1-8b").weights_bytes, Some(16_060_522_496));
    // gpt-oss-20b (mxfp4): 32 experts × 3 × 2,880² × 24 layers at 4.25
    // bits; embeddings, LM head, attention (q, o 2,880 × 64 × 64; k, v
    // 2,880 × 8 × 128), routers and norms at 2 bytes.
    let sixteen =
        (2u64 * 201_088 * 2_880 + 2_880 * 49 + 26_542_080 * 24 + 2_880 * 32 * 24) as f64 * 2.0;
    let experts = (3u64 * 2_880 * 2_880 * 32 * 24) as f64 * 4.25 / 8.0;
    assert_eq!(estimate("gpt-oss-20b"), Some((sixteen + experts) as u64));
    // No index and no safetensors beside it: the model takes the estimate,
    // marked as one.
    let oss = load("gpt-oss-20b");
    assert!(oss.weights_from_config);
    assert_eq!(oss.weights_bytes, Some((sixteen + experts) as u64));
}

// ------------------------------------------------------ real starts

#[test]
fn hybrid_pools_match_real_vllm_starts_from_their_available_kv() {
    // vLLM 0.26.0 on one H100 80GB (--load-format dummy --max-model-len 8192
    // --enforce-eager --gpu-memory-utilization 0.9; the gpu-corpus logs
    // vllm-0.26.0-gemma3-1b-eager.log and -qwen3-next-12l-eager.log). From
    // the KV memory each logged ("Available KV cache memory", two decimals
    // of GiB), the pool arithmetic gives the logged "GPU KV cache size" and
    // "Maximum concurrency" within what that rounding allows (±0.005 GiB).
    let launch = parse("vllm serve m --max-model-len 8192 --enforce-eager");
    let start = |model: &Model, weights: f64, kv: f64| {
        let budget = Budget {
            gpu_total: 81_559 * MIB,
            free_at_start: gib(78.66),
            weights_per_gpu: gib(weights),
            kv_memory: Some(gib(kv)),
            non_kv: None,
        };
        engine::device(&launch, model, &budget, None)
            .logged
            .expect("starts")
    };
    let close = |planned: f64, logged: f64| (planned - logged).abs() / logged;
    // Gemma-3-1B: 4 full, 22 window (512) layers: groups of 4, 1 + 6; a
    // request 512 + 6 × 513 blocks. Logged: 68.53 GiB, 2,561,957 tokens,
    // 312.74x.
    let gemma = start(&load("gemma-3-1b-it"), 1.96, 68.53);
    assert!(
        close(gemma.kv_cache_tokens as f64, 2_561_957.0) < 1e-4,
        "{gemma:?}"
    );
    assert!(
        close(gemma.max_concurrency.expect("vLLM"), 312.74) < 1e-4,
        "{gemma:?}"
    );
    // Qwen3-Next, 12 layers: 3 full, 9 linear; block 544 ("Setting attention
    // block size to 544 tokens", "Padding mamba page size by 1.49%"); a
    // request 16 + 3 blocks. Logged: 30.22 GiB, 4,185,249 tokens, 510.89x.
    let next = load("qwen3-next-80b-a3b-12l");
    let logged = start(&next, 38.02, 30.22);
    assert!(
        close(logged.kv_cache_tokens as f64, 4_185_249.0) < 2e-4,
        "{logged:?}"
    );
    assert!(
        close(logged.max_concurrency.expect("vLLM"), 510.89) < 2e-4,
        "{logged:?}"
    );
    // The old rule (every layer full attention, blocks of 16) planned
    // Gemma-3-1B at 68.53 GiB / (16,384 / 16 × 26 B) = 2,763,670 tokens and
    // no concurrency of its own; Qwen3-Next was refused.
}

/// SGLang 0.5.14 `_handle_gpu_memory_settings`: prefill CUDA graphs on
/// (its default, `tc_piecewise`) reserve 8 MiB per prefill graph size more,
/// 1.5 GiB for MLA; the corpus's real starts logged 0.83 with graphs and
/// 0.835 without (Qwen3-4B, H100, context 8192: 58 sizes). 0.5.9 and
/// 0.5.23 keep their rule.
#[test]
fn sglang_0_5_14_reserves_for_prefill_graphs() {
    let qwen = load("qwen3-4b");
    let h100 = 81_559 * MIB;
    let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let at = |line: &str, rules: super::version::Rules, model: &Model| {
        let mut launch = parse(&format!(
            "python3 -m sglang.launch_server --model-path m --context-length 8192 {line}"
        ));
        launch.rules = rules;
        engine::sglang_default_fraction(&launch, model, h100)
    };
    let v14 = super::version::Rules::Sglang0_5_14;
    // 4…32 by 4 (8), 48…256 by 16 (14), 288…512 by 32 (8), 576…1024 by 64
    // (8), 1280…4096 by 256 (12), 4608…8192 by 512 (8): 58 sizes.
    let graphs = round3((81_559.0 - 13_440.0 - 58.0 * 8.0) / 81_559.0);
    assert_eq!(graphs, 0.83);
    assert_eq!(at("", v14, &qwen), graphs);
    // Off by the per-phase flag, the legacy switches, or what turns
    // tc_piecewise off (DP attention, PP).
    for off in [
        "--cuda-graph-backend-prefill disabled",
        "--disable-cuda-graph",
        "--disable-prefill-cuda-graph",
    ] {
        assert_eq!(at(off, v14, &qwen), 0.835, "{off}");
    }
    // The backend flag wins over the switches.
    assert_eq!(
        at(
            "--disable-cuda-graph --cuda-graph-backend-prefill tc_piecewise",
            v14,
            &qwen
        ),
        graphs
    );
    // A shorter context caps the largest size: 2048 → 8 + 14 + 8 + 8 + 4 = 42.
    let mut short = parse(
        "python3 -m sglang.launch_server --model-path m --context-length 2048 --chunked-prefill-size 8192",
    );
    short.rules = v14;
    assert_eq!(
        engine::sglang_default_fraction(&short, &qwen, h100),
        round3((81_559.0 - 13_440.0 - 42.0 * 8.0) / 81_559.0)
    );
    // MLA: 1.5 GiB flat.
    let dsv2 = load("deepseek-v2-lite");
    assert_eq!(
        at("", v14, &dsv2),
        round3((81_559.0 - 13_440.0 - 1536.0) / 81_559.0)
    );
    // The other kept rules reserve nothing for prefill graphs.
    for rules in [
        super::version::Rules::Sglang0_5_9,
        super::version::Rules::Sglang0_5_23,
    ] {
        assert_eq!(at("", rules, &qwen), 0.835);
    }
}

/// SGLang 0.5.14 at TP1 loads 0.06–0.07 GiB besides the checkpoint (the
/// corpus: Qwen3-4B 7.56 GiB logged, Llama-3.1-8B 15.02), not the 1 GiB
/// estimate measured at TP8, which TP > 1 and the other versions keep.
#[test]
fn sglang_0_5_14_load_overhead_at_tp1() {
    let qwen = load("qwen3-4b");
    let weights = |line: &str, rules: super::version::Rules| {
        let mut launch = parse(&format!(
            "python3 -m sglang.launch_server --model-path m {line}"
        ));
        launch.rules = rules;
        engine::weights_per_gpu(&launch, &qwen).expect("estimate") as f64 / GIB as f64
    };
    let v14 = super::version::Rules::Sglang0_5_14;
    assert!(
        (weights("", v14) - 7.56).abs() < 0.01,
        "{}",
        weights("", v14)
    );
    let v9 = weights("", super::version::Rules::Sglang0_5_9);
    assert!(
        (v9 - weights("", v14) - (1.0 - 1.0 / 16.0)).abs() < 1e-6,
        "{v9}"
    );
    let tp2 = weights("--tp 2", v14);
    assert!((tp2 - 7.4924 / 2.0 - 1.0).abs() < 0.001, "{tp2}");
}
