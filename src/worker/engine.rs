//! The [`Worker`]: its parts (the settings, the node, the connection pool, the execution
//! pool, the background services), how it starts on its own or as one database of a
//! [`Fleet`](crate::Fleet), what it tells about itself, and how it stops. What it does with
//! a task is in the modules of the task's path (`claim`, `refill`, `locked`, `run`,
//! `execute`, `record`), each adding its part of `impl Worker`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::config::WorkerConfig;
use super::dispatch::Dispatcher;
use super::domains::{self, DomainControl};
use super::heartbeat::Node;
use super::observers::Observers;
use super::on_dead;
use super::rescue::RescueReport;
use super::services::Services;
use super::settings::Settings;
use super::slots::Share;
use super::style::ClaimStyle;
use super::tally::Tally;
use super::timeouts;
use crate::db::secret::Secrets;
use crate::db::transaction::{DiscardBroken, WriterTurn};
use crate::db::{DatabaseUrl, DbPool};
use crate::driver::{node_mark_gone, task_count_due};
use crate::error::{Error, OpContext, Result};
use crate::log_label;
use crate::migrate::ensure_migrated;
use crate::registry::Registry;

/// How long a stopping worker waits for its database: for its background threads'
/// statements under way, then for a connection to mark its node gone. A database that
/// cannot answer in that time (one that refuses connections, whose every checkout would wait
/// the pool's whole connection timeout) is not waited for: its node stays `alive` there, and
/// the other nodes rescue its tasks once its heartbeat is `dead_after` old.
pub const STOP_DATABASE_WAIT: Duration = Duration::from_secs(2);

/// What the workers of a [`Fleet`](crate::Fleet) share: the execution pool and the stop
/// flag.
pub(super) struct Shared {
    pub(super) dispatcher: Arc<Dispatcher>,
    pub(super) stopping: Arc<AtomicBool>,
    /// Every database's secrets: one database's dead-task hook inherits no variable that
    /// holds another's password.
    pub(super) secrets: Secrets,
}

/// One database's place in a [`Fleet`](crate::Fleet): what its worker shares with the
/// others, and its part of the execution pool (none when it is the only database: the pool
/// is all its own).
pub(super) struct Seat<'a> {
    pub(super) shared: &'a Shared,
    pub(super) share: Option<Share>,
    /// Its name in its threads' log records, when it is one of several (`crate::log_label`).
    pub(super) label: Option<Arc<str>>,
}

/// A worker process's engine: a node row, a connection pool and an execution pool.
///
/// [`Worker::run_once`] claims one page of due tasks with one `UPDATE` and runs it;
/// [`Worker::drain`] repeats until nothing is due; [`Worker::run`] keeps polling until
/// stopped; [`Worker::run_until_stopped`] does so until SIGINT or SIGTERM, as `outbox run`.
/// While a worker lives, threads of its own record its heartbeat and rescue the tasks of
/// dead nodes; dropping it stops them and marks the node gone.
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
    pub(super) url: DatabaseUrl,
    pub(super) pool: DbPool,
    pub(super) registry: Registry,
    pub(super) keywords: Vec<String>,
    pub(super) settings: Settings,
    pub(super) node: Arc<Node>,
    /// The execution pool: this worker's own, or a [`Fleet`](crate::Fleet)'s, shared by its
    /// databases.
    pub(super) dispatcher: Arc<Dispatcher>,
    pub(super) stopping: Arc<AtomicBool>,
    pub(super) totals: Arc<Mutex<Tally>>,
    /// On SQLite, this process's writers take turns here.
    pub(super) writer_turn: WriterTurn,
    /// Claimed tasks not finished yet (for the shutdown report, and published for the claim
    /// strategies).
    pub(super) in_flight: Arc<AtomicU64>,
    pub(super) services: Services,
    /// The metrics and the dead-task hook, when configured.
    pub(super) observers: Observers,
    /// Its database's name in its threads' log records, in a fleet of several (`log_label`).
    pub(super) label: Option<Arc<str>>,
    /// Serves the metrics, when `metrics_addr` is set; stopped when the worker drops.
    pub(super) metrics_server: Option<crate::metrics::MetricsServer>,
}

