//! Operators' changes of domains through the library (`outbox::domain::admin`): checked
//! against the fleet one change at a time, and inside a caller's transaction. The CLI's tests
//! (`handlers/tests/cli/domain.rs`) cover each rule and its audit.

use std::sync::{Arc, Barrier};

use outbox::domain::admin::{self, DomainChange};
use outbox::{write_transaction, Error};

use crate::TestDb;

/// A live node with 4 threads that runs only `default`, as a node publishes it.
fn four_thread_node(db: &TestDb) {
    let published = serde_json::json!({"threads": 4, "domains": [{
        "domain": "default", "mode": "max", "keywords": ["a.x", "b.x"], "threads": 4,
        "reserved": 0, "borrowed": 0, "running": 0, "queued": 0, "stuck": 0, "queue": 32,
        "timeout_ms": 300000, "paused": false, "released": false,
    }]});
    db.exec(&format!(
        "INSERT INTO async_node (name, domains) VALUES ('w1', '{published}')"
    ));
}

every_backend! {
    fn racing_changes_are_checked_one_after_the_other(db: &TestDb) {
        four_thread_node(db);
        // RESERVED 2 fits the node alone; two of them leave default no thread. However the
        // two operators race, one change is refused.
        for round in 0..10 {
            db.exec("DELETE FROM async_domain");
            let barrier = Arc::new(Barrier::new(2));
            let sets: Vec<_> = ["a", "b"]
                .into_iter()
                .map(|name| {
                    let (url, barrier) = (db.url.clone(), Arc::clone(&barrier));
                    std::thread::spawn(move || {
                        let mut conn = url.connect().expect("connect");
                        let change = DomainChange::default().keywords([format!("{name}.x")]).reserved(2);
                        barrier.wait();
                        admin::set(&mut conn, name, &change, "test")
                    })
                })
                .collect();
            let results: Vec<_> = sets.into_iter().map(|t| t.join().expect("set thread")).collect();
            let refused: Vec<&Error> = results.iter().filter_map(|r| r.as_ref().err()).collect();
            assert_eq!(refused.len(), 1, "round {round}: {results:?}");
            assert!(
                matches!(refused[0], Error::InvalidDomain { reason, .. } if reason.contains("brings the RESERVED threads to 4 of the node's 4")),
                "round {round}: {}",
                refused[0]
            );
            assert_eq!(db.count("SELECT count(*) FROM async_domain"), 1, "round {round}");
        }
    }
}

every_backend! {
    fn a_change_in_the_callers_transaction_rolls_back_with_it(db: &TestDb) {
        four_thread_node(db);
        let mut conn = db.conn();
        let result: Result<(), Error> = write_transaction(&mut conn, |conn| {
            let set = admin::set(conn, "a", &DomainChange::default().keywords(["a.x"]).max(1), "test")?;
            assert!(set.changed);
            assert!(admin::pause(conn, "b.x", "test")?.changed);
            // Seen inside the transaction…
            assert_eq!(admin::list(conn)?.iter().filter(|d| d.domain == "a").count(), 1);
            assert_eq!(admin::paused_keywords(conn)?, ["b.x"]);
            Err(Error::DomainNotFound { name: "rolled back".into() })
        });
        assert!(result.is_err());
        // …and gone with it, audit included.
        for table in ["async_domain", "async_pause", "async_audit"] {
            assert_eq!(db.count(&format!("SELECT count(*) FROM {table}")), 0, "{table}");
        }
    }
}

