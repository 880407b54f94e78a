//! Property: on random process forests and random scopes, `select` returns
//! exactly the target set DESIGN.md defines (GPU users in scope plus their
//! descendants, `--pid` naming processes directly), and never a protected
//! process, an ancestor of gpureap, gpureap itself, PID 1 or a kernel thread,
//! nor anything reached only through one of them. The forests include what
//! real hosts have: zombies, kernel threads, monitors, a GPU whose driver
//! query failed, driver PIDs from another namespace (absent, or colliding
//! with a local PID), session leaders under PID 1 (services), and `--pid`
//! naming PID 1, an ancestor, or a PID since reused.
//! The reference below is written out plainly, from the definition.

use std::collections::{BTreeMap, BTreeSet};

use gpureap::driver::Node;
use gpureap::proc::{ProcessId, ProcessRecord};
use gpureap::select::{DEFAULT_PROTECTED, Guard, Scope, select};
use gpureap::snapshot::{GpuState, GpuUser, Snapshot};
use proptest::prelude::*;
use regex::Regex;

const NAMES: [&str; 7] = [
    "sglang::scheduler_TP0",
    "sglang::detokenizer",
    "python3 -m vllm.entrypoints.openai.api_server",
    "nvidia-smi",
    "nv-hostengine",
    "bash",
    "jupyter-kernel",
];
const PATTERNS: [&str; 3] = ["sglang", "vllm|jupyter", "^bash$"];
const UIDS: [u32; 3] = [0, 1000, 1001];

#[derive(Debug, Clone)]
struct ProcessSpec {
    /// Parent position (taken modulo the position), or none for PID 1.
    parent: Option<usize>,
    name: usize,
    uid: usize,
    state: char,
    kernel: bool,
    /// Bit 0: GPU 0's node, bit 1: GPU 1's node, bit 2: the control node.
    nodes: u8,
    /// Has a GPU context (listed by the driver) on GPU 0 / GPU 1.
    context: (bool, bool),
    session_leader: bool,
}

#[derive(Debug, Clone)]
struct Spec {
    /// Every process after PID 1.
    processes: Vec<ProcessSpec>,
    hidden_on_gpu0: bool,
    /// The driver lists, on GPU 0, a local PID that has no NVIDIA node open.
    collision: Option<usize>,
    /// GPU 1's driver query failed: only node holders are known there.
    gpu1_failed: bool,
    self_position: usize,
    gpus: Option<BTreeSet<u32>>,
    /// Named positions (`usize::MAX` names PID 1), and whether the start time is stale.
    named: Vec<(usize, bool)>,
    patterns: Vec<usize>,
    uids: Vec<usize>,
    orphans: bool,
    all: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    let process = (
        proptest::option::weighted(0.8, 0usize..64),
        0usize..NAMES.len(),
        0usize..UIDS.len(),
        prop_oneof![Just('S'), Just('R'), Just('D'), Just('Z')],
        proptest::bool::weighted(0.05),
        0u8..8,
        (any::<bool>(), any::<bool>()),
        proptest::bool::weighted(0.3),
    )
        .prop_map(
            |(parent, name, uid, state, kernel, nodes, context, session_leader)| ProcessSpec {
                parent,
                name,
                uid,
                state,
                kernel,
                nodes,
                context,
                session_leader,
            },
        );
    let named = proptest::collection::vec(
        (
            prop_oneof![9 => 0usize..64, 1 => Just(usize::MAX)],
            proptest::bool::weighted(0.1),
        ),
        0..3,
    );
    (
        (
            proptest::collection::vec(process, 1..40),
            any::<bool>(),
            proptest::option::weighted(0.2, 0usize..64),
            proptest::bool::weighted(0.2),
            0usize..64,
        ),
        (
            proptest::option::of(proptest::collection::btree_set(0u32..2, 1..=2)),
            named,
            proptest::collection::vec(0usize..PATTERNS.len(), 0..2),
            proptest::collection::vec(0usize..UIDS.len(), 0..2),
            proptest::bool::weighted(0.3),
            proptest::bool::weighted(0.15),
        ),
    )
        .prop_map(
            |(
                (processes, hidden_on_gpu0, collision, gpu1_failed, self_position),
                (gpus, named, patterns, uids, orphans, all),
            )| Spec {
                processes,
                hidden_on_gpu0,
                collision,
                gpu1_failed,
                self_position,
                gpus,
                named,
                patterns,
                uids,
                orphans,
                all,
            },
        )
}

const HIDDEN_PID: u32 = 999_999;

fn pid_at(position: usize) -> u32 {
    100 + position as u32
}

fn user(pid: u32, listed: bool, node_open: bool, hidden: bool) -> GpuUser {
    GpuUser {
        pid,
        memory: listed.then_some(1 << 30),
        listed,
        node_open,
        hidden,
    }
}

