//! A worker that serves several databases ([`Fleet`]): one claim loop per database, each
//! with its own node, heartbeat, rescue, cron and connection pool, all running their tasks on
//! one execution pool.

use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::config::WorkerConfig;
use super::dispatch::Feed;
use super::engine::{check_registry, new_dispatcher, Shared, Worker};
use super::members::{is_unreachable, open, Member, Starter};
use super::slots::Share;
use super::tally::{Report, Tally};
use crate::db::secret::Secrets;
use crate::db::DatabaseUrl;
use crate::error::{Error, Result};
use crate::log_label::labelled;
use crate::registry::Registry;

/// What one database of a [`Fleet`] did.
#[derive(Debug)]
pub struct DatabaseReport<T> {
    /// The database's URL, its password masked.
    pub database: String,
    /// What its claim loop returned.
    pub result: Result<T>,
}

/// A worker that serves several databases: `outbox run|drain --database-url A
/// --database-url B …`.
///
/// Each database gets a [`Worker`] of its own — a node row, a heartbeat, rescue and cron in
/// that database, a connection pool to it, and a claim loop that claims only that
/// database's tasks — and every worker runs its tasks on the fleet's one execution pool. A
/// task's handler and its completion are one transaction in the task's own database, so
/// exactly-once holds per database as for one worker. The claim loops run side by side: a
/// database that is unreachable or paused holds up only its own loop.
///
/// **Each database has its share of the pool, and never more.** The pool's `threads` (one
/// per database at least) and its `queue` are split between the databases as evenly as they
/// go (8 threads for 3 databases: 3, 3 and 2), and at most a database's share of threads
/// run its tasks at once, with at most its share of the queue waiting; a claim asks for
/// what its database's share can start or queue, and the claiming threads run no tasks
/// themselves. So a database whose handlers block (a lock held on its tables, a server that
/// stopped answering) holds its own threads and no other's, and the other databases keep
/// their pace, however many block. The shares are strict: a database does not borrow the
/// threads of databases that are idle. A handler that runs cannot be taken back, so a
/// database that borrowed threads and blocked on them would stall the others as soon as
/// they had work, for as long as it blocks. The price is that one busy database, the others
/// idle, runs on its share alone: give the fleet more threads, or run a process per
/// database, where that matters. With a single database the pool is all its own, as for a
/// [`Worker`].
///
/// Every URL is of one backend (a mix is refused: the defaults, the pool's size and the
/// claiming thread's help differ by backend), and each database is named once. A fleet has
/// no task domains and serves no metrics endpoint (both are one database's); a database's
/// `async_domain` rows may pause `default`, which stops that database's claims only.
///
/// ```no_run
/// use outbox::{DatabaseUrl, Fleet, Registry, WorkerConfig};
///
/// # fn main() -> outbox::Result<()> {
/// let mut registry = Registry::new();
/// registry.register("points.credit", |_task: &outbox::TaskContext, _tx: &mut outbox::TaskTx| Ok(()));
/// let urls = [
///     DatabaseUrl::parse("postgres://app@shard-0.internal/app")?,
///     DatabaseUrl::parse("postgres://app@shard-1.internal/app")?,
/// ];
/// let fleet = Fleet::new(&urls, registry, WorkerConfig::default())?;
/// for db in fleet.drain() {
///     println!("{}: {} done", db.database, db.result?.tally.done);
/// }
/// # Ok(())
/// # }
/// ```
pub struct Fleet {
    /// Each database's place, in the order of the URLs.
    members: Vec<Member>,
    /// What starts a worker, at the start or later.
    starter: Starter,
}

