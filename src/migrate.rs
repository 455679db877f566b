//! The embedded schema migrations, one tree per backend, safe to run from several processes
//! at once.

use diesel::connection::SimpleConnection;
use diesel::sqlite::SqliteConnection;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use crate::db::DbConnection;
use crate::error::{Error, Result};

const POSTGRES: EmbeddedMigrations = embed_migrations!("migrations/postgres");
const SQLITE: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

/// The PostgreSQL advisory lock key that serialises concurrent `migrate` runs ("outbox" in
/// ASCII).
pub const MIGRATION_LOCK_KEY: i64 = 0x6f7574626f78;

/// Applies every pending migration and returns the versions it applied.
///
/// Concurrent callers are serialised — a session advisory lock on PostgreSQL, an exclusive
/// transaction on SQLite — so that five processes starting at once leave one correct schema
/// and no errors: the first applies, the others find nothing pending.
pub fn run_migrations(conn: &mut DbConnection) -> Result<Vec<String>> {
    let applied = match conn {
        DbConnection::Pg(c) => {
            c.batch_execute(&format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})"))
                .map_err(|e| Error::Migration(format!("taking the migration lock: {e}")))?;
            let result = c
                .run_pending_migrations(POSTGRES)
                .map(|v| v.iter().map(ToString::to_string).collect::<Vec<_>>());
            let unlock =
                c.batch_execute(&format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})"));
            let applied = result.map_err(|e| Error::Migration(e.to_string()))?;
            unlock.map_err(|e| Error::Migration(format!("releasing the migration lock: {e}")))?;
            applied
        }
        DbConnection::Sqlite(c) => sqlite_exclusive(c, |c| {
            c.run_pending_migrations(SQLITE)
                .map(|v| v.iter().map(ToString::to_string).collect::<Vec<_>>())
                .map_err(|e| Error::Migration(e.to_string()))
        })?,
    };
    for version in &applied {
        log::info!("applied migration {version}");
    }
    Ok(applied)
}

/// Fails with [`Error::NotMigrated`] when migrations are pending; workers and producers call
/// this at start so that a missing `outbox migrate` is named as such, not as a missing table.
pub fn ensure_migrated(conn: &mut DbConnection) -> Result<()> {
    let pending = match conn {
        DbConnection::Pg(c) => c.pending_migrations(POSTGRES).map(|p| p.len()),
        DbConnection::Sqlite(c) => c.pending_migrations(SQLITE).map(|p| p.len()),
    }
    .map_err(|e| Error::Migration(format!("checking for pending migrations: {e}")))?;
    if pending > 0 {
        return Err(Error::NotMigrated { pending });
    }
    Ok(())
}

/// Runs `f` in an `EXCLUSIVE` transaction: diesel's harness then runs each migration in a
/// savepoint inside it, and a second process waits (busy timeout) instead of racing.
fn sqlite_exclusive<T>(
    conn: &mut SqliteConnection,
    f: impl FnOnce(&mut SqliteConnection) -> Result<T>,
) -> Result<T> {
    conn.exclusive_transaction(|c| f(c).map_err(SqliteTxError::Outbox))
        .map_err(|e| match e {
            SqliteTxError::Outbox(e) => e,
            SqliteTxError::Diesel(e) => Error::Migration(format!("exclusive transaction: {e}")),
        })
}

enum SqliteTxError {
    Outbox(Error),
    Diesel(diesel::result::Error),
}

impl From<diesel::result::Error> for SqliteTxError {
    fn from(e: diesel::result::Error) -> Self {
        SqliteTxError::Diesel(e)
    }
}
