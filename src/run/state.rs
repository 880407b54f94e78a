//! The state directory of `gpureap run`: remembered good starts, diagnostic
//! bundles, and the record of the cgroups each supervisor made.
//!
//! gpureap runs as root, and its state directory may be named by someone
//! else (through `HOME`, `XDG_STATE_HOME`, or a `--state-dir` in another
//! user's directory). So the path is walked one component at a time without
//! following a symbolic link that anyone but the caller or root could have
//! planted; the directory must belong to the caller or root and be writable
//! by nobody else, and so must any directory gpureap creates in. Everything
//! inside is then reached through the open directory, never by path again:
//! created exclusively and without following links, private to its owner
//! (bundles hold the server's command line and log, and with them its API
//! keys), replaced atomically, and read with a size limit.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

/// Why a state directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    /// Someone other than the caller or root could change what gpureap
    /// would read or write: refused before anything starts.
    #[error(
        "refusing the state directory {path}: {problem}; give --state-dir a directory of your own that only you can write"
    )]
    Unsafe { path: PathBuf, problem: String },
    #[error("cannot use the state directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A directory of gpureap's own, opened safely (`StateDir::open`), and the
/// private subdirectories made in it.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    fd: OwnedFd,
}

/// How many symbolic links a state directory's path may pass through.
const MAX_LINKS: u32 = 40;
/// A bound on the walk, against a directory that keeps being removed
/// between gpureap's mkdir and its open.
const MAX_STEPS: u32 = 4096;

fn private_dir_mode() -> Mode {
    Mode::RWXU
}

fn private_file_mode() -> Mode {
    Mode::RUSR | Mode::WUSR
}

/// What is wrong with trusting `what`, a directory or symbolic link that
/// `stat` describes, if anything: it must belong to `uid` or root, and nobody
/// else may write to it, except in a sticky directory (like /tmp), where
/// nobody can remove or rename what another user made.
fn distrust(what: &Path, stat: &Stat, uid: u32, sticky_allowed: bool) -> Option<String> {
    let owner = stat.st_uid;
    if owner != uid && owner != 0 {
        let name = uzers::get_user_by_uid(owner)
            .map(|user| format!(" ({})", user.name().to_string_lossy()))
            .unwrap_or_default();
        return Some(format!(
            "{} belongs to uid {owner}{name}, not to you or root",
            what.display()
        ));
    }
    let mode = stat.st_mode & 0o7777;
    let sticky = mode & 0o1000 != 0;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Symlink
        && mode & 0o022 != 0
        && !(sticky_allowed && sticky)
    {
        return Some(format!(
            "others than its owner may write to {} (mode {mode:04o})",
            what.display()
        ));
    }
    None
}

fn io_error(error: Errno) -> io::Error {
    io::Error::from(error)
}

