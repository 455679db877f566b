//! What a query written once needs of the backend it runs on: the backend's own connection,
//! borrowed ([`Conn`], for the [`super::Driver`] methods that a producer calls on its own
//! connection), and the few words the backends spell differently (a JSON value as text, a
//! time bound as text, the key of an upsert, an insert unless the row exists).

use diesel::expression::{
    is_aggregate, AppearsOnTable, AsExpression, Expression, SelectableExpression, ValidGrouping,
};
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{Text, Timestamp};
use diesel::QueryResult;

#[cfg(feature = "mysql")]
use diesel::mysql::{Mysql, MysqlConnection};
#[cfg(feature = "postgres")]
use diesel::pg::{Pg, PgConnection};
#[cfg(feature = "sqlite")]
use diesel::sqlite::{Sqlite, SqliteConnection};

use crate::db::DbConnection;

/// The backend of [`DbConnection`]: each of its queries is rendered by the backend of the
/// connection it runs on.
pub(super) type DbBackend = <DbConnection as diesel::Connection>::Backend;

/// `$ty` an expression of `$sql_type` on any table, rendered on [`DbConnection`] by the
/// backend of the connection (each backend's spelling: [`spelled`]).
macro_rules! dialect_expression {
    ($ty:ty, $sql_type:ty) => {
        impl diesel::expression::Expression for $ty {
            type SqlType = $sql_type;
        }
        impl<QS> diesel::expression::AppearsOnTable<QS> for $ty {}
        impl<QS> diesel::expression::SelectableExpression<QS> for $ty {}
        impl<GB> diesel::expression::ValidGrouping<GB> for $ty {
            type IsAggregate = diesel::expression::is_aggregate::Never;
        }
        impl diesel::query_builder::QueryFragment<$crate::driver::dialect::DbBackend> for $ty {
            fn walk_ast<'b>(
                &'b self,
                pass: diesel::query_builder::AstPass<'_, 'b, $crate::driver::dialect::DbBackend>,
            ) -> diesel::QueryResult<()> {
                $crate::driver::dialect::DbBackend::walk_variant_ast(self, pass)
            }
        }
    };
}
pub(super) use dialect_expression;

/// A backend's connection, borrowed: what the driver's statements written once run on.
pub enum Conn<'a> {
    #[cfg(feature = "postgres")]
    Pg(&'a mut PgConnection),
    #[cfg(feature = "sqlite")]
    Sqlite(&'a mut SqliteConnection),
    #[cfg(feature = "mysql")]
    Mysql(&'a mut MysqlConnection),
}

impl Conn<'_> {
    /// Whether this backend finds running tasks by their lease index (`deadline_at IS NOT
    /// NULL`; SQLite and MySQL), which a task that stops running must leave.
    pub(super) fn has_lease_index(&self) -> bool {
        #[cfg(feature = "postgres")]
        return !matches!(self, Conn::Pg(_));
        #[cfg(not(feature = "postgres"))]
        true
    }

    /// Whether this is MySQL, which has no triggers where the other backends have them.
    pub(super) fn is_mysql(&self) -> bool {
        #[cfg(feature = "mysql")]
        return matches!(self, Conn::Mysql(_));
        #[cfg(not(feature = "mysql"))]
        false
    }
}

/// Runs `$body` with `$c` bound to the backend's own connection of `$conn` (a [`Conn`]): the
/// body is written once and compiled for each backend, with its types.
macro_rules! on_backend {
    ($conn:expr, |$c:ident| $body:expr) => {
        match $conn {
            #[cfg(feature = "postgres")]
            $crate::driver::dialect::Conn::Pg($c) => $body,
            #[cfg(feature = "sqlite")]
            $crate::driver::dialect::Conn::Sqlite($c) => $body,
            #[cfg(feature = "mysql")]
            $crate::driver::dialect::Conn::Mysql($c) => $body,
        }
    };
}
pub(super) use on_backend;

/// Calls the backend's own function of a [`Driver`] method (each backend's module exports it
/// under the method's name), with the backend's connection first: the methods whose SQL is
/// each backend's, for a reason its function says.
macro_rules! per_backend {
    ($self:ident.$method:ident($($arg:expr),*)) => {
        match $self.conn() {
            #[cfg(feature = "postgres")]
            $crate::driver::dialect::Conn::Pg(c) => postgres::$method(c, $($arg),*),
            #[cfg(feature = "sqlite")]
            $crate::driver::dialect::Conn::Sqlite(c) => sqlite::$method(c, $($arg),*),
            #[cfg(feature = "mysql")]
            $crate::driver::dialect::Conn::Mysql(c) => mysql::$method(c, $($arg),*),
        }
    };
}
pub(super) use per_backend;

/// How `$backend` spells the expression `$ty`: SQL text alone, or text before and after its
/// bound field `$field`.
macro_rules! spelled {
    ($backend:ty, $ty:ty, $sql:literal) => {
        impl QueryFragment<$backend> for $ty {
            fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, $backend>) -> QueryResult<()> {
                out.push_sql($sql);
                Ok(())
            }
        }
    };
    ($backend:ty, $ty:ty, $field:tt, $before:literal, $after:literal) => {
        impl QueryFragment<$backend> for $ty {
            fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, $backend>) -> QueryResult<()> {
                out.push_sql($before);
                self.$field.walk_ast(out.reborrow())?;
                out.push_sql($after);
                Ok(())
            }
        }
    };
}
pub(super) use spelled;

