//! `outbox show ID`: one task whole ([`crate::ops::show_task`]).

use chrono::{DateTime, SecondsFormat, Utc};
use clap::Args;

use super::table;
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
        println!(
            "{}",
            serde_json::to_string(&detail).expect("a task serialises")
        );
    } else {
        print_detail(&detail);
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

fn print_detail(d: &TaskDetail) {
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
    for (name, value) in fields {
        println!("{name:<12} {value}");
    }
    print_links("parents", &d.parents, d.parents.len() as i64);
    print_links("children", &d.children, d.children_total);
    if !d.error_chain.is_empty() {
        println!("error chain");
        for l in &d.error_chain {
            println!("  {}: {}", link(l), l.last_error.as_deref().unwrap_or("-"));
        }
    }
}

fn print_links(name: &str, links: &[TaskLink], total: i64) {
    if links.is_empty() {
        println!("{name:<12} -");
        return;
    }
    for (i, l) in links.iter().enumerate() {
        let label = if i == 0 { name } else { "" };
        println!("{label:<12} {}", link(l));
    }
    let more = total - links.len() as i64;
    if more > 0 {
        println!("{:<12} … and {more} more", "");
    }
}
