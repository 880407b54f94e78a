//! `gpureap demo`: the incident this project started from, both halves of
//! it, replayed on a simulated 8-GPU host.
//!
//! Before the restart, `gpureap plan` for the same launch command, on the
//! staged box: what the leftovers cost the new server per rank, and that it
//! fits once they are freed (the model's config.json is a small fixture the
//! demo writes into a Hugging Face cache of its own).
//!
//! An SGLang server with eight tensor-parallel workers crashes: its launcher
//! is SIGKILLed, its workers and its detokenizer live on, orphaned, holding
//! their memory, and one worker ignores SIGTERM. A colleague's notebook
//! shares GPU 3 and a metrics exporter watches every GPU, each in a session
//! of its own, as on a real box. The demo shows `status --tree`, frees the
//! server's GPU holders only, and then the second half: GPU 3 keeps memory
//! that no process holds (the driver kept it when its worker exited), which
//! gpureap names, with what to do next. It ends with what
//! `fuser -k /dev/nvidia*; sleep 5` would have done on the same host, listed
//! from the same /proc (nothing run), against what gpureap did.
//!
//! Real processes (the gpureap binary as stand-ins, `driver::sim::stand_in`),
//! real signals, real /proc: only the GPU driver is simulated. `--json`
//! prints the facts instead of the transcript, for scripts and the tests.

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use comfy_table::{Table, presets::NOTHING};
use serde::Serialize;
use serde_json::Value;

use crate::driver::sim::incident::{self, DETOKENIZER, Holder, Incident, LAUNCHER, MODEL, SimHost};
use crate::driver::{Driver, SimDriver};
use crate::exit::Exit;
use crate::plan::fit::{self, Cost, Outcome, PlanConfig, Verdict};
use crate::plan::render;
use crate::reap::{self, FreeReport, Options};
use crate::report;
use crate::select::{Guard, Scope};
use crate::signal::Sig;
use crate::snapshot::Snapshot;
use crate::units::{Bytes, Elapsed, GpuRanges};
use crate::verify::Reason;

mod containers;

const GIB: u64 = 1 << 30;
const GPUS: u32 = 8;
const GPU_NAME: &str = "NVIDIA H200 (simulated)";
const GPU_TOTAL: u64 = 141 * GIB;
/// A worker's context on its GPU (plus a quarter GiB per rank, so that the
/// GPUs can be told apart): SGLang's static memory fraction of an H200.
const WORKER: u64 = 118 * GIB;
/// The worker that ignores SIGTERM.
const STUBBORN: u32 = 2;
/// The GPU the notebook shares, and whose worker's memory the driver keeps.
const SHARED: u32 = 3;
const NOTEBOOK_MEMORY: u64 = 6 * GIB;
/// What the driver kept on GPU 3 in the incident: 92 (GiB, here).
const KEPT: u64 = 92 * GIB;
/// What the driver says about GPU 3 (docs/evidence.md): the kernel logged
/// an uncorrectable ECC error on it a minute and a half ago, and its
/// counters say the row was marked for remapping, which takes effect at the
/// next reset.
const XIDS: [(u32, u64, &str); 1] = [(
    48,
    95,
    "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
)];
const HEALTH: &str = "ecc_volatile_uncorrected 1\necc_aggregate_uncorrected 1\nretired_pages_pending no\nrow_remap_pending yes\nrow_remap_failure no\npersistence_mode on\n";
/// The driver's modules as /proc/modules lists them on a headless box:
/// nvidia_uvm used by the CUDA processes, no display on nvidia_drm.
const MODULES: &str = "nvidia_uvm 1892352 12 - Live 0x0000000000000000\nnvidia_drm 135168 0 - Live 0x0000000000000000\nnvidia_modeset 1638400 1 nvidia_drm, Live 0x0000000000000000\nnvidia 104329216 58 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000\n";
const RESET_PLAN_COMMAND: &str = "gpureap reset --plan --gpu 3";
const NOTEBOOK: &str = "python3 -m ipykernel_launcher -f /home/colleague/.local/share/jupyter/runtime/kernel-7d3e.json";
const EXPORTER: &str = "nvidia_gpu_exporter --web.listen-address=:9835";
const GRACE: Duration = Duration::from_secs(2);
const TIMEOUT: Duration = Duration::from_secs(2);
const FREE_COMMAND: &str = "gpureap free --match sglang --grace 2s --timeout 2s --yes";
const FUSER_COMMAND: &str = "fuser -k /dev/nvidia*; sleep 5";
const FUSER_SLEEP: Duration = Duration::from_secs(5);
/// The restart's plan: `gpureap plan -- <the launcher's command line>`.
const PLAN_COMMAND: &str = "gpureap plan --";
/// The Hugging Face cache the demo writes the model's config into, under
/// the simulated host's directory, and the revision it names.
const HF_CACHE: &str = "hf-cache";
const REVISION: &str = "demo";
/// The model's config.json: Llama-3.1-70B's shape (GQA, 8 KV heads).
const MODEL_CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 8192,
  "num_attention_heads": 64,
  "num_key_value_heads": 8,
  "num_hidden_layers": 80,
  "max_position_embeddings": 131072,
  "torch_dtype": "bfloat16"
}
"#;
/// Its weights' size, as the checkpoint's index says it (141 GB, bf16).
const MODEL_INDEX: &str = r#"{"metadata": {"total_size": 141107412992}, "weight_map": {}}"#;
/// The processes run this binary: the demo only runs in gpureap's `main`,
/// which plays a stand-in when asked to.
const STAND_IN_EXE: &str = "/proc/self/exe";

