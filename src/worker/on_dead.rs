//! The dead-task hook (`--on-dead CMD`, [`crate::WorkerConfig::on_dead`]): a command run
//! when a task becomes dead, for alerting.
//!
//! The worker's threads only put the task on a bounded queue (never waiting: when the
//! queue is full the hook is skipped and logged); one thread of its own runs the commands
//! one after another, each through `sh -c`, with the task in its environment — never the
//! payload — and kills one that outlives its timeout. It inherits the worker's environment
//! but for the database's secrets: `DATABASE_URL`, `PGPASSWORD`, `MYSQL_PWD` and any other
//! variable whose value holds the database's password are removed (see
//! [`withheld_variables`]). A hook that fails, hangs or floods
//! never delays a task. Its standard output is discarded; its standard error goes to the
//! worker's. When the worker stops, the queued hooks still run, for at most one more
//! timeout; those left then are logged and dropped.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::db::secret::Secrets;
use crate::error::{Error, Result};
use crate::log_label;

/// How long a dead-task hook may run before it is killed, by default.
pub const DEFAULT_ON_DEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Dead tasks whose hook may wait for the one running; past that, hooks are skipped.
pub const ON_DEAD_QUEUE: usize = 1024;
/// How often a running hook is checked for its exit.
const POLL: Duration = Duration::from_millis(10);
/// Variables never passed to a hook: they name the database or hold its password.
const SECRET_VARIABLES: [&str; 3] = ["DATABASE_URL", "PGPASSWORD", "MYSQL_PWD"];

/// A task that became dead, as its hook's environment shows it.
#[derive(Debug, Clone)]
pub(crate) struct DeadTask {
    pub(crate) id: i64,
    pub(crate) keyword: String,
    pub(crate) biz_id: String,
    pub(crate) tenant: Option<String>,
    /// Its last error, as stored in `last_error`.
    pub(crate) error: String,
}

impl DeadTask {
    /// The hook's environment: `OUTBOX_TASK_ID`, `OUTBOX_KEYWORD`, `OUTBOX_BIZ_ID`,
    /// `OUTBOX_TENANT` (empty without one) and `OUTBOX_ERROR`.
    fn environment(&self) -> [(&'static str, String); 5] {
        // An environment value cannot hold a NUL byte.
        let clean = |s: &str| s.replace('\0', "\u{fffd}");
        [
            ("OUTBOX_TASK_ID", self.id.to_string()),
            ("OUTBOX_KEYWORD", clean(&self.keyword)),
            ("OUTBOX_BIZ_ID", clean(&self.biz_id)),
            ("OUTBOX_TENANT", clean(self.tenant.as_deref().unwrap_or(""))),
            ("OUTBOX_ERROR", clean(&self.error)),
        ]
    }
}

/// The hook's queue and its runner thread.
pub(crate) struct DeadHook {
    sender: Mutex<Option<SyncSender<DeadTask>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Set when the worker stops: the runner gives up on what is still queued then.
    give_up_at: Arc<Mutex<Option<Instant>>>,
    timeout: Duration,
}

impl DeadHook {
    /// Starts the runner of `command` (run by `sh -c`), each run killed after `timeout`,
    /// without `secrets` (the database's password) in its environment.
    pub(crate) fn start(command: String, timeout: Duration, secrets: Secrets) -> Result<DeadHook> {
        let (sender, receiver) = mpsc::sync_channel(ON_DEAD_QUEUE);
        let give_up_at = Arc::new(Mutex::new(None));
        let runner = Runner {
            command,
            timeout,
            secrets,
            give_up_at: Arc::clone(&give_up_at),
        };
        let thread = std::thread::Builder::new()
            .name("outbox-on-dead".into())
            .spawn(log_label::inherited(move || runner.serve(receiver)))
            .map_err(|source| Error::Thread {
                thread: "on-dead hook",
                source,
            })?;
        Ok(DeadHook {
            sender: Mutex::new(Some(sender)),
            thread: Mutex::new(Some(thread)),
            give_up_at,
            timeout,
        })
    }

    /// Queues `task`'s hook; never waits. A full queue skips it, logged.
    pub(crate) fn dead(&self, task: DeadTask) {
        let sender = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(sender) = sender.as_ref() else {
            return;
        };
        match sender.try_send(task) {
            Ok(()) => {}
            Err(TrySendError::Full(task)) => log::error!(
                "task {} ({} {}) is dead, and its on-dead hook was skipped: {ON_DEAD_QUEUE} \
                 hooks are already waiting",
                task.id,
                task.keyword,
                task.biz_id
            ),
            Err(TrySendError::Disconnected(task)) => log::error!(
                "task {} ({} {}) is dead, and its on-dead hook was skipped: the hook runner \
                 has stopped",
                task.id,
                task.keyword,
                task.biz_id
            ),
        }
    }

