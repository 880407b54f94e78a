//! The remote transport: one gpureap command on many hosts through the
//! user's own ssh, with `--json`, each answer kept as its document
//! (docs/fleet.md). `status`, `free`, `wait` and `plan` with `-H LIST` (the
//! `fleet` front end) and `top -H` use it.
//!
//! Nothing is installed on the hosts but the gpureap binary: each host runs
//! its own gpureap, which decides and verifies there exactly as it would
//! locally; this side only fans out, bounds the time, and reads the JSON.
//! `crate::hostlist` parses the lists, `ssh` runs one host, the front ends
//! render.

pub mod interrupt;
pub mod render;
pub mod ssh;

use std::io::{self, IsTerminal};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::value::RawValue;

use crate::exit::Exit;
use crate::units::GpuList;

use ssh::{Answer, Transport};

/// `-H` and its companions, typed: the hosts named (each once, in the order
/// given; none to run here) and how to reach them.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub hosts: Vec<String>,
    pub ssh: String,
    pub remote_bin: String,
    pub parallel: usize,
    pub connect_timeout: Duration,
    pub host_timeout: Option<Duration>,
}

/// `--remote-bin`'s default: found on the remote PATH or where `push` puts it.
pub const DEFAULT_REMOTE_BIN: &str = "gpureap";

/// Past the command's own time, what a host gets for ssh to connect and
/// gpureap to start, scan and answer.
const ANSWER_MARGIN: Duration = Duration::from_secs(30);

/// The hosts and how to reach them, from `-H` and its companions.
#[derive(Debug)]
pub struct Fleet {
    pub hosts: Vec<String>,
    pub transport: Transport,
    pub parallel: usize,
    pub host_timeout: Option<Duration>,
    /// `--backend` when it was given on the command line: the hosts use it
    /// too. An environment's `GPUREAP_BACKEND` is this machine's, not theirs.
    pub backend: Option<String>,
    /// A live progress line on stderr (a terminal, and not `--json`).
    pub progress: bool,
}

/// One host's part of the run.
#[derive(Debug)]
pub struct HostResult {
    pub host: String,
    pub answer: Answer,
}

impl Fleet {
    /// The fleet `-H` names, or `None` to run locally.
    pub fn new(
        config: &FleetConfig,
        backend: Option<String>,
        json: bool,
    ) -> Result<Option<Fleet>, String> {
        if config.hosts.is_empty() {
            return Ok(None);
        }
        let transport = Transport::new(&config.ssh, &config.remote_bin, config.connect_timeout)?;
        Ok(Some(Fleet {
            hosts: config.hosts.clone(),
            transport,
            parallel: config.parallel,
            host_timeout: config.host_timeout,
            backend,
            progress: !json && io::stderr().is_terminal(),
        }))
    }

    /// The time one host gets: `--host-timeout`, else what the command
    /// itself may take plus the connection and a margin.
    pub fn limit(&self, command_time: Duration) -> Duration {
        self.host_timeout
            .unwrap_or_else(|| command_time + self.transport.connect_timeout + ANSWER_MARGIN)
    }

    /// The remote argv: `[--backend B] SUBCOMMAND ARGS… --json`.
    pub fn remote_args(&self, subcommand: &str, args: Vec<String>) -> Vec<String> {
        let mut remote = Vec::new();
        if let Some(backend) = &self.backend {
            remote.extend(["--backend".to_string(), backend.clone()]);
        }
        remote.push(subcommand.to_string());
        remote.extend(args);
        remote.push("--json".to_string());
        remote
    }

    /// The remote argv of a command that ends in a command line of its own
    /// (`plan -- ENGINE…`): `[--backend B] SUBCOMMAND ARGS… --json -- COMMAND…`.
    pub fn remote_args_then(
        &self,
        subcommand: &str,
        args: Vec<String>,
        command: &[String],
    ) -> Vec<String> {
        let mut remote = self.remote_args(subcommand, args);
        remote.push("--".to_string());
        remote.extend(command.iter().cloned());
        remote
    }

    /// Runs one call per host, at most `parallel` at once, and returns the
    /// answers in host order. `job` gives each host its arguments and time
    /// limit when it starts (a `wait` started late gets what is left).
    pub fn fan_out<F>(&self, kind: &str, hosts: &[String], job: F) -> Vec<HostResult>
    where
        F: Fn(&str) -> (Vec<String>, Duration) + Sync,
    {
        self.fan_out_with(hosts, |host| {
            let (args, limit) = job(host);
            self.transport.call(host, &args, kind, limit)
        })
    }

