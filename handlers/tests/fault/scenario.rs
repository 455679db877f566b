//! Scenarios (serialisation, temporary directory, process logs) and the `outbox-fault`
//! processes they start.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::report::{report_path, secs, Report, REPORT_RESET};
use crate::{locks, profile, COMMAND_LIMIT, LOCK_COMMIT_BATCH, STOP_LIMIT};

/// Scenarios run one at a time: each locks this.
static SERIAL: Mutex<()> = Mutex::new(());

/// One running scenario: holds the serialisation lock, the temporary directory with every
/// process's logs, and the start time. Declare it first, so that it is dropped last: on a
/// panic it prints the tails of the last logs and keeps the directory.
pub struct Scenario {
    name: String,
    backend: &'static str,
    started: Instant,
    dir: Option<TempDir>,
    pub logs: RefCell<Vec<PathBuf>>,
    _serial: MutexGuard<'static, ()>,
}

impl Scenario {
    pub fn start(name: &str, backend: &'static str) -> Scenario {
        let serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        REPORT_RESET.call_once(|| {
            File::create(report_path())
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", report_path()));
        });
        let dir = tempfile::Builder::new()
            .prefix(&format!("outbox-fault-{name}-"))
            .tempdir()
            .expect("temp dir");
        eprintln!(
            "=== {name} ({}) in {}",
            describe(backend),
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

    /// Whether this scenario's workers take lock claims (`OUTBOX_FAULT_CLAIM=lock` on
    /// PostgreSQL).
    pub fn locks(&self) -> bool {
        locks(self.backend)
    }

    /// `outbox-fault COMMAND` with the suite's worker flags, the claim style's flags
    /// (`--claim lock --commit-batch 20` when [`Scenario::locks`]), then `overrides`, which
    /// replace a flag's value or add a flag.
    pub fn worker_args(&self, command: &str, overrides: &[(&str, &str)]) -> Vec<String> {
        let mut flags = vec![
            ("--heartbeat", "500ms"),
            ("--dead-after", "1500ms"),
            ("--task-timeout", "2s"),
            ("--shutdown-timeout", "10s"),
        ];
        if command == "run" {
            flags.push(("--poll-interval", "100ms"));
        }
        if self.locks() {
            flags.push(("--claim", "lock"));
            flags.push(("--commit-batch", LOCK_COMMIT_BATCH));
        }
        for &(flag, value) in overrides {
            match flags.iter_mut().find(|(f, _)| *f == flag) {
                Some(entry) => entry.1 = value,
                None => flags.push((flag, value)),
            }
        }
        let mut args = vec![command.to_owned()];
        for (flag, value) in flags {
            args.push(flag.to_owned());
            args.push(value.to_owned());
        }
        args
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.as_ref().expect("scenario dir").path().join(file)
    }

    /// The external file the `fault.external` handler appends to.
    pub fn external_file(&self) -> PathBuf {
        self.path("external.txt")
    }

    /// Starts `outbox-fault ARGS` on `url` with `RUST_LOG=info`, its stdout and stderr going
    /// to files named after `label`; on PostgreSQL its sessions are named `label`
    /// (`application_name`, through libpq's `PGAPPNAME`), so that the test can find them.
    pub fn spawn(&self, label: &str, url: &str, args: &[String]) -> Proc {
        self.spawn_with(label, url, args, &[])
    }

    /// [`Scenario::spawn`], with the variables `env` set too.
    pub fn spawn_with(
        &self,
        label: &str,
        url: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Proc {
        let n = self.logs.borrow().len();
        let stderr = self.path(&format!("{n:03}-{label}.log"));
        let stdout = self.path(&format!("{n:03}-{label}.out"));
        self.logs.borrow_mut().push(stderr.clone());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-fault"));
        cmd.args(args)
            .current_dir(self.path(""))
            .env("DATABASE_URL", url)
            .env("OUTBOX_FAULT_FILE", self.external_file())
            // `OUTBOX_FAULT_RUST_LOG` for more (replaying a seed: `outbox::worker=debug`).
            .env(
                "RUST_LOG",
                std::env::var("OUTBOX_FAULT_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            // No backtrace for the panics the poison handlers raise on purpose: a debug build
            // resolving one under load took longer than a scenario's 2 s task timeout, and
            // the hang watchdog, which times the handler with its panic, ended the worker.
            .env("RUST_BACKTRACE", "0")
            .env("PGAPPNAME", label)
            .envs(env.iter().copied())
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
            app: label.to_owned(),
            child,
            stdout,
            stderr,
            status: None,
        }
    }

    /// Appends the scenario's block to the report file and prints it.
    pub fn publish(&self, report: &Report) {
        let mut text = format!("== {} ({})\n", self.name, describe(self.backend));
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
            .open(report_path())
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", report_path()));
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
            "== {} ({})\n  FAILED after {} (the assertion is in the test output)\n\n",
            self.name,
            describe(self.backend),
            secs(self.started.elapsed())
        );
        if let Ok(mut file) = OpenOptions::new().append(true).open(report_path()) {
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

/// "BACKEND, profile P" and, with lock claims, ", lock claims".
fn describe(backend: &str) -> String {
    let claims = if locks(backend) { ", lock claims" } else { "" };
    format!("{backend}, profile {:?}{claims}", profile())
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

/// A started `outbox-fault` process. Dropping it SIGKILLs it (by its pid) and reaps it if it
/// is still running, so no test leaves a process behind, even when an assertion fails.
pub struct Proc {
    pub label: String,
    /// The label it was started with: its sessions' `application_name` on PostgreSQL.
    pub app: String,
    child: Child,
    stdout: PathBuf,
    pub stderr: PathBuf,
    status: Option<ExitStatus>,
}

impl Proc {
    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits i32")
    }

    /// Its name in `async_node`: `host:pid`.
    pub fn node_name(&self) -> String {
        format!("{}:{}", hostname(), self.child.id())
    }

    pub fn signal(&self, signal: i32) {
        if ![libc::SIGKILL, libc::SIGSTOP, libc::SIGCONT].contains(&signal) {
            // A catchable signal before the handlers are installed would kill it outright:
            // wait for the line the worker logs once they are.
            let ready = Instant::now() + COMMAND_LIMIT;
            while !self.handles_signals(ready) {}
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

    /// SIGTERM once it handles signals, as [`Proc::signal`]; `false`, and nothing sent, when
    /// it exits before it does (a worker whose start failed: a connection cut, say).
    pub fn terminate(&mut self) -> bool {
        let ready = Instant::now() + COMMAND_LIMIT;
        while !self.handles_signals(ready) {
            if self.poll().is_some() {
                return false;
            }
        }
        self.signal(libc::SIGTERM);
        true
    }

    /// Whether it has logged that its signal handlers are installed; if not, a pause of 10 ms
    /// first. Panics once `ready` has passed without.
    fn handles_signals(&self, ready: Instant) -> bool {
        if self.stderr_text().contains("SIGINT or SIGTERM stops it") {
            return true;
        }
        assert!(
            Instant::now() < ready,
            "{} never logged that it handles signals\n{}",
            self.label,
            tail(&self.stderr, 40)
        );
        std::thread::sleep(Duration::from_millis(10));
        false
    }

    /// The exit status if it has exited.
    pub fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status
    }

    pub fn is_running(&mut self) -> bool {
        self.poll().is_none()
    }

    /// Waits up to `limit` for it to exit.
    pub fn wait_for_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
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

    /// SIGSTOP: it stays as it is, mid-work, until killed.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Resumes a frozen process (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) -> ExitStatus {
        if let Some(status) = self.poll() {
            return status;
        }
        self.signal(libc::SIGKILL);
        let status = self.child.wait().expect("wait after SIGKILL");
        self.status = Some(status);
        status
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn stdout_text(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// Fails the test, showing its logs, unless it is still running.
    pub fn assert_running(&mut self, context: &str) {
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
    pub fn expect_exit_0(&mut self, limit: Duration) -> Duration {
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

/// SIGTERMs every worker (each must still be running) and expects each to exit 0 within
/// [`STOP_LIMIT`]; returns the longest time one took.
pub fn stop_all(workers: &mut [Proc]) -> Duration {
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
