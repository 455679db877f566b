//! The domains' watchdog (seed 004's Watchdog): a handler of a domain with a timeout that
//! runs past it has its transaction ended (PostgreSQL: the session holding the
//! transaction's mark is terminated, whatever the handler waits on, SQL or not; MySQL: the
//! statement it runs is killed), its task is charged a failure (retried after the backoff,
//! or dead at its last attempt), the other tasks of its chunk are free again, uncounted,
//! and its slot counts as stuck until the handler returns: a Rust thread cannot be killed,
//! so the slot is not reused meanwhile. The charge moves the task out of its claim (or its
//! lease), which fences out the late completion.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::lease::{charge_leased, ChunkLease};
use super::observers::Observers;
use super::on_dead::DeadTask;
use super::settings::Settings;
use super::slots::Lanes;
use crate::db::transaction::write_transaction_marked;
use crate::db::{DbConnection, DbPool};
use crate::driver::{driver, Claim, TxMark};
use crate::error::{OpContext, Result};
use crate::task::ClaimedTask;

/// The chunk a watched handler runs in (batched mode), which its timeout ends.
#[derive(Debug, Clone)]
pub(crate) enum ChunkOf {
    /// A lock claim's leased chunk.
    Leased(ChunkLease),
    /// A stamped chunk: the claims of its tasks, released when one of them times out.
    Stamped(Arc<[Claim]>),
}

/// Where a watched handler's transaction runs, to end it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Session {
    /// The mark its transaction holds (PostgreSQL).
    pub(crate) mark: Option<TxMark>,
    /// Its connection's id (MySQL), whose statement is killed.
    pub(crate) backend: Option<i32>,
}

/// One watched handler.
#[derive(Debug, Clone)]
struct Watched {
    lane: usize,
    started: Instant,
    timeout: Duration,
    session: Session,
    chunk: Option<ChunkOf>,
    claim: Claim,
    failures: i32,
    max_attempts: Option<i32>,
    stuck: bool,
    /// Times its charge failed (a dead connection, the database out of reach), and when it
    /// is tried again while the handler runs: after 100 ms, doubling, at most every 5 s (an
    /// attempt may wait out SQLite's busy timeout, and holds up the other handlers' checks).
    charge_failed: u32,
    retry_at: Option<Instant>,
    /// What the metrics and the dead-task hook are told if the timeout makes it dead.
    keyword: String,
    biz_id: String,
    tenant: Option<String>,
    claimed_at: Instant,
}

/// The handlers of domains with a timeout, while they run, each under a number of its own
/// (two runs of one task, a zombie and a new one, never share an entry).
pub(crate) struct Timeouts {
    running: Mutex<HashMap<u64, Watched>>,
    runs: AtomicU64,
    lanes: Arc<Lanes>,
}

/// Watches one handler until dropped; a stuck slot is freed then.
pub(crate) struct TimeoutWatch<'w> {
    timeouts: &'w Timeouts,
    key: u64,
}

impl Drop for TimeoutWatch<'_> {
    fn drop(&mut self) {
        let removed = self.timeouts.lock().remove(&self.key);
        if let Some(watched) = removed.filter(|w| w.stuck) {
            self.timeouts.lanes.lock().unstick(watched.lane);
            log::warn!(
                "task {}: its handler returned after {:?}, past its domain's timeout; its slot \
                 is free again",
                watched.claim.id,
                watched.started.elapsed()
            );
        }
    }
}

impl TimeoutWatch<'_> {
    /// Whether the handler ran past its timeout and was ended: its chunk with it, whose other
    /// tasks are free (released, or their leases deleted) and may run elsewhere.
    pub(crate) fn ended(&self) -> bool {
        self.timeouts.lock().get(&self.key).is_some_and(|w| w.stuck)
    }
}

