//! The cron fleet: three `outbox-fault run --crontab` processes on one PostgreSQL run an
//! every-second schedule for about ten seconds. Every tick between the first and the last
//! must be one task, enqueued by one node (each node logs the ticks it created), run once
//! (one `fault_ledger` row), none missing. The tick record goes to the report.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};
use outbox::Backend;

use crate::db::{fault_db, wait_until};
use crate::report::Report;
use crate::scenario::{stop_all, Proc, Scenario};
use crate::{work_limit, COMMAND_LIMIT, POLL};

/// How long all three nodes run the schedule together.
const WINDOW: Duration = Duration::from_secs(10);

/// One tick's task as stored.
#[derive(QueryableByName)]
struct TickTask {
    #[diesel(sql_type = Text)]
    biz_id: String,
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = Nullable<Text>)]
    ran_by: Option<String>,
    /// Its `created_at` after its tick, in milliseconds (database clock).
    #[diesel(sql_type = BigInt)]
    late_ms: i64,
    /// Its `fault_ledger` rows: its handler's committed runs.
    #[diesel(sql_type = BigInt)]
    runs: i64,
}

/// The ticks each process's log says it enqueued (created), by tick text.
fn enqueued_by(procs: &[&Proc]) -> BTreeMap<String, Vec<String>> {
    let mut by_tick: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for proc in procs {
        for line in proc.stderr_text().lines() {
            let Some(at) = line.find("enqueued tick ") else {
                continue;
            };
            let rest = &line[at + "enqueued tick ".len()..];
            let token = rest.split_whitespace().next().unwrap_or_default();
            let tick = token.strip_prefix("cron:").unwrap_or(token);
            by_tick
                .entry(tick.to_owned())
                .or_default()
                .push(proc.app.clone());
        }
    }
    by_tick
}

