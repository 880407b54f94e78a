//! The command line as typed, and typed where it is parsed: durations, sizes,
//! GPU lists, PIDs, regexes and enums are checked by clap's value parsers, so
//! a bad value ends the run (exit 2) before the driver is opened or /proc is
//! read. `config.rs` turns these into each command's typed config and checks
//! the rules that involve several flags or the host; only `main` and
//! `config` read this module (tests/imports.rs), so nothing past them sees
//! flag spelling.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, FromArgMatches, Parser, Subcommand};
use regex::Regex;

use crate::driver::BackendChoice;
use crate::exit::{self, Program};
use crate::hostlist::{self, HostList};
use crate::members::{CgroupRef, ContainerRef, PodRef};
use crate::units::{self, GpuList};

fn duration(text: &str) -> Result<Duration, String> {
    units::parse_duration(text)
}

fn container_ref(text: &str) -> Result<ContainerRef, String> {
    ContainerRef::parse(text)
}

fn mps_server(text: &str) -> Result<crate::snapshot::mps::ServerRef, String> {
    crate::snapshot::mps::ServerRef::parse(text.trim())
}

fn pod_ref(text: &str) -> Result<PodRef, String> {
    PodRef::parse(text)
}

fn cgroup_ref(text: &str) -> Result<CgroupRef, String> {
    CgroupRef::parse(text)
}

/// A refresh interval: at least 100ms, so that the view never spins.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match units::parse_duration(text)? {
        interval if interval < Duration::from_millis(100) => Err(format!(
            "invalid interval '{text}': refresh at most every 100ms, like 1s"
        )),
        interval => Ok(interval),
    }
}

fn gpu_list(text: &str) -> Result<GpuList, String> {
    units::parse_gpu_list(text)
}

/// `--drain-xids`, as typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidList(pub std::collections::BTreeSet<u32>);

fn xid_list(text: &str) -> Result<XidList, String> {
    crate::driver::evidence::parse_xid_list(text).map(XidList)
}

/// The default of `--drain-xids` (`evidence::DEFAULT_DRAIN_XIDS`, a test
/// keeps them one).
pub const DEFAULT_DRAIN_XIDS: &str = "48,62,64,74,79,95,119,120,140";

/// The Xids that make a problem, for `check` and the Slurm health check.
#[derive(Debug, Args)]
pub struct DrainXidArgs {
    /// Xids that make a problem (check) or drain the node (Slurm health check) once the kernel
    /// logged one for a GPU since boot: numbers separated by commas, or none. docs/evidence.md
    /// gives NVIDIA's meaning of each default. Example: --drain-xids 48,79,95
    #[arg(long, env = "GPUREAP_DRAIN_XIDS", default_value = DEFAULT_DRAIN_XIDS,
          value_name = "LIST", value_parser = xid_list)]
    pub drain_xids: XidList,
}

fn hosts(text: &str) -> Result<HostList, String> {
    hostlist::parse(text).map(HostList)
}

fn parallel(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!(
            "invalid --parallel '{text}': expected a number of hosts at once, 1 to 1024"
        )),
    }
}

fn backend(text: &str) -> Result<BackendChoice, String> {
    BackendChoice::parse(text)
}

/// A size above zero: `wait --below 0` could never be satisfied.
fn positive_size(text: &str) -> Result<u64, String> {
    match units::parse_size(text)? {
        0 => Err(format!(
            "invalid size '{text}': nothing uses less than 0 bytes; give a size above 0, like 1GiB"
        )),
        bytes => Ok(bytes),
    }
}

fn pid(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(0) => Err(format!(
            "invalid PID '{text}': PID 0 is the kernel's, not a process"
        )),
        Ok(pid) => Ok(pid),
        Err(_) => Err(format!("invalid PID '{text}': expected a number like 4242")),
    }
}

/// A `--match` regex. An empty one matches every command line: `--all` says that.
fn match_regex(text: &str) -> Result<Regex, String> {
    if text.is_empty() {
        return Err(
            "an empty --match regex matches everything; use --all if that is what you mean"
                .to_string(),
        );
    }
    Regex::new(text).map_err(|error| format!("invalid --match regex '{text}': {error}"))
}

fn log_regex(text: &str) -> Result<Regex, String> {
    if text.is_empty() {
        return Err("an empty --ready-log regex matches the first line of any output".to_string());
    }
    Regex::new(text).map_err(|error| format!("invalid --ready-log regex '{text}': {error}"))
}

fn ready_url(text: &str) -> Result<String, String> {
    if text.starts_with("http://") && text.len() > "http://".len() {
        Ok(text.to_string())
    } else {
        Err(format!(
            "invalid --ready-url '{text}': expected http://HOST:PORT/PATH (the health endpoint is local; https is not supported)"
        ))
    }
}

/// `--listen` / `--metrics`: an IP address and a port, never a bare port,
/// so that listening beyond loopback is always written out.
fn listen_address(text: &str) -> Result<std::net::SocketAddr, String> {
    text.trim().parse().map_err(|_| {
        format!(
            "invalid address '{text}': expected IP:PORT, like 127.0.0.1:9839 (this host only), 0.0.0.0:9839 (every IPv4 interface) or [::]:9839"
        )
    })
}

/// `exporter --interval`: a scan takes tens of milliseconds on a crowded host.
fn scan_interval(text: &str) -> Result<Duration, String> {
    let interval = units::parse_duration(text)?;
    if interval < Duration::from_millis(100) {
        return Err(format!(
            "invalid interval '{text}': at least 100ms between scans (Prometheus scrapes every 15s or so)"
        ));
    }
    Ok(interval)
}

/// `gpureap --version`: the crate's version, the commit and the build date
/// (build.rs), e.g. `0.1.0 (abc1234 2026-11-30)`; `-dirty` after the commit
/// when the sources differed from it.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("GPUREAP_COMMIT"),
    " ",
    env!("GPUREAP_BUILD_DATE"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "gpureap",
    version = VERSION,
    args_override_self = true,
    about = "See who holds each NVIDIA GPU, free exactly what you scope, and prove the memory came back.",
    after_help = exit::after_help(Program::Gpureap, "Examples:
  gpureap status                       who holds each GPU, with flags (orphaned, zombie, D, hidden, monitor)
  gpureap status --tree --gpu 3        GPU 3's holders inside their process trees
  gpureap free --orphans --dry-run     what freeing the orphaned workers would signal
  gpureap free --match sglang --yes    SIGTERM, grace, SIGSTOP+SIGKILL, re-scan, verify
  gpureap free --gpu 3 --grace 0 --yes kill everything on GPU 3 at once, and verify
  gpureap wait --gpu 0-3 --below 1GiB --timeout 2m && python3 -m sglang.launch_server ...
  gpureap demo                         replay a crashed SGLang server on a simulated 8-GPU host")
)]
pub struct Cli {
    /// GPU driver: auto (NVML if libnvidia-ml loads, else none), nvml, none, or sim:DIR.
    #[arg(
        long,
        global = true,
        env = "GPUREAP_BACKEND",
        default_value = "auto",
        value_name = "BACKEND",
        value_parser = backend
    )]
    pub backend: BackendChoice,

    #[command(subcommand)]
    pub command: Command,
}

