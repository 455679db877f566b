//! Connections: the backend chosen from the URL, the connection enum handlers receive, the
//! r2d2 pool, and write transactions that are `IMMEDIATE` on SQLite.

use std::time::Duration;

use diesel::connection::{AnsiTransactionManager, SimpleConnection, TransactionManager};
use diesel::pg::PgConnection;
use diesel::r2d2::{ConnectionManager, CustomizeConnection};
use diesel::sqlite::SqliteConnection;
use diesel::Connection;

use crate::error::{Error, MaskedUrl, Result};

pub use multi::DbConnection;

// The derive generates public helper types without docs; they live in their own module.
#[allow(missing_docs)]
mod multi {
    use diesel::pg::PgConnection;
    use diesel::sqlite::SqliteConnection;

    /// A connection to either backend: what a handler's [`crate::TaskTx::conn`] returns,
    /// inside the task's transaction.
    ///
    /// Code written with diesel's DSL runs on both variants; where a handler needs SQL that only
    /// one backend has, it matches on the variant.
    ///
    /// ```no_run
    /// use outbox::DbConnection;
    /// use diesel::prelude::*;
    ///
    /// fn backend_name(conn: &mut DbConnection) -> &'static str {
    ///     match conn {
    ///         DbConnection::Pg(_) => "postgres",
    ///         DbConnection::Sqlite(_) => "sqlite",
    ///     }
    /// }
    /// ```
    #[derive(diesel::MultiConnection)]
    pub enum DbConnection {
        /// A PostgreSQL connection (the fleet backend).
        Pg(PgConnection),
        /// An SQLite connection (the embedded backend).
        Sqlite(SqliteConnection),
    }
}

/// A pool of [`DbConnection`]s.
pub type DbPool = r2d2::Pool<ConnectionManager<DbConnection>>;

/// A connection checked out of a [`DbPool`].
pub type PooledConnection = r2d2::PooledConnection<ConnectionManager<DbConnection>>;

/// How long SQLite waits for a competing writer before it reports `database is locked`.
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long taking a connection from the pool may wait before it fails.
pub const DEFAULT_CHECKOUT_TIMEOUT: Duration = Duration::from_secs(10);

/// The database URL used when neither `--database-url` nor `DATABASE_URL` is given.
pub const DEFAULT_DATABASE_URL: &str = "outbox.db";

/// Which database a URL names. Chosen from the scheme alone: there is no fallback from one
/// backend to the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `sqlite://PATH`, `sqlite:PATH`, or a plain file path.
    Sqlite,
}

impl Backend {
    /// The backend's name as printed in reports: `postgres` or `sqlite`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }
}

/// A validated database URL: the backend and the string to hand to the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    backend: Backend,
    /// The URL for PostgreSQL, the file path for SQLite.
    target: String,
    original: String,
}

impl DatabaseUrl {
    /// Parses a URL: `postgres://…`/`postgresql://…` select PostgreSQL; `sqlite://PATH`,
    /// `sqlite:PATH` or a plain path select an SQLite file. Any other `scheme://` is refused,
    /// and so is an in-memory SQLite database, which the worker's pooled connections could
    /// not share.
    ///
    /// ```
    /// use outbox::db::{Backend, DatabaseUrl};
    /// assert_eq!(DatabaseUrl::parse("postgres://u@h/db").unwrap().backend(), Backend::Postgres);
    /// assert_eq!(DatabaseUrl::parse("outbox.db").unwrap().backend(), Backend::Sqlite);
    /// assert!(DatabaseUrl::parse("mysql://u@h/db").is_err());
    /// ```
    pub fn parse(url: &str) -> Result<DatabaseUrl> {
        let invalid = |reason: &str| Error::InvalidDatabaseUrl {
            url: MaskedUrl(url).to_string(),
            reason: reason.to_owned(),
        };
        let url_trimmed = url.trim();
        if url_trimmed.is_empty() {
            return Err(invalid("it is empty"));
        }
        let (backend, target) =
            if url_trimmed.starts_with("postgres://") || url_trimmed.starts_with("postgresql://") {
                (Backend::Postgres, url_trimmed.to_owned())
            } else if let Some(path) = url_trimmed
                .strip_prefix("sqlite://")
                .or_else(|| url_trimmed.strip_prefix("sqlite:"))
            {
                (Backend::Sqlite, path.to_owned())
            } else if let Some(scheme_end) = url_trimmed.find("://") {
                return Err(invalid(&format!(
                "unsupported scheme {:?}; use postgres://, postgresql://, sqlite:// or a file path",
                &url_trimmed[..scheme_end]
            )));
            } else {
                (Backend::Sqlite, url_trimmed.to_owned())
            };
        if backend == Backend::Sqlite {
            if target.is_empty() {
                return Err(invalid("the SQLite path is empty"));
            }
            if target == ":memory:" || target.contains("mode=memory") {
                return Err(invalid(
                    "an in-memory SQLite database cannot be shared by the worker's connections; use a file",
                ));
            }
        }
        Ok(DatabaseUrl {
            backend,
            target,
            original: url_trimmed.to_owned(),
        })
    }

