//! `gpureap plan` against hostile and careless input: a command line, a
//! config.json, a checkpoint index, a previous start's log, a Hugging Face
//! cache and an environment that no real server has. Each answer is one
//! line on stderr and exit 2, within seconds: no panic, no hang, no
//! figure made from a number that overflowed. The rows of docs/security.md
//! name these tests.

use std::io::Read as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt as _;

use crate::harness::Run;

use crate::plan_fixture::{LLAMA_8B, dir, model, serve, sglang, vllm, within_512_mib};
use crate::says::says;

/// A hypothetical box (no GPU read) large enough for any sane command.
const BOX: [&str; 4] = ["--gpu-memory", "80GiB", "--weights", "1GiB"];

/// `gpureap plan FLAGS -- COMMAND` with `env`, ended after 30 s: a hang
/// is a failure of its own ("did not end"), not a test that never ends.
fn plan_with(flags: &[&str], command: &[String], env: &[(&str, &str)]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpureap"));
    child
        .arg("plan")
        .args(flags)
        .arg("--")
        .args(command)
        .env_remove("GPUREAP_BACKEND")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = child.spawn().expect("gpureap runs");
    // Read while it runs: an output larger than a pipe holds must not
    // stop it.
    let reader = |stream: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut stream) = stream {
                let _ = stream.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = reader(child.stdout.take().map(|out| Box::new(out) as _));
    let stderr = reader(child.stderr.take().map(|err| Box::new(err) as _));
    let status = match child.wait_timeout(Duration::from_secs(30)).expect("wait") {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gpureap plan {flags:?} -- {command:?} did not end within 30 s");
        }
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout: stdout.join().expect("stdout"),
        stderr: stderr.join().expect("stderr"),
    }
}

fn plan(flags: &[&str], command: &[String]) -> Run {
    plan_with(flags, command, &[])
}

/// Exit 2, nothing on stdout, one line on stderr naming `named`.
fn assert_refused(what: &str, result: &Run, named: &str) {
    assert_eq!(
        result.code, 2,
        "{what}: exit {}\n{}{}",
        result.code, result.stdout, result.stderr
    );
    assert!(result.stdout.is_empty(), "{what}: {}", result.stdout);
    assert_eq!(
        result.stderr.lines().count(),
        1,
        "{what}: not one line: {}",
        result.stderr
    );
    assert!(
        result.stderr.starts_with("gpureap: ") && result.stderr.contains(named),
        "{what}: does not name {named}: {}",
        result.stderr
    );
}

/// A report (exit 0 to 4, never a panic's 101), the verdict said.
fn assert_planned(what: &str, result: &Run) {
    assert!(
        (0..=4).contains(&result.code) && result.code != 2,
        "{what}: exit {}\n{}{}",
        result.code,
        result.stdout,
        result.stderr
    );
    assert!(
        result.stdout.contains("Verdict:"),
        "{what}: {}{}",
        result.stdout,
        result.stderr
    );
    assert!(
        !result.stderr.contains("panicked"),
        "{what}: {}",
        result.stderr
    );
}

/// Parallel sizes and GPU ids no host has: each refused by name at once.
/// Before, `--tp 99999` and `-dcp`-free products overflowed (a panic in a
/// debug build, a wrapped GPU count in a release one), `--tp 400000000`
/// and `--dp 4000000000` built a list of that many GPU ids (no answer,
/// gigabytes of memory), `--base-gpu-id 4294967295` overflowed, and
/// `-dcp 4000000000` on TP 1 promised 1.8 × 10^15 tokens.
#[test]
fn parallel_sizes_no_host_has_are_refused_by_name() {
    let model = model("sizes", LLAMA_8B);
    let path = model.path();
    let cases = [
        ("tp 99999", "sglang --tp 99999", "99999"),
        ("tp 400M", "sglang --tp 400000000", "400000000"),
        ("dp 4G", "sglang --dp 4000000000", "4000000000"),
        ("vllm tp × pp", "vllm -tp 65536 -pp 65536", "65536"),
        ("vllm tp 2048", "vllm --tensor-parallel-size 2048", "1024"),
        (
            "base gpu id",
            "sglang --tp 8 --base-gpu-id 4294967295",
            "--base-gpu-id",
        ),
        (
            "gpu id step",
            "sglang --tp 8 --gpu-id-step 4000000000",
            "--gpu-id-step",
        ),
        (
            "dcp",
            "vllm -dcp 4000000000",
            "--decode-context-parallel-size",
        ),
        (
            "dcp not dividing tp",
            "vllm -tp 8 -dcp 3",
            "DCP must divide TP",
        ),
        ("nnodes", "sglang --tp 8 --nnodes 4000000000", "--nnodes"),
    ];
    for (what, line, named) in cases {
        assert_refused(what, &plan(&BOX, &serve(path, line)), named);
    }
    // What real deployments ask still plans.
    for (what, line) in [
        ("tp 8", "sglang --tp 8"),
        ("tp 16 over 2 nodes", "sglang --tp 16 --nnodes 2"),
        ("vllm dcp 8", "vllm -tp 8 -dcp 8"),
    ] {
        assert_planned(what, &plan(&BOX, &serve(path, line)));
    }
}

