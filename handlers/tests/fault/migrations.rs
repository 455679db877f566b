//! Concurrent migrations.

use std::path::PathBuf;
use std::time::Instant;

use diesel::connection::SimpleConnection;
use outbox::{Backend, DatabaseUrl};

use crate::db::Db;
use crate::report::{latency_summary, Report};
use crate::scenario::{Proc, Scenario};
use crate::support;
use crate::{by_profile, COMMAND_LIMIT};

/// Migration directories of a backend's tree.
fn migration_count(backend: Backend) -> i64 {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../migrations")
        .join(backend.name());
    let count = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_dir()))
        .count();
    assert!(count > 0, "no migrations in {}", dir.display());
    i64::try_from(count).expect("count")
}

/// A new empty database on the test server (PostgreSQL or MySQL), dropped when this is
/// dropped.
struct EmptyServerDatabase {
    backend: Backend,
    name: String,
    url: String,
}

/// The test server of `backend`.
fn server_url(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => support::pg_server_url(),
        #[cfg(feature = "mysql")]
        Backend::Mysql => support::mysql_server_url(),
        other => unreachable!("no test server for {}", other.name()),
    }
}

impl EmptyServerDatabase {
    fn create(backend: Backend, n: usize) -> EmptyServerDatabase {
        let server = server_url(backend);
        let name = format!("outbox_fault_migrate_{}_{n}", std::process::id());
        let admin = Db::new(server);
        admin.exec(&format!("DROP DATABASE IF EXISTS {name}"));
        admin.exec(&format!("CREATE DATABASE {name}"));
        let base = &server[..server.rfind('/').expect("URL path")];
        EmptyServerDatabase {
            backend,
            url: format!("{base}/{name}"),
            name,
        }
    }
}

impl Drop for EmptyServerDatabase {
    fn drop(&mut self) {
        let drop = match self.backend {
            Backend::Postgres => format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            _ => format!("DROP DATABASE IF EXISTS {}", self.name),
        };
        if let Ok(mut admin) = DatabaseUrl::parse(server_url(self.backend))
            .expect("url")
            .connect()
        {
            let _ = admin.batch_execute(&drop);
        }
    }
}

fn concurrent_migrations(backend: Backend) {
    let sc = Scenario::start("concurrent_migrations", backend.name());
    let repetitions = by_profile(3, 10);
    let expected = migration_count(backend);
    let mut took = Vec::new();
    for rep in 0..repetitions {
        let server_db =
            (backend != Backend::Sqlite).then(|| EmptyServerDatabase::create(backend, rep));
        let url = match &server_db {
            Some(server_db) => server_db.url.clone(),
            None => sc
                .path(&format!("migrate-{rep}.db"))
                .to_str()
                .expect("utf-8 path")
                .to_owned(),
        };
        let started = Instant::now();
        let mut procs: Vec<Proc> = (1..=5)
            .map(|i| sc.spawn(&format!("migrate{rep}-{i}"), &url, &["migrate".to_owned()]))
            .collect();
        for p in &mut procs {
            p.expect_exit_0(COMMAND_LIMIT);
        }
        took.push(started.elapsed());
        let applied = procs
            .iter()
            .filter(|p| p.stdout_text().contains("applied"))
            .count();
        let up_to_date = procs
            .iter()
            .filter(|p| p.stdout_text().contains("schema up to date"))
            .count();
        let db = Db::new(&url);
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 0);
        assert_eq!(
            db.count("SELECT count(*) FROM __diesel_schema_migrations"),
            expected,
            "repetition {rep}: schema migration rows"
        );
        assert_eq!(
            (applied, up_to_date),
            (1, 4),
            "repetition {rep}: exactly one process applies, the others find the schema up to date: {:?}",
            procs.iter().map(Proc::stdout_text).collect::<Vec<_>>()
        );
    }
    let mut report = Report::new();
    report.add(
        "runs",
        format!(
            "{repetitions} fresh empty databases × 5 concurrent `migrate`: all exit 0, one applies, four up to date, {expected} migration row(s)"
        ),
    );
    report.add("time per run", latency_summary(&took));
    sc.publish(&report);
}

#[test]
fn concurrent_migrations_postgres() {
    concurrent_migrations(Backend::Postgres);
}

#[test]
fn concurrent_migrations_sqlite() {
    concurrent_migrations(Backend::Sqlite);
}

#[cfg(feature = "mysql")]
#[test]
fn concurrent_migrations_mysql() {
    concurrent_migrations(Backend::Mysql);
}
