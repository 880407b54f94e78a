//! One remote gpureap over the user's own ssh: the command line, the
//! timeouts, and what its failure means in words a person acts on.
//!
//! Nothing here weakens ssh: host keys are checked as the user's config says
//! (never `StrictHostKeyChecking=no`), `BatchMode=yes` means a password or
//! passphrase prompt fails at once instead of waiting on a terminal, and
//! `ConnectTimeout` bounds the connection. The whole command is bounded too:
//! past its deadline the ssh process (ours) is killed and the host reported
//! as not answering.

use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use crate::child::{self, Input, Interruption, Ran};
use crate::exit::{Exit, Remote};

/// The JSON a host answers with is this big at most. A real 8-GPU host's
/// `status --json`, eight tensor-parallel workers each with every GPU's
/// nodes open, is 22 KB (the demo's whole document, 53 KB); 4 MiB is some
/// 1,500 such holders, a hundred times a busy host. More is a host
/// answering garbage, not a report, and is refused unread. What is kept is
/// the text (at most this much) and, while a host is rendered, the few
/// fields shown: never a tree of every value (docs/fleet.md, "Bounds").
pub const MAX_ANSWER: u64 = 4 << 20;
/// What is kept of a host's stderr: its last lines say what went wrong.
const MAX_STDERR: u64 = 64 << 10;

/// How to reach the hosts.
#[derive(Debug, Clone)]
pub struct Transport {
    /// `--ssh`, split like a shell would: `ssh -F ~/.ssh/lab.conf`.
    pub ssh: Vec<String>,
    /// `--remote-bin`: the gpureap to run there.
    pub remote_bin: String,
    pub connect_timeout: Duration,
}

/// `--remote-bin`'s default, decided with the flags.
use super::DEFAULT_REMOTE_BIN;

/// Runs the first gpureap found: on the PATH, else at `push`'s default
/// destinations (a user's ~/.local/bin is often not on a non-interactive
/// ssh session's PATH). Exit 127, as a shell's "not found", if none.
const FIND_GPUREAP: &str = r#"for b in gpureap "$HOME/.local/bin/gpureap" /usr/local/bin/gpureap; do if command -v "$b" >/dev/null 2>&1; then exec "$b" "$@"; fi; done; echo "gpureap: not found on PATH, in ~/.local/bin or /usr/local/bin" >&2; exit 127"#;

/// Runs the remote command ("$@") in a session of its own, and ends that
/// session (SIGTERM) when its stdin reaches its end: this side holds ssh's
/// stdin open while it waits, so the end comes when this side goes away,
/// its ssh killed past the host's deadline or on Ctrl-C, or the connection
/// lost. A remote gpureap does not outlive what asked for it, nor signal on
/// after it (docs/fleet.md, "Interrupted, timed out"). The shell's own
/// `kill`: procps' reads a small negative PID (a group in a container's PID
/// namespace, `-10`) as a signal number.
pub const WATCH: &str = r#"exec 3<&0
if command -v setsid >/dev/null 2>&1; then setsid "$@" </dev/null 3<&- & else "$@" </dev/null 3<&- & fi
pid=$!
{ cat <&3 >/dev/null 2>&1; kill -TERM -"$pid" "$pid" 2>/dev/null; } >/dev/null 2>&1 &
watcher=$!
exec 3<&-
wait "$pid"; code=$?
kill "$watcher" 2>/dev/null
exit "$code""#;

/// A raw command's outcome on a host (`exec`).
#[derive(Debug)]
pub struct Executed {
    /// Its exit code; `None` if killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    /// The last line of its stderr that says something.
    pub last_error: Option<String>,
}

fn timed_out(limit: Duration) -> String {
    format!(
        "no answer within {} (timed out; the host, its ssh or its gpureap hangs)",
        crate::units::Elapsed(limit)
    )
}

/// What one host's command came to.
#[derive(Debug)]
pub struct Answer {
    /// The remote gpureap's exit code, or `Incomplete` where it could not
    /// complete.
    pub exit_code: Exit,
    /// Its JSON document, when it gave one: the text, checked to be JSON.
    pub report: Option<Box<RawValue>>,
    /// Why there is no usable report, in one line.
    pub error: Option<String>,
    pub elapsed: Duration,
}

