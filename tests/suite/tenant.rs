//! Tenant quotas: `max_queued` refused at enqueue (race-free across producers), `max_running`
//! held across a fleet, and the input both refuse.

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use diesel::{Connection, RunQueryDsl};
use outbox::{
    enqueue, enqueue_batch, remove_tenant, set_tenant, tenants, Backend, ClaimStyle, Error,
    HandlerResult, NewTask, Registry, TaskContext, TaskTx, TenantLimits, Worker, WorkerConfig,
};

use crate::{insert_ledger_row, ledger_registry, small_config, TestDb};

fn limit_queued(db: &TestDb, tenant: &str, n: i32) {
    set_tenant(
        &mut db.conn(),
        tenant,
        &TenantLimits::default().max_queued(Some(n)),
        "test",
    )
    .unwrap();
}

fn limit_running(db: &TestDb, tenant: &str, n: i32) {
    set_tenant(
        &mut db.conn(),
        tenant,
        &TenantLimits::default().max_running(Some(n)),
        "test",
    )
    .unwrap();
}

fn task(biz_id: &str, tenant: &str) -> NewTask {
    NewTask::new("ledger", biz_id).tenant(tenant)
}

fn is_quota(result: outbox::Result<outbox::Enqueued>, tenant: &str, limit: i64) -> bool {
    match result {
        Err(Error::QuotaExceeded {
            tenant: t,
            limit: l,
        }) => t == tenant && l == limit,
        other => panic!("expected the quota error of {tenant}, got {other:?}"),
    }
}

