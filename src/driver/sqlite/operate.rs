//! Operators' changes on SQLite: cancel by filter, retry, the audit.

use diesel::sql_types::BigInt;
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::ops::PARENT_PRUNED;
use crate::sql::Statement;

pub(in crate::driver) fn retry(conn: &mut SqliteConnection, id: i64) -> QueryResult<usize> {
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
