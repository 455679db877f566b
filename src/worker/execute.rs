//! One task, one transaction: the handler and the fenced completion commit together, or
//! neither does.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use diesel::connection::TransactionManager;
use diesel::Connection;

use super::Worker;
use crate::db::{
    is_connection_error, is_infrastructure, mark_broken, DbConnection, DiscardBroken, TaskTx,
};
use crate::driver::{driver, Claim};
use crate::error::truncate;
use crate::registry::HandlerError;
use crate::task::ClaimedTask;
use crate::worker::config::MAX_ERROR_LEN;

/// How a task's attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The handler succeeded and the completion committed with its effects.
    Done,
    /// The handler failed; the task is pending again after a backoff.
    Retried,
    /// The handler failed permanently or at max attempts; the task is dead.
    Dead,
    /// The claim was taken over before the completion: effects rolled back, nothing written.
    Lost,
    /// Not run (shutdown) or not recorded (database error): back to pending, no failure.
    Released,
    /// The database could not be reached to record anything; rescue will recover it.
    Abandoned,
}

/// Why a task's transaction rolled back.
enum Rollback {
    Handler(HandlerError),
    Fenced,
    Database(diesel::result::Error),
}

impl From<diesel::result::Error> for Rollback {
    fn from(e: diesel::result::Error) -> Self {
        Rollback::Database(e)
    }
}

/// Why a chunk's transaction rolled back (batched mode).
enum ChunkRollback {
    /// A handler failed or panicked, or a claim was taken over.
    Task,
    Database(diesel::result::Error),
}

impl From<diesel::result::Error> for ChunkRollback {
    fn from(e: diesel::result::Error) -> Self {
        ChunkRollback::Database(e)
    }
}

/// Attempts at an engine write (failure, release) before the task is left to rescue.
const WRITE_ATTEMPTS: u32 = 5;
/// The first pause between two such attempts; it doubles each time.
const WRITE_RETRY_PAUSE: Duration = Duration::from_millis(20);

