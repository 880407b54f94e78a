//! gpureap: see who holds each NVIDIA GPU, free exactly what was scoped, and
//! prove through the driver that the memory came back.
//!
//! The library follows the data: `snapshot` (driver + /proc) → `select`
//! (scope → targets) → `reap` (signal escalation) → `verify` (poll until freed
//! or explained) → `report` (table or JSON). `run` composes the same stages
//! around a server it started; `wait` polls the driver before a launch. The
//! binary only parses flags (`cli`, `config`), calls these, prints and exits.

pub mod child;
pub mod cli;
pub mod config;
pub mod demo;
pub mod driver;
pub mod exit;
pub mod file;
pub mod fleet;
pub mod hostlist;
pub mod proc;
pub mod reap;
pub mod report;
pub mod reset;
pub mod run;
pub mod select;
pub mod signal;
pub mod slurm;
pub mod snapshot;
pub mod supervised;
pub mod supervision;
pub mod tree;
pub mod units;
pub mod verify;
pub mod wait;

// Monitoring: Prometheus metrics (`exporter`, `status --prometheus`) and the
// node-problem-detector check, from the same snapshot as `status`.
pub mod check;
pub mod exporter;
pub mod metrics;
