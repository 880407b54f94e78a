//! Files named on the command line, read and written as root may. A leaf:
//! it imports nothing of the crate.
//!
//! Two facts live here. `read_regular` reads a file a user named (`-H
//! @FILE`, a model's files): bounded, and never waiting on something that
//! only looks like a file.
//!
//! And the one rule of a path root may trust, for every file gpureap reads
//! as policy or writes as root (`reap --config`, every `--log`, `run`'s
//! state directories and bundles, `dump --out`, `push --bin`; `push`'s
//! remote side runs its shell form, `TRUSTED_SH`): every directory from `/`
//! down (a relative path from the working directory's own absolute path)
//! belongs to root or the caller and nobody else may write to it, unless it
//! is sticky (like /tmp: there nobody may remove or rename what another
//! made, and what gpureap then opens in it must itself be root's or the
//! caller's); a symbolic link on the way is followed only when it is root's
//! or the caller's; the last name given is never a symbolic link; and the
//! file or directory it names belongs to root or the caller, writable by
//! nobody else. The path is walked one name at a time (`O_PATH`,
//! `O_NOFOLLOW`), each name opened from the directory before it and judged
//! by `fstat` of what was opened, never by its path again: a directory
//! swapped between the look and the use is the one that was judged.
//! Otherwise another user could choose root's policy (`enforce`, a grace
//! of 0 s, the log's place) or have root write where they choose.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read as _};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

/// A file named on the command line (`-H @FILE`, a model's files), read as
/// a regular file of at most `max` bytes, without waiting: a FIFO, a device,
/// or a /proc or /sys file that would block or never end (`/proc/kmsg`,
/// `/proc/kallsyms`, which claim a size of 0) is refused, not read. The
/// file stays open: what was read is what a caller may run
/// (`/proc/self/fd/N`). Who may write it is not asked: `read_trusted` does.
pub fn read_regular(path: &Path, max: u64) -> Result<(std::fs::File, Vec<u8>), String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let metadata = std::fs::metadata(path).map_err(|error| error.to_string())?;
    if !metadata.is_file() {
        return Err("not a regular file".to_string());
    }
    // O_NONBLOCK: what was swapped in since (a FIFO) neither blocks the open nor a read.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|error| error.to_string())?;
    let metadata = file.metadata().map_err(|error| error.to_string())?;
    if !metadata.is_file() {
        return Err("not a regular file".to_string());
    }
    let bytes = read_bounded(&file, max)?;
    Ok((file, bytes))
}

/// At most `max` bytes of an open regular file; more is an error, and what
/// would wait (a kernel interface) too.
fn read_bounded(file: &std::fs::File, max: u64) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| match error.kind() {
            io::ErrorKind::WouldBlock => {
                "reading it would wait (a kernel interface, not a file)".to_string()
            }
            _ => error.to_string(),
        })?;
    if bytes.len() as u64 > max {
        return Err(format!(
            "larger than {} MiB: is it the right file?",
            max >> 20
        ));
    }
    Ok(bytes)
}

/// The user gpureap acts as: besides root, the one owner a trusted path may have.
/// Whether `path` is a file `exec` would run: a regular file (links
/// followed) that the caller may execute. The one test for every program
/// gpureap looks up (a server, py-spy, scontrol, an engine's interpreter).
pub fn executable(path: &Path) -> bool {
    path.is_file() && rustix::fs::access(path, rustix::fs::Access::EXEC_OK).is_ok()
}

fn caller() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The one rule, for one name on the way: what is wrong with trusting
/// `what`, which `stat` describes, if anything. It must belong to the
/// caller or root, and nobody else may write to it; a directory that is
/// sticky may be writable by all when `sticky_allowed` (a directory passed
/// through, or the one a single file is in), never where gpureap keeps
/// files of its own. A symbolic link's mode means nothing: its owner does.
pub fn distrust(what: &Path, stat: &Stat, sticky_allowed: bool) -> Option<String> {
    let owner = stat.st_uid;
    if owner != caller() && owner != 0 {
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
        let without = if sticky_allowed {
            ", without the sticky bit"
        } else {
            ""
        };
        return Some(format!(
            "others than its owner may write to {} (mode {mode:04o}{without})",
            what.display()
        ));
    }
    None
}

