//! `outbox audit`: the operators' changes, newest first ([`crate::ops::audit_list`]).

use chrono::SecondsFormat;
use clap::Args;

use super::out;
use super::table::{self, Align};
use crate::db::DatabaseUrl;
use crate::migrate::ensure_migrated;
use crate::ops::{audit_list, AuditQuery, DEFAULT_PAGE_LIMIT};

/// The flags of `outbox audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only this action (task.retry), or a family of them (task, domain, tenant, keyword).
    #[arg(long)]
    action: Option<String>,
    /// Rows per page (at most 1000).
    #[arg(long, default_value_t = DEFAULT_PAGE_LIMIT)]
    limit: usize,
    /// The next (older) page: the rows before this id (a previous page prints it).
    #[arg(long, value_name = "ID")]
    before_id: Option<i64>,
    /// One JSON object per row per line, then a line `{"next_before_id": ID or null}`.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(url: &DatabaseUrl, args: AuditArgs) -> crate::Result<()> {
    let mut query = AuditQuery::default().limit(args.limit);
    if let Some(action) = args.action {
        query = query.action(action);
    }
    if let Some(id) = args.before_id {
        query = query.before_id(id);
    }
    // Checked before connecting: bad usage is reported as such.
    query.validate()?;
    url.require_existing()?;
    let mut conn = url.connect()?;
    ensure_migrated(&mut conn)?;
    let page = audit_list(&mut conn, &query)?;
    if args.json {
        let records = page
            .records
            .iter()
            .map(|record| serde_json::to_string(record).expect("a record serialises"));
        let cursor = serde_json::json!({"next_before_id": page.next_before_id}).to_string();
        out::json_lines(records.chain([cursor]));
        return Ok(());
    }
    if page.records.is_empty() {
        out::lines(["no audited changes match"]);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = page
        .records
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                r.at.to_rfc3339_opts(SecondsFormat::Secs, true),
                r.actor.clone(),
                r.action.clone(),
                r.affected.to_string(),
                table::cell(&r.target, 80),
            ]
        })
        .collect();
    let mut lines = table::render(
        &[
            ("id", Align::Right),
            ("at", Align::Left),
            ("actor", Align::Left),
            ("action", Align::Left),
            ("rows", Align::Right),
            ("target", Align::Left),
        ],
        &rows,
    );
    if let Some(id) = page.next_before_id {
        lines.push(format!(
            "older changes: add --before-id {id} for the next page"
        ));
    }
    out::lines(lines);
    Ok(())
}