every_backend! {
    fn an_enqueue_past_max_queued_is_refused_naming_the_tenant_and_writes_nothing(db: &TestDb) {
        limit_queued(db, "acme", 3);
        assert!(enqueue(&mut db.conn(), &task("a0", "acme")).unwrap().created);
        // A batch that would cross the limit from below is refused whole, naming the tenant.
        let crossing = [task("a1", "acme"), task("x1", "zeta"), task("a2", "acme"), task("a9", "acme")];
        let err = enqueue_batch(&mut db.conn(), &crossing).unwrap_err();
        assert!(matches!(err, Error::QuotaExceeded { ref tenant, limit: 3 } if tenant == "acme"), "{err}");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 1);
        for i in 1..3 {
            assert!(enqueue(&mut db.conn(), &task(&format!("a{i}"), "acme")).unwrap().created);
        }
        assert!(is_quota(enqueue(&mut db.conn(), &task("a3", "acme")), "acme", 3));
        // A batch that would cross the limit writes none of its tasks.
        let batch = [task("b1", "other"), task("a4", "acme")];
        let err = enqueue_batch(&mut db.conn(), &batch).unwrap_err();
        assert!(matches!(err, Error::QuotaExceeded { ref tenant, limit: 3 } if tenant == "acme"), "{err}");
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE biz_id = 'b1'"), 0);
        // A repeat of an existing task is a duplicate, not a quota error.
        assert!(!enqueue(&mut db.conn(), &task("a0", "acme")).unwrap().created);
        // Other tenants, and tasks without a tenant, are not limited.
        assert!(enqueue(&mut db.conn(), &task("o1", "other")).unwrap().created);
        assert!(enqueue(&mut db.conn(), &NewTask::new("ledger", "n1")).unwrap().created);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE tenant = 'acme'"), 3);
        // Running tasks are not queued: a claim makes room.
        let w = Worker::new(&db.url, ledger_registry("ledger"), small_config().page_size(1))
            .unwrap();
        let claimed = w.claim().unwrap();
        assert_eq!(claimed.len(), 1);
        assert!(enqueue(&mut db.conn(), &task("a3", "acme")).unwrap().created);
        // Raising the limit, or removing it, lets more in.
        limit_queued(db, "acme", 5);
        assert!(enqueue(&mut db.conn(), &task("a5", "acme")).unwrap().created);
        set_tenant(&mut db.conn(), "acme", &TenantLimits::default().max_queued(None), "test")
            .unwrap();
        for i in 6..10 {
            assert!(enqueue(&mut db.conn(), &task(&format!("a{i}"), "acme")).unwrap().created);
        }
    }

    fn the_largest_max_queued_the_column_holds_takes_enqueues(db: &TestDb) {
        // 2147483647, "no limit to speak of": counting up to it (and one past it, to tell
        // over from at) must not overflow the column's type.
        limit_queued(db, "acme", i32::MAX);
        assert!(enqueue(&mut db.conn(), &task("a0", "acme")).unwrap().created);
        let batch = [task("a1", "acme"), task("a2", "acme")];
        assert_eq!(enqueue_batch(&mut db.conn(), &batch).unwrap().len(), 2);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE tenant = 'acme'"), 3);
    }

    fn a_quota_error_in_a_savepoint_leaves_the_producers_own_writes_to_commit(db: &TestDb) {
        limit_queued(db, "acme", 0);
        let mut conn = db.conn();
        conn.transaction(|conn| -> Result<(), diesel::result::Error> {
            diesel::RunQueryDsl::execute(
                diesel::sql_query("INSERT INTO test_ledger (task_id, note) VALUES (0, 'order')"),
                conn,
            )?;
            let refused = conn.transaction(|conn| {
                enqueue(conn, &task("o1", "acme")).map_err(|e| {
                    assert!(matches!(e, Error::QuotaExceeded { limit: 0, .. }), "{e}");
                    diesel::result::Error::RollbackTransaction
                })
            });
            assert!(refused.is_err());
            Ok(())
        })
        .unwrap();
        assert_eq!(db.ledger_rows(0), 1, "the producer's own write committed");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 0, "the task was not");
    }

    fn eight_producers_racing_on_one_tenant_never_pass_max_queued(db: &TestDb) {
        producers_race_on_one_tenant(db, None);
    }

    fn bad_tenant_input_is_refused_and_changes_nothing(db: &TestDb) {
        let mut conn = db.conn();
        let err = set_tenant(&mut conn, "acme", &TenantLimits::default().max_running(Some(-1)), "t")
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { setting: "max_running", .. }), "{err}");
        let err = set_tenant(&mut conn, "", &TenantLimits::default(), "t").unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { setting: "tenant", .. }), "{err}");
        // MySQL would take "acme " for "acme": refused on every backend.
        let err = set_tenant(&mut conn, "acme ", &TenantLimits::default(), "t").unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { setting: "tenant", .. }), "{err}");
        assert!(err.to_string().contains("trailing space"), "{err}");
        // Named to look one up, such a name passes: a row written otherwise stays reachable.
        let err = remove_tenant(&mut conn, "acme ", "t").unwrap_err();
        assert!(matches!(err, Error::TenantNotFound { .. }), "{err}");
        let err = remove_tenant(&mut conn, "nobody", "t").unwrap_err();
        assert!(matches!(err, Error::TenantNotFound { ref tenant } if tenant == "nobody"), "{err}");
        assert!(tenants(&mut conn).unwrap().is_empty());
        assert_eq!(db.count("SELECT count(*) FROM async_audit"), 0, "nothing audited");
        // A plain SQL producer is held to the same rules.
        limit_queued(db, "acme", 0);
        let plain = diesel::RunQueryDsl::execute(
            diesel::sql_query(
                "INSERT INTO async_task (keyword, biz_id, tenant) VALUES ('ledger', '1', 'acme')",
            ),
            &mut conn,
        );
        assert!(plain.is_err(), "the schema refuses it");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 0);
    }

    fn tenant_changes_are_listed_and_audited(db: &TestDb) {
        let mut conn = db.conn();
        let limits = TenantLimits::default().max_queued(Some(10)).max_running(Some(2));
        let row = set_tenant(&mut conn, "acme", &limits, "alice@host").unwrap();
        assert_eq!((row.max_queued, row.max_running, row.weight), (Some(10), Some(2), 1));
        enqueue(&mut conn, &task("1", "acme")).unwrap();
        // A limit left out keeps its value.
        let row = set_tenant(&mut conn, "acme", &TenantLimits::default().max_queued(None), "bob")
            .unwrap();
        assert_eq!((row.max_queued, row.max_running, row.queued), (None, Some(2), 1));
        assert_eq!(row.updated_by, "bob");
        let listed = tenants(&mut conn).unwrap();
        assert_eq!(listed, vec![row]);
        remove_tenant(&mut conn, "acme", "carol").unwrap();
        assert!(tenants(&mut conn).unwrap().is_empty());
        let audit = db.count(
            "SELECT count(*) FROM async_audit WHERE target = 'acme' AND affected = 1 AND (
                (actor = 'alice@host' AND action = 'tenant.set')
                OR (actor = 'bob' AND action = 'tenant.set')
                OR (actor = 'carol' AND action = 'tenant.remove'))",
        );
        assert_eq!(audit, 3);
    }

    fn max_running_holds_across_three_nodes(db: &TestDb) {
        const LIMIT: usize = 2;
        limit_running(db, "acme", LIMIT as i32);
        let tasks: Vec<NewTask> = (0..24)
            .map(|i| task(&format!("a{i}"), "acme"))
            .chain((0..24).map(|i| NewTask::new("ledger", format!("n{i}"))))
            .collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        // The tenant's handlers note when they start and stop.
        let ledger: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
        let configs = match db.backend() {
            Backend::Postgres => [
                small_config().threads(4),
                small_config().threads(4).commit_batch(4).claim_style(ClaimStyle::Stamp),
                small_config().threads(4).queue(0).commit_batch(4).claim_style(ClaimStyle::Lock),
            ],
            _ => [small_config().threads(4), small_config().threads(4), small_config().threads(4)],
        };
        let nodes: Vec<Worker> = configs
            .into_iter()
            .map(|config: WorkerConfig| {
                let ledger = Arc::clone(&ledger);
                let mut registry = Registry::new();
                registry.register("ledger", move |t: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                    let started = Instant::now();
                    std::thread::sleep(Duration::from_millis(15));
                    if t.tenant() == Some("acme") {
                        ledger.lock().unwrap().push((started, Instant::now()));
                    }
                    insert_ledger_row(t, tx.conn()?)?;
                    Ok(())
                });
                Worker::new(&db.url, registry, config).unwrap()
            })
            .collect();
        // Each node drains until nothing it may claim is due; they run until every task is
        // done (a node may stop while the tenant's slots are held by the others).
        for round in 0.. {
            if db.count("SELECT count(*) FROM async_task WHERE state <> 'done'") == 0 {
                break;
            }
            assert!(round < 20, "tasks left after {round} rounds of drains");
            std::thread::scope(|s| {
                for node in &nodes {
                    s.spawn(move || node.drain().unwrap());
                }
            });
        }
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 48, "each task ran once");
        let spans = ledger.lock().unwrap().clone();
        assert_eq!(spans.len(), 24);
        let most = spans
            .iter()
            .map(|&(start, _)| spans.iter().filter(|&&(s, e)| s <= start && start < e).count())
            .max()
            .unwrap();
        assert!(most <= LIMIT, "{most} of the tenant's handlers ran at once, over {LIMIT}");
    }

    fn a_max_running_of_zero_holds_the_tenants_tasks_until_raised(db: &TestDb) {
        enqueue(&mut db.conn(), &task("a1", "acme")).unwrap();
        enqueue(&mut db.conn(), &NewTask::new("ledger", "n1")).unwrap();
        let w = Worker::new(&db.url, ledger_registry("ledger"), small_config()).unwrap();
        // Set after the node started: it holds from the next heartbeat on.
        set_tenant(&mut db.conn(), "acme", &TenantLimits::default().max_running(Some(0)), "t")
            .unwrap();
        w.heartbeat_once().unwrap();
        assert_eq!(w.drain().unwrap().tally.done, 1);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'pending'"), 1);
        set_tenant(&mut db.conn(), "acme", &TenantLimits::default().max_running(Some(1)), "t")
            .unwrap();
        w.heartbeat_once().unwrap();
        assert_eq!(w.drain().unwrap().tally.done, 1);
    }
}

