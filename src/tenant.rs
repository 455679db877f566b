//! Tenants: quotas shared by the whole fleet (`async_tenant`).
//!
//! A task's tenant is the unit of quotas ([`crate::NewTask::tenant`]). A tenant without a
//! row is unlimited. `max_queued` bounds its pending and blocked tasks: an enqueue past it
//! fails with [`Error::QuotaExceeded`] and writes nothing, however many producers race
//! (the database checks it, for plain SQL producers too). `max_running` bounds its running
//! tasks across every node: no claim takes it past the limit; every node reads the tenants
//! that have one at each heartbeat, so a new limit holds within one heartbeat.
//!
//! Each change is written to `async_audit` in the same transaction, naming `actor`.

use crate::driver::{AuditEntry, Driver, TenantRow, TenantSet};
use crate::enqueue::EnqueueConnection;
use crate::error::{Error, OpContext, Result};
use crate::task::MAX_TENANT_LEN;

/// A tenant's row, with its tasks counted when it was read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Tenant {
    /// The tenant's name, as tasks carry it.
    pub tenant: String,
    /// Pending and blocked tasks at most (`None`: unlimited).
    pub max_queued: Option<i32>,
    /// Running tasks at most, fleet-wide (`None`: unlimited).
    pub max_running: Option<i32>,
    /// The tenant's weight (1 unless set in the table).
    pub weight: i32,
    /// Its pending and blocked tasks now.
    pub queued: i64,
    /// Its running tasks now.
    pub running: i64,
    /// When its row last changed (UTC, `YYYY-MM-DD HH:MM:SS.SSS`).
    pub updated_at: String,
    /// Who changed it.
    pub updated_by: String,
}

impl From<TenantRow> for Tenant {
    fn from(row: TenantRow) -> Self {
        Tenant {
            tenant: row.tenant,
            max_queued: row.max_queued,
            max_running: row.max_running,
            weight: row.weight,
            queued: row.queued,
            running: row.running,
            updated_at: row.updated_at,
            updated_by: row.updated_by,
        }
    }
}

/// What [`set_tenant`] changes; a limit left out keeps its value (unlimited for a new tenant).
///
/// ```
/// let limits = outbox::TenantLimits::default().max_queued(Some(10_000)).max_running(None);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantLimits(TenantSet);

impl TenantLimits {
    /// Sets `max_queued` (`None`: unlimited). At least 0; 0 refuses every enqueue.
    pub fn max_queued(mut self, limit: Option<i32>) -> Self {
        self.0.max_queued = Some(limit);
        self
    }

    /// Sets `max_running` (`None`: unlimited). At least 0; 0 holds the tenant's tasks.
    pub fn max_running(mut self, limit: Option<i32>) -> Self {
        self.0.max_running = Some(limit);
        self
    }

    /// Sets the tenant's weight: its share of each claim against the other tenants with tasks due
    /// (docs/guide/src/tenants.md, "Fair claiming"). At least 1; a tenant without a row weighs 1.
    pub fn weight(mut self, weight: i32) -> Self {
        self.0.weight = Some(weight);
        self
    }

