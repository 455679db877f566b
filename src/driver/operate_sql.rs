//! Operators' changes that mean the same on every backend, and the audit that records them:
//! written once, with the query builder.

use diesel::prelude::*;

use super::clock::DbNow;
use super::dialect::{json_bind, on_backend, unfinished, Conn, MayRun};
use super::ops::CANCELLED_RUNNING;
use super::{AuditEntry, TaskFilter};
use crate::schema::{async_audit, async_task};
use crate::task::TaskState;

/// What a cancel sets: state `cancelled`, finished now, and on a task whose handler may be
/// running [`CANCELLED_RUNNING`] (first: MySQL's `SET` reads the columns it has set).
macro_rules! cancelled {
    () => {
        (
            async_task::last_error.eq(diesel::dsl::case_when(
                MayRun,
                CANCELLED_RUNNING
                    .into_sql::<diesel::sql_types::Text>()
                    .nullable(),
            )
            .otherwise(async_task::last_error)),
            async_task::state.eq(TaskState::Cancelled.as_str()),
            async_task::finished_at.eq(DbNow.nullable()),
            async_task::updated_at.eq(DbNow),
        )
    };
}

/// See [`super::Driver::task_cancel`]: one statement, whose trigger cancels the task's
/// descendants with it. (MySQL, which has no such trigger, cancels its own way.)
pub(super) fn task_cancel(conn: Conn<'_>, id: i64) -> QueryResult<usize> {
    on_backend!(conn, |c| diesel::update(async_task::table.find(id))
        .filter(unfinished())
        .set(cancelled!())
        .execute(c))
}

/// Writes one row of `async_audit`.
pub(super) fn audit_write(conn: Conn<'_>, audit: &AuditEntry<'_>) -> QueryResult<usize> {
    on_backend!(conn, |c| diesel::insert_into(async_audit::table)
        .values((
            async_audit::actor.eq(audit.actor),
            async_audit::action.eq(audit.action),
            async_audit::target.eq(audit.target),
            async_audit::detail.eq(json_bind(audit.detail)),
            async_audit::affected.eq(audit.affected),
        ))
        .execute(c))
}

/// See [`super::Driver::task_cancel_matching`]: one statement, whose trigger cancels the
/// tasks' descendants with them. (MySQL, which has no such trigger, cancels its own way.)
pub(super) fn task_cancel_matching(
    conn: Conn<'_>,
    filter: &TaskFilter<'_>,
    dry_run: bool,
) -> QueryResult<i64> {
    // The unfinished tasks of `filter`, of a boxed query or update.
    macro_rules! matching {
        ($tasks:expr) => {{
            let mut tasks = $tasks.filter(unfinished()).into_boxed();
            if let Some(keyword) = filter.keyword {
                tasks = tasks.filter(async_task::keyword.eq(keyword));
            }
            if let Some(tenant) = filter.tenant {
                tasks = tasks.filter(async_task::tenant.eq(tenant));
            }
            tasks
        }};
    }
    on_backend!(conn, |c| {
        if dry_run {
            return matching!(async_task::table).count().get_result(c);
        }
        let n = matching!(diesel::update(async_task::table))
            .set(cancelled!())
            .execute(c)?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    })
}