impl Timeouts {
    pub(crate) fn new(lanes: Arc<Lanes>) -> Timeouts {
        Timeouts {
            running: Mutex::default(),
            runs: AtomicU64::new(0),
            lanes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Watched>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Watches `task`'s handler, of `lane`, from now, for `timeout`; `session` is where its
    /// transaction runs, `chunk` the chunk it runs in.
    pub(crate) fn watch(
        &self,
        task: &ClaimedTask,
        lane: usize,
        timeout: Duration,
        session: Session,
        chunk: Option<ChunkOf>,
    ) -> TimeoutWatch<'_> {
        let key = self.runs.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(
            key,
            Watched {
                lane,
                started: Instant::now(),
                timeout,
                session,
                chunk,
                claim: task.claim(),
                failures: task.failures,
                max_attempts: task.max_attempts,
                stuck: false,
                charge_failed: 0,
                retry_at: None,
                keyword: task.context.keyword.clone(),
                biz_id: task.context.biz_id.clone(),
                tenant: task.context.tenant.clone(),
                claimed_at: task.claimed_at,
            },
        );
        TimeoutWatch {
            timeouts: self,
            key,
        }
    }

    /// Ends each handler past its timeout not ended yet: marks its slot stuck, ends its
    /// transaction, charges its task a failure and frees the rest of its chunk; a charge that
    /// failed is made again. Returns how many it tried to end.
    pub(crate) fn run_once(
        &self,
        (pool, node): (&DbPool, i64),
        settings: &Settings,
        observers: &Observers,
    ) -> usize {
        let now = Instant::now();
        let late: Vec<(u64, Watched)> = {
            let mut running = self.lock();
            let mut lanes = self.lanes.lock();
            running
                .iter_mut()
                .filter(|(_, w)| match w.retry_at {
                    Some(at) => at <= now,
                    None => !w.stuck && now.saturating_duration_since(w.started) > w.timeout,
                })
                .map(|(&key, w)| {
                    // Under the same lock as the flag: a handler that returns now unsticks
                    // its slot only after this (a slot marked after its unstick would stay
                    // stuck for good).
                    if !w.stuck {
                        w.stuck = true;
                        lanes.mark_stuck(w.lane);
                    }
                    (key, w.clone())
                })
                .collect()
        };
        for (key, watched) in &late {
            match super::heartbeat::node_conn(pool, node)
                .op("task timeout")
                .and_then(|mut conn| self.end(&mut conn, settings, *key, watched))
            {
                Ok((state, error)) => {
                    if let Some(w) = self.lock().get_mut(key) {
                        (w.charge_failed, w.retry_at) = (0, None);
                    }
                    if state == Some(Charged::Retried) {
                        observers.retried_at_timeout(&watched.keyword, watched.claimed_at);
                    }
                    if state == Some(Charged::Dead) {
                        let task = DeadTask {
                            id: watched.claim.id,
                            keyword: watched.keyword.clone(),
                            biz_id: watched.biz_id.clone(),
                            tenant: watched.tenant.clone(),
                            error,
                        };
                        observers.dead_at_timeout(task, watched.claimed_at);
                    }
                }
                Err(e) => {
                    let failed = self.lock().get_mut(key).map(|w| {
                        w.charge_failed += 1;
                        let backoff = Duration::from_millis(100)
                            .saturating_mul(1 << (w.charge_failed - 1).min(6))
                            .min(Duration::from_secs(5));
                        w.retry_at = Some(Instant::now() + backoff);
                        w.charge_failed
                    });
                    // Once, not at every pass while the database is out of reach.
                    if failed == Some(1) {
                        log::error!(
                            "task {}: past its domain's timeout, and its failure could not be \
                             counted ({e}); tried again, backing off, while its handler runs",
                            watched.claim.id
                        );
                    }
                }
            }
        }
        late.len()
    }

    /// Ends the transaction of the handler `key`, charges its task a failure and frees its
    /// chunk's other tasks; returns the error stored when that made the task dead.
    fn end(
        &self,
        conn: &mut DbConnection,
        settings: &Settings,
        key: u64,
        watched: &Watched,
    ) -> Result<(Option<Charged>, String)> {
        let ran = watched.started.elapsed();
        let failures = watched.failures.saturating_add(1);
        let max = watched.max_attempts.unwrap_or(settings.max_attempts);
        let error = format!(
            "timed out: its handler ran for {ran:?}, past its domain's timeout of {:?}",
            watched.timeout
        );
        if let Some(ChunkOf::Leased(lease)) = &watched.chunk {
            let state = bounded(conn, watched.claim.owner, |conn| {
                charge_leased(
                    conn,
                    settings,
                    watched.claim.owner,
                    lease,
                    watched.claim.id,
                    watched.failures,
                    &error,
                )
            })?;
            // On MySQL no mark names the chunk's session: the hung handler's statement is
            // killed, after the charge, so that what it waits on or holds is let go.
            let statement = Session {
                mark: None,
                backend: watched.session.backend,
            };
            self.end_session(conn, key, &statement);
            log_charged(watched, &error, state.as_deref());
            return Ok((state.as_deref().map(Charged::of), error));
        }
        self.end_session(conn, key, &watched.session);
        let charged = bounded(conn, watched.claim.owner, |conn| {
            if failures >= max {
                driver(conn).task_fail_dead(&watched.claim, &error)
            } else {
                let delay = settings
                    .backoff
                    .delay(failures.unsigned_abs(), fastrand::f64());
                let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
                driver(conn).task_fail_retry(&watched.claim, &error, delay_ms)
            }
            .op("task timeout")
        })?;
        let state = (charged > 0).then_some(if failures >= max { "dead" } else { "pending" });
        log_charged(watched, &error, state);
        if let Some(ChunkOf::Stamped(claims)) = &watched.chunk {
            let note = format!(
                "released: task {} of its chunk ran past its domain's timeout",
                watched.claim.id
            );
            // Bounded too: on MySQL the hung chunk's transaction lives on (`KILL QUERY` ends
            // its statement only), holding what its handlers locked, a sibling's row among
            // them when a handler linked a child to its own task. The first release that
            // fails leaves the rest, whose rows that transaction may hold as well, to the
            // chunk's rerun once its handler returns, or to rescue at their deadline: one
            // wait of 2 s at most, not one per sibling.
            let siblings: Vec<_> = claims.iter().filter(|c| c.id != watched.claim.id).collect();
            for (i, claim) in siblings.iter().enumerate() {
                let released = bounded(conn, watched.claim.owner, |conn| {
                    driver(conn)
                        .task_release(claim, Some(&note))
                        .op("task timeout")
                });
                if let Err(e) = released {
                    let left = siblings.len() - i;
                    log::warn!(
                        "task {}: could not be released ({left} of its chunk left held): {e}",
                        claim.id
                    );
                    break;
                }
            }
        }
        Ok((state.map(Charged::of), error))
    }

    /// Ends the transaction of a handler past its timeout: on PostgreSQL the session holding
    /// its mark (the mark lives as long as the transaction: a session that has moved on to
    /// other work is not touched); on MySQL the statement its connection runs, while the
    /// handler is known to be running still (its watch is in place), so that no other
    /// task's statement on that connection is killed.
    fn end_session(&self, conn: &mut DbConnection, key: u64, session: &Session) {
        let ended = match (session.mark, session.backend) {
            (Some(mark), _) => driver(conn).session_end(mark),
            (None, Some(backend)) => {
                let running = self.lock();
                if running.contains_key(&key) {
                    driver(conn).backend_cancel(backend)
                } else {
                    Ok(false)
                }
            }
            (None, None) => Ok(false),
        };
        if let Err(e) = ended {
            log::warn!("a handler past its domain's timeout: its session could not be ended: {e}");
        }
    }
}

fn log_charged(watched: &Watched, error: &str, state: Option<&str>) {
    log::error!(
        "task {}: {error}; {}",
        watched.claim.id,
        match state {
            None => "it had already left its claim",
            Some("dead") => "dead; its slot is stuck until the handler returns",
            Some(_) => "a failure counted; its slot is stuck until the handler returns",
        }
    );
}

/// Runs a charge in a transaction of `node`'s whose lock waits are bounded: a task made dead
/// cancels its descendants, whose rows another transaction may hold for as long as it likes,
/// and the one thread that ends every domain's handlers must not wait for it (a charge that
/// fails is made again while the handler runs, and rescue charges the task at its deadline
/// after). Marked as the node's other transactions are (PostgreSQL): a node frozen inside it
/// holds the rows it wrote only until a rescue pass ends it.
fn bounded<T>(
    conn: &mut DbConnection,
    node: i64,
    charge: impl FnOnce(&mut DbConnection) -> Result<T>,
) -> Result<T> {
    let mark = TxMark {
        node,
        run: super::lease::next_run(),
    };
    let charged = write_transaction_marked(conn, Some(mark), |conn| {
        driver(conn)
            .transaction_lock_wait_bounded(true)
            .op("task timeout")?;
        charge(conn)
    });
    // MySQL's bound is the session's: back to the server's, or the pool drops the connection.
    if driver(conn).transaction_lock_wait_bounded(false).is_err() {
        crate::db::transaction::mark_broken(conn);
    }
    charged
}

/// What a charge at the timeout made of its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Charged {
    /// Pending again, after the backoff.
    Retried,
    /// Dead, at its last attempt.
    Dead,
}

impl Charged {
    /// From the task's new state (`pending` or `dead`).
    fn of(state: &str) -> Charged {
        match state {
            "dead" => Charged::Dead,
            _ => Charged::Retried,
        }
    }
}