impl Fleet {
    /// Checks the URLs, connects to each database (one after another) and checks that its
    /// schema is migrated, then starts a worker on each it reached (in `urls`' order),
    /// sharing one execution pool sized by `config` (with a thread per database at least),
    /// each database on its share of it.
    ///
    /// A PostgreSQL or MySQL database that cannot be reached holds up only itself: its
    /// server down or refusing connections, but also a wrong password or a database name
    /// that does not exist, which a server's answer does not tell from a database not back
    /// yet. Its worker starts once it can be: [`Fleet::run`] tries again with backoff (every
    /// failure, logged); [`Fleet::drain`] and [`Fleet::run_once`] try once each time, and
    /// report it failed.
    ///
    /// Fails before any node is registered when `urls` is empty, names a database twice,
    /// mixes backends, `config` sets domains or a metrics address, a database is not
    /// migrated or is a missing SQLite file, or none can be reached ([`Error::OnDatabase`],
    /// naming the first failure).
    pub fn new(urls: &[DatabaseUrl], registry: Registry, config: WorkerConfig) -> Result<Fleet> {
        let first = urls
            .first()
            .ok_or_else(|| bad("must name at least one database"))?;
        let mut seen = HashSet::new();
        for url in urls {
            if !seen.insert(url.as_str()) {
                return Err(bad(&format!("names {} twice", url.masked())));
            }
            if url.backend() != first.backend() {
                return Err(bad(&format!(
                    "mixes {} ({}) and {} ({}): one worker serves databases of one backend",
                    first.backend(),
                    first.masked(),
                    url.backend(),
                    url.masked()
                )));
            }
        }
        let settings = config.resolve(first.backend())?;
        check_registry(&registry)?;
        if urls.len() > 1 && settings.metrics_addr.is_some() {
            return Err(Error::InvalidConfig {
                setting: "metrics_addr",
                reason: "is one database's: not with several databases".into(),
            });
        }
        if urls.len() > 1 && !settings.domains.is_empty() {
            return Err(Error::InvalidConfig {
                setting: "domains",
                reason: "share out one database's threads: not with several databases".into(),
            });
        }
        // With several databases, what each one's threads and pool log names it.
        let labels: Vec<Option<Arc<str>>> = urls
            .iter()
            .map(|url| (urls.len() > 1).then(|| Arc::from(url.masked())))
            .collect();
        // Every database reached is checked migrated before any node is registered; one that
        // cannot be reached is started later (`Starter::worker_of`), unless none can.
        let mut pools = Vec::with_capacity(urls.len());
        let mut unreachable = None;
        // A failure to reach `url`, its worker left to start later; any other, the fleet's.
        let mut defer = |url: &DatabaseUrl, e: Error| {
            if !is_unreachable(url, &e) {
                return Err(e.on_database(url));
            }
            log::warn!("not reachable at the start: its worker starts once it is: {e}");
            unreachable.get_or_insert(e.on_database(url));
            Ok(())
        };
        for (url, label) in urls.iter().zip(&labels) {
            let _label = labelled(label.as_ref());
            match open(url, settings.pool_size(), label) {
                Ok(pool) => pools.push(Some(pool)),
                Err(e) => {
                    defer(url, e)?;
                    pools.push(None);
                }
            }
        }
        // A thread for each database at least: a share of none would leave one waiting for
        // the others.
        let threads = settings.threads.max(urls.len());
        let shared = Shared {
            dispatcher: Arc::new(new_dispatcher(first, threads, &settings)?),
            stopping: Arc::default(),
            secrets: Secrets::union(urls.iter().map(DatabaseUrl::secrets)),
        };
        let shares: Vec<Option<Share>> = match urls.len() {
            1 => vec![None],
            n => (shared.dispatcher.shared_lanes())
                .share_out(n, settings.queue)
                .into_iter()
                .map(Some)
                .collect(),
        };
        let fleet = Fleet {
            members: (urls.iter().zip(shares).zip(labels))
                .map(|((url, share), label)| Member {
                    url: url.clone(),
                    share,
                    label,
                    worker: OnceLock::new(),
                    starting: Mutex::default(),
                })
                .collect(),
            starter: Starter {
                shared,
                registry,
                settings,
            },
        };
        // A worker that fails to start drops the fleet, and the workers started before it:
        // their nodes are marked gone; one whose server went away meanwhile is started later.
        for (member, pool) in fleet.members.iter().zip(pools) {
            let Some(pool) = pool else { continue };
            let _label = labelled(member.label.as_ref());
            if let Err(e) = fleet.starter.start(member, pool) {
                defer(&member.url, e)?;
            }
        }
        let none_started = fleet.started().next().is_none();
        match unreachable {
            Some(e) if none_started => Err(e),
            _ => Ok(fleet),
        }
    }

