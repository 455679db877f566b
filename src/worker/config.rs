//! The worker's configuration as its user writes it ([`WorkerConfig`]), and the defaults
//! of each setting. What a worker runs with, every default filled in and checked, is
//! [`super::settings::Settings`].

use std::time::Duration;

use super::style::ClaimStyle;
use crate::backoff::Backoff;
use crate::domain::Domain;
use crate::strategy::{Strategy, DEFAULT_WEIGHT};

/// Tasks claimed per claim statement by default in strict mode.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// The largest page a claim may take.
pub const MAX_PAGE_SIZE: usize = 10_000;
/// Attempts a task gets by default before it is dead.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 20;
/// How often an idle `run` worker looks for due tasks by default (jittered by ±10%).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How often a node records its heartbeat (and rescues the tasks of dead nodes) by default.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);
/// A node is dead after this many heartbeat intervals without one, by default.
pub const DEFAULT_DEAD_AFTER_BEATS: u32 = 3;
/// How long a task's handler may run before any live node rescues the task, by default.
pub const DEFAULT_TASK_TIMEOUT: Duration = Duration::from_secs(300);

// A connection's default reply timeout covers the default task timeout, with its margin.
const _: () = assert!(
    crate::db::reply::DEFAULT_REPLY_TIMEOUT.as_secs()
        == DEFAULT_TASK_TIMEOUT.as_secs() + crate::db::reply::REPLY_MARGIN.as_secs()
);
pub use crate::task::MAX_TASK_TIMEOUT;
/// The longest error message stored in `last_error`, in bytes.
pub const MAX_ERROR_LEN: usize = 2000;
/// The default queue per execution thread on PostgreSQL: larger claims, fewer of them (each
/// claim is a statement that locks and updates its rows).
pub const QUEUE_PER_THREAD: usize = 8;
/// The default queue on SQLite, where one thread runs tasks by default.
pub const SQLITE_DEFAULT_QUEUE: usize = 128;

/// The default number of execution threads on PostgreSQL: four per core, at most
/// [`MAX_DEFAULT_THREADS`]. A task spends most of its time waiting for round trips and for
/// its commit's WAL flush, and commits that wait together share one flush: in strict mode 8
/// threads on 2 cores drained 1.3 × as fast as 4 with the same CPU (`docs/notes/performance.md`).
/// The cap keeps a worker on a large machine within a database's connections (each thread
/// holds one while it runs a task).
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get() * 4)
        .min(MAX_DEFAULT_THREADS)
}

/// The most execution threads a PostgreSQL worker gets by default (a pool of 18 connections).
pub const MAX_DEFAULT_THREADS: usize = 16;

