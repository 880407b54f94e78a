//! Every exit code gpureap returns, by name.

/// All GPUs in scope freed; or status/wait/demo succeeded.
pub const SUCCESS: u8 = 0;
/// Something is still held (free), the GPUs did not become free (wait), or
/// the run failed after it started.
pub const STILL_HELD: u8 = 1;
/// Bad usage or input; nothing was signalled.
pub const USAGE: u8 = 2;
