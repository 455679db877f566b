//! Operating a fleet: what the operator's commands (`outbox list`, `show`, `retry`,
//! `cancel`, `nodes`, `audit`) and a dashboard read and change, on either backend.
//!
//! Reads never load a table: listings are keyset pages on an id ([`list_tasks`],
//! [`audit_list`]), and ages are measured by the database clock. Changes
//! ([`retry_task`], [`retry_matching`], [`cancel_task`], [`cancel_matching`], and
//! [`pause`] / [`resume`] of a domain or keyword) check their input before touching
//! anything, and write one row of `async_audit` naming the `actor` (`$USER@host` from a
//! shell, [`local_actor`]; a web user's name from a dashboard) **in the transaction of the
//! change**: both commit, or neither. A dry run or a change that changes nothing is not
//! audited.
//!
//! ```no_run
//! use outbox::ops::{self, Filter, TaskQuery};
//! use outbox::TaskState;
//!
//! # fn main() -> outbox::Result<()> {
//! let mut conn = outbox::DatabaseUrl::parse("postgres://localhost/app")?.connect()?;
//! let dead = Filter::default().state(TaskState::Dead).keyword("mail.send");
//! let page = ops::list_tasks(&mut conn, &TaskQuery::new(dead.clone()).limit(20))?;
//! if let Some(task) = page.tasks.first() {
//!     let detail = ops::show_task(&mut conn, task.id)?;
//!     println!("{:?} ({} children)", detail.task.last_error, detail.children_total);
//! }
//! let done = ops::retry_matching(&mut conn, &dead, false, &ops::local_actor())?;
//! println!("retried {} task(s)", done.changed);
//! for node in ops::nodes(&mut conn, &ops::NodeQuery::default())? {
//!     println!("{} {} {} running", node.name, node.status.as_str(), node.running);
//! }
//! # Ok(())
//! # }
//! ```

mod audit;
mod change;
mod filter;
mod list;
mod nodes;
mod show;

use chrono::{DateTime, Utc};

pub use audit::{audit_list, local_actor, AuditPage, AuditQuery, AuditRecord};
pub use change::{
    cancel_matching, cancel_task, cancel_task_by_key, retry_matching, retry_task, validate_retry,
    Matched,
};
pub use filter::{Filter, MAX_AGE};
pub use list::{list_tasks, Page, TaskQuery, TaskSummary, DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT};
pub use nodes::{nodes, NodeInfo, NodeQuery, NodeStatus, DEFAULT_LIVE_WITHIN, DEFAULT_NODE_LIMIT};
pub use show::{show_task, TaskDetail, TaskLink, ERROR_CHAIN_DEPTH, SHOW_CHILDREN_LIMIT};

/// Pauses a domain or a keyword, audited: [`crate::domain::admin::pause`].
pub use crate::domain::admin::pause;
/// Resumes a domain or a keyword, audited: [`crate::domain::admin::resume`].
pub use crate::domain::admin::resume;

use crate::driver::schedule::time_of;
use crate::task::TaskState;

/// A time as the driver returns it (`None`: not of that shape).
fn time(text: &str) -> Option<DateTime<Utc>> {
    time_of(text)
}

/// A time the schema never leaves NULL; the epoch if it is not of the driver's shape.
fn time_or_epoch(text: &str) -> DateTime<Utc> {
    time_of(text).unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

/// Seconds from `then` to `now`, never negative.
fn age_secs(now: DateTime<Utc>, then: DateTime<Utc>) -> f64 {
    let ms = (now - then).num_milliseconds().max(0);
    ms as f64 / 1000.0
}

/// A stored state (the schema's CHECK allows only the six).
fn state_of(text: &str) -> TaskState {
    text.parse().unwrap_or_else(|e| {
        log::warn!("{e} in async_task");
        TaskState::Pending
    })
}

/// A state as its stored text (`"dead"`).
fn state_text<S: serde::Serializer>(
    state: &TaskState,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    serializer.serialize_str(state.as_str())
}
