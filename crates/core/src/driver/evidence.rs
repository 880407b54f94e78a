//! Hardware evidence: what the driver says about a GPU besides its memory.
//!
//! Memory held by no process and a lost GPU usually have a cause the driver
//! logged or counted: an Xid in the kernel log (`NVRM: Xid (PCI:…): N, …`),
//! uncorrectable ECC errors, retired pages or remapped rows waiting for a
//! reset, a recovery action NVML asks for. This module reads the kernel log
//! (`/dev/kmsg`, else `journalctl -k`; the simulated driver's `DIR/kmsg`),
//! keeps only the kernel's own records (facility 0: a line a user wrote to
//! `/dev/kmsg` has facility 1 and never counts), maps each Xid to its GPU by
//! PCI bus id, and turns the whole into advice ("Xid 79 at 03:12: a reset
//! will not help; reboot the node"). Every read is bounded (records, bytes,
//! time) and a value that cannot be read is `None`, never 0.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

/// The most Xid events kept from one read of the kernel log (the newest).
pub(crate) const EVENTS_KEPT: usize = 1024;
/// The most records read from `/dev/kmsg` in one pass.
const RECORDS_READ: usize = 1 << 20;
/// The longest a read of the kernel log may take.
const READ_TIME: Duration = Duration::from_secs(2);
/// The most bytes read from the end of a kernel-log file (`DIR/kmsg`) or
/// taken from journalctl.
pub(crate) const FILE_TAIL: u64 = 16 << 20;
/// The longest detail kept of one Xid line, in characters.
const DETAIL_CHARS: usize = 200;

/// The Xids that drain a node and make `check` report a problem unless
/// `--drain-xids` says otherwise (docs/evidence.md gives each its meaning).
pub const DEFAULT_DRAIN_XIDS: [u32; 9] = [48, 62, 64, 74, 79, 95, 119, 120, 140];

/// A PCI address as the kernel log and NVML name a GPU: domain, bus, device
/// (the function is always 0 for a GPU and is not compared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
}

impl PciAddress {
    /// Reads `0000:3b:00` (the kernel log's), `00000000:3B:00.0` (NVML's) or
    /// `0000:3b:00.0` (sysfs's).
    pub fn parse(text: &str) -> Option<PciAddress> {
        let text = text.strip_prefix("PCI:").unwrap_or(text);
        let without_function = match text.rsplit_once('.') {
            Some((head, function))
                if !function.is_empty() && function.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                head
            }
            Some(_) => return None,
            None => text,
        };
        let mut parts = without_function.split(':');
        let (domain, bus, device) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || domain.len() > 8 || bus.len() != 2 || device.len() != 2 {
            return None;
        }
        let hex = |part: &str| {
            (!part.is_empty() && part.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(part, 16).ok())
                .flatten()
        };
        Some(PciAddress {
            domain: hex(domain)?,
            bus: u8::try_from(hex(bus)?).ok()?,
            device: u8::try_from(hex(device)?).ok()?,
        })
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}",
            self.domain, self.bus, self.device
        )
    }
}

/// One Xid the kernel logged.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct XidEvent {
    pub xid: u32,
    /// The GPU's PCI address as the line gave it (`0000:3b:00`).
    pub pci: String,
    #[serde(skip)]
    pub address: PciAddress,
    /// When, in microseconds since boot (the record's timestamp).
    pub since_boot_us: Option<u64>,
    /// When, in seconds since the epoch: the boot time plus the above.
    pub at: Option<u64>,
    /// The process the driver named, where it named one.
    pub pid: Option<u32>,
    pub name: Option<String>,
    /// The rest of the line, cut to 200 characters (untrusted: escape it).
    pub detail: String,
}

/// NVIDIA's meaning of an Xid (the Xid catalog of the driver documentation),
/// for the Xids gpureap names; `None` for the others.
pub fn meaning(xid: u32) -> Option<&'static str> {
    Some(match xid {
        13 => "graphics engine exception (usually the application's fault)",
        31 => "GPU memory page fault (usually an application's illegal address)",
        32 => "invalid or corrupted push buffer stream",
        43 => "GPU stopped processing (a channel reset after an application fault)",
        45 => "preemptive cleanup after earlier errors (a process ended or was killed)",
        48 => "double-bit (uncorrectable) ECC error",
        61 => "internal micro-controller breakpoint or warning",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping recorded (takes effect at the next reset)",
        64 => "ECC page retirement or row remapping recording failure",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error (the application using the memory was ended)",
        95 => "uncontained ECC error",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        140 => "unrecovered ECC error",
        143 => "GPU initialization failure",
        154 => "GPU recovery action changed",
        _ => return None,
    })
}

