//! The simulated driver: real processes, real descriptors, simulated memory.
//!
//! `DIR/nvidiaN` plays GPU N's device node, and a process has a context on the
//! GPU while any descriptor of it points there, exactly as the real driver
//! keeps memory until the last descriptor closes, unless its claim
//! (`DIR/claims/PID.N`) says `none`: then it only has the node open, as every
//! CUDA process has every GPU's node open, and the driver does not list it
//! there. Memory is the contexts' claims (default 1 GiB) plus `DIR/leak.N`.
//! The processes looked at are those with a claim file, found through
//! `DIR/claims` as NVML knows its contexts, at a cost that does not grow
//! with the host's processes; with `DIR/unclaimed-holders`, every process,
//! so that one holding a node with no claim file at all is listed too.
//! `DIR/gpus` gives totals and names, `DIR/bookkeeping` the memory the
//! driver declares it keeps for itself, which the rule for memory held by no
//! process tolerates (docs/simulated-driver.md). One more:
//! `DIR/lost.N` makes GPU N answer as fallen off the bus, to test a driver
//! failing mid-run. A process whose descriptors the caller may not read holds
//! GPU N if it has a claim on it: the real driver sees every process, whoever
//! asks. `DIR/host-proc`, where it is a proc mount, is one of another PID
//! namespace (the host's, bind-mounted there by whoever runs gpureap in a
//! PID namespace of its own, as a container without the host's PIDs is):
//! the driver then lists the processes it shows, by their PIDs there, as the
//! real driver lists host PIDs to a gpureap in a container (older drivers
//! do). With `DIR/omit-other-namespaces` beside it, it lists only the
//! processes of the caller's PID namespace (and those below it), by their
//! PIDs there, and omits the others while their memory still counts in the
//! GPU's use, as NVML 580 does to a gpureap in a container.
//!
//! The directory's files are input like any other (docs/simulated-driver.md):
//! each is read relative to one handle on the directory, never through a
//! symbolic link, and only up to a size that fits what it may hold; a file
//! that is not what it should be is an error naming it, never a default.

mod events;
pub mod incident;
mod mig;
mod mps;
pub mod stand_in;
mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::evidence::{self, Health, KernelLog, Platform, Recovery};
use super::{Activity, Driver, DriverError, DriverProcess, Figures, GpuInfo, changed};
use crate::proc;
use crate::proc::Node;

const DEFAULT_TOTAL: u64 = 80 << 30;
const DEFAULT_CLAIM: u64 = 1 << 30;
const DEFAULT_NAME: &str = "Simulated GPU";
/// How often `wait_for_change` looks at the known holders' descriptors and
/// the directory's files when nothing wakes it. A holder's exit, the usual
/// release, is seen at once through its pidfd; with inotify (`events`) a
/// node's release and a file changed wake it at once too, and this is the
/// backstop (a descriptor closed while a forked child still shares it sends
/// no event). Each look costs ~0.2 ms of CPU on a loaded 2-core machine:
/// every 100 ms, 0.2% of a core.
const HOLDER_POLL: Duration = Duration::from_millis(100);
/// The same without inotify: every 20 ms, 1% of a core.
const HOLDER_POLL_BLIND: Duration = Duration::from_millis(20);
/// How long a wait gives the kernel to queue the releases of the nodes a
/// holder let go before it reads the figures by a scan instead.
const RELEASE_SETTLE: Duration = Duration::from_millis(50);
/// Largest claim or leak file: a byte count and a newline fit many times over.
const NUMBER_FILE_LIMIT: usize = 64;
/// Largest `DIR/gpus` or `DIR/reserved`: a line per GPU, a few hundred GPUs.
const GPUS_FILE_LIMIT: usize = 64 << 10;
/// Largest `DIR/activity.N`: its four figures and a few hundred processes.
const ACTIVITY_FILE_LIMIT: usize = 8 << 10;

pub struct SimDriver {
    dir: PathBuf,
    /// The directory itself: every file is opened relative to it.
    directory: OwnedFd,
    /// `DIR/nvidia`, as a string, for a fast prefix test on descriptor targets.
    node_prefix: String,
    /// Total and name of each GPU, from `DIR/gpus` as it was at open.
    gpus: Vec<(u64, String)>,
    /// Memory each GPU sets aside (`DIR/reserved` at open; `None`: not said).
    reserved: Vec<Option<u64>>,
    /// The bookkeeping this driver declares (`DIR/bookkeeping` at open, else
    /// 0): the tolerance of the rule for memory held by no process.
    bookkeeping: u64,
    /// The last answer and what stood behind it, for `wait_for_change`.
    known: std::sync::Mutex<watch::Known>,
    /// The holders the last wait watched, for the next (`watch::Kept`).
    kept: std::sync::Mutex<watch::Kept>,
    /// The nodes' opens and releases since the last fresh scan, and the
    /// directory's changes (`events`); `None` inside without inotify.
    /// Made by `will_wait` (or the first `wait_for_change`), not at open: a command that
    /// only looks never needs it, and the kernel takes 6-20 ms to tear down
    /// an inotify instance with watches (measured, docs/bench/history.md,
    /// round 10), which every such command would pay as it exits.
    events: std::sync::OnceLock<Option<events::Events>>,
    /// `DIR/host-proc`, when it is a directory: the proc mount whose
    /// processes this driver lists, instead of this namespace's /proc.
    host_proc: Option<PathBuf>,
    /// `DIR/omit-other-namespaces` was there at open: with `host_proc`, the
    /// lists leave out what is not of the caller's PID namespace.
    omit_other_namespaces: bool,
    /// Each GPU's MIG instances, from `DIR/mig.N` at open (`None`: MIG off).
    mig: Vec<Option<Vec<mig::Staged>>>,
    /// `DIR/unclaimed-holders` was there at open: a process holding a node
    /// with no claim file at all is listed too (a 1 GiB context), found by
    /// reading every process's descriptors. Without it, the lists are found
    /// through `DIR/claims` alone, as NVML finds its contexts: at a cost
    /// that does not grow with the host's processes.
    unclaimed_holders: bool,
}

fn cannot_read_proc(error: std::io::Error) -> DriverError {
    DriverError::Sim(format!("cannot read /proc: {error}"))
}

/// Opens `name` under `directory` for reading without following a symbolic
/// link (nor blocking on a FIFO). `Ok(None)` when there is no such file.
fn open_in(
    directory: impl AsFd,
    name: &str,
    shown_as: &Path,
    flags: OFlags,
) -> Result<Option<OwnedFd>, DriverError> {
    let flags = flags | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    match rustix::fs::openat(directory, name, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(Errno::LOOP) => Err(symlink_error(shown_as)),
        Err(error) => Err(DriverError::Sim(format!(
            "cannot read {}: {}",
            shown_as.display(),
            std::io::Error::from(error)
        ))),
    }
}

fn symlink_error(path: &Path) -> DriverError {
    DriverError::Sim(format!(
        "{} is a symbolic link: the simulated driver follows none; make it a plain file",
        path.display()
    ))
}

