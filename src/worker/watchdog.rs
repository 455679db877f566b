//! The hang watchdog: which handlers are running, and since when, so that a handler running
//! past its task timeout can be found (and, with [`crate::WorkerConfig::exit_on_hang`], the
//! process exits to free what the hung handler holds).
//!
//! Each handler is watched from its own start to its own end: in batched mode the handlers
//! of a chunk run one after another, and each is measured alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::lease::{charge_leased, ChunkLease};
use super::settings::Settings;
use crate::db::DbPool;
use crate::error::OpContext;

/// Each running handler by its run's number: its task, its failures so far, when it
/// started, and its chunk's lease (lock claims).
type Running = HashMap<u64, Run>;

#[derive(Debug, Clone)]
struct Run {
    task: i64,
    failures: i32,
    started: Instant,
    /// How long it may run: the watchdog's limit, plus its domain's timeout past the task
    /// timeout.
    limit: Duration,
    lease: Option<ChunkLease>,
}

/// The handlers running now, each with when it started.
#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    running: Mutex<Running>,
    /// How long a handler may run before the process exits; `None`: nothing is watched.
    limit: Option<Duration>,
    /// Numbers the runs: a key of its own for each, whatever task and claim token it has
    /// (a task freed from a zombie run and leased again by this node may keep its token, and
    /// must not take the zombie's place).
    runs: AtomicU64,
}

/// A handler found running past the limit.
#[derive(Debug, Clone)]
pub(crate) struct Hung {
    pub(crate) task: i64,
    pub(crate) running_for: Duration,
    /// Its failures before this attempt.
    pub(crate) failures: i32,
    /// Set when the task runs in a leased chunk (lock claims).
    pub(crate) lease: Option<ChunkLease>,
}

/// Watches one handler until dropped.
pub(crate) struct Watch<'w> {
    watchdog: &'w Watchdog,
    key: u64,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if self.watchdog.limit.is_some() {
            self.watchdog.lock().remove(&self.key);
        }
    }
}

impl Watchdog {
    /// A watchdog that finds handlers running longer than `limit` (nothing is watched when
    /// `None`: the map would cost every task a lock for no one to read).
    pub(crate) fn new(limit: Option<Duration>) -> Self {
        Watchdog {
            running: Mutex::default(),
            limit,
            runs: AtomicU64::new(0),
        }
    }

    /// How long a handler may run, when hangs are watched.
    pub(crate) fn limit(&self) -> Option<Duration> {
        self.limit
    }

