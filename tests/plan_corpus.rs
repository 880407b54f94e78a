//! `gpureap plan` against every start of the corpus of real vLLM 0.26.0
//! starts (tests/fixtures/logs/corpus.json: one H100 80GB, dummy weights),
//! planned offline on the GPU state each start saw: a priori (the config
//! alone) within 1 % of the KV tokens and the concurrency vLLM logged; from
//! the start's own log within the rounding of its logged KV memory; a refused
//! start refused. The same for the corpus's real SGLang 0.5.14 starts
//! (its `sglang` section). docs/plan.md carries the same figures
//! (scripts/plan_accuracy.py).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The a-priori target of issue 43.
const TARGET_PCT: f64 = 1.0;

/// From its own log: the logged `Available KV cache memory` is rounded to
/// 0.01 GiB, up to 0.005 GiB off, 0.02 % of the smallest pool here.
const OWN_LOG_PCT: f64 = 0.05;

/// What a test expects of the corpus: the shape the gpu-corpus work writes.
const AS_WRITTEN: &str = "corpus.json as the gpu-corpus work writes it";

/// tests/fixtures/logs/corpus.json, and the folder of its logs.
fn corpus() -> (Value, PathBuf) {
    let logs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/logs");
    let text = std::fs::read_to_string(logs.join("corpus.json")).expect(AS_WRITTEN);
    (serde_json::from_str(&text).expect(AS_WRITTEN), logs)
}

/// The log of the start `case`.
fn log_of(logs: &Path, case: &Value) -> PathBuf {
    logs.join(text(&case["file"]))
}

fn number(value: &Value) -> f64 {
    value.as_f64().expect(AS_WRITTEN)
}

fn text(value: &Value) -> &str {
    value.as_str().expect(AS_WRITTEN)
}

fn plan(case: &Value, from_log: Option<&Path>) -> Value {
    let engine = &case["engine"];
    let gpu = &case["gpu"];
    let total = gpu["total_mib"].as_u64().expect(AS_WRITTEN)
        - gpu["reserved_mib"].as_u64().expect(AS_WRITTEN);
    // A refused start says what it saw free: "(37.06/79.18 GiB)".
    let free = match engine["free_at_start_gib"].as_f64() {
        Some(free) => free.to_string(),
        None => {
            let refusal = text(&engine["refusal"]);
            let open = refusal.find('(').expect(AS_WRITTEN) + 1;
            let slash = open + refusal[open..].find('/').expect(AS_WRITTEN);
            refusal[open..slash].to_string()
        }
    };
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpureap"));
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["plan", "--json", "--gpu-memory"])
        .arg(format!("{total}MiB"))
        .arg("--gpu-free")
        .arg(format!("{free}GiB"));
    if let Some(log) = from_log {
        command.arg("--from-log").arg(log);
    }
    run_plan(
        command,
        "vllm.entrypoints.openai.api_server",
        &case["vllm_args"],
    )
}

/// `gpureap plan --json` of an SGLang start of the corpus, offline, with
/// its version's rules, on a GPU of the total nvidia-smi showed, free at
/// `free_mib` (`None`: the clean GPU plan's own `--gpu-memory` box gives).
fn plan_sglang(case: &Value, free_mib: Option<u64>, from_log: Option<&Path>) -> Value {
    let total = case["gpu"]["total_mib"].as_u64().expect(AS_WRITTEN);
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpureap"));
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "plan",
            "--json",
            "--engine-version",
            "0.5.14",
            "--gpu-memory",
        ])
        .arg(format!("{total}MiB"));
    if let Some(free) = free_mib {
        command.arg("--gpu-free").arg(format!("{free}MiB"));
    }
    if let Some(log) = from_log {
        command.arg("--from-log").arg(log);
    }
    run_plan(command, "sglang.launch_server", &case["sglang_args"])
}

