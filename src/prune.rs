//! Pruning (`outbox prune`): deletes finished tasks older than a retention period, and the
//! rows of nodes that are gone, so that neither table keeps growing.
//!
//! Age is measured by the **database clock**: a task is old when
//! `finished_at < now() - older_than`. Only finished states are ever deleted (`done`, `dead`,
//! `cancelled`, or a subset of them); `pending`, `running` and `blocked` tasks are never
//! touched, whatever their times say (a dead task made pending again by a retry keeps its old
//! `finished_at`, and stays).
//!
//! Tasks go in batches of [`PruneParams::batch_size`] rows (default
//! [`DEFAULT_PRUNE_BATCH`]), each one `DELETE` in its own short transaction, so that a prune
//! of millions of rows never holds its locks (on SQLite, the database's single write lock)
//! for longer than one batch, and never writes one huge transaction to the WAL: workers keep
//! claiming and completing in between.
//!
//! - PostgreSQL: each batch deletes the oldest finished tasks through the partial index
//!   `async_task_finished_idx`, until a batch deletes fewer rows than the batch size. A batch
//!   skips rows another transaction has locked (`FOR UPDATE SKIP LOCKED`), so concurrent
//!   prunes do not wait for one another and a row being retried at that moment is left
//!   alone; it goes at the next prune.
//! - SQLite has no such index (every completion would have to update it; see
//!   `docs/notes/performance.md`), so prune walks the table by id, oldest first: each batch reads the next
//!   window of `batch_size` tasks after where the previous one stopped and deletes the old
//!   finished ones among them. The walk stops at the first window with no task created
//!   before the cutoff (ids follow creation time). A batch thus never reads more than
//!   `batch_size` rows under the write lock, and dead tasks kept by `--keep-dead` are read
//!   once per prune, not once per batch.
//!
//! Every worker process registers a row in `async_node`, so the node table grows by one row
//! per process start (one a minute with a cron-driven `drain`). A node's row is deleted when
//! no `running` task names it as owner and
//!
//! - it is `gone` (a clean exit) and was marked gone before the cutoff, or
//! - it is still `alive` but has not recorded a heartbeat since the cutoff **and** for at
//!   least [`NODE_SILENT_MIN_AGE`] (the process was killed without marking itself gone).
//!
//! The second rule's floor keeps `prune --older-than 0s` from deleting the row of a worker
//! that is running right now: a live node whose row disappears can no longer record its
//! heartbeat. Done and dead tasks keep their `owner` id after their node's row is deleted.
//!
//! Deleted rows become free space that PostgreSQL's autovacuum (tuned for `async_task` by the
//! migration `2026-11-22-000002_async_task_autovacuum`) and SQLite's free-page list hand to
//! later inserts; neither backend shrinks its files by itself (`VACUUM FULL` / `VACUUM`).

use std::time::{Duration, Instant};

use crate::db::{write_transaction, DbConnection};
use crate::driver::{driver, PruneBatch};
use crate::error::{Error, OpContext, Result};
use crate::task::TaskState;

/// Rows deleted per `DELETE` statement (and transaction) by default.
pub const DEFAULT_PRUNE_BATCH: usize = 10_000;

/// The largest batch size accepted.
pub const MAX_PRUNE_BATCH: usize = 1_000_000;

/// The longest retention period accepted (100 years): beyond it, `now() - older_than`
/// leaves the range of PostgreSQL's and SQLite's date arithmetic.
pub const MAX_PRUNE_OLDER_THAN: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// An `alive` node's row is pruned only when it has not recorded a heartbeat for at least
/// this long (as well as since the cutoff): one hour, far beyond any node's `--dead-after`,
/// so that the row of a worker that is still running is never deleted.
pub const NODE_SILENT_MIN_AGE: Duration = Duration::from_secs(3600);

/// The states a task can be pruned in: the finished ones.
pub const PRUNABLE_STATES: [TaskState; 3] =
    [TaskState::Done, TaskState::Dead, TaskState::Cancelled];

