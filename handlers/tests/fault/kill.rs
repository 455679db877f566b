//! SIGKILL during a run.
//!
//! A killed worker's tasks are rescued by the live ones, each charged a failure: with
//! stamped claims its running tasks, with lock claims its leased ones (and the suspects it
//! ran alone, stamped), once its heartbeat is `--dead-after` old.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use outbox::Backend;

use crate::db::{fault_db, ledger_and_external, wait_until_finished, Db};
use crate::invariants::check_and_publish;
use crate::logs::log_lines;
use crate::report::{latency_summary, secs, Report};
use crate::scenario::{stop_all, Proc, Scenario};
use crate::{by_profile, work_limit, POLL, RESCUE_LATENCY_LIMIT};

/// One SIGKILL: the killed node, the tasks it held right after (running under it, or
/// leased by it), and how long until it held none of them (rescued).
struct Kill {
    at: Instant,
    node: Option<i64>,
    tasks: Vec<i64>,
    rescued_after: Option<Duration>,
}

/// The tasks `worker`'s node holds now: running under it (stamped claims, and a lock
/// claim's suspects and reruns) or leased by it (lock claims).
fn held(db: &Db, node: Option<i64>) -> Vec<i64> {
    node.map(|n| {
        let leases = match db.backend() {
            Backend::Postgres | Backend::Mysql => {
                format!(" UNION SELECT task_id AS n FROM async_lease WHERE node_id = {n}")
            }
            Backend::Sqlite => String::new(),
        };
        db.numbers(&format!(
            "SELECT id AS n FROM async_task WHERE owner = {n} AND state = 'running'{leases}"
        ))
    })
    .unwrap_or_default()
}

/// Measures how long after each kill its tasks stopped being held by the killed node:
/// rescued, each charged a failure (lock claims: their leases too).
fn measure_rescues(db: &Db, kills: &mut [Kill]) {
    for kill in kills.iter_mut() {
        if kill.rescued_after.is_some() || kill.tasks.is_empty() {
            continue;
        }
        let Some(node) = kill.node else { continue };
        if held(db, Some(node))
            .iter()
            .all(|id| !kill.tasks.contains(id))
        {
            kill.rescued_after = Some(kill.at.elapsed());
        }
    }
}

#[test]
fn kill_9_during_a_run() {
    kill_9(Backend::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn kill_9_during_a_run_mysql() {
    kill_9(Backend::Mysql);
}

/// Three `run` workers, one killed (SIGKILL) every 200–400 ms while it has tasks, and
/// replaced.
fn kill_9(backend: Backend) {
    let sc = Scenario::start("kill_9_during_a_run", backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    let tasks = by_profile(20_000, 60_000);
    // Lock claims run faster (one write per task): longer handlers keep work left for the
    // last kill.
    let sleep_ms = if sc.locks() { 10 } else { 5 };
    let target_kills = by_profile(20, 50);
    db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    let args = sc.worker_args("run", &[]);
    let mut spawned = 0;
    let mut spawn = |sc: &Scenario| {
        spawned += 1;
        sc.spawn(&format!("worker{spawned}"), &url, &args)
    };
    let mut workers: Vec<Proc> = (0..3).map(|_| spawn(&sc)).collect();
    let mut killed: Vec<Proc> = Vec::new();
    let mut kills: Vec<Kill> = Vec::new();
    while kills.len() < target_kills {
        // Wait 200–400 ms, measuring rescues meanwhile.
        let until = Instant::now() + Duration::from_millis(fastrand::u64(200..=400));
        while Instant::now() < until {
            measure_rescues(&db, &mut kills);
            std::thread::sleep(POLL);
        }
        for worker in &mut workers {
            worker.assert_running("between kills");
        }
        let unfinished = db.unfinished();
        assert!(
            unfinished > 0,
            "the tasks ran out after {} of {target_kills} kills: raise the task count or sleep_ms",
            kills.len()
        );
        // A random worker, killed at a moment it has tasks running (waiting up to 300 ms
        // for one), so that kills land mid-work however the worker paces its claims.
        let slot = fastrand::usize(..workers.len());
        let node = db.node_id(&workers[slot].node_name());
        if node.is_some() {
            let until = Instant::now() + Duration::from_millis(300);
            let mut measured = Instant::now();
            while held(&db, node).is_empty() && Instant::now() < until {
                if measured.elapsed() >= POLL {
                    measure_rescues(&db, &mut kills);
                    measured = Instant::now();
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let status = workers[slot].kill9();
        let at = Instant::now();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
        let victim = std::mem::replace(&mut workers[slot], spawn(&sc));
        // Still held by the dead node until rescued: running, or leased.
        let tasks = held(&db, node);
        kills.push(Kill {
            at,
            node,
            tasks,
            rescued_after: None,
        });
        killed.push(victim);
    }

    let tail_time = wait_until_finished(&db, work_limit(), || {
        measure_rescues(&db, &mut kills);
        for worker in &mut workers {
            worker.assert_running("while finishing");
        }
    });
    // Nothing is running any more: every kill's tasks have been rescued by now (with lock
    // claims: every killed process's sessions have ended).
    measure_rescues(&db, &mut kills);
    let stop_time = stop_all(&mut workers);

    let latencies: Vec<Duration> = kills.iter().filter_map(|k| k.rescued_after).collect();
    let with_tasks = kills.iter().filter(|k| !k.tasks.is_empty()).count();
    let unregistered = kills.iter().filter(|k| k.node.is_none()).count();
    let mut report = Report::new();
    report.add(
        "tasks",
        format!("{tasks} (3/4 fault.ledger, 1/4 fault.external, sleep_ms {sleep_ms})"),
    );
    report.add(
        "processes",
        format!(
            "3 run workers, {} SIGKILLs, {} restarts ({} killed before registering)",
            kills.len(),
            kills.len(),
            unregistered
        ),
    );
    let in_flight = kills.iter().map(|k| k.tasks.len()).sum::<usize>();
    let rescue_lines = log_lines(
        &killed.iter().chain(&workers).collect::<Vec<_>>(),
        &["rescued from node"],
    );
    report.add(
        "tasks in flight at kills",
        format!(
            "{in_flight} over {with_tasks} kills ({})",
            if sc.locks() {
                "leased, and suspects running alone"
            } else {
                "running"
            }
        ),
    );
    report.add("rescue latency", latency_summary(&latencies));
    report.add("rescue log lines", rescue_lines);
    report.add("finish after last kill", secs(tail_time));
    report.add("SIGTERM to exit", secs(stop_time));
    let slow: Vec<String> = latencies
        .iter()
        .filter(|l| **l > RESCUE_LATENCY_LIMIT)
        .map(|l| secs(*l))
        .collect();
    check_and_publish(&sc, &db, report, true);
    assert!(
        with_tasks * 2 >= kills.len(),
        "only {with_tasks} of {} kills landed while the victim had tasks running",
        kills.len()
    );
    assert_eq!(
        latencies.len(),
        with_tasks,
        "not every kill's tasks were rescued"
    );
    assert!(
        slow.is_empty(),
        "rescues slower than {RESCUE_LATENCY_LIMIT:?}: {slow:?}"
    );
}
