//! Connections terminated in a loop.

use std::time::Duration;

use outbox::Backend;

use crate::db::{
    clock_ms, done_since, fault_db, ledger_and_external, terminate_other_sessions,
    wait_until_finished,
};
use crate::invariants::check_and_publish;
use crate::logs::{log_lines, summaries, OUTAGE_LOG, RELEASE_LOG};
use crate::report::{secs, Report};
use crate::scenario::{stop_all, Proc, Scenario};
use crate::{by_profile, work_limit, LEFT_AFTER_LAST_FAULT};

#[test]
fn connections_terminated_in_a_loop() {
    connections_terminated(Backend::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn connections_terminated_in_a_loop_mysql() {
    connections_terminated(Backend::Mysql);
}

/// Every session of the workers ended by the server every 200 ms, `target` times.
fn connections_terminated(backend: Backend) {
    let sc = Scenario::start("connections_terminated_in_a_loop", backend.name());
    let (test_db, db) = fault_db(backend);
    let tasks = 5_000;
    let sleep_ms = by_profile(15, 30);
    let target = by_profile(10, 30);
    db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    let args = sc.worker_args("run", &[]);
    let mut workers: Vec<Proc> = (1..=3)
        .map(|i| sc.spawn(&format!("worker{i}"), &test_db.url_text, &args))
        .collect();
    let mut terminations = 0;
    let mut backends = 0;
    while terminations < target {
        std::thread::sleep(Duration::from_millis(200));
        for worker in &mut workers {
            worker.assert_running("between terminations");
        }
        assert!(
            db.unfinished() > 0,
            "the tasks ran out after {terminations} of {target} terminations: raise sleep_ms"
        );
        // `db`'s own connection is the terminator's: it is spared.
        backends += terminate_other_sessions(&db);
        terminations += 1;
    }
    let last_fault = clock_ms(&db);
    let left = db.unfinished();
    assert!(
        left >= LEFT_AFTER_LAST_FAULT,
        "only {left} tasks left after the last termination: raise sleep_ms"
    );
    let tail_time = wait_until_finished(&db, work_limit(), || {
        for worker in &mut workers {
            worker.assert_running("while finishing");
        }
    });
    let resumed = done_since(&db, &workers, last_fault);
    let all: Vec<&Proc> = workers.iter().collect();
    let panics = log_lines(&all, &["panicked"]);
    let outages = log_lines(&all, OUTAGE_LOG);
    let released = log_lines(&all, RELEASE_LOG);
    let stop_time = stop_all(&mut workers);

    let mut report = Report::new();
    report.add(
        "tasks",
        format!("{tasks} (3/4 fault.ledger, 1/4 fault.external, sleep_ms {sleep_ms})"),
    );
    report.add(
        "processes",
        "3 run workers, 0 restarts (all alive to the end)",
    );
    report.add(
        "terminations",
        format!("{terminations} rounds, {backends} backends terminated"),
    );
    report.add(
        "worker log lines",
        format!("{outages} claim outages, {released} tasks released by a database error, {panics} 'panicked'"),
    );
    report.add(
        "after the last round",
        format!("{left} tasks left; done per worker since: {resumed:?}"),
    );
    report.add("finish after last round", secs(tail_time));
    report.add("SIGTERM to exit", secs(stop_time));
    report.add("worker summaries", summaries(&workers));
    check_and_publish(&sc, &db, report, true);
    assert_eq!(panics, 0, "a worker panicked (see its stderr)");
    assert!(backends > 0, "no backend was ever terminated");
    assert!(
        resumed.iter().all(|&n| n > 0),
        "a worker did no task after the last termination round (done per worker: {resumed:?})"
    );
}
