//! `demo`: the quick start, and `demo --check`; a drain of its tasks with domains.

use crate::binary::{entries, outbox, outbox_on, run, workdir};
use crate::db::{count_at, tasks_in};
use crate::every_backend;
use crate::support::TestDb;

/// The demo's order ids, which are consecutive in a fresh database.
fn order_ids(db: &TestDb) -> std::ops::RangeInclusive<i64> {
    let first = db.count("SELECT min(id) FROM demo_order");
    let last = db.count("SELECT max(id) FROM demo_order");
    assert_eq!(
        db.count("SELECT count(*) FROM demo_order"),
        last - first + 1,
        "order ids are not consecutive"
    );
    first..=last
}

#[test]
fn demo_on_the_default_sqlite_file() {
    let dir = workdir();
    let out = run(outbox(dir.path()).args(["demo", "--tasks", "200"])).expect_code(0);
    out.stdout_has("outbox demo on SQLite (outbox.db)")
        // SQLite's claiming thread never helps with the queue (its writers take turns).
        .stdout_has("and 0 tasks queued while it waited")
        .stdout_has("check: all 200 orders credited exactly once");
    let file = dir.path().join("outbox.db");
    assert!(file.is_file(), "no outbox.db in the working directory");
    let url = file.to_str().expect("utf-8 path");
    assert_eq!(count_at(url, "SELECT count(*) FROM demo_order"), 200);
    assert_eq!(
        count_at(url, "SELECT count(*) FROM async_task WHERE state = 'done'"),
        400
    );
    assert_eq!(count_at(url, "SELECT count(*) FROM async_task"), 400);
}

#[test]
fn demo_in_batched_mode_counts_chunks_run_by_the_claiming_thread() {
    let dir = workdir();
    let out = run(outbox(dir.path()).args(["demo", "--tasks", "200", "--commit-batch", "10"]))
        .expect_code(0);
    out.stdout_has("drained 400 tasks")
        .stdout_has("chunks queued while it waited")
        .stdout_has("check: all 200 orders credited exactly once");
}

#[test]
fn demo_on_postgres() {
    let db = TestDb::postgres();
    let dir = workdir();
    let out = run(outbox_on(&db, dir.path()).args(["demo", "--tasks", "200"])).expect_code(0);
    out.stdout_has("outbox demo on PostgreSQL")
        .stdout_has("drained 400 tasks")
        .stdout_has("check: all 200 orders credited exactly once");
    assert_eq!(db.count("SELECT count(*) FROM demo_order"), 200);
    assert_eq!(db.count("SELECT count(*) FROM demo_points_ledger"), 200);
    assert_eq!(db.count("SELECT count(*) FROM demo_coupon"), 200);
    assert_eq!(tasks_in(&db, "done"), 400);
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "a PostgreSQL run left files in the working directory"
    );
}

every_backend! {
    fn demo_enqueue_only_then_drain_then_check(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["demo", "--enqueue-only", "--tasks", "50"]))
            .expect_code(0)
            .stdout_has("placed 50 orders");
        assert_eq!(tasks_in(db, "pending"), 100);
        assert_eq!(db.count("SELECT count(*) FROM demo_points_ledger"), 0);

        run(outbox_on(db, dir.path()).arg("drain"))
            .expect_code(0)
            .stdout_has("drained 100 tasks")
            .stdout_has("100 done, 0 retried, 0 dead");
        assert_eq!(tasks_in(db, "done"), 100);

        run(outbox_on(db, dir.path()).args(["demo", "--check"]))
            .expect_code(0)
            .stdout_has("check: all 50 orders credited exactly once");
        assert_eq!(db.count("SELECT count(*) FROM demo_points_ledger"), 50);
        assert_eq!(db.count("SELECT count(*) FROM demo_coupon"), 50);
    }

    fn demo_check_fails_without_demo_orders(db: &TestDb) {
        // A migrated database that never saw the demo: the check must not pass vacuously.
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["demo", "--check"]))
            .expect_code(1)
            .stderr_has("demo check");
    }

    fn demo_check_fails_on_undrained_orders(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["demo", "--enqueue-only", "--tasks", "5"]))
            .expect_code(0);
        let out = run(outbox_on(db, dir.path()).args(["demo", "--check"])).expect_code(1);
        out.stderr_has("demo check failed").stderr_has("5 of 5 orders");
        for id in order_ids(db) {
            out.stderr_has(&format!("order {id} (0 credits, 0 coupons)"));
        }
        assert!(!out.stdout.contains("OK"), "a failed check printed OK:\n{}", out.stdout);
        // The check only reads: the tasks are still there to run.
        assert_eq!(tasks_in(db, "pending"), 10);
    }

    fn demo_check_names_a_double_credit(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["demo", "--tasks", "3"])).expect_code(0);
        let first = *order_ids(db).start();
        db.exec(&format!(
            "INSERT INTO demo_points_ledger (order_id, user_id, points) VALUES ({first}, 1, 1)"
        ));
        let out = run(outbox_on(db, dir.path()).args(["demo", "--check"])).expect_code(1);
        out.stderr_has("1 of 3 orders")
            .stderr_has(&format!("order {first} (2 credits, 1 coupons)"));
    }
}

every_backend! {
    fn drain_with_a_domains_file_runs_every_task_and_bad_domains_exit_2(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["demo", "--enqueue-only", "--tasks", "40"]))
            .expect_code(0);
        let file = dir.path().join("domains.toml");
        std::fs::write(
            &file,
            "[[domain]]\nname = \"coupons\"\nkeywords = [\"coupon.grant\"]\nmax = 1\nqueue = 4\n",
        )
        .unwrap();
        let path = file.to_str().unwrap();
        run(outbox_on(db, dir.path()).args(["drain", "--threads", "4", "--domains", path]))
            .expect_code(0)
            .stdout_has("drained 80 tasks")
            .stdout_has("80 done, 0 retried, 0 dead");
        run(outbox_on(db, dir.path()).args(["demo", "--check"]))
            .expect_code(0)
            .stdout_has("check: all 40 orders credited exactly once");

        // A file that does not parse names the line and column; a bad flag names the
        // domain. Each exits 2 and runs nothing.
        std::fs::write(&file, "[[domain]]\nname = \"coupons\"\nkeywords = [\"coupon.grant\"\nmax = 1\n").unwrap();
        run(outbox_on(db, dir.path()).args(["drain", "--domains", path]))
            .expect_code(2)
            .stderr_has("line 4, column");
        run(outbox_on(db, dir.path()).args(["drain", "--threads", "4", "--domain", "coupons:coupon.grant:max=9"]))
            .expect_code(2)
            .stderr_has("domain \"coupons\"");
        run(outbox_on(db, dir.path()).args(["demo", "--enqueue-only", "--tasks", "5"])).expect_code(0);
        run(outbox_on(db, dir.path()).args(["drain", "--domain", "coupons:coupon.grant:max=0"])).expect_code(2);
        assert_eq!(tasks_in(db, "pending"), 10, "nothing ran after a refused configuration");
        // Domains under lock claims (PostgreSQL's batched default).
        if db.backend() == outbox::Backend::Postgres {
            run(outbox_on(db, dir.path()).args(["drain", "--commit-batch", "5", "--domain", "coupons:coupon.grant:max=1"]))
                .expect_code(0)
                .stdout_has("10 done, 0 retried, 0 dead");
            assert_eq!(tasks_in(db, "pending"), 0);
        }
    }
}
