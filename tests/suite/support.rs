//! Test support: a fresh database per test on each backend, and the macro that runs a test
//! body once per backend.
//!
//! PostgreSQL: the server named by `OUTBOX_TEST_PG_URL` (scripts/test.sh starts one and sets
//! it); when unset, `scripts/pg.sh start` starts a throwaway cluster for this checkout (stop
//! it with `scripts/pg.sh stop`). Each test gets its own database, dropped at the end. The
//! PostgreSQL tests are never skipped: without a server they fail.
//!
//! MySQL (feature `mysql`, which scripts/test.sh enables): the server named by
//! `OUTBOX_TEST_MYSQL_URL`, or one started by `scripts/mysql.sh start`; a database per test.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use outbox::{Backend, DatabaseUrl, DbConnection};

/// Runs each `fn name(db: &TestDb) { … }` as a test per backend: `name::sqlite`,
/// `name::postgres`, and `name::mysql` (feature `mysql`).
#[macro_export]
macro_rules! every_backend {
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

            #[cfg(feature = "mysql")]
            #[test]
            fn mysql() {
                let $db = &$crate::support::TestDb::mysql();
                $body
            }
        }
    )*};
}

/// Runs each `fn name(db: &TestDb) { … }` as `name::sqlite` and `name::postgres` only: for
/// what only those two backends have (the migration history before the MySQL tree's start).
#[macro_export]
macro_rules! sqlite_and_postgres {
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

/// Runs each `fn name(db: &TestDb) { … }` as `name::postgres` and `name::mysql` (feature
/// `mysql`): for what only the server backends have (connections over a network).
#[macro_export]
macro_rules! server_backends {
    ($($(#[$doc:meta])* fn $name:ident($db:ident: &TestDb) $body:block)*) => {$(
        $(#[$doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            fn postgres() {
                let $db = &$crate::support::TestDb::postgres();
                $body
            }

            #[cfg(feature = "mysql")]
            #[test]
            fn mysql() {
                let $db = &$crate::support::TestDb::mysql();
                $body
            }
        }
    )*};
}

/// The URL of the test PostgreSQL server (its `postgres` database).
pub fn pg_server_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| server_url("OUTBOX_TEST_PG_URL", "pg.sh"))
}

/// The URL of the test MySQL server (its `outbox` database).
pub fn mysql_server_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| server_url("OUTBOX_TEST_MYSQL_URL", "mysql.sh"))
}

/// `$variable`, or the URL that `scripts/SCRIPT start` prints.
fn server_url(variable: &str, script: &str) -> String {
    {
        if let Ok(url) = std::env::var(variable) {
            if !url.trim().is_empty() {
                return url.trim().to_owned();
            }
        }
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("scripts")
            .join(script);
        let script = if path.exists() {
            path
        } else {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../scripts")
                .join(script)
        };
        let out = Command::new("bash")
            .arg(&script)
            .arg("start")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "{variable} is not set and `{} start` failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("utf-8 URL")
            .trim()
            .to_owned()
    }
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
    /// The database created on a server (PostgreSQL or MySQL), dropped with the value.
    server_database: Option<String>,
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
            server_database: None,
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
            server_database: Some(name),
            _dir: None,
        })
    }

    /// A new database on the test MySQL server.
    #[cfg(feature = "mysql")]
    pub fn mysql() -> TestDb {
        let server = mysql_server_url();
        let name = unique_name("outbox_test");
        let mut admin = diesel::mysql::MysqlConnection::establish(server)
            .unwrap_or_else(|e| panic!("cannot connect to the test server {server}: {e}"));
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create test database");
        let base = &server[..server.rfind('/').expect("URL with a database path")];
        let url_text = format!("{base}/{name}");
        Self::ready(TestDb {
            url: DatabaseUrl::parse(&url_text).expect("mysql url"),
            url_text,
            server_database: Some(name),
            _dir: None,
        })
    }

    fn ready(db: TestDb) -> TestDb {
        let mut conn = db.conn();
        outbox::run_migrations(&mut conn).expect("migrations");
        let ledger = match db.backend() {
            Backend::Postgres => "CREATE TABLE test_ledger (id BIGSERIAL PRIMARY KEY, task_id BIGINT NOT NULL, note TEXT NOT NULL DEFAULT '')",
            Backend::Sqlite => "CREATE TABLE test_ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, task_id BIGINT NOT NULL, note TEXT NOT NULL DEFAULT '')",
            Backend::Mysql => "CREATE TABLE test_ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, task_id BIGINT NOT NULL, note VARCHAR(255) NOT NULL DEFAULT '', KEY (task_id))",
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
        // As a 64-bit integer on every backend, whatever the column's type (MySQL's CAST
        // names it SIGNED).
        let select = match self.backend() {
            Backend::Mysql => format!("SELECT CAST(({sql}) AS SIGNED) AS n"),
            _ => format!("SELECT CAST(({sql}) AS BIGINT) AS n"),
        };
        let row: N = diesel::sql_query(select)
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
            Backend::Mysql => "CASE WHEN run_at <= UTC_TIMESTAMP(3) THEN 1 ELSE 0 END",
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
        self.exec(&format!(
            "UPDATE async_task SET run_at = {} WHERE state = 'pending'",
            self.ago_sql(1000)
        ));
    }

    /// The SQL of the database clock now, as the backend stores times.
    pub fn now_sql(&self) -> &'static str {
        match self.backend() {
            Backend::Postgres => "now()",
            Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
            Backend::Mysql => "UTC_TIMESTAMP(3)",
        }
    }

    /// The SQL of the database clock `ms` milliseconds ago (negative: ahead).
    pub fn ago_sql(&self, ms: i64) -> String {
        match self.backend() {
            Backend::Postgres => format!("(now() - interval '{ms} milliseconds')"),
            Backend::Sqlite => format!(
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '{:+.3} seconds')",
                -(ms as f64) / 1000.0
            ),
            Backend::Mysql => format!("(UTC_TIMESTAMP(3) - INTERVAL {} MICROSECOND)", ms * 1000),
        }
    }

    /// The text at `key` of the JSON in `column` (`column ->> 'key'`; MariaDB has no `->>`).
    pub fn json_text_sql(&self, column: &str, key: &str) -> String {
        match self.backend() {
            Backend::Postgres | Backend::Sqlite => format!("{column} ->> '{key}'"),
            Backend::Mysql => format!("JSON_UNQUOTE(JSON_EXTRACT({column}, '$.{key}'))"),
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
        let Some(name) = &self.server_database else {
            return;
        };
        match self.backend() {
            Backend::Postgres => {
                if let Ok(mut admin) = PgConnection::establish(pg_server_url()) {
                    let _ = admin
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
                }
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql => {
                if let Ok(mut admin) = diesel::mysql::MysqlConnection::establish(mysql_server_url())
                {
                    let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"));
                }
            }
            _ => {}
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
