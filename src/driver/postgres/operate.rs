//! Operators' changes on PostgreSQL: cancel by filter, retry, the audit.

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::BigInt;
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::ops::PARENT_PRUNED;
use crate::sql::Statement;

pub(in crate::driver) fn retry(conn: &mut PgConnection, id: i64) -> QueryResult<usize> {
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
