//! The lock that operators' changes of domains and paused keywords take turns on, on
//! PostgreSQL (the changes themselves are written once, in `driver/domain_sql.rs`).

use diesel::pg::PgConnection;
use diesel::{QueryResult, RunQueryDsl};

/// SHARE ROW EXCLUSIVE conflicts with itself and with every writer of the table, not with
/// the heartbeats' reads (ACCESS SHARE). Taken first in the transaction, it also comes before
/// the snapshot of a REPEATABLE READ or SERIALIZABLE transaction (a `LOCK` takes none), so
/// the reads that follow see every change committed by the operator who held it before.
pub(in crate::driver) fn lock(conn: &mut PgConnection) -> QueryResult<()> {
    diesel::sql_query("LOCK TABLE async_domain IN SHARE ROW EXCLUSIVE MODE")
        .execute(conn)
        .map(drop)
}