    /// The backend the URL selects.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL for PostgreSQL, the file path for SQLite.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// The URL with its password masked, for messages.
    pub fn masked(&self) -> String {
        MaskedUrl(&self.original).to_string()
    }

    /// Fails with [`Error::Connect`] when the URL names an SQLite file that does not exist:
    /// commands that work an existing database call this first, so that a mistyped path is
    /// an error and leaves no empty file behind (opening an SQLite path creates the file).
    pub fn require_existing(&self) -> Result<()> {
        if self.backend == Backend::Sqlite && !std::path::Path::new(&self.target).exists() {
            return Err(Error::Connect {
                url: self.masked(),
                source: "the SQLite file does not exist; `outbox migrate` creates it".into(),
            });
        }
        Ok(())
    }

    /// Opens one connection, configured as the pool configures its own.
    ///
    /// Fails with [`Error::Connect`] at once when the server is down; an SQLite file is created
    /// if it does not exist.
    pub fn connect(&self) -> Result<DbConnection> {
        let mut conn = match self.backend {
            Backend::Postgres => PgConnection::establish(&self.target).map(DbConnection::Pg),
            Backend::Sqlite => SqliteConnection::establish(&self.target).map(DbConnection::Sqlite),
        }
        .map_err(|e| Error::Connect {
            url: self.masked(),
            source: Box::new(e),
        })?;
        configure(&mut conn).map_err(|e| Error::Connect {
            url: self.masked(),
            source: Box::new(e),
        })?;
        Ok(conn)
    }

    /// Builds a pool of at most `max_size` connections.
    ///
    /// One connection is opened first so that an unreachable server fails here, at once, with
    /// [`Error::Connect`]. Connections are not re-tested on every checkout (that would cost a
    /// round trip per task); a connection that failed is discarded by the pool.
    pub fn pool(&self, max_size: u32) -> Result<DbPool> {
        if max_size == 0 {
            return Err(Error::InvalidConfig(
                "the pool needs at least one connection".into(),
            ));
        }
        drop(self.connect()?);
        r2d2::Pool::builder()
            .max_size(max_size)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(DEFAULT_CHECKOUT_TIMEOUT)
            .connection_customizer(Box::new(Configure))
            .build(ConnectionManager::<DbConnection>::new(self.target.clone()))
            .map_err(|e| Error::Connect {
                url: self.masked(),
                source: Box::new(e),
            })
    }
}

/// Session settings applied to every new connection.
///
/// SQLite: WAL so readers never block the writer, `synchronous=NORMAL` (durable at
/// checkpoints, never corrupt), a busy timeout so that competing writers queue instead of
/// failing, and foreign keys on.
///
/// Switching a new file to WAL needs an exclusive lock and SQLite reports `database is locked`
/// at once, without consulting the busy timeout, when another process holds the file (five
/// `migrate`s at once on a new file): that is retried until the busy timeout.
fn configure(conn: &mut DbConnection) -> diesel::QueryResult<()> {
    let DbConnection::Sqlite(c) = conn else {
        return Ok(());
    };
    c.batch_execute(&format!(
        "PRAGMA busy_timeout = {};",
        SQLITE_BUSY_TIMEOUT.as_millis()
    ))?;
    let give_up = std::time::Instant::now() + SQLITE_BUSY_TIMEOUT;
    loop {
        match c.batch_execute("PRAGMA journal_mode = WAL;") {
            Err(diesel::result::Error::DatabaseError(_, info))
                if info.message().contains("locked") && std::time::Instant::now() < give_up =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => break other,
        }
    }?;
    c.batch_execute("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")
}

#[derive(Debug)]
struct Configure;

impl CustomizeConnection<DbConnection, diesel::r2d2::Error> for Configure {
    fn on_acquire(&self, conn: &mut DbConnection) -> std::result::Result<(), diesel::r2d2::Error> {
        configure(conn).map_err(diesel::r2d2::Error::QueryError)
    }
}

