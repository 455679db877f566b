//! Benchmarks (`outbox bench`): drain throughput against a reference measured in the same
//! run, on the same database, with the same number of connections (`reference`); and the
//! latency from a producer's commit to the handler's start ([`latency`]).
//!
//! Every measurement runs on a scratch database that the benchmark creates and drops: a
//! temporary SQLite file, or a new database on the PostgreSQL server of the given URL (its
//! role needs `CREATEDB`). Nothing of the URL's own database is touched.

pub mod fair;
pub mod latency;
pub mod metrics_cost;
mod reference;
mod scratch;
pub mod strategy;

use std::time::Instant;

use diesel::connection::SimpleConnection;
use outbox::{
    enqueue_batch, run_migrations, write_transaction, Backend, ClaimStyle, DatabaseUrl,
    DbConnection, NewTask, Registry, TaskContext, TaskTx, Worker, WorkerConfig,
};

use scratch::{cpu_seconds, peak_rss_mib, Scratch};

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
    /// Execution threads of the worker (default: the worker's for the backend).
    pub threads: Option<usize>,
    /// Tasks (chunks, in batched mode) that may wait for a thread (default: the worker's).
    pub queue: Option<usize>,
    /// Tasks per transaction in batched mode (and rows per transaction of the K-row
    /// reference).
    pub commit_batch: usize,
    /// How the worker claims (default: the worker's, [`ClaimStyle::Auto`]).
    pub claim_style: ClaimStyle,
    /// Print the claim statement's plan at this backlog.
    pub explain: bool,
    /// The no-op handler opens its transaction, as a handler that writes to the database
    /// does (`BEGIN; UPDATE; COMMIT` per task, or per chunk, instead of one statement).
    pub open_tx: bool,
    /// The tasks' tenants: none (0), or spread over this many (`t0`, `t1`, …) in turn.
    pub tenants: usize,
    /// Each tenant's `max_running` (a row of `async_tenant` each); none: the tenants have
    /// no row.
    pub max_running: Option<i32>,
    /// Each tenant's `max_queued` (a row of `async_tenant` each): the enqueue checks it.
    pub max_queued: Option<i32>,
    /// Keywords the tasks are spread over in turn (at least 1; see [`keyword`]).
    pub keywords: usize,
    /// Bytes of each task's payload (`{"pad":"xx…"}`, at least 10; 0: the empty payload).
    pub payload_bytes: usize,
    /// Domains configured, one per keyword after the first: odd ones RESERVED 1, even ones
    /// MAX half the threads.
    pub domains: usize,
    /// Serve metrics (on a port of the system's choice) and scrape them every
    /// [`metrics_cost::SCRAPE_EVERY`] during the drain.
    pub metrics: bool,
    /// Measure the reference (otherwise its rate and the ratio are NaN).
    pub reference: bool,
}

/// The benchmark's `i`-th keyword: [`NOOP_KEYWORD`], then `bench.noop.1`, ….
pub fn keyword(i: usize) -> String {
    match i {
        0 => NOOP_KEYWORD.to_owned(),
        i => format!("{NOOP_KEYWORD}.{i}"),
    }
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
    /// The worker's execution threads.
    pub threads: usize,
    /// How the worker claimed (what `claim_style` resolved to).
    pub claim: ClaimStyle,
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
    /// Scrapes of the metrics endpoint answered during the drain.
    pub scrapes: u64,
}

