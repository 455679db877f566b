//! Cancel: by id or key, in the caller's transaction; a cancelled task is never claimed, and a
//! running handler's completion is fenced out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use diesel::Connection;
use outbox::{
    cancel, cancel_by_key, cancel_matching, enqueue, retry, Error, HandlerResult, NewTask,
    Registry, TaskContext, TaskState, TaskTx, Worker,
};

use crate::{ledger_registry, small_config, write_ledger};

every_backend! {
    fn a_cancelled_task_is_never_claimed_and_a_second_cancel_writes_nothing(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let first = cancel(&mut db.conn(), id).unwrap();
        assert_eq!((first.id, first.cancelled, first.state), (id, true, TaskState::Cancelled));
        let w = Worker::new(&db.url, ledger_registry("ledger"), small_config()).unwrap();
        assert_eq!(w.run_once().unwrap().claimed, 0);
        assert_eq!(db.ledger_rows(id), 0);
        let again = cancel(&mut db.conn(), id).unwrap();
        assert_eq!((again.cancelled, again.state), (false, TaskState::Cancelled));
    }

    fn a_cancel_by_key_commits_or_rolls_back_with_the_callers_transaction(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("coupon.grant", "order-7")).unwrap().id;
        let mut conn = db.conn();
        let rolled_back: Result<(), diesel::result::Error> = conn.transaction(|conn| {
            assert!(cancel_by_key(conn, "coupon.grant", "order-7").unwrap().cancelled);
            Err(diesel::result::Error::RollbackTransaction)
        });
        assert!(rolled_back.is_err());
        assert_eq!(db.task(id).state, "pending", "the cancel rolled back with its transaction");
        conn.transaction(|conn| -> Result<(), diesel::result::Error> {
            assert!(cancel_by_key(conn, "coupon.grant", "order-7").unwrap().cancelled);
            Ok(())
        })
        .unwrap();
        assert_eq!(db.task(id).state, "cancelled");
    }

    fn a_running_tasks_cancel_fences_out_its_completion_and_rolls_back_its_effects(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let calls = Arc::new(AtomicUsize::new(0));
        let (calls_in, url) = (Arc::clone(&calls), db.url.clone());
        let mut registry = Registry::new();
        registry.register("ledger", move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            calls_in.fetch_add(1, Ordering::SeqCst);
            // An operator cancels the task while its handler runs (before the handler opens
            // its transaction: on SQLite that holds the only write lock).
            let cancelled = cancel(&mut url.connect()?, task.id())?;
            assert!(cancelled.cancelled);
            write_ledger(task, tx)
        });
        let w = Worker::new(&db.url, registry, small_config()).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!((tally.done, tally.lost), (0, 1), "{tally:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(db.ledger_rows(id), 0, "the cancelled task's effect rolled back");
        assert_eq!(db.task(id).state, "cancelled");
        assert_eq!(w.run_once().unwrap().claimed, 0, "never claimed again");
    }

    fn a_task_cancelled_while_it_ran_says_so_and_a_retry_keeps_it(db: &TestDb) {
        // Task 1 is cancelled by id, task 2 by its tenant, each by its own handler's first run
        // (an effect outside the database: it happened); task 3 while it waits.
        let mut conn = db.conn();
        let ids: Vec<i64> = [("1", None), ("2", Some("t2")), ("3", None)]
            .into_iter()
            .map(|(biz, tenant)| {
                let task = NewTask::new("mail.send", biz);
                let task = match tenant {
                    Some(t) => task.tenant(t),
                    None => task,
                };
                enqueue(&mut conn, &task).unwrap().id
            })
            .collect();
        assert!(cancel(&mut conn, ids[2]).unwrap().cancelled);
        let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (runs_in, url) = (Arc::clone(&runs), db.url.clone());
        let mut registry = Registry::new();
        registry.register("mail.send", move |task: &TaskContext, _: &mut TaskTx| -> HandlerResult {
            let first = !runs_in.lock().unwrap().contains(&task.id());
            runs_in.lock().unwrap().push(task.id());
            if first && task.biz_id() == "1" {
                assert!(cancel(&mut url.connect()?, task.id())?.cancelled);
            } else if first {
                let tenant = outbox::cancel::Filter::default().tenant("t2");
                assert_eq!(cancel_matching(&mut url.connect()?, &tenant)?, 1);
            }
            Ok(())
        });
        let w = Worker::new(&db.url, registry, small_config()).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!((tally.done, tally.lost), (0, 2), "{tally:?}");
        let note = Some("cancelled while running: its handler may have run".to_owned());
        for (id, last_error) in [(ids[0], &note), (ids[1], &note), (ids[2], &None)] {
            let task = db.task(id);
            assert_eq!((task.state.as_str(), &task.last_error), ("cancelled", last_error), "task {id}");
        }
        for &id in &ids[..2] {
            assert!(retry(&mut conn, id).unwrap().retried);
        }
        assert_eq!(w.run_once().unwrap().done, 2);
        for &id in &ids[..2] {
            let task = db.task(id);
            assert_eq!((task.state.as_str(), &task.last_error), ("done", &note), "task {id}: its second run says why");
        }
        assert_eq!(runs.lock().unwrap().len(), 4, "each of the two ran twice");
    }

    fn a_finished_task_is_not_cancelled_and_an_unknown_one_is_named(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let w = Worker::new(&db.url, ledger_registry("ledger"), small_config()).unwrap();
        assert_eq!(w.run_once().unwrap().done, 1);
        let done = cancel(&mut db.conn(), id).unwrap();
        assert_eq!((done.cancelled, done.state), (false, TaskState::Done));
        assert_eq!(db.task(id).state, "done");
        let error = cancel(&mut db.conn(), id + 1000).unwrap_err();
        assert!(matches!(error, Error::TaskNotFound { .. }), "{error}");
        assert_eq!(error.to_string(), format!("no task {}", id + 1000));
        let error = cancel_by_key(&mut db.conn(), "ledger", "nope").unwrap_err();
        assert_eq!(error.to_string(), "no task ledger nope");
    }
}

