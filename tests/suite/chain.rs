//! Parent → child chains: a child is blocked until every parent is done, released in the
//! parent's completion transaction, and cancelled with its descendants when a parent ends
//! dead or cancelled.

use std::time::Duration;

use diesel::prelude::*;
use outbox::prune::{prune, PruneParams};
use outbox::{
    cancel, enqueue, enqueue_batch, retry, DbConnection, Error, HandlerResult, NewTask, Registry,
    TaskContext, TaskState, TaskTx, Worker,
};

use crate::support::TestDb;
use crate::{insert_ledger_row, small_config, worker};

/// A handler that writes its ledger row only if every parent of its task is done, as seen
/// from inside its own transaction, and fails otherwise: a child that ran too early is a
/// failure on record, never a silent success.
fn ledger_after_parents(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
    let conn = tx.conn()?;
    let early = parents_not_done(conn, task.id())?;
    if early > 0 {
        return Err(
            anyhow::anyhow!("task {} ran while {early} parents were not done", task.id()).into(),
        );
    }
    insert_ledger_row(task, conn)?;
    Ok(())
}

/// Every task that failed, with its last error.
fn failures(db: &TestDb) -> Vec<(i64, String)> {
    #[derive(QueryableByName)]
    struct Failed {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        last_error: Option<String>,
    }
    let rows: Vec<Failed> =
        diesel::sql_query("SELECT id, last_error FROM async_task WHERE failures > 0 ORDER BY id")
            .load(&mut db.conn())
            .expect("failed tasks");
    rows.into_iter()
        .map(|f| (f.id, f.last_error.unwrap_or_default()))
        .collect()
}

fn parents_not_done(conn: &mut DbConnection, id: i64) -> QueryResult<i64> {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let row: N = diesel::sql_query(format!(
        "SELECT count(*) AS n FROM async_task_parent l JOIN async_task p ON p.id = l.parent_id
          WHERE l.child_id = {id} AND p.state <> 'done'"
    ))
    .get_result(conn)?;
    Ok(row.n)
}

fn registry(keywords: &[&str]) -> Registry {
    let mut registry = Registry::new();
    for keyword in keywords {
        registry.register(keyword, ledger_after_parents);
    }
    registry
}

fn failing(_: &TaskContext, _: &mut TaskTx) -> HandlerResult {
    Err(anyhow::anyhow!("the parent fails").into())
}

