//! Lists bound one parameter per item (`IN (?, ?, …)`): MySQL has no `json_each`, and a
//! list of binds lets the optimizer read an index range per item.

use diesel::mysql::Mysql;
use diesel::sql_types::{BigInt, Text};

use crate::sql::Statement;

/// Appends `(?, ?, …)` binding each of `values` as `ST`; `(NULL)`, which matches nothing,
/// for none.
fn binds<ST, T>(mut statement: Statement<Mysql>, values: &[T]) -> Statement<Mysql>
where
    ST: diesel::sql_types::SqlType + diesel::sql_types::SingleValue,
    Mysql: diesel::sql_types::HasSqlType<ST>,
    T: Clone + diesel::expression::AsExpression<ST>,
    T::Expression: diesel::query_builder::QueryFragment<Mysql> + Send + 'static,
{
    if values.is_empty() {
        return statement.sql("(NULL)");
    }
    for (i, value) in values.iter().enumerate() {
        statement = statement
            .sql(if i == 0 { "(" } else { ", " })
            .bind::<ST, _>(value.clone());
    }
    statement.sql(")")
}

/// Appends `(?, ?, …)` binding each id; `(NULL)` for none.
pub(super) fn ids(statement: Statement<Mysql>, ids: &[i64]) -> Statement<Mysql> {
    binds::<BigInt, _>(statement, ids)
}

/// Appends `(?, ?, …)` binding each text; `(NULL)` for none.
pub(super) fn texts(statement: Statement<Mysql>, texts: &[String]) -> Statement<Mysql> {
    binds::<Text, _>(statement, texts)
}

/// Appends `((?, ?), (?, ?), …)` binding each `(keyword, biz_id)`; `((NULL, NULL))` for none.
pub(super) fn keys(mut statement: Statement<Mysql>, keys: &[(String, String)]) -> Statement<Mysql> {
    if keys.is_empty() {
        return statement.sql("((NULL, NULL))");
    }
    for (i, (keyword, biz_id)) in keys.iter().enumerate() {
        statement = statement
            .sql(if i == 0 { "((" } else { ", (" })
            .bind::<Text, _>(keyword.clone())
            .sql(", ")
            .bind::<Text, _>(biz_id.clone())
            .sql(")");
    }
    statement.sql(")")
}

/// Appends `((?, ?), …)` binding each `(id, claim_token)`.
pub(super) fn pairs(mut statement: Statement<Mysql>, pairs: &[(i64, i64)]) -> Statement<Mysql> {
    if pairs.is_empty() {
        return statement.sql("((NULL, NULL))");
    }
    for (i, (a, b)) in pairs.iter().enumerate() {
        statement = statement
            .sql(if i == 0 { "((" } else { ", (" })
            .bind::<BigInt, _>(*a)
            .sql(", ")
            .bind::<BigInt, _>(*b)
            .sql(")");
    }
    statement.sql(")")
}
