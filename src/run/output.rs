//! The server's output: passed through to our stdout/stderr and into the log
//! file line by line as it arrives, counted, and kept in a tail for bundles.
//! A reader thread per stream; nothing is lost at a crash, because the pipes
//! are read to their end.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use regex::Regex;

/// Lines kept for the diagnostic bundle.
pub const TAIL_LINES: usize = 200;

#[derive(Debug)]
pub struct LogState {
    /// Lines seen in this start, both streams.
    pub lines: u64,
    pub last_output: Instant,
    pub tail: VecDeque<String>,
    /// The line number at which `--ready-log` matched, if it has.
    pub ready_at_line: Option<u64>,
}

impl LogState {
    pub fn new() -> LogState {
        LogState {
            lines: 0,
            last_output: Instant::now(),
            tail: VecDeque::with_capacity(TAIL_LINES),
            ready_at_line: None,
        }
    }
}

impl Default for LogState {
    fn default() -> Self {
        LogState::new()
    }
}

pub type SharedLog = Arc<Mutex<LogState>>;

#[derive(Clone, Copy)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Starts a thread copying `source` line by line to our own stream of the
/// same kind and to the log file, updating `state`.
pub fn pump(
    source: impl Read + Send + 'static,
    stream: Stream,
    log_file: Option<Arc<Mutex<File>>>,
    state: SharedLog,
    ready: Option<Regex>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(source);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            // Pass-through first: a full terminal must not lose the log file's copy, and vice versa.
            let _ = match stream {
                Stream::Stdout => io::stdout().lock().write_all(&line),
                Stream::Stderr => io::stderr().lock().write_all(&line),
            };
            if let Some(file) = &log_file
                && let Ok(mut file) = file.lock()
            {
                let _ = file.write_all(&line);
                let _ = file.flush();
            }
            let text = String::from_utf8_lossy(&line).trim_end().to_string();
            if let Ok(mut state) = state.lock() {
                state.lines += 1;
                state.last_output = Instant::now();
                if state.ready_at_line.is_none()
                    && ready.as_ref().is_some_and(|regex| regex.is_match(&text))
                {
                    state.ready_at_line = Some(state.lines);
                }
                if state.tail.len() == TAIL_LINES {
                    state.tail.pop_front();
                }
                state.tail.push_back(text);
            }
        }
    })
}