/// Whether a session of `db`'s database comes to wait for a lock within 10 s. SQLite has one
/// writer at a time: a writer waits before it reads anything, so it counts as waiting.
fn waits_for_a_lock(db: &TestDb) -> bool {
    let sql = match db.backend() {
        outbox::Backend::Sqlite => return true,
        outbox::Backend::Postgres => {
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'"
        }
        // MariaDB shows the cancel's locking read as executing (not always as a lock wait
        // in INNODB_TRX): a statement of this database running for a second is the one.
        outbox::Backend::Mysql => {
            "SELECT count(*) FROM information_schema.PROCESSLIST
              WHERE DB = DATABASE() AND ID <> CONNECTION_ID()
                AND COMMAND IN ('Query', 'Execute') AND TIME >= 1"
        }
    };
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while db.count(sql) == 0 {
        if std::time::Instant::now() > give_up {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

fn state(db: &TestDb, id: i64) -> String {
    db.task(id).state
}

every_backend! {
    fn a_child_is_blocked_until_its_parent_is_done_then_runs(db: &TestDb) {
        let parent = enqueue(&mut db.conn(), &NewTask::new("step", "1")).unwrap().id;
        let child = enqueue(&mut db.conn(), &NewTask::new("step", "2").after(parent)).unwrap();
        assert!(child.created);
        assert_eq!(state(db, child.id), "blocked");
        let w = worker(db, registry(&["step"]));
        let first = w.run_once().unwrap();
        assert_eq!((first.claimed, first.done), (1, 1), "only the parent is claimed: {first:?}");
        assert_eq!(state(db, parent), "done");
        assert_eq!(state(db, child.id), "pending", "released by the parent's completion");
        assert_eq!(db.ledger_rows(child.id), 0);
        assert_eq!(w.run_once().unwrap().done, 1);
        assert_eq!(db.ledger_rows(child.id), 1);
        // A parent already done leaves a new child pending at once.
        let late = enqueue(&mut db.conn(), &NewTask::new("step", "3").after(parent)).unwrap();
        assert_eq!(state(db, late.id), "pending");
    }

    fn a_failed_parent_keeps_its_child_blocked_and_a_dead_one_cancels_every_descendant(db: &TestDb) {
        let parent = enqueue(&mut db.conn(), &NewTask::new("flaky", "p").max_attempts(2)).unwrap().id;
        let child = enqueue(&mut db.conn(), &NewTask::new("step", "c").after(parent)).unwrap().id;
        let grandchild = enqueue(&mut db.conn(), &NewTask::new("step", "g").after(child)).unwrap().id;
        let mut registry = registry(&["step"]);
        registry.register("flaky", failing);
        let w = worker(db, registry);
        assert_eq!(w.run_once().unwrap().retried, 1);
        assert_eq!(state(db, parent), "pending", "retried");
        assert_eq!(state(db, child), "blocked", "the failure rolled back: nothing released");
        db.make_all_due();
        assert_eq!(w.run_once().unwrap().dead, 1);
        assert_eq!(state(db, parent), "dead");
        for id in [child, grandchild] {
            let row = db.task(id);
            assert_eq!(row.state, "cancelled", "task {id}");
            assert_eq!(row.last_error.as_deref(), Some(format!("parent task {parent} is dead").as_str()));
        }
        assert_eq!(w.run_once().unwrap().claimed, 0);
        // A child enqueued after a dead parent is cancelled at once, and says why.
        let orphan = enqueue(&mut db.conn(), &NewTask::new("step", "o").after(parent)).unwrap().id;
        assert_eq!(state(db, orphan), "cancelled");
        assert_eq!(db.task(orphan).last_error.as_deref(), Some(format!("parent task {parent} is dead").as_str()));
    }

    fn fan_in_waits_for_every_parent_and_fan_out_releases_every_child(db: &TestDb) {
        let a = enqueue(&mut db.conn(), &NewTask::new("step.a", "1")).unwrap().id;
        let b = enqueue(&mut db.conn(), &NewTask::new("step.b", "1")).unwrap().id;
        let both = enqueue(&mut db.conn(), &NewTask::new("step", "both").after(a).after(b)).unwrap().id;
        let fan: Vec<i64> = (0..3)
            .map(|n| enqueue(&mut db.conn(), &NewTask::new("step", format!("fan-{n}")).after(a)).unwrap().id)
            .collect();
        let w = worker(db, registry(&["step.a"]));
        assert_eq!(w.run_once().unwrap().done, 1);
        for id in &fan {
            assert_eq!(state(db, *id), "pending");
        }
        assert_eq!(state(db, both), "blocked", "still waits for b");
        assert_eq!(db.count(&format!("SELECT blocked_by FROM async_task WHERE id = {both}")), 1);
        let w = worker(db, registry(&["step.b"]));
        assert_eq!(w.run_once().unwrap().done, 1);
        assert_eq!(state(db, both), "pending");
        let w = worker(db, registry(&["step"]));
        assert_eq!(w.drain().unwrap().tally.done, 4);
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 6);
    }

    fn a_cancelled_parent_cancels_a_deep_chain_and_a_fan_in_child(db: &TestDb) {
        let root = enqueue(&mut db.conn(), &NewTask::new("step", "0")).unwrap().id;
        let mut chain = vec![root];
        for depth in 1..=6 {
            let parent = *chain.last().unwrap();
            chain.push(enqueue(&mut db.conn(), &NewTask::new("step", depth.to_string()).after(parent)).unwrap().id);
        }
        let other = enqueue(&mut db.conn(), &NewTask::new("other", "x")).unwrap().id;
        let joined = enqueue(&mut db.conn(), &NewTask::new("step", "joined").after(other).after(chain[3])).unwrap().id;
        assert!(cancel(&mut db.conn(), root).unwrap().cancelled);
        for id in chain.iter().skip(1).chain([&joined]) {
            let row = db.task(*id);
            assert_eq!(row.state, "cancelled", "task {id}");
            assert_eq!(row.last_error.as_deref(), Some(format!("parent task {root} is cancelled").as_str()));
        }
        assert_eq!(state(db, other), "pending", "a parent is not cancelled by its child");
    }

    fn parents_by_key_in_the_batch_or_the_table_and_a_missing_parent_writes_nothing(db: &TestDb) {
        let batch = [
            NewTask::new("order.pack", "42"),
            NewTask::new("order.ship", "42").after_key("order.pack", "42"),
        ];
        let made = enqueue_batch(&mut db.conn(), &batch).unwrap();
        assert_eq!(state(db, made[1].id), "blocked");
        let invoice = NewTask::new("order.invoice", "42").after_key("order.ship", "42");
        let invoice = enqueue(&mut db.conn(), &invoice).unwrap().id;
        assert_eq!(db.count(&format!("SELECT parent_id FROM async_task WHERE id = {invoice}")), made[1].id);
        let before = db.count("SELECT count(*) FROM async_task");
        let missing = [
            NewTask::new("order.mail", "42"),
            NewTask::new("order.mail", "43").after_key("order.pack", "nope"),
        ];
        let error = enqueue_batch(&mut db.conn(), &missing).unwrap_err();
        assert!(matches!(error, Error::InvalidTask { .. }), "{error}");
        assert_eq!(error.to_string(), "invalid task order.mail/43: its parent (order.pack, nope) does not exist");
        let error = enqueue(&mut db.conn(), &NewTask::new("order.mail", "44").after(invoice + 100)).unwrap_err();
        assert_eq!(error.to_string(), format!("invalid task order.mail/44: its parent task {} does not exist", invoice + 100));
        let error = enqueue(&mut db.conn(), &NewTask::new("a", "1").after_key("a", "1")).unwrap_err();
        assert!(error.to_string().contains("cannot be its own parent"), "{error}");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), before, "nothing written");
        // A duplicate keeps the parents it was created with.
        let again = enqueue(&mut db.conn(), &NewTask::new("order.ship", "42").after(invoice)).unwrap();
        assert!(!again.created);
        assert_eq!(db.count(&format!("SELECT count(*) FROM async_task_parent WHERE child_id = {}", made[1].id)), 1);
    }

    fn the_schema_refuses_a_link_that_could_close_a_loop_or_reach_a_started_child(db: &TestDb) {
        let a = enqueue(&mut db.conn(), &NewTask::new("step", "a")).unwrap().id;
        let b = enqueue(&mut db.conn(), &NewTask::new("step", "b").after(a)).unwrap().id;
        let backwards = diesel::sql_query(format!(
            "INSERT INTO async_task_parent (child_id, parent_id) VALUES ({a}, {b})"
        ))
        .execute(&mut db.conn())
        .unwrap_err();
        assert!(backwards.to_string().contains("async_task_parent_order_check"), "{backwards}");
        let c = enqueue(&mut db.conn(), &NewTask::new("step", "c")).unwrap().id;
        let w = worker(db, registry(&["step"]));
        w.drain().unwrap();
        assert_eq!(state(db, c), "done");
        let started = diesel::sql_query(format!(
            "INSERT INTO async_task_parent (child_id, parent_id) VALUES ({c}, {a})"
        ))
        .execute(&mut db.conn())
        .unwrap_err();
        assert!(started.to_string().contains("async_task_parent: "), "{started}");
        assert!(!started.to_string().contains("pkey"), "{started}");
        assert_eq!(db.count(&format!("SELECT count(*) FROM async_task_parent WHERE child_id = {c}")), 0);
    }

    fn a_producers_plain_insert_with_a_parent_id_blocks_the_child(db: &TestDb) {
        let parent = enqueue(&mut db.conn(), &NewTask::new("step", "p")).unwrap().id;
        db.exec(&format!(
            "INSERT INTO async_task (keyword, biz_id, parent_id) VALUES ('step', 'c', {parent})"
        ));
        let child = db.count("SELECT id FROM async_task WHERE biz_id = 'c'");
        assert_eq!(state(db, child), "blocked");
        let missing = diesel::sql_query(
            "INSERT INTO async_task (keyword, biz_id, parent_id) VALUES ('step', 'd', 0)",
        )
        .execute(&mut db.conn())
        .unwrap_err();
        assert!(missing.to_string().contains("does not exist"), "{missing}");
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE biz_id = 'd'"), 0);
        let w = worker(db, registry(&["step"]));
        assert_eq!(w.drain().unwrap().tally.done, 2);
        assert_eq!(db.ledger_rows(child), 1);
    }

    fn a_link_on_a_connection_whose_shorthand_insert_failed_still_blocks_the_child(db: &TestDb) {
        // A shorthand insert whose link row breaks a rule (its parent is not older than the
        // child: the child takes a free smaller id) fails after the task row was written.
        let gap = enqueue(&mut db.conn(), &NewTask::new("step", "gap")).unwrap().id;
        let newer = enqueue(&mut db.conn(), &NewTask::new("step", "newer")).unwrap().id;
        db.exec(&format!("DELETE FROM async_task WHERE id = {gap}"));
        let mut conn = db.conn();
        let refused = diesel::sql_query(format!(
            "INSERT INTO async_task (id, keyword, biz_id, parent_id) VALUES ({gap}, 'step', 'c0', {newer})"
        ))
        .execute(&mut conn)
        .unwrap_err();
        assert!(refused.to_string().contains("async_task_parent"), "{refused}");
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE biz_id = 'c0'"), 0);
        // The same connection then links a child to a parent (both enqueued elsewhere) with a
        // plain link row, as a producer adding a parent does: the child is blocked.
        let parent = enqueue(&mut db.conn(), &NewTask::new("step", "p")).unwrap().id;
        let child = enqueue(&mut db.conn(), &NewTask::new("step", "c")).unwrap().id;
        diesel::sql_query(format!(
            "INSERT INTO async_task_parent (child_id, parent_id) VALUES ({child}, {parent})"
        ))
        .execute(&mut conn)
        .unwrap();
        assert_eq!(state(db, child), "blocked");
    }

    fn a_grandchild_linked_while_its_ancestor_is_cancelled_is_cancelled_too(db: &TestDb) {
        let root = enqueue(&mut db.conn(), &NewTask::new("step", "root")).unwrap().id;
        let middle = enqueue(&mut db.conn(), &NewTask::new("step", "middle").after(root)).unwrap().id;
        let late = enqueue(&mut db.conn(), &NewTask::new("step", "late")).unwrap().id;
        // A producer links `late` under `middle` and holds its transaction open (the link
        // locks `middle`) while the root's cancel reads the tree and waits for `middle`.
        let mut producer = db.conn();
        let (cancelled, waited) = std::thread::scope(|s| {
            let (canceller, waited) = producer
                .transaction(|conn| -> QueryResult<_> {
                    diesel::sql_query(format!(
                        "INSERT INTO async_task_parent (child_id, parent_id) VALUES ({late}, {middle})"
                    ))
                    .execute(conn)?;
                    let canceller = s.spawn(|| cancel(&mut db.conn(), root).unwrap());
                    Ok((canceller, waits_for_a_lock(db)))
                })
                .unwrap();
            (canceller.join().unwrap(), waited)
        });
        assert!(waited, "the cancel never waited for the producer's lock");
        assert!(cancelled.cancelled);
        assert_eq!(
            (state(db, middle).as_str(), state(db, late).as_str()),
            ("cancelled", "cancelled")
        );
    }

    fn a_child_whose_parent_is_pruned_while_its_retry_waits_is_not_retried(db: &TestDb) {
        let parent = enqueue(&mut db.conn(), &NewTask::new("flaky", "p").max_attempts(1)).unwrap().id;
        let child = enqueue(&mut db.conn(), &NewTask::new("step", "c").after(parent)).unwrap().id;
        let mut registry = registry(&["step"]);
        registry.register("flaky", failing);
        worker(db, registry).run_once().unwrap();
        assert_eq!((state(db, parent).as_str(), state(db, child).as_str()), ("dead", "cancelled"));
        // A prune deletes the dead parent (its link stays) and holds its transaction open
        // while the child's retry waits for the parent's lock.
        let mut pruner = db.conn();
        let (retried, waited) = std::thread::scope(|s| {
            let (retrier, waited) = pruner
                .transaction(|conn| -> QueryResult<_> {
                    diesel::sql_query(format!("DELETE FROM async_task WHERE id = {parent}")).execute(conn)?;
                    let retrier = s.spawn(|| retry(&mut db.conn(), child).unwrap());
                    Ok((retrier, waits_for_a_lock(db)))
                })
                .unwrap();
            (retrier.join().unwrap(), waited)
        });
        assert!(waited, "the retry never waited for the prune's lock");
        assert_eq!(
            (retried.retried, retried.state, retried.parent_pruned),
            (false, TaskState::Cancelled, true),
            "the outcome the child waited for is gone"
        );
    }

    fn a_retried_child_waits_for_its_parent_again(db: &TestDb) {
        let parent = enqueue(&mut db.conn(), &NewTask::new("flaky", "p").max_attempts(1)).unwrap().id;
        let child = enqueue(&mut db.conn(), &NewTask::new("step", "c").after(parent)).unwrap().id;
        let mut registry = registry(&["step"]);
        registry.register("flaky", failing);
        let w = worker(db, registry);
        w.run_once().unwrap();
        assert_eq!((state(db, parent).as_str(), state(db, child).as_str()), ("dead", "cancelled"));
        let retried = retry(&mut db.conn(), child).unwrap();
        assert_eq!((retried.retried, retried.state), (true, TaskState::Blocked));
        assert_eq!(retry(&mut db.conn(), parent).unwrap().state, TaskState::Pending);
        // The parent now succeeds.
        let w = worker(db, crate::ledger_registry("flaky"));
        assert_eq!(w.run_once().unwrap().done, 1);
        assert_eq!(state(db, child), "pending");
    }

    fn a_child_enqueued_after_a_dead_parent_is_released_once_both_are_retried(db: &TestDb) {
        let parent = enqueue(&mut db.conn(), &NewTask::new("flaky", "p").max_attempts(1)).unwrap().id;
        let mut registry = registry(&["step"]);
        registry.register("flaky", failing);
        worker(db, registry).run_once().unwrap();
        assert_eq!(state(db, parent), "dead");
        let child = enqueue(&mut db.conn(), &NewTask::new("step", "c").after(parent)).unwrap().id;
        assert_eq!(state(db, child), "cancelled");
        assert_eq!(retry(&mut db.conn(), child).unwrap().state, TaskState::Blocked);
        assert_eq!(retry(&mut db.conn(), parent).unwrap().state, TaskState::Pending);
        let w = worker(db, crate::ledger_registry("flaky"));
        assert_eq!(w.run_once().unwrap().done, 1);
        assert_eq!(state(db, child), "pending", "released by the retried parent's completion");
    }

    fn a_child_of_a_dead_parent_and_another_is_enqueued_cancelled_in_any_order(db: &TestDb) {
        let dead = enqueue(&mut db.conn(), &NewTask::new("flaky", "p").max_attempts(1)).unwrap().id;
        let mut registry = registry(&["step"]);
        registry.register("flaky", failing);
        worker(db, registry).run_once().unwrap();
        let live = enqueue(&mut db.conn(), &NewTask::new("other", "q")).unwrap().id;
        for (n, parents) in [[dead, live], [live, dead]].iter().enumerate() {
            let task = NewTask::new("step", format!("c{n}")).after(parents[0]).after(parents[1]);
            let id = enqueue(&mut db.conn(), &task).unwrap().id;
            assert_eq!(state(db, id), "cancelled", "parents {parents:?}");
        }
        // A chain enqueued under a dead parent at once: the whole chain is cancelled.
        let batch = [
            NewTask::new("step", "b").after(dead),
            NewTask::new("step", "c").after_key("step", "b"),
        ];
        for made in enqueue_batch(&mut db.conn(), &batch).unwrap() {
            assert_eq!(state(db, made.id), "cancelled");
        }
    }

    fn prune_keeps_a_parent_with_unfinished_children_and_a_pruned_parent_blocks_retry(db: &TestDb) {
        let parent = enqueue(&mut db.conn(), &NewTask::new("flaky", "p").max_attempts(1)).unwrap().id;
        let child = enqueue(&mut db.conn(), &NewTask::new("step", "c").after(parent)).unwrap().id;
        let mut registry = registry(&["step"]);
        registry.register("flaky", failing);
        worker(db, registry).run_once().unwrap();
        assert_eq!(retry(&mut db.conn(), child).unwrap().state, TaskState::Blocked);
        let pruned = prune(&mut db.conn(), &PruneParams::new(Duration::ZERO)).unwrap();
        assert_eq!(pruned.tasks(), 0, "the dead parent of a blocked child is kept");
        assert!(cancel(&mut db.conn(), child).unwrap().cancelled);
        // The parent alone is old enough to go.
        let old = match db.backend() {
            outbox::Backend::Postgres => "now() - interval '2 hours'",
            outbox::Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-2 hours')",
            outbox::Backend::Mysql => "UTC_TIMESTAMP(3) - INTERVAL 2 HOUR",
        };
        db.exec(&format!("UPDATE async_task SET finished_at = {old} WHERE id = {parent}"));
        let pruned = prune(&mut db.conn(), &PruneParams::new(Duration::from_secs(3600))).unwrap();
        assert_eq!(pruned.tasks(), 1);
        let retried = retry(&mut db.conn(), child).unwrap();
        assert_eq!((retried.retried, retried.state), (false, TaskState::Cancelled));
    }

    fn prune_takes_a_tasks_links_with_it(db: &TestDb) {
        let parent = enqueue(&mut db.conn(), &NewTask::new("step", "p")).unwrap().id;
        enqueue(&mut db.conn(), &NewTask::new("step", "c").after(parent)).unwrap();
        worker(db, registry(&["step"])).drain().unwrap();
        assert_eq!(db.count("SELECT count(*) FROM async_task_parent"), 1);
        let report = prune(&mut db.conn(), &PruneParams::new(Duration::ZERO)).unwrap();
        assert_eq!(report.tasks(), 2);
        assert_eq!(db.count("SELECT count(*) FROM async_task_parent"), 0);
    }

    fn the_early_run_check_sees_a_child_forced_to_run_before_its_parent(db: &TestDb) {
        // The check the concurrent tests rely on (and the fault suite's ledger), shown to fail.
        let parent = enqueue(&mut db.conn(), &NewTask::new("root", "p")).unwrap().id;
        let child = enqueue(&mut db.conn(), &NewTask::new("step", "c").after(parent)).unwrap().id;
        db.exec(&format!("UPDATE async_task SET state = 'pending' WHERE id = {child}"));
        let w = worker(db, registry(&["step"]));
        assert_eq!(w.run_once().unwrap().retried, 1);
        assert_eq!(db.ledger_rows(child), 0);
    }

    fn two_workers_run_fan_in_chains_never_before_their_parents(db: &TestDb) {
        // 100 diamonds: a root, two middles, a join waiting for both.
        let mut batch = Vec::new();
        for n in 0..100 {
            let root = format!("{n}");
            batch.push(NewTask::new("root", root.clone()));
            for side in ["l", "r"] {
                batch.push(NewTask::new("middle", format!("{n}{side}")).after_key("root", root.clone()));
            }
            batch.push(NewTask::new("join", root.clone())
                .after_key("middle", format!("{n}l"))
                .after_key("middle", format!("{n}r")));
        }
        enqueue_batch(&mut db.conn(), &batch).unwrap();
        let config = small_config().threads(4).queue(4);
        let workers: Vec<Worker> = (0..2)
            .map(|_| Worker::new(&db.url, registry(&["root", "middle", "join"]), config.clone()).unwrap())
            .collect();
        let failed: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = workers.iter().map(|w| s.spawn(|| w.drain().unwrap())).collect();
            handles.into_iter().map(|h| h.join().unwrap().tally).map(|t| t.retried + t.dead).sum()
        });
        // A drain stops when nothing is due, which may be while the other still runs the
        // parents of what is left.
        let rest = workers[0].drain().unwrap().tally;
        // No task failed: a child that ran before its parents would have (the handler fails
        // it); an InnoDB lock conflict is the database's, released without a failure.
        assert_eq!(
            (failed, rest.retried + rest.dead),
            (0, 0),
            "tasks failed: {:?}",
            failures(db)
        );
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state <> 'done'"), 0);
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 400);
        assert_eq!(db.count("SELECT count(DISTINCT task_id) FROM test_ledger"), 400);
    }
}

