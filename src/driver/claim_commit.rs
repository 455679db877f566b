//! A claim's COMMIT that fails: the server may have committed it, and the reply be what was
//! lost (a failover, a cut link, a proxy that dropped the connection). The claim's rows are
//! then handed to the caller with the error ([`Picked::unconfirmed`]), so that it can give
//! them back, fenced by their tokens, instead of leaving them claimed (`running`, or leased)
//! until their deadline and rescue's charge.

use diesel::connection::{AnsiTransactionManager, Connection, TransactionManager};
use diesel::QueryResult;

use super::Picked;

/// What a claim's transaction returns when its COMMIT fails: its rows, unconfirmed.
pub(super) trait CommitUnknown: Sized {
    fn picked(&mut self) -> &mut Picked;

    fn commit_failed(mut self, error: diesel::result::Error) -> QueryResult<Self> {
        self.picked().unconfirmed = Some(error);
        Ok(self)
    }
}

impl CommitUnknown for Picked {
    fn picked(&mut self) -> &mut Picked {
        self
    }
}

/// A lease claim's page and its tasks' chunks.
impl CommitUnknown for (Picked, Vec<i64>) {
    fn picked(&mut self) -> &mut Picked {
        &mut self.0
    }
}

/// Runs the claim `f` in a transaction (a savepoint inside an open one) whose failed COMMIT
/// gives its rows back unconfirmed; as [`Connection::transaction`] otherwise.
#[cfg(feature = "mysql")]
pub(super) fn claim_transaction<C, T>(
    conn: &mut C,
    f: impl FnOnce(&mut C) -> QueryResult<T>,
) -> QueryResult<T>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
    T: CommitUnknown,
{
    AnsiTransactionManager::begin_transaction(conn)?;
    let claimed = f(conn);
    finish(conn, claimed, T::commit_failed)
}

/// Ends the open transaction after `result`: commits it after a value (`commit_failed` is
/// given the value and the error when the COMMIT fails), rolls it back after an error.
pub(super) fn finish<C, T>(
    conn: &mut C,
    result: QueryResult<T>,
    commit_failed: impl FnOnce(T, diesel::result::Error) -> QueryResult<T>,
) -> QueryResult<T>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    match result {
        Ok(value) => match AnsiTransactionManager::commit_transaction(conn) {
            Ok(()) => Ok(value),
            Err(error) => commit_failed(value, error),
        },
        Err(error) => match AnsiTransactionManager::rollback_transaction(conn) {
            Ok(()) | Err(diesel::result::Error::BrokenTransactionManager) => Err(error),
            Err(rollback) => Err(rollback),
        },
    }
}
