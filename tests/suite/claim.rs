//! Claiming: what is claimed, in what order, how much, and what is left alone.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::stats::keyword_stats;
use outbox::{
    enqueue, enqueue_batch, HandlerResult, NewTask, Registry, TaskContext, TaskTx, Worker,
};

use crate::{ledger_registry, small_config, worker};

every_backend! {
    fn only_registered_keywords_are_claimed_and_the_rest_show_in_stats(db: &TestDb) {
        let mut conn = db.conn();
        let served = enqueue(&mut conn, &NewTask::new("ledger", "1")).unwrap().id;
        let unserved = enqueue(&mut conn, &NewTask::new("mail.send", "1")).unwrap().id;
        let registry = ledger_registry("ledger");
        let w = worker(db, registry.clone());
        assert_eq!(w.drain().unwrap().tally.done, 1);
        assert_eq!(db.task(served).state, "done");
        assert_eq!(db.task(unserved).state, "pending");

        let stats = keyword_stats(&mut conn, &registry).unwrap();
        let mail = stats.iter().find(|s| s.keyword == "mail.send").unwrap();
        assert_eq!((mail.pending, mail.served), (1, false));
        assert!(mail.oldest_due_secs.unwrap() >= 0.0);
        let ledger = stats.iter().find(|s| s.keyword == "ledger").unwrap();
        assert_eq!((ledger.done, ledger.pending, ledger.served), (1, 0, true));
        assert_eq!(ledger.oldest_due_secs, None);
    }

    fn a_delayed_task_waits_for_its_time_by_the_database_clock(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1").delay(Duration::from_secs(3600))).unwrap().id;
        let w = worker(db, ledger_registry("ledger"));
        assert_eq!(w.run_once().unwrap().claimed, 0);
        assert_eq!(db.task(id).due, 0);
        db.make_all_due();
        assert_eq!(w.run_once().unwrap().done, 1);
    }

    fn lower_priority_runs_first_then_oldest(db: &TestDb) {
        let mut conn = db.conn();
        let low = enqueue(&mut conn, &NewTask::new("ledger", "low").priority(5)).unwrap().id;
        let first = enqueue(&mut conn, &NewTask::new("ledger", "first")).unwrap().id;
        let second = enqueue(&mut conn, &NewTask::new("ledger", "second")).unwrap().id;
        let config = small_config().page_size(1);
        let w = Worker::new(&db.url, ledger_registry("ledger"), config).unwrap();
        let order: Vec<i64> = (0..3).map(|_| w.claim().unwrap()[0].context.id()).collect();
        assert_eq!(order, [first, second, low]);
    }

    fn a_claim_takes_at_most_a_page_and_what_can_start_at_once(db: &TestDb) {
        let tasks: Vec<NewTask> = (0..25).map(|n| NewTask::new("ledger", n.to_string())).collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        // Room for 2 + 20 + 1: the page (10) is the bound.
        let roomy = small_config().threads(2).queue(20).page_size(10);
        let w = Worker::new(&db.url, ledger_registry("ledger"), roomy).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!((tally.claimed, tally.done), (10, 10));
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'pending'"), 15);
        // One thread, no queue, and the claiming thread: 2 can start at once.
        let narrow = small_config().threads(1).queue(0).page_size(10);
        let w = Worker::new(&db.url, ledger_registry("ledger"), narrow).unwrap();
        assert_eq!(w.run_once().unwrap().claimed, 2);
        let report = w.drain().unwrap();
        assert_eq!(report.tally.done, 13);
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 25);
    }

    fn the_handler_sees_the_tasks_context(db: &TestDb) {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = Arc::clone(&seen);
        let mut registry = Registry::new();
        registry.register("ctx", move |task: &TaskContext, _: &mut TaskTx| -> HandlerResult {
            let payload: serde_json::Value = task.payload()?;
            sink.lock().unwrap().push(format!(
                "{} {} {:?} attempt={} {}",
                task.keyword(), task.biz_id(), task.tenant(), task.attempt(), payload["n"]
            ));
            Ok(())
        });
        let id = enqueue(&mut db.conn(), &NewTask::new("ctx", "b-1").tenant("shop-eu").payload(&serde_json::json!({"n": 7}))).unwrap().id;
        db.exec(&format!("UPDATE async_task SET failures = 2 WHERE id = {id}"));
        worker(db, registry).run_once().unwrap();
        assert_eq!(*seen.lock().unwrap(), ["ctx b-1 Some(\"shop-eu\") attempt=3 7"]);
    }

    fn stopping_releases_claimed_but_unstarted_tasks_without_a_failure(db: &TestDb) {
        let tasks: Vec<NewTask> = (0..5).map(|n| NewTask::new("ledger", n.to_string())).collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let w = worker(db, ledger_registry("ledger"));
        let page = w.claim().unwrap();
        w.stop_flag().store(true, Ordering::Relaxed);
        let tally = w.execute(page);
        assert_eq!((tally.claimed, tally.released, tally.done), (5, 5, 0));
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'pending' AND failures = 0 AND owner IS NULL"), 5);
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 0);
        // A stopped worker's drain returns at once.
        assert_eq!(w.drain().unwrap().tally.claimed, 0);
    }

    fn a_worker_registers_its_node_and_marks_it_gone_when_dropped(db: &TestDb) {
        let w = worker(db, ledger_registry("ledger"));
        let node = w.node_id();
        assert_eq!(db.count(&format!("SELECT count(*) FROM async_node WHERE id = {node} AND state = 'alive'")), 1);
        let name_ok = db.count(&format!(
            "SELECT count(*) FROM async_node WHERE id = {node} AND name LIKE '%:{}'", std::process::id()
        ));
        assert_eq!(name_ok, 1, "the node is named host:pid");
        drop(w);
        assert_eq!(db.count(&format!("SELECT count(*) FROM async_node WHERE id = {node} AND state = 'gone'")), 1);
    }

    fn a_worker_refuses_an_unmigrated_database_and_bad_settings(db: &TestDb) {
        let registry = ledger_registry("ledger");
        let bad = small_config().page_size(0);
        assert!(matches!(Worker::new(&db.url, registry.clone(), bad), Err(outbox::Error::InvalidConfig { setting: "page", .. })));
        assert!(matches!(Worker::new(&db.url, Registry::new(), small_config()), Err(outbox::Error::InvalidConfig { setting: "registry", .. })));
        // A deadline past the year 9999 would be NULL on SQLite: a running task rescue
        // could never find.
        let endless = small_config().task_timeout(Duration::from_secs(8000 * 365 * 24 * 3600));
        match Worker::new(&db.url, registry.clone(), endless) {
            Err(outbox::Error::InvalidConfig { setting, reason }) => assert_eq!(setting, "task-timeout", "{reason}"),
            other => panic!("{:?}", other.map(|_| "a worker")),
        }
        // Durations a flag can spell (`--task-timeout 500000000000y`) are refused, not
        // multiplied past what a duration holds.
        for (setting, config) in [
            ("task-timeout", small_config().task_timeout(Duration::MAX).commit_batch(2)),
            ("heartbeat", small_config().heartbeat(Duration::MAX)),
            ("poll-interval", small_config().poll_interval(Duration::MAX)),
        ] {
            match Worker::new(&db.url, registry.clone(), config) {
                Err(outbox::Error::InvalidConfig { setting: s, reason }) => assert_eq!(s, setting, "{reason}"),
                other => panic!("{setting}: {:?}", other.map(|_| "a worker")),
            }
        }
        let applied = db.count("SELECT count(*) FROM __diesel_schema_migrations");
        assert!(applied >= 1, "{applied} migrations applied");
        db.exec("DELETE FROM __diesel_schema_migrations");
        assert!(matches!(
            Worker::new(&db.url, registry, small_config()),
            Err(outbox::Error::NotMigrated { pending }) if pending as i64 == applied
        ));
    }
}

