//! `gpureap run --plan` on the simulated driver, with a fake SGLang
//! (tests/fake_engine: `python3 -m sglang.launch_server`, which records that
//! it started and logs SGLang's KV-cache line): nothing is started while a
//! holder's memory would shrink the server's pool, `--wait-for-fit` starts
//! it once the holder is gone, `--accept-shrink` starts it anyway, and once
//! ready the engine's logged capacity is shown against the plan in the
//! events, the state directory and the metrics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};
use serde_json::Value;

use crate::exporter::{http, samples, value};
use crate::harness::*;
use crate::plan_fixture::{llama_8b_in, sglang};
use crate::run::Supervisor;

struct Box {
    host: SimHost,
    model: PathBuf,
    /// The fake engine appends its PID here when it starts.
    started: PathBuf,
    state: PathBuf,
}

impl Box {
    fn new() -> Box {
        let host = SimHost::new(2, 80 * GIB, "Simulated H100").expect("sim host");
        let model = llama_8b_in(host.path());
        let started = host.path().join("engine-started");
        let state = host.path().join("state");
        Box {
            host,
            model,
            started,
            state,
        }
    }

    /// The engine's command line: SGLang on GPU 0.
    fn engine(&self) -> Vec<String> {
        sglang(&self.model, &["--tp", "1"])
    }

    fn with_engine_env(&self, command: &mut Command, tokens: u64) {
        command
            .env(
                "PYTHONPATH",
                format!("{}/tests/fake_engine", env!("CARGO_MANIFEST_DIR")),
            )
            .env("FAKE_ENGINE_STARTED", &self.started)
            .env("FAKE_ENGINE_TOKENS", tokens.to_string())
            .env("CUDA_VISIBLE_DEVICES", "0")
            .env_remove("HF_HUB_CACHE")
            .env_remove("HF_HOME");
    }

    /// `gpureap plan --json` for the engine's command line, as run would plan it.
    fn plan(&self) -> (i32, Value) {
        let mut command = gpureap(&self.host);
        command
            .arg("plan")
            .arg("--json")
            .arg("--")
            .args(self.engine());
        self.with_engine_env(&mut command, 0);
        let ran: Run = command.output().expect("plan runs").into();
        (ran.code, ran.json())
    }

    /// `gpureap run --plan FLAGS -- ENGINE`, the engine logging `tokens`.
    fn run(&self, flags: &[&str], tokens: u64) -> Supervisor {
        let mut command = gpureap(&self.host);
        command
            .arg("run")
            .arg("--plan")
            .args(["--ready-log", "fired up and ready"])
            .args(["--state-dir", self.state.to_str().expect("utf-8")])
            .args(["--grace", "500ms", "--stop-timeout", "10s"])
            .args(["--restart", "never"])
            .args(flags)
            .arg("--")
            .args(self.engine());
        self.with_engine_env(&mut command, tokens);
        Supervisor::start(command)
    }

    fn engine_started(&self) -> bool {
        self.started.exists()
    }

    /// A notebook-like process with `bytes` on GPU 0.
    fn holder(&self, incident: &mut Incident, bytes: u64) -> u32 {
        incident
            .holder(&Holder::new("python3 -m ipykernel_launcher").on(0, bytes))
            .expect("holder")
    }
}

