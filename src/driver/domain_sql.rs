//! Domains' run-time control (`async_domain`, `async_pause`) and operators' changes of it,
//! each with its audit entry: written once, with the query builder; and the lock that
//! operators' changes take turns on, which is each backend's ([`domain_lock`]).

use chrono::NaiveDateTime;
use diesel::prelude::*;

use super::clock::{time_text, DbNow};
use super::dialect::{on_backend, unless_duplicate, Conn, UpsertKey};
use super::operate_sql::audit_write;
use super::{AuditEntry, DomainRow, DomainWrite, Driver};
use crate::db::DbConnection;
use crate::schema::{async_domain, async_pause};

/// The columns of a [`DomainTuple`].
macro_rules! domain_columns {
    () => {
        (
            async_domain::name,
            async_domain::keywords,
            async_domain::mode,
            async_domain::threads,
            async_domain::queue,
            async_domain::timeout_ms,
            async_domain::paused,
            async_domain::released,
            async_domain::held_keywords,
            async_domain::version,
            async_domain::updated_at,
            async_domain::updated_by,
        )
    };
}

/// See [`super::Driver::domain_lock`]: each backend's lock, taken first in the transaction.
pub(super) fn domain_lock(conn: Conn<'_>) -> QueryResult<()> {
    match conn {
        // SHARE ROW EXCLUSIVE conflicts with itself and with every writer of the table, not
        // with the heartbeats' reads (ACCESS SHARE). Taken first, it also comes before the
        // snapshot of a REPEATABLE READ or SERIALIZABLE transaction (a `LOCK` takes none), so
        // the reads that follow see every change committed by the operator who held it before.
        #[cfg(feature = "postgres")]
        Conn::Pg(c) => diesel::sql_query("LOCK TABLE async_domain IN SHARE ROW EXCLUSIVE MODE")
            .execute(c)
            .map(drop),
        // Nothing to take: the caller's write transaction (`BEGIN IMMEDIATE`) already holds the
        // database's one write lock, so operators' changes run one after the other. (In a
        // deferred transaction, a change whose reads another writer's commit made stale fails
        // at its first write, `SQLITE_BUSY`, rather than overwrite that commit.)
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(_) => Ok(()),
        // The row `'domain'` of `async_lock`, locked until the transaction ends: operators'
        // changes take turns on it, while heartbeats still read `async_domain` (plain reads
        // take no locks). Taken first, it comes before the reads that the change is checked
        // against (each statement of a READ COMMITTED transaction sees what committed before
        // it).
        #[cfg(feature = "mysql")]
        Conn::Mysql(c) => crate::schema::async_lock::table
            .find("domain")
            .select(crate::schema::async_lock::name)
            .for_update()
            .load::<String>(c)
            .map(drop),
    }
}

/// Every row of `async_domain`, by name.
pub(crate) fn domain_rows(conn: &mut DbConnection) -> QueryResult<Vec<DomainRow>> {
    let rows: Vec<DomainTuple> = async_domain::table
        .order(async_domain::name)
        .select(domain_columns!())
        .load(conn)?;
    Ok(rows.into_iter().map(DomainRow::from).collect())
}

/// See [`super::Driver::domain_write`]: the upsert, the row read back and its audit, in one
/// transaction.
pub(super) fn domain_write(
    conn: Conn<'_>,
    row: &DomainWrite<'_>,
    audit: &AuditEntry<'_>,
) -> QueryResult<DomainRow> {
    let values = (
        async_domain::keywords.eq(row.keywords.as_deref()),
        async_domain::mode.eq(row.mode),
        async_domain::threads.eq(row.threads),
        async_domain::queue.eq(row.queue),
        async_domain::timeout_ms.eq(row.timeout_ms),
        async_domain::paused.eq(row.paused),
        async_domain::released.eq(row.released),
        async_domain::held_keywords.eq(row.held_keywords.as_deref()),
        async_domain::updated_by.eq(audit.actor),
    );
    on_backend!(conn, |c| c.transaction(|c| {
        let key = c.upsert_key(async_domain::name);
        diesel::insert_into(async_domain::table)
            .values((async_domain::name.eq(row.name), values))
            .on_conflict(key)
            .do_update()
            .set((
                values,
                async_domain::version.eq(async_domain::version + 1),
                async_domain::updated_at.eq(DbNow),
            ))
            .execute(c)?;
        let stored: DomainTuple = async_domain::table
            .find(row.name)
            .select(domain_columns!())
            .get_result(c)?;
        audit_write(c.conn(), audit)?;
        Ok(DomainRow::from(stored))
    }))
}

/// See [`super::Driver::keyword_pause`].
pub(super) fn keyword_pause(
    conn: Conn<'_>,
    keyword: &str,
    audit: &AuditEntry<'_>,
) -> QueryResult<usize> {
    let mysql = conn.is_mysql();
    on_backend!(conn, |c| c.transaction(|c| {
        let insert = diesel::insert_into(async_pause::table).values((
            async_pause::keyword.eq(keyword),
            async_pause::paused_by.eq(audit.actor),
        ));
        let inserted = if mysql {
            unless_duplicate(insert.execute(c))?
        } else {
            insert.on_conflict_do_nothing().execute(c)?
        };
        if inserted > 0 {
            audit_write(c.conn(), audit)?;
        }
        Ok(inserted)
    }))
}

/// See [`super::Driver::keyword_resume`].
pub(super) fn keyword_resume(
    conn: Conn<'_>,
    keyword: &str,
    audit: &AuditEntry<'_>,
) -> QueryResult<usize> {
    on_backend!(conn, |c| c.transaction(|c| {
        let deleted = diesel::delete(async_pause::table.find(keyword)).execute(c)?;
        if deleted > 0 {
            audit_write(c.conn(), audit)?;
        }
        Ok(deleted)
    }))
}

/// An `async_domain` row as [`domain_columns`] loads it.
type DomainTuple = (
    String,
    Option<String>,
    Option<String>,
    Option<i32>,
    Option<i32>,
    Option<i64>,
    bool,
    bool,
    Option<String>,
    i64,
    NaiveDateTime,
    String,
);

impl From<DomainTuple> for DomainRow {
    fn from(t: DomainTuple) -> Self {
        DomainRow {
            name: t.0,
            keywords: t.1,
            mode: t.2,
            threads: t.3,
            queue: t.4,
            timeout_ms: t.5,
            paused: t.6,
            released: t.7,
            held_keywords: t.8,
            version: t.9,
            updated_at: time_text(t.10),
            updated_by: t.11,
        }
    }
}

/// The keywords paused on their own (`async_pause`), by name.
pub(crate) fn keyword_paused(conn: &mut DbConnection) -> QueryResult<Vec<String>> {
    async_pause::table
        .order(async_pause::keyword)
        .select(async_pause::keyword)
        .load(conn)
}