/// What a staged process plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
enum Role {
    Launcher,
    Worker,
    Detokenizer,
    Notebook,
    Exporter,
}

impl Role {
    fn of(record: &str) -> Option<Role> {
        match record {
            LAUNCHER => Some(Role::Launcher),
            DETOKENIZER => Some(Role::Detokenizer),
            NOTEBOOK => Some(Role::Notebook),
            EXPORTER => Some(Role::Exporter),
            _ if record.starts_with("sglang::scheduler_TP") => Some(Role::Worker),
            _ => None,
        }
    }

    /// Not part of the server: what a careful free must leave alone.
    fn bystander(self) -> bool {
        matches!(self, Role::Notebook | Role::Exporter)
    }

    fn described(self) -> &'static str {
        match self {
            Role::Launcher => "the server's launcher",
            Role::Worker => "a server worker",
            Role::Detokenizer => "the server's detokenizer",
            Role::Notebook => "the colleague's notebook",
            Role::Exporter => "the metrics exporter",
        }
    }
}

/// One process the demo staged, as the scan after the crash saw it.
#[derive(Debug, Serialize)]
struct Staged {
    role: Role,
    pid: u32,
    cmdline: String,
    /// Parent, process group and session after the crash (none for the launcher, killed by then).
    ppid: Option<u32>,
    pgid: Option<u32>,
    sid: Option<u32>,
    /// Has a (simulated) /dev/nvidia* node open: what `fuser /dev/nvidia*` lists.
    device_nodes_open: bool,
    /// GPU memory the driver lists it with, on any GPU.
    gpu_memory: u64,
    /// Signals `free` delivered to it.
    signals: Vec<&'static str>,
    alive_after_free: bool,
}

#[derive(Debug, Serialize)]
struct DriverHeld {
    gpu: u32,
    bytes: u64,
}

#[derive(Debug, Serialize)]
struct FuserPlay {
    command: &'static str,
    /// Every process with a device node open: fuser -k SIGKILLs them all.
    would_kill: Vec<u32>,
    bystanders_killed: Vec<u32>,
    /// GPU memory the bystanders held: their work.
    bystander_memory_lost: u64,
    /// The sleep after the kill, whatever the GPUs do meanwhile.
    blind_wait_ms: u64,
    /// Whether anything in the recipe would notice memory held by no process.
    driver_held_noticed: bool,
}

#[derive(Debug, Serialize)]
struct FreedGpu {
    gpu: u32,
    after_ms: u64,
}

#[derive(Debug, Serialize)]
struct GpureapPlay {
    command: &'static str,
    signalled: Vec<u32>,
    bystanders_signalled: Vec<u32>,
    elapsed_ms: u64,
    freed: Vec<FreedGpu>,
    driver_held: Vec<DriverHeld>,
    exit_code: u8,
}

#[derive(Debug, Serialize)]
struct Comparison {
    fuser: FuserPlay,
    gpureap: GpureapPlay,
}

/// `gpureap demo --json`: the facts of one replay (docs/json.md).
#[derive(Debug, Serialize)]
struct DemoJson {
    schema_version: u32,
    kind: &'static str,
    exit_code: u8,
    as_designed: bool,
    /// What did not play out as designed; empty when it did.
    differences: Vec<String>,
    backend: String,
    demo_pid: u32,
    processes: Vec<Staged>,
    /// `gpureap plan --json` for the restart, before the free (docs/json.md, kind "plan").
    plan_before: Value,
    status_before: Value,
    free: Value,
    status_after: Value,
    driver_held: Vec<DriverHeld>,
    comparison: Comparison,
    /// The containers act: a running container named, a removed one's
    /// leftover flagged "container gone" and freed by `free --container`.
    containers: containers::ContainersJson,
    /// What the driver said about GPU 3 and what blocks its reset.
    evidence: EvidenceJson,
}

#[derive(Debug, Serialize)]
struct EvidenceJson {
    /// The Xids staged in the simulated kernel log, oldest first.
    xids_staged: Vec<u32>,
    /// `reset --plan --json` for GPU 3 after the free (docs/json.md, kind `reset_plan`).
    reset_plan: Value,
}

/// Set by the clean-up on a signal: the demo's main thread then leaves the
/// exit to it, whatever it was doing.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Runs the demo; `json` prints its facts as JSON instead of its transcript.
pub fn run(json: bool, out: &mut dyn Write) -> io::Result<Exit> {
    // Before anything is made, so that an interrupt never leaves anything behind.
    let made = clean_up_on_signals()?;
    let played = play(json, out, made);
    // Interrupted: the clean-up removes what was made and exits with the
    // signal's code; what the acts did meanwhile (an error, as their host
    // went away) is not the demo's result.
    while INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::park();
    }
    played
}

