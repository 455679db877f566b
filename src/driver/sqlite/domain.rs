//! The lock that operators' changes of domains and paused keywords take turns on, on
//! SQLite (the changes themselves are written once, in `driver/domain_sql.rs`).

use diesel::sqlite::SqliteConnection;
use diesel::QueryResult;

/// Nothing to take: the caller's write transaction (`BEGIN IMMEDIATE`) already holds the
/// database's one write lock, so operators' changes run one after the other. (In a deferred
/// transaction, a change whose reads another writer's commit made stale fails at its first
/// write, `SQLITE_BUSY`, rather than overwrite that commit.)
pub(in crate::driver) fn lock(_conn: &mut SqliteConnection) -> QueryResult<()> {
    Ok(())
}
