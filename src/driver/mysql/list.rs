//! Lists bound one parameter per item (`IN (?, ?, …)`): MySQL has no `json_each`, and a
//! list of binds lets the optimizer read an index range per item.

use diesel::mysql::Mysql;
use diesel::sql_types::{BigInt, Text};

use crate::sql::Statement;

/// Appends `(?, ?, …)` binding each id; `(NULL)`, which matches nothing, for no ids.
pub(super) fn ids(mut statement: Statement<Mysql>, ids: &[i64]) -> Statement<Mysql> {
    if ids.is_empty() {
        return statement.sql("(NULL)");
    }
    for (i, id) in ids.iter().enumerate() {
        statement = statement
            .sql(if i == 0 { "(" } else { ", " })
            .bind::<BigInt, _>(*id);
    }
    statement.sql(")")
}

/// Appends `(?, ?, …)` binding each text; `(NULL)`, which matches nothing, for none.
pub(super) fn texts(mut statement: Statement<Mysql>, texts: &[String]) -> Statement<Mysql> {
    if texts.is_empty() {
        return statement.sql("(NULL)");
    }
    for (i, text) in texts.iter().enumerate() {
        statement = statement
            .sql(if i == 0 { "(" } else { ", " })
            .bind::<Text, _>(text.clone());
    }
    statement.sql(")")
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
