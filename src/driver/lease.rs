//! The lock claims' operations (PostgreSQL: an unlogged lease table and advisory locks;
//! MySQL: an InnoDB lease table; docs/guide/src/claims.md), a part of [`super::Driver`] of
//! their own. What they do on SQLite, which has no lock claims, is written once here: the
//! worker refuses the setting there before any of the claims could run.

use diesel::QueryResult;

use super::{
    ChunkRuns, ClaimRow, Claiming, Due, LeaseCharge, Pick, Picked, RescueParams, RescuedRow, TxMark,
};

/// The lock claims' part of the driver.
pub trait LeaseDriver {
    /// Leases up to `claim.limit` due pending tasks of `claim.due` for `claim.owner` (a lock
    /// claim), chosen as [`super::Driver::task_claim_page`] chooses: a row of
    /// `async_lease` per task with a deadline `claim.timeout_ms` from now, committed by this claim alone; the task rows
    /// are not written and stay pending. A leased task is taken by no other claim. The page
    /// is cut, in claim order, into chunks of `chunk.per` tasks; the i-th chunk's leases
    /// name the run `chunk.first + i` (that of the [`TxMark`] its transaction will hold).
    /// Returns the page and, for each of its rows, its chunk's run.
    fn task_lease_page(
        &mut self,
        claim: &Claiming<'_>,
        chunk: ChunkRuns,
        pick: &Pick<'_>,
    ) -> QueryResult<(Picked, Vec<i64>)> {
        let _ = (claim, chunk, pick);
        Err(lock_claims_unsupported())
    }

    /// The plan of the lease statement (`EXPLAIN`), one line per row (PostgreSQL only).
    fn task_lease_plan(&mut self, due: &Due<'_>, limit: i64) -> QueryResult<Vec<String>> {
        let _ = (due, limit);
        Err(lock_claims_unsupported())
    }

    /// In the transaction of the chunk's leases (opened by [`super::Driver::transaction_begin`]): marks
    /// done the tasks of `claims` (`(id, token)`, as the lease claim returned them) still
    /// leased by `owner` under those tokens, deleting the leases, recording `owner` and a new
    /// claim token; returns how many it marked. A newer lease of `owner` on the same task
    /// (under the token a rescue's charge gave it) is another chunk's: left as it is.
    fn task_complete_leased(&mut self, owner: i64, claims: &[(i64, i64)]) -> QueryResult<usize> {
        let _ = (owner, claims);
        Err(lock_claims_unsupported())
    }

    /// After a chunk rolled back: claims, the stamping way, those of the tasks of `claims`
    /// still leased by `owner` under those tokens and pending, deleting their leases, in one
    /// transaction. A task of `ran` (its handler ran in the chunk) found cancelled is noted
    /// [`CANCELLED_RUNNING`](crate::driver::ops::CANCELLED_RUNNING) in it: a cancel that
    /// could not see the lease wrote no note, and the lease's end is the last trace of the run.
    fn task_claim_leased(
        &mut self,
        owner: i64,
        claims: &[(i64, i64)],
        ran: &[i64],
        timeout_ms: i64,
    ) -> QueryResult<Vec<ClaimRow>> {
        let _ = (owner, claims, ran, timeout_ms);
        Err(lock_claims_unsupported())
    }

    /// Deletes `owner`'s leases of `claims` under those tokens (their chunk never ran, or
    /// rolled back as its worker stops): the tasks are free again, no failure counted; those
    /// of `ran` (their handlers ran in the chunk) get `note` in `last_error`, or
    /// `CANCELLED_RUNNING` when they are cancelled, in the same transaction. Returns how many
    /// leases it deleted.
    fn task_release_leased(
        &mut self,
        owner: i64,
        claims: &[(i64, i64)],
        ran: &[i64],
        note: &str,
    ) -> QueryResult<usize> {
        let _ = (owner, claims, ran, note);
        Err(lock_claims_unsupported())
    }

    /// Ends a chunk for one of its tasks that ran past its timeout: deletes `owner`'s leases
    /// of the chunk and charges that task a failure (retried after the delay, or dead at
    /// max attempts, with a new claim token); the chunk's other tasks are free, uncharged,
    /// under a new claim token (leased again by `owner`, their leases are not the ended
    /// chunk's), noted `released: …` in their `last_error` as a stamped chunk's are; one found
    /// cancelled is noted [`CANCELLED_RUNNING`](crate::driver::ops::CANCELLED_RUNNING).
    /// Returns the charged task's new state, `None` when it had left its lease.
    fn task_charge_leased(
        &mut self,
        owner: i64,
        charge: &LeaseCharge<'_>,
    ) -> QueryResult<Option<String>> {
        let _ = (owner, charge);
        Err(lock_claims_unsupported())
    }

    /// Deletes the leases of nodes that are not live (as [`super::Driver::task_rescue_many`] judges
    /// them) and those past their deadline, charging each task still pending under its
    /// lease a failure (and, when its node died, counting the death in `suspect`). None on
    /// SQLite, which has no lock claims.
    fn task_rescue_leases(&mut self, rescue: &RescueParams) -> QueryResult<Vec<RescuedRow>> {
        let _ = rescue;
        Ok(Vec::new())
    }

    /// Notes on the server that this connection's session works for `node`, on MySQL (a
    /// named lock, taken when the node changes: `mysql/session.rs`), so that
    /// [`LeaseDriver::session_end_stale`] can end it once the node is no longer live. Nothing
    /// elsewhere: PostgreSQL marks each transaction instead ([`super::Driver::transaction_begin`]).
    fn session_tag(&mut self, node: i64) -> QueryResult<()> {
        let _ = node;
        Ok(())
    }

    /// Ends the sessions of nodes no longer live, so that what they hold (a claim's page, the
    /// rows a chunk or a handler wrote) is free and nothing they write later lands; returns
    /// how many. On PostgreSQL (`pg_terminate_backend`) those of the engine's transactions
    /// whose node is not live (no heartbeat for `rescue.dead_after_ms`, gone, unknown) or
    /// whose chunk's lease is past its deadline; on MySQL (`KILL CONNECTION`) those tagged by
    /// [`LeaseDriver::session_tag`] for a node not live; 0 on SQLite. Never those of
    /// `rescue.node`, the node that asks: it is live to itself whatever its heartbeat says.
    fn session_end_stale(&mut self, rescue: &RescueParams) -> QueryResult<i64> {
        let _ = rescue;
        Ok(0)
    }

    /// Ends the session of the transaction marked `mark` (see [`super::Driver::transaction_begin`]),
    /// if one still runs; whether one did. `false` on SQLite and MySQL.
    fn session_end(&mut self, mark: TxMark) -> QueryResult<bool> {
        let _ = mark;
        Ok(false)
    }
}

/// What the lock claims' operations fail with on SQLite.
fn lock_claims_unsupported() -> diesel::result::Error {
    diesel::result::Error::QueryBuilderError(
        "lock claims need PostgreSQL or MySQL (a lease table beside the tasks)".into(),
    )
}
