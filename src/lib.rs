//! gpureap's binary: the entry (`cli`, `config`: flags parsed once into typed
//! config) and the front ends side by side, none importing another:
//! `status`, `free`, `waiting`, `resetting`, `fleet`, `slurm`, `exporter` and
//! `check`, `run`, `dump`, `watch`, `top`, `demo`.
//! They call the services (`gpureap-services`: the ssh transport, status
//! documents, the metrics exposition, state files, scontrol, the plan
//! library) and the core (`gpureap-core`: base, driver, pipeline, report).
//! docs/architecture.md has the map and says which crate owns what.

// The core's and the services' modules, under the names the front ends use
// for them (`crate::snapshot`, `crate::plan`).
use gpureap_core::{
    container, driver, exit, file, hostlist, members, pace, proc, reap, report, reset, select,
    signal, snapshot, stacks, stdout, supervised, tree, units, verify, wait,
};
use gpureap_services::{
    bundle, http, metrics, plan, remote, request, scontrol, state, supervision,
};
// Only the live view (`top -H`) runs a child of its own and reads a host's
// status document.
#[cfg(feature = "top")]
use gpureap_core::child;
#[cfg(feature = "top")]
use gpureap_services::status_doc;

pub mod cli;
pub mod config;
pub mod demo;
pub mod dump;
pub mod fleet;
pub mod run;
pub mod slurm;
// `gpureap top`: the live view over the same pipeline.
pub mod top;

// Monitoring: Prometheus metrics (`exporter`, `status --prometheus`) and the
// node-problem-detector check, from the same snapshot as `status`.
pub mod check;
pub mod exporter;

// `gpureap status`, `free` and `wait` on this host (with -H, `fleet` runs
// them on each host), and `reset`.
pub mod free;
pub mod resetting;
pub mod status;
pub mod waiting;

// `gpureap reap --watch`: unattended freeing by a policy, through `reap::free`.
pub mod watch;