/// `state IN ('pending', 'blocked', 'running')`, the unfinished tasks, as literals: a planner
/// proves a partial index's predicate (the tenant index's, this one) from literals only, not
/// from bind parameters (SQLite: from the very same term).
pub(super) fn unfinished() -> diesel::expression::SqlLiteral<diesel::sql_types::Bool> {
    diesel::dsl::sql("state IN ('pending', 'blocked', 'running')")
}

/// `state IN ('pending', 'blocked')`, the queued tasks, as literals (see [`unfinished`]).
pub(super) fn queued() -> diesel::expression::SqlLiteral<diesel::sql_types::Bool> {
    diesel::dsl::sql("state IN ('pending', 'blocked')")
}

/// `state = 'pending'`, as a literal (see [`unfinished`]): the claim index's predicate.
pub(super) fn pending() -> diesel::expression::SqlLiteral<diesel::sql_types::Bool> {
    diesel::dsl::sql("state = 'pending'")
}

/// Whether a task's handler may be running: the task is `running`, or, under lock claims
/// (PostgreSQL and MySQL: SQLite has none), `pending` and leased to a chunk.
#[derive(Debug, Clone, Copy, QueryId)]
pub(super) struct MayRun;

impl Expression for MayRun {
    type SqlType = diesel::sql_types::Bool;
}
impl AppearsOnTable<crate::schema::async_task::table> for MayRun {}
impl<GB> ValidGrouping<GB> for MayRun {
    type IsAggregate = is_aggregate::Never;
}

#[cfg(feature = "postgres")]
spelled!(Pg, MayRun, "(state = 'running' OR state = 'pending' AND EXISTS (SELECT 1 FROM async_lease l WHERE l.task_id = async_task.id))");
#[cfg(feature = "sqlite")]
spelled!(Sqlite, MayRun, "state = 'running'");
// MySQL cancels its own way (`mysql/task.rs`), the leases read apart: a subquery of the
// cancel's `UPDATE` would be a locking read at REPEATABLE READ. Never to be spelled there.
#[cfg(feature = "mysql")]
impl QueryFragment<Mysql> for MayRun {
    fn walk_ast<'b>(&'b self, _: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
        Err(Error::QueryBuilderError(
            "MayRun is not spelled on MySQL: see mysql/task.rs".into(),
        ))
    }
}

/// The target of an upsert on a unique `key`, as each backend's connection spells it:
/// `ON CONFLICT (key)`, or MySQL's `ON DUPLICATE KEY`, which has no target.
pub(super) trait UpsertKey {
    type Key<K>;
    fn upsert_key<K>(&self, key: K) -> Self::Key<K>;
}

#[cfg(feature = "postgres")]
impl UpsertKey for PgConnection {
    type Key<K> = K;
    fn upsert_key<K>(&self, key: K) -> K {
        key
    }
}

#[cfg(feature = "sqlite")]
impl UpsertKey for SqliteConnection {
    type Key<K> = K;
    fn upsert_key<K>(&self, key: K) -> K {
        key
    }
}

