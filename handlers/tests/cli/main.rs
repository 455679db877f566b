//! Smoke tests of the built `outbox` binary: each test runs it as a separate process, in a
//! temporary directory of its own as working directory, and checks its exit code, its
//! output and what it left in the database.
//!
//! Exit codes under test (see `outbox::cli`): 0 success, 1 the command failed, 2 bad usage
//! or invalid input. Every child process is waited for with a time limit, so a hanging
//! command fails its test instead of hanging the suite.

#[path = "../../../tests/suite/support.rs"]
mod support;

// Support: running the binary, looking into databases.
mod binary;
mod db;

use serde_json::Value;
use support::TestDb;

use crate::binary::{
    entries, outbox, outbox_on, run, wait_until, workdir, Running, DOWN_PG_URL, STOP_LIMIT,
    WORK_LIMIT,
};
use crate::db::{count_at, tasks_in, unmigrate};

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

// ---------------------------------------------------------------------------------------------
// Usage: help, version, bad flags (no database is touched)
// ---------------------------------------------------------------------------------------------

const SUBCOMMANDS: [&str; 8] = [
    "migrate", "enqueue", "drain", "run", "stats", "demo", "prune", "bench",
];

#[test]
fn top_level_help_lists_every_subcommand() {
    let dir = workdir();
    let out = run(outbox(dir.path()).arg("--help")).expect_code(0);
    out.stdout_has("Usage: outbox").stdout_has("--database-url");
    for sub in SUBCOMMANDS {
        assert!(
            out.stdout.lines().any(|l| l.trim_start().starts_with(sub)),
            "--help does not list {sub}:\n{}",
            out.stdout
        );
    }
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "--help touched a database"
    );
}

#[test]
fn every_subcommand_has_help() {
    let dir = workdir();
    for sub in SUBCOMMANDS {
        run(outbox(dir.path()).args([sub, "--help"]))
            .expect_code(0)
            .stdout_has(&format!("Usage: outbox {sub}"));
    }
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "--help touched a database"
    );
}

#[test]
fn version_prints_the_package_version() {
    let dir = workdir();
    run(outbox(dir.path()).arg("--version"))
        .expect_code(0)
        .stdout_has(&format!("outbox {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn unknown_flags_exit_2() {
    let dir = workdir();
    run(outbox(dir.path()).arg("--frobnicate"))
        .expect_code(2)
        .stderr_has("--frobnicate");
    run(outbox(dir.path()).args(["drain", "--frobnicate"]))
        .expect_code(2)
        .stderr_has("--frobnicate");
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "bad usage touched a database"
    );
}

#[test]
fn invalid_arguments_exit_2() {
    let dir = workdir();
    // No subcommand.
    run(&mut outbox(dir.path()))
        .expect_code(2)
        .stderr_has("Usage: outbox");
    // A value of the wrong type.
    run(outbox(dir.path()).args(["demo", "--tasks", "lots"]))
        .expect_code(2)
        .stderr_has("--tasks");
    // A duration that does not parse.
    run(outbox(dir.path()).args(["run", "--poll-interval", "soon"]))
        .expect_code(2)
        .stderr_has("--poll-interval");
    // Values out of range, refused before any database is touched.
    run(outbox(dir.path()).args(["demo", "--tasks", "0"]))
        .expect_code(2)
        .stderr_has("--tasks");
    run(outbox(dir.path()).args(["run", "--poll-interval", "5ms"]))
        .expect_code(2)
        .stderr_has("poll-interval must be at least 10ms");
    run(outbox(dir.path()).args(["drain", "--threads", "0"]))
        .expect_code(2)
        .stderr_has("threads must be between 1 and 1024");
    // Flags that conflict.
    run(outbox(dir.path()).args(["demo", "--enqueue-only", "--check"]))
        .expect_code(2)
        .stderr_has("--check");
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "bad usage touched a database"
    );
}

// ---------------------------------------------------------------------------------------------
// demo: the quick start
// ---------------------------------------------------------------------------------------------

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

