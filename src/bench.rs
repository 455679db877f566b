//! Benchmarks (`outbox bench`): drain throughput against a reference measured in the same
//! run, on the same database, with the same number of connections; and the latency from a
//! producer's commit to the handler's start.
//!
//! Every measurement runs on a scratch database that the benchmark creates and drops: a
//! temporary SQLite file, or a new database on the PostgreSQL server of the given URL (its
//! role needs `CREATEDB`). Nothing of the URL's own database is touched.
//!
//! The references are plain loops of `UPDATE` transactions on a small table of their own,
//! through the same diesel connections and prepared statements the worker uses:
//! - *single-row*: `BEGIN; UPDATE one row; COMMIT` — the most commits per second the
//!   database gives this many connections; strict mode (one transaction per task) cannot
//!   beat it, since each task is such a transaction plus its share of a claim;
//! - *K-row*: `BEGIN; K × UPDATE one row; COMMIT` — the limit for batched mode with chunks
//!   of K.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::pg::Pg;
use diesel::sql_types::BigInt;
use diesel::sqlite::Sqlite;
use diesel::RunQueryDsl;

use crate::db::TaskTx;
use crate::db::{write_transaction, Backend, DatabaseUrl, DbConnection};
use crate::driver::driver;
use crate::enqueue::{enqueue, enqueue_batch};
use crate::error::{Error, OpContext, Result};
use crate::migrate::run_migrations;
use crate::registry::Registry;
use crate::sql::Statement;
use crate::task::{NewTask, TaskContext};
use crate::worker::{Worker, WorkerConfig};

/// The keyword of the benchmark's no-op tasks.
pub const NOOP_KEYWORD: &str = "bench.noop";
/// Tasks per INSERT statement (and transaction) when the benchmark enqueues.
pub const ENQUEUE_BATCH: usize = 1000;

/// Which commit mode a drain measurement uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One transaction per task (`commit_batch` 1).
    Strict,
    /// Chunks of `commit_batch` tasks per transaction.
    Batched,
}

impl Mode {
    /// `strict` or `batched`, as printed.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Strict => "strict",
            Mode::Batched => "batched",
        }
    }
}

/// One drain measurement's settings.
#[derive(Debug, Clone)]
pub struct DrainBench {
    /// Strict or batched.
    pub mode: Mode,
    /// Tasks drained (and timed).
    pub tasks: usize,
    /// Pending tasks in the table when the drain starts (at least `tasks`): the drain takes
    /// the first `tasks` of them, to measure the rate at this backlog.
    pub backlog: usize,
    /// Execution threads of the worker.
    pub threads: usize,
    /// Tasks (chunks, in batched mode) that may wait for a thread.
    pub queue: usize,
    /// Tasks per transaction in batched mode (and rows per transaction of the K-row
    /// reference).
    pub commit_batch: usize,
    /// Print the claim statement's plan at this backlog.
    pub explain: bool,
    /// The no-op handler opens its transaction, as a handler that writes to the database
    /// does (`BEGIN; UPDATE; COMMIT` per task, or per chunk, instead of one statement).
    pub open_tx: bool,
}

impl DrainBench {
    /// `noop`, or `noop-in-transaction` with [`DrainBench::open_tx`].
    pub fn handler_name(&self) -> &'static str {
        if self.open_tx {
            "noop-in-transaction"
        } else {
            "noop"
        }
    }
}

/// What one drain measurement found.
#[derive(Debug, Clone, Default)]
pub struct DrainFigures {
    /// Tasks enqueued per second (bulk, [`ENQUEUE_BATCH`] per statement).
    pub enqueue_per_s: f64,
    /// The bulk-insert reference: rows per second of plain multi-row `INSERT … VALUES`
    /// statements of [`ENQUEUE_BATCH`] rows, each its own transaction, into `async_task`.
    pub insert_reference_per_s: f64,
    /// Tasks drained.
    pub drained: u64,
    /// Tasks drained per second.
    pub tasks_per_s: f64,
    /// The reference loop's rows per second (single-row for strict, K-row for batched).
    pub reference_per_s: f64,
    /// Connections the reference used: as many as the worker uses at once (threads + 1).
    pub reference_connections: usize,
    /// `tasks_per_s / reference_per_s`.
    pub ratio: f64,
    /// CPU seconds (user + system) of this process during the drain.
    pub cpu_s: f64,
    /// Peak resident memory of this process so far, MiB.
    pub rss_mib: f64,
    /// The claim's plan at the backlog, when asked for.
    pub plan: Vec<String>,
}

