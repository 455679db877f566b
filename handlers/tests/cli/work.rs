//! `drain`, and commands on a database that was never migrated; `run`: a long-lived worker
//! stopped by SIGTERM.

use serde_json::Value;

use crate::binary::{
    outbox, outbox_on, run, wait_until, workdir, Running, DATABASE_COMMANDS, STOP_LIMIT, WORK_LIMIT,
};
use crate::db::{tasks_in, unmigrate};
use crate::every_backend;

every_backend! {
    fn drain_on_an_empty_database_runs_0_tasks(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).arg("drain"))
            .expect_code(0)
            .stdout_has("drained 0 tasks");
        let out = run(outbox_on(db, dir.path()).args(["drain", "--json"])).expect_code(0);
        let json: Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("--json output is not JSON ({e}): {}", out.stdout));
        assert_eq!(json["claimed"], 0, "{json}");
    }

    fn unmigrated_database_asks_for_migrate(db: &TestDb) {
        let dir = workdir();
        unmigrate(db);
        // migrate migrates, demo migrates its own database, bench works on scratch ones.
        for args in DATABASE_COMMANDS.iter().filter(|a| !["migrate", "demo", "bench"].contains(&a[0])) {
            run(outbox_on(db, dir.path()).args(args.iter()))
                .expect_code(1)
                .stderr_has("run `outbox migrate`");
        }
    }
}

#[test]
fn drain_on_a_missing_sqlite_file_asks_for_migrate_and_creates_nothing() {
    let dir = workdir();
    run(outbox(dir.path()).arg("drain"))
        .expect_code(1)
        .stderr_has("does not exist; `outbox migrate` creates it");
    // drain neither creates nor migrates a database behind the operator's back.
    assert!(!dir.path().join("outbox.db").exists());
    // Once migrated, the same drain works.
    run(outbox(dir.path()).arg("migrate")).expect_code(0);
    run(outbox(dir.path()).arg("drain"))
        .expect_code(0)
        .stdout_has("drained 0 tasks");
}

// ---------------------------------------------------------------------------------------------
// run: a long-lived worker stopped by SIGTERM
// ---------------------------------------------------------------------------------------------

pub(crate) fn sigterm(pid: u32) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child, not yet
    // reaped (we hold its `Child` and have not waited for it since it was seen running).
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
}

every_backend! {
    fn run_finishes_the_work_and_exits_0_on_sigterm(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["demo", "--enqueue-only", "--tasks", "20"]))
            .expect_code(0);
        assert_eq!(tasks_in(db, "pending"), 40);

        let mut worker = Running::spawn(outbox_on(db, dir.path()).args(["run", "--poll-interval", "50ms"]));
        let pid = worker.pid();
        wait_until(WORK_LIMIT, "outbox run to finish the 40 demo tasks", || {
            if let Some(status) = worker.exited() {
                panic!("outbox run exited on its own with {status}");
            }
            tasks_in(db, "done") == 40
        });
        // Still running with nothing to do: it stops only when told to.
        assert!(worker.exited().is_none(), "outbox run exited before SIGTERM");

        sigterm(pid);
        let out = worker.finish(STOP_LIMIT).expect_code(0);
        out.stdout_has("ran 40 tasks").stdout_has("40 done, 0 retried, 0 dead");

        let node = format!("FROM async_node WHERE name LIKE '%:{pid}'");
        assert_eq!(db.count(&format!("SELECT count(*) {node}")), 1, "no node row for pid {pid}");
        assert_eq!(
            db.count(&format!("SELECT count(*) {node} AND state = 'gone'")),
            1,
            "the stopped node is not marked gone"
        );
        run(outbox_on(db, dir.path()).args(["demo", "--check"]))
            .expect_code(0)
            .stdout_has("check: all 20 orders credited exactly once");
    }
}
