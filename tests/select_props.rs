//! Property: on random process forests and random scopes, `select` returns
//! exactly the target set docs/architecture.md defines (GPU users in scope plus their
//! descendants, `--pid` naming processes directly), and never a protected
//! process, an ancestor of gpureap, gpureap itself, PID 1 or a kernel thread,
//! nor anything reached only through one of them. The forests include what
//! real hosts have: zombies, kernel threads, monitors, a GPU whose driver
//! query failed, driver PIDs from another namespace (absent, or colliding
//! with a local PID), session leaders under PID 1 (services), orphans of a
//! dead group leader (under PID 1 or a subreaper), a driver that failed
//! altogether, command lines that are paths, children listed before their
//! parents (PIDs wrapped around), and `--pid` naming PID 1, an ancestor, or
//! a PID since reused, and the members of a container, pod or cgroup
//! (`--container`, `--pod`, `--cgroup`: roots like `--pid`, but spared by
//! the guard's name and monitor rules, which naming overrides).
//! The reference below is written out plainly, from the definition. A second
//! property checks verification's notion of "still ours" against a ledger
//! of earlier targets, some of whose PIDs now belong to other processes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpureap_core::driver::DriverError;
use gpureap_core::proc::{Node, ticks_per_second};
use gpureap_core::proc::{ProcessId, ProcessRecord, State};
use gpureap_core::select::{DEFAULT_PROTECTED, Guard, Scope, select};
use gpureap_core::signal::Sig;
use gpureap_core::snapshot::{GpuState, GpuUser, Snapshot};
use gpureap_core::verify::{Ledger, assess};
use proptest::prelude::*;
use regex::Regex;

const NAMES: [&str; 9] = [
    "sglang::scheduler_TP0",
    "sglang::detokenizer",
    "python3 -m vllm.entrypoints.openai.api_server",
    "nvidia-smi",
    "nv-hostengine",
    "bash",
    "jupyter-kernel",
    // A path: the protected name is its last part.
    "/usr/bin/nvidia-smi --query-gpu=memory.used",
    "/opt/conda/bin/python3 /srv/sglang/launch.py",
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
    /// 0: leads its own process group; 1: in its parent's group; 2: in a
    /// group whose leader is gone (a crashed launcher's).
    group: u8,
    /// Still in the session it was born in, which its parent (a subreaper
    /// that took it in) is not.
    adopted: bool,
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
    /// The driver failed altogether: no GPU's list is known.
    driver_failed: bool,
    /// PIDs count down with position, so children have lower PIDs than
    /// their parents and are listed first (PIDs wrapped around).
    reversed: bool,
    self_position: usize,
    gpus: Option<BTreeSet<u32>>,
    /// Named positions (`usize::MAX` names PID 1), and whether the start time is stale.
    named: Vec<(usize, bool)>,
    /// Members of a container, pod or cgroup (positions, and whether the
    /// start time is stale), or none when no such scope was given.
    members: Option<Vec<(usize, bool)>>,
    patterns: Vec<usize>,
    uids: Vec<usize>,
    orphans: bool,
    all: bool,
    /// The age floor, in milliseconds, and whether the uptime (every age) is known.
    min_age: Option<(u16, bool)>,
    /// Positions of the only processes that may be holders in scope.
    within: Option<Vec<usize>>,
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
        (0u8..3, proptest::bool::weighted(0.3)),
    )
        .prop_map(
            |(
                parent,
                name,
                uid,
                state,
                kernel,
                nodes,
                context,
                session_leader,
                (group, adopted),
            )| ProcessSpec {
                parent,
                name,
                uid,
                state,
                kernel,
                nodes,
                context,
                session_leader,
                group,
                adopted,
            },
        );
    let named = proptest::collection::vec(
        (
            prop_oneof![9 => 0usize..64, 1 => Just(usize::MAX)],
            proptest::bool::weighted(0.1),
        ),
        0..3,
    );
    let members = proptest::option::weighted(
        0.3,
        proptest::collection::vec((0usize..64, proptest::bool::weighted(0.1)), 0..6),
    );
    (
        (
            proptest::collection::vec(process, 1..40),
            any::<bool>(),
            proptest::option::weighted(0.2, 0usize..64),
            proptest::bool::weighted(0.2),
            0usize..64,
            (proptest::bool::weighted(0.1), proptest::bool::weighted(0.3)),
        ),
        (
            proptest::option::of(proptest::collection::btree_set(0u32..2, 1..=2)),
            named,
            proptest::collection::vec(0usize..PATTERNS.len(), 0..2),
            proptest::collection::vec(0usize..UIDS.len(), 0..2),
            proptest::bool::weighted(0.3),
            proptest::bool::weighted(0.15),
        ),
        (
            proptest::option::weighted(0.4, (0u16..3000, proptest::bool::weighted(0.9))),
            proptest::option::weighted(0.3, proptest::collection::vec(0usize..64, 0..6)),
            members,
        ),
    )
        .prop_map(
            |(
                (
                    processes,
                    hidden_on_gpu0,
                    collision,
                    gpu1_failed,
                    self_position,
                    (driver_failed, reversed),
                ),
                (gpus, named, patterns, uids, orphans, all),
                (min_age, within, members),
            )| Spec {
                processes,
                hidden_on_gpu0,
                collision,
                gpu1_failed,
                driver_failed,
                reversed,
                self_position,
                gpus,
                named,
                members,
                patterns,
                uids,
                orphans,
                all,
                min_age,
                within,
            },
        )
}

