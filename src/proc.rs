//! Reading `/proc`: every process's identity, its place in the tree, and which
//! GPU device nodes its descriptors point at.
//!
//! This is the half of the picture the driver cannot give: parents, sessions,
//! states, and processes that opened a node without a GPU context. A process
//! whose descriptors we may not read is recorded as such, never skipped quietly.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::Path;

use crate::driver::Node;

/// Linux's PF_KTHREAD flag in /proc/PID/stat.
const PF_KTHREAD: u32 = 0x0020_0000;

/// A process identity that survives PID reuse: the PID plus its start time in
/// clock ticks since boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
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
    /// R, S, D, Z, T, t, I, ...
    pub state: char,
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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

/// Scans every process in this PID namespace. Processes that exit during the
/// scan are dropped; those we may not inspect are listed in `unreadable`.
pub fn scan(classify: &dyn Fn(&Path) -> Option<Node>) -> io::Result<ProcScan> {
    let mut result = ProcScan::default();
    for entry in fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        match read_process(pid, classify) {
            Some((record, fd_error)) => {
                if let Some(reason) = fd_error {
                    result.unreadable.push(Unreadable {
                        pid,
                        comm: record.comm.clone(),
                        reason,
                    });
                }
                result.processes.push(record);
            }
            None => continue,
        }
    }
    result.processes.sort_by_key(|record| record.id.pid);
    Ok(result)
}

/// Reads one process; `None` when it has gone. The second value is why its
/// descriptors could not be read, if they could not.
pub fn read_process(
    pid: u32,
    classify: &dyn Fn(&Path) -> Option<Node>,
) -> Option<(ProcessRecord, Option<String>)> {
    let process = procfs::process::Process::new(pid as i32).ok()?;
    let stat = process.stat().ok()?;
    let uid = process.uid().ok();
    let cmdline = process
        .cmdline()
        .map(|args| args.join(" "))
        .unwrap_or_default();
    let kernel_thread = stat.flags & PF_KTHREAD != 0;
    let mut nodes = BTreeSet::new();
    let mut fd_error = None;
    if !kernel_thread {
        match fs::read_dir(format!("/proc/{pid}/fd")) {
            Ok(entries) => {
                for entry in entries.flatten() {
                    if let Ok(target) = fs::read_link(entry.path())
                        && let Some(node) = classify(&target)
                    {
                        nodes.insert(node);
                    }
                }
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => return None,
            Err(error) => fd_error = Some(error.to_string()),
        }
    }
    let record = ProcessRecord {
        id: ProcessId {
            pid,
            start_time: stat.starttime,
        },
        ppid: stat.ppid.max(0) as u32,
        pgid: stat.pgrp.max(0) as u32,
        sid: stat.session.max(0) as u32,
        uid,
        state: stat.state,
        comm: stat.comm,
        cmdline,
        kernel_thread,
        cpu_ticks: stat.utime + stat.stime,
        fds_readable: fd_error.is_none(),
        nodes,
    };
    Some((record, fd_error))
}

/// The start time of a live process, for PID-reuse checks; `None` if it is gone.
pub fn start_time(pid: u32) -> Option<u64> {
    procfs::process::Process::new(pid as i32)
        .and_then(|process| process.stat())
        .ok()
        .map(|stat| stat.starttime)
}

/// The state letter of a process, if it still exists with the given identity.
pub fn state_of(id: ProcessId) -> Option<char> {
    let stat = procfs::process::Process::new(id.pid as i32)
        .and_then(|process| process.stat())
        .ok()?;
    (stat.starttime == id.start_time).then_some(stat.state)
}

/// What the kernel says the process is blocked in, for D-state reports.
pub fn wchan(pid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/wchan")).ok()?;
    let text = text.trim();
    (!text.is_empty() && text != "0").then(|| text.to_string())
}

/// The process's cgroup v2 path (or the first v1 hierarchy's), for the container column.
pub fn cgroup(pid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
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
    procfs::ticks_per_second()
}

/// The chain of processes from our parent up to PID 1: the shells and scripts
/// that ran gpureap, which it must never signal.
pub fn ancestors_of_self() -> BTreeSet<u32> {
    let mut ancestors = BTreeSet::new();
    let mut pid = std::process::id();
    while let Ok(stat) = procfs::process::Process::new(pid as i32).and_then(|p| p.stat()) {
        let ppid = stat.ppid.max(0) as u32;
        if ppid == 0 || !ancestors.insert(ppid) {
            break;
        }
        pid = ppid;
    }
    ancestors
}

/// CPU time used so far by one process, in clock ticks; `None` if it is gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    procfs::process::Process::new(pid as i32)
        .and_then(|process| process.stat())
        .ok()
        .map(|stat| stat.utime + stat.stime)
}

/// Whether a process's environment (as it started) sets `name`.
pub fn has_env(pid: u32, name: &str) -> bool {
    let Ok(environ) = fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    environ.split(|&byte| byte == 0).any(|entry| {
        entry
            .strip_prefix(name.as_bytes())
            .is_some_and(|rest| rest.first() == Some(&b'='))
    })
}

/// The real uid from /proc/PID/status (the owner of /proc/PID is root for
/// non-dumpable processes).
pub fn real_uid(pid: u32) -> Option<u32> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
}
