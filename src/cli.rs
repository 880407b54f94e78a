//! The command line as typed. `config.rs` turns this into what the program acts
//! on, so that nothing past it sees flag spelling.

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "gpureap",
    version,
    args_override_self = true,
    about = "See who holds each NVIDIA GPU, free exactly what you scope, and prove the memory came back.",
    after_help = "Examples:
  gpureap status                       who holds each GPU, with flags (orphaned, zombie, D, hidden, monitor)
  gpureap status --tree --gpu 3        GPU 3's holders inside their process trees
  gpureap free --orphans --dry-run     what freeing the orphaned workers would signal
  gpureap free --match sglang --yes    SIGTERM, grace, SIGSTOP+SIGKILL, re-scan, verify
  gpureap free --gpu 3 --grace 0 --yes kill everything on GPU 3 at once, and verify
  gpureap wait --gpu 0-3 --below 1GiB --timeout 2m && python3 -m sglang.launch_server ...
  gpureap demo                         replay a crashed SGLang server on a simulated GPU host

Exit codes: 0 success (all freed), 1 something still held (or wait timed out), 2 bad usage or input."
)]
pub struct Cli {
    /// GPU driver: auto (NVML if libnvidia-ml loads, else none), nvml, none, or sim:DIR.
    #[arg(
        long,
        global = true,
        env = "GPUREAP_BACKEND",
        default_value = "auto",
        value_name = "BACKEND"
    )]
    pub backend: String,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show each GPU, its memory, and every process that holds or watches it.
    #[command(after_help = "Examples:
  gpureap status
  gpureap status --gpu 0,2 --tree
  gpureap status --json | jq '.gpus[] | {index, memory_used}'")]
    Status(StatusArgs),

    /// Free GPUs: signal the holders in scope and their descendants, then verify through the driver.
    #[command(
        after_help = "Scopes narrow each other: --gpu 3 --orphans is the orphans on GPU 3.
Targets are the GPU users in scope and all their descendants; --pid names a process directly.
Never signalled: gpureap, its ancestors, PID 1, kernel threads, protected names, and monitors.

Examples:
  gpureap free --orphans --dry-run
  gpureap free --match 'sglang::scheduler' --yes
  gpureap free --gpu 3 --grace 0 --timeout 1m --yes
  gpureap free --pid 4242 --yes --json
  gpureap free --stale-runs --yes      what a SIGKILLed `gpureap run` left, and its cgroups"
    )]
    Free(FreeArgs),

    /// Wait until GPUs are free enough to launch on; exit 1 listing the holders on timeout.
    #[command(after_help = "Examples:
  gpureap wait --gpu 0-3 --timeout 2m && ./launch.sh
  gpureap wait --below 2GiB")]
    Wait(WaitArgs),

    /// Supervise a server: contain it, watch readiness and hangs, diagnose, free, restart.
    #[command(
        after_help = "Containment: a cgroup v2 of its own where one can be made (root or a delegated
subtree), else its own session and process group with gpureap as child subreaper.
On a crash or hang: a diagnostic bundle in STATE_DIR/bundles, the whole tree freed and
verified, then a restart with exponential backoff. Ctrl-C stops it gracefully, then by force.

