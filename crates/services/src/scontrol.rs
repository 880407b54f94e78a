//! Talking to Slurm through `scontrol`: drain, resume, and read a node's
//! state and a job's state.
//!
//! A Prolog or Epilog runs with no `PATH`, so scontrol is found in the places
//! Slurm is installed, or named with `--scontrol`. Every call is bounded in
//! time: a slurmctld that does not answer must not hold the epilog past its
//! own deadline.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::Duration;

use crate::child::{self, Input, Ran};
use crate::file::executable;
use crate::signal::kill_group;

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

/// The most of scontrol's output read: a node or a job is a few KiB.
const OUTPUT_LIMIT: u64 = 1 << 20;

/// The scontrol calls under way, by process group (each leads its own, and
/// is not reaped before its group is ended), and the thread that closed
/// the door on new calls (`end_calls`), if one did.
struct Calls {
    groups: BTreeSet<u32>,
    closed_by: Option<ThreadId>,
}

static CALLS: Mutex<Calls> = Mutex::new(Calls {
    groups: BTreeSet::new(),
    closed_by: None,
});

fn calls() -> std::sync::MutexGuard<'static, Calls> {
    CALLS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Ends every scontrol call under way, with whatever it forked (its process
/// group), and refuses new calls from any thread but this one: what a
/// deadline does before its own drain and outcome, so that no scontrol outlives
/// the command.
pub fn end_calls() {
    let groups = {
        let mut calls = calls();
        calls.closed_by = Some(std::thread::current().id());
        calls.groups.clone()
    };
    for group in groups {
        kill_group(group);
    }
}

/// Once a deadline has ended the calls, every other thread that would call
/// scontrol, or that was waiting for one, waits for the deadline's outcome
/// to end the command (`slurm::main`): its drain is the one that counts.
fn yield_to_deadline() {
    let closed_by = calls().closed_by;
    if closed_by.is_some_and(|thread| thread != std::thread::current().id()) {
        loop {
            std::thread::park();
        }
    }
}

/// Whether a deadline has ended the calls (and is draining, then handing
/// its outcome to `slurm::main`).
pub fn deadline_passed() -> bool {
    calls().closed_by.is_some()
}

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

    /// Runs scontrol with `args`; its stdout, or why it failed. scontrol
    /// leads a process group of its own: when it is done, or past
    /// CALL_LIMIT, the group is ended, so that nothing it forked holds its
    /// pipes (and this call) open.
    fn call(&self, args: &[&str]) -> Result<String, String> {
        run(&self.path, args)
    }

    /// squeue, beside scontrol (both are slurm-client's).
    fn squeue(&self) -> Result<PathBuf, String> {
        let path = self.path.with_file_name("squeue");
        if executable(&path) {
            Ok(path)
        } else {
            Err(format!("no squeue beside {}", self.path.display()))
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

    /// A job as `scontrol -o -d show job` shows it; `None` when Slurm does
    /// not know the job (any more).
    ///
    /// The job's name is the user's text, written raw among Slurm's fields
    /// (`JobName=x JobState=RUNNING UserId=root(0)`, even newlines): it is
    /// asked of squeue on its own and cut out before anything is read.
    pub fn job(&self, job: u64) -> Result<Option<JobInfo>, String> {
        let id = job.to_string();
        let text = match self.call(&["-o", "-d", "show", "job", &id]) {
            Ok(text) => text,
            // Whether scontrol failed because the job is unknown is not read
            // from its message: squeue's list of the jobs Slurm knows says it.
            Err(error) => {
                return match self.knows(job) {
                    Ok(false) => Ok(None),
                    Ok(true) => Err(error),
                    Err(why) => Err(format!("{error}; {why}")),
                };
            }
        };
        let name = run(
            &self.squeue()?,
            &["-h", "--states=all", "-j", &id, "-o", "%j"],
        )?;
        let name = name.strip_suffix('\n').unwrap_or(&name);
        Ok(Some(parse_job(&text, job, name)))
    }

    /// Whether Slurm knows the job: its id in squeue's list of every job
    /// (`%A`, one id a line, each element of an array its own), in any
    /// state. Nothing of the user's text is in it.
    fn knows(&self, job: u64) -> Result<bool, String> {
        let ids = run(&self.squeue()?, &["-h", "--states=all", "-o", "%A"])?;
        if ids.len() as u64 >= OUTPUT_LIMIT {
            return Err(format!(
                "squeue's list of jobs is longer than {OUTPUT_LIMIT} bytes: whether it has job {job} cannot be told"
            ));
        }
        known_job(&ids, job)
    }
}

/// Whether squeue's list of job ids (`-h -o %A`) has `job`; an error for a
/// line that is not a job id.
fn known_job(ids: &str, job: u64) -> Result<bool, String> {
    let mut found = false;
    for line in ids.lines().map(str::trim).filter(|line| !line.is_empty()) {
        let id: u64 = line
            .parse()
            .map_err(|_| format!("squeue lists \"{}\", not a job id", one_line(line)))?;
        found |= id == job;
    }
    Ok(found)
}

/// What Slurm says of a job: enough to tell whether a process that names
/// it may hold a GPU of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    /// `JobState=` (RUNNING, COMPLETING, ...).
    pub state: String,
    /// The uid of `UserId=name(uid)`.
    pub uid: Option<u32>,
    /// Each `Nodes=` of the details: the nodes (a Slurm host list) and the
    /// GPU indexes Slurm gave the job there (`GRES=gpu:2(IDX:0-1)`), `None`
    /// where it names none.
    pub allocations: Vec<(String, Option<BTreeSet<u32>>)>,
    /// Why Slurm's answer could not be read (then nothing else is set):
    /// a process that names such a job is not taken to be its.
    pub unreadable: Option<String>,
}

impl JobInfo {
    /// The job's allocation on `node`: `None` when it has none there, else
    /// the GPUs Slurm gave it there, where it says.
    pub fn on_node(&self, node: &str) -> Option<Option<&BTreeSet<u32>>> {
        self.allocations
            .iter()
            .find(|(nodes, _)| names_node(nodes, node))
            .map(|(_, gpus)| gpus.as_ref())
    }
}

/// The job `id` from `scontrol -o -d show job`, whose name squeue gave as
/// `name`. Read are only Slurm's own fields: those before `JobName=`, and
/// those between the name and `MinCPUsNode=` (after it come the command,
/// work directory, comment and output paths: the user's text again). Each
/// field read must be there once.
fn parse_job(text: &str, id: u64, name: &str) -> JobInfo {
    let unreadable = |why: &str| JobInfo {
        state: String::new(),
        uid: None,
        allocations: Vec::new(),
        unreadable: Some(why.to_string()),
    };
    let start = format!("JobId={id} ");
    let at = if text.starts_with(&start) {
        Some(0)
    } else {
        text.find(&format!("\n{start}")).map(|at| at + 1)
    };
    let Some(at) = at else {
        return unreadable("no JobId= line");
    };
    let line = &text[at..];
    let Some(name_at) = line.find(" JobName=") else {
        return unreadable("no JobName=");
    };
    let head = &line[..name_at];
    let Some(rest) = line[name_at + " JobName=".len()..]
        .strip_prefix(name)
        .and_then(|rest| rest.strip_prefix(' '))
        .filter(|_| !head.contains('\n'))
    else {
        return unreadable("its JobName= is not the name squeue gives");
    };
    let Some(end) = rest.find(" MinCPUsNode=") else {
        return unreadable("no MinCPUsNode=");
    };
    let tokens: Vec<&str> = head
        .split_whitespace()
        .chain(rest[..end].split_whitespace())
        .collect();
    let once = |key: &str| {
        let mut values = tokens.iter().filter_map(|token| token.strip_prefix(key));
        match (values.next(), values.next()) {
            (Some(value), None) => Some(value),
            _ => None,
        }
    };
    let (Some(state), Some(user)) = (once("JobState="), once("UserId=")) else {
        return unreadable("not one JobState= and one UserId=");
    };
    let uid = user
        .rsplit_once('(')
        .and_then(|(_, uid)| uid.strip_suffix(')'))
        .and_then(|uid| uid.parse().ok());
    let mut allocations: Vec<(String, Option<BTreeSet<u32>>)> = Vec::new();
    for token in &tokens {
        if let Some(nodes) = token.strip_prefix("Nodes=") {
            allocations.push((nodes.to_string(), None));
        } else if let Some(gres) = token.strip_prefix("GRES=")
            && let Some((_, gpus)) = allocations.last_mut()
        {
            *gpus = gpu_indexes(gres);
        }
    }
    JobInfo {
        state: state.to_string(),
        uid,
        allocations,
        unreadable: None,
    }
}

/// The GPU indexes in a detail's `GRES=`, e.g. `gpu:a100:2(IDX:0-1),mps:0`;
/// none when it names no GPU, shard or MPS share at all (a job without GPUs
/// there: `GRES=` empty or other resources only); `None` when it names a GPU
/// share without an index (shards, MPS), or one gpureap cannot read.
fn gpu_indexes(gres: &str) -> Option<BTreeSet<u32>> {
    let lower = gres.to_ascii_lowercase();
    if !["gpu", "shard", "mps"]
        .iter()
        .any(|kind| lower.contains(kind))
    {
        return Some(BTreeSet::new());
    }
    let mut indexes = BTreeSet::new();
    let mut rest = gres;
    let mut found = false;
    while let Some(at) = rest.find("(IDX:") {
        let name = rest[..at].rsplit(',').next().unwrap_or("");
        let after = &rest[at + "(IDX:".len()..];
        let end = after.find(')')?;
        if name.starts_with("gpu") {
            found = true;
            for part in after[..end].split(',') {
                let (first, last) = part.split_once('-').unwrap_or((part, part));
                let (first, last) = (first.parse::<u32>().ok()?, last.parse::<u32>().ok()?);
                if last < first || last - first >= 1024 {
                    return None;
                }
                indexes.extend(first..=last);
            }
        }
        rest = &after[end..];
    }
    found.then_some(indexes)
}

/// Whether a Slurm host list (`gpu[01-16,20]`, `n[1-2]-ib,x`) names `node`,
/// matched without expanding it.
pub(crate) fn names_node(list: &str, node: &str) -> bool {
    let mut depth = 0usize;
    let mut start = 0;
    for (at, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                if term_names(&list[start..at], node) {
                    return true;
                }
                start = at + 1;
            }
            _ => {}
        }
    }
    term_names(&list[start..], node)
}

