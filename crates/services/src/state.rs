//! The state directory of `gpureap run`: remembered good starts, diagnostic
//! bundles, and the record of the cgroups each supervisor made.
//!
//! gpureap runs as root, and its state directory may be named by someone
//! else (through `HOME`, `XDG_STATE_HOME`, or a `--state-dir` in another
//! user's directory). So it is opened by the one rule of a path root may
//! trust (`file::trusted_dir`): every directory on the way, and the state
//! directory itself, belongs to the caller or root, and only the state
//! directory may not be a sticky one others may write. Everything
//! inside is then reached through the open directory, never by path again:
//! created exclusively and without following links, private to its owner
//! (bundles hold the server's command line and log, and with them its API
//! keys), replaced atomically, and read with a size limit.

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::file::{self, DirUse, Untrusted};

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

fn private_dir_mode() -> Mode {
    Mode::RWXU
}

fn private_file_mode() -> Mode {
    Mode::RUSR | Mode::WUSR
}

fn io_error(error: Errno) -> io::Error {
    io::Error::from(error)
}

impl StateDir {
    /// Opens the state directory at `path`, creating it and any missing
    /// parent with mode 0700. Refused (`Unsafe`) where the one rule of a
    /// path root may trust refuses it (`file::trusted_dir`, `DirUse::Keep`).
    pub fn open(path: &Path) -> Result<StateDir, StateDirError> {
        let walked = file::trusted_dir(path, true, DirUse::Keep).map_err(|error| match error {
            Untrusted::Unsafe(problem) => StateDirError::Unsafe {
                path: path.to_path_buf(),
                problem,
            },
            Untrusted::Failed(at, error) => StateDirError::Io {
                path: path.to_path_buf(),
                source: io::Error::new(
                    io_error(error).kind(),
                    format!("{}: {}", at.display(), io_error(error)),
                ),
            },
        })?;
        let fd = rustix::fs::openat(
            &walked.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|error| StateDirError::Io {
            path: path.to_path_buf(),
            source: io_error(error),
        })?;
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
    pub(crate) fn new_subdir(&self, name: &str) -> io::Result<StateDir> {
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
        if let Some(problem) = file::distrust(&self.path.join(name), &stat, false) {
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
