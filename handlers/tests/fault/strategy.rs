//! Claim strategies with real processes: three `run` workers of one strategy share a backlog
//! (the distribution the strategy promises, measured and reported), then, while a second
//! backlog drains, one is SIGKILLed and another joins: nothing is lost or run twice.
//!
//! - `id_hash`: each node runs the tasks whose `id mod 3` is its position by node id.
//! - `weight` (weights 1, 2, 3): each node owns its weight's share of the ids modulo 6.
//! - `least_count` (slack 1): a burst of long tasks spreads over the nodes, none holding
//!   more than the least-loaded other plus one (as of its last heartbeat).

use std::time::{Duration, Instant};

use outbox::{Backend, NewTask};
use serde_json::json;

use crate::db::{fault_db, wait_until, wait_until_finished, Db};
use crate::invariants::check_and_publish;
use crate::report::{secs, Report};
use crate::scenario::{stop_all, Proc, Scenario};
use crate::work_limit;

/// `n` `fault.ledger` tasks `tag-i`, each sleeping `sleep_ms`.
fn tasks(tag: &str, n: usize, sleep_ms: u64) -> Vec<NewTask> {
    (0..n)
        .map(|i| {
            NewTask::new("fault.ledger", format!("{tag}-{i}"))
                .payload(&json!({ "sleep_ms": sleep_ms }))
        })
        .collect()
}

/// A live node as the partition sees it: its id and weight.
struct Node {
    id: i64,
    weight: i64,
}

/// The live nodes that partition the ids, by id, with their published weights (an id_hash
/// node weighs 1).
fn ring(db: &Db) -> Vec<Node> {
    let ids = db.numbers(
        "SELECT id AS n FROM async_node WHERE state = 'alive'
           AND strategy IN ('id_hash', 'weight') ORDER BY id",
    );
    ids.into_iter()
        .map(|id| Node {
            id,
            weight: db.count(&format!(
                "SELECT CAST(CASE strategy WHEN 'weight' THEN weight ELSE 1 END AS BIGINT) FROM async_node WHERE id = {id}"
            )),
        })
        .collect()
}

/// Of the done tasks `tag-*`, the fraction run by the node whose share of the ids holds theirs.
fn owned_fraction(db: &Db, ring: &[Node], tag: &str) -> f64 {
    let modulus: i64 = ring.iter().map(|n| n.weight).sum();
    let mut lo = 0;
    let ranges: Vec<String> = ring
        .iter()
        .map(|n| {
            let range = format!("({}, {lo}, {})", n.id, lo + n.weight);
            lo += n.weight;
            range
        })
        .collect();
    let owned = db.count(&format!(
        "SELECT count(*) FROM async_task t JOIN (VALUES {}) AS r(node, lo, hi) ON t.owner = r.node
          WHERE t.state = 'done' AND t.biz_id LIKE '{tag}-%'
            AND t.id % {modulus} >= r.lo AND t.id % {modulus} < r.hi",
        ranges.join(", ")
    ));
    let done = done_of(db, tag);
    owned as f64 / done.max(1) as f64
}

fn done_of(db: &Db, tag: &str) -> i64 {
    db.count(&format!(
        "SELECT count(*) FROM async_task WHERE state = 'done' AND biz_id LIKE '{tag}-%'"
    ))
}

/// Each node's done tasks `tag-*`, by node id, as `(node, tasks)`.
fn shares(db: &Db, tag: &str) -> Vec<(i64, i64)> {
    let nodes = db.numbers(&format!(
        "SELECT DISTINCT owner AS n FROM async_task WHERE state = 'done' AND biz_id LIKE '{tag}-%' ORDER BY 1"
    ));
    nodes
        .into_iter()
        .map(|node| {
            let n = db.count(&format!(
                "SELECT count(*) FROM async_task WHERE state = 'done' AND owner = {node} AND biz_id LIKE '{tag}-%'"
            ));
            (node, n)
        })
        .collect()
}