/// Runs `f` in a write transaction: `BEGIN IMMEDIATE` on SQLite (a deferred transaction that
/// later writes gets `SQLITE_BUSY` whatever the busy timeout), a plain `BEGIN` on PostgreSQL.
///
/// Commits when `f` returns `Ok`, rolls back when it returns `Err`. Inside `f`, nest with
/// `conn.transaction(…)`, which becomes a savepoint (not `immediate_transaction`, which cannot
/// nest). If `f` returns `Ok` while a nested transaction it opened is still open, nothing is
/// committed: everything rolls back and the error says so.
pub fn write_transaction<T, E, F>(conn: &mut DbConnection, f: F) -> std::result::Result<T, E>
where
    F: FnOnce(&mut DbConnection) -> std::result::Result<T, E>,
    E: From<diesel::result::Error>,
{
    let mut tx = TaskTx::new(conn);
    tx.conn()?;
    let result = f(tx.engine_conn());
    tx.finish(result)
}

/// The task's transaction, as a handler receives it: opened the first time the handler asks
/// for the connection, committed together with the task's completion.
///
/// [`TaskTx::conn`] opens the transaction (`BEGIN`; `BEGIN IMMEDIATE` on SQLite) and returns
/// the connection inside it: everything the handler writes through it commits with the
/// completion, or not at all. A handler that never calls it — one whose effects are all
/// outside the database, like the benchmark's no-op — costs no `BEGIN` and no `COMMIT` in
/// strict mode: its completion is one fenced `UPDATE` on its own, the same single commit in
/// one round trip instead of three. (In batched mode the chunk's completion always runs in a
/// transaction, so that it stays all or nothing: one `BEGIN` per chunk.)
///
/// ```no_run
/// use diesel::prelude::*;
/// use outbox::{HandlerResult, TaskContext, TaskTx};
///
/// fn touch(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
///     diesel::sql_query("UPDATE orders SET touched = TRUE WHERE id = $1")
///         .bind::<diesel::sql_types::BigInt, _>(task.id())
///         .execute(tx.conn()?)?;
///     Ok(())
/// }
/// ```
pub struct TaskTx<'c> {
    conn: &'c mut DbConnection,
    open: bool,
    /// Why the last `BEGIN` failed, when the database was at fault (unreachable, or SQLite's
    /// write lock still taken), not the task.
    unavailable: Option<String>,
}

impl<'c> TaskTx<'c> {
    /// A transaction not opened yet, on `conn`.
    pub(crate) fn new(conn: &'c mut DbConnection) -> Self {
        TaskTx {
            conn,
            open: false,
            unavailable: None,
        }
    }

    /// The connection inside the task's transaction, opening the transaction on first use.
    ///
    /// Fails when the transaction cannot be opened (the database is unreachable; on SQLite,
    /// another process holds the write lock past the busy timeout); returned with `?` from
    /// a handler, that is not counted as the task's failure.
    pub fn conn(&mut self) -> diesel::QueryResult<&mut DbConnection> {
        if !self.open {
            let begun = match &mut *self.conn {
                DbConnection::Sqlite(c) => {
                    AnsiTransactionManager::begin_transaction_sql(c, "BEGIN IMMEDIATE")
                }
                DbConnection::Pg(c) => AnsiTransactionManager::begin_transaction(c),
            };
            if let Err(e) = begun {
                // diesel does not mark a connection that failed at BEGIN; mark it, or the
                // pool would hand it out again.
                if is_connection_error(&e) {
                    mark_broken(self.conn);
                }
                self.unavailable = is_infrastructure(&e).then(|| e.to_string());
                return Err(e);
            }
            self.open = true;
            self.unavailable = None;
        }
        Ok(self.conn)
    }

    /// Whether the handler has opened the transaction.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// The connection as it is, in the transaction if the handler opened it, in autocommit
    /// otherwise: for the engine's own completion.
    pub(crate) fn engine_conn(&mut self) -> &mut DbConnection {
        self.conn
    }

