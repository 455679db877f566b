//! Operators' changes on PostgreSQL: cancel by filter, retry, the audit.

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use crate::driver::ops::PARENT_PRUNED;
use crate::driver::{audit_insert, AuditEntry, TaskFilter};
use crate::sql::Statement;

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// `… WHERE state IN ('pending', 'blocked', 'running')` and the filter's conditions.
fn unfinished_matching(statement: Statement<Pg>, filter: &TaskFilter<'_>) -> Statement<Pg> {
    statement
        .sql(" WHERE state IN ('pending', 'blocked', 'running') AND (")
        .bind::<Nullable<Text>, _>(filter.keyword.map(str::to_owned))
        .sql("::text IS NULL OR keyword = ")
        .bind::<Nullable<Text>, _>(filter.keyword.map(str::to_owned))
        .sql(") AND (")
        .bind::<Nullable<Text>, _>(filter.tenant.map(str::to_owned))
        .sql("::text IS NULL OR tenant = ")
        .bind::<Nullable<Text>, _>(filter.tenant.map(str::to_owned))
        .sql(")")
}

pub(super) fn cancel_matching(
    conn: &mut PgConnection,
    filter: &TaskFilter<'_>,
    dry_run: bool,
) -> QueryResult<i64> {
    let statement = if dry_run {
        unfinished_matching(
            Statement::new("SELECT count(*) AS n FROM async_task"),
            filter,
        )
    } else {
        unfinished_matching(
            Statement::new(
                "WITH c AS (UPDATE async_task
                 SET state = 'cancelled', finished_at = now(), updated_at = now()",
            ),
            filter,
        )
        .sql(" RETURNING 1) SELECT count(*) AS n FROM c")
    };
    Ok(statement.get_result::<Count>(conn)?.n)
}

pub(super) fn retry(conn: &mut PgConnection, id: i64) -> QueryResult<usize> {
    // The parents are locked (FOR NO KEY UPDATE returns their latest state, after waiting
    // for a completion in flight), so none becomes done between the count and the update.
    Statement::<Pg>::new(
        "WITH parents AS (
            SELECT p.state FROM async_task p
             WHERE p.id IN (SELECT parent_id FROM async_task_parent WHERE child_id = ",
    )
    .bind::<BigInt, _>(id)
    .sql(
        ") FOR NO KEY UPDATE
         ), waiting AS (SELECT count(*) FILTER (WHERE state <> 'done')::int AS n FROM parents)
         UPDATE async_task SET state = CASE WHEN w.n > 0 THEN 'blocked' ELSE 'pending' END,
                blocked_by = w.n, failures = 0, owner = NULL, run_at = now(),
                finished_at = NULL, deadline_at = NULL, updated_at = now()
           FROM waiting w
          WHERE id = ",
    )
    .bind::<BigInt, _>(id)
    .sql(" AND state IN ('dead', 'cancelled') AND NOT ")
    .sql(PARENT_PRUNED)
    .execute(conn)
}

pub(super) fn audit(conn: &mut PgConnection, audit: &AuditEntry<'_>) -> QueryResult<usize> {
    audit_insert(Statement::<Pg>::new(""), audit, "::jsonb").execute(conn)
}
