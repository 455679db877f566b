//! Fair claiming across tenants: each claim shares its page between the tenants with tasks
//! due (and the tasks without a tenant) in proportion to their weights, visiting the tenants
//! in turn; within a tenant the claim order is unchanged.

use std::collections::HashMap;
use std::time::Duration;

use outbox::{
    enqueue_batch, set_tenant, ClaimStyle, NewTask, Registry, TaskContext, TaskTx, TenantLimits,
    Worker, WorkerConfig,
};

use crate::TestDb;

const PAGE: usize = 40;

fn noop_registry() -> Registry {
    let mut registry = Registry::new();
    registry.register("job", |_: &TaskContext, _: &mut TaskTx| Ok(()));
    registry
}

fn worker(db: &TestDb) -> Worker {
    worker_with_page(db, PAGE)
}

fn worker_with_page(db: &TestDb, page: usize) -> Worker {
    let config = WorkerConfig::default().threads(4).queue(64).page_size(page);
    Worker::new(&db.url, noop_registry(), config).unwrap()
}

/// `n` tasks of `tenant` (`None`: without one), enqueued in one batch, `tag` in their ids.
fn enqueue(db: &TestDb, tenant: Option<&str>, tag: &str, n: usize) {
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| {
            let task = NewTask::new("job", format!("{tag}-{i:05}"));
            match tenant {
                Some(t) => task.tenant(t),
                None => task,
            }
        })
        .collect();
    enqueue_batch(&mut db.conn(), &tasks).unwrap();
}

fn weigh(db: &TestDb, tenant: &str, weight: i32) {
    let limits = TenantLimits::default().weight(weight);
    set_tenant(&mut db.conn(), tenant, &limits, "test").unwrap();
}

/// Claims `claims` pages; returns how many tasks each tenant (`""`: none) got.
fn claim_pages(worker: &Worker, claims: usize) -> HashMap<String, usize> {
    claim_pages_apart(worker, claims, Duration::ZERO)
}

/// [`claim_pages`], each claim at least `apart` after the one before.
fn claim_pages_apart(worker: &Worker, claims: usize, apart: Duration) -> HashMap<String, usize> {
    let mut got = HashMap::new();
    for _ in 0..claims {
        std::thread::sleep(apart);
        for task in worker.claim().unwrap() {
            *got.entry(task.context.tenant().unwrap_or_default().to_owned())
                .or_default() += 1;
        }
    }
    got
}

/// Makes the tasks `tag` older than any other by `minutes`, keeping their order.
fn backdate(db: &TestDb, tag: &str, minutes: i64) {
    let sql = match db.backend() {
        outbox::Backend::Postgres => format!(
            "UPDATE async_task SET run_at = run_at - interval '{minutes} minutes' WHERE biz_id LIKE '{tag}-%'"
        ),
        outbox::Backend::Sqlite => format!(
            "UPDATE async_task SET run_at = strftime('%Y-%m-%d %H:%M:%f', run_at, '-{minutes} minutes') WHERE biz_id LIKE '{tag}-%'"
        ),
        outbox::Backend::Mysql => format!(
            "UPDATE async_task SET run_at = run_at - INTERVAL {minutes} MINUTE WHERE biz_id LIKE '{tag}-%'"
        ),
    };
    db.exec(&sql);
}

