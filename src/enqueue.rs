//! Enqueue: a producer records a task in its own business transaction.

use std::collections::HashMap;

use crate::db::DbConnection;
use crate::driver::{driver, Driver, InsertRow, TaskKey};
use crate::error::{Error, OpContext, Result};
use crate::task::{NewTask, DEFAULT_MAX_PAYLOAD_BYTES};

/// A connection `enqueue` accepts: the caller's own `PgConnection`, `SqliteConnection`, or
/// [`DbConnection`] (a pooled one dereferences to it). Sealed: the engine's SQL is written
/// per backend.
pub trait EnqueueConnection: sealed::Sealed {
    #[doc(hidden)]
    fn driver(&mut self) -> &mut dyn Driver;
}

mod sealed {
    pub trait Sealed {}
    #[cfg(feature = "postgres")]
    impl Sealed for diesel::pg::PgConnection {}
    #[cfg(feature = "sqlite")]
    impl Sealed for diesel::sqlite::SqliteConnection {}
    impl Sealed for crate::db::DbConnection {}
}

#[cfg(feature = "postgres")]
impl EnqueueConnection for diesel::pg::PgConnection {
    fn driver(&mut self) -> &mut dyn Driver {
        self
    }
}

#[cfg(feature = "sqlite")]
impl EnqueueConnection for diesel::sqlite::SqliteConnection {
    fn driver(&mut self) -> &mut dyn Driver {
        self
    }
}

impl EnqueueConnection for DbConnection {
    fn driver(&mut self) -> &mut dyn Driver {
        driver(self)
    }
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Enqueued {
    /// The task's id: the new one, or the existing task's for a duplicate.
    pub id: i64,
    /// `true` when this call created the task; `false` when a task with the same
    /// `(keyword, biz_id)` already existed, in which case nothing was written.
    pub created: bool,
}

/// Settings of the producer side: [`EnqueueOptions::default`] and its setters.
///
/// ```
/// let options = outbox::EnqueueOptions::default().max_payload_bytes(4096);
/// assert_eq!(options.max_payload_bytes, 4096);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EnqueueOptions {
    /// The largest payload accepted, in bytes of JSON text as the database stores it (default
    /// and maximum [`DEFAULT_MAX_PAYLOAD_BYTES`], 64 KiB, the schema's own bound).
    pub max_payload_bytes: usize,
}

impl Default for EnqueueOptions {
    fn default() -> Self {
        EnqueueOptions {
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }
}

/// Enqueues one task with the default [`EnqueueOptions`]: see [`EnqueueOptions::enqueue`].
///
/// ```no_run
/// use diesel::prelude::*;
/// use diesel::pg::PgConnection;
/// use outbox::{enqueue, NewTask};
///
/// # fn place_order(conn: &mut PgConnection) -> anyhow::Result<()> {
/// conn.transaction(|conn| {
///     diesel::sql_query("INSERT INTO orders (id, user_id) VALUES (42, 7)").execute(conn)?;
///     let task = NewTask::new("points.credit", "42").payload(&serde_json::json!({"user_id": 7}));
///     let enqueued = enqueue(conn, &task)?;
///     println!("task {} created: {}", enqueued.id, enqueued.created);
///     Ok::<_, anyhow::Error>(())
/// })
/// # }
/// ```
pub fn enqueue<C: EnqueueConnection + ?Sized>(conn: &mut C, task: &NewTask) -> Result<Enqueued> {
    EnqueueOptions::default().enqueue(conn, task)
}

/// Enqueues many tasks at once with the default [`EnqueueOptions`]: see
/// [`EnqueueOptions::enqueue_batch`].
pub fn enqueue_batch<C: EnqueueConnection + ?Sized>(
    conn: &mut C,
    tasks: &[NewTask],
) -> Result<Vec<Enqueued>> {
    EnqueueOptions::default().enqueue_batch(conn, tasks)
}

impl EnqueueOptions {
    /// Sets the largest payload accepted, in bytes of JSON text as the database stores it: at
    /// most [`DEFAULT_MAX_PAYLOAD_BYTES`], which the schema enforces (a larger value is an
    /// [`Error::InvalidConfig`] at enqueue).
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Enqueues one task on `conn`, inside whatever transaction the caller has open.
    ///
    /// The task becomes visible to workers only when the caller's transaction commits, and
    /// disappears with it if it rolls back. Enqueueing an existing `(keyword, biz_id)` writes
    /// nothing and returns the existing task's id with `created: false`, so a side-effect keyed
    /// by business object can never be scheduled twice. Invalid input is an error and nothing
    /// is written. On PostgreSQL, a due task notifies idle workers when the caller commits.
    ///
    /// On SQLite, open the business transaction with `immediate_transaction` (or
    /// [`crate::db::write_transaction`]): a deferred transaction that reads and then writes can
    /// fail with `database is locked` whatever the busy timeout.
    pub fn enqueue<C: EnqueueConnection + ?Sized>(
        &self,
        conn: &mut C,
        task: &NewTask,
    ) -> Result<Enqueued> {
        let mut results = self.enqueue_batch(conn, std::slice::from_ref(task))?;
        Ok(results.pop().expect("one result per task"))
    }

