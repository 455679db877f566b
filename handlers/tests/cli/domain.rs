//! Domains' run-time control: `outbox domain list|set|release`, `outbox pause|resume`, and
//! the domains' lines of `outbox stats`.
//!
//! A live node is simulated by an `async_node` row whose `domains` column holds what a node
//! publishes at its heartbeat (JSON of `outbox::domain::NodeDomains`), with `heartbeat_at` =
//! now; the worker tests in the main suite cover real nodes publishing and applying it.

use std::path::Path;
use std::process::Command;

use outbox::Backend;
use serde_json::{json, Value};

use crate::binary::{outbox, outbox_on, run, workdir, DOWN_PG_URL};
use crate::every_backend;
use crate::support::TestDb;

/// `outbox` on the test database as the operator `tester` (the audit's actor is
/// `tester@host`).
fn operator(db: &TestDb, dir: &Path) -> Command {
    let mut cmd = outbox_on(db, dir);
    cmd.env("USER", "tester");
    cmd
}

/// One domain of a node's published JSON.
fn domain_use(
    domain: &str,
    mode: &str,
    keywords: &[&str],
    threads: usize,
    used: [usize; 5],
) -> Value {
    let [reserved, borrowed, running, queued, stuck] = used;
    json!({
        "domain": domain, "mode": mode, "keywords": keywords, "threads": threads,
        "reserved": reserved, "borrowed": borrowed, "running": running, "queued": queued,
        "stuck": stuck, "queue": 32, "timeout_ms": 300_000, "paused": false, "released": false,
    })
}

/// Inserts a node row publishing `domains` on `threads` threads, its heartbeat now (or two
/// minutes ago when `stale`: past `LIVE_WITHIN`).
fn node(db: &TestDb, name: &str, threads: usize, domains: Vec<Value>, stale: bool) {
    let published = json!({"threads": threads, "domains": domains}).to_string();
    let heartbeat = match (db.backend(), stale) {
        (Backend::Postgres, false) => "now()",
        (Backend::Postgres, true) => "now() - interval '2 minutes'",
        (Backend::Sqlite, false) => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
        (Backend::Sqlite, true) => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-120 seconds')",
        (Backend::Mysql, false) => "UTC_TIMESTAMP(3)",
        (Backend::Mysql, true) => "UTC_TIMESTAMP(3) - INTERVAL 120 SECOND",
    };
    db.exec(&format!(
        "INSERT INTO async_node (name, heartbeat_at, domains) VALUES ('{name}', {heartbeat}, '{published}')"
    ));
}

/// The JSON lines of `outbox domain list --json` (or `stats --json`) that have `key`.
fn lines_with(stdout: &str, key: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .filter(|v| v.get(key).is_some())
        .collect()
}

fn listed(db: &TestDb, dir: &Path, domain: &str) -> Value {
    let out = run(operator(db, dir).args(["domain", "list", "--json"])).expect_code(0);
    lines_with(&out.stdout, "domain")
        .into_iter()
        .find(|d| d["domain"] == domain)
        .unwrap_or_else(|| panic!("{domain} not listed:\n{}", out.stdout))
}

fn audits(db: &TestDb, action: &str) -> i64 {
    db.count(&format!(
        "SELECT count(*) FROM async_audit WHERE action = '{action}' AND actor LIKE 'tester@%' AND affected = 1"
    ))
}

/// What an error must leave as it was: the rows, their versions, the audit.
fn snapshot(db: &TestDb) -> [i64; 4] {
    [
        db.count("SELECT count(*) FROM async_domain"),
        db.count("SELECT coalesce(sum(version), 0) FROM async_domain"),
        db.count("SELECT count(*) FROM async_pause"),
        db.count("SELECT count(*) FROM async_audit"),
    ]
}

