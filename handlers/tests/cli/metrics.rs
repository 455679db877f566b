//! `--metrics-addr` on a real `outbox run` process, scraped while it works; an address in
//! use; `--on-dead` checked; a drain's progress off a terminal; the endpoint's bounds
//! against idle connections, a client that never reads, and the process out of files.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use serde_json::Value;

use crate::binary::{outbox_on, run, wait_until, workdir, Running, STOP_LIMIT, WORK_LIMIT};
use crate::db::tasks_in;
use crate::every_backend;
use crate::scrape::{get, parse, Exposition};
use crate::siege;

/// A port free now (the system's choice; the listener is closed before the worker binds it).
fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Scrapes `addr` if something answers there.
fn try_scrape(addr: SocketAddr) -> Option<Exposition> {
    std::net::TcpStream::connect(addr).ok()?;
    let (status, body) = get(addr, "/metrics");
    (status == 200).then(|| parse(&body))
}

fn sigterm(pid: u32) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child, not yet
    // reaped.
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
}

every_backend! {
    fn run_serves_metrics_that_match_the_table_while_it_works(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["demo", "--enqueue-only", "--tasks", "30"]))
            .expect_code(0);
        let addr = free_addr();
        let mut worker = Running::spawn(outbox_on(db, dir.path()).args([
            "run", "--poll-interval", "50ms", "--metrics-addr", &addr.to_string(),
        ]));
        // Scraped as it works, until its counts reach the table's: each scrape parses.
        let mut scrapes = 0;
        let mut last = None;
        wait_until(WORK_LIMIT, "the metrics to count the 60 demo tasks done", || {
            if let Some(status) = worker.exited() {
                panic!("outbox run exited with {status}");
            }
            let Some(e) = try_scrape(addr) else { return false };
            scrapes += 1;
            let done = |k: &str| {
                e.value("outbox_tasks_finished_total", &[("keyword", k), ("outcome", "done")]).unwrap_or(-1.0)
            };
            let finished = done("points.credit") == 30.0 && done("coupon.grant") == 30.0;
            last = Some(e);
            finished
        });
        assert!(scrapes >= 1);
        let e = last.unwrap();
        assert_eq!(tasks_in(db, "done"), 60, "the counters match the table");
        for keyword in ["points.credit", "coupon.grant"] {
            assert_eq!(e.value("outbox_completion_latency_seconds_count", &[("keyword", keyword)]), Some(30.0));
            assert_eq!(e.value("outbox_tasks_finished_total", &[("keyword", keyword), ("outcome", "dead")]), Some(0.0));
        }
        assert_eq!(e.types["outbox_queue_depth"], "gauge");
        let (status, body) = get(addr, "/healthz");
        assert_eq!(status, 200, "{body}");
        sigterm(worker.pid());
        worker.finish(STOP_LIMIT).expect_code(0).stdout_has("ran 60 tasks");
        // Stopped: nothing listens any more.
        assert!(std::net::TcpStream::connect(addr).is_err());
    }

    fn drain_off_a_terminal_prints_plain_progress_lines(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).args(["demo", "--enqueue-only", "--tasks", "10"]))
            .expect_code(0);
        // The tests' standard output is a pipe, not a terminal: lines, no bar.
        let out = run(outbox_on(db, dir.path()).arg("drain")).expect_code(0);
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(lines.first(), Some(&"draining 20 due tasks"), "{}", out.stdout);
        assert!(lines.last().unwrap().starts_with("drained 20 tasks"), "{}", out.stdout);
        assert!(!out.stdout.contains('\r') && !out.stdout.contains('\x1b'), "{:?}", out.stdout);
        // With --json, standard output is the summary object alone.
        run(outbox_on(db, dir.path()).args(["demo", "--enqueue-only", "--tasks", "5"]))
            .expect_code(0);
        let out = run(outbox_on(db, dir.path()).args(["drain", "--json"])).expect_code(0);
        let json: Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("--json output is not one JSON object ({e}): {}", out.stdout));
        assert_eq!(json["done"], 10, "{json}");
    }
}

