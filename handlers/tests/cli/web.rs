//! `outbox web`: the dashboard as the binary serves it — its start-up errors and exit codes,
//! SIGTERM, and the end-to-end test in a real headless browser (load the overview, open a dead
//! task, click retry, see it pending), which also takes the guide's screenshots
//! (docs/guide/src/screenshots/).
//!
//! The screenshots are written to `target/…/tmp/screenshots/` on every run; with
//! `OUTBOX_UPDATE_SCREENSHOTS=1`, the SQLite run also writes them to `docs/screenshots/`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::binary::{
    entries, outbox, outbox_on, run, wait_until, workdir, DOWN_PG_URL, STOP_LIMIT,
};
use crate::db::count_at;
use crate::every_backend;
use crate::siege;
use crate::support::TestDb;
use crate::webdriver::{png_size, Browser, WIDTH};

/// How long `outbox web` may take to say where it listens.
const START_LIMIT: Duration = Duration::from_secs(60);

/// A running `outbox web`, stopped with SIGTERM when dropped.
struct WebProcess {
    child: Child,
    addr: SocketAddr,
}

impl WebProcess {
    fn start(db: &TestDb, cwd: &Path, args: &[&str]) -> WebProcess {
        let mut child = outbox_on(db, cwd)
            .arg("web")
            .args(args)
            .spawn()
            .expect("start outbox web");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(START_LIMIT).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("outbox web said nothing within {START_LIMIT:?}")
        });
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        WebProcess { child, addr }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// SIGTERM, then the exit status (within [`STOP_LIMIT`]).
    fn stop(&mut self) -> ExitStatus {
        let pid = i32::try_from(self.child.id()).expect("a pid");
        // SAFETY: kill(2) on our own child's pid, which it keeps until we wait for it.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill");
        let deadline = Instant::now() + STOP_LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "outbox web ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for WebProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

every_backend! {
    fn a_port_in_use_is_a_clear_start_up_error(db: &TestDb) {
        let dir = workdir();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = taken.local_addr().expect("addr").to_string();
        run(outbox_on(db, dir.path()).args(["web", "--addr", &addr]))
            .expect_code(1)
            .stderr_has(&format!("outbox: cannot listen on {addr}: "));
    }
}

every_backend! {
    fn serves_until_sigterm_then_exits_0(db: &TestDb) {
        let dir = workdir();
        let mut web = WebProcess::start(db, dir.path(), &["--addr", "127.0.0.1:0"]);
        let page = crate::http::get(web.addr, "/");
        assert_eq!(page.status, 200, "{}", page.body);
        assert!(page.body.contains("read-only"), "{}", page.body);
        let status = web.stop();
        assert_eq!(status.code(), Some(0), "{status}");
    }
}

/// 600 idle connections, more than the cap of 512: the process holds the cap's, on the
/// threads it had, and leaves the others in the listen backlog (128 deep: past it, the
/// kernel drops a new connection's SYNs); once they leave, a page answers within a second.
#[test]
fn idle_connections_past_the_cap_are_left_waiting_not_held() {
    let db = TestDb::sqlite();
    let dir = workdir();
    let mut web = WebProcess::start(&db, dir.path(), &["--addr", "127.0.0.1:0"]);
    let pid = web.child.id();
    assert_eq!(
        siege::answered_within(web.addr, "/", Duration::from_secs(5)),
        Ok(200)
    );
    let threads = siege::threads(pid);
    // The probe's connection gone first, so that only the siege's are counted.
    wait_until(STOP_LIMIT, "no connection held before the siege", || {
        siege::accepted_and_waiting(pid, web.addr.port()) == (0, 0)
    });
    let idle = siege::idle(web.addr, 600);
    // The cap's accepted and the rest waiting, once the accept loop has caught up (a reading
    // of /proc may catch it mid-way): every one accepted, as without a cap, never gets there.
    let mut counts = (0, 0);
    let deadline = std::time::Instant::now() + STOP_LIMIT;
    while counts != (512, 88) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        counts = siege::accepted_and_waiting(pid, web.addr.port());
    }
    assert_eq!(counts, (512, 88), "(accepted, waiting)");
    let now = siege::threads(pid);
    assert!(now <= threads + 2, "{now} threads, {threads} before");
    drop(idle);
    wait_until(STOP_LIMIT, "a page within a second again", || {
        siege::answered_within(web.addr, "/", Duration::from_secs(1)) == Ok(200)
    });
    assert_eq!(web.stop().code(), Some(0));
}

#[test]
fn bad_flags_are_bad_usage() {
    let dir = workdir();
    let db = TestDb::sqlite();
    for (args, says) in [
        (
            &["web", "--addr", "localhost"][..],
            "invalid value 'localhost' for '--addr",
        ),
        (
            &["web", "--refresh", "0s"][..],
            "refresh must be between 1s and 1h",
        ),
        (&["web", "--user", ""][..], "user must be 1 to 128 bytes"),
        (&["web", "--allow-host", "a/b"][..], "allow-host"),
    ] {
        run(outbox_on(&db, dir.path()).args(args))
            .expect_code(2)
            .stderr_has(says);
    }
}

#[test]
fn help_names_the_command_and_its_flags() {
    let dir = workdir();
    let top = run(outbox(dir.path()).arg("--help")).expect_code(0);
    assert!(
        top.stdout
            .lines()
            .any(|l| l.trim_start().starts_with("web ")),
        "--help does not list web:\n{}",
        top.stdout
    );
    let help = run(outbox(dir.path()).args(["web", "--help"])).expect_code(0);
    for flag in [
        "--addr",
        "--allow-actions",
        "--user",
        "--allow-host",
        "--refresh",
        "127.0.0.1:8080",
    ] {
        help.stdout_has(flag);
    }
    assert!(entries(dir.path()).is_empty(), "--help touched a database");
}

