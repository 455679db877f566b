//! What the backends' migration harnesses share: each backend applies its own migrations,
//! serialised against other processes its own way (see each `migrations_run`).

use diesel::backend::Backend;

/// An error of the migration harness.
pub type MigrationError = Box<dyn std::error::Error + Send + Sync>;

/// The versions of the migrations of `source`, as diesel records them once applied.
pub(super) fn migration_versions<DB: Backend>(
    source: &impl diesel::migration::MigrationSource<DB>,
) -> Result<Vec<String>, MigrationError> {
    Ok(source
        .migrations()?
        .iter()
        .map(|m| m.name().version().to_string())
        .collect())
}

/// Applies `conn`'s pending migrations of `source`; returns the versions applied.
pub(super) fn migrations_apply<DB: Backend>(
    conn: &mut impl diesel_migrations::MigrationHarness<DB>,
    source: diesel_migrations::EmbeddedMigrations,
) -> Result<Vec<String>, MigrationError> {
    conn.run_pending_migrations(source)
        .map(|v| v.iter().map(ToString::to_string).collect())
}

/// Rolls back the transaction of a migration run that failed (its error is `applied`'s).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(super) fn rollback_unless_applied(
    applied: &Result<Vec<String>, MigrationError>,
) -> diesel::QueryResult<()> {
    match applied {
        Ok(_) => Ok(()),
        Err(_) => Err(diesel::result::Error::RollbackTransaction),
    }
}

/// A transaction rolled back by [`rollback_unless_applied`] is no error of its own.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(super) fn rolled_back(e: diesel::result::Error) -> diesel::QueryResult<()> {
    match e {
        diesel::result::Error::RollbackTransaction => Ok(()),
        other => Err(other),
    }
}
