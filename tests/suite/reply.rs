//! No statement waits for ever for its reply (issue 29, defect 14): a statement past its
//! connection's reply timeout fails as on a lost connection, and the worker goes on; a MySQL
//! connection on which a statement failed is not handed out again (MariaDB Connector/C left
//! its prepared statement waiting for rows that never came: a batched drain hung for good).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use outbox::{
    enqueue_batch, Backend, DatabaseUrl, DbConnection, HandlerResult, NewTask, Registry,
    TaskContext, TaskTx, Worker, WorkerConfig,
};

use crate::proxy::ReplySwallower;
use crate::write_ledger;

/// The reply timeout of these tests' connections.
const REPLY_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a test waits for what must end within the reply timeout (and the watchdog's
/// tick) before it calls it hung: generous, for a loaded machine.
const HUNG_AFTER: Duration = Duration::from_secs(60);

/// Runs `f` on a thread of its own; its result, or a failure naming `what` if it has not
/// returned within [`HUNG_AFTER`].
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    bounded_or(what, f, || {})
}

/// [`bounded`], calling `unstick` before it fails (so that the hung thread lets go of what
/// the test's database needs to be dropped).
fn bounded_or<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
    unstick: impl FnOnce(),
) -> T {
    let (done, result) = mpsc::channel();
    thread::spawn(move || done.send(f()));
    result.recv_timeout(HUNG_AFTER).unwrap_or_else(|_| {
        unstick();
        panic!("{what} hung: still waiting after {HUNG_AFTER:?}")
    })
}

/// The port the connection's server sees it come from (through a proxy: the proxy's port
/// towards the server).
fn server_side_port(conn: &mut DbConnection) -> u16 {
    #[derive(QueryableByName)]
    struct Port {
        #[diesel(sql_type = BigInt)]
        port: i64,
    }
    let sql = match conn.backend() {
        Backend::Postgres => "SELECT inet_client_port()::bigint AS port",
        Backend::Mysql => {
            "SELECT CAST(SUBSTRING_INDEX(HOST, ':', -1) AS SIGNED) AS port
             FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()"
        }
        Backend::Sqlite => unreachable!("no port on SQLite"),
    };
    let port: Port = diesel::sql_query(sql).get_result(conn).expect("the port");
    u16::try_from(port.port).expect("a port")
}

