//! Rescue (seed 002's recovery): running tasks whose node stopped heartbeating, or that run
//! past their own deadline, go back to pending — or to dead at max attempts — counting a
//! failure, so that a task that kills its worker ends dead instead of looping.
//!
//! Every live node rescues, on a thread of its own every heartbeat interval (±10%, so that a
//! fleet does not rescue in step), and `drain` once at start. The rescue locks the tasks that
//! meet its conditions, passing over those another transaction holds (a later pass takes
//! them), and charges what it locked in the same transaction: concurrent rescuers never rescue
//! a task twice, and a node that recovers in the meantime keeps its tasks. A node's own pass
//! never judges the node itself by its heartbeat while its row is alive (its beats may have
//! been kept out by an outage of its own; its handlers have its tasks): only the others do,
//! by the database clock. Each rescued task waits the retry backoff of its failure count,
//! with the same jitter as a handler's failure, so that a dead node's tasks do not all come
//! due in the same instant. A rescued task's late completion by its old owner is fenced out.
//!
//! A task that dies at its last attempt has its descendants cancelled, and those locks wait
//! (a child's other parent's completion holds the child's row). So the dying parents are
//! charged after the rest, one at a time, each in a transaction of its own with a short lock
//! timeout: one whose descendants another transaction holds is left for a later pass, and
//! holds up nothing else.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::heartbeat::Node;
use super::observers::Observers;
use super::suspects::Suspects;
use crate::db::transaction::DiscardBroken;
use crate::db::{DbPool, PooledConnection};
use crate::driver::{driver, RescueParams, RescuedRow};
use crate::error::{Error, OpContext, Result};

/// What a rescue pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RescueReport {
    /// Tasks put back to pending.
    pub pending: u64,
    /// Tasks that reached their max attempts and are now dead.
    pub dead: u64,
    /// Sessions of the transactions of nodes that are not live, or of chunks past their
    /// deadline, ended (PostgreSQL; on MySQL the sessions of nodes that are not live).
    pub sessions_ended: u64,
    /// Tasks to die at their last attempt whose descendants another transaction held past
    /// the lock timeout: left for a later pass.
    pub deferred: u64,
}

/// The most dying parents a pass leaves for later, each after a lock timeout (2 s), before it
/// leaves the rest untried: a pass that meets many held descendants stays short.
const MAX_DEFERRED: u64 = 3;

/// The failures of a pass's statements: the first, which the pass returns at its end, and
/// whether one said that the database cannot be reached (no connection from the pool, or the
/// connection lost), which ends the pass's statements there: each of the others would first
/// wait out a checkout of its own.
#[derive(Default)]
struct Failures {
    first: Option<Error>,
    unreachable: bool,
}

impl Failures {
    /// Records `e`; whether the pass stops its statements.
    fn add(&mut self, e: Error) -> bool {
        self.unreachable |= matches!(e, Error::Pool { .. }) || e.is_connection_lost();
        self.first.get_or_insert(e);
        self.unreachable
    }
}

/// The rescue service of one worker.
pub(crate) struct Rescuer {
    pool: DbPool,
    /// This node: its connections say so on MySQL ([`super::heartbeat::node_conn`]).
    node: Arc<Node>,
    params: RescueParams,
    observers: Observers,
    suspects: Arc<Suspects>,
    /// Whether ending stale sessions failed at the last pass (logged once, not every pass).
    ending_failed: AtomicBool,
}

impl Rescuer {
    pub(crate) fn new(
        pool: DbPool,
        node: Arc<Node>,
        params: RescueParams,
        observers: Observers,
        suspects: Arc<Suspects>,
    ) -> Self {
        Rescuer {
            pool,
            node,
            params,
            observers,
            suspects,
            ending_failed: AtomicBool::new(false),
        }
    }

