//! The server's output: passed through to our stdout/stderr and into the log
//! file line by line as it arrives, counted, and kept in a tail for bundles.
//! A reader thread per stream; nothing is lost at a crash, because the pipes
//! are read to their end.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// Starts a thread copying `source` to our own stream of the same kind and
/// to the log file as it arrives, updating `state`. Lines end at `\n` or
/// `\r`: a progress bar that only rewrites its line (tqdm loading weights)
/// is output too, and must not look like silence.
pub fn pump(
    source: impl Read + Send + 'static,
    stream: Stream,
    log_file: Option<Arc<Mutex<File>>>,
    state: SharedLog,
    ready: Option<Regex>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut source = source;
        let mut chunk = vec![0u8; 64 * 1024];
        let mut partial: Vec<u8> = Vec::new();
        loop {
            let read = match source.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            let bytes = &chunk[..read];
            // Pass-through first, byte for byte: the terminal shows what the server wrote.
            let _ = match stream {
                Stream::Stdout => io::stdout().lock().write_all(bytes),
                Stream::Stderr => io::stderr().lock().write_all(bytes),
            };
            if let Some(file) = &log_file
                && let Ok(mut file) = file.lock()
            {
                let _ = file.write_all(bytes);
                let _ = file.flush();
            }
            let Ok(mut state) = state.lock() else { break };
            state.last_output = Instant::now();
            for &byte in bytes {
                if byte == b'\n' || byte == b'\r' {
                    if !partial.is_empty() {
                        state.add_line(&String::from_utf8_lossy(&partial), ready.as_ref());
                        partial.clear();
                    }
                } else {
                    partial.push(byte);
                }
            }
        }
        if !partial.is_empty()
            && let Ok(mut state) = state.lock()
        {
            state.add_line(&String::from_utf8_lossy(&partial), ready.as_ref());
        }
    })
}

impl LogState {
    fn add_line(&mut self, text: &str, ready: Option<&Regex>) {
        self.lines += 1;
        if self.ready_at_line.is_none() && ready.is_some_and(|regex| regex.is_match(text)) {
            self.ready_at_line = Some(self.lines);
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(text.trim_end().to_string());
    }
}

/// Waits until no output arrived for `quiet`, at most `limit`.
pub fn wait_for_quiet(state: &SharedLog, quiet: Duration, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let last = state
            .lock()
            .map(|state| state.last_output)
            .unwrap_or_else(|_| Instant::now());
        if last.elapsed() >= quiet {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Joins the pump threads once the pipes close; a pipe still held open after
/// `limit` (by a process that escaped, or is stuck in state D) is given up on.
pub fn join(pumps: Vec<JoinHandle<()>>, limit: Duration) {
    let deadline = Instant::now() + limit;
    while pumps.iter().any(|pump| !pump.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    for pump in pumps {
        if pump.is_finished() {
            let _ = pump.join();
        } else {
            let _ = writeln!(
                io::stderr(),
                "gpureap run: the server's output pipe is still open after {}s; not waiting for it",
                limit.as_secs()
            );
        }
    }
}
