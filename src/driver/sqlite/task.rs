//! Task statements on SQLite: claim, completion, failure, release, rescue.

use diesel::sql_types::{BigInt, Text};
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{OptionalExtension, QueryResult, RunQueryDsl};

use super::fair::page_ids;
use crate::driver::fair_sql::{
    choose_page, first_due, first_suspect, shares_statement, suspects_exist as suspects, DueList,
    FairSql, Found,
};
use crate::driver::ring_sql::Share;
use crate::driver::{
    fence, lapsed, rescue_params, Claim, ClaimRow, Claiming, Due, Pick, Picked, RescueParams,
    RescuedRow,
};
use crate::sql::Statement;

pub(in crate::driver) fn claim_page(
    conn: &mut SqliteConnection,
    claim: &Claiming<'_>,
    pick: &Pick<'_>,
) -> QueryResult<Picked> {
    let due = DueList::<Sqlite>::of(claim.due);
    let (owner, limit, timeout_ms) = (claim.owner, claim.limit, claim.timeout_ms);
    // The node's tasks that finished since its last claim leave the lease index first
    // (see `async_task_lease_idx`): one statement for the page, in the claim's
    // transaction, instead of an index write at every completion.
    conn.immediate_transaction(|conn| {
        Statement::<Sqlite>::new(
            "UPDATE async_task SET deadline_at = NULL
             WHERE owner = ",
        )
        .bind::<BigInt, _>(owner)
        .sql(" AND deadline_at IS NOT NULL AND state <> 'running'")
        .execute(conn)?;
        let shared = |conn: &mut SqliteConnection, shares: &[Share]| {
            page_ids(claim_set("", owner, timeout_ms), shares, &due, limit)
                .sql(CLAIM_RETURNING)
                .load(conn)
        };
        choose_page(
            conn,
            claim,
            pick,
            &due,
            |conn, tenant| match tenant {
                None => claim_statement("", owner, &due, limit, timeout_ms).load(conn),
                Some(tenant) => shared(conn, &[Share::of(tenant)]),
            },
            shared,
        )
    })
}

pub(in crate::driver) fn claim_plan(
    conn: &mut SqliteConnection,
    due: &Due<'_>,
    limit: i64,
) -> QueryResult<Vec<String>> {
    #[derive(diesel::QueryableByName)]
    struct Line {
        #[diesel(sql_type = Text)]
        detail: String,
    }
    let due = DueList::of(due);
    let mut lines: Vec<Line> =
        shares_statement("EXPLAIN QUERY PLAN ", &due, None, ("", ""), limit).load(conn)?;
    lines.extend(claim_statement("EXPLAIN QUERY PLAN ", 0, &due, limit, 0).load::<Line>(conn)?);
    Ok(lines.into_iter().map(|l| l.detail).collect())
}

pub(in crate::driver) fn complete(
    conn: &mut SqliteConnection,
    claim: &Claim,
) -> QueryResult<usize> {
    let set = concat!(
        "UPDATE async_task SET state = 'done', finished_at = ",
        now!(),
        ", updated_at = ",
        now!()
    );
    fence(Statement::new(set), claim).execute(conn)
}

pub(in crate::driver) fn complete_many(
    conn: &mut SqliteConnection,
    owner: i64,
    claims: &[(i64, i64)],
) -> QueryResult<usize> {
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
    .execute(conn)
}

