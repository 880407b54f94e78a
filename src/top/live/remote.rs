//! `gpureap top -H HOST`: one host's view through the fleet's ssh
//! (`remote::ssh::Transport`: BatchMode, ConnectTimeout, host keys as the
//! user's config says, the remote gpureap found as `status -H` finds it,
//! under the watch that ends it with its ssh). One ssh serves the whole
//! session: it runs `gpureap top --json` there (`stream`), which writes a
//! `status` document a line every interval; this side reads them on the
//! sampler's thread and builds the view's rows and bars from them.
//!
//! That ssh is the master of a connection (`ControlMaster`) in a private
//! directory: a free from the view runs the host's own `gpureap free`
//! (`--dry-run` for the plan shown, then `--yes`) over the same
//! connection, never a second implementation here. A connection that
//! drops, a host that stops answering (`ServerAliveInterval`, and no
//! document within the stall limit) or a remote gpureap that ends is
//! "connection lost": retried with a growing delay, a bounded number of
//! times, then given up until the user presses `r`.
//!
//! Everything the host sends is text from elsewhere: each string is
//! escaped as it is read (`Text`, `units::one_line`), as `status -H` does.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use super::Sample;
use super::act::{Event, Target};
use super::model::{GpuBar, Row};
use crate::child;
use crate::exit::{Exit, Remote};
use crate::remote::render;
use crate::remote::ssh::{MAX_ANSWER, Transport};
use crate::remote::{Fleet, HostResult, duration_arg};
use crate::request::TopRequest;
use crate::status_doc::{self, GpuView, HolderView};
use crate::units::{Elapsed, one_line};

/// How many connections in a row are tried before giving up.
pub const ATTEMPTS: u32 = 6;
/// The delays before each retry: 1 s, 2 s, 4 s, 8 s, then 15 s.
fn backoff(attempt: u32) -> Duration {
    Duration::from_secs((1u64 << attempt.saturating_sub(1).min(4)).min(15))
}
/// ssh's keep-alive: a host that answers none of 3 probes 5 s apart is gone.
const ALIVE: [&str; 4] = ["-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"];
/// What is kept of the stream's stderr: its last lines say why it ended.
const MAX_STDERR: u64 = 64 << 10;

/// One document from the host, made into what the view shows.
#[derive(Debug, Clone)]
pub struct Status {
    pub backend: String,
    pub rows: Vec<Row>,
    pub bars: Vec<GpuBar>,
    /// Each holder's parent, as the host saw it.
    pub parents: BTreeMap<u32, u32>,
    /// The GPUs the driver lists each holder on.
    pub gpus_of: BTreeMap<u32, Vec<u32>>,
}

impl Status {
    /// Reads one line of the stream: a `status` document of this schema.
    pub fn read(line: &[u8]) -> Result<Status, String> {
        let view = status_doc::status(&String::from_utf8_lossy(line))?;
        Ok(Status {
            backend: view.backend.0.clone(),
            bars: view.gpus.iter().map(bar).collect(),
            parents: view
                .holders
                .iter()
                .filter_map(|holder| Some((holder.pid, holder.ppid?)))
                .collect(),
            gpus_of: view
                .holders
                .iter()
                .map(|holder| {
                    let listed = holder
                        .gpus
                        .iter()
                        .filter(|gpu| gpu.listed_by_driver)
                        .map(|gpu| gpu.index)
                        .collect();
                    (holder.pid, listed)
                })
                .collect(),
            rows: {
                let answered: BTreeSet<u32> = view
                    .gpus
                    .iter()
                    .filter(|gpu| gpu.error.is_none())
                    .map(|gpu| gpu.index)
                    .collect();
                view.holders
                    .into_iter()
                    .map(|holder| row(holder, &answered))
                    .collect()
            },
        })
    }

    /// A holder's ancestors as far as the document tells: its parent, that
    /// one's, while they are holders (the document lists only holders).
    pub fn ancestors(&self, pid: u32) -> Vec<u32> {
        let mut seen = BTreeSet::from([pid]);
        let mut chain = Vec::new();
        let mut at = pid;
        while let Some(&parent) = self.parents.get(&at) {
            if !seen.insert(parent) {
                break;
            }
            chain.push(parent);
            at = parent;
        }
        chain
    }

    pub fn pids(&self) -> BTreeSet<u32> {
        self.rows.iter().map(|row| row.pid).collect()
    }

    /// Each GPU's used memory, for the history.
    pub fn used(&self) -> Vec<(u32, Option<u64>)> {
        self.bars.iter().map(|bar| (bar.index, bar.used)).collect()
    }
}