/// What to prune: built with [`PruneParams::new`] and its setters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneParams {
    /// The retention period: tasks that finished more than this long ago (by the database
    /// clock) are deleted, and so are nodes gone or silent for that long. Millisecond
    /// precision, at most [`MAX_PRUNE_OLDER_THAN`]. No default: deleting data takes an
    /// explicit age.
    pub older_than: Duration,
    /// The task states to delete, a non-empty subset of [`PRUNABLE_STATES`] (default: all
    /// three; [`PruneParams::keep_dead`] removes `dead`).
    pub states: Vec<TaskState>,
    /// Rows per `DELETE` statement and transaction, 1 to [`MAX_PRUNE_BATCH`] (default
    /// [`DEFAULT_PRUNE_BATCH`]).
    pub batch_size: usize,
}

impl PruneParams {
    /// Prune done, dead and cancelled tasks that finished more than `older_than` ago, in
    /// batches of [`DEFAULT_PRUNE_BATCH`].
    pub fn new(older_than: Duration) -> Self {
        PruneParams {
            older_than,
            states: PRUNABLE_STATES.to_vec(),
            batch_size: DEFAULT_PRUNE_BATCH,
        }
    }

    /// The same, but dead tasks are kept (for inspection and `retry`), however old.
    pub fn keep_dead(mut self) -> Self {
        self.states.retain(|s| *s != TaskState::Dead);
        self
    }

    /// Sets the rows per `DELETE` statement and transaction (1 to [`MAX_PRUNE_BATCH`]).
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.batch_size = rows;
        self
    }

    /// Sets the task states to delete (a non-empty subset of [`PRUNABLE_STATES`]).
    pub fn states(mut self, states: &[TaskState]) -> Self {
        self.states = states.to_vec();
        self
    }

    /// Fails with [`Error::InvalidConfig`] when a setting is out of range.
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox::prune::PruneParams;
    /// use outbox::TaskState;
    ///
    /// assert!(PruneParams::new(Duration::from_secs(7 * 86400)).validate().is_ok());
    /// let params = PruneParams::new(Duration::from_secs(60)).states(&[TaskState::Pending]);
    /// assert!(params.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_PRUNE_BATCH).contains(&self.batch_size) {
            return Err(Error::InvalidConfig {
                setting: "batch size",
                reason: format!(
                    "must be between 1 and {MAX_PRUNE_BATCH}, not {}",
                    self.batch_size
                ),
            });
        }
        if self.older_than > MAX_PRUNE_OLDER_THAN {
            return Err(Error::InvalidConfig {
                setting: "older-than",
                reason: format!(
                    "must be at most 100 years, not {}",
                    humantime::format_duration(self.older_than)
                ),
            });
        }
        if self.states.is_empty() {
            return Err(Error::InvalidConfig {
                setting: "states",
                reason: "must name at least one task state to delete".into(),
            });
        }
        if let Some(state) = self.states.iter().find(|s| !PRUNABLE_STATES.contains(s)) {
            return Err(Error::InvalidConfig {
                setting: "states",
                reason: format!(
                    "may only be finished ones (done, dead, cancelled), never {state} ones"
                ),
            });
        }
        Ok(())
    }
}

/// What a prune deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneReport {
    /// Done tasks deleted.
    pub done: u64,
    /// Dead tasks deleted.
    pub dead: u64,
    /// Cancelled tasks deleted.
    pub cancelled: u64,
    /// `async_node` rows deleted.
    pub nodes: u64,
    /// Batches (transactions) run on `async_task`.
    pub batches: u64,
    /// How long the prune took.
    pub elapsed: Duration,
}

impl PruneReport {
    /// Tasks deleted, in every state.
    pub fn tasks(&self) -> u64 {
        self.done + self.dead + self.cancelled
    }
}

