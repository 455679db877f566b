//! SIGTERM mid-batch, and SIGTERM while a handler hangs (the shutdown timeout).

use std::time::{Duration, Instant};

use outbox::Backend;

use crate::db::{fault_db, leased_by, sessions, task, wait_until, Db};
use crate::invariants::check_and_publish;
use crate::report::{secs, Report};
use crate::scenario::{Proc, Scenario};
use crate::{work_limit, SHUTDOWN_TIMEOUT};

fn sigterm_mid_batch(backend: Backend) {
    let sc = Scenario::start("sigterm_mid_batch", backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    let tasks = 100;
    db.enqueue(
        &(0..tasks)
            .map(|i| task("fault.ledger", i, 200, 20))
            .collect::<Vec<_>>(),
    );
    if sc.locks() {
        return sigterm_mid_chunk(&sc, &db, &url);
    }
    // Two threads and a queue of 48, so that a claim takes a whole page of 50 (a claim
    // takes no more than threads + queue + 1) of which two start; a deadline well past the
    // scenario, so that no task of the page is rescued while it waits.
    let args = sc.worker_args(
        "run",
        &[
            ("--threads", "2"),
            ("--queue", "48"),
            ("--page", "50"),
            ("--task-timeout", "60s"),
        ],
    );
    let mut worker = sc.spawn("worker", &url, &args);
    wait_until(&db, Duration::from_secs(60), "10 tasks running", || {
        worker.assert_running("before SIGTERM");
        db.in_state("running") >= 10
    });
    let node = db
        .node_id(&worker.node_name())
        .expect("the worker registered its node");
    let running_at_signal = db.in_state("running");
    worker.signal(libc::SIGTERM);
    let exit_time = worker.expect_exit_0(SHUTDOWN_TIMEOUT + Duration::from_secs(1));

    // Right after the exit.
    let running_under_node = db.count(&format!(
        "SELECT count(*) FROM async_task WHERE owner = {node} AND state = 'running'"
    ));
    let running = db.in_state("running");
    let node_state = db.count(&format!(
        "SELECT count(*) FROM async_node WHERE id = {node} AND state = 'gone'"
    ));
    let claimed = db.count("SELECT count(*) FROM async_task WHERE claim_token > 0");
    let done = db.in_state("done");
    let released =
        db.count("SELECT count(*) FROM async_task WHERE state = 'pending' AND claim_token > 0");
    let released_marked = db.count(
        "SELECT count(*) FROM async_task WHERE state = 'pending' AND claim_token > 0
           AND (failures <> 0 OR last_error IS NOT NULL)",
    );
    let failures = db.count("SELECT COALESCE(sum(failures), 0) FROM async_task");
    let ledger_missing = db.count(
        "SELECT count(*) FROM async_task t WHERE t.state = 'done'
           AND NOT EXISTS (SELECT 1 FROM fault_ledger l WHERE l.task_id = t.id)",
    );
    let ledger_rows = db.count("SELECT count(*) FROM fault_ledger");

    drain_the_rest(&sc, &db, &url);

    let mut report = Report::new();
    report.add("tasks", format!("{tasks} fault.ledger, sleep_ms 200"));
    report.add(
        "processes",
        "1 run worker (--threads 2 --queue 48 --page 50), SIGTERM; then 1 drain",
    );
    report.add(
        "at SIGTERM",
        format!("{running_at_signal} running (claimed by the worker)"),
    );
    report.add(
        "SIGTERM to exit 0",
        format!(
            "{} (shutdown timeout {})",
            secs(exit_time),
            secs(SHUTDOWN_TIMEOUT)
        ),
    );
    report.add(
        "right after exit",
        format!(
            "{claimed} claimed: {done} done, {released} released ({released_marked} with a failure or error); \
             {running} running; node gone: {}; ledger rows {ledger_rows}",
            node_state == 1
        ),
    );
    check_and_publish(&sc, &db, report, true);
    assert_eq!(running_under_node, 0, "tasks left running under the node");
    assert_eq!(running, 0, "tasks left running");
    assert_eq!(node_state, 1, "the node is not marked gone");
    assert!(released > 0, "SIGTERM released nothing: not mid-batch");
    assert_eq!(
        released_marked, 0,
        "released tasks must have failures 0 and no error"
    );
    assert_eq!(failures, 0, "a failure was counted");
    assert_eq!(
        claimed,
        done + released,
        "claimed tasks neither done nor released"
    );
    assert_eq!(ledger_missing, 0, "done tasks without their ledger row");
    assert_eq!(ledger_rows, done, "ledger rows for tasks that are not done");
}

/// Then lets a drain finish the rest (without the sleep: on SQLite tasks run one at a time),
/// so that the whole run can be checked.
fn drain_the_rest(sc: &Scenario, db: &Db, url: &str) {
    db.exec(r#"UPDATE async_task SET biz_data = '{"sleep_ms": 0}' WHERE state = 'pending'"#);
    let mut drain = sc.spawn(
        "drain",
        url,
        &sc.worker_args("drain", &[("--threads", "8"), ("--task-timeout", "60s")]),
    );
    drain.expect_exit_0(work_limit());
}

/// [`sigterm_mid_batch`] with lock claims: no chunk waits in a queue (it would hold its
/// locks), so nothing is claimed-but-unstarted; chunks in flight at SIGTERM commit within
/// the shutdown timeout, and a chunk locked but not started rolls back, its tasks untouched.
fn sigterm_mid_chunk(sc: &Scenario, db: &Db, url: &str) {
    let tasks = 100;
    // Two threads run a chunk of 20 each and the claiming thread a third (of 10: the page
    // is 50), 4 s of 200 ms handlers per full chunk.
    let args = sc.worker_args(
        "run",
        &[
            ("--threads", "2"),
            ("--page", "50"),
            ("--task-timeout", "60s"),
        ],
    );
    let mut worker = sc.spawn("worker", url, &args);
    // The whole page locked (no room for another chunk until one ends), and a chunk seen
    // mid-way: its transaction open, its last statement a handler's ledger row.
    wait_until(
        db,
        Duration::from_secs(60),
        "a page locked, a chunk mid-way",
        || {
            worker.assert_running("before SIGTERM");
            leased_by(db, Some(&worker.node_name())).len() >= 50 && chunk_mid_way(db, &worker)
        },
    );
    let node = db
        .node_id(&worker.node_name())
        .expect("the worker registered its node");
    let done_at_signal = db.in_state("done");
    let locked = leased_by(db, Some(&worker.node_name()));
    worker.signal(libc::SIGTERM);
    let exit_time = worker.expect_exit_0(SHUTDOWN_TIMEOUT + Duration::from_secs(1));

    // The server ends the exited process's sessions as it notices their connections close
    // (a few milliseconds, but after the exit): whatever they held is then released.
    let exited = Instant::now();
    wait_until(
        db,
        Duration::from_secs(5),
        "the exited worker's sessions to end",
        || sessions(db, &worker.app) == 0,
    );
    let sessions_ended = exited.elapsed();

    // Right after the exit.
    let ids: Vec<String> = locked.iter().map(i64::to_string).collect();
    let ids = ids.join(",");
    let running = db.in_state("running");
    let node_state = db.count(&format!(
        "SELECT count(*) FROM async_node WHERE id = {node} AND state = 'gone'"
    ));
    let done = db.in_state("done");
    let locked_done = db.count(&format!(
        "SELECT count(*) FROM async_task WHERE state = 'done' AND id IN ({ids})"
    ));
    let pending = db.in_state("pending");
    let pending_touched = db.count(
        "SELECT count(*) FROM async_task WHERE state = 'pending'
           AND (claim_token <> 0 OR failures <> 0 OR last_error IS NOT NULL)",
    );
    let failures = db.count("SELECT COALESCE(sum(failures), 0) FROM async_task");
    let ledger_missing = db.count(
        "SELECT count(*) FROM async_task t WHERE t.state = 'done'
           AND NOT EXISTS (SELECT 1 FROM fault_ledger l WHERE l.task_id = t.id)",
    );
    let ledger_rows = db.count("SELECT count(*) FROM fault_ledger");

    drain_the_rest(sc, db, url);

    let mut report = Report::new();
    report.add("tasks", format!("{tasks} fault.ledger, sleep_ms 200"));
    report.add(
        "processes",
        "1 run worker (--threads 2 --page 50, lock claims), SIGTERM; then 1 drain",
    );
    report.add(
        "at SIGTERM",
        format!(
            "{} locked by the worker, a chunk mid-way; {done_at_signal} done",
            locked.len()
        ),
    );
    report.add(
        "SIGTERM to exit 0",
        format!(
            "{} (shutdown timeout {})",
            secs(exit_time),
            secs(SHUTDOWN_TIMEOUT)
        ),
    );
    report.add("sessions ended after exit", secs(sessions_ended));
    report.add(
        "right after exit",
        format!(
            "{done} done ({locked_done} of those locked at SIGTERM), {pending} pending \
             ({pending_touched} touched); {running} running; node gone: {}; ledger rows \
             {ledger_rows}",
            node_state == 1
        ),
    );
    check_and_publish(sc, db, report, true);
    assert_eq!(running, 0, "tasks left running");
    assert_eq!(node_state, 1, "the node is not marked gone");
    assert!(
        locked_done > 0,
        "no chunk in flight at SIGTERM committed: not mid-chunk, or abandoned"
    );
    assert_eq!(
        done - done_at_signal,
        locked_done,
        "tasks done that were not locked at SIGTERM: a chunk started after it"
    );
    assert_eq!(
        pending_touched, 0,
        "tasks not done must be untouched (no claim token, failures 0, no error)"
    );
    assert_eq!(failures, 0, "a failure was counted");
    assert_eq!(
        done + pending,
        tasks as i64,
        "tasks neither done nor pending"
    );
    assert_eq!(ledger_missing, 0, "done tasks without their ledger row");
    assert_eq!(ledger_rows, done, "ledger rows for tasks that are not done");
}

/// Whether a session of `worker` is in a transaction whose last statement wrote a ledger row:
/// a chunk that has run a handler and has more to run.
fn chunk_mid_way(db: &Db, worker: &Proc) -> bool {
    match db.backend() {
        // A session shows no statement between two, and `information_schema.INNODB_TRX`
        // is a cache InnoDB refreshes only when nobody read it in the last 0.1 s (this loop
        // reads faster, and listed no chunk's transaction): the ledger row of a task still leased by the
        // worker, read uncommitted (the next transaction's level), is a handler's effect in
        // a chunk that has not committed.
        Backend::Mysql => {
            db.count_uncommitted(&format!(
                "SELECT count(*) FROM fault_ledger f
                   JOIN async_lease l ON l.task_id = f.task_id
                   JOIN async_node o ON o.id = l.node_id
                  WHERE o.name = '{}'",
                worker.node_name()
            )) > 0
        }
        _ => {
            db.count(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                   AND application_name = '{}' AND xact_start IS NOT NULL
                   AND query LIKE 'INSERT INTO fault_ledger%'",
                worker.app
            )) > 0
        }
    }
}

#[test]
fn sigterm_mid_batch_postgres() {
    sigterm_mid_batch(Backend::Postgres);
}

#[test]
fn sigterm_mid_batch_sqlite() {
    sigterm_mid_batch(Backend::Sqlite);
}

#[cfg(feature = "mysql")]
#[test]
fn sigterm_mid_batch_mysql() {
    sigterm_mid_batch(Backend::Mysql);
}

// ---------------------------------------------------------------------------------------------
// SIGTERM while a handler hangs: the shutdown timeout
// ---------------------------------------------------------------------------------------------

/// docs/guide/src/failure.md: "running handlers get `--shutdown-timeout`; [...] past the timeout
/// the process exits (status 1) and rescue recovers what was still running". Checked for `drain`
/// and `run`, each holding a hung handler when SIGTERMed. With lock claims the exit ends the hung
/// chunk's transaction and leaves its lease, for rescue, as a stamped claim's task is left running.
#[test]
fn sigterm_past_the_shutdown_timeout() {
    past_the_shutdown_timeout(Backend::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn sigterm_past_the_shutdown_timeout_mysql() {
    past_the_shutdown_timeout(Backend::Mysql);
}

fn past_the_shutdown_timeout(backend: Backend) {
    let sc = Scenario::start("sigterm_past_the_shutdown_timeout", backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    let timeout = Duration::from_secs(2);
    let mut report = Report::new();
    let mut failures = Vec::new();
    for (n, command) in ["drain", "run"].into_iter().enumerate() {
        db.enqueue(&[task("fault.hang", n, 0, 2)]);
        let mut worker = sc.spawn(
            command,
            &url,
            &sc.worker_args(
                command,
                &[("--shutdown-timeout", "2s"), ("--task-timeout", "60s")],
            ),
        );
        let this_task = format!("SELECT id FROM async_task WHERE biz_id = '{n}'");
        wait_until(&db, Duration::from_secs(30), "the hang task to run", || {
            worker.assert_running("before SIGTERM");
            if sc.locks() {
                leased_by(&db, Some(&worker.node_name())).contains(&db.count(&this_task))
            } else {
                db.count(&format!(
                    "SELECT count(*) FROM async_task WHERE biz_id = '{n}' AND state = 'running'"
                )) == 1
            }
        });
        // Once the handler has started (the claim commits just before it): a signal before
        // would release the task unstarted.
        let started = format!("fault.hang: task {} started", db.count(&this_task));
        wait_until(
            &db,
            Duration::from_secs(30),
            "the hang handler to start",
            || {
                worker.assert_running("before SIGTERM");
                worker.stderr_text().contains(&started)
            },
        );
        let node = db.node_id(&worker.node_name()).expect("node registered");
        worker.signal(libc::SIGTERM);
        let started = Instant::now();
        let status = worker.wait_for_exit(timeout + Duration::from_secs(8));
        let took = started.elapsed();
        let gone = db.count(&format!(
            "SELECT count(*) FROM async_node WHERE id = {node} AND state = 'gone'"
        ));
        let outcome = match status {
            Some(status) => format!("exited {status} after {}", secs(took)),
            None => {
                worker.kill9();
                format!("still running {} after SIGTERM; SIGKILLed", secs(took))
            }
        };
        report.add(
            &format!("{command} + hung handler"),
            format!(
                "SIGTERM with --shutdown-timeout 2s: {outcome}; node gone: {}",
                gone == 1
            ),
        );
        if status.and_then(|s| s.code()) != Some(1) || gone != 1 {
            failures.push(format!(
                "`{command}`: {outcome}, node gone: {} (expected: exit status 1 about 2s after SIGTERM, node gone)",
                gone == 1
            ));
        }
        if sc.locks() {
            wait_until(&db, Duration::from_secs(10), "its sessions to end", || {
                sessions(&db, &worker.app) == 0
            });
            // As a stamped claim's task stays running: the hang task stays leased by the node
            // that exited, for rescue (or is rescued from it already).
            let id = db.count(&this_task);
            let left = db.text(&format!(
                "SELECT concat_ws(' ', state, failures, last_error) FROM async_task WHERE id = {id}"
            ));
            report.add(&format!("{command}: after exit"), &left);
            let rescued = db.count(&format!(
                "SELECT count(*) FROM async_task WHERE id = {id} AND failures = 1
                   AND last_error LIKE 'rescued from node {node}:%'"
            ));
            if !leased_by(&db, Some(&worker.node_name())).contains(&id) && rescued == 0 {
                failures.push(format!(
                    "`{command}`: after the exit the hang task is {left:?} (expected: leased by \
                     node {node}, or rescued from it)"
                ));
            }
        }
    }
    sc.publish(&report);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
