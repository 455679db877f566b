//! Cron schedules on PostgreSQL: `async_schedule`, its times formatted as UTC text.

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::{Array, Text};
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::schedule::{ScheduleDriver, ScheduleListRow, ScheduleRow};
use crate::sql::Statement;

/// `timestamptz` → the text shape of [`crate::driver::schedule::time_text`].
macro_rules! utc_text {
    ($column:literal) => {
        concat!(
            "to_char(",
            $column,
            " AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS')"
        )
    };
}

/// That text → `timestamptz`, after a bind.
const FROM_UTC_TEXT: &str = "::timestamp AT TIME ZONE 'UTC'";

impl ScheduleDriver for PgConnection {
    fn schedule_read(&mut self, keywords: &[String]) -> QueryResult<Vec<ScheduleRow>> {
        Statement::<Pg>::new(concat!(
            "SELECT ",
            utc_text!("now()"),
            " AS db_now, s.keyword, ",
            utc_text!("s.since"),
            " AS since, ",
            utc_text!("s.last_tick"),
            " AS last_tick
               FROM (SELECT 1) AS one
               LEFT JOIN async_schedule s ON s.keyword = ANY("
        ))
        .bind::<Array<Text>, _>(keywords.to_vec())
        .sql(")")
        .load(self)
    }

    fn schedule_insert(
        &mut self,
        keyword: &str,
        expression: &str,
        node: &str,
    ) -> QueryResult<usize> {
        Statement::<Pg>::new(
            "INSERT INTO async_schedule (keyword, expression, updated_by) VALUES (",
        )
        .bind::<Text, _>(keyword.to_owned())
        .sql(", ")
        .bind::<Text, _>(expression.to_owned())
        .sql(", ")
        .bind::<Text, _>(node.to_owned())
        .sql(") ON CONFLICT (keyword) DO NOTHING")
        .execute(self)
    }

    fn schedule_advance(
        &mut self,
        keyword: &str,
        expression: &str,
        tick: &str,
        node: &str,
    ) -> QueryResult<usize> {
        Statement::<Pg>::new("UPDATE async_schedule SET last_tick = ")
            .bind::<Text, _>(tick.to_owned())
            .sql(FROM_UTC_TEXT)
            .sql(", expression = ")
            .bind::<Text, _>(expression.to_owned())
            .sql(", updated_at = now(), updated_by = ")
            .bind::<Text, _>(node.to_owned())
            .sql(" WHERE keyword = ")
            .bind::<Text, _>(keyword.to_owned())
            .sql(" AND (last_tick IS NULL OR last_tick < ")
            .bind::<Text, _>(tick.to_owned())
            .sql(FROM_UTC_TEXT)
            .sql(")")
            .execute(self)
    }

    fn schedule_list(&mut self) -> QueryResult<Vec<ScheduleListRow>> {
        Statement::<Pg>::new(concat!(
            "SELECT ",
            utc_text!("now()"),
            " AS db_now, s.keyword, s.expression, ",
            utc_text!("s.since"),
            " AS since, ",
            utc_text!("s.last_tick"),
            " AS last_tick, ",
            utc_text!("s.updated_at"),
            " AS updated_at, s.updated_by, t.id AS task_id, t.state AS task_state
               FROM async_schedule s
               LEFT JOIN async_task t ON t.keyword = s.keyword
                AND t.biz_id = 'cron:' || to_char(s.last_tick AT TIME ZONE 'UTC',
                                                  'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
              ORDER BY s.keyword"
        ))
        .load(self)
    }
}