/// The components of `path` as names to open one by one ("." skipped).
fn names(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|component| match component {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

fn open_path(dir: &OwnedFd, name: &OsStr) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn open_start(absolute: bool) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        rustix::fs::CWD,
        if absolute { "/" } else { "." },
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Where a walk of a directory's path ended: the directory (an `O_PATH`
/// handle), what `fstat` says of it, and its path as walked.
struct Walked {
    dir: OwnedFd,
    stat: Stat,
    at: PathBuf,
}

enum WalkError {
    /// Someone other than the caller or root could have changed the way.
    Unsafe(String),
    /// A component could not be opened (or made).
    Failed(PathBuf, Errno),
}

/// Walks to the directory `path` one component at a time, following a
/// symbolic link only where nobody but `uid` or root could have made it, and
/// as the last component only with `follow_last` (a log's directory, not a
/// state directory). With `create`, a missing directory is made
/// (mode 0700), only in a directory nobody else may write to (or a sticky
/// one). The directory reached is not judged: the caller does.
fn walk(path: &Path, uid: u32, create: bool, follow_last: bool) -> Result<Walked, WalkError> {
    let failed = |at: &Path, error: Errno| WalkError::Failed(at.to_path_buf(), error);
    let refuse = WalkError::Unsafe;
    let absolute = path.is_absolute();
    let mut dir = open_start(absolute).map_err(|error| failed(path, error))?;
    let mut dir_stat = rustix::fs::fstat(&dir).map_err(|error| failed(path, error))?;
    let mut at = if absolute {
        PathBuf::from("/")
    } else {
        PathBuf::from(".")
    };
    let mut pending = names(path);
    let mut links = 0;
    let mut steps = 0;
    while let Some(name) = pending.pop_front() {
        steps += 1;
        if steps > MAX_STEPS {
            return Err(failed(&at, Errno::LOOP));
        }
        let here = at.join(&name);
        let last = pending.is_empty();
        match open_path(&dir, &name) {
            Ok(fd) => {
                let stat = rustix::fs::fstat(&fd).map_err(|error| failed(&here, error))?;
                match FileType::from_raw_mode(stat.st_mode) {
                    FileType::Directory => {
                        dir = fd;
                        dir_stat = stat;
                        at = here;
                    }
                    FileType::Symlink if last && !follow_last => {
                        return Err(refuse(format!("{} is a symbolic link", here.display())));
                    }
                    FileType::Symlink => {
                        // A link is followed only where nobody else could have made it.
                        if let Some(problem) = distrust(&here, &stat, uid, false)
                            .or_else(|| distrust(&at, &dir_stat, uid, true))
                        {
                            return Err(refuse(format!(
                                "{} is a symbolic link others could have made: {problem}",
                                here.display()
                            )));
                        }
                        links += 1;
                        if links > MAX_LINKS {
                            return Err(failed(&here, Errno::LOOP));
                        }
                        let target = rustix::fs::readlinkat(&dir, &name, Vec::new())
                            .map_err(|error| failed(&here, error))?;
                        let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
                        if target.is_absolute() {
                            dir = open_start(true).map_err(|error| failed(&target, error))?;
                            dir_stat =
                                rustix::fs::fstat(&dir).map_err(|error| failed(&target, error))?;
                            at = PathBuf::from("/");
                        }
                        for name in names(&target).into_iter().rev() {
                            pending.push_front(name);
                        }
                    }
                    _ => {
                        return Err(refuse(format!("{} is not a directory", here.display())));
                    }
                }
            }
            Err(Errno::NOENT) if create => {
                if let Some(problem) = distrust(&at, &dir_stat, uid, true) {
                    return Err(refuse(format!(
                        "{} would be created where others could tamper with it: {problem}",
                        here.display()
                    )));
                }
                match rustix::fs::mkdirat(&dir, &name, private_dir_mode()) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(error) => return Err(failed(&here, error)),
                }
                // Opened and checked like any other on the next turn.
                pending.push_front(name);
            }
            Err(error) => return Err(failed(&here, error)),
        }
    }
    Ok(Walked {
        dir,
        stat: dir_stat,
        at,
    })
}

/// Why `--log` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Someone else could choose or read what it is appended to: bad input.
    #[error("{0}")]
    Refused(String),
    /// It could not be opened (no such directory, no space, ...).
    #[error("{0}")]
    Failed(String),
}

/// Opens `--log FILE` for appending, as root may safely: `LogFile::check`,
/// then `LogFile::open`.
pub fn open_log(path: &Path) -> Result<std::fs::File, LogError> {
    LogFile::check(path)?.open()
}

/// A `--log FILE` that passed its checks, not yet opened for writing.
///
/// Its directory is reached as a state directory's path is (`walk`, nothing
/// created, no link followed that others could have made); the file itself
/// is never a symbolic link, is created private (0600) when missing, and
/// when it exists must be a regular file of the caller's own with no other
/// name (a hard link). Otherwise someone who can write where the log goes
/// could have the server's output, and its secrets, appended to a file of
/// their choice (`/etc/shadow` through a planted link) or to one they can
/// read. The directory itself may be anyone's (root writing into a user's
/// directory, a group-writable /var/log): what is there is what is checked.
pub struct LogFile {
    path: PathBuf,
    dir: OwnedFd,
    name: OsString,
    /// The existing file, looked at through an `O_PATH` handle (never opened
    /// for writing, so a FIFO or a device is never opened); `None` when
    /// there is none yet.
    existing: Option<OwnedFd>,
}

