//! The task's transaction opens when the handler first asks for the connection. A handler
//! that never does runs outside any transaction and its completion is one fenced statement;
//! the outcomes (done, retried, lost) are the same either way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use diesel::connection::TransactionManager;
use diesel::Connection;
use outbox::{
    enqueue, enqueue_batch, DbConnection, HandlerResult, NewTask, Registry, TaskContext, TaskTx,
    Worker,
};

use crate::{worker, write_ledger};

/// How deep in transactions `conn` is (0: autocommit).
fn depth(conn: &mut DbConnection) -> u32 {
    <DbConnection as Connection>::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .expect("transaction status")
        .map_or(0, |d| d.get())
}

every_backend! {
    fn the_transaction_opens_on_first_use_and_commits_with_the_completion(db: &TestDb) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen_in = Arc::clone(&seen);
        let mut registry = Registry::new();
        registry.register("ledger", move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            let before = tx.is_open();
            let first = depth(tx.conn()?);
            let second = depth(tx.conn()?);
            seen_in.lock().unwrap().push((before, tx.is_open(), first, second));
            write_ledger(task, tx)
        });
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let w = worker(db, registry);
        assert_eq!(w.run_once().unwrap().done, 1);
        assert_eq!(*seen.lock().unwrap(), [(false, true, 1, 1)], "opened once, on first use");
        assert_eq!(db.ledger_rows(id), 1);
        assert_eq!(db.task(id).state, "done");
    }

    fn a_handler_that_never_opens_its_transaction_is_completed_fenced_all_the_same(db: &TestDb) {
        // An external-only handler: it records what it "sent" outside the database, and on
        // its first task the claim is taken over while it runs.
        let sent = Arc::new(AtomicUsize::new(0));
        let sent_in = Arc::clone(&sent);
        let url = db.url.clone();
        let mut registry = Registry::new();
        registry.register("mail.send", move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            assert!(!tx.is_open());
            sent_in.fetch_add(1, Ordering::SeqCst);
            if task.biz_id() == "taken" {
                crate::take_over(&url, task.id());
            }
            if task.biz_id() == "fails" {
                return Err(anyhow::anyhow!("smtp refused").into());
            }
            Ok(())
        });
        let mut conn = db.conn();
        let ok = enqueue(&mut conn, &NewTask::new("mail.send", "ok")).unwrap().id;
        let taken = enqueue(&mut conn, &NewTask::new("mail.send", "taken")).unwrap().id;
        let fails = enqueue(&mut conn, &NewTask::new("mail.send", "fails")).unwrap().id;
        let w = worker(db, registry);
        let tally = w.run_once().unwrap();
        assert_eq!((tally.done, tally.lost, tally.retried), (1, 1, 1), "{tally:?}");
        assert_eq!(sent.load(Ordering::SeqCst), 3);

        let row = db.task(ok);
        assert_eq!((row.state.as_str(), row.owner), ("done", Some(w.node_id())));
        assert_eq!(db.count(&format!("SELECT count(*) FROM async_task WHERE id = {ok} AND finished_at IS NOT NULL")), 1);
        // The fenced completion touched nothing of the task another node now holds.
        let row = db.task(taken);
        assert_eq!((row.state.as_str(), row.owner, row.failures), ("running", Some(999), 0));
        let row = db.task(fails);
        assert_eq!((row.state.as_str(), row.failures), ("pending", 1));
        assert!(row.last_error.unwrap().contains("smtp refused"));
    }

    fn a_chunk_of_external_handlers_is_completed_by_one_statement_or_rerun(db: &TestDb) {
        // Batched mode with handlers that never open the transaction: the chunk's completion
        // runs alone. When one handler fails, the chunk is re-run task by task, so the
        // external effects of the others happen twice (at-least-once, as documented).
        let calls = Arc::new(AtomicUsize::new(0));
        let calls_in = Arc::clone(&calls);
        let mut registry = Registry::new();
        registry.register("mail.send", move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            assert!(!tx.is_open());
            calls_in.fetch_add(1, Ordering::SeqCst);
            if task.biz_id() == "3" && task.attempt() == 1 {
                return Err(anyhow::anyhow!("refused").into());
            }
            Ok(())
        });
        let tasks: Vec<NewTask> = (1..=5).map(|n| NewTask::new("mail.send", n.to_string())).collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let config = crate::small_config().commit_batch(5).page_size(5);
        let w = Worker::new(&db.url, registry.clone(), config.clone()).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!((tally.done, tally.retried), (4, 1), "{tally:?}");
        // The chunk stops at its failing third task, then all five run alone.
        assert_eq!(calls.load(Ordering::SeqCst), 3 + 5);

        // Without a failure, one pass and every task done.
        calls.store(0, Ordering::SeqCst);
        let tasks: Vec<NewTask> = (6..=10).map(|n| NewTask::new("mail.send", n.to_string())).collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!(tally.done, 5, "{tally:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'done'"), 9);
    }
}

every_backend! {
    fn a_lost_claim_in_a_chunk_of_external_handlers_completes_none_of_it_at_first(db: &TestDb) {
        // No handler opens the transaction; the third task's claim is taken over while it
        // runs. The chunk's completion must still be all or nothing: none of the five marked
        // done by it, then the four still held are completed one by one, the fifth is lost.
        let calls = Arc::new(AtomicUsize::new(0));
        let calls_in = Arc::clone(&calls);
        let taken = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let url = db.url.clone();
        let mut registry = Registry::new();
        registry.register("mail.send", move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            assert!(!tx.is_open());
            calls_in.fetch_add(1, Ordering::SeqCst);
            if task.biz_id() == "3" && !taken.swap(true, Ordering::SeqCst) {
                crate::take_over(&url, task.id());
            }
            Ok(())
        });
        let tasks: Vec<NewTask> = (1..=5).map(|n| NewTask::new("mail.send", n.to_string())).collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let config = crate::small_config().commit_batch(5).page_size(5);
        let w = Worker::new(&db.url, registry, config).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!((tally.done, tally.lost), (4, 1), "{tally:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 5 + 4, "the chunk, then each task still held alone");
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'done'"), 4);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'running' AND owner = 999"), 1);
    }
}
