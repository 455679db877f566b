//! The reply timeout: no statement on a server connection waits longer than this for its
//! reply.
//!
//! The client libraries wait for a reply without a limit: libpq and MariaDB Connector/C sit
//! in `poll` until bytes come. A reply that never comes — the server lost track of the
//! request, a proxy dropped it, the link died after the request was acknowledged — kept a
//! MySQL drain's last chunk `running` for good while its node heartbeated on (issue 29,
//! defect 14). TCP keepalives find a dead link, not a live server or proxy that stays
//! silent, and Connector/C's own read timeout cannot be set through diesel (see
//! `db::socket`). So every PostgreSQL and MySQL connection the engine opens is watched
//! here: each statement is timed from its start to its result (diesel's instrumentation
//! events), and one that has waited longer than the connection's reply timeout has its
//! socket shut down by a watchdog thread. The statement then fails as on a lost connection
//! (MySQL's 2013, PostgreSQL's closed connection), the server rolls back its transaction,
//! and the pool discards the connection; the worker releases the task, or reruns its chunk,
//! as after any lost connection.
//!
//! The timeout must outlast every legitimate statement, the handlers' own included (they
//! run on these connections): by default it is [`DEFAULT_REPLY_TIMEOUT`], raised to a
//! worker's task timeout plus [`REPLY_MARGIN`] for every connection of a process that runs
//! a worker with a longer one. A URL sets its own with `reply_timeout=` (`90s`, `10m`; `0`
//! or `off` for none), which is taken as given. `outbox migrate` runs without one unless
//! the URL sets it (an index built on a large table takes as long as it takes). diesel's
//! default instrumentation (`set_default_instrumentation`) still sees every event; code that
//! sets its own on one of these connections (`set_instrumentation`) replaces the clock, and
//! that connection goes without it.
//!
//! Why that drain's reply never came (docs/notes/2026-11-25-mysql-hang.md): InnoDB chose the
//! chunk's `SELECT … FOR UPDATE` as a deadlock's victim after its result set had begun, so
//! the rows ended in an error packet. MariaDB Connector/C then leaves that prepared
//! statement, which diesel keeps in its cache, in a state that says rows are still to be
//! read; the next `mysql_stmt_execute` of it, for the next chunk of the same size on that
//! connection, first waits for those rows, before sending anything, for ever. An error
//! that ends a result set after its first packets does it, whatever its cause (the test
//! uses a lock wait timeout). So a MySQL connection on which a statement failed is not used
//! again: the pool drops it when it comes back, the heartbeat opens a new one.

#[cfg(feature = "mysql")]
use std::sync::atomic::AtomicI64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use diesel::connection::{Instrumentation, InstrumentationEvent};

use super::socket::Socket;
use super::Backend;

/// What a worker adds to its task timeout for the reply timeout of its process's
/// connections: a handler's statement may take as long as its task, and the engine's
/// statements take well under a second.
pub const REPLY_MARGIN: Duration = Duration::from_secs(60);

/// The reply timeout of a connection whose URL sets none: the default task timeout (5 min)
/// plus [`REPLY_MARGIN`], 6 minutes (checked where the default task timeout is defined, in
/// the worker, which the connections do not depend on).
pub const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(360);

/// How often the watchdog looks at the statements under way.
const TICK: Duration = Duration::from_millis(250);

/// A connection's reply timeout as its URL gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ReplyTimeout {
    /// None set: [`DEFAULT_REPLY_TIMEOUT`], or a worker's task timeout plus [`REPLY_MARGIN`]
    /// when a worker of this process has a longer one.
    Default,
    /// `reply_timeout=…` (or [`super::DatabaseUrl::with_reply_timeout`]).
    Set(Duration),
    /// `reply_timeout=0` or `off`: statements wait as long as the client library does.
    Off,
}

/// The longest task timeout of a worker started in this process, plus the margin, in
/// milliseconds (0: none started).
static WORKER_FLOOR_MS: AtomicU64 = AtomicU64::new(0);

impl ReplyTimeout {
    /// The timeout in force now.
    pub(crate) fn get(self) -> Option<Duration> {
        match self {
            ReplyTimeout::Default => Some(DEFAULT_REPLY_TIMEOUT.max(Duration::from_millis(
                WORKER_FLOOR_MS.load(Ordering::Relaxed),
            ))),
            ReplyTimeout::Set(timeout) => Some(timeout),
            ReplyTimeout::Off => None,
        }
    }
}