const HIDDEN_PID: u32 = 999_999;

fn pid_at(spec: &Spec, position: usize) -> u32 {
    if spec.reversed {
        100 + (spec.processes.len() - position) as u32
    } else {
        100 + position as u32
    }
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
    processes.insert(
        1,
        record(1, 0, 0, 1, 1, "init", 0, 'S', false, BTreeSet::new()),
    );
    let mut gpu_users: [Vec<GpuUser>; 2] = [Vec::new(), Vec::new()];
    for (position, process) in spec.processes.iter().enumerate() {
        let pid = pid_at(spec, position);
        // Parents always come earlier (and started earlier), so the forest
        // has no cycles.
        let ppid = match process.parent {
            Some(parent) if position > 0 => pid_at(spec, parent % position),
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
        let contexts = [
            process.context.0 && !spec.driver_failed,
            process.context.1 && !spec.gpu1_failed && !spec.driver_failed,
        ];
        for (index, has_context) in contexts.into_iter().enumerate() {
            if nodes.contains(&Node::Gpu(index as u32)) {
                gpu_users[index].push(user(pid, has_context, true, false));
            }
        }
        // A session leader leads its group too; others keep their parent's
        // session, unless the parent is PID 1 or a session leader (a
        // subreaper of another session took them in).
        let parent_sid = processes
            .get(&ppid)
            .map_or(1, |parent: &ProcessRecord| parent.sid);
        let (sid, pgid) = if process.session_leader {
            (pid, pid)
        } else {
            let pgid = match process.group {
                0 => pid,
                1 => processes.get(&ppid).map_or(pid, |parent| parent.pgid),
                _ => 90_000 + position as u32,
            };
            let sid = if process.adopted {
                80_000 + position as u32
            } else if ppid == 1 {
                1
            } else {
                parent_sid
            };
            (sid, pgid)
        };
        processes.insert(
            pid,
            record(
                pid,
                ppid,
                (position as u64 + 1) * 7,
                pgid,
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
        let pid = pid_at(spec, position % spec.processes.len());
        if processes[&pid].nodes.is_empty() {
            gpu_users[0].push(user(pid, true, false, true));
        }
    }
    let [users0, users1] = gpu_users;
    let mut second = gpu(1, users1);
    if spec.gpu1_failed {
        second.error = Some(DriverError::GpuLost { index: 1 });
        second.memory_used = None;
    }
    let mut first = gpu(0, users0);
    if spec.driver_failed {
        // As the merge leaves it: node holders under GPUs whose driver said nothing.
        for state in [&mut first, &mut second] {
            state.error = Some(DriverError::NoAnswer);
            state.memory_used = None;
            state.users.retain(|user| !user.hidden);
            for user in &mut state.users {
                user.listed = false;
                user.memory = None;
            }
        }
    }
    let snapshot = Snapshot {
        driver_error: spec
            .driver_failed
            .then(|| DriverError::Nvml("failed".to_string())),
        // Process N started at tick 7(N + 1); PID 1 at 0.
        uptime_ticks: spec
            .min_age
            .is_none_or(|(_, known)| known)
            .then_some((spec.processes.len() as u64 + 1) * 7),
        ..snapshot(vec![first, second], processes)
    };

    let count = spec.processes.len();
    let self_pid = pid_at(spec, spec.self_position % count);
    let mut ancestors = BTreeSet::new();
    let mut current = self_pid;
    while let Some(record) = snapshot.processes.get(&current) {
        if record.ppid == 0 || !ancestors.insert(record.ppid) {
            break;
        }
        current = record.ppid;
    }
    let guard = guard(self_pid, ancestors);
    let scope = Scope {
        gpus: spec.gpus.clone(),
        pids: spec
            .named
            .iter()
            .map(|&(position, stale)| {
                let pid = if position == usize::MAX {
                    1
                } else {
                    pid_at(spec, position % count)
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
        members: spec.members.as_ref().map(|members| {
            members
                .iter()
                .map(|&(position, stale)| {
                    let pid = pid_at(spec, position % count);
                    let start_time = snapshot.processes[&pid].id.start_time + u64::from(stale);
                    ProcessId { pid, start_time }
                })
                .collect()
        }),
        job: None,
        min_age: spec
            .min_age
            .map(|(floor, _)| Duration::from_millis(u64::from(floor))),
        supervisor_gone: false,
        mps_servers: BTreeSet::new(),
        within: spec.within.as_ref().map(|positions| {
            positions
                .iter()
                .map(|&position| {
                    let pid = pid_at(spec, position % count);
                    snapshot.processes[&pid].id
                })
                .collect()
        }),
        containers_gone: Default::default(),
    };
    (snapshot, scope, guard)
}

#[allow(clippy::too_many_arguments)]
fn record(
    pid: u32,
    ppid: u32,
    start_time: u64,
    pgid: u32,
    sid: u32,
    name: &str,
    uid: u32,
    state: char,
    kernel: bool,
    nodes: BTreeSet<Node>,
) -> ProcessRecord {
    ProcessRecord {
        id: ProcessId { pid, start_time },
        ppid,
        pgid,
        sid,
        uid: Some(uid),
        state: State::from_letter(state),
        // The kernel's comm: the executable's file name, cut to 15 bytes.
        comm: name
            .split(' ')
            .next()
            .and_then(|argv0| argv0.rsplit('/').next())
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

/// A host whose driver answered for `gpus`, its processes `processes`,
/// every process's descriptors read, no age known.
fn snapshot(gpus: Vec<GpuState>, processes: BTreeMap<u32, ProcessRecord>) -> Snapshot {
    Snapshot {
        backend: "test".to_string(),
        taken_at_unix_ms: 0,
        gpus,
        processes,
        unreadable: Vec::new(),
        driver_error: None,
        details: BTreeMap::new(),
        uptime_ticks: None,
        bookkeeping_slack: 0,
        evidence: BTreeMap::new(),
        evidence_note: None,
        activity: BTreeMap::new(),
        container_notes: Vec::new(),
        host_pids: Some(true),
        lists_may_omit: true,
        descriptors: gpureap_core::snapshot::Descriptors::All,
    }
}

/// gpureap's guard as `PID` with `ancestors`, the default protected names,
/// no MPS server known.
fn guard(pid: u32, ancestors: BTreeSet<u32>) -> Guard {
    Guard {
        self_pid: pid,
        ancestors,
        protected_names: DEFAULT_PROTECTED
            .iter()
            .map(|name| name.to_string())
            .collect(),
        mps_servers: BTreeSet::new(),
    }
}

fn gpu(index: u32, users: Vec<GpuUser>) -> GpuState {
    GpuState {
        mig_mode: None,
        instances: Vec::new(),
        index,
        name: Some("Simulated".to_string()),
        uuid: None,
        memory_total: Some(80 << 30),
        memory_used: Some(users.iter().filter_map(|user| user.memory).sum()),
        memory_reserved: None,
        error: None,
        users,
    }
}

/// The definition, spelled out without the implementation's shortcuts.
fn reference(snapshot: &Snapshot, scope: &Scope, guard: &Guard) -> (BTreeSet<u32>, BTreeSet<u32>) {
    // Using a GPU: listed there by a driver that answered, as this local
    // process; where the driver did not answer, having its node open while
    // listed by no driver that answered.
    let listed = |pid: u32, index: usize| {
        let gpu = &snapshot.gpus[index];
        gpu.error.is_none()
            && gpu
                .users
                .iter()
                .any(|user| user.pid == pid && user.listed && !user.hidden)
    };
    let uses = |pid: u32, index: u32| {
        if snapshot.gpus[index as usize].error.is_none() {
            listed(pid, index as usize)
        } else {
            snapshot.processes[&pid].nodes.contains(&Node::Gpu(index))
                && !(0..snapshot.gpus.len()).any(|other| listed(pid, other))
        }
    };
    let is_user = |pid: u32| uses(pid, 0) || uses(pid, 1);
    // A monitor: nodes open, no use, a driver that answered at all, and
    // every GPU whose node it holds answered.
    let is_monitor = |pid: u32| {
        let nodes = &snapshot.processes[&pid].nodes;
        snapshot.driver_error.is_none()
            && !nodes.is_empty()
            && !is_user(pid)
            && nodes.iter().all(|node| match node {
                Node::Gpu(index) => snapshot.gpus[*index as usize].error.is_none(),
                Node::Control => true,
            })
    };
    // An orphan: re-parented (to PID 1, or to a process of another session),
    // in a group whose leader is gone, not leading its own.
    let orphaned = |pid: u32| {
        let record = &snapshot.processes[&pid];
        let leader_gone = match snapshot.processes.get(&record.pgid) {
            None => true,
            Some(leader) => leader.state == State::Zombie || leader.pgid != record.pgid,
        };
        let reparented = record.ppid == 1
            || snapshot
                .processes
                .get(&record.ppid)
                .is_some_and(|parent| parent.sid != record.sid);
        pid != 1 && !record.kernel_thread && record.pgid != pid && leader_gone && reparented
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
            && (!scope.orphans || orphaned(pid))
            && scope
                .within
                .as_ref()
                .is_none_or(|within| within.contains(&record.id))
    };
    // Younger than the floor, or of an unknown age: never signalled.
    let young = |pid: u32| {
        scope.min_age.is_some_and(|floor| {
            let record = &snapshot.processes[&pid];
            snapshot.uptime_ticks.is_none_or(|uptime| {
                let ticks = uptime.saturating_sub(record.id.start_time);
                Duration::from_millis(ticks * 1000 / ticks_per_second()) < floor
            })
        })
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
    // A member of a container, pod or cgroup, by identity too.
    let member = |pid: u32| {
        scope
            .members
            .iter()
            .flatten()
            .any(|id| id.pid == pid && snapshot.processes[&pid].id == *id)
    };
    let forbidden = |pid: u32| {
        let record = &snapshot.processes[&pid];
        // argv[0]'s file name: a path names the same program.
        let program = record
            .cmdline
            .split(' ')
            .next()
            .and_then(|argv0| argv0.rsplit('/').next())
            .unwrap_or("");
        pid == guard.self_pid
            || young(pid)
            || guard.ancestors.contains(&pid)
            || pid == 1
            || record.kernel_thread
            // A name or a monitor's look is overridden by naming the process.
            || (!named(pid)
                && (guard.protected_names.iter().any(|name| {
                    program == name || record.comm == name.chars().take(15).collect::<String>()
                }) || is_monitor(pid)))
    };
    let all_pids: Vec<u32> = snapshot.processes.keys().copied().collect();
    let mut spared = BTreeSet::new();
    let chosen: BTreeSet<u32> = if scope.pids.is_empty() && scope.members.is_none() {
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
        for pid in all_pids
            .iter()
            .copied()
            .filter(|&pid| named(pid) || member(pid))
        {
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
            // A protected name is a target only when that very process was named.
            let named = scope.pids.contains(&record.id);
            prop_assert!(named || !DEFAULT_PROTECTED.contains(&record.comm.as_str()));
            prop_assert!(pid != HIDDEN_PID);
        }
    }

    /// A GPU is verified free only when nothing of the scope is listed on
    /// it: no process selected now, no earlier target (by identity: a PID
    /// that went to another process is not the target), no hidden user when
    /// the whole GPU is in scope.
    #[test]
    fn verification_holds_exactly_what_is_ours(spec in spec()) {
        let (snapshot, scope, guard) = build(&spec);
        let selection = select(&snapshot, &scope, &guard);
        // Earlier targets: the named processes, some under a stale identity
        // (their PID now belongs to another process).
        let ledger = Earlier(scope.pids.iter().copied().collect());
        for gpu in snapshot.gpus.iter().filter(|gpu| gpu.error.is_none()) {
            let whole = scope.all || scope.gpus.as_ref().is_some_and(|gpus| gpus.contains(&gpu.index));
            let assessment = assess(gpu, &snapshot, &selection, &ledger, whole);
            let expected: Vec<u32> = gpu
                .users
                .iter()
                .filter(|user| user.listed)
                .filter(|user| {
                    let record = snapshot.processes.get(&user.pid);
                    let earlier = match record {
                        Some(record) if !user.hidden => ledger.0.contains(&record.id),
                        _ => ledger.0.iter().any(|id| id.pid == user.pid),
                    };
                    earlier
                        || (user.hidden && whole)
                        || (!user.hidden
                            && (selection.targets.contains_key(&user.pid)
                                || selection.spared.contains_key(&user.pid)))
                })
                .map(|user| user.pid)
                .collect();
            prop_assert_eq!(&assessment.remaining, &expected);
            prop_assert_eq!(assessment.freed, expected.is_empty());
        }
    }
}

/// A ledger of earlier targets, by identity.
struct Earlier(BTreeSet<ProcessId>);

impl Ledger for Earlier {
    fn signals_sent(&self, id: ProcessId) -> Vec<Sig> {
        if self.0.contains(&id) {
            vec![Sig::Term]
        } else {
            Vec::new()
        }
    }
    fn permission_denied(&self, _: ProcessId) -> bool {
        false
    }
    fn was_target(&self, id: ProcessId) -> bool {
        self.0.contains(&id)
    }
    fn had_target_pid(&self, pid: u32) -> bool {
        self.0.iter().any(|id| id.pid == pid)
    }
}

/// A Slurm job's scope (`gpureap slurm epilog`): the job's processes are its
/// own whatever their name; a process that names another job is never a
/// target, nor through its parent; nor is a descendant of another uid that
/// names no job.
#[test]
fn a_job_scope_takes_the_jobs_own_and_never_another_jobs() {
    use gpureap_core::select::JobScope;
    let gpu0: BTreeSet<Node> = [Node::Gpu(0), Node::Control].into_iter().collect();
    let none = BTreeSet::new;
    let processes: BTreeMap<u32, ProcessRecord> = [
        record(1, 0, 1, 1, 1, "init", 0, 'S', false, none()),
        // The job's worker (its SLURM_JOB_ID), and under it: a process that
        // names another job, one of the job's user with no job id, root's.
        record(
            100,
            1,
            10,
            100,
            100,
            "python3 train.py",
            1000,
            'S',
            false,
            gpu0.clone(),
        ),
        record(
            101,
            100,
            11,
            100,
            100,
            "python3 other.py",
            1000,
            'S',
            false,
            none(),
        ),
        record(
            102,
            100,
            12,
            100,
            100,
            "python3 helper.py",
            1000,
            'S',
            false,
            none(),
        ),
        record(
            103,
            100,
            13,
            100,
            100,
            "python3 setuid.py",
            0,
            'S',
            false,
            none(),
        ),
        // The same user's other job on the same GPU.
        record(
            200,
            1,
            20,
            200,
            200,
            "python3 serve.py",
            1000,
            'S',
            false,
            gpu0.clone(),
        ),
        // The job's leftover under a protected name, and the daemon's name with no job.
        record(
            300,
            1,
            30,
            300,
            300,
            "nvidia-smi python train.py",
            1000,
            'S',
            false,
            gpu0.clone(),
        ),
        record(
            400,
            1,
            40,
            400,
            400,
            "nvidia-smi",
            1000,
            'S',
            false,
            gpu0.clone(),
        ),
        // A daemon a prolog started: the job's SLURM_JOB_ID, root's uid.
        record(
            500,
            1,
            50,
            500,
            500,
            "nv-hostengine",
            0,
            'S',
            false,
            gpu0.clone(),
        ),
    ]
    .into_iter()
    .map(|record| (record.id.pid, record))
    .collect();
    let id = |pid: u32| processes[&pid].id;
    let users = [100, 200, 300, 400, 500]
        .into_iter()
        .map(|pid| user(pid, true, true, false))
        .collect();
    let snapshot = snapshot(vec![gpu(0, users)], processes.clone());
    let scope = Scope {
        gpus: Some(BTreeSet::from([0])),
        job: Some(JobScope {
            uid: Some(1000),
            members: [id(100), id(300), id(500)].into_iter().collect(),
            others: [id(101), id(200)].into_iter().collect(),
            owner: Some(1000),
        }),
        ..Scope::default()
    };
    let guard = guard(999, BTreeSet::new());
    let selection = select(&snapshot, &scope, &guard);
    let targets: BTreeSet<u32> = selection.targets.keys().copied().collect();
    assert_eq!(targets, BTreeSet::from([100, 102, 300]), "{selection:?}");
    assert_eq!(
        selection.spared.keys().copied().collect::<Vec<_>>(),
        [400, 500],
        "{selection:?}"
    );
}

/// A job that started its own MPS (`nvidia-cuda-mps-control -d` in the batch
/// script, as per-job MPS setups do): the daemon and the server carry the
/// job's SLURM_JOB_ID and uid, and still neither is a target, in the job's
/// scope nor as a descendant of its named batch script; the job's client is.
#[test]
fn a_jobs_own_mps_daemon_and_server_are_never_targets() {
    use gpureap_core::select::{JobScope, Spared};
    use gpureap_core::snapshot::mps::Role;
    let gpu0: BTreeSet<Node> = [Node::Gpu(0), Node::Control].into_iter().collect();
    let none = BTreeSet::new;
    let processes: BTreeMap<u32, ProcessRecord> = [
        record(1, 0, 1, 1, 1, "init", 0, 'S', false, none()),
        record(50, 1, 5, 50, 50, "bash job.sh", 1000, 'S', false, none()),
        record(
            60,
            50,
            6,
            50,
            50,
            "/usr/bin/nvidia-cuda-mps-control -d",
            1000,
            'S',
            false,
            none(),
        ),
        record(
            61,
            60,
            7,
            50,
            50,
            "nvidia-cuda-mps-server",
            1000,
            'S',
            false,
            gpu0.clone(),
        ),
        record(
            70,
            50,
            8,
            50,
            50,
            "python3 train.py",
            1000,
            'S',
            false,
            gpu0,
        ),
    ]
    .into_iter()
    .map(|record| (record.id.pid, record))
    .collect();
    let id = |pid: u32| processes[&pid].id;
    let users = [61, 70]
        .into_iter()
        .map(|pid| user(pid, true, true, false))
        .collect();
    let snapshot = snapshot(vec![gpu(0, users)], processes.clone());
    let job = JobScope {
        uid: Some(1000),
        members: [50, 60, 61, 70].into_iter().map(id).collect(),
        others: BTreeSet::new(),
        owner: Some(1000),
    };
    let guard = guard(999, BTreeSet::new());
    for scope in [
        Scope {
            gpus: Some(BTreeSet::from([0])),
            job: Some(job.clone()),
            ..Scope::default()
        },
        Scope {
            pids: BTreeSet::from([id(50)]),
            job: Some(job.clone()),
            ..Scope::default()
        },
        Scope {
            all: true,
            ..Scope::default()
        },
    ] {
        let selection = select(&snapshot, &scope, &guard);
        let targets: BTreeSet<u32> = selection.targets.keys().copied().collect();
        assert!(targets.contains(&70), "{selection:?}");
        assert!(
            !targets.contains(&60) && !targets.contains(&61),
            "{selection:?}"
        );
        assert_eq!(
            selection.spared.get(&61),
            Some(&Spared::Mps(Role::Server)),
            "{selection:?}"
        );
    }
}
