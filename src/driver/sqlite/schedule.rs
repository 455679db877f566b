//! Cron schedules on SQLite: `async_schedule`, its times stored as UTC text.

use diesel::sql_types::Text;
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::schedule::ScheduleDriver;
use crate::sql::Statement;

impl ScheduleDriver for SqliteConnection {
    fn schedule_insert(
        &mut self,
        keyword: &str,
        expression: &str,
        node: &str,
    ) -> QueryResult<usize> {
        Statement::<Sqlite>::new(
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
        Statement::<Sqlite>::new("UPDATE async_schedule SET last_tick = ")
            .bind::<Text, _>(tick.to_owned())
            .sql(", expression = ")
            .bind::<Text, _>(expression.to_owned())
            .sql(concat!(", updated_at = ", now!(), ", updated_by = "))
            .bind::<Text, _>(node.to_owned())
            .sql(" WHERE keyword = ")
            .bind::<Text, _>(keyword.to_owned())
            // Text of one shape compares as time.
            .sql(" AND (last_tick IS NULL OR last_tick < ")
            .bind::<Text, _>(tick.to_owned())
            .sql(")")
            .execute(self)
    }
}