    /// Runs `job` for each host, at most `parallel` at once, with the
    /// progress line; the answers in host order.
    pub fn fan_out_with<F>(&self, hosts: &[String], job: F) -> Vec<HostResult>
    where
        F: Fn(&str) -> Answer + Sync,
    {
        // Ctrl-C or SIGTERM now ends each host's ssh (and its gpureap there).
        let _catching = interrupt::Catching::start();
        let next = AtomicUsize::new(0);
        let answers: Mutex<Vec<Option<Answer>>> =
            Mutex::new((0..hosts.len()).map(|_| None).collect());
        let bar = self.progress.then(|| progress_bar(hosts.len()));
        let (done_sender, done) = mpsc::channel::<bool>();
        // A worker that cannot be started (no threads left: RLIMIT_NPROC, memory)
        // leaves its hosts to the others; with none, no host is run.
        let mut not_started = None;
        thread::scope(|scope| {
            let mut started = 0;
            for _ in 0..self.parallel.min(hosts.len()) {
                let done_sender = done_sender.clone();
                let (next, answers, job) = (&next, &answers, &job);
                let spawned = thread::Builder::new().spawn_scoped(scope, move || {
                    loop {
                        if interrupt::signal().is_some() {
                            break;
                        }
                        let at = next.fetch_add(1, Ordering::Relaxed);
                        let Some(host) = hosts.get(at) else { break };
                        let answer = job(host);
                        let failed = answer.report.is_none();
                        if let Ok(mut answers) = answers.lock() {
                            answers[at] = Some(answer);
                        }
                        let _ = done_sender.send(failed);
                    }
                });
                match spawned {
                    Ok(_) => started += 1,
                    Err(error) => {
                        not_started = Some(error.to_string());
                        break;
                    }
                }
            }
            drop(done_sender);
            if started == 0 {
                return;
            }
            let mut failures = 0;
            for failed in done {
                failures += usize::from(failed);
                if let Some(bar) = &bar {
                    bar.inc(1);
                    bar.set_message(format!("{failures} failed"));
                }
            }
        });
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        let answers = answers.into_inner().unwrap_or_default();
        hosts
            .iter()
            .zip(answers)
            .map(|(host, answer)| HostResult {
                host: host.clone(),
                answer: answer.unwrap_or_else(|| Answer {
                    exit_code: Exit::Incomplete,
                    report: None,
                    error: Some(match (&not_started, interrupt::signal()) {
                        (_, Some(signal)) => {
                            format!("not run: interrupted by {}", interrupt::name(signal))
                        }
                        (Some(error), None) => format!("not run: cannot start a thread: {error}"),
                        (None, None) => "not run (internal error)".to_string(),
                    }),
                    elapsed: Duration::ZERO,
                }),
            })
            .collect()
    }
}

fn progress_bar(total: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total as u64);
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{spinner} hosts {pos}/{len} done, {msg} {elapsed}")
    {
        bar.set_style(style);
    }
    bar.set_message("0 failed");
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// The whole run's exit code from its hosts' (`Exit::merge_hosts`): a host
/// not reached or answering garbage counts as 3, could not complete.
pub fn worst(results: &[HostResult]) -> Exit {
    Exit::merge_hosts(results.iter().map(|result| result.answer.exit_code))
}

/// `--gpu` lists as the hosts read them.
pub fn gpu_args(lists: &[GpuList]) -> Vec<String> {
    lists
        .iter()
        .flat_map(|list| {
            let text = match list {
                GpuList::All => "all".to_string(),
                GpuList::Some(set) => crate::units::GpuRanges(set).to_string(),
                GpuList::Refs(refs) => crate::units::GpuRefs(refs).to_string(),
            };
            ["--gpu".to_string(), text]
        })
        .collect()
}

/// A duration as the hosts read it, to the millisecond.
pub fn duration_arg(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

/// The fleet document (docs/json.md, "fleet").
#[derive(Serialize)]
pub(crate) struct FleetJson<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    pub command: &'static str,
    pub exit_code: Exit,
    pub hosts: Vec<FleetHostJson<'a>>,
}

#[derive(Serialize)]
pub(crate) struct FleetHostJson<'a> {
    pub host: &'a str,
    pub exit_code: Exit,
    pub error: Option<&'a str>,
    pub elapsed_ms: u64,
    pub report: Option<&'a RawValue>,
}

pub fn fleet_json(command: &'static str, results: &[HostResult], exit_code: Exit) -> String {
    crate::report::to_json(&FleetJson {
        schema_version: crate::report::SCHEMA_VERSION,
        kind: "fleet",
        command,
        exit_code,
        hosts: results
            .iter()
            .map(|result| FleetHostJson {
                host: &result.host,
                exit_code: result.answer.exit_code,
                error: result.answer.error.as_deref(),
                elapsed_ms: result.answer.elapsed.as_millis() as u64,
                report: result.answer.report.as_deref(),
            })
            .collect(),
    })
}

/// A host's JSON document as the fleet document embeds it, as text: its
/// lines indented to where it sits (`hosts[].report`), so that the whole
/// reads as if pretty-printed at once. JSON has no raw newline inside a
/// string, so each newline is whitespace between tokens. `None` if it is
/// not JSON.
pub fn nested_json(text: &str) -> Option<Box<RawValue>> {
    RawValue::from_string(text.trim().replace('\n', "\n      ")).ok()
}

/// Seconds since `start`, for a `wait` started late.
pub fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}
