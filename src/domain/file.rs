//! Domains from a TOML file (`outbox run --domains FILE`) or a flag (`--domain`).
//!
//! ```toml
//! [[domain]]
//! name = "payments"
//! keywords = ["payment.capture", "payment.refund"]
//! reserved = 4        # or: max = 2
//! queue = 16          # optional
//! timeout = "30s"     # optional
//! ```

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{validate_domain, Domain, DomainMode};
use crate::error::{Error, Result};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    domain: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    keywords: Vec<String>,
    max: Option<usize>,
    reserved: Option<usize>,
    queue: Option<usize>,
    timeout: Option<String>,
}

fn bad(reason: String) -> Error {
    Error::InvalidConfig {
        setting: "domains",
        reason,
    }
}

/// Reads the domains of a TOML file; each is checked on its own (their sum is checked
/// against the node's threads when the worker starts). Errors name the file, and the line
/// and column where it does not parse.
pub fn parse_domains_file(path: &Path) -> Result<Vec<Domain>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| bad(format!("file {}: cannot read it: {e}", path.display())))?;
    parse_domains_toml(&text).map_err(|reason| bad(format!("file {}: {reason}", path.display())))
}

/// Parses the text of a domains file; the error (a sentence) says where and what.
pub fn parse_domains_toml(text: &str) -> std::result::Result<Vec<Domain>, String> {
    let file: File = toml::from_str(text).map_err(|e| {
        let at = e.span().map_or_else(String::new, |span| {
            let (line, column) = line_column(text, span.start);
            format!("line {line}, column {column}: ")
        });
        format!("{at}{}", e.message().trim_end())
    })?;
    file.domain
        .into_iter()
        .map(|entry| {
            let mode = match (entry.max, entry.reserved) {
                (Some(n), None) => (DomainMode::Max, n),
                (None, Some(n)) => (DomainMode::Reserved, n),
                _ => {
                    return Err(format!(
                        "domain {:?} must set exactly one of max and reserved",
                        entry.name
                    ))
                }
            };
            let timeout = entry
                .timeout
                .as_deref()
                .map(|t| parse_duration(&entry.name, t))
                .transpose()?;
            let domain = Domain {
                name: entry.name,
                keywords: entry.keywords,
                mode: mode.0,
                threads: mode.1,
                queue: entry.queue,
                timeout,
            };
            validate_domain(&domain).map_err(|e| e.to_string())?;
            Ok(domain)
        })
        .collect()
}

fn parse_duration(domain: &str, text: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("domain {domain:?}: timeout {text:?} is not a duration: {e}"))
}

/// The 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit_once('\n')
        .map_or(before, |(_, last)| last)
        .chars()
        .count()
        + 1;
    (line, column)
}

/// Parses `--domain NAME:KEYWORD,KEYWORD:max=N|reserved=N[:queue=N][:timeout=D]`.
pub fn parse_domain_flag(flag: &str) -> Result<Domain> {
    let fail = |reason: &str| {
        bad(format!(
            "--domain {flag:?}: {reason} (expected NAME:KEYWORD,…:max=N or reserved=N, \
             then optionally :queue=N and :timeout=D)"
        ))
    };
    let mut parts = flag.split(':');
    let (Some(name), Some(keywords)) = (parts.next(), parts.next()) else {
        return Err(fail("too few parts"));
    };
    let mut mode = None;
    let (mut queue, mut timeout) = (None, None);
    for part in parts {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| fail("a part lacks '='"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| fail(&format!("{key} must be a whole number, not {value:?}")))
        };
        match key {
            "max" | "reserved" if mode.is_some() => {
                return Err(fail("sets more than one of max and reserved"))
            }
            "max" => mode = Some((DomainMode::Max, number()?)),
            "reserved" => mode = Some((DomainMode::Reserved, number()?)),
            "queue" => queue = Some(number()?),
            "timeout" => timeout = Some(parse_duration(name, value).map_err(|e| fail(&e))?),
            other => return Err(fail(&format!("unknown setting {other:?}"))),
        }
    }
    let (mode, threads) = mode.ok_or_else(|| fail("sets neither max nor reserved"))?;
    let domain = Domain {
        name: name.to_owned(),
        keywords: keywords.split(',').map(str::to_owned).collect(),
        mode,
        threads,
        queue,
        timeout,
    };
    validate_domain(&domain)?;
    Ok(domain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_parses_into_its_domains() {
        let domains = parse_domains_toml(
            "[[domain]]\nname = \"payments\"\nkeywords = [\"payment.capture\"]\nreserved = 2\n\
             queue = 4\ntimeout = \"30s\"\n\n[[domain]]\nname = \"mail\"\n\
             keywords = [\"mail.send\", \"mail.bulk\"]\nmax = 1\n",
        )
        .unwrap();
        assert_eq!(
            domains,
            vec![
                Domain::reserved("payments", ["payment.capture"], 2)
                    .queue(4)
                    .timeout(Duration::from_secs(30)),
                Domain::max("mail", ["mail.send", "mail.bulk"], 1),
            ]
        );
    }

    #[test]
    fn a_file_that_does_not_parse_names_the_line_and_column() {
        let err = parse_domains_toml("[[domain]]\nname = \"a\"\nkeywords = [\"x\"\nmax = 1\n")
            .unwrap_err();
        assert!(err.starts_with("line 4, column 1: "), "{err}");
        let err =
            parse_domains_toml("[[domain]]\nname = \"a\"\nkeywords = [\"x\"]\nmax = \"two\"\n")
                .unwrap_err();
        assert!(err.starts_with("line 4, column 7: "), "{err}");
        let err = parse_domains_toml(
            "[[domain]]\nname = \"a\"\nkeywords = [\"x\"]\nmax = 1\nreserved = 1\n",
        )
        .unwrap_err();
        assert!(err.contains("exactly one of max and reserved"), "{err}");
        let err = parse_domains_toml(
            "[[domain]]\nname = \"a\"\nkeywords = [\"x\"]\nmax = 1\nthreads = 1\n",
        )
        .unwrap_err();
        assert!(err.starts_with("line 5, column 1: "), "{err}");
    }

    #[test]
    fn a_flag_parses_and_bad_ones_say_why() {
        assert_eq!(
            parse_domain_flag("mail:mail.send,mail.bulk:max=2:queue=3").unwrap(),
            Domain::max("mail", ["mail.send", "mail.bulk"], 2).queue(3)
        );
        for (flag, why) in [
            ("mail", "too few parts"),
            ("mail:mail.send", "neither max nor reserved"),
            ("mail:mail.send:max=2:reserved=1", "more than one"),
            ("mail:mail.send:max=-1", "whole number"),
            ("mail:mail.send:max=1:colour=red", "unknown setting"),
            ("default:mail.send:max=1", "cannot list keywords"),
            ("mail:Mail:max=1", "invalid keyword"),
            ("mail:mail.send:max=0", "at least 1"),
        ] {
            let err = parse_domain_flag(flag).unwrap_err().to_string();
            assert!(err.contains(why), "{flag}: {err}");
        }
    }
}
