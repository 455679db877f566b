//! A database URL's password: masked where the URL is shown, scrubbed from what the driver
//! says, refused where libpq would echo it, kept out of a hook's environment.
//!
//! Where the password is: after the scheme's `://`, the userinfo runs to the last `@` before
//! the query (`?`), or, when no `@` comes before it (a password holding `?`), to the last
//! `@` of all; the password is what follows the userinfo's first `:`. A `password=` query
//! parameter is one too, up to its `&`, and so is a libpq keyword/value string's
//! `password=…` (quoted or not). Where that reading is unsure (an `@` in a query parameter)
//! it takes more than the password, never less: a message then shows less of the URL, but
//! never the secret.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

/// What replaces a password.
const MASK: &str = "***";

/// Displays a URL with each password in it replaced by `***`, for error messages and logs.
pub(crate) struct MaskedUrl<'a>(pub &'a str);

impl fmt::Display for MaskedUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = self.0;
        let mut shown = 0;
        for span in password_spans(url) {
            f.write_str(&url[shown..span.start])?;
            f.write_str(MASK)?;
            shown = span.end;
        }
        f.write_str(&url[shown..])
    }
}

/// The secrets of one database URL, as text may hold them: each password as written in the
/// URL and percent-decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Secrets(Vec<String>);

impl Secrets {
    /// The passwords of `url`, raw and decoded (none for a URL without one).
    pub(crate) fn of(url: &str) -> Secrets {
        let mut secrets: Vec<String> = Vec::new();
        for span in password_spans(url) {
            let raw = &url[span];
            for form in [raw.to_owned(), percent_decoded(raw)] {
                if !form.is_empty() && !secrets.contains(&form) {
                    secrets.push(form);
                }
            }
        }
        // The longest first, so that a password holding another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Secrets(secrets)
    }

    /// The secrets of several URLs (`Secrets::of` each) as one set, the longest first.
    pub(crate) fn union(sets: impl IntoIterator<Item = Secrets>) -> Secrets {
        let mut all: Vec<String> = Vec::new();
        for secret in sets.into_iter().flat_map(|set| set.0) {
            if !all.contains(&secret) {
                all.push(secret);
            }
        }
        all.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Secrets(all)
    }

    /// Whether `text` holds one of the secrets.
    pub(crate) fn found_in(&self, text: &str) -> bool {
        self.0.iter().any(|secret| text.contains(secret.as_str()))
    }

    /// `text` with every secret replaced by `***`: for messages of the driver or the server,
    /// which may quote the URL (libpq quotes a bad percent-escape, `invalid percent-encoded
    /// token: "…"`).
    pub(crate) fn scrub<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if !self.found_in(text) {
            return Cow::Borrowed(text);
        }
        let mut text = text.to_owned();
        for secret in &self.0 {
            text = text.replace(secret.as_str(), MASK);
        }
        Cow::Owned(text)
    }
}

/// Why libpq would misread `url`'s user or password, and echo a piece of the password in its
/// error, if it would; checked before a PostgreSQL URL reaches libpq.
///
/// libpq ends the userinfo at the first `@` or `/`, so an unescaped `@` or `/` in the
/// password makes the rest of it a host, a port or a database name that its errors quote;
/// and it quotes a bad percent-escape whole. The reason names neither.
pub(crate) fn libpq_misreading(url: &str) -> Option<&'static str> {
    let (start, rest) = after_scheme(url)?;
    // Only an `@` before the query is surely the userinfo's (one after it may be a
    // parameter's, `application_name=me@host`).
    let at = rest[..rest.find('?').unwrap_or(rest.len())].rfind('@')?;
    let userinfo = &rest[..at];
    if userinfo.contains(['@', '/']) {
        return Some(
            "its user or password holds an unescaped `@` or `/`; percent-encode them \
             (`@` as %40, `/` as %2F)",
        );
    }
    let query_passwords = query_password_spans(url, start + at);
    let bad_escape = std::iter::once(userinfo)
        .chain(query_passwords.into_iter().map(|span| &url[span]))
        .any(|text| !percent_escapes_are_valid(text));
    bad_escape.then_some(
        "its user or password holds a `%` not followed by two hex digits; write `%` as %25",
    )
}

