//! Batched mode (`commit_batch` > 1): a chunk of tasks in one transaction, completed by one
//! fenced UPDATE; anything failing in the chunk rolls all of it back and its tasks run again
//! one by one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use outbox::{
    enqueue_batch, ClaimStyle, HandlerResult, NewTask, Registry, TaskContext, TaskTx, Worker,
    WorkerConfig,
};

use crate::support::TestDb;
use crate::{five_tasks, write_ledger};

/// One thread, no queue, chunks of 5, pages of 5: a page is exactly one chunk.
fn one_chunk_config() -> WorkerConfig {
    WorkerConfig::default()
        .threads(1)
        .queue(0)
        .page_size(5)
        .commit_batch(5)
}

/// A ledger handler that counts its calls and misbehaves on biz_id `3` as `bad` says.
fn registry(calls: &Arc<AtomicUsize>, bad: fn(&TaskContext) -> HandlerResult) -> Registry {
    let calls = Arc::clone(calls);
    let mut registry = Registry::new();
    registry.register(
        "ledger",
        move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            calls.fetch_add(1, Ordering::SeqCst);
            write_ledger(task, tx)?;
            if task.biz_id() == "3" {
                bad(task)?;
            }
            Ok(())
        },
    );
    registry
}

/// Five tasks drained in one chunk by a worker of `config` whose task 3 fails ("downstream
/// refused"): the chunk rolls back and its tasks run again one by one. Returns the tasks'
/// ids and how many handler calls there were.
fn drain_with_task_3_failing(db: &TestDb, config: WorkerConfig) -> (Vec<i64>, usize) {
    let ids = five_tasks(db);
    let calls = Arc::new(AtomicUsize::new(0));
    let bad =
        |_: &TaskContext| -> HandlerResult { Err(anyhow::anyhow!("downstream refused").into()) };
    let w = Worker::new(&db.url, registry(&calls, bad), config).unwrap();
    let tally = w.run_once().unwrap();
    assert_eq!((tally.done, tally.retried), (4, 1), "{tally:?}");
    (ids, calls.load(Ordering::SeqCst))
}

// `Worker::claim` and `Worker::execute` claim and run the stamp way whatever the claim style.
every_backend! {
    fn a_chunks_tasks_get_a_deadline_that_covers_the_whole_chunk(db: &TestDb) {
        five_tasks(db);
        let config = one_chunk_config().task_timeout(std::time::Duration::from_secs(60));
        let w = Worker::new(&db.url, registry(&Arc::new(AtomicUsize::new(0)), |_| Ok(())), config).unwrap();
        assert_eq!(w.claim().unwrap().len(), 5);
        // Five handlers of up to a minute each, one after another: five minutes.
        let (low, high) = match db.backend() {
            outbox::Backend::Postgres => ("now() + interval '290 seconds'", "now() + interval '310 seconds'"),
            outbox::Backend::Sqlite => (
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '+290 seconds')",
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '+310 seconds')",
            ),
            outbox::Backend::Mysql => (
                "UTC_TIMESTAMP(3) + INTERVAL 290 SECOND",
                "UTC_TIMESTAMP(3) + INTERVAL 310 SECOND",
            ),
        };
        assert_eq!(
            db.count(&format!("SELECT count(*) FROM async_task WHERE deadline_at BETWEEN {low} AND {high}")),
            5
        );
    }

    fn a_lost_claim_rolls_the_chunk_back_and_only_that_task_is_lost(db: &TestDb) {
        let ids = five_tasks(db);
        let calls = Arc::new(AtomicUsize::new(0));
        let w = Worker::new(&db.url, registry(&calls, |_| Ok(())), one_chunk_config()).unwrap();
        let page = w.claim().unwrap();
        assert_eq!(page.len(), 5);
        // Task 3's claim is taken over (as by a rescue and a new claim) before the chunk runs.
        db.exec(&format!(
            "UPDATE async_task SET claim_token = claim_token + 1 WHERE id = {}",
            ids[2]
        ));
        let tally = w.execute(page);
        assert_eq!((tally.done, tally.lost), (4, 1), "{tally:?}");
        // All five ran in the chunk, which rolled back; then each this node still held ran
        // alone: not the lost one, whose claim is another's (its effects would run twice).
        assert_eq!(calls.load(Ordering::SeqCst), 5 + 4);
        assert_eq!(db.ledger_rows(ids[2]), 0, "the lost task's effects rolled back");
        assert_eq!(db.task(ids[2]).state, "running", "left to its new owner");
        for id in [ids[0], ids[1], ids[3], ids[4]] {
            assert_eq!(db.task(id).state, "done");
            assert_eq!(db.ledger_rows(id), 1, "exactly one effect");
        }
    }
}

