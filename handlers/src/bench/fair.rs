//! Fair claiming's figures: how long a small tenant's tasks wait behind a large tenant's
//! backlog, and how two saturated tenants of weights 3 and 1 are served.

use std::sync::atomic::Ordering;
use std::time::Duration;

use diesel::sql_types::{BigInt, Double};
use diesel::{QueryableByName, RunQueryDsl};
use outbox::{
    enqueue, enqueue_batch, run_migrations, set_tenant, write_transaction, Backend, DatabaseUrl,
    NewTask, Registry, TaskContext, TaskTx, TenantLimits, Worker, WorkerConfig,
};

use super::scratch::Scratch;
use super::{percentile, ENQUEUE_BATCH, NOOP_KEYWORD};

/// What one fairness run found.
#[derive(Debug, Clone)]
pub struct FairFigures {
    /// The large tenant's backlog when the small one starts enqueueing.
    pub backlog: usize,
    /// The small tenant's tasks, enqueued one at a time while the backlog drains.
    pub small: usize,
    /// From due to claimed, the small tenant's tasks: median (ms).
    pub small_p50_ms: f64,
    /// … and 99th percentile (ms).
    pub small_p99_ms: f64,
    /// The same for the large tenant's tasks claimed meanwhile: median (ms).
    pub large_p50_ms: f64,
    /// … and 99th percentile (ms).
    pub large_p99_ms: f64,
    /// Time between two claims while the small tenant's tasks came (ms, mean).
    pub claim_cycle_ms: f64,
    /// Tasks drained of the tenants of weights 3 and 1.
    pub weighted: usize,
    /// Of which the weight-3 tenant's.
    pub heavy_done: i64,
    /// Of which the weight-1 tenant's.
    pub light_done: i64,
}

fn registry() -> Registry {
    let mut registry = Registry::new();
    registry.register(NOOP_KEYWORD, |_: &TaskContext, _: &mut TaskTx| Ok(()));
    registry
}

fn enqueue_many(url: &DatabaseUrl, tenant: &str, n: usize) -> anyhow::Result<()> {
    let mut conn = url.connect()?;
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| NewTask::new(NOOP_KEYWORD, format!("{tenant}-{i}")).tenant(tenant))
        .collect();
    for batch in tasks.chunks(ENQUEUE_BATCH) {
        write_transaction(&mut conn, |c| enqueue_batch(c, batch))?;
    }
    Ok(())
}

/// Tenant `large` holds `backlog` due tasks; while a `run` worker drains it, tenant `small`
/// enqueues `small` tasks, one every 10 ms. Then, in a second database, tenants of weights 3
/// and 1 hold `weighted` tasks each and a drain takes `weighted` of them.
pub fn fair_bench(
    url: &DatabaseUrl,
    backlog: usize,
    small: usize,
    weighted: usize,
    threads: Option<usize>,
) -> anyhow::Result<FairFigures> {
    anyhow::ensure!(small > 0 && weighted > 0, "fair bench: nothing to measure");
    let config = || {
        let config = WorkerConfig::default();
        match threads {
            Some(n) => config.threads(n),
            None => config,
        }
    };
    // The wait behind a backlog.
    let scratch = Scratch::create(url)?;
    run_migrations(&mut scratch.url.connect()?)?;
    enqueue_many(&scratch.url, "large", backlog)?;
    let worker = Worker::new(&scratch.url, registry(), config())?;
    let stop = worker.stop_flag();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let runner = s.spawn(|| worker.run());
        let produced = (|| -> anyhow::Result<()> {
            let mut conn = scratch.url.connect()?;
            std::thread::sleep(Duration::from_millis(500));
            for i in 0..small {
                let task = NewTask::new(NOOP_KEYWORD, format!("small-{i}")).tenant("small");
                write_transaction(&mut conn, |c| enqueue(c, &task))?;
                std::thread::sleep(Duration::from_millis(10));
            }
            // Until the small tenant's tasks are all claimed.
            for _ in 0..3000 {
                if count(&scratch.url, "small", "state = 'pending'")? == 0 {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            anyhow::bail!("the small tenant's tasks were not all claimed within 30 s")
        })();
        stop.store(true, Ordering::Relaxed);
        let ran = runner
            .join()
            .map_err(|_| anyhow::anyhow!("the fair bench's worker panicked"))?;
        produced?;
        ran?;
        Ok(())
    })?;
    drop(worker);
    let small_waits = waits(&scratch.url, "small", None)?;
    let window = claim_window(&scratch.url)?;
    let large_waits = waits(&scratch.url, "large", Some(window))?;
    drop(scratch);

    // Weights 3:1.
    let scratch = Scratch::create(url)?;
    run_migrations(&mut scratch.url.connect()?)?;
    set_tenant(
        &mut scratch.url.connect()?,
        "heavy",
        &TenantLimits::default().weight(3),
        "bench",
    )?;
    enqueue_many(&scratch.url, "light", weighted)?;
    enqueue_many(&scratch.url, "heavy", weighted)?;
    let worker = Worker::new(&scratch.url, registry(), config())?;
    worker.drain_at_most(weighted as u64)?;
    drop(worker);
    let heavy_done = count(&scratch.url, "heavy", "state = 'done'")?;
    let light_done = count(&scratch.url, "light", "state = 'done'")?;

    Ok(FairFigures {
        backlog,
        small,
        small_p50_ms: percentile(&small_waits, 0.5),
        small_p99_ms: percentile(&small_waits, 0.99),
        large_p50_ms: percentile(&large_waits, 0.5),
        large_p99_ms: percentile(&large_waits, 0.99),
        claim_cycle_ms: window.2,
        weighted,
        heavy_done,
        light_done,
    })
}

