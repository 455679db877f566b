//! Lock claims (PostgreSQL): a chunk's tasks leased by one statement that writes no task
//! row, run in a transaction that marks them done as it deletes their leases. The chunk
//! semantics they share with stamped claims (a failure rolls the chunk back, each task still
//! held then runs alone) are in `batched`, run with each claim style.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use diesel::RunQueryDsl;
use outbox::{
    enqueue_batch, ClaimStyle, DatabaseUrl, Error, HandlerResult, NewTask, Registry, TaskContext,
    TaskTx, Worker, WorkerConfig,
};

use crate::support::TestDb;
use crate::write_ledger;
use outbox::Backend;

/// One thread, chunks of 5, pages of 5, with `style`.
fn chunk_config(style: ClaimStyle) -> WorkerConfig {
    WorkerConfig::default()
        .threads(1)
        .page_size(5)
        .commit_batch(5)
        .claim_style(style)
}

fn enqueue(db: &TestDb, keyword: &str, n: usize) -> Vec<i64> {
    let tasks: Vec<NewTask> = (1..=n)
        .map(|i| NewTask::new(keyword, i.to_string()))
        .collect();
    enqueue_batch(&mut db.conn(), &tasks)
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect()
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// A count on a fresh connection of `url`.
fn count_on(url: &DatabaseUrl, sql: &str) -> i64 {
    let mut conn = url.connect().expect("connect");
    diesel::sql_query(sql)
        .get_result::<Count>(&mut conn)
        .expect(sql)
        .n
}

/// A count in the task's transaction.
fn count_on_tx(tx: &mut TaskTx, sql: &str) -> diesel::QueryResult<i64> {
    Ok(diesel::sql_query(sql).get_result::<Count>(tx.conn()?)?.n)
}

/// Row versions written to `async_task` by updates, once every other backend of the
/// database has exited (a backend's statistics reach the shared counters when it exits).
fn task_updates_after_backends_exit(db: &TestDb) -> i64 {
    let mut waited = 0;
    while db.count(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    ) > 0
    {
        waited += 1;
        assert!(waited < 500, "the worker's backends did not exit");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    db.count("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'async_task'")
}

/// Runs five ledger tasks in one chunk with `style` and returns the updates to the table.
fn updates_for_five_tasks(style: ClaimStyle) -> i64 {
    let db = &TestDb::postgres();
    enqueue(db, "ledger", 5);
    let before = task_updates_after_backends_exit(db);
    let mut registry = Registry::new();
    registry.register("ledger", write_ledger);
    let w = Worker::new(&db.url, registry, chunk_config(style)).unwrap();
    assert_eq!(w.run_once().unwrap().done, 5);
    drop(w);
    assert_eq!(
        db.count("SELECT count(*) FROM async_task WHERE state = 'done'"),
        5
    );
    task_updates_after_backends_exit(db) - before
}

#[test]
fn a_lock_claim_writes_one_row_version_per_task_and_a_stamped_claim_two() {
    assert_eq!(updates_for_five_tasks(ClaimStyle::Lock), 5);
    assert_eq!(updates_for_five_tasks(ClaimStyle::Stamp), 10);
}

server_backends! {
    fn a_leased_chunks_tasks_stay_pending_unlocked_and_leased_until_it_commits(db: &TestDb) {
        let ids = enqueue(db, "ledger", 5);
        let seen = Arc::new(AtomicBool::new(false));
        let (seen_in, url) = (Arc::clone(&seen), db.url.clone());
        let mut registry = Registry::new();
        registry.register(
            "ledger",
            move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                write_ledger(task, tx)?;
                if task.biz_id() == "3" {
                    // Seen from another connection while the chunk runs: pending (nothing was
                    // written to the tasks at the claim), not locked (a cancel would not wait),
                    // and leased (a claim skips every one of them).
                    assert_eq!(
                        count_on(
                            &url,
                            "SELECT count(*) AS n FROM async_task WHERE state = 'pending'"
                        ),
                        5
                    );
                    let free = "SELECT id AS n FROM async_task FOR UPDATE SKIP LOCKED";
                    let mut other = url.connect()?;
                    diesel::sql_query("BEGIN").execute(&mut other)?;
                    let free = diesel::sql_query(free).load::<Count>(&mut other)?.len();
                    diesel::sql_query("ROLLBACK").execute(&mut other)?;
                    assert_eq!(free, 5, "no task row of the chunk is locked");
                    assert_eq!(
                        count_on(&url, "SELECT count(*) AS n FROM async_lease"),
                        5,
                        "every task of the chunk is leased"
                    );
                    let mut stamp = Registry::new();
                    stamp.register("ledger", write_ledger);
                    let other = Worker::new(&url, stamp, chunk_config(ClaimStyle::Stamp))?;
                    assert_eq!(other.claim()?.len(), 0, "another node's claim takes none");
                    seen_in.store(true, Ordering::SeqCst);
                }
                Ok(())
            },
        );
        let w = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
        let tally = w.run_once().unwrap();
        assert!(seen.load(Ordering::SeqCst), "the handler looked");
        assert_eq!((tally.claimed, tally.done), (5, 5), "{tally:?}");
        for id in ids {
            let row = db.task(id);
            assert_eq!((row.state.as_str(), row.failures), ("done", 0));
            assert_eq!(row.owner, Some(w.node_id()), "the node that ran it");
            assert_eq!(db.ledger_rows(id), 1);
        }
    }

    fn a_leased_task_cancelled_while_its_chunk_runs_says_so_and_a_retry_keeps_it(db: &TestDb) {
        let ids = enqueue(db, "mail.send", 5);
        let runs = Arc::new(AtomicUsize::new(0));
        let cancelled = Arc::new(AtomicBool::new(false));
        let (runs_in, cancelled_in, url) = (Arc::clone(&runs), Arc::clone(&cancelled), db.url.clone());
        let mut registry = Registry::new();
        registry.register(
            "mail.send",
            move |task: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                runs_in.fetch_add(1, Ordering::SeqCst);
                // An effect outside the database (it happened), then an operator cancels the
                // task: it is pending and leased, its row not locked.
                if task.biz_id() == "3" && !cancelled_in.swap(true, Ordering::SeqCst) {
                    assert!(outbox::cancel(&mut url.connect()?, task.id())?.cancelled);
                }
                Ok(())
            },
        );
        let w = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!((tally.done, tally.lost), (4, 1), "{tally:?}");
        let note = Some("cancelled while running: its handler may have run".to_owned());
        let task = db.task(ids[2]);
        assert_eq!((task.state.as_str(), &task.last_error), ("cancelled", &note));
        assert!(outbox::retry(&mut db.conn(), ids[2]).unwrap().retried);
        assert_eq!(w.run_once().unwrap().done, 1);
        let task = db.task(ids[2]);
        assert_eq!((task.state.as_str(), &task.last_error), ("done", &note), "its second run says why");
    }

    fn nodes_count_a_leased_chunks_tasks_as_running(db: &TestDb) {
        enqueue(db, "ledger", 5);
        let seen: Arc<std::sync::Mutex<Vec<outbox::ops::NodeInfo>>> = Arc::default();
        let (seen_in, url) = (Arc::clone(&seen), db.url.clone());
        let mut registry = Registry::new();
        registry.register(
            "ledger",
            move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                if task.biz_id() == "3" {
                    let query = outbox::ops::NodeQuery::default();
                    *seen_in.lock().unwrap() = outbox::ops::nodes(&mut url.connect()?, &query)?;
                }
                write_ledger(task, tx)
            },
        );
        let w = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
        assert_eq!(w.run_once().unwrap().done, 5);
        let seen = seen.lock().unwrap().clone();
        let node = seen.iter().find(|n| n.id == w.node_id()).expect("the node listed");
        assert_eq!(node.running, 5, "its chunk's tasks, pending and leased: {node:?}");
    }

    fn a_leased_task_cancelled_and_retried_while_its_chunk_runs_is_not_done_by_that_chunk(db: &TestDb) {
        // The handler sees the cancel and returns without its effect, as the guide allows;
        // an operator retries the task before the chunk completes. The retry is a new run to
        // come: the chunk whose lease predates it must not mark the task done.
        let ids = enqueue(db, "ledger", 5);
        let once = Arc::new(AtomicBool::new(false));
        let (once_in, url) = (Arc::clone(&once), db.url.clone());
        let mut registry = Registry::new();
        registry.register(
            "ledger",
            move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                if task.biz_id() == "3" && !once_in.swap(true, Ordering::SeqCst) {
                    let mut operator = url.connect()?;
                    assert!(outbox::cancel(&mut operator, task.id())?.cancelled);
                    assert!(outbox::retry(&mut operator, task.id())?.retried);
                    return Ok(());
                }
                write_ledger(task, tx)
            },
        );
        let w = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!(tally.done, 4, "{tally:?}");
        let task = db.task(ids[2]);
        assert_eq!(task.state.as_str(), "pending", "retried, not done by the cancelled run");
        assert_eq!(db.ledger_rows(ids[2]), 0);
        assert_eq!(w.run_once().unwrap().done, 1, "the retry runs");
        assert_eq!(db.task(ids[2]).state.as_str(), "done");
        assert_eq!(db.ledger_rows(ids[2]), 1);
    }

    fn a_leased_task_cancelled_unseen_while_its_chunk_runs_is_noted_by_the_chunk(db: &TestDb) {
        // A cancel whose statement could not see the lease (PostgreSQL: its snapshot predates
        // the lock claim's commit; a producer at REPEATABLE READ) writes no note. The chunk,
        // whose completion the cancel fences out, writes it: its handler ran. So it does when
        // the worker is stopping then, and releases the chunk instead of running it again. It
        // does when the note's first write fails, too (a connection lost, here a trigger's
        // error): the note is written with the leases' end, in one transaction, retried.
        for (keyword, stopping, fault) in [
            ("mail.send", false, false),
            ("mail.stop", true, false),
            ("mail.fault", false, true),
            ("mail.stop_fault", true, true),
        ] {
            if fault {
                fail_the_next_cancel_note(db);
            }
            let ids = enqueue(db, keyword, 5);
            let stop: Arc<std::sync::OnceLock<Arc<AtomicBool>>> = Arc::default();
            let once = Arc::new(AtomicBool::new(false));
            let (stop_in, url) = (Arc::clone(&stop), db.url.clone());
            let mut registry = Registry::new();
            registry.register(
                keyword,
                move |task: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                    if task.biz_id() == "3" && !once.swap(true, Ordering::SeqCst) {
                        let cancel = format!(
                            "UPDATE async_task SET state = 'cancelled', finished_at = updated_at WHERE id = {}",
                            task.id()
                        );
                        diesel::sql_query(cancel).execute(&mut url.connect()?)?;
                        if stopping {
                            stop_in.get().expect("the stop flag").store(true, Ordering::SeqCst);
                        }
                    }
                    Ok(())
                },
            );
            let w = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
            stop.set(w.stop_flag()).unwrap();
            let tally = w.run_once().unwrap();
            let expected = if stopping { (0, 0, 5) } else { (4, 1, 0) };
            assert_eq!((tally.done, tally.lost, tally.released), expected, "{keyword}: {tally:?}");
            let task = db.task(ids[2]);
            let note = Some("cancelled while running: its handler may have run".to_owned());
            assert_eq!((task.state.as_str(), &task.last_error), ("cancelled", &note), "{keyword}");
            if fault {
                assert_eq!(db.count(FAULTS_LEFT), 0, "{keyword}: the fault was met");
            }
        }
    }

    fn a_parent_cannot_be_added_to_a_task_leased_to_a_running_chunk(db: &TestDb) {
        // A producer's SQL links a task as another's child while the task's handler runs in a
        // leased chunk (pending, its row unlocked): refused, as for a running task. Accepted,
        // it blocked the task behind the parent, the chunk rolled back, and the task ran again
        // once the parent was done, its effect twice and no reason given.
        let parent = enqueue(db, "mail.later", 1)[0];
        let ids = enqueue(db, "mail.send", 1);
        let runs = Arc::new(AtomicUsize::new(0));
        let linked: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
        let (runs_in, linked_in, url) = (Arc::clone(&runs), Arc::clone(&linked), db.url.clone());
        let mut registry = Registry::new();
        registry.register(
            "mail.send",
            move |task: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                runs_in.fetch_add(1, Ordering::SeqCst);
                let link = format!(
                    "INSERT INTO async_task_parent (child_id, parent_id) VALUES ({}, {parent})",
                    task.id()
                );
                let result = diesel::sql_query(link).execute(&mut url.connect()?);
                *linked_in.lock().unwrap() = Some(match result {
                    Ok(n) => format!("linked ({n} row)"),
                    Err(e) => e.to_string(),
                });
                Ok(())
            },
        );
        let w = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
        let tally = w.run_once().unwrap();
        let linked = linked.lock().unwrap().clone().expect("the handler ran");
        assert!(
            linked.contains("leased to a running chunk") || linked.contains("has started"),
            "the link was not refused as one to a started task: {linked}"
        );
        assert_eq!((tally.done, runs.load(Ordering::SeqCst)), (1, 1), "{tally:?}");
        assert_eq!(db.task(ids[0]).state, "done");
        assert_eq!(db.count("SELECT count(*) FROM async_task_parent"), 0, "no link");
    }

    fn a_cancel_committed_while_the_claim_again_waits_for_its_row_is_noted(db: &TestDb) {
        // Task 2's handler ran; task 3's cancels task 2 in a transaction that could not see
        // the lease (no note) and holds it open, then fails: the chunk rolls back. The claim
        // again waits for task 2's row, and the cancel commits while it waits: task 2 is not
        // claimed, and its note must be written though the claim's snapshot saw it pending.
        let ids = enqueue(db, "mail.send", 5);
        let holder: Arc<std::sync::Mutex<Option<std::thread::JoinHandle<bool>>>> = Arc::default();
        let (holder_in, url, second) = (Arc::clone(&holder), db.url.clone(), ids[1]);
        let mut registry = Registry::new();
        registry.register(
            "mail.send",
            move |task: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                let mut holder = holder_in.lock().unwrap();
                if task.biz_id() == "3" && holder.is_none() {
                    let mut cancel = url.connect()?;
                    diesel::sql_query("BEGIN").execute(&mut cancel)?;
                    let sql = format!(
                        "UPDATE async_task SET state = 'cancelled', finished_at = updated_at WHERE id = {second}"
                    );
                    diesel::sql_query(sql).execute(&mut cancel)?;
                    let url = url.clone();
                    *holder = Some(std::thread::spawn(move || {
                        commit_once_a_session_waits_for_a_lock(&url, &mut cancel)
                    }));
                    return Err(anyhow::anyhow!("fails once, with the cancel open").into());
                }
                Ok(())
            },
        );
        let w = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
        let tally = w.run_once().unwrap();
        let waited = holder.lock().unwrap().take().expect("the cancel began").join().unwrap();
        assert!(waited, "the claim again waited for the cancel's row");
        assert_eq!((tally.done, tally.lost), (4, 1), "{tally:?}");
        let task = db.task(ids[1]);
        let note = Some("cancelled while running: its handler may have run".to_owned());
        assert_eq!((task.state.as_str(), &task.last_error), ("cancelled", &note));
    }

    fn a_leased_chunk_rolled_back_as_its_worker_stops_notes_the_tasks_whose_handlers_ran(db: &TestDb) {
        let ids = enqueue(db, "mail.send", 5);
        let stop: Arc<std::sync::OnceLock<Arc<AtomicBool>>> = Arc::default();
        let stop_in = Arc::clone(&stop);
        let mut registry = Registry::new();
        registry.register(
            "mail.send",
            move |task: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                // Tasks 1 and 2 have their effects outside the database; task 3's handler fails
                // as the worker is told to stop: the chunk rolls back while it stops.
                if task.biz_id() == "3" {
                    stop_in.get().expect("the stop flag").store(true, Ordering::SeqCst);
                    return Err(anyhow::anyhow!("failed during the stop").into());
                }
                Ok(())
            },
        );
        let w = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
        stop.set(w.stop_flag()).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!((tally.done, tally.released), (0, 5), "{tally:?}");
        assert_eq!(count_on(&db.url, "SELECT count(*) AS n FROM async_lease"), 0, "released");
        let notes: Vec<(String, Option<String>)> = ids
            .iter()
            .map(|&id| {
                let task = db.task(id);
                (task.state, task.last_error)
            })
            .collect();
        let ran = Some("released: its chunk rolled back after its handler ran, as its worker stopped".to_owned());
        assert_eq!(
            notes,
            [
                ("pending".to_owned(), ran.clone()),
                ("pending".to_owned(), ran.clone()),
                ("pending".to_owned(), ran),
                ("pending".to_owned(), None),
                ("pending".to_owned(), None),
            ],
            "the tasks whose handlers ran say so: they run again"
        );
    }

    fn a_locked_chunk_whose_connection_dies_leaves_its_tasks_pending_with_no_failure_counted(db: &TestDb) {
        let ids = enqueue(db, "ledger", 5);
        let calls = Arc::new(AtomicUsize::new(0));
        let killed = Arc::new(AtomicBool::new(false));
        let (calls_in, killed_in, url) = (Arc::clone(&calls), Arc::clone(&killed), db.url.clone());
        let mut registry = Registry::new();
        registry.register(
            "ledger",
            move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                calls_in.fetch_add(1, Ordering::SeqCst);
                write_ledger(task, tx)?;
                if task.biz_id() == "3" && !killed_in.swap(true, Ordering::SeqCst) {
                    // The chunk's server process dies, as with a crash of the worker or a
                    // restart of the server: its transaction rolls back.
                    let (own, end) = match url.backend() {
                        Backend::Mysql => ("SELECT CAST(CONNECTION_ID() AS SIGNED) AS n", "KILL"),
                        _ => ("SELECT pg_backend_pid()::bigint AS n", "SELECT pg_terminate_backend"),
                    };
                    let own = count_on_tx(tx, own)?;
                    diesel::sql_query(format!("{end}({own})")).execute(&mut url.connect()?)?;
                }
                Ok(())
            },
        );
        let w = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
        let tally = w.run_once().unwrap();
        assert!(killed.load(Ordering::SeqCst));
        // The chunk rolled back (task 4's handler found the connection gone); then each task
        // ran alone, task 3's kill not repeated.
        assert_eq!((tally.done, tally.retried), (5, 0), "{tally:?}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            4 + 5,
            "the chunk, then each task alone"
        );
        for id in ids {
            let row = db.task(id);
            assert_eq!(
                (row.state.as_str(), row.failures),
                ("done", 0),
                "no failure counted"
            );
            assert_eq!(db.ledger_rows(id), 1, "task {id}: exactly one effect");
        }
    }

    fn lock_and_stamp_workers_draining_one_table_run_every_task_exactly_once(db: &TestDb) {
        enqueue(db, "ledger", 600);
        let mut registry = Registry::new();
        registry.register("ledger", write_ledger);
        let config = |style| {
            WorkerConfig::default()
                .threads(2)
                .commit_batch(10)
                .claim_style(style)
        };
        let workers = [
            Worker::new(&db.url, registry.clone(), config(ClaimStyle::Lock)).unwrap(),
            Worker::new(&db.url, registry.clone(), config(ClaimStyle::Lock)).unwrap(),
            Worker::new(&db.url, registry, config(ClaimStyle::Stamp)).unwrap(),
        ];
        let tallies: Vec<outbox::Tally> = std::thread::scope(|s| {
            let handles: Vec<_> = workers
                .iter()
                .map(|w| s.spawn(move || w.drain().unwrap().tally))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let done: u64 = tallies.iter().map(|t| t.done).sum();
        assert_eq!(done, 600, "{tallies:?}");
        assert_eq!(
            db.count("SELECT count(*) FROM async_task WHERE state = 'done'"),
            600
        );
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 600);
        assert_eq!(
            db.count("SELECT count(DISTINCT task_id) FROM test_ledger"),
            600,
            "no task ran twice"
        );
    }

    /// A node dies (its heartbeat stops) while its leased chunk runs: rescue charges each of
    /// its tasks one failure and one death, once, and deletes the leases; the chunk's late
    /// completion lands nothing. A chunk past its lease's deadline is charged the same way,
    /// without a death counted.
    fn a_dead_nodes_or_a_late_chunks_leases_are_charged_once_and_their_completion_lands_nothing(db: &TestDb) {
        use std::time::{Duration, Instant};
        let ids = enqueue(db, "ledger", 3);
        let (started, release) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (started_in, release_in) = (Arc::clone(&started), Arc::clone(&release));
        let mut registry = Registry::new();
        registry.register(
            "ledger",
            move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                write_ledger(task, tx)?;
                started_in.store(true, Ordering::SeqCst);
                // Hung outside SQL until the test lets it go.
                while !release_in.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(())
            },
        );
        // Only the test moves heartbeats and deadlines.
        let quiet = |registry| {
            let config = chunk_config(ClaimStyle::Lock)
                .heartbeat(Duration::from_secs(3600))
                .dead_after(Duration::from_secs(7200));
            Worker::new(&db.url, registry, config).unwrap()
        };
        let rescuer = quiet(crate::ledger_registry("ledger"));
        for (round, late) in [(1, false), (2, true)] {
            started.store(false, Ordering::SeqCst);
            release.store(false, Ordering::SeqCst);
            let leasing = quiet(registry.clone());
            std::thread::scope(|s| {
                let running = s.spawn(|| leasing.run_once().unwrap());
                let _release = SetOnDrop(Arc::clone(&release));
                let since = Instant::now();
                while !started.load(Ordering::SeqCst) {
                    assert!(since.elapsed() < Duration::from_secs(20), "the chunk never ran");
                    std::thread::sleep(Duration::from_millis(5));
                }
                assert_eq!(db.count("SELECT count(*) FROM async_lease"), 3);
                if late {
                    let past = match db.backend() {
                        Backend::Mysql => "UTC_TIMESTAMP(3) - INTERVAL 1 SECOND",
                        _ => "now() - interval '1 second'",
                    };
                    db.exec(&format!("UPDATE async_lease SET deadline_at = {past}"));
                } else {
                    crate::rescue::kill_heartbeat(db, leasing.node_id());
                }
                let report = rescuer.rescue_once().unwrap();
                assert_eq!((report.pending, report.dead), (3, 0), "round {round}: {report:?}");
                assert_eq!(db.count("SELECT count(*) FROM async_lease"), 0, "round {round}");
                let again = rescuer.rescue_once().unwrap();
                assert_eq!(again.pending, 0, "round {round}: charged once");
                for &id in &ids {
                    let row = db.task(id);
                    assert_eq!((row.state.as_str(), row.failures), ("pending", round), "task {id}");
                    let why = match late {
                        true => "its lock-claimed chunk ran past its deadline",
                        false => "the node stopped heartbeating",
                    };
                    let error = row.last_error.unwrap_or_default();
                    assert!(error.starts_with(&format!("rescued from node {}: {why}", leasing.node_id())), "{error}");
                    assert_eq!(db.count(&format!("SELECT suspect FROM async_task WHERE id = {id}")), 1, "a death counted once, a late chunk's not");
                }
                release.store(true, Ordering::SeqCst);
                let tally = running.join().unwrap();
                assert_eq!(tally.done, 0, "round {round}: {tally:?}");
            });
            for &id in &ids {
                assert_eq!(db.ledger_rows(id), 0, "round {round}: the chunk's effects rolled back");
            }
            db.make_all_due();
        }
    }


    /// A chunk past its lease's deadline is rescued, and the same node leases its tasks again
    /// (a second chunk, under the tasks' new tokens) while the first still hangs: when the
    /// first returns, its completion lands nothing and takes nothing of the second's (its
    /// leases, its tasks); the second completes them, and each task's effects land once.
    fn a_late_chunk_lands_nothing_over_its_own_nodes_newer_lease(db: &TestDb) {
        late_chunk_and_newer_lease(db, Returns::LateFirst);
    }

    /// As above, the newer chunk completing first: the late one that then returns counts
    /// none of the tasks done (they are the newer chunk's).
    fn a_late_chunk_counts_nothing_its_own_nodes_newer_lease_completed(db: &TestDb) {
        late_chunk_and_newer_lease(db, Returns::NewerFirst);
    }

    /// A handler that hangs outside SQL (an HTTP call, a sleep) past its domain's timeout, in a
    /// leased chunk: the domain watchdog charges it one failure and ends the chunk, whose other
    /// tasks are free at once, for any node to run (the one whose handler ran before it noted
    /// so), while the hung thread still sleeps; when it returns, nothing its chunk did lands,
    /// and none of the chunk's handlers after it runs there.
    fn a_hung_handler_past_its_domains_timeout_frees_the_rest_of_its_leased_chunk(db: &TestDb) {
        use outbox::domain::Domain;
        use std::sync::atomic::AtomicUsize;
        use std::time::{Duration, Instant};
        let before = outbox::enqueue(&mut db.conn(), &NewTask::new("quick", "0")).unwrap().id;
        let nap = enqueue(db, "nap", 1)[0];
        let mut quick = enqueue(db, "quick", 3);
        quick.push(before);
        let release = Arc::new(AtomicBool::new(false));
        let release_in = Arc::clone(&release);
        let calls = Arc::new(AtomicUsize::new(0));
        let calls_in = Arc::clone(&calls);

        let mut registry = Registry::new();
        registry.register(
            "quick",
            move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                calls_in.fetch_add(1, Ordering::SeqCst);
                write_ledger(task, tx)
            },
        );
        registry.register(
            "nap",
            move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                write_ledger(task, tx)?;
                // Hung outside SQL, its transaction idle, until the test lets it go.
                while !release_in.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(())
            },
        );
        let config = WorkerConfig::default()
            .threads(1)
            .queue(0)
            .page_size(5)
            .commit_batch(5)
            .claim_style(ClaimStyle::Lock)
            .domain(Domain::max("naps", ["nap", "quick"], 1).timeout(Duration::from_secs(1)));
        let hung = Worker::new(&db.url, registry, config).unwrap();
        std::thread::scope(|s| {
            let running = s.spawn(|| hung.run_once().unwrap());
            let _release = SetOnDrop(Arc::clone(&release));
            let started = Instant::now();
            while db.task(nap).failures == 0 {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "the hung handler was not charged"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            let task = db.task(nap);
            assert_eq!((task.state.as_str(), task.failures), ("pending", 1));
            assert!(task.last_error.unwrap_or_default().contains("timed out"));
            assert_eq!(
                db.count("SELECT count(*) FROM async_lease"),
                0,
                "the chunk ended"
            );
            let noted = db.task(before).last_error.unwrap_or_default();
            assert!(noted.contains("released"), "{noted:?}");
            // The hung thread still sleeps; another node runs the rest of its chunk now.
            let other = Worker::new(
                &db.url,
                crate::ledger_registry("quick"),
                chunk_config(ClaimStyle::Stamp),
            )
            .unwrap();
            // (On MySQL the hung chunk's transaction still holds what its first handler
            // locked, the ledger's key to its task: that one waits for the chunk's end.)
            let first = other.drain().unwrap().tally.done;
            assert!(first >= 3, "{first}");
            release.store(true, Ordering::SeqCst);
            let tally = running.join().unwrap();
            assert_eq!(tally.done, 0, "{tally:?}");
            assert_eq!(calls.load(Ordering::SeqCst), 1, "the hung chunk ran on past its end");
            assert_eq!(first + other.drain().unwrap().tally.done, 4);
        });
        for id in quick {
            assert_eq!(db.task(id).state, "done");
            assert_eq!(db.ledger_rows(id), 1, "task {id}: exactly one effect");
        }
        assert_eq!(
            db.ledger_rows(nap),
            0,
            "the hung chunk's effects rolled back"
        );
    }
}

