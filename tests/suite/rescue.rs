//! Heartbeats and rescue. Time moves by backdating `async_node.heartbeat_at` and
//! `async_task.deadline_at` in the database, whose clock alone decides liveness.

use std::time::Duration;

use outbox::{enqueue, enqueue_batch, NewTask, Worker};

use crate::support::TestDb;
use crate::{ledger_registry, small_config};

/// A worker whose own upkeep thread never ticks during a test (1 h heartbeat), so that only
/// the test moves heartbeats.
pub(crate) fn quiet_worker(db: &TestDb) -> Worker {
    let config = small_config()
        .heartbeat(Duration::from_secs(3600))
        .dead_after(Duration::from_secs(7200));
    Worker::new(&db.url, ledger_registry("ledger"), config).unwrap()
}

pub(crate) fn enqueue_n(db: &TestDb, n: usize) {
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| NewTask::new("ledger", i.to_string()))
        .collect();
    enqueue_batch(&mut db.conn(), &tasks).unwrap();
}

/// The node stops heartbeating: its last beat is three hours old by the database clock.
pub(crate) fn kill_heartbeat(db: &TestDb, node: i64) {
    let past = match db.backend() {
        outbox::Backend::Postgres => "now() - interval '3 hours'".to_owned(),
        outbox::Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-3 hours')".to_owned(),
        outbox::Backend::Mysql => "UTC_TIMESTAMP(3) - INTERVAL 3 HOUR".to_owned(),
    };
    db.exec(&format!(
        "UPDATE async_node SET heartbeat_at = {past} WHERE id = {node}"
    ));
}

fn pass_deadlines(db: &TestDb) {
    let past = match db.backend() {
        outbox::Backend::Postgres => "now() - interval '1 second'".to_owned(),
        outbox::Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 seconds')".to_owned(),
        outbox::Backend::Mysql => "UTC_TIMESTAMP(3) - INTERVAL 1 SECOND".to_owned(),
    };
    db.exec(&format!(
        "UPDATE async_task SET deadline_at = {past} WHERE state = 'running'"
    ));
}

