//! Task domains on the node's one pool: MAX and RESERVED, isolation, borrowing, run-time
//! control through `async_domain` and `async_pause`, the published slot use, the per-domain
//! watchdog, and bad configurations.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use diesel::RunQueryDsl;
use outbox::domain::{Domain, NodeDomains};
use outbox::{
    enqueue_batch, ClaimStyle, Error, HandlerResult, NewTask, Registry, TaskContext, TaskTx,
    Worker, WorkerConfig,
};

use crate::{insert_ledger_row, TestDb};

/// When each handler of a keyword started and ended.
type Spans = Arc<Mutex<Vec<(String, Instant, Instant)>>>;

/// A registry whose handlers (one per keyword) sleep `ms`, note their span and write the
/// ledger row.
fn timed_registry(keywords: &[&str], ms: u64, spans: &Spans) -> Registry {
    let mut registry = Registry::new();
    for keyword in keywords {
        let spans = Arc::clone(spans);
        registry.register(
            keyword,
            move |t: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                let started = Instant::now();
                std::thread::sleep(Duration::from_millis(ms));
                spans
                    .lock()
                    .unwrap()
                    .push((t.keyword().to_owned(), started, Instant::now()));
                insert_ledger_row(t, tx.conn()?)?;
                Ok(())
            },
        );
    }
    registry
}

/// The most handlers of `keyword` that ran at once.
fn most_at_once(spans: &Spans, keyword: &str) -> usize {
    let spans: Vec<(Instant, Instant)> = spans
        .lock()
        .unwrap()
        .iter()
        .filter(|(k, _, _)| k == keyword)
        .map(|&(_, s, e)| (s, e))
        .collect();
    spans
        .iter()
        .map(|&(start, _)| {
            spans
                .iter()
                .filter(|&&(s, e)| s <= start && start < e)
                .count()
        })
        .max()
        .unwrap_or(0)
}

fn tasks(keyword: &str, n: usize) -> Vec<NewTask> {
    (0..n)
        .map(|i| NewTask::new(keyword, format!("{keyword}-{i}")))
        .collect()
}

fn config(threads: usize) -> WorkerConfig {
    WorkerConfig::default()
        .threads(threads)
        .queue(2)
        .page_size(50)
}

/// What the node published at its last heartbeat.
fn published(db: &TestDb, worker: &Worker) -> NodeDomains {
    worker.heartbeat_once().unwrap();
    let json: String = {
        use diesel::prelude::*;
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            domains: String,
        }
        diesel::sql_query(format!(
            "SELECT domains FROM async_node WHERE id = {}",
            worker.node_id()
        ))
        .get_result::<Row>(&mut db.conn())
        .unwrap()
        .domains
    };
    serde_json::from_str(&json).unwrap()
}

/// Lock claims (PostgreSQL, batched): chunks of 2 locked per domain, none queued.
fn lock_config(threads: usize) -> WorkerConfig {
    WorkerConfig::default()
        .threads(threads)
        .queue(0)
        .page_size(50)
        .commit_batch(2)
        .claim_style(ClaimStyle::Lock)
}

/// A `MAX 2` domain never runs more than 2 handlers at once, with `config`'s 6 threads.
fn max_holds(db: &TestDb, config: WorkerConfig) -> ClaimStyle {
    let spans = Spans::default();
    let mut all = tasks("slow", 12);
    all.extend(tasks("fast", 12));
    enqueue_batch(&mut db.conn(), &all).unwrap();
    let worker = Worker::new(
        &db.url,
        timed_registry(&["slow", "fast"], 20, &spans),
        config.domain(Domain::max("slow", ["slow"], 2)),
    )
    .unwrap();
    let report = worker.drain().unwrap();
    assert_eq!(report.tally.done, 24);
    let most = most_at_once(&spans, "slow");
    assert!(
        most <= 2,
        "{most} of the MAX 2 domain's handlers ran at once"
    );
    assert!(most_at_once(&spans, "fast") <= 6);
    worker.claim_style()
}

