//! Task statements on MySQL: completion, failure, release, cancellation, rescue. A task that
//! ends done releases its children, one that ends dead or cancelled cancels its descendants,
//! in the same transaction (see `chain.rs`: no trigger may do it on MySQL).

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Double, Integer};
use diesel::Connection;
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use super::{chain, list};
use crate::driver::{fence, Claim, RescueParams, RescuedRow};
use crate::sql::Statement;

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

pub(in crate::driver) fn complete(conn: &mut MysqlConnection, claim: &Claim) -> QueryResult<usize> {
    let set = concat!(
        "UPDATE async_task SET state = 'done', finished_at = ",
        now!(),
        ", updated_at = ",
        now!()
    );
    conn.transaction(|conn| {
        let n = fence(Statement::new(set), claim).execute(conn)?;
        if n == 1 {
            chain::release_children(conn, &[claim.id])?;
        }
        Ok(n)
    })
}

pub(in crate::driver) fn complete_many(
    conn: &mut MysqlConnection,
    owner: i64,
    claims: &[(i64, i64)],
) -> QueryResult<usize> {
    let ids: Vec<i64> = claims.iter().map(|&(id, _)| id).collect();
    conn.transaction(|conn| {
        // The tasks still held by these claims, locked through the primary key: those this
        // completion ends. A locking read the optimizer led through the state index locked
        // the entries of every running task of this node on its way, and deadlocked with
        // the completions of other chunks and tasks (docs/notes/2026-11-25-mysql-hang.md).
        let held = chain::lock_by_key(conn, &ids, |s| {
            s.sql("state = 'running' AND owner = ")
                .bind::<BigInt, _>(owner)
                .sql(" AND (id, claim_token) IN ")
                .with(|s| list::pairs(s, claims))
        })?;
        if held.is_empty() {
            return Ok(0);
        }
        let n = Statement::<Mysql>::new(concat!(
            "UPDATE async_task SET state = 'done', finished_at = ",
            now!(),
            ", updated_at = ",
            now!(),
            " WHERE state = 'running' AND id IN "
        ))
        .with(|s| list::ids(s, &held))
        .execute(conn)?;
        chain::release_children(conn, &held)?;
        Ok(n)
    })
}

pub(super) fn cancel(conn: &mut MysqlConnection, id: i64) -> QueryResult<usize> {
    conn.transaction(|conn| {
        let n = Statement::<Mysql>::new(concat!(
            "UPDATE async_task SET state = 'cancelled', finished_at = ",
            now!(),
            ", updated_at = ",
            now!(),
            " WHERE id = "
        ))
        .bind::<BigInt, _>(id)
        .sql(" AND state IN ('pending', 'blocked', 'running')")
        .execute(conn)?;
        if n == 1 {
            chain::cancel_descendants_of(conn, &[id], "cancelled")?;
        }
        Ok(n)
    })
}

/// Rescue: the running tasks past their deadline or whose owner is not a live node, locked
/// (a completion under way is waited for, and its task then no longer matches), each
/// returned to pending after a backoff or, at max attempts, dead (its descendants
/// cancelled), counting a failure; then read back.
pub(in crate::driver) fn rescue_many(
    conn: &mut MysqlConnection,
    rescue: &RescueParams,
) -> QueryResult<Vec<RescuedRow>> {
    let lapsed = |s: Statement<Mysql>| {
        s.sql(concat!(
            "state = 'running' AND (deadline_at < ",
            now!(),
            " OR NOT EXISTS (SELECT 1 FROM async_node n
                              WHERE n.id = async_task.owner AND n.state = 'alive'
                                AND n.heartbeat_at >= ",
            now!(),
            " - INTERVAL "
        ))
        .bind::<BigInt, _>(rescue.dead_after_ms)
        .sql(" * 1000 MICROSECOND))")
    };
    conn.transaction(|conn| {
        // Found without locks, then locked through the primary key with the test repeated
        // (`chain::lock_by_key`: a locking read through the deadline index deadlocked with
        // completions). The test's read of `async_node` locks nothing (READ COMMITTED), so
        // heartbeats never wait on it.
        let found: Vec<Id> = Statement::<Mysql>::new(
            "SELECT id FROM async_task FORCE INDEX (async_task_deadline_idx) WHERE ",
        )
        .with(lapsed)
        .load(conn)?;
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let found: Vec<i64> = found.into_iter().map(|i| i.id).collect();
        let ids = chain::lock_by_key(conn, &found, lapsed)?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let at_max = |s: Statement<Mysql>| {
            s.sql("failures + 1 >= COALESCE(max_attempts, ")
                .bind::<Integer, _>(rescue.default_max_attempts)
                .sql(")")
        };
        // MySQL assigns SET's columns left to right, each seeing the ones before: every
        // column that reads failures, owner or the deadline comes before they change.
        Statement::<Mysql>::new(
            "UPDATE async_task SET
                last_error = CONCAT('rescued from node ', COALESCE(owner, '(none)'), ': ',
                    CASE WHEN deadline_at < ",
        )
        .sql(concat!(
            now!(),
            " THEN 'running past its deadline' ELSE 'the node stopped heartbeating' END),
                suspect = suspect + CASE WHEN deadline_at < ",
            now!(),
            " THEN 0 ELSE 1 END,
                run_at = CASE WHEN "
        ))
        .with(at_max)
        .sql(concat!(
            " THEN run_at ELSE ",
            now!(),
            " + INTERVAL ROUND(LEAST(LEAST("
        ))
        .bind::<BigInt, _>(rescue.backoff_base_ms)
        .sql(" * POW(2, LEAST(failures, 40)), ")
        .bind::<BigInt, _>(rescue.backoff_max_ms)
        .sql(") * (1 - ")
        .bind::<Double, _>(rescue.backoff_jitter)
        .sql(" + 2 * ")
        .bind::<Double, _>(rescue.backoff_jitter)
        .sql(" * RAND()), ")
        .bind::<BigInt, _>(rescue.backoff_max_ms)
        .sql(") * 1000) MICROSECOND END, finished_at = CASE WHEN ")
        .with(at_max)
        .sql(concat!(" THEN ", now!(), " END, owner = CASE WHEN "))
        .with(at_max)
        .sql(" THEN owner END, state = CASE WHEN ")
        .with(at_max)
        .sql(concat!(
            " THEN 'dead' ELSE 'pending' END, deadline_at = NULL, updated_at = ",
            now!(),
            ", failures = failures + 1 WHERE state = 'running' AND id IN "
        ))
        .with(|s| list::ids(s, &ids))
        .execute(conn)?;
        let rows: Vec<RescuedRow> = Statement::<Mysql>::new(
            "SELECT id, state, last_error AS reason, keyword, biz_id, tenant
               FROM async_task WHERE id IN ",
        )
        .with(|s| list::ids(s, &ids))
        .sql(" ORDER BY id")
        .load(conn)?;
        let dead: Vec<i64> = rows
            .iter()
            .filter(|r| r.state == "dead")
            .map(|r| r.id)
            .collect();
        chain::cancel_descendants_of(conn, &dead, "dead")?;
        Ok(rows)
    })
}