every_backend! {
    fn a_task_two_dead_processes_held_is_claimed_alone_one_at_a_time(db: &TestDb) {
        enqueue_n(db, 5);
        // Two processes die while they hold all five: each death is counted.
        for round in 1..=2 {
            let dying = quiet_worker(db);
            assert_eq!(dying.claim().unwrap().len(), 5, "round {round}: a page takes them all");
            kill_heartbeat(db, dying.node_id());
            let report = quiet_worker(db).rescue_once().unwrap();
            assert_eq!(report.pending, 5, "round {round}");
            db.make_all_due();
        }
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE suspect = 2 AND failures = 2"), 5);
        // Now suspects: claimed one at a time, alone, by a worker that runs none.
        let w = quiet_worker(db);
        let first = w.claim().unwrap();
        assert_eq!(first.len(), 1, "one suspect, alone");
        assert!(w.claim().unwrap().is_empty(), "not a second while the first is held");
        drop(first);
        assert_eq!(w.claim().unwrap().len(), 1, "the next, once the first's claim is gone");
    }

    fn a_suspect_of_a_domain_is_claimed_when_the_lane_before_it_has_none(db: &TestDb) {
        // A suspect (a task two dead processes held) of the keyword of a domain, and a
        // plain keyword in the default lane, which is claimed first and has no suspect. Its
        // finding none must not stop the domain's lane from looking: the harness's seed 503
        // left such suspects pending while a live worker claimed around them.
        let tasks = vec![NewTask::new("slow", "suspect"), NewTask::new("ledger", "plain")];
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        db.exec("UPDATE async_task SET suspect = 2 WHERE keyword = 'slow'");
        let mut registry = ledger_registry("ledger");
        registry.register("slow", crate::write_ledger);
        let config = small_config()
            .heartbeat(Duration::from_secs(3600))
            .dead_after(Duration::from_secs(7200))
            .domain(outbox::domain::Domain::max("slow", ["slow"], 1));
        let w = Worker::new(&db.url, registry, config).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!(tally.done, 2, "{tally:?}");
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'done'"), 2);
    }

    fn two_rescuers_at_once_charge_each_task_of_a_dead_node_once(db: &TestDb) {
        // Every live node runs rescue: two passes that meet on the same dead node's tasks
        // must charge each once between them, and neither may fail or wait for the other
        // past its pass (they pass over the rows the other holds).
        enqueue_n(db, 40);
        let dying = quiet_worker(db);
        let mut held = 0;
        while held < 40 {
            let page = dying.claim().unwrap();
            assert!(!page.is_empty(), "claimed {held} of 40");
            held += page.len();
        }
        kill_heartbeat(db, dying.node_id());
        let rescuers = [quiet_worker(db), quiet_worker(db)];
        let start = std::sync::Barrier::new(2);
        let reports: Vec<_> = std::thread::scope(|s| {
            let passes: Vec<_> = rescuers
                .iter()
                .map(|r| {
                    let start = &start;
                    s.spawn(move || {
                        start.wait();
                        r.rescue_once()
                    })
                })
                .collect();
            passes.into_iter().map(|p| p.join().unwrap().unwrap()).collect()
        });
        // A row one pass held when the other reached it is charged by the first; a pass
        // that found nothing left is fine. A later pass finds nothing more.
        let charged: u64 = reports.iter().map(|r| r.pending).sum();
        let later = rescuers[0].rescue_once().unwrap();
        assert_eq!(charged + later.pending, 40, "{reports:?} then {later:?}");
        assert_eq!(
            db.count("SELECT count(*) FROM async_task WHERE state = 'pending' AND failures = 1"),
            40,
            "each task charged once: {reports:?}"
        );
    }

    fn the_tasks_of_a_node_that_stopped_heartbeating_are_rescued_once(db: &TestDb) {
        enqueue_n(db, 3);
        let dying = quiet_worker(db);
        let survivor = quiet_worker(db);
        let page = dying.claim().unwrap();
        assert_eq!(page.len(), 3);
        kill_heartbeat(db, dying.node_id());

        let report = survivor.rescue_once().unwrap();
        assert_eq!((report.pending, report.dead), (3, 0));
        let expected = format!("rescued from node {}: the node stopped heartbeating", dying.node_id());
        for task in &page {
            let row = db.task(task.context.id());
            assert_eq!((row.state.as_str(), row.failures, row.owner), ("pending", 1, None));
            assert_eq!(row.last_error.as_deref(), Some(expected.as_str()));
        }
        // A second pass finds nothing: the conditions are re-checked by the UPDATE itself.
        assert_eq!(survivor.rescue_once().unwrap(), outbox::RescueReport::default());

        // The old owner wakes up and finishes its page: every completion is fenced out.
        assert_eq!(dying.execute(page).lost, 3);
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 0);
        // The survivor runs them, once.
        db.make_all_due();
        assert_eq!(survivor.drain().unwrap().tally.done, 3);
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 3);
        assert_eq!(db.count("SELECT count(DISTINCT task_id) FROM test_ledger"), 3);
    }

    // A node whose own heartbeat is stale by the database clock (an outage of its own kept
    // its beats out: a restart, a cut link) keeps its tasks at its own rescue pass: it is
    // live to itself, and its handlers have them. The others judge it by the database clock
    // alone. Before, its own pass charged them (seed 6621 of the seeded harness: a drain
    // whose replies were cut charged its own running tasks "the node stopped heartbeating").
    fn a_node_does_not_rescue_its_own_tasks_when_its_own_heartbeat_is_stale(db: &TestDb) {
        enqueue_n(db, 2);
        let w = quiet_worker(db);
        let other = quiet_worker(db);
        let page = w.claim().unwrap();
        kill_heartbeat(db, w.node_id());
        assert_eq!(w.rescue_once().unwrap(), outbox::RescueReport::default());
        assert_eq!(
            db.count("SELECT count(*) FROM async_task WHERE state = 'running' AND failures = 0"),
            2
        );
        assert_eq!(other.rescue_once().unwrap().pending, 2, "the others' view is the database's");
        assert_eq!(w.execute(page).lost, 2);
    }

    fn live_nodes_keep_their_tasks(db: &TestDb) {
        enqueue_n(db, 2);
        let busy = quiet_worker(db);
        let other = quiet_worker(db);
        let page = busy.claim().unwrap();
        assert_eq!(other.rescue_once().unwrap(), outbox::RescueReport::default());
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'running'"), 2);
        assert_eq!(busy.execute(page).done, 2);
    }

    fn a_task_past_its_deadline_is_rescued_even_if_its_node_lives(db: &TestDb) {
        enqueue_n(db, 1);
        let w = quiet_worker(db);
        let page = w.claim().unwrap();
        pass_deadlines(db);
        assert_eq!(w.rescue_once().unwrap().pending, 1);
        let row = db.task(page[0].context.id());
        assert_eq!((row.state.as_str(), row.failures), ("pending", 1));
        assert!(row.last_error.unwrap().ends_with("running past its deadline"));
        assert_eq!(w.execute(page).lost, 1, "the hung handler's late completion is fenced out");
    }

    fn a_claim_sets_the_deadline_from_the_task_timeout(db: &TestDb) {
        enqueue_n(db, 1);
        let w = quiet_worker(db);
        w.claim().unwrap();
        let within = match db.backend() {
            outbox::Backend::Postgres => "deadline_at BETWEEN now() + interval '4 minutes' AND now() + interval '6 minutes'",
            outbox::Backend::Sqlite => "deadline_at BETWEEN strftime('%Y-%m-%d %H:%M:%f', 'now', '+4 minutes') AND strftime('%Y-%m-%d %H:%M:%f', 'now', '+6 minutes')",
            outbox::Backend::Mysql => "deadline_at BETWEEN UTC_TIMESTAMP(3) + INTERVAL 4 MINUTE AND UTC_TIMESTAMP(3) + INTERVAL 6 MINUTE",
        };
        assert_eq!(db.count(&format!("SELECT count(*) FROM async_task WHERE {within}")), 1);
    }

    fn rescue_at_max_attempts_makes_the_task_dead(db: &TestDb) {
        let tasks = [NewTask::new("ledger", "poison").max_attempts(2)];
        let id = enqueue_batch(&mut db.conn(), &tasks).unwrap()[0].id;
        let w1 = quiet_worker(db);
        let w2 = quiet_worker(db);
        let w3 = quiet_worker(db);
        // The task kills its worker twice.
        w1.claim().unwrap();
        kill_heartbeat(db, w1.node_id());
        assert_eq!(w3.rescue_once().unwrap().pending, 1);
        db.make_all_due();
        w2.claim().unwrap();
        kill_heartbeat(db, w2.node_id());
        assert_eq!(w3.rescue_once().unwrap().dead, 1);
        let row = db.task(id);
        assert_eq!((row.state.as_str(), row.failures), ("dead", 2));
        assert_eq!(w3.run_once().unwrap().claimed, 0);
    }

    fn the_tasks_of_a_gone_node_are_rescued_at_once(db: &TestDb) {
        enqueue_n(db, 2);
        let leaving = quiet_worker(db);
        let other = quiet_worker(db);
        leaving.claim().unwrap();
        // It exited past its shutdown timeout: marked gone with tasks still running.
        db.exec(&format!("UPDATE async_node SET state = 'gone' WHERE id = {}", leaving.node_id()));
        assert_eq!(other.rescue_once().unwrap().pending, 2);
    }

    // A node is live to itself only while its row says alive: one marked gone while it
    // lived (its beats kept out past `--dead-after`, then pruned or marked by another) has
    // its tasks under that id rescued at its own pass too; its next beat registers it again.
    fn a_node_rescues_its_own_tasks_once_its_own_row_is_marked_gone(db: &TestDb) {
        enqueue_n(db, 2);
        let w = quiet_worker(db);
        let page = w.claim().unwrap();
        db.exec(&format!("UPDATE async_node SET state = 'gone' WHERE id = {}", w.node_id()));
        assert_eq!(w.rescue_once().unwrap().pending, 2);
        assert_eq!(w.execute(page).lost, 2);
    }

    fn rescued_tasks_come_due_spread_out_not_all_at_once(db: &TestDb) {
        enqueue_n(db, 5);
        let dying = quiet_worker(db);
        let survivor = quiet_worker(db);
        assert_eq!(dying.claim().unwrap().len(), 5);
        kill_heartbeat(db, dying.node_id());
        assert_eq!(survivor.rescue_once().unwrap().pending, 5);
        // Each waits the first retry's backoff (1 s) with its own ±20% jitter, by the
        // database clock: not the same instant for all five.
        assert!(
            db.count("SELECT count(DISTINCT run_at) FROM async_task WHERE failures = 1") > 1,
            "every rescued task came due at the same instant"
        );
        let (early, late) = match db.backend() {
            outbox::Backend::Postgres => ("now() + interval '300 milliseconds'", "now() + interval '1300 milliseconds'"),
            outbox::Backend::Sqlite => (
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '+0.3 seconds')",
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '+1.3 seconds')",
            ),
            outbox::Backend::Mysql => (
                "UTC_TIMESTAMP(3) + INTERVAL 300000 MICROSECOND",
                "UTC_TIMESTAMP(3) + INTERVAL 1300000 MICROSECOND",
            ),
        };
        assert_eq!(
            db.count(&format!("SELECT count(*) FROM async_task WHERE failures = 1 AND run_at BETWEEN {early} AND {late}")),
            5,
            "within the jitter band of the first backoff"
        );
    }

    fn drain_rescues_before_it_claims(db: &TestDb) {
        enqueue_n(db, 2);
        let crashed = quiet_worker(db);
        crashed.claim().unwrap();
        kill_heartbeat(db, crashed.node_id());
        let cron = quiet_worker(db);
        cron.drain().unwrap();
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'pending' AND failures = 1"), 2);
        db.make_all_due();
        assert_eq!(cron.drain().unwrap().tally.done, 2);
    }
}

