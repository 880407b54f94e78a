//! Containment: everything a supervised server starts stays findable.
//!
//! Preferred: a cgroup v2 of its own (root, or a delegated subtree; hybrid
//! hosts mount cgroup2 at /sys/fs/cgroup/unified). A grandchild that
//! double-forks and calls setsid is still in it, `cgroup.kill` ends all of it
//! at once, and an empty `cgroup.procs` proves nothing is left. Fallback: the
//! server gets its own session and process group, and gpureap becomes a child
//! subreaper, so orphans are re-parented to gpureap and stay its descendants.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::proc;
use crate::supervised::CGROUP_PREFIX;
use crate::supervision::cgroup2_mount;
use crate::tree::ProcessTree;

/// How the server is contained, for the events and `status`.
#[derive(Debug)]
pub enum Containment {
    Cgroup {
        path: PathBuf,
    },
    /// Session + process group + child subreaper; `why` says why no cgroup.
    Fallback {
        why: String,
    },
}

impl std::fmt::Display for Containment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Containment::Cgroup { path } => write!(f, "cgroup v2 ({})", path.display()),
            Containment::Fallback { why } => {
                write!(
                    f,
                    "own session and process group, gpureap as child subreaper ({why})"
                )
            }
        }
    }
}

/// This process's own cgroup v2 path (the `0::` line).
fn own_cgroup() -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::to_string)
}

impl Containment {
    /// Makes a fresh cgroup for one start of the server, or says why not.
    pub fn prepare(allow_cgroup: bool, start: u32) -> Containment {
        if !allow_cgroup {
            return Containment::Fallback {
                why: "--no-cgroup".to_string(),
            };
        }
        let Some(mount) = cgroup2_mount() else {
            return Containment::Fallback {
                why: "no cgroup2 mount".to_string(),
            };
        };
        let own = own_cgroup().unwrap_or_else(|| "/".to_string());
        let parent = mount.join(own.trim_start_matches('/'));
        let path = parent.join(format!("{CGROUP_PREFIX}{}-{start}", std::process::id()));
        match fs::create_dir(&path) {
            Ok(()) if path.join("cgroup.kill").exists() => Containment::Cgroup { path },
            Ok(()) => {
                let _ = fs::remove_dir(&path);
                Containment::Fallback {
                    why: "this kernel has no cgroup.kill (Linux < 5.14)".to_string(),
                }
            }
            Err(error) => Containment::Fallback {
                why: format!("cannot create a cgroup under {}: {error}", parent.display()),
            },
        }
    }

    /// Arranges for `command`'s process to start contained: its own session,
    /// and (with a cgroup) moved into it before exec, so nothing it starts
    /// can escape. Returns the file that must stay open until the spawn.
    pub fn apply(&self, command: &mut Command) -> io::Result<Option<File>> {
        let procs = match self {
            Containment::Cgroup { path } => Some(
                OpenOptions::new()
                    .write(true)
                    .open(path.join("cgroup.procs"))?,
            ),
            Containment::Fallback { .. } => None,
        };
        let procs_fd = procs.as_ref().map(|file| file.as_raw_fd());
        // Safety: only async-signal-safe system calls run between fork and exec.
        unsafe {
            command.pre_exec(move || {
                rustix::process::setsid()?;
                if let Some(fd) = procs_fd {
                    rustix::io::write(BorrowedFd::borrow_raw(fd), b"0")?;
                }
                Ok(())
            });
        }
        Ok(procs)
    }

    /// Every live process of the server: the cgroup's members, or every
    /// descendant of gpureap (orphans come back to it as subreaper).
    pub fn members(&self) -> BTreeSet<u32> {
        match self {
            Containment::Cgroup { path } => read_procs(path),
            Containment::Fallback { .. } => {
                descendants_of_self().into_iter().map(|id| id.pid).collect()
            }
        }
    }

    /// Whether `pid`, as `snapshot` shows it, is still the server's: in this
    /// cgroup, or a descendant of gpureap. A member that exited after the
    /// member list was read may have left its PID to a stranger.
    pub fn owns(&self, pid: u32, snapshot: &crate::snapshot::Snapshot) -> bool {
        match self {
            Containment::Cgroup { path } => {
                let name = path
                    .file_name()
                    .and_then(|name| name.to_str())
                    .unwrap_or("");
                proc::cgroup(pid)
                    .is_some_and(|cgroup| !name.is_empty() && cgroup.ends_with(&format!("/{name}")))
            }
            Containment::Fallback { .. } => snapshot
                .tree()
                .descendants(std::process::id())
                .contains(&pid),
        }
    }

    /// Ends whatever is left, all at once, and proves the server is empty.
    /// Returns the PIDs still there at the deadline (empty on success).
    /// Zombies do not count: a cgroup drops a task when it exits, and the
    /// supervisor reaps its own children.
    pub fn sweep(&self, timeout: Duration) -> BTreeSet<u32> {
        let deadline = Instant::now() + timeout;
        match self {
            Containment::Cgroup { path } => {
                let _ = fs::write(path.join("cgroup.kill"), "1");
                loop {
                    let left = read_procs(path);
                    if left.is_empty() || Instant::now() >= deadline {
                        return left;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            Containment::Fallback { .. } => loop {
                let left = descendants_of_self();
                // Each identity comes from the same scan that found it under gpureap.
                for &id in &left {
                    crate::signal::send(id, crate::signal::Sig::Kill);
                }
                if left.is_empty() || Instant::now() >= deadline {
                    return left.into_iter().map(|id| id.pid).collect();
                }
                std::thread::sleep(Duration::from_millis(5));
            },
        }
    }

    /// Removes the cgroup once it is empty.
    pub fn release(&self) {
        if let Containment::Cgroup { path } = self {
            let _ = fs::remove_dir(path);
        }
    }
}

fn read_procs(path: &Path) -> BTreeSet<u32> {
    fs::read_to_string(path.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

/// Live (non-zombie) descendants of gpureap, by a fresh walk of the tree.
fn descendants_of_self() -> Vec<proc::ProcessId> {
    let Ok(scan) = proc::scan_tree() else {
        return Vec::new();
    };
    let mine: BTreeSet<u32> = ProcessTree::new(&scan.processes)
        .descendants(std::process::id())
        .into_iter()
        .collect();
    scan.processes
        .iter()
        .filter(|record| !record.state.has_exited() && mine.contains(&record.id.pid))
        .map(|record| record.id)
        .collect()
}

/// Collects every exited child (the server, and orphans re-parented to us).
/// Returns the exit statuses by PID.
pub fn reap_children() -> Vec<(u32, rustix::process::WaitStatus)> {
    let mut reaped = Vec::new();
    // `wait`, not `waitpid(None)`: the server runs in a process group of its own.
    while let Ok(Some((pid, status))) = rustix::process::wait(rustix::process::WaitOptions::NOHANG)
    {
        reaped.push((pid.as_raw_nonzero().get() as u32, status));
    }
    reaped
}
