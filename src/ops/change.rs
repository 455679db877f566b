//! Operators' changes of tasks, each audited in its own transaction: retry and cancel, of one
//! task or by filter.

use diesel::Connection;
use serde::Serialize;

use super::audit;
use super::Filter;
use crate::cancel::{self, Cancelled};
use crate::db::transaction::depth;
use crate::db::{write_transaction, DbConnection};
use crate::driver::driver;
use crate::driver::ops::task_count_retryable;
use crate::error::{Error, OpContext, Result};
use crate::retry::Retried;
use crate::task::TaskState;

/// What a change by filter did (or, in a dry run, would do).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Matched {
    /// The tasks the filter matched (in a dry run, those the change would take).
    pub matched: u64,
    /// The tasks changed: `matched`, or 0 in a dry run.
    pub changed: u64,
    /// The tasks the filter matched that the change leaves as they are, not counted in
    /// `matched`: in a retry, the dead or cancelled tasks one of whose parents was pruned
    /// (as [`retry_task`] leaves one); 0 in a cancel.
    pub skipped: u64,
    /// Whether this was a dry run (nothing written, nothing audited).
    pub dry_run: bool,
}

/// Runs `f` in a write transaction of its own, or in a savepoint when the caller has one
/// open: the change and its audit row commit together or not at all.
fn audited<T>(
    conn: &mut DbConnection,
    f: impl FnOnce(&mut DbConnection) -> Result<T>,
) -> Result<T> {
    if depth(conn) == Some(0) {
        write_transaction(conn, f)
    } else {
        conn.transaction(f)
    }
}

/// Puts the dead or cancelled task `id` back to pending as [`crate::retry()`] does, and
/// audits it as `actor`'s `task.retry` in the same transaction. A task in another state is
/// left as it is and nothing is audited.
///
/// Fails with [`Error::TaskNotFound`] when there is no such task.
///
/// ```no_run
/// # fn main() -> outbox::Result<()> {
/// let mut conn = outbox::DatabaseUrl::parse("app.db")?.connect()?;
/// let retried = outbox::ops::retry_task(&mut conn, 1234, "alice@web")?;
/// println!("task {} is {}", retried.id, retried.state);
/// # Ok(())
/// # }
/// ```
pub fn retry_task(conn: &mut DbConnection, id: i64, actor: &str) -> Result<Retried> {
    audited(conn, |conn| {
        let result = crate::retry::retry(conn, id)?;
        if result.retried {
            let target = id.to_string();
            let detail = serde_json::json!({"state": result.state.as_str()});
            audit::write(conn, actor, "task.retry", &target, &detail, 1)?;
        }
        Ok(result)
    })
}

/// Cancels the task `id` as [`crate::cancel()`] does, and audits it as `actor`'s
/// `task.cancel` in the same transaction. A finished task is left as it is and nothing is
/// audited.
///
/// Fails with [`Error::TaskNotFound`] when there is no such task.
pub fn cancel_task(conn: &mut DbConnection, id: i64, actor: &str) -> Result<Cancelled> {
    audited(conn, |conn| {
        let result = cancel::cancel(conn, id)?;
        if result.cancelled {
            let target = id.to_string();
            audit::write(
                conn,
                actor,
                "task.cancel",
                &target,
                &serde_json::json!({}),
                1,
            )?;
        }
        Ok(result)
    })
}

/// Cancels the task `(keyword, biz_id)` as [`crate::cancel_by_key`] does, audited as
/// [`cancel_task`] is.
pub fn cancel_task_by_key(
    conn: &mut DbConnection,
    keyword: &str,
    biz_id: &str,
    actor: &str,
) -> Result<Cancelled> {
    audited(conn, |conn| {
        let result = cancel::cancel_by_key(conn, keyword, biz_id)?;
        if result.cancelled {
            let target = result.id.to_string();
            let detail = serde_json::json!({"keyword": keyword, "biz_id": biz_id});
            audit::write(conn, actor, "task.cancel", &target, &detail, 1)?;
        }
        Ok(result)
    })
}

