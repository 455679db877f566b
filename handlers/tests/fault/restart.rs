//! The server restarted mid-run, on a server of its own: PostgreSQL (`pg.sh restart fast` or
//! `immediate`) and MySQL (`mysql.sh restart fast`, a clean shutdown, or `immediate`, a
//! SIGKILL of the server).

use std::collections::HashSet;
use std::time::Instant;

use outbox::Backend;

use crate::cluster::Cluster;
use crate::db::{
    clock_ms, done_since, ledger_and_external, task, wait_until, wait_until_finished, Db,
};
use crate::invariants::check_and_publish_after_crash;
use crate::logs::{log_lines, lost_claim_tasks, summaries, OUTAGE_LOG, RELEASE_LOG};
use crate::report::{secs, Report};
use crate::scenario::{stop_all, Proc, Scenario};
use crate::{by_profile, work_limit, COMMAND_LIMIT, LEFT_AFTER_LAST_FAULT};

/// Ids of the second database's tasks start here, so that the workers' log lines, which name
/// a task by id alone, tell the two databases' tasks apart.
const SECOND_DATABASE_IDS: i64 = 1_000_000;

/// The server restarted (`how`) while two `run` workers serve `databases` databases on it:
/// each worker one process (a fleet when `databases` is 2, sharing its threads between them).
fn restarted_mid_run(backend: Backend, how: &'static str, databases: usize) {
    let name = match databases {
        1 => format!("{}_restarted_mid_run_{how}", backend.name()),
        n => format!("{}_fleet_of_{n}_restarted_mid_run_{how}", backend.name()),
    };
    let sc = Scenario::start(&name, backend.name());
    let cluster = Cluster::start(&sc, backend);
    let tasks = 5_000;
    let sleep_ms = by_profile(10, 20);
    let restarts = by_profile(1, 2);
    let dbs: Vec<(String, Db)> = (0..databases)
        .map(|i| {
            let url = cluster.create_database(&format!("fault_restart_{i}"));
            sc.spawn("migrate", &url, &["migrate".to_owned()])
                .expect_exit_0(COMMAND_LIMIT);
            let db = Db::new(&url);
            db.create_fault_ledger();
            if i > 0 {
                db.exec(&match backend {
                    Backend::Mysql => format!(
                        "ALTER TABLE async_task AUTO_INCREMENT = {}",
                        SECOND_DATABASE_IDS * i as i64
                    ),
                    _ => format!(
                        "SELECT setval(pg_get_serial_sequence('async_task', 'id'), {})",
                        SECOND_DATABASE_IDS * i as i64
                    ),
                });
            }
            let share = tasks / databases;
            db.enqueue(&match databases {
                1 => ledger_and_external(share, sleep_ms, 20),
                // The external file names a task by id alone: the ledger only.
                _ => (0..share)
                    .map(|n| task("fault.ledger", n, sleep_ms, 20))
                    .collect(),
            });
            (url, db)
        })
        .collect();
    let db = &dbs[0].1;
    let done = || dbs.iter().map(|(_, db)| db.in_state("done")).sum::<i64>();
    let unfinished = || dbs.iter().map(|(_, db)| db.unfinished()).sum::<i64>();

    let mut args = sc.worker_args("run", &[]);
    if databases > 1 {
        for (url, _) in &dbs {
            args.extend(["--database-url".to_owned(), url.clone()]);
        }
    }
    let mut workers: Vec<Proc> = (1..=2)
        .map(|i| sc.spawn(&format!("worker{i}"), &dbs[0].0, &args))
        .collect();
    let mut downtime = Vec::new();
    let mut unfinished_at_restart = Vec::new();
    for r in 0..restarts {
        // Restart once a share of the work is done, while the rest is still to do.
        let threshold = tasks as i64 * (r + 1) / (restarts + 2);
        wait_until(db, work_limit(), &format!("{threshold} tasks done"), || {
            done() >= threshold
        });
        let unfinished = unfinished();
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
    let last_fault = clock_ms(db);
    let left: Vec<i64> = dbs.iter().map(|(_, db)| db.unfinished()).collect();
    assert!(
        left.iter()
            .all(|&n| n >= LEFT_AFTER_LAST_FAULT / databases as i64),
        "only {left:?} tasks left after the last restart: raise sleep_ms"
    );
    let since_last = Instant::now();
    for (_, db) in &dbs {
        wait_until_finished(db, work_limit(), || {
            for worker in &mut workers {
                worker.assert_running("while finishing");
            }
        });
    }
    let tail_time = since_last.elapsed();
    // Per database, per worker: each process's loop of each database went on.
    let resumed: Vec<Vec<i64>> = dbs
        .iter()
        .map(|(_, db)| done_since(db, &workers, last_fault))
        .collect();
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

    let mut charged = Vec::new();
    for (i, (_, db)) in dbs.iter().enumerate() {
        let mut report = Report::new();
        report.add(
            "tasks",
            match databases {
                1 => format!("{tasks} (3/4 fault.ledger, 1/4 fault.external, sleep_ms {sleep_ms})"),
                n => format!(
                    "{} of {tasks} in database {} of {n} (fault.ledger, sleep_ms {sleep_ms})",
                    tasks / n,
                    i + 1
                ),
            },
        );
        report.add(
            "processes",
            match databases {
                1 => "2 run workers, 0 restarts (all alive to the end)".to_owned(),
                n => format!("2 run workers serving {n} databases each, 0 restarts"),
            },
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
            format!("{left:?} tasks left; done per database, per worker since: {resumed:?}"),
        );
        report.add("finish after last restart", secs(tail_time));
        report.add("SIGTERM to exit", secs(stop_time));
        report.add("worker summaries", summaries(&workers));
        report.add("tasks of claims lost", lost_claims.len());
        let figures =
            check_and_publish_after_crash(&sc, db, report, true, &lost_claims, how == "immediate");
        charged.extend(figures.charged);
    }
    assert_eq!(panics, 0, "a worker panicked (see its stderr)");
    assert!(
        resumed.iter().flatten().all(|&n| n > 0),
        "a worker did no task of a database after the last restart (done per database, per \
         worker: {resumed:?})"
    );
    // docs/guide/src/failure.md: "PostgreSQL restarts: [...] no task is charged a failure for it";
    // the same on MySQL.
    assert!(
        charged.is_empty(),
        "tasks charged a failure by the restart: {charged:?}"
    );
    drop(dbs);
    drop(cluster);
}

#[test]
fn postgres_restarted_mid_run_fast() {
    restarted_mid_run(Backend::Postgres, "fast", 1);
}

#[test]
fn postgres_restarted_mid_run_immediate() {
    restarted_mid_run(Backend::Postgres, "immediate", 1);
}

/// MariaDB shut down cleanly and started again mid-run.
#[cfg(feature = "mysql")]
#[test]
fn restarted_mid_run_fast_mysql() {
    restarted_mid_run(Backend::Mysql, "fast", 1);
}

/// MariaDB killed (SIGKILL) and started again mid-run: crash recovery.
#[cfg(feature = "mysql")]
#[test]
fn restarted_mid_run_immediate_mysql() {
    restarted_mid_run(Backend::Mysql, "immediate", 1);
}

/// One process serving two databases on the server (a fleet), the server shut down and
/// started again mid-run: each database's tasks finish, each once, none charged.
#[test]
fn postgres_fleet_restarted_mid_run_fast() {
    restarted_mid_run(Backend::Postgres, "fast", 2);
}

/// A fleet of two databases, the server crashed (`-m immediate`) and back mid-run.
#[test]
fn postgres_fleet_restarted_mid_run_immediate() {
    restarted_mid_run(Backend::Postgres, "immediate", 2);
}

/// A fleet of two databases on MariaDB, shut down cleanly and started again mid-run.
#[cfg(feature = "mysql")]
#[test]
fn fleet_restarted_mid_run_fast_mysql() {
    restarted_mid_run(Backend::Mysql, "fast", 2);
}

/// A fleet of two databases on MariaDB, killed (SIGKILL) and started again mid-run.
#[cfg(feature = "mysql")]
#[test]
fn fleet_restarted_mid_run_immediate_mysql() {
    restarted_mid_run(Backend::Mysql, "immediate", 2);
}
