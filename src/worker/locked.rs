//! Lock claims ([`crate::ClaimStyle::Lock`], PostgreSQL): each chunk's tasks are locked in
//! the transaction that runs their handlers and marks them done, one row version per task.
//!
//! The claiming thread opens a transaction per chunk, locks the chunk's rows
//! (`FOR UPDATE SKIP LOCKED`) and hands the connection, transaction open, to a free pool
//! thread (there is no queue: a chunk never waits with its locks held; when every thread
//! is busy the claiming thread runs it itself; with domains, a chunk is locked for a domain
//! only when a thread it may take is free). The chunk commits its handlers' effects and
//! its completion together. If anything fails, it rolls back, releasing the locks, and its
//! tasks are claimed the stamping way and run one by one, as a failed chunk of stamped
//! claims is.

use std::sync::Mutex;
use std::time::Instant;

use super::claim::claimed_tasks;
use super::config::Settings;
use super::dispatch::Feed;
use super::domains::PlanLane;
use super::execute::ChunkRollback;
use super::fairness::{participants, Took};
use super::tally::{Outcome, Tally};
use super::watchdog::Hung;
use super::{millis, Worker};
use crate::db::transaction::{is_connection_error, mark_broken, roll_back_all, DiscardBroken};
use crate::db::{DbConnection, DbPool, PooledConnection};
use crate::driver::{driver, Claim, Due, LockHolder};
use crate::error::{OpContext, Result};
use crate::task::ClaimedTask;

/// A chunk locked by this node: the connection whose open transaction holds the locks, that
/// transaction, and the tasks.
pub(super) struct LockedChunk {
    conn: PooledConnection,
    holder: LockHolder,
    tasks: Vec<ClaimedTask>,
}