every_backend! {
    fn set_then_list_round_trips_and_a_no_op_is_not_audited(db: &TestDb) {
        let dir = workdir();
        run(operator(db, dir.path()).args([
            "domain", "set", "payments", "--keywords", "payment.refund,payment.capture",
            "--reserved", "2", "--queue", "16", "--timeout", "30s",
        ]))
        .expect_code(0)
        .stdout_has("domain payments set (keywords payment.refund, payment.capture; RESERVED 2; queue 16; timeout 30s), version 1");
        let listed1 = listed(db, dir.path(), "payments");
        assert_eq!(listed1["mode"], "reserved");
        assert_eq!(listed1["per_node"], 2);
        assert_eq!(listed1["keywords"], json!(["payment.capture", "payment.refund"]));
        assert_eq!((listed1["queue"].as_u64(), listed1["timeout_ms"].as_u64()), (Some(16), Some(30_000)));
        assert_eq!((listed1["paused"].as_bool(), listed1["nodes"].as_u64()), (Some(false), Some(0)));
        assert_eq!(listed1["setting"]["version"], 1);
        assert!(listed1["setting"]["updated_by"].as_str().unwrap().starts_with("tester@"), "{listed1}");
        // UTC `YYYY-MM-DD HH:MM:SS.SSS` on every backend.
        let at = listed1["setting"]["updated_at"].as_str().unwrap();
        assert!(at.len() == 23 && &at[10..11] == " " && &at[19..20] == ".", "{at}");

        // A change of mode keeps the other fields; the row's version moves on.
        let out = run(operator(db, dir.path()).args(["domain", "set", "payments", "--max", "1", "--json"])).expect_code(0);
        let changed: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!((changed["changed"].as_bool(), changed["action"].as_str()), (Some(true), Some("domain.set")));
        assert_eq!(changed["setting"]["version"], 2);
        let listed2 = listed(db, dir.path(), "payments");
        assert_eq!((listed2["mode"].as_str(), listed2["per_node"].as_u64()), (Some("max"), Some(1)));
        assert_eq!(listed2["keywords"], listed1["keywords"]);
        assert_eq!(listed2["queue"], 16);

        // The same again changes nothing: nothing written, nothing audited.
        run(operator(db, dir.path()).args(["domain", "set", "payments", "--max", "1"]))
            .expect_code(0)
            .stdout_has("domain payments is already set so; nothing written");
        assert_eq!(db.count("SELECT version FROM async_domain WHERE name = 'payments'"), 2);
        assert_eq!(audits(db, "domain.set"), 2);
        assert_eq!(
            db.count("SELECT count(*) FROM async_audit WHERE target = 'payments' AND actor LIKE 'tester@%'"),
            2
        );
    }
}

every_backend! {
    fn set_refuses_bad_input_with_exit_2_and_writes_nothing(db: &TestDb) {
        let dir = workdir();
        run(operator(db, dir.path()).args(["domain", "set", "payments", "--keywords", "payment.capture", "--reserved", "1"]))
            .expect_code(0);
        node(db, "w1", 4, vec![
            domain_use("default", "max", &["points.credit"], 2, [0; 5]),
            domain_use("mail", "max", &["mail.send"], 1, [0; 5]),
        ], false);
        let before = snapshot(db);
        for (args, message) in [
            (&["domain", "set", "Pay!", "--max", "1"][..], "only a-z, 0-9 and . _ : - are allowed"),
            (&["domain", "set", "default", "--keywords", "x.y"][..], "domain \"default\": is the domain of every keyword no other domain lists"),
            (&["domain", "set", "default", "--max", "2"][..], "is always MAX"),
            (&["domain", "set", "default", "--queue", "2"][..], "can only be paused and resumed"),
            (&["domain", "set", "reports", "--keywords", "report.build"][..], "domain \"reports\": is a new domain"),
            (&["domain", "set", "reports", "--max", "1"][..], "domain \"reports\": is a new domain"),
            (&["domain", "set", "refunds", "--keywords", "payment.capture", "--max", "1"][..],
                "domain \"refunds\": keyword \"payment.capture\" belongs to domain \"payments\" (in async_domain)"),
            (&["domain", "set", "bulk", "--keywords", "mail.send", "--max", "1"][..],
                "domain \"bulk\": keyword \"mail.send\" belongs to domain \"mail\" (on node"),
            (&["domain", "set", "reports", "--keywords", "report.build", "--max", "5"][..],
                "w1, 4 threads): MAX 5 is over the node's 4 threads"),
            (&["domain", "set", "reports", "--keywords", "report.build", "--reserved", "3"][..],
                "domain \"reports\": on node"),
            (&["domain", "set", "mail", "--reserved", "3"][..],
                "brings the RESERVED threads to 4 of the node's 4: default must keep at least one"),
            (&["domain", "set", "payments", "--max", "-1"][..], "must be at least 0, not -1"),
            (&["domain", "set", "payments", "--max", "0"][..], "MAX must be at least 1"),
            (&["domain", "set", "payments", "--queue", "many"][..], "--queue"),
            (&["domain", "set", "payments", "--timeout", "10ms"][..], "timeout must be between 100ms and 100 years"),
            (&["domain", "set", "payments", "--keywords", "a,a"][..], "lists keyword \"a\" twice"),
            (&["domain", "set", "payments"][..], "nothing to set"),
            (&["domain", "set", "payments", "--max", "1", "--reserved", "1"][..], "--reserved"),
            (&["domain", "release", "default"][..], "holds no reserved threads"),
            (&["domain", "release", "nowhere"][..], "no domain or keyword \"nowhere\""),
            (&["pause", "nowhere"][..], "no domain or keyword \"nowhere\""),
            (&["resume", "nowhere"][..], "no domain or keyword \"nowhere\""),
            (&["pause", "Mail Send"][..], "only a-z"),
        ] {
            run(operator(db, dir.path()).args(args)).expect_code(2).stderr_has(message);
            assert_eq!(snapshot(db), before, "{args:?} wrote something");
        }
        // The RESERVED refusal is at the boundary: one thread fewer leaves default one. A
        // stale node (past LIVE_WITHIN) with a single thread is not checked against.
        node(db, "stale", 1, vec![domain_use("default", "max", &["points.credit"], 1, [0; 5])], true);
        run(operator(db, dir.path()).args(["domain", "set", "reports", "--keywords", "report.build", "--reserved", "2"]))
            .expect_code(0)
            .stdout_has("domain reports set")
            // w1 adds the domain its row defines; the stale node does not count.
            .stdout_has("; 1 live node applies it at its next heartbeat");
        assert_eq!(audits(db, "domain.set"), 2);
    }
}

