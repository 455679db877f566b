//! A role that cannot change the schema (the guide's "Database roles": docs/guide/src/postgresql.md
//! and docs/guide/src/mysql.md): created with exactly the guide's grants, it runs `run`, `drain`
//! (strict and batched), `enqueue` and the operator commands, every task done once; `migrate` under
//! it fails and says whose job that is.

use std::path::Path;
use std::process::Command;

use crate::binary::{outbox, run, wait_until, workdir, Running, STOP_LIMIT, WORK_LIMIT};
use crate::db::tasks_in;
use crate::support::TestDb;
use crate::work::sigterm;

/// The SQL block of the "Database roles" section of the guide's `chapter` (a file of
/// `docs/guide/src/`) whose first line contains `marker`.
fn guide_grants(chapter: &str, marker: &str) -> String {
    let path = format!("{}/../docs/guide/src/{chapter}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let section = &text[text
        .find("## Database roles")
        .unwrap_or_else(|| panic!("{path} has no \"Database roles\" section"))..];
    section
        .split("```sql\n")
        .skip(1)
        .map(|block| &block[..block.find("```").expect("closed block")])
        .find(|block| block.lines().next().is_some_and(|l| l.contains(marker)))
        .unwrap_or_else(|| panic!("no sql block for {marker} in \"Database roles\""))
        .to_owned()
}

/// A name unique to this test process and `test`, for a role (roles are server-wide, and the
/// tests of one process run side by side).
fn role_name(test: &str) -> String {
    format!("outbox_{test}_{}", std::process::id())
}

/// `db`'s URL, connecting as `role` (the test servers trust their loopback users).
fn url_as(db: &TestDb, role: &str) -> String {
    let (scheme, rest) = db.url_text.split_once("://").expect("server url");
    let host = &rest[rest.find('@').expect("user in url") + 1..];
    format!("{scheme}://{role}@{host}")
}

fn outbox_as(url: &str, cwd: &Path) -> Command {
    let mut cmd = outbox(cwd);
    cmd.env("DATABASE_URL", url);
    cmd
}

/// The commands every test below runs under the role, on a database where the owner has run
/// `demo --enqueue-only --tasks 20` (40 tasks) and granted the role the demo's tables.
fn work_and_operate_as(db: &TestDb, url: &str) {
    let dir = workdir();
    let as_role = |args: &[&str]| {
        run(outbox_as(url, dir.path()).args(args)).expect_code(0);
    };

    // A long-lived worker does the demo's 40 tasks and stops on SIGTERM.
    let mut worker =
        Running::spawn(outbox_as(url, dir.path()).args(["run", "--poll-interval", "50ms"]));
    let pid = worker.pid();
    wait_until(
        WORK_LIMIT,
        "outbox run under the role to finish 40 tasks",
        || {
            if let Some(status) = worker.exited() {
                panic!("outbox run under the role exited on its own with {status}");
            }
            tasks_in(db, "done") == 40
        },
    );
    sigterm(pid);
    worker
        .finish(STOP_LIMIT)
        .expect_code(0)
        .stdout_has("ran 40 tasks");

    // More orders (the owner's: demo makes its tables), drained in strict then batched mode.
    let owner = |args: &[&str]| {
        let mut cmd = outbox(dir.path());
        cmd.env("DATABASE_URL", &db.url_text);
        run(cmd.args(args)).expect_code(0);
    };
    owner(&["demo", "--enqueue-only", "--tasks", "20"]);
    run(outbox_as(url, dir.path()).arg("drain"))
        .expect_code(0)
        .stdout_has("40 done");
    owner(&["demo", "--enqueue-only", "--tasks", "20"]);
    run(outbox_as(url, dir.path()).args(["drain", "--commit-batch", "10"]))
        .expect_code(0)
        .stdout_has("40 done");
    assert_eq!(tasks_in(db, "done"), 120);

    // enqueue and the operator commands.
    run(outbox_as(url, dir.path()).args(["enqueue", "mail.send", "role-1"]))
        .expect_code(0)
        .stdout_has("created task");
    let id = db
        .count("SELECT id FROM async_task WHERE keyword = 'mail.send'")
        .to_string();
    for args in [
        &["stats"][..],
        &["list", "--json"],
        &["show", &id],
        &["cancel", &id],
        &["retry", &id],
        &["cancel", "--keyword", "mail.send", "--biz-id", "role-1"],
        &["pause", "default"],
        &["resume", "default"],
        &["domain", "list"],
        &["tenant", "set", "acme", "--max-queued", "10"],
        &["tenant", "list"],
        &["nodes"],
        &["schedules"],
        &["audit"],
        &["prune", "--older-than", "7d"],
    ] {
        as_role(args);
    }
    assert_eq!(tasks_in(db, "cancelled"), 1);
    owner(&["demo", "--check"]);

    // migrate changes the schema: not for this role, and it says so.
    run(outbox_as(url, dir.path()).arg("migrate"))
        .expect_code(1)
        .stderr_has("run it as the tables' owner");
}

