//! Commit-to-start latency: the time from a producer's commit to its handler's start, with
//! an idle `run` worker woken by `LISTEN/NOTIFY` (PostgreSQL) or by polling.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox::{
    enqueue, run_migrations, write_transaction, DatabaseUrl, NewTask, Registry, TaskContext,
    TaskTx, Worker, WorkerConfig,
};

use super::percentile;
use super::scratch::Scratch;

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
) -> anyhow::Result<LatencyFigures> {
    anyhow::ensure!(samples > 0, "latency samples must be > 0");
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
    let config = WorkerConfig::default()
        .threads(2)
        .queue(2)
        .listen(listen)
        .poll_interval(poll_interval);
    let worker = Worker::new(&scratch.url, registry, config)?;
    let stop = worker.stop_flag();
    let mut commits = Vec::with_capacity(samples);
    let outcome = std::thread::scope(|s| -> anyhow::Result<()> {
        let runner = s.spawn(|| worker.run());
        let produced = (|| -> anyhow::Result<()> {
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
                    anyhow::bail!("latency: tasks were not all started within 30 s");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        let ran = runner
            .join()
            .map_err(|_| anyhow::anyhow!("the latency worker panicked"))?;
        produced?;
        ran?;
        Ok(())
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