/// What an Xid asks of the operator, most severe last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Remedy {
    /// The application's fault or a contained error: nothing for the GPU.
    None,
    /// A GPU reset clears it (once nothing uses the GPU).
    Reset,
    /// A reset will not help: reboot the node.
    Reboot,
}

impl Remedy {
    pub(crate) fn of_xid(xid: u32) -> Remedy {
        match xid {
            79 | 64 | 143 => Remedy::Reboot,
            48 | 62 | 63 | 74 | 92 | 95 | 119 | 120 | 140 => Remedy::Reset,
            _ => Remedy::None,
        }
    }

    fn advice(self, index: u32) -> String {
        match self {
            Remedy::None => "the process that caused it ended; the GPU needs nothing".to_string(),
            Remedy::Reset => format!(
                "reset the GPU once nothing uses it (gpureap reset --plan --gpu {index}), else reboot the node"
            ),
            Remedy::Reboot => "a reset will not help; reboot the node".to_string(),
        }
    }
}

/// What NVML's recovery action field asks for (driver 550 and later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Recovery {
    None,
    GpuReset,
    NodeReboot,
    DrainP2p,
    DrainAndReset,
}

impl Recovery {
    pub(crate) fn from_nvml(value: u64) -> Option<Recovery> {
        Some(match value {
            0 => Recovery::None,
            1 => Recovery::GpuReset,
            2 => Recovery::NodeReboot,
            3 => Recovery::DrainP2p,
            4 => Recovery::DrainAndReset,
            _ => return None,
        })
    }

    pub fn parse(text: &str) -> Option<Recovery> {
        Some(match text {
            "none" => Recovery::None,
            "gpu_reset" => Recovery::GpuReset,
            "node_reboot" => Recovery::NodeReboot,
            "drain_p2p" => Recovery::DrainP2p,
            "drain_and_reset" => Recovery::DrainAndReset,
            _ => return None,
        })
    }

    fn remedy(self) -> Remedy {
        match self {
            Recovery::None | Recovery::DrainP2p => Remedy::None,
            Recovery::GpuReset | Recovery::DrainAndReset => Remedy::Reset,
            Recovery::NodeReboot => Remedy::Reboot,
        }
    }
}

/// What the driver counts about a GPU's health. Each is `None` where the
/// driver does not say (no ECC, an older driver, the `none` backend).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Health {
    pub ecc_volatile_uncorrected: Option<u64>,
    pub ecc_aggregate_uncorrected: Option<u64>,
    pub retired_pages_pending: Option<bool>,
    pub row_remap_pending: Option<bool>,
    pub row_remap_failure: Option<bool>,
    pub recovery_action: Option<Recovery>,
}

/// Everything known of one GPU's hardware: its health counters and the
/// Xids the kernel logged for its PCI address since boot.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Evidence {
    pub pci_bus_id: Option<String>,
    #[serde(flatten)]
    pub health: Health,
    /// How many times each Xid was logged for this GPU (of those read).
    pub xid_counts: BTreeMap<u32, u64>,
    /// The newest Xids, newest first, at most `SHOWN` of them.
    pub xids: Vec<XidEvent>,
}

/// The most Xid events shown per GPU.
pub(crate) const SHOWN: usize = 8;