#[test]
fn lock_claims_are_refused_on_sqlite_and_with_a_queue() {
    let registry = || {
        let mut r = Registry::new();
        r.register("ledger", write_ledger);
        r
    };
    let sqlite = TestDb::sqlite();
    let error = Worker::new(&sqlite.url, registry(), chunk_config(ClaimStyle::Lock))
        .err()
        .expect("refused on SQLite");
    assert!(
        matches!(
            error,
            Error::InvalidConfig {
                setting: "claim",
                ..
            }
        ),
        "{error}"
    );
    let pg = TestDb::postgres();
    let error = Worker::new(&pg.url, registry(), chunk_config(ClaimStyle::Lock).queue(2))
        .err()
        .expect("refused with a queue");
    assert!(
        matches!(
            error,
            Error::InvalidConfig {
                setting: "queue",
                ..
            }
        ),
        "{error}"
    );
}

/// The lock statement is the claim index's range scan in claim order, whatever the backlog:
/// no sort of the pending tasks (ordering by the output's `priority`, an integer cast, once
/// made it sort every pending row for each chunk), only of the page's candidates.
#[test]
fn the_lock_statement_scans_the_claim_index_in_order_without_sorting() {
    let db = &TestDb::postgres();
    enqueue(db, "ledger", 2000);
    db.exec("ANALYZE async_task");
    let mut registry = Registry::new();
    registry.register("ledger", write_ledger);
    let w = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
    let plan = w.claim_plan().unwrap().join("\n");
    assert!(plan.contains("LockRows"), "{plan}");
    assert!(plan.contains("Insert on async_lease"), "{plan}");
    assert!(plan.contains("async_task_claim_idx"), "{plan}");
    assert!(!plan.contains("Seq Scan on async_task "), "{plan}");
    for sort in plan
        .lines()
        .filter(|l| l.contains("Sort Key") && l.contains("priority"))
    {
        assert!(
            sort.contains("candidate.") || sort.contains("ranked."),
            "a sort of more than the candidates: {sort}\n{plan}"
        );
    }
}

