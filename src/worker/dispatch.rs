//! The execution pool: a rayon pool with a bounded number of tasks in flight, and
//! CallerRuns when the bound is reached.
//!
//! This is seed 003's `ThreadPoolExecutor(…, new ArrayBlockingQueue(n), new CallerRunsPolicy())`:
//! when every thread is busy and the queue is full, the claiming thread runs the next task
//! itself. That bounds memory, and it slows claiming down exactly as much as execution lags.
//! Nothing task-specific lives in thread-local state, so running on the caller is safe.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A rayon pool with an in-flight bound.
pub(crate) struct Dispatcher {
    pool: rayon::ThreadPool,
    in_flight: AtomicUsize,
    bound: usize,
    caller_runs: AtomicU64,
    /// Signalled each time a unit of work finishes on the pool (for [`Self::wait_for_room`]).
    finished: (Mutex<()>, Condvar),
}

impl Dispatcher {
    /// A pool of `threads` threads accepting up to `threads + queue` units in flight.
    pub(crate) fn new(threads: usize, queue: usize) -> Result<Self, rayon::ThreadPoolBuildError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("outbox-task-{i}"))
            .build()?;
        Ok(Dispatcher {
            pool,
            in_flight: AtomicUsize::new(0),
            bound: threads + queue,
            caller_runs: AtomicU64::new(0),
            finished: (Mutex::new(()), Condvar::new()),
        })
    }

    /// Runs `f` with a scope in which [`Self::submit`] may hand out work; returns when `f` has
    /// returned and all submitted work has finished.
    pub(crate) fn scope<'s, R>(&'s self, f: impl FnOnce(&rayon::Scope<'s>) -> R) -> R {
        self.pool.in_place_scope(f)
    }

    /// Hands `work` to the pool while fewer than the bound are in flight; past it, runs it
    /// on the calling thread (CallerRuns) before returning.
    pub(crate) fn submit<'s, F>(&'s self, scope: &rayon::Scope<'s>, work: F)
    where
        F: FnOnce() + Send + 's,
    {
        if self.in_flight.fetch_add(1, Ordering::AcqRel) < self.bound {
            scope.spawn(move |_| {
                work();
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
                let _guard = self.finished.0.lock().unwrap_or_else(|e| e.into_inner());
                self.finished.1.notify_all();
            });
        } else {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.caller_runs.fetch_add(1, Ordering::Relaxed);
            work();
        }
    }

    /// Units that can start now without waiting: free threads and queue slots, plus one for
    /// the calling thread.
    pub(crate) fn room(&self) -> usize {
        (self.bound + 1).saturating_sub(self.in_flight.load(Ordering::Acquire))
    }

    /// Waits until there is room for `want` units (at most the whole bound plus one), or
    /// `stop` is set.
    pub(crate) fn wait_for_room(&self, want: usize, stop: &AtomicBool) {
        let want = want.min(self.bound + 1);
        let mut guard = self.finished.0.lock().unwrap_or_else(|e| e.into_inner());
        while self.room() < want && !stop.load(Ordering::Relaxed) {
            guard = self
                .finished
                .1
                .wait_timeout(guard, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// How many units the calling thread has run itself because the pool was full.
    pub(crate) fn caller_runs(&self) -> u64 {
        self.caller_runs.load(Ordering::Relaxed)
    }
}
