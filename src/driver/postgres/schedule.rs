//! Cron schedules on PostgreSQL: `async_schedule`, its times formatted as UTC text.

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::Text;
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::schedule::ScheduleDriver;
use crate::sql::Statement;

/// UTC text of the shape of [`crate::driver::schedule::time_text`] → `timestamptz`, after a bind.
const FROM_UTC_TEXT: &str = "::timestamp AT TIME ZONE 'UTC'";

impl ScheduleDriver for PgConnection {
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
}