/// The guide's pattern (docs/guide/src/cancel.md), under lock claims: the producer locks its order,
/// then cancels the order's coupon task in the same transaction, while a leased chunk runs that
/// very task's handler, which then waits for the order's row. The cancel does not wait for the
/// chunk (no task row is locked while handlers run), so there is no cycle to break: the producer
/// commits, and the chunk's completion is fenced out, its effects rolled back. (Locking the task's
/// row for the chunk made the producer wait first, and PostgreSQL then ended the producer's
/// transaction: `deadlock detected`.)
#[test]
fn a_cancel_in_the_producers_transaction_never_waits_for_a_leased_chunk() {
    use diesel::connection::SimpleConnection;
    use std::time::{Duration, Instant};
    let db = &TestDb::postgres();
    db.exec("CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL)");
    db.exec("INSERT INTO orders VALUES (42, 'open')");
    let mut tasks = vec![NewTask::new("coupon.grant", "42")];
    tasks.extend((1..=2).map(|i| NewTask::new("coupon.grant", format!("other-{i}"))));
    let ids: Vec<i64> = enqueue_batch(&mut db.conn(), &tasks)
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let flag = || Arc::new(AtomicBool::new(false));
    let (started, go, order_locked, cancel_returned) = (flag(), flag(), flag(), flag());
    let (started_in, go_in) = (Arc::clone(&started), Arc::clone(&go));
    let mut registry = Registry::new();
    registry.register(
        "coupon.grant",
        move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            write_ledger(task, tx)?;
            if task.biz_id() == "42" {
                started_in.store(true, Ordering::SeqCst);
                while !go_in.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                diesel::sql_query("SET LOCAL lock_timeout = '20s'").execute(tx.conn()?)?;
                diesel::sql_query("UPDATE orders SET status = status || '+coupon' WHERE id = 42")
                    .execute(tx.conn()?)?;
            }
            Ok(())
        },
    );
    let worker = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
    let mut producer = db.conn();
    let producer_pid = count_on_conn(&mut producer, "SELECT pg_backend_pid()::bigint AS n");
    let cancelled = std::thread::scope(|s| {
        let running = s.spawn(|| worker.run_once().unwrap());
        let _go = SetOnDrop(Arc::clone(&go));
        let wait = |what: &str, done: &dyn Fn() -> bool| {
            let since = Instant::now();
            while !done() {
                assert!(since.elapsed() < Duration::from_secs(20), "{what}");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        wait("the chunk never ran", &|| started.load(Ordering::SeqCst));
        let (locked_in, returned_in) = (&order_locked, &cancel_returned);
        let producing = s.spawn(move || {
            producer
                .batch_execute(
                    "BEGIN; SET LOCAL lock_timeout = '20s';
                     UPDATE orders SET status = 'cancelled' WHERE id = 42",
                )
                .unwrap();
            locked_in.store(true, Ordering::SeqCst);
            let cancelled = outbox::cancel_by_key(&mut producer, "coupon.grant", "42");
            returned_in.store(true, Ordering::SeqCst);
            let end = if cancelled.is_ok() {
                "COMMIT"
            } else {
                "ROLLBACK"
            };
            producer.batch_execute(end).unwrap();
            cancelled
        });
        wait("the producer never locked its order", &|| {
            order_locked.load(Ordering::SeqCst)
        });
        // The cancel has returned, or waits for a lock.
        wait("the cancel neither returned nor waited", &|| {
            cancel_returned.load(Ordering::SeqCst)
                || db.count(&format!(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE pid = {producer_pid} AND wait_event_type = 'Lock'"
                )) > 0
        });
        // Now the handler waits for the order's row.
        go.store(true, Ordering::SeqCst);
        let cancelled = producing.join().unwrap();
        running.join().unwrap();
        cancelled
    });
    let cancelled = cancelled.expect("the cancel neither waits for the chunk nor deadlocks");
    assert!(cancelled.cancelled, "{cancelled:?}");
    assert_eq!(db.task(ids[0]).state, "cancelled");
    assert_eq!(db.ledger_rows(ids[0]), 0, "its chunk's effects rolled back");
    assert_eq!(
        db.count("SELECT count(*) FROM orders WHERE status = 'cancelled'"),
        1,
        "the cancelled task's update of the order rolled back"
    );
    for &id in &ids[1..] {
        assert_eq!(db.task(id).state, "done");
        assert_eq!(db.ledger_rows(id), 1, "task {id}: exactly one effect");
    }
}

/// A count on `conn`.
fn count_on_conn(conn: &mut outbox::DbConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .expect(sql)
        .n
}

/// Sets its flag when dropped: lets a waiting handler go however the test ends, so that a
/// failed assertion fails the test rather than hanging it.
struct SetOnDrop(Arc<AtomicBool>);

/// Sets a flag it borrows when dropped.
struct SetAtDrop<'a>(&'a AtomicBool);

