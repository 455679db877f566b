//! Graceful shutdown on SIGINT/SIGTERM: stop claiming, let in-flight work finish within a
//! grace period, release what has not started, mark the node gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use signal_hook::consts::{SIGINT, SIGTERM};

use super::{Report, Worker};
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

/// The first SIGINT/SIGTERM sets `stop`; a second one exits at once with status 1 (rescue
/// recovers what that process had claimed).
fn install_signal_handlers(stop: &Arc<AtomicBool>) -> Result<()> {
    for signal in [SIGINT, SIGTERM] {
        // Order matters: the conditional exit is checked before the flag is set.
        signal_hook::flag::register_conditional_shutdown(signal, 1, Arc::clone(stop))
            .and_then(|_| signal_hook::flag::register(signal, Arc::clone(stop)))
            .map_err(|source| Error::Signal { source })?;
    }
    Ok(())
}

/// Runs `work` on a thread of its own while this one waits for it to return, or for a stop
/// signal and then at most `grace` more.
fn until_stopped(
    worker: Worker,
    grace: Duration,
    work: fn(&Worker) -> Result<Report>,
) -> Result<Report> {
    let worker = Arc::new(worker);
    let stop = worker.stop_flag();
    install_signal_handlers(&stop)?;
    log::info!(
        "node {} working; SIGINT or SIGTERM stops it",
        worker.node_id()
    );
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
