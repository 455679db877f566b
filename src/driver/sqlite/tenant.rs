//! Tenants on SQLite: `async_tenant` and its audit.

use diesel::connection::Connection;
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text};
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{OptionalExtension, QueryResult, QueryableByName, RunQueryDsl};

use super::operate::audit;
use crate::driver::{AuditEntry, TenantRow, TenantSet};
use crate::sql::Statement;

/// `SELECT` of a [`TenantRow`] from `async_tenant a`, left open for the `WHERE`.
const TENANT_SELECT: &str = "SELECT a.tenant, a.max_queued, a.max_running, a.weight,
         (SELECT count(*) FROM async_task t
           WHERE t.tenant = a.tenant AND t.state IN ('pending', 'blocked')
             AND t.state IN ('pending', 'blocked', 'running')) AS queued,
         (SELECT count(*) FROM async_task t
           WHERE t.tenant = a.tenant AND t.state = 'running'
             AND t.state IN ('pending', 'blocked', 'running')) AS running,
         a.updated_at, a.updated_by
    FROM async_tenant a";

pub(super) fn set(
    conn: &mut SqliteConnection,
    tenant: &str,
    set: &TenantSet,
    entry: &AuditEntry<'_>,
) -> QueryResult<TenantRow> {
    // The first statement writes, so the transaction takes the write lock at once.
    conn.transaction(|conn| {
        Statement::<Sqlite>::new(
            "INSERT INTO async_tenant AS a (tenant, max_queued, max_running, weight, updated_by) VALUES (",
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
            ON CONFLICT (tenant) DO UPDATE SET
                max_queued = CASE WHEN ",
        )
        .bind::<Bool, _>(set.max_queued.is_some())
        .sql(" THEN excluded.max_queued ELSE a.max_queued END, max_running = CASE WHEN ")
        .bind::<Bool, _>(set.max_running.is_some())
        .sql(" THEN excluded.max_running ELSE a.max_running END, weight = CASE WHEN ")
        .bind::<Bool, _>(set.weight.is_some())
        .sql(concat!(
            " THEN excluded.weight ELSE a.weight END,
                updated_at = ",
            now!(),
            ", updated_by = excluded.updated_by"
        ))
        .execute(conn)?;
        audit(conn, entry)?;
        Statement::<Sqlite>::new(TENANT_SELECT)
            .sql(" WHERE a.tenant = ")
            .bind::<Text, _>(tenant.to_owned())
            .get_result(conn)
    })
}

pub(super) fn remove(
    conn: &mut SqliteConnection,
    tenant: &str,
    entry: &AuditEntry<'_>,
) -> QueryResult<usize> {
    conn.transaction(|conn| {
        let deleted = Statement::<Sqlite>::new("DELETE FROM async_tenant WHERE tenant = ")
            .bind::<Text, _>(tenant.to_owned())
            .execute(conn)?;
        if deleted > 0 {
            audit(conn, entry)?;
        }
        Ok(deleted)
    })
}

pub(super) fn list(conn: &mut SqliteConnection) -> QueryResult<Vec<TenantRow>> {
    Statement::<Sqlite>::new(TENANT_SELECT)
        .sql(" ORDER BY a.tenant")
        .load(conn)
}

pub(super) fn over_max_queued(
    conn: &mut SqliteConnection,
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
    let full: Option<Full> = Statement::<Sqlite>::new(
        "SELECT a.tenant, a.max_queued AS lim
           FROM async_tenant a JOIN json_each(",
    )
    .bind::<Text, _>(serde_json::Value::Array(batch).to_string())
    .sql(
        ") j ON j.value ->> 't' = a.tenant
          WHERE a.max_queued IS NOT NULL
          ORDER BY (SELECT count(*) FROM async_task q
                     WHERE q.tenant = a.tenant AND q.state IN ('pending', 'blocked')
                       AND q.state IN ('pending', 'blocked', 'running'))
                   + (j.value ->> 'n') - a.max_queued DESC, a.tenant
          LIMIT 1",
    )
    .get_result(conn)
    .optional()?;
    Ok(full.map(|f| (f.tenant, f.lim)))
}
