//! What good starts of this server looked like, remembered in the state
//! directory, so that a stalled start can be measured against them:
//! "stalled at log line 217; good starts were ready at lines 636–641".

use std::io;

use serde::{Deserialize, Serialize};

use crate::state::StateDir;

/// How many good starts are remembered.
const KEPT: usize = 20;
const FILE: &str = "starts.json";
/// Twenty good starts take about 2 KiB; anything much larger is not ours.
const MAX_FILE_BYTES: u64 = 1 << 20;

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
    /// Reads the history; a missing file is an empty history. A file that
    /// is not a regular file, is too large, or is not a history is an error
    /// (the caller says so and goes on with an empty history, which the
    /// next good start replaces).
    pub fn load(dir: &StateDir) -> io::Result<History> {
        match dir.read(FILE, MAX_FILE_BYTES)? {
            None => Ok(History::default()),
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|error| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {error}", dir.path().join(FILE).display()),
                )
            }),
        }
    }

    /// Remembers one good start, written atomically (rename) so a crash
    /// never leaves a half-written file. The file is read again first, so
    /// that another gpureap running the same command loses nothing.
    pub fn record(&mut self, dir: &StateDir, start: GoodStart) -> io::Result<()> {
        *self = History::load(dir).unwrap_or_default();
        self.remember(start);
        let text = serde_json::to_string_pretty(self).map_err(io::Error::other)?;
        dir.replace(FILE, text.as_bytes())
    }

    /// Remembers one good start in memory only.
    pub fn remember(&mut self, start: GoodStart) {
        self.good_starts.push(start);
        let excess = self.good_starts.len().saturating_sub(KEPT);
        self.good_starts.drain(..excess);
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
        let base = tempfile::tempdir().expect("tempdir");
        let dir = StateDir::open(base.path()).expect("state dir");
        let mut history = History::load(&dir).expect("load");
        assert_eq!(history.summary(), "no good start recorded yet");
        for (lines, seconds) in [(636, 31.0), (641, 35.2), (638, 33.0)] {
            history
                .record(
                    &dir,
                    GoodStart {
                        lines,
                        seconds,
                        at_unix: 0,
                    },
                )
                .expect("record");
        }
        let reloaded = History::load(&dir).expect("load");
        assert_eq!(reloaded, history);
        assert_eq!(
            reloaded.summary(),
            "good starts (3) were ready at log line 636–641 after 31.0–35.2s"
        );
        for _ in 0..30 {
            history
                .record(
                    &dir,
                    GoodStart {
                        lines: 1,
                        seconds: 1.0,
                        at_unix: 0,
                    },
                )
                .expect("record");
        }
        assert_eq!(History::load(&dir).expect("load").good_starts.len(), KEPT);
    }
}