/// SQLite reads running tasks through `async_task_lease_idx` (`deadline_at IS NOT NULL`),
/// which a completion leaves alone: the node's next claim, or any rescue pass, takes its
/// finished tasks out. A task that goes back to pending or dies leaves it at once.
#[test]
fn sqlite_finished_tasks_leave_the_lease_index_at_the_next_claim_or_rescue() {
    let db = &TestDb::sqlite();
    let in_index_not_running = || {
        db.count(
            "SELECT count(*) FROM async_task WHERE deadline_at IS NOT NULL AND state <> 'running'",
        )
    };
    let running_outside_index = || {
        db.count("SELECT count(*) FROM async_task WHERE deadline_at IS NULL AND state = 'running'")
    };
    let mut registry = ledger_registry("ledger");
    registry.register(
        "fails",
        |_: &outbox::TaskContext, _: &mut outbox::TaskTx| {
            Err(outbox::HandlerError::retry(anyhow::anyhow!("not yet")))
        },
    );
    registry.register(
        "poison",
        |_: &outbox::TaskContext, _: &mut outbox::TaskTx| {
            Err(outbox::HandlerError::permanent(anyhow::anyhow!(
                "bad payload"
            )))
        },
    );
    // The retried task stays not due for the whole test.
    let config = small_config()
        .heartbeat(Duration::from_secs(3600))
        .dead_after(Duration::from_secs(7200))
        .backoff(outbox::Backoff::new(
            Duration::from_secs(3600),
            Duration::from_secs(3600),
        ));
    let w = Worker::new(&db.url, registry, config).unwrap();
    let rescuer = quiet_worker(db);

    enqueue_n(db, 2);
    let tasks = [NewTask::new("fails", "f"), NewTask::new("poison", "p")];
    enqueue_batch(&mut db.conn(), &tasks).unwrap();
    let page = w.claim().unwrap();
    assert_eq!(page.len(), 4);
    assert_eq!(running_outside_index(), 0);
    let tally = w.execute(page);
    assert_eq!((tally.done, tally.retried, tally.dead), (2, 1, 1));
    // The retried and the dead task left the index with their own update; the two done
    // tasks are still in it, until this node's next claim.
    assert_eq!(in_index_not_running(), 2);
    assert_eq!(
        db.count(
            "SELECT count(*) FROM async_task WHERE deadline_at IS NOT NULL AND state = 'done'"
        ),
        2
    );

    enqueue_batch(&mut db.conn(), &[NewTask::new("ledger", "later")]).unwrap();
    let page = w.claim().unwrap();
    assert_eq!(page.len(), 1, "the retry is not due yet");
    assert_eq!((in_index_not_running(), running_outside_index()), (0, 0));
    assert_eq!(w.execute(page).done, 1);
    assert_eq!(in_index_not_running(), 1);

    // A node that claims no more (it exited) leaves its done tasks in the index; any rescue
    // pass takes them out, and leaves a live node's running task, and its deadline, alone.
    let other = quiet_worker(db);
    enqueue_batch(&mut db.conn(), &[NewTask::new("ledger", "kept")]).unwrap();
    let kept = other.claim().unwrap();
    assert_eq!((kept.len(), in_index_not_running()), (1, 1));
    assert_eq!(
        rescuer.rescue_once().unwrap(),
        outbox::RescueReport::default()
    );
    assert_eq!((in_index_not_running(), running_outside_index()), (0, 0));
    let kept_id = kept[0].context.id();
    let deadline_of = |id: i64| {
        db.count(&format!(
            "SELECT count(*) FROM async_task WHERE id = {id} AND deadline_at IS NOT NULL"
        ))
    };
    assert_eq!(
        (db.task(kept_id).state.as_str(), deadline_of(kept_id)),
        ("running", 1)
    );

    // A release (the node is stopping before the handler starts) clears the deadline.
    other
        .stop_flag()
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(other.execute(kept).released, 1);
    assert_eq!(
        (db.task(kept_id).state.as_str(), deadline_of(kept_id)),
        ("pending", 0)
    );

    // So does a rescue: the node stops heartbeating with a task running.
    enqueue_batch(&mut db.conn(), &[NewTask::new("ledger", "dies")]).unwrap();
    let page = w.claim().unwrap();
    assert_eq!(page.len(), 2, "the released task and the new one");
    kill_heartbeat(db, w.node_id());
    assert_eq!(rescuer.rescue_once().unwrap().pending, 2);
    for task in &page {
        let id = task.context.id();
        assert_eq!(
            (db.task(id).state.as_str(), deadline_of(id)),
            ("pending", 0)
        );
    }
    assert_eq!((in_index_not_running(), running_outside_index()), (0, 0));
}

