//! No database password in any output, error or hook environment: help names DATABASE_URL
//! but never shows its value; connection errors show the URL masked, whatever its password
//! holds, and never libpq's echo of it; the dead-task hook inherits no secret.

use std::collections::BTreeSet;
use std::path::Path;

use crate::binary::{outbox, outbox_on, run, workdir};
use crate::sqlite_and_postgres;
use crate::support::{pg_server_url, TestDb};

/// The `host:port` of the test PostgreSQL server.
fn pg_host_port() -> String {
    let url = pg_server_url();
    let authority = url.split("://").nth(1).expect("a URL");
    let authority = authority.split('/').next().expect("an authority");
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
        .to_owned()
}

/// The subcommands a help text lists under `Commands:` (but `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn no_help_shows_the_database_url() {
    const URL: &str = "postgres://owner:Own3rS3cret@db.internal/app";
    let dir = workdir();
    let help = |path: &[String], flag: &str| {
        let finished = run(outbox(dir.path())
            .env("DATABASE_URL", URL)
            .args(path)
            .arg(flag))
        .expect_code(0);
        finished
            .output_lacks("Own3rS3cret")
            .output_lacks("db.internal");
        finished.stdout.clone()
    };
    let top = help(&[], "--help");
    assert!(top.contains("DATABASE_URL"), "the variable is named: {top}");
    help(&[], "-h");
    // Every subcommand, and theirs, in long and short help.
    let mut seen = BTreeSet::new();
    let mut todo: Vec<Vec<String>> = subcommands(&top).into_iter().map(|c| vec![c]).collect();
    while let Some(path) = todo.pop() {
        let text = help(&path, "--help");
        help(&path, "-h");
        for sub in subcommands(&text) {
            let mut deeper = path.clone();
            deeper.push(sub);
            todo.push(deeper);
        }
        seen.insert(path.join(" "));
    }
    for expected in [
        "list",
        "show",
        "run",
        "drain",
        "tenant set",
        "domain list",
        "demo",
    ] {
        assert!(seen.contains(expected), "{expected} not reached: {seen:?}");
    }
}

#[test]
fn connection_errors_never_show_the_password() {
    let server = pg_host_port();
    // Each URL with what its error must not show, and its exit code: 2 for a URL refused
    // before libpq sees it (libpq would misread it and quote a piece of the password), 1
    // for one the server refuses (no role `worker` on it).
    let cases = [
        (
            format!("postgres://worker:Se/cret1@{server}/postgres"),
            vec!["Se/cret1", "cret1"],
            2,
        ),
        (
            format!("postgres://worker:Se%zzcret2@{server}/postgres"),
            vec!["Se%zzcret2", "zzcret2"],
            2,
        ),
        (
            format!("postgres://worker:p@ss@{server}/postgres"),
            vec!["p@ss"],
            2,
        ),
        (
            format!("postgres://worker@{server}/postgres?password=Pa55word3&sslmode=disable"),
            vec!["Pa55word3"],
            1,
        ),
        (
            format!("postgres://worker:Pa%2Fss4@{server}/postgres"),
            vec!["Pa%2Fss4", "Pa/ss4"],
            1,
        ),
    ];
    let dir = workdir();
    for (url, secrets, code) in &cases {
        for command in [
            &["stats"][..],
            &["list"],
            &["migrate"],
            &["drain"],
            &["enqueue", "mail.send", "1"],
        ] {
            let finished =
                run(outbox(dir.path()).env("DATABASE_URL", url).args(command)).expect_code(*code);
            for secret in secrets {
                finished.output_lacks(secret);
            }
            finished.stderr_has("worker");
            if url.contains("sslmode") {
                // The mask stops at the password's end.
                finished.stderr_has("password=***&sslmode=disable");
            }
        }
        // The URL given as a flag fares the same.
        let finished =
            run(outbox(dir.path()).args(["stats", "--database-url", url])).expect_code(*code);
        for secret in secrets {
            finished.output_lacks(secret);
        }
    }
}

