//! `--from-log`: the figures a previous start of the engine logged, used
//! instead of the estimates.
//!
//! Lines read (SGLang 0.5.9, vLLM 0.26.0; both print sizes in GiB, SGLang
//! calling them "GB": `get_available_gpu_memory` divides by 2^30, and
//! `memory_pool.py` has `GB = 1024**3`):
//! - SGLang `Load weight begin. avail mem=X GB` (free before load, per
//!   rank), `Load weight end. … avail mem=X GB, mem usage=Y GB.` (W'),
//!   `KV Cache is allocated. #tokens: N, KV size: X GB` (or `K size: X GB,
//!   V size: Y GB`), `max_total_num_tokens=N, …` (the scheduler's line).
//! - vLLM `Model loading took X GiB memory and Y seconds` (or `took X GiB
//!   and`), `Available KV cache memory: X GiB`, `GPU KV cache size: N
//!   tokens` (with thousands separators), 0.26.0's `Desired GPU memory
//!   utilization is (U, X GiB)` (the memory it requested), and the
//!   front end's `non-default args: {… 'gpu_memory_utilization': U …}`.
//!
//! vLLM's `Available KV cache memory` is its whole budget rule's answer at
//! the utilization it was started with; what a log fixes is the rest of
//! the requested memory (weights, activation peak, non-torch memory, CUDA
//! graphs): `Logged::vllm_non_kv`.
//!
//! ANSI colours and `[TP0]`-style prefixes are ignored. Over several
//! ranks, W' is the largest and the free memory the smallest (the engines
//! take the MIN of what is left). A file with several starts gives the last
//! complete one (one that logged its token count), else the last start.

use super::PlanError;
use super::engine::Budget;
use super::launch::Engine;
use std::path::Path;

/// At most this much of a log is read: its last 4 MiB.
pub const LOG_MAX: u64 = 4 << 20;

#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Logged {
    /// SGLang: `mem usage` of `Load weight end` (W'); vLLM: `Model loading
    /// took` (the weights). Bytes; the largest over ranks.
    pub weights_per_gpu: Option<u64>,
    /// SGLang: `avail mem` of `Load weight begin` (or end's avail + usage);
    /// the smallest over ranks.
    pub free_before_load: Option<u64>,
    /// SGLang `#tokens` / `max_total_num_tokens`; vLLM `GPU KV cache size`.
    pub tokens: Option<u64>,
    /// SGLang: the pool allocated (K + V or KV size); vLLM: `Available KV
    /// cache memory` (the budget); the smallest over ranks.
    pub kv_bytes: Option<u64>,
    /// vLLM: the memory it requested, `ceil(utilization × total)` (`Desired
    /// GPU memory utilization is (U, X GiB)`); the largest over ranks.
    pub requested: Option<u64>,
    /// vLLM: the utilization it was started with (`non-default args: {…
    /// 'gpu_memory_utilization': U …}`), for logs that do not state what
    /// it requested.
    pub utilization: Option<f64>,
    pub engine: Option<Engine>,
}

impl Logged {
    /// Puts what was measured in place of the estimates: W' and the free
    /// memory at start for SGLang; for vLLM its weights and what its
    /// requested memory held besides the KV cache (`vllm_non_kv`, with
    /// `utilization` where the log does not say), so that the KV cache
    /// still follows the utilization.
    pub fn calibrate(&self, engine: Engine, utilization: f64, budget: &mut Budget) {
        if let Some(weights) = self.weights_per_gpu {
            budget.weights_per_gpu = weights;
        }
        match engine {
            Engine::Sglang => {
                if let Some(free) = self.free_before_load {
                    budget.free_at_start = free;
                }
            }
            Engine::Vllm => {
                budget.non_kv = self
                    .vllm_non_kv(budget.gpu_total, utilization)
                    .or(budget.non_kv);
            }
        }
    }

    /// vLLM: what the logged start's requested memory held besides its KV
    /// cache (weights, activation peak, non-torch memory, CUDA graphs):
    /// the requested memory less `Available KV cache memory`. The
    /// requested memory is the logged one, else `ceil(utilization ×
    /// gpu_total)` at the logged utilization, else at `utilization` (the
    /// log taken to be the command's). `None` without the KV figure.
    pub fn vllm_non_kv(&self, gpu_total: u64, utilization: f64) -> Option<u64> {
        let kv = self.kv_bytes?;
        let requested = self.requested.unwrap_or_else(|| {
            (gpu_total as f64 * self.utilization.unwrap_or(utilization)).ceil() as u64
        });
        Some(requested.saturating_sub(kv))
    }

    fn complete(&self) -> bool {
        self.tokens.is_some()
    }
}

/// The line just read is `engine`'s; `both` when the start has seen the
/// other engine's lines too (two servers' logs in one file).
fn saw(current: &mut Logged, both: &mut bool, engine: Engine) {
    if current.engine.is_some_and(|seen| seen != engine) {
        *both = true;
    }
    current.engine = Some(engine);
}

