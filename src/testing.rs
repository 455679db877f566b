//! Helpers for testing code that uses outbox (cargo feature `testing`): unit-test one handler
//! on a test connection, drain a test database until nothing is due, and assert that a task
//! was enqueued.
//!
//! ```
//! use diesel::prelude::*;
//! use outbox::testing::{assert_enqueued, run_handler, task_context};
//! use outbox::{enqueue, HandlerResult, NewTask, TaskContext, TaskTx};
//!
//! // The handler under test: one ledger row in the task's transaction.
//! fn credit(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
//!     #[derive(serde::Deserialize)]
//!     struct Order { points: i64 }
//!     let order: Order = task.payload()?;
//!     diesel::sql_query("INSERT INTO ledger (order_id, points) VALUES (?, ?)")
//!         .bind::<diesel::sql_types::Text, _>(task.biz_id())
//!         .bind::<diesel::sql_types::BigInt, _>(order.points)
//!         .execute(tx.conn()?)?;
//!     Ok(())
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = std::env::temp_dir().join(format!("outbox-testing-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # let path = dir.join("test.db");
//! # let _ = std::fs::remove_file(&path);
//! let url = outbox::DatabaseUrl::parse(path.to_str().unwrap())?;
//! let mut conn = url.connect()?;
//! outbox::run_migrations(&mut conn)?;
//! diesel::sql_query("CREATE TABLE ledger (order_id TEXT, points INTEGER)").execute(&mut conn)?;
//!
//! // One handler, on a task built by hand: its writes commit when it succeeds.
//! let task = task_context("points.credit", "42").payload(&serde_json::json!({"points": 120})).build();
//! run_handler(&credit, &task, &mut conn).map_err(|e| e.to_string())?;
//!
//! // What a producer enqueued, as stored.
//! enqueue(&mut conn, &NewTask::new("points.credit", "43").payload(&serde_json::json!({"points": 7})))?;
//! let stored = assert_enqueued(&mut conn, "points.credit", "43");
//! assert_eq!(stored.payload["points"], 7);
//!
//! // A worker with these handlers, until nothing is due.
//! let mut registry = outbox::Registry::new();
//! registry.register("points.credit", credit);
//! let tally = outbox::testing::drain(&url, registry)?;
//! assert_eq!(tally.done, 1);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```

use serde::Serialize;

use crate::db::{DatabaseUrl, DbConnection};
use crate::driver::driver;
use crate::error::{OpContext, Result};
use crate::handler::{Handler, HandlerError, HandlerResult, TaskContext, TaskTx};
use crate::registry::Registry;
use crate::task::TaskState;
use crate::worker::{Tally, Worker, WorkerConfig};

/// Starts a [`TaskContext`] for `keyword` and `biz_id`: id 1, first attempt, no tenant, an
/// empty object as payload.
pub fn task_context(keyword: &str, biz_id: &str) -> TaskContextBuilder {
    TaskContextBuilder(TaskContext {
        id: 1,
        keyword: keyword.to_owned(),
        biz_id: biz_id.to_owned(),
        tenant: None,
        attempt: 1,
        payload: "{}".to_owned(),
        cancelled: std::sync::Arc::default(),
    })
}

/// Builds a [`TaskContext`] for a handler's unit test: see [`task_context`].
#[derive(Debug, Clone)]
pub struct TaskContextBuilder(TaskContext);

impl TaskContextBuilder {
    /// Sets the task id.
    pub fn id(mut self, id: i64) -> Self {
        self.0.id = id;
        self
    }

    /// Sets the payload by serialising `value` to JSON.
    pub fn payload<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        self.0.payload = serde_json::to_string(value).expect("the payload serialises");
        self
    }

    /// Sets the payload as JSON text, as stored (not checked).
    pub fn payload_json(mut self, json: &str) -> Self {
        self.0.payload = json.to_owned();
        self
    }

    /// Sets the tenant.
    pub fn tenant(mut self, tenant: &str) -> Self {
        self.0.tenant = Some(tenant.to_owned());
        self
    }

    /// Sets which attempt this is (1 the first time).
    pub fn attempt(mut self, attempt: i32) -> Self {
        self.0.attempt = attempt;
        self
    }

    /// Marks the task cancelled, as a worker does when the task is cancelled while its handler
    /// runs ([`TaskContext::is_cancelled`]).
    pub fn cancelled(self) -> Self {
        self.0
            .cancelled
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// The context.
    pub fn build(self) -> TaskContext {
        self.0
    }
}

/// Runs `handler` on `task` as a worker would, on `conn`: its writes through `tx.conn()`
/// commit when it returns `Ok` and roll back when it fails or panics (a panic is returned as
/// a retryable error). There is no task row, so there is no completion to record.
pub fn run_handler(
    handler: &impl Handler,
    task: &TaskContext,
    conn: &mut DbConnection,
) -> HandlerResult {
    let mut tx = TaskTx::new(conn, None);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        handler.handle(task, &mut tx)
    }))
    .unwrap_or_else(|_| Err(HandlerError::retry(anyhow::anyhow!("handler panicked"))));
    tx.finish(result)
}

/// Runs a worker with `registry`'s handlers on `url` until nothing is due (one thread, so
/// tasks run in claim order), and returns what it did. Retries scheduled by a failure wait
/// for their backoff, so they are not run by the same drain.
pub fn drain(url: &DatabaseUrl, registry: Registry) -> Result<Tally> {
    let worker = Worker::new(url, registry, WorkerConfig::default().threads(1).queue(1))?;
    Ok(worker.drain()?.tally)
}

/// A task as stored, for assertions.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoredTask {
    /// The task's id.
    pub id: i64,
    /// Its state.
    pub state: TaskState,
    /// Its payload.
    pub payload: serde_json::Value,
    /// Its tenant.
    pub tenant: Option<String>,
    /// Its priority.
    pub priority: i32,
    /// Failures recorded.
    pub failures: i32,
    /// The last error recorded.
    pub last_error: Option<String>,
}

/// The task `(keyword, biz_id)` as stored, if there is one (in `conn`'s transaction, if one
/// is open: a producer's uncommitted enqueue is visible to it).
pub fn find_task(
    conn: &mut DbConnection,
    keyword: &str,
    biz_id: &str,
) -> Result<Option<StoredTask>> {
    let row = driver(conn)
        .task_get_by_key(keyword, biz_id)
        .op("task get")?;
    Ok(row.map(|row| StoredTask {
        id: row.id,
        state: row.state.parse().unwrap_or(TaskState::Pending),
        payload: serde_json::from_str(&row.biz_data).unwrap_or(serde_json::Value::Null),
        tenant: row.tenant,
        priority: row.priority,
        failures: row.failures,
        last_error: row.last_error,
    }))
}

/// The task `(keyword, biz_id)` as stored.
///
/// # Panics
///
/// When there is no such task, naming it; or when the database cannot be read.
#[track_caller]
pub fn assert_enqueued(conn: &mut DbConnection, keyword: &str, biz_id: &str) -> StoredTask {
    match find_task(conn, keyword, biz_id) {
        Ok(Some(task)) => task,
        Ok(None) => panic!("no task {keyword} {biz_id} was enqueued"),
        Err(e) => panic!("cannot look for task {keyword} {biz_id}: {e}"),
    }
}