/// A subcommand's arguments, defined only when that subcommand is the one
/// given (clap's `Command::defer`): without it every invocation builds every
/// subcommand's arguments, some 330 KiB of code run and their strings
/// touched before anything else happens, 40% of `--version`'s instructions
/// (docs/bench/history.md, "Issue 28, round 9"). Reads as the arguments it holds.
#[derive(Debug)]
pub struct Lazy<T>(pub T);

impl<T> std::ops::Deref for Lazy<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: FromArgMatches> FromArgMatches for Lazy<T> {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches(matches).map(Lazy)
    }
    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }
}

impl<T: Args> Args for Lazy<T> {
    fn augment_args(command: clap::Command) -> clap::Command {
        command.defer(|command| keep_about(command, T::augment_args))
    }
    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        command.defer(|command| keep_about(command, T::augment_args_for_update))
    }
}

/// `augment` with the subcommand's own about kept: its variant's doc
/// comment, which the derive sets after the arguments and a deferred
/// argument group's doc comment would otherwise replace.
fn keep_about(
    command: clap::Command,
    augment: fn(clap::Command) -> clap::Command,
) -> clap::Command {
    let about = command.get_about().cloned();
    let long_about = command.get_long_about().cloned();
    let command = augment(command);
    let command = match about {
        Some(about) => command.about(about),
        None => command.about(None::<&'static str>),
    };
    match long_about {
        Some(long_about) => command.long_about(long_about),
        None => command.long_about(None::<&'static str>),
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show each GPU, its memory, and every process that holds or watches it.
    #[command(after_help = exit::after_help(Program::Status, "Examples:
  gpureap status
  gpureap status --gpu 0,2 --tree
  gpureap status --json | jq '.gpus[] | {index, memory_used}'
  gpureap status -H 'gpu[01-16]'      every host's GPUs in one table, over your ssh
  gpureap status -H @hosts.txt --ssh 'ssh -F ~/.ssh/lab.conf' --json"))]
    Status(Lazy<StatusArgs>),

    /// Free GPUs: signal the holders in scope and their descendants, then verify through the driver.
    #[command(
        after_help = exit::after_help(Program::Free, "Scopes narrow each other: --gpu 3 --orphans is the orphans on GPU 3.
Targets are the GPU users in scope and all their descendants; --pid names a process directly.
Never signalled: gpureap, its ancestors, PID 1, kernel threads, protected names, and monitors.

Examples:
  gpureap free --orphans --dry-run
  gpureap free --match 'sglang::scheduler' --yes
  gpureap free --gpu 3 --grace 0 --timeout 1m --yes
  gpureap free --pid 4242 --yes --json
  gpureap free --stale-runs --yes      what a SIGKILLed `gpureap run` left, and its cgroups
  gpureap free --container 3f2a9c81d4e7 --yes   a container's processes (id prefix or name)
  gpureap free --pod ml/llama-0 --gpu 2 --dry-run   the pod's processes that use GPU 2
  gpureap free -H 'node[1-4]' --match 'sglang::|vllm' --dry-run   the plan on every host
  gpureap free -H 'node[1-4]' --orphans          shows the plan, asks once, frees each host")
    )]
    Free(Lazy<FreeArgs>),

    /// Wait until GPUs are free enough to launch on; exit 1 listing the holders on timeout.
    #[command(after_help = exit::after_help(Program::Wait, "Memory held by no process that keeps a GPU at or above --below ends the wait at once
(exit 1), said as `free` and `check` say it: only a GPU reset or a reboot clears it.

Examples:
  gpureap wait --gpu 0-3 --timeout 2m && ./launch.sh
  gpureap wait --below 2GiB
  gpureap wait -H 'node[1-4]' --timeout 5m && srun ...   every host below the limit"))]
    Wait(Lazy<WaitArgs>),

    /// Supervise a server: contain it, watch readiness and hangs, diagnose, free, restart.
    #[command(
        after_help = exit::after_help(Program::Run, "Containment: a cgroup v2 of its own where one can be made (root or a delegated
subtree), else its own session and process group with gpureap as child subreaper.
On a crash or hang: a diagnostic bundle in STATE_DIR/bundles, the whole tree freed and
verified, then a restart with exponential backoff. A crash is any end nobody asked for, exit
code 0 included (vLLM exits 0 when its engine core dies). Ctrl-C stops it gracefully, then
by force.

Examples:
  gpureap run --ready-url http://127.0.0.1:30000/health --log sglang.log -- \\
      python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct --tp 8
  gpureap run --ready-log 'Application startup complete' --stall-timeout 10m -- vllm serve ...
  gpureap run --ready-port 8000 --restart never -- ./serve.sh
  gpureap run --dump --state-dir /var/lib/gpureap/sglang   a bundle now, from the running supervisor")
    )]
    Run(Lazy<RunArgs>),

    /// Copy this gpureap to hosts over ssh, atomically, and check it runs there.
    #[command(
        after_help = exit::after_help(Program::Push, "Installs at ~/.local/bin/gpureap, or /usr/local/bin/gpureap when the remote user is
root (--to changes it); `status -H` and `free -H` find it there without --remote-bin.
A host that already has this build is skipped; a different file at the destination that
push did not put there is left alone (exit 1) unless --force.

Examples:
  gpureap push -H 'gpu[01-16]'
  gpureap push -H @hosts.txt --bin ./gpureap-x86_64-glibc2.17 --to /opt/gpureap/bin/gpureap
  gpureap push -H 'gpu[01-16]' && gpureap status -H 'gpu[01-16]'")
    )]
    Push(Lazy<PushArgs>),

    /// Replay a crashed SGLang server on a simulated 8-GPU host: status, free, verify, and what
    /// `fuser -k /dev/nvidia*; sleep 5` would have done instead. No GPU, no root needed.
    #[command(
        after_help = exit::after_help(Program::Demo, "Every process on the simulated host is real (this binary under the command line of
the process it plays); only the GPU driver is simulated. Everything the demo started is
gone when it ends, also on Ctrl-C. It takes about 5 seconds.

The replayed `gpureap free` exits 1, as it would on the real box (GPU 3 keeps memory no
process holds), and the demo shows that; the demo's own exit code is below.