every_backend! {
    fn two_saturated_tenants_are_served_in_proportion_to_their_weights(db: &TestDb) {
        weigh(db, "heavy", 3);
        enqueue(db, Some("heavy"), "h", 2000);
        enqueue(db, Some("light"), "l", 2000);
        // The light tenant's tasks are the oldest: age alone would serve it first.
        backdate(db, "l", 10);
        let got = claim_pages(&worker(db), 25);
        let (heavy, light) = (got["heavy"], got["light"]);
        assert_eq!(heavy + light, 25 * PAGE, "{got:?}");
        let ratio = heavy as f64 / light as f64;
        assert!((2.7..=3.3).contains(&ratio), "served {heavy}:{light}, ratio {ratio:.2}, not 3:1 ±10%");
    }

    fn a_small_tenant_is_served_by_the_next_claim_behind_a_large_backlog(db: &TestDb) {
        enqueue(db, Some("big"), "big", 3000);
        backdate(db, "big", 10);
        enqueue(db, Some("small"), "small", 5);
        enqueue(db, None, "plain", 5);
        let got = claim_pages(&worker(db), 1);
        assert_eq!(got.get("small"), Some(&5), "{got:?}");
        assert_eq!(got.get(""), Some(&5), "tasks without a tenant: {got:?}");
        assert_eq!(got.get("big"), Some(&(PAGE - 10)), "the rest of the page: {got:?}");
    }

    fn a_limited_tenant_is_served_by_the_next_claim_behind_another_limited_ones_backlog(db: &TestDb) {
        // Both with a max_running (claimed apart from the fair page, the limited tenants in
        // an order that turns from claim to claim): the older backlog of one takes no more
        // than one claim from the other.
        for tenant in ["big", "small"] {
            let limits = TenantLimits::default().max_running(Some(1000));
            set_tenant(&mut db.conn(), tenant, &limits, "test").unwrap();
        }
        enqueue(db, Some("big"), "big", 300);
        backdate(db, "big", 10);
        enqueue(db, Some("small"), "small", 5);
        let got = claim_pages(&worker(db), 2);
        assert_eq!(got.get("small"), Some(&5), "{got:?}");
    }

    fn within_a_tenant_tasks_are_claimed_in_claim_order(db: &TestDb) {
        enqueue(db, Some("a"), "a", 100);
        enqueue(db, Some("b"), "b", 100);
        // a-00050 and after first, by priority.
        db.exec("UPDATE async_task SET priority = -1 WHERE biz_id >= 'a-00050' AND tenant = 'a'");
        let worker = worker(db);
        let mut order: Vec<String> = Vec::new();
        for _ in 0..3 {
            let mut page = worker.claim().unwrap();
            page.retain(|t| t.context.tenant() == Some("a"));
            order.extend(page.into_iter().map(|t| t.context.biz_id().to_owned()));
        }
        let expected: Vec<String> = (50..100).chain(0..100).take(order.len()).map(|i| format!("a-{i:05}")).collect();
        assert!(order.len() >= 50, "{order:?}");
        assert_eq!(order, expected);
    }

    fn every_tenant_gets_a_turn_when_there_are_more_tenants_than_the_page(db: &TestDb) {
        // 120 tenants of 3 tasks, pages of 40: each claim serves 40 tenants one task each,
        // the next claim the next 40.
        let tasks: Vec<NewTask> = (0..360)
            .map(|i| NewTask::new("job", format!("t-{i:05}")).tenant(format!("tenant-{:03}", i % 120)))
            .collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let worker = worker(db);
        let got = claim_pages(&worker, 3);
        assert_eq!(got.len(), 120, "tenants served: {}", got.len());
        assert!(got.values().all(|&n| n == 1), "{got:?}");
        let got = claim_pages(&worker, 3);
        assert!(got.len() == 120 && got.values().all(|&n| n == 1), "{got:?}");
    }

    fn a_tenant_with_only_delayed_tasks_takes_no_share_of_the_page(db: &TestDb) {
        let later: Vec<NewTask> = (0..100)
            .map(|i| NewTask::new("job", format!("later-{i:05}")).tenant("later").delay(std::time::Duration::from_secs(3600)))
            .collect();
        enqueue_batch(&mut db.conn(), &later).unwrap();
        enqueue(db, Some("now"), "now", 100);
        let got = claim_pages(&worker(db), 1);
        assert_eq!(got.get("now"), Some(&PAGE), "{got:?}");
        assert_eq!(got.get("later"), None, "{got:?}");
    }

    fn tenants_with_a_max_running_keep_it_beside_the_fair_claim(db: &TestDb) {
        set_tenant(&mut db.conn(), "capped", &TenantLimits::default().max_running(Some(3)), "test").unwrap();
        enqueue(db, Some("capped"), "c", 100);
        enqueue(db, Some("free"), "f", 100);
        let worker = worker(db);
        worker.heartbeat_once().unwrap();
        let got = claim_pages(&worker, 2);
        assert_eq!(got.get("capped"), Some(&3), "{got:?}");
        assert_eq!(got.get("free"), Some(&(2 * PAGE - 3)), "{got:?}");
    }
}

/// Lock claims (PostgreSQL, batched) take the same fair choice, chunk by chunk.
#[test]
fn lock_claims_serve_tenants_in_proportion_to_their_weights() {
    let db = &TestDb::postgres();
    weigh(db, "heavy", 3);
    enqueue(db, Some("heavy"), "h", 2000);
    enqueue(db, Some("light"), "l", 2000);
    backdate(db, "l", 10);
    let config = WorkerConfig::default()
        .threads(2)
        .page_size(PAGE)
        .commit_batch(PAGE)
        .claim_style(ClaimStyle::Lock);
    let worker = Worker::new(&db.url, noop_registry(), config).unwrap();
    for _ in 0..25 {
        worker.run_once().unwrap();
    }
    let done = |tenant: &str| {
        db.count(&format!(
            "SELECT count(*) FROM async_task WHERE state = 'done' AND tenant = '{tenant}'"
        ))
    };
    let (heavy, light) = (done("heavy"), done("light"));
    assert!(heavy + light >= 20 * PAGE as i64, "{heavy} + {light}");
    let ratio = heavy as f64 / light as f64;
    assert!(
        (2.7..=3.3).contains(&ratio),
        "done {heavy}:{light}, ratio {ratio:.2}, not 3:1 ±10%"
    );
}

