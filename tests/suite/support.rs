//! Test support: a fresh database per test on either backend, and the macro that runs a
//! test body once per backend.
//!
//! PostgreSQL: the server named by `OUTBOX_TEST_PG_URL` (scripts/test.sh starts one and sets
//! it); when unset, `scripts/pg.sh start` starts a throwaway cluster for this checkout (stop
//! it with `scripts/pg.sh stop`). Each test gets its own database, dropped at the end. The
//! PostgreSQL tests are never skipped: without a server they fail.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use outbox::{Backend, DatabaseUrl, DbConnection};

/// Runs each `fn name(db: &TestDb) { … }` as two tests, `name::sqlite` and `name::postgres`.
#[macro_export]
macro_rules! both_backends {
    ($(fn $name:ident($db:ident: &TestDb) $body:block)*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            fn sqlite() {
                let $db = &$crate::support::TestDb::sqlite();
                $body
            }

            #[test]
            fn postgres() {
                let $db = &$crate::support::TestDb::postgres();
                $body
            }
        }
    )*};
}

/// The URL of the test PostgreSQL server (its `postgres` database).
pub fn pg_server_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("OUTBOX_TEST_PG_URL") {
            if !url.trim().is_empty() {
                return url.trim().to_owned();
            }
        }
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/pg.sh");
        let script = if script.exists() {
            script
        } else {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg.sh")
        };
        let out = Command::new("bash")
            .arg(&script)
            .arg("start")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "OUTBOX_TEST_PG_URL is not set and `scripts/pg.sh start` failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("utf-8 URL")
            .trim()
            .to_owned()
    })
}

fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh, migrated database, removed when dropped.
pub struct TestDb {
    pub url: DatabaseUrl,
    pub url_text: String,
    pg_database: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// A new SQLite file in a temporary directory.
    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("outbox.db");
        let url_text = path.to_str().expect("utf-8 path").to_owned();
        Self::ready(TestDb {
            url: DatabaseUrl::parse(&url_text).expect("sqlite url"),
            url_text,
            pg_database: None,
            _dir: Some(dir),
        })
    }

    /// A new database on the test PostgreSQL server.
    pub fn postgres() -> TestDb {
        let server = pg_server_url();
        let name = unique_name("outbox_test");
        let mut admin = PgConnection::establish(server)
            .unwrap_or_else(|e| panic!("cannot connect to the test server {server}: {e}"));
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create test database");
        let base = &server[..server.rfind('/').expect("URL with a database path")];
        let url_text = format!("{base}/{name}");
        Self::ready(TestDb {
            url: DatabaseUrl::parse(&url_text).expect("postgres url"),
            url_text,
            pg_database: Some(name),
            _dir: None,
        })
    }

    fn ready(db: TestDb) -> TestDb {
        let mut conn = db.conn();
        outbox::run_migrations(&mut conn).expect("migrations");
        let ledger = match db.backend() {
            Backend::Postgres => "CREATE TABLE test_ledger (id BIGSERIAL PRIMARY KEY, task_id BIGINT NOT NULL, note TEXT NOT NULL DEFAULT '')",
            Backend::Sqlite => "CREATE TABLE test_ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, task_id BIGINT NOT NULL, note TEXT NOT NULL DEFAULT '')",
        };
        conn.batch_execute(ledger).expect("ledger table");
        db
    }

    pub fn backend(&self) -> Backend {
        self.url.backend()
    }

    /// A new connection.
    pub fn conn(&self) -> DbConnection {
        self.url.connect().expect("test connection")
    }

    /// Runs a statement (a test's setup or time travel).
    pub fn exec(&self, sql: &str) {
        self.conn()
            .batch_execute(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// `SELECT count(*) …` as a number.
    pub fn count(&self, sql: &str) -> i64 {
        #[derive(QueryableByName)]
        struct N {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        let row: N = diesel::sql_query(format!("SELECT ({sql}) AS n"))
            .get_result(&mut self.conn())
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        row.n
    }

    /// The stored row of a task.
    pub fn task(&self, id: i64) -> TaskRow {
        let due_expr = match self.backend() {
            Backend::Postgres => "CASE WHEN run_at <= now() THEN 1 ELSE 0 END",
            Backend::Sqlite => {
                "CASE WHEN run_at <= strftime('%Y-%m-%d %H:%M:%f', 'now') THEN 1 ELSE 0 END"
            }
        };
        diesel::sql_query(format!(
            "SELECT state, failures, owner, claim_token, last_error, {due_expr} AS due
             FROM async_task WHERE id = {id}"
        ))
        .get_result(&mut self.conn())
        .unwrap_or_else(|e| panic!("task {id}: {e}"))
    }

    /// Moves every pending task's `run_at` into the past: the clock "advances" to make
    /// retries due, without sleeping.
    pub fn make_all_due(&self) {
        match self.backend() {
            Backend::Postgres => self.exec(
                "UPDATE async_task SET run_at = now() - interval '1 second' WHERE state = 'pending'",
            ),
            Backend::Sqlite => self.exec(
                "UPDATE async_task SET run_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 seconds') WHERE state = 'pending'",
            ),
        }
    }

    /// Ledger rows written for a task.
    pub fn ledger_rows(&self, task_id: i64) -> i64 {
        self.count(&format!(
            "SELECT count(*) FROM test_ledger WHERE task_id = {task_id}"
        ))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = &self.pg_database {
            if let Ok(mut admin) = PgConnection::establish(pg_server_url()) {
                let _ =
                    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
    }
}

/// A task's stored state, for assertions.
#[derive(Debug, QueryableByName)]
pub struct TaskRow {
    #[diesel(sql_type = Text)]
    pub state: String,
    #[diesel(sql_type = Integer)]
    pub failures: i32,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub owner: Option<i64>,
    #[diesel(sql_type = BigInt)]
    pub claim_token: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub last_error: Option<String>,
    #[diesel(sql_type = Integer)]
    pub due: i32,
}