/// default's tasks hold every thread they may take until pay's tasks are done (or 10 s);
/// pay's tasks come once they all run. Without pay's reserved thread they would wait for
/// each other. `config` has 4 threads; pay's queue is `pay_queue`, or its default.
fn reserved_isolates(db: &TestDb, config: WorkerConfig, pay_queue: Option<usize>) {
    let mut pay = Domain::reserved("pay", ["pay"], 1);
    if let Some(queue) = pay_queue {
        pay = pay.queue(queue);
    }
    let paid: Arc<(Mutex<usize>, Condvar)> = Arc::default();
    let waited_out = Arc::new(Mutex::new(0));
    let slow_running = Arc::new(AtomicUsize::new(0));
    let mut registry = Registry::new();
    {
        let (paid, waited_out) = (Arc::clone(&paid), Arc::clone(&waited_out));
        let slow_running = Arc::clone(&slow_running);
        registry.register(
            "slow",
            move |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                slow_running.fetch_add(1, Ordering::SeqCst);
                let (count, changed) = &*paid;
                let guard = count.lock().unwrap();
                let (_guard, timeout) = changed
                    .wait_timeout_while(guard, Duration::from_secs(10), |n| *n < 3)
                    .unwrap();
                if timeout.timed_out() {
                    *waited_out.lock().unwrap() += 1;
                }
                Ok(())
            },
        );
    }
    {
        let paid = Arc::clone(&paid);
        registry.register(
            "pay",
            move |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                let (count, changed) = &*paid;
                *count.lock().unwrap() += 1;
                changed.notify_all();
                Ok(())
            },
        );
    }
    let worker = Worker::new(
        &db.url,
        registry,
        config
            .poll_interval(Duration::from_millis(20))
            .listen(false)
            .domain(pay),
    )
    .unwrap();
    enqueue_batch(&mut db.conn(), &tasks("slow", 8)).unwrap();
    std::thread::scope(|s| {
        let run = s.spawn(|| worker.run().unwrap());
        assert!(
            wait_for(|| slow_running.load(Ordering::SeqCst) >= 3),
            "default's tasks did not start"
        );
        enqueue_batch(&mut db.conn(), &tasks("pay", 3)).unwrap();
        let done =
            wait_for(|| db.count("SELECT count(*) FROM async_task WHERE state = 'done'") == 11);
        worker.stop_flag().store(true, Ordering::SeqCst);
        run.join().unwrap();
        assert!(done, "not every task was done");
    });
    assert_eq!(
        *waited_out.lock().unwrap(),
        0,
        "pay's tasks waited behind default's: its reserved thread was taken"
    );
}

