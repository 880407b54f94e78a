//! `gpureap plan` on the simulated driver with real processes: what a
//! notebook's memory on one GPU costs the server, `free` taking it away,
//! the plan then fitting; a GPU too small (exit 4); bad input (exit 2, one
//! line); and the JSON document against the published schema.

use std::path::Path;

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};
use serde_json::Value;

use crate::harness::*;
use crate::plan_fixture::{self, model, published};
use crate::says::says;

pub(crate) use crate::plan_fixture::LLAMA_8B;

/// SGLang over two GPUs, as the tests here start it.
fn sglang(model: impl AsRef<Path>) -> Vec<String> {
    plan_fixture::sglang(model, &["--tp", "2", "--mem-fraction-static", "0.85"])
}

fn plan(host: &SimHost, flags: &[&str], command: &[String]) -> Run {
    let mut args: Vec<String> = vec!["plan".to_string()];
    args.extend(flags.iter().map(|flag| flag.to_string()));
    args.push("--".to_string());
    args.extend(command.iter().cloned());
    // A hypothetical box takes no --backend (it reads no GPU); the
    // environment's is a default, never refused.
    let mut command = if flags.contains(&"--gpu-memory") {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"));
        command
            .env("GPUREAP_BACKEND", host.backend())
            .stdin(std::process::Stdio::null());
        command
    } else {
        gpureap(host)
    };
    command
        .args(&args)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .expect("gpureap runs")
        .into()
}

