//! The cron schedules' SQL (`async_schedule`): written once, with the query builder.
//!
//! Times travel as UTC text of the shape `YYYY-MM-DD HH:MM:SS.SSS` on every backend (what
//! SQLite stores; PostgreSQL formats and reads its `timestamptz` columns so), so that the
//! rows are one type.

use chrono::{DateTime, NaiveDateTime, Utc};
use diesel::prelude::*;
use diesel::QueryResult;

use super::clock::{self, DbNow};
use super::dialect::{on_backend, time_bind, unless_duplicate};
use super::driver;
use crate::db::DbConnection;
use crate::schedule::tick_biz_id;
use crate::schema::{async_schedule, async_task};

/// The shape of a time as both backends pass it.
const TIME_FORMAT: &str = "%Y-%m-%d %H:%M:%S%.3f";

/// A time as the schedule statements bind it.
pub fn time_text(t: DateTime<Utc>) -> String {
    t.format(TIME_FORMAT).to_string()
}

/// A time as the schedule statements return it (`None`: not of that shape).
pub fn time_of(text: &str) -> Option<DateTime<Utc>> {
    NaiveDateTime::parse_from_str(text, TIME_FORMAT)
        .ok()
        .map(|t| t.and_utc())
}

/// The database clock, and one schedule's row if it has one (`keyword` is `None` when the
/// read found no row at all: the line only carries the clock).
#[derive(Debug, Clone)]
pub struct ScheduleRow {
    pub db_now: String,
    pub keyword: Option<String>,
    pub since: Option<String>,
    pub last_tick: Option<String>,
}

/// One schedule's row for the listing, with its last tick's task and the database clock.
#[derive(Debug, Clone)]
pub struct ScheduleListRow {
    pub db_now: String,
    pub keyword: String,
    pub expression: String,
    pub since: String,
    pub last_tick: Option<String>,
    pub updated_at: String,
    pub updated_by: String,
    pub task_id: Option<i64>,
    pub task_state: Option<String>,
}

/// Inserts the row of a schedule seen for the first time (`since` now, no tick yet);
/// nothing when it exists. Returns the rows inserted.
pub(crate) fn schedule_insert(
    conn: &mut DbConnection,
    keyword: &str,
    expression: &str,
    node: &str,
) -> QueryResult<usize> {
    let conn = driver(conn).conn();
    let mysql = conn.is_mysql();
    on_backend!(conn, |c| {
        let insert = diesel::insert_into(async_schedule::table).values((
            async_schedule::keyword.eq(keyword),
            async_schedule::expression.eq(expression),
            async_schedule::updated_by.eq(node),
        ));
        if mysql {
            unless_duplicate(insert.execute(c))
        } else {
            insert.on_conflict_do_nothing().execute(c)
        }
    })
}

/// Records `latest` (UTC text of [`time_text`]'s shape) as the schedule's last tick, with
/// the expression and the node that enqueues the ticks from `first` to `latest`, unless its
/// last tick is `first` or later: another node has enqueued some of them since this one read
/// the schedule (which a unique key cannot tell once their tasks are pruned), and the last
/// tick never moves back. In the caller's transaction, the one that enqueues the ticks,
/// before it does: the row's lock orders the nodes' passes. Returns the rows updated.
pub(crate) fn schedule_advance(
    conn: &mut DbConnection,
    keyword: &str,
    expression: &str,
    (first, latest): (&str, &str),
    node: &str,
) -> QueryResult<usize> {
    on_backend!(driver(conn).conn(), |c| diesel::update(
        async_schedule::table
    )
    .filter(async_schedule::keyword.eq(keyword))
    .filter(
        async_schedule::last_tick
            .is_null()
            .or(async_schedule::last_tick.lt(time_bind(first).nullable())),
    )
    .set((
        async_schedule::last_tick.eq(time_bind(latest).nullable()),
        async_schedule::expression.eq(expression),
        async_schedule::updated_at.eq(DbNow),
        async_schedule::updated_by.eq(node),
    ))
    .execute(c))
}