Examples:
  gpureap demo
  gpureap demo --json | jq '.comparison'")
    )]
    Demo(Lazy<DemoArgs>),

    /// A live view of every GPU and its holders; free a holder, a tree, a GPU or all orphans
    /// from it, and watch the driver verify that the memory came back.
    #[command(
        after_help = exit::after_help(Program::Top, "Keys: arrows or j/k move, / filter, t tree, s sort, space tag, x free the tagged
(or the selected process and its descendants), g free the selected GPU, o free all orphans,
? help, q quit. Every free shows the plan first (who is signalled, who is protected and why)
and asks; it is `gpureap free`'s own escalation and verification.

With -H HOST it shows that one host over one ssh (its gpureap top --json), and frees there
through the host's own gpureap free; r reconnects at once when the connection is lost.

Examples:
  gpureap top
  gpureap top --readonly --interval 2s
  gpureap --backend sim:/tmp/gpus top --grace 1s
  gpureap top -H gpu07 --ssh 'ssh -F ~/.ssh/lab.conf'")
    )]
    Top(Lazy<TopArgs>),

    /// Serve GPU memory, holders, orphans and driver health as Prometheus metrics (read-only).
    #[command(
        after_help = exit::after_help(Program::Exporter, "A background thread takes a snapshot every --interval; scrapes are served the
last one, so any number of scrapers cost one scan per interval. Only GET and HEAD
on /metrics are answered. Listens on loopback unless an address is given.
SIGTERM or Ctrl-C ends it (exit 0). docs/monitoring.md has the Prometheus and
Kubernetes set-up.

Examples:
  gpureap exporter                                   http://127.0.0.1:9839/metrics
  gpureap exporter --listen 0.0.0.0:9839 --interval 30s
  gpureap exporter --per-process                     also one series per process and GPU
  curl -s 127.0.0.1:9839/metrics | grep gpureap_gpu_memory_unattributed_bytes")
    )]
    Exporter(Lazy<ExporterArgs>),

    /// One health verdict for the node, for node-problem-detector: exit 0 ok, 1 problem, 3 unknown.
    #[command(
        after_help = exit::after_help(Program::Check, "A problem: GPU memory held by no process, orphaned processes holding memory,
a GPU the driver lost, an Xid of --drain-xids in the kernel log since boot (with the
advice it implies: a reset, or a reboot for Xid 79). Unknown: the driver is unavailable (exit 3; node-problem-detector
reads every code but 0 and 1 as unknown, bad usage's 2 too). The first line of
stdout is the message (short, for a node condition); details follow.

Examples:
  gpureap check                      GPU 1: 5.0 GiB held by no process
  gpureap check --gpu 0-3; echo $?
  gpureap check --drain-xids 48,79,95  GPU 1: Xid 79 at 03:12 UTC (GPU has fallen off the bus)
  deploy/kubernetes/node-problem-detector-gpureap.yaml runs it as a custom plugin")
    )]
    Check(Lazy<CheckArgs>),

    /// Slurm's Epilog, Prolog and HealthCheckProgram: free a job's GPUs, refuse dirty ones, drain.
    ///
    /// epilog frees what an ended job left on its GPUs, prolog refuses GPUs that are not
    /// clean, healthcheck drains a node whose memory no running job explains and resumes one
    /// gpureap drained once it is clean. docs/slurm.md.
    #[command(subcommand)]
    Slurm(SlurmCommand),

    /// Reset GPUs whose memory no process holds (driver-held); refused while any process uses one.
    #[command(
        after_help = exit::after_help(Program::Reset, "A reset is refused while any process has the GPU's device node open
(a CUDA process, nvidia-smi, an exporter): free it first. The result is checked
through the driver.

--plan resets nothing: it names what blocks a reset and how to deal with each, and
exits 0 only when a reset could run now.

Examples:
  gpureap reset --gpu 1
  gpureap reset --plan --gpu 3          what blocks a reset of GPU 3, read-only
  gpureap reset --plan --gpu all --json the same for every GPU, as one JSON document
  gpureap --backend sim:/tmp/gpus reset --gpu 0,1")
    )]
    Reset(Lazy<ResetArgs>),

    /// Write a diagnostic bundle for processes gpureap did not start: where each one waits
    /// (Python and native stacks with py-spy, kernel stacks without), its tree, the GPUs.
    /// Read-only: nothing is signalled.
    #[command(
        after_help = exit::after_help(Program::Dump, "Selects as `free` does (--pid: the process and its descendants; --match, --gpu: the GPU
users in scope and their descendants), then writes OUT/<unix ms>-dump/ (0700) with
summary.txt, stacks.txt, processes.txt, gpu.txt and bundle.json (docs/run.md, the bundle).
With py-spy on PATH (pip install py-spy) each process's Python and native stacks are read
(`py-spy dump --native`, at most 20s a process, 60s in all); without it, kernel stacks.

Examples:
  gpureap dump --pid 4242
  gpureap dump --match 'sglang::scheduler' --out /var/tmp/hang
  gpureap dump --gpu 3")
    )]
    Dump(Lazy<DumpArgs>),

    /// Plan a server before starting it: the KV cache it will get on these GPUs, how many
    /// requests it holds at once, and what the memory others hold costs it.
    #[command(
        after_help = exit::after_help(Program::Plan, "Reads the launch command you already have (after --): SGLang
(python3 -m sglang.launch_server, sglang serve) or vLLM (vllm serve,
python3 -m vllm.entrypoints.openai.api_server), the model's config.json (a local
directory or the Hugging Face cache), and this host's GPUs through the same snapshot as
`status`. No GPU work, no network. docs/plan.md lists the flags it understands.
The engine's version is read from the files of the interpreter the command would run
(its dist-info METADATA; nothing is run) and that version's rules apply: vLLM 0.26.0 or
0.33.0, SGLang 0.5.9, 0.5.14 or 0.5.23, the nearest for another (--engine-version to give one).
A holder that costs every rank at most 1% of the clean pool's tokens (and does not stop
the start) is reported but does not change the verdict; nor do several within 1% together.

