//! Tasks: a filtered listing in keyset pages (`/tasks`, the dead tasks with their errors at
//! `/tasks?state=dead`) and one task whole (`/tasks/{id}`).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::Html;
use maud::{html, Markup};
use serde::Deserialize;

use super::actions::{notice, Notice};
use super::layout::{
    age, badge, button, flash, maybe_time, page, query_string, short, time, Nav, STATES,
};
use super::problem::Problem;
use super::server::AppState;
use crate::ops::{
    list_tasks, show_task, Filter, Page, TaskDetail, TaskLink, TaskQuery, TaskSummary,
};
use crate::task::TaskState;

/// Tasks per page of the listing.
const PAGE: usize = 50;
/// Characters of an error a listing's cell shows (the task's page shows it whole).
const ERROR_CELL: usize = 240;

/// The listing's query: its filter, its cursor, and a notice.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ListParams {
    state: Option<String>,
    keyword: Option<String>,
    tenant: Option<String>,
    biz_id: Option<String>,
    after: Option<String>,
    #[serde(flatten)]
    notice: Notice,
}

impl ListParams {
    /// The filter's fields that are set (empty ones, as a blank form sends them, are not).
    fn fields(&self) -> Vec<(&'static str, &str)> {
        [
            ("state", &self.state),
            ("keyword", &self.keyword),
            ("tenant", &self.tenant),
            ("biz_id", &self.biz_id),
        ]
        .into_iter()
        .filter_map(|(name, value)| {
            value
                .as_deref()
                .filter(|v| !v.is_empty())
                .map(|v| (name, v))
        })
        .collect()
    }

    fn query(&self) -> Result<TaskQuery, Problem> {
        let mut filter = Filter::default();
        for (name, value) in self.fields() {
            filter = match name {
                "state" => filter.state(parse_state(value)?),
                "keyword" => filter.keyword(value),
                "tenant" => filter.tenant(value),
                _ => filter.biz_id(value),
            };
        }
        let mut query = TaskQuery::new(filter).limit(PAGE).newest_first(true);
        if let Some(after) = self.after.as_deref().filter(|a| !a.is_empty()) {
            let id = after
                .parse::<i64>()
                .map_err(|_| Problem::bad_request(format!("after={after:?} is not a task id")))?;
            query = query.after_id(id);
        }
        query.validate()?;
        Ok(query)
    }
}

fn parse_state(text: &str) -> Result<TaskState, Problem> {
    text.parse::<TaskState>().map_err(|_| {
        let names: Vec<&str> = STATES.iter().map(|s| s.as_str()).collect();
        Problem::bad_request(format!(
            "unknown state {text:?}: one of {}",
            names.join(", ")
        ))
    })
}

