//! Claims by lanes (with domains): a lane passed over for want of room is claimed for as soon
//! as it has room again, whatever the other lanes hold. Neither a domain whose handler blocks
//! nor one with nothing due holds up `default`'s backlog: not a `drain` (which waited for
//! every lane's tasks to finish), nor a `run` (which waited for its poll interval).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use outbox::domain::Domain;
use outbox::{enqueue_batch, HandlerResult, NewTask, TaskContext, TaskTx, Worker, WorkerConfig};

use crate::ledger_registry;
use crate::support::TestDb;

/// A gate a handler waits at until it is opened (60 s at most).
type Gate = Arc<(Mutex<bool>, Condvar)>;

fn open(gate: &Gate) {
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
}

/// `ledger` tasks, a `stuck` keyword whose handler waits at the gate, and an `idle` one.
fn registry(gate: &Gate) -> outbox::Registry {
    let mut registry = ledger_registry("ledger");
    let gate = Arc::clone(gate);
    registry.register(
        "stuck",
        move |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
            let (open, changed) = &*gate;
            let guard = open.lock().unwrap();
            let _open = changed
                .wait_timeout_while(guard, Duration::from_secs(60), |open| !*open)
                .unwrap();
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

/// Runs `work` on a thread while `default`'s backlog is worked through; returns how many of
/// the backlog were done within 20 s, then opens the gate, sets `stop` and waits for `work`.
fn paced(db: &TestDb, gate: &Gate, stop: &AtomicBool, work: impl FnOnce() + Send) -> i64 {
    std::thread::scope(|s| {
        let handle = s.spawn(work);
        let deadline = Instant::now() + Duration::from_secs(20);
        while db.count(DONE) < BACKLOG && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let paced = db.count(DONE);
        open(gate);
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
        paced
    })
}

every_backend! {
    fn a_drain_keeps_defaults_pace_beside_a_domain_whose_handler_blocks(db: &TestDb) {
        let gate: Gate = Arc::default();
        enqueue_batch(&mut db.conn(), &tasks("ledger", BACKLOG as usize)).unwrap();
        enqueue_batch(&mut db.conn(), &tasks("stuck", 1)).unwrap();
        let w = Worker::new(&db.url, registry(&gate), config()).unwrap();
        let report = Mutex::new(None);
        let drain = || *report.lock().unwrap() = Some(w.drain().unwrap());
        let paced = paced(db, &gate, &AtomicBool::new(false), drain);
        let report = report.into_inner().unwrap().unwrap();
        assert_eq!(
            paced, BACKLOG,
            "with `slow`'s handler blocked, the drain ran {paced} of default's {BACKLOG} tasks \
             in 20 s: {report:?}"
        );
        assert_eq!(report.tally.done, BACKLOG as u64 + 1, "{report:?}");
    }

    fn a_run_claims_defaults_backlog_as_room_comes_not_at_its_poll_interval(db: &TestDb) {
        let gate: Gate = Arc::default();
        enqueue_batch(&mut db.conn(), &tasks("ledger", BACKLOG as usize)).unwrap();
        let w = Worker::new(&db.url, registry(&gate), config()).unwrap();
        let report = Mutex::new(None);
        let run = || *report.lock().unwrap() = Some(w.run().unwrap());
        let paced = paced(db, &gate, &w.stop_flag(), run);
        let report = report.into_inner().unwrap().unwrap();
        assert_eq!(
            paced, BACKLOG,
            "beside two domains with nothing due, `run` ran {paced} of default's {BACKLOG} \
             tasks in 20 s (its poll interval is an hour): {report:?}"
        );
    }
}
