//! `--slurm-ended`: which holders name a Slurm job that has ended.
//!
//! A holder's job is the `SLURM_JOB_ID` of its environment (read from
//! /proc before selection, so that selection stays pure). Slurm is asked
//! through the same bounded scontrol calls as the epilog
//! (the services' `scontrol`): a job Slurm no longer knows, or knows in a final
//! state, has ended; a job it cannot answer for makes a fault of this rule
//! for the look (nothing it names is signalled). An ended job stays ended, so
//! it is asked about once.

use std::collections::{BTreeMap, BTreeSet};

use crate::proc::{self, ProcessId};
use crate::scontrol::Scontrol;
use crate::snapshot::Snapshot;

use super::{ReapConfig, Rule};

/// The states after which a job runs nothing (squeue's long names).
const FINAL: [&str; 10] = [
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "REVOKED",
    "TIMEOUT",
];

/// Whether a job state Slurm shows is a final one (`CANCELLED by 0` too).
pub fn is_final(state: &str) -> bool {
    let state = state.split_whitespace().next().unwrap_or("");
    FINAL.contains(&state)
}

#[derive(Debug, Default)]
pub struct Jobs {
    /// Jobs found ended, and how.
    ended: BTreeMap<u64, String>,
    /// Each holder's job in the last look.
    of: BTreeMap<u32, u64>,
}

impl Jobs {
    /// The holders (by identity) whose job has ended, or why that cannot be told.
    pub fn ended(
        &mut self,
        snapshot: &Snapshot,
        config: &ReapConfig,
    ) -> Result<BTreeSet<ProcessId>, String> {
        self.of.clear();
        if !config.rules.contains(&Rule::SlurmEnded) {
            return Ok(BTreeSet::new());
        }
        for pid in snapshot.holders() {
            let job = proc::env_value(pid, "SLURM_JOB_ID").and_then(|id| id.trim().parse().ok());
            if let Some(job) = job {
                self.of.insert(pid, job);
            }
        }
        let asked: BTreeSet<u64> = self
            .of
            .values()
            .copied()
            .filter(|job| !self.ended.contains_key(job))
            .collect();
        if !asked.is_empty() {
            let scontrol = Scontrol::find(config.scontrol.as_deref())?;
            for job in asked {
                match scontrol.job(job)? {
                    None => {
                        self.ended.insert(
                            job,
                            format!("Slurm job {job} has ended (Slurm no longer knows it)"),
                        );
                    }
                    Some(info) if info.unreadable.is_none() && is_final(&info.state) => {
                        self.ended
                            .insert(job, format!("Slurm job {job} has ended ({})", info.state));
                    }
                    Some(_) => {}
                }
            }
        }
        // Only jobs some holder still names are remembered: a long watch's memory stays flat.
        let named: BTreeSet<u64> = self.of.values().copied().collect();
        self.ended.retain(|job, _| named.contains(job));
        Ok(self
            .of
            .iter()
            .filter(|(_, job)| self.ended.contains_key(job))
            .filter_map(|(pid, _)| snapshot.processes.get(pid).map(|record| record.id))
            .collect())
    }

    /// Why a holder's job counts as ended.
    pub fn why(&self, pid: u32) -> Option<String> {
        self.ended.get(self.of.get(&pid)?).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_states_are_slurms_own_and_nothing_running_is_one() {
        for state in [
            "COMPLETED",
            "CANCELLED by 0",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
        ] {
            assert!(is_final(state), "{state}");
        }
        for state in [
            "RUNNING",
            "COMPLETING",
            "PENDING",
            "SUSPENDED",
            "REQUEUED",
            "STOPPED",
            "",
        ] {
            assert!(!is_final(state), "{state}");
        }
    }
}