impl Transport {
    /// `--ssh` as given: split like a shell would, refused if empty.
    pub fn new(
        ssh: &str,
        remote_bin: &str,
        connect_timeout: Duration,
    ) -> Result<Transport, String> {
        let words =
            shlex::split(ssh).ok_or_else(|| format!("invalid --ssh '{ssh}': unbalanced quotes"))?;
        if words.is_empty() {
            return Err(
                "invalid --ssh '': give the ssh command, like 'ssh -F ~/.ssh/config'".into(),
            );
        }
        if remote_bin.is_empty() {
            return Err("invalid --remote-bin '': give a path or a command name".into());
        }
        Ok(Transport {
            ssh: words,
            remote_bin: remote_bin.to_string(),
            connect_timeout,
        })
    }

    /// The argv that runs `remote_bin ARGS…` on `host`: each argument
    /// quoted for the remote shell, so `--match 'sglang::|vllm'` arrives as
    /// one argument, unexpanded. The default `gpureap` is looked for on the
    /// remote PATH, then where `gpureap push` puts it by default.
    pub fn command_line(&self, host: &str, args: &[String]) -> Vec<String> {
        let mut words: Vec<String> = vec![
            "sh".into(),
            "-c".into(),
            WATCH.into(),
            "gpureap-watch".into(),
        ];
        if self.remote_bin == DEFAULT_REMOTE_BIN {
            words.extend([
                "sh".into(),
                "-c".into(),
                FIND_GPUREAP.into(),
                "gpureap".into(),
            ]);
        } else {
            words.push(self.remote_bin.clone());
        }
        words.extend(args.iter().cloned());
        self.argv(host, &words)
    }

    /// The ssh argv that runs `words` (quoted for the remote shell) on `host`.
    pub fn argv(&self, host: &str, words: &[String]) -> Vec<String> {
        let mut argv = self.ssh.clone();
        let seconds = self.connect_timeout.as_secs().max(1);
        argv.extend([
            "-o".to_string(),
            "BatchMode=yes".to_string(),
            "-o".to_string(),
            format!("ConnectTimeout={seconds}"),
            // No terminal: a remote `free` must never find one and wait on it.
            "-T".to_string(),
            host.to_string(),
        ]);
        argv.push(
            words
                .iter()
                .map(|word| quote(word))
                .collect::<Vec<_>>()
                .join(" "),
        );
        argv
    }

    /// Runs `remote_bin ARGS…` on `host` and waits at most `limit`.
    /// `kind` is the document expected back (`status`, `free`, `wait`).
    pub fn call(&self, host: &str, args: &[String], kind: &str, limit: Duration) -> Answer {
        let started = Instant::now();
        let outcome = run_bounded(
            &self.command_line(host, args),
            limit,
            Input::Held,
            MAX_ANSWER,
        );
        let elapsed = started.elapsed();
        let (exit_code, report, error) = match outcome {
            Err(error) => (Exit::Incomplete, None, Some(error)),
            Ok(Ran::TimedOut) => (Exit::Incomplete, None, Some(timed_out(limit))),
            Ok(Ran::Interrupted(signal)) => (
                Exit::Incomplete,
                None,
                Some(super::interrupt::host_error(signal)),
            ),
            Ok(Ran::Exited {
                status,
                stdout,
                stderr,
                truncated,
            }) => match self.judge(status, &stdout, &stderr, truncated, kind) {
                (_, Some(report), _) if !crate::status_doc::readable(kind, &report) => (
                    Exit::Incomplete,
                    None,
                    Some(format!(
                        "answered a {kind} report this gpureap cannot read (another version of gpureap?)"
                    )),
                ),
                judged => judged,
            },
        };
        Answer {
            exit_code,
            report,
            error,
            elapsed,
        }
    }

    /// Runs `words` on `host` with `input` on its stdin, for at most `limit`:
    /// its output, or why there is none (ssh's own failure, the time).
    pub fn exec(
        &self,
        host: &str,
        words: &[String],
        input: Option<Arc<Vec<u8>>>,
        limit: Duration,
    ) -> Result<Executed, String> {
        let input = input.map_or(Input::Null, Input::Data);
        match run_bounded(&self.argv(host, words), limit, input, MAX_ANSWER)? {
            Ran::TimedOut => Err(timed_out(limit)),
            // A raw command is not under WATCH: it may have finished there.
            Ran::Interrupted(signal) => Err(format!(
                "interrupted by {} before it answered: its ssh was ended; what the command did there is not known",
                super::interrupt::name(signal)
            )),
            Ran::Exited {
                status,
                stdout,
                stderr,
                ..
            } => {
                let stderr = String::from_utf8_lossy(&stderr).into_owned();
                if Remote::read(status.code()) == Remote::Ssh {
                    return Err(last_meaningful_line(&stderr)
                        .unwrap_or_else(|| "ssh failed (exit 255)".to_string()));
                }
                Ok(Executed {
                    code: status.code(),
                    stdout: String::from_utf8_lossy(&stdout).into_owned(),
                    last_error: last_meaningful_line(&stderr),
                })
            }
        }
    }