every_backend! {
    fn concurrent_claims_for_one_tenant_never_pass_max_running(db: &TestDb) {
        limit_running(db, "acme", 3);
        claims_at_once_stay_within(db, 3);
    }
}

every_backend! {
    fn neither_limited_tenants_nor_the_others_starve_each_other(db: &TestDb) {
        limit_running(db, "acme", 100);
        let backlog: Vec<NewTask> = (0..20).map(|i| task(&format!("a{i}"), "acme")).collect();
        enqueue_batch(&mut db.conn(), &backlog).unwrap();
        let plain = enqueue(&mut db.conn(), &NewTask::new("ledger", "plain").priority(5)).unwrap().id;
        let w = Worker::new(&db.url, ledger_registry("ledger"), small_config().page_size(2))
            .unwrap();
        // The limited tenant's backlog fills every page it is asked first for; the plain
        // task, however low its priority, is taken within two claims.
        let claimed: Vec<i64> = (0..2)
            .flat_map(|_| w.claim().unwrap())
            .map(|t| t.context.id())
            .collect();
        assert!(claimed.contains(&plain), "{claimed:?}");
    }
}

every_backend! {
    fn a_batch_of_several_tenants_keeps_its_order(db: &TestDb) {
        // Ids follow the batch's order whatever the tenants (a parent named by key comes
        // before its child and must get the smaller id).
        limit_queued(db, "a", 10);
        limit_queued(db, "b", 10);
        let batch = [task("b1", "b"), task("a1", "a"), task("b2", "b"), NewTask::new("ledger", "n")];
        let ids: Vec<i64> = enqueue_batch(&mut db.conn(), &batch)
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    }
}

