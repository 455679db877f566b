//! Claim strategies on the command line: their flags checked before any database is touched,
//! and `bench --strategy`.

use crate::binary::{entries, outbox, outbox_on, run, workdir};
use crate::db::tasks_in;
use crate::support::TestDb;

#[test]
fn strategy_flags_are_checked_before_any_database_is_touched() {
    let dir = workdir();
    for (args, says) in [
        (
            &["drain", "--strategy", "round_robin"][..],
            "unknown strategy \"round_robin\"",
        ),
        (
            &["drain", "--strategy", "id_hash", "--weight", "3"],
            "weight applies to the weight strategy only",
        ),
        (
            &["run", "--strategy", "weight", "--weight", "0"],
            "weight must be between 1 and 1000",
        ),
        (
            &["run", "--slack", "2"],
            "slack applies to the least_count strategy only",
        ),
        (
            &[
                "drain",
                "--strategy",
                "least_count",
                "--strategy-grace",
                "5s",
            ],
            "strategy-grace applies to the id_hash and weight strategies only",
        ),
    ] {
        run(outbox(dir.path()).args(args))
            .expect_code(2)
            .stderr_has(says);
    }
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "bad usage touched a database"
    );
}

#[test]
fn bench_strategy_drains_with_a_fleet_of_node_processes() {
    let db = &TestDb::postgres();
    let dir = workdir();
    let out = run(outbox_on(db, dir.path()).args([
        "bench",
        "--strategy",
        "id_hash",
        "--nodes",
        "2",
        "--threads",
        "2",
        "--tasks",
        "300",
        "--runs",
        "2",
        "--json",
    ]))
    .expect_code(0);
    let line: serde_json::Value =
        serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{:?}: {e}", out.stdout));
    assert_eq!(line["strategy"], "id_hash");
    assert_eq!(line["nodes"], 2);
    assert_eq!(line["rounds"], 2);
    for field in ["tasks_per_s", "default_tasks_per_s", "ratio"] {
        assert!(
            line[field].as_f64().is_some_and(|v| v > 0.0),
            "{field} in {line}"
        );
    }
    // Every task ran on the node its id maps to: the nodes saw each other before they began.
    assert_eq!(line["owned_fraction"], 1.0, "{line}");
    assert_eq!(tasks_in(db, "pending") + tasks_in(db, "done"), 0);
}

#[test]
fn bench_strategy_needs_postgresql() {
    let db = &TestDb::sqlite();
    let dir = workdir();
    run(outbox_on(db, dir.path()).args(["bench", "--strategy", "id_hash", "--tasks", "10"]))
        .expect_code(1)
        .stderr_has("bench --strategy needs PostgreSQL");
}