impl Drop for SetAtDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// MySQL, a producer at REPEATABLE READ (MySQL's default) links a child it inserts, in a
/// transaction it keeps open: the link's look for a lease of the child takes no lock, so a
/// lock claim's lease of another task, meanwhile, does not wait for that producer's commit.
#[cfg(feature = "mysql")]
#[test]
fn a_link_at_repeatable_read_holds_up_no_lease_claim_on_mysql() {
    let db = &TestDb::mysql();
    let parent = enqueue(db, "mail.later", 1)[0];
    let ids = enqueue(db, "ledger", 1);
    let mut producer = db.url.connect().unwrap();
    for sql in [
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ".to_owned(),
        "BEGIN".to_owned(),
        "INSERT INTO async_task (keyword, biz_id) VALUES ('mail.later', 'child')".to_owned(),
        format!("INSERT INTO async_task_parent (child_id, parent_id) VALUES (LAST_INSERT_ID(), {parent})"),
    ] {
        diesel::sql_query(sql).execute(&mut producer).unwrap();
    }
    let url = db.url.clone();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let mut registry = Registry::new();
        registry.register("ledger", crate::write_ledger);
        let w = Worker::new(&url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
        let tally = w.run_once().unwrap();
        done_tx.send(tally.done).unwrap();
    });
    // The worker's lease would wait out the server's lock wait timeout if the link had
    // locked the lease table's gap: it must be done while the producer's transaction is open.
    let done = done_rx.recv_timeout(std::time::Duration::from_secs(30));
    diesel::sql_query("COMMIT").execute(&mut producer).unwrap();
    worker.join().unwrap();
    assert_eq!(
        done,
        Ok(1),
        "the lease claim finished while the producer's link was open"
    );
    assert_eq!(db.task(ids[0]).state, "done");
}

