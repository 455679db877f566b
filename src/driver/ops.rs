//! The operator's reads and bulk changes (`outbox list`, `show`, `retry` by filter, `nodes`,
//! `audit`): written once, with diesel's query builder on [`DbConnection`] and
//! `crate::schema`, but for the retry by filter, whose locking is each backend's (a trait of
//! its own, implemented in each backend's module beside its retry of one task).
//!
//! Times travel as UTC text of the shape `YYYY-MM-DD HH:MM:SS.SSS` on every backend, with
//! the database clock (`db_now`) in every row, so that ages are the database's.

use chrono::NaiveDateTime;
use diesel::dsl::count_star;
use diesel::prelude::*;
use diesel::query_builder::QueryFragment;
use diesel::sql_types::{HasSqlType, Integer, Text};
use diesel::QueryResult;

use super::clock::{db_ago, time_text, DbNow};
use super::dialect::JsonText;
use crate::db::{Backend, DbConnection};
use crate::schema::{async_audit, async_lease, async_node, async_task, async_task_parent};
use crate::sql::Statement;

pub(crate) use super::task_list_sql::{task_count_retryable, task_detail, task_list};
use crate::task::TaskState;

/// The `last_error` of a task cancelled while its handler may have been running (running, or
/// leased to a chunk): a retry runs it again, and the guide promises a `last_error` for every
/// run after the first but a crash's lost claim.
pub(crate) const CANCELLED_RUNNING: &str = "cancelled while running: its handler may have run";

/// Which tasks an operator's listing or bulk change applies to: every condition given must
/// hold (an empty `states`: any state).
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskSelect<'a> {
    pub states: &'a [TaskState],
    pub keyword: Option<&'a str>,
    pub tenant: Option<&'a str>,
    pub biz_id: Option<&'a str>,
    /// Created more than this long ago (database clock).
    pub older_than_ms: Option<i64>,
    /// Created at most this long ago (database clock).
    pub newer_than_ms: Option<i64>,
}

/// One page of a listing, by id.
#[derive(Debug, Clone, Copy)]
pub struct TaskPageAt {
    /// Only tasks after this id in the listing's order.
    pub after_id: Option<i64>,
    /// Descending ids (newest first) instead of ascending.
    pub newest_first: bool,
    pub limit: i64,
}

/// A task as a listing shows it (no payload).
#[derive(Debug, Clone)]
pub struct TaskListRow {
    pub db_now: String,
    pub id: i64,
    pub keyword: String,
    pub biz_id: String,
    pub tenant: Option<String>,
    pub state: String,
    pub failures: i32,
    pub max_attempts: Option<i32>,
    pub priority: i32,
    pub run_at: String,
    pub created_at: String,
    pub updated_at: String,
    pub finished_at: Option<String>,
    pub owner: Option<i64>,
    pub last_error: Option<String>,
}

/// Every column of a task.
#[derive(Debug, Clone)]
pub struct TaskDetailRow {
    pub list: TaskListRow,
    /// The payload as JSON text.
    pub biz_data: String,
    pub claim_token: i64,
    pub parent_id: Option<i64>,
    pub claimed_at: Option<String>,
    pub deadline_at: Option<String>,
    pub blocked_by: i32,
}

/// A task at the other end of a chain link.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = async_task)]
pub struct TaskLinkRow {
    pub id: i64,
    pub keyword: String,
    pub biz_id: String,
    pub state: String,
    pub last_error: Option<String>,
}

/// A row of `async_node`, with its running tasks counted.
#[derive(Debug, Clone)]
pub struct NodeRow {
    pub db_now: String,
    pub id: i64,
    pub name: String,
    /// `alive` or `gone`.
    pub state: String,
    pub started_at: String,
    pub heartbeat_at: String,
    pub running: i64,
}

/// A row of `async_audit`.
#[derive(Debug, Clone)]
pub struct AuditRow {
    pub id: i64,
    pub at: String,
    pub actor: String,
    pub action: String,
    pub target: String,
    /// A JSON object.
    pub detail: String,
    pub affected: i64,
}