#[test]
fn batches_of_the_same_limited_tenants_in_opposite_orders_do_not_deadlock() {
    // The quota trigger takes the tenants' locks in one order (migration 000009), whatever
    // the order of a batch's rows.
    let db = &TestDb::postgres();
    for tenant in ["a", "b", "c"] {
        limit_queued(db, tenant, 100_000);
    }
    std::thread::scope(|s| {
        for reversed in [false, true] {
            s.spawn(move || {
                let mut conn = db.conn();
                for round in 0..30 {
                    let mut tenants = ["a", "b", "c"];
                    if reversed {
                        tenants.reverse();
                    }
                    let batch: Vec<NewTask> = tenants
                        .iter()
                        .map(|t| task(&format!("{reversed}-{round}-{t}"), t))
                        .collect();
                    conn.transaction(|conn| {
                        enqueue_batch(conn, &batch).map(|_| ())?;
                        // Hold the locks a little, so that the two producers overlap.
                        diesel::sql_query("SELECT pg_sleep(0.005)").execute(conn)?;
                        Ok::<_, anyhow::Error>(())
                    })
                    .unwrap_or_else(|e| panic!("round {round}: {e:#}"));
                }
            });
        }
    });
    assert_eq!(db.count("SELECT count(*) FROM async_task"), 180);
}

crate::server_backends! {
    fn a_producers_open_transaction_does_not_hold_up_its_tenants_claims(db: &TestDb) {
        // The outbox pattern: producers enqueue in their business transactions, which may
        // stay open for a while and overlap. Their tenant's committed tasks are claimed
        // meanwhile: with both limits (a producer's enqueue locks the tenant's row for
        // `max_queued`), and with `max_running` alone for a producer at REPEATABLE READ
        // (MySQL's default, where its locking read keeps the row it read).
        let cases = [
            ("acme", TenantLimits::default().max_queued(Some(100)).max_running(Some(5)), false),
            ("bolt", TenantLimits::default().max_running(Some(5)), true),
        ];
        for (tenant, limits, repeatable_read) in cases {
            set_tenant(&mut db.conn(), tenant, &limits, "test").unwrap();
            for i in 0..3 {
                enqueue(&mut db.conn(), &task(&format!("{tenant}{i}"), tenant)).unwrap();
            }
            let w = Worker::new(&db.url, ledger_registry("ledger"), small_config()).unwrap();
            let mut producer = db.url.connect().unwrap();
            if repeatable_read {
                let isolation = match db.backend() {
                    Backend::Mysql => "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                    _ => "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                };
                diesel::sql_query(isolation).execute(&mut producer).unwrap();
            }
            producer
                .transaction(|producer| -> outbox::Result<()> {
                    enqueue(producer, &task(&format!("{tenant}-late"), tenant))?;
                    let claimed = w.claim()?;
                    assert_eq!(claimed.len(), 3, "{tenant}: its committed tasks, claimed");
                    assert_eq!(w.execute(claimed).done, 3, "{tenant}");
                    Ok(())
                })
                .unwrap();
            assert_eq!(w.drain().unwrap().tally.done, 1, "{tenant}: the producer's, once committed");
        }
    }
}

#[test]
fn limited_claims_hold_under_a_repeatable_read_default() {
    // The claim's count must come from a snapshot taken after the claim locks, whatever
    // isolation level the database gives new transactions.
    let db = &TestDb::postgres();
    let name = db.url.as_str().rsplit('/').next().unwrap().to_owned();
    db.exec(&format!(
        "ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'"
    ));
    limit_running(db, "acme", 3);
    claims_at_once_stay_within(db, 3);
}

