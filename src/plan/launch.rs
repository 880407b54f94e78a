//! The user's own engine command line (what follows `--`), read the way the
//! engine would read it.

use super::PlanError;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Sglang,
    Vllm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvDtype {
    /// The model's dtype, or FP8 when the quant config quantizes the KV cache.
    Auto,
    Bf16,
    Fp16,
    Fp8E4m3,
    Fp8E5m2,
    Fp4E2m1,
}

impl KvDtype {
    /// Bytes per element; `None` for `Auto` (the model decides). FP4 is
    /// counted as one byte per element here; SGLang packs two per byte and
    /// adds scales (engine.rs handles it).
    pub fn bytes(self) -> Option<u64> {
        match self {
            KvDtype::Auto => None,
            KvDtype::Bf16 | KvDtype::Fp16 => Some(2),
            KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 | KvDtype::Fp4E2m1 => Some(1),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostTierRequest {
    /// SGLang `--hicache-ratio` (host pool = ratio × device pool, per rank).
    SglangRatio(f64),
    /// SGLang `--hicache-size` (decimal GB, per rank).
    SglangSizeGb(u64),
    /// vLLM `--kv-offloading-size` (GiB, total over the TP ranks).
    VllmOffloadGib(f64),
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Launch {
    pub engine: Engine,
    pub model: String,
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub dp_attention: bool,
    /// SGLang `--mem-fraction-static` / vLLM `--gpu-memory-utilization`.
    pub mem_fraction: Option<f64>,
    pub kv_dtype: KvDtype,
    pub page_size: Option<u32>,
    pub attention_backend: Option<String>,
    pub max_total_tokens: Option<u64>,
    pub context_length: Option<u64>,
    pub max_running_requests: Option<u64>,
    pub kv_cache_memory_bytes: Option<u64>,
    pub chunked_prefill_size: Option<u64>,
    pub cuda_graph_max_bs: Option<u64>,
    pub host_tier: Option<HostTierRequest>,
    /// The physical GPU indices the engine will use.
    pub gpus: Vec<u32>,
    /// Flags not understood (listed in the output).
    pub ignored: Vec<String>,
}

/// Reads an engine command line with its environment.
pub fn parse(argv: &[String], env: &BTreeMap<String, String>) -> Result<Launch, PlanError> {
    let _ = env;
    let engine = match argv.iter().any(|arg| arg.contains("vllm")) {
        true => Engine::Vllm,
        false if argv.iter().any(|arg| arg.contains("sglang")) => Engine::Sglang,
        false => return Err(PlanError::UnknownEngine(argv.join(" "))),
    };
    let mut model = None;
    let mut tp = 1;
    let mut ignored = Vec::new();
    let mut args = argv.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--model-path" | "--model" => model = args.next().cloned(),
            "--tp" | "--tp-size" | "--tensor-parallel-size" | "-tp" => {
                let value = args.next().cloned().unwrap_or_default();
                tp = value.parse().map_err(|_| PlanError::BadValue {
                    flag: arg.clone(),
                    value,
                    why: "not a whole number".to_string(),
                })?;
            }
            other if other.starts_with('-') => ignored.push(other.to_string()),
            _ => {}
        }
    }
    let model = model.ok_or(PlanError::NoModel)?;
    Ok(Launch {
        engine,
        model,
        tp,
        pp: 1,
        dp: 1,
        dp_attention: false,
        mem_fraction: None,
        kv_dtype: KvDtype::Auto,
        page_size: None,
        attention_backend: None,
        max_total_tokens: None,
        context_length: None,
        max_running_requests: None,
        kv_cache_memory_bytes: None,
        chunked_prefill_size: None,
        cuda_graph_max_bs: None,
        host_tier: None,
        gpus: (0..tp).collect(),
        ignored,
    })
}
