//! The worker: claims pages of due tasks and runs them in a rayon pool.

mod config;
mod dispatch;
mod execute;
mod listen;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use config::{
    default_threads, WorkerConfig, DEFAULT_DEAD_AFTER_BEATS, DEFAULT_HEARTBEAT,
    DEFAULT_MAX_ATTEMPTS, DEFAULT_PAGE_SIZE, DEFAULT_POLL_INTERVAL, DEFAULT_TASK_TIMEOUT,
    MAX_ERROR_LEN, QUEUE_PER_THREAD, SQLITE_DEFAULT_QUEUE,
};
use dispatch::Dispatcher;
use execute::Outcome;
use listen::Listener;

use crate::db::{Backend, DatabaseUrl, DbPool, DiscardBroken};
use crate::driver::{driver, RescueParams};
use crate::error::{Error, OpContext, Result};
use crate::migrate::ensure_migrated;
use crate::node::Heartbeat;
use crate::registry::Registry;
use crate::rescue::{rescue_once, RescueReport};
use crate::task::{ClaimedTask, TaskContext};

/// Counts of what a worker did with the tasks it claimed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Tasks claimed.
    pub claimed: u64,
    /// Handlers succeeded; completions committed.
    pub done: u64,
    /// Handlers failed; the tasks will run again after a backoff.
    pub retried: u64,
    /// Handlers failed permanently or at max attempts.
    pub dead: u64,
    /// Claims taken over before completion (effects rolled back, nothing recorded).
    pub lost: u64,
    /// Put back to pending without a failure (shutdown, database error).
    pub released: u64,
    /// Left running because the database could not be reached; rescue recovers them.
    pub abandoned: u64,
}

impl Tally {
    fn count(&mut self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Done => &mut self.done,
            Outcome::Retried => &mut self.retried,
            Outcome::Dead => &mut self.dead,
            Outcome::Lost => &mut self.lost,
            Outcome::Released => &mut self.released,
            Outcome::Abandoned => &mut self.abandoned,
        };
        *counter += 1;
    }

    /// Adds another tally to this one.
    pub fn merge(&mut self, other: Tally) {
        self.claimed += other.claimed;
        self.done += other.done;
        self.retried += other.retried;
        self.dead += other.dead;
        self.lost += other.lost;
        self.released += other.released;
        self.abandoned += other.abandoned;
    }
}

/// What a `drain` or `run` did, and how long it took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    /// The counts.
    pub tally: Tally,
    /// Wall time from start to finish.
    pub elapsed: Duration,
}

