//! The driver on SQLite: one writer at a time, so the claim needs no `SKIP LOCKED`; times
//! are text written by SQLite's own clock.

use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Integer, Nullable, SmallInt, Text, Untyped};
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{Connection, QueryResult, RunQueryDsl};

use super::{
    fence, rescue_params, Claim, ClaimRow, Driver, InsertRow, KeywordStateCount, RescueParams,
    RescuedRow, TaskKey,
};
use crate::sql::Statement;

// Every time column is written with this expression (millisecond precision, UTC), so that
// times compare correctly as text. The migration's column defaults use the same.
macro_rules! now {
    () => {
        "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    };
}

impl Driver for SqliteConnection {
    fn task_insert_many(&mut self, rows: &[InsertRow<'_>]) -> QueryResult<Vec<TaskKey>> {
        // Bind parameters rather than one JSON document as on PostgreSQL: SQLite would parse
        // each row's JSON object again for every field it reads (a sixth of an enqueue's
        // time, measured). Statements of INSERT_CHUNK rows, then of powers of two for the
        // rest, so that a connection caches at most eighteen prepared statements (nine
        // sizes, two shapes: see `insert_statement`) and a bulk enqueue parses no SQL;
        // several statements run in one transaction (a savepoint inside the caller's), so
        // the batch stays all or nothing.
        if rows.len() <= INSERT_CHUNK && rows.len().is_power_of_two() {
            return insert_chunks(self, rows); // one statement
        }
        self.transaction(|conn| insert_chunks(conn, rows))
    }

    fn task_find_many(&mut self, keys_json: &str) -> QueryResult<Vec<TaskKey>> {
        Statement::<Sqlite>::new(
            "SELECT id, keyword, biz_id FROM async_task
             WHERE (keyword, biz_id) IN (SELECT value ->> 'k', value ->> 'b' FROM json_each(",
        )
        .bind::<Text, _>(keys_json.to_owned())
        .sql("))")
        .load(self)
    }

    fn task_claim_page(
        &mut self,
        owner: i64,
        keywords: &[String],
        limit: i64,
        timeout_ms: i64,
    ) -> QueryResult<Vec<ClaimRow>> {
        // The node's tasks that finished since its last claim leave the lease index first
        // (see `async_task_lease_idx`): one statement for the page, in the claim's
        // transaction, instead of an index write at every completion.
        self.immediate_transaction(|conn| {
            Statement::<Sqlite>::new(
                "UPDATE async_task SET deadline_at = NULL
                 WHERE owner = ",
            )
            .bind::<BigInt, _>(owner)
            .sql(" AND deadline_at IS NOT NULL AND state <> 'running'")
            .execute(conn)?;
            claim_statement("", owner, keywords, limit, timeout_ms).load(conn)
        })
    }

    fn task_claim_plan(&mut self, keywords: &[String], limit: i64) -> QueryResult<Vec<String>> {
        #[derive(diesel::QueryableByName)]
        struct Line {
            #[diesel(sql_type = Text)]
            detail: String,
        }
        let lines: Vec<Line> =
            claim_statement("EXPLAIN QUERY PLAN ", 0, keywords, limit, 0).load(self)?;
        Ok(lines.into_iter().map(|l| l.detail).collect())
    }

    fn task_complete(&mut self, claim: &Claim) -> QueryResult<usize> {
        let set = concat!(
            "UPDATE async_task SET state = 'done', finished_at = ",
            now!(),
            ", updated_at = ",
            now!()
        );
        fence(Statement::new(set), claim).execute(self)
    }

    fn task_complete_many(&mut self, owner: i64, claims: &[(i64, i64)]) -> QueryResult<usize> {
        let claims_json = serde_json::to_string(claims).expect("integers serialise");
        Statement::<Sqlite>::new(concat!(
            "UPDATE async_task SET state = 'done', finished_at = ",
            now!(),
            ", updated_at = ",
            now!(),
            " WHERE state = 'running' AND owner = "
        ))
        .bind::<BigInt, _>(owner)
        .sql(
            " AND (id, claim_token) IN
               (SELECT value ->> 0, value ->> 1 FROM json_each(",
        )
        .bind::<Text, _>(claims_json)
        .sql("))")
        .execute(self)
    }

    fn task_fail_retry(&mut self, claim: &Claim, error: &str, delay_ms: i64) -> QueryResult<usize> {
        let set = Statement::<Sqlite>::new(
            "UPDATE async_task SET state = 'pending', owner = NULL, deadline_at = NULL, failures = failures + 1, last_error = ",
        )
        .bind::<Text, _>(error.to_owned())
        .sql(", run_at = strftime('%Y-%m-%d %H:%M:%f', 'now', printf('+%.3f seconds', ")
        .bind::<BigInt, _>(delay_ms)
        .sql(concat!(" / 1000.0)), updated_at = ", now!()));
        fence(set, claim).execute(self)
    }

    fn task_fail_dead(&mut self, claim: &Claim, error: &str) -> QueryResult<usize> {
        let set = Statement::<Sqlite>::new(
            "UPDATE async_task SET state = 'dead', deadline_at = NULL, failures = failures + 1, last_error = ",
        )
        .bind::<Text, _>(error.to_owned())
        .sql(concat!(
            ", finished_at = ",
            now!(),
            ", updated_at = ",
            now!()
        ));
        fence(set, claim).execute(self)
    }

    fn task_release(&mut self, claim: &Claim, note: Option<&str>) -> QueryResult<usize> {
        let set = Statement::<Sqlite>::new(concat!(
            "UPDATE async_task SET state = 'pending', owner = NULL, deadline_at = NULL, updated_at = ",
            now!(),
            ", last_error = COALESCE("
        ))
        .bind::<Nullable<Text>, _>(note.map(str::to_owned))
        .sql(", last_error)");
        fence(set, claim).execute(self)
    }

    fn task_rescue_many(&mut self, rescue: &RescueParams) -> QueryResult<Vec<RescuedRow>> {
        // SQLite runs one writer at a time, so the WHERE clause is evaluated under the write
        // lock and two rescuers cannot both take a task. In SET, column references read the
        // row as it was before this UPDATE. Running tasks are read through the lease index
        // (`deadline_at IS NOT NULL`); first, the finished tasks still in it (those of nodes
        // that have not claimed since) leave it, so that it stays about as small as the
        // number of running tasks.
        self.immediate_transaction(|conn| {
            Statement::<Sqlite>::new(
                "UPDATE async_task SET deadline_at = NULL
                 WHERE deadline_at IS NOT NULL AND state <> 'running'",
            )
            .execute(conn)?;
            rescue_statement(rescue).load(conn)
        })
    }

    fn task_count_by_keyword_state(&mut self) -> QueryResult<Vec<KeywordStateCount>> {
        Statement::<Sqlite>::new(concat!(
            "SELECT keyword, state, count(*) AS count,
                    (julianday('now') - julianday(min(CASE WHEN state = 'pending' AND run_at <= ",
            now!(),
            " THEN run_at END))) * 86400.0 AS oldest_due_secs
             FROM async_task GROUP BY keyword, state ORDER BY keyword, state"
        ))
        .load(self)
    }

    fn node_register(&mut self, name: &str) -> QueryResult<i64> {
        #[derive(diesel::QueryableByName)]
        struct Id {
            #[diesel(sql_type = BigInt)]
            id: i64,
        }
        let row: Id = Statement::<Sqlite>::new("INSERT INTO async_node (name) VALUES (")
            .bind::<Text, _>(name.to_owned())
            .sql(") RETURNING id")
            .get_result(self)?;
        Ok(row.id)
    }

    fn node_heartbeat(&mut self, node_id: i64) -> QueryResult<usize> {
        Statement::<Sqlite>::new(concat!(
            "UPDATE async_node SET heartbeat_at = ",
            now!(),
            ", state = 'alive' WHERE id = "
        ))
        .bind::<BigInt, _>(node_id)
        .execute(self)
    }

    fn node_mark_gone(&mut self, node_id: i64) -> QueryResult<usize> {
        Statement::<Sqlite>::new(concat!(
            "UPDATE async_node SET state = 'gone', heartbeat_at = ",
            now!(),
            " WHERE id = "
        ))
        .bind::<BigInt, _>(node_id)
        .execute(self)
    }
}

/// The rescue: one UPDATE that re-checks its conditions in its WHERE clause.
fn rescue_statement(rescue: &RescueParams) -> Statement<Sqlite> {
    rescue_params(rescue).sql(concat!(
                "
                UPDATE async_task SET
                    failures = failures + 1,
                    state = CASE WHEN failures + 1 >= COALESCE(max_attempts, (SELECT default_max FROM params))
                                 THEN 'dead' ELSE 'pending' END,
                    run_at = CASE WHEN failures + 1 >= COALESCE(max_attempts, (SELECT default_max FROM params))
                                  THEN run_at
                                  ELSE strftime('%Y-%m-%d %H:%M:%f', 'now', printf('+%.3f seconds',
                                       min((SELECT base_ms FROM params) * (1 << min(failures, 40)),
                                           (SELECT max_ms FROM params)) / 1000.0)) END,
                    finished_at = CASE WHEN failures + 1 >= COALESCE(max_attempts, (SELECT default_max FROM params))
                                       THEN ",
                now!(),
                " END,
                    owner = CASE WHEN failures + 1 >= COALESCE(max_attempts, (SELECT default_max FROM params))
                                 THEN owner END,
                    last_error = 'rescued from node ' || COALESCE(owner, '(none)') || ': ' ||
                                 CASE WHEN deadline_at < ",
                now!(),
                " THEN 'running past its deadline' ELSE 'the node stopped heartbeating' END,
                    deadline_at = NULL,
                    updated_at = ",
                now!(),
                "
                WHERE deadline_at IS NOT NULL AND state = 'running'
                  AND (deadline_at < ",
                now!(),
                " OR NOT EXISTS (SELECT 1 FROM async_node n
                                  WHERE n.id = async_task.owner AND n.state = 'alive'
                                    AND n.heartbeat_at >= strftime('%Y-%m-%d %H:%M:%f', 'now',
                                        printf('-%.3f seconds', (SELECT dead_ms FROM params) / 1000.0))))
                RETURNING id, state, last_error AS reason"
            ))
}

/// The claim statement, after `prefix` (empty, or `EXPLAIN QUERY PLAN` to show its plan).
fn claim_statement(
    prefix: &'static str,
    owner: i64,
    keywords: &[String],
    limit: i64,
    timeout_ms: i64,
) -> Statement<Sqlite> {
    // A single UPDATE takes SQLite's write lock before it reads, so two claimers are
    // serialised by the lock (waiting out the busy timeout) and never see the same row
    // pending. The keyword list is one JSON bind. INDEXED BY: left to itself, the planner
    // serves `keyword IN (…)` from the unique (keyword, biz_id) index and sorts every task
    // of those keywords, done ones included, on every claim.
    let keywords = serde_json::to_string(keywords).expect("a list of strings serialises");
    Statement::<Sqlite>::new(prefix)
        .sql("UPDATE async_task SET state = 'running', owner = ")
        .bind::<BigInt, _>(owner)
        // The times are uncorrelated scalar subqueries: SQLite computes each once per
        // statement, not once per claimed row (a tenth of a claim's time otherwise).
        .sql(concat!(
            ", claim_token = claim_token + 1, claimed_at = (SELECT ",
            now!(),
            "), updated_at = (SELECT ",
            now!(),
            "), deadline_at = (SELECT strftime('%Y-%m-%d %H:%M:%f', 'now', printf('+%.3f seconds', "
        ))
        .bind::<BigInt, _>(timeout_ms)
        .sql(concat!(
            " / 1000.0))) WHERE id IN (
                SELECT id FROM async_task INDEXED BY async_task_claim_idx
                WHERE state = 'pending' AND run_at <= ",
            now!(),
            " AND keyword IN (SELECT value FROM json_each("
        ))
        .bind::<Text, _>(keywords)
        .sql(
            "))
                ORDER BY priority, run_at, id
                LIMIT ",
        )
        .bind::<BigInt, _>(limit)
        .sql(
            ")
            RETURNING id, keyword, biz_id, biz_data, tenant, failures, max_attempts, claim_token, priority",
        )
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
/// bulk enqueue's allocations were a tenth of its time).
///
/// Rows that share their tenant, priority, max attempts and delay (a bulk enqueue, usually)
/// bind those once, with `run_at` computed once per statement: three parameters per row
/// instead of seven (measured at the SQL level: 0.81 → 0.97 of a plain literal INSERT).
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
    out.push_sql("strftime('%Y-%m-%d %H:%M:%f', julianday('now') + ");
    out.push_bind_param::<BigInt, _>(&row.ms)?;
    out.push_sql(" / 86400000.0)");
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
