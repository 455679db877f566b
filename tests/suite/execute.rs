//! Execution: success, failure, retry, dead, permanent errors, panics.

use outbox::{enqueue, HandlerError, HandlerResult, NewTask, Registry, TaskContext, TaskTx};

use crate::support::TestDb;
use crate::{worker, write_ledger};

fn write_then_fail(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
    write_ledger(task, tx)?;
    Err(anyhow::anyhow!("downstream refused order {}", task.biz_id()).into())
}

fn write_then_fail_permanently(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
    write_ledger(task, tx)?;
    Err(HandlerError::permanent(anyhow::anyhow!(
        "coupon campaign is over"
    )))
}

fn write_then_panic(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
    write_ledger(task, tx)?;
    panic!("handler bug on {}", task.biz_id());
}

fn registry_with(
    keyword: &str,
    handler: fn(&TaskContext, &mut TaskTx) -> HandlerResult,
) -> Registry {
    let mut registry = Registry::new();
    registry.register(keyword, handler);
    registry
}

every_backend! {
    fn success_commits_the_effect_and_marks_done(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let w = worker(db, crate::ledger_registry("ledger"));
        let tally = w.run_once().unwrap();
        assert_eq!((tally.claimed, tally.done), (1, 1));
        let row = db.task(id);
        assert_eq!(row.state, "done");
        assert_eq!(row.owner, Some(w.node_id()));
        assert_eq!(db.ledger_rows(id), 1);
        // Nothing is due any more.
        assert_eq!(w.run_once().unwrap().claimed, 0);
    }

    fn a_handler_error_rolls_back_its_effect_and_schedules_a_retry(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("flaky", "order-1").payload(&serde_json::json!({"secret": "card-4242"}))).unwrap().id;
        let w = worker(db, registry_with("flaky", write_then_fail));
        let tally = w.run_once().unwrap();
        assert_eq!((tally.claimed, tally.retried), (1, 1));
        let row = db.task(id);
        assert_eq!(row.state, "pending");
        assert_eq!(row.failures, 1);
        assert_eq!(row.owner, None);
        assert_eq!(row.due, 0, "the retry waits for its backoff");
        let error = row.last_error.unwrap();
        assert!(error.contains("downstream refused order order-1"), "{error}");
        assert!(!error.contains("card-4242"), "the payload never reaches last_error");
        assert_eq!(db.ledger_rows(id), 0, "the side-effect rolled back");
        // Not due yet: a second pass claims nothing.
        assert_eq!(w.run_once().unwrap().claimed, 0);
    }

    fn at_max_attempts_the_task_is_dead(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("flaky", "1").max_attempts(3)).unwrap().id;
        let w = worker(db, registry_with("flaky", write_then_fail));
        for attempt in 1..=3 {
            let tally = w.run_once().unwrap();
            assert_eq!(tally.claimed, 1, "attempt {attempt}");
            db.make_all_due();
        }
        let row = db.task(id);
        assert_eq!(row.state, "dead");
        assert_eq!(row.failures, 3);
        assert_eq!(w.totals().retried, 2);
        assert_eq!(w.totals().dead, 1);
        assert_eq!(db.ledger_rows(id), 0);
        assert_eq!(w.run_once().unwrap().claimed, 0, "a dead task is never claimed");
    }

    fn the_workers_default_max_attempts_applies_when_the_task_sets_none(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("flaky", "1")).unwrap().id;
        let config = crate::small_config().max_attempts(2);
        let w = outbox::Worker::new(&db.url, registry_with("flaky", write_then_fail), config).unwrap();
        w.run_once().unwrap();
        db.make_all_due();
        w.run_once().unwrap();
        assert_eq!((db.task(id).state.as_str(), db.task(id).failures), ("dead", 2));
    }

    fn a_permanent_error_is_dead_at_once(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("campaign", "1").max_attempts(10)).unwrap().id;
        let w = worker(db, registry_with("campaign", write_then_fail_permanently));
        assert_eq!(w.run_once().unwrap().dead, 1);
        let row = db.task(id);
        assert_eq!((row.state.as_str(), row.failures), ("dead", 1));
        assert!(row.last_error.unwrap().contains("campaign is over"));
        assert_eq!(db.ledger_rows(id), 0);
    }

    fn a_payload_that_does_not_fit_is_a_permanent_error(db: &TestDb) {
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct Order { user_id: i64 }
        fn typed(task: &TaskContext, _: &mut TaskTx) -> HandlerResult {
            let _order: Order = task.payload()?;
            Ok(())
        }
        let good = enqueue(&mut db.conn(), &NewTask::new("typed", "good").payload(&serde_json::json!({"user_id": 1}))).unwrap().id;
        let bad = enqueue(&mut db.conn(), &NewTask::new("typed", "bad").payload(&serde_json::json!({"user": "x"}))).unwrap().id;
        let w = worker(db, registry_with("typed", typed));
        w.run_once().unwrap();
        assert_eq!(db.task(good).state, "done");
        let row = db.task(bad);
        assert_eq!((row.state.as_str(), row.failures), ("dead", 1));
        assert!(row.last_error.unwrap().contains("does not fit"));
    }

    fn a_payload_that_does_not_fit_leaves_its_values_in_no_column_and_no_log_line(db: &TestDb) {
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct Order { user_id: i64 }
        fn typed(task: &TaskContext, _: &mut TaskTx) -> HandlerResult {
            let _order: Order = task.payload()?;
            Ok(())
        }
        crate::logs::start();
        let secret = format!("alice-{}-{:?}@example.com", std::process::id(), db.backend());
        let id = enqueue(&mut db.conn(), &NewTask::new("typed", "1").payload(&serde_json::json!({"user_id": secret}))).unwrap().id;
        let w = worker(db, registry_with("typed", typed));
        assert_eq!(w.run_once().unwrap().dead, 1);
        let error = db.task(id).last_error.unwrap();
        assert!(error.contains("does not fit the expected type: data error at user_id"), "{error}");
        // Every text column but the payload itself.
        let columns = "keyword || '|' || biz_id || '|' || COALESCE(tenant, '') || '|' || state || '|' || COALESCE(last_error, '')";
        assert_eq!(db.count(&format!("SELECT count(*) FROM async_task WHERE ({columns}) LIKE '%{secret}%'")), 0);
        assert_eq!(db.count(&format!("SELECT count(*) FROM async_node WHERE name LIKE '%{secret}%'")), 0);
        assert!(!crate::logs::containing(&format!("task {id} ")).is_empty(), "the failure was logged");
        assert_eq!(crate::logs::containing(&secret), Vec::<String>::new());
    }

    fn a_panic_is_a_failure_and_the_worker_survives(db: &TestDb) {
        let mut conn = db.conn();
        let panicking = enqueue(&mut conn, &NewTask::new("buggy", "1").max_attempts(2)).unwrap().id;
        let mut registry = registry_with("buggy", write_then_panic);
        registry.register("ledger", write_ledger);
        let w = worker(db, registry);
        assert_eq!(w.run_once().unwrap().retried, 1);
        let row = db.task(panicking);
        assert_eq!((row.state.as_str(), row.failures), ("pending", 1));
        assert!(row.last_error.unwrap().contains("handler panicked: handler bug on 1"));
        assert_eq!(db.ledger_rows(panicking), 0);

        // The same worker (and its pooled connections) keeps working.
        let fine = enqueue(&mut conn, &NewTask::new("ledger", "2")).unwrap().id;
        db.make_all_due();
        let tally = w.run_once().unwrap();
        assert_eq!((tally.done, tally.dead), (1, 1));
        assert_eq!(db.task(fine).state, "done");
        assert_eq!(db.task(panicking).state, "dead");
        assert_eq!(db.ledger_rows(fine), 1);
    }

    fn a_panic_inside_a_nested_transaction_leaves_a_clean_connection(db: &TestDb) {
        fn nested_panic(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
            use diesel::Connection;
            tx.conn()?.transaction(|conn| -> diesel::QueryResult<()> {
                crate::insert_ledger_row(task, conn).ok();
                panic!("inside a savepoint");
            })?;
            Ok(())
        }
        let mut conn = db.conn();
        for n in 0..4 {
            enqueue(&mut conn, &NewTask::new("nested", n.to_string()).max_attempts(1)).unwrap();
        }
        let mut registry = registry_with("nested", nested_panic);
        registry.register("ledger", write_ledger);
        let w = worker(db, registry);
        assert_eq!(w.drain().unwrap().tally.dead, 4);
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 0);
        // Every pooled connection is usable: effects of later tasks commit.
        for n in 0..8 {
            enqueue(&mut conn, &NewTask::new("ledger", n.to_string())).unwrap();
        }
        assert_eq!(w.drain().unwrap().tally.done, 8);
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 8);
    }
}