every_backend! {
    fn a_max_domain_never_runs_more_than_its_limit(db: &TestDb) {
        assert_eq!(max_holds(db, config(6)), ClaimStyle::Stamp);
    }

    fn a_busy_domain_never_takes_capacity_from_a_reserved_one(db: &TestDb) {
        reserved_isolates(db, config(4), None);
    }

    fn a_reserved_domain_without_a_queue_keeps_its_thread_busy(db: &TestDb) {
        reserved_isolates(db, config(4), Some(0));
    }

    fn a_reserved_domain_borrows_free_threads_of_default(db: &TestDb) {
        let spans = Spans::default();
        enqueue_batch(&mut db.conn(), &tasks("pay", 12)).unwrap();
        let worker = Worker::new(
            &db.url,
            timed_registry(&["pay", "other"], 40, &spans),
            config(4).domain(Domain::reserved("pay", ["pay"], 1)),
        )
        .unwrap();
        assert_eq!(worker.drain().unwrap().tally.done, 12);
        let most = most_at_once(&spans, "pay");
        assert!(most >= 2, "pay never borrowed: at most {most} ran at once");
        assert!(most <= 4, "{most} ran at once on 4 threads");
    }

    fn a_domain_paused_through_async_domain_is_not_claimed_until_resumed(db: &TestDb) {
        let spans = Spans::default();
        let mut all = tasks("mail", 3);
        all.extend(tasks("other", 3));
        enqueue_batch(&mut db.conn(), &all).unwrap();
        let worker = Worker::new(
            &db.url,
            timed_registry(&["mail", "other"], 1, &spans),
            config(2).domain(Domain::max("mail", ["mail"], 1)),
        )
        .unwrap();
        db.exec("INSERT INTO async_domain (name, paused, updated_by) VALUES ('mail', true, 't')");
        worker.heartbeat_once().unwrap();
        assert_eq!(worker.drain().unwrap().tally.done, 3);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE keyword = 'mail' AND state = 'pending'"), 3);
        assert!(published(db, &worker).domains[1].paused);
        db.exec("UPDATE async_domain SET paused = false WHERE name = 'mail'");
        worker.heartbeat_once().unwrap();
        assert_eq!(worker.drain().unwrap().tally.done, 3);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'done'"), 6);
    }

    fn a_keyword_paused_on_its_own_is_not_claimed_until_resumed(db: &TestDb) {
        let spans = Spans::default();
        let mut all = tasks("mail", 2);
        all.extend(tasks("other", 2));
        enqueue_batch(&mut db.conn(), &all).unwrap();
        let worker = Worker::new(&db.url, timed_registry(&["mail", "other"], 1, &spans), config(2))
            .unwrap();
        db.exec("INSERT INTO async_pause (keyword, paused_by) VALUES ('mail', 't')");
        worker.heartbeat_once().unwrap();
        assert_eq!(worker.run_once().unwrap().claimed, 2, "only other's tasks");
        assert_eq!(worker.drain().unwrap().tally.claimed, 0);
        db.exec("DELETE FROM async_pause");
        worker.heartbeat_once().unwrap();
        assert_eq!(worker.drain().unwrap().tally.done, 2);
    }

    fn a_pause_holds_on_a_node_that_refuses_another_row(db: &TestDb) {
        let spans = Spans::default();
        let mut all = tasks("mail", 2);
        all.extend(tasks("other", 2));
        enqueue_batch(&mut db.conn(), &all).unwrap();
        let worker = Worker::new(&db.url, timed_registry(&["mail", "other"], 1, &spans), config(2))
            .unwrap();
        // Two threads reserved of this node's two would leave `default` none: refused here.
        db.exec(
            "INSERT INTO async_domain (name, keywords, mode, threads, updated_by) \
             VALUES ('pay', '[\"pay\"]', 'reserved', 2, 't')",
        );
        worker.heartbeat_once().unwrap();
        db.exec("INSERT INTO async_pause (keyword, paused_by) VALUES ('mail', 't')");
        worker.heartbeat_once().unwrap();
        assert_eq!(worker.run_once().unwrap().claimed, 2, "only other's tasks");
        assert_eq!(worker.drain().unwrap().tally.claimed, 0);
        db.exec("DELETE FROM async_pause");
        // A pause of `default` itself (a row of the table, as `outbox pause default` writes).
        db.exec("INSERT INTO async_domain (name, paused, updated_by) VALUES ('default', true, 't')");
        worker.heartbeat_once().unwrap();
        assert_eq!(worker.drain().unwrap().tally.claimed, 0, "default paused");
        db.exec("DELETE FROM async_domain WHERE name = 'default'");
        worker.heartbeat_once().unwrap();
        assert_eq!(worker.drain().unwrap().tally.done, 2);
    }

    fn a_domain_set_at_run_time_applies_within_a_heartbeat(db: &TestDb) {
        let spans = Spans::default();
        enqueue_batch(&mut db.conn(), &tasks("slow", 8)).unwrap();
        let worker = Worker::new(&db.url, timed_registry(&["slow", "fast"], 20, &spans), config(4))
            .unwrap();
        assert_eq!(published(db, &worker).domains.len(), 1, "default alone");
        db.exec(
            "INSERT INTO async_domain (name, keywords, mode, threads, updated_by) \
             VALUES ('slow', '[\"slow\"]', 'max', 1, 't')",
        );
        let node = published(db, &worker);
        assert_eq!(node.threads, 4);
        let slow = &node.domains[1];
        assert_eq!((slow.domain.as_str(), slow.mode.as_str(), slow.threads), ("slow", "max", 1));
        assert_eq!(slow.keywords, ["slow"]);
        assert_eq!(node.domains[0].keywords, ["fast"]);
        assert_eq!(worker.drain().unwrap().tally.done, 8);
        assert_eq!(most_at_once(&spans, "slow"), 1);
    }

    fn a_released_domain_gives_its_threads_to_default_until_resumed(db: &TestDb) {
        let spans = Spans::default();
        let worker = Worker::new(
            &db.url,
            timed_registry(&["pay", "other"], 1, &spans),
            config(4).domain(Domain::reserved("pay", ["pay"], 3)),
        )
        .unwrap();
        let node = published(db, &worker);
        assert_eq!((node.domains[0].threads, node.domains[1].reserved), (1, 3));
        db.exec("INSERT INTO async_domain (name, paused, released, updated_by) VALUES ('pay', true, true, 't')");
        let node = published(db, &worker);
        assert_eq!((node.domains[0].threads, node.domains[1].reserved), (4, 0));
        assert!(node.domains[1].released && node.domains[1].paused);
        db.exec("UPDATE async_domain SET paused = false, released = false");
        let node = published(db, &worker);
        assert_eq!((node.domains[0].threads, node.domains[1].reserved), (1, 3));
    }

    fn a_handler_past_its_domains_timeout_is_charged_and_its_slot_stuck_until_it_returns(db: &TestDb) {
        enqueue_batch(&mut db.conn(), &tasks("stuck", 1)).unwrap();
        let mut registry = Registry::new();
        registry.register("stuck", |t: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            // Busy in Rust, where nothing can stop it, before it writes (on SQLite a
            // handler holding the write lock would hold off the charge too).
            std::thread::sleep(Duration::from_millis(1500));
            insert_ledger_row(t, tx.conn()?)?;
            Ok(())
        });
        let worker = Worker::new(
            &db.url,
            registry,
            config(2)
                .domain(Domain::max("stuck", ["stuck"], 1).timeout(Duration::from_millis(200)))
                .metrics_addr("127.0.0.1:0".parse().unwrap()),
        )
        .unwrap();
        std::thread::scope(|s| {
            let run = s.spawn(|| worker.run_once().unwrap());
            let charged = wait_for(|| {
                db.count("SELECT count(*) FROM async_task WHERE state = 'pending' AND failures = 1") == 1
            });
            assert!(charged, "the task was not charged a failure at its timeout");
            let node = published(db, &worker);
            let stuck = &node.domains[1];
            assert_eq!((stuck.running, stuck.stuck), (1, 1), "{stuck:?}");
            let tally = run.join().unwrap();
            assert_eq!(tally.done, 0, "the late completion was fenced out");
        });
        let task = db.task(db.count("SELECT id FROM async_task"));
        assert_eq!((task.state.as_str(), task.failures), ("pending", 1));
        assert!(task.last_error.unwrap_or_default().contains("timed out"));
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 0, "its effect rolled back");
        let node = published(db, &worker);
        assert_eq!((node.domains[1].running, node.domains[1].stuck), (0, 0));
        // Counted once, as retried, by the charge (the handler's own end was fenced out).
        let scraped = crate::scrape::scrape(worker.metrics_addr().unwrap());
        let finished = |outcome: &str| {
            scraped.value("outbox_tasks_finished_total", &[("keyword", "stuck"), ("outcome", outcome)])
        };
        assert_eq!(finished("retried"), Some(1.0));
    }

    fn bad_domain_configurations_are_refused_naming_the_domain(db: &TestDb) {
        let registry = || crate::ledger_registry("a");
        let refused = |config: WorkerConfig| match Worker::new(&db.url, registry(), config) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        };
        let overlap = refused(
            config(4)
                .domain(Domain::max("one", ["a"], 1))
                .domain(Domain::max("two", ["b", "a"], 1)),
        );
        assert!(overlap.contains("\"two\"") && overlap.contains("\"one\" lists too"), "{overlap}");
        let total = refused(
            config(4)
                .domain(Domain::reserved("one", ["a"], 2))
                .domain(Domain::reserved("two", ["b"], 2)),
        );
        assert!(total.contains("\"two\"") && total.contains("RESERVED threads to 4 of the node's 4"), "{total}");
        let max = refused(config(4).domain(Domain::max("one", ["a"], 5)));
        assert!(max.contains("MAX 5 is over the node's 4 threads"), "{max}");
        assert!(matches!(
            Worker::new(&db.url, registry(), config(4).domain(Domain::max("default", ["a"], 1))),
            Err(Error::InvalidDomain { .. })
        ));
        assert_eq!(db.count("SELECT count(*) FROM async_node"), 0, "no node registered");
    }
}

