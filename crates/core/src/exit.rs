//! Every exit code gpureap returns, by name, the one table of what each
//! program returns, how several outcomes merge into one, how codes that come
//! back (a remote gpureap's through ssh, a child's) are read, and how an
//! error's class ([`Failure`]) becomes a code.
//!
//! The codes are a contract with scripts, Slurm, node-problem-detector and
//! fleet runs: `0` done, `1` still held, a problem found or a wait that timed
//! out, `2` bad usage or input with nothing signalled or started, `3` could
//! not complete or could not tell (the driver failed or is absent, an I/O
//! error, a GPU that could not be checked), `4` (`plan` alone) the server
//! cannot fit on this hardware, even on clean GPUs; a process ended by a
//! signal it caught exits 128 + the signal ([`Exit::Signalled`]). Nothing else in the
//! program picks a number (`tests/exit_codes.rs` scans for one), and every
//! `--help` prints its program's rows of [`rows`]. Only `main` ends the
//! process with a code ([`Exit::exit`]); no thread does (a Slurm deadline
//! hands its outcome back to `slurm::main`), save the demo's Ctrl-C handler
//! and the simulator's stand-in, a process of its own (tests/imports.rs).

use std::io::Write;

/// How a command ended, as its exit code says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exit {
    /// All GPUs in scope freed; or status, wait or demo succeeded.
    Success,
    /// Something is still held (free), the GPUs did not become free in time
    /// (wait), a problem was found (check), or the supervised server did not
    /// end cleanly (run).
    StillHeld,
    /// Bad usage or input; nothing was signalled or started.
    Usage,
    /// The command could not do its work: the driver failed or could not
    /// verify a GPU, a file could not be opened or written.
    Incomplete,
    /// A verdict that cannot be given: no driver, or a GPU the driver lost,
    /// so whether memory is held cannot be told (`status`, and `check`'s
    /// "unknown" for node-problem-detector, which reads every code but 0
    /// and 1 as unknown). The same number as `Incomplete`.
    Unknown,
    /// `plan`: nothing on this host makes the server start as asked: even
    /// on clean GPUs the engine refuses (SGLang's "Not enough memory", vLLM
    /// refusing its utilization, weights larger than the free memory) or
    /// does not hold `--concurrency N`, or its host tier is more than the
    /// host memory. Freeing anything would not help.
    CannotFit,
    /// Ended by a signal it caught (`demo` cleaning up after Ctrl-C, a
    /// simulated server after SIGTERM): 128 + the signal, as a shell says.
    Signalled(i32),
}

