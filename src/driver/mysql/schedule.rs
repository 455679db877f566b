//! Cron schedules on MySQL: `async_schedule`, its UTC `DATETIME(3)` times read and written
//! as text of the one shape (`CAST(… AS CHAR)` gives `YYYY-MM-DD HH:MM:SS.mmm`).

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::Text;
use diesel::{QueryResult, RunQueryDsl};

use super::domain::unless_duplicate;
use super::list;
use crate::driver::schedule::{ScheduleDriver, ScheduleListRow, ScheduleRow};
use crate::sql::Statement;

impl ScheduleDriver for MysqlConnection {
    fn schedule_read(&mut self, keywords: &[String]) -> QueryResult<Vec<ScheduleRow>> {
        Statement::<Mysql>::new(concat!(
            "SELECT CAST(",
            now!(),
            " AS CHAR) AS db_now, s.keyword, CAST(s.since AS CHAR) AS since,
                    CAST(s.last_tick AS CHAR) AS last_tick
               FROM (SELECT 1) AS one
               LEFT JOIN async_schedule s ON s.keyword IN "
        ))
        .with(|s| list::texts(s, keywords))
        .load(self)
    }

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

    fn schedule_list(&mut self) -> QueryResult<Vec<ScheduleListRow>> {
        Statement::<Mysql>::new(concat!(
            "SELECT CAST(",
            now!(),
            " AS CHAR) AS db_now, s.keyword, s.expression, CAST(s.since AS CHAR) AS since,
                    CAST(s.last_tick AS CHAR) AS last_tick,
                    CAST(s.updated_at AS CHAR) AS updated_at,
                    s.updated_by, t.id AS task_id, t.state AS task_state
               FROM async_schedule s
               LEFT JOIN async_task t ON t.keyword = s.keyword
                AND t.biz_id = CONCAT('cron:', DATE_FORMAT(s.last_tick, '%Y-%m-%dT%H:%i:%sZ'))
              ORDER BY s.keyword"
        ))
        .load(self)
    }
}