#[test]
fn a_missing_or_unreachable_database_fails_before_listening() {
    let dir = workdir();
    run(outbox(dir.path()).args(["web", "--addr", "127.0.0.1:0"]))
        .expect_code(1)
        .stderr_has("the SQLite file does not exist");
    assert!(entries(dir.path()).is_empty(), "web created a database");
    run(outbox(dir.path()).args([
        "--database-url",
        DOWN_PG_URL,
        "web",
        "--addr",
        "127.0.0.1:0",
    ]))
    .expect_code(1)
    .stderr_has("cannot connect")
    .stderr_has(DOWN_PG_URL);
}

/// Where a run's screenshots go; also `docs/guide/src/screenshots/` when asked to update them.
fn save_screenshot(backend: &str, name: &str, png: &[u8]) {
    let (width, height) = png_size(png);
    assert_eq!(width, WIDTH, "{name}: {width}x{height}");
    assert!(
        png.len() > 10_000,
        "{name}: a blank page? {} bytes",
        png.len()
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    std::fs::write(dir.join(format!("{backend}-{name}.png")), png).expect("write screenshot");
    if backend == "sqlite" && std::env::var_os("OUTBOX_UPDATE_SCREENSHOTS").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/guide/src/screenshots");
        std::fs::create_dir_all(&docs).expect("docs/guide/src/screenshots");
        std::fs::write(docs.join(format!("{name}.png")), png).expect("write screenshot");
    }
}

/// The id `outbox enqueue` printed (`created task 41 (…)`).
fn enqueued(db: &TestDb, cwd: &Path, args: &[&str]) -> i64 {
    let done = run(outbox_on(db, cwd).arg("enqueue").args(args)).expect_code(0);
    done.stdout
        .split_whitespace()
        .nth(2)
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no task id in {:?}", done.stdout))
}

every_backend! {
    fn in_a_real_browser_retry_on_a_dead_task_makes_it_pending(db: &TestDb) {
        let dir = workdir();
        let cwd = dir.path();
        // A table as a fleet leaves it: the demo's orders done, a coupon whose biz_id is no
        // order number dead after a real drain, mail waiting for a handler, a delayed credit.
        run(outbox_on(db, cwd).args(["demo", "--tasks", "12"])).expect_code(0);
        let dead = enqueued(db, cwd, &["coupon.grant", "ORD-7", "--data", r#"{"user_id":7,"amount_cents":1200}"#, "--tenant", "acme"]);
        let child = enqueued(db, cwd, &["mail.send", "coupon-ORD-7", "--after", &dead.to_string(), "--tenant", "acme"]);
        for n in 1..=3 {
            enqueued(db, cwd, &["mail.send", &format!("welcome-{n}"), "--tenant", "acme"]);
        }
        enqueued(db, cwd, &["points.credit", "9001", "--data", r#"{"user_id":7,"amount_cents":1200}"#, "--delay", "10m"]);
        run(outbox_on(db, cwd).arg("drain")).expect_code(0);
        run(outbox_on(db, cwd).args(["tenant", "set", "acme", "--max-queued", "1000", "--weight", "2"])).expect_code(0);
        assert_eq!(count_at(&db.url_text, &format!("SELECT count(*) FROM async_task WHERE id = {dead} AND state = 'dead'")), 1);

        let mut web = WebProcess::start(db, cwd, &["--addr", "127.0.0.1:0", "--allow-actions", "--user", "e2e@browser"]);
        let browser = Browser::start();
        let backend = db.backend().name();

        browser.goto(&web.url("/"));
        assert_eq!(browser.title(), "Overview — outbox");
        let row = browser.find(r#"tr[data-keyword="coupon.grant"]"#);
        assert!(browser.text(&row).contains("coupon.grant"), "{}", browser.text(&row));
        save_screenshot(backend, "overview", &browser.screenshot());

        // The dead task's page, with its error.
        browser.goto(&web.url(&format!("/tasks/{dead}")));
        browser.wait_for_text(r#"dd[data-column="state"]"#, "dead");
        let error = browser.text(&browser.find("#error"));
        assert!(error.contains("biz_id is not an order number"), "{error}");
        browser.find(&format!(r#"a[href="/tasks/{child}"]"#));
        save_screenshot(backend, "task", &browser.screenshot());

        // From the dead tasks' list, as an operator would: the Dead tab, then retry.
        browser.click(&browser.find(r#"header nav a[href="/tasks?state=dead"]"#));
        browser.wait_for_text("h1", "Dead tasks");
        browser.click(&browser.find(&format!(r#"form[action="/tasks/{dead}/retry"] button"#)));
        browser.wait_for_text(r#"dd[data-column="state"]"#, "pending");
        assert!(browser.url().ends_with(&format!("/tasks/{dead}?done=retried&name={dead}")), "{}", browser.url());
        assert_eq!(browser.text(&browser.find(".flash")), format!("Task {dead} retried."));

        // In the database: pending, failures reset, audited as the web user.
        assert_eq!(count_at(&db.url_text, &format!("SELECT count(*) FROM async_task WHERE id = {dead} AND state = 'pending' AND failures = 0")), 1);
        assert_eq!(count_at(&db.url_text, &format!("SELECT count(*) FROM async_audit WHERE actor = 'e2e@browser' AND action = 'task.retry' AND target = '{dead}'")), 1);
        drop(browser);
        assert_eq!(web.stop().code(), Some(0));
    }
}
