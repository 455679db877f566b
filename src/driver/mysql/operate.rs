//! Operators' changes on MySQL: cancel of one task or by filter, retry of one task or by
//! filter.
//!
//! What the other backends' triggers do when a task is cancelled (its descendants cancelled
//! with it) is the driver's here, in the same transaction (`chain.rs`); and MySQL refuses an
//! `UPDATE async_task` that reads `async_task` in a subquery (error 1093), so the tasks are
//! picked first, then changed by id.

use std::collections::BTreeMap;

use diesel::connection::Connection;
use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Integer, Text};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use super::{chain, list, load_ids};
use crate::driver::ops::{
    retry_states, where_selected, OpsDriver, TaskSelect, CANCELLED_RUNNING, PARENT_PRUNED,
};
use crate::driver::{operate_sql, Conn, TaskFilter};
use crate::sql::Statement;
use crate::task::TaskState;

/// Tasks changed per statement by the operators' bulk changes (each `IN (…)` list).
const CHUNK: i64 = 1000;

/// Runs `change` on the tasks that `select` matches, [`CHUNK`] at a time in id order (a
/// parent before its children), each chunk locked first when `lock`, all in one transaction;
/// returns the sum of what `change` counted.
fn by_chunks(
    conn: &mut MysqlConnection,
    select: &TaskSelect<'_>,
    lock: bool,
    mut change: impl FnMut(&mut MysqlConnection, &[i64]) -> QueryResult<usize>,
) -> QueryResult<i64> {
    conn.transaction(|conn| {
        let mut after = 0;
        let mut changed = 0;
        loop {
            let chunk = where_selected(Statement::new("SELECT id FROM async_task"), select)
                .sql(" AND id > ")
                .bind::<BigInt, _>(after)
                .sql(" ORDER BY id LIMIT ")
                .bind::<BigInt, _>(CHUNK)
                .sql(if lock { " FOR UPDATE" } else { "" });
            let ids = load_ids(conn, chunk)?;
            let Some(&last) = ids.last() else { break };
            after = last;
            changed += change(conn, &ids)?;
            if i64::try_from(ids.len()).unwrap_or(i64::MAX) < CHUNK {
                break;
            }
        }
        Ok(i64::try_from(changed).unwrap_or(i64::MAX))
    })
}

/// `UPDATE async_task` to cancelled, finished now, with the note of a cancel on a task whose
/// handler may be running: running, or pending and leased ([`leased_among`] of the tasks;
/// `last_error` first: MySQL's `SET` reads the columns it has already set). The caller
/// appends `WHERE`.
pub(super) fn cancelled(leased: &[i64]) -> Statement<Mysql> {
    let statement =
        Statement::<Mysql>::new("UPDATE async_task SET last_error = CASE WHEN state = 'running'");
    let statement = match leased.is_empty() {
        true => statement,
        false => statement
            .sql(" OR state = 'pending' AND id IN ")
            .with(|s| list::ids(s, leased)),
    };
    statement
        .sql(" THEN ")
        .bind::<Text, _>(CANCELLED_RUNNING)
        .sql(concat!(
            " ELSE last_error END, state = 'cancelled', finished_at = ",
            now!(),
            ", updated_at = ",
            now!()
        ))
}

/// The tasks among `ids` leased to a chunk, read apart, without a lock: a subquery of the
/// cancel's `UPDATE` would lock the leases it reads, and their gaps, for the length of a
/// producer's transaction at REPEATABLE READ, and a lock claim's insert of a lease would wait
/// for it. A lease committed after this read is the chunk's to note (`worker/locked.rs`).
pub(super) fn leased_among(conn: &mut MysqlConnection, ids: &[i64]) -> QueryResult<Vec<i64>> {
    let statement =
        Statement::<Mysql>::new("SELECT task_id AS id FROM async_lease WHERE task_id IN ");
    load_ids(conn, list::ids(statement, ids))
}

pub(super) fn cancel(conn: &mut MysqlConnection, id: i64) -> QueryResult<usize> {
    conn.transaction(|conn| {
        let leased = leased_among(conn, &[id])?;
        let n = cancelled(&leased)
            .sql(" WHERE id = ")
            .bind::<BigInt, _>(id)
            .sql(" AND state IN ('pending', 'blocked', 'running')")
            .execute(conn)?;
        if n == 1 {
            chain::cancel_descendants_of(conn, &[id], "cancelled")?;
        }
        Ok(n)
    })
}

