//! `outbox cancel`.

use clap::Args;

use crate::cancel::{cancel, cancel_by_key};
use crate::db::DatabaseUrl;
use crate::migrate::ensure_migrated;

/// The flags of `outbox cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The task's id (or name it by --keyword and --biz-id).
    #[arg(required_unless_present = "keyword", conflicts_with_all = ["keyword", "biz_id"])]
    id: Option<i64>,
    /// The task's keyword (with --biz-id).
    #[arg(long, requires = "biz_id")]
    keyword: Option<String>,
    /// The task's business key (with --keyword).
    #[arg(long, requires = "keyword")]
    biz_id: Option<String>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(url: &DatabaseUrl, args: CancelArgs) -> crate::Result<()> {
    url.require_existing()?;
    let mut conn = url.connect()?;
    ensure_migrated(&mut conn)?;
    let result = match (args.id, args.keyword, args.biz_id) {
        (Some(id), _, _) => cancel(&mut conn, id)?,
        (None, Some(keyword), Some(biz_id)) => cancel_by_key(&mut conn, &keyword, &biz_id)?,
        _ => unreachable!("clap requires an id or both --keyword and --biz-id"),
    };
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
