//! The simulated nodes' opens and releases, from inotify, so that a wait
//! learns at once that a node was let go, and can tell without a /proc scan
//! that nobody holds it any more.
//!
//! One inotify instance per driver watches each `DIR/nvidiaN` for opens and
//! for the release of an open file description (`IN_CLOSE`: the kernel sends
//! it when the last reference to what one `open` made goes, so a descriptor
//! still shared with a forked child or passed over a socket sends nothing),
//! and `DIR` and `DIR/claims` for files created, changed or removed (a leak,
//! a lost GPU, a new claim). Each fresh scan of the simulated driver starts a
//! *baseline*: the queue is emptied just before it (`rebase`). From then on:
//!
//! - an open of a node (or a queue overflow) spoils the baseline: someone the
//!   scan may have missed can hold the node;
//! - once, the first time a wait watches after the scan, the descriptors each
//!   known holder has on each node are counted (`count`), while every known
//!   holder is still alive and holds; releases are counted from then on.
//!
//! A node is then proved unheld (`unheld`) when no open came since the
//! baseline, every known holder of it has let it go, and at least as many
//! descriptions of it were released as the holders had descriptors: each
//! description open at the scan had at least one of those descriptors, so
//! all were released, whoever else (a child forked since, a socket) shared
//! them. Anything short of that is left to a fresh scan, as before.

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;

/// What the inotify instance watches; what it saw is behind a lock (`lock`).
pub(super) struct Events {
    fd: OwnedFd,
    /// Watch descriptor of each node, and its GPU.
    nodes: BTreeMap<i32, u32>,
    seen: Mutex<Seen>,
}

/// What was seen since the baseline.
struct Seen {
    /// A node was opened since the baseline, or events were lost.
    spoiled: bool,
    /// Descriptors the known holders had on each GPU's node when counting
    /// began; `None` before it (releases are not counted yet).
    counted: Option<BTreeMap<u32, u64>>,
    /// Descriptions of each GPU's node released since counting began.
    released: BTreeMap<u32, u64>,
}

/// The events, locked: reading the queue and the baseline's accounts.
pub(super) struct Held<'a> {
    events: &'a Events,
    seen: MutexGuard<'a, Seen>,
}

impl Events {
    /// Watches `DIR/nvidia0..count`, `DIR` and `DIR/claims`; `None` where
    /// inotify is not to be had (then waiting polls, as it did before).
    pub fn open(directory: &std::path::Path, count: u32) -> Option<Events> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).ok()?;
        let mut nodes = BTreeMap::new();
        for index in 0..count {
            let node = directory.join(format!("nvidia{index}"));
            let watch = WatchFlags::OPEN | WatchFlags::CLOSE | WatchFlags::DONT_FOLLOW;
            nodes.insert(inotify::add_watch(&fd, &node, watch).ok()?, index);
        }
        let files = WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::MODIFY
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | WatchFlags::CLOSE_WRITE
            | WatchFlags::DONT_FOLLOW;
        inotify::add_watch(&fd, directory, files).ok()?;
        // Without a claims directory its files are not watched: the stat
        // poll still sees the directory appear.
        let _ = inotify::add_watch(&fd, directory.join("claims"), files);
        Some(Events {
            fd,
            nodes,
            seen: Mutex::new(Seen {
                spoiled: true,
                counted: None,
                released: BTreeMap::new(),
            }),
        })
    }

    /// The descriptor to poll (no lock needed): readable when something happened.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn lock(&self) -> Option<Held<'_>> {
        Some(Held {
            events: self,
            seen: self.seen.lock().ok()?,
        })
    }
}

impl Held<'_> {
    /// Starts a baseline: called just before a fresh scan of every process.
    pub(crate) fn rebase(&mut self) {
        self.seen.spoiled = false;
        self.seen.counted = None;
        self.seen.released.clear();
        self.drain();
    }

    /// Marks the baseline unusable (a scan that was not this driver's own).
    pub(crate) fn spoil(&mut self) {
        self.seen.spoiled = true;
    }

    /// Whether descriptors are being counted for this baseline (or it is spoiled).
    pub fn counting(&self) -> bool {
        self.seen.spoiled || self.seen.counted.is_some()
    }

    /// Begins counting releases, from the known holders' descriptors on
    /// each GPU's node (`None`: some holder had already let go, so the
    /// count would be short: the baseline is spoiled). Releases already
    /// queued are dropped, opens kept: a count too low is safe, one too high
    /// is not.
    pub fn count(&mut self, descriptors: Option<BTreeMap<u32, u64>>) {
        self.drain();
        match descriptors {
            Some(descriptors) if !self.seen.spoiled => self.seen.counted = Some(descriptors),
            _ => self.seen.spoiled = true,
        }
    }

    /// Reads what is queued; returns whether anything was.
    pub fn drain(&mut self) -> bool {
        let mut buffer = [MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = inotify::Reader::new(&self.events.fd, &mut buffer);
        let mut any = false;
        loop {
            let event = match reader.next() {
                Ok(event) => event,
                Err(Errno::INTR) => continue,
                // WOULDBLOCK: nothing more; any other error: nothing to read.
                Err(_) => return any,
            };
            any = true;
            let flags = event.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                self.seen.spoiled = true;
                continue;
            }
            let Some(&index) = self.events.nodes.get(&event.wd()) else {
                continue;
            };
            if flags.contains(ReadFlags::OPEN) {
                self.seen.spoiled = true;
            }
            let releases = flags.intersects(ReadFlags::CLOSE_WRITE | ReadFlags::CLOSE_NOWRITE);
            if releases && self.seen.counted.is_some() {
                *self.seen.released.entry(index).or_default() += 1;
            }
        }
    }

    /// What was seen, for the debug log: spoiled, counted, released.
    pub fn state(&self) -> (bool, Option<BTreeMap<u32, u64>>, BTreeMap<u32, u64>) {
        (
            self.seen.spoiled,
            self.seen.counted.clone(),
            self.seen.released.clone(),
        )
    }

    /// Whether GPU `index`'s node is proved unheld, given that every known
    /// holder of it has let it go (the caller's check): see the module's notes.
    /// A GPU not counted (watched first in another wait) is not.
    pub(crate) fn unheld(&mut self, index: u32) -> bool {
        self.drain();
        let Some(counted) = self
            .seen
            .counted
            .as_ref()
            .and_then(|counted| counted.get(&index))
        else {
            return false;
        };
        !self.seen.spoiled && self.seen.released.get(&index).copied().unwrap_or(0) >= *counted
    }
}