/// Cancels the unfinished tasks of `filter`, [`CHUNK`] at a time in id order, each chunk
/// locked and cancelled, then their descendants; returns the tasks of the filter cancelled
/// (not their descendants), as the other backends count: a matching descendant in a later
/// chunk is cancelled, and counted, by its own chunk, not by its parent's cascade. The count
/// of a dry run is theirs.
pub(super) fn cancel_matching(
    conn: &mut MysqlConnection,
    filter: &TaskFilter<'_>,
    dry_run: bool,
) -> QueryResult<i64> {
    if dry_run {
        return operate_sql::task_cancel_matching(Conn::Mysql(conn), filter, true);
    }
    let unfinished = [TaskState::Pending, TaskState::Blocked, TaskState::Running];
    let select = TaskSelect {
        states: &unfinished,
        keyword: filter.keyword,
        tenant: filter.tenant,
        ..TaskSelect::default()
    };
    conn.transaction(|conn| {
        let mut roots: Vec<i64> = Vec::new();
        let n = by_chunks(conn, &select, true, |conn, ids| {
            let leased = leased_among(conn, ids)?;
            roots.extend_from_slice(ids);
            cancelled(&leased)
                .sql(" WHERE state IN ('pending', 'blocked', 'running') AND id IN ")
                .with(|s| list::ids(s, ids))
                .execute(conn)
        })?;
        for ids in roots.chunks(CHUNK as usize) {
            chain::cancel_descendants_of(conn, ids, "cancelled")?;
        }
        Ok(n)
    })
}

impl OpsDriver for MysqlConnection {
    fn task_retry_matching(&mut self, select: &TaskSelect<'_>) -> QueryResult<i64> {
        let select = retry_states(select);
        // Each chunk retried as `outbox retry ID` retries one ([`retry_ids`], which leaves a
        // task one of whose parents was pruned).
        let states: Vec<String> = select
            .states
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect();
        by_chunks(self, &select, false, |conn, ids| {
            retry_ids(conn, ids, &states)
        })
    }
}

/// Retries the task `id` if it is dead or cancelled and none of its parents was pruned.
pub(in crate::driver) fn retry(conn: &mut MysqlConnection, id: i64) -> QueryResult<usize> {
    retry_ids(conn, &[id], &["dead".to_owned(), "cancelled".to_owned()])
}

/// Retries those of the tasks `ids` still in one of `states` and none of whose parents was
/// pruned: pending again, or blocked on the parents of theirs that are
/// not done, failures reset; returns how many. In one transaction that first locks the
/// parents, in id order as a completion locks them (a completion in flight is waited for,
/// its parent then read as done), then the tasks: a parent cannot become done between the
/// count of those a child waits for and the child's update. A parent retried in the same
/// call is counted as not done (ids ascend from parent to child).
fn retry_ids(conn: &mut MysqlConnection, ids: &[i64], states: &[String]) -> QueryResult<usize> {
    if ids.is_empty() {
        return Ok(0);
    }
    conn.transaction(|conn| {
        let parents = Statement::<Mysql>::new(
            "SELECT id FROM async_task WHERE id IN
               (SELECT parent_id FROM async_task_parent WHERE child_id IN ",
        );
        load_ids(
            conn,
            list::ids(parents, ids).sql(") ORDER BY id FOR UPDATE"),
        )?;
        let picked = Statement::<Mysql>::new("SELECT id FROM async_task WHERE id IN ")
            .with(|s| list::ids(s, ids))
            .sql(" AND state IN ")
            .with(|s| list::texts(s, states))
            .sql(" AND NOT ")
            .sql(PARENT_PRUNED)
            .sql(" ORDER BY id FOR UPDATE");
        let picked = load_ids(conn, picked)?;
        if picked.is_empty() {
            return Ok(0);
        }
        let n = Statement::<Mysql>::new(concat!(
            "UPDATE async_task SET state = 'pending', blocked_by = 0, failures = 0, owner = NULL,
                    claim_token = claim_token + 1, run_at = ",
            now!(),
            ", finished_at = NULL, deadline_at = NULL, updated_at = ",
            now!(),
            " WHERE id IN "
        ))
        .with(|s| list::ids(s, &picked))
        .execute(conn)?;
        block_on_parents(conn, &picked)?;
        Ok(n)
    })
}

/// Blocks each of the tasks `ids` (just made pending) on its parents that are not done, as
/// they are now, whatever the transaction's isolation.
fn block_on_parents(conn: &mut MysqlConnection, ids: &[i64]) -> QueryResult<()> {
    #[derive(QueryableByName)]
    struct Waiting {
        #[diesel(sql_type = BigInt)]
        id: i64,
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let waiting: Vec<Waiting> = Statement::<Mysql>::new(
        "SELECT l.child_id AS id, count(*) AS n
           FROM async_task_parent l JOIN async_task p ON p.id = l.parent_id
          WHERE p.state <> 'done' AND l.child_id IN ",
    )
    .with(|s| list::ids(s, ids))
    // A locking read: the parents' newest states (they are locked already), which a plain
    // read of a REPEATABLE READ transaction would take from its snapshot, blocking the task
    // on a parent done since, which would never release it.
    .sql(" GROUP BY l.child_id LOCK IN SHARE MODE")
    .load(conn)?;
    let mut by_count: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for w in waiting {
        by_count.entry(w.n).or_default().push(w.id);
    }
    for (n, children) in by_count {
        Statement::<Mysql>::new("UPDATE async_task SET state = 'blocked', blocked_by = ")
            .bind::<Integer, _>(i32::try_from(n).unwrap_or(i32::MAX))
            .sql(" WHERE id IN ")
            .with(|s| list::ids(s, &children))
            .execute(conn)?;
    }
    Ok(())
}