fn bar(gpu: &GpuView) -> GpuBar {
    GpuBar {
        index: gpu.index,
        total: gpu.memory_total,
        used: gpu.memory_used,
        by_pid: gpu
            .processes
            .iter()
            .filter_map(|process| process.memory.map(|memory| (process.pid, memory)))
            .collect(),
        // The one rule for a host's document (`status_doc`), as `fleet` reads it.
        no_process: gpu
            .memory_unattributed
            .map(|bytes| (bytes, gpu.unattributed(bytes))),
        error: gpu.error.as_ref().map(|error| error.0.clone()),
        utilization: gpu.utilization_percent,
        temperature: gpu.temperature_celsius,
        power_watts: gpu.power_draw_watts,
        power_limit_watts: gpu.power_limit_watts,
    }
}

/// A holder's row, as `model::rows` makes one from a local holder: placed
/// by `status`'s rule, on the GPUs the host's driver answered for.
fn row(holder: HolderView, answered: &BTreeSet<u32>) -> Row {
    let monitor = holder.flags.iter().any(|flag| &flag.0[..] == "monitor");
    let places =
        crate::report::places_of(&holder.gpus, |_| true, |index| answered.contains(&index));
    let cells = crate::report::places_cells(&places, monitor);
    let reason = super::model::reason(
        holder.orphan.as_deref(),
        holder.protected.as_deref(),
        holder
            .supervisor
            .as_ref()
            .and_then(|supervisor| supervisor.gone.as_deref()),
    );
    let command = holder
        .cmdline
        .filter(|cmdline| !cmdline.is_empty())
        .or(holder.comm)
        .map_or_else(|| "?".to_string(), |text| text.0);
    Row {
        pid: holder.pid,
        depth: 0,
        user: holder.user.map_or_else(|| "?".to_string(), |text| text.0),
        state: holder.state.map_or_else(|| "?".to_string(), |text| text.0),
        gpus: cells.gpus,
        memory: cells.memory,
        bytes: cells.bytes,
        sm: holder
            .gpus
            .iter()
            .filter_map(|gpu| gpu.sm_utilization_percent)
            .max(),
        flags: holder
            .flags
            .iter()
            .map(|flag| &flag.0[..])
            .collect::<Vec<_>>()
            .join(","),
        container: holder
            .container
            .map(|container| {
                crate::report::container_label(
                    &container.runtime,
                    &container.id,
                    container.pod.as_deref(),
                    container.namespace.as_deref(),
                    container.name.as_deref(),
                )
            })
            .unwrap_or_default(),
        command,
        reason,
    }
}

/// Where the connection stands, for the header and the footer.
#[derive(Debug, Clone)]
pub enum LinkState {
    Connecting {
        attempt: u32,
    },
    Connected,
    /// Lost; tried again at `retry_at`.
    Lost {
        why: String,
        attempt: u32,
        retry_at: Instant,
    },
    /// Not tried again until the user asks (`r`).
    GaveUp {
        why: String,
    },
}

impl LinkState {
    /// The header's word for it.
    pub fn word(&self) -> Option<&'static str> {
        match self {
            LinkState::Connected => None,
            LinkState::Connecting { .. } => Some("connecting"),
            LinkState::Lost { .. } => Some("CONNECTION LOST"),
            LinkState::GaveUp { .. } => Some("CONNECTION LOST"),
        }
    }

    /// The footer's line, with the reason (the host's words, escaped).
    pub fn line(&self, host: &str) -> Option<String> {
        let line = match self {
            LinkState::Connected => None,
            LinkState::Connecting { attempt: 1 } => Some(format!("Connecting to {host}…")),
            LinkState::Connecting { attempt } => Some(format!(
                "Reconnecting to {host} (attempt {attempt} of {ATTEMPTS})…"
            )),
            LinkState::Lost {
                why,
                attempt,
                retry_at,
            } => Some(format!(
                "Connection to {host} lost: {why}; reconnecting in {} (attempt {} of {ATTEMPTS}; r: now)",
                Elapsed(retry_at.saturating_duration_since(Instant::now())),
                attempt + 1
            )),
            LinkState::GaveUp { why } => Some(format!(
                "Connection to {host} lost: {why}; gave up (r: try again, q: quit)"
            )),
        };
        line.map(|line| one_line(&line).into_owned())
    }
}