/// Why a path is not one root may trust, or could not be walked.
#[derive(Debug)]
pub enum Untrusted {
    /// Someone other than the caller or root could change what gpureap
    /// would read or write there: which name, and why. Bad input.
    Unsafe(String),
    /// A name could not be opened (or made): where, and the error.
    Failed(PathBuf, Errno),
}

/// What the directory a walk ends in is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum DirUse {
    /// gpureap keeps files of its own in it (a state directory, `dump
    /// --out`): nobody else may write to it, sticky or not, and it is never
    /// a symbolic link, as the last name given.
    Keep,
    /// It holds the one file named (a log, a policy): a sticky directory
    /// will do, since that file is judged in its turn, and it may be reached
    /// through a link of root's or the caller's.
    Holds,
}

/// A directory reached by the one rule: an `O_PATH` handle, and its path
/// as walked.
pub struct TrustedDir {
    pub fd: OwnedFd,
    pub at: PathBuf,
}

/// How many symbolic links a path may pass through.
const MAX_LINKS: u32 = 40;
/// A bound on the walk, against a directory that keeps being removed
/// between gpureap's mkdir and its open.
const MAX_STEPS: u32 = 4096;

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

fn open_root() -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        rustix::fs::CWD,
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// `path` from `/`: a relative one joined to the working directory's own path.
fn absolute(path: &Path) -> Result<PathBuf, Untrusted> {
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    let cwd = std::env::current_dir().map_err(|error| {
        let errno = Errno::from_io_error(&error).unwrap_or(Errno::IO);
        Untrusted::Failed(PathBuf::from("."), errno)
    })?;
    Ok(cwd.join(path))
}

/// Walks to the directory `path` by the one rule, from `/` (a relative path
/// from the working directory's absolute path): each directory entered is
/// judged (sticky allowed), a symbolic link is followed only when it is the
/// caller's or root's, and the directory reached is judged as `purpose`
/// says. With `create`, a missing directory is made (mode 0700) in the
/// trusted one before it.
pub fn trusted_dir(path: &Path, create: bool, purpose: DirUse) -> Result<TrustedDir, Untrusted> {
    let failed = |at: &Path, error: Errno| Untrusted::Failed(at.to_path_buf(), error);
    let refuse = Untrusted::Unsafe;
    let absolute = absolute(path)?;
    let mut dir = open_root().map_err(|error| failed(Path::new("/"), error))?;
    let mut dir_stat = rustix::fs::fstat(&dir).map_err(|error| failed(Path::new("/"), error))?;
    let mut at = PathBuf::from("/");
    if let Some(problem) = distrust(&at, &dir_stat, true) {
        return Err(refuse(problem));
    }
    let mut pending = names(&absolute);
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
                        if let Some(problem) = distrust(&here, &stat, true) {
                            return Err(refuse(problem));
                        }
                        dir = fd;
                        dir_stat = stat;
                        at = here;
                    }
                    FileType::Symlink if last && purpose == DirUse::Keep => {
                        return Err(refuse(format!("{} is a symbolic link", here.display())));
                    }
                    FileType::Symlink => {
                        // Its directory was judged when entered; the link is judged by its owner.
                        if let Some(problem) = distrust(&here, &stat, false) {
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
                            dir = open_root().map_err(|error| failed(&target, error))?;
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
                // In a directory judged when entered; made private, opened and judged next turn.
                match rustix::fs::mkdirat(&dir, &name, Mode::RWXU) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(error) => return Err(failed(&here, error)),
                }
                pending.push_front(name);
            }
            Err(error) => return Err(failed(&here, error)),
        }
    }
    if purpose == DirUse::Keep
        && let Some(problem) = distrust(&at, &dir_stat, false)
    {
        return Err(refuse(problem));
    }
    Ok(TrustedDir { fd: dir, at })
}

