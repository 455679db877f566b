//! Early wake-up on PostgreSQL: a dedicated connection that `LISTEN`s for the `NOTIFY` that
//! an enqueue of a due task sends when the producer commits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;

use crate::db::{DatabaseUrl, DbConnection};
use crate::driver::NOTIFY_CHANNEL;
use crate::error::{Error, Result};

/// How often the listening connection is checked for notifications while idle. diesel
/// exposes no blocking wait, so this bounds the added wake-up latency; each check is one
/// non-blocking read of the socket.
const CHECK_INTERVAL: Duration = Duration::from_millis(2);

pub(crate) struct Listener {
    conn: PgConnection,
}

impl Listener {
    pub(crate) fn connect(url: &DatabaseUrl) -> Result<Listener> {
        let DbConnection::Pg(mut conn) = url.connect()? else {
            return Err(Error::Runtime("LISTEN needs PostgreSQL".into()));
        };
        conn.batch_execute(&format!("LISTEN {NOTIFY_CHANNEL}"))
            .map_err(|source| Error::Database {
                operation: "listen",
                source,
            })?;
        Ok(Listener { conn })
    }

    /// Waits until a notification arrives, `timeout` passes, or `stop` is set. Returns
    /// whether a notification arrived; an error means the connection is lost.
    pub(crate) fn wait(&mut self, timeout: Duration, stop: &AtomicBool) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut woke = false;
            for notification in self.conn.notifications_iter() {
                notification.map_err(|source| Error::Database {
                    operation: "listen",
                    source,
                })?;
                woke = true;
            }
            if woke {
                return Ok(true);
            }
            if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(CHECK_INTERVAL);
        }
    }
}
