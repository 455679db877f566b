//! Operators' changes on SQLite: cancel by filter, retry, the audit.

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use crate::driver::ops::PARENT_PRUNED;
use crate::driver::{audit_insert, AuditEntry, TaskFilter};
use crate::sql::Statement;

/// `… WHERE state IN ('pending', 'blocked', 'running')` and the filter's conditions.
fn unfinished_matching(statement: Statement<Sqlite>, filter: &TaskFilter<'_>) -> Statement<Sqlite> {
    statement
        .sql(" WHERE state IN ('pending', 'blocked', 'running') AND (")
        .bind::<Nullable<Text>, _>(filter.keyword.map(str::to_owned))
        .sql(" IS NULL OR keyword = ")
        .bind::<Nullable<Text>, _>(filter.keyword.map(str::to_owned))
        .sql(") AND (")
        .bind::<Nullable<Text>, _>(filter.tenant.map(str::to_owned))
        .sql(" IS NULL OR tenant = ")
        .bind::<Nullable<Text>, _>(filter.tenant.map(str::to_owned))
        .sql(")")
}

pub(super) fn cancel_matching(
    conn: &mut SqliteConnection,
    filter: &TaskFilter<'_>,
    dry_run: bool,
) -> QueryResult<i64> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    if dry_run {
        let count: Count = unfinished_matching(
            Statement::new("SELECT count(*) AS n FROM async_task"),
            filter,
        )
        .get_result(conn)?;
        return Ok(count.n);
    }
    let n = unfinished_matching(
        Statement::new(concat!(
            "UPDATE async_task SET state = 'cancelled', finished_at = ",
            now!(),
            ", updated_at = ",
            now!()
        )),
        filter,
    )
    .execute(conn)?;
    Ok(i64::try_from(n).unwrap_or(i64::MAX))
}

pub(super) fn retry(conn: &mut SqliteConnection, id: i64) -> QueryResult<usize> {
    Statement::<Sqlite>::new(concat!(
        "UPDATE async_task SET state = CASE WHEN w.n > 0 THEN 'blocked' ELSE 'pending' END,
                blocked_by = w.n, failures = 0, owner = NULL, run_at = ",
        now!(),
        ", finished_at = NULL, deadline_at = NULL, updated_at = ",
        now!(),
        " FROM (SELECT count(*) AS n FROM async_task_parent l JOIN async_task p
                 ON p.id = l.parent_id WHERE l.child_id = "
    ))
    .bind::<BigInt, _>(id)
    .sql(" AND p.state <> 'done') w WHERE id = ")
    .bind::<BigInt, _>(id)
    .sql(" AND state IN ('dead', 'cancelled') AND NOT ")
    .sql(PARENT_PRUNED)
    .execute(conn)
}

pub(super) fn audit(conn: &mut SqliteConnection, audit: &AuditEntry<'_>) -> QueryResult<usize> {
    audit_insert(Statement::<Sqlite>::new(""), audit, "").execute(conn)
}