/// Reads a plain file of at most `limit` bytes. `Ok(None)` when it is absent.
fn read_bounded(
    directory: impl AsFd,
    name: &str,
    shown_as: &Path,
    limit: usize,
) -> Result<Option<Vec<u8>>, DriverError> {
    let Some(file) = open_in(directory, name, shown_as, OFlags::empty())? else {
        return Ok(None);
    };
    let cannot = |error: Errno| {
        DriverError::Sim(format!(
            "cannot read {}: {}",
            shown_as.display(),
            std::io::Error::from(error)
        ))
    };
    let stat = rustix::fs::fstat(&file).map_err(cannot)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(DriverError::Sim(format!(
            "{} is not a plain file",
            shown_as.display()
        )));
    }
    let mut content = vec![0; limit + 1];
    let mut filled = 0;
    while filled < content.len() {
        match rustix::io::read(&file, &mut content[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(Errno::INTR) => continue,
            Err(error) => return Err(cannot(error)),
        }
    }
    if filled > limit {
        return Err(DriverError::Sim(format!(
            "{} is larger than {limit} bytes: not what the simulated driver expects there",
            shown_as.display()
        )));
    }
    content.truncate(filled);
    Ok(Some(content))
}

/// What a bad file held, for an error message: the text itself only when it
/// is short and printable, so that an error never dumps a file.
fn describe(content: &[u8]) -> String {
    match std::str::from_utf8(content).map(str::trim) {
        Ok("") => "an empty file".to_string(),
        Ok(text) if text.len() <= 32 && !text.chars().any(char::is_control) => {
            format!("'{text}'")
        }
        Ok(_) => format!("{} bytes of text", content.len()),
        Err(_) => format!("{} bytes of binary data", content.len()),
    }
}

/// What a claim file says about one process on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// A context using this many bytes.
    Context(u64),
    /// `unknown`: a context whose memory the driver does not report (as NVML
    /// does in MIG mode); it counts for nothing in the memory used.
    Unreported,
    /// `none`: the node is open, but there is no context on this GPU.
    NodeOnly,
}

fn parse_claim(content: &[u8], shown_as: &Path) -> Result<Claim, DriverError> {
    match std::str::from_utf8(content).map(str::trim) {
        Ok("none") => return Ok(Claim::NodeOnly),
        Ok("unknown") => return Ok(Claim::Unreported),
        _ => {}
    }
    parse_bytes(content, shown_as)
        .map(Claim::Context)
        .map_err(|_| {
            DriverError::Sim(format!(
                "{}: expected a byte count, 'none' or 'unknown', found {}",
                shown_as.display(),
                describe(content)
            ))
        })
}

/// Parses a byte count: decimal digits, surrounding whitespace allowed.
fn parse_bytes(content: &[u8], shown_as: &Path) -> Result<u64, DriverError> {
    std::str::from_utf8(content)
        .ok()
        .map(str::trim)
        .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| {
            DriverError::Sim(format!(
                "{}: expected a byte count, found {}",
                shown_as.display(),
                describe(content)
            ))
        })
}

/// Parses `DIR/gpus`: line N is GPU N's total bytes, then optionally its name.
fn parse_gpus(
    content: &[u8],
    shown_as: &Path,
    count: u32,
) -> Result<Vec<(u64, String)>, DriverError> {
    let bad = |line: usize, what: String| {
        DriverError::Sim(format!(
            "{} line {line}: expected total bytes, then optionally a name; {what}",
            shown_as.display()
        ))
    };
    let text =
        std::str::from_utf8(content).map_err(|_| bad(1, format!("found {}", describe(content))))?;
    let mut lines = text.lines();
    let mut gpus = Vec::with_capacity(count as usize);
    for number in 1..=count as usize {
        let line = lines.next().unwrap_or("").trim();
        let (total, name) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let total = match total {
            "" => DEFAULT_TOTAL,
            total => total
                .parse()
                .map_err(|_| bad(number, format!("found {}", describe(total.as_bytes()))))?,
        };
        let name = name.trim();
        if name.chars().any(char::is_control) {
            return Err(bad(number, "the name has control characters".to_string()));
        }
        let name = if name.is_empty() { DEFAULT_NAME } else { name };
        gpus.push((total, name.to_string()));
    }
    Ok(gpus)
}

/// Parses `DIR/reserved`: line N is GPU N's reserved bytes; a line that is
/// empty or missing says nothing (`None`).
fn parse_reserved(
    content: &[u8],
    shown_as: &Path,
    count: u32,
) -> Result<Vec<Option<u64>>, DriverError> {
    let text = std::str::from_utf8(content).map_err(|_| {
        DriverError::Sim(format!(
            "{}: expected a byte count a line, found {}",
            shown_as.display(),
            describe(content)
        ))
    })?;
    let mut lines = text.lines();
    (1..=count as usize)
        .map(|number| match lines.next().map(str::trim).unwrap_or("") {
            "" => Ok(None),
            line => parse_bytes(line.as_bytes(), shown_as)
                .map(Some)
                .map_err(|_| {
                    DriverError::Sim(format!(
                        "{} line {number}: expected a byte count, found {}",
                        shown_as.display(),
                        describe(line.as_bytes())
                    ))
                }),
        })
        .collect()
}

/// `DIR/activity.N`: one `key value` a line (docs/simulated-driver.md); a
/// line it does not know, or a value that does not read, says nothing.
fn parse_activity(text: &str) -> Activity {
    let mut activity = Activity::default();
    let percent = |value: &str| value.parse::<u32>().ok().filter(|&v| v <= 100);
    let milliwatts = |value: &str| {
        value
            .parse::<f64>()
            .ok()
            .filter(|watts| watts.is_finite() && *watts >= 0.0 && *watts < 4e6)
            .map(|watts| (watts * 1000.0).round() as u32)
    };
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["utilization", value] => activity.utilization_percent = percent(value),
            ["temperature", value] => activity.temperature_celsius = value.parse().ok(),
            ["power", value] => activity.power_draw_milliwatts = milliwatts(value),
            ["power_limit", value] => activity.power_limit_milliwatts = milliwatts(value),
            ["process_sm", pid, value] => {
                if let (Ok(pid), Some(value)) = (pid.parse(), percent(value)) {
                    activity
                        .process_sm_percent
                        .get_or_insert_with(BTreeMap::new)
                        .insert(pid, value);
                }
            }
            ["process_sm", "none"] => {
                activity
                    .process_sm_percent
                    .get_or_insert_with(BTreeMap::new);
            }
            _ => {}
        }
    }
    activity
}

/// How many GPU nodes (`nvidia0`, `nvidia1`, ... without a gap) `dir` holds.
fn count_nodes(directory: &OwnedFd, dir: &Path) -> Result<u32, DriverError> {
    let mut gpu_count = 0u32;
    loop {
        let name = format!("nvidia{gpu_count}");
        let path = dir.join(&name);
        match rustix::fs::statat(directory, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
                // A character device is what a real node is; a plain file will do.
                FileType::RegularFile | FileType::CharacterDevice => gpu_count += 1,
                FileType::Symlink => return Err(symlink_error(&path)),
                _ => {
                    return Err(DriverError::Sim(format!(
                        "{} is neither a plain file nor a character device",
                        path.display()
                    )));
                }
            },
            Err(Errno::NOENT) => break,
            Err(error) => {
                return Err(DriverError::Sim(format!(
                    "cannot read {}: {}",
                    path.display(),
                    std::io::Error::from(error)
                )));
            }
        }
    }
    Ok(gpu_count)
}