#[test]
fn a_role_with_the_guide_grants_works_but_cannot_migrate_on_postgres() {
    let db = TestDb::postgres();
    let dir = workdir();
    let mut owner = outbox(dir.path());
    owner.env("DATABASE_URL", &db.url_text);
    run(owner.args(["demo", "--enqueue-only", "--tasks", "20"])).expect_code(0);

    let role = role_name("worker");
    let server = crate::support::pg_server_url();
    let mut admin = outbox::DatabaseUrl::parse(server)
        .expect("url")
        .connect()
        .expect("admin connection");
    diesel::connection::SimpleConnection::batch_execute(
        &mut admin,
        &format!("DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN"),
    )
    .expect("create role");
    // Before PostgreSQL 15 every role may create in `public`: not this one.
    db.exec("REVOKE CREATE ON SCHEMA public FROM PUBLIC");
    db.exec(
        &guide_grants("postgresql.md", "CREATE ROLE outbox_worker").replace("outbox_worker", &role),
    );
    // The application's own tables, which its handlers write.
    db.exec(&format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON demo_order, demo_points_ledger, demo_coupon TO {role}; \
         GRANT USAGE ON SEQUENCE demo_points_ledger_id_seq, demo_coupon_id_seq TO {role}"
    ));

    work_and_operate_as(&db, &url_as(&db, &role));

    drop(db);
    let _ = diesel::connection::SimpleConnection::batch_execute(
        &mut admin,
        &format!("DROP ROLE IF EXISTS {role}"),
    );
}

/// Creates the MySQL user `user` with exactly the guide's grants on `db`'s database; returns
/// the database's name.
#[cfg(feature = "mysql")]
fn mysql_user_with_the_guides_grants(db: &TestDb, user: &str) -> String {
    let database = db.url_text.rsplit('/').next().expect("database name");
    db.exec(&format!(
        "DROP USER IF EXISTS '{user}'@'%'; CREATE USER '{user}'@'%'"
    ));
    db.exec(
        &guide_grants("mysql.md", "CREATE USER 'outbox_worker'")
            .replace("outbox_worker", user)
            .replace("app.", &format!("{database}.")),
    );
    database.to_owned()
}

#[cfg(feature = "mysql")]
#[test]
fn a_user_with_the_guide_grants_works_but_cannot_migrate_on_mysql() {
    let db = TestDb::mysql();
    let dir = workdir();
    let mut owner = outbox(dir.path());
    owner.env("DATABASE_URL", &db.url_text);
    run(owner.args(["demo", "--enqueue-only", "--tasks", "20"])).expect_code(0);

    let user = role_name("worker");
    let database = mysql_user_with_the_guides_grants(&db, &user);
    for table in ["demo_order", "demo_points_ledger", "demo_coupon"] {
        db.exec(&format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {database}.{table} TO '{user}'@'%'"
        ));
    }

    work_and_operate_as(&db, &url_as(&db, &user));

    db.exec(&format!("DROP USER IF EXISTS '{user}'@'%'"));
}

/// A connection as `url` that has run `sql` (a stale session's transaction and marks).
fn session_holding(url: &str, sql: &str) -> outbox::DbConnection {
    use diesel::connection::SimpleConnection;
    let mut conn = outbox::DatabaseUrl::parse(url)
        .expect("url")
        .connect()
        .expect("connection");
    conn.batch_execute(sql)
        .expect("the stale session's statements");
    conn
}