/// The byte ranges of `url`'s passwords, in order.
fn password_spans(url: &str) -> Vec<Range<usize>> {
    let Some((start, rest)) = after_scheme(url) else {
        return keyword_value_password(url).into_iter().collect();
    };
    let mut spans = Vec::new();
    let query_from = match userinfo_end(rest) {
        Some(at) => {
            if let Some(colon) = rest[..at].find(':') {
                if colon + 1 < at {
                    spans.push(start + colon + 1..start + at);
                }
            }
            start + at
        }
        None => start,
    };
    spans.extend(query_password_spans(url, query_from));
    spans
}

/// Where the text after `scheme://` starts, and that text; `None` for a string that is no
/// such URL (a file path, `sqlite:…`, a keyword/value string).
fn after_scheme(url: &str) -> Option<(usize, &str)> {
    let scheme_end = url.find("://")?;
    let scheme = &url[..scheme_end];
    let is_scheme = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (is_scheme && !scheme.eq_ignore_ascii_case("sqlite"))
        .then(|| (scheme_end + 3, &url[scheme_end + 3..]))
}

/// Where the userinfo of `rest` (the URL after `scheme://`) ends: at its `@`.
fn userinfo_end(rest: &str) -> Option<usize> {
    let query = rest.find('?').unwrap_or(rest.len());
    rest[..query].rfind('@').or_else(|| rest.rfind('@'))
}

/// The values of `password=` parameters in the query of `url`, which starts at the first `?`
/// at or after `from`.
fn query_password_spans(url: &str, from: usize) -> Vec<Range<usize>> {
    let Some(question) = url[from..].find('?') else {
        return Vec::new();
    };
    let mut spans = Vec::new();
    let mut pair_start = from + question + 1;
    for pair in url[pair_start..].split('&') {
        if let Some((key, value)) = pair.split_once('=') {
            if percent_decoded(key) == "password" && !value.is_empty() {
                let value_start = pair_start + key.len() + 1;
                spans.push(value_start..value_start + value.len());
            }
        }
        pair_start += pair.len() + 1;
    }
    spans
}

/// The value of `password` in a libpq keyword/value string (`host=db password='a b'`).
fn keyword_value_password(text: &str) -> Option<Range<usize>> {
    let bytes = text.as_bytes();
    let mut search = 0;
    while let Some(found) = text[search..].find("password") {
        let key = search + found;
        search = key + "password".len();
        if key > 0 && !bytes[key - 1].is_ascii_whitespace() {
            continue;
        }
        let mut i = search;
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if bytes.get(i) != Some(&b'=') {
            continue;
        }
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let start = i;
        if bytes.get(i) == Some(&b'\'') {
            // Quoted: up to the closing quote; a backslash escapes the next character.
            i += 1;
            while i < bytes.len() && bytes[i] != b'\'' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            let end = i.min(bytes.len());
            return (end > start + 1).then_some(start + 1..end);
        }
        while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        return (i > start).then_some(start..i);
    }
    None
}