#[test]
fn cron_fleet_runs_every_tick_exactly_once() {
    cron_fleet(Backend::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn cron_fleet_runs_every_tick_exactly_once_mysql() {
    cron_fleet(Backend::Mysql);
}

fn cron_fleet(backend: Backend) {
    let sc = Scenario::start("cron_fleet_runs_every_tick_exactly_once", backend.name());
    let (test_db, db) = fault_db(backend);
    let crontab = sc.path("fleet.cron");
    std::fs::write(&crontab, "# every second\n*/1 * * * * *  fault.ledger\n").expect("crontab");
    // The default dead-after: a tick is missed only when no node enqueued it within 15 s,
    // which a loaded machine's late wake-up must not reach.
    let args = sc.worker_args(
        "run",
        &[
            ("--crontab", crontab.to_str().expect("utf-8")),
            ("--dead-after", "15s"),
        ],
    );
    let mut workers: Vec<Proc> = (1..=3)
        .map(|i| sc.spawn(&format!("node{i}"), &test_db.url_text, &args))
        .collect();
    wait_until(&db, COMMAND_LIMIT, "three live nodes", || {
        db.count("SELECT count(*) FROM async_node WHERE state = 'alive'") == 3
    });
    let window = Instant::now();
    while window.elapsed() < WINDOW {
        for worker in &mut workers {
            worker.assert_running("during the window");
        }
        std::thread::sleep(POLL);
    }
    stop_all(&mut workers);
    // A tick enqueued as the nodes stopped may be left pending: a drain without the
    // crontab runs it (and enqueues nothing).
    let mut drain = sc.spawn("drain", &test_db.url_text, &sc.worker_args("drain", &[]));
    drain.expect_exit_0(work_limit());

    // How long after its tick a task was enqueued (its biz_id is `cron:` and the tick in
    // RFC 3339, UTC).
    let late_ms = match backend {
        Backend::Postgres => {
            "(EXTRACT(EPOCH FROM t.created_at - (substr(t.biz_id, 6)::timestamptz)) * 1000)::bigint"
        }
        _ => {
            "CAST(TIMESTAMPDIFF(MICROSECOND, STR_TO_DATE(substr(t.biz_id, 6), '%Y-%m-%dT%H:%i:%sZ'),
                                t.created_at) DIV 1000 AS SIGNED)"
        }
    };
    let sql = format!(
        "SELECT t.biz_id, t.state, n.name AS ran_by, {late_ms} AS late_ms,
                (SELECT count(*) FROM fault_ledger l WHERE l.task_id = t.id) AS runs
           FROM async_task t LEFT JOIN async_node n ON n.id = t.owner
          WHERE t.keyword = 'fault.ledger'
          ORDER BY t.biz_id"
    );
    let rows: Vec<TickTask> = db.with("tick tasks", |c| diesel::sql_query(&sql).load(c));
    let names: BTreeMap<String, String> = workers
        .iter()
        .chain(std::iter::once(&drain))
        .map(|p| (p.node_name(), p.app.clone()))
        .collect();
    let procs: Vec<&Proc> = workers.iter().collect();
    let enqueued = enqueued_by(&procs);

    // Each tick as seconds since the epoch.
    let ticks: Vec<i64> = rows
        .iter()
        .map(|r| {
            outbox::schedule::tick_of(&r.biz_id)
                .expect("a tick's biz_id")
                .timestamp()
        })
        .collect();
    assert!(!ticks.is_empty(), "no tick was enqueued");
    let (first, last) = (ticks[0], ticks[ticks.len() - 1]);
    let span = last - first + 1;
    let gaps: Vec<i64> = (first..=last).filter(|t| !ticks.contains(t)).collect();
    let duplicate_ticks = ticks.windows(2).filter(|w| w[0] == w[1]).count();
    let not_run_once: Vec<&str> = rows
        .iter()
        .filter(|r| r.runs != 1 || r.state != "done")
        .map(|r| r.biz_id.as_str())
        .collect();
    let enqueue_not_once: Vec<String> = rows
        .iter()
        .map(|r| &r.biz_id[5..])
        .filter(|tick| enqueued.get(*tick).map_or(0, Vec::len) != 1)
        .map(str::to_owned)
        .collect();
    let mut late: Vec<i64> = rows.iter().map(|r| r.late_ms).collect();
    late.sort_unstable();

    let mut per_enqueuer: BTreeMap<&str, usize> = BTreeMap::new();
    let mut per_runner: BTreeMap<String, usize> = BTreeMap::new();
    let mut record = Vec::new();
    for row in &rows {
        let tick = &row.biz_id[5..];
        let by = enqueued.get(tick).map_or("?".to_owned(), |v| v.join("+"));
        let ran = row.ran_by.as_ref().map_or("?".to_owned(), |n| {
            names.get(n).cloned().unwrap_or(n.clone())
        });
        for app in enqueued.get(tick).into_iter().flatten() {
            *per_enqueuer.entry(app.as_str()).or_default() += 1;
        }
        *per_runner.entry(ran.clone()).or_default() += 1;
        record.push(format!("{}:{by}>{ran}", &tick[17..19]));
    }

    let mut report = Report::new();
    report.add(
        "schedule",
        "*/1 * * * * * fault.ledger, 3 `run --crontab` nodes",
    );
    report.add("window", format!("{WINDOW:?} with all three nodes live"));
    report.add(
        "ticks seen",
        format!(
            "{} ({} to {})",
            rows.len(),
            &rows[0].biz_id[5..],
            &rows[rows.len() - 1].biz_id[5..]
        ),
    );
    report.add("span in seconds", span);
    report.add("duplicates", duplicate_ticks);
    report.add("gaps", gaps.len());
    report.add("not run exactly once", not_run_once.len());
    report.add("not enqueued by one node", enqueue_not_once.len());
    report.add("enqueued by (node: ticks)", format!("{per_enqueuer:?}"));
    report.add("ran by (node: ticks)", format!("{per_runner:?}"));
    report.add(
        "enqueued after its tick",
        format!(
            "median {} ms, max {} ms",
            late[late.len() / 2],
            late[late.len() - 1]
        ),
    );
    report.add("tick second:enqueuer>runner", record.join(" "));
    sc.publish(&report);

    assert!(rows.len() >= 9, "only {} ticks in {WINDOW:?}", rows.len());
    assert_eq!(duplicate_ticks, 0);
    assert!(gaps.is_empty(), "ticks missing: {gaps:?}");
    assert!(
        not_run_once.is_empty(),
        "ticks not done exactly once: {not_run_once:?}"
    );
    assert!(
        enqueue_not_once.is_empty(),
        "ticks whose creation no node, or several, logged: {enqueue_not_once:?}"
    );
}
