//! The fault suite: real `outbox-fault` worker processes against a real PostgreSQL (and SQLite
//! where the fault applies), while the test kills them, terminates their connections,
//! restarts the server, stops them mid-batch, feeds them poison tasks, overlaps drains and
//! races migrations. After each scenario the invariants of DESIGN.md are checked:
//!
//! - every task is done or dead (none pending, none running: nothing is lost);
//! - exactly one `fault_ledger` row per done `fault.ledger` task, none for any other task
//!   (effects in the database happen exactly once);
//! - every done `fault.external` task is in the external file at least once, and a task that
//!   is there more than once carries a `last_error` (it was rescued, released after a
//!   database error, or failed: at least once, never silently twice);
//! - `failures <= COALESCE(max_attempts, 20)`.
//!
//! Scenarios (PostgreSQL unless a name ends in `_sqlite`): `kill_9_during_a_run`,
//! `connections_terminated_in_a_loop`, `postgres_restarted_mid_run_{fast,immediate}` (on a
//! cluster of their own), `sigterm_mid_batch_*`, `poison_tasks_*` (fail, panic, abort),
//! `poison_hang_*`, `sigterm_past_the_shutdown_timeout`, `overlapping_drains`,
//! `concurrent_migrations_*`.
//!
//! Scenarios run one at a time (they are heavy). `OUTBOX_FAULT_PROFILE=long` runs the long
//! profile (more kills, terminations, restarts, drains, repetitions); unset or `short` is the
//! default. Each scenario appends a block of figures to `$CARGO_TARGET_TMPDIR/fault-report.txt`
//! (truncated by the first scenario of a run) and prints it. Each process's stderr (with
//! `RUST_LOG=info`) goes to a file in the scenario's temporary directory; on failure the
//! tails are printed and the directory is kept.

#[path = "../../../tests/suite/support.rs"]
mod support;

// Support: the report, scenarios and their processes, the test's view of the database, the
// invariants, what the processes logged, a PostgreSQL cluster of a scenario's own.
mod cluster;
mod db;
mod invariants;
mod logs;
mod report;
mod scenario;

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use outbox::{Backend, DatabaseUrl};

use cluster::Cluster;
use db::{
    done_since, fault_db, ledger_and_external, pg_clock_ms, task, wait_until, wait_until_finished,
    Db,
};
use invariants::{check_and_publish, check_and_publish_after_crash};
use logs::{log_lines, lost_claim_tasks, summaries, OUTAGE_LOG, RELEASE_LOG};
use report::{latency_summary, secs, Report};
use scenario::{stop_all, tail, worker_args, Proc, Scenario};

// ---------------------------------------------------------------------------------------------
// Profiles and limits
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Profile {
    Short,
    Long,
}

fn profile() -> Profile {
    match std::env::var("OUTBOX_FAULT_PROFILE").as_deref() {
        Ok("long") => Profile::Long,
        Ok("short") | Ok("") | Err(_) => Profile::Short,
        Ok(other) => panic!("OUTBOX_FAULT_PROFILE must be `short` or `long`, not {other:?}"),
    }
}

/// The short profile's value or the long profile's.
fn by_profile<T>(short: T, long: T) -> T {
    match profile() {
        Profile::Short => short,
        Profile::Long => long,
    }
}

/// How often a bounded wait re-checks its condition.
const POLL: Duration = Duration::from_millis(50);
/// How long the workers may take to finish every task of a scenario (generous: debug build,
/// two cores, faults that slow everything down).
fn work_limit() -> Duration {
    by_profile(Duration::from_secs(180), Duration::from_secs(600))
}
/// The workers' `--shutdown-timeout`.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a worker may take to exit after SIGTERM: its shutdown timeout and a margin.
const STOP_LIMIT: Duration = Duration::from_secs(30);
/// How long a one-shot command (`migrate`, `pg.sh`) may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(120);
/// How long the test's own queries keep retrying while the database is unreachable
/// (terminated connections, a restarting server).
const DB_RETRY_LIMIT: Duration = Duration::from_secs(90);
/// The longest acceptable rescue latency after a SIGKILL: dead-after (1.5 s) plus a
/// heartbeat (0.5 s), with a wide margin for a loaded two-core machine.
const RESCUE_LATENCY_LIMIT: Duration = Duration::from_secs(15);
/// How long the workers may go without finishing a single task while work is left: far
/// longer than any backoff or rescue delay in these scenarios.
const STALL_LIMIT: Duration = Duration::from_secs(45);
/// The worker's default `--max-attempts`, which the invariant uses for tasks without one.
const DEFAULT_MAX_ATTEMPTS: i64 = 20;

