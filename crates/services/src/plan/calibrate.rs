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
pub(crate) const LOG_MAX: u64 = 4 << 20;

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
    /// vLLM: the settings the logged start's activation peak and CUDA-graph
    /// estimate followed (`LoggedRun`), for carrying its non-KV memory to
    /// the command's (`engine::vllm_carried_non_kv`).
    pub run: LoggedRun,
    pub engine: Option<Engine>,
}

/// vLLM: what a log says of the settings its non-KV memory depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LoggedRun {
    /// `Chunked prefill is enabled with max_num_batched_tokens=N`.
    pub batched_tokens: Option<u64>,
    /// The front end's `non-default args` were seen: what they lack
    /// (`max_num_seqs`, `enforce_eager`, `tensor_parallel_size`) was the
    /// default.
    pub args: bool,
    pub max_num_seqs: Option<u64>,
    pub enforce_eager: bool,
    pub tp: Option<u64>,
    /// The V1 runner's CUDA-graph estimate as its utilization: `U − E` of
    /// `The current --gpu-memory-utilization=U is equivalent to
    /// --gpu-memory-utilization=E without CUDA graph memory profiling`
    /// (`gpu_worker.py` `determine_available_memory`, rounded to 4 places).
    pub graph_utilization: Option<f64>,
}

impl LoggedRun {
    /// The TP the logged start ran at: its `tensor_parallel_size`, 1 when
    /// its `non-default args` lack one, else (no such line) `command`'s.
    pub(crate) fn tp_or(&self, command: u64) -> u64 {
        match (self.args, self.tp) {
            (true, tp) => tp.unwrap_or(1).max(1),
            (false, _) => command,
        }
    }
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
    pub(crate) fn vllm_non_kv(&self, gpu_total: u64, utilization: f64) -> Option<u64> {
        let kv = self.kv_bytes?;
        let requested = self
            .requested
            .unwrap_or_else(|| requested_at(gpu_total, self.utilization.unwrap_or(utilization)));
        Some(requested.saturating_sub(kv))
    }

    fn complete(&self) -> bool {
        self.tokens.is_some()
    }
}

/// The line just read is `engine`'s; `both` when the start has seen the
/// other engine's lines too (two servers' logs in one file).
fn saw(current: &mut Start, engine: Engine) {
    if current.logged.engine.is_some_and(|seen| seen != engine) {
        current.both = true;
    }
    current.logged.engine = Some(engine);
}

/// The largest size a log's figure may have: no GPU holds 4 TiB.
const MAX_LOGGED_GIB: f64 = 4096.0;
/// The largest token count a log's figure may have (as a context, 2^40).
const MAX_LOGGED_TOKENS: f64 = (1u64 << 40) as f64;
/// How far two figures the engine logged with two decimals of GiB may be
/// off from each other by that rounding alone.
const ROUNDING: u64 = 1 << 25;

/// What is checked against the figures of a log: the GPU the plan is
/// for, and the command's utilization (vLLM), for a log that does not
/// say what its start requested.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Against {
    pub gpu_total: u64,
    pub utilization: f64,
}

/// `read_log_file` for a plan of `engine`: a log of the other engine, or
/// one start holding the lines of both, is refused rather than read as
/// this engine's figures, and so is a figure no start could have logged
/// (negative, beyond any GPU) or figures that contradict each other (a
/// KV cache larger than the memory its start requested or had free), each
/// naming its line.
pub(crate) fn read_log_for(
    path: &Path,
    engine: Engine,
    against: Against,
) -> Result<Logged, PlanError> {
    let (text, whole) = read_tail(path)?;
    let start = read_starts(&text);
    let logged = start.logged;
    let name = |engine: Engine| match engine {
        Engine::Sglang => "SGLang",
        Engine::Vllm => "vLLM",
    };
    let why = if start.both {
        "one start in it holds the lines of both SGLang and vLLM: give the log of one server's start"
            .to_string()
    } else if let Some(logged_engine) = logged.engine.filter(|logged| *logged != engine) {
        format!(
            "a {} log, and the command starts {}: give the log of a start of this command",
            name(logged_engine),
            name(engine)
        )
    } else {
        let problem = start
            .problem
            .clone()
            .or_else(|| contradiction(&start, engine, against));
        let Some((at, why)) = problem else {
            return Ok(logged);
        };
        return Err(PlanError::BadLog {
            path: path.to_path_buf(),
            line: if whole {
                format!("line {}", at + 1)
            } else {
                format!("line {} of its last 4 MiB", at + 1)
            },
            text: text.lines().nth(at).map(strip_ansi).unwrap_or_default(),
            why,
        });
    };
    Err(PlanError::Unreadable {
        path: path.to_path_buf(),
        why,
    })
}

