//! What several of gpureap's front ends need, once: the layer between the
//! front ends (the binary) and the core (`gpureap-core`).
//!
//! - `request`: what each command was asked, typed, and its resolution
//!   against this host (every front end; the entry makes them);
//! - `remote`: one command on many hosts over the user's ssh (fleet, top -H);
//! - `status_doc`: the one typed reader of a host's status document (fleet,
//!   top -H);
//! - `metrics` and `http`: the Prometheus exposition and its HTTP server
//!   (exporter, check, run --metrics, reap --watch --listen);
//! - `state` and `bundle`: a run's state directory and its evidence files
//!   (run, dump, slurm, watch);
//! - `scontrol`: the bounded Slurm client (slurm, reap --watch);
//! - `supervision`: what a gone `gpureap run` left (run, free --stale-runs,
//!   demo);
//! - `plan`: the engines' KV-cache arithmetic as a library (plan, run --plan,
//!   fleet, demo).
//!
//! Nothing here imports a front end or reads the command line.

// The core's modules, under the names the services use for them.
use gpureap_core::{
    child, container, driver, exit, file, hostlist, members, proc, reap, report, select, signal,
    snapshot, stacks, supervised, tree, units,
};

pub mod bundle;
pub mod http;
pub mod metrics;
pub mod plan;
pub mod remote;
pub mod request;
pub mod scontrol;
pub mod state;
pub mod status_doc;
pub mod supervision;
