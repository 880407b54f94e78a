//! Talking to Slurm through `scontrol`: drain, resume, and read a node's
//! state and a job's state.
//!
//! A Prolog or Epilog runs with no `PATH`, so scontrol is found in the places
//! Slurm is installed, or named with `--scontrol`. Every call is bounded in
//! time: a slurmctld that does not answer must not hold the epilog past its
//! own deadline.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt;

/// Where Slurm's client commands are installed by distributions and by hand.
const PLACES: [&str; 5] = [
    "/usr/bin",
    "/usr/local/bin",
    "/opt/slurm/bin",
    "/usr/local/slurm/bin",
    "/bin",
];

/// How long one scontrol call may take.
const CALL_LIMIT: Duration = Duration::from_secs(10);

/// The longest drain reason sent: Slurm keeps it, and `sinfo -R` shows it
/// on one line.
const REASON_LIMIT: usize = 240;

pub struct Scontrol {
    path: PathBuf,
}

/// A node as `scontrol show node` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// `State=`, e.g. `IDLE+DRAIN`.
    pub state: String,
    /// `Reason=`, without the `[user@time]` Slurm appends; `None` when unset.
    pub reason: Option<String>,
}

impl NodeState {
    /// Drained or draining (by anyone).
    pub fn drained(&self) -> bool {
        self.state.split('+').any(|flag| flag.starts_with("DRAIN"))
    }
}

fn executable(path: &Path) -> bool {
    path.is_file() && rustix::fs::access(path, rustix::fs::Access::EXEC_OK).is_ok()
}

impl Scontrol {
    /// `--scontrol PATH` as given (it must be an executable file), else the
    /// first scontrol in the usual places, then on PATH.
    pub fn find(given: Option<&Path>) -> Result<Scontrol, String> {
        if let Some(path) = given {
            return if executable(path) {
                Ok(Scontrol {
                    path: path.to_path_buf(),
                })
            } else {
                Err(format!(
                    "--scontrol {}: not an executable file",
                    path.display()
                ))
            };
        }
        let path_dirs = std::env::var_os("PATH")
            .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
            .unwrap_or_default();
        PLACES
            .iter()
            .map(PathBuf::from)
            .chain(path_dirs)
            .map(|dir| dir.join("scontrol"))
            .find(|candidate| executable(candidate))
            .map(|path| Scontrol { path })
            .ok_or_else(|| {
                format!(
                    "scontrol is in none of {} nor on PATH; pass --scontrol PATH",
                    PLACES.join(", ")
                )
            })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs scontrol with `args`; its stdout, or why it failed.
    fn call(&self, args: &[&str]) -> Result<String, String> {
        let shown = format!("{} {}", self.path.display(), args.join(" "));
        let mut child = Command::new(&self.path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|error| format!("cannot run {shown}: {error}"))?;
        let status = match child.wait_timeout(CALL_LIMIT) {
            Ok(Some(status)) => status,
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{shown} did not answer within {}s",
                    CALL_LIMIT.as_secs()
                ));
            }
            Err(error) => return Err(format!("cannot wait for {shown}: {error}")),
        };
        let mut stdout = String::new();
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stdout.take() {
            let _ = pipe.read_to_string(&mut stdout);
        }
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        if status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "{shown} failed ({status}): {}",
                stderr.split_whitespace().collect::<Vec<_>>().join(" ")
            ))
        }
    }

    /// Drains the node with this reason (cut to a length Slurm shows whole).
    pub fn drain(&self, node: &str, reason: &str) -> Result<(), String> {
        let reason = one_line(reason);
        self.call(&[
            "update",
            &format!("nodename={node}"),
            "state=drain",
            &format!("reason={reason}"),
        ])
        .map(drop)
    }

    pub fn resume(&self, node: &str) -> Result<(), String> {
        self.call(&["update", &format!("nodename={node}"), "state=resume"])
            .map(drop)
    }

    pub fn node(&self, node: &str) -> Result<NodeState, String> {
        let text = self.call(&["-o", "show", "node", node])?;
        parse_node(&text).ok_or_else(|| format!("scontrol shows no State= for node {node}"))
    }

    /// A job's `JobState=` (RUNNING, COMPLETING, ...); `None` when Slurm
    /// does not know the job (any more).
    pub fn job_state(&self, job: u64) -> Result<Option<String>, String> {
        match self.call(&["-o", "show", "job", &job.to_string()]) {
            Ok(text) => Ok(field(&text, "JobState").map(str::to_string)),
            Err(error) if error.contains("Invalid job id") => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// A reason on one line (`units::one_line`, the escaping every output
/// shares), cut at a character boundary to what Slurm shows whole.
fn one_line(reason: &str) -> String {
    let clean = crate::units::one_line(reason);
    if clean.len() <= REASON_LIMIT {
        return clean.into_owned();
    }
    let mut end = REASON_LIMIT - 3;
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &clean[..end])
}

/// The value of `Name=` in scontrol's one-line output (up to the next space).
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.split_whitespace()
        .find_map(|token| token.strip_prefix(name)?.strip_prefix('='))
}

/// State and reason from `scontrol -o show node`. `Reason=` comes last and
/// holds spaces; Slurm appends ` [user@time]`.
fn parse_node(text: &str) -> Option<NodeState> {
    let state = field(text, "State")?.to_string();
    let reason = text
        .find(" Reason=")
        .map(|at| text[at + " Reason=".len()..].trim_end())
        .map(|reason| match reason.rfind(" [") {
            Some(at) if reason.ends_with(']') => &reason[..at],
            _ => reason,
        })
        .filter(|reason| !reason.is_empty() && *reason != "(null)")
        .map(str::to_string);
    Some(NodeState { state, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Output of slurm-wlm 22.05.8 (Debian 12), shortened.
    const DRAINED: &str = "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 Gres=gpu:2 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=p  ExtSensorsTemp=n/s Reason=gpureap: GPU 1: 5.0 GiB held by no process (driver-held) [root@2026-11-30T13:09:06]\n";

    #[test]
    fn node_state_and_reason() {
        let node = parse_node(DRAINED).expect("parsed");
        assert_eq!(node.state, "IDLE+DRAIN");
        assert!(node.drained());
        assert_eq!(
            node.reason.as_deref(),
            Some("gpureap: GPU 1: 5.0 GiB held by no process (driver-held)")
        );
        let idle = parse_node("NodeName=n1 State=IDLE ThreadsPerCore=1\n").expect("parsed");
        assert!(!idle.drained());
        assert_eq!(idle.reason, None);
        assert!(parse_node("slurm_load_node error").is_none());
    }

    #[test]
    fn fields() {
        let job = "JobId=7 JobName=wrap UserId=nobody(65534) JobState=RUNNING Reason=None\n";
        assert_eq!(field(job, "JobState"), Some("RUNNING"));
        assert_eq!(field(job, "JobId"), Some("7"));
        assert_eq!(field(job, "State"), None);
    }

    #[test]
    fn reasons_stay_on_one_line_and_short() {
        assert_eq!(one_line("a\nb\tc\u{1b}[2K"), "a\\nb\\tc\\u{1b}[2K");
        let long = "é".repeat(300);
        let cut = one_line(&long);
        assert!(cut.len() <= REASON_LIMIT && cut.ends_with("..."));
    }
}
