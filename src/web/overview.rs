//! The overview (`/`): tasks per keyword and state, the oldest due task's age, which
//! keywords are paused, how many nodes are live, and the latest dead tasks.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::Html;
use maud::{html, Markup};

use super::actions::{notice, Notice};
use super::layout::{age, badge, button, flash, page, word_badge, Nav, STATES};
use super::problem::Problem;
use super::server::AppState;
use super::tasks::listing;
use crate::domain::admin::{self, paused_keywords};
use crate::ops::{list_tasks, nodes, Filter, NodeQuery, NodeStatus, Page, TaskQuery};
use crate::stats::{keyword_stats, KeywordStats};
use crate::task::TaskState;
use crate::Registry;

/// The dead tasks the overview lists, the latest first.
const LATEST_DEAD: usize = 5;

struct Overview {
    stats: Vec<KeywordStats>,
    dead: Page,
    paused: Vec<String>,
    /// The keywords a live node serves or a domain row lists: those a pause applies to.
    served: BTreeSet<String>,
    live_nodes: usize,
    nodes: usize,
}

/// `GET /`.
pub(super) async fn show(
    State(state): State<Arc<AppState>>,
    Query(notice_query): Query<Notice>,
) -> Result<Html<String>, Problem> {
    let overview = state
        .db(|conn| {
            // `served` (a handler in this binary) says nothing of the fleet: not shown.
            let stats = keyword_stats(conn, &Registry::new())?;
            let paused = paused_keywords(conn)?;
            let served = admin::list(conn)?
                .into_iter()
                .flat_map(|domain| domain.keywords)
                .collect();
            let nodes = nodes(conn, &NodeQuery::default())?;
            let dead = TaskQuery::new(Filter::default().state(TaskState::Dead))
                .limit(LATEST_DEAD)
                .newest_first(true);
            Ok(Overview {
                stats,
                dead: list_tasks(conn, &dead)?,
                paused,
                served,
                live_nodes: nodes
                    .iter()
                    .filter(|n| n.status == NodeStatus::Live)
                    .count(),
                nodes: nodes.len(),
            })
        })
        .await?;
    let body = html! {
        h1 { "Overview" }
        (flash(notice(&notice_query)))
        p.muted {
            (overview.live_nodes) " live node(s) of " (overview.nodes) " known · "
            (overview.stats.len()) " keyword(s) · reloads every " (state.refresh_secs) "s"
        }
        (table(&state, &overview))
        @if !overview.dead.tasks.is_empty() {
            h2 { "Latest dead tasks" }
            (listing(&state, &overview.dead, true))
            p { a href="/tasks?state=dead" { "All dead tasks →" } }
        }
    };
    Ok(page(&state, "Overview", Nav::Overview, Some("/"), body))
}

fn count(stats: &KeywordStats, state: TaskState) -> i64 {
    match state {
        TaskState::Blocked => stats.blocked,
        TaskState::Pending => stats.pending,
        TaskState::Running => stats.running,
        TaskState::Done => stats.done,
        TaskState::Dead => stats.dead,
        TaskState::Cancelled => stats.cancelled,
    }
}

fn table(state: &AppState, overview: &Overview) -> Markup {
    if overview.stats.is_empty() {
        return html! { p { "No tasks yet: nothing has been enqueued in this database." } };
    }
    let total = |s: TaskState| overview.stats.iter().map(|k| count(k, s)).sum::<i64>();
    html! {
        table #keywords {
            thead { tr {
                th { "keyword" }
                @for s in STATES { th.n { (badge(s)) } }
                th.n title="Since the oldest due pending task became due" { "oldest due" }
                th { "claiming" }
            } }
            tbody {
                @for stats in &overview.stats {
                    @let paused = overview.paused.contains(&stats.keyword);
                    tr data-keyword=(stats.keyword) {
                        td { a href=(format!("/tasks?keyword={}", stats.keyword)) { (stats.keyword) } }
                        @for s in STATES {
                            @let n = count(stats, s);
                            @if n == 0 {
                                td.n.zero { "0" }
                            } @else {
                                td.n { a href=(format!("/tasks?keyword={}&state={s}", stats.keyword)) { (n) } }
                            }
                        }
                        td.n { (stats.oldest_due_secs.map_or_else(|| "—".to_owned(), age)) }
                        td {
                            @if paused {
                                (word_badge("paused")) " "
                                (button(state, "/resume", "resume", "go", &[("name", &stats.keyword), ("back", "/")]))
                            } @else if overview.served.contains(&stats.keyword) {
                                span.muted { "active" } " "
                                (button(state, "/pause", "pause", "stop", &[("name", &stats.keyword), ("back", "/")]))
                            } @else {
                                span.muted title="No live node serves it and no domain row lists it: nothing claims it, and there is nothing to pause" { "no live node" }
                            }
                        }
                    }
                }
            }
            tfoot { tr {
                th { "all" }
                @for s in STATES { th.n { (total(s)) } }
                th {} th {}
            } }
        }
    }
}
