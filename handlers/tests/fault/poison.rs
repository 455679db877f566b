//! Poison tasks: handlers that fail, panic, abort the process or hang.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{Integer, Text};
use outbox::{Backend, NewTask};

use crate::db::{fault_db, task, wait_until, Db};
use crate::invariants::check_and_publish;
use crate::report::{secs, Report};
use crate::scenario::{stop_all, tail, Proc, Scenario};

/// `(state, failures, last_error)` of the tasks with `keyword`.
fn task_rows(db: &Db, keyword: &str) -> Vec<(String, i64, String)> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        state: String,
        #[diesel(sql_type = Integer)]
        failures: i32,
        #[diesel(sql_type = Text)]
        last_error: String,
    }
    let sql = format!(
        "SELECT state, failures, COALESCE(last_error, '') AS last_error
         FROM async_task WHERE keyword = '{keyword}' ORDER BY id"
    );
    db.with(&sql, |c| diesel::sql_query(&sql).load::<Row>(c))
        .into_iter()
        .map(|r| (r.state, i64::from(r.failures), r.last_error))
        .collect()
}

fn assert_dead(db: &Db, keyword: &str, failures: i64, error: &str) {
    for (state, f, last_error) in task_rows(db, keyword) {
        assert_eq!(
            (state.as_str(), f),
            ("dead", failures),
            "{keyword}: {last_error}"
        );
        assert!(
            last_error.contains(error),
            "{keyword}: last_error {last_error:?} lacks {error:?}"
        );
    }
}