/// Waits for a `run --plan` that must refuse to end on its own, at most
/// 30 s: one that started the server would serve on (and is then stopped
/// by the supervisor's drop).
fn refused(mut supervisor: Supervisor) -> (i32, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = supervisor.child.try_wait().expect("gpureap") {
            crate::run::nothing_supervised_left(supervisor.child.id());
            return (status.code().unwrap_or(-1), supervisor.events());
        }
        assert!(
            Instant::now() < deadline,
            "gpureap run did not refuse: it runs on:\n{}",
            supervisor.events().join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn run_plan_never_starts_the_server_while_a_holder_would_shrink_it() {
    let lab = Box::new();
    let mut incident = Incident::new(&lab.host);
    let holder = lab.holder(&mut incident, 10 * GIB);
    let (code, plan) = lab.plan();
    assert_eq!(code, 1, "plan: fits only after freeing: {plan:#}");
    assert_eq!(plan["fit"]["verdict"], "fits_after_free");

    let (code, events) = refused(lab.run(&[], 100_000));
    let text = events.join("\n");
    assert_eq!(code, 1, "refused, exit 1:\n{text}");
    assert!(
        !lab.engine_started(),
        "the engine was started while it would not fit:\n{text}"
    );
    let refusal = events
        .iter()
        .find(|line| line.contains("not starting:"))
        .unwrap_or_else(|| panic!("no refusal:\n{text}"));
    assert!(
        refusal.contains(&format!("pid {holder}")) && refusal.contains("costs every rank"),
        "the refusal names the holder and what it costs: {refusal}"
    );
    assert!(
        refusal.contains(&format!("gpureap free --gpu 0 --pid {holder}")),
        "and how to free it: {refusal}"
    );
    assert!(alive(holder), "nothing of the holder's was touched");
}

#[test]
fn run_plan_refuses_a_server_that_cannot_fit_even_on_clean_gpus() {
    let lab = Box::new();
    // The weights alone are larger than the GPU.
    std::fs::write(
        lab.model.join("model.safetensors.index.json"),
        r#"{"metadata": {"total_size": 200000000000}, "weight_map": {}}"#,
    )
    .expect("index");
    let (code, events) = refused(lab.run(&["--accept-shrink"], 100_000));
    let text = events.join("\n");
    assert_eq!(code, 4, "cannot fit: the plan's code:\n{text}");
    assert!(!lab.engine_started(), "started:\n{text}");
    assert!(text.contains("cannot fit on this hardware"), "{text}");
}

#[test]
fn run_plan_waits_for_fit_and_starts_once_the_holder_is_gone() {
    let lab = Box::new();
    let mut incident = Incident::new(&lab.host);
    let holder = lab.holder(&mut incident, 10 * GIB);
    let supervisor = lab.run(&["--wait-for-fit", "60s"], 100_000);
    supervisor.wait_for(
        "waiting up to 1m00s (--wait-for-fit) for the holders to go",
        1,
    );
    assert!(!lab.engine_started(), "started before the holder went");
    incident.kill(holder).expect("the holder ends");
    supervisor.wait_for("plan: fits after", 1);
    supervisor.wait_for("ready after", 1);
    assert!(lab.engine_started(), "the engine was not started");
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
}

#[test]
fn run_plan_wait_for_fit_times_out_with_nothing_started() {
    let lab = Box::new();
    let mut incident = Incident::new(&lab.host);
    let holder = lab.holder(&mut incident, 10 * GIB);
    let (code, events) = refused(lab.run(&["--wait-for-fit", "300ms"], 100_000));
    let text = events.join("\n");
    assert_eq!(code, 1, "timed out: exit 1:\n{text}");
    assert!(!lab.engine_started(), "started:\n{text}");
    assert!(
        text.contains("still not fitting after") && text.contains(&format!("pid {holder}")),
        "{text}"
    );
}

#[test]
fn run_plan_accept_shrink_starts_and_says_what_it_costs() {
    let lab = Box::new();
    let mut incident = Incident::new(&lab.host);
    let holder = lab.holder(&mut incident, 10 * GIB);
    let supervisor = lab.run(&["--accept-shrink"], 100_000);
    let line = supervisor.wait_for("starting anyway (--accept-shrink)", 1);
    assert!(
        line.contains(&format!("pid {holder}")) && line.contains("costs every rank"),
        "{line}"
    );
    supervisor.wait_for("ready after", 1);
    assert!(lab.engine_started());
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
    assert!(alive(holder));
}

#[test]
fn planned_against_logged_capacity_is_shown_recorded_and_served() {
    let lab = Box::new();
    let (code, plan) = lab.plan();
    assert_eq!(code, 0, "fits on the clean box: {plan:#}");
    let planned = plan["device"]["tokens_per_rank"]
        .as_u64()
        .expect("tokens per rank");
    // The engine logs 2% more than planned.
    let logged = planned + planned / 50;
    let supervisor = lab.run(&["--metrics", "127.0.0.1:0"], logged);
    let line = supervisor.wait_for("metrics: http://", 1);
    let address: SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|address| address.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line}"));
    let capacity = supervisor.wait_for("capacity:", 1);
    assert!(
        capacity.contains(&format!(
            "capacity: planned {planned} tokens per rank, the engine logged {logged} (+2.0%)"
        )),
        "{capacity}"
    );
    let recorded: Value = serde_json::from_str(
        &std::fs::read_to_string(lab.state.join("capacity.json")).expect("capacity.json"),
    )
    .expect("JSON");
    assert_eq!(recorded["planned_tokens_per_rank"], planned);
    assert_eq!(recorded["logged_tokens_per_rank"], logged);
    assert_eq!(recorded["engine"], "sglang");
    assert_eq!(recorded["start"], 1);
    let (status, body) = http(address, "GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200);
    let found = samples(&body);
    assert_eq!(
        value(&found, "gpureap_run_kv_tokens_planned", &[]),
        Some(planned as f64),
        "{body}"
    );
    assert_eq!(
        value(&found, "gpureap_run_kv_tokens_logged", &[]),
        Some(logged as f64),
        "{body}"
    );
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
}

#[test]
fn run_plan_refuses_a_command_it_cannot_plan_before_starting_anything() {
    let lab = Box::new();
    let mut command = gpureap(&lab.host);
    command
        .args(["run", "--plan", "--restart", "never"])
        .args(["--state-dir", lab.state.to_str().expect("utf-8")])
        .args(["--", "python3", "-m", "sglang.launch_server", "--tp", "1"]);
    lab.with_engine_env(&mut command, 1);
    let (code, events) = refused(Supervisor::start(command));
    let text = events.join("\n");
    assert_eq!(code, 2, "no model: bad input:\n{text}");
    assert!(!lab.engine_started(), "{text}");
    assert!(text.contains("names no model"), "{text}");
}

#[test]
fn without_plan_the_logged_capacity_is_said_and_recorded_alone() {
    let setup = crate::run::setup(2);
    let supervisor = setup.run(&[], &[]);
    // tests/fake_sglang.py logs 412345 tokens on each rank.
    let line = supervisor.wait_for("capacity:", 1);
    assert!(
        line.contains("capacity: the engine logged 412345 tokens per rank"),
        "{line}"
    );
    let recorded: Value = serde_json::from_str(
        &std::fs::read_to_string(setup.state.join("capacity.json")).expect("capacity.json"),
    )
    .expect("JSON");
    assert_eq!(recorded["planned_tokens_per_rank"], Value::Null);
    assert_eq!(recorded["logged_tokens_per_rank"], 412345);
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
}

/// A `vllm` on a PATH of its own: a stand-in that records that it started,
/// logs vLLM's KV-cache line with FAKE_ENGINE_TOKENS and its ready line.
/// Returns the PATH to give.
fn fake_vllm(lab: &Box) -> String {
    let bin = lab.host.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let vllm = bin.join("vllm");
    std::fs::write(
        &vllm,
        "#!/bin/sh\necho $$ >> \"$FAKE_ENGINE_STARTED\"\n\
         echo \"INFO 12-01 23:40:01 [kv_cache_utils.py:1087] GPU KV cache size: $FAKE_ENGINE_TOKENS tokens\"\n\
         echo 'INFO:     Application startup complete.'\nexec sleep 100000\n",
    )
    .expect("vllm");
    std::fs::set_permissions(&vllm, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn planned_against_logged_capacity_of_vllm() {
    let lab = Box::new();
    let path = fake_vllm(&lab);
    let engine = ["vllm", "serve", lab.model.to_str().expect("utf-8")];
    let mut plan = gpureap(&lab.host);
    plan.args(["plan", "--json", "--"]).args(engine);
    lab.with_engine_env(&mut plan, 0);
    let plan: Run = plan.output().expect("plan").into();
    assert_eq!(plan.code, 0, "{}{}", plan.stdout, plan.stderr);
    let planned = plan.json()["device"]["tokens_per_rank"]
        .as_u64()
        .expect("tokens");
    let logged = planned - planned / 100;
    let mut command = gpureap(&lab.host);
    command
        .args(["run", "--plan", "--restart", "never"])
        .args(["--ready-log", "Application startup complete"])
        .args(["--state-dir", lab.state.to_str().expect("utf-8")])
        .arg("--")
        .args(engine);
    lab.with_engine_env(&mut command, logged);
    command.env("PATH", &path);
    let supervisor = Supervisor::start(command);
    let line = supervisor.wait_for("capacity:", 1);
    assert!(
        line.contains(&format!(
            "capacity: planned {planned} tokens per rank, the engine logged {logged} (-1.0%)"
        )),
        "{line}"
    );
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
}

#[test]
fn run_plan_never_starts_vllm_while_a_holder_would_make_it_refuse_even_with_accept_shrink() {
    let lab = Box::new();
    let path = fake_vllm(&lab);
    let mut incident = Incident::new(&lab.host);
    // 10 GiB held: 70 GiB free, less than the 0.95 × 80 GiB vLLM asks for.
    let holder = lab.holder(&mut incident, 10 * GIB);
    for flags in [&[][..], &["--accept-shrink"][..]] {
        let mut command = gpureap(&lab.host);
        command
            .args(["run", "--plan", "--restart", "never"])
            .args(["--state-dir", lab.state.to_str().expect("utf-8")])
            .args(flags)
            .args(["--", "vllm", "serve", lab.model.to_str().expect("utf-8")])
            .args(["--gpu-memory-utilization", "0.95"]);
        lab.with_engine_env(&mut command, 1);
        command.env("PATH", &path);
        let (code, events) = refused(Supervisor::start(command));
        let text = events.join("\n");
        assert_eq!(code, 1, "{flags:?}: refused, exit 1:\n{text}");
        assert!(
            !lab.engine_started(),
            "{flags:?}: vLLM was started:\n{text}"
        );
        assert!(
            text.contains("vLLM refuses to start")
                && text.contains(&format!("pid {holder}"))
                && text.contains("alone stops the start"),
            "{flags:?}: {text}"
        );
    }
}

#[test]
fn a_stop_while_waiting_for_fit_ends_the_run_with_nothing_started() {
    let lab = Box::new();
    let mut incident = Incident::new(&lab.host);
    let holder = lab.holder(&mut incident, 10 * GIB);
    let supervisor = lab.run(&["--wait-for-fit", "10m"], 100_000);
    supervisor.wait_for("(--wait-for-fit) for the holders to go", 1);
    let started = Instant::now();
    let (code, events, _) = supervisor.stop();
    let text = events.join("\n");
    assert_eq!(code, 0, "stopped: exit 0:\n{text}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the stop took {:?}",
        started.elapsed()
    );
    assert!(!lab.engine_started(), "{text}");
    assert!(text.contains("nothing was started"), "{text}");
    assert!(alive(holder));
}

#[test]
fn the_plan_flags_need_plan_and_exclude_each_other() {
    let lab = Box::new();
    for flags in [
        &["--wait-for-fit", "1m"][..],
        &["--accept-shrink"][..],
        &["--plan", "--wait-for-fit", "1m", "--accept-shrink"][..],
        &["--plan", "--wait-for-fit", "soon"][..],
    ] {
        let mut command = gpureap(&lab.host);
        command
            .arg("run")
            .args(flags)
            .args(["--state-dir", lab.state.to_str().expect("utf-8")])
            .arg("--")
            .args(lab.engine());
        lab.with_engine_env(&mut command, 1);
        let ran: Run = command.output().expect("gpureap runs").into();
        assert_eq!(ran.code, 2, "{flags:?}: {}", ran.stderr);
        assert!(!lab.engine_started(), "{flags:?}");
        assert!(!lab.state.exists(), "{flags:?}: nothing made");
    }
}

/// A holder of 1 MiB (a stray context: 7 of the pool's 410,000 tokens)
/// is within `plan`'s tolerance (1% of the pool): the plan fits, and `run
/// --plan` starts the server, naming it. Before: exit 1, and `run --plan`
/// refused to start for 7 tokens.
#[test]
fn run_plan_starts_beside_a_holder_within_the_tolerance() {
    let lab = Box::new();
    let mut incident = Incident::new(&lab.host);
    let holder = lab.holder(&mut incident, 1 << 20);
    let (code, plan) = lab.plan();
    assert_eq!(code, 0, "plan: fits: {plan:#}");
    assert_eq!(plan["fit"]["verdict"], "fits");
    assert_eq!(plan["fit"]["holders"][0]["pid"], holder, "{plan:#}");
    let lost = plan["fit"]["holders"][0]["tokens_lost_per_rank"]
        .as_u64()
        .expect("tokens lost");
    assert!(lost > 0 && lost < 100, "{plan:#}");

    let supervisor = lab.run(&[], 100_000);
    supervisor.wait_for("plan: fits:", 1);
    supervisor.wait_for("ready after", 1);
    assert!(lab.engine_started(), "the engine was not started");
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
    assert!(alive(holder));
}

/// A host tier no host has (100 PB of HiCache a rank) is `plan`'s exit 4,
/// and `run --plan` says why and starts nothing. Before: the plan fitted
/// (the tier's "DOES NOT FIT" a line of its report) and the server was
/// started, to fail its allocation.
#[test]
fn run_plan_refuses_a_host_tier_the_host_cannot_allocate() {
    let lab = Box::new();
    let mut command = gpureap(&lab.host);
    command
        .arg("run")
        .arg("--plan")
        .args(["--ready-log", "fired up and ready"])
        .args(["--state-dir", lab.state.to_str().expect("utf-8")])
        .args(["--restart", "never"])
        .arg("--")
        .args(lab.engine())
        .args(["--enable-hierarchical-cache", "--hicache-size", "100000000"]);
    lab.with_engine_env(&mut command, 100_000);
    let (code, events) = refused(Supervisor::start(command));
    let text = events.join("\n");
    assert_eq!(code, 4, "{text}");
    assert!(!lab.engine_started(), "started:\n{text}");
    assert!(
        text.contains("the host tier does not fit this host's memory"),
        "{text}"
    );
}