/// Whether one host list term (`gpu[01-16,20]-ib`) names `node`.
fn term_names(term: &str, node: &str) -> bool {
    let Some(open) = term.find('[') else {
        return term == node;
    };
    let Some(node_rest) = node.strip_prefix(&term[..open]) else {
        return false;
    };
    let Some(close) = term[open..].find(']').map(|at| open + at) else {
        return false;
    };
    let after = &term[close + 1..];
    let digits = node_rest.bytes().take_while(u8::is_ascii_digit).count();
    term[open + 1..close].split(',').any(|range| {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        let (Ok(low), Ok(high)) = (first.parse::<u64>(), last.parse::<u64>()) else {
            return false;
        };
        // Zero-padded ranges (01-16) name numbers of exactly that width.
        let width = (first.len() > 1 && first.starts_with('0')).then_some(first.len());
        (1..=digits).any(|taken| {
            let number = &node_rest[..taken];
            let fits = match width {
                Some(width) => taken == width,
                None => taken == 1 || !number.starts_with('0'),
            };
            fits && number
                .parse::<u64>()
                .is_ok_and(|value| (low..=high).contains(&value))
                && term_names(after, &node_rest[taken..])
        })
    })
}

/// Runs a Slurm client (scontrol, squeue) with `args` as one bounded child
/// (`child`); its stdout, or why it failed. It leads a process group of its
/// own: when it is done, or past CALL_LIMIT, the group is ended, so that
/// nothing it forked holds its pipes (and this call) open. While it runs
/// its group is in CALLS, for a deadline to end (`end_calls`).
fn run(program: &Path, args: &[&str]) -> Result<String, String> {
    let shown = format!("{} {}", program.display(), args.join(" "));
    yield_to_deadline();
    let argv: Vec<&std::ffi::OsStr> = std::iter::once(program.as_os_str())
        .chain(args.iter().map(std::ffi::OsStr::new))
        .collect();
    let mut running = {
        let mut calls = calls();
        let running =
            child::spawn(&argv, Input::Null, OUTPUT_LIMIT, OUTPUT_LIMIT).map_err(|error| {
                match error {
                    child::Error::Spawn { source, .. } => format!("cannot run {shown}: {source}"),
                    error => format!("{shown}: {error}"),
                }
            })?;
        calls.groups.insert(running.group());
        running
    };
    let group = running.group();
    let waited = running.end_within(CALL_LIMIT, None);
    calls().groups.remove(&group);
    let ran = running.reap(waited, CALL_LIMIT);
    // Ended by the deadline: what it got is not this thread's to report.
    yield_to_deadline();
    match ran.map_err(|error| format!("{shown}: {error}"))? {
        Ran::Exited { status, stdout, .. } if status.success() => {
            Ok(String::from_utf8_lossy(&stdout).into_owned())
        }
        Ran::Exited { status, stderr, .. } => Err(format!(
            "{shown} failed ({status}): {}",
            String::from_utf8_lossy(&stderr)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        )),
        Ran::TimedOut | Ran::Interrupted(_) => Err(format!(
            "{shown} did not answer within {}s",
            CALL_LIMIT.as_secs()
        )),
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

    #[test]
    fn a_job_is_known_by_its_id_on_a_line_of_its_own() {
        assert_eq!(known_job("12\n123\n", 123), Ok(true));
        assert_eq!(known_job("1234\n12\n", 123), Ok(false));
        assert_eq!(known_job("", 123), Ok(false));
        assert!(known_job("123 x\n", 123).is_err());
        // squeue's line written out once, by the one rule: not `\\u{1b}`.
        assert_eq!(
            known_job("12\n1\u{1b}[2K\u{200b}\n", 12),
            Err("squeue lists \"1\\u{1b}[2K\\u{200b}\", not a job id".to_string())
        );
    }

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

    // Output of slurm-wlm 22.05.8 (Debian 12), `scontrol -o -d show job`, shortened.
    const JOB: &str = "JobId=1 JobName=job-0.sh UserId=nobody(65534) GroupId=root(0) JobState=RUNNING Reason=None NodeList=gpureap25319 BatchHost=gpureap25319 NumNodes=1 JOB_GRES=gpu:1   Nodes=gpureap25319 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0) MinCPUsNode=1 Command=/tmp/job-0.sh WorkDir=/ TresPerNode=gres:gpu:1 \n";
    const NO_GPU_JOB: &str = "JobId=2 JobName=job-1.sh UserId=nobody(65534) GroupId=root(0) JobState=RUNNING NumNodes=1 JOB_GRES=(null)   Nodes=gpureap25319 CPU_IDs=1 Mem=0 GRES= MinCPUsNode=1\n";

    #[test]
    fn jobs_as_scontrol_shows_them() {
        let job = parse_job(JOB, 1, "job-0.sh");
        assert_eq!(job.unreadable, None);
        assert_eq!(job.state, "RUNNING");
        assert_eq!(job.uid, Some(65534));
        assert_eq!(
            job.on_node("gpureap25319"),
            Some(Some(&BTreeSet::from([0])))
        );
        assert_eq!(job.on_node("gpureap2531"), None);
        let other = parse_job(NO_GPU_JOB, 2, "job-1.sh");
        // A job without GPUs there is given none, not any.
        assert_eq!(other.on_node("gpureap25319"), Some(Some(&BTreeSet::new())));
        assert!(parse_job("", 3, "x").unreadable.is_some());
        let multi = "JobId=9 ArrayJobId=8 ArrayTaskId=1 JobName=w UserId=alice(1001) JobState=RUNNING   Nodes=g[01-02] CPU_IDs=0 GRES=gpu:h200:2(IDX:0-1),mps:0   Nodes=g03 CPU_IDs=0 GRES=gpu:1(IDX:3) MinCPUsNode=1 Command=/x\n";
        let multi = parse_job(multi, 9, "w");
        assert_eq!(multi.uid, Some(1001));
        assert_eq!(multi.on_node("g02"), Some(Some(&BTreeSet::from([0, 1]))));
        assert_eq!(multi.on_node("g03"), Some(Some(&BTreeSet::from([3]))));
        assert_eq!(multi.on_node("g2"), None);
        assert_eq!(
            gpu_indexes("gpu:2(IDX:0,2-3)"),
            Some(BTreeSet::from([0, 2, 3]))
        );
        assert_eq!(gpu_indexes("gpu:1(IDX:N/A)"), None);
        assert_eq!(gpu_indexes(""), Some(BTreeSet::new()));
        assert_eq!(gpu_indexes("nic:1"), Some(BTreeSet::new()));
        assert_eq!(gpu_indexes("shard:2"), None);
        assert_eq!(gpu_indexes("mps:100"), None);
    }

    /// The job's name, the command, the work directory and the comment are
    /// the user's text, written raw: none of it is read as Slurm's.
    #[test]
    fn a_jobs_own_text_is_never_read_as_slurms() {
        let name =
            "x UserId=root(0) JobState=RUNNING Nodes=n1 GRES=gpu:2(IDX:0-1)\n   UserId=root(0)";
        let text = format!(
            "JobId=5 JobName={name} UserId=alice(1001) JobState=COMPLETED Reason=None   Nodes=n2 CPU_IDs=0 GRES=gpu:1(IDX:0) MinCPUsNode=1 Command=/a UserId=root(0) Nodes=n1 WorkDir=/ Comment=c JobState=RUNNING\n"
        );
        let job = parse_job(&text, 5, name);
        assert_eq!(job.unreadable, None);
        assert_eq!(job.state, "COMPLETED");
        assert_eq!(job.uid, Some(1001));
        assert_eq!(job.on_node("n1"), None);
        assert_eq!(job.on_node("n2"), Some(Some(&BTreeSet::from([0]))));
        // A name that changed between the two questions: not read at all.
        assert!(parse_job(&text, 5, "x").unreadable.is_some());
        // Slurm's fields twice where the name cannot explain it: not read.
        let twice = "JobId=6 JobName=y UserId=a(1) UserId=root(0) JobState=RUNNING MinCPUsNode=1\n";
        assert!(parse_job(twice, 6, "y").unreadable.is_some());
    }

    #[test]
    fn host_lists_name_nodes_without_expanding() {
        for (list, node) in [
            ("n1", "n1"),
            ("a,n[1-3],b", "n2"),
            ("gpu[01-16,20]", "gpu07"),
            ("gpu[01-16,20]", "gpu20"),
            ("n[1-2]-ib", "n2-ib"),
            ("r[1-2]n[1-4]", "r2n3"),
            ("n[1-4294967295]", "n4000000000"),
        ] {
            assert!(names_node(list, node), "{list} names {node}");
        }
        for (list, node) in [
            ("n1", "n10"),
            ("n[1-3]", "n4"),
            ("gpu[01-16]", "gpu7"),
            ("n[1-3]", "n01"),
            ("n[1-2]-ib", "n2"),
            ("n[1-3", "n1"),
        ] {
            assert!(!names_node(list, node), "{list} does not name {node}");
        }
    }

    #[test]
    fn reasons_stay_on_one_line_and_short() {
        assert_eq!(one_line("a\nb\tc\u{1b}[2K"), "a\\nb\\tc\\u{1b}[2K");
        let long = "é".repeat(300);
        let cut = one_line(&long);
        assert!(cut.len() <= REASON_LIMIT && cut.ends_with("..."));
    }
}
