//! A lock claim's lease on a chunk ([`crate::ClaimStyle::Lock`], see `locked`): what
//! identifies the chunk's transaction (its mark, from this process's run numbers) and the
//! tasks it holds, and how a chunk that runs past its timeout is ended and charged. What
//! the lock claim, the execution of a chunk and the domains' timeouts and the hang
//! watchdog share, below all of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::settings::{millis, Settings};
use crate::db::DbConnection;
use crate::driver::{driver, LeaseCharge, TxMark};
use crate::error::{OpContext, Result};

/// What ends a leased chunk for a task that runs past its timeout: the mark of the chunk's
/// transaction and every task of the chunk, `(id, token)`.
#[derive(Debug, Clone)]
pub(crate) struct ChunkLease {
    pub(crate) mark: TxMark,
    pub(crate) claims: Arc<[(i64, i64)]>,
}

/// Numbers the transactions of this process (their marks' runs).
static RUNS: AtomicU64 = AtomicU64::new(1);

/// The next transaction's run, for its mark.
pub(crate) fn next_run() -> i64 {
    reserve_runs(1)
}

/// `n` runs in a row, for the chunks of one lease claim; returns the first.
pub(crate) fn reserve_runs(n: usize) -> i64 {
    let n = u64::try_from(n.max(1)).unwrap_or(u64::MAX);
    i64::try_from(RUNS.fetch_add(n, Ordering::Relaxed) & 0x7fff_ffff).unwrap_or(0)
}

/// Ends the leased chunk of a task that ran past its timeout and counts that task's
/// failure: terminates the chunk's session (its transaction rolls back, freeing what its
/// handlers held) and deletes its leases, charging only that task (`error` in its
/// `last_error`); the chunk's other tasks are free, uncounted. Returns the task's new state
/// (`None`: it had left the lease).
pub(crate) fn charge_leased(
    conn: &mut DbConnection,
    settings: &Settings,
    owner: i64,
    lease: &ChunkLease,
    task: i64,
    failures: i32,
    error: &str,
) -> Result<Option<String>> {
    if let Err(e) = driver(conn).session_end(lease.mark) {
        // Not allowed to signal it (another role's session): the deadline and the fence
        // still hold; only what its handlers lock waits for the handler to return.
        log::warn!("task {task}: its chunk's session could not be ended: {e}");
    }
    let delay = settings
        .backoff
        .delay(failures.saturating_add(1).unsigned_abs(), fastrand::f64());
    let charge = LeaseCharge {
        task,
        chunk: &lease.claims,
        error,
        delay_ms: millis(delay),
        default_max_attempts: settings.max_attempts,
    };
    driver(conn)
        .task_charge_leased(owner, &charge)
        .op("task timeout")
}
