//! Enqueue: a producer records a task in its own business transaction.

use std::collections::HashMap;

use crate::db::DbConnection;
use crate::driver::{driver, Driver, InsertRow, TaskKey};
use crate::error::{Error, OpContext, Result};
use crate::task::{NewTask, Parent, DEFAULT_MAX_PAYLOAD_BYTES};

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
    #[cfg(feature = "mysql")]
    impl Sealed for diesel::mysql::MysqlConnection {}
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

#[cfg(feature = "mysql")]
impl EnqueueConnection for diesel::mysql::MysqlConnection {
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
        // Tenants' quota locks are taken in one order by the statement trigger
        // (migration 000009), so rows keep the batch's order: a parent named by key comes
        // before its child in the batch, and so gets the smaller id the chain requires.
        if tasks.iter().all(|t| t.parents.is_empty()) {
            return insert(driver, tasks, &rows);
        }
        // Children: the tasks and their links all or nothing, so that a parent that does
        // not exist leaves nothing written.
        let mut outcome = None;
        let done = driver.atomically(&mut |d| {
            let linked = insert(d, tasks, &rows).and_then(|r| link(d, tasks, &r).map(|()| r));
            let rollback = linked.is_err();
            outcome = Some(linked);
            if rollback {
                Err(diesel::result::Error::RollbackTransaction)
            } else {
                Ok(())
            }
        });
        match outcome {
            Some(Err(e)) => Err(e),
            Some(Ok(results)) => done.op("task enqueue").map(|()| results),
            None => Err(done.op("task enqueue").expect_err("atomically ran nothing")),
        }
    }
}

/// Inserts `rows` (the validated `tasks`, in order) and resolves every task's id.
fn insert(
    driver: &mut dyn Driver,
    tasks: &[NewTask],
    rows: &[InsertRow<'_>],
) -> Result<Vec<Enqueued>> {
    let created = match driver.task_insert_many(rows) {
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
        let keys: Vec<(&str, &str)> = missing
            .iter()
            .map(|&i| (tasks[i].keyword.as_str(), tasks[i].biz_id.as_str()))
            .collect();
        let existing = find(driver, &keys).op("task enqueue (duplicate lookup)")?;
        for index in missing {
            let task = &tasks[index];
            let id = existing
                .get(&(task.keyword.clone(), task.biz_id.clone()))
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

/// The ids of the existing tasks among `keys`.
fn find(
    driver: &mut dyn Driver,
    keys: &[(&str, &str)],
) -> diesel::QueryResult<HashMap<(String, String), i64>> {
    let keys: Vec<serde_json::Value> = keys
        .iter()
        .map(|(k, b)| serde_json::json!({"k": k, "b": b}))
        .collect();
    let found = driver.task_find_many(&serde_json::Value::Array(keys).to_string())?;
    Ok(found
        .into_iter()
        .map(|k| ((k.keyword, k.biz_id), k.id))
        .collect())
}

/// Links each task this enqueue created to its parents (a duplicate keeps the parents it
/// was created with): a parent named by key is looked up in the batch first, then in the
/// table; each must exist and be older than its child.
fn link(driver: &mut dyn Driver, tasks: &[NewTask], results: &[Enqueued]) -> Result<()> {
    let in_batch: HashMap<(&str, &str), i64> = tasks
        .iter()
        .zip(results)
        .map(|(t, r)| ((t.keyword.as_str(), t.biz_id.as_str()), r.id))
        .collect();
    let outside: Vec<(&str, &str)> = tasks
        .iter()
        .zip(results)
        .filter(|(_, r)| r.created)
        .flat_map(|(t, _)| &t.parents)
        .filter_map(|p| match p {
            Parent::Key(k, b) if !in_batch.contains_key(&(k.as_str(), b.as_str())) => {
                Some((k.as_str(), b.as_str()))
            }
            _ => None,
        })
        .collect();
    let found = if outside.is_empty() {
        HashMap::new()
    } else {
        find(driver, &outside).op("task enqueue (parent lookup)")?
    };
    let mut checked: HashMap<i64, bool> = HashMap::new();
    let mut links = Vec::new();
    for (task, result) in tasks.iter().zip(results).filter(|(_, r)| r.created) {
        let invalid = |reason: String| Error::InvalidTask {
            keyword: task.keyword.clone(),
            biz_id: task.biz_id.clone(),
            reason,
        };
        for parent in &task.parents {
            let id = match parent {
                Parent::Id(id) => {
                    let exists = match checked.get(id) {
                        Some(exists) => *exists,
                        None => {
                            let exists = driver
                                .task_get_claim(*id)
                                .op("task enqueue (parent lookup)")?
                                .is_some();
                            checked.insert(*id, exists);
                            exists
                        }
                    };
                    if !exists {
                        return Err(invalid(format!("its parent task {id} does not exist")));
                    }
                    *id
                }
                Parent::Key(k, b) => in_batch
                    .get(&(k.as_str(), b.as_str()))
                    .or_else(|| found.get(&(k.clone(), b.clone())))
                    .copied()
                    .ok_or_else(|| invalid(format!("its parent ({k}, {b}) does not exist")))?,
            };
            if id >= result.id {
                return Err(invalid(format!(
                    "its parent task {id} is not older than it (task {}): a parent is \
                     enqueued before its children",
                    result.id
                )));
            }
            links.push((result.id, id));
        }
    }
    if links.is_empty() {
        return Ok(());
    }
    // Each link locks its parent until the transaction ends: in parent order, so that two
    // producers naming the same parents wait for each other instead of deadlocking.
    links.sort_unstable_by_key(|&(child, parent)| (parent, child));
    driver
        .task_link_parents(&links)
        .op("task enqueue (parent link)")?;
    Ok(())
}

fn key_map(keys: &[TaskKey]) -> HashMap<(&str, &str), i64> {
    keys.iter()
        .map(|k| ((k.keyword.as_str(), k.biz_id.as_str()), k.id))
        .collect()
}
