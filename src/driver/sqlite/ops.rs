//! Retries on SQLite, of one task or by filter: under the write lock, no parent completes
//! (or is pruned) between the count of those a task waits for and its update.

use diesel::sql_types::BigInt;
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::ops::{retry_states, where_selected, OpsDriver, TaskSelect, PARENT_PRUNED};
use crate::sql::Statement;

/// The parents of the task `async_task.id` that are not done.
macro_rules! waiting_for {
    () => {
        "(SELECT count(*) FROM async_task_parent l JOIN async_task p ON p.id = l.parent_id
           WHERE l.child_id = async_task.id AND p.state <> 'done')"
    };
}

/// `UPDATE async_task` putting each task back to pending, or blocked on its parents that are
/// not done, with no failure counted and a new claim token (see `ops::retry_states`); the
/// caller appends `WHERE`.
fn retried() -> Statement<Sqlite> {
    Statement::new(concat!(
        "UPDATE async_task SET state = CASE WHEN ",
        waiting_for!(),
        " > 0 THEN 'blocked' ELSE 'pending' END, blocked_by = ",
        waiting_for!(),
        ", failures = 0, owner = NULL, claim_token = claim_token + 1, run_at = ",
        now!(),
        ", finished_at = NULL, deadline_at = NULL, updated_at = ",
        now!()
    ))
}

/// See [`crate::driver::Driver::task_retry`].
pub(in crate::driver) fn retry(conn: &mut SqliteConnection, id: i64) -> QueryResult<usize> {
    retried()
        .sql(" WHERE id = ")
        .bind::<BigInt, _>(id)
        .sql(" AND state IN ('dead', 'cancelled') AND NOT ")
        .sql(PARENT_PRUNED)
        .execute(conn)
}

impl OpsDriver for SqliteConnection {
    fn task_retry_matching(&mut self, select: &TaskSelect<'_>) -> QueryResult<i64> {
        // A parent retried by the same statement is not done, before or after its own
        // update: its child waits for it.
        let n = where_selected(retried(), &retry_states(select))
            .sql(" AND NOT ")
            .sql(PARENT_PRUNED)
            .execute(self)?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }
}
