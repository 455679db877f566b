//! Retries on PostgreSQL, of one task or by filter, in one statement: the parents are locked
//! first, so that none becomes done, or is pruned, unseen between the count of those a task
//! waits for and its update.

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::BigInt;
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::ops::{retry_states, where_selected, OpsDriver, TaskSelect, PARENT_PRUNED};
use crate::driver::rows::CountRow;
use crate::sql::Statement;

/// See [`crate::driver::Driver::task_retry`]: the retry by filter's statement, of one task.
/// The task is named by id alone, so it is locked whatever its state: a retry of a running
/// task waits for its completion, and then reads the state it left (a task that died
/// meanwhile is retried).
pub(in crate::driver) fn retry(conn: &mut PgConnection, id: i64) -> QueryResult<usize> {
    let candidates = Statement::new("WITH candidates AS (SELECT id FROM async_task WHERE id = ")
        .bind::<BigInt, _>(id);
    let n = retry_candidates(candidates).get_result::<CountRow>(conn)?.n;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

impl OpsDriver for PgConnection {
    fn task_retry_matching(&mut self, select: &TaskSelect<'_>) -> QueryResult<i64> {
        let candidates = where_selected(
            Statement::new("WITH candidates AS (SELECT id FROM async_task"),
            &retry_states(select),
        );
        Ok(retry_candidates(candidates).get_result::<CountRow>(self)?.n)
    }
}

/// The retry of the dead or cancelled tasks among `candidates` (`WITH candidates AS (SELECT
/// id FROM async_task WHERE …`, to go on with) that have no pruned parent; counts them.
///
/// The candidates and their parents are locked together in ascending id order, the order
/// every other path locks tasks in (a completion locks its task, then its children; parents'
/// ids are smaller than their children's): two operators' retries, or a retry and a
/// completion, wait for each other instead of deadlocking. FOR NO KEY UPDATE returns each
/// row's latest state, after waiting for a change in flight, so no parent becomes done unseen
/// between the count and the update, and a task retried meanwhile by someone else is left
/// out. A parent retried by the same statement is not done: its child waits for it. A task
/// one of whose parents was pruned is not a candidate, and a parent pruned while the lock
/// waited for it is missing from `locked`: its child is not a target.
fn retry_candidates(candidates: Statement<Pg>) -> Statement<Pg> {
    candidates.sql(" AND NOT ").sql(PARENT_PRUNED).sql(
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
                   blocked_by = w.n, failures = 0, owner = NULL,
                   claim_token = a.claim_token + 1, run_at = now(),
                   finished_at = NULL, deadline_at = NULL, updated_at = now()
              FROM waiting w
             WHERE a.id = w.id AND a.state IN ('dead', 'cancelled')
            RETURNING 1)
         SELECT count(*) AS n FROM retried",
    )
}
