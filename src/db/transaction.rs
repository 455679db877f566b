//! Write transactions, SQLite's writer turn, and how database errors are told apart.

use std::sync::{Mutex, MutexGuard, PoisonError};

use diesel::connection::TransactionManager;
use diesel::Connection;

use super::{Backend, DbConnection};
use crate::handler::TaskTx;

/// Runs `f` in a write transaction: `BEGIN IMMEDIATE` on SQLite (a deferred transaction that
/// later writes gets `SQLITE_BUSY` whatever the busy timeout), a plain `BEGIN` on PostgreSQL.
///
/// Commits when `f` returns `Ok`, rolls back when it returns `Err`. Inside `f`, nest with
/// `conn.transaction(…)`, which becomes a savepoint (not `immediate_transaction`, which cannot
/// nest). If `f` returns `Ok` while a nested transaction it opened is still open, nothing is
/// committed: everything rolls back and the error says so.
///
/// ```no_run
/// use diesel::prelude::*;
/// use outbox::{enqueue, write_transaction, NewTask};
///
/// # fn main() -> Result<(), outbox::Error> {
/// let mut conn = outbox::DatabaseUrl::parse("app.db")?.connect()?;
/// write_transaction(&mut conn, |conn| {
///     diesel::sql_query("UPDATE orders SET paid = 1 WHERE id = 42").execute(conn)?;
///     enqueue(conn, &NewTask::new("points.credit", "42"))
/// })?;
/// # Ok(())
/// # }
/// ```
pub fn write_transaction<T, E, F>(conn: &mut DbConnection, f: F) -> std::result::Result<T, E>
where
    F: FnOnce(&mut DbConnection) -> std::result::Result<T, E>,
    E: From<diesel::result::Error>,
{
    write_transaction_marked(conn, None, f)
}

/// [`write_transaction`], the transaction marked `mark` (PostgreSQL; see
/// [`crate::driver::Driver::transaction_begin`]): an engine's own, which a rescue pass ends
/// if its node dies inside it.
pub(crate) fn write_transaction_marked<T, E, F>(
    conn: &mut DbConnection,
    mark: Option<crate::driver::TxMark>,
    f: F,
) -> std::result::Result<T, E>
where
    F: FnOnce(&mut DbConnection) -> std::result::Result<T, E>,
    E: From<diesel::result::Error>,
{
    let mut tx = TaskTx::new(conn, None).marked(mark);
    tx.conn()?;
    let result = f(tx.engine_conn());
    tx.finish(result)
}

/// On SQLite, the turn of this process's writers: one write transaction at a time.
///
/// SQLite has one writer at a time. Threads of one process that collide on its lock are put
/// to sleep by SQLite's busy handler (1, 2, 5, 10… ms) instead of being handed the lock when
/// it frees, which slows a drain several times over (`docs/notes/performance.md`). Taking turns on
/// a mutex first hands the lock over at once; the busy timeout still arbitrates between
/// processes. The turn is held only while a write transaction is open (or an engine write
/// runs), never while a handler works outside the database, so such handlers run at once on
/// every thread.
#[derive(Debug, Default)]
pub(crate) struct WriterTurn(Option<Mutex<()>>);

impl WriterTurn {
    /// A turn for `backend`: a mutex on SQLite, nothing to wait for on PostgreSQL.
    pub(crate) fn for_backend(backend: Backend) -> Self {
        WriterTurn((backend == Backend::Sqlite).then(|| Mutex::new(())))
    }

    /// Waits for this process's turn to write; `None` (no waiting) on PostgreSQL.
    pub(crate) fn take(&self) -> Option<MutexGuard<'_, ()>> {
        self.0
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Whether a database error is the database's (unreachable, SQLite's write lock still taken
/// after the busy timeout, or InnoDB's lock conflicts) rather than the task's.
///
/// InnoDB ends a transaction it picks as a deadlock's victim (1213) or that waited
/// `innodb_lock_wait_timeout` for a row (1205), and asks the application to run it again:
/// the engine's choice, not the task's failure, as SQLite's `database is locked` is not.
pub(crate) fn is_infrastructure(error: &diesel::result::Error) -> bool {
    if is_connection_error(error) {
        return true;
    }
    match error {
        diesel::result::Error::DatabaseError(_, info) => {
            let message = info.message();
            message.contains("database is locked")
                || message.contains("database table is locked")
                || message.starts_with("Deadlock found when trying to get lock")
                || message.starts_with("Lock wait timeout exceeded")
        }
        _ => false,
    }
}

/// Whether a database error is a deadlock's: the statement or transaction was the victim
/// the server chose (PostgreSQL's 40P01, InnoDB's 1213), and was rolled back; run again, it
/// may pass.
pub(crate) fn is_deadlock(error: &diesel::result::Error) -> bool {
    match error {
        diesel::result::Error::DatabaseError(_, info) => {
            let message = info.message();
            message.starts_with("deadlock detected")
                || message.starts_with("Deadlock found when trying to get lock")
        }
        _ => false,
    }
}

/// Whether a diesel error says that the connection itself is gone (server restarted, backend
/// terminated, network cut) rather than that a statement failed.
pub(crate) fn is_connection_error(error: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind, Error};
    match error {
        Error::DatabaseError(DatabaseErrorKind::ClosedConnection, _)
        | Error::DatabaseError(DatabaseErrorKind::UnableToSendCommand, _)
        | Error::BrokenTransactionManager => true,
        // A COMMIT that failed, then its ROLLBACK: the COMMIT's error tells.
        Error::RollbackErrorOnCommit { commit_error, .. } => is_connection_error(commit_error),
        // PostgreSQL's FATAL errors that end the session (SQLSTATE 57P01 and its kin:
        // `pg_terminate_backend`, a shutdown, an idle-session timeout), which diesel reports
        // with no kind of their own. Matched by their message (the server's `lc_messages`
        // must be English for it; otherwise the dead connection is found at its next use).
        Error::DatabaseError(_, info) => is_connection_lost_message(info.message()),
        _ => false,
    }
}

