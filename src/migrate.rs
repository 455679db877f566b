//! The embedded schema migrations, one tree per backend (`migrations/postgres`,
//! `migrations/sqlite`), safe to run from several processes at once.
//!
//! A library user applies them once at deployment, as `outbox migrate` does:
//!
//! ```no_run
//! # fn main() -> Result<(), outbox::Error> {
//! let url = outbox::DatabaseUrl::parse("postgres://app@db.internal/app")?;
//! // No reply timeout: a migration may rightly run long (a large table rebuilt).
//! let applied = outbox::run_migrations(&mut url.with_reply_timeout(None).connect()?)?;
//! println!("applied {applied:?}");
//! # Ok(())
//! # }
//! ```
//!
//! The tables (`async_task`, `async_node`) live in the connection's default schema, next to
//! the application's own tables, so that a producer's business transaction can write both.

use diesel::RunQueryDsl;

use crate::db::DbConnection;
use crate::driver::driver;
use crate::error::{Error, Result};

/// Applies every pending migration and returns the versions it applied.
///
/// Concurrent callers are serialised — a transaction-scoped advisory lock on PostgreSQL (one
/// transaction for them all: nothing applied when one fails), `GET_LOCK` on MySQL, an exclusive
/// transaction on SQLite — so that five processes starting at once leave one correct schema
/// and no errors: the first applies, the others find nothing pending.
pub fn run_migrations(conn: &mut DbConnection) -> Result<Vec<String>> {
    let applied = driver(conn).migrations_run().map_err(|source| {
        // PostgreSQL's "permission denied for schema …", MySQL's "CREATE command denied to
        // user …": a role without the right to change the schema, which is for the owner.
        let text = source.to_string();
        let denied = text.contains("permission denied") || text.contains("command denied");
        Error::Migration {
            operation: if denied {
                "migrate (it changes the schema: run it as the tables' owner; docs/guide/src/postgresql.md, \"Database roles\")"
            } else {
                "migrate"
            },
            source,
        }
    })?;
    for version in &applied {
        log::info!("applied migration {version}");
    }
    Ok(applied)
}

/// Fails with [`Error::NotMigrated`] when migrations are pending; workers and the CLI call
/// this at start so that a missing `outbox migrate` is named as such, not as a missing table.
///
/// It only reads: diesel's own check (`MigrationHarness::pending_migrations`) first creates
/// `__diesel_schema_migrations` when it is missing, which a role without the right to change the
/// schema may not do (docs/guide/src/postgresql.md, "Database roles"). A database without that
/// table has every migration pending.
pub fn ensure_migrated(conn: &mut DbConnection) -> Result<()> {
    let check = |source| Error::Migration {
        operation: "migration check",
        source,
    };
    let applied = applied_versions(conn).map_err(|e| check(e.into()))?;
    let pending = driver(conn)
        .migrations_known()
        .map_err(check)?
        .iter()
        .filter(|version| !applied.contains(version))
        .count();
    if pending > 0 {
        return Err(Error::NotMigrated { pending });
    }
    Ok(())
}

/// The versions recorded in `__diesel_schema_migrations`, none when it does not exist.
fn applied_versions(conn: &mut DbConnection) -> diesel::QueryResult<Vec<String>> {
    #[derive(diesel::QueryableByName)]
    struct Version {
        #[diesel(sql_type = diesel::sql_types::Text)]
        version: String,
    }
    #[derive(diesel::QueryableByName)]
    struct Found {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        found: i64,
    }
    // Each dialect has its own catalogue; each looks where an unqualified name resolves (the
    // search path, the connection's database, the main schema).
    let exists = match conn {
        #[cfg(feature = "postgres")]
        DbConnection::Pg(_) => {
            "SELECT CAST(count(*) AS BIGINT) AS found \
             WHERE to_regclass('__diesel_schema_migrations') IS NOT NULL"
        }
        #[cfg(feature = "sqlite")]
        DbConnection::Sqlite(_) => {
            "SELECT count(*) AS found FROM sqlite_master \
             WHERE type = 'table' AND name = '__diesel_schema_migrations'"
        }
        #[cfg(feature = "mysql")]
        DbConnection::Mysql(_) => {
            "SELECT CAST(count(*) AS SIGNED) AS found FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = '__diesel_schema_migrations'"
        }
    };
    let found: Found = diesel::sql_query(exists).get_result(conn)?;
    if found.found == 0 {
        return Ok(Vec::new());
    }
    let versions: Vec<Version> =
        diesel::sql_query("SELECT version FROM __diesel_schema_migrations").load(conn)?;
    Ok(versions.into_iter().map(|v| v.version).collect())
}
