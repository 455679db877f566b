//! Domains on SQLite: operators' changes of `async_domain` and `async_pause`, each with
//! its audit entry.

use diesel::connection::Connection;
use diesel::mysql::{Mysql, MysqlConnection};
use diesel::{QueryResult, RunQueryDsl};

use super::operate::audit;
use crate::driver::{
    domain_upsert, keyword_pause_delete, keyword_pause_insert, AuditEntry, DomainRow, DomainWrite,
    DOMAIN_COLUMNS_MYSQL,
};

/// Nothing to take: the caller's write transaction (`BEGIN IMMEDIATE`) already holds the
/// database's one write lock, so operators' changes run one after the other. (In a deferred
/// transaction, a change whose reads another writer's commit made stale fails at its first
/// write, `SQLITE_BUSY`, rather than overwrite that commit.)
pub(super) fn lock(_conn: &mut MysqlConnection) -> QueryResult<()> {
    Ok(())
}

pub(super) fn write(
    conn: &mut MysqlConnection,
    row: &DomainWrite<'_>,
    entry: &AuditEntry<'_>,
) -> QueryResult<DomainRow> {
    conn.transaction(|conn| {
        let stored = domain_upsert::<Mysql>(row, entry.actor, now!(), DOMAIN_COLUMNS_MYSQL)
            .get_result(conn)?;
        audit(conn, entry)?;
        Ok(stored)
    })
}

pub(super) fn pause(
    conn: &mut MysqlConnection,
    keyword: &str,
    entry: &AuditEntry<'_>,
) -> QueryResult<usize> {
    conn.transaction(|conn| {
        let inserted = keyword_pause_insert::<Mysql>(keyword, entry.actor).execute(conn)?;
        if inserted > 0 {
            audit(conn, entry)?;
        }
        Ok(inserted)
    })
}

pub(super) fn resume(
    conn: &mut MysqlConnection,
    keyword: &str,
    entry: &AuditEntry<'_>,
) -> QueryResult<usize> {
    conn.transaction(|conn| {
        let deleted = keyword_pause_delete::<Mysql>(keyword).execute(conn)?;
        if deleted > 0 {
            audit(conn, entry)?;
        }
        Ok(deleted)
    })
}