    /// The workers started, in the order of the URLs: every database's but those not
    /// reached yet, so that an index here is not the database's (see [`Fleet::worker`]).
    pub fn workers(&self) -> Vec<&Worker> {
        self.started().collect()
    }

    /// The worker of the `i`-th database (in the order of the URLs), once started.
    pub fn worker(&self, i: usize) -> Option<&Worker> {
        self.members.get(i).and_then(|m| m.worker.get())
    }

    fn started(&self) -> impl Iterator<Item = &Worker> {
        self.members.iter().filter_map(|m| m.worker.get())
    }

    /// Claims one page from each database in turn and runs it ([`Worker::run_once`]): with
    /// several databases, as many tasks as the database's share of the pool can start or
    /// queue, at most. A database whose worker has not started is tried once first.
    pub fn run_once(&self) -> Vec<DatabaseReport<Tally>> {
        (self.members.iter())
            .map(|member| DatabaseReport {
                database: member.url.masked(),
                result: {
                    let _label = labelled(member.label.as_ref());
                    self.starter
                        .worker_of(member, false)
                        .and_then(Worker::run_once)
                },
            })
            .collect()
    }

    /// [`Worker::drain`] on every database at once, the claim loops side by side on the
    /// shared pool; returns when each has nothing due (or the stop flag is set), with each
    /// database's report. A database that fails does not stop the others' drains.
    pub fn drain(&self) -> Vec<DatabaseReport<Report>> {
        self.on_each(false, |worker, feed, tally| {
            worker.retry_dead_connections(|| worker.rescue_once())?;
            worker.retry_dead_connections(|| worker.schedule_once())?;
            worker.drain_on(feed, tally, u64::MAX)
        })
    }

    /// [`Worker::run`] on every database at once, until the stop flag is set. A database
    /// that is unavailable is waited out with backoff by its own loop (one that could not
    /// be reached at the start too: its worker starts once it can be).
    pub fn run(&self) -> Vec<DatabaseReport<Report>> {
        self.on_each(true, |worker, feed, tally| {
            worker.with_cron_timer(|| worker.claim_on(feed, tally))
        })
    }