Examples:
  gpureap plan -- python3 -m sglang.launch_server --model-path moonshotai/Kimi-K2.5 --tp 8 \\
      --mem-fraction-static 0.85
  gpureap plan --avg-prompt 800 --avg-output 4100 --concurrency 150 -- sglang serve ...
  gpureap plan --gpu-memory 97871MiB --gpus 8 --weights 72.8GiB -- python3 -m sglang.launch_server ...
  gpureap plan --from-log sglang.log -- python3 -m sglang.launch_server ...
  gpureap plan --json -- vllm serve meta-llama/Llama-3.1-8B-Instruct | jq .fit.verdict")
    )]
    Plan(Lazy<PlanArgs>),

    /// Free what a policy names, unattended: orphans, gone supervisors, ended Slurm jobs.
    ///
    /// With --watch it keeps running, re-scanning every --interval; without --enforce it only
    /// reports what it would free. Every decision is a JSON line in --log. docs/watch.md.
    #[command(
        after_help = exit::after_help(Program::Reap, "Rules (combinable; each a flag and a key of --config): --orphans, --supervisor-gone,
--slurm-ended, --container-gone. --match, --user and --gpu narrow every rule. Nothing younger than
--older-than is touched; protected names, monitors, gpureap and its ancestors never.
A holder is freed only when two consecutive scans agree, never in a scan where the driver
failed, a GPU was lost or /proc was partly unreadable. Freeing is `free`'s: SIGTERM,
--grace, SIGSTOP+SIGKILL, verified through the driver. SIGTERM ends the watch between
scans; a free in progress is finished first, so nothing is left stopped.

Examples:
  gpureap reap --watch --orphans --older-than 10m                 dry run: what it would free
  gpureap reap --watch --orphans --older-than 10m --enforce --log /var/lib/gpureap/reap.jsonl
  gpureap reap --watch --config /etc/gpureap/reap.toml --listen 127.0.0.1:9840
  gpureap reap --orphans --supervisor-gone --older-than 30m --enforce   one pass (two scans), then exit")
    )]
    Reap(Lazy<ReapArgs>),
}

/// A share of a GPU's holders, above 0 and at most 1.
fn share(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(share) if share > 0.0 && share <= 1.0 => Ok(share),
        _ => Err(format!(
            "invalid --max-share '{text}': expected a fraction above 0 and at most 1, like 0.5"
        )),
    }
}

#[derive(Debug, Args)]
pub struct ReapArgs {
    /// Keep running: re-scan every --interval and free what the policy names, until SIGTERM.
    /// Without it: one pass (two scans an --interval apart), then exit.
    #[arg(long)]
    pub watch: bool,
    /// Read the policy from this TOML file; its keys are these flags' long names
    /// (orphans = true, older-than = "10m", match = ["sglang::"]); flags given here win. It
    /// must be root's or yours, writable and replaceable by no one else (docs/watch.md).
    /// Example: gpureap reap --watch --config /etc/gpureap/reap.toml
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Rule: orphaned holders (a crashed launcher's workers, as `free --orphans`), with
    /// their descendants. Example: --orphans --older-than 10m
    #[arg(long)]
    pub orphans: bool,
    /// Rule: holders started by a `gpureap run` whose supervisor is gone.
    /// Example: --supervisor-gone --older-than 5m
    #[arg(long)]
    pub supervisor_gone: bool,
    /// Rule: holders whose environment names a Slurm job (SLURM_JOB_ID) that has ended
    /// (Slurm no longer knows it, or knows it ended). Example: --slurm-ended --older-than 2m
    #[arg(long)]
    pub slurm_ended: bool,
    /// Rule: holders whose container or pod a node source says is gone (`docker rm -f`, a
    /// deleted pod); the sources are --host-root and --kubelet-socket. Example: --container-gone
    #[arg(long)]
    pub container_gone: bool,
    /// Narrows every rule: holders whose command line matches this regex (repeatable).
    /// Example: --match 'sglang::|vllm'
    #[arg(long = "match", value_name = "REGEX", value_parser = match_regex)]
    pub patterns: Vec<Regex>,
    /// Narrows every rule: holders owned by this user name or uid (repeatable).
    /// Example: --user 1000
    #[arg(long, value_name = "NAME")]
    pub user: Vec<String>,
    /// Narrows every rule: holders of these GPUs: 0,2,5 or 0-3 (repeatable). Example: --gpu 0-3
    #[arg(long, value_name = "LIST", value_parser = gpu_list)]
    pub gpu: Vec<GpuList>,
    /// The age floor: no process younger than this is touched, whatever the rule.
    /// Example: --older-than 10m
    #[arg(long, default_value = "10m", value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub older_than: Duration,
    /// How often to scan. Example: --interval 30s
    #[arg(long, default_value = "10s", value_name = "DUR", value_parser = scan_interval, allow_hyphen_values = true)]
    pub interval: Duration,
    #[command(flatten)]
    pub signal: SignalArgs,
    /// A rule that names more than this share of a GPU's holders frees nothing there that
    /// scan and reports it instead. Example: --max-share 0.5
    #[arg(long, default_value = "1", value_name = "FRACTION", value_parser = share)]
    pub max_share: f64,
    /// Signal for real. Without it, only report what would be freed and why.
    #[arg(long)]
    pub enforce: bool,
    /// Append every decision as a JSON line to this file (created 0600, never through a
    /// link, reopened for each line so that logrotate may move it). Example: --log /var/lib/gpureap/reap.jsonl
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// With --watch: serve Prometheus metrics here, the exporter's GPU series and the watch's
    /// own (gpureap_reaped_total{reason,outcome}, ...). Example: --listen 127.0.0.1:9840
    #[arg(long, value_name = "IP:PORT", value_parser = listen_address, requires = "watch")]
    pub listen: Option<std::net::SocketAddr>,
    /// With --slurm-ended: the scontrol to ask (squeue beside it) [default: as `slurm epilog`].
    #[arg(long, value_name = "PATH", requires = "slurm_ended")]
    pub scontrol: Option<PathBuf>,
    #[command(flatten)]
    pub sources: SourcesArgs,
}

/// `run --restart`, as typed (`config::run` makes it the run's `Restart`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RestartArg {
    Never,
    OnFailure,
    Always,
}

/// The exporter's address when `--listen` is not given. Loopback only: any
/// other address must be given explicitly. Not dcgm-exporter's 9400 nor
/// node_exporter's 9100 (docs/monitoring.md).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9839";

#[derive(Debug, Args)]
pub struct ExporterArgs {
    /// Address and port to listen on; anything but loopback must be given here.
    #[arg(long, default_value = DEFAULT_LISTEN, value_name = "IP:PORT", value_parser = listen_address)]
    pub listen: std::net::SocketAddr,
    /// How often a snapshot is taken (scrapes in between are served the last one).
    #[arg(long, default_value = "15s", value_name = "DUR", value_parser = scan_interval, allow_hyphen_values = true)]
    pub interval: Duration,
    /// Also gpureap_process_gpu_memory_bytes, one series per process and GPU
    /// (labels pid, comm, user, flags): the cardinality grows with the host.
    #[arg(long)]
    pub per_process: bool,
    #[command(flatten)]
    pub sources: SourcesArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// GPUs to check: 0,2,5 or 0-3 or all, GPU-<uuid>, a MIG instance 0:1 or MIG-<uuid>
    /// (repeatable). Example: --gpu 0:1
    #[arg(long, value_name = "LIST", value_parser = gpu_list)]
    pub gpu: Vec<GpuList>,
    #[command(flatten)]
    pub xids: DrainXidArgs,
    #[command(flatten)]
    pub sources: SourcesArgs,
}

