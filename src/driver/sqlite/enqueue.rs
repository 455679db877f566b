//! Enqueue on SQLite: rows bound as parameters, in statements of fixed sizes.

use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Integer, Nullable, SmallInt, Text, Untyped};
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{Connection, QueryResult, RunQueryDsl};

use crate::db::transaction::depth_of;
use crate::driver::{InsertRow, TaskKey};
use crate::sql::Statement;

pub(in crate::driver) fn insert_many(
    conn: &mut SqliteConnection,
    rows: &[InsertRow<'_>],
) -> QueryResult<Vec<TaskKey>> {
    // Bind parameters rather than one JSON document as on PostgreSQL: SQLite would parse
    // each row's JSON object again for every field it reads (docs/notes/performance.md).
    // Statements of INSERT_CHUNK rows, then of powers of two for the
    // rest, so that a connection caches at most eighteen prepared statements (nine
    // sizes, two shapes: see `insert_statement`) and a bulk enqueue parses no SQL;
    // several statements run in one transaction (a savepoint inside the caller's, or an
    // IMMEDIATE transaction when the caller has none open: a deferred one could meet a
    // writer of another process between its statements), so the batch stays all or nothing.
    if rows.len() <= INSERT_CHUNK && rows.len().is_power_of_two() {
        return insert_chunks(conn, rows); // one statement
    }
    if depth_of(conn) == Some(0) {
        conn.immediate_transaction(|conn| insert_chunks(conn, rows))
    } else {
        conn.transaction(|conn| insert_chunks(conn, rows))
    }
}

/// Links children to parents: see [`crate::driver::Driver::task_link_parents`].
pub(in crate::driver) fn link_parents(
    conn: &mut SqliteConnection,
    links: &[(i64, i64)],
) -> QueryResult<usize> {
    let json = serde_json::to_string(links).expect("links serialise");
    Statement::<Sqlite>::new(
        "INSERT INTO async_task_parent (child_id, parent_id)
         SELECT value ->> 0, value ->> 1 FROM json_each(",
    )
    .bind::<Text, _>(json)
    .sql(") WHERE true ON CONFLICT DO NOTHING")
    .execute(conn)
}

pub(in crate::driver) fn find_many(
    conn: &mut SqliteConnection,
    keys_json: &str,
) -> QueryResult<Vec<TaskKey>> {
    Statement::<Sqlite>::new(
        "SELECT id, keyword, biz_id FROM async_task
         WHERE (keyword, biz_id) IN (SELECT value ->> 'k', value ->> 'b' FROM json_each(",
    )
    .bind::<Text, _>(keys_json.to_owned())
    .sql("))")
    .load(conn)
}

/// Rows per enqueue statement on SQLite (3 or 7 bind parameters each).
const INSERT_CHUNK: usize = 256;

fn insert_chunks(
    conn: &mut SqliteConnection,
    mut rows: &[InsertRow<'_>],
) -> QueryResult<Vec<TaskKey>> {
    let mut created = Vec::with_capacity(rows.len());
    while !rows.is_empty() {
        let n = if rows.len() >= INSERT_CHUNK {
            INSERT_CHUNK
        } else {
            1 << rows.len().ilog2()
        };
        let (chunk, rest) = rows.split_at(n);
        created.extend(insert_statement(chunk).load::<TaskKey>(conn)?);
        rows = rest;
    }
    Ok(created)
}

/// One enqueue statement over `rows`, binding the rows' own text in place (no copies: a
/// bulk enqueue's allocations were a cost of their own).
///
/// Rows that share their tenant, priority, max attempts and delay (a bulk enqueue, usually)
/// bind those once, with `run_at` computed once per statement: three parameters per row
/// instead of seven (docs/notes/performance.md).
/// Otherwise each row binds all seven. `WHERE true` tells the parser that `ON CONFLICT`
/// belongs to the INSERT, not to the SELECT's join.
struct InsertStatement<'r, 'a> {
    rows: &'r [InsertRow<'a>],
    /// Whether every row has the first row's options.
    uniform: bool,
}

fn insert_statement<'r, 'a>(rows: &'r [InsertRow<'a>]) -> InsertStatement<'r, 'a> {
    // One row binds its options once either way: it takes the plain shape.
    let uniform = rows.len() > 1
        && rows.split_first().is_some_and(|(first, rest)| {
            rest.iter()
                .all(|row| (row.t, row.p, row.m, row.ms) == (first.t, first.p, first.m, first.ms))
        });
    InsertStatement { rows, uniform }
}

impl QueryFragment<Sqlite> for InsertStatement<'_, '_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        out.push_sql(
            "INSERT INTO async_task (keyword, biz_id, biz_data, tenant, priority, max_attempts, run_at) ",
        );
        if let (true, Some(shared)) = (self.uniform, self.rows.first()) {
            out.push_sql("SELECT column1, column2, column3, ");
            push_options(shared, out.reborrow())?;
            // A scalar subquery: computed once per statement, not per row.
            out.push_sql(", (SELECT ");
            push_run_at(shared, out.reborrow())?;
            out.push_sql(") FROM (VALUES ");
            for (i, row) in self.rows.iter().enumerate() {
                out.push_sql(if i == 0 { "(" } else { ", (" });
                push_key_and_payload(row, out.reborrow())?;
                out.push_sql(")");
            }
            out.push_sql(") WHERE true");
        } else {
            out.push_sql("VALUES ");
            for (i, row) in self.rows.iter().enumerate() {
                out.push_sql(if i == 0 { "(" } else { ", (" });
                push_key_and_payload(row, out.reborrow())?;
                out.push_sql(", ");
                push_options(row, out.reborrow())?;
                out.push_sql(", ");
                push_run_at(row, out.reborrow())?;
                out.push_sql(")");
            }
        }
        out.push_sql(" ON CONFLICT (keyword, biz_id) DO NOTHING RETURNING id, keyword, biz_id");
        Ok(())
    }
}

/// `keyword, biz_id, biz_data` of a row.
fn push_key_and_payload<'b>(
    row: &'b InsertRow<'_>,
    mut out: AstPass<'_, 'b, Sqlite>,
) -> QueryResult<()> {
    out.push_bind_param::<Text, _>(row.k)?;
    out.push_sql(", ");
    out.push_bind_param::<Text, _>(row.b)?;
    out.push_sql(", ");
    out.push_bind_param::<Text, _>(row.d)
}

