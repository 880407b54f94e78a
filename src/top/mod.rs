//! `gpureap top`: a live view over the same pipeline as `status` and `free`
//! (`live`, built with the `top` feature, on by default), and its document
//! stream, `top --json` (`stream`), which is also what `top -H` reads from
//! the host it shows. A build without the feature keeps the stream.

#[cfg(feature = "top")]
pub mod live;
pub mod stream;