/// Registers `sleepy`: writes its ledger row, then waits in `pg_sleep(60)` (PostgreSQL).
fn register_sleepy(registry: &mut Registry) {
    register_sleepy_on(registry, outbox::Backend::Postgres);
}

/// [`register_sleepy`] on `backend`: a minute's sleep in a statement of the server's.
fn register_sleepy_on(registry: &mut Registry, backend: outbox::Backend) {
    let sleep = match backend {
        outbox::Backend::Mysql => "SELECT SLEEP(60)",
        _ => "SELECT pg_sleep(60)",
    };
    registry.register(
        "sleepy",
        move |t: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            use diesel::RunQueryDsl;
            insert_ledger_row(t, tx.conn()?)?;
            diesel::sql_query(sleep).execute(tx.conn()?)?;
            Ok(())
        },
    );
}

/// On PostgreSQL the watchdog cancels the statement the timed-out handler waits on: the
/// handler's transaction rolls back at once, and its slot is free again.
#[test]
fn a_timed_out_handler_waiting_on_postgresql_is_cancelled() {
    let db = &TestDb::postgres();
    enqueue_batch(&mut db.conn(), &tasks("sleepy", 1)).unwrap();
    let mut registry = Registry::new();
    register_sleepy(&mut registry);
    let worker = Worker::new(
        &db.url,
        registry,
        config(2).domain(Domain::max("sleepy", ["sleepy"], 1).timeout(Duration::from_millis(300))),
    )
    .unwrap();
    let started = Instant::now();
    let tally = worker.run_once().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "pg_sleep was not cancelled"
    );
    assert_eq!((tally.done, tally.claimed), (0, 1));
    let task = db.task(db.count("SELECT id FROM async_task"));
    assert_eq!((task.state.as_str(), task.failures), ("pending", 1));
    assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 0);
    let node = published(db, &worker);
    assert_eq!((node.domains[1].running, node.domains[1].stuck), (0, 0));
}

/// Lock claims keep a `MAX` domain within its limit: each chunk is locked for its domain and
/// starts on one of its slots.
#[test]
fn lock_claims_keep_a_max_domain_within_its_limit() {
    let db = &TestDb::postgres();
    assert_eq!(max_holds(db, lock_config(6)), ClaimStyle::Lock);
}

/// Lock claims keep a `RESERVED` domain's thread for it.
#[test]
fn lock_claims_keep_a_reserved_domains_thread_for_it() {
    reserved_isolates(&TestDb::postgres(), lock_config(4), None);
}

server_backends! {
    /// Lock claims: a cancel that could not see the lease (no note) holds the task's row,
    /// opened by the task's own handler, which then waits for it; the domain's timeout charges
    /// the task, and the cancel commits while the charge waits for the row. The task is not
    /// charged, and its note must be written: on PostgreSQL though the charge's snapshot saw
    /// it pending; on MySQL the charge's locking read waits, then reads it cancelled.
    fn a_cancel_committed_while_the_timeout_charge_waits_for_its_row_is_noted(db: &TestDb) {
        enqueue_batch(&mut db.conn(), &tasks("sleepy", 1)).unwrap();
        let waited = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (waited_in, url) = (Arc::clone(&waited), db.url.clone());
        let mut registry = Registry::new();
        registry.register(
            "sleepy",
            move |t: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                let mut cancel = url.connect()?;
                diesel::sql_query("BEGIN").execute(&mut cancel)?;
                let sql = format!(
                    "UPDATE async_task SET state = 'cancelled', finished_at = updated_at WHERE id = {}",
                    t.id()
                );
                diesel::sql_query(sql).execute(&mut cancel)?;
                let url = url.clone();
                // Past the domain's timeout: the charge comes, waits for the row, and the
                // cancel commits then.
                let seen = std::thread::spawn(move || {
                    crate::lock::commit_once_a_session_waits_for_a_lock(&url, &mut cancel)
                })
                .join()
                .expect("the cancel's thread");
                waited_in.store(seen, Ordering::SeqCst);
                Ok(())
            },
        );
        let worker = Worker::new(
            &db.url,
            registry,
            lock_config(2)
                .domain(Domain::max("sleepy", ["sleepy"], 1).timeout(Duration::from_millis(300))),
        )
        .unwrap();
        worker.drain().unwrap();
        assert!(
            waited.load(Ordering::SeqCst),
            "the charge waited for the cancel's row"
        );
        let task = db.task(db.count("SELECT id FROM async_task WHERE keyword = 'sleepy'"));
        let note = Some("cancelled while running: its handler may have run".to_owned());
        assert_eq!(
            (task.state.as_str(), task.failures, &task.last_error),
            ("cancelled", 0, &note)
        );
    }
}