/// Runs each `fn name(db: &TestDb, config: WorkerConfig) { … }` on SQLite, and on PostgreSQL
/// and MySQL with each claim style, `config` being [`one_chunk_config`] with that style
/// (`but_mysql` before the list: not on MySQL).
macro_rules! every_claim_style {
    (but_mysql $($tests:tt)*) => {
        every_claim_style! { @mysql cfg(any()) $($tests)* }
    };
    (@mysql $mysql:meta $(fn $name:ident($db:ident: &TestDb, $config:ident: WorkerConfig) $body:block)*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            fn sqlite() {
                let $db = &TestDb::sqlite();
                let $config = one_chunk_config();
                $body
            }

            #[test]
            fn postgres_stamp() {
                let $db = &TestDb::postgres();
                let $config = one_chunk_config().claim_style(ClaimStyle::Stamp);
                $body
            }

            #[test]
            fn postgres_lock() {
                let $db = &TestDb::postgres();
                let $config = one_chunk_config().claim_style(ClaimStyle::Lock);
                $body
            }

            #[$mysql]
            #[test]
            fn mysql_stamp() {
                let $db = &TestDb::mysql();
                let $config = one_chunk_config().claim_style(ClaimStyle::Stamp);
                $body
            }

            #[$mysql]
            #[test]
            fn mysql_lock() {
                let $db = &TestDb::mysql();
                let $config = one_chunk_config().claim_style(ClaimStyle::Lock);
                $body
            }
        }
    )*};
    ($($tests:tt)*) => {
        every_claim_style! { @mysql cfg(feature = "mysql") $($tests)* }
    };
}