impl Evidence {
    /// The advice lines this evidence implies, the most severe first; empty
    /// when it implies nothing.
    pub fn advice(&self, index: u32) -> Vec<String> {
        let mut lines = Vec::new();
        // The newest event of each Xid, most severe remedy first.
        let mut seen = BTreeSet::new();
        let mut newest: Vec<&XidEvent> = self
            .xids
            .iter()
            .filter(|event| seen.insert(event.xid))
            .collect();
        newest.sort_by_key(|event| std::cmp::Reverse(Remedy::of_xid(event.xid)));
        for event in newest {
            let what = meaning(event.xid).unwrap_or("an Xid gpureap does not know");
            lines.push(format!(
                "Xid {}{} ({what}): {}",
                event.xid,
                event
                    .at
                    .map(|at| format!(" at {}", clock(at)))
                    .unwrap_or_default(),
                Remedy::of_xid(event.xid).advice(index)
            ));
        }
        let health = &self.health;
        if health.row_remap_failure == Some(true) {
            lines.push(format!(
                "row remapping failed: {}",
                Remedy::Reboot.advice(index)
            ));
        }
        if health.row_remap_pending == Some(true) || health.retired_pages_pending == Some(true) {
            lines.push(format!(
                "{} pending: {}",
                if health.row_remap_pending == Some(true) {
                    "row remap"
                } else {
                    "page retirement"
                },
                Remedy::Reset.advice(index)
            ));
        }
        if let Some(recovery) = health.recovery_action.filter(|r| *r != Recovery::None) {
            lines.push(format!(
                "the driver asks for recovery action {}: {}",
                serde_json::to_value(recovery)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                recovery.remedy().advice(index)
            ));
        }
        lines
    }

    /// The newest event of each Xid in `list`.
    pub fn listed<'a>(&'a self, list: &BTreeSet<u32>) -> Vec<&'a XidEvent> {
        let mut seen = BTreeSet::new();
        self.xids
            .iter()
            .filter(|event| list.contains(&event.xid) && seen.insert(event.xid))
            .collect()
    }
}

/// The evidence of a snapshot's GPUs, and which Xids are a problem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hardware {
    pub evidence: BTreeMap<u32, Evidence>,
    /// What the read of the kernel log left unknown.
    pub note: Option<String>,
    /// The Xids that drain a node and make `check` report a problem.
    pub drain_xids: BTreeSet<u32>,
}

impl Hardware {
    /// Reads the evidence of these GPUs from the driver, once.
    pub fn gather(
        driver: &dyn super::Driver,
        indexes: &BTreeSet<u32>,
        drain_xids: BTreeSet<u32>,
    ) -> Hardware {
        let (evidence, note) = driver.evidence(indexes);
        Hardware {
            evidence,
            note,
            drain_xids,
        }
    }

    /// The newest event of each Xid of the drain list logged for this GPU.
    pub fn drain_events(&self, index: u32) -> Vec<&XidEvent> {
        self.evidence
            .get(&index)
            .map(|evidence| evidence.listed(&self.drain_xids))
            .unwrap_or_default()
    }

    /// The advice for this GPU, each line prefixed `GPU N: `.
    pub fn advice(&self, index: u32) -> Vec<String> {
        self.evidence
            .get(&index)
            .map(|evidence| {
                evidence
                    .advice(index)
                    .into_iter()
                    .map(|line| format!("GPU {index}: {line}"))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Reads `--drain-xids`: numbers separated by commas, or `none`.
pub fn parse_xid_list(text: &str) -> Result<BTreeSet<u32>, String> {
    if text.trim() == "none" {
        return Ok(BTreeSet::new());
    }
    text.split(',')
        .map(|part| {
            part.trim()
                .parse::<u32>()
                .ok()
                .filter(|xid| (1..=9999).contains(xid))
                .ok_or_else(|| {
                    format!(
                        "invalid Xid '{}' in '{text}': expected numbers from 1 to 9999 separated by commas (48,79), or none",
                        part.trim()
                    )
                })
        })
        .collect()
}

/// The default drain list as `--drain-xids` takes it.
pub fn default_drain_list() -> String {
    DEFAULT_DRAIN_XIDS
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A kernel module of the NVIDIA driver and how many hold it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Module {
    pub name: String,
    /// Its reference count (`/proc/modules`' third field); `None` unread.
    pub refcount: Option<u32>,
}

/// What the platform says about a GPU reset besides the processes: the
/// driver's modules and whether GPUs are joined through NVSwitches (HGX).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Platform {
    pub modules: Vec<Module>,
    /// NVSwitches found (`/proc/driver/nvidia-nvswitch/devices`); `None`
    /// where the platform does not tell.
    pub nvswitch: Option<bool>,
}

/// The NVIDIA modules of a `/proc/modules` text (`name size refcount deps
/// state address`), at most 64 KiB of it read.
pub(crate) fn parse_modules(text: &str) -> Vec<Module> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next()?;
            if !name.starts_with("nvidia") {
                return None;
            }
            let _size = fields.next();
            Some(Module {
                name: name.chars().take(64).collect(),
                refcount: fields.next().and_then(|count| count.parse().ok()),
            })
        })
        .collect()
}

/// The host's platform: `/proc/modules`, and NVSwitch devices as the
/// nvswitch driver lists them.
pub(crate) fn host_platform() -> Platform {
    let modules = read_tail(Path::new("/proc/modules"))
        .ok()
        .flatten()
        .map(|text| parse_modules(&text))
        .unwrap_or_default();
    let nvswitch = match std::fs::read_dir("/proc/driver/nvidia-nvswitch/devices") {
        Ok(mut entries) => Some(entries.next().is_some()),
        Err(_) if Path::new("/proc/driver/nvidia").exists() => Some(false),
        Err(_) => None,
    };
    Platform { modules, nvswitch }
}

/// `HH:MM` UTC of a time in seconds since the epoch, today's or not.
pub fn clock(at: u64) -> String {
    format!("{:02}:{:02} UTC", at / 3600 % 24, at / 60 % 60)
}

/// The Xids one read of the kernel log found, newest first, and where from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelLog {
    pub events: Vec<XidEvent>,
    /// Where they came from: `/dev/kmsg`, `journalctl -k`, a file.
    pub source: Option<String>,
    /// Why no log could be read, or what was left out.
    pub note: Option<String>,
}