/// `GET /tasks`.
pub(super) async fn list(
    State(state): State<Arc<AppState>>,
    Query(params): Query<ListParams>,
) -> Result<Html<String>, Problem> {
    let query = params.query()?;
    let page_of = query.clone();
    let tasks = state.db(move |conn| list_tasks(conn, &page_of)).await?;
    let dead_only = query.filter.states == [TaskState::Dead];
    let (title, nav) = if dead_only {
        ("Dead tasks", Nav::Dead)
    } else {
        ("Tasks", Nav::Tasks)
    };
    let fields = params.fields();
    let next_link = tasks.next_after_id.map(|next| {
        let next = next.to_string();
        let mut more = fields.clone();
        more.push(("after", &next));
        format!("/tasks{}", query_string(&more))
    });
    let body = html! {
        h1 { (title) }
        (flash(notice(&params.notice)))
        (filter_form(&params))
        (listing(&state, &tasks, dead_only))
        @if let Some(next) = next_link {
            p.pager { a #next href=(next) { "next page →" } }
        }
    };
    // Not reloaded: a reload would wipe a filter being typed into the form.
    Ok(page(&state, title, nav, None, body))
}

fn filter_form(params: &ListParams) -> Markup {
    let value = |v: &Option<String>| v.clone().unwrap_or_default();
    let current = value(&params.state);
    html! {
        form.filter method="get" action="/tasks" {
            label { "state"
                select name="state" {
                    option value="" selected[current.is_empty()] { "any" }
                    @for s in STATES {
                        option value=(s.as_str()) selected[current == s.as_str()] { (s.as_str()) }
                    }
                }
            }
            label { "keyword" input name="keyword" value=(value(&params.keyword)); }
            label { "tenant" input name="tenant" value=(value(&params.tenant)); }
            label { "biz_id" input name="biz_id" value=(value(&params.biz_id)); }
            button type="submit" { "filter" }
        }
    }
}

/// A page of tasks as a table, each with its button.
pub(super) fn listing(state: &AppState, page: &Page, dead_only: bool) -> Markup {
    if page.tasks.is_empty() {
        let what = if dead_only {
            "No dead task."
        } else {
            "No task matches."
        };
        return html! { p #empty { (what) } };
    }
    html! {
        table #tasks {
            thead { tr {
                th.n { "id" } th { "keyword" } th { "biz_id" } th { "tenant" } th { "state" }
                th.n { "failures" } th.n { "age" } th { "updated" } th { "last error" }
                @if state.actions { th {} }
            } }
            tbody {
                @for task in &page.tasks { (row(state, task)) }
            }
        }
    }
}

fn row(state: &AppState, task: &TaskSummary) -> Markup {
    let id = task.id.to_string();
    html! {
        tr data-id=(id) {
            td.n { a href=(format!("/tasks/{id}")) { (id) } }
            td { (task.keyword) }
            td { (task.biz_id) }
            td { (task.tenant.as_deref().unwrap_or("—")) }
            td { (badge(task.state)) }
            td.n { (task.failures) }
            td.n { (age(task.age_secs)) }
            td { (time(&task.updated_at)) }
            td.err { (task.last_error.as_deref().map(|e| short(e, ERROR_CELL)).unwrap_or_default()) }
            @if state.actions { td { (task_buttons(state, task.id, task.state)) } }
        }
    }
}

/// Retry for a dead or cancelled task, cancel for an unfinished one.
fn task_buttons(state: &AppState, id: i64, task_state: TaskState) -> Markup {
    match task_state {
        TaskState::Dead | TaskState::Cancelled => {
            button(state, &format!("/tasks/{id}/retry"), "retry", "go", &[])
        }
        TaskState::Pending | TaskState::Blocked | TaskState::Running => {
            button(state, &format!("/tasks/{id}/cancel"), "cancel", "stop", &[])
        }
        TaskState::Done => html! {},
    }
}

/// `GET /tasks/{id}`.
pub(super) async fn show(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(notice_query): Query<Notice>,
) -> Result<Html<String>, Problem> {
    let id = parse_id(&id)?;
    let detail = state.db(move |conn| show_task(conn, id)).await?;
    let title = format!("Task {id}");
    let body = html! {
        h1 { (title) " " (badge(detail.task.state)) " " (task_buttons(&state, id, detail.task.state)) }
        (flash(notice(&notice_query)))
        @if !detail.error_chain.is_empty() {
            @for (i, link) in detail.error_chain.iter().enumerate() {
                @if i > 0 { p.muted { "because its parent " (link_to(link)) " ended " (badge(link.state)) ":" } }
                pre.err id=[(i == 0).then_some("error")] { (link.last_error.as_deref().unwrap_or("")) }
            }
        }
        (columns(&detail))
        h2 { "Parents" }
        (links(&detail.parents, "No parent."))
        h2 { "Children" }
        (links(&detail.children, "No child."))
        @if detail.children_total > detail.children.len() as i64 {
            p.muted { "The first " (detail.children.len()) " of " (detail.children_total) " children." }
        }
        h2 { "Payload" }
        pre #payload { (serde_json::to_string_pretty(&detail.biz_data).unwrap_or_default()) }
    };
    Ok(page(
        &state,
        &title,
        Nav::None,
        Some(&format!("/tasks/{id}")),
        body,
    ))
}

/// A task id from a path: 400 when it is not one.
pub(super) fn parse_id(text: &str) -> Result<i64, Problem> {
    text.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| Problem::bad_request(format!("{text:?} is not a task id")))
}

fn columns(detail: &TaskDetail) -> Markup {
    let task = &detail.task;
    let none = || "—".to_owned();
    let rows: Vec<(&str, String)> = vec![
        ("id", task.id.to_string()),
        ("keyword", task.keyword.clone()),
        ("biz_id", task.biz_id.clone()),
        ("tenant", task.tenant.clone().unwrap_or_else(none)),
        ("state", task.state.to_string()),
        ("failures", task.failures.to_string()),
        (
            "max attempts",
            task.max_attempts.map_or_else(
                || "the worker's --max-attempts".to_owned(),
                |n| n.to_string(),
            ),
        ),
        ("priority", task.priority.to_string()),
        ("run at", time(&task.run_at)),
        (
            "created at",
            format!("{} ({} ago)", time(&task.created_at), age(task.age_secs)),
        ),
        ("updated at", time(&task.updated_at)),
        ("finished at", maybe_time(task.finished_at.as_ref())),
        ("claimed at", maybe_time(detail.claimed_at.as_ref())),
        ("deadline at", maybe_time(detail.deadline_at.as_ref())),
        (
            "owner (node)",
            task.owner.map_or_else(none, |n| n.to_string()),
        ),
        ("claim token", detail.claim_token.to_string()),
        (
            "parent",
            detail.parent_id.map_or_else(none, |n| n.to_string()),
        ),
        ("unfinished parents", detail.blocked_by.to_string()),
        ("children", detail.children_total.to_string()),
    ];
    html! {
        dl.cols #columns {
            @for (name, value) in rows {
                dt { (name) }
                dd data-column=(name) { (value) }
            }
        }
    }
}

fn link_to(link: &TaskLink) -> Markup {
    html! { a href=(format!("/tasks/{}", link.id)) { (link.id) } " (" (link.keyword) " " (link.biz_id) ")" }
}

fn links(links: &[TaskLink], empty: &str) -> Markup {
    if links.is_empty() {
        return html! { p.muted { (empty) } };
    }
    html! {
        table {
            thead { tr { th.n { "id" } th { "keyword" } th { "biz_id" } th { "state" } th { "last error" } } }
            tbody {
                @for link in links {
                    tr {
                        td.n { a href=(format!("/tasks/{}", link.id)) { (link.id) } }
                        td { (link.keyword) }
                        td { (link.biz_id) }
                        td { (badge(link.state)) }
                        td.err { (link.last_error.as_deref().map(|e| short(e, ERROR_CELL)).unwrap_or_default()) }
                    }
                }
            }
        }
    }
}
