//! Lock claims ([`crate::ClaimStyle::Lock`], PostgreSQL and MySQL): each chunk's tasks are
//! leased by one committed claim that writes no task row, and run in a transaction of their own
//! that marks them done as it deletes their leases: one row version per task.
//!
//! The claiming thread leases a chunk (a row of `async_lease` per task, naming the chunk's
//! transaction, with a deadline) and hands it to a free pool thread (there is no queue: a
//! leased chunk never waits for a thread; when every thread is busy the claiming thread
//! runs it itself; with domains, a chunk is leased for a domain only when a thread it may
//! take is free). The chunk's transaction holds the advisory locks of its node and run
//! (its [`TxMark`], PostgreSQL), commits its handlers' effects and its completion together, and holds
//! no lock on a task row: a cancel never waits for it.
//!
//! If a handler fails, the chunk rolls back and its tasks still leased are claimed the
//! stamping way and run one by one, each recording its own outcome. If the process dies,
//! freezes or is cut off, or the chunk runs past its deadline, the leases stay behind:
//! rescue charges their tasks a failure, as it charges a stamped claim's (and, on
//! PostgreSQL, ends the chunk's session, so that what it holds is free and nothing it
//! writes later lands; its late completion finds no lease on either).

use std::cell::Cell;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::claim::claimed_tasks;
use super::dispatch::Feed;
use super::engine::Worker;
use super::execute::ChunkRollback;
use super::fairness::{participants, Took};
use super::lease::{reserve_runs, ChunkLease};
use super::plan::PlanLane;
use super::record::record_or_unwind;
use super::settings::millis;
use super::tally::{Outcome, Tally};
use crate::db::transaction::{is_connection_error, is_deadlock, mark_broken, DiscardBroken};
use crate::driver::{driver, ChunkRuns, Claim, Claiming, Due, TxMark};
use crate::error::{OpContext, Result};
use crate::task::ClaimedTask;

/// How many times a lease claim that lost a race to another (see `lease_page`) is taken.
const LEASE_ATTEMPTS: u32 = 3;

/// A chunk leased by this node: its tasks and the mark its transaction holds.
pub(super) struct LeasedChunk {
    mark: TxMark,
    tasks: Vec<ClaimedTask>,
}

/// What a task whose handler ran in a leased chunk that rolled back as its worker stopped
/// says in `last_error`: released, it runs again elsewhere, and its effects outside the
/// database may happen twice.
const RELEASED_AFTER_RUNNING: &str =
    "released: its chunk rolled back after its handler ran, as its worker stopped";