/// Migration 000004 on an SQLite database that already has tasks: the finished ones lose
/// their deadlines, so the new lease index starts with the running tasks only, and a running
/// task without a deadline gets one.
#[test]
fn sqlite_migration_000004_keeps_running_tasks_in_the_lease_index() {
    let db = &TestDb::sqlite();
    // Back to version 3: the running-task index on `state`, deadlines left on finished tasks.
    db.exec(include_str!(
        "../../migrations/sqlite/2026-11-23-000004_lease_index/down.sql"
    ));
    db.exec("DELETE FROM __diesel_schema_migrations WHERE version = '20261123000004'");
    enqueue_n(db, 4);
    db.exec(
        "UPDATE async_task SET owner = 7, claim_token = 1,
                deadline_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+5 minutes'),
                state = CASE biz_id WHEN '0' THEN 'running' WHEN '1' THEN 'done'
                                    WHEN '2' THEN 'dead' ELSE 'running' END",
    );

    // Task 3 was claimed with a timeout past the year 9999: no deadline.
    db.exec("UPDATE async_task SET deadline_at = NULL WHERE biz_id = '3'");

    let applied = outbox::run_migrations(&mut db.conn()).unwrap();
    assert_eq!(applied.len(), 1, "{applied:?}");
    assert_eq!(
        db.count("SELECT count(*) FROM async_task WHERE deadline_at IS NOT NULL"),
        2
    );
    assert_eq!(
        db.count(
            "SELECT count(*) FROM async_task WHERE biz_id = '3' AND deadline_at LIKE '9999-%'"
        ),
        1
    );
    assert_eq!(
        db.count(
            "SELECT count(*) FROM async_task INDEXED BY async_task_lease_idx
             WHERE deadline_at IS NOT NULL AND state = 'running' AND biz_id = '0'"
        ),
        1
    );
    // Their node (7) never existed: rescue finds both running tasks through the new index.
    assert_eq!(quiet_worker(db).rescue_once().unwrap().pending, 2);
    assert_eq!(
        db.count(
            "SELECT count(*) FROM async_task WHERE biz_id IN ('0', '3') AND state = 'pending'"
        ),
        2
    );
}

/// MySQL has no partial indexes: its tenant index and its suspects' index are on generated
/// columns, NULL but while a task is pending (and, for the suspects', a suspect), so that the
/// entries of a task without a tenant, or not a suspect, never move when its state changes.
/// Neither index has the state in it, and through claims, completions, failures and suspects
/// each holds exactly the tasks the claims read it for.
#[cfg(feature = "mysql")]
#[test]
fn mysql_tenant_and_suspect_indexes_hold_only_pending_tasks() {
    use outbox::{TaskContext, TaskTx};
    let db = &TestDb::mysql();
    let mut tasks: Vec<NewTask> = (0..12)
        .map(|i| NewTask::new("ledger", format!("t{i:02}")).tenant(format!("tenant-{}", i % 3)))
        .collect();
    tasks.extend((0..6).map(|i| NewTask::new("ledger", format!("u{i:02}"))));
    tasks.extend((0..4).map(|i| NewTask::new("fails", format!("f{i:02}")).tenant("tenant-0")));
    enqueue_batch(&mut db.conn(), &tasks).unwrap();
    // Two suspects, with a tenant and without.
    db.exec("UPDATE async_task SET suspect = 2 WHERE biz_id IN ('t00', 'u00')");
    let columns = |index: &str| -> Vec<String> {
        #[derive(diesel::QueryableByName)]
        struct Column {
            #[diesel(sql_type = diesel::sql_types::Text, column_name = "Column_name")]
            name: String,
        }
        use diesel::RunQueryDsl;
        let rows: Vec<Column> = diesel::sql_query(format!(
            "SHOW INDEX FROM async_task WHERE Key_name = '{index}'"
        ))
        .load(&mut db.conn())
        .unwrap();
        rows.into_iter().map(|c| c.name).collect()
    };
    assert_eq!(columns("async_task_pending_tenant_idx"), ["pending_tenant"]);
    // The ring compares and groups the generated column as it did the tenant: byte for byte.
    assert_eq!(
        db.count(
            "SELECT count(DISTINCT collation_name) FROM information_schema.columns
              WHERE table_schema = DATABASE() AND table_name = 'async_task'
                AND column_name IN ('tenant', 'pending_tenant')"
        ),
        1
    );
    assert_eq!(
        columns("async_task_suspect_idx"),
        ["pending_suspect", "priority", "run_at", "id"]
    );
    let agree = |when: &str| {
        let tenant_index = db.count(
            "SELECT count(*) FROM async_task FORCE INDEX (async_task_pending_tenant_idx)
              WHERE pending_tenant IS NOT NULL",
        );
        let pending_with_tenant = db.count(
            "SELECT count(*) FROM async_task WHERE state = 'pending' AND tenant IS NOT NULL",
        );
        assert_eq!(tenant_index, pending_with_tenant, "the tenant index {when}");
        let wrong = db.count(
            "SELECT count(*) FROM async_task
              WHERE NOT (pending_tenant <=> CASE WHEN state = 'pending' THEN tenant END)
                 OR NOT (pending_suspect <=> CASE WHEN state = 'pending' AND suspect >= 2 THEN 1 END)",
        );
        assert_eq!(wrong, 0, "generated columns {when}");
        let suspect_index = db.count(
            "SELECT count(*) FROM async_task FORCE INDEX (async_task_suspect_idx)
              WHERE pending_suspect = 1",
        );
        let pending_suspects =
            db.count("SELECT count(*) FROM async_task WHERE state = 'pending' AND suspect >= 2");
        assert_eq!(
            suspect_index, pending_suspects,
            "the suspects' index {when}"
        );
    };
    agree("after the enqueue");
    assert_eq!(
        db.count("SELECT count(*) FROM async_task WHERE pending_suspect = 1"),
        2
    );
    let mut registry = ledger_registry("ledger");
    registry.register(
        "fails",
        |_: &TaskContext, _: &mut TaskTx| -> outbox::HandlerResult {
            Err(anyhow::anyhow!("refused").into())
        },
    );
    let w = Worker::new(&db.url, registry, small_config().page_size(5)).unwrap();
    let claimed = w.claim().unwrap();
    assert!(!claimed.is_empty());
    agree("with a page claimed");
    assert!(db.count("SELECT count(*) FROM async_task WHERE state = 'running' AND pending_tenant IS NULL AND pending_suspect IS NULL") >= 1);
    // The page goes unrun (its tasks stay running, held by this node); dropped, it gives
    // back the turn of a suspect it holds, so that the drain may claim the other one.
    drop(claimed);
    w.drain().unwrap();
    agree("after a drain with failures");
    assert_eq!(
        db.count("SELECT count(*) FROM async_task WHERE state = 'pending' AND keyword = 'ledger'"),
        0,
        "the suspects ran too"
    );
}

