//! `outbox-fault`: the `outbox` CLI plus the fault suite's test handlers (`fault.*`). It
//! exists for the fault suite (`handlers/tests/fault/`), which starts it as real worker
//! processes and kills them; it is not meant for production.
//!
//! Every handler takes an optional `{"sleep_ms": N}` payload, so that kills land mid-work.
//! - `fault.ledger`: one `fault_ledger` row in the task's transaction (exactly once), with
//!   the number of the task's parents that were not done as the handler ran (`early`).
//! - `fault.external`: appends the task id to the file `$OUTBOX_FAULT_FILE`, outside the
//!   database (at least once). When it runs in a PostgreSQL transaction already open (a lock
//!   claim's chunk) the line also names that transaction (`ID XID`), so that the suite can
//!   tell the runs whose transaction rolled back from the one that committed.
//! - `fault.fail`: always fails. `fault.panic`: always panics.
//! - `fault.abort`: aborts the whole process. `fault.hang`: sleeps for an hour, outside SQL
//!   (an HTTP call that never returns). `fault.hang_sql`: hangs for an hour in its
//!   transaction: in a statement on PostgreSQL (`pg_sleep`) and MySQL (`SLEEP`), holding the
//!   write lock on SQLite.
//! - `fault.connect_late`: leaves a thread opening a connection to `$OUTBOX_FAULT_CONNECT_URL`,
//!   and returns once the file `$OUTBOX_FAULT_CONNECT_MARK` exists (the test's relay writes it
//!   when the thread's connection reaches it): the process then ends while the thread is
//!   inside the client library.
//! - `fault.order`: the demo's coupon: adds one to its order's `fault_orders.n` (the order
//!   is the task's biz_id), then writes its ledger row, in the task's transaction.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use diesel::sql_types::Text;
use diesel::{QueryableByName, RunQueryDsl};
use outbox::{DbConnection, HandlerResult, TaskContext, TaskTx};

#[derive(serde::Deserialize, Default)]
struct Payload {
    #[serde(default)]
    sleep_ms: u64,
}

fn pause(task: &TaskContext) -> anyhow::Result<()> {
    let payload: Payload = serde_json::from_str(task.payload_json()).unwrap_or_default();
    if payload.sleep_ms > 0 {
        std::thread::sleep(Duration::from_millis(payload.sleep_ms));
    }
    Ok(())
}

fn ledger(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
    pause(task)?;
    ledger_row(task, tx)
}

/// The task's `fault_ledger` row, in its transaction.
fn ledger_row(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
    let id = task.id();
    diesel::sql_query(format!(
        "INSERT INTO fault_ledger (task_id, early)
         SELECT {id}, count(*) FROM async_task_parent l JOIN async_task p ON p.id = l.parent_id
          WHERE l.child_id = {id} AND p.state <> 'done'"
    ))
    .execute(tx.conn()?)
    .context("writing the ledger row")?;
    Ok(())
}

/// The id of the transaction the handler runs in, if one is already open on PostgreSQL. It
/// never opens one: a strict-mode run of `fault.external` stays free of database work.
fn open_transaction_id(tx: &mut TaskTx) -> anyhow::Result<Option<String>> {
    #[derive(QueryableByName)]
    struct Xid {
        #[diesel(sql_type = Text)]
        xid: String,
    }
    if !tx.is_open() {
        return Ok(None);
    }
    match tx.conn()? {
        DbConnection::Pg(conn) => {
            let row: Xid = diesel::sql_query("SELECT pg_current_xact_id()::text AS xid")
                .get_result(conn)
                .context("reading the transaction id")?;
            Ok(Some(row.xid))
        }
        DbConnection::Sqlite(_) => Ok(None),
        // InnoDB gives a transaction an id only at its first write.
        #[cfg(feature = "mysql")]
        DbConnection::Mysql(_) => Ok(None),
    }
}

fn external(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
    // The transaction's id first, then the pause: a fault that lands in the pause still
    // finds the effect about to happen, as it does for a handler with no database work.
    let xid = open_transaction_id(tx)?;
    pause(task)?;
    let line = match xid {
        Some(xid) => format!("{} {xid}\n", task.id()),
        None => format!("{}\n", task.id()),
    };
    let path = std::env::var("OUTBOX_FAULT_FILE").context("OUTBOX_FAULT_FILE is not set")?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {path}"))?;
    // One write of one short line: O_APPEND makes it atomic between processes.
    file.write_all(line.as_bytes())
        .with_context(|| format!("appending to {path}"))?;
    Ok(())
}

fn fail(task: &TaskContext, _: &mut TaskTx) -> HandlerResult {
    pause(task)?;
    Err(anyhow::anyhow!("fault.fail always fails").into())
}

fn panic(task: &TaskContext, _: &mut TaskTx) -> HandlerResult {
    pause(task)?;
    panic!("fault.panic always panics");
}

fn abort(task: &TaskContext, _: &mut TaskTx) -> HandlerResult {
    pause(task)?;
    std::process::abort();
}

fn connect_late(_: &TaskContext, _: &mut TaskTx) -> HandlerResult {
    let env = |name: &str| std::env::var(name).with_context(|| format!("{name} is not set"));
    let url = outbox::DatabaseUrl::parse(&env("OUTBOX_FAULT_CONNECT_URL")?)?;
    let mark = std::path::PathBuf::from(env("OUTBOX_FAULT_CONNECT_MARK")?);
    std::thread::spawn(move || url.connect().map(drop));
    let waited = std::time::Instant::now();
    while !mark.exists() {
        if waited.elapsed() > Duration::from_secs(30) {
            return Err(anyhow::anyhow!("{} did not appear", mark.display()).into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn hang(task: &TaskContext, _: &mut TaskTx) -> HandlerResult {
    // Said on stderr, so that a scenario can signal the process once the handler runs.
    eprintln!("fault.hang: task {} started", task.id());
    std::thread::sleep(Duration::from_secs(3600));
    Ok(())
}

fn hang_sql(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
    pause(task)?;
    let sleep = match tx.conn()? {
        DbConnection::Pg(_) => "SELECT pg_sleep(3600)",
        #[cfg(feature = "mysql")]
        DbConnection::Mysql(_) => "SELECT SLEEP(3600)",
        // The transaction is open (BEGIN IMMEDIATE): the write lock is held while it sleeps.
        DbConnection::Sqlite(_) => {
            std::thread::sleep(Duration::from_secs(3600));
            return Ok(());
        }
    };
    diesel::sql_query(sleep)
        .execute(tx.conn()?)
        .context("sleeping in SQL")?;
    Ok(())
}

fn order(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
    pause(task)?;
    let order: i64 = task
        .biz_id()
        .parse()
        .context("an order's biz_id is its id")?;
    diesel::sql_query(format!(
        "UPDATE fault_orders SET n = n + 1 WHERE id = {order}"
    ))
    .execute(tx.conn()?)
    .context("updating the order")?;
    ledger_row(task, tx)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let mut registry = outbox_handlers::registry();
    registry
        .register("fault.ledger", ledger)
        .register("fault.external", external)
        .register("fault.fail", fail)
        .register("fault.panic", panic)
        .register("fault.abort", abort)
        .register("fault.connect_late", connect_late)
        .register("fault.hang", hang)
        .register("fault.hang_sql", hang_sql)
        .register("fault.order", order);
    outbox_handlers::main(registry)
}
