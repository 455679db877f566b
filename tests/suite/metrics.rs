//! Metrics and health (`WorkerConfig::metrics_addr`): scraped over HTTP while a drain works,
//! the exposition parsed, its figures checked against the database.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox::{Error, HandlerError, NewTask, Registry, TaskContext, TaskTx, Worker};

use crate::scrape::{get, scrape, Exposition};
use crate::support::TestDb;
use crate::{small_config, write_ledger};

/// Port 0: the system picks a free one ([`Worker::metrics_addr`] tells which).
fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Polls `scrape` until `ok` holds for it; fails after 20 s.
fn scrape_until(addr: SocketAddr, what: &str, ok: impl Fn(&Exposition) -> bool) -> Exposition {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let exposition = scrape(addr);
        if ok(&exposition) {
            return exposition;
        }
        assert!(
            Instant::now() < give_up,
            "timed out waiting for {what}: {exposition:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The SQL for "now plus `secs` seconds" on `db`'s backend.
fn now_plus(db: &TestDb, secs: i64) -> String {
    match db.backend() {
        outbox::Backend::Postgres => format!("now() + interval '{secs} seconds'"),
        outbox::Backend::Sqlite => {
            format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '{secs:+} seconds')")
        }
        outbox::Backend::Mysql => format!("UTC_TIMESTAMP(3) + INTERVAL {secs} SECOND"),
    }
}

every_backend! {
    fn scrapes_while_a_drain_works_match_the_table(db: &TestDb) {
        let tasks: Vec<NewTask> = (0..6)
            .map(|i| NewTask::new("ledger", format!("l{i}")))
            .chain((0..2).map(|i| NewTask::new("doomed", format!("d{i}"))))
            .collect();
        outbox::enqueue_batch(&mut db.conn(), &tasks).unwrap();
        // The ledger's handlers wait for the gate, so that a scrape sees them running.
        let gate = Arc::new(AtomicBool::new(false));
        let mut registry = Registry::new();
        let open = Arc::clone(&gate);
        registry.register("ledger", move |task: &TaskContext, tx: &mut TaskTx| {
            let give_up = Instant::now() + Duration::from_secs(20);
            while !open.load(Ordering::Relaxed) && Instant::now() < give_up {
                std::thread::sleep(Duration::from_millis(5));
            }
            write_ledger(task, tx)
        });
        registry.register("doomed", |_: &TaskContext, _: &mut TaskTx| {
            Err(HandlerError::permanent(anyhow::anyhow!("no such account")))
        });
        let config = small_config().metrics_addr(any_port());
        let worker = Worker::new(&db.url, registry, config).unwrap();
        let addr = worker.metrics_addr().expect("serving");
        let node = worker.node_id().to_string();

        let report = std::thread::scope(|s| {
            let drain = s.spawn(|| worker.drain());
            // Mid-drain: a handler holds a slot of the default domain.
            let mid = scrape_until(addr, "a running handler", |e| {
                e.value("outbox_domain_running", &[("domain", "default")]).unwrap_or(0.0) >= 1.0
            });
            assert_eq!(mid.types["outbox_domain_running"], "gauge");
            let age = mid.value("outbox_node_heartbeat_age_seconds", &[("node", &node)]).unwrap();
            assert!((0.0..15.0).contains(&age), "heartbeat age {age}");
            // The table's figures, whenever they were read, count every ledger task once.
            let ledger: f64 = mid.matching("outbox_tasks", &[("keyword", "ledger")]).map(|s| s.value).sum();
            assert_eq!(ledger, 6.0);
            gate.store(true, Ordering::Relaxed);
            drain.join().unwrap().unwrap()
        });
        assert_eq!((report.tally.done, report.tally.dead), (6, 2));

        let after = scrape(addr);
        assert_eq!(after.types["outbox_tasks_finished_total"], "counter");
        assert_eq!(after.types["outbox_completion_latency_seconds"], "histogram");
        let in_db = |keyword: &str, state: &str| {
            db.count(&format!(
                "SELECT count(*) FROM async_task WHERE keyword = '{keyword}' AND state = '{state}'"
            )) as f64
        };
        let finished = |keyword: &str, outcome: &str| {
            after.value("outbox_tasks_finished_total", &[("keyword", keyword), ("outcome", outcome)])
        };
        assert_eq!(finished("ledger", "done"), Some(in_db("ledger", "done")));
        assert_eq!(finished("ledger", "done"), Some(6.0));
        assert_eq!(finished("doomed", "dead"), Some(in_db("doomed", "dead")));
        assert_eq!(finished("doomed", "dead"), Some(2.0));
        assert_eq!(finished("ledger", "retried"), Some(0.0));
        assert_eq!(finished("doomed", "done"), Some(0.0));
        for (keyword, n) in [("ledger", 6.0), ("doomed", 2.0)] {
            let labels = [("keyword", keyword)];
            assert_eq!(after.value("outbox_completion_latency_seconds_count", &labels), Some(n));
            let inf = [("keyword", keyword), ("le", "+Inf")];
            assert_eq!(after.value("outbox_completion_latency_seconds_bucket", &inf), Some(n));
            // Cumulative buckets never decrease.
            let buckets: Vec<f64> = after
                .matching("outbox_completion_latency_seconds_bucket", &labels)
                .map(|s| s.value)
                .collect();
            assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
        }
        let claims = after.value("outbox_claim_latency_seconds_count", &[]).unwrap();
        assert!(claims >= 1.0, "{claims} claims");
        assert_eq!(after.value("outbox_domain_running", &[("domain", "default")]), Some(0.0));
    }

    fn the_table_figures_are_the_databases(db: &TestDb) {
        let tasks: Vec<NewTask> = (0..6).map(|i| NewTask::new("ledger", i.to_string())).collect();
        let ids: Vec<i64> = outbox::enqueue_batch(&mut db.conn(), &tasks)
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        // Three due for 90 s, one due now, one due in an hour, one dead.
        db.exec(&format!(
            "UPDATE async_task SET run_at = {} WHERE id IN ({}, {}, {})",
            now_plus(db, -90), ids[0], ids[1], ids[2]
        ));
        db.exec(&format!("UPDATE async_task SET run_at = {} WHERE id = {}", now_plus(db, 3600), ids[4]));
        db.exec(&format!("UPDATE async_task SET state = 'dead' WHERE id = {}", ids[5]));
        let config = small_config().metrics_addr(any_port());
        let worker = Worker::new(&db.url, crate::ledger_registry("ledger"), config).unwrap();
        let e = scrape(worker.metrics_addr().unwrap());
        let ledger = [("keyword", "ledger")];
        let due = db.count(&format!(
            "SELECT count(*) FROM async_task WHERE state = 'pending' AND run_at <= {}",
            now_plus(db, 0)
        ));
        assert_eq!(due, 4);
        assert_eq!(e.value("outbox_queue_depth", &ledger), Some(due as f64));
        for (state, n) in [("pending", 5.0), ("dead", 1.0), ("done", 0.0), ("running", 0.0)] {
            assert_eq!(e.value("outbox_tasks", &[("keyword", "ledger"), ("state", state)]), Some(n), "{state}");
        }
        let oldest = e.value("outbox_oldest_due_age_seconds", &ledger).unwrap();
        assert!((89.0..150.0).contains(&oldest), "oldest due age {oldest}");
        let sample_age = e.value("outbox_metrics_sample_age_seconds", &[]).unwrap();
        assert!(sample_age < 5.0, "{sample_age}");
        // A scrape within 5 s of the read serves the same figures: a storm of scrapes reads
        // the table once.
        outbox::enqueue(&mut db.conn(), &NewTask::new("ledger", "late")).unwrap();
        let again = scrape(worker.metrics_addr().unwrap());
        assert_eq!(again.value("outbox_queue_depth", &ledger), Some(due as f64));
        assert!(again.value("outbox_metrics_sample_age_seconds", &[]).unwrap() > sample_age);
    }

    fn rescued_tasks_are_counted_per_keyword_and_state(db: &TestDb) {
        crate::rescue::enqueue_n(db, 2);
        let dying = crate::rescue::quiet_worker(db);
        let page = dying.claim().unwrap();
        // One of them is at its last attempt: the rescue makes it dead.
        db.exec(&format!("UPDATE async_task SET max_attempts = 1 WHERE id = {}", page[0].context.id()));
        crate::rescue::kill_heartbeat(db, dying.node_id());
        let config = small_config()
            .heartbeat(Duration::from_secs(3600))
            .dead_after(Duration::from_secs(7200))
            .metrics_addr(any_port());
        let survivor = Worker::new(&db.url, crate::ledger_registry("ledger"), config).unwrap();
        let report = survivor.rescue_once().unwrap();
        assert_eq!((report.pending, report.dead), (1, 1));
        let e = scrape(survivor.metrics_addr().unwrap());
        let rescued = |to: &str| e.value("outbox_tasks_rescued_total", &[("keyword", "ledger"), ("to", to)]);
        assert_eq!(rescued("pending"), Some(1.0));
        assert_eq!(rescued("dead"), Some(1.0));
    }

    fn healthz_is_200_while_the_heartbeat_is_fresh_and_503_once_it_is_not(db: &TestDb) {
        let config = small_config()
            .heartbeat(Duration::from_millis(100))
            .dead_after(Duration::from_millis(300))
            .metrics_addr(any_port());
        let worker = Worker::new(&db.url, crate::ledger_registry("ledger"), config).unwrap();
        let addr = worker.metrics_addr().unwrap();
        let node = worker.node_id();
        let (status, body) = get(addr, "/healthz");
        assert_eq!(status, 200, "{body}");
        assert!(body.starts_with(&format!("ok: node {node} heartbeat")), "{body}");
        // The node table is out of reach: every heartbeat fails from now on.
        db.exec("ALTER TABLE async_node RENAME TO async_node_away");
        let give_up = Instant::now() + Duration::from_secs(20);
        let body = loop {
            let (status, body) = get(addr, "/healthz");
            if status == 503 {
                break body;
            }
            assert_eq!(status, 200, "{body}");
            assert!(Instant::now() < give_up, "still healthy: {body}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(body.starts_with(&format!("stale: node {node} last heartbeat")), "{body}");
        assert!(body.contains("dead after 0.3s"), "{body}");
        let e = scrape(addr);
        let age = e.value("outbox_node_heartbeat_age_seconds", &[("node", &node.to_string())]).unwrap();
        assert!(age >= 0.3, "heartbeat age {age}");
        // Heartbeats succeed again: healthy at the next one.
        db.exec("ALTER TABLE async_node_away RENAME TO async_node");
        let give_up = Instant::now() + Duration::from_secs(20);
        while get(addr, "/healthz").0 != 200 {
            assert!(Instant::now() < give_up, "not healthy again");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(get(addr, "/nothing-here").0, 404);
    }

    fn an_address_in_use_fails_the_start_naming_it_and_registers_no_node(db: &TestDb) {
        let taken = std::net::TcpListener::bind(any_port()).unwrap();
        let addr = taken.local_addr().unwrap();
        let config = small_config().metrics_addr(addr);
        let err = Worker::new(&db.url, crate::ledger_registry("ledger"), config).err().expect("refused");
        assert!(matches!(&err, Error::MetricsServer { addr: a, .. } if *a == addr.to_string()), "{err:?}");
        assert!(err.to_string().starts_with(&format!("cannot serve metrics on {addr}: ")), "{err}");
        assert_eq!(db.count("SELECT count(*) FROM async_node"), 0);
    }
}

/// PostgreSQL: a scrape never waits on the table's count for long. Once the figures are stale,
/// a scrape asks for a new read and waits for it at most a second; a read held up (here by a
/// lock on the table, as a long migration or a slow count of a big table would) leaves the
/// scrape the last figures, their age showing it, and the read lands for a later scrape.
#[test]
fn a_scrape_serves_the_last_figures_while_the_tables_read_is_held_up() {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;

    let db = &TestDb::postgres();
    outbox::enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap();
    let config = small_config().metrics_addr(any_port());
    let worker = Worker::new(&db.url, crate::ledger_registry("ledger"), config).unwrap();
    let addr = worker.metrics_addr().unwrap();
    let first = scrape(addr);
    assert_eq!(
        first.value("outbox_queue_depth", &[("keyword", "ledger")]),
        Some(1.0)
    );
    // Stale: older than the sample interval.
    std::thread::sleep(outbox::metrics::SAMPLE_INTERVAL + Duration::from_millis(200));
    let mut holder = db.conn();
    holder
        .transaction(|conn| -> diesel::QueryResult<()> {
            conn.batch_execute("LOCK TABLE async_task IN ACCESS EXCLUSIVE MODE")?;
            let status = crate::siege::answered_within(addr, "/metrics", Duration::from_secs(4));
            assert_eq!(status, Ok(200), "the scrape waited on the held-up read");
            let served = scrape(addr);
            let age = served
                .value("outbox_metrics_sample_age_seconds", &[])
                .unwrap();
            assert!(age > 5.0, "the last figures, {age} s old");
            assert_eq!(
                served.value("outbox_queue_depth", &[("keyword", "ledger")]),
                Some(1.0)
            );
            Ok(())
        })
        .unwrap();
    // The read lands once the lock goes.
    let fresh = scrape_until(addr, "fresh figures", |e| {
        e.value("outbox_metrics_sample_age_seconds", &[])
            .is_some_and(|age| age < 5.0)
    });
    assert_eq!(
        fresh.value("outbox_queue_depth", &[("keyword", "ledger")]),
        Some(1.0)
    );
}