    fn validate(&self) -> Result<()> {
        if let Some(weight) = self.0.weight {
            if weight < 1 {
                return Err(Error::InvalidConfig {
                    setting: "weight",
                    reason: format!("must be at least 1, not {weight}"),
                });
            }
        }
        for (setting, limit) in [
            ("max_queued", self.0.max_queued),
            ("max_running", self.0.max_running),
        ] {
            if let Some(Some(n)) = limit {
                if n < 0 {
                    return Err(Error::InvalidConfig {
                        setting,
                        reason: format!("must be at least 0, not {n}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// The change as a JSON object, for the audit.
    fn detail(&self) -> String {
        let mut detail = serde_json::Map::new();
        if let Some(limit) = self.0.max_queued {
            detail.insert("max_queued".into(), limit.into());
        }
        if let Some(limit) = self.0.max_running {
            detail.insert("max_running".into(), limit.into());
        }
        if let Some(weight) = self.0.weight {
            detail.insert("weight".into(), weight.into());
        }
        serde_json::Value::Object(detail).to_string()
    }
}

/// Creates or changes the tenant's row, and audits it as `actor`'s `tenant.set`, in one
/// transaction (a savepoint when the caller has one open).
///
/// An invalid tenant name or a negative limit is an [`Error::InvalidConfig`] naming it, and
/// nothing is written.
pub fn set_tenant<C: EnqueueConnection + ?Sized>(
    conn: &mut C,
    tenant: &str,
    limits: &TenantLimits,
    actor: &str,
) -> Result<Tenant> {
    validate_new_name(tenant)?;
    limits.validate()?;
    let detail = limits.detail();
    let audit = AuditEntry {
        actor,
        action: "tenant.set",
        target: tenant,
        detail: &detail,
        affected: 1,
    };
    let row = conn
        .driver()
        .tenant_set(tenant, &limits.0, &audit)
        .op("tenant set")?;
    Ok(row.into())
}

/// Deletes the tenant's row (it becomes unlimited), audited as `actor`'s `tenant.remove`.
/// Fails with [`Error::TenantNotFound`] when it has none.
pub fn remove_tenant<C: EnqueueConnection + ?Sized>(
    conn: &mut C,
    tenant: &str,
    actor: &str,
) -> Result<()> {
    validate_name(tenant)?;
    let audit = AuditEntry {
        actor,
        action: "tenant.remove",
        target: tenant,
        detail: "{}",
        affected: 1,
    };
    match conn
        .driver()
        .tenant_remove(tenant, &audit)
        .op("tenant remove")?
    {
        0 => Err(Error::TenantNotFound {
            tenant: tenant.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// Every tenant's row, by name.
pub fn tenants<C: EnqueueConnection + ?Sized>(conn: &mut C) -> Result<Vec<Tenant>> {
    let rows = conn.driver().tenant_list().op("tenant list")?;
    Ok(rows.into_iter().map(Tenant::from).collect())
}

/// Checks a tenant's name as one to look up (a filter, a removal): 1 to
/// [`MAX_TENANT_LEN`] bytes without NUL.
pub(crate) fn validate_name(tenant: &str) -> Result<()> {
    name_checked(crate::task::key_problem(tenant))
}

/// Checks a tenant's name as one to write ([`set_tenant`]): no trailing space either
/// ([`crate::task::new_key_problem`]).
fn validate_new_name(tenant: &str) -> Result<()> {
    name_checked(crate::task::new_key_problem(tenant))
}

fn name_checked(problem: Option<&'static str>) -> Result<()> {
    match problem {
        Some(reason) => Err(Error::InvalidConfig {
            setting: "tenant",
            reason: format!(
                "must be 1 to {MAX_TENANT_LEN} bytes without NUL characters (and, to write, \
                 without a trailing space): {reason}"
            ),
        }),
        None => Ok(()),
    }
}

/// The quota error an enqueue met, if `error` is one: the schema's `max_queued` check.
/// PostgreSQL's names the tenant and the limit; SQLite's message is a constant, so the tenant
/// is looked up among `tenants` (each with its number of tasks in the refused batch; the
/// batch was undone, and the transaction is still usable there).
pub(crate) fn quota_exceeded(
    driver: &mut dyn Driver,
    error: &diesel::result::Error,
    tenants: &[(String, i64)],
) -> Option<Error> {
    let diesel::result::Error::DatabaseError(_, info) = error else {
        return None;
    };
    if info.constraint_name() == Some("async_tenant_max_queued") {
        let detail: serde_json::Value = serde_json::from_str(info.details()?).ok()?;
        return Some(Error::QuotaExceeded {
            tenant: detail.get("tenant")?.as_str()?.to_owned(),
            limit: detail.get("limit")?.as_i64()?,
        });
    }
    if info.message() == "async_task: tenant over its max_queued" {
        let (tenant, limit) = driver.tenant_over_max_queued(tenants).ok()??;
        return Some(Error::QuotaExceeded { tenant, limit });
    }
    None
}