#[test]
fn two_parents_completing_at_once_release_their_shared_children_without_a_deadlock() {
    // 300 children of both x and y, linked to x in one order and to y in the other: the two
    // completions' triggers meet on the same child rows, and must lock them in one order.
    let db = &TestDb::postgres();
    let x = enqueue(&mut db.conn(), &NewTask::new("x", "1")).unwrap().id;
    let y = enqueue(&mut db.conn(), &NewTask::new("y", "1")).unwrap().id;
    let children: Vec<i64> = enqueue_batch(
        &mut db.conn(),
        &(0..300)
            .map(|n| NewTask::new("child", n.to_string()))
            .collect::<Vec<_>>(),
    )
    .unwrap()
    .iter()
    .map(|e| e.id)
    .collect();
    // Linked while still pending: the link trigger blocks them.
    let values = |parent: i64, ids: &mut dyn Iterator<Item = &i64>| {
        ids.map(|c| format!("({c}, {parent})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    db.exec(&format!(
        "INSERT INTO async_task_parent (child_id, parent_id) VALUES {}",
        values(x, &mut children.iter())
    ));
    db.exec(&format!(
        "INSERT INTO async_task_parent (child_id, parent_id) VALUES {}",
        values(y, &mut children.iter().rev())
    ));
    assert_eq!(
        db.count("SELECT count(*) FROM async_task WHERE blocked_by = 2"),
        300
    );
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let workers: Vec<Worker> = ["x", "y"]
        .iter()
        .map(|keyword| {
            let barrier = std::sync::Arc::clone(&barrier);
            let mut registry = Registry::new();
            registry.register(
                keyword,
                move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                    insert_ledger_row(task, tx.conn()?)?;
                    barrier.wait();
                    Ok(())
                },
            );
            Worker::new(&db.url, registry, small_config()).unwrap()
        })
        .collect();
    let tallies: Vec<outbox::Tally> = std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .iter()
            .map(|w| s.spawn(|| w.run_once().unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for tally in &tallies {
        assert_eq!((tally.done, tally.retried), (1, 0), "{tally:?}");
    }
    assert_eq!(db.count("SELECT count(*) FROM async_task WHERE keyword = 'child' AND state = 'pending' AND blocked_by = 0"), 300);
}

#[test]
fn a_parent_cancelled_by_a_business_trigger_cancels_its_descendants() {
    let db = &TestDb::postgres();
    let parent = enqueue(&mut db.conn(), &NewTask::new("step", "p"))
        .unwrap()
        .id;
    let child = enqueue(&mut db.conn(), &NewTask::new("step", "c").after(parent))
        .unwrap()
        .id;
    let grandchild = enqueue(&mut db.conn(), &NewTask::new("step", "g").after(child))
        .unwrap()
        .id;
    db.exec(
        "CREATE TABLE orders (id int, task bigint);
         CREATE FUNCTION orders_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             UPDATE async_task SET state = 'cancelled' WHERE id = NEW.task;
             RETURN NULL;
         END $$;
         CREATE TRIGGER orders_cancel AFTER INSERT ON orders
             FOR EACH ROW EXECUTE FUNCTION orders_cancel();",
    );
    db.exec(&format!("INSERT INTO orders VALUES (1, {parent})"));
    assert_eq!(state(db, child), "cancelled");
    assert_eq!(state(db, grandchild), "cancelled");
}

#[test]
fn a_repeatable_read_completion_that_predates_a_new_child_fails_to_serialise() {
    let db = &TestDb::postgres();
    let parent = enqueue(&mut db.conn(), &NewTask::new("step", "p"))
        .unwrap()
        .id;
    enqueue(&mut db.conn(), &NewTask::new("step", "c1").after(parent)).unwrap();
    let mut completion = db.conn();
    let sql = |conn: &mut DbConnection, sql: &str| diesel::sql_query(sql).execute(conn);
    sql(&mut completion, "BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
    sql(&mut completion, "SELECT count(*) FROM async_task").unwrap();
    let late = enqueue(&mut db.conn(), &NewTask::new("step", "c2").after(parent))
        .unwrap()
        .id;
    let done = sql(
        &mut completion,
        &format!("UPDATE async_task SET state = 'done' WHERE id = {parent}"),
    );
    let error = done.expect_err("the completion's snapshot does not see the new child");
    assert!(error.to_string().contains("could not serialize"), "{error}");
    sql(&mut completion, "ROLLBACK").unwrap();
    assert_eq!(state(db, late), "blocked");
    db.exec(&format!(
        "UPDATE async_task SET state = 'done' WHERE id = {parent}"
    ));
    assert_eq!(state(db, late), "pending");
}

#[test]
fn a_released_child_wakes_idle_workers_at_the_parents_commit() {
    let db = &TestDb::postgres();
    let parent = enqueue(&mut db.conn(), &NewTask::new("step", "p"))
        .unwrap()
        .id;
    enqueue(&mut db.conn(), &NewTask::new("child.kw", "c").after(parent)).unwrap();
    let DbConnection::Pg(mut listener) = db.conn() else {
        unreachable!("a PostgreSQL test database")
    };
    diesel::sql_query("LISTEN outbox_task")
        .execute(&mut listener)
        .unwrap();
    db.exec(&format!(
        "UPDATE async_task SET state = 'done' WHERE id = {parent}"
    ));
    // Notifications are read on the listener's next round trip.
    diesel::sql_query("SELECT 1")
        .execute(&mut listener)
        .unwrap();
    let payloads: Vec<String> = listener
        .notifications_iter()
        .map(|n| n.unwrap().payload)
        .collect();
    assert_eq!(payloads, ["child.kw"], "the released child's keyword, once");
}

/// MySQL at its own default isolation, REPEATABLE READ: a cancel in the caller's business
/// transaction, whose snapshot predates a child linked under a descendant (the link's
/// producer holds that descendant while the cascade waits for it), still cancels that
/// child: the cascade reads the tree's newest links, not its snapshot's.
#[cfg(feature = "mysql")]
#[test]
fn a_cancel_at_repeatable_read_cancels_a_grandchild_linked_after_its_snapshot() {
    use diesel::connection::SimpleConnection;
    let db = &TestDb::mysql();
    let root = enqueue(&mut db.conn(), &NewTask::new("step", "root"))
        .unwrap()
        .id;
    let middle = enqueue(&mut db.conn(), &NewTask::new("step", "middle").after(root))
        .unwrap()
        .id;
    let late = enqueue(&mut db.conn(), &NewTask::new("step", "late"))
        .unwrap()
        .id;
    let mut caller = db.conn();
    caller
        .batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .unwrap();
    let mut producer = db.conn();
    let (cancelled, waited) = std::thread::scope(|s| {
        let (canceller, waited) = producer
            .transaction(|conn| -> QueryResult<_> {
                diesel::sql_query(format!(
                    "INSERT INTO async_task_parent (child_id, parent_id) VALUES ({late}, {middle})"
                ))
                .execute(conn)?;
                let canceller = s.spawn(move || {
                    caller
                        .transaction(|caller| -> outbox::Result<_> {
                            // The caller's own read first: its snapshot has no link of `late`.
                            caller.batch_execute("SELECT count(*) FROM async_task_parent")?;
                            cancel(caller, root)
                        })
                        .unwrap()
                });
                Ok((canceller, waits_for_a_lock(db)))
            })
            .unwrap();
        (canceller.join().unwrap(), waited)
    });
    assert!(waited, "the cancel never waited for the producer's lock");
    assert!(cancelled.cancelled);
    assert_eq!(
        (state(db, middle).as_str(), state(db, late).as_str()),
        ("cancelled", "cancelled")
    );
}

/// MySQL at REPEATABLE READ: a retry in the caller's transaction, whose snapshot predates
/// the parent's completion, puts the child back to pending, not blocked on a parent that
/// is done already (and would never release it).
#[cfg(feature = "mysql")]
#[test]
fn a_retry_at_repeatable_read_sees_a_parent_done_after_its_snapshot() {
    use diesel::connection::SimpleConnection;
    let db = &TestDb::mysql();
    let parent = enqueue(&mut db.conn(), &NewTask::new("step", "p"))
        .unwrap()
        .id;
    let child = enqueue(&mut db.conn(), &NewTask::new("step", "c").after(parent))
        .unwrap()
        .id;
    assert!(cancel(&mut db.conn(), child).unwrap().cancelled);
    let mut caller = db.conn();
    caller
        .batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .unwrap();
    let retried = caller
        .transaction(|caller| -> outbox::Result<_> {
            // The caller's own read first: its snapshot has the parent pending.
            caller.batch_execute("SELECT count(*) FROM async_task")?;
            assert_eq!(worker(db, registry(&["step"])).run_once().unwrap().done, 1);
            retry(caller, child)
        })
        .unwrap();
    assert_eq!((retried.retried, retried.state), (true, TaskState::Pending));
    assert_eq!(state(db, child), "pending");
}

/// MySQL: a task without children completes in one statement, with no look-up of children;
/// a child linked by a producer's plain `INSERT … parent_id` while its parent runs cannot set
/// the parent's `has_children` (a trigger on `async_task` may not change it). The producer
/// holds the parent's row until it commits; the completion, strict or batched (the chunk's
/// last task the parent, so that the chunk's statement has read other rows first), waits
/// for it and then releases the child, instead of leaving it blocked behind a done parent
/// for good.
#[cfg(feature = "mysql")]
#[test]
fn a_child_linked_by_a_plain_insert_while_its_parent_runs_is_released_by_its_completion() {
    use diesel::connection::SimpleConnection;
    use std::sync::mpsc;
    // (tasks per chunk, whether the parent's handler opens its transaction, whether it
    // clears the session's sql_mode there: the completion then runs on that connection,
    // where MySQL stores an empty state for the NULL that strict mode refuses)
    for (commit_batch, open_tx, lax) in [
        (1, false, false),
        (1, true, false),
        (2, false, false),
        (1, true, true),
    ] {
        let db = &TestDb::mysql();
        let parents: Vec<i64> = (0..commit_batch)
            .map(|n| {
                enqueue(&mut db.conn(), &NewTask::new("parent", n.to_string()))
                    .unwrap()
                    .id
            })
            .collect();
        let parent = *parents.last().unwrap();
        let (started, wait_started) = mpsc::sync_channel::<()>(8);
        let (go, wait_go) = mpsc::sync_channel::<()>(8);
        let wait_go = std::sync::Mutex::new(wait_go);
        let mut registry = Registry::new();
        registry.register("parent", move |task: &TaskContext, tx: &mut TaskTx| {
            if open_tx {
                let conn = tx.conn()?;
                if lax {
                    conn.batch_execute("SET SESSION sql_mode = ''")?;
                }
            }
            if task.id() == parent {
                started.send(()).unwrap();
                wait_go.lock().unwrap().recv().unwrap();
            }
            Ok(())
        });
        let config = small_config().threads(1).commit_batch(commit_batch);
        let w = Worker::new(&db.url, registry, config).unwrap();
        let mut producer = db.conn();
        let (tally, waited) = std::thread::scope(|s| {
            let running = s.spawn(|| w.run_once().unwrap());
            wait_started.recv().unwrap();
            producer.batch_execute("BEGIN").unwrap();
            producer
                .batch_execute(&format!(
                    "INSERT INTO async_task (keyword, biz_id, parent_id) VALUES ('child', 'c', {parent})"
                ))
                .unwrap();
            go.send(()).unwrap();
            let waited = waits_for_a_lock(db);
            producer.batch_execute("COMMIT").unwrap();
            (running.join().unwrap(), waited)
        });
        let case = format!(
            "batch {commit_batch}, handler's transaction {open_tx}, sql_mode cleared {lax}"
        );
        assert!(
            waited,
            "{case}: the completion never waited for the producer"
        );
        assert_eq!(tally.done, commit_batch as u64, "{case}: {tally:?}");
        let child = db.count("SELECT id FROM async_task WHERE keyword = 'child'");
        assert_eq!(state(db, parent), "done");
        assert_eq!(
            state(db, child),
            "pending",
            "{case}: released by its parent's completion"
        );
    }
}