/// The demo's acts, on a host whose path goes into `made` for the clean-up.
fn play(json: bool, out: &mut dyn Write, made: Arc<Mutex<Option<PathBuf>>>) -> io::Result<Exit> {
    let host = SimHost::claims_only(GPUS, GPU_TOTAL, GPU_NAME).map_err(|error| {
        io::Error::other(format!(
            "cannot make the simulated host under {}: {error}",
            std::env::temp_dir().display()
        ))
    })?;
    if let Ok(mut made) = made.lock() {
        *made = Some(host.path().to_path_buf());
    }
    let driver = SimDriver::open(host.path()).map_err(io::Error::other)?;
    let mut incident = Incident::with_stand_ins(&host, Path::new(STAND_IN_EXE))?;
    let text = !json;

    let launcher = stage(&mut incident)?;
    stage_evidence(&host)?;

    if text {
        introduce(out, host.path(), launcher)?;
    }
    let mut before = Snapshot::take(&driver);
    before.read_evidence(&driver);
    let mut said = Said::default();
    if text {
        writeln!(out, "{}", report::status_tree(&before, &None))?;
        said = explain_notes(out, &before, &incident)?;
    }
    let plan = plan_restart(host.path(), &before)?;
    if text {
        plan_text(out, &plan)?;
        writeln!(out, "$ {FREE_COMMAND}")?;
    }
    let outcome = free_the_server(&driver, &before)?;
    let free_code = outcome.exit();
    if text {
        writeln!(out, "{}", said.strip(&report::free_outcome(&outcome)))?;
        writeln!(out, "$ echo $?\n{}\n", free_code.code())?;
        writeln!(out, "$ gpureap status")?;
    }
    let after = Snapshot::take(&driver);
    if text {
        writeln!(out, "{}", said.strip(&report::status_table(&after, &None)))?;
    }
    // Read-only, after the free: what keeps GPU 3 from the reset it needs.
    let reset_plan = crate::reset::plan(&driver, &after, &driver.platform(), SHARED);

    // The third act, told before the verdict: containers.
    let mut act = Vec::new();
    let containers = containers::play(
        &mut act,
        text.then_some(&said),
        host.path(),
        &driver,
        &mut incident,
    )?;

    let processes = staged(&incident, &before, &after, &outcome)?;
    let driver_held = driver_held(&outcome);
    let comparison = compare(&processes, &outcome, &driver_held);
    let mut differences = differences(&processes, &outcome, &driver_held);
    differences.extend(plan_differences(&plan, &processes));
    differences.extend(containers.differences());
    differences.extend(evidence_differences(
        &before,
        &outcome,
        &reset_plan,
        &processes,
    ));
    let code = if differences.is_empty() {
        Exit::Success
    } else {
        Exit::StillHeld
    };

    let played = Played {
        plan: &plan,
        before: &before,
        outcome: &outcome,
        free_code,
        after: &after,
        processes,
        driver_held,
        comparison,
        containers,
        reset_plan,
        act: String::from_utf8_lossy(&act).into_owned(),
        differences,
        code,
    };
    if text {
        tell(out, &played)?;
    } else {
        writeln!(out, "{}", report::to_json(&played.json()?))?;
    }
    out.flush()?;
    Ok(code)
}

/// `gpureap free --match sglang` on the staged host, with the advice the
/// evidence of what it leaves implies, as the command attaches it.
fn free_the_server(driver: &SimDriver, before: &Snapshot) -> io::Result<FreeReport> {
    let scope = Scope {
        patterns: vec![regex::Regex::new("sglang").map_err(io::Error::other)?],
        ..Scope::default()
    };
    let options = Options::new(GRACE, TIMEOUT);
    let guard = Guard::for_this_process(&[]);
    let mut outcome = reap::free(driver, &scope, &guard, before.clone(), options, &mut |_| {});
    outcome.attach_advice(driver);
    Ok(outcome)
}

/// Stages the incident: the bystanders first, each started the way it is in
/// life, then the server's workers, and the server killed with SIGKILL.
/// Returns the killed launcher's PID.
fn stage(incident: &mut Incident) -> io::Result<u32> {
    // The bystanders were there first, each started the way it is in life.
    incident.holder(
        &Holder::new(NOTEBOOK)
            .on(SHARED, NOTEBOOK_MEMORY)
            .in_own_session(),
    )?;
    incident.holder(&Holder::new(EXPORTER).in_own_session())?;
    let workers: Vec<Holder> = (0..GPUS)
        .map(|rank| {
            let worker = Holder::new(&format!("sglang::scheduler_TP{rank}"))
                .on(rank, WORKER + u64::from(rank) * GIB / 4);
            match rank {
                STUBBORN => worker.ignoring_sigterm(),
                SHARED => worker.leaving_driver_held(KEPT),
                _ => worker,
            }
        })
        .collect();
    let launcher = incident.sglang(&workers)?;
    incident.kill(launcher)?;
    Ok(launcher)
}

/// The transcript's opening: what was staged, in `dir`, and the first command.
fn introduce(out: &mut dyn Write, dir: &Path, launcher: u32) -> io::Result<()> {
    writeln!(
        out,
        "gpureap demo: a crashed SGLang server on a simulated 8-GPU host"
    )?;
    writeln!(
        out,
        "(every process below is real; only the GPU driver is simulated, in {})\n",
        dir.display()
    )?;
    writeln!(out, "The server `{}`", launcher_cmdline())?;
    writeln!(
        out,
        "(pid {launcher}) ran 8 TP workers, one per GPU. It was just killed with SIGKILL, as the OOM killer"
    )?;
    writeln!(
        out,
        "or `pkill -9 -f launch_server` does: its workers live on, orphaned, with ~118 GiB each (TP2"
    )?;
    writeln!(
        out,
        "ignores SIGTERM), and so does its detokenizer. A colleague's notebook shares GPU 3, and a"
    )?;
    writeln!(
        out,
        "metrics exporter watches every GPU, each in a session of its own.\n"
    )?;
    writeln!(out, "$ gpureap status --tree")?;
    Ok(())
}

