//! `gpureap top`: a live view over the same pipeline as `status` and `free`
//! (`live`, built with the `top` feature, on by default), and its document
//! stream, `top --json` (`stream`), which is also what `top -H` reads from
//! the host it shows. A build without the feature keeps the stream.

#[cfg(feature = "top")]
pub mod live;
pub mod stream;

use std::sync::Arc;

use crate::driver::BackendChoice;
use crate::exit::{Exit, Failure};
use crate::remote::FleetConfig;
use crate::request::{self, TopRequest, UsageError};

/// `gpureap top`: the stream (`--json`, no terminal needed), or the live
/// view on a terminal, of this host's driver or (`-H`) of the one host named.
pub fn main(
    backend: &BackendChoice,
    request: &TopRequest,
    host: Option<FleetConfig>,
    remote_backend: &Option<String>,
) -> Result<Exit, Failure> {
    if request.json {
        let driver = request::open_driver_quietly(backend)?;
        return Ok(stream::emit(Arc::from(driver), request.interval)?);
    }
    #[cfg(not(feature = "top"))]
    {
        let _ = (host, remote_backend);
        Err(without_live_view())
    }
    #[cfg(feature = "top")]
    {
        terminal()?;
        if let Some(host) = host {
            let fleet = crate::remote::Fleet::new(&host, remote_backend.clone(), false)
                .map_err(UsageError)?
                .ok_or_else(|| UsageError("top -H: no host".to_string()))?;
            return Ok(live::run_remote(fleet, request)?);
        }
        let driver = request::open_driver_quietly(backend)?;
        Ok(live::run(Arc::from(driver), request)?)
    }
}

/// The live view draws on a terminal and reads keys from it.
#[cfg(feature = "top")]
pub fn terminal() -> Result<(), Failure> {
    use std::io::{self, IsTerminal};
    if io::stdin().is_terminal() && io::stdout().is_terminal() {
        return Ok(());
    }
    Err(UsageError(
        "top needs a terminal (stdin and stdout); for a script use `gpureap status --json`"
            .to_string(),
    )
    .into())
}

/// What a build without the `top` feature says where the live view is asked
/// for: it could not be done here (3), and what still works.
#[cfg(not(feature = "top"))]
pub fn without_live_view() -> Failure {
    Failure::new(
        Exit::Incomplete,
        UsageError(
            "this gpureap was built without the live view (cargo feature \"top\"); \
             `gpureap top --json` and `gpureap status` work"
                .to_string(),
        ),
    )
}
