//! gpureap's core: who holds each NVIDIA GPU, and freeing exactly what was
//! scoped, proven through the driver.
//!
//! Four layers, arrows downwards only (docs/architecture.md):
//!
//! - the report: `report` renders text and JSON of what the pipeline decided;
//! - the pipeline: `snapshot` (driver + /proc, and the one rule for memory
//!   held by no process) → `select` (scope → targets) → `reap` (signal
//!   escalation, looking again until verified or out of time) → `verify`
//!   (from one snapshot: freed, or why not); `wait`, `reset`, `tree`,
//!   `supervised`, `stacks` and `pace` beside them;
//! - the driver: `driver` (NVML, none, the simulator, the MIG view);
//! - the base: `proc`, `units`, `exit`, `signal`, `child`, `hostlist`, `file`,
//!   `container`, `members`.
//!
//! `tests/imports.rs` holds the arrows between the layers of this crate; the
//! services (`gpureap-services`) and the binary's front ends build on it.

// Base.
pub mod child;
pub mod container;
pub mod exit;
pub mod file;
pub mod hostlist;
pub mod members;
pub mod proc;
pub mod signal;
pub mod stdout;
pub mod units;

// Driver.
pub mod driver;

// Pipeline.
pub mod pace;
pub mod reap;
pub mod reset;
pub mod select;
pub mod snapshot;
pub mod stacks;
pub mod supervised;
pub mod tree;
pub mod verify;
pub mod wait;

// Report.
pub mod report;
