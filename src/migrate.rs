//! The embedded schema migrations, one tree per backend (`migrations/postgres`,
//! `migrations/sqlite`), safe to run from several processes at once.
//!
//! A library user applies them once at deployment, as `outbox migrate` does:
//!
//! ```no_run
//! # fn main() -> Result<(), outbox::Error> {
//! let url = outbox::DatabaseUrl::parse("postgres://app@db.internal/app")?;
//! let applied = outbox::run_migrations(&mut url.connect()?)?;
//! println!("applied {applied:?}");
//! # Ok(())
//! # }
//! ```
//!
//! The tables (`async_task`, `async_node`) live in the connection's default schema, next to
//! the application's own tables, so that a producer's business transaction can write both.

use crate::db::DbConnection;
use crate::driver::driver;
use crate::error::{Error, Result};

/// Applies every pending migration and returns the versions it applied.
///
/// Concurrent callers are serialised — a session advisory lock on PostgreSQL, an exclusive
/// transaction on SQLite — so that five processes starting at once leave one correct schema
/// and no errors: the first applies, the others find nothing pending.
pub fn run_migrations(conn: &mut DbConnection) -> Result<Vec<String>> {
    let applied = driver(conn)
        .migrations_run()
        .map_err(|source| Error::Migration {
            operation: "migrate",
            source,
        })?;
    for version in &applied {
        log::info!("applied migration {version}");
    }
    Ok(applied)
}

/// Fails with [`Error::NotMigrated`] when migrations are pending; workers and the CLI call
/// this at start so that a missing `outbox migrate` is named as such, not as a missing table.
pub fn ensure_migrated(conn: &mut DbConnection) -> Result<()> {
    let pending = driver(conn)
        .migrations_pending()
        .map_err(|source| Error::Migration {
            operation: "migration check",
            source,
        })?;
    if pending > 0 {
        return Err(Error::NotMigrated { pending });
    }
    Ok(())
}
