//! The text of a database URL: its scheme, its query parameters, libpq's defaults, and the
//! values of outbox's own parameters.

use std::time::Duration;

use super::super::reply::ReplyTimeout;
use super::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVES_COUNT, DEFAULT_KEEPALIVES_IDLE,
    DEFAULT_KEEPALIVES_INTERVAL, DEFAULT_TCP_USER_TIMEOUT, REPLY_TIMEOUT_PARAMETER,
};

/// The scheme of `text` if it starts like a URL (`scheme:`), other than SQLite's.
pub(super) fn scheme_of(text: &str) -> Option<&str> {
    let colon = text.find(':')?;
    let scheme = &text[..colon];
    let mut chars = scheme.chars();
    let first_is_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    (first_is_letter && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
        .then_some(scheme)
}

/// Whether `text` reads like libpq's `keyword=value …` connection string.
pub(super) fn looks_like_keyword_value(text: &str) -> bool {
    let before_slash = text.split('/').next().unwrap_or(text);
    match before_slash.split_once('=') {
        Some((key, _)) => {
            let key = key.trim();
            !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        None => false,
    }
}

/// `url` with libpq's connect timeout, keepalives and TCP user timeout, each unless the URL
/// sets it.
pub(super) fn with_libpq_defaults(url: &str) -> String {
    let defaults = [
        (
            "connect_timeout",
            DEFAULT_CONNECT_TIMEOUT.as_secs().to_string(),
        ),
        ("keepalives", "1".to_owned()),
        (
            "keepalives_idle",
            DEFAULT_KEEPALIVES_IDLE.as_secs().to_string(),
        ),
        (
            "keepalives_interval",
            DEFAULT_KEEPALIVES_INTERVAL.as_secs().to_string(),
        ),
        ("keepalives_count", DEFAULT_KEEPALIVES_COUNT.to_string()),
        // libpq takes it in milliseconds.
        (
            "tcp_user_timeout",
            DEFAULT_TCP_USER_TIMEOUT.as_millis().to_string(),
        ),
    ];
    let mut url = url.to_owned();
    for (key, value) in defaults {
        if query_value(&url, key).is_none() {
            let separator = if url.contains('?') { '&' } else { '?' };
            url = format!("{url}{separator}{key}={value}");
        }
    }
    url
}

/// The value of query parameter `key` in `url`, if it has one (the first, as given).
pub(super) fn query_value<'u>(url: &'u str, key: &str) -> Option<&'u str> {
    let (_, query) = url.split_once('?')?;
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// `url` without query parameter `key` (every occurrence).
pub(super) fn without_parameter(url: &str, key: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| pair.split('=').next() != Some(key))
        .collect();
    match kept.is_empty() {
        true => base.to_owned(),
        false => format!("{base}?{}", kept.join("&")),
    }
}

/// `on` or `off` (any case), else `None`.
pub(super) fn parse_on_off(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    }
}

/// A `reply_timeout` value: a duration of at least a second, or `0` / `off` for none.
pub(super) fn parse_reply_timeout(value: &str) -> std::result::Result<ReplyTimeout, String> {
    if value == "0" || value.eq_ignore_ascii_case("off") {
        return Ok(ReplyTimeout::Off);
    }
    match humantime::parse_duration(value) {
        Ok(timeout) if timeout >= Duration::from_secs(1) => Ok(ReplyTimeout::Set(timeout)),
        Ok(_) => Err(format!(
            "{REPLY_TIMEOUT_PARAMETER} must be at least 1s (or 0 or off for none), not {value:?}"
        )),
        Err(e) => Err(format!(
            "{REPLY_TIMEOUT_PARAMETER}={value:?} is not a duration ({e}); write it like 90s or 10m"
        )),
    }
}
