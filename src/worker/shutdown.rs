//! Graceful shutdown on SIGINT/SIGTERM: stop claiming, let in-flight work finish within a
//! grace period, release what has not started, mark the node gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use signal_hook::consts::{SIGINT, SIGTERM};

use super::engine::Worker;
use super::fleet::{DatabaseReport, Fleet};
use super::tally::Report;
use crate::error::{Error, Result};

impl Worker {
    /// [`Worker::run`] until SIGINT or SIGTERM, then a graceful shutdown, as `outbox run`
    /// does.
    ///
    /// At the first signal the worker claims nothing more, releases the claimed tasks whose
    /// handlers have not started (back to pending, no failure counted), and waits up to
    /// `grace` for the running ones; then the node is marked gone and the report returned.
    /// Past `grace` it returns [`Error::ShutdownTimeout`] with the node marked gone, leaving
    /// what still runs to rescue (the caller should exit the process: a thread cannot be
    /// stopped). A second signal exits the process at once with status 1.
    ///
    /// The signal handlers are the process's from the first call on (they cannot be removed
    /// without leaving the signals ignored); a later call works the same way, calls running at
    /// once (two workers) all stop at one signal, and a signal that arrives between two calls
    /// makes the next one stop at once.
    ///
    /// ```no_run
    /// # fn main() -> outbox::Result<()> {
    /// # let registry = outbox::Registry::new();
    /// let url = outbox::DatabaseUrl::parse("postgres://app@db.internal/app")?;
    /// let worker = outbox::Worker::new(&url, registry, outbox::WorkerConfig::default())?;
    /// let report = worker.run_until_stopped(std::time::Duration::from_secs(30))?;
    /// println!("{} tasks done", report.tally.done);
    /// # Ok(())
    /// # }
    /// ```
    pub fn run_until_stopped(self, grace: Duration) -> Result<Report> {
        until_stopped(self, grace, Worker::run)
    }

    /// [`Worker::drain`] with the same signal handling as [`Worker::run_until_stopped`], as
    /// `outbox drain` does.
    pub fn drain_until_stopped(self, grace: Duration) -> Result<Report> {
        until_stopped(self, grace, Worker::drain)
    }
}

impl Fleet {
    /// [`Fleet::run`] with the signal handling of [`Worker::run_until_stopped`], as `outbox
    /// run` with several `--database-url`s: at a signal every database's loop stops claiming,
    /// and the fleet waits up to `grace` for the tasks of them all.
    pub fn run_until_stopped(self, grace: Duration) -> Result<Vec<DatabaseReport<Report>>> {
        until_stopped(self, grace, |fleet| Ok(fleet.run()))
    }

    /// [`Fleet::drain`] with the same signal handling, as `outbox drain` with several
    /// `--database-url`s.
    pub fn drain_until_stopped(self, grace: Duration) -> Result<Vec<DatabaseReport<Report>>> {
        until_stopped(self, grace, |fleet| Ok(fleet.drain()))
    }
}

/// What [`until_stopped`] stops: a worker, or a fleet of them.
trait Stoppable: Send + Sync + 'static {
    fn stop_flag(&self) -> Arc<AtomicBool>;
    fn in_flight(&self) -> u64;
    fn mark_gone(&self) -> Result<()>;
    /// Its node(s), for the log.
    fn nodes(&self) -> String;
}

impl Stoppable for Worker {
    fn stop_flag(&self) -> Arc<AtomicBool> {
        Worker::stop_flag(self)
    }
    fn in_flight(&self) -> u64 {
        Worker::in_flight(self)
    }
    fn mark_gone(&self) -> Result<()> {
        Worker::mark_gone(self)
    }
    fn nodes(&self) -> String {
        format!("node {}", self.node_id())
    }
}

impl Stoppable for Fleet {
    fn stop_flag(&self) -> Arc<AtomicBool> {
        Fleet::stop_flag(self)
    }
    fn in_flight(&self) -> u64 {
        Fleet::in_flight(self)
    }
    fn mark_gone(&self) -> Result<()> {
        Fleet::mark_gone(self)
    }
    fn nodes(&self) -> String {
        let ids: Vec<String> = self
            .workers()
            .iter()
            .map(|w| w.node_id().to_string())
            .collect();
        format!("nodes {}", ids.join(", "))
    }
}

