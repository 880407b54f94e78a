//! What the plan tests give `gpureap plan` and `run --plan`: model
//! directories (a config.json, at times a checkpoint index) and the
//! engines' launch commands for them, as SGLang and vLLM are started.

use std::path::{Path, PathBuf};

/// Llama-3.1-8B's config.json: GQA, 8 KV heads of 128.
pub(crate) const LLAMA_8B: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 4096,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "head_dim": 128,
  "num_hidden_layers": 32,
  "max_position_embeddings": 131072,
  "torch_dtype": "bfloat16"
}"#;

/// A checkpoint index naming Llama-3.1-8B's 16 GB of weights.
pub const LLAMA_8B_INDEX: &str = r#"{"metadata": {"total_size": 16060522496}, "weight_map": {}}"#;

/// A directory named after `name`, removed when the test ends.
pub fn dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("gpureap-plan-{name}-"))
        .tempdir()
        .expect("temp dir")
}

/// A model directory holding `config` as its config.json, removed when
/// the test ends.
pub fn model(name: &str, config: &str) -> tempfile::TempDir {
    let dir = dir(name);
    std::fs::write(dir.path().join("config.json"), config).expect("config.json");
    dir
}

/// tests/fixtures/models/NAME: a model's published config.json.
pub fn published(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/models")
        .join(name)
}

/// `DIR/llama-8b`, a Llama-3.1-8B-shaped model with its checkpoint index
/// (16 GB of weights), where whatever reads `dir` reads it.
pub fn llama_8b_in(dir: &Path) -> PathBuf {
    let model = dir.join("llama-8b");
    std::fs::create_dir_all(&model).expect("model dir");
    std::fs::write(model.join("config.json"), LLAMA_8B).expect("config.json");
    std::fs::write(model.join("model.safetensors.index.json"), LLAMA_8B_INDEX).expect("index");
    model
}

/// `python3 -m sglang.launch_server --model-path MODEL FLAGS`.
pub fn sglang(model: impl AsRef<Path>, flags: &[&str]) -> Vec<String> {
    sglang_by("python3", model, flags)
}

/// `PYTHON -m sglang.launch_server --model-path MODEL FLAGS`.
pub fn sglang_by(python: &str, model: impl AsRef<Path>, flags: &[&str]) -> Vec<String> {
    launch(
        &[python, "-m", "sglang.launch_server", "--model-path"],
        model,
        flags,
    )
}

/// `PYTHON -m vllm.entrypoints.openai.api_server --model MODEL FLAGS`.
pub fn vllm_by(python: &str, model: impl AsRef<Path>, flags: &[&str]) -> Vec<String> {
    launch(
        &[
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
        ],
        model,
        flags,
    )
}

/// `vllm serve MODEL FLAGS`.
pub fn vllm(model: impl AsRef<Path>, flags: &[&str]) -> Vec<String> {
    launch(&["vllm", "serve"], model, flags)
}

/// The launch command for `model` that `line` names: `sglang FLAGS` or
/// `vllm FLAGS`, its words split at white space.
pub fn serve(model: impl AsRef<Path>, line: &str) -> Vec<String> {
    let mut words = line.split_whitespace();
    let engine = words.next();
    let flags: Vec<&str> = words.collect();
    match engine {
        Some("sglang") => sglang(model, &flags),
        Some("vllm") => vllm(model, &flags),
        _ => panic!("{line:?} names no engine (sglang or vllm)"),
    }
}

fn launch(program: &[&str], model: impl AsRef<Path>, flags: &[&str]) -> Vec<String> {
    let mut command: Vec<String> = program.iter().map(|word| word.to_string()).collect();
    command.push(model.as_ref().display().to_string());
    command.extend(flags.iter().map(|flag| flag.to_string()));
    command
}

/// `command` in at most 512 MiB of address space: a reader that takes
/// more than its input's size fails here (it cannot allocate), not the
/// machine.
pub fn within_512_mib(command: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 512 << 20,
                rlim_max: 512 << 20,
            };
            libc::setrlimit(libc::RLIMIT_AS, &limit);
            Ok(())
        })
    }
}