/// Figures of one start that no engine logs together: the line to name
/// and why.
fn contradiction(start: &Start, engine: Engine, against: Against) -> Option<(usize, String)> {
    let logged = &start.logged;
    let lines = &start.lines;
    let gib = |bytes: u64| format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64);
    match engine {
        Engine::Sglang => {
            let free = logged.free_before_load?;
            if let (Some(weights), Some(at)) = (logged.weights_per_gpu, lines.weights)
                && weights > free.saturating_add(ROUNDING)
            {
                return Some((
                    at,
                    format!(
                        "its mem usage {} is more than the {} free before the load: not one start's figures",
                        gib(weights),
                        gib(free)
                    ),
                ));
            }
            let left = free.saturating_sub(logged.weights_per_gpu.unwrap_or(0));
            match (logged.kv_bytes, lines.kv) {
                (Some(kv), Some(at)) if kv > left.saturating_add(ROUNDING) => Some((
                    at,
                    format!(
                        "a KV cache of {} is more than the {} left after the weights: not one start's figures",
                        gib(kv),
                        gib(left)
                    ),
                )),
                _ => None,
            }
        }
        Engine::Vllm => {
            let (kv, at) = logged.kv_bytes.zip(lines.kv)?;
            let (requested, of) = match logged.requested {
                Some(requested) => (requested, "the memory its start requested".to_string()),
                None => {
                    let utilization = logged.utilization.unwrap_or(against.utilization);
                    (
                        requested_at(against.gpu_total, utilization),
                        format!(
                            "what a start at utilization {utilization} may take of this GPU ({})",
                            gib(against.gpu_total)
                        ),
                    )
                }
            };
            let with_weights = kv.saturating_add(logged.weights_per_gpu.unwrap_or(0));
            (with_weights > requested.saturating_add(ROUNDING)).then(|| {
                (
                    at,
                    format!(
                        "{} of KV cache{} is more than {of}, {}: a log of another GPU, or altered (give the log of a start on this GPU)",
                        gib(kv),
                        match logged.weights_per_gpu {
                            Some(weights) => format!(" beside {} of weights", gib(weights)),
                            None => String::new(),
                        },
                        gib(requested)
                    ),
                )
            })
        }
    }
}

/// vLLM's `request_memory`: `ceil(utilization × total)`.
fn requested_at(gpu_total: u64, utilization: f64) -> u64 {
    (gpu_total as f64 * utilization).ceil() as u64
}

/// Reads the last `LOG_MAX` bytes of a log file (a regular file, opened
/// without waiting).
#[cfg(test)]
pub(crate) fn read_log_file(path: &Path) -> Result<Logged, PlanError> {
    Ok(read_log(&read_tail(path)?.0))
}