impl SimDriver {
    pub fn open(dir: &Path) -> Result<SimDriver, DriverError> {
        let dir = dir
            .canonicalize()
            .map_err(|error| DriverError::Sim(format!("cannot open {}: {error}", dir.display())))?;
        let directory = rustix::fs::openat(
            rustix::fs::CWD,
            &dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|error| {
            DriverError::Sim(format!(
                "cannot read {}: {}",
                dir.display(),
                std::io::Error::from(error)
            ))
        })?;
        let gpu_count = count_nodes(&directory, &dir)?;
        if gpu_count == 0 {
            return Err(DriverError::Sim(format!(
                "{} has no nvidia0: create one empty file per GPU (nvidia0, nvidia1, ...) and nvidiactl",
                dir.display()
            )));
        }
        let gpus_path = dir.join("gpus");
        let gpus = match read_bounded(&directory, "gpus", &gpus_path, GPUS_FILE_LIMIT)? {
            Some(content) => parse_gpus(&content, &gpus_path, gpu_count)?,
            None => vec![(DEFAULT_TOTAL, DEFAULT_NAME.to_string()); gpu_count as usize],
        };
        let reserved_path = dir.join("reserved");
        let reserved = match read_bounded(&directory, "reserved", &reserved_path, GPUS_FILE_LIMIT)?
        {
            Some(content) => parse_reserved(&content, &reserved_path, gpu_count)?,
            None => vec![None; gpu_count as usize],
        };
        let bookkeeping_path = dir.join("bookkeeping");
        let bookkeeping = read_bounded(
            &directory,
            "bookkeeping",
            &bookkeeping_path,
            NUMBER_FILE_LIMIT,
        )?
        .map(|content| parse_bytes(&content, &bookkeeping_path))
        .transpose()?
        .unwrap_or(0);
        let node_prefix = format!("{}/nvidia", dir.display());
        // Only a proc mount: the empty directory beneath one, as the host
        // sees it, changes nothing.
        let host_proc = Some(dir.join("host-proc")).filter(|path| {
            rustix::fs::statfs(path).is_ok_and(|fs| fs.f_type == rustix::fs::PROC_SUPER_MAGIC)
        });
        let marker =
            |name: &str| match rustix::fs::statat(&directory, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink => {
                    Err(symlink_error(&dir.join(name)))
                }
                Ok(_) => Ok(true),
                Err(_) => Ok(false),
            };
        let omit_other_namespaces = marker("omit-other-namespaces")?;
        let unclaimed_holders = marker("unclaimed-holders")?;
        let mig = mig::read_all(&directory, &dir, gpu_count)?;
        Ok(SimDriver {
            mig,
            unclaimed_holders,
            host_proc,
            omit_other_namespaces,
            bookkeeping,
            dir,
            directory,
            node_prefix,
            gpus,
            reserved,
            known: std::sync::Mutex::default(),
            kept: std::sync::Mutex::default(),
            events: std::sync::OnceLock::new(),
        })
    }

    fn gpu_count(&self) -> u32 {
        self.gpus.len() as u32
    }

    /// `DIR/claims`, if there is one.
    fn claims(&self) -> Result<Option<OwnedFd>, DriverError> {
        open_in(
            &self.directory,
            "claims",
            &self.dir.join("claims"),
            OFlags::DIRECTORY,
        )
    }

    /// A byte count in `name` under `directory`; `Ok(None)` when absent.
    fn read_bytes(
        &self,
        directory: impl AsFd,
        name: &str,
        shown_as: &Path,
    ) -> Result<Option<u64>, DriverError> {
        read_bounded(directory, name, shown_as, NUMBER_FILE_LIMIT)?
            .map(|content| parse_bytes(&content, shown_as))
            .transpose()
    }

    /// Whether `DIR/lost.N` is there (a marker: its content is not read).
    fn is_lost(&self, index: u32) -> Result<bool, DriverError> {
        let name = format!("lost.{index}");
        match rustix::fs::statat(&self.directory, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink => {
                Err(symlink_error(&self.dir.join(name)))
            }
            Ok(_) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(error) => Err(DriverError::Sim(format!(
                "cannot read {}: {}",
                self.dir.join(name).display(),
                std::io::Error::from(error)
            ))),
        }
    }

    /// The figures of `memory_used_of` from one answer for every GPU.
    fn figures(
        &self,
        gpus: Result<Vec<Result<GpuInfo, DriverError>>, DriverError>,
        indexes: &BTreeSet<u32>,
    ) -> Figures {
        let gpus = match gpus {
            Ok(gpus) => gpus,
            Err(error) => {
                return indexes
                    .iter()
                    .map(|&index| (index, Err(error.clone())))
                    .collect();
            }
        };
        indexes
            .iter()
            .map(|&index| {
                let answer = match gpus.get(index as usize) {
                    Some(Ok(gpu)) => Ok(gpu.memory_used),
                    Some(Err(error)) => Err(error.clone()),
                    None => Err(DriverError::Sim(format!("no GPU {index}"))),
                };
                (index, answer)
            })
            .collect()
    }

    /// What the files that change a GPU's memory without a process (its
    /// leak and lost markers) and the claims directory (a new holder writes
    /// its claim there) look like now: compared, not read.
    fn file_states(
        &self,
        gpus: impl Iterator<Item = u32>,
    ) -> (BTreeMap<u32, Vec<watch::FileState>>, watch::FileState) {
        let state = |name: &str| {
            rustix::fs::statat(&self.directory, name, AtFlags::SYMLINK_NOFOLLOW)
                .ok()
                .map(|stat| {
                    (
                        stat.st_mtime,
                        stat.st_mtime_nsec as i64,
                        stat.st_size as u64,
                    )
                })
        };
        let files = gpus
            .map(|index| {
                (
                    index,
                    [
                        state(&format!("leak.{index}")),
                        state(&format!("lost.{index}")),
                    ]
                    .into_iter()
                    .chain(
                        (0..self.instance_count(index))
                            .map(|instance| state(&format!("leak.{index}.{instance}"))),
                    )
                    .collect(),
                )
            })
            .collect();
        (files, state("claims"))
    }

    /// A fresh /proc scan, classified by this driver.
    fn scan(&self) -> Result<proc::ProcScan, DriverError> {
        let classify = |path: &Path| self.classify_node(path);
        match &self.host_proc {
            Some(root) => proc::scan_at(root, &classify),
            None => proc::scan(&classify),
        }
        .map_err(cannot_read_proc)
    }

    /// The events, once a wait has started them (`start_events`).
    fn events(&self) -> Option<&events::Events> {
        self.events.get().and_then(Option::as_ref)
    }

    /// Starts watching the nodes and files (`events`), once; returns
    /// whether it did so now (and inotify was to be had).
    fn start_events(&self) -> bool {
        let mut started = false;
        self.events.get_or_init(|| {
            let events = events::Events::open(&self.dir, self.gpus.len() as u32);
            started = events.is_some();
            events
        });
        started
    }