every_backend! {
    fn a_tenant_that_comes_while_another_is_alone_is_served_within_two_claims(db: &TestDb) {
        // After a claim that found one participant, the next claims take its tasks alone (a
        // cheaper statement on PostgreSQL) until one finds another participant pending; they
        // ask at most every 10 ms, so the claims here are 10 ms apart.
        let apart = Duration::from_millis(10);
        enqueue(db, Some("first"), "first", 2000);
        let worker = worker(db);
        let got = claim_pages(&worker, 2);
        assert_eq!(got.keys().collect::<Vec<_>>(), ["first"], "{got:?}");
        enqueue(db, Some("second"), "second", 5);
        let got = claim_pages_apart(&worker, 2, apart);
        assert_eq!(got.get("second"), Some(&5), "{got:?}");
        // And tasks without a tenant behind a tenant alone.
        let got = claim_pages(&worker, 2);
        assert_eq!(got.keys().collect::<Vec<_>>(), ["first"], "{got:?}");
        enqueue(db, None, "late", 5);
        let got = claim_pages_apart(&worker, 2, apart);
        assert_eq!(got.get(""), Some(&5), "{got:?}");
    }

    fn a_tenant_alone_that_gets_a_max_running_is_held_to_it_at_once(db: &TestDb) {
        enqueue(db, Some("solo"), "solo", 500);
        let worker = worker(db);
        assert_eq!(claim_pages(&worker, 2).get("solo"), Some(&(2 * PAGE)));
        set_tenant(&mut db.conn(), "solo", &TenantLimits::default().max_running(Some(2 * PAGE as i32 + 3)), "test").unwrap();
        worker.heartbeat_once().unwrap();
        assert_eq!(claim_pages(&worker, 3).get("solo"), Some(&3), "the limit holds");
    }
}

every_backend! {
    fn a_weight_below_1_is_refused_and_nothing_is_written(db: &TestDb) {
        for weight in [0, -3] {
            let refused = set_tenant(&mut db.conn(), "acme", &TenantLimits::default().weight(weight), "test");
            assert!(
                matches!(&refused, Err(outbox::Error::InvalidConfig { setting: "weight", reason }) if reason.contains(&weight.to_string())),
                "{refused:?}"
            );
        }
        assert_eq!(db.count("SELECT count(*) FROM async_tenant"), 0);
        assert_eq!(db.count("SELECT count(*) FROM async_audit"), 0);
        weigh(db, "acme", 2);
        assert_eq!(db.count("SELECT count(*) FROM async_tenant WHERE weight = 2"), 1);
    }
}

every_backend! {
    fn a_node_that_found_nothing_claims_a_tenant_that_comes_later(db: &TestDb) {
        // An empty claim leaves the node watching the tasks without a tenant alone; an empty
        // watch asks whether anyone else has tasks.
        let worker = worker(db);
        assert!(claim_pages(&worker, 1).is_empty());
        enqueue(db, Some("late"), "late", 5);
        let got = claim_pages_apart(&worker, 2, Duration::from_millis(10));
        assert_eq!(got.get("late"), Some(&5), "{got:?}");
    }

    fn a_tenant_that_comes_after_another_ran_dry_is_claimed(db: &TestDb) {
        enqueue(db, Some("first"), "first", 50);
        let worker = worker(db);
        let got = claim_pages(&worker, 3);
        assert_eq!(got.get("first"), Some(&50), "{got:?}");
        std::thread::sleep(Duration::from_millis(1100)); // past the second of fair claims
        assert!(claim_pages(&worker, 2).is_empty());
        enqueue(db, Some("second"), "second", 5);
        let got = claim_pages_apart(&worker, 2, Duration::from_millis(10));
        assert_eq!(got.get("second"), Some(&5), "{got:?}");
    }
}

