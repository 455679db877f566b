//! The operator CLI, as library code: a binary builds its [`Registry`] and calls [`main`].
//!
//! Exit codes: 0 success; 1 the command failed (the message on stderr names what failed);
//! 2 bad usage (unknown flag, invalid argument, invalid task or configuration).

mod bench;
mod demo;
mod enqueue;
mod prune;
mod stats;
mod work;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::db::{DatabaseUrl, DEFAULT_DATABASE_URL};
use crate::error::Error;
use crate::registry::Registry;
use crate::worker::{
    WorkerConfig, DEFAULT_DEAD_AFTER_BEATS, DEFAULT_MAX_ATTEMPTS, DEFAULT_PAGE_SIZE,
};

/// Runs the CLI with the process's arguments and `registry`'s handlers; returns the exit code.
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     let mut registry = outbox::Registry::new();
///     registry.register("mail.send", |_task: &outbox::TaskContext, _tx: &mut outbox::TaskTx| Ok(()));
///     outbox::cli::main(registry)
/// }
/// ```
pub fn main(registry: Registry) -> ExitCode {
    main_from(std::env::args_os(), registry)
}

/// Runs the CLI with the given arguments (the first is the program name).
pub fn main_from<I, T>(args: I, registry: Registry) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        // clap prints help and version to stdout with exit 0, usage errors to stderr with 2.
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    match run(cli, registry) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Every variant's message already includes its cause.
            eprintln!("outbox: {e}");
            ExitCode::from(exit_code(&e))
        }
    }
}

/// 2 for input the user can fix on the command line, 1 for everything else.
fn exit_code(error: &Error) -> u8 {
    match error {
        Error::InvalidKeyword { .. }
        | Error::InvalidBizId { .. }
        | Error::InvalidPayload { .. }
        | Error::PayloadTooLarge { .. }
        | Error::InvalidTask { .. }
        | Error::InvalidDatabaseUrl { .. }
        | Error::InvalidConfig(_) => 2,
        _ => 1,
    }
}

/// Run business side-effects reliably, after the fact.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, about, long_about = None)]
struct Cli {
    /// Database URL: postgres://… or postgresql://… for PostgreSQL; sqlite://PATH or a file
    /// path for SQLite. The backend is chosen from the scheme alone.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL, global = true)]
    database_url: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply the embedded schema migrations (safe to run from several processes at once).
    Migrate,
    /// Enqueue one task (for scripts and operators; programs enqueue in their own transaction).
    Enqueue(enqueue::EnqueueArgs),
    /// Run every due task, print a summary, and exit: for cron.
    Drain(WorkerArgs),
    /// Run as a long-lived worker until SIGINT or SIGTERM.
    Run(work::RunArgs),
    /// Tasks per keyword and state, the oldest due task, and keywords no handler serves.
    Stats(stats::StatsArgs),
    /// The quick start: place orders that enqueue points.credit and coupon.grant, drain them,
    /// and check that every order was credited exactly once.
    Demo(demo::DemoArgs),
    /// Measure drain throughput against a reference loop (or commit-to-start latency) on a
    /// scratch database.
    Bench(bench::BenchArgs),
    /// Delete finished tasks older than a cutoff, so that the table does not keep growing.
    Prune(prune::PruneArgs),
}

