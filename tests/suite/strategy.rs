//! Claim strategies: an `id_hash` or `weight` node claims the tasks of its share of the ids
//! (and any task due for longer than its grace period), its share following the live nodes;
//! a `least_count` node stops claiming past the least-loaded node plus its slack. Other live
//! nodes are real `async_node` rows with fresh heartbeats, as a node's own beat writes them.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use diesel::prelude::*;
use outbox::{
    enqueue_batch, set_tenant, Backend, ClaimStyle, Error, HandlerResult, NewTask, Registry,
    Strategy, TaskContext, TaskTx, TenantLimits, Worker, WorkerConfig,
};

use crate::ledger_registry;
use crate::support::TestDb;

/// Room for a few hundred tasks per claim; peers live for a minute, so that the test's own
/// rows stay live without beating, and the grace is that minute.
fn config(strategy: Strategy) -> WorkerConfig {
    WorkerConfig::default()
        .threads(2)
        .queue(200)
        .page_size(500)
        .dead_after(Duration::from_secs(60))
        .strategy(strategy)
}

/// Another live node: a row of `async_node` as its heartbeat leaves it. Returns its id.
fn peer(db: &TestDb, strategy: &str, weight: i32, running: i64) -> i64 {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }
    let insert = format!(
        "INSERT INTO async_node (name, strategy, weight, running)
         VALUES ('peer', '{strategy}', {weight}, {running})"
    );
    let mut conn = db.conn();
    if db.backend() == Backend::Mysql {
        // No RETURNING: the id the connection's insert was given.
        diesel::sql_query(insert).execute(&mut conn).unwrap();
        return diesel::sql_query("SELECT CAST(LAST_INSERT_ID() AS SIGNED) AS id")
            .get_result::<Id>(&mut conn)
            .unwrap()
            .id;
    }
    diesel::sql_query(format!("{insert} RETURNING id"))
        .get_result::<Id>(&mut conn)
        .unwrap()
        .id
}

/// `n` ledger tasks (`tag-i`), of `tenant` if given.
fn enqueue(db: &TestDb, tag: &str, n: usize, tenant: Option<&str>) {
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| {
            let task = NewTask::new("ledger", format!("{tag}-{i}"));
            match tenant {
                Some(t) => task.tenant(t),
                None => task,
            }
        })
        .collect();
    enqueue_batch(&mut db.conn(), &tasks).unwrap();
}

/// The ids of `SELECT id AS n …`.
fn ids(db: &TestDb, sql: &str) -> Vec<i64> {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(sql)
        .load::<N>(&mut db.conn())
        .unwrap()
        .into_iter()
        .map(|r| r.n)
        .collect()
}

fn done_ids(db: &TestDb) -> Vec<i64> {
    ids(
        db,
        "SELECT id AS n FROM async_task WHERE state = 'done' ORDER BY id",
    )
}

/// Moves the pending tasks' `run_at` back by `minutes`: they have been due that long.
fn backdate_pending(db: &TestDb, minutes: i64) {
    db.exec(&match db.backend() {
        Backend::Postgres => format!(
            "UPDATE async_task SET run_at = run_at - interval '{minutes} minutes' WHERE state = 'pending'"
        ),
        Backend::Sqlite => format!(
            "UPDATE async_task SET run_at = strftime('%Y-%m-%d %H:%M:%f', run_at, '-{minutes} minutes') WHERE state = 'pending'"
        ),
        Backend::Mysql => format!(
            "UPDATE async_task SET run_at = run_at - INTERVAL {minutes} MINUTE WHERE state = 'pending'"
        ),
    });
}

/// Asserts that exactly the tasks `0..n` (by position among the pending ones when the
/// drain started) whose id is owned by `(modulus, lo..hi)` were run.
fn assert_ran_exactly_its_share(db: &TestDb, all: &[i64], modulus: i64, lo: i64, hi: i64) {
    let mine: Vec<i64> = all
        .iter()
        .copied()
        .filter(|id| (lo..hi).contains(&(id % modulus)))
        .collect();
    assert!(!mine.is_empty());
    assert_eq!(done_ids(db), mine, "mod {modulus}, owning {lo}..{hi}");
    assert_eq!(
        db.count("SELECT count(*) FROM test_ledger"),
        mine.len() as i64
    );
}

