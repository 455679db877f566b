//! The references a drain and an enqueue are compared with, measured on the same database
//! in the same run: plain loops through the same diesel connections and cached prepared
//! statements the worker uses.
//!
//! - *single-row*: `BEGIN; UPDATE one row; COMMIT` — the most commits per second the database
//!   gives this many connections; strict mode (one transaction per task) cannot beat it,
//!   since each task is such a transaction plus its share of a claim;
//! - *K-row*: `BEGIN; K × UPDATE one row; COMMIT` — the limit for batched mode with chunks
//!   of K;
//! - *insert*: plain multi-row `INSERT … VALUES` of [`super::ENQUEUE_BATCH`] literal rows per
//!   statement into `async_task`: what bulk enqueue is compared with.

use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::sql_types::BigInt;
use outbox::{write_transaction, DatabaseUrl, DbConnection};

use super::ENQUEUE_BATCH;

/// `n` rows into `async_task` by plain multi-row INSERTs of [`ENQUEUE_BATCH`] literal rows,
/// each statement its own transaction; returns rows per second. (Run on the empty table,
/// before the enqueue.)
pub(crate) fn insert(conn: &mut DbConnection, n: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut next = 0;
    while next < n {
        let end = (next + ENQUEUE_BATCH).min(n);
        let values: Vec<String> = (next..end)
            .map(|i| format!("('bench.ref', '{i}', '{{}}', 0)"))
            .collect();
        conn.batch_execute(&format!(
            "INSERT INTO async_task (keyword, biz_id, biz_data, priority) VALUES {}",
            values.join(", ")
        ))
        .context("reference insert")?;
        next = end;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// `connections` threads, each on its own connection and rows, commit transactions of
/// `rows_per_txn` single-row UPDATEs until `total_rows` rows are updated in all; returns rows
/// per second. On SQLite the threads take turns on a mutex, as the worker's do.
pub(crate) fn updates(
    url: &DatabaseUrl,
    connections: usize,
    rows_per_txn: usize,
    total_rows: usize,
) -> anyhow::Result<f64> {
    let mut setup = url.connect()?;
    let rows = connections * rows_per_txn;
    setup
        .batch_execute(
            "DROP TABLE IF EXISTS bench_ref; \
             CREATE TABLE bench_ref (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)",
        )
        .context("creating the reference table")?;
    let values: Vec<String> = (0..rows).map(|i| format!("({i}, 0)")).collect();
    setup
        .batch_execute(&format!(
            "INSERT INTO bench_ref (id, n) VALUES {}",
            values.join(", ")
        ))
        .context("filling the reference table")?;
    let txns_per_thread = (total_rows / rows).max(1);
    let sqlite_turn = Mutex::new(());
    let barrier = Barrier::new(connections + 1);
    let elapsed = std::thread::scope(|s| -> anyhow::Result<Duration> {
        let mut threads = Vec::new();
        for t in 0..connections {
            let (barrier, sqlite_turn) = (&barrier, &sqlite_turn);
            threads.push(s.spawn(move || -> anyhow::Result<()> {
                let mut conn = url.connect()?;
                let first = (t * rows_per_txn) as i64;
                let sqlite = conn.backend() == outbox::Backend::Sqlite;
                barrier.wait();
                for _ in 0..txns_per_thread {
                    let _turn = sqlite.then(|| sqlite_turn.lock().expect("turn lock"));
                    write_transaction(&mut conn, |c| -> QueryResult<()> {
                        for id in first..first + rows_per_txn as i64 {
                            update_row(c, id)?;
                        }
                        Ok(())
                    })
                    .context("reference update")?;
                }
                Ok(())
            }));
        }
        barrier.wait();
        let started = Instant::now();
        for thread in threads {
            thread
                .join()
                .map_err(|_| anyhow::anyhow!("a reference thread panicked"))??;
        }
        Ok(started.elapsed())
    })?;
    setup
        .batch_execute("DROP TABLE bench_ref")
        .context("dropping the reference table")?;
    Ok((txns_per_thread * rows) as f64 / elapsed.as_secs_f64())
}

/// `UPDATE bench_ref SET n = n + 1 WHERE id = ?` on the backend's own connection: fixed SQL
/// text with one bind, whose prepared statement diesel caches by that text, as it caches the
/// engine's own statements.
fn update_row(conn: &mut DbConnection, id: i64) -> QueryResult<usize> {
    match conn {
        DbConnection::Pg(c) => RowUpdate { id }.execute(c),
        DbConnection::Sqlite(c) => RowUpdate { id }.execute(c),
        #[cfg(feature = "mysql")]
        DbConnection::Mysql(c) => RowUpdate { id }.execute(c),
    }
}

/// The reference row update, as a query diesel caches by its SQL text.
struct RowUpdate {
    id: i64,
}

impl<DB: diesel::backend::Backend> QueryFragment<DB> for RowUpdate
where
    i64: diesel::serialize::ToSql<BigInt, DB>,
    DB: diesel::sql_types::HasSqlType<BigInt>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("UPDATE bench_ref SET n = n + 1 WHERE id = ");
        out.push_bind_param::<BigInt, _>(&self.id)
    }
}

impl QueryId for RowUpdate {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Conn> RunQueryDsl<Conn> for RowUpdate {}