/// Eight nodes claim at once, thirty times over, for the tenant `acme` (50 due tasks, a
/// `max_running` of `limit`): together they never claim more than the limit.
fn claims_at_once_stay_within(db: &TestDb, limit: usize) {
    let tasks: Vec<NewTask> = (0..50).map(|i| task(&format!("a{i}"), "acme")).collect();
    enqueue_batch(&mut db.conn(), &tasks).unwrap();
    let nodes: Vec<Worker> = (0..8)
        .map(|_| Worker::new(&db.url, ledger_registry("ledger"), small_config()).unwrap())
        .collect();
    for round in 0..30 {
        let start = Barrier::new(nodes.len());
        let claimed: usize = std::thread::scope(|s| {
            let handles: Vec<_> = nodes
                .iter()
                .map(|node| {
                    let start = &start;
                    s.spawn(move || {
                        start.wait();
                        node.claim().unwrap().len()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert!(
            claimed <= limit,
            "round {round}: {claimed} claimed at once, over {limit}"
        );
        db.exec("UPDATE async_task SET state = 'pending', owner = NULL WHERE state = 'running'");
    }
}

/// A bulk enqueue checks `max_queued` once per tenant, not once per row: the count of the
/// tenant's queued tasks (the rows its index scan reads) is paid once per statement.
/// (Checked per row, the 500 rows read about 125,000; the other index scans are the
/// `ON CONFLICT` probes, one a row.)
#[test]
fn a_bulk_enqueue_counts_a_tenants_queued_tasks_once() {
    use diesel::prelude::*;
    #[derive(QueryableByName)]
    struct Reads {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        idx_scan: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        idx_tup_fetch: i64,
    }
    let db = &TestDb::postgres();
    limit_queued(db, "acme", 10_000);
    let batch: Vec<NewTask> = (0..500).map(|i| task(&format!("a{i}"), "acme")).collect();
    let reads = db
        .conn()
        .transaction(|conn| {
            enqueue_batch(conn, &batch).unwrap();
            diesel::sql_query(
                "SELECT idx_scan, idx_tup_fetch FROM pg_stat_xact_user_tables \
                 WHERE relname = 'async_task'",
            )
            .get_result::<Reads>(conn)
        })
        .unwrap();
    assert_eq!(db.count("SELECT count(*) FROM async_task"), 500);
    assert!(
        reads.idx_tup_fetch <= 1_000,
        "the enqueue of 500 rows made {} index scans reading {} rows",
        reads.idx_scan,
        reads.idx_tup_fetch
    );
}

/// Eight producers enqueue 15 tasks each for the tenant `acme` (a `max_queued` of 40) at
/// once, each enqueue in a transaction of its own after a business write (and, with
/// `isolation`, on connections at that level, each transaction reading first, so that its
/// snapshot predates the others' enqueues): exactly 40 are created, the rest refused, and a
/// refused producer's transaction rolls back.
fn producers_race_on_one_tenant(db: &TestDb, isolation: Option<&'static str>) {
    const LIMIT: i64 = 40;
    limit_queued(db, "acme", LIMIT as i32);
    let start = Arc::new(Barrier::new(8));
    let producers: Vec<_> = (0..8)
        .map(|p| {
            let (url, start) = (db.url.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut conn = url.connect().unwrap();
                if let Some(level) = isolation {
                    diesel::connection::SimpleConnection::batch_execute(
                        &mut conn,
                        &format!("SET SESSION TRANSACTION ISOLATION LEVEL {level}"),
                    )
                    .unwrap();
                }
                start.wait();
                let (mut created, mut refused) = (0, 0);
                for i in 0..15 {
                    // Each in a transaction of its own with a business write, as a
                    // producer does.
                    let result = outbox::write_transaction(&mut conn, |conn| {
                        if isolation.is_some() {
                            diesel::RunQueryDsl::execute(
                                diesel::sql_query("SELECT count(*) FROM test_ledger"),
                                conn,
                            )?;
                        }
                        diesel::RunQueryDsl::execute(
                            diesel::sql_query(
                                "INSERT INTO test_ledger (task_id, note) VALUES (-1, 'order')",
                            ),
                            conn,
                        )?;
                        enqueue(conn, &task(&format!("p{p}-{i}"), "acme"))
                    });
                    match result {
                        Ok(e) if e.created => created += 1,
                        Err(Error::QuotaExceeded { limit, .. }) if limit == LIMIT => refused += 1,
                        other => panic!("producer {p}: {other:?}"),
                    }
                }
                (created, refused)
            })
        })
        .collect();
    let (mut created, mut refused) = (0, 0);
    for p in producers {
        let (c, r) = p.join().unwrap();
        created += c;
        refused += r;
    }
    assert_eq!((created, refused), (LIMIT, 120 - LIMIT));
    assert_eq!(
        db.count("SELECT count(*) FROM async_task WHERE tenant = 'acme'"),
        LIMIT
    );
    assert_eq!(
        db.ledger_rows(-1),
        LIMIT,
        "a refused producer's transaction rolled back"
    );
}

/// The race above at MySQL's own default isolation, REPEATABLE READ.
#[cfg(feature = "mysql")]
#[test]
fn eight_mysql_producers_at_repeatable_read_never_pass_max_queued() {
    producers_race_on_one_tenant(&TestDb::mysql(), Some("REPEATABLE READ"));
}

/// MySQL at its own default isolation, REPEATABLE READ: a producer whose transaction read
/// before another producer's enqueue of the same tenant committed is held to `max_queued`
/// by the newest count, not its snapshot's — for its first enqueue and for the ones after it
/// in the same transaction — through the API and through a plain INSERT alike.
#[cfg(feature = "mysql")]
#[test]
fn max_queued_holds_for_a_mysql_producer_at_repeatable_read() {
    use diesel::connection::SimpleConnection;
    let db = &TestDb::mysql();
    limit_queued(db, "acme", 2);
    let mut late = db.conn();
    late.batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .unwrap();
    late.transaction(|late| -> outbox::Result<()> {
        // The snapshot: this producer reads first (its business rows, say).
        let queued: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
            "(SELECT count(*) FROM async_task)",
        ))
        .get_result(late)?;
        assert_eq!(queued, 0);
        // Another producer's enqueue commits meanwhile.
        enqueue(&mut db.conn(), &task("first", "acme")).unwrap();
        // One more fits; the one after it does not, though this snapshot sees neither.
        enqueue(late, &task("second", "acme"))?;
        assert!(is_quota(enqueue(late, &task("third", "acme")), "acme", 2));
        let plain = late.batch_execute(
            "INSERT INTO async_task (keyword, biz_id, tenant) VALUES ('ledger', 'fourth', 'acme')",
        );
        let refused = plain.expect_err("a plain INSERT past the limit is refused too");
        assert!(
            refused.to_string().contains("over its max_queued"),
            "{refused}"
        );
        Ok(())
    })
    .unwrap();
    assert_eq!(
        db.count("SELECT count(*) FROM async_task WHERE tenant = 'acme'"),
        2
    );
}

/// The same when the limit comes after the snapshot: enqueues made while the tenant had no
/// `max_queued` were counted by nobody, and a snapshot from before the limit must not count
/// plainly. Here the tenant has a row without a limit, or had a limit it lost with its row,
/// when the producer's snapshot is taken; other producers then enqueue freely, and the limit
/// is set: the producer's enqueue is refused.
#[cfg(feature = "mysql")]
#[test]
fn max_queued_holds_for_a_mysql_producer_whose_snapshot_predates_the_limit() {
    use diesel::connection::SimpleConnection;
    for removed in [false, true] {
        let db = &TestDb::mysql();
        if removed {
            limit_queued(db, "acme", 2);
        } else {
            set_tenant(
                &mut db.conn(),
                "acme",
                &TenantLimits::default().weight(2),
                "test",
            )
            .unwrap();
        }
        let mut late = db.conn();
        late.batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .unwrap();
        late.transaction(|late| -> outbox::Result<()> {
            let queued: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                "(SELECT count(*) FROM async_task)",
            ))
            .get_result(late)?;
            assert_eq!(queued, 0);
            if removed {
                remove_tenant(&mut db.conn(), "acme", "test").unwrap();
            }
            let others = [task("a1", "acme"), task("a2", "acme"), task("a3", "acme")];
            enqueue_batch(&mut db.conn(), &others).unwrap();
            limit_queued(db, "acme", 2);
            assert!(
                is_quota(enqueue(late, &task("late", "acme")), "acme", 2),
                "removed {removed}"
            );
            Ok(())
        })
        .unwrap();
        assert_eq!(
            db.count("SELECT count(*) FROM async_task WHERE tenant = 'acme'"),
            3
        );
    }
}