/// Token and host-tier amounts beyond any host, refused by name. Before:
/// `--max-model-len 18446744073709551615` and `--hicache-size` /
/// `--hicache-ratio 1e308` overflowed (a panic), `--kv-offloading-size
/// inf` was taken.
#[test]
fn token_and_host_tier_amounts_no_host_has_are_refused_by_name() {
    let model = model("amounts", LLAMA_8B);
    let path = model.path();
    let max = u64::MAX;
    let cases = [
        (
            "max model len",
            format!("vllm --max-model-len {max}"),
            "--max-model-len",
        ),
        (
            "context length",
            format!("sglang --context-length {max}"),
            "--context-length",
        ),
        (
            "block size",
            "vllm --block-size 4294967295".into(),
            "--block-size",
        ),
        (
            "page size",
            "sglang --page-size 4294967295".into(),
            "--page-size",
        ),
        (
            "hicache size",
            format!("sglang --enable-hierarchical-cache --hicache-size {max}"),
            "--hicache-size",
        ),
        (
            "hicache ratio",
            "sglang --enable-hierarchical-cache --hicache-ratio 1e308".into(),
            "--hicache-ratio",
        ),
        (
            "offloading inf",
            "vllm --kv-offloading-size inf".into(),
            "--kv-offloading-size",
        ),
    ];
    for (what, line, named) in cases {
        assert_refused(what, &plan(&BOX, &serve(path, &line)), named);
    }
    for (what, line) in [
        (
            "hicache 300 GB on TP 8",
            "sglang --tp 8 --enable-hierarchical-cache --hicache-size 300",
        ),
        ("offloading 100 GiB", "vllm --kv-offloading-size 100"),
    ] {
        assert_planned(what, &plan(&BOX, &serve(path, line)));
    }
}

