//! Terminal safety: what producers wrote (a biz_id, a tenant, an error) reaches
//! the operator's terminal with its control characters escaped, in every output for people;
//! JSON output keeps it exact.

use outbox::{enqueue, NewTask};
use serde_json::Value;

use crate::binary::{outbox_on, run, workdir};
use crate::every_backend;

const BIZ_ID: &str = "o-42\x1b]0;pwned\x07\nforged line";
const TENANT: &str = "acme\x1b[2J\r\n";
const ERROR: &str = "boom\x07\nsecond line\x1b]8;;http://x\x07";

/// Fails unless `text` holds no control character but the newlines that end its lines.
fn assert_no_controls(what: &str, text: &str) {
    let bad: Vec<char> = text
        .chars()
        .filter(|c| c.is_control() && *c != '\n')
        .collect();
    assert!(bad.is_empty(), "{what} holds {bad:?}:\n{text}");
}

every_backend! {
    fn what_producers_wrote_is_shown_escaped_and_json_exact(db: &TestDb) {
        let dir = workdir();
        // A producer's task, with an error written by plain SQL. (A keyword cannot hold
        // them: the schema's CHECK refuses it.)
        let id = enqueue(&mut db.conn(), &NewTask::new("mail.send", BIZ_ID).tenant(TENANT)).unwrap().id;
        db.exec(&format!(
            "UPDATE async_task SET last_error = '{ERROR}', failures = 1 WHERE id = {id}"
        ));

        let list = run(outbox_on(db, dir.path()).arg("list")).expect_code(0);
        assert_no_controls("list", &list.stdout);
        assert_eq!(list.stdout.lines().count(), 3, "a header, the task, the footer:\n{}", list.stdout);
        // The biz_id's column is 32 characters wide.
        list.stdout_has(r"o-42\x1b]0;pwned\x07\nforged li…")
            .stdout_has(r"acme\x1b[2J\r\n")
            .stdout_has(r"boom\x07…");

        let show = run(outbox_on(db, dir.path()).args(["show", &id.to_string()])).expect_code(0);
        assert_no_controls("show", &show.stdout);
        show.stdout_has(r"o-42\x1b]0;pwned\x07\nforged line")
            .stdout_has(r"acme\x1b[2J\r\n")
            .stdout_has(r"boom\x07\nsecond line\x1b]8;;http://x\x07");
        assert!(!show.stdout.lines().any(|l| l.starts_with("forged") || l.starts_with("second")));

        // JSON keeps every character.
        let json: Value = serde_json::from_str(
            &run(outbox_on(db, dir.path()).args(["show", &id.to_string(), "--json"])).expect_code(0).stdout,
        )
        .unwrap();
        let task = if json.get("task").is_some() { &json["task"] } else { &json };
        assert_eq!(
            (task["biz_id"].as_str(), task["tenant"].as_str(), task["last_error"].as_str()),
            (Some(BIZ_ID), Some(TENANT), Some(ERROR))
        );
        let list_json = run(outbox_on(db, dir.path()).args(["list", "--json"])).expect_code(0).stdout;
        let first: Value = serde_json::from_str(list_json.lines().next().unwrap()).unwrap();
        assert_eq!((first["biz_id"].as_str(), first["last_error"].as_str()), (Some(BIZ_ID), Some(ERROR)));

        // What an operator enqueues is echoed escaped, created or found.
        for expected in ["created task", "already exists"] {
            let out = run(outbox_on(db, dir.path()).args(["enqueue", "sms.send", BIZ_ID, "--tenant", TENANT])).expect_code(0);
            assert_no_controls("enqueue", &out.stdout);
            out.stdout_has(expected).stdout_has(r"sms.send o-42\x1b]0;pwned\x07\nforged line");
        }
        let out = run(outbox_on(db, dir.path()).args(["enqueue", "sms.send", BIZ_ID, "--json"])).expect_code(0);
        let echoed: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!(echoed["biz_id"].as_str(), Some(BIZ_ID));

        // An error naming the task is escaped too.
        let out = run(outbox_on(db, dir.path()).args(["enqueue", "sms.send", BIZ_ID, "--data", "{"])).expect_code(2);
        assert_no_controls("an enqueue's error", out.stderr());
    }
}
