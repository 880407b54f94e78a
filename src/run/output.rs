//! The server's output: read as it arrives, counted, kept in a tail for
//! bundles, and passed on to our stdout/stderr and the log file.
//!
//! A reader thread per stream never waits for anyone: the stall clock is
//! gpureap's measure of a healthy server, and a server blocked on a full pipe
//! looks exactly like a hung one. So each destination (our stdout, our stderr
//! with gpureap's own events, the log file) is a `Sink`: a bounded queue with
//! a writer thread of its own. When a destination does not keep up (a paused
//! pager, a stalled ssh session, a slow disk), its queue fills and further
//! output for it is dropped and counted, with a notice, rather than blocking
//! the reader. Every buffer the server controls is bounded: the queues, the
//! line being assembled, and the lines kept for the bundle.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use regex::Regex;

/// Lines kept for the diagnostic bundle.
pub const TAIL_LINES: usize = 200;
/// The longest line matched against `--ready-log`; the rest of a longer line
/// is counted, not kept.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// The longest line kept in the tail for the bundle.
pub const TAIL_LINE_BYTES: usize = 4 * 1024;
/// What each pass-through destination may hold while it does not keep up.
const STDOUT_QUEUE_BYTES: usize = 4 << 20;
const STDERR_QUEUE_BYTES: usize = 4 << 20;
const LOG_QUEUE_BYTES: usize = 16 << 20;
/// How long gpureap's last events may take to reach stderr at the end.
const STDERR_LAST_WORDS: Duration = Duration::from_millis(500);
/// Room kept for gpureap's own events beyond the server's share of stderr,
/// so that a server flooding stderr cannot crowd them out.
const EVENT_RESERVE_BYTES: usize = 1 << 20;

#[derive(Debug)]
pub struct LogState {
    /// Lines seen in this start, both streams.
    pub lines: u64,
    pub last_output: Instant,
    pub tail: VecDeque<String>,
    /// The line number at which `--ready-log` matched, if it has.
    pub ready_at_line: Option<u64>,
    /// The server's latest lines, kept until the engine's logged capacity
    /// is read from them (`Capacity`).
    pub capacity: CapacityText,
}

impl LogState {
    pub fn new() -> LogState {
        LogState {
            lines: 0,
            last_output: Instant::now(),
            tail: VecDeque::with_capacity(TAIL_LINES),
            ready_at_line: None,
            capacity: CapacityText::default(),
        }
    }
}

/// How much of the server's latest output is kept for reading the engine's
/// logged capacity: its KV-cache line comes shortly before the server is
/// ready (SGLang, after the pool; vLLM, after profiling), far less than this
/// before the end of a start's output.
pub const CAPACITY_TEXT_BYTES: usize = 1 << 20;

/// The server's latest lines, at most `CAPACITY_TEXT_BYTES` of them, kept
/// while the supervisor still looks for the engine's logged capacity in
/// them; closed (emptied, nothing more kept) once it stops looking.
#[derive(Debug, Default)]
pub struct CapacityText {
    lines: VecDeque<String>,
    bytes: usize,
    closed: bool,
}

impl CapacityText {
    fn push(&mut self, line: &str) {
        if self.closed {
            return;
        }
        self.bytes += line.len() + 1;
        self.lines.push_back(line.to_string());
        while self.bytes > CAPACITY_TEXT_BYTES {
            let Some(first) = self.lines.pop_front() else {
                break;
            };
            self.bytes -= first.len() + 1;
        }
    }

    /// The lines kept, as one text.
    pub fn text(&self) -> String {
        let mut text = String::with_capacity(self.bytes);
        for line in &self.lines {
            text.push_str(line);
            text.push('\n');
        }
        text
    }

    /// Stops keeping lines and lets go of those kept.
    pub fn close(&mut self) {
        self.closed = true;
        self.lines = VecDeque::new();
        self.bytes = 0;
    }
}

impl Default for LogState {
    fn default() -> Self {
        LogState::new()
    }
}

pub type SharedLog = Arc<Mutex<LogState>>;

/// A destination that never blocks whoever offers it bytes: a bounded queue
/// drained by a writer thread of its own.
#[derive(Clone)]
pub struct Sink {
    shared: Arc<SinkShared>,
}

struct SinkShared {
    /// Names the destination in notices: "stdout", "--log /var/log/x".
    name: String,
    /// Said after "dropped N bytes of the server's output" (where it went instead).
    elsewhere: String,
    capacity: usize,
    queue: Mutex<Queue>,
    changed: Condvar,
}