/// `gpureap slurm ...`: the programs slurm.conf names.
#[derive(Debug, Subcommand)]
#[command(after_help = exit::help(Program::Slurm))]
pub enum SlurmCommand {
    /// Epilog=: free what the ended job left on its GPUs; drain the node if they stay held.
    #[command(
        after_help = exit::after_help(Program::SlurmEpilog, "Reads SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_GPUS (else CUDA_VISIBLE_DEVICES)
and SLURMD_NODENAME, as slurmd sets them. The job's processes (its uid, or
SLURM_JOB_ID=<id> in their environment) that use its GPUs are freed with their
descendants; root's daemons, monitors and other users' processes never are.
A job without GPUs costs one environment read.

Examples (slurm.conf: Epilog=/etc/slurm/gpureap-epilog.sh, see contrib/slurm/):
  gpureap slurm epilog
  gpureap slurm epilog --reset --log /var/lib/gpureap/slurm.jsonl
  SLURM_JOB_ID=42 SLURM_JOB_UID=1000 SLURM_JOB_GPUS=0,1 SLURMD_NODENAME=$(hostname -s) \\
      gpureap slurm epilog --dry-run")
    )]
    Epilog(Lazy<SlurmEpilogArgs>),

    /// Prolog=: the job's GPUs must be clean before it starts, else drain (Slurm requeues the job).
    #[command(
        after_help = exit::after_help(Program::SlurmProlog, "Clean means: no process uses the GPU and no memory beyond the driver's
bookkeeping is held. A release in progress is waited for up to --wait.

Examples (slurm.conf: Prolog=/etc/slurm/gpureap-prolog.sh):
  gpureap slurm prolog
  gpureap slurm prolog --wait 5s --log /var/lib/gpureap/slurm.jsonl")
    )]
    Prolog(Lazy<SlurmPrologArgs>),

    /// HealthCheckProgram=: drain the node when memory is held by no running job's process or by
    /// no process; resume a node gpureap drained once it is clean (never an admin's drain).
    #[command(
        after_help = exit::after_help(Program::SlurmHealthcheck, "Examples (slurm.conf: HealthCheckProgram=/etc/slurm/gpureap-healthcheck.sh):
  gpureap slurm healthcheck
  gpureap slurm healthcheck --reset --node gpu-node-07
  gpureap slurm healthcheck --dry-run")
    )]
    Healthcheck(Lazy<SlurmHealthcheckArgs>),
}

/// What every `gpureap slurm` command takes.
#[derive(Debug, Args)]
pub struct SlurmCommonArgs {
    /// scontrol to drain and resume with [default: the first of /usr/bin, /usr/local/bin,
    /// /opt/slurm/bin, /usr/local/slurm/bin, /bin, then PATH].
    #[arg(long, value_name = "PATH")]
    pub scontrol: Option<PathBuf>,
    /// Also append every decision as a JSON line to this file (created 0600; never through a link).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Report what would be done; signal, reset, drain and resume nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Give up after this long in all: drain the node with a reason and exit 1.
    #[arg(long, default_value = "30s", value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct SlurmEpilogArgs {
    #[command(flatten)]
    pub common: SlurmCommonArgs,
    /// How long the job's leftovers get after SIGTERM before SIGSTOP+SIGKILL.
    #[arg(long, default_value = "2s", value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub grace: Duration,
    /// Reset a GPU whose only holder is driver-held memory, instead of draining.
    #[arg(long)]
    pub reset: bool,
}

#[derive(Debug, Args)]
pub struct SlurmPrologArgs {
    #[command(flatten)]
    pub common: SlurmCommonArgs,
    /// How long to wait for a release in progress before refusing the GPUs.
    #[arg(long, default_value = "5s", value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub wait: Duration,
}

