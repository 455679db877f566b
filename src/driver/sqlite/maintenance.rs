//! The prune of finished tasks on SQLite.

use diesel::sql_types::BigInt;
use diesel::sqlite::SqliteConnection;
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::rows::StateRow;
use crate::driver::{counts_by_state, prunable, PruneBatch, PrunedBatch, UNFINISHED_CHILD};

/// The next window of the prune's walk: the first `limit` tasks after `after_id`.
#[derive(diesel::QueryableByName)]
struct Window {
    /// The window's last id (`None`: the walk reached the end of the table).
    #[diesel(sql_type = diesel::sql_types::Nullable<BigInt>)]
    last_id: Option<i64>,
    /// Whether a task of the window was created before the cutoff.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    has_old: bool,
    /// How many tasks the window holds (fewer than asked: the end of the table).
    #[diesel(sql_type = BigInt)]
    rows: i64,
}

/// Deletes the finished tasks older than the cutoff among the next `limit` tasks by id.
///
/// SQLite has no index on `finished_at` (every completion would have to update it; see
/// `docs/notes/performance.md`), so prune walks the rowid from the oldest task, where old finished
/// tasks are: each batch reads one window of `limit` rows by rowid range, in the caller's
/// `IMMEDIATE` transaction, so that no batch holds the write lock for longer than it takes
/// to read `limit` rows, and the next batch resumes after it. The walk ends at the end of the
/// table, or at the first window with no task created before the cutoff: ids follow
/// `created_at` (both are set at insert, by the database clock), and a task cannot have
/// finished before it was created.
/// The cutoff is UTC text in the one format of every time column, compared as text.
pub(in crate::driver) fn prune_tasks(
    conn: &mut SqliteConnection,
    batch: &PruneBatch<'_>,
) -> QueryResult<PrunedBatch> {
    const CUTOFF: &str = "datetime('now', 'subsec', printf('-%.3f seconds', ?1 / 1000.0))";
    let window: Window = diesel::sql_query(format!(
        "SELECT max(id) AS last_id, coalesce(min(created_at) < {CUTOFF}, 0) AS has_old,
                count(*) AS rows
         FROM (SELECT id, created_at FROM async_task WHERE id > ?2 ORDER BY id LIMIT ?3)"
    ))
    .bind::<BigInt, _>(batch.older_than_ms)
    .bind::<BigInt, _>(batch.after_id)
    .bind::<BigInt, _>(batch.limit)
    .get_result(conn)?;
    let Some(last_id) = window.last_id else {
        return Ok(PrunedBatch::default());
    };
    let deleted: Vec<StateRow> = diesel::sql_query(format!(
        "DELETE FROM async_task
         WHERE id > ?2 AND id <= ?3
           AND {}
           AND finished_at < {CUTOFF}
           AND NOT (has_children AND {UNFINISHED_CHILD})
         RETURNING state",
        prunable(batch.states)
    ))
    .bind::<BigInt, _>(batch.older_than_ms)
    .bind::<BigInt, _>(batch.after_id)
    .bind::<BigInt, _>(last_id)
    .load(conn)?;
    Ok(PrunedBatch {
        deleted: counts_by_state(deleted.into_iter().map(|d| (d.state, 1))),
        more: window.has_old && window.rows >= batch.limit,
        resume_after: last_id,
    })
}
