//! One worker serving several databases (`Fleet`): each database's tasks claimed from it and
//! run once, their effects in that database; one database's trouble holds up only its own
//! claim loop; bad input refused before any node registers.

use std::time::{Duration, Instant};

use outbox::domain::admin;
use outbox::{enqueue_batch, Backend, Error, Fleet, NewTask, WorkerConfig};

use crate::support::TestDb;
use crate::{ledger_registry, small_config};

/// A second fresh database of `db`'s backend.
pub(crate) fn another(db: &TestDb) -> TestDb {
    match db.backend() {
        Backend::Sqlite => TestDb::sqlite(),
        Backend::Postgres => TestDb::postgres(),
        #[cfg(feature = "mysql")]
        Backend::Mysql => TestDb::mysql(),
        #[cfg(not(feature = "mysql"))]
        Backend::Mysql => panic!("the MySQL tests are built with the mysql feature"),
    }
}

/// Enqueues `n` `ledger` tasks with biz_ids `order-0…` (the same in every database).
fn enqueue(db: &TestDb, n: usize) {
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| NewTask::new("ledger", format!("order-{i}")))
        .collect();
    enqueue_batch(&mut db.conn(), &tasks).unwrap();
}

/// Every task of `db` done, each with exactly one ledger row in `db` itself.
fn assert_each_done_once_here(db: &TestDb, n: i64) {
    assert_eq!(db.count("SELECT count(*) FROM async_task"), n);
    assert_eq!(
        db.count("SELECT count(*) FROM async_task WHERE state = 'done'"),
        n
    );
    assert_eq!(db.count("SELECT count(*) FROM test_ledger"), n);
    assert_eq!(
        db.count(
            "SELECT count(DISTINCT l.task_id) FROM test_ledger l \
             JOIN async_task t ON t.id = l.task_id AND t.state = 'done'"
        ),
        n
    );
}