every_backend! {
    fn release_pause_and_resume_a_domain(db: &TestDb) {
        let dir = workdir();
        run(operator(db, dir.path()).args(["domain", "set", "payments", "--keywords", "payment.capture", "--reserved", "1"]))
            .expect_code(0);
        let flags = |name: &str| {
            [
                db.count(&format!("SELECT count(*) FROM async_domain WHERE name = '{name}' AND paused")),
                db.count(&format!("SELECT count(*) FROM async_domain WHERE name = '{name}' AND released")),
            ]
        };
        run(operator(db, dir.path()).args(["domain", "release", "payments"]))
            .expect_code(0)
            .stdout_has("domain payments released");
        assert_eq!(flags("payments"), [1, 1]);
        let view = listed(db, dir.path(), "payments");
        assert_eq!((view["paused"].as_bool(), view["released"].as_bool()), (Some(true), Some(true)));
        run(operator(db, dir.path()).args(["domain", "release", "payments"]))
            .expect_code(0)
            .stdout_has("already released; nothing written");
        // Pausing a released domain changes nothing; resuming clears both.
        run(operator(db, dir.path()).args(["pause", "payments"]))
            .expect_code(0)
            .stdout_has("already paused");
        run(operator(db, dir.path()).args(["resume", "payments"]))
            .expect_code(0)
            .stdout_has("domain payments resumed");
        assert_eq!(flags("payments"), [0, 0]);
        run(operator(db, dir.path()).args(["pause", "payments"])).expect_code(0).stdout_has("domain payments paused");
        assert_eq!(flags("payments"), [1, 0]);
        run(operator(db, dir.path()).args(["resume", "payments"])).expect_code(0);
        run(operator(db, dir.path()).args(["resume", "payments"]))
            .expect_code(0)
            .stdout_has("is not paused; nothing written");

        // A domain known only from a live node gets a row that pauses it and sets nothing
        // else; `default` is a domain even on no node.
        node(db, "w1", 4, vec![
            domain_use("default", "max", &["points.credit"], 3, [0; 5]),
            domain_use("mail", "max", &["mail.send"], 1, [0; 5]),
        ], false);
        run(operator(db, dir.path()).args(["pause", "mail", "--json"]))
            .expect_code(0)
            .stdout_has("\"target\":\"domain\"")
            .stdout_has("\"nodes\":1");
        assert_eq!(db.count("SELECT count(*) FROM async_domain WHERE name = 'mail' AND paused AND keywords IS NULL AND mode IS NULL"), 1);
        run(operator(db, dir.path()).args(["pause", "default"])).expect_code(0);
        assert_eq!(flags("default"), [1, 0]);

        assert_eq!(audits(db, "domain.release"), 1);
        assert_eq!(audits(db, "domain.pause"), 3);
        assert_eq!(audits(db, "domain.resume"), 2);
        assert_eq!(
            db.count("SELECT count(*) FROM async_audit WHERE target = 'payments'"),
            5,
            "set, release, resume, pause, resume: the no-ops are not audited"
        );
    }
}

