//! Lock claims on PostgreSQL: a chunk's tasks leased in `async_lease` (one committed
//! statement, no write to the task rows), run in a transaction of their own marked with the
//! chunk's run, and marked done in it as their leases are deleted: one row version per
//! task, and no task row locked while handlers run. A lease that outlives its chunk is
//! rescued.
//!
//! The sessions of its transactions are found by their marks (`session.rs`).

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::{Array, BigInt, Integer, Text};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use super::task::{picked, plan_lines, rescue_scope, stamp_picked, PickedRow, RESCUE_CHARGE};
use crate::driver::ops::CANCELLED_RUNNING;
use crate::driver::rows::{CountRow, StateRow};
use crate::driver::{
    lapsed, rescue_params, ChunkRuns, ClaimRow, Claiming, Due, LeaseCharge, LeaseDriver, Passes,
    Pick, Picked, RescueParams, RescuedRow, TxMark,
};

use crate::sql::Statement;

/// A leased row and its chunk's run.
#[derive(QueryableByName)]
struct LeasedRow {
    #[diesel(embed)]
    picked: PickedRow,
    #[diesel(sql_type = Integer)]
    chunk: i32,
}

/// The lease statement, after `prefix` (empty, or `EXPLAIN …` to show its plan).
fn lease_statement(
    prefix: &'static str,
    chunk: ChunkRuns,
    claim: &Claiming<'_>,
    pick: &Pick<'_>,
) -> Statement<Pg> {
    let (owner, limit, timeout_ms) = (claim.owner, claim.limit, claim.timeout_ms);
    // The page is cut into chunks in the order `picked` yields it (claim order), numbered
    // without a sort of its own. The fair choice (`fair::pick`) locks its candidates as it
    // reads them (`SKIP LOCKED`: two claims never wait on each other), only for this
    // statement: the lease, not the row lock, holds the task from here on. The lease's token
    // and what the statement returns are the locked row's, as `picked` read it (no second
    // look-up of the task: joined again, a page of a small table was a hash of all of it). `ON
    // CONFLICT` stands where the snapshot is older than a lease another claim has just
    // committed. Of WAL, the statement writes only its row locks (the lease table is
    // unlogged), and its commit waits for no flush.
    let statement = super::fair::pick(prefix, claim.due, claim.except, pick, limit)
        .sql(
            "
            ), leased AS (
                INSERT INTO async_lease (task_id, node_id, token, chunk, deadline_at)
                SELECT p.id, ",
        )
        .bind::<BigInt, _>(owner)
        .sql(
            ", p.claim_token,
                       ((",
        )
        .bind::<BigInt, _>(chunk.first)
        .sql(" + (p.rn - 1) / ")
        .bind::<BigInt, _>(chunk.per.max(1))
        .sql(") % 2147483648)::integer, now() + ")
        .bind::<BigInt, _>(timeout_ms)
        .sql(
            " * interval '1 millisecond'
                  FROM (SELECT id, claim_token, row_number() OVER () AS rn FROM picked) p
                ON CONFLICT (task_id) DO NOTHING
                RETURNING task_id, chunk
            )
            SELECT picked.id, picked.keyword, picked.biz_id, picked.biz_data::text AS biz_data,
                   picked.tenant, picked.failures, picked.max_attempts, picked.claim_token,
                   picked.priority::integer AS priority, leased.chunk",
        );
    super::fair::crowded(statement, claim.except, pick).sql(
        "
              FROM picked JOIN leased ON leased.task_id = picked.id,
                   (SELECT set_config('synchronous_commit', 'off', true)) AS no_flush_wait",
    )
}

/// The leases of `owner` on the tasks of `claims` (`(id, token)`), under those tokens,
/// deleted, after `prefix`. The token fences out a newer lease of the same node on the same
/// task (taken after this chunk's was rescued): it is not this chunk's to complete or free.
fn leases_deleted(prefix: &'static str, owner: i64, claims: &[(i64, i64)]) -> Statement<Pg> {
    let (ids, tokens): (Vec<i64>, Vec<i64>) = claims.iter().copied().unzip();
    Statement::<Pg>::new(prefix)
        .sql("DELETE FROM async_lease WHERE task_id = ANY(")
        .bind::<Array<BigInt>, _>(ids.clone())
        .sql(") AND node_id = ")
        .bind::<BigInt, _>(owner)
        .sql(" AND token = (")
        .bind::<Array<BigInt>, _>(tokens)
        .sql(")[array_position(")
        .bind::<Array<BigInt>, _>(ids)
        .sql(", task_id)]")
}

/// [`leases_deleted`] as `WITH gone AS (DELETE … RETURNING task_id, token)`, then what
/// follows.
fn leases_gone(owner: i64, claims: &[(i64, i64)]) -> Statement<Pg> {
    leases_deleted("WITH gone AS (", owner, claims)
}

/// After [`leases_gone`]'s `RETURNING task_id),`: the CTE `noted`, the tasks of `ran` (their
/// handlers ran in the chunk) whose leases went noted: a pending one `note`, and a cancelled
/// one [`CANCELLED_RUNNING`] (a cancel that could not see the lease wrote nothing). Its
/// `UPDATE` reads again a row a cancel changed while the statement waited for it.
fn noted(statement: Statement<Pg>, ran: &[i64], note: &str) -> Statement<Pg> {
    statement
        .sql(
            " noted AS (UPDATE async_task t SET updated_at = now(),
                     last_error = CASE t.state WHEN 'cancelled' THEN ",
        )
        .bind::<Text, _>(CANCELLED_RUNNING)
        .sql(" ELSE ")
        .bind::<Text, _>(note.to_owned())
        .sql(" END FROM gone WHERE t.id = gone.task_id AND t.id = ANY(")
        .bind::<Array<BigInt>, _>(ran.to_vec())
        .sql(") AND t.state IN ('cancelled', 'pending'))")
}

/// The tasks of `claims` (`(id, token)`) found cancelled under those tokens, noted
/// [`CANCELLED_RUNNING`], in the caller's transaction. The token tells a task whose lease was
/// this chunk's until now from one rescue charged meanwhile (and a later cancel found pending).
/// Its lock wait bounded (an operator's open transaction on the row fails it, to be retried)
/// and its commit flushed: a claim's transaction commits without waiting for its flush, and a
/// crash empties the lease table, which leaves nothing to note the run by.
fn note_cancelled(conn: &mut PgConnection, claims: &[(i64, i64)]) -> QueryResult<()> {
    use diesel::connection::SimpleConnection;
    conn.batch_execute(concat!(
        lock_wait_bound!(),
        "; SET LOCAL synchronous_commit = on"
    ))?;
    let (ids, tokens): (Vec<i64>, Vec<i64>) = claims.iter().copied().unzip();
    Statement::<Pg>::new("UPDATE async_task t SET updated_at = now(), last_error = ")
        .bind::<Text, _>(CANCELLED_RUNNING)
        .sql(" FROM unnest(")
        .bind::<Array<BigInt>, _>(ids)
        .sql(", ")
        .bind::<Array<BigInt>, _>(tokens)
        .sql(
            ") AS c(id, token)
             WHERE t.id = c.id AND t.claim_token = c.token AND t.state = 'cancelled'",
        )
        .execute(conn)?;
    Ok(())
}

impl LeaseDriver for PgConnection {
    fn task_lease_page(
        &mut self,
        claim: &Claiming<'_>,
        chunk: ChunkRuns,
        pick: &Pick<'_>,
    ) -> QueryResult<(Picked, Vec<i64>)> {
        super::claim_without_jit(self, "BEGIN", claim.owner, |conn| {
            let rows: Vec<LeasedRow> = lease_statement("", chunk, claim, pick).load(conn)?;
            let chunks = rows.iter().map(|r| i64::from(r.chunk)).collect();
            let rows = rows.into_iter().map(|r| r.picked).collect();
            Ok((picked(conn, rows, claim.except, pick, claim.limit)?, chunks))
        })
    }

    fn task_lease_plan(&mut self, due: &Due<'_>, limit: i64) -> QueryResult<Vec<String>> {
        let fair = Pick::Fair {
            after: "",
            lap: "",
            passes: &Passes::default(),
        };
        plan_lines(
            self,
            lease_statement(
                "EXPLAIN (COSTS OFF) ",
                ChunkRuns {
                    first: 0,
                    per: limit,
                },
                &Claiming {
                    owner: 0,
                    due,
                    except: &[],
                    limit,
                    timeout_ms: 0,
                },
                &fair,
            ),
        )
    }

    fn task_complete_leased(&mut self, owner: i64, claims: &[(i64, i64)]) -> QueryResult<usize> {
        // Only in the chunk's own transaction: a handler that ended it (a COMMIT of its own)
        // left the rest to autocommit, where `now()` is this statement's start, and the
        // completion must not pretend to be atomic with the handlers. The lease's token fences
        // out a task claimed another way meanwhile; its state, a cancel. `now()` is the start of
        // the chunk's transaction.
        leases_gone(owner, claims)
            .sql(
                " AND now() <> statement_timestamp() RETURNING task_id, token)
                UPDATE async_task t SET state = 'done', owner = ",
            )
            .bind::<BigInt, _>(owner)
            .sql(
                ", claim_token = t.claim_token + 1, claimed_at = now(),
                   finished_at = clock_timestamp(), updated_at = clock_timestamp()
                  FROM gone
                 WHERE t.id = gone.task_id AND t.claim_token = gone.token AND t.state = 'pending'",
            )
            .execute(self)
    }

    fn task_claim_leased(
        &mut self,
        owner: i64,
        claims: &[(i64, i64)],
        ran: &[i64],
        timeout_ms: i64,
    ) -> QueryResult<Vec<ClaimRow>> {
        let picked = leases_gone(owner, claims).sql(
            " RETURNING task_id, token),
            picked AS (
                SELECT t.id FROM async_task t JOIN gone ON gone.task_id = t.id
                 WHERE t.claim_token = gone.token AND t.state = 'pending'
                 FOR UPDATE OF t",
        );
        let claim = stamp_picked(picked, owner, timeout_ms);
        if ran.is_empty() {
            return claim.load(self);
        }
        // The note of the tasks of `ran` found cancelled, in a statement of its own in the
        // claim's transaction: a cancel that held a task's row when the claim began is seen
        // by the claim's lock (the task is not claimed) but not by its snapshot, which a CTE
        // of the claim would read; this statement's snapshot is taken after that wait.
        super::without_jit(self, owner, |conn| {
            let rows: Vec<ClaimRow> = claim.load(conn)?;
            let unclaimed: Vec<(i64, i64)> = claims
                .iter()
                .copied()
                .filter(|(id, _)| ran.contains(id) && !rows.iter().any(|row| row.id == *id))
                .collect();
            if !unclaimed.is_empty() {
                note_cancelled(conn, &unclaimed)?;
            }
            Ok(rows)
        })
    }

    fn task_release_leased(
        &mut self,
        owner: i64,
        claims: &[(i64, i64)],
        ran: &[i64],
        note: &str,
    ) -> QueryResult<usize> {
        if ran.is_empty() {
            return leases_deleted("", owner, claims).execute(self);
        }
        let gone = leases_gone(owner, claims).sql(" RETURNING task_id),");
        let deleted: CountRow = noted(gone, ran, note)
            .sql(" SELECT count(*) AS n FROM gone")
            .get_result(self)?;
        Ok(usize::try_from(deleted.n).unwrap_or(0))
    }

    fn task_charge_leased(
        &mut self,
        owner: i64,
        charge: &LeaseCharge<'_>,
    ) -> QueryResult<Option<String>> {
        // Every lease of the chunk goes; only the hung task is charged. The others are free at
        // once, noted so (they may run again elsewhere after their handlers ran in this
        // chunk), under a new token: leased again by this node, their leases are not this
        // chunk's, whose late statements (its completion, its claim again) then find none.
        let statement = leases_gone(owner, charge.chunk)
            .sql(
                " RETURNING task_id, token),
                 noted AS (UPDATE async_task t SET updated_at = now(),
                                  claim_token = t.claim_token + 1,
                                  last_error = 'released: task ' || ",
            )
            .bind::<BigInt, _>(charge.task)
            .sql(" || ' of its chunk ran past its timeout' FROM gone WHERE t.id = gone.task_id AND t.state = 'pending' AND t.id <> ")
            .bind::<BigInt, _>(charge.task)
            .sql(") UPDATE async_task t SET failures = t.failures + 1, state = CASE WHEN t.failures + 1 >= COALESCE(t.max_attempts, ")
            .bind::<Integer, _>(charge.default_max_attempts)
            .sql(") THEN 'dead' ELSE 'pending' END, run_at = CASE WHEN t.failures + 1 >= COALESCE(t.max_attempts, ")
            .bind::<Integer, _>(charge.default_max_attempts)
            .sql(") THEN t.run_at ELSE now() + ")
            .bind::<BigInt, _>(charge.delay_ms)
            .sql(" * interval '1 millisecond' END, finished_at = CASE WHEN t.failures + 1 >= COALESCE(t.max_attempts, ")
            .bind::<Integer, _>(charge.default_max_attempts)
            .sql(") THEN now() END, owner = CASE WHEN t.failures + 1 >= COALESCE(t.max_attempts, ")
            .bind::<Integer, _>(charge.default_max_attempts)
            .sql(") THEN ")
            .bind::<BigInt, _>(owner)
            .sql(" END, last_error = ")
            .bind::<Text, _>(charge.error.to_owned())
            .sql(
                ", claim_token = t.claim_token + 1, updated_at = now()
                  FROM gone
                 WHERE gone.task_id = t.id AND t.id = ",
            )
            .bind::<BigInt, _>(charge.task)
            .sql(" AND t.claim_token = gone.token AND t.state = 'pending' RETURNING t.state");
        // A task cancelled by a cancel that could not see its lease (its snapshot older than
        // the lease claim) wrote no note: written with the lease's end, since the process may
        // exit next (the hang watchdog), in a statement after the charge, whose snapshot sees
        // a cancel the charge waited for (see `task_claim_leased`).
        super::without_jit(self, owner, |conn| {
            let charged: Vec<StateRow> = statement.load(conn)?;
            note_cancelled(conn, charge.chunk)?;
            Ok(charged.into_iter().next().map(|c| c.state))
        })
    }

    fn task_rescue_leases(&mut self, rescue: &RescueParams) -> QueryResult<Vec<RescuedRow>> {
        // The leases of nodes that are not live (dead, frozen, cut off, gone), and those past
        // their deadline, deleted; their tasks charged a failure as a rescued stamped claim's
        // are; a death of its node is counted in `suspect`. Each lease and its task are locked
        // first, in the order a completion takes them, passing over those another transaction
        // holds (`SKIP LOCKED`: a completion in flight, an operator's open transaction; a
        // frozen chunk's session was ended just before): a held one is charged at a later
        // pass, and a pass never waits. A concurrent rescuer passes over what this one
        // locked: a task is charged once. A lock it must still wait for (a dying parent's
        // descendants, when `rescue.only` names it) fails it after `RESCUE_SETTINGS`' lock
        // timeout. A cancelled task's lease goes with the cancel's note: a cancel that missed
        // the lease wrote none (`CANCELLED_RUNNING`).
        super::with_local(self, super::RESCUE_SETTINGS, rescue.node, |conn| {
            rescue_params(rescue)
            .sql(
                ", lapsed AS (
                    SELECT l.task_id, l.deadline_at < now() AS late FROM async_lease l WHERE ",
            )
            .with(|s| lapsed(s, ("l.deadline_at", "l.node_id"), rescue))
            .with(|s| match rescue.only {
                Some(only) => s.sql(" AND l.task_id = ").bind::<BigInt, _>(only),
                None => s,
            })
            .sql(
                "
                       FOR UPDATE SKIP LOCKED
                ), free AS (
                    SELECT t.id FROM async_task t WHERE t.id IN (SELECT task_id FROM lapsed)",
            )
            .with(|s| rescue_scope(s, rescue, "t"))
            .sql(
                "
                       FOR NO KEY UPDATE SKIP LOCKED
                ), gone AS (
                    DELETE FROM async_lease l USING lapsed x
                     WHERE l.task_id = x.task_id AND l.task_id IN (SELECT id FROM free)
                    RETURNING l.task_id, l.token, l.node_id, x.late
                ), noted AS (
                    UPDATE async_task t SET updated_at = now(), last_error = ",
            )
            .bind::<Text, _>(CANCELLED_RUNNING)
            .sql(
                "
                      FROM gone g WHERE t.id = g.task_id AND t.state = 'cancelled'
                )
                UPDATE async_task t SET ",
            )
            .sql(RESCUE_CHARGE)
            .sql(
                ",
                    owner = CASE WHEN t.failures + 1 >= COALESCE(t.max_attempts, p.default_max)
                                 THEN g.node_id END,
                    last_error = 'rescued from node ' || g.node_id || ': ' ||
                                 CASE WHEN g.late THEN 'its lock-claimed chunk ran past its deadline'
                                      ELSE 'the node stopped heartbeating' END,
                    suspect = t.suspect + CASE WHEN g.late THEN 0 ELSE 1 END,
                    claim_token = t.claim_token + 1,
                    updated_at = now()
                  FROM gone g, params p
                 WHERE t.id = g.task_id AND t.claim_token = g.token AND t.state = 'pending'
                RETURNING t.id, t.state, t.last_error AS reason, t.keyword, t.biz_id, t.tenant",
            )
            .load(conn)
        })
    }

    fn session_end_stale(&mut self, rescue: &RescueParams) -> QueryResult<i64> {
        super::session::end_stale(self, rescue.dead_after_ms, rescue.node)
    }

    fn session_end(&mut self, mark: TxMark) -> QueryResult<bool> {
        super::session::end(self, mark)
    }
}
