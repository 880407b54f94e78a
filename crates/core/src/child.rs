//! One bounded child process, for every program gpureap runs and waits on
//! (ssh for the fleet and push, scontrol and squeue for Slurm, py-spy for
//! the stacks in bundles).
//!
//! The child leads a process group of its own. Its stdout and stderr are read
//! on threads of their own, each kept to a bound and drained past it, so
//! that it never blocks on a full pipe. It is waited for, unreaped, until
//! it exits, the limit passes or an interruption comes; then its whole group
//! is ended, so that nothing it forked outlives the call or holds its pipes
//! open (while it is unreaped its PID, the group's id, cannot be reused);
//! then it is reaped. A leaf of the base: it imports only `signal`.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, WaitId, WaitIdOptions};

use crate::signal::kill_group;

/// Why a child did not run to an end that can be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no program to run")]
    NoProgram,
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    /// No thread to read or write with (RLIMIT_NPROC, memory).
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot wait for it: {0}")]
    Wait(std::io::Error),
}

/// What the child's stdin is.
pub enum Input {
    Null,
    /// These bytes, then its end.
    Data(Arc<Vec<u8>>),
    /// Open, and nothing on it, until the child ends or is killed.
    Held,
}

/// What may interrupt a wait besides the child's end and the limit.
#[derive(Clone, Copy)]
pub struct Interruption {
    /// The signal that came, if one did.
    pub signal: fn() -> Option<i32>,
    /// Readable once one has come, to wake the wait.
    pub descriptor: Option<BorrowedFd<'static>>,
}

/// How a child ended.
pub enum Ran {
    Exited {
        status: ExitStatus,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        /// Its stdout went past the bound: `stdout` is the start of it.
        truncated: bool,
    },
    /// Still running at the limit: its group was killed.
    TimedOut,
    /// A signal came (`Interruption`): its group was killed.
    Interrupted(i32),
}

/// How the wait for a child ended; its group is ended either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    Exited,
    TimedOut,
    Interrupted(i32),
}

/// A child started in its own process group, its output being read.
pub struct Running {
    child: std::process::Child,
    started: Instant,
    stdout: mpsc::Receiver<(Vec<u8>, bool)>,
    stderr: mpsc::Receiver<(Vec<u8>, bool)>,
    /// `Input::Held`: closed when the child is reaped.
    _held: Option<ChildStdin>,
}

/// The longest the output is waited for once the child's group is gone:
/// only something that left the group can still hold its pipes.
const DRAIN: Duration = Duration::from_secs(2);