impl Report {
    /// Finished tasks (done, retried, dead) per second.
    pub fn tasks_per_sec(&self) -> f64 {
        let finished = self.tally.done + self.tally.retried + self.tally.dead;
        finished as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A worker process's engine: a node row, a connection pool and an execution pool.
///
/// [`Worker::run_once`] claims one page of due tasks with one `UPDATE` and runs it;
/// [`Worker::drain`] repeats until nothing is due; [`Worker::run`] keeps polling until
/// stopped.
///
/// ```no_run
/// use outbox::{DatabaseUrl, Registry, Worker, WorkerConfig};
///
/// # fn main() -> outbox::Result<()> {
/// let mut registry = Registry::new();
/// registry.register("points.credit", |_task: &outbox::TaskContext, _tx: &mut outbox::TaskTx| Ok(()));
/// let url = DatabaseUrl::parse("outbox.db")?;
/// let worker = Worker::new(&url, registry, WorkerConfig::default())?;
/// let report = worker.drain()?;
/// println!("{} done", report.tally.done);
/// # Ok(())
/// # }
/// ```
pub struct Worker {
    url: DatabaseUrl,
    pool: DbPool,
    registry: Registry,
    keywords: Vec<String>,
    config: WorkerConfig,
    node_id: i64,
    dispatcher: Dispatcher,
    stopping: Arc<AtomicBool>,
    totals: Mutex<Tally>,
    /// On SQLite, this process's writers take turns here (see [`Worker::write_turn`]).
    sqlite_writer: Option<Mutex<()>>,
    /// Claimed tasks not finished yet (for the shutdown report).
    in_flight: std::sync::atomic::AtomicU64,
    upkeep: Arc<Upkeep>,
    upkeep_thread: Option<std::thread::JoinHandle<()>>,
    watchdog_thread: Option<std::thread::JoinHandle<()>>,
}

/// What the upkeep thread ticks: the heartbeat, then a rescue pass.
struct Upkeep {
    heartbeat: Heartbeat,
    pool: DbPool,
    rescue: RescueParams,
    interval: Duration,
    stop: AtomicBool,
    /// Handlers running now, by task id and claim token, with when they started (for the
    /// hang watchdog).
    running: Mutex<HashMap<(i64, i64), Instant>>,
    /// With `exit_on_hang`: how long a handler may run before the process exits.
    hang_limit: Option<Duration>,
}

impl Upkeep {
    fn tick(&self) {
        if self.heartbeat.run_once().is_ok() {
            // Only a node that is itself alive rescues others.
            if let Err(e) = rescue_once(&self.pool, &self.rescue) {
                log::warn!("rescue failed: {e}");
            }
        }
    }

    /// Notes that the handler of a task's claim started (keyed by id and claim token: a task
    /// rescued from a hung run and claimed again by this node is another run).
    pub(crate) fn started(&self, task: i64, token: i64) {
        if self.hang_limit.is_some() {
            let mut running = self.running.lock().expect("running tasks lock");
            running.insert((task, token), Instant::now());
        }
    }

    pub(crate) fn finished(&self, task: i64, token: i64) {
        if self.hang_limit.is_some() {
            let mut running = self.running.lock().expect("running tasks lock");
            running.remove(&(task, token));
        }
    }

    /// Exits the process (status 3) when a handler has run longer than the hang limit; see
    /// [`WorkerConfig::exit_on_hang`].
    fn exit_if_hung(&self) {
        let Some(limit) = self.hang_limit else { return };
        let running = self.running.lock().expect("running tasks lock");
        if let Some(((id, _), started)) = running.iter().find(|(_, s)| s.elapsed() > limit) {
            log::error!(
                "node {}: the handler of task {id} has run for {:?}, past its task timeout: exiting \
                 (status 3) to free its thread, connection and locks; the task is rescued as a failure",
                self.heartbeat.node_id(),
                started.elapsed()
            );
            std::process::exit(3);
        }
    }

    /// Checks for hung handlers every 100 ms until stopped, on a thread of its own: a tick of
    /// the upkeep thread can wait the whole busy timeout on SQLite's write lock, which is what
    /// a hung handler holds.
    fn watch_for_hangs(&self) {
        while !self.stop.load(Ordering::Relaxed) {
            self.exit_if_hung();
            sleep_unless(Duration::from_millis(100), &self.stop);
        }
    }

    /// Ticks every `interval`, on schedule: the time a tick takes (a slow database) does not
    /// push the next one back.
    fn run(&self) {
        let mut next = Instant::now() + self.interval;
        while !self.stop.load(Ordering::Relaxed) {
            sleep_unless(next.saturating_duration_since(Instant::now()), &self.stop);
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            next += self.interval;
            self.tick();
            let now = Instant::now();
            if next < now {
                next = now;
            }
        }
    }
}

impl Worker {
    /// Connects, checks that the schema is migrated, and registers this process as a node.
    ///
    /// Fails when the configuration is out of range, the registry is empty, the database is
    /// unreachable, or `outbox migrate` has not been run.
    pub fn new(url: &DatabaseUrl, registry: Registry, config: WorkerConfig) -> Result<Worker> {
        config.validate()?;
        if registry.is_empty() {
            return Err(Error::InvalidConfig("no handler is registered".into()));
        }
        let pool = url.pool(config.pool_size())?;
        let mut conn = pool.get().op("worker start")?;
        ensure_migrated(&mut conn)?;
        let name = node_name();
        let node_id = driver(&mut conn).node_register(&name).op("node register")?;
        drop(conn);
        // The claiming thread runs queued tasks while it waits for room, as one more
        // executor, on PostgreSQL. On SQLite, whose writers take turns on one lock, a second
        // thread running tasks would only wait for the first.
        let caller_helps = url.backend() == Backend::Postgres;
        let dispatcher = Dispatcher::new(config.threads, config.queue, caller_helps)
            .map_err(|e| Error::Runtime(format!("cannot start {} threads: {e}", config.threads)))?;
        let upkeep = Arc::new(Upkeep {
            heartbeat: Heartbeat::new(url.clone(), node_id),
            pool: pool.clone(),
            rescue: RescueParams {
                dead_after_ms: millis(config.dead_after),
                default_max_attempts: config.max_attempts,
                backoff_base_ms: millis(config.backoff.base),
                backoff_max_ms: millis(config.backoff.max),
            },
            interval: config.heartbeat,
            stop: AtomicBool::new(false),
            running: Mutex::new(HashMap::new()),
            hang_limit: config
                .exit_on_hang
                .then(|| config.task_timeout + config.heartbeat),
        });
        let upkeep_thread = {
            let upkeep = Arc::clone(&upkeep);
            std::thread::Builder::new()
                .name(format!("outbox-upkeep-{node_id}"))
                .spawn(move || upkeep.run())
                .map_err(|e| Error::Runtime(format!("cannot start the heartbeat thread: {e}")))?
        };
        let watchdog_thread = match upkeep.hang_limit {
            None => None,
            Some(_) => {
                let upkeep = Arc::clone(&upkeep);
                let thread = std::thread::Builder::new()
                    .name(format!("outbox-watchdog-{node_id}"))
                    .spawn(move || upkeep.watch_for_hangs())
                    .map_err(|e| {
                        Error::Runtime(format!("cannot start the watchdog thread: {e}"))
                    })?;
                Some(thread)
            }
        };
        log::info!(
            "node {node_id} ({name}) started on {}: keywords {:?}, {} threads",
            url.backend().name(),
            registry.keywords().collect::<Vec<_>>(),
            config.threads
        );
        Ok(Worker {
            url: url.clone(),
            keywords: registry.keywords().map(str::to_owned).collect(),
            pool,
            registry,
            config,
            node_id,
            dispatcher,
            stopping: Arc::new(AtomicBool::new(false)),
            totals: Mutex::new(Tally::default()),
            in_flight: std::sync::atomic::AtomicU64::new(0),
            sqlite_writer: (url.backend() == Backend::Sqlite).then(|| Mutex::new(())),
            upkeep,
            upkeep_thread: Some(upkeep_thread),
            watchdog_thread,
        })
    }

    /// Records one heartbeat now (the upkeep thread does this every `heartbeat`).
    pub fn heartbeat_once(&self) -> Result<()> {
        self.upkeep.heartbeat.run_once()
    }

    /// Runs one rescue pass now (the upkeep thread does this after every heartbeat, and
    /// `drain` at start): see [`crate::rescue`].
    pub fn rescue_once(&self) -> Result<RescueReport> {
        rescue_once(&self.pool, &self.upkeep.rescue)
    }

    /// This worker's node id: the `owner` of the tasks it claims.
    pub fn node_id(&self) -> i64 {
        self.node_id
    }

    /// The connection pool, shared with handlers' own needs.
    pub fn pool(&self) -> &DbPool {
        &self.pool
    }

    /// A flag that stops [`Worker::run`] and [`Worker::drain`] when set: no new claims,
    /// running handlers finish, and claimed tasks that have not started are released back to
    /// pending without a failure.
    ///
    /// One `drain`/`run`/`run_once`/`execute` runs at a time per worker: a second call waits
    /// for the first to return.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stopping)
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// How many tasks (chunks, in batched mode) the claiming thread ran itself because the
    /// pool was full (CallerRuns).
    pub fn caller_runs(&self) -> u64 {
        self.dispatcher.caller_runs()
    }

    /// How many queued tasks (chunks, in batched mode) the claiming thread took from the
    /// queue and ran while it waited for room to claim or for its page to finish. Only on
    /// PostgreSQL; always 0 on SQLite, whose writers take turns anyway.
    pub fn caller_helped(&self) -> u64 {
        self.dispatcher.helped()
    }

    /// Tasks claimed by this worker and not finished yet.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Marks this node gone in `async_node` (dropping the worker does it too). Tasks it still
    /// holds are then rescued by the next rescue pass of any live node.
    pub fn mark_gone(&self) -> Result<()> {
        let mut conn = self.pool.get().op("node mark gone")?;
        driver(&mut conn)
            .node_mark_gone(self.node_id)
            .discard_broken(&mut conn)
            .op("node mark gone")?;
        Ok(())
    }

    /// Everything this worker has done since it started.
    pub fn totals(&self) -> Tally {
        *self.totals.lock().expect("tally lock")
    }

    /// Claims one page of due tasks for registered keywords, in one statement: state
    /// running, owner this node, claim token bumped. The first half of [`Worker::run_once`].
    ///
    /// Fails with [`Error::HeartbeatStale`] when this node has not recorded a heartbeat for
    /// `dead_after − heartbeat`: other nodes may soon rescue its tasks, so it must not claim.
    pub fn claim(&self) -> Result<Vec<ClaimedTask>> {
        self.claim_up_to(self.claim_limit())
    }

    /// Claims at most `limit` due tasks (see [`Worker::claim`]).
    fn claim_up_to(&self, limit: usize) -> Result<Vec<ClaimedTask>> {
        self.ensure_heartbeat_fresh()?;
        let mut conn = self.pool.get().op("task claim")?;
        let _turn = self.write_turn();
        // Never more than can start at once, so that a claimed task waits for at most the
        // queue ahead of it: its deadline runs from the claim.
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = driver(&mut conn)
            .task_claim_page(
                self.node_id,
                &self.keywords,
                limit,
                millis(self.config.task_timeout),
            )
            .discard_broken(&mut conn)
            .op("task claim")?;
        let mut rows = rows;
        // RETURNING gives no order; run in claim order (priority first, then age).
        rows.sort_by_key(|row| (row.priority, row.id));
        let page = rows
            .into_iter()
            .map(|row| ClaimedTask {
                context: TaskContext {
                    id: row.id,
                    keyword: row.keyword,
                    biz_id: row.biz_id,
                    tenant: row.tenant,
                    attempt: row.failures.saturating_add(1),
                    payload: row.biz_data,
                },
                failures: row.failures,
                max_attempts: row.max_attempts,
                claim_token: row.claim_token,
                owner: self.node_id,
            })
            .collect();
        Ok(page)
    }

    /// The most tasks one claim takes: a page, but never more than can start at once.
    fn claim_limit(&self) -> usize {
        self.config.page_size.min(self.config.claim_capacity())
    }

    /// On SQLite, waits for this process's turn to write; `None` (no waiting) on PostgreSQL.
    ///
    /// SQLite has one writer at a time. Threads of one process that collide on its lock are
    /// put to sleep by SQLite's busy handler (1, 2, 5, 10… ms) instead of being handed the lock
    /// when it frees; measured here, that cut `demo` from ~6,500 to ~800 tasks/s. Taking turns
    /// on a mutex first hands the lock over at once; the busy timeout still arbitrates between
    /// processes.
    pub(crate) fn write_turn(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        self.sqlite_writer
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Fails with [`Error::HeartbeatStale`] when this node has not recorded a heartbeat for
    /// so long that other nodes may soon rescue its tasks; tries one heartbeat first.
    fn ensure_heartbeat_fresh(&self) -> Result<()> {
        // Others rescue at `dead_after`; stop claiming half a beat before.
        let limit = self
            .config
            .dead_after
            .saturating_sub(self.config.heartbeat / 2);
        if self.upkeep.heartbeat.since_last_ok() <= limit {
            return Ok(());
        }
        let _ = self.upkeep.heartbeat.run_once();
        let since = self.upkeep.heartbeat.since_last_ok();
        if since <= limit {
            return Ok(());
        }
        Err(Error::HeartbeatStale {
            node_id: self.node_id,
            since,
        })
    }

    /// Runs a claimed page in the execution pool and waits for all of it. The second half
    /// of [`Worker::run_once`].
    pub fn execute(&self, page: Vec<ClaimedTask>) -> Tally {
        let tally = Mutex::new(Tally::default());
        self.dispatcher
            .scope(|feed| self.submit_page(feed, page, &tally));
        tally.into_inner().expect("tally lock")
    }

    /// Hands a claimed page to the execution pool, a task (or, in batched mode, a chunk) at a
    /// time; outcomes are counted in `tally` and in the worker's totals as they come.
    fn submit_page<'s>(
        &'s self,
        feed: &dispatch::Feed<'s>,
        page: Vec<ClaimedTask>,
        tally: &'s Mutex<Tally>,
    ) {
        let n = page.len() as u64;
        tally.lock().expect("tally lock").claimed += n;
        self.totals.lock().expect("tally lock").claimed += n;
        self.in_flight.fetch_add(n, Ordering::Relaxed);
        let record = move |outcomes: &[Outcome]| {
            self.in_flight
                .fetch_sub(outcomes.len() as u64, Ordering::Relaxed);
            let mut tally = tally.lock().expect("tally lock");
            let mut totals = self.totals.lock().expect("tally lock");
            for &outcome in outcomes {
                tally.count(outcome);
                totals.count(outcome);
            }
        };
        if self.config.commit_batch > 1 {
            let mut tasks = page.into_iter().peekable();
            while tasks.peek().is_some() {
                let chunk: Vec<ClaimedTask> =
                    tasks.by_ref().take(self.config.commit_batch).collect();
                self.dispatcher.submit(feed, move || {
                    let n = chunk.len() as u64;
                    record_or_unwind(self, n, || self.execute_chunk(chunk), &record)
                });
            }
        } else {
            for task in page {
                self.dispatcher.submit(feed, move || {
                    record_or_unwind(self, 1, || vec![self.execute_task(&task)], &record)
                });
            }
        }
    }

    /// Waits until at least half of the units that can start (threads + queue + the claiming
    /// thread) are free, claims as many tasks as can start, and hands them to the pool
    /// without waiting for them: the next claim overlaps the end of this page. Returns how
    /// many it claimed and the most it could have claimed; claims nothing once stopping.
    fn refill<'s>(
        &'s self,
        feed: &dispatch::Feed<'s>,
        tally: &'s Mutex<Tally>,
    ) -> Result<(usize, usize)> {
        let units = self.dispatcher.capacity();
        self.dispatcher
            .wait_for_room(feed, units.div_ceil(2), &self.stopping);
        if self.is_stopping() {
            return Ok((0, 0));
        }
        let room = self.dispatcher.room().max(1);
        let limit = self.config.page_size.min(room * self.config.commit_batch);
        let page = self.claim_up_to(limit)?;
        let claimed = page.len();
        self.submit_page(feed, page, tally);
        Ok((claimed, limit))
    }

    /// Claims one page and runs it; returns what happened to it. An empty tally means
    /// nothing was due.
    pub fn run_once(&self) -> Result<Tally> {
        let page = self.claim()?;
        Ok(self.execute(page))
    }

    /// Rescues the tasks of dead nodes, then works until nothing is due (or the stop flag is
    /// set), then returns once the tasks it claimed have finished. For cron.
    ///
    /// Claims overlap execution: a new page is claimed as soon as half the pool is free. An
    /// empty claim while tasks are still running waits for them and claims once more, so
    /// that what they make due (a follow-up task a handler enqueued, a retry with a short
    /// backoff) is run by this drain too.
    pub fn drain(&self) -> Result<Report> {
        self.rescue_once()?;
        self.drain_at_most(u64::MAX)
    }

    /// [`Worker::drain`] without its rescue pass, stopping once `max` tasks have been claimed
    /// (the last claim may take a few more): what `outbox bench` times.
    pub fn drain_at_most(&self, max: u64) -> Result<Report> {
        let started = Instant::now();
        let tally = Mutex::new(Tally::default());
        self.dispatcher.scope(|feed| -> Result<()> {
            while !self.is_stopping() && tally.lock().expect("tally lock").claimed < max {
                // Whether anything was running before the claim: a task that commits a
                // follow-up after the claim looked, and finishes before the check below,
                // must still be followed by one more claim.
                let busy_before = self.dispatcher.in_flight() > 0;
                let (claimed, _) = self.refill(feed, &tally)?;
                if claimed == 0 {
                    if !busy_before || self.is_stopping() {
                        break;
                    }
                    self.dispatcher
                        .wait_for_room(feed, self.dispatcher.capacity(), &self.stopping);
                }
            }
            Ok(())
        })?;
        Ok(Report {
            tally: tally.into_inner().expect("tally lock"),
            elapsed: started.elapsed(),
        })
    }

    /// Works until the stop flag is set: claims while there is work, otherwise waits for the
    /// poll interval (±10% jitter, so that a fleet does not poll in step) or, on PostgreSQL
    /// with `listen`, until a producer's `NOTIFY`. A database outage is waited out with
    /// capped exponential backoff, logging once when it starts and once when it ends.
    pub fn run(&self) -> Result<Report> {
        let started = Instant::now();
        let tally = Mutex::new(Tally::default());
        let mut listener: Option<Listener> = None;
        let mut outage: Option<(Instant, Duration)> = None;
        self.dispatcher.scope(|feed| {
            while !self.is_stopping() {
                if listener.is_none()
                    && self.config.listen
                    && self.url.backend() == Backend::Postgres
                {
                    listener = Listener::connect(&self.url)
                        .map_err(|e| log::debug!("LISTEN not available yet: {e}"))
                        .ok();
                }
                match self.refill(feed, &tally) {
                    Ok((claimed, limit)) => {
                        if let Some((since, _)) = outage.take() {
                            log::warn!("database reachable again after {:?}", since.elapsed());
                        }
                        // A full claim means more may be due: claim again at once.
                        if claimed >= limit {
                            continue;
                        }
                        let jitter = 0.9 + 0.2 * fastrand::f64();
                        let wait = self.config.poll_interval.mul_f64(jitter);
                        match listener.as_mut() {
                            Some(l) => {
                                if let Err(e) = l.wait(wait, &self.stopping) {
                                    log::debug!("LISTEN connection lost: {e}");
                                    listener = None;
                                }
                            }
                            None => sleep_unless(wait, &self.stopping),
                        }
                    }
                    Err(e) => {
                        let pause = match outage {
                            None => {
                                log::error!("database unavailable, retrying with backoff: {e}");
                                Duration::from_millis(100)
                            }
                            Some((_, last)) => (last * 2).min(Duration::from_secs(30)),
                        };
                        outage =
                            Some((outage.map_or_else(Instant::now, |(since, _)| since), pause));
                        listener = None;
                        sleep_unless(pause, &self.stopping);
                    }
                }
            }
        });
        Ok(Report {
            tally: tally.into_inner().expect("tally lock"),
            elapsed: started.elapsed(),
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.upkeep.stop.store(true, Ordering::Relaxed);
        for thread in [self.upkeep_thread.take(), self.watchdog_thread.take()]
            .into_iter()
            .flatten()
        {
            let _ = thread.join();
        }
        if let Err(e) = self.mark_gone() {
            log::warn!("node {}: could not mark it gone: {e}", self.node_id);
        }
    }
}

/// Runs a unit of work and records its outcomes; if it panics outside the handlers (which are
/// caught), its tasks leave the in-flight count before the panic goes on (rescue recovers
/// them).
fn record_or_unwind(
    worker: &Worker,
    n: u64,
    work: impl FnOnce() -> Vec<Outcome>,
    record: &impl Fn(&[Outcome]),
) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        Ok(outcomes) => record(&outcomes),
        Err(panic) => {
            worker.in_flight.fetch_sub(n, Ordering::Relaxed);
            std::panic::resume_unwind(panic);
        }
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Sleeps for `total`, waking early when `stop` is set.
fn sleep_unless(total: Duration, stop: &AtomicBool) {
    let deadline = Instant::now() + total;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(20)));
    }
}

/// `host:pid`, the node's name in `async_node`.
fn node_name() -> String {
    format!(
        "{}:{}",
        gethostname::gethostname().to_string_lossy(),
        std::process::id()
    )
}
