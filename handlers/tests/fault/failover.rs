//! Failover: a primary with a synchronous standby (`pg_basebackup -R`,
//! `synchronous_standby_names`), workers on a multi-host URL with
//! `target_session_attrs=read-write`, the primary stopped `-m immediate` mid-run and the
//! standby promoted (`pg_ctl promote`); in strict and in batched mode.
//!
//! Checked: the workers carry on by themselves on the new primary (nothing restarts them);
//! every completion the old primary acknowledged is on the new one (the standby was
//! synchronous); every task ends done, each ledger effect exactly once (the suite's
//! invariants); the first task is done on the new primary within [`FIND_LIMIT`] of the
//! promotion, and all within [`crate::work_limit`].

use std::collections::HashSet;
use std::time::{Duration, Instant};

use outbox::Backend;

use crate::cluster::Cluster;
use crate::db::{clock_ms, ledger_and_external, wait_until, wait_until_finished, Db};
use crate::invariants::check_and_publish_failover;
use crate::logs::{log_lines, lost_claim_tasks, summaries, OUTAGE_LOG, RELEASE_LOG};
use crate::report::{secs, Report};
use crate::scenario::{stop_all, Proc, Scenario};
use crate::{by_profile, work_limit, COMMAND_LIMIT, LEFT_AFTER_LAST_FAULT};

/// How long after the promotion the workers may take to finish a first task on the new
/// primary. What finds it is the pool: a connection that failed is opened again after a
/// delay that doubles from 200 ms up to half the checkout timeout (5 s), each attempt trying
/// the hosts in turn (the standby, read-only, is skipped until promoted); a claim waits in
/// its checkout meanwhile. Measured 0.01–0.3 s after a 3 s outage, 1.0–1.4 s after a 15 s one
/// (guide: backends, PostgreSQL, "Failover"); a wide margin for a loaded two-core machine.
const FIND_LIMIT: Duration = Duration::from_secs(15);

/// How old every worker's last heartbeat on the standby is when it is promoted: twice the
/// suite's `--dead-after` in the short profile; in the long one, past the pool's checkout
/// timeout (10 s), so that checkouts time out and the pool's reconnect delay is at its cap.
fn outage() -> Duration {
    by_profile(Duration::from_secs(3), Duration::from_secs(15))
}

/// The database the scenario's workers use, on both servers.
const DATABASE: &str = "fault_failover";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `--commit-batch 1`, stamp claims.
    Strict,
    /// `--commit-batch 10`, lock claims (`--claim auto` in batched mode on PostgreSQL).
    Batched,
}