Examples:
  gpureap run --ready-url http://127.0.0.1:30000/health --log sglang.log -- \\
      python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct --tp 8
  gpureap run --ready-log 'Application startup complete' --stall-timeout 10m -- vllm serve ...
  gpureap run --ready-port 8000 --restart never -- ./serve.sh"
    )]
    Run(RunArgs),

    /// Replay a crashed SGLang server on a simulated GPU host: status, free, verify. No GPU needed.
    Demo,
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("readiness").multiple(false))]
pub struct RunArgs {
    /// Ready when this URL answers 2xx (e.g. SGLang's or vLLM's /health); health is then checked.
    #[arg(long, value_name = "URL", group = "readiness")]
    pub ready_url: Option<String>,
    /// Ready when this local TCP port accepts connections.
    #[arg(long, value_name = "PORT", group = "readiness")]
    pub ready_port: Option<u16>,
    /// Ready when a log line matches this regex.
    #[arg(long, value_name = "REGEX", group = "readiness")]
    pub ready_log: Option<String>,
    /// A hang: not ready this long after the start.
    #[arg(long, default_value = "30m", value_name = "DUR")]
    pub startup_timeout: String,
    /// A hang: no new log output for this long while not yet ready.
    #[arg(long, default_value = "5m", value_name = "DUR")]
    pub stall_timeout: String,
    /// How often --ready-url is checked after ready; 3 failures in a row are a hang.
    #[arg(long, default_value = "10s", value_name = "DUR")]
    pub health_interval: String,
    /// When to restart: never, on-failure (crash or hang), always.
    #[arg(long, default_value = "on-failure", value_name = "WHEN")]
    pub restart: String,
    /// Give up after this many restarts.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub max_restarts: u32,
    /// Pause before the first restart; doubled for each further one (at most 5m).
    #[arg(long, default_value = "2s", value_name = "DUR")]
    pub backoff: String,
    /// On stop, how long the server gets after SIGTERM before SIGSTOP+SIGKILL.
    #[arg(long, default_value = "10s", value_name = "DUR")]
    pub grace: String,
    /// On stop, how long to wait for the driver to confirm the GPUs are free.
    #[arg(long, default_value = "60s", value_name = "DUR")]
    pub stop_timeout: String,
    /// Also append the server's output to this file.
    #[arg(long, value_name = "FILE")]
    pub log: Option<std::path::PathBuf>,
    /// Where good starts are remembered and bundles written, private to you; refused if anyone
    /// but you or root could tamper with it
    /// [default: $XDG_STATE_HOME/gpureap/<command>, or ~/.local/state/gpureap/<command>].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<std::path::PathBuf>,
    /// Do not use a cgroup; contain by session, process group and subreaper only.
    #[arg(long)]
    pub no_cgroup: bool,
    /// The server's command line.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// GPUs to show: 0,2,5 or 0-3 or all.
    #[arg(long, value_name = "LIST")]
    pub gpu: Option<String>,
    /// Show holders inside their process trees.
    #[arg(long)]
    pub tree: bool,
    /// Print JSON (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct FreeArgs {
    /// Holders of these GPUs: 0,2,5 or 0-3 or all.
    #[arg(long, value_name = "LIST")]
    pub gpu: Option<String>,
    /// This process and its descendants (repeatable; a monitor is included only this way).
    #[arg(long, value_name = "PID")]
    pub pid: Vec<String>,
    /// Holders whose command line matches this regex (repeatable).
    #[arg(long = "match", value_name = "REGEX")]
    pub patterns: Vec<String>,
    /// Holders owned by this user name or uid (repeatable).
    #[arg(long, value_name = "NAME")]
    pub user: Vec<String>,
    /// Holders whose parent died (re-parented to PID 1), and servers whose `gpureap run` died.
    #[arg(long)]
    pub orphans: bool,
    /// Every process in a `gpureap run` cgroup whose gpureap is gone (SIGKILLed, OOM-killed),
    /// GPU user or not; the emptied cgroups are then removed.
    /// Example: gpureap free --stale-runs --dry-run
    #[arg(long)]
    pub stale_runs: bool,
    /// Every GPU user on the host (still never the protected set or monitors).
    #[arg(long, conflicts_with_all = ["gpu", "pid", "patterns", "user", "orphans", "stale_runs"])]
    pub all: bool,
    /// How long to wait after SIGTERM before SIGSTOP+SIGKILL.
    #[arg(long, default_value = "5s", value_name = "DUR")]
    pub grace: String,
    /// After the grace period, how long to wait for the driver to confirm the memory is back.
    #[arg(long, default_value = "30s", value_name = "DUR")]
    pub timeout: String,
    /// Also protect processes with this name (repeatable).
    #[arg(long, value_name = "NAME")]
    pub protect: Vec<String>,
    /// Show what would be signalled, and signal nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Print JSON (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// GPUs to wait for: 0,2,5 or 0-3 or all.
    #[arg(long, default_value = "all", value_name = "LIST")]
    pub gpu: String,
    /// Free enough means memory used below this size.
    #[arg(long, default_value = "1GiB", value_name = "SIZE")]
    pub below: String,
    /// Give up after this long, exit 1 and list the holders.
    #[arg(long, default_value = "60s", value_name = "DUR")]
    pub timeout: String,
    /// Print JSON (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}
