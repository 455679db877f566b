//! Several workers and a saturated pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::Duration;

use outbox::{
    enqueue_batch, Backend, HandlerResult, NewTask, Registry, Tally, TaskContext, TaskTx, Worker,
    WorkerConfig,
};

use crate::ledger_registry;

every_backend! {
    fn two_workers_draining_10000_tasks_never_run_a_task_twice(db: &TestDb) {
        let mut conn = db.conn();
        for chunk in 0..10 {
            let tasks: Vec<NewTask> = (0..1000)
                .map(|n| NewTask::new("ledger", format!("{chunk}-{n}")))
                .collect();
            enqueue_batch(&mut conn, &tasks).unwrap();
        }
        let config = WorkerConfig::default().threads(3).queue(3).page_size(50);
        let workers: Vec<Worker> = (0..2)
            .map(|_| Worker::new(&db.url, ledger_registry("ledger"), config.clone()).unwrap())
            .collect();
        let start = Barrier::new(2);
        let tallies: Vec<outbox::Tally> = std::thread::scope(|s| {
            let handles: Vec<_> = workers
                .iter()
                .map(|w| s.spawn(|| { start.wait(); w.drain().unwrap().tally }))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(tallies.iter().map(|t| t.done).sum::<u64>(), 10_000);
        assert!(tallies.iter().all(|t| t.claimed > 0), "both workers took part: {tallies:?}");
        assert!(tallies.iter().all(|t| t.lost == 0 && t.retried == 0 && t.released == 0));
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'done'"), 10_000);
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 10_000);
        assert_eq!(db.count("SELECT count(DISTINCT task_id) FROM test_ledger"), 10_000);
    }

    fn handlers_that_do_not_touch_the_database_run_side_by_side(db: &TestDb) {
        // Each handler waits (up to 10 s, then fails) until another one runs at the same
        // time. On SQLite, whose writers take turns, a handler that never opens its
        // transaction must not hold the turn.
        let meeting = Arc::new(Meeting::default());
        let mut registry = Registry::new();
        {
            let meeting = Arc::clone(&meeting);
            registry.register("external", move |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                meeting.wait_for_company(Duration::from_secs(10))
            });
        }
        let tasks: Vec<NewTask> = (0..4).map(|n| NewTask::new("external", n.to_string())).collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let config = WorkerConfig::default().threads(4).queue(4);
        let w = Worker::new(&db.url, registry, config).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!(tally.done, 4, "{tally:?}");
        assert!(meeting.most() >= 2, "at most {} handler(s) ran at once", meeting.most());
    }

    fn caller_runs_when_the_pool_is_saturated(db: &TestDb) {
        // One thread, no queue: the first task occupies the pool and blocks until a task runs
        // on the claiming thread itself, which can only happen through CallerRuns.
        let latch = Arc::new(Latch::default());
        let mut registry = Registry::new();
        registry.register("latch", move |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
            if on_pool_thread() {
                latch.wait(Duration::from_secs(60))
            } else {
                latch.release();
                Ok(())
            }
        });
        let tasks: Vec<NewTask> = (0..2).map(|n| NewTask::new("latch", n.to_string())).collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let config = WorkerConfig::default().threads(1).queue(0).page_size(10);
        let w = Worker::new(&db.url, registry, config).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!(tally.done, 2);
        assert_eq!(w.caller_runs(), 1);
    }

    fn no_caller_runs_while_the_pool_has_room(db: &TestDb) {
        let tasks: Vec<NewTask> = (0..5).map(|n| NewTask::new("ledger", n.to_string())).collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let config = WorkerConfig::default().threads(2).queue(3).page_size(10);
        let w = Worker::new(&db.url, ledger_registry("ledger"), config).unwrap();
        assert_eq!(w.run_once().unwrap().done, 5);
        assert_eq!(w.caller_runs(), 0);
    }

    fn the_claiming_thread_helps_with_the_queue_except_on_sqlite(db: &TestDb) {
        // Through `drain` (the claiming thread waits for room) and `run_once` (it waits for
        // its page to finish).
        for (phase, run) in [
            ("drain", (|w: &Worker| w.drain().unwrap().tally) as fn(&Worker) -> Tally),
            ("run_once", |w: &Worker| w.run_once().unwrap()),
        ] {
            let (tally, on_claimer, caller_runs, helped) =
                run_with_one_held_pool_thread(db, phase, run);
            assert_eq!(tally.done, 3, "{phase}: {tally:?}");
            // The queue had room: nothing ran through CallerRuns, so every task that ran on
            // the claiming thread is one it helped with, and the worker counts each.
            assert_eq!(caller_runs, 0, "{phase}");
            assert_eq!(helped, on_claimer as u64, "{phase}");
            match db.url.backend() {
                Backend::Postgres | Backend::Mysql => assert!(on_claimer >= 1, "{phase}: the claiming thread ran nothing"),
                // SQLite's writers take turns: a second thread running tasks would only wait.
                Backend::Sqlite => assert_eq!(on_claimer, 0, "{phase}"),
            }
        }
    }
}