#[cfg(feature = "mysql")]
impl UpsertKey for MysqlConnection {
    type Key<K> = diesel::dsl::DuplicatedKeys;
    fn upsert_key<K>(&self, _key: K) -> Self::Key<K> {
        diesel::dsl::DuplicatedKeys
    }
}

/// A JSON value bound as text, for a JSON column (`::jsonb` on PostgreSQL, whose column
/// takes no text bind; the text itself elsewhere).
#[derive(Debug, Clone, QueryId)]
pub(crate) struct JsonBind(<String as AsExpression<Text>>::Expression);

/// `json` (JSON text) bound for a JSON column.
pub(crate) fn json_bind(json: &str) -> JsonBind {
    JsonBind(AsExpression::<Text>::as_expression(json.to_owned()))
}

/// A JSON column read as text (`::text` on PostgreSQL, which loads no `jsonb` as text; the
/// column itself elsewhere).
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct JsonText<C>(pub(crate) C);

dialect_expression!(JsonBind, Text);

impl<C: Expression> Expression for JsonText<C> {
    type SqlType = Text;
}
impl<QS, C: AppearsOnTable<QS> + Expression> AppearsOnTable<QS> for JsonText<C> {}
impl<QS, C: SelectableExpression<QS> + Expression> SelectableExpression<QS> for JsonText<C> {}
impl<GB, C: ValidGrouping<GB>> ValidGrouping<GB> for JsonText<C> {
    type IsAggregate = C::IsAggregate;
}

/// The JSON columns, read as text on [`DbConnection`].
macro_rules! json_column {
    ($column:ty) => {
        impl QueryFragment<DbBackend> for JsonText<$column> {
            fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, DbBackend>) -> QueryResult<()> {
                DbBackend::walk_variant_ast(self, pass)
            }
        }
    };
}
json_column!(crate::schema::async_task::biz_data);
json_column!(crate::schema::async_audit::detail);

#[cfg(feature = "postgres")]
spelled!(Pg, JsonBind, 0, "", "::jsonb");
#[cfg(feature = "postgres")]
impl<C: QueryFragment<Pg>> QueryFragment<Pg> for JsonText<C> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("(");
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(")::text");
        Ok(())
    }
}

/// JSON is text on SQLite and MySQL: the bind and the column as they are.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
macro_rules! json_as_text {
    ($backend:ty) => {
        spelled!($backend, JsonBind, 0, "", "");
        impl<C: QueryFragment<$backend>> QueryFragment<$backend> for JsonText<C> {
            fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, $backend>) -> QueryResult<()> {
                self.0.walk_ast(out)
            }
        }
    };
}
#[cfg(feature = "sqlite")]
json_as_text!(Sqlite);
#[cfg(feature = "mysql")]
json_as_text!(Mysql);

/// 0 for an INSERT refused as a duplicate key, the rows inserted otherwise: MySQL's "insert
/// unless it exists" (diesel's `ON CONFLICT DO NOTHING` there updates the row, which MySQL
/// counts as found), where the statement alone is undone, not the transaction.
pub(super) fn unless_duplicate(inserted: QueryResult<usize>) -> QueryResult<usize> {
    match inserted {
        Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(0),
        other => other,
    }
}

/// A time bound as UTC text of the one shape (`YYYY-MM-DD HH:MM:SS.SSS`), for a time column:
/// PostgreSQL reads it as UTC whatever the session's time zone, MySQL casts it to its
/// `DATETIME(3)`, SQLite stores the text.
#[derive(Debug, Clone, QueryId)]
pub(crate) struct TimeBind(<String as AsExpression<Text>>::Expression);

/// `text` (UTC, the one shape) bound for a time column.
pub(crate) fn time_bind(text: &str) -> TimeBind {
    TimeBind(AsExpression::<Text>::as_expression(text.to_owned()))
}

dialect_expression!(TimeBind, Timestamp);

#[cfg(feature = "postgres")]
spelled!(Pg, TimeBind, 0, "", "::timestamp AT TIME ZONE 'UTC'");
#[cfg(feature = "sqlite")]
spelled!(Sqlite, TimeBind, 0, "", "");
#[cfg(feature = "mysql")]
spelled!(Mysql, TimeBind, 0, "CAST(", " AS DATETIME(3))");
