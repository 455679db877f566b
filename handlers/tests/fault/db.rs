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
    conn: RefCell<Option<DbConnection>>,
}

impl Db {
    pub fn new(url: &str) -> Db {
        DatabaseUrl::parse(url).expect("database url");
        Db {
            url: url.to_owned(),
            conn: RefCell::new(None),
        }
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
    if last.map_or(true, |t| t.elapsed() > Duration::from_secs(1)) {
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
// Lock claims: a process's sessions and the tasks they hold (PostgreSQL)
// ---------------------------------------------------------------------------------------------

/// The open sessions of the process labelled `app` (its `application_name`, see
/// [`crate::scenario::Scenario::spawn`]) on this database.
pub fn sessions(db: &Db, app: &str) -> i64 {
    db.count(&format!(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = '{}'",
        quote(app)
    ))
}

/// What each session of `app` is doing, as text: pid, state, when the state last changed,
/// transaction id. Two equal readings mean no session moved in between.
pub fn session_states(db: &Db, app: &str) -> String {
    db.text(&format!(
        "SELECT COALESCE(string_agg(concat_ws(' ', pid, state, state_change, backend_xid), '; '
                                    ORDER BY pid), '')
         FROM pg_stat_activity WHERE datname = current_database() AND application_name = '{}'",
        quote(app)
    ))
}

/// The sessions of `app` running a statement now.
pub fn active_sessions(db: &Db, app: &str) -> i64 {
    db.count(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
           AND application_name = '{}' AND state = 'active'",
        quote(app)
    ))
}

/// The pending tasks locked by the open transactions of `app`'s sessions (`None`: of any
/// session): the tasks of its lock claims' chunks in flight. A row locked `FOR UPDATE`
/// carries its locker's transaction id in `xmax` until that transaction ends.
pub fn locked_by(db: &Db, app: Option<&str>) -> Vec<i64> {
    let filter = app.map_or(String::new(), |app| {
        format!("AND a.application_name = '{}'", quote(app))
    });
    db.numbers(&format!(
        "SELECT t.id AS n FROM async_task t JOIN pg_stat_activity a ON a.backend_xid = t.xmax
         WHERE a.datname = current_database() {filter} AND t.state = 'pending' ORDER BY t.id"
    ))
}

fn quote(text: &str) -> String {
    text.replace('\'', "''")
}

/// The database clock (PostgreSQL), in milliseconds since the epoch.
pub fn pg_clock_ms(db: &Db) -> i64 {
    db.count("SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)")
}

/// For each worker, the tasks its node finished (done) since `since_ms` by the database
/// clock (PostgreSQL): whether it resumed work after a fault.
pub fn done_since(db: &Db, workers: &[Proc], since_ms: i64) -> Vec<i64> {
    workers
        .iter()
        .map(|w| {
            let node = db
                .node_id(&w.node_name())
                .unwrap_or_else(|| panic!("{} has no node row", w.label));
            db.count(&format!(
                "SELECT count(*) FROM async_task WHERE owner = {node} AND state = 'done'
                   AND finished_at >= to_timestamp({since_ms} / 1000.0)"
            ))
        })
        .collect()
}
