//! `outbox list`: tasks a page at a time ([`crate::ops::list_tasks`]).

use clap::Args;

use super::filter::FilterArgs;
use super::out;
use super::table::{self, Align};
use crate::db::DatabaseUrl;
use crate::migrate::ensure_migrated;
use crate::ops::{list_tasks, Page, TaskQuery, DEFAULT_PAGE_LIMIT};

/// The flags of `outbox list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// Tasks per page (at most 1000).
    #[arg(long, default_value_t = DEFAULT_PAGE_LIMIT)]
    limit: usize,
    /// The next page: the tasks after this id (a previous page prints it).
    #[arg(long, value_name = "ID")]
    after_id: Option<i64>,
    /// Newest tasks first (the cursor then goes down the ids).
    #[arg(long)]
    newest_first: bool,
    /// One JSON object per task per line, then a line `{"next_after_id": ID or null}`.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(url: &DatabaseUrl, args: ListArgs) -> crate::Result<()> {
    let mut query = TaskQuery::new(args.filter.filter())
        .limit(args.limit)
        .newest_first(args.newest_first);
    if let Some(id) = args.after_id {
        query = query.after_id(id);
    }
    // Checked before connecting: bad usage is reported as such.
    query.validate()?;
    url.require_existing()?;
    let mut conn = url.connect()?;
    ensure_migrated(&mut conn)?;
    let page = list_tasks(&mut conn, &query)?;
    if args.json {
        let tasks = page
            .tasks
            .iter()
            .map(|task| serde_json::to_string(task).expect("a task serialises"));
        let cursor = serde_json::json!({"next_after_id": page.next_after_id}).to_string();
        out::json_lines(tasks.chain([cursor]));
    } else {
        out::lines(page_lines(&page, args.after_id.is_some()));
    }
    Ok(())
}

fn page_lines(page: &Page, continued: bool) -> Vec<String> {
    if page.tasks.is_empty() {
        let none = if continued {
            "no more tasks match"
        } else {
            "no tasks match"
        };
        return vec![none.to_owned()];
    }
    let rows: Vec<Vec<String>> = page
        .tasks
        .iter()
        .map(|t| {
            vec![
                t.id.to_string(),
                t.state.to_string(),
                t.keyword.clone(),
                table::name(&t.biz_id, 32),
                t.tenant
                    .as_deref()
                    .map_or("-".to_owned(), |t| table::name(t, 24)),
                t.failures.to_string(),
                table::age(t.age_secs),
                t.last_error
                    .as_deref()
                    .map_or(String::new(), |e| table::cell(e, 60)),
            ]
        })
        .collect();
    let mut lines = table::render(
        &[
            ("id", Align::Right),
            ("state", Align::Left),
            ("keyword", Align::Left),
            ("biz_id", Align::Left),
            ("tenant", Align::Left),
            ("failures", Align::Right),
            ("age", Align::Right),
            ("last error", Align::Left),
        ],
        &rows,
    );
    lines.push(match page.next_after_id {
        Some(id) => format!("more tasks match: add --after-id {id} for the next page"),
        None => format!("({} task(s), the last page)", page.tasks.len()),
    });
    lines
}
