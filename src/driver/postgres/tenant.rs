//! The claim of tenants with a `max_running` on PostgreSQL (their rows are written once, in
//! `driver/tenant_sql.rs`).

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::{Array, BigInt, Text};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use super::task::stamp_picked;
use crate::driver::{Claiming, Picked};
use crate::sql::Statement;

/// See [`crate::driver::Driver::task_claim_limited`].
pub(in crate::driver) fn claim_limited(
    conn: &mut PgConnection,
    claim: &Claiming<'_>,
    tenants: &[String],
) -> QueryResult<Picked> {
    let (owner, due, limit, timeout_ms) = (claim.owner, claim.due, claim.limit, claim.timeout_ms);
    #[derive(QueryableByName)]
    struct Name {
        #[diesel(sql_type = Text)]
        tenant: String,
    }
    // READ COMMITTED whatever `default_transaction_isolation` says: the claim statement must take a
    // snapshot of its own, after the locks.
    let begin = "BEGIN ISOLATION LEVEL READ COMMITTED";
    super::claim_without_jit(conn, begin, owner, |conn| {
        // Each tenant's claim lock (a transaction-level advisory lock, class 0x6f72, 'or',
        // keyed by the tenant's hash), held until this transaction commits its claims. A
        // tenant another node is claiming for is skipped, not waited for.
        let locked: Vec<Name> =
            Statement::<Pg>::new("SELECT tenant FROM async_tenant WHERE tenant = ANY(")
                .bind::<Array<Text>, _>(tenants.to_vec())
                .sql(
                    ") AND max_running IS NOT NULL
           AND pg_try_advisory_xact_lock(x'6f72'::int, hashtext(tenant))",
                )
                .load(conn)?;
        if locked.is_empty() {
            return Ok(Picked::default());
        }
        let locked: Vec<String> = locked.into_iter().map(|n| n.tenant).collect();
        // A statement of its own, so that its snapshot, taken after the locks, sees every
        // claim committed by the nodes that held them before: the running count is exact.
        // Each tenant's room is its limit less what runs; its first due tasks by the
        // tenant index, in claim order, at most a page of each; the page's first rows of
        // all of them (tenant by tenant) are then locked, and only those (a locked row is
        // written to).
        let limit_bind = limit;
        let picked = Statement::<Pg>::new(
            "WITH lim AS (
            SELECT a.tenant, GREATEST(a.max_running - (
                       SELECT count(*) FROM async_task r
                        WHERE r.tenant = a.tenant AND r.state = 'running'), 0) AS room
              FROM async_tenant a
             WHERE a.tenant = ANY(",
        )
        .bind::<Array<Text>, _>(locked)
        .sql(
            ") AND a.max_running IS NOT NULL
        ), candidate AS (
            SELECT c.id FROM lim CROSS JOIN LATERAL (
                SELECT t.id, t.priority, t.run_at FROM async_task t
                 WHERE t.tenant = lim.tenant AND ",
        )
        .with(|s| super::fair::due_for(s, due))
        .sql(
            "
                 ORDER BY t.priority, t.run_at, t.id
                 LIMIT LEAST(lim.room, ",
        )
        .bind::<BigInt, _>(limit_bind)
        // The tenants in the order given (it turns from claim to claim), each in claim
        // order: one's older backlog takes no more than a claim from the next.
        .sql(")) c ORDER BY array_position(")
        .bind::<Array<Text>, _>(tenants.to_vec())
        .sql(
            ", lim.tenant), c.priority, c.run_at, c.id
            LIMIT ",
        )
        .bind::<BigInt, _>(limit)
        .sql(
            "
        ), picked AS (
            SELECT t.id FROM async_task t
             WHERE t.id IN (SELECT id FROM candidate) AND t.state = 'pending'
             FOR UPDATE SKIP LOCKED",
        );
        Ok(Picked::of(
            stamp_picked(picked, owner, timeout_ms).load(conn)?,
        ))
    })
}