/// A new ledger task, leased by `node` (lock claims) until an hour from now; its id.
fn leased_task(db: &TestDb, node: i64) -> i64 {
    let id = outbox::enqueue(&mut db.conn(), &NewTask::new("ledger", "1"))
        .unwrap()
        .id;
    let in_an_hour = match db.backend() {
        outbox::Backend::Mysql => "UTC_TIMESTAMP(3) + INTERVAL 1 HOUR",
        _ => "now() + interval '1 hour'",
    };
    db.exec(&format!(
        "INSERT INTO async_lease (task_id, node_id, token, chunk, deadline_at)
         SELECT id, {node}, claim_token, 1, {in_an_hour} FROM async_task WHERE id = {id}"
    ));
    id
}

server_backends! {
    /// The same for a lease (lock claims): its own pass leaves it, another node's charges it.
    fn a_node_does_not_rescue_its_own_leases_when_its_own_heartbeat_is_stale(db: &TestDb) {
        let w = quiet_worker(db);
        let other = quiet_worker(db);
        let id = leased_task(db, w.node_id());
        kill_heartbeat(db, w.node_id());
        assert_eq!(w.rescue_once().unwrap(), outbox::RescueReport::default());
        assert_eq!(db.count("SELECT count(*) FROM async_lease"), 1);
        assert_eq!(other.rescue_once().unwrap().pending, 1);
        assert_eq!((db.task(id).state.as_str(), db.task(id).failures), ("pending", 1));
    }

    /// Rescue passes over a dead node's task or lease whose row another transaction holds (an
    /// operator's open transaction, a completion under way; on MySQL also a completion frozen
    /// midway, whose session nothing ends) and rescues the rest at once, stamped claims and
    /// leases alike; the held ones are rescued once their holder lets go. Rescue used to wait
    /// for the row: on MySQL until the lock wait timeout failed the whole pass, on PostgreSQL
    /// (leases) for as long as the holder kept it.
    fn a_dead_nodes_lease_of_a_cancelled_task_is_dropped_with_the_cancels_note(db: &TestDb) {
        // A cancel that did not see the lease wrote no note, and the chunk's process died
        // before it could: rescue, which drops the lease, writes it (its handler may have
        // run), and charges no failure to a cancelled task.
        let dying = quiet_worker(db);
        let survivor = quiet_worker(db);
        let id = leased_task(db, dying.node_id());
        db.exec(&format!(
            "UPDATE async_task SET state = 'cancelled', finished_at = updated_at WHERE id = {id}"
        ));
        kill_heartbeat(db, dying.node_id());
        let report = survivor.rescue_once().unwrap();
        assert_eq!(report.pending + report.dead, 0, "{report:?}");
        assert_eq!(db.count("SELECT count(*) FROM async_lease"), 0, "the lease dropped");
        let task = db.task(id);
        let note = Some("cancelled while running: its handler may have run".to_owned());
        assert_eq!((task.state.as_str(), task.failures, &task.last_error), ("cancelled", 0, &note));
    }

    fn rescue_passes_over_a_row_another_transaction_holds(db: &TestDb) {
        let dying = quiet_worker(db);
        let survivor = quiet_worker(db);
        let new_tasks = |prefix: &str, n: usize| -> Vec<i64> {
            let tasks: Vec<NewTask> = (0..n)
                .map(|i| NewTask::new("ledger", format!("{prefix}{i}")))
                .collect();
            let keys = enqueue_batch(&mut db.conn(), &tasks).unwrap();
            keys.iter().map(|k| k.id).collect()
        };
        let stamped = new_tasks("s", 2);
        assert_eq!(dying.claim().unwrap().len(), 2);
        let leased = new_tasks("l", 3);
        let (in_an_hour, by_key) = match db.backend() {
            outbox::Backend::Mysql => ("UTC_TIMESTAMP(3) + INTERVAL 1 HOUR", "FORCE INDEX (PRIMARY)"),
            _ => ("now() + interval '1 hour'", ""),
        };
        for &id in &leased {
            db.exec(&format!(
                "INSERT INTO async_lease (task_id, node_id, token, chunk, deadline_at)
                 SELECT id, {}, claim_token, 1, {in_an_hour} FROM async_task WHERE id = {id}",
                dying.node_id()
            ));
        }
        kill_heartbeat(db, dying.node_id());

        // One stamped and one leased task held, as a completion frozen after its locking read
        // (on MySQL through the primary key, as a completion reads them: a scan of this small
        // table would lock every row); and a third lease, as a completion that has deleted it
        // and not committed.
        let holds = [
            format!(
                "SELECT id FROM async_task {by_key} WHERE id IN ({}, {}) FOR UPDATE",
                stamped[0], leased[0]
            ),
            format!("DELETE FROM async_lease WHERE task_id = {}", leased[2]),
        ];
        let report = rescue_while_held(db, &survivor, &holds).unwrap();
        assert_eq!(report.pending, 2, "the two tasks no one holds: {report:?}");
        assert_eq!(db.task(stamped[1]).state, "pending");
        assert_eq!(db.task(leased[1]).failures, 1);
        assert_eq!(db.task(stamped[0]).state, "running", "held: passed over");
        for id in [leased[0], leased[2]] {
            assert_eq!(db.task(id).failures, 0, "task {id}: held, passed over");
            assert_eq!(
                db.count(&format!("SELECT count(*) FROM async_lease WHERE task_id = {id}")),
                1,
                "task {id}: held, its lease left for the next pass"
            );
        }

        let report = survivor.rescue_once().unwrap();
        assert_eq!(report.pending, 3, "the three let go: {report:?}");
        for id in [stamped[0], leased[0], leased[2]] {
            let row = db.task(id);
            assert_eq!(
                (row.state.as_str(), row.failures),
                ("pending", 1),
                "task {id}"
            );
        }
        assert_eq!(db.count("SELECT count(*) FROM async_lease"), 0);
    }

    /// Rescue passes over a stamped task past its deadline whose row another transaction
    /// holds, and charges the others at once; the held one is charged once its holder lets
    /// go. The holder is as a completion frozen between its `UPDATE` and its `COMMIT` (a
    /// SIGSTOP, a paused VM) while its node still counts as live: on PostgreSQL nothing ends
    /// that session before the node's heartbeat is `dead_after` old, and rescue, with no lock
    /// timeout, used to wait for the row for as long as the session lived, every rescuer of
    /// the fleet with it.
    fn rescue_passes_over_a_late_task_whose_row_another_transaction_holds(db: &TestDb) {
        enqueue_n(db, 2);
        let late = quiet_worker(db);
        let ids: Vec<i64> = late.claim().unwrap().iter().map(|t| t.context.id()).collect();
        assert_eq!(ids.len(), 2);
        pass_deadlines(db);
        let hold = match db.backend() {
            outbox::Backend::Mysql => "UPDATE async_task FORCE INDEX (PRIMARY) SET updated_at = UTC_TIMESTAMP(3) WHERE id = ",
            _ => "UPDATE async_task SET updated_at = now() WHERE id = ",
        };
        let rescuer = quiet_worker(db);
        let report = rescue_while_held(db, &rescuer, &[format!("{hold}{}", ids[0])]).unwrap();
        assert_eq!(report.pending, 1, "the task no one holds: {report:?}");
        assert_eq!((db.task(ids[1]).state.as_str(), db.task(ids[1]).failures), ("pending", 1));
        assert_eq!(db.task(ids[0]).state, "running", "held: passed over");
        let report = rescuer.rescue_once().unwrap();
        assert_eq!(report.pending, 1, "let go: {report:?}");
        assert_eq!((db.task(ids[0]).state.as_str(), db.task(ids[0]).failures), ("pending", 1));
    }
}