every_backend! {
    fn tenants_with_only_delayed_tasks_never_hold_the_ring_back(db: &TestDb) {
        // More tenants with only delayed tasks than one statement of the claim walks (twice
        // its page), all before the one with tasks due: the same claim goes on past them.
        let later: Vec<NewTask> = (0..100)
            .map(|i| NewTask::new("job", format!("later-{i:03}")).tenant(format!("d{i:03}")).delay(Duration::from_secs(3600)))
            .collect();
        enqueue_batch(&mut db.conn(), &later).unwrap();
        enqueue(db, Some("zz"), "zz", 5);
        let got = claim_pages(&worker(db), 1);
        assert_eq!(got.get("zz"), Some(&5), "{got:?}");
    }

    fn pages_of_one_task_still_take_turns(db: &TestDb) {
        // Each claim takes one task: the passes carry the shares from claim to claim, so an
        // older backlog without a tenant does not win every time.
        enqueue(db, None, "plain", 30);
        backdate(db, "plain", 10);
        enqueue(db, Some("t"), "t", 30);
        let got = claim_pages(&worker_with_page(db, 1), 20);
        assert_eq!((got.get(""), got.get("t")), (Some(&10), Some(&10)), "{got:?}");
    }

    fn pages_of_one_task_serve_weights_3_to_1(db: &TestDb) {
        weigh(db, "heavy", 3);
        enqueue(db, Some("heavy"), "h", 100);
        enqueue(db, Some("light"), "l", 100);
        backdate(db, "l", 10);
        let got = claim_pages(&worker_with_page(db, 1), 40);
        assert_eq!((got.get("heavy"), got.get("light")), (Some(&30), Some(&10)), "{got:?}");
    }
}

/// One task of keyword `keyword` for each of `n` tenants `<prefix>000`…, delayed an hour
/// when `delayed`.
fn one_task_per_tenant(db: &TestDb, prefix: &str, n: usize, keyword: &str, delayed: bool) {
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| {
            let task =
                NewTask::new(keyword, format!("{prefix}-{i:05}")).tenant(format!("{prefix}{i:03}"));
            if delayed {
                task.delay(Duration::from_secs(3600))
            } else {
                task
            }
        })
        .collect();
    enqueue_batch(&mut db.conn(), &tasks).unwrap();
}

every_backend! {
    fn drain_reaches_due_tenants_behind_more_idle_tenants_than_a_claim_walks(db: &TestDb) {
        // 300 tenants with a pending task this node may not run now (delayed, or of a
        // keyword it does not serve), more than one statement of the claim walks (twice its
        // page of 40), all before `zz`, whose task is due.
        one_task_per_tenant(db, "d", 150, "job", true);
        one_task_per_tenant(db, "o", 150, "other", false);
        enqueue(db, Some("zz"), "zz", 1);
        let worker = worker(db);
        assert_eq!(worker.drain().unwrap().tally.done, 1, "zz's task");
        // From wherever its ring stopped, the same node reaches tenants on both sides of it.
        enqueue(db, Some("a"), "a", 1);
        enqueue(db, Some("m"), "m", 1);
        enqueue(db, Some("zzz"), "zzz", 1);
        assert_eq!(worker.drain().unwrap().tally.done, 3);
        // A new process starts its ring from the first tenant: one claim (a poll of `run`)
        // still reaches the last.
        enqueue(db, Some("zzzz"), "zzzz", 1);
        assert_eq!(worker_with_page(db, 1).run_once().unwrap().done, 1);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'done'"), 5);
    }

    fn drain_claims_a_tenant_that_came_while_the_node_served_another_alone(db: &TestDb) {
        // The node's claims take a tenant found alone by itself; when its tasks run out, the
        // claim that finds another tenant pending is followed by a fair one at once.
        enqueue(db, Some("first"), "first", 50);
        let worker = worker(db);
        assert_eq!(worker.drain().unwrap().tally.done, 50);
        enqueue(db, Some("second"), "second", 5);
        assert_eq!(worker.drain().unwrap().tally.done, 5);
    }
}

/// Lock claims (PostgreSQL, batched): a chunk's claim walks fewer tenants (its window is the
/// chunk), and goes on as far as the stamping claim does.
#[test]
fn lock_claims_drain_reaches_due_tenants_behind_idle_ones() {
    let db = &TestDb::postgres();
    one_task_per_tenant(db, "d", 100, "job", true);
    enqueue(db, Some("zz"), "zz", 1);
    let config = WorkerConfig::default()
        .threads(2)
        .page_size(PAGE)
        .commit_batch(20)
        .claim_style(ClaimStyle::Lock);
    let worker = Worker::new(&db.url, noop_registry(), config.clone()).unwrap();
    assert_eq!(worker.drain().unwrap().tally.done, 1, "zz's task");
    enqueue(db, Some("a"), "a", 1);
    enqueue(db, Some("zzz"), "zzz", 1);
    assert_eq!(worker.drain().unwrap().tally.done, 2);
    enqueue(db, Some("zzzz"), "zzzz", 1);
    let fresh = Worker::new(&db.url, noop_registry(), config).unwrap();
    assert_eq!(fresh.run_once().unwrap().done, 1);
}

