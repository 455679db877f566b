//! A process's exit while its threads may still be opening server connections.
//!
//! Opening a PostgreSQL connection calls into libkrb5 (libpq asks for Kerberos credentials
//! whenever `gssencmode` is `prefer`, its default). When `main` returns, the C library runs
//! the shared libraries' destructors while the other threads still run; a thread inside
//! libkrb5 then fails one of its assertions and the process dies of SIGABRT, after its work
//! is done. r2d2 opens connections on its own threads, in the background of a `get`, so a
//! command that has finished may still have one being opened.
//!
//! [`prepare_exit`] closes that window: it refuses every new server connection and waits for
//! those being opened. `outbox::cli::main` calls it last (`outbox::cli::settle`).

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Server connections being opened, and whether the process is exiting.
static OPENING: Mutex<(usize, bool)> = Mutex::new((0, false));
static OPENED: Condvar = Condvar::new();

/// A server connection being opened, counted until dropped.
pub(crate) struct Connecting(());

impl Connecting {
    /// Counts a connection about to be opened; refused once [`prepare_exit`] has begun.
    pub(crate) fn start() -> Result<Connecting, diesel::ConnectionError> {
        let mut state = OPENING.lock().unwrap_or_else(|e| e.into_inner());
        if state.1 {
            return Err(diesel::ConnectionError::BadConnection(
                "not opened: the process is exiting".into(),
            ));
        }
        state.0 += 1;
        Ok(Connecting(()))
    }
}

impl Drop for Connecting {
    fn drop(&mut self) {
        let mut state = OPENING.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= 1;
        if state.0 == 0 {
            OPENED.notify_all();
        }
    }
}

/// Refuses every server connection from now on, and waits until none is being opened, for at
/// most `timeout`; returns whether none is.
///
/// Call it last in `main` when threads of yours, or of a pool (r2d2 opens connections on its
/// own threads), may still be opening PostgreSQL or MySQL connections: a thread inside the
/// client library while the process exits can abort it (see this module). A connection
/// opened with a URL's own `connect_timeout` ends within that time; outbox's default is
/// [`super::DEFAULT_CONNECT_TIMEOUT`].
pub fn prepare_exit(timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut state = OPENING.lock().unwrap_or_else(|e| e.into_inner());
    state.1 = true;
    while state.0 > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        state = OPENED
            .wait_timeout(state, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    true
}
