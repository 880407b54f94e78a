//! One integration-test binary: real processes, real signals, the real /proc,
//! and the simulated GPU driver.

mod fleet;
mod harness;
mod incidents;
mod input;
mod old_kernel;
mod portable;
mod run;
mod run_output;
mod run_stale;
mod run_state;
mod schema;
mod select_props;
mod sim;
mod sshd_lab;
mod status;