    /// Runs one rescue pass on a pooled connection: first ends the sessions of the
    /// transactions that nodes no longer live (never this one) left open (a frozen or cut-off
    /// process holds locks until its session ends; it writes nothing after it), then returns
    /// their tasks, stamped (`running`) and leased (lock claims), to pending or dead, each
    /// charged a failure (a node's death counted in `suspect`), and notes whether suspects
    /// wait to be claimed alone.
    pub(crate) fn run_once(&self) -> Result<RescueReport> {
        let mut report = RescueReport::default();
        let mut conn = self.conn().op("task rescue")?;
        match driver(&mut conn)
            .session_end_stale(&self.marked(&self.params))
            .discard_broken(&mut conn)
        {
            Ok(n) => {
                report.sessions_ended = u64::try_from(n).unwrap_or(0);
                if n > 0 {
                    log::warn!("rescue: ended {n} session(s) of nodes no longer live");
                }
                self.ending_failed.store(false, Ordering::Relaxed);
            }
            // The statements leave out the sessions this role may not end (PostgreSQL: another
            // role's, unless a member of it or of pg_signal_backend; MySQL: another user's);
            // an error here is the server's (a lost connection, a `KILL` refused): the rescue
            // itself still holds.
            Err(e) if !self.ending_failed.swap(true, Ordering::Relaxed) => {
                log::warn!("rescue: could not end the sessions of nodes no longer live: {e}");
            }
            Err(_) => {}
        }
        drop(conn);
        // Each statement commits alone, on a connection of its own from the pool (which
        // discards one whose statement failed: on MySQL a statement whose rows ended in an
        // error can leave its cached statement waiting for ever at its next run, see
        // `db/reply.rs`). The rows of those that succeeded are reported (hooks, metrics)
        // whatever the others did, and the pass returns the first failure after (see
        // `Failures`).
        let mut rows = Vec::new();
        let mut failures = Failures::default();
        for leased in [false, true] {
            match self.charge(&self.params, leased) {
                Ok(charged) => rows.extend(charged),
                Err(e) => {
                    if failures.add(e) {
                        break;
                    }
                }
            }
        }
        let dying = match failures.unreachable {
            true => Ok(Vec::new()),
            false => self.dying(),
        };
        match dying {
            Ok(mut ids) => {
                // In no fixed order: the parents a held descendant defers at every pass do
                // not keep the others behind them for good.
                fastrand::shuffle(&mut ids);
                'parents: for (n, &id) in ids.iter().enumerate() {
                    if report.deferred >= MAX_DEFERRED {
                        log::warn!(
                            "rescue: {} more task(s) dying at their last attempt left for a \
                             later pass",
                            ids.len() - n
                        );
                        break;
                    }
                    let one = RescueParams {
                        only: Some(id),
                        ..self.params
                    };
                    for leased in [false, true] {
                        match self.charge(&one, leased) {
                            Ok(charged) => rows.extend(charged),
                            Err(e) if e.is_lock_timeout() => {
                                log::warn!(
                                    "rescue: task {id} dies at its last attempt, and a lock \
                                     its charge needs (one of its descendants') is held by \
                                     another transaction: left for a later pass ({e})"
                                );
                                report.deferred += 1;
                            }
                            Err(e) => {
                                if failures.add(e) {
                                    break 'parents;
                                }
                            }
                        }
                    }
                }
            }
            Err(e) => {
                failures.add(e);
            }
        }
        self.observers.rescued(&rows);
        let mut marked = false;
        for row in rows {
            log::warn!("task {}: {} → {}", row.id, row.reason, row.state);
            if row.state == "dead" {
                report.dead += 1;
            } else {
                report.pending += 1;
                marked |= row.reason.ends_with("the node stopped heartbeating");
            }
        }
        if let Some(e) = failures.first {
            return Err(e);
        }
        let mut conn = self.conn().op("task rescue")?;
        let suspects = marked
            || driver(&mut conn)
                .task_suspects_exist()
                .discard_broken(&mut conn)
                .op("task rescue")?;
        self.suspects.found(suspects);
        Ok(report)
    }

    /// A connection of the pool for this node's rescue.
    fn conn(&self) -> std::result::Result<PooledConnection, r2d2::Error> {
        super::heartbeat::node_conn(&self.pool, self.node.id())
    }

    /// One rescue statement of `params`, the stamped tasks' or the leases', on a pooled
    /// connection of its own.
    fn charge(&self, params: &RescueParams, leased: bool) -> Result<Vec<RescuedRow>> {
        let params = &self.marked(params);
        let mut conn = self.conn().op("task rescue")?;
        let charged = match leased {
            false => driver(&mut conn).task_rescue_many(params),
            true => driver(&mut conn).task_rescue_leases(params),
        };
        charged.discard_broken(&mut conn).op("task rescue")
    }

    /// The dying parents among the lapsed tasks, on a pooled connection of its own.
    fn dying(&self) -> Result<Vec<i64>> {
        let mut conn = self.conn().op("task rescue")?;
        driver(&mut conn)
            .task_rescue_dying(&self.marked(&self.params))
            .discard_broken(&mut conn)
            .op("task rescue")
    }

    /// `params` with this node's id as it is now (a node that registers again gets a new
    /// one), which marks the statements' transactions.
    fn marked(&self, params: &RescueParams) -> RescueParams {
        RescueParams {
            node: self.node.id(),
            ..*params
        }
    }
}
