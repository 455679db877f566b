//! SIGKILL during a run.
//!
//! With stamped claims a killed worker's running tasks are rescued by the live ones, each
//! charged a failure. With lock claims nothing is marked running: the victim's chunks are
//! open transactions, which PostgreSQL rolls back when its sessions end; their tasks are
//! pending again with their failures unchanged and the next chunks take them. So each kill
//! there first freezes the victim (SIGSTOP), notes the tasks its open transactions hold,
//! then kills it, and checks those tasks once its sessions are gone.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use outbox::Backend;

use crate::db::{
    active_sessions, fault_db, ledger_and_external, locked_by, session_states, sessions,
    wait_until, wait_until_finished, Db,
};
use crate::invariants::check_and_publish;
use crate::logs::log_lines;
use crate::report::{latency_summary, secs, Report};
use crate::scenario::{stop_all, Proc, Scenario};
use crate::{by_profile, work_limit, POLL, RESCUE_LATENCY_LIMIT};

/// One SIGKILL: the killed node and process, the tasks it held right before (stamped:
/// running under it; lock claims: locked by its open transactions), and how long until it
/// held none of them (stamped: rescued; lock claims: its sessions ended).
struct Kill {
    at: Instant,
    node: Option<i64>,
    app: String,
    tasks: Vec<i64>,
    rescued_after: Option<Duration>,
}

/// The tasks `worker` holds now: running under its node (stamped claims) or locked by its
/// sessions (lock claims).
fn held(sc: &Scenario, db: &Db, worker: &Proc, node: Option<i64>) -> Vec<i64> {
    if sc.locks() {
        return locked_by(db, Some(&worker.app));
    }
    node.map(|n| {
        db.numbers(&format!(
            "SELECT id AS n FROM async_task WHERE owner = {n} AND state = 'running'"
        ))
    })
    .unwrap_or_default()
}

/// Lock claims: freezes `worker` mid-work, waits until none of its sessions is running a
/// statement, and returns the tasks its open transactions lock, read between two equal
/// readings of its sessions (so that no statement of it, a COMMIT sent just before the
/// freeze say, completed meanwhile).
fn freeze_and_read_locks(db: &Db, worker: &Proc) -> Vec<i64> {
    worker.freeze();
    wait_until(
        db,
        Duration::from_secs(10),
        "the frozen worker's sessions to settle",
        || active_sessions(db, &worker.app) == 0,
    );
    let mut tasks = Vec::new();
    wait_until(
        db,
        Duration::from_secs(10),
        "a steady reading of its locks",
        || {
            let before = session_states(db, &worker.app);
            tasks = locked_by(db, Some(&worker.app));
            session_states(db, &worker.app) == before
        },
    );
    tasks
}

/// Measures how long after each kill its tasks stopped being held by the killed process;
/// with lock claims, also checks them then: each is pending again, or done by another node
/// since, its failures and error untouched (a killed chunk rolls back and counts nothing).
fn measure_rescues(sc: &Scenario, db: &Db, kills: &mut [Kill], violations: &mut Vec<String>) {
    for kill in kills.iter_mut() {
        if kill.rescued_after.is_some() || kill.tasks.is_empty() {
            continue;
        }
        let ids: Vec<String> = kill.tasks.iter().map(i64::to_string).collect();
        let ids = ids.join(",");
        if sc.locks() {
            if sessions(db, &kill.app) > 0 {
                continue;
            }
            kill.rescued_after = Some(kill.at.elapsed());
            let victim = kill.node.unwrap_or(-1);
            let wrong = db.numbers(&format!(
                "SELECT id AS n FROM async_task WHERE id IN ({ids})
                   AND (state NOT IN ('pending', 'done') OR failures <> 0 OR last_error IS NOT NULL
                        OR (state = 'done' AND owner = {victim}))"
            ));
            if !wrong.is_empty() {
                violations.push(format!(
                    "{}: of the {} tasks it locked when killed, {wrong:?} are not pending again \
                     (nor done by another node) with failures 0 and no error",
                    kill.app,
                    kill.tasks.len()
                ));
            }
            continue;
        }
        let Some(node) = kill.node else { continue };
        let still = db.count(&format!(
            "SELECT count(*) FROM async_task WHERE owner = {node} AND state = 'running' AND id IN ({ids})"
        ));
        if still == 0 {
            kill.rescued_after = Some(kill.at.elapsed());
        }
    }
}