fn build(spec: &Spec) -> (Snapshot, Scope, Guard) {
    let mut processes = BTreeMap::new();
    processes.insert(1, record(1, 0, 1, "init", 0, 'S', false, BTreeSet::new()));
    let mut gpu_users: [Vec<GpuUser>; 2] = [Vec::new(), Vec::new()];
    for (position, process) in spec.processes.iter().enumerate() {
        let pid = pid_at(position);
        // Parents always come earlier, so the forest has no cycles.
        let ppid = match process.parent {
            Some(parent) if position > 0 => pid_at(parent % position),
            _ => 1,
        };
        let mut nodes = BTreeSet::new();
        if !process.kernel && process.state != 'Z' {
            for (bit, node) in [(1, Node::Gpu(0)), (2, Node::Gpu(1)), (4, Node::Control)] {
                if process.nodes & bit != 0 {
                    nodes.insert(node);
                }
            }
        }
        let contexts = [process.context.0, process.context.1 && !spec.gpu1_failed];
        for (index, has_context) in contexts.into_iter().enumerate() {
            if nodes.contains(&Node::Gpu(index as u32)) {
                gpu_users[index].push(user(pid, has_context, true, false));
            }
        }
        let sid = if process.session_leader { pid } else { 1 };
        processes.insert(
            pid,
            record(
                pid,
                ppid,
                sid,
                NAMES[process.name],
                UIDS[process.uid],
                process.state,
                process.kernel,
                nodes,
            ),
        );
    }
    if spec.hidden_on_gpu0 {
        gpu_users[0].push(user(HIDDEN_PID, true, false, true));
    }
    if let Some(position) = spec.collision {
        let pid = pid_at(position % spec.processes.len());
        if processes[&pid].nodes.is_empty() {
            gpu_users[0].push(user(pid, true, false, true));
        }
    }
    let [users0, users1] = gpu_users;
    let mut second = gpu(1, users1);
    if spec.gpu1_failed {
        second.error = Some("GPU 1 is lost".to_string());
        second.memory_used = None;
    }
    let snapshot = Snapshot {
        backend: "test".to_string(),
        taken_at_unix_ms: 0,
        gpus: vec![gpu(0, users0), second],
        processes,
        unreadable: Vec::new(),
        driver_error: None,
        details: BTreeMap::new(),
        uptime_ticks: None,
        bookkeeping_slack: 0,
    };

    let count = spec.processes.len();
    let self_pid = pid_at(spec.self_position % count);
    let mut ancestors = BTreeSet::new();
    let mut current = self_pid;
    while let Some(record) = snapshot.processes.get(&current) {
        if record.ppid == 0 || !ancestors.insert(record.ppid) {
            break;
        }
        current = record.ppid;
    }
    let guard = Guard {
        self_pid,
        ancestors,
        protected_names: DEFAULT_PROTECTED
            .iter()
            .map(|name| name.to_string())
            .collect(),
    };
    let scope = Scope {
        gpus: spec.gpus.clone(),
        pids: spec
            .named
            .iter()
            .map(|&(position, stale)| {
                let pid = if position == usize::MAX {
                    1
                } else {
                    pid_at(position % count)
                };
                let start_time = snapshot.processes[&pid].id.start_time + u64::from(stale);
                ProcessId { pid, start_time }
            })
            .collect(),
        patterns: spec
            .patterns
            .iter()
            .map(|&index| Regex::new(PATTERNS[index]).expect("pattern"))
            .collect(),
        uids: spec.uids.iter().map(|&index| UIDS[index]).collect(),
        orphans: spec.orphans,
        all: spec.all,
        stale_runs: None,
    };
    (snapshot, scope, guard)
}

#[allow(clippy::too_many_arguments)]
fn record(
    pid: u32,
    ppid: u32,
    sid: u32,
    name: &str,
    uid: u32,
    state: char,
    kernel: bool,
    nodes: BTreeSet<Node>,
) -> ProcessRecord {
    ProcessRecord {
        id: ProcessId {
            pid,
            start_time: pid as u64 * 7,
        },
        ppid,
        pgid: pid,
        sid,
        uid: Some(uid),
        state,
        comm: name
            .split(' ')
            .next()
            .unwrap_or(name)
            .chars()
            .take(15)
            .collect(),
        cmdline: if kernel {
            String::new()
        } else {
            name.to_string()
        },
        kernel_thread: kernel,
        cpu_ticks: 0,
        nodes,
        fds_readable: true,
    }
}

fn gpu(index: u32, users: Vec<GpuUser>) -> GpuState {
    GpuState {
        index,
        name: Some("Simulated".to_string()),
        uuid: None,
        memory_total: Some(80 << 30),
        memory_used: Some(users.iter().filter_map(|user| user.memory).sum()),
        error: None,
        users,
    }
}

