//! `gpureap dump`: the diagnostic bundle `run` writes at a hang, for
//! processes gpureap did not start: a server started by hand, by Slurm, by
//! another supervisor. The processes are chosen as `free` chooses its
//! targets (`select` on a snapshot), and only read: their stacks
//! (`crate::stacks`), their tree, the GPUs. Nothing is signalled.
//!
//! The folder is made under `--out`, opened as `run`'s state directory is
//! (the services' `state::StateDir`: refused if anyone but the caller or root could
//! tamper with it), since it holds command lines and with them tokens.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::bundle::{Bundle, CpuSamples};
use crate::driver::BackendChoice;
use crate::exit::{Exit, Failure};
use crate::request::{self, UsageError};
use crate::select::Guard;
use crate::snapshot::Snapshot;
use crate::stacks::{self, Capture, Limits};
use crate::state::{StateDir, StateDirError};
use crate::stdout::emit;

/// Why no bundle was written.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The output folder could be tampered with: nothing written (exit 2).
    #[error(
        "refusing --out {path}: {problem}; give --out a directory of your own that only you can write"
    )]
    Refused { path: PathBuf, problem: String },
    /// An I/O error (exit 3).
    #[error("cannot write the bundle under {path}: {source}")]
    Failed {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a dump wrote.
pub struct Dumped {
    pub folder: PathBuf,
    pub processes: usize,
    pub stacks: Capture,
}

/// Captures the stacks of `pids` (read from `snapshot`), then writes the
/// bundle under `out`. `asked` says how they were chosen, for the summary.
pub fn write(
    snapshot: &Snapshot,
    pids: &BTreeSet<u32>,
    out: &Path,
    asked: &str,
) -> Result<Dumped, DumpError> {
    let parent = StateDir::open(out).map_err(|error| match error {
        StateDirError::Unsafe { path, problem } => DumpError::Refused { path, problem },
        StateDirError::Io { path, source } => DumpError::Failed { path, source },
    })?;
    let captured = stacks::capture(&pids.iter().copied().collect::<Vec<_>>(), Limits::default());
    let bundle = Bundle {
        schema_version: crate::report::SCHEMA_VERSION,
        kind: "bundle",
        reason: format!("dump: on demand ({asked})"),
        progress: "not started by gpureap: no log, no progress".to_string(),
        start: 0,
        lines: 0,
        seconds: 0.0,
        containment: "none: not started by gpureap".to_string(),
        command: pids
            .first()
            .map(|&pid| crate::proc::cmdline(pid))
            .unwrap_or_default(),
        members: Bundle::members(snapshot, pids, &CpuSamples::default()),
        log_tail: Vec::new(),
        gpu: serde_json::from_str(&crate::report::status_json(snapshot, &None)).unwrap_or_default(),
        stacks: captured,
    };
    let folder = bundle
        .write(&parent, snapshot)
        .map_err(|source| DumpError::Failed {
            path: out.to_path_buf(),
            source,
        })?;
    Ok(Dumped {
        folder,
        processes: pids.len(),
        stacks: bundle.stacks,
    })
}

/// `dump`: the processes in scope, chosen as `free` chooses (nothing is
/// signalled), their stacks and the bundle; the folder and where they wait
/// are printed.
pub fn dump(backend: &BackendChoice, request: &request::DumpRequest) -> Result<Exit, Failure> {
    // gpu.txt says itself when there is no driver.
    let (driver, gpu) = request::gpu_names(request::open_driver_quietly(backend)?, &request.gpu)?;
    let request = &request::DumpRequest {
        gpu,
        ..request.clone()
    };
    let gpu_count = request::gpu_count(driver.as_ref());
    request::gpus(&request.gpu, gpu_count)?;
    let named = request.pid.iter().copied().collect();
    let snapshot = Snapshot::take_focused(driver.as_ref(), &named);
    let guard = Guard::for_this_process(&[]);
    let scope = request::dump_scope(request, gpu_count, &snapshot, &guard)?;
    let pids: BTreeSet<u32> = crate::select::select(&snapshot, &scope, &guard)
        .targets
        .into_keys()
        .collect();
    let mut asked: Vec<String> = request
        .pid
        .iter()
        .map(|pid| format!("--pid {pid}"))
        .collect();
    asked.extend(
        request
            .patterns
            .iter()
            .map(|regex| format!("--match {regex}")),
    );
    if let Some(gpus) = &scope.gpus {
        let gpus: Vec<String> = gpus.iter().map(u32::to_string).collect();
        asked.push(format!("--gpu {}", gpus.join(",")));
    }
    let asked = asked.join(" ");
    if pids.is_empty() {
        return Err(UsageError(format!(
            "nothing to dump: no process is in scope of {}; --match and --gpu take GPU users (see `gpureap status`), --pid any process",
            crate::units::one_line(&asked)
        ))
        .into());
    }
    match write(&snapshot, &pids, &request.out, &asked) {
        Ok(dumped) => {
            let mut text = format!(
                "gpureap dump: {} process(es): {}\nstacks: {}\n",
                dumped.processes,
                dumped.folder.display(),
                dumped.stacks.summary
            );
            for note in &dumped.stacks.notes {
                text.push_str(&format!("note: {note}\n"));
            }
            emit(&text)?;
            Ok(Exit::Success)
        }
        Err(error @ DumpError::Refused { .. }) => Err(UsageError(error.to_string()).into()),
        Err(error) => Err(Failure::new(Exit::Incomplete, error)),
    }
}
