//! Reading `/proc`: every process's identity, its place in the tree, and which
//! GPU device nodes its descriptors point at.
//!
//! This is the half of the picture the driver cannot give: parents, sessions,
//! states, and processes that opened a node without a GPU context. A process
//! whose descriptors we may not read is recorded as such, never skipped quietly.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;

/// What a path found in `/proc/PID/fd` is, as far as the GPU is concerned.
/// The driver backend classifies paths (`driver::Driver::classify_node`);
/// the scan only records the answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Node {
    /// The device node of one GPU, by driver index.
    Gpu(u32),
    /// A control node (`nvidiactl`, `nvidia-uvm`, ...), held by every GPU user
    /// and by monitors.
    Control,
}

/// A process's state: the third field of `/proc/PID/stat` (proc(5)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// R
    Running,
    /// S: waiting, interruptibly.
    Sleeping,
    /// D: in uninterruptible sleep; a SIGKILL lands when the call returns.
    Uninterruptible,
    /// Z: exited, not yet reaped by its parent.
    Zombie,
    /// T: stopped by a signal (SIGSTOP).
    Stopped,
    /// t: stopped by a tracer.
    Traced,
    /// X: dead, being removed.
    Dead,
    /// I: an idle kernel thread.
    Idle,
    /// Any other letter a kernel may print.
    Other(char),
}

impl State {
    pub fn from_letter(letter: char) -> State {
        match letter {
            'R' => State::Running,
            'S' => State::Sleeping,
            'D' => State::Uninterruptible,
            'Z' => State::Zombie,
            'T' => State::Stopped,
            't' => State::Traced,
            'X' => State::Dead,
            'I' => State::Idle,
            other => State::Other(other),
        }
    }

    pub fn letter(self) -> char {
        match self {
            State::Running => 'R',
            State::Sleeping => 'S',
            State::Uninterruptible => 'D',
            State::Zombie => 'Z',
            State::Stopped => 'T',
            State::Traced => 't',
            State::Dead => 'X',
            State::Idle => 'I',
            State::Other(letter) => letter,
        }
    }

    /// Exited (a zombie, or dead): it has closed its descriptors and holds
    /// no GPU memory, whatever a stale list says.
    pub fn has_exited(self) -> bool {
        matches!(self, State::Zombie | State::Dead)
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.letter())
    }
}

impl serde::Serialize for State {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Linux's PF_KTHREAD flag in /proc/PID/stat.
const PF_KTHREAD: u32 = 0x0020_0000;

/// A process identity that survives PID reuse: the PID plus its start time in
/// clock ticks since boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessId {
    pub pid: u32,
    pub start_time: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRecord {
    pub id: ProcessId,
    pub ppid: u32,
    pub pgid: u32,
    pub sid: u32,
    pub uid: Option<u32>,
    pub state: State,
    pub comm: String,
    /// The command line joined by spaces; empty for kernel threads and zombies.
    pub cmdline: String,
    pub kernel_thread: bool,
    /// CPU time used so far, in clock ticks.
    pub cpu_ticks: u64,
    pub nodes: BTreeSet<Node>,
    /// False when the descriptors could not be read (permission denied).
    pub fds_readable: bool,
}

impl ProcessRecord {
    /// The unit tests' process: root's, asleep, a child of init leading its
    /// own group and session, started at tick 1, run as `comm` with no
    /// arguments, no node open and its descriptors readable; a test changes
    /// what it is about with `..ProcessRecord::sleeping(pid, comm)`.
    #[cfg(test)]
    pub(crate) fn sleeping(pid: u32, comm: &str) -> ProcessRecord {
        ProcessRecord {
            id: ProcessId { pid, start_time: 1 },
            ppid: 1,
            pgid: pid,
            sid: pid,
            uid: Some(0),
            state: State::Sleeping,
            comm: comm.to_string(),
            cmdline: comm.to_string(),
            kernel_thread: false,
            cpu_ticks: 0,
            nodes: BTreeSet::new(),
            fds_readable: true,
        }
    }

