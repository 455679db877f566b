//! The worker's settings and their defaults.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::error::{Error, Result};

/// Tasks claimed per claim statement by default.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// Attempts a task gets by default before it is dead.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 20;
/// How often an idle `run` worker looks for due tasks by default (jittered by ±10%).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How often a node records its heartbeat by default.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);
/// A node is dead after this many heartbeat intervals without one, by default.
pub const DEFAULT_DEAD_AFTER_BEATS: u32 = 3;
/// How long a task may run before any live node rescues it, by default.
pub const DEFAULT_TASK_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest task timeout accepted (100 years): a claim's deadline is the database clock
/// plus the timeout, and past the year 9999 SQLite's date functions give NULL, a task without
/// a deadline, which rescue would never find.
pub const MAX_TASK_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// The longest error message stored in `last_error`, in bytes.
pub const MAX_ERROR_LEN: usize = 2000;

/// The default number of execution threads: twice the cores, because a task spends most of
/// its time waiting for database round trips.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get() * 2)
}

/// How a [`crate::Worker`] claims and runs tasks.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Execution threads in the rayon pool (default: twice the cores).
    pub threads: usize,
    /// Tasks waiting for a thread beyond those running (default: [`QUEUE_PER_THREAD`] ×
    /// `threads`; a longer queue makes claims larger, and each claim is a statement that
    /// locks and updates its rows, so fewer claims per task is faster). When
    /// `threads + queue` tasks are in flight, the claiming thread runs the next one itself.
    pub queue: usize,
    /// Tasks claimed per claim statement, at most (default 100). A claim never takes more
    /// than can start at once (`threads + queue + 1`, the claiming thread), so that a claimed
    /// task waits at most for the queue ahead of it.
    pub page_size: usize,
    /// Attempts for tasks that do not set their own (default 20).
    pub max_attempts: i32,
    /// Delay between attempts.
    pub backoff: Backoff,
    /// How often an idle `run` worker polls (default 1 s, jittered).
    pub poll_interval: Duration,
    /// Whether `run` listens for `NOTIFY` on PostgreSQL to wake early (default on; turn it off
    /// behind PgBouncer in transaction mode).
    pub listen: bool,
    /// How often the node records its heartbeat (and rescues the tasks of dead nodes) on its
    /// own connection (default 5 s).
    pub heartbeat: Duration,
    /// A node whose last heartbeat is older than this, by the database clock, is dead: its
    /// running tasks are rescued (default 3 heartbeats). A node that has not managed to
    /// record a heartbeat for `dead_after − heartbeat` stops claiming.
    pub dead_after: Duration,
    /// How long a task may take from its claim before it is rescued as hung (default 5 min).
    /// It must exceed the longest handler by the time a claimed task may wait in the queue.
    /// The handler thread cannot be killed; its late completion is fenced out. At most
    /// [`MAX_TASK_TIMEOUT`].
    pub task_timeout: Duration,
    /// Whether the process exits (status 3) when a handler has run past `task_timeout` by one
    /// more heartbeat interval (default off; the `outbox` binary turns it on).
    ///
    /// A Rust thread cannot be killed, and a hung handler keeps its transaction open: on
    /// SQLite that transaction holds the database's only write lock, so every process
    /// stalls; on PostgreSQL it holds a connection, its row locks and the worker's claiming
    /// thread. Exiting frees them all; the supervisor (systemd, cron) starts a fresh process
    /// and the hung task is rescued, counting a failure.
    pub exit_on_hang: bool,
    /// Tasks per transaction (default 1: strict mode, one transaction per task).
    ///
    /// With `K > 1` (batched mode) a thread runs up to K claimed tasks in one transaction and
    /// marks them done with one fenced UPDATE. If anything fails in the chunk — a handler
    /// error or panic, a claim taken over, the commit — the whole chunk rolls back and its
    /// tasks are run again one by one in strict mode, so in-database effects stay
    /// exactly-once and a failing task neither loses nor completes the others; external
    /// effects of the rolled-back chunk happen again. A claim takes up to
    /// `(threads + queue + 1) × K` tasks, capped by `page_size`: raise `page_size` to that to
    /// give every thread a chunk (the CLI does so by default).
    pub commit_batch: usize,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        let threads = default_threads();
        WorkerConfig {
            threads,
            queue: threads * QUEUE_PER_THREAD,
            page_size: DEFAULT_PAGE_SIZE,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::default(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            listen: true,
            heartbeat: DEFAULT_HEARTBEAT,
            dead_after: DEFAULT_HEARTBEAT * DEFAULT_DEAD_AFTER_BEATS,
            task_timeout: DEFAULT_TASK_TIMEOUT,
            exit_on_hang: false,
            commit_batch: 1,
        }
    }
}

