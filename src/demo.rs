//! `gpureap demo`: the incident users live, replayed on a simulated GPU host.
//!
//! An SGLang server with four tensor-parallel workers crashes: its launcher is
//! SIGKILLed, the workers are orphaned and keep their memory, and one of them
//! ignores SIGTERM. A colleague's notebook shares GPU 3 and an exporter watches
//! the GPUs. The demo shows the status, frees the server's holders only, and
//! shows the status again. Real processes, real signals, real /proc.

use std::io::{self, Write};
use std::time::Duration;

use crate::driver::SimDriver;
use crate::driver::sim::incident::{Holder, Incident, SimHost};
use crate::exit::Exit;
use crate::reap::{self, Options};
use crate::report;
use crate::select::{Guard, Scope};
use crate::snapshot::Snapshot;

const GIB: u64 = 1 << 30;

pub fn run(out: &mut dyn Write) -> io::Result<Exit> {
    let host = SimHost::new(4, 141 * GIB, "NVIDIA H200 (simulated)")?;
    let driver = SimDriver::open(host.path()).map_err(io::Error::other)?;
    let mut incident = Incident::new(&host);

    writeln!(
        out,
        "gpureap demo: a crashed SGLang server on a simulated 4-GPU host"
    )?;
    writeln!(out, "(simulated driver in {})\n", host.path().display())?;

    let workers: Vec<Holder> = (0..4)
        .map(|rank| {
            let worker = Holder::new(&format!("sglang::scheduler_TP{rank}"))
                .on(rank, 76 * GIB + rank as u64 * GIB / 4);
            if rank == 2 {
                worker.ignoring_sigterm()
            } else {
                worker
            }
        })
        .collect();
    let launcher = incident.sglang(&workers)?;
    incident.holder(&Holder::new("jupyter-kernel --notebook colleague.ipynb").on(3, 6 * GIB))?;
    incident.holder(&Holder::new("gpu_exporter --port 9400"))?;

    writeln!(
        out,
        "The server's launcher (pid {launcher}) is killed with SIGKILL, as `pkill -9 -f launch_server` does."
    )?;
    incident.kill(launcher)?;
    writeln!(
        out,
        "Its workers live on, holding ~76 GiB each. One of them ignores SIGTERM.\n"
    )?;

    writeln!(out, "$ gpureap status --tree")?;
    let before = Snapshot::take(&driver);
    writeln!(out, "{}", report::status_tree(&before, &None))?;

    let scope = Scope {
        patterns: vec![regex::Regex::new("sglang").map_err(io::Error::other)?],
        ..Scope::default()
    };
    let options = Options {
        grace: Duration::from_secs(2),
        timeout: Duration::from_secs(10),
        poll: Duration::from_millis(10),
    };
    writeln!(out, "$ gpureap free --match sglang --grace 2s --yes")?;
    let guard = Guard::for_this_process(&[]);
    let outcome = reap::free(&driver, &scope, &guard, before, options, &mut |_| {});
    writeln!(out, "{}", report::free_outcome(&outcome))?;

    writeln!(out, "$ gpureap status")?;
    let after = Snapshot::take(&driver);
    writeln!(out, "{}", report::status_table(&after, &None))?;

    let notebook_alive = after
        .processes
        .values()
        .any(|process| process.cmdline.starts_with("jupyter-kernel"));
    if outcome.all_freed() && notebook_alive {
        writeln!(
            out,
            "The server's GPUs are verified free; the colleague's notebook and the exporter were never signalled."
        )?;
        Ok(Exit::Success)
    } else {
        writeln!(
            out,
            "The demo did not end as expected: see the outcome above."
        )?;
        Ok(Exit::StillHeld)
    }
}
