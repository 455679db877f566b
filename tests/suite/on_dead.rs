//! The dead-task hook (`WorkerConfig::on_dead`): run with the task in its environment,
//! never its payload; killed past its timeout; its failure logged; never in the worker's way.

use std::path::Path;
use std::time::{Duration, Instant};

use outbox::{HandlerError, NewTask, Registry, TaskContext, TaskTx, Worker, WorkerConfig};

use crate::support::TestDb;
use crate::{logs, small_config, write_ledger};

/// "ledger" writes its row; "doomed" fails for good.
fn registry() -> Registry {
    let mut registry = Registry::new();
    registry.register("ledger", write_ledger);
    registry.register("doomed", |_: &TaskContext, _: &mut TaskTx| {
        Err(HandlerError::permanent(anyhow::anyhow!("card declined")))
    });
    registry
}

/// A worker on `db` whose on-dead hook is `command`, killed after `timeout`.
fn hooked(db: &TestDb, command: String, timeout: Duration) -> Worker {
    let config: WorkerConfig = small_config().on_dead(command).on_dead_timeout(timeout);
    Worker::new(&db.url, registry(), config).unwrap()
}

/// Waits (at most 20 s) until `path` exists.
fn wait_for_file(path: &Path) {
    let give_up = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < give_up,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A shell word for `path`.
fn quoted(path: &Path) -> String {
    format!("'{}'", path.display())
}

every_backend! {
    fn the_hook_sees_the_task_in_its_environment_and_never_its_payload(db: &TestDb) {
        let dir = tempfile::tempdir().unwrap();
        let task = NewTask::new("doomed", "order-77")
            .tenant("acme")
            .payload_json(r#"{"card": "4111-SECRET"}"#);
        let id = outbox::enqueue(&mut db.conn(), &task).unwrap().id;
        let out = dir.path().join(format!("{id}.env"));
        // Written under another name first, so that the file appears whole.
        let command = format!(
            "env | grep ^OUTBOX_ | sort > {dir}/tmp.$OUTBOX_TASK_ID && mv {dir}/tmp.$OUTBOX_TASK_ID {dir}/$OUTBOX_TASK_ID.env",
            dir = quoted(dir.path())
        );
        let worker = hooked(db, command, Duration::from_secs(10));
        assert_eq!(worker.drain().unwrap().tally.dead, 1);
        wait_for_file(&out);
        let env = std::fs::read_to_string(&out).unwrap();
        for line in [
            format!("OUTBOX_TASK_ID={id}"),
            "OUTBOX_KEYWORD=doomed".to_owned(),
            "OUTBOX_BIZ_ID=order-77".to_owned(),
            "OUTBOX_TENANT=acme".to_owned(),
            "OUTBOX_ERROR=card declined".to_owned(),
        ] {
            assert!(env.lines().any(|l| l == line), "{line:?} not in\n{env}");
        }
        assert!(!env.contains("SECRET"), "the payload leaked:\n{env}");
    }

    fn a_hanging_hook_is_killed_after_its_timeout_and_the_worker_goes_on(db: &TestDb) {
        logs::start();
        let dir = tempfile::tempdir().unwrap();
        let doomed: Vec<NewTask> = (0..2).map(|i| NewTask::new("doomed", format!("hang-{i}"))).collect();
        let ids: Vec<i64> = outbox::enqueue_batch(&mut db.conn(), &doomed).unwrap().iter().map(|e| e.id).collect();
        // The hook notes it started, then hangs; it never gets to say it finished.
        let command = format!(
            "touch {dir}/$OUTBOX_TASK_ID.started; sleep 60; touch {dir}/$OUTBOX_TASK_ID.finished",
            dir = quoted(dir.path())
        );
        let worker = hooked(db, command, Duration::from_millis(300));
        let started = Instant::now();
        assert_eq!(worker.drain().unwrap().tally.dead, 2);
        // The first hook is hanging now; the worker still works.
        wait_for_file(&dir.path().join(format!("{}.started", ids[0])));
        let more: Vec<NewTask> = (0..5).map(|i| NewTask::new("ledger", format!("after-{i}"))).collect();
        outbox::enqueue_batch(&mut db.conn(), &more).unwrap();
        assert_eq!(worker.drain().unwrap().tally.done, 5);
        // Both hooks run in turn, each killed at its timeout.
        wait_for_file(&dir.path().join(format!("{}.started", ids[1])));
        let give_up = Instant::now() + Duration::from_secs(20);
        while logs::containing("the on-dead hook ran past its timeout").iter().filter(|l| {
            ids.iter().any(|id| l.contains(&format!("task {id}:")))
        }).count() < 2 {
            assert!(Instant::now() < give_up, "the hooks were not both killed");
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(worker);
        assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
        for id in &ids {
            assert!(!dir.path().join(format!("{id}.finished")).exists(), "task {id}'s hook was not killed");
        }
    }

    fn a_failing_hook_is_logged(db: &TestDb) {
        logs::start();
        let id = outbox::enqueue(&mut db.conn(), &NewTask::new("doomed", "exit-3")).unwrap().id;
        let worker = hooked(db, "exit 3".to_owned(), Duration::from_secs(10));
        assert_eq!(worker.drain().unwrap().tally.dead, 1);
        let needle = format!("task {id}: the on-dead hook failed: exit status: 3");
        let give_up = Instant::now() + Duration::from_secs(20);
        while logs::containing(&needle).is_empty() {
            assert!(Instant::now() < give_up, "no log line {needle:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(logs::containing(&needle)[0].starts_with("WARN "), "{:?}", logs::containing(&needle));
    }

    fn a_task_its_domains_timeout_makes_dead_runs_the_hook_and_counts_dead(db: &TestDb) {
        let dir = tempfile::tempdir().unwrap();
        let task = NewTask::new("stuck", "slow-1").max_attempts(1);
        let id = outbox::enqueue(&mut db.conn(), &task).unwrap().id;
        let mut registry = Registry::new();
        registry.register("stuck", |_: &TaskContext, _: &mut TaskTx| {
            // Busy in Rust past the domain's timeout, before touching the database.
            std::thread::sleep(Duration::from_millis(1500));
            Ok(())
        });
        let command = format!(
            "printf '%s' \"$OUTBOX_ERROR\" > {dir}/tmp && mv {dir}/tmp {dir}/$OUTBOX_TASK_ID.error",
            dir = quoted(dir.path())
        );
        let domain = outbox::domain::Domain::max("stuck", ["stuck"], 1).timeout(Duration::from_millis(200));
        let config = small_config()
            .domain(domain)
            .on_dead(command)
            .metrics_addr("127.0.0.1:0".parse().unwrap());
        let worker = Worker::new(&db.url, registry, config).unwrap();
        let tally = worker.run_once().unwrap();
        assert_eq!((tally.done, tally.dead), (0, 0), "its own late outcome is fenced out");
        assert_eq!(db.task(id).state, "dead");
        let out = dir.path().join(format!("{id}.error"));
        wait_for_file(&out);
        let error = std::fs::read_to_string(&out).unwrap();
        assert!(error.starts_with("timed out: its handler ran for"), "{error}");
        let e = crate::scrape::scrape(worker.metrics_addr().unwrap());
        let dead = e.value("outbox_tasks_finished_total", &[("keyword", "stuck"), ("outcome", "dead")]);
        assert_eq!(dead, Some(1.0));
    }

    fn a_task_rescued_to_dead_runs_the_hook(db: &TestDb) {
        let dir = tempfile::tempdir().unwrap();
        crate::rescue::enqueue_n(db, 1);
        let dying = crate::rescue::quiet_worker(db);
        let id = dying.claim().unwrap()[0].context.id();
        db.exec(&format!("UPDATE async_task SET max_attempts = 1 WHERE id = {id}"));
        crate::rescue::kill_heartbeat(db, dying.node_id());
        let command = format!(
            "printf '%s' \"$OUTBOX_ERROR\" > {dir}/tmp && mv {dir}/tmp {dir}/$OUTBOX_TASK_ID.error",
            dir = quoted(dir.path())
        );
        let config = small_config()
            .heartbeat(Duration::from_secs(3600))
            .dead_after(Duration::from_secs(7200))
            .on_dead(command);
        let survivor = Worker::new(&db.url, registry(), config).unwrap();
        assert_eq!(survivor.rescue_once().unwrap().dead, 1);
        let out = dir.path().join(format!("{id}.error"));
        wait_for_file(&out);
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            format!("rescued from node {}: the node stopped heartbeating", dying.node_id())
        );
    }
}