/// The default queue per execution thread. Measured on PostgreSQL (2 cores, fsync on), strict
/// mode: 0.46 of the single-row reference with 1 per thread, 0.56 with 8.
pub const QUEUE_PER_THREAD: usize = 8;

/// The default queue on SQLite (see [`WorkerConfig::for_backend`]).
pub const SQLITE_DEFAULT_QUEUE: usize = 128;

impl WorkerConfig {
    /// The defaults for a backend. PostgreSQL: [`WorkerConfig::default`]. SQLite: one thread
    /// and a queue of [`SQLITE_DEFAULT_QUEUE`]: SQLite has one writer at a time and a task's
    /// transaction holds the write lock from its start, so more threads run nothing more at
    /// once and only take turns; a long queue makes claims larger (each claim is a write
    /// transaction of its own). Measured (strict mode, no-op tasks): 0.17 of the single-row
    /// reference with 4 threads and a queue of 4, 0.45 with 1 and 64, 0.50 with 1 and 128.
    /// A claimed task may then wait behind 128 others, and its deadline runs from its claim:
    /// keep SQLite handlers short (milliseconds), or lower the queue.
    pub fn for_backend(backend: crate::db::Backend) -> WorkerConfig {
        match backend {
            crate::db::Backend::Postgres => WorkerConfig::default(),
            crate::db::Backend::Sqlite => WorkerConfig {
                threads: 1,
                queue: SQLITE_DEFAULT_QUEUE,
                ..WorkerConfig::default()
            },
        }
    }

    /// Checks every setting, naming the one out of range.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidConfig(what));
        if !(1..=1024).contains(&self.threads) {
            return bad(format!(
                "threads must be between 1 and 1024, not {}",
                self.threads
            ));
        }
        if self.queue > 100_000 {
            return bad(format!("queue must be at most 100000, not {}", self.queue));
        }
        if !(1..=10_000).contains(&self.page_size) {
            return bad(format!(
                "page size must be between 1 and 10000, not {}",
                self.page_size
            ));
        }
        if self.max_attempts < 1 {
            return bad(format!(
                "max attempts must be at least 1, not {}",
                self.max_attempts
            ));
        }
        if self.poll_interval < Duration::from_millis(10) {
            return bad("poll interval must be at least 10ms".into());
        }
        if self.heartbeat < Duration::from_millis(100) {
            return bad("heartbeat must be at least 100ms".into());
        }
        if self.dead_after < self.heartbeat * 2 {
            return bad(format!(
                "dead-after ({:?}) must be at least two heartbeats ({:?})",
                self.dead_after,
                self.heartbeat * 2
            ));
        }
        if !(1..=1000).contains(&self.commit_batch) {
            return bad(format!(
                "commit batch must be between 1 and 1000, not {}",
                self.commit_batch
            ));
        }
        if self.task_timeout < Duration::from_millis(100) {
            return bad("task timeout must be at least 100ms".into());
        }
        if self.task_timeout > MAX_TASK_TIMEOUT {
            return bad(format!(
                "task timeout must be at most 100 years, not {:?}",
                self.task_timeout
            ));
        }
        self.backoff.validate().map_err(Error::InvalidConfig)
    }

    /// The most tasks one claim may take: every thread, the queue, and the claiming thread,
    /// each with a chunk of `commit_batch` tasks.
    pub fn claim_capacity(&self) -> usize {
        (self.threads + self.queue + 1) * self.commit_batch
    }

    /// Connections the worker's pool needs: one per thread, one for the claiming thread
    /// (which also runs tasks when the pool is full and, on PostgreSQL, while it waits for
    /// room), one to spare (the rescue pass). The heartbeat has its own
    /// connection outside the pool.
    pub fn pool_size(&self) -> u32 {
        u32::try_from(self.threads + 2).unwrap_or(u32::MAX)
    }
}
