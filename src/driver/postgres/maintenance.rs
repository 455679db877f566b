//! The prune of finished tasks on PostgreSQL.

use diesel::pg::PgConnection;
use diesel::sql_types::{BigInt, Text};
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::{counts_by_state, prunable, PruneBatch, PrunedBatch, UNFINISHED_CHILD};

#[derive(diesel::QueryableByName)]
struct StateCount {
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Deletes up to `limit` tasks that finished before the cutoff, oldest first.
///
/// The ids are locked in a CTE first (materialised, so it runs exactly once), skipping rows
/// another transaction holds, read through the partial index on `finished_at`. The DELETE
/// takes them as one array, which makes it look each id up in the primary key: joined to the
/// CTE instead, the planner merge-joins with a scan of the whole primary key, once per batch.
/// The states are literals next to the index's own predicate: a planner may use a partial
/// index only when it can prove the query implies the predicate, which it cannot do through
/// a bind parameter in a generic plan.
pub(in crate::driver) fn prune_tasks(
    conn: &mut PgConnection,
    batch: &PruneBatch<'_>,
) -> QueryResult<PrunedBatch> {
    let sql = format!(
        "WITH doomed AS MATERIALIZED (
             SELECT id FROM async_task
             WHERE {}
               AND finished_at < now() - $1 * interval '1 millisecond'
               AND NOT (has_children AND {UNFINISHED_CHILD})
             ORDER BY finished_at
             LIMIT $2
             FOR UPDATE SKIP LOCKED),
         deleted AS (
             DELETE FROM async_task WHERE id = ANY (ARRAY(SELECT id FROM doomed))
             RETURNING state)
         SELECT state, count(*) AS n FROM deleted GROUP BY state",
        prunable(batch.states)
    );
    let rows: Vec<StateCount> = diesel::sql_query(sql)
        .bind::<BigInt, _>(batch.older_than_ms)
        .bind::<BigInt, _>(batch.limit)
        .load(conn)?;
    let deleted = counts_by_state(rows.into_iter().map(|r| (r.state, r.n)));
    let total: u64 = deleted.iter().map(|(_, n)| n).sum();
    Ok(PrunedBatch {
        more: total >= batch.limit as u64,
        resume_after: 0,
        deleted,
    })
}
