//! Where each process of a tree is waiting: its threads' stacks, read
//! without stopping or signalling it, for the bundle a hang writes (`run`)
//! and `gpureap dump`.
//!
//! With py-spy on PATH, each process's Python and native stacks come from
//! `py-spy dump --native --pid P`, run as a bounded `child` (a time limit per
//! process and for the whole capture, its output kept to a bound). Each
//! thread's kernel stack is read as well (`/proc/PID/task/TID/stack`, root
//! only), else its `wchan`. Without py-spy the kernel's view is all there is,
//! with a one-line note saying how to get the rest. py-spy's output is
//! anyone's text (it prints the target's function and file names): it is
//! kept to a bound, parsed line by line, and what does not parse is left out
//! and said; nothing it prints is trusted to be well formed.
//!
//! For each process, the frame most of its threads wait in is named: the
//! innermost frame that is not the C library, the loader or the Python
//! interpreter itself (those say how a thread waits, not where), so that
//! `read (libc.so.6) ← os_read (libpython3.11.so) ← wait_in_barrier (x.py:4)`
//! names `wait_in_barrier`. `Capture::summary` groups the processes by that
//! frame: `sglang::scheduler_TP[0-7] in ncclCommInitRank; sglang::detokenizer
//! in recv`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::child::{self, Input, Ran};
use crate::file::executable;
use crate::proc::State;
use crate::units::one_line;

/// How long py-spy may take for one process: native frames need the
/// symbols of every library mapped, and PyTorch's and NCCL's are large.
pub const PER_PROCESS: Duration = Duration::from_secs(20);
/// How long the whole capture may take, however many processes.
pub const TOTAL: Duration = Duration::from_secs(60);
/// py-spy runs at most this many at a time.
const PARALLEL: usize = 4;
/// What is kept of py-spy's output per process.
const MAX_OUTPUT: u64 = 1 << 20;
const MAX_ERRORS: u64 = 16 << 10;
/// At most this many processes are read; a tree larger than a server's is
/// cut, and said.
const MAX_PROCESSES: usize = 256;
/// Bounds on what one process contributes, whatever it has.
const MAX_THREADS: usize = 512;
const MAX_FRAMES: usize = 128;
const MAX_FRAME_CHARS: usize = 300;
/// The hint a missing py-spy is noted with.
pub(crate) const INSTALL_HINT: &str = "pip install py-spy";

/// One thread's stacks, innermost frame first.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadStack {
    pub tid: u32,
    /// The thread's name as py-spy gave it.
    pub name: Option<String>,
    /// py-spy's word for it: idle, active, active+gil.
    pub activity: Option<String>,
    /// Python and native frames from py-spy, innermost first.
    pub frames: Vec<String>,
    /// Kernel frames from `/proc/PID/task/TID/stack`, innermost first.
    pub kernel: Vec<String>,
    /// The kernel's wait channel, where its stack cannot be read.
    pub wchan: Option<String>,
    /// The frame this thread waits in (see the module's doc).
    pub waits_in: Option<String>,
}

/// One process's stacks.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessStacks {
    pub pid: u32,
    /// A short name: the program (or the script Python runs), or the title
    /// the process gave itself (`sglang::scheduler_TP0`).
    pub label: String,
    /// "py-spy" when py-spy read it, else "kernel" (stacks or wchan only).
    pub source: &'static str,
    /// The frame most of its threads wait in.
    pub waits_in: Option<String>,
    pub threads: Vec<ThreadStack>,
    /// What went wrong reading it (py-spy's own words, escaped), if
    /// anything; for a zombie, that it is one (`zombie`).
    pub note: Option<String>,
    /// It is a zombie: exited, its stacks gone, its parent not reaping it.
    /// Said by `note`, and in the summary in place of a frame.
    #[serde(skip)]
    pub zombie: bool,
}

