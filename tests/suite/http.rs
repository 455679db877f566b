//! A small HTTP/1.1 client over a plain `TcpStream`, for the dashboard's tests and the
//! WebDriver calls of the browser test: every header is the test's to set (a forged
//! `Origin`, a foreign `Host`), and nothing is hidden behind a library's defaults.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long one request may take before its test fails.
const LIMIT: Duration = Duration::from_secs(60);

/// A response, read whole.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request to `addr` (`Host: addr` unless `headers` names another) with
/// `Connection: close`, and reads the whole response.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<(&str, &[u8])>,
) -> Response {
    let mut stream =
        TcpStream::connect(addr).unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    stream.set_read_timeout(Some(LIMIT)).expect("read timeout");
    stream
        .set_write_timeout(Some(LIMIT))
        .expect("write timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let body = body.map(|(content_type, bytes)| {
        head.push_str(&format!(
            "Content-Type: {content_type}\r\nContent-Length: {}\r\n",
            bytes.len()
        ));
        bytes
    });
    if body.is_none() && method != "GET" && method != "HEAD" {
        head.push_str("Content-Length: 0\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("send the request");
    if let Some(bytes) = body {
        stream.write_all(bytes).expect("send the body");
    }
    let raw = read_response(&mut stream)
        .unwrap_or_else(|e| panic!("{method} {path}: cannot read the response: {e}"));
    parse(&raw).unwrap_or_else(|| {
        panic!(
            "{method} {path}: not an HTTP response: {:?}",
            String::from_utf8_lossy(&raw)
        )
    })
}

/// Reads one response: to its `Content-Length`, to the end of its chunks, or to the end of
/// the stream (a server may keep the connection open despite `Connection: close`).
fn read_response(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
            let body = &raw[split + 4..];
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|n| n.trim().parse::<usize>().ok());
            let complete = match length {
                Some(n) => body.len() >= n,
                None if head.contains("transfer-encoding: chunked") => body.ends_with(b"0\r\n\r\n"),
                None => false,
            };
            if complete {
                return Ok(raw);
            }
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(raw);
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

fn parse(raw: &[u8]) -> Option<Response> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body)?;
    }
    Some(Response {
        status,
        headers,
        body: String::from_utf8(body).ok()?,
    })
}

fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&raw[..end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

/// `GET path`.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    request(addr, "GET", path, &[], None)
}

/// `application/x-www-form-urlencoded` of `fields`.
pub fn form(fields: &[(&str, &str)]) -> String {
    let encode = |text: &str| -> String {
        text.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    fields
        .iter()
        .map(|(n, v)| format!("{}={}", encode(n), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// `POST path` of a form, with `headers` (an `Origin`, say).
pub fn post_form(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    fields: &[(&str, &str)],
) -> Response {
    let body = form(fields);
    request(
        addr,
        "POST",
        path,
        headers,
        Some(("application/x-www-form-urlencoded", body.as_bytes())),
    )
}

/// A JSON request (the WebDriver protocol's).
pub fn json(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let text = body.map(|b| b.to_string());
    let response = request(
        addr,
        method,
        path,
        &[],
        text.as_deref()
            .map(|t| ("application/json; charset=utf-8", t.as_bytes())),
    );
    let value = serde_json::from_str(&response.body).unwrap_or_else(|e| {
        panic!(
            "{method} {path}: the answer is not JSON ({e}): {}",
            response.body
        )
    });
    (response.status, value)
}

#[test]
fn chunked_bodies_are_joined() {
    let raw =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
    let response = parse(raw).expect("a response");
    assert_eq!(response.status, 200);
    assert_eq!(response.body, "abcde");
}