/// A notebook holding 6 GiB on GPU 1 of the two the server will use: `plan`
/// names it, says what it costs every rank and the command that frees it,
/// and exits 1; that very command frees it; `plan` then fits (exit 0).
#[test]
fn a_notebook_on_one_gpu_costs_every_rank_until_free_takes_it_away() {
    let host = SimHost::new(2, 80 * GIB, "Simulated H100").expect("sim host");
    let model = model("notebook", LLAMA_8B);
    let command = sglang(&model);
    let mut incident = Incident::new(&host);
    let notebook = incident
        .holder(&Holder::new("python3 -m ipykernel_launcher -f kernel-1.json").on(1, 6 * GIB))
        .expect("notebook");

    let held = plan(&host, &["--weights", "16GiB", "--json"], &command);
    assert_eq!(held.code, 1, "{}{}", held.stdout, held.stderr);
    let report = held.json();
    assert_eq!(report["kind"], "plan");
    assert_eq!(report["fit"]["verdict"], "fits_after_free", "{report:#}");
    let holders = report["fit"]["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 1, "{report:#}");
    assert_eq!(holders[0]["pid"], notebook, "{report:#}");
    assert_eq!(holders[0]["gpu"], 1);
    assert_eq!(holders[0]["bytes"], 6 * GIB);
    // SGLang's MIN rule: 0.85 × the 6 GiB the notebook takes from the
    // free memory at start, in tokens of 2 × 4 KV heads per rank (8 heads
    // over TP 2) × (128 + 128) × 32 layers = 65,536 bytes.
    let bytes_per_token = 4 * (128 + 128) * 32 * 2;
    assert_eq!(report["device"]["bytes_per_token"], bytes_per_token);
    let lost = holders[0]["tokens_lost_per_rank"]
        .as_u64()
        .expect("tokens lost");
    let expected = (0.85 * (6 * GIB) as f64) as u64 / bytes_per_token;
    assert!(
        lost.abs_diff(expected) <= 1,
        "lost {lost}, the rule gives {expected}: {report:#}"
    );
    let clean = report["device_clean"]["tokens_per_rank"]
        .as_u64()
        .expect("clean");
    let now = report["device"]["tokens_per_rank"].as_u64().expect("now");
    assert_eq!(clean - now, lost, "{report:#}");
    let free_command = report["fit"]["free_command"]
        .as_str()
        .expect("a free command")
        .to_string();
    assert_eq!(
        free_command,
        format!("gpureap free --gpu 1 --pid {notebook}")
    );

    // The text says the same, in words.
    let text = plan(&host, &["--weights", "16GiB"], &command);
    assert_eq!(text.code, 1, "{}{}", text.stdout, text.stderr);
    assert!(
        text.stdout
            .contains(&format!("PID {notebook} python3 -m ipykernel_launcher")),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains(&free_command), "{}", text.stdout);
    says(&text.stdout, &["fits only after freeing what others hold"]);

    // The command it printed, as printed (with --yes, for no terminal).
    let words: Vec<&str> = free_command.split(' ').skip(1).collect();
    let mut free_args = words.clone();
    free_args.extend(["--grace", "0", "--yes"]);
    let freed = run(&host, &free_args);
    assert_eq!(freed.code, 0, "{}{}", freed.stdout, freed.stderr);
    assert!(!alive(notebook));

    let fits = plan(&host, &["--weights", "16GiB", "--json"], &command);
    assert_eq!(fits.code, 0, "{}{}", fits.stdout, fits.stderr);
    let report = fits.json();
    assert_eq!(report["fit"]["verdict"], "fits", "{report:#}");
    assert_eq!(report["fit"]["holders"], Value::Array(Vec::new()));
    assert_eq!(report["device"]["tokens_per_rank"], clean);
}

/// vLLM takes `utilization × total` and refuses to start when a GPU has
/// less free: a holder inside the `1 − utilization` margin costs nothing
/// (exit 0), a larger one stops the start (exit 1, "would refuse").
#[test]
fn vllm_ignores_a_holder_in_its_margin_and_refuses_a_larger_one() {
    let host = SimHost::new(1, 80 * GIB, "Simulated H100").expect("sim host");
    let model = model("vllm", LLAMA_8B);
    let command = plan_fixture::vllm(&model, &["--gpu-memory-utilization", "0.8"]);
    let mut incident = Incident::new(&host);
    // 80 GiB × (1 − 0.8) = 16 GiB of margin, 1 GiB of it the engine's own context.
    let small = incident
        .holder(&Holder::new("python3 small.py").on(0, 4 * GIB))
        .expect("small holder");
    let inside = plan(&host, &["--weights", "16GiB", "--json"], &command);
    assert_eq!(inside.code, 0, "{}{}", inside.stdout, inside.stderr);
    let report = inside.json();
    assert_eq!(report["fit"]["holders"][0]["pid"], small, "{report:#}");
    assert_eq!(report["fit"]["holders"][0]["cost"]["kind"], "nothing");

    let large = incident
        .holder(&Holder::new("python3 large.py").on(0, 20 * GIB))
        .expect("large holder");
    let outside = plan(&host, &["--weights", "16GiB", "--json"], &command);
    assert_eq!(outside.code, 1, "{}{}", outside.stdout, outside.stderr);
    let report = outside.json();
    let cost_of = |pid: u32| {
        report["fit"]["holders"]
            .as_array()
            .expect("holders")
            .iter()
            .find(|holder| holder["pid"] == pid)
            .map(|holder| holder["cost"]["kind"].clone())
    };
    assert_eq!(
        cost_of(large),
        Some(Value::from("refuses_start")),
        "{report:#}"
    );
    assert_eq!(report["device"]["starts"], false, "{report:#}");
    let text = plan(&host, &["--weights", "16GiB"], &command);
    says(&text.stdout, &["would refuse to start"]);
}

/// `--gpu-memory` plans a clean box, reads no GPU (the driver here has
/// none), and a GPU too small for the weights is the code of its own.
#[test]
fn a_gpu_too_small_is_exit_4_and_no_gpu_is_read_for_a_hypothetical_box() {
    let model = model("small", LLAMA_8B);
    let command = sglang(&model);
    let hypothetical = |gpu_memory: &str| -> Run {
        let mut args = vec!["plan", "--gpu-memory", gpu_memory];
        args.extend(["--weights", "16GiB", "--json", "--"]);
        let mut all: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        all.extend(command.iter().cloned());
        // GPUREAP_BACKEND=none: no GPU is read anyway.
        std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
            .args(&all)
            .env("GPUREAP_BACKEND", "none")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .output()
            .expect("runs")
            .into()
    };
    let small = hypothetical("16GiB");
    assert_eq!(small.code, 4, "{}{}", small.stdout, small.stderr);
    let report = small.json();
    assert_eq!(report["fit"]["verdict"], "does_not_fit", "{report:#}");
    assert_eq!(report["fit"]["hypothetical"], true);

    let large = hypothetical("80GiB");
    assert_eq!(large.code, 0, "{}{}", large.stdout, large.stderr);
    assert_eq!(large.json()["fit"]["verdict"], "fits");

    // --backend given with --gpu-memory would not be obeyed: refused.
    let both = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", "none", "plan", "--gpu-memory", "80GiB", "--"])
        .args(&command)
        .env_remove("GPUREAP_BACKEND")
        .output()
        .expect("runs");
    assert_eq!(both.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&both.stderr).contains("means nothing"));

    // On this host with no driver, the engine's GPUs cannot be read: 3.
    let unreadable = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", "none", "plan", "--weights", "16GiB", "--"])
        .args(&command)
        .env_remove("GPUREAP_BACKEND")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&unreadable.stderr);
    assert_eq!(unreadable.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("--gpu-memory"), "{stderr}");

    // A GPU the engine uses that the driver lost: 3, naming it.
    let host = SimHost::new(2, 80 * GIB, "Simulated H100").expect("sim host");
    host.lose(1).expect("lose GPU 1");
    let lost = plan(&host, &["--weights", "16GiB"], &command);
    assert_eq!(lost.code, 3, "{}{}", lost.stdout, lost.stderr);
    says(&lost.stderr, &["GPU 1"]);
}

