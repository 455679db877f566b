//! The prune of finished tasks on MySQL, and its connections' ids for `KILL QUERY`.

use diesel::connection::SimpleConnection;
use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Text};
use diesel::{QueryResult, RunQueryDsl};

use super::list;
use crate::driver::{counts_by_state, prunable, PruneBatch, PrunedBatch, UNFINISHED_CHILD};
use crate::sql::Statement;

/// Deletes up to `limit` tasks that finished before the cutoff, oldest first, with their
/// links, in the caller's transaction.
///
/// The tasks are picked through the index on `finished_at` and locked, skipping rows another
/// transaction holds (`FOR UPDATE SKIP LOCKED`); a task is kept while a child of it is
/// unfinished (found through `async_task_parent`: a producer's `parent_id` shorthand does not
/// set `has_children` on MySQL). Then they are deleted by id, and their links as the other
/// backends' trigger `async_task_parent_forget` deletes them (MySQL's triggers run in the
/// statement that fires them, and this is the driver's to do): every link to a parent of a
/// pruned task, and the links to the children of a pruned done task. A dead or cancelled
/// parent's links stay, so that a child whose parent was pruned cannot be retried.
pub(in crate::driver) fn prune_tasks(
    conn: &mut MysqlConnection,
    batch: &PruneBatch<'_>,
) -> QueryResult<PrunedBatch> {
    #[derive(diesel::QueryableByName)]
    struct Doomed {
        #[diesel(sql_type = BigInt)]
        id: i64,
        #[diesel(sql_type = Text)]
        state: String,
    }
    let doomed: Vec<Doomed> = diesel::sql_query(format!(
        concat!(
            "SELECT id, state FROM async_task FORCE INDEX (async_task_finished_idx)
             WHERE finished_at < ",
            now!(),
            " - INTERVAL ? * 1000 MICROSECOND
               AND {}
               AND NOT {}
             ORDER BY finished_at
             LIMIT ?
             FOR UPDATE SKIP LOCKED"
        ),
        prunable(batch.states),
        UNFINISHED_CHILD
    ))
    .bind::<BigInt, _>(batch.older_than_ms)
    .bind::<BigInt, _>(batch.limit)
    .load(conn)?;
    if doomed.is_empty() {
        return Ok(PrunedBatch::default());
    }
    let ids: Vec<i64> = doomed.iter().map(|d| d.id).collect();
    let done: Vec<i64> = doomed
        .iter()
        .filter(|d| d.state == "done")
        .map(|d| d.id)
        .collect();
    Statement::<Mysql>::new("DELETE FROM async_task WHERE id IN ")
        .with(|s| list::ids(s, &ids))
        .execute(conn)?;
    Statement::<Mysql>::new("DELETE FROM async_task_parent WHERE child_id IN ")
        .with(|s| list::ids(s, &ids))
        .execute(conn)?;
    if !done.is_empty() {
        Statement::<Mysql>::new("DELETE FROM async_task_parent WHERE parent_id IN ")
            .with(|s| list::ids(s, &done))
            .execute(conn)?;
    }
    let total = ids.len();
    Ok(PrunedBatch {
        deleted: counts_by_state(doomed.into_iter().map(|d| (d.state, 1))),
        more: i64::try_from(total).unwrap_or(i64::MAX) >= batch.limit,
        resume_after: 0,
    })
}

/// This connection's id (`CONNECTION_ID()`), what `KILL QUERY` names.
pub(super) fn connection_id(conn: &mut MysqlConnection) -> QueryResult<i32> {
    let id: i64 = diesel::select(diesel::dsl::sql::<BigInt>(
        "CAST(CONNECTION_ID() AS SIGNED)",
    ))
    .get_result(conn)?;
    i32::try_from(id).map_err(|_| {
        diesel::result::Error::DeserializationError(
            format!("connection id {id} does not fit an i32").into(),
        )
    })
}

/// Cancels the statement connection `id` runs now (`KILL QUERY`); whether it was sent.
pub(super) fn kill_query(conn: &mut MysqlConnection, id: i32) -> QueryResult<bool> {
    match conn.batch_execute(&format!("KILL QUERY {id}")) {
        Ok(()) => Ok(true),
        // ER_NO_SUCH_THREAD: the connection has gone.
        Err(diesel::result::Error::DatabaseError(_, info))
            if info.message().contains("Unknown thread") =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}
