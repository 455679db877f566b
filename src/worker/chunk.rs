//! A batched chunk's path: its tasks run in one transaction and are completed together;
//! after a rollback, each still held runs again alone ([`Worker::run_chunk`] runs the
//! handlers).

use std::cell::Cell;
use std::time::Instant;

use super::engine::Worker;
use super::execute::ChunkRollback;
use super::record::done_under;
use super::settings::millis;
use super::tally::Outcome;
use crate::driver::driver;
use crate::task::ClaimedTask;

/// What a task whose handler ran in a chunk that rolled back says in `last_error` when it
/// runs again alone: its effects outside the database may happen twice.
const RAN_IN_A_ROLLED_BACK_CHUNK: &str =
    "run again alone: its chunk rolled back after its handler ran";

impl Worker {
    /// Runs a chunk of claimed tasks in one transaction and marks them done with one fenced
    /// UPDATE (batched mode, [`crate::WorkerConfig::commit_batch`]). If anything fails — a
    /// handler's error or panic, a claim taken over (fewer rows marked than claimed), the
    /// commit — the chunk rolls back as a whole and each of its tasks runs again in strict
    /// mode, which records that task's own outcome.
    ///
    /// With `release`, each task is given back unstarted; when one of its tasks is held back
    /// (see [`Worker::held_back`]), the tasks run one by one, and those held back are given
    /// back.
    pub(crate) fn execute_chunk(&self, chunk: Vec<ClaimedTask>, release: bool) -> Vec<Outcome> {
        let strict = |chunk: &[ClaimedTask]| -> Vec<Outcome> {
            chunk
                .iter()
                .map(|task| self.execute_task(task, release))
                .collect()
        };
        // After the chunk rolled back, each task runs again alone only if this node still
        // holds its claim: one cancelled, charged by the domain watchdog, released with its
        // chunk or rescued meanwhile is not run again here.
        // A task whose handler ran in the chunk is noted as running again (its effects
        // outside the database may happen twice), in the statement that checks its claim.
        let ran = Cell::new(0);
        // Each is held first, with a deadline for the runs alone up to its own (the chunk's
        // may be near, spent by the chunk); one `ended` past its domain's timeout is the
        // charge's, not run again.
        let still_held = |chunk: &[ClaimedTask], ended: Option<usize>| -> Vec<Outcome> {
            let mut runs = 0;
            let held: Vec<Hold> = (0..chunk.len())
                .map(|at| {
                    if Some(at) == ended {
                        return Hold::TakenOver;
                    }
                    runs += 1;
                    self.holds(&chunk[at], at < ran.get(), runs)
                })
                .collect();
            chunk
                .iter()
                .zip(held)
                .enumerate()
                .map(|(at, (task, held))| {
                    if matches!(held, Hold::TakenOver) && Some(at) != ended {
                        log::warn!(
                            "task {}: its claim was taken over before its chunk's rerun",
                            task.context.id
                        );
                    }
                    self.rerun_held(task, held)
                })
                .collect()
        };
        if release || chunk.len() < 2 || self.held_back(&chunk) {
            return strict(&chunk);
        }
        let Some(handlers) = chunk
            .iter()
            .map(|task| self.registry.get(&task.context.keyword))
            .collect::<Option<Vec<_>>>()
        else {
            return strict(&chunk);
        };
        let Ok(mut conn) = self.engine_conn() else {
            return strict(&chunk);
        };
        let claims: Vec<(i64, i64)> = chunk.iter().map(ClaimedTask::id_token).collect();
        let owner = chunk[0].owner;
        // The completion of several tasks must be all or nothing even when no handler opened
        // the transaction: one BEGIN per chunk.
        let result = self.run_chunk(&mut conn, None, &chunk, &handlers, &ran, |conn| {
            driver(conn).task_complete_many(owner, &claims)
        });
        let strict = still_held;
        drop(conn);
        match result {
            Ok(()) => {
                self.observers.all_done(&chunk);
                vec![Outcome::Done; chunk.len()]
            }
            // The connection failed at or after the chunk's completion: the commit may have
            // happened with its reply lost. The chunk is all or nothing, so one task tells.
            Err(ChunkRollback::Database(_))
                if self.is_done_under(&chunk[0].claim(), chunk[0].deadline) =>
            {
                log::warn!(
                    "a chunk of {} tasks found done under its claims after a database error: \
                     its commit happened and the reply was lost",
                    chunk.len()
                );
                self.observers.all_done(&chunk);
                vec![Outcome::Done; chunk.len()]
            }
            Err(rollback) => {
                log::debug!(
                    "a chunk of {} tasks rolled back; running them one by one",
                    chunk.len()
                );
                let ended = matches!(rollback, ChunkRollback::Ended).then(|| ran.get() - 1);
                strict(&chunk, ended)
            }
        }
    }

