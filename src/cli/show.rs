//! `outbox show ID`: one task whole ([`crate::ops::show_task`]).

use chrono::{DateTime, SecondsFormat, Utc};
use clap::Args;

use super::{out, table};
use crate::db::DatabaseUrl;
use crate::migrate::ensure_migrated;
use crate::ops::{show_task, TaskDetail, TaskLink};

/// The flags of `outbox show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The task's id.
    id: i64,
    /// Print the task as one JSON object.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(url: &DatabaseUrl, args: ShowArgs) -> crate::Result<()> {
    url.require_existing()?;
    let mut conn = url.connect()?;
    ensure_migrated(&mut conn)?;
    let detail = show_task(&mut conn, args.id)?;
    if args.json {
        out::json_lines([serde_json::to_string(&detail).expect("a task serialises")]);
    } else {
        out::lines(detail_lines(&detail));
    }
    Ok(())
}

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.to_rfc3339_opts(SecondsFormat::Millis, true),
    )
}

fn link(l: &TaskLink) -> String {
    format!("{} {} {} ({})", l.id, l.keyword, l.biz_id, l.state)
}

fn detail_lines(d: &TaskDetail) -> Vec<String> {
    let t = &d.task;
    let max = t
        .max_attempts
        .map_or_else(|| "the worker's".to_owned(), |m| m.to_string());
    let fields: Vec<(&str, String)> = vec![
        ("id", t.id.to_string()),
        ("keyword", t.keyword.clone()),
        ("biz_id", t.biz_id.clone()),
        ("tenant", t.tenant.clone().unwrap_or_else(|| "-".to_owned())),
        ("state", t.state.to_string()),
        ("failures", format!("{} (max attempts: {max})", t.failures)),
        ("priority", t.priority.to_string()),
        (
            "created_at",
            format!(
                "{} ({} ago)",
                time(Some(t.created_at)),
                table::age(t.age_secs)
            ),
        ),
        ("run_at", time(Some(t.run_at))),
        ("claimed_at", time(d.claimed_at)),
        ("deadline_at", time(d.deadline_at)),
        ("finished_at", time(t.finished_at)),
        ("updated_at", time(Some(t.updated_at))),
        (
            "owner",
            t.owner
                .map_or_else(|| "-".to_owned(), |o| format!("node {o}")),
        ),
        ("claim_token", d.claim_token.to_string()),
        ("blocked_by", d.blocked_by.to_string()),
        (
            "last_error",
            t.last_error.clone().unwrap_or_else(|| "-".to_owned()),
        ),
        ("biz_data", d.biz_data.to_string()),
    ];
    let mut lines: Vec<String> = fields
        .into_iter()
        .map(|(name, value)| format!("{name:<12} {value}"))
        .collect();
    link_lines(&mut lines, "parents", &d.parents, d.parents.len() as i64);
    link_lines(&mut lines, "children", &d.children, d.children_total);
    if !d.error_chain.is_empty() {
        lines.push("error chain".to_owned());
        for l in &d.error_chain {
            let error = l.last_error.as_deref().unwrap_or("-");
            lines.push(format!("  {}: {error}", link(l)));
        }
    }
    lines
}

fn link_lines(lines: &mut Vec<String>, name: &str, links: &[TaskLink], total: i64) {
    if links.is_empty() {
        lines.push(format!("{name:<12} -"));
        return;
    }
    for (i, l) in links.iter().enumerate() {
        let label = if i == 0 { name } else { "" };
        lines.push(format!("{label:<12} {}", link(l)));
    }
    let more = total - links.len() as i64;
    if more > 0 {
        lines.push(format!("{:<12} … and {more} more", ""));
    }
}
