//! Task statements that every backend writes alike, built here once and run by each
//! backend's driver.

use diesel::backend::Backend;
use diesel::query_builder::QueryFragment;
use diesel::sql_types::{BigInt, HasSqlType};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::sql_types::{Double, Integer};

use super::RescueParams;
use crate::sql::Statement;

use chrono::NaiveDateTime;
use diesel::dsl::{count_star, min};
use diesel::prelude::*;

use super::clock::{db_ago, DbAgo, DbNow};
use super::dialect::{on_backend, pending, Conn, JsonText};
use super::{Claim, ClaimState, KeywordStateCount, TaskRecord};
use crate::schema::async_task;
use crate::task::TaskState;

/// See [`super::Driver::task_get_claim`].
pub(super) fn task_get_claim(conn: Conn<'_>, id: i64) -> QueryResult<Option<ClaimState>> {
    on_backend!(conn, |c| async_task::table
        .find(id)
        .select((
            async_task::state,
            async_task::owner,
            async_task::claim_token
        ))
        .get_result(c)
        .optional())
}

/// Appends that a running task's claim, or a lease, has lapsed: its `deadline` (a column)
/// passed, or its node (the column `node`) is not a live node, one whose heartbeat came
/// within `rescue.dead_after_ms`, by the database clock. The rescuing node is live to itself
/// whatever its heartbeat says, while its row is alive: an outage of its own may have kept
/// its beats out, and its tasks are in its hands (the others judge it by the database clock
/// alone).
pub(super) fn lapsed<DB>(
    statement: Statement<DB>,
    (deadline, node): (&'static str, &'static str),
    rescue: &RescueParams,
) -> Statement<DB>
where
    DB: Backend + HasSqlType<BigInt>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
    DbNow: QueryFragment<DB>,
    DbAgo: QueryFragment<DB>,
{
    statement
        .sql("(")
        .sql(deadline)
        .sql(" < ")
        .expr(DbNow)
        .sql(" OR NOT EXISTS (SELECT 1 FROM async_node n WHERE n.id = ")
        .sql(node)
        .sql(" AND n.state = 'alive' AND (n.heartbeat_at >= ")
        .expr(db_ago(rescue.dead_after_ms))
        .sql(" OR n.id = ")
        .bind::<BigInt, _>(rescue.node)
        .sql(")))")
}

// Not on MySQL: MariaDB has no `WITH … UPDATE`; its rescue binds the values in place.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
/// `WITH params AS (SELECT … AS default_max, … AS base_ms, … AS max_ms, … AS jitter)`, the
/// head of the PostgreSQL and SQLite rescue statements.
pub(super) fn rescue_params<DB>(rescue: &RescueParams) -> Statement<DB>
where
    DB: Backend + HasSqlType<BigInt> + HasSqlType<Integer> + HasSqlType<Double>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
    i32: diesel::serialize::ToSql<Integer, DB>,
    f64: diesel::serialize::ToSql<Double, DB>,
{
    Statement::new("WITH params AS (SELECT ")
        .bind::<Integer, _>(rescue.default_max_attempts)
        .sql(" AS default_max, ")
        .bind::<BigInt, _>(rescue.backoff_base_ms)
        .sql(" AS base_ms, ")
        .bind::<BigInt, _>(rescue.backoff_max_ms)
        .sql(" AS max_ms, ")
        .bind::<Double, _>(rescue.backoff_jitter)
        .sql(" AS jitter)")
}

/// See [`super::Driver::task_get_by_key`].
pub(super) fn task_get_by_key(
    conn: Conn<'_>,
    keyword: &str,
    biz_id: &str,
) -> QueryResult<Option<TaskRecord>> {
    type Row = (
        i64,
        String,
        String,
        Option<String>,
        i16,
        i32,
        Option<String>,
    );
    let row: Option<Row> = on_backend!(conn, |c| async_task::table
        .filter(async_task::keyword.eq(keyword))
        .filter(async_task::biz_id.eq(biz_id))
        .select((
            async_task::id,
            async_task::state,
            JsonText(async_task::biz_data),
            async_task::tenant,
            async_task::priority,
            async_task::failures,
            async_task::last_error,
        ))
        .get_result(c)
        .optional())?;
    Ok(row.map(|r| TaskRecord {
        id: r.0,
        state: r.1,
        biz_data: r.2,
        tenant: r.3,
        priority: i32::from(r.4),
        failures: r.5,
        last_error: r.6,
    }))
}

