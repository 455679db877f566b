//! The audit of operators' changes (`async_audit`, `outbox audit`).

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::list::{check_limit, DEFAULT_PAGE_LIMIT};
use super::time_or_epoch;
use crate::db::DbConnection;
use crate::driver::ops::{audit_list as audit_rows, AuditRow};
use crate::driver::{driver, AuditEntry};
use crate::error::{Error, OpContext, Result};

/// The longest action filter [`AuditQuery::action`] accepts.
const MAX_ACTION_LEN: usize = 64;

/// Who runs this process, as the audit names a shell's operator: `$USER@host` (`$LOGNAME`
/// when `$USER` is unset, `unknown` when neither is set).
pub fn local_actor() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    format!("{user}@{}", gethostname::gethostname().to_string_lossy())
}

/// One operator's change, as `async_audit` records it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct AuditRecord {
    /// The row's id (ascending with time).
    pub id: i64,
    /// When the change's transaction wrote it (database clock).
    pub at: DateTime<Utc>,
    /// Who: `$USER@host`, or the name a program gave (a web user).
    pub actor: String,
    /// What: `task.retry`, `task.cancel`, `tenant.set`, `domain.pause`, `keyword.resume`, …
    pub action: String,
    /// What it applied to: a task id, a filter (`state=dead keyword=mail.send`), a tenant,
    /// a domain or a keyword.
    pub target: String,
    /// The change's parameters (the filter, the values set).
    pub detail: serde_json::Value,
    /// The rows it changed.
    pub affected: i64,
}

impl From<AuditRow> for AuditRecord {
    fn from(row: AuditRow) -> Self {
        AuditRecord {
            id: row.id,
            at: time_or_epoch(&row.at),
            detail: serde_json::from_str(&row.detail).unwrap_or(serde_json::Value::Null),
            actor: row.actor,
            action: row.action,
            target: row.target,
            affected: row.affected,
        }
    }
}

/// A page of [`audit_list`]: newest first.
///
/// ```
/// let query = outbox::ops::AuditQuery::default().action("task").limit(20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditQuery {
    /// Only this action (`task.retry`), or a family of them (`task`: `task.retry`,
    /// `task.cancel`, …).
    pub action: Option<String>,
    /// At most this many rows (1 to [`super::MAX_PAGE_LIMIT`]).
    pub limit: usize,
    /// The cursor: only rows older than this id (`None`: from the newest).
    pub before_id: Option<i64>,
}

impl Default for AuditQuery {
    fn default() -> Self {
        AuditQuery {
            action: None,
            limit: DEFAULT_PAGE_LIMIT,
            before_id: None,
        }
    }
}

impl AuditQuery {
    /// Only `action`, or the actions of its family.
    pub fn action(mut self, action: impl Into<String>) -> Self {
        self.action = Some(action.into());
        self
    }

    /// At most `limit` rows.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// The rows before the row `id`.
    pub fn before_id(mut self, id: i64) -> Self {
        self.before_id = Some(id);
        self
    }

    /// Checks the query on its own ([`Error::InvalidConfig`] naming `limit` or `action`).
    pub fn validate(&self) -> Result<()> {
        check_limit(self.limit)?;
        if let Some(action) = &self.action {
            let valid = !action.is_empty()
                && action.len() <= MAX_ACTION_LEN
                && action
                    .bytes()
                    .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'));
            if !valid {
                return Err(Error::InvalidConfig {
                    setting: "action",
                    reason: format!(
                        "must be 1 to {MAX_ACTION_LEN} characters of a-z, 0-9 and . _ - \
                         (an action such as task.retry, or a family such as task)"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// A page of the audit.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct AuditPage {
    /// The rows, newest first.
    pub records: Vec<AuditRecord>,
    /// The cursor of the next (older) page ([`AuditQuery::before_id`]): `None` when this
    /// page is the last.
    pub next_before_id: Option<i64>,
}

/// The operators' changes, newest first, a page at a time.
///
/// ```no_run
/// # fn main() -> outbox::Result<()> {
/// let mut conn = outbox::DatabaseUrl::parse("app.db")?.connect()?;
/// let page = outbox::ops::audit_list(&mut conn, &outbox::ops::AuditQuery::default())?;
/// for r in &page.records {
///     println!("{} {} {} {} ({} rows)", r.at, r.actor, r.action, r.target, r.affected);
/// }
/// # Ok(())
/// # }
/// ```
pub fn audit_list(conn: &mut DbConnection, query: &AuditQuery) -> Result<AuditPage> {
    query.validate()?;
    let limit = check_limit(query.limit)?;
    let mut rows =
        audit_rows(conn, query.action.as_deref(), query.before_id, limit + 1).op("audit list")?;
    let more = rows.len() > query.limit;
    rows.truncate(query.limit);
    let records: Vec<AuditRecord> = rows.into_iter().map(AuditRecord::from).collect();
    let next_before_id = if more {
        records.last().map(|r| r.id)
    } else {
        None
    };
    Ok(AuditPage {
        records,
        next_before_id,
    })
}

/// Writes `action` on `target` by `actor` to the audit, in `conn`'s open transaction.
pub(crate) fn write(
    conn: &mut DbConnection,
    actor: &str,
    action: &str,
    target: &str,
    detail: &serde_json::Value,
    affected: u64,
) -> Result<()> {
    let detail = detail.to_string();
    driver(conn)
        .audit_insert(&AuditEntry {
            actor,
            action,
            target,
            detail: &detail,
            affected: i64::try_from(affected).unwrap_or(i64::MAX),
        })
        .op("audit")?;
    Ok(())
}
