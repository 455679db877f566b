//! Tasks: their states, what a producer enqueues, and what a worker claims.

mod new;

pub use new::NewTask;
pub(crate) use new::Parent;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::handler::TaskContext;

/// The longest keyword, in characters.
pub const MAX_KEYWORD_LEN: usize = 64;
/// The longest biz_id, in bytes.
pub const MAX_BIZ_ID_LEN: usize = 128;
/// The longest tenant, in bytes.
pub const MAX_TENANT_LEN: usize = 128;
/// The limit on a payload's size, and the largest the schema accepts: 64 KiB of JSON text as
/// the database stores it (SQLite: the text itself; PostgreSQL: jsonb's text form,
/// `biz_data::text`). [`crate::EnqueueOptions::max_payload_bytes`] may lower it.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// The longest task timeout accepted (of a worker, or of a domain) (100 years): a claim's deadline is the database clock
/// plus the timeout, and past the year 9999 SQLite's date functions give NULL, a task without
/// a deadline, which rescue would never find.
pub const MAX_TASK_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// The longest delay an enqueue accepts: ten years.
pub const MAX_DELAY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// What is wrong with `key` as a biz_id or a tenant name (1 to 128 bytes: the two share one
/// bound), if anything: the rule of every key named, to look one up too.
pub(crate) fn key_problem(key: &str) -> Option<&'static str> {
    const _: () = assert!(MAX_BIZ_ID_LEN == 128 && MAX_TENANT_LEN == 128);
    if key.is_empty() {
        Some("it is empty")
    } else if key.len() > MAX_BIZ_ID_LEN {
        Some("it is longer than 128 bytes")
    } else if key.contains('\0') {
        Some("it contains a NUL character")
    } else {
        None
    }
}

/// What is wrong with `key` as the biz_id or the tenant of a row to write, if anything:
/// [`key_problem`]'s rule and no trailing space, on every backend. MySQL's comparison
/// ignores one (`'42 '` is `'42'` to its unique key and to a tenant's limits), so it would
/// mean something else there. Lookups keep the plain rule: a row written otherwise stays
/// reachable.
pub(crate) fn new_key_problem(key: &str) -> Option<&'static str> {
    key_problem(key).or_else(|| {
        key.ends_with(' ')
            .then_some("it ends with a space, which MySQL's comparison ignores")
    })
}

/// Where a task is in its life. Stored as text (`WHERE state = 'dead'` reads plainly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskState {
    /// Waiting for its `run_at`, then for a worker to claim it.
    Pending,
    /// Claimed by a node (`owner`) under a claim token; its handler may be running.
    Running,
    /// Its handler succeeded and the completion committed with the side-effect.
    Done,
    /// Failed `max_attempts` times, or failed permanently. `retry` makes it pending again.
    Dead,
    /// Cancelled by an operator; a running handler's completion is fenced out.
    Cancelled,
    /// Waiting for an unfinished parent task.
    Blocked,
}

impl TaskState {
    /// Every state, in life order.
    pub const ALL: [TaskState; 6] = [
        TaskState::Blocked,
        TaskState::Pending,
        TaskState::Running,
        TaskState::Done,
        TaskState::Dead,
        TaskState::Cancelled,
    ];

    /// The stored text: `pending`, `running`, `done`, `dead`, `cancelled` or `blocked`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Running => "running",
            TaskState::Done => "done",
            TaskState::Dead => "dead",
            TaskState::Cancelled => "cancelled",
            TaskState::Blocked => "blocked",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskState {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        TaskState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| format!("unknown task state {s:?}"))
    }
}

/// Checks a keyword: 1 to 64 characters from `[a-z0-9._:-]`.
///
/// ```
/// assert!(outbox::validate_keyword("points.credit").is_ok());
/// assert!(outbox::validate_keyword("Points").is_err());
/// assert!(outbox::validate_keyword("").is_err());
/// ```
pub fn validate_keyword(keyword: &str) -> Result<()> {
    let reason = if keyword.is_empty() {
        "it is empty"
    } else if keyword.chars().count() > MAX_KEYWORD_LEN {
        "it is longer than 64 characters"
    } else if !keyword
        .bytes()
        .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b':' | b'-'))
    {
        "only a-z, 0-9 and . _ : - are allowed"
    } else {
        return Ok(());
    };
    Err(Error::InvalidKeyword {
        keyword: keyword.to_owned(),
        reason,
    })
}

/// A task claimed by this node: its context and the claim that fences every later write.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClaimedTask {
    /// What the handler sees.
    pub context: TaskContext,
    /// Failures recorded before this attempt.
    pub failures: i32,
    /// The task's own max attempts, if the producer set one.
    pub max_attempts: Option<i32>,
    /// The claim token this claim set; a write with an older token touches nothing.
    pub claim_token: i64,
    /// The claiming node.
    pub owner: i64,
    /// When the task's deadline passes, by this process's clock (its claim plus the claim
    /// timeout, measured from just before the claim): outcomes are recorded until then.
    pub(crate) deadline: std::time::Instant,
    /// When the claim statement returned, by this process's clock (for the completion
    /// latency of [`crate::metrics`]).
    pub(crate) claimed_at: std::time::Instant,
    /// A suspect's hold on its worker's turn to run one alone (`None`: an ordinary claim);
    /// the turn passes when the claim (and its clones) drop.
    pub(crate) solo: Option<std::sync::Arc<SoloHold>>,
}

impl ClaimedTask {
    /// `(id, claim token)`: what a write of a chunk's tasks names each by.
    pub(crate) fn id_token(&self) -> (i64, i64) {
        (self.context.id, self.claim_token)
    }

    /// The fence of this claim.
    pub(crate) fn claim(&self) -> crate::driver::Claim {
        crate::driver::Claim {
            id: self.context.id,
            owner: self.owner,
            token: self.claim_token,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyword_rules() {
        assert!(validate_keyword("a").is_ok());
        assert!(validate_keyword("coupon.grant:v2_x-y").is_ok());
        assert!(validate_keyword(&"a".repeat(64)).is_ok());
        assert!(validate_keyword(&"a".repeat(65)).is_err());
        for bad in ["", "A", "a b", "a/b", "é", "a\0"] {
            assert!(validate_keyword(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn state_text_round_trips() {
        for state in TaskState::ALL {
            assert_eq!(state.as_str().parse::<TaskState>(), Ok(state));
        }
        assert!("finished".parse::<TaskState>().is_err());
    }
}

/// A suspect's hold on its worker's turn to run one suspect alone (the worker's
/// `suspects`), until dropped: it gives the turn back.
#[derive(Debug)]
pub(crate) struct SoloHold(pub(crate) std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for SoloHold {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}
