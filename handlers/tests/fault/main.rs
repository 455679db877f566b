//! The fault suite: real `outbox-fault` worker processes against a real PostgreSQL (and SQLite
//! where the fault applies), while the test kills them, terminates their connections,
//! restarts the server, stops them mid-batch, feeds them poison tasks, overlaps drains and
//! races migrations. After each scenario the invariants of DESIGN.md are checked:
//!
//! - every task is done or dead (none pending, none running: nothing is lost);
//! - exactly one `fault_ledger` row per done `fault.ledger` task, none for any other task
//!   (effects in the database happen exactly once);
//! - every done `fault.external` task is in the external file at least once, and a task that
//!   is there more than once carries a `last_error` (it was rescued, released after a
//!   database error, or failed: at least once, never silently twice);
//! - `failures <= COALESCE(max_attempts, 20)`.
//!
//! Scenarios (PostgreSQL unless a name ends in `_sqlite`): `kill_9_during_a_run`,
//! `connections_terminated_in_a_loop`, `postgres_restarted_mid_run_{fast,immediate}` (on a
//! cluster of their own), `sigterm_mid_batch_*`, `poison_tasks_*` (fail, panic, abort),
//! `poison_hang_*`, `sigterm_past_the_shutdown_timeout`, `overlapping_drains`,
//! `concurrent_migrations_*`.
//!
//! Scenarios run one at a time (they are heavy). `OUTBOX_FAULT_PROFILE=long` runs the long
//! profile (more kills, terminations, restarts, drains, repetitions); unset or `short` is the
//! default. Each scenario appends a block of figures to `$CARGO_TARGET_TMPDIR/fault-report.txt`
//! (truncated by the first scenario of a run) and prints it. Each process's stderr (with
//! `RUST_LOG=info`) goes to a file in the scenario's temporary directory; on failure the
//! tails are printed and the directory is kept.

#[path = "../../../tests/suite/support.rs"]
mod support;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Display;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, Once, PoisonError};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use outbox::{Backend, DatabaseUrl, DbConnection, NewTask};
use serde_json::json;
use support::TestDb;
use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// Profiles and limits
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Profile {
    Short,
    Long,
}

fn profile() -> Profile {
    match std::env::var("OUTBOX_FAULT_PROFILE").as_deref() {
        Ok("long") => Profile::Long,
        Ok("short") | Ok("") | Err(_) => Profile::Short,
        Ok(other) => panic!("OUTBOX_FAULT_PROFILE must be `short` or `long`, not {other:?}"),
    }
}

/// The short profile's value or the long profile's.
fn by_profile<T>(short: T, long: T) -> T {
    match profile() {
        Profile::Short => short,
        Profile::Long => long,
    }
}

/// How often a bounded wait re-checks its condition.
const POLL: Duration = Duration::from_millis(50);
/// How long the workers may take to finish every task of a scenario (generous: debug build,
/// two cores, faults that slow everything down).
fn work_limit() -> Duration {
    by_profile(Duration::from_secs(180), Duration::from_secs(600))
}
/// The workers' `--shutdown-timeout`.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a worker may take to exit after SIGTERM: its shutdown timeout and a margin.
const STOP_LIMIT: Duration = Duration::from_secs(30);
/// How long a one-shot command (`migrate`, `pg.sh`) may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(120);
/// How long the test's own queries keep retrying while the database is unreachable
/// (terminated connections, a restarting server).
const DB_RETRY_LIMIT: Duration = Duration::from_secs(90);
/// The longest acceptable rescue latency after a SIGKILL: dead-after (1.5 s) plus a
/// heartbeat (0.5 s), with a wide margin for a loaded two-core machine.
const RESCUE_LATENCY_LIMIT: Duration = Duration::from_secs(15);
/// How long the workers may go without finishing a single task while work is left: far
/// longer than any backoff or rescue delay in these scenarios.
const STALL_LIMIT: Duration = Duration::from_secs(45);
/// The worker's default `--max-attempts`, which the invariant uses for tasks without one.
const DEFAULT_MAX_ATTEMPTS: i64 = 20;

/// Scenarios run one at a time: each locks this.
static SERIAL: Mutex<()> = Mutex::new(());

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

const REPORT_PATH: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/fault-report.txt");
static REPORT_RESET: Once = Once::new();

/// One scenario's block of figures.
struct Report {
    lines: Vec<(String, String)>,
}

impl Report {
    fn new() -> Report {
        Report { lines: Vec::new() }
    }

    fn add(&mut self, key: &str, value: impl Display) {
        self.lines.push((key.to_owned(), value.to_string()));
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

/// "median M, max X (n samples)" of some durations.
fn latency_summary(samples: &[Duration]) -> String {
    if samples.is_empty() {
        return "no samples".into();
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    let max = sorted[sorted.len() - 1];
    format!(
        "median {}, max {} ({} samples)",
        secs(median),
        secs(max),
        sorted.len()
    )
}

// ---------------------------------------------------------------------------------------------
// Scenarios: serialisation, temporary directory, process logs
// ---------------------------------------------------------------------------------------------

/// One running scenario: holds the serialisation lock, the temporary directory with every
/// process's logs, and the start time. Declare it first, so that it is dropped last: on a
/// panic it prints the tails of the last logs and keeps the directory.
struct Scenario {
    name: String,
    backend: &'static str,
    started: Instant,
    dir: Option<TempDir>,
    logs: RefCell<Vec<PathBuf>>,
    _serial: MutexGuard<'static, ()>,
}

impl Scenario {
    fn start(name: &str, backend: &'static str) -> Scenario {
        let serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        REPORT_RESET.call_once(|| {
            File::create(REPORT_PATH)
                .unwrap_or_else(|e| panic!("cannot create {REPORT_PATH}: {e}"));
        });
        let dir = tempfile::Builder::new()
            .prefix(&format!("outbox-fault-{name}-"))
            .tempdir()
            .expect("temp dir");
        eprintln!(
            "=== {name} ({backend}, profile {:?}) in {}",
            profile(),
            dir.path().display()
        );
        Scenario {
            name: name.to_owned(),
            backend,
            started: Instant::now(),
            dir: Some(dir),
            logs: RefCell::new(Vec::new()),
            _serial: serial,
        }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.as_ref().expect("scenario dir").path().join(file)
    }

    /// The external file the `fault.external` handler appends to.
    fn external_file(&self) -> PathBuf {
        self.path("external.txt")
    }

    /// Starts `outbox-fault ARGS` on `url` with `RUST_LOG=info`, its stdout and stderr going
    /// to files named after `label`.
    fn spawn(&self, label: &str, url: &str, args: &[String]) -> Proc {
        let n = self.logs.borrow().len();
        let stderr = self.path(&format!("{n:03}-{label}.log"));
        let stdout = self.path(&format!("{n:03}-{label}.out"));
        self.logs.borrow_mut().push(stderr.clone());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-fault"));
        cmd.args(args)
            .current_dir(self.path(""))
            .env("DATABASE_URL", url)
            .env("OUTBOX_FAULT_FILE", self.external_file())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).expect("stdout file"))
            .stderr(File::create(&stderr).expect("stderr file"));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start outbox-fault {args:?}: {e}"));
        Proc {
            label: format!(
                "{label} (pid {}: outbox-fault {})",
                child.id(),
                args.join(" ")
            ),
            child,
            stdout,
            stderr,
            status: None,
        }
    }

    /// Appends the scenario's block to the report file and prints it.
    fn publish(&self, report: &Report) {
        let mut text = format!(
            "== {} ({}, profile {:?})\n",
            self.name,
            self.backend,
            profile()
        );
        for (key, value) in &report.lines {
            text.push_str(&format!("  {key:<24} {value}\n"));
        }
        text.push_str(&format!(
            "  {:<24} {}\n\n",
            "wall time",
            secs(self.started.elapsed())
        ));
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(REPORT_PATH)
            .unwrap_or_else(|e| panic!("cannot open {REPORT_PATH}: {e}"));
        file.write_all(text.as_bytes()).expect("write report");
        eprint!("{text}");
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        // The report says so too (the assertion's message is in the test's output).
        let text = format!(
            "== {} ({}, profile {:?})\n  FAILED after {} (the assertion is in the test output)\n\n",
            self.name,
            self.backend,
            profile(),
            secs(self.started.elapsed())
        );
        if let Ok(mut file) = OpenOptions::new().append(true).open(REPORT_PATH) {
            let _ = file.write_all(text.as_bytes());
        }
        let logs = self.logs.borrow();
        eprintln!("--- {} failed; the last process logs:", self.name);
        for log in logs.iter().rev().take(6).rev() {
            eprintln!("--- tail of {}\n{}", log.display(), tail(log, 25));
        }
        if let Some(dir) = self.dir.take() {
            eprintln!("--- kept {} for inspection", dir.keep().display());
        }
    }
}

/// The last `n` lines of a file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

/// A started `outbox-fault` process. Dropping it SIGKILLs it (by its pid) and reaps it if it
/// is still running, so no test leaves a process behind, even when an assertion fails.
struct Proc {
    label: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    status: Option<ExitStatus>,
}

impl Proc {
    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits i32")
    }

