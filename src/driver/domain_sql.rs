//! The SQL of domains' run-time control that the backends share: the columns of an
//! `async_domain` row, its upsert with the audit entry, and `async_pause`'s writes.

use diesel::backend::Backend;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::sql_types::{BigInt, Bool, Integer, Nullable};
use diesel::sql_types::{HasSqlType, Text};

use chrono::NaiveDateTime;
use diesel::prelude::*;

use super::clock::time_text;
use super::DomainRow;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use super::DomainWrite;
use crate::db::DbConnection;
use crate::schema::async_pause;
use crate::sql::Statement;

/// The columns of a [`DomainRow`], with `updated_at` as the expression given (the rest the
/// same on every backend).
macro_rules! domain_columns {
    ($updated_at:literal) => {
        concat!(
            "name, keywords, mode, threads, queue, timeout_ms, paused, released, held_keywords, \
             version, ",
            $updated_at,
            " AS updated_at, updated_by"
        )
    };
}

/// A [`DomainRow`]'s columns on PostgreSQL: `updated_at` as SQLite stores it, UTC
/// `YYYY-MM-DD HH:MM:SS.SSS`, whatever the session's time zone.
#[cfg(feature = "postgres")]
pub(super) const DOMAIN_COLUMNS_PG: &str =
    domain_columns!("to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS')");

/// A [`DomainRow`]'s columns on SQLite.
#[cfg(feature = "sqlite")]
pub(super) const DOMAIN_COLUMNS_SQLITE: &str = domain_columns!("updated_at");

/// A [`DomainRow`]'s columns on MySQL: `updated_at` (a UTC `DATETIME(3)`) as text.
#[cfg(feature = "mysql")]
pub(super) const DOMAIN_COLUMNS_MYSQL: &str = domain_columns!("CAST(updated_at AS CHAR)");

#[cfg(any(feature = "postgres", feature = "sqlite"))]
/// The upsert of a whole `async_domain` row, returning its `columns` (the same SQL on both
/// backends but for the clock, `now`, the columns, and the bind placeholders diesel writes).
pub(super) fn domain_upsert<DB>(
    row: &DomainWrite<'_>,
    actor: &str,
    now: &'static str,
    columns: &'static str,
) -> Statement<DB>
where
    DB: Backend + HasSqlType<BigInt> + HasSqlType<Integer> + HasSqlType<Text> + HasSqlType<Bool>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
    i32: diesel::serialize::ToSql<Integer, DB>,
    bool: diesel::serialize::ToSql<Bool, DB>,
    String: diesel::serialize::ToSql<Text, DB>,
{
    Statement::new(
        "INSERT INTO async_domain AS d \
         (name, keywords, mode, threads, queue, timeout_ms, paused, released, held_keywords, \
         updated_by) VALUES (",
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
    .bind::<Text, _>(actor.to_owned())
    .sql(
        ") ON CONFLICT (name) DO UPDATE SET keywords = excluded.keywords, \
         mode = excluded.mode, threads = excluded.threads, queue = excluded.queue, \
         timeout_ms = excluded.timeout_ms, paused = excluded.paused, \
         released = excluded.released, held_keywords = excluded.held_keywords, \
         version = d.version + 1, updated_at = ",
    )
    .sql(now)
    .sql(", updated_by = excluded.updated_by RETURNING ")
    .sql(columns)
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
/// Pauses a keyword on its own, by `actor`; inserts nothing when it is paused already (the
/// same on PostgreSQL and SQLite).
pub(super) fn keyword_pause_insert<DB>(keyword: &str, actor: &str) -> Statement<DB>
where
    DB: Backend + HasSqlType<Text>,
    String: diesel::serialize::ToSql<Text, DB>,
{
    Statement::new("INSERT INTO async_pause (keyword, paused_by) VALUES (")
        .bind::<Text, _>(keyword.to_owned())
        .sql(", ")
        .bind::<Text, _>(actor.to_owned())
        .sql(") ON CONFLICT (keyword) DO NOTHING")
}

/// Deletes a keyword's pause (the same on every backend).
pub(super) fn keyword_pause_delete<DB>(keyword: &str) -> Statement<DB>
where
    DB: Backend + HasSqlType<Text>,
    String: diesel::serialize::ToSql<Text, DB>,
{
    Statement::new("DELETE FROM async_pause WHERE keyword = ").bind::<Text, _>(keyword.to_owned())
}

/// Every row of `async_domain`, by name. The same on every backend: written once, with the
/// query builder.
pub(crate) fn domain_rows(conn: &mut DbConnection) -> QueryResult<Vec<DomainRow>> {
    use crate::schema::async_domain::dsl::*;
    let rows: Vec<DomainTuple> = async_domain
        .order(name)
        .select((
            name,
            keywords,
            mode,
            threads,
            queue,
            timeout_ms,
            paused,
            released,
            held_keywords,
            version,
            updated_at,
            updated_by,
        ))
        .load(conn)?;
    Ok(rows.into_iter().map(DomainRow::from).collect())
}

/// An `async_domain` row as [`domain_rows`] loads it.
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

/// The keywords paused on their own (`async_pause`), by name. Written once.
pub(crate) fn keyword_paused(conn: &mut DbConnection) -> QueryResult<Vec<String>> {
    async_pause::table
        .order(async_pause::keyword)
        .select(async_pause::keyword)
        .load(conn)
}