every_claim_style! {
    fn a_chunk_commits_all_its_tasks_together(db: &TestDb, config: WorkerConfig) {
        let ids = five_tasks(db);
        let calls = Arc::new(AtomicUsize::new(0));
        let w = Worker::new(&db.url, registry(&calls, |_| Ok(())), config).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!((tally.claimed, tally.done), (5, 5), "{tally:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 5, "each handler ran once");
        for id in ids {
            assert_eq!(db.task(id).state, "done");
            assert_eq!(db.ledger_rows(id), 1);
        }
    }

    fn a_failing_task_neither_loses_nor_completes_the_others(db: &TestDb, config: WorkerConfig) {
        let (ids, calls) = drain_with_task_3_failing(db, config);
        // Tasks 1–3 ran in the chunk that rolled back, then all five ran one by one: effects
        // outside the database would have happened twice for 1–3.
        assert_eq!(calls, 3 + 5);
        for (n, id) in ids.iter().enumerate() {
            let row = db.task(*id);
            if n == 2 {
                assert_eq!((row.state.as_str(), row.failures), ("pending", 1));
                assert!(row.last_error.unwrap().contains("downstream refused"));
                assert_eq!(db.ledger_rows(*id), 0, "the failed task's effect rolled back");
            } else {
                assert_eq!((row.state.as_str(), row.failures), ("done", 0));
                assert_eq!(db.ledger_rows(*id), 1, "task {}: exactly one effect", n + 1);
            }
        }
    }

    fn a_task_run_again_after_its_chunk_rolled_back_says_so(db: &TestDb, config: WorkerConfig) {
        // Tasks 1 and 2 ran in the chunk before task 3 failed it: their effects outside the
        // database may have happened twice, and `last_error` says why (as for a rescued or
        // released task). Tasks 4 and 5 never ran in the chunk: nothing to say.
        let (ids, _) = drain_with_task_3_failing(db, config);
        for id in [ids[0], ids[1]] {
            let row = db.task(id);
            assert_eq!(row.state, "done");
            let note = row.last_error.expect("a note on a task that ran twice");
            assert!(note.contains("its chunk rolled back"), "{note}");
        }
        for id in [ids[3], ids[4]] {
            let row = db.task(id);
            assert_eq!((row.state.as_str(), row.last_error), ("done", None));
        }
    }

    fn a_task_run_again_after_its_chunk_rolled_back_has_its_own_time(db: &TestDb, config: WorkerConfig) {
        // A chunk of three 1.6 s tasks with a domain's timeout of 2.5 s (the task timeout
        // 1 s): the chunk's deadline is 7.5 s, and the second fails at 3.2 s. Run again alone,
        // the first ends at 4.8 s, the second at 6.4 s and the third at 8 s: each has a
        // deadline of its own, of its domain's timeout (5.7, 8.2 and 10.7 s), and a rescuer
        // passing all the while charges nothing.
        use std::sync::atomic::AtomicBool;
        use std::time::Duration;
        let ids: Vec<i64> = enqueue_batch(&mut db.conn(), &[NewTask::new("ledger", "1"), NewTask::new("ledger", "2"), NewTask::new("ledger", "3")])
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        let mut registry = Registry::new();
        registry.register("ledger", |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            std::thread::sleep(Duration::from_millis(1600));
            write_ledger(task, tx)?;
            match task.biz_id() {
                "2" => Err(anyhow::anyhow!("downstream refused").into()),
                _ => Ok(()),
            }
        });
        let config = config
            .page_size(3)
            .commit_batch(3)
            .task_timeout(Duration::from_secs(1))
            .domain(outbox::domain::Domain::max("d", ["ledger"], 1).timeout(Duration::from_millis(2500)));
        let w = Worker::new(&db.url, registry, config).unwrap();
        let rescuer = crate::rescue::quiet_worker(db);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let passes = s.spawn(|| {
                let mut rescued = 0;
                while !stop.load(Ordering::SeqCst) {
                    rescued += rescuer.rescue_once().unwrap().pending;
                    std::thread::sleep(Duration::from_millis(50));
                }
                rescued
            });
            let tally = w.run_once().unwrap();
            stop.store(true, Ordering::SeqCst);
            assert_eq!(passes.join().unwrap(), 0, "{tally:?}");
        });
        for id in [ids[0], ids[2]] {
            let task = db.task(id);
            assert_eq!((task.state.as_str(), task.failures), ("done", 0));
            assert_eq!(db.ledger_rows(id), 1);
        }
    }

    fn a_panic_in_a_chunk_is_that_tasks_failure_only(db: &TestDb, config: WorkerConfig) {
        let ids = five_tasks(db);
        let calls = Arc::new(AtomicUsize::new(0));
        let bad = |_: &TaskContext| -> HandlerResult { panic!("boom in the chunk") };
        let w = Worker::new(&db.url, registry(&calls, bad), config).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!((tally.done, tally.retried), (4, 1), "{tally:?}");
        let row = db.task(ids[2]);
        assert_eq!((row.state.as_str(), row.failures), ("pending", 1));
        assert!(row.last_error.unwrap().contains("boom in the chunk"));
        assert_eq!(db.ledger_rows(ids[2]), 0);
        for id in [ids[0], ids[1], ids[3], ids[4]] {
            assert_eq!(db.task(id).state, "done");
            assert_eq!(db.ledger_rows(id), 1);
        }
        // The worker carries on.
        db.make_all_due();
        assert_eq!(w.run_once().unwrap().retried, 1);
    }
}

