//! One integration-test binary: real processes, real signals, the real /proc,
//! and the simulated GPU driver.

mod container_scopes;
mod containers_sources;
mod demo;
mod dist_docs;
mod docs;
mod escape_props;
mod exit_codes;
mod features;
mod flat;
mod fleet;
mod fleet_flags;
mod harness;
mod held_by_no_process;
mod hostile;
mod imports;
mod incidents;
mod input;
mod mig;
mod mps;
mod old_kernel;
mod plan;
mod plan_corpus;
mod plan_fixture;
mod plan_hostile;
mod plan_version;
mod portable;
mod push;
mod reap_watch;
mod release;
mod run;
mod run_output;
mod run_plan;
mod run_stale;
mod run_state;
mod says;
mod schema;
mod scripts;
mod select_props;
mod sim;
mod slurm;
mod sshd_lab;
mod stacks;
mod status;
// The live view's own tests and its tmux driver: a build without the `top`
// feature has no view (tests/features.rs says what it does instead).
#[cfg(feature = "top")]
mod tmux;
#[cfg(feature = "top")]
mod top;
#[cfg(feature = "top")]
mod top_remote;
mod top_stream;

// Monitoring: the exporter, status --prometheus, run --metrics, check, deploy/.
mod check;
mod containers;
mod exporter;