impl LogFile {
    /// Checks `path`, creating nothing and opening nothing for writing, so
    /// that a log that would be refused is refused before anything is made.
    pub fn check(path: &Path) -> Result<LogFile, LogError> {
        let uid = rustix::process::geteuid().as_raw();
        let refuse = |problem: String| log_refused(path, problem);
        // The last name as given: `Path` would drop a trailing `/` or `/.`,
        // which name a directory.
        let given = path.as_os_str().as_bytes();
        let last = given
            .rsplit(|&byte| byte == b'/')
            .next()
            .unwrap_or_default();
        if matches!(last, b"" | b"." | b"..") {
            return Err(refuse("it names a directory; give a file".to_string()));
        }
        let name = OsStr::from_bytes(last);
        let parent = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        let walked = walk(parent, uid, false, true).map_err(|error| match error {
            WalkError::Unsafe(problem) => refuse(problem),
            // A path that cannot name a file is bad input, not a failure.
            WalkError::Failed(at, error @ (Errno::LOOP | Errno::NAMETOOLONG | Errno::NOTDIR)) => {
                refuse(format!("{}: {}", at.display(), io_error(error)))
            }
            WalkError::Failed(at, error) => LogError::Failed(format!(
                "cannot open --log {}: {}: {}",
                path.display(),
                at.display(),
                io_error(error)
            )),
        })?;
        let existing = match rustix::fs::openat(
            &walked.dir,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(handle) => handle,
            Err(Errno::NOENT) => {
                return Ok(LogFile {
                    path: path.to_path_buf(),
                    dir: walked.dir,
                    name: name.to_os_string(),
                    existing: None,
                });
            }
            Err(error @ Errno::NAMETOOLONG) => return Err(refuse(io_error(error).to_string())),
            Err(error) => return Err(log_failed(path, error)),
        };
        let stat = rustix::fs::fstat(&existing).map_err(|error| log_failed(path, error))?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => {}
            FileType::Symlink => {
                return Err(refuse(
                    "it is a symbolic link; give the file itself".to_string(),
                ));
            }
            FileType::Directory => {
                return Err(refuse("it names a directory; give a file".to_string()));
            }
            _ => return Err(refuse("it is not a regular file".to_string())),
        }
        if stat.st_uid != uid {
            let name = uzers::get_user_by_uid(stat.st_uid)
                .map(|user| format!(" ({})", user.name().to_string_lossy()))
                .unwrap_or_default();
            return Err(refuse(format!(
                "it belongs to uid {}{name}, not to you; the server's output is appended only to a file of your own",
                stat.st_uid
            )));
        }
        if stat.st_nlink > 1 {
            return Err(refuse(format!(
                "it has {} names (hard links); the server's output is appended only to a file with one",
                stat.st_nlink
            )));
        }
        Ok(LogFile {
            path: path.to_path_buf(),
            dir: walked.dir,
            name: name.to_os_string(),
            existing: Some(existing),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the checked file for appending: the existing one through the
    /// very handle it was checked by, so it cannot have been swapped since;
    /// a missing one is created exclusively.
    pub fn open(self) -> Result<std::fs::File, LogError> {
        let path = &self.path;
        let fd = match &self.existing {
            Some(handle) => {
                let raw = std::os::fd::AsRawFd::as_raw_fd(handle);
                rustix::fs::open(
                    format!("/proc/self/fd/{raw}"),
                    OFlags::WRONLY | OFlags::APPEND | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|error| log_failed(path, error))?
            }
            None => rustix::fs::openat(
                &self.dir,
                &self.name,
                OFlags::WRONLY
                    | OFlags::APPEND
                    | OFlags::CREATE
                    | OFlags::EXCL
                    | OFlags::NOFOLLOW
                    | OFlags::CLOEXEC,
                private_file_mode(),
            )
            .map_err(|error| match error {
                // Made by someone else since it was checked.
                Errno::EXIST => log_refused(
                    path,
                    "it appeared while it was being created; try again".to_string(),
                ),
                error => log_failed(path, error),
            })?,
        };
        Ok(std::fs::File::from(fd))
    }
}

fn log_refused(path: &Path, problem: String) -> LogError {
    LogError::Refused(format!("refusing --log {}: {problem}", path.display()))
}

fn log_failed(path: &Path, error: Errno) -> LogError {
    LogError::Failed(format!(
        "cannot open --log {}: {}",
        path.display(),
        io_error(error)
    ))
}

impl StateDir {
    /// Opens the state directory at `path`, creating it and any missing
    /// parent with mode 0700. Refused (`Unsafe`) when it, a parent it is
    /// created in, or a symbolic link on the way could be changed by someone
    /// other than the caller or root, or when it is itself a symbolic link.
    pub fn open(path: &Path) -> Result<StateDir, StateDirError> {
        let uid = rustix::process::geteuid().as_raw();
        let refuse = |problem: String| StateDirError::Unsafe {
            path: path.to_path_buf(),
            problem,
        };
        let failed = |at: &Path, error: Errno| StateDirError::Io {
            path: path.to_path_buf(),
            source: io::Error::new(
                io_error(error).kind(),
                format!("{}: {}", at.display(), io_error(error)),
            ),
        };
        let walked = walk(path, uid, true, false).map_err(|error| match error {
            WalkError::Unsafe(problem) => refuse(problem),
            WalkError::Failed(at, error) => failed(&at, error),
        })?;
        if let Some(problem) = distrust(&walked.at, &walked.stat, uid, false) {
            return Err(refuse(problem));
        }
        let fd = rustix::fs::openat(
            &walked.dir,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|error| failed(path, error))?;
        Ok(StateDir {
            path: path.to_path_buf(),
            fd,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The private subdirectory `name`, made (0700) if missing. It must be a
    /// directory, not a link, and belong to the caller or root with nobody
    /// else allowed to write to it.
    pub fn subdir(&self, name: &str) -> io::Result<StateDir> {
        match rustix::fs::mkdirat(&self.fd, name, private_dir_mode()) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(error) => return Err(self.error(name, error)),
        }
        self.open_subdir(name)
    }

    /// A new private subdirectory `name` (0700); an existing one is an error.
    pub fn new_subdir(&self, name: &str) -> io::Result<StateDir> {
        rustix::fs::mkdirat(&self.fd, name, private_dir_mode())
            .map_err(|error| self.error(name, error))?;
        self.open_subdir(name)
    }

    fn open_subdir(&self, name: &str) -> io::Result<StateDir> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|error| self.error(name, error))?;
        let stat = rustix::fs::fstat(&fd).map_err(|error| self.error(name, error))?;
        let uid = rustix::process::geteuid().as_raw();
        if let Some(problem) = distrust(&self.path.join(name), &stat, uid, false) {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, problem));
        }
        Ok(StateDir {
            path: self.path.join(name),
            fd,
        })
    }