    /// Every GPU, from the scan a snapshot is being taken with when there
    /// is one (`proc::during`: the same moment, one pass), else a fresh one.
    ///
    /// The processes looked at are those `DIR/claims` names (`claimants`),
    /// read alone, as NVML knows its contexts without looking at the host's
    /// other processes; with `DIR/unclaimed-holders`, every process, as
    /// before claims were indexed.
    fn answer(&self) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
        // Before the claims and the nodes are read, so that a change while
        // they are is seen as one by `wait_for_change`.
        let states = self.file_states(0..SimDriver::gpu_count(self));
        let claims = self.claims()?;
        let claimants = match self.unclaimed_holders {
            true => None,
            false => Some(self.claimants(claims.as_ref())?),
        };
        let classify = |path: &Path| self.classify_node(path);
        if let Some(root) = &self.host_proc {
            let scan = match &claimants {
                Some(pids) => proc::scan_pids(Some(root), pids, &classify),
                None => proc::scan_at(root, &classify),
            }
            .map_err(cannot_read_proc)?;
            let gpus = self.gpus_from(&scan, claims.as_ref(), states)?;
            if !self.omit_other_namespaces {
                return Ok(gpus);
            }
            return Ok(omit_other_namespaces(root, gpus));
        }
        // A scan of our own starts a baseline for `events`: the queue is
        // emptied just before it, under the lock, so that no other answer's
        // scan interleaves. A scan lent by a snapshot (`proc::during`, made
        // before) is not one, and spoils the baseline.
        let mut events = self.events().and_then(events::Events::lock);
        if let Some(events) = events.as_mut() {
            events.rebase();
        }
        let lent = proc::lent(|scan| match &claimants {
            Some(pids) => self.gpus_from(&only(scan, pids), claims.as_ref(), states.clone()),
            None => self.gpus_from(scan, claims.as_ref(), states.clone()),
        });
        let fresh = lent.is_none();
        let answer = match lent {
            Some(answer) => answer,
            None => {
                let scan = match &claimants {
                    Some(pids) => proc::scan_pids(None, pids, &classify),
                    None => proc::scan(&classify),
                }
                .map_err(cannot_read_proc)?;
                self.gpus_from(&scan, claims.as_ref(), states)
            }
        };
        if let (Some(events), false) = (events.as_mut(), fresh) {
            events.spoil();
            if let Ok(mut known) = self.known.lock() {
                known.complete = false;
            }
        }
        answer
    }

    /// The figures of `gpus` without a scan, where every one's node is
    /// proved unheld since the last fresh scan (`events`: no open since, and
    /// every description the known holders had released): each is then its
    /// leak alone, as a scan would find it. `None` (scan instead) wherever
    /// that is not proved: a known holder still holds, a node was opened,
    /// a descriptor is still shared, the scan could not read every process.
    fn released(&self, gpus: &BTreeSet<u32>) -> Option<Figures> {
        let mut events = self.events()?.lock()?;
        let mut known = self.known.lock().ok()?;
        if !known.complete || !known.hidden.is_empty() {
            tracing::debug!(complete = known.complete, "sim: a scan is needed");
            return None;
        }
        let classify = |path: &Path| self.classify_node(path);
        let on_these = |node: &Node| matches!(node, Node::Gpu(index) if gpus.contains(index));
        let still_held = known.holders.iter().any(|&(id, node)| {
            on_these(&node)
                && proc::nodes_of(id, &classify).is_some_and(|nodes| nodes.contains(&node))
        });
        let indexes: Vec<u32> = gpus.iter().copied().collect();
        let still_held = still_held || !known.unreadable_pass_nothing_on(&indexes, &classify);
        // A release is queued by the kernel as the holder's last reference
        // goes, which for an exiting holder may come a moment after its
        // descriptors are gone from /proc: give the counts a little while.
        let settle = std::time::Instant::now() + RELEASE_SETTLE;
        while !still_held && !gpus.iter().all(|&index| events.unheld(index)) {
            if events.state().0 || std::time::Instant::now() >= settle {
                tracing::debug!(state = ?events.state(), "sim: a scan is needed");
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if still_held {
            return None;
        }
        let figures: Figures = gpus
            .iter()
            .map(|&index| {
                (
                    index,
                    self.build(index, &[], None).map(|gpu| gpu.memory_used),
                )
            })
            .collect();
        known.holders.retain(|(_, node)| !on_these(node));
        for (&index, used) in &figures {
            match used {
                Ok(used) => known.figures.insert(index, *used),
                Err(_) => known.figures.remove(&index),
            };
        }
        tracing::debug!(?gpus, "sim: every node let go, read without a scan");
        Some(figures)
    }

    /// Every GPU, from a scan classified by this driver, `claims` and the
    /// files' `states` taken before it (`file_states`).
    fn gpus_from(
        &self,
        scan: &proc::ProcScan,
        claims: Option<&OwnedFd>,
        states: (BTreeMap<u32, Vec<watch::FileState>>, watch::FileState),
    ) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
        let (files, claims_state) = states;
        let holders = self.holders_in(scan, claims)?;
        let gpus: Vec<Result<GpuInfo, DriverError>> = (0..SimDriver::gpu_count(self))
            .map(|index| {
                self.build(
                    index,
                    holders.get(&index).map_or(&[][..], Vec::as_slice),
                    claims,
                )
            })
            .collect();
        let live = || scan.processes.iter().filter(|p| !p.state.has_exited());
        let known = watch::Known {
            figures: gpus
                .iter()
                .filter_map(|gpu| gpu.as_ref().ok())
                .map(|gpu| (gpu.index, gpu.memory_used))
                .collect(),
            holders: live()
                .flat_map(|process| {
                    process
                        .nodes
                        .iter()
                        .filter(|node| matches!(node, Node::Gpu(_)))
                        .map(|&node| (process.id, node))
                })
                .collect(),
            hidden: live()
                .filter(|process| {
                    !process.fds_readable
                        && holders.values().any(|pids| pids.contains(&process.id.pid))
                })
                .map(|process| process.id)
                .collect(),
            files,
            claims: claims_state,
            complete: true,
            unreadable: scan
                .unreadable
                .iter()
                .filter_map(|entry| {
                    scan.processes
                        .iter()
                        .find(|process| process.id.pid == entry.pid)
                        .map(|process| process.id)
                })
                .collect(),
            newest: scan
                .processes
                .iter()
                .map(|process| process.id.start_time)
                .max()
                .unwrap_or(0),
        };
        // Holders of another PID namespace cannot be watched from this one
        // (their PIDs name other processes here): `wait_for_change` then
        // watches the directory's files alone, until its limit.
        if let (Ok(mut slot), None) = (self.known.lock(), &self.host_proc) {
            *slot = known;
        }
        Ok(gpus)
    }

    /// The live holders of each node, from a scan classified by this driver.
    fn holders_in(
        &self,
        scan: &proc::ProcScan,
        claims: Option<&OwnedFd>,
    ) -> Result<BTreeMap<u32, Vec<u32>>, DriverError> {
        let mut holders: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for process in scan.processes.iter().filter(|p| !p.state.has_exited()) {
            for node in &process.nodes {
                if let Node::Gpu(index) = node {
                    holders.entry(*index).or_default().push(process.id.pid);
                }
            }
        }
        // A real driver sees every process, also those whose descriptors the
        // caller may not read (an unprivileged gpureap): for those, a claim
        // file stands for the open node.
        let hidden_from_us: Vec<u32> = scan
            .unreadable
            .iter()
            .map(|entry| entry.pid)
            .filter(|&pid| {
                scan.processes
                    .iter()
                    .any(|p| p.id.pid == pid && !p.state.has_exited())
            })
            .collect();
        if let (false, Some(claims)) = (hidden_from_us.is_empty(), claims) {
            for (pid, index) in self.claim_names(claims)? {
                if hidden_from_us.contains(&pid) {
                    holders.entry(index).or_default().push(pid);
                }
            }
        }
        Ok(holders)
    }

    /// Each `PID.N` under `DIR/claims` whose N is one of this driver's GPUs.
    fn claim_names(&self, claims: &OwnedFd) -> Result<Vec<(u32, u32)>, DriverError> {
        let entries = rustix::fs::Dir::read_from(claims).map_err(|error| {
            DriverError::Sim(format!(
                "cannot read {}: {}",
                self.dir.join("claims").display(),
                std::io::Error::from(error)
            ))
        })?;
        Ok(entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_str().ok()?;
                let (pid, index) = name.split_once('.')?;
                let (pid, index) = (pid.parse::<u32>().ok()?, index.parse::<u32>().ok()?);
                (index < self.gpu_count()).then_some((pid, index))
            })
            .collect())
    }

    /// The processes that have a claim file: the only ones this driver can
    /// list (a process holding a node with no claim at all is listed only
    /// with `DIR/unclaimed-holders`). No claims directory: none.
    fn claimants(&self, claims: Option<&OwnedFd>) -> Result<BTreeSet<u32>, DriverError> {
        Ok(match claims {
            Some(claims) => self
                .claim_names(claims)?
                .into_iter()
                .map(|(pid, _)| pid)
                .collect(),
            None => BTreeSet::new(),
        })
    }

    fn build(
        &self,
        index: u32,
        pids: &[u32],
        claims: Option<&OwnedFd>,
    ) -> Result<GpuInfo, DriverError> {
        if self.is_lost(index)? {
            return Err(DriverError::GpuLost { index });
        }
        if let Some(Some(staged)) = self.mig.get(index as usize) {
            return self.build_mig(index, staged, pids, claims);
        }
        let mut processes = Vec::with_capacity(pids.len());
        for &pid in pids {
            let name = format!("{pid}.{index}");
            let shown_as = self.dir.join("claims").join(&name);
            let claim = match claims {
                Some(claims) => read_bounded(claims, &name, &shown_as, NUMBER_FILE_LIMIT)?
                    .map(|content| parse_claim(&content, &shown_as))
                    .transpose()?,
                None => None,
            };
            let used_memory = match claim {
                Some(Claim::NodeOnly) => continue,
                Some(Claim::Unreported) => None,
                Some(Claim::Context(bytes)) => Some(bytes),
                None => Some(DEFAULT_CLAIM),
            };
            processes.push(DriverProcess { pid, used_memory });
        }
        let leak_name = format!("leak.{index}");
        let leak = self
            .read_bytes(&self.directory, &leak_name, &self.dir.join(&leak_name))?
            .unwrap_or(0);

        // Saturating: a staged claim near u64::MAX must not wrap to a few bytes.
        let used = processes
            .iter()
            .filter_map(|p| p.used_memory)
            .fold(leak, u64::saturating_add);
        let (total, name) = self.gpus[index as usize].clone();
        Ok(GpuInfo {
            index,
            name: Some(name),
            uuid: Some(sim_uuid(index)),
            memory_total: Some(total),
            memory_used: Some(used),
            memory_reserved: self.reserved[index as usize],
            processes,
            pci_bus_id: Some(sim_pci_bus_id(index)),
            mig_mode: Some(false),
            instances: Vec::new(),
            mps_clients: mps::clients(self, index),
        })
    }

    /// How many MIG instances GPU N has (0 where MIG is off).
    fn instance_count(&self, index: u32) -> usize {
        self.mig
            .get(index as usize)
            .and_then(Option::as_ref)
            .map_or(0, Vec::len)
    }

    /// A GPU in MIG mode: each holder's claim names its instance
    /// (`I:BYTES`; without a claim file, 1 GiB on instance 0); the parent
    /// lists every holder with its memory unknown, as NVML does, and each
    /// instance its own with their memory, plus `DIR/leak.N.I`.
    fn build_mig(
        &self,
        index: u32,
        staged: &[mig::Staged],
        pids: &[u32],
        claims: Option<&OwnedFd>,
    ) -> Result<GpuInfo, DriverError> {
        let mut instances = mig::instances(staged);
        let mut processes = Vec::with_capacity(pids.len());
        for &pid in pids {
            let name = format!("{pid}.{index}");
            let shown_as = self.dir.join("claims").join(&name);
            let content = match claims {
                Some(claims) => read_bounded(claims, &name, &shown_as, NUMBER_FILE_LIMIT)?,
                None => None,
            };
            let (instance, claim) = match &content {
                None => (0, Claim::Context(DEFAULT_CLAIM)),
                Some(content) if parse_claim(content, &shown_as) == Ok(Claim::NodeOnly) => continue,
                Some(content) => match mig::split_claim(content) {
                    Some((instance, rest)) => (instance, parse_claim(rest, &shown_as)?),
                    None => {
                        return Err(DriverError::Sim(format!(
                            "{}: GPU {index} is in MIG mode: a claim names its instance, \
                             like 0:1073741824, found {}",
                            shown_as.display(),
                            describe(content)
                        )));
                    }
                },
            };
            let Some(on) = instances.get_mut(instance as usize) else {
                return Err(DriverError::Sim(format!(
                    "{}: GPU {index} has no MIG instance {instance} ({} staged in {})",
                    shown_as.display(),
                    staged.len(),
                    self.dir.join(format!("mig.{index}")).display()
                )));
            };
            let used_memory = match claim {
                Claim::Context(bytes) => Some(bytes),
                Claim::Unreported | Claim::NodeOnly => None,
            };
            on.processes.push(DriverProcess { pid, used_memory });
            processes.push(DriverProcess {
                pid,
                used_memory: None,
            });
        }
        let leak_name = format!("leak.{index}");
        let mut used = self
            .read_bytes(&self.directory, &leak_name, &self.dir.join(&leak_name))?
            .unwrap_or(0);
        for instance in &mut instances {
            let leak_name = format!("leak.{index}.{}", instance.index);
            let leak = self
                .read_bytes(&self.directory, &leak_name, &self.dir.join(&leak_name))?
                .unwrap_or(0);
            let on = instance
                .processes
                .iter()
                .filter_map(|p| p.used_memory)
                .fold(leak, u64::saturating_add);
            instance.memory_used = Some(on);
            used = used.saturating_add(on);
        }
        let (total, name) = self.gpus[index as usize].clone();
        Ok(GpuInfo {
            index,
            name: Some(name),
            uuid: Some(sim_uuid(index)),
            memory_total: Some(total),
            memory_used: Some(used),
            memory_reserved: self.reserved[index as usize],
            processes,
            pci_bus_id: Some(sim_pci_bus_id(index)),
            mig_mode: Some(true),
            instances,
            mps_clients: mps::clients(self, index),
        })
    }
}