/// A chunk's completion reads no lease but its own: with other chunks' leases in the table,
/// one of them locked by another transaction (as a chunk completing at the same moment locks
/// its own), the completion goes through. MariaDB read the whole lease table for the deletion
/// of a chunk's leases (a young table's statistics), waited for every lease another chunk had
/// locked, and concurrent chunks deadlocked, each rolled back.
#[cfg(feature = "mysql")]
#[test]
fn a_chunks_completion_on_mysql_waits_for_no_other_chunks_leases() {
    use diesel::connection::SimpleConnection;
    use std::time::{Duration, Instant};
    let db = &TestDb::mysql();
    // One chunk of 50: a deletion of 50 leases among 200.
    let ids = enqueue(db, "ledger", 50);
    // 150 leases of other tasks (another node's chunks in flight), the table's statistics
    // taken with them.
    let others: Vec<String> = (1..=150)
        .map(|i| {
            format!(
                "({}, 999, 0, 1, UTC_TIMESTAMP(3) + INTERVAL 1 HOUR)",
                1_000_000 + i
            )
        })
        .collect();
    db.exec(&format!(
        "INSERT INTO async_lease (task_id, node_id, token, chunk, deadline_at) VALUES {}",
        others.join(", ")
    ));
    db.exec("ANALYZE TABLE async_lease");
    let mut other = db.conn();
    other
        .batch_execute("BEGIN; SELECT task_id FROM async_lease WHERE task_id = 1000001 FOR UPDATE")
        .unwrap();
    let w = Worker::new(
        &db.url,
        crate::ledger_registry("ledger"),
        chunk_config(ClaimStyle::Lock)
            .page_size(50)
            .commit_batch(50),
    )
    .unwrap();
    let tally = std::thread::scope(|s| {
        let running = s.spawn(|| w.run_once().unwrap());
        let since = Instant::now();
        while !running.is_finished() && since.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let waited = !running.is_finished();
        other.batch_execute("ROLLBACK").unwrap();
        let tally = running.join().unwrap();
        assert!(
            !waited,
            "the chunk waited for another chunk's lease ({tally:?})"
        );
        tally
    });
    assert_eq!((tally.claimed, tally.done), (50, 50), "{tally:?}");
    for id in ids {
        assert_eq!(db.task(id).state, "done");
        assert_eq!(db.ledger_rows(id), 1);
    }
    assert_eq!(
        db.count("SELECT count(*) FROM async_lease"),
        150,
        "the others' leases kept"
    );
}