    /// The basename of argv[0], or comm when the command line is empty.
    pub fn program(&self) -> &str {
        let argv0 = self.cmdline.split(' ').next().unwrap_or("");
        match argv0.rsplit('/').next() {
            Some(name) if !name.is_empty() => name,
            _ => &self.comm,
        }
    }
}

/// A process whose descriptors could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    pub pid: u32,
    pub comm: String,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct ProcScan {
    pub processes: Vec<ProcessRecord>,
    pub unreadable: Vec<Unreadable>,
}

impl ProcScan {
    /// Reads process `pid` into the scan: its record, and why its
    /// descriptors could not be read where they could not. A PID that names
    /// no process adds nothing.
    fn read(
        &mut self,
        base: std::os::fd::BorrowedFd,
        pid: u32,
        classify: Option<Classify>,
        buffers: &mut Buffers,
    ) {
        if let Some((record, fd_error)) = read_process(base, pid, classify, buffers) {
            if let Some(reason) = fd_error {
                self.unreadable.push(Unreadable {
                    pid,
                    comm: record.comm.clone(),
                    reason,
                });
            }
            self.processes.push(record);
        }
    }
}

/// What a scan asks of each descriptor: which GPU node it is, if any.
pub(crate) type Classify<'a> = &'a (dyn Fn(&Path) -> Option<Node> + Sync);

/// Scans every process in this PID namespace: identity, tree, state and GPU
/// nodes, nothing more (command lines and uids are read later, for the few
/// processes that matter). Processes that exit during the scan are dropped;
/// those we may not inspect are listed in `unreadable`. The work is split
/// over the machine's cores: it is almost all system calls.
pub fn scan(classify: Classify) -> io::Result<ProcScan> {
    scan_with(PROC, Some(classify))
}

/// As `scan`, of the proc filesystem mounted at `root` rather than /proc:
/// another PID namespace's view (the simulated driver's, standing for a
/// driver that sees the host's PIDs while gpureap runs in a container).
pub(crate) fn scan_at(root: &Path, classify: Classify) -> io::Result<ProcScan> {
    let root = root
        .to_str()
        .ok_or_else(|| io::Error::other("a proc mount path that is not UTF-8"))?;
    scan_with(root, Some(classify))
}

/// The GPU nodes one process has open, read as a scan reads them; `None`
/// when it has gone (or its PID now names another process), or exited.
pub(crate) fn nodes_of(id: ProcessId, classify: Classify) -> Option<BTreeSet<Node>> {
    let base = open_proc().ok()?;
    let found = read_process(
        base.as_fd(),
        id.pid,
        Some(classify),
        &mut Buffers::default(),
    );
    let (record, _) = found?;
    (record.id == id && !record.state.has_exited()).then_some(record.nodes)
}

/// The processes `pids` of the proc mount at `root` (`None`: /proc), each
/// read as a scan reads it (identity, tree, state, GPU nodes), at a cost
/// that grows with `pids` alone, not with the host's processes: the
/// simulated driver's lists, found through its claims as NVML finds its
/// contexts. A PID that names no process is left out; one whose
/// descriptors may not be read is listed in `unreadable`.
pub(crate) fn scan_pids(
    root: Option<&Path>,
    pids: &BTreeSet<u32>,
    classify: Classify,
) -> io::Result<ProcScan> {
    let base = match root {
        Some(root) => open_directory(
            root.to_str()
                .ok_or_else(|| io::Error::other("a proc mount path that is not UTF-8"))?,
        )?,
        None => open_proc()?,
    };
    let mut buffers = Buffers::default();
    let mut scan = ProcScan::default();
    for &pid in pids {
        scan.read(base.as_fd(), pid, Some(classify), &mut buffers);
    }
    Ok(scan)
}

/// Reads the GPU nodes of the processes `pids` of a scan made without
/// descriptors (`scan_tree`), as a full scan would have read them: one that
/// has gone meanwhile, or whose PID now names another process, is dropped;
/// one whose descriptors may not be read is listed in `unreadable`.
pub(crate) fn read_nodes_of(scan: &mut ProcScan, pids: &BTreeSet<u32>, classify: Classify) {
    let Ok(base) = open_proc() else {
        // No /proc to read: none of them can be told to be there still.
        scan.processes
            .retain(|record| !pids.contains(&record.id.pid));
        return;
    };
    let mut buffers = Buffers::default();
    let mut unreadable = Vec::new();
    scan.processes.retain_mut(|record| {
        if !pids.contains(&record.id.pid) {
            return true;
        }
        match read_process(base.as_fd(), record.id.pid, Some(classify), &mut buffers) {
            Some((fresh, fd_error)) if fresh.id == record.id => {
                if let Some(reason) = fd_error {
                    unreadable.push(Unreadable {
                        pid: record.id.pid,
                        comm: record.comm.clone(),
                        reason,
                    });
                }
                record.state = fresh.state;
                record.nodes = fresh.nodes;
                record.fds_readable = fresh.fds_readable;
                true
            }
            _ => false,
        }
    });
    scan.unreadable.extend(unreadable);
}

thread_local! {
    /// The scan a snapshot is being built from, while the driver is asked
    /// about the same moment (see `during`).
    static CURRENT: std::cell::RefCell<Option<ProcScan>> = const { std::cell::RefCell::new(None) };
}

/// Takes the current scan out of this thread when dropped, also on a panic:
/// a scan must never outlive the snapshot it was made for.
struct Current;

impl Drop for Current {
    fn drop(&mut self) {
        CURRENT.with(|current| current.borrow_mut().take());
    }
}

/// Runs `f` with `scan` as this thread's current scan: `with_scan` inside
/// it answers from `scan` instead of reading /proc again. A snapshot is one
/// moment, so everything it is built from comes from one pass, whoever reads
/// /proc for it (the simulated driver's process lists come from /proc too).
/// Returns the scan, and what `f` returned.
pub fn during<T>(scan: ProcScan, f: impl FnOnce() -> T) -> (ProcScan, T) {
    CURRENT.with(|current| *current.borrow_mut() = Some(scan));
    let guard = Current;
    let value = f();
    let scan = CURRENT
        .with(|current| current.borrow_mut().take())
        .unwrap_or_default();
    drop(guard);
    (scan, value)
}

/// Calls `f` on this thread's current scan (see `during`), or on a fresh
/// scan classified by `classify` when there is none.
#[cfg(test)]
fn with_scan<T>(classify: Classify, f: impl FnOnce(&ProcScan) -> T) -> io::Result<T> {
    match CURRENT.with(|current| current.borrow_mut().take()) {
        Some(current) => Ok(lend(current, f)),
        None => Ok(f(&scan(classify)?)),
    }
}

/// `f` on `current`, which then goes back to being this thread's current scan.
fn lend<T>(current: ProcScan, f: impl FnOnce(&ProcScan) -> T) -> T {
    let value = f(&current);
    CURRENT.with(|slot| *slot.borrow_mut() = Some(current));
    value
}

/// Calls `f` on this thread's current scan (see `during`); `None` when
/// there is none.
pub(crate) fn lent<T>(f: impl FnOnce(&ProcScan) -> T) -> Option<T> {
    let current = CURRENT.with(|current| current.borrow_mut().take())?;
    Some(lend(current, f))
}

/// Identity, tree and state of every process, without reading descriptors:
/// for walks of the process tree.
pub fn scan_tree() -> io::Result<ProcScan> {
    scan_with(PROC, None)
}

/// The processes `pids`, their descendants, their ancestors, and the
/// leaders of every such process's group and session, each read as
/// `scan_tree` reads it (its stat, no descriptors): the part of the process
/// tree by which those processes are judged (parents, orphans, their trees),
/// at a cost that grows with that part instead of with the host's processes
/// (`Snapshot::see`). Descendants are found through each thread's
/// `/proc/PID/task/TID/children`. `None` where the kernel keeps no such
/// file (built without CONFIG_PROC_CHILDREN): the caller then reads the
/// whole tree. A PID that names no process is left out. Beyond
/// `FAMILY_LIMIT` descendants, the whole tree (`scan_tree`) is returned.
pub(crate) fn scan_family(pids: &BTreeSet<u32>) -> Option<io::Result<ProcScan>> {
    let base = match open_proc() {
        Ok(base) => base,
        Err(error) => return Some(Err(error)),
    };
    let mut buffers = Buffers::default();
    let mut records: std::collections::BTreeMap<u32, ProcessRecord> =
        std::collections::BTreeMap::new();
    let mut absent: BTreeSet<u32> = BTreeSet::new();
    let mut read = |pid: u32,
                    records: &mut std::collections::BTreeMap<u32, ProcessRecord>,
                    buffers: &mut Buffers| {
        if records.contains_key(&pid) || absent.contains(&pid) {
            return records.contains_key(&pid);
        }
        match read_process(base.as_fd(), pid, None, buffers) {
            Some((record, _)) => {
                records.insert(pid, record);
                true
            }
            None => {
                absent.insert(pid);
                false
            }
        }
    };
    // Down: the processes asked for and everything below them.
    let mut below: Vec<u32> = pids.iter().copied().collect();
    let mut expanded: BTreeSet<u32> = BTreeSet::new();
    while let Some(pid) = below.pop() {
        if !expanded.insert(pid) || !read(pid, &mut records, &mut buffers) {
            continue;
        }
        // A family as large as a host (PID 1 listed, as in a container
        // whose CUDA program is its init) is read faster by the threads of
        // a whole tree's scan.
        if records.len() > FAMILY_LIMIT {
            return Some(scan_tree());
        }
        below.extend(children_of(base.as_fd(), pid)?);
    }
    // Up: their ancestors, to PID 1.
    for &pid in pids {
        let mut parent = records.get(&pid).map(|record| record.ppid);
        let mut steps = 0;
        while let Some(at) = parent.filter(|&at| at > 0) {
            // A loop in the parents (PIDs reused under a racing read) ends here.
            steps += 1;
            if steps > MAX_ANCESTORS || !read(at, &mut records, &mut buffers) {
                break;
            }
            parent = records.get(&at).map(|record| record.ppid);
        }
    }
    // The leaders of their groups and sessions: whether those are alive
    // decides who is orphaned.
    let leaders: BTreeSet<u32> = records
        .values()
        .flat_map(|record| [record.pgid, record.sid])
        .filter(|&leader| leader > 0)
        .collect();
    for leader in leaders {
        read(leader, &mut records, &mut buffers);
    }
    Some(Ok(ProcScan {
        processes: records.into_values().collect(),
        unreadable: Vec::new(),
    }))
}

/// Deepest chain of parents `scan_family` follows.
const MAX_ANCESTORS: usize = 4096;
/// Most descendants `scan_family` reads one by one before reading the whole
/// tree instead.
const FAMILY_LIMIT: usize = 2048;

/// The children of every thread of `pid`; empty when it has gone; `None`
/// when the kernel keeps no `children` file (its own thread's is missing
/// while the process is there).
fn children_of(base: std::os::fd::BorrowedFd, pid: u32) -> Option<Vec<u32>> {
    use rustix::fs::{Mode, OFlags};
    let tasks = match rustix::fs::openat(
        base,
        format!("{pid}/task"),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(tasks) => tasks,
        Err(_) => return Some(Vec::new()),
    };
    let mut children = Vec::new();
    let entries = rustix::fs::Dir::read_from(&tasks).ok()?;
    for entry in entries.flatten() {
        let Some(tid) = entry
            .file_name()
            .to_str()
            .ok()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let path = format!("{tid}/children");
        let Some(file) = open_file(&tasks, &path) else {
            // The main thread's own file missing while the process is
            // there: no children files on this kernel.
            if tid == pid
                && rustix::fs::accessat(
                    &tasks,
                    format!("{tid}"),
                    rustix::fs::Access::EXISTS,
                    rustix::fs::AtFlags::empty(),
                )
                .is_ok()
            {
                return None;
            }
            continue;
        };
        let mut text = String::new();
        if io::Read::read_to_string(&mut fs::File::from(file), &mut text).is_ok() {
            children.extend(
                text.split_ascii_whitespace()
                    .filter_map(|child| child.parse::<u32>().ok()),
            );
        }
    }
    Some(children)
}

/// Where this PID namespace's processes are.
const PROC: &str = "/proc";

/// A handle on a proc mount, which a scan reads everything through.
fn open_directory(root: &str) -> io::Result<std::os::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::openat(
        rustix::fs::CWD,
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn open_proc() -> io::Result<std::os::fd::OwnedFd> {
    open_directory(PROC)
}

fn scan_with(root: &str, classify: Option<Classify>) -> io::Result<ProcScan> {
    let base = open_directory(root)?;
    let mut pids: Vec<u32> = fs::read_dir(root)?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_SCAN_THREADS)
        .min(pids.len().div_ceil(MIN_PIDS_PER_THREAD))
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = Work {
        base: base.as_fd(),
        pids: &pids,
        next: &next,
        classify,
    };
    let parts: Vec<std::thread::Result<ProcScan>> = std::thread::scope(|scope| {
        // A thread that cannot be started leaves its share to the others:
        // this thread takes batches too, until none is left.
        let workers: Vec<_> = (1..threads)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .stack_size(SCAN_STACK)
                    .spawn_scoped(scope, || work.run())
                    .ok()
            })
            .collect();
        let mine = work.run();
        std::iter::once(Ok(mine))
            .chain(workers.into_iter().map(|worker| worker.join()))
            .collect()
    });
    let mut scanned = Vec::with_capacity(parts.len());
    for part in parts {
        // A lost range of PIDs would be a silently partial scan: fail instead.
        scanned.push(part.map_err(|_| io::Error::other("a /proc scanning thread panicked"))?);
    }
    // The largest part becomes the whole, grown in place, and each other
    // part is freed as soon as it is moved in: the records are never all
    // held twice.
    scanned.sort_unstable_by_key(|part| std::cmp::Reverse(part.processes.len()));
    let rest: usize = scanned
        .iter()
        .skip(1)
        .map(|part| part.processes.len())
        .sum();
    let mut parts = scanned.into_iter();
    let mut result = parts.next().unwrap_or_default();
    result.processes.reserve_exact(rest);
    for part in parts {
        result.processes.extend(part.processes);
        result.unreadable.extend(part.unreadable);
    }
    // Batches end up in any order across threads; a scan lists by PID.
    result
        .processes
        .sort_unstable_by_key(|record| record.id.pid);
    result.unreadable.sort_by_key(|entry| entry.pid);
    Ok(result)
}