/// The stacks of a set of processes.
#[derive(Debug, Clone, Serialize)]
pub struct Capture {
    /// The py-spy used, if one was found on PATH.
    pub py_spy: Option<PathBuf>,
    /// Said once for the capture: a missing py-spy and how to install it,
    /// a total time that ran out.
    pub notes: Vec<String>,
    /// The processes grouped by where they wait.
    pub summary: String,
    pub seconds: f64,
    pub processes: Vec<ProcessStacks>,
}

/// The limits of one capture.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub per_process: Duration,
    pub total: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            per_process: PER_PROCESS,
            total: TOTAL,
        }
    }
}

/// py-spy on PATH, if there is one.
pub fn find_py_spy() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("py-spy"))
        .find(|candidate| executable(candidate))
}

/// Captures the stacks of `pids`, within `limits`. Never signals them;
/// py-spy attaches to each for the moment of a dump.
pub fn capture(pids: &[u32], limits: Limits) -> Capture {
    let started = Instant::now();
    let deadline = started + limits.total;
    let py_spy = find_py_spy();
    let mut notes = Vec::new();
    if py_spy.is_none() {
        notes.push(format!(
            "py-spy is not installed (not on PATH): kernel stacks only; for Python and native stacks: {INSTALL_HINT}"
        ));
    }
    let (pids, cut) = at_most(pids, MAX_PROCESSES);
    notes.extend(cut);
    let mut processes = Vec::with_capacity(pids.len());
    for chunk in pids.chunks(PARALLEL) {
        let read: Vec<ProcessStacks> = std::thread::scope(|scope| {
            let py_spy = py_spy.as_deref();
            let read = move |pid| of_process(pid, py_spy, limits.per_process, deadline);
            // No thread to start (RLIMIT_NPROC, memory): read it here instead.
            let handles: Vec<_> = chunk
                .iter()
                .map(|&pid| {
                    std::thread::Builder::new()
                        .name("stacks".to_string())
                        .spawn_scoped(scope, move || read(pid))
                        .map_err(|_| pid)
                })
                .collect();
            handles
                .into_iter()
                .zip(chunk)
                .map(|(handle, &pid)| match handle {
                    Ok(handle) => handle.join().unwrap_or_else(|_| ProcessStacks {
                        pid,
                        label: label(pid),
                        source: "kernel",
                        waits_in: None,
                        threads: Vec::new(),
                        note: Some("reading its stacks failed".to_string()),
                        zombie: false,
                    }),
                    Err(pid) => read(pid),
                })
                .collect()
        });
        processes.extend(read);
    }
    if py_spy.is_some() && Instant::now() >= deadline {
        notes.push(format!(
            "the capture's {}s ran out: processes after that have kernel stacks only",
            limits.total.as_secs()
        ));
    }
    let summary = summary(&processes);
    Capture {
        py_spy,
        notes,
        summary,
        seconds: started.elapsed().as_secs_f64(),
        processes,
    }
}

/// The first `most` of `pids`, and a note when there were more.
fn at_most(pids: &[u32], most: usize) -> (&[u32], Option<String>) {
    let cut = (pids.len() > most).then(|| {
        format!(
            "{} processes: only the first {most} by PID are read",
            pids.len()
        )
    });
    (&pids[..pids.len().min(most)], cut)
}

/// One process: py-spy's stacks where it can give them, the kernel's for
/// every thread.
fn of_process(
    pid: u32,
    py_spy: Option<&Path>,
    per_process: Duration,
    deadline: Instant,
) -> ProcessStacks {
    if let Some(zombie) = zombie(pid) {
        return ProcessStacks {
            pid,
            label: label(pid),
            source: "kernel",
            waits_in: None,
            threads: Vec::new(),
            note: Some(zombie),
            zombie: true,
        };
    }
    let mut note = None;
    let mut threads = Vec::new();
    let mut source = "kernel";
    if let Some(py_spy) = py_spy {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            note = Some("not read with py-spy: the capture's time ran out".to_string());
        } else {
            match run_py_spy(py_spy, pid, per_process.min(left)) {
                Ok(parsed) => {
                    threads = parsed;
                    source = "py-spy";
                }
                Err(why) => note = Some(why),
            }
        }
    }
    add_kernel_stacks(pid, &mut threads);
    for thread in &mut threads {
        thread.waits_in = waits_in(thread);
    }
    ProcessStacks {
        pid,
        label: label(pid),
        source,
        waits_in: most_common(&threads, pid),
        threads,
        note,
        zombie: false,
    }
}

