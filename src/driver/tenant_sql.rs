//! Tenants' rows (`async_tenant`) and their audit, the same on every backend: written once,
//! with the query builder. (The claim of tenants with a `max_running` is each backend's.)

use chrono::NaiveDateTime;
use diesel::dsl::count_star;
use diesel::prelude::*;

use super::clock::{time_text, DbNow};
use super::dialect::{on_backend, queued, unfinished, Conn, UpsertKey};
use super::operate_sql::audit_write;
use super::{AuditEntry, Driver, TenantRow, TenantSet};
use crate::schema::{async_task, async_tenant};

/// Tenants whose tasks one statement counts, at most (each a bind).
const TENANTS_PER_COUNT: usize = 500;

/// A row of `async_tenant` as loaded, before its tasks are counted.
type TenantTuple = (String, Option<i32>, Option<i32>, i32, NaiveDateTime, String);

/// See [`Driver::tenant_set`]: the upsert, its audit, the row read back, in one transaction.
pub(super) fn tenant_set(
    conn: Conn<'_>,
    tenant: &str,
    set: &TenantSet,
    audit: &AuditEntry<'_>,
) -> QueryResult<TenantRow> {
    on_backend!(conn, |c| c.transaction(|c| {
        // A limit left out (`None`) keeps the row's; a new row has none.
        let key = c.upsert_key(async_tenant::tenant);
        diesel::insert_into(async_tenant::table)
            .values((
                async_tenant::tenant.eq(tenant),
                async_tenant::max_queued.eq(set.max_queued.flatten()),
                async_tenant::max_running.eq(set.max_running.flatten()),
                async_tenant::weight.eq(set.weight.unwrap_or(1)),
                async_tenant::updated_by.eq(audit.actor),
            ))
            .on_conflict(key)
            .do_update()
            .set((
                set.max_queued.map(|v| async_tenant::max_queued.eq(v)),
                set.max_running.map(|v| async_tenant::max_running.eq(v)),
                set.weight.map(|v| async_tenant::weight.eq(v)),
                async_tenant::updated_at.eq(DbNow),
                async_tenant::updated_by.eq(audit.actor),
            ))
            .execute(c)?;
        audit_write(c.conn(), audit)?;
        tenant_rows(c.conn(), Some(tenant))?
            .pop()
            .ok_or(diesel::result::Error::NotFound)
    }))
}

/// See [`Driver::tenant_remove`].
pub(super) fn tenant_remove(
    conn: Conn<'_>,
    tenant: &str,
    audit: &AuditEntry<'_>,
) -> QueryResult<usize> {
    // On MySQL its counter of late enqueues stays, bumped by the removal (the max_queued
    // trigger tells by it a snapshot from before).
    on_backend!(conn, |c| c.transaction(|c| {
        let deleted = diesel::delete(async_tenant::table)
            .filter(async_tenant::tenant.eq(tenant))
            .execute(c)?;
        if deleted > 0 {
            audit_write(c.conn(), audit)?;
        }
        Ok(deleted)
    }))
}

/// The rows of every tenant (or of `only`), by name, with their queued (pending or blocked)
/// and running tasks counted.
pub(super) fn tenant_rows(conn: Conn<'_>, only: Option<&str>) -> QueryResult<Vec<TenantRow>> {
    on_backend!(conn, |c| {
        let mut rows = async_tenant::table
            .order(async_tenant::tenant)
            .select((
                async_tenant::tenant,
                async_tenant::max_queued,
                async_tenant::max_running,
                async_tenant::weight,
                async_tenant::updated_at,
                async_tenant::updated_by,
            ))
            .into_boxed();
        if let Some(tenant) = only {
            rows = rows.filter(async_tenant::tenant.eq(tenant));
        }
        let rows: Vec<TenantTuple> = rows.load(c)?;
        let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        let mut counts: Vec<(Option<String>, String, i64)> = Vec::new();
        for names in names.chunks(TENANTS_PER_COUNT) {
            counts.extend(
                async_task::table
                    .filter(async_task::tenant.eq_any(names))
                    .filter(unfinished())
                    .group_by((async_task::tenant, async_task::state))
                    .select((async_task::tenant, async_task::state, count_star()))
                    .load::<(Option<String>, String, i64)>(c)?,
            );
        }
        Ok(rows
            .into_iter()
            .map(|r| {
                let count = |states: &[&str]| -> i64 {
                    counts
                        .iter()
                        .filter(|(t, s, _)| t.as_deref() == Some(&r.0) && states.contains(&&**s))
                        .map(|(_, _, n)| n)
                        .sum()
                };
                TenantRow {
                    queued: count(&["pending", "blocked"]),
                    running: count(&["running"]),
                    tenant: r.0,
                    max_queued: r.1,
                    max_running: r.2,
                    weight: r.3,
                    updated_at: time_text(r.4),
                    updated_by: r.5,
                }
            })
            .collect())
    })
}

/// See [`Driver::tenant_over_max_queued`]: each tenant's queued tasks plus the batch's, less
/// its limit; the most, the first tenant by name among equals.
pub(super) fn tenant_over_max_queued(
    conn: Conn<'_>,
    tenants: &[(String, i64)],
) -> QueryResult<Option<(String, i64)>> {
    let names: Vec<&str> = tenants.iter().map(|(t, _)| t.as_str()).collect();
    type Limits = Vec<(String, Option<i32>)>;
    type Queued = Vec<(Option<String>, i64)>;
    macro_rules! limits {
        () => {
            async_tenant::table
                .filter(async_tenant::tenant.eq_any(&names))
                .filter(async_tenant::max_queued.is_not_null())
                .order(async_tenant::tenant)
                .select((async_tenant::tenant, async_tenant::max_queued))
        };
    }
    macro_rules! queued {
        () => {
            async_task::table
                .filter(async_task::tenant.eq_any(&names))
                .filter(queued())
                .filter(unfinished())
                .group_by(async_task::tenant)
                .select((async_task::tenant, count_star()))
        };
    }
    let (limits, queued): (Limits, Queued) = match conn {
        // A producer at REPEATABLE READ reads its snapshot, which may be older than the limit
        // its enqueue met: the limits are read as the trigger read them, locking (the newest),
        // passing over a tenant another producer holds (the one refused is this one's).
        #[cfg(feature = "mysql")]
        Conn::Mysql(c) => (
            limits!().for_update().skip_locked().load(c)?,
            queued!().load(c)?,
        ),
        #[allow(unreachable_patterns)]
        conn => on_backend!(conn, |c| (limits!().load(c)?, queued!().load(c)?)),
    };
    let mut over: Option<(String, i64, i64)> = None;
    for (tenant, limit) in limits {
        let limit = i64::from(limit.unwrap_or(0));
        let queued: i64 = queued
            .iter()
            .filter(|(t, _)| t.as_deref() == Some(tenant.as_str()))
            .map(|(_, n)| n)
            .sum();
        for (_, n) in tenants.iter().filter(|(t, _)| *t == tenant) {
            let excess = queued + n - limit;
            if over.as_ref().is_none_or(|o| excess > o.2) {
                over = Some((tenant.clone(), limit, excess));
            }
        }
    }
    Ok(over.map(|(tenant, limit, _)| (tenant, limit)))
}
