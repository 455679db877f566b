//! The operator's task commands: `outbox list` (keyset pages), `outbox show ID` (every
//! column, the chain, the error chain), `outbox retry --all` (dry run, confirmation, audit in
//! the change's transaction); bad input exits 1 or 2 and changes nothing.

use std::path::Path;
use std::process::Command;

use outbox::{enqueue, enqueue_batch, Backend, NewTask};
use serde_json::Value;

use crate::binary::{outbox, outbox_on, run, workdir, DOWN_PG_URL};
use crate::db::tasks_in;
use crate::every_backend;
use crate::support::TestDb;

/// `outbox` on the test database as the operator `tester` (the audit's actor is
/// `tester@host`).
fn operator(db: &TestDb, dir: &Path) -> Command {
    let mut cmd = outbox_on(db, dir);
    cmd.env("USER", "tester");
    cmd
}

/// The JSON lines of a command's output.
fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Enqueues `points.credit` tasks whose biz_id is not an order number, and drains them with
/// the binary: the handler fails them for good, so they end dead. Returns their ids.
fn dead_tasks(db: &TestDb, dir: &Path, names: &[&str]) -> Vec<i64> {
    let data = r#"{"user_id": 1, "amount_cents": 500}"#;
    for name in names {
        run(outbox_on(db, dir).args(["enqueue", "points.credit", name, "--data", data]))
            .expect_code(0);
    }
    run(outbox_on(db, dir).arg("drain")).expect_code(0);
    names
        .iter()
        .map(|name| {
            let id = db.count(&format!(
                "SELECT id FROM async_task WHERE biz_id = '{name}'"
            ));
            assert_eq!(db.task(id).state, "dead", "task {name}");
            id
        })
        .collect()
}

fn audits(db: &TestDb) -> i64 {
    db.count("SELECT count(*) FROM async_audit")
}

