//! Tenants on PostgreSQL: `async_tenant`, its audit, and the claim of tenants with a
//! `max_running`.

use diesel::connection::Connection;
use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text};
use diesel::{OptionalExtension, QueryResult, QueryableByName, RunQueryDsl};

use super::task::stamp_picked;
use crate::driver::{audit_insert, AuditEntry, ClaimRow, Due, TenantRow, TenantSet};
use crate::sql::Statement;

/// The columns of a [`TenantRow`], from `async_tenant a`.
macro_rules! tenant_columns {
    () => {
        "a.tenant, a.max_queued, a.max_running, a.weight,
         (SELECT count(*) FROM async_task t
           WHERE t.tenant = a.tenant AND t.state IN ('pending', 'blocked')) AS queued,
         (SELECT count(*) FROM async_task t
           WHERE t.tenant = a.tenant AND t.state = 'running') AS running,
         to_char(a.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS updated_at,
         a.updated_by"
    };
}

/// `INSERT INTO async_audit …` of `audit`, as a CTE named `audit` (after `WITH … ,`).
fn audit_cte(statement: Statement<Pg>, audit: &AuditEntry<'_>) -> Statement<Pg> {
    audit_insert(statement.sql("audit AS ("), audit, "::jsonb").sql(")")
}

pub(super) fn set(
    conn: &mut PgConnection,
    tenant: &str,
    set: &TenantSet,
    audit: &AuditEntry<'_>,
) -> QueryResult<TenantRow> {
    // One statement: the row and its audit entry commit together, in the caller's
    // transaction if one is open.
    let statement = Statement::<Pg>::new(
        "WITH a AS (
            INSERT INTO async_tenant AS a (tenant, max_queued, max_running, weight, updated_by) VALUES (",
    )
    .bind::<Text, _>(tenant.to_owned())
    .sql(", ")
    .bind::<Nullable<Integer>, _>(set.max_queued.flatten())
    .sql(", ")
    .bind::<Nullable<Integer>, _>(set.max_running.flatten())
    .sql(", ")
    .bind::<Integer, _>(set.weight.unwrap_or(1))
    .sql(", ")
    .bind::<Text, _>(audit.actor.to_owned())
    .sql(
        ")
            ON CONFLICT (tenant) DO UPDATE SET
                max_queued = CASE WHEN ",
    )
    .bind::<Bool, _>(set.max_queued.is_some())
    .sql(" THEN EXCLUDED.max_queued ELSE a.max_queued END, max_running = CASE WHEN ")
    .bind::<Bool, _>(set.max_running.is_some())
    .sql(
        " THEN EXCLUDED.max_running ELSE a.max_running END, weight = CASE WHEN ",
    )
    .bind::<Bool, _>(set.weight.is_some())
    .sql(
        " THEN EXCLUDED.weight ELSE a.weight END,
                updated_at = now(), updated_by = EXCLUDED.updated_by
            RETURNING *
        ), ",
    );
    audit_cte(statement, audit)
        .sql(concat!(" SELECT ", tenant_columns!(), " FROM a"))
        .get_result(conn)
}

pub(super) fn remove(
    conn: &mut PgConnection,
    tenant: &str,
    audit: &AuditEntry<'_>,
) -> QueryResult<usize> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    conn.transaction(|conn| {
        let deleted: Count =
            Statement::<Pg>::new("WITH d AS (DELETE FROM async_tenant WHERE tenant = ")
                .bind::<Text, _>(tenant.to_owned())
                .sql(" RETURNING 1) SELECT count(*) AS n FROM d")
                .get_result(conn)?;
        if deleted.n > 0 {
            audit_cte(Statement::<Pg>::new("WITH "), audit)
                .sql(" SELECT 1")
                .execute(conn)?;
        }
        Ok(usize::try_from(deleted.n).unwrap_or(0))
    })
}

pub(super) fn list(conn: &mut PgConnection) -> QueryResult<Vec<TenantRow>> {
    Statement::<Pg>::new(concat!(
        "SELECT ",
        tenant_columns!(),
        " FROM async_tenant a ORDER BY a.tenant"
    ))
    .load(conn)
}

pub(super) fn over_max_queued(
    conn: &mut PgConnection,
    tenants: &[(String, i64)],
) -> QueryResult<Option<(String, i64)>> {
    #[derive(QueryableByName)]
    struct Full {
        #[diesel(sql_type = Text)]
        tenant: String,
        #[diesel(sql_type = BigInt)]
        lim: i64,
    }
    let batch: Vec<serde_json::Value> = tenants
        .iter()
        .map(|(t, n)| serde_json::json!({"t": t, "n": n}))
        .collect();
    let full: Option<Full> = Statement::<Pg>::new(
        "SELECT a.tenant, a.max_queued::bigint AS lim
           FROM async_tenant a JOIN jsonb_to_recordset(",
    )
    .bind::<Text, _>(serde_json::Value::Array(batch).to_string())
    .sql(
        "::jsonb) AS x(t text, n bigint) ON x.t = a.tenant
          WHERE a.max_queued IS NOT NULL
          ORDER BY (SELECT count(*) FROM async_task q
                     WHERE q.tenant = a.tenant AND q.state IN ('pending', 'blocked'))
                   + x.n - a.max_queued DESC, a.tenant
          LIMIT 1",
    )
    .get_result(conn)
    .optional()?;
    Ok(full.map(|f| (f.tenant, f.lim)))
}

/// See [`crate::driver::Driver::task_claim_limited`].
pub(super) fn claim_limited(
    conn: &mut PgConnection,
    owner: i64,
    due: &Due<'_>,
    tenants: &[String],
    limit: i64,
    timeout_ms: i64,
) -> QueryResult<Vec<ClaimRow>> {
    #[derive(QueryableByName)]
    struct Name {
        #[diesel(sql_type = Text)]
        tenant: String,
    }
    // READ COMMITTED whatever `default_transaction_isolation` says: the claim statement must take a
    // snapshot of its own, after the locks.
    conn.build_transaction().read_committed().run(|conn| {
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
            return Ok(Vec::new());
        }
        let locked: Vec<String> = locked.into_iter().map(|n| n.tenant).collect();
        // A statement of its own, so that its snapshot, taken after the locks, sees every
        // claim committed by the nodes that held them before: the running count is exact.
        // Each tenant's room is its limit less what runs; its first due tasks by the
        // tenant index, in claim order, at most a page of each; the page's first rows of
        // all of them are then locked, and only those (a locked row is written to).
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
        .sql(
            ")) c
                ORDER BY c.priority, c.run_at, c.id
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
        stamp_picked(picked, owner, timeout_ms).load(conn)
    })
}
