//! Rendering: tables for people, versioned JSON for programs (docs/json.md).
//! Reports go to stdout as one stream; diagnostics go to stderr elsewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use comfy_table::presets::NOTHING;
use comfy_table::{Cell, CellAlignment, Table};
use serde::Serialize;

use crate::reap::{Fate, FreeReport};
use crate::select::descendants;
use crate::snapshot::Snapshot;
use crate::units::{Bytes, Elapsed, MaybeBytes};

/// Bumped on any incompatible change to a JSON document's shape.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Serialize)]
pub struct StatusJson<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    pub backend: &'a str,
    pub taken_at_unix_ms: u64,
    pub driver_error: Option<&'a str>,
    pub scan: ScanJson<'a>,
    pub gpus: Vec<GpuJson>,
    pub holders: Vec<HolderJson>,
}

#[derive(Debug, Serialize)]
pub struct ScanJson<'a> {
    pub processes: usize,
    pub complete: bool,
    pub unreadable: &'a [crate::proc::Unreadable],
}

#[derive(Debug, Serialize)]
pub struct GpuJson {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub memory_total: Option<u64>,
    pub memory_used: Option<u64>,
    pub memory_unattributed: Option<u64>,
    pub error: Option<String>,
    pub processes: Vec<GpuProcessJson>,
}

#[derive(Debug, Serialize)]
pub struct GpuProcessJson {
    pub pid: u32,
    pub memory: Option<u64>,
    pub listed_by_driver: bool,
    pub node_open: bool,
}

#[derive(Debug, Serialize)]
pub struct HolderJson {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub pgid: Option<u32>,
    pub sid: Option<u32>,
    pub uid: Option<u32>,
    pub user: Option<String>,
    pub state: Option<String>,
    pub wchan: Option<String>,
    pub start_time_ticks: Option<u64>,
    pub age_seconds: Option<u64>,
    pub comm: Option<String>,
    pub cmdline: Option<String>,
    pub cgroup: Option<String>,
    pub gpus: Vec<HolderGpuJson>,
    pub control_node: bool,
    pub flags: Vec<&'static str>,
    /// Set when it was started under `gpureap run`.
    pub supervisor: Option<SupervisorJson>,
}