/// A simulated GPU's PCI bus id, fixed by its index: GPU N is on bus N + 1
/// (`00000000:01:00.0` for GPU 0), as `DIR/kmsg`'s Xid lines name it.
pub(crate) fn sim_pci_bus_id(index: u32) -> String {
    format!("00000000:{:02X}:00.0", (index + 1) % 256)
}

/// `DIR/health.N`: one `key value` a line (docs/simulated-driver.md); a
/// line it does not know, or a value that does not read, is left out.
fn parse_health(text: &str) -> Health {
    let mut health = Health::default();
    let flag = |value: &str| match value {
        "yes" | "true" | "1" => Some(true),
        "no" | "false" | "0" => Some(false),
        _ => None,
    };
    for line in text.lines() {
        let Some((key, value)) = line.trim().split_once(char::is_whitespace) else {
            continue;
        };
        let value = value.trim();
        match key {
            "ecc_volatile_uncorrected" => health.ecc_volatile_uncorrected = value.parse().ok(),
            "ecc_aggregate_uncorrected" => health.ecc_aggregate_uncorrected = value.parse().ok(),
            "retired_pages_pending" => health.retired_pages_pending = flag(value),
            "row_remap_pending" => health.row_remap_pending = flag(value),
            "row_remap_failure" => health.row_remap_failure = flag(value),
            "recovery_action" => health.recovery_action = Recovery::parse(value),
            _ => {}
        }
    }
    health
}

