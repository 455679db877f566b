//! Early wake-up on PostgreSQL: a dedicated connection that `LISTEN`s for the `NOTIFY` that
//! an enqueue of a due task sends when the producer commits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::db::{DatabaseUrl, DbConnection};
use crate::driver::driver;
use crate::error::{OpContext, Result};

/// How often the listening connection is checked for notifications while idle. diesel
/// exposes no blocking wait, so this bounds the added wake-up latency; each check is one
/// non-blocking read of the socket.
const CHECK_INTERVAL: Duration = Duration::from_millis(2);

pub(crate) struct Listener {
    conn: DbConnection,
}

impl Listener {
    /// A listening connection; `None` when the backend has no notifications (SQLite).
    pub(crate) fn connect(url: &DatabaseUrl) -> Result<Option<Listener>> {
        let mut conn = url.connect()?;
        if !driver(&mut conn).listen_start().op("listen")? {
            return Ok(None);
        }
        Ok(Some(Listener { conn }))
    }

    /// Waits until a notification arrives, `timeout` passes, `stop` is set, or `ready`
    /// holds (looked at as often as the connection). Returns whether a notification arrived;
    /// an error means the connection is lost.
    pub(crate) fn wait(
        &mut self,
        timeout: Duration,
        stop: &AtomicBool,
        ready: impl Fn() -> bool,
    ) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            if driver(&mut self.conn).listen_poll().op("listen")? {
                return Ok(true);
            }
            if stop.load(Ordering::Relaxed) || Instant::now() >= deadline || ready() {
                return Ok(false);
            }
            std::thread::sleep(CHECK_INTERVAL);
        }
    }
}
