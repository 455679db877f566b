//! The task's transaction, opened on the handler's first use.

use std::sync::MutexGuard;

use diesel::connection::TransactionManager;
use diesel::Connection;

use crate::db::transaction::{
    depth, is_connection_error, is_infrastructure, mark_broken, roll_back_all, WriterTurn,
};
use crate::db::DbConnection;
use crate::driver::driver;

/// The task's transaction, as a handler receives it: opened the first time the handler asks
/// for the connection, committed together with the task's completion.
///
/// [`TaskTx::conn`] opens the transaction (`BEGIN`; `BEGIN IMMEDIATE` on SQLite) and returns
/// the connection inside it: everything the handler writes through it commits with the
/// completion, or not at all. A handler that never calls it — one whose effects are all
/// outside the database — costs no `BEGIN` and no `COMMIT` in strict mode: its completion is
/// one fenced `UPDATE` on its own, the same single commit in one round trip instead of three.
/// (In batched mode the chunk's completion always runs in a transaction, so that it stays all
/// or nothing: one `BEGIN` per chunk.)
///
/// On SQLite, which has one writer at a time, the worker's threads take turns to write: a
/// task holds the turn from its first `tx.conn()` to its commit, so keep what a handler does
/// after that call short; handlers that never call it run side by side on every thread.
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
    /// This process's writer turn (SQLite), taken while the transaction is open.
    turn: Option<&'c WriterTurn>,
    held: Option<MutexGuard<'c, ()>>,
    open: bool,
    /// Why the last `BEGIN` failed, when the database was at fault (unreachable, or SQLite's
    /// write lock still taken), not the task.
    unavailable: Option<String>,
    /// What marks the transaction (PostgreSQL), by which the engine can end it.
    mark: Option<crate::driver::TxMark>,
}

impl<'c> TaskTx<'c> {
    /// A transaction not opened yet, on `conn`; opening it takes `turn` first.
    pub(crate) fn new(conn: &'c mut DbConnection, turn: Option<&'c WriterTurn>) -> Self {
        TaskTx {
            conn,
            turn,
            held: None,
            open: false,
            unavailable: None,
            mark: None,
        }
    }

    /// The transaction, once opened, is marked `mark` (PostgreSQL; see
    /// [`crate::driver::Driver::transaction_begin`]).
    pub(crate) fn marked(mut self, mark: Option<crate::driver::TxMark>) -> Self {
        self.mark = mark;
        self
    }

    /// The transaction already open on `conn` (a leased chunk's, opened with the chunk's
    /// mark): the handlers run inside it.
    pub(crate) fn opened(conn: &'c mut DbConnection) -> Self {
        TaskTx {
            conn,
            turn: None,
            held: None,
            open: true,
            unavailable: None,
            mark: None,
        }
    }

    /// The connection inside the task's transaction, opening the transaction on first use.
    ///
    /// Fails when the transaction cannot be opened (the database is unreachable; on SQLite,
    /// another process holds the write lock past the busy timeout); returned with `?` from
    /// a handler, that is not counted as the task's failure.
    pub fn conn(&mut self) -> diesel::QueryResult<&mut DbConnection> {
        if !self.open {
            self.held = self.turn.and_then(WriterTurn::take);
            if let Err(e) = driver(self.conn).transaction_begin(self.mark) {
                self.held = None;
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
        self.intact()?;
        Ok(self.conn)
    }

    /// Fails when the server rolled the open transaction back under the handler (MySQL: a
    /// deadlock's victim, whose error the handler did not return): what ran after that ran
    /// in autocommit, so the task must not complete as if its transaction held.
    pub(crate) fn intact(&mut self) -> diesel::QueryResult<()> {
        if self.open && crate::db::reply::transaction_rolled_back(self.conn) {
            return Err(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::SerializationFailure,
                Box::new(
                    "Deadlock found when trying to get lock: the server rolled the task's \
                     transaction back under its handler, which went on"
                        .to_owned(),
                ),
            ));
        }
        Ok(())
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
    /// with an error, if a nested level was left open), rolls it back on `Err`; then gives the
    /// writer turn back. Nothing to do if it was never opened.
    pub(crate) fn finish<T, E>(
        &mut self,
        result: std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<diesel::result::Error>,
    {
        if !self.open {
            return result;
        }
        self.open = false;
        let ended = end(self.conn, result);
        self.held = None;
        ended
    }
}

/// Commits (`Ok`, one level open) or rolls back every level of `conn`'s transaction.
fn end<T, E>(
    conn: &mut DbConnection,
    result: std::result::Result<T, E>,
) -> std::result::Result<T, E>
where
    E: From<diesel::result::Error>,
{
    type Manager = <DbConnection as Connection>::TransactionManager;
    let value = match result {
        Ok(value) => value,
        Err(e) => {
            roll_back_all(conn);
            return Err(e);
        }
    };
    match depth(conn) {
        Some(1) => {
            Manager::commit_transaction(conn)?;
            Ok(value)
        }
        Some(levels) => {
            roll_back_all(conn);
            Err(diesel::result::Error::QueryBuilderError(
                format!(
                    "a nested transaction was left open ({levels} levels deep); nothing was committed"
                )
                .into(),
            )
            .into())
        }
        None => {
            roll_back_all(conn);
            Err(diesel::result::Error::BrokenTransactionManager.into())
        }
    }
}
