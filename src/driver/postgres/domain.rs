//! Domains on PostgreSQL: operators' changes of `async_domain` and `async_pause`, each with
//! its audit entry.

use diesel::connection::Connection;
use diesel::pg::{Pg, PgConnection};
use diesel::{QueryResult, RunQueryDsl};

use super::operate::audit;
use crate::driver::{
    domain_upsert, keyword_pause_delete, keyword_pause_insert, AuditEntry, DomainRow, DomainWrite,
    DOMAIN_COLUMNS_PG,
};

/// SHARE ROW EXCLUSIVE conflicts with itself and with every writer of the table, not with
/// the heartbeats' reads (ACCESS SHARE). Taken first in the transaction, it also comes before
/// the snapshot of a REPEATABLE READ or SERIALIZABLE transaction (a `LOCK` takes none), so
/// the reads that follow see every change committed by the operator who held it before.
pub(super) fn lock(conn: &mut PgConnection) -> QueryResult<()> {
    diesel::sql_query("LOCK TABLE async_domain IN SHARE ROW EXCLUSIVE MODE")
        .execute(conn)
        .map(drop)
}

pub(super) fn write(
    conn: &mut PgConnection,
    row: &DomainWrite<'_>,
    entry: &AuditEntry<'_>,
) -> QueryResult<DomainRow> {
    conn.transaction(|conn| {
        let stored =
            domain_upsert::<Pg>(row, entry.actor, "now()", DOMAIN_COLUMNS_PG).get_result(conn)?;
        audit(conn, entry)?;
        Ok(stored)
    })
}

pub(super) fn pause(
    conn: &mut PgConnection,
    keyword: &str,
    entry: &AuditEntry<'_>,
) -> QueryResult<usize> {
    conn.transaction(|conn| {
        let inserted = keyword_pause_insert::<Pg>(keyword, entry.actor).execute(conn)?;
        if inserted > 0 {
            audit(conn, entry)?;
        }
        Ok(inserted)
    })
}

pub(super) fn resume(
    conn: &mut PgConnection,
    keyword: &str,
    entry: &AuditEntry<'_>,
) -> QueryResult<usize> {
    conn.transaction(|conn| {
        let deleted = keyword_pause_delete::<Pg>(keyword).execute(conn)?;
        if deleted > 0 {
            audit(conn, entry)?;
        }
        Ok(deleted)
    })
}
