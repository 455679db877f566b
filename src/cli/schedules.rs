//! `outbox schedules`: each cron schedule the fleet runs, with its last and next tick and
//! its last tick's task ([`crate::schedule::list`]).

use chrono::{DateTime, SecondsFormat, Utc};
use clap::Args;

use super::out::say;
use crate::db::DatabaseUrl;
use crate::migrate::ensure_migrated;
use crate::schedule::{list, ScheduleInfo};

/// The flags of `outbox schedules`.
#[derive(Debug, Args)]
pub struct SchedulesArgs {
    /// One JSON object per schedule per line.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(url: &DatabaseUrl, args: SchedulesArgs) -> crate::Result<()> {
    url.require_existing()?;
    let mut conn = url.connect()?;
    ensure_migrated(&mut conn)?;
    let schedules = list(&mut conn)?;
    if args.json {
        for schedule in &schedules {
            println!(
                "{}",
                serde_json::to_string(schedule).expect("a schedule serialises")
            );
        }
        return Ok(());
    }
    if schedules.is_empty() {
        say!("no schedules: no node has run one yet");
        return Ok(());
    }
    let header = format!(
        "{:<32} {:<28} {:<21} {:<20} {}",
        "keyword", "expression", "last tick", "last task", "next tick"
    );
    say!("{}", header.trim_end());
    for s in &schedules {
        say!(
            "{:<32} {:<28} {:<21} {:<20} {}",
            s.keyword,
            s.expression,
            time(s.last_tick),
            last_task(s),
            time(s.next_tick)
        );
    }
    Ok(())
}

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.to_rfc3339_opts(SecondsFormat::Secs, true),
    )
}

/// `17 done`; `-` before the first tick; `pruned` when the tick's task is gone.
fn last_task(s: &ScheduleInfo) -> String {
    match (s.last_tick, s.last_task_id, s.last_task_state) {
        (None, _, _) => "-".to_owned(),
        (Some(_), Some(id), Some(state)) => format!("{id} {state}"),
        (Some(_), _, _) => "pruned".to_owned(),
    }
}