/// Splits a path naming a file into its directory and its last name as
/// given (`Path` would drop a trailing `/` or `/.`, which name a directory).
fn split_file(path: &Path) -> Result<(&Path, &OsStr), String> {
    let given = path.as_os_str().as_bytes();
    let last = given
        .rsplit(|&byte| byte == b'/')
        .next()
        .unwrap_or_default();
    if matches!(last, b"" | b"." | b"..") {
        return Err("it names a directory; give a file".to_string());
    }
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    Ok((parent, OsStr::from_bytes(last)))
}

/// The words for an error of a walk that cannot be bad input.
fn walk_failed(at: &Path, error: Errno) -> String {
    format!("{}: {}", at.display(), io::Error::from(error))
}

/// Why `read_trusted` read nothing: each the reason alone, naming a path
/// only where it is not the one given, and never quoting the file.
#[derive(Debug)]
pub enum NotRead {
    /// The one rule refuses it: someone else could have chosen what is read.
    Untrusted(String),
    /// It is not there, not a regular file, too large, or would wait.
    Unreadable(String),
}

/// A file gpureap reads as policy (`reap --config`) or runs and installs
/// (`push --bin`), read by the one rule: its directories trusted, itself
/// not a symbolic link, a regular file of the caller's or root's that nobody
/// else may write, opened without following a link or waiting (a FIFO in
/// its place), judged by what was opened, and at most `max` bytes of it
/// read.
pub fn read_trusted(path: &Path, max: u64) -> Result<(std::fs::File, Vec<u8>), NotRead> {
    let (parent, name) = split_file(path).map_err(NotRead::Unreadable)?;
    let walked = trusted_dir(parent, false, DirUse::Holds).map_err(|error| match error {
        Untrusted::Unsafe(problem) => NotRead::Untrusted(problem),
        Untrusted::Failed(at, error) => NotRead::Unreadable(walk_failed(&at, error)),
    })?;
    let unreadable = |error: Errno| NotRead::Unreadable(io::Error::from(error).to_string());
    // Looked at through an `O_PATH` handle: a device or a FIFO is never opened.
    let handle = open_path(&walked.fd, name).map_err(unreadable)?;
    let stat = rustix::fs::fstat(&handle).map_err(unreadable)?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => {}
        FileType::Symlink => {
            return Err(NotRead::Untrusted("it is a symbolic link".to_string()));
        }
        _ => return Err(NotRead::Unreadable("not a regular file".to_string())),
    }
    if let Some(problem) = distrust(&walked.at.join(name), &stat, false) {
        return Err(NotRead::Untrusted(problem));
    }
    // The very file judged, opened through its handle.
    let fd = rustix::fs::open(
        format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&handle)),
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(unreadable)?;
    let file = std::fs::File::from(fd);
    let bytes = read_bounded(&file, max).map_err(NotRead::Unreadable)?;
    Ok((file, bytes))
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

