//! Is the server ready, and once ready, is it healthy? An HTTP URL answering
//! 2xx (SGLang's and vLLM's /health), a TCP port accepting connections, or a
//! log line matching a regex. A port alone is weak: vLLM binds long before
//! it answers.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use regex::Regex;

#[derive(Debug, Clone)]
pub enum Readiness {
    Url(String),
    Port(u16),
    Log(Regex),
    /// No check given: the server counts as ready once started.
    Started,
}

impl std::fmt::Display for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Readiness::Url(url) => write!(f, "{url} answering 2xx"),
            Readiness::Port(port) => write!(f, "port {port} accepting"),
            Readiness::Log(regex) => write!(f, "a log line matching /{regex}/"),
            Readiness::Started => write!(f, "no readiness check (ready once started)"),
        }
    }
}

const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// One HTTP GET: `Ok(status)` when the server answered at all.
pub fn http_status(url: &str) -> Result<u16, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(PROBE_TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into();
    agent
        .get(url)
        .call()
        .map(|response| response.status().as_u16())
        .map_err(|error| error.to_string())
}

pub fn port_open(port: u16) -> bool {
    ("127.0.0.1", port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
        .is_some_and(|address| TcpStream::connect_timeout(&address, PROBE_TIMEOUT).is_ok())
}

impl Readiness {
    /// Whether the server is ready now. `log_ready` is whether the log regex matched.
    pub fn probe(&self, log_ready: bool) -> bool {
        match self {
            Readiness::Url(url) => {
                http_status(url).is_ok_and(|status| (200..300).contains(&status))
            }
            Readiness::Port(port) => port_open(*port),
            Readiness::Log(_) => log_ready,
            Readiness::Started => true,
        }
    }

    /// Whether there is anything to check after ready: a URL or a port can
    /// stop answering; a log line, once seen, says nothing more.
    pub fn checks_health(&self) -> bool {
        matches!(self, Readiness::Url(_) | Readiness::Port(_))
    }

    /// After ready: `Err(why)` when the health check fails.
    pub fn health(&self) -> Result<(), String> {
        match self {
            Readiness::Url(url) => match http_status(url) {
                Ok(status) if (200..300).contains(&status) => Ok(()),
                Ok(status) => Err(format!("{url} answered {status}")),
                Err(error) => Err(format!("{url}: {error}")),
            },
            Readiness::Port(port) if !port_open(*port) => {
                Err(format!("port {port} no longer accepts connections"))
            }
            _ => Ok(()),
        }
    }
}
