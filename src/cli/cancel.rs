//! `outbox cancel` and `outbox retry`: an operator's changes, each audited in its own
//! transaction.

use clap::Args;

use crate::cancel::{cancel, cancel_by_key, cancel_matching, count_matching, Filter};
use crate::db::{write_transaction, DatabaseUrl, DbConnection};
use crate::driver::{driver, AuditEntry};
use crate::error::{Error, OpContext, Result};
use crate::migrate::ensure_migrated;
use crate::retry::retry;

/// The flags of `outbox cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The task's id (or name it by --keyword and --biz-id, or cancel many with --all).
    #[arg(required_unless_present_any = ["keyword", "tenant", "all"], conflicts_with_all = ["keyword", "biz_id", "tenant", "all"])]
    id: Option<i64>,
    /// The task's keyword (with --biz-id), or the keyword of the tasks to cancel (with --all).
    #[arg(long)]
    keyword: Option<String>,
    /// The task's business key (with --keyword).
    #[arg(long, requires = "keyword", conflicts_with_all = ["all", "tenant"])]
    biz_id: Option<String>,
    /// With --all: only the tasks of this tenant.
    #[arg(long, requires = "all")]
    tenant: Option<String>,
    /// Cancel every pending, blocked and running task of --keyword and/or --tenant.
    #[arg(long)]
    all: bool,
    /// With --all: count the tasks it would cancel, and change nothing.
    #[arg(long, requires = "all")]
    dry_run: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

/// The flags of `outbox retry`.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The id of a dead or cancelled task.
    id: i64,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Writes `action` on `target` to the audit as this operator, in `conn`'s transaction.
fn audit(
    conn: &mut DbConnection,
    action: &str,
    target: &str,
    detail: &serde_json::Value,
    affected: u64,
) -> Result<()> {
    let actor = super::actor();
    let detail = detail.to_string();
    driver(conn)
        .audit_insert(&AuditEntry {
            actor: &actor,
            action,
            target,
            detail: &detail,
            affected: i64::try_from(affected).unwrap_or(i64::MAX),
        })
        .op("audit")?;
    Ok(())
}

fn connect(url: &DatabaseUrl) -> Result<DbConnection> {
    url.require_existing()?;
    let mut conn = url.connect()?;
    ensure_migrated(&mut conn)?;
    Ok(conn)
}

pub(super) fn run(url: &DatabaseUrl, args: CancelArgs) -> Result<()> {
    if args.id.is_none() && args.biz_id.is_none() && !args.all {
        return Err(Error::InvalidConfig {
            setting: "cancel",
            reason: "needs --biz-id to name one task, or --all to cancel every unfinished task \
                     of the keyword or tenant"
                .into(),
        });
    }
    if args.all {
        return run_matching(url, args);
    }
    let mut conn = connect(url)?;
    let result = write_transaction(&mut conn, |conn| -> Result<_> {
        let result = match (args.id, &args.keyword, &args.biz_id) {
            (Some(id), _, _) => cancel(conn, id)?,
            (None, Some(keyword), Some(biz_id)) => cancel_by_key(conn, keyword, biz_id)?,
            _ => unreachable!("clap requires an id or both --keyword and --biz-id"),
        };
        if result.cancelled {
            let detail = serde_json::json!({"keyword": args.keyword, "biz_id": args.biz_id});
            audit(conn, "task.cancel", &result.id.to_string(), &detail, 1)?;
        }
        Ok(result)
    })?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"id": result.id, "cancelled": result.cancelled, "state": result.state.as_str()})
        );
    } else if result.cancelled {
        println!("cancelled task {}", result.id);
    } else {
        println!(
            "task {} is already {}; nothing written",
            result.id,
            result.state.as_str()
        );
    }
    Ok(())
}

fn run_matching(url: &DatabaseUrl, args: CancelArgs) -> Result<()> {
    let mut filter = Filter::default();
    if let Some(keyword) = &args.keyword {
        filter = filter.keyword(keyword.clone());
    }
    if let Some(tenant) = &args.tenant {
        filter = filter.tenant(tenant.clone());
    }
    // Checked before connecting: bad usage is reported as such.
    filter.validate()?;
    let mut conn = connect(url)?;
    let n = if args.dry_run {
        count_matching(&mut conn, &filter)?
    } else {
        write_transaction(&mut conn, |conn| -> Result<u64> {
            let n = cancel_matching(conn, &filter)?;
            if n > 0 {
                let detail =
                    serde_json::json!({"keyword": filter.keyword, "tenant": filter.tenant});
                let target = [("keyword", &filter.keyword), ("tenant", &filter.tenant)]
                    .iter()
                    .filter_map(|(name, value)| value.as_ref().map(|v| format!("{name}={v}")))
                    .collect::<Vec<_>>()
                    .join(" ");
                audit(conn, "task.cancel", &target, &detail, n)?;
            }
            Ok(n)
        })?
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({"cancelled": if args.dry_run { 0 } else { n }, "matched": n, "dry_run": args.dry_run})
        );
    } else if args.dry_run {
        println!("{n} unfinished task(s) match; nothing written (--dry-run)");
    } else {
        println!("cancelled {n} task(s)");
    }
    Ok(())
}

pub(super) fn run_retry(url: &DatabaseUrl, args: RetryArgs) -> Result<()> {
    let mut conn = connect(url)?;
    let result = write_transaction(&mut conn, |conn| -> Result<_> {
        let result = retry(conn, args.id)?;
        if result.retried {
            audit(
                conn,
                "task.retry",
                &result.id.to_string(),
                &serde_json::json!({}),
                1,
            )?;
        }
        Ok(result)
    })?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"id": result.id, "retried": result.retried, "state": result.state.as_str()})
        );
    } else if result.retried {
        println!("task {} is pending again", result.id);
    } else {
        println!(
            "task {} is {}, neither dead nor cancelled; nothing written",
            result.id,
            result.state.as_str()
        );
    }
    Ok(())
}