/// Tasks that must still be left when the last fault hits, so that every worker has work
/// to resume afterwards.
const LEFT_AFTER_LAST_FAULT: i64 = 500;

// ---------------------------------------------------------------------------------------------
// 1. SIGKILL during a run
// ---------------------------------------------------------------------------------------------

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

    let args = worker_args("run", &[]);
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

// ---------------------------------------------------------------------------------------------
// 2. Connections terminated in a loop
// ---------------------------------------------------------------------------------------------

#[test]
fn connections_terminated_in_a_loop() {
    let sc = Scenario::start("connections_terminated_in_a_loop", "postgres");
    let (test_db, db) = fault_db(Backend::Postgres);
    let tasks = 5_000;
    let sleep_ms = by_profile(15, 30);
    let target = by_profile(10, 30);
    db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    let args = worker_args("run", &[]);
    let mut workers: Vec<Proc> = (1..=3)
        .map(|i| sc.spawn(&format!("worker{i}"), &test_db.url_text, &args))
        .collect();
    // `db`'s own connection is the terminator's: the statement spares it.
    let terminate =
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()) t WHERE ok";
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
        backends += db.count(terminate);
        terminations += 1;
    }
    let last_fault = pg_clock_ms(&db);
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

// ---------------------------------------------------------------------------------------------
// 3. PostgreSQL restarted mid-run
// ---------------------------------------------------------------------------------------------

fn postgres_restarted_mid_run(how: &'static str) {
    let sc = Scenario::start(&format!("postgres_restarted_mid_run_{how}"), "postgres");
    let cluster = Cluster::start(&sc);
    let url = cluster.create_database("fault_restart");
    sc.spawn("migrate", &url, &["migrate".to_owned()])
        .expect_exit_0(COMMAND_LIMIT);
    let db = Db::new(&url);
    db.create_fault_ledger();
    let tasks = 5_000;
    let sleep_ms = by_profile(10, 20);
    let restarts = by_profile(1, 2);
    db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    let args = worker_args("run", &[]);
    let mut workers: Vec<Proc> = (1..=2)
        .map(|i| sc.spawn(&format!("worker{i}"), &url, &args))
        .collect();
    let mut downtime = Vec::new();
    let mut unfinished_at_restart = Vec::new();
    for r in 0..restarts {
        // Restart once a share of the work is done, while the rest is still to do.
        let threshold = tasks as i64 * (r + 1) / (restarts + 2);
        wait_until(
            &db,
            work_limit(),
            &format!("{threshold} tasks done"),
            || db.in_state("done") >= threshold,
        );
        let unfinished = db.unfinished();
        assert!(
            unfinished > 0,
            "the tasks ran out before restart {}: raise sleep_ms",
            r + 1
        );
        unfinished_at_restart.push(unfinished);
        let started = Instant::now();
        cluster.pg_sh(&sc, &["restart", how]);
        downtime.push(started.elapsed());
        for worker in &mut workers {
            worker.assert_running("after the restart");
        }
    }
    let last_fault = pg_clock_ms(&db);
    let left = db.unfinished();
    assert!(
        left >= LEFT_AFTER_LAST_FAULT,
        "only {left} tasks left after the last restart: raise sleep_ms"
    );
    let tail_time = wait_until_finished(&db, work_limit(), || {
        for worker in &mut workers {
            worker.assert_running("while finishing");
        }
    });
    let resumed = done_since(&db, &workers, last_fault);
    let all: Vec<&Proc> = workers.iter().collect();
    let outages = log_lines(&all, OUTAGE_LOG);
    let recovered = log_lines(&all, &["database reachable again"]);
    let released = log_lines(&all, RELEASE_LOG);
    let panics = log_lines(&all, &["panicked"]);
    let stop_time = stop_all(&mut workers);
    // An immediate shutdown is a crash: claims whose WAL was not flushed yet are lost.
    let lost_claims = match how {
        "immediate" => lost_claim_tasks(&workers.iter().collect::<Vec<_>>()),
        _ => HashSet::new(),
    };

    let mut report = Report::new();
    report.add(
        "tasks",
        format!("{tasks} (3/4 fault.ledger, 1/4 fault.external, sleep_ms {sleep_ms})"),
    );
    report.add(
        "processes",
        "2 run workers, 0 restarts (all alive to the end)",
    );
    report.add(
        "server restarts",
        format!(
            "{restarts} × pg.sh restart {how} (took {}), unfinished tasks at each: {unfinished_at_restart:?}",
            downtime.iter().map(|d| secs(*d)).collect::<Vec<_>>().join(", ")
        ),
    );
    report.add(
        "worker log lines",
        format!("{outages} claim outages, {recovered} 'database reachable again', {released} tasks released by a database error, {panics} 'panicked'"),
    );
    report.add(
        "after the last restart",
        format!("{left} tasks left; done per worker since: {resumed:?}"),
    );
    report.add("finish after last restart", secs(tail_time));
    report.add("SIGTERM to exit", secs(stop_time));
    report.add("worker summaries", summaries(&workers));
    report.add("tasks of claims lost", lost_claims.len());
    let figures = check_and_publish_after_crash(&sc, &db, report, true, &lost_claims);
    assert_eq!(panics, 0, "a worker panicked (see its stderr)");
    assert!(
        resumed.iter().all(|&n| n > 0),
        "a worker did no task after the last restart (done per worker: {resumed:?})"
    );
    // README: "PostgreSQL restarts: [...] no task is charged a failure for it".
    assert!(
        figures.charged.is_empty(),
        "tasks charged a failure by the restart: {:?}",
        figures.charged
    );
    drop(db);
    drop(cluster);
}

