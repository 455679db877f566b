//! A claim strategy's drain throughput against `default`'s (`outbox bench --strategy S`): a
//! fleet of real nodes — `outbox bench --node` processes, this binary started again — drains
//! one backlog of no-op tasks together, on a fresh scratch database per drain; the strategy
//! and `default` alternate round by round, so that both see the same machine.
//!
//! Nodes are processes, not workers of one process: in one process the first worker created
//! took nearly half of a `default` drain (its threads scheduled ahead of the others'), which
//! a strategy with fixed shares then pays for; separate processes share evenly.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Text};
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
    /// Tasks done per second, from the nodes' start signal to the last one's report.
    pub tasks_per_s: f64,
    /// Tasks each node ran, in node order.
    pub per_node: Vec<u64>,
    /// With `id_hash` or `weight`: the fraction of the tasks run by the node that owns
    /// their id.
    pub owned: Option<f64>,
}

/// One node of a fleet drain, as `outbox bench --node` runs it.
#[derive(Debug, Clone, Copy)]
pub struct FleetNode {
    /// Its strategy.
    pub strategy: Strategy,
    /// Its weight (with [`Strategy::Weight`]).
    pub weight: u32,
    /// Its threads.
    pub threads: usize,
    /// Its slack (with [`Strategy::LeastCount`]).
    pub slack: Option<usize>,
    /// The nodes of the fleet, itself included: it waits for all of them.
    pub nodes: usize,
}

impl FleetDrain {
    /// Node `i` of the fleet under `strategy`: the first weighs `weight` under
    /// [`Strategy::Weight`] and has that many times the threads (whatever the strategy).
    fn node(&self, strategy: Strategy, i: usize) -> FleetNode {
        let weight = match (self.strategy, i) {
            (Strategy::Weight, 0) => self.weight,
            _ => 1,
        };
        FleetNode {
            strategy,
            weight: if strategy == Strategy::Weight {
                weight
            } else {
                1
            },
            threads: self.threads * weight as usize,
            slack: self.slack.filter(|_| strategy == Strategy::LeastCount),
            nodes: self.nodes,
        }
    }
}

/// A node process of a fleet drain.
struct NodeProc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl NodeProc {
    fn spawn(url: &DatabaseUrl, node: &FleetNode) -> anyhow::Result<NodeProc> {
        let mut args = vec![
            "--database-url".to_owned(),
            url.as_str().to_owned(),
            "bench".to_owned(),
            "--node".to_owned(),
            "--strategy".to_owned(),
            node.strategy.to_string(),
            "--weight".to_owned(),
            node.weight.to_string(),
            "--threads".to_owned(),
            node.threads.to_string(),
            "--nodes".to_owned(),
            node.nodes.to_string(),
        ];
        if let Some(slack) = node.slack {
            args.extend(["--slack".to_owned(), slack.to_string()]);
        }
        let mut child = Command::new(std::env::current_exe().context("this binary's path")?)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting a bench node")?;
        let stdin = child.stdin.take().context("the node's stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("the node's stdout")?);
        Ok(NodeProc {
            child,
            stdin,
            stdout,
        })
    }

    /// The node's next line of output.
    fn line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        anyhow::ensure!(
            !line.is_empty(),
            "a bench node exited early (its errors are above)"
        );
        Ok(line.trim().to_owned())
    }
}