/// The last `LOG_MAX` bytes of a log file, from its first whole line, and
/// whether that is the whole file.
fn read_tail(path: &Path) -> Result<(String, bool), PlanError> {
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
    Ok((text.to_string(), start == 0))
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

/// vLLM's V1-runner line on its CUDA-graph estimate, before `E`.
const EQUIVALENT: &str = "is equivalent to --gpu-memory-utilization=";

/// Reads the lines ENGINES.md §1.3 / §2 name, both engines.
pub fn read_log(text: &str) -> Logged {
    read_starts(text).logged
}

/// One start of the engine as a log holds it: its figures, whether it
/// holds both engines' lines, the line each figure was read from, and the
/// first figure no start could have logged.
#[derive(Debug, Clone, Default)]
struct Start {
    logged: Logged,
    both: bool,
    lines: Lines,
    /// The line (its index in the text read) and why.
    problem: Option<(usize, String)>,
}

/// The index of the line each figure of a start was read from (the one
/// that gave the figure kept, over the ranks).
#[derive(Debug, Clone, Copy, Default)]
struct Lines {
    weights: Option<usize>,
    kv: Option<usize>,
}

/// The start `read_log` gives: the last complete one, else the last.
fn read_starts(text: &str) -> Start {
    let mut starts: Vec<Start> = Vec::new();
    let mut current = Start::default();
    // The (rank, event) pairs seen in this start: the same rank beginning
    // or ending its load again is a new start, as is any load after the
    // token count.
    let mut seen: Vec<(String, bool)> = Vec::new();
    for (at, raw) in text.lines().enumerate() {
        let line = strip_ansi(raw);
        let rank = rank_of(&line);
        let sglang_load = line.contains("Load weight end.");
        let vllm_load = line.contains("Model loading took");
        let begin = line.contains("Load weight begin.");
        // vLLM's front end says its arguments before its engine loads: after
        // a complete start, that is the next one.
        if line.contains("non-default args:") && current.logged.complete() {
            starts.push(std::mem::take(&mut current));
            seen.clear();
        }
        if begin || sglang_load || vllm_load {
            let event = (rank.clone(), begin);
            if current.logged.complete() || seen.contains(&event) {
                starts.push(std::mem::take(&mut current));
                seen.clear();
            }
            seen.push(event);
        }
        let mut line_read = Line {
            text: &line,
            at,
            start: &mut current,
        };
        line_read.figures(sglang_load, vllm_load);
    }
    starts.push(current);
    let last = starts.len() - 1;
    let complete = starts.iter().rposition(|start| start.logged.complete());
    starts.swap_remove(complete.unwrap_or(last))
}

/// One line of a log, read into its start.
struct Line<'a> {
    text: &'a str,
    at: usize,
    start: &'a mut Start,
}

