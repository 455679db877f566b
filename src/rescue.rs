//! Rescue (seed 002's recovery): running tasks whose node stopped heartbeating, or that run
//! past their own deadline, go back to pending — or to dead at max attempts — counting a
//! failure, so that a task that kills its worker ends dead instead of looping.
//!
//! Any live node rescues, periodically; `drain` also rescues once at start. The rescue is one
//! UPDATE whose WHERE clause re-checks the conditions itself (never select-then-update), so
//! concurrent rescuers never rescue a task twice, and a node that recovers in the meantime
//! keeps its tasks. A rescued task's late completion by its old owner is fenced out.

use crate::db::{DbPool, DiscardBroken};
use crate::driver::{driver, RescueParams};
use crate::error::{OpContext, Result};

/// What a rescue pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RescueReport {
    /// Tasks put back to pending.
    pub pending: u64,
    /// Tasks that reached their max attempts and are now dead.
    pub dead: u64,
}

/// Runs one rescue pass on a pooled connection.
pub(crate) fn rescue_once(pool: &DbPool, params: &RescueParams) -> Result<RescueReport> {
    let mut conn = pool.get().op("task rescue")?;
    let rows = driver(&mut conn)
        .task_rescue_many(params)
        .discard_broken(&mut conn)
        .op("task rescue")?;
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