/// Raises the default reply timeout of this process's connections (those opened already
/// too) to `task_timeout` plus [`REPLY_MARGIN`]: a worker with that task timeout starts.
pub(crate) fn cover_task_timeout(task_timeout: Duration) {
    let needed = task_timeout.saturating_add(REPLY_MARGIN);
    WORKER_FLOOR_MS.fetch_max(
        u64::try_from(needed.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// One server connection: its socket (when found), its timeout, and the statement it runs.
#[derive(Debug)]
struct Watched {
    socket: Option<Socket>,
    timeout: ReplyTimeout,
    backend: Backend,
    state: Mutex<Statement>,
    /// Its database's label in the log, in a fleet (`crate::log_label`): the watchdog's
    /// thread is the process's.
    label: Option<Arc<str>>,
    /// The node this session works for, as its server knows it (MySQL's named lock, see
    /// `driver/mysql/session.rs`); 0 for none.
    #[cfg(feature = "mysql")]
    node: AtomicI64,
}

#[derive(Debug, Default)]
struct Statement {
    /// When the statement under way started (none between statements).
    since: Option<Instant>,
    /// The watchdog shut the socket down: the connection is dead.
    cut: bool,
    /// A statement failed on this connection since it opened.
    failed: bool,
    /// MySQL: the open transaction was rolled back by the server (a deadlock's victim), so
    /// what runs after it runs outside it.
    rolled_back: bool,
}

impl Watched {
    fn lock(&self) -> std::sync::MutexGuard<'_, Statement> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The instrumentation installed on every server connection: it times each statement for
/// the watchdog and notes a failed one, and passes every event on to diesel's default
/// instrumentation, if the application set one.
pub(crate) struct StatementClock {
    watched: Arc<Watched>,
    inner: Option<Box<dyn Instrumentation>>,
}

impl Instrumentation for StatementClock {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        match event {
            InstrumentationEvent::StartQuery { .. } => {
                self.watched.lock().since = Some(Instant::now());
            }
            InstrumentationEvent::FinishQuery { error, .. } => {
                let mut statement = self.watched.lock();
                statement.since = None;
                statement.failed |= error.is_some();
                // By its kind, or by its message: a statement of `batch_execute` reports no
                // kind, and the message is English only.
                statement.rolled_back |= self.watched.backend == Backend::Mysql
                    && error.is_some_and(|e| {
                        matches!(
                            e,
                            diesel::result::Error::DatabaseError(
                                diesel::result::DatabaseErrorKind::SerializationFailure,
                                _
                            )
                        ) || super::transaction::is_deadlock(e)
                    });
            }
            InstrumentationEvent::BeginTransaction { depth, .. } if depth.get() == 1 => {
                self.watched.lock().rolled_back = false;
            }
            _ => {}
        }
        if let Some(inner) = &mut self.inner {
            inner.on_connection_event(event);
        }
    }
}

/// Installs the statement clock on a server connection; with its `socket` and a `timeout`,
/// the watchdog watches it (and is started if it is not running).
pub(crate) fn watch(
    conn: &mut super::DbConnection,
    socket: Option<Socket>,
    timeout: ReplyTimeout,
    backend: Backend,
) {
    use diesel::Connection;
    let watched = Arc::new(Watched {
        socket,
        timeout,
        backend,
        state: Mutex::default(),
        label: crate::log_database(),
        #[cfg(feature = "mysql")]
        node: AtomicI64::new(0),
    });
    if watched.socket.is_some() && timeout != ReplyTimeout::Off {
        let mut registry = registry();
        registry.push(Arc::downgrade(&watched));
        if !WATCHDOG_RUNNING.swap(true, Ordering::SeqCst) {
            let started = std::thread::Builder::new()
                .name("outbox-reply-watchdog".into())
                .spawn(watchdog_loop);
            if let Err(e) = started {
                WATCHDOG_RUNNING.store(false, Ordering::SeqCst);
                log::error!(
                    "the reply watchdog could not start: {e}; statements wait without a limit"
                );
            }
        }
    }
    conn.set_instrumentation(StatementClock {
        watched,
        inner: diesel::connection::get_default_instrumentation(),
    });
}

/// Whether `conn` must not be used again: the watchdog shut its socket down, or it is a
/// MySQL connection on which a statement failed (one of its cached prepared statements may
/// wait, at its next execution, for rows that will never come; see the module's
/// documentation). A pool drops such a connection instead of handing it out again; a
/// connection held on its own is opened anew.
pub(crate) fn must_not_be_reused(conn: &mut super::DbConnection) -> bool {
    use diesel::Connection;
    let Some(clock) = conn.instrumentation().downcast_ref::<StatementClock>() else {
        return false;
    };
    let statement = clock.watched.lock();
    statement.cut || (statement.failed && clock.watched.backend == Backend::Mysql)
}

/// Whether the server rolled back the transaction open on `conn` under it: on MySQL a
/// deadlock's victim (1213) loses its whole transaction, and the statements after it run in
/// autocommit, where PostgreSQL would refuse them until the rollback.
pub(crate) fn transaction_rolled_back(conn: &mut super::DbConnection) -> bool {
    use diesel::Connection;
    conn.instrumentation()
        .downcast_ref::<StatementClock>()
        .is_some_and(|clock| clock.watched.lock().rolled_back)
}

/// The node `conn`'s session works for as its server knows it (0: none), as
/// [`set_session_node`] noted; `None` for a connection without the statement clock.
#[cfg(feature = "mysql")]
pub(crate) fn session_node<C: diesel::Connection>(conn: &mut C) -> Option<i64> {
    let clock = conn.instrumentation().downcast_ref::<StatementClock>()?;
    Some(clock.watched.node.load(Ordering::Relaxed))
}

/// Notes that `conn`'s session now works for `node` as its server knows it.
#[cfg(feature = "mysql")]
pub(crate) fn set_session_node<C: diesel::Connection>(conn: &mut C, node: i64) {
    if let Some(clock) = conn.instrumentation().downcast_ref::<StatementClock>() {
        clock.watched.node.store(node, Ordering::Relaxed);
    }
}

/// The watched connections (weakly: a connection dropped is forgotten at the next look).
static REGISTRY: Mutex<Vec<Weak<Watched>>> = Mutex::new(Vec::new());

/// Whether the watchdog thread runs; it stops once no connection is left to watch.
static WATCHDOG_RUNNING: AtomicBool = AtomicBool::new(false);

fn registry() -> std::sync::MutexGuard<'static, Vec<Weak<Watched>>> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

fn watchdog_loop() {
    loop {
        std::thread::sleep(TICK);
        run_once(Instant::now());
        let registry = registry();
        if registry.is_empty() {
            // Under the registry's lock: a connection watched from now on starts a new one.
            WATCHDOG_RUNNING.store(false, Ordering::SeqCst);
            return;
        }
    }
}

/// Cuts each watched connection whose statement has waited past its reply timeout at
/// `now`, and forgets the connections that are gone. Returns how many it cut.
pub(crate) fn run_once(now: Instant) -> usize {
    let watched: Vec<Arc<Watched>> = {
        let mut registry = registry();
        registry.retain(|w| w.strong_count() > 0);
        registry.iter().filter_map(Weak::upgrade).collect()
    };
    let mut cut = 0;
    for w in watched {
        let (Some(timeout), Some(socket)) = (w.timeout.get(), &w.socket) else {
            continue;
        };
        // Under the statement's lock: it cannot finish meanwhile, so the socket cut is the
        // one of the statement that overran (and a dropped connection is not watched).
        let mut statement = w.lock();
        let Some(since) = statement.since else {
            continue;
        };
        let waited = now.saturating_duration_since(since);
        if statement.cut || waited <= timeout {
            continue;
        }
        statement.cut = true;
        let _label = crate::log_label::labelled(w.label.as_ref());
        match socket.cut() {
            Ok(()) => {
                cut += 1;
                log::error!(
                    "a statement on a {} connection had no reply after {waited:?}, past its \
                     reply timeout of {timeout:?}: the connection is closed, its transaction \
                     rolled back",
                    w.backend
                );
            }
            Err(e) => log::error!(
                "a statement on a {} connection had no reply after {waited:?}, and its \
                 connection could not be closed: {e}",
                w.backend
            ),
        }
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_raises_the_default_never_a_timeout_set() {
        assert!(ReplyTimeout::Default.get().unwrap() >= DEFAULT_REPLY_TIMEOUT);
        cover_task_timeout(Duration::from_secs(3600));
        assert_eq!(
            ReplyTimeout::Default.get(),
            Some(Duration::from_secs(3600) + REPLY_MARGIN)
        );
        cover_task_timeout(Duration::from_secs(10));
        assert_eq!(
            ReplyTimeout::Default.get(),
            Some(Duration::from_secs(3600) + REPLY_MARGIN),
            "a shorter task timeout lowers nothing"
        );
        assert_eq!(
            ReplyTimeout::Set(Duration::from_secs(5)).get(),
            Some(Duration::from_secs(5))
        );
        assert_eq!(ReplyTimeout::Off.get(), None);
    }
}
