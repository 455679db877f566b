//! Which running tasks were cancelled: the heartbeat asks, and sets their handlers' flags
//! ([`crate::TaskContext::is_cancelled`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::db::DbConnection;
use crate::driver::task_cancelled_among;
use crate::error::{OpContext, Result};
use crate::handler::TaskContext;

/// The cancel flags of the handlers running now, each under a number of its own: two runs of
/// one task on this node (a retried task claimed again while its cancelled run, which
/// ignored its flag, still runs) are watched apart, and the first to end leaves the other's.
#[derive(Debug, Default)]
pub(crate) struct CancelWatch {
    running: Mutex<HashMap<u64, (i64, Arc<AtomicBool>)>>,
    runs: AtomicU64,
}

/// Watches one handler's task until dropped.
pub(crate) struct Watching<'w> {
    watch: &'w CancelWatch,
    key: u64,
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.watch.lock().remove(&self.key);
    }
}

impl CancelWatch {
    /// Notes that `task`'s handler runs, until the returned guard drops.
    pub(crate) fn watch(&self, task: &TaskContext) -> Watching<'_> {
        let key = self.runs.fetch_add(1, Ordering::Relaxed);
        self.lock()
            .insert(key, (task.id, Arc::clone(&task.cancelled)));
        Watching { watch: self, key }
    }

    /// Asks the database which of the running tasks were cancelled, and flags them; one
    /// statement, none when nothing runs.
    pub(crate) fn refresh(&self, conn: &mut DbConnection) -> Result<()> {
        let mut ids: Vec<i64> = self.lock().values().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return Ok(());
        }
        let cancelled = task_cancelled_among(conn, &ids).op("task cancel check")?;
        for (id, flag) in self.lock().values() {
            if cancelled.contains(id) {
                flag.store(true, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (i64, Arc<AtomicBool>)>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