/// See [`super::Driver::task_count_by_keyword_state`]: the counts, then the due tasks of
/// each keyword with the database clock.
pub(super) fn task_count_by_keyword_state(conn: Conn<'_>) -> QueryResult<Vec<KeywordStateCount>> {
    type Due = (String, Option<NaiveDateTime>, i64, NaiveDateTime);
    let (counts, due) = on_backend!(conn, |c| {
        let counts: Vec<(String, String, i64)> = async_task::table
            .group_by((async_task::keyword, async_task::state))
            .order((async_task::keyword, async_task::state))
            .select((async_task::keyword, async_task::state, count_star()))
            .load(c)?;
        let due: Vec<Due> = async_task::table
            .filter(pending())
            .filter(async_task::run_at.le(DbNow))
            .group_by(async_task::keyword)
            .select((
                async_task::keyword,
                min(async_task::run_at),
                count_star(),
                DbNow,
            ))
            .load(c)?;
        (counts, due)
    });
    Ok(counts
        .into_iter()
        .map(|(keyword, state, count)| {
            let due = due
                .iter()
                .find(|d| state == TaskState::Pending.as_str() && d.0 == keyword);
            KeywordStateCount {
                oldest_due_secs: due.and_then(|d| {
                    let age = d.3 - d.1?;
                    Some(age.num_microseconds()? as f64 / 1e6)
                }),
                due: due.map_or(0, |d| d.2),
                keyword,
                state,
                count,
            }
        })
        .collect())
}

/// Appends the fence of a claimed task to an `UPDATE async_task SET …` statement.
pub(super) fn fence<DB>(set: Statement<DB>, claim: &Claim) -> Statement<DB>
where
    DB: Backend + HasSqlType<BigInt>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
{
    set.sql(" WHERE id = ")
        .bind::<BigInt, _>(claim.id)
        .sql(" AND owner = ")
        .bind::<BigInt, _>(claim.owner)
        .sql(" AND claim_token = ")
        .bind::<BigInt, _>(claim.token)
        .sql(" AND state = 'running'")
}

/// That a task of `async_task` is finished and in one of `states`, for a prune's statement:
/// the finished states as literals, as PostgreSQL's partial index on `finished_at` names them
/// (see `postgres/maintenance.rs`), then `states` as literals too (never from user text:
/// they come from [`TaskState`]).
pub(super) fn prunable(states: &[TaskState]) -> String {
    let states: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
    format!(
        "state IN ('done', 'dead', 'cancelled') AND state IN ({})",
        states.join(", ")
    )
}

/// That the task `async_task.id` has a child not finished, found through its links
/// (`async_task_parent`): prune keeps such a task.
pub(super) const UNFINISHED_CHILD: &str = "EXISTS (
               SELECT 1 FROM async_task_parent l JOIN async_task c ON c.id = l.child_id
                WHERE l.parent_id = async_task.id
                  AND c.state IN ('pending', 'blocked', 'running'))";

/// Deleted-row counts per state, as the prune statements report them.
pub(super) fn counts_by_state(rows: impl Iterator<Item = (String, i64)>) -> Vec<(TaskState, u64)> {
    let mut counts: Vec<(TaskState, u64)> = Vec::new();
    for (state, n) in rows {
        let state = state
            .parse::<TaskState>()
            .expect("prune deletes rows in a known state");
        let n = u64::try_from(n).unwrap_or(0);
        match counts.iter_mut().find(|(s, _)| *s == state) {
            Some((_, total)) => *total += n,
            None => counts.push((state, n)),
        }
    }
    counts
}
