//! The fleet's pages: nodes (`/nodes`), domains, paused keywords and tenants (`/domains`),
//! and the cron schedules (`/schedules`).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::Html;
use maud::{html, Markup};

use super::actions::{notice, Notice};
use super::layout::{age, badge, button, flash, maybe_time, page, time, word_badge, Nav};
use super::problem::Problem;
use super::server::AppState;
use crate::domain::admin::{self, DomainView};
use crate::ops::{nodes as list_nodes, NodeQuery};
use crate::schedule::list as list_schedules;
use crate::tenant::{tenants, Tenant};

/// `GET /nodes`.
pub(super) async fn nodes(State(state): State<Arc<AppState>>) -> Result<Html<String>, Problem> {
    let nodes = state
        .db(|conn| list_nodes(conn, &NodeQuery::default()))
        .await?;
    let body = html! {
        h1 { "Nodes" }
        @if nodes.is_empty() {
            p { "No nodes: no worker has run on this database (or prune removed them)." }
        } @else {
            table #nodes {
                thead { tr {
                    th.n { "id" } th { "name" } th { "status" } th.n { "heartbeat age" }
                    th.n { "running" } th { "started" } th { "last heartbeat" }
                } }
                tbody {
                    @for node in &nodes {
                        tr {
                            td.n { (node.id) }
                            td { (node.name) }
                            td { (word_badge(node.status.as_str())) }
                            td.n { (age(node.heartbeat_age_secs)) }
                            td.n { (node.running) }
                            td { (time(&node.started_at)) }
                            td { (time(&node.heartbeat_at)) }
                        }
                    }
                }
            }
            p.muted { "A node is silent when its heartbeat is older than the workers' default --dead-after (15s)." }
        }
    };
    Ok(page(&state, "Nodes", Nav::Nodes, Some("/nodes"), body))
}

struct Control {
    domains: Vec<DomainView>,
    paused_keywords: Vec<String>,
    tenants: Vec<Tenant>,
}

/// `GET /domains`.
pub(super) async fn domains(
    State(state): State<Arc<AppState>>,
    Query(notice_query): Query<Notice>,
) -> Result<Html<String>, Problem> {
    let control = state
        .db(|conn| {
            Ok(Control {
                domains: admin::list(conn)?,
                paused_keywords: admin::paused_keywords(conn)?,
                tenants: tenants(conn)?,
            })
        })
        .await?;
    let body = html! {
        h1 { "Domains & tenants" }
        (flash(notice(&notice_query)))
        h2 { "Domains" }
        (domain_table(&state, &control.domains))
        h2 { "Keywords paused on their own" }
        @if control.paused_keywords.is_empty() {
            p.muted { "None. Pause a keyword from the overview." }
        } @else {
            table #paused-keywords {
                tbody {
                    @for keyword in &control.paused_keywords {
                        tr {
                            td { (keyword) }
                            td { (word_badge("paused")) " " (button(&state, "/resume", "resume", "go", &[("name", keyword)])) }
                        }
                    }
                }
            }
        }
        h2 { "Tenants" }
        (tenant_table(&control.tenants))
    };
    Ok(page(
        &state,
        "Domains & tenants",
        Nav::Domains,
        Some("/domains"),
        body,
    ))
}

fn domain_table(state: &AppState, domains: &[DomainView]) -> Markup {
    if domains.is_empty() {
        return html! { p.muted { "No domains: no live node has published its domains, and async_domain has no row." } };
    }
    let opt = |n: Option<usize>| n.map_or_else(|| "—".to_owned(), |n| n.to_string());
    html! {
        table #domains {
            thead { tr {
                th { "domain" } th { "mode" } th { "keywords" } th.n { "queue" } th.n { "timeout" }
                th.n { "nodes" } th.n { "threads" } th.n { "reserved" } th.n { "borrowed" }
                th.n { "running" } th.n { "queued" } th.n { "stuck" } th { "claiming" }
            } }
            tbody {
                @for d in domains {
                    tr data-domain=(d.domain) {
                        td { (d.domain) }
                        td { (d.mode.map(|m| format!("{} {}", m.as_str(), opt(d.per_node))).unwrap_or_default()) }
                        td { (d.keywords.join(", ")) }
                        td.n { (opt(d.queue)) }
                        td.n { (d.timeout_ms.map_or_else(|| "—".to_owned(), |ms| age(ms as f64 / 1000.0))) }
                        td.n { (d.nodes) } td.n { (d.threads) } td.n { (d.reserved) } td.n { (d.borrowed) }
                        td.n { (d.running) } td.n { (d.queued) } td.n { (d.stuck) }
                        td {
                            @if d.paused {
                                (word_badge("paused")) @if d.released { " (released)" } " "
                                (button(state, "/resume", "resume", "go", &[("name", &d.domain)]))
                            } @else {
                                span.muted { "active" } " "
                                (button(state, "/pause", "pause", "stop", &[("name", &d.domain)]))
                            }
                        }
                    }
                }
            }
        }
    }
}

fn tenant_table(tenants: &[Tenant]) -> Markup {
    if tenants.is_empty() {
        return html! { p.muted { "No tenant rows: every tenant is unlimited and weighs 1 (see outbox tenant set)." } };
    }
    let limit = |n: Option<i32>| n.map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
    html! {
        table #tenants {
            thead { tr {
                th { "tenant" } th.n { "queued" } th.n { "max queued" } th.n { "running" }
                th.n { "max running" } th.n { "weight" } th { "updated" } th { "by" }
            } }
            tbody {
                @for t in tenants {
                    tr {
                        td { a href=(format!("/tasks{}", super::layout::query_string(&[("tenant", &t.tenant)]))) { (t.tenant) } }
                        td.n { (t.queued) } td.n { (limit(t.max_queued)) }
                        td.n { (t.running) } td.n { (limit(t.max_running)) }
                        td.n { (t.weight) } td { (t.updated_at) } td { (t.updated_by) }
                    }
                }
            }
        }
    }
}

/// `GET /schedules`.
pub(super) async fn schedules(State(state): State<Arc<AppState>>) -> Result<Html<String>, Problem> {
    let schedules = state.db(list_schedules).await?;
    let body = html! {
        h1 { "Schedules" }
        @if schedules.is_empty() {
            p { "No schedules: no node has run a cron schedule on this database." }
        } @else {
            table #schedules {
                thead { tr {
                    th { "keyword" } th { "expression" } th { "last tick" } th { "its task" }
                    th { "next tick" } th { "since" } th { "updated by" }
                } }
                tbody {
                    @for s in &schedules {
                        tr {
                            td { (s.keyword) }
                            td { code { (s.expression) } }
                            td { (maybe_time(s.last_tick.as_ref())) }
                            td {
                                @if let Some(id) = s.last_task_id {
                                    a href=(format!("/tasks/{id}")) { (id) } " "
                                }
                                @if let Some(state) = s.last_task_state { (badge(state)) }
                            }
                            td { (maybe_time(s.next_tick.as_ref())) }
                            td { (time(&s.since)) }
                            td { (s.updated_by) }
                        }
                    }
                }
            }
        }
    };
    Ok(page(
        &state,
        "Schedules",
        Nav::Schedules,
        Some("/schedules"),
        body,
    ))
}
