//! Scraping a metrics endpoint the way Prometheus does: a plain HTTP GET, and the text
//! exposition format parsed into samples (name, labels, value), checking its grammar as it
//! goes: every sample belongs to a family declared by `# TYPE` before it, label values are
//! quoted and escaped, values are numbers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition: its samples and each family's declared type.
#[derive(Debug, Default)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    pub types: BTreeMap<String, String>,
}

impl Exposition {
    /// The value of the sample `name` whose labels include `labels` (exactly one must match).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<&Sample> = self.matching(name, labels).collect();
        assert!(
            found.len() <= 1,
            "several samples of {name} {labels:?}: {found:?}"
        );
        found.first().map(|s| s.value)
    }

    /// The samples `name` whose labels include `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }
}

/// `GET path` on `addr`: the status code and the body.
pub fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {response:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    if path == "/metrics" && status == 200 {
        assert!(
            // Header names are case-insensitive (hyper writes them in lower case).
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "the Prometheus text format's content type: {head}"
        );
    }
    (status, body.to_owned())
}

/// Scrapes `/metrics` on `addr` and parses it.
pub fn scrape(addr: SocketAddr) -> Exposition {
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    parse(&body)
}

/// Parses the Prometheus text format (version 0.0.4); panics, naming the line, on anything
/// out of its grammar.
pub fn parse(text: &str) -> Exposition {
    let mut exposition = Exposition::default();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                        "unknown type in {line:?}"
                    );
                    let before = exposition.types.insert(name.to_owned(), kind.to_owned());
                    assert!(before.is_none(), "family declared twice: {line:?}");
                }
                (Some("HELP"), Some(_), _) => {}
                _ => panic!("a comment that is neither HELP nor TYPE: {line:?}"),
            }
            continue;
        }
        let sample = parse_sample(line);
        let family = family_of(&sample.name, &exposition.types)
            .unwrap_or_else(|| panic!("sample of no declared family: {line:?}"));
        let kind = &exposition.types[family];
        if kind == "histogram" && sample.name.ends_with("_bucket") {
            assert!(
                sample.labels.contains_key("le"),
                "a bucket without le: {line:?}"
            );
        }
        exposition.samples.push(sample);
    }
    exposition
}

/// The declared family a sample belongs to: its own name, or its name less a suffix that
/// its family's type allows.
fn family_of<'a>(name: &str, types: &'a BTreeMap<String, String>) -> Option<&'a str> {
    if let Some((family, _)) = types.get_key_value(name) {
        return Some(family);
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if let Some((family, kind)) = types.get_key_value(base) {
                if kind == "histogram" || (kind == "summary" && suffix != "_bucket") {
                    return Some(family);
                }
            }
        }
    }
    None
}

fn parse_sample(line: &str) -> Sample {
    let name_end = line
        .find(['{', ' '])
        .unwrap_or_else(|| panic!("no value in {line:?}"));
    let name = &line[..name_end];
    assert!(
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !name.starts_with(|c: char| c.is_ascii_digit()),
        "bad metric name in {line:?}"
    );
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        let end = loop {
            let (start, c) = chars
                .next()
                .unwrap_or_else(|| panic!("unclosed labels: {line:?}"));
            if c == '}' {
                break start;
            }
            if c == ',' {
                continue;
            }
            // A label name, `=`, and a quoted value with \\, \" and \n escapes.
            let mut key = String::from(c);
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            assert_eq!(
                chars.next().map(|(_, c)| c),
                Some('"'),
                "unquoted value: {line:?}"
            );
            let mut value = String::new();
            loop {
                match chars.next().map(|(_, c)| c) {
                    Some('"') => break,
                    Some('\\') => match chars.next().map(|(_, c)| c) {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        other => panic!("bad escape {other:?} in {line:?}"),
                    },
                    Some(c) => value.push(c),
                    None => panic!("unterminated value: {line:?}"),
                }
            }
            assert!(
                labels.insert(key.clone(), value).is_none(),
                "label {key} twice: {line:?}"
            );
        };
        rest = &inner[end + 1..];
    }
    let value = rest
        .trim_start_matches(' ')
        .split(' ')
        .next()
        .unwrap_or_else(|| panic!("no value in {line:?}"));
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v
            .parse()
            .unwrap_or_else(|e| panic!("value {v:?} is not a number ({e}): {line:?}")),
    };
    Sample {
        name: name.to_owned(),
        labels,
        value,
    }
}

#[test]
fn the_parser_reads_labels_escapes_and_histograms() {
    let text = "# HELP a_total A.\n# TYPE a_total counter\na_total{k=\"x\\\"y\",o=\"1\"} 3\n\
                # TYPE h histogram\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.7\nh_count 2\n";
    let e = parse(text);
    assert_eq!(e.value("a_total", &[("k", "x\"y")]), Some(3.0));
    assert_eq!(e.value("h_bucket", &[("le", "+Inf")]), Some(2.0));
    assert_eq!(e.value("h_count", &[]), Some(2.0));
}

#[test]
#[should_panic(expected = "sample of no declared family")]
fn the_parser_refuses_an_undeclared_sample() {
    parse("x 1\n");
}