/// `read_log_file` for a plan of `engine`: a log of the other engine, or
/// one start holding the lines of both, is refused rather than read as
/// this engine's figures.
pub fn read_log_for(path: &Path, engine: Engine) -> Result<Logged, PlanError> {
    let (logged, both_engines) = read_starts(&read_tail(path)?);
    let name = |engine: Engine| match engine {
        Engine::Sglang => "SGLang",
        Engine::Vllm => "vLLM",
    };
    let why = if both_engines {
        "one start in it holds the lines of both SGLang and vLLM: give the log of one server's start"
            .to_string()
    } else if let Some(logged_engine) = logged.engine.filter(|logged| *logged != engine) {
        format!(
            "a {} log, and the command starts {}: give the log of a start of this command",
            name(logged_engine),
            name(engine)
        )
    } else {
        return Ok(logged);
    };
    Err(PlanError::Unreadable {
        path: path.to_path_buf(),
        why,
    })
}

/// Reads the last `LOG_MAX` bytes of a log file (a regular file, opened
/// without waiting).
pub fn read_log_file(path: &Path) -> Result<Logged, PlanError> {
    Ok(read_log(&read_tail(path)?))
}

/// The last `LOG_MAX` bytes of a log file, from its first whole line.
fn read_tail(path: &Path) -> Result<String, PlanError> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt as _;
    let unreadable = |why: String| PlanError::Unreadable {
        path: path.to_path_buf(),
        why,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|error| unreadable(error.to_string()))?;
    let metadata = file
        .metadata()
        .map_err(|error| unreadable(error.to_string()))?;
    if !metadata.is_file() {
        return Err(unreadable("not a regular file".to_string()));
    }
    let start = metadata.len().saturating_sub(LOG_MAX);
    file.seek(SeekFrom::Start(start))
        .map_err(|error| unreadable(error.to_string()))?;
    let mut bytes = Vec::new();
    file.take(LOG_MAX)
        .read_to_end(&mut bytes)
        .map_err(|error| unreadable(error.to_string()))?;
    let text = String::from_utf8_lossy(&bytes);
    // A tail starts mid-line: drop the partial first line.
    let text = match (start > 0, text.find('\n')) {
        (true, Some(newline)) => &text[newline + 1..],
        _ => &text[..],
    };
    Ok(text.to_string())
}

/// Text without ANSI escape sequences (`ESC [ … letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for next in chars.by_ref() {
                    if next.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The number right after `key` (digits, `.`, `,` as thousands separator).
fn number_after(line: &str, key: &str) -> Option<f64> {
    let at = line.find(key)? + key.len();
    let digits: String = line[at..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ',' || *c == '-')
        .filter(|c| *c != ',')
        .collect();
    digits.trim_end_matches('.').parse().ok()
}

fn gib(value: f64) -> u64 {
    (value.max(0.0) * (1u64 << 30) as f64).round() as u64
}

/// The rank a line is from: every `TP3`, `DP0`, `PP1`, `EP2`, `CP0` it
/// names that does not continue a longer word (`[TP0]`, `Worker_TP1`,
/// `DP1 TP3`); "" when it names none.
fn rank_of(line: &str) -> String {
    let bytes = line.as_bytes();
    let mut rank = String::new();
    for (at, _) in line.match_indices(['T', 'D', 'P', 'E', 'C']) {
        let prefix = bytes.get(at..at + 2);
        let is_name = matches!(prefix, Some(b"TP" | b"DP" | b"PP" | b"EP" | b"CP"));
        let starts_word = at == 0 || !bytes[at - 1].is_ascii_alphanumeric();
        // Bytes, not a str slice: the name may end the line, and what
        // follows it may be any character.
        let digits = bytes
            .get(at + 2..)
            .unwrap_or_default()
            .iter()
            .take_while(|byte| byte.is_ascii_digit())
            .count();
        let ends_word = bytes
            .get(at + 2 + digits)
            .is_none_or(|next| !next.is_ascii_alphanumeric());
        if is_name && starts_word && digits > 0 && ends_word {
            // ASCII from `at` to the end of the digits.
            rank.push_str(line.get(at..at + 2 + digits).unwrap_or_default());
            rank.push(' ');
        }
    }
    // Older vLLM workers: `(VllmWorker rank=1 pid=…)`.
    if let Some(at) = line.find("rank=") {
        let digits: String = line[at..]
            .chars()
            .skip(5)
            .take_while(char::is_ascii_digit)
            .collect();
        rank.push_str(&format!("rank{digits}"));
    }
    rank
}

/// vLLM 0.26.0 (`gpu_worker.py`), once the KV cache is allocated: `Free
/// memory on device (F/T GiB) on startup. Desired GPU memory utilization
/// is (U, X GiB). …`.
const DESIRED: &str = "Desired GPU memory utilization is (";

