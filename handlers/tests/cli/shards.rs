//! `outbox drain` and `outbox run` with `--database-url` repeated: one process serving
//! several databases, each database's tasks run once in it, reported per database.

use serde_json::Value;

use crate::binary::{outbox, outbox_on, run, wait_until, workdir, Running, STOP_LIMIT, WORK_LIMIT};
use crate::db::tasks_in;
use crate::every_backend;
use crate::support::TestDb;
use crate::work::sigterm;

/// A second fresh database of `db`'s backend.
fn another(db: &TestDb) -> TestDb {
    match db.backend() {
        outbox::Backend::Sqlite => TestDb::sqlite(),
        outbox::Backend::Postgres => TestDb::postgres(),
        #[cfg(feature = "mysql")]
        outbox::Backend::Mysql => TestDb::mysql(),
        #[cfg(not(feature = "mysql"))]
        outbox::Backend::Mysql => panic!("the MySQL tests are built with the mysql feature"),
    }
}

/// `--database-url A --database-url B`.
fn both_urls<'a>(a: &'a TestDb, b: &'a TestDb) -> [&'a str; 4] {
    ["--database-url", &a.url_text, "--database-url", &b.url_text]
}

every_backend! {
    fn drain_with_the_url_repeated_drains_every_database_and_reports_each(db: &TestDb) {
        let other = another(db);
        let dir = workdir();
        for (database, orders) in [(db, "12"), (&other, "7")] {
            run(outbox_on(database, dir.path()).args(["demo", "--enqueue-only", "--tasks", orders]))
                .expect_code(0);
        }
        let out = run(outbox(dir.path()).arg("drain").args(both_urls(db, &other))).expect_code(0);
        out.stdout_has(&format!("{}: drained 24 tasks", db.url.masked()))
            .stdout_has(&format!("{}: drained 14 tasks", other.url.masked()));
        for (database, orders) in [(db, 12), (&other, 7)] {
            assert_eq!(tasks_in(database, "done"), 2 * orders);
            run(outbox_on(database, dir.path()).args(["demo", "--check"]))
                .expect_code(0)
                .stdout_has(&format!("check: all {orders} orders credited exactly once"));
        }
        // --json: one object a line, each naming its database.
        let out = run(outbox(dir.path()).args(["drain", "--json"]).args(both_urls(db, &other)))
            .expect_code(0);
        let lines: Vec<Value> = out
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 2, "{}", out.stdout);
        assert_eq!(lines[0]["database"], db.url.masked().as_str());
        assert_eq!(lines[1]["database"], other.url.masked().as_str());
        assert!(lines.iter().all(|l| l["claimed"] == 0), "{}", out.stdout);
    }

    fn run_with_the_url_repeated_serves_every_database_until_sigterm(db: &TestDb) {
        let other = another(db);
        let dir = workdir();
        for database in [db, &other] {
            run(outbox_on(database, dir.path()).args(["demo", "--enqueue-only", "--tasks", "10"]))
                .expect_code(0);
        }
        let mut worker = Running::spawn(
            outbox(dir.path())
                .args(["run", "--poll-interval", "50ms"])
                .args(both_urls(db, &other)),
        );
        let pid = worker.pid();
        wait_until(WORK_LIMIT, "outbox run to finish both databases' tasks", || {
            if let Some(status) = worker.exited() {
                panic!("outbox run exited on its own with {status}");
            }
            tasks_in(db, "done") == 20 && tasks_in(&other, "done") == 20
        });
        sigterm(pid);
        let out = worker.finish(STOP_LIMIT).expect_code(0);
        out.stdout_has(&format!("{}: ran 20 tasks", db.url.masked()))
            .stdout_has(&format!("{}: ran 20 tasks", other.url.masked()));
        // A node in each database, marked gone at the stop.
        for database in [db, &other] {
            let node = format!("FROM async_node WHERE name LIKE '%:{pid}'");
            assert_eq!(database.count(&format!("SELECT count(*) {node} AND state = 'gone'")), 1);
            run(outbox_on(database, dir.path()).args(["demo", "--check"]))
                .expect_code(0)
                .stdout_has("check: all 10 orders credited exactly once");
        }
    }

    fn the_url_repeated_is_refused_where_it_cannot_serve(db: &TestDb) {
        let other = another(db);
        let dir = workdir();
        run(outbox(dir.path()).arg("stats").args(both_urls(db, &other)))
            .expect_code(2)
            .stderr_has("only `run` and `drain` serve several databases");
        run(outbox(dir.path()).arg("drain").args(both_urls(db, db)))
            .expect_code(2)
            .stderr_has(&format!("names {} twice", db.url.masked()));
        let missing = match db.backend() {
            outbox::Backend::Sqlite => dir.path().join("missing.db").to_str().unwrap().to_owned(),
            _ => format!("{}_missing", db.url_text),
        };
        let out = run(outbox(dir.path())
            .args(["drain", "--database-url", &db.url_text, "--database-url", &missing]))
            .expect_code(1);
        out.stderr_has(&format!("database {}", outbox::DatabaseUrl::parse(&missing).unwrap().masked()));
        match db.backend() {
            // A missing file is no server that may come back: nothing starts.
            outbox::Backend::Sqlite => {
                assert_eq!(db.count("SELECT count(*) FROM async_node"), 0, "nothing started")
            }
            // A server that refuses a database holds up only that one: the other is drained,
            // and the run fails naming the refused one.
            _ => {
                out.stdout_has(&format!("{}: drained 0 tasks", db.url.masked()));
                assert_eq!(db.count("SELECT count(*) FROM async_node WHERE state = 'gone'"), 1);
            }
        }
    }

    fn each_log_line_about_a_database_names_it_when_a_process_serves_several(db: &TestDb) {
        // Each database's first task is its task 1, and its node may be its node 1: a line
        // names which database it is about, and only when the process serves several.
        let other = another(db);
        let dir = workdir();
        for (database, biz_id) in [(db, "first-db-order"), (&other, "second-db-order")] {
            run(outbox_on(database, dir.path())
                .args(["enqueue", "points.credit", biz_id, "--data", r#"{"user_id":1,"amount_cents":100}"#]))
                .expect_code(0);
        }
        let out = run(outbox(dir.path()).arg("drain").args(both_urls(db, &other)).env("RUST_LOG", "outbox=info"))
            .expect_code(0);
        for (database, biz_id) in [(db, "first-db-order"), (&other, "second-db-order")] {
            let label = format!("] {}: ", database.url.masked());
            let lines: Vec<&str> = out.stderr().lines().filter(|l| l.contains(&label)).collect();
            assert!(
                lines.iter().any(|l| l.contains(&format!("(points.credit {biz_id}) is dead"))),
                "no line labelled {label:?} says its task is dead:\n{}",
                out.stderr()
            );
            assert!(
                lines.iter().any(|l| l.contains(") started on ")),
                "no line labelled {label:?} says its node started:\n{}",
                out.stderr()
            );
            assert!(
                !lines.iter().any(|l| l.contains("db-order") && !l.contains(biz_id)),
                "a line labelled {label:?} is about the other database's task:\n{}",
                out.stderr()
            );
        }
        // One database: no label.
        run(outbox_on(db, dir.path())
            .args(["enqueue", "points.credit", "only-db-order", "--data", r#"{"user_id":1,"amount_cents":100}"#]))
            .expect_code(0);
        let out = run(outbox_on(db, dir.path()).arg("drain").env("RUST_LOG", "outbox=info")).expect_code(0);
        out.stderr_has("(points.credit only-db-order) is dead");
        assert!(
            !out.stderr().contains(&db.url.masked()),
            "a worker of one database labels its lines:\n{}",
            out.stderr()
        );
    }
}

/// `outbox run` serving two databases, one of which refuses connections, stops at SIGTERM in
/// seconds (not a pool checkout's timeout per statement under way), marks its node gone in
/// the other, and says that the refusing one's node stays alive there, each line about it
/// naming it. PostgreSQL, whose server can refuse one database while serving another.
#[test]
fn run_stops_in_seconds_while_a_database_refuses_connections() {
    let (down, up) = (TestDb::postgres(), TestDb::postgres());
    let dir = workdir();
    let worker = Running::spawn(
        outbox(dir.path())
            .args(["run", "--poll-interval", "50ms"])
            .args(both_urls(&down, &up)),
    );
    let pid = worker.pid();
    let node = format!("FROM async_node WHERE name LIKE '%:{pid}'");
    wait_until(WORK_LIMIT, "a node in each database", || {
        down.count(&format!("SELECT count(*) {node}")) == 1
            && up.count(&format!("SELECT count(*) {node}")) == 1
    });
    let name = down.url_text.rsplit('/').next().unwrap().to_owned();
    up.exec(&format!(
        "ALTER DATABASE {name} ALLOW_CONNECTIONS false; \
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
    ));
    // The reachable database's loop still runs its tasks.
    run(outbox_on(&up, dir.path()).args(["demo", "--enqueue-only", "--tasks", "1"])).expect_code(0);
    wait_until(WORK_LIMIT, "the reachable database's tasks done", || {
        tasks_in(&up, "done") == 2
    });
    sigterm(pid);
    let out = worker
        .finish(std::time::Duration::from_secs(5))
        .expect_code(0);
    up.exec(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"));
    out.stderr_has("could not mark it gone");
    // Each line about the refusing database names it (the pool's failures to connect, on
    // r2d2's threads, too), and none names the other.
    let label = format!("] {}: ", down.url.masked());
    let refused: Vec<&str> = (out.stderr().lines())
        .filter(|l| l.contains("is not currently accepting connections"))
        .collect();
    assert!(
        !refused
            .iter()
            .any(|l| l.contains(&format!("] {}: ", up.url.masked()))),
        "a line about the refusing database names the other:\n{}",
        out.stderr()
    );
    assert!(
        refused
            .iter()
            .any(|l| l.contains(&label) && l.contains("could not mark it gone")),
        "the refusing database's node is not named with its database:\n{}",
        out.stderr()
    );
    assert!(
        refused.iter().all(|l| l.contains(&label)),
        "a line about the refusing database does not name it:\n{}",
        out.stderr()
    );
    assert_eq!(
        up.count(&format!("SELECT count(*) {node} AND state = 'gone'")),
        1
    );
    assert_eq!(
        down.count(&format!("SELECT count(*) {node} AND state = 'alive'")),
        1
    );
}

/// `outbox run` serving two databases, one of which refuses connections at the start: the
/// other's tasks run meanwhile; stopped before it is let in, the run exits 1 naming it; run
/// again and let in, its worker starts and its tasks run too. PostgreSQL, whose server can
/// refuse one database while serving another.
#[test]
fn run_starts_a_database_refused_at_the_start_once_it_is_let_in() {
    let (down, up) = (TestDb::postgres(), TestDb::postgres());
    let dir = workdir();
    for database in [&down, &up] {
        run(outbox_on(database, dir.path()).args(["demo", "--enqueue-only", "--tasks", "1"]))
            .expect_code(0);
    }
    let name = down.url_text.rsplit('/').next().unwrap().to_owned();
    let refuse = |allow: bool| up.exec(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS {allow}"));
    let start = || {
        Running::spawn(
            outbox(dir.path())
                .args(["run", "--poll-interval", "50ms"])
                .args(both_urls(&down, &up)),
        )
    };
    refuse(false);
    let worker = start();
    wait_until(WORK_LIMIT, "the reachable database's tasks done", || {
        tasks_in(&up, "done") == 2
    });
    sigterm(worker.pid());
    let out = worker.finish(STOP_LIMIT).expect_code(1);
    out.stdout_has(&format!("{}: ran 2 tasks", up.url.masked()));
    out.stderr_has(&format!("database {}: ", down.url.masked()));
    // Again, let in while it runs.
    let worker = start();
    let pid = worker.pid();
    wait_until(WORK_LIMIT, "the reachable database served", || {
        up.count(&format!(
            "SELECT count(*) FROM async_node WHERE name LIKE '%:{pid}'"
        )) == 1
    });
    refuse(true);
    wait_until(WORK_LIMIT, "the database let in served", || {
        tasks_in(&down, "done") == 2
    });
    sigterm(pid);
    let out = worker.finish(STOP_LIMIT).expect_code(0);
    out.stdout_has(&format!("{}: ran 2 tasks", down.url.masked()));
    for database in [&down, &up] {
        assert_eq!(
            database.count(&format!(
                "SELECT count(*) FROM async_node WHERE name LIKE '%:{pid}' AND state = 'gone'"
            )),
            1
        );
    }
    let label = format!("] {}: ", down.url.masked());
    for said in [
        "not reachable at the start: its worker starts once it is",
        "its worker started, ",
    ] {
        out.stderr_has(&format!("{label}{said}"));
    }
}

/// `outbox drain` serving two PostgreSQL databases while a session holds a lock on the
/// first's `demo_points_ledger` table: the first's `points.credit` handlers wait for it on at
/// most its share of the threads (2 of `--threads 4`), and the second database's tasks all
/// run meanwhile; once the lock goes, the first's run too, each order credited once.
#[test]
fn drain_with_one_database_locked_runs_the_others_tasks_meanwhile() {
    use diesel::connection::SimpleConnection;

    let (locked, free) = (TestDb::postgres(), TestDb::postgres());
    let dir = workdir();
    for (database, orders) in [(&locked, "10"), (&free, "40")] {
        run(outbox_on(database, dir.path()).args(["demo", "--enqueue-only", "--tasks", orders]))
            .expect_code(0);
    }
    let mut holder = locked.conn();
    holder
        .batch_execute("BEGIN; LOCK TABLE demo_points_ledger IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let worker = Running::spawn(
        outbox(dir.path())
            .args(["drain", "--threads", "4"])
            .args(both_urls(&locked, &free)),
    );
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND wait_event_type = 'Lock' \
                   AND query LIKE '%demo_points_ledger%'";
    wait_until(
        WORK_LIMIT,
        "a points.credit handler waiting for the lock",
        || locked.count(waiting) >= 1,
    );
    wait_until(
        WORK_LIMIT,
        "the other database's 80 tasks, while the first's table is locked",
        || tasks_in(&free, "done") == 80,
    );
    assert!(
        locked.count(waiting) >= 1,
        "the first database's handlers were still waiting"
    );
    assert!(
        locked.count(waiting) <= 2,
        "the locked database took more than its share of the 4 threads"
    );
    holder.batch_execute("COMMIT").unwrap();
    let out = worker.finish(WORK_LIMIT).expect_code(0);
    out.stdout_has(&format!("{}: drained 20 tasks", locked.url.masked()))
        .stdout_has(&format!("{}: drained 80 tasks", free.url.masked()));
    for (database, orders) in [(&locked, 10), (&free, 40)] {
        run(outbox_on(database, dir.path()).args(["demo", "--check"]))
            .expect_code(0)
            .stdout_has(&format!("check: all {orders} orders credited exactly once"));
    }
}