/// Whether a server's or client library's message says the session is gone. Matched on the
/// messages' exact openings, so that an error that merely quotes such words (a key in a
/// duplicate-key error, a trigger's own message) is not taken for one.
fn is_connection_lost_message(message: &str) -> bool {
    const LOST: &[&str] = &[
        // PostgreSQL's (57P01 and its kin).
        "terminating connection",
        // MySQL's and MariaDB's client libraries (they word them apart): the server closed
        // the connection (2006: a restart, `wait_timeout`), it broke during a statement
        // (2013), `KILL CONNECTION` ended it (MariaDB's 1927; MySQL 8's 4031 when idle).
        "MySQL server has gone away",
        "Server has gone away",
        "Lost connection to MySQL server",
        "Lost connection to server",
        "Connection was killed",
        "The client was disconnected by the server",
    ];
    LOST.iter().any(|opening| message.starts_with(opening))
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

/// Whether `conn` is marked broken (diesel marks a connection whose transaction failed at the
/// connection level; [`mark_broken`] the rest).
pub(crate) fn is_broken(conn: &mut DbConnection) -> bool {
    <DbConnection as Connection>::TransactionManager::is_broken_transaction_manager(conn)
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

/// How many transaction levels are open on `conn` (0: autocommit; `None`: the connection
/// is broken).
pub(crate) fn depth(conn: &mut DbConnection) -> Option<u32> {
    depth_of(conn)
}

/// [`depth`] for any connection.
pub(crate) fn depth_of<C: Connection>(conn: &mut C) -> Option<u32> {
    C::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .ok()
        .map(|d| d.map_or(0, |d| d.get()))
}

#[cfg(test)]
mod tests {
    use diesel::result::{DatabaseErrorKind, Error};

    use super::{is_connection_error, is_infrastructure};

    fn unknown(message: &str) -> Error {
        Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message.to_owned()))
    }

    #[test]
    fn a_lost_session_is_told_by_each_servers_and_client_librarys_wording() {
        for message in [
            "terminating connection due to administrator command",
            "MySQL server has gone away",
            "Server has gone away",
            "Lost connection to MySQL server during query",
            "Lost connection to server during query",
            "Connection was killed",
            "The client was disconnected by the server because of inactivity.",
        ] {
            assert!(is_connection_error(&unknown(message)), "{message}");
        }
    }

    /// A COMMIT whose connection was lost, then its ROLLBACK on the same connection: diesel
    /// reports both, and the COMMIT's error tells.
    #[test]
    fn a_commit_lost_with_its_connection_is_a_lost_session() {
        let commit = |message: &str| Error::RollbackErrorOnCommit {
            rollback_error: Box::new(unknown("Server has gone away")),
            commit_error: Box::new(unknown(message)),
        };
        assert!(is_connection_error(&commit("Server has gone away")));
        assert!(!is_connection_error(&commit(
            "could not serialize access due to read/write dependencies among transactions"
        )));
    }

    #[test]
    fn a_failed_statement_is_not_a_lost_session() {
        for message in [
            "Deadlock found when trying to get lock; try restarting transaction",
            "Duplicate entry 'a-1' for key 'async_task_keyword_biz_id_key'",
            "Duplicate entry 'server has gone away' for key 'async_task_key'",
            "Lost connection to the payment API",
            "relation \"async_task\" does not exist",
        ] {
            assert!(!is_connection_error(&unknown(message)), "{message}");
        }
    }

    #[test]
    fn innodbs_lock_conflicts_are_the_databases_not_the_tasks() {
        for message in [
            "Deadlock found when trying to get lock; try restarting transaction",
            "Lock wait timeout exceeded; try restarting transaction",
            "database is locked",
            "Server has gone away",
        ] {
            assert!(is_infrastructure(&unknown(message)), "{message}");
        }
        for message in [
            "Duplicate entry 'a-1' for key 'async_task_key'",
            "the handler said: Deadlock found when trying to get lock",
        ] {
            assert!(!is_infrastructure(&unknown(message)), "{message}");
        }
    }
}
