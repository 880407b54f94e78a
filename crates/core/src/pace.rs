//! When a mode left running looks at the host in full, and what it watches
//! between: the one policy of `reap --watch`, `top` and the exporter.
//!
//! A full look (a snapshot) costs a pass over /proc; at 5,000 processes
//! one a second (`top`) was 11% of a core, one every 10 s (the watch) some
//! 2%. Nothing these modes show or act on can appear without one of these,
//! which cost next to nothing to watch, changing first:
//!
//! - the driver's memory figures (a process that gains or loses a context):
//!   watched with `Driver::wait_for_change` between cycles (NVML polls its
//!   counters; the simulated driver watches its known holders);
//! - a process of the holders' context dying: a holder, an ancestor of one
//!   (a launcher, a `gpureap run`, slurmstepd, a container's shim), or its
//!   group leader. An orphan is made by such a death, so is a gone
//!   supervisor or an ended job step: each identity is checked by its start
//!   time in /proc, a `stat` each;
//! - a holder reaching the age floor (`of_age`).
//!
//! A full look is also taken when the caller forces one (the watch: while a
//! rule's holders wait for their second look, after a fault; `top`: after a
//! free), and at least every `FULL_LOOK_EVERY` cycles, for what the above
//! misses (a changed command line or owner, a monitor opening a node).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::driver::Driver;
use crate::proc::{self, ProcessId};
use crate::snapshot::Snapshot;

/// At least one full look in this many cycles.
pub const FULL_LOOK_EVERY: u32 = 6;
/// How often the driver's figures are read between cycles.
const POLL: Duration = Duration::from_millis(250);

#[derive(Debug, Default)]
pub struct Pace {
    /// The driver's memory figures at the last full look.
    figures: BTreeMap<u32, Option<u64>>,
    /// The holders, their ancestors and group leaders then.
    context: Vec<ProcessId>,
    /// The figures moved since.
    changed: bool,
    /// Cycles since the last full look.
    since_full: u32,
    /// When a holder spared for its age reaches the floor.
    of_age_at: Option<Instant>,
}

impl Pace {
    /// Remembers what a full look saw.
    pub fn looked(&mut self, snapshot: &Snapshot) {
        self.figures = snapshot
            .gpus
            .iter()
            .map(|gpu| (gpu.index, gpu.memory_used))
            .collect();
        let tree = snapshot.tree();
        let mut context = BTreeSet::new();
        for pid in snapshot.holders() {
            let Some(record) = snapshot.processes.get(&pid) else {
                continue;
            };
            context.insert(pid);
            context.insert(record.pgid);
            context.extend(tree.ancestors(pid));
        }
        self.context = context
            .into_iter()
            .filter_map(|pid| snapshot.processes.get(&pid).map(|record| record.id))
            .collect();
        self.changed = false;
        self.since_full = 0;
    }

    /// In how long a holder spared for its age reaches the floor, if one is.
    pub fn of_age(&mut self, within: Option<Duration>) {
        self.of_age_at = within.map(|within| Instant::now() + within);
    }

    /// Whether this cycle takes a full look (`force`: it must).
    pub fn full_look_due(&mut self, force: bool) -> bool {
        self.since_full += 1;
        force
            || self.changed
            || self.since_full >= FULL_LOOK_EVERY
            || self.of_age_at.is_some_and(|at| Instant::now() >= at)
            || self
                .context
                .iter()
                .any(|id| proc::start_time(id.pid) != Some(id.start_time))
    }

    /// Whether the driver's figures moved since the last full look.
    pub fn changed(&self) -> bool {
        self.changed
    }

    /// Waits up to `limit`, noting whether the driver's figures moved.
    pub fn wait(&mut self, driver: &dyn Driver, limit: Duration) {
        if self.changed || self.figures.is_empty() {
            std::thread::sleep(limit);
        } else if driver.wait_for_change(&self.figures, POLL, limit).is_some() {
            self.changed = true;
        }
    }
}