    /// Its name in `async_node`: `host:pid`.
    fn node_name(&self) -> String {
        format!("{}:{}", hostname(), self.child.id())
    }

    fn signal(&self, signal: i32) {
        if signal != libc::SIGKILL {
            // A catchable signal before the handlers are installed would kill it outright:
            // wait for the line the worker logs once they are.
            let ready = Instant::now() + COMMAND_LIMIT;
            while !self.stderr_text().contains("SIGINT or SIGTERM stops it") {
                assert!(
                    Instant::now() < ready,
                    "{} never logged that it handles signals\n{}",
                    self.label,
                    tail(&self.stderr, 40)
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        assert!(
            self.status.is_none(),
            "{} already exited ({:?}); not signalling a reaped pid",
            self.label,
            self.status
        );
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped (status is
        // None), so the pid cannot have been reused.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(
            rc,
            0,
            "kill({}, {signal}): {}",
            self.pid(),
            std::io::Error::last_os_error()
        );
    }

    /// The exit status if it has exited.
    fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status
    }

    fn is_running(&mut self) -> bool {
        self.poll().is_none()
    }

    /// Waits up to `limit` for it to exit.
    fn wait_for_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.poll() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILL and reap.
    fn kill9(&mut self) -> ExitStatus {
        if let Some(status) = self.poll() {
            return status;
        }
        self.signal(libc::SIGKILL);
        let status = self.child.wait().expect("wait after SIGKILL");
        self.status = Some(status);
        status
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn stdout_text(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// Fails the test, showing its logs, unless it is still running.
    fn assert_running(&mut self, context: &str) {
        if let Some(status) = self.poll() {
            panic!(
                "{}: {} exited unexpectedly ({status})\n--- stderr tail\n{}",
                context,
                self.label,
                tail(&self.stderr, 40)
            );
        }
    }

    /// Waits up to `limit` for it to exit and fails the test unless it exited with 0.
    fn expect_exit_0(&mut self, limit: Duration) -> Duration {
        let started = Instant::now();
        match self.wait_for_exit(limit) {
            Some(status) if status.code() == Some(0) => started.elapsed(),
            Some(status) => panic!(
                "{} exited with {status}, expected 0\n--- stdout\n{}\n--- stderr tail\n{}",
                self.label,
                self.stdout_text(),
                tail(&self.stderr, 40)
            ),
            None => panic!(
                "{} did not exit within {limit:?}\n--- stderr tail\n{}",
                self.label,
                tail(&self.stderr, 40)
            ),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.poll().is_none() {
            // SAFETY: as in `signal`: our own unreaped child.
            unsafe { libc::kill(self.pid(), libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length; gethostname NUL-terminates within it
    // (or truncates, which the search below handles).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(rc, 0, "gethostname: {}", std::io::Error::last_os_error());
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// `outbox-fault COMMAND` with the suite's worker flags; `overrides` replace a flag's value
/// or add a flag.
fn worker_args(command: &str, overrides: &[(&str, &str)]) -> Vec<String> {
    let mut flags: Vec<(String, String)> = [
        ("--heartbeat", "500ms"),
        ("--dead-after", "1500ms"),
        ("--task-timeout", "2s"),
        ("--shutdown-timeout", "10s"),
    ]
    .iter()
    .map(|(f, v)| ((*f).to_owned(), (*v).to_owned()))
    .collect();
    if command == "run" {
        flags.push(("--poll-interval".into(), "100ms".into()));
    }
    for (flag, value) in overrides {
        match flags.iter_mut().find(|(f, _)| f == flag) {
            Some(entry) => entry.1 = (*value).to_owned(),
            None => flags.push(((*flag).to_owned(), (*value).to_owned())),
        }
    }
    let mut args = vec![command.to_owned()];
    for (flag, value) in flags {
        args.push(flag);
        args.push(value);
    }
    args
}

/// SIGTERMs every worker (each must still be running) and expects each to exit 0 within
/// [`STOP_LIMIT`]; returns the longest time one took.
fn stop_all(workers: &mut [Proc]) -> Duration {
    for worker in workers.iter_mut() {
        worker.assert_running("before SIGTERM");
    }
    for worker in workers.iter() {
        worker.signal(libc::SIGTERM);
    }
    workers
        .iter_mut()
        .map(|w| w.expect_exit_0(STOP_LIMIT))
        .max()
        .unwrap_or_default()
}

/// The worker's log line when its claims start failing (`Worker::run`).
const OUTAGE_LOG: &[&str] = &["retrying with backoff"];
/// The worker's log lines when a task is released because the database failed under it.
const RELEASE_LOG: &[&str] = &["while running it", "the connection broke under its handler"];

/// The tasks whose claim the workers logged as taken over before completion.
fn lost_claim_tasks(procs: &[&Proc]) -> HashSet<i64> {
    procs
        .iter()
        .flat_map(|p| lost_claim_ids(&p.stderr_text()))
        .collect()
}

/// The task ids of a worker log's "task N: …its claim was taken over" lines.
fn lost_claim_ids(log: &str) -> Vec<i64> {
    log.lines()
        .filter(|l| l.contains("its claim was taken over"))
        .filter_map(|l| {
            let rest = &l[l.find("] task ")? + "] task ".len()..];
            rest[..rest.find(':')?].parse().ok()
        })
        .collect()
}

#[test]
fn lost_claim_ids_reads_both_log_lines_of_a_lost_claim() {
    let log = "\
[2026-11-23T15:41:48Z WARN  outbox::worker::execute] task 1784: its claim was taken over before completion; effects rolled back
[2026-11-23T15:41:48Z WARN  outbox::worker::execute] task 17: task fail: its claim was taken over
[2026-11-23T15:41:48Z WARN  outbox::worker::execute] task 1765: could not open its transaction: server closed the connection unexpectedly
";
    assert_eq!(lost_claim_ids(log), vec![1784, 17]);
}

/// Lines of the workers' stderr that contain one of `needles`.
fn log_lines(procs: &[&Proc], needles: &[&str]) -> usize {
    procs
        .iter()
        .map(|p| {
            p.stderr_text()
                .lines()
                .filter(|l| needles.iter().any(|n| l.contains(n)))
                .count()
        })
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Databases
// ---------------------------------------------------------------------------------------------

#[derive(QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct StateCount {
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// The test's own view of a database: one cached connection, reopened and the query retried
/// (for up to [`DB_RETRY_LIMIT`]) when it fails, since the scenarios break connections and
/// restart servers on purpose.
struct Db {
    url: String,
    conn: RefCell<Option<DbConnection>>,
}

impl Db {
    fn new(url: &str) -> Db {
        DatabaseUrl::parse(url).expect("database url");
        Db {
            url: url.to_owned(),
            conn: RefCell::new(None),
        }
    }

    fn try_with<T>(
        &self,
        f: &mut impl FnMut(&mut DbConnection) -> QueryResult<T>,
    ) -> Result<T, String> {
        let mut slot = self.conn.borrow_mut();
        if slot.is_none() {
            let conn = DatabaseUrl::parse(&self.url)
                .expect("database url")
                .connect()
                .map_err(|e| e.to_string())?;
            *slot = Some(conn);
        }
        f(slot.as_mut().expect("connected")).map_err(|e| {
            *slot = None;
            e.to_string()
        })
    }

    fn with<T>(&self, what: &str, mut f: impl FnMut(&mut DbConnection) -> QueryResult<T>) -> T {
        let deadline = Instant::now() + DB_RETRY_LIMIT;
        loop {
            match self.try_with(&mut f) {
                Ok(value) => return value,
                Err(e) if Instant::now() < deadline => {
                    log_retry(what, &e);
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("{what}: {e} (retried for {DB_RETRY_LIMIT:?})"),
            }
        }
    }

    fn exec(&self, sql: &str) {
        self.with(sql, |c| c.batch_execute(sql));
    }

    /// `SELECT (sql) AS n`.
    fn count(&self, sql: &str) -> i64 {
        let query = format!("SELECT ({sql}) AS n");
        self.with(sql, |c| diesel::sql_query(&query).get_result::<N>(c))
            .n
    }

    /// The `n` column of every row of `sql`.
    fn numbers(&self, sql: &str) -> Vec<i64> {
        self.with(sql, |c| diesel::sql_query(sql).load::<N>(c))
            .into_iter()
            .map(|r| r.n)
            .collect()
    }

    fn states(&self) -> BTreeMap<String, i64> {
        let sql = "SELECT state, count(*) AS n FROM async_task GROUP BY state";
        self.with(sql, |c| diesel::sql_query(sql).load::<StateCount>(c))
            .into_iter()
            .map(|r| (r.state, r.n))
            .collect()
    }

    fn in_state(&self, state: &str) -> i64 {
        self.count(&format!(
            "SELECT count(*) FROM async_task WHERE state = '{state}'"
        ))
    }

    /// Tasks neither done nor dead (nor cancelled).
    fn unfinished(&self) -> i64 {
        self.count(
            "SELECT count(*) FROM async_task WHERE state NOT IN ('done', 'dead', 'cancelled')",
        )
    }

    /// The id of the newest node named `name`, if it registered.
    fn node_id(&self, name: &str) -> Option<i64> {
        let name = name.replace('\'', "''");
        let id = self.count(&format!(
            "SELECT COALESCE(max(id), -1) FROM async_node WHERE name = '{name}'"
        ));
        (id >= 0).then_some(id)
    }

    fn create_fault_ledger(&self) {
        self.exec("CREATE TABLE fault_ledger (task_id BIGINT NOT NULL)");
    }

    /// Enqueues `tasks` with the library, in batches.
    fn enqueue(&self, tasks: &[NewTask]) {
        let mut conn = DatabaseUrl::parse(&self.url)
            .expect("database url")
            .connect()
            .expect("connect to enqueue");
        for chunk in tasks.chunks(5_000) {
            outbox::enqueue_batch(&mut conn, chunk).expect("enqueue_batch");
        }
    }
}

/// Logs the first failure of the test's own queries per second at most (they are expected
/// while a scenario breaks connections).
fn log_retry(what: &str, error: &str) {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    if last.map_or(true, |t| t.elapsed() > Duration::from_secs(1)) {
        let what: String = what.chars().take(60).collect();
        eprintln!("(test query `{what}…` failed, retrying: {})", error.trim());
        *last = Some(Instant::now());
    }
}

/// A `fault.*` task with `{"sleep_ms": …}`.
fn task(keyword: &str, biz_id: usize, sleep_ms: u64, max_attempts: i32) -> NewTask {
    NewTask::new(keyword, biz_id.to_string())
        .payload(&json!({ "sleep_ms": sleep_ms }))
        .max_attempts(max_attempts)
}

/// `n` tasks: three quarters `fault.ledger`, one quarter `fault.external`.
fn ledger_and_external(n: usize, sleep_ms: u64, max_attempts: i32) -> Vec<NewTask> {
    (0..n)
        .map(|i| {
            let keyword = if i % 4 == 3 {
                "fault.external"
            } else {
                "fault.ledger"
            };
            task(keyword, i, sleep_ms, max_attempts)
        })
        .collect()
}

/// Polls every [`POLL`] until no task is left unfinished, calling `tick` each time (to check
/// processes, take measurements); fails after `limit`, or as soon as no task has finished for
/// [`STALL_LIMIT`] (the workers are stuck), showing the task states.
fn wait_until_finished(db: &Db, limit: Duration, mut tick: impl FnMut()) -> Duration {
    let started = Instant::now();
    let mut last = (i64::MAX, Instant::now());
    loop {
        tick();
        let unfinished = db.unfinished();
        if unfinished == 0 {
            return started.elapsed();
        }
        if unfinished < last.0 {
            last = (unfinished, Instant::now());
        }
        assert!(
            last.1.elapsed() < STALL_LIMIT,
            "no task finished for {STALL_LIMIT:?} ({:?} after the wait started): the workers are stuck; tasks: {:?}",
            started.elapsed(),
            db.states()
        );
        assert!(
            started.elapsed() < limit,
            "tasks still unfinished after {limit:?}: {:?}",
            db.states()
        );
        std::thread::sleep(POLL);
    }
}

/// Polls every [`POLL`] until `condition` holds; fails after `limit`, showing the task
/// states.
fn wait_until(db: &Db, limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}; tasks: {:?}",
            db.states()
        );
        std::thread::sleep(POLL);
    }
}

/// A database with the migrations applied and the `fault_ledger` table: a [`TestDb`] on the
/// shared test server or a fresh SQLite file.
fn fault_db(backend: Backend) -> (TestDb, Db) {
    let test_db = match backend {
        Backend::Postgres => TestDb::postgres(),
        Backend::Sqlite => TestDb::sqlite(),
    };
    let db = Db::new(&test_db.url_text);
    db.create_fault_ledger();
    (test_db, db)
}

/// The database clock (PostgreSQL), in milliseconds since the epoch.
fn pg_clock_ms(db: &Db) -> i64 {
    db.count("SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)")
}

/// For each worker, the tasks its node finished (done) since `since_ms` by the database
/// clock (PostgreSQL): whether it resumed work after a fault.
fn done_since(db: &Db, workers: &[Proc], since_ms: i64) -> Vec<i64> {
    workers
        .iter()
        .map(|w| {
            let node = db
                .node_id(&w.node_name())
                .unwrap_or_else(|| panic!("{} has no node row", w.label));
            db.count(&format!(
                "SELECT count(*) FROM async_task WHERE owner = {node} AND state = 'done'
                   AND finished_at >= to_timestamp({since_ms} / 1000.0)"
            ))
        })
        .collect()
}

/// The first line of each process's stdout (a worker's summary).
fn summaries(procs: &[Proc]) -> String {
    procs
        .iter()
        .map(|p| {
            p.stdout_text()
                .lines()
                .next()
                .unwrap_or("(nothing)")
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Tasks that must still be left when the last fault hits, so that every worker has work
/// to resume afterwards.
const LEFT_AFTER_LAST_FAULT: i64 = 500;

// ---------------------------------------------------------------------------------------------
// Invariants
// ---------------------------------------------------------------------------------------------

/// What a finished scenario left in the database and the external file.
#[derive(Debug, Default)]
struct Figures {
    tasks: i64,
    done: i64,
    dead: i64,
    states: BTreeMap<String, i64>,
    ledger_rows: i64,
    /// Ledger task ids with more than one row.
    ledger_dups: i64,
    /// Done `fault.ledger` tasks without a row.
    ledger_missing: i64,
    /// Rows for tasks that are not done `fault.ledger` tasks.
    ledger_stray: i64,
    external_lines: usize,
    /// Done `fault.external` tasks not in the file.
    external_missing: usize,
    /// Tasks in the file more than once, and their extra lines.
    external_dup_tasks: usize,
    external_dup_lines: usize,
    /// Of those, tasks with no `last_error` (a silent second run).
    external_dup_unexplained: Vec<i64>,
    /// Tasks of that kind that a worker logged as a claim taken over, in a scenario where a
    /// server crash can lose a claim (see [`Figures::explain_lost_claims`]).
    external_dup_lost_claim: usize,
    /// Ids in the file that are not `fault.external` tasks.
    external_unknown: usize,
    /// Tasks with more failures than their max attempts.
    over_max: i64,
    /// Tasks charged at least one failure, by the start of their `last_error`.
    charged: BTreeMap<String, i64>,
}

impl Figures {
    fn collect(db: &Db, external: &Path) -> Figures {
        let states = db.states();
        let get = |s: &str| states.get(s).copied().unwrap_or(0);
        let mut f = Figures {
            tasks: states.values().sum(),
            done: get("done"),
            dead: get("dead"),
            ledger_rows: db.count("SELECT count(*) FROM fault_ledger"),
            ledger_dups: db.count(
                "SELECT count(*) FROM (SELECT task_id FROM fault_ledger GROUP BY task_id HAVING count(*) > 1) d",
            ),
            ledger_missing: db.count(
                "SELECT count(*) FROM async_task t WHERE t.keyword = 'fault.ledger' AND t.state = 'done'
                   AND NOT EXISTS (SELECT 1 FROM fault_ledger l WHERE l.task_id = t.id)",
            ),
            ledger_stray: db.count(
                "SELECT count(*) FROM fault_ledger l WHERE NOT EXISTS (SELECT 1 FROM async_task t
                   WHERE t.id = l.task_id AND t.keyword = 'fault.ledger' AND t.state = 'done')",
            ),
            over_max: db.count(&format!(
                "SELECT count(*) FROM async_task WHERE failures > COALESCE(max_attempts, {DEFAULT_MAX_ATTEMPTS})"
            )),
            charged: db
                .with("charged failures", |c| {
                    diesel::sql_query(
                        "SELECT CASE
                           WHEN last_error LIKE 'rescued from node %: the node stopped heartbeating'
                             THEN 'rescued: node stopped heartbeating'
                           WHEN last_error LIKE 'rescued from node %: running past its deadline'
                             THEN 'rescued: past its deadline'
                           ELSE COALESCE(substr(last_error, 1, 50), '(none)') END AS state,
                           count(*) AS n
                         FROM async_task WHERE failures > 0 GROUP BY 1",
                    )
                    .load::<StateCount>(c)
                })
                .into_iter()
                .map(|r| (r.state, r.n))
                .collect(),
            states,
            ..Figures::default()
        };

        let text = std::fs::read_to_string(external).unwrap_or_default();
        let mut seen: HashMap<i64, usize> = HashMap::new();
        for line in text.lines() {
            let id: i64 = line
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("external file line {line:?}: {e}"));
            *seen.entry(id).or_default() += 1;
            f.external_lines += 1;
        }
        let external: HashSet<i64> = db
            .numbers("SELECT id AS n FROM async_task WHERE keyword = 'fault.external'")
            .into_iter()
            .collect();
        let done: Vec<i64> = db.numbers(
            "SELECT id AS n FROM async_task WHERE keyword = 'fault.external' AND state = 'done'",
        );
        let without_error: HashSet<i64> = db
            .numbers("SELECT id AS n FROM async_task WHERE keyword = 'fault.external' AND last_error IS NULL")
            .into_iter()
            .collect();
        f.external_missing = done.iter().filter(|id| !seen.contains_key(id)).count();
        f.external_unknown = seen.keys().filter(|id| !external.contains(id)).count();
        for (&id, &times) in &seen {
            if times > 1 {
                f.external_dup_tasks += 1;
                f.external_dup_lines += times - 1;
                if without_error.contains(&id) {
                    f.external_dup_unexplained.push(id);
                }
            }
        }
        f.external_dup_unexplained.sort_unstable();
        f
    }

    /// Accepts a silent second run of the tasks in `lost_claims`: a claim commits without
    /// waiting for its WAL flush (README, "Choices"), so a server crash can lose it; the task
    /// then runs again with no `last_error`, and the worker that ran it first logs that its
    /// claim was taken over. Only for scenarios that crash the server.
    fn explain_lost_claims(&mut self, lost_claims: &HashSet<i64>) {
        let before = self.external_dup_unexplained.len();
        self.external_dup_unexplained
            .retain(|id| !lost_claims.contains(id));
        self.external_dup_lost_claim = before - self.external_dup_unexplained.len();
    }

    /// Tasks neither done nor dead.
    fn lost(&self) -> i64 {
        self.tasks - self.done - self.dead
    }

    /// Every invariant that does not hold.
    fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.lost() != 0 {
            v.push(format!(
                "{} task(s) neither done nor dead: {:?}",
                self.lost(),
                self.states
            ));
        }
        if self.ledger_dups != 0 {
            v.push(format!(
                "{} ledger task(s) with more than one row",
                self.ledger_dups
            ));
        }
        if self.ledger_missing != 0 {
            v.push(format!(
                "{} done fault.ledger task(s) without a ledger row",
                self.ledger_missing
            ));
        }
        if self.ledger_stray != 0 {
            v.push(format!(
                "{} ledger row(s) for tasks that are not done fault.ledger tasks",
                self.ledger_stray
            ));
        }
        if self.external_missing != 0 {
            v.push(format!(
                "{} done fault.external task(s) missing from the external file",
                self.external_missing
            ));
        }
        if self.external_unknown != 0 {
            v.push(format!(
                "{} id(s) in the external file are not fault.external tasks",
                self.external_unknown
            ));
        }
        if !self.external_dup_unexplained.is_empty() {
            v.push(format!(
                "{} task(s) ran their external effect more than once with no last_error: {:?}",
                self.external_dup_unexplained.len(),
                &self.external_dup_unexplained[..self.external_dup_unexplained.len().min(20)]
            ));
        }
        if self.over_max != 0 {
            v.push(format!(
                "{} task(s) with failures > max_attempts",
                self.over_max
            ));
        }
        v
    }

    fn add_to(&self, report: &mut Report) {
        report.add(
            "done / dead / lost",
            format!("{} / {} / {}", self.done, self.dead, self.lost()),
        );
        report.add(
            "ledger rows",
            format!(
                "{} ({} duplicated, {} missing, {} stray)",
                self.ledger_rows, self.ledger_dups, self.ledger_missing, self.ledger_stray
            ),
        );
        report.add(
            "external duplicates",
            format!(
                "{} task(s), {} extra line(s) of {} ({} without last_error, {} more after a claim lost in a crash)",
                self.external_dup_tasks,
                self.external_dup_lines,
                self.external_lines,
                self.external_dup_unexplained.len(),
                self.external_dup_lost_claim
            ),
        );
        report.add("failures > max", self.over_max);
        report.add(
            "charged a failure",
            format!(
                "{} task(s) {:?}",
                self.charged.values().sum::<i64>(),
                self.charged
            ),
        );
    }
}

/// Collects the figures, adds them to the report, publishes it, and fails the test if an
/// invariant does not hold (or, with `expect_no_dead`, if any task died).
fn check_and_publish(sc: &Scenario, db: &Db, report: Report, expect_no_dead: bool) -> Figures {
    check_and_publish_after_crash(sc, db, report, expect_no_dead, &HashSet::new())
}

/// [`check_and_publish`] for a scenario that crashed the server: a silent second run of a
/// task in `lost_claims` is not a violation ([`Figures::explain_lost_claims`]).
fn check_and_publish_after_crash(
    sc: &Scenario,
    db: &Db,
    mut report: Report,
    expect_no_dead: bool,
    lost_claims: &HashSet<i64>,
) -> Figures {
    let mut figures = Figures::collect(db, &sc.external_file());
    figures.explain_lost_claims(lost_claims);
    figures.add_to(&mut report);
    let mut violations = figures.violations();
    if expect_no_dead && figures.dead != 0 {
        violations.push(format!(
            "{} task(s) dead, none expected in this scenario",
            figures.dead
        ));
    }
    report.add(
        "invariants",
        if violations.is_empty() {
            "OK".to_owned()
        } else {
            format!("VIOLATED: {}", violations.join("; "))
        },
    );
    sc.publish(&report);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    figures
}

// ---------------------------------------------------------------------------------------------
// A dedicated PostgreSQL cluster (for restarts)
// ---------------------------------------------------------------------------------------------

const PG_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg.sh");

/// A throwaway cluster of its own (`OUTBOX_PG_DIR=<tempdir> scripts/pg.sh start`), stopped
/// when dropped, also on a panic.
struct Cluster {
    dir: TempDir,
    server_url: String,
}

impl Cluster {
    fn start(sc: &Scenario) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("outbox-fault-pg-")
            .tempdir()
            .expect("cluster temp dir");
        let mut cluster = Cluster {
            dir,
            server_url: String::new(),
        };
        cluster.server_url = cluster.pg_sh(sc, &["start"]).trim().to_owned();
        assert!(
            cluster.server_url.starts_with("postgres://"),
            "pg.sh start printed {:?}",
            cluster.server_url
        );
        cluster
    }

    /// Runs `scripts/pg.sh ARGS` on this cluster, within [`COMMAND_LIMIT`]; returns stdout.
    fn pg_sh(&self, sc: &Scenario, args: &[&str]) -> String {
        let label = format!("pg.sh-{}", args.join("-"));
        let n = sc.logs.borrow().len();
        let stdout = sc.path(&format!("{n:03}-{label}.out"));
        let stderr = sc.path(&format!("{n:03}-{label}.log"));
        sc.logs.borrow_mut().push(stderr.clone());
        let mut child = Command::new("bash")
            .arg(PG_SH)
            .args(args)
            .env("OUTBOX_PG_DIR", self.dir.path())
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).expect("stdout file"))
            .stderr(File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start pg.sh");
        let deadline = Instant::now() + COMMAND_LIMIT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("pg.sh {args:?} did not finish within {COMMAND_LIMIT:?}");
            }
            std::thread::sleep(POLL);
        };
        assert!(
            status.success(),
            "pg.sh {args:?} failed ({status})\n{}",
            tail(&stderr, 30)
        );
        std::fs::read_to_string(&stdout).unwrap_or_default()
    }

    /// Creates a database on this cluster and returns its URL.
    fn create_database(&self, name: &str) -> String {
        let admin = Db::new(&self.server_url);
        admin.exec(&format!("CREATE DATABASE {name}"));
        let base = &self.server_url[..self.server_url.rfind('/').expect("URL path")];
        format!("{base}/{name}")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let out = Command::new("bash")
            .arg(PG_SH)
            .arg("stop")
            .env("OUTBOX_PG_DIR", self.dir.path())
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "pg.sh stop failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("cannot run pg.sh stop: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. SIGKILL during a run
// ---------------------------------------------------------------------------------------------

/// One SIGKILL: the killed node, the tasks running under it right after, and how long until
/// none of them was running under it any more.
struct Kill {
    at: Instant,
    node: Option<i64>,
    tasks: Vec<i64>,
    rescued_after: Option<Duration>,
}

/// Measures the rescue latency of every kill whose tasks are no longer running under the
/// killed node.
fn measure_rescues(db: &Db, kills: &mut [Kill]) {
    for kill in kills.iter_mut() {
        let (Some(node), None) = (kill.node, kill.rescued_after) else {
            continue;
        };
        if kill.tasks.is_empty() {
            continue;
        }
        let ids: Vec<String> = kill.tasks.iter().map(i64::to_string).collect();
        let still = db.count(&format!(
            "SELECT count(*) FROM async_task WHERE owner = {node} AND state = 'running' AND id IN ({})",
            ids.join(",")
        ));
        if still == 0 {
            kill.rescued_after = Some(kill.at.elapsed());
        }
    }
}

#[test]
fn kill_9_during_a_run() {
    let sc = Scenario::start("kill_9_during_a_run", "postgres");
    let (test_db, db) = fault_db(Backend::Postgres);
    let url = test_db.url_text.clone();
    let tasks = by_profile(20_000, 60_000);
    let sleep_ms = 5;
    let target_kills = by_profile(20, 50);
    db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    let args = worker_args("run", &[]);
    let mut spawned = 0;
    let mut spawn = |sc: &Scenario| {
        spawned += 1;
        sc.spawn(&format!("worker{spawned}"), &url, &args)
    };
    let mut workers: Vec<Proc> = (0..3).map(|_| spawn(&sc)).collect();
    let mut killed: Vec<Proc> = Vec::new();
    let mut kills: Vec<Kill> = Vec::new();

    while kills.len() < target_kills {
        // Wait 200–400 ms, measuring rescues meanwhile.
        let until = Instant::now() + Duration::from_millis(fastrand::u64(200..=400));
        while Instant::now() < until {
            measure_rescues(&db, &mut kills);
            std::thread::sleep(POLL);
        }
        for worker in &mut workers {
            worker.assert_running("between kills");
        }
        let unfinished = db.unfinished();
        assert!(
            unfinished > 0,
            "the tasks ran out after {} of {target_kills} kills: raise the task count or sleep_ms",
            kills.len()
        );
        // A random worker, killed at a moment it has tasks running (waiting up to 300 ms
        // for one), so that kills land mid-work however the worker paces its claims.
        let slot = fastrand::usize(..workers.len());
        let node = db.node_id(&workers[slot].node_name());
        if let Some(node) = node {
            let busy = format!(
                "SELECT count(*) FROM async_task WHERE owner = {node} AND state = 'running'"
            );
            let until = Instant::now() + Duration::from_millis(300);
            let mut measured = Instant::now();
            while db.count(&busy) == 0 && Instant::now() < until {
                if measured.elapsed() >= POLL {
                    measure_rescues(&db, &mut kills);
                    measured = Instant::now();
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let status = workers[slot].kill9();
        let at = Instant::now();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
        let victim = std::mem::replace(&mut workers[slot], spawn(&sc));
        let running = node
            .map(|n| {
                db.numbers(&format!(
                    "SELECT id AS n FROM async_task WHERE owner = {n} AND state = 'running'"
                ))
            })
            .unwrap_or_default();
        kills.push(Kill {
            at,
            node,
            tasks: running,
            rescued_after: None,
        });
        killed.push(victim);
    }

    let tail_time = wait_until_finished(&db, work_limit(), || {
        measure_rescues(&db, &mut kills);
        for worker in &mut workers {
            worker.assert_running("while finishing");
        }
    });
    // Nothing is running any more: every kill's tasks have been rescued by now.
    measure_rescues(&db, &mut kills);
    let stop_time = stop_all(&mut workers);

    let latencies: Vec<Duration> = kills.iter().filter_map(|k| k.rescued_after).collect();
    let with_tasks = kills.iter().filter(|k| !k.tasks.is_empty()).count();
    let unregistered = kills.iter().filter(|k| k.node.is_none()).count();
    let mut report = Report::new();
    report.add(
        "tasks",
        format!("{tasks} (3/4 fault.ledger, 1/4 fault.external, sleep_ms {sleep_ms})"),
    );
    report.add(
        "processes",
        format!(
            "3 run workers, {} SIGKILLs, {} restarts ({} killed before registering)",
            kills.len(),
            kills.len(),
            unregistered
        ),
    );
    report.add(
        "tasks in flight at kills",
        format!(
            "{} over {with_tasks} kills",
            kills.iter().map(|k| k.tasks.len()).sum::<usize>()
        ),
    );
    report.add("rescue latency", latency_summary(&latencies));
    report.add(
        "rescue log lines",
        log_lines(
            &killed.iter().chain(&workers).collect::<Vec<_>>(),
            &["rescued from node"],
        ),
    );
    report.add("finish after last kill", secs(tail_time));
    report.add("SIGTERM to exit", secs(stop_time));
    let slow: Vec<String> = latencies
        .iter()
        .filter(|l| **l > RESCUE_LATENCY_LIMIT)
        .map(|l| secs(*l))
        .collect();
    check_and_publish(&sc, &db, report, true);
    assert!(
        with_tasks * 2 >= kills.len(),
        "only {with_tasks} of {} kills landed while the victim had tasks running",
        kills.len()
    );
    assert_eq!(
        latencies.len(),
        with_tasks,
        "not every kill's tasks were rescued"
    );
    assert!(
        slow.is_empty(),
        "rescues slower than {RESCUE_LATENCY_LIMIT:?}: {slow:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Connections terminated in a loop
// ---------------------------------------------------------------------------------------------

#[test]
fn connections_terminated_in_a_loop() {
    let sc = Scenario::start("connections_terminated_in_a_loop", "postgres");
    let (test_db, db) = fault_db(Backend::Postgres);
    let tasks = 5_000;
    let sleep_ms = by_profile(15, 30);
    let target = by_profile(10, 30);
    db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    let args = worker_args("run", &[]);
    let mut workers: Vec<Proc> = (1..=3)
        .map(|i| sc.spawn(&format!("worker{i}"), &test_db.url_text, &args))
        .collect();
    // `db`'s own connection is the terminator's: the statement spares it.
    let terminate =
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()) t WHERE ok";
    let mut terminations = 0;
    let mut backends = 0;
    while terminations < target {
        std::thread::sleep(Duration::from_millis(200));
        for worker in &mut workers {
            worker.assert_running("between terminations");
        }
        assert!(
            db.unfinished() > 0,
            "the tasks ran out after {terminations} of {target} terminations: raise sleep_ms"
        );
        backends += db.count(terminate);
        terminations += 1;
    }
    let last_fault = pg_clock_ms(&db);
    let left = db.unfinished();
    assert!(
        left >= LEFT_AFTER_LAST_FAULT,
        "only {left} tasks left after the last termination: raise sleep_ms"
    );
    let tail_time = wait_until_finished(&db, work_limit(), || {
        for worker in &mut workers {
            worker.assert_running("while finishing");
        }
    });
    let resumed = done_since(&db, &workers, last_fault);
    let all: Vec<&Proc> = workers.iter().collect();
    let panics = log_lines(&all, &["panicked"]);
    let outages = log_lines(&all, OUTAGE_LOG);
    let released = log_lines(&all, RELEASE_LOG);
    let stop_time = stop_all(&mut workers);

    let mut report = Report::new();
    report.add(
        "tasks",
        format!("{tasks} (3/4 fault.ledger, 1/4 fault.external, sleep_ms {sleep_ms})"),
    );
    report.add(
        "processes",
        "3 run workers, 0 restarts (all alive to the end)",
    );
    report.add(
        "terminations",
        format!("{terminations} rounds, {backends} backends terminated"),
    );
    report.add(
        "worker log lines",
        format!("{outages} claim outages, {released} tasks released by a database error, {panics} 'panicked'"),
    );
    report.add(
        "after the last round",
        format!("{left} tasks left; done per worker since: {resumed:?}"),
    );
    report.add("finish after last round", secs(tail_time));
    report.add("SIGTERM to exit", secs(stop_time));
    report.add("worker summaries", summaries(&workers));
    check_and_publish(&sc, &db, report, true);
    assert_eq!(panics, 0, "a worker panicked (see its stderr)");
    assert!(backends > 0, "no backend was ever terminated");
    assert!(
        resumed.iter().all(|&n| n > 0),
        "a worker did no task after the last termination round (done per worker: {resumed:?})"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. PostgreSQL restarted mid-run
// ---------------------------------------------------------------------------------------------

fn postgres_restarted_mid_run(how: &'static str) {
    let sc = Scenario::start(&format!("postgres_restarted_mid_run_{how}"), "postgres");
    let cluster = Cluster::start(&sc);
    let url = cluster.create_database("fault_restart");
    sc.spawn("migrate", &url, &["migrate".to_owned()])
        .expect_exit_0(COMMAND_LIMIT);
    let db = Db::new(&url);
    db.create_fault_ledger();
    let tasks = 5_000;
    let sleep_ms = by_profile(10, 20);
    let restarts = by_profile(1, 2);
    db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    let args = worker_args("run", &[]);
    let mut workers: Vec<Proc> = (1..=2)
        .map(|i| sc.spawn(&format!("worker{i}"), &url, &args))
        .collect();
    let mut downtime = Vec::new();
    let mut unfinished_at_restart = Vec::new();
    for r in 0..restarts {
        // Restart once a share of the work is done, while the rest is still to do.
        let threshold = tasks as i64 * (r + 1) / (restarts + 2);
        wait_until(
            &db,
            work_limit(),
            &format!("{threshold} tasks done"),
            || db.in_state("done") >= threshold,
        );
        let unfinished = db.unfinished();
        assert!(
            unfinished > 0,
            "the tasks ran out before restart {}: raise sleep_ms",
            r + 1
        );
        unfinished_at_restart.push(unfinished);
        let started = Instant::now();
        cluster.pg_sh(&sc, &["restart", how]);
        downtime.push(started.elapsed());
        for worker in &mut workers {
            worker.assert_running("after the restart");
        }
    }
    let last_fault = pg_clock_ms(&db);
    let left = db.unfinished();
    assert!(
        left >= LEFT_AFTER_LAST_FAULT,
        "only {left} tasks left after the last restart: raise sleep_ms"
    );
    let tail_time = wait_until_finished(&db, work_limit(), || {
        for worker in &mut workers {
            worker.assert_running("while finishing");
        }
    });
    let resumed = done_since(&db, &workers, last_fault);
    let all: Vec<&Proc> = workers.iter().collect();
    let outages = log_lines(&all, OUTAGE_LOG);
    let recovered = log_lines(&all, &["database reachable again"]);
    let released = log_lines(&all, RELEASE_LOG);
    let panics = log_lines(&all, &["panicked"]);
    let stop_time = stop_all(&mut workers);
    // An immediate shutdown is a crash: claims whose WAL was not flushed yet are lost.
    let lost_claims = match how {
        "immediate" => lost_claim_tasks(&workers.iter().collect::<Vec<_>>()),
        _ => HashSet::new(),
    };

    let mut report = Report::new();
    report.add(
        "tasks",
        format!("{tasks} (3/4 fault.ledger, 1/4 fault.external, sleep_ms {sleep_ms})"),
    );
    report.add(
        "processes",
        "2 run workers, 0 restarts (all alive to the end)",
    );
    report.add(
        "server restarts",
        format!(
            "{restarts} × pg.sh restart {how} (took {}), unfinished tasks at each: {unfinished_at_restart:?}",
            downtime.iter().map(|d| secs(*d)).collect::<Vec<_>>().join(", ")
        ),
    );
    report.add(
        "worker log lines",
        format!("{outages} claim outages, {recovered} 'database reachable again', {released} tasks released by a database error, {panics} 'panicked'"),
    );
    report.add(
        "after the last restart",
        format!("{left} tasks left; done per worker since: {resumed:?}"),
    );
    report.add("finish after last restart", secs(tail_time));
    report.add("SIGTERM to exit", secs(stop_time));
    report.add("worker summaries", summaries(&workers));
    report.add("tasks of claims lost", lost_claims.len());
    let figures = check_and_publish_after_crash(&sc, &db, report, true, &lost_claims);
    assert_eq!(panics, 0, "a worker panicked (see its stderr)");
    assert!(
        resumed.iter().all(|&n| n > 0),
        "a worker did no task after the last restart (done per worker: {resumed:?})"
    );
    // README: "PostgreSQL restarts: [...] no task is charged a failure for it".
    assert!(
        figures.charged.is_empty(),
        "tasks charged a failure by the restart: {:?}",
        figures.charged
    );
    drop(db);
    drop(cluster);
}

#[test]
fn postgres_restarted_mid_run_fast() {
    postgres_restarted_mid_run("fast");
}

#[test]
fn postgres_restarted_mid_run_immediate() {
    postgres_restarted_mid_run("immediate");
}

// ---------------------------------------------------------------------------------------------
// 4. SIGTERM mid-batch
// ---------------------------------------------------------------------------------------------

fn sigterm_mid_batch(backend: Backend) {
    let sc = Scenario::start("sigterm_mid_batch", backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    let tasks = 100;
    db.enqueue(
        &(0..tasks)
            .map(|i| task("fault.ledger", i, 200, 20))
            .collect::<Vec<_>>(),
    );
    // Two threads and a queue of 48, so that a claim takes a whole page of 50 (a claim
    // takes no more than threads + queue + 1) of which two start; a deadline well past the
    // scenario, so that no task of the page is rescued while it waits.
    let args = worker_args(
        "run",
        &[
            ("--threads", "2"),
            ("--queue", "48"),
            ("--page", "50"),
            ("--task-timeout", "60s"),
        ],
    );
    let mut worker = sc.spawn("worker", &url, &args);
    wait_until(&db, Duration::from_secs(60), "10 tasks running", || {
        worker.assert_running("before SIGTERM");
        db.in_state("running") >= 10
    });
    let node = db
        .node_id(&worker.node_name())
        .expect("the worker registered its node");
    let running_at_signal = db.in_state("running");
    worker.signal(libc::SIGTERM);
    let exit_time = worker.expect_exit_0(SHUTDOWN_TIMEOUT + Duration::from_secs(1));

    // Right after the exit.
    let running_under_node = db.count(&format!(
        "SELECT count(*) FROM async_task WHERE owner = {node} AND state = 'running'"
    ));
    let running = db.in_state("running");
    let node_state = db.count(&format!(
        "SELECT count(*) FROM async_node WHERE id = {node} AND state = 'gone'"
    ));
    let claimed = db.count("SELECT count(*) FROM async_task WHERE claim_token > 0");
    let done = db.in_state("done");
    let released =
        db.count("SELECT count(*) FROM async_task WHERE state = 'pending' AND claim_token > 0");
    let released_marked = db.count(
        "SELECT count(*) FROM async_task WHERE state = 'pending' AND claim_token > 0
           AND (failures <> 0 OR last_error IS NOT NULL)",
    );
    let failures = db.count("SELECT COALESCE(sum(failures), 0) FROM async_task");
    let ledger_missing = db.count(
        "SELECT count(*) FROM async_task t WHERE t.state = 'done'
           AND NOT EXISTS (SELECT 1 FROM fault_ledger l WHERE l.task_id = t.id)",
    );
    let ledger_rows = db.count("SELECT count(*) FROM fault_ledger");

    // Then let a drain finish the rest (without the sleep: on SQLite tasks run one at a
    // time), and check the whole run.
    db.exec(r#"UPDATE async_task SET biz_data = '{"sleep_ms": 0}' WHERE state = 'pending'"#);
    let mut drain = sc.spawn(
        "drain",
        &url,
        &worker_args("drain", &[("--threads", "8"), ("--task-timeout", "60s")]),
    );
    drain.expect_exit_0(work_limit());

    let mut report = Report::new();
    report.add("tasks", format!("{tasks} fault.ledger, sleep_ms 200"));
    report.add(
        "processes",
        "1 run worker (--threads 2 --queue 48 --page 50), SIGTERM; then 1 drain",
    );
    report.add(
        "at SIGTERM",
        format!("{running_at_signal} running (claimed by the worker)"),
    );
    report.add(
        "SIGTERM to exit 0",
        format!(
            "{} (shutdown timeout {})",
            secs(exit_time),
            secs(SHUTDOWN_TIMEOUT)
        ),
    );
    report.add(
        "right after exit",
        format!(
            "{claimed} claimed: {done} done, {released} released ({released_marked} with a failure or error); \
             {running} running; node gone: {}; ledger rows {ledger_rows}",
            node_state == 1
        ),
    );
    check_and_publish(&sc, &db, report, true);
    assert_eq!(running_under_node, 0, "tasks left running under the node");
    assert_eq!(running, 0, "tasks left running");
    assert_eq!(node_state, 1, "the node is not marked gone");
    assert!(released > 0, "SIGTERM released nothing: not mid-batch");
    assert_eq!(
        released_marked, 0,
        "released tasks must have failures 0 and no error"
    );
    assert_eq!(failures, 0, "a failure was counted");
    assert_eq!(
        claimed,
        done + released,
        "claimed tasks neither done nor released"
    );
    assert_eq!(ledger_missing, 0, "done tasks without their ledger row");
    assert_eq!(ledger_rows, done, "ledger rows for tasks that are not done");
}

#[test]
fn sigterm_mid_batch_postgres() {
    sigterm_mid_batch(Backend::Postgres);
}

#[test]
fn sigterm_mid_batch_sqlite() {
    sigterm_mid_batch(Backend::Sqlite);
}

// ---------------------------------------------------------------------------------------------
// 5. Poison tasks
// ---------------------------------------------------------------------------------------------

/// `(state, failures, last_error)` of the tasks with `keyword`.
fn task_rows(db: &Db, keyword: &str) -> Vec<(String, i64, String)> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        state: String,
        #[diesel(sql_type = BigInt)]
        failures: i64,
        #[diesel(sql_type = Text)]
        last_error: String,
    }
    let sql = format!(
        "SELECT state, CAST(failures AS BIGINT) AS failures, COALESCE(last_error, '') AS last_error
         FROM async_task WHERE keyword = '{keyword}' ORDER BY id"
    );
    db.with(&sql, |c| diesel::sql_query(&sql).load::<Row>(c))
        .into_iter()
        .map(|r| (r.state, r.failures, r.last_error))
        .collect()
}

fn assert_dead(db: &Db, keyword: &str, failures: i64, error: &str) {
    for (state, f, last_error) in task_rows(db, keyword) {
        assert_eq!(
            (state.as_str(), f),
            ("dead", failures),
            "{keyword}: {last_error}"
        );
        assert!(
            last_error.contains(error),
            "{keyword}: last_error {last_error:?} lacks {error:?}"
        );
    }
}

fn poison_tasks(backend: Backend) {
    let sc = Scenario::start("poison_tasks", backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    let mut report = Report::new();

    // fail and panic: dead after 3 attempts, the worker alive throughout.
    db.enqueue(&[
        task("fault.fail", 1, 0, 3),
        task("fault.fail", 2, 0, 3),
        task("fault.panic", 1, 0, 3),
        task("fault.panic", 2, 0, 3),
    ]);
    let started = Instant::now();
    let mut worker = sc.spawn("worker-fail-panic", &url, &worker_args("run", &[]));
    wait_until(
        &db,
        Duration::from_secs(30),
        "the fail and panic tasks to be dead",
        || {
            worker.assert_running("while running failing and panicking handlers");
            db.in_state("dead") == 4
        },
    );
    let took = started.elapsed();
    worker.assert_running("after the poison tasks died");
    assert_dead(&db, "fault.fail", 3, "fault.fail always fails");
    assert_dead(&db, "fault.panic", 3, "handler panicked");
    stop_all(std::slice::from_mut(&mut worker));
    report.add(
        "fail, panic",
        format!(
            "2 + 2 tasks, max_attempts 3: dead with failures 3 in {}, one worker alive throughout",
            secs(took)
        ),
    );

    // abort: each attempt kills the process; restarted as systemd would, until dead.
    db.enqueue(&[task("fault.abort", 1, 0, 3)]);
    let started = Instant::now();
    let mut starts = 1;
    let mut worker = sc.spawn("worker-abort-1", &url, &worker_args("run", &[]));
    let mut aborts: Vec<Proc> = Vec::new();
    wait_until(
        &db,
        Duration::from_secs(60),
        "the abort task to be dead",
        || {
            if let Some(status) = worker.poll() {
                assert_eq!(
                    status.signal(),
                    Some(libc::SIGABRT),
                    "{} exited with {status}, expected SIGABRT\n{}",
                    worker.label,
                    tail(&worker.stderr, 20)
                );
                starts += 1;
                let next = sc.spawn(
                    &format!("worker-abort-{starts}"),
                    &url,
                    &worker_args("run", &[]),
                );
                aborts.push(std::mem::replace(&mut worker, next));
            }
            task_rows(&db, "fault.abort")[0].0 == "dead"
        },
    );
    let took = started.elapsed();
    assert_dead(&db, "fault.abort", 3, "rescued from node");
    assert_eq!(
        aborts.len(),
        3,
        "the abort task should kill one process per attempt"
    );
    stop_all(std::slice::from_mut(&mut worker));
    report.add(
        "abort",
        format!(
            "1 task, max_attempts 3: {} process aborts, {} restarts, dead with failures 3 in {}",
            aborts.len(),
            starts - 1,
            secs(took)
        ),
    );

    report.add("tasks", "4 + 1 poison tasks");
    check_and_publish(&sc, &db, report, false);
}

#[test]
fn poison_tasks_postgres() {
    poison_tasks(Backend::Postgres);
}

#[test]
fn poison_tasks_sqlite() {
    poison_tasks(Backend::Sqlite);
}

/// `fault.hang`: rescued past its deadline, twice, then dead. A handler cannot be cancelled,
/// so a worker whose handler outlives `--task-timeout` by a heartbeat exits with status 3 (on
/// SQLite the hung transaction holds the only write lock; on PostgreSQL a connection and the
/// claiming thread); each such exit is checked and the worker restarted, as systemd would.
fn poison_hang(backend: Backend) {
    let sc = Scenario::start("poison_hang", backend.name());
    let (test_db, db) = fault_db(backend);
    let url = test_db.url_text.clone();
    db.enqueue(&[task("fault.hang", 1, 0, 2)]);
    let started = Instant::now();
    let args = worker_args("run", &[("--task-timeout", "1s")]);
    let mut spawned = 2;
    let mut workers: Vec<Proc> = (1..=spawned)
        .map(|i| sc.spawn(&format!("worker-hang-{i}"), &url, &args))
        .collect();
    let mut watchdog_exits = 0;
    // Restarts every worker that exited (each must have been the watchdog); returns how many.
    let mut reap = |workers: &mut Vec<Proc>| {
        let mut exits = 0;
        for worker in workers.iter_mut() {
            if let Some(status) = worker.poll() {
                assert_eq!(
                    status.code(),
                    Some(3),
                    "{} exited otherwise than by the hang watchdog ({status})\n{}",
                    worker.label,
                    tail(&worker.stderr, 40)
                );
                assert!(
                    worker.stderr_text().contains("past its task timeout"),
                    "{} exited 3 without saying why\n{}",
                    worker.label,
                    tail(&worker.stderr, 40)
                );
                exits += 1;
                spawned += 1;
                *worker = sc.spawn(&format!("worker-hang-{spawned}"), &url, &args);
            }
        }
        exits
    };
    wait_until(
        &db,
        Duration::from_secs(60),
        "the hang task to be dead",
        || {
            watchdog_exits += reap(&mut workers);
            task_rows(&db, "fault.hang")[0].0 == "dead"
        },
    );
    let took = started.elapsed();
    assert_dead(&db, "fault.hang", 2, "running past its deadline");
    // The worker hung in the second attempt exits too; then nothing is left hung.
    wait_until(
        &db,
        Duration::from_secs(30),
        "both hung workers to exit",
        || {
            watchdog_exits += reap(&mut workers);
            watchdog_exits >= 2
        },
    );
    let stop_time = stop_all(&mut workers);
    let mut report = Report::new();
    report.add("tasks", "1 fault.hang, max_attempts 2");
    report.add(
        "hang",
        format!(
            "--task-timeout 1s: dead via deadline rescue in {}; {watchdog_exits} workers exited 3 \
             (hang watchdog) and were restarted",
            secs(took)
        ),
    );
    report.add("SIGTERM to exit", secs(stop_time));
    check_and_publish(&sc, &db, report, false);
}

#[test]
fn poison_hang_postgres() {
    poison_hang(Backend::Postgres);
}

#[test]
fn poison_hang_sqlite() {
    poison_hang(Backend::Sqlite);
}

// ---------------------------------------------------------------------------------------------
// 5b. SIGTERM while a handler hangs: the shutdown timeout
// ---------------------------------------------------------------------------------------------

/// README: "running handlers get `--shutdown-timeout`; [...] past the timeout the process
/// exits (status 1) and rescue recovers what was still running". Checked for `drain` and
/// `run`, each holding a hung handler when SIGTERMed.
#[test]
fn sigterm_past_the_shutdown_timeout() {
    let sc = Scenario::start("sigterm_past_the_shutdown_timeout", "postgres");
    let (test_db, db) = fault_db(Backend::Postgres);
    let url = test_db.url_text.clone();
    let timeout = Duration::from_secs(2);
    let mut report = Report::new();
    let mut failures = Vec::new();
    for (n, command) in ["drain", "run"].into_iter().enumerate() {
        db.enqueue(&[task("fault.hang", n, 0, 2)]);
        let mut worker = sc.spawn(
            command,
            &url,
            &worker_args(
                command,
                &[("--shutdown-timeout", "2s"), ("--task-timeout", "60s")],
            ),
        );
        wait_until(&db, Duration::from_secs(30), "the hang task to run", || {
            worker.assert_running("before SIGTERM");
            db.count(&format!(
                "SELECT count(*) FROM async_task WHERE biz_id = '{n}' AND state = 'running'"
            )) == 1
        });
        // Let the handler start (the claim commits just before it).
        std::thread::sleep(Duration::from_millis(300));
        let node = db.node_id(&worker.node_name()).expect("node registered");
        worker.signal(libc::SIGTERM);
        let started = Instant::now();
        let status = worker.wait_for_exit(timeout + Duration::from_secs(8));
        let took = started.elapsed();
        let gone = db.count(&format!(
            "SELECT count(*) FROM async_node WHERE id = {node} AND state = 'gone'"
        ));
        let outcome = match status {
            Some(status) => format!("exited {status} after {}", secs(took)),
            None => {
                worker.kill9();
                format!("still running {} after SIGTERM; SIGKILLed", secs(took))
            }
        };
        report.add(
            &format!("{command} + hung handler"),
            format!(
                "SIGTERM with --shutdown-timeout 2s: {outcome}; node gone: {}",
                gone == 1
            ),
        );
        if status.and_then(|s| s.code()) != Some(1) || gone != 1 {
            failures.push(format!(
                "`{command}`: {outcome}, node gone: {} (expected: exit status 1 about 2s after SIGTERM, node gone)",
                gone == 1
            ));
        }
    }
    sc.publish(&report);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// 6. Overlapping drains
// ---------------------------------------------------------------------------------------------

#[test]
fn overlapping_drains() {
    let sc = Scenario::start("overlapping_drains", "postgres");
    let (test_db, db) = fault_db(Backend::Postgres);
    let tasks = by_profile(5_000, 20_000);
    let sleep_ms = by_profile(10, 30);
    let target = by_profile(5, 15);
    db.enqueue(&ledger_and_external(tasks, sleep_ms, 20));

    let args = worker_args("drain", &[]);
    let mut drains: Vec<Proc> = Vec::new();
    let mut overlaps = Vec::new();
    loop {
        if !drains.is_empty() {
            let running = drains
                .iter_mut()
                .filter_map(|d| d.is_running().then_some(()))
                .count();
            let unfinished = db.unfinished();
            assert!(
                running > 0 && unfinished > 0,
                "drain {} would not overlap ({running} drains running, {unfinished} tasks left): raise tasks or sleep_ms",
                drains.len() + 1
            );
            overlaps.push(running);
        }
        drains.push(sc.spawn(
            &format!("drain{}", drains.len() + 1),
            &test_db.url_text,
            &args,
        ));
        if drains.len() == target {
            break;
        }
        std::thread::sleep(Duration::from_millis(1000));
        for drain in &mut drains {
            if let Some(status) = drain.poll() {
                assert_eq!(
                    status.code(),
                    Some(0),
                    "{} failed: {status}\n{}",
                    drain.label,
                    tail(&drain.stderr, 30)
                );
            }
        }
    }
    let started = Instant::now();
    for drain in &mut drains {
        drain.expect_exit_0(work_limit());
    }
    let last_exit = started.elapsed();
    // Every drain works until nothing is due: once all have exited, nothing is left.
    let left = db.unfinished();
    let summaries: Vec<String> = drains
        .iter()
        .map(|d| d.stdout_text().lines().next().unwrap_or("").to_owned())
        .collect();

    let mut report = Report::new();
    report.add(
        "tasks",
        format!("{tasks} (3/4 fault.ledger, 1/4 fault.external, sleep_ms {sleep_ms})"),
    );
    report.add(
        "processes",
        format!("{target} drains started ~1 s apart, all exit 0; drains already running at each start: {overlaps:?}"),
    );
    report.add("last exit after last start", secs(last_exit));
    report.add("unfinished after all exited", left);
    for (i, summary) in summaries.iter().enumerate() {
        report.add(&format!("drain{}", i + 1), summary);
    }
    check_and_publish(&sc, &db, report, true);
    assert_eq!(left, 0, "tasks left after every drain exited");
}

// ---------------------------------------------------------------------------------------------
// 7. Concurrent migrations
// ---------------------------------------------------------------------------------------------

/// Migration directories of a backend's tree.
fn migration_count(backend: Backend) -> i64 {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../migrations")
        .join(backend.name());
    let count = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_dir()))
        .count();
    assert!(count > 0, "no migrations in {}", dir.display());
    i64::try_from(count).expect("count")
}

/// A new empty PostgreSQL database on the test server, dropped when this is dropped.
struct EmptyPgDatabase {
    name: String,
    url: String,
}

impl EmptyPgDatabase {
    fn create(n: usize) -> EmptyPgDatabase {
        let server = support::pg_server_url();
        let name = format!("outbox_fault_migrate_{}_{n}", std::process::id());
        let admin = Db::new(server);
        admin.exec(&format!("DROP DATABASE IF EXISTS {name}"));
        admin.exec(&format!("CREATE DATABASE {name}"));
        let base = &server[..server.rfind('/').expect("URL path")];
        EmptyPgDatabase {
            url: format!("{base}/{name}"),
            name,
        }
    }
}

impl Drop for EmptyPgDatabase {
    fn drop(&mut self) {
        if let Ok(mut admin) = DatabaseUrl::parse(support::pg_server_url())
            .expect("url")
            .connect()
        {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

fn concurrent_migrations(backend: Backend) {
    let sc = Scenario::start("concurrent_migrations", backend.name());
    let repetitions = by_profile(3, 10);
    let expected = migration_count(backend);
    let mut took = Vec::new();
    for rep in 0..repetitions {
        let pg = (backend == Backend::Postgres).then(|| EmptyPgDatabase::create(rep));
        let url = match &pg {
            Some(pg) => pg.url.clone(),
            None => sc
                .path(&format!("migrate-{rep}.db"))
                .to_str()
                .expect("utf-8 path")
                .to_owned(),
        };
        let started = Instant::now();
        let mut procs: Vec<Proc> = (1..=5)
            .map(|i| sc.spawn(&format!("migrate{rep}-{i}"), &url, &["migrate".to_owned()]))
            .collect();
        for p in &mut procs {
            p.expect_exit_0(COMMAND_LIMIT);
        }
        took.push(started.elapsed());
        let applied = procs
            .iter()
            .filter(|p| p.stdout_text().contains("applied"))
            .count();
        let up_to_date = procs
            .iter()
            .filter(|p| p.stdout_text().contains("schema up to date"))
            .count();
        let db = Db::new(&url);
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 0);
        assert_eq!(
            db.count("SELECT count(*) FROM __diesel_schema_migrations"),
            expected,
            "repetition {rep}: schema migration rows"
        );
        assert_eq!(
            (applied, up_to_date),
            (1, 4),
            "repetition {rep}: exactly one process applies, the others find the schema up to date: {:?}",
            procs.iter().map(Proc::stdout_text).collect::<Vec<_>>()
        );
    }
    let mut report = Report::new();
    report.add(
        "runs",
        format!(
            "{repetitions} fresh empty databases × 5 concurrent `migrate`: all exit 0, one applies, four up to date, {expected} migration row(s)"
        ),
    );
    report.add("time per run", latency_summary(&took));
    sc.publish(&report);
}

#[test]
fn concurrent_migrations_postgres() {
    concurrent_migrations(Backend::Postgres);
}

#[test]
fn concurrent_migrations_sqlite() {
    concurrent_migrations(Backend::Sqlite);
}
