//! Claims by lanes (with domains): a lane passed over for want of room is claimed for as soon
//! as it has room again, whatever the other lanes hold. Neither a domain whose handler blocks
//! nor one with nothing due holds up `default`'s backlog: not a `drain` (which waited for
//! every lane's tasks to finish), nor a `run` (which waited for its poll interval).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use outbox::domain::Domain;
use outbox::{
    enqueue, enqueue_batch, Backend, ClaimStyle, HandlerResult, NewTask, Tally, TaskContext,
    TaskTx, Worker, WorkerConfig,
};

use crate::ledger_registry;
use crate::support::TestDb;

/// A gate a handler waits at until it is opened (60 s at most), and how many came to it.
pub(crate) type Gate = Arc<(Mutex<GateState>, Condvar)>;

#[derive(Debug, Default)]
pub(crate) struct GateState {
    open: bool,
    entered: usize,
}

pub(crate) fn open(gate: &Gate) {
    gate.0.lock().unwrap().open = true;
    gate.1.notify_all();
}

/// Waits until `n` handlers came to the gate (20 s at most); whether they did.
fn entered(gate: &Gate, n: usize) -> bool {
    let (state, changed) = &**gate;
    let state = state.lock().unwrap();
    let (state, _) = changed
        .wait_timeout_while(state, Duration::from_secs(20), |g| g.entered < n)
        .unwrap();
    state.entered >= n
}

/// `ledger` tasks, a `stuck` keyword whose handler waits at the gate, a `first` one whose
/// handler enqueues a `ledger` task in its transaction after half a second, and an `idle`
/// one.
pub(crate) fn registry(gate: &Gate) -> outbox::Registry {
    let mut registry = ledger_registry("ledger");
    let gate = Arc::clone(gate);
    registry.register(
        "stuck",
        move |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
            let (state, changed) = &*gate;
            let mut guard = state.lock().unwrap();
            guard.entered += 1;
            changed.notify_all();
            let _open = changed
                .wait_timeout_while(guard, Duration::from_secs(60), |g| !g.open)
                .unwrap();
            Ok(())
        },
    );
    registry.register(
        "first",
        |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            // Long enough for the drain's next claim to come back empty while it runs.
            std::thread::sleep(Duration::from_millis(500));
            enqueue(tx.conn()?, &NewTask::new("ledger", task.biz_id()))?;
            Ok(())
        },
    );
    registry.register("idle", |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
        Ok(())
    });
    registry
}

fn tasks(keyword: &str, n: usize) -> Vec<NewTask> {
    (0..n)
        .map(|i| NewTask::new(keyword, format!("{keyword}-{i}")))
        .collect()
}

/// Two threads and short queues, so that `default`'s lane is often without room; a domain
/// `slow` of the `stuck` keyword and a domain `other` of the `idle` one, each of one task;
/// a poll interval of an hour and no `NOTIFY`, so that only room can wake a `run`.
fn config() -> WorkerConfig {
    WorkerConfig::default()
        .threads(2)
        .queue(2)
        .page_size(50)
        .listen(false)
        .poll_interval(Duration::from_secs(3600))
        .domain(Domain::max("slow", ["stuck"], 1))
        .domain(Domain::max("other", ["idle"], 1))
}

const BACKLOG: i64 = 300;
const DONE: &str = "SELECT count(*) FROM async_task WHERE keyword = 'ledger' AND state = 'done'";

/// Runs `work` on a thread while `want` of `default`'s `ledger` tasks are worked through;
/// returns how many were done within 20 s, then opens the gate, sets `stop` and waits for
/// `work`.
fn paced(
    db: &TestDb,
    gate: &Gate,
    stop: &AtomicBool,
    want: i64,
    work: impl FnOnce() + Send,
) -> i64 {
    std::thread::scope(|s| {
        let handle = s.spawn(work);
        let deadline = Instant::now() + Duration::from_secs(20);
        while db.count(DONE) < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let paced = db.count(DONE);
        open(gate);
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
        paced
    })
}

/// The claim styles to try: strict, with a queue and without; batched with stamp claims; and, on the servers, batched
/// with lock claims (chunks leased lane by lane, no queue). Each on a table emptied first.
fn styles(db: &TestDb) -> Vec<(&'static str, WorkerConfig)> {
    let mut styles = vec![
        ("strict", config()),
        ("strict, no queue", config().queue(0)),
        (
            "batched stamp",
            config().commit_batch(5).claim_style(ClaimStyle::Stamp),
        ),
    ];
    if db.backend() != Backend::Sqlite {
        styles.push((
            "batched lock",
            config()
                .commit_batch(5)
                .claim_style(ClaimStyle::Lock)
                .queue(0),
        ));
    }
    styles
}

