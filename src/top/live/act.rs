//! The view's actions, through the core only: a `select::Scope` as `free`
//! builds one, the plan from `reap::plan` (the dry run `free` shows), and
//! `reap::free` on a thread of its own, whose progress and report come back
//! over a channel. No signal is sent anywhere else.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::thread;

use crate::driver::Driver;
use crate::reap::{self, FreeReport, Options};
use crate::report;
use crate::select::{Guard, Scope};
use crate::snapshot::Snapshot;
use crate::units::{Elapsed, printable};

/// What the user chose to free.
#[derive(Debug, Clone)]
pub enum Target {
    /// These processes and their descendants (`free --pid`).
    Pids(BTreeSet<u32>),
    /// Every holder of this GPU (`free --gpu`).
    Gpu(u32),
    /// Every orphaned holder (`free --orphans`).
    Orphans,
}

/// A plan shown for confirmation: the scope it came from and its text.
pub struct Planned {
    pub scope: Scope,
    pub snapshot: Snapshot,
    pub text: Vec<String>,
}

/// What the free thread says.
pub enum Event {
    Progress(String),
    Done(Box<FreeReport>),
    /// With -H: the host's plan (`free --dry-run` there), or why there is none.
    Planned(Result<Box<super::remote::Planned>, String>),
    /// With -H: the host's free, done: its verified outcome, as lines.
    Finished(Vec<String>),
}

/// The euid this view runs as; a user other than root may signal only its own processes.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The scope for a target, as `request::free` builds it: named processes by
/// identity, refused when the guard never lets them be signalled; a user
/// other than root is narrowed to its own processes (`--user`).
pub fn scope(snapshot: &Snapshot, target: &Target, guard: &Guard) -> Result<Scope, String> {
    let mut scope = Scope::default();
    match target {
        Target::Pids(pids) => {
            for &pid in pids {
                let Some(record) = snapshot.processes.get(&pid) else {
                    return Err(format!("PID {pid} is gone"));
                };
                if let Some(reason) = guard.spare_reason(snapshot, record, true) {
                    return Err(format!("refusing PID {pid}: it is {reason}"));
                }
                scope.pids.insert(record.id);
            }
        }
        Target::Gpu(index) => scope.gpus = Some(BTreeSet::from([*index])),
        Target::Orphans => scope.orphans = true,
    }
    let uid = euid();
    if uid != 0 {
        scope.uids.insert(uid);
    }
    Ok(scope)
}

/// The plan `free --dry-run` would show for this target on this snapshot.
pub fn plan(
    snapshot: &Snapshot,
    target: &Target,
    guard: &Guard,
    options: Options,
) -> Result<Planned, String> {
    let scope = scope(snapshot, target, guard)?;
    let report = reap::plan(snapshot, &scope, guard);
    let mut text: Vec<String> = report::free_plan_entries(&report)
        .iter()
        .map(|line| printable(line).into_owned())
        .collect();
    text.push(format!(
        "Then: SIGTERM, {} later SIGSTOP+SIGKILL, and the driver checked for up to {}.",
        Elapsed(options.grace()),
        Elapsed(options.timeout())
    ));
    if euid() != 0 {
        text.push(format!(
            "Not root: only processes of uid {} can be signalled; others are left out.",
            euid()
        ));
    }
    Ok(Planned {
        scope,
        snapshot: snapshot.clone(),
        text,
    })
}

/// Starts `reap::free` for a confirmed plan, from the snapshot the plan was
/// made on (as `free` does), on a thread of its own.
pub fn start(
    driver: Arc<dyn Driver>,
    planned: Planned,
    guard: Guard,
    options: Options,
    events: Sender<Event>,
) {
    thread::spawn(move || {
        let progress_events = events.clone();
        let outcome = reap::free(
            driver.as_ref(),
            &planned.scope,
            &guard,
            planned.snapshot,
            options,
            &mut |progress| {
                let _ = progress_events.send(Event::Progress(report::progress_text(progress)));
            },
        );
        let _ = events.send(Event::Done(Box::new(outcome)));
    });
}

/// The result lines: what was signalled and what had already exited
/// (`report::free_counts`), then memory back per GPU and the time, or why
/// it is still held.
pub fn result_lines(outcome: &FreeReport) -> Vec<String> {
    let mut lines = vec![format!(
        "{} after {}: {}",
        if outcome.all_freed() {
            "Freed"
        } else {
            "Not all freed"
        },
        Elapsed(std::time::Duration::from_millis(outcome.elapsed_ms)),
        report::free_counts(outcome)
    )];
    lines.extend(
        report::gpu_outcome_lines(outcome)
            .iter()
            .map(|line| printable(line).into_owned()),
    );
    lines
}
