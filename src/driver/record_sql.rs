//! The fenced writes that record a claimed task's failure or release, the same on every
//! backend: written once, with the query builder (whose prepared statements diesel caches).
//! Each names the task's id, owner and claim token and requires `state = 'running'`, so a
//! node whose claim was taken over writes nothing. (The completion, the hot statement, is
//! each backend's.)

use chrono::NaiveDateTime;
use diesel::prelude::*;

use super::clock::{db_later, DbNow};
use super::dialect::{on_backend, Conn};
use super::Claim;
use crate::schema::async_task;

/// `UPDATE async_task` of the task of `claim`, while that claim holds it.
macro_rules! fenced {
    ($claim:expr) => {
        diesel::update(async_task::table.find($claim.id))
            .filter(async_task::owner.eq($claim.owner))
            .filter(async_task::claim_token.eq($claim.token))
            .filter(async_task::state.eq("running"))
    };
}

/// What a task that stops running leaves on SQLite and MySQL: their lease index.
fn lease_left(
    conn: &Conn<'_>,
) -> Option<diesel::dsl::Eq<async_task::deadline_at, Option<NaiveDateTime>>> {
    conn.has_lease_index()
        .then_some(async_task::deadline_at.eq(None::<NaiveDateTime>))
}

/// What a task given back to the claims sets: pending, no owner, and [`lease_left`].
macro_rules! requeued {
    ($conn:expr) => {
        (
            async_task::state.eq("pending"),
            async_task::owner.eq(None::<i64>),
            lease_left($conn),
        )
    };
}

/// See [`super::Driver::task_fail_retry`].
pub(super) fn task_fail_retry(
    conn: Conn<'_>,
    claim: &Claim,
    error: &str,
    delay_ms: i64,
) -> QueryResult<usize> {
    let requeued = requeued!(&conn);
    on_backend!(conn, |c| fenced!(claim)
        .set((
            requeued,
            async_task::failures.eq(async_task::failures + 1),
            async_task::last_error.eq(error),
            async_task::run_at.eq(db_later(delay_ms)),
            async_task::updated_at.eq(DbNow),
        ))
        .execute(c))
}

/// See [`super::Driver::task_fail_dead`]: the task alone (MySQL, without the trigger that
/// cancels its descendants, does that after).
pub(super) fn task_fail_dead(conn: Conn<'_>, claim: &Claim, error: &str) -> QueryResult<usize> {
    let lease = lease_left(&conn);
    on_backend!(conn, |c| fenced!(claim)
        .set((
            async_task::state.eq("dead"),
            lease,
            async_task::failures.eq(async_task::failures + 1),
            async_task::last_error.eq(error),
            async_task::finished_at.eq(DbNow.nullable()),
            async_task::updated_at.eq(DbNow),
        ))
        .execute(c))
}

/// See [`super::Driver::task_release`].
pub(super) fn task_release(
    conn: Conn<'_>,
    claim: &Claim,
    note: Option<&str>,
) -> QueryResult<usize> {
    let requeued = requeued!(&conn);
    on_backend!(conn, |c| fenced!(claim)
        .set((
            requeued,
            async_task::updated_at.eq(DbNow),
            note.map(|note| async_task::last_error.eq(note)),
        ))
        .execute(c))
}

/// See [`super::Driver::task_hold`].
pub(super) fn task_hold(
    conn: Conn<'_>,
    claim: &Claim,
    note: Option<&str>,
    timeout_ms: i64,
) -> QueryResult<usize> {
    on_backend!(conn, |c| fenced!(claim)
        .set((
            async_task::deadline_at.eq(db_later(timeout_ms).nullable()),
            async_task::updated_at.eq(DbNow),
            note.map(|note| async_task::last_error.eq(note)),
        ))
        .execute(c))
}