/// How to reach the host, for the stream and for the frees.
pub struct Link {
    pub host: String,
    fleet: Fleet,
    /// The stream's ssh: the connection's master, with keep-alives.
    stream: Transport,
    /// A free's ssh: over the master's connection when there is one.
    calls: Transport,
    stream_args: Vec<String>,
    /// No document for this long: the host, its ssh or its gpureap hangs.
    stall: Duration,
    /// The private directory of the connection's socket, removed when done.
    _control: Option<tempfile::TempDir>,
}

impl Link {
    pub fn new(fleet: Fleet, request: &TopRequest) -> Link {
        let host = fleet.hosts.first().cloned().unwrap_or_default();
        let mut stream = fleet.transport.clone();
        let mut calls = fleet.transport.clone();
        stream.ssh.extend(ALIVE.iter().map(|word| word.to_string()));
        // A socket path is short (108 bytes); a TMPDIR too long for one, or
        // none to be had, means each free connects on its own.
        let control = tempfile::Builder::new()
            .prefix("gpureap-top-")
            .tempdir()
            .ok()
            .filter(|dir| dir.path().join("ssh").as_os_str().len() < 100);
        if let Some(dir) = &control {
            let path: PathBuf = dir.path().join("ssh");
            let path = format!("ControlPath={}", path.display());
            stream.ssh.extend([
                "-o".to_string(),
                "ControlMaster=yes".to_string(),
                "-o".to_string(),
                path.clone(),
                "-o".to_string(),
                "ControlPersist=no".to_string(),
            ]);
            calls.ssh.extend([
                "-o".to_string(),
                "ControlMaster=no".to_string(),
                "-o".to_string(),
                path,
            ]);
        }
        let stream_args = fleet.remote_args(
            "top",
            vec!["--interval".into(), duration_arg(request.interval)],
        );
        let stall = fleet.limit(request.interval);
        Link {
            host: one_line(&host).into_owned(),
            fleet,
            stream,
            calls,
            stream_args,
            stall,
            _control: control,
        }
    }
}

/// How one connection ended.
enum Ended {
    /// The view is gone: nothing more to do.
    ViewGone,
    Lost {
        why: String,
        /// Documents came before it ended: the next try starts afresh.
        answered: bool,
        /// Trying again cannot help: no gpureap there, or it refused the arguments.
        final_: bool,
    },
}

