//! gpureap: see who holds each NVIDIA GPU, free exactly what was scoped, and
//! prove through the driver that the memory came back.
//!
//! The library follows the data: `snapshot` (driver + /proc, and the one rule
//! for memory held by no process) → `select` (scope → targets) → `reap`
//! (signal escalation, looking again until verified or out of time) →
//! `verify` (from one snapshot: freed, or why not) → `report` (table or
//! JSON). The front ends compose these stages: `run` around a server it
//! started, `dump` around one it did not, `fleet` over ssh, `slurm`, `exporter`
//! and `check`, `demo`;
//! `wait` polls the driver before a launch. Below them all are the base's
//! leaves (`proc`, `units`, `exit`, `signal`, `child`, `hostlist`, `file`).
//! The binary parses flags into typed config (`cli`, `config`), dispatches,
//! prints and exits with the code `exit` names. docs/architecture.md has
//! the module map.

pub mod child;
pub mod cli;
pub mod config;
pub mod container;
pub mod demo;
pub mod driver;
pub mod dump;
pub mod exit;
pub mod file;
pub mod fleet;
pub mod hostlist;
pub mod members;
pub mod pace;
pub mod proc;
pub mod reap;
pub mod report;
pub mod reset;
pub mod run;
pub mod select;
pub mod signal;
pub mod slurm;
pub mod snapshot;
pub mod stacks;
pub mod stdout;
pub mod supervised;
pub mod supervision;
// `gpureap top`: the live view over the same pipeline.
pub mod top;
pub mod tree;
pub mod units;
pub mod verify;
pub mod wait;

// Monitoring: Prometheus metrics (`exporter`, `status --prometheus`) and the
// node-problem-detector check, from the same snapshot as `status`.
pub mod check;
pub mod exporter;
pub mod metrics;

// `gpureap status`, `free` and `wait` on this host (with -H, `fleet` runs
// them on each host), and `reset`.
pub mod free;
pub mod resetting;
pub mod status;
pub mod waiting;

// `gpureap reap --watch`: unattended freeing by a policy, through `reap::free`.
pub mod watch;

// `gpureap plan`: the engines' KV-cache arithmetic on a launch command line.
pub mod plan;