/// PostgreSQL only (an SQLite connection cannot be killed from outside): the first attempt's
/// handler runs `kill` and then writes its ledger row. The attempt must be released with
/// `note` and no failure counted, and the next attempt, on a fresh pooled connection, done.
fn a_killed_connection_releases_the_task(
    kill: impl Fn(&outbox::DatabaseUrl, &mut TaskTx) -> HandlerResult + Send + Sync + 'static,
    note: &str,
) {
    use std::sync::atomic::{AtomicBool, Ordering};

    let db = &TestDb::postgres();
    let url = db.url.clone();
    let once = AtomicBool::new(false);
    let mut registry = Registry::new();
    registry.register(
        "victim",
        move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            if !once.swap(true, Ordering::SeqCst) {
                kill(&url, tx)?;
            }
            write_ledger(task, tx)
        },
    );
    let id = enqueue(&mut db.conn(), &NewTask::new("victim", "1"))
        .unwrap()
        .id;
    let w = worker(db, registry);
    let tally = w.run_once().unwrap();
    assert_eq!(
        (tally.released, tally.retried, tally.done),
        (1, 0, 0),
        "{tally:?}"
    );
    let row = db.task(id);
    assert_eq!((row.state.as_str(), row.failures), ("pending", 0));
    let last_error = row.last_error.unwrap();
    assert!(last_error.starts_with(note), "{last_error}");
    assert_eq!(db.ledger_rows(id), 0);
    // The pool replaced the dead connection: the next attempt succeeds.
    let tally = w.run_once().unwrap();
    assert_eq!(tally.done, 1, "{tally:?}");
    assert_eq!(db.ledger_rows(id), 1);
}

