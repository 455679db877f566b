//! The buttons: retry and cancel a task, pause and resume a domain or keyword. Each is a
//! `POST` of a form carrying the page's token, refused unless the dashboard allows actions;
//! each is the library's audited change, written in the change's transaction as the web
//! user; each answers with a redirect to the page that shows the result (post, redirect,
//! get), or with a page saying why nothing changed.

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Redirect;
use axum::Form;
use serde::Deserialize;

use super::guard::same_token;
use super::layout::query_string;
use super::problem::Problem;
use super::server::AppState;
use super::tasks::parse_id;
use crate::ops;
use crate::task::validate_keyword;

/// The notice a page shows after an action redirected to it: a code and the name of what
/// changed, in the query (`?done=retried&name=42`); never free text, so that a link cannot
/// make the dashboard say something of someone else's.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Notice {
    done: Option<String>,
    name: Option<String>,
}

/// The message of a notice, if it is one of the dashboard's.
pub(super) fn notice(notice: &Notice) -> Option<String> {
    // Task ids, keywords and domain names are all of the keyword alphabet.
    let name = notice
        .name
        .as_deref()
        .filter(|name| validate_keyword(name).is_ok())?;
    let message = match notice.done.as_deref()? {
        "retried" => format!("Task {name} retried."),
        "cancelled" => format!("Task {name} cancelled."),
        "paused" => format!("Paused {name}: nothing of it is claimed; running tasks finish."),
        "resumed" => format!("Resumed {name}."),
        "already-paused" => format!("{name} was already paused: nothing changed."),
        "already-resumed" => format!("{name} was not paused: nothing changed."),
        _ => return None,
    };
    Some(message)
}

/// The fields of the buttons' forms.
#[derive(Debug, Deserialize)]
pub(super) struct ActionForm {
    token: Option<String>,
    name: Option<String>,
    back: Option<String>,
}

/// Lets an action through: actions allowed, a well-formed form, this process's token.
fn admit(
    state: &AppState,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<ActionForm, Problem> {
    if !state.actions {
        return Err(Problem::forbidden(
            "this dashboard is read-only: start it with --allow-actions to retry, cancel, \
             pause and resume",
        ));
    }
    let Form(form) = form.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Form too large",
            format!(
                "the form is larger than the dashboard's forms ({} bytes at most)",
                super::server::MAX_FORM_BYTES
            ),
        ),
        _ => Problem::bad_request(format!("the form is not one of the dashboard's: {e}")),
    })?;
    match &form.token {
        Some(token) if same_token(token, &state.token) => Ok(form),
        _ => Err(Problem::forbidden(
            "the form's token is missing or not this dashboard's (a page from an earlier run \
             of outbox web, or a form from another site): reload the page and try again",
        )),
    }
}

fn done(path: &str, code: &str, name: &str) -> Redirect {
    Redirect::to(&format!(
        "{path}{}",
        query_string(&[("done", code), ("name", name)])
    ))
}

/// `POST /tasks/{id}/retry`.
pub(super) async fn retry(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Redirect, Problem> {
    admit(&state, form)?;
    let id = parse_id(&id)?;
    let actor = state.actor.clone();
    let result = state
        .db(move |conn| ops::retry_task(conn, id, &actor))
        .await?;
    if !result.retried {
        return Err(Problem::conflict(if result.parent_pruned {
            format!(
                "task {id} was not retried: the parent it waited for was pruned, so the \
                 outcome it depended on is gone"
            )
        } else {
            format!(
                "task {id} is {}: only a dead or cancelled task is retried",
                result.state
            )
        }));
    }
    log::info!("web: {} retried task {id}", state.actor);
    Ok(done(&format!("/tasks/{id}"), "retried", &id.to_string()))
}

/// `POST /tasks/{id}/cancel`.
pub(super) async fn cancel(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Redirect, Problem> {
    admit(&state, form)?;
    let id = parse_id(&id)?;
    let actor = state.actor.clone();
    let result = state
        .db(move |conn| ops::cancel_task(conn, id, &actor))
        .await?;
    if !result.cancelled {
        return Err(Problem::conflict(format!(
            "task {id} is already {}: a finished task is not cancelled",
            result.state
        )));
    }
    log::info!("web: {} cancelled task {id}", state.actor);
    Ok(done(&format!("/tasks/{id}"), "cancelled", &id.to_string()))
}

/// `POST /pause` with `name`, a domain or a keyword.
pub(super) async fn pause(
    State(state): State<Arc<AppState>>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Redirect, Problem> {
    pause_or_resume(state, form, true).await
}

/// `POST /resume` with `name`, a domain or a keyword.
pub(super) async fn resume(
    State(state): State<Arc<AppState>>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Redirect, Problem> {
    pause_or_resume(state, form, false).await
}

async fn pause_or_resume(
    state: Arc<AppState>,
    form: Result<Form<ActionForm>, FormRejection>,
    pause: bool,
) -> Result<Redirect, Problem> {
    let form = admit(&state, form)?;
    let Some(name) = form.name.filter(|n| !n.is_empty()) else {
        return Err(Problem::bad_request(
            "the form names no domain or keyword (its field name is empty or missing)",
        ));
    };
    // Back to the page the button was on: only the dashboard's own pages.
    let back = match form.back.as_deref() {
        Some("/") => "/",
        _ => "/domains",
    };
    let actor = state.actor.clone();
    let target = name.clone();
    let changed = state
        .db(move |conn| {
            if pause {
                ops::pause(conn, &target, &actor)
            } else {
                ops::resume(conn, &target, &actor)
            }
        })
        .await?;
    let code = match (pause, changed.changed) {
        (true, true) => "paused",
        (false, true) => "resumed",
        (true, false) => "already-paused",
        (false, false) => "already-resumed",
    };
    if changed.changed {
        log::info!("web: {} {} {name}", state.actor, changed.action);
    }
    Ok(done(back, code, &name))
}