impl Line<'_> {
    /// The number after `key`, when it is one a start could log: a size
    /// (GiB) from 0 to `MAX_LOGGED_GIB`, or a count from 0 to
    /// `MAX_LOGGED_TOKENS`; anything else is the start's problem.
    fn figure(&mut self, key: &str, what: &str, largest: f64) -> Option<f64> {
        let value = number_after(self.text, key)?;
        if (0.0..=largest).contains(&value) {
            return Some(value);
        }
        if self.start.problem.is_none() {
            self.start.problem = Some((
                self.at,
                format!("{what} {value} is not one a start logs (from 0 to {largest})"),
            ));
        }
        None
    }

    fn size(&mut self, key: &str, what: &str) -> Option<u64> {
        self.figure(key, what, MAX_LOGGED_GIB).map(gib)
    }

    fn tokens(&mut self, key: &str) -> Option<u64> {
        self.figure(key, "a token count", MAX_LOGGED_TOKENS)
            .map(|tokens| tokens as u64)
    }

    /// vLLM's lines on the settings a start ran with (`LoggedRun`), and
    /// the utilization of its `non-default args`; whether the line was one.
    fn vllm_run(&mut self, line: &str) -> bool {
        if line.contains("non-default args:") {
            if let Some(utilization) =
                self.figure("'gpu_memory_utilization':", "a utilization", 1.0)
            {
                self.start.logged.utilization = Some(utilization);
            }
            let seqs = self.tokens("'max_num_seqs':");
            let tp = self.tokens("'tensor_parallel_size':");
            let run = &mut self.start.logged.run;
            run.args = true;
            run.max_num_seqs = seqs;
            run.tp = tp;
            run.enforce_eager = line.contains("'enforce_eager': True");
        } else if line.contains("Chunked prefill is enabled with max_num_batched_tokens=") {
            self.start.logged.run.batched_tokens = self.tokens("max_num_batched_tokens=");
        } else if let Some(at) = line.find(EQUIVALENT) {
            saw(self.start, Engine::Vllm);
            let current = number_after(line, "The current --gpu-memory-utilization=");
            let equivalent = number_after(&line[at..], EQUIVALENT);
            if let (Some(current), Some(equivalent)) = (current, equivalent)
                && (0.0..=current).contains(&equivalent)
                && current <= 1.0
            {
                self.start.logged.run.graph_utilization = Some(current - equivalent);
            }
        } else {
            return false;
        }
        true
    }

    /// The figures this line gives, into its start's record.
    fn figures(&mut self, sglang_load: bool, vllm_load: bool) {
        let line = self.text;
        if line.contains("Load weight begin.") {
            saw(self.start, Engine::Sglang);
            if let Some(free) = self.size("avail mem=", "avail mem") {
                let logged = &mut self.start.logged;
                logged.free_before_load =
                    Some(logged.free_before_load.map_or(free, |f| f.min(free)));
            }
        } else if sglang_load {
            saw(self.start, Engine::Sglang);
            let usage = self.size("mem usage=", "mem usage");
            let avail = self.size("avail mem=", "avail mem");
            let logged = &mut self.start.logged;
            if let Some(usage) = usage
                && logged.weights_per_gpu.is_none_or(|weights| usage > weights)
            {
                logged.weights_per_gpu = Some(usage);
                self.start.lines.weights = Some(self.at);
            }
            let logged = &mut self.start.logged;
            if let (Some(usage), Some(avail), None) = (usage, avail, logged.free_before_load) {
                logged.free_before_load = Some(usage.saturating_add(avail));
            }
        } else if vllm_load {
            saw(self.start, Engine::Vllm);
            if let Some(weights) = self.size("Model loading took", "the weights")
                && self
                    .start
                    .logged
                    .weights_per_gpu
                    .is_none_or(|known| weights > known)
            {
                self.start.logged.weights_per_gpu = Some(weights);
                self.start.lines.weights = Some(self.at);
            }
        } else if line.contains("KV Cache is allocated.") {
            saw(self.start, Engine::Sglang);
            if let Some(tokens) = self.tokens("#tokens:") {
                self.start.logged.tokens = Some(tokens);
            }
            let kv = match number_after(line, "KV size:") {
                Some(_) => self.size("KV size:", "KV size"),
                None => self
                    .size("K size:", "K size")
                    .zip(self.size("V size:", "V size"))
                    .map(|(k, v)| k.saturating_add(v)),
            };
            if let Some(kv) = kv {
                self.start.logged.kv_bytes = Some(kv);
                self.start.lines.kv = Some(self.at);
            }
        } else if line.contains("max_total_num_tokens=") {
            saw(self.start, Engine::Sglang);
            if let Some(tokens) = self.tokens("max_total_num_tokens=") {
                self.start.logged.tokens = Some(tokens);
            }
        } else if line.contains("Available KV cache memory:") {
            saw(self.start, Engine::Vllm);
            if let Some(kv) = self.size("Available KV cache memory:", "the KV cache memory")
                && self.start.logged.kv_bytes.is_none_or(|known| kv < known)
            {
                self.start.logged.kv_bytes = Some(kv);
                self.start.lines.kv = Some(self.at);
            }
        } else if line.contains("GPU KV cache size:") {
            saw(self.start, Engine::Vllm);
            if let Some(tokens) = self.tokens("GPU KV cache size:") {
                self.start.logged.tokens = Some(tokens);
            }
        } else if self.vllm_run(line) {
            // The settings the start ran with: `vllm_run`.
        } else if let Some(at) = line.find(DESIRED) {
            // `(0.5, 69.9 GiB)`: the utilization, then the requested GiB.
            saw(self.start, Engine::Vllm);
            let rest = &line[at + DESIRED.len()..];
            if let Some(requested) = number_after(rest, ",") {
                if (0.0..=MAX_LOGGED_GIB).contains(&requested) {
                    let requested = gib(requested);
                    let logged = &mut self.start.logged;
                    logged.requested =
                        Some(logged.requested.map_or(requested, |r| r.max(requested)));
                } else if self.start.problem.is_none() {
                    self.start.problem = Some((
                        self.at,
                        format!(
                            "a requested memory of {requested} GiB is not one a start logs (from 0 to {MAX_LOGGED_GIB})"
                        ),
                    ));
                }
            }
        }
    }
}