    /// Lets the queued hooks run for at most one more timeout, then stops the runner.
    pub(crate) fn finish(&self) {
        *self
            .give_up_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + self.timeout);
        drop(
            self.sender
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Drop for DeadHook {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The runner thread's side.
struct Runner {
    command: String,
    timeout: Duration,
    secrets: Secrets,
    give_up_at: Arc<Mutex<Option<Instant>>>,
}

impl Runner {
    fn serve(&self, queue: Receiver<DeadTask>) {
        while let Ok(task) = queue.recv() {
            let give_up_at = *self
                .give_up_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if give_up_at.is_some_and(|at| Instant::now() >= at) {
                let left = 1 + queue.try_iter().count();
                log::error!(
                    "the worker stopped: {left} on-dead hook(s) not run (task {} first)",
                    task.id
                );
                return;
            }
            self.run(&task);
        }
    }

    /// Runs the hook for one task, killing it past the timeout; logs how it ended.
    fn run(&self, task: &DeadTask) {
        let started = Instant::now();
        let mut hook = hook_command(&self.command);
        hook.arg(&self.command);
        for name in withheld_variables(&self.secrets) {
            hook.env_remove(name);
        }
        let child = hook
            .envs(task.environment())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => {
                log::error!("task {}: the on-dead hook could not start: {e}", task.id);
                return;
            }
        };
        match wait_at_most(&mut child, self.timeout) {
            Ok(Some(status)) if status.success() => log::info!(
                "task {}: the on-dead hook ran in {:?}",
                task.id,
                started.elapsed()
            ),
            Ok(Some(status)) => {
                log::warn!("task {}: the on-dead hook failed: {status}", task.id)
            }
            Ok(None) => log::error!(
                "task {}: the on-dead hook ran past its timeout of {:?} and was killed",
                task.id,
                self.timeout
            ),
            Err(e) => log::error!("task {}: could not wait for the on-dead hook: {e}", task.id),
        }
    }
}

/// The variables of this process's environment a hook must not inherit: [`SECRET_VARIABLES`]
/// and any whose value holds one of `secrets`.
fn withheld_variables(secrets: &Secrets) -> Vec<std::ffi::OsString> {
    let mut withheld: Vec<std::ffi::OsString> = SECRET_VARIABLES.iter().map(Into::into).collect();
    for (name, value) in std::env::vars_os() {
        if secrets.found_in(&value.to_string_lossy()) {
            withheld.push(name);
        }
    }
    withheld
}

/// `sh -c command` in a process group of its own, so that a timeout kills whatever it
/// started too.
fn hook_command(command: &str) -> Command {
    let mut sh = Command::new("sh");
    sh.arg("-c").arg(command);
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut sh, 0);
    sh
}

/// Kills `child`'s process group (the shell and what it started), then the child itself in
/// case the group could not be signalled.
fn kill_group(child: &mut Child) {
    #[cfg(unix)]
    {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let _ = child.kill();
}

/// Waits for `child` up to `timeout`; past it, kills and reaps it and returns `None`.
fn wait_at_most(child: &mut Child, timeout: Duration) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            // Already gone between the two calls: its status is reaped below all the same.
            kill_group(child);
            child.wait()?;
            return Ok(None);
        }
        std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn a_hook_past_its_timeout_is_killed_with_what_it_started() {
        // The shell's own child too: `sleep` is not the shell's last command, so it is a
        // process of its own in the hook's group.
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!("sleep 30 & echo $! > {}; wait", pid_file.display());
        let mut child = hook_command(&script).spawn().unwrap();
        let started = Instant::now();
        while !pid_file.exists()
            || std::fs::read_to_string(&pid_file)
                .unwrap()
                .trim()
                .is_empty()
        {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the hook did not start"
            );
            std::thread::sleep(POLL);
        }
        assert!(wait_at_most(&mut child, Duration::from_millis(100))
            .unwrap()
            .is_none());
        assert!(started.elapsed() < Duration::from_secs(5));
        let sleep = std::fs::read_to_string(&pid_file).unwrap();
        // Gone, or a zombie waiting for whoever adopted it to reap it.
        let gone = || {
            std::fs::read_to_string(format!("/proc/{}/stat", sleep.trim()))
                .map_or(true, |stat| stat.contains(") Z "))
        };
        while !gone() {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the hook's sleep lives on"
            );
            std::thread::sleep(POLL);
        }
    }

    #[test]
    fn the_environment_names_the_task_and_never_the_payload() {
        let task = DeadTask {
            id: 7,
            keyword: "mail.send".into(),
            biz_id: "order-1".into(),
            tenant: None,
            error: "boom\0".into(),
        };
        let env = task.environment();
        assert_eq!(env[0], ("OUTBOX_TASK_ID", "7".to_owned()));
        assert_eq!(env[3], ("OUTBOX_TENANT", String::new()));
        assert_eq!(env[4], ("OUTBOX_ERROR", "boom\u{fffd}".to_owned()));
    }
}
