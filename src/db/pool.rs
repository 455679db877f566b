//! The r2d2 pool: connections opened by the backend's own driver, configured alike.

use std::sync::Arc;
use std::time::Duration;

use diesel::connection::{SimpleConnection, TransactionManager};
use diesel::Connection;

use super::{DatabaseUrl, DbConnection};
use crate::driver::driver;
use crate::error::{Error, Result};

/// How long SQLite waits for a competing writer before it reports `database is locked`.
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long taking a connection from the pool may wait before it fails.
pub const DEFAULT_CHECKOUT_TIMEOUT: Duration = Duration::from_secs(10);

/// A pool of [`DbConnection`]s.
pub type DbPool = r2d2::Pool<ConnectionManager>;

/// A connection checked out of a [`DbPool`].
pub type PooledConnection = r2d2::PooledConnection<ConnectionManager>;

/// Opens the pool's connections for one [`DatabaseUrl`], with that backend's own driver, and
/// configures each as [`DatabaseUrl::connect`] does.
///
/// Build a pool of your own with r2d2's builder to choose its size and timeouts, and hand it
/// to [`crate::Worker::with_pool`]:
///
/// ```no_run
/// use outbox::db::{ConnectionManager, DatabaseUrl};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let url = DatabaseUrl::parse("postgres://app@db.internal/app")?;
/// let pool = r2d2::Pool::builder()
///     .max_size(16)
///     .connection_timeout(std::time::Duration::from_secs(5))
///     .build(ConnectionManager::new(&url))?;
/// # Ok(())
/// # }
/// ```
///
/// A connection that cannot be opened fails with the server's own message (`connection
/// refused`, `password authentication failed`, `database "app" does not exist`), which r2d2
/// reports when a checkout times out.
#[derive(Debug, Clone)]
pub struct ConnectionManager {
    url: DatabaseUrl,
    /// What the connections' log records name their database by (`crate::log_label`): r2d2
    /// opens them on threads of its own.
    label: Option<Arc<str>>,
}

impl ConnectionManager {
    /// A manager opening connections to `url`.
    pub fn new(url: &DatabaseUrl) -> Self {
        ConnectionManager {
            url: url.clone(),
            label: None,
        }
    }

    /// The database this manager connects to.
    pub fn url(&self) -> &DatabaseUrl {
        &self.url
    }
}

impl r2d2::ManageConnection for ConnectionManager {
    type Connection = DbConnection;
    type Error = diesel::r2d2::Error;

    fn connect(&self) -> std::result::Result<DbConnection, Self::Error> {
        let _label = crate::log_label::labelled(self.label.as_ref());
        let mut conn = self
            .url
            .establish()
            .map_err(diesel::r2d2::Error::ConnectionError)?;
        driver(&mut conn)
            .connection_configure()
            .map_err(diesel::r2d2::Error::QueryError)?;
        Ok(conn)
    }

    fn is_valid(&self, conn: &mut DbConnection) -> std::result::Result<(), Self::Error> {
        conn.batch_execute("SELECT 1")
            .map_err(diesel::r2d2::Error::QueryError)
    }

    /// A connection is dropped instead of going back to the pool when its thread panicked,
    /// diesel or the engine marked it broken, the reply watchdog closed it, or a statement
    /// failed on it on MySQL (see [`super::reply`]).
    fn has_broken(&self, conn: &mut DbConnection) -> bool {
        std::thread::panicking()
            || <DbConnection as Connection>::TransactionManager::is_broken_transaction_manager(conn)
            || super::reply::must_not_be_reused(conn)
    }
}

/// Applies to an SQLite connection you opened yourself the settings of outbox's own (WAL, a
/// busy timeout of [`SQLITE_BUSY_TIMEOUT`], `synchronous = NORMAL`, foreign keys).
///
/// A producer whose connection lacks them gets `database is locked` while a worker writes:
/// SQLite's default busy timeout is zero. Open its business transactions with
/// `immediate_transaction` too (a deferred transaction that reads and then writes fails at
/// once when another writer holds the lock, whatever the timeout).
///
/// ```no_run
/// use diesel::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish("app.db")?;
/// outbox::db::configure_sqlite(&mut conn)?;
/// conn.immediate_transaction(|conn| {
///     diesel::sql_query("UPDATE orders SET paid = 1 WHERE id = 42").execute(conn)?;
///     outbox::enqueue(conn, &outbox::NewTask::new("points.credit", "42"))
/// })?;
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "sqlite")]
pub fn configure_sqlite(conn: &mut diesel::sqlite::SqliteConnection) -> diesel::QueryResult<()> {
    crate::driver::Driver::connection_configure(conn)
}

impl DatabaseUrl {
    /// Builds a pool of at most `max_size` connections.
    ///
    /// One connection is opened first so that an unreachable server fails here, at once, with
    /// [`Error::Connect`]. Connections are not re-tested on every checkout (that would cost a
    /// round trip per task); a connection that failed is discarded by the pool.
    pub fn pool(&self, max_size: u32) -> Result<DbPool> {
        self.pool_labelled(max_size, None)
    }

    /// [`DatabaseUrl::pool`], whose threads log their failures to connect with `label` (a
    /// [`crate::Fleet`]'s database: `crate::log_label`).
    pub(crate) fn pool_labelled(&self, max_size: u32, label: Option<Arc<str>>) -> Result<DbPool> {
        if max_size == 0 {
            return Err(Error::InvalidConfig {
                setting: "pool size",
                reason: "must be at least 1".into(),
            });
        }
        drop(self.connect()?);
        r2d2::Pool::builder()
            .max_size(max_size)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(DEFAULT_CHECKOUT_TIMEOUT)
            .error_handler(Box::new(LabelledErrors(label.clone())))
            .build(ConnectionManager {
                url: self.clone(),
                label,
            })
            .map_err(|e| Error::Connect {
                url: self.masked(),
                source: Box::new(e),
            })
    }
}

/// Runs `f`, and again at once when it failed on a pooled connection found dead, up to
/// `tries` more times (once per connection of the pool). The pool does not test connections
/// on checkout (a round trip per task), so after a sweep of `pg_terminate_backend` or a
/// failover each idle connection fails once, at its next use, and is discarded: that is no
/// outage to back off from, nor a reason to fail.
pub(crate) fn retry_dead_connections<T>(tries: u32, mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let mut left = tries;
    loop {
        match f() {
            Err(e) if left > 0 && e.is_connection_lost() => {
                left -= 1;
                log::debug!("a pooled connection was dead ({e}); trying another");
            }
            result => return result,
        }
    }
}

/// [`retry_dead_connections`] for `f` on a connection of `pool`, which it discards when it is
/// found dead: a start's first statements (the migration check, the node's registration).
pub(crate) fn on_live_conn<T>(
    pool: &DbPool,
    what: &'static str,
    mut f: impl FnMut(&mut DbConnection) -> Result<T>,
) -> Result<T> {
    use crate::error::OpContext;
    retry_dead_connections(pool.max_size(), || {
        let mut conn = pool.get().op(what)?;
        f(&mut conn).inspect_err(|e| {
            if e.is_connection_lost() {
                super::transaction::mark_broken(&mut conn);
            }
        })
    })
}

/// Logs a pool's failures to open a connection as r2d2 does, with its database's label.
#[derive(Debug)]
struct LabelledErrors(Option<Arc<str>>);

impl<E: std::fmt::Display> r2d2::HandleError<E> for LabelledErrors {
    fn handle_error(&self, error: E) {
        let _label = crate::log_label::labelled(self.0.as_ref());
        log::error!(target: "r2d2", "{error}");
    }
}