/// One rescue pass of `rescuer` while another connection holds the rows that the statements
/// `holds` lock, in a transaction it leaves open; the holder lets go when the pass has
/// returned, or after 20 s if it has not. Fails if the pass waited for the rows that long.
fn rescue_while_held(
    db: &TestDb,
    rescuer: &Worker,
    holds: &[String],
) -> outbox::Result<outbox::RescueReport> {
    use diesel::RunQueryDsl;
    let mut holder = db.conn();
    diesel::sql_query("BEGIN").execute(&mut holder).unwrap();
    for hold in holds {
        diesel::sql_query(hold).execute(&mut holder).unwrap();
    }
    let (sent, passed) = std::sync::mpsc::channel();
    let report = std::thread::scope(|s| {
        s.spawn(|| sent.send(rescuer.rescue_once()).unwrap());
        let report = passed.recv_timeout(Duration::from_secs(20));
        // Let go in any case, so that a waiting pass returns and the scope ends.
        diesel::sql_query("ROLLBACK").execute(&mut holder).unwrap();
        report
    });
    report.expect("the rescue pass waited for the held rows")
}

server_backends! {
    /// A task that rescue charges dead at its last attempt has its descendants cancelled,
    /// with locks that wait. When another transaction holds a descendant's row (a completion
    /// of the child's other parent frozen before its commit, an operator), that parent alone
    /// is left for a later pass, after rescue's short lock timeout: the pass charges the rest,
    /// stamped and leased, instead of waiting for as long as the holder lives (PostgreSQL: no
    /// lock timeout; MySQL: 50 s) or failing whole. The pass after the holder lets go charges
    /// the parents dead and cancels their children.
    fn a_task_dying_with_a_held_descendant_is_left_for_a_later_pass_and_holds_up_nothing(db: &TestDb) {
        let new_task = |task: NewTask| enqueue(&mut db.conn(), &task).unwrap().id;
        let parents = [
            new_task(NewTask::new("ledger", "stamped parent").max_attempts(1)),
            new_task(NewTask::new("ledger", "other").max_attempts(5)),
        ];
        // Two children each: the cascade's locking read of several rows is what, on MySQL,
        // can leave a cached statement broken when it times out.
        let children = [
            new_task(NewTask::new("ledger", "stamped child").after(parents[0])),
            new_task(NewTask::new("ledger", "stamped child 2").after(parents[0])),
        ];
        let late = quiet_worker(db);
        assert_eq!(late.claim().unwrap().len(), 2, "the parent and the other");
        pass_deadlines(db);
        // A leased parent at its last attempt too, its lease past its deadline.
        let leased = new_task(NewTask::new("ledger", "leased parent").max_attempts(1));
        let leased_child = new_task(NewTask::new("ledger", "leased child").after(leased));
        let leased_child_2 = new_task(NewTask::new("ledger", "leased child 2").after(leased));
        let (lapsed, by_key) = match db.backend() {
            outbox::Backend::Mysql => ("UTC_TIMESTAMP(3) - INTERVAL 1 SECOND", "FORCE INDEX (PRIMARY)"),
            _ => ("now() - interval '1 second'", ""),
        };
        db.exec(&format!(
            "INSERT INTO async_lease (task_id, node_id, token, chunk, deadline_at)
             SELECT id, {}, claim_token, 1, {lapsed} FROM async_task WHERE id = {leased}",
            late.node_id()
        ));
        let hold = format!(
            "SELECT id FROM async_task {by_key} WHERE id IN ({}, {leased_child}) FOR UPDATE",
            children[0]
        );
        let rescuer = quiet_worker(db);
        let report = rescue_while_held(db, &rescuer, &[hold]).unwrap();
        assert_eq!(
            (report.pending, report.dead, report.deferred),
            (1, 0, 2),
            "the other charged, the two parents left: {report:?}"
        );
        assert_eq!(db.task(parents[1]).failures, 1);
        for id in [parents[0], leased] {
            assert_eq!(db.task(id).failures, 0, "task {id}: left as it was");
        }
        assert_eq!(db.count("SELECT count(*) FROM async_lease"), 1, "its lease too");

        let report = rescuer.rescue_once().unwrap();
        assert_eq!((report.dead, report.deferred), (2, 0), "{report:?}");
        for id in [parents[0], leased] {
            assert_eq!(db.task(id).state, "dead", "task {id}");
        }
        for id in [children[0], children[1], leased_child, leased_child_2] {
            assert_eq!(db.task(id).state, "cancelled", "task {id}");
        }
    }
}

