//! Recording an outcome that does not commit with a handler: a failure (retry or dead), or
//! a release back to pending. Each is one fenced statement of its own, retried while the
//! database is unavailable, until the task's deadline.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::config::MAX_ERROR_LEN;
use super::engine::Worker;
use super::tally::Outcome;
use crate::db::transaction::DiscardBroken;
use crate::db::DbConnection;
use crate::driver::{driver, Claim};
use crate::error::truncate;
use crate::handler::HandlerError;
use crate::log_label::labelled;
use crate::task::ClaimedTask;

/// The first pause between two attempts at an engine write; it doubles each time.
const WRITE_RETRY_PAUSE: Duration = Duration::from_millis(20);
/// The longest pause between two attempts at an engine write.
const WRITE_RETRY_MAX_PAUSE: Duration = Duration::from_secs(2);

impl Worker {
    /// Releases a task whose attempt the database interrupted, noting why in `last_error`.
    pub(super) fn release_noted(&self, task: &ClaimedTask, why: &str) -> Outcome {
        let note = truncate(&format!("released: {why}"), MAX_ERROR_LEN);
        self.release(task, Some(&note))
    }

    /// Puts the task back to pending without a failure.
    pub(super) fn release(&self, task: &ClaimedTask, note: Option<&str>) -> Outcome {
        let claim = task.claim();
        self.record(
            task,
            "release",
            |c| driver(c).task_release(&claim, note),
            Outcome::Released,
        )
    }

    /// Records a handler failure: the next attempt after a backoff, or dead.
    pub(super) fn fail(&self, task: &ClaimedTask, error: &HandlerError) -> Outcome {
        let claim = task.claim();
        let failures = task.failures.saturating_add(1);
        let max_attempts = task.max_attempts.unwrap_or(self.settings.max_attempts);
        // The stored message is the handler's error chain, never the payload.
        let message = truncate(&error.to_string(), MAX_ERROR_LEN);
        if error.is_permanent() || failures >= max_attempts {
            log::warn!(
                "task {} ({} {}) is dead after {failures} attempt(s): {message}",
                claim.id,
                task.context.keyword,
                task.context.biz_id
            );
            let outcome = self.record(
                task,
                "task fail",
                |c| driver(c).task_fail_dead(&claim, &message),
                Outcome::Dead,
            );
            if outcome == Outcome::Dead {
                self.observers.dead(task, &message);
            }
            outcome
        } else {
            let delay = self
                .settings
                .backoff
                .delay(failures.unsigned_abs(), fastrand::f64());
            let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
            log::info!(
                "task {} ({} {}) failed attempt {failures}, retry in {delay:?}: {message}",
                claim.id,
                task.context.keyword,
                task.context.biz_id
            );
            self.record(
                task,
                "task fail",
                |c| driver(c).task_fail_retry(&claim, &message, delay_ms),
                Outcome::Retried,
            )
        }
    }