both_backends! {
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

// ---------------------------------------------------------------------------------------------
// migrate and enqueue
// ---------------------------------------------------------------------------------------------

both_backends! {
    fn migrate_twice_applies_then_reports_up_to_date(db: &TestDb) {
        let dir = workdir();
        unmigrate(db);
        run(outbox_on(db, dir.path()).arg("migrate"))
            .expect_code(0)
            .stdout_has("applied 4 migration(s)");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 0);
        run(outbox_on(db, dir.path()).arg("migrate"))
            .expect_code(0)
            .stdout_has("schema up to date");
    }

    fn enqueue_twice_yields_one_task(db: &TestDb) {
        let dir = workdir();
        let out = run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", "42", "--data", r#"{"to":"a@b"}"#]))
            .expect_code(0);
        out.stdout_has("created task").stdout_has("mail.send 42");

        // Same keyword and biz_id, other data: reported as existing, nothing overwritten.
        run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", "42", "--data", r#"{"to":"c@d"}"#]))
            .expect_code(0)
            .stdout_has("already exists")
            .stdout_has("nothing written");

        let out = run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", "42", "--json"]))
            .expect_code(0);
        let json: Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("--json output is not JSON ({e}): {}", out.stdout));
        assert_eq!(json["created"], Value::Bool(false), "{json}");
        assert_eq!(json["keyword"], "mail.send", "{json}");
        assert_eq!(json["biz_id"], "42", "{json}");
        let id = db.count("SELECT id FROM async_task WHERE keyword = 'mail.send' AND biz_id = '42'");
        assert_eq!(json["id"].as_i64(), Some(id), "{json}");

        assert_eq!(db.count("SELECT count(*) FROM async_task"), 1);
        assert_eq!(
            db.count("SELECT count(*) FROM async_task WHERE biz_data ->> 'to' = 'a@b'"),
            1,
            "the first payload was not kept"
        );
    }

    fn invalid_keyword_exits_2_and_writes_nothing(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["enqueue", "Bad Keyword", "1"]))
            .expect_code(2)
            .stderr_has("\"Bad Keyword\"");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 0);
    }

    fn invalid_json_payload_exits_2_and_writes_nothing(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", "1", "--data", "{"]))
            .expect_code(2)
            .stderr_has("not valid JSON");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 0);
    }

    fn database_url_flag_overrides_the_environment(db: &TestDb) {
        let dir = workdir();
        let mut cmd = outbox(dir.path());
        cmd.env("DATABASE_URL", "mysql://x/y")
            .args(["--database-url", &db.url_text, "enqueue", "mail.send", "7"]);
        run(&mut cmd).expect_code(0).stdout_has("created task");
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE biz_id = '7'"), 1);
    }
}

#[test]
fn invalid_enqueue_is_refused_before_connecting() {
    let dir = workdir();
    // On the default SQLite file: refused without creating it.
    run(outbox(dir.path()).args(["enqueue", "Bad Keyword", "1"]))
        .expect_code(2)
        .stderr_has("\"Bad Keyword\"");
    // With the server down: still reported as bad input (2), not as a failed connection.
    run(outbox(dir.path()).args([
        "--database-url",
        DOWN_PG_URL,
        "enqueue",
        "mail.send",
        "1",
        "--data",
        "{",
    ]))
    .expect_code(2)
    .stderr_has("not valid JSON");
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "invalid input created a database"
    );
}

// ---------------------------------------------------------------------------------------------
// stats
// ---------------------------------------------------------------------------------------------

both_backends! {
    fn stats_on_an_empty_database_says_no_tasks(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).arg("stats"))
            .expect_code(0)
            .stdout_has("no tasks");
        let out = run(outbox_on(db, dir.path()).args(["stats", "--json"])).expect_code(0);
        assert_eq!(out.stdout.trim(), "", "stats --json on no tasks printed lines");
    }

    fn stats_names_keywords_without_a_handler(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", "1"])).expect_code(0);
        run(outbox_on(db, dir.path()).args([
            "enqueue", "points.credit", "1", "--data", r#"{"user_id":1,"amount_cents":100}"#,
        ]))
        .expect_code(0);

        let out = run(outbox_on(db, dir.path()).arg("stats")).expect_code(0);
        let unserved = out
            .stdout
            .lines()
            .find(|l| l.starts_with("no handler in this binary for:"))
            .unwrap_or_else(|| panic!("no unserved-keyword line:\n{}", out.stdout));
        assert!(unserved.contains("mail.send"), "{unserved}");
        assert!(!unserved.contains("points.credit"), "{unserved}");

        let out = run(outbox_on(db, dir.path()).args(["stats", "--json"])).expect_code(0);
        let lines: Vec<Value> = out
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        let line = |keyword: &str| {
            lines
                .iter()
                .find(|v| v["keyword"] == keyword)
                .unwrap_or_else(|| panic!("no line for {keyword}:\n{}", out.stdout))
        };
        assert_eq!(line("mail.send")["served"], Value::Bool(false));
        assert_eq!(line("mail.send")["pending"], 1);
        assert_eq!(line("points.credit")["served"], Value::Bool(true));
        assert_eq!(lines.len(), 2, "{}", out.stdout);
    }
}