every_backend! {
    fn an_id_hash_node_claims_only_the_tasks_of_its_position(db: &TestDb) {
        let first = peer(db, "id_hash", 1, 0);
        let w = Worker::new(&db.url, ledger_registry("ledger"), config(Strategy::IdHash)).unwrap();
        let last = peer(db, "id_hash", 1, 0);
        // A default node and a least_count node take no share.
        peer(db, "default", 1, 0);
        peer(db, "least_count", 1, 0);
        assert!(first < w.node_id() && w.node_id() < last);
        w.heartbeat_once().unwrap();
        enqueue(db, "a", 90, None);
        let all = ids(db, "SELECT id AS n FROM async_task ORDER BY id");
        // Second of three by node id: the ids with remainder 1 modulo 3, and nothing else,
        // however many claims it makes.
        let tally = w.drain().unwrap().tally;
        assert_eq!(tally.done, 30, "{tally:?}");
        assert_ran_exactly_its_share(db, &all, 3, 1, 2);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'pending'"), 60);
        // It published what it is.
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) FROM async_node WHERE id = {} AND strategy = 'id_hash' AND weight = 1",
                w.node_id()
            )),
            1
        );
    }

    fn a_weight_node_owns_ids_in_proportion_to_its_weight(db: &TestDb) {
        // Weights 2 (an id_hash node weighs 1 whatever its row says), 3 (this one), 1.
        peer(db, "weight", 2, 0);
        let w = Worker::new(&db.url, ledger_registry("ledger"), config(Strategy::Weight).weight(3))
            .unwrap();
        peer(db, "id_hash", 7, 0);
        w.heartbeat_once().unwrap();
        enqueue(db, "w", 120, None);
        let all = ids(db, "SELECT id AS n FROM async_task ORDER BY id");
        assert_eq!(w.drain().unwrap().tally.done, 60, "3 of every 6 ids");
        assert_ran_exactly_its_share(db, &all, 6, 2, 5);
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) FROM async_node WHERE id = {} AND strategy = 'weight' AND weight = 3",
                w.node_id()
            )),
            1
        );
    }

    fn ownership_moves_when_nodes_leave_and_join(db: &TestDb) {
        let w = Worker::new(&db.url, ledger_registry("ledger"), config(Strategy::IdHash)).unwrap();
        let second = peer(db, "id_hash", 1, 0);
        let third = peer(db, "id_hash", 1, 0);
        w.heartbeat_once().unwrap();
        enqueue(db, "x", 60, None);
        let all = ids(db, "SELECT id AS n FROM async_task ORDER BY id");
        assert_eq!(w.drain().unwrap().tally.done, 20, "first of three");
        assert_ran_exactly_its_share(db, &all, 3, 0, 1);
        // The second node stops beating (its last beat is past the dead-after); the third is
        // marked gone. Once this node's beat has read them, it is alone: every id is its.
        let silent = match db.backend() {
            Backend::Postgres => "now() - interval '2 minutes'",
            Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-2 minutes')",
            Backend::Mysql => "UTC_TIMESTAMP(3) - INTERVAL 2 MINUTE",
        };
        db.exec(&format!("UPDATE async_node SET heartbeat_at = {silent} WHERE id = {second}"));
        db.exec(&format!("UPDATE async_node SET state = 'gone' WHERE id = {third}"));
        w.heartbeat_once().unwrap();
        assert_eq!(w.drain().unwrap().tally.done, 40);
        // A node joins: this one is first of two, for the tasks enqueued next.
        peer(db, "id_hash", 1, 0);
        w.heartbeat_once().unwrap();
        enqueue(db, "y", 40, None);
        let new = ids(db, "SELECT id AS n FROM async_task WHERE state = 'pending' ORDER BY id");
        assert_eq!(w.drain().unwrap().tally.done, 20);
        let left = ids(db, "SELECT id AS n FROM async_task WHERE state = 'pending' ORDER BY id");
        let theirs: Vec<i64> = new.into_iter().filter(|id| id % 2 == 1).collect();
        assert_eq!(left, theirs);
    }

    fn a_task_of_another_node_is_claimed_by_anyone_once_due_past_the_grace(db: &TestDb) {
        let w = Worker::new(
            &db.url,
            ledger_registry("ledger"),
            config(Strategy::IdHash).strategy_grace(Duration::from_secs(60)),
        )
        .unwrap();
        // Its peer is live but never claims (a node not yet noticed dead, or without this
        // keyword's handler).
        peer(db, "id_hash", 1, 0);
        w.heartbeat_once().unwrap();
        enqueue(db, "g", 10, None);
        assert_eq!(w.drain().unwrap().tally.done, 5);
        // Due for 30 s: still the peer's.
        db.exec(&match db.backend() {
            Backend::Postgres => "UPDATE async_task SET run_at = now() - interval '30 seconds' WHERE state = 'pending'".to_owned(),
            Backend::Sqlite => "UPDATE async_task SET run_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '-30 seconds') WHERE state = 'pending'".to_owned(),
            Backend::Mysql => "UPDATE async_task SET run_at = UTC_TIMESTAMP(3) - INTERVAL 30 SECOND WHERE state = 'pending'".to_owned(),
        });
        assert_eq!(w.drain().unwrap().tally.done, 0);
        // Due for more than the grace: anyone's.
        backdate_pending(db, 1);
        assert_eq!(w.drain().unwrap().tally.done, 5);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'done'"), 10);
        assert_eq!(db.count("SELECT count(DISTINCT task_id) FROM test_ledger"), 10);
    }

    fn every_claim_path_takes_only_the_nodes_share(db: &TestDb) {
        // Tasks without a tenant, of weighted tenants (the fair claim) and of a tenant with
        // a max_running (claimed apart), under stamping claims; on PostgreSQL also under
        // lock claims; and with a domain.
        set_tenant(&mut db.conn(), "heavy", &TenantLimits::default().weight(3), "test").unwrap();
        set_tenant(&mut db.conn(), "capped", &TenantLimits::default().max_running(Some(100)), "test")
            .unwrap();
        let mut configs = vec![
            ("stamp", config(Strategy::IdHash)),
            (
                "domain",
                config(Strategy::IdHash).domain(outbox::domain::Domain::max("d", ["ledger"], 1)),
            ),
        ];
        if db.backend() == Backend::Postgres {
            configs.push((
                "lock",
                config(Strategy::IdHash)
                    .claim_style(ClaimStyle::Lock)
                    .commit_batch(5)
                    .queue(0),
            ));
        }
        for (name, config) in configs {
            db.exec("DELETE FROM async_task");
            db.exec("DELETE FROM test_ledger");
            let w = Worker::new(&db.url, ledger_registry("ledger"), config).unwrap();
            let peer = peer(db, "id_hash", 1, 0);
            w.heartbeat_once().unwrap();
            enqueue(db, "none", 40, None);
            enqueue(db, "heavy", 40, Some("heavy"));
            enqueue(db, "light", 40, Some("light"));
            enqueue(db, "capped", 40, Some("capped"));
            let all = ids(db, "SELECT id AS n FROM async_task ORDER BY id");
            let tally = w.drain().unwrap().tally;
            assert_eq!(tally.done, 80, "{name}: {tally:?}");
            assert_ran_exactly_its_share(db, &all, 2, 0, 1);
            db.exec(&format!("UPDATE async_node SET state = 'gone' WHERE id IN ({peer}, {})", w.node_id()));
        }
    }

    fn a_least_count_node_stops_claiming_past_the_least_loaded_node_plus_its_slack(db: &TestDb) {
        // Its handlers hold until the gate opens (or fail after 30 s, should the test fail
        // first), so that the tasks it claimed stay held.
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let mut registry = Registry::new();
        {
            let gate = Arc::clone(&gate);
            registry.register("held", move |_: &TaskContext, _: &mut TaskTx| -> HandlerResult {
                let (open, changed) = &*gate;
                let guard = open.lock().unwrap();
                let (guard, _) = changed
                    .wait_timeout_while(guard, Duration::from_secs(30), |open| !*open)
                    .unwrap();
                if *guard {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("the gate stayed shut").into())
                }
            });
        }
        let tasks: Vec<NewTask> = (0..20).map(|i| NewTask::new("held", i.to_string())).collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let config = config(Strategy::LeastCount).slack(2).threads(4).queue(16);
        let w = Worker::new(&db.url, registry, config).unwrap();
        let other = peer(db, "default", 1, 0);
        w.heartbeat_once().unwrap();
        std::thread::scope(|s| {
            // The other node holds nothing: a page of the slack, 2 tasks, held by handlers.
            let run = s.spawn(|| w.run_once().unwrap());
            while w.in_flight() < 2 {
                std::thread::sleep(Duration::from_millis(5));
            }
            // Holding 2, the least-loaded node's 0 plus its slack: nothing more.
            assert!(w.claim().unwrap().is_empty());
            // Its beat publishes what it holds.
            w.heartbeat_once().unwrap();
            assert_eq!(
                db.count(&format!("SELECT running FROM async_node WHERE id = {}", w.node_id())),
                2
            );
            // The other node now holds 3: this one may hold 5, so a page of 3 more.
            db.exec(&format!("UPDATE async_node SET running = 3 WHERE id = {other}"));
            w.heartbeat_once().unwrap();
            assert_eq!(w.claim().unwrap().len(), 3);
            *gate.0.lock().unwrap() = true;
            gate.1.notify_all();
            assert_eq!(run.join().unwrap().done, 2);
        });
        // Alone (the other node gone), it is not limited.
        db.exec(&format!("UPDATE async_node SET state = 'gone' WHERE id = {other}"));
        w.heartbeat_once().unwrap();
        assert_eq!(w.claim().unwrap().len(), 15);
    }

    fn a_least_count_drain_claims_small_pages_until_nothing_is_due(db: &TestDb) {
        // Held to 2 at a time by an idle peer: the drain claims as its tasks finish, and
        // ends when nothing is due.
        let w = Worker::new(&db.url, ledger_registry("ledger"), config(Strategy::LeastCount).slack(2))
            .unwrap();
        peer(db, "default", 1, 0);
        w.heartbeat_once().unwrap();
        enqueue(db, "l", 50, None);
        let tally = w.drain().unwrap().tally;
        assert_eq!(tally.done, 50, "{tally:?}");
        assert_eq!(db.count("SELECT count(DISTINCT task_id) FROM test_ledger"), 50);
    }

    fn a_default_node_publishes_what_it_holds_and_claims_anything(db: &TestDb) {
        peer(db, "id_hash", 1, 0);
        let w = Worker::new(&db.url, ledger_registry("ledger"), config(Strategy::Default)).unwrap();
        peer(db, "id_hash", 1, 0);
        w.heartbeat_once().unwrap();
        enqueue(db, "d", 30, None);
        assert_eq!(w.drain().unwrap().tally.done, 30);
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) FROM async_node WHERE id = {} AND strategy = 'default' AND running = 0",
                w.node_id()
            )),
            1
        );
    }

    fn strategy_settings_it_has_no_use_for_are_refused(db: &TestDb) {
        for (config, setting) in [
            (config(Strategy::IdHash).weight(2), "weight"),
            (config(Strategy::Weight).weight(0), "weight"),
            (config(Strategy::Weight).weight(1001), "weight"),
            (config(Strategy::Default).slack(3), "slack"),
            (config(Strategy::LeastCount).slack(0), "slack"),
            (config(Strategy::LeastCount).strategy_grace(Duration::from_secs(1)), "strategy-grace"),
            (config(Strategy::IdHash).strategy_grace(Duration::ZERO), "strategy-grace"),
        ] {
            match Worker::new(&db.url, ledger_registry("ledger"), config) {
                Err(Error::InvalidConfig { setting: s, .. }) => assert_eq!(s, setting),
                Err(e) => panic!("{setting}: {e}"),
                Ok(_) => panic!("{setting}: accepted"),
            }
        }
    }
}