/// The PIDs of a /proc/PID/status's `NSpid:` line, outermost first.
fn nspids(status: &[u8]) -> Option<Vec<u32>> {
    let line = status
        .split(|&byte| byte == b'\n')
        .find_map(|line| line.strip_prefix(b"NSpid:"))?;
    std::str::from_utf8(line)
        .ok()?
        .split_whitespace()
        .map(|pid| pid.parse().ok())
        .collect()
}

/// `DIR/omit-other-namespaces`: the lists as a driver that omits other PID
/// namespaces' processes gives them to the caller. A process of the
/// caller's namespace (or one below it) is listed by its PID there, the
/// entry of its `NSpid` at the caller's depth (`host-proc/self`: the
/// caller's own line in the host's proc); any other is left out, its
/// memory still in the GPU's use. Two namespaces at the caller's depth are
/// not told apart: the tests stage none. Where the caller's depth cannot
/// be read, nothing is listed.
fn omit_other_namespaces(
    root: &Path,
    gpus: Vec<Result<GpuInfo, DriverError>>,
) -> Vec<Result<GpuInfo, DriverError>> {
    let read = |name: &str| {
        std::fs::read(root.join(name).join("status"))
            .ok()
            .and_then(|status| nspids(&status))
    };
    let depth = read("self").map(|pids| pids.len().saturating_sub(1));
    gpus.into_iter()
        .map(|gpu| {
            gpu.map(|mut gpu| {
                gpu.processes = gpu
                    .processes
                    .into_iter()
                    .filter_map(|process| {
                        let pids = read(&process.pid.to_string())?;
                        let pid = *pids.get(depth?)?;
                        Some(DriverProcess { pid, ..process })
                    })
                    .collect();
                gpu
            })
        })
        .collect()
}

/// The part of `scan` about the processes `pids`.
fn only(scan: &proc::ProcScan, pids: &BTreeSet<u32>) -> proc::ProcScan {
    proc::ProcScan {
        processes: scan
            .processes
            .iter()
            .filter(|record| pids.contains(&record.id.pid))
            .cloned()
            .collect(),
        unreadable: scan
            .unreadable
            .iter()
            .filter(|entry| pids.contains(&entry.pid))
            .cloned()
            .collect(),
    }
}

/// A simulated GPU's UUID, fixed by its index.
fn sim_uuid(index: u32) -> String {
    format!("GPU-sim-{index:08}")
}

impl Driver for SimDriver {
    fn describe(&self) -> String {
        format!("sim:{}", self.dir.display())
    }

    fn gpu_count(&self) -> Result<u32, DriverError> {
        Ok(SimDriver::gpu_count(self))
    }

    fn known_uuid(&self, index: u32) -> Option<String> {
        (index < SimDriver::gpu_count(self)).then(|| sim_uuid(index))
    }

    fn pci_bus_id(&self, index: u32) -> Option<String> {
        (index < SimDriver::gpu_count(self)).then(|| sim_pci_bus_id(index))
    }

    /// `DIR/health.N`, read on each call; a bad or absent file says nothing.
    fn health(&self, index: u32) -> Health {
        let name = format!("health.{index}");
        match read_bounded(
            &self.directory,
            &name,
            &self.dir.join(&name),
            NUMBER_FILE_LIMIT * 8,
        ) {
            Ok(Some(content)) => parse_health(&String::from_utf8_lossy(&content)),
            _ => Health::default(),
        }
    }

    /// `DIR/activity.N`, read on each call; a bad or absent file says nothing.
    fn activity(&self, index: u32) -> Activity {
        let name = format!("activity.{index}");
        match read_bounded(
            &self.directory,
            &name,
            &self.dir.join(&name),
            ACTIVITY_FILE_LIMIT,
        ) {
            Ok(Some(content)) => parse_activity(&String::from_utf8_lossy(&content)),
            _ => Activity::default(),
        }
    }