fn poison_tasks(backend: Backend) {
    let sc = Scenario::start("poison_tasks", backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    let mut report = Report::new();

    // fail and panic: dead after 3 attempts, the worker alive throughout.
    db.enqueue(&[
        task("fault.fail", 1, 0, 3),
        task("fault.fail", 2, 0, 3),
        task("fault.panic", 1, 0, 3),
        task("fault.panic", 2, 0, 3),
    ]);
    let started = Instant::now();
    let mut worker = sc.spawn("worker-fail-panic", &url, &sc.worker_args("run", &[]));
    wait_until(
        &db,
        Duration::from_secs(30),
        "the fail and panic tasks to be dead",
        || {
            worker.assert_running("while running failing and panicking handlers");
            db.in_state("dead") == 4
        },
    );
    let took = started.elapsed();
    worker.assert_running("after the poison tasks died");
    assert_dead(&db, "fault.fail", 3, "fault.fail always fails");
    assert_dead(&db, "fault.panic", 3, "handler panicked");
    stop_all(std::slice::from_mut(&mut worker));
    report.add(
        "fail, panic",
        format!(
            "2 + 2 tasks, max_attempts 3: dead with failures 3 in {}, one worker alive throughout",
            secs(took)
        ),
    );

    // abort: each attempt kills the process; restarted as systemd would, until dead. Every
    // claim style counts each death: rescue charges a stamped claim's tasks, and a lock
    // claim's leases, once the dead node's heartbeat is --dead-after old.
    db.enqueue(&[task("fault.abort", 1, 0, 3)]);
    let started = Instant::now();
    let mut starts = 1;
    let mut worker = Some(sc.spawn("worker-abort-1", &url, &sc.worker_args("run", &[])));
    let mut aborts: Vec<Proc> = Vec::new();
    wait_until(
        &db,
        Duration::from_secs(60),
        "the abort task to be dead",
        || {
            if let Some(status) = worker.as_mut().and_then(Proc::poll) {
                let aborted = worker.take().expect("a worker");
                assert_eq!(
                    status.signal(),
                    Some(libc::SIGABRT),
                    "{} exited with {status}, expected SIGABRT\n{}",
                    aborted.label,
                    tail(&aborted.stderr, 20)
                );
                aborts.push(aborted);
                starts += 1;
                worker = Some(sc.spawn(
                    &format!("worker-abort-{starts}"),
                    &url,
                    &sc.worker_args("run", &[]),
                ));
            }
            task_rows(&db, "fault.abort")[0].0 == "dead"
        },
    );
    let took = started.elapsed();
    assert_eq!(
        aborts.len(),
        3,
        "the abort task should kill one process per attempt"
    );
    assert_dead(&db, "fault.abort", 3, "rescued from node");
    let mut worker = worker.expect("a worker restarted after the last abort");
    stop_all(std::slice::from_mut(&mut worker));
    report.add(
        "abort",
        format!(
            "1 task, max_attempts 3: {} process aborts, {} restarts, dead with failures 3 in {}",
            aborts.len(),
            starts - 1,
            secs(took)
        ),
    );

    report.add("tasks", "4 + 1 poison tasks");
    check_and_publish(&sc, &db, report, false);
}

#[test]
fn poison_tasks_postgres() {
    poison_tasks(Backend::Postgres);
}

#[test]
fn poison_tasks_sqlite() {
    poison_tasks(Backend::Sqlite);
}

#[cfg(feature = "mysql")]
#[test]
fn poison_tasks_mysql() {
    poison_tasks(Backend::Mysql);
}

/// Pending tasks made due now, and the heartbeats of the nodes of processes that have ended
/// made older than any --dead-after: what a cron schedule's next run would find after a
/// while, at once.
fn later(db: &Db) {
    let (due, stale) = match db.backend() {
        Backend::Postgres => (
            "UPDATE async_task SET run_at = now() - interval '1 second' WHERE state = 'pending'",
            "UPDATE async_node SET heartbeat_at = heartbeat_at - interval '1 hour'",
        ),
        Backend::Sqlite => (
            "UPDATE async_task SET run_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 seconds')
              WHERE state = 'pending'",
            "UPDATE async_node SET heartbeat_at = strftime('%Y-%m-%d %H:%M:%f', heartbeat_at, '-1 hours')",
        ),
        Backend::Mysql => (
            "UPDATE async_task SET run_at = UTC_TIMESTAMP(3) - INTERVAL 1 SECOND WHERE state = 'pending'",
            "UPDATE async_node SET heartbeat_at = heartbeat_at - INTERVAL 1 HOUR",
        ),
    };
    db.exec(due);
    db.exec(stale);
}

/// One task that aborts its process, first in claim order, then 39 that write a row, drained
/// by `drain --commit-batch 20` again and again (a cron job): whatever the claim style, each
/// death is counted, the abort task is dead after its max attempts, each of the 39 is done
/// exactly once (charged at most the two deaths that made it a suspect), and the drains stop
/// dying once the task is dead.
fn abort_in_a_chunk(backend: Backend) {
    let sc = Scenario::start("abort_in_a_chunk", backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    let mut tasks = vec![task("fault.abort", 1, 0, 3)];
    tasks.extend((1..=39).map(|n| task("fault.ledger", n, 0, 20)));
    db.enqueue(&tasks);
    let args = sc.worker_args("drain", &[("--commit-batch", "20"), ("--threads", "2")]);
    let started = Instant::now();
    let (mut runs, mut deaths) = (0, 0);
    while db.unfinished() > 0 {
        assert!(
            runs < 60,
            "{runs} drains and still unfinished: {:?}",
            db.states()
        );
        runs += 1;
        let mut drain = sc.spawn(&format!("drain-{runs}"), &url, &args);
        let status = drain
            .wait_for_exit(Duration::from_secs(60))
            .unwrap_or_else(|| panic!("drain {runs} did not exit\n{}", tail(&drain.stderr, 20)));
        match status.signal() {
            Some(libc::SIGABRT) => deaths += 1,
            _ => assert!(
                status.success(),
                "drain {runs} exited with {status}\n{}",
                tail(&drain.stderr, 20)
            ),
        }
        later(&db);
    }
    let took = started.elapsed();
    assert_dead(&db, "fault.abort", 3, "rescued from node");
    assert_eq!(deaths, 3, "one death per attempt, each counted");
    let ledger = task_rows(&db, "fault.ledger");
    assert_eq!(ledger.len(), 39);
    for (state, failures, last_error) in &ledger {
        assert_eq!(state, "done", "{last_error}");
        assert!(*failures <= 2, "charged {failures} failures: {last_error}");
    }
    let charged = ledger.iter().filter(|(_, f, _)| *f > 0).count();
    let mut last = sc.spawn("drain-after", &url, &args);
    last.expect_exit_0(Duration::from_secs(60));
    let mut report = Report::new();
    report.add(
        "tasks",
        "1 fault.abort (max_attempts 3) first, 39 fault.ledger; drain --commit-batch 20 --threads 2",
    );
    report.add(
        "drains",
        format!(
            "{runs} in {}: {deaths} died (SIGABRT), each death counted; the abort task dead with \
             failures 3; the 39 done once each, {charged} of them charged one or two failures \
             (the deaths they shared); the next drain exits 0",
            secs(took)
        ),
    );
    check_and_publish(&sc, &db, report, false);
}

#[test]
fn abort_in_a_chunk_postgres() {
    abort_in_a_chunk(Backend::Postgres);
}

#[test]
fn abort_in_a_chunk_sqlite() {
    abort_in_a_chunk(Backend::Sqlite);
}

#[cfg(feature = "mysql")]
#[test]
fn abort_in_a_chunk_mysql() {
    abort_in_a_chunk(Backend::Mysql);
}

/// `fault.hang`: rescued past its deadline, twice, then dead. A handler cannot be cancelled,
/// so a worker whose handler outlives `--task-timeout` by a heartbeat exits with status 3 (on
/// SQLite the hung transaction holds the only write lock; on PostgreSQL a connection and the
/// claiming thread); each such exit is checked and the worker restarted, as systemd would.
fn poison_hang(backend: Backend) {
    let sc = Scenario::start("poison_hang", backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    db.enqueue(&[task("fault.hang", 1, 0, 2)]);
    let started = Instant::now();
    let args = sc.worker_args("run", &[("--task-timeout", "1s")]);
    let mut spawned = 2;
    let mut workers: Vec<Proc> = (1..=spawned)
        .map(|i| sc.spawn(&format!("worker-hang-{i}"), &url, &args))
        .collect();
    let mut watchdog_exits = 0;
    // Restarts every worker that exited (each must have been the watchdog); returns how many.
    let mut reap = |workers: &mut Vec<Proc>| {
        let mut exits = 0;
        for worker in workers.iter_mut() {
            if let Some(status) = worker.poll() {
                assert_eq!(
                    status.code(),
                    Some(3),
                    "{} exited otherwise than by the hang watchdog ({status})\n{}",
                    worker.label,
                    tail(&worker.stderr, 40)
                );
                assert!(
                    worker.stderr_text().contains("past its task timeout"),
                    "{} exited 3 without saying why\n{}",
                    worker.label,
                    tail(&worker.stderr, 40)
                );
                exits += 1;
                spawned += 1;
                *worker = sc.spawn(&format!("worker-hang-{spawned}"), &url, &args);
            }
        }
        exits
    };
    wait_until(
        &db,
        Duration::from_secs(60),
        "the hang task to be dead",
        || {
            watchdog_exits += reap(&mut workers);
            task_rows(&db, "fault.hang")[0].0 == "dead"
        },
    );
    let took = started.elapsed();
    assert_dead(&db, "fault.hang", 2, "running past its deadline");
    if sc.locks() {
        // Nothing was marked running: the watchdog charged each hang as it ended the chunk.
        assert_dead(
            &db,
            "fault.hang",
            2,
            "the node ended its chunk's transaction",
        );
    }
    // The worker hung in the second attempt exits too; then nothing is left hung.
    wait_until(
        &db,
        Duration::from_secs(30),
        "both hung workers to exit",
        || {
            watchdog_exits += reap(&mut workers);
            watchdog_exits >= 2
        },
    );
    let stop_time = stop_all(&mut workers);
    let mut report = Report::new();
    report.add("tasks", "1 fault.hang, max_attempts 2");
    let charged_by = if sc.locks() {
        "each hang charged by the watchdog as it ended the chunk's transaction"
    } else {
        "via deadline rescue"
    };
    report.add(
        "hang",
        format!(
            "--task-timeout 1s: dead {charged_by} in {}; {watchdog_exits} workers exited 3 \
             (hang watchdog) and were restarted",
            secs(took)
        ),
    );
    report.add("SIGTERM to exit", secs(stop_time));
    check_and_publish(&sc, &db, report, false);
}

#[test]
fn poison_hang_postgres() {
    poison_hang(Backend::Postgres);
}

#[test]
fn poison_hang_sqlite() {
    poison_hang(Backend::Sqlite);
}

#[cfg(feature = "mysql")]
#[test]
fn poison_hang_mysql() {
    poison_hang(Backend::Mysql);
}

/// Lock claims: task A of a leased chunk is cancelled after its handler ran, by a cancel that
/// could not see the lease (on PostgreSQL its snapshot older than the lease claim, on MySQL its
/// read of the leases before the lease committed): `cancelled`, and no note. Task B after it
/// hangs; the hang watchdog charges B, frees the chunk and exits. A's handler ran: its
/// `last_error` must say so, or a `retry` of A runs its effect again with no reason given.
fn a_cancel_that_missed_a_lease_is_noted_by_the_hang_charge(backend: Backend) {
    let sc = Scenario::start("cancel_missed_lease", backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    db.enqueue(&[task("fault.external", 1, 0, 5), task("fault.hang", 2, 0, 2)]);
    let a = db.count("SELECT id FROM async_task WHERE keyword = 'fault.external'");
    let args = sc.worker_args(
        "run",
        &[
            ("--task-timeout", "1s"),
            ("--claim", "lock"),
            ("--commit-batch", "20"),
            ("--threads", "1"),
        ],
    );
    let mut worker = sc.spawn("worker", &url, &args);
    wait_until(&db, Duration::from_secs(30), "A's effect", || {
        std::fs::read_to_string(sc.external_file())
            .unwrap_or_default()
            .lines()
            .any(|line| line.split_whitespace().next() == Some(&a.to_string()))
    });
    // The cancel's own statement, as it reads a task it sees pending: no note.
    db.exec(&format!(
        "UPDATE async_task SET state = 'cancelled' WHERE id = {a} AND state = 'pending'"
    ));
    wait_until(
        &db,
        Duration::from_secs(30),
        "the hang watchdog's exit",
        || worker.poll().is_some(),
    );
    let status = worker.poll().expect("exited");
    assert_eq!(status.code(), Some(3), "{}", tail(&worker.stderr, 40));
    let rows = task_rows(&db, "fault.external");
    assert_eq!(rows[0].0, "cancelled");
    assert_eq!(
        rows[0].2, "cancelled while running: its handler may have run",
        "A's handler ran and its note is missing"
    );
}

#[test]
fn a_cancel_that_missed_a_lease_is_noted_by_the_hang_charge_postgres() {
    a_cancel_that_missed_a_lease_is_noted_by_the_hang_charge(Backend::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn a_cancel_that_missed_a_lease_is_noted_by_the_hang_charge_mysql() {
    a_cancel_that_missed_a_lease_is_noted_by_the_hang_charge(Backend::Mysql);
}

/// Batched mode runs a chunk's handlers one after another: each handler gets
/// `--task-timeout`, and the chunk's tasks a deadline that covers the whole chunk. Five
/// 300 ms handlers in a chunk of five, with a 1 s timeout, are not a hang.
fn batched_handlers_are_timed_one_by_one(backend: Backend) {
    no_hang(
        "batched_handlers_are_timed_one_by_one",
        backend,
        &(1..=5)
            .map(|n| task("fault.ledger", n, 300, 3))
            .collect::<Vec<_>>(),
        &[("--commit-batch", "5")],
        "5 fault.ledger of 300 ms, one chunk of 5, --task-timeout 1s",
    );
}

/// A domain's timeout longer than `--task-timeout` is the timeout of its handlers: a 2.5 s
/// handler in a domain of 10 s, with a 1 s task timeout, is not a hang (the process does not
/// exit), and its task is done at its first attempt.
fn a_domains_longer_timeout_is_not_a_hang(backend: Backend) {
    no_hang(
        "a_domains_longer_timeout_is_not_a_hang",
        backend,
        &[task("fault.ledger", 1, 2500, 3)],
        &[("--domain", "slow:fault.ledger:max=1:timeout=10s")],
        "1 fault.ledger of 2.5 s in a domain of timeout=10s, --task-timeout 1s",
    );
}

/// `tasks` drained by one `drain --task-timeout 1s` with `flags`: it exits 0 (no hang), and
/// every task is done at its first attempt, none rescued.
fn no_hang(name: &str, backend: Backend, tasks: &[NewTask], flags: &[(&str, &str)], what: &str) {
    let sc = Scenario::start(name, backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    db.enqueue(tasks);
    let mut all = vec![
        ("--task-timeout", "1s"),
        ("--heartbeat", "200ms"),
        ("--dead-after", "600ms"),
    ];
    all.extend_from_slice(flags);
    let args = sc.worker_args("drain", &all);
    let mut worker = sc.spawn("drain", &url, &args);
    let took = worker.expect_exit_0(Duration::from_secs(60));
    assert_eq!(
        task_rows(&db, "fault.ledger")
            .iter()
            .map(|(state, failures, _)| (state.as_str(), *failures))
            .collect::<Vec<_>>(),
        vec![("done", 0); tasks.len()],
        "every task done at its first attempt, none rescued"
    );
    let mut report = Report::new();
    report.add("tasks", what);
    report.add("drain", format!("exit 0 in {}", secs(took)));
    check_and_publish(&sc, &db, report, false);
}

#[test]
fn a_domains_longer_timeout_is_not_a_hang_postgres() {
    a_domains_longer_timeout_is_not_a_hang(Backend::Postgres);
}

#[test]
fn a_domains_longer_timeout_is_not_a_hang_sqlite() {
    a_domains_longer_timeout_is_not_a_hang(Backend::Sqlite);
}

#[cfg(feature = "mysql")]
#[test]
fn a_domains_longer_timeout_is_not_a_hang_mysql() {
    a_domains_longer_timeout_is_not_a_hang(Backend::Mysql);
}

#[test]
fn batched_handlers_are_timed_one_by_one_postgres() {
    batched_handlers_are_timed_one_by_one(Backend::Postgres);
}

#[test]
fn batched_handlers_are_timed_one_by_one_sqlite() {
    batched_handlers_are_timed_one_by_one(Backend::Sqlite);
}

#[cfg(feature = "mysql")]
#[test]
fn batched_handlers_are_timed_one_by_one_mysql() {
    batched_handlers_are_timed_one_by_one(Backend::Mysql);
}
