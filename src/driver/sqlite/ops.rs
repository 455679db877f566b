//! The operator's reads and bulk changes on SQLite, whose times are stored as UTC text.

use diesel::sqlite::SqliteConnection;
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::ops::{retry_states, where_selected, OpsDriver, TaskSelect, PARENT_PRUNED};
use crate::sql::Statement;

/// The parents of the task `async_task.id` that are not done.
macro_rules! waiting_for {
    () => {
        "(SELECT count(*) FROM async_task_parent l JOIN async_task p ON p.id = l.parent_id
           WHERE l.child_id = async_task.id AND p.state <> 'done')"
    };
}

impl OpsDriver for SqliteConnection {
    fn task_retry_matching(&mut self, select: &TaskSelect<'_>) -> QueryResult<i64> {
        let select = retry_states(select);
        // The write lock is held: no parent completes (or is pruned) meanwhile. A parent
        // retried by the same statement is not done, before or after its own update: its
        // child waits for it.
        let n = where_selected(
            Statement::new(concat!(
                "UPDATE async_task SET state = CASE WHEN ",
                waiting_for!(),
                " > 0 THEN 'blocked' ELSE 'pending' END, blocked_by = ",
                waiting_for!(),
                ", failures = 0, owner = NULL, run_at = ",
                now!(),
                ", finished_at = NULL, deadline_at = NULL, updated_at = ",
                now!()
            )),
            &select,
        )
        .sql(" AND NOT ")
        .sql(PARENT_PRUNED)
        .execute(self)?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }
}