/// Reads one kmsg record's message: `prio,seq,ts,flags[,…];message`, the
/// kernel's facility only. `None` for a record that is not an Xid line, is
/// cut short, or was written by a user.
pub(crate) fn parse_record(record: &str) -> Option<XidEvent> {
    let (header, message) = record.split_once(';')?;
    let mut fields = header.split(',');
    let prio: u32 = fields.next()?.trim().parse().ok()?;
    if prio >> 3 != 0 {
        return None;
    }
    let _sequence: u64 = fields.next()?.parse().ok()?;
    let since_boot_us: u64 = fields.next()?.parse().ok()?;
    // The message ends at the first newline: what follows are the record's
    // continuation lines (` KEY=value`).
    let message = message.split('\n').next().unwrap_or_default();
    let mut event = parse_xid_message(message)?;
    event.since_boot_us = Some(since_boot_us);
    Some(event)
}

/// Reads `NVRM: Xid (PCI:0000:3b:00): 79, pid=…, name=…, detail` in the
/// formats the drivers have written it: with or without `PCI:`, with or
/// without `pid=` and `name=` (quoted or not, `<unknown>`), with or without
/// a detail.
pub(crate) fn parse_xid_message(message: &str) -> Option<XidEvent> {
    let rest = message.trim_start().strip_prefix("NVRM: Xid (")?;
    let (pci, rest) = rest.split_once("): ")?;
    let address = PciAddress::parse(pci)?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 6 {
        return None;
    }
    let xid: u32 = rest[..digits].parse().ok()?;
    let mut rest = &rest[digits..];
    if !(rest.is_empty() || rest.starts_with(',')) {
        return None;
    }
    rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    let mut pid = None;
    let mut name = None;
    if let Some(after) = rest.strip_prefix("pid=") {
        let (value, tail) = after.split_once(',').unwrap_or((after, ""));
        pid = value.trim_matches('\'').parse().ok();
        rest = tail.trim_start();
        if let Some(after) = rest.strip_prefix("name=") {
            let (value, tail) = after.split_once(", ").unwrap_or((after, ""));
            let value = value.trim_end_matches(',').trim_matches('\'');
            if value != "<unknown>" && !value.is_empty() {
                name = Some(value.chars().take(64).collect());
            }
            rest = tail;
        }
    }
    Some(XidEvent {
        xid,
        pci: address.to_string(),
        address,
        since_boot_us: None,
        at: None,
        pid,
        name,
        detail: rest.trim().chars().take(DETAIL_CHARS).collect(),
    })
}

/// The newest `EVENTS_KEPT` Xids of a kmsg-format text (one record per line,
/// as the simulated driver's `DIR/kmsg`), newest first. A first line that
/// may be cut (the text is a file's tail) is parsed like any other: a cut
/// record fails to parse.
pub(crate) fn parse_text(text: &str) -> Vec<XidEvent> {
    let mut kept = VecDeque::new();
    for line in text.lines() {
        if let Some(event) = parse_record(line) {
            if kept.len() == EVENTS_KEPT {
                kept.pop_front();
            }
            kept.push_back(event);
        }
    }
    kept.into_iter().rev().collect()
}

