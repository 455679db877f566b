//! Retry: a dead or cancelled task back to pending.

use crate::cancel::state_of;
use crate::enqueue::EnqueueConnection;
use crate::error::{OpContext, Result};
use crate::task::TaskState;

/// What a retry did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retried {
    /// The task's id.
    pub id: i64,
    /// `true` when this call put the task back to pending; `false` when it was neither dead
    /// nor cancelled, in which case nothing was written.
    pub retried: bool,
    /// The task's state now.
    pub state: TaskState,
    /// `true` when the task is dead or cancelled and was not retried because one of its
    /// parents was pruned: the outcome it waited for is gone, so it stays as it is.
    pub parent_pruned: bool,
}

/// Puts the dead or cancelled task `id` back to `pending`, due now, with its failures reset
/// to 0 (its `last_error` is kept until its next failure), in the caller's transaction. A
/// task with a parent that is not `done` goes back to `blocked` instead, until that parent is
/// done: retry the parent too when it is dead or cancelled (retrying a parent does not bring
/// back the children it cancelled). A child whose dead or cancelled parent was pruned is not
/// retried (`retried: false`): the outcome it waited for is gone. A
/// task in any other state is left as it is. The tenant's `max_queued` is not checked (it is
/// checked when a task is inserted).
///
/// Fails with [`crate::Error::TaskNotFound`] when there is no such task.
pub fn retry<C: EnqueueConnection + ?Sized>(conn: &mut C, id: i64) -> Result<Retried> {
    let driver = conn.driver();
    let retried = driver.task_retry(id).op("task retry")? == 1;
    let state = state_of(driver, id, "task retry", || id.to_string())?;
    // The retry refuses a dead or cancelled task only when one of its parents was pruned.
    let parent_pruned = !retried && matches!(state, TaskState::Dead | TaskState::Cancelled);
    Ok(Retried {
        id,
        retried,
        state,
        parent_pruned,
    })
}
