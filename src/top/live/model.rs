//! What the view shows, from one snapshot: the holders as `status` lists
//! them (`report::holders_json`: the same flags, reasons and containers),
//! as a list or a tree, filtered and sorted; and each GPU's memory, by
//! whom, with its short history. Every string from a process or a cgroup
//! is escaped here (`units::one_line`), before it reaches the terminal.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::report;
use crate::snapshot::{Snapshot, UnattributedKind};
use crate::units::one_line;

/// How many samples each GPU's history keeps.
pub const HISTORY: usize = 40;

/// One holder's row.
#[derive(Debug, Clone)]
pub struct Row {
    pub pid: u32,
    pub depth: usize,
    pub user: String,
    pub state: String,
    /// Where it is, as `status` places it (`report::places_cells`): the
    /// GPUs the driver lists it on, `-` for a monitor.
    pub gpus: String,
    /// What it uses over those GPUs, as `status` shows it (`0 B` for a
    /// monitor, `unknown` where the driver gives no figure).
    pub memory: String,
    /// The same in bytes, where known: to sort by.
    pub bytes: Option<u64>,
    /// Its SM utilization, in percent: on the GPU where it is highest,
    /// where it is listed on several; `None` where the driver gives none.
    pub sm: Option<u32>,
    pub flags: String,
    pub container: String,
    pub command: String,
    /// Why it is flagged: the orphan's reason, the protected name, the gone supervisor.
    pub reason: Option<String>,
}

/// One GPU's bar: used memory split by holder, and what no process explains.
#[derive(Debug, Clone)]
pub struct GpuBar {
    pub index: u32,
    pub total: Option<u64>,
    pub used: Option<u64>,
    pub by_pid: Vec<(u32, u64)>,
    /// Memory no listed process explains (`Snapshot::held_by_no_process`),
    /// and its kind: bookkeeping, held by no process, or unseen from here.
    pub no_process: Option<(u64, UnattributedKind)>,
    pub error: Option<String>,
    /// What the GPU is doing (`Activity`), each `None` where unknown.
    pub utilization: Option<u32>,
    pub temperature: Option<u32>,
    pub power_watts: Option<f64>,
    pub power_limit_watts: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sort {
    Memory,
    Pid,
    Command,
}

impl Sort {
    pub fn next(self) -> Sort {
        match self {
            Sort::Memory => Sort::Pid,
            Sort::Pid => Sort::Command,
            Sort::Command => Sort::Memory,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Sort::Memory => "memory",
            Sort::Pid => "pid",
            Sort::Command => "command",
        }
    }
}

/// Each GPU's used memory over the last snapshots, oldest first.
#[derive(Debug, Default)]
pub struct History {
    pub used: BTreeMap<u32, VecDeque<Option<u64>>>,
}

impl History {
    pub fn record(&mut self, snapshot: &Snapshot) {
        self.record_used(snapshot.gpus.iter().map(|gpu| (gpu.index, gpu.memory_used)));
    }

