//! The operator's reads and bulk changes on SQLite, whose times are stored as UTC text.

use diesel::sql_types::{BigInt, Integer, Text};
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{OptionalExtension, QueryResult, QueryableByName, RunQueryDsl};

use crate::driver::ops::{
    page_of, retry_states, where_selected, AuditRow, OpsDriver, TaskDetailRow, TaskListRow,
    TaskPageAt, TaskSelect, PARENT_PRUNED,
};
use crate::sql::Statement;

/// The columns of [`TaskListRow`].
macro_rules! list_columns {
    () => {
        concat!(
            now!(),
            " AS db_now, id, keyword, biz_id, tenant, state, failures, max_attempts, priority, \
             run_at, created_at, updated_at, finished_at, owner, last_error"
        )
    };
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// The time `ms` milliseconds before now, as SQLite's times are written.
fn ago(statement: Statement<Sqlite>, ms: i64) -> Statement<Sqlite> {
    statement
        .sql("strftime('%Y-%m-%d %H:%M:%f', 'now', ")
        .bind::<Text, _>(format!("-{:.3} seconds", ms as f64 / 1000.0))
        .sql(")")
}

fn selected(statement: Statement<Sqlite>, select: &TaskSelect<'_>) -> Statement<Sqlite> {
    where_selected(statement.sql(" WHERE 1"), select, ago)
}

/// The parents of the task `async_task.id` that are not done.
macro_rules! waiting_for {
    () => {
        "(SELECT count(*) FROM async_task_parent l JOIN async_task p ON p.id = l.parent_id
           WHERE l.child_id = async_task.id AND p.state <> 'done')"
    };
}

impl OpsDriver for SqliteConnection {
    fn task_list(
        &mut self,
        select: &TaskSelect<'_>,
        page: &TaskPageAt,
    ) -> QueryResult<Vec<TaskListRow>> {
        let statement =
            Statement::<Sqlite>::new(concat!("SELECT ", list_columns!(), " FROM async_task"));
        page_of(selected(statement, select), page).load(self)
    }

    fn task_detail(&mut self, id: i64) -> QueryResult<Option<TaskDetailRow>> {
        Statement::<Sqlite>::new(concat!(
            "SELECT ",
            list_columns!(),
            ", biz_data, claim_token, parent_id, claimed_at, deadline_at, blocked_by \
             FROM async_task WHERE id = "
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
        // The write lock is held: no parent completes (or is pruned) meanwhile. A parent
        // retried by the same statement is not done, before or after its own update: its
        // child waits for it.
        let n = selected(
            Statement::new(concat!(
                "UPDATE async_task SET state = CASE WHEN ",
                waiting_for!(),
                " > 0 THEN 'blocked' ELSE 'pending' END, blocked_by = ",
                waiting_for!(),
                ", failures = 0, owner = NULL, run_at = ",
                now!(),
                ", finished_at = NULL, deadline_at = NULL, updated_at = ",
                now!()
            )),
            &select,
        )
        .sql(" AND NOT ")
        .sql(PARENT_PRUNED)
        .execute(self)?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
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
        let mut statement = Statement::<Sqlite>::new(
            "SELECT id, at, actor, action, target, detail, affected FROM async_audit WHERE 1",
        );
        if let Some(action) = action {
            statement = statement
                .sql(" AND (action = ")
                .bind::<Text, _>(action.to_owned())
                .sql(" OR substr(action, 1, ")
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
