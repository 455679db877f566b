//! A worker frozen mid-work (SIGSTOP: a paused VM, a stalled host, a partition that outlasts
//! TCP) holds its tasks no longer than its `--dead-after` and a bounded margin, in every claim
//! style: a live worker's rescue then frees them, charging each a failure (it also ends the
//! frozen worker's sessions, so that what their transactions lock is free), and runs them. When the frozen worker resumes, nothing it writes lands: its late completions
//! are fenced out (a stamped claim's token, a lease gone) or its sessions are gone.
//!
//! Not on SQLite: a process frozen while it holds SQLite's one write lock stops every writer
//! until it resumes, and no other process can end it.

use std::time::{Duration, Instant};

use outbox::Backend;

use crate::db::{fault_db, task, wait_until, Db};
use crate::invariants::check_and_publish;
use crate::report::{secs, Report};
use crate::scenario::{stop_all, tail, Scenario};

/// How long after `--dead-after` a frozen worker's tasks may still wait: a heartbeat for the
/// rescue pass to come round (±10%), the live worker's poll, and the tasks' own run (eight
/// of 300 ms on two threads).
const MARGIN: Duration = Duration::from_secs(5);

/// The tasks the node `node` holds: running under it, or leased by it (lock claims).
fn held(db: &Db, node: i64) -> Vec<i64> {
    let leases = match db.backend() {
        Backend::Postgres | Backend::Mysql => {
            format!(" UNION SELECT task_id AS n FROM async_lease WHERE node_id = {node}")
        }
        _ => String::new(),
    };
    db.numbers(&format!(
        "SELECT id AS n FROM async_task WHERE owner = {node} AND state = 'running'{leases}"
    ))
}

fn frozen_worker(backend: Backend, claim: &'static str) {
    let sc = Scenario::start(&format!("frozen_worker_{claim}"), backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    db.enqueue(
        &(1..=8)
            .map(|n| task("fault.ledger", n, 300, 20))
            .collect::<Vec<_>>(),
    );
    let dead_after = Duration::from_millis(1500);
    let args = sc.worker_args(
        "run",
        &[
            ("--claim", claim),
            ("--commit-batch", "4"),
            ("--threads", "2"),
            ("--dead-after", "1500ms"),
            ("--heartbeat", "500ms"),
        ],
    );
    let mut frozen = sc.spawn("frozen", &url, &args);
    let mut node = None;
    wait_until(
        &db,
        Duration::from_secs(30),
        "the worker to hold tasks",
        || {
            frozen.assert_running("before the freeze");
            node = node.or_else(|| db.node_id(&frozen.node_name()));
            node.is_some_and(|n| !held(&db, n).is_empty())
        },
    );
    let node = node.expect("registered");
    frozen.freeze();
    let held_at_freeze = held(&db, node);
    let mut live = sc.spawn("live", &url, &sc.worker_args("run", &[("--claim", claim)]));
    // Timed from the live worker's registration, not from the freeze: a debug binary
    // starting on a loaded machine is not the rescue's time. The frozen node's last beat came
    // before the freeze, so its --dead-after has run at least that long by then.
    wait_until(
        &db,
        Duration::from_secs(30),
        "the live worker to register",
        || {
            live.assert_running("starting");
            db.node_id(&live.node_name()).is_some()
        },
    );
    let live_at = Instant::now();
    wait_until(
        &db,
        dead_after + MARGIN + Duration::from_secs(20),
        "every task done",
        || {
            live.assert_running("while the other is frozen");
            db.in_state("done") == 8
        },
    );
    let took = live_at.elapsed();
    assert!(
        took <= dead_after + MARGIN,
        "the frozen worker's tasks waited {took:?} after a live worker registered, past \
         --dead-after {dead_after:?} + {MARGIN:?}"
    );
    // On MySQL every connection the frozen worker had taken for its work says its node, and
    // the live worker's rescue ended them (on PostgreSQL only the transactions open at the
    // freeze are, which depends on where it landed).
    if db.backend() == Backend::Mysql {
        assert!(
            live.stderr_text()
                .contains("session(s) of nodes no longer live"),
            "the live worker ended no session of the frozen one\n{}",
            tail(&live.stderr, 20)
        );
    }
    let rescued = db.count(&format!(
        "SELECT count(*) FROM async_task WHERE last_error LIKE 'rescued from node {node}:%'"
    ));
    // Resumed, the frozen worker meets its fenced claims or its ended sessions, and goes on:
    // it beats again (its node's heartbeat moves past where it stopped), or its hang
    // watchdog, which saw its handlers "run" through the freeze, exits with status 3 for the
    // supervisor to start a fresh process.
    let beat = match db.backend() {
        Backend::Mysql => format!(
            "SELECT COALESCE(MAX(CAST(heartbeat_at AS CHAR)), '') AS t FROM async_node WHERE name = '{}'",
            frozen.node_name()
        ),
        _ => format!(
            "SELECT COALESCE(MAX(heartbeat_at::text), '') AS t FROM async_node WHERE name = '{}'",
            frozen.node_name()
        ),
    };
    let stopped_at = db.text(&beat);
    frozen.thaw();
    let mut exited = None;
    wait_until(
        &db,
        Duration::from_secs(10),
        "the resumed worker to beat or exit",
        || {
            exited = frozen.poll();
            exited.is_some() || db.text(&beat) != stopped_at
        },
    );
    let resumed = match exited {
        Some(status) => {
            assert_eq!(
                status.code(),
                Some(3),
                "the resumed worker exited otherwise than by its hang watchdog ({status})\n{}",
                tail(&frozen.stderr, 20)
            );
            "exited 3 (its hang watchdog)".to_owned()
        }
        None => "beat again".to_owned(),
    };
    let mut workers = vec![live];
    if exited.is_none() {
        workers.push(frozen);
    }
    let stop_time = stop_all(&mut workers);
    let mut report = Report::new();
    report.add(
        "tasks",
        format!(
            "8 fault.ledger of 300 ms; --claim {claim} --commit-batch 4 --threads 2 \
             --dead-after 1500ms"
        ),
    );
    report.add(
        "frozen",
        format!(
            "SIGSTOP while it held {} task(s); all 8 done {} after the live worker \
             registered ({rescued} rescued from it); SIGCONT: {resumed}; stopped in {}",
            held_at_freeze.len(),
            secs(took),
            secs(stop_time)
        ),
    );
    check_and_publish(&sc, &db, report, true);
    assert!(rescued > 0, "nothing was rescued from the frozen node");
}

#[test]
fn frozen_worker_postgres_stamp() {
    frozen_worker(Backend::Postgres, "stamp");
}

#[test]
fn frozen_worker_postgres_lock() {
    frozen_worker(Backend::Postgres, "lock");
}

#[cfg(feature = "mysql")]
#[test]
fn frozen_worker_mysql() {
    frozen_worker(Backend::Mysql, "stamp");
}

#[cfg(feature = "mysql")]
#[test]
fn frozen_worker_mysql_lock() {
    frozen_worker(Backend::Mysql, "lock");
}
