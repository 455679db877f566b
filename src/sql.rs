//! Raw SQL statements whose prepared statements diesel caches.
//!
//! `diesel::sql_query` marks itself unsafe to cache, so every execution prepares the
//! statement again (on PostgreSQL, one more round trip). The engine's hot statements (claim,
//! completion) are fixed SQL with typed binds, so they are built here instead: text pieces and
//! bind parameters, which diesel caches by SQL text and bind types like its own DSL queries.

use diesel::backend::Backend;
use diesel::expression::AsExpression;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{HasSqlType, Untyped};
use diesel::QueryResult;

enum Piece<DB: Backend> {
    Text(&'static str),
    Bind(Box<dyn QueryFragment<DB> + Send>),
}

/// A statement: SQL text with bind parameters in between, for one backend.
///
/// Placeholders are written by diesel (`$n` on PostgreSQL, `?` on SQLite), so the text never
/// contains them: `Statement::new("… WHERE id = ").bind::<BigInt, _>(id).sql(" AND …")`.
pub(crate) struct Statement<DB: Backend> {
    pieces: Vec<Piece<DB>>,
}

impl<DB: Backend> Statement<DB> {
    pub(crate) fn new(sql: &'static str) -> Self {
        Statement {
            pieces: vec![Piece::Text(sql)],
        }
    }

    /// Appends SQL text.
    pub(crate) fn sql(mut self, sql: &'static str) -> Self {
        self.pieces.push(Piece::Text(sql));
        self
    }

    /// Passes the statement through `f`: a piece built by a function, inside a chain.
    pub(crate) fn with(self, f: impl FnOnce(Self) -> Self) -> Self {
        f(self)
    }

    /// Appends an expression of the query builder (the database clock, …).
    pub(crate) fn expr(mut self, expression: impl QueryFragment<DB> + Send + 'static) -> Self {
        self.pieces.push(Piece::Bind(Box::new(expression)));
        self
    }

    /// Appends a bind parameter of SQL type `ST`.
    pub(crate) fn bind<ST, V>(mut self, value: V) -> Self
    where
        DB: HasSqlType<ST>,
        V: AsExpression<ST>,
        V::Expression: QueryFragment<DB> + Send + 'static,
        ST: diesel::sql_types::SqlType + diesel::sql_types::SingleValue,
    {
        self.pieces
            .push(Piece::Bind(Box::new(value.as_expression())));
        self
    }
}

impl<DB: Backend> QueryFragment<DB> for Statement<DB> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        for piece in &self.pieces {
            match piece {
                Piece::Text(sql) => out.push_sql(sql),
                Piece::Bind(bind) => bind.walk_ast(out.reborrow())?,
            }
        }
        Ok(())
    }
}

impl<DB: Backend> QueryId for Statement<DB> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB: Backend> Query for Statement<DB> {
    type SqlType = Untyped;
}

impl<DB: Backend, Conn> diesel::RunQueryDsl<Conn> for Statement<DB> {}