/// A `--log FILE` (`run`'s, `reap`'s, the Slurm hooks') that passed its
/// checks, not yet opened for writing.
///
/// Its directory is reached by the one rule (`trusted_dir`, nothing
/// created); the file itself is never a symbolic link, is created private
/// (0600) when missing, and when it exists must be a regular file of the
/// caller's own that nobody else may write, with no other name (a hard
/// link). Otherwise someone else could have what gpureap logs (a server's
/// output and its secrets, or lines a root shell would read) appended to a
/// file of their choice (`/etc/shadow` through a planted link) or to one
/// they can read.
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
        let refuse = |problem: String| log_refused(path, problem);
        let (parent, name) = split_file(path).map_err(refuse)?;
        let walked = trusted_dir(parent, false, DirUse::Holds).map_err(|error| match error {
            Untrusted::Unsafe(problem) => refuse(format!(
                "{problem}; give --log a file in directories only you or root can write"
            )),
            // A path that cannot name a file is bad input, not a failure.
            Untrusted::Failed(at, error @ (Errno::LOOP | Errno::NAMETOOLONG | Errno::NOTDIR)) => {
                refuse(walk_failed(&at, error))
            }
            Untrusted::Failed(at, error) => LogError::Failed(format!(
                "cannot open --log {}: {}",
                path.display(),
                walk_failed(&at, error)
            )),
        })?;
        let existing = match open_path(&walked.fd, name) {
            Ok(handle) => handle,
            Err(Errno::NOENT) => {
                return Ok(LogFile {
                    path: path.to_path_buf(),
                    dir: walked.fd,
                    name: name.to_os_string(),
                    existing: None,
                });
            }
            Err(error @ Errno::NAMETOOLONG) => {
                return Err(refuse(io::Error::from(error).to_string()));
            }
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
        if let Some(problem) = distrust(&walked.at.join(name), &stat, false) {
            return Err(refuse(format!(
                "{problem}; gpureap appends only to a file of your own that only you can write"
            )));
        }
        if stat.st_nlink > 1 {
            return Err(refuse(format!(
                "it has {} names (hard links); gpureap appends only to a file with one",
                stat.st_nlink
            )));
        }
        Ok(LogFile {
            path: path.to_path_buf(),
            dir: walked.fd,
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
                Mode::RUSR | Mode::WUSR,
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
        io::Error::from(error)
    ))
}