every_backend! {
    fn a_fleet_runs_each_databases_tasks_once_in_that_database(db: &TestDb) {
        let other = another(db);
        // The same biz_ids in both: each database's idempotency is its own.
        enqueue(db, 120);
        enqueue(&other, 80);
        let fleet = Fleet::new(
            &[db.url.clone(), other.url.clone()],
            ledger_registry("ledger"),
            small_config(),
        )
        .unwrap();
        let reports = fleet.drain();
        assert_eq!(reports.len(), 2);
        assert_eq!(reports[0].database, db.url.masked());
        assert_eq!(reports[1].database, other.url.masked());
        let done: Vec<u64> = reports
            .into_iter()
            .map(|r| r.result.unwrap().tally.done)
            .collect();
        assert_eq!(done, vec![120, 80]);
        // Task ids overlap (both start at 1): a ledger row written in the other database
        // would show as a surplus there and a shortfall here.
        assert_each_done_once_here(db, 120);
        assert_each_done_once_here(&other, 80);
        // Each database knows only the node that served it.
        let nodes: Vec<i64> = fleet.workers().iter().map(|w| w.node_id()).collect();
        for (database, node) in [(db, nodes[0]), (&other, nodes[1])] {
            assert_eq!(database.count("SELECT count(*) FROM async_node"), 1);
            assert_eq!(
                database.count(&format!("SELECT count(*) FROM async_node WHERE id = {node}")),
                1
            );
        }
        assert_eq!(fleet.totals().done, 200);
        assert_eq!(fleet.in_flight(), 0);
    }

    fn run_once_claims_a_page_from_each_database(db: &TestDb) {
        let other = another(db);
        enqueue(db, 4);
        enqueue(&other, 5);
        // Each database's page is what its share of the pool can take: 2 threads and 3
        // queued of 4 and 6.
        let fleet = Fleet::new(
            &[db.url.clone(), other.url.clone()],
            ledger_registry("ledger"),
            small_config().threads(4).queue(6),
        )
        .unwrap();
        let tallies: Vec<u64> = fleet
            .run_once()
            .into_iter()
            .map(|r| r.result.unwrap().done)
            .collect();
        assert_eq!(tallies, vec![4, 5]);
        assert_each_done_once_here(db, 4);
        assert_each_done_once_here(&other, 5);
        let again: Vec<u64> = fleet
            .run_once()
            .into_iter()
            .map(|r| r.result.unwrap().claimed)
            .collect();
        assert_eq!(again, vec![0, 0], "nothing due is claimed twice");
    }

    fn a_database_paused_holds_up_only_its_own_tasks(db: &TestDb) {
        let other = another(db);
        enqueue(db, 30);
        enqueue(&other, 20);
        // `default` paused in the second database: its claims stop, while the slots the
        // databases share keep running the first's tasks.
        admin::pause(&mut other.conn(), "default", "test").unwrap();
        let fleet = Fleet::new(
            &[db.url.clone(), other.url.clone()],
            ledger_registry("ledger"),
            small_config(),
        )
        .unwrap();
        let claimed: Vec<u64> = fleet
            .drain()
            .into_iter()
            .map(|r| r.result.unwrap().tally.claimed)
            .collect();
        assert_eq!(claimed, vec![30, 0]);
        assert_each_done_once_here(db, 30);
        assert_eq!(other.count("SELECT count(*) FROM async_task WHERE state = 'pending'"), 20);
        assert_eq!(other.count("SELECT count(*) FROM test_ledger"), 0);
        // Resumed (the next heartbeat applies it), the second database drains too.
        admin::resume(&mut other.conn(), "default", "test").unwrap();
        fleet.worker(1).unwrap().heartbeat_once().unwrap();
        let done: Vec<u64> = fleet
            .drain()
            .into_iter()
            .map(|r| r.result.unwrap().tally.done)
            .collect();
        assert_eq!(done, vec![0, 20]);
        assert_each_done_once_here(&other, 20);
    }

    fn a_fleet_refuses_a_database_named_twice_or_a_mix_of_backends(db: &TestDb) {
        let twice = Fleet::new(
            &[db.url.clone(), db.url.clone()],
            ledger_registry("ledger"),
            small_config(),
        )
        .err()
        .expect("a database named twice is refused");
        assert!(
            matches!(&twice, Error::InvalidConfig { .. })
                && twice.to_string().contains(&db.url.masked())
                && twice.to_string().contains("twice"),
            "{twice}"
        );
        let mixed_with = match db.backend() {
            Backend::Sqlite => TestDb::postgres(),
            _ => TestDb::sqlite(),
        };
        let mixed = Fleet::new(
            &[db.url.clone(), mixed_with.url.clone()],
            ledger_registry("ledger"),
            small_config(),
        )
        .err()
        .expect("a mix of backends is refused");
        assert!(
            matches!(&mixed, Error::InvalidConfig { .. }) && mixed.to_string().contains("mixes"),
            "{mixed}"
        );
        let domains = Fleet::new(
            &[db.url.clone(), another(db).url.clone()],
            ledger_registry("ledger"),
            small_config().domain(outbox::domain::Domain::max("slow", ["ledger"], 1)),
        )
        .err()
        .expect("domains are refused");
        assert!(domains.to_string().contains("domains"), "{domains}");
        // Nothing registered anywhere.
        assert_eq!(db.count("SELECT count(*) FROM async_node"), 0);
        assert_eq!(mixed_with.count("SELECT count(*) FROM async_node"), 0);
    }

    fn a_database_unreachable_at_start_holds_up_only_itself(db: &TestDb) {
        let missing = match db.backend() {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                outbox::DatabaseUrl::parse(dir.path().join("missing.db").to_str().unwrap())
                    .unwrap()
            }
            _ => {
                let text = db.url_text.clone();
                let base = &text[..text.rfind('/').unwrap()];
                outbox::DatabaseUrl::parse(&format!("{base}/outbox_no_such_database")).unwrap()
            }
        };
        let start = |urls: &[outbox::DatabaseUrl]| {
            Fleet::new(urls, ledger_registry("ledger"), small_config())
        };
        let named = |e: &Error| matches!(e, Error::OnDatabase { database, .. } if *database == missing.masked());
        // Alone, it fails the start, named.
        let e = start(std::slice::from_ref(&missing))
            .err()
            .expect("a fleet that reaches no database fails its start");
        assert!(named(&e), "{e}");
        if db.backend() == Backend::Sqlite {
            // A missing file is no server that may come back: the start fails, nothing starts.
            let e = start(&[db.url.clone(), missing.clone()])
                .err()
                .expect("a missing SQLite file fails the start");
            assert!(named(&e), "{e}");
            assert_eq!(db.count("SELECT count(*) FROM async_node"), 0, "no node registered");
            return;
        }
        // Beside a reachable one: the reachable database is served; the other is tried again
        // at each drain and `run_once`, and reported failed.
        enqueue(db, 3);
        let fleet = start(&[db.url.clone(), missing.clone()]).unwrap();
        assert_eq!(fleet.workers().len(), 1, "only the reachable database's worker started");
        let reports = fleet.drain();
        assert_eq!(reports.len(), 2);
        assert_eq!(reports[0].database, db.url.masked());
        assert_eq!(reports[0].result.as_ref().unwrap().tally.done, 3);
        assert_eq!(reports[1].database, missing.masked());
        assert!(reports[1].result.is_err(), "{:?}", reports[1].result);
        let once = fleet.run_once();
        assert!(once[0].result.is_ok() && once[1].result.is_err(), "{once:?}");
        drop(fleet);
        assert_eq!(db.count("SELECT count(*) FROM async_node WHERE state = 'gone'"), 1);
    }

    fn a_fleets_drain_runs_each_databases_suspect_though_another_holds_the_turn(db: &TestDb) {
        // A suspect in each database, due at the start. The process runs one suspect at a
        // time, so whichever database claims first holds the turn while its handler runs;
        // the other's drain, which has nothing else to run, must wait for the turn rather
        // than end with its suspect pending. (Before its fix the other drain ended at its
        // first claim, within milliseconds: the handler's second is its margin.)
        let other = another(db);
        for database in [db, &other] {
            enqueue(database, 1);
            database.exec("UPDATE async_task SET suspect = 2");
        }
        let mut registry = outbox::Registry::new();
        registry.register(
            "ledger",
            |task: &outbox::TaskContext, tx: &mut outbox::TaskTx| -> outbox::HandlerResult {
                std::thread::sleep(Duration::from_secs(1));
                crate::write_ledger(task, tx)
            },
        );
        let fleet = Fleet::new(&[db.url.clone(), other.url.clone()], registry, small_config())
            .unwrap();
        let done: Vec<u64> = fleet
            .drain()
            .into_iter()
            .map(|r| r.result.unwrap().tally.done)
            .collect();
        assert_eq!(done, vec![1, 1]);
        assert_each_done_once_here(db, 1);
        assert_each_done_once_here(&other, 1);
    }
}

