//! Cron schedules on SQLite: `async_schedule`, its times stored as UTC text.

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::Text;
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::schedule::{ScheduleDriver, ScheduleListRow, ScheduleRow};
use crate::sql::Statement;

impl ScheduleDriver for MysqlConnection {
    fn schedule_read(&mut self, keywords: &[String]) -> QueryResult<Vec<ScheduleRow>> {
        let keywords = serde_json::to_string(keywords).expect("strings serialise");
        Statement::<Mysql>::new(concat!(
            "SELECT ",
            now!(),
            " AS db_now, s.keyword, s.since, s.last_tick
               FROM (SELECT 1) AS one
               LEFT JOIN async_schedule s ON s.keyword IN (SELECT value FROM json_each("
        ))
        .bind::<Text, _>(keywords)
        .sql("))")
        .load(self)
    }

    fn schedule_insert(
        &mut self,
        keyword: &str,
        expression: &str,
        node: &str,
    ) -> QueryResult<usize> {
        Statement::<Mysql>::new(
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
        Statement::<Mysql>::new("UPDATE async_schedule SET last_tick = ")
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

    fn schedule_list(&mut self) -> QueryResult<Vec<ScheduleListRow>> {
        Statement::<Mysql>::new(concat!(
            "SELECT ",
            now!(),
            " AS db_now, s.keyword, s.expression, s.since, s.last_tick, s.updated_at,
                    s.updated_by, t.id AS task_id, t.state AS task_state
               FROM async_schedule s
               LEFT JOIN async_task t ON t.keyword = s.keyword
                AND t.biz_id = 'cron:' || strftime('%Y-%m-%dT%H:%M:%SZ', s.last_tick)
              ORDER BY s.keyword"
        ))
        .load(self)
    }
}