    /// Runs a fenced engine write. One row touched → `success`; none → the claim was taken
    /// over (`Lost`), unless the task is already done under this very claim (a completion
    /// whose reply the connection lost: `Done`).
    ///
    /// A write that fails (the database unreachable, SQLite's lock still taken) is retried
    /// with a fresh connection and a growing pause, until the task's deadline: an outage
    /// that ends before it charges the task nothing. Past the deadline any live node rescues
    /// the task (counting a failure), so the write is given up (`Abandoned`).
    fn record(
        &self,
        task: &ClaimedTask,
        what: &str,
        write: impl Fn(&mut DbConnection) -> diesel::QueryResult<usize>,
        success: Outcome,
    ) -> Outcome {
        let claim = task.claim();
        let mut pause = WRITE_RETRY_PAUSE;
        for attempt in 1.. {
            let result = match self.engine_conn() {
                Ok(mut conn) => {
                    let _turn = self.writer_turn.take();
                    match write(&mut conn).discard_broken(&mut conn) {
                        Ok(0) => Ok(self.after_fenced_out(&mut conn, &claim, what)),
                        Ok(_) => Ok(success),
                        Err(e) => Err(e.to_string()),
                    }
                }
                Err(e) => Err(e.to_string()),
            };
            let error = match result {
                Ok(outcome) => {
                    if attempt > 1 {
                        log::warn!("task {}: {what} recorded at attempt {attempt}", claim.id);
                    }
                    return outcome;
                }
                Err(error) => error,
            };
            if Instant::now() + pause >= task.deadline {
                log::error!(
                    "task {}: {what} failed {attempt} time(s) until the task's deadline, \
                     leaving it to rescue: {error}",
                    claim.id
                );
                return Outcome::Abandoned;
            }
            if attempt == 1 {
                log::warn!(
                    "task {}: {what} failed, retrying until it succeeds: {error}",
                    claim.id
                );
            } else {
                log::debug!(
                    "task {}: {what} failed (attempt {attempt}), retrying: {error}",
                    claim.id
                );
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(WRITE_RETRY_MAX_PAUSE);
        }
        unreachable!("the loop returns")
    }

    /// Runs `write` on a connection of the pool, again with a fresh connection and a growing
    /// pause while it fails, until it succeeds or the next attempt would end after
    /// `deadline` (then the last error): how an engine write outlives a database outage
    /// that ends before the work's deadline.
    pub(super) fn retry_until<T>(
        &self,
        what: &str,
        deadline: Instant,
        write: impl Fn(&mut DbConnection) -> diesel::QueryResult<T>,
    ) -> Result<T, String> {
        let mut pause = WRITE_RETRY_PAUSE;
        for attempt in 1.. {
            let error = match self.conn_until(deadline) {
                Ok(mut conn) => match write(&mut conn).discard_broken(&mut conn) {
                    Ok(value) => {
                        if attempt > 1 {
                            log::warn!("{what} succeeded at attempt {attempt}");
                        }
                        return Ok(value);
                    }
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            if Instant::now() + pause >= deadline {
                return Err(error);
            }
            if attempt == 1 {
                log::warn!("{what} failed, retrying until it succeeds: {error}");
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(WRITE_RETRY_MAX_PAUSE);
        }
        unreachable!("the loop returns")
    }

    /// A connection of the pool for work due by `deadline`: its checkout waits no longer than
    /// the time left, or a second once it is past (a database that refuses connections would
    /// hold each attempt for the pool's whole checkout timeout; a connection to open again
    /// needs a moment).
    fn conn_until(&self, deadline: Instant) -> Result<crate::db::PooledConnection, r2d2::Error> {
        let left = deadline.saturating_duration_since(Instant::now());
        super::heartbeat::node_conn_within(
            &self.pool,
            self.node.id(),
            left.max(Duration::from_secs(1)),
        )
    }

    /// Whether the task of `claim` is done under that very claim, on a connection of the pool
    /// taken by `deadline` (`false` when the database cannot say).
    pub(super) fn is_done_under(&self, claim: &Claim, deadline: Instant) -> bool {
        let Ok(mut conn) = self.conn_until(deadline) else {
            return false;
        };
        done_under(&mut conn, claim).discard_broken(&mut conn) == Ok(true)
    }

    /// What a fenced write that touched no row means: the claim was taken over, or the task
    /// is already done under this claim (its completion committed and the reply was lost).
    fn after_fenced_out(&self, conn: &mut DbConnection, claim: &Claim, what: &str) -> Outcome {
        if done_under(conn, claim) == Ok(true) {
            log::warn!(
                "task {}: {what} found it done under this claim: its completion committed \
                 and the reply was lost",
                claim.id
            );
            Outcome::Done
        } else {
            log::warn!("task {}: {what}: its claim was taken over", claim.id);
            Outcome::Lost
        }
    }
}

/// Whether the task of `claim` is done under that very claim.
pub(super) fn done_under(conn: &mut DbConnection, claim: &Claim) -> diesel::QueryResult<bool> {
    Ok(matches!(
        driver(conn).task_get_claim(claim.id)?,
        Some(now) if now.state == "done"
            && now.owner == Some(claim.owner)
            && now.claim_token == claim.token
    ))
}

/// Runs a unit of work and records its outcomes; if it panics outside the handlers (which are
/// caught), its tasks leave the in-flight count before the panic goes on (rescue recovers
/// them).
pub(super) fn record_or_unwind(
    worker: &Worker,
    n: u64,
    work: impl FnOnce() -> Vec<Outcome>,
    record: &impl Fn(&[Outcome]),
) {
    // On the shared pool of a fleet, the task's lines name its database.
    let _label = labelled(worker.label.as_ref());
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        Ok(outcomes) => record(&outcomes),
        Err(panic) => {
            worker.in_flight.fetch_sub(n, Ordering::Relaxed);
            std::panic::resume_unwind(panic);
        }
    }
}