#[derive(Debug, Args)]
pub struct SlurmHealthcheckArgs {
    #[command(flatten)]
    pub common: SlurmCommonArgs,
    /// The node to drain or resume [default: $SLURMD_NODENAME, else the short host name].
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// Reset a GPU whose only holder is driver-held memory, instead of draining.
    #[arg(long)]
    pub reset: bool,
    #[command(flatten)]
    pub xids: DrainXidArgs,
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("which").required(true).multiple(true))]
pub struct DumpArgs {
    /// This process and its descendants (repeatable). Example: gpureap dump --pid 4242
    #[arg(long, value_name = "PID", value_parser = pid, group = "which")]
    pub pid: Vec<u32>,
    /// GPU users whose command line matches this regex, and their descendants (repeatable).
    /// Example: gpureap dump --match 'sglang::'
    #[arg(long = "match", value_name = "REGEX", value_parser = match_regex, group = "which")]
    pub patterns: Vec<Regex>,
    /// GPU users of these GPUs and their descendants: 0,2,5 or 0-3 or all (repeatable).
    /// Example: gpureap dump --gpu 3
    #[arg(long, value_name = "LIST", value_parser = gpu_list, group = "which")]
    pub gpu: Vec<GpuList>,
    /// Make the bundle's folder here; refused if anyone but you or root could tamper with it
    /// [default: $XDG_STATE_HOME/gpureap/dumps, or ~/.local/state/gpureap/dumps].
    /// Example: gpureap dump --pid 4242 --out /var/tmp/hang
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ResetArgs {
    /// GPUs to reset: 0,2,5 or 0-3 or all, or GPU-<uuid> (repeatable); whole GPUs only, a MIG
    /// instance (0:1) is refused. Example: --gpu 0
    #[arg(long, required = true, value_name = "LIST", value_parser = gpu_list)]
    pub gpu: Vec<GpuList>,
    /// Reset nothing: name every blocker to a reset of each GPU by role (persistence daemon,
    /// DCGM, fabric manager, display server, CUDA users), persistence mode, driver modules in
    /// use, NVSwitch; exit 0 when a reset could run now. Example: gpureap reset --plan --gpu 3
    #[arg(long)]
    pub plan: bool,
    /// With --plan: print the plan as one JSON document (kind `reset_plan`, docs/json.md).
    /// Example: gpureap reset --plan --gpu 3 --json
    #[arg(long, requires = "plan")]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("readiness").multiple(false))]
pub struct RunArgs {
    /// Ready when this URL answers 2xx (e.g. SGLang's or vLLM's /health); health is then checked.
    #[arg(long, value_name = "URL", group = "readiness", value_parser = ready_url)]
    pub ready_url: Option<String>,
    /// Ready when this local TCP port accepts connections.
    #[arg(long, value_name = "PORT", group = "readiness",
          value_parser = clap::value_parser!(u16).range(1..))]
    pub ready_port: Option<u16>,
    /// Ready when a log line matches this regex.
    #[arg(long, value_name = "REGEX", group = "readiness", value_parser = log_regex)]
    pub ready_log: Option<Regex>,
    /// A hang: not ready this long after the start.
    #[arg(long, default_value = "30m", value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub startup_timeout: Duration,
    /// A hang: no new log output for this long while not yet ready.
    #[arg(long, default_value = "5m", value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub stall_timeout: Duration,
    /// How often --ready-url is checked after ready; 3 failures in a row are a hang.
    #[arg(long, default_value = "10s", value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub health_interval: Duration,
    /// When to restart: never, on-failure (a hang, or any end nobody asked for, exit code 0
    /// included; not a SIGTERM or SIGINT someone sent it), always.
    #[arg(long, default_value = "on-failure", value_name = "WHEN", value_enum)]
    pub restart: RestartArg,
    /// Give up after this many restarts.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub max_restarts: u32,
    /// Pause before the first restart; doubled for each further one (at most 5m).
    #[arg(long, default_value = "2s", value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub backoff: Duration,
    /// On stop, how long the server gets after SIGTERM before SIGSTOP+SIGKILL.
    #[arg(long, default_value = "10s", value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub grace: Duration,
    /// On stop, how long to wait for the driver to confirm the GPUs are free.
    #[arg(long, default_value = "60s", value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub stop_timeout: Duration,
    /// Also append the server's output to this file (created 0600; never through a link, nor
    /// into another user's file, a hard link or a directory others may write: docs/run.md).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Where good starts are remembered and bundles written, private to you; refused if anyone
    /// but you or root could tamper with it
    /// [default: $XDG_STATE_HOME/gpureap/<command>, or ~/.local/state/gpureap/<command>].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Do not use a cgroup; contain by session, process group and subreaper only.
    #[arg(long)]
    pub no_cgroup: bool,
    /// Serve the supervisor's metrics (starts, ready, hangs, crashes, restarts) at
    /// http://IP:PORT/metrics, e.g. 127.0.0.1:9840.
    #[arg(long, value_name = "IP:PORT", value_parser = listen_address)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Before each start, plan the server's command line on this host's GPUs (as `gpureap plan`
    /// does) and refuse to start while memory others hold would shrink its KV cache (SGLang) or
    /// stop it starting (vLLM), or while it cannot fit at all.
    #[arg(long)]
    pub plan: bool,
    /// With --plan: wait up to this long for the holders to go, then start; on timeout exit 1,
    /// nothing started.
    #[arg(long, value_name = "DUR", value_parser = duration, requires = "plan",
          conflicts_with = "accept_shrink")]
    pub wait_for_fit: Option<Duration>,
    /// With --plan: start even while others' memory shrinks the KV cache, saying what it costs.
    #[arg(long, requires = "plan")]
    pub accept_shrink: bool,
    /// Start nothing: ask the `gpureap run` supervising with this state directory (--state-dir,
    /// or the default one of the command after --) for a diagnostic bundle now, as SIGUSR1 to
    /// it does, and print its folder. Nothing is stopped or restarted.
    /// Example: gpureap run --dump --state-dir /var/lib/gpureap/sglang
    #[arg(long, conflicts_with_all = ["plan", "log", "metrics"])]
    pub dump: bool,
    /// The server's command line.
    #[arg(last = true, required_unless_present = "dump", value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct PushArgs {
    /// Where to install on each host: an absolute path, or ~/… for the remote user's home
    /// [default: ~/.local/bin/gpureap, or /usr/local/bin/gpureap as root].
    #[arg(long, value_name = "PATH")]
    pub to: Option<String>,
    /// The binary to push [default: this gpureap].
    #[arg(long, value_name = "FILE")]
    pub bin: Option<PathBuf>,
    /// Replace a file at the destination that push did not put there.
    #[arg(long)]
    pub force: bool,
    /// Print JSON (docs/json.md, kind "fleet").
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub fleet: HostsArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// GPUs to show: 0,2,5 or 0-3 or all, GPU-<uuid>, a MIG instance 0:1 or MIG-<uuid>
    /// (repeatable). Example: --gpu 0:1
    #[arg(long, value_name = "LIST", value_parser = gpu_list)]
    pub gpu: Vec<GpuList>,
    /// Show holders inside their process trees.
    #[arg(long)]
    pub tree: bool,
    /// Print JSON (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
    /// Print the exporter's metrics once, in the Prometheus text format (for
    /// node_exporter's textfile collector: write a temporary file, then rename it).
    #[arg(long, conflicts_with_all = ["json", "tree"])]
    pub prometheus: bool,
    /// With --prometheus: also one series per process and GPU.
    #[arg(long, requires = "prometheus")]
    pub per_process: bool,
    /// Also list monitors and processes with a GPU node open that the driver does not list,
    /// by reading every process's descriptors. Without it that is done only where some GPU's
    /// memory is not explained by the driver's list (then always); it costs time on a host
    /// with many processes. Example: gpureap status --monitors
    #[arg(long, conflicts_with = "prometheus")]
    pub monitors: bool,
    #[command(flatten)]
    pub sources: SourcesArgs,
    #[command(flatten)]
    pub fleet: HostsArgs,
}

#[derive(Debug, Args)]
pub struct FreeArgs {
    /// Holders of these GPUs: 0,2,5 or 0-3 or all, GPU-<uuid>, or of a MIG instance only: 0:1
    /// or MIG-<uuid> (repeatable). Example: --gpu 0:1
    #[arg(long, value_name = "LIST", value_parser = gpu_list)]
    pub gpu: Vec<GpuList>,
    /// This process and its descendants (repeatable). Naming a process overrides
    /// the monitor rule and name protection, never PID 1, gpureap or its ancestors.
    #[arg(long, value_name = "PID", value_parser = pid)]
    pub pid: Vec<u32>,
    /// Holders whose command line matches this regex (repeatable).
    #[arg(long = "match", value_name = "REGEX", value_parser = match_regex)]
    pub patterns: Vec<Regex>,
    /// Holders owned by this user name or uid (repeatable).
    #[arg(long, value_name = "NAME")]
    pub user: Vec<String>,
    /// Orphaned holders: re-parented to PID 1 or a subreaper, in a process group whose
    /// leader is gone, not leading their own (a crashed launcher's workers); and servers
    /// whose `gpureap run` died.
    #[arg(long)]
    pub orphans: bool,
    /// Every process in a `gpureap run` cgroup whose gpureap is gone (SIGKILLed, OOM-killed),
    /// GPU user or not; the emptied cgroups are then removed.
    /// Example: gpureap free --stale-runs --dry-run
    #[arg(long)]
    pub stale_runs: bool,
    /// Every process of this container, GPU user or not: its full id, a unique prefix of at
    /// least 12 hex digits, or its name (docker/podman name or Kubernetes container name, from
    /// the node's sources); repeatable. Protected names and monitors in it are still spared.
    /// Example: gpureap free --container 3f2a9c81d4e7 --dry-run
    #[arg(long, value_name = "ID|NAME", value_parser = container_ref)]
    pub container: Vec<ContainerRef>,
    /// Every process of this Kubernetes pod (all its containers, GPU users or not): NAMESPACE/NAME
    /// (names from the kubelet or /var/log/pods) or its UID; repeatable.
    /// Example: gpureap free --pod ml/llama-0 --dry-run
    #[arg(long, value_name = "NAMESPACE/NAME|UID", value_parser = pod_ref)]
    pub pod: Vec<PodRef>,
    /// Every process in this cgroup and the cgroups below it: the path as /proc/PID/cgroup
    /// spells it, or its directory under a cgroup mount; repeatable.
    /// Example: gpureap free --cgroup /kubepods.slice/kubepods-besteffort.slice --dry-run
    #[arg(long, value_name = "PATH", value_parser = cgroup_ref)]
    pub cgroup: Vec<CgroupRef>,
    /// Stop an MPS server on purpose, with every client that goes through it (the plan names
    /// them): its PID, or gpu:N for every MPS server on GPU N; repeatable. Servers and the MPS
    /// control daemon are otherwise never signalled, not even with --pid (docs/mps.md).
    /// Example: gpureap free --mps-server 5120 --dry-run
    #[arg(long, value_name = "PID|gpu:N", value_parser = mps_server)]
    pub mps_server: Vec<crate::snapshot::mps::ServerRef>,
    /// Every GPU user on the host (still never the protected set or monitors).
    #[arg(long, conflicts_with_all = ["gpu", "pid", "patterns", "user", "orphans", "stale_runs", "container", "pod", "cgroup", "mps_server"])]
    pub all: bool,
    #[command(flatten)]
    pub signal: SignalArgs,
    /// Show what would be signalled, and signal nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Print JSON (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sources: SourcesArgs,
    #[command(flatten)]
    pub fleet: HostsArgs,
}