/// Most threads a scan uses, and fewest processes worth a thread of their own:
/// on a 2-core VM two threads read the simulated host's ~185 processes in
/// 13 ms against 19 with one (docs/bench/history.md, round 10).
const MAX_SCAN_THREADS: usize = 32;
const MIN_PIDS_PER_THREAD: usize = 64;
/// PIDs a thread takes at a time: small enough to even out the threads'
/// shares (a crowd of processes with many descriptors sits in one range of
/// PIDs), large enough that taking one costs nothing.
const BATCH: usize = 64;
/// A scanning thread's stack: it reads into buffers on the heap, so it needs
/// little (the default is 2 MiB).
const SCAN_STACK: usize = 256 * 1024;

/// One scan's PIDs, shared by its threads, each taking the next batch.
struct Work<'a> {
    /// The proc mount, opened once.
    base: std::os::fd::BorrowedFd<'a>,
    pids: &'a [u32],
    next: &'a std::sync::atomic::AtomicUsize,
    classify: Option<Classify<'a>>,
}

impl Work<'_> {
    fn run(&self) -> ProcScan {
        use std::sync::atomic::Ordering;
        let mut result = ProcScan::default();
        let mut buffers = Buffers::default();
        loop {
            let start = self.next.fetch_add(BATCH, Ordering::Relaxed);
            let Some(batch) = self.pids.get(start..(start + BATCH).min(self.pids.len())) else {
                return result;
            };
            if batch.is_empty() {
                return result;
            }
            for &pid in batch {
                result.read(self.base, pid, self.classify, &mut buffers);
            }
        }
    }
}

