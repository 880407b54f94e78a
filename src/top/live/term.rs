//! The view's terminal, which may go away or stop being read at any time.
//!
//! Left running for hours, the view meets terminals that die (a tmux
//! session killed, an SSH connection dropped) and panes nobody reads. Three
//! rules keep it from outliving them:
//!
//! - keys are read here (`Input`), with poll(2) on stdin: an end of file, an
//!   error (EIO, ENXIO: the terminal hung up) or a hangup ends the view.
//!   crossterm's reader loops for ever on a terminal that hung up (its read
//!   returns 0 and it reads again), so it is not used;
//! - frames are written by a thread of their own (`Output`): a pane nobody
//!   reads blocks that thread in write(2), never the view, which then draws
//!   nothing new until the last frame is through, and still sees its signals;
//! - SIGTERM, SIGHUP and SIGINT ask the view to end (`Stops`); a second one,
//!   should the view not have ended, gives the terminal its modes back and
//!   ends the process from the handler itself (async-signal-safe calls only).

use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use crate::exit::Exit;

/// What leaves the alternate screen and shows the cursor again.
const LEAVE: &[u8] = b"\x1b[?1049l\x1b[?25h";
/// What enters it and hides the cursor.
const ENTER: &[u8] = b"\x1b[?1049h\x1b[?25l";
/// How long the view waits for its last frame and `LEAVE` to be written.
const RESTORE_WITHIN: Duration = Duration::from_secs(1);

/// The signals that end the view, and which came first.
pub struct Stops {
    caught: Arc<AtomicI32>,
    resized: Arc<AtomicBool>,
}

impl Stops {
    /// Registers SIGTERM, SIGHUP and SIGINT (the first asks, the second ends
    /// the process with the terminal's `saved` modes back) and SIGWINCH.
    pub fn register(saved: Option<libc::termios>) -> io::Result<Stops> {
        let caught = Arc::new(AtomicI32::new(0));
        for signal in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
            let caught = Arc::clone(&caught);
            let code = i32::from(Exit::Signalled(signal).code());
            let action = move || {
                if caught
                    .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    force_end(saved.as_ref(), code);
                }
            };
            // Safety: the action only touches an atomic and, on the second
            // signal, calls tcsetattr, poll, write and _exit, which are
            // async-signal-safe; it allocates nothing and takes no lock.
            unsafe { signal_hook::low_level::register(signal, action) }?;
        }
        let resized = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(libc::SIGWINCH, Arc::clone(&resized))?;
        Ok(Stops { caught, resized })
    }

    /// The first ending signal caught, if one was.
    pub fn caught(&self) -> Option<i32> {
        Some(self.caught.load(Ordering::SeqCst)).filter(|&signal| signal != 0)
    }

    /// A flag set while the view is to end: the sampler stops on it too.
    pub fn ending(&self) -> Arc<AtomicI32> {
        Arc::clone(&self.caught)
    }

    /// Whether the window changed size since the last call.
    pub fn resized(&self) -> bool {
        self.resized.swap(false, Ordering::SeqCst)
    }
}

/// The second signal: the terminal's modes back, the screen left if the
/// terminal takes the bytes at once, and the process ended.
fn force_end(saved: Option<&libc::termios>, code: i32) {
    restore_now(saved);
    // Safety: _exit is async-signal-safe and ends the process at once.
    unsafe { libc::_exit(code) }
}

/// Gives the terminal its `saved` modes back and leaves the alternate
/// screen if the terminal takes the bytes at once: never blocks, so that a
/// panic or a second signal on a pane nobody reads still ends.
pub fn restore_now(saved: Option<&libc::termios>) {
    // Safety: tcsetattr, poll and write are async-signal-safe; the termios
    // and the bytes outlive the calls.
    unsafe {
        if let Some(saved) = saved {
            libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, saved);
        }
        let mut out = libc::pollfd {
            fd: libc::STDOUT_FILENO,
            events: libc::POLLOUT,
            revents: 0,
        };
        if libc::poll(&mut out, 1, 0) == 1 && out.revents & libc::POLLOUT != 0 {
            libc::write(libc::STDOUT_FILENO, LEAVE.as_ptr().cast(), LEAVE.len());
        }
    }
}

/// The terminal's modes now (`None` if it has none to read).
pub fn modes() -> Option<libc::termios> {
    // Safety: tcgetattr writes a termios it is given; zeroed is a valid one.
    unsafe {
        let mut saved: libc::termios = std::mem::zeroed();
        (libc::tcgetattr(libc::STDIN_FILENO, &mut saved) == 0).then_some(saved)
    }
}

/// Why the terminal is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gone(pub String);

/// What one wait for keys found.
pub enum Keys {
    Pressed(Vec<KeyEvent>),
    None,
    Gone(Gone),
}

/// Keys from stdin.
pub struct Input {
    pending: Vec<u8>,
}

