//! The execution pool: a rayon pool with a bounded number of tasks in flight, and
//! CallerRuns when the bound is reached.
//!
//! This is seed 003's `ThreadPoolExecutor(…, new ArrayBlockingQueue(n), new CallerRunsPolicy())`:
//! when every thread is busy and the queue is full, the claiming thread runs the next task
//! itself. That bounds memory, and it slows claiming down exactly as much as execution lags.
//! Nothing task-specific lives in thread-local state, so running on the caller is safe.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A rayon pool with an in-flight bound.
pub(crate) struct Dispatcher {
    pool: rayon::ThreadPool,
    in_flight: AtomicUsize,
    bound: usize,
    caller_runs: AtomicU64,
}

impl Dispatcher {
    /// A pool of `threads` threads accepting up to `threads + queue` tasks in flight.
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
        })
    }

    /// Runs `work` on every item and returns when all have finished. Items go to the pool
    /// while fewer than the bound are in flight; past it, the calling thread runs the item
    /// itself before it dispatches the next.
    pub(crate) fn run_all<T, F>(&self, items: Vec<T>, work: F)
    where
        T: Send,
        F: Fn(T) + Sync,
    {
        let work = &work;
        let in_flight = &self.in_flight;
        self.pool.in_place_scope(|scope| {
            for item in items {
                if in_flight.fetch_add(1, Ordering::AcqRel) < self.bound {
                    scope.spawn(move |_| {
                        work(item);
                        in_flight.fetch_sub(1, Ordering::AcqRel);
                    });
                } else {
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                    self.caller_runs.fetch_add(1, Ordering::Relaxed);
                    work(item);
                }
            }
        });
    }

    /// How many tasks the calling thread has run itself because the pool was full.
    pub(crate) fn caller_runs(&self) -> u64 {
        self.caller_runs.load(Ordering::Relaxed)
    }
}