/// Runs 3 tasks with one pool thread and a queue of 2. On PostgreSQL and MySQL the pool thread's
/// first task waits (up to 10 s, then fails) until a task has run on another thread, which
/// only the claiming thread can be. Returns the tally, the tasks run on the claiming thread,
/// and the worker's CallerRuns and helping counts.
fn run_with_one_held_pool_thread(
    db: &crate::support::TestDb,
    phase: &str,
    run: fn(&Worker) -> Tally,
) -> (Tally, usize, u64, u64) {
    let hold = db.url.backend() != Backend::Sqlite;
    let on_claimer = Arc::new(AtomicUsize::new(0));
    let (count, latch) = (Arc::clone(&on_claimer), Arc::new(Latch::default()));
    let mut registry = Registry::new();
    registry.register(
        "latch",
        move |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
            if !on_pool_thread() {
                count.fetch_add(1, Ordering::SeqCst);
                latch.release();
            } else if hold {
                latch.wait(Duration::from_secs(10))?;
            }
            Ok(())
        },
    );
    let tasks: Vec<NewTask> = (0..3)
        .map(|n| NewTask::new("latch", format!("{phase}-{n}")))
        .collect();
    enqueue_batch(&mut db.conn(), &tasks).unwrap();
    // Claiming 3 fills the pool (1 running, 2 queued: no CallerRuns), so `drain`'s next
    // claim waits for room with 2 queued for 1 thread: it helps there.
    let config = WorkerConfig::default().threads(1).queue(2).page_size(10);
    let w = Worker::new(&db.url, registry, config).unwrap();
    let tally = run(&w);
    (
        tally,
        on_claimer.load(Ordering::SeqCst),
        w.caller_runs(),
        w.caller_helped(),
    )
}

/// Whether the current thread is one of the execution pool's (not the claiming thread).
fn on_pool_thread() -> bool {
    std::thread::current()
        .name()
        .is_some_and(|n| n.starts_with("outbox-task-"))
}

/// Handlers running now, and the most that ran at once.
#[derive(Default)]
struct Meeting {
    running: Mutex<(usize, usize)>,
    changed: Condvar,
}

impl Meeting {
    /// Counts this handler in, waits until another one is running too (or `limit` passes,
    /// failing the task), counts it out.
    fn wait_for_company(&self, limit: Duration) -> HandlerResult {
        let mut guard = self.running.lock().unwrap();
        guard.0 += 1;
        guard.1 = guard.1.max(guard.0);
        self.changed.notify_all();
        let (mut guard, timeout) = self
            .changed
            .wait_timeout_while(guard, limit, |(_, most)| *most < 2)
            .unwrap();
        guard.0 -= 1;
        drop(guard);
        if timeout.timed_out() {
            return Err(anyhow::anyhow!("no other handler ran at the same time").into());
        }
        Ok(())
    }

    fn most(&self) -> usize {
        self.running.lock().unwrap().1
    }
}

/// Holds a task on a pool thread until a task runs on the claiming thread.
#[derive(Default)]
struct Latch {
    released: Mutex<bool>,
    signal: Condvar,
}

impl Latch {
    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.signal.notify_all();
    }

    /// Waits for [`Latch::release`]; fails the task after `limit`.
    fn wait(&self, limit: Duration) -> HandlerResult {
        let guard = self.released.lock().unwrap();
        let (guard, timeout) = self
            .signal
            .wait_timeout_while(guard, limit, |released| !*released)
            .unwrap();
        drop(guard);
        if timeout.timed_out() {
            return Err(anyhow::anyhow!("no task ran on the claiming thread").into());
        }
        Ok(())
    }
}
