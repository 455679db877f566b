//! `outbox drain` and `outbox run`.

use std::time::Duration;

use clap::Args;

use super::out::say;
use super::progress::{Progress, ProgressStyle};
use super::WorkerArgs;
use crate::db::DatabaseUrl;
use crate::registry::Registry;
use crate::worker::{Report, Worker};

/// The flags of `outbox run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub(super) worker: WorkerArgs,
    /// How often to look for due tasks when idle (jittered by ±10%).
    #[arg(long, value_parser = super::parse_duration, default_value = "1s")]
    pub(super) poll_interval: Duration,
    /// Do not LISTEN for NOTIFY on PostgreSQL; poll only (for PgBouncer in transaction mode).
    #[arg(long)]
    pub(super) no_listen: bool,
}

pub(super) fn drain(
    url: &DatabaseUrl,
    mut registry: Registry,
    args: WorkerArgs,
) -> crate::Result<()> {
    let config = args.config(url.backend())?;
    args.add_crontab(&mut registry)?;
    url.require_existing()?;
    let worker = Worker::new(url, registry, config)?;
    // A bar on a terminal, plain lines otherwise (nothing with --json).
    let style = ProgressStyle::detect(args.json);
    let total = match style {
        ProgressStyle::Quiet => 0,
        _ => worker.due_count()?,
    };
    let totals = worker.totals_reader();
    let report = Progress::new(style, "draining", total).run_while(
        || totals().finished(),
        || worker.drain_until_stopped(args.shutdown_timeout()),
    )?;
    print_report("drained", &report, args.json);
    Ok(())
}

pub(super) fn run(url: &DatabaseUrl, mut registry: Registry, args: RunArgs) -> crate::Result<()> {
    let config = args
        .worker
        .config(url.backend())?
        .poll_interval(args.poll_interval)
        .listen(!args.no_listen);
    config.resolve(url.backend())?;
    args.worker.add_crontab(&mut registry)?;
    url.require_existing()?;
    let worker = Worker::new(url, registry, config)?;
    let report = worker.run_until_stopped(args.worker.shutdown_timeout())?;
    print_report("ran", &report, args.worker.json);
    Ok(())
}

/// A report as `--json` prints it.
pub(super) fn report_json(report: &Report) -> serde_json::Value {
    let t = report.tally;
    serde_json::json!({
        "claimed": t.claimed, "done": t.done, "retried": t.retried, "dead": t.dead,
        "lost": t.lost, "released": t.released, "abandoned": t.abandoned,
        "seconds": report.elapsed.as_secs_f64(), "tasks_per_s": report.tasks_per_sec(),
    })
}

pub(super) fn print_report(verb: &str, report: &Report, json: bool) {
    let t = report.tally;
    if json {
        println!("{}", report_json(report));
        return;
    }
    say!(
        "{verb} {} tasks in {:.2}s ({:.0} tasks/s): {} done, {} retried, {} dead",
        t.claimed,
        report.elapsed.as_secs_f64(),
        report.tasks_per_sec(),
        t.done,
        t.retried,
        t.dead
    );
    if t.lost + t.released + t.abandoned > 0 {
        say!(
            "  {} lost their claim, {} released to pending, {} left to rescue",
            t.lost,
            t.released,
            t.abandoned
        );
    }
}