/// What a zombie is, said where its stacks would be: it has exited, so
/// there are none (py-spy is not run on it), and which parent has not
/// reaped it, the process to look at. `None` for any other process.
fn zombie(pid: u32) -> Option<String> {
    let glance = crate::proc::glance(pid).filter(|glance| glance.state == State::Zombie)?;
    let parent = match crate::proc::glance(glance.ppid) {
        Some(parent) => format!("{} ({})", glance.ppid, one_line(&parent.comm)),
        None => glance.ppid.to_string(),
    };
    Some(format!(
        "a zombie (state Z): it has exited, and its parent {parent} has not reaped it"
    ))
}

/// Runs py-spy on one process; its threads, or why there are none.
fn run_py_spy(py_spy: &Path, pid: u32, limit: Duration) -> Result<Vec<ThreadStack>, String> {
    let pid_text = pid.to_string();
    let argv = [
        py_spy.as_os_str(),
        "dump".as_ref(),
        "--native".as_ref(),
        "--pid".as_ref(),
        pid_text.as_ref(),
    ];
    match child::run(&argv, Input::Null, MAX_OUTPUT, MAX_ERRORS, limit, None) {
        Err(error) => Err(format!("py-spy: {}", one_line(&error.to_string()))),
        Ok(Ran::TimedOut) => Err(format!(
            "py-spy did not answer within {:.1}s; it was stopped",
            limit.as_secs_f64()
        )),
        Ok(Ran::Interrupted(_)) => Err("py-spy was interrupted".to_string()),
        Ok(Ran::Exited {
            status,
            stdout,
            stderr,
            truncated,
        }) => {
            let text = String::from_utf8_lossy(&stdout);
            let threads = parse_py_spy(&text);
            if status.success() && !threads.is_empty() {
                return Ok(threads);
            }
            let said = String::from_utf8_lossy(&stderr);
            let first = said
                .lines()
                .chain(text.lines())
                .map(str::trim)
                .find(|line| !line.is_empty())
                .unwrap_or("");
            let cut = if truncated { " (output cut)" } else { "" };
            Err(format!(
                "py-spy gave no stacks ({}){cut}: {}",
                match status.code() {
                    Some(code) => format!("exit code {code}"),
                    None => "killed by a signal".to_string(),
                },
                short(first)
            ))
        }
    }
}

/// Anyone's text, one line, cut.
fn short(text: &str) -> String {
    crate::units::short(text, MAX_FRAME_CHARS)
}

/// py-spy's `dump` text: a `Thread TID (activity): "name"` line per thread,
/// then its frames, innermost first, each indented by four spaces
/// (`wait_in_barrier (blk.py:4)`, `read (libc.so.6)`). Anything else is
/// skipped; what is kept is bounded and one line each.
pub(crate) fn parse_py_spy(text: &str) -> Vec<ThreadStack> {
    let mut threads: Vec<ThreadStack> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Thread ") {
            if threads.len() == MAX_THREADS {
                break;
            }
            if let Some(thread) = thread_header(rest) {
                threads.push(thread);
            }
        } else if let Some(frame) = line.strip_prefix("    ")
            && let Some(thread) = threads.last_mut()
            && thread.frames.len() < MAX_FRAMES
        {
            let frame = frame.trim();
            if !frame.is_empty() {
                thread.frames.push(short(frame));
            }
        }
    }
    threads
}

