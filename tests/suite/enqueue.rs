//! Enqueue: idempotence, the producer's transaction, bad input.

use std::time::Duration;

use diesel::prelude::*;
use outbox::{enqueue, enqueue_batch, write_transaction, Backend, EnqueueOptions, Error, NewTask};

/// Whether an error is of the expected class.
type ErrorCheck = fn(&Error) -> bool;

every_backend! {
    fn same_keyword_and_biz_id_yields_one_task(db: &TestDb) {
        let mut conn = db.conn();
        let task = NewTask::new("points.credit", "order-42").payload(&serde_json::json!({"p": 1}));
        let first = enqueue(&mut conn, &task).unwrap();
        let second = enqueue(&mut conn, &task.clone().payload(&serde_json::json!({"p": 2}))).unwrap();
        assert!(first.created);
        assert!(!second.created);
        assert_eq!(first.id, second.id);
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 1);
        // The duplicate did not overwrite the payload.
        assert_eq!(
            db.count("SELECT count(*) FROM async_task WHERE biz_data = '{\"p\": 1}' OR biz_data = '{\"p\":1}'"),
            1
        );
        // Same biz_id under another keyword is another task.
        let other = enqueue(&mut conn, &NewTask::new("coupon.grant", "order-42")).unwrap();
        assert!(other.created);
        assert_ne!(other.id, first.id);
    }

    fn batch_creates_in_one_call_and_reports_duplicates(db: &TestDb) {
        let mut conn = db.conn();
        enqueue(&mut conn, &NewTask::new("k", "existing")).unwrap();
        let tasks = vec![
            NewTask::new("k", "a"),
            NewTask::new("k", "existing"),
            NewTask::new("k", "b"),
            NewTask::new("k", "a"),
        ];
        let results = enqueue_batch(&mut conn, &tasks).unwrap();
        let created: Vec<bool> = results.iter().map(|r| r.created).collect();
        assert_eq!(created, [true, false, true, false]);
        assert_eq!(results[0].id, results[3].id, "a repeated key maps to the one task");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 3);
        assert!(enqueue_batch(&mut conn, &[]).unwrap().is_empty());
    }

    fn a_large_batch_keeps_order_duplicates_delays_and_is_all_or_nothing(db: &TestDb) {
        // 1,000 tasks: more than one statement's worth on SQLite (256 rows each, then
        // powers of two), so repeats and failures cross statement boundaries.
        let mut conn = db.conn();
        let mut tasks: Vec<NewTask> = (0..1000)
            .map(|i| {
                let task = NewTask::new("k", format!("b{i}")).payload(&serde_json::json!({"i": i}));
                if i % 2 == 1 { task.delay(Duration::from_secs(3600)) } else { task }
            })
            .collect();
        tasks[900] = NewTask::new("k", "b3"); // repeats a key of the first statement
        let results = enqueue_batch(&mut conn, &tasks).unwrap();
        assert_eq!(results.len(), 1000);
        assert!(!results[900].created);
        assert_eq!(results[900].id, results[3].id);
        assert_eq!(results.iter().filter(|r| r.created).count(), 999);
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 999);
        for i in [0usize, 255, 256, 511, 899, 901, 999] {
            let id = results[i].id;
            let sql = format!("SELECT count(*) FROM async_task WHERE id = {id} AND biz_id = 'b{i}'");
            assert_eq!(db.count(&sql), 1, "task {i} reported its own id");
            assert_eq!(db.task(id).due, i32::from(i % 2 == 0), "task {i}");
        }
        // Delays count from the database clock, to the millisecond: the odd tasks are an
        // hour out.
        let delay_ms = match db.backend() {
            Backend::Postgres => "round(extract(epoch FROM run_at - created_at) * 1000)",
            Backend::Sqlite => "round((julianday(run_at) - julianday(created_at)) * 86400000)",
            Backend::Mysql => "round(TIMESTAMPDIFF(MICROSECOND, created_at, run_at) / 1000)",
        };
        let sql = format!("SELECT count(*) FROM async_task WHERE {delay_ms} = 3600000");
        assert_eq!(db.count(&sql), 500);
        let sql = format!("SELECT count(*) FROM async_task WHERE {delay_ms} = 0");
        assert_eq!(db.count(&sql), 499);

        // A row that the database refuses late in the batch leaves nothing of the batch,
        // outside any transaction of the caller's.
        match db.backend() {
            Backend::Postgres => db.exec(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RAISE EXCEPTION 'refused %', NEW.biz_id; END $$;
                 CREATE TRIGGER refuse BEFORE INSERT ON async_task
                 FOR EACH ROW WHEN (NEW.biz_id = 'refused') EXECUTE FUNCTION refuse()",
            ),
            Backend::Sqlite => db.exec(
                "CREATE TRIGGER refuse BEFORE INSERT ON async_task
                 WHEN NEW.biz_id = 'refused' BEGIN SELECT RAISE(ABORT, 'refused'); END",
            ),
            Backend::Mysql => db.exec(
                "CREATE TRIGGER refuse BEFORE INSERT ON async_task FOR EACH ROW
                 BEGIN IF NEW.biz_id = 'refused' THEN
                     SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused';
                 END IF; END",
            ),
        }
        for n in [1000, 200] {
            // The refused row comes last: in the last of several statements on SQLite.
            let mut late: Vec<NewTask> = (1..n).map(|i| NewTask::new("k", format!("late-{i}"))).collect();
            late.push(NewTask::new("k", "refused"));
            let err = enqueue_batch(&mut conn, &late).unwrap_err();
            assert!(matches!(err, Error::Database { operation: "task enqueue", .. }), "{err}");
            assert!(err.to_string().contains("refused"), "{err}");
            assert_eq!(db.count("SELECT count(*) FROM async_task WHERE biz_id LIKE 'late-%'"), 0, "{n}");
            assert_eq!(db.count("SELECT count(*) FROM async_task"), 999);
        }
    }

    fn every_row_keeps_its_own_options_whether_a_statement_shares_them_or_not(db: &TestDb) {
        // On SQLite a statement whose rows share tenant, priority, max attempts and delay
        // binds those once: 256 rows that share them, 256 that share the defaults, then
        // rows that differ from one another.
        let options = |i: usize| -> (Option<String>, i16, Option<i32>, u64) {
            match i {
                0..=255 => (Some("acme".to_owned()), 3, Some(4), 3600),
                256..=511 => (None, 0, None, 0),
                _ => (
                    i.is_multiple_of(2).then(|| format!("t{}", i % 5)),
                    (i % 3) as i16,
                    (!i.is_multiple_of(4)).then_some((i % 4) as i32),
                    (i % 7) as u64 * 60,
                ),
            }
        };
        let tasks: Vec<NewTask> = (0..600)
            .map(|i| {
                let (tenant, priority, max_attempts, delay_s) = options(i);
                let mut task = NewTask::new(if i % 2 == 0 { "k" } else { "k2" }, format!("b{i}"))
                    .payload(&serde_json::json!({"i": i}))
                    .priority(priority)
                    .delay(Duration::from_secs(delay_s));
                if let Some(t) = tenant {
                    task = task.tenant(t);
                }
                if let Some(m) = max_attempts {
                    task = task.max_attempts(m);
                }
                task
            })
            .collect();
        let results = enqueue_batch(&mut db.conn(), &tasks).unwrap();
        assert!(results.iter().all(|r| r.created));
        let (delay_ms, payload_i) = match db.backend() {
            Backend::Postgres => (
                "round(extract(epoch FROM run_at - created_at) * 1000)",
                "(biz_data ->> 'i')::int",
            ),
            Backend::Sqlite => (
                "round((julianday(run_at) - julianday(created_at)) * 86400000)",
                "biz_data ->> 'i'",
            ),
            Backend::Mysql => (
                "round(TIMESTAMPDIFF(MICROSECOND, created_at, run_at) / 1000)",
                "CAST(JSON_UNQUOTE(JSON_EXTRACT(biz_data, '$.i')) AS SIGNED)",
            ),
        };
        for (i, result) in results.iter().enumerate() {
            let (tenant, priority, max_attempts, delay_s) = options(i);
            let keyword = if i % 2 == 0 { "k" } else { "k2" };
            let tenant = tenant.map_or("tenant IS NULL".to_owned(), |t| format!("tenant = '{t}'"));
            let max_attempts =
                max_attempts.map_or("max_attempts IS NULL".to_owned(), |m| format!("max_attempts = {m}"));
            let sql = format!(
                "SELECT count(*) FROM async_task WHERE id = {} AND keyword = '{keyword}'
                 AND biz_id = 'b{i}' AND {payload_i} = {i} AND {tenant} AND priority = {priority}
                 AND {max_attempts} AND {delay_ms} = {}",
                result.id,
                delay_s * 1000
            );
            assert_eq!(db.count(&sql), 1, "task {i}");
        }
    }

    fn rolled_back_producer_transaction_leaves_no_task(db: &TestDb) {
        let mut conn = db.conn();
        let result: Result<(), Error> = write_transaction(&mut conn, |conn| {
            diesel::sql_query("INSERT INTO test_ledger (task_id, note) VALUES (0, 'order')").execute(conn)?;
            enqueue(conn, &NewTask::new("points.credit", "order-7"))?;
            Err(Error::InvalidConfig { setting: "business rule", reason: "failed".into() })
        });
        assert!(result.is_err());
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 0);
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 0);

        // And a committed one leaves exactly the task and the business row.
        write_transaction(&mut conn, |conn| {
            diesel::sql_query("INSERT INTO test_ledger (task_id, note) VALUES (0, 'order')").execute(conn)?;
            enqueue(conn, &NewTask::new("points.credit", "order-7"))?;
            Ok::<_, Error>(())
        })
        .unwrap();
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 1);
    }

    fn the_callers_own_diesel_connection_is_accepted(db: &TestDb) {
        // enqueue takes a plain PgConnection / SqliteConnection inside diesel's own transaction.
        match db.backend() {
            Backend::Postgres => {
                let mut pg = PgConnection::establish(&db.url_text).unwrap();
                pg.transaction(|c| enqueue(c, &NewTask::new("k", "pg")).map(|_| ()))
                    .unwrap();
            }
            Backend::Sqlite => {
                let mut lite = SqliteConnection::establish(&db.url_text).unwrap();
                lite.immediate_transaction(|c| enqueue(c, &NewTask::new("k", "lite")).map(|_| ()))
                    .unwrap();
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql => {
                let mut my = diesel::mysql::MysqlConnection::establish(&db.url_text).unwrap();
                my.transaction(|c| enqueue(c, &NewTask::new("k", "my")).map(|_| ()))
                    .unwrap();
            }
            #[allow(unreachable_patterns)]
            Backend::Mysql => unreachable!("a MySQL test runs only with the mysql feature"),
        }
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 1);
    }

    fn every_class_of_bad_input_is_a_typed_error_and_writes_nothing(db: &TestDb) {
        let mut conn = db.conn();
        let small = EnqueueOptions::default().max_payload_bytes(100);
        let cases: Vec<(NewTask, ErrorCheck)> = vec![
            (NewTask::new("", "1"), |e| matches!(e, Error::InvalidKeyword { .. })),
            (NewTask::new("Bad Keyword", "1"), |e| matches!(e, Error::InvalidKeyword { .. })),
            (NewTask::new("k".repeat(65), "1"), |e| matches!(e, Error::InvalidKeyword { .. })),
            (NewTask::new("k", ""), |e| matches!(e, Error::InvalidBizId { .. })),
            (NewTask::new("k", "x".repeat(129)), |e| matches!(e, Error::InvalidBizId { .. })),
            // MySQL would take "42 " for "42": refused on every backend.
            (NewTask::new("k", "42 "), |e| matches!(e, Error::InvalidBizId { .. })),
            (NewTask::new("k", "1").tenant("acme "), |e| matches!(e, Error::InvalidTask { .. })),
            (NewTask::new("k", "1").after_key("k", "a\0"), |e| matches!(e, Error::InvalidTask { .. })),
            (NewTask::new("k", "1").payload_json("{not json"), |e| matches!(e, Error::InvalidPayload { .. })),
            (NewTask::new("k", "1").payload_json(r#"{"a":"\u0000"}"#), |e| matches!(e, Error::InvalidPayload { .. })),
            (NewTask::new("k", "1").payload_json(format!("{}{}", "[".repeat(32), "]".repeat(32))), |e| matches!(e, Error::InvalidPayload { .. })),
            (NewTask::new("k", "1").payload(&"x".repeat(200)), |e| matches!(e, Error::PayloadTooLarge { limit: 100, .. })),
            (NewTask::new("k", "1").max_attempts(0), |e| matches!(e, Error::InvalidTask { .. })),
            (NewTask::new("k", "1").tenant("t".repeat(129)), |e| matches!(e, Error::InvalidTask { .. })),
            (NewTask::new("k", "1").delay(Duration::from_secs(400 * 24 * 3600 * 30)), |e| matches!(e, Error::InvalidTask { .. })),
        ];
        for (task, is_expected) in &cases {
            let err = small.enqueue(&mut conn, task).unwrap_err();
            assert!(is_expected(&err), "{task:?} gave {err:?}");
            assert!(!err.to_string().is_empty());
        }
        // One bad task fails the whole batch before anything is written.
        let batch = [NewTask::new("k", "good"), NewTask::new("k", "bad").payload_json("[")];
        assert!(matches!(
            enqueue_batch(&mut conn, &batch),
            Err(Error::InvalidPayload { .. })
        ));
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 0);
        // The deepest payload every backend takes (MariaDB's JSON the shallowest).
        let deepest = NewTask::new("k", "deep").payload_json(format!("{}{}", "{\"a\":".repeat(31), "1".to_owned() + &"}".repeat(31)));
        enqueue(&mut conn, &deepest).unwrap();
        db.exec("DELETE FROM async_task");
        // The default limit is 64 KiB.
        let big = NewTask::new("k", "big").payload(&"x".repeat(64 * 1024));
        assert!(matches!(enqueue(&mut conn, &big), Err(Error::PayloadTooLarge { limit: 65536, .. })));
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 0);
    }
}