impl Worker {
    /// Locks chunks of up to `commit_batch` due tasks, at most `limit` tasks in all, and
    /// hands each to the pool as it is locked; stops at the first chunk that comes back
    /// short with one participant of the fair claim in it (nothing more is due; a chunk
    /// shared by several comes back short when one of them had less than its share), unless
    /// the claim's ring of tenants stopped before it came round (then it goes on from there,
    /// [`super::fairness::FairClaims::goes_on`]). Returns how many tasks it locked.
    pub(super) fn refill_locked<'s>(
        &'s self,
        feed: &Feed<'s>,
        tally: &'s Mutex<Tally>,
        lane: &PlanLane,
        limit: usize,
    ) -> Result<usize> {
        self.ensure_heartbeat_fresh()?;
        let mut claimed = 0;
        while claimed < limit && !self.is_stopping() {
            let want = self.settings.commit_batch.min(limit - claimed);
            let goes_on = || self.services.limits.fair.goes_on(&lane.keywords);
            let chunk = match self.lock_chunk(lane, want) {
                Ok(Some(chunk)) => chunk,
                // The claim's ring of tenants stopped short: it goes on from there.
                Ok(None) if goes_on() => continue,
                Ok(None) => break,
                // What was locked is running: report it; the next claim meets the error.
                Err(e) if claimed > 0 => {
                    log::debug!("locking a chunk failed after {claimed} tasks: {e}");
                    break;
                }
                Err(e) => return Err(e),
            };
            let n = chunk.tasks.len();
            let shared = participants(&chunk.tasks).len() >= 2;
            claimed += n;
            let record = self.recorder(n, tally);
            self.dispatcher.submit(feed, lane.lane, move || {
                super::record::record_or_unwind(
                    self,
                    n as u64,
                    || self.execute_locked(chunk),
                    &record,
                )
            });
            if n < want && !shared && !goes_on() {
                break;
            }
        }
        Ok(claimed)
    }

    /// Opens a transaction and locks up to `want` due tasks of `lane` in it; `None` when
    /// none is due.
    fn lock_chunk(&self, lane: &PlanLane, want: usize) -> Result<Option<LockedChunk>> {
        let keywords = &lane.keywords;
        if keywords.is_empty() {
            return Ok(None);
        }
        let mut conn = self.pool.get().op("task lock")?;
        let deadline = Instant::now() + lane.timeout;
        driver(&mut conn)
            .transaction_begin()
            .discard_broken(&mut conn)
            .op("task lock")?;
        let limit = i64::try_from(want).unwrap_or(i64::MAX);
        let limits = &self.services.limits;
        let limited = limits.tenants();
        let pick = limits.fair.next_pick(keywords, &limited);
        let due = Due {
            keywords,
            partition: self.services.strategy.partition(),
        };
        let asked = Instant::now();
        let locked = driver(&mut conn).task_lock_page(&due, &limited, &pick.as_pick(), limit);
        self.observers.claimed(asked);
        match locked {
            Ok((holder, picked)) if !picked.rows.is_empty() => {
                let tasks = claimed_tasks(picked.rows, self.node.id(), deadline);
                let took = Took {
                    page: &tasks,
                    weights: &picked.weights,
                    crowded: picked.crowded,
                    ring_end: picked.ring_end,
                    ring_cut: picked.ring_cut,
                    shared: picked.shared,
                    limit: want,
                };
                limits.fair.picked(keywords, &pick, took);
                Ok(Some(LockedChunk {
                    conn,
                    holder,
                    tasks,
                }))
            }
            Ok((_, picked)) => {
                let took = Took {
                    page: &[],
                    weights: &[],
                    crowded: picked.crowded,
                    ring_end: picked.ring_end,
                    ring_cut: picked.ring_cut,
                    shared: picked.shared,
                    limit: want,
                };
                limits.fair.picked(keywords, &pick, took);
                roll_back_all(&mut conn);
                Ok(None)
            }
            Err(e) => {
                if is_connection_error(&e) {
                    mark_broken(&mut conn);
                }
                roll_back_all(&mut conn);
                Err(e).op("task lock")
            }
        }
    }

    /// Runs a locked chunk's handlers in its transaction and marks the tasks done in it.
    pub(super) fn execute_locked(&self, chunk: LockedChunk) -> Vec<Outcome> {
        let LockedChunk {
            mut conn,
            holder,
            tasks,
        } = chunk;
        let handlers = tasks
            .iter()
            .map(|task| self.registry.get(&task.context.keyword))
            .collect::<Option<Vec<_>>>();
        let Some(handlers) = handlers.filter(|_| !self.is_stopping()) else {
            // Stopping, or (a bug) a keyword without a handler: none has run; the rollback
            // leaves the tasks as they were.
            roll_back_all(&mut conn);
            return vec![Outcome::Released; tasks.len()];
        };
        let owner = self.node.id();
        let ids: Vec<i64> = tasks.iter().map(|task| task.context.id).collect();
        let result = self.run_chunk(&mut conn, Some(holder), &tasks, &handlers, |conn| {
            driver(conn).task_complete_locked(owner, &ids)
        });
        drop(conn);
        match result {
            Ok(()) => {
                self.observers.all_done(&tasks);
                vec![Outcome::Done; tasks.len()]
            }
            // The connection failed at or after the completion: the commit may have happened
            // with its reply lost. The database knows whether the chunk's transaction did.
            Err(ChunkRollback::Database(_)) if self.xact_committed(holder.xact) => {
                log::warn!(
                    "a locked chunk of {} tasks found committed after a database error: its \
                     commit happened and the reply was lost",
                    tasks.len()
                );
                self.observers.all_done(&tasks);
                vec![Outcome::Done; tasks.len()]
            }
            Err(_) => self.rerun_stamped(&ids),
        }
    }

    /// Whether the transaction `xact` committed, asked on connections of the pool until one
    /// answers; while the server has not yet ended it (it may not have noticed its client's
    /// connection drop), asked again for up to 5 s. `false` when the database cannot say:
    /// the chunk's tasks then run again one by one, and those it did complete are no longer
    /// pending, so none runs twice.
    fn xact_committed(&self, xact: i64) -> bool {
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let mut dead_connections = self.settings.pool_size();
        loop {
            let Ok(mut conn) = self.pool.get() else {
                return false;
            };
            match driver(&mut conn).xact_committed(xact) {
                Ok(Some(committed)) => return committed,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) if is_connection_error(&e) && dead_connections > 0 => {
                    mark_broken(&mut conn);
                    dead_connections -= 1;
                }
                _ => return false,
            }
        }
    }

    /// After a locked chunk rolled back: claims its tasks the stamping way and runs them one
    /// by one, so that each records its own outcome. A task another node has locked or
    /// claimed meanwhile is that node's now (counted lost here).
    fn rerun_stamped(&self, ids: &[i64]) -> Vec<Outcome> {
        if self.is_stopping() {
            // Stopping (or the hang watchdog is about to exit): claimed now, they would be
            // left running for rescue to charge; they are pending as they are.
            return vec![Outcome::Released; ids.len()];
        }
        log::debug!(
            "a locked chunk of {} tasks rolled back; running them one by one",
            ids.len()
        );
        let claimed = self.ensure_heartbeat_fresh().and_then(|()| {
            let mut conn = self.pool.get().op("task claim")?;
            let deadline = Instant::now() + self.settings.claim_timeout();
            let rows = driver(&mut conn)
                .task_claim_ids(self.node.id(), ids, millis(self.settings.claim_timeout()))
                .discard_broken(&mut conn)
                .op("task claim")?;
            Ok(claimed_tasks(rows, self.node.id(), deadline))
        });
        match claimed {
            Ok(tasks) => {
                let mut outcomes: Vec<Outcome> =
                    tasks.iter().map(|task| self.execute_task(task)).collect();
                outcomes.resize(ids.len(), Outcome::Lost);
                outcomes
            }
            Err(e) => {
                log::warn!(
                    "a locked chunk of {} tasks rolled back and could not be claimed again: \
                     {e}; they stay pending",
                    ids.len()
                );
                vec![Outcome::Released; ids.len()]
            }
        }
    }
}

/// Counts a failure for the hung handler of a locked chunk before the process exits: ends
/// the chunk's transaction (terminating its backend) so that the failure can be written,
/// and the other tasks of the chunk are pending again, uncounted. Without this a task that
/// hangs every time would be retried without end: the exit rolls its attempt back.
pub(super) fn charge_hung(pool: &DbPool, settings: &Settings, hung: &Hung) {
    let Some(lock) = hung.lock else { return };
    let failures = lock.failures.saturating_add(1);
    let delay = settings
        .backoff
        .delay(failures.unsigned_abs(), fastrand::f64());
    let error = format!(
        "running past its deadline: its handler ran for {:?}, past the task timeout; the \
         node ended its chunk's transaction",
        hung.running_for
    );
    let claim = Claim {
        id: hung.task,
        owner: 0,
        token: lock.token,
    };
    let charged = pool.get().map_err(|e| e.to_string()).and_then(|mut conn| {
        let conn: &mut DbConnection = &mut conn;
        driver(conn)
            .task_charge_hung(
                lock.holder,
                &claim,
                &error,
                millis(delay),
                settings.max_attempts,
            )
            .map_err(|e| e.to_string())
    });
    match charged {
        Ok(n) => log::error!(
            "task {}: hung in a locked chunk; its transaction ended and {n} failure counted",
            hung.task
        ),
        Err(e) => log::error!(
            "task {}: hung in a locked chunk; its failure could not be counted: {e}",
            hung.task
        ),
    }
}
