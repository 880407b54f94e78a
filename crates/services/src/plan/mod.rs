//! `gpureap plan`: will an inference server start on these GPUs, and what
//! will it hold? The core reads the engine's command line (`launch`), the
//! model's `config.json` (`model`), applies the engine's own KV-cache
//! arithmetic (`engine`) and reads a previous start's log (`calibrate`).
//! Everything here is pure or reads bounded files: no GPU work, no network.

pub mod calibrate;
pub mod engine;
pub mod fit;
pub mod launch;
pub mod levers;
pub mod model;
pub mod render;
pub mod version;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_sparse;
#[cfg(test)]
mod tests_swa;

use std::path::PathBuf;

/// Every plan error is bad input (exit 2): one line naming what is missing.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(
        "unknown engine command {}: expected sglang (python3 -m sglang.launch_server, sglang serve) or vllm (vllm serve, python3 -m vllm.entrypoints.openai.api_server)"
,
        quoted(.0)
    )]
    UnknownEngine(String),
    #[error("the engine command names no model (--model-path / --model / vllm serve MODEL)")]
    NoModel,
    #[error("model {} not found: looked for config.json in {}", quoted(.model), display_paths(.looked))]
    ModelNotFound { model: String, looked: Vec<PathBuf> },
    #[error(
        "unknown architecture {}",
        crate::units::short(.0, 200)
    )]
    UnknownArchitecture(String),
    /// An architecture the engine at this version does not serve, or
    /// serves with rules plan does not model.
    #[error("{architecture} on {engine}: {why}")]
    NotServed {
        architecture: String,
        /// The engine and the version whose rules apply (`SGLang 0.5.9`).
        engine: String,
        why: &'static str,
    },
    #[error(
        "{}: model dtype {} is not one gpureap plan reads (bfloat16, float16, float32)",
        .path.display(),
        quoted(.dtype)
    )]
    UnknownDtype { path: PathBuf, dtype: String },
    #[error("{}: the config has no \"{field}\"", .path.display())]
    MissingField { path: PathBuf, field: &'static str },
    #[error(
        "{}: no model.safetensors.index.json, no *.safetensors and no vocab_size, hidden_size and MLP width in config.json to size the weights from; give --weights SIZE (per GPU, once loaded)",
        .dir.display()
    )]
    NoWeights { dir: PathBuf },
    #[error("{flag} {}: {why}", quoted(.value))]
    BadValue {
        flag: String,
        value: String,
        why: String,
    },
    #[error("{}: {why}", .path.display())]
    Unreadable { path: PathBuf, why: String },
    /// A log's figure no start could have logged, or figures of one start
    /// that contradict each other.
    #[error("{}: {line} ({}): {why}", .path.display(), quoted(.text))]
    BadLog {
        path: PathBuf,
        /// `line 12`, or `line 12 of its last 4 MiB`.
        line: String,
        text: String,
        why: String,
    },
}

/// Anyone's text in an error, quoted and written out by the one rule
/// (`units::one_line`), cut to 200 characters: a 100 KB argument is not
/// echoed whole.
fn quoted(text: &str) -> String {
    const WIDTH: usize = 200;
    match text.char_indices().nth(WIDTH) {
        Some((cut, _)) => format!("\"{}\"…", crate::units::one_line(&text[..cut])),
        None => format!("\"{}\"", crate::units::one_line(text)),
    }
}

fn display_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "nowhere (no local directory, no Hugging Face cache)".to_string();
    }
    paths
        .iter()
        .map(|path| crate::units::short(&path.display().to_string(), 200))
        .collect::<Vec<_>>()
        .join(", ")
}
