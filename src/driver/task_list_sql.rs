//! The operator's listing of tasks (`outbox list`, `show`, the count of a retry by filter):
//! written once, with the query builder on [`DbConnection`].

use chrono::NaiveDateTime;
use diesel::prelude::*;
use diesel::sql_types::Bool;

use super::clock::{db_ago, time_text, DbNow};
use super::dialect::JsonText;
use super::ops::{retry_states, TaskDetailRow, TaskListRow, TaskPageAt, TaskSelect, PARENT_PRUNED};
use crate::db::DbConnection;
use crate::schema::async_task;

use super::dialect::DbBackend;

/// The tasks that `select` matches, as a query to go on with.
fn tasks_selected<'a>(select: &TaskSelect<'a>) -> async_task::BoxedQuery<'a, DbBackend> {
    let mut tasks = async_task::table.into_boxed();
    if !select.states.is_empty() {
        tasks = tasks.filter(async_task::state.eq_any(select.states.iter().map(|s| s.as_str())));
    }
    if let Some(keyword) = select.keyword {
        tasks = tasks.filter(async_task::keyword.eq(keyword));
    }
    if let Some(tenant) = select.tenant {
        tasks = tasks.filter(async_task::tenant.eq(tenant));
    }
    if let Some(biz_id) = select.biz_id {
        tasks = tasks.filter(async_task::biz_id.eq(biz_id));
    }
    if let Some(ms) = select.older_than_ms {
        tasks = tasks.filter(async_task::created_at.lt(db_ago(ms)));
    }
    if let Some(ms) = select.newer_than_ms {
        tasks = tasks.filter(async_task::created_at.ge(db_ago(ms)));
    }
    tasks
}

/// The columns of a [`TaskListRow`], as [`list_row`] takes them.
macro_rules! list_columns {
    () => {
        (
            DbNow,
            async_task::id,
            async_task::keyword,
            async_task::biz_id,
            async_task::tenant,
            async_task::state,
            async_task::failures,
            async_task::max_attempts,
            async_task::priority,
            async_task::run_at,
            async_task::created_at,
            async_task::updated_at,
            async_task::finished_at,
            async_task::owner,
            async_task::last_error,
        )
    };
}

/// A [`TaskListRow`] as loaded by [`list_columns`].
type ListTuple = (
    NaiveDateTime,
    i64,
    String,
    String,
    Option<String>,
    String,
    i32,
    Option<i32>,
    i16,
    NaiveDateTime,
    NaiveDateTime,
    NaiveDateTime,
    Option<NaiveDateTime>,
    Option<i64>,
    Option<String>,
);

fn list_row(t: ListTuple) -> TaskListRow {
    TaskListRow {
        db_now: time_text(t.0),
        id: t.1,
        keyword: t.2,
        biz_id: t.3,
        tenant: t.4,
        state: t.5,
        failures: t.6,
        max_attempts: t.7,
        priority: i32::from(t.8),
        run_at: time_text(t.9),
        created_at: time_text(t.10),
        updated_at: time_text(t.11),
        finished_at: t.12.map(time_text),
        owner: t.13,
        last_error: t.14,
    }
}

/// Up to `page.limit` tasks that `select` matches, in id order from `page.after_id`.
/// Written once, with the query builder.
pub(crate) fn task_list(
    conn: &mut DbConnection,
    select: &TaskSelect<'_>,
    page: &TaskPageAt,
) -> QueryResult<Vec<TaskListRow>> {
    let mut tasks = tasks_selected(select);
    tasks = match (page.after_id, page.newest_first) {
        (Some(id), false) => tasks.filter(async_task::id.gt(id)),
        (Some(id), true) => tasks.filter(async_task::id.lt(id)),
        (None, _) => tasks,
    };
    tasks = if page.newest_first {
        tasks.order(async_task::id.desc())
    } else {
        tasks.order(async_task::id)
    };
    let rows: Vec<ListTuple> = tasks.limit(page.limit).select(list_columns!()).load(conn)?;
    Ok(rows.into_iter().map(list_row).collect())
}

/// Every column of the task `id` (`None`: no such task). Written once.
pub(crate) fn task_detail(conn: &mut DbConnection, id: i64) -> QueryResult<Option<TaskDetailRow>> {
    type Rest = (
        String,
        i64,
        Option<i64>,
        Option<NaiveDateTime>,
        Option<NaiveDateTime>,
        i32,
    );
    let row: Option<(ListTuple, Rest)> = async_task::table
        .filter(async_task::id.eq(id))
        .select((
            list_columns!(),
            (
                JsonText(async_task::biz_data),
                async_task::claim_token,
                async_task::parent_id,
                async_task::claimed_at,
                async_task::deadline_at,
                async_task::blocked_by,
            ),
        ))
        .get_result(conn)
        .optional()?;
    Ok(row.map(|(list, rest)| TaskDetailRow {
        list: list_row(list),
        biz_data: rest.0,
        claim_token: rest.1,
        parent_id: rest.2,
        claimed_at: rest.3.map(time_text),
        deadline_at: rest.4.map(time_text),
        blocked_by: rest.5,
    }))
}

/// How many of the dead or cancelled tasks that `select` matches
/// [`super::ops::OpsDriver::task_retry_matching`] retries now (`retryable`), or leaves as they are,
/// one of their parents pruned (not `retryable`). Written once.
pub(crate) fn task_count_retryable(
    conn: &mut DbConnection,
    select: &TaskSelect<'_>,
    retryable: bool,
) -> QueryResult<i64> {
    let pruned = diesel::dsl::sql::<Bool>(PARENT_PRUNED);
    let tasks = tasks_selected(&retry_states(select));
    let tasks = if retryable {
        tasks.filter(diesel::dsl::not(pruned))
    } else {
        tasks.filter(pruned)
    };
    tasks.count().get_result(conn)
}