pub(in crate::driver) fn rescue_many(
    conn: &mut SqliteConnection,
    rescue: &RescueParams,
) -> QueryResult<Vec<RescuedRow>> {
    // SQLite runs one writer at a time, so the WHERE clause is evaluated under the write
    // lock and two rescuers cannot both take a task. In SET, column references read the
    // row as it was before this UPDATE. Running tasks are read through the lease index
    // (`deadline_at IS NOT NULL`); first, the finished tasks still in it (those of nodes
    // that have not claimed since) leave it, so that it stays about as small as the
    // number of running tasks.
    conn.immediate_transaction(|conn| {
        Statement::<Sqlite>::new(
            "UPDATE async_task SET deadline_at = NULL
             WHERE deadline_at IS NOT NULL AND state <> 'running'",
        )
        .execute(conn)?;
        rescue_statement(rescue).load(conn)
    })
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
                                  ELSE datetime('now', 'subsec', printf('+%.3f seconds',
                                       min(min((SELECT base_ms FROM params) * (1 << min(failures, 40)),
                                               (SELECT max_ms FROM params))
                                           * (1 - (SELECT jitter FROM params)
                                              + 2 * (SELECT jitter FROM params)
                                                  * (random() / 18446744073709551616.0 + 0.5)),
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
                    suspect = suspect + CASE WHEN deadline_at < ",
                now!(),
                " THEN 0 ELSE 1 END,
                    deadline_at = NULL,
                    updated_at = ",
                now!(),
                "
                WHERE deadline_at IS NOT NULL AND state = 'running' AND "
            ))
    .with(|s| lapsed(s, ("deadline_at", "async_task.owner"), rescue))
    .with(|s| match rescue.only {
        Some(only) => s.sql(" AND id = ").bind::<BigInt, _>(only),
        None => s,
    })
    .sql(" RETURNING id, state, last_error AS reason, keyword, biz_id, tenant")
}

/// See [`crate::driver::Driver::task_rescue_dying`]: none. Rescue runs under SQLite's one
/// write lock and waits for no row, so it charges every lapsed task in one statement.
pub(in crate::driver) fn rescue_dying(
    _conn: &mut SqliteConnection,
    _rescue: &RescueParams,
) -> QueryResult<Vec<i64>> {
    Ok(Vec::new())
}

/// The claim of tasks without a tenant due for `due`, after `prefix` (empty, or `EXPLAIN
/// QUERY PLAN` to show its plan).
fn claim_statement(
    prefix: &'static str,
    owner: i64,
    due: &DueList<Sqlite>,
    limit: i64,
    timeout_ms: i64,
) -> Statement<Sqlite> {
    // A single UPDATE takes SQLite's write lock before it reads, so two claimers are
    // serialised by the lock (waiting out the busy timeout) and never see the same row
    // pending. The keyword list is one JSON bind. INDEXED BY: left to itself, the planner
    // serves `keyword IN (…)` from the unique (keyword, biz_id) index and sorts every task
    // of those keywords, done ones included, on every claim.
    first_due(
        claim_set(prefix, owner, timeout_ms).sql("SELECT id FROM "),
        None,
        due,
        limit,
    )
    .sql(CLAIM_RETURNING)
}

/// `UPDATE async_task SET` (claimed by `owner`, deadline `timeout_ms` from now) `WHERE id IN
/// (`, left open for the ids' SELECT and then [`CLAIM_RETURNING`].
fn claim_set(prefix: &'static str, owner: i64, timeout_ms: i64) -> Statement<Sqlite> {
    Statement::<Sqlite>::new(prefix)
        .sql("UPDATE async_task SET state = 'running', owner = ")
        .bind::<BigInt, _>(owner)
        // The times are uncorrelated scalar subqueries: SQLite computes each once per
        // statement, not once per claimed row.
        .sql(concat!(
            ", claim_token = claim_token + 1, claimed_at = (SELECT ",
            now!(),
            "), updated_at = (SELECT ",
            now!(),
            "), deadline_at = (SELECT datetime('now', 'subsec', printf('+%.3f seconds', "
        ))
        .bind::<BigInt, _>(timeout_ms)
        .sql(" / 1000.0))) WHERE id IN (")
}

/// The end of a claim statement begun by [`claim_set`].
const CLAIM_RETURNING: &str = ")
            RETURNING id, keyword, biz_id, biz_data, tenant, failures, max_attempts, claim_token, priority";

/// See [`crate::driver::Driver::task_claim_limited`]. In one write transaction, whose lock,
/// taken before it reads, makes the running counts exact: for each tenant in turn, its room
/// (its limit less what runs) and then at most that many of its first due tasks by the
/// tenant index, until the page is full. (SQLite uses a partial index only when the query
/// repeats its predicate's terms: `state = 'pending'` alone does not imply the index's `state
/// IN (…)`.)
pub(in crate::driver) fn claim_limited(
    conn: &mut SqliteConnection,
    claim: &Claiming<'_>,
    tenants: &[String],
) -> QueryResult<Picked> {
    #[derive(diesel::QueryableByName)]
    struct Room {
        #[diesel(sql_type = BigInt)]
        room: i64,
    }
    let due = DueList::<Sqlite>::of(claim.due);
    let (owner, limit, timeout_ms) = (claim.owner, claim.limit, claim.timeout_ms);
    conn.immediate_transaction(|conn| {
        let mut page = Vec::new();
        for tenant in tenants {
            let left = limit - i64::try_from(page.len()).unwrap_or(i64::MAX);
            if left <= 0 {
                break;
            }
            let room: Option<Room> = Statement::<Sqlite>::new(
                "SELECT max_running - (SELECT count(*) FROM async_task r
                                        WHERE r.tenant = a.tenant AND r.state = 'running'
                                          AND r.state IN ('pending', 'blocked', 'running')) AS room
                   FROM async_tenant a WHERE a.max_running IS NOT NULL AND a.tenant = ",
            )
            .bind::<Text, _>(tenant.clone())
            .get_result(conn)
            .optional()?;
            let take = room.map_or(0, |r| r.room).min(left);
            if take <= 0 {
                continue;
            }
            let statement = claim_set("", owner, timeout_ms).sql("SELECT id FROM ");
            let rows: Vec<ClaimRow> = first_due(statement, Some(tenant), &due, take)
                .sql(CLAIM_RETURNING)
                .load(conn)?;
            page.extend(rows);
        }
        Ok(Picked::of(page))
    })
}

/// See [`crate::driver::Driver::task_claim_suspect`]: the suspect index's first due task, in
/// claim order, stamped as any claim.
pub(in crate::driver) fn claim_suspect(
    conn: &mut SqliteConnection,
    owner: i64,
    due: &Due<'_>,
    except: &[String],
    timeout_ms: i64,
) -> QueryResult<Picked> {
    let due = DueList::of(&Due {
        suspect: Some(true),
        ..*due
    });
    let except = (!except.is_empty()).then(|| Sqlite::list(except));
    let statement = claim_set("", owner, timeout_ms).sql("SELECT id FROM ");
    first_suspect(statement, except.as_ref(), &due)
        .sql(CLAIM_RETURNING)
        .load(conn)
        .map(Picked::of)
}

/// See [`crate::driver::Driver::task_suspects_exist`].
pub(in crate::driver) fn suspects_exist(conn: &mut SqliteConnection) -> QueryResult<bool> {
    Ok(suspects::<Sqlite>().get_result::<Found>(conn)?.found())
}
