//! Pruning finished tasks and old nodes. Time moves by backdating `finished_at` and
//! `heartbeat_at` in the database, whose clock alone decides what is old.

use std::time::Duration;

use outbox::prune::{prune, PruneParams, PruneReport};
use outbox::{enqueue_batch, Backend, Error, NewTask, TaskState};

use crate::small_config;
use crate::support::TestDb;

const HOUR: Duration = Duration::from_secs(3600);

/// A time `secs` seconds ago by the database clock, as an SQL expression.
fn ago(db: &TestDb, secs: u64) -> String {
    match db.backend() {
        Backend::Postgres => format!("now() - interval '{secs} seconds'"),
        Backend::Sqlite => format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '-{secs} seconds')"),
        Backend::Mysql => format!("UTC_TIMESTAMP(3) - INTERVAL {secs} SECOND"),
    }
}

/// Enqueues one task per biz_id, then puts each in `state`, finished `age` seconds ago
/// (`None`: no finished_at, as for a task that never finished); a finished task was created
/// when it finished, as no task finishes before it is created.
fn tasks(db: &TestDb, rows: &[(&str, &str, Option<u64>)]) {
    let new: Vec<NewTask> = rows
        .iter()
        .map(|(biz_id, _, _)| NewTask::new("prune.test", *biz_id))
        .collect();
    enqueue_batch(&mut db.conn(), &new).unwrap();
    for (biz_id, state, age) in rows {
        let finished = age.map_or_else(|| "NULL".to_owned(), |secs| ago(db, secs));
        db.exec(&format!(
            "UPDATE async_task SET state = '{state}', finished_at = {finished},
                    created_at = COALESCE({finished}, created_at)
             WHERE biz_id = '{biz_id}'"
        ));
    }
}

/// `n` done tasks `biz_id` prefix-0 … that finished two hours ago.
fn old_done(db: &TestDb, prefix: &str, n: usize) {
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    let rows: Vec<(&str, &str, Option<u64>)> = ids
        .iter()
        .map(|id| (id.as_str(), "done", Some(7200)))
        .collect();
    tasks(db, &rows);
}

/// The biz_ids left in `async_task`, sorted.
fn remaining(db: &TestDb) -> Vec<String> {
    use diesel::prelude::*;
    let mut ids: Vec<String> = diesel::sql_query("SELECT biz_id FROM async_task ORDER BY biz_id")
        .load::<BizId>(&mut db.conn())
        .unwrap()
        .into_iter()
        .map(|r| r.biz_id)
        .collect();
    ids.sort();
    ids
}

#[derive(diesel::QueryableByName)]
struct BizId {
    #[diesel(sql_type = diesel::sql_types::Text)]
    biz_id: String,
}

/// Inserts a node row in `state` whose heartbeat is `age` seconds old; returns its id.
fn node(db: &TestDb, name: &str, state: &str, age: u64) -> i64 {
    db.exec(&format!(
        "INSERT INTO async_node (name, state, heartbeat_at) VALUES ('{name}', '{state}', {})",
        ago(db, age)
    ));
    db.count(&format!("SELECT id FROM async_node WHERE name = '{name}'"))
}

fn nodes_left(db: &TestDb) -> i64 {
    db.count("SELECT count(*) FROM async_node")
}

/// Makes the task `biz_id` owned by `owner` in `state`.
/// As a claim leaves it: a running task has a deadline (SQLite finds running tasks by it).
fn own(db: &TestDb, biz_id: &str, owner: i64, state: &str) {
    db.exec(&format!(
        "UPDATE async_task SET owner = {owner}, state = '{state}',
                deadline_at = CASE WHEN '{state}' = 'running' THEN created_at END
         WHERE biz_id = '{biz_id}'"
    ));
}

/// Counts without the elapsed time, for comparisons.
fn counts(report: &PruneReport) -> (u64, u64, u64, u64, u64) {
    (
        report.done,
        report.dead,
        report.cancelled,
        report.nodes,
        report.batches,
    )
}

