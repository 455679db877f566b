//! One task, one transaction: the handler and the fenced completion commit together, or
//! neither does.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::engine::Worker;
use super::tally::Outcome;
use crate::db::transaction::{is_broken, is_connection_error, is_infrastructure, mark_broken};
use std::sync::Arc;

use super::lease::{next_run, ChunkLease};
use super::timeouts::{ChunkOf, Session, TimeoutWatch};
use crate::db::{DbConnection, PooledConnection};
use crate::driver::{driver, Claim, TxMark};
use crate::handler::{Handler, HandlerError, TaskTx};
use crate::task::ClaimedTask;

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
pub(super) enum ChunkRollback {
    /// A handler failed or panicked, or a claim was taken over.
    Task,
    /// The last handler started ran past its domain's timeout and was ended, its chunk with
    /// it: its task is the charge's (or rescue's, at its deadline), never run again here.
    Ended,
    Database(diesel::result::Error),
}

impl From<diesel::result::Error> for ChunkRollback {
    fn from(e: diesel::result::Error) -> Self {
        ChunkRollback::Database(e)
    }
}

impl Worker {
    /// Runs one claimed task to its outcome, counted in the metrics; with `release`, or held
    /// back (see [`Worker::held_back`]), gives it back unstarted.
    pub(crate) fn execute_task(&self, task: &ClaimedTask, release: bool) -> Outcome {
        let outcome = self.run_task(task, release);
        self.observers.finished(task, outcome);
        outcome
    }

    /// Runs one claimed task to its outcome.
    fn run_task(&self, task: &ClaimedTask, release: bool) -> Outcome {
        let claim = task.claim();
        if release || self.held_back(std::slice::from_ref(task)) {
            // Its handler never ran: nothing to note.
            return self.release(task, None);
        }
        let Some(handler) = self.registry.get(&task.context.keyword) else {
            // Only registered keywords are claimed; reaching this is a bug, not a task failure.
            log::error!(
                "task {}: no handler for {:?}",
                claim.id,
                task.context.keyword
            );
            return self.release(task, None);
        };
        let mut conn = match self.engine_conn() {
            Ok(conn) => conn,
            Err(e) => {
                log::warn!("task {}: no connection to run it: {e}", claim.id);
                return self.release(task, None);
            }
        };
        let mark = self.tx_mark();
        let timeout = self.timeout_of(&mut conn, task);
        // The handler opens the transaction if it touches the database (taking this
        // process's writer turn on SQLite); the completion then commits with its writes. If
        // it never does, the completion is one statement alone, under the turn.
        let mut tx = TaskTx::new(&mut conn, Some(&self.writer_turn)).marked(mark);
        let ended = Cell::new(false);
        let run = |tx: &mut TaskTx| -> Result<(), Rollback> {
            {
                let longer = self.past_task_timeout(timeout.map(|(_, limit, _)| limit));
                let _watch = self
                    .services
                    .watchdog
                    .watch(claim.id, task.failures, None, longer);
                let _cancel = self.services.cancels.watch(&task.context);
                let _timeout = timeout.map(|(lane, limit, backend)| {
                    let session = Session { mark, backend };
                    self.services
                        .timeouts
                        .watch(task, lane, limit, session, None)
                });
                let outcome = run_handler(handler, task, tx);
                ended.set(_timeout.as_ref().is_some_and(TimeoutWatch::ended));
                outcome.map_err(Rollback::Handler)?;
            }
            let _turn = (!tx.is_open()).then(|| self.writer_turn.take());
            tx.intact()?;
            match driver(tx.engine_conn()).task_complete(&claim)? {
                0 => Err(Rollback::Fenced),
                _ => Ok(()),
            }
        };
        let result = run(&mut tx);
        let result = tx.finish(result);
        let unavailable = tx.unavailable().map(str::to_owned);
        drop(tx);
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
        let connection_broke = is_broken(&mut conn);
        drop(conn);
        match result {
            Ok(()) => Outcome::Done,
            // Ended past its domain's timeout: the charge records it, or, should the charge
            // fail (a lock it waits for past its lock timeout), rescue at its deadline. Not
            // released: a task whose charge keeps failing would run for ever uncounted.
            Err(_) if ended.get() => {
                log::warn!("task {}: ended past its domain's timeout", claim.id);
                Outcome::Lost
            }
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
                self.release_noted(task, &format!("database unavailable: {why}"))
            }
            Err(Rollback::Handler(error)) if connection_broke => {
                log::warn!(
                    "task {}: the connection broke under its handler: {error}",
                    claim.id
                );
                self.release_noted(
                    task,
                    &format!("the connection broke while the handler ran: {error}"),
                )
            }
            Err(Rollback::Database(e)) if connection_broke || is_infrastructure(&e) => {
                log::warn!(
                    "task {}: database unavailable while running it: {e}",
                    claim.id
                );
                self.release_noted(task, &format!("database unavailable: {e}"))
            }
            Err(Rollback::Handler(error)) => self.fail(task, &error),
            // Anything else that failed in the task's transaction (a deferred constraint at
            // COMMIT, a transaction the handler left aborted, a serialization failure) is the
            // task's failure: counted, retried after a backoff, dead at max attempts.
            Err(Rollback::Database(e)) => self.fail(
                task,
                &HandlerError::retry(anyhow::anyhow!("the task's transaction failed: {e}")),
            ),
        }
    }
}