#[test]
fn postgres_restarted_mid_run_fast() {
    postgres_restarted_mid_run("fast");
}

#[test]
fn postgres_restarted_mid_run_immediate() {
    postgres_restarted_mid_run("immediate");
}

// ---------------------------------------------------------------------------------------------
// 4. SIGTERM mid-batch
// ---------------------------------------------------------------------------------------------

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
    // Two threads and a queue of 48, so that a claim takes a whole page of 50 (a claim
    // takes no more than threads + queue + 1) of which two start; a deadline well past the
    // scenario, so that no task of the page is rescued while it waits.
    let args = worker_args(
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

    // Then let a drain finish the rest (without the sleep: on SQLite tasks run one at a
    // time), and check the whole run.
    db.exec(r#"UPDATE async_task SET biz_data = '{"sleep_ms": 0}' WHERE state = 'pending'"#);
    let mut drain = sc.spawn(
        "drain",
        &url,
        &worker_args("drain", &[("--threads", "8"), ("--task-timeout", "60s")]),
    );
    drain.expect_exit_0(work_limit());

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

#[test]
fn sigterm_mid_batch_postgres() {
    sigterm_mid_batch(Backend::Postgres);
}

#[test]
fn sigterm_mid_batch_sqlite() {
    sigterm_mid_batch(Backend::Sqlite);
}

// ---------------------------------------------------------------------------------------------
// 5. Poison tasks
// ---------------------------------------------------------------------------------------------

/// `(state, failures, last_error)` of the tasks with `keyword`.
fn task_rows(db: &Db, keyword: &str) -> Vec<(String, i64, String)> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        state: String,
        #[diesel(sql_type = BigInt)]
        failures: i64,
        #[diesel(sql_type = Text)]
        last_error: String,
    }
    let sql = format!(
        "SELECT state, CAST(failures AS BIGINT) AS failures, COALESCE(last_error, '') AS last_error
         FROM async_task WHERE keyword = '{keyword}' ORDER BY id"
    );
    db.with(&sql, |c| diesel::sql_query(&sql).load::<Row>(c))
        .into_iter()
        .map(|r| (r.state, r.failures, r.last_error))
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
    let mut worker = sc.spawn("worker-fail-panic", &url, &worker_args("run", &[]));
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

    // abort: each attempt kills the process; restarted as systemd would, until dead.
    db.enqueue(&[task("fault.abort", 1, 0, 3)]);
    let started = Instant::now();
    let mut starts = 1;
    let mut worker = sc.spawn("worker-abort-1", &url, &worker_args("run", &[]));
    let mut aborts: Vec<Proc> = Vec::new();
    wait_until(
        &db,
        Duration::from_secs(60),
        "the abort task to be dead",
        || {
            if let Some(status) = worker.poll() {
                assert_eq!(
                    status.signal(),
                    Some(libc::SIGABRT),
                    "{} exited with {status}, expected SIGABRT\n{}",
                    worker.label,
                    tail(&worker.stderr, 20)
                );
                starts += 1;
                let next = sc.spawn(
                    &format!("worker-abort-{starts}"),
                    &url,
                    &worker_args("run", &[]),
                );
                aborts.push(std::mem::replace(&mut worker, next));
            }
            task_rows(&db, "fault.abort")[0].0 == "dead"
        },
    );
    let took = started.elapsed();
    assert_dead(&db, "fault.abort", 3, "rescued from node");
    assert_eq!(
        aborts.len(),
        3,
        "the abort task should kill one process per attempt"
    );
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
    let args = worker_args("run", &[("--task-timeout", "1s")]);
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
    report.add(
        "hang",
        format!(
            "--task-timeout 1s: dead via deadline rescue in {}; {watchdog_exits} workers exited 3 \
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

// ---------------------------------------------------------------------------------------------
// 5b. SIGTERM while a handler hangs: the shutdown timeout
// ---------------------------------------------------------------------------------------------

/// README: "running handlers get `--shutdown-timeout`; [...] past the timeout the process
/// exits (status 1) and rescue recovers what was still running". Checked for `drain` and
/// `run`, each holding a hung handler when SIGTERMed.
#[test]
fn sigterm_past_the_shutdown_timeout() {
    let sc = Scenario::start("sigterm_past_the_shutdown_timeout", "postgres");
    let (test_db, db) = fault_db(Backend::Postgres);
    let url = test_db.url_text.clone();
    let timeout = Duration::from_secs(2);
    let mut report = Report::new();
    let mut failures = Vec::new();
    for (n, command) in ["drain", "run"].into_iter().enumerate() {
        db.enqueue(&[task("fault.hang", n, 0, 2)]);
        let mut worker = sc.spawn(
            command,
            &url,
            &worker_args(
                command,
                &[("--shutdown-timeout", "2s"), ("--task-timeout", "60s")],
            ),
        );
        wait_until(&db, Duration::from_secs(30), "the hang task to run", || {
            worker.assert_running("before SIGTERM");
            db.count(&format!(
                "SELECT count(*) FROM async_task WHERE biz_id = '{n}' AND state = 'running'"
            )) == 1
        });
        // Let the handler start (the claim commits just before it).
        std::thread::sleep(Duration::from_millis(300));
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
    }
    sc.publish(&report);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// 6. Overlapping drains
// ---------------------------------------------------------------------------------------------

#[test]
fn overlapping_drains() {
    let sc = Scenario::start("overlapping_drains", "postgres");
    let (test_db, db) = fault_db(Backend::Postgres);
    let tasks = by_profile(5_000, 20_000);
    let sleep_ms = by_profile(10, 30);
    let target = by_profile(5, 15);
    db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    let args = worker_args("drain", &[]);
    let mut drains: Vec<Proc> = Vec::new();
    let mut overlaps = Vec::new();
    loop {
        if !drains.is_empty() {
            let running = drains
                .iter_mut()
                .filter_map(|d| d.is_running().then_some(()))
                .count();
            let unfinished = db.unfinished();
            assert!(
                running > 0 && unfinished > 0,
                "drain {} would not overlap ({running} drains running, {unfinished} tasks left): raise tasks or sleep_ms",
                drains.len() + 1
            );
            overlaps.push(running);
        }
        drains.push(sc.spawn(
            &format!("drain{}", drains.len() + 1),
            &test_db.url_text,
            &args,
        ));
        if drains.len() == target {
            break;
        }
        std::thread::sleep(Duration::from_millis(1000));
        for drain in &mut drains {
            if let Some(status) = drain.poll() {
                assert_eq!(
                    status.code(),
                    Some(0),
                    "{} failed: {status}\n{}",
                    drain.label,
                    tail(&drain.stderr, 30)
                );
            }
        }
    }
    let started = Instant::now();
    for drain in &mut drains {
        drain.expect_exit_0(work_limit());
    }
    let last_exit = started.elapsed();
    // Every drain works until nothing is due: once all have exited, nothing is left.
    let left = db.unfinished();
    let summaries: Vec<String> = drains
        .iter()
        .map(|d| d.stdout_text().lines().next().unwrap_or("").to_owned())
        .collect();

    let mut report = Report::new();
    report.add(
        "tasks",
        format!("{tasks} (3/4 fault.ledger, 1/4 fault.external, sleep_ms {sleep_ms})"),
    );
    report.add(
        "processes",
        format!("{target} drains started ~1 s apart, all exit 0; drains already running at each start: {overlaps:?}"),
    );
    report.add("last exit after last start", secs(last_exit));
    report.add("unfinished after all exited", left);
    for (i, summary) in summaries.iter().enumerate() {
        report.add(&format!("drain{}", i + 1), summary);
    }
    check_and_publish(&sc, &db, report, true);
    assert_eq!(left, 0, "tasks left after every drain exited");
}

// ---------------------------------------------------------------------------------------------
// 7. Concurrent migrations
// ---------------------------------------------------------------------------------------------

/// Migration directories of a backend's tree.
fn migration_count(backend: Backend) -> i64 {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../migrations")
        .join(backend.name());
    let count = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_dir()))
        .count();
    assert!(count > 0, "no migrations in {}", dir.display());
    i64::try_from(count).expect("count")
}

/// A new empty PostgreSQL database on the test server, dropped when this is dropped.
struct EmptyPgDatabase {
    name: String,
    url: String,
}

impl EmptyPgDatabase {
    fn create(n: usize) -> EmptyPgDatabase {
        let server = support::pg_server_url();
        let name = format!("outbox_fault_migrate_{}_{n}", std::process::id());
        let admin = Db::new(server);
        admin.exec(&format!("DROP DATABASE IF EXISTS {name}"));
        admin.exec(&format!("CREATE DATABASE {name}"));
        let base = &server[..server.rfind('/').expect("URL path")];
        EmptyPgDatabase {
            url: format!("{base}/{name}"),
            name,
        }
    }
}

impl Drop for EmptyPgDatabase {
    fn drop(&mut self) {
        if let Ok(mut admin) = DatabaseUrl::parse(support::pg_server_url())
            .expect("url")
            .connect()
        {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

fn concurrent_migrations(backend: Backend) {
    let sc = Scenario::start("concurrent_migrations", backend.name());
    let repetitions = by_profile(3, 10);
    let expected = migration_count(backend);
    let mut took = Vec::new();
    for rep in 0..repetitions {
        let pg = (backend == Backend::Postgres).then(|| EmptyPgDatabase::create(rep));
        let url = match &pg {
            Some(pg) => pg.url.clone(),
            None => sc
                .path(&format!("migrate-{rep}.db"))
                .to_str()
                .expect("utf-8 path")
                .to_owned(),
        };
        let started = Instant::now();
        let mut procs: Vec<Proc> = (1..=5)
            .map(|i| sc.spawn(&format!("migrate{rep}-{i}"), &url, &["migrate".to_owned()]))
            .collect();
        for p in &mut procs {
            p.expect_exit_0(COMMAND_LIMIT);
        }
        took.push(started.elapsed());
        let applied = procs
            .iter()
            .filter(|p| p.stdout_text().contains("applied"))
            .count();
        let up_to_date = procs
            .iter()
            .filter(|p| p.stdout_text().contains("schema up to date"))
            .count();
        let db = Db::new(&url);
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 0);
        assert_eq!(
            db.count("SELECT count(*) FROM __diesel_schema_migrations"),
            expected,
            "repetition {rep}: schema migration rows"
        );
        assert_eq!(
            (applied, up_to_date),
            (1, 4),
            "repetition {rep}: exactly one process applies, the others find the schema up to date: {:?}",
            procs.iter().map(Proc::stdout_text).collect::<Vec<_>>()
        );
    }
    let mut report = Report::new();
    report.add(
        "runs",
        format!(
            "{repetitions} fresh empty databases × 5 concurrent `migrate`: all exit 0, one applies, four up to date, {expected} migration row(s)"
        ),
    );
    report.add("time per run", latency_summary(&took));
    sc.publish(&report);
}

#[test]
fn concurrent_migrations_postgres() {
    concurrent_migrations(Backend::Postgres);
}

#[test]
fn concurrent_migrations_sqlite() {
    concurrent_migrations(Backend::Sqlite);
}
