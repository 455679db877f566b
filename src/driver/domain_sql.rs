//! The SQL of domains' run-time control that the backends share: the columns of an
//! `async_domain` row, its upsert with the audit entry, and `async_pause`'s writes.

use diesel::backend::Backend;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::sql_types::{BigInt, Bool, Integer, Nullable};
use diesel::sql_types::{HasSqlType, Text};

#[cfg(any(feature = "postgres", feature = "sqlite"))]
use super::DomainWrite;
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

/// Every row of `async_domain`, by name, on PostgreSQL.
#[cfg(feature = "postgres")]
pub(super) const DOMAIN_ROWS_PG: &str = concat!(
    "SELECT ",
    domain_columns!("to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS')"),
    " FROM async_domain ORDER BY name"
);

/// Every row of `async_domain`, by name, on SQLite.
#[cfg(feature = "sqlite")]
pub(super) const DOMAIN_ROWS_SQLITE: &str = concat!(
    "SELECT ",
    domain_columns!("updated_at"),
    " FROM async_domain ORDER BY name"
);

/// Every row of `async_domain`, by name, on MySQL.
#[cfg(feature = "mysql")]
pub(super) const DOMAIN_ROWS_MYSQL: &str = concat!(
    "SELECT ",
    domain_columns!("CAST(updated_at AS CHAR)"),
    " FROM async_domain ORDER BY name"
);

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

/// The keywords paused on their own.
pub(super) const KEYWORD_PAUSED: &str = "SELECT keyword FROM async_pause ORDER BY keyword";