    /// Records each GPU's used memory (index, bytes).
    pub fn record_used(&mut self, used: impl IntoIterator<Item = (u32, Option<u64>)>) {
        for (index, memory_used) in used {
            let samples = self.used.entry(index).or_default();
            if samples.len() == HISTORY {
                samples.pop_front();
            }
            samples.push_back(memory_used);
        }
    }
}

/// What the view says of memory unseen from its PID namespace, per GPU
/// (the one rule's `Unseen`): never driver-held, never a case for a reset.
pub fn unseen_lines(snapshot: &Snapshot) -> Vec<String> {
    snapshot
        .gpus
        .iter()
        .filter_map(|gpu| {
            let unattributed = snapshot.held_by_no_process(gpu)?;
            unattributed.unseen().then(|| {
                format!(
                    "?: GPU {}: {} unseen: gpureap runs in a PID namespace of its own and the driver may omit other namespaces' processes, which may hold it (not driver-held: do not reset); run it on the host, or with --pid=host / hostPID: true",
                    gpu.index,
                    crate::units::Bytes(unattributed.bytes)
                )
            })
        })
        .collect()
}

pub fn bars(snapshot: &Snapshot) -> Vec<GpuBar> {
    let watts = |milliwatts: Option<u32>| milliwatts.map(|mw| f64::from(mw) / 1000.0);
    snapshot
        .gpus
        .iter()
        .map(|gpu| (gpu, snapshot.activity.get(&gpu.index)))
        .map(|(gpu, activity)| GpuBar {
            index: gpu.index,
            total: gpu.memory_total,
            used: gpu.memory_used,
            by_pid: gpu
                .users
                .iter()
                .filter_map(|user| user.memory.map(|memory| (user.pid, memory)))
                .collect(),
            no_process: snapshot
                .held_by_no_process(gpu)
                .map(|held| (held.bytes, held.kind)),
            error: gpu
                .error
                .as_ref()
                .map(|error| one_line(&error.to_string()).into_owned()),
            utilization: activity.and_then(|a| a.utilization_percent),
            temperature: activity.and_then(|a| a.temperature_celsius),
            power_watts: watts(activity.and_then(|a| a.power_draw_milliwatts)),
            power_limit_watts: watts(activity.and_then(|a| a.power_limit_milliwatts)),
        })
        .collect()
}

/// The holders `status` lists, as rows.
pub fn rows(snapshot: &Snapshot) -> Vec<Row> {
    report::holders_json(snapshot, &None)
        .into_iter()
        .map(|holder| {
            let monitor = holder.flags.contains(&"monitor");
            let cells = report::places_cells(&report::places(snapshot, &holder, &None), monitor);
            let sm = holder
                .gpus
                .iter()
                .filter_map(|gpu| gpu.sm_utilization_percent)
                .max();
            let command = holder
                .cmdline
                .filter(|cmdline| !cmdline.is_empty())
                .or(holder.comm)
                .unwrap_or_else(|| "?".to_string());
            Row {
                pid: holder.pid,
                depth: 0,
                user: one_line(holder.user.as_deref().unwrap_or("?")).into_owned(),
                state: one_line(holder.state.as_deref().unwrap_or("?")).into_owned(),
                gpus: cells.gpus,
                memory: cells.memory,
                bytes: cells.bytes,
                sm,
                flags: holder.flags.join(","),
                container: holder
                    .container
                    .map(|container| one_line(&container.label()).into_owned())
                    .unwrap_or_default(),
                command: one_line(&command).into_owned(),
                reason: reason(
                    holder.orphan.as_deref(),
                    holder.protected.as_deref(),
                    holder
                        .supervisor
                        .as_ref()
                        .and_then(|supervisor| supervisor.gone.as_deref()),
                )
                .map(|reason| one_line(&reason).into_owned()),
            }
        })
        .collect()
}

/// Why a holder is flagged, for the line under the table: why it is an
/// orphan, its protected name, its supervisor gone.
pub fn reason(
    orphan: Option<&str>,
    protected: Option<&str>,
    supervisor_gone: Option<&str>,
) -> Option<String> {
    let reasons: Vec<String> = [
        orphan.map(|why| format!("orphaned: {why}")),
        protected.map(|name| format!("protected name {name}")),
        supervisor_gone.map(|gone| format!("supervisor gone: {gone}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// Whether a row answers the filter: a substring of its PID, user, flags,
/// container or command, case-insensitive.
pub fn matches(row: &Row, filter: &str) -> bool {
    if filter.is_empty() {
        return true;
    }
    let needle = filter.to_lowercase();
    [
        row.pid.to_string(),
        row.user.clone(),
        row.flags.clone(),
        row.container.clone(),
        row.command.clone(),
    ]
    .iter()
    .any(|field| field.to_lowercase().contains(&needle))
}

fn sort_rows(rows: &mut [Row], sort: Sort) {
    match sort {
        Sort::Memory => rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid))),
        Sort::Pid => rows.sort_by_key(|row| row.pid),
        Sort::Command => rows.sort_by(|a, b| a.command.cmp(&b.command).then(a.pid.cmp(&b.pid))),
    }
}

/// The rows shown: filtered, sorted, and in tree mode each holder under its
/// nearest holder ancestor (`ProcessTree`, the one tree every walk uses).
pub fn arrange(
    snapshot: &Snapshot,
    all: Vec<Row>,
    filter: &str,
    sort: Sort,
    tree: bool,
) -> Vec<Row> {
    if !tree {
        return arrange_by(|_| Vec::new(), all, filter, sort, false);
    }
    let processes = snapshot.tree();
    arrange_by(|pid| processes.ancestors(pid), all, filter, sort, tree)
}

/// `arrange`, with each process's ancestors, nearest first, from `ancestors`
/// (a remote host's, from its document).
pub fn arrange_by(
    ancestors: impl Fn(u32) -> Vec<u32>,
    all: Vec<Row>,
    filter: &str,
    sort: Sort,
    tree: bool,
) -> Vec<Row> {
    let mut shown: Vec<Row> = all.into_iter().filter(|row| matches(row, filter)).collect();
    sort_rows(&mut shown, sort);
    if !tree {
        return shown;
    }
    let present: BTreeSet<u32> = shown.iter().map(|row| row.pid).collect();
    let parent_of = |pid: u32| {
        ancestors(pid)
            .into_iter()
            .find(|ancestor| present.contains(ancestor))
    };
    let mut children: BTreeMap<Option<u32>, Vec<Row>> = BTreeMap::new();
    for row in shown {
        children.entry(parent_of(row.pid)).or_default().push(row);
    }
    let mut out = Vec::new();
    let mut stack: Vec<(Row, usize)> = children
        .remove(&None)
        .unwrap_or_default()
        .into_iter()
        .rev()
        .map(|row| (row, 0))
        .collect();
    while let Some((mut row, depth)) = stack.pop() {
        let pid = row.pid;
        row.depth = depth;
        out.push(row);
        for child in children
            .remove(&Some(pid))
            .unwrap_or_default()
            .into_iter()
            .rev()
        {
            stack.push((child, depth + 1));
        }
    }
    // A cycle of links (never expected) leaves rows unplaced: shown flat.
    out.extend(children.into_values().flatten());
    out
}
