//! The cron schedules' SQL (`async_schedule`), behind a trait of its own: each backend
//! implements it in its `schedule.rs`.
//!
//! Times travel as UTC text of the shape `YYYY-MM-DD HH:MM:SS.SSS` on every backend (what
//! SQLite stores; PostgreSQL formats and reads its `timestamptz` columns so), so that the
//! rows are one type.

use chrono::{DateTime, NaiveDateTime, Utc};
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::QueryResult;

use crate::db::DbConnection;

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
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct ScheduleRow {
    #[diesel(sql_type = Text)]
    pub db_now: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub keyword: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub since: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub last_tick: Option<String>,
}

/// One schedule's row for the listing, with its last tick's task and the database clock.
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct ScheduleListRow {
    #[diesel(sql_type = Text)]
    pub db_now: String,
    #[diesel(sql_type = Text)]
    pub keyword: String,
    #[diesel(sql_type = Text)]
    pub expression: String,
    #[diesel(sql_type = Text)]
    pub since: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub last_tick: Option<String>,
    #[diesel(sql_type = Text)]
    pub updated_at: String,
    #[diesel(sql_type = Text)]
    pub updated_by: String,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub task_id: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub task_state: Option<String>,
}

/// The database operations of cron schedules.
pub trait ScheduleDriver {
    /// The database clock, and the rows of those of `keywords` that have one: at least one
    /// row, whose `keyword` is `None` when none has.
    fn schedule_read(&mut self, keywords: &[String]) -> QueryResult<Vec<ScheduleRow>>;

    /// Inserts the row of a schedule seen for the first time (`since` now, no tick yet);
    /// nothing when it exists. Returns the rows inserted.
    fn schedule_insert(
        &mut self,
        keyword: &str,
        expression: &str,
        node: &str,
    ) -> QueryResult<usize>;

    /// Records `tick` as the schedule's last tick, with the expression and the node that
    /// enqueued it, unless its last tick is `tick` or later (it never moves back): in the
    /// caller's transaction, the one that enqueues the tick. Returns the rows updated.
    fn schedule_advance(
        &mut self,
        keyword: &str,
        expression: &str,
        tick: &str,
        node: &str,
    ) -> QueryResult<usize>;

    /// Every schedule's row, by keyword, with its last tick's task (id and state, if it is
    /// still there) and the database clock.
    fn schedule_list(&mut self) -> QueryResult<Vec<ScheduleListRow>>;
}

/// The schedule driver behind a connection.
pub(crate) fn schedule_driver(conn: &mut DbConnection) -> &mut dyn ScheduleDriver {
    match conn {
        #[cfg(feature = "postgres")]
        DbConnection::Pg(c) => c,
        #[cfg(feature = "sqlite")]
        DbConnection::Sqlite(c) => c,
        #[cfg(feature = "mysql")]
        DbConnection::Mysql(c) => c,
    }
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
