//! `prune`.

use serde_json::Value;

use crate::binary::{entries, outbox, outbox_on, run, workdir, DOWN_PG_URL};
use crate::db::{tasks_in, unmigrate};
use crate::every_backend;
use crate::support::TestDb;

/// A time `hours` ago by the database clock, as an SQL expression.
fn hours_ago(db: &TestDb, hours: u32) -> String {
    match db.backend() {
        outbox::Backend::Postgres => format!("now() - interval '{hours} hours'"),
        outbox::Backend::Sqlite => {
            format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '-{hours} hours')")
        }
        outbox::Backend::Mysql => format!("UTC_TIMESTAMP(3) - INTERVAL {hours} HOUR"),
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

every_backend! {
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
