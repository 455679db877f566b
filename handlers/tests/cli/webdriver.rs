//! A real headless browser for the dashboard's end-to-end test: Debian's Chromium driven
//! through its chromedriver, over the W3C WebDriver protocol (JSON over HTTP on a loopback
//! port), with the suite's own small HTTP client. `scripts/browser.sh ensure` installs the
//! two packages when they are missing (as root, like `scripts/pg.sh` installs PostgreSQL);
//! without them the test fails, it is never skipped.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http;

/// How long chromedriver may take to answer its first `/status`.
const DRIVER_START: Duration = Duration::from_secs(30);
/// How long a page may take to show what a test waits for.
pub const PAGE_LIMIT: Duration = Duration::from_secs(30);
/// The window's size, which is the screenshots' size.
pub const WIDTH: u32 = 1280;
const HEIGHT: u32 = 800;
/// The key WebDriver names an element's reference with.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// chromedriver's path, from `scripts/browser.sh driver` after `scripts/browser.sh ensure`.
fn driver_path() -> PathBuf {
    let script = repo_root().join("scripts/browser.sh");
    let ensure = Command::new("bash")
        .arg(&script)
        .arg("ensure")
        .stdout(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        ensure.status.success(),
        "the browser test needs Debian's chromium and chromium-driver, and `scripts/browser.sh \
         ensure` could not install them:\n{}",
        String::from_utf8_lossy(&ensure.stderr)
    );
    let found = Command::new("bash")
        .arg(&script)
        .arg("driver")
        .output()
        .expect("scripts/browser.sh driver");
    assert!(
        found.status.success(),
        "chromedriver not found after ensure"
    );
    PathBuf::from(String::from_utf8(found.stdout).expect("a path").trim())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One headless Chromium session, ended (and its driver stopped) when dropped.
pub struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
}

impl Browser {
    pub fn start() -> Browser {
        let path = driver_path();
        let port = free_port();
        let driver = Command::new(&path)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", path.display()));
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut browser = Browser {
            driver,
            addr,
            session: String::new(),
        };
        let deadline = Instant::now() + DRIVER_START;
        loop {
            if std::net::TcpStream::connect(addr).is_ok() {
                let (_, status) = http::json(addr, "GET", "/status", None);
                if status["value"]["ready"] == json!(true) {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not become ready within {DRIVER_START:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // As root Chromium runs only without its sandbox; /dev/shm is small in containers.
        let mut options = json!({"args": [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--hide-scrollbars", format!("--window-size={WIDTH},{HEIGHT}"),
        ]});
        if Path::new("/usr/bin/chromium").exists() {
            options["binary"] = json!("/usr/bin/chromium");
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": options,
        }}});
        let (status, answer) = http::json(addr, "POST", "/session", Some(&capabilities));
        assert_eq!(status, 200, "no browser session: {answer}");
        browser.session = answer["value"]["sessionId"]
            .as_str()
            .expect("a session id")
            .to_owned();
        browser
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let (status, answer) = http::json(self.addr, method, &path, body.as_ref());
        assert_eq!(status, 200, "{method} {path}: {answer}");
        answer["value"].clone()
    }

    /// Loads `url` and waits for it to load.
    pub fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    /// The current page's URL.
    pub fn url(&self) -> String {
        self.call("GET", "/url", None)
            .as_str()
            .expect("a URL")
            .to_owned()
    }

    /// The current page's title.
    pub fn title(&self) -> String {
        self.call("GET", "/title", None)
            .as_str()
            .expect("a title")
            .to_owned()
    }

    /// The elements `css` selects now.
    pub fn find_all(&self, css: &str) -> Vec<String> {
        let found = self.call(
            "POST",
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        );
        found
            .as_array()
            .expect("a list")
            .iter()
            .map(|e| {
                e[ELEMENT]
                    .as_str()
                    .unwrap_or_else(|| panic!("not an element: {e}"))
                    .to_owned()
            })
            .collect()
    }

    /// The one element `css` selects; fails the test when there is none.
    pub fn find(&self, css: &str) -> String {
        self.find_all(css)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no element {css} on {}", self.url()))
    }

    /// The visible text of `element`.
    pub fn text(&self, element: &str) -> String {
        self.call("GET", &format!("/element/{element}/text"), None)
            .as_str()
            .expect("a text")
            .to_owned()
    }

    /// Clicks `element` as a person would.
    pub fn click(&self, element: &str) {
        self.call(
            "POST",
            &format!("/element/{element}/click"),
            Some(json!({})),
        );
    }

    /// Waits until the text of the element `css` selects is `want` (the page may still be
    /// navigating: a missing element is waited for too).
    pub fn wait_for_text(&self, css: &str, want: &str) {
        let deadline = Instant::now() + PAGE_LIMIT;
        loop {
            let now = self.find_all(css).first().map(|e| self.text(e));
            if now.as_deref() == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{css} shows {now:?}, not {want:?}, after {PAGE_LIMIT:?} on {}",
                self.url()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A PNG of the viewport.
    pub fn screenshot(&self) -> Vec<u8> {
        let encoded = self.call("GET", "/screenshot", None);
        base64(encoded.as_str().expect("base64 text"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = std::panic::catch_unwind(|| http::json(self.addr, "DELETE", &path, None));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c:?}"),
        }
    };
    let clean: Vec<u8> = text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let bits = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, c)| acc | value(*c) << (18 - 6 * i));
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// The width and height of a PNG, checked to be one.
pub fn png_size(png: &[u8]) -> (u32, u32) {
    assert!(
        png.len() > 24 && png.starts_with(b"\x89PNG\r\n\x1a\n") && &png[12..16] == b"IHDR",
        "not a PNG"
    );
    let int = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().expect("4 bytes"));
    (int(16), int(20))
}

#[test]
fn base64_decodes() {
    assert_eq!(base64("aGVsbG8="), b"hello");
    assert_eq!(base64("aGk="), b"hi");
    assert_eq!(base64("YWJj"), b"abc");
}