/// Cancels every pending, blocked or running task `filter` matches, as
/// [`crate::cancel_matching`] does, and audits it as `actor`'s `task.cancel` (the filter as
/// its target, the tasks cancelled as its rows) in the same transaction. With `dry_run`,
/// counts them and writes nothing. A change that cancels nothing is not audited.
pub fn cancel_matching(
    conn: &mut DbConnection,
    filter: &cancel::Filter,
    dry_run: bool,
    actor: &str,
) -> Result<Matched> {
    filter.validate()?;
    if dry_run {
        let n = cancel::count_matching(conn, filter)?;
        return Ok(dry(n));
    }
    audited(conn, |conn| {
        let n = cancel::cancel_matching(conn, filter)?;
        if n > 0 {
            let detail = serde_json::json!({"keyword": filter.keyword, "tenant": filter.tenant});
            let target = [("keyword", &filter.keyword), ("tenant", &filter.tenant)]
                .iter()
                .filter_map(|(name, value)| value.as_ref().map(|v| format!("{name}={v}")))
                .collect::<Vec<_>>()
                .join(" ");
            audit::write(conn, actor, "task.cancel", &target, &detail, n)?;
        }
        Ok(changed(n))
    })
}

/// Puts every dead or cancelled task `filter` matches back to pending, due now, with its
/// failures reset, as [`crate::retry()`] does one (a task with a parent that is not done
/// goes back to `blocked`; a parent retried along with its child is not done, so the child
/// waits for it), in one statement; and audits it as `actor`'s `task.retry` (the filter as
/// its target, the tasks retried as its rows) in the same transaction. With `dry_run`,
/// counts them and writes nothing. A change that retries nothing is not audited.
///
/// The same rule as [`crate::retry()`]'s holds: a task one of whose parents was pruned is
/// left as it is (the outcome it waited for is gone), counted in [`Matched::skipped`].
///
/// `filter.states` may name `dead`, `cancelled` or both (none: both); an empty filter
/// otherwise takes every dead and cancelled task. Refused, before anything is read, with
/// [`Error::InvalidConfig`] naming `state` when it names another state, and with the errors
/// of [`Filter::validate`].
///
/// ```no_run
/// use outbox::ops::{retry_matching, Filter};
/// use outbox::TaskState;
///
/// # fn main() -> outbox::Result<()> {
/// let mut conn = outbox::DatabaseUrl::parse("app.db")?.connect()?;
/// let filter = Filter::default().state(TaskState::Dead).keyword("mail.send");
/// let would = retry_matching(&mut conn, &filter, true, "alice@host")?;
/// if would.matched < 1000 {
///     retry_matching(&mut conn, &filter, false, "alice@host")?;
/// }
/// # Ok(())
/// # }
/// ```
pub fn retry_matching(
    conn: &mut DbConnection,
    filter: &Filter,
    dry_run: bool,
    actor: &str,
) -> Result<Matched> {
    validate_retry(filter)?;
    let select = filter.select()?;
    if dry_run {
        let n = task_count_retryable(conn, &select, true).op("task retry")?;
        let skipped = task_count_retryable(conn, &select, false).op("task retry")?;
        return Ok(Matched {
            skipped: u64::try_from(skipped).unwrap_or(0),
            ..dry(u64::try_from(n).unwrap_or(0))
        });
    }
    audited(conn, |conn| {
        // Counted first: a parent pruned meanwhile only makes a task skipped that the count
        // missed, never the other way round (a pruned parent does not come back).
        let skipped = task_count_retryable(conn, &select, false).op("task retry")?;
        let n = driver(conn).task_retry_matching(&select).op("task retry")?;
        let n = u64::try_from(n).unwrap_or(0);
        if n > 0 {
            let (target, detail) = filter.describe();
            audit::write(conn, actor, "task.retry", &target, &detail, n)?;
        }
        Ok(Matched {
            skipped: u64::try_from(skipped).unwrap_or(0),
            ..changed(n)
        })
    })
}

/// Checks a filter of [`retry_matching`] on its own: [`Filter::validate`], and states that
/// are dead or cancelled.
pub fn validate_retry(filter: &Filter) -> Result<()> {
    if let Some(state) = filter
        .states
        .iter()
        .find(|s| !matches!(s, TaskState::Dead | TaskState::Cancelled))
    {
        return Err(Error::InvalidConfig {
            setting: "state",
            reason: format!("of a retry must be dead or cancelled, not {state}"),
        });
    }
    filter.validate()
}

fn dry(matched: u64) -> Matched {
    Matched {
        matched,
        changed: 0,
        skipped: 0,
        dry_run: true,
    }
}

fn changed(n: u64) -> Matched {
    Matched {
        matched: n,
        changed: n,
        skipped: 0,
        dry_run: false,
    }
}