/// Reads `/dev/kmsg` (or a device like it) without blocking: each read is
/// one record; the end is `EAGAIN`; records overwritten while reading
/// (`EPIPE`) are skipped. Bounded in records, time and events kept.
pub fn read_kmsg(path: &Path) -> std::io::Result<Vec<XidEvent>> {
    let file = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let started = Instant::now();
    let mut buffer = vec![0u8; 16 << 10];
    let mut kept = VecDeque::new();
    for _ in 0..RECORDS_READ {
        let read = match rustix::io::read(&file, &mut buffer) {
            Ok(0) | Err(Errno::AGAIN) => break,
            Ok(read) => read,
            Err(Errno::PIPE) | Err(Errno::INTR) => continue,
            // A record larger than the buffer (never, at 16 KiB) stops the read.
            Err(Errno::INVAL) => break,
            Err(error) => return Err(error.into()),
        };
        let record = String::from_utf8_lossy(&buffer[..read]);
        if let Some(event) = parse_record(&record) {
            if kept.len() == EVENTS_KEPT {
                kept.pop_front();
            }
            kept.push_back(event);
        }
        if started.elapsed() > READ_TIME {
            break;
        }
    }
    Ok(kept.into_iter().rev().collect())
}

/// The last `FILE_TAIL` bytes of a plain file, read without following a link
/// or blocking on a FIFO. `Ok(None)` when it is absent.
pub fn read_tail(path: &Path) -> std::io::Result<Option<String>> {
    use std::io::{Read, Seek, SeekFrom};
    let file = match rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(file) => file,
        Err(Errno::NOENT) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    let mut file = std::fs::File::from(file);
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(std::io::Error::other("not a plain file"));
    }
    let start = metadata.len().saturating_sub(FILE_TAIL);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(FILE_TAIL).read_to_end(&mut bytes)?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// The Xids of `journalctl -k -b -o json` output, the kernel's facility only,
/// newest first.
pub(crate) fn parse_journal(text: &str) -> Vec<XidEvent> {
    let mut kept = VecDeque::new();
    for line in text.lines() {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let facility = entry.get("SYSLOG_FACILITY").and_then(|v| v.as_str());
        if facility.is_some_and(|facility| facility != "0") {
            continue;
        }
        let Some(message) = entry.get("MESSAGE").and_then(|v| v.as_str()) else {
            continue;
        };
        let Some(mut event) = parse_xid_message(message) else {
            continue;
        };
        event.since_boot_us = entry
            .get("_SOURCE_MONOTONIC_TIMESTAMP")
            .and_then(|v| v.as_str())
            .and_then(|v| v.parse().ok());
        if kept.len() == EVENTS_KEPT {
            kept.pop_front();
        }
        kept.push_back(event);
    }
    kept.into_iter().rev().collect()
}

/// The host's kernel log: `/dev/kmsg`, else `journalctl -k` for this boot.
/// Neither is required: with none, the note says why.
pub(crate) fn host_kernel_log() -> KernelLog {
    let kmsg_error = match read_kmsg(Path::new("/dev/kmsg")) {
        Ok(events) => return dated("/dev/kmsg", events),
        Err(error) => error,
    };
    let argv = [
        "journalctl",
        "-k",
        "-b",
        "-o",
        "json",
        "--no-pager",
        "-n",
        "200000",
    ];
    let ran = crate::child::run(
        &argv,
        crate::child::Input::Null,
        FILE_TAIL,
        4096,
        Duration::from_secs(5),
        None,
    );
    match ran {
        Ok(crate::child::Ran::Exited { status, stdout, .. }) if status.success() => dated(
            "journalctl -k",
            parse_journal(&String::from_utf8_lossy(&stdout)),
        ),
        _ => KernelLog {
            note: Some(format!(
                "kernel log not read (/dev/kmsg: {kmsg_error}; journalctl -k did not answer): Xids unknown"
            )),
            ..KernelLog::default()
        },
    }
}

/// A kernel-log file standing in for `/dev/kmsg` (the simulated driver's).
pub(crate) fn file_kernel_log(path: &Path) -> KernelLog {
    match read_tail(path) {
        Ok(Some(text)) => dated(&path.display().to_string(), parse_text(&text)),
        Ok(None) => KernelLog {
            source: Some(path.display().to_string()),
            ..KernelLog::default()
        },
        Err(error) => KernelLog {
            note: Some(format!(
                "kernel log {} not read: {error}: Xids unknown",
                path.display()
            )),
            ..KernelLog::default()
        },
    }
}