server_backends! {
    /// Under lock claims a handler past its domain's timeout has its chunk ended: the
    /// session terminated on PostgreSQL, the sleeping statement killed on MySQL (the chunk's
    /// thread is free again at once); the task is charged a failure, the chunk's other task
    /// runs again.
    fn lock_claims_charge_a_handler_past_its_domains_timeout(db: &TestDb) {
        enqueue_batch(&mut db.conn(), &tasks("sleepy", 1)).unwrap();
        enqueue_batch(&mut db.conn(), &tasks("quick", 1)).unwrap();
        let mut registry = crate::ledger_registry("quick");
        register_sleepy_on(&mut registry, db.backend());
        let worker = Worker::new(
            &db.url,
            registry,
            lock_config(2)
                .domain(
                    Domain::max("sleepy", ["sleepy", "quick"], 1)
                        .timeout(Duration::from_millis(300)),
                )
                .metrics_addr("127.0.0.1:0".parse().unwrap()),
        )
        .unwrap();
        assert_eq!(worker.claim_style(), ClaimStyle::Lock);
        let started = Instant::now();
        let report = worker.drain().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the sleep was not cancelled"
        );
        assert_eq!(report.tally.done, 1, "{report:?}");
        let sleepy = db.task(db.count("SELECT id FROM async_task WHERE keyword = 'sleepy'"));
        assert_eq!((sleepy.state.as_str(), sleepy.failures), ("pending", 1));
        assert!(sleepy.last_error.unwrap_or_default().contains("timed out"));
        assert_eq!(
            db.count("SELECT count(*) FROM test_ledger"),
            1,
            "the quick task's effect is there, the sleepy one's rolled back"
        );
        let node = published(db, &worker);
        assert_eq!((node.domains[1].running, node.domains[1].stuck), (0, 0));
        // Counted once, as retried, by the charge (the handler's own end was fenced out).
        let scraped = crate::scrape::scrape(worker.metrics_addr().unwrap());
        let finished = |outcome: &str| {
            scraped.value("outbox_tasks_finished_total", &[("keyword", "sleepy"), ("outcome", outcome)])
        };
        assert_eq!(finished("retried"), Some(1.0));
    }
}

server_backends! {
    /// Under lock claims (three threads) a chunk ended by its domain's timeout frees its other
    /// tasks, and this node leases one of them again into a new chunk while the ended chunk's
    /// handler still runs (a handler stuck outside the database, whose thread cannot be killed). When that
    /// handler returns, the ended chunk's claim again must not take the new chunk's lease
    /// (same node; before the fix, the same token too) and run the task a second time beside
    /// it.
    fn a_chunk_ended_past_its_timeout_leaves_its_tasks_new_chunk_alone(db: &TestDb) {
        enqueue_batch(&mut db.conn(), &tasks("quick", 1)).unwrap();
        enqueue_batch(&mut db.conn(), &tasks("stuck", 1)).unwrap();
        let quick_calls = Arc::new(AtomicUsize::new(0));
        // (the quick task runs again in a new chunk, the stuck handler has returned)
        let gates = Arc::new((Mutex::new((false, false)), Condvar::new()));
        let mut registry = Registry::new();
        let (calls_in, state_in) = (Arc::clone(&quick_calls), Arc::clone(&gates));
        registry.register(
            "quick",
            move |t: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                insert_ledger_row(t, tx.conn()?)?;
                if calls_in.fetch_add(1, Ordering::SeqCst) != 1 {
                    return Ok(());
                }
                // Its second run, in a new chunk: the stuck handler may return now; this one
                // runs on until the ended chunk has had 1 s to claim it again (well within
                // the domain's timeout of 3 s).
                let (state, changed) = &*state_in;
                let mut both = state.lock().unwrap();
                both.0 = true;
                changed.notify_all();
                let (both, _) = changed
                    .wait_timeout_while(both, Duration::from_secs(30), |b| !b.1)
                    .unwrap();
                drop(both);
                let until = Instant::now() + Duration::from_secs(1);
                while Instant::now() < until && calls_in.load(Ordering::SeqCst) == 2 {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(())
            },
        );
        let state_in = Arc::clone(&gates);
        registry.register(
            "stuck",
            move |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                let (state, changed) = &*state_in;
                let both = state.lock().unwrap();
                let (mut both, _) = changed
                    .wait_timeout_while(both, Duration::from_secs(30), |b| !b.0)
                    .unwrap();
                both.1 = true;
                changed.notify_all();
                Ok(())
            },
        );
        // `run`, not `drain`: a drain that finds nothing due waits for what runs before it
        // claims again, and the quick task must be leased again while the stuck one runs.
        let worker = Worker::new(
            &db.url,
            registry,
            lock_config(3)
                .poll_interval(Duration::from_millis(100))
                .domain(
                    Domain::max("stuck", ["stuck", "quick"], 3)
                        .timeout(Duration::from_secs(3)),
                ),
        )
        .unwrap();
        let stop = worker.stop_flag();
        let report = std::thread::scope(|s| {
            let run = s.spawn(|| worker.run().unwrap());
            // Done once its run in the new chunk has given the ended chunk 1 s.
            let done = "SELECT count(*) FROM async_task WHERE keyword = 'quick' AND state = 'done'";
            let done = wait_for(|| db.count(done) == 1 || run.is_finished());
            stop.store(true, Ordering::SeqCst);
            let report = run.join().unwrap();
            assert!(done, "the quick task done ({report:?})");
            report
        });
        assert_eq!(
            quick_calls.load(Ordering::SeqCst),
            2,
            "the quick task ran in the ended chunk and in the new one only ({report:?})"
        );
        let quick_id = db.count("SELECT id FROM async_task WHERE keyword = 'quick'");
        let quick = db.task(quick_id);
        assert_eq!((quick.state.as_str(), quick.failures), ("done", 0));
        assert_eq!(db.ledger_rows(quick_id), 1);
        // Charged once, for its timeout.
        let stuck = db.task(db.count("SELECT id FROM async_task WHERE keyword = 'stuck'"));
        assert_eq!(stuck.failures, 1);
    }
}

