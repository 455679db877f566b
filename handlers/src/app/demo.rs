//! `outbox demo`: the quick start.

use std::time::Instant;

use clap::Args;

use outbox::cli::{Progress, ProgressStyle, WorkerArgs};
use outbox::migrate::ensure_migrated;
use outbox::{run_migrations, Backend, DatabaseUrl, Registry, Worker};

use super::{counted, worker_config};
use crate::demo::{check, place_orders, setup, COUPON_GRANT, POINTS_CREDIT};

#[derive(Debug, Args)]
pub(super) struct DemoArgs {
    /// How many orders to place.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    tasks: u64,
    /// Only place the orders (and enqueue their tasks); drain them with `outbox drain` or a
    /// fleet of `outbox run`, then verify with `outbox demo --check`.
    #[arg(long, conflicts_with = "check")]
    enqueue_only: bool,
    /// Only verify that every order was credited exactly once and got exactly one coupon.
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    worker: WorkerArgs,
}

pub(super) fn run(url: &DatabaseUrl, registry: Registry, args: DemoArgs) -> anyhow::Result<()> {
    for keyword in [POINTS_CREDIT, COUPON_GRANT] {
        if registry.get(keyword).is_none() && !args.enqueue_only && !args.check {
            return Err(outbox::Error::InvalidConfig {
                setting: "registry",
                reason: format!(
                    "the demo needs a handler for {keyword}; this binary registers {:?}",
                    registry.keywords().collect::<Vec<_>>()
                ),
            }
            .into());
        }
    }
    let config = worker_config(&args.worker, url)?;
    if args.check {
        // Checking writes nothing: a mistyped URL must fail, not pass on an empty database.
        url.require_existing()?;
        let mut conn = url.connect()?;
        ensure_migrated(&mut conn)?;
        return report_check(&mut conn);
    }
    let mut conn = url.connect()?;
    run_migrations(&mut conn)?;
    setup(&mut conn)?;
    let backend = match url.backend() {
        Backend::Postgres => "PostgreSQL",
        Backend::Sqlite => "SQLite",
        Backend::Mysql => "MySQL",
    };
    println!("outbox demo on {backend} ({})", url.masked());

    let started = Instant::now();
    let orders = place_orders(&mut conn, args.tasks)?;
    let placing = started.elapsed();
    println!(
        "placed {} orders in {:.2}s, each in one transaction with its {POINTS_CREDIT} and {COUPON_GRANT} tasks",
        orders.len(),
        placing.as_secs_f64()
    );
    if args.enqueue_only {
        println!("tasks enqueued; drain them, then run `outbox demo --check`");
        return Ok(());
    }
    let unit = if config.commit_batch > 1 {
        "chunk"
    } else {
        "task"
    };
    let worker = Worker::new(url, registry, config)?;
    let threads = counted(worker.threads() as u64, "thread");
    // A bar on a terminal, plain lines otherwise.
    let style = ProgressStyle::detect(false);
    let report = Progress::new(style, "draining", worker.due_count()?)
        .run_while(|| worker.totals().finished(), || worker.drain())?;
    let t = report.tally;
    println!(
        "drained {} tasks with {threads} in {:.2}s ({:.0} tasks/s): {} done, {} retried, {} dead",
        t.claimed,
        report.elapsed.as_secs_f64(),
        report.tasks_per_sec(),
        t.done,
        t.retried,
        t.dead
    );
    println!(
        "claiming thread ran {} itself when the pool was full (CallerRuns) and {} queued while it waited",
        counted(worker.caller_runs(), unit),
        counted(worker.caller_helped(), unit)
    );
    drop(worker);
    report_check(&mut conn)
}

fn report_check(conn: &mut outbox::DbConnection) -> anyhow::Result<()> {
    let report = check(conn)?;
    report.verify()?;
    println!(
        "check: all {} orders credited exactly once and granted exactly one coupon: OK",
        report.orders
    );
    Ok(())
}
