//! Cron schedules on MySQL: `async_schedule`, its UTC `DATETIME(3)` times read and written
//! as text of the one shape (`CAST(… AS CHAR)` gives `YYYY-MM-DD HH:MM:SS.mmm`).

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::Text;
use diesel::{QueryResult, RunQueryDsl};

use super::domain::unless_duplicate;
use crate::driver::schedule::ScheduleDriver;
use crate::sql::Statement;

impl ScheduleDriver for MysqlConnection {
    fn schedule_insert(
        &mut self,
        keyword: &str,
        expression: &str,
        node: &str,
    ) -> QueryResult<usize> {
        unless_duplicate(
            Statement::<Mysql>::new(
                "INSERT INTO async_schedule (keyword, expression, updated_by) VALUES (",
            )
            .bind::<Text, _>(keyword.to_owned())
            .sql(", ")
            .bind::<Text, _>(expression.to_owned())
            .sql(", ")
            .bind::<Text, _>(node.to_owned())
            .sql(")")
            .execute(self),
        )
    }

    fn schedule_advance(
        &mut self,
        keyword: &str,
        expression: &str,
        tick: &str,
        node: &str,
    ) -> QueryResult<usize> {
        Statement::<Mysql>::new("UPDATE async_schedule SET last_tick = CAST(")
            .bind::<Text, _>(tick.to_owned())
            .sql(" AS DATETIME(3)), expression = ")
            .bind::<Text, _>(expression.to_owned())
            .sql(concat!(", updated_at = ", now!(), ", updated_by = "))
            .bind::<Text, _>(node.to_owned())
            .sql(" WHERE keyword = ")
            .bind::<Text, _>(keyword.to_owned())
            .sql(" AND (last_tick IS NULL OR last_tick < CAST(")
            .bind::<Text, _>(tick.to_owned())
            .sql(" AS DATETIME(3)))")
            .execute(self)
    }
}
