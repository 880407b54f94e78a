//! A read-only HTTP/1.1 server for one page: `GET /metrics`.
//!
//! Why not a framework: a metrics endpoint must never let idle or slow
//! clients stop a real scrape, and the small servers at hand either spawn a
//! thread per connection without timeouts (`tiny_http`) or bring an async
//! runtime for one page (`hyper` + `tokio`). This is one thread and one
//! `poll(2)` loop over non-blocking sockets: at most `MAX_CONNECTIONS` are
//! kept, and when one more arrives the one that has been waiting longest
//! for its request is closed to make room, so idle connections cannot crowd
//! out a scrape; each connection must send its request within
//! `REQUEST_TIMEOUT` and take its answer within `RESPONSE_TIMEOUT`. Requests
//! are parsed by `httparse`; every answer closes the connection. Nothing a
//! request says changes anything: other methods get 405, other paths 404.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

use crate::metrics::{Exposition, OPENMETRICS, TEXT_FORMAT};

/// Connections kept open at once.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// How long a client has, from its connection, to send its request.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client has, from its connection, to read its answer.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest request head accepted.
const MAX_REQUEST: usize = 8 << 10;
const MAX_HEADERS: usize = 64;

/// The one page served, as it is at the moment of a request, in both formats.
pub type Page = Arc<Exposition>;

/// What a response carries after its head.
enum Body {
    /// Nothing (an answer to HEAD).
    Empty,
    /// The page, in OpenMetrics (`true`) or the Prometheus text format.
    Page(Page, bool),
    Message(Vec<u8>),
}

impl Body {
    fn bytes(&self) -> &[u8] {
        match self {
            Body::Empty => &[],
            Body::Page(page, true) => page.openmetrics.as_bytes(),
            Body::Page(page, false) => page.text.as_bytes(),
            Body::Message(message) => message,
        }
    }
}

/// A response: its head, then its body.
struct Answer {
    head: Vec<u8>,
    body: Body,
}

fn answer(status: &str, content_type: &str, extra: &str, body: Body, length: usize) -> Answer {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\nConnection: close\r\n{extra}\r\n"
    )
    .into_bytes();
    Answer { head, body }
}

fn message(status: &str, extra: &str, text: &str, send_body: bool) -> Answer {
    let bytes = format!("{status}: {text}\n").into_bytes();
    let length = bytes.len();
    let body = if send_body {
        Body::Message(bytes)
    } else {
        Body::Empty
    };
    answer(status, "text/plain; charset=utf-8", extra, body, length)
}

/// Whether the client asked for OpenMetrics (Prometheus does); anything
/// else gets the Prometheus text format.
fn wants_openmetrics(accept: &str) -> bool {
    accept.contains("application/openmetrics-text")
}

/// The answer to a complete request head.
fn respond(method: &str, target: &str, accept: &str, page: &dyn Fn() -> Page) -> Answer {
    let path = target.split(['?', '#']).next().unwrap_or(target);
    let send_body = method != "HEAD";
    if path != "/metrics" {
        return message(
            "404 Not Found",
            "",
            "the metrics are at /metrics",
            send_body,
        );
    }
    if method != "GET" && method != "HEAD" {
        return message(
            "405 Method Not Allowed",
            "Allow: GET, HEAD\r\n",
            "only GET and HEAD; nothing here can be changed",
            true,
        );
    }
    let openmetrics = wants_openmetrics(accept);
    let content_type = if openmetrics {
        OPENMETRICS
    } else {
        TEXT_FORMAT
    };
    let body = Body::Page(page(), openmetrics);
    let length = body.bytes().len();
    let body = if send_body { body } else { Body::Empty };
    answer("200 OK", content_type, "", body, length)
}

enum Phase {
    Reading(Vec<u8>),
    Writing { answer: Answer, written: usize },
}

struct Connection {
    stream: TcpStream,
    since: Instant,
    phase: Phase,
}

impl Connection {
    fn deadline(&self) -> Instant {
        self.since
            + match self.phase {
                Phase::Reading(_) => REQUEST_TIMEOUT,
                Phase::Writing { .. } => RESPONSE_TIMEOUT,
            }
    }