/// One replay's facts, for the transcript and the JSON.
struct Played<'a> {
    plan: &'a Outcome,
    before: &'a Snapshot,
    outcome: &'a FreeReport,
    free_code: Exit,
    after: &'a Snapshot,
    processes: Vec<Staged>,
    driver_held: Vec<DriverHeld>,
    comparison: Comparison,
    containers: containers::ContainersJson,
    /// `reset --plan --gpu 3` after the free.
    reset_plan: crate::reset::Plan,
    /// The containers act's transcript, told before the verdict.
    act: String,
    differences: Vec<String>,
    code: Exit,
}

/// The transcript's end: what is left, the second half, and the verdict.
fn tell(out: &mut dyn Write, played: &Played) -> io::Result<()> {
    let Played {
        processes,
        driver_held,
        comparison,
        differences,
        free_code,
        ..
    } = played;
    for process in processes
        .iter()
        .filter(|p| p.role == Role::Detokenizer && p.alive_after_free)
    {
        writeln!(
            out,
            "Not in the tables: {} (pid {}) still runs. It holds no GPU, so no GPU scope reaches it;",
            process.cmdline, process.pid
        )?;
        writeln!(
            out,
            "`gpureap free --pid {}` would end it. The demo ends it when it exits.\n",
            process.pid
        )?;
    }
    second_half(out, driver_held, processes)?;
    evidence_text(out, played)?;
    comparison_text(out, comparison, processes)?;
    write!(out, "{}", played.act)?;
    if differences.is_empty() {
        writeln!(
            out,
            "\nThe server's free exited {}, as it would on the real box; the demo played out as designed.",
            free_code.code()
        )?;
    } else {
        writeln!(out, "\nThe demo did not play out as designed:")?;
        for difference in differences {
            writeln!(out, "  - {difference}")?;
        }
    }
    writeln!(
        out,
        "\nTry it live: `gpureap demo --top` stages the same host and opens `gpureap top` on it."
    )?;
    Ok(())
}

/// `gpureap demo --top`: the demo's host as it is right after the crash,
/// handed to `view` (the binary opens `gpureap top` on it). Everything
/// staged is gone when the view returns, as it does on q, Ctrl-C, SIGTERM
/// or a panic (dropped while unwinding).
pub fn staged_for(view: impl FnOnce(Arc<dyn Driver>) -> io::Result<Exit>) -> io::Result<Exit> {
    let host = SimHost::claims_only(GPUS, GPU_TOTAL, GPU_NAME)?;
    let driver = SimDriver::open(host.path()).map_err(io::Error::other)?;
    let mut incident = Incident::with_stand_ins(&host, Path::new(STAND_IN_EXE))?;
    stage(&mut incident)?;
    stage_evidence(&host)?;
    let code = view(Arc::new(driver));
    drop(incident);
    code
}

impl Played<'_> {
    /// `gpureap demo --json`'s document.
    fn json(self) -> io::Result<DemoJson> {
        let parse = |text: String| serde_json::from_str(&text).map_err(io::Error::other);
        Ok(DemoJson {
            schema_version: 1,
            kind: "demo",
            exit_code: self.code.code(),
            as_designed: self.differences.is_empty(),
            differences: self.differences,
            backend: self.before.backend.clone(),
            demo_pid: std::process::id(),
            processes: self.processes,
            plan_before: parse(crate::plan::render::json(self.plan))?,
            status_before: parse(report::status_json(self.before, &None))?,
            free: parse(report::free_json(self.outcome, self.free_code))?,
            status_after: parse(report::status_json(self.after, &None))?,
            driver_held: self.driver_held,
            comparison: self.comparison,
            containers: self.containers,
            evidence: EvidenceJson {
                xids_staged: XIDS.iter().map(|(xid, _, _)| *xid).collect(),
                reset_plan: parse(report::reset_plan_json(
                    std::slice::from_ref(&self.reset_plan),
                    crate::reset::plan_exit(std::slice::from_ref(&self.reset_plan)),
                ))?,
            },
        })
    }
}