every_backend! {
    fn pausing_a_domain_some_nodes_lack_holds_its_keywords_on_every_node(db: &TestDb) {
        let dir = workdir();
        // w1 runs `mail` (its configuration); w2 has no such domain: it would run
        // `mail.send` under default. The pause records mail's keywords, which both hold.
        node(db, "w1", 4, vec![
            domain_use("default", "max", &["points.credit"], 3, [0; 5]),
            domain_use("mail", "max", &["mail.send"], 1, [0; 5]),
        ], false);
        node(db, "w2", 4, vec![domain_use("default", "max", &["mail.send", "points.credit"], 4, [0; 5])], false);
        run(operator(db, dir.path()).args(["pause", "mail"]))
            .expect_code(0)
            .stdout_has("domain mail paused: none of its tasks is claimed until it is resumed, version 1; 2 live nodes apply it at their next heartbeat");
        assert_eq!(db.count("SELECT count(*) FROM async_domain WHERE name = 'mail' AND held_keywords = '[\"mail.send\"]'"), 1);
        let view = listed(db, dir.path(), "mail");
        assert_eq!(view["setting"]["held_keywords"], json!(["mail.send"]), "{view}");
        // Resumed, nothing is held.
        run(operator(db, dir.path()).args(["resume", "mail"]))
            .expect_code(0)
            .stdout_has("domain mail resumed, version 2; 1 live node applies it");
        assert_eq!(db.count("SELECT count(*) FROM async_domain WHERE name = 'mail' AND held_keywords IS NULL AND NOT paused"), 1);
    }
}

every_backend! {
    fn pause_and_resume_a_keyword(db: &TestDb) {
        let dir = workdir();
        node(db, "w1", 2, vec![domain_use("default", "max", &["mail.send", "points.credit"], 2, [0; 5])], false);
        run(operator(db, dir.path()).args(["pause", "mail.send"]))
            .expect_code(0)
            .stdout_has("keyword mail.send paused");
        assert_eq!(db.count("SELECT count(*) FROM async_pause WHERE keyword = 'mail.send' AND paused_by LIKE 'tester@%'"), 1);
        assert_eq!(db.count("SELECT count(*) FROM async_domain"), 0, "a keyword's pause is not a domain's row");
        run(operator(db, dir.path()).args(["pause", "mail.send"]))
            .expect_code(0)
            .stdout_has("already paused; nothing written");
        let out = run(operator(db, dir.path()).args(["domain", "list", "--json"])).expect_code(0);
        assert_eq!(lines_with(&out.stdout, "keyword"), vec![json!({"keyword": "mail.send", "paused": true})]);
        run(operator(db, dir.path()).args(["domain", "list"]))
            .expect_code(0)
            .stdout_has("keywords paused on their own: mail.send");
        run(operator(db, dir.path()).args(["resume", "mail.send", "--json"]))
            .expect_code(0)
            .stdout_has("\"target\":\"keyword\"")
            .stdout_has("\"changed\":true");
        assert_eq!(db.count("SELECT count(*) FROM async_pause"), 0);
        run(operator(db, dir.path()).args(["resume", "mail.send"]))
            .expect_code(0)
            .stdout_has("not paused; nothing written");
        // A keyword only a row lists is a keyword too.
        run(operator(db, dir.path()).args(["domain", "set", "reports", "--keywords", "report.build", "--max", "1"]))
            .expect_code(0);
        run(operator(db, dir.path()).args(["pause", "report.build"])).expect_code(0);
        assert_eq!(db.count("SELECT count(*) FROM async_pause WHERE keyword = 'report.build'"), 1);
        // An unknown name: exit 2, nothing written.
        run(operator(db, dir.path()).args(["pause", "mail.bulk"]))
            .expect_code(2)
            .stderr_has("no domain or keyword \"mail.bulk\"");
        assert_eq!(db.count("SELECT count(*) FROM async_pause"), 1);
        assert_eq!(audits(db, "keyword.pause"), 2);
        assert_eq!(audits(db, "keyword.resume"), 1);
        assert_eq!(db.count("SELECT count(*) FROM async_audit WHERE target = 'mail.send'"), 2);
    }
}

