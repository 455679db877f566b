//! `outbox drain` and `outbox run` with `--database-url` repeated: one worker serving several
//! databases ([`crate::Fleet`]), reporting per database.

use super::progress::{Progress, ProgressStyle};
use super::work::{print_report, report_json, RunArgs};
use super::WorkerArgs;
use crate::db::DatabaseUrl;
use crate::error::{Error, Result};
use crate::registry::Registry;
use crate::worker::{DatabaseReport, Fleet, Report};

/// What a command that serves one database says when given several.
pub(super) fn only_one(given: usize) -> Error {
    Error::InvalidConfig {
        setting: "--database-url",
        reason: format!("is given {given} times: only `run` and `drain` serve several databases"),
    }
}

pub(super) fn drain(urls: &[DatabaseUrl], mut registry: Registry, args: WorkerArgs) -> Result<()> {
    let config = args.config(urls[0].backend())?;
    args.add_crontab(&mut registry)?;
    let fleet = Fleet::new(urls, registry, config)?;
    let style = ProgressStyle::detect(args.json);
    let total = match style {
        ProgressStyle::Quiet => 0,
        _ => fleet.due_count()?,
    };
    let totals = fleet.totals_reader();
    let reports = Progress::new(style, "draining", total).run_while(
        || totals().finished(),
        || fleet.drain_until_stopped(args.shutdown_timeout()),
    )?;
    finish("drained", reports, args.json)
}

pub(super) fn run(urls: &[DatabaseUrl], mut registry: Registry, args: RunArgs) -> Result<()> {
    let config = args
        .worker
        .config(urls[0].backend())?
        .poll_interval(args.poll_interval)
        .listen(!args.no_listen);
    args.worker.add_crontab(&mut registry)?;
    let fleet = Fleet::new(urls, registry, config)?;
    let reports = fleet.run_until_stopped(args.worker.shutdown_timeout())?;
    finish("ran", reports, args.worker.json)
}

/// Prints each database's report (one JSON object a line with `--json`, with its
/// `database`); fails with the first database's failure, the others' on stderr.
fn finish(verb: &str, reports: Vec<DatabaseReport<Report>>, json: bool) -> Result<()> {
    let mut failure = None;
    for DatabaseReport { database, result } in reports {
        match result {
            Ok(report) if json => {
                let mut line = report_json(&report);
                line["database"] = database.into();
                println!("{line}");
            }
            Ok(report) => print_report(&format!("{database}: {verb}"), &report, false),
            Err(source) => {
                let error = Error::OnDatabase {
                    database,
                    source: Box::new(source),
                };
                match failure {
                    None => failure = Some(error),
                    Some(_) => eprintln!("outbox: {}", super::printable(&error.to_string())),
                }
            }
        }
    }
    failure.map_or(Ok(()), Err)
}
