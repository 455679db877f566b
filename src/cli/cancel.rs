//! `outbox cancel`: an operator's cancel, audited in its own transaction
//! ([`crate::ops::cancel_task`], [`crate::ops::cancel_matching`]).

use clap::Args;

use super::out::say;
use crate::cancel::Filter;
use crate::db::{DatabaseUrl, DbConnection};
use crate::error::{Error, Result};
use crate::migrate::ensure_migrated;
use crate::ops::{cancel_matching, cancel_task, cancel_task_by_key};

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

/// A connection to an existing, migrated database, for a change.
pub(super) fn connect(url: &DatabaseUrl) -> Result<DbConnection> {
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
    // clap drops `requires = "all"` when the id (which conflicts with --all) is given: a
    // `--dry-run` next to an id must not cancel for real.
    if args.dry_run && !args.all {
        return Err(Error::InvalidConfig {
            setting: "cancel",
            reason: "--dry-run goes with --all".into(),
        });
    }
    if args.all {
        return run_matching(url, args);
    }
    let mut conn = connect(url)?;
    let actor = super::actor();
    let result = match (args.id, &args.keyword, &args.biz_id) {
        (Some(id), _, _) => cancel_task(&mut conn, id, &actor)?,
        (None, Some(keyword), Some(biz_id)) => {
            cancel_task_by_key(&mut conn, keyword, biz_id, &actor)?
        }
        _ => unreachable!("clap requires an id or both --keyword and --biz-id"),
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({"id": result.id, "cancelled": result.cancelled, "state": result.state.as_str()})
        );
    } else if result.cancelled {
        say!("cancelled task {}", result.id);
    } else {
        say!(
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
    let outcome = cancel_matching(&mut conn, &filter, args.dry_run, &super::actor())?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"cancelled": outcome.changed, "matched": outcome.matched, "dry_run": outcome.dry_run})
        );
    } else if args.dry_run {
        say!(
            "{} unfinished task(s) match; nothing written (--dry-run)",
            outcome.matched
        );
    } else {
        say!("cancelled {} task(s)", outcome.changed);
    }
    Ok(())
}