/// One database becomes unreachable while the fleet runs (no connections allowed, its
/// sessions terminated): its drain fails, naming it, and the other's drain still runs every
/// task. PostgreSQL, whose server can refuse one database while serving another.
#[test]
fn a_database_unreachable_mid_run_does_not_stop_the_other() {
    let (db, other) = (TestDb::postgres(), TestDb::postgres());
    enqueue(&db, 50);
    enqueue(&other, 50);
    let config = WorkerConfig::default().threads(2).queue(2).page_size(10);
    let fleet = Fleet::new(
        &[db.url.clone(), other.url.clone()],
        ledger_registry("ledger"),
        config,
    )
    .unwrap();
    let name = other.url_text.rsplit('/').next().unwrap().to_owned();
    db.exec(&format!(
        "ALTER DATABASE {name} ALLOW_CONNECTIONS false; \
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
    ));
    let reports = fleet.drain();
    assert_eq!(reports[0].result.as_ref().unwrap().tally.done, 50);
    let failed = reports[1]
        .result
        .as_ref()
        .expect_err("the unreachable one fails");
    assert_eq!(reports[1].database, other.url.masked());
    // Its pool cannot open a connection to it.
    assert!(
        matches!(failed, Error::Pool { .. } | Error::Database { .. }),
        "{failed}"
    );
    assert_each_done_once_here(&db, 50);
    db.exec(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"));
    assert_eq!(other.count("SELECT count(*) FROM test_ledger"), 0);
    assert_eq!(
        other.count("SELECT count(*) FROM async_task WHERE state = 'pending'"),
        50
    );
}

/// One database refuses connections when the fleet starts: the other's worker starts alone;
/// a drain while it still refuses fails for it, naming it, and drains the other; once it is
/// let in, the next `run_once` starts its worker and runs its share of its tasks, and the
/// next ones the rest. PostgreSQL.
#[test]
fn a_database_refused_at_the_start_is_started_once_it_is_let_in() {
    let (db, other) = (TestDb::postgres(), TestDb::postgres());
    enqueue(&db, 5);
    enqueue(&other, 5);
    let name = other.url_text.rsplit('/').next().unwrap().to_owned();
    let allow = |yes: bool| db.exec(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS {yes}"));
    allow(false);
    let fleet = Fleet::new(
        &[db.url.clone(), other.url.clone()],
        ledger_registry("ledger"),
        WorkerConfig::default().threads(2).queue(2).page_size(10),
    )
    .unwrap();
    assert!(fleet.worker(0).is_some() && fleet.worker(1).is_none());
    let reports = fleet.drain();
    assert_eq!(reports[0].result.as_ref().unwrap().tally.done, 5);
    assert_eq!(reports[1].database, other.url.masked());
    assert!(reports[1].result.is_err(), "{:?}", reports[1].result);
    allow(true);
    let once = fleet.run_once();
    assert!(once[1].result.as_ref().unwrap().claimed > 0, "{once:?}");
    assert!(fleet.worker(1).is_some());
    // Its share of the pool at a time.
    for _ in 0..5 {
        fleet.run_once();
    }
    assert_eq!(fleet.workers().len(), 2);
    drop(fleet);
    assert_each_done_once_here(&other, 5);
    for database in [&db, &other] {
        assert_eq!(
            database.count("SELECT count(*) FROM async_node WHERE state = 'gone'"),
            1
        );
    }
}

/// A fleet stopping while one database refuses connections: the stop takes seconds, not the
/// pool's checkout timeout per attempt, and the node of the reachable database is marked
/// gone; the unreachable one's stays `alive`, for the fleet's rescue once its heartbeat is
/// stale. PostgreSQL, whose server can refuse one database while serving another.
#[test]
fn a_fleet_stops_in_seconds_while_a_database_refuses_connections() {
    let (down, up) = (TestDb::postgres(), TestDb::postgres());
    let config = small_config().poll_interval(Duration::from_millis(50));
    // The refusing database first: its worker is dropped before the other's.
    let fleet = Fleet::new(
        &[down.url.clone(), up.url.clone()],
        ledger_registry("ledger"),
        config,
    )
    .unwrap();
    let name = down.url_text.rsplit('/').next().unwrap().to_owned();
    up.exec(&format!(
        "ALTER DATABASE {name} ALLOW_CONNECTIONS false; \
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
    ));
    let stop = fleet.stop_flag();
    let (loops_tx, loops_ended) = std::sync::mpsc::channel();
    let running = std::thread::spawn(move || {
        let reports = fleet.run();
        let _ = loops_tx.send(Instant::now());
        drop(fleet);
        reports
    });
    // The reachable database's loop runs a task; the other's claims meet the refusal.
    enqueue(&up, 1);
    let limit = Instant::now() + Duration::from_secs(30);
    while up.count("SELECT count(*) FROM async_task WHERE state = 'done'") < 1 {
        assert!(
            Instant::now() < limit,
            "the reachable database's task never ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let asked = Instant::now();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reports = running.join().unwrap();
    let took = asked.elapsed();
    let loops = loops_ended.recv().unwrap().duration_since(asked);
    up.exec(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"));
    assert!(
        reports.iter().all(|r| r.result.is_ok()),
        "a run ends without error"
    );
    // A claim's look for a connection, then at most the refusing database's 2 s.
    assert!(
        loops < Duration::from_secs(1),
        "the claim loops took {loops:?} to stop"
    );
    assert!(took < Duration::from_secs(4), "the stop took {took:?}");
    assert_eq!(
        up.count("SELECT count(*) FROM async_node WHERE state = 'gone'"),
        1
    );
    assert_eq!(
        down.count("SELECT count(*) FROM async_node WHERE state = 'alive'"),
        1
    );
}

/// Lets handlers through once opened; counts those waiting on the pool's threads.
#[derive(Default)]
struct Gate {
    /// Opened; waiting now on a pool thread; the most that waited at once there.
    state: std::sync::Mutex<(bool, usize, usize)>,
    changed: std::sync::Condvar,
}

impl Gate {
    /// Waits until the gate opens; fails the task after `limit`.
    fn pass(&self, limit: Duration) -> outbox::HandlerResult {
        let on_pool = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("outbox-task-"));
        let mut state = self.state.lock().unwrap();
        if on_pool {
            state.1 += 1;
            state.2 = state.2.max(state.1);
        }
        let (mut state, timeout) = self
            .changed
            .wait_timeout_while(state, limit, |(open, _, _)| !*open)
            .unwrap();
        if on_pool {
            state.1 -= 1;
        }
        drop(state);
        if timeout.timed_out() {
            return Err(anyhow::anyhow!("the gate stayed closed").into());
        }
        Ok(())
    }

    fn open(&self) {
        self.state.lock().unwrap().0 = true;
        self.changed.notify_all();
    }

    /// Handlers waiting at the gate on the pool's threads now, and the most at once.
    fn waiting(&self) -> (usize, usize) {
        let state = self.state.lock().unwrap();
        (state.1, state.2)
    }
}

/// Opens the gate when dropped, and on a failed assertion stops the fleet too, so that it
/// does not leave the fleet's threads waiting.
struct Release<'a>(&'a Gate, &'a std::sync::atomic::AtomicBool);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.open();
        if std::thread::panicking() {
            self.1.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// How long the quick database has to run its tasks while the other is blocked (they take a
/// second or two at their pace).
const PACE_LIMIT: Duration = Duration::from_secs(20);

/// Polls `condition` every 20 ms until it holds or `limit` passes; returns whether it held.
fn within(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    Drain,
    Run,
}

/// Two databases on one fleet: every task of the first (`stuck`) waits at a gate, the second
/// has 60 quick `ledger` tasks. While the gate is closed the first holds at most its
/// `share` of the pool's threads, and the second's tasks all run; once it opens, the first's
/// tasks run too, each database's once.
fn a_blocked_database_leaves_the_other_its_pace(
    db: &TestDb,
    config: WorkerConfig,
    share: usize,
    mode: Mode,
) {
    paced_beside_a_blocked_database(db, config, share, mode, None, false);
}

/// [`a_blocked_database_leaves_the_other_its_pace`], with `tenant` (a name and its
/// `max_running`) set in both databases and given to every other task of each, and with
/// `peer` another live node in each database, holding nothing (as a `least_count` node
/// compares itself with).
fn paced_beside_a_blocked_database(
    db: &TestDb,
    config: WorkerConfig,
    share: usize,
    mode: Mode,
    tenant: Option<(&str, i32)>,
    peer: bool,
) {
    const QUICK: usize = 60;
    let (slow, quick) = (another(db), another(db));
    if peer {
        for db in [&slow, &quick] {
            db.exec(
                "INSERT INTO async_node (name, strategy, weight, running)
                 VALUES ('peer', 'default', 1, 0)",
            );
        }
    }
    if let Some((name, max_running)) = tenant {
        for db in [&slow, &quick] {
            outbox::set_tenant(
                &mut db.conn(),
                name,
                &outbox::TenantLimits::default().max_running(Some(max_running)),
                "test",
            )
            .unwrap();
        }
    }
    // `n` tasks of `keyword`, `prefix-i`, every other one of `tenant` when given.
    let tasks = |keyword: &str, prefix: &str, n: usize| -> Vec<NewTask> {
        (0..n)
            .map(|i| {
                let task = NewTask::new(keyword, format!("{prefix}-{i}"));
                match tenant.filter(|_| i.is_multiple_of(2)) {
                    Some((name, _)) => task.tenant(name),
                    None => task,
                }
            })
            .collect()
    };
    let enqueue = |db: &TestDb, n: usize| {
        enqueue_batch(&mut db.conn(), &tasks("ledger", "order", n)).unwrap();
    };
    let gate = std::sync::Arc::new(Gate::default());
    let mut registry = ledger_registry("ledger");
    {
        let gate = std::sync::Arc::clone(&gate);
        registry.register(
            "stuck",
            move |_: &outbox::TaskContext, _: &mut outbox::TaskTx| {
                gate.pass(Duration::from_secs(60))
            },
        );
    }
    enqueue_batch(&mut slow.conn(), &tasks("stuck", "stuck", 20)).unwrap();
    // A drain ends when nothing is due: the quick tasks are there from the start; `run`
    // gets them once the slow database's handlers are waiting.
    if let Mode::Drain = mode {
        enqueue(&quick, QUICK);
    }
    let fleet = Fleet::new(
        &[slow.url.clone(), quick.url.clone()],
        registry,
        config.poll_interval(Duration::from_millis(50)),
    )
    .unwrap();
    let stop = fleet.stop_flag();
    let done = "SELECT count(*) FROM async_task WHERE state = 'done'";
    let reports = std::thread::scope(|s| {
        let release = Release(&gate, &stop);
        let running = s.spawn(|| match mode {
            Mode::Drain => fleet.drain(),
            Mode::Run => fleet.run(),
        });
        assert!(
            within(PACE_LIMIT, || gate.waiting().0 >= 1),
            "{mode:?}: no handler of the slow database ever waited"
        );
        if let Mode::Run = mode {
            enqueue(&quick, QUICK);
        }
        let paced = within(PACE_LIMIT, || quick.count(done) == QUICK as i64);
        let (waiting, most) = gate.waiting();
        assert!(
            paced,
            "{mode:?}: with the slow database's handlers blocked ({waiting} waiting), the \
             other ran {} of its {QUICK} tasks in {PACE_LIMIT:?}",
            quick.count(done)
        );
        assert!(
            waiting >= 1,
            "{mode:?}: the slow database was blocked meanwhile"
        );
        assert!(
            most <= share,
            "{mode:?}: the slow database took {most} threads, past its share of {share}"
        );
        gate.open();
        if let Mode::Run = mode {
            assert!(
                within(PACE_LIMIT, || slow.count(done) == 20),
                "{mode:?}: the slow database's tasks ran once let through"
            );
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        drop(release);
        running.join().unwrap()
    });
    let done: Vec<u64> = reports
        .into_iter()
        .map(|r| r.result.unwrap().tally.done)
        .collect();
    assert_eq!(done, vec![20, QUICK as u64], "{mode:?}");
    assert_eq!(
        slow.count("SELECT count(*) FROM async_task WHERE state = 'done'"),
        20
    );
    assert_each_done_once_here(&quick, QUICK as i64);
}

every_backend! {
    fn a_database_whose_handlers_block_takes_at_most_its_share(db: &TestDb) {
        let config = WorkerConfig::default()
            .threads(4)
            .queue(4)
            .page_size(10)
            .claim_style(outbox::ClaimStyle::Stamp);
        // 2 of the 4 threads each.
        for mode in [Mode::Drain, Mode::Run] {
            a_blocked_database_leaves_the_other_its_pace(db, config.clone(), 2, mode);
        }
        // A thread per database at least, however few are asked for.
        a_blocked_database_leaves_the_other_its_pace(
            db,
            config.threads(1).queue(1),
            1,
            Mode::Drain,
        );
    }
}

/// The same under lock claims (PostgreSQL): chunks of 5, no queue.
#[test]
fn under_lock_claims_a_database_whose_handlers_block_takes_at_most_its_share() {
    let db = TestDb::postgres();
    let config = WorkerConfig::default()
        .threads(4)
        .commit_batch(5)
        .claim_style(outbox::ClaimStyle::Lock);
    for mode in [Mode::Drain, Mode::Run] {
        a_blocked_database_leaves_the_other_its_pace(&db, config.clone(), 2, mode);
    }
}

/// The same under lock claims with a tenant's `max_running` in both databases (its tasks
/// claimed the stamping way, the others leased), a thread each. The blocked database has a
/// chunk waiting for its own thread, which must not count against the threads the other may
/// lock chunks for: the other keeps claiming, its `drain` does not end with tasks due, and its
/// `run` keeps running (the fault harness's seed 1515).
#[test]
fn under_lock_claims_with_a_tenants_limit_a_blocked_database_leaves_the_other_its_pace() {
    let db = TestDb::postgres();
    let config = WorkerConfig::default()
        .threads(2)
        .commit_batch(10)
        .claim_style(outbox::ClaimStyle::Lock);
    for mode in [Mode::Drain, Mode::Run] {
        paced_beside_a_blocked_database(&db, config.clone(), 1, mode, Some(("t1", 3)), false);
    }
}

/// A `least_count` fleet beside an idle peer, past half its bound in a database, waits for
/// that database's own tasks to finish before it claims there again, counted as tasks: not
/// for room in the whole pool (where a batched chunk is one unit, whatever its tasks), which
/// would take the other database's blocked units too.
#[test]
fn a_least_count_fleet_waits_for_its_own_tasks_not_a_blocked_databases() {
    let db = TestDb::postgres();
    let config = WorkerConfig::default()
        .threads(2)
        .queue(2)
        .commit_batch(10)
        .claim_style(outbox::ClaimStyle::Stamp)
        .strategy(outbox::Strategy::LeastCount)
        .slack(4)
        .dead_after(Duration::from_secs(60));
    for mode in [Mode::Drain, Mode::Run] {
        paced_beside_a_blocked_database(&db, config.clone(), 1, mode, None, true);
    }
}