impl Worker {
    /// Runs one claimed task to its outcome.
    pub(crate) fn execute_task(&self, task: &ClaimedTask) -> Outcome {
        let claim = Claim {
            id: task.context.id,
            owner: task.owner,
            token: task.claim_token,
        };
        if self.is_stopping() {
            // Its handler never ran: nothing to note.
            return self.release(&claim, None);
        }
        let Some(handler) = self.registry.get(&task.context.keyword) else {
            // Only registered keywords are claimed; reaching this is a bug, not a task failure.
            log::error!(
                "task {}: no handler for {:?}",
                claim.id,
                task.context.keyword
            );
            return self.release(&claim, None);
        };
        let mut conn = match self.pool.get() {
            Ok(conn) => conn,
            Err(e) => {
                log::warn!("task {}: no connection to run it: {e}", claim.id);
                return self.release(&claim, None);
            }
        };
        let turn = self.write_turn();
        self.upkeep.started(claim.id, claim.token);
        // The handler opens the transaction if it touches the database; the completion then
        // commits with its writes. If it never does, the completion is one statement alone.
        let mut tx = TaskTx::new(&mut conn);
        let run = |tx: &mut TaskTx| -> Result<(), Rollback> {
            match catch_unwind(AssertUnwindSafe(|| handler.handle(&task.context, tx))) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(Rollback::Handler(e)),
                Err(panic) => {
                    return Err(Rollback::Handler(HandlerError::retry(anyhow::anyhow!(
                        "handler panicked: {}",
                        panic_message(&*panic)
                    ))))
                }
            }
            match driver(tx.engine_conn()).task_complete(&claim)? {
                0 => Err(Rollback::Fenced),
                _ => Ok(()),
            }
        };
        let result = run(&mut tx);
        let result = tx.finish(result);
        let unavailable = tx.unavailable().map(str::to_owned);
        drop(turn);
        self.upkeep.finished(claim.id, claim.token);
        // `finish` rolled back every level it found open. A connection that still reports
        // itself broken broke under the handler (server restart, killed backend): its error
        // is an infrastructure error, not the handler's. diesel marks such a connection so,
        // and the pool discards it.
        if let Err(Rollback::Database(e)) = &result {
            // A connection that failed outside a transaction (the completion on its own) is
            // not marked by diesel; mark it, or the pool would hand it out again.
            if is_connection_error(e) {
                mark_broken(&mut conn);
            }
        }
        let connection_broke =
            <DbConnection as Connection>::TransactionManager::is_broken_transaction_manager(
                &mut conn,
            );
        drop(conn);
        match result {
            Ok(()) => Outcome::Done,
            Err(Rollback::Fenced) => {
                log::warn!(
                    "task {}: its claim was taken over before completion; effects rolled back",
                    claim.id
                );
                Outcome::Lost
            }
            // The database, not the task, failed: no failure is counted. Its external effects
            // may have happened (a commit whose answer was lost), so the release is noted.
            // First: the handler could not open its transaction.
            Err(Rollback::Handler(_)) if unavailable.is_some() => {
                let why = unavailable.unwrap_or_default();
                log::warn!("task {}: could not open its transaction: {why}", claim.id);
                self.release_noted(&claim, &format!("database unavailable: {why}"))
            }
            Err(Rollback::Handler(error)) if connection_broke => {
                log::warn!(
                    "task {}: the connection broke under its handler: {error}",
                    claim.id
                );
                self.release_noted(
                    &claim,
                    &format!("the connection broke while the handler ran: {error}"),
                )
            }
            Err(Rollback::Database(e)) if connection_broke || is_infrastructure(&e) => {
                log::warn!(
                    "task {}: database unavailable while running it: {e}",
                    claim.id
                );
                self.release_noted(&claim, &format!("database unavailable: {e}"))
            }
            Err(Rollback::Handler(error)) => self.fail(task, &claim, &error),
            // Anything else that failed in the task's transaction (a deferred constraint at
            // COMMIT, a transaction the handler left aborted, a serialization failure) is the
            // task's failure: counted, retried after a backoff, dead at max attempts.
            Err(Rollback::Database(e)) => self.fail(
                task,
                &claim,
                &HandlerError::retry(anyhow::anyhow!("the task's transaction failed: {e}")),
            ),
        }
    }

    /// Runs a chunk of claimed tasks in one transaction and marks them done with one fenced
    /// UPDATE (batched mode, [`crate::WorkerConfig::commit_batch`]). If anything fails — a
    /// handler's error or panic, a claim taken over (fewer rows marked than claimed), the
    /// commit — the chunk rolls back as a whole and each of its tasks runs again in strict
    /// mode, which records that task's own outcome.
    pub(crate) fn execute_chunk(&self, chunk: Vec<ClaimedTask>) -> Vec<Outcome> {
        let strict = |chunk: &[ClaimedTask]| -> Vec<Outcome> {
            chunk.iter().map(|task| self.execute_task(task)).collect()
        };
        if chunk.len() < 2 || self.is_stopping() {
            return strict(&chunk);
        }
        let Some(handlers) = chunk
            .iter()
            .map(|task| self.registry.get(&task.context.keyword))
            .collect::<Option<Vec<_>>>()
        else {
            return strict(&chunk);
        };
        let Ok(mut conn) = self.pool.get() else {
            return strict(&chunk);
        };
        let claims: Vec<(i64, i64)> = chunk
            .iter()
            .map(|task| (task.context.id, task.claim_token))
            .collect();
        let owner = chunk[0].owner;
        let turn = self.write_turn();
        for task in &chunk {
            self.upkeep.started(task.context.id, task.claim_token);
        }
        let mut tx = TaskTx::new(&mut conn);
        let run = |tx: &mut TaskTx| -> Result<(), ChunkRollback> {
            for (task, handler) in chunk.iter().zip(&handlers) {
                match catch_unwind(AssertUnwindSafe(|| handler.handle(&task.context, tx))) {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) | Err(_) => return Err(ChunkRollback::Task),
                }
            }
            // The completion of several tasks must be all or nothing even when no handler
            // opened the transaction: one BEGIN per chunk.
            match driver(tx.conn()?).task_complete_many(owner, &claims)? {
                n if n == chunk.len() => Ok(()),
                _ => Err(ChunkRollback::Task),
            }
        };
        let result = run(&mut tx);
        let result = tx.finish(result);
        drop(turn);
        for task in &chunk {
            self.upkeep.finished(task.context.id, task.claim_token);
        }
        if let Err(ChunkRollback::Database(e)) = &result {
            if is_connection_error(e) {
                mark_broken(&mut conn);
            }
        }
        drop(conn);
        match result {
            Ok(()) => vec![Outcome::Done; chunk.len()],
            Err(_) => {
                log::debug!(
                    "a chunk of {} tasks rolled back; running them one by one",
                    chunk.len()
                );
                strict(&chunk)
            }
        }
    }

    /// Releases a task whose attempt the database interrupted, noting why in `last_error`.
    fn release_noted(&self, claim: &Claim, why: &str) -> Outcome {
        let note = truncate(&format!("released: {why}"), MAX_ERROR_LEN);
        self.release(claim, Some(&note))
    }

    /// Puts the task back to pending without a failure.
    fn release(&self, claim: &Claim, note: Option<&str>) -> Outcome {
        self.record(
            claim,
            "release",
            |c| driver(c).task_release(claim, note),
            Outcome::Released,
        )
    }

    /// Records a handler failure: the next attempt after a backoff, or dead.
    fn fail(&self, task: &ClaimedTask, claim: &Claim, error: &HandlerError) -> Outcome {
        let failures = task.failures.saturating_add(1);
        let max_attempts = task.max_attempts.unwrap_or(self.config.max_attempts);
        // The stored message is the handler's error chain, never the payload.
        let message = truncate(&error.to_string(), MAX_ERROR_LEN);
        if error.is_permanent() || failures >= max_attempts {
            log::warn!(
                "task {} ({} {}) is dead after {failures} attempt(s): {message}",
                claim.id,
                task.context.keyword,
                task.context.biz_id
            );
            self.record(
                claim,
                "task fail",
                |c| driver(c).task_fail_dead(claim, &message),
                Outcome::Dead,
            )
        } else {
            let delay = self.config.backoff.delay(failures as u32, fastrand::f64());
            let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
            log::info!(
                "task {} ({} {}) failed attempt {failures}, retry in {delay:?}: {message}",
                claim.id,
                task.context.keyword,
                task.context.biz_id
            );
            self.record(
                claim,
                "task fail",
                |c| driver(c).task_fail_retry(claim, &message, delay_ms),
                Outcome::Retried,
            )
        }
    }

    /// Runs a fenced engine write, retrying database errors with a fresh connection. One row
    /// touched → `success`; none → the claim was taken over (`Lost`); unreachable → left to
    /// rescue (`Abandoned`).
    fn record(
        &self,
        claim: &Claim,
        what: &str,
        write: impl Fn(&mut DbConnection) -> diesel::QueryResult<usize>,
        success: Outcome,
    ) -> Outcome {
        let mut pause = WRITE_RETRY_PAUSE;
        for attempt in 1..=WRITE_ATTEMPTS {
            let result = match self.pool.get() {
                Ok(mut conn) => {
                    let _turn = self.write_turn();
                    write(&mut conn)
                        .discard_broken(&mut conn)
                        .map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            };
            match result {
                Ok(0) => {
                    log::warn!("task {}: {what}: its claim was taken over", claim.id);
                    return Outcome::Lost;
                }
                Ok(_) => return success,
                Err(e) if attempt < WRITE_ATTEMPTS => {
                    log::warn!(
                        "task {}: {what} failed (attempt {attempt}), retrying: {e}",
                        claim.id
                    );
                    std::thread::sleep(pause);
                    pause *= 2;
                }
                Err(e) => {
                    log::error!(
                        "task {}: {what} failed {WRITE_ATTEMPTS} times, leaving it to rescue: {e}",
                        claim.id
                    );
                }
            }
        }
        Outcome::Abandoned
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)")
}
