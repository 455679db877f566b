//! The lock that operators' changes of domains and paused keywords take turns on, on
//! MySQL (the changes themselves are written once, in `driver/domain_sql.rs`).

use diesel::mysql::MysqlConnection;
use diesel::{QueryResult, RunQueryDsl};

/// The row `'domain'` of `async_lock`, locked until the open transaction ends: operators'
/// changes take turns on it, while heartbeats still read `async_domain` (plain reads take
/// no locks). Taken first in the transaction, it comes before the reads that the change is
/// checked against (each statement of a READ COMMITTED transaction sees what committed
/// before it).
pub(in crate::driver) fn lock(conn: &mut MysqlConnection) -> QueryResult<()> {
    diesel::sql_query("SELECT name FROM async_lock WHERE name = 'domain' FOR UPDATE")
        .execute(conn)
        .map(drop)
}
