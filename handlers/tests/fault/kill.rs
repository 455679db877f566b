//! SIGKILL during a run.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use outbox::Backend;

use crate::db::{fault_db, ledger_and_external, wait_until_finished, Db};
use crate::invariants::check_and_publish;
use crate::logs::log_lines;
use crate::report::{latency_summary, secs, Report};
use crate::scenario::{stop_all, Proc, Scenario};
use crate::{by_profile, work_limit, POLL, RESCUE_LATENCY_LIMIT};

/// One SIGKILL: the killed node, the tasks running under it right after, and how long until
/// none of them was running under it any more.
struct Kill {
    at: Instant,
    node: Option<i64>,
    tasks: Vec<i64>,
    rescued_after: Option<Duration>,
}

/// Measures the rescue latency of every kill whose tasks are no longer running under the
/// killed node.
fn measure_rescues(db: &Db, kills: &mut [Kill]) {
    for kill in kills.iter_mut() {
        let (Some(node), None) = (kill.node, kill.rescued_after) else {
            continue;
        };
        if kill.tasks.is_empty() {
            continue;
        }
        let ids: Vec<String> = kill.tasks.iter().map(i64::to_string).collect();
        let still = db.count(&format!(
            "SELECT count(*) FROM async_task WHERE owner = {node} AND state = 'running' AND id IN ({})",
            ids.join(",")
        ));
        if still == 0 {
            kill.rescued_after = Some(kill.at.elapsed());
        }
    }
}

#[test]
fn kill_9_during_a_run() {
    let sc = Scenario::start("kill_9_during_a_run", "postgres");
    let (test_db, db) = fault_db(Backend::Postgres);
    let url = test_db.url_text.clone();
    let tasks = by_profile(20_000, 60_000);
    let sleep_ms = 5;
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
        if let Some(node) = node {
            let busy = format!(
                "SELECT count(*) FROM async_task WHERE owner = {node} AND state = 'running'"
            );
            let until = Instant::now() + Duration::from_millis(300);
            let mut measured = Instant::now();
            while db.count(&busy) == 0 && Instant::now() < until {
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
        let running = node
            .map(|n| {
                db.numbers(&format!(
                    "SELECT id AS n FROM async_task WHERE owner = {n} AND state = 'running'"
                ))
            })
            .unwrap_or_default();
        kills.push(Kill {
            at,
            node,
            tasks: running,
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
    // Nothing is running any more: every kill's tasks have been rescued by now.
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
    report.add(
        "tasks in flight at kills",
        format!(
            "{} over {with_tasks} kills",
            kills.iter().map(|k| k.tasks.len()).sum::<usize>()
        ),
    );
    report.add("rescue latency", latency_summary(&latencies));
    report.add(
        "rescue log lines",
        log_lines(
            &killed.iter().chain(&workers).collect::<Vec<_>>(),
            &["rescued from node"],
        ),
    );
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