impl Worker {
    /// Connects, checks that the schema is migrated, registers this process as a node and
    /// starts its heartbeat and rescue threads. Settings left unset in `config` take the
    /// defaults of the URL's backend.
    ///
    /// Fails when a setting is out of range ([`Error::InvalidConfig`], naming it), the
    /// registry is empty, the database is unreachable, or `outbox migrate` has not been run.
    pub fn new(url: &DatabaseUrl, registry: Registry, config: WorkerConfig) -> Result<Worker> {
        let settings = config.resolve(url.backend())?;
        check_registry(&registry)?;
        let pool = url.pool(settings.pool_size())?;
        Self::start(url, pool, registry, settings, None)
    }

    /// Like [`Worker::new`], on a pool of your own (see [`crate::db::ConnectionManager`]) to
    /// `url`, which needs at least `threads + 2` connections. The heartbeat and `LISTEN` open
    /// connections of their own to `url`, outside the pool, so that a saturated pool cannot
    /// delay them.
    pub fn with_pool(
        url: &DatabaseUrl,
        pool: DbPool,
        registry: Registry,
        config: WorkerConfig,
    ) -> Result<Worker> {
        let settings = config.resolve(url.backend())?;
        check_registry(&registry)?;
        if pool.max_size() < settings.pool_size() {
            return Err(Error::InvalidConfig {
                setting: "pool size",
                reason: format!(
                    "must be at least {} for {} threads (threads + 2), not {}",
                    settings.pool_size(),
                    settings.threads,
                    pool.max_size()
                ),
            });
        }
        Self::start(url, pool, registry, settings, None)
    }

    /// Starts the worker on `pool`; with a `seat`, as one database of a
    /// [`Fleet`](crate::Fleet), on the fleet's execution pool (on its share of it) and stop
    /// flag.
    pub(super) fn start(
        url: &DatabaseUrl,
        pool: DbPool,
        registry: Registry,
        settings: Settings,
        seat: Option<Seat<'_>>,
    ) -> Result<Worker> {
        // Its handlers' statements run on this process's connections, each as long as its
        // task at most: none may be cut short by the reply timeout (see `db::reply`).
        crate::db::reply::cover_task_timeout(settings.task_timeout);
        let label = seat.as_ref().and_then(|seat| seat.label.clone());
        let _label = log_label::labelled(label.as_ref());
        // What can fail on its own first, so that a failure leaves no node row behind.
        let metrics_endpoint = settings
            .metrics_addr
            .map(crate::metrics::BoundServer::bind)
            .transpose()?;
        let on_dead = match &settings.on_dead {
            Some(command) => Some(Arc::new(on_dead::DeadHook::start(
                command.clone(),
                settings.on_dead_timeout,
                seat.as_ref()
                    .map_or_else(|| url.secrets(), |seat| seat.shared.secrets.clone()),
            )?)),
            None => None,
        };
        let node = Arc::new(crate::db::pool::on_live_conn(
            &pool,
            "worker start",
            |conn| {
                ensure_migrated(conn)?;
                Node::register(conn)
            },
        )?);
        let dispatcher = match &seat {
            Some(seat) => Arc::clone(&seat.shared.dispatcher),
            None => Arc::new(new_dispatcher(url, settings.threads, &settings)?),
        };
        let domains = DomainControl::new(
            domains::Base {
                threads: settings.threads,
                queue: settings.queue,
                task_timeout: settings.task_timeout,
                commit_batch: settings.commit_batch,
                lock: settings.lock,
                domains: settings.domains.clone(),
                registered: registry.keywords().map(str::to_owned).collect(),
                share: seat.as_ref().and_then(|seat| seat.share),
            },
            dispatcher.shared_lanes(),
        )?;
        let timeouts = timeouts::Timeouts::new(dispatcher.shared_lanes());
        let stopping = seat.map_or_else(Arc::default, |s| Arc::clone(&s.shared.stopping));
        let observers = Observers {
            metrics: metrics_endpoint
                .as_ref()
                .map(|_| Arc::new(crate::metrics::Metrics::new(registry.keywords()))),
            on_dead,
        };
        let services = Services::start(
            &settings, url, &pool, &node, &stopping, domains, timeouts, &observers,
        )?;
        let metrics_server = match (metrics_endpoint, &observers.metrics) {
            (Some(endpoint), Some(metrics)) => Some(Self::serve_metrics(
                endpoint,
                url,
                Arc::clone(metrics),
                &settings,
                &node,
                &services,
                &dispatcher,
            )?),
            _ => None,
        };
        log::info!(
            "node {} ({}) started on {}: keywords {:?}, {} threads, {} claims",
            node.id(),
            node.name(),
            url.backend(),
            registry.keywords().collect::<Vec<_>>(),
            settings.threads,
            if settings.lock { "lock" } else { "stamp" }
        );
        Ok(Worker {
            url: url.clone(),
            keywords: registry.keywords().map(str::to_owned).collect(),
            pool,
            registry,
            writer_turn: WriterTurn::for_backend(url.backend()),
            settings,
            node,
            dispatcher,
            stopping,
            totals: Arc::default(),
            in_flight: services.strategy.held(),
            services,
            observers,
            metrics_server,
            label,
        })
    }

