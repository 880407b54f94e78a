//! The command line as typed. `config.rs` turns this into what the program acts
//! on, so that nothing past it sees flag spelling.

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "gpureap",
    version,
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
  gpureap free --pid 4242 --yes --json"
    )]
    Free(FreeArgs),

    /// Wait until GPUs are free enough to launch on; exit 1 listing the holders on timeout.
    #[command(after_help = "Examples:
  gpureap wait --gpu 0-3 --timeout 2m && ./launch.sh
  gpureap wait --below 2GiB")]
    Wait(WaitArgs),

    /// Replay a crashed SGLang server on a simulated GPU host: status, free, verify. No GPU needed.
    Demo,
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
    /// Holders whose parent died (re-parented to PID 1).
    #[arg(long)]
    pub orphans: bool,
    /// Every GPU user on the host (still never the protected set or monitors).
    #[arg(long, conflicts_with_all = ["gpu", "pid", "patterns", "user", "orphans"])]
    pub all: bool,
    /// How long to wait after SIGTERM before SIGSTOP+SIGKILL.
    #[arg(long, default_value = "5s", value_name = "DUR")]
    pub grace: String,
    /// How long to wait for the driver to confirm the memory is back.
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
