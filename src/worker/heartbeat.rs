//! The heartbeat: a node proves it is alive by updating its `async_node` row, with the
//! database clock, on a connection of its own (outside the work pool, so that a saturated
//! pool cannot starve it), on a thread of its own (so that a slow rescue pass cannot delay
//! it).
//!
//! A node whose row is gone (deleted by `outbox prune` after it was silent for an hour: a
//! paused VM, SIGSTOP, a partition) or marked gone registers again under a new id and says
//! so: the fleet treats the old id as dead and rescues the tasks claimed under it, and their
//! late completions are fenced out by the claim token. The node then claims as the new id.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::cancels::CancelWatch;
use super::domains::DomainControl;
use super::strategy::StrategyControl;
use super::tenants::RunLimits;
use crate::db::{DatabaseUrl, DbConnection, DbPool, PooledConnection};
use crate::driver::driver;
use crate::error::{OpContext, Result};

/// This process as a node: its current id in `async_node` and its name (`host:pid`).
#[derive(Debug)]
pub(crate) struct Node {
    id: AtomicI64,
    name: String,
    /// Its claims take turns (see [`Node::claim_turn`]).
    claims: std::sync::Mutex<()>,
    /// When its registration's statement was sent: its first beat, as the node sees it.
    registered: Instant,
}

impl Node {
    /// Registers a new node row for this process.
    pub(crate) fn register(conn: &mut DbConnection) -> Result<Node> {
        let name = format!(
            "{}:{}",
            gethostname::gethostname().to_string_lossy(),
            std::process::id()
        );
        let registered = Instant::now();
        let id = driver(conn).node_register(&name).op("node register")?;
        Ok(Node {
            id: AtomicI64::new(id),
            name,
            claims: std::sync::Mutex::new(()),
            registered,
        })
    }

    /// This node's turn to claim, held through a claim and the give-back of a claim whose
    /// COMMIT failed (`worker/unconfirmed.rs`): that give-back is fenced by the tokens the
    /// claim would have set, which another claim of this node made meanwhile could set too.
    /// The engine claims from one thread; this keeps [`crate::Worker::claim`], called beside
    /// it, in turn.
    pub(crate) fn claim_turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The node's current id: the owner of the tasks it claims now.
    pub(crate) fn id(&self) -> i64 {
        self.id.load(Ordering::SeqCst)
    }

    /// `host:pid`.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

/// A connection of `pool` for the work of the node `node` (claims, tasks, chunks, charges,
/// rescue, cron). On MySQL its session then says which node it works for
/// ([`crate::driver::LeaseDriver::session_tag`]: one statement the first time, or when the
/// node's id changed), so that rescue ends it once the node is no longer live: a process
/// frozen while it holds a transaction open keeps its rows locked until its session ends. A
/// tag that fails (a connection the server ended while this process was frozen) is logged at
/// debug level and the work goes on: its next statement finds the connection lost, and the
/// pool drops a connection on which a statement failed.
pub(crate) fn node_conn(pool: &DbPool, node: i64) -> Result<PooledConnection, r2d2::Error> {
    node_conn_within(pool, node, pool.connection_timeout())
}

/// [`node_conn`], waiting for it at most `wait` (and at most the pool's checkout timeout).
pub(crate) fn node_conn_within(
    pool: &DbPool,
    node: i64,
    wait: std::time::Duration,
) -> Result<PooledConnection, r2d2::Error> {
    let mut conn = pool.get_timeout(wait.min(pool.connection_timeout()))?;
    if let Err(e) = driver(&mut conn).session_tag(node) {
        log::debug!("node {node}: a connection's session could not be tagged: {e}");
    }
    Ok(conn)
}

/// The heartbeat's state between beats.
#[derive(Default)]
struct Beat {
    conn: Option<DbConnection>,
    failing: bool,
    /// Set by [`Heartbeat::retire`]: the node is being marked gone, so no more beats (and
    /// no registering again).
    retired: bool,
}

/// One node's heartbeat.
pub(crate) struct Heartbeat {
    url: DatabaseUrl,
    node: std::sync::Arc<Node>,
    /// The heartbeat's own connection (reopened after a failure), whether the last attempt
    /// failed (to log changes of state only), and whether the node has retired.
    conn: Mutex<Beat>,
    /// When the last successful heartbeat's statement was sent (the registration counts as
    /// one). Apart from `conn` so that the claim path never waits for a slow heartbeat.
    last_ok: Mutex<Instant>,
    /// The handlers running now, whose tasks the beat checks for a cancel.
    cancels: std::sync::Arc<CancelWatch>,
    /// The tenants with a `max_running`, read again at each beat.
    limits: std::sync::Arc<RunLimits>,
    /// The domains, read again at each beat and their use published.
    domains: std::sync::Arc<DomainControl>,
    /// The claim strategy, published and the fleet's read again at each beat.
    strategy: std::sync::Arc<StrategyControl>,
}

impl Heartbeat {
    pub(crate) fn new(
        url: DatabaseUrl,
        node: std::sync::Arc<Node>,
        cancels: std::sync::Arc<CancelWatch>,
        limits: std::sync::Arc<RunLimits>,
        domains: std::sync::Arc<DomainControl>,
        strategy: std::sync::Arc<StrategyControl>,
    ) -> Self {
        let registered = node.registered;
        Heartbeat {
            url,
            node,
            cancels,
            limits,
            domains,
            strategy,
            conn: Mutex::new(Beat::default()),
            last_ok: Mutex::new(registered),
        }
    }