    /// Reads what has arrived; moves to writing once the request is whole.
    /// `false` when the connection is done with.
    fn read(&mut self, page: &dyn Fn() -> Page) -> bool {
        let Phase::Reading(buffer) = &mut self.phase else {
            return true;
        };
        let mut chunk = [0u8; 2048];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return false,
                Ok(count) => buffer.extend_from_slice(&chunk[..count]),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
            if buffer.len() > MAX_REQUEST {
                break;
            }
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        let answer = match request.parse(buffer) {
            // A whole head that arrived in one read is refused all the same
            // when it is over the limit: the limit is the head's, not a read's.
            Ok(httparse::Status::Complete(head)) if head > MAX_REQUEST => message(
                "431 Request Header Fields Too Large",
                "",
                "the request head is too large",
                true,
            ),
            Ok(httparse::Status::Complete(_)) => {
                let accept = request
                    .headers
                    .iter()
                    .filter(|header| header.name.eq_ignore_ascii_case("accept"))
                    .map(|header| String::from_utf8_lossy(header.value))
                    .collect::<Vec<_>>()
                    .join(",");
                respond(
                    request.method.unwrap_or(""),
                    request.path.unwrap_or(""),
                    &accept,
                    page,
                )
            }
            Ok(httparse::Status::Partial) if buffer.len() <= MAX_REQUEST => return true,
            Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => message(
                "431 Request Header Fields Too Large",
                "",
                "the request head is too large",
                true,
            ),
            Err(_) => message("400 Bad Request", "", "not an HTTP request", true),
        };
        self.phase = Phase::Writing { answer, written: 0 };
        self.write()
    }

    /// Writes what the socket takes. `false` once all is written (or the
    /// client left): the connection is then closed.
    fn write(&mut self) -> bool {
        let Phase::Writing { answer, written } = &mut self.phase else {
            return true;
        };
        let head = answer.head.len();
        let body = answer.body.bytes();
        loop {
            if *written >= head + body.len() {
                return false;
            }
            let rest = if *written < head {
                &answer.head[*written..]
            } else {
                &body[*written - head..]
            };
            match self.stream.write(rest) {
                Ok(0) => return false,
                Ok(count) => *written += count,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return true,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }
}

/// Serves `page` on `listener` until `stop` becomes readable (a signal
/// pipe), or for ever when there is none. `page` is called once per
/// request for `/metrics`, on this thread: it must be cheap.
pub fn serve(
    listener: TcpListener,
    stop: Option<&dyn AsFd>,
    page: &dyn Fn() -> Page,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut connections: Vec<Connection> = Vec::new();
    loop {
        let now = Instant::now();
        connections.retain(|connection| connection.deadline() > now);
        let timeout = connections
            .iter()
            .map(|connection| connection.deadline().saturating_duration_since(now))
            .min()
            .map(|wait| Timespec {
                tv_sec: wait.as_secs() as _,
                // Rounded up, so that poll does not wake a moment early and spin.
                tv_nsec: (wait.subsec_nanos().div_ceil(1_000_000) * 1_000_000).min(999_999_999)
                    as _,
            });
        let mut fds = Vec::with_capacity(connections.len() + 2);
        fds.push(PollFd::new(&listener, PollFlags::IN));
        if let Some(stop) = stop {
            fds.push(PollFd::from_borrowed_fd(stop.as_fd(), PollFlags::IN));
        }
        let first_connection = fds.len();
        for connection in &connections {
            let events = match connection.phase {
                Phase::Reading(_) => PollFlags::IN,
                Phase::Writing { .. } => PollFlags::OUT,
            };
            fds.push(PollFd::new(&connection.stream, events));
        }
        match poll(&mut fds, timeout.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(error) => return Err(error.into()),
        }
        if stop.is_some() && !fds[1].revents().is_empty() {
            return Ok(());
        }
        let ready: Vec<bool> = fds[first_connection..]
            .iter()
            .map(|fd| !fd.revents().is_empty())
            .collect();
        let accept = !fds[0].revents().is_empty();
        drop(fds);

        let mut index = 0;
        connections.retain_mut(|connection| {
            let woken = ready.get(index).copied().unwrap_or(false);
            index += 1;
            if !woken {
                return true;
            }
            match connection.phase {
                Phase::Reading(_) => connection.read(page),
                Phase::Writing { .. } => connection.write(),
            }
        });
        if accept {
            accept_all(&listener, &mut connections, page);
        }
    }
}

/// Takes every connection waiting in the backlog. When full, the connection
/// that has waited longest for its request makes room; while every one is
/// being answered, the newcomer is closed at once.
fn accept_all(listener: &TcpListener, connections: &mut Vec<Connection>, page: &dyn Fn() -> Page) {
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            // WouldBlock: the backlog is empty. Anything else (EMFILE, a
            // connection reset before it was taken) is for this one only.
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
            Err(error) => {
                tracing::debug!(%error, "accept failed");
                if matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                    evict(connections);
                }
                return;
            }
        };
        if connections.len() >= MAX_CONNECTIONS && !evict(connections) {
            continue;
        }
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        let _ = stream.set_nodelay(true);
        let mut connection = Connection {
            stream,
            since: Instant::now(),
            phase: Phase::Reading(Vec::new()),
        };
        // The request is often there already: answer without another poll.
        if connection.read(page) {
            connections.push(connection);
        }
    }
}