// ---------------------------------------------------------------------------------------------
// Unreachable or unsupported databases
// ---------------------------------------------------------------------------------------------

/// Every command that needs the database, with arguments that are valid.
const DATABASE_COMMANDS: [&[&str]; 8] = [
    &["migrate"],
    &["prune", "--older-than", "7d"],
    &["bench", "--tasks", "10", "--runs", "1"],
    &["drain"],
    &["run"],
    &["stats"],
    &["enqueue", "mail.send", "1"],
    &["demo", "--tasks", "1"],
];

#[test]
fn server_down_fails_with_cannot_connect() {
    let dir = workdir();
    for args in DATABASE_COMMANDS {
        run(outbox(dir.path())
            .args(["--database-url", DOWN_PG_URL])
            .args(args))
        .expect_code(1)
        .stderr_has("cannot connect")
        .stderr_has(DOWN_PG_URL);
    }
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "a failed PostgreSQL connection fell back to a file"
    );
}

#[test]
fn unsupported_scheme_exits_2() {
    let dir = workdir();
    for args in DATABASE_COMMANDS {
        run(outbox(dir.path())
            .env("DATABASE_URL", "mysql://x/y")
            .args(args))
        .expect_code(2)
        .stderr_has("unsupported scheme \"mysql\"");
    }
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "an unsupported URL fell back to a file"
    );
}

#[test]
fn a_string_that_names_no_backend_plainly_exits_2_and_creates_no_file() {
    let dir = workdir();
    for (url, why) in [
        ("dbname=app host=db", "libpq keyword/value string"),
        ("postgres:/db/app", "unsupported scheme \"postgres\""),
    ] {
        for args in DATABASE_COMMANDS {
            run(outbox(dir.path()).env("DATABASE_URL", url).args(args))
                .expect_code(2)
                .stderr_has(why);
        }
    }
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "a string that is not a URL was taken for a file"
    );
}

// ---------------------------------------------------------------------------------------------
// drain, and commands on a database that was never migrated
// ---------------------------------------------------------------------------------------------

both_backends! {
    fn drain_on_an_empty_database_runs_0_tasks(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).arg("drain"))
            .expect_code(0)
            .stdout_has("drained 0 tasks");
        let out = run(outbox_on(db, dir.path()).args(["drain", "--json"])).expect_code(0);
        let json: Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("--json output is not JSON ({e}): {}", out.stdout));
        assert_eq!(json["claimed"], 0, "{json}");
    }

    fn unmigrated_database_asks_for_migrate(db: &TestDb) {
        let dir = workdir();
        unmigrate(db);
        // migrate migrates, demo migrates its own database, bench works on scratch ones.
        for args in DATABASE_COMMANDS.iter().filter(|a| !["migrate", "demo", "bench"].contains(&a[0])) {
            run(outbox_on(db, dir.path()).args(args.iter()))
                .expect_code(1)
                .stderr_has("run `outbox migrate`");
        }
    }
}

#[test]
fn drain_on_a_missing_sqlite_file_asks_for_migrate_and_creates_nothing() {
    let dir = workdir();
    run(outbox(dir.path()).arg("drain"))
        .expect_code(1)
        .stderr_has("does not exist; `outbox migrate` creates it");
    // drain neither creates nor migrates a database behind the operator's back.
    assert!(!dir.path().join("outbox.db").exists());
    // Once migrated, the same drain works.
    run(outbox(dir.path()).arg("migrate")).expect_code(0);
    run(outbox(dir.path()).arg("drain"))
        .expect_code(0)
        .stdout_has("drained 0 tasks");
}

// ---------------------------------------------------------------------------------------------
// run: a long-lived worker stopped by SIGTERM
// ---------------------------------------------------------------------------------------------

fn sigterm(pid: u32) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child, not yet
    // reaped (we hold its `Child` and have not waited for it since it was seen running).
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
}

