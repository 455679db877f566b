//! A claim whose COMMIT failed ([`crate::driver::Picked::unconfirmed`]): the server may have
//! committed it and the reply be what was lost (a failover, a cut link, a proxy that dropped
//! the connection). What it may have taken is given back at once.

use std::time::Instant;

use super::engine::Worker;
use crate::driver::{driver, Claim, ClaimRow, Picked};

impl Worker {
    /// What a claim took: `claimed`, or, when its COMMIT failed ([`Picked::unconfirmed`]),
    /// that error, once what it may have taken is given back
    /// ([`Worker::give_back_unconfirmed`]). Called once the claim's connection is let go.
    pub(super) fn confirmed(
        &self,
        claimed: diesel::QueryResult<Picked>,
        leased: bool,
        deadline: Instant,
    ) -> diesel::QueryResult<Picked> {
        let mut picked = claimed?;
        match picked.unconfirmed.take() {
            None => Ok(picked),
            Some(error) => {
                self.give_back_unconfirmed(&picked.rows, leased, deadline, &error);
                Err(error)
            }
        }
    }

    /// Gives back what a claim whose COMMIT failed with `error` may have taken: each of `rows`
    /// still claimed by this node under its token is released (a stamp claim), or its lease
    /// deleted (`leased`), no failure counted. Left as they were, they would wait, claimed by
    /// a worker that never runs them, for their deadline and rescue's charge. Fenced by the
    /// tokens, so a claim that did not commit gives back nothing; retried through an outage
    /// until `deadline` (then rescue takes them at theirs, as before).
    fn give_back_unconfirmed(
        &self,
        rows: &[ClaimRow],
        leased: bool,
        deadline: Instant,
        error: &diesel::result::Error,
    ) {
        if rows.is_empty() {
            return;
        }
        let owner = self.node.id();
        let given = self.retry_until("an unconfirmed claim's give-back", deadline, |conn| {
            if leased {
                let claims: Vec<(i64, i64)> = rows.iter().map(|r| (r.id, r.claim_token)).collect();
                return driver(conn).task_release_leased(owner, &claims, &[], "");
            }
            rows.iter().try_fold(0, |given, row| {
                let claim = Claim {
                    id: row.id,
                    owner,
                    token: row.claim_token,
                };
                Ok(given + driver(conn).task_release(&claim, None)?)
            })
        });
        match given {
            Ok(given) => log::warn!(
                "a claim's COMMIT failed ({error}): {given} of its {} tasks were claimed, \
                 given back with no failure counted",
                rows.len()
            ),
            Err(e) => log::warn!(
                "a claim's COMMIT failed ({error}), and its {} tasks could not be given \
                 back ({e}): rescue takes those it claimed at their deadline",
                rows.len()
            ),
        }
    }
}
