//! The hang watchdog: which handlers are running, and since when, so that a handler running
//! past its task timeout can be found (and, with [`crate::WorkerConfig::exit_on_hang`], the
//! process exits to free what the hung handler holds).
//!
//! Each handler is watched from its own start to its own end: in batched mode the handlers
//! of a chunk run one after another, and each is measured alone.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::driver::LockHolder;
use crate::task::ClaimedTask;

/// Each running handler by task id and claim token: when it started, and its lock claim.
type Running = HashMap<(i64, i64), (Instant, Option<LockedRun>)>;

/// The handlers running now, by task id and claim token, with when each started.
#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    running: Mutex<Running>,
    /// How long a handler may run before the process exits; `None`: nothing is watched.
    limit: Option<Duration>,
}

/// A handler found running past the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hung {
    pub(crate) task: i64,
    pub(crate) running_for: Duration,
    /// Set when the task runs under a lock claim.
    pub(crate) lock: Option<LockedRun>,
}

/// What it takes to end a lock-claimed task's run and count its failure: the transaction
/// that holds the lock, the task's claim token and its failures so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockedRun {
    pub(crate) holder: LockHolder,
    pub(crate) token: i64,
    pub(crate) failures: i32,
}

/// Watches one handler until dropped.
pub(crate) struct Watch<'w> {
    watchdog: &'w Watchdog,
    key: (i64, i64),
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
        }
    }

    /// How long a handler may run, when hangs are watched.
    pub(crate) fn limit(&self) -> Option<Duration> {
        self.limit
    }

    /// Notes that the handler of a task's claim starts now, until the returned guard drops.
    /// Keyed by id and claim token: a task rescued from a hung run and claimed again by this
    /// node is another run.
    pub(crate) fn watch(&self, task: i64, token: i64) -> Watch<'_> {
        self.watch_run(task, token, None)
    }

    /// [`Watchdog::watch`] for a task of a locked chunk whose transaction is `holder`.
    pub(crate) fn watch_locked(&self, task: &ClaimedTask, holder: LockHolder) -> Watch<'_> {
        let run = LockedRun {
            holder,
            token: task.claim_token,
            failures: task.failures,
        };
        self.watch_run(task.context.id, task.claim_token, Some(run))
    }

    fn watch_run(&self, task: i64, token: i64, lock: Option<LockedRun>) -> Watch<'_> {
        if self.limit.is_some() {
            self.lock().insert((task, token), (Instant::now(), lock));
        }
        Watch {
            watchdog: self,
            key: (task, token),
        }
    }

    /// The first handler that has run longer than the limit, if any.
    pub(crate) fn run_once(&self) -> Option<Hung> {
        self.run_once_at(Instant::now())
    }

    /// [`Watchdog::run_once`] as of `now`.
    fn run_once_at(&self, now: Instant) -> Option<Hung> {
        let limit = self.limit?;
        self.lock()
            .iter()
            .map(|(&(task, _), &(started, lock))| Hung {
                task,
                running_for: now.saturating_duration_since(started),
                lock,
            })
            .find(|hung| hung.running_for > limit)
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
                if hung.lock.is_some() {
                    "its failure was counted as its chunk's transaction ended"
                } else {
                    "the task is rescued as a failure"
                }
            );
            std::process::exit(3);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handler_is_watched_from_its_start_to_its_end() {
        let limit = Duration::from_secs(60);
        let watchdog = Watchdog::new(Some(limit));
        let watch = watchdog.watch(1, 7);
        let now = Instant::now();
        assert_eq!(watchdog.run_once_at(now), None);
        let hung = watchdog.run_once_at(now + limit * 2).expect("hung");
        assert_eq!(hung.task, 1);
        assert!(hung.running_for > limit);
        drop(watch);
        assert_eq!(watchdog.run_once_at(now + limit * 100), None, "it ended");
    }

    #[test]
    fn nothing_is_watched_without_a_limit() {
        let watchdog = Watchdog::new(None);
        let _watch = watchdog.watch(1, 1);
        assert!(watchdog.lock().is_empty());
        assert_eq!(watchdog.run_once(), None);
    }
}