    /// What a finished ssh said: a report, or why there is none.
    fn judge(
        &self,
        status: ExitStatus,
        stdout: &[u8],
        stderr: &[u8],
        truncated: bool,
        kind: &str,
    ) -> (Exit, Option<Box<RawValue>>, Option<String>) {
        let stderr = String::from_utf8_lossy(stderr);
        let last_line = last_meaningful_line(&stderr);
        let remote = Remote::read(status.code());
        let remote_exit = match remote {
            Remote::Ended(exit) => exit,
            failed => {
                return (
                    Exit::Incomplete,
                    None,
                    Some(self.not_run(failed, last_line)),
                );
            }
        };
        if truncated {
            return (
                Exit::Incomplete,
                None,
                Some(format!(
                    "answered more than {} MiB: not a gpureap report",
                    MAX_ANSWER >> 20
                )),
            );
        }
        let text = String::from_utf8_lossy(stdout);
        if text.trim().is_empty() {
            // The remote gpureap refused (bad usage) or failed before any report.
            let why = refusal(&stderr).or(last_line).unwrap_or_else(|| {
                format!(
                    "exited {} with no output",
                    status.code().unwrap_or_default()
                )
            });
            let exit = if remote_exit == Exit::Usage {
                Exit::Usage
            } else {
                Exit::Incomplete
            };
            return (exit, None, Some(why));
        }
        match document(&text, kind) {
            Ok(document) => (remote_exit, Some(document), None),
            Err(why) => (Exit::Incomplete, None, Some(why)),
        }
    }

    /// Why a long-running remote command (`top -H`'s stream) ended, from its
    /// ssh's exit code (`None`: killed) and stderr: ssh's own failure, no
    /// gpureap there, an argument refused (a gpureap older than this one),
    /// or the command's own end. With it, what the code means.
    pub fn ended(&self, code: Option<i32>, stderr: &[u8]) -> (Remote, String) {
        let stderr = String::from_utf8_lossy(stderr);
        let last_line = last_meaningful_line(&stderr);
        let remote = Remote::read(code);
        let why = match remote {
            Remote::Ended(_) => refusal(&stderr).or(last_line).unwrap_or_else(|| {
                format!(
                    "its gpureap ended (exit {})",
                    code.map_or("?".to_string(), |code| code.to_string())
                )
            }),
            failed => self.not_run(failed, last_line),
        };
        (remote, why)
    }

    /// Why the remote gpureap did not run, when ssh says it did not: ssh's
    /// own failure (connection, host key, authentication), no such program,
    /// one that cannot be run, or ssh killed.
    fn not_run(&self, remote: Remote, last_line: Option<String>) -> String {
        match remote {
            Remote::NotFound if self.remote_bin == DEFAULT_REMOTE_BIN => {
                "gpureap not found on the host (install it or pass --remote-bin)".to_string()
            }
            Remote::NotFound => format!(
                "{} not found on the host (check --remote-bin)",
                self.remote_bin
            ),
            Remote::CannotRun => format!(
                "{} cannot be run on the host: {}",
                self.remote_bin,
                last_line.unwrap_or_else(|| "permission denied".to_string())
            ),
            Remote::Killed => "ssh was killed by a signal before the host answered".to_string(),
            Remote::Ssh | Remote::Ended(_) => {
                last_line.unwrap_or_else(|| "ssh failed (exit 255)".to_string())
            }
        }
    }
}

/// The `kind` report a host answered, kept as it came; else why it is not
/// one: not gpureap's JSON, another schema, another kind (the one header
/// check, `status_doc::header`).
fn document(text: &str, kind: &str) -> Result<Box<RawValue>, String> {
    crate::status_doc::header(text, kind)?;
    super::nested_json(text).ok_or_else(|| "answered JSON that cannot be kept".to_string())
}