/// A config.json whose numbers no model has: a string, a negative, a
/// fraction, 1e308, u64::MAX, 0 layers. Each is refused naming the field.
/// Before: `"num_key_value_heads": "8"` was read as absent (the default,
/// all 32 heads: four times the KV per token, silently), 0 layers gave
/// 60 billion tokens of 1 byte, and 1e15 layers or a u64::MAX head size
/// overflowed (a panic); a `total_size` of `"5"` was "no index".
#[test]
fn config_numbers_no_model_has_are_refused_by_name() {
    let with = |field: &str, value: &str| {
        let mut config: serde_json::Value = serde_json::from_str(LLAMA_8B).expect("json");
        config[field] = serde_json::from_str(value).expect("value");
        config.to_string()
    };
    let max = u64::MAX.to_string();
    let cases = [
        ("num_hidden_layers", "\"32\""),
        ("num_hidden_layers", "-32"),
        ("num_hidden_layers", "32.5"),
        ("num_hidden_layers", "0"),
        ("num_hidden_layers", "1e15"),
        ("num_hidden_layers", "1e308"),
        ("num_hidden_layers", max.as_str()),
        ("num_key_value_heads", "\"8\""),
        ("num_key_value_heads", "0"),
        ("num_attention_heads", max.as_str()),
        ("head_dim", max.as_str()),
        ("hidden_size", "1e19"),
        ("max_position_embeddings", max.as_str()),
    ];
    for (field, value) in cases {
        let model = model("numbers", &with(field, value));
        let what = format!("{field}: {value}");
        for command in [sglang(model.path(), &[]), vllm(model.path(), &[])] {
            assert_refused(&what, &plan(&BOX, &command), field);
        }
    }
    let rope = model(
        "rope",
        &with("rope_scaling", r#"{"rope_type": "yarn", "factor": 1e308}"#),
    );
    assert_refused(
        "rope factor",
        &plan(&BOX, &vllm(rope.path(), &[])),
        "rope_scaling.factor",
    );
    // MLA (Kimi-K2.5's nested text_config) with a u64::MAX rank.
    let kimi = std::fs::read_to_string("tests/fixtures/models/kimi-k2.5/config.json")
        .expect("kimi config");
    let mut config: serde_json::Value = serde_json::from_str(&kimi).expect("json");
    config["text_config"]["kv_lora_rank"] = serde_json::json!(u64::MAX);
    let mla = model("mla", &config.to_string());
    assert_refused(
        "kv_lora_rank",
        &plan(&BOX, &sglang(mla.path(), &["--tp", "8"])),
        "kv_lora_rank",
    );
    // A field written as null is absent, as the engines read it.
    let null = model("null", &with("q_lora_rank", "null"));
    assert_planned("q_lora_rank null", &plan(&BOX, &sglang(null.path(), &[])));
    // The checkpoint index's total size.
    for total in ["\"5\"", "-1", "1e308"] {
        let model = model("total", LLAMA_8B);
        std::fs::write(
            model.path().join("model.safetensors.index.json"),
            format!(r#"{{"metadata": {{"total_size": {total}}}, "weight_map": {{}}}}"#),
        )
        .expect("index");
        assert_refused(
            &format!("total_size {total}"),
            &plan(&["--gpu-memory", "80GiB"], &sglang(model.path(), &[])),
            "total_size",
        );
    }
}

/// `--from-log` a file that is not an engine's log: a line ending in the
/// letter a rank name starts with (`/proc/kallsyms`' `… T __pfx_disable_TSC`),
/// binary garbage. Read, no figure found, a plan. Before: a panic (exit
/// 101) that printed the line, garbage included, to the terminal.
#[test]
fn a_log_that_is_no_engine_s_is_read_without_a_panic() {
    let model = model("log", LLAMA_8B);
    let logs = dir("logs");
    let rank_letters = logs.path().join("letters.log");
    std::fs::write(
        &rank_letters,
        "ffffffff813119a0 T __pfx_disable_TSC\nwarmup DONE\n[TP0] ends with P\nTP\n",
    )
    .expect("log");
    // Deterministic bytes of every value, newlines among them.
    let garbage = logs.path().join("garbage.log");
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let bytes: Vec<u8> = (0..3 << 20)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    std::fs::write(&garbage, bytes).expect("garbage");
    for log in [&rank_letters, &garbage] {
        let flags = [
            "--gpu-memory",
            "80GiB",
            "--weights",
            "1GiB",
            "--from-log",
            log.to_str().expect("utf-8 path"),
        ];
        for command in [sglang(model.path(), &[]), vllm(model.path(), &[])] {
            assert_planned(&log.display().to_string(), &plan(&flags, &command));
        }
    }
}

/// `--from-log` with the log of the other engine, or a log in which one
/// start holds the lines of both (two servers writing to one file): refused,
/// naming what the log is. Before: a vLLM start's `Model loading took 14.99
/// GiB` became an SGLang plan's weights (exit 0), and two engines' lines
/// were mixed into one start's figures.
#[test]
fn a_log_of_the_other_engine_or_of_both_is_refused() {
    let model = model("engines", LLAMA_8B);
    let logs = dir("engines-logs");
    let vllm_log = logs.path().join("vllm.log");
    std::fs::write(
        &vllm_log,
        "(EngineCore_DP0 pid=1) INFO Model loading took 14.99 GiB memory and 3.1 seconds\n\
         (EngineCore_DP0 pid=1) INFO Available KV cache memory: 112.51 GiB\n\
         (EngineCore_DP0 pid=1) INFO GPU KV cache size: 921,696 tokens\n",
    )
    .expect("vllm log");
    let both = logs.path().join("both.log");
    std::fs::write(
        &both,
        "[2026-01-01 00:00:00 TP0] Load weight begin. avail mem=78.50 GB\n\
         (EngineCore_DP0 pid=1) INFO Model loading took 14.99 GiB memory and 3.1 seconds\n\
         [2026-01-01 00:00:09 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.42 GB, mem usage=15.08 GB.\n\
         [2026-01-01 00:00:10 TP0] KV Cache is allocated. #tokens: 413,000, K size: 25.21 GB, V size: 25.21 GB\n\
         (EngineCore_DP0 pid=1) INFO GPU KV cache size: 921,696 tokens\n",
    )
    .expect("both log");
    // The vLLM start was an H200's (112.51 GiB of KV cache at 0.92).
    let run = |log: &Path, command: &[String]| {
        let log = log.display().to_string();
        plan(&["--gpu-memory", "143771MiB", "--from-log", &log], command)
    };
    assert_refused(
        "a vLLM log for SGLang",
        &run(&vllm_log, &sglang(model.path(), &[])),
        "a vLLM log, and the command starts SGLang",
    );
    for command in [sglang(model.path(), &[]), vllm(model.path(), &[])] {
        assert_refused(
            "both engines",
            &run(&both, &command),
            "both SGLang and vLLM",
        );
    }
    // The right engine's log is read.
    let planned = run(&vllm_log, &vllm(model.path(), &[]));
    assert_planned("a vLLM log for vLLM", &planned);
    says(&planned.stdout, &["921,696"]);
}

/// A Hugging Face cache as the hub writes it (`refs/main` → a snapshot
/// whose config.json links to `../../blobs/HASH`), then broken or planted:
/// each is refused naming the file, never read in its place. Before:
/// `refs/main` holding `../../..`, a FIFO or /dev/zero was passed over for
/// the lone snapshot (exit 0, a config the ref did not name); a
/// config.json or snapshot linking outside the cache was read (exit 0); a
/// ref naming a missing snapshot said only "looked in models--org--m"; an
/// HF_HOME that this user cannot read was "not found".
#[test]
fn a_hugging_face_cache_that_leads_elsewhere_is_refused_by_name() {
    let home = dir("hf-home");
    let repo = home.path().join("hub/models--org--m");
    for sub in ["refs", "snapshots/abc", "blobs"] {
        std::fs::create_dir_all(repo.join(sub)).expect("cache dirs");
    }
    std::fs::write(repo.join("blobs/h1"), LLAMA_8B).expect("blob");
    let config = repo.join("snapshots/abc/config.json");
    std::os::unix::fs::symlink("../../blobs/h1", &config).expect("link");
    let main = repo.join("refs/main");
    std::fs::write(&main, "abc\n").expect("ref");
    let home_var = home.path().to_str().expect("utf-8 path").to_string();
    let run = |flags: &[&str]| {
        let mut command: Vec<String> = ["python3", "-m", "sglang.launch_server"]
            .map(String::from)
            .to_vec();
        command.extend(["--model-path", "org/m"].map(String::from));
        command.extend(flags.iter().map(|flag| flag.to_string()));
        plan_with(&BOX, &command, &[("HF_HOME", &home_var)])
    };
    assert_planned("the hub's own layout", &run(&[]));

    std::fs::write(&main, "../../..\n").expect("ref");
    assert_refused(
        "a ref climbing out",
        &run(&[]),
        "refs/main: names no commit",
    );
    std::fs::write(&main, "missing\n").expect("ref");
    assert_refused(
        "a ref to a missing snapshot",
        &run(&[]),
        "snapshots/missing/config.json",
    );
    std::fs::remove_file(&main).expect("ref");
    std::os::unix::fs::symlink("/dev/zero", &main).expect("ref link");
    assert_refused(
        "a ref to /dev/zero",
        &run(&[]),
        "refs/main: not a regular file",
    );
    std::fs::remove_file(&main).expect("ref");
    let fifo = std::ffi::CString::new(main.to_str().expect("utf-8")).expect("path");
    // SAFETY: mkfifo on a NUL-terminated path this test owns.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    assert_refused(
        "a ref that is a FIFO",
        &run(&[]),
        "refs/main: not a regular file",
    );
    std::fs::remove_file(&main).expect("ref");
    std::fs::write(&main, "abc\n").expect("ref");
    assert_refused(
        "a revision climbing out",
        &run(&["--revision", "../../../../etc"]),
        "--revision",
    );

    // A config.json, or a whole snapshot, that links outside the cache.
    let elsewhere = model("elsewhere", LLAMA_8B);
    std::fs::remove_file(&config).expect("config link");
    std::os::unix::fs::symlink(elsewhere.path().join("config.json"), &config).expect("link");
    assert_refused("a config linking outside", &run(&[]), "leads outside");
    std::fs::remove_file(&config).expect("config link");
    std::os::unix::fs::symlink("../../blobs/h1", &config).expect("link");
    std::os::unix::fs::symlink(elsewhere.path(), repo.join("snapshots/evil")).expect("link");
    std::fs::write(&main, "evil\n").expect("ref");
    assert_refused("a snapshot linking outside", &run(&[]), "leads outside");
    std::fs::write(&main, "abc\n").expect("ref");
    assert_planned("repaired", &run(&[]));

    // A cache this user cannot read (root's 0700 home, gpureap as nobody).
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod");
    std::fs::set_permissions(
        home.path().join("hub"),
        std::fs::Permissions::from_mode(0o700),
    )
    .expect("chmod");
    let output = Command::new(crate::harness::reachable_gpureap())
        .args(["plan", "--gpu-memory", "80GiB", "--weights", "1GiB", "--"])
        .args([
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "org/m",
        ])
        .env("HF_HOME", &home_var)
        .env_remove("GPUREAP_BACKEND")
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .output()
        .expect("gpureap runs as nobody");
    assert_refused(
        "a cache this user cannot read",
        &output.into(),
        "Permission denied",
    );
}

/// A path with a newline, an escape and a bidirectional override, named
/// as the model, `--model-config` or `--from-log`: the error is one line
/// with them written out. Before: the newline started a second line of
/// the error (the escapes were written out, the newline was not).
#[test]
fn an_error_quoting_a_hostile_path_stays_on_one_line() {
    let parent = dir("hostile-path");
    let hostile = parent.path().join("m\nFORGED \u{1b}[2J\u{202e}");
    std::fs::create_dir(&hostile).expect("hostile dir");
    std::fs::write(hostile.join("config.json"), "{}").expect("config");
    let hostile_text = hostile.display().to_string();
    let missing_config = format!("{hostile_text}/zz");
    let missing_log = format!("{hostile_text}/log");
    let good = model("good-path", LLAMA_8B);
    let cases: Vec<(&str, Vec<&str>, Vec<String>)> = vec![
        ("model", BOX.to_vec(), sglang(&hostile, &[])),
        (
            "missing model",
            BOX.to_vec(),
            sglang(hostile.join("x"), &[]),
        ),
        (
            "--model-config",
            [&BOX[..], &["--model-config", missing_config.as_str()]].concat(),
            sglang(good.path(), &[]),
        ),
        (
            "--from-log",
            [&BOX[..], &["--from-log", missing_log.as_str()]].concat(),
            sglang(good.path(), &[]),
        ),
    ];
    for (what, flags, command) in cases {
        let result = plan(&flags, &command);
        assert_refused(what, &result, "m\\nFORGED \\u{1b}[2J\\u{202e}");
        assert!(
            !result.stderr.contains('\u{1b}') && !result.stderr.contains('\u{202e}'),
            "{what}: {}",
            result.stderr
        );
    }
}

/// `plan -H` where the host's gpureap is older than this one (no `plan`
/// command; its argument parser says `error: unrecognized subcommand
/// 'plan'`, a usage, then "For more information, try '--help'."): the
/// host is named as having an older gpureap. Before:
/// "h1: For more information, try '--help'.", the one line of its answer
/// that says nothing of the host.
#[test]
fn plan_on_a_host_whose_gpureap_is_older_says_so() {
    use crate::sshd_lab::{Kind, Lab};
    let lab = Lab::new(&[Kind::Up]);
    // The old gpureap's answer to `plan`, as clap writes it; anything else
    // it runs as this build.
    let staged = lab.on(
        "h1",
        &format!(
            r#"cat > /usr/local/old-gpureap <<'END'
#!/bin/sh
if [ "$1" = plan ]; then
  printf "error: unrecognized subcommand 'plan'\n\nUsage: gpureap [OPTIONS] <COMMAND>\n\nFor more information, try '--help'.\n" >&2
  exit 2
fi
exec {} "$@"
END
chmod 755 /usr/local/old-gpureap"#,
            env!("CARGO_BIN_EXE_gpureap")
        ),
    );
    assert_eq!(staged.code, 0, "{}", staged.stderr);
    let model = model("fleet", LLAMA_8B);
    let model_path = model.path().to_str().expect("utf-8 path");
    let mut args = vec!["plan", "-H", "h1", "--remote-bin", "/usr/local/old-gpureap"];
    args.extend(BOX);
    args.extend([
        "--",
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
    ]);
    args.push(model_path);
    let old = lab.run_as_given(&args);
    assert_eq!(old.code, 2, "{}{}", old.stdout, old.stderr);
    assert!(
        old.stdout
            .contains("h1: its gpureap has no `plan` command: it is older than this one"),
        "{}{}",
        old.stdout,
        old.stderr
    );
    // The same host with this build plans.
    args[4] = env!("CARGO_BIN_EXE_gpureap");
    let current = lab.run_as_given(&args);
    assert_eq!(current.code, 0, "{}{}", current.stdout, current.stderr);
    says(&current.stdout, &["h1: fits now"]);
}

/// CUDA_VISIBLE_DEVICES that repeats a GPU (`0,0`, `01,1`, a UUID twice):
/// CUDA stops at the repeat, so a TP-2 engine sees one GPU; the refusal
/// quotes the variable as it was set. Before: `0,0` planned TP 2 on GPU 0
/// twice (exit 0, one GPU's memory counted as two ranks'), and `0,,1` was
/// quoted as "0", which is not what the user set.
#[test]
fn cuda_visible_devices_repeating_a_gpu_makes_it_visible_once() {
    use gpureap_core::driver::sim::incident::SimHost;
    let host = SimHost::new(4, 80 * (1 << 30), "Simulated H100").expect("sim host");
    let model = model("visible", LLAMA_8B);
    let run = |visible: &str| -> Run {
        crate::harness::gpureap(&host)
            .args(["plan", "--weights", "1GiB", "--"])
            .args(sglang(model.path(), &["--tp", "2"]))
            .env("CUDA_VISIBLE_DEVICES", visible)
            .output()
            .expect("gpureap runs")
            .into()
    };
    for visible in [
        "0,0",
        "01,1",
        "2,2,3",
        "0,,1",
        "GPU-sim-00000001,GPU-sim-00000001",
    ] {
        let result = run(visible);
        assert_refused(
            visible,
            &result,
            &format!("CUDA_VISIBLE_DEVICES {visible:?}"),
        );
        says(&result.stderr, &["only 1 visible"]);
    }
    for visible in ["1,2", "3,2", "GPU-sim-00000003,GPU-sim-00000000"] {
        assert_planned(visible, &run(visible));
    }
}

/// `--avg-prompt` and `--avg-output` of u64::MAX: refused (exit 2) by the
/// flag's own check. The largest taken, with `--concurrency` as large,
/// plans. Before: the two added up past u64::MAX (a panic, exit 101).
#[test]
fn request_sizes_beyond_any_server_are_refused_not_overflowed() {
    let model = model("averages", LLAMA_8B);
    let max = u64::MAX.to_string();
    let flags = [&BOX[..], &["--avg-prompt", &max, "--avg-output", &max]].concat();
    let result = plan(&flags, &sglang(model.path(), &[]));
    assert_eq!(result.code, 2, "{}{}", result.stdout, result.stderr);
    says(&result.stderr, &["--avg-prompt"]);
    assert!(!result.stderr.contains("panicked"), "{}", result.stderr);
    let largest = (1u64 << 40).to_string();
    let flags = [
        &BOX[..],
        &[
            "--avg-prompt",
            &largest,
            "--avg-output",
            &largest,
            "--concurrency",
            &largest,
        ],
    ]
    .concat();
    assert_planned("the largest", &plan(&flags, &sglang(model.path(), &[])));
}

/// A config.json, `--model-config` or safetensors file that is not a small
/// regular file of JSON: refused by what it is, unread, at once.
#[test]
fn a_config_that_is_not_a_small_regular_file_is_refused_unread() {
    // How to make the file, what the error says (a directory given to
    // --model-config means its config.json, which is not there).
    type Make = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Make, &str)> = vec![
        (
            "a link to /dev/zero",
            Box::new(|path| std::os::unix::fs::symlink("/dev/zero", path).expect("link")),
            "not a regular file",
        ),
        (
            "a FIFO",
            Box::new(|path| {
                let fifo = std::ffi::CString::new(path.to_str().expect("utf-8")).expect("path");
                // SAFETY: mkfifo on a NUL-terminated path this test owns.
                assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
            }),
            "not a regular file",
        ),
        (
            "a directory",
            Box::new(|path| std::fs::create_dir(path).expect("dir")),
            "not a regular file",
        ),
        (
            "2 GB",
            Box::new(|path| {
                std::fs::File::create(path)
                    .and_then(|file| file.set_len(2_000_000_000))
                    .expect("sparse file")
            }),
            "larger than 4 MiB",
        ),
        (
            "nested 100,000 deep",
            Box::new(|path| {
                let text = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
                std::fs::write(path, text).expect("nested")
            }),
            "recursion limit",
        ),
    ];
    for (what, make, said) in cases {
        let parent = dir("config-kind");
        let config = parent.path().join("config.json");
        make(&config);
        assert_refused(what, &plan(&BOX, &sglang(parent.path(), &[])), said);
        let config_text = config.display().to_string();
        let said = if what == "a directory" {
            "No such file"
        } else {
            said
        };
        assert_refused(
            what,
            &plan(
                &[&BOX[..], &["--model-config", &config_text]].concat(),
                &sglang(Path::new("org/unused"), &[]),
            ),
            said,
        );
    }
    // Safetensors headers: one claiming 2^63 bytes, one cut short.
    for (header, said) in [
        (
            [&(1u64 << 63).to_le_bytes()[..], b"{}"].concat(),
            "not plausible",
        ),
        (
            [&100u64.to_le_bytes()[..], b"{\"x\":"].concat(),
            "not plausible",
        ),
        (vec![1, 2, 3], "no safetensors header"),
    ] {
        let model = model("safetensors", LLAMA_8B);
        std::fs::write(model.path().join("model.safetensors"), header).expect("header");
        assert_refused(
            said,
            &plan(&["--gpu-memory", "80GiB"], &sglang(model.path(), &[])),
            said,
        );
    }
}

