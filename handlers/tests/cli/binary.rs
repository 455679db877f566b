//! Running the binary: its working directory, the command, a started and a finished
//! process, bounded waits.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::support::TestDb;

/// How long one command may take before its test fails (generous: debug builds, busy CI).
const COMMAND_LIMIT: Duration = Duration::from_secs(120);
/// How long `outbox run` may take to finish the demo's tasks.
pub const WORK_LIMIT: Duration = Duration::from_secs(30);
/// How long `outbox run` may take to exit after SIGTERM.
pub const STOP_LIMIT: Duration = Duration::from_secs(10);
/// How often a bounded wait re-checks its condition.
const POLL: Duration = Duration::from_millis(50);

/// A PostgreSQL URL on which no server listens.
pub const DOWN_PG_URL: &str = "postgres://outbox@127.0.0.1:1/nope";

/// Every command that needs the database, with arguments that are valid.
pub const DATABASE_COMMANDS: [&[&str]; 8] = [
    &["migrate"],
    &["prune", "--older-than", "7d"],
    &["bench", "--tasks", "10", "--runs", "1"],
    &["drain"],
    &["run"],
    &["stats"],
    &["enqueue", "mail.send", "1"],
    &["demo", "--tasks", "1"],
];

/// A fresh, empty working directory.
pub fn workdir() -> TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// The names of the entries of `dir`, sorted.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// `outbox` run in `cwd`, with no `DATABASE_URL` (so the default `outbox.db` applies unless
/// a test sets one) and the default log level, its output captured.
pub fn outbox(cwd: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox"));
    cmd.current_dir(cwd)
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// `outbox` run in `cwd` on the test database, named by `DATABASE_URL`.
pub fn outbox_on(db: &TestDb, cwd: &Path) -> Command {
    let mut cmd = outbox(cwd);
    cmd.env("DATABASE_URL", &db.url_text);
    cmd
}

/// A started `outbox` process whose stdout and stderr are being collected.
pub struct Running {
    what: String,
    child: Child,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
}

/// A finished `outbox` process.
pub struct Finished {
    what: String,
    status: ExitStatus,
    pub stdout: String,
    stderr: String,
}

fn collect(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        pipe.read_to_string(&mut text).expect("read child output");
        text
    })
}

impl Running {
    pub fn spawn(cmd: &mut Command) -> Running {
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let what = format!("outbox {}", args.join(" "));
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let stdout = collect(child.stdout.take().expect("piped stdout"));
        let stderr = collect(child.stderr.take().expect("piped stderr"));
        Running {
            what,
            child,
            stdout,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Waits up to `limit` for the process to exit; past it, kills it and fails the test.
    pub fn finish(mut self, limit: Duration) -> Finished {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.exited() {
                break Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                break Err(self.child.wait().expect("wait after kill"));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let stdout = self.stdout.join().expect("stdout reader");
        let stderr = self.stderr.join().expect("stderr reader");
        match status {
            Ok(status) => Finished {
                what: self.what,
                status,
                stdout,
                stderr,
            },
            Err(_) => panic!(
                "{} did not exit within {limit:?}; killed\n--- stdout\n{stdout}--- stderr\n{stderr}",
                self.what
            ),
        }
    }
}

impl Finished {
    /// Fails the test, showing the output, unless the process exited with `code`.
    pub fn expect_code(self, code: i32) -> Finished {
        assert_eq!(
            self.status.code(),
            Some(code),
            "{} exited with {}, expected {code}\n--- stdout\n{}--- stderr\n{}",
            self.what,
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }

    pub fn stdout_has(&self, needle: &str) -> &Finished {
        assert!(
            self.stdout.contains(needle),
            "stdout of {} lacks {needle:?}\n--- stdout\n{}--- stderr\n{}",
            self.what,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Fails the test, showing the output, if stdout or stderr holds `needle`.
    pub fn output_lacks(&self, needle: &str) -> &Finished {
        assert!(
            !self.stdout.contains(needle) && !self.stderr.contains(needle),
            "the output of {} holds {needle:?}\n--- stdout\n{}--- stderr\n{}",
            self.what,
            self.stdout,
            self.stderr
        );
        self
    }

    pub fn stderr(&self) -> &str {
        &self.stderr
    }

    pub fn stderr_has(&self, needle: &str) -> &Finished {
        assert!(
            self.stderr.contains(needle),
            "stderr of {} lacks {needle:?}\n--- stdout\n{}--- stderr\n{}",
            self.what,
            self.stdout,
            self.stderr
        );
        self
    }
}

/// Runs `cmd` to completion (within [`COMMAND_LIMIT`]).
pub fn run(cmd: &mut Command) -> Finished {
    Running::spawn(cmd).finish(COMMAND_LIMIT)
}

/// Polls `condition` every [`POLL`] until it holds; fails the test after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}