/// Each bad input is one line on stderr naming what is missing, exit 2,
/// and nothing on stdout.
#[test]
fn bad_input_is_one_line_and_exit_2() {
    let host = SimHost::new(1, 80 * GIB, "Simulated H100").expect("sim host");
    let good = model("good", LLAMA_8B);
    let no_layers = model(
        "no-layers",
        r#"{"architectures": ["LlamaForCausalLM"], "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}"#,
    );
    let strange = model(
        "strange",
        r#"{"architectures": ["StrangeForCausalLM"], "num_hidden_layers": 4}"#,
    );
    let missing = good.path().join("not-there");
    let cases: [(&str, Vec<String>, &str); 5] = [
        (
            "unknown engine",
            ["python3", "serve.py", "--model", "x"]
                .map(String::from)
                .to_vec(),
            "engine",
        ),
        (
            "no model",
            ["python3", "-m", "sglang.launch_server", "--tp", "1"]
                .map(String::from)
                .to_vec(),
            "model",
        ),
        ("model not found", sglang(&missing), "not-there"),
        ("unknown architecture", sglang(&strange), "architecture"),
        ("missing field", sglang(&no_layers), "num_hidden_layers"),
    ];
    for (what, command, named) in cases {
        let result = plan(&host, &["--weights", "1GiB"], &command);
        assert_one_line_usage(what, &result, named);
    }
    // Without --weights, a config with no checkpoint beside it cannot be
    // priced: the message names the directory and the flag that fixes it.
    let result = plan(&host, &["--gpu-memory", "80GiB"], &sglang(&good));
    assert_one_line_usage("no weights", &result, "--weights");
    says(&result.stderr, &["good"]);
}

fn assert_one_line_usage(what: &str, result: &Run, named: &str) {
    assert_eq!(result.code, 2, "{what}: {}{}", result.stdout, result.stderr);
    assert!(result.stdout.is_empty(), "{what}: {}", result.stdout);
    assert_eq!(
        result.stderr.lines().count(),
        1,
        "{what}: {}",
        result.stderr
    );
    assert!(
        result.stderr.starts_with("gpureap: ") && result.stderr.contains(named),
        "{what} does not name {named}: {}",
        result.stderr
    );
}

