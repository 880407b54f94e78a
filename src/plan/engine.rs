//! The engines' own KV-cache arithmetic, pure.

use super::launch::{Engine, Launch};
use super::model::{Attention, Model};

const GIB: f64 = (1u64 << 30) as f64;

/// Per GPU, bytes; every step can be overridden by a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Budget {
    /// Device total (the smallest of the engine's GPUs).
    pub gpu_total: u64,
    /// MIN over the engine's GPUs of free memory before load.
    pub free_at_start: u64,
    /// W': everything allocated between the two measurements.
    pub weights_per_gpu: u64,
    /// `--kv-memory`: skip the budget rule.
    pub kv_memory: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Start {
    Starts,
    /// SGLang: "Not enough memory", with the fraction that would be needed.
    NotEnoughMemory {
        raise_fraction_to: Option<f64>,
    },
    /// vLLM: free memory at start is less than utilization × total.
    RefusesFree {
        needed: u64,
        free: u64,
    },
    WeightsTooLarge,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Device {
    pub bytes_per_token: u64,
    pub kv_bytes_per_rank: u64,
    pub tokens_per_rank: u64,
    /// Ranks that each hold their own pool of distinct requests (DP attention).
    pub ranks: u32,
    pub page_size: u32,
    /// Effective, the engine's default when the flag is absent.
    pub mem_fraction: f64,
    pub max_running_requests: u64,
    pub concurrency: Option<f64>,
    pub start: Start,
}

/// Weights per GPU once loaded (estimate).
pub fn weights_per_gpu(launch: &Launch, model: &Model) -> Option<u64> {
    model
        .weights_bytes
        .map(|total| total / u64::from(launch.tp.max(1) * launch.pp.max(1)))
}

/// Bytes per token per GPU.
pub fn bytes_per_token(launch: &Launch, model: &Model) -> u64 {
    let kv = launch.kv_dtype.bytes().unwrap_or(model.dtype_bytes);
    match model.attention {
        Attention::Mla {
            kv_lora_rank,
            qk_rope_head_dim,
        } => (kv_lora_rank + qk_rope_head_dim) * model.layers * kv,
        Attention::Mha {
            kv_heads,
            head_dim,
            v_head_dim,
        } => {
            (kv_heads / u64::from(launch.tp.max(1))).max(1)
                * (head_dim + v_head_dim)
                * model.layers
                * kv
        }
    }
}

pub fn device(
    launch: &Launch,
    model: &Model,
    budget: &Budget,
    averages: Option<(u64, u64)>,
) -> Device {
    let bytes_per_token = bytes_per_token(launch, model);
    let fraction = launch.mem_fraction.unwrap_or(match launch.engine {
        Engine::Sglang => 0.85,
        Engine::Vllm => 0.9,
    });
    let kv = budget.kv_memory.unwrap_or_else(|| {
        let rest =
            fraction * budget.free_at_start as f64 / GIB - budget.weights_per_gpu as f64 / GIB;
        (rest.max(0.0) * GIB) as u64
    });
    let tokens = kv / bytes_per_token.max(1);
    let max_running_requests = launch.max_running_requests.unwrap_or(2048);
    Device {
        bytes_per_token,
        kv_bytes_per_rank: kv,
        tokens_per_rank: tokens,
        ranks: 1,
        page_size: launch.page_size.unwrap_or(1),
        mem_fraction: fraction,
        max_running_requests,
        concurrency: averages.map(|(prompt, output)| {
            (tokens as f64 / (prompt + output).max(1) as f64).min(max_running_requests as f64)
        }),
        start: if tokens == 0 {
            Start::NotEnoughMemory {
                raise_fraction_to: None,
            }
        } else {
            Start::Starts
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct HostTier {
    pub tokens_per_rank: u64,
    pub bytes_per_rank: u64,
    pub bytes_total: u64,
    /// MemAvailable − 10 GiB (SGLang's guard).
    pub budget: u64,
    pub fits: bool,
}

pub fn host_tier(
    launch: &Launch,
    model: &Model,
    device: &Device,
    host_available: u64,
) -> Option<HostTier> {
    let _ = model;
    let request = launch.host_tier?;
    let per_token = device.bytes_per_token.max(1);
    let tokens_per_rank = match request {
        super::launch::HostTierRequest::SglangRatio(ratio) => {
            (device.tokens_per_rank as f64 * ratio) as u64
        }
        super::launch::HostTierRequest::SglangSizeGb(gb) => gb * 1_000_000_000 / per_token,
        super::launch::HostTierRequest::VllmOffloadGib(gib) => (gib * GIB) as u64 / per_token,
    };
    let bytes_per_rank = tokens_per_rank * per_token;
    let bytes_total = bytes_per_rank * u64::from(launch.tp);
    let budget = host_available.saturating_sub(10 << 30);
    Some(HostTier {
        tokens_per_rank,
        bytes_per_rank,
        bytes_total,
        budget,
        fits: bytes_total <= budget,
    })
}