/// A drain's rescue pass as `url` (a restricted role) ends `own`, the stale session of that
/// role, and leaves `other`'s, another role's.
fn a_drain_ends_only_its_own(
    url: &str,
    own: &mut outbox::DbConnection,
    other: &mut outbox::DbConnection,
) {
    use diesel::connection::SimpleConnection;
    let dir = workdir();
    run(outbox_as(url, dir.path()).arg("drain"))
        .expect_code(0)
        .output_lacks("could not end the sessions");
    assert!(
        own.batch_execute("SELECT 1").is_err(),
        "the role's own stale session was not ended"
    );
    assert!(
        other.batch_execute("SELECT 1").is_ok(),
        "the owner's session was ended by a role that may not"
    );
}

/// A rescue under a role that may not end another role's sessions ends the stale sessions it
/// may (its own role's) and leaves the others: one it may not end does not fail the whole
/// statement.
#[test]
fn a_rescue_ends_the_stale_sessions_its_role_may_end_and_only_those() {
    use diesel::connection::SimpleConnection;
    let db = TestDb::postgres();
    let role = role_name("rescuer");
    let server = crate::support::pg_server_url();
    let mut admin = outbox::DatabaseUrl::parse(server)
        .expect("url")
        .connect()
        .expect("admin connection");
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN"
        ))
        .expect("create role");
    db.exec("REVOKE CREATE ON SCHEMA public FROM PUBLIC");
    db.exec(
        &guide_grants("postgresql.md", "CREATE ROLE outbox_worker").replace("outbox_worker", &role),
    );
    let url = url_as(&db, &role);

    // Two nodes gone for an hour, each with a transaction still open that holds its marks
    // (as a frozen worker's): one of the tables' owner, one of the restricted role.
    db.exec(
        "INSERT INTO async_node (id, name, state, heartbeat_at) VALUES \
         (900001, 'ghost-owner', 'gone', now() - interval '1 hour'), \
         (900002, 'ghost-role', 'gone', now() - interval '1 hour')",
    );
    let hold = |url: &str, node: i64| {
        session_holding(
            url,
            &format!(
                "BEGIN; SELECT pg_advisory_xact_lock_shared(1868721665, {node}), \
                 pg_advisory_xact_lock_shared(1868722689, 7)"
            ),
        )
    };
    let mut owners = hold(&db.url_text, 900001);
    let mut roles = hold(&url, 900002);

    // A drain's rescue pass, as the restricted role.
    a_drain_ends_only_its_own(&url, &mut roles, &mut owners);
    drop(owners);
    drop(db);
    let _ = admin.batch_execute(&format!("DROP ROLE IF EXISTS {role}"));
}

/// On MySQL too: a rescue under the guide's grants ends the sessions of nodes no longer live
/// that its user may end (its own user's: it sees no other's without `PROCESS`) and only
/// those. Each session here has a transaction open (its snapshot taken) and holds the named
/// lock by which a worker's connection names its node (`driver/mysql/session.rs`), as a
/// frozen worker's; both nodes stopped heartbeating an hour ago.
#[cfg(feature = "mysql")]
#[test]
fn a_rescue_ends_the_stale_sessions_its_user_may_end_and_only_those_on_mysql() {
    let db = TestDb::mysql();
    let user = role_name("rescuer");
    mysql_user_with_the_guides_grants(&db, &user);
    let url = url_as(&db, &user);
    db.exec(
        "INSERT INTO async_node (id, name, state, heartbeat_at) VALUES \
         (900001, 'ghost-owner', 'alive', UTC_TIMESTAMP(3) - INTERVAL 1 HOUR), \
         (900002, 'ghost-user', 'alive', UTC_TIMESTAMP(3) - INTERVAL 1 HOUR)",
    );
    let hold = |url: &str, node: i64| {
        session_holding(
            url,
            &format!(
                "DO GET_LOCK(CONCAT('outbox-node-{node}-', CONNECTION_ID()), 0); BEGIN; \
                 SELECT count(*) FROM async_node"
            ),
        )
    };
    let mut owners = hold(&db.url_text, 900001);
    let mut users = hold(&url, 900002);

    // A drain's rescue pass, as the restricted user.
    a_drain_ends_only_its_own(&url, &mut users, &mut owners);
    drop(owners);
    db.exec(&format!("DROP USER IF EXISTS '{user}'@'%'"));
}