/// On Ctrl-C (or SIGTERM, SIGHUP): every process the demo staged is killed
/// and the simulated host removed before it exits `Exit::Signalled`. What
/// was not recorded yet ends by itself when the demo exits (its lifeline).
/// Returns where to put the simulated host's directory once it is made.
fn clean_up_on_signals() -> io::Result<Arc<Mutex<Option<PathBuf>>>> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let made: Arc<Mutex<Option<PathBuf>>> = Arc::default();
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    let dir = Arc::clone(&made);
    std::thread::spawn(move || {
        if let Some(signal) = signals.forever().next() {
            INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
            let dir = dir.lock().ok().and_then(|dir| dir.clone());
            if let Some(dir) = &dir {
                incident::kill_recorded(dir);
            }
            // The containers act's cgroups, once its killed stand-ins (our
            // children) are reaped.
            if let Some(root) = containers::root_of_this_process().filter(|root| root.exists()) {
                let deadline = std::time::Instant::now() + Duration::from_secs(1);
                while root.exists() && std::time::Instant::now() < deadline {
                    while let Ok(Some(_)) =
                        rustix::process::wait(rustix::process::WaitOptions::NOHANG)
                    {
                    }
                    containers::remove_tree(&root, Duration::ZERO);
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            // The simulated host last, right before the exit: the demo's
            // main thread goes on meanwhile (its next act writes under the
            // host, and a stand-in signalled by the free may still write its
            // leak until its SIGKILL lands), so try until it is gone.
            // It is gone once it stayed gone for a while (the main thread's
            // writes then fail), or after a second.
            if let Some(dir) = &dir {
                let deadline = std::time::Instant::now() + Duration::from_secs(1);
                let mut gone_since: Option<std::time::Instant> = None;
                while std::time::Instant::now() < deadline {
                    if dir.exists() {
                        gone_since = None;
                        let _ = std::fs::remove_dir_all(dir);
                    } else if gone_since
                        .get_or_insert_with(std::time::Instant::now)
                        .elapsed()
                        >= Duration::from_millis(100)
                    {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            eprintln!("gpureap demo: interrupted; every process it started is gone");
            std::process::exit(Exit::Signalled(signal).into());
        }
    });
    Ok(made)
}

/// Every process the demo staged, from its records and the scans.
fn staged(
    incident: &Incident,
    before: &Snapshot,
    after: &Snapshot,
    outcome: &FreeReport,
) -> io::Result<Vec<Staged>> {
    let mut processes = Vec::new();
    for (pid, record) in incident.records()? {
        let Some(role) = Role::of(&record) else {
            continue;
        };
        let seen = before.processes.get(&pid);
        let signals = outcome
            .targets
            .iter()
            .find(|target| {
                target.pid == pid && seen.is_some_and(|p| p.id.start_time == target.start_time)
            })
            .map(|target| target.sent().map(Sig::name).collect())
            .unwrap_or_default();
        let alive_after_free = seen.is_some_and(|then| {
            after
                .processes
                .get(&pid)
                .is_some_and(|now| now.id == then.id && !now.state.has_exited())
        });
        // The scan reads command lines of GPU users only; the launcher is gone.
        let cmdline = match seen.map(|p| p.cmdline.clone()).filter(|c| !c.is_empty()) {
            Some(cmdline) => cmdline,
            None if role == Role::Launcher => launcher_cmdline(),
            None => crate::proc::cmdline(pid),
        };
        processes.push(Staged {
            role,
            pid,
            cmdline,
            ppid: seen.map(|p| p.ppid),
            pgid: seen.map(|p| p.pgid),
            sid: seen.map(|p| p.sid),
            device_nodes_open: seen.is_some_and(|p| !p.nodes.is_empty()),
            gpu_memory: before
                .gpus_used_by(pid)
                .into_iter()
                .filter_map(|gpu| before.memory_of(pid, gpu))
                .sum(),
            signals,
            alive_after_free,
        });
    }
    processes.sort_by(|a, b| (a.role, &a.cmdline).cmp(&(b.role, &b.cmdline)));
    Ok(processes)
}

fn launcher_cmdline() -> String {
    format!("{LAUNCHER} --model-path {MODEL} --tp {GPUS}")
}

fn driver_held(outcome: &FreeReport) -> Vec<DriverHeld> {
    outcome
        .gpus
        .iter()
        .flat_map(|gpu| {
            gpu.reasons.iter().filter_map(|reason| match reason {
                Reason::DriverHeld { bytes, .. } => Some(DriverHeld {
                    gpu: gpu.index,
                    bytes: *bytes,
                }),
                _ => None,
            })
        })
        .collect()
}

/// What fuser would have done, from who had the nodes open before the
/// free, against what gpureap did.
fn compare(processes: &[Staged], outcome: &FreeReport, held: &[DriverHeld]) -> Comparison {
    let would_kill: Vec<&Staged> = processes.iter().filter(|p| p.device_nodes_open).collect();
    let signalled: Vec<&Staged> = processes.iter().filter(|p| !p.signals.is_empty()).collect();
    Comparison {
        fuser: FuserPlay {
            command: FUSER_COMMAND,
            would_kill: would_kill.iter().map(|p| p.pid).collect(),
            bystanders_killed: would_kill
                .iter()
                .filter(|p| p.role.bystander())
                .map(|p| p.pid)
                .collect(),
            bystander_memory_lost: would_kill
                .iter()
                .filter(|p| p.role.bystander())
                .map(|p| p.gpu_memory)
                .sum(),
            blind_wait_ms: FUSER_SLEEP.as_millis() as u64,
            driver_held_noticed: false,
        },
        gpureap: GpureapPlay {
            command: FREE_COMMAND,
            signalled: outcome
                .targets
                .iter()
                .filter(|target| target.sent().next().is_some())
                .map(|target| target.pid)
                .collect(),
            bystanders_signalled: signalled
                .iter()
                .filter(|p| p.role.bystander())
                .map(|p| p.pid)
                .collect(),
            elapsed_ms: outcome.elapsed_ms,
            freed: outcome
                .gpus
                .iter()
                .filter_map(|gpu| {
                    Some(FreedGpu {
                        gpu: gpu.index,
                        after_ms: gpu.freed_after_ms.filter(|_| gpu.freed)?,
                    })
                })
                .collect(),
            driver_held: held
                .iter()
                .map(|held| DriverHeld {
                    gpu: held.gpu,
                    bytes: held.bytes,
                })
                .collect(),
            exit_code: outcome.exit().code(),
        },
    }
}

/// Where the replay differs from the incident it stages; empty when it does not.
fn differences(processes: &[Staged], outcome: &FreeReport, held: &[DriverHeld]) -> Vec<String> {
    let mut differences = Vec::new();
    for process in processes {
        let signalled = !process.signals.is_empty();
        match process.role {
            Role::Worker if !signalled || process.alive_after_free => differences.push(format!(
                "worker {} was {}",
                process.pid,
                if signalled {
                    "signalled but survived"
                } else {
                    "not signalled"
                }
            )),
            Role::Notebook | Role::Exporter if signalled || !process.alive_after_free => {
                differences.push(format!(
                    "{} (pid {}) was {}",
                    process.role.described(),
                    process.pid,
                    if signalled { "signalled" } else { "gone" }
                ));
            }
            _ => {}
        }
    }
    for gpu in &outcome.gpus {
        if gpu.index != SHARED && !gpu.freed {
            differences.push(format!("GPU {} was not verified free", gpu.index));
        }
    }
    if !held
        .iter()
        .any(|held| held.gpu == SHARED && held.bytes == KEPT)
    {
        differences.push(format!(
            "GPU {SHARED} was not reported with {} driver-held",
            Bytes(KEPT)
        ));
    }
    if outcome.exit() != Exit::StillHeld {
        differences.push(format!(
            "the free exited {}, not {}",
            outcome.exit().code(),
            Exit::StillHeld.code()
        ));
    }
    differences
}

/// Stages what the driver says about GPU 3 (`XIDS`, `HEALTH`) and the host's
/// driver modules: the kernel log's records a minute and a half old.
fn stage_evidence(host: &SimHost) -> io::Result<()> {
    let uptime_us = crate::proc::uptime_ticks()
        .map(|ticks| ticks.saturating_mul(1_000_000) / crate::proc::ticks_per_second().max(1))
        .unwrap_or(0);
    for (xid, seconds_ago, detail) in XIDS {
        let at = uptime_us.saturating_sub(seconds_ago * 1_000_000).max(1);
        host.xid(SHARED, xid, at, detail)?;
    }
    host.health(SHARED, HEALTH)?;
    std::fs::write(host.path().join("modules"), MODULES)
}

/// What keeps GPU 3 from the reset its evidence calls for (`explain_notes`
/// said what the driver says about it).
fn evidence_text(out: &mut dyn Write, played: &Played) -> io::Result<()> {
    writeln!(
        out,
        "\nBefore a reset, what stands in its way (read-only: nothing is signalled or reset):"
    )?;
    writeln!(out, "$ {RESET_PLAN_COMMAND}")?;
    write!(out, "{}", played.reset_plan)
}

/// What the transcript has said once and leaves out of the commands after:
/// the notes every command repeats (the scan's unreadable processes, GPU
/// 3's hardware evidence), each shown and explained the first time
/// (`explain_notes`).
#[derive(Debug, Default)]
pub(crate) struct Said {
    /// Notes as they read unwrapped: `GPU 3: Xid 48 at …` in `status`, a
    /// reason line of `free` (`- Xid 48 at …`) without its dash.
    notes: Vec<String>,
    /// A partial scan was explained: each command words its note its own way.
    partial_scan: bool,
}

impl Said {
    /// A command's output without the notes said already: whole paragraphs
    /// (a `status` note, wrapped) or single lines (`free`'s).
    pub(crate) fn strip(&self, text: &str) -> String {
        let said = |unwrapped: &str| {
            let unwrapped = unwrapped.trim().trim_start_matches("- ");
            (self.partial_scan && unwrapped.starts_with("Partial scan:"))
                || self.notes.iter().any(|note| note == unwrapped)
        };
        let kept: Vec<String> = text
            .split("\n\n")
            .filter(|block| !said(&block.lines().map(str::trim).collect::<Vec<_>>().join(" ")))
            .map(|block| {
                block
                    .lines()
                    .filter(|line| !said(line))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .filter(|block| !block.trim().is_empty())
            .collect();
        let mut stripped = kept.join("\n\n");
        if text.ends_with('\n') {
            stripped.push('\n');
        }
        stripped
    }
}

/// After the first `status`: what its notes mean, said once. GPU 3's lines
/// are the driver's evidence; a partial scan is this machine's processes
/// gpureap may not read (a sandbox's PID 1), none of them staged nor listed
/// on a GPU, or it says which is. Returns what the commands after leave out.
fn explain_notes(out: &mut dyn Write, before: &Snapshot, incident: &Incident) -> io::Result<Said> {
    let mut said = Said::default();
    let advice = before
        .evidence
        .get(&SHARED)
        .map(|evidence| evidence.advice(SHARED))
        .unwrap_or_default();
    if !advice.is_empty() {
        writeln!(
            out,
            "GPU {SHARED}'s lines are what the driver says happened there, and gpureap reads it (the kernel log's"
        )?;
        writeln!(
            out,
            "Xids, the ECC and row-remap counters; docs/evidence.md): in `status`, `free`, `check`, the JSON and the"
        )?;
        writeln!(
            out,
            "exporter. `free`'s result below says it again under GPU {SHARED}; this transcript shows it here only.\n"
        )?;
        for line in advice {
            said.notes.push(format!("GPU {SHARED}: {line}"));
            said.notes.push(line);
        }
    }
    if before.is_partial() {
        let staged: BTreeSet<u32> = incident
            .records()?
            .into_iter()
            .map(|(pid, _)| pid)
            .collect();
        let listed: BTreeSet<u32> = before
            .gpus
            .iter()
            .flat_map(|gpu| gpu.users.iter().map(|user| user.pid))
            .collect();
        let named: Vec<String> = before
            .unreadable
            .iter()
            .take(3)
            .map(|unreadable| {
                format!(
                    "pid {} ({}: {})",
                    unreadable.pid,
                    crate::units::Field(&unreadable.comm),
                    crate::units::Field(&unreadable.reason)
                )
            })
            .collect();
        let more = before.unreadable.len().saturating_sub(named.len());
        let missed: Vec<String> = before
            .unreadable
            .iter()
            .filter(|unreadable| {
                staged.contains(&unreadable.pid) || listed.contains(&unreadable.pid)
            })
            .map(|unreadable| unreadable.pid.to_string())
            .collect();
        writeln!(
            out,
            "The partial scan is this machine's: gpureap could not read {}{}.",
            named.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )?;
        if missed.is_empty() {
            writeln!(
                out,
                "{}: nothing",
                if before.unreadable.len() == 1 {
                    "It is no process the demo staged, and the simulated driver lists it on no GPU"
                } else {
                    "None of them is a process the demo staged, and the simulated driver lists none on a GPU"
                }
            )?;
            writeln!(
                out,
                "here is missed. The commands below say it too; this transcript shows it here only.\n"
            )?;
        } else {
            writeln!(
                out,
                "Of them, pid {} is one the demo staged or the driver lists: what follows may miss it. The commands",
                missed.join(", ")
            )?;
            writeln!(
                out,
                "below say it too; this transcript shows it here only.\n"
            )?;
        }
        said.partial_scan = true;
    }
    Ok(said)
}

/// What the evidence part did not show as staged.
fn evidence_differences(
    before: &Snapshot,
    outcome: &FreeReport,
    plan: &crate::reset::Plan,
    processes: &[Staged],
) -> Vec<String> {
    let mut differences = Vec::new();
    let counts = before.evidence.get(&SHARED).map(|e| &e.xid_counts);
    for (xid, _, _) in XIDS {
        if counts.is_none_or(|counts| !counts.contains_key(&xid)) {
            differences.push(format!(
                "status did not read Xid {xid} for GPU {SHARED} from the kernel log"
            ));
        }
    }
    let advised = outcome
        .gpus
        .iter()
        .find(|gpu| gpu.index == SHARED)
        .is_some_and(|gpu| gpu.advice.iter().any(|line| line.starts_with("Xid 48")));
    if !advised {
        differences.push(format!(
            "free's result for GPU {SHARED} gave no advice from the Xids"
        ));
    }
    if plan.could_reset != Some(false) {
        differences.push(format!(
            "reset --plan said a reset of GPU {SHARED} could run (or could not tell) while the notebook uses it"
        ));
    }
    for role in [Role::Notebook, Role::Exporter] {
        for process in processes.iter().filter(|p| p.role == role) {
            if !plan
                .blockers
                .iter()
                .any(|blocker| blocker.pid == Some(process.pid) && blocker.blocks)
            {
                differences.push(format!(
                    "reset --plan did not name {} (pid {}) as a blocker",
                    role.described(),
                    process.pid
                ));
            }
        }
    }
    differences
}

/// The second half of the incident: memory held by no process.
fn second_half(out: &mut dyn Write, held: &[DriverHeld], processes: &[Staged]) -> io::Result<()> {
    for held in held {
        let users: Vec<String> = processes
            .iter()
            .filter(|p| p.alive_after_free && p.gpu_memory > 0)
            .map(|p| format!("{} (pid {})", p.role.described(), p.pid))
            .collect();
        writeln!(
            out,
            "The second half of the incident: GPU {gpu} keeps {bytes} that no process holds. The driver",
            gpu = held.gpu,
            bytes = Bytes(held.bytes)
        )?;
        writeln!(
            out,
            "kept it when the worker there exited. No kill can return it, so a second pass would not"
        )?;
        writeln!(
            out,
            "help: gpureap says so, and why, instead of calling the GPU free. What to do next:"
        )?;
        writeln!(
            out,
            "  - on a Slurm node: drain the node, so that no job is placed on GPU {} until it is",
            held.gpu
        )?;
        writeln!(
            out,
            "    cleared (`gpureap slurm epilog` and `gpureap slurm healthcheck` do this, docs/slurm.md);"
        )?;
        writeln!(
            out,
            "  - with `--reset` (those commands, or `gpureap reset --gpu N`): reset GPU {} once nothing uses it, or reboot{}",
            held.gpu,
            if users.is_empty() {
                ".".to_string()
            } else {
                format!(";\n    here {} still uses it.", users.join(", "))
            }
        )?;
    }
    Ok(())
}

fn comparison_text(
    out: &mut dyn Write,
    comparison: &Comparison,
    processes: &[Staged],
) -> io::Result<()> {
    let fuser = &comparison.fuser;
    let gpureap = &comparison.gpureap;
    let bystanders = |pids: &[u32]| -> String {
        let names: Vec<String> = processes
            .iter()
            .filter(|p| p.role.bystander() && pids.contains(&p.pid))
            .map(|p| match p.role {
                Role::Notebook => format!("notebook {} ({})", p.pid, Bytes(p.gpu_memory)),
                _ => format!("exporter {}", p.pid),
            })
            .collect();
        format!(
            "{}{}",
            names.len(),
            if names.is_empty() {
                String::new()
            } else {
                format!(": {}", names.join(", "))
            }
        )
    };
    writeln!(
        out,
        "\nInstead of `{FUSER_COMMAND}`, on the same host (listed from /proc, nothing run):"
    )?;
    let mut table = Table::new();
    table.load_style(NOTHING);
    table.set_header(vec!["", FUSER_COMMAND, "gpureap free --match sglang"]);
    table.add_row(vec![
        "processes killed".to_string(),
        format!("{} (every one with a node open)", fuser.would_kill.len()),
        format!("{} (the server's GPU holders)", gpureap.signalled.len()),
    ]);
    table.add_row(vec![
        "bystanders killed".to_string(),
        bystanders(&fuser.bystanders_killed),
        if gpureap.bystanders_signalled.is_empty() {
            "0: never signalled".to_string()
        } else {
            bystanders(&gpureap.bystanders_signalled)
        },
    ]);
    let freed: BTreeSet<u32> = gpureap.freed.iter().map(|gpu| gpu.gpu).collect();
    let slowest = gpureap
        .freed
        .iter()
        .map(|gpu| gpu.after_ms)
        .max()
        .unwrap_or(0);
    table.add_row(vec![
        "time".to_string(),
        format!(
            "{} blind, then nothing checks",
            Elapsed(Duration::from_millis(fuser.blind_wait_ms))
        ),
        format!(
            "GPUs {} verified free in {}; done in {}",
            GpuRanges(&freed),
            Elapsed(Duration::from_millis(slowest)),
            Elapsed(Duration::from_millis(gpureap.elapsed_ms))
        ),
    ]);
    for held in &gpureap.driver_held {
        table.add_row(vec![
            format!("GPU {} driver-held", held.gpu),
            format!("{}, unnoticed", Bytes(held.bytes)),
            format!("{}, reported, with what to do", Bytes(held.bytes)),
        ]);
    }
    writeln!(out, "{}", table.trim_fmt())
}

/// The restart's plan on the staged box, before anything is freed: the
/// launcher's own command line, its model read from a Hugging Face cache the
/// demo writes under `dir`.
fn plan_restart(dir: &Path, snapshot: &Snapshot) -> io::Result<Outcome> {
    let hub = dir.join(HF_CACHE);
    let repo = hub.join(format!("models--{}", MODEL.replace('/', "--")));
    let snapshot_dir = repo.join("snapshots").join(REVISION);
    std::fs::create_dir_all(&snapshot_dir)?;
    std::fs::create_dir_all(repo.join("refs"))?;
    std::fs::write(repo.join("refs/main"), REVISION)?;
    std::fs::write(snapshot_dir.join("config.json"), MODEL_CONFIG)?;
    std::fs::write(
        snapshot_dir.join("model.safetensors.index.json"),
        MODEL_INDEX,
    )?;
    let config = PlanConfig::of_command(
        launcher_cmdline().split(' ').map(str::to_string).collect(),
        [("HF_HUB_CACHE".to_string(), hub.display().to_string())].into(),
    );
    fit::evaluate(&config, Some(snapshot)).map_err(io::Error::other)
}

/// The plan, short: the pool now and once freed, and what each leftover
/// costs every rank.
fn plan_text(out: &mut dyn Write, plan: &Outcome) -> io::Result<()> {
    writeln!(
        out,
        "Before restarting it, what would the new server get here?"
    )?;
    writeln!(out, "$ {PLAN_COMMAND} {}", launcher_cmdline())?;
    writeln!(
        out,
        "SGLang, {} ({} bytes of KV per token per GPU), TP {} on GPUs {}:",
        MODEL,
        plan.now.bytes_per_token,
        plan.launch.tp,
        render::gpus_text(plan)
    )?;
    writeln!(
        out,
        "  now:              {}\n  once freed:       {}",
        render::device_summary(plan, &plan.now),
        render::device_summary(plan, &plan.clean)
    )?;
    let mut table = Table::new();
    table.load_style(NOTHING);
    table.set_header(vec!["GPU", "PID", "HOLDER", "HOLDS", "COSTS EVERY RANK"]);
    for holder in &plan.holders {
        table.add_row(vec![
            holder.gpu.to_string(),
            holder.pid.map_or("-".to_string(), |pid| pid.to_string()),
            crate::units::short(&crate::units::one_line(&holder.name), 40),
            holder
                .bytes
                .map_or("?".to_string(), |bytes| Bytes(bytes).to_string()),
            match holder.cost {
                Cost::Tokens { per_rank } => format!("{per_rank} tokens"),
                Cost::RefusesStart => "the start: alone it leaves no KV cache".to_string(),
                Cost::Nothing => "nothing".to_string(),
                Cost::Unknown => "unknown (no figure from the driver)".to_string(),
            },
        ]);
    }
    writeln!(out, "{}", table.trim_fmt())?;
    writeln!(
        out,
        "{}. One GPU's leftover is every rank's loss: SGLang sizes each",
        render::verdict_line(plan)
    )?;
    writeln!(
        out,
        "rank's pool from the least free memory over all eight. Free the leftovers first:\n"
    )
}

/// Where the plan differs from the story: it must say the restart fits
/// only once the leftovers are freed, and that the colleague's notebook
/// alone costs every rank tokens.
fn plan_differences(plan: &Outcome, processes: &[Staged]) -> Vec<String> {
    let mut differences = Vec::new();
    if plan.verdict() != Verdict::FitsAfterFree {
        differences.push(format!(
            "the plan before the free said {:?}, not that the server fits once freed",
            plan.verdict()
        ));
    }
    let notebook = processes.iter().find(|p| p.role == Role::Notebook);
    let costed = notebook.is_some_and(|notebook| {
        plan.holders.iter().any(|holder| {
            holder.pid == Some(notebook.pid) && matches!(holder.cost, Cost::Tokens { .. })
        })
    });
    if !costed {
        differences.push("the plan did not say what the notebook costs every rank".to_string());
    }
    differences
}