/// Polls `done` until it holds, for at most 10 s.
fn wait_for(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// SQLite, batched, a domain with a timeout: a chunk opens its transaction when a handler
/// first asks for it, as any chunk does, and so holds the file's one write lock only from
/// then on. Handlers that write nothing leave other writers (producers, other processes, the
/// heartbeat) free while they run.
#[test]
fn a_batched_chunk_of_a_watched_domain_on_sqlite_takes_the_write_lock_only_when_asked() {
    let db = TestDb::sqlite();
    enqueue_batch(&mut db.conn(), &tasks("outside", 2)).unwrap();
    let entered = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let mut registry = Registry::new();
    let (entered_in, gate_in) = (Arc::clone(&entered), Arc::clone(&gate));
    registry.register(
        "outside",
        move |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
            // A call to another system: no statement of its own.
            entered_in.fetch_add(1, Ordering::SeqCst);
            let (open, changed) = &*gate_in;
            let guard = open.lock().unwrap();
            let _open = changed
                .wait_timeout_while(guard, Duration::from_secs(60), |open| !*open)
                .unwrap();
            Ok(())
        },
    );
    let worker = Worker::new(
        &db.url,
        registry,
        config(2)
            .commit_batch(2)
            .domain(Domain::max("outside", ["outside"], 1).timeout(Duration::from_secs(60))),
    )
    .unwrap();
    std::thread::scope(|s| {
        let run = s.spawn(|| worker.run_once().unwrap());
        assert!(
            wait_for(|| entered.load(Ordering::SeqCst) == 1),
            "the handler did not start"
        );
        let mut producer = db.url.connect().unwrap();
        diesel::sql_query("PRAGMA busy_timeout = 200")
            .execute(&mut producer)
            .unwrap();
        let began = diesel::sql_query("BEGIN IMMEDIATE").execute(&mut producer);
        if began.is_ok() {
            diesel::sql_query("ROLLBACK")
                .execute(&mut producer)
                .unwrap();
        }
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        assert_eq!(run.join().unwrap().done, 2);
        began.expect("another writer began while the chunk's handler ran");
    });
}

/// PostgreSQL: the connections of the worker's pool are cut (a failover, an operator's
/// `pg_terminate_backend` sweep) while a handler runs past its domain's timeout. The first
/// attempt at its charge meets a dead connection; the next pass charges it, on a fresh one,
/// rather than leave the task to its late completion or its deadline.
#[test]
fn a_timeouts_charge_that_meets_a_dead_connection_is_made_at_the_next_pass() {
    let db = TestDb::postgres();
    enqueue_batch(&mut db.conn(), &tasks("stuck", 1)).unwrap();
    let mut registry = Registry::new();
    registry.register(
        "stuck",
        |t: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            let cut = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                    WHERE datname = current_database() AND pid <> pg_backend_pid()";
            diesel::sql_query(cut).execute(tx.conn()?)?;
            // Busy in Rust past the timeout, then its effect: fenced out once charged.
            std::thread::sleep(Duration::from_millis(1500));
            insert_ledger_row(t, tx.conn()?)?;
            Ok(())
        },
    );
    let worker = Worker::new(
        &db.url,
        registry,
        config(2).domain(Domain::max("stuck", ["stuck"], 1).timeout(Duration::from_millis(300))),
    )
    .unwrap();
    // Idle connections in the pool beside the one the task runs on: the cut leaves them
    // dead, to be found so by their next use.
    let idle: Vec<_> = (0..3).map(|_| worker.pool().get().unwrap()).collect();
    drop(idle);
    let tally = worker.run_once().unwrap();
    assert_eq!(
        tally.done, 0,
        "the late completion was fenced out: {tally:?}"
    );
    let task = db.task(db.count("SELECT id FROM async_task"));
    assert_eq!((task.state.as_str(), task.failures), ("pending", 1));
    assert!(task
        .last_error
        .unwrap_or_default()
        .contains("past its domain's timeout"));
    assert_eq!(
        db.count("SELECT count(*) FROM test_ledger"),
        0,
        "its effect rolled back"
    );
}

