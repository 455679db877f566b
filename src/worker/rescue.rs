//! Rescue (seed 002's recovery): running tasks whose node stopped heartbeating, or that run
//! past their own deadline, go back to pending — or to dead at max attempts — counting a
//! failure, so that a task that kills its worker ends dead instead of looping.
//!
//! Every live node rescues, on a thread of its own every heartbeat interval (±10%, so that a
//! fleet does not rescue in step), and `drain` once at start. The rescue is one UPDATE whose
//! WHERE clause re-checks the conditions itself (never select-then-update), so concurrent
//! rescuers never rescue a task twice, and a node that recovers in the meantime keeps its
//! tasks. Each rescued task waits the retry backoff of its failure count, with the same
//! jitter as a handler's failure, so that a dead node's tasks do not all come due in the same
//! instant. A rescued task's late completion by its old owner is fenced out.

use super::observers::Observers;
use crate::db::transaction::DiscardBroken;
use crate::db::DbPool;
use crate::driver::{driver, RescueParams};
use crate::error::{OpContext, Result};

/// What a rescue pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RescueReport {
    /// Tasks put back to pending.
    pub pending: u64,
    /// Tasks that reached their max attempts and are now dead.
    pub dead: u64,
}

/// The rescue service of one worker.
pub(crate) struct Rescuer {
    pool: DbPool,
    params: RescueParams,
    observers: Observers,
}

impl Rescuer {
    pub(crate) fn new(pool: DbPool, params: RescueParams, observers: Observers) -> Self {
        Rescuer {
            pool,
            params,
            observers,
        }
    }

    /// Runs one rescue pass on a pooled connection.
    pub(crate) fn run_once(&self) -> Result<RescueReport> {
        let mut conn = self.pool.get().op("task rescue")?;
        let rows = driver(&mut conn)
            .task_rescue_many(&self.params)
            .discard_broken(&mut conn)
            .op("task rescue")?;
        self.observers.rescued(&rows);
        let mut report = RescueReport::default();
        for row in rows {
            log::warn!("task {}: {} → {}", row.id, row.reason, row.state);
            if row.state == "dead" {
                report.dead += 1;
            } else {
                report.pending += 1;
            }
        }
        Ok(report)
    }
}