/// Measures one drain and its reference on a fresh scratch database.
pub fn drain_bench(url: &DatabaseUrl, bench: &DrainBench) -> Result<DrainFigures> {
    if bench.tasks == 0 || bench.backlog < bench.tasks {
        return Err(Error::InvalidConfig(format!(
            "the backlog ({}) must hold at least the tasks drained ({}), and tasks must be > 0",
            bench.backlog, bench.tasks
        )));
    }
    let scratch = Scratch::create(url)?;
    let mut conn = scratch.url.connect()?;
    run_migrations(&mut conn)?;

    // The insert reference first, on the empty table the enqueue then starts from too.
    let insert_reference_per_s = insert_reference(&mut conn, bench.backlog.min(100_000))?;
    let empty = match scratch.url.backend() {
        Backend::Postgres => "TRUNCATE async_task",
        Backend::Sqlite => "DELETE FROM async_task",
    };
    conn.batch_execute(empty).op("empty the table")?;
    let started = Instant::now();
    enqueue_noop(&mut conn, bench.backlog)?;
    let enqueue_per_s = bench.backlog as f64 / started.elapsed().as_secs_f64();
    if scratch.url.backend() == Backend::Postgres {
        conn.batch_execute("ANALYZE async_task").op("analyze")?;
    }

    let commit_batch = match bench.mode {
        Mode::Strict => 1,
        Mode::Batched => bench.commit_batch,
    };
    let defaults = WorkerConfig::default();
    let mut config = WorkerConfig {
        threads: bench.threads,
        queue: bench.queue,
        commit_batch,
        listen: false,
        ..defaults
    };
    if commit_batch > 1 {
        config.page_size = config.claim_capacity().min(10_000);
    }
    let plan = if bench.explain {
        driver(&mut conn)
            .task_claim_plan(
                &[NOOP_KEYWORD.to_owned()],
                i64::try_from(config.page_size.min(config.claim_capacity())).unwrap_or(i64::MAX),
            )
            .op("explain the claim")?
    } else {
        Vec::new()
    };
    // The worker's pool holds threads + 2 connections, of which at most threads + 1 are in
    // use at once (the pool's threads, and the claiming thread, which claims or runs a task
    // itself: CallerRuns, and on PostgreSQL while it waits); the reference commits on as
    // many at once.
    let connections = config.threads + 1;

    let mut registry = Registry::new();
    if bench.open_tx {
        registry.register(NOOP_KEYWORD, |_: &TaskContext, tx: &mut TaskTx| {
            tx.conn()?;
            Ok(())
        });
    } else {
        registry.register(NOOP_KEYWORD, |_: &TaskContext, _: &mut TaskTx| Ok(()));
    }
    let worker = Worker::new(&scratch.url, registry, config)?;
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    // `drain`'s own loop (claims overlapping execution), stopped after `tasks` claims.
    let tally = worker.drain_at_most(bench.tasks as u64)?.tally;
    let drained = tally.done + tally.retried + tally.dead;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds() - cpu_before;
    drop(worker);
    let tasks_per_s = drained as f64 / elapsed;

    let rows_per_txn = commit_batch;
    let reference_per_s = reference(&scratch.url, connections, rows_per_txn, bench.tasks)?;
    Ok(DrainFigures {
        enqueue_per_s,
        insert_reference_per_s,
        drained,
        tasks_per_s,
        reference_per_s,
        reference_connections: connections,
        ratio: tasks_per_s / reference_per_s,
        cpu_s,
        rss_mib: peak_rss_mib(),
        plan,
    })
}

/// Enqueues `n` no-op tasks, [`ENQUEUE_BATCH`] per statement and transaction.
fn enqueue_noop(conn: &mut DbConnection, n: usize) -> Result<()> {
    let mut next = 0;
    while next < n {
        let end = (next + ENQUEUE_BATCH).min(n);
        let batch: Vec<NewTask> = (next..end)
            .map(|i| NewTask::new(NOOP_KEYWORD, i.to_string()))
            .collect();
        write_transaction(conn, |c| enqueue_batch(c, &batch))?;
        next = end;
    }
    Ok(())
}