/// A lease is found by its task only: a chunk's completion deletes its leases by task id
/// (and node), and an index by node let the planner, whose statistics of this churning table
/// are often young, read every lease of the node and every dead version of them for each
/// chunk: most of the server's time in a 50,000-task drain (migration 000016).
#[test]
fn the_lease_table_is_indexed_by_task_only() {
    let db = &TestDb::postgres();
    let indexes = db.count(
        "SELECT count(*) FROM pg_indexes WHERE tablename = 'async_lease'
            AND indexname <> 'async_lease_pkey'",
    );
    assert_eq!(
        indexes, 0,
        "an index of async_lease besides its primary key"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM pg_indexes WHERE indexname = 'async_lease_pkey'"),
        1
    );
}

/// No UPDATE of a task locks its row first: a BEFORE UPDATE row trigger makes PostgreSQL
/// lock (and log) each row an UPDATE writes, whatever the trigger's columns and condition,
/// a WAL record more for every claim, completion and failure (migration 000017).
#[test]
fn no_before_update_row_trigger_locks_the_task_rows() {
    let db = &TestDb::postgres();
    // tgtype bits: 1 a row trigger, 2 before, 16 on UPDATE.
    let before_update = db.count(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'async_task'::regclass
            AND NOT tgisinternal AND tgtype & 1 = 1 AND tgtype & 2 = 2 AND tgtype & 16 = 16",
    );
    assert_eq!(before_update, 0);
}

/// Every claim runs with PostgreSQL's JIT compilation off: past `jit_above_cost`, which a
/// claim's estimate passes at a large backlog, PostgreSQL compiles the plan with LLVM at each
/// execution (709 ms for the first claim of a drain at a backlog of 1,000,000). A statement
/// trigger records the `jit` setting in force when a claim writes — a stamp (the task goes
/// running), a lease (`async_lease`), a tenant's limited claim, a suspect's claim alone —
/// and, to show the observation works, when a completion writes (the chunk's transaction,
/// where the server's default holds).
#[test]
fn every_claim_runs_with_jit_off() {
    let db = &TestDb::postgres();
    assert_eq!(
        db.count("SELECT count(*) FROM pg_settings WHERE name = 'jit' AND setting = 'on'"),
        1,
        "the server's jit must be on for this test to see a claim turn it off"
    );
    db.exec(
        "CREATE TABLE jit_seen (setting TEXT NOT NULL, what TEXT NOT NULL);
         CREATE FUNCTION jit_seen_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO jit_seen SELECT DISTINCT current_setting('jit'), n.state
                 || CASE WHEN n.state <> 'running' THEN ''
                         WHEN n.suspect >= 2 THEN ' suspect'
                         WHEN n.tenant IS NOT NULL THEN ' of a tenant' ELSE '' END
               FROM new_rows n;
             RETURN NULL;
         END $$;
         CREATE FUNCTION jit_seen_leases() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO jit_seen VALUES (current_setting('jit'), 'leased');
             RETURN NULL;
         END $$;
         CREATE TRIGGER jit_seen_tasks AFTER UPDATE ON async_task
             REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION jit_seen_tasks();
         CREATE TRIGGER jit_seen_leases AFTER INSERT ON async_lease
             FOR EACH STATEMENT EXECUTE FUNCTION jit_seen_leases();",
    );
    outbox::set_tenant(
        &mut db.conn(),
        "acme",
        &outbox::TenantLimits::default().max_running(Some(5)),
        "test",
    )
    .unwrap();
    let mut tasks: Vec<NewTask> = (1..=4)
        .map(|i| NewTask::new("ledger", i.to_string()))
        .collect();
    tasks.extend((1..=2).map(|i| NewTask::new("ledger", format!("acme-{i}")).tenant("acme")));
    enqueue_batch(&mut db.conn(), &tasks).unwrap();
    // One task a suspect (two of its runs were lost with their nodes): claimed alone, first.
    db.exec("UPDATE async_task SET suspect = 2 WHERE biz_id = '1'");
    db.exec("DELETE FROM jit_seen");
    let mut registry = Registry::new();
    registry.register("ledger", write_ledger);
    // Strict, stamp claims: the suspect, then the tenant's two and a plain one; the other two
    // leased.
    let strict = WorkerConfig::default().threads(1).page_size(4);
    let w = Worker::new(&db.url, registry.clone(), strict).unwrap();
    assert_eq!(w.run_once().unwrap().done, 4);
    drop(w);
    let w = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
    assert_eq!(w.drain().unwrap().tally.done, 2);
    drop(w);

    #[derive(diesel::QueryableByName, Debug, PartialEq)]
    struct Seen {
        #[diesel(sql_type = diesel::sql_types::Text)]
        setting: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        what: String,
    }
    let seen: Vec<Seen> =
        diesel::sql_query("SELECT DISTINCT setting, what FROM jit_seen ORDER BY what, setting")
            .load(&mut db.conn())
            .unwrap();
    let seen: Vec<(&str, &str)> = seen
        .iter()
        .map(|s| (s.what.as_str(), s.setting.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("done", "on"),
            ("leased", "off"),
            ("running", "off"),
            ("running of a tenant", "off"),
            ("running suspect", "off")
        ],
        "(what was written, jit in force)"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM async_task WHERE state = 'done'"),
        6
    );
}

/// A transaction that could not take its marks leaves its connection usable: `BEGIN` and the
/// two advisory locks go in one round trip, and when the locks fail (here the database's
/// `lock_timeout` runs out behind another session's exclusive hold of the node's key) the
/// server was left inside an aborted transaction block diesel did not count; the pool handed
/// that connection out again and every statement on it failed. A chunk's transaction was the
/// first found so; the claim's, marked with the node's key too, fails first here.
#[test]
fn a_transaction_that_could_not_take_its_marks_leaves_its_connection_usable() {
    use diesel::connection::SimpleConnection;
    let db = &TestDb::postgres();
    enqueue(db, "ledger", 10);
    db.exec(
        "DO $$ BEGIN
             EXECUTE format('ALTER DATABASE %I SET lock_timeout = ''100ms''', current_database());
         END $$",
    );
    let mut registry = Registry::new();
    registry.register("ledger", write_ledger);
    let w = Worker::new(&db.url, registry, chunk_config(ClaimStyle::Lock)).unwrap();
    // The node's mark: advisory class 'obn' 1, the node id's low 31 bits.
    let mut holder = db.conn();
    holder
        .batch_execute(&format!(
            "SELECT pg_advisory_lock({}, {})",
            0x6f62_6e01_i32,
            w.node_id() & 0x7fff_ffff
        ))
        .unwrap();
    // On a connection left aborted a pass never returned (the chunk's release kept retrying
    // there): the passes run on a thread of their own and are waited for a minute at most,
    // so that the test fails instead.
    let (sent, result) = std::sync::mpsc::channel();
    let (unlocked, wait_unlocked) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let blocked = w.run_once();
        assert!(
            blocked
                .as_ref()
                .is_err_and(|e| e.to_string().contains("lock timeout")),
            "the claim, behind the held key: {blocked:?}"
        );
        sent.send(0).unwrap();
        wait_unlocked.recv().unwrap();
        // Pages of 5: two passes drain the ten.
        sent.send((0..4).map(|_| w.run_once().unwrap().done).sum())
            .unwrap();
    });
    let minute = std::time::Duration::from_secs(60);
    result
        .recv_timeout(minute)
        .expect("the pass whose claim could not begin did not return within a minute");
    holder
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .unwrap();
    unlocked.send(()).unwrap();
    let done = result
        .recv_timeout(minute)
        .expect("the passes after the lock was released did not return within a minute");
    assert_eq!(done, 10);
    assert_eq!(
        db.count("SELECT count(*) FROM async_task WHERE state = 'done'"),
        10
    );
}