    /// Enqueues many tasks at once; returns one [`Enqueued`] per task, in order.
    ///
    /// All or nothing: one statement on PostgreSQL; on SQLite statements of up to 256 rows
    /// inside one savepoint (or transaction, when the caller has none open).
    ///
    /// Every task is validated before anything is written: one invalid task fails the whole
    /// batch with that task's error. A `(keyword, biz_id)` that repeats inside the batch is
    /// created once; its later occurrences are reported as duplicates.
    pub fn enqueue_batch<C: EnqueueConnection + ?Sized>(
        &self,
        conn: &mut C,
        tasks: &[NewTask],
    ) -> Result<Vec<Enqueued>> {
        if self.max_payload_bytes > DEFAULT_MAX_PAYLOAD_BYTES {
            return Err(Error::InvalidConfig {
                setting: "max_payload_bytes",
                reason: format!(
                    "must be at most {DEFAULT_MAX_PAYLOAD_BYTES} (the schema's bound), not {}",
                    self.max_payload_bytes
                ),
            });
        }
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let driver = conn.driver();
        let stored_len =
            |json: &str, value: &serde_json::Value| driver.task_payload_len(json, value);
        let mut rows = Vec::with_capacity(tasks.len());
        for task in tasks {
            let payload = task.validate(self.max_payload_bytes, &stored_len)?;
            rows.push(InsertRow {
                k: &task.keyword,
                b: &task.biz_id,
                d: payload,
                t: task.tenant.as_deref(),
                p: task.priority,
                m: task.max_attempts,
                ms: i64::try_from(task.delay.as_millis()).unwrap_or(i64::MAX),
            });
        }
        // Rows of several tenants are inserted tenant by tenant (in each, in the batch's
        // order): the quota check locks each limited tenant in turn, and two producers that
        // took the same tenants' locks in opposite orders would deadlock.
        if rows.windows(2).any(|w| w[0].t != w[1].t) {
            rows.sort_by(|a, b| a.t.cmp(&b.t));
        }
        let created = match driver.task_insert_many(&rows) {
            Ok(created) => created,
            Err(e) => {
                let mut tenants: Vec<(String, i64)> = Vec::new();
                for tenant in tasks.iter().filter_map(|t| t.tenant.as_deref()) {
                    match tenants.iter_mut().find(|(t, _)| t == tenant) {
                        Some((_, n)) => *n += 1,
                        None => tenants.push((tenant.to_owned(), 1)),
                    }
                }
                let quota = crate::tenant::quota_exceeded(driver, &e, &tenants);
                return Err(quota.unwrap_or(Error::Database {
                    operation: "task enqueue",
                    source: e,
                }));
            }
        };

        let mut created_ids = key_map(&created);
        let mut results = Vec::with_capacity(tasks.len());
        let mut missing = Vec::new();
        for (index, task) in tasks.iter().enumerate() {
            match created_ids.remove(&(task.keyword.as_str(), task.biz_id.as_str())) {
                Some(id) => results.push(Some(Enqueued { id, created: true })),
                None => {
                    results.push(None);
                    missing.push(index);
                }
            }
        }
        if !missing.is_empty() {
            let keys: Vec<serde_json::Value> = missing
                .iter()
                .map(|&i| serde_json::json!({"k": tasks[i].keyword, "b": tasks[i].biz_id}))
                .collect();
            let keys_json = serde_json::Value::Array(keys).to_string();
            let existing = driver
                .task_find_many(&keys_json)
                .op("task enqueue (duplicate lookup)")?;
            let existing = key_map(&existing);
            for index in missing {
                let task = &tasks[index];
                let id = existing
                    .get(&(task.keyword.as_str(), task.biz_id.as_str()))
                    .copied()
                    // A duplicate inserted by a transaction this one cannot see (a
                    // REPEATABLE READ snapshot taken before it committed).
                    .ok_or(Error::Database {
                        operation: "task enqueue (duplicate lookup)",
                        source: diesel::result::Error::NotFound,
                    })?;
                results[index] = Some(Enqueued { id, created: false });
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every task resolved"))
            .collect())
    }
}

fn key_map(keys: &[TaskKey]) -> HashMap<(&str, &str), i64> {
    keys.iter()
        .map(|k| ((k.keyword.as_str(), k.biz_id.as_str()), k.id))
        .collect()
}