/// PostgreSQL only: an idle `run` whose poll interval is an hour still picks up a task within
/// moments of the producer's commit, through LISTEN/NOTIFY.
#[test]
fn notify_wakes_an_idle_run_worker() {
    use std::time::Instant;

    let db = &crate::support::TestDb::postgres();
    let config = small_config().poll_interval(Duration::from_secs(3600));
    let w = Worker::new(&db.url, ledger_registry("ledger"), config).unwrap();
    let stop = w.stop_flag();
    std::thread::scope(|s| {
        let runner = s.spawn(|| w.run().unwrap());
        // The first task is claimed either by the first pass or through NOTIFY.
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1"))
            .unwrap()
            .id;
        let deadline = Instant::now() + Duration::from_secs(30);
        while db.task(id).state != "done" {
            assert!(
                Instant::now() < deadline,
                "not run within 30 s: NOTIFY did not wake it"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // After that pass claimed less than a page, the worker waits up to its poll interval
        // (an hour): only the NOTIFY of this enqueue can wake it.
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "2"))
            .unwrap()
            .id;
        while db.task(id).state != "done" {
            assert!(
                Instant::now() < deadline,
                "not run within 30 s: NOTIFY did not wake it"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
        let report = runner.join().unwrap();
        assert_eq!(report.tally.done, 2);
    });
}

every_backend! {
    fn run_claims_again_at_once_after_a_full_claim(db: &TestDb) {
        // A claim takes at most threads + queue + 1 = 5 tasks, fewer than the page size: a
        // claim of 5 is full, and the worker must claim again at once instead of waiting for
        // its poll interval (an hour; LISTEN off so that no NOTIFY can wake it).
        let config = small_config().poll_interval(Duration::from_secs(3600)).listen(false).page_size(100);
        let tasks: Vec<NewTask> = (0..23).map(|n| NewTask::new("ledger", n.to_string())).collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let w = Worker::new(&db.url, ledger_registry("ledger"), config).unwrap();
        let stop = w.stop_flag();
        std::thread::scope(|s| {
            let runner = s.spawn(|| w.run().unwrap());
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while db.count("SELECT count(*) FROM async_task WHERE state = 'done'") < 23 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "only {} of 23 done within 60 s: the worker waited for its poll interval",
                    db.count("SELECT count(*) FROM async_task WHERE state = 'done'")
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            stop.store(true, Ordering::Relaxed);
            assert_eq!(runner.join().unwrap().tally.done, 23);
        });
    }
}

every_backend! {
    fn drain_runs_what_its_own_tasks_make_due(db: &TestDb) {
        // `first` enqueues `second` in its own transaction: a follow-up that is due only
        // once `first` commits, while the drain's last claim may already have come back
        // empty. The drain must still run it.
        let mut registry = Registry::new();
        registry.register("first", |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            enqueue(tx.conn()?, &NewTask::new("second", task.biz_id()))?;
            Ok(())
        });
        registry.register("second", crate::write_ledger);
        enqueue(&mut db.conn(), &NewTask::new("first", "1")).unwrap();
        let w = Worker::new(&db.url, registry, small_config()).unwrap();
        let tally = w.drain().unwrap().tally;
        assert_eq!(tally.done, 2, "{tally:?}");
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 1);
    }

    fn a_panic_outside_a_handler_propagates_instead_of_hanging_the_pool(db: &TestDb) {
        // A handler error whose Display panics: the panic happens while the failure is
        // recorded, outside the handler's catch_unwind.
        #[derive(Debug)]
        struct Nasty;
        impl std::fmt::Display for Nasty {
            fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                panic!("Display of a handler error panicked")
            }
        }
        impl std::error::Error for Nasty {}
        let mut registry = Registry::new();
        registry.register("nasty", |task: &TaskContext, _: &mut TaskTx| -> HandlerResult {
            if task.biz_id() == "3" {
                return Err(Nasty.into());
            }
            Ok(())
        });
        let tasks: Vec<NewTask> = (1..=6).map(|n| NewTask::new("nasty", n.to_string())).collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let config = small_config().threads(1).queue(4);
        let w = Worker::new(&db.url, registry, config).unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.drain()));
                let _ = done.send(outcome.is_err());
            });
            let panicked = finished
                .recv_timeout(Duration::from_secs(60))
                .expect("drain hung after a panic outside a handler");
            assert!(panicked, "the panic was swallowed");
        });
        // The pool kept serving the queue: every other task ran.
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'done'"), 5);
        assert_eq!(w.in_flight(), 0);
    }
}