    /// `persistence_mode on|off` in `DIR/health.N`.
    fn persistence_mode(&self, index: u32) -> Option<bool> {
        let name = format!("health.{index}");
        let content = read_bounded(
            &self.directory,
            &name,
            &self.dir.join(&name),
            NUMBER_FILE_LIMIT * 8,
        )
        .ok()
        .flatten()?;
        String::from_utf8_lossy(&content).lines().find_map(|line| {
            match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["persistence_mode", "on"] => Some(true),
                ["persistence_mode", "off"] => Some(false),
                _ => None,
            }
        })
    }

    /// `DIR/modules` (in /proc/modules' format) and `DIR/nvswitch` (a
    /// marker) stand in for the host's: it is never read.
    fn platform(&self) -> Platform {
        let modules = read_bounded(
            &self.directory,
            "modules",
            &self.dir.join("modules"),
            GPUS_FILE_LIMIT,
        )
        .ok()
        .flatten()
        .map(|content| evidence::parse_modules(&String::from_utf8_lossy(&content)))
        .unwrap_or_default();
        let nvswitch =
            rustix::fs::statat(&self.directory, "nvswitch", AtFlags::SYMLINK_NOFOLLOW).is_ok();
        Platform {
            modules,
            nvswitch: Some(nvswitch),
        }
    }

    /// `DIR/kmsg` stands in for `/dev/kmsg`: the host's is never read.
    fn kernel_log(&self) -> KernelLog {
        evidence::file_kernel_log(&self.dir.join("kmsg"))
    }

    /// What `DIR/bookkeeping` declared when the driver opened; 0 without it.
    fn bookkeeping_slack(&self) -> u64 {
        self.bookkeeping
    }

    /// Only where `DIR/omit-other-namespaces` was there at open: without
    /// it, the lists hold every process of the /proc it reads (this
    /// namespace's, or `DIR/host-proc`'s), as a driver that lists host PIDs.
    fn may_omit_other_namespaces(&self) -> bool {
        self.omit_other_namespaces
    }

    fn gpu(&self, index: u32) -> Result<GpuInfo, DriverError> {
        if index >= SimDriver::gpu_count(self) {
            return Err(DriverError::Sim(format!("no GPU {index}")));
        }
        self.answer()?.swap_remove(index as usize)
    }

    fn gpus(&self) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
        self.answer()
    }

    /// From `DIR/gpus` and `DIR/mig.N` as read at open, and the lost
    /// markers: no /proc scan, no process list, no figures.
    fn layout(&self) -> Result<Vec<Result<GpuInfo, DriverError>>, DriverError> {
        Ok((0..SimDriver::gpu_count(self))
            .map(|index| {
                if self.is_lost(index)? {
                    return Err(DriverError::GpuLost { index });
                }
                let staged = self.mig.get(index as usize).and_then(Option::as_ref);
                Ok(GpuInfo {
                    index,
                    name: Some(self.gpus[index as usize].1.clone()),
                    uuid: Some(sim_uuid(index)),
                    memory_total: Some(self.gpus[index as usize].0),
                    memory_used: None,
                    memory_reserved: self.reserved[index as usize],
                    processes: Vec::new(),
                    pci_bus_id: Some(sim_pci_bus_id(index)),
                    mig_mode: Some(staged.is_some()),
                    instances: staged.map_or_else(Vec::new, |staged| mig::instances(staged)),
                    mps_clients: BTreeSet::new(),
                })
            })
            .collect())
    }

    /// One /proc pass for all of them, not one per GPU.
    fn memory_used_of(&self, indexes: &BTreeSet<u32>) -> Figures {
        self.figures(self.gpus(), indexes)
    }

    /// The watch (`events`) starts here, before the caller's first reading.
    fn will_wait(&self) {
        self.start_events();
    }

    /// Memory on the simulated driver changes only when a holder closes
    /// its node or exits, or a file of the directory changes (a leak, a lost
    /// GPU, a new claim): so when `last` is what this driver answered last
    /// (a snapshot just read it), only the holders behind that answer and
    /// those files are watched (`watch`), with no /proc scan; otherwise one
    /// reading catches up with what changed since `last` first. A new
    /// holder that writes no claim is left to the caller's next full look.
    fn wait_for_change(
        &self,
        last: &BTreeMap<u32, Option<u64>>,
        poll: Duration,
        limit: Duration,
    ) -> Option<Figures> {
        let gpus: BTreeSet<u32> = last.keys().copied().collect();
        // A wait not announced (`will_wait`) starts watching here, and reads
        // once more so that its scan is the baseline the events count from
        // (`events`): opens before the watches were there would go unseen.
        let started = self.start_events();
        let known = self
            .known
            .lock()
            .ok()
            .filter(|known| !started && known.matches(last))
            .map(|known| known.narrowed(last));
        let watched = match known {
            Some(known) => known,
            None => {
                let now = self.memory_used_of(&gpus);
                if changed(&now, last) {
                    return Some(now);
                }
                match self.known.lock() {
                    Ok(known) => known.narrowed(last),
                    Err(_) => return Some(now),
                }
            }
        };
        let classify = |path: &Path| self.classify_node(path);
        let backstop = match self.events() {
            Some(_) => HOLDER_POLL,
            None => HOLDER_POLL_BLIND,
        };
        let changed = watch::changed_within(
            &watched,
            &classify,
            || self.file_states(gpus.iter().copied()),
            poll.max(backstop),
            limit,
            self.events(),
            &self.kept,
        );
        if !changed {
            return None;
        }
        Some(
            self.released(&gpus)
                .unwrap_or_else(|| self.memory_used_of(&gpus)),
        )
    }

    /// A reset as the real driver does it: refused while any process holds
    /// the GPU's node (nvidia-smi: "in use by another client"), else the
    /// driver-held memory (`leak.N`) is gone.
    fn reset(&self, index: u32) -> Result<(), DriverError> {
        if index >= SimDriver::gpu_count(self) {
            return Err(DriverError::Sim(format!("no GPU {index}")));
        }
        if self.is_lost(index)? {
            return Err(DriverError::GpuLost { index });
        }
        let scan = self.scan()?;
        let claims = self.claims()?;
        let holders = self.holders_in(&scan, claims.as_ref())?;
        if let Some(pids) = holders.get(&index).filter(|pids| !pids.is_empty()) {
            let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
            return Err(DriverError::Sim(format!(
                "GPU {index} is in use (device node open by pid {}): not reset",
                pids.join(", ")
            )));
        }
        // A reset is of the whole GPU: every instance's leak goes with it.
        let names = std::iter::once(format!("leak.{index}")).chain(
            (0..self.instance_count(index)).map(|instance| format!("leak.{index}.{instance}")),
        );
        for name in names {
            match rustix::fs::unlinkat(&self.directory, name.as_str(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(error) => {
                    return Err(DriverError::Sim(format!(
                        "cannot reset GPU {index}: cannot remove {}: {}",
                        self.dir.join(name).display(),
                        std::io::Error::from(error)
                    )));
                }
            }
        }
        Ok(())
    }

    fn classify_node(&self, path: &Path) -> Option<Node> {
        let rest = path.to_str()?.strip_prefix(&self.node_prefix)?;
        if rest == "ctl" {
            return Some(Node::Control);
        }
        rest.parse()
            .ok()
            .filter(|&index| index < SimDriver::gpu_count(self))
            .map(Node::Gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `DIR/activity.N`: what does not read says nothing (never 0), and
    /// `process_sm none` is per-process figures with nobody above 0.
    #[test]
    fn activity_files_say_only_what_reads() {
        let activity = parse_activity(
            "utilization 101\ntemperature 64\npower 312.5\npower_limit -1\nprocess_sm 42 41\nprocess_sm 43 x\nfan 80\n",
        );
        assert_eq!(activity.utilization_percent, None);
        assert_eq!(activity.temperature_celsius, Some(64));
        assert_eq!(activity.power_draw_milliwatts, Some(312_500));
        assert_eq!(activity.power_limit_milliwatts, None);
        assert_eq!(
            activity.process_sm_percent,
            Some(BTreeMap::from([(42, 41)]))
        );
        assert_eq!(
            (activity.sm_percent(42), activity.sm_percent(7)),
            (Some(41), Some(0))
        );
        assert_eq!(parse_activity("").sm_percent(42), None);
        assert_eq!(
            parse_activity("process_sm none\n").process_sm_percent,
            Some(BTreeMap::new())
        );
    }

    /// `DIR/reserved`: a byte count a line, an empty or missing line unsaid,
    /// anything else an error naming the line.
    #[test]
    fn reserved_lines_are_byte_counts_or_unsaid() {
        let path = Path::new("/sim/reserved");
        assert_eq!(
            parse_reserved(b"503316480\n\n", path, 3),
            Ok(vec![Some(503_316_480), None, None])
        );
        let error = parse_reserved(b"480MiB\n", path, 1).expect_err("not a byte count");
        assert!(error.to_string().contains("line 1"), "{error}");
    }

    /// These GPUs' memory as the driver reads it now: the `last` a wait starts from.
    fn figures<const N: usize>(driver: &SimDriver, gpus: [u32; N]) -> BTreeMap<u32, Option<u64>> {
        driver
            .memory_used_of(&gpus.into())
            .into_iter()
            .map(|(index, used)| (index, used.expect("read")))
            .collect()
    }

    /// A look opens no inotify instance (its teardown as the command exits
    /// costs 6-20 ms); `will_wait`, or else the first wait, starts one, and
    /// the wait sees the release.
    /// (That the release is then read without another scan:
    /// `incidents::wait_reads_a_release_without_another_scan`.)
    #[test]
    fn only_a_wait_starts_watching_the_nodes() {
        use super::incident::{Holder, Incident, SimHost};
        let host = SimHost::new(2, 80 << 30, "Simulated H200").expect("host");
        let mut incident = Incident::new(&host);
        let holder = incident
            .holder(&Holder::new("sglang::scheduler_TP0").on(0, 30 << 30))
            .expect("holder");
        let driver = SimDriver::open(host.path()).expect("driver opens");
        let last = figures(&driver, [0]);
        assert_eq!(last[&0], Some(30 << 30));
        assert!(driver.events.get().is_none(), "a look started watching");
        assert!(
            driver
                .wait_for_change(&last, Duration::from_millis(5), Duration::from_millis(50))
                .is_none(),
            "nothing changed"
        );
        assert!(driver.events().is_some(), "the wait did not start watching");
        incident.kill(holder).expect("kill");
        let now = driver
            .wait_for_change(&last, Duration::from_millis(5), Duration::from_secs(10))
            .expect("the release is seen");
        assert_eq!(now[&0].as_ref().ok().copied().flatten(), Some(0));
        // A caller that says it will wait has the watch before its reading.
        let announced = SimDriver::open(host.path()).expect("driver opens");
        announced.will_wait();
        assert!(
            announced.events().is_some(),
            "will_wait did not start watching"
        );
    }

    /// A wait that ends with nothing changed keeps its holders' pidfds for
    /// the next wait on them (the watch waits in 200 ms pieces), and an exit
    /// between two waits is still seen by the next one.
    #[test]
    fn a_wait_keeps_its_holders_for_the_next_and_sees_an_exit_between() {
        use super::incident::{Holder, Incident, SimHost};
        let host = SimHost::new(2, 80 << 30, "Simulated H200").expect("host");
        let mut incident = Incident::new(&host);
        let first = incident
            .holder(&Holder::new("sglang::scheduler_TP0").on(0, 30 << 30))
            .expect("holder");
        incident
            .holder(&Holder::new("sglang::scheduler_TP1").on(1, 20 << 30))
            .expect("holder");
        let driver = SimDriver::open(host.path()).expect("driver opens");
        driver.will_wait();
        let last = figures(&driver, [0, 1]);
        assert_eq!(last[&0], Some(30 << 30));
        let wait =
            || driver.wait_for_change(&last, Duration::from_millis(5), Duration::from_millis(30));
        assert!(wait().is_none(), "nothing changed");
        let kept = driver.kept.lock().expect("kept").pidfds();
        let pids: BTreeSet<u32> = kept.iter().map(|&(pid, _)| pid).collect();
        assert_eq!(pids.len(), 2, "the holders were not kept: {kept:?}");
        assert!(wait().is_none(), "nothing changed");
        assert_eq!(
            driver.kept.lock().expect("kept").pidfds(),
            kept,
            "the second wait opened its holders again"
        );
        incident.kill(first).expect("kill");
        let now = driver
            .wait_for_change(&last, Duration::from_millis(5), Duration::from_secs(10))
            .expect("the exit between the waits is seen");
        assert_eq!(now[&0].as_ref().ok().copied().flatten(), Some(0));
        assert_eq!(now[&1].as_ref().ok().copied().flatten(), Some(20 << 30));
    }

    /// A kept holder that, alive, puts another file on the descriptor it
    /// held the node by (dup2) has let go: the next wait sees the release,
    /// though the process and its descriptor number are both still there.
    #[test]
    fn a_kept_holder_that_swaps_its_descriptor_between_waits_has_let_go() {
        use super::incident::SimHost;
        let host = SimHost::new(2, 80 << 30, "Simulated H200").expect("host");
        let script = r#"
import os, signal, sys
d = sys.argv[1]
for gpu, claim in (("1", "none"), ("0", str(30 << 30))):
    with open(f"{d}/claims/{os.getpid()}.{gpu}", "w") as f:
        f.write(claim + "\n")
fd = os.open(f"{d}/nvidia0", os.O_RDONLY)
def swap(*_):
    other = os.open("/dev/null", os.O_RDONLY)
    os.dup2(other, fd)
    os.close(other)
    print("swapped", flush=True)
signal.signal(signal.SIGUSR1, swap)
print(fd, flush=True)
while True:
    signal.pause()
"#;
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(host.path())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        struct Killed(std::process::Child);
        impl Drop for Killed {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().expect("out")));
        let holder = Killed(child);
        let fd: u32 = lines
            .next()
            .expect("ready")
            .expect("line")
            .parse()
            .expect("fd");
        let driver = SimDriver::open(host.path()).expect("driver opens");
        driver.will_wait();
        let last = figures(&driver, [0]);
        assert_eq!(last[&0], Some(30 << 30));
        let wait = |limit| driver.wait_for_change(&last, Duration::from_millis(5), limit);
        assert!(wait(Duration::from_millis(30)).is_none(), "nothing changed");
        assert_eq!(
            driver.kept.lock().expect("kept").pidfds().len(),
            1,
            "the holder was not kept"
        );
        let pid = rustix::process::Pid::from_raw(holder.0.id() as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::USR1).expect("signal");
        assert_eq!(lines.next().expect("swapped").expect("line"), "swapped");
        let link = std::fs::read_link(format!("/proc/{}/fd/{fd}", holder.0.id())).expect("link");
        assert_eq!(
            link,
            Path::new("/dev/null"),
            "the descriptor is still there"
        );
        let now = wait(Duration::from_secs(10)).expect("the swap is seen as a release");
        assert_eq!(now[&0].as_ref().ok().copied().flatten(), Some(0));
    }

    #[test]
    fn bad_content_is_described_not_dumped() {
        assert_eq!(describe(b" 12x \n"), "'12x'");
        assert_eq!(describe(b""), "an empty file");
        assert_eq!(describe(&[0xff, 0, 1]), "3 bytes of binary data");
        assert_eq!(
            describe("root:x:0:0:root:/root:/bin/bash\nbin:x:2:2\n".as_bytes()),
            "42 bytes of text"
        );
    }

    #[test]
    fn byte_counts() {
        let path = Path::new("/d/leak.0");
        assert_eq!(parse_bytes(b"1073741824\n", path), Ok(1 << 30));
        assert_eq!(parse_bytes(b"18446744073709551615", path), Ok(u64::MAX));
        for bad in [
            &b"18446744073709551616"[..],
            b"-1",
            b"+5",
            b"1 GiB",
            b"",
            b"\xff",
        ] {
            let error = parse_bytes(bad, path).expect_err("refused");
            assert!(
                error
                    .to_string()
                    .contains("/d/leak.0: expected a byte count")
            );
        }
    }

    #[test]
    fn claims() {
        let path = Path::new("/d/claims/7.0");
        assert_eq!(parse_claim(b"none\n", path), Ok(Claim::NodeOnly));
        assert_eq!(parse_claim(b"unknown", path), Ok(Claim::Unreported));
        assert_eq!(parse_claim(b" 4096 ", path), Ok(Claim::Context(4096)));
        assert_eq!(parse_claim(b"0", path), Ok(Claim::Context(0)));
        let error = parse_claim(b"NONE", path).expect_err("refused");
        assert!(
            error.to_string().contains(
                "/d/claims/7.0: expected a byte count, 'none' or 'unknown', found 'NONE'"
            ),
            "{error}"
        );
    }

    #[test]
    fn gpus_file_lines() {
        let path = Path::new("/d/gpus");
        assert_eq!(
            parse_gpus(b"100 NVIDIA H200\n\n", path, 3),
            Ok(vec![
                (100, "NVIDIA H200".to_string()),
                (DEFAULT_TOTAL, DEFAULT_NAME.to_string()),
                (DEFAULT_TOTAL, DEFAULT_NAME.to_string()),
            ])
        );
        let error = parse_gpus(b"100\nlots H200\n", path, 2).expect_err("refused");
        assert!(error.to_string().contains("/d/gpus line 2"), "{error}");
        assert!(parse_gpus(b"100 a\x1b[2Jb\n", path, 1).is_err());
    }
}
