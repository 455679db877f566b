//! Behind a real PgBouncer (docs/guide/src/postgresql.md, "Behind PgBouncer"), in transaction and
//! in session mode: `migrate` from five processes at once, `demo`, `drain` in strict and batched
//! mode, `run` (`--no-listen` in transaction mode) and the operator commands, every task done
//! exactly once. PgBouncer is Debian's, started by `scripts/pgbouncer.sh` in front of the test
//! cluster (and installed if missing).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::binary::{outbox, run, wait_until, workdir, Running, STOP_LIMIT, WORK_LIMIT};
use crate::db::{tasks_in, unmigrate};
use crate::support::{pg_server_url, TestDb};
use crate::work::sigterm;

/// The URL of the test PgBouncer in `mode` (`transaction` or `session`), started by
/// `scripts/pgbouncer.sh start MODE` (which reuses one already running).
fn bouncer_url(mode: &str) -> &'static str {
    static TRANSACTION: OnceLock<String> = OnceLock::new();
    static SESSION: OnceLock<String> = OnceLock::new();
    let cell = match mode {
        "transaction" => &TRANSACTION,
        _ => &SESSION,
    };
    cell.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/pgbouncer.sh");
        let out = Command::new("bash")
            .arg(&script)
            .args(["start", mode])
            .env("OUTBOX_TEST_PG_URL", pg_server_url())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "`{} start {mode}` failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .to_owned()
    })
}

/// `db`'s URL through the PgBouncer in `mode`.
fn through(db: &TestDb, mode: &str) -> String {
    let bouncer = bouncer_url(mode);
    let base = &bouncer[..bouncer.rfind('/').expect("database path")];
    let name = db.url_text.rsplit('/').next().expect("database name");
    format!("{base}/{name}")
}

/// `outbox` on `url` behind the PgBouncer in `mode`: in transaction mode with the statement
/// cache off, as docs/guide/src/postgresql.md says; session mode needs nothing.
fn outbox_at(url: &str, mode: &str, cwd: &Path) -> Command {
    let mut cmd = outbox(cwd);
    match mode {
        "transaction" => cmd.env("DATABASE_URL", format!("{url}?statement_cache=off")),
        _ => cmd.env("DATABASE_URL", url),
    };
    cmd
}

fn every_command_through(mode: &str) {
    let db = TestDb::postgres();
    let url = through(&db, mode);
    let dir = workdir();

    // Five migrations at once: one applies, the others wait for its lock and find nothing
    // pending; no lock is left behind on a server connection of the pool.
    unmigrate(&db);
    let migrations: Vec<Running> = (0..5)
        .map(|_| Running::spawn(outbox_at(&url, mode, dir.path()).arg("migrate")))
        .collect();
    for m in migrations {
        m.finish(WORK_LIMIT).expect_code(0);
    }
    assert_eq!(
        db.count(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ),
        0,
        "an advisory lock outlived `migrate`"
    );

    let demo = |orders: &str| {
        run(outbox_at(&url, mode, dir.path()).args(["demo", "--enqueue-only", "--tasks", orders]))
            .expect_code(0);
    };
    demo("50");
    run(outbox_at(&url, mode, dir.path()).arg("drain"))
        .expect_code(0)
        .stdout_has("100 done");
    demo("50");
    run(outbox_at(&url, mode, dir.path()).args(["drain", "--commit-batch", "10"]))
        .expect_code(0)
        .stdout_has("100 done");

    // LISTEN needs the session: in transaction mode the worker polls.
    demo("50");
    let mut args = vec!["run", "--poll-interval", "50ms", "--commit-batch", "5"];
    if mode == "transaction" {
        args.push("--no-listen");
    }
    let mut worker = Running::spawn(outbox_at(&url, mode, dir.path()).args(&args));
    let pid = worker.pid();
    wait_until(WORK_LIMIT, "outbox run behind PgBouncer to finish", || {
        if let Some(status) = worker.exited() {
            panic!("outbox run exited on its own with {status}");
        }
        tasks_in(&db, "done") == 300
    });
    sigterm(pid);
    worker
        .finish(STOP_LIMIT)
        .expect_code(0)
        .stdout_has("100 done");

    for args in [
        &["stats"][..],
        &["list", "--state", "done", "--json"],
        &["show", "1"],
        &["nodes"],
        &["pause", "default"],
        &["resume", "default"],
        &["audit"],
        &["prune", "--older-than", "7d"],
    ] {
        run(outbox_at(&url, mode, dir.path()).args(args)).expect_code(0);
    }
    run(outbox_at(&url, mode, dir.path()).args(["demo", "--check"]))
        .expect_code(0)
        .stdout_has("check: all 150 orders credited exactly once");
    assert_eq!(db.count("SELECT count(*) FROM async_task"), 300);
}

#[test]
fn every_command_works_behind_pgbouncer_in_transaction_mode() {
    every_command_through("transaction");
}

#[test]
fn every_command_works_behind_pgbouncer_in_session_mode() {
    every_command_through("session");
}