/// The database operation of the operator's commands whose locking differs by backend (a
/// part of [`super::Driver`]).
pub trait OpsDriver {
    /// Puts every dead or cancelled task that `select` matches back to pending (blocked
    /// while a parent is not done), as [`super::Driver::task_retry`] does one, in one
    /// statement; returns how many. `select.states` is a subset of dead and cancelled
    /// (empty: both). A task one of whose parents was pruned is left as it is and not
    /// counted, as `task_retry` leaves it ([`task_count_retryable`] counts the others).
    fn task_retry_matching(&mut self, select: &TaskSelect<'_>) -> QueryResult<i64>;
}

/// The parents of the task `id` (`async_task_parent`), by id; a pruned parent is left out.
/// The same on every backend: written once, with the query builder.
pub(crate) fn task_parents(conn: &mut DbConnection, id: i64) -> QueryResult<Vec<TaskLinkRow>> {
    async_task_parent::table
        .inner_join(async_task::table.on(async_task::id.eq(async_task_parent::parent_id)))
        .filter(async_task_parent::child_id.eq(id))
        .order(async_task::id)
        .select(TaskLinkRow::as_select())
        .load(conn)
}

/// Up to `limit` children of the task `id`, by id, and how many it has in all. The same on
/// every backend: written once, with the query builder.
pub(crate) fn task_children(
    conn: &mut DbConnection,
    id: i64,
    limit: i64,
) -> QueryResult<(Vec<TaskLinkRow>, i64)> {
    let children = async_task_parent::table
        .inner_join(async_task::table.on(async_task::id.eq(async_task_parent::child_id)))
        .filter(async_task_parent::parent_id.eq(id))
        .order(async_task::id)
        .limit(limit)
        .select(TaskLinkRow::as_select())
        .load(conn)?;
    let total = async_task_parent::table
        .filter(async_task_parent::parent_id.eq(id))
        .count()
        .get_result(conn)?;
    Ok((children, total))
}

/// Up to `limit` nodes, most recent heartbeat first, with their running tasks counted (a
/// lock claim's leased tasks among them). The same on every backend: written once, with the
/// query builder.
pub(crate) fn node_list(conn: &mut DbConnection, limit: i64) -> QueryResult<Vec<NodeRow>> {
    let nodes: Vec<(
        NaiveDateTime,
        i64,
        String,
        String,
        NaiveDateTime,
        NaiveDateTime,
    )> = async_node::table
        .order((async_node::heartbeat_at.desc(), async_node::id.desc()))
        .limit(limit)
        .select((
            DbNow,
            async_node::id,
            async_node::name,
            async_node::state,
            async_node::started_at,
            async_node::heartbeat_at,
        ))
        .load(conn)?;
    let ids: Vec<i64> = nodes.iter().map(|n| n.1).collect();
    let mut running = async_task::table
        .filter(async_task::owner.eq_any(ids.clone()))
        .filter(async_task::state.eq(TaskState::Running.as_str()))
        .group_by(async_task::owner)
        .select((async_task::owner, count_star()))
        .into_boxed();
    if conn.backend() != Backend::Postgres {
        // SQLite and MySQL count through their lease index (every running task has a
        // deadline); PostgreSQL through the claim index, as before.
        running = running.filter(async_task::deadline_at.is_not_null());
    }
    let mut running: Vec<(Option<i64>, i64)> = running.load(conn)?;
    if conn.backend() != Backend::Sqlite {
        // Under lock claims a running chunk's tasks stay pending, each leased to its node.
        let leased: Vec<(i64, i64)> = async_lease::table
            .filter(async_lease::node_id.eq_any(ids))
            .group_by(async_lease::node_id)
            .select((async_lease::node_id, count_star()))
            .load(conn)?;
        running.extend(leased.into_iter().map(|(node, n)| (Some(node), n)));
    }
    Ok(nodes
        .into_iter()
        .map(
            |(db_now, id, name, state, started_at, heartbeat_at)| NodeRow {
                db_now: time_text(db_now),
                id,
                name,
                state,
                started_at: time_text(started_at),
                heartbeat_at: time_text(heartbeat_at),
                running: running
                    .iter()
                    .filter(|(owner, _)| *owner == Some(id))
                    .map(|(_, n)| *n)
                    .sum(),
            },
        )
        .collect())
}

diesel::define_sql_function! {
    /// `substr(text, start, length)`, the same on every backend.
    fn substr(text: Text, start: Integer, length: Integer) -> Text;
}

/// Up to `limit` rows of `async_audit`, newest first, before `before_id`, of the actions
/// equal to `action` or starting with `action` followed by a dot. Written once.
pub(crate) fn audit_list(
    conn: &mut DbConnection,
    action: Option<&str>,
    before_id: Option<i64>,
    limit: i64,
) -> QueryResult<Vec<AuditRow>> {
    let mut rows = async_audit::table.into_boxed();
    if let Some(action) = action {
        let len = i32::try_from(action.len() + 1).unwrap_or(i32::MAX);
        rows = rows.filter(
            async_audit::action
                .eq(action)
                .or(substr(async_audit::action, 1, len).eq(format!("{action}."))),
        );
    }
    if let Some(id) = before_id {
        rows = rows.filter(async_audit::id.lt(id));
    }
    let rows: Vec<(i64, NaiveDateTime, String, String, String, String, i64)> = rows
        .order(async_audit::id.desc())
        .limit(limit)
        .select((
            async_audit::id,
            async_audit::at,
            async_audit::actor,
            async_audit::action,
            async_audit::target,
            JsonText(async_audit::detail),
            async_audit::affected,
        ))
        .load(conn)?;
    Ok(rows
        .into_iter()
        .map(|r| AuditRow {
            id: r.0,
            at: time_text(r.1),
            actor: r.2,
            action: r.3,
            target: r.4,
            detail: r.5,
            affected: r.6,
        })
        .collect())
}

/// Appends `WHERE` and `select`'s conditions to a statement (the retries by filter).
pub(super) fn where_selected<DB>(
    mut statement: Statement<DB>,
    select: &TaskSelect<'_>,
) -> Statement<DB>
where
    DB: diesel::backend::Backend + HasSqlType<Text>,
    String: diesel::serialize::ToSql<Text, DB>,
    super::clock::DbAgo: QueryFragment<DB>,
{
    statement = statement.sql(" WHERE 1 = 1");
    if !select.states.is_empty() {
        statement = statement.sql(" AND state IN (");
        for (i, state) in select.states.iter().enumerate() {
            if i > 0 {
                statement = statement.sql(", ");
            }
            statement = statement.bind::<Text, _>(state.as_str().to_owned());
        }
        statement = statement.sql(")");
    }
    if let Some(keyword) = select.keyword {
        statement = statement
            .sql(" AND keyword = ")
            .bind::<Text, _>(keyword.to_owned());
    }
    if let Some(tenant) = select.tenant {
        statement = statement
            .sql(" AND tenant = ")
            .bind::<Text, _>(tenant.to_owned());
    }
    if let Some(biz_id) = select.biz_id {
        statement = statement
            .sql(" AND biz_id = ")
            .bind::<Text, _>(biz_id.to_owned());
    }
    if let Some(ms) = select.older_than_ms {
        statement = statement.sql(" AND created_at < ").expr(db_ago(ms));
    }
    if let Some(ms) = select.newer_than_ms {
        statement = statement.sql(" AND created_at >= ").expr(db_ago(ms));
    }
    statement
}

/// The condition that one of the parents of the task `async_task.id` was pruned: its link
/// (`async_task_parent`, kept when a dead or cancelled parent is pruned) names a task that is
/// gone. Such a task is never retried: the outcome it waited for is gone with its parent.
pub(super) const PARENT_PRUNED: &str = "EXISTS (SELECT 1 FROM async_task_parent l
     WHERE l.child_id = async_task.id
       AND NOT EXISTS (SELECT 1 FROM async_task p WHERE p.id = l.parent_id))";

/// The states a retry by filter takes: those of `select` (a subset of dead and cancelled),
/// or both.
///
/// Every backend's retry also gives the task a new claim token: a lock claim's lease taken
/// before a cancel names the old one, so that the chunk, whose handler may have seen the
/// cancel and skipped its work, cannot mark the retried task done.
pub(super) fn retry_states<'a>(select: &TaskSelect<'a>) -> TaskSelect<'a> {
    const RETRYABLE: [TaskState; 2] = [TaskState::Dead, TaskState::Cancelled];
    let mut select = *select;
    if select.states.is_empty() {
        select.states = &RETRYABLE;
    }
    debug_assert!(select.states.iter().all(|s| RETRYABLE.contains(s)));
    select
}
