//! `migrate` and `enqueue`; `stats`.

use serde_json::Value;

use crate::binary::{entries, outbox, outbox_on, run, workdir, DOWN_PG_URL};
use crate::db::unmigrate;
use crate::every_backend;

every_backend! {
    fn migrate_twice_applies_then_reports_up_to_date(db: &TestDb) {
        let dir = workdir();
        unmigrate(db);
        // Every migration of the backend's tree (SQLite and PostgreSQL have the same versions;
        // MySQL's tree is one of its own).
        let tree = format!("{}/../migrations/{}", env!("CARGO_MANIFEST_DIR"), db.backend().name());
        let migrations = std::fs::read_dir(tree).unwrap().count();
        run(outbox_on(db, dir.path()).arg("migrate"))
            .expect_code(0)
            .stdout_has(&format!("applied {migrations} migration(s)"));
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
            db.count(&format!("SELECT count(*) FROM async_task WHERE {} = 'a@b'", db.json_text_sql("biz_data", "to"))),
            1,
            "the first payload was not kept"
        );
    }

    fn enqueue_after_a_parent_blocks_the_child_and_a_missing_parent_writes_nothing(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["enqueue", "order.pack", "42"])).expect_code(0);
        let parent = db.count("SELECT id FROM async_task WHERE keyword = 'order.pack'");
        let out = run(outbox_on(db, dir.path()).args(["enqueue", "order.ship", "42", "--after", &parent.to_string(), "--json"]))
            .expect_code(0);
        let json: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!(json["state"], "blocked", "{json}");
        run(outbox_on(db, dir.path()).args(["enqueue", "order.mail", "42", "--after", &parent.to_string(), "--after", "999"]))
            .expect_code(2)
            .stderr_has("its parent task 999 does not exist");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 2);
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

every_backend! {
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

every_backend! {
    fn cancel_by_id_or_key_and_its_refusals(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", "42"])).expect_code(0);
        run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", "43"])).expect_code(0);
        let id = db.count("SELECT id FROM async_task WHERE biz_id = '42'");
        run(outbox_on(db, dir.path()).args(["cancel", &id.to_string()]))
            .expect_code(0)
            .stdout_has(&format!("cancelled task {id}"));
        run(outbox_on(db, dir.path()).args(["cancel", &id.to_string()]))
            .expect_code(0)
            .stdout_has("is already cancelled; nothing written");
        let out = run(outbox_on(db, dir.path()).args(["cancel", "--keyword", "mail.send", "--biz-id", "43", "--json"]))
            .expect_code(0);
        let json: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!((json["cancelled"].as_bool(), json["state"].as_str()), (Some(true), Some("cancelled")));
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'cancelled'"), 2);

        // An unknown task: exit 1 naming it; bad usage: exit 2; nothing changed.
        run(outbox_on(db, dir.path()).args(["cancel", "999999"]))
            .expect_code(1)
            .stderr_has("no task 999999");
        run(outbox_on(db, dir.path()).args(["cancel", "--keyword", "mail.send", "--biz-id", "44"]))
            .expect_code(1)
            .stderr_has("no task mail.send 44");
        run(outbox_on(db, dir.path()).arg("cancel")).expect_code(2);
        run(outbox_on(db, dir.path()).args(["cancel", "--keyword", "mail.send"])).expect_code(2);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'cancelled'"), 2);
    }
}

every_backend! {
    fn tenant_set_list_remove_and_the_quota_at_enqueue(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["tenant", "set", "acme", "--max-queued", "1", "--max-running", "2"]))
            .expect_code(0)
            .stdout_has("acme: queued 0/1, running 0/2");
        run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", "1", "--tenant", "acme"])).expect_code(0);
        // Over the quota: exit 1 naming the tenant and the limit; nothing written.
        run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", "2", "--tenant", "acme"]))
            .expect_code(1)
            .stderr_has("tenant \"acme\" is at its max_queued of 1 queued tasks");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 1);
        let out = run(outbox_on(db, dir.path()).args(["tenant", "list", "--json"])).expect_code(0);
        let json: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!(json[0]["tenant"], "acme");
        assert_eq!((json[0]["max_queued"].as_i64(), json[0]["queued"].as_i64()), (Some(1), Some(1)));
        // Bad input: exit 2, nothing changed.
        run(outbox_on(db, dir.path()).args(["tenant", "set", "acme", "--max-queued", "-1"]))
            .expect_code(2)
            .stderr_has("must be at least 0, not -1");
        run(outbox_on(db, dir.path()).args(["tenant", "set", "acme", "--max-running", "many"])).expect_code(2);
        run(outbox_on(db, dir.path()).args(["tenant", "set", "", "--max-running", "1"]))
            .expect_code(2)
            .stderr_has("tenant must be 1 to 128 bytes");
        run(outbox_on(db, dir.path()).args(["tenant", "remove", "nobody"]))
            .expect_code(1)
            .stderr_has("no tenant \"nobody\"");
        run(outbox_on(db, dir.path()).args(["tenant", "set", "acme", "--weight", "0"]))
            .expect_code(2)
            .stderr_has("must be at least 1, not 0");
        assert_eq!(db.count("SELECT count(*) FROM async_tenant WHERE max_queued = 1 AND max_running = 2 AND weight = 1"), 1);
        // A weight alone keeps the limits.
        run(outbox_on(db, dir.path()).args(["tenant", "set", "acme", "--weight", "3"]))
            .expect_code(0)
            .stdout_has("acme: queued 1/1, running 0/2, weight 3");
        // `none` lifts a limit; remove deletes the row.
        run(outbox_on(db, dir.path()).args(["tenant", "set", "acme", "--max-queued", "none"]))
            .expect_code(0)
            .stdout_has("queued 1/none, running 0/2");
        run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", "2", "--tenant", "acme"])).expect_code(0);
        run(outbox_on(db, dir.path()).args(["tenant", "remove", "acme"])).expect_code(0);
        run(outbox_on(db, dir.path()).args(["tenant", "list"]))
            .expect_code(0)
            .stdout_has("no tenants with a row");
        assert_eq!(db.count("SELECT count(*) FROM async_audit"), 4, "set, set weight, set, remove");
    }
}