/// `--grace`'s default wherever holders are freed as `free` frees them
/// (`free`, the frees `top` starts, `reap`): [`SignalArgs`]. `slurm epilog`
/// (a job's leftovers, within the epilog's budget) and `run` (a server
/// stopping) keep defaults of their own.
pub const DEFAULT_GRACE: &str = "5s";

/// `--timeout`'s default there.
pub const DEFAULT_TIMEOUT: &str = "30s";

/// How a free signals, verifies and spares: the one group of `--grace`,
/// `--timeout` and `--protect` for every command that frees as `free` does
/// (`free`, `top`, `reap`), with one set of defaults; a `reap --config`
/// file's keys are these flags, so its defaults are these too.
/// `request::Signalling` is what they mean.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct SignalArgs {
    /// How long the holders get after SIGTERM before SIGSTOP+SIGKILL. Example: --grace 2s
    #[arg(long, default_value = DEFAULT_GRACE, value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub grace: Duration,
    /// After the grace period, how long to wait for the driver to confirm the memory is back.
    /// While a GPU's memory is still going down then, up to this or 60s more (the longer).
    /// Example: --timeout 1m
    #[arg(long, default_value = DEFAULT_TIMEOUT, value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub timeout: Duration,
    /// Also protect processes with this name (repeatable). Example: --protect jupyter-lab
    #[arg(long, value_name = "NAME")]
    pub protect: Vec<String>,
}

/// A command's arguments as given no flag: their defaults, read from their
/// definitions (`gpureap demo --top` is `gpureap top`'s). For a group none
/// of whose flags is required.
pub fn defaults<T: Args + FromArgMatches>() -> T {
    let matches = T::augment_args(clap::Command::new("defaults"))
        .try_get_matches_from(["defaults"])
        .expect("no flag is required");
    T::from_arg_matches(&matches).expect("the defaults are typed")
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// GPUs to wait for: 0,2,5 or 0-3 or all, GPU-<uuid>, a MIG instance 0:1 or MIG-<uuid>
    /// (repeatable). Example: --gpu 0:1
    #[arg(long, default_value = "all", value_name = "LIST", value_parser = gpu_list)]
    pub gpu: Vec<GpuList>,
    /// Free enough means memory used below this size.
    #[arg(long, default_value = "1GiB", value_name = "SIZE", value_parser = positive_size)]
    pub below: u64,
    /// Give up after this long, exit 1 and list the holders.
    #[arg(long, default_value = "60s", value_name = "DUR", value_parser = duration, allow_hyphen_values = true)]
    pub timeout: Duration,
    /// Wait out --timeout even where a GPU's memory held by no process keeps it at or above
    /// --below (only a reset or a reboot clears it); without it, wait says so and exits 1 at once.
    #[arg(long)]
    pub keep_waiting: bool,
    /// Print JSON (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub fleet: HostsArgs,
}

/// Where the node's container sources are read (docs/containers.md): names,
/// whether a holder's container still exists, the GPUs its pod was allocated.
/// Each source is optional; what cannot be read is a note, never an error.
#[derive(Debug, Args, Clone, Default, PartialEq, Eq)]
#[command(next_help_heading = "Containers")]
pub struct SourcesArgs {
    /// The node's root, under which its container state is read (var/log/pods,
    /// var/lib/docker, run/containerd, var/lib/containers): the folder a DaemonSet
    /// mounts the node at. Example: --host-root /host [default: /]
    #[arg(long, value_name = "DIR", value_parser = some_path)]
    pub host_root: Option<PathBuf>,
    /// The kubelet's pod-resources socket, asked for each pod's names and GPUs.
    /// Example: --kubelet-socket /var/lib/kubelet/pod-resources/kubelet.sock
    /// [default: HOST_ROOT/var/lib/kubelet/pod-resources/kubelet.sock]
    #[arg(long, value_name = "PATH", value_parser = some_path)]
    pub kubelet_socket: Option<PathBuf>,
}

/// A path that is not empty (an empty one would name the working directory).
fn some_path(text: &str) -> Result<PathBuf, String> {
    if text.is_empty() {
        return Err("empty path: give a folder or file".to_string());
    }
    Ok(PathBuf::from(text))
}

/// Running on many hosts over ssh (docs/fleet.md).
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Many hosts (over ssh)")]
pub struct HostsArgs {
    /// Run on these hosts over ssh: gpu[01-16,20], node[1-3]-ib, a,b,c, or @FILE (one host a
    /// line, # comments); repeatable.
    #[arg(short = 'H', long = "hosts", value_name = "LIST", value_parser = hosts)]
    pub hosts: Vec<HostList>,
    /// The ssh command, split like a shell would (as rsync's -e), e.g. "ssh -F ~/.ssh/lab.conf".
    /// gpureap adds -o BatchMode=yes and -o ConnectTimeout, never anything about host keys.
    #[arg(long, env = "GPUREAP_SSH", default_value = "ssh", value_name = "CMD")]
    pub ssh: String,
    /// The gpureap to run on the hosts: a path, or a name on the remote PATH.
    #[arg(
        long,
        default_value = "gpureap",
        value_name = "PATH",
        requires = "hosts"
    )]
    pub remote_bin: String,
    /// At most this many hosts at once.
    #[arg(long, default_value = "32", value_name = "N", value_parser = parallel, requires = "hosts")]
    pub parallel: usize,
    /// ssh's connection timeout, per host.
    #[arg(long, default_value = "10s", value_name = "DUR", value_parser = duration, requires = "hosts")]
    pub connect_timeout: Duration,
    /// Give up on a host that has not answered after this long [default: the connect timeout
    /// plus 30s for status; plus the command's own --timeout (and --grace) for wait and free].
    #[arg(long, value_name = "DUR", value_parser = duration, requires = "hosts")]
    pub host_timeout: Option<Duration>,
}