#[test]
fn kill_9_during_a_run() {
    kill_9(Backend::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn kill_9_during_a_run_mysql() {
    kill_9(Backend::Mysql);
}

/// Three `run` workers, one killed (SIGKILL) every 200–400 ms while it has tasks, and
/// replaced.
fn kill_9(backend: Backend) {
    let sc = Scenario::start("kill_9_during_a_run", backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    let tasks = by_profile(20_000, 60_000);
    // Lock claims run faster (one write per task): longer handlers keep work left for the
    // last kill.
    let sleep_ms = if sc.locks() { 10 } else { 5 };
    let target_kills = by_profile(20, 50);
    db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    let args = sc.worker_args("run", &[]);
    let mut spawned = 0;
    let mut spawn = |sc: &Scenario| {
        spawned += 1;
        sc.spawn(&format!("worker{spawned}"), &url, &args)
    };
    let mut workers: Vec<Proc> = (0..3).map(|_| spawn(&sc)).collect();
    let mut killed: Vec<Proc> = Vec::new();
    let mut kills: Vec<Kill> = Vec::new();
    let mut violations: Vec<String> = Vec::new();

    while kills.len() < target_kills {
        // Wait 200–400 ms, measuring rescues meanwhile.
        let until = Instant::now() + Duration::from_millis(fastrand::u64(200..=400));
        while Instant::now() < until {
            measure_rescues(&sc, &db, &mut kills, &mut violations);
            std::thread::sleep(POLL);
        }
        for worker in &mut workers {
            worker.assert_running("between kills");
        }
        let unfinished = db.unfinished();
        assert!(
            unfinished > 0,
            "the tasks ran out after {} of {target_kills} kills: raise the task count or sleep_ms",
            kills.len()
        );
        // A random worker, killed at a moment it has tasks running (waiting up to 300 ms
        // for one), so that kills land mid-work however the worker paces its claims.
        let slot = fastrand::usize(..workers.len());
        let node = db.node_id(&workers[slot].node_name());
        if node.is_some() {
            let until = Instant::now() + Duration::from_millis(300);
            let mut measured = Instant::now();
            while held(&sc, &db, &workers[slot], node).is_empty() && Instant::now() < until {
                if measured.elapsed() >= POLL {
                    measure_rescues(&sc, &db, &mut kills, &mut violations);
                    measured = Instant::now();
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let locked = if sc.locks() {
            freeze_and_read_locks(&db, &workers[slot])
        } else {
            Vec::new()
        };
        let status = workers[slot].kill9();
        let at = Instant::now();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
        let victim = std::mem::replace(&mut workers[slot], spawn(&sc));
        // Stamped claims: still running under the dead node until rescued.
        let tasks = if sc.locks() {
            locked
        } else {
            held(&sc, &db, &victim, node)
        };
        kills.push(Kill {
            at,
            node,
            app: victim.app.clone(),
            tasks,
            rescued_after: None,
        });
        killed.push(victim);
    }

    let tail_time = wait_until_finished(&db, work_limit(), || {
        measure_rescues(&sc, &db, &mut kills, &mut violations);
        for worker in &mut workers {
            worker.assert_running("while finishing");
        }
    });
    // Nothing is running any more: every kill's tasks have been rescued by now (with lock
    // claims: every killed process's sessions have ended).
    measure_rescues(&sc, &db, &mut kills, &mut violations);
    let stop_time = stop_all(&mut workers);

    let latencies: Vec<Duration> = kills.iter().filter_map(|k| k.rescued_after).collect();
    let with_tasks = kills.iter().filter(|k| !k.tasks.is_empty()).count();
    let unregistered = kills.iter().filter(|k| k.node.is_none()).count();
    let mut report = Report::new();
    report.add(
        "tasks",
        format!("{tasks} (3/4 fault.ledger, 1/4 fault.external, sleep_ms {sleep_ms})"),
    );
    report.add(
        "processes",
        format!(
            "3 run workers, {} SIGKILLs, {} restarts ({} killed before registering)",
            kills.len(),
            kills.len(),
            unregistered
        ),
    );
    let in_flight = kills.iter().map(|k| k.tasks.len()).sum::<usize>();
    let rescue_lines = log_lines(
        &killed.iter().chain(&workers).collect::<Vec<_>>(),
        &["rescued from node"],
    );
    if sc.locks() {
        let committed_before = kills
            .iter()
            .filter_map(|k| k.node.map(|n| (n, &k.tasks)))
            .filter(|(_, tasks)| !tasks.is_empty())
            .map(|(n, tasks)| {
                let ids: Vec<String> = tasks.iter().map(i64::to_string).collect();
                db.count(&format!(
                    "SELECT count(*) FROM async_task WHERE owner = {n} AND id IN ({})",
                    ids.join(",")
                ))
            })
            .sum::<i64>();
        report.add(
            "tasks locked at kills",
            format!(
                "{in_flight} over {with_tasks} kills, all rolled back: {committed_before} \
                 done by the killed node"
            ),
        );
        report.add(
            "sessions ended after",
            format!("{} (after SIGKILL)", latency_summary(&latencies)),
        );
    } else {
        report.add(
            "tasks in flight at kills",
            format!("{in_flight} over {with_tasks} kills"),
        );
        report.add("rescue latency", latency_summary(&latencies));
    }
    report.add("rescue log lines", rescue_lines);
    report.add("finish after last kill", secs(tail_time));
    report.add("SIGTERM to exit", secs(stop_time));
    let slow: Vec<String> = latencies
        .iter()
        .filter(|l| **l > RESCUE_LATENCY_LIMIT)
        .map(|l| secs(*l))
        .collect();
    let figures = check_and_publish(&sc, &db, report, true);
    assert!(
        with_tasks * 2 >= kills.len(),
        "only {with_tasks} of {} kills landed while the victim had tasks running",
        kills.len()
    );
    assert_eq!(
        latencies.len(),
        with_tasks,
        "not every kill's tasks were rescued (lock claims: released)"
    );
    assert!(
        slow.is_empty(),
        "rescues slower than {RESCUE_LATENCY_LIMIT:?}: {slow:?}"
    );
    if sc.locks() {
        assert!(violations.is_empty(), "{}", violations.join("\n"));
        // A killed chunk rolls back: no task is charged a failure, none is rescued.
        assert_eq!(
            rescue_lines, 0,
            "tasks rescued from a killed node, though lock claims mark none running"
        );
        assert!(
            figures.charged.is_empty(),
            "tasks charged a failure by a kill: {:?}",
            figures.charged
        );
    }
}
