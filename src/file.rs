//! Reading a file a user named on the command line (`-H @FILE`, `push
//! --bin`): bounded, and never waiting on something that only looks like a
//! file. A leaf: it imports nothing of the crate.

/// A file named on the command line (`-H @FILE`, `push --bin`), read as a
/// regular file of at most `max` bytes, without waiting: a FIFO, a device,
/// or a /proc or /sys file that would block or never end (`/proc/kmsg`,
/// `/proc/kallsyms`, which claim a size of 0) is refused, not read. The
/// file stays open: what was read is what a caller may run
/// (`/proc/self/fd/N`).
pub fn read_regular(path: &std::path::Path, max: u64) -> Result<(std::fs::File, Vec<u8>), String> {
    use std::io::Read as _;
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
    let mut bytes = Vec::new();
    (&file)
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::WouldBlock => {
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
    Ok((file, bytes))
}
