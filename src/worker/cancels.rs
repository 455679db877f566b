//! Which running tasks were cancelled: the heartbeat asks, and sets their handlers' flags
//! ([`crate::TaskContext::is_cancelled`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::db::DbConnection;
use crate::driver::task_cancelled_among;
use crate::error::{OpContext, Result};
use crate::handler::TaskContext;

/// The cancel flags of the handlers running now, by task id.
#[derive(Debug, Default)]
pub(crate) struct CancelWatch {
    running: Mutex<HashMap<i64, Arc<AtomicBool>>>,
}

/// Watches one handler's task until dropped.
pub(crate) struct Watching<'w> {
    watch: &'w CancelWatch,
    id: i64,
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.watch.lock().remove(&self.id);
    }
}

impl CancelWatch {
    /// Notes that `task`'s handler runs, until the returned guard drops.
    pub(crate) fn watch(&self, task: &TaskContext) -> Watching<'_> {
        self.lock().insert(task.id, Arc::clone(&task.cancelled));
        Watching {
            watch: self,
            id: task.id,
        }
    }

    /// Asks the database which of the running tasks were cancelled, and flags them; one
    /// statement, none when nothing runs.
    pub(crate) fn refresh(&self, conn: &mut DbConnection) -> Result<()> {
        let ids: Vec<i64> = self.lock().keys().copied().collect();
        if ids.is_empty() {
            return Ok(());
        }
        let cancelled = task_cancelled_among(conn, &ids).op("task cancel check")?;
        let running = self.lock();
        for id in cancelled {
            if let Some(flag) = running.get(&id) {
                flag.store(true, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Arc<AtomicBool>>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
