//! The audit (`/audit`): every operator's change, from the CLI or this dashboard, newest
//! first, a page at a time.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::Html;
use maud::html;
use serde::Deserialize;

use super::layout::{page, query_string, time, Nav};
use super::problem::Problem;
use super::server::AppState;
use crate::ops::{audit_list, AuditQuery};

/// Rows per page.
const PAGE: usize = 50;

/// The audit's query: an action (or family) and the cursor.
#[derive(Debug, Default, Deserialize)]
pub(super) struct AuditParams {
    action: Option<String>,
    before: Option<String>,
}

/// `GET /audit`.
pub(super) async fn show(
    State(state): State<Arc<AppState>>,
    Query(params): Query<AuditParams>,
) -> Result<Html<String>, Problem> {
    let action = params.action.as_deref().filter(|a| !a.is_empty());
    let mut query = AuditQuery::default().limit(PAGE);
    if let Some(action) = action {
        query = query.action(action);
    }
    if let Some(before) = params.before.as_deref().filter(|b| !b.is_empty()) {
        let id = before.parse::<i64>().map_err(|_| {
            Problem::bad_request(format!("before={before:?} is not an audit row id"))
        })?;
        query = query.before_id(id);
    }
    query.validate()?;
    let audit = state.db(move |conn| audit_list(conn, &query)).await?;
    let next = audit.next_before_id.map(|id| {
        let id = id.to_string();
        let mut pairs = Vec::new();
        if let Some(action) = action {
            pairs.push(("action", action));
        }
        pairs.push(("before", id.as_str()));
        format!("/audit{}", query_string(&pairs))
    });
    let body = html! {
        h1 { "Audit" }
        form.filter method="get" action="/audit" {
            label { "action (or family, e.g. task)" input name="action" value=(action.unwrap_or("")); }
            button type="submit" { "filter" }
        }
        @if audit.records.is_empty() {
            p #empty { "No change recorded." }
        } @else {
            table #audit {
                thead { tr {
                    th { "when" } th { "who" } th { "action" } th { "target" } th.n { "rows" } th { "detail" }
                } }
                tbody {
                    @for r in &audit.records {
                        tr {
                            td { (time(&r.at)) }
                            td { (r.actor) }
                            td { (r.action) }
                            td { (r.target) }
                            td.n { (r.affected) }
                            td.err { (r.detail.to_string()) }
                        }
                    }
                }
            }
        }
        @if let Some(next) = next {
            p.pager { a #next href=(next) { "older →" } }
        }
    };
    // Not reloaded: a reload would wipe a filter being typed into the form.
    Ok(page(&state, "Audit", Nav::Audit, None, body))
}