/// The bulk-insert reference: `n` rows into `async_task` by plain multi-row INSERTs of
/// [`ENQUEUE_BATCH`] literal rows, each statement its own transaction; returns rows per
/// second. (Run on the empty table, before the enqueue.)
fn insert_reference(conn: &mut DbConnection, n: usize) -> Result<f64> {
    let started = Instant::now();
    let mut next = 0;
    while next < n {
        let end = (next + ENQUEUE_BATCH).min(n);
        let values: Vec<String> = (next..end)
            .map(|i| format!("('bench.ref', '{i}', '{{}}', 0)"))
            .collect();
        conn.batch_execute(&format!(
            "INSERT INTO async_task (keyword, biz_id, biz_data, priority) VALUES {}",
            values.join(", ")
        ))
        .op("reference insert")?;
        next = end;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// The reference: `connections` threads, each on its own connection and rows, commit
/// transactions of `rows_per_txn` single-row UPDATEs until `total_rows` rows are updated in
/// all; returns rows per second. On SQLite the threads take turns on a mutex, as the
/// worker's do.
fn reference(
    url: &DatabaseUrl,
    connections: usize,
    rows_per_txn: usize,
    total_rows: usize,
) -> Result<f64> {
    let mut setup = url.connect()?;
    let rows = connections * rows_per_txn;
    setup
        .batch_execute(
            "DROP TABLE IF EXISTS bench_ref; \
             CREATE TABLE bench_ref (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)",
        )
        .op("create the reference table")?;
    let values: Vec<String> = (0..rows).map(|i| format!("({i}, 0)")).collect();
    setup
        .batch_execute(&format!(
            "INSERT INTO bench_ref (id, n) VALUES {}",
            values.join(", ")
        ))
        .op("fill the reference table")?;
    let txns_per_thread = (total_rows / rows).max(1);
    let sqlite_turn = Mutex::new(());
    let barrier = Barrier::new(connections + 1);
    let elapsed = std::thread::scope(|s| -> Result<Duration> {
        let mut threads = Vec::new();
        for t in 0..connections {
            let (barrier, sqlite_turn) = (&barrier, &sqlite_turn);
            threads.push(s.spawn(move || -> Result<()> {
                let mut conn = url.connect()?;
                let first = (t * rows_per_txn) as i64;
                barrier.wait();
                for _ in 0..txns_per_thread {
                    let _turn = matches!(conn, DbConnection::Sqlite(_))
                        .then(|| sqlite_turn.lock().expect("turn lock"));
                    write_transaction(&mut conn, |c| -> Result<()> {
                        for id in first..first + rows_per_txn as i64 {
                            update_reference_row(c, id).op("reference update")?;
                        }
                        Ok(())
                    })?;
                }
                Ok(())
            }));
        }
        barrier.wait();
        let started = Instant::now();
        for thread in threads {
            thread
                .join()
                .map_err(|_| Error::Runtime("a reference thread panicked".into()))??;
        }
        Ok(started.elapsed())
    })?;
    setup
        .batch_execute("DROP TABLE bench_ref")
        .op("drop the reference table")?;
    Ok((txns_per_thread * rows) as f64 / elapsed.as_secs_f64())
}

fn update_reference_row(conn: &mut DbConnection, id: i64) -> diesel::QueryResult<usize> {
    const SQL: &str = "UPDATE bench_ref SET n = n + 1 WHERE id = ";
    match conn {
        DbConnection::Pg(c) => Statement::<Pg>::new(SQL).bind::<BigInt, _>(id).execute(c),
        DbConnection::Sqlite(c) => Statement::<Sqlite>::new(SQL)
            .bind::<BigInt, _>(id)
            .execute(c),
    }
}

/// What a latency measurement found: the time from a producer's commit to its handler's
/// start.
#[derive(Debug, Clone)]
pub struct LatencyFigures {
    /// Tasks measured.
    pub samples: usize,
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Longest.
    pub max: Duration,
}

/// Measures commit-to-start latency of a `run` worker that is idle between tasks: a producer
/// commits one task at a time, 5–15 ms apart with `listen`, or a random fraction of the poll
/// interval apart without; the handler notes when it starts.
pub fn latency_bench(
    url: &DatabaseUrl,
    listen: bool,
    poll_interval: Duration,
    samples: usize,
) -> Result<LatencyFigures> {
    if samples == 0 {
        return Err(Error::InvalidConfig("latency samples must be > 0".into()));
    }
    let scratch = Scratch::create(url)?;
    let mut conn = scratch.url.connect()?;
    run_migrations(&mut conn)?;
    let starts: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut registry = Registry::new();
    {
        let starts = Arc::clone(&starts);
        registry.register(
            "bench.latency",
            move |task: &TaskContext, _: &mut TaskTx| {
                let now = Instant::now();
                starts
                    .lock()
                    .expect("starts lock")
                    .insert(task.biz_id().to_owned(), now);
                Ok(())
            },
        );
    }
    let config = WorkerConfig {
        threads: 2,
        queue: 2,
        listen,
        poll_interval,
        ..WorkerConfig::default()
    };
    let worker = Worker::new(&scratch.url, registry, config)?;
    let stop = worker.stop_flag();
    let mut commits = Vec::with_capacity(samples);
    let outcome = std::thread::scope(|s| -> Result<()> {
        let runner = s.spawn(|| worker.run());
        let produced = (|| -> Result<()> {
            // Let the worker reach its idle wait (and LISTEN) before the first task.
            std::thread::sleep(Duration::from_millis(200));
            for i in 0..samples {
                let gap = if listen {
                    Duration::from_millis(5 + fastrand::u64(0..10))
                } else {
                    poll_interval.mul_f64(fastrand::f64())
                };
                std::thread::sleep(gap);
                let task = NewTask::new("bench.latency", i.to_string());
                write_transaction(&mut conn, |c| enqueue(c, &task))?;
                commits.push((i.to_string(), Instant::now()));
            }
            let give_up = Instant::now() + poll_interval * 2 + Duration::from_secs(30);
            while starts.lock().expect("starts lock").len() < samples {
                if Instant::now() > give_up {
                    return Err(Error::Runtime(
                        "latency: tasks were not all started within 30 s".into(),
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        let ran = runner
            .join()
            .map_err(|_| Error::Runtime("the latency worker panicked".into()))?;
        produced?;
        ran.map(|_| ())
    });
    outcome?;
    drop(worker);
    let starts = starts.lock().expect("starts lock");
    // A handler may start before the producer's COMMIT returns to it: that counts as 0.
    let mut latencies: Vec<Duration> = commits
        .iter()
        .map(|(id, committed)| starts[id].saturating_duration_since(*committed))
        .collect();
    latencies.sort();
    Ok(LatencyFigures {
        samples,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        max: *latencies.last().expect("samples > 0"),
    })
}

/// The `q` quantile of sorted values (nearest rank).
pub fn percentile<T: Copy>(sorted: &[T], q: f64) -> T {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median of some values (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// User + system CPU seconds of this process.
fn cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            seconds(usage.user_time()) + seconds(usage.system_time())
        }
        Err(_) => f64::NAN,
    }
}

/// Peak resident set of this process, MiB (Linux reports `ru_maxrss` in KiB).
fn peak_rss_mib() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF).map_or(f64::NAN, |u| u.max_rss() as f64 / 1024.0)
}

/// A scratch database, dropped (or deleted) when this is dropped.
struct Scratch {
    url: DatabaseUrl,
    /// PostgreSQL: the server URL to drop the database from, and its name.
    pg: Option<(DatabaseUrl, String)>,
    /// SQLite: the file.
    file: Option<std::path::PathBuf>,
}

impl Scratch {
    fn create(url: &DatabaseUrl) -> Result<Scratch> {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("outbox_bench_{}_{n}", std::process::id());
        match url.backend() {
            Backend::Postgres => {
                let scratch = DatabaseUrl::parse(&with_database(url.target(), &name))?;
                let mut admin = url.connect()?;
                admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
                    .and_then(|_| admin.batch_execute(&format!("CREATE DATABASE {name}")))
                    .op("create the scratch database (the role needs CREATEDB)")?;
                Ok(Scratch {
                    url: scratch,
                    pg: Some((url.clone(), name)),
                    file: None,
                })
            }
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("{name}.db"));
                let text = path
                    .to_str()
                    .ok_or_else(|| Error::Runtime("the temp dir is not UTF-8".into()))?
                    .to_owned();
                Ok(Scratch {
                    url: DatabaseUrl::parse(&text)?,
                    pg: None,
                    file: Some(path),
                })
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some((server, name)) = &self.pg {
            if let Ok(mut admin) = server.connect() {
                let _ =
                    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
        if let Some(file) = &self.file {
            for suffix in ["", "-wal", "-shm"] {
                let mut path = file.clone().into_os_string();
                path.push(suffix);
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// `url` with its database name replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let rest_at = url.find("://").map_or(0, |i| i + 3);
    let (head, rest) = url.split_at(rest_at);
    let (before_query, query) = match rest.find('?') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = before_query.split('/').next().unwrap_or(before_query);
    format!("{head}{authority}/{name}{query}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_name_is_replaced() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/app?sslmode=disable", "x"),
            "postgres://u:p@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("postgresql://h", "x"), "postgresql://h/x");
    }

    #[test]
    fn quantiles() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
