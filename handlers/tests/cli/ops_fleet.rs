//! The operator's fleet commands: `outbox nodes` (a real `outbox run` listed live, then gone
//! after SIGTERM) and `outbox audit` (every change from the CLI, newest first).

use std::path::Path;
use std::process::Command;

use outbox::{enqueue, Backend, NewTask};
use serde_json::Value;

use crate::binary::{
    outbox, outbox_on, run, wait_until, workdir, Running, DOWN_PG_URL, STOP_LIMIT, WORK_LIMIT,
};
use crate::every_backend;
use crate::support::TestDb;

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The node of `outbox nodes --json` whose name ends with `:pid`.
fn node_of(db: &TestDb, dir: &Path, pid: u32) -> Option<Value> {
    let out = run(outbox_on(db, dir).args(["nodes", "--json"])).expect_code(0);
    json_lines(&out.stdout).into_iter().find(|n| {
        n["name"]
            .as_str()
            .is_some_and(|name| name.ends_with(&format!(":{pid}")))
    })
}

fn sigterm(pid: u32) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child, not yet
    // reaped (we hold its `Child` and have not waited for it since it was seen running).
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
}

/// `outbox` on the test database as the operator `tester`.
fn operator(db: &TestDb, dir: &Path) -> Command {
    let mut cmd = outbox_on(db, dir);
    cmd.env("USER", "tester");
    cmd
}

