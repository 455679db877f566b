//! One worker serving several databases (`Fleet`): each database's tasks claimed from it and
//! run once, their effects in that database; one database's trouble holds up only its own
//! claim loop; bad input refused before any node registers.

use std::time::{Duration, Instant};

use outbox::domain::admin;
use outbox::{enqueue_batch, Backend, Error, Fleet, NewTask, WorkerConfig};

use crate::support::TestDb;
use crate::{ledger_registry, small_config};

/// A second fresh database of `db`'s backend.
fn another(db: &TestDb) -> TestDb {
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
        let fleet = Fleet::new(
            &[db.url.clone(), other.url.clone()],
            ledger_registry("ledger"),
            small_config(),
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
        fleet.workers()[1].heartbeat_once().unwrap();
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

    fn a_database_unreachable_at_start_is_named_and_nothing_starts(db: &TestDb) {
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
        let e = Fleet::new(
            &[db.url.clone(), missing.clone()],
            ledger_registry("ledger"),
            small_config(),
        )
        .err()
        .expect("an unreachable database fails the start");
        assert!(
            matches!(&e, Error::OnDatabase { database, .. } if *database == missing.masked()),
            "{e}"
        );
        assert_eq!(db.count("SELECT count(*) FROM async_node"), 0, "no node registered");
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