/// A chunk whose commit happened but whose reply was lost (a proxy forwards the COMMIT, then
/// drops the connection): the worker finds its tasks done under their own claims (stamp
/// claims), or asks whether the chunk's transaction committed (lock claims), counts them
/// done, and runs no handler again. PostgreSQL only (a server to proxy).
#[test]
fn a_chunk_whose_commit_reply_was_lost_is_counted_done_and_not_run_again() {
    for style in [ClaimStyle::Stamp, ClaimStyle::Lock] {
        let db = &TestDb::postgres();
        let ids = five_tasks(db);
        let proxy = crate::proxy::CommitReplyLoser::start(&db.url_text);
        let calls = Arc::new(AtomicUsize::new(0));
        let calls_in = Arc::clone(&calls);
        let mut registry = Registry::new();
        registry.register(
            "ledger",
            move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                calls_in.fetch_add(1, Ordering::SeqCst);
                write_ledger(task, tx)?;
                if task.biz_id() == "5" {
                    // The chunk's connection: its COMMIT's reply is lost, no other's.
                    diesel::RunQueryDsl::execute(
                        diesel::sql_query(crate::proxy::CommitReplyLoser::ARM),
                        tx.conn()?,
                    )?;
                }
                Ok(())
            },
        );
        let url = outbox::DatabaseUrl::parse(&proxy.url).unwrap();
        let w = Worker::new(&url, registry, one_chunk_config().claim_style(style)).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!(
            proxy.lost(),
            1,
            "{style}: the chunk's commit reply was lost ({tally:?}, {} handler calls)",
            calls.load(Ordering::SeqCst)
        );
        assert_eq!((tally.done, tally.lost), (5, 0), "{style}: {tally:?}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            5,
            "{style}: no handler ran twice"
        );
        for id in ids {
            assert_eq!(db.task(id).state, "done");
            assert_eq!(
                db.ledger_rows(id),
                1,
                "{style}: task {id}: exactly one effect"
            );
        }
    }
}

// MySQL checks a foreign key at each statement: it has no deferred constraint to fail a
// COMMIT.
every_claim_style! {
    but_mysql
    fn a_chunk_that_fails_at_commit_rolls_back_and_runs_task_by_task(db: &TestDb, config: WorkerConfig) {
        // Task 3 leaves a deferred foreign key violation: the handler returns Ok, the
        // chunk's COMMIT fails, nothing of the chunk is applied.
        db.exec("CREATE TABLE test_parent (id BIGINT PRIMARY KEY)");
        db.exec(
            "CREATE TABLE test_child (parent_id BIGINT NOT NULL \
             REFERENCES test_parent (id) DEFERRABLE INITIALLY DEFERRED)",
        );
        let ids = five_tasks(db);
        let calls = Arc::new(AtomicUsize::new(0));
        let calls_in = Arc::clone(&calls);
        let mut registry = Registry::new();
        registry.register("ledger", move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            use diesel::RunQueryDsl;
            calls_in.fetch_add(1, Ordering::SeqCst);
            write_ledger(task, tx)?;
            if task.biz_id() == "3" {
                diesel::sql_query("INSERT INTO test_child (parent_id) VALUES (42)").execute(tx.conn()?)?;
            }
            Ok(())
        });
        let w = Worker::new(&db.url, registry, config).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!((tally.done, tally.retried), (4, 1), "{tally:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 5 + 5);
        let row = db.task(ids[2]);
        assert_eq!((row.state.as_str(), row.failures), ("pending", 1));
        assert!(row.last_error.unwrap().contains("the task's transaction failed"));
        assert_eq!(db.ledger_rows(ids[2]), 0);
        assert_eq!(db.count("SELECT count(*) FROM test_child"), 0);
        for id in [ids[0], ids[1], ids[3], ids[4]] {
            assert_eq!(db.task(id).state, "done");
            assert_eq!(db.ledger_rows(id), 1);
        }
    }
}