both_backends! {
    fn run_finishes_the_work_and_exits_0_on_sigterm(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["demo", "--enqueue-only", "--tasks", "20"]))
            .expect_code(0);
        assert_eq!(tasks_in(db, "pending"), 40);

        let mut worker = Running::spawn(outbox_on(db, dir.path()).args(["run", "--poll-interval", "50ms"]));
        let pid = worker.pid();
        wait_until(WORK_LIMIT, "outbox run to finish the 40 demo tasks", || {
            if let Some(status) = worker.exited() {
                panic!("outbox run exited on its own with {status}");
            }
            tasks_in(db, "done") == 40
        });
        // Still running with nothing to do: it stops only when told to.
        assert!(worker.exited().is_none(), "outbox run exited before SIGTERM");

        sigterm(pid);
        let out = worker.finish(STOP_LIMIT).expect_code(0);
        out.stdout_has("ran 40 tasks").stdout_has("40 done, 0 retried, 0 dead");

        let node = format!("FROM async_node WHERE name LIKE '%:{pid}'");
        assert_eq!(db.count(&format!("SELECT count(*) {node}")), 1, "no node row for pid {pid}");
        assert_eq!(
            db.count(&format!("SELECT count(*) {node} AND state = 'gone'")),
            1,
            "the stopped node is not marked gone"
        );
        run(outbox_on(db, dir.path()).args(["demo", "--check"]))
            .expect_code(0)
            .stdout_has("check: all 20 orders credited exactly once");
    }
}

// ---------------------------------------------------------------------------------------------
// prune
// ---------------------------------------------------------------------------------------------

/// A time `hours` ago by the database clock, as an SQL expression.
fn hours_ago(db: &TestDb, hours: u32) -> String {
    match db.backend() {
        outbox::Backend::Postgres => format!("now() - interval '{hours} hours'"),
        outbox::Backend::Sqlite => {
            format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '-{hours} hours')")
        }
    }
}

#[test]
fn prune_help_names_its_flags() {
    let dir = workdir();
    run(outbox(dir.path()).args(["prune", "--help"]))
        .expect_code(0)
        .stdout_has("Usage: outbox prune")
        .stdout_has("--older-than")
        .stdout_has("--keep-dead")
        .stdout_has("--batch")
        .stdout_has("--json");
    let out = run(outbox(dir.path()).arg("--help")).expect_code(0);
    assert!(
        out.stdout
            .lines()
            .any(|l| l.trim_start().starts_with("prune")),
        "--help does not list prune:\n{}",
        out.stdout
    );
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "--help touched a database"
    );
}

#[test]
fn prune_bad_usage_exits_2_before_touching_a_database() {
    let dir = workdir();
    // No age: deleting data takes an explicit one.
    run(outbox(dir.path()).arg("prune"))
        .expect_code(2)
        .stderr_has("--older-than");
    run(outbox(dir.path()).args(["prune", "--older-than", "soon"]))
        .expect_code(2)
        .stderr_has("--older-than");
    run(outbox(dir.path()).args(["prune", "--older-than", "7d", "--batch", "0"]))
        .expect_code(2)
        .stderr_has("batch size must be between 1 and 1000000");
    run(outbox(dir.path()).args(["prune", "--older-than", "7d", "--batch", "1000001"]))
        .expect_code(2)
        .stderr_has("batch size must be between 1 and 1000000");
    run(outbox(dir.path()).args(["prune", "--older-than", "200years"]))
        .expect_code(2)
        .stderr_has("at most 100 years");
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "bad usage touched a database"
    );
}

#[test]
fn prune_refuses_a_missing_sqlite_file_and_a_server_that_is_down() {
    let dir = workdir();
    run(outbox(dir.path()).args(["prune", "--older-than", "7d"]))
        .expect_code(1)
        .stderr_has("does not exist; `outbox migrate` creates it");
    run(outbox(dir.path()).args(["--database-url", DOWN_PG_URL, "prune", "--older-than", "7d"]))
        .expect_code(1)
        .stderr_has("cannot connect")
        .stderr_has(DOWN_PG_URL);
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "prune created a database"
    );
}