    /// Records one heartbeat, reconnecting first if the last attempt failed, and registering
    /// the node again if its row is gone. Logs once when heartbeats start failing and once
    /// when they recover.
    pub(crate) fn run_once(&self) -> Result<()> {
        let mut guard = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let Beat {
            conn: slot,
            failing,
            retired,
        } = &mut *guard;
        if *retired {
            return Ok(());
        }
        let result = (|| {
            if slot.is_none() {
                *slot = Some(self.url.connect()?);
            }
            let conn = slot.as_mut().expect("connected above");
            let old = self.node.id();
            // The domains first, so that the beat publishes what they are now. Not the
            // beat's failure if it fails (a bad row is reported once; the last good
            // configuration stays).
            if let Err(e) = self.domains.refresh(conn) {
                log::error!("node {old}: domains not changed: {e}");
            }
            let published = self.domains.publication();
            // The beat's time, as the node's own view of it: taken before the statement, so
            // that the row's `heartbeat_at` (the database's time of the statement) is never
            // older than what the node believes (its claims and rescue go by this).
            let at = Instant::now();
            if driver(conn)
                .node_heartbeat(old, &published)
                .op("node heartbeat")?
                == 0
            {
                let new = driver(conn)
                    .node_register(self.node.name())
                    .op("node register")?;
                self.node.id.store(new, Ordering::SeqCst);
                log::warn!(
                    "node {old} ({}) is no longer registered as alive (its row was pruned or \
                     marked gone while it was silent): registered again as node {new}; the \
                     tasks claimed as node {old} are rescued and their completions fenced out",
                    self.node.name()
                );
            }
            // The running tasks that were cancelled: their handlers may stop early. Not the
            // beat's failure if it fails.
            if let Err(e) = self.cancels.refresh(conn) {
                log::warn!(
                    "node {}: could not check for cancelled tasks: {e}",
                    self.node.id()
                );
            }
            if let Err(e) = self.limits.refresh(conn) {
                log::warn!(
                    "node {}: could not read the tenants' max_running: {e}",
                    self.node.id()
                );
            }
            // The claim strategy's view of the fleet; the last one stays if this fails.
            if let Err(e) = self.strategy.refresh(conn, self.node.id()) {
                log::warn!(
                    "node {}: could not publish or read the claim strategies: {e}",
                    self.node.id()
                );
            }
            Ok(at)
        })();
        // A MySQL statement that failed above may have left a prepared statement of this
        // connection waiting for rows at its next run (see `db::reply`): a new one next time.
        if slot
            .as_mut()
            .is_some_and(crate::db::reply::must_not_be_reused)
        {
            *slot = None;
        }
        match &result {
            Ok(at) => {
                *self.last_ok.lock().unwrap_or_else(PoisonError::into_inner) = *at;
                if *failing {
                    log::warn!("node {}: heartbeat recovered", self.node.id());
                }
                *failing = false;
            }
            Err(e) => {
                // A fresh connection next time: this one may be dead.
                *slot = None;
                if !*failing {
                    log::error!("node {}: heartbeat failed: {e}", self.node.id());
                }
                *failing = true;
            }
        }
        result.map(|_| ())
    }

    /// Stops beating for good (waiting for a beat under way): the node is about to be marked
    /// gone, and must not register again.
    pub(crate) fn retire(&self) {
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retired = true;
    }

    /// Time since the last successful heartbeat's statement was sent.
    pub(crate) fn since_last_ok(&self) -> Duration {
        self.last_ok
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }
}

/// Whether a node whose last successful heartbeat was `since` ago may claim: others rescue
/// its tasks once its heartbeat is `dead_after` old (by the database clock), so it stops
/// claiming one heartbeat before that.
pub(crate) fn may_claim(since: Duration, heartbeat: Duration, dead_after: Duration) -> bool {
    since <= dead_after.saturating_sub(heartbeat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_stops_claiming_one_heartbeat_before_others_may_rescue_it() {
        let (beat, dead_after) = (Duration::from_secs(5), Duration::from_secs(15));
        assert!(may_claim(Duration::from_secs(9), beat, dead_after));
        assert!(may_claim(Duration::from_secs(10), beat, dead_after));
        assert!(!may_claim(Duration::from_millis(10_001), beat, dead_after));
        assert!(!may_claim(Duration::from_secs(13), beat, dead_after));
    }
}
