//! The test's own view of a database, the `fault_ledger` table, the scenarios' tasks and
//! bounded waits on them.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use outbox::{Backend, DatabaseUrl, DbConnection, NewTask};
use serde_json::json;

use crate::scenario::Proc;
use crate::support::TestDb;
use crate::{DB_RETRY_LIMIT, POLL, STALL_LIMIT};

#[derive(QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
pub struct StateCount {
    #[diesel(sql_type = Text)]
    pub state: String,
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

/// The test's own view of a database: one cached connection, reopened and the query retried
/// (for up to [`DB_RETRY_LIMIT`]) when it fails, since the scenarios break connections and
/// restart servers on purpose.
pub struct Db {
    url: String,
    backend: Backend,
    conn: RefCell<Option<DbConnection>>,
}

impl Db {
    pub fn new(url: &str) -> Db {
        let backend = DatabaseUrl::parse(url).expect("database url").backend();
        Db {
            url: url.to_owned(),
            backend,
            conn: RefCell::new(None),
        }
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn try_with<T>(
        &self,
        f: &mut impl FnMut(&mut DbConnection) -> QueryResult<T>,
    ) -> Result<T, String> {
        let mut slot = self.conn.borrow_mut();
        if slot.is_none() {
            let conn = DatabaseUrl::parse(&self.url)
                .expect("database url")
                .connect()
                .map_err(|e| e.to_string())?;
            *slot = Some(conn);
        }
        f(slot.as_mut().expect("connected")).map_err(|e| {
            *slot = None;
            e.to_string()
        })
    }

    pub fn with<T>(&self, what: &str, mut f: impl FnMut(&mut DbConnection) -> QueryResult<T>) -> T {
        let deadline = Instant::now() + DB_RETRY_LIMIT;
        loop {
            match self.try_with(&mut f) {
                Ok(value) => return value,
                Err(e) if Instant::now() < deadline => {
                    log_retry(what, &e);
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("{what}: {e} (retried for {DB_RETRY_LIMIT:?})"),
            }
        }
    }

    pub fn exec(&self, sql: &str) {
        self.with(sql, |c| c.batch_execute(sql));
    }

    /// [`Db::count`] read uncommitted (MySQL: the level of the statement's own transaction,
    /// set in the same turn of the connection).
    pub fn count_uncommitted(&self, sql: &str) -> i64 {
        let query = format!("SELECT ({sql}) AS n");
        self.with(sql, |c| {
            c.batch_execute("SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")?;
            diesel::sql_query(&query).get_result::<N>(c)
        })
        .n
    }

    /// `SELECT (sql) AS n`.
    pub fn count(&self, sql: &str) -> i64 {
        let query = format!("SELECT ({sql}) AS n");
        self.with(sql, |c| diesel::sql_query(&query).get_result::<N>(c))
            .n
    }

    /// The `n` column of every row of `sql`.
    pub fn numbers(&self, sql: &str) -> Vec<i64> {
        self.with(sql, |c| diesel::sql_query(sql).load::<N>(c))
            .into_iter()
            .map(|r| r.n)
            .collect()
    }

    /// The `a` and `b` columns of every row of `sql`.
    pub fn pairs(&self, sql: &str) -> Vec<(i64, i64)> {
        #[derive(QueryableByName)]
        struct P {
            #[diesel(sql_type = BigInt)]
            a: i64,
            #[diesel(sql_type = BigInt)]
            b: i64,
        }
        self.with(sql, |c| diesel::sql_query(sql).load::<P>(c))
            .into_iter()
            .map(|r| (r.a, r.b))
            .collect()
    }

    /// `SELECT (sql) AS t`, a text.
    pub fn text(&self, sql: &str) -> String {
        #[derive(QueryableByName)]
        struct T {
            #[diesel(sql_type = Text)]
            t: String,
        }
        let query = format!("SELECT ({sql}) AS t");
        self.with(sql, |c| diesel::sql_query(&query).get_result::<T>(c))
            .t
    }

    pub fn states(&self) -> BTreeMap<String, i64> {
        let sql = "SELECT state, count(*) AS n FROM async_task GROUP BY state";
        self.with(sql, |c| diesel::sql_query(sql).load::<StateCount>(c))
            .into_iter()
            .map(|r| (r.state, r.n))
            .collect()
    }

    pub fn in_state(&self, state: &str) -> i64 {
        self.count(&format!(
            "SELECT count(*) FROM async_task WHERE state = '{state}'"
        ))
    }

    /// Tasks neither done nor dead (nor cancelled).
    pub fn unfinished(&self) -> i64 {
        self.count(
            "SELECT count(*) FROM async_task WHERE state NOT IN ('done', 'dead', 'cancelled')",
        )
    }

    /// The id of the newest node named `name`, if it registered.
    pub fn node_id(&self, name: &str) -> Option<i64> {
        let name = name.replace('\'', "''");
        let id = self.count(&format!(
            "SELECT COALESCE(max(id), -1) FROM async_node WHERE name = '{name}'"
        ));
        (id >= 0).then_some(id)
    }

    pub fn create_fault_ledger(&self) {
        // `early`: how many parents of the task were not done when its handler ran.
        self.exec(
            "CREATE TABLE fault_ledger (task_id BIGINT NOT NULL, early BIGINT NOT NULL DEFAULT 0)",
        );
        // The tasks a scenario's `prune` deleted, kept by a trigger as each row goes (a copy
        // taken before the prune would miss the tasks that finished while it started), and
        // every task, pruned or not: what the ledger and the external file are checked
        // against. On PostgreSQL with the row's `xmin` too: the transaction that completed
        // it, which tells an external effect's run in it from one in a transaction that did
        // not.
        self.exec(
            "CREATE TABLE fault_pruned (id BIGINT NOT NULL, keyword VARCHAR(64) NOT NULL, state VARCHAR(16) NOT NULL, completed_xmin BIGINT)",
        );
        self.exec(match self.backend() {
            // The row is still there before its deletion, and a query reads its `xmin`.
            Backend::Postgres => {
                "CREATE FUNCTION fault_keep_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN
                     INSERT INTO fault_pruned (id, keyword, state, completed_xmin)
                     SELECT id, keyword, state, CAST(CAST(xmin AS text) AS BIGINT)
                       FROM async_task WHERE id = OLD.id;
                     RETURN OLD;
                 END $$;
                 CREATE TRIGGER fault_keep_pruned BEFORE DELETE ON async_task
                 FOR EACH ROW EXECUTE FUNCTION fault_keep_pruned()"
            }
            Backend::Mysql => {
                "CREATE TRIGGER fault_keep_pruned BEFORE DELETE ON async_task FOR EACH ROW
                 INSERT INTO fault_pruned (id, keyword, state) VALUES (OLD.id, OLD.keyword, OLD.state)"
            }
            Backend::Sqlite => {
                "CREATE TRIGGER fault_keep_pruned BEFORE DELETE ON async_task BEGIN
                 INSERT INTO fault_pruned (id, keyword, state) VALUES (OLD.id, OLD.keyword, OLD.state);
                 END"
            }
        });
        self.exec(
            "CREATE VIEW fault_tasks AS
             SELECT id, keyword, state FROM async_task
             UNION ALL
             SELECT p.id, p.keyword, p.state FROM fault_pruned p
              WHERE NOT EXISTS (SELECT 1 FROM async_task t WHERE t.id = p.id)",
        );
    }

    /// A task's state in [`Db::create_fault_ledger`]'s `fault_tasks`, pruned or not; empty
    /// when there is no such task.
    pub fn task_state(&self, id: i64) -> String {
        self.text(&format!(
            "SELECT COALESCE(MAX(state), '') AS t FROM fault_tasks WHERE id = {id}"
        ))
    }

    /// Enqueues `tasks` with the library, in batches.
    pub fn enqueue(&self, tasks: &[NewTask]) {
        let mut conn = DatabaseUrl::parse(&self.url)
            .expect("database url")
            .connect()
            .expect("connect to enqueue");
        for chunk in tasks.chunks(5_000) {
            outbox::enqueue_batch(&mut conn, chunk).expect("enqueue_batch");
        }
    }
}

/// Logs the first failure of the test's own queries per second at most (they are expected
/// while a scenario breaks connections).
fn log_retry(what: &str, error: &str) {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    if last.is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
        let what: String = what.chars().take(60).collect();
        eprintln!("(test query `{what}…` failed, retrying: {})", error.trim());
        *last = Some(Instant::now());
    }
}

/// A `fault.*` task with `{"sleep_ms": …}`.
pub fn task(keyword: &str, biz_id: usize, sleep_ms: u64, max_attempts: i32) -> NewTask {
    NewTask::new(keyword, biz_id.to_string())
        .payload(&json!({ "sleep_ms": sleep_ms }))
        .max_attempts(max_attempts)
}

/// `n` tasks: three quarters `fault.ledger`, one quarter `fault.external`.
pub fn ledger_and_external(n: usize, sleep_ms: u64, max_attempts: i32) -> Vec<NewTask> {
    (0..n)
        .map(|i| {
            let keyword = if i % 4 == 3 {
                "fault.external"
            } else {
                "fault.ledger"
            };
            task(keyword, i, sleep_ms, max_attempts)
        })
        .collect()
}

/// Polls every [`POLL`] until no task is left unfinished, calling `tick` each time (to check
/// processes, take measurements); fails after `limit`, or as soon as no task has finished for
/// [`STALL_LIMIT`] (the workers are stuck), showing the task states.
pub fn wait_until_finished(db: &Db, limit: Duration, mut tick: impl FnMut()) -> Duration {
    let started = Instant::now();
    let mut last = (i64::MAX, Instant::now());
    loop {
        tick();
        let unfinished = db.unfinished();
        if unfinished == 0 {
            return started.elapsed();
        }
        if unfinished < last.0 {
            last = (unfinished, Instant::now());
        }
        assert!(
            last.1.elapsed() < STALL_LIMIT,
            "no task finished for {STALL_LIMIT:?} ({:?} after the wait started): the workers are stuck; tasks: {:?}",
            started.elapsed(),
            db.states()
        );
        assert!(
            started.elapsed() < limit,
            "tasks still unfinished after {limit:?}: {:?}",
            db.states()
        );
        std::thread::sleep(POLL);
    }
}

/// Polls every [`POLL`] until `condition` holds; fails after `limit`, showing the task
/// states.
pub fn wait_until(db: &Db, limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}; tasks: {:?}",
            db.states()
        );
        std::thread::sleep(POLL);
    }
}