both_backends! {
    fn prune_deletes_old_finished_tasks_and_gone_nodes(db: &TestDb) {
        let dir = workdir();
        // 10 done tasks and the demo's node, gone when it finished.
        run(outbox_on(db, dir.path()).args(["demo", "--tasks", "5"])).expect_code(0);
        assert_eq!(tasks_in(db, "done"), 10);
        assert_eq!(db.count("SELECT count(*) FROM async_node WHERE state = 'gone'"), 1);
        // Nothing is an hour old yet.
        run(outbox_on(db, dir.path()).args(["prune", "--older-than", "1h"]))
            .expect_code(0)
            .stdout_has("pruned 0 tasks and 0 nodes in ");
        assert_eq!(tasks_in(db, "done"), 10);

        // Two hours later (by the database clock), one of them dead, one finished just now.
        let two_hours_ago = hours_ago(db, 2);
        db.exec(&format!("UPDATE async_task SET created_at = {two_hours_ago}, finished_at = {two_hours_ago}"));
        db.exec(&format!("UPDATE async_node SET heartbeat_at = {two_hours_ago}"));
        let first = db.count("SELECT min(id) FROM async_task");
        let last = db.count("SELECT max(id) FROM async_task");
        db.exec(&format!("UPDATE async_task SET state = 'dead' WHERE id = {first}"));
        db.exec(&format!("UPDATE async_task SET finished_at = {} WHERE id = {last}", hours_ago(db, 0)));
        // A pending task is never pruned.
        run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", "1"])).expect_code(0);

        run(outbox_on(db, dir.path()).args(["prune", "--older-than", "1h", "--keep-dead", "--batch", "3"]))
            .expect_code(0)
            .stdout_has("pruned 8 tasks (8 done) and 1 node in ");
        assert_eq!(db.count("SELECT count(*) FROM async_node"), 0);
        assert_eq!((tasks_in(db, "dead"), tasks_in(db, "done"), tasks_in(db, "pending")), (1, 1, 1));

        let out = run(outbox_on(db, dir.path()).args(["prune", "--older-than", "1h", "--json"]))
            .expect_code(0);
        let json: Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("--json output is not JSON ({e}): {}", out.stdout));
        assert_eq!(
            (&json["tasks"], &json["done"], &json["dead"], &json["cancelled"], &json["nodes"], &json["batches"]),
            (&Value::from(1), &Value::from(0), &Value::from(1), &Value::from(0), &Value::from(0), &Value::from(1)),
            "{json}"
        );
        assert!(json["seconds"].is_f64(), "{json}");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 2);
        assert_eq!((tasks_in(db, "done"), tasks_in(db, "pending")), (1, 1));
    }

    fn prune_on_an_unmigrated_database_asks_for_migrate(db: &TestDb) {
        let dir = workdir();
        unmigrate(db);
        run(outbox_on(db, dir.path()).args(["prune", "--older-than", "7d"]))
            .expect_code(1)
            .stderr_has("run `outbox migrate`");
    }
}

// ---------------------------------------------------------------------------------------------
// bench
// ---------------------------------------------------------------------------------------------

both_backends! {
    fn bench_reports_every_configuration_as_json_and_leaves_nothing_behind(db: &TestDb) {
        let dir = workdir();
        let out = run(outbox_on(db, dir.path()).args([
            "bench", "--tasks", "300", "--runs", "2", "--commit-batch", "10", "--json",
        ]))
        .expect_code(0);
        let lines: Vec<serde_json::Value> = out
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect();
        assert_eq!(lines.len(), 2, "{}", out.stdout);
        for (line, mode) in lines.iter().zip(["strict", "batched"]) {
            assert_eq!(line["backend"], db.backend().name());
            assert_eq!(line["mode"], mode);
            assert_eq!(line["tasks"], 300);
            assert_eq!(line["runs"], 2);
            for field in ["tasks_per_s", "reference_per_s", "ratio", "rss_mib", "enqueue_per_s", "cpu_s"] {
                assert!(line[field].as_f64().is_some_and(|v| v > 0.0), "{field} in {line}");
            }
        }
        assert_eq!(lines[1]["commit_batch"], 10);
        // The URL's own database was not touched: bench works on scratch databases.
        assert_eq!(tasks_in(db, "pending") + tasks_in(db, "done"), 0);
        assert_eq!(entries(dir.path()), Vec::<String>::new(), "bench wrote into the working directory");
    }
}

#[test]
fn bench_latency_reports_listen_and_poll() {
    let db = &TestDb::postgres();
    let dir = workdir();
    let out = run(outbox_on(db, dir.path()).args([
        "bench",
        "--latency",
        "--latency-samples",
        "20",
        "--poll-interval",
        "100ms",
        "--json",
    ]))
    .expect_code(0);
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert_eq!(lines[0]["wake"], "listen");
    assert_eq!(lines[0]["samples"], 20);
    assert_eq!(lines[1]["wake"], "poll 100ms");
    for line in &lines {
        assert!(line["p50_ms"].as_f64().is_some(), "{line}");
        assert!(line["p99_ms"].as_f64() >= line["p50_ms"].as_f64(), "{line}");
    }
}

#[test]
fn bench_rejects_bad_settings() {
    let dir = workdir();
    for args in [
        &["bench", "--runs", "0"][..],
        &["bench", "--tasks", "0"],
        &["bench", "--tasks", "100", "--backlog", "10"],
        &["bench", "--commit-batch", "0", "--mode", "batched"],
    ] {
        run(outbox(dir.path()).args(args)).expect_code(2);
    }
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}