/// Tasks of `tenant` matching `condition`.
fn count(url: &DatabaseUrl, tenant: &str, condition: &str) -> anyhow::Result<i64> {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let n: N = diesel::sql_query(format!(
        "SELECT count(*) AS n FROM async_task WHERE tenant = '{tenant}' AND {condition}"
    ))
    .get_result(&mut url.connect()?)?;
    Ok(n.n)
}

/// Seconds since the epoch of a timestamp column, on either backend.
fn epoch(url: &DatabaseUrl, column: &str) -> String {
    match url.backend() {
        Backend::Postgres => format!("CAST(extract(epoch FROM {column}) AS double precision)"),
        Backend::Sqlite => format!("(julianday({column}) - 2440587.5) * 86400.0"),
        Backend::Mysql => format!("CAST(UNIX_TIMESTAMP({column}) AS DOUBLE)"),
    }
}

/// The small tenant's claims: from the first to the last (seconds since the epoch), and the
/// mean time between two claim statements meanwhile (ms; a claim stamps one `claimed_at`).
fn claim_window(url: &DatabaseUrl) -> anyhow::Result<(f64, f64, f64)> {
    #[derive(QueryableByName)]
    struct Window {
        #[diesel(sql_type = Double)]
        first: f64,
        #[diesel(sql_type = Double)]
        last: f64,
        #[diesel(sql_type = Double)]
        claims: f64,
    }
    let claimed = epoch(url, "claimed_at");
    let w: Window = diesel::sql_query(format!(
        "WITH s AS (SELECT min({claimed}) AS first, max({claimed}) AS last
                      FROM async_task WHERE tenant = 'small')
         SELECT s.first, s.last, CAST((SELECT count(DISTINCT claimed_at) FROM async_task
                                   WHERE {claimed} BETWEEN s.first AND s.last) AS double precision) AS claims
           FROM s"
    ))
    .get_result(&mut url.connect()?)?;
    let cycle = (w.last - w.first) * 1000.0 / (w.claims - 1.0).max(1.0);
    Ok((w.first, w.last, cycle))
}

/// From due to claimed (ms), sorted, for `tenant`'s claimed tasks (within `window` only).
fn waits(
    url: &DatabaseUrl,
    tenant: &str,
    window: Option<(f64, f64, f64)>,
) -> anyhow::Result<Vec<f64>> {
    #[derive(QueryableByName)]
    struct Wait {
        #[diesel(sql_type = Double)]
        ms: f64,
    }
    let (claimed, due) = (epoch(url, "claimed_at"), epoch(url, "run_at"));
    let within = window.map_or_else(String::new, |(first, last, _)| {
        format!(" AND {claimed} BETWEEN {first} AND {last}")
    });
    let rows: Vec<Wait> = diesel::sql_query(format!(
        "SELECT (({claimed}) - ({due})) * 1000.0 AS ms FROM async_task
          WHERE tenant = '{tenant}' AND claimed_at IS NOT NULL{within} ORDER BY 1"
    ))
    .load(&mut url.connect()?)?;
    anyhow::ensure!(!rows.is_empty(), "no task of {tenant} was claimed");
    Ok(rows.into_iter().map(|w| w.ms.max(0.0)).collect())
}