#[test]
fn a_metrics_address_in_use_fails_naming_it_and_bad_flags_are_usage_errors() {
    let db = crate::support::TestDb::sqlite();
    let dir = workdir();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    run(outbox_on(&db, dir.path()).args(["drain", "--metrics-addr", &addr]))
        .expect_code(1)
        .stderr_has(&format!("outbox: cannot serve metrics on {addr}: "));
    run(outbox_on(&db, dir.path()).args(["run", "--metrics-addr", "localhost"]))
        .expect_code(2)
        .stderr_has("--metrics-addr");
    run(outbox_on(&db, dir.path()).args(["drain", "--on-dead", ""]))
        .expect_code(2)
        .stderr_has("on-dead must be a command");
    run(outbox_on(&db, dir.path()).args([
        "drain",
        "--on-dead",
        "true",
        "--on-dead-timeout",
        "1ms",
    ]))
    .expect_code(2)
    .stderr_has("on-dead-timeout must be at least 100ms");
    // Nothing was left behind by the refused starts.
    assert_eq!(db.count("SELECT count(*) FROM async_node"), 0);
}

/// A running `outbox run --metrics-addr` on SQLite, its endpoint answering.
fn serving_worker(db: &crate::support::TestDb, dir: &std::path::Path) -> (Running, SocketAddr) {
    let addr = free_addr();
    let mut worker = Running::spawn(outbox_on(db, dir).args([
        "run",
        "--poll-interval",
        "50ms",
        "--metrics-addr",
        &addr.to_string(),
    ]));
    wait_until(WORK_LIMIT, "the endpoint to answer", || {
        if let Some(status) = worker.exited() {
            panic!("outbox run exited with {status}");
        }
        try_scrape(addr).is_some()
    });
    (worker, addr)
}

#[test]
fn healthz_answers_within_a_second_under_idle_connections_and_a_client_that_never_reads() {
    let db = crate::support::TestDb::sqlite();
    let dir = workdir();
    let (worker, addr) = serving_worker(&db, dir.path());
    let pid = worker.pid();
    let threads_before = siege::threads(pid);
    let idle = siege::idle(addr, 300);
    let pipelining = siege::pipelining(addr, "/metrics");
    for _ in 0..3 {
        assert_eq!(
            siege::answered_within(addr, "/healthz", Duration::from_secs(1)),
            Ok(200)
        );
    }
    // A connection is a task, not a thread.
    let threads = siege::threads(pid);
    assert!(
        threads <= threads_before + 2,
        "{threads} threads, {threads_before} before"
    );
    drop((idle, pipelining));
    assert_eq!(
        siege::answered_within(addr, "/healthz", Duration::from_secs(1)),
        Ok(200)
    );
    assert_eq!(
        siege::answered_within(addr, "/metrics", Duration::from_secs(5)),
        Ok(200)
    );
    sigterm(pid);
    worker.finish(STOP_LIMIT).expect_code(0);
}

#[test]
fn the_endpoint_accepts_again_after_the_process_ran_out_of_files() {
    let db = crate::support::TestDb::sqlite();
    let dir = workdir();
    let (worker, addr) = serving_worker(&db, dir.path());
    let pid = worker.pid();
    // The process may open three more files, then accept fails (EMFILE).
    let prlimit = |soft: &str| {
        let status = std::process::Command::new("prlimit")
            .args(["--pid", &pid.to_string(), &format!("--nofile={soft}:")])
            .status()
            .expect("run prlimit (util-linux)");
        assert!(status.success(), "prlimit --nofile={soft}: {status}");
    };
    let soft_before = siege::open_file_limit(pid);
    let limit = siege::open_files(pid) + 3;
    prlimit(&limit.to_string());
    let held = siege::idle(addr, 20);
    wait_until(WORK_LIMIT, "the worker to run out of files", || {
        siege::open_files(pid) >= limit
    });
    // Out of files, the endpoint does not answer.
    assert!(siege::answered_within(addr, "/healthz", Duration::from_secs(1)).is_err());
    drop(held);
    prlimit(&soft_before);
    wait_until(WORK_LIMIT, "the endpoint to answer again", || {
        siege::answered_within(addr, "/healthz", Duration::from_secs(1)) == Ok(200)
    });
    sigterm(pid);
    worker
        .finish(STOP_LIMIT)
        .expect_code(0)
        .stderr_has("metrics: cannot accept a connection");
}