/// Reads the lines ENGINES.md §1.3 / §2 name, both engines.
pub fn read_log(text: &str) -> Logged {
    read_starts(text).0
}

/// `read_log`, and whether the start it gives holds both engines' lines.
fn read_starts(text: &str) -> (Logged, bool) {
    let mut starts: Vec<(Logged, bool)> = Vec::new();
    let mut current = Logged::default();
    let mut both = false;
    // The (rank, event) pairs seen in this start: the same rank beginning
    // or ending its load again is a new start, as is any load after the
    // token count.
    let mut seen: Vec<(String, bool)> = Vec::new();
    for raw in text.lines() {
        let line = strip_ansi(raw);
        let rank = rank_of(&line);
        let sglang_load = line.contains("Load weight end.");
        let vllm_load = line.contains("Model loading took");
        let begin = line.contains("Load weight begin.");
        // vLLM's front end says its arguments before its engine loads: after
        // a complete start, that is the next one.
        if line.contains("non-default args:") && current.complete() {
            starts.push((std::mem::take(&mut current), std::mem::take(&mut both)));
            seen.clear();
        }
        if begin || sglang_load || vllm_load {
            let event = (rank.clone(), begin);
            if current.complete() || seen.contains(&event) {
                starts.push((std::mem::take(&mut current), std::mem::take(&mut both)));
                seen.clear();
            }
            seen.push(event);
        }
        read_figures(&line, sglang_load, vllm_load, &mut current, &mut both);
    }
    starts.push((current, both));
    let last = starts.last().copied().unwrap_or_default();
    starts
        .into_iter()
        .rev()
        .find(|(logged, _)| logged.complete())
        .unwrap_or(last)
}

/// The figures one line of a start gives, into that start's record.
fn read_figures(
    line: &str,
    sglang_load: bool,
    vllm_load: bool,
    current: &mut Logged,
    both: &mut bool,
) {
    if line.contains("Load weight begin.") {
        saw(current, both, Engine::Sglang);
        if let Some(free) = number_after(line, "avail mem=") {
            let free = gib(free);
            current.free_before_load = Some(current.free_before_load.map_or(free, |f| f.min(free)));
        }
    } else if sglang_load {
        saw(current, both, Engine::Sglang);
        let usage = number_after(line, "mem usage=");
        let avail = number_after(line, "avail mem=");
        if let Some(usage) = usage {
            let usage = gib(usage);
            current.weights_per_gpu = Some(current.weights_per_gpu.map_or(usage, |w| w.max(usage)));
        }
        if let (Some(usage), Some(avail), None) = (usage, avail, current.free_before_load) {
            current.free_before_load = Some(gib(usage + avail));
        }
    } else if vllm_load {
        saw(current, both, Engine::Vllm);
        if let Some(weights) = number_after(line, "Model loading took") {
            let weights = gib(weights);
            current.weights_per_gpu =
                Some(current.weights_per_gpu.map_or(weights, |w| w.max(weights)));
        }
    } else if line.contains("KV Cache is allocated.") {
        saw(current, both, Engine::Sglang);
        current.tokens = number_after(line, "#tokens:")
            .map(|n| n as u64)
            .or(current.tokens);
        let kv = match number_after(line, "KV size:") {
            Some(size) => Some(size),
            None => number_after(line, "K size:")
                .zip(number_after(line, "V size:"))
                .map(|(k, v)| k + v),
        };
        if let Some(kv) = kv {
            current.kv_bytes = Some(gib(kv));
        }
    } else if line.contains("max_total_num_tokens=") {
        saw(current, both, Engine::Sglang);
        if let Some(tokens) = number_after(line, "max_total_num_tokens=") {
            current.tokens = Some(tokens as u64);
        }
    } else if line.contains("Available KV cache memory:") {
        saw(current, both, Engine::Vllm);
        if let Some(kv) = number_after(line, "Available KV cache memory:") {
            let kv = gib(kv);
            current.kv_bytes = Some(current.kv_bytes.map_or(kv, |k| k.min(kv)));
        }
    } else if line.contains("GPU KV cache size:") {
        saw(current, both, Engine::Vllm);
        if let Some(tokens) = number_after(line, "GPU KV cache size:") {
            current.tokens = Some(tokens as u64);
        }
    } else if line.contains("non-default args:") {
        if let Some(utilization) = number_after(line, "'gpu_memory_utilization':") {
            current.utilization = Some(utilization);
        }
    } else if let Some(at) = line.find(DESIRED) {
        // `(0.5, 69.9 GiB)`: the utilization, then the requested GiB.
        saw(current, both, Engine::Vllm);
        if let Some(requested) = number_after(&line[at + DESIRED.len()..], ",") {
            let requested = gib(requested);
            current.requested = Some(current.requested.map_or(requested, |r| r.max(requested)));
        }
    }
}