/// Starts argv in a process group of its own, with `input` on its stdin,
/// keeping `max_stdout` and `max_stderr` bytes of its output.
pub fn spawn<S: AsRef<OsStr>>(
    argv: &[S],
    input: Input,
    max_stdout: u64,
    max_stderr: u64,
) -> Result<Running, Error> {
    let Some((program, args)) = argv.split_first() else {
        return Err(Error::NoProgram);
    };
    let shown = || program.as_ref().to_string_lossy().into_owned();
    let mut child = Command::new(program)
        .args(args)
        .stdin(match input {
            Input::Null => Stdio::null(),
            Input::Data(_) | Input::Held => Stdio::piped(),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn {
            program: shown(),
            source,
        })?;
    // No thread to read or write with (RLIMIT_NPROC, memory): the child is
    // ended, and the call did not run.
    let no_thread = |child: &mut std::process::Child, error: std::io::Error| {
        kill_group(child.id());
        let _ = child.kill();
        let _ = child.wait();
        Error::Thread(error)
    };
    let mut held = None;
    match (child.stdin.take(), input) {
        (Some(pipe), Input::Held) => held = Some(pipe),
        (Some(mut pipe), Input::Data(input)) => {
            // A child that stops reading (it refused, or died) ends the write with EPIPE.
            let writer = thread::Builder::new().spawn(move || {
                let _ = std::io::Write::write_all(&mut pipe, &input);
            });
            if let Err(error) = writer {
                return Err(no_thread(&mut child, error));
            }
        }
        _ => {}
    }
    let stdout = match child.stdout.take().map(|pipe| collect(pipe, max_stdout)) {
        Some(Ok(stdout)) => stdout,
        Some(Err(error)) => return Err(no_thread(&mut child, error)),
        None => mpsc::channel().1,
    };
    let stderr = match child.stderr.take().map(|pipe| collect(pipe, max_stderr)) {
        Some(Ok(stderr)) => stderr,
        Some(Err(error)) => return Err(no_thread(&mut child, error)),
        None => mpsc::channel().1,
    };
    Ok(Running {
        child,
        started: Instant::now(),
        stdout,
        stderr,
        _held: held,
    })
}

/// Runs argv to its end, for at most `limit`: `spawn`, `end_within`, `reap`.
pub fn run<S: AsRef<OsStr>>(
    argv: &[S],
    input: Input,
    max_stdout: u64,
    max_stderr: u64,
    limit: Duration,
    interruption: Option<Interruption>,
) -> Result<Ran, Error> {
    let mut running = spawn(argv, input, max_stdout, max_stderr)?;
    let waited = running.end_within(limit, interruption);
    running.reap(waited, limit)
}

impl Running {
    /// The child's PID, its process group's id while it is unreaped.
    pub fn group(&self) -> u32 {
        self.child.id()
    }

    /// Waits, without reaping, until the child exits, `limit` passes or
    /// the interruption comes; then ends its process group.
    pub fn end_within(&mut self, limit: Duration, interruption: Option<Interruption>) -> Waited {
        let waited = self.wait(self.started + limit, interruption);
        kill_group(self.group());
        waited
    }

    fn wait(&self, deadline: Instant, interruption: Option<Interruption>) -> Waited {
        let Some(pid) = Pid::from_raw(self.child.id() as i32) else {
            return Waited::Exited;
        };
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok();
        let woken = interruption.and_then(|interruption| interruption.descriptor);
        loop {
            match rustix::process::waitid(
                WaitId::Pid(pid),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
            ) {
                Ok(Some(_)) | Err(_) => return Waited::Exited,
                Ok(None) => {}
            }
            if let Some(signal) = interruption.and_then(|interruption| (interruption.signal)()) {
                return Waited::Interrupted(signal);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Waited::TimedOut;
            }
            // On its pidfd (and the interruption's descriptor) where the
            // kernel has pidfds (5.3+), else by polling every few milliseconds.
            match &pidfd {
                Some(fd) => {
                    let fd = fd.as_fd();
                    let mut fds = vec![rustix::event::PollFd::new(
                        &fd,
                        rustix::event::PollFlags::IN,
                    )];
                    if let Some(woken) = &woken {
                        fds.push(rustix::event::PollFd::new(
                            woken,
                            rustix::event::PollFlags::IN,
                        ));
                    }
                    let timeout = rustix::event::Timespec::try_from(left).ok();
                    let _ = rustix::event::poll(&mut fds, timeout.as_ref());
                }
                None => thread::sleep(left.min(Duration::from_millis(5))),
            }
        }
    }

    /// Reaps the child, its group ended (`end_within`), and gathers what it
    /// wrote: waited for no longer than what is left of `limit`, at least
    /// 100 ms and at most DRAIN.
    pub fn reap(mut self, waited: Waited, limit: Duration) -> Result<Ran, Error> {
        let status = self.child.wait();
        match waited {
            Waited::TimedOut => return Ok(Ran::TimedOut),
            Waited::Interrupted(signal) => return Ok(Ran::Interrupted(signal)),
            Waited::Exited => {}
        }
        let status = status.map_err(Error::Wait)?;
        let drain = limit
            .saturating_sub(self.started.elapsed())
            .clamp(Duration::from_millis(100), DRAIN);
        let (stdout, truncated) = self.stdout.recv_timeout(drain).unwrap_or_default();
        let (stderr, _) = self.stderr.recv_timeout(drain).unwrap_or_default();
        Ok(Ran::Exited {
            status,
            stdout,
            stderr,
            truncated,
        })
    }
}

/// Reads a pipe to its end on a thread of its own, keeping `limit` bytes
/// and draining the rest so the writer never blocks.
fn collect(
    pipe: impl Read + Send + 'static,
    limit: u64,
) -> std::io::Result<mpsc::Receiver<(Vec<u8>, bool)>> {
    let (sender, receiver) = mpsc::channel();
    thread::Builder::new()
        .name("child-output".to_string())
        .spawn(move || {
            let mut kept = Vec::new();
            let mut pipe = pipe;
            let _ = pipe.by_ref().take(limit).read_to_end(&mut kept);
            let more = std::io::copy(&mut pipe, &mut std::io::sink()).unwrap_or(0) > 0;
            let _ = sender.send((kept, more));
        })?;
    Ok(receiver)
}

/// A child whose stdout is read as it comes, for as long as it runs (`top
/// -H`'s one ssh): started in a process group of its own, its stdin held
/// open (its end tells the child this side is gone), its stderr kept to a
/// bound. Dropping it ends its whole group and reaps it.
pub struct Streaming {
    child: std::process::Child,
    stdout: Option<std::process::ChildStdout>,
    stderr: mpsc::Receiver<(Vec<u8>, bool)>,
    _held: Option<ChildStdin>,
    /// Reaped (`end`): its PID may be another process's now.
    reaped: bool,
}

/// Starts argv in a process group of its own, its stdout a pipe to read.
pub fn stream<S: AsRef<OsStr>>(argv: &[S], max_stderr: u64) -> Result<Streaming, Error> {
    let Some((program, args)) = argv.split_first() else {
        return Err(Error::NoProgram);
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn {
            program: program.as_ref().to_string_lossy().into_owned(),
            source,
        })?;
    let stderr = match child.stderr.take().map(|pipe| collect(pipe, max_stderr)) {
        Some(Ok(stderr)) => stderr,
        Some(Err(error)) => {
            kill_group(child.id());
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::Thread(error));
        }
        None => mpsc::channel().1,
    };
    Ok(Streaming {
        stdout: child.stdout.take(),
        _held: child.stdin.take(),
        child,
        stderr,
        reaped: false,
    })
}