every_backend! {
    fn stats_json_sums_the_live_nodes_domains(db: &TestDb) {
        let dir = workdir();
        // Without a node or a row, stats shows no domains.
        let out = run(operator(db, dir.path()).arg("stats")).expect_code(0);
        assert!(!out.stdout.contains("borrowed"), "{}", out.stdout);
        run(operator(db, dir.path()).args(["enqueue", "payment.capture", "1"])).expect_code(0);
        // [reserved, borrowed, running, queued, stuck]
        node(db, "w1", 8, vec![
            domain_use("default", "max", &["mail.send", "payment.capture"], 6, [0, 0, 3, 1, 0]),
            domain_use("payments", "reserved", &["payment.refund"], 2, [2, 1, 3, 4, 1]),
        ], false);
        node(db, "w2", 4, vec![
            domain_use("default", "max", &["mail.send"], 2, [0, 0, 1, 0, 0]),
            domain_use("payments", "reserved", &["payment.refund"], 2, [2, 0, 2, 0, 0]),
        ], false);
        node(db, "gone", 4, vec![domain_use("payments", "reserved", &["payment.refund"], 2, [2, 2, 2, 2, 2])], true);
        run(operator(db, dir.path()).args(["pause", "payments"])).expect_code(0);

        let out = run(operator(db, dir.path()).args(["stats", "--json"])).expect_code(0);
        let keywords = lines_with(&out.stdout, "keyword");
        assert_eq!(keywords.len(), 1);
        assert_eq!(keywords[0]["keyword"], "payment.capture");
        let domains = lines_with(&out.stdout, "domain");
        let first_domain = out.stdout.lines().position(|l| l.contains("\"domain\"")).unwrap();
        assert!(out.stdout.lines().take(first_domain).all(|l| l.contains("\"keyword\"")), "keywords first:\n{}", out.stdout);
        let pick = |name: &str| domains.iter().find(|d| d["domain"] == name).unwrap_or_else(|| panic!("{name}:\n{}", out.stdout));
        let figures = |d: &Value| -> Vec<u64> {
            ["threads", "reserved", "borrowed", "running", "queued", "stuck", "nodes"]
                .iter()
                .map(|k| d[k].as_u64().unwrap_or_else(|| panic!("{k} in {d}")))
                .collect()
        };
        let payments = pick("payments");
        assert_eq!((payments["mode"].as_str(), payments["paused"].as_bool()), (Some("reserved"), Some(true)));
        assert_eq!(figures(payments), [4, 4, 1, 5, 4, 1, 2]);
        let default = pick("default");
        assert_eq!((default["mode"].as_str(), default["paused"].as_bool()), (Some("max"), Some(false)));
        assert_eq!(figures(default), [8, 0, 0, 4, 1, 0, 2]);
        assert_eq!(default["keywords"], json!(["mail.send", "payment.capture"]));
        assert_eq!(domains[0]["domain"], "default", "default first");

        // The text output has the domains' table after the keywords'.
        let out = run(operator(db, dir.path()).arg("stats")).expect_code(0);
        let text = &out.stdout;
        let (keywords_at, domains_at) = (text.find("keyword ").unwrap(), text.find("borrowed").unwrap());
        assert!(keywords_at < domains_at, "{text}");
        assert!(text.lines().any(|l| l.starts_with("payments") && l.contains("RESERVED 2") && l.contains("paused")), "{text}");
    }
}

#[test]
fn domain_input_is_refused_as_bad_usage_before_any_database_is_reached() {
    let dir = workdir();
    // No server listens there: a check after connecting would fail with exit 1.
    for args in [
        &["domain", "set", "", "--max", "1"][..],
        &["domain", "set", "payments", "--max", "-1"][..],
        &["domain", "set", "payments", "--queue", "-3"][..],
        &["domain", "set", "default", "--keywords", "a"][..],
        &["domain", "set", "payments", "--keywords", "Bad"][..],
        &["domain", "set", "payments"][..],
        &["domain", "release", "default"][..],
        &["pause", "Bad Name"][..],
        &["resume", ""][..],
    ] {
        run(outbox(dir.path())
            .args(["--database-url", DOWN_PG_URL])
            .args(args))
        .expect_code(2);
    }
}

#[test]
fn domain_commands_fail_with_exit_1_on_a_database_they_cannot_reach_and_create_no_file() {
    let dir = workdir();
    let commands: [&[&str]; 5] = [
        &["domain", "list"],
        &["domain", "set", "payments", "--max", "1"],
        &["domain", "release", "payments"],
        &["pause", "mail.send"],
        &["resume", "mail.send"],
    ];
    for args in commands {
        run(outbox(dir.path())
            .args(["--database-url", DOWN_PG_URL])
            .args(args))
        .expect_code(1)
        .stderr_has("cannot connect");
        // The default SQLite file does not exist: refused, not created.
        run(outbox(dir.path()).args(args))
            .expect_code(1)
            .stderr_has("the SQLite file does not exist");
    }
    assert_eq!(crate::binary::entries(dir.path()), Vec::<String>::new());
}