#[test]
fn a_connection_killed_under_its_handler_is_not_the_tasks_failure() {
    a_killed_connection_releases_the_task(
        |_, tx| {
            use diesel::RunQueryDsl;
            // The server ends this very connection, as a restart or an operator would.
            let _ = diesel::sql_query("SELECT pg_terminate_backend(pg_backend_pid())")
                .execute(tx.conn()?);
            Ok(())
        },
        "released: the connection broke while the handler ran",
    );
}

/// The database goes away before the handler opens its transaction: the failed `BEGIN` is
/// the database's fault, not the task's.
#[test]
fn a_transaction_that_cannot_be_opened_is_not_the_tasks_failure() {
    a_killed_connection_releases_the_task(
        |url, _| {
            use diesel::RunQueryDsl;
            // Every other backend of this database, the worker's pooled one included.
            diesel::sql_query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .execute(&mut url.connect().expect("connect"))?;
            Ok(())
        },
        "released: database unavailable",
    );
}

/// PostgreSQL only: the worker's idle pooled connections are terminated between two pages
/// (a server restart, an operator's `pg_terminate_backend`). Each dead connection may fail one
/// claim; the pool must then discard it, not hand it out again, so the worker recovers.
#[test]
fn terminated_pool_connections_are_replaced() {
    let db = &TestDb::postgres();
    let w = worker(db, crate::ledger_registry("victim"));
    let mut conn = db.conn();
    let pool_size = w.pool().max_size() as usize;
    for n in 0..8 {
        enqueue(&mut conn, &NewTask::new("victim", n.to_string())).unwrap();
    }
    // Several connections in the pool, all idle now.
    assert_eq!(w.drain().unwrap().tally.done, 8);
    let terminated = db.count(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()) t WHERE ok",
    );
    assert!(terminated >= 2, "only {terminated} backend(s) terminated");
    // `conn` was terminated too.
    let id = enqueue(&mut db.conn(), &NewTask::new("victim", "after"))
        .unwrap()
        .id;
    let mut errors = Vec::new();
    let done = loop {
        match w.run_once() {
            Ok(tally) => break tally.done,
            Err(e) => errors.push(e.to_string()),
        }
        assert!(
            errors.len() <= pool_size,
            "more failed claims than pooled connections: dead connections are reused: {errors:?}"
        );
    };
    assert_eq!(done, 1, "errors before: {errors:?}");
    assert_eq!(db.ledger_rows(id), 1);
}

// MySQL checks every constraint at its statement (InnoDB has no deferred constraints), so
// nothing a handler writes can make the commit itself fail there.
sqlite_and_postgres! {
    fn a_transaction_that_fails_at_commit_is_the_tasks_failure(db: &TestDb) {
        // A deferred foreign key is checked at COMMIT, after the handler returned Ok.
        db.exec("CREATE TABLE test_parent (id BIGINT PRIMARY KEY)");
        db.exec(
            "CREATE TABLE test_child (parent_id BIGINT NOT NULL \
             REFERENCES test_parent (id) DEFERRABLE INITIALLY DEFERRED)",
        );
        fn orphan(_: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
            use diesel::RunQueryDsl;
            diesel::sql_query("INSERT INTO test_child (parent_id) VALUES (42)").execute(tx.conn()?)?;
            Ok(())
        }
        let id = enqueue(&mut db.conn(), &NewTask::new("orphan", "1").max_attempts(2)).unwrap().id;
        let w = worker(db, registry_with("orphan", orphan));
        assert_eq!(w.run_once().unwrap().retried, 1);
        let row = db.task(id);
        assert_eq!((row.state.as_str(), row.failures), ("pending", 1));
        assert!(row.last_error.unwrap().contains("the task's transaction failed"));
        db.make_all_due();
        assert_eq!(w.run_once().unwrap().dead, 1);
        assert_eq!(db.count("SELECT count(*) FROM test_child"), 0);
    }
}