/// `node N [(weight W)] T (P%), …`.
fn shares_text(db: &Db, shares: &[(i64, i64)]) -> String {
    let total: i64 = shares.iter().map(|s| s.1).sum();
    shares
        .iter()
        .map(|(node, n)| {
            let weight = db.count(&format!(
                "SELECT CAST(CASE strategy WHEN 'weight' THEN weight ELSE 0 END AS BIGINT)
                   FROM async_node WHERE id = {node}"
            ));
            let weight = match weight {
                0 => String::new(),
                w => format!(" (weight {w})"),
            };
            format!(
                "node {node}{weight} {n} ({:.1}%)",
                100.0 * *n as f64 / total.max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits until the three workers have registered and each has beaten twice since the last
/// of them published its strategy: every node has read the whole fleet.
fn wait_for_fleet(db: &Db, workers: &mut [Proc]) {
    wait_until(
        db,
        Duration::from_secs(60),
        "the nodes to see each other",
        || {
            for w in workers.iter_mut() {
                w.assert_running("starting");
            }
            let registered = workers
                .iter()
                .filter(|w| db.node_id(&w.node_name()).is_some())
                .count();
            registered == workers.len()
                && db.count(
                    "SELECT count(*) FROM async_node WHERE state = 'alive' AND heartbeat_at >=
                   (SELECT max(started_at) FROM async_node WHERE state = 'alive')
                   + interval '1200 milliseconds'",
                ) == workers.len() as i64
        },
    );
}

/// The strategy's flags for the `i`-th worker started.
type Flags = fn(usize) -> Vec<(&'static str, String)>;

/// Starts the `i`-th worker with `flags(i)` over the suite's worker flags.
fn spawn(sc: &Scenario, url: &str, flags: Flags, i: usize) -> Proc {
    let flags = flags(i);
    let overrides: Vec<(&str, &str)> = flags.iter().map(|(f, v)| (*f, v.as_str())).collect();
    sc.spawn(
        &format!("worker{i}"),
        url,
        &sc.worker_args("run", &overrides),
    )
}

/// The second part of every scenario: `tasks` tasks `b-*` drain while the first worker is
/// SIGKILLed (a third of the way) and a fourth joins; every task is done once. Returns the
/// shares of that part, the killed and the joined node's ids and the time it took.
fn kill_and_join(
    sc: &Scenario,
    db: &Db,
    url: &str,
    workers: &mut Vec<Proc>,
    flags: Flags,
    (n, sleep_ms): (usize, u64),
) -> (Vec<(i64, i64)>, (i64, i64), Duration) {
    let started = Instant::now();
    db.enqueue(&tasks("b", n, sleep_ms));
    wait_until(db, work_limit(), "a third of the tasks done", || {
        done_of(db, "b") >= (n / 3) as i64
    });
    let killed_node = db.node_id(&workers[0].node_name()).expect("registered");
    let status = workers[0].kill9();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut joined = spawn(sc, url, flags, workers.len() + 1);
    wait_until(
        db,
        Duration::from_secs(60),
        "the new node to register",
        || {
            joined.assert_running("joining");
            db.node_id(&joined.node_name()).is_some()
        },
    );
    let joined_node = db.node_id(&joined.node_name()).expect("registered");
    let killed = workers.remove(0);
    workers.push(joined);
    wait_until_finished(db, work_limit(), || {
        for w in workers.iter_mut() {
            w.assert_running("after the kill");
        }
    });
    drop(killed);
    (
        shares(db, "b"),
        (killed_node, joined_node),
        started.elapsed(),
    )
}

/// Starts three workers with `flags`, drains `first` (the distribution part: `(tasks,
/// sleep_ms)` of `a-*` tasks) and lets `measure` report and check it, then runs the
/// kill-and-join part, checks the invariants and publishes the report.
fn scenario(name: &str, flags: Flags, first: (usize, u64), measure: impl FnOnce(&Db, &mut Report)) {
    let sc = Scenario::start(name, "postgres");
    let (test_db, db) = fault_db(Backend::Postgres);
    let url = test_db.url_text.clone();
    let mut workers: Vec<Proc> = (1..=3).map(|i| spawn(&sc, &url, flags, i)).collect();
    wait_for_fleet(&db, &mut workers);

    let mut report = Report::new();
    let started = Instant::now();
    db.enqueue(&tasks("a", first.0, first.1));
    let mut most_apart = 0;
    let mut most_held = 0;
    wait_until_finished(&db, work_limit(), || {
        for w in &mut workers {
            w.assert_running("while draining");
        }
        // How unevenly the nodes hold tasks, sampled: their running tasks (lock claims mark
        // none running: what they published at their last beat).
        let held = db.numbers(if sc.locks() {
            "SELECT running AS n FROM async_node WHERE state = 'alive'"
        } else {
            "SELECT (SELECT count(*) FROM async_task t WHERE t.owner = n.id AND t.state = 'running') AS n
               FROM async_node n WHERE n.state = 'alive'"
        });
        if let (Some(max), Some(min)) = (held.iter().max(), held.iter().min()) {
            most_apart = most_apart.max(max - min);
            most_held = most_held.max(*max);
        }
    });
    report.add(
        "first backlog",
        format!(
            "{} tasks of {} ms, drained in {}",
            first.0,
            first.1,
            secs(started.elapsed())
        ),
    );
    report.add("shares", shares_text(&db, &shares(&db, "a")));
    report.add(
        if sc.locks() {
            "held (published)"
        } else {
            "held (sampled)"
        },
        format!("at most {most_held} by a node, {most_apart} apart at most"),
    );
    measure(&db, &mut report);

    let second = (3_000, 3);
    let (after, (killed, joined), took) =
        kill_and_join(&sc, &db, &url, &mut workers, flags, second);
    report.add(
        "second backlog",
        format!(
            "{} tasks of {} ms; node {killed} SIGKILLed a third of the way, node {joined} joined; drained in {}",
            second.0,
            second.1,
            secs(took)
        ),
    );
    report.add("shares", shares_text(&db, &after));
    stop_all(&mut workers);
    check_and_publish(&sc, &db, report, true);
    let joined_ran = after.iter().find(|s| s.0 == joined).map_or(0, |s| s.1);
    assert!(
        joined_ran > 0,
        "the node that joined ran nothing: {after:?}"
    );
}

#[test]
fn strategy_id_hash() {
    fn flags(_: usize) -> Vec<(&'static str, String)> {
        vec![
            ("--strategy", "id_hash".into()),
            ("--threads", "4".into()),
            // Longer than the first backlog takes, so that affinity is all it measures.
            ("--strategy-grace", "20s".into()),
        ]
    }
    scenario("strategy_id_hash", flags, (3_000, 1), |db, report| {
        let ring = ring(db);
        assert_eq!(ring.len(), 3, "three id_hash nodes");
        let owned = owned_fraction(db, &ring, "a");
        report.add("run by their id's owner", format!("{:.2}%", owned * 100.0));
        assert!(
            owned >= 0.99,
            "only {owned} of the tasks ran on their id's owner"
        );
        for (node, n) in shares(db, "a") {
            assert!((950..=1050).contains(&n), "node {node} ran {n} of 3000");
        }
    });
}

#[test]
fn strategy_weight() {
    fn flags(i: usize) -> Vec<(&'static str, String)> {
        vec![
            ("--strategy", "weight".into()),
            // Weights 1, 2, 3 for the first three, 2 for the one that joins.
            ("--weight", if i <= 3 { i } else { 2 }.to_string()),
            ("--threads", "4".into()),
            ("--strategy-grace", "20s".into()),
        ]
    }
    scenario("strategy_weight", flags, (3_000, 1), |db, report| {
        let ring = ring(db);
        let total: i64 = ring.iter().map(|n| n.weight).sum();
        assert_eq!(total, 6, "weights 1, 2, 3");
        let owned = owned_fraction(db, &ring, "a");
        report.add("run by their id's owner", format!("{:.2}%", owned * 100.0));
        assert!(
            owned >= 0.99,
            "only {owned} of the tasks ran on their id's owner"
        );
        let shares = shares(db, "a");
        for node in &ring {
            let n = shares.iter().find(|s| s.0 == node.id).map_or(0, |s| s.1);
            let expected = 3_000 * node.weight / total;
            assert!(
                (n - expected).abs() <= 50,
                "node {} of weight {} ran {n}, expected about {expected}",
                node.id,
                node.weight
            );
        }
    });
}

/// `default`, for comparison: first come, first served, whoever wakes first.
#[test]
fn strategy_default() {
    fn flags(_: usize) -> Vec<(&'static str, String)> {
        vec![("--threads", "4".into())]
    }
    scenario("strategy_default", flags, (60, 200), |_, _| {});
}

#[test]
fn strategy_least_count() {
    fn flags(_: usize) -> Vec<(&'static str, String)> {
        vec![
            ("--strategy", "least_count".into()),
            ("--slack", "1".into()),
            ("--threads", "4".into()),
        ]
    }
    // A burst of long tasks, which one node would otherwise take a page of (up to threads +
    // queue + 1 = 37 of them) as soon as it wakes.
    scenario("strategy_least_count", flags, (60, 200), |db, _| {
        let shares = shares(db, "a");
        assert_eq!(shares.len(), 3, "every node ran some: {shares:?}");
        for (node, n) in &shares {
            assert!(*n >= 12, "node {node} ran only {n} of 60: {shares:?}");
        }
    });
}