/// `tenant, priority, max_attempts` of a row.
fn push_options<'b>(row: &'b InsertRow<'_>, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
    out.push_bind_param::<Nullable<Text>, _>(&row.t)?;
    out.push_sql(", ");
    out.push_bind_param::<SmallInt, _>(&row.p)?;
    out.push_sql(", ");
    out.push_bind_param::<Nullable<Integer>, _>(&row.m)
}

/// A row's `run_at`: its delay on the Julian day of the database clock, exact to the
/// millisecond.
fn push_run_at<'b>(row: &'b InsertRow<'_>, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
    out.push_sql("datetime(julianday('now') + ");
    out.push_bind_param::<BigInt, _>(&row.ms)?;
    out.push_sql(" / 86400000.0, 'subsec')");
    Ok(())
}

impl QueryId for InsertStatement<'_, '_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for InsertStatement<'_, '_> {
    type SqlType = Untyped;
}

impl RunQueryDsl<SqliteConnection> for InsertStatement<'_, '_> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn row<'a>(b: &'a str, t: Option<&'a str>, ms: i64) -> InsertRow<'a> {
        InsertRow {
            k: "k",
            b,
            d: "{}",
            t,
            p: 0,
            m: None,
            ms,
        }
    }

    #[test]
    fn rows_that_share_their_options_bind_them_once() {
        let sql = |rows: &[InsertRow<'_>]| {
            let statement = insert_statement(rows);
            let text = diesel::debug_query::<Sqlite, _>(&statement).to_string();
            (statement.uniform, text.contains("SELECT column1"))
        };
        let shared = [row("a", Some("t"), 5), row("b", Some("t"), 5)];
        assert_eq!(sql(&shared), (true, true));
        assert_eq!(
            sql(&shared[..1]),
            (false, false),
            "one row: the plain shape"
        );
        assert_eq!(
            sql(&[row("a", Some("t"), 5), row("b", None, 5)]),
            (false, false)
        );
        assert_eq!(sql(&[row("a", None, 5), row("b", None, 6)]), (false, false));
    }
}