/// Runs `plan` (its own flags already on `command`) for `python3 -m MODULE`
/// with the start's arguments: a verdict's exit code (0, 1 or 4) and its JSON.
fn run_plan(mut command: Command, module: &str, args: &Value) -> Value {
    command.args(["--", "python3", "-m", module]);
    for arg in args.as_array().expect(AS_WRITTEN) {
        command.arg(text(arg));
    }
    let output = command.output().expect("run gpureap plan");
    assert!(
        matches!(output.status.code(), Some(0 | 1 | 4)),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("plan --json")
}

/// From its own log, SGLang: the log prints the free memory before load and
/// the weights to 0.01 GiB, and SGLang measures the free memory again after
/// loading (what it allocated between the two is in no line): +0.02 % to
/// +0.05 % here (the fp8 pool, twice the tokens a GiB, the most).
const OWN_LOG_SGLANG_PCT: f64 = 0.06;

/// Every real SGLang 0.5.14 start of the corpus, planned a priori on the
/// GPU the start saw (the clean box of its total; with the holder, that
/// free memory less the holder's, as plan prices a process it reads), and
/// from the start's own log: the default `--mem-fraction-static` and the
/// request cap as logged, the KV tokens within 1 % a priori and within the
/// log's rounding from it.
#[test]
fn every_sglang_start() {
    let (corpus, logs) = corpus();
    let cases = corpus["sglang"]["cases"].as_object().expect(AS_WRITTEN);
    assert!(cases.len() >= 5, "the corpus has its 5 SGLang starts");
    let mut failures = Vec::new();
    for (name, case) in cases {
        let engine = &case["engine"];
        let tokens = number(&engine["kv_tokens"]);
        let holder = case["holder_mib"].as_u64().expect(AS_WRITTEN);
        let free = (holder > 0).then(|| {
            let clean = plan_sglang(case, None, None);
            clean["budget"]["free_at_start"].as_u64().expect(AS_WRITTEN) / (1 << 20) - holder
        });
        let a_priori = plan_sglang(case, free, None);
        let device = &a_priori["device"];
        if a_priori["engine_version"]["rules"] != "0.5.14" {
            failures.push(format!("{name}: rules {}", a_priori["engine_version"]));
        }
        let fraction = number(&device["mem_fraction"]);
        let logged_fraction = number(&engine["mem_fraction_static"]);
        if (fraction - logged_fraction).abs() > 1e-9 {
            failures.push(format!(
                "{name}: mem fraction {fraction} against the logged {logged_fraction}"
            ));
        }
        if device["max_running_requests"] != engine["max_running_requests"] {
            failures.push(format!(
                "{name}: {} running requests against the logged {}",
                device["max_running_requests"], engine["max_running_requests"]
            ));
        }
        let planned = number(&device["tokens_per_rank"]);
        let error = error_pct(planned, tokens);
        if error.abs() > TARGET_PCT {
            failures.push(format!(
                "{name}: a priori {planned} tokens ({error:+.2} %) against {tokens}: beyond {TARGET_PCT} %"
            ));
        }
        let own_log = plan_sglang(case, free, Some(&log_of(&logs, case)));
        let calibration = &own_log["calibration"];
        if calibration["logged_tokens"] != engine["kv_tokens"] {
            failures.push(format!("{name}: the log read as {calibration}"));
        }
        let predicted = calibration["predicted_tokens"].as_f64().unwrap_or(0.0);
        let error = error_pct(predicted, tokens);
        if error.abs() > OWN_LOG_SGLANG_PCT {
            failures.push(format!(
                "{name}: from its own log {predicted} tokens ({error:+.3} %) against {tokens}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn error_pct(planned: f64, logged: f64) -> f64 {
    (planned - logged) / logged * 100.0
}

#[test]
fn every_vllm_start() {
    let (corpus, logs) = corpus();
    let cases = corpus["cases"].as_object().expect(AS_WRITTEN);
    assert!(cases.len() >= 17, "the corpus has its 17 starts");
    let mut failures = Vec::new();
    for (name, case) in cases {
        let engine = &case["engine"];
        let log = log_of(&logs, case);
        let a_priori = plan(case, None);
        let own_log = plan(case, Some(&log));
        let Some(tokens) = engine["kv_tokens"].as_f64() else {
            // The start vLLM refused (a holder above its threshold).
            for result in [&a_priori, &own_log] {
                if result["device"]["start"]["kind"] != "refuses_free" {
                    failures.push(format!(
                        "{name}: vLLM refused, plan says {}",
                        result["device"]["start"]
                    ));
                }
            }
            continue;
        };
        let figures = |result: &Value| {
            let log = &result["device"]["engine_log"];
            (
                log["kv_cache_tokens"].as_f64(),
                log["max_concurrency"].as_f64(),
            )
        };
        let (planned, concurrency) = figures(&a_priori);
        let planned = planned.unwrap_or(0.0);
        let concurrency = concurrency.unwrap_or(0.0);
        let logged_concurrency = number(&engine["max_concurrency"]);
        let tokens_error = error_pct(planned, tokens);
        let concurrency_error = error_pct(concurrency, logged_concurrency);
        if tokens_error.abs() > TARGET_PCT || concurrency_error.abs() > TARGET_PCT {
            failures.push(format!(
                "{name}: a priori {planned} tokens ({tokens_error:+.2} %), {concurrency:.2}x ({concurrency_error:+.2} %) against {tokens} and {logged_concurrency}x: beyond {TARGET_PCT} %"
            ));
        }
        let (from_log, _) = figures(&own_log);
        let from_log_error = error_pct(from_log.unwrap_or(0.0), tokens);
        if from_log_error.abs() > OWN_LOG_PCT {
            failures.push(format!(
                "{name}: from its own log {from_log:?} tokens ({from_log_error:+.3} %) against {tokens}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One start's log, asked about another start of the same model (another
/// utilization, context length, KV dtype, graphs on or off): the KV tokens
/// that start logged within one block and what no log foretells: the two
/// logs' rounding of their GiB to 0.01 (0.02 GiB), what the two starts'
/// activation peaks differ by (a cold torch.compile peaked 0.22 GiB above
/// a cached one for Llama-3.1-8B) and their weights (the fp8-KV start
/// loaded 0.04 GiB more).
#[test]
fn a_log_carries_over_to_the_other_starts_of_its_model() {
    let (corpus, logs) = corpus();
    let cases = corpus["cases"].as_object().expect(AS_WRITTEN);
    let llama: Vec<_> = cases
        .iter()
        .filter(|(name, case)| name.starts_with("llama") && case["engine"]["kv_tokens"].is_u64())
        .collect();
    assert!(llama.len() >= 8);
    let mut failures = Vec::new();
    let mut pairs = 0;
    for (from, source) in &llama {
        let log = log_of(&logs, source);
        for (to, target) in &llama {
            if from == to {
                continue;
            }
            pairs += 1;
            let result = plan(target, Some(&log));
            let device = &result["device"];
            let planned = number(&device["engine_log"]["kv_cache_tokens"]);
            let logged = number(&target["engine"]["kv_tokens"]);
            let per_token = number(&device["bytes_per_token"]);
            let block = number(&device["page_size"]);
            let differ = |figure: &str| {
                (number(&source["engine"][figure]) - number(&target["engine"][figure])).abs()
            };
            let unforetold = 0.02 + differ("activation_peak_gib") + differ("weights_gib");
            let bound = block + (unforetold * (1u64 << 30) as f64 / per_token).ceil();
            if (planned - logged).abs() > bound {
                failures.push(format!(
                    "{from} → {to}: {planned} tokens against {logged}, beyond {bound}"
                ));
            }
        }
    }
    assert!(pairs >= 56, "{pairs} pairs");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An eager MoE start's log (the V1 runner) asked about CUDA graphs and
/// other batch limits: its non-KV memory moves by what the estimates move
/// (the graph estimate the V1 runner takes out; the activation peak at the
/// other limits), not left as the log's. This pins the carrying, not the
/// figures: asked about the corpus's graphs start (qwen3-30b-a3b), this
/// eager log, which prints no graph estimate, takes out the a-priori one.
#[test]
fn a_log_carries_graphs_and_batch_limits() {
    let (corpus, logs) = corpus();
    let case = &corpus["cases"]["qwen3-30b-a3b-eager"];
    let log = log_of(&logs, case);
    let kv = |case: &Value, from_log: Option<&Path>| {
        plan(case, from_log)["device"]["kv_bytes_per_rank"]
            .as_i64()
            .expect(AS_WRITTEN)
    };
    let (own_a_priori, own_log) = (kv(case, None), kv(case, Some(&log)));
    let asked = |drop: &str, add: &[&str]| {
        let mut other = case.clone();
        let args = other["vllm_args"].as_array_mut().expect(AS_WRITTEN);
        args.retain(|arg| arg != drop);
        args.extend(add.iter().map(|arg| Value::from(*arg)));
        other
    };
    for other in [
        asked("--enforce-eager", &[]),
        asked("", &["--max-num-batched-tokens", "16384"]),
        asked("", &["--max-num-seqs", "256"]),
    ] {
        let moved = kv(&other, None) - own_a_priori;
        assert_ne!(moved, 0, "{}", other["vllm_args"]);
        assert_eq!(
            kv(&other, Some(&log)) - own_log,
            moved,
            "{}",
            other["vllm_args"]
        );
    }
}

/// A TP1 start's log asked about TP2 (Llama-3.1-8B, eager): the log's
/// weights are split over the two ranks (Llama replicates none), its
/// activation peak moves by what the estimate moves between TP1 and TP2,
/// and what does not carry (the non-torch memory of TP2) is named in the
/// JSON's `missing`, with the log's TP.
#[test]
fn a_log_of_another_tp_carries_its_weights_and_peak() {
    let (corpus, logs) = corpus();
    let case = &corpus["cases"]["llama-u09-eager"];
    let log = log_of(&logs, case);
    let mut tp2 = case.clone();
    let args = tp2["vllm_args"].as_array_mut().expect(AS_WRITTEN);
    args.extend(["--tensor-parallel-size", "2"].map(Value::from));
    let figures = |case: &Value, from_log: Option<&Path>| {
        let result = plan(case, from_log);
        let figure = |value: &Value| value.as_i64().expect(AS_WRITTEN);
        (
            figure(&result["budget"]["weights_per_gpu"]),
            figure(&result["device"]["kv_bytes_per_rank"]),
            result["calibration"].clone(),
        )
    };
    let (weights_1, kv_1, _) = figures(case, Some(&log));
    let (weights_2, kv_2, calibration) = figures(&tp2, Some(&log));
    assert_eq!(weights_2, weights_1 / 2);
    // A priori, the same move less the estimate's weights, plus the log's.
    let (estimate_1, prior_1, _) = figures(case, None);
    let (estimate_2, prior_2, _) = figures(&tp2, None);
    let peak_moved = (prior_2 - prior_1) - (estimate_1 - estimate_2);
    assert_eq!(kv_2 - kv_1, peak_moved + (weights_1 - weights_2));
    assert_eq!(calibration["logged_tp"], 1);
    let missing = calibration["missing"].as_array().expect(AS_WRITTEN);
    assert!(
        missing
            .iter()
            .any(|line| text(line).contains("non-torch memory at the command's TP")),
        "{missing:?}"
    );
}