/// The one rule in POSIX sh, for `push` on a remote host, where no gpureap
/// may be yet: `trusted_dir DIR` (an absolute path) succeeds where
/// `trusted_dir(DIR, false, DirUse::Holds)` would (every directory from `/`
/// down root's or the caller's and writable by nobody else unless sticky, a
/// symbolic link followed only when root's or the caller's), and otherwise
/// says on stderr which name and why. It looks by path (`stat`), not
/// through descriptors; what push then installs in that directory it
/// checks through one. The tests below hold it to the Rust rule.
pub const TRUSTED_SH: &str = r#"
trusted_name() {
  t_info=$(stat -c '%u %a' -- "$1") || return 1
  t_owner=${t_info% *} t_mode=${t_info#* }
  if [ "$t_owner" != 0 ] && [ "$t_owner" != "$(id -u)" ]; then
    echo "$1 belongs to uid $t_owner, not to you or root" >&2; return 1
  fi
  if [ "$2" = dir ] && [ $((0$t_mode & 022)) -ne 0 ] && [ $((0$t_mode & 01000)) -eq 0 ]; then
    echo "others than its owner may write to $1 (mode $(printf %04d "$t_mode"), without the sticky bit)" >&2; return 1
  fi
}
trusted_dir() {
  t_at= t_rest=${1#/} t_links=0
  trusted_name / dir || return 1
  while [ -n "$t_rest" ]; do
    t_name=${t_rest%%/*}
    case $t_rest in */*) t_rest=${t_rest#*/} ;; *) t_rest= ;; esac
    case $t_name in ''|.) continue ;; esac
    t_here=$t_at/$t_name
    if [ -L "$t_here" ]; then
      trusted_name "$t_here" link || { echo "$t_here is a symbolic link others could have made" >&2; return 1; }
      t_links=$((t_links + 1))
      [ "$t_links" -le 40 ] || { echo "$t_here: too many levels of symbolic links" >&2; return 1; }
      t_target=$(readlink -- "$t_here") || return 1
      case $t_target in /*) t_at= t_target=${t_target#/} ;; esac
      t_rest=$t_target${t_rest:+/$t_rest}
      continue
    fi
    [ -d "$t_here" ] || { echo "$t_here is not a directory" >&2; return 1; }
    trusted_name "$t_here" dir || return 1
    t_at=$t_here
  done
}
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    const NOBODY: u32 = 65534;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    /// The one rule and its sh form, on real directories of root's and of
    /// `nobody`'s, real modes and real links: the same verdict on each.
    #[test]
    fn the_rule_and_its_shell_form_agree() {
        let base = tempfile::tempdir().expect("tempdir");
        let base = base.path();
        let dir = |name: &str, mode: u32| {
            let path = base.join(name);
            std::fs::create_dir_all(&path).expect("mkdir");
            chmod(&path, mode);
            path
        };
        dir("own/sub", 0o755);
        dir("open", 0o777);
        dir("open/sub", 0o755);
        dir("group", 0o770);
        dir("sticky", 0o1777);
        dir("sticky/sub", 0o700);
        dir("theirs/sub", 0o755);
        std::os::unix::fs::chown(base.join("theirs"), Some(NOBODY), Some(NOBODY)).expect("chown");
        std::os::unix::fs::symlink("own", base.join("link")).expect("symlink");
        std::os::unix::fs::symlink(base.join("own/sub"), base.join("absolute")).expect("symlink");
        std::os::unix::fs::symlink("own", base.join("foreign")).expect("symlink");
        std::os::unix::fs::lchown(base.join("foreign"), Some(NOBODY), Some(NOBODY))
            .expect("lchown");
        std::os::unix::fs::symlink("open", base.join("to-open")).expect("symlink");
        for (name, trusted) in [
            ("", true),
            ("own/sub", true),
            ("open", false),
            ("open/sub", false),
            ("open/../own", false),
            ("own/../own/sub", true),
            ("group", false),
            ("sticky", true),
            ("sticky/sub", true),
            ("theirs", false),
            ("theirs/sub", false),
            ("link/sub", true),
            ("absolute", true),
            ("foreign/sub", false),
            ("to-open/sub", false),
        ] {
            let path = base.join(name);
            let rust = trusted_dir(&path, false, DirUse::Holds);
            let shell = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("{TRUSTED_SH}\ntrusted_dir \"$1\""))
                .arg("sh")
                .arg(&path)
                .output()
                .expect("sh runs");
            let said = String::from_utf8_lossy(&shell.stderr);
            assert_eq!(rust.is_ok(), trusted, "{name}: {:?}", rust.err());
            assert_eq!(shell.status.success(), trusted, "{name} in sh: {said}");
            if let Err(Untrusted::Unsafe(problem)) = rust {
                // Both name the same component.
                let named = problem.split(' ').find(|word| word.starts_with('/'));
                let named = named.expect("a path").trim_end_matches(',');
                assert!(said.contains(named), "{name}: {problem} / {said}");
            }
        }
        // Where gpureap keeps files, a sticky directory will not do.
        assert!(matches!(
            trusted_dir(&base.join("sticky"), false, DirUse::Keep),
            Err(Untrusted::Unsafe(_))
        ));
    }

    /// A policy read by the one rule: the file itself judged by what was
    /// opened (not a link, not another's, not writable by others, not a
    /// FIFO or a device), and at most `max` bytes read.
    #[test]
    fn a_trusted_read_judges_the_file_it_opened() {
        let base = tempfile::tempdir().expect("tempdir");
        let file = base.path().join("reap.toml");
        std::fs::write(&file, "orphans = true\n").expect("write");
        chmod(&file, 0o644);
        let (_, bytes) = read_trusted(&file, 100).expect("trusted");
        assert_eq!(bytes, b"orphans = true\n");
        assert!(matches!(
            read_trusted(&file, 4),
            Err(NotRead::Unreadable(_))
        ));
        std::os::unix::fs::symlink("reap.toml", base.path().join("link")).expect("symlink");
        assert!(matches!(
            read_trusted(&base.path().join("link"), 100),
            Err(NotRead::Untrusted(_))
        ));
        chmod(&file, 0o664);
        assert!(matches!(
            read_trusted(&file, 100),
            Err(NotRead::Untrusted(_))
        ));
        chmod(&file, 0o644);
        std::os::unix::fs::chown(&file, Some(NOBODY), None).expect("chown");
        assert!(matches!(
            read_trusted(&file, 100),
            Err(NotRead::Untrusted(_))
        ));
        assert!(matches!(
            read_trusted(Path::new("/dev/zero"), 100),
            Err(NotRead::Unreadable(_))
        ));
        assert!(matches!(
            read_trusted(&base.path().join("missing"), 100),
            Err(NotRead::Unreadable(_))
        ));
    }
}