/// `text` with its valid percent-escapes decoded; an invalid one is kept as written.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether every `%` of `text` starts an escape of two hex digits.
fn percent_escapes_are_valid(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masked(url: &str) -> String {
        MaskedUrl(url).to_string()
    }

    #[test]
    fn the_password_is_masked_whatever_it_holds() {
        assert_eq!(
            masked("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(masked("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(masked("outbox.db"), "outbox.db");
        assert_eq!(masked("sqlite://a:b@c.db"), "sqlite://a:b@c.db");
        // A base64 password holds `/`, `+` and `=`; another holds `@`, `?` or `:`.
        assert_eq!(
            masked("postgres://worker:Se/cret1@h/db"),
            "postgres://worker:***@h/db"
        );
        assert_eq!(
            masked("postgres://w:a+b/c==@h:5432/db?sslmode=disable"),
            "postgres://w:***@h:5432/db?sslmode=disable"
        );
        assert_eq!(masked("mysql://w:p@ss@h/db"), "mysql://w:***@h/db");
        assert_eq!(masked("postgres://w:p?x@h/db"), "postgres://w:***@h/db");
        assert_eq!(masked("postgres://w:a:b@h/db"), "postgres://w:***@h/db");
        assert_eq!(
            masked("postgres://w:p@h/db?application_name=me@there"),
            "postgres://w:***@h/db?application_name=me@there"
        );
        // Several hosts (failover).
        assert_eq!(
            masked("postgres://w:s3/x@h1:5432,h2:5432/db?target_session_attrs=read-write"),
            "postgres://w:***@h1:5432,h2:5432/db?target_session_attrs=read-write"
        );
    }

    #[test]
    fn a_password_parameter_is_masked_and_nothing_after_it() {
        assert_eq!(
            masked("postgres://w@h/db?password=Se/cr%26t&sslmode=disable"),
            "postgres://w@h/db?password=***&sslmode=disable"
        );
        assert_eq!(
            masked("postgres://h/db?sslmode=disable&password=x%2Fy&connect_timeout=3"),
            "postgres://h/db?sslmode=disable&password=***&connect_timeout=3"
        );
        assert_eq!(
            masked("postgres://u:a@h/db?password=b"),
            "postgres://u:***@h/db?password=***"
        );
        assert_eq!(
            masked("postgres://h/db?passwordx=1&xpassword=2"),
            "postgres://h/db?passwordx=1&xpassword=2"
        );
    }

    #[test]
    fn a_keyword_value_password_is_masked_quoted_or_not() {
        assert_eq!(
            masked("host=h password=x user=u"),
            "host=h password=*** user=u"
        );
        assert_eq!(
            masked("host=h password = 'a b\\' c' user=u"),
            "host=h password = '***' user=u"
        );
        assert_eq!(masked("password=s3cret"), "password=***");
        assert_eq!(masked("host=h mypassword=x"), "host=h mypassword=x");
    }

    #[test]
    fn secrets_are_scrubbed_raw_and_decoded() {
        let secrets = Secrets::of("postgres://w:Se%2Fcret%zz@h/db?password=p%40ss&x=1");
        assert_eq!(
            secrets.scrub(r#"invalid percent-encoded token: "Se%2Fcret%zz""#),
            r#"invalid percent-encoded token: "***""#
        );
        assert_eq!(
            secrets.scrub("auth as Se/cret%zz failed"),
            "auth as *** failed"
        );
        assert_eq!(secrets.scrub("p@ss and p%40ss"), "*** and ***");
        assert_eq!(secrets.scrub("nothing here"), "nothing here");
        assert!(Secrets::of("postgres://w@h/db").0.is_empty());
        assert!(Secrets::of("app.db").0.is_empty());
    }

    #[test]
    fn what_libpq_would_misread_is_named_and_not_echoed() {
        for bad in [
            "postgres://w:Se/cret1@h/db",
            "postgres://w:p@ss@h/db",
            "postgres://w:Se%zzcret2@h/db",
            "postgres://w@h/db?sslmode=disable&password=Se%zz",
        ] {
            let reason = libpq_misreading(bad).unwrap_or_else(|| panic!("{bad} is misread"));
            assert!(
                !reason.contains("Se") && !reason.contains("ss@"),
                "{reason}"
            );
        }
        for good in [
            "postgres://w:Se%2Fcret1@h/db",
            "postgres://w:p%40ss@h/db?application_name=a@b",
            "postgres://w:p?x@h/db",
            "postgres://h/db?options=-c%20a@b",
            "postgres://h:5432/db",
        ] {
            assert_eq!(libpq_misreading(good), None, "{good}");
        }
    }
}
