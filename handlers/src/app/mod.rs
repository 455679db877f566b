//! The `outbox` binary's command line: the library's commands (`outbox::cli`) and two of
//! its own, `demo` (the quick start) and `bench` (the benchmarks).

mod bench;
mod bench_metrics;
mod bench_strategy;
mod demo;
#[cfg(test)]
mod reference;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use outbox::cli::{DatabaseArgs, WorkerArgs};
use outbox::Registry;

/// Run business side-effects reliably, after the fact.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    database: DatabaseArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Library(outbox::cli::Command),
    /// The quick start: place orders that enqueue points.credit and coupon.grant, drain them,
    /// and check that every order was credited exactly once.
    Demo(demo::DemoArgs),
    /// Measure drain throughput against a reference loop (or commit-to-start latency) on a
    /// scratch database.
    Bench(bench::BenchArgs),
}

/// Runs the command line with the process's arguments and `registry`'s handlers; returns the
/// exit code (0 success, 1 failure, 2 bad usage, as `outbox::cli`).
pub fn main(registry: Registry) -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    // `run` and `drain` take `--database-url` repeated; the other commands one URL.
    let one_url = || -> anyhow::Result<outbox::DatabaseUrl> { Ok(cli.database.url()?) };
    let code = match cli.command {
        Command::Library(command) => outbox::cli::finish(
            cli.database
                .urls()
                .and_then(|urls| outbox::cli::run_on(command, &urls, registry)),
        ),
        Command::Demo(args) => finish(one_url().and_then(|url| demo::run(&url, registry, args))),
        Command::Bench(args) => finish(one_url().and_then(|url| bench::run(&url, args))),
    };
    // Last: no connection is being opened when the process exits.
    outbox::cli::settle();
    code
}

/// Prints a command's error as `outbox::cli::finish` does and turns the result into the exit
/// code.
fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("outbox: {}", outbox::cli::printable(&format!("{e:#}")));
            // The library's errors keep their exit codes (2 for bad usage).
            let code = e
                .downcast_ref::<outbox::Error>()
                .map_or(1, outbox::cli::exit_code);
            ExitCode::from(code)
        }
    }
}

/// `1 task`, `2 tasks`.
fn counted(n: u64, unit: &str) -> String {
    if n == 1 {
        format!("1 {unit}")
    } else {
        format!("{n} {unit}s")
    }
}

/// Worker flags as the library parses them, for the binary's own commands.
fn worker_config(
    args: &WorkerArgs,
    url: &outbox::DatabaseUrl,
) -> anyhow::Result<outbox::WorkerConfig> {
    Ok(args.config(url.backend())?)
}
