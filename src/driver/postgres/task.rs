//! Task statements on PostgreSQL: enqueue, claim, completion, failure, release, rescue.

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::{Array, BigInt, Nullable, Text};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use crate::driver::ring_sql::walk;
use crate::driver::rows::{FoundRow, IdRow};
use crate::driver::Passes;
use crate::driver::{
    fence, lapsed, rescue_params, Claim, ClaimRow, Claiming, Due, InsertRow, Pick, Picked,
    RescueParams, RescuedRow, TaskKey,
};
use crate::sql::Statement;

pub(in crate::driver) fn insert_many(
    conn: &mut PgConnection,
    rows: &[InsertRow<'_>],
) -> QueryResult<Vec<TaskKey>> {
    let rows_json = serde_json::to_string(rows).expect("task rows serialise");
    // The notification is sent only if the producer's transaction commits, and only for
    // tasks that are due now: once per keyword of the batch (the scalar subquery runs the
    // `notified` CTE once), not once per row.
    Statement::<Pg>::new(
        "WITH input AS (
            SELECT * FROM jsonb_to_recordset(",
    )
    .bind::<Text, _>(rows_json)
    .sql(
        "::jsonb) AS x(k text, b text, d text, t text, p smallint, m integer, ms bigint)
        ), created AS (
            INSERT INTO async_task (keyword, biz_id, biz_data, tenant, priority, max_attempts, run_at)
            SELECT k, b, d::jsonb, t, p, m, now() + ms * interval '1 millisecond' FROM input
            ON CONFLICT (keyword, biz_id) DO NOTHING
            RETURNING id, keyword, biz_id, run_at
        ), notified AS (
            SELECT pg_notify('outbox_task', k)
            FROM (SELECT DISTINCT keyword AS k FROM created WHERE run_at <= now()) due
        )
        SELECT id, keyword, biz_id, (SELECT count(*) FROM notified) AS notified
        FROM created",
    )
    .load(conn)
}

/// Links children to parents: see [`crate::driver::Driver::task_link_parents`].
pub(in crate::driver) fn link_parents(
    conn: &mut PgConnection,
    links: &[(i64, i64)],
) -> QueryResult<usize> {
    let (children, parents): (Vec<i64>, Vec<i64>) = links.iter().copied().unzip();
    Statement::<Pg>::new(
        "INSERT INTO async_task_parent (child_id, parent_id) SELECT * FROM unnest(",
    )
    .bind::<Array<BigInt>, _>(children)
    .sql("::bigint[], ")
    .bind::<Array<BigInt>, _>(parents)
    .sql("::bigint[]) ON CONFLICT DO NOTHING")
    .execute(conn)
}

pub(in crate::driver) fn find_many(
    conn: &mut PgConnection,
    keys_json: &str,
) -> QueryResult<Vec<TaskKey>> {
    Statement::<Pg>::new(
        "SELECT id, keyword, biz_id FROM async_task
         WHERE (keyword, biz_id) IN (SELECT k, b FROM jsonb_to_recordset(",
    )
    .bind::<Text, _>(keys_json.to_owned())
    .sql("::jsonb) AS x(k text, b text))")
    .load(conn)
}

/// Claims a page for `owner`: see [`crate::driver::Driver::task_claim_page`].
pub(in crate::driver) fn claim_page(
    conn: &mut PgConnection,
    claim: &Claiming<'_>,
    pick: &Pick<'_>,
) -> QueryResult<Picked> {
    let (owner, due, except) = (claim.owner, claim.due, claim.except);
    super::claim_without_jit(conn, "BEGIN", owner, |conn| {
        let rows: Vec<PickedRow> =
            claim_statement("", owner, due, except, pick, claim.limit, claim.timeout_ms)
                .load(conn)?;
        picked(conn, rows, except, pick, claim.limit)
    })
}

/// A claimed (or locked) row with what the claim says beside it.
#[derive(QueryableByName)]
pub(super) struct PickedRow {
    #[diesel(embed)]
    task: ClaimRow,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    crowded: bool,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    weight: i32,
    #[diesel(sql_type = Nullable<Text>)]
    ring_end: Option<String>,
    #[diesel(sql_type = BigInt)]
    ring_len: i64,
    #[diesel(sql_type = Nullable<Array<Nullable<Text>>>)]
    shared: Option<Vec<Option<String>>>,
}

/// What a claim of `pick` took, from its rows; with none, the probe and the ring's end are
/// asked apart (they are columns of the rows).
pub(super) fn picked(
    conn: &mut PgConnection,
    rows: Vec<PickedRow>,
    except: &[String],
    pick: &Pick<'_>,
    limit: i64,
) -> QueryResult<Picked> {
    let (crowded, (ring_end, ring_len), shared) = match (pick, rows.first()) {
        (_, Some(row)) => (
            rows.iter().any(|r| r.crowded),
            (row.ring_end.clone(), row.ring_len),
            row.shared.clone().unwrap_or_default(),
        ),
        (Pick::Solo { tenant, .. }, None) => (
            super::fair::others_pending(conn, *tenant, except)?,
            (None, 0),
            Vec::new(),
        ),
        (Pick::Fair { after, lap, .. }, None) => (
            false,
            super::fair::ring_end(conn, after, lap, limit)?,
            Vec::new(),
        ),
    };
    let mut weights: Vec<(Option<String>, i32)> = rows
        .iter()
        .map(|r| (r.task.tenant.clone(), r.weight))
        .collect();
    weights.sort_unstable();
    weights.dedup();
    Ok(Picked {
        crowded,
        ring_end,
        ring_cut: ring_len >= walk(limit),
        shared,
        weights,
        rows: rows.into_iter().map(|r| r.task).collect(),
        unconfirmed: None,
    })
}

pub(in crate::driver) fn claim_plan(
    conn: &mut PgConnection,
    due: &Due<'_>,
    limit: i64,
) -> QueryResult<Vec<String>> {
    let fair = Pick::Fair {
        after: "",
        lap: "",
        passes: &Passes::default(),
    };
    plan_lines(
        conn,
        claim_statement("EXPLAIN (COSTS OFF) ", 0, due, &[], &fair, limit, 0),
    )
}

/// The lines of an `EXPLAIN` statement's plan.
pub(super) fn plan_lines(
    conn: &mut PgConnection,
    explain: Statement<Pg>,
) -> QueryResult<Vec<String>> {
    #[derive(QueryableByName)]
    struct Line {
        #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
        line: String,
    }
    let lines: Vec<Line> = explain.load(conn)?;
    Ok(lines.into_iter().map(|l| l.line).collect())
}

pub(in crate::driver) fn complete(conn: &mut PgConnection, claim: &Claim) -> QueryResult<usize> {
    // Inside the handler's transaction now() is the transaction's start; the clock is the
    // time it finished.
    let set = "UPDATE async_task SET state = 'done', finished_at = clock_timestamp(), updated_at = clock_timestamp()";
    fence(Statement::new(set), claim).execute(conn)
}

pub(in crate::driver) fn complete_many(
    conn: &mut PgConnection,
    owner: i64,
    claims: &[(i64, i64)],
) -> QueryResult<usize> {
    let (ids, tokens): (Vec<i64>, Vec<i64>) = claims.iter().copied().unzip();
    // One probe per task of the running-task index (owner, id), and each row's token
    // looked up by its position in the chunk: no join. Joined with the pairs instead,
    // the planner either read every task the node was running (a hash join) or
    // compared every pair with every row (a nested loop), both slower than the updates.
    Statement::<Pg>::new(
        "UPDATE async_task t
         SET state = 'done', finished_at = clock_timestamp(), updated_at = clock_timestamp()
         WHERE t.owner = ",
    )
    .bind::<BigInt, _>(owner)
    .sql(" AND t.id = ANY(")
    .bind::<Array<BigInt>, _>(ids.clone())
    .sql(") AND t.state = 'running' AND t.claim_token = (")
    .bind::<Array<BigInt>, _>(tokens)
    .sql(")[array_position(")
    .bind::<Array<BigInt>, _>(ids)
    .sql(", t.id)]")
    .execute(conn)
}

pub(in crate::driver) fn rescue_many(
    conn: &mut PgConnection,
    rescue: &RescueParams,
) -> QueryResult<Vec<RescuedRow>> {
    // In SET, every column reference reads the row as it was before this UPDATE; random() is
    // drawn per row, so that the tasks of a dead node do not all come due at once. The lapsed
    // tasks are locked first, passing over those another transaction holds (`SKIP LOCKED`): a
    // completion frozen before its commit while its node still counts as live holds its
    // rows for as long as its session lives (nothing ends it before the node is dead), and a
    // pass that waited for it would never end. A held task is charged at a later pass, once
    // free; a concurrent rescuer passes over the rows this one locked, so a task is rescued
    // once. A lock the statement must still wait for (a dying parent's descendants, cancelled
    // by the chains' trigger, when `rescue.only` names it) fails it after `RESCUE_SETTINGS`'
    // lock timeout.
    super::with_local(conn, super::RESCUE_SETTINGS, rescue.node, |conn| {
        rescue_params(rescue)
            .sql("\n        UPDATE async_task t SET ")
            .sql(RESCUE_CHARGE)
            .sql(
                ",
            owner = CASE WHEN t.failures + 1 >= COALESCE(t.max_attempts, p.default_max)
                         THEN t.owner END,
            last_error = 'rescued from node ' || COALESCE(t.owner::text, '(none)') || ': ' ||
                         CASE WHEN t.deadline_at < now() THEN 'running past its deadline'
                              ELSE 'the node stopped heartbeating' END,
            suspect = t.suspect + CASE WHEN t.deadline_at < now() THEN 0 ELSE 1 END,
            updated_at = now()
        FROM params p,
             (SELECT c.id FROM async_task c WHERE c.state = 'running' AND ",
            )
            .with(|s| lapsed(s, ("c.deadline_at", "c.owner"), rescue))
            .with(|s| rescue_scope(s, rescue, "c"))
            .sql(
                "
               FOR NO KEY UPDATE SKIP LOCKED) lapsed
        WHERE t.id = lapsed.id AND t.state = 'running'
        RETURNING t.id, t.state, t.last_error AS reason, t.keyword, t.biz_id, t.tenant",
            )
            .load(conn)
    })
}

/// Appends that the task of alias `task` is a dying parent: at its last attempt, with
/// children, whose cancelling at its death (the chains' trigger) waits for locks. After
/// `rescue_params`.
fn dying(statement: Statement<Pg>, task: &'static str) -> Statement<Pg> {
    statement
        .sql(task)
        .sql(".has_children AND ")
        .sql(task)
        .sql(".failures + 1 >= COALESCE(")
        .sql(task)
        .sql(".max_attempts, (SELECT default_max FROM params))")
}

/// Appends which lapsed tasks a rescue statement takes, `task` the alias of their row:
/// `rescue.only` alone, or every one but the dying parents, which rescue charges one at a
/// time ([`rescue_dying`]).
pub(super) fn rescue_scope(
    statement: Statement<Pg>,
    rescue: &RescueParams,
    task: &'static str,
) -> Statement<Pg> {
    match rescue.only {
        Some(only) => statement
            .sql(" AND ")
            .sql(task)
            .sql(".id = ")
            .bind::<BigInt, _>(only),
        None => dying(statement.sql(" AND NOT ("), task).sql(")"),
    }
}

/// See [`crate::driver::Driver::task_rescue_dying`]: stamped, then leased.
pub(in crate::driver) fn rescue_dying(
    conn: &mut PgConnection,
    rescue: &RescueParams,
) -> QueryResult<Vec<i64>> {
    let lapsed = |s: Statement<Pg>, columns| lapsed(s, columns, rescue).sql(" AND ");
    let statement = rescue_params(rescue).sql(
        "
        SELECT t.id FROM async_task t WHERE t.state = 'running' AND ",
    );
    let statement = dying(lapsed(statement, ("t.deadline_at", "t.owner")), "t").sql(
        "
        UNION SELECT t.id FROM async_lease l JOIN async_task t ON t.id = l.task_id WHERE ",
    );
    let ids: Vec<IdRow> = super::with_local(conn, super::RESCUE_SETTINGS, rescue.node, |conn| {
        dying(lapsed(statement, ("l.deadline_at", "l.node_id")), "t")
            .sql(" ORDER BY id")
            .load(conn)
    })?;
    Ok(ids.into_iter().map(|i| i.id).collect())
}

/// The failure a rescue charges a task `t` (under `rescue_params`' `p`): the count, dead at
/// max attempts, else pending after the backoff of its failures with the jitter drawn per
/// row (so that a dead node's tasks do not all come due at once). In SET, every column
/// reference reads the row as it was before the UPDATE.
pub(super) const RESCUE_CHARGE: &str = "
            failures = t.failures + 1,
            state = CASE WHEN t.failures + 1 >= COALESCE(t.max_attempts, p.default_max)
                         THEN 'dead' ELSE 'pending' END,
            run_at = CASE WHEN t.failures + 1 >= COALESCE(t.max_attempts, p.default_max) THEN t.run_at
                          ELSE now() + LEAST(LEAST(p.base_ms * power(2, LEAST(t.failures, 40)), p.max_ms)
                                             * (1 - p.jitter + 2 * p.jitter * random()), p.max_ms)
                                       * interval '1 millisecond' END,
            finished_at = CASE WHEN t.failures + 1 >= COALESCE(t.max_attempts, p.default_max)
                               THEN now() END";

/// The claim statement, after `prefix` (empty, or `EXPLAIN …` to show its plan).
fn claim_statement(
    prefix: &'static str,
    owner: i64,
    due: &Due<'_>,
    except: &[String],
    pick: &Pick<'_>,
    limit: i64,
    timeout_ms: i64,
) -> Statement<Pg> {
    // The claim commits without waiting for its WAL flush (`synchronous_commit` off for
    // this statement's transaction): a claim lost in a crash only puts its tasks back to
    // pending, and no completion under it can be durable before the WAL up to and past the
    // claim is flushed (a completion under a lost claim would be fenced out anyway). That
    // saves one fsync wait per claim.
    //
    // The rows are locked as they are chosen (`SKIP LOCKED`), so two nodes never wait on
    // each other nor claim the same row.
    let claim = stamp_picked(
        super::fair::pick(prefix, due, except, pick, limit),
        owner,
        timeout_ms,
    );
    super::fair::crowded(claim, except, pick)
}

/// Completes a claim statement whose `picked` CTE (`WITH … picked AS (SELECT id …`, left
/// open, its rows locked) chose the rows: stamps them running for `owner` with a new claim
/// token and a deadline `timeout_ms` from now, and returns them.
pub(super) fn stamp_picked(picked: Statement<Pg>, owner: i64, timeout_ms: i64) -> Statement<Pg> {
    picked
        .sql(
            "
            )
            UPDATE async_task t
            SET state = 'running', owner = ",
        )
        .bind::<BigInt, _>(owner)
        .sql(
", claim_token = t.claim_token + 1, claimed_at = now(), updated_at = now(), deadline_at = now() + ",
        )
        .bind::<BigInt, _>(timeout_ms)
        .sql(
            " * interval '1 millisecond'
            FROM picked, (SELECT set_config('synchronous_commit', 'off', true)) AS no_flush_wait
            WHERE t.id = picked.id
            RETURNING t.id, t.keyword, t.biz_id, t.biz_data::text AS biz_data, t.tenant,
                      t.failures, t.max_attempts, t.claim_token, t.priority::integer AS priority",
        )
}

/// See [`crate::driver::Driver::task_claim_suspect`]: the suspect index's first due task, in
/// claim order, stamped as any claim.
pub(in crate::driver) fn claim_suspect(
    conn: &mut PgConnection,
    owner: i64,
    due: &Due<'_>,
    except: &[String],
    timeout_ms: i64,
) -> QueryResult<Picked> {
    let due = Due {
        suspect: Some(true),
        ..*due
    };
    let picked = Statement::<Pg>::new(
        "WITH picked AS (SELECT t.id FROM async_task t
         WHERE (t.tenant IS NULL OR t.tenant <> ALL(",
    )
    .bind::<Array<Text>, _>(except.to_vec())
    .sql(")) AND ")
    .with(|s| super::fair::due_for(s, &due))
    .sql(" ORDER BY t.priority, t.run_at, t.id LIMIT 1 FOR UPDATE SKIP LOCKED");
    super::claim_without_jit(conn, "BEGIN", owner, |conn| {
        Ok(Picked::of(
            stamp_picked(picked, owner, timeout_ms).load(conn)?,
        ))
    })
}

/// See [`crate::driver::Driver::task_suspects_exist`].
pub(in crate::driver) fn suspects_exist(conn: &mut PgConnection) -> QueryResult<bool> {
    let found: FoundRow = Statement::<Pg>::new(
        "SELECT EXISTS (SELECT 1 FROM async_task WHERE state = 'pending' AND suspect >= 2) AS found",
    )
    .get_result(conn)?;
    Ok(found.found)
}
