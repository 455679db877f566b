//! The server restarted mid-run, on a server of its own: PostgreSQL (`pg.sh restart fast` or
//! `immediate`) and MySQL (`mysql.sh restart fast`, a clean shutdown, or `immediate`, a
//! SIGKILL of the server).

use std::collections::HashSet;
use std::time::Instant;

use outbox::Backend;

use crate::cluster::Cluster;
use crate::db::{clock_ms, done_since, ledger_and_external, wait_until, wait_until_finished, Db};
use crate::invariants::check_and_publish_after_crash;
use crate::logs::{log_lines, lost_claim_tasks, summaries, OUTAGE_LOG, RELEASE_LOG};
use crate::report::{secs, Report};
use crate::scenario::{stop_all, Proc, Scenario};
use crate::{by_profile, work_limit, COMMAND_LIMIT, LEFT_AFTER_LAST_FAULT};

fn restarted_mid_run(backend: Backend, how: &'static str) {
    let sc = Scenario::start(
        &format!("{}_restarted_mid_run_{how}", backend.name()),
        backend.name(),
    );
    let cluster = Cluster::start(&sc, backend);
    let url = cluster.create_database("fault_restart");
    sc.spawn("migrate", &url, &["migrate".to_owned()])
        .expect_exit_0(COMMAND_LIMIT);
    let db = Db::new(&url);
    db.create_fault_ledger();
    let tasks = 5_000;
    let sleep_ms = by_profile(10, 20);
    let restarts = by_profile(1, 2);
    db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    let args = sc.worker_args("run", &[]);
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
        cluster.script(&sc, &["restart", how]);
        downtime.push(started.elapsed());
        for worker in &mut workers {
            worker.assert_running("after the restart");
        }
    }
    let last_fault = clock_ms(&db);
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
    // An immediate shutdown is a crash: claims whose WAL was not flushed yet are lost
    // (PostgreSQL; MariaDB's test server writes its log at each commit, so a SIGKILL of the
    // server should lose none: the same tolerance applies, the report counts them).
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
            "{restarts} × {}.sh restart {how} (took {}), unfinished tasks at each: {unfinished_at_restart:?}",
            if backend == Backend::Mysql { "mysql" } else { "pg" },
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
    let figures =
        check_and_publish_after_crash(&sc, &db, report, true, &lost_claims, how == "immediate");
    assert_eq!(panics, 0, "a worker panicked (see its stderr)");
    assert!(
        resumed.iter().all(|&n| n > 0),
        "a worker did no task after the last restart (done per worker: {resumed:?})"
    );
    // docs/guide/src/failure.md: "PostgreSQL restarts: [...] no task is charged a failure for it";
    // the same on MySQL.
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
    restarted_mid_run(Backend::Postgres, "fast");
}

#[test]
fn postgres_restarted_mid_run_immediate() {
    restarted_mid_run(Backend::Postgres, "immediate");
}

/// MariaDB shut down cleanly and started again mid-run.
#[cfg(feature = "mysql")]
#[test]
fn restarted_mid_run_fast_mysql() {
    restarted_mid_run(Backend::Mysql, "fast");
}

/// MariaDB killed (SIGKILL) and started again mid-run: crash recovery.
#[cfg(feature = "mysql")]
#[test]
fn restarted_mid_run_immediate_mysql() {
    restarted_mid_run(Backend::Mysql, "immediate");
}