every_backend! {
    fn a_running_node_publishes_its_domains_and_applies_a_change_at_its_next_heartbeat(db: &TestDb) {
        use outbox::domain::{Domain, DomainMode};
        use outbox::{Registry, Worker, WorkerConfig};

        let mut registry = Registry::new();
        for keyword in ["pay.x", "mail.x"] {
            registry.register(keyword, |_: &outbox::TaskContext, _: &mut outbox::TaskTx| -> outbox::HandlerResult { Ok(()) });
        }
        let config = WorkerConfig::default().threads(4).domain(Domain::reserved("pay", ["pay.x"], 1));
        let worker = Worker::new(&db.url, registry, config).unwrap();
        worker.heartbeat_once().unwrap();
        let mut conn = db.conn();
        let pay = |conn: &mut outbox::DbConnection| {
            admin::list(conn).unwrap().into_iter().find(|d| d.domain == "pay").expect("pay listed")
        };
        let listed = pay(&mut conn);
        assert_eq!((listed.mode, listed.per_node, listed.nodes), (Some(DomainMode::Reserved), Some(1), 1));
        assert_eq!((listed.threads, listed.reserved), (1, 1));

        // Checked against what the node published: 4 reserved threads leave default none.
        let refused = admin::set(&mut conn, "pay", &DomainChange::default().reserved(4), "test").unwrap_err();
        assert!(matches!(&refused, Error::InvalidDomain { domain, .. } if domain == "pay"), "{refused}");

        let set = admin::set(&mut conn, "pay", &DomainChange::default().reserved(2), "test").unwrap();
        assert_eq!(set.nodes, 1);
        worker.heartbeat_once().unwrap();
        let listed = pay(&mut conn);
        assert_eq!((listed.threads, listed.reserved), (2, 2), "applied at the heartbeat");

        admin::release(&mut conn, "pay", "test").unwrap();
        worker.heartbeat_once().unwrap();
        let listed = pay(&mut conn);
        assert!(listed.paused && listed.released, "{listed:?}");
        assert_eq!(listed.reserved, 0, "its threads went back to default");
    }
}

every_backend! {
    fn a_paused_domain_is_held_on_nodes_that_do_not_run_it(db: &TestDb) {
        use outbox::domain::Domain;
        use outbox::{enqueue_batch, NewTask, Registry, Worker, WorkerConfig};

        let registry = || {
            let mut registry = Registry::new();
            for keyword in ["slow.x", "other.x"] {
                registry.register(keyword, |_: &outbox::TaskContext, _: &mut outbox::TaskTx| -> outbox::HandlerResult { Ok(()) });
            }
            registry
        };
        // Node `a` runs domain `slow` (its own configuration); node `b` has no such domain,
        // so `slow.x` is one of its `default` keywords.
        let a = Worker::new(&db.url, registry(), WorkerConfig::default().threads(2).domain(Domain::max("slow", ["slow.x"], 1))).unwrap();
        let b = Worker::new(&db.url, registry(), WorkerConfig::default().threads(2)).unwrap();
        a.heartbeat_once().unwrap();
        b.heartbeat_once().unwrap();
        let tasks: Vec<NewTask> = (0..5)
            .map(|i| NewTask::new("slow.x", format!("s{i}")))
            .chain((0..2).map(|i| NewTask::new("other.x", format!("o{i}"))))
            .collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();

        let mut conn = db.conn();
        let paused = admin::pause(&mut conn, "slow", "test").unwrap();
        a.heartbeat_once().unwrap();
        b.heartbeat_once().unwrap();
        assert_eq!(b.drain().unwrap().tally.done, 2, "other.x only: slow.x is held on b too");
        assert_eq!(a.drain().unwrap().tally.done, 0);
        assert_eq!(paused.nodes, 2, "both live nodes hold it");
        // A node that starts later, without the domain, holds it from the start (a plain
        // `outbox drain`).
        let c = Worker::new(&db.url, registry(), WorkerConfig::default().threads(2)).unwrap();
        assert_eq!(c.drain().unwrap().tally.claimed, 0);
        // A release holds it as a pause does.
        admin::release(&mut conn, "slow", "test").unwrap();
        c.heartbeat_once().unwrap();
        assert_eq!(c.drain().unwrap().tally.claimed, 0);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE keyword = 'slow.x' AND state = 'pending'"), 5);

        // Resumed and paused again at once, before `a` has applied the resume (a paused
        // domain's node still publishes its keywords): held as before.
        assert!(admin::resume(&mut conn, "slow", "test").unwrap().changed);
        assert_eq!(admin::pause(&mut conn, "slow", "test").unwrap().nodes, 3);
        b.heartbeat_once().unwrap();
        assert_eq!(b.drain().unwrap().tally.claimed, 0);

        // Resumed, every node runs them again.
        assert!(admin::resume(&mut conn, "slow", "test").unwrap().changed);
        b.heartbeat_once().unwrap();
        assert_eq!(b.drain().unwrap().tally.done, 5);
    }
}