/// Works with `config`, through `work` (`drain`, or `run` until stopped), through `default`'s
/// backlog beside a blocked `stuck` task; returns how many of the backlog were done within
/// 20 s, and `work`'s report.
fn backlog_paced(
    db: &TestDb,
    config: WorkerConfig,
    work: fn(&Worker) -> outbox::Result<outbox::Report>,
) -> (i64, outbox::Report) {
    db.exec("DELETE FROM async_task");
    let gate: Gate = Arc::default();
    enqueue_batch(&mut db.conn(), &tasks("ledger", BACKLOG as usize)).unwrap();
    enqueue_batch(&mut db.conn(), &tasks("stuck", 1)).unwrap();
    let w = Worker::new(&db.url, registry(&gate), config).unwrap();
    let report = Mutex::new(None);
    let paced = paced(db, &gate, &w.stop_flag(), BACKLOG, || {
        *report.lock().unwrap() = Some(work(&w).unwrap());
    });
    (paced, report.into_inner().unwrap().unwrap())
}

/// Drains with `config` a `first` task and a blocked `stuck` one; returns whether the
/// `ledger` task `first` enqueues was done within 20 s, and the drain's report.
fn follow_up_within(db: &TestDb, config: WorkerConfig) -> (i64, outbox::Report) {
    db.exec("DELETE FROM async_task");
    let gate: Gate = Arc::default();
    enqueue_batch(&mut db.conn(), &tasks("first", 1)).unwrap();
    enqueue_batch(&mut db.conn(), &tasks("stuck", 1)).unwrap();
    let w = Worker::new(&db.url, registry(&gate), config).unwrap();
    let report = Mutex::new(None);
    let drain = || *report.lock().unwrap() = Some(w.drain().unwrap());
    let followed = paced(db, &gate, &AtomicBool::new(false), 1, drain);
    (followed, report.into_inner().unwrap().unwrap())
}

every_backend! {
    fn a_drain_keeps_defaults_pace_beside_a_domain_whose_handler_blocks(db: &TestDb) {
        for (style, config) in styles(db) {
            let (paced, report) = backlog_paced(db, config, Worker::drain);
            assert_eq!(
                paced, BACKLOG,
                "{style}: with `slow`'s handler blocked, the drain ran {paced} of default's \
                 {BACKLOG} tasks in 20 s: {report:?}"
            );
            assert_eq!(report.tally.done, BACKLOG as u64 + 1, "{style}: {report:?}");
        }
    }

    fn a_drain_runs_what_its_tasks_make_due_beside_a_domain_whose_handler_blocks(db: &TestDb) {
        for (style, config) in styles(db) {
            // Four threads: `default` keeps room worth a claim while `first` runs, so that
            // its empty claim does not leave it passed over.
            let (followed, report) = follow_up_within(db, config.threads(4));
            assert_eq!(
                followed, 1,
                "{style}: with `slow`'s handler blocked, the drain did not run within 20 s the \
                 `ledger` task `first` enqueued: {report:?}"
            );
            assert_eq!(report.tally.done, 3, "{style}: {report:?}");
        }
    }

    fn a_drain_runs_what_a_blocked_domains_other_task_makes_due(db: &TestDb) {
        // `slow` runs the blocked task and `first`, whose follow-up is `default`'s; once
        // `first` ends, `slow` is neither idle nor worth a claim, and `default` was idle
        // all along.
        let config = WorkerConfig::default()
            .threads(4)
            .queue(0)
            .domain(Domain::max("slow", ["stuck", "first"], 2));
        let (followed, report) = follow_up_within(db, config);
        assert_eq!(
            followed, 1,
            "with `slow`'s other handler blocked, the drain did not run within 20 s the \
             `ledger` task `first` enqueued: {report:?}"
        );
        assert_eq!(report.tally.done, 3, "{report:?}");
    }

    fn a_run_claims_defaults_backlog_as_room_comes_not_at_its_poll_interval(db: &TestDb) {
        for (style, config) in styles(db) {
            let (paced, report) = backlog_paced(db, config, Worker::run);
            assert_eq!(
                paced, BACKLOG,
                "{style}: beside a blocked domain and one with nothing due, `run` ran {paced} of \
                 default's {BACKLOG} tasks in 20 s (its poll interval is an hour): {report:?}"
            );
        }
    }
}

/// Runs `work` on a thread until `n` tasks of `db` are running (claimed: `blocked` of them
/// blocked at the gate, the rest queued behind them), sets `stop`, and returns how many of
/// the `n - blocked` queued were released, uncharged, within 10 s while the handlers still
/// blocked; then opens the gate and returns `work`'s result too.
fn released_at_stop<R: Send>(
    db: &TestDb,
    gate: &Gate,
    stop: &AtomicBool,
    (n, blocked): (i64, usize),
    work: impl FnOnce() -> R + Send,
) -> (i64, R) {
    let counts = (n, blocked, n - blocked as i64);
    released_at(
        db,
        gate,
        || stop.store(true, Ordering::Relaxed),
        counts,
        work,
    )
}