every_backend! {
    fn a_claim_of_several_keywords_takes_their_tasks_in_claim_order_across_them(db: &TestDb) {
        // Three served keywords, their priorities interleaved, and a keyword not served whose
        // tasks come first in claim order: each page is the next tasks of the three in claim
        // order, each once, and the other keyword's are left pending.
        let keywords = ["ledger.a", "ledger.b", "ledger.c"];
        let mut tasks: Vec<NewTask> = (0..12)
            .map(|i| NewTask::new(keywords[i % 3], format!("{i:02}")).priority(((i * 7) % 4) as i16))
            .collect();
        tasks.extend((0..50).map(|i| NewTask::new("mail.send", format!("m{i:02}")).priority(-1)));
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let mut registry = ledger_registry(keywords[0]);
        for keyword in &keywords[1..] {
            registry.register(keyword, crate::write_ledger);
        }
        let w = Worker::new(&db.url, registry, small_config().page_size(5)).unwrap();
        let pages: Vec<Vec<String>> = (0..4)
            .map(|_| w.claim().unwrap().iter().map(|t| t.context.biz_id().to_owned()).collect())
            .collect();
        // One statement enqueued them all at one time: claim order is priority, then id.
        let mut expected: Vec<(usize, usize)> = (0..12).map(|i| ((i * 7) % 4, i)).collect();
        expected.sort();
        let expected: Vec<String> = expected.iter().map(|&(_, i)| format!("{i:02}")).collect();
        assert_eq!(pages, vec![expected[..5].to_vec(), expected[5..10].to_vec(), expected[10..].to_vec(), vec![]]);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE keyword = 'mail.send' AND state = 'pending'"), 50);
    }
}