/// A `slow.p` task at its last attempt, and its child `other`.
fn dying_parent_and_child(db: &TestDb) -> (i64, i64) {
    let parent = outbox::enqueue(&mut db.conn(), &NewTask::new("slow.p", "p").max_attempts(1))
        .unwrap()
        .id;
    let child = outbox::enqueue(&mut db.conn(), &NewTask::new("other", "c").after(parent))
        .unwrap()
        .id;
    (parent, child)
}

/// A connection whose open transaction holds the task `id`'s row (`ROLLBACK` lets it go).
fn holding(db: &TestDb, id: i64) -> outbox::DbConnection {
    let mut holder = db.conn();
    diesel::sql_query("BEGIN").execute(&mut holder).unwrap();
    diesel::sql_query(format!(
        "SELECT id FROM async_task WHERE id = {id} FOR UPDATE"
    ))
    .execute(&mut holder)
    .unwrap();
    holder
}

/// Domain `q`'s task `q` (its handler past its 1.5 s timeout): the other handler, whose
/// charge the tests below watch for; `registry` gets 4 s sleeping handlers for `keywords`
/// and `slow.q`.
fn other_in_q(db: &TestDb, registry: &mut Registry, keywords: &[&str]) -> (i64, Domain) {
    for &keyword in keywords.iter().chain(&["slow.q"]) {
        registry.register(
            keyword,
            |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                std::thread::sleep(Duration::from_secs(4));
                Ok(())
            },
        );
    }
    let other = outbox::enqueue(&mut db.conn(), &NewTask::new("slow.q", "q"))
        .unwrap()
        .id;
    let q = Domain::max("q", ["slow.q"], 1).timeout(Duration::from_millis(1500));
    (other, q)
}

/// Runs `worker.run_once()` on a thread: whether the task `other` was charged a failure
/// within 10 s, while the test held what it holds; `let_go` then frees it, before the run is
/// joined.
fn charged_meanwhile(db: &TestDb, worker: &Worker, other: i64, let_go: impl FnOnce()) -> bool {
    std::thread::scope(|s| {
        let run = s.spawn(|| worker.run_once().unwrap());
        let charged = wait_for(|| {
            db.count(&format!(
                "SELECT failures FROM async_task WHERE id = {other}"
            )) == 1
        });
        let_go();
        run.join().unwrap();
        charged
    })
}

server_backends! {
    /// A charge at a domain's timeout waits for no lock for ever, on PostgreSQL and MySQL: a
    /// task made dead there cancels its descendants, whose rows a producer's or an operator's
    /// open transaction may hold. Its charge gives up after 2 s (MySQL's lock wait timeout is
    /// 50 s by default) and is made again later, and the watchdog meanwhile charges the other
    /// handlers past their timeouts.
    fn a_timeouts_charge_that_meets_a_held_descendant_holds_up_no_other_charge(db: &TestDb) {
        let (parent, child) = dying_parent_and_child(db);
        let mut registry = Registry::new();
        let (other, q) = other_in_q(db, &mut registry, &["slow.p", "other"]);
        let worker = Worker::new(
            &db.url,
            registry,
            config(3)
                .domain(Domain::max("p", ["slow.p"], 1).timeout(Duration::from_millis(300)))
                .domain(q),
        )
        .unwrap();
        let mut holder = holding(db, child);
        let charged = charged_meanwhile(db, &worker, other, || {
            diesel::sql_query("ROLLBACK").execute(&mut holder).unwrap();
        });
        assert!(
            charged,
            "the other handler was not charged while a charge waited"
        );
        let dead = wait_for(|| {
            db.count(&format!(
                "SELECT count(*) FROM async_task WHERE id = {parent} AND state = 'dead'"
            )) == 1
        });
        assert!(
            dead,
            "the parent's charge, made again once the lock was free"
        );
        assert_eq!(db.task(child).state, "cancelled");
    }
}