impl Exit {
    /// The number the process exits with.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::StillHeld => 1,
            Exit::Usage => 2,
            Exit::Incomplete | Exit::Unknown => 3,
            Exit::CannotFit => 4,
            Exit::Signalled(signal) => u8::try_from(128 + signal).unwrap_or(u8::MAX),
        }
    }

    /// The code as the table shows it: `128+N` for a signal.
    pub fn shown(self) -> String {
        match self {
            Exit::Signalled(_) => "128+N".to_string(),
            _ => self.code().to_string(),
        }
    }

    /// The code a remote gpureap (or anything standing in its place) exited
    /// with, read back: a number outside the table is "could not complete".
    pub(crate) fn from_remote(code: i32) -> Exit {
        match code {
            0 => Exit::Success,
            1 => Exit::StillHeld,
            2 => Exit::Usage,
            4 => Exit::CannotFit,
            _ => Exit::Incomplete,
        }
    }

    /// Whether a program's exit status (None: killed by a signal) says it
    /// did its work: a child gpureap, a remote shell, a supervised server.
    pub fn succeeded(code: Option<i32>) -> bool {
        code.map(Exit::from_remote) == Some(Exit::Success)
    }

    /// The worse of two outcomes of one host or one command: the higher code.
    pub fn worse(self, other: Exit) -> Exit {
        if other.code() > self.code() {
            other
        } else {
            self
        }
    }

    /// The outcome of parts that each went their own way (reset's GPUs): the
    /// worst of them; `Success` when there are none.
    pub fn worst(parts: impl IntoIterator<Item = Exit>) -> Exit {
        parts.into_iter().fold(Exit::Success, Exit::worse)
    }

    /// A fleet run's outcome from its hosts' (`free -H`, `status -H`,
    /// `wait -H`, `push`). It is `Usage` ("nothing signalled or started")
    /// only when every host refused its arguments, so that nothing was sent
    /// anywhere. Once any host did its work, a host's usage error means the
    /// fleet could not complete: it counts as 3, never as "nothing
    /// signalled", and never masks a host still held (1). Otherwise the
    /// worst host's code, the higher the worse. No hosts: `Success`.
    pub fn merge_hosts(hosts: impl IntoIterator<Item = Exit>) -> Exit {
        let (mut worst, mut refused, mut any) = (Exit::Success, false, false);
        let mut all_refused = true;
        for host in hosts {
            any = true;
            if host == Exit::Usage {
                refused = true;
            } else {
                all_refused = false;
                worst = worst.worse(host);
            }
        }
        match (any, all_refused, refused) {
            (false, _, _) => Exit::Success,
            (true, true, _) => Exit::Usage,
            // A refusal elsewhere: could not complete, unless a host is still held.
            (true, false, true) if worst != Exit::StillHeld => Exit::Incomplete,
            _ => worst,
        }
    }

    /// Flushes stdout and ends the process at once, without running the exit
    /// handlers that libnvidia-ml registers (they only add time). With
    /// `GPUREAP_LOG=debug` it first logs the process's memory figures (peak
    /// and current resident memory, and what that is made of), read only then.
    pub fn exit(self) -> ! {
        if tracing::enabled!(tracing::Level::DEBUG) {
            let [hwm, rss, anon, file, shmem] = std::fs::read_to_string("/proc/self/status")
                .map(|status| memory_figures(&status))
                .unwrap_or_default();
            tracing::debug!(
                vm_hwm_kib = hwm,
                vm_rss_kib = rss,
                rss_anon_kib = anon,
                rss_file_kib = file,
                rss_shmem_kib = shmem,
                malloc_arenas = malloc_arenas(),
                "memory at exit"
            );
        }
        let _ = std::io::stdout().flush();
        // Safety: _exit ends the process at once; no Rust code runs after it.
        unsafe { libc::_exit(self.code().into()) }
    }
}

/// The lines of `/proc/PID/status` that [`Exit::exit`] logs, in its order.
const MEMORY_LINES: [&str; 5] = ["VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"];

/// The [`MEMORY_LINES`] figures (KiB) out of a `/proc/PID/status` text;
/// `None` for a line that is missing or not `NAME:   N kB`.
fn memory_figures(status: &str) -> [Option<u64>; 5] {
    MEMORY_LINES.map(|name| {
        status.lines().find_map(|line| {
            let value = line.strip_prefix(name)?.strip_prefix(':')?;
            value.trim().strip_suffix("kB")?.trim_end().parse().ok()
        })
    })
}

/// How many arenas glibc's malloc has made (each `<heap nr=` of
/// `malloc_info`'s report); `None` with another C library or where the
/// report cannot be written.
fn malloc_arenas() -> Option<usize> {
    #[cfg(target_env = "gnu")]
    {
        let (mut text, mut size) = (std::ptr::null_mut::<libc::c_char>(), 0);
        // Safety: the stream writes into a buffer it allocates and points
        // `text` at; it is closed (which NUL-terminates it) before it is read,
        // and freed once.
        unsafe {
            let stream = libc::open_memstream(&mut text, &mut size);
            if stream.is_null() {
                return None;
            }
            let written = libc::malloc_info(0, stream);
            libc::fclose(stream);
            if text.is_null() {
                return None;
            }
            let report = std::ffi::CStr::from_ptr(text).to_bytes();
            let arenas = report.windows(9).filter(|at| at == b"<heap nr=").count();
            libc::free(text.cast());
            (written == 0).then_some(arenas)
        }
    }
    #[cfg(not(target_env = "gnu"))]
    None
}

/// What the exit status of `ssh HOST COMMAND` says of the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remote {
    /// ssh itself failed (255): connection, host key, authentication.
    Ssh,
    /// The remote shell found no such program (127).
    NotFound,
    /// The remote shell found it but could not run it (126).
    CannotRun,
    /// ssh was killed by a signal: no code.
    Killed,
    /// The command ended with this code, read through the table.
    Ended(Exit),
}