impl Input {
    pub fn new() -> Input {
        Input {
            pending: Vec::new(),
        }
    }

    /// Waits up to `limit` for keys; a signal ends the wait early.
    pub fn wait(&mut self, limit: Duration) -> Keys {
        let stdin = io::stdin();
        let mut fds = [rustix::event::PollFd::new(
            &stdin,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec::try_from(limit).ok();
        match rustix::event::poll(&mut fds, timeout.as_ref()) {
            Ok(0) => return Keys::None,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Keys::None,
            Err(error) => return Keys::Gone(Gone(format!("polling the terminal: {error}"))),
        }
        let revents = fds[0].revents();
        if revents.contains(rustix::event::PollFlags::NVAL) {
            return Keys::Gone(Gone("the terminal was closed".to_string()));
        }
        let mut buffer = [0u8; 1024];
        match rustix::io::read(stdin.as_fd(), &mut buffer) {
            Ok(0) => Keys::Gone(Gone("the terminal hung up (end of input)".to_string())),
            Ok(count) => {
                self.pending.extend_from_slice(&buffer[..count]);
                Keys::Pressed(parse_keys(&mut self.pending))
            }
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => Keys::None,
            Err(error) => Keys::Gone(Gone(format!("reading the terminal: {error}"))),
        }
    }
}

/// The keys in `bytes`, removed from it; a sequence cut short at the end is
/// read as what it starts with (a lone ESC is Esc).
pub fn parse_keys(bytes: &mut Vec<u8>) -> Vec<KeyEvent> {
    let mut keys = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (key, used) = parse_one(&bytes[at..]);
        keys.extend(key);
        at += used.max(1);
    }
    bytes.clear();
    keys
}

fn key(code: KeyCode) -> Option<KeyEvent> {
    Some(KeyEvent::new(code, KeyModifiers::NONE))
}

/// One key from the start of `bytes`, and how many bytes it took.
fn parse_one(bytes: &[u8]) -> (Option<KeyEvent>, usize) {
    match bytes[0] {
        0x1b => escape(bytes),
        b'\r' | b'\n' => (key(KeyCode::Enter), 1),
        0x7f | 0x08 => (key(KeyCode::Backspace), 1),
        b'\t' => (key(KeyCode::Tab), 1),
        control @ 0x01..=0x1a => (
            Some(KeyEvent::new(
                KeyCode::Char(char::from(control - 1 + b'a')),
                KeyModifiers::CONTROL,
            )),
            1,
        ),
        first => {
            let length = match first {
                0x00..=0x7f => 1,
                0xc0..=0xdf => 2,
                0xe0..=0xef => 3,
                0xf0..=0xf7 => 4,
                _ => return (None, 1),
            };
            let Some(text) = bytes
                .get(..length)
                .and_then(|slice| std::str::from_utf8(slice).ok())
            else {
                return (None, length.min(bytes.len()));
            };
            (
                text.chars().next().and_then(|c| key(KeyCode::Char(c))),
                length,
            )
        }
    }
}

/// An escape sequence: CSI (`ESC [`) or SS3 (`ESC O`) keys; ESC alone is Esc.
fn escape(bytes: &[u8]) -> (Option<KeyEvent>, usize) {
    match bytes.get(1) {
        Some(b'[') => {
            let Some(end) = bytes[2..].iter().position(|b| (0x40..=0x7e).contains(b)) else {
                return (None, bytes.len());
            };
            let params = &bytes[2..2 + end];
            let code = match (bytes[2 + end], params) {
                (b'A', _) => Some(KeyCode::Up),
                (b'B', _) => Some(KeyCode::Down),
                (b'C', _) => Some(KeyCode::Right),
                (b'D', _) => Some(KeyCode::Left),
                (b'H', _) | (b'~', b"1" | b"7") => Some(KeyCode::Home),
                (b'F', _) | (b'~', b"4" | b"8") => Some(KeyCode::End),
                (b'~', b"5") => Some(KeyCode::PageUp),
                (b'~', b"6") => Some(KeyCode::PageDown),
                (b'~', b"3") => Some(KeyCode::Delete),
                _ => None,
            };
            (code.and_then(key), 3 + end)
        }
        Some(b'O') if bytes.len() > 2 => {
            let code = match bytes[2] {
                b'A' => Some(KeyCode::Up),
                b'B' => Some(KeyCode::Down),
                b'C' => Some(KeyCode::Right),
                b'D' => Some(KeyCode::Left),
                b'H' => Some(KeyCode::Home),
                b'F' => Some(KeyCode::End),
                _ => None,
            };
            (code.and_then(key), 3)
        }
        _ => (key(KeyCode::Esc), 1),
    }
}

/// Frames, written to stdout by a thread of their own.
pub struct Output {
    to: Sender<Vec<u8>>,
    written: Receiver<()>,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Chunks queued and not yet written (or given up on).
    in_flight: AtomicUsize,
    gone: Mutex<Option<Gone>>,
}

impl Output {
    pub fn start() -> io::Result<Output> {
        let (to, chunks) = mpsc::channel::<Vec<u8>>();
        let (done, written) = mpsc::channel::<()>();
        let shared = Arc::new(Shared::default());
        let writer = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("gpureap-top-out".to_string())
            .spawn(move || {
                let stdout = io::stdout();
                for chunk in chunks {
                    let failed = writer.gone.lock().map_or(true, |gone| gone.is_some());
                    if !failed
                        && let Err(error) = write_all(stdout.as_fd(), &chunk)
                        && let Ok(mut gone) = writer.gone.lock()
                    {
                        *gone = Some(Gone(format!("writing to the terminal: {error}")));
                    }
                    writer.in_flight.fetch_sub(1, Ordering::SeqCst);
                    if done.send(()).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Output {
            to,
            written,
            shared,
        })
    }

    /// Queues bytes for the terminal.
    pub fn send(&self, bytes: Vec<u8>) {
        send(&self.to, &self.shared, bytes);
    }

    /// Whether everything queued has been written (or given up on).
    pub fn idle(&self) -> bool {
        self.shared.in_flight.load(Ordering::SeqCst) == 0
    }

    /// Why writing failed, if it did.
    pub fn gone(&self) -> Option<Gone> {
        self.shared.gone.lock().ok().and_then(|gone| gone.clone())
    }

    /// Waits until everything queued is written, at most until `deadline`.
    fn drain(&self, deadline: Instant) -> bool {
        while !self.idle() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.written.recv_timeout(left).is_err() {
                return self.idle();
            }
        }
        true
    }

    pub fn enter(&self) {
        self.send(ENTER.to_vec());
    }

    /// Leaves the alternate screen, if the terminal takes it within
    /// `RESTORE_WITHIN`, then gives the terminal its modes back.
    pub fn leave(&self) {
        if self.gone().is_none() {
            self.send(LEAVE.to_vec());
            self.drain(Instant::now() + RESTORE_WITHIN);
        }
        let _ = ratatui::crossterm::terminal::disable_raw_mode();
    }

    /// A writer for the frames: its bytes are queued on each flush.
    pub fn frames(&self) -> Frames {
        Frames {
            buffer: Vec::new(),
            to: self.to.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

fn send(to: &Sender<Vec<u8>>, shared: &Shared, bytes: Vec<u8>) {
    if bytes.is_empty() {
        return;
    }
    shared.in_flight.fetch_add(1, Ordering::SeqCst);
    if to.send(bytes).is_err() {
        shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The writer ratatui draws into: each flush queues its bytes on `Output`.
pub struct Frames {
    buffer: Vec<u8>,
    to: Sender<Vec<u8>>,
    shared: Arc<Shared>,
}

impl Write for Frames {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        send(&self.to, &self.shared, std::mem::take(&mut self.buffer));
        Ok(())
    }
}

/// write(2) until all of `bytes` is out; blocks while the terminal is not read.
fn write_all(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(count) => bytes = &bytes[count..],
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => {
                let mut fds = [rustix::event::PollFd::new(
                    &fd,
                    rustix::event::PollFlags::OUT,
                )];
                let _ = rustix::event::poll(&mut fds, None);
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(bytes: &[u8]) -> Vec<(KeyCode, KeyModifiers)> {
        parse_keys(&mut bytes.to_vec())
            .into_iter()
            .map(|key| (key.code, key.modifiers))
            .collect()
    }

    #[test]
    fn keys_as_terminals_send_them() {
        let none = KeyModifiers::NONE;
        assert_eq!(
            codes(b"jk/x\r"),
            vec![
                (KeyCode::Char('j'), none),
                (KeyCode::Char('k'), none),
                (KeyCode::Char('/'), none),
                (KeyCode::Char('x'), none),
                (KeyCode::Enter, none)
            ]
        );
        assert_eq!(
            codes(b"\x1b[A\x1bOB\x1b[5~\x1b[6~\x1b[H\x1b[4~\x1b"),
            vec![
                (KeyCode::Up, none),
                (KeyCode::Down, none),
                (KeyCode::PageUp, none),
                (KeyCode::PageDown, none),
                (KeyCode::Home, none),
                (KeyCode::End, none),
                (KeyCode::Esc, none)
            ]
        );
        assert_eq!(
            codes(b"\x03\x7f\xc3\xa9"),
            vec![
                (KeyCode::Char('c'), KeyModifiers::CONTROL),
                (KeyCode::Backspace, none),
                (KeyCode::Char('é'), none)
            ]
        );
        // Unknown sequences and broken UTF-8 are dropped, not misread.
        assert_eq!(codes(b"\x1b[99zq\xff"), vec![(KeyCode::Char('q'), none)]);
    }
}