server_backends! {
    /// A statement that outlasts the reply timeout fails soon after it, its connection is
    /// not handed out again, and one within the timeout runs.
    fn a_statement_past_its_reply_timeout_fails_and_its_connection_is_dropped(db: &TestDb) {
        let url = db.url.clone().with_reply_timeout(Some(REPLY_TIMEOUT));
        assert_eq!(url.reply_timeout(), Some(REPLY_TIMEOUT));
        let sleep = |seconds: u32| match db.backend() {
            Backend::Postgres => format!("SELECT pg_sleep({seconds})"),
            _ => format!("SELECT SLEEP({seconds})"),
        };
        let pool = url.pool(1).unwrap();
        let mut conn = pool.get().unwrap();
        conn.batch_execute(&sleep(1)).expect("a statement within the timeout runs");
        let long = sleep(20);
        let (conn, waited, result) = bounded("a statement past its reply timeout", move || {
            let started = Instant::now();
            let result = conn.batch_execute(&long);
            (conn, started.elapsed(), result)
        });
        let error = result.expect_err("the statement is cut at its reply timeout");
        assert!(
            waited >= REPLY_TIMEOUT && waited < REPLY_TIMEOUT + Duration::from_secs(15),
            "failed after {waited:?} ({error})"
        );
        drop(conn);
        let mut conn = pool.get().expect("a new connection");
        conn.batch_execute("SELECT 1").expect("the pool's connection works");
    }

    /// The chunk's completion is sent and its reply dropped by a proxy that keeps the
    /// connection open (nothing at the TCP level fails): the drain hung for good before.
    /// Now the completion fails at the reply timeout, the chunk rolls back (its ledger rows
    /// with it), its tasks run again one by one, and the drain ends with each task done and
    /// its effect in the database once.
    fn a_chunk_whose_completion_reply_never_comes_runs_again_within_the_reply_timeout(db: &TestDb) {
        let tasks: Vec<NewTask> = (1..=3).map(|n| NewTask::new("ledger", n.to_string())).collect();
        let ids: Vec<i64> = enqueue_batch(&mut db.conn(), &tasks)
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        let proxy = Arc::new(ReplySwallower::start(&db.url_text));
        let calls = Arc::new(AtomicUsize::new(0));
        let armed = Arc::new(AtomicBool::new(true));
        let mut registry = Registry::new();
        let (calls_in, proxy_in) = (Arc::clone(&calls), Arc::clone(&proxy));
        registry.register(
            "ledger",
            move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                calls_in.fetch_add(1, Ordering::SeqCst);
                write_ledger(task, tx)?;
                // The last task of the chunk: what this connection is sent next (the
                // chunk's completion) gets no reply.
                if task.biz_id() == "3" && armed.swap(false, Ordering::SeqCst) {
                    proxy_in.swallow(server_side_port(tx.conn()?));
                }
                Ok(())
            },
        );
        let url = DatabaseUrl::parse(&proxy.url)
            .unwrap()
            .with_reply_timeout(Some(REPLY_TIMEOUT));
        let config = WorkerConfig::default()
            .threads(1)
            .queue(0)
            .page_size(3)
            .commit_batch(3);
        let worker = Worker::new(&url, registry, config).unwrap();
        let (report, waited) = bounded_or(
            "the drain",
            move || {
                let started = Instant::now();
                let report = worker.drain();
                (report, started.elapsed())
            },
            || proxy.close_all(),
        );
        let report = report.expect("the drain ends");
        assert!(proxy.swallowed() > 0, "the completion's reply was dropped");
        assert_eq!(proxy.cut_by_client(), 1, "the worker closed the silent connection");
        assert!(
            waited >= REPLY_TIMEOUT && waited < REPLY_TIMEOUT + Duration::from_secs(30),
            "the drain took {waited:?}"
        );
        assert_eq!(report.tally.done, 3, "{report:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 6, "the chunk, then each task alone");
        for id in ids {
            let task = db.task(id);
            assert_eq!((task.state.as_str(), task.failures), ("done", 0), "task {id}");
            assert_eq!(db.ledger_rows(id), 1, "task {id}: its effect once");
        }
    }
}

/// The row of `test_ledger` that the root-cause test locks.
#[cfg(feature = "mysql")]
mod ledger {
    diesel::table! {
        test_ledger (id) {
            id -> BigInt,
            task_id -> BigInt,
        }
    }
}

/// The root cause of the hang: a prepared `SELECT … FOR UPDATE` whose rows ended in an error
/// (here a lock wait timeout; in the drain, InnoDB's deadlock victim) is left by MariaDB
/// Connector/C waiting for rows, and its next run on that connection (diesel caches it)
/// waited for them for ever, before sending anything. The pool no longer hands such a
/// connection out again: the same statement runs at once on a new one.
#[cfg(feature = "mysql")]
#[test]
fn a_mysql_connection_whose_select_ended_in_an_error_is_not_used_again() {
    use ledger::test_ledger;

    let db = &crate::support::TestDb::mysql();
    db.exec("INSERT INTO test_ledger (task_id, note) VALUES (7, 'locked')");
    let locked = |conn: &mut DbConnection| -> QueryResult<Vec<i64>> {
        let DbConnection::Mysql(conn) = conn else {
            unreachable!("a MySQL connection")
        };
        test_ledger::table
            .select(test_ledger::id)
            .filter(test_ledger::task_id.eq(7))
            .for_update()
            .load(conn)
    };
    // One connection: a checkout gets the last one back unless the pool dropped it.
    let pool = db.url.pool(1).unwrap();
    let mut locker = db.conn();
    locker
        .batch_execute("BEGIN; SELECT id FROM test_ledger WHERE task_id = 7 FOR UPDATE")
        .unwrap();
    let mut conn = pool.get().unwrap();
    conn.batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
        .unwrap();
    let error = locked(&mut conn).expect_err("the row is locked");
    assert!(
        error.to_string().starts_with("Lock wait timeout"),
        "{error}"
    );
    drop(conn);
    locker.batch_execute("COMMIT").unwrap();
    let rows = bounded("the same SELECT on the pool's connection", move || {
        locked(&mut pool.get().unwrap())
    });
    assert_eq!(rows.expect("the row, unlocked now").len(), 1);
}