#[derive(Default)]
struct Queue {
    chunks: VecDeque<Vec<u8>>,
    bytes: usize,
    /// The writer is in the middle of a chunk.
    writing: bool,
    /// Bytes dropped since the destination last kept up, if it does not.
    dropping: Option<u64>,
}

impl Sink {
    /// Starts the writer thread for `destination`.
    fn start(
        name: &str,
        elsewhere: &str,
        capacity: usize,
        mut destination: Box<dyn Write + Send>,
    ) -> Sink {
        let sink = Sink {
            shared: Arc::new(SinkShared {
                name: name.to_string(),
                elsewhere: elsewhere.to_string(),
                capacity,
                queue: Mutex::new(Queue::default()),
                changed: Condvar::new(),
            }),
        };
        let shared = Arc::clone(&sink.shared);
        // The thread lives as long as gpureap: it ends with the process.
        std::thread::spawn(move || {
            loop {
                let chunk = {
                    let Ok(mut queue) = shared.queue.lock() else {
                        return;
                    };
                    while queue.chunks.is_empty() {
                        queue = match shared.changed.wait(queue) {
                            Ok(queue) => queue,
                            Err(_) => return,
                        };
                    }
                    let chunk = queue.chunks.pop_front().unwrap_or_default();
                    queue.bytes -= chunk.len();
                    queue.writing = true;
                    chunk
                };
                // A closed destination (EPIPE) only discards: the server still runs.
                let _ = destination
                    .write_all(&chunk)
                    .and_then(|()| destination.flush());
                if let Ok(mut queue) = shared.queue.lock() {
                    queue.writing = false;
                }
                shared.changed.notify_all();
            }
        });
        sink
    }

    /// Queues the server's `bytes`, or drops them (counted, with a notice)
    /// when the destination has fallen `capacity` behind. Never waits for it.
    pub fn offer(&self, bytes: &[u8]) {
        let shared = &self.shared;
        let Ok(mut queue) = shared.queue.lock() else {
            return;
        };
        if queue.bytes + bytes.len() > shared.capacity {
            let first = queue.dropping.is_none();
            *queue.dropping.get_or_insert(0) += bytes.len() as u64;
            drop(queue);
            if first {
                event(&format!(
                    "{} is not keeping up; dropping the server's output until it does{}",
                    shared.name, shared.elsewhere
                ));
            }
            return;
        }
        let caught_up = queue.dropping.take();
        queue.chunks.push_back(bytes.to_vec());
        queue.bytes += bytes.len();
        drop(queue);
        shared.changed.notify_all();
        if let Some(dropped) = caught_up {
            event(&self.dropped(dropped));
        }
    }

    fn dropped(&self, bytes: u64) -> String {
        format!(
            "{} is not keeping up; dropped {bytes} bytes of the server's output{}",
            self.shared.name, self.shared.elsewhere
        )
    }

    /// Queues one of gpureap's own event lines. Events have a reserve beyond
    /// the server's share of the queue, and neither end nor count a drop of
    /// the server's output; one that finds even the reserve full is lost.
    fn event(&self, text: &str) {
        let shared = &self.shared;
        let line = format!("gpureap run: {}\n", crate::units::one_line(text));
        let Ok(mut queue) = shared.queue.lock() else {
            return;
        };
        if queue.bytes + line.len() > shared.capacity + EVENT_RESERVE_BYTES {
            return;
        }
        queue.bytes += line.len();
        queue.chunks.push_back(line.into_bytes());
        drop(queue);
        shared.changed.notify_all();
    }

    /// Waits until everything queued is written, at most until `deadline`.
    /// Returns the notice to give for what was dropped and not reported yet,
    /// what is still unwritten included, if anything was.
    fn finish(&self, deadline: Instant) -> Option<String> {
        let shared = &self.shared;
        let mut queue = shared.queue.lock().ok()?;
        while !queue.chunks.is_empty() || queue.writing {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            queue = shared.changed.wait_timeout(queue, left).ok()?.0;
        }
        let dropped = queue.dropping.take().unwrap_or(0) + queue.bytes as u64;
        (dropped > 0).then(|| self.dropped(dropped))
    }
}

/// Where the server's output and gpureap's events go for the whole run.
pub struct Outputs {
    pub stdout: Sink,
    pub stderr: Sink,
    pub log: Option<Sink>,
}

/// gpureap's stderr once `Outputs::start` ran: events go through its queue
/// too, so that a stderr nobody reads never stops the supervisor.
static EVENTS: OnceLock<Sink> = OnceLock::new();

