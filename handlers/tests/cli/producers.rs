//! The SQL producer contract (docs/guide/src/producing.md, "Enqueue from another language"), held
//! by a real producer in another language: `tests/producers/producer.py` (Python; `psycopg` on
//! PostgreSQL, the standard `sqlite3` module on SQLite, `PyMySQL` on MySQL) writes its tasks with
//! plain INSERTs in its own business transactions; then `outbox-fault drain` runs them
//! (`fault.ledger`: one `fault_ledger` row in the task's transaction) and the test checks every
//! effect.
//!
//! The Python virtual environment is built by `scripts/producers.sh ensure` (which
//! `scripts/test.sh` also runs first); the test calls it itself, so it is never skipped: without
//! `python3 -m venv` or `pip` it fails saying so.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use outbox::{Backend, Error, NewTask};
use serde_json::Value;

use crate::binary::{run, workdir};
use crate::every_backend;
use crate::support::TestDb;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("handlers/ has a parent")
        .to_path_buf()
}

/// The venv's python, building the venv if it is missing.
fn python() -> PathBuf {
    let script = repo_root().join("scripts/producers.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("ensure")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} ensure failed ({}): the producer tests need python3 with venv and pip \
         (PyPI for psycopg[binary] and PyMySQL):\n{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim())
}

/// Runs the producer on `db` (with `flags`: `found-rows` on MySQL) and returns its report.
fn produce(db: &TestDb, flags: &[&str]) -> Value {
    let backend = match db.backend() {
        Backend::Postgres => "postgres",
        Backend::Sqlite => "sqlite",
        Backend::Mysql => "mysql",
    };
    let out = Command::new(python())
        .arg(repo_root().join("tests/producers/producer.py"))
        .args([backend, &db.url_text])
        .args(flags)
        .output()
        .expect("cannot start the producer");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "producer failed ({}):\n{stderr}",
        out.status
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "producer report is not JSON ({e}):\n{}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `outbox-fault drain` on `db`; fails the test unless it exits 0.
fn drain(db: &TestDb, dir: &Path) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-fault"));
    cmd.current_dir(dir)
        .env("DATABASE_URL", &db.url_text)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .arg("drain");
    run(&mut cmd).expect_code(0);
}

fn ids(report: &Value, key: &str, field: &str) -> Vec<i64> {
    report[key]
        .as_array()
        .unwrap_or_else(|| panic!("report has no {key}: {report}"))
        .iter()
        .map(|v| {
            if field.is_empty() { v } else { &v[field] }
                .as_i64()
                .expect("number")
        })
        .collect()
}

/// What the producer's invalid rows were, the API's error for the same input, and the
/// message each backend refuses it with (the constraint's name or the trigger's words).
fn expected_refusal(case: &str, backend: Backend) -> (Option<NewTask>, &'static str) {
    let pg = backend == Backend::Postgres;
    let task = |kw: &str, biz: &str, data: &str| NewTask::new(kw, biz).payload_json(data);
    let order = r#"{"order_id": 1}"#;
    match case {
        "bad_keyword" => (
            Some(task("Points Credit!", "api-refused", order)),
            "async_task_keyword_check",
        ),
        "empty_biz_id" => (
            Some(task("fault.ledger", "", order)),
            "async_task_biz_id_check",
        ),
        "long_biz_id" => (
            Some(task("fault.ledger", &"x".repeat(129), order)),
            "async_task_biz_id_check",
        ),
        "not_json" => (
            Some(task("fault.ledger", "api-refused", r#"{"user_id": 7"#)),
            if pg {
                "invalid input syntax for type json"
            } else {
                "async_task_biz_data_check"
            },
        ),
        "too_large" => (
            Some(task(
                "fault.ledger",
                "api-refused",
                &serde_json::json!({"pad": "x".repeat(70_000)}).to_string(),
            )),
            if pg {
                "async_task: biz_data is over 65536 bytes"
            } else {
                "async_task_biz_data_check"
            },
        ),
        "nul_escape" => (
            Some(task(
                "fault.ledger",
                "api-refused",
                r#"{"note": "a\u0000b"}"#,
            )),
            if pg {
                "unsupported Unicode escape sequence"
            } else {
                "async_task_biz_data_check"
            },
        ),
        "too_far_ahead" => (
            Some(
                task("fault.ledger", "api-refused", order)
                    .delay(Duration::from_secs(4000 * 86_400)),
            ),
            if pg {
                "async_task: run_at is more than 3650 days ahead"
            } else {
                "async_task_run_at_ahead_check"
            },
        ),
        "long_tenant" => (
            Some(task("fault.ledger", "api-refused", order).tenant("t".repeat(129))),
            "async_task_tenant_check",
        ),
        "zero_max_attempts" => (
            Some(task("fault.ledger", "api-refused", order).max_attempts(0)),
            "async_task_max_attempts_check",
        ),
        // The producer's parent id is a gap in the ids; the API's, one far past them.
        "missing_parent" => (
            Some(task("fault.ledger", "api-refused", order).after(999_999)),
            if pg {
                "does not exist"
            } else {
                "async_task_parent: the parent task does not exist"
            },
        ),
        // The API writes run_at itself (a delay, by the database clock): no input of its own
        // can have the wrong shape, so only the database's refusal is checked.
        "iso_run_at" | "run_at_without_millis" if !pg => (None, "async_task_run_at_check"),
        other => panic!("the producer tried an invalid row this test does not know: {other}"),
    }
}

/// The API refuses `task` with the error of the same rule as the database's `message`.
fn assert_api_refuses(db: &TestDb, case: &str, task: &NewTask) {
    // A key no task has (a duplicate is not an error: it returns the existing task).
    let err = outbox::enqueue(&mut db.conn(), task).expect_err(case);
    let same_rule = match case {
        "bad_keyword" => matches!(err, Error::InvalidKeyword { .. }),
        "empty_biz_id" | "long_biz_id" => matches!(err, Error::InvalidBizId { .. }),
        "not_json" | "nul_escape" => matches!(err, Error::InvalidPayload { .. }),
        "too_large" => matches!(err, Error::PayloadTooLarge { .. }),
        "too_far_ahead" | "long_tenant" | "zero_max_attempts" | "missing_parent" => {
            matches!(err, Error::InvalidTask { .. })
        }
        _ => false,
    };
    assert!(
        same_rule,
        "{case}: the API refused it for another rule: {err}"
    );
}

every_backend! {
    fn a_python_producer_holds_the_sql_contract(db: &TestDb) {
        holds_the_sql_contract(db, &[]);
    }
}

/// The producer on MySQL with `CLIENT_FOUND_ROWS`, the default of Connector/J and of diesel,
/// under which a duplicate's `ON DUPLICATE KEY UPDATE` reports one affected row as a created
/// row does: the guide's statements still tell the two apart and give the task's id.
#[cfg(feature = "mysql")]
#[test]
fn a_python_producer_with_client_found_rows_holds_the_sql_contract() {
    holds_the_sql_contract(&TestDb::mysql(), &["found-rows"]);
}

/// Runs the producer (with `flags`) on `db`, drains its tasks, and checks every effect.
fn holds_the_sql_contract(db: &TestDb, flags: &[&str]) {
    let backend = db.backend();
    let seq = match backend {
        Backend::Postgres => "seq BIGSERIAL PRIMARY KEY",
        Backend::Sqlite => "seq INTEGER PRIMARY KEY AUTOINCREMENT",
        Backend::Mysql => "seq BIGINT AUTO_INCREMENT PRIMARY KEY",
    };
    db.exec(&format!(
        "CREATE TABLE fault_ledger ({seq}, task_id BIGINT NOT NULL, early BIGINT NOT NULL DEFAULT 0)"
    ));
    let report = produce(db, flags);
    let dir = workdir();
    drain(db, dir.path());

    // Every committed order: its order row, and its task's effect exactly once.
    for (order, task) in
        ids(&report, "committed", "order")
            .into_iter()
            .zip(ids(&report, "committed", "task"))
    {
        assert_eq!(
            db.count(&format!("SELECT count(*) FROM orders WHERE id = {order}")),
            1
        );
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) FROM fault_ledger WHERE task_id = {task}"
            )),
            1,
            "order {order}'s task {task} did not run exactly once"
        );
    }
    // Rolled back: neither the order nor its task.
    for order in ids(&report, "rolled_back", "") {
        assert_eq!(
            db.count(&format!("SELECT count(*) FROM orders WHERE id = {order}")),
            0
        );
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) FROM async_task WHERE biz_id = '{order}'"
            )),
            0
        );
    }
    // Repeated: the INSERT was a no-op that gave the existing task's id, one task per
    // key, run once.
    let committed: Vec<(i64, i64)> = ids(&report, "committed", "order")
        .into_iter()
        .zip(ids(&report, "committed", "task"))
        .collect();
    for repeat in report["repeated"].as_array().expect("repeated") {
        assert_eq!(
            repeat["created"], false,
            "a repeated insert created a task: {repeat}"
        );
        let order = repeat["order"].as_i64().expect("order");
        let first = match committed.iter().find(|(o, _)| *o == order) {
            Some((_, task)) => *task,
            None => repeat["first"].as_i64().expect("the first insert's id"),
        };
        assert_eq!(
            repeat["task"].as_i64(),
            Some(first),
            "a repeat gave another task's id: {repeat}"
        );
        assert_eq!(db.count(&format!(
            "SELECT count(*) FROM fault_ledger l JOIN async_task t ON t.id = l.task_id WHERE t.biz_id = '{order}'"
        )), 1);
    }
    // Options stored as written, and the task ran.
    let opt = &report["options"];
    let task = opt["task"].as_i64().expect("options task");
    assert_eq!(
        db.count(&format!(
        "SELECT count(*) FROM async_task WHERE id = {task} AND tenant = 'acme' AND priority = -5 \
         AND max_attempts = 3 AND state = 'done'"
    )),
        1,
        "tenant/priority/max_attempts not stored as written: {opt}"
    );
    assert_eq!(ledger_rows_of(db, task), 1);

    // Delayed: not run by the drain; due once its run_at is backdated, then run once.
    let delayed = report["delayed"]["task"].as_i64().expect("delayed task");
    assert_eq!(db.task(delayed).state, "pending");
    assert_eq!(db.task(delayed).due, 0, "a 10-minute delay was due at once");
    assert_eq!(ledger_rows_of(db, delayed), 0);
    db.make_all_due();
    drain(db, dir.path());
    assert_eq!(ledger_rows_of(db, delayed), 1);

    // Chains: each child linked to its parents and no other, ran once, after every one of
    // its parents was done.
    for chain in report["chains"].as_array().expect("chains") {
        let child = chain["child"].as_i64().expect("child");
        let parents: Vec<String> = chain["parents"]
            .as_array()
            .expect("parents")
            .iter()
            .map(|p| p.as_i64().expect("parent").to_string())
            .collect();
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) FROM async_task_parent WHERE child_id = {child} \
                 AND parent_id NOT IN ({})",
                parents.join(", ")
            )),
            0,
            "child {child} is linked to another parent: {chain}"
        );
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) FROM fault_ledger WHERE task_id = {child} AND early = 0"
            )),
            1,
            "child {child} did not run exactly once with its parents done: {chain}"
        );
        for parent in chain["parents"].as_array().expect("parents") {
            let parent = parent.as_i64().expect("parent");
            assert_eq!(
                db.count(&format!(
                    "SELECT count(*) FROM fault_ledger c, fault_ledger p \
                 WHERE c.task_id = {child} AND p.task_id = {parent} AND p.seq < c.seq"
                )),
                1,
                "child {child} did not run after its parent {parent}"
            );
        }
    }

    // Invalid rows: each refused by the database with the rule the API applies, and
    // nothing of its transaction written.
    let refused = report["refused"].as_array().expect("refused");
    let expected_cases = if backend == Backend::Sqlite { 12 } else { 10 };
    assert_eq!(refused.len(), expected_cases, "{refused:?}");
    for r in refused {
        let case = r["case"].as_str().expect("case");
        let error = r["error"].as_str().expect("error");
        let (api_task, message) = expected_refusal(case, backend);
        assert!(
            error.contains(message),
            "{case}: refused with {error:?}, expected {message:?}"
        );
        let order = r["order"].as_i64().expect("order");
        assert_eq!(
            db.count(&format!("SELECT count(*) FROM orders WHERE id = {order}")),
            0,
            "{case}: the order of a refused task was written"
        );
        if let Some(task) = api_task {
            assert_api_refuses(db, case, &task);
        }
    }

    // Nothing else: every task is done, and one effect per task.
    let tasks = db.count("SELECT count(*) FROM async_task");
    // 10 orders, the options' and the delayed task, 2 parents and 2 children, and
    // orders 40 and 41 with 40's child.
    assert_eq!(tasks, 10 + 1 + 1 + 4 + 3, "tasks written");
    assert_eq!(
        db.count("SELECT count(*) FROM async_task WHERE state = 'done'"),
        tasks
    );
    assert_eq!(db.count("SELECT count(*) FROM fault_ledger"), tasks);
}

/// `fault_ledger` rows of a task.
fn ledger_rows_of(db: &TestDb, task: i64) -> i64 {
    db.count(&format!(
        "SELECT count(*) FROM fault_ledger WHERE task_id = {task}"
    ))
}
