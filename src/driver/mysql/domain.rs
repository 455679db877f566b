//! Domains on MySQL: operators' changes of `async_domain` and `async_pause`, each with
//! its audit entry.

use diesel::connection::Connection;
use diesel::mysql::{Mysql, MysqlConnection};
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text};
use diesel::{QueryResult, RunQueryDsl};

use super::operate::audit;
use crate::driver::{
    keyword_pause_delete, AuditEntry, DomainRow, DomainWrite, DOMAIN_COLUMNS_MYSQL,
};
use crate::sql::Statement;

/// The row `'domain'` of `async_lock`, locked until the open transaction ends: operators'
/// changes take turns on it, while heartbeats still read `async_domain` (plain reads take
/// no locks). Taken first in the transaction, it comes before the reads that the change is
/// checked against (each statement of a READ COMMITTED transaction sees what committed
/// before it).
pub(super) fn lock(conn: &mut MysqlConnection) -> QueryResult<()> {
    diesel::sql_query("SELECT name FROM async_lock WHERE name = 'domain' FOR UPDATE")
        .execute(conn)
        .map(drop)
}

/// The upsert of a whole `async_domain` row, then the row read back (MySQL has no
/// RETURNING), in the caller's transaction.
pub(super) fn write(
    conn: &mut MysqlConnection,
    row: &DomainWrite<'_>,
    entry: &AuditEntry<'_>,
) -> QueryResult<DomainRow> {
    conn.transaction(|conn| {
        Statement::<Mysql>::new(
            "INSERT INTO async_domain \
             (name, keywords, mode, threads, queue, timeout_ms, paused, released, \
             held_keywords, updated_by) VALUES (",
        )
        .bind::<Text, _>(row.name.to_owned())
        .sql(", ")
        .bind::<Nullable<Text>, _>(row.keywords.clone())
        .sql(", ")
        .bind::<Nullable<Text>, _>(row.mode.map(str::to_owned))
        .sql(", ")
        .bind::<Nullable<Integer>, _>(row.threads)
        .sql(", ")
        .bind::<Nullable<Integer>, _>(row.queue)
        .sql(", ")
        .bind::<Nullable<BigInt>, _>(row.timeout_ms)
        .sql(", ")
        .bind::<Bool, _>(row.paused)
        .sql(", ")
        .bind::<Bool, _>(row.released)
        .sql(", ")
        .bind::<Nullable<Text>, _>(row.held_keywords.clone())
        .sql(", ")
        .bind::<Text, _>(entry.actor.to_owned())
        .sql(concat!(
            ") ON DUPLICATE KEY UPDATE keywords = VALUES(keywords), mode = VALUES(mode), \
             threads = VALUES(threads), queue = VALUES(queue), \
             timeout_ms = VALUES(timeout_ms), paused = VALUES(paused), \
             released = VALUES(released), held_keywords = VALUES(held_keywords), \
             version = version + 1, updated_at = ",
            now!(),
            ", updated_by = VALUES(updated_by)"
        ))
        .execute(conn)?;
        let stored = Statement::<Mysql>::new("SELECT ")
            .sql(DOMAIN_COLUMNS_MYSQL)
            .sql(" FROM async_domain WHERE name = ")
            .bind::<Text, _>(row.name.to_owned())
            .get_result(conn)?;
        audit(conn, entry)?;
        Ok(stored)
    })
}

/// 0 for an INSERT refused as a duplicate key (MySQL's `ON CONFLICT DO NOTHING`: the
/// statement alone is undone, not the transaction); the rows inserted otherwise.
pub(super) fn unless_duplicate(inserted: QueryResult<usize>) -> QueryResult<usize> {
    match inserted {
        Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(0),
        other => other,
    }
}

pub(super) fn pause(
    conn: &mut MysqlConnection,
    keyword: &str,
    entry: &AuditEntry<'_>,
) -> QueryResult<usize> {
    conn.transaction(|conn| {
        let inserted = unless_duplicate(
            Statement::<Mysql>::new("INSERT INTO async_pause (keyword, paused_by) VALUES (")
                .bind::<Text, _>(keyword.to_owned())
                .sql(", ")
                .bind::<Text, _>(entry.actor.to_owned())
                .sql(")")
                .execute(conn),
        )?;
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