/// How a [`crate::Worker`] claims and runs tasks.
///
/// Built from [`WorkerConfig::default`] with its setters; a setting left unset takes the
/// default of the worker's backend when the worker starts.
///
/// ```
/// use std::time::Duration;
/// use outbox::WorkerConfig;
///
/// let config = WorkerConfig::default()
///     .threads(8)
///     .task_timeout(Duration::from_secs(60))
///     .commit_batch(50);
/// assert_eq!(config.threads, Some(8));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// Execution threads (default: four per core on PostgreSQL and MySQL, 1 on SQLite).
    pub threads: Option<usize>,
    /// Tasks (chunks, in batched mode) waiting for a thread beyond those running. Default:
    /// [`QUEUE_PER_THREAD`] × threads on PostgreSQL and MySQL, [`SQLITE_DEFAULT_QUEUE`] on SQLite
    /// unless `threads` is set (then 8 per thread), and one chunk per thread in batched
    /// mode. A longer queue makes claims larger. When `threads + queue` units are in flight,
    /// the claiming thread runs the next one itself (CallerRuns).
    pub queue: Option<usize>,
    /// Tasks claimed per claim statement, at most (default 100; in batched mode, enough for
    /// a chunk per thread and queue slot: `(threads + queue + 1) × commit_batch`). A claim
    /// never takes more than can start at once, so that a claimed task waits at most for the
    /// queue ahead of it.
    pub page_size: Option<usize>,
    /// Attempts for tasks that do not set their own (default 20).
    pub max_attempts: i32,
    /// Delay between attempts.
    pub backoff: Backoff,
    /// How often an idle `run` worker polls (default 1 s, jittered ±10%).
    pub poll_interval: Duration,
    /// Whether `run` listens for `NOTIFY` on PostgreSQL to wake early (default on; turn it off
    /// behind PgBouncer in transaction mode).
    pub listen: bool,
    /// How often the node records its heartbeat, and rescues the tasks of dead nodes, each on
    /// a thread of its own (default 5 s).
    pub heartbeat: Duration,
    /// A node whose last heartbeat is older than this, by the database clock, is dead: its
    /// running tasks are rescued (default 3 heartbeats). A node that has not managed to
    /// record a heartbeat for `dead_after − heartbeat` stops claiming.
    pub dead_after: Option<Duration>,
    /// How long a task's handler may run (default 5 min). A claimed task's deadline in the
    /// database is its claim time plus this (times `commit_batch` in batched mode, whose
    /// chunk runs its handlers one after another), and must also cover the time it waits in
    /// the queue; any live node rescues a task past its deadline, counting a failure, and the
    /// late completion is fenced out. At most [`MAX_TASK_TIMEOUT`].
    pub task_timeout: Duration,
    /// Whether the process exits (status 3) when a handler has run past `task_timeout` by one
    /// more heartbeat interval (default off; the `outbox` binary turns it on).
    ///
    /// A Rust thread cannot be killed, and a hung handler keeps its transaction open: on
    /// SQLite that transaction holds the database's only write lock, so every process
    /// stalls; on PostgreSQL it holds a connection, its locks and a thread. Exiting frees
    /// them all; the supervisor (systemd, cron) starts a fresh process and the hung task is
    /// rescued, counting a failure. Each handler is timed alone, in batched mode too.
    pub exit_on_hang: bool,
    /// Tasks per transaction (default 1: strict mode, one transaction per task).
    ///
    /// With `K > 1` (batched mode) a thread runs up to K claimed tasks in one transaction and
    /// marks them done with one fenced UPDATE. If anything fails in the chunk — a handler
    /// error or panic, a claim taken over, the commit — the whole chunk rolls back and its
    /// tasks are run again one by one in strict mode, so in-database effects stay
    /// exactly-once and a failing task neither loses nor completes the others; external
    /// effects of the rolled-back chunk happen again.
    pub commit_batch: usize,
    /// How tasks are claimed: stamped, or leased for their chunk's transaction (see
    /// [`ClaimStyle`]; default [`ClaimStyle::Auto`]).
    pub claim_style: ClaimStyle,
    /// The node's task domains (none by default: every keyword is `default`'s and takes any
    /// thread). See [`crate::domain`]. Under lock claims a domain queues nothing: each
    /// chunk is leased for a domain's free thread and starts at once.
    pub domains: Vec<Domain>,

    // Watching the worker from outside (docs/guide/src/metrics.md).
    /// Where to serve Prometheus metrics (`/metrics`) and the health check (`/healthz`),
    /// on a thread of the worker's own (none by default; port 0 picks a free port, see
    /// [`crate::Worker::metrics_addr`]). The worker fails to start when it cannot listen
    /// there ([`Error::MetricsServer`](crate::Error::MetricsServer)). See [`crate::metrics`].
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// A command run by `sh -c` when a task becomes dead, with the task in its environment
    /// (`OUTBOX_TASK_ID`, `OUTBOX_KEYWORD`, `OUTBOX_BIZ_ID`, `OUTBOX_TENANT`,
    /// `OUTBOX_ERROR`; never the payload), off the worker's threads (none by default). It
    /// inherits the worker's environment without `DATABASE_URL`, `PGPASSWORD`, `MYSQL_PWD`
    /// or any variable whose value holds the database's password.
    pub on_dead: Option<String>,
    /// How long the `on_dead` command may run before it is killed (default
    /// [`super::on_dead::DEFAULT_ON_DEAD_TIMEOUT`], 30 s).
    pub on_dead_timeout: Duration,

    // Claim strategies (see [`crate::strategy`]).
    /// Which of the due tasks this node claims (default [`Strategy::Default`]: any).
    pub strategy: Strategy,
    /// This node's weight among the nodes that share the ids, with [`Strategy::Weight`]
    /// (default [`DEFAULT_WEIGHT`]; at most [`crate::strategy::MAX_WEIGHT`]): it owns that
    /// many remainders of the ids modulo the sum of their weights.
    pub weight: u32,
    /// With [`Strategy::IdHash`] or [`Strategy::Weight`]: how long a task another node owns
    /// must have been due before this node claims it anyway (default: `dead_after`, the
    /// time it takes to call a silent node dead).
    pub strategy_grace: Option<Duration>,
    /// With [`Strategy::LeastCount`]: how many tasks more than the least-loaded other live
    /// node this node may hold (default: its threads; at least 1).
    pub slack: Option<usize>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            threads: None,
            queue: None,
            page_size: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::default(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            listen: true,
            heartbeat: DEFAULT_HEARTBEAT,
            dead_after: None,
            task_timeout: DEFAULT_TASK_TIMEOUT,
            exit_on_hang: false,
            commit_batch: 1,
            claim_style: ClaimStyle::Auto,
            domains: Vec::new(),
            metrics_addr: None,
            on_dead: None,
            on_dead_timeout: super::on_dead::DEFAULT_ON_DEAD_TIMEOUT,
            strategy: Strategy::Default,
            weight: DEFAULT_WEIGHT,
            strategy_grace: None,
            slack: None,
        }
    }
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty => $value:expr;)*) => {$(
        $(#[$doc])*
        pub fn $name(mut self, $name: $ty) -> Self {
            self.$name = $value;
            self
        }
    )*};
}