/// A batch of several statements outside any transaction opens an IMMEDIATE one on SQLite: a
/// deferred transaction could meet another process's writer between its statements.
#[test]
fn an_sqlite_batch_outside_a_transaction_opens_an_immediate_one() {
    use diesel::connection::{Instrumentation, InstrumentationEvent};
    use std::sync::{Arc, Mutex};

    let db = crate::support::TestDb::sqlite();
    let mut conn = SqliteConnection::establish(&db.url_text).unwrap();
    let queries: Arc<Mutex<Vec<String>>> = Arc::default();
    struct Record(Arc<Mutex<Vec<String>>>);
    impl Instrumentation for Record {
        fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
            if let InstrumentationEvent::StartQuery { query, .. } = event {
                self.0.lock().unwrap().push(query.to_string());
            }
        }
    }
    conn.set_instrumentation(Record(Arc::clone(&queries)));
    // Three rows: statements of two and one.
    let tasks: Vec<NewTask> = (0..3).map(|n| NewTask::new("k", n.to_string())).collect();
    enqueue_batch(&mut conn, &tasks).unwrap();
    let begins: Vec<String> = queries
        .lock()
        .unwrap()
        .iter()
        .filter(|q| q.starts_with("BEGIN"))
        .cloned()
        .collect();
    assert_eq!(begins, ["BEGIN IMMEDIATE"]);
    assert_eq!(db.count("SELECT count(*) FROM async_task"), 3);
}