/// One line on stderr, `gpureap run: TEXT`. It never blocks: a stderr that
/// is closed (an ssh drop) or not read (a paused pager) must not stop the
/// supervisor, which still has a server to watch and stop.
pub fn event(text: &str) {
    match EVENTS.get() {
        Some(events) => events.event(text),
        None => {
            let _ = writeln!(
                io::stderr(),
                "gpureap run: {}",
                crate::units::one_line(text)
            );
        }
    }
}

/// A descriptor of our own on stdout or stderr, so that a writer blocked on
/// it holds no lock that the rest of gpureap (a panic message, the final
/// flush) would wait for; the standard handle where it cannot be had.
fn own_handle<W: Write + Send + 'static>(
    fd: rustix::fd::BorrowedFd<'static>,
    standard: fn() -> W,
) -> Box<dyn Write + Send> {
    match rustix::io::fcntl_dupfd_cloexec(fd, 3) {
        Ok(own) => Box::new(File::from(own)),
        Err(_) => Box::new(standard()),
    }
}

impl Outputs {
    /// Starts the writers: our stdout, our stderr (which also carries
    /// gpureap's events from now on), and the log file if there is one.
    pub fn start(log: Option<(File, String)>) -> Outputs {
        let elsewhere = match &log {
            Some((_, path)) => format!(" (all of it is in --log {path})"),
            None => String::new(),
        };
        let stderr = Sink::start(
            "stderr",
            &elsewhere,
            STDERR_QUEUE_BYTES,
            own_handle(rustix::stdio::stderr(), io::stderr),
        );
        let _ = EVENTS.set(stderr.clone());
        let stdout = Sink::start(
            "stdout",
            &elsewhere,
            STDOUT_QUEUE_BYTES,
            own_handle(rustix::stdio::stdout(), io::stdout),
        );
        let log = log.map(|(file, path)| {
            Sink::start(
                &format!("--log {path}"),
                "",
                LOG_QUEUE_BYTES,
                Box::new(file),
            )
        });
        Outputs {
            stdout,
            stderr,
            log,
        }
    }

    /// Lets every destination catch up, at most for `limit` in all, and
    /// reports what was dropped and not yet reported.
    pub fn finish(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        for sink in std::iter::once(&self.stdout).chain(&self.log) {
            if let Some(notice) = sink.finish(deadline) {
                event(&notice);
            }
        }
        // Our stderr last, with the notices above; what it cannot write by then is lost.
        let _ = self
            .stderr
            .finish(deadline.max(Instant::now() + STDERR_LAST_WORDS));
    }
}

/// The line being assembled: its first `MAX_LINE_BYTES`, and its length.
#[derive(Default)]
struct Line {
    kept: Vec<u8>,
    length: u64,
}

/// Starts a thread reading `source` as it arrives: the stall clock, the line
/// count, the tail and `--ready-log` first, then the bytes are offered to
/// the log file and to `pass_through` (our stream of the same kind). Lines
/// end at `\n` or `\r`: a progress bar that only rewrites its line (tqdm
/// loading weights) is output too, and must not look like silence.
pub fn pump(
    source: impl Read + Send + 'static,
    pass_through: Sink,
    log: Option<Sink>,
    state: SharedLog,
    ready: Option<Regex>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut source = source;
        let mut chunk = vec![0u8; 64 * 1024];
        let mut line = Line::default();
        loop {
            let read = match source.read(&mut chunk) {
                Ok(0) => break,
                Ok(read) => read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let bytes = &chunk[..read];
            let Ok(mut state) = state.lock() else { break };
            state.last_output = Instant::now();
            let mut rest = bytes;
            while !rest.is_empty() {
                let end = rest.iter().position(|&byte| byte == b'\n' || byte == b'\r');
                let (part, after) = match end {
                    Some(at) => (&rest[..at], Some(&rest[at + 1..])),
                    None => (rest, None),
                };
                let room = MAX_LINE_BYTES.saturating_sub(line.kept.len());
                line.kept.extend_from_slice(&part[..part.len().min(room)]);
                line.length += part.len() as u64;
                match after {
                    Some(after) => {
                        if line.length > 0 {
                            state.add_line(&line, ready.as_ref());
                            line = Line::default();
                        }
                        rest = after;
                    }
                    None => rest = &[],
                }
            }
            drop(state);
            if let Some(log) = &log {
                log.offer(bytes);
            }
            pass_through.offer(bytes);
        }
        if line.length > 0
            && let Ok(mut state) = state.lock()
        {
            state.add_line(&line, ready.as_ref());
        }
    })
}

