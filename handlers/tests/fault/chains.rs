//! Parent → child chains while workers are killed.
//!
//! Three-level chains (a root, a child after it, a grandchild after the child) of
//! `fault.ledger` tasks, run by three `run` workers of which one is killed (SIGKILL) every
//! few hundred milliseconds and replaced. Besides the suite's invariants (every task done,
//! exactly one ledger row each), every ledger row says how many parents of its task were not
//! done when its handler ran, in the handler's own transaction: none may say more than 0.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use outbox::{Backend, NewTask};
use serde_json::json;

use crate::db::{fault_db, wait_until_finished};
use crate::invariants::check_and_publish;
use crate::report::{secs, Report};
use crate::scenario::{stop_all, Proc, Scenario};
use crate::{by_profile, work_limit, POLL};

/// `chains` three-level chains, level by level in each batch so that every parent is
/// enqueued before its child.
fn chains(chains: usize, sleep_ms: u64) -> Vec<NewTask> {
    let task = |level: &str, n: usize| {
        NewTask::new("fault.ledger", format!("{level}-{n}"))
            .payload(&json!({ "sleep_ms": sleep_ms }))
            .max_attempts(20)
    };
    let mut tasks = Vec::with_capacity(chains * 3);
    for n in 0..chains {
        tasks.push(task("root", n));
        tasks.push(task("child", n).after_key("fault.ledger", format!("root-{n}")));
        tasks.push(task("grandchild", n).after_key("fault.ledger", format!("child-{n}")));
    }
    tasks
}

#[test]
fn chains_of_three_with_kills() {
    chains_with_kills(Backend::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn chains_of_three_with_kills_mysql() {
    chains_with_kills(Backend::Mysql);
}

fn chains_with_kills(backend: Backend) {
    let sc = Scenario::start("chains_of_three_with_kills", backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    let count = 1_000;
    let sleep_ms = by_profile(10, 20);
    let target_kills = by_profile(6, 20);
    db.enqueue(&chains(count, sleep_ms));
    let blocked_at_start = db.in_state("blocked");

    let args = sc.worker_args("run", &[("--threads", "4")]);
    let mut spawned = 0;
    let mut spawn = |sc: &Scenario| {
        spawned += 1;
        sc.spawn(&format!("worker{spawned}"), &url, &args)
    };
    let mut workers: Vec<Proc> = (0..3).map(|_| spawn(&sc)).collect();
    let mut killed: Vec<Proc> = Vec::new();
    let started = Instant::now();
    let mut blocked_seen = Vec::new();
    while killed.len() < target_kills {
        let until = Instant::now() + Duration::from_millis(fastrand::u64(200..=400));
        while Instant::now() < until {
            std::thread::sleep(POLL);
        }
        assert!(
            db.unfinished() > 0,
            "the chains ran out after {} of {target_kills} kills: raise sleep_ms",
            killed.len()
        );
        blocked_seen.push(db.in_state("blocked"));
        let slot = fastrand::usize(..workers.len());
        let status = workers[slot].kill9();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
        let victim = std::mem::replace(&mut workers[slot], spawn(&sc));
        killed.push(victim);
    }
    let tail = wait_until_finished(&db, work_limit(), || {
        for worker in &mut workers {
            worker.assert_running("while finishing");
        }
    });
    let total = started.elapsed();
    stop_all(&mut workers);

    let mut report = Report::new();
    report.add(
        "chains",
        format!("{count} root → child → grandchild of fault.ledger (sleep_ms {sleep_ms})"),
    );
    report.add(
        "processes",
        format!(
            "3 run workers (4 threads), {} SIGKILLs and restarts",
            killed.len()
        ),
    );
    report.add(
        "blocked tasks",
        format!(
            "{blocked_at_start} at the start; at each kill {:?}",
            blocked_seen
        ),
    );
    report.add(
        "ran before a parent was done",
        db.count("SELECT count(*) FROM fault_ledger WHERE early > 0"),
    );
    report.add(
        "rescued (a failure counted)",
        db.count("SELECT count(*) FROM async_task WHERE failures > 0"),
    );
    report.add(
        "drain time",
        format!("{} ({} after the last kill)", secs(total), secs(tail)),
    );
    check_and_publish(&sc, &db, report, true);
    assert_eq!(
        blocked_at_start,
        2 * count as i64,
        "every child and grandchild starts blocked"
    );
    assert_eq!(
        db.in_state("done"),
        3 * count as i64,
        "every task of every chain ran"
    );
}