/// A page claim whose COMMIT reached the server but whose reply was lost (a proxy forwards the
/// COMMIT, then drops the connection; a failover or a cut link does the same): the claim fails
/// as on a lost connection, and the tasks it may have taken are free again at once, no
/// failure charged, instead of waiting `running` (or leased) for their deadline and rescue's
/// charge. PostgreSQL and MySQL (a server to proxy); strict and batched stamp claims, and lock
/// claims.
#[test]
fn a_claim_whose_commit_reply_was_lost_gives_its_tasks_back_uncharged() {
    // Text of the page claim and of the lease claim, not of a suspect's claim (which runs
    // first, and, finding none, reads no row on MySQL).
    for (server, mark) in servers("AS crowded", "tenant, failures, max_attempts") {
        claim_reply_lost(server, mark);
    }
}

/// A test database's maker and what arms [`crate::proxy::CommitReplyLoser`] on it.
type Server = (fn() -> crate::support::TestDb, &'static str);

/// PostgreSQL, armed by `pg`, and MySQL, by `mysql`.
fn servers(pg: &'static str, mysql: &'static str) -> Vec<Server> {
    let mut servers: Vec<Server> = vec![(crate::support::TestDb::postgres, pg)];
    #[cfg(feature = "mysql")]
    servers.push((crate::support::TestDb::mysql, mysql));
    #[cfg(not(feature = "mysql"))]
    let _ = mysql;
    servers
}

fn claim_reply_lost(server: fn() -> crate::support::TestDb, mark: &'static str) {
    use outbox::ClaimStyle;

    // One thread; a page of the five tasks (lock claims have no queue: a chunk of five).
    let configs = [
        ("strict", WorkerConfig::default().queue(4)),
        ("batched", WorkerConfig::default().queue(4).commit_batch(5)),
        (
            "lock",
            WorkerConfig::default()
                .queue(0)
                .commit_batch(5)
                .claim_style(ClaimStyle::Lock),
        ),
    ];
    for (name, config) in configs {
        let db = &server();
        let ids = crate::five_tasks(db);
        let proxy = crate::proxy::CommitReplyLoser::start_on(&db.url_text, mark);
        let name = format!("{:?} {name}", db.backend());
        let calls = Arc::new(AtomicUsize::new(0));
        let registry = crate::counted_ledger_registry("ledger", &calls);
        let url = DatabaseUrl::parse(&proxy.url).unwrap();
        let config = config.threads(1).page_size(5);
        let w = Worker::new(&url, registry, config).unwrap();
        let first = w.run_once();
        assert_eq!(proxy.lost(), 1, "{name}: the claim's commit reply was lost");
        first.expect_err("the claim's outcome is unknown: it fails");
        assert_eq!(calls.load(Ordering::SeqCst), 0, "{name}: nothing ran");
        for &id in &ids {
            let task = db.task(id);
            assert_eq!(
                (task.state.as_str(), task.failures, task.owner),
                ("pending", 0, None),
                "{name}: task {id} is free again, uncharged"
            );
            // A stamp claim's token stays: its COMMIT happened, the reply alone was lost.
            let token = if name.ends_with("lock") { 0 } else { 1 };
            assert_eq!(task.claim_token, token, "{name}: task {id}");
        }
        assert_eq!(
            db.count("SELECT count(*) FROM async_lease"),
            0,
            "{name}: no lease left"
        );
        // The next claim takes them at once.
        assert_eq!(w.run_once().unwrap().done, 5, "{name}");
        assert_eq!(calls.load(Ordering::SeqCst), 5, "{name}: each ran once");
        for id in ids {
            assert_eq!(db.ledger_rows(id), 1, "{name}: task {id}");
        }
    }
}

/// The same for the claims that stamp whatever the claim style: a suspect's (a task two dead
/// processes held, claimed alone) and the claim of a tenant with a `max_running`.
#[test]
fn a_suspect_or_limited_claim_whose_commit_reply_was_lost_gives_its_tasks_back_uncharged() {
    let kinds = [
        (
            "suspect",
            servers(
                "LIMIT 1 FOR UPDATE SKIP LOCKED",
                "LIMIT 1 FOR UPDATE SKIP LOCKED",
            ),
        ),
        (
            "limited",
            servers(
                "pg_try_advisory_xact_lock(x'6f72'",
                "CAST(max_running AS SIGNED)",
            ),
        ),
    ];
    for (kind, servers) in kinds {
        for (server, mark) in servers {
            let db = &server();
            let name = format!("{:?} {kind}", db.backend());
            let claimed = if kind == "suspect" {
                let ids = crate::five_tasks(db);
                db.exec("UPDATE async_task SET suspect = 2 WHERE biz_id = '1'");
                vec![ids[0]]
            } else {
                let limit = outbox::TenantLimits::default().max_running(Some(5));
                outbox::set_tenant(&mut db.conn(), "acme", &limit, "test").unwrap();
                let tasks: Vec<NewTask> = (1..=5)
                    .map(|n| NewTask::new("ledger", n.to_string()).tenant("acme"))
                    .collect();
                let enqueued = enqueue_batch(&mut db.conn(), &tasks).unwrap();
                enqueued.iter().map(|e| e.id).collect()
            };
            let proxy = crate::proxy::CommitReplyLoser::start_on(&db.url_text, mark);
            let url = DatabaseUrl::parse(&proxy.url).unwrap();
            let config = WorkerConfig::default().threads(1).queue(4).page_size(5);
            let w = Worker::new(&url, crate::ledger_registry("ledger"), config).unwrap();
            w.run_once()
                .expect_err("the claim's outcome is unknown: it fails");
            assert_eq!(proxy.lost(), 1, "{name}: the claim's commit reply was lost");
            for &id in &claimed {
                let task = db.task(id);
                assert_eq!(
                    (task.state.as_str(), task.failures, task.owner),
                    ("pending", 0, None),
                    "{name}: task {id} is free again, uncharged"
                );
                // Its claim's COMMIT happened, the reply alone was lost.
                assert_eq!(task.claim_token, 1, "{name}: task {id}");
            }
            assert_eq!(w.drain().unwrap().tally.done, 5, "{name}");
            for id in claimed {
                assert_eq!(db.ledger_rows(id), 1, "{name}: task {id}");
            }
        }
    }
}

/// A leased chunk rolls back (its task 3 fails) and its claim again, which stamps its tasks
/// to run one by one, commits with its reply lost: the retry finds no lease left, and the
/// worker finds the tasks claimed by the attempt it did not hear from and runs them, each
/// once more, none charged, instead of leaving them `running` for their deadline and
/// rescue's charge. PostgreSQL and MySQL, lock claims.
#[test]
fn a_chunks_claim_again_whose_commit_reply_was_lost_runs_its_tasks() {
    // Text of the claim again only.
    let marks = servers(
        "JOIN gone ON gone.task_id = t.id",
        "state = 'running' AND owner = ",
    );
    for (server, mark) in marks {
        let db = &server();
        let name = format!("{:?}", db.backend());
        let ids = crate::five_tasks(db);
        let proxy = crate::proxy::CommitReplyLoser::start_on(&db.url_text, mark);
        let calls = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicBool::new(false));
        let (calls_in, failed_in) = (Arc::clone(&calls), Arc::clone(&failed));
        let mut registry = Registry::new();
        registry.register(
            "ledger",
            move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
                calls_in.fetch_add(1, Ordering::SeqCst);
                write_ledger(task, tx)?;
                if task.biz_id() == "3" && !failed_in.swap(true, Ordering::SeqCst) {
                    return Err(anyhow::anyhow!("downstream refused, once").into());
                }
                Ok(())
            },
        );
        let url = DatabaseUrl::parse(&proxy.url).unwrap();
        let config = WorkerConfig::default()
            .threads(1)
            .queue(0)
            .page_size(5)
            .commit_batch(5)
            .claim_style(outbox::ClaimStyle::Lock);
        let w = Worker::new(&url, registry, config).unwrap();
        let tally = w.run_once().unwrap();
        assert_eq!(proxy.lost(), 1, "{name}: the claim again's reply was lost");
        assert_eq!((tally.done, tally.lost), (5, 0), "{name}: {tally:?}");
        // Three in the chunk, then each alone.
        assert_eq!(calls.load(Ordering::SeqCst), 3 + 5, "{name}");
        for id in ids {
            let task = db.task(id);
            assert_eq!(
                (task.state.as_str(), task.failures),
                ("done", 0),
                "{name}: task {id}"
            );
            assert_eq!(db.ledger_rows(id), 1, "{name}: task {id}");
        }
    }
}