/// Closes the connection that has waited longest for its request; `false`
/// when none is waiting for one.
fn evict(connections: &mut Vec<Connection>) -> bool {
    let oldest = connections
        .iter()
        .enumerate()
        .filter(|(_, connection)| matches!(connection.phase, Phase::Reading(_)))
        .min_by_key(|(_, connection)| connection.since)
        .map(|(index, _)| index);
    match oldest {
        Some(index) => {
            connections.swap_remove(index);
            true
        }
        None => false,
    }
}

/// Binds `address`, saying which address could not be bound and why.
pub fn bind(address: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(address).map_err(|error| {
        io::Error::new(error.kind(), format!("cannot listen on {address}: {error}"))
    })
}

/// Serves a page built at each request on `listener`, from a thread of its
/// own, for as long as the process lives (`gpureap run --metrics`).
pub fn serve_in_background(
    listener: TcpListener,
    page: impl Fn() -> Page + Send + 'static,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("gpureap-metrics".to_string())
        .spawn(move || {
            if let Err(error) = serve(listener, None, &page) {
                tracing::warn!(%error, "the metrics server stopped");
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> Page {
        Arc::new(Exposition {
            openmetrics: "om\n# EOF\n".to_string(),
            text: "text\n".to_string(),
        })
    }

    fn head(answer: &Answer) -> String {
        String::from_utf8_lossy(&answer.head).into_owned()
    }

    #[test]
    fn only_get_and_head_on_metrics() {
        let get = respond("GET", "/metrics?x=1", "*/*", &page);
        assert!(head(&get).starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(head(&get).contains(TEXT_FORMAT));
        assert_eq!(get.body.bytes(), b"text\n");
        let prometheus = respond(
            "GET",
            "/metrics",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
            &page,
        );
        assert!(head(&prometheus).contains(OPENMETRICS));
        assert_eq!(prometheus.body.bytes(), b"om\n# EOF\n");
        let head_only = respond("HEAD", "/metrics", "", &page);
        assert!(head(&head_only).contains("Content-Length: 5\r\n"));
        assert!(head_only.body.bytes().is_empty());
        for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
            let refused = respond(method, "/metrics", "", &page);
            assert!(head(&refused).starts_with("HTTP/1.1 405 "), "{method}");
            assert!(head(&refused).contains("Allow: GET, HEAD\r\n"));
        }
        for path in ["/", "/metrics/", "/metricsx", "/../metrics", "*"] {
            assert!(
                head(&respond("GET", path, "", &page)).starts_with("HTTP/1.1 404 "),
                "{path}"
            );
        }
    }
}
