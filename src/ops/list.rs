//! Listing tasks a page at a time (`outbox list`).

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{age_secs, state_of, state_text, time, time_or_epoch, Filter};
use crate::db::DbConnection;
use crate::driver::ops::{task_list, TaskListRow, TaskPageAt};
use crate::error::{Error, OpContext, Result};
use crate::task::TaskState;

/// The tasks per page when a query sets none.
pub const DEFAULT_PAGE_LIMIT: usize = 50;
/// The most tasks one page holds: a page is read into memory whole.
pub const MAX_PAGE_LIMIT: usize = 1000;

/// A page of [`list_tasks`]: a [`Filter`], a page size and a cursor.
///
/// Pages are keyset pages on the task id: the next page is the tasks after the last id of
/// this one ([`Page::next_after_id`]), so paging never skips or repeats a task however the
/// table changes meanwhile, and each page costs the same however deep it is.
///
/// ```
/// use outbox::ops::{Filter, TaskQuery};
/// use outbox::TaskState;
///
/// let first = TaskQuery::new(Filter::default().state(TaskState::Dead)).limit(20);
/// let second = first.clone().after_id(1234); // the first page's `next_after_id`
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskQuery {
    /// Which tasks.
    pub filter: Filter,
    /// Tasks per page, 1 to [`MAX_PAGE_LIMIT`] ([`DEFAULT_PAGE_LIMIT`] by default).
    pub limit: usize,
    /// The cursor: only tasks after this id in the listing's order (`None`: from the start).
    pub after_id: Option<i64>,
    /// Newest tasks (highest ids) first, instead of oldest first.
    pub newest_first: bool,
}

impl TaskQuery {
    /// The first page of the tasks `filter` matches, oldest first.
    pub fn new(filter: Filter) -> Self {
        TaskQuery {
            filter,
            limit: DEFAULT_PAGE_LIMIT,
            after_id: None,
            newest_first: false,
        }
    }

    /// At most `limit` tasks per page.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// The page after the task `id` in the listing's order.
    pub fn after_id(mut self, id: i64) -> Self {
        self.after_id = Some(id);
        self
    }

    /// Highest ids first.
    pub fn newest_first(mut self, newest_first: bool) -> Self {
        self.newest_first = newest_first;
        self
    }

    /// Checks the query on its own: its filter ([`Filter::validate`]) and its limit
    /// ([`Error::InvalidConfig`] naming `limit`).
    pub fn validate(&self) -> Result<()> {
        check_limit(self.limit)?;
        self.filter.validate()
    }
}

/// Refuses a page size outside 1 to [`MAX_PAGE_LIMIT`].
pub(crate) fn check_limit(limit: usize) -> Result<i64> {
    if limit == 0 || limit > MAX_PAGE_LIMIT {
        return Err(Error::InvalidConfig {
            setting: "limit",
            reason: format!("must be between 1 and {MAX_PAGE_LIMIT}, not {limit}"),
        });
    }
    Ok(i64::try_from(limit).expect("at most MAX_PAGE_LIMIT"))
}

/// A task as a listing shows it: every column but the payload.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct TaskSummary {
    /// The task's id.
    pub id: i64,
    /// Its keyword.
    pub keyword: String,
    /// Its business key.
    pub biz_id: String,
    /// Its tenant.
    pub tenant: Option<String>,
    /// Its state.
    #[serde(serialize_with = "state_text")]
    pub state: TaskState,
    /// Failures counted since it was enqueued or last retried.
    pub failures: i32,
    /// Its own max attempts (`None`: the worker's `--max-attempts`).
    pub max_attempts: Option<i32>,
    /// Lower runs first.
    pub priority: i32,
    /// Not claimed before this.
    pub run_at: DateTime<Utc>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// When it finished (done, dead or cancelled).
    pub finished_at: Option<DateTime<Utc>>,
    /// The node that claimed it last.
    pub owner: Option<i64>,
    /// Its last failure's error (truncated, never the payload), or why it was cancelled or
    /// rescued.
    pub last_error: Option<String>,
    /// Seconds since it was enqueued, by the database clock.
    pub age_secs: f64,
}

impl From<TaskListRow> for TaskSummary {
    fn from(row: TaskListRow) -> Self {
        let now = time_or_epoch(&row.db_now);
        let created_at = time_or_epoch(&row.created_at);
        TaskSummary {
            state: state_of(&row.state),
            run_at: time_or_epoch(&row.run_at),
            updated_at: time_or_epoch(&row.updated_at),
            finished_at: row.finished_at.as_deref().and_then(time),
            age_secs: age_secs(now, created_at),
            created_at,
            id: row.id,
            keyword: row.keyword,
            biz_id: row.biz_id,
            tenant: row.tenant,
            failures: row.failures,
            max_attempts: row.max_attempts,
            priority: row.priority,
            owner: row.owner,
            last_error: row.last_error,
        }
    }
}

/// One page of tasks.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Page {
    /// The tasks, in the listing's order.
    pub tasks: Vec<TaskSummary>,
    /// The cursor of the next page ([`TaskQuery::after_id`]): `None` when this page is the
    /// last.
    pub next_after_id: Option<i64>,
}

/// One page of the tasks `query` matches, read with one statement that reads at most one
/// task more than the page (to tell whether another page follows): never the table.
///
/// The database walks the primary key from the cursor, so a page costs the rows it
/// inspects to find its tasks: a filter that matches few tasks of a large table (a rare
/// state, an old keyword) may read many rows for one page.
///
/// Refused with the errors of [`TaskQuery::validate`] before anything is read.
///
/// ```no_run
/// use outbox::ops::{list_tasks, Filter, TaskQuery};
/// use outbox::TaskState;
///
/// # fn main() -> outbox::Result<()> {
/// let mut conn = outbox::DatabaseUrl::parse("app.db")?.connect()?;
/// let mut query = TaskQuery::new(Filter::default().state(TaskState::Dead));
/// loop {
///     let page = list_tasks(&mut conn, &query)?;
///     for task in &page.tasks {
///         println!("{} {} {:?}", task.id, task.keyword, task.last_error);
///     }
///     match page.next_after_id {
///         Some(id) => query = query.after_id(id),
///         None => break,
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub fn list_tasks(conn: &mut DbConnection, query: &TaskQuery) -> Result<Page> {
    let limit = check_limit(query.limit)?;
    let select = query.filter.select()?;
    let page = TaskPageAt {
        after_id: query.after_id,
        newest_first: query.newest_first,
        limit: limit + 1,
    };
    let mut rows = task_list(conn, &select, &page).op("task list")?;
    let more = rows.len() > query.limit;
    rows.truncate(query.limit);
    let tasks: Vec<TaskSummary> = rows.into_iter().map(TaskSummary::from).collect();
    let next_after_id = if more {
        tasks.last().map(|t| t.id)
    } else {
        None
    };
    Ok(Page {
        tasks,
        next_after_id,
    })
}