    /// Starts the metrics endpoint of a worker (see [`crate::metrics`]).
    fn serve_metrics(
        endpoint: crate::metrics::BoundServer,
        url: &DatabaseUrl,
        metrics: Arc<crate::metrics::Metrics>,
        settings: &Settings,
        node: &Arc<Node>,
        services: &Services,
        dispatcher: &Dispatcher,
    ) -> Result<crate::metrics::MetricsServer> {
        let (node, heartbeat) = (Arc::clone(node), Arc::clone(&services.heartbeat));
        let lanes = dispatcher.shared_lanes();
        let live = crate::metrics::Live {
            node_id: Box::new(move || node.id()),
            heartbeat_age: Box::new(move || heartbeat.since_last_ok()),
            dead_after: settings.dead_after,
            domains: Box::new(move || lanes.lock().usage()),
        };
        let table = crate::metrics::TableSample::new(url.clone(), crate::metrics::SAMPLE_INTERVAL);
        endpoint.serve(metrics, live, table)
    }

    /// Where the metrics endpoint listens, when [`WorkerConfig::metrics_addr`] is set (the
    /// port the system chose, when asked for port 0).
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_server.as_ref().map(|s| s.addr())
    }

    /// Records one heartbeat now (the heartbeat thread does this every `heartbeat`). If the
    /// node's row is gone or marked gone, registers the node again under a new id.
    pub fn heartbeat_once(&self) -> Result<()> {
        self.services.heartbeat.run_once()
    }

    /// Runs one rescue pass now (the rescue thread does this every `heartbeat`, and `drain`
    /// at start).
    pub fn rescue_once(&self) -> Result<RescueReport> {
        self.services.rescuer.run_once()
    }

    /// This worker's node id: the `owner` of the tasks it claims. It changes if the node
    /// had to register again (see [`Worker::heartbeat_once`]).
    pub fn node_id(&self) -> i64 {
        self.node.id()
    }

    /// The connection pool, shared with handlers' own needs.
    pub fn pool(&self) -> &DbPool {
        &self.pool
    }

    /// Execution threads.
    pub fn threads(&self) -> usize {
        self.settings.threads
    }

    /// How this worker claims: [`ClaimStyle::Lock`] or [`ClaimStyle::Stamp`] (what
    /// [`ClaimStyle::Auto`] resolved to).
    pub fn claim_style(&self) -> ClaimStyle {
        if self.settings.lock {
            ClaimStyle::Lock
        } else {
            ClaimStyle::Stamp
        }
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

    pub(super) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// How many tasks (chunks, in batched mode) the claiming thread ran itself because the
    /// pool was full (CallerRuns).
    pub fn caller_runs(&self) -> u64 {
        self.dispatcher.caller_runs()
    }

    /// How many queued tasks (chunks, in batched mode) the claiming thread took from the
    /// queue and ran while it waited for room to claim or for its page to finish. Only on
    /// PostgreSQL and MySQL; always 0 on SQLite, whose writers take turns anyway.
    pub fn caller_helped(&self) -> u64 {
        self.dispatcher.helped()
    }

    /// Tasks claimed by this worker and not finished yet.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Stops the heartbeat and rescue threads and marks this node gone in `async_node`
    /// (dropping the worker does it too). Tasks it still holds are then rescued by the next
    /// rescue pass of any live node.
    ///
    /// Waits at most [`STOP_DATABASE_WAIT`] for a connection: when the database cannot give
    /// one (it refuses connections), this fails and the node stays `alive` there, its tasks
    /// rescued by the other nodes once its heartbeat is `dead_after` old.
    pub fn mark_gone(&self) -> Result<()> {
        self.services.heartbeat.retire();
        self.services.stop.store(true, Ordering::Relaxed);
        self.mark_gone_within(STOP_DATABASE_WAIT)
    }

    /// Marks this node gone, waiting at most `wait` for a connection.
    fn mark_gone_within(&self, wait: Duration) -> Result<()> {
        let mut conn = self.pool.get_timeout(wait).op("node mark gone")?;
        node_mark_gone(&mut conn, self.node.id())
            .discard_broken(&mut conn)
            .op("node mark gone")?;
        Ok(())
    }

    /// Everything this worker has done since it started.
    pub fn totals(&self) -> Tally {
        *self.totals.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads [`Worker::totals`] without holding the worker: for a progress display while
    /// [`Worker::drain_until_stopped`], which takes the worker, runs.
    pub fn totals_reader(&self) -> impl Fn() -> Tally + Send + Sync + 'static {
        let totals = Arc::clone(&self.totals);
        move || *totals.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Pending tasks of this worker's keywords due now, of every tenant: about what a drain
    /// started now runs (not counting the tasks it makes due as it goes). For progress.
    pub fn due_count(&self) -> Result<u64> {
        let mut conn = self.pool.get().op("task count due")?;
        let n = task_count_due(&mut conn, &self.keywords)
            .discard_broken(&mut conn)
            .op("task count due")?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // One bound for the whole stop: a database that refuses connections holds it up for
        // seconds, not for a pool checkout's timeout per statement under way.
        let deadline = Instant::now() + STOP_DATABASE_WAIT;
        self.services.heartbeat.retire();
        self.services.stop_by(deadline);
        // At least a moment for the connection, when the services took the whole bound.
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        if let Err(e) = self.mark_gone_within(wait) {
            log::warn!(
                "node {}: could not mark it gone (it stays alive in the database until the \
                 other nodes find its heartbeat stale and rescue its tasks): {e}",
                self.node.id()
            );
        }
        // The hooks of the tasks that died last still run, for at most one more timeout.
        if let Some(hook) = &self.observers.on_dead {
            hook.finish();
        }
    }
}

/// The execution pool of `threads` threads for `settings`' queue.
pub(super) fn new_dispatcher(
    url: &DatabaseUrl,
    threads: usize,
    settings: &Settings,
) -> Result<Dispatcher> {
    // The claiming thread runs queued tasks while it waits for room, as one more executor,
    // on PostgreSQL and MySQL. On SQLite, whose writers take turns on one lock, a second thread
    // running tasks would mostly wait for the first.
    let caller_helps = url.backend() != crate::Backend::Sqlite;
    Dispatcher::new(
        threads,
        settings.queue,
        u64::try_from(settings.task_timeout.as_millis()).unwrap_or(u64::MAX),
        caller_helps,
    )
    .map_err(|e| Error::Thread {
        thread: "execution pool",
        source: std::io::Error::other(e),
    })
}

pub(super) fn check_registry(registry: &Registry) -> Result<()> {
    if registry.is_empty() {
        return Err(Error::InvalidConfig {
            setting: "registry",
            reason: "must hold at least one handler".into(),
        });
    }
    Ok(())
}
