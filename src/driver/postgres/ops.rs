//! The operator's reads and bulk changes on PostgreSQL; times formatted as UTC text.

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::{BigInt, Integer, Text};
use diesel::{OptionalExtension, QueryResult, QueryableByName, RunQueryDsl};

use crate::driver::ops::{
    page_of, retry_states, where_selected, AuditRow, OpsDriver, TaskDetailRow, TaskListRow,
    TaskPageAt, TaskSelect, PARENT_PRUNED,
};
use crate::sql::Statement;

/// `timestamptz` → UTC text `YYYY-MM-DD HH:MM:SS.SSS`.
macro_rules! utc_text {
    ($column:literal) => {
        concat!(
            "to_char(",
            $column,
            " AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS')"
        )
    };
}

/// The columns of [`TaskListRow`].
macro_rules! list_columns {
    () => {
        concat!(
            utc_text!("now()"),
            " AS db_now, id, keyword, biz_id, tenant, state, failures, max_attempts, \
             priority::integer AS priority, ",
            utc_text!("run_at"),
            " AS run_at, ",
            utc_text!("created_at"),
            " AS created_at, ",
            utc_text!("updated_at"),
            " AS updated_at, ",
            utc_text!("finished_at"),
            " AS finished_at, owner, last_error"
        )
    };
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// The time `ms` milliseconds before now.
fn ago(statement: Statement<Pg>, ms: i64) -> Statement<Pg> {
    statement
        .sql("now() - ")
        .bind::<BigInt, _>(ms)
        .sql(" * interval '1 millisecond'")
}

fn selected(statement: Statement<Pg>, select: &TaskSelect<'_>) -> Statement<Pg> {
    where_selected(statement.sql(" WHERE true"), select, ago)
}

impl OpsDriver for PgConnection {
    fn task_list(
        &mut self,
        select: &TaskSelect<'_>,
        page: &TaskPageAt,
    ) -> QueryResult<Vec<TaskListRow>> {
        let statement =
            Statement::<Pg>::new(concat!("SELECT ", list_columns!(), " FROM async_task"));
        page_of(selected(statement, select), page).load(self)
    }

    fn task_detail(&mut self, id: i64) -> QueryResult<Option<TaskDetailRow>> {
        Statement::<Pg>::new(concat!(
            "SELECT ",
            list_columns!(),
            ", biz_data::text AS biz_data, claim_token, parent_id, ",
            utc_text!("claimed_at"),
            " AS claimed_at, ",
            utc_text!("deadline_at"),
            " AS deadline_at, blocked_by FROM async_task WHERE id = "
        ))
        .bind::<BigInt, _>(id)
        .get_result(self)
        .optional()
    }

    fn task_retry_matching(&mut self, select: &TaskSelect<'_>, dry_run: bool) -> QueryResult<i64> {
        let select = retry_states(select);
        if dry_run {
            let count: Count = selected(
                Statement::new("SELECT count(*) AS n FROM async_task"),
                &select,
            )
            .sql(" AND NOT ")
            .sql(PARENT_PRUNED)
            .get_result(self)?;
            return Ok(count.n);
        }
        // The matching tasks and their parents are locked together in ascending id order,
        // the order every other path locks tasks in (a retry of one task locks its parents,
        // whose ids are smaller, then the task; a completion locks its task, then its
        // children): two operators' retries, or a retry and a completion, wait for each other
        // instead of deadlocking. FOR NO KEY UPDATE returns each row's latest state, after
        // waiting for a change in flight, so no parent becomes done unseen between the count
        // and the update, and a task retried meanwhile by someone else is left out. A parent
        // retried by the same statement is not done: its child waits for it. A task one of
        // whose parents was pruned is not a candidate, and a parent pruned while the lock
        // waited for it is missing from `locked`: its child is not a target.
        let statement = selected(
            Statement::new("WITH candidates AS (SELECT id FROM async_task"),
            &select,
        )
        .sql(" AND NOT ")
        .sql(PARENT_PRUNED)
        .sql(
            "),
             locked AS (
                SELECT id, state FROM async_task
                 WHERE id IN (SELECT id FROM candidates
                              UNION SELECT l.parent_id FROM async_task_parent l
                                     WHERE l.child_id IN (SELECT id FROM candidates))
                 ORDER BY id FOR NO KEY UPDATE),
             targets AS (
                SELECT k.id FROM locked k JOIN candidates c ON c.id = k.id
                 WHERE k.state IN ('dead', 'cancelled')
                   AND NOT EXISTS (SELECT 1 FROM async_task_parent l
                                    WHERE l.child_id = k.id
                                      AND l.parent_id NOT IN (SELECT id FROM locked))),
             waiting AS (
                SELECT t.id, (SELECT count(*) FROM async_task_parent l
                                JOIN locked p ON p.id = l.parent_id
                               WHERE l.child_id = t.id AND p.state <> 'done')::int AS n
                  FROM targets t),
             retried AS (
                UPDATE async_task a
                   SET state = CASE WHEN w.n > 0 THEN 'blocked' ELSE 'pending' END,
                       blocked_by = w.n, failures = 0, owner = NULL, run_at = now(),
                       finished_at = NULL, deadline_at = NULL, updated_at = now()
                  FROM waiting w
                 WHERE a.id = w.id AND a.state IN ('dead', 'cancelled')
                RETURNING 1)
             SELECT count(*) AS n FROM retried",
        );
        Ok(statement.get_result::<Count>(self)?.n)
    }

    fn task_count_parent_pruned(&mut self, select: &TaskSelect<'_>) -> QueryResult<i64> {
        let count: Count = selected(
            Statement::new("SELECT count(*) AS n FROM async_task"),
            &retry_states(select),
        )
        .sql(" AND ")
        .sql(PARENT_PRUNED)
        .get_result(self)?;
        Ok(count.n)
    }

    fn audit_list(
        &mut self,
        action: Option<&str>,
        before_id: Option<i64>,
        limit: i64,
    ) -> QueryResult<Vec<AuditRow>> {
        let mut statement = Statement::<Pg>::new(concat!(
            "SELECT id, ",
            utc_text!("at"),
            " AS at, actor, action, target, detail::text AS detail, affected
               FROM async_audit WHERE true"
        ));
        if let Some(action) = action {
            statement = statement
                .sql(" AND (action = ")
                .bind::<Text, _>(action.to_owned())
                .sql(" OR left(action, ")
                .bind::<Integer, _>(i32::try_from(action.len() + 1).unwrap_or(i32::MAX))
                .sql(") = ")
                .bind::<Text, _>(format!("{action}."))
                .sql(")");
        }
        if let Some(id) = before_id {
            statement = statement.sql(" AND id < ").bind::<BigInt, _>(id);
        }
        statement
            .sql(" ORDER BY id DESC LIMIT ")
            .bind::<BigInt, _>(limit)
            .load(self)
    }
}