/// The sampler of `top -H`: one connection at a time, its documents sent
/// to the view; when one ends, retried after `backoff`, at most `ATTEMPTS`
/// times in a row. A message on `woken` retries at once; its end (the view
/// is gone) ends the connection and the thread.
pub fn sample(link: Arc<Link>, samples: SyncSender<Sample>, woken: Receiver<()>) {
    let mut attempt = 0;
    loop {
        attempt += 1;
        if samples
            .send(Sample::Link(LinkState::Connecting { attempt }))
            .is_err()
        {
            return;
        }
        let (why, final_) = match connect(&link, &samples, &woken) {
            Ended::ViewGone => return,
            Ended::Lost {
                why,
                answered,
                final_,
            } => {
                if answered {
                    attempt = 1;
                }
                (why, final_)
            }
        };
        if final_ || attempt >= ATTEMPTS {
            if samples
                .send(Sample::Link(LinkState::GaveUp { why }))
                .is_err()
            {
                return;
            }
            match woken.recv() {
                Ok(()) => attempt = 0,
                Err(_) => return,
            }
            continue;
        }
        let delay = backoff(attempt);
        let lost = LinkState::Lost {
            why,
            attempt,
            retry_at: Instant::now() + delay,
        };
        if samples.send(Sample::Link(lost)).is_err() {
            return;
        }
        match woken.recv_timeout(delay) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// One connection: the stream's documents, until it ends.
fn connect(link: &Link, samples: &SyncSender<Sample>, woken: &Receiver<()>) -> Ended {
    let argv = link.stream.command_line(&link.host, &link.stream_args);
    let mut ssh = match child::stream(&argv, MAX_STDERR) {
        Ok(ssh) => ssh,
        Err(error) => {
            return Ended::Lost {
                why: error.to_string(),
                answered: false,
                final_: false,
            };
        }
    };
    let Some(stdout) = ssh.take_stdout() else {
        return lost("no output to read".to_string(), false);
    };
    let (lines_to, lines) = mpsc::sync_channel::<Result<Vec<u8>, String>>(1);
    let reader = thread::Builder::new()
        .name("top-remote".to_string())
        .spawn(move || read_lines(stdout, &lines_to));
    if let Err(error) = reader {
        return lost(format!("cannot start a thread: {error}"), false);
    }
    let mut answered = false;
    let mut last = Instant::now();
    let why = loop {
        match woken.try_recv() {
            Err(TryRecvError::Disconnected) => return Ended::ViewGone,
            Ok(()) | Err(TryRecvError::Empty) => {}
        }
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(line)) => match Status::read(&line) {
                Ok(status) => {
                    if !answered && samples.send(Sample::Link(LinkState::Connected)).is_err() {
                        return Ended::ViewGone;
                    }
                    answered = true;
                    last = Instant::now();
                    if samples.send(Sample::Remote(Box::new(status))).is_err() {
                        return Ended::ViewGone;
                    }
                }
                Err(why) => break Some(why),
            },
            Ok(Err(why)) => break Some(why),
            Err(RecvTimeoutError::Disconnected) => break None,
            Err(RecvTimeoutError::Timeout) if last.elapsed() >= link.stall => {
                break Some(format!(
                    "no report for {} (the host, its ssh or its gpureap hangs)",
                    Elapsed(link.stall)
                ));
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
    };
    // Its end: ssh's own word, or what stopped the reading.
    let (status, stderr) = ssh.end(Duration::from_secs(2));
    let (remote, said) = link
        .stream
        .ended(status.and_then(|status| status.code()), &stderr);
    // No gpureap there, one that cannot run, or one that refuses the
    // arguments (older than this one): trying again cannot help.
    let final_ = status.is_some()
        && matches!(
            remote,
            Remote::Ended(Exit::Usage) | Remote::NotFound | Remote::CannotRun
        );
    Ended::Lost {
        why: why.filter(|_| !final_).unwrap_or(said),
        answered,
        final_,
    }
}

fn lost(why: String, answered: bool) -> Ended {
    Ended::Lost {
        why,
        answered,
        final_: false,
    }
}

/// Sends each line of the stream, each at most `MAX_ANSWER` bytes; then
/// its end (an `Err` when it is not a clean one).
fn read_lines(stdout: impl Read, lines: &SyncSender<Result<Vec<u8>, String>>) {
    let mut reader = BufReader::new(stdout);
    loop {
        let mut line = Vec::new();
        match (&mut reader)
            .take(MAX_ANSWER + 1)
            .read_until(b'\n', &mut line)
        {
            Ok(0) => return,
            Ok(_) if line.len() as u64 > MAX_ANSWER => {
                let _ = lines.send(Err(format!(
                    "answered a line of more than {} MiB: not a gpureap report",
                    MAX_ANSWER >> 20
                )));
                return;
            }
            Ok(_) => {
                if lines.send(Ok(line)).is_err() {
                    return;
                }
            }
            Err(error) => {
                let _ = lines.send(Err(format!("cannot read its answer: {error}")));
                return;
            }
        }
    }
}

/// A plan the host made (`free --dry-run` there), shown for confirmation.
pub struct Planned {
    /// The `free` flags that made it, less `--dry-run`.
    flags: Vec<String>,
    pub text: Vec<String>,
}

/// The `free` flags for a target, with the view's options (`--grace`,
/// `--timeout`, `--protect`): the host resolves and guards them itself.
fn free_flags(target: &Target, request: &TopRequest) -> Vec<String> {
    let mut flags: Vec<String> = match target {
        Target::Pids(pids) => pids.iter().map(|pid| format!("--pid={pid}")).collect(),
        Target::Gpu(index) => vec!["--gpu".to_string(), index.to_string()],
        Target::Orphans => vec!["--orphans".to_string()],
    };
    flags.extend(
        request
            .protect
            .iter()
            .map(|name| format!("--protect={name}")),
    );
    flags.extend([
        "--grace".to_string(),
        duration_arg(request.options.grace()),
        "--timeout".to_string(),
        duration_arg(request.options.timeout()),
    ]);
    flags
}

/// One `gpureap free` on the host, over the session's connection.
fn call(link: &Link, flags: Vec<String>, limit: Duration) -> HostResult {
    let args = link.fleet.remote_args("free", flags);
    HostResult {
        host: link.host.clone(),
        answer: link.calls.call(&link.host, &args, "free", limit),
    }
}

/// Asks the host for the plan, on a thread of its own; the answer comes
/// back as `Event::Planned`.
pub fn ask(link: Arc<Link>, target: Target, request: &TopRequest, events: Sender<Event>) {
    let flags = free_flags(&target, request);
    let options = request.options;
    thread::spawn(move || {
        let mut dry_run = flags.clone();
        dry_run.push("--dry-run".to_string());
        let result = call(&link, dry_run, link.fleet.limit(Duration::ZERO));
        let planned = match result.answer.report {
            Some(_) => {
                let mut text: Vec<String> = render::free_plan(std::slice::from_ref(&result))
                    .lines()
                    .filter(|line| !line.trim().is_empty())
                    .map(str::to_string)
                    .collect();
                text.push(format!(
                    "Then on {}: SIGTERM, {} later SIGSTOP+SIGKILL, and its driver checked for up to {} (its gpureap free).",
                    link.host,
                    Elapsed(options.grace()),
                    Elapsed(options.timeout())
                ));
                Ok(Box::new(Planned { flags, text }))
            }
            None => Err(format!(
                "{}: no plan: {}",
                link.host,
                result.answer.error.as_deref().unwrap_or("no answer")
            )),
        };
        let _ = events.send(Event::Planned(planned));
    });
}

/// Runs the host's `free --yes` for a confirmed plan, on a thread of its
/// own; its verified outcome comes back as `Event::Finished`.
pub fn free(link: Arc<Link>, planned: Planned, request: &TopRequest, events: Sender<Event>) {
    let limit = link.fleet.limit(request.options.longest());
    let _ = events.send(Event::Progress(format!(
        "freeing on {}: its gpureap free signals and waits for its driver (up to {})…",
        link.host,
        Elapsed(request.options.longest())
    )));
    thread::spawn(move || {
        let mut flags = planned.flags;
        flags.push("--yes".to_string());
        let started = Instant::now();
        let result = call(&link, flags, limit);
        let verdict = match (result.answer.exit_code, &result.answer.report) {
            (_, None) => "Not verified",
            (Exit::Success, Some(_)) => "Freed",
            (_, Some(_)) => "Not all freed",
        };
        let mut lines = vec![format!(
            "{verdict} on {} after {} (its gpureap free, exit {})",
            link.host,
            Elapsed(started.elapsed()),
            result.answer.exit_code.code()
        )];
        // The verified figures first (`h1: GPU 0: freed …` and the reasons
        // under a GPU still held), then what was signalled: the footer is
        // short, and the figures are the point.
        let outcome = render::free_outcome(std::slice::from_ref(&result));
        let gpu_line = format!("{}: GPU ", link.host);
        let (figures, signalled): (Vec<&str>, Vec<&str>) = outcome
            .lines()
            .filter(|line| !line.trim().is_empty())
            .partition(|line| line.starts_with(&gpu_line) || line.starts_with("  - "));
        lines.extend(figures.into_iter().chain(signalled).map(str::to_string));
        let _ = events.send(Event::Finished(lines));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::UnattributedKind;

    /// A host too old to send `held_by_no_process`: `top -H` reads its
    /// memory no process explains as `status -H` does (held by no process),
    /// through the one reader; before, top called it bookkeeping.
    #[test]
    fn an_older_hosts_unexplained_memory_is_held_by_no_process_as_fleet_reads_it() {
        let line = br#"{"schema_version":1,"kind":"status","backend":"nvml","gpus":[
            {"index":0,"memory_total":85899345920,"memory_used":536870912,"memory_unattributed":536870912},
            {"index":1,"memory_total":85899345920,"memory_used":0,"memory_unattributed":0},
            {"index":2,"memory_total":85899345920,"memory_used":1048576,"memory_unattributed":1048576,"held_by_no_process":false}
        ],"holders":[]}"#;
        let status = Status::read(line).expect("a status document");
        let kinds: Vec<Option<UnattributedKind>> = status
            .bars
            .iter()
            .map(|bar| bar.no_process.map(|(_, kind)| kind))
            .collect();
        assert_eq!(
            kinds,
            [
                Some(UnattributedKind::NoProcess),
                Some(UnattributedKind::Bookkeeping),
                Some(UnattributedKind::Bookkeeping),
            ]
        );
    }

    /// The one header check: another schema or kind is refused in words.
    #[test]
    fn a_document_of_another_schema_or_kind_is_refused() {
        let other = Status::read(br#"{"schema_version":9,"kind":"status"}"#).map(|_| ());
        assert_eq!(
            other,
            Err("remote gpureap speaks schema 9, this one 1".to_string())
        );
        let free = Status::read(br#"{"schema_version":1,"kind":"free"}"#).map(|_| ());
        assert_eq!(
            free,
            Err("answered a document that is not a status report".to_string())
        );
    }
}