    /// A task found done under its own claim after its chunk's database error: the chunk's
    /// commit happened and its reply was lost.
    pub(super) fn done_by_its_chunk(&self, task: &ClaimedTask) -> Outcome {
        log::warn!(
            "task {}: its chunk's commit happened and the reply was lost",
            task.context.id
        );
        self.observers.all_done(std::slice::from_ref(task));
        Outcome::Done
    }

    /// Runs `task` again alone as the check of its claim found it ([`Worker::holds`]): under
    /// the deadline the check gave it, counted done (its chunk's commit happened), left to
    /// rescue (its note unwritten) or lost (taken over).
    pub(super) fn rerun_held(&self, task: &ClaimedTask, hold: Hold) -> Outcome {
        match hold {
            Hold::Until(deadline) => {
                let mut task = task.clone();
                task.deadline = deadline;
                self.execute_task(&task, false)
            }
            Hold::Done => self.done_by_its_chunk(task),
            Hold::Unnoted => Outcome::Abandoned,
            Hold::TakenOver => Outcome::Lost,
        }
    }

    /// Whether this node still holds `task`'s claim (running, under this claim's token), in
    /// the statement that gives it a deadline of its own, `runs` of its timeout from now;
    /// with `ran`, noting in its `last_error` that it runs again after its chunk rolled back.
    /// The statement is retried through an outage (the chunk may have rolled back for one,
    /// and the pool's other connections be dead with it) until the claim's deadline.
    pub(super) fn holds(&self, task: &ClaimedTask, ran: bool, runs: usize) -> Hold {
        let claim = task.claim();
        let note = ran.then_some(RAN_IN_A_ROLLED_BACK_CHUNK);
        let timeout = self
            .own_timeout(task)
            .saturating_mul(u32::try_from(runs).unwrap_or(u32::MAX));
        let held = self.retry_until("a chunk's rerun's claim check", task.deadline, |conn| {
            // The writer's turn (SQLite) once a connection is had, for this statement only:
            // not across the retries' pauses.
            let _turn = self.writer_turn.take();
            let asked = Instant::now();
            Ok(
                match driver(conn).task_hold(&claim, note, millis(timeout))? {
                    // The chunk's commit happened and its reply was lost.
                    0 if done_under(conn, &claim)? => Hold::Done,
                    0 => Hold::TakenOver,
                    _ => Hold::Until(asked + timeout),
                },
            )
        });
        match held {
            Ok(hold) => hold,
            // A task whose handler ran must say so before it runs again: it is left to
            // rescue, which charges it at its deadline and says why.
            Err(e) if ran => {
                log::warn!(
                    "task {}: its rerun after its chunk rolled back could not be noted: {e}; \
                     rescue charges it at its deadline",
                    task.context.id
                );
                Hold::Unnoted
            }
            // One that never ran runs: its completion is fenced all the same, while a task
            // skipped here would wait, running under this live node, for its deadline.
            Err(_) => Hold::Until(task.deadline),
        }
    }
}

/// Whether a task of a chunk that rolled back is still this node's to run again alone.
pub(super) enum Hold {
    /// Held, until this deadline of its own.
    Until(Instant),
    /// Done under this very claim: the chunk's commit happened and its reply was lost.
    Done,
    /// Cancelled, charged by a domain's watchdog, released or rescued meanwhile.
    TakenOver,
    /// Its handler ran in the chunk, and the note that it runs again could not be written:
    /// not run again here.
    Unnoted,
}