/// As [`released_at_stop`], with `hold` (a stop, a pause) in place of the stop, and `queued`
/// of the `n` tasks waiting to be given back.
fn released_at<R: Send>(
    db: &TestDb,
    gate: &Gate,
    hold: impl FnOnce(),
    (n, blocked, queued): (i64, usize, i64),
    work: impl FnOnce() -> R + Send,
) -> (i64, R) {
    let running = "SELECT count(*) FROM async_task WHERE state = 'running'";
    let released = "SELECT count(*) FROM async_task WHERE state = 'pending' AND failures = 0";
    std::thread::scope(|s| {
        let handle = s.spawn(work);
        let deadline = Instant::now() + Duration::from_secs(20);
        while db.count(running) < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(db.count(running), n, "not all claimed");
        // The blocked handlers run: the stop comes while they block, not before they start.
        assert!(
            entered(gate, blocked),
            "the blocking handlers never started"
        );
        hold();
        let deadline = Instant::now() + Duration::from_secs(10);
        while db.count(released) < queued && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let now_released = db.count(released);
        open(gate);
        (now_released, handle.join().unwrap())
    })
}

/// `slow` runs one task at a time and queues 8 more (its queue's default): of 9 `stuck`
/// tasks worked through `work`, the first blocks, and the 8 wait for its slot. Asserts that a
/// stop releases them at once, not when the blocked handler returns (nor, after the process's
/// exit, through rescue's charge).
fn a_stop_releases_what_waits_behind_slow(db: &TestDb, work: impl FnOnce(&Worker) -> Tally + Send) {
    let gate: Gate = Arc::default();
    enqueue_batch(&mut db.conn(), &tasks("stuck", 9)).unwrap();
    let w = Worker::new(&db.url, registry(&gate), config()).unwrap();
    let (released, tally) = released_at_stop(db, &gate, &w.stop_flag(), (9, 1), || work(&w));
    assert_eq!(
        released, 8,
        "10 s after the stop, with `slow`'s handler still blocked, {released} of the 8 tasks \
         queued behind it were released: {tally:?}"
    );
    assert_eq!(tally.released, 8, "{tally:?}");
}

every_backend! {
    fn a_stop_releases_what_waits_behind_a_domain_whose_handler_blocks_uncharged(db: &TestDb) {
        a_stop_releases_what_waits_behind_slow(db, |w| w.run().unwrap().tally);
    }

    fn a_stop_during_run_once_releases_what_waits_behind_a_blocked_domain(db: &TestDb) {
        // Its claim has returned before the stop: its queued tasks wait for the pool, which
        // the blocked handler holds.
        a_stop_releases_what_waits_behind_slow(db, |w| w.run_once().unwrap());
    }

    fn a_fleets_stop_releases_what_waits_behind_a_database_whose_handler_blocks(db: &TestDb) {
        // Two databases on 2 threads and a queue of 8: each its thread and 4 queued. The
        // first's 5 tasks all block on one handler: 1 runs, 4 wait for its slot.
        let other = crate::shards::another(db);
        let gate: Gate = Arc::default();
        enqueue_batch(&mut db.conn(), &tasks("stuck", 5)).unwrap();
        let config = WorkerConfig::default()
            .threads(2)
            .queue(8)
            .listen(false)
            .poll_interval(Duration::from_millis(50));
        let urls = [db.url.clone(), other.url.clone()];
        let fleet = outbox::Fleet::new(&urls, registry(&gate), config).unwrap();
        let (released, reports) = released_at_stop(db, &gate, &fleet.stop_flag(), (5, 1), || fleet.run());
        assert_eq!(
            released, 4,
            "10 s after the stop, with the first database's handler still blocked, {released} \
             of the 4 tasks queued behind it were released"
        );
        let report = reports.into_iter().next().unwrap().result.unwrap();
        assert_eq!(report.tally.released, 4, "{report:?}");
    }
    fn a_stop_releases_what_waits_while_the_claiming_thread_runs_a_handler_itself(db: &TestDb) {
        // One thread and a queue of two: a claim of four runs one on the thread, queues two
        // and runs the fourth on the claiming thread (CallerRuns). Both handlers block; a stop
        // releases the two queued at once, not when a handler returns (nor, after the
        // process's exit, through rescue's charge: they never started).
        let gate: Gate = Arc::default();
        enqueue_batch(&mut db.conn(), &tasks("stuck", 4)).unwrap();
        let w = Worker::new(&db.url, registry(&gate), one_thread(2)).unwrap();
        let (released, report) = released_at_stop(db, &gate, &w.stop_flag(), (4, 2), || w.run());
        let report = report.unwrap();
        assert_eq!(w.caller_runs(), 1, "the claiming thread ran no handler: {report:?}");
        assert_eq!(
            released, 2,
            "10 s after the stop, with both handlers still blocked, {released} of the 2 tasks \
             queued behind them were released: {report:?}"
        );
        assert_eq!(report.tally.released, 2, "{report:?}");
    }
}

