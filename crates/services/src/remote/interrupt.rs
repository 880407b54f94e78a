//! Ctrl-C, SIGTERM or SIGHUP while hosts are running: each ssh is ended
//! (and with it, through the watch `ssh::WATCH` puts around the remote
//! command, the remote gpureap), each such host is reported as interrupted,
//! and no further phase starts. Outside a fan-out the signal does what it
//! always does: nothing of ours runs on a host then.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

const SIGNALS: [i32; 3] = [
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
];

struct Watch {
    /// Readable once a signal came during a fan-out: never read, so that
    /// every waiting thread sees it.
    readable: UnixStream,
    /// The signal that came, 0 for none.
    signal: Arc<AtomicUsize>,
    /// Outside a fan-out: the signal's default action.
    idle: Arc<AtomicBool>,
}

static WATCH: OnceLock<Option<Watch>> = OnceLock::new();

fn install() -> Option<Watch> {
    let (readable, writable) = UnixStream::pair().ok()?;
    writable.set_nonblocking(true).ok()?;
    let signal = Arc::new(AtomicUsize::new(0));
    let idle = Arc::new(AtomicBool::new(true));
    for number in SIGNALS {
        // In this order: idle, the default action; else recorded, then woken.
        signal_hook::flag::register_conditional_default(number, Arc::clone(&idle)).ok()?;
        signal_hook::flag::register_usize(number, Arc::clone(&signal), number as usize).ok()?;
        signal_hook::low_level::pipe::register(number, writable.try_clone().ok()?).ok()?;
    }
    Some(Watch {
        readable,
        signal,
        idle,
    })
}

/// While this lives, the signals are caught (see the module's note).
pub(crate) struct Catching(());

impl Catching {
    pub fn start() -> Catching {
        if let Some(watch) = WATCH.get_or_init(install) {
            watch.idle.store(false, Ordering::SeqCst);
        }
        Catching(())
    }
}

impl Drop for Catching {
    fn drop(&mut self) {
        if let Some(Some(watch)) = WATCH.get() {
            watch.idle.store(true, Ordering::SeqCst);
        }
    }
}

/// The signal that interrupted a fan-out, if one did.
pub fn signal() -> Option<i32> {
    let watch = WATCH.get()?.as_ref()?;
    match watch.signal.load(Ordering::SeqCst) {
        0 => None,
        number => i32::try_from(number).ok(),
    }
}

/// What a waiting thread polls, beside its child, to see an interruption.
pub fn descriptor() -> Option<BorrowedFd<'static>> {
    Some(WATCH.get()?.as_ref()?.readable.as_fd())
}

/// `SIGINT`, `SIGTERM`, `SIGHUP`.
pub fn name(signal: i32) -> &'static str {
    match signal {
        signal_hook::consts::SIGINT => "SIGINT",
        signal_hook::consts::SIGTERM => "SIGTERM",
        signal_hook::consts::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// A host's error when the run was interrupted before it answered.
pub(crate) fn host_error(signal: i32) -> String {
    format!(
        "interrupted by {} before it answered: its ssh and its gpureap there were ended",
        name(signal)
    )
}