/// With a partition the claim reads the table as it does without: the same scans (the claim
/// index's range scans in claim order) and sorts, the partition one more filter on the scans
/// (it passes over other nodes' tasks and sorts nothing). So for stamping and lock claims.
#[test]
fn the_claim_of_a_partitioned_node_is_the_same_plan_with_one_more_filter() {
    let db = &TestDb::postgres();
    enqueue(db, "p", 3000, None);
    db.exec("ANALYZE async_task");
    // The scans and sorts, in any order (the planner may swap a hash join's sides as its
    // estimates move).
    let shape = |plan: &str| -> Vec<String> {
        let mut lines: Vec<String> = plan
            .lines()
            .filter(|l| l.contains("Scan") || l.contains("Sort Key") || l.contains("Index Cond"))
            .map(|l| l.trim().to_owned())
            .collect();
        lines.sort();
        lines
    };
    for (name, with) in [
        ("stamp", config as fn(Strategy) -> WorkerConfig),
        ("lock", |s| {
            config(s)
                .claim_style(ClaimStyle::Lock)
                .commit_batch(20)
                .queue(0)
        }),
    ] {
        let plain =
            Worker::new(&db.url, ledger_registry("ledger"), with(Strategy::Default)).unwrap();
        let plain = plain.claim_plan().unwrap().join("\n");
        let w = Worker::new(&db.url, ledger_registry("ledger"), with(Strategy::IdHash)).unwrap();
        let peer = peer(db, "id_hash", 1, 0);
        w.heartbeat_once().unwrap();
        let plan = w.claim_plan().unwrap().join("\n");
        assert_eq!(shape(&plan), shape(&plain), "{name}:\n{plan}\n---\n{plain}");
        let scans = plan
            .matches("Index Scan using async_task_claim_idx")
            .count();
        assert!(scans >= 1, "{name}: {plan}");
        let filtered = plan
            .lines()
            .filter(|l| l.contains("Filter:") && l.contains("% '2'::bigint"))
            .count();
        assert!(
            filtered >= scans,
            "{name}: every scan of the claim index filtered: {plan}"
        );
        db.exec(&format!(
            "UPDATE async_node SET state = 'gone' WHERE id = {peer}"
        ));
    }
}