server_backends! {
    /// A stamped chunk whose handler runs past its domain's timeout has its other tasks
    /// released after the charge. On MySQL the chunk's transaction outlives its ended
    /// statement, holding what its handlers locked: here the rows of six siblings that each
    /// linked a child to itself. Their release waits 2 s at most in all, not per sibling, and
    /// the watchdog meanwhile charges the other handlers past their timeouts.
    fn a_release_of_a_hung_chunks_sibling_holds_up_no_other_charge(db: &TestDb) {
        for i in 0..6 {
            outbox::enqueue(&mut db.conn(), &NewTask::new("slow.a", format!("a{i}"))).unwrap();
        }
        let hung = outbox::enqueue(&mut db.conn(), &NewTask::new("slow.b", "b"))
            .unwrap()
            .id;
        let mut registry = Registry::new();
        let (other, q) = other_in_q(db, &mut registry, &["other"]);
        registry.register(
            "slow.a",
            |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                let child = NewTask::new("other", format!("c{}", task.id())).after(task.id());
                outbox::enqueue(tx.conn()?, &child)?;
                Ok(())
            },
        );
        // The hung handler waits until the test has looked (60 s at most).
        let looked = Arc::new((Mutex::new(false), Condvar::new()));
        let gate = Arc::clone(&looked);
        registry.register(
            "slow.b",
            move |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                let (open, changed) = &*gate;
                let open = open.lock().unwrap();
                let _open = changed.wait_timeout_while(open, Duration::from_secs(60), |o| !*o);
                Ok(())
            },
        );
        let worker = Worker::new(
            &db.url,
            registry,
            config(3)
                .commit_batch(7)
                .claim_style(ClaimStyle::Stamp)
                .domain(
                    Domain::max("p", ["slow.a", "slow.b"], 1)
                        .timeout(Duration::from_millis(300)),
                )
                .domain(q),
        )
        .unwrap();
        let charged = charged_meanwhile(db, &worker, other, || {
            *looked.0.lock().unwrap() = true;
            looked.1.notify_all();
        });
        assert!(
            charged,
            "the other handler was not charged while a sibling's release waited"
        );
        assert_eq!(db.task(hung).failures, 1, "the hung handler's task, charged");
    }
}

/// A charge at a domain's timeout that gives up at its lock timeout (a dead task's descendant
/// held by another transaction) leaves the task to be charged, not released: the hung
/// handler's session was ended first, and its handler, failing on the cut connection, once
/// released the task uncharged, so that a task held that way never reached its max attempts.
/// It stays running, and a rescue pass charges it at its deadline once the lock is free.
#[test]
fn a_handler_ended_at_its_timeout_whose_charge_failed_is_not_released_uncharged() {
    use diesel::connection::SimpleConnection;
    let db = &TestDb::postgres();
    let (parent, child) = dying_parent_and_child(db);
    let mut registry = Registry::new();
    registry.register(
        "slow.p",
        |_: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            tx.conn()?.batch_execute("SELECT pg_sleep(10)")?;
            Ok(())
        },
    );
    registry.register(
        "other",
        |_: &TaskContext, _: &mut TaskTx| -> HandlerResult { Ok(()) },
    );
    let worker = Worker::new(
        &db.url,
        registry,
        config(2).domain(Domain::max("p", ["slow.p"], 1).timeout(Duration::from_millis(300))),
    )
    .unwrap();
    let mut holder = holding(db, child);
    let tally = worker.run_once().unwrap();
    let task = db.task(parent);
    assert!(
        !(task.state == "pending" && task.failures == 0),
        "released uncharged: {task:?} {tally:?}"
    );
    diesel::sql_query("ROLLBACK").execute(&mut holder).unwrap();
    let charged = wait_for(|| {
        crate::rescue::quiet_worker(db).rescue_once().is_ok()
            && db.count(&format!(
                "SELECT count(*) FROM async_task WHERE id = {parent} AND state = 'dead'"
            )) == 1
    });
    assert!(charged, "{:?}", db.task(parent));
    assert_eq!(db.task(parent).failures, 1);
    assert_eq!(db.task(child).state, "cancelled");
}

/// MySQL: a charge at a domain's timeout bounds its lock waits to 2 s with a session setting
/// (`innodb_lock_wait_timeout`; MySQL has no transaction-local one), and sets it back to the
/// server's after: a handler that later gets the same pooled connection waits for its locks as
/// long as the server lets it. The worker runs on the test's own pool, so that each of its
/// connections can be looked at after the charge.
#[cfg(feature = "mysql")]
#[test]
fn a_timeouts_charge_on_mysql_leaves_its_connections_lock_wait_as_the_servers() {
    #[derive(diesel::QueryableByName)]
    struct Waits {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        session: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        global: i64,
    }
    let db = &TestDb::mysql();
    enqueue_batch(&mut db.conn(), &tasks("stuck", 1)).unwrap();
    let mut registry = Registry::new();
    registry.register(
        "stuck",
        |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
            std::thread::sleep(Duration::from_millis(1500));
            Ok(())
        },
    );
    let pool_size = 4; // threads + 2
    let pool = db.url.pool(pool_size).unwrap();
    let worker = Worker::with_pool(
        &db.url,
        pool.clone(),
        registry,
        config(2).domain(Domain::max("stuck", ["stuck"], 1).timeout(Duration::from_millis(200))),
    )
    .unwrap();
    assert_eq!(
        worker.run_once().unwrap().done,
        0,
        "the late completion was fenced out"
    );
    let task = db.task(db.count("SELECT id FROM async_task"));
    assert_eq!(
        (task.state.as_str(), task.failures),
        ("pending", 1),
        "charged at its timeout"
    );
    // Every connection of the pool, each held while the next is taken.
    let held: Vec<_> = (0..pool_size).map(|_| pool.get().unwrap()).collect();
    for mut conn in held {
        let waits: Waits = diesel::sql_query(
            "SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS SIGNED) AS session,
                    CAST(@@GLOBAL.innodb_lock_wait_timeout AS SIGNED) AS global",
        )
        .get_result(&mut *conn)
        .unwrap();
        assert_eq!(
            waits.session, waits.global,
            "a pooled connection kept the charge's bound"
        );
    }
}