impl LogState {
    fn add_line(&mut self, line: &Line, ready: Option<&Regex>) {
        self.lines += 1;
        let text = String::from_utf8_lossy(&line.kept);
        if self.ready_at_line.is_none() && ready.is_some_and(|regex| regex.is_match(&text)) {
            self.ready_at_line = Some(self.lines);
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        let text = text.trim_end();
        self.capacity.push(text);
        let shown = if text.len() <= TAIL_LINE_BYTES && line.length <= TAIL_LINE_BYTES as u64 {
            text.to_string()
        } else {
            let mut end = TAIL_LINE_BYTES.min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            format!(
                "{} [… {} bytes cut]",
                &text[..end],
                line.length.saturating_sub(end as u64)
            )
        };
        self.tail.push_back(shown);
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
            event(&format!(
                "the server's output pipe is still open after {}s; not waiting for it",
                limit.as_secs()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pumps `input` to the end and returns what the reader made of it.
    fn pumped(input: Vec<u8>, ready: &str) -> LogState {
        let sink = || Sink::start("test", "", 16 << 20, Box::new(io::sink()));
        let state = SharedLog::default();
        let pump = pump(
            io::Cursor::new(input),
            sink(),
            Some(sink()),
            Arc::clone(&state),
            Some(Regex::new(ready).expect("regex")),
        );
        pump.join().expect("pump");
        Arc::try_unwrap(state)
            .expect("one owner")
            .into_inner()
            .expect("lock")
    }

    #[test]
    fn lines_end_at_newlines_and_carriage_returns_and_long_ones_are_cut() {
        let mut input = b"first\r\n\rsecond 50%\rsecond 100%\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 3 * MAX_LINE_BYTES));
        input.extend(b"\nready\nlast words without newline");
        let state = pumped(input, "^ready$");
        assert_eq!(state.lines, 6);
        assert_eq!(state.ready_at_line, Some(5));
        let tail: Vec<&str> = state.tail.iter().map(String::as_str).collect();
        assert_eq!(tail[..3], ["first", "second 50%", "second 100%"]);
        assert_eq!(
            tail[3],
            format!(
                "{} [… {} bytes cut]",
                "x".repeat(TAIL_LINE_BYTES),
                3 * MAX_LINE_BYTES - TAIL_LINE_BYTES
            )
        );
        assert_eq!(tail[4..], ["ready", "last words without newline"]);
    }

    #[test]
    fn the_capacity_text_keeps_the_latest_mebibyte_until_closed() {
        let mut input = Vec::new();
        input.extend(b"KV Cache is allocated. #tokens: 1\n");
        let filler = format!("{}\n", "x".repeat(1023));
        for _ in 0..(CAPACITY_TEXT_BYTES / 1024) {
            input.extend(filler.as_bytes());
        }
        input.extend(b"[TP0] KV Cache is allocated. #tokens: 2, KV size: 1.00 GB\n");
        let mut state = pumped(input, "never");
        let text = state.capacity.text();
        assert!(text.len() <= CAPACITY_TEXT_BYTES, "{}", text.len());
        assert!(!text.contains("#tokens: 1\n"), "the oldest line is gone");
        assert_eq!(
            crate::plan::calibrate::read_log(&text).tokens,
            Some(2),
            "the latest is read"
        );
        state.capacity.close();
        state.capacity.push("KV Cache is allocated. #tokens: 3");
        assert_eq!(state.capacity.text(), "", "nothing kept once closed");
    }

    #[test]
    fn a_ready_line_past_the_kept_part_of_a_long_line_is_not_matched() {
        let mut input = vec![b'y'; MAX_LINE_BYTES];
        input.extend(b"ready\n");
        assert_eq!(pumped(input, "ready").ready_at_line, None);
    }

    #[test]
    fn a_destination_that_does_not_keep_up_drops_instead_of_blocking() {
        // A writer that never returns: a paused pager.
        struct Stuck;
        impl Write for Stuck {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                loop {
                    std::thread::park();
                }
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::start("stdout", "", 100, Box::new(Stuck));
        sink.offer(&[b'z'; 10]);
        while sink.shared.queue.lock().expect("queue").bytes > 0 {
            std::thread::yield_now();
        }
        for _ in 1..100 {
            sink.offer(&[b'z'; 10]);
        }
        let notice = sink
            .finish(Instant::now() + Duration::from_millis(50))
            .expect("a drop to report");
        // One chunk went to the stuck writer; the ten left in the queue count as dropped too.
        assert_eq!(
            notice,
            "stdout is not keeping up; dropped 990 bytes of the server's output"
        );
    }
}
