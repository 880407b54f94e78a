//! `gpureap top --json`: the view's data without the view. Every interval,
//! one `status` document (docs/json.md, the same `report::status_json`),
//! on one line of stdout, until stdout or stdin closes or a signal comes.
//! It is what `top -H HOST` reads from the host over its one ssh: when the
//! ssh goes, so does this (a write fails with EPIPE, its stdin ends, or the
//! fleet's watch (`remote::ssh::WATCH`) sends SIGTERM), so a dropped
//! connection never leaves it running there.

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::driver::Driver;
use crate::exit::Exit;
use crate::report;
use crate::snapshot::Snapshot;

/// The signals that end the stream (128 + N, as the view's).
const SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGHUP, libc::SIGINT];

/// A pretty-printed document on one line. JSON strings hold no raw newline
/// (`report::to_json` escapes every control character), so each newline
/// and the indentation after it is layout, and goes.
pub fn one_line(document: &str) -> String {
    let mut line = String::with_capacity(document.len());
    let mut indent = false;
    for c in document.chars() {
        match c {
            '\n' => indent = true,
            ' ' if indent => {}
            _ => {
                indent = false;
                line.push(c);
            }
        }
    }
    line
}

/// Whether stdin is a pipe or a socket, whose end means the reader is
/// gone (ssh's channel, a shell pipeline); a terminal or /dev/null is not
/// watched.
fn stdin_watchable() -> bool {
    rustix::fs::fstat(io::stdin().as_fd())
        .map(|stat| {
            let kind = rustix::fs::FileType::from_raw_mode(stat.st_mode);
            matches!(
                kind,
                rustix::fs::FileType::Fifo | rustix::fs::FileType::Socket
            )
        })
        .unwrap_or(false)
}

/// Writes a document every `interval` until stdout or stdin closes (exit
/// 0) or SIGTERM, SIGHUP or SIGINT comes (128 + N). Snapshots are taken on
/// a thread of their own, so that a slow driver or /proc never delays the
/// end: the signal or stdin's end is answered at once.
pub fn emit(driver: Arc<dyn Driver>, interval: Duration) -> io::Result<Exit> {
    let (woken, waker) = UnixStream::pair()?;
    waker.set_nonblocking(true)?;
    woken.set_nonblocking(true)?;
    let caught = Arc::new(AtomicUsize::new(0));
    for signal in SIGNALS {
        signal_hook::flag::register_usize(signal, Arc::clone(&caught), signal as usize)?;
        signal_hook::low_level::pipe::register(signal, waker.try_clone()?)?;
    }
    let (lines_to, lines) = mpsc::sync_channel::<String>(1);
    let wake = waker.try_clone()?;
    thread::Builder::new()
        .name("top-json".to_string())
        .spawn(move || {
            loop {
                let started = Instant::now();
                let mut snapshot = Snapshot::take(driver.as_ref());
                snapshot.read_activity(driver.as_ref());
                let line = one_line(&report::status_json(&snapshot, &None));
                drop(snapshot);
                if lines_to.send(line).is_err() {
                    return;
                }
                let _ = (&wake).write(&[1]);
                thread::sleep(interval.saturating_sub(started.elapsed()));
            }
        })?;
    let watch_stdin = stdin_watchable();
    let mut out = io::stdout().lock();
    loop {
        if let Some(signal) = caught_signal(&caught) {
            return Ok(Exit::Signalled(signal));
        }
        while let Ok(line) = lines.try_recv() {
            out.write_all(line.as_bytes())?;
            out.write_all(b"\n")?;
            out.flush()?;
        }
        if wait(&woken, watch_stdin, Duration::from_secs(1))? == Woken::StdinEnded {
            return Ok(Exit::Success);
        }
    }
}

fn caught_signal(caught: &AtomicUsize) -> Option<i32> {
    match caught.load(Ordering::SeqCst) {
        0 => None,
        number => i32::try_from(number).ok(),
    }
}

#[derive(PartialEq, Eq)]
enum Woken {
    Other,
    StdinEnded,
}

/// Waits up to `left` for a wake-up (a signal, a new line) or stdin's end.
fn wait(woken: &UnixStream, watch_stdin: bool, left: Duration) -> io::Result<Woken> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let stdin = io::stdin();
    let stdin_fd = stdin.as_fd();
    let woken_fd = woken.as_fd();
    let mut fds = vec![PollFd::new(&woken_fd, PollFlags::IN)];
    if watch_stdin {
        fds.push(PollFd::new(&stdin_fd, PollFlags::IN));
    }
    let timeout = Timespec::try_from(left).ok();
    match poll(&mut fds, timeout.as_ref()) {
        Ok(_) | Err(rustix::io::Errno::INTR) => {}
        Err(error) => return Err(error.into()),
    }
    let stdin_ready = watch_stdin && !fds[1].revents().is_empty();
    drop(fds);
    let mut buffer = [0u8; 512];
    while matches!((&*woken).read(&mut buffer), Ok(n) if n > 0) {}
    if stdin_ready {
        // Nothing is read from it but its end: whatever comes is dropped.
        match stdin.lock().read(&mut buffer) {
            Ok(0) => return Ok(Woken::StdinEnded),
            Err(error) if error.kind() != io::ErrorKind::Interrupted => {
                return Ok(Woken::StdinEnded);
            }
            _ => {}
        }
    }
    Ok(Woken::Other)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_pretty_document_becomes_one_line_and_reads_the_same() {
        let pretty = "{\n  \"a\": \"x  y\",\n  \"b\": [\n    1,\n    2\n  ]\n}";
        let line = one_line(pretty);
        assert!(!line.contains('\n'));
        let (a, b): (serde_json::Value, serde_json::Value) = (
            serde_json::from_str(pretty).unwrap(),
            serde_json::from_str(&line).unwrap(),
        );
        assert_eq!(a, b);
        assert!(line.contains("\"x  y\""));
    }
}
