//! A claim strategy's drain throughput against `default`'s (`outbox bench --strategy S`):
//! a fleet of nodes — workers of this process, each its own node with its own pool —
//! drains one backlog of no-op tasks together, on a fresh scratch database per drain; the
//! strategy and `default` alternate round by round, so that both see the same machine.

use std::time::Instant;

use diesel::connection::SimpleConnection;
use diesel::sql_types::BigInt;
use diesel::{QueryableByName, RunQueryDsl};
use outbox::{run_migrations, Backend, DatabaseUrl, Strategy, Worker, WorkerConfig};

use super::scratch::Scratch;
use super::{enqueue_noop, noop_registry};

/// The execution threads of a node of weight 1 when none are given.
pub const DEFAULT_NODE_THREADS: usize = 4;

/// One fleet drain's settings.
#[derive(Debug, Clone, Copy)]
pub struct FleetDrain {
    /// The nodes' strategy.
    pub strategy: Strategy,
    /// With [`Strategy::Weight`], the first node's weight (the others weigh 1) and its
    /// threads' multiple: a node of weight N stands for a machine N times as large. The
    /// same threads whatever the strategy, so that `default` drains on the same fleet.
    pub weight: u32,
    /// Nodes in the fleet.
    pub nodes: usize,
    /// Tasks in the backlog, all drained.
    pub tasks: usize,
    /// Execution threads of a node of weight 1.
    pub threads: usize,
    /// With [`Strategy::LeastCount`], the nodes' slack (default: their threads).
    pub slack: Option<usize>,
}

/// What one fleet drain found.
#[derive(Debug, Clone)]
pub struct FleetFigures {
    /// Tasks done per second, from the start of the drains to the end of the last.
    pub tasks_per_s: f64,
    /// Tasks each node ran, in node order.
    pub per_node: Vec<u64>,
    /// With `id_hash` or `weight`: the fraction of the tasks run by the node that owns
    /// their id.
    pub owned: Option<f64>,
}

impl FleetDrain {
    /// Each node's weight: the first `weight` under [`Strategy::Weight`], the others 1.
    fn weights(&self) -> Vec<u32> {
        (0..self.nodes)
            .map(|i| match i {
                0 => self.weight,
                _ => 1,
            })
            .collect()
    }

    /// The fleet's own configuration of node `i` under `strategy`.
    fn config(&self, strategy: Strategy, i: usize) -> WorkerConfig {
        let weight = self.weights()[i];
        let config = WorkerConfig::default()
            .threads(self.threads * weight as usize)
            .listen(false)
            .strategy(strategy);
        match (strategy, self.slack) {
            (Strategy::Weight, _) => config.weight(weight),
            (Strategy::LeastCount, Some(slack)) => config.slack(slack),
            _ => config,
        }
    }
}

/// Drains `bench.tasks` no-op tasks with `bench.nodes` nodes of `strategy` (the fleet of
/// `bench`, whatever its own strategy: `default` is measured on the same threads).
pub fn fleet_drain(
    url: &DatabaseUrl,
    bench: &FleetDrain,
    strategy: Strategy,
) -> anyhow::Result<FleetFigures> {
    anyhow::ensure!(
        url.backend() == Backend::Postgres,
        "bench --strategy needs PostgreSQL: a fleet of nodes"
    );
    anyhow::ensure!(
        (1..=16).contains(&bench.nodes) && bench.tasks > 0,
        "bench --strategy: 1 to 16 nodes and at least one task"
    );
    let scratch = Scratch::create(url)?;
    let mut conn = scratch.url.connect()?;
    run_migrations(&mut conn)?;
    enqueue_noop(&mut conn, bench.tasks, 0, 1)?;
    conn.batch_execute("ANALYZE async_task")?;
    let _ = conn.batch_execute("CHECKPOINT");
    let workers: Vec<Worker> = (0..bench.nodes)
        .map(|i| {
            Worker::new(
                &scratch.url,
                noop_registry(1, false),
                bench.config(strategy, i),
            )
        })
        .collect::<outbox::Result<_>>()?;
    // Each node has published itself when it started; a beat each now, and every node has
    // read the whole fleet.
    for worker in &workers {
        worker.heartbeat_once()?;
    }
    let started = Instant::now();
    let tallies = std::thread::scope(|s| {
        let drains: Vec<_> = workers.iter().map(|w| s.spawn(|| w.drain())).collect();
        drains
            .into_iter()
            .map(|d| d.join().expect("a drain panicked"))
            .collect::<outbox::Result<Vec<_>>>()
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    let per_node: Vec<u64> = tallies.iter().map(|r| r.tally.done).collect();
    let done: u64 = per_node.iter().sum();
    let owned = match strategy.partitions() {
        true => Some(owned_fraction(&mut conn, bench, &workers, strategy)?),
        false => None,
    };
    drop(workers);
    Ok(FleetFigures {
        tasks_per_s: done as f64 / elapsed,
        per_node,
        owned,
    })
}

/// The fraction of the done tasks run by the node owning their id: the nodes ordered by id,
/// each owning its weight's remainders modulo the sum of the weights.
fn owned_fraction(
    conn: &mut outbox::DbConnection,
    bench: &FleetDrain,
    workers: &[Worker],
    strategy: Strategy,
) -> anyhow::Result<f64> {
    #[derive(QueryableByName)]
    struct Ran {
        #[diesel(sql_type = BigInt)]
        id: i64,
        #[diesel(sql_type = BigInt)]
        owner: i64,
    }
    let weights = bench.weights();
    let mut ring: Vec<(i64, i64)> = workers
        .iter()
        .zip(&weights)
        .map(|(w, &weight)| match strategy {
            Strategy::Weight => (w.node_id(), i64::from(weight)),
            _ => (w.node_id(), 1),
        })
        .collect();
    ring.sort_unstable();
    let modulus: i64 = ring.iter().map(|&(_, w)| w).sum();
    let owner_of = |id: i64| {
        let mut r = id % modulus;
        ring.iter()
            .find(|&&(_, w)| {
                let here = r < w;
                r -= w;
                here
            })
            .map(|&(node, _)| node)
    };
    let ran: Vec<Ran> = diesel::sql_query(
        "SELECT id, owner FROM async_task WHERE state = 'done' AND owner IS NOT NULL",
    )
    .load(conn)?;
    let owned = ran
        .iter()
        .filter(|r| owner_of(r.id) == Some(r.owner))
        .count();
    Ok(owned as f64 / ran.len().max(1) as f64)
}