/// A word for a POSIX shell: bare when it is plainly safe, else single-quoted.
fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// What a remote gpureap that refused its arguments said, when its
/// argument parser said it (`error: …`, followed by a usage and a "For more
/// information" line, which say nothing of the host): a gpureap without
/// the command asked is named as older than this one.
fn refusal(stderr: &str) -> Option<String> {
    let line = stderr
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("error: "))?;
    let older = line
        .strip_prefix("error: unrecognized subcommand '")
        .and_then(|rest| rest.split('\'').next());
    Some(match older {
        Some(command) => crate::units::short(
            &format!(
                "its gpureap has no `{command}` command: it is older than this one (update it: gpureap push -H HOST)"
            ),
            200,
        ),
        None => crate::units::short(line, 200),
    })
}

/// The last stderr line that says something: ssh's warnings and banners
/// (`Warning: Permanently added …`) are not the reason.
fn last_meaningful_line(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty() && !line.starts_with("Warning:") && !line.starts_with("**"))
        .map(|line| crate::units::short(line, 200))
}

/// Runs a local program for at most `limit`, keeping `max_stdout` bytes of
/// its output: its exit code (`None`: killed by a signal) and its stdout.
/// Past the limit its process group is killed and that is an error.
pub fn run_local(
    argv: &[std::ffi::OsString],
    limit: Duration,
    max_stdout: u64,
) -> Result<(Option<i32>, Vec<u8>), String> {
    match run_bounded(argv, limit, Input::Null, max_stdout)? {
        Ran::Interrupted(signal) => Err(super::interrupt::host_error(signal)),
        Ran::TimedOut => Err(format!(
            "it did not finish within {}",
            crate::units::Elapsed(limit)
        )),
        Ran::Exited { status, stdout, .. } => Ok((status.code(), stdout)),
    }
}

/// Runs argv as one bounded child (`child::run`), for at most `limit`;
/// a signal the fleet watches for (`interrupt`) ends it too.
fn run_bounded<S: AsRef<std::ffi::OsStr>>(
    argv: &[S],
    limit: Duration,
    input: Input,
    max_stdout: u64,
) -> Result<Ran, String> {
    let interruption = Interruption {
        signal: super::interrupt::signal,
        descriptor: super::interrupt::descriptor(),
    };
    child::run(
        argv,
        input,
        max_stdout,
        MAX_STDERR,
        limit,
        Some(interruption),
    )
    .map_err(|error| error.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn arguments_arrive_as_typed() {
        let transport = Transport::new(
            "ssh -F '/tmp/my lab/config'",
            "gpureap",
            Duration::from_secs(5),
        )
        .unwrap();
        let argv = transport.command_line(
            "h1",
            &[
                "free".into(),
                "--match".into(),
                "sglang::|vllm".into(),
                "it's".into(),
            ],
        );
        assert_eq!(&argv[..3], ["ssh", "-F", "/tmp/my lab/config"]);
        assert!(argv.contains(&"BatchMode=yes".to_string()));
        assert!(
            !argv
                .iter()
                .any(|word| word.contains("StrictHostKeyChecking"))
        );
        let remote = argv.last().unwrap();
        // What a POSIX shell makes of it is the words given, after the finder.
        let words = shlex::split(remote).unwrap();
        assert_eq!(words[..4], ["sh", "-c", WATCH, "gpureap-watch"]);
        assert_eq!(words[4..8], ["sh", "-c", FIND_GPUREAP, "gpureap"]);
        assert_eq!(words[8..], ["free", "--match", "sglang::|vllm", "it's"]);
        let transport = Transport::new("ssh", "/opt/gpureap", Duration::from_secs(5)).unwrap();
        let argv = transport.command_line("h1", &["status".into(), "a b".into()]);
        let words = shlex::split(argv.last().unwrap()).unwrap();
        assert_eq!(words[4..], ["/opt/gpureap", "status", "a b"]);
    }

    #[test]
    fn an_empty_or_unbalanced_ssh_is_refused() {
        assert!(Transport::new("", "gpureap", Duration::from_secs(1)).is_err());
        assert!(Transport::new("ssh -F 'x", "gpureap", Duration::from_secs(1)).is_err());
        assert!(Transport::new("ssh", "", Duration::from_secs(1)).is_err());
    }
}
