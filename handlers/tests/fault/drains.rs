//! Overlapping drains, and a drain's tasks pruned at once.

use std::time::{Duration, Instant};

use outbox::Backend;

use crate::db::{fault_db, ledger_and_external, task};
use crate::invariants::{check_and_publish, LEDGER_STRAY};
use crate::report::{secs, Report};
use crate::scenario::{tail, Proc, Scenario};
use crate::{by_profile, work_limit, COMMAND_LIMIT};

#[test]
fn overlapping_drains() {
    overlapping(Backend::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn overlapping_drains_mysql() {
    overlapping(Backend::Mysql);
}

/// Drains started about a second apart, each while the earlier ones still run.
fn overlapping(backend: Backend) {
    let sc = Scenario::start("overlapping_drains", backend.name());
    let (test_db, db) = fault_db(backend);
    let tasks = by_profile(5_000, 20_000);
    let sleep_ms = by_profile(10, 30);
    let target = by_profile(5, 15);
    db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    // Four threads per drain: the task count and handler time are sized for it (with more,
    // the first drains finish before the later ones start).
    let args = sc.worker_args("drain", &[("--threads", "4")]);
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
        .map(|d| {
            let out = d.stdout_text();
            // After the drain's progress lines.
            let summary = out.lines().find(|l| l.starts_with("drained "));
            summary.unwrap_or("").to_owned()
        })
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

#[test]
fn a_task_pruned_right_after_it_finished_stays_known_to_the_checks_sqlite() {
    pruned_task_known(Backend::Sqlite);
}

#[test]
fn a_task_pruned_right_after_it_finished_stays_known_to_the_checks() {
    pruned_task_known(Backend::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn a_task_pruned_right_after_it_finished_stays_known_to_the_checks_mysql() {
    pruned_task_known(Backend::Mysql);
}

/// The checks' view of the tasks (`fault_tasks`) keeps each task a prune deletes as its row
/// goes: a task that finished just before the prune, after anything the harness could have
/// copied, is known with its state, and its ledger row is not taken for a stray one (chaos seed
/// 1835 reported such a row when the copy was taken before the prune started).
fn pruned_task_known(backend: Backend) {
    let sc = Scenario::start("pruned_task_known", backend.name());
    let (test_db, db) = fault_db(backend);
    db.enqueue(&[task("fault.ledger", 1, 0, 3)]);
    let id = db.numbers("SELECT id AS n FROM async_task")[0];
    sc.spawn("drain", &test_db.url_text, &sc.worker_args("drain", &[]))
        .expect_exit_0(COMMAND_LIMIT);
    let prune = ["prune", "--older-than", "0s"].map(String::from);
    sc.spawn("prune", &test_db.url_text, &prune)
        .expect_exit_0(COMMAND_LIMIT);
    assert_eq!(db.count("SELECT count(*) FROM async_task"), 0, "pruned");
    assert_eq!(db.task_state(id), "done");
    assert_eq!(db.count(LEDGER_STRAY), 0, "a stray ledger row");
}
