//! The frame every page shares (head, style, navigation, auto-refresh) and the small pieces
//! pages are made of: ages, times, state badges, and the buttons' forms.

use axum::response::Html;
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::server::AppState;
use crate::task::TaskState;

/// The six states in the order a task moves through them.
pub(super) const STATES: [TaskState; 6] = [
    TaskState::Blocked,
    TaskState::Pending,
    TaskState::Running,
    TaskState::Done,
    TaskState::Dead,
    TaskState::Cancelled,
];

/// The sections of the navigation bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Nav {
    Overview,
    Dead,
    Tasks,
    Nodes,
    Domains,
    Schedules,
    Audit,
    None,
}

const NAV: [(Nav, &str, &str); 7] = [
    (Nav::Overview, "/", "Overview"),
    (Nav::Dead, "/tasks?state=dead", "Dead"),
    (Nav::Tasks, "/tasks", "Tasks"),
    (Nav::Nodes, "/nodes", "Nodes"),
    (Nav::Domains, "/domains", "Domains & tenants"),
    (Nav::Schedules, "/schedules", "Schedules"),
    (Nav::Audit, "/audit", "Audit"),
];

/// Plain, dense, readable without any script; state colours match the CLI's words.
const STYLE: &str = r#"
:root { --fg:#1d2330; --muted:#5d6677; --line:#dde1e8; --bg:#f6f7f9; --accent:#2456c9; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, "DejaVu Sans", sans-serif; color:var(--fg); background:var(--bg); }
header { background:#1d2330; color:#fff; padding:0 20px; display:flex; align-items:center; gap:24px; }
header .brand { font-weight:700; padding:12px 0; }
header nav a { color:#c9d2e3; text-decoration:none; padding:12px 10px; display:inline-block; }
header nav a.on { color:#fff; border-bottom:3px solid #6f9bff; }
header .mode { margin-left:auto; font-size:12px; color:#c9d2e3; }
main { padding:16px 20px 40px; max-width:1400px; }
h1 { font-size:20px; margin:4px 0 12px; }
h2 { font-size:16px; margin:22px 0 8px; }
table { border-collapse:collapse; background:#fff; border:1px solid var(--line); margin-bottom:8px; }
th, td { padding:5px 10px; border-bottom:1px solid var(--line); text-align:left; vertical-align:top; }
th { background:#eef1f5; font-weight:600; white-space:nowrap; }
td.n, th.n { text-align:right; font-variant-numeric:tabular-nums; }
td.zero { color:#b3b9c4; }
td.err { max-width:560px; font-family:ui-monospace, "DejaVu Sans Mono", monospace; font-size:12px; color:#8a1f1f; word-break:break-word; }
dl.cols { display:grid; grid-template-columns:repeat(3, max-content minmax(150px, 1fr)); gap:4px 16px; background:#fff; border:1px solid var(--line); padding:10px 14px; margin:0; }
dl.cols dt { color:var(--muted); }
dl.cols dd { margin:0; font-variant-numeric:tabular-nums; }
pre { background:#fff; border:1px solid var(--line); padding:10px; white-space:pre-wrap; word-break:break-word; font-size:12px; }
pre.err { color:#8a1f1f; }
a { color:var(--accent); }
.muted { color:var(--muted); }
.badge { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px; font-weight:600; }
.s-pending { background:#e3ecff; color:#1f4bb0; } .s-running { background:#fff1d6; color:#8a5a00; }
.s-done { background:#def5e4; color:#1d6b35; } .s-dead { background:#fde2e2; color:#9b1c1c; }
.s-cancelled { background:#ececec; color:#555; } .s-blocked { background:#efe4fb; color:#6237a0; }
.s-live { background:#def5e4; color:#1d6b35; } .s-silent { background:#fde2e2; color:#9b1c1c; } .s-gone { background:#ececec; color:#555; }
.s-paused { background:#fff1d6; color:#8a5a00; }
form.inline { display:inline; margin:0; }
button { font:inherit; font-size:12px; padding:2px 10px; border-radius:4px; border:1px solid #9aa5b8; background:#fff; cursor:pointer; }
button.go { border-color:#2456c9; color:#2456c9; } button.stop { border-color:#b42318; color:#b42318; }
.flash { background:#def5e4; border:1px solid #a6dcb6; padding:8px 12px; margin-bottom:12px; }
.problem { background:#fde2e2; border:1px solid #f1a9a9; padding:10px 14px; }
form.filter { display:flex; gap:8px; align-items:end; margin-bottom:12px; flex-wrap:wrap; }
form.filter label { display:flex; flex-direction:column; font-size:12px; color:var(--muted); }
form.filter input, form.filter select { font:inherit; padding:3px 6px; }
.pager { margin-top:8px; }
"#;

/// A whole page: `body` in the shared frame, reloaded every [`AppState::refresh_secs`] when
/// `refresh_to` is given (the reload goes there, so that a one-off notice in the query is not
/// shown again); pages with a form to type into are not reloaded.
pub(super) fn page(
    state: &AppState,
    title: &str,
    nav: Nav,
    refresh_to: Option<&str>,
    body: Markup,
) -> Html<String> {
    let mode = if state.actions {
        format!("actions allowed, as {}", state.actor)
    } else {
        "read-only".to_owned()
    };
    frame(
        title,
        nav,
        refresh_to.map(|to| (state.refresh_secs, to)),
        &mode,
        body,
    )
}

/// A page outside any state (the error pages).
pub(super) fn frame(
    title: &str,
    nav: Nav,
    refresh: Option<(u64, &str)>,
    mode: &str,
    body: Markup,
) -> Html<String> {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some((secs, to)) = refresh {
                    meta http-equiv="refresh" content=(format!("{secs}; url={to}"));
                }
                title { (title) " — outbox" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    span.brand { "outbox" }
                    nav {
                        @for (section, href, label) in NAV {
                            a.on[section == nav] href=(href) { (label) }
                        }
                    }
                    span.mode { (mode) }
                }
                main { (body) }
            }
        }
    };
    Html(markup.into_string())
}

/// A duration in seconds as people read it: `42s`, `3m 20s`, `5h 02m`, `2d 04h`.
pub(super) fn age(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// A time as RFC 3339 in UTC, to the second.
pub(super) fn time(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// An optional time, or a dash.
pub(super) fn maybe_time(at: Option<&DateTime<Utc>>) -> String {
    at.map_or_else(|| "—".to_owned(), time)
}

/// A state as a coloured badge.
pub(super) fn badge(state: TaskState) -> Markup {
    html! { span class=(format!("badge s-{state}")) { (state.as_str()) } }
}

/// A coloured badge for any word (`live`, `paused`).
pub(super) fn word_badge(word: &str) -> Markup {
    html! { span class=(format!("badge s-{word}")) { (word) } }
}

/// An error message, shortened to `max` characters for a table cell.
pub(super) fn short(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// A button that `POST`s to `action` with the page's token and `fields`; nothing when the
/// dashboard is read-only.
pub(super) fn button(
    state: &AppState,
    action: &str,
    label: &str,
    class: &str,
    fields: &[(&str, &str)],
) -> Markup {
    if !state.actions {
        return html! {};
    }
    html! {
        form.inline method="post" action=(action) {
            input type="hidden" name="token" value=(state.token);
            @for (name, value) in fields {
                input type="hidden" name=(name) value=(value);
            }
            button class=(class) type="submit" { (label) }
        }
    }
}

/// The notice a page shows after an action redirected to it.
pub(super) fn flash(message: Option<String>) -> Markup {
    html! {
        @if let Some(message) = message {
            p.flash role="status" { (message) }
        }
    }
}

/// `?name=value&…` with the values percent-encoded, or nothing when there is no pair.
pub(super) fn query_string(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let encode = |text: &str| {
        text.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    let pairs: Vec<String> = pairs
        .iter()
        .map(|(name, value)| format!("{}={}", encode(name), encode(value)))
        .collect();
    format!("?{}", pairs.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_are_encoded() {
        assert_eq!(query_string(&[]), "");
        assert_eq!(
            query_string(&[("tenant", "a b&c"), ("after", "12")]),
            "?tenant=a%20b%26c&after=12"
        );
    }

    #[test]
    fn ages_read_plainly() {
        assert_eq!(age(-1.0), "0s");
        assert_eq!(age(42.4), "42s");
        assert_eq!(age(200.0), "3m 20s");
        assert_eq!(age(5.0 * 3600.0 + 120.0), "5h 02m");
        assert_eq!(age(2.0 * 86_400.0 + 4.0 * 3600.0), "2d 04h");
    }

    #[test]
    fn short_cuts_on_characters() {
        assert_eq!(short("héllo", 10), "héllo");
        assert_eq!(short("héllo", 2), "hé…");
    }

    #[test]
    fn text_is_escaped() {
        let html = frame(
            "<script>",
            Nav::None,
            None,
            "read-only",
            html! { (r#""><b>"#) },
        )
        .0;
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert!(html.contains("&quot;&gt;&lt;b&gt;"), "{html}");
    }
}