/// The plan document, with a holder, on a hypothetical box and with a
/// host tier, matches docs/json.schema.json.
#[test]
fn plan_documents_match_the_published_schema() {
    let validator = crate::schema::schema();
    let host = SimHost::new(2, 80 * GIB, "Simulated H100").expect("sim host");
    let model = model("schema", LLAMA_8B);
    let mut incident = Incident::new(&host);
    incident
        .holder(&Holder::new("python3 notebook.py").on(0, 3 * GIB))
        .expect("holder");
    host.leak(1, 2 * GIB).expect("leak");
    let mut with_tier = sglang(&model);
    with_tier.extend(["--enable-hierarchical-cache", "--hicache-size", "20"].map(String::from));
    let documents = [
        (
            "held, with averages and concurrency",
            plan(
                &host,
                &[
                    "--weights",
                    "16GiB",
                    "--avg-prompt",
                    "800",
                    "--avg-output",
                    "4100",
                    "--concurrency",
                    "150",
                    "--json",
                ],
                &sglang(&model),
            ),
        ),
        (
            "hypothetical, host tier",
            plan(
                &host,
                &[
                    "--gpu-memory",
                    "80GiB",
                    "--weights",
                    "16GiB",
                    "--host-memory",
                    "100GiB",
                    "--json",
                ],
                &with_tier,
            ),
        ),
        (
            "does not fit",
            plan(
                &host,
                &["--gpu-memory", "10GiB", "--weights", "16GiB", "--json"],
                &sglang(&model),
            ),
        ),
    ];
    for (what, result) in &documents {
        let document = result.json();
        crate::schema::conforms(&validator, what, &document);
    }
    let held = documents[0].1.json();
    // The driver-held 2 GiB on GPU 1 is a holder of its own, with the reset.
    let driver_held = held["fit"]["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|holder| holder["pid"].is_null())
        .cloned()
        .unwrap_or_else(|| panic!("no driver-held holder: {held:#}"));
    assert_eq!(driver_held["gpu"], 1);
    assert_eq!(driver_held["bytes"], 2 * GIB);
    assert_eq!(held["fit"]["reset_command"], "gpureap reset --gpu 1");
    assert!(held["device"]["concurrency"].is_number(), "{held:#}");
    // Without averages, device.concurrency is null.
    let plain = documents[1].1.json();
    assert!(plain["device"]["concurrency"].is_null(), "{plain:#}");
}

/// `--from-log`: the measured weights replace the estimate, and the tokens
/// the log states are shown beside what the rule predicts from the logged
/// figures: SGLang's own numbers, 0.85 × 60.00 GiB − 20.00 GiB = 31 GiB of
/// 65,536-byte tokens (507,904), logged as such.
#[test]
fn a_previous_start_s_log_replaces_the_estimates_and_is_checked() {
    let host = SimHost::new(2, 80 * GIB, "Simulated H100").expect("sim host");
    let model = model("log", LLAMA_8B);
    let log = model.path().join("sglang.log");
    std::fs::write(
        &log,
        "[2026-11-30 10:00:01 TP0] Load weight begin. avail mem=60.00 GB\n\
         [2026-11-30 10:00:31 TP0] Load weight end. elapsed=30.1 s, type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=40.00 GB, mem usage=20.00 GB.\n\
         [2026-11-30 10:00:32 TP0] KV Cache is allocated. #tokens: 507904, K size: 15.50 GB, V size: 15.50 GB\n",
    )
    .expect("log");
    let log = log.display().to_string();
    let result = plan(&host, &["--from-log", &log, "--json"], &sglang(&model));
    assert_eq!(result.code, 0, "{}{}", result.stdout, result.stderr);
    let report = result.json();
    crate::schema::conforms(&crate::schema::schema(), "plan --from-log", &report);
    assert_eq!(report["budget"]["weights_source"], "log", "{report:#}");
    assert_eq!(report["budget"]["weights_per_gpu"], 20 * GIB);
    assert_eq!(report["calibration"]["logged_tokens"], 507_904);
    assert_eq!(
        report["calibration"]["predicted_tokens"], 507_904,
        "{report:#}"
    );
    let text = plan(&host, &["--from-log", &log], &sglang(&model));
    says(
        &text.stdout,
        &["predicted 507,904 tokens from the logged figures, logged 507,904"],
    );
}

/// `--from-log` with a real vLLM 0.26.0 start (tests/fixtures/logs: an
/// H200 at `--gpu-memory-utilization 0.5`): its `Available KV cache
/// memory` was the rule's answer at 0.5 only, so a higher utilization
/// lever adds KV (0.05 of the 139.8 GiB total: 56,000-odd tokens of
/// Llama-3.1-8B), and the log's own figures predict its count.
#[test]
fn a_vllm_log_leaves_the_utilization_lever_its_effect() {
    let log = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/logs/vllm-0.26.0-llama-3.1-8b-u05.log");
    let result: Run = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["plan", "--gpu-memory", "143156MiB", "--json", "--from-log"])
        .arg(&log)
        .arg("--")
        .args(plan_fixture::vllm(
            published("llama-3.1-8b"),
            &[
                "--gpu-memory-utilization",
                "0.5",
                "--max-model-len",
                "8192",
                "--enforce-eager",
            ],
        ))
        .env("GPUREAP_BACKEND", "none")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .expect("runs")
        .into();
    assert_eq!(result.code, 0, "{}{}", result.stdout, result.stderr);
    let report = result.json();
    crate::schema::conforms(&crate::schema::schema(), "plan --from-log vLLM", &report);
    let now = report["device"]["tokens_per_rank"]
        .as_u64()
        .expect("tokens");
    let lever = report["levers"]
        .as_array()
        .expect("levers")
        .iter()
        .find(|lever| lever["name"] == "mem_fraction")
        .cloned()
        .unwrap_or_else(|| panic!("no mem_fraction lever: {report:#}"));
    let higher = lever["tokens_per_rank"].as_u64().expect("lever tokens");
    // 0.05 × 143,156 MiB = 7,157.8 MiB: 3,578 blocks of 2 MiB, give or
    // take one for the rounding.
    let blocks = (higher - now) / 16;
    assert!(
        (3_577..=3_579).contains(&blocks),
        "{now} -> {higher}: {report:#}"
    );
    assert_eq!(report["budget"]["kv_memory"], Value::Null, "{report:#}");
    assert_eq!(report["calibration"]["logged_tokens"], 440_688);
    let predicted = report["calibration"]["predicted_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no prediction: {report:#}"));
    assert!(predicted.abs_diff(440_688) <= 2 * 16, "{report:#}");
}