impl Remote {
    /// Reads the exit status of an ssh (`ExitStatus::code()`).
    pub fn read(code: Option<i32>) -> Remote {
        match code {
            Some(255) => Remote::Ssh,
            Some(127) => Remote::NotFound,
            Some(126) => Remote::CannotRun,
            Some(code) => Remote::Ended(Exit::from_remote(code)),
            None => Remote::Killed,
        }
    }
}

/// The codes `push`'s copy script (sh, on the host) exits with when it
/// refuses to install rather than fails: 69, the directory can be changed
/// by another user; 67, the destination changed while pushing (or became a
/// link or a directory). Its failures: 65 checksum mismatch, 66 the copy
/// does not run there. The script's text (src/fleet/push.rs) spells them.
pub(crate) const PUSH_REFUSED_UNSAFE_DIRECTORY: i32 = 69;
/// See [`PUSH_REFUSED_UNSAFE_DIRECTORY`].
pub(crate) const PUSH_REFUSED_CHANGED: i32 = 67;

/// Whether push's copy script refused (a refusal, not a failure).
pub fn push_refused(code: Option<i32>) -> bool {
    matches!(
        code,
        Some(PUSH_REFUSED_UNSAFE_DIRECTORY | PUSH_REFUSED_CHANGED)
    )
}

/// An error that stopped a command, with its class: the table's row it
/// ends with. Bad usage or input (the services' `request::UsageError`) is `Usage`; any
/// other error is `Incomplete`; a closed stdout (a pager quit) is `Success`,
/// said nothing of.
#[derive(Debug)]
pub struct Failure {
    class: Exit,
    error: anyhow::Error,
}

impl Failure {
    pub fn new(class: Exit, error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            class,
            error: error.into(),
        }
    }

    /// The class the table gives it.
    pub fn class(&self) -> Exit {
        self.class
    }

    pub fn error(&self) -> &anyhow::Error {
        &self.error
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Failure {
        Failure::new(Exit::Incomplete, error)
    }
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Failure {
        let class = if error.kind() == std::io::ErrorKind::BrokenPipe {
            Exit::Success
        } else {
            Exit::Incomplete
        };
        Failure::new(class, error)
    }
}

impl From<Exit> for i32 {
    fn from(exit: Exit) -> i32 {
        exit.code().into()
    }
}

impl serde::Serialize for Exit {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(self.code())
    }
}

/// Each program that has a `--help`: the subcommands, and `slurm`'s three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    Gpureap,
    Status,
    Free,
    Wait,
    Run,
    Push,
    Demo,
    Exporter,
    Check,
    Slurm,
    SlurmEpilog,
    SlurmProlog,
    SlurmHealthcheck,
    Reset,
    Plan,
    Dump,
    Reap,
    Top,
}

impl Program {
    pub const ALL: [Program; 18] = [
        Program::Gpureap,
        Program::Status,
        Program::Free,
        Program::Wait,
        Program::Run,
        Program::Push,
        Program::Demo,
        Program::Exporter,
        Program::Check,
        Program::Slurm,
        Program::SlurmEpilog,
        Program::SlurmProlog,
        Program::SlurmHealthcheck,
        Program::Reset,
        Program::Plan,
        Program::Dump,
        Program::Reap,
        Program::Top,
    ];

    /// The words after `gpureap` that name it, e.g. `["slurm", "epilog"]`.
    pub fn words(self) -> &'static [&'static str] {
        match self {
            Program::Gpureap => &[],
            Program::Status => &["status"],
            Program::Free => &["free"],
            Program::Wait => &["wait"],
            Program::Run => &["run"],
            Program::Push => &["push"],
            Program::Demo => &["demo"],
            Program::Exporter => &["exporter"],
            Program::Check => &["check"],
            Program::Slurm => &["slurm"],
            Program::SlurmEpilog => &["slurm", "epilog"],
            Program::SlurmProlog => &["slurm", "prolog"],
            Program::SlurmHealthcheck => &["slurm", "healthcheck"],
            Program::Reset => &["reset"],
            Program::Plan => &["plan"],
            Program::Dump => &["dump"],
            Program::Reap => &["reap"],
            Program::Top => &["top"],
        }
    }
}

const USAGE: &str = "bad usage or input: nothing was signalled or started";
const FLEET_USAGE: &str = "bad usage or input; with -H: every host refused its arguments";
const FLEET_INCOMPLETE: &str =
    "with -H: a host not reached, timed out, or refusing its arguments while others ran";

