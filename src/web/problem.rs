//! What a request that failed gets: a page saying what failed, with the status that says
//! why (400 bad input, 403 refused, 404 no such thing, 409 not in a state for it, 421 wrong
//! host, 500/503 the database). Nothing was changed.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::layout::{frame, Nav};
use crate::error::Error;

/// A failed request: its status, a title and what failed.
#[derive(Debug)]
pub(super) struct Problem {
    status: StatusCode,
    title: &'static str,
    detail: String,
}

impl Problem {
    pub(super) fn new(status: StatusCode, title: &'static str, detail: impl Into<String>) -> Self {
        Problem {
            status,
            title,
            detail: detail.into(),
        }
    }

    /// 400: input the user can fix.
    pub(super) fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "Bad request", detail)
    }

    /// 403: not allowed here.
    pub(super) fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Refused", detail)
    }

    /// 404: no such thing.
    pub(super) fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "Not found", detail)
    }

    /// 409: the thing is not in a state for the action.
    pub(super) fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "Nothing changed", detail)
    }

    /// 500: a request's work broke down.
    pub(super) fn internal(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "Server error", detail)
    }
}

impl From<Error> for Problem {
    fn from(error: Error) -> Self {
        let (status, title) = match &error {
            Error::TaskNotFound { .. }
            | Error::DomainNotFound { .. }
            | Error::TenantNotFound { .. } => (StatusCode::NOT_FOUND, "Not found"),
            Error::InvalidKeyword { .. }
            | Error::InvalidBizId { .. }
            | Error::InvalidConfig { .. }
            | Error::InvalidDomain { .. }
            | Error::InvalidTask { .. } => (StatusCode::BAD_REQUEST, "Bad request"),
            Error::Pool { .. } | Error::Connect { .. } | Error::NotMigrated { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "Database unavailable")
            }
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "Server error"),
        };
        if status.is_server_error() {
            log::warn!("web: {error}");
        }
        Problem::new(status, title, error.to_string())
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = html! {
            h1 { (self.title) }
            p.problem role="alert" {
                strong { (self.status.as_u16()) } " — " (self.detail)
            }
            p.muted { "Nothing was changed. " a href="/" { "Back to the overview" } }
        };
        let page = frame(self.title, Nav::None, None, "", body);
        (self.status, page).into_response()
    }
}

/// The page of a path that names nothing here.
pub(super) async fn no_such_page(uri: axum::http::Uri) -> Problem {
    Problem::not_found(format!("no page {}", uri.path()))
}

/// The page of a method a path does not take (a `GET` of an action).
pub(super) async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Problem {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method not allowed",
        format!("{method} is not accepted at {}", uri.path()),
    )
}
