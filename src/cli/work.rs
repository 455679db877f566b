//! `outbox drain` and `outbox run`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use signal_hook::consts::{SIGINT, SIGTERM};

use super::WorkerArgs;
use crate::db::DatabaseUrl;
use crate::error::Error;
use crate::registry::Registry;
use crate::worker::{Report, Worker};

#[derive(Debug, Args)]
pub(super) struct RunArgs {
    #[command(flatten)]
    worker: WorkerArgs,
    /// How often to look for due tasks when idle (jittered by ±10%).
    #[arg(long, value_parser = super::parse_duration, default_value = "1s")]
    poll_interval: Duration,
    /// Do not LISTEN for NOTIFY on PostgreSQL; poll only (for PgBouncer in transaction mode).
    #[arg(long)]
    no_listen: bool,
}

/// The first SIGINT/SIGTERM sets `stop`; a second one exits at once with status 1 (rescue
/// recovers what that process had claimed).
fn install_signal_handlers(stop: &Arc<AtomicBool>) -> crate::Result<()> {
    for signal in [SIGINT, SIGTERM] {
        // Order matters: the conditional exit is checked before the flag is set.
        signal_hook::flag::register_conditional_shutdown(signal, 1, Arc::clone(stop))
            .and_then(|_| signal_hook::flag::register(signal, Arc::clone(stop)))
            .map_err(|e| Error::Runtime(format!("cannot install signal handler: {e}")))?;
    }
    Ok(())
}

pub(super) fn drain(url: &DatabaseUrl, registry: Registry, args: WorkerArgs) -> crate::Result<()> {
    let config = args.config(url.backend())?;
    url.require_existing()?;
    let worker = Worker::new(url, registry, config)?;
    let report = until_stopped(worker, args.shutdown_timeout, Worker::drain)?;
    print_report("drained", &report, args.json);
    Ok(())
}

/// Runs `work` on a thread of its own while this one waits for it to return, or for a stop
/// signal and then at most `shutdown_timeout` more. The worker, once stopped, claims nothing
/// and releases the tasks of its page that have not started; past the timeout the node is
/// marked gone and the process exits with what is still running left to rescue.
fn until_stopped(
    worker: Worker,
    shutdown_timeout: Duration,
    work: fn(&Worker) -> crate::Result<Report>,
) -> crate::Result<Report> {
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
            .map_err(|e| Error::Runtime(format!("cannot start the claiming thread: {e}")))?;
    }
    loop {
        match finished.recv_timeout(Duration::from_millis(50)) {
            Ok(result) => return result,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::Runtime("the claiming thread panicked".into()))
            }
            Err(RecvTimeoutError::Timeout) if stop.load(Ordering::Relaxed) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
    log::info!(
        "stopping: no more claims; waiting up to {shutdown_timeout:?} for {} task(s) in flight",
        worker.in_flight()
    );
    match finished.recv_timeout(shutdown_timeout) {
        Ok(result) => result,
        Err(_) => {
            let running = worker.in_flight();
            worker.mark_gone()?;
            Err(Error::ShutdownTimeout {
                running,
                timeout: shutdown_timeout,
            })
        }
    }
}

pub(super) fn run(url: &DatabaseUrl, registry: Registry, args: RunArgs) -> crate::Result<()> {
    let mut config = args.worker.config(url.backend())?;
    config.poll_interval = args.poll_interval;
    config.listen = !args.no_listen;
    config.validate()?;
    url.require_existing()?;
    let worker = Worker::new(url, registry, config)?;
    let report = until_stopped(worker, args.worker.shutdown_timeout, Worker::run)?;
    print_report("ran", &report, args.worker.json);
    Ok(())
}

fn print_report(verb: &str, report: &Report, json: bool) {
    let t = report.tally;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "claimed": t.claimed, "done": t.done, "retried": t.retried, "dead": t.dead,
                "lost": t.lost, "released": t.released, "abandoned": t.abandoned,
                "seconds": report.elapsed.as_secs_f64(), "tasks_per_s": report.tasks_per_sec(),
            })
        );
        return;
    }
    println!(
        "{verb} {} tasks in {:.2}s ({:.0} tasks/s): {} done, {} retried, {} dead",
        t.claimed,
        report.elapsed.as_secs_f64(),
        report.tasks_per_sec(),
        t.done,
        t.retried,
        t.dead
    );
    if t.lost + t.released + t.abandoned > 0 {
        println!(
            "  {} lost their claim, {} released to pending, {} left to rescue",
            t.lost, t.released, t.abandoned
        );
    }
}
