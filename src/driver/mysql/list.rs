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

/// Appends `(…), (…), …`: each of `items` a row in parentheses that `row` appends (the rows
/// of `VALUES`, or the items of a list of tuples); nothing for none.
pub(super) fn rows<T>(
    mut statement: Statement<Mysql>,
    items: impl IntoIterator<Item = T>,
    row: impl Fn(Statement<Mysql>, T) -> Statement<Mysql>,
) -> Statement<Mysql> {
    for (i, item) in items.into_iter().enumerate() {
        statement = row(statement.sql(if i == 0 { "(" } else { ", (" }), item).sql(")");
    }
    statement
}

/// Appends `((…), …)`, each of `pairs` a row that `row` appends; `((NULL, NULL))`, which
/// matches nothing, for none.
fn pair_list<T>(
    statement: Statement<Mysql>,
    pairs: &[T],
    row: impl Fn(Statement<Mysql>, &T) -> Statement<Mysql>,
) -> Statement<Mysql> {
    if pairs.is_empty() {
        return statement.sql("((NULL, NULL))");
    }
    rows(statement.sql("("), pairs, row).sql(")")
}

/// Appends `((?, ?), (?, ?), …)` binding each `(keyword, biz_id)`; `((NULL, NULL))` for none.
pub(super) fn keys(statement: Statement<Mysql>, keys: &[(String, String)]) -> Statement<Mysql> {
    pair_list(statement, keys, |s, (keyword, biz_id)| {
        s.bind::<Text, _>(keyword.clone())
            .sql(", ")
            .bind::<Text, _>(biz_id.clone())
    })
}

/// Appends `((?, ?), …)` binding each `(id, claim_token)`; `((NULL, NULL))` for none.
pub(super) fn pairs(statement: Statement<Mysql>, pairs: &[(i64, i64)]) -> Statement<Mysql> {
    pair_list(statement, pairs, |s, &(a, b)| {
        s.bind::<BigInt, _>(a).sql(", ").bind::<BigInt, _>(b)
    })
}
