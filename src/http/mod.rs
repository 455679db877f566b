//! The crate's one HTTP server, under the metrics endpoint ([`crate::metrics`]) and the
//! dashboard (`outbox::web`): axum's router served on hyper's HTTP/1 connections, one tokio
//! task per connection, on a small runtime that the caller owns.
//!
//! Both listen where a network may reach them, so the server is bounded, whatever clients do:
//!
//! - at most [`connection_cap`] connections at once ([`MAX_CONNECTIONS`], or half the
//!   process's open-file limit if that is less, so that the endpoint cannot take the files
//!   the worker needs for its database connections and its dead-task hook). When every slot
//!   is taken the server stops accepting until one frees: new connections wait in the
//!   kernel's backlog instead of being accepted and closed, which would cost a file and a
//!   wake-up per attempt to a client that reconnects in a loop, and would fail a scraper or
//!   a probe that a slot freed a moment later could have served;
//! - a request's header must arrive within [`HEADER_READ_TIMEOUT`] of the connection's
//!   first byte or of the previous response (hyper's own timer): a silent or slow client
//!   loses its slot;
//! - a connection on which no byte moves either way for [`IDLE_TIMEOUT`] while it waits to
//!   read or to write is closed ([`io::IdleTimeout`]): a client that sends a body slowly, or
//!   pipelines requests and never reads the answers, is dropped. Until then hyper answers
//!   one request of a connection at a time and reads no further while an answer is unsent,
//!   so such a client holds one slot and a bounded buffer, never a thread;
//! - an accept error (the process out of files, `EMFILE`) is logged, and accepting resumes
//!   after [`ACCEPT_PAUSE`]: the server never stops listening for good.

mod background;
mod io;

pub(crate) use background::{Background, Grace};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// The most connections a server holds at once (fewer under a low open-file limit:
/// [`connection_cap`]).
pub(crate) const MAX_CONNECTIONS: usize = 512;
/// How long a request's header may take to arrive, from the connection's first read or the
/// end of the previous response. Prometheus's scrape timeout is 10 s by default.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The most a connection buffers of a request's head: a longer one is refused (431), so that
/// the most connections held at once hold at most a few MiB (hyper's default buffers 400 KiB
/// a connection).
pub(crate) const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a connection may wait to read or to write with no byte moving either way.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The pause after an accept error before accepting again.
pub(crate) const ACCEPT_PAUSE: Duration = Duration::from_millis(250);

/// The connection cap: [`MAX_CONNECTIONS`], or half the process's soft open-file limit if
/// that is less (at least 8).
pub(crate) fn connection_cap() -> usize {
    let half = open_file_limit().map_or(usize::MAX, |limit| limit / 2);
    MAX_CONNECTIONS.min(half).max(8)
}

/// The soft `RLIMIT_NOFILE`, if the system tells it and it is finite.
#[allow(unsafe_code)]
fn open_file_limit() -> Option<usize> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes one `rlimit` through a pointer to a live, properly aligned
    // value of that type, and has no other precondition.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if rc != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    usize::try_from(limit.rlim_cur).ok()
}

/// Serves `app` on `listener` until `shutdown` completes, within the bounds above; then
/// stops accepting, asks every open connection to close once its request under way is
/// answered, and returns when they have (callers bound that wait with a timeout of their
/// own). `name` prefixes the log lines.
pub(crate) async fn serve(
    name: &'static str,
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    let cap = connection_cap();
    let slots = Arc::new(Semaphore::new(cap));
    let (closing, closed) = watch::channel(false);
    tokio::pin!(shutdown);
    // Whether the last accept failed: logged once per run of failures, not at every retry.
    let mut failing = false;
    loop {
        let slot = tokio::select! {
            biased;
            () = &mut shutdown => break,
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                if failing {
                    log::info!("{name}: accepting connections again");
                    failing = false;
                }
                tokio::spawn(connection(stream, app.clone(), slot, closed.clone()));
            }
            // The client gave up between its SYN and our accept: nothing is wrong here.
            Err(e) if is_connection_error(&e) => {}
            Err(e) => {
                if !failing {
                    log::warn!(
                        "{name}: cannot accept a connection ({e}); retrying every {ACCEPT_PAUSE:?}"
                    );
                    failing = true;
                }
                drop(slot);
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(ACCEPT_PAUSE) => {}
                }
            }
        }
    }
    drop(listener);
    let _ = closing.send(true);
    // Every slot back: every connection closed.
    let _ = slots.acquire_many(cap as u32).await;
}

/// One connection, holding its slot until it closes.
async fn connection(
    stream: TcpStream,
    app: Router,
    _slot: OwnedSemaphorePermit,
    mut closing: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(io::IdleTimeout::new(stream, IDLE_TIMEOUT));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES);
    let conn = builder.serve_connection(io, TowerToHyperService::new(app));
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => return log_end(result),
        _ = closing.wait_for(|closing| *closing) => conn.as_mut().graceful_shutdown(),
    }
    log_end(conn.await);
}

fn log_end(result: Result<(), hyper::Error>) {
    if let Err(e) = result {
        // A client's timeout, reset or bad request: the client's business, not the operator's.
        log::debug!("http: connection ended: {e}");
    }
}

/// Errors of one connection that `accept` reports, after which the listener is fine.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_at_most_the_maximum_and_half_the_file_limit() {
        let cap = connection_cap();
        assert!((8..=MAX_CONNECTIONS).contains(&cap), "{cap}");
        if let Some(limit) = open_file_limit() {
            assert!(cap <= (limit / 2).max(8), "{cap} of {limit}");
        }
    }
}