every_backend! {
    fn nodes_lists_a_running_worker_live_then_gone(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).arg("nodes"))
            .expect_code(0)
            .stdout_has("no nodes: no worker has run on this database");
        let mut worker = Running::spawn(outbox_on(db, dir.path()).args(["run", "--heartbeat", "1s"]));
        let pid = worker.pid();
        wait_until(WORK_LIMIT, "outbox nodes to list the worker", || {
            if let Some(status) = worker.exited() {
                panic!("outbox run exited on its own with {status}");
            }
            node_of(db, dir.path(), pid).is_some()
        });
        let node = node_of(db, dir.path(), pid).unwrap();
        assert_eq!((node["status"].as_str(), node["running"].as_i64()), (Some("live"), Some(0)), "{node}");
        assert!(node["heartbeat_age_secs"].as_f64().unwrap() < 15.0, "{node}");

        sigterm(pid);
        worker.finish(STOP_LIMIT).expect_code(0);
        let node = node_of(db, dir.path(), pid).unwrap();
        assert_eq!(node["status"], "gone", "{node}");

        // A killed node (its heartbeat two minutes old) holding a task: silent, 1 running
        // (no live node is left to rescue it).
        let (stale, now) = match db.backend() {
            Backend::Postgres => ("now() - interval '2 minutes'", "now()"),
            Backend::Sqlite => (
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '-120 seconds')",
                "strftime('%Y-%m-%d %H:%M:%f', 'now')",
            ),
            Backend::Mysql => ("UTC_TIMESTAMP(3) - INTERVAL 120 SECOND", "UTC_TIMESTAMP(3)"),
        };
        db.exec(&format!("INSERT INTO async_node (name, heartbeat_at) VALUES ('killed:1', {stale})"));
        let killed = db.count("SELECT id FROM async_node WHERE name = 'killed:1'");
        let task = enqueue(&mut db.conn(), &NewTask::new("unserved.kind", "1")).unwrap().id;
        db.exec(&format!(
            "UPDATE async_task SET state = 'running', owner = {killed}, claim_token = 1, \
             claimed_at = {now}, deadline_at = {now} WHERE id = {task}"
        ));
        let out = run(outbox_on(db, dir.path()).arg("nodes")).expect_code(0);
        let header: Vec<&str> = out.stdout.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(header, ["id", "name", "status", "heartbeat", "running", "started"], "{}", out.stdout);
        let killed_line = out.stdout.lines().find(|l| l.contains("killed:1")).unwrap().to_owned();
        let cells: Vec<&str> = killed_line.split_whitespace().collect();
        assert_eq!((cells[2], cells[4]), ("silent", "1"), "{}", out.stdout);
        assert!(cells[3].starts_with("2m0"), "{}", out.stdout);
        out.stdout_has("(0 live of 2 listed)");
        // A longer --dead-after counts it as live.
        run(outbox_on(db, dir.path()).args(["nodes", "--dead-after", "1h"]))
            .expect_code(0)
            .stdout_has("(1 live of 2 listed)");
        run(outbox_on(db, dir.path()).args(["nodes", "--limit", "0"])).expect_code(2);
    }

    fn audit_lists_the_operators_changes_newest_first(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).arg("audit"))
            .expect_code(0)
            .stdout_has("no audited changes match");
        for biz in ["1", "2"] {
            run(outbox_on(db, dir.path()).args(["enqueue", "mail.send", biz])).expect_code(0);
        }
        let id = db.count("SELECT id FROM async_task WHERE biz_id = '1'");
        run(operator(db, dir.path()).args(["cancel", &id.to_string()])).expect_code(0);
        run(operator(db, dir.path()).args(["retry", &id.to_string()])).expect_code(0);
        run(operator(db, dir.path()).args(["cancel", "--all", "--keyword", "mail.send"])).expect_code(0);
        run(operator(db, dir.path()).args(["tenant", "set", "acme", "--weight", "2"])).expect_code(0);
        // A change refused is not audited.
        run(operator(db, dir.path()).args(["pause", "mail.send"]))
            .expect_code(2)
            .stderr_has("no domain or keyword");
        // Dry runs are not audited.
        run(operator(db, dir.path()).args(["retry", "--all", "--dry-run"])).expect_code(0);

        let out = run(outbox_on(db, dir.path()).arg("audit")).expect_code(0);
        let lines: Vec<&str> = out.stdout.lines().collect();
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(header, ["id", "at", "actor", "action", "rows", "target"], "{}", out.stdout);
        let actions: Vec<(&str, &str, &str)> = lines[1..]
            .iter()
            .map(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                (cells[3], cells[4], cells[5])
            })
            .collect();
        let id_text = id.to_string();
        assert_eq!(
            actions,
            [
                ("tenant.set", "1", "acme"),
                ("task.cancel", "2", "keyword=mail.send"),
                ("task.retry", "1", id_text.as_str()),
                ("task.cancel", "1", id_text.as_str()),
            ],
            "{}",
            out.stdout
        );
        assert!(lines[1].contains(" tester@"), "{}", out.stdout);

        let out = run(outbox_on(db, dir.path()).args(["audit", "--action", "task", "--limit", "2", "--json"])).expect_code(0);
        let lines = json_lines(&out.stdout);
        assert_eq!(lines.len(), 3, "two rows and the cursor");
        assert_eq!((lines[0]["action"].as_str(), lines[0]["affected"].as_i64()), (Some("task.cancel"), Some(2)));
        assert_eq!(lines[0]["detail"]["keyword"], "mail.send");
        assert!(lines[0]["actor"].as_str().unwrap().starts_with("tester@"));
        let cursor = lines[2]["next_before_id"].as_i64().unwrap();
        let out = run(outbox_on(db, dir.path()).args(["audit", "--action", "task", "--before-id", &cursor.to_string(), "--json"])).expect_code(0);
        let older = json_lines(&out.stdout);
        assert_eq!(older.len(), 2);
        assert_eq!((older[0]["action"].as_str(), older[1]["next_before_id"].as_i64()), (Some("task.cancel"), None));
        let out = run(outbox_on(db, dir.path()).args(["audit", "--limit", "1"])).expect_code(0);
        out.stdout_has("older changes: add --before-id");
        run(outbox_on(db, dir.path()).args(["audit", "--action", "domain"]))
            .expect_code(0)
            .stdout_has("no audited changes match");
    }
}

#[test]
fn the_fleet_commands_refuse_bad_usage_before_any_database_is_reached() {
    let dir = workdir();
    for args in [
        &["nodes", "--limit", "0"][..],
        &["nodes", "--dead-after", "never"][..],
        &["audit", "--action", "Task Retry"][..],
        &["audit", "--limit", "5000"][..],
        &["audit", "--before-id", "x"][..],
    ] {
        run(outbox(dir.path())
            .args(["--database-url", DOWN_PG_URL])
            .args(args))
        .expect_code(2);
    }
}

#[test]
fn the_operator_commands_are_listed_and_each_has_help_and_json() {
    let dir = workdir();
    let top = run(outbox(dir.path()).arg("--help")).expect_code(0);
    for sub in ["list", "show", "retry", "cancel", "nodes", "audit"] {
        assert!(
            top.stdout.lines().any(|l| l.trim_start().starts_with(sub)),
            "--help does not list {sub}:\n{}",
            top.stdout
        );
        run(outbox(dir.path()).args([sub, "--help"]))
            .expect_code(0)
            .stdout_has(&format!("Usage: outbox {sub}"))
            .stdout_has("--json");
    }
    assert!(
        crate::binary::entries(dir.path()).is_empty(),
        "--help touched a database"
    );
}