/// A rescue pass ends the session of a dead node's transaction (`pg_terminate_backend`), so
/// that the task whose row that transaction held is charged: in the same pass when the
/// session is gone by the time the charge reaches the row, else (it is passed over, `SKIP
/// LOCKED`) at the next. The holder here is a transaction marked as the engine marks its own
/// (the shared advisory locks of its node and of its run), as a completion frozen before its
/// commit; nothing else would end it.
#[test]
fn a_rescue_pass_ends_a_dead_nodes_session_and_charges_the_task_it_held() {
    use diesel::RunQueryDsl;
    let db = &TestDb::postgres();
    enqueue_n(db, 2);
    let dying = quiet_worker(db);
    let ids: Vec<i64> = dying
        .claim()
        .unwrap()
        .iter()
        .map(|t| t.context.id())
        .collect();
    assert_eq!(ids.len(), 2);
    let mut holder = db.conn();
    diesel::sql_query("BEGIN").execute(&mut holder).unwrap();
    // The classes of the node's and the run's locks (`driver/postgres/lease.rs`).
    diesel::sql_query(format!(
        "SELECT pg_advisory_xact_lock_shared(1868721665, {}),
                pg_advisory_xact_lock_shared(1868722689, 7)",
        dying.node_id() & 0x7fff_ffff
    ))
    .execute(&mut holder)
    .unwrap();
    diesel::sql_query(format!(
        "UPDATE async_task SET updated_at = now() WHERE id = {}",
        ids[0]
    ))
    .execute(&mut holder)
    .unwrap();
    kill_heartbeat(db, dying.node_id());
    let rescuer = quiet_worker(db);
    let first = rescuer.rescue_once().unwrap();
    assert_eq!(first.sessions_ended, 1, "{first:?}");
    assert_eq!(db.task(ids[1]).failures, 1, "the task no one held, at once");
    let second = rescuer.rescue_once().unwrap();
    assert_eq!(first.pending + second.pending, 2, "{first:?} {second:?}");
    for &id in &ids {
        assert_eq!(db.task(id).failures, 1, "task {id}");
    }
}

/// A node whose own heartbeat is stale does not end its own sessions at its own rescue pass
/// (PostgreSQL: a transaction marked as its; MySQL: a session tagged as its); another node's
/// pass does. Before, a node whose replies were cut ended its own chunks' sessions (seed 6621).
#[test]
fn a_node_does_not_end_its_own_sessions_when_its_own_heartbeat_is_stale() {
    use diesel::RunQueryDsl;
    let mut dbs = vec![TestDb::postgres()];
    #[cfg(feature = "mysql")]
    dbs.push(TestDb::mysql());
    for db in &dbs {
        let w = quiet_worker(db);
        let other = quiet_worker(db);
        let mut holder = db.conn();
        let hold = match db.backend() {
            // The classes of the node's and the run's locks (`driver/postgres/session.rs`).
            outbox::Backend::Postgres => format!(
                "BEGIN; SELECT pg_advisory_xact_lock_shared(1868721665, {}),
                               pg_advisory_xact_lock_shared(1868722689, 7)",
                w.node_id() & 0x7fff_ffff
            ),
            // The session's tag (`driver/mysql/session.rs`).
            _ => format!(
                "DO GET_LOCK(CONCAT('outbox-node-', {}, '-', CONNECTION_ID()), 0)",
                w.node_id()
            ),
        };
        diesel::connection::SimpleConnection::batch_execute(&mut holder, &hold).unwrap();
        kill_heartbeat(db, w.node_id());
        assert_eq!(
            w.rescue_once().unwrap().sessions_ended,
            0,
            "{:?}",
            db.backend()
        );
        // On MySQL with the node's pooled connection its own pass used, tagged as its too.
        let ended = other.rescue_once().unwrap().sessions_ended;
        assert!(ended >= 1, "{:?}: {ended}", db.backend());
        assert!(
            diesel::sql_query("SELECT 1").execute(&mut holder).is_err(),
            "{:?}: the session ended",
            db.backend()
        );
    }
}

/// A claim's transaction is marked as the engine's others are, on PostgreSQL: a process
/// frozen inside one (between its statement and its commit, a page of tasks locked) holds
/// those rows from every other claim, and from rescue, until its session ends, and only a
/// marked session is ended by a rescue pass. The claim here is held inside its transaction
/// by a table lock another session holds, a stand-in for a freeze at that point: the stamp
/// claim of a strict worker and the lease claim of a batched one. The pass ends it.
#[test]
fn a_rescue_pass_ends_a_dead_nodes_claim_inside_its_transaction() {
    use diesel::RunQueryDsl;
    use std::sync::mpsc;
    for style in [outbox::ClaimStyle::Stamp, outbox::ClaimStyle::Lock] {
        let db = &TestDb::postgres();
        enqueue_n(db, 2);
        let lock = style == outbox::ClaimStyle::Lock;
        let config = small_config()
            .heartbeat(Duration::from_secs(3600))
            .dead_after(Duration::from_secs(7200))
            .commit_batch(if lock { 2 } else { 1 })
            .queue(if lock { 0 } else { 8 })
            .claim_style(style);
        let dying = Worker::new(&db.url, ledger_registry("ledger"), config).unwrap();
        let node = dying.node_id();
        let mut holder = db.conn();
        diesel::sql_query("BEGIN").execute(&mut holder).unwrap();
        diesel::sql_query("LOCK TABLE async_task IN ACCESS EXCLUSIVE MODE")
            .execute(&mut holder)
            .unwrap();
        let (sent, claimed) = mpsc::channel();
        let claimer = std::thread::spawn(move || {
            let outcome = match style {
                outbox::ClaimStyle::Stamp => dying.claim().map(|c| c.len() as u64),
                _ => dying.run_once().map(|t| t.done),
            };
            let _ = sent.send(outcome.map_err(|e| e.to_string()));
        });
        // The claim waits for the table, inside its transaction.
        let waiting = "SELECT count(*) FROM pg_stat_activity
                        WHERE datname = current_database() AND wait_event_type = 'Lock'";
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while db.count(waiting) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{style:?}: the claim never waited"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        kill_heartbeat(db, node);
        let rescuer = quiet_worker(db);
        let pass = std::thread::spawn(move || rescuer.rescue_once());
        // Ended, the claim returns (its connection gone); not ended, it waits on.
        let outcome = claimed.recv_timeout(Duration::from_secs(10));
        diesel::sql_query("ROLLBACK").execute(&mut holder).unwrap();
        let report = pass.join().unwrap();
        claimer.join().unwrap();
        let outcome =
            outcome.unwrap_or_else(|_| panic!("{style:?}: the claim's session was not ended"));
        assert!(outcome.is_err(), "{style:?}: {outcome:?}");
        assert_eq!(report.unwrap().sessions_ended, 1, "{style:?}");
        assert_eq!(
            db.count("SELECT count(*) FROM async_task WHERE state = 'pending'"),
            2
        );
    }
}

