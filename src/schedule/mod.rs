//! Cron schedules: a handler registered with a schedule runs at each of its ticks, as the
//! task `(keyword, "cron:<tick in UTC>")` (docs/guide/src/cron.md).
//!
//! Every live node that has the schedule enqueues each tick as it comes due, by the database
//! clock; the task's unique `(keyword, biz_id)` makes it one task per tick across the fleet,
//! with no leader. `async_schedule` records each schedule's latest tick, in the transaction
//! that enqueues it, and never moves it back. A schedule seen for the first time starts from
//! then: ticks before it never run. A tick that no node enqueued within `dead_after` of its
//! time was *missed* (no live node had the schedule); when the oldest due tick is missed,
//! only the latest due tick runs, unless the schedule asks for backfill
//! ([`Schedule::backfill`]): then every due tick within the window does, the latest
//! [`MAX_TICKS`] at most.
//!
//! ```
//! use std::time::Duration;
//! use outbox::schedule::Schedule;
//! use outbox::{HandlerResult, Registry, TaskContext, TaskTx};
//!
//! fn daily_report(task: &TaskContext, _tx: &mut TaskTx) -> HandlerResult {
//!     let tick = outbox::schedule::tick_of(task.biz_id()); // Some(2026-11-24T03:00:00Z)
//!     let _ = tick;
//!     Ok(())
//! }
//!
//! let mut registry = Registry::new();
//! registry.schedule("report.daily", "0 0 3 * * *", daily_report);
//! // Or with options, without a panic on a bad expression:
//! registry.register("report.hourly", daily_report);
//! let hourly = Schedule::parse("TZ=Europe/Paris 0 0 * * * ?")?
//!     .backfill(Duration::from_secs(6 * 3600))
//!     .data(serde_json::json!({"format": "pdf"}));
//! registry.add_schedule("report.hourly", hourly)?;
//! # Ok::<(), outbox::schedule::ScheduleError>(())
//! ```

mod crontab;
mod expr;
mod list;

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};

pub use crontab::{parse_crontab, parse_crontab_file, CrontabEntry};
pub use expr::Schedule;
pub use list::{list, ScheduleInfo};

/// The longest backfill window a schedule may ask for: 7 days.
pub const MAX_BACKFILL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most ticks of one schedule that one pass enqueues (the latest ones): a bound on a
/// backfill, and on a fleet that comes back late with a `dead_after` longer than many ticks.
pub const MAX_TICKS: usize = 1_000;

/// The longest expression accepted (the schema's bound), in bytes.
pub const MAX_EXPRESSION_LEN: usize = 256;

/// What is wrong with a schedule, named: the expression and why it does not parse, the
/// keyword it was registered for, or the crontab file and line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The expression does not parse, names an unknown time zone, or never comes due.
    #[error("cron expression {expression:?}: {reason}")]
    InvalidExpression {
        /// The expression as given.
        expression: String,
        /// Why it was refused.
        reason: String,
    },

    /// A schedule was added for a keyword that has no handler in the registry.
    #[error("keyword {keyword:?} has no handler registered: a schedule needs one")]
    UnknownKeyword {
        /// The keyword.
        keyword: String,
    },

    /// The keyword already has a schedule: one per keyword.
    #[error(
        "keyword {keyword:?} already has a schedule ({expression:?}): one schedule per keyword"
    )]
    DuplicateSchedule {
        /// The keyword.
        keyword: String,
        /// The schedule it has.
        expression: String,
    },

    /// The backfill window is longer than [`MAX_BACKFILL`].
    #[error(
        "schedule of keyword {keyword:?}: backfill of {backfill:?} is longer than the most, \
         {max:?}"
    )]
    InvalidBackfill {
        /// The keyword.
        keyword: String,
        /// The window asked for.
        backfill: Duration,
        /// [`MAX_BACKFILL`].
        max: Duration,
    },

    /// The schedule's data would not make a valid task payload (too large, or a `\u0000`).
    #[error("schedule of keyword {keyword:?}: data: {reason}")]
    InvalidData {
        /// The keyword.
        keyword: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A crontab file cannot be read, or one of its lines is wrong.
    #[error("crontab {path}{}: {reason}", line.map_or_else(String::new, |l| format!(" line {l}")))]
    Crontab {
        /// The file.
        path: String,
        /// The line (1-based), when the error is a line's.
        line: Option<usize>,
        /// What is wrong.
        reason: String,
    },
}

/// The biz_id of the task of the tick `tick`: `cron:` and the tick in UTC, RFC 3339 to the
/// second (`cron:2026-11-24T03:00:00Z`).
///
/// ```
/// use chrono::{TimeZone, Utc};
/// let tick = Utc.with_ymd_and_hms(2026, 11, 24, 3, 0, 0).unwrap();
/// assert_eq!(outbox::schedule::tick_biz_id(tick), "cron:2026-11-24T03:00:00Z");
/// ```
pub fn tick_biz_id(tick: DateTime<Utc>) -> String {
    format!("cron:{}", tick.to_rfc3339_opts(SecondsFormat::Secs, true))
}

/// The tick a scheduled task runs for, read from its biz_id (`None` when the biz_id is not
/// a tick's): for a handler that needs its tick's time.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// let tick = outbox::schedule::tick_of("cron:2026-11-24T03:00:00Z");
/// assert_eq!(tick, Some(Utc.with_ymd_and_hms(2026, 11, 24, 3, 0, 0).unwrap()));
/// assert_eq!(outbox::schedule::tick_of("42"), None);
/// ```
pub fn tick_of(biz_id: &str) -> Option<DateTime<Utc>> {
    let text = biz_id.strip_prefix("cron:")?;
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}
