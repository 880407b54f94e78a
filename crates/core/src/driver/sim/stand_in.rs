//! Stand-ins: the gpureap binary playing a GPU process on the simulated
//! driver, under the real command line of the process it plays.
//!
//! Why it exists: the bash stand-ins of `Holder::script` become `sleep` under
//! `exec -a TITLE`, which sets argv[0] only, so their command lines end in
//! sleep's duration and their comm is `sleep`. The demo is the first thing a
//! user sees and must look like the real box: there, each process is this
//! binary started with the real argv (`python3 -m sglang.launch_server
//! --model-path … --tp 8`, `sglang::scheduler_TP3`), which it ignores, and
//! with its comm set the way setproctitle sets it. What to do comes in the
//! environment variable `GPUREAP_SIM_STAND_IN` (a JSON `Spec`), checked by
//! `main` before anything else.
//!
//! A stand-in writes its claims, opens the simulated device nodes, starts its
//! children, records itself in `DIR/pids` (what `Incident` waits for), and
//! then waits. Its stdin is its lifeline: a pipe whose only writer is the
//! process that staged it. When that process ends, however it ends (done,
//! Ctrl-C, SIGKILL), the stand-in reads end-of-file and exits, so nothing
//! staged outlives its stager even when no cleanup code ran. A stand-in
//! started with stdin at end-of-file (`/dev/null`) exits at once.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::exit::Exit;

/// The environment variable that makes the gpureap binary a stand-in.
pub(crate) const ENV: &str = "GPUREAP_SIM_STAND_IN";

/// What a stand-in does on SIGTERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTerm {
    /// Dies, as most processes do.
    #[default]
    Exit,
    /// Ignores it: only SIGKILL ends it.
    Ignore,
    /// Dies, and the driver keeps `bytes` of its context on `gpu`: they are
    /// added to `DIR/leak.N` before its nodes close, so the GPU never looks
    /// free in between (driver-held memory, as GPU 3 kept 92 GB in the
    /// incident this project started from).
    Keep { gpu: u32, bytes: u64 },
}

/// One process to play.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    /// The simulated host's directory.
    pub dir: PathBuf,
    /// Its command line, argv[0] included.
    pub argv: Vec<String>,
    /// What it records itself as in `DIR/pids`: its command line or a prefix of it.
    pub record: String,
    /// Opens every GPU's node (and the control node), as every CUDA process
    /// and every monitor does; with `gpus` empty, a monitor.
    pub nodes: bool,
    /// (GPU, bytes) of its contexts; a `none` claim on every other GPU.
    pub gpus: Vec<(u32, u64)>,
    pub on_term: OnTerm,
    /// Started the way a notebook kernel or a service is: in a session of
    /// its own, through a parent that exits at once, so that it is
    /// re-parented away from whoever staged it.
    pub detached: bool,
    /// Set on the copy a detached stand-in starts: call setsid first.
    #[serde(default)]
    pub new_session: bool,
    /// Started once it holds its nodes: its children, in its process group.
    pub children: Vec<Spec>,
}

impl Spec {
    /// A process with this command line, recorded under it, holding nothing.
    pub fn new(dir: &Path, command_line: &str) -> Spec {
        Spec {
            dir: dir.to_path_buf(),
            argv: command_line.split(' ').map(str::to_string).collect(),
            record: command_line.to_string(),
            ..Spec::default()
        }
    }

    /// The command that starts this stand-in from `exe` (the gpureap
    /// binary), with `lifeline` as its stdin.
    pub fn command(&self, exe: &Path, lifeline: Stdio) -> io::Result<Command> {
        let json = serde_json::to_string(self).map_err(io::Error::other)?;
        let (argv0, args) = self
            .argv
            .split_first()
            .ok_or_else(|| io::Error::other("a stand-in needs a command line"))?;
        let mut command = Command::new(exe);
        command
            .arg0(argv0)
            .args(args)
            .env(ENV, json)
            .stdin(lifeline)
            .stdout(Stdio::null());
        Ok(command)
    }
}

/// Plays the process `GPUREAP_SIM_STAND_IN` describes, if it is set, and
/// exits; returns at once otherwise. Called first thing by `main`.
pub fn run_if_asked() {
    let Some(spec) = std::env::var_os(ENV) else {
        return;
    };
    let not_a_spec = |why: String| {
        io::Error::other(format!(
            "{ENV} is set, so this gpureap plays a process of a simulated host (as `gpureap demo` \
             starts them), but it does not describe one ({why}); unset it to run gpureap"
        ))
    };
    let spec = spec
        .into_string()
        .map_err(|_| not_a_spec("not UTF-8".to_string()))
        .and_then(|text| {
            serde_json::from_str::<Spec>(&text).map_err(|error| not_a_spec(error.to_string()))
        });
    let exit = match spec.and_then(|spec| play(&spec)) {
        Ok(()) => Exit::Success,
        Err(error) => {
            eprintln!("gpureap stand-in: {error}");
            Exit::Incomplete
        }
    };
    std::process::exit(exit.into())
}