impl Worker {
    /// Leases up to `limit` due tasks in one statement, cut into chunks of `commit_batch`,
    /// and hands each chunk to the pool; claims again while the page came back full, or
    /// short only because a participant of the fair claim had less than its share, or the
    /// claim's ring of tenants stopped before it came round (then it goes on from there,
    /// [`super::fairness::FairClaims::goes_on`]). Returns how many tasks it leased.
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
            let want = self.leasable(lane, limit - claimed);
            if want == 0 {
                break;
            }
            let goes_on = || self.services.limits.fair.goes_on(&lane.keywords);
            let (chunks, shared) = match self.lease_page(lane, want) {
                Ok(page) => page,
                // What was leased is running: report it; the next claim meets the error.
                Err(e) if claimed > 0 => {
                    log::debug!("leasing failed after {claimed} tasks: {e}");
                    break;
                }
                Err(e) => return Err(e),
            };
            let n: usize = chunks.iter().map(|c| c.tasks.len()).sum();
            claimed += n;
            for chunk in chunks {
                let size = chunk.tasks.len();
                let record = self.recorder(size, tally);
                self.dispatcher.submit(feed, lane.lane, move |release| {
                    let leased = || self.execute_leased(chunk, release);
                    record_or_unwind(self, size as u64, leased, &record)
                });
            }
            if n == 0 && !goes_on() {
                break;
            }
            if n < want && !shared && !goes_on() {
                break;
            }
        }
        Ok(claimed)
    }

    /// Leases up to `want` due tasks of `lane` in one statement, cut into chunks of
    /// `commit_batch` in claim order, each with the run its transaction will hold; and
    /// whether the page was shared by several participants of the fair claim.
    fn lease_page(&self, lane: &PlanLane, want: usize) -> Result<(Vec<LeasedChunk>, bool)> {
        let keywords = &lane.keywords;
        if keywords.is_empty() {
            return Ok((Vec::new(), false));
        }
        let per = self.settings.commit_batch.max(1);
        let runs = ChunkRuns {
            first: reserve_runs(want.div_ceil(per)),
            per: i64::try_from(per).unwrap_or(i64::MAX),
        };
        let limit = i64::try_from(want).unwrap_or(i64::MAX);
        let limits = &self.services.limits;
        let limited = limits.tenants();
        let pick = limits.fair.next_pick(keywords, &limited);
        let due = Due {
            keywords,
            partition: self.services.strategy.partition(),
            suspect: Some(false),
        };
        let asked = Instant::now();
        let deadline = asked + lane.timeout;
        let claiming = Claiming {
            owner: self.node.id(),
            due: &due,
            except: &limited,
            limit,
            timeout_ms: millis(lane.timeout),
        };
        // A lease claim whose snapshot predates another claim's lease loses a race, and it
        // wrote nothing that stays, so it is taken again, with a snapshot of its own: on
        // PostgreSQL it may wait for a chunk's completion to delete an old lease while the
        // completion waits for a task the claim has locked (the server ends one of them, a
        // deadlock); on MySQL its insert meets the other claim's lease (a duplicate key).
        // Each attempt on a connection of its own: on MySQL the pool discards one a statement
        // failed on, and Connector/C would have the retry's pick wait for ever for the rows
        // of a pick that failed mid-result (`db::reply`).
        let lost_race = |e: &diesel::result::Error| {
            is_deadlock(e)
                || matches!(
                    e,
                    diesel::result::Error::DatabaseError(
                        diesel::result::DatabaseErrorKind::UniqueViolation,
                        _
                    )
                )
        };
        let mut attempt = 1;
        let _claiming = self.node.claim_turn();
        let (leased, chunk_of) = loop {
            let mut conn = self.engine_conn().op("task lease")?;
            match driver(&mut conn)
                .task_lease_page(&claiming, runs, &pick.as_pick())
                .discard_broken(&mut conn)
            {
                Err(e) if lost_race(&e) && attempt < LEASE_ATTEMPTS => {
                    log::debug!("a lease claim lost a race to another; taken again: {e}");
                    attempt += 1;
                }
                leased => break leased,
            }
        }
        .op("task lease")?;
        let leased = self
            .confirmed(Ok(leased), true, deadline)
            .op("task lease")?;
        self.observers.claimed(asked);
        let runs_of: std::collections::HashMap<i64, i64> = leased
            .rows
            .iter()
            .zip(&chunk_of)
            .map(|(row, &run)| (row.id, run))
            .collect();
        let tasks = claimed_tasks(leased.rows, self.node.id(), deadline);
        let took = Took {
            page: &tasks,
            weights: &leased.weights,
            crowded: leased.crowded,
            ring_end: leased.ring_end,
            ring_cut: leased.ring_cut,
            shared: leased.shared,
            limit: want,
        };
        limits.fair.picked(keywords, &pick, took);
        let shared = participants(&tasks).len() >= 2;
        // The chunks in the order of their runs (claim order), each task in claim order.
        let mut chunks: Vec<LeasedChunk> = Vec::new();
        for task in tasks {
            let run = runs_of[&task.context.id];
            match chunks.iter_mut().find(|c| c.mark.run == run) {
                Some(chunk) => chunk.tasks.push(task),
                None => chunks.push(LeasedChunk {
                    mark: TxMark {
                        node: self.node.id(),
                        run,
                    },
                    tasks: vec![task],
                }),
            }
        }
        chunks.sort_by_key(|c| c.mark.run);
        Ok((chunks, shared))
    }

    /// Runs a leased chunk's handlers in one transaction and marks the tasks done in it; with
    /// `release`, or held back (see [`Worker::held_back`]), gives its leases back instead.
    pub(super) fn execute_leased(&self, chunk: LeasedChunk, release: bool) -> Vec<Outcome> {
        let LeasedChunk { mark, tasks } = chunk;
        let claims: Vec<(i64, i64)> = tasks.iter().map(ClaimedTask::id_token).collect();
        let ids: Vec<i64> = tasks.iter().map(|task| task.context.id).collect();
        let handlers = tasks
            .iter()
            .map(|task| self.registry.get(&task.context.keyword))
            .collect::<Option<Vec<_>>>();
        let Some(handlers) = handlers.filter(|_| !release && !self.held_back(&tasks)) else {
            // Given back (stopping, paused: the whole chunk, even its tasks of keywords not
            // paused, leased again later), or (a bug) a keyword without a handler: none has
            // run.
            return self.release_leased(&tasks, &[]);
        };
        let mut conn = match self.engine_conn() {
            Ok(conn) => conn,
            Err(e) => {
                log::warn!("a leased chunk of {} tasks: no connection: {e}", ids.len());
                return self.release_leased(&tasks, &[]);
            }
        };
        if let Err(e) = driver(&mut conn).transaction_begin(Some(mark)) {
            if is_connection_error(&e) {
                mark_broken(&mut conn);
            }
            drop(conn);
            log::warn!("a leased chunk of {} tasks could not begin: {e}", ids.len());
            return self.release_leased(&tasks, &[]);
        }
        let lease = ChunkLease {
            mark,
            claims: Arc::from(claims.as_slice()),
        };
        let owner = self.node.id();
        let ran = Cell::new(0);
        let result = self.run_chunk(&mut conn, Some(&lease), &tasks, &handlers, &ran, |conn| {
            driver(conn).task_complete_leased(owner, &claims)
        });
        drop(conn);
        match result {
            Ok(()) => {
                self.observers.all_done(&tasks);
                vec![Outcome::Done; tasks.len()]
            }
            // A handler failed, a lease was taken over, or the database failed (the commit
            // may even have happened with its reply lost): what is still leased runs again
            // one by one; what is not is told apart by where it stands.
            Err(ChunkRollback::Task | ChunkRollback::Database(_)) => {
                self.rerun_leased(&tasks, &ids[..ran.get()])
            }
            // The task whose handler was ended past its domain's timeout is its charge's (or,
            // should that fail, rescue's at its lease's deadline); the others run again.
            Err(ChunkRollback::Ended) => {
                let at = ran.get() - 1;
                let (mut others, ran_ids) = (tasks.clone(), ids[..at].to_vec());
                others.remove(at);
                let mut outcomes = self.rerun_leased(&others, &ran_ids);
                outcomes.push(Outcome::Lost);
                outcomes
            }
        }
    }

    /// After a leased chunk rolled back: claims, the stamping way, its tasks still leased by
    /// this node and runs them one by one, so that each records its own outcome; those of
    /// `ran` (their handlers ran in the chunk) noted as running again, or, found cancelled,
    /// by the claim itself. A task no longer leased is done (a commit whose reply was lost)
    /// or another's (counted lost).
    fn rerun_leased(&self, tasks: &[ClaimedTask], ran: &[i64]) -> Vec<Outcome> {
        let claims: Vec<(i64, i64)> = tasks.iter().map(ClaimedTask::id_token).collect();
        if self.is_stopping() {
            // Stopping (or the hang watchdog is about to exit): claimed now, they would be
            // left running for rescue to charge; they are released as they are, those of
            // `ran` noted (they run again elsewhere, or were cancelled after they ran).
            return self.release_leased(tasks, ran);
        }
        log::debug!(
            "a leased chunk of {} tasks rolled back; running them one by one",
            claims.len()
        );
        // Retried through an outage (the chunk may have failed for one) until the leases'
        // deadline: one that ends before it charges the tasks nothing.
        let lease_deadline = tasks.first().map_or_else(Instant::now, |t| t.deadline);
        // Each runs alone, one after another, with its domain's timeout when it has one.
        let each = tasks
            .first()
            .map_or(self.settings.task_timeout, |t| self.own_timeout(t));
        let timeout = each.saturating_mul(u32::try_from(claims.len()).unwrap_or(u32::MAX));
        // The deadline of a claim by an attempt whose reply was lost: from before the first.
        let first_deadline = Instant::now() + timeout;
        let attempts = Cell::new(0);
        let claimed = self.retry_until("a rolled-back chunk's claim", lease_deadline, |conn| {
            attempts.set(attempts.get() + 1);
            let deadline = Instant::now() + timeout;
            driver(conn)
                .task_claim_leased(self.node.id(), &claims, ran, millis(timeout))
                .map(|rows| claimed_tasks(rows, self.node.id(), deadline))
        });
        let mut claimed = match claimed {
            Ok(claimed) => claimed,
            Err(e) => {
                // Their leases stay: rescue's charge notes one found cancelled, as the claim
                // would have.
                log::warn!(
                    "a leased chunk of {} tasks rolled back and could not be claimed again: \
                     {e}; rescue charges them at their deadline",
                    claims.len()
                );
                return vec![Outcome::Abandoned; claims.len()];
            }
        };
        // An attempt that failed may have committed, its reply lost: it claimed what the next
        // found no lease of.
        for task in tasks.iter().filter(|_| attempts.get() > 1) {
            if !claimed.iter().any(|c| c.context.id == task.context.id) {
                claimed.extend(self.claimed_unheard(task, first_deadline));
            }
        }
        // Just claimed, so held unless cancelled since: only a task whose handler ran in the
        // chunk is checked, by the statement that notes its rerun.
        let mut outcomes: Vec<Outcome> = claimed
            .iter()
            .enumerate()
            .map(|(at, task)| {
                let left = claimed.len() - at;
                if !ran.contains(&task.context.id) {
                    return self.execute_task(task, false);
                }
                self.rerun_held(task, self.holds(task, true, left))
            })
            .collect();
        for task in tasks {
            if claimed.iter().any(|c| c.context.id == task.context.id) {
                continue;
            }
            let outcome = if self.is_done_by_this_chunk(task) {
                self.done_by_its_chunk(task)
            } else {
                Outcome::Lost
            };
            outcomes.push(outcome);
        }
        outcomes
    }

    /// `task` as a claim again of its chunk leaves it (running under this node, its lease's
    /// token plus one, due by `deadline`) when the database says it stands so: that claim
    /// committed and its reply was lost. `None` otherwise, or when the database cannot say
    /// by the task's deadline.
    fn claimed_unheard(&self, task: &ClaimedTask, deadline: Instant) -> Option<ClaimedTask> {
        let token = task.claim_token + 1;
        let now = self
            .retry_until("a rolled-back chunk's claim check", task.deadline, |conn| {
                driver(conn).task_get_claim(task.context.id)
            })
            .ok()??;
        let claimed = now.state == "running" && now.owner == Some(task.owner);
        (claimed && now.claim_token == token).then(|| {
            log::warn!(
                "task {}: its chunk's claim again committed and the reply was lost",
                task.context.id
            );
            ClaimedTask {
                claim_token: token,
                deadline,
                ..task.clone()
            }
        })
    }

    /// Whether `task` is done by its leased chunk's completion: under the token that
    /// completion gives (its lease's plus one). A newer chunk of this node that completed the
    /// task after a rescue (two tokens on) is not this one.
    fn is_done_by_this_chunk(&self, task: &ClaimedTask) -> bool {
        let claim = Claim {
            token: task.claim_token + 1,
            ..task.claim()
        };
        self.is_done_under(&claim, task.deadline)
    }

    /// Deletes this node's leases of `tasks` (their chunk never ran, or rolled back as the
    /// worker stops): free again, no failure, those of `ran` (their handlers ran in the chunk)
    /// noted [`RELEASED_AFTER_RUNNING`], or the cancel's note when cancelled; retried through
    /// an outage until the leases' deadline.
    fn release_leased(&self, tasks: &[ClaimedTask], ran: &[i64]) -> Vec<Outcome> {
        let claims: Vec<(i64, i64)> = tasks.iter().map(ClaimedTask::id_token).collect();
        let deadline = tasks.first().map_or_else(Instant::now, |t| t.deadline);
        let released = self.retry_until("a chunk's release", deadline, |conn| {
            driver(conn).task_release_leased(self.node.id(), &claims, ran, RELEASED_AFTER_RUNNING)
        });
        match released {
            Ok(_) => vec![Outcome::Released; claims.len()],
            Err(e) => {
                log::warn!(
                    "a leased chunk of {} tasks could not be released: {e}; rescue frees \
                     them at their deadline",
                    claims.len()
                );
                vec![Outcome::Abandoned; claims.len()]
            }
        }
    }
}