/// `db`'s URL with `password` in it on a server (the test server trusts its clients, so any
/// password connects); an SQLite path as it is.
fn with_password(db: &TestDb, password: &str) -> String {
    match db.url_text.split_once("://") {
        Some((scheme, rest)) => {
            let (user, host) = rest.split_once('@').expect("a user in the test URL");
            format!("{scheme}://{user}:{password}@{host}")
        }
        None => db.url_text.clone(),
    }
}

/// A task of `points.credit` whose biz_id is not an order number: the handler fails it for
/// good, so a drain ends it dead and runs the hook.
fn drain_one_dead_task(db: &TestDb, dir: &Path, url: &str, hook: &str) {
    let data = r#"{"user_id": 1, "amount_cents": 500}"#;
    run(outbox_on(db, dir).args(["enqueue", "points.credit", "not-an-order", "--data", data]))
        .expect_code(0);
    run(outbox_on(db, dir)
        .env("DATABASE_URL", url)
        .env("PGPASSWORD", "HookS3cret")
        .env("MYSQL_PWD", "HookS3cret")
        .env("OUTBOX_TEST_COPY", "copy-of-HookS3cret")
        .env("OUTBOX_TEST_KEPT", "kept")
        .args(["drain", "--on-dead", hook]))
    .expect_code(0);
}

sqlite_and_postgres! {
    fn the_dead_task_hook_inherits_no_secret(db: &TestDb) {
        let dir = workdir();
        let env_file = dir.path().join("hook.env");
        let url = with_password(db, "HookS3cret");
        drain_one_dead_task(db, dir.path(), &url, &format!("env > '{}'", env_file.display()));
        let env = std::fs::read_to_string(&env_file).expect("the hook ran");
        assert!(env.contains("OUTBOX_BIZ_ID=not-an-order"), "{env}");
        assert!(env.contains("OUTBOX_TEST_KEPT=kept"), "the rest is inherited: {env}");
        assert!(env.contains("PATH="), "{env}");
        for withheld in ["DATABASE_URL=", "PGPASSWORD=", "MYSQL_PWD="] {
            assert!(!env.contains(withheld), "{withheld} reached the hook: {env}");
        }
        if url.contains("HookS3cret") {
            assert!(!env.contains("HookS3cret"), "the password reached the hook: {env}");
        }
    }
}

/// One process serving two databases: the hook of a task that died in one inherits no
/// variable holding the other's password either (the usual way to hand a process several
/// URLs, as `DATABASE_URL` holds one).
#[test]
fn a_fleets_dead_task_hook_inherits_no_other_databases_password() {
    let (a, b) = (TestDb::postgres(), TestDb::postgres());
    let dir = workdir();
    let env_file = dir.path().join("hook.env");
    let (url_a, url_b) = (
        with_password(&a, "ShardAS3cret"),
        with_password(&b, "ShardBS3cret"),
    );
    let data = r#"{"user_id": 1, "amount_cents": 500}"#;
    run(outbox_on(&a, dir.path()).args([
        "enqueue",
        "points.credit",
        "not-an-order",
        "--data",
        data,
    ]))
    .expect_code(0);
    run(outbox(dir.path())
        .env("SHARD_A", &url_a)
        .env("SHARD_B", &url_b)
        .env("OUTBOX_TEST_KEPT", "kept")
        .args(["drain", "--database-url", &url_a, "--database-url", &url_b])
        .args(["--on-dead", &format!("env > '{}'", env_file.display())]))
    .expect_code(0);
    let env = std::fs::read_to_string(&env_file).expect("the hook ran");
    assert!(env.contains("OUTBOX_BIZ_ID=not-an-order"), "{env}");
    assert!(
        env.contains("OUTBOX_TEST_KEPT=kept"),
        "the rest is inherited: {env}"
    );
    for password in ["ShardAS3cret", "ShardBS3cret"] {
        assert!(
            !env.contains(password),
            "{password} reached the hook: {env}"
        );
    }
}
