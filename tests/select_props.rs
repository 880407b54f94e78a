//! Property: on random process forests and random scopes, `select` returns
//! exactly the target set DESIGN.md defines (GPU users in scope plus their
//! descendants, `--pid` naming processes directly), and never a protected
//! process, an ancestor of gpureap, gpureap itself, PID 1 or a kernel thread.
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

/// (parent position or none for PID 1, name, uid, state, kernel thread,
/// node bits, has a GPU context on GPU 0 / GPU 1).
type ProcessSpec = (Option<usize>, usize, usize, char, bool, u8, (bool, bool));

#[derive(Debug, Clone)]
struct Spec {
    /// Every process after PID 1.
    processes: Vec<ProcessSpec>,
    hidden_on_gpu0: bool,
    self_position: usize,
    gpus: Option<BTreeSet<u32>>,
    named: Vec<usize>,
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
    );
    (
        proptest::collection::vec(process, 1..40),
        any::<bool>(),
        0usize..64,
        proptest::option::of(proptest::collection::btree_set(0u32..2, 1..=2)),
        proptest::collection::vec(0usize..64, 0..3),
        proptest::collection::vec(0usize..PATTERNS.len(), 0..2),
        proptest::collection::vec(0usize..UIDS.len(), 0..2),
        proptest::bool::weighted(0.3),
        proptest::bool::weighted(0.15),
    )
        .prop_map(
            |(
                processes,
                hidden_on_gpu0,
                self_position,
                gpus,
                named,
                patterns,
                uids,
                orphans,
                all,
            )| Spec {
                processes,
                hidden_on_gpu0,
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

fn build(spec: &Spec) -> (Snapshot, Scope, Guard) {
    let mut processes = BTreeMap::new();
    processes.insert(1, record(1, 0, "init", 0, 'S', false, BTreeSet::new()));
    let mut gpu_users: [Vec<GpuUser>; 2] = [Vec::new(), Vec::new()];
    for (position, &(parent, name, uid, state, kernel, bits, context)) in
        spec.processes.iter().enumerate()
    {
        let pid = pid_at(position);
        // Parents always come earlier, so the forest has no cycles.
        let ppid = match parent {
            Some(parent) if position > 0 => pid_at(parent % position),
            _ => 1,
        };
        let mut nodes = BTreeSet::new();
        if !kernel && state != 'Z' {
            if bits & 1 != 0 {
                nodes.insert(Node::Gpu(0));
            }
            if bits & 2 != 0 {
                nodes.insert(Node::Gpu(1));
            }
            if bits & 4 != 0 {
                nodes.insert(Node::Control);
            }
        }
        for (index, has_context) in [(0usize, context.0), (1, context.1)] {
            if nodes.contains(&Node::Gpu(index as u32)) && has_context {
                gpu_users[index].push(GpuUser {
                    pid,
                    memory: Some(1 << 30),
                    listed: true,
                    node_open: true,
                });
            } else if nodes.contains(&Node::Gpu(index as u32)) {
                gpu_users[index].push(GpuUser {
                    pid,
                    memory: None,
                    listed: false,
                    node_open: true,
                });
            }
        }
        processes.insert(
            pid,
            record(pid, ppid, NAMES[name], UIDS[uid], state, kernel, nodes),
        );
    }
    if spec.hidden_on_gpu0 {
        gpu_users[0].push(GpuUser {
            pid: HIDDEN_PID,
            memory: Some(1 << 30),
            listed: true,
            node_open: false,
        });
    }
    let [users0, users1] = gpu_users;
    let gpus = vec![gpu(0, users0), gpu(1, users1)];
    let snapshot = Snapshot {
        backend: "test".to_string(),
        taken_at_unix_ms: 0,
        gpus,
        processes,
        unreadable: Vec::new(),
        driver_error: None,
        details: BTreeMap::new(),
        uptime_ticks: None,
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
            .map(|&position| pid_at(position % count))
            .collect(),
        patterns: spec
            .patterns
            .iter()
            .map(|&index| Regex::new(PATTERNS[index]).expect("pattern"))
            .collect(),
        uids: spec.uids.iter().map(|&index| UIDS[index]).collect(),
        orphans: spec.orphans,
        all: spec.all,
    };
    (snapshot, scope, guard)
}

fn record(
    pid: u32,
    ppid: u32,
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
        sid: pid,
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
    let uses = |pid: u32, index: u32| {
        snapshot.gpus[index as usize]
            .users
            .iter()
            .any(|user| user.pid == pid && user.listed)
    };
    let is_user = |pid: u32| uses(pid, 0) || uses(pid, 1);
    let is_monitor = |pid: u32| !snapshot.processes[&pid].nodes.is_empty() && !is_user(pid);
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
            && (!scope.orphans || (record.ppid == 1 && pid != 1 && !record.kernel_thread))
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
        all_pids
            .iter()
            .copied()
            .filter(|&pid| {
                scope
                    .pids
                    .iter()
                    .any(|&named| pid == named || is_descendant(pid, named))
                    && passes(pid)
            })
            .collect()
    };
    let candidates: BTreeSet<u32> = all_pids
        .iter()
        .copied()
        .filter(|&pid| chosen.contains(&pid) || chosen.iter().any(|&root| is_descendant(pid, root)))
        .collect();
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
            || (is_monitor(pid) && !scope.pids.contains(&pid))
    };
    let mut targets = BTreeSet::new();
    for pid in candidates {
        if forbidden(pid) {
            spared.insert(pid);
        } else {
            targets.insert(pid);
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
