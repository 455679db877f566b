//! Recording an outcome on its own (a failure, a release): retried through an outage until
//! the task's deadline, and a write fenced out by the task's own completion counted as done.

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use outbox::{
    enqueue, Backend, DatabaseUrl, HandlerResult, NewTask, Registry, TaskContext, TaskTx,
};

use crate::rescue::quiet_worker;
use crate::small_config;
use crate::support::TestDb;

/// Makes every UPDATE of `async_task` fail, as a database in an outage would, with the error
/// `simulated outage {tag}`.
fn start_outage(url: &DatabaseUrl, tag: &str) {
    let sql = match url.backend() {
        Backend::Postgres => format!(
            "CREATE FUNCTION test_outage() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RAISE EXCEPTION 'simulated outage {tag}'; END $$;
             CREATE TRIGGER test_outage BEFORE UPDATE ON async_task
                 FOR EACH ROW EXECUTE FUNCTION test_outage();"
        ),
        Backend::Mysql => format!(
            "CREATE TRIGGER test_outage BEFORE UPDATE ON async_task FOR EACH ROW
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'simulated outage {tag}'"
        ),
        Backend::Sqlite => format!(
            "CREATE TRIGGER test_outage BEFORE UPDATE ON async_task
             BEGIN SELECT RAISE(ABORT, 'simulated outage {tag}'); END;"
        ),
    };
    url.connect().unwrap().batch_execute(&sql).unwrap();
}

/// Ends the outage, if it has started.
fn end_outage(db: &TestDb) {
    match db.backend() {
        Backend::Postgres => db.exec("DROP TRIGGER IF EXISTS test_outage ON async_task"),
        Backend::Sqlite | Backend::Mysql => db.exec("DROP TRIGGER IF EXISTS test_outage"),
    }
}

every_backend! {
    fn a_failure_is_recorded_after_an_outage_that_outlasts_many_attempts(db: &TestDb) {
        crate::logs::start();
        let id = enqueue(&mut db.conn(), &NewTask::new("flaky", "1")).unwrap().id;
        // The log is the process's, shared with this test's other backends (whose task ids
        // are the same): the outage's error names this backend's run.
        let tag = db.backend().name();
        let mut registry = Registry::new();
        {
            let url = db.url.clone();
            registry.register("flaky", move |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                // The database goes away while the handler fails.
                start_outage(&url, tag);
                Err(anyhow::anyhow!("downstream refused").into())
            });
        }
        // The write is retried until the task's deadline: two minutes, so that a run where
        // the outage does not end in time fails (the failure abandoned) instead of hanging.
        let config = small_config()
            .heartbeat(Duration::from_secs(3600))
            .dead_after(Duration::from_secs(7200))
            .task_timeout(Duration::from_secs(120));
        let w = outbox::Worker::new(&db.url, registry, config).unwrap();
        // The outage ends once the worker has tried to record the failure six times (a
        // minute's grace for a loaded machine, well within the deadline).
        let tally = std::thread::scope(|s| {
            let ender = s.spawn(|| {
                let sixth = format!("task {id}: task fail failed (attempt 6)");
                let give_up = Instant::now() + Duration::from_secs(60);
                let outage = format!("simulated outage {tag}");
                while !crate::logs::containing(&sixth).iter().any(|l| l.contains(&outage))
                    && Instant::now() < give_up
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                end_outage(db);
            });
            let tally = w.run_once().unwrap();
            ender.join().unwrap();
            tally
        });
        assert_eq!((tally.retried, tally.abandoned), (1, 0), "{tally:?}");
        let row = db.task(id);
        assert_eq!((row.state.as_str(), row.failures), ("pending", 1));
        assert!(row.last_error.unwrap().contains("downstream refused"));
    }

    fn a_write_that_finds_the_task_done_under_its_own_claim_counts_it_done(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let w = quiet_worker(db);
        let page = w.claim().unwrap();
        // The completion committed, but its reply was lost with the connection: the worker
        // then releases the task, and the release finds it done under this very claim.
        db.exec(&format!("UPDATE async_task SET state = 'done' WHERE id = {id}"));
        w.stop_flag().store(true, std::sync::atomic::Ordering::Relaxed);
        let tally = w.execute(page);
        assert_eq!((tally.done, tally.lost, tally.released), (1, 0, 0), "{tally:?}");
        assert_eq!(db.task(id).state, "done");
    }

    fn a_write_fenced_out_by_another_claim_is_lost(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let w = quiet_worker(db);
        let page = w.claim().unwrap();
        // Another node took it over and finished it.
        crate::take_over(&db.url, id);
        db.exec(&format!("UPDATE async_task SET state = 'done' WHERE id = {id}"));
        w.stop_flag().store(true, std::sync::atomic::Ordering::Relaxed);
        let tally = w.execute(page);
        assert_eq!((tally.done, tally.lost), (0, 1), "{tally:?}");
    }
}