/// Drains `bench.tasks` no-op tasks with `bench.nodes` node processes of `strategy` (the
/// fleet of `bench`, whatever its own strategy: `default` is measured on the same threads).
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
    enqueue_noop(&mut conn, bench.tasks, 0, 1, 0)?;
    conn.batch_execute("ANALYZE async_task")?;
    let _ = conn.batch_execute("CHECKPOINT");
    let mut nodes: Vec<NodeProc> = (0..bench.nodes)
        .map(|i| NodeProc::spawn(&scratch.url, &bench.node(strategy, i)))
        .collect::<anyhow::Result<_>>()?;
    // Each says `ready` once it has seen the whole fleet; then all start at once.
    for node in &mut nodes {
        anyhow::ensure!(node.line()? == "ready", "a bench node did not get ready");
    }
    let started = Instant::now();
    for node in &mut nodes {
        node.stdin.write_all(b"go\n")?;
        node.stdin.flush()?;
    }
    let mut per_node = Vec::new();
    let mut ids = Vec::new();
    for node in &mut nodes {
        let report: serde_json::Value = serde_json::from_str(&node.line()?)?;
        per_node.push(report["done"].as_u64().unwrap_or(0));
        ids.push(report["node"].as_i64().unwrap_or(0));
    }
    let elapsed = started.elapsed().as_secs_f64();
    for node in &mut nodes {
        node.child.wait()?;
    }
    let done: u64 = per_node.iter().sum();
    let owned = match strategy.partitions() {
        true => Some(owned_fraction(&mut conn)?),
        false => None,
    };
    Ok(FleetFigures {
        tasks_per_s: done as f64 / elapsed,
        per_node,
        owned,
    })
}

/// One node of a fleet drain (`outbox bench --node`): registers, waits until the whole fleet
/// has published its strategy and has read it, says `ready`, waits for `go` on stdin,
/// drains, and prints `{"node": id, "done": n}`.
pub fn fleet_node(url: &DatabaseUrl, node: &FleetNode) -> anyhow::Result<()> {
    let mut config = WorkerConfig::default()
        .threads(node.threads)
        .listen(false)
        .strategy(node.strategy);
    if node.strategy == Strategy::Weight {
        config = config.weight(node.weight);
    }
    if let Some(slack) = node.slack {
        config = config.slack(slack);
    }
    let worker = Worker::new(url, noop_registry(1, false), config)?;
    let mut conn = url.connect()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while published(&mut conn, node.strategy)? < node.nodes as i64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the fleet did not gather in 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    worker.heartbeat_once()?;
    println!("ready");
    std::io::stdout().flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let tally = worker.drain()?.tally;
    println!(
        "{}",
        serde_json::json!({"node": worker.node_id(), "done": tally.done})
    );
    std::io::stdout().flush()?;
    Ok(())
}

/// The live nodes that have published `strategy`.
fn published(conn: &mut outbox::DbConnection, strategy: Strategy) -> anyhow::Result<i64> {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let row: N = diesel::sql_query(
        "SELECT count(*) AS n FROM async_node WHERE state = 'alive' AND strategy = $1",
    )
    .bind::<Text, _>(strategy.as_str())
    .get_result(conn)?;
    Ok(row.n)
}

/// The fraction of the done tasks run by the node owning their id: the nodes ordered by id,
/// each owning its weight's remainders modulo the sum of the weights (an id_hash node
/// weighs 1), as they published them.
fn owned_fraction(conn: &mut outbox::DbConnection) -> anyhow::Result<f64> {
    #[derive(QueryableByName)]
    struct Owned {
        #[diesel(sql_type = BigInt)]
        owned: i64,
        #[diesel(sql_type = BigInt)]
        done: i64,
    }
    let row: Owned = diesel::sql_query(
        "WITH ring AS (
             SELECT id, CASE strategy WHEN 'weight' THEN weight ELSE 1 END AS w FROM async_node
              WHERE strategy IN ('id_hash', 'weight')
         ), range AS (
             SELECT id, sum(w) OVER (ORDER BY id) - w AS lo, sum(w) OVER (ORDER BY id) AS hi,
                    sum(w) OVER () AS m FROM ring
         )
         SELECT (SELECT count(*) FROM async_task t JOIN range r ON r.id = t.owner
                  WHERE t.state = 'done' AND t.id % r.m >= r.lo AND t.id % r.m < r.hi) AS owned,
                (SELECT count(*) FROM async_task WHERE state = 'done') AS done",
    )
    .get_result(conn)?;
    Ok(row.owned as f64 / row.done.max(1) as f64)
}