/// A database with the migrations applied and the `fault_ledger` table: a [`TestDb`] on the
/// shared test server or a fresh SQLite file.
pub fn fault_db(backend: Backend) -> (TestDb, Db) {
    let test_db = match backend {
        Backend::Postgres => TestDb::postgres(),
        Backend::Sqlite => TestDb::sqlite(),
        #[cfg(feature = "mysql")]
        Backend::Mysql => TestDb::mysql(),
        #[allow(unreachable_patterns)]
        Backend::Mysql => unreachable!("the MySQL scenarios need the mysql feature"),
    };
    let db = Db::new(&test_db.url_text);
    db.create_fault_ledger();
    (test_db, db)
}

// ---------------------------------------------------------------------------------------------
// Lock claims: a process's sessions and the tasks it leases
// ---------------------------------------------------------------------------------------------

/// The open sessions of the process labelled `app` (its `application_name`, see
/// [`crate::scenario::Scenario::spawn`]) on this database. MySQL names no application on a
/// session: there, every session on the database but the test's own (the scenarios that ask
/// run one process at a time).
pub fn sessions(db: &Db, app: &str) -> i64 {
    match db.backend() {
        Backend::Mysql => db.count(
            "SELECT count(*) FROM information_schema.PROCESSLIST
              WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
        ),
        _ => db.count(&format!(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = '{}'",
            quote(app)
        )),
    }
}