/// The events with their wall-clock time: the boot time (now less the time
/// since boot) plus each one's timestamp.
fn dated(source: &str, mut events: Vec<XidEvent>) -> KernelLog {
    let boot = boot_time();
    for event in &mut events {
        event.at = boot
            .zip(event.since_boot_us)
            .map(|(boot, us)| boot + us / 1_000_000);
    }
    KernelLog {
        events,
        source: Some(source.to_string()),
        note: None,
    }
}

/// When the host booted, in seconds since the epoch (`/proc/uptime`).
fn boot_time() -> Option<u64> {
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let seconds: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(now.saturating_sub(seconds as u64))
}

/// Each GPU's events from one log, by PCI address: newest first, with counts.
pub(crate) fn attach(evidence: &mut Evidence, address: Option<PciAddress>, log: &KernelLog) {
    let Some(address) = address else {
        return;
    };
    for event in log.events.iter().filter(|event| event.address == address) {
        *evidence.xid_counts.entry(event.xid).or_default() += 1;
        if evidence.xids.len() < SHOWN {
            evidence.xids.push(event.clone());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Real lines, as drivers of several generations wrote them.
    const LINES: [&str; 7] = [
        // 5xx (R535 and later): pid and name, quoted unknowns.
        "NVRM: Xid (PCI:0000:01:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 1, subpartition 0.",
        "NVRM: Xid (PCI:0000:01:00): 32, pid=2096908, name=kf-phys-oracle, channel 0x00000007 intr1 00000004 HCE_DBG0 00000300 HCE_DBG1 0000118e",
        // R470-era: no pid, no name.
        "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus",
        "NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000009 intr 00800000",
        // pid only.
        "NVRM: Xid (PCI:0000:01:00): 79, pid=0, GPU has fallen off the bus.",
        // Bare number.
        "NVRM: Xid (PCI:0000:00:1e): 31",
        // Pre-R400: no PCI: prefix.
        "NVRM: Xid (0000:02:00): 13, 0001 00000000 0000a097 00001b0c 00001000 00000000",
    ];

    #[test]
    fn xid_lines_of_several_driver_generations() {
        let parsed: Vec<XidEvent> = LINES
            .iter()
            .map(|line| parse_xid_message(line).unwrap())
            .collect();
        let xids: Vec<u32> = parsed.iter().map(|e| e.xid).collect();
        assert_eq!(xids, [48, 32, 79, 32, 79, 31, 13]);
        assert_eq!(parsed[0].pid, None);
        assert_eq!(parsed[0].name, None);
        assert!(
            parsed[0]
                .detail
                .starts_with("An uncorrectable double bit error")
        );
        assert_eq!(parsed[1].pid, Some(2096908));
        assert_eq!(parsed[1].name.as_deref(), Some("kf-phys-oracle"));
        assert!(parsed[1].detail.starts_with("channel 0x00000007"));
        assert_eq!(parsed[2].pci, "0000:44:00");
        assert_eq!(parsed[2].detail, "GPU has fallen off the bus");
        assert_eq!(parsed[4].pid, Some(0));
        assert_eq!(parsed[4].detail, "GPU has fallen off the bus.");
        assert_eq!(parsed[5].detail, "");
        assert_eq!(
            parsed[6].address,
            PciAddress::parse("00000000:02:00.0").unwrap()
        );
    }

    #[test]
    fn pci_addresses_of_nvml_and_the_kernel_are_one() {
        assert_eq!(
            PciAddress::parse("00000000:3B:00.0"),
            PciAddress::parse("0000:3b:00")
        );
        for bad in [
            "",
            "3b:00",
            "0000:3b",
            "0000:3b:00:00",
            "zz:3b:00",
            "0000:3b:00.x",
            "0000:3bb:00",
        ] {
            assert_eq!(PciAddress::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_the_kernels_records_count() {
        let line = "NVRM: Xid (PCI:0000:01:00): 79, pid=0, GPU has fallen off the bus.";
        // prio 3 = facility 0 (kern), level 3 (err).
        assert!(parse_record(&format!("3,1042,81234567,-;{line}")).is_some());
        // A user's write to /dev/kmsg: facility 1 (prio 8 + level; 12 = user.warning).
        assert!(parse_record(&format!("12,1043,81234568,-;{line}")).is_none());
        assert!(parse_record(&format!("14,1043,81234568,-;{line}")).is_none());
        // Cut short, or interleaved with another record.
        assert!(parse_record("3,1042,81234567,-;NVRM: Xid (PCI:0000:01").is_none());
        assert!(parse_record("3,1042,81234567,-;NVRM: Xid (PCI:0000:01:00): ").is_none());
        assert!(parse_record("3,1042,812345").is_none());
        assert!(parse_record(&format!("3,1042;{line}")).is_none());
        assert!(
            parse_record(
                "3,1042,81234567,-;NVRM: Xid (PCI:0000:01:00): 79NVRM: Xid (PCI:0000:02:00): 48, x"
            )
            .is_none()
        );
        // A continuation line is not a message.
        let record = format!("3,1042,81234567,-;{line}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:01:00.0");
        let event = parse_record(&record).unwrap();
        assert_eq!(event.since_boot_us, Some(81234567));
        assert_eq!(event.detail, "GPU has fallen off the bus.");
        assert!(parse_record(" NVRM: Xid (PCI:0000:01:00): 79, x").is_none());
    }

    #[test]
    fn a_large_log_keeps_the_newest_events_newest_first() {
        let mut text = String::new();
        for n in 0..(EVENTS_KEPT as u64 + 500) {
            text.push_str(&format!(
                "3,{n},{n},-;NVRM: Xid (PCI:0000:01:00): {}, pid=1, name=x, y\n",
                13 + n % 2
            ));
            text.push_str("6,0,0,-;unrelated\n\u{0}\u{1}garbage;;;\n");
        }
        let events = parse_text(&text);
        assert_eq!(events.len(), EVENTS_KEPT);
        assert_eq!(events[0].since_boot_us, Some(EVENTS_KEPT as u64 + 499));
        assert!(
            events
                .windows(2)
                .all(|w| w[0].since_boot_us > w[1].since_boot_us)
        );
    }

    #[test]
    fn hostile_names_and_details_are_bounded() {
        let long = "x".repeat(10_000);
        let event = parse_xid_message(&format!(
            "NVRM: Xid (PCI:0000:01:00): 31, pid=7, name={long}, {long}"
        ))
        .unwrap();
        assert_eq!(event.name.map(|n| n.chars().count()), Some(64));
        assert_eq!(event.detail.chars().count(), DETAIL_CHARS);
        assert!(parse_xid_message("NVRM: Xid (PCI:0000:01:00): 99999999999, x").is_none());
    }

    #[test]
    fn journal_entries_of_other_facilities_do_not_count() {
        let text = concat!(
            r#"{"MESSAGE":"NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.","SYSLOG_FACILITY":"0","_SOURCE_MONOTONIC_TIMESTAMP":"5000000"}"#,
            "\n",
            r#"{"MESSAGE":"NVRM: Xid (PCI:0000:01:00): 48, forged","SYSLOG_FACILITY":"1"}"#,
            "\nnot json\n"
        );
        let events = parse_journal(text);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].xid, 79);
        assert_eq!(events[0].since_boot_us, Some(5_000_000));
    }

    #[test]
    fn advice_names_the_xid_and_its_remedy() {
        let mut evidence = Evidence::default();
        let log = KernelLog {
            events: vec![
                XidEvent {
                    at: Some(3 * 3600 + 12 * 60),
                    ..parse_xid_message(
                        "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus",
                    )
                    .unwrap()
                },
                parse_xid_message("NVRM: Xid (PCI:0000:01:00): 13, x").unwrap(),
                parse_xid_message("NVRM: Xid (PCI:0000:02:00): 48, x").unwrap(),
            ],
            ..KernelLog::default()
        };
        attach(&mut evidence, PciAddress::parse("00000000:01:00.0"), &log);
        assert_eq!(evidence.xid_counts, BTreeMap::from([(13, 1), (79, 1)]));
        let advice = evidence.advice(1);
        assert_eq!(
            advice[0],
            "Xid 79 at 03:12 UTC (GPU has fallen off the bus): a reset will not help; reboot the node"
        );
        assert!(advice[1].starts_with("Xid 13 ("));
        evidence.health.row_remap_pending = Some(true);
        assert!(evidence.advice(1)[2].starts_with("row remap pending: reset the GPU"));
        assert_eq!(
            evidence.listed(&BTreeSet::from(DEFAULT_DRAIN_XIDS)).len(),
            1
        );
    }
}