every_backend! {
    fn prune_deletes_only_finished_tasks_older_than_the_cutoff(db: &TestDb) {
        tasks(db, &[
            ("done-old-1", "done", Some(7200)),
            ("done-old-2", "done", Some(3 * 86400)),
            ("dead-old", "dead", Some(7200)),
            ("cancelled-old", "cancelled", Some(7200)),
            ("done-recent", "done", Some(600)),
            ("dead-recent", "dead", Some(60)),
            ("pending", "pending", None),
            // A dead task made pending again by a retry keeps its old finished_at: it stays.
            ("pending-retried", "pending", Some(7200)),
            ("running", "running", Some(7200)),
            ("blocked", "blocked", Some(7200)),
        ]);
        let report = prune(&mut db.conn(), &PruneParams::new(HOUR)).unwrap();
        assert_eq!(counts(&report), (2, 1, 1, 0, 1));
        assert_eq!(report.tasks(), 4);
        assert_eq!(
            remaining(db),
            ["blocked", "dead-recent", "done-recent", "pending", "pending-retried", "running"]
        );
        // Nothing more is old enough: a second prune deletes nothing.
        let again = prune(&mut db.conn(), &PruneParams::new(HOUR)).unwrap();
        assert_eq!(counts(&again), (0, 0, 0, 0, 1));
        // A shorter retention reaches the recent ones; unfinished tasks stay whatever the age.
        let report = prune(&mut db.conn(), &PruneParams::new(Duration::ZERO)).unwrap();
        assert_eq!(counts(&report), (1, 1, 0, 0, 1));
        assert_eq!(remaining(db), ["blocked", "pending", "pending-retried", "running"]);
    }

    fn keep_dead_keeps_dead_tasks_however_old(db: &TestDb) {
        tasks(db, &[
            ("done-old", "done", Some(7200)),
            ("dead-old", "dead", Some(30 * 86400)),
            ("cancelled-old", "cancelled", Some(7200)),
        ]);
        let report = prune(&mut db.conn(), &PruneParams::new(HOUR).keep_dead()).unwrap();
        assert_eq!(counts(&report), (1, 0, 1, 0, 1));
        assert_eq!(remaining(db), ["dead-old"]);
        // Only the states asked for.
        let only_dead = PruneParams::new(HOUR).states(&[TaskState::Dead]);
        assert_eq!(counts(&prune(&mut db.conn(), &only_dead).unwrap()), (0, 1, 0, 0, 1));
        assert_eq!(remaining(db), Vec::<String>::new());
    }

    fn batches_loop_until_one_deletes_fewer_than_the_batch_size(db: &TestDb) {
        old_done(db, "a", 10);
        tasks(db, &[("recent", "done", Some(10))]);
        let params = PruneParams::new(HOUR).batch_size(3);
        let report = prune(&mut db.conn(), &params).unwrap();
        // 3 + 3 + 3 + 1.
        assert_eq!(counts(&report), (10, 0, 0, 0, 4));
        assert_eq!(remaining(db), ["recent"]);

        // An exact multiple takes one more, empty, batch to see that nothing is left.
        old_done(db, "b", 6);
        let report = prune(&mut db.conn(), &params).unwrap();
        assert_eq!(counts(&report), (6, 0, 0, 0, 3));
        assert_eq!(remaining(db), ["recent"]);
    }

    fn prune_walks_past_tasks_it_keeps_without_reading_them_again(db: &TestDb) {
        // Thirty old dead tasks kept by --keep-dead, then ten old done ones, then a new one.
        let dead: Vec<String> = (0..30).map(|i| format!("dead-{i:02}")).collect();
        let rows: Vec<(&str, &str, Option<u64>)> =
            dead.iter().map(|id| (id.as_str(), "dead", Some(7200))).collect();
        tasks(db, &rows);
        old_done(db, "done", 10);
        tasks(db, &[("new", "done", Some(10))]);
        let report = prune(&mut db.conn(), &PruneParams::new(HOUR).keep_dead().batch_size(10)).unwrap();
        assert_eq!((report.done, report.dead), (10, 0));
        assert_eq!(remaining(db).len(), 31);
        match db.backend() {
            // The finished-task index: ten, then none.
            Backend::Postgres | Backend::Mysql => assert_eq!(report.batches, 2),
            // One window of ten tasks per batch, each read once: three of dead tasks, one of
            // done tasks, one with the new task (short: the end of the table).
            Backend::Sqlite => assert_eq!(report.batches, 5),
        }
    }

    fn nodes_go_when_gone_or_long_silent_and_owning_no_running_task(db: &TestDb) {
        let gone_old = node(db, "gone-old", "gone", 7200);
        let gone_recent = node(db, "gone-recent", "gone", 60);
        let silent = node(db, "alive-silent-3h", "alive", 3 * 3600);
        let silent_30m = node(db, "alive-silent-30m", "alive", 1800);
        let fresh = node(db, "alive-fresh", "alive", 0);
        let gone_owner = node(db, "gone-old-owner", "gone", 7200);
        let silent_owner = node(db, "alive-silent-owner", "alive", 3 * 3600);
        let gone_done_owner = node(db, "gone-old-done-owner", "gone", 7200);
        tasks(db, &[("t1", "pending", None), ("t2", "pending", None), ("t3", "pending", None)]);
        own(db, "t1", gone_owner, "running");
        own(db, "t2", silent_owner, "running");
        own(db, "t3", gone_done_owner, "done");

        let report = prune(&mut db.conn(), &PruneParams::new(HOUR)).unwrap();
        assert_eq!(report.nodes, 3);
        for (id, kept) in [
            (gone_old, false),
            (gone_recent, true),
            (silent, false),
            (silent_30m, true),
            (fresh, true),
            (gone_owner, true),
            (silent_owner, true),
            (gone_done_owner, false),
        ] {
            assert_eq!(
                db.count(&format!("SELECT count(*) FROM async_node WHERE id = {id}")),
                i64::from(kept),
                "node {id}"
            );
        }
        // With no retention at all, gone nodes go at once, but an alive node only after an
        // hour of silence: a worker that is running has a row whatever the prune.
        let report = prune(&mut db.conn(), &PruneParams::new(Duration::ZERO)).unwrap();
        assert_eq!(report.nodes, 1, "gone-recent");
        assert_eq!(nodes_left(db), 4);
        // Once rescue has taken their tasks back, the owners go too.
        db.exec("UPDATE async_task SET state = 'pending', owner = NULL WHERE state = 'running'");
        assert_eq!(prune(&mut db.conn(), &PruneParams::new(HOUR)).unwrap().nodes, 2);
        assert_eq!(nodes_left(db), 2);
    }

    fn a_running_worker_keeps_its_node_through_a_prune_with_no_retention(db: &TestDb) {
        let worker = outbox::Worker::new(&db.url, crate::ledger_registry("ledger"), small_config()).unwrap();
        let id = worker.node_id();
        let report = prune(&mut db.conn(), &PruneParams::new(Duration::ZERO)).unwrap();
        assert_eq!(report.nodes, 0);
        assert_eq!(db.count(&format!("SELECT count(*) FROM async_node WHERE id = {id}")), 1);
        // Stopped, its node is gone, and pruned.
        drop(worker);
        let report = prune(&mut db.conn(), &PruneParams::new(Duration::ZERO)).unwrap();
        assert_eq!(report.nodes, 1);
        assert_eq!(nodes_left(db), 0);
    }

    fn node_batches_loop_too(db: &TestDb) {
        for i in 0..7 {
            node(db, &format!("gone-{i}"), "gone", 7200);
        }
        let report = prune(&mut db.conn(), &PruneParams::new(HOUR).batch_size(3)).unwrap();
        assert_eq!(report.nodes, 7);
        assert_eq!(nodes_left(db), 0);
    }

    fn bad_settings_are_refused_and_nothing_is_deleted(db: &TestDb) {
        old_done(db, "x", 3);
        node(db, "gone-old", "gone", 7200);
        let refused = |params: PruneParams, needle: &str| {
            match prune(&mut db.conn(), &params) {
                Err(Error::InvalidConfig { reason, .. }) => assert!(reason.contains(needle), "{reason}"),
                other => panic!("{params:?}: expected InvalidConfig, got {other:?}"),
            }
        };
        let base = PruneParams::new(Duration::ZERO);
        refused(base.clone().batch_size(0), "must be between 1 and 1000000");
        refused(base.clone().batch_size(1_000_001), "must be between 1 and 1000000");
        refused(base.clone().states(&[TaskState::Done, TaskState::Pending]), "never pending ones");
        refused(base.clone().states(&[TaskState::Running]), "never running ones");
        refused(base.clone().states(&[]), "at least one task state");
        refused(PruneParams::new(Duration::from_secs(200 * 365 * 86400)), "at most 100 years");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 3);
        assert_eq!(nodes_left(db), 1);
    }
}
