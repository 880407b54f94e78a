//! What gpureap prints on stdout, in one piece and one way: a report for
//! people escaped (`units::printable`), a document for programs as its
//! encoder wrote it. `main` and the front ends that print (`status`,
//! `free`, `waiting`) write through these.

use std::io::{self, Write};

/// Writes a report for people to stdout, escaped (`units::printable`).
pub fn emit(text: &str) -> io::Result<()> {
    emit_encoded(&crate::units::printable(text))
}

/// Writes a document for programs (JSON, a Prometheus exposition) to stdout
/// as its encoder wrote it, in one piece; a closed pipe ends quietly. Each
/// encoder keeps control characters out (`report::to_json`, `metrics`):
/// escaping them here would make `\r` of a raw CR, an escape neither format has.
pub fn emit_encoded(text: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    let written = stdout
        .write_all(text.as_bytes())
        .and_then(|()| {
            if text.ends_with('\n') {
                Ok(())
            } else {
                stdout.write_all(b"\n")
            }
        })
        .and_then(|()| stdout.flush());
    match written {
        // `gpureap free ... | head`: the reader left; the command's exit code still stands.
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
