//! Enqueue on MySQL: idempotent, each row reported created or duplicate.
//!
//! The keys that exist already are read first; the rest are inserted by multi-row plain
//! `INSERT`s, so that a failed CHECK constraint or a trigger's refusal (a tenant over its
//! `max_queued`) is an error as on the other backends (`INSERT IGNORE` would turn the
//! CHECKs into warnings and skip the row). When a concurrent producer committed one of the
//! keys in between (error 1062 for that statement, which InnoDB undoes alone), that chunk
//! is inserted again one row at a time, a duplicate key skipped. (`ON DUPLICATE KEY UPDATE`
//! cannot tell the two apart here: diesel connects with `CLIENT_FOUND_ROWS`, under which a
//! duplicate left unchanged counts as one affected row, as an insert does.) Then the new
//! rows' ids are read back by key: a multi-row insert's ids need not be consecutive.

use std::collections::HashSet;

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Integer, Nullable, SmallInt, Text};
use diesel::{Connection, QueryResult, RunQueryDsl};

use super::list;
use crate::driver::{InsertRow, TaskKey};
use crate::sql::Statement;

/// Rows per INSERT (seven bind parameters each), and keys per lookup.
const INSERT_CHUNK: usize = 500;

pub(in crate::driver) fn insert_many(
    conn: &mut MysqlConnection,
    rows: &[InsertRow<'_>],
) -> QueryResult<Vec<TaskKey>> {
    // A key that repeats inside the batch is created once, by its first row.
    let mut seen = HashSet::new();
    let firsts: Vec<&InsertRow<'_>> = rows.iter().filter(|r| seen.insert((r.k, r.b))).collect();
    // All or nothing: a savepoint inside the caller's transaction, or a transaction.
    conn.transaction(|conn| {
        let mut created: Vec<(String, String)> = Vec::with_capacity(firsts.len());
        for chunk in firsts.chunks(INSERT_CHUNK) {
            let keys: Vec<(String, String)> = chunk
                .iter()
                .map(|r| (r.k.to_owned(), r.b.to_owned()))
                .collect();
            let existing: HashSet<(String, String)> = find_keys(conn, &keys)?
                .into_iter()
                .map(|k| (k.keyword, k.biz_id))
                .collect();
            let fresh: Vec<&InsertRow<'_>> = chunk
                .iter()
                .copied()
                .filter(|r| !existing.contains(&(r.k.to_owned(), r.b.to_owned())))
                .collect();
            if fresh.is_empty() {
                continue;
            }
            match insert_statement(&fresh).execute(conn) {
                Ok(_) => created.extend(fresh.iter().map(|r| (r.k.to_owned(), r.b.to_owned()))),
                Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
                    // Raced by a concurrent producer: row by row.
                    for row in fresh {
                        match insert_statement(&[row]).execute(conn) {
                            Ok(_) => created.push((row.k.to_owned(), row.b.to_owned())),
                            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let mut found = Vec::with_capacity(created.len());
        for chunk in created.chunks(INSERT_CHUNK) {
            found.extend(find_keys(conn, chunk)?);
        }
        Ok(found)
    })
}

/// Links children to parents: see [`crate::driver::Driver::task_link_parents`]. The rows
/// go in as given (parent order), one statement; the trigger `async_task_parent_link` does
/// what a link means, as on the other backends. A link that exists already is left as it is
/// (`ON DUPLICATE KEY UPDATE`, whose row fires no INSERT trigger; not `INSERT IGNORE`, which
/// would pass over a failed CHECK), counted among the rows returned (diesel connects with
/// `CLIENT_FOUND_ROWS`).
pub(in crate::driver) fn link_parents(
    conn: &mut MysqlConnection,
    links: &[(i64, i64)],
) -> QueryResult<usize> {
    if links.is_empty() {
        return Ok(0);
    }
    let statement =
        Statement::<Mysql>::new("INSERT INTO async_task_parent (child_id, parent_id) VALUES ");
    list::rows(statement, links, |s, &(child, parent)| {
        s.bind::<BigInt, _>(child)
            .sql(", ")
            .bind::<BigInt, _>(parent)
    })
    .sql(" ON DUPLICATE KEY UPDATE parent_id = parent_id")
    .execute(conn)
}

pub(in crate::driver) fn find_many(
    conn: &mut MysqlConnection,
    keys_json: &str,
) -> QueryResult<Vec<TaskKey>> {
    #[derive(serde::Deserialize)]
    struct Key {
        k: String,
        b: String,
    }
    let keys: Vec<Key> = serde_json::from_str(keys_json)
        .map_err(|e| Error::QueryBuilderError(format!("task keys: {e}").into()))?;
    let keys: Vec<(String, String)> = keys.into_iter().map(|k| (k.k, k.b)).collect();
    let mut found = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(INSERT_CHUNK) {
        found.extend(find_keys(conn, chunk)?);
    }
    Ok(found)
}

/// The tasks among `keys`, by the unique key's index.
fn find_keys(conn: &mut MysqlConnection, keys: &[(String, String)]) -> QueryResult<Vec<TaskKey>> {
    Statement::<Mysql>::new(
        "SELECT id, keyword, biz_id FROM async_task FORCE INDEX (async_task_key)
          WHERE (keyword, biz_id) IN ",
    )
    .with(|s| list::keys(s, keys))
    .load(conn)
}

/// One plain multi-row INSERT of `rows`, each row's `run_at` its delay after the server's
/// clock, to the millisecond.
fn insert_statement(rows: &[&InsertRow<'_>]) -> Statement<Mysql> {
    let statement = Statement::<Mysql>::new(
        "INSERT INTO async_task (keyword, biz_id, biz_data, tenant, priority, max_attempts, run_at) VALUES ",
    );
    list::rows(statement, rows, |s, row| {
        s.bind::<Text, _>(row.k.to_owned())
            .sql(", ")
            .bind::<Text, _>(row.b.to_owned())
            .sql(", ")
            .bind::<Text, _>(row.d.to_owned())
            .sql(", ")
            .bind::<Nullable<Text>, _>(row.t.map(str::to_owned))
            .sql(", ")
            .bind::<SmallInt, _>(row.p)
            .sql(", ")
            .bind::<Nullable<Integer>, _>(row.m)
            .sql(concat!(", ", now!(), " + INTERVAL "))
            .bind::<BigInt, _>(row.ms)
            .sql(" * 1000 MICROSECOND")
    })
}