    /// Runs `work` for each database on a claiming thread of its own, all feeding one scope
    /// of the shared pool, once its worker has started (`retry`: see `Starter::worker_of`).
    fn on_each(
        &self,
        retry: bool,
        work: impl for<'j> Fn(&'j Worker, &Feed<'j>, &'j Mutex<Tally>) -> Result<()> + Sync,
    ) -> Vec<DatabaseReport<Report>> {
        let started = Instant::now();
        let tallies: Vec<Mutex<Tally>> = self.members.iter().map(|_| Mutex::default()).collect();
        let stopping = &self.starter.shared.stopping;
        let ends: Vec<(Result<()>, Duration)> =
            self.starter.shared.dispatcher.scope(stopping, |feed| {
                std::thread::scope(|scope| {
                    let loops: Vec<_> = (self.members.iter().enumerate())
                        .zip(&tallies)
                        .map(|((i, member), tally)| {
                            let work = &work;
                            std::thread::Builder::new()
                                .name(format!("outbox-claim-{}", i + 1))
                                .spawn_scoped(scope, move || {
                                    let _label = labelled(member.label.as_ref());
                                    let done = (self.starter.worker_of(member, retry))
                                        .and_then(|worker| work(worker, feed, tally));
                                    (done, started.elapsed())
                                })
                        })
                        .collect();
                    loops
                        .into_iter()
                        .map(|spawned| match spawned {
                            Ok(thread) => thread.join().unwrap_or_else(|_| {
                                (
                                    Err(Error::Panicked { thread: "claiming" }),
                                    started.elapsed(),
                                )
                            }),
                            Err(source) => (
                                Err(Error::Thread {
                                    thread: "claiming",
                                    source,
                                }),
                                Duration::ZERO,
                            ),
                        })
                        .collect()
                })
            });
        (self.members.iter())
            .zip(tallies)
            .zip(ends)
            .map(|((member, tally), (end, elapsed))| DatabaseReport {
                database: member.url.masked(),
                result: end.map(|()| {
                    Report::new(
                        tally.into_inner().unwrap_or_else(PoisonError::into_inner),
                        elapsed,
                    )
                }),
            })
            .collect()
    }

    /// A flag that stops [`Fleet::run`] and [`Fleet::drain`] on every database when set
    /// (see [`Worker::stop_flag`]).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.starter.shared.stopping)
    }

    /// Tasks claimed and not finished yet, of every database whose worker has started.
    pub fn in_flight(&self) -> u64 {
        self.started().map(Worker::in_flight).sum()
    }

    /// Everything the fleet has done since it started, every database together (those
    /// whose workers have started).
    pub fn totals(&self) -> Tally {
        self.started()
            .map(Worker::totals)
            .fold(Tally::default(), |mut sum, t| {
                sum.merge(t);
                sum
            })
    }

    /// Reads [`Fleet::totals`] without holding the fleet, as [`Worker::totals_reader`]: of
    /// the workers started when it is called.
    pub fn totals_reader(&self) -> impl Fn() -> Tally + Send + Sync + 'static {
        let readers: Vec<_> = self.started().map(Worker::totals_reader).collect();
        move || {
            readers.iter().fold(Tally::default(), |mut sum, read| {
                sum.merge(read());
                sum
            })
        }
    }

    /// [`Worker::due_count`] summed over the databases whose workers have started.
    pub fn due_count(&self) -> Result<u64> {
        let mut due = 0;
        for worker in self.started() {
            due += worker.due_count().map_err(|e| e.on_database(&worker.url))?;
        }
        Ok(due)
    }

    /// [`Worker::mark_gone`] on every database at once (a database that refuses connections
    /// holds up only its own, for at most [`super::STOP_DATABASE_WAIT`]); the first
    /// failure, in the order of the URLs, after trying them all.
    pub fn mark_gone(&self) -> Result<()> {
        // Read once: a database's worker may start meanwhile.
        let workers: Vec<&Worker> = self.started().collect();
        let results: Vec<Result<()>> = std::thread::scope(|scope| {
            let marks: Vec<_> = (workers.iter())
                .map(|worker| {
                    scope.spawn(|| {
                        let _label = labelled(worker.label.as_ref());
                        worker.mark_gone()
                    })
                })
                .collect();
            marks
                .into_iter()
                .map(|mark| {
                    mark.join().unwrap_or(Err(Error::Panicked {
                        thread: "node mark gone",
                    }))
                })
                .collect()
        });
        (workers.into_iter())
            .zip(results)
            .try_for_each(|(worker, result)| result.map_err(|e| e.on_database(&worker.url)))
    }
}

impl Drop for Fleet {
    /// Drops the workers side by side, each stopping its services and marking its node
    /// gone in its own database: one that refuses connections holds up only its own stop,
    /// for at most [`super::STOP_DATABASE_WAIT`], and never another database's node.
    fn drop(&mut self) {
        let members = std::mem::take(&mut self.members);
        std::thread::scope(|scope| {
            for worker in members.into_iter().filter_map(|m| m.worker.into_inner()) {
                let name = format!("outbox-stop-{}", worker.node_id());
                // A thread that cannot start drops its worker here, on this one.
                let _ = std::thread::Builder::new()
                    .name(name)
                    .spawn_scoped(scope, move || {
                        let _label = labelled(worker.label.as_ref());
                        drop(worker)
                    });
            }
        });
    }
}

fn bad(reason: &str) -> Error {
    Error::InvalidConfig {
        setting: "database URLs",
        reason: reason.to_owned(),
    }
}