/// Which chunk of [`late_chunk_and_newer_lease`] returns first.
#[derive(PartialEq)]
enum Returns {
    LateFirst,
    NewerFirst,
}

/// A chunk leased by a worker whose handlers hang is rescued past its deadline; the same worker
/// leases the tasks again in a second chunk whose handlers hang too; then the chunks return in
/// the order `returns` says. Whichever comes first, the late chunk completes, claims, frees
/// and counts nothing; the newer one completes every task, each task's effects landing once.
fn late_chunk_and_newer_lease(db: &TestDb, returns: Returns) {
    use std::time::{Duration, Instant};
    let ids = enqueue(db, "ledger", 3);
    // The first chunk's handlers (attempt 1) wait for `first`, the second's for `second`.
    let gates = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    let started = Arc::new(AtomicUsize::new(0));
    let (gates_in, started_in) = (Arc::clone(&gates), Arc::clone(&started));
    let mut registry = Registry::new();
    registry.register(
        "ledger",
        move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            write_ledger(task, tx)?;
            let gate = usize::from(task.attempt() > 1);
            started_in.fetch_max(gate + 1, Ordering::SeqCst);
            let since = Instant::now();
            while !gates_in[gate].load(Ordering::SeqCst) {
                if since.elapsed() > Duration::from_secs(30) {
                    return Err(anyhow::anyhow!("gate {gate} never opened").into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        },
    );
    // The claim loop on two threads: the second chunk is leased and runs while the first's
    // handler hangs on the other. Only the test rescues, and moves deadlines.
    let config = chunk_config(ClaimStyle::Lock)
        .threads(2)
        .listen(false)
        .poll_interval(Duration::from_millis(20))
        .heartbeat(Duration::from_secs(3600))
        .dead_after(Duration::from_secs(7200));
    let leasing = Worker::new(&db.url, registry, config.clone()).unwrap();
    let rescuer = Worker::new(&db.url, crate::ledger_registry("ledger"), config).unwrap();
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let since = Instant::now();
        while !done() {
            assert!(since.elapsed() < Duration::from_secs(20), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let past = match db.backend() {
        Backend::Mysql => "UTC_TIMESTAMP(3) - INTERVAL 1 SECOND",
        _ => "now() - interval '1 second'",
    };
    let stop = leasing.stop_flag();
    let report = std::thread::scope(|s| {
        let [first_gate, second_gate] = &*gates;
        // A failed assertion opens both gates and stops the loop, so that the scope ends.
        let _open = (
            SetAtDrop(first_gate),
            SetAtDrop(second_gate),
            SetOnDrop(Arc::clone(&stop)),
        );
        let running = s.spawn(|| leasing.run().unwrap());
        wait("the first chunk never ran", &|| {
            started.load(Ordering::SeqCst) >= 1
        });
        db.exec(&format!("UPDATE async_lease SET deadline_at = {past}"));
        // Pass after pass until the three are charged: on MySQL a pass passes over a task
        // row another transaction holds, and the claim loop's picks lock the pending rows
        // they read, for an instant.
        let since = std::time::Instant::now();
        let mut charged = 0;
        while charged < 3 {
            assert!(
                since.elapsed() < Duration::from_secs(20),
                "rescue charged {charged}"
            );
            charged += rescuer.rescue_once().unwrap().pending;
        }
        assert_eq!(charged, 3);
        db.make_all_due();
        wait("the second chunk never ran", &|| {
            started.load(Ordering::SeqCst) >= 2
        });
        assert_eq!(
            db.count("SELECT count(*) FROM async_lease"),
            3,
            "leased again"
        );
        let ended = || {
            let t = leasing.totals();
            t.done + t.lost + t.released + t.abandoned + t.retried
        };
        if returns == Returns::LateFirst {
            first_gate.store(true, Ordering::SeqCst);
            wait("the first chunk never ended", &|| ended() >= 3);
            let late = leasing.totals();
            assert_eq!(late.done, 0, "the late chunk completed nothing: {late:?}");
            assert_eq!(
                db.count("SELECT count(*) FROM async_lease"),
                3,
                "the newer chunk's leases are its own still"
            );
            for &id in &ids {
                assert_eq!(db.task(id).state, "pending", "task {id}");
            }
        }
        second_gate.store(true, Ordering::SeqCst);
        if returns == Returns::NewerFirst {
            wait("the newer chunk never completed", &|| {
                leasing.totals().done >= 3
            });
            first_gate.store(true, Ordering::SeqCst);
        }
        wait("the chunks never ended", &|| ended() >= 6);
        stop.store(true, Ordering::SeqCst);
        running.join().unwrap()
    });
    let tally = &report.tally;
    assert_eq!(
        (tally.claimed, tally.done, tally.lost),
        (6, 3, 3),
        "the newer chunk done, the late one's tasks lost to it: {report:?}"
    );
    for &id in &ids {
        let row = db.task(id);
        assert_eq!((row.state.as_str(), row.failures), ("done", 1), "task {id}");
        assert_eq!(db.ledger_rows(id), 1, "task {id}: its effects landed once");
    }
}

/// Under lock claims a leased chunk never waits for a thread, its leases' deadline running:
/// when claims go lane by lane, what a refill claims the stamping way first (a tenant's
/// limited tasks, here three that block) takes one of the lane's threads, and the refill then
/// leases only for the threads left. The lane has two threads: the blocked chunk's, and one
/// for a chunk of 10 leased tasks. Leasing 17 (its room before the stamped chunk) would leave
/// a chunk of 7 waiting behind the others with its leases held. On a domain's lane, and on
/// `default` beside a `RESERVED` domain (whose thread counts in the pool's bound, so the
/// claiming thread does not run a chunk itself).
#[test]
fn a_refill_leases_only_for_the_threads_its_stamped_tasks_left() {
    use outbox::domain::Domain;
    let lock = WorkerConfig::default()
        .commit_batch(10)
        .claim_style(ClaimStyle::Lock);
    leases_only_for_the_threads_left(
        "a domain's lane",
        lock.clone()
            .threads(2)
            .domain(Domain::max("both", ["stuck", "ledger"], 2)),
        None,
        1,
    );
    leases_only_for_the_threads_left(
        "default beside a reserved domain",
        lock.clone()
            .threads(3)
            .domain(Domain::reserved("pay", ["pay"], 1)),
        Some("pay"),
        1,
    );
    // Without lanes the claiming thread runs a chunk too (CallerRuns): two leased chunks
    // run, one on the thread the stamped chunk left, one on the claiming thread; none waits.
    leases_only_for_the_threads_left("no domains", lock.threads(2), None, 2);
}

/// The refill claims lane by lane, `default` first, and a fresh worker's first claim of a
/// lane with a tenant limit takes the limited tasks first: so the lane of `stuck` and
/// `ledger` is the first with keywords (`other`, registered too, is another lane's).
fn leases_only_for_the_threads_left(
    name: &str,
    config: WorkerConfig,
    other: Option<&str>,
    chunks: usize,
) {
    use std::sync::{Condvar, Mutex};
    let db = &TestDb::postgres();
    outbox::set_tenant(
        &mut db.conn(),
        "t1",
        &outbox::TenantLimits::default().max_running(Some(3)),
        "test",
    )
    .unwrap();
    let stuck: Vec<NewTask> = (0..3)
        .map(|i| NewTask::new("stuck", format!("stuck-{i}")).tenant("t1"))
        .collect();
    enqueue_batch(&mut db.conn(), &stuck).unwrap();
    enqueue(db, "ledger", 30);
    // Every handler waits at the gate until the test opens it; `waiting` counts the ledger
    // handlers there: one is there once a leased chunk runs.
    #[derive(Default)]
    struct Gate {
        open: bool,
        waiting: usize,
    }
    let gate = Arc::new((Mutex::new(Gate::default()), Condvar::new()));
    let wait = |gate: &(Mutex<Gate>, Condvar), ledger: bool| {
        let (state, changed) = gate;
        let mut state = state.lock().unwrap();
        state.waiting += usize::from(ledger);
        changed.notify_all();
        let _open = changed
            .wait_timeout_while(state, std::time::Duration::from_secs(60), |g| !g.open)
            .unwrap();
    };
    let mut registry = Registry::new();
    if let Some(other) = other {
        registry.register(other, write_ledger);
    }
    for (keyword, ledger) in [("ledger", true), ("stuck", false)] {
        let gate = Arc::clone(&gate);
        registry.register(
            keyword,
            move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                wait(&gate, ledger);
                match ledger {
                    true => write_ledger(task, tx),
                    false => Ok(()),
                }
            },
        );
    }
    let w = Worker::new(&db.url, registry, config).unwrap();
    std::thread::scope(|s| {
        let run = s.spawn(|| w.run_once());
        {
            let (state, changed) = &*gate;
            let state = state.lock().unwrap();
            let (state, _) = changed
                .wait_timeout_while(state, std::time::Duration::from_secs(30), |g| {
                    g.waiting < chunks
                })
                .unwrap();
            assert_eq!(state.waiting, chunks, "{name}: the leased chunks run");
        }
        // A leased chunk runs beside the blocked stamped one, so the refill that leased it
        // is over (nothing could finish since): what it leased beyond that chunk waits.
        let leased = db.count("SELECT count(*) FROM async_lease");
        {
            let (state, changed) = &*gate;
            state.lock().unwrap().open = true;
            changed.notify_all();
        }
        let tally = run.join().unwrap().unwrap();
        assert_eq!(
            db.count("SELECT count(*) FROM async_task WHERE keyword = 'stuck' AND state = 'done'"),
            3,
            "{name}: {tally:?}"
        );
        assert_eq!(
            leased,
            10 * chunks as i64,
            "{name}: with the stamped chunk on one thread, a chunk of 10 leased for each of \
             the others, none waiting: {tally:?}"
        );
    });
}

/// MySQL at its default isolation, REPEATABLE READ: a cancel in a producer's open transaction
/// reads the leases without locking them (nor their gaps), so a lock claim's insert of its
/// leases does not wait for that transaction to end.
#[cfg(feature = "mysql")]
#[test]
fn a_cancel_at_repeatable_read_leaves_the_lock_claims_free_on_mysql() {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let db = &TestDb::mysql();
    let ids = enqueue(db, "ledger", 6);
    let mut producer = db.conn();
    producer
        .batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .unwrap();
    let waited = producer
        .transaction(|producer| -> outbox::Result<bool> {
            assert!(outbox::cancel(producer, ids[5])?.cancelled);
            let w = Worker::new(
                &db.url,
                crate::ledger_registry("ledger"),
                chunk_config(ClaimStyle::Lock),
            )?;
            std::thread::scope(|s| {
                let running = s.spawn(|| w.run_once());
                let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
                while !running.is_finished() && std::time::Instant::now() < give_up {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                // A claim that waits here is joined inside the producer's transaction: it
                // ends at InnoDB's lock wait timeout, failed, and the assertion below fails.
                let waited = !running.is_finished();
                if !waited {
                    assert_eq!(running.join().unwrap().unwrap().done, 5);
                }
                Ok(waited)
            })
        })
        .unwrap();
    assert!(
        !waited,
        "the lock claim waited for the producer's transaction"
    );
    assert_eq!(db.task(ids[5]).state, "cancelled");
}

/// How many of the faults [`fail_the_next_cancel_note`] set up are still to be met.
const FAULTS_LEFT: &str = "SELECT count(*) FROM note_fault WHERE armed";

/// Makes the next write of a note on a cancelled task fail once, with an error from a trigger
/// (as a connection lost at that moment would): a fault the test arms, met at most once.
fn fail_the_next_cancel_note(db: &TestDb) {
    match db.backend() {
        // A MyISAM table: its change stays when the failed statement's transaction rolls back.
        Backend::Mysql => {
            db.exec(
                "CREATE TABLE IF NOT EXISTS note_fault (armed BOOLEAN NOT NULL) ENGINE = MyISAM",
            );
            db.exec("DELETE FROM note_fault");
            db.exec("INSERT INTO note_fault VALUES (TRUE)");
            db.exec("DROP TRIGGER IF EXISTS note_fault");
            db.exec(
                "CREATE TRIGGER note_fault BEFORE UPDATE ON async_task FOR EACH ROW
                 IF NEW.state = 'cancelled' AND NOT (NEW.last_error <=> OLD.last_error)
                    AND (SELECT count(*) FROM note_fault WHERE armed) > 0 THEN
                     UPDATE note_fault SET armed = FALSE;
                     SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the test fails this note';
                 END IF",
            );
        }
        // A sequence: `nextval` is not rolled back with the failed statement.
        _ => {
            db.exec("CREATE SEQUENCE IF NOT EXISTS note_fault_met");
            db.exec("SELECT setval('note_fault_met', 1, false)");
            db.exec(
                "CREATE OR REPLACE VIEW note_fault AS
                 SELECT last_value = 1 AND NOT is_called AS armed FROM note_fault_met",
            );
            db.exec(
                "CREATE OR REPLACE FUNCTION note_fault() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN
                     IF NEW.state = 'cancelled' AND NEW.last_error IS DISTINCT FROM OLD.last_error THEN
                         IF nextval('note_fault_met') = 1 THEN
                             RAISE EXCEPTION 'the test fails this note';
                         END IF;
                     END IF;
                     RETURN NEW;
                 END $$",
            );
            db.exec("DROP TRIGGER IF EXISTS note_fault ON async_task");
            db.exec(
                "CREATE TRIGGER note_fault BEFORE UPDATE ON async_task
                 FOR EACH ROW EXECUTE FUNCTION note_fault()",
            );
        }
    }
}

/// Commits `open`'s transaction once another session of `url`'s database waits for a row
/// lock, or after 30 s; whether one was seen waiting.
pub(crate) fn commit_once_a_session_waits_for_a_lock(
    url: &DatabaseUrl,
    open: &mut outbox::DbConnection,
) -> bool {
    let waiting = match url.backend() {
        // Not `information_schema.INNODB_TRX`: InnoDB fills it from a cache refreshed only
        // when nobody read it in the last 0.1 s, and this loop reads it faster than that (a
        // wait that began after the first read was never listed). The session list is read
        // live: a locking read that waits (no `SKIP LOCKED`) of this database, executing for
        // 300 ms while the row is held, is waiting for it. MariaDB's `TIME_MS` (the test
        // server's): a charge waits 2 s at most (`transaction_lock_wait_bounded`), and whole
        // seconds would leave the commit too little of them.
        Backend::Mysql => {
            "SELECT count(*) AS n FROM information_schema.PROCESSLIST
              WHERE DB = DATABASE() AND ID <> CONNECTION_ID()
                AND COMMAND IN ('Query', 'Execute') AND TIME_MS >= 300
                AND INFO LIKE '%FOR UPDATE%' AND INFO NOT LIKE '%SKIP LOCKED%'"
        }
        _ => {
            "SELECT count(*) AS n FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND wait_event IN ('transactionid', 'tuple')"
        }
    };
    // One connection, each read its own statement (autocommit): both lists are read live.
    let mut conn = url.connect().expect("connect");
    let start = std::time::Instant::now();
    let mut seen = false;
    while !seen && start.elapsed() < std::time::Duration::from_secs(30) {
        seen = diesel::sql_query(waiting)
            .get_result::<Count>(&mut conn)
            .expect(waiting)
            .n
            > 0;
        if !seen {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    diesel::sql_query("COMMIT")
        .execute(open)
        .expect("the cancel commits");
    seen
}