/// `12912 (idle): "MainThread"`, or a hexadecimal id where py-spy knows no
/// native thread id (then 0).
fn thread_header(rest: &str) -> Option<ThreadStack> {
    let (id, rest) = rest.split_once(' ').unwrap_or((rest, ""));
    let tid = match id.strip_prefix("0x").or_else(|| id.strip_prefix("0X")) {
        Some(_) => 0,
        None => id.parse().ok()?,
    };
    let activity = rest
        .strip_prefix('(')
        .and_then(|rest| rest.split_once(')'))
        .map(|(activity, _)| short(activity));
    let name = rest
        .split_once(": \"")
        .map(|(_, name)| short(name.strip_suffix('"').unwrap_or(name)));
    Some(ThreadStack {
        tid,
        name,
        activity,
        frames: Vec::new(),
        kernel: Vec::new(),
        wchan: None,
        waits_in: None,
    })
}

/// Each thread's kernel stack (or wchan), added to py-spy's threads by id;
/// threads py-spy did not list (native ones, or all without py-spy) get
/// an entry of their own.
fn add_kernel_stacks(pid: u32, threads: &mut Vec<ThreadStack>) {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    let mut tids: Vec<u32> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    for tid in tids {
        let kernel = kernel_stack(pid, tid);
        let wchan = kernel.is_empty().then(|| thread_wchan(pid, tid)).flatten();
        match threads.iter().position(|thread| thread.tid == tid) {
            Some(at) => {
                threads[at].kernel = kernel;
                threads[at].wchan = wchan;
            }
            None if threads.len() < MAX_THREADS => threads.push(ThreadStack {
                tid,
                name: None,
                activity: None,
                frames: Vec::new(),
                kernel,
                wchan,
                waits_in: None,
            }),
            None => {}
        }
    }
}

/// `[<0>] anon_pipe_read+0x393/0x440` lines, as symbols; empty where the
/// file cannot be read (not root, or a kernel without it).
fn kernel_stack(pid: u32, tid: u32) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stack")) else {
        return Vec::new();
    };
    parse_kernel_stack(&text)
}

pub(crate) fn parse_kernel_stack(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let symbol = line.split_once("] ").map_or(line, |(_, symbol)| symbol);
            let symbol = symbol.split('+').next().unwrap_or(symbol).trim();
            (!symbol.is_empty()).then(|| short(symbol))
        })
        .take(MAX_FRAMES)
        .collect()
}

fn thread_wchan(pid: u32, tid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/wchan")).ok()?;
    let text = text.trim();
    (!text.is_empty() && text != "0").then(|| short(text))
}

