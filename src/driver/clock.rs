//! The database clock in queries written once with the query builder: each backend says
//! "now" and "so long ago" in its own words, and its time columns load as a UTC
//! `NaiveDateTime` (see `crate::schema`), shown as text in one shape.
//!
//! `diesel::dsl::now` is `CURRENT_TIMESTAMP`, which is whole seconds on SQLite and the
//! session's local time on MySQL; these are the expressions the per-backend SQL uses
//! (PostgreSQL `now()`, SQLite `datetime('now', 'subsec')` text with milliseconds, MySQL
//! `UTC_TIMESTAMP(3)`), so a query written with them compares as the hand-written one did.

use chrono::NaiveDateTime;
use diesel::expression::AsExpression;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Timestamp};
use diesel::QueryResult;

#[cfg(feature = "mysql")]
use diesel::mysql::Mysql;
#[cfg(feature = "postgres")]
use diesel::pg::Pg;
#[cfg(feature = "sqlite")]
use diesel::sqlite::Sqlite;

use super::dialect::{dialect_expression, spelled};

/// The shape of a time as text, on every backend: UTC, `YYYY-MM-DD HH:MM:SS.SSS`.
const TIME_FORMAT: &str = "%Y-%m-%d %H:%M:%S%.3f";

/// A time loaded from a `Timestamp` column as the text the rows carry.
pub(crate) fn time_text(t: NaiveDateTime) -> String {
    t.format(TIME_FORMAT).to_string()
}

/// The database clock now (`Timestamp`).
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct DbNow;

/// The database clock `ms` milliseconds ago (`Timestamp`).
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct DbAgo {
    ms: <i64 as AsExpression<BigInt>>::Expression,
}

/// The database clock `ms` milliseconds ago.
pub(crate) fn db_ago(ms: i64) -> DbAgo {
    DbAgo {
        ms: AsExpression::<BigInt>::as_expression(ms),
    }
}

/// The database clock `ms` milliseconds from now (`Timestamp`).
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct DbLater {
    ms: <i64 as AsExpression<BigInt>>::Expression,
}

/// The database clock `ms` milliseconds from now.
pub(crate) fn db_later(ms: i64) -> DbLater {
    DbLater {
        ms: AsExpression::<BigInt>::as_expression(ms),
    }
}

dialect_expression!(DbNow, Timestamp);
dialect_expression!(DbAgo, Timestamp);
dialect_expression!(DbLater, Timestamp);

#[cfg(feature = "postgres")]
spelled!(Pg, DbNow, "now()");
#[cfg(feature = "postgres")]
spelled!(Pg, DbAgo, ms, "(now() - ", " * interval '1 millisecond')");
#[cfg(feature = "postgres")]
spelled!(Pg, DbLater, ms, "(now() + ", " * interval '1 millisecond')");

#[cfg(feature = "sqlite")]
spelled!(Sqlite, DbNow, "datetime('now', 'subsec')");
#[cfg(feature = "sqlite")]
spelled!(
    Sqlite,
    DbAgo,
    ms,
    "datetime('now', 'subsec', printf('-%.3f seconds', ",
    " / 1000.0))"
);
#[cfg(feature = "sqlite")]
spelled!(
    Sqlite,
    DbLater,
    ms,
    "datetime('now', 'subsec', printf('+%.3f seconds', ",
    " / 1000.0))"
);

#[cfg(feature = "mysql")]
spelled!(Mysql, DbNow, "UTC_TIMESTAMP(3)");
#[cfg(feature = "mysql")]
spelled!(
    Mysql,
    DbAgo,
    ms,
    "(UTC_TIMESTAMP(3) - INTERVAL ",
    " * 1000 MICROSECOND)"
);
#[cfg(feature = "mysql")]
spelled!(
    Mysql,
    DbLater,
    ms,
    "(UTC_TIMESTAMP(3) + INTERVAL ",
    " * 1000 MICROSECOND)"
);