/// Sizes up to what `--gpu-memory`, `--weights` and `--kv-memory` take
/// (16777215T, just under 2^64 bytes), on TP 1 and on the 1,024 GPUs a
/// host may have, each lever computed: a plan, never an overflow. Before:
/// the more-GPUs lever multiplied the weights by the old TP (a panic), and
/// the DP-attention lever added the replicated weights past u64::MAX.
#[test]
fn sizes_near_the_largest_taken_plan_without_overflow() {
    let model = model("largest", LLAMA_8B);
    let big = "16777215T";
    let boxes: [&[&str]; 3] = [
        &["--gpu-memory", big, "--weights", big, "--kv-memory", big],
        &["--gpu-memory", big, "--weights", "1", "--gpu-free", big],
        &["--gpu-memory", "1", "--weights", big],
    ];
    for flags in boxes {
        for tp in ["1", "1024"] {
            for command in [
                sglang(model.path(), &["--tp", tp]),
                vllm(model.path(), &["-tp", tp]),
            ] {
                let what = format!("{flags:?} TP {tp} {}", command[0]);
                let flags = [flags, &["--avg-output", "4100", "--concurrency", "150"]].concat();
                assert_planned(&what, &plan(&flags, &command));
            }
        }
    }
}

/// A KV pool given by size larger than the GPU (vLLM's
/// `--kv-cache-memory-bytes 1T`, or `--kv-memory 1000T` on an 80 GiB
/// box): the engine allocates it as given and runs out of memory, so the
/// plan does not fit (exit 4). Before: "fits now" (exit 0) with a pool of
/// 1,000 TiB per GPU.
#[test]
fn a_kv_pool_given_larger_than_the_gpu_does_not_fit() {
    let model = model("kv-given", LLAMA_8B);
    let cases: [(&str, Vec<&str>, Vec<String>); 3] = [
        (
            "vLLM --kv-cache-memory-bytes 1T",
            BOX.to_vec(),
            vllm(model.path(), &["--kv-cache-memory-bytes", "1T"]),
        ),
        (
            "SGLang --kv-memory 1000T",
            [&BOX[..], &["--kv-memory", "1000T"]].concat(),
            sglang(model.path(), &[]),
        ),
        (
            "vLLM --kv-memory 80GiB beside the weights",
            [&BOX[..], &["--kv-memory", "80GiB"]].concat(),
            vllm(model.path(), &["--max-model-len", "8192"]),
        ),
    ];
    for (what, flags, command) in cases {
        let result = plan(&flags, &command);
        assert_eq!(result.code, 4, "{what}: {}{}", result.stdout, result.stderr);
        assert!(
            result.stdout.contains("does not start"),
            "{what}: {}",
            result.stdout
        );
    }
    // A pool that fits beside the weights is taken as given.
    let fits = plan(
        &[&BOX[..], &["--kv-memory", "10GiB"]].concat(),
        &sglang(model.path(), &[]),
    );
    assert_eq!(fits.code, 0, "{}{}", fits.stdout, fits.stderr);
}

