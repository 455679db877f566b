//! One task whole, with its chain (`outbox show ID`).

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{state_of, state_text, time, TaskSummary};
use crate::db::DbConnection;
use crate::driver::ops::{task_children, task_detail, task_parents, TaskLinkRow};
use crate::error::{Error, OpContext, Result};
use crate::task::TaskState;

/// The most children [`show_task`] lists ([`TaskDetail::children_total`] counts them all).
pub const SHOW_CHILDREN_LIMIT: usize = 100;
/// How far up its ancestors [`show_task`] follows a task's error chain.
pub const ERROR_CHAIN_DEPTH: usize = 16;

/// A task at the other end of a chain link (a parent or a child), or in an error chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TaskLink {
    /// Its id.
    pub id: i64,
    /// Its keyword.
    pub keyword: String,
    /// Its business key.
    pub biz_id: String,
    /// Its state.
    #[serde(serialize_with = "state_text")]
    pub state: TaskState,
    /// Its last error.
    pub last_error: Option<String>,
}

impl From<TaskLinkRow> for TaskLink {
    fn from(row: TaskLinkRow) -> Self {
        TaskLink {
            state: state_of(&row.state),
            id: row.id,
            keyword: row.keyword,
            biz_id: row.biz_id,
            last_error: row.last_error,
        }
    }
}

/// Everything about one task: every column, its parents and children, and its error chain.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct TaskDetail {
    /// The columns a listing shows.
    #[serde(flatten)]
    pub task: TaskSummary,
    /// The payload.
    pub biz_data: serde_json::Value,
    /// Bumped by every claim; fences the writes of older claims.
    pub claim_token: i64,
    /// Its first parent (`async_task.parent_id`).
    pub parent_id: Option<i64>,
    /// When it was last claimed.
    pub claimed_at: Option<DateTime<Utc>>,
    /// A running task past it is rescued.
    pub deadline_at: Option<DateTime<Utc>>,
    /// How many of its parents are not done yet.
    pub blocked_by: i32,
    /// Its parents, by id (a pruned parent is left out).
    pub parents: Vec<TaskLink>,
    /// Its first [`SHOW_CHILDREN_LIMIT`] children, by id.
    pub children: Vec<TaskLink>,
    /// How many children it has in all.
    pub children_total: i64,
    /// Why it failed or was cancelled, following its chain up: the task itself when it has
    /// an error, then, while a task was cancelled because a parent ended dead or cancelled,
    /// that parent (the first such, by id), up to [`ERROR_CHAIN_DEPTH`] tasks.
    pub error_chain: Vec<TaskLink>,
}

/// Every column of the task `id`, its parents, its children (the first
/// [`SHOW_CHILDREN_LIMIT`], with their number) and its error chain
/// ([`TaskDetail::error_chain`]). Reads only.
///
/// Fails with [`Error::TaskNotFound`] when there is no such task.
///
/// ```no_run
/// # fn main() -> outbox::Result<()> {
/// let mut conn = outbox::DatabaseUrl::parse("app.db")?.connect()?;
/// let task = outbox::ops::show_task(&mut conn, 1234)?;
/// for link in &task.error_chain {
///     println!("task {} ({}): {:?}", link.id, link.state, link.last_error);
/// }
/// # Ok(())
/// # }
/// ```
pub fn show_task(conn: &mut DbConnection, id: i64) -> Result<TaskDetail> {
    let row = task_detail(conn, id)
        .op("task show")?
        .ok_or_else(|| Error::TaskNotFound {
            task: id.to_string(),
        })?;
    let parents: Vec<TaskLink> = links(task_parents(conn, id))?;
    let limit = i64::try_from(SHOW_CHILDREN_LIMIT).expect("a small limit");
    let (children, children_total) = task_children(conn, id, limit).op("task show")?;
    let biz_data = serde_json::from_str(&row.biz_data).unwrap_or(serde_json::Value::Null);
    let task = TaskSummary::from(row.list);
    let error_chain = error_chain(conn, &task, &parents)?;
    Ok(TaskDetail {
        biz_data,
        claim_token: row.claim_token,
        parent_id: row.parent_id,
        claimed_at: row.claimed_at.as_deref().and_then(time),
        deadline_at: row.deadline_at.as_deref().and_then(time),
        blocked_by: row.blocked_by,
        parents,
        children: children.into_iter().map(TaskLink::from).collect(),
        children_total,
        error_chain,
        task,
    })
}

fn links(rows: diesel::QueryResult<Vec<TaskLinkRow>>) -> Result<Vec<TaskLink>> {
    Ok(rows
        .op("task show")?
        .into_iter()
        .map(TaskLink::from)
        .collect())
}

/// Whether a task was cancelled because a parent ended dead or cancelled (the schema's
/// triggers write `parent task N is dead` as its error).
fn cancelled_by_parent(state: TaskState, last_error: Option<&str>) -> bool {
    state == TaskState::Cancelled && last_error.is_some_and(|e| e.starts_with("parent task "))
}

/// The parent that ended a task, among `parents`: the first dead or cancelled one.
fn ended_by(parents: &[TaskLink]) -> Option<&TaskLink> {
    parents
        .iter()
        .find(|p| matches!(p.state, TaskState::Dead | TaskState::Cancelled))
}

fn error_chain(
    conn: &mut DbConnection,
    task: &TaskSummary,
    parents: &[TaskLink],
) -> Result<Vec<TaskLink>> {
    let mut chain = Vec::new();
    if task.last_error.is_some() {
        chain.push(TaskLink {
            id: task.id,
            keyword: task.keyword.clone(),
            biz_id: task.biz_id.clone(),
            state: task.state,
            last_error: task.last_error.clone(),
        });
    }
    if !cancelled_by_parent(task.state, task.last_error.as_deref()) {
        return Ok(chain);
    }
    let mut next = ended_by(parents).cloned();
    while let Some(parent) = next.take() {
        if chain.len() >= ERROR_CHAIN_DEPTH {
            break;
        }
        let follow = cancelled_by_parent(parent.state, parent.last_error.as_deref());
        let id = parent.id;
        chain.push(parent);
        if follow {
            next = ended_by(&links(task_parents(conn, id))?).cloned();
        }
    }
    Ok(chain)
}