/// Every session of the worker's database ends while task 3 of a chunk runs (a failover, an
/// operator's `pg_terminate_backend` or `KILL` sweep), the pool's idle connections with the
/// chunk's: the chunk rolls back, and the first statements after it meet dead connections.
/// Tasks 1 to 4 ran in the chunk (4 found the connection gone); each runs again alone only
/// once its `last_error` says so (the note is retried through the outage), since its effects
/// outside the database may have happened twice. PostgreSQL and MySQL, each claim style
/// (SQLite has no session to end). With stamp claims the check meets the dead connections;
/// with lock claims the tasks' claim again, retried, takes them first, so there the test
/// guards the rerun's note without reaching a dead connection.
#[test]
fn a_task_run_again_after_its_chunk_rolled_back_says_so_after_a_sweep_of_sessions() {
    let mut dbs = vec![
        (TestDb::postgres(), ClaimStyle::Stamp),
        (TestDb::postgres(), ClaimStyle::Lock),
    ];
    #[cfg(feature = "mysql")]
    dbs.extend([
        (TestDb::mysql(), ClaimStyle::Stamp),
        (TestDb::mysql(), ClaimStyle::Lock),
    ]);
    for (db, style) in &dbs {
        let ids = five_tasks(db);
        let calls = Arc::new(AtomicUsize::new(0));
        let swept = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (calls_in, swept_in, url) = (Arc::clone(&calls), Arc::clone(&swept), db.url.clone());
        let mut registry = Registry::new();
        registry.register(
            "ledger",
            move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                calls_in.fetch_add(1, Ordering::SeqCst);
                write_ledger(task, tx)?;
                if task.biz_id() == "3" && !swept_in.swap(true, Ordering::SeqCst) {
                    end_every_other_session(&url)?;
                }
                Ok(())
            },
        );
        // A short deadline: a rerun that waited for it would fail the test, not hang it.
        let config = one_chunk_config()
            .claim_style(*style)
            .task_timeout(std::time::Duration::from_secs(2));
        let w = Worker::new(&db.url, registry, config).unwrap();
        // Idle connections in the pool beside the chunk's: the sweep leaves them dead, to be
        // found so at their next use.
        let idle: Vec<_> = (0..w.pool().max_size())
            .map(|_| w.pool().get().unwrap())
            .collect();
        drop(idle);
        let tally = w.run_once().unwrap();
        assert!(swept.load(Ordering::SeqCst), "{style}");
        assert_eq!((tally.done, tally.retried), (5, 0), "{style}: {tally:?}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            4 + 5,
            "{style}: the chunk, then each alone"
        );
        for (n, id) in ids.iter().enumerate() {
            let row = db.task(*id);
            assert_eq!(
                (row.state.as_str(), row.failures),
                ("done", 0),
                "{style}: task {}",
                n + 1
            );
            assert_eq!(
                db.ledger_rows(*id),
                1,
                "{style}: task {}: exactly one effect",
                n + 1
            );
            match n {
                0..=3 => {
                    let note = row.last_error.unwrap_or_else(|| {
                        panic!("{style}: task {} ran twice and does not say so", n + 1)
                    });
                    assert!(note.contains("its chunk rolled back"), "{style}: {note}");
                }
                _ => assert_eq!(row.last_error, None, "{style}: task {}", n + 1),
            }
        }
    }
}