/// The database clock, and the rows of those of `keywords` that have one: at least one row,
/// whose `keyword` is `None` when none has. The same on every backend: written once, with
/// the query builder.
pub(crate) fn schedule_read(
    conn: &mut DbConnection,
    keywords: &[String],
) -> QueryResult<Vec<ScheduleRow>> {
    let db_now = clock::time_text(diesel::select(DbNow).get_result(conn)?);
    let rows: Vec<(String, NaiveDateTime, Option<NaiveDateTime>)> = async_schedule::table
        .filter(async_schedule::keyword.eq_any(keywords))
        .select((
            async_schedule::keyword,
            async_schedule::since,
            async_schedule::last_tick,
        ))
        .load(conn)?;
    if rows.is_empty() {
        return Ok(vec![ScheduleRow {
            db_now,
            keyword: None,
            since: None,
            last_tick: None,
        }]);
    }
    Ok(rows
        .into_iter()
        .map(|(keyword, since, last_tick)| ScheduleRow {
            db_now: db_now.clone(),
            keyword: Some(keyword),
            since: Some(clock::time_text(since)),
            last_tick: last_tick.map(clock::time_text),
        })
        .collect())
}

/// Every schedule's row, by keyword, with its last tick's task (id and state, if it is
/// still there) and the database clock. Written once: the tick's biz_id is made here, as
/// the cron makes it, rather than in each backend's date formatting.
pub(crate) fn schedule_list(conn: &mut DbConnection) -> QueryResult<Vec<ScheduleListRow>> {
    let db_now = clock::time_text(diesel::select(DbNow).get_result(conn)?);
    let rows: Vec<(
        String,
        String,
        NaiveDateTime,
        Option<NaiveDateTime>,
        NaiveDateTime,
        String,
    )> = async_schedule::table
        .order(async_schedule::keyword)
        .select((
            async_schedule::keyword,
            async_schedule::expression,
            async_schedule::since,
            async_schedule::last_tick,
            async_schedule::updated_at,
            async_schedule::updated_by,
        ))
        .load(conn)?;
    let ticks: Vec<(String, String)> = rows
        .iter()
        .filter_map(|r| Some((r.0.clone(), tick_biz_id(r.3?.and_utc()))))
        .collect();
    let tasks: Vec<(i64, String, String, String)> = if ticks.is_empty() {
        Vec::new()
    } else {
        async_task::table
            .filter(async_task::keyword.eq_any(ticks.iter().map(|t| t.0.as_str())))
            .filter(async_task::biz_id.eq_any(ticks.iter().map(|t| t.1.as_str())))
            .select((
                async_task::id,
                async_task::keyword,
                async_task::biz_id,
                async_task::state,
            ))
            .load(conn)?
    };
    Ok(rows
        .into_iter()
        .map(
            |(keyword, expression, since, last_tick, updated_at, updated_by)| {
                let biz_id = last_tick.map(|t| tick_biz_id(t.and_utc()));
                let task = tasks
                    .iter()
                    .find(|t| t.1 == keyword && Some(&t.2) == biz_id.as_ref());
                ScheduleListRow {
                    db_now: db_now.clone(),
                    keyword,
                    expression,
                    since: clock::time_text(since),
                    last_tick: last_tick.map(clock::time_text),
                    updated_at: clock::time_text(updated_at),
                    updated_by,
                    task_id: task.map(|t| t.0),
                    task_state: task.map(|t| t.3.clone()),
                }
            },
        )
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_through_the_text_shape() {
        let t = time_of("2026-11-24 03:00:00.250").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-11-24T03:00:00.250+00:00");
        assert_eq!(time_text(t), "2026-11-24 03:00:00.250");
        assert_eq!(time_of("2026-11-24T03:00:00Z"), None);
    }
}