fn primary_stopped_and_standby_promoted(mode: Mode) {
    let name = match mode {
        Mode::Strict => "strict",
        Mode::Batched => "batched",
    };
    let sc = Scenario::start(&format!("failover_{name}"), "postgres");
    let primary = Cluster::start(&sc, Backend::Postgres);
    let primary_url = primary.create_database(DATABASE);
    sc.spawn("migrate", &primary_url, &["migrate".to_owned()])
        .expect_exit_0(COMMAND_LIMIT);
    let primary_db = Db::new(&primary_url);
    primary_db.create_fault_ledger();
    let tasks = by_profile(3_000, 10_000);
    let sleep_ms = by_profile(5, 10);
    primary_db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    // The standby is a copy taken now; then the primary makes it synchronous (not in the
    // copy: promoted, it has no standby to wait for).
    let standby = Cluster::standby_of(&sc, &primary);
    primary_db.exec("ALTER SYSTEM SET synchronous_standby_names = '*'");
    primary_db.exec("SELECT pg_reload_conf()");
    wait_until(
        &primary_db,
        COMMAND_LIMIT,
        "the standby to stream synchronously",
        || {
            primary_db.count("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
                == 1
        },
    );
    drop(primary_db);

    // The workers' URL, and the test's own view of the database (it follows the primary as
    // the workers do).
    let url = format!(
        "postgres://outbox@127.0.0.1:{},127.0.0.1:{}/{DATABASE}?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let db = Db::new(&url);
    let standby_url = format!("postgres://outbox@127.0.0.1:{}/{DATABASE}", standby.port());
    let standby_db = Db::new(&standby_url);

    let args = match mode {
        Mode::Strict => sc.worker_args("run", &[]),
        Mode::Batched => sc.worker_args("run", &[("--commit-batch", "10")]),
    };
    let mut workers: Vec<Proc> = (1..=2)
        .map(|i| sc.spawn(&format!("worker{i}"), &url, &args))
        .collect();
    let threshold = tasks as i64 / 3;
    wait_until(
        &db,
        work_limit(),
        &format!("{threshold} tasks done"),
        || db.in_state("done") >= threshold,
    );
    let done_before_stop = db.in_state("done");
    let stop_started = Instant::now();
    primary.script(&sc, &["halt", "immediate"]);
    let stop_time = stop_started.elapsed();
    // What the standby has: every completion the primary acknowledged, since each waited
    // for the standby to flush it. The tasks of the claims it has (the leases of lock
    // claims are in an unlogged table, which a standby does not get).
    let done_on_standby = standby_db.in_state("done");
    let running_on_standby: Vec<i64> =
        standby_db.numbers("SELECT id AS n FROM async_task WHERE state = 'running'");
    let left = standby_db
        .count("SELECT count(*) FROM async_task WHERE state NOT IN ('done', 'dead', 'cancelled')");
    // A failover manager takes a while to decide: promote once every worker's last
    // heartbeat (on the standby, by its clock) is [`outage`] old, past their `--dead-after`,
    // so that on the new primary each node finds the other's claims stale.
    let outage_age = outage();
    wait_until(
        &standby_db,
        COMMAND_LIMIT,
        &format!("every heartbeat {outage_age:?} old"),
        || {
            standby_db.count(&format!(
                "SELECT count(*) FROM async_node WHERE state = 'alive'
                   AND heartbeat_at > clock_timestamp() - interval '{} milliseconds'",
                outage_age.as_millis()
            )) == 0
        },
    );
    let promote_started = Instant::now();
    standby.script(&sc, &["promote"]);
    let promote_time = promote_started.elapsed();
    let outage = stop_started.elapsed();
    let promoted_ms = clock_ms(&standby_db);
    for worker in &mut workers {
        worker.assert_running("after the failover");
    }
    let found = Instant::now();
    wait_until(
        &db,
        FIND_LIMIT * 4,
        "a task done on the new primary",
        || db.in_state("done") > done_on_standby,
    );
    let found_polled = found.elapsed();
    let tail_time = wait_until_finished(&db, work_limit(), || {
        for worker in &mut workers {
            worker.assert_running("while finishing");
        }
    });

    // By the new primary's clock: from the promotion to each worker's first task done on it,
    // and to the last of the tasks that were running at the stop.
    let since = format!("to_timestamp({promoted_ms} / 1000.0)");
    let ms_after_promotion = |filter: &str, agg: &str| {
        db.count(&format!(
            "SELECT COALESCE(CAST(EXTRACT(EPOCH FROM {agg}(finished_at) - {since}) * 1000 AS BIGINT), -1)
             FROM async_task WHERE state = 'done' AND finished_at >= {since} {filter}"
        ))
    };
    let first_done = ms_after_promotion("", "min");
    let first_done_per_worker: Vec<i64> = workers
        .iter()
        .map(|w| {
            let node = db
                .node_id(&w.node_name())
                .unwrap_or_else(|| panic!("{} has no node row", w.label));
            ms_after_promotion(&format!("AND owner = {node}"), "min")
        })
        .collect();
    let running_at_stop = match running_on_standby.is_empty() {
        true => "none".to_owned(),
        false => {
            let ids = running_on_standby
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let last = ms_after_promotion(&format!("AND id IN ({ids})"), "max");
            let rescued = db.count(&format!(
                "SELECT count(*) FROM async_task WHERE id IN ({ids}) AND last_error LIKE 'rescued%'"
            ));
            format!(
                "{} (the last done {} after the promotion; {rescued} rescued)",
                running_on_standby.len(),
                secs(Duration::from_millis(last.max(0) as u64))
            )
        }
    };

    let all: Vec<&Proc> = workers.iter().collect();
    let outages = log_lines(&all, OUTAGE_LOG);
    let recovered = log_lines(&all, &["database reachable again"]);
    let released = log_lines(&all, RELEASE_LOG);
    let panics = log_lines(&all, &["panicked"]);
    let lost_claims: HashSet<i64> = lost_claim_tasks(&all);
    let exit_time = stop_all(&mut workers);

    let ms = |n: i64| secs(Duration::from_millis(n.max(0) as u64));
    let mut report = Report::new();
    report.add(
        "tasks",
        format!("{tasks} (3/4 fault.ledger, 1/4 fault.external, sleep_ms {sleep_ms})"),
    );
    report.add(
        "processes",
        format!(
            "2 run workers ({}) on 127.0.0.1:{},127.0.0.1:{} target_session_attrs=read-write, all alive to the end",
            args[1..].join(" "),
            primary.port(),
            standby.port()
        ),
    );
    report.add(
        "failover",
        format!(
            "pg.sh halt immediate after {done_before_stop} done (took {}), promote once every heartbeat was {} old (took {}): no primary for {}; {left} tasks left",
            secs(stop_time),
            secs(outage_age),
            secs(promote_time),
            secs(outage)
        ),
    );
    report.add(
        "on the standby at stop",
        format!("{done_on_standby} done (≥ {done_before_stop} acknowledged before), running {running_at_stop}"),
    );
    report.add(
        "promote to first done",
        format!(
            "{} (per worker {:?}; polled {})",
            ms(first_done),
            first_done_per_worker
                .iter()
                .map(|&n| ms(n))
                .collect::<Vec<_>>(),
            secs(found_polled)
        ),
    );
    report.add(
        "worker log lines",
        format!("{outages} claim outages, {recovered} 'database reachable again', {released} tasks released by a database error, {panics} 'panicked'"),
    );
    report.add("finish after promote", secs(tail_time + found_polled));
    report.add("SIGTERM to exit", secs(exit_time));
    report.add("worker summaries", summaries(&workers));
    report.add("tasks of claims lost", lost_claims.len());
    check_and_publish_failover(&sc, &db, report, &lost_claims, mode == Mode::Batched);
    assert_eq!(panics, 0, "a worker panicked (see its stderr)");
    assert!(
        done_on_standby >= done_before_stop,
        "a completion acknowledged by the primary is not on its synchronous standby: \
         {done_before_stop} done before the stop, {done_on_standby} on the standby"
    );
    assert!(
        left >= LEFT_AFTER_LAST_FAULT,
        "only {left} tasks left at the failover: raise sleep_ms"
    );
    assert!(
        first_done_per_worker.iter().all(|&n| n >= 0),
        "a worker did no task on the new primary: {first_done_per_worker:?}"
    );
    let slowest = Duration::from_millis(*first_done_per_worker.iter().max().unwrap() as u64);
    assert!(
        slowest <= FIND_LIMIT,
        "a worker took {} to finish a task on the new primary (limit {})",
        secs(slowest),
        secs(FIND_LIMIT)
    );
    drop(db);
    drop(standby_db);
    drop(standby);
    drop(primary);
}

#[test]
fn primary_stopped_and_standby_promoted_strict() {
    primary_stopped_and_standby_promoted(Mode::Strict);
}

#[test]
fn primary_stopped_and_standby_promoted_batched() {
    primary_stopped_and_standby_promoted(Mode::Batched);
}