/// A `least_count` worker with a domain keeps `default`'s pace while the domain's handler
/// blocks: past half its bound it waits for its own tasks to finish, counted as tasks, and
/// `default`'s chunks ending are enough, without the blocked domain's. The blocked task is
/// claimed first, so that every later claim meets it held.
#[test]
fn a_least_count_worker_with_a_domain_waits_for_its_own_tasks_not_a_blocked_domains() {
    let db = &TestDb::postgres();
    let gate = crate::lanes::Gate::default();
    let registry = crate::lanes::registry(&gate);
    enqueue_batch(&mut db.conn(), &[NewTask::new("stuck", "stuck")]).unwrap();
    peer(db, "default", 1, 0);
    let config = config(Strategy::LeastCount)
        .slack(4)
        .queue(2)
        .commit_batch(10)
        .claim_style(ClaimStyle::Stamp)
        .listen(false)
        .poll_interval(Duration::from_millis(50))
        .domain(outbox::domain::Domain::max("slow", ["stuck"], 1));
    let w = Worker::new(&db.url, registry, config).unwrap();
    let stop = w.stop_flag();
    let done = "SELECT count(*) FROM async_task WHERE keyword = 'ledger' AND state = 'done'";
    std::thread::scope(|s| {
        let run = s.spawn(|| w.run());
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let running =
            "SELECT count(*) FROM async_task WHERE keyword = 'stuck' AND state = 'running'";
        while db.count(running) == 0 {
            assert!(std::time::Instant::now() < deadline, "stuck not claimed");
            std::thread::sleep(Duration::from_millis(10));
        }
        enqueue(db, "l", 60, None);
        while db.count(done) < 60 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let paced = db.count(done);
        crate::lanes::open(&gate);
        let settled = std::time::Instant::now() + Duration::from_secs(20);
        while db.count("SELECT count(*) FROM async_task WHERE state = 'done'") < 61
            && std::time::Instant::now() < settled
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let report = run.join().unwrap().unwrap();
        assert_eq!(
            paced, 60,
            "with the domain's handler blocked, default ran {paced} of its 60 tasks in 20 s: \
             {report:?}"
        );
        assert_eq!(report.tally.done, 61, "{report:?}");
    });
}