    /// Writes a new private file (0600); an existing file or link named
    /// `name` is an error, never followed or overwritten.
    pub fn create(&self, name: &str, contents: &[u8]) -> io::Result<()> {
        let mut file = self.create_exclusive(name)?;
        file.write_all(contents)
            .map_err(|error| io::Error::new(error.kind(), self.describe(name, &error)))
    }

    fn create_exclusive(&self, name: &str) -> io::Result<std::fs::File> {
        rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            private_file_mode(),
        )
        .map(std::fs::File::from)
        .map_err(|error| self.error(name, error))
    }

    /// Replaces the file `name` atomically: the contents go to a new private
    /// file in the same directory, which is then renamed over `name` (a link
    /// named `name` is replaced, not followed).
    pub fn replace(&self, name: &str, contents: &[u8]) -> io::Result<()> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut attempt = 0;
        let (temporary, mut file) = loop {
            let temporary = format!(
                ".{name}.{}.{}.tmp",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            match self.create_exclusive(&temporary) {
                Ok(file) => break (temporary, file),
                // A leftover of a gpureap that died mid-write: take another name.
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => {
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        };
        let written = file
            .write_all(contents)
            .and_then(|()| file.sync_all())
            .map_err(|error| io::Error::new(error.kind(), self.describe(name, &error)))
            .and_then(|()| {
                rustix::fs::renameat(&self.fd, &temporary, &self.fd, name)
                    .map_err(|error| self.error(name, error))
            });
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, &temporary, AtFlags::empty());
        }
        written
    }

    /// Reads the regular file `name`, not through a link, and at most
    /// `limit` bytes of it: `Ok(None)` when there is none, an error when it
    /// is larger (it is not read).
    pub fn read(&self, name: &str, limit: u64) -> io::Result<Option<Vec<u8>>> {
        // Non-blocking: a FIFO in its place must not hang the open.
        let fd = match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is a symbolic link", self.path.join(name).display()),
                ));
            }
            Err(error) => return Err(self.error(name, error)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(|error| self.error(name, error))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a regular file", self.path.join(name).display()),
            ));
        }
        let too_large = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is larger than the {limit} bytes expected",
                    self.path.join(name).display()
                ),
            )
        };
        if u64::try_from(stat.st_size).unwrap_or(u64::MAX) > limit {
            return Err(too_large());
        }
        let mut contents = Vec::new();
        std::fs::File::from(fd)
            .take(limit + 1)
            .read_to_end(&mut contents)
            .map_err(|error| io::Error::new(error.kind(), self.describe(name, &error)))?;
        if contents.len() as u64 > limit {
            return Err(too_large());
        }
        Ok(Some(contents))
    }

    /// Removes the file `name`; a missing one is not an error.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(error) => Err(self.error(name, error)),
        }
    }

    /// The names in this directory ("." and ".." left out).
    pub fn list(&self) -> io::Result<Vec<String>> {
        let fd = rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|error| self.error(".", error))?;
        let mut names = Vec::new();
        let mut entries = rustix::fs::Dir::new(fd).map_err(|error| self.error(".", error))?;
        while let Some(entry) = entries.read() {
            let entry = entry.map_err(|error| self.error(".", error))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != "." && name != ".." {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn describe(&self, name: &str, error: &dyn std::fmt::Display) -> String {
        format!("{}: {error}", self.path.join(name).display())
    }

    fn error(&self, name: &str, error: Errno) -> io::Error {
        let error = io_error(error);
        io::Error::new(error.kind(), self.describe(name, &error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_private_exclusive_and_never_followed() {
        let base = tempfile::tempdir().expect("tempdir");
        let state = StateDir::open(&base.path().join("a/b")).expect("open");
        state.replace("starts.json", b"{}").expect("replace");
        state.replace("starts.json", b"[]").expect("replace again");
        assert_eq!(
            state.read("starts.json", 10).expect("read"),
            Some(b"[]".to_vec())
        );
        assert!(state.read("starts.json", 1).is_err(), "over the limit");
        assert_eq!(state.read("missing", 10).expect("read"), None);
        std::os::unix::fs::symlink("/etc/hostname", base.path().join("a/b/link")).expect("symlink");
        assert!(state.read("link", 1 << 20).is_err(), "not followed");
        assert!(state.create("link", b"x").is_err(), "not overwritten");
        assert!(state.subdir("link").is_err(), "not entered");
        let bundles = state.subdir("bundles").expect("bundles");
        bundles.create("one", b"1").expect("create");
        assert!(bundles.create("one", b"2").is_err(), "exclusive");
        assert!(state.new_subdir("bundles").is_err(), "exclusive");
        let mut listed = state.list().expect("list");
        listed.sort();
        assert_eq!(listed, ["bundles", "link", "starts.json"]);
    }

    #[test]
    fn a_path_through_a_trusted_link_is_followed_and_a_final_link_refused() {
        let base = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(base.path().join("real")).expect("mkdir");
        std::os::unix::fs::symlink("real", base.path().join("alias")).expect("symlink");
        let state = StateDir::open(&base.path().join("alias/state")).expect("open");
        state.create("x", b"x").expect("create");
        assert!(base.path().join("real/state/x").exists());
        assert!(matches!(
            StateDir::open(&base.path().join("alias")),
            Err(StateDirError::Unsafe { .. })
        ));
    }
}
