//! What is in the table: tasks per keyword and state, the oldest due pending task, and
//! keywords that no registered handler serves. The domains' slot use, summed over the live
//! nodes, is [`crate::domain::admin::list`].

use serde::Serialize;

use crate::db::DbConnection;
use crate::driver::driver;
use crate::error::{OpContext, Result};
use crate::registry::Registry;

/// One keyword's tasks by state.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct KeywordStats {
    /// The keyword.
    pub keyword: String,
    /// Tasks waiting for their parent.
    pub blocked: i64,
    /// Tasks waiting to run (due or not).
    pub pending: i64,
    /// Of the pending tasks, those due now: the queue a worker would claim from.
    pub due: i64,
    /// Tasks claimed by a node.
    pub running: i64,
    /// Finished tasks.
    pub done: i64,
    /// Tasks that failed for good.
    pub dead: i64,
    /// Cancelled tasks.
    pub cancelled: i64,
    /// Seconds since the oldest due pending task became due; `None` when none is due.
    pub oldest_due_secs: Option<f64>,
    /// Whether a handler for this keyword is registered in this binary.
    pub served: bool,
}

/// Task statistics per keyword, sorted by keyword.
pub fn keyword_stats(conn: &mut DbConnection, registry: &Registry) -> Result<Vec<KeywordStats>> {
    let rows = driver(conn)
        .task_count_by_keyword_state()
        .op("task stats")?;
    let mut stats: Vec<KeywordStats> = Vec::new();
    for row in rows {
        if stats.last().map(|s| s.keyword.as_str()) != Some(row.keyword.as_str()) {
            stats.push(KeywordStats {
                served: registry.get(&row.keyword).is_some(),
                keyword: row.keyword.clone(),
                ..KeywordStats::default()
            });
        }
        let entry = stats.last_mut().expect("pushed above");
        match row.state.as_str() {
            "blocked" => entry.blocked = row.count,
            "pending" => entry.pending = row.count,
            "running" => entry.running = row.count,
            "done" => entry.done = row.count,
            "dead" => entry.dead = row.count,
            "cancelled" => entry.cancelled = row.count,
            other => log::warn!("unknown task state {other:?} in async_task"),
        }
        entry.due += row.due;
        if row.oldest_due_secs.is_some() {
            entry.oldest_due_secs = row.oldest_due_secs;
        }
    }
    Ok(stats)
}