impl Streaming {
    /// Its PID, its process group's id while it is unreaped.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its stdout, once.
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.stdout.take()
    }

    /// Gives it up to `patience` to exit on its own (it closed its stdout:
    /// it is ending), then ends its group and reaps it: its exit status
    /// (`None` if it had to be killed or cannot be waited for) and the end of
    /// its stderr.
    pub fn end(mut self, patience: Duration) -> (Option<ExitStatus>, Vec<u8>) {
        let exited = self.exits_within(patience);
        kill_group(self.pid());
        let status = self.child.wait().ok().filter(|_| exited);
        self.reaped = true;
        let (stderr, _) = self
            .stderr
            .recv_timeout(Duration::from_millis(200))
            .unwrap_or_default();
        (status, stderr)
    }

    /// Whether it exits, unreaped, within `limit`.
    fn exits_within(&self, limit: Duration) -> bool {
        let Some(pid) = Pid::from_raw(self.child.id() as i32) else {
            return true;
        };
        let deadline = Instant::now() + limit;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok();
        loop {
            match rustix::process::waitid(
                WaitId::Pid(pid),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
            ) {
                Ok(Some(_)) | Err(_) => return true,
                Ok(None) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match &pidfd {
                Some(fd) => {
                    let fd = fd.as_fd();
                    let mut fds = [rustix::event::PollFd::new(
                        &fd,
                        rustix::event::PollFlags::IN,
                    )];
                    let timeout = rustix::event::Timespec::try_from(left).ok();
                    let _ = rustix::event::poll(&mut fds, timeout.as_ref());
                }
                None => thread::sleep(left.min(Duration::from_millis(5))),
            }
        }
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        kill_group(self.child.id());
        let _ = self.child.wait();
    }
}
