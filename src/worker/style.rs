//! How a worker claims its tasks: by stamping them, or by leasing them for their chunk's
//! transaction.

use std::fmt;
use std::str::FromStr;

use crate::db::Backend;
use crate::error::{Error, Result};

/// How a worker claims tasks ([`crate::WorkerConfig::claim_style`]; `--claim` on the
/// command line).
///
/// - **Stamp** (seed 003's claim): one `UPDATE` marks a page of tasks running, with this
///   node as owner, a new claim token and a deadline; each completion is a second, fenced
///   `UPDATE`. Two row versions per task. The claim commits at once, so a task may run as
///   long as its timeout: a node that dies is found by its silent heartbeat and its tasks
///   are rescued, each counting a failure. Works everywhere, PgBouncer in transaction mode
///   included, and on SQLite.
/// - **Lock** (PostgreSQL and MySQL, one write per task): one claim leases a chunk's tasks
///   (a row each in `async_lease`, unlogged on PostgreSQL, with this node, the task's claim
///   token and a deadline), without writing the task rows; the chunk's transaction runs their handlers
///   and marks them done as it deletes the leases. One row version per task; no task row is
///   locked while handlers run (a cancel never waits for a chunk). A process that dies,
///   freezes or is cut off leaves its leases: rescue charges their tasks a failure, as it
///   does a stamped claim's, and (PostgreSQL) ends the frozen node's sessions. A transaction and a
///   connection are held while the chunk's handlers run, so it suits short handlers.
/// - **Auto** (the default): lock claims in batched mode on PostgreSQL and MySQL, stamping
///   otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClaimStyle {
    /// Lock claims in batched mode on PostgreSQL and MySQL, stamping otherwise.
    #[default]
    Auto,
    /// Claims that stamp owner, token and deadline; completion is a second write.
    Stamp,
    /// Claims that lease a chunk's tasks for its transaction; one write per task.
    Lock,
}

impl ClaimStyle {
    /// The style's name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimStyle::Auto => "auto",
            ClaimStyle::Stamp => "stamp",
            ClaimStyle::Lock => "lock",
        }
    }
}

impl ClaimStyle {
    /// Whether a worker with this style claims by locking, on `backend` with chunks of
    /// `commit_batch` and the `queue` set (if any). Fails, naming the setting, where lock
    /// claims cannot run: on SQLite, or with a queue (a queued chunk would hold its
    /// leases, their deadline running, while it waited).
    pub(crate) fn locks(
        self,
        backend: Backend,
        commit_batch: usize,
        queue: Option<usize>,
    ) -> Result<bool> {
        let lock = match self {
            ClaimStyle::Auto => {
                backend != Backend::Sqlite && commit_batch > 1 && queue.unwrap_or(0) == 0
            }
            ClaimStyle::Stamp => false,
            ClaimStyle::Lock => true,
        };
        let bad = |setting, reason| Err(Error::InvalidConfig { setting, reason });
        if lock && backend == Backend::Sqlite {
            return bad(
                "claim",
                "lock claims need PostgreSQL or MySQL (a lease table beside the tasks and \
                 row locks), not SQLite"
                    .into(),
            );
        }
        if lock && queue.unwrap_or(0) > 0 {
            return bad(
                "queue",
                "must be 0 with lock claims: a queued chunk would hold its tasks' leases, \
                 their deadline running, while it waited"
                    .into(),
            );
        }
        Ok(lock)
    }
}

impl fmt::Display for ClaimStyle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ClaimStyle {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(ClaimStyle::Auto),
            "stamp" => Ok(ClaimStyle::Stamp),
            "lock" => Ok(ClaimStyle::Lock),
            other => Err(format!(
                "unknown claim style {other:?}: expected auto, stamp or lock"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_named() {
        for style in [ClaimStyle::Auto, ClaimStyle::Stamp, ClaimStyle::Lock] {
            assert_eq!(style.as_str().parse::<ClaimStyle>(), Ok(style));
        }
        let error = "locked".parse::<ClaimStyle>().unwrap_err();
        assert!(error.contains("\"locked\""), "{error}");
    }

    #[test]
    fn a_queue_with_lock_claims_is_refused_for_what_a_queued_chunk_holds() {
        // A lease claim holds no row lock and no connection while its chunk waits: what a
        // queued chunk would hold is its tasks' leases, their deadline running.
        let error = ClaimStyle::Lock
            .locks(Backend::Postgres, 50, Some(4))
            .unwrap_err()
            .to_string();
        assert!(error.contains("queue"), "{error}");
        assert!(error.contains("leases"), "{error}");
        assert!(!error.contains("row locks"), "{error}");
        let error = ClaimStyle::Lock
            .locks(Backend::Sqlite, 50, None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("lease table"), "{error}");
    }
}