every_backend! {
    fn a_running_handler_sees_its_task_cancelled_within_a_heartbeat(db: &TestDb) {
        use std::time::{Duration, Instant};

        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let noticed = Arc::new(std::sync::Mutex::new(None::<Instant>));
        let noticed_in = Arc::clone(&noticed);
        let mut registry = Registry::new();
        registry.register("ledger", move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            // A long handler that checks for a cancel as it goes.
            let started = Instant::now();
            while !task.is_cancelled() {
                if started.elapsed() > Duration::from_secs(20) {
                    return Err(anyhow::anyhow!("never saw the cancel").into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            *noticed_in.lock().unwrap() = Some(Instant::now());
            // Whatever it writes now is rolled back: its completion is fenced out.
            write_ledger(task, tx)
        });
        let config = small_config().heartbeat(Duration::from_millis(200));
        let w = Worker::new(&db.url, registry, config).unwrap();
        let (tally, cancelled_at) = std::thread::scope(|s| {
            let worker = s.spawn(|| w.run_once().unwrap());
            let deadline = Instant::now() + Duration::from_secs(20);
            while db.task(id).state != "running" {
                assert!(Instant::now() < deadline, "the task never started");
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(cancel(&mut db.conn(), id).unwrap().cancelled);
            let cancelled_at = Instant::now();
            (worker.join().unwrap(), cancelled_at)
        });
        let noticed = noticed.lock().unwrap().expect("the handler saw the cancel");
        let after = noticed.saturating_duration_since(cancelled_at);
        // One heartbeat (200 ms, ±10%) and the beat's own time; generous for a loaded machine.
        assert!(after < Duration::from_secs(3), "seen {after:?} after the cancel");
        assert_eq!((tally.done, tally.lost), (0, 1), "{tally:?}");
        assert_eq!(db.ledger_rows(id), 0, "the cancelled task's effect rolled back");
        assert_eq!(db.task(id).state, "cancelled");
    }
}

every_backend! {
    fn a_retried_tasks_second_run_sees_a_cancel_after_its_first_run_ends(db: &TestDb) {
        // The first run is cancelled and ignores its flag; the task is retried and claimed
        // again by the same node while the first run still runs. When the first run ends, the
        // second is still watched: a cancel of it reaches its handler.
        use std::sync::atomic::AtomicBool;
        use std::time::{Duration, Instant};

        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let runs = Arc::new(AtomicUsize::new(0));
        let (second_started, first_may_end, second_saw) =
            (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let wait = |flag: &AtomicBool| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !flag.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            flag.load(Ordering::SeqCst)
        };
        let (runs_in, started_in, may_end_in, saw_in, url) = (
            Arc::clone(&runs),
            Arc::clone(&second_started),
            Arc::clone(&first_may_end),
            Arc::clone(&second_saw),
            db.url.clone(),
        );
        let mut registry = Registry::new();
        registry.register("ledger", move |task: &TaskContext, _: &mut TaskTx| -> HandlerResult {
            if runs_in.fetch_add(1, Ordering::SeqCst) == 0 {
                let mut operator = url.connect()?;
                assert!(cancel(&mut operator, task.id())?.cancelled);
                assert!(retry(&mut operator, task.id())?.retried);
                wait(&started_in);
                wait(&may_end_in);
            } else {
                started_in.store(true, Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(10);
                while !task.is_cancelled() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                saw_in.store(task.is_cancelled(), Ordering::SeqCst);
            }
            Ok(())
        });
        let mut config = small_config().heartbeat(Duration::from_millis(200));
        config.poll_interval = Duration::from_millis(50);
        let w = Worker::new(&db.url, registry, config).unwrap();
        let stop = w.stop_flag();
        std::thread::scope(|s| {
            let worker = s.spawn(|| w.run().unwrap());
            assert!(wait(&second_started), "the retried task was not claimed again");
            first_may_end.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(10);
            while w.totals().lost < 1 {
                assert!(Instant::now() < deadline, "the first run never ended");
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(cancel(&mut db.conn(), id).unwrap().cancelled);
            let deadline = Instant::now() + Duration::from_secs(15);
            while runs.load(Ordering::SeqCst) < 2 || w.totals().lost < 2 {
                assert!(Instant::now() < deadline, "the second run never ended");
                std::thread::sleep(Duration::from_millis(5));
            }
            stop.store(true, Ordering::SeqCst);
            worker.join().unwrap();
        });
        assert!(second_saw.load(Ordering::SeqCst), "the second run never saw its cancel");
    }
}

every_backend! {
    fn cancel_matching_cancels_the_unfinished_tasks_of_a_keyword_or_tenant_only(db: &TestDb) {
        let mut conn = db.conn();
        for (keyword, biz, tenant) in [
            ("coupon.grant", "1", Some("acme")),
            ("coupon.grant", "2", Some("acme")),
            ("coupon.grant", "3", Some("other")),
            ("coupon.grant", "4", None),
            ("mail.send", "5", Some("acme")),
        ] {
            let mut task = NewTask::new(keyword, biz);
            if let Some(t) = tenant {
                task = task.tenant(t);
            }
            enqueue(&mut conn, &task).unwrap();
        }
        db.exec("UPDATE async_task SET state = 'done' WHERE biz_id = '2'");
        db.exec("UPDATE async_task SET state = 'running', owner = 1 WHERE biz_id = '4'");
        let keyword = outbox::cancel::Filter::default().keyword("coupon.grant");
        assert_eq!(outbox::cancel::count_matching(&mut conn, &keyword).unwrap(), 3);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'cancelled'"), 0);
        let both = keyword.clone().tenant("acme");
        assert_eq!(cancel_matching(&mut conn, &both).unwrap(), 1, "task 1 only");
        assert_eq!(cancel_matching(&mut conn, &keyword).unwrap(), 2, "tasks 3 and 4");
        let states: Vec<String> = ["1", "2", "3", "4", "5"]
            .iter()
            .map(|b| db.count(&format!("SELECT count(*) FROM async_task WHERE biz_id = '{b}' AND state = 'cancelled'")).to_string())
            .collect();
        assert_eq!(states, ["1", "0", "1", "1", "0"], "done and other keywords untouched");
        let err = cancel_matching(&mut conn, &outbox::cancel::Filter::default()).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { setting: "filter", .. }), "{err}");
        let err = cancel_matching(&mut conn, &outbox::cancel::Filter::default().keyword("Bad!"))
            .unwrap_err();
        assert!(matches!(err, Error::InvalidKeyword { .. }), "{err}");
    }

    fn cancel_matching_counts_a_child_its_parents_cancel_reached_first(db: &TestDb) {
        // The root's child comes a thousand tasks later: past MySQL's first chunk of ids. It
        // matches the filter too, and is counted, as the dry run counts it, whichever cancel
        // reaches it first (its own, or its parent's cascade).
        let mut tasks: Vec<NewTask> = (0..1000).map(|i| NewTask::new("k", i.to_string())).collect();
        tasks.push(NewTask::new("k", "x").after_key("k", "0"));
        outbox::enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let filter = outbox::cancel::Filter::default().keyword("k");
        assert_eq!(outbox::cancel::count_matching(&mut db.conn(), &filter).unwrap(), 1001);
        assert_eq!(cancel_matching(&mut db.conn(), &filter).unwrap(), 1001);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'cancelled'"), 1001);
    }

    fn retry_brings_a_cancelled_or_dead_task_back_and_it_runs(db: &TestDb) {
        let cancelled = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let dead = enqueue(&mut db.conn(), &NewTask::new("ledger", "2")).unwrap().id;
        let pending = enqueue(&mut db.conn(), &NewTask::new("ledger", "3")).unwrap().id;
        cancel(&mut db.conn(), cancelled).unwrap();
        db.exec(&format!(
            "UPDATE async_task SET state = 'dead', failures = 5, last_error = 'boom' WHERE id = {dead}"
        ));
        for id in [cancelled, dead] {
            let r = retry(&mut db.conn(), id).unwrap();
            assert_eq!((r.id, r.retried, r.state), (id, true, TaskState::Pending));
        }
        assert_eq!((db.task(dead).failures, db.task(dead).state.as_str()), (0, "pending"));
        let again = retry(&mut db.conn(), pending).unwrap();
        assert_eq!((again.retried, again.state), (false, TaskState::Pending));
        let err = retry(&mut db.conn(), 999_999).unwrap_err();
        assert!(matches!(err, Error::TaskNotFound { ref task } if task == "999999"), "{err}");
        let w = Worker::new(&db.url, ledger_registry("ledger"), small_config()).unwrap();
        assert_eq!(w.drain().unwrap().tally.done, 3);
        assert_eq!((db.ledger_rows(cancelled), db.ledger_rows(dead)), (1, 1));
    }
}