/// Producers on SQLite connections of their own, configured as outbox's are and writing in
/// IMMEDIATE transactions, never get `database is locked` while a worker drains.
#[test]
fn sqlite_producers_on_configured_connections_never_see_a_locked_database() {
    let db = crate::support::TestDb::sqlite();
    let worker = outbox::Worker::new(
        &db.url,
        crate::ledger_registry("ledger"),
        crate::small_config(),
    )
    .unwrap();
    let producers = 4;
    let orders = 100;
    let stop = worker.stop_flag();
    std::thread::scope(|s| {
        let draining = s.spawn(|| worker.run());
        let results: Vec<Result<(), String>> = (0..producers)
            .map(|p| {
                let url_text = &db.url_text;
                s.spawn(move || -> Result<(), String> {
                    let mut conn =
                        SqliteConnection::establish(url_text).map_err(|e| e.to_string())?;
                    outbox::db::configure_sqlite(&mut conn).map_err(|e| e.to_string())?;
                    for n in 0..orders {
                        conn.immediate_transaction(|conn| {
                            diesel::sql_query(
                                "INSERT INTO test_ledger (task_id, note) VALUES (0, 'order')",
                            )
                            .execute(conn)?;
                            enqueue(conn, &NewTask::new("ledger", format!("{p}-{n}")))
                        })
                        .map_err(|e| format!("producer {p}, order {n}: {e}"))?;
                    }
                    Ok(())
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let total = (producers * orders) as i64;
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        while db.count("SELECT count(*) FROM async_task WHERE state = 'done'") < total
            && std::time::Instant::now() < give_up
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        draining.join().unwrap().unwrap();
        assert_eq!(
            results
                .into_iter()
                .filter_map(Result::err)
                .collect::<Vec<_>>(),
            Vec::<String>::new()
        );
        assert_eq!(
            db.count("SELECT count(*) FROM async_task WHERE state = 'done'"),
            total
        );
    });
}