    /// Notes that the handler of `task` (with `failures` so far) starts now, until the
    /// returned guard drops; `lease`: the chunk it runs in, under lock claims; `longer`: how
    /// much longer than the task timeout it may run (its domain's timeout past it).
    pub(crate) fn watch(
        &self,
        task: i64,
        failures: i32,
        lease: Option<&ChunkLease>,
        longer: Duration,
    ) -> Watch<'_> {
        let key = self.runs.fetch_add(1, Ordering::Relaxed);
        if let Some(limit) = self.limit {
            self.lock().insert(
                key,
                Run {
                    task,
                    failures,
                    started: Instant::now(),
                    limit: limit.saturating_add(longer),
                    lease: lease.cloned(),
                },
            );
        }
        Watch {
            watchdog: self,
            key,
        }
    }

    /// The first handler that has run longer than its limit, if any.
    pub(crate) fn run_once(&self) -> Option<Hung> {
        self.run_once_at(Instant::now())
    }

    /// [`Watchdog::run_once`] as of `now`.
    fn run_once_at(&self, now: Instant) -> Option<Hung> {
        self.limit?;
        self.lock()
            .values()
            .find(|run| now.saturating_duration_since(run.started) > run.limit)
            .map(|run| Hung {
                task: run.task,
                running_for: now.saturating_duration_since(run.started),
                failures: run.failures,
                lease: run.lease.clone(),
            })
    }

    /// Exits the process (status 3) for a handler that has run past the limit, after
    /// `before_exit` (which counts the failure of a lock-claimed task).
    pub(crate) fn exit_if_hung(&self, node_id: i64, before_exit: impl FnOnce(&Hung)) {
        if let Some(hung) = self.run_once() {
            before_exit(&hung);
            log::error!(
                "node {node_id}: the handler of task {} has run for {:?}, past its task timeout: \
                 exiting (status 3) to free its thread, connection and locks; {}",
                hung.task,
                hung.running_for,
                if hung.lease.is_some() {
                    "its failure was counted as its chunk's transaction ended"
                } else {
                    "the task is rescued as a failure"
                }
            );
            exit_now(3);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Ends the process with `status` at once, without the exit handlers of the C libraries:
/// other threads may be inside libpq (its Kerberos library's destructor then aborted the
/// process instead of exiting, status 134 for 3), and a hung handler must not delay the exit.
/// The logs are unbuffered; stdout is flushed first.
#[allow(unsafe_code)]
fn exit_now(status: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process; it touches no memory of this process, and nothing
    // runs after it.
    unsafe { libc::_exit(status) }
}

/// Counts a failure for the hung handler of a leased chunk before the process exits: ends
/// the chunk (see [`charge_leased`]), so that the other tasks of the chunk are free again,
/// uncounted. Without this a task that hangs every time would be charged with its whole
/// chunk, by rescue, after the exit.
pub(crate) fn charge_hung(pool: &DbPool, settings: &Settings, owner: i64, hung: &Hung) {
    let Some(lease) = &hung.lease else { return };
    let error = format!(
        "running past its deadline: its handler ran for {:?}, past the task timeout; the \
         node ended its chunk's transaction",
        hung.running_for
    );
    let charged = super::heartbeat::node_conn(pool, owner)
        .op("task timeout")
        .and_then(|mut conn| {
            charge_leased(
                &mut conn,
                settings,
                owner,
                lease,
                hung.task,
                hung.failures,
                &error,
            )
        });
    match charged {
        Ok(Some(state)) => log::error!(
            "task {}: hung in a leased chunk; its chunk ended and a failure counted ({state})",
            hung.task
        ),
        Ok(None) => log::error!(
            "task {}: hung in a leased chunk, which had already lost it",
            hung.task
        ),
        Err(e) => log::error!(
            "task {}: hung in a leased chunk; its failure could not be counted: {e}",
            hung.task
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handler_is_watched_from_its_start_to_its_end() {
        let limit = Duration::from_secs(60);
        let watchdog = Watchdog::new(Some(limit));
        let watch = watchdog.watch(1, 0, None, Duration::ZERO);
        let now = Instant::now();
        assert!(watchdog.run_once_at(now).is_none());
        let hung = watchdog.run_once_at(now + limit * 2).expect("hung");
        assert_eq!(hung.task, 1);
        assert!(hung.running_for > limit);
        drop(watch);
        assert!(
            watchdog.run_once_at(now + limit * 100).is_none(),
            "it ended"
        );
    }

    #[test]
    fn a_handler_of_a_domain_with_a_longer_timeout_has_that_much_longer() {
        let limit = Duration::from_secs(60);
        let watchdog = Watchdog::new(Some(limit));
        let _watch = watchdog.watch(1, 0, None, Duration::from_secs(600));
        let now = Instant::now();
        assert!(watchdog.run_once_at(now + limit * 2).is_none());
        let hung = watchdog.run_once_at(now + limit * 12).expect("hung");
        assert_eq!(hung.task, 1);
    }

    #[test]
    fn nothing_is_watched_without_a_limit() {
        let watchdog = Watchdog::new(None);
        let _watch = watchdog.watch(1, 0, None, Duration::ZERO);
        assert!(watchdog.lock().is_empty());
        assert!(watchdog.run_once().is_none());
    }
}