/// PostgreSQL, stamp claims: task 5, the last of a chunk, closes its database to new
/// connections and ends every session of it. All five ran in the chunk, and the note that each
/// runs again cannot be written until the claim's deadline: none of them runs again here. They
/// stay running for rescue, which charges each a failure and says why in `last_error`.
#[test]
fn a_task_whose_rerun_cannot_be_noted_before_its_deadline_is_left_to_rescue() {
    use std::time::Duration;
    let db = &TestDb::postgres();
    let ids = five_tasks(db);
    let calls = Arc::new(AtomicUsize::new(0));
    let calls_in = Arc::clone(&calls);
    let name = db.url_text.rsplit('/').next().unwrap().to_owned();
    let close = format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false");
    let end =
        format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'");
    let mut registry = Registry::new();
    registry.register(
        "ledger",
        move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            calls_in.fetch_add(1, Ordering::SeqCst);
            write_ledger(task, tx)?;
            if task.biz_id() == "5" {
                // From the server's own database: not in the chunk's transaction, which rolls
                // back, nor on the database it closes.
                let mut admin: diesel::PgConnection =
                    diesel::Connection::establish(crate::support::pg_server_url())
                        .expect("the server");
                diesel::RunQueryDsl::execute(diesel::sql_query(&close), &mut admin)?;
                diesel::RunQueryDsl::execute(diesel::sql_query(&end), &mut admin)?;
            }
            Ok(())
        },
    );
    let config = one_chunk_config()
        .claim_style(ClaimStyle::Stamp)
        .task_timeout(Duration::from_millis(300));
    let w = Worker::new(&db.url, registry, config).unwrap();
    let idle: Vec<_> = (0..w.pool().max_size())
        .map(|_| w.pool().get().unwrap())
        .collect();
    drop(idle);
    let tally = w.run_once();
    let reopen = format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true");
    let mut admin: diesel::PgConnection =
        diesel::Connection::establish(crate::support::pg_server_url()).expect("the server");
    diesel::RunQueryDsl::execute(diesel::sql_query(reopen), &mut admin)
        .expect("reopen the database");
    let tally = tally.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "no task ran again: {tally:?}"
    );
    assert_eq!(tally.abandoned, 5, "{tally:?}");
    for (n, id) in ids.iter().enumerate() {
        let row = db.task(*id);
        assert_eq!(
            (row.state.as_str(), row.failures),
            ("running", 0),
            "task {}",
            n + 1
        );
        assert_eq!(
            db.ledger_rows(*id),
            0,
            "task {}: its effect rolled back",
            n + 1
        );
    }
    // Past the claims' deadline (backdated), rescue charges each a failure with its reason.
    db.exec("UPDATE async_task SET deadline_at = run_at - interval '1 hour'");
    let rescued = crate::rescue::quiet_worker(db).rescue_once().unwrap();
    assert_eq!(rescued.pending, 5, "{rescued:?}");
    for id in &ids {
        let row = db.task(*id);
        assert_eq!((row.state.as_str(), row.failures), ("pending", 1));
        let note = row.last_error.expect("rescue's reason");
        assert!(note.contains("running past its deadline"), "{note}");
    }
}

/// Ends every session of `url`'s database but the one this opens to do it.
fn end_every_other_session(url: &outbox::DatabaseUrl) -> diesel::QueryResult<()> {
    use diesel::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut conn = url.connect().expect("a connection to end the others");
    let others = match url.backend() {
        outbox::Backend::Mysql => {
            "SELECT CAST(id AS SIGNED) AS n FROM information_schema.processlist
             WHERE db = DATABASE() AND id <> CONNECTION_ID()"
        }
        _ => {
            "SELECT CAST(pid AS BIGINT) AS n FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()"
        }
    };
    for id in diesel::sql_query(others).load::<Id>(&mut conn)? {
        let end = match url.backend() {
            outbox::Backend::Mysql => format!("KILL {}", id.n),
            _ => format!("SELECT pg_terminate_backend({})", id.n),
        };
        // A session may have ended on its own meanwhile.
        let _ = diesel::sql_query(end).execute(&mut conn);
    }
    Ok(())
}