/// The pending tasks leased by the node named `node` (`None`: by any node): the tasks of
/// its lock claims' chunks in flight.
pub fn leased_by(db: &Db, node: Option<&str>) -> Vec<i64> {
    let filter = node.map_or(String::new(), |node| {
        format!("AND n.name = '{}'", quote(node))
    });
    db.numbers(&format!(
        "SELECT t.id AS n FROM async_task t JOIN async_lease l ON l.task_id = t.id
           JOIN async_node n ON n.id = l.node_id
         WHERE t.state = 'pending' {filter} ORDER BY t.id"
    ))
}

fn quote(text: &str) -> String {
    text.replace('\'', "''")
}

/// The database clock, in milliseconds since the epoch (PostgreSQL or MySQL: the scenarios
/// that break a server's connections or restart it).
pub fn clock_ms(db: &Db) -> i64 {
    match db.backend() {
        Backend::Postgres => {
            db.count("SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)")
        }
        // The session's time zone is UTC (the library sets it), so NOW(3) is the stored
        // times' clock and UNIX_TIMESTAMP reads it back as epoch seconds.
        Backend::Mysql => db.count("SELECT CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)"),
        Backend::Sqlite => unreachable!("no server clock on SQLite"),
    }
}

/// For each worker, the tasks its node finished (done) since `since_ms` by the database
/// clock ([`clock_ms`]): whether it resumed work after a fault.
pub fn done_since(db: &Db, workers: &[Proc], since_ms: i64) -> Vec<i64> {
    let since = match db.backend() {
        Backend::Postgres => format!("to_timestamp({since_ms} / 1000.0)"),
        Backend::Mysql => format!("FROM_UNIXTIME({since_ms} / 1000.0)"),
        Backend::Sqlite => unreachable!("no server clock on SQLite"),
    };
    workers
        .iter()
        .map(|w| {
            let node = db
                .node_id(&w.node_name())
                .unwrap_or_else(|| panic!("{} has no node row", w.label));
            db.count(&format!(
                "SELECT count(*) FROM async_task WHERE owner = {node} AND state = 'done'
                   AND finished_at >= {since}"
            ))
        })
        .collect()
}

/// Ends every session on the database but the test's own (PostgreSQL: `pg_terminate_backend`;
/// MySQL: `KILL CONNECTION`); returns how many it ended.
pub fn terminate_other_sessions(db: &Db) -> i64 {
    match db.backend() {
        Backend::Postgres => db.count(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()) t WHERE ok",
        ),
        Backend::Mysql => db.with("KILL CONNECTION of the other sessions", |c| {
            let ids = diesel::sql_query(
                "SELECT CAST(ID AS SIGNED) AS n FROM information_schema.PROCESSLIST
                 WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
            )
            .load::<N>(c)?;
            // A session may end by itself between the read and its KILL ("unknown thread
            // id"): not counted.
            Ok(ids
                .iter()
                .filter(|id| {
                    c.batch_execute(&format!("KILL CONNECTION {}", id.n))
                        .is_ok()
                })
                .count() as i64)
        }),
        Backend::Sqlite => unreachable!("no sessions to end on SQLite"),
    }
}