impl Worker {
    /// A connection of the pool for this node's work ([`super::heartbeat::node_conn`]).
    pub(super) fn engine_conn(&self) -> Result<PooledConnection, r2d2::Error> {
        super::heartbeat::node_conn(&self.pool, self.node.id())
    }

    /// The mark of a new transaction of this node on PostgreSQL (see
    /// [`crate::driver::Driver::transaction_begin`]), by which rescue and the domain
    /// watchdog end it; `None` on the other backends.
    pub(super) fn tx_mark(&self) -> Option<TxMark> {
        (self.url.backend() == crate::Backend::Postgres).then(|| TxMark {
            node: self.node.id(),
            run: next_run(),
        })
    }

    /// For a task of a domain with a timeout: its lane, the timeout and its connection's
    /// id (MySQL, one round trip, only for such domains).
    fn timeout_of(
        &self,
        conn: &mut DbConnection,
        task: &ClaimedTask,
    ) -> Option<(usize, std::time::Duration, Option<i32>)> {
        let (lane, limit) = self.watched(task)?;
        Some((lane, limit, backend_of(conn, task)))
    }

    /// Whether claimed `tasks` that have not started are to be given back rather than run: at
    /// a stop, or while one's domain or keyword is paused (their claims stopped; a pause
    /// stops what waits in the queue as well, and lets what runs finish).
    pub(super) fn held_back(&self, tasks: &[ClaimedTask]) -> bool {
        if self.is_stopping() {
            return true;
        }
        let domains = &self.services.domains;
        tasks
            .iter()
            .any(|task| domains.holds_back(&task.context.keyword))
    }

    /// How much longer than the task timeout a handler may run: its domain's timeout
    /// (`domain`) past it.
    fn past_task_timeout(&self, domain: Option<std::time::Duration>) -> std::time::Duration {
        domain.map_or(std::time::Duration::ZERO, |t| {
            t.saturating_sub(self.settings.task_timeout)
        })
    }

    /// How long `task`'s handler may run: its domain's timeout, or the task timeout.
    pub(super) fn own_timeout(&self, task: &ClaimedTask) -> std::time::Duration {
        self.watched(task)
            .map_or(self.settings.task_timeout, |(_, limit)| limit)
    }

    /// The lane of a task of a domain with a timeout, and the timeout.
    fn watched(&self, task: &ClaimedTask) -> Option<(usize, std::time::Duration)> {
        if !self.services.domains.watching() {
            return None;
        }
        let plan = self.services.domains.plan();
        match plan.watch_of(&task.context.keyword) {
            (lane, Some(limit)) => Some((lane, limit)),
            _ => None,
        }
    }