every_backend! {
    fn cancel_all_by_filter_dry_run_retry_and_their_audit(db: &TestDb) {
        let dir = workdir();
        for (biz, tenant) in [("1", "acme"), ("2", "acme"), ("3", "other")] {
            run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", biz, "--tenant", tenant])).expect_code(0);
        }
        // A keyword without --biz-id or --all is refused: an operator never cancels a whole
        // keyword by leaving a flag out.
        run(outbox_on(db, dir.path()).args(["cancel", "--keyword", "mail.send"]))
            .expect_code(2)
            .stderr_has("needs --biz-id to name one task, or --all");
        run(outbox_on(db, dir.path()).args(["cancel", "--all"]))
            .expect_code(2)
            .stderr_has("must name a keyword or a tenant");
        run(outbox_on(db, dir.path()).args(["cancel", "--all", "--tenant", "acme", "--dry-run"]))
            .expect_code(0)
            .stdout_has("2 unfinished task(s) match; nothing written");
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'cancelled'"), 0);
        run(outbox_on(db, dir.path()).args(["cancel", "--all", "--keyword", "mail.send", "--tenant", "acme"]))
            .expect_code(0)
            .stdout_has("cancelled 2 task(s)");
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'cancelled' AND tenant = 'acme'"), 2);
        let id = db.count("SELECT id FROM async_task WHERE biz_id = '1'");
        run(outbox_on(db, dir.path()).args(["retry", &id.to_string()]))
            .expect_code(0)
            .stdout_has("is pending again");
        run(outbox_on(db, dir.path()).args(["retry", &id.to_string(), "--json"]))
            .expect_code(0)
            .stdout_has("\"retried\":false");
        run(outbox_on(db, dir.path()).args(["retry", "999999"]))
            .expect_code(1)
            .stderr_has("no task 999999");
        assert_eq!(
            db.count("SELECT count(*) FROM async_audit WHERE action = 'task.cancel' AND affected = 2"),
            1
        );
        assert_eq!(
            db.count(&format!("SELECT count(*) FROM async_audit WHERE action = 'task.retry' AND target = '{id}'")),
            1
        );
        run(outbox_on(db, dir.path()).args(["cancel", "--all", "--tenant", "nobody"]))
            .expect_code(0)
            .stdout_has("cancelled 0 task(s)");
        assert_eq!(db.count("SELECT count(*) FROM async_audit"), 2, "dry runs and no-ops are not audited");
    }
}

#[test]
fn tenant_input_is_refused_as_bad_usage_before_any_database_is_reached() {
    let dir = workdir();
    // No server listens there: a check after connecting would fail with exit 1.
    for args in [
        &["tenant", "set", "", "--max-queued", "1"][..],
        &["tenant", "remove", ""][..],
        &["tenant", "set", "acme", "--max-running", "-2"][..],
    ] {
        run(outbox(dir.path())
            .args(["--database-url", DOWN_PG_URL])
            .args(args))
        .expect_code(2);
    }
}