/// Measures one drain and its reference on a fresh scratch database.
pub fn drain_bench(url: &DatabaseUrl, bench: &DrainBench) -> anyhow::Result<DrainFigures> {
    anyhow::ensure!(
        bench.tasks > 0 && bench.backlog >= bench.tasks,
        "the backlog ({}) must hold at least the tasks drained ({}), and tasks must be > 0",
        bench.backlog,
        bench.tasks
    );
    let scratch = Scratch::create(url)?;
    let mut conn = scratch.url.connect()?;
    run_migrations(&mut conn)?;

    // The insert reference first, on the empty table the enqueue then starts from too.
    let insert_reference_per_s = match bench.reference {
        true => reference::insert(&mut conn, bench.backlog.min(100_000))?,
        false => f64::NAN,
    };
    let empty = match scratch.url.backend() {
        Backend::Postgres => "TRUNCATE async_task",
        Backend::Sqlite => "DELETE FROM async_task",
        Backend::Mysql => "DELETE FROM async_task",
    };
    conn.batch_execute(empty)?;
    conn.batch_execute("DELETE FROM async_tenant")?;
    if bench.max_running.is_some() || bench.max_queued.is_some() {
        anyhow::ensure!(
            bench.tenants > 0,
            "--max-running and --max-queued need --tenants"
        );
        for t in 0..bench.tenants {
            let limits = outbox::TenantLimits::default()
                .max_running(bench.max_running)
                .max_queued(bench.max_queued);
            outbox::set_tenant(&mut conn, &format!("t{t}"), &limits, "bench")?;
        }
    }
    let started = Instant::now();
    enqueue_noop(
        &mut conn,
        bench.backlog,
        bench.tenants,
        bench.keywords.max(1),
        bench.payload_bytes,
    )?;
    let enqueue_per_s = bench.backlog as f64 / started.elapsed().as_secs_f64();
    if scratch.url.backend() == Backend::Postgres {
        conn.batch_execute("ANALYZE async_task")?;
        // The enqueue's WAL is flushed to the data files now, not by a checkpoint that
        // would fall in the timed drain (a 1,000,000-task backlog writes about 1 GB of WAL).
        // Only a superuser or a pg_checkpoint member may; without it the drain runs as is.
        let _ = conn.batch_execute("CHECKPOINT");
    }

    let commit_batch = match bench.mode {
        Mode::Strict => 1,
        Mode::Batched => bench.commit_batch,
    };
    let mut config = WorkerConfig::default()
        .commit_batch(commit_batch)
        .claim_style(bench.claim_style)
        .listen(false);
    config.threads = bench.threads;
    config.queue = bench.queue;
    if bench.metrics {
        config = config.metrics_addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    }
    let threads = bench.threads.unwrap_or(match scratch.url.backend() {
        Backend::Postgres | Backend::Mysql => outbox::worker::default_threads(),
        Backend::Sqlite => 1,
    });
    for d in 1..=bench.domains {
        let name = format!("d{d}");
        config = config.domain(if d % 2 == 1 {
            outbox::domain::Domain::reserved(&name, [keyword(d)], 1)
        } else {
            outbox::domain::Domain::max(&name, [keyword(d)], (threads / 2).max(1))
        });
    }

    let registry = noop_registry(bench.keywords, bench.open_tx);
    let worker = Worker::new(&scratch.url, registry, config)?;
    let plan = if bench.explain {
        worker.claim_plan()?
    } else {
        Vec::new()
    };
    // The worker's pool holds threads + 2 connections, of which at most threads + 1 are in
    // use at once (the pool's threads, and the claiming thread, which claims or runs a task
    // itself: CallerRuns, and on PostgreSQL while it waits); the reference commits on as
    // many at once.
    let threads = worker.threads();
    let claim = worker.claim_style();
    let connections = threads + 1;
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let scraper = worker.metrics_addr().map(metrics_cost::Scraper::start);
    // `drain`'s own loop (claims overlapping execution), stopped after `tasks` claims.
    let tally = worker.drain_at_most(bench.tasks as u64)?.tally;
    let drained = tally.finished();
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds() - cpu_before;
    let scrapes = scraper.map_or(0, metrics_cost::Scraper::stop);
    drop(worker);
    let tasks_per_s = drained as f64 / elapsed;

    let rows_per_txn = commit_batch;
    let reference_per_s = match bench.reference {
        true => reference::updates(&scratch.url, connections, rows_per_txn, bench.tasks)?,
        false => f64::NAN,
    };
    Ok(DrainFigures {
        threads,
        claim,
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
        scrapes,
    })
}

/// The no-op handler under the first `keywords` keywords (at least one); with `open_tx` it
/// opens its transaction, as a handler that writes to the database does.
fn noop_registry(keywords: usize, open_tx: bool) -> Registry {
    let mut registry = Registry::new();
    for k in 0..keywords.max(1) {
        if open_tx {
            registry.register(&keyword(k), |_: &TaskContext, tx: &mut TaskTx| {
                tx.conn()?;
                Ok(())
            });
        } else {
            registry.register(&keyword(k), |_: &TaskContext, _: &mut TaskTx| Ok(()));
        }
    }
    registry
}

/// Enqueues `n` no-op tasks, [`ENQUEUE_BATCH`] per statement and transaction, spread over
/// `tenants` tenants in turn (none when 0) and `keywords` keywords in turn, each with a
/// payload of about `payload_bytes` bytes (none when 0).
fn enqueue_noop(
    conn: &mut DbConnection,
    n: usize,
    tenants: usize,
    keywords: usize,
    payload_bytes: usize,
) -> anyhow::Result<()> {
    // `{"pad":""}` is 10 bytes as written.
    let payload = serde_json::json!({ "pad": "x".repeat(payload_bytes.saturating_sub(10)) });
    let mut next = 0;
    while next < n {
        let end = (next + ENQUEUE_BATCH).min(n);
        let batch: Vec<NewTask> = (next..end)
            .map(|i| {
                let mut task = NewTask::new(keyword(i % keywords), i.to_string());
                if payload_bytes > 0 {
                    task = task.payload(&payload);
                }
                match tenants {
                    0 => task,
                    t => task.tenant(format!("t{}", i % t)),
                }
            })
            .collect();
        write_transaction(conn, |c| enqueue_batch(c, &batch))?;
        next = end;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
