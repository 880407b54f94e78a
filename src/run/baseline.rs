//! What good starts of this server looked like, remembered in the state
//! directory, so that a stalled start can be measured against them:
//! "stalled at log line 217; good starts were ready at lines 636–641".

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// How many good starts are remembered.
const KEPT: usize = 20;
const FILE: &str = "starts.json";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GoodStart {
    /// Log lines printed before the server was ready.
    pub lines: u64,
    /// Seconds from start to ready.
    pub seconds: f64,
    pub at_unix: u64,
}

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct History {
    pub good_starts: Vec<GoodStart>,
}

impl History {
    /// Reads the history; a missing or unreadable file is an empty history.
    pub fn load(dir: &Path) -> History {
        fs::read_to_string(dir.join(FILE))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    }

    /// Remembers one good start, written atomically (rename) so a crash
    /// never leaves a half-written file. The file is read again first, so
    /// that another gpureap running the same command loses nothing.
    pub fn record(&mut self, dir: &Path, start: GoodStart) -> std::io::Result<()> {
        *self = History::load(dir);
        self.good_starts.push(start);
        let excess = self.good_starts.len().saturating_sub(KEPT);
        self.good_starts.drain(..excess);
        fs::create_dir_all(dir)?;
        let temporary = dir.join(format!("{FILE}.{}.tmp", std::process::id()));
        fs::write(
            &temporary,
            serde_json::to_string_pretty(self).unwrap_or_default(),
        )?;
        fs::rename(temporary, dir.join(FILE))
    }

    /// How good starts went, for comparison with this one.
    pub fn summary(&self) -> String {
        if self.good_starts.is_empty() {
            return "no good start recorded yet".to_string();
        }
        let lines = self.good_starts.iter().map(|s| s.lines);
        let seconds = self.good_starts.iter().map(|s| s.seconds);
        let (low_lines, high_lines) = (lines.clone().min().unwrap_or(0), lines.max().unwrap_or(0));
        let low_seconds = seconds.clone().fold(f64::INFINITY, f64::min);
        let high_seconds = seconds.fold(0.0, f64::max);
        let count = self.good_starts.len();
        let range = |low: String, high: String| {
            if low == high {
                low
            } else {
                format!("{low}–{high}")
            }
        };
        format!(
            "good starts ({count}) were ready at log line {} after {}s",
            range(low_lines.to_string(), high_lines.to_string()),
            range(format!("{low_seconds:.1}"), format!("{high_seconds:.1}"))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_and_summarises_good_starts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut history = History::load(dir.path());
        assert_eq!(history.summary(), "no good start recorded yet");
        for (lines, seconds) in [(636, 31.0), (641, 35.2), (638, 33.0)] {
            history
                .record(
                    dir.path(),
                    GoodStart {
                        lines,
                        seconds,
                        at_unix: 0,
                    },
                )
                .expect("record");
        }
        let reloaded = History::load(dir.path());
        assert_eq!(reloaded, history);
        assert_eq!(
            reloaded.summary(),
            "good starts (3) were ready at log line 636–641 after 31.0–35.2s"
        );
        for _ in 0..30 {
            history
                .record(
                    dir.path(),
                    GoodStart {
                        lines: 1,
                        seconds: 1.0,
                        at_unix: 0,
                    },
                )
                .expect("record");
        }
        assert_eq!(History::load(dir.path()).good_starts.len(), KEPT);
    }
}