impl WorkerConfig {
    setters! {
        /// Sets the execution threads.
        threads: usize => Some(threads);
        /// Sets the queue (tasks, or chunks in batched mode, waiting for a thread).
        queue: usize => Some(queue);
        /// Sets the most tasks one claim takes.
        page_size: usize => Some(page_size);
        /// Sets the attempts of tasks that set none.
        max_attempts: i32 => max_attempts;
        /// Sets the retry backoff.
        backoff: Backoff => backoff;
        /// Sets the idle poll interval of `run`.
        poll_interval: Duration => poll_interval;
        /// Turns `LISTEN` on PostgreSQL on or off.
        listen: bool => listen;
        /// Sets the heartbeat (and rescue) interval.
        heartbeat: Duration => heartbeat;
        /// Sets how long a silent node has before it is dead.
        dead_after: Duration => Some(dead_after);
        /// Sets how long a handler may run.
        task_timeout: Duration => task_timeout;
        /// Makes the process exit (status 3) when a handler hangs.
        exit_on_hang: bool => exit_on_hang;
        /// Sets the tasks per transaction (1: strict mode).
        commit_batch: usize => commit_batch;
        /// Sets how tasks are claimed.
        claim_style: ClaimStyle => claim_style;
        /// Serves metrics and the health check on this address.
        metrics_addr: std::net::SocketAddr => Some(metrics_addr);
        /// Runs this command (`sh -c`) when a task becomes dead.
        on_dead: impl Into<String> => Some(on_dead.into());
        /// Sets how long the dead-task command may run.
        on_dead_timeout: Duration => on_dead_timeout;
        /// Sets the claim strategy.
        strategy: Strategy => strategy;
        /// Sets the node's weight ([`Strategy::Weight`]).
        weight: u32 => weight;
        /// Sets how long another node's task waits before this one takes it anyway
        /// ([`Strategy::IdHash`], [`Strategy::Weight`]).
        strategy_grace: Duration => Some(strategy_grace);
        /// Sets how far ahead of the least-loaded node this one may get
        /// ([`Strategy::LeastCount`]).
        slack: usize => Some(slack);
    }

    /// Adds a task domain (checked with the others when the worker starts).
    pub fn domain(mut self, domain: Domain) -> Self {
        self.domains.push(domain);
        self
    }
}
