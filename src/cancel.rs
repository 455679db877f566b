//! Cancel: a task that should no longer run, in the caller's own transaction.

use crate::driver::Driver;
use crate::enqueue::EnqueueConnection;
use crate::error::{Error, OpContext, Result};
use crate::task::TaskState;

/// What a cancel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Cancelled {
    /// The task's id.
    pub id: i64,
    /// `true` when this call cancelled the task; `false` when it had already finished (done,
    /// dead or cancelled), in which case nothing was written.
    pub cancelled: bool,
    /// The task's state now: `cancelled`, or the finished state it already had.
    pub state: TaskState,
}

/// Cancels the task `id` in the caller's transaction (or on its own, in autocommit): a
/// `pending`, `blocked` or `running` task becomes `cancelled` at once and is never claimed
/// again. A running handler may still be running; its completion is fenced out, so its
/// in-database effects roll back with its transaction. Under lock claims a task in a chunk
/// that is running is still `pending` and locked: the cancel waits for the chunk's
/// transaction to end and then finds the task done (a chunk is short).
///
/// Fails with [`Error::TaskNotFound`] when there is no such task.
///
/// ```no_run
/// # use diesel::prelude::*;
/// # fn cancel_order(conn: &mut PgConnection, order: i64) -> anyhow::Result<()> {
/// conn.transaction(|conn| -> anyhow::Result<()> {
///     diesel::sql_query("UPDATE orders SET status = 'cancelled' WHERE id = $1")
///         .bind::<diesel::sql_types::BigInt, _>(order)
///         .execute(conn)?;
///     // Its coupon must not be granted: cancelled with the order, or not at all.
///     outbox::cancel_by_key(conn, "coupon.grant", &order.to_string())?;
///     Ok(())
/// })
/// # }
/// ```
pub fn cancel<C: EnqueueConnection + ?Sized>(conn: &mut C, id: i64) -> Result<Cancelled> {
    cancel_id(conn.driver(), id, || format!("{id}"))
}

/// Cancels the task `(keyword, biz_id)`: see [`cancel`].
pub fn cancel_by_key<C: EnqueueConnection + ?Sized>(
    conn: &mut C,
    keyword: &str,
    biz_id: &str,
) -> Result<Cancelled> {
    let driver = conn.driver();
    let task = driver
        .task_get_by_key(keyword, biz_id)
        .op("task cancel")?
        .ok_or_else(|| Error::TaskNotFound {
            task: format!("{keyword} {biz_id}"),
        })?;
    cancel_id(driver, task.id, || format!("{keyword} {biz_id}"))
}

fn cancel_id(driver: &mut dyn Driver, id: i64, name: impl Fn() -> String) -> Result<Cancelled> {
    if driver.task_cancel(id).op("task cancel")? == 1 {
        return Ok(Cancelled {
            id,
            cancelled: true,
            state: TaskState::Cancelled,
        });
    }
    let now = driver
        .task_get_claim(id)
        .op("task cancel")?
        .ok_or_else(|| Error::TaskNotFound { task: name() })?;
    let state = now
        .state
        .parse::<TaskState>()
        .map_err(|e| Error::Database {
            operation: "task cancel",
            source: diesel::result::Error::DeserializationError(e.into()),
        })?;
    Ok(Cancelled {
        id,
        cancelled: false,
        state,
    })
}