/// The largest count taken (2^40 tokens or requests): beyond any server,
/// and two of them add up without overflowing.
const COUNT_MAX: u64 = 1 << 40;

/// A count above zero (tokens, requests, GPUs).
fn count(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(n) if (1..=COUNT_MAX).contains(&n) => Ok(n),
        _ => Err(format!(
            "invalid number '{text}': expected a whole number from 1 to {COUNT_MAX}, like 4100"
        )),
    }
}

fn gpu_count(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n) if (1..=units::MAX_GPU_INDEX + 1).contains(&n) => Ok(n),
        _ => Err(format!(
            "invalid --gpus '{text}': expected a number of GPUs, 1 to {}",
            units::MAX_GPU_INDEX + 1
        )),
    }
}

/// An engine version for the planner (`0.33.0`, `0.5.23.post1`).
fn engine_version(text: &str) -> Result<String, String> {
    crate::plan::version::parse_flag(text)
}

/// A size for the planner: bytes (`80G` and `80GiB` both mean 80 × 2^30).
fn size(text: &str) -> Result<u64, String> {
    units::parse_size(text)
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Average prompt tokens per request (for the concurrency the pool holds).
    #[arg(long, value_name = "TOKENS", value_parser = count)]
    pub avg_prompt: Option<u64>,
    /// Average output tokens per request.
    #[arg(long, value_name = "TOKENS", value_parser = count)]
    pub avg_output: Option<u64>,
    /// Requests the clients send at once: how many the server holds, how many queue, and
    /// which levers reach it.
    #[arg(long, value_name = "N", value_parser = count)]
    pub concurrency: Option<u64>,
    /// Plan for a hypothetical clean box with GPUs of this total memory (no snapshot taken).
    #[arg(long, value_name = "SIZE", value_parser = positive_size)]
    pub gpu_memory: Option<u64>,
    /// With --gpu-memory: how many such GPUs [default: as many as the command uses].
    #[arg(long, value_name = "N", value_parser = gpu_count, requires = "gpu_memory")]
    pub gpus: Option<u32>,
    /// Free memory per GPU as the engine measures it at start (after its own CUDA context),
    /// instead of what the GPUs have free now.
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub gpu_free: Option<u64>,
    /// Weights (and whatever else loads before the KV pool) per GPU once loaded, instead of
    /// the estimate from the checkpoint.
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub weights: Option<u64>,
    /// KV-cache memory per GPU, instead of the engine's budget rule.
    #[arg(long, value_name = "SIZE", value_parser = positive_size)]
    pub kv_memory: Option<u64>,
    /// Host memory available for a host KV tier [default: MemAvailable of /proc/meminfo].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub host_memory: Option<u64>,
    /// A previous start's log: its measured weights (vLLM: its KV budget) replace the
    /// estimates, and the tokens it logged are shown beside what the rule predicts from it.
    #[arg(long, value_name = "FILE")]
    pub from_log: Option<PathBuf>,
    /// The model's config.json (or its directory), instead of finding it from the command.
    #[arg(long, value_name = "PATH")]
    pub model_config: Option<PathBuf>,
    /// Plan with this engine version's rules (the nearest kept) instead of the version the
    /// command's interpreter has installed. Example: --engine-version 0.33.0
    #[arg(long, value_name = "VERSION", value_parser = engine_version)]
    pub engine_version: Option<String>,
    /// Print JSON (docs/json.md, kind "plan").
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub fleet: HostsArgs,
    /// The engine's command line, as you would start it.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Show only: no key signals anything.
    #[arg(long)]
    pub readonly: bool,
    /// How often the view is brought up to date: a full look when the driver's
    /// figures or the holders changed (at once), or every sixth time; a cheap
    /// check otherwise. Example: --interval 2s
    #[arg(long, default_value = "1s", value_name = "DUR", value_parser = positive_duration)]
    pub interval: Duration,
    #[command(flatten)]
    pub signal: SignalArgs,
    /// No view: one `status` document (docs/json.md) a line on stdout every --interval, until
    /// stdout or stdin closes or a signal comes; what `top -H` reads from the host.
    /// Example: gpureap top --json --interval 2s | jq -c '[.gpus[].memory_used]'
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub fleet: HostsArgs,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Print the demo's facts as JSON instead of its transcript: who was signalled, who
    /// survived, the driver-held GPU, the comparison (docs/json.md).
    #[arg(long)]
    pub json: bool,
    /// Stage the same crashed host and open `gpureap top` on it instead of the transcript;
    /// everything staged is gone when the view closes. Example: gpureap demo --top
    #[arg(long, conflicts_with = "json")]
    pub top: bool,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// A subcommand's arguments are defined when it is built, not before,
    /// and keep its own about (not a flattened group's doc comment).
    #[test]
    fn a_subcommands_arguments_are_defined_only_when_it_is_built() {
        let unbuilt = super::Cli::command();
        let status = unbuilt.find_subcommand("status").expect("status");
        assert_eq!(status.get_arguments().count(), 0);
        let slurm = unbuilt.find_subcommand("slurm").expect("slurm");
        let epilog = slurm.find_subcommand("epilog").expect("slurm epilog");
        assert_eq!(epilog.get_arguments().count(), 0);
        let mut built = super::Cli::command();
        built.build();
        for (name, about) in [
            (
                "status",
                "Show each GPU, its memory, and every process that holds or watches it",
            ),
            (
                "free",
                "Free GPUs: signal the holders in scope and their descendants, then verify through the driver",
            ),
            (
                "check",
                "One health verdict for the node, for node-problem-detector: exit 0 ok, 1 problem, 3 unknown",
            ),
        ] {
            let command = built.find_subcommand(name).expect(name);
            assert!(command.get_arguments().any(|arg| arg.get_id() == "backend"));
            assert_eq!(
                command.get_about().map(ToString::to_string).as_deref(),
                Some(about)
            );
        }
    }

    /// `--drain-xids`'s default as typed is the documented list.
    #[test]
    fn the_default_drain_list_is_one() {
        assert_eq!(
            super::DEFAULT_DRAIN_XIDS,
            crate::driver::evidence::default_drain_list()
        );
    }
}
