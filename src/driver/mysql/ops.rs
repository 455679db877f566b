//! The operator's reads and bulk changes on MySQL: times (UTC `DATETIME(3)`) read as text
//! of the one shape, `CAST(… AS CHAR)`.

use diesel::connection::Connection;
use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Integer, Text};
use diesel::{OptionalExtension, QueryResult, QueryableByName, RunQueryDsl};

use super::operate::{retry_ids, Id, CHUNK};
use crate::driver::ops::{
    page_of, retry_states, where_selected, AuditRow, OpsDriver, TaskDetailRow, TaskListRow,
    TaskPageAt, TaskSelect, PARENT_PRUNED,
};
use crate::sql::Statement;

/// The columns of [`TaskListRow`].
macro_rules! list_columns {
    () => {
        concat!(
            "CAST(",
            now!(),
            " AS CHAR) AS db_now, id, keyword, biz_id, tenant, state, failures, max_attempts, \
             priority, CAST(run_at AS CHAR) AS run_at, CAST(created_at AS CHAR) AS created_at, \
             CAST(updated_at AS CHAR) AS updated_at, CAST(finished_at AS CHAR) AS finished_at, \
             owner, last_error"
        )
    };
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// The time `ms` milliseconds before now, by the database clock.
fn ago(statement: Statement<Mysql>, ms: i64) -> Statement<Mysql> {
    statement
        .sql(concat!("(", now!(), " - INTERVAL "))
        .bind::<BigInt, _>(ms)
        .sql(" * 1000 MICROSECOND)")
}

fn selected(statement: Statement<Mysql>, select: &TaskSelect<'_>) -> Statement<Mysql> {
    where_selected(statement.sql(" WHERE 1"), select, ago)
}

impl OpsDriver for MysqlConnection {
    fn task_list(
        &mut self,
        select: &TaskSelect<'_>,
        page: &TaskPageAt,
    ) -> QueryResult<Vec<TaskListRow>> {
        let statement =
            Statement::<Mysql>::new(concat!("SELECT ", list_columns!(), " FROM async_task"));
        page_of(selected(statement, select), page).load(self)
    }

    fn task_detail(&mut self, id: i64) -> QueryResult<Option<TaskDetailRow>> {
        Statement::<Mysql>::new(concat!(
            "SELECT ",
            list_columns!(),
            ", biz_data, claim_token, parent_id, CAST(claimed_at AS CHAR) AS claimed_at, \
             CAST(deadline_at AS CHAR) AS deadline_at, blocked_by FROM async_task WHERE id = "
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
        // A chunk of ids at a time, in id order (a parent before its children), each
        // retried as `outbox retry ID` retries one (`operate::retry_ids`, which leaves a task
        // one of whose parents was pruned), all in one transaction.
        let states: Vec<String> = select
            .states
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect();
        self.transaction(|conn| {
            let mut after = 0;
            let mut retried = 0;
            loop {
                let chunk: Vec<Id> = selected(Statement::new("SELECT id FROM async_task"), &select)
                    .sql(" AND id > ")
                    .bind::<BigInt, _>(after)
                    .sql(" ORDER BY id LIMIT ")
                    .bind::<BigInt, _>(CHUNK)
                    .load(conn)?;
                let Some(last) = chunk.last() else { break };
                after = last.id;
                let ids: Vec<i64> = chunk.iter().map(|c| c.id).collect();
                retried += retry_ids(conn, &ids, &states)?;
                if i64::try_from(ids.len()).unwrap_or(i64::MAX) < CHUNK {
                    break;
                }
            }
            Ok(i64::try_from(retried).unwrap_or(i64::MAX))
        })
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
        let mut statement = Statement::<Mysql>::new(
            "SELECT id, CAST(at AS CHAR) AS at, actor, action, target, detail, affected\n               FROM async_audit WHERE 1",
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