/// Buffers reused across processes, so a scan does not allocate per process
/// or per descriptor.
struct Buffers {
    stat: Vec<u8>,
    link: Vec<u8>,
    /// `PID/fd`, `PID/stat`: a path under the proc mount.
    path: String,
    /// What `getdents64` fills.
    entries: Vec<std::mem::MaybeUninit<u8>>,
}

impl Default for Buffers {
    fn default() -> Self {
        Buffers {
            stat: Vec::new(),
            link: Vec::new(),
            path: String::new(),
            entries: vec![std::mem::MaybeUninit::uninit(); DIRENT_BUFFER],
        }
    }
}

/// One `getdents64` call's worth of descriptor names: about 170 of them.
const DIRENT_BUFFER: usize = 4096;

/// `PID/NAME` in `buffers.path`, relative to the proc mount.
fn under(buffers: &mut Buffers, pid: u32, name: &str) {
    use std::fmt::Write;
    buffers.path.clear();
    let _ = write!(buffers.path, "{pid}/{name}");
}

/// Reads one process, relative to the proc mount `base`: its stat and its
/// descriptors are the same process's even if the PID is reused meanwhile,
/// because both are read through one handle (the descriptor directory, whose
/// parent is that process's directory). `None` when it has gone. The second
/// value is why its descriptors could not be read, if they could not.
fn read_process(
    base: std::os::fd::BorrowedFd,
    pid: u32,
    classify: Option<Classify>,
    buffers: &mut Buffers,
) -> Option<(ProcessRecord, Option<String>)> {
    use rustix::fs::{Mode, OFlags};
    let Some(classify) = classify else {
        // Without descriptors to read, the stat file alone: one open, one
        // read, one close.
        under(buffers, pid, "stat");
        let stat = read_stat(&open_file(base, &buffers.path)?, &mut buffers.stat)?;
        return Some((record_of(pid, stat, BTreeSet::new(), true), None));
    };
    under(buffers, pid, "fd");
    let descriptors = match rustix::fs::openat(
        base,
        buffers.path.as_str(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(descriptors) => descriptors,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::SRCH) => return None,
        // Not ours to read (EACCES): the stat alone, through a handle on the
        // process's directory, and why the descriptors could not be read.
        Err(_) => return read_process_slowly(base, pid, classify, buffers),
    };
    let stat = read_stat(&open_file(&descriptors, "../stat")?, &mut buffers.stat)?;
    record_with_fds(pid, stat, |nodes| {
        scan_fds(descriptors, classify, buffers, nodes)
    })
}

