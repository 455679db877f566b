//! The schedules as the fleet runs them (`outbox schedules`).

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::Schedule;
use crate::db::DbConnection;
use crate::driver::schedule::{schedule_list, time_of, ScheduleListRow};
use crate::error::{OpContext, Result};
use crate::task::TaskState;

/// One schedule as `async_schedule` records it, with its next tick and its last tick's task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// The scheduled keyword.
    pub keyword: String,
    /// The expression of the node that last enqueued a tick (or first saw the schedule).
    pub expression: String,
    /// The latest tick enqueued (`None`: none yet).
    pub last_tick: Option<DateTime<Utc>>,
    /// The next tick after now (database clock): `None` when the expression does not parse
    /// in this program (written by another version) or has no tick left.
    pub next_tick: Option<DateTime<Utc>>,
    /// The id of the last tick's task (`None` when there is no tick yet, or its task was
    /// pruned).
    pub last_task_id: Option<i64>,
    /// The state of the last tick's task.
    #[serde(serialize_with = "state_text")]
    pub last_task_state: Option<TaskState>,
    /// When a node first saw the schedule: no tick before it runs.
    pub since: DateTime<Utc>,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
    /// The node (`host:pid`) that last changed it.
    pub updated_by: String,
}

/// Every schedule any node has run, by keyword, with its last and next tick (by the
/// database clock) and the state of its last tick's task.
///
/// ```no_run
/// # fn main() -> outbox::Result<()> {
/// let mut conn = outbox::DatabaseUrl::parse("app.db")?.connect()?;
/// for s in outbox::schedule::list(&mut conn)? {
///     println!("{} {} last {:?} next {:?}", s.keyword, s.expression, s.last_tick, s.next_tick);
/// }
/// # Ok(())
/// # }
/// ```
pub fn list(conn: &mut DbConnection) -> Result<Vec<ScheduleInfo>> {
    let rows = schedule_list(conn).op("schedule list")?;
    Ok(rows.into_iter().map(info).collect())
}

fn info(row: ScheduleListRow) -> ScheduleInfo {
    let now = time_of(&row.db_now);
    let next_tick = match (Schedule::parse(&row.expression), now) {
        (Ok(schedule), Some(now)) => schedule.next_after(now),
        _ => None,
    };
    let epoch = DateTime::<Utc>::UNIX_EPOCH;
    ScheduleInfo {
        last_tick: row.last_tick.as_deref().and_then(time_of),
        next_tick,
        last_task_id: row.task_id,
        last_task_state: row.task_state.and_then(|s| s.parse().ok()),
        since: time_of(&row.since).unwrap_or(epoch),
        updated_at: time_of(&row.updated_at).unwrap_or(epoch),
        updated_by: row.updated_by,
        keyword: row.keyword,
        expression: row.expression,
    }
}

/// A state as its stored text (`"done"`), or `null`.
fn state_text<S: serde::Serializer>(
    state: &Option<TaskState>,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    match state {
        Some(state) => serializer.serialize_str(state.as_str()),
        None => serializer.serialize_none(),
    }
}