/// Where a frame says how a thread waits rather than where: the C and C++
/// libraries (a condition variable's wait, inlined `std::` code), the
/// loader, the vDSO, the Python interpreter and pybind11's glue, or an
/// address with no name (libcuda's frames have none).
fn is_plumbing(frame: &str) -> bool {
    let (name, place) = match frame.rsplit_once(" (") {
        Some((name, place)) => (name, place.trim_end_matches(')')),
        None => (frame, ""),
    };
    let library = place.rsplit('/').next().unwrap_or(place);
    ["0x", "_Py", "std::", "__gnu_cxx::", "pybind11::"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || [
            "libc.so",
            "libc-",
            "libpthread",
            "ld-linux",
            "linux-vdso",
            "libpython",
            "python",
            "libstdc++",
            "libgcc_s",
        ]
        .iter()
        .any(|prefix| library.starts_with(prefix))
}

/// The frame a thread waits in: its innermost frame outside the plumbing
/// (else its innermost frame), else its innermost kernel frame, else its
/// wait channel.
fn waits_in(thread: &ThreadStack) -> Option<String> {
    let frame = thread
        .frames
        .iter()
        .find(|frame| !is_plumbing(frame))
        .or_else(|| thread.frames.first());
    match frame {
        Some(frame) => Some(function(frame).to_string()),
        None => thread.kernel.first().or(thread.wchan.as_ref()).cloned(),
    }
}

/// A frame's function: `wait_in_barrier (blk.py:4)` is `wait_in_barrier`.
fn function(frame: &str) -> &str {
    frame.rsplit_once(" (").map_or(frame, |(name, _)| name)
}

/// The frame most threads wait in; a tie goes to the main thread's. Where
/// py-spy read the process, only the threads it listed count: a CUDA or
/// NCCL process has native helper threads parked in the kernel whatever its
/// Python threads do, and they would outvote them.
fn most_common(threads: &[ThreadStack], pid: u32) -> Option<String> {
    let listed = threads.iter().any(|thread| !thread.frames.is_empty());
    let counted: Vec<&ThreadStack> = threads
        .iter()
        .filter(|thread| !listed || !thread.frames.is_empty())
        .collect();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for frame in counted
        .iter()
        .filter_map(|thread| thread.waits_in.as_deref())
    {
        *counts.entry(frame).or_default() += 1;
    }
    let best = counts.values().copied().max()?;
    let main = counted
        .iter()
        .find(|thread| thread.tid == pid)
        .and_then(|thread| thread.waits_in.as_deref());
    match main {
        Some(main) if counts.get(main) == Some(&best) => Some(main.to_string()),
        _ => counted
            .iter()
            .filter_map(|thread| thread.waits_in.as_deref())
            .find(|frame| counts[frame] == best)
            .map(str::to_string),
    }
}

/// A short name for a process: the title it gave itself, or its program,
/// or, for Python, the script or module it runs.
pub fn label(pid: u32) -> String {
    let words = crate::proc::arguments(pid);
    label_of(&words).unwrap_or_else(|| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|comm| crate::units::short(comm.trim(), 40))
            .unwrap_or_else(|_| format!("pid {pid}"))
    })
}

fn label_of(words: &[String]) -> Option<String> {
    let first = words.first()?;
    // A title set with setproctitle or `exec -a` is one word with spaces in it.
    let first = first.split(' ').next().unwrap_or(first);
    let program = first.rsplit('/').next().unwrap_or(first);
    let mut label = program.to_string();
    if program.starts_with("python") {
        let mut rest = words[1..].iter();
        while let Some(word) = rest.next() {
            if word == "-m" {
                if let Some(module) = rest.next() {
                    label = format!("{program} -m {module}");
                }
                break;
            }
            if !word.starts_with('-') {
                label = word.rsplit('/').next().unwrap_or(word).to_string();
                break;
            }
        }
    }
    Some(crate::units::short(&label, 40))
}