/// A checkpoint index of 60 MiB (its cap is 64) and a safetensors header
/// of 90 MB (the format's cap is 100), both made of millions of tiny
/// values, read in a 512 MiB address space: only the fields used are built
/// (`total_size`; each tensor's dtype, shape and offsets, summed as the
/// header is parsed). Before: each became a JSON tree ten times its size,
/// and gpureap, which runs as root on whatever model directory it is
/// given, failed to allocate (aborted).
#[test]
fn a_huge_index_or_header_costs_about_its_size() {
    let bounded = |model: &Path| -> Run {
        within_512_mib(&mut Command::new(env!("CARGO_BIN_EXE_gpureap")))
            .args(["plan", "--gpu-memory", "80GiB", "--"])
            .args(sglang(model, &[]))
            .env_remove("GPUREAP_BACKEND")
            .stdin(Stdio::null())
            .output()
            .expect("gpureap runs")
            .into()
    };
    let index = model("huge-index", LLAMA_8B);
    let mut text = String::from(r#"{"metadata": {"total_size": 16060522496}, "x": ["#);
    while text.len() < 60 << 20 {
        text.push_str("[],");
    }
    text.push_str("[]]}");
    std::fs::write(index.path().join("model.safetensors.index.json"), text).expect("index");
    let result = bounded(index.path());
    assert_planned("a 60 MiB index", &result);
    says(&result.stdout, &["16.0 GiB"]);

    let header = model("huge-header", LLAMA_8B);
    let mut json = String::from("{");
    let mut count = 0u64;
    while json.len() < 90_000_000 {
        json.push_str(&format!(r#""t{count}":{{"data_offsets":[0,2]}},"#));
        count += 1;
    }
    json.push_str(r#""__metadata__":{"format":"pt"}}"#);
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(json.as_bytes());
    std::fs::write(header.path().join("model.safetensors"), file).expect("header");
    let result = bounded(header.path());
    assert_planned("a 90 MB header", &result);
}

/// A 100 KB argument (the engine's program, a flag's value, the model)
/// in an error: quoted cut to 200 characters, one line. Before: echoed
/// whole, a 100 KB line on stderr.
#[test]
fn a_huge_argument_is_quoted_cut_in_the_error() {
    let huge = "9".repeat(100_000);
    let model = model("huge-arg", LLAMA_8B);
    let missing = format!("/{}", "m".repeat(100_000));
    let cases: [(&str, Vec<String>, &str); 3] = [
        (
            "unknown engine",
            vec!["python3".to_string(), huge.clone()],
            "unknown engine command",
        ),
        ("--tp", sglang(model.path(), &["--tp", &huge]), "--tp"),
        ("model", sglang(Path::new(&missing), &[]), "not found"),
    ];
    for (what, command, named) in cases {
        let result = plan(&BOX, &command);
        assert_refused(what, &result, named);
        assert!(result.stderr.contains("\"…"), "{what}: {}", result.stderr);
        assert!(
            result.stderr.len() < 1000,
            "{what}: {} bytes",
            result.stderr.len()
        );
    }
}

/// The pool in the JSON of a plan on the box, and its weights.
fn planned_pool(flags: &[&str], command: &[String]) -> (u64, u64, serde_json::Value) {
    let result = plan(&[flags, &["--json"]].concat(), command);
    assert_planned_json(&result);
    let report: serde_json::Value = serde_json::from_str(&result.stdout).expect("json");
    let tokens = report["device_clean"]["tokens_per_rank"]
        .as_u64()
        .expect("tokens");
    let weights = report["budget"]["weights_per_gpu"]
        .as_u64()
        .expect("weights");
    (tokens, weights, report)
}

fn assert_planned_json(result: &Run) {
    assert!(
        (0..=4).contains(&result.code) && result.code != 2,
        "exit {}\n{}{}",
        result.code,
        result.stdout,
        result.stderr
    );
}

/// Flags that change the pool are modelled, or said to be able to; what
/// the engine's parser refuses is refused. Before: vLLM
/// `--num-gpu-blocks-override 100` (1,600 tokens) was planned as 455,808;
/// `--cpu-offload-gb` was ignored; `--quantization` and `--torchao-config`
/// were "not understood, they do not change the pool"; `--tp-size` to
/// vLLM and `--gpu-memory-utilization` to SGLang, which their parsers
/// refuse, got "fits now".
#[test]
fn flags_that_change_the_pool_are_modelled_or_said_and_foreign_ones_refused() {
    let model = model("pool-flags", LLAMA_8B);
    let gpu = ["--gpu-memory", "80GiB"];
    let index = r#"{"metadata": {"total_size": 16060522496}, "weight_map": {}}"#;
    std::fs::write(model.path().join("model.safetensors.index.json"), index).expect("index");

    let (tokens, _, _) = planned_pool(
        &gpu,
        &vllm(model.path(), &["--num-gpu-blocks-override", "100"]),
    );
    assert_eq!(tokens, 1_600, "100 blocks of 16");

    for (what, command) in [
        ("vLLM", vllm(model.path(), &[])),
        ("SGLang", sglang(model.path(), &[])),
    ] {
        let (_, weights, _) = planned_pool(&gpu, &command);
        let offload = |gib: &str| {
            let mut command = command.clone();
            command.extend(["--cpu-offload-gb".to_string(), gib.to_string()]);
            planned_pool(&gpu, &command).1
        };
        assert_eq!(weights - offload("4"), 4 << 30, "{what}");
        assert_eq!(offload("4000"), 0, "{what}: all of it offloaded");
    }

    for (what, line, flag) in [
        (
            "vLLM --quantization",
            "vllm --quantization fp8",
            "--quantization fp8",
        ),
        (
            "SGLang --torchao-config",
            "sglang --torchao-config int4wo-128",
            "--torchao-config int4wo-128",
        ),
    ] {
        let result = plan(&gpu, &serve(model.path(), line));
        assert_planned(what, &result);
        assert!(
            result.stdout.contains(&format!(
                "Not modelled (they may change the pool: the plan is as without them; docs/plan.md lists what is read): {flag}"
            )),
            "{what}: {}",
            result.stdout
        );
        assert!(!result.stdout.contains("do not change the pool"), "{what}");
    }

    let refused = [
        ("--tp-size to vLLM", "vllm --tp-size 2", "--tp-size"),
        (
            "--gpu-memory-utilization to SGLang",
            "sglang --gpu-memory-utilization 0.9",
            "not a flag of SGLang 0.5.9 (it is vLLM's)",
        ),
        (
            "--num-gpu-blocks-override abc",
            "vllm --num-gpu-blocks-override abc",
            "--num-gpu-blocks-override",
        ),
        (
            "--cpu-offload-gb -1",
            "vllm --cpu-offload-gb=-1",
            "--cpu-offload-gb",
        ),
        (
            "SGLang --cpu-offload-gb 1.5 (an int there)",
            "sglang --cpu-offload-gb 1.5",
            "--cpu-offload-gb",
        ),
    ];
    for (what, line, named) in refused {
        assert_refused(what, &plan(&gpu, &serve(model.path(), line)), named);
    }
}

/// A log whose figures no start logs together is refused naming its line.
/// Before: a vLLM log whose `Available KV cache memory` is more than its
/// start requested (a log of another GPU, or forged) clamped the non-KV
/// memory to 0 ("fits now" with the whole GPU as KV); SGLang's `mem
/// usage=-16.00 GB` became 0 GiB of weights, `#tokens` of 10^17 was taken.
#[test]
fn a_log_whose_figures_contradict_each_other_is_refused_naming_the_line() {
    let model = model("bad-logs", LLAMA_8B);
    let logs = dir("bad-logs-files");
    let write = |name: &str, text: &str| {
        let path = logs.path().join(name);
        std::fs::write(&path, text).expect("log");
        path.display().to_string()
    };
    let begin = "[2026-01-01 00:00:00 TP0] Load weight begin. avail mem=78.00 GB\n";
    let end = |usage: &str| {
        format!(
            "[2026-01-01 00:00:09 TP0] Load weight end. type=LlamaForCausalLM, avail mem=62.00 GB, mem usage={usage} GB.\n"
        )
    };
    let kv = |tokens: &str, size: &str| {
        format!(
            "[2026-01-01 00:00:10 TP0] KV Cache is allocated. #tokens: {tokens}, KV size: {size} GB\n"
        )
    };
    let refused = |what: &str, log: &str, command: &[String], named: &str| {
        let result = plan(&["--gpu-memory", "80GiB", "--from-log", log], command);
        assert_refused(what, &result, named);
    };
    refused(
        "vLLM: more KV than its start requested",
        &write(
            "vllm.log",
            "(EngineCore_DP0 pid=1) INFO Model loading took 14.99 GiB memory and 3.1 seconds\n\
             (EngineCore_DP0 pid=1) INFO Available KV cache memory: 120.00 GiB\n\
             (EngineCore_DP0 pid=1) INFO GPU KV cache size: 982,768 tokens\n",
        ),
        &vllm(model.path(), &[]),
        "line 2 (\"(EngineCore_DP0 pid=1) INFO Available KV cache memory: 120.00 GiB\"): 120.00 GiB of KV cache",
    );
    // SGLang's: the weights' `mem usage`, then the pool's tokens and size.
    let sglang_logs = [
        (
            "a negative mem usage",
            "-16.00",
            "400000",
            "50.00",
            "line 2 (",
        ),
        (
            "10^17 tokens",
            "16.00",
            "99999999999999999",
            "50.00",
            "line 3 (",
        ),
        (
            "more KV than was left after the weights",
            "16.00",
            "400000",
            "70.00",
            "more than the 62.00 GiB left after the weights",
        ),
    ];
    for (n, (what, usage, tokens, size, named)) in sglang_logs.into_iter().enumerate() {
        let text = format!("{begin}{}{}", end(usage), kv(tokens, size));
        let log = write(&format!("sglang-{n}.log"), &text);
        refused(
            &format!("SGLang: {what}"),
            &log,
            &sglang(model.path(), &[]),
            named,
        );
    }
    // A log missing figures says which, and what the plan takes instead.
    let partial = write(
        "partial.log",
        "(EngineCore_DP0 pid=1) INFO Available KV cache memory: 50.00 GiB\n",
    );
    let result = plan(
        &[&BOX[..], &["--from-log", &partial]].concat(),
        &vllm(model.path(), &[]),
    );
    assert_planned("a partial log", &result);
    for said in [
        "missing: \"Model loading took\": the weights are not the start's",
        "missing: \"Desired GPU memory utilization\"",
        "missing: \"GPU KV cache size\": nothing to check the prediction against",
        "missing: \"Chunked prefill is enabled with max_num_batched_tokens\": the start is taken to have run at the command's batch limit",
        "missing: \"non-default args\": the start is taken to have run with the command's --max-num-seqs, --enforce-eager and TP",
    ] {
        assert!(result.stdout.contains(said), "{said}: {}", result.stdout);
    }
}

/// What a plan says where it said something else. Before: "the weights
/// are larger than the GPU" for `--gpu-free 0`; "raise the fraction" with
/// `--kv-memory`; "0 tokens … 55.6 GiB of KV" for a pool that does not
/// start; "× 1 rank" at TP 8; the DP-attention lever cutting Llama-70B's
/// pool 40-fold listed as any other; a 100 KB flag repeated whole in the
/// "Not understood" line; a model directory without an index refused
/// where its config gives the weights' shapes.
#[test]
fn a_plan_says_what_it_means() {
    let llama = model("messages", LLAMA_8B);
    // Nothing free at start: no pool on either engine.
    let no_free = [
        "--gpu-memory",
        "80GiB",
        "--gpu-free",
        "0",
        "--weights",
        "16GiB",
    ];
    let free_none = plan(&no_free, &vllm(llama.path(), &[]));
    assert_eq!(free_none.code, 4, "{}", free_none.stdout);
    assert!(
        !free_none.stdout.contains("larger than the GPU") && free_none.stdout.contains("no pool: "),
        "{}",
        free_none.stdout
    );
    assert!(
        !free_none
            .stdout
            .contains("GiB of KV per rank, page 16: refuses"),
        "{}",
        free_none.stdout
    );
    let sglang_none = plan(&no_free, &sglang(llama.path(), &[]));
    assert_eq!(sglang_none.code, 4, "{}", sglang_none.stdout);
    says(
        &sglang_none.stdout,
        &["does not start: the weights are larger than the free memory at start"],
    );

    let given = plan(
        &[
            "--gpu-memory",
            "80GiB",
            "--weights",
            "16GiB",
            "--kv-memory",
            "1KiB",
        ],
        &sglang(llama.path(), &[]),
    );
    assert_eq!(given.code, 4, "{}", given.stdout);
    assert!(
        !given.stdout.contains("raise the fraction"),
        "{}",
        given.stdout
    );

    let seventy = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/llama-3.1-70b");
    let tp8 = plan(
        &["--gpu-memory", "81559MiB"],
        &sglang(&seventy, &["--tp", "8"]),
    );
    assert_planned("Llama-70B TP 8", &tp8);
    assert!(
        tp8.stdout.contains(
            "tokens per rank × 1 pool of 8 TP ranks (each holds every token of its pool)"
        ),
        "{}",
        tp8.stdout
    );
    let lever = tp8
        .stdout
        .lines()
        .find(|line| line.trim_start().starts_with("dp_attention"))
        .unwrap_or_else(|| panic!("no DP-attention lever: {}", tp8.stdout));
    assert!(lever.contains("WORSE than without it"), "{lever}");

    let huge = format!("--some-future-flag={}", "9".repeat(100_000));
    let long = plan(&BOX, &sglang(llama.path(), &[&huge]));
    assert_planned("a 100 KB flag", &long);
    let line = long
        .stdout
        .lines()
        .find(|line| line.starts_with("Not modelled"))
        .expect("the flag listed");
    assert!(line.len() < 600, "{} bytes", line.len());

    // Config shapes without an index: the weights estimated, and said so.
    let shaped = model(
        "no-index",
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
            "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}"#,
    );
    let estimated = plan(&["--gpu-memory", "80GiB"], &vllm(shaped.path(), &[]));
    assert_planned("no index", &estimated);
    // Llama-3.1-8B has 8.03 × 10^9 weights: 14.96 GiB in bf16.
    says(
        &estimated.stdout,
        &["weights           15.0 GiB  (ESTIMATE from config.json"],
    );
}

/// Anyone's text inside plan's errors is written out once, by the one rule
/// (`units::one_line`). Before: a safetensors tensor named `x` newline `y`
/// was quoted `"x\\ny"` (escaped, then escaped again by `{:?}`).
#[test]
fn a_tensor_name_in_an_error_is_written_out_once() {
    let model = model("tensor-name", LLAMA_8B);
    let json = r#"{"x\ny":{"dtype":"Q9"}}"#;
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(json.as_bytes());
    std::fs::write(model.path().join("model.safetensors"), file).expect("header");
    let result = plan(&["--gpu-memory", "80GiB"], &sglang(model.path(), &[]));
    assert_refused(
        "a tensor without dtype",
        &result,
        r#"tensor "x\ny" has no readable dtype"#,
    );
}

/// A model directory whose name holds characters a terminal shows nothing
/// of (a zero-width joiner, U+2066, U+FEFF, the tag character U+E0041):
/// the plan's report and its errors write each one out, so that the path
/// read is the path there. Before: all four reached the terminal raw.
#[test]
fn a_path_with_invisible_characters_is_written_out() {
    const INVISIBLE: [char; 4] = ['\u{200d}', '\u{2066}', '\u{feff}', '\u{e0041}'];
    let parent = dir("invisible-path");
    let name = "m\u{200d}x\u{2066}y\u{feff}z\u{e0041}";
    let written = "m\\u{200d}x\\u{2066}y\\u{feff}z\\u{e0041}";
    let planned = parent.path().join(name);
    std::fs::create_dir(&planned).expect("model dir");
    std::fs::write(planned.join("config.json"), LLAMA_8B).expect("config");
    let empty = parent.path().join(format!("{name}-empty"));
    std::fs::create_dir(&empty).expect("empty model dir");
    std::fs::write(empty.join("config.json"), "{}").expect("config");

    let result = plan(&BOX, &sglang(&planned, &[]));
    assert_planned("invisible path", &result);
    assert!(
        !result.stdout.contains(INVISIBLE) && !result.stderr.contains(INVISIBLE),
        "{:?}{:?}",
        result.stdout,
        result.stderr
    );
    assert!(
        result.stdout.contains(&format!("{written}/config.json")),
        "{}",
        result.stdout
    );
    for (what, command) in [
        ("config without fields", sglang(&empty, &[])),
        ("missing model", sglang(planned.join("gone"), &[])),
    ] {
        let result = plan(&BOX, &command);
        assert_refused(what, &result, written);
        assert!(
            !result.stderr.contains(INVISIBLE),
            "{what}: {:?}",
            result.stderr
        );
    }
}