/// Deletes the finished tasks and the nodes that `params` describes; see the
/// [module documentation](self) for what goes and what stays.
///
/// Settings are checked before anything is deleted ([`Error::InvalidConfig`]). Batches
/// already committed stay deleted if a later one fails; running the prune again continues
/// where it stopped.
///
/// ```no_run
/// use std::time::Duration;
/// use outbox::prune::{prune, PruneParams};
///
/// # fn main() -> outbox::Result<()> {
/// let url = outbox::DatabaseUrl::parse("postgres://outbox@localhost/app")?;
/// let mut conn = url.connect()?;
/// let report = prune(&mut conn, &PruneParams::new(Duration::from_secs(7 * 86400)))?;
/// println!("pruned {} tasks and {} nodes", report.tasks(), report.nodes);
/// # Ok(())
/// # }
/// ```
pub fn prune(conn: &mut DbConnection, params: &PruneParams) -> Result<PruneReport> {
    params.validate()?;
    let started = Instant::now();
    let older_than_ms = millis(params.older_than);
    let limit = i64::try_from(params.batch_size).expect("batch size checked above");
    let mut report = PruneReport::default();
    let mut after_id = 0;
    loop {
        let batch = PruneBatch {
            states: &params.states,
            older_than_ms,
            limit,
            after_id,
        };
        let pruned = write_transaction(conn, |conn| {
            driver(conn).task_prune_batch(&batch).op("task prune")
        })?;
        report.batches += 1;
        for (state, n) in &pruned.deleted {
            match state {
                TaskState::Done => report.done += n,
                TaskState::Dead => report.dead += n,
                TaskState::Cancelled => report.cancelled += n,
                other => unreachable!("prune deleted a task in state {other}"),
            }
        }
        log::debug!("prune batch {}: {:?}", report.batches, pruned.deleted);
        if !pruned.more {
            break;
        }
        after_id = pruned.resume_after;
    }
    let silent_ms = millis(NODE_SILENT_MIN_AGE);
    loop {
        let deleted = write_transaction(conn, |conn| {
            driver(conn)
                .node_prune_batch(older_than_ms, silent_ms, limit)
                .op("node prune")
        })?;
        report.nodes += deleted as u64;
        if deleted < params.batch_size {
            break;
        }
    }
    report.elapsed = started.elapsed();
    log::info!(
        "pruned {} task(s) ({} done, {} dead, {} cancelled; {} batch(es)) and {} node(s) in {:.2}s",
        report.tasks(),
        report.done,
        report.dead,
        report.cancelled,
        report.batches,
        report.nodes,
        report.elapsed.as_secs_f64()
    );
    Ok(report)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).expect("durations are checked to be at most 100 years")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_prune_every_finished_state() {
        let params = PruneParams::new(Duration::from_secs(60));
        assert_eq!(params.states, PRUNABLE_STATES.to_vec());
        assert_eq!(params.batch_size, DEFAULT_PRUNE_BATCH);
        assert!(params.validate().is_ok());
        assert_eq!(
            params.keep_dead().states,
            vec![TaskState::Done, TaskState::Cancelled]
        );
    }

    #[test]
    fn out_of_range_settings_are_refused() {
        let ok = PruneParams::new(Duration::ZERO);
        assert!(ok.validate().is_ok());
        let refused = |params: PruneParams, needle: &str| {
            let message = params.validate().expect_err(needle).to_string();
            assert!(message.contains(needle), "{message}");
        };
        refused(
            PruneParams {
                batch_size: 0,
                ..ok.clone()
            },
            "must be between 1 and 1000000, not 0",
        );
        refused(
            PruneParams {
                batch_size: MAX_PRUNE_BATCH + 1,
                ..ok.clone()
            },
            "batch size",
        );
        refused(
            PruneParams {
                older_than: MAX_PRUNE_OLDER_THAN + Duration::from_secs(1),
                ..ok.clone()
            },
            "at most 100 years",
        );
        refused(
            PruneParams {
                states: vec![],
                ..ok.clone()
            },
            "at least one task state",
        );
        for state in [TaskState::Pending, TaskState::Running, TaskState::Blocked] {
            refused(
                PruneParams {
                    states: vec![TaskState::Done, state],
                    ..ok.clone()
                },
                &format!("never {state} ones"),
            );
        }
    }
}
