//! The checks in front of every request: the `Host` it names, and for a `POST` where it
//! comes from (`Origin`, else `Referer`); the per-process token of the forms; and the
//! response headers that keep pages out of frames and caches.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::problem::Problem;
use super::server::AppState;
use crate::error::{Error, Result};

/// No script, no external anything, no framing; forms post only here.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; \
                   form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A fresh random token (32 bytes from the operating system, hex): one per process, put in
/// every form and required on every `POST`.
pub(super) fn new_token() -> Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|e| Error::InvalidConfig {
        setting: "web token",
        reason: format!("cannot be drawn: the operating system's random source failed: {e}"),
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `given` is `token`, in a time that does not depend on where they differ.
pub(super) fn same_token(given: &str, token: &str) -> bool {
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The middleware: refuses a request to a host that is not this dashboard (421) and a
/// `POST` from elsewhere (403), and adds the security headers to every response.
pub(super) async fn check(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(problem) = admit(&state, request.method(), request.headers()) {
        return secure(problem.into_response());
    }
    secure(next.run(request).await)
}

fn admit(state: &AppState, method: &Method, headers: &HeaderMap) -> Result<(), Problem> {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return Err(Problem::bad_request("the request has no Host header"));
    };
    if !host_allowed(host, &state.allowed_hosts) {
        return Err(Problem::new(
            StatusCode::MISDIRECTED_REQUEST,
            "Unknown host",
            format!(
                "this dashboard does not answer to the host {host:?}: use an IP address or \
                 localhost, or start it with --allow-host NAME"
            ),
        ));
    }
    if method == Method::GET || method == Method::HEAD {
        return Ok(());
    }
    let source = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .and_then(|v| v.to_str().ok());
    match source {
        Some(source) if authority(source).is_some_and(|a| a.eq_ignore_ascii_case(host)) => Ok(()),
        Some(source) => Err(Problem::forbidden(format!(
            "a {method} from {source:?} is not from this dashboard ({host}); cross-site \
             requests are refused"
        ))),
        None => Err(Problem::forbidden(format!(
            "a {method} without an Origin or Referer header is refused (the dashboard's own \
             forms send one)"
        ))),
    }
}

/// `host[:port]` of an `http(s)://host[:port][/…]` origin or referer.
fn authority(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some(&rest[..end]).filter(|a| !a.is_empty())
}

/// Whether a `Host` header names this dashboard: an IP address (a DNS-rebinding page
/// reaches a server through a name of its own, never an address), `localhost`, or one of
/// the names allowed.
pub(super) fn host_allowed(host: &str, allowed: &[String]) -> bool {
    if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        let Some((ip, port)) = rest.split_once(']') else {
            return false;
        };
        return ip.parse::<Ipv6Addr>().is_ok() && (port.is_empty() || valid_port(port, ':'));
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if valid_port(port, '\0') => name,
        Some(_) => return false,
        None => host,
    };
    name.parse::<Ipv4Addr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

fn valid_port(port: &str, prefix: char) -> bool {
    let port = port.strip_prefix(prefix).unwrap_or(port);
    !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
}

fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_compared_whole() {
        let a = new_token().expect("a token");
        let b = new_token().expect("a token");
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(same_token(&a, &a));
        assert!(!same_token(&a, &b));
        assert!(!same_token(&a[..63], &a));
        assert!(!same_token("", &a));
    }

    #[test]
    fn hosts_are_addresses_localhost_or_allowed_names() {
        let allowed = vec!["ops.example".to_owned()];
        for host in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "10.0.0.5:80",
            "[::1]:8080",
            "[::1]",
            "localhost:8080",
            "LOCALHOST",
            "ops.example:443",
            "Ops.Example",
        ] {
            assert!(host_allowed(host, &allowed), "{host}");
        }
        for host in [
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "localhost.evil.example:8080",
            "[::1]x",
            "127.0.0.1:80a",
            "",
        ] {
            assert!(!host_allowed(host, &allowed), "{host}");
        }
    }

    #[test]
    fn origins_and_referers_give_their_authority() {
        assert_eq!(authority("http://127.0.0.1:8080"), Some("127.0.0.1:8080"));
        assert_eq!(
            authority("https://ops.example/tasks/5?x=1"),
            Some("ops.example")
        );
        assert_eq!(authority("null"), None);
        assert_eq!(authority("http://"), None);
        assert_eq!(authority("file:///etc"), None);
    }
}