/// `read_process` for a process whose descriptor directory could not be
/// opened: its stat through a handle on its directory, then the descriptors
/// through the same handle, which fail as they failed (the reason is
/// recorded), or are read should they have become readable meanwhile.
fn read_process_slowly(
    base: std::os::fd::BorrowedFd,
    pid: u32,
    classify: Classify,
    buffers: &mut Buffers,
) -> Option<(ProcessRecord, Option<String>)> {
    use rustix::fs::{Mode, OFlags};
    let directory = rustix::fs::openat(
        base,
        pid.to_string(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let stat = read_stat(&open_file(&directory, "stat")?, &mut buffers.stat)?;
    record_with_fds(pid, stat, |nodes| {
        let descriptors = rustix::fs::openat(
            &directory,
            "fd",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        scan_fds(descriptors, classify, buffers, nodes)
    })
}

/// A process's record from its stat and, unless it is a kernel thread, the
/// device nodes `scan` finds among its descriptors: `None` when the process
/// went meanwhile (ENOENT, ESRCH); any other failure is kept as why its
/// descriptors could not be read.
fn record_with_fds(
    pid: u32,
    stat: Stat,
    scan: impl FnOnce(&mut BTreeSet<Node>) -> Result<(), rustix::io::Errno>,
) -> Option<(ProcessRecord, Option<String>)> {
    let mut nodes = BTreeSet::new();
    let mut fd_error = None;
    if stat.flags & PF_KTHREAD == 0 {
        match scan(&mut nodes) {
            Ok(()) => {}
            Err(error) if error == rustix::io::Errno::NOENT || error == rustix::io::Errno::SRCH => {
                return None;
            }
            Err(error) => fd_error = Some(io::Error::from(error).to_string()),
        }
    }
    let readable = fd_error.is_none();
    Some((record_of(pid, stat, nodes, readable), fd_error))
}

fn record_of(pid: u32, stat: Stat, nodes: BTreeSet<Node>, fds_readable: bool) -> ProcessRecord {
    ProcessRecord {
        id: ProcessId {
            pid,
            start_time: stat.start_time,
        },
        ppid: stat.ppid,
        pgid: stat.pgid,
        sid: stat.sid,
        uid: None,
        state: stat.state,
        comm: stat.comm,
        cmdline: String::new(),
        kernel_thread: stat.flags & PF_KTHREAD != 0,
        cpu_ticks: stat.cpu_ticks,
        fds_readable,
        nodes,
    }
}

/// The fields of /proc/PID/stat that gpureap uses.
struct Stat {
    comm: String,
    state: State,
    ppid: u32,
    pgid: u32,
    sid: u32,
    flags: u32,
    cpu_ticks: u64,
    start_time: u64,
}

/// `/proc/PID/NAME`, opened for reading; `None` when the process has gone.
fn open_in_proc(root: &str, pid: u32, name: &str) -> Option<std::os::fd::OwnedFd> {
    open_file(rustix::fs::CWD, &format!("{root}/{pid}/{name}"))
}

fn open_file(directory: impl std::os::fd::AsFd, path: &str) -> Option<std::os::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::openat(
        directory,
        path,
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// One process's stat, for the few lookups outside a scan.
fn stat_of(pid: u32) -> Option<Stat> {
    read_stat(&open_in_proc(PROC, pid, "stat")?, &mut Vec::new())
}

/// Parses a stat file opened by the caller.
fn read_stat(file: &std::os::fd::OwnedFd, buffer: &mut Vec<u8>) -> Option<Stat> {
    buffer.clear();
    buffer.resize(1024, 0);
    let mut filled = 0;
    loop {
        let read = rustix::io::read(file, &mut buffer[filled..]).ok()?;
        filled += read;
        if read == 0 || filled < buffer.len() {
            break;
        }
        buffer.resize(buffer.len() * 2, 0);
    }
    parse_stat(&buffer[..filled])
}

/// Parses /proc/PID/stat. The command name is between the first '(' and the
/// last ')', and may itself contain spaces and parentheses.
fn parse_stat(text: &[u8]) -> Option<Stat> {
    let open = text.iter().position(|&b| b == b'(')?;
    let close = text.iter().rposition(|&b| b == b')')?;
    let comm = String::from_utf8_lossy(text.get(open + 1..close)?).into_owned();
    let rest = std::str::from_utf8(text.get(close + 2..)?).ok()?;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // Fields counted from `state`, the third field of the file.
    let field = |n: usize| fields.get(n).copied();
    let number = |n: usize| field(n).and_then(|text| text.parse::<i64>().ok());
    Some(Stat {
        comm,
        state: State::from_letter(field(0)?.chars().next()?),
        ppid: number(1)?.max(0) as u32,
        pgid: number(2)?.max(0) as u32,
        sid: number(3)?.max(0) as u32,
        flags: number(6)? as u32,
        cpu_ticks: (number(11)? + number(12)?).max(0) as u64,
        start_time: number(19)?.max(0) as u64,
    })
}

/// Adds the GPU nodes among the descriptors listed in `directory` (a
/// process's `fd` directory) to `nodes`.
fn scan_fds(
    directory: std::os::fd::OwnedFd,
    classify: Classify,
    buffers: &mut Buffers,
    nodes: &mut BTreeSet<Node>,
) -> Result<(), rustix::io::Errno> {
    use std::os::unix::ffi::OsStrExt;

    let Buffers { link, entries, .. } = buffers;
    let mut listing = rustix::fs::RawDir::new(&directory, entries.as_mut_slice());
    while let Some(entry) = listing.next() {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes().first() == Some(&b'.') {
            continue;
        }
        match rustix::fs::readlinkat(&directory, name, std::mem::take(link)) {
            Ok(target) => {
                *link = target.into_bytes();
                if let Some(node) = classify(Path::new(std::ffi::OsStr::from_bytes(link))) {
                    nodes.insert(node);
                }
            }
            // A descriptor closed while we looked: skip it.
            Err(rustix::io::Errno::NOENT) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// A process's command line, arguments joined by spaces; empty for kernel
/// threads, zombies, and processes that have gone. A program the kernel
/// started through qemu-user registered in binfmt_misc with the
/// preserve-argv0 flag (another architecture's binary: the aarch64 gpureap
/// on an x86_64 host, its demo's stand-ins included) is its own command
/// line, not qemu's `qemu-ARCH PATH ARGV0 ARGS...`.
pub fn cmdline(pid: u32) -> String {
    let bytes = own_cmdline(pid);
    let text = String::from_utf8_lossy(&bytes);
    text.trim_end_matches('\0').replace('\0', " ")
}

/// A process's arguments, as `cmdline` reads them, one string each (empty
/// ones left out).
pub fn arguments(pid: u32) -> Vec<String> {
    own_cmdline(pid)
        .split(|&byte| byte == 0)
        .filter(|word| !word.is_empty())
        .map(|word| String::from_utf8_lossy(word).into_owned())
        .collect()
}

/// /proc/PID/cmdline without qemu-user's arguments (`emulated_prefix`).
fn own_cmdline(pid: u32) -> Vec<u8> {
    let Ok(mut bytes) = read_small(&format!("/proc/{pid}/cmdline"), u64::MAX) else {
        return Vec::new();
    };
    bytes.drain(..emulated_prefix(pid, &bytes));
    bytes
}

/// The length of qemu-user's own two arguments (the interpreter and the
/// binary's path) at the start of `cmdline`, when the kernel passed the
/// program's argv[0] on after them: binfmt_misc's `P` flag, which the kernel
/// announces to the interpreter as AT_FLAGS_PRESERVE_ARGV0 in its auxiliary
/// vector (Linux 5.12 and later). 0 for every other process, and for one
/// whose auxiliary vector cannot be read (another user's, not as root).
/// Only a command line whose argv[0] names qemu costs the extra read
/// (`/usr/bin/qemu-aarch64-static`, or Debian's registered
/// `/usr/libexec/qemu-binfmt/aarch64-binfmt-P`).
fn emulated_prefix(pid: u32, cmdline: &[u8]) -> usize {
    const AT_FLAGS: usize = 8;
    const AT_FLAGS_PRESERVE_ARGV0: usize = 1;
    let argv0 = cmdline.split(|byte| *byte == 0).next().unwrap_or_default();
    if !argv0.windows(4).any(|word| word == b"qemu") {
        return 0;
    }
    let Ok(auxv) = read_small(&format!("/proc/{pid}/auxv"), 4096) else {
        return 0;
    };
    let word = std::mem::size_of::<usize>();
    let preserved = auxv.chunks_exact(2 * word).any(|pair| {
        let value = |bytes: &[u8]| usize::from_ne_bytes(bytes.try_into().unwrap_or_default());
        value(&pair[..word]) == AT_FLAGS && value(&pair[word..]) & AT_FLAGS_PRESERVE_ARGV0 != 0
    });
    if !preserved {
        return 0;
    }
    // After the second argument's NUL, if a third (the program's argv[0]) follows.
    let mut ends = cmdline
        .iter()
        .enumerate()
        .filter(|(_, byte)| **byte == 0)
        .map(|(at, _)| at + 1);
    ends.nth(1)
        .filter(|&start| start < cmdline.len())
        .unwrap_or(0)
}

/// A /proc file whole, up to `limit` bytes. /proc says its files are 0
/// bytes long, so `fs::read` starts from a 32-byte probe and doubles: an
/// environment of a few KiB took eight reads. One page first, then as
/// `read_to_end` grows it.
pub(crate) fn read_small(path: &str, limit: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::with_capacity(4096);
    fs::File::open(path)?.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The identity (PID and start time) of the process with this PID now.
pub fn identity(pid: u32) -> Option<ProcessId> {
    start_time(pid).map(|start_time| ProcessId { pid, start_time })
}

/// The start time of a live process, for PID-reuse checks; `None` if it is gone.
pub fn start_time(pid: u32) -> Option<u64> {
    stat_of(pid).map(|stat| stat.start_time)
}

/// What the process with a PID is now, read once from its stat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Glance {
    pub id: ProcessId,
    pub state: State,
    pub comm: String,
    pub ppid: u32,
}

/// The process with this PID now, if there is one.
pub(crate) fn glance(pid: u32) -> Option<Glance> {
    stat_of(pid).map(|stat| Glance {
        id: ProcessId {
            pid,
            start_time: stat.start_time,
        },
        state: stat.state,
        comm: stat.comm,
        ppid: stat.ppid,
    })
}

/// The state of a process, if it still exists with the given identity.
pub fn state_of(id: ProcessId) -> Option<State> {
    let stat = stat_of(id.pid)?;
    (stat.start_time == id.start_time).then_some(stat.state)
}

/// What the kernel says the process is blocked in, for D-state reports.
pub fn wchan(pid: u32) -> Option<String> {
    let bytes = read_small(&format!("/proc/{pid}/wchan"), 4096).ok()?;
    let text = std::str::from_utf8(&bytes).ok()?.trim();
    (!text.is_empty() && text != "0").then(|| text.to_string())
}

/// The process's cgroup v2 path (or the first v1 hierarchy's), for the container column.
pub fn cgroup(pid: u32) -> Option<String> {
    cgroup_shown(&cgroup_file(pid)?)
}

/// The most of /proc/PID/cgroup read: one line per hierarchy, a path each.
const CGROUP_FILE_LIMIT: u64 = 64 * 1024;

/// /proc/PID/cgroup as text (bytes that are not UTF-8 replaced: a cgroup
/// name is any bytes its creator chose), bounded; None when unreadable
/// (the process is gone).
pub(crate) fn cgroup_file(pid: u32) -> Option<String> {
    let bytes = read_small(&format!("/proc/{pid}/cgroup"), CGROUP_FILE_LIMIT).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The path `cgroup` shows from a /proc/PID/cgroup's text: the v2 line's
/// (`0::PATH`), else the first hierarchy's.
pub(crate) fn cgroup_shown(text: &str) -> Option<String> {
    let mut fallback = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" {
            return Some(path.to_string());
        }
        fallback.get_or_insert_with(|| path.to_string());
    }
    fallback
}

/// Seconds since boot, to turn start times into ages.
pub fn uptime_ticks() -> Option<u64> {
    let text = fs::read_to_string("/proc/uptime").ok()?;
    let seconds: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some((seconds * ticks_per_second() as f64) as u64)
}

pub fn ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second()
}

/// The chain of processes from our parent up to PID 1: the shells and scripts
/// that ran gpureap, which it must never signal.
pub(crate) fn ancestors_of_self() -> BTreeSet<u32> {
    let mut ancestors = BTreeSet::new();
    let mut pid = std::process::id();
    while let Some(stat) = stat_of(pid) {
        let ppid = stat.ppid;
        if ppid == 0 || !ancestors.insert(ppid) {
            break;
        }
        pid = ppid;
    }
    ancestors
}

/// CPU time used so far by one process, in clock ticks; `None` if it is gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    stat_of(pid).map(|stat| stat.cpu_ticks)
}

/// The value of `name` in a process's environment (as it started).
pub fn env_value(pid: u32, name: &str) -> Option<String> {
    let environ = read_small(&format!("/proc/{pid}/environ"), u64::MAX).ok()?;
    environ.split(|&byte| byte == 0).find_map(|entry| {
        let value = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(value).into_owned())
    })
}

/// The real uid from /proc/PID/status (the owner of /proc/PID is root for
/// non-dumpable processes).
pub(crate) fn real_uid(pid: u32) -> Option<u32> {
    status_uid(&read_small(&format!("/proc/{pid}/status"), u64::MAX).ok()?)
}

/// The real uid on the `Uid:` line of a /proc/PID/status, read as bytes:
/// its `Name:` line holds the comm, any bytes the process chose (not UTF-8
/// for a process that wants to pass unnoticed).
fn status_uid(status: &[u8]) -> Option<u32> {
    status
        .split(|&byte| byte == b'\n')
        .find_map(|line| line.strip_prefix(b"Uid:"))
        .and_then(|ids| std::str::from_utf8(ids).ok())
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
}

#[cfg(test)]
mod tests {
    //! The format is proc(5)'s `/proc/PID/stat`: `pid (comm) state ppid pgrp
    //! session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime
    //! cutime cstime priority nice num_threads itrealvalue starttime ...`.
    //! comm is whatever the process set (up to 15 bytes), so it may hold
    //! spaces, parentheses and newlines.

    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::*;

    fn line(comm: &str, state: char, flags: u32) -> Vec<u8> {
        format!(
            "4242 ({comm}) {state} 1 4200 4100 0 -1 {flags} 10 0 0 0 7 5 0 0 20 0 3 0 98765 123456 789 18446744073709551615 0 0\n"
        )
        .into_bytes()
    }

    /// Inside `during`, a reader of /proc gets the snapshot's scan; outside
    /// it, and after a panic inside it, a fresh one.
    #[test]
    fn a_scan_lent_for_a_snapshot_is_used_only_during_it() {
        let classify: Classify = &|_| None;
        let marker = ProcScan {
            processes: Vec::new(),
            unreadable: vec![Unreadable {
                pid: 4242,
                comm: "marker".to_string(),
                reason: "lent".to_string(),
            }],
        };
        let lent = |scan: &ProcScan| scan.unreadable.first().map(|entry| entry.pid);
        let (back, seen) = during(marker, || with_scan(classify, lent).expect("scan"));
        assert_eq!(seen, Some(4242));
        assert_eq!(back.unreadable[0].pid, 4242, "the scan comes back");
        let fresh = with_scan(classify, |scan| scan.processes.len()).expect("scan");
        assert!(fresh > 0, "outside `during`, /proc is read");
        let panicked = std::panic::catch_unwind(|| {
            during(back, || panic!("a driver panicked"));
        });
        assert!(panicked.is_err());
        assert_ne!(with_scan(classify, lent).expect("scan"), Some(4242));
    }

    #[test]
    fn the_uid_is_read_whatever_bytes_the_comm_holds() {
        let status = b"Name:\t\xffbad\xfe\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t65534\t65534\t65534\t65534\nGid:\t0\t0\t0\t0\n";
        assert_eq!(status_uid(status), Some(65534));
        assert_eq!(status_uid(b"Name:\tx\nGid:\t0\n"), None);
        // The live process, read through /proc.
        assert_eq!(
            real_uid(std::process::id()),
            Some(rustix::process::getuid().as_raw())
        );
    }

    #[test]
    fn plain_fields() {
        let stat = parse_stat(&line("python3", 'S', 4_194_560)).expect("parses");
        assert_eq!(stat.comm, "python3");
        assert_eq!(stat.state, State::Sleeping);
        assert_eq!((stat.ppid, stat.pgid, stat.sid), (1, 4200, 4100));
        assert_eq!(stat.cpu_ticks, 12);
        assert_eq!(stat.start_time, 98765);
        assert_eq!(stat.flags & PF_KTHREAD, 0);
    }

    #[test]
    fn names_with_spaces_parentheses_and_newlines() {
        for comm in [
            "sglang::TP 0",
            "a) S 9 9 9 (b",
            ")",
            "((",
            "x\ny) Z 1",
            "",
            "ünï",
        ] {
            let stat = parse_stat(&line(comm, 'R', 0)).unwrap_or_else(|| panic!("{comm:?}"));
            assert_eq!(stat.comm, comm, "{comm:?}");
            assert_eq!(stat.state, State::Running, "{comm:?}");
            assert_eq!(stat.ppid, 1, "{comm:?}");
            assert_eq!(stat.start_time, 98765, "{comm:?}");
        }
    }

    #[test]
    fn kernel_threads_zombies_and_broken_lines() {
        let kthreadd = b"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 22 0 0 18446744073709551615 0 0\n";
        let stat = parse_stat(kthreadd).expect("parses");
        assert_ne!(stat.flags & PF_KTHREAD, 0);
        assert_eq!(stat.ppid, 0);
        let zombie = parse_stat(&line("python3", 'Z', 0)).expect("parses");
        assert_eq!(zombie.state, State::Zombie);
        for broken in [
            &b""[..],
            b"4242",
            b"4242 (x",
            b"4242 (x) S 1 2",
            b"4242 x) S",
        ] {
            assert!(parse_stat(broken).is_none(), "{broken:?}");
        }
    }

    /// The real /proc, read by every scanning thread at once: each process
    /// once, in PID order, its stat and its descriptors its own (a child
    /// with a node open as its stdin is found holding it, with its comm).
    #[test]
    fn a_scan_lists_each_process_once_in_pid_order_with_its_own_nodes() {
        let dir = std::env::temp_dir().join(format!("gpureap-scan-{}", std::process::id()));
        std::fs::write(&dir, b"").expect("node");
        let mut children: Vec<_> = (0..3)
            .map(|_| {
                Command::new("sleep")
                    .arg("30")
                    .stdin(std::fs::File::open(&dir).expect("node"))
                    .spawn()
                    .expect("sleep")
            })
            .collect();
        let node = dir.clone();
        let classify: Classify = &move |path: &Path| (path == node).then_some(Node::Gpu(0));
        let scan = scan(classify).expect("scan");
        let pids: Vec<u32> = scan.processes.iter().map(|record| record.id.pid).collect();
        assert!(
            pids.windows(2).all(|pair| pair[0] < pair[1]),
            "in PID order, once each"
        );
        for child in &children {
            let record = scan
                .processes
                .iter()
                .find(|record| record.id.pid == child.id());
            let record = record.expect("child scanned");
            assert_eq!(record.nodes, BTreeSet::from([Node::Gpu(0)]));
            assert_eq!(record.comm, "sleep");
            assert_eq!(Some(record.id), identity(child.id()));
        }
        assert!(
            scan.processes
                .iter()
                .all(|record| record.id.pid == std::process::id()
                    || children.iter().any(|child| child.id() == record.id.pid)
                    || !record.nodes.contains(&Node::Gpu(0)))
        );
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&dir);
    }

    /// The real /proc: a family is the process asked for, what it started
    /// (also from a thread other than its main one, and below that), its
    /// ancestors and its group's leader, and nothing else: not a process
    /// re-parented away from it, nor the rest of the host. A PID that names
    /// no process is left out.
    #[test]
    fn a_family_is_the_processes_below_and_above_and_their_leaders_only() {
        let shell = Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .expect("sh");
        let shell_pid = shell.id();
        let from_a_thread = std::thread::spawn(|| {
            Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("sleep from a thread")
        })
        .join()
        .expect("thread");
        // A process that left: its parent exits at once, so it is re-parented.
        let output = Command::new("sh")
            .args(["-c", "sleep 30 </dev/null >/dev/null 2>&1 & echo $!"])
            .output()
            .expect("sh");
        let stray: u32 = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("stray pid");
        let grandchildren = |family: &ProcScan| {
            family
                .processes
                .iter()
                .filter(|record| record.ppid == shell_pid)
                .count()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let this = std::process::id();
        let gone = u32::MAX - 1;
        let family = loop {
            let family = scan_family(&BTreeSet::from([this, gone]))
                .expect("children files on this kernel")
                .expect("family");
            if grandchildren(&family) == 2 || Instant::now() > deadline {
                break family;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let pids: BTreeSet<u32> = family
            .processes
            .iter()
            .map(|record| record.id.pid)
            .collect();
        assert_eq!(grandchildren(&family), 2, "{pids:?}");
        for pid in [this, shell_pid, from_a_thread.id(), 1] {
            assert!(pids.contains(&pid), "{pid} not in {pids:?}");
        }
        let this_record = family
            .processes
            .iter()
            .find(|record| record.id.pid == this)
            .expect("this process");
        assert!(pids.contains(&this_record.ppid), "{pids:?}");
        // The group's leader, where it still runs (a leader may exit before
        // its group: then its absence is what the orphan rule reads).
        let leader = this_record.pgid;
        assert_eq!(
            pids.contains(&leader),
            identity(leader).is_some(),
            "leader {leader}: {pids:?}"
        );
        assert!(!pids.contains(&stray), "{stray} re-parented away: {pids:?}");
        assert!(!pids.contains(&gone));
        let everyone = scan_tree().expect("tree").processes.len();
        assert!(pids.len() < everyone, "{} of {everyone}", pids.len());
        let started_here = family
            .processes
            .iter()
            .filter(|record| record.ppid == shell_pid)
            .map(|record| record.id.pid)
            .chain([stray]);
        for pid in started_here {
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        for mut child in [shell, from_a_thread] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// PID 1's family is every process of the namespace but the kernel's
    /// threads, read one by one or, past the limit, as a whole tree.
    #[test]
    fn the_family_of_pid_1_is_every_process_of_the_namespace() {
        let tree = scan_tree().expect("tree");
        let family = scan_family(&BTreeSet::from([1]))
            .expect("children files on this kernel")
            .expect("family");
        let in_family: BTreeSet<u32> = family
            .processes
            .iter()
            .map(|record| record.id.pid)
            .collect();
        let missing: Vec<u32> = tree
            .processes
            .iter()
            .filter(|record| !record.kernel_thread && record.id.pid != 2)
            .filter(|record| !in_family.contains(&record.id.pid))
            .filter(|record| identity(record.id.pid) == Some(record.id))
            .map(|record| record.id.pid)
            .collect();
        assert!(missing.is_empty(), "not in PID 1's family: {missing:?}");
    }

    /// The real /proc: a process that renamed itself to a hostile comm, a
    /// zombie, and one that exits, as a scan sees them.
    #[test]
    fn a_scan_reads_hostile_names_zombies_and_vanished_processes() {
        let mut renamed = Command::new("bash")
            .arg("-c")
            .arg("printf 'a) Z 1 (b c' > /proc/$$/comm; echo ready; read -t 30 line")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("bash");
        let mut ready = [0u8; 6];
        std::io::Read::read_exact(renamed.stdout.as_mut().expect("stdout"), &mut ready)
            .expect("ready");
        // Printing "ready" comes before blocking in `read`: under load bash may
        // still be running when the scan looks, so wait for it to sleep.
        let renamed_id = identity(renamed.id()).expect("renamed process");
        let deadline = Instant::now() + Duration::from_secs(10);
        while state_of(renamed_id) != Some(State::Sleeping) {
            assert!(Instant::now() < deadline, "bash never blocked in read");
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut zombie = Command::new("true").spawn().expect("true");
        let zombie_pid = zombie.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while state_of(ProcessId {
            pid: zombie_pid,
            start_time: start_time(zombie_pid).unwrap_or(0),
        }) != Some(State::Zombie)
        {
            assert!(Instant::now() < deadline, "never became a zombie");
            std::thread::sleep(Duration::from_millis(2));
        }

        let scan = scan_tree().expect("scan");
        let find = |pid: u32| scan.processes.iter().find(|p| p.id.pid == pid);
        let record = find(renamed.id()).expect("renamed process");
        assert_eq!(record.comm, "a) Z 1 (b c");
        assert_eq!(record.state, State::Sleeping);
        assert_eq!(record.ppid, std::process::id());
        assert_eq!(find(zombie_pid).expect("zombie").state, State::Zombie);
        assert!(scan.processes.iter().all(|p| p.id.pid != 0));
        if let Some(kthreadd) = find(2) {
            assert!(kthreadd.kernel_thread || kthreadd.ppid != 0);
        }

        let _ = renamed.kill();
        let _ = renamed.wait();
        let _ = zombie.wait();
        assert_eq!(start_time(zombie_pid), None, "a reaped process is gone");
    }
}