/// The process's stop signal: set by a SIGINT or SIGTERM once the handlers are installed;
/// one that arrives while it is set exits the process with status 1.
///
/// The handlers are installed by the first call of [`until_stopped`] and stay for the life of
/// the process: signal-hook cannot give a signal its default action back (an action removed
/// leaves the signal ignored). The flag is cleared when the last of the calls running at once
/// returns, so that the next one starts afresh (a signal between two calls makes the next one
/// stop at once), and every call running when a signal comes sees it.
struct StopSignal {
    flag: Option<Arc<AtomicBool>>,
    /// Calls of [`until_stopped`] running now.
    active: usize,
}

static STOP_SIGNAL: Mutex<StopSignal> = Mutex::new(StopSignal {
    flag: None,
    active: 0,
});

/// Joins the calls watching the stop signal, installing the handlers on first use.
fn watch_stop_signal() -> Result<Arc<AtomicBool>> {
    let mut stop = STOP_SIGNAL.lock().unwrap_or_else(PoisonError::into_inner);
    let flag = match &stop.flag {
        Some(flag) => Arc::clone(flag),
        None => {
            let flag = Arc::new(AtomicBool::new(false));
            install_handlers(&flag)?;
            stop.flag = Some(Arc::clone(&flag));
            flag
        }
    };
    stop.active += 1;
    Ok(flag)
}

/// Leaves the calls watching the stop signal; the last one out clears it.
fn unwatch_stop_signal() {
    let mut stop = STOP_SIGNAL.lock().unwrap_or_else(PoisonError::into_inner);
    stop.active -= 1;
    if stop.active == 0 {
        if let Some(flag) = &stop.flag {
            flag.store(false, Ordering::Relaxed);
        }
    }
}

/// For SIGINT and SIGTERM: exit with status 1 if `flag` is set, else set it. All or nothing:
/// what was registered before a failure is removed again.
fn install_handlers(flag: &Arc<AtomicBool>) -> Result<()> {
    let mut installed = Vec::new();
    let result = [SIGINT, SIGTERM].into_iter().try_for_each(|signal| {
        // Order matters: the conditional exit is checked before the flag is set.
        installed.push(signal_hook::flag::register_conditional_shutdown(
            signal,
            1,
            Arc::clone(flag),
        )?);
        installed.push(signal_hook::flag::register(signal, Arc::clone(flag))?);
        Ok(())
    });
    result.map_err(|source| {
        for id in installed {
            signal_hook::low_level::unregister(id);
        }
        Error::Signal { source }
    })
}

/// Runs `work` on a thread of its own while this one waits for it to return, or for a stop
/// signal and then at most `grace` more.
fn until_stopped<W: Stoppable, R: Send + 'static>(
    worker: W,
    grace: Duration,
    work: fn(&W) -> Result<R>,
) -> Result<R> {
    let signalled = watch_stop_signal()?;
    // Leaves the watchers however this call ends, a panic included.
    struct Unwatch;
    impl Drop for Unwatch {
        fn drop(&mut self) {
            unwatch_stop_signal();
        }
    }
    let _unwatch = Unwatch;
    until_stopped_or_signalled(worker, grace, work, &signalled)
}

fn until_stopped_or_signalled<W: Stoppable, R: Send + 'static>(
    worker: W,
    grace: Duration,
    work: fn(&W) -> Result<R>,
    signalled: &AtomicBool,
) -> Result<R> {
    let worker = Arc::new(worker);
    let stop = worker.stop_flag();
    log::info!("{} working; SIGINT or SIGTERM stops it", worker.nodes());
    let (done, finished) = mpsc::channel();
    {
        let worker = Arc::clone(&worker);
        std::thread::Builder::new()
            .name("outbox-claim".into())
            .spawn(move || {
                let result = work(&worker);
                // This clone goes first, so that the caller's is the last: dropping it
                // stops the heartbeat and marks the node gone before the process exits.
                drop(worker);
                let _ = done.send(result);
            })
            .map_err(|source| Error::Thread {
                thread: "claiming",
                source,
            })?;
    }
    loop {
        match finished.recv_timeout(Duration::from_millis(50)) {
            Ok(result) => return result,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::Panicked { thread: "claiming" })
            }
            Err(RecvTimeoutError::Timeout) if signalled.load(Ordering::Relaxed) => {
                stop.store(true, Ordering::Relaxed);
                break;
            }
            Err(RecvTimeoutError::Timeout) if stop.load(Ordering::Relaxed) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
    log::info!(
        "stopping: no more claims; waiting up to {grace:?} for {} task(s) in flight",
        worker.in_flight()
    );
    match finished.recv_timeout(grace) {
        Ok(result) => result,
        Err(_) => {
            let running = worker.in_flight();
            worker.mark_gone()?;
            Err(Error::ShutdownTimeout {
                running,
                timeout: grace,
            })
        }
    }
}