/// MySQL: a handler whose statement is a deadlock's victim and that goes on as if not has
/// lost its transaction: InnoDB rolled back what it wrote, and what runs after runs in
/// autocommit. Its task is not marked done as if those writes had committed with it: it is
/// released, uncharged, runs again, and its second run's writes commit with its completion.
/// Whether the lost statement was prepared or sent as text (`batch_execute`, whose error has
/// no kind).
#[cfg(feature = "mysql")]
#[test]
fn a_handler_that_goes_on_past_its_deadlock_on_mysql_does_not_complete_its_task() {
    use diesel::connection::SimpleConnection;
    use diesel::RunQueryDsl;
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    let db = &TestDb::mysql();
    db.exec("CREATE TABLE dl_rows (id INT PRIMARY KEY, n INT NOT NULL DEFAULT 0)");
    db.exec("INSERT INTO dl_rows (id) VALUES (1), (2)");
    db.exec("CREATE TABLE dl_heavy (id INT PRIMARY KEY, n INT NOT NULL DEFAULT 0)");
    let heavy: Vec<String> = (1..=50).map(|i| format!("({i})")).collect();
    db.exec(&format!(
        "INSERT INTO dl_heavy (id) VALUES {}",
        heavy.join(", ")
    ));
    let ids: Vec<i64> = ["prepared", "text"]
        .iter()
        .map(|biz_id| {
            enqueue(&mut db.conn(), &NewTask::new("ledger", *biz_id))
                .unwrap()
                .id
        })
        .collect();
    let lost: Arc<Mutex<HashSet<String>>> = Arc::default();
    let (lost_in, url) = (Arc::clone(&lost), db.url.clone());
    let mut registry = Registry::new();
    registry.register(
        "ledger",
        move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            write_ledger(task, tx)?;
            if !lost_in.lock().unwrap().insert(task.biz_id().to_owned()) {
                return Ok(());
            }
            let lock = |conn: &mut outbox::DbConnection, row: i32| {
                diesel::sql_query(format!("SELECT n FROM dl_rows WHERE id = {row} FOR UPDATE"))
                    .execute(conn)
                    .map(drop)
            };
            lock(tx.conn()?, 1)?;
            // Another session, the heavier (50 rows written, so InnoDB makes the handler
            // the victim), holds row 2 and asks for row 1.
            let other_url = url.clone();
            let other = std::thread::spawn(move || {
                let mut other = other_url.connect().unwrap();
                other.batch_execute("BEGIN").unwrap();
                diesel::sql_query("UPDATE dl_heavy SET n = n + 1")
                    .execute(&mut other)
                    .unwrap();
                lock(&mut other, 2).unwrap();
                lock(&mut other, 1).unwrap();
                other.batch_execute("COMMIT").unwrap();
            });
            #[derive(diesel::QueryableByName)]
            struct Waiting {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                n: i64,
            }
            // (Asked for, or waiting for: either way the handler's next lock closes the cycle.)
            let waiting = "SELECT count(*) AS n FROM information_schema.PROCESSLIST
                            WHERE INFO = 'SELECT n FROM dl_rows WHERE id = 1 FOR UPDATE'";
            let mut watcher = url.connect()?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while diesel::sql_query(waiting)
                .get_result::<Waiting>(&mut watcher)?
                .n
                < 1
            {
                assert!(
                    Instant::now() < deadline,
                    "the other session never asked for row 1"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            let victim = match task.biz_id() {
                "prepared" => lock(tx.conn()?, 2),
                _ => tx
                    .conn()?
                    .batch_execute("SELECT n FROM dl_rows WHERE id = 2 FOR UPDATE"),
            };
            assert!(
                victim.is_err(),
                "the handler's session was not the deadlock's victim"
            );
            other.join().unwrap();
            // The error dropped: the handler goes on as if its lock had been granted. (One
            // that returned the error, or its next use of the transaction's, would be
            // charged a failure, as on PostgreSQL.)
            Ok(())
        },
    );
    let w = outbox::Worker::new(
        &db.url,
        registry,
        outbox::WorkerConfig::default().threads(1),
    )
    .unwrap();
    w.drain().unwrap();
    for id in ids {
        let task = db.task(id);
        assert_eq!(
            (task.state.as_str(), task.failures),
            ("done", 0),
            "task {id}"
        );
        assert_eq!(
            db.ledger_rows(id),
            1,
            "task {id}: done with its second run's write"
        );
    }
    assert_eq!(lost.lock().unwrap().len(), 2);
}
