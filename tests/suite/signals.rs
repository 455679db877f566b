//! `run_until_stopped` and `drain_until_stopped` in a process that calls them more than once,
//! as an embedding program may: each call stops gracefully at its first SIGTERM.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::TestDb;

/// Waits until `needle` has been logged `times` times in all.
fn wait_for_log(needle: &str, times: usize) {
    let give_up = Instant::now() + Duration::from_secs(20);
    while crate::logs::containing(needle).len() < times {
        assert!(Instant::now() < give_up, "never logged {times}× {needle:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The stop signal is the process's: the tests that send one take turns, or a second signal
/// would find the flag of the first still set and exit the test process.
static ONE_SIGNAL_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn sigterm_self() {
    let status = Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

/// Two workers run one after the other in this process, each until a SIGTERM: the second
/// stops gracefully too (its handlers were once bound to the first worker's stop flag, so the
/// second signal found a flag already set and exited the process).
#[test]
fn each_call_stops_gracefully_at_its_own_first_signal() {
    let _turn = ONE_SIGNAL_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    crate::logs::start();
    let db = &TestDb::sqlite();
    let working = "SIGINT or SIGTERM stops it";
    let before = crate::logs::containing(working).len();
    for n in 1..=2 {
        let worker = crate::worker(db, crate::ledger_registry("ledger"));
        let node = worker.node_id();
        let run = std::thread::spawn(move || worker.run_until_stopped(Duration::from_secs(5)));
        // The handlers are installed before this line is logged.
        wait_for_log(working, before + n);
        sigterm_self();
        let report = run
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("run {n}: {e}"));
        assert_eq!(report.tally.claimed, 0, "run {n}");
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) FROM async_node WHERE id = {node} AND state = 'gone'"
            )),
            1,
            "run {n} marked its node gone"
        );
    }
}

/// Two workers running at once in this process (two databases, say) both stop gracefully at
/// one SIGTERM.
#[test]
fn workers_running_at_once_all_stop_at_one_signal() {
    let _turn = ONE_SIGNAL_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    crate::logs::start();
    let (a, b) = (&TestDb::sqlite(), &TestDb::sqlite());
    let working = "SIGINT or SIGTERM stops it";
    let before = crate::logs::containing(working).len();
    let (done, finished) = std::sync::mpsc::channel();
    for db in [a, b] {
        let worker = crate::worker(db, crate::ledger_registry("ledger"));
        let done = done.clone();
        std::thread::spawn(move || {
            let _ = done.send(
                worker
                    .run_until_stopped(Duration::from_secs(5))
                    .map(|r| r.tally),
            );
        });
    }
    wait_for_log(working, before + 2);
    sigterm_self();
    for n in 1..=2 {
        let tally = finished
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("worker {n} did not stop at the signal"));
        assert!(tally.is_ok(), "worker {n}: {tally:?}");
    }
}
