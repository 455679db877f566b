//! Cancel: tasks that should no longer run, in the caller's own transaction: one by id or
//! key, or every unfinished task of a keyword or tenant.

use crate::driver::{Driver, TaskFilter};
use crate::enqueue::EnqueueConnection;
use crate::error::{Error, OpContext, Result};
use crate::task::{validate_keyword, TaskState};

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
/// that is running is still `pending`, leased, its row not locked: the cancel does not wait
/// for the chunk, whose completion it fences out.
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
    let state = state_of(driver, id, "task cancel", name)?;
    Ok(Cancelled {
        id,
        cancelled: false,
        state,
    })
}

/// The state of the task `id` now, for a change that found it in another state than it
/// changes; [`Error::TaskNotFound`] (named by `name`) when there is none.
pub(crate) fn state_of(
    driver: &mut dyn Driver,
    id: i64,
    operation: &'static str,
    name: impl Fn() -> String,
) -> Result<TaskState> {
    let now = driver
        .task_get_claim(id)
        .op(operation)?
        .ok_or_else(|| Error::TaskNotFound { task: name() })?;
    now.state.parse::<TaskState>().map_err(|e| Error::Database {
        operation,
        source: diesel::result::Error::DeserializationError(e.into()),
    })
}

/// Which unfinished tasks [`cancel_matching`] cancels: every condition given must hold, and
/// at least one must be given.
///
/// ```
/// let filter = outbox::cancel::Filter::default().keyword("coupon.grant").tenant("shop-eu");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Filter {
    /// Tasks of this keyword.
    pub keyword: Option<String>,
    /// Tasks of this tenant.
    pub tenant: Option<String>,
}

impl Filter {
    /// Only tasks of `keyword`.
    pub fn keyword(mut self, keyword: impl Into<String>) -> Self {
        self.keyword = Some(keyword.into());
        self
    }

    /// Only tasks of `tenant`.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    pub(crate) fn validate(&self) -> Result<TaskFilter<'_>> {
        if self.keyword.is_none() && self.tenant.is_none() {
            return Err(Error::InvalidConfig {
                setting: "filter",
                reason: "must name a keyword or a tenant (or both)".into(),
            });
        }
        if let Some(keyword) = &self.keyword {
            validate_keyword(keyword)?;
        }
        if let Some(tenant) = &self.tenant {
            crate::tenant::validate_name(tenant)?;
        }
        Ok(TaskFilter {
            keyword: self.keyword.as_deref(),
            tenant: self.tenant.as_deref(),
        })
    }
}

/// Cancels every pending, blocked or running task that `filter` matches, in one statement in
/// the caller's transaction, as [`cancel`] does one; returns how many it cancelled.
pub fn cancel_matching<C: EnqueueConnection + ?Sized>(
    conn: &mut C,
    filter: &Filter,
) -> Result<u64> {
    count_or_cancel(conn, filter, false)
}

/// How many tasks [`cancel_matching`] would cancel now; writes nothing.
pub fn count_matching<C: EnqueueConnection + ?Sized>(conn: &mut C, filter: &Filter) -> Result<u64> {
    count_or_cancel(conn, filter, true)
}

fn count_or_cancel<C: EnqueueConnection + ?Sized>(
    conn: &mut C,
    filter: &Filter,
    dry_run: bool,
) -> Result<u64> {
    let filter = filter.validate()?;
    let n = conn
        .driver()
        .task_cancel_matching(&filter, dry_run)
        .op("task cancel")?;
    Ok(u64::try_from(n).unwrap_or(0))
}