/// The definition, spelled out without the implementation's shortcuts.
fn reference(snapshot: &Snapshot, scope: &Scope, guard: &Guard) -> (BTreeSet<u32>, BTreeSet<u32>) {
    // Using a GPU: listed there by a driver that answered, as this local process.
    let uses = |pid: u32, index: u32| {
        let gpu = &snapshot.gpus[index as usize];
        gpu.error.is_none()
            && gpu
                .users
                .iter()
                .any(|user| user.pid == pid && user.listed && !user.hidden)
    };
    let is_user = |pid: u32| uses(pid, 0) || uses(pid, 1);
    // A monitor: nodes open, no use, and every GPU whose node it holds answered.
    let is_monitor = |pid: u32| {
        let nodes = &snapshot.processes[&pid].nodes;
        !nodes.is_empty()
            && !is_user(pid)
            && nodes.iter().all(|node| match node {
                Node::Gpu(index) => snapshot.gpus[*index as usize].error.is_none(),
                Node::Control => true,
            })
    };
    let passes = |pid: u32| {
        let record = &snapshot.processes[&pid];
        scope
            .gpus
            .as_ref()
            .is_none_or(|gpus| gpus.iter().any(|&index| uses(pid, index)))
            && (scope.patterns.is_empty()
                || scope.patterns.iter().any(|pattern| {
                    pattern.is_match(&record.cmdline) || pattern.is_match(&record.comm)
                }))
            && (scope.uids.is_empty() || record.uid.is_some_and(|uid| scope.uids.contains(&uid)))
            && (!scope.orphans
                || (record.ppid == 1 && pid != 1 && pid != record.sid && !record.kernel_thread))
    };
    let is_descendant = |pid: u32, of: u32| {
        let mut current = pid;
        let mut steps = 0;
        while let Some(record) = snapshot.processes.get(&current) {
            if record.ppid == of {
                return true;
            }
            if record.ppid == 0 || record.ppid == current || steps > 1000 {
                return false;
            }
            current = record.ppid;
            steps += 1;
        }
        false
    };
    // Named by identity: a stale start time names nothing.
    let named = |pid: u32| {
        scope
            .pids
            .iter()
            .any(|id| id.pid == pid && snapshot.processes[&pid].id == *id)
    };
    let forbidden = |pid: u32| {
        let record = &snapshot.processes[&pid];
        let program = record.cmdline.split(' ').next().unwrap_or("");
        pid == guard.self_pid
            || guard.ancestors.contains(&pid)
            || pid == 1
            || record.kernel_thread
            || guard.protected_names.iter().any(|name| {
                program == name || record.comm == name.chars().take(15).collect::<String>()
            })
            || (is_monitor(pid) && !named(pid))
    };
    let all_pids: Vec<u32> = snapshot.processes.keys().copied().collect();
    let mut spared = BTreeSet::new();
    let chosen: BTreeSet<u32> = if scope.pids.is_empty() {
        for &pid in &all_pids {
            if is_monitor(pid) && passes(pid) {
                spared.insert(pid);
            }
        }
        all_pids
            .iter()
            .copied()
            .filter(|&pid| is_user(pid) && passes(pid))
            .collect()
    } else {
        // A forbidden named root is spared, and nothing is reached through it.
        let mut open_roots = Vec::new();
        for pid in all_pids.iter().copied().filter(|&pid| named(pid)) {
            if forbidden(pid) {
                spared.insert(pid);
            } else {
                open_roots.push(pid);
            }
        }
        all_pids
            .iter()
            .copied()
            .filter(|&pid| {
                open_roots
                    .iter()
                    .any(|&root| pid == root || is_descendant(pid, root))
                    && passes(pid)
            })
            .collect()
    };
    let mut targets = BTreeSet::new();
    for &pid in &chosen {
        if forbidden(pid) {
            spared.insert(pid);
        } else {
            targets.insert(pid);
        }
    }
    // Descendants of the targets chosen so far, never through a spared process.
    let roots = targets.clone();
    for &pid in &all_pids {
        if roots.contains(&pid) || spared.contains(&pid) {
            continue;
        }
        if roots.iter().any(|&root| is_descendant(pid, root)) {
            if forbidden(pid) {
                spared.insert(pid);
            } else {
                targets.insert(pid);
            }
        }
    }
    (targets, spared)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn select_matches_the_definition(spec in spec()) {
        let (snapshot, scope, guard) = build(&spec);
        let selection = select(&snapshot, &scope, &guard);
        let targets: BTreeSet<u32> = selection.targets.keys().copied().collect();
        let spared: BTreeSet<u32> = selection.spared.keys().copied().collect();
        let (expected_targets, expected_spared) = reference(&snapshot, &scope, &guard);
        prop_assert_eq!(&targets, &expected_targets);
        prop_assert_eq!(&spared, &expected_spared);
        for pid in targets {
            let record = &snapshot.processes[&pid];
            prop_assert!(pid != guard.self_pid && pid != 1);
            prop_assert!(!guard.ancestors.contains(&pid));
            prop_assert!(!record.kernel_thread);
            prop_assert!(!DEFAULT_PROTECTED.contains(&record.cmdline.split(' ').next().unwrap_or("")));
            prop_assert!(pid != HIDDEN_PID);
        }
    }
}