    /// Runs a chunk's handlers one after another in one transaction, then `complete` (the
    /// rows it marks done must be the whole chunk), and ends the transaction: committed if
    /// all of it succeeded, rolled back otherwise. `lease` is a lock claim's chunk, whose
    /// transaction is already open on `conn` with its mark; without it the transaction
    /// opens on first use. `ran` counts the handlers started (those whose effects may
    /// have happened).
    pub(super) fn run_chunk(
        &self,
        conn: &mut DbConnection,
        lease: Option<&ChunkLease>,
        chunk: &[ClaimedTask],
        handlers: &[&dyn Handler],
        ran: &Cell<usize>,
        complete: impl FnOnce(&mut DbConnection) -> diesel::QueryResult<usize>,
    ) -> Result<(), ChunkRollback> {
        let mark = match lease {
            Some(lease) => Some(lease.mark),
            None => self.tx_mark(),
        };
        let mut tx = match lease {
            Some(_) => TaskTx::opened(conn),
            None => TaskTx::new(conn, Some(&self.writer_turn)).marked(mark),
        };
        // What a handler's timeout ends besides it: the rest of its chunk (only looked at
        // for the domains with a timeout).
        let chunk_of = || match lease {
            Some(lease) => ChunkOf::Leased(lease.clone()),
            None => ChunkOf::Stamped(
                chunk
                    .iter()
                    .map(ClaimedTask::claim)
                    .collect::<Arc<[Claim]>>(),
            ),
        };
        let run = |tx: &mut TaskTx| -> Result<(), ChunkRollback> {
            for (task, handler) in chunk.iter().zip(handlers) {
                // Each handler is watched alone: the chunk's handlers run one after another.
                let watched = self.watched(task);
                let longer = self.past_task_timeout(watched.map(|(_, limit)| limit));
                let _watch =
                    self.services
                        .watchdog
                        .watch(task.context.id, task.failures, lease, longer);
                let _cancel = self.services.cancels.watch(&task.context);
                // For a domain with a timeout, the connection's id, which only MySQL has
                // (`Driver::backend_pid`): asking opens the transaction, so it is asked only
                // there (on SQLite it would hold the one write lock from here).
                let timeout = watched.map(|(lane, limit)| {
                    let backend = (self.url.backend() == crate::Backend::Mysql)
                        .then(|| tx.conn().ok().and_then(|conn| backend_of(conn, task)))
                        .flatten();
                    let session = Session { mark, backend };
                    (lane, limit, session)
                });
                let _timeout = timeout.map(|(lane, limit, session)| {
                    self.services
                        .timeouts
                        .watch(task, lane, limit, session, Some(chunk_of()))
                });
                ran.set(ran.get() + 1);
                let outcome = run_handler(*handler, task, tx);
                // Ended past its timeout, the chunk runs no more here: its other tasks are free.
                if _timeout.as_ref().is_some_and(TimeoutWatch::ended) {
                    return Err(ChunkRollback::Ended);
                }
                outcome.map_err(|_| ChunkRollback::Task)?;
            }
            match complete(tx.conn()?)? {
                n if n == chunk.len() => Ok(()),
                _ => Err(ChunkRollback::Task),
            }
        };
        let result = run(&mut tx);
        let result = tx.finish(result);
        drop(tx);
        // diesel marks a connection that failed inside a transaction; one that failed at
        // COMMIT or BEGIN is marked here, or the pool would hand it out again.
        if let Err(ChunkRollback::Database(e)) = &result {
            if is_connection_error(e) {
                mark_broken(conn);
            }
        }
        result
    }
}

/// The id of a task's connection (MySQL), for its domain's watchdog.
fn backend_of(conn: &mut DbConnection, task: &ClaimedTask) -> Option<i32> {
    driver(conn).backend_pid().unwrap_or_else(|e| {
        log::debug!("task {}: its backend is unknown: {e}", task.context.id);
        None
    })
}

/// Runs a task's handler, a panic caught as a retryable failure.
fn run_handler(
    handler: &dyn crate::handler::Handler,
    task: &ClaimedTask,
    tx: &mut TaskTx,
) -> Result<(), HandlerError> {
    match catch_unwind(AssertUnwindSafe(|| handler.handle(&task.context, tx))) {
        Ok(result) => result,
        Err(panic) => Err(HandlerError::retry(anyhow::anyhow!(
            "handler panicked: {}",
            panic_message(&*panic)
        ))),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)")
}