/// One thread and a queue of `queue`, no domain; a poll interval of an hour and no `NOTIFY`.
fn one_thread(queue: usize) -> WorkerConfig {
    WorkerConfig::default()
        .threads(1)
        .queue(queue)
        .listen(false)
        .poll_interval(Duration::from_secs(3600))
}

/// Pauses the domain `slow` as an operator does, and has `w` apply it (as its heartbeat does).
fn pause_slow(db: &TestDb, w: &Worker) {
    db.exec("INSERT INTO async_domain (name, paused, updated_by) VALUES ('slow', true, 't')");
    w.heartbeat_once().unwrap();
}

every_backend! {
    fn a_pause_gives_back_what_waits_behind_a_domain_whose_handler_blocks(db: &TestDb) {
        // As at a stop: of 9 `stuck` tasks of `slow`, one blocks and 8 wait for its slot. A
        // pause gives the 8 back at once, uncharged, and none of their handlers starts, not
        // even once the blocked one returns; the blocked one finishes.
        let gate: Gate = Arc::default();
        enqueue_batch(&mut db.conn(), &tasks("stuck", 9)).unwrap();
        let w = Worker::new(&db.url, registry(&gate), config()).unwrap();
        let (released, tally) =
            released_at(db, &gate, || pause_slow(db, &w), (9, 1, 8), || w.run_once().unwrap());
        assert_eq!(
            released, 8,
            "10 s after the pause, with `slow`'s handler still blocked, {released} of the 8 \
             tasks queued behind it were given back: {tally:?}"
        );
        assert_eq!((tally.done, tally.released), (1, 8), "{tally:?}");
        assert_eq!(gate.0.lock().unwrap().entered, 1, "a handler started after the pause");
    }

    fn a_pause_gives_back_the_chunks_that_wait_behind_a_domain_whose_handler_blocks(db: &TestDb) {
        // Batched, stamped chunks of 2: of 10 `stuck` tasks, the first chunk's first handler
        // blocks (its second task waits in the chunk) and 4 chunks wait for its slot.
        let gate: Gate = Arc::default();
        enqueue_batch(&mut db.conn(), &tasks("stuck", 10)).unwrap();
        let config = config().commit_batch(2).claim_style(ClaimStyle::Stamp);
        let w = Worker::new(&db.url, registry(&gate), config).unwrap();
        let (released, tally) =
            released_at(db, &gate, || pause_slow(db, &w), (10, 1, 8), || w.run_once().unwrap());
        assert_eq!(
            released, 8,
            "10 s after the pause, {released} of the 8 tasks queued in chunks were given \
             back: {tally:?}"
        );
        assert_eq!(tally.released, 8, "{tally:?}");
        assert_eq!(gate.0.lock().unwrap().entered, 2, "the blocked chunk's two handlers only");
    }

    fn a_keyword_paused_on_its_own_has_what_waits_given_back_when_its_turn_comes(db: &TestDb) {
        // No domain: one thread and a queue of 4. The first `stuck` handler blocks (on
        // PostgreSQL the claiming thread, which helps, may start a second); the keyword is
        // paused, the gate opened: the queued ones are given back as their turn comes.
        let gate: Gate = Arc::default();
        enqueue_batch(&mut db.conn(), &tasks("stuck", 5)).unwrap();
        let w = Worker::new(&db.url, registry(&gate), one_thread(4)).unwrap();
        let tally = std::thread::scope(|s| {
            let run = s.spawn(|| w.run_once().unwrap());
            assert!(entered(&gate, 1), "the first handler never started");
            db.exec("INSERT INTO async_pause (keyword, paused_by) VALUES ('stuck', 't')");
            w.heartbeat_once().unwrap();
            open(&gate);
            run.join().unwrap()
        });
        let started = gate.0.lock().unwrap().entered as u64;
        assert!(started <= 2, "{started} handlers started: {tally:?}");
        assert_eq!((tally.done, tally.released), (started, 5 - started), "{tally:?}");
        let given_back = "SELECT count(*) FROM async_task WHERE state = 'pending' AND failures = 0";
        assert_eq!(db.count(given_back), 5 - started as i64);
    }
}