every_backend! {
    fn list_pages_with_a_cursor_as_a_table_and_as_json(db: &TestDb) {
        let dir = workdir();
        let mut conn = db.conn();
        let ids: Vec<i64> = (0..7)
            .map(|i| enqueue(&mut conn, &NewTask::new("mail.send", i.to_string()).tenant("acme")).unwrap().id)
            .collect();
        enqueue(&mut conn, &NewTask::new("sms.send", "x")).unwrap();

        let out = run(outbox_on(db, dir.path()).args(["list", "--keyword", "mail.send", "--limit", "3"])).expect_code(0);
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(lines[0], "id  state    keyword    biz_id  tenant  failures  age  last error", "{}", out.stdout);
        assert!(lines[1].starts_with(&format!("{:>2}  pending  mail.send  0       acme           0", ids[0])), "{}", out.stdout);
        out.stdout_has(&format!("more tasks match: add --after-id {} for the next page", ids[2]));

        // The JSON pages, followed by their cursor, cover every task once.
        let mut seen = Vec::new();
        let mut cursor: Option<i64> = None;
        loop {
            let mut cmd = outbox_on(db, dir.path());
            cmd.args(["list", "--keyword", "mail.send", "--limit", "3", "--json"]);
            if let Some(id) = cursor {
                cmd.args(["--after-id", &id.to_string()]);
            }
            let lines = json_lines(&run(&mut cmd).expect_code(0).stdout);
            let (last, tasks) = lines.split_last().unwrap();
            assert!(tasks.len() <= 3);
            for task in tasks {
                assert_eq!((task["keyword"].as_str(), task["state"].as_str()), (Some("mail.send"), Some("pending")));
                seen.push(task["id"].as_i64().unwrap());
            }
            match last["next_after_id"].as_i64() {
                Some(id) => cursor = Some(id),
                None => break,
            }
        }
        assert_eq!(seen, ids);

        // Filters that match nothing say so and succeed.
        run(outbox_on(db, dir.path()).args(["list", "--state", "dead"]))
            .expect_code(0)
            .stdout_has("no tasks match");
        run(outbox_on(db, dir.path()).args(["list", "--after-id", &ids[6].to_string(), "--keyword", "mail.send"]))
            .expect_code(0)
            .stdout_has("no more tasks match");
        let out = run(outbox_on(db, dir.path()).args(["list", "--tenant", "nobody", "--json"])).expect_code(0);
        assert_eq!(out.stdout.trim(), r#"{"next_after_id":null}"#);
        // Newest first, and the age filters by the database clock.
        let out = run(outbox_on(db, dir.path()).args(["list", "--newest-first", "--limit", "1", "--json", "--newer-than", "1h"])).expect_code(0);
        assert_eq!(json_lines(&out.stdout)[0]["keyword"], "sms.send");
        run(outbox_on(db, dir.path()).args(["list", "--older-than", "1h"]))
            .expect_code(0)
            .stdout_has("no tasks match");
    }

    fn show_prints_every_column_the_chain_and_the_error_chain(db: &TestDb) {
        let dir = workdir();
        let parent = dead_tasks(db, dir.path(), &["p"])[0];
        // Children enqueued after their parent died are cancelled at once, saying why.
        let child = enqueue(&mut db.conn(), &NewTask::new("coupon.grant", "c").after(parent)).unwrap().id;
        let out = run(outbox_on(db, dir.path()).args(["show", &parent.to_string()])).expect_code(0);
        out.stdout_has(&format!("id           {parent}"))
            .stdout_has("keyword      points.credit")
            .stdout_has("state        dead")
            .stdout_has("failures     1 (max attempts: the worker's)")
            .stdout_has("last_error   biz_id is not an order number")
            .stdout_has(r#"biz_data     {"amount_cents":500,"user_id":1}"#)
            .stdout_has("parents      -")
            .stdout_has(&format!("children     {child} coupon.grant c (cancelled)"));

        let out = run(outbox_on(db, dir.path()).args(["show", &child.to_string()])).expect_code(0);
        out.stdout_has(&format!("parents      {parent} points.credit p (dead)"))
            .stdout_has("error chain")
            .stdout_has(&format!("  {child} coupon.grant c (cancelled): parent task {parent} is dead"))
            .stdout_has(&format!("  {parent} points.credit p (dead): biz_id is not an order number"));
        let out = run(outbox_on(db, dir.path()).args(["show", &child.to_string(), "--json"])).expect_code(0);
        let json: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!((json["id"].as_i64(), json["state"].as_str()), (Some(child), Some("cancelled")));
        assert_eq!(json["parents"][0]["id"].as_i64(), Some(parent));
        assert_eq!(json["error_chain"].as_array().unwrap().len(), 2);

        // An unknown id: exit 1 naming it.
        run(outbox_on(db, dir.path()).args(["show", "999999"]))
            .expect_code(1)
            .stderr_has("no task 999999");
        run(outbox_on(db, dir.path()).args(["show", "many"])).expect_code(2);
    }

    fn retry_all_counts_in_a_dry_run_then_retries_and_audits(db: &TestDb) {
        let dir = workdir();
        let dead = dead_tasks(db, dir.path(), &["a", "b", "c"]);
        run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", "1"])).expect_code(0);

        run(operator(db, dir.path()).args(["retry", "--all", "--keyword", "points.credit", "--dry-run"]))
            .expect_code(0)
            .stdout_has("3 dead or cancelled task(s) match; nothing written (--dry-run)");
        run(operator(db, dir.path()).args(["retry", "--all", "--keyword", "mail.send"]))
            .expect_code(0)
            .stdout_has("no dead or cancelled task matches; nothing written");
        let out = run(operator(db, dir.path()).args(["retry", "--all", "--keyword", "mail.send", "--json"]))
            .expect_code(0);
        let json: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!((json["matched"].as_u64(), json["dry_run"].as_bool()), (Some(0), Some(false)), "not asked as a dry run");
        assert_eq!((tasks_in(db, "dead"), audits(db)), (3, 0));

        let out = run(operator(db, dir.path()).args(["retry", "--all", "--state", "dead", "--json"])).expect_code(0);
        let json: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!((json["matched"].as_u64(), json["changed"].as_u64(), json["dry_run"].as_bool()), (Some(3), Some(3), Some(false)));
        for id in &dead {
            let row = db.task(*id);
            assert_eq!((row.state.as_str(), row.failures), ("pending", 0), "task {id}");
        }
        assert_eq!(
            db.count("SELECT count(*) FROM async_audit WHERE action = 'task.retry' AND actor LIKE 'tester@%' AND affected = 3 AND target = 'state=dead'"),
            1
        );
        // One task by id, as before.
        run(outbox_on(db, dir.path()).arg("drain")).expect_code(0);
        run(operator(db, dir.path()).args(["retry", &dead[0].to_string()]))
            .expect_code(0)
            .stdout_has(&format!("task {} is pending again", dead[0]));
    }

    fn retry_by_id_and_retry_all_leave_a_child_whose_parent_was_pruned_and_say_why(db: &TestDb) {
        let dir = workdir();
        let parent = dead_tasks(db, dir.path(), &["p"])[0];
        // Enqueued under a dead parent: cancelled at once.
        let child = enqueue(&mut db.conn(), &NewTask::new("coupon.grant", "c").after(parent)).unwrap().id;
        db.exec(&format!("UPDATE async_task SET finished_at = {} WHERE id = {parent}", db.ago_sql(7_200_000)));
        run(outbox_on(db, dir.path()).args(["prune", "--older-than", "1h"]))
            .expect_code(0)
            .stdout_has("pruned 1 task (1 dead)");

        let out = run(operator(db, dir.path()).args(["retry", &child.to_string()])).expect_code(0);
        assert_eq!(
            out.stdout.trim(),
            format!("task {child} is cancelled and stays so: a parent it waited for was pruned, so the outcome it depended on is gone; nothing written")
        );
        run(operator(db, dir.path()).args(["retry", "--all", "--dry-run"]))
            .expect_code(0)
            .stdout_has("no dead or cancelled task can be retried (1 left as it is: a parent it waited for was pruned); nothing written");
        let out = run(operator(db, dir.path()).args(["retry", "--all", "--json"])).expect_code(0);
        let json: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!((json["matched"].as_u64(), json["changed"].as_u64(), json["skipped"].as_u64()), (Some(0), Some(0), Some(1)));
        assert_eq!((db.task(child).state.as_str(), audits(db)), ("cancelled", 0));

        // Beside a task it does retry.
        let other = dead_tasks(db, dir.path(), &["q"])[0];
        run(operator(db, dir.path()).args(["retry", "--all"]))
            .expect_code(0)
            .stdout_has("retried 1 task(s) (1 left as it is: a parent it waited for was pruned)");
        assert_eq!((db.task(other).state.as_str(), db.task(child).state.as_str()), ("pending", "cancelled"));
    }

    fn retry_refuses_bad_input_and_changes_nothing(db: &TestDb) {
        let dir = workdir();
        let dead = dead_tasks(db, dir.path(), &["a"]);
        for (args, message) in [
            (&["retry", "--all", "--state", "pending"][..], "state of a retry must be dead or cancelled, not pending"),
            (&["retry", "--all", "--older-than", "a while"][..], "--older-than"),
            (&["retry", "--all", "--state", "finished"][..], "expected one of"),
            (&["retry", &dead[0].to_string(), "--keyword", "points.credit"][..], "takes an id or, with --all, filter flags"),
            (&["retry", "--dry-run", &dead[0].to_string()][..], "--dry-run and --yes go with --all"),
            (&["retry", &dead[0].to_string(), "--yes"][..], "--dry-run and --yes go with --all"),
            (&["cancel", &dead[0].to_string(), "--dry-run"][..], "--dry-run goes with --all"),
            (&["retry"][..], "Usage"),
        ] {
            run(operator(db, dir.path()).args(args)).expect_code(2).stderr_has(message);
        }
        run(operator(db, dir.path()).args(["retry", "999999"]))
            .expect_code(1)
            .stderr_has("no task 999999");
        assert_eq!((tasks_in(db, "dead"), audits(db)), (1, 0));
    }

    fn a_retry_over_a_thousand_tasks_needs_a_confirmation(db: &TestDb) {
        let dir = workdir();
        let batch: Vec<NewTask> = (0..1001).map(|i| NewTask::new("bulk.send", i.to_string())).collect();
        enqueue_batch(&mut db.conn(), &batch).unwrap();
        let finished = match db.backend() {
            Backend::Postgres => "now()",
            Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
            Backend::Mysql => "UTC_TIMESTAMP(3)",
        };
        db.exec(&format!("UPDATE async_task SET state = 'dead', failures = 1, finished_at = {finished}"));
        // Without a terminal to ask on (stdin is not one here): refused, nothing written.
        run(operator(db, dir.path()).args(["retry", "--all", "--keyword", "bulk.send"]))
            .expect_code(2)
            .stderr_has("retry of 1001 tasks (over 1000) needs --yes without a terminal to confirm on; nothing written");
        assert_eq!((tasks_in(db, "dead"), audits(db)), (1001, 0));
        // A dry run never asks.
        run(operator(db, dir.path()).args(["retry", "--all", "--dry-run"]))
            .expect_code(0)
            .stdout_has("1001 dead or cancelled task(s) match");
        run(operator(db, dir.path()).args(["retry", "--all", "--keyword", "bulk.send", "--yes"]))
            .expect_code(0)
            .stdout_has("retried 1001 task(s)");
        assert_eq!(tasks_in(db, "pending"), 1001);
        assert_eq!(db.count("SELECT count(*) FROM async_audit WHERE affected = 1001"), 1);
    }

    fn a_retry_whose_audit_row_fails_is_not_made(db: &TestDb) {
        let dir = workdir();
        dead_tasks(db, dir.path(), &["a", "b"]);
        match db.backend() {
            Backend::Postgres => db.exec(
                "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN RAISE EXCEPTION 'audit refused'; END $$;
                 CREATE TRIGGER refuse_audit BEFORE INSERT ON async_audit FOR EACH ROW
                 WHEN (NEW.actor LIKE 'refused@%') EXECUTE FUNCTION refuse_audit();",
            ),
            Backend::Sqlite => db.exec(
                "CREATE TRIGGER refuse_audit BEFORE INSERT ON async_audit
                 WHEN NEW.actor LIKE 'refused@%' BEGIN SELECT RAISE(ABORT, 'audit refused'); END;",
            ),
            Backend::Mysql => db.exec(
                "CREATE TRIGGER refuse_audit BEFORE INSERT ON async_audit FOR EACH ROW
                 BEGIN IF NEW.actor LIKE 'refused@%' THEN
                     SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'audit refused';
                 END IF; END",
            ),
        }
        let mut refused = outbox_on(db, dir.path());
        refused.env("USER", "refused");
        run(refused.args(["retry", "--all", "--state", "dead"]))
            .expect_code(1)
            .stderr_has("audit refused");
        assert_eq!((tasks_in(db, "dead"), audits(db)), (2, 0), "neither the retry nor its audit");
        run(operator(db, dir.path()).args(["retry", "--all", "--state", "dead"]))
            .expect_code(0)
            .stdout_has("retried 2 task(s)");
        assert_eq!(audits(db), 1);
    }
}

#[test]
fn the_task_commands_refuse_bad_usage_before_any_database_is_reached() {
    let dir = workdir();
    // No server listens there: a check after connecting would fail with exit 1.
    for args in [
        &["list", "--limit", "0"][..],
        &["list", "--limit", "1001"][..],
        &["list", "--state", "finished"][..],
        &["list", "--older-than", "soon"][..],
        &["list", "--keyword", "Mail"][..],
        &["list", "--tenant", ""][..],
        &["list", "--biz-id", ""][..],
        &["list", "--newer-than", "1000000d"][..],
        &["show"][..],
        &["retry", "--all", "--state", "running"][..],
        &["retry", "--all", "--yes", "--keyword", "Bad"][..],
    ] {
        run(outbox(dir.path())
            .args(["--database-url", DOWN_PG_URL])
            .args(args))
        .expect_code(2);
    }
    // Valid input on a database that is down: exit 1 naming the connection.
    run(outbox(dir.path())
        .args(["--database-url", DOWN_PG_URL])
        .args(["list", "--state", "dead"]))
    .expect_code(1)
    .stderr_has("cannot connect");
}

#[test]
fn a_listing_piped_into_a_reader_that_stops_early_exits_quietly() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::Stdio;

    let db = TestDb::sqlite();
    let dir = workdir();
    let batch: Vec<NewTask> = (0..1000)
        .map(|i| NewTask::new("mail.send", i.to_string()))
        .collect();
    enqueue_batch(&mut db.conn(), &batch).unwrap();
    // Far more than a pipe holds (about 350 KB): the listing writes after `head` is gone.
    let mut child = outbox_on(&db, dir.path())
        .args(["list", "--limit", "1000", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with(r#"{"id":1,"#), "{first}");
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!((status.code(), stderr.as_str()), (Some(0), ""));
}