/// The processes grouped by the frame they wait in, in order of first PID:
/// `sglang::scheduler_TP[0-1] in block_forever; python3 in do_sys_poll`.
pub fn summary(processes: &[ProcessStacks]) -> String {
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    for process in processes {
        // A zombie's note says what it is, where a frame would be.
        let frame = match (&process.waits_in, &process.note) {
            (_, Some(note)) if process.zombie => format!(": {}", one_line(note)),
            (Some(frame), _) => format!(" in {}", one_line(frame)),
            (None, _) => " in no stack read".to_string(),
        };
        match groups.iter_mut().find(|(seen, _)| *seen == frame) {
            Some((_, labels)) => labels.push(&process.label),
            None => groups.push((frame, vec![&process.label])),
        }
    }
    groups
        .iter()
        .map(|(frame, labels)| {
            let mut unique: Vec<&str> = Vec::new();
            for label in labels {
                if !unique.contains(label) {
                    unique.push(label);
                }
            }
            let repeated = if unique.len() < labels.len() {
                format!(" ({} processes)", labels.len())
            } else {
                String::new()
            };
            format!("{}{repeated}{frame}", crate::hostlist::compress(&unique))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The capture as text for a person: per process, where it waits, then
/// each thread's frames (anyone's text, each on its line, escaped).
pub fn text(capture: &Capture) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "stacks: {}", one_line(&capture.summary));
    for note in &capture.notes {
        let _ = writeln!(out, "note: {}", one_line(note));
    }
    let _ = writeln!(
        out,
        "read in {:.1}s{}",
        capture.seconds,
        capture
            .py_spy
            .as_ref()
            .map(|path| format!(" with {}", one_line(&path.display().to_string())))
            .unwrap_or_default()
    );
    for process in &capture.processes {
        if process.zombie {
            let _ = writeln!(
                out,
                "\nPID {} {}: {}",
                process.pid,
                one_line(&process.label),
                one_line(process.note.as_deref().unwrap_or("a zombie"))
            );
            continue;
        }
        let _ = writeln!(
            out,
            "\nPID {} {} ({}): waits in {}",
            process.pid,
            one_line(&process.label),
            process.source,
            one_line(process.waits_in.as_deref().unwrap_or("?"))
        );
        if let Some(note) = &process.note {
            let _ = writeln!(out, "  note: {}", one_line(note));
        }
        for thread in &process.threads {
            let _ = writeln!(
                out,
                "  thread {}{}{}",
                thread.tid,
                thread
                    .name
                    .as_ref()
                    .map(|name| format!(" \"{}\"", one_line(name)))
                    .unwrap_or_default(),
                thread
                    .activity
                    .as_ref()
                    .map(|activity| format!(" ({})", one_line(activity)))
                    .unwrap_or_default()
            );
            for frame in &thread.frames {
                let _ = writeln!(out, "    {}", one_line(frame));
            }
            for frame in &thread.kernel {
                let _ = writeln!(out, "    [kernel] {}", one_line(frame));
            }
            if let Some(wchan) = &thread.wchan {
                let _ = writeln!(out, "    [wchan] {}", one_line(wchan));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "Process 12912: /usr/bin/python3 /tmp/blk.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 12912 (idle): \"MainThread\"
    read (libc.so.6)
    os_read (libpython3.11.so.1.0)
    wait_in_barrier (blk.py:4)
    <module> (blk.py:6)
    0x7f7e4dbe824a (libc.so.6)
Thread 0x7F00AA (active+gil): \"loader\"
    _PyEval_EvalFrameDefault (python3.11)
    load (weights.py:10)
";

    #[test]
    fn py_spy_dump_parses_into_threads_and_names_the_waiting_frame() {
        let mut threads = parse_py_spy(DUMP);
        assert_eq!(threads.len(), 2);
        assert_eq!(threads[0].tid, 12912);
        assert_eq!(threads[0].name.as_deref(), Some("MainThread"));
        assert_eq!(threads[0].activity.as_deref(), Some("idle"));
        assert_eq!(threads[0].frames.len(), 5);
        assert_eq!(threads[1].tid, 0);
        for thread in &mut threads {
            thread.waits_in = waits_in(thread);
        }
        assert_eq!(threads[0].waits_in.as_deref(), Some("wait_in_barrier"));
        assert_eq!(threads[1].waits_in.as_deref(), Some("load"));
        // One each: the main thread's wins the tie.
        assert_eq!(
            most_common(&threads, 12912).as_deref(),
            Some("wait_in_barrier")
        );
        // Native helper threads in the kernel do not outvote the Python ones.
        for tid in 20..25 {
            threads.push(ThreadStack {
                tid,
                name: None,
                activity: None,
                frames: Vec::new(),
                kernel: vec!["futex_wait_queue".to_string()],
                wchan: None,
                waits_in: Some("futex_wait_queue".to_string()),
            });
        }
        assert_eq!(
            most_common(&threads, 12912).as_deref(),
            Some("wait_in_barrier")
        );
        // Without py-spy's threads, the kernel's count.
        assert_eq!(
            most_common(&threads[2..], 12912).as_deref(),
            Some("futex_wait_queue")
        );
    }

    #[test]
    fn garbage_gives_no_threads_and_hostile_text_stays_on_one_line() {
        assert!(parse_py_spy("\u{1b}[2Jnot py-spy\n\0\0\0\n    orphan frame\n").is_empty());
        let threads =
            parse_py_spy("Thread 7 (idle): \"x\u{1b}]0;pwned\u{7}\"\n    evil\rfn (a.py:1)\n");
        assert_eq!(threads.len(), 1);
        assert!(!threads[0].name.as_deref().unwrap_or("").contains('\u{1b}'));
        assert!(threads[0].frames.iter().all(|frame| !frame.contains('\r')));
        let long = format!("Thread 1 (idle): \"m\"\n    {}\n", "f".repeat(100_000));
        assert!(parse_py_spy(&long)[0].frames[0].chars().count() <= MAX_FRAME_CHARS);
    }

    #[test]
    fn a_native_wait_is_named_by_the_library_that_waits_not_by_the_plumbing() {
        let dump = "Thread 7 (idle): \"MainThread\"
    __futex_abstimed_wait_common (libc.so.6)
    pthread_cond_wait (libc.so.6)
    std::condition_variable::wait (libstdc++.so.6)
    std::__detail::__wait_impl (libtorch_cuda.so)
    0x7f0012345678 (libcuda.so.1)
    ncclCommInitRankConfig (libnccl.so.2)
    pybind11::cpp_function::dispatcher (libtorch_python.so)
    all_reduce (torch/distributed/distributed_c10d.py:2501)
";
        let threads = parse_py_spy(dump);
        assert_eq!(
            waits_in(&threads[0]).as_deref(),
            Some("ncclCommInitRankConfig")
        );
    }

    #[test]
    fn a_tree_larger_than_a_server_is_cut_and_said() {
        let pids: Vec<u32> = (1..=300).collect();
        let (read, note) = at_most(&pids, MAX_PROCESSES);
        assert_eq!(read.len(), 256);
        assert_eq!(
            note.as_deref(),
            Some("300 processes: only the first 256 by PID are read")
        );
        assert_eq!(at_most(&pids[..3], MAX_PROCESSES), (&pids[..3], None));
    }

    #[test]
    fn kernel_stacks_are_symbols_without_offsets() {
        let text = "[<0>] anon_pipe_read+0x393/0x440\n[<0>] vfs_read+0x397/0x3d0\n";
        assert_eq!(parse_kernel_stack(text), ["anon_pipe_read", "vfs_read"]);
    }

    #[test]
    fn labels_name_titles_scripts_and_modules() {
        let words = |text: &str| text.split(' ').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            label_of(&["sglang::scheduler_TP3".to_string()]).as_deref(),
            Some("sglang::scheduler_TP3")
        );
        assert_eq!(
            label_of(&words("/usr/bin/python3 -u /srv/serve.py --port 1")).as_deref(),
            Some("serve.py")
        );
        assert_eq!(
            label_of(&words("python3 -m sglang.launch_server --tp 8")).as_deref(),
            Some("python3 -m sglang.launch_server")
        );
    }

    #[test]
    fn the_summary_groups_processes_by_frame() {
        let process = |pid, label: &str, frame: &str| ProcessStacks {
            pid,
            label: label.to_string(),
            source: "py-spy",
            waits_in: Some(frame.to_string()),
            threads: Vec::new(),
            note: None,
            zombie: false,
        };
        let processes = [
            process(10, "sglang::scheduler_TP0", "ncclCommInitRank"),
            process(11, "sglang::detokenizer", "recv"),
            process(12, "sglang::scheduler_TP1", "ncclCommInitRank"),
            process(13, "python3", "poll"),
            process(14, "python3", "poll"),
        ];
        assert_eq!(
            summary(&processes),
            "sglang::scheduler_TP[0-1] in ncclCommInitRank; sglang::detokenizer in recv; python3 (2 processes) in poll"
        );
    }
}
