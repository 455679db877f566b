//! `outbox prune`.

use std::time::Duration;

use clap::Args;

use super::out::say;
use crate::db::DatabaseUrl;
use crate::migrate::ensure_migrated;
use crate::prune::{prune, PruneParams, PruneReport, DEFAULT_PRUNE_BATCH};

/// The flags of `outbox prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Delete tasks that finished more than this long ago, by the database clock (e.g. 7d),
    /// and nodes gone or silent for that long. Required: there is no default age.
    #[arg(long, value_parser = super::parse_duration)]
    older_than: Duration,
    /// Keep dead tasks, however old (for inspection and retry); delete only done and
    /// cancelled ones.
    #[arg(long)]
    keep_dead: bool,
    /// Rows per DELETE statement, each in its own short transaction (1 to 1000000).
    #[arg(long = "batch", default_value_t = DEFAULT_PRUNE_BATCH)]
    batch_size: usize,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(url: &DatabaseUrl, args: PruneArgs) -> crate::Result<()> {
    let mut params = PruneParams::new(args.older_than).batch_size(args.batch_size);
    if args.keep_dead {
        params = params.keep_dead();
    }
    params.validate()?;
    url.require_existing()?;
    let mut conn = url.connect()?;
    ensure_migrated(&mut conn)?;
    let report = prune(&mut conn, &params)?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "tasks": report.tasks(), "done": report.done, "dead": report.dead,
                "cancelled": report.cancelled, "nodes": report.nodes, "batches": report.batches,
                "seconds": report.elapsed.as_secs_f64(),
            })
        );
    } else {
        say!("{}", summary(&report));
    }
    Ok(())
}

/// `pruned 20000 tasks (19990 done, 10 dead) and 3 nodes in 0.21s`: the states with
/// nothing deleted are left out.
fn summary(report: &PruneReport) -> String {
    let by_state: Vec<String> = [
        (report.done, "done"),
        (report.dead, "dead"),
        (report.cancelled, "cancelled"),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, state)| format!("{n} {state}"))
    .collect();
    let by_state = if by_state.is_empty() {
        String::new()
    } else {
        format!(" ({})", by_state.join(", "))
    };
    format!(
        "pruned {}{by_state} and {} in {:.2}s",
        plural(report.tasks(), "task"),
        plural(report.nodes, "node"),
        report.elapsed.as_secs_f64()
    )
}

fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_names_the_states_deleted() {
        let report = PruneReport {
            done: 19_990,
            dead: 10,
            nodes: 3,
            batches: 3,
            elapsed: Duration::from_millis(210),
            ..PruneReport::default()
        };
        assert_eq!(
            summary(&report),
            "pruned 20000 tasks (19990 done, 10 dead) and 3 nodes in 0.21s"
        );
        let report = PruneReport {
            cancelled: 1,
            nodes: 1,
            ..PruneReport::default()
        };
        assert_eq!(
            summary(&report),
            "pruned 1 task (1 cancelled) and 1 node in 0.00s"
        );
        assert_eq!(
            summary(&PruneReport::default()),
            "pruned 0 tasks and 0 nodes in 0.00s"
        );
    }
}
