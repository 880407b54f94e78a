//! Every exit code gpureap returns, by name, and the one place a process ends.
//!
//! The codes are a contract with scripts, Slurm and fleet runs: `0` done, `1`
//! still held (or a wait that timed out), `2` bad usage or input with nothing
//! signalled, `3` could not complete (the driver failed, an I/O error, a GPU
//! that could not be checked). Nothing else in the program picks a number.

use std::io::Write;

/// How a command ended, as its exit code says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Exit {
    /// All GPUs in scope freed; or status, wait or demo succeeded.
    Success,
    /// Something is still held (free), the GPUs did not become free in time
    /// (wait), or the supervised server did not end cleanly (run).
    StillHeld,
    /// Bad usage or input; nothing was signalled or started.
    Usage,
    /// The command could not do its work: the driver failed or could not
    /// verify a GPU, a file could not be opened or written.
    Incomplete,
}

impl Exit {
    /// The number the process exits with.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::StillHeld => 1,
            Exit::Usage => 2,
            Exit::Incomplete => 3,
        }
    }

    /// Flushes stdout and ends the process at once, without running the exit
    /// handlers that libnvidia-ml registers (they only add time).
    pub fn exit(self) -> ! {
        let _ = std::io::stdout().flush();
        // Safety: _exit ends the process at once; no Rust code runs after it.
        unsafe { libc::_exit(self.code().into()) }
    }
}

impl From<Exit> for i32 {
    fn from(exit: Exit) -> i32 {
        exit.code().into()
    }
}

impl serde::Serialize for Exit {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_documented_ones() {
        assert_eq!(
            [
                Exit::Success,
                Exit::StillHeld,
                Exit::Usage,
                Exit::Incomplete
            ]
            .map(Exit::code),
            [0, 1, 2, 3]
        );
    }
}