/// CUDA_VISIBLE_DEVICES decides which GPUs are the engine's: by index, and
/// by UUID (resolved through the snapshot, a unique prefix as CUDA allows).
/// A holder on a GPU the engine does not use costs it nothing.
#[test]
fn the_engine_s_gpus_come_from_cuda_visible_devices_by_index_or_uuid() {
    let host = SimHost::new(3, 80 * GIB, "Simulated H100").expect("sim host");
    let model = model("visible", LLAMA_8B);
    let mut incident = Incident::new(&host);
    let holder = incident
        .holder(&Holder::new("python3 train.py").on(2, 10 * GIB))
        .expect("holder");
    let with_visible = |visible: &str| -> Value {
        let mut args = vec!["plan", "--weights", "16GiB", "--json", "--"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
        let mut command = sglang(&model);
        command[6] = "1".to_string(); // --tp 1
        args.extend(command);
        let result: Run = gpureap(&host)
            .args(&args)
            .env("CUDA_VISIBLE_DEVICES", visible)
            .output()
            .expect("runs")
            .into();
        assert!(
            result.code == 0 || result.code == 1,
            "{visible}: {}{}",
            result.stdout,
            result.stderr
        );
        result.json()
    };
    let gpus = |report: &Value| -> Vec<u64> {
        report["fit"]["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .map(|gpu| gpu["index"].as_u64().expect("index"))
            .collect()
    };
    let clean = with_visible("1,2");
    assert_eq!(gpus(&clean), [1], "{clean:#}");
    assert_eq!(clean["fit"]["verdict"], "fits", "{clean:#}");

    let by_uuid = with_visible("GPU-sim-00000002,GPU-sim-00000000");
    assert_eq!(gpus(&by_uuid), [2], "{by_uuid:#}");
    assert_eq!(by_uuid["fit"]["holders"][0]["pid"], holder, "{by_uuid:#}");
    assert_eq!(by_uuid["fit"]["verdict"], "fits_after_free");

    // A UUID no GPU has, and a prefix several have: bad input, named.
    for (visible, said) in [
        (
            "GPU-nowhere,GPU-either",
            "no GPU of this host has that UUID",
        ),
        ("GPU-sim-0000000,GPU-sim-00000001", "more than one GPU"),
    ] {
        let refused: Run = gpureap(&host)
            .args(["plan", "--weights", "16GiB", "--"])
            .args(sglang(&model))
            .env("CUDA_VISIBLE_DEVICES", visible)
            .output()
            .expect("runs")
            .into();
        assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
        assert!(refused.stderr.contains(said), "{}", refused.stderr);
    }
}

/// The worked examples of docs/plan.md are what `plan` prints: every line a
/// documented command shows comes out of it, in that order (an example may
/// show only some sections; `...` marks lines left out), and an example
/// shown whole, from its first line to the verdict, is the output byte for
/// byte. The examples that need a staged host or a log file of their own
/// (`--backend sim:`, `--from-log`, or `...` in the command) are not run.
#[test]
fn the_worked_examples_in_docs_plan_md_are_what_plan_prints() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/plan.md")).expect("docs/plan.md");
    let examples = documented_plans(&doc);
    assert!(
        examples.len() >= 4,
        "docs/plan.md lost its worked examples: {examples:?}"
    );
    let mut whole = 0;
    for (args, shown) in &examples {
        let result: Run = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
            .current_dir(root)
            .args(args)
            .env("GPUREAP_BACKEND", "none")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("gpureap runs")
            .into();
        let printed: Vec<&str> = result.stdout.lines().collect();
        let is_whole = shown.first().is_some_and(|line| line.contains(" serving "))
            && shown
                .last()
                .is_some_and(|line| line.starts_with("Verdict: "))
            && !shown.iter().any(|line| line == "...");
        if is_whole {
            whole += 1;
            assert_eq!(
                printed,
                *shown,
                "gpureap {}: the output is not the one docs/plan.md shows",
                args.join(" ")
            );
            continue;
        }
        let mut rest = printed.iter();
        for line in shown.iter().filter(|line| *line != "...") {
            assert!(
                rest.any(|printed| printed == line),
                "gpureap {}: docs/plan.md shows {line:?}, which does not come out where it shows it:\n{}",
                args.join(" "),
                result.stdout
            );
        }
    }
    assert!(whole >= 1, "no example shown whole: {examples:?}");
}

/// Each `$ gpureap plan …` in the fenced blocks of docs/plan.md (its `\`
/// continuation lines joined), with the lines shown after it up to the next
/// `$` or the end of the block.
fn documented_plans(doc: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let mut examples: Vec<(String, Vec<String>)> = Vec::new();
    let mut in_block = false;
    let mut lines = doc.lines();
    let mut current: Option<(String, Vec<String>)> = None;
    while let Some(line) = lines.next() {
        if line.starts_with("```") {
            in_block = !in_block;
            examples.extend(current.take());
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            examples.extend(current.take());
            let mut command = command.to_string();
            while command.ends_with('\\') {
                command.pop();
                command.push_str(lines.next().unwrap_or_default());
            }
            current = Some((command, Vec::new()));
        } else if let Some((_, shown)) = current.as_mut() {
            shown.push(line.to_string());
        }
    }
    examples
        .into_iter()
        .filter(|(command, _)| {
            command.starts_with("gpureap plan ")
                && !command.contains("...")
                && !command.contains("sim:")
                && !command.contains("--from-log")
        })
        .map(|(command, shown)| {
            let args = command
                .split_whitespace()
                .skip(1)
                .map(str::to_string)
                .collect();
            (args, shown)
        })
        .collect()
}

/// The verdict is decided in one place (`fit::Outcome::decision`): 1 only
/// where freeing the holders, or a reset of driver-held memory, makes the
/// server start as asked; 4 where nothing on this host does. Before:
/// `--gpu-free` with nothing held said "fits only after freeing what
/// others hold" (exit 1) naming no holder; a `--gpu-free` above the GPU's
/// total was taken (exit 0); driver-held memory got "free the holders";
/// a `--concurrency` the server cannot hold even on clean GPUs was "fits
/// now" (exit 0).
#[test]
fn the_verdict_is_1_only_where_freeing_or_a_reset_helps() {
    let host = SimHost::new(2, 80 * GIB, "Simulated H100").expect("sim host");
    let model = model("verdict", LLAMA_8B);
    let command = sglang(&model);
    let weights = ["--weights", "16GiB"];

    let little = plan(
        &host,
        &[&weights[..], &["--gpu-free", "10GiB"]].concat(),
        &command,
    );
    assert_eq!(little.code, 4, "{}{}", little.stdout, little.stderr);
    assert!(
        !little.stdout.contains("fits only after freeing")
            && little.stdout.contains("not looked at (--gpu-free"),
        "{}",
        little.stdout
    );
    let above = plan(
        &host,
        &[&weights[..], &["--gpu-free", "200GiB"]].concat(),
        &command,
    );
    assert_one_line_usage("--gpu-free above the GPU", &above, "--gpu-free");
    says(&above.stderr, &["80.0 GiB"]);

    // More GPUs than the host has is said as such. Before: "the engine's
    // GPUs \"2\": this host has 2 GPUs".
    let mut four = command.clone();
    four.extend(["--tp".to_string(), "4".to_string()]);
    let more = plan(&host, &weights, &four);
    assert_one_line_usage(
        "--tp 4 on 2 GPUs",
        &more,
        "the command uses 4 GPUs (TP 4 × PP 1 × DP 1) and this host has 2",
    );

    // Requests of 2,000 tokens: the clean pool holds a few hundred at once.
    let averages = ["--avg-prompt", "1000", "--avg-output", "1000"];
    let held = |wanted: &str| {
        plan(
            &host,
            &[&weights[..], &averages[..], &["--concurrency", wanted]].concat(),
            &command,
        )
    };
    let some = held("100");
    assert_eq!(some.code, 0, "{}{}", some.stdout, some.stderr);
    let too_many = held("100000");
    assert_eq!(too_many.code, 4, "{}{}", too_many.stdout, too_many.stderr);
    says(
        &too_many.stdout,
        &[
            "Verdict: does not hold --concurrency 100,000 at once on this hardware, even on clean GPUs (exit 4)",
        ],
    );

    // A stray context of 1 MiB: reported, within the tolerance.
    let mut incident = Incident::new(&host);
    let stray = incident
        .holder(&Holder::new("python3 stray_context.py").on(0, 1 << 20))
        .expect("stray");
    let tiny = plan(&host, &weights, &command);
    assert_eq!(tiny.code, 0, "{}{}", tiny.stdout, tiny.stderr);
    for said in [
        &format!("GPU 0: PID {stray} "),
        "(at most 1% of the pool: reported, it does not change the verdict)",
        "Verdict: fits now: what others hold costs it at most 1% of the pool (exit 0)",
    ] {
        assert!(tiny.stdout.contains(said), "{said}: {}", tiny.stdout);
    }
    incident.kill(stray).expect("the stray ends");

    // Memory held by no process on GPU 1: only a reset gives it back.
    host.leak(1, 10 * GIB).expect("leak");
    let reset = plan(&host, &weights, &command);
    assert_eq!(reset.code, 1, "{}{}", reset.stdout, reset.stderr);
    for said in [
        "fits only after a reset of the memory held by no process",
        "reset the GPUs (the command above)",
        "Levers (each after the reset)",
        "gpureap reset --gpu 1",
    ] {
        assert!(reset.stdout.contains(said), "{said}: {}", reset.stdout);
    }
    assert!(
        !reset.stdout.contains("free the holders"),
        "{}",
        reset.stdout
    );
}

/// A host tier the host cannot allocate is exit 4: no holder freed on the
/// GPUs gives the host memory. The incident's 300 GB of HiCache per rank,
/// 2.4 TB over TP 8, against 512 GiB. Before: exit 0 on a box (1 on a
/// host with a holder), the tier's "DOES NOT FIT" a line of the report.
#[test]
fn a_host_tier_the_host_cannot_allocate_does_not_fit() {
    let host = SimHost::new(1, 80 * GIB, "Simulated H100").expect("sim host");
    let kimi = published("kimi-k2.5");
    let command = |size: &str| {
        let tier = ["--enable-hierarchical-cache", "--hicache-size", size];
        plan_fixture::sglang(
            &kimi,
            &[&["--tp", "8", "--mem-fraction-static", "0.85"], &tier[..]].concat(),
        )
    };
    let flags = [
        "--gpu-memory",
        "97871MiB",
        "--weights",
        "72.8GiB",
        "--host-memory",
        "512GiB",
    ];
    let too_large = plan(&host, &flags, &command("300"));
    assert_eq!(
        too_large.code, 4,
        "{}{}",
        too_large.stdout, too_large.stderr
    );
    assert!(
        too_large.stdout.contains("DOES NOT FIT")
            && too_large
                .stdout
                .contains("Verdict: the host tier does not fit this host's memory"),
        "{}",
        too_large.stdout
    );
    let fits = plan(&host, &flags, &command("37"));
    assert_eq!(fits.code, 0, "{}{}", fits.stdout, fits.stderr);
    // 1 GB a rank is less than the 115,982 tokens of the device pool:
    // SGLang 0.5.9 asserts against it at start.
    let small = plan(&host, &flags, &command("1"));
    assert_eq!(small.code, 4, "{}{}", small.stdout, small.stderr);
    says(
        &small.stdout,
        &[
            "SGLang does not start: the host pool must hold more than the device pool's 115,982 tokens per rank",
        ],
    );
}

/// A sliding-window model on a clean 80 GiB box: vLLM's KV-cache groups
/// and the figures it would log (Gemma-3-27B, 40 GiB of KV: 32,768 blocks
/// shared by 1 full and 6 window groups of 10 layers, "GPU KV cache size:
/// 125,115 tokens", crates/services/src/plan/tests.rs works them out), SGLang's full and
/// window pools for gpt-oss-20b, both in text and in JSON of the schema.
#[test]
fn sliding_window_models_show_the_engine_s_own_pools() {
    let validator = crate::schema::schema();
    let host = SimHost::new(1, 80 * GIB, "Simulated H100").expect("sim host");
    let gemma = plan_fixture::vllm(published("gemma-3-27b-it"), &["--max-model-len", "32768"]);
    let flags = [
        "--gpu-memory",
        "80GiB",
        "--weights",
        "30GiB",
        "--kv-memory",
        "40GiB",
        "--avg-prompt",
        "2000",
        "--avg-output",
        "1000",
    ];
    let text = plan(&host, &flags, &gemma);
    assert_eq!(text.code, 0, "{}{}", text.stdout, text.stderr);
    assert!(
        text.stdout.contains(
            "\"GPU KV cache size: 125,115 tokens\", \"Maximum concurrency for 32,768 tokens per request: 3.82x\""
        ),
        "{}",
        text.stdout
    );
    says(
        &text.stdout,
        &[
            "1 full + 6 sliding-window (window 1,024) of 10 layers each",
            "bound by the KV pool",
        ],
    );
    let mut json_flags = flags.to_vec();
    json_flags.push("--json");
    let document = plan(&host, &json_flags, &gemma).json();
    crate::schema::conforms(&validator, "vLLM sliding window", &document);
    assert_eq!(document["device"]["engine_log"]["kv_cache_tokens"], 125_115);
    assert_eq!(document["device"]["hybrid"]["blocks_per_request"], 8_582);
    assert_eq!(document["device"]["concurrency_cap"], "pool");

    let oss = plan_fixture::sglang(published("gpt-oss-20b"), &[]);
    let kv = [
        "--gpu-memory",
        "80GiB",
        "--weights",
        "13GiB",
        "--kv-memory",
        "10GiB",
        "--json",
    ];
    let document = plan(&host, &kv, &oss).json();
    crate::schema::conforms(&validator, "SGLang SWA pools", &document);
    assert_eq!(document["device"]["hybrid"]["full_tokens"], 242_725);
    assert_eq!(document["device"]["hybrid"]["window_tokens"], 194_180);
    assert_eq!(document["device"]["tokens_per_rank"], 242_725);

    // Qwen3-Next (12 layers) on SGLang: the state slots beside the pool,
    // and the request cap they set, in the schema's shape.
    let next = plan_fixture::sglang(published("qwen3-next-80b-a3b-12l"), &[]);
    let flags = [
        "--gpu-memory",
        "80GiB",
        "--avg-prompt",
        "6000",
        "--avg-output",
        "2000",
        "--json",
    ];
    let document = plan(&host, &flags, &next).json();
    crate::schema::conforms(&validator, "SGLang state slots", &document);
    assert_eq!(
        document["device"]["hybrid"]["engine"], "sglang_state",
        "{document:#}"
    );
    assert_eq!(
        document["device"]["concurrency_cap"], "state_slots",
        "{document:#}"
    );
    assert_eq!(document["budget"]["weights_source"], "config_estimate");
}

#[test]
fn mamba_hybrids_plan_on_the_engines_that_serve_them_and_are_refused_by_name_elsewhere() {
    let validator = crate::schema::schema();
    let host = SimHost::new(1, 80 * GIB, "Simulated H100").expect("sim host");
    let flags = [
        "--gpu-memory",
        "80GiB",
        "--weights",
        "30GiB",
        "--kv-memory",
        "20GiB",
        "--avg-prompt",
        "6000",
        "--avg-output",
        "2000",
    ];
    // Nemotron-H-8B on vLLM 0.26.0 at 20 GiB of KV: the figures of
    // scripts/mamba_state_reference.py (the engine's own functions), as
    // the unit test nemotron_h_pools_mamba2_state_beside_its_attention_layers
    // pins them.
    let nemotron = plan_fixture::vllm(published("nemotron-h-8b"), &["--max-model-len", "8192"]);
    let text = plan(&host, &flags, &nemotron);
    assert_eq!(text.code, 0, "{}{}", text.stdout, text.stderr);
    says(
        &text.stdout,
        &[
            "× 4 layers × KV bytes; 24 linear-attention or Mamba layers hold a state per request",
            "\"GPU KV cache size: 737,280 tokens\", \"Maximum concurrency for 8,192 tokens per request: 90.00x\"",
            "1 full + 6 linear-attention or Mamba state (one block a request) of 4 layers each, sharing 1,260 blocks of 1040 tokens",
        ],
    );
    let mut json_flags = flags.to_vec();
    json_flags.push("--json");
    let document = plan(&host, &json_flags, &nemotron).json();
    crate::schema::conforms(&validator, "vLLM Mamba2 hybrid", &document);
    assert_eq!(document["device"]["engine_log"]["kv_cache_tokens"], 737_280);
    assert_eq!(document["device"]["hybrid"]["state_groups"], 6);
    // The same on SGLang 0.5.9: 99 state slots, a cap of 33 that binds.
    let on_sglang = plan_fixture::sglang(published("nemotron-h-8b"), &[]);
    let document = plan(&host, &json_flags, &on_sglang).json();
    crate::schema::conforms(&validator, "SGLang Mamba2 state slots", &document);
    assert_eq!(document["device"]["hybrid"]["state_slots"], 99);
    assert_eq!(document["device"]["concurrency_cap"], "state_slots");
    // Jamba: vLLM serves it, SGLang has no model for it: refused by name,
    // exit 2, never planned as full attention.
    let jamba = plan_fixture::sglang(published("jamba-v0.1"), &[]);
    let refused = plan(&host, &flags, &jamba);
    assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
    says(
        &refused.stderr,
        &["JambaForCausalLM on SGLang 0.5.9: SGLang has no Jamba model"],
    );
    let jamba = plan_fixture::vllm(published("jamba-v0.1"), &["--max-model-len", "8192"]);
    assert_eq!(plan(&host, &flags, &jamba).code, 0);
}