/// Settings shared by the commands that run tasks.
#[derive(Debug, Clone, Args)]
struct WorkerArgs {
    /// Execution threads [default: twice the cores; 1 on SQLite].
    #[arg(long)]
    threads: Option<usize>,
    /// Tasks claimed per claim statement, at most [default: 100; with --commit-batch K,
    /// enough for a chunk per thread and queue slot: (threads + queue + 1) × K].
    #[arg(long = "page")]
    page_size: Option<usize>,
    /// Tasks that may wait for a thread before the claiming thread runs them itself
    /// [default: 8 × threads; 128 on SQLite unless --threads is given; with --commit-batch,
    /// as many chunks as threads].
    #[arg(long)]
    queue: Option<usize>,
    /// Attempts for tasks that do not set their own.
    #[arg(long, default_value_t = DEFAULT_MAX_ATTEMPTS)]
    max_attempts: i32,
    /// How often this node records its heartbeat and rescues the tasks of dead nodes.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    heartbeat: Duration,
    /// A node silent for this long is dead and its running tasks are rescued
    /// [default: 3 heartbeats].
    #[arg(long, value_parser = parse_duration)]
    dead_after: Option<Duration>,
    /// A task running longer than this is rescued as hung; if its handler is still running a
    /// heartbeat later, the process exits with status 3 to free what it holds.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    task_timeout: Duration,
    /// On SIGINT/SIGTERM, how long in-flight tasks may take to finish before the process
    /// exits anyway (leaving them to rescue).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    shutdown_timeout: Duration,
    /// Tasks per transaction: 1 is strict mode (one transaction per task); K > 1 runs up to K
    /// tasks in one transaction with one fenced completion, re-running a failed chunk task by
    /// task (external effects of a rolled-back chunk then happen again).
    #[arg(long, default_value_t = 1)]
    commit_batch: usize,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
}

impl WorkerArgs {
    /// The worker configuration these flags describe, validated.
    fn config(&self, backend: crate::db::Backend) -> crate::Result<WorkerConfig> {
        let defaults = WorkerConfig::for_backend(backend);
        let threads = self.threads.unwrap_or(defaults.threads);
        // An explicit --threads without --queue gets 8 queue slots per thread.
        // In batched mode the queue counts chunks: one per thread is plenty.
        let queue = self.queue.unwrap_or(match self.threads {
            _ if self.commit_batch > 1 => threads,
            Some(threads) => threads * crate::worker::QUEUE_PER_THREAD,
            None => defaults.queue,
        });
        let config = WorkerConfig {
            threads,
            queue,
            page_size: self.page_size.unwrap_or(if self.commit_batch > 1 {
                ((threads + queue + 1) * self.commit_batch).min(10_000)
            } else {
                DEFAULT_PAGE_SIZE
            }),
            max_attempts: self.max_attempts,
            heartbeat: self.heartbeat,
            dead_after: self
                .dead_after
                .unwrap_or(self.heartbeat * DEFAULT_DEAD_AFTER_BEATS),
            task_timeout: self.task_timeout,
            exit_on_hang: true,
            commit_batch: self.commit_batch,
            ..defaults
        };
        config.validate()?;
        Ok(config)
    }
}

fn run(cli: Cli, registry: Registry) -> crate::Result<()> {
    let url = DatabaseUrl::parse(&cli.database_url)?;
    // Each command checks its own input first, so that bad usage is reported as such before
    // any database is touched; commands that work an existing database then refuse a missing
    // SQLite file (`DatabaseUrl::require_existing`).
    match cli.command {
        Command::Migrate => {
            let mut conn = url.connect()?;
            let applied = crate::migrate::run_migrations(&mut conn)?;
            if applied.is_empty() {
                println!("schema up to date ({})", url.masked());
            } else {
                println!(
                    "applied {} migration(s): {}",
                    applied.len(),
                    applied.join(", ")
                );
            }
            Ok(())
        }
        Command::Enqueue(args) => enqueue::run(&url, args),
        Command::Drain(args) => work::drain(&url, registry, args),
        Command::Run(args) => work::run(&url, registry, args),
        Command::Stats(args) => stats::run(&url, &registry, args),
        Command::Demo(args) => demo::run(&url, registry, args),
        Command::Prune(args) => prune::run(&url, args),
        Command::Bench(args) => bench::run(&url, args),
    }
}

/// Parses durations written like `500ms`, `5s`, `10m`, `2h`, `7d`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e} (write durations like 500ms, 5s, 10m, 2h, 7d)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn worker_args_default_queue_follows_threads() {
        let cli = Cli::try_parse_from(["outbox", "drain", "--threads", "3"]).unwrap();
        let Command::Drain(args) = cli.command else {
            panic!("drain")
        };
        let config = args.config(crate::db::Backend::Postgres).unwrap();
        assert_eq!((config.threads, config.queue), (3, 24));
    }
}