    /// Why the last attempt to open the transaction failed, if it did because the database
    /// was unavailable.
    pub(crate) fn unavailable(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    /// Ends the transaction with `result`: commits an open one on `Ok` (rolls back instead,
    /// with an error, if a nested level was left open), rolls it back on `Err`. Nothing to do
    /// if it was never opened.
    pub(crate) fn finish<T, E>(
        &mut self,
        result: std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<diesel::result::Error>,
    {
        type Manager = <DbConnection as Connection>::TransactionManager;
        if !self.open {
            return result;
        }
        self.open = false;
        let conn = &mut *self.conn;
        let value = match result {
            Ok(value) => value,
            Err(e) => {
                roll_back_all(conn);
                return Err(e);
            }
        };
        match Manager::transaction_manager_status_mut(conn).transaction_depth() {
            Ok(Some(depth)) if depth.get() == 1 => {
                Manager::commit_transaction(conn)?;
                Ok(value)
            }
            Ok(depth) => {
                roll_back_all(conn);
                Err(diesel::result::Error::QueryBuilderError(
                    format!(
                        "a nested transaction was left open ({} levels deep); nothing was committed",
                        depth.map_or(0, |d| d.get())
                    )
                    .into(),
                )
                .into())
            }
            Err(e) => {
                roll_back_all(conn);
                Err(e.into())
            }
        }
    }
}

/// Whether a database error is the database's (unreachable, or SQLite's write lock still
/// taken after the busy timeout) rather than the task's.
pub(crate) fn is_infrastructure(error: &diesel::result::Error) -> bool {
    if is_connection_error(error) {
        return true;
    }
    match error {
        diesel::result::Error::DatabaseError(_, info) => {
            let message = info.message();
            message.contains("database is locked") || message.contains("database table is locked")
        }
        _ => false,
    }
}

/// Whether a diesel error says that the connection itself is gone (server restarted, backend
/// terminated, network cut) rather than that a statement failed.
pub(crate) fn is_connection_error(error: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind, Error};
    matches!(
        error,
        Error::DatabaseError(DatabaseErrorKind::ClosedConnection, _)
            | Error::DatabaseError(DatabaseErrorKind::UnableToSendCommand, _)
            | Error::BrokenTransactionManager
    )
}

/// Marks a pooled connection broken when a statement on it failed at the connection level.
///
/// diesel marks a connection broken only when a *transaction* on it fails; a single statement
/// that fails because its backend was terminated leaves it looking healthy, and the pool (which
/// does not ping on checkout, to save a round trip per task) would hand the dead connection out
/// again, forever. Marked, it is discarded when it goes back to the pool.
pub(crate) trait DiscardBroken {
    /// Marks `conn` broken if `self` is a connection-level error; returns `self` unchanged.
    fn discard_broken(self, conn: &mut DbConnection) -> Self;
}

impl<T> DiscardBroken for diesel::QueryResult<T> {
    fn discard_broken(self, conn: &mut DbConnection) -> Self {
        if let Err(e) = &self {
            if is_connection_error(e) {
                mark_broken(conn);
            }
        }
        self
    }
}

/// Marks `conn` broken: the pool discards it instead of handing it out again.
pub(crate) fn mark_broken(conn: &mut DbConnection) {
    type Manager = <DbConnection as Connection>::TransactionManager;
    Manager::transaction_manager_status_mut(conn).set_in_error();
}

/// Rolls back every open transaction level; on failure the connection is left marked broken
/// (the pool then discards it, and the server aborts a transaction whose connection went
/// away).
pub(crate) fn roll_back_all(conn: &mut DbConnection) {
    type Manager = <DbConnection as Connection>::TransactionManager;
    loop {
        match Manager::transaction_manager_status_mut(conn).transaction_depth() {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return,
        }
        if let Err(e) = Manager::rollback_transaction(conn) {
            log::warn!("rollback failed: {e}");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_schemes() {
        let pg = DatabaseUrl::parse("postgresql://u:p@h/db").unwrap();
        assert_eq!(pg.backend(), Backend::Postgres);
        assert_eq!(pg.masked(), "postgresql://u:***@h/db");
        let s = DatabaseUrl::parse("sqlite:///tmp/x.db").unwrap();
        assert_eq!(
            (s.backend(), s.target.as_str()),
            (Backend::Sqlite, "/tmp/x.db")
        );
        let s = DatabaseUrl::parse("sqlite:x.db").unwrap();
        assert_eq!(s.target, "x.db");
        let s = DatabaseUrl::parse("./data/outbox.db").unwrap();
        assert_eq!(s.target, "./data/outbox.db");
        for bad in [
            "",
            "  ",
            "mysql://h/db",
            "sqlite://",
            ":memory:",
            "sqlite::memory:",
        ] {
            assert!(
                matches!(
                    DatabaseUrl::parse(bad),
                    Err(Error::InvalidDatabaseUrl { .. })
                ),
                "{bad:?} must be refused"
            );
        }
    }
}