/// The sessions of this test's database that say they work for `node` (the named lock of
/// `driver/mysql/session.rs`).
#[cfg(feature = "mysql")]
fn sessions_of(db: &TestDb, node: i64) -> i64 {
    db.count(&format!(
        "SELECT count(*) FROM information_schema.PROCESSLIST p
          WHERE p.DB = DATABASE()
            AND IS_USED_LOCK(CONCAT('outbox-node-', {node}, '-', p.ID)) = p.ID"
    ))
}

/// On MySQL, a process frozen (SIGSTOP, a paused VM) inside a task's transaction holds the
/// rows it locked until its session ends, and no statement of rescue may take them: MySQL
/// has no lock a transaction holds to its end that another session can list. The worker's
/// connections say which node they work for (a named lock), and a rescue pass ends those of
/// a node no longer live, here a handler's transaction frozen after it locked its own task's
/// row, as a completion's locking read does; in strict mode, and in a batched chunk of
/// stamp claims and of lock claims. The node's tasks are charged in the same pass; the
/// sessions of a live node are left alone; the handler, woken, writes nothing.
#[cfg(feature = "mysql")]
#[test]
fn a_rescue_pass_ends_a_frozen_nodes_sessions_on_mysql_and_charges_the_task_it_held() {
    use outbox::ClaimStyle;
    // Batched: a page of two tasks is one chunk, run on one thread, the frozen task first
    // (one task alone would run as in strict mode). Strict: one task (a second one would run
    // beside it, on the claiming thread).
    let batched = small_config().threads(1).commit_batch(10);
    for (name, config, tasks) in [
        ("strict", small_config(), 1),
        (
            "batched, stamp claims",
            batched.clone().claim_style(ClaimStyle::Stamp),
            2,
        ),
        (
            "batched, lock claims",
            batched.queue(0).claim_style(ClaimStyle::Lock),
            2,
        ),
    ] {
        frozen_inside_a_task(name, config, tasks);
    }
}

#[cfg(feature = "mysql")]
fn frozen_inside_a_task(name: &str, config: outbox::WorkerConfig, tasks: usize) {
    use diesel::RunQueryDsl;
    use std::sync::{mpsc, Mutex};
    let db = &TestDb::mysql();
    // A live node whose claim tagged its connection: left alone.
    let live = quiet_worker(db);
    assert!(live.claim().unwrap().is_empty());
    assert_eq!(
        sessions_of(db, live.node_id()),
        1,
        "{name}: a claim's session says its node"
    );
    enqueue_n(db, tasks);
    let (held_tx, held_rx) = mpsc::channel::<i64>();
    let (wake_tx, wake_rx) = mpsc::channel::<()>();
    let (held_tx, wake_rx) = (Mutex::new(held_tx), Mutex::new(wake_rx));
    let first = std::sync::atomic::AtomicBool::new(true);
    let mut registry = outbox::Registry::new();
    registry.register(
        "ledger",
        move |task: &outbox::TaskContext, tx: &mut outbox::TaskTx| {
            diesel::sql_query(format!(
                "SELECT id FROM async_task WHERE id = {} FOR UPDATE",
                task.id()
            ))
            .execute(tx.conn()?)?;
            // The first handler to run freezes until the test wakes it; the others (after
            // it: the chunk's other task, a rerun) run through.
            if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                held_tx.lock().unwrap().send(task.id()).unwrap();
                let _ = wake_rx.lock().unwrap().recv();
            }
            crate::insert_ledger_row(task, tx.conn()?)?;
            Ok(())
        },
    );
    let config = config
        .heartbeat(Duration::from_secs(3600))
        .dead_after(Duration::from_secs(7200));
    let frozen = Worker::new(&db.url, registry, config).unwrap();
    std::thread::scope(|scope| {
        // Owned here, so that a failed assertion wakes the handler as it unwinds.
        let wake_tx = wake_tx;
        let run = scope.spawn(|| frozen.run_once());
        let id = held_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the handler holds its row");
        assert!(sessions_of(db, frozen.node_id()) >= 1, "{name}");
        let node = frozen.node_id();
        // Stamped (running under it) or leased by it.
        let held = db.count(&format!(
            "SELECT count(*) FROM async_task WHERE owner = {node} AND state = 'running'"
        )) + db.count(&format!(
            "SELECT count(*) FROM async_lease WHERE node_id = {node}"
        ));
        assert!(held >= 1, "{name}");
        kill_heartbeat(db, frozen.node_id());
        let report = quiet_worker(db).rescue_once().unwrap();
        assert!(report.sessions_ended >= 1, "{name}: {report:?}");
        assert_eq!(
            i64::try_from(report.pending).unwrap(),
            held,
            "{name}: all it held charged in the same pass: {report:?}"
        );
        assert_eq!(sessions_of(db, frozen.node_id()), 0, "{name}");
        assert_eq!(
            sessions_of(db, live.node_id()),
            1,
            "{name}: a live node's session kept"
        );
        let task = db.task(id);
        assert_eq!(
            (task.state.as_str(), task.failures),
            ("pending", 1),
            "{name}"
        );
        wake_tx.send(()).unwrap();
        let _ = run.join().unwrap();
        assert_eq!(
            db.count("SELECT count(*) FROM async_task WHERE state = 'pending' AND failures = 1"),
            held,
            "{name}: fenced out"
        );
        assert_eq!(
            db.count("SELECT count(*) FROM test_ledger"),
            0,
            "{name}: nothing written"
        );
    });
}
