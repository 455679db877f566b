//! Tenants on MySQL: `async_tenant` and its audit. (The claim of tenants with a
//! `max_running` is the core's, in `claim.rs`.)

use diesel::connection::Connection;
use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text};
use diesel::{OptionalExtension, QueryResult, QueryableByName, RunQueryDsl};

use super::operate::audit;
use crate::driver::{AuditEntry, TenantRow, TenantSet};
use crate::sql::Statement;

/// `SELECT` of a [`TenantRow`] from `async_tenant a`, left open for the `WHERE`; the
/// counts read the claim index (tenant, state).
const TENANT_SELECT: &str = "SELECT a.tenant, a.max_queued, a.max_running, a.weight,
         (SELECT count(*) FROM async_task t
           WHERE t.tenant = a.tenant AND t.state IN ('pending', 'blocked')) AS queued,
         (SELECT count(*) FROM async_task t
           WHERE t.tenant = a.tenant AND t.state = 'running') AS running,
         CAST(a.updated_at AS CHAR) AS updated_at, a.updated_by
    FROM async_tenant a";

pub(super) fn set(
    conn: &mut MysqlConnection,
    tenant: &str,
    set: &TenantSet,
    entry: &AuditEntry<'_>,
) -> QueryResult<TenantRow> {
    // MySQL has no RETURNING: the row is read back in the same transaction, which holds
    // its lock from the upsert on.
    conn.transaction(|conn| {
        Statement::<Mysql>::new(
            "INSERT INTO async_tenant (tenant, max_queued, max_running, weight, updated_by) VALUES (",
        )
        .bind::<Text, _>(tenant.to_owned())
        .sql(", ")
        .bind::<Nullable<Integer>, _>(set.max_queued.flatten())
        .sql(", ")
        .bind::<Nullable<Integer>, _>(set.max_running.flatten())
        .sql(", ")
        .bind::<Integer, _>(set.weight.unwrap_or(1))
        .sql(", ")
        .bind::<Text, _>(entry.actor.to_owned())
        .sql(
            ")
            ON DUPLICATE KEY UPDATE
                max_queued = CASE WHEN ",
        )
        .bind::<Bool, _>(set.max_queued.is_some())
        .sql(" THEN VALUES(max_queued) ELSE max_queued END, max_running = CASE WHEN ")
        .bind::<Bool, _>(set.max_running.is_some())
        .sql(" THEN VALUES(max_running) ELSE max_running END, weight = CASE WHEN ")
        .bind::<Bool, _>(set.weight.is_some())
        .sql(concat!(
            " THEN VALUES(weight) ELSE weight END,
                updated_at = ",
            now!(),
            ", updated_by = VALUES(updated_by)"
        ))
        .execute(conn)?;
        audit(conn, entry)?;
        Statement::<Mysql>::new(TENANT_SELECT)
            .sql(" WHERE a.tenant = ")
            .bind::<Text, _>(tenant.to_owned())
            .get_result(conn)
    })
}

pub(super) fn remove(
    conn: &mut MysqlConnection,
    tenant: &str,
    entry: &AuditEntry<'_>,
) -> QueryResult<usize> {
    conn.transaction(|conn| {
        let deleted = Statement::<Mysql>::new("DELETE FROM async_tenant WHERE tenant = ")
            .bind::<Text, _>(tenant.to_owned())
            .execute(conn)?;
        // Its counter of late enqueues (the max_queued trigger's) goes with it.
        Statement::<Mysql>::new("DELETE FROM async_tenant_late_enqueue WHERE tenant = ")
            .bind::<Text, _>(tenant.to_owned())
            .execute(conn)?;
        if deleted > 0 {
            audit(conn, entry)?;
        }
        Ok(deleted)
    })
}

pub(super) fn list(conn: &mut MysqlConnection) -> QueryResult<Vec<TenantRow>> {
    Statement::<Mysql>::new(TENANT_SELECT)
        .sql(" ORDER BY a.tenant")
        .load(conn)
}

pub(super) fn over_max_queued(
    conn: &mut MysqlConnection,
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
    let full: Option<Full> = Statement::<Mysql>::new(
        "SELECT a.tenant, CAST(a.max_queued AS SIGNED) AS lim
           FROM async_tenant a JOIN JSON_TABLE(",
    )
    .bind::<Text, _>(serde_json::Value::Array(batch).to_string())
    .sql(
        ", '$[*]' COLUMNS (t VARCHAR(128) PATH '$.t', n BIGINT PATH '$.n')) j
             ON j.t = a.tenant
          WHERE a.max_queued IS NOT NULL
          ORDER BY (SELECT count(*) FROM async_task q
                     WHERE q.tenant = a.tenant AND q.state IN ('pending', 'blocked'))
                   + j.n - a.max_queued DESC, a.tenant
          LIMIT 1",
    )
    .get_result(conn)
    .optional()?;
    Ok(full.map(|f| (f.tenant, f.lim)))
}
