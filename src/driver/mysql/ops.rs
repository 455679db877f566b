//! The operator's reads and bulk changes on MySQL: times (UTC `DATETIME(3)`) read as text
//! of the one shape, `CAST(… AS CHAR)`.

use diesel::connection::Connection;
use diesel::mysql::MysqlConnection;
use diesel::sql_types::BigInt;
use diesel::{QueryResult, RunQueryDsl};

use super::operate::{retry_ids, Id, CHUNK};
use crate::driver::ops::{retry_states, where_selected, OpsDriver, TaskSelect};
use crate::sql::Statement;

impl OpsDriver for MysqlConnection {
    fn task_retry_matching(&mut self, select: &TaskSelect<'_>) -> QueryResult<i64> {
        let select = retry_states(select);
        // A chunk of ids at a time, in id order (a parent before its children), each
        // retried as `outbox retry ID` retries one (`operate::retry_ids`, which leaves a task
        // one of whose parents was pruned), all in one transaction.
        let states: Vec<String> = select
            .states
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect();
        self.transaction(|conn| {
            let mut after = 0;
            let mut retried = 0;
            loop {
                let chunk: Vec<Id> =
                    where_selected(Statement::new("SELECT id FROM async_task"), &select)
                        .sql(" AND id > ")
                        .bind::<BigInt, _>(after)
                        .sql(" ORDER BY id LIMIT ")
                        .bind::<BigInt, _>(CHUNK)
                        .load(conn)?;
                let Some(last) = chunk.last() else { break };
                after = last.id;
                let ids: Vec<i64> = chunk.iter().map(|c| c.id).collect();
                retried += retry_ids(conn, &ids, &states)?;
                if i64::try_from(ids.len()).unwrap_or(i64::MAX) < CHUNK {
                    break;
                }
            }
            Ok(i64::try_from(retried).unwrap_or(i64::MAX))
        })
    }
}