/// A lap of the ring is kept in the database's order of tenants, whatever its collation:
/// here one that sorts capitals among small letters, where bytes put every capital first.
#[test]
fn a_lap_follows_the_databases_order_of_tenants() {
    let db = &TestDb::postgres();
    db.exec(r#"ALTER TABLE async_task ALTER COLUMN tenant TYPE text COLLATE "en-US-x-icu""#);
    one_task_per_tenant(db, "a", 100, "job", true);
    one_task_per_tenant(db, "z", 100, "job", true);
    enqueue(db, Some("M"), "M", 1);
    let worker = worker(db);
    assert_eq!(worker.drain().unwrap().tally.done, 1, "M's task");
    for tenant in ["B", "b0", "N", "Y", "zz"] {
        enqueue(db, Some(tenant), tenant, 1);
    }
    assert_eq!(worker.drain().unwrap().tally.done, 5);
}

/// On MySQL the ring reads the tenant index as ranges of tenants, one seek per tenant where
/// the optimizer finds it cheaper (a loose index scan, `Using index for group-by`), whatever
/// the backlog of tasks without a tenant. As a recursive step probing the next
/// tenant after the one before, MariaDB read it as a `ref` on `state` alone: every pending
/// task without a tenant, and those of the tenants before, at every step of the ring (with
/// 300,000 such tasks and three tenants, the ring read about 700,000 index entries of the
/// 1,060,016 rows one claim's statement examined).
#[cfg(feature = "mysql")]
#[test]
fn the_ring_reads_the_tenant_index_one_seek_per_tenant_on_mysql() {
    let db = &TestDb::mysql();
    enqueue(db, None, "plain", 50);
    for t in ["t1", "t2", "t3"] {
        enqueue(db, Some(t), t, 5);
    }
    // Stamp claims, and lock claims (batched mode's default), which pick alike.
    let lock = WorkerConfig::default()
        .threads(4)
        .queue(0)
        .commit_batch(10)
        .claim_style(ClaimStyle::Lock);
    for w in [
        worker(db),
        Worker::new(&db.url, noop_registry(), lock).unwrap(),
    ] {
        let plan = w.claim_plan().unwrap();
        let tenant_index: Vec<&String> = plan
            .iter()
            .filter(|line| line.contains("key=async_task_pending_tenant_idx"))
            .collect();
        assert!(
            tenant_index
                .iter()
                .any(|line| line.contains("Using index for group-by")),
            "{:?}: no loose scan of the tenant index: {plan:#?}",
            w.claim_style()
        );
        for line in tenant_index {
            assert!(
                line.contains("type=range"),
                "a read of the tenant index that is not a range of tenants: {line}\n{plan:#?}"
            );
        }
    }
}

/// MySQL compares tenants with PAD SPACE (`' '` equals `''`, `'a '` equals `'a'`), while a
/// claim tells a lap's start from where it goes on byte for byte. A lap begun after `''`
/// meets the tenant `' '` last; when the ring is cut there, the next claim goes on after `' '`
/// in the lap begun at `''`, which the database finds already done: the claim ends. Read as
/// a new lap instead, the ring walked the same tenants again and was cut at `' '` again, and
/// `claim` never returned (found by a differential test of the ring against its recursive
/// form).
#[cfg(feature = "mysql")]
#[test]
fn a_lap_that_ends_at_a_tenant_equal_to_its_start_ends_on_mysql() {
    let db = &TestDb::mysql();
    // A page of 16: the ring walks 32 tenants a statement. 31 tenants and `' '`, each with
    // only a delayed task: every statement comes back short, cut at its bound.
    let tasks: Vec<NewTask> = (0..31)
        .map(|i| {
            NewTask::new("job", format!("t{i:02}"))
                .tenant(format!("t{i:02}"))
                .delay(Duration::from_secs(3600))
        })
        .collect();
    enqueue_batch(&mut db.conn(), &tasks).unwrap();
    // The API refuses a tenant that ends with a space; a producer's plain INSERT may write one.
    db.exec(
        "INSERT INTO async_task (keyword, biz_id, tenant, run_at)
         VALUES ('job', 'space', ' ', UTC_TIMESTAMP(3) + INTERVAL 1 HOUR)",
    );
    let w = worker_with_page(db, 16);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(w.claim().map(|page| page.len()));
    });
    let claimed = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the claim returns: its lap ends")
        .unwrap();
    assert_eq!(claimed, 0, "nothing is due");
}