/// This binary, as it runs now (also when its file was replaced since).
const SELF_EXE: &str = "/proc/self/exe";

fn play(spec: &Spec) -> io::Result<()> {
    if spec.detached {
        // The intermediate: start the real one and exit, so it is re-parented.
        let copy = Spec {
            detached: false,
            new_session: true,
            ..spec.clone()
        };
        copy.command(Path::new(SELF_EXE), Stdio::inherit())?
            .spawn()?;
        return Ok(());
    }
    if spec.new_session {
        rustix::process::setsid().map_err(io::Error::from)?;
    }
    set_comm(spec)?;
    match spec.on_term {
        OnTerm::Exit => {}
        OnTerm::Ignore => {
            // A handler that only sets a flag: SIGTERM no longer ends it.
            let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            signal_hook::flag::register(signal_hook::consts::SIGTERM, flag)?;
        }
        OnTerm::Keep { gpu, bytes } => {
            let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM])?;
            let dir = spec.dir.clone();
            let context = spec
                .gpus
                .iter()
                .find(|(index, _)| *index == gpu)
                .map_or(0, |(_, context)| *context);
            std::thread::spawn(move || {
                if signals.forever().next().is_some() {
                    let _ = keep(&dir, gpu, context, bytes);
                    let _ = signal_hook::low_level::emulate_default_handler(
                        signal_hook::consts::SIGTERM,
                    );
                    std::process::exit(Exit::Signalled(libc::SIGTERM).into());
                }
            });
        }
    }
    let _held = if spec.nodes {
        hold_nodes(spec)?
    } else {
        Vec::new()
    };
    for child in &spec.children {
        let mut child = child
            .command(Path::new(SELF_EXE), Stdio::inherit())?
            .spawn()?;
        // Reaped as it ends, as a real parent does.
        std::thread::spawn(move || child.wait());
    }
    let mut pids = OpenOptions::new()
        .append(true)
        .create(true)
        .open(spec.dir.join("pids"))?;
    pids.write_all(format!("{} {}\n", std::process::id(), spec.record).as_bytes())?;
    drop(pids);
    // The lifeline: until the stager's end of the pipe closes.
    let mut stdin = io::stdin().lock();
    let mut buffer = [0u8; 64];
    loop {
        match stdin.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Ok(()),
        }
    }
}

/// The name `ps` and /proc/PID/comm show, as setproctitle sets it: argv[0]'s
/// base name, cut to the kernel's 15 bytes.
fn set_comm(spec: &Spec) -> io::Result<()> {
    let argv0 = spec.argv.first().map(String::as_str).unwrap_or("");
    let name = argv0.rsplit('/').next().unwrap_or(argv0);
    let mut end = name.len().min(15);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    fs::write("/proc/self/comm", &name[..end])
}

/// Claims first, then every node: no scan ever sees a node open without
/// its claim (docs/simulated-driver.md).
fn hold_nodes(spec: &Spec) -> io::Result<Vec<File>> {
    let pid = std::process::id();
    let mut nodes = Vec::new();
    while spec.dir.join(format!("nvidia{}", nodes.len())).exists() {
        nodes.push(spec.dir.join(format!("nvidia{}", nodes.len())));
    }
    for index in 0..nodes.len() as u32 {
        let claim = spec
            .gpus
            .iter()
            .find(|(gpu, _)| *gpu == index)
            .map_or("none".to_string(), |(_, bytes)| bytes.to_string());
        fs::write(spec.dir.join(format!("claims/{pid}.{index}")), claim)?;
    }
    let mut held = Vec::with_capacity(nodes.len() + 1);
    for node in nodes {
        held.push(File::open(node)?);
    }
    held.push(File::open(spec.dir.join("nvidiactl"))?);
    Ok(held)
}

/// Moves `bytes` of this process's context on `gpu` to what the driver
/// holds there for no process (`DIR/leak.N`). The context shrinks first, so
/// that no reading ever counts those bytes twice (more used than the GPU
/// has); each file is replaced whole, so that no reading sees one half-written.
fn keep(dir: &Path, gpu: u32, context: u64, bytes: u64) -> io::Result<()> {
    let pid = std::process::id();
    replace(
        &dir.join(format!("claims/{pid}.{gpu}")),
        &context.saturating_sub(bytes).to_string(),
    )?;
    let path = dir.join(format!("leak.{gpu}"));
    let before: u64 = fs::read_to_string(&path)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0);
    replace(&path, &before.saturating_add(bytes).to_string())
}

/// Writes a file under a temporary name beside it, then renames it over.
fn replace(path: &Path, content: &str) -> io::Result<()> {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    fs::write(&temporary, content)?;
    fs::rename(&temporary, path)
}