/// The one exit-code table: what each program returns, code by code. Every
/// `--help` prints its rows ([`help`]), README.md shows the same rows, and a
/// test checks each `--help` against this.
pub fn rows(program: Program) -> Vec<(Exit, &'static str)> {
    use Exit::*;
    match program {
        Program::Gpureap => vec![
            (Success, "done: all freed, ready, clean, healthy"),
            (
                StillHeld,
                "still held, a problem found, or a wait that timed out",
            ),
            (Usage, USAGE),
            (
                Incomplete,
                "could not complete or could not tell: no driver, a GPU lost or not checked, an I/O error",
            ),
            (
                CannotFit,
                "plan: nothing on this host makes the server fit as asked, even on clean GPUs",
            ),
        ],
        Program::Status => vec![
            (
                Success,
                "shown, every GPU in scope read; --prometheus: the metrics written (gpureap_gpu_up says what was read)",
            ),
            (Usage, FLEET_USAGE),
            (
                Unknown,
                "shown, but could not tell: no driver, a GPU in scope the driver lost, or memory that, without the host's PIDs, unseen processes may hold; or (-H) a host failed",
            ),
        ],
        Program::Free => vec![
            (
                Success,
                "every GPU in scope verified free (or --dry-run shown)",
            ),
            (
                StillHeld,
                "something is still held (named), also memory held by no process from before",
            ),
            (Usage, FLEET_USAGE),
            (
                Incomplete,
                "could not complete or tell: the driver failed or lost a GPU in scope; memory left that, without the host's PIDs, unseen processes may hold; or (-H) a host failed",
            ),
        ],
        Program::Wait => vec![
            (Success, "every GPU in scope below --below"),
            (
                StillHeld,
                "timed out (the holders are listed); or at once, unless --keep-waiting: memory held by no process keeps a GPU at or above --below",
            ),
            (Usage, FLEET_USAGE),
            (
                Incomplete,
                "could not wait: no driver, or a GPU in scope lost (at once); or (-H) a host failed",
            ),
        ],
        Program::Run => vec![
            (
                Success,
                "the server ended cleanly (or was stopped) and its GPUs were verified free",
            ),
            (
                StillHeld,
                "the server failed and was not restarted, or its GPUs are not verified free; --plan: others' memory in the way (or --wait-for-fit timed out), nothing started",
            ),
            (USAGE_RUN.0, USAGE_RUN.1),
            (
                Incomplete,
                "could not complete: the driver or a file failed; --dump: no bundle came in time",
            ),
            (
                CannotFit,
                "--plan: the server cannot fit on this hardware, even on clean GPUs; nothing started",
            ),
        ],
        Program::Push => vec![
            (Success, "installed, updated or up to date on every host"),
            (
                StillHeld,
                "refused on a host: a file push did not put there (see --force)",
            ),
            (Usage, FLEET_USAGE),
            (Incomplete, FLEET_INCOMPLETE),
        ],
        Program::Demo => vec![
            (Success, "the incident played out as designed"),
            (StillHeld, "it did not (the output says what differed)"),
            (Usage, USAGE),
            (Incomplete, "the simulated host could not be staged"),
            (
                Signalled(libc::SIGINT),
                "interrupted (Ctrl-C, SIGTERM, SIGHUP): every process it started is gone",
            ),
        ],
        Program::Reap => vec![
            (
                Success,
                "--watch stopped by SIGTERM or Ctrl-C (between scans); once: nothing left to free, or all freed",
            ),
            (
                StillHeld,
                "once: something the policy named is still held, seen by one look only, or spared by name though it holds memory; or a rule was refused (--max-share)",
            ),
            (Usage, USAGE),
            (
                Incomplete,
                "could not listen, or once: the driver or /proc failed, so nothing was signalled",
            ),
        ],
        Program::Exporter => vec![
            (Success, "stopped by SIGTERM or Ctrl-C"),
            (Usage, USAGE),
            (Incomplete, "could not listen or serve"),
        ],
        Program::Check => vec![
            (Success, "healthy (node-problem-detector: OK)"),
            (StillHeld, "a problem found (node-problem-detector: NonOK)"),
            (Usage, "bad usage (node-problem-detector: Unknown)"),
            (
                Unknown,
                "could not tell: the driver is unavailable, or memory no listed process explains is seen without the host's PIDs (node-problem-detector: Unknown)",
            ),
        ],
        Program::Slurm => vec![(
            Usage,
            "bad usage: no program named (epilog, prolog, healthcheck)",
        )],
        Program::SlurmEpilog => vec![
            (Success, "the job's GPUs are clean (or the job had none)"),
            (
                StillHeld,
                "still held or past --timeout: the node is drained with a reason 'gpureap: ...'",
            ),
            (
                Usage,
                "bad usage, or (run by hand) a Slurm variable that cannot be read",
            ),
            (
                Incomplete,
                "could not complete: the driver failed, a job GPU is not on this host, or (under slurmd) a Slurm variable cannot be read: drained, naming it",
            ),
        ],
        Program::SlurmProlog => vec![
            (Success, "the job's GPUs are clean (or the job had none)"),
            (
                StillHeld,
                "not clean or past --timeout: the node is drained with a reason 'gpureap: ...'",
            ),
            (
                Usage,
                "bad usage, or (run by hand) a Slurm variable that cannot be read",
            ),
            (
                Incomplete,
                "could not complete: the driver failed, a job GPU is not on this host, or (under slurmd) a Slurm variable cannot be read: drained, naming it",
            ),
        ],
        Program::SlurmHealthcheck => vec![
            (Success, "clean (a node gpureap drained is resumed)"),
            (
                StillHeld,
                "memory no running job explains, or past --timeout: the node is drained",
            ),
            (Usage, "bad usage, or the node's name cannot be told"),
            (
                Incomplete,
                "could not complete: scontrol or the driver failed",
            ),
        ],
        Program::Reset => vec![
            (
                Success,
                "reset, or nothing to clear; --plan: a reset could run now",
            ),
            (
                StillHeld,
                "refused: a process uses the GPU; or still held after the reset; --plan: something blocks a reset",
            ),
            (Usage, USAGE),
            (
                Incomplete,
                "not reset: the scan could not read every process, or gpureap does not see the host's PIDs; or the driver could not reset or check the GPU; --plan: cannot tell",
            ),
        ],
        Program::Plan => vec![
            (
                Success,
                "fits now: the engine starts as asked (and holds --concurrency N); what others hold costs it at most 1% of the pool",
            ),
            (
                StillHeld,
                "fits only after freeing what others hold, or a reset of memory held by no process (the holders and the commands are shown)",
            ),
            (
                Usage,
                "bad input: unknown engine, no model, model or config not found, unknown architecture, a missing field, a flag the engine refuses, a log whose figures contradict each other",
            ),
            (
                Unknown,
                "could not tell: the engine's GPUs could not be read (no driver, a GPU lost)",
            ),
            (
                CannotFit,
                "nothing on this host makes it fit: even on clean GPUs the engine refuses to start or does not hold --concurrency N, or the host tier cannot be allocated or is refused",
            ),
        ],
        Program::Dump => vec![
            (
                Success,
                "the bundle is written (a process whose stacks could not be read is noted in it)",
            ),
            (
                Usage,
                "bad usage or input: no such process, nothing in scope, an output folder others could tamper with; nothing written",
            ),
            (Incomplete, "could not write the bundle (an I/O error)"),
        ],
        Program::Top => vec![
            (Success, "the view was closed (q, Esc, Ctrl-C)"),
            (
                Usage,
                "bad usage: a bad flag, or no terminal to draw on; nothing signalled",
            ),
            (
                Incomplete,
                "the terminal failed while drawing (an I/O error)",
            ),
        ],
    }
}