#[derive(Debug, Serialize)]
pub struct SupervisorJson {
    /// The supervising gpureap's PID.
    pub pid: u32,
    /// Why it no longer supervises this process; `null` while it does.
    pub gone: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct HolderGpuJson {
    pub index: u32,
    pub memory: Option<u64>,
}

fn shown(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>, pid: u32) -> bool {
    match gpus {
        None => true,
        Some(gpus) => snapshot
            .gpus
            .iter()
            .any(|gpu| gpus.contains(&gpu.index) && gpu.users.iter().any(|user| user.pid == pid)),
    }
}

fn holder_json(snapshot: &Snapshot, pid: u32) -> HolderJson {
    let record = snapshot.processes.get(&pid);
    let details = snapshot.details.get(&pid);
    HolderJson {
        pid,
        ppid: record.map(|r| r.ppid),
        pgid: record.map(|r| r.pgid),
        sid: record.map(|r| r.sid),
        uid: record.and_then(|r| r.uid),
        user: details.and_then(|d| d.user.clone()),
        state: record.map(|r| r.state.to_string()),
        wchan: details.and_then(|d| d.wchan.clone()),
        start_time_ticks: record.map(|r| r.id.start_time),
        age_seconds: snapshot.age_seconds(pid),
        comm: record.map(|r| r.comm.clone()),
        cmdline: record.map(|r| r.cmdline.clone()),
        cgroup: details.and_then(|d| d.cgroup.clone()),
        gpus: snapshot
            .gpus
            .iter()
            .filter_map(|gpu| {
                let user = gpu
                    .users
                    .iter()
                    .find(|user| user.pid == pid && !user.hidden)?;
                Some(HolderGpuJson {
                    index: gpu.index,
                    memory: user.memory,
                })
            })
            .collect(),
        control_node: record.is_some_and(|r| r.nodes.contains(&crate::driver::Node::Control)),
        flags: snapshot.flags(pid).names(),
        supervisor: details
            .and_then(|d| d.supervision.as_ref())
            .map(|supervision| SupervisorJson {
                pid: supervision.supervisor,
                gone: supervision.gone.clone(),
            }),
    }
}

pub fn status_json(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> String {
    let document = StatusJson {
        schema_version: SCHEMA_VERSION,
        kind: "status",
        backend: &snapshot.backend,
        taken_at_unix_ms: snapshot.taken_at_unix_ms,
        driver_error: snapshot.driver_error.as_deref(),
        scan: ScanJson {
            processes: snapshot.processes.len(),
            complete: !snapshot.is_partial(),
            unreadable: &snapshot.unreadable,
        },
        gpus: snapshot
            .gpus
            .iter()
            .filter(|gpu| gpus.as_ref().is_none_or(|set| set.contains(&gpu.index)))
            .map(|gpu| GpuJson {
                index: gpu.index,
                name: gpu.name.clone(),
                uuid: gpu.uuid.clone(),
                memory_total: gpu.memory_total,
                memory_used: gpu.memory_used,
                memory_unattributed: gpu.unattributed(),
                error: gpu.error.clone(),
                processes: gpu
                    .users
                    .iter()
                    .map(|user| GpuProcessJson {
                        pid: user.pid,
                        memory: user.memory,
                        listed_by_driver: user.listed,
                        node_open: user.node_open,
                    })
                    .collect(),
            })
            .collect(),
        holders: holders_json(snapshot, gpus),
    };
    to_json(&document)
}

/// Every holder of the given GPUs (all GPUs when `None`), as JSON objects.
pub fn holders_json(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> Vec<HolderJson> {
    let mut holders: Vec<HolderJson> = snapshot
        .holders()
        .into_iter()
        .filter(|&pid| shown(snapshot, gpus, pid))
        .map(|pid| holder_json(snapshot, pid))
        .collect();
    // Listed by the driver, not a process of this /proc: all we know is the
    // driver's PID and memory.
    for (index, user) in snapshot.hidden_users() {
        if gpus.as_ref().is_some_and(|set| !set.contains(&index)) {
            continue;
        }
        holders.push(HolderJson {
            pid: user.pid,
            ppid: None,
            pgid: None,
            sid: None,
            uid: None,
            user: None,
            state: None,
            wchan: None,
            start_time_ticks: None,
            age_seconds: None,
            comm: None,
            cmdline: None,
            cgroup: None,
            gpus: vec![HolderGpuJson {
                index,
                memory: user.memory,
            }],
            control_node: false,
            flags: vec!["hidden"],
            supervisor: None,
        });
    }
    holders
}

pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value)
        .unwrap_or_else(|error| format!("{{\"error\": \"{error}\"}}"))
}

fn new_table(headers: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_style(NOTHING);
    table.set_header(headers.iter().map(Cell::new));
    table
}

fn age_text(seconds: Option<u64>) -> String {
    seconds.map_or("?".to_string(), |s| {
        Elapsed(std::time::Duration::from_secs(s)).to_string()
    })
}

/// Cuts long command lines so a table row stays on one line.
fn short(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        let cut: String = text.chars().take(width.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

fn gpu_table(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> String {
    let mut table = new_table(&["GPU", "NAME", "USED", "TOTAL", "UNATTRIBUTED", "HOLDERS"]);
    for gpu in snapshot
        .gpus
        .iter()
        .filter(|gpu| gpus.as_ref().is_none_or(|set| set.contains(&gpu.index)))
    {
        let users = gpu.users.iter().filter(|user| user.listed).count();
        match &gpu.error {
            Some(error) => table.add_row(vec![
                Cell::new(gpu.index),
                Cell::new(format!("error: {error}")),
                Cell::new("?"),
                Cell::new("?"),
                Cell::new("?"),
                Cell::new(gpu.users.len()),
            ]),
            None => table.add_row(vec![
                Cell::new(gpu.index),
                Cell::new(gpu.name.as_deref().unwrap_or("?")),
                Cell::new(MaybeBytes(gpu.memory_used)).set_alignment(CellAlignment::Right),
                Cell::new(MaybeBytes(gpu.memory_total)).set_alignment(CellAlignment::Right),
                Cell::new(MaybeBytes(gpu.unattributed())).set_alignment(CellAlignment::Right),
                Cell::new(users),
            ]),
        };
    }
    table.to_string()
}

pub fn status_table(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> String {
    let mut out = String::new();
    if snapshot.gpus.is_empty() {
        let _ = writeln!(
            out,
            "No GPUs reported by the driver ({}).",
            snapshot.backend
        );
    } else {
        let _ = writeln!(out, "{}", gpu_table(snapshot, gpus));
    }
    let holders = holders_json(snapshot, gpus);
    let _ = writeln!(out);
    if holders.is_empty() {
        let _ = writeln!(out, "No process holds or watches these GPUs.");
    } else {
        let mut table = new_table(&[
            "GPU", "PID", "PPID", "PGID", "SID", "USER", "S", "AGE", "GPU MEM", "FLAGS", "CGROUP",
            "COMMAND",
        ]);
        for holder in holders {
            let gpu_column = if holder.gpus.is_empty() {
                "-".to_string()
            } else {
                holder
                    .gpus
                    .iter()
                    .map(|g| g.index.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            // A monitor is in no driver list: it holds no GPU memory.
            let memory: Option<u64> = if holder.gpus.is_empty() || holder.flags.contains(&"monitor")
            {
                Some(0)
            } else {
                holder.gpus.iter().map(|g| g.memory).sum()
            };
            let number = |value: Option<u32>| value.map_or("?".to_string(), |v| v.to_string());
            table.add_row(vec![
                Cell::new(gpu_column),
                Cell::new(holder.pid),
                Cell::new(number(holder.ppid)),
                Cell::new(number(holder.pgid)),
                Cell::new(number(holder.sid)),
                Cell::new(holder.user.as_deref().unwrap_or("?")),
                Cell::new(holder.state.as_deref().unwrap_or("?")),
                Cell::new(age_text(holder.age_seconds)),
                Cell::new(MaybeBytes(memory)).set_alignment(CellAlignment::Right),
                Cell::new(holder.flags.join(",")),
                Cell::new(short(holder.cgroup.as_deref().unwrap_or("-"), 28)),
                Cell::new(short(
                    holder.cmdline.as_deref().unwrap_or("(not visible here)"),
                    60,
                )),
            ]);
        }
        let _ = writeln!(out, "{table}");
    }
    notes(snapshot, &mut out);
    out
}

fn notes(snapshot: &Snapshot, out: &mut String) {
    supervisor_gone_notes(snapshot, out);
    if let Some(error) = &snapshot.driver_error {
        let _ = writeln!(out, "\nDriver error: {error}");
    }
    if snapshot.is_partial() {
        let _ = writeln!(
            out,
            "\nPartial scan: {} process(es) could not be inspected (e.g. pid {} {}: {}); holders among them are not shown.",
            snapshot.unreadable.len(),
            snapshot.unreadable[0].pid,
            snapshot.unreadable[0].comm,
            snapshot.unreadable[0].reason
        );
    }
}

/// One note per `gpureap run` that is gone while its server holds GPUs:
/// which holders it left, why it counts as gone, and how to free them.
fn supervisor_gone_notes(snapshot: &Snapshot, out: &mut String) {
    let mut runs: BTreeMap<u32, (Vec<u32>, &crate::supervision::Supervision)> = BTreeMap::new();
    for pid in snapshot.holders() {
        if let Some(supervision) = snapshot.supervisor_gone(pid) {
            runs.entry(supervision.supervisor)
                .or_insert_with(|| (Vec::new(), supervision))
                .0
                .push(pid);
        }
    }
    for (supervisor, (pids, supervision)) in runs {
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let free = if supervision.cgroup.is_some() {
            "`gpureap free --stale-runs` frees its cgroup and removes it"
        } else {
            "`gpureap free --orphans` frees its whole tree"
        };
        let _ = writeln!(
            out,
            "\nSupervisor gone: PID {} started under `gpureap run` (PID {supervisor}), which no longer supervises them ({}); {free}.",
            pids.join(", "),
            supervision.gone.as_deref().unwrap_or("gone"),
        );
    }
}

/// Holders inside their process trees: each tree from its topmost ancestor
/// below PID 1, with the holders' own descendants.
pub fn status_tree(snapshot: &Snapshot, gpus: &Option<BTreeSet<u32>>) -> String {
    let mut out = String::new();
    if !snapshot.gpus.is_empty() {
        let _ = writeln!(out, "{}\n", gpu_table(snapshot, gpus));
    }
    let holders: BTreeSet<u32> = snapshot
        .holders()
        .into_iter()
        .filter(|&pid| shown(snapshot, gpus, pid))
        .collect();
    let children = snapshot.children();
    let mut included: BTreeSet<u32> = BTreeSet::new();
    let mut roots: BTreeSet<u32> = BTreeSet::new();
    for &pid in &holders {
        included.insert(pid);
        included.extend(descendants(&children, pid));
        // The tree starts at the topmost ancestor below PID 1.
        let chain: Vec<u32> = snapshot
            .ancestors(pid)
            .into_iter()
            .take_while(|&parent| parent > 1)
            .collect();
        included.extend(&chain);
        roots.insert(chain.last().copied().unwrap_or(pid));
    }
    if holders.is_empty() {
        let _ = writeln!(out, "No process holds or watches these GPUs.");
    }
    for root in roots {
        tree_lines(
            snapshot,
            &children,
            &mut included,
            &holders,
            root,
            "",
            "",
            &mut out,
        );
    }
    notes(snapshot, &mut out);
    out
}

#[allow(clippy::too_many_arguments)]
fn tree_lines(
    snapshot: &Snapshot,
    children: &std::collections::HashMap<u32, Vec<u32>>,
    included: &mut BTreeSet<u32>,
    holders: &BTreeSet<u32>,
    pid: u32,
    lead: &str,
    branch: &str,
    out: &mut String,
) {
    // Each process is printed once, which also ends any parent loop.
    if !included.remove(&pid) {
        return;
    }
    let holder = holder_json(snapshot, pid);
    let mut line = format!(
        "{lead}{branch}{pid} [{}] {}",
        holder.state.as_deref().unwrap_or("?"),
        short(
            holder.cmdline.as_deref().unwrap_or("(not visible here)"),
            70
        )
    );
    if holders.contains(&pid) {
        for gpu in &holder.gpus {
            let _ = write!(line, "  GPU {}: {}", gpu.index, MaybeBytes(gpu.memory));
        }
    }
    let flags = holder.flags;
    if !flags.is_empty() {
        let _ = write!(line, "  ({})", flags.join(", "));
    }
    let _ = writeln!(out, "{line}");
    let kids: Vec<u32> = children
        .get(&pid)
        .map(|kids| {
            kids.iter()
                .copied()
                .filter(|kid| included.contains(kid))
                .collect()
        })
        .unwrap_or_default();
    let child_lead = format!(
        "{lead}{}",
        match branch {
            "" => "",
            "└─ " => "   ",
            _ => "│  ",
        }
    );
    for (position, kid) in kids.iter().enumerate() {
        let branch = if position + 1 == kids.len() {
            "└─ "
        } else {
            "├─ "
        };
        tree_lines(
            snapshot,
            children,
            included,
            holders,
            *kid,
            &child_lead,
            branch,
            out,
        );
    }
}

#[derive(Serialize)]
struct FreeJson<'a> {
    schema_version: u32,
    kind: &'static str,
    exit_code: i32,
    #[serde(flatten)]
    report: &'a FreeReport,
}

pub fn free_json(report: &FreeReport, exit_code: i32) -> String {
    to_json(&FreeJson {
        schema_version: SCHEMA_VERSION,
        kind: "free",
        exit_code,
        report,
    })
}

/// The plan, for --dry-run and the confirmation prompt.
pub fn free_plan(report: &FreeReport) -> String {
    let mut out = String::new();
    if report.targets.is_empty() {
        let _ = writeln!(out, "Nothing in scope to signal.");
    } else {
        let _ = writeln!(out, "Would signal {} process(es):", report.targets.len());
        let mut table = new_table(&["PID", "PPID", "GPUS", "WHY", "COMMAND"]);
        for target in &report.targets {
            table.add_row(vec![
                Cell::new(target.pid),
                Cell::new(target.ppid),
                Cell::new(gpu_list(&target.gpus)),
                Cell::new(target.because.replace('_', " ")),
                Cell::new(short(&target.cmdline, 70)),
            ]);
        }
        let _ = writeln!(out, "{table}");
    }
    spared_lines(report, &mut out);
    stale_run_lines(report, &mut out);
    if !report.gpus.is_empty() {
        let summary: Vec<String> = report
            .gpus
            .iter()
            .map(|gpu| format!("GPU {} ({} used)", gpu.index, MaybeBytes(gpu.memory_before)))
            .collect();
        let _ = writeln!(out, "GPUs in scope: {}", summary.join(", "));
    }
    out
}

fn gpu_list(gpus: &BTreeSet<u32>) -> String {
    if gpus.is_empty() {
        "-".to_string()
    } else {
        gpus.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn spared_lines(report: &FreeReport, out: &mut String) {
    for spared in &report.spared {
        let _ = writeln!(
            out,
            "Left alone: {} ({}): {}",
            spared.pid,
            short(&spared.cmdline, 50),
            spared.why
        );
    }
}

/// One line per stale run's cgroup (`--stale-runs`).
fn stale_run_lines(report: &FreeReport, out: &mut String) {
    for run in &report.stale_runs {
        let outcome = match (&run.error, run.removed, report.dry_run) {
            (_, true, _) => "removed".to_string(),
            (Some(error), false, _) => format!("not removed: {error}"),
            (None, false, true) => "removed once empty".to_string(),
            (None, false, false) => "not removed".to_string(),
        };
        let _ = writeln!(out, "Stale run {} ({}): {outcome}", run.cgroup, run.gone);
    }
}

/// What `free` did, then one outcome line per GPU.
pub fn free_outcome(report: &FreeReport) -> String {
    let mut out = String::new();
    if report.targets.is_empty() {
        let _ = writeln!(out, "Nothing in scope to signal.");
    } else {
        let mut table = new_table(&["PID", "SIGNALS", "RESULT", "COMMAND"]);
        for target in &report.targets {
            let signals: Vec<&str> = target
                .signals
                .iter()
                .filter(|event| event.delivery == crate::reap::Delivery::Sent)
                .map(|event| event.signal)
                .collect();
            let result = match (target.fate, target.exited_after_ms) {
                (Fate::Exited, Some(ms)) => format!(
                    "exited after {}",
                    Elapsed(std::time::Duration::from_millis(ms))
                ),
                (Fate::Exited, None) => "exited".to_string(),
                (Fate::Zombie, _) => "zombie (already exited)".to_string(),
                (Fate::Alive, _) => "alive".to_string(),
                (Fate::PermissionDenied, _) => "permission denied".to_string(),
            };
            table.add_row(vec![
                Cell::new(target.pid),
                Cell::new(if signals.is_empty() {
                    "-".to_string()
                } else {
                    signals.join(",")
                }),
                Cell::new(result),
                Cell::new(short(&target.cmdline, 60)),
            ]);
        }
        let _ = writeln!(out, "{table}");
    }
    spared_lines(report, &mut out);
    stale_run_lines(report, &mut out);
    for line in gpu_outcome_lines(report) {
        let _ = writeln!(out, "{line}");
    }
    if !report.unreadable.is_empty() {
        let _ = writeln!(
            out,
            "Partial scan: {} process(es) could not be inspected; holders among them were not seen.",
            report.unreadable.len()
        );
    }
    out
}

/// One outcome line per GPU, each still-held GPU followed by its reasons.
pub fn gpu_outcome_lines(report: &FreeReport) -> Vec<String> {
    let mut lines = Vec::new();
    for gpu in &report.gpus {
        if gpu.freed {
            lines.push(format!(
                "GPU {}: freed {} in {} ({} used now)",
                gpu.index,
                MaybeBytes(gpu.freed_bytes),
                Elapsed(std::time::Duration::from_millis(
                    gpu.freed_after_ms.unwrap_or(report.elapsed_ms)
                )),
                MaybeBytes(gpu.memory_after)
            ));
        } else {
            lines.push(format!(
                "GPU {}: still held, {} used after {}",
                gpu.index,
                MaybeBytes(gpu.memory_after),
                Elapsed(std::time::Duration::from_millis(report.elapsed_ms))
            ));
            lines.extend(gpu.reasons.iter().map(|reason| format!("  - {reason}")));
        }
    }
    lines
}

/// One line per GPU for `wait`.
#[derive(Debug, Serialize)]
pub struct WaitGpu {
    pub index: u32,
    pub memory_used: Option<u64>,
    pub ready: bool,
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct WaitJson<'a> {
    pub schema_version: u32,
    pub kind: &'static str,
    pub ready: bool,
    pub waited_ms: u64,
    pub below: u64,
    pub gpus: &'a [WaitGpu],
    /// On timeout, who holds the GPUs that were not ready; empty when ready.
    pub holders: Vec<HolderJson>,
}

pub fn wait_lines(gpus: &[WaitGpu], below: u64, waited_ms: u64) -> String {
    let mut out = String::new();
    for gpu in gpus {
        let state = if gpu.ready { "ready" } else { "busy" };
        let _ = write!(
            out,
            "GPU {}: {state}, {} used (limit {}) after {}",
            gpu.index,
            MaybeBytes(gpu.memory_used),
            Bytes(below),
            Elapsed(std::time::Duration::from_millis(waited_ms))
        );
        if let Some(error) = &gpu.error {
            let _ = write!(out, " ({error})");
        }
        let _ = writeln!(out);
    }
    out
}

/// Total memory per GPU, for the progress line.
pub fn progress_text(progress: &crate::reap::Progress) -> String {
    let mut text = format!(
        "{} · {} alive · {}",
        progress.phase,
        progress.alive,
        Elapsed(progress.elapsed)
    );
    let memory: BTreeMap<u32, (Option<u64>, bool)> = progress
        .gpus
        .iter()
        .map(|&(index, used, freed)| (index, (used, freed)))
        .collect();
    for (index, (used, freed)) in memory {
        let _ = write!(
            text,
            " · GPU {index} {}{}",
            MaybeBytes(used),
            if freed { " ✓" } else { "" }
        );
    }
    text
}
