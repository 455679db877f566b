//! The conformance suite: every behaviour runs against a fresh SQLite file and a fresh
//! PostgreSQL database (`name::sqlite`, `name::postgres`).

#[macro_use]
mod support;

mod batched;
mod cancel;
mod catalogue;
mod chain;
mod claim;
mod connect;
mod cron;
mod domain;
mod domain_admin;
mod enqueue;
mod execute;
mod fair;
mod fencing;
mod fleet;
mod heartbeat;
mod http;
mod lanes;
mod lock;
mod logs;
mod metrics;
mod on_dead;
mod ops;
mod proxy;
mod prune;
mod record;
mod relay;
mod reply;
mod rescue;
mod schema;
mod scrape;
mod shards;
mod siege;
mod signals;
mod strategy;
mod task_tx;
mod tenant;
mod web;

use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::prelude::*;
use outbox::{DbConnection, HandlerResult, Registry, TaskContext, TaskTx, Worker, WorkerConfig};
use support::TestDb;

/// A handler whose side-effect is one `test_ledger` row in the task's transaction.
pub fn write_ledger(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
    insert_ledger_row(task, tx.conn()?)?;
    Ok(())
}

/// The `test_ledger` row of `write_ledger`, on a connection.
pub fn insert_ledger_row(task: &TaskContext, conn: &mut DbConnection) -> QueryResult<usize> {
    diesel::sql_query(format!(
        "INSERT INTO test_ledger (task_id, note) VALUES ({}, 'ran')",
        task.id()
    ))
    .execute(conn)
}

/// What rescue and a re-claim by node 999 do to task `id`, on a connection of its own (so
/// that a running handler can do it to its own task): a new owner and a new token.
pub fn take_over(url: &outbox::DatabaseUrl, id: i64) {
    diesel::sql_query(format!(
        "UPDATE async_task SET owner = 999, claim_token = claim_token + 1 WHERE id = {id}"
    ))
    .execute(&mut url.connect().expect("connect"))
    .expect("take the task over");
}

/// A registry with `write_ledger` under `keyword`.
pub fn ledger_registry(keyword: &str) -> Registry {
    let mut registry = Registry::new();
    registry.register(keyword, write_ledger);
    registry
}

/// A registry with `write_ledger` under `keyword`, counting its calls in `calls`.
pub fn counted_ledger_registry(keyword: &str, calls: &std::sync::Arc<AtomicUsize>) -> Registry {
    let calls = std::sync::Arc::clone(calls);
    let mut registry = Registry::new();
    registry.register(
        keyword,
        move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            calls.fetch_add(1, Ordering::SeqCst);
            write_ledger(task, tx)
        },
    );
    registry
}

/// Five `ledger` tasks `1`…`5`; their ids, in order.
pub fn five_tasks(db: &TestDb) -> Vec<i64> {
    let tasks: Vec<outbox::NewTask> = (1..=5)
        .map(|n| outbox::NewTask::new("ledger", n.to_string()))
        .collect();
    outbox::enqueue_batch(&mut db.conn(), &tasks)
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect()
}

/// A small worker configuration for tests.
pub fn small_config() -> WorkerConfig {
    WorkerConfig::default().threads(2).queue(2).page_size(10)
}

/// A worker on `db` with `registry`.
pub fn worker(db: &TestDb, registry: Registry) -> Worker {
    Worker::new(&db.url, registry, small_config()).expect("worker")
}