const USAGE_RUN: (Exit, &str) = (
    Exit::Usage,
    "bad usage, or the server could not be started (state dir or --log refused, --plan cannot read the command); --dump: no gpureap run supervises with that state directory",
);

/// The "Exit codes:" block a `--help` ends with: the program's rows.
pub fn help(program: Program) -> String {
    let mut text = String::from("Exit codes:");
    for (exit, meaning) in rows(program) {
        text.push_str(&format!("\n  {}  {meaning}", exit.shown()));
    }
    text
}

/// A `--help`'s text after the options: `before` (examples, notes), then
/// the program's exit codes.
pub fn after_help(program: Program, before: &str) -> String {
    if before.is_empty() {
        help(program)
    } else {
        format!("{before}\n\n{}", help(program))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_figures_are_read_from_proc_status() {
        let status = "Name:\tgpureap\nVmPeak:\t   20000 kB\nVmHWM:\t    9300 kB\n\
                      VmRSS:\t    9100 kB\nRssAnon:\t     868 kB\nRssFile:\t    8232 kB\n\
                      RssShmem:\t       0 kB\nThreads:\t1\n";
        assert_eq!(
            memory_figures(status),
            [Some(9300), Some(9100), Some(868), Some(8232), Some(0)]
        );
        // A line missing, malformed, or only starting with a wanted name.
        let odd = "VmHWMx:\t1 kB\nVmHWM:\t12 MB\nVmRSS:\tmany kB\nRssAnon: 7 kB\n";
        assert_eq!(memory_figures(odd), [None, None, Some(7), None, None]);
        // This process's own: every figure present, the peak at least the current.
        let own = memory_figures(&std::fs::read_to_string("/proc/self/status").expect("status"));
        let [Some(hwm), Some(rss), Some(anon), Some(file), Some(_)] = own else {
            panic!("a figure missing: {own:?}");
        };
        assert!(hwm >= rss && rss > 0 && anon + file <= rss, "{own:?}");
    }

    #[test]
    fn codes_are_the_documented_ones() {
        assert_eq!(
            [
                Exit::Success,
                Exit::StillHeld,
                Exit::Usage,
                Exit::Incomplete,
                Exit::Unknown,
                Exit::CannotFit,
            ]
            .map(Exit::code),
            [0, 1, 2, 3, 3, 4]
        );
    }

    #[test]
    fn a_fleet_says_nothing_signalled_only_when_every_host_refused() {
        use Exit::*;
        assert_eq!(Exit::merge_hosts([Usage, Usage]), Usage);
        assert_eq!(Exit::merge_hosts([Success, Success, Usage]), Incomplete);
        assert_eq!(Exit::merge_hosts([StillHeld, Usage]), StillHeld);
        assert_eq!(
            Exit::merge_hosts([StillHeld, Usage, Incomplete]),
            Incomplete
        );
        assert_eq!(Exit::merge_hosts([StillHeld, Success]), StillHeld);
        assert_eq!(Exit::merge_hosts([Incomplete, StillHeld]), Incomplete);
        assert_eq!(Exit::merge_hosts([]), Success);
        assert_eq!(Exit::merge_hosts([Success]), Success);
    }

    #[test]
    fn every_program_has_rows_in_code_order() {
        for program in Program::ALL {
            let codes: Vec<u8> = rows(program).iter().map(|(exit, _)| exit.code()).collect();
            assert!(!codes.is_empty(), "{program:?}");
            assert!(
                codes.windows(2).all(|pair| pair[0] < pair[1]),
                "{program:?}"
            );
        }
    }

    #[test]
    fn an_error_carries_its_class() {
        use std::io::{Error, ErrorKind};
        let pipe = Failure::from(Error::from(ErrorKind::BrokenPipe));
        assert_eq!(pipe.class(), Exit::Success);
        let io = Failure::from(Error::from(ErrorKind::PermissionDenied));
        assert_eq!(io.class(), Exit::Incomplete);
        assert_eq!(
            Failure::from(anyhow::anyhow!("driver")).class(),
            Exit::Incomplete
        );
        assert_eq!(Exit::Signalled(libc::SIGINT).code(), 130);
        assert_eq!(Exit::Signalled(libc::SIGINT).shown(), "128+N");
    }

    #[test]
    fn codes_that_come_back_are_read_through_the_table() {
        assert_eq!(Remote::read(Some(255)), Remote::Ssh);
        assert_eq!(Remote::read(Some(127)), Remote::NotFound);
        assert_eq!(Remote::read(Some(126)), Remote::CannotRun);
        assert_eq!(Remote::read(None), Remote::Killed);
        assert_eq!(Remote::read(Some(1)), Remote::Ended(Exit::StillHeld));
        assert_eq!(Remote::read(Some(2)), Remote::Ended(Exit::Usage));
        assert_eq!(Remote::read(Some(4)), Remote::Ended(Exit::CannotFit));
        assert_eq!(Remote::read(Some(42)), Remote::Ended(Exit::Incomplete));
        assert!(Exit::succeeded(Some(0)));
        assert!(!Exit::succeeded(Some(3)) && !Exit::succeeded(None));
    }
}
