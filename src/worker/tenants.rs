//! The tenants with a `max_running`, as this node last read them: the heartbeat reads them
//! again at each beat, so a limit set by `outbox tenant set` holds on every node within one
//! heartbeat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use super::fairness::FairClaims;
use crate::db::DbConnection;
use crate::driver::tenant_run_limited;
use crate::error::{OpContext, Result};

/// The tenants whose tasks are claimed apart, within their `max_running`.
#[derive(Debug, Default)]
pub(crate) struct RunLimits {
    tenants: RwLock<Arc<[String]>>,
    /// Counts claims, to alternate which kind each serves first.
    turn: AtomicU64,
    /// Counts claims of the limited tenants, to rotate which tenant each serves first.
    rotation: AtomicU64,
    /// What the fair claims remember between claims.
    pub(crate) fair: FairClaims,
}

impl RunLimits {
    /// The tenants with a `max_running` (empty: every claim is the plain one).
    pub(crate) fn tenants(&self) -> Arc<[String]> {
        Arc::clone(&self.tenants.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// A new number at each call: the claim's turn.
    pub(crate) fn next_turn(&self) -> u64 {
        self.turn.fetch_add(1, Ordering::Relaxed)
    }

    /// A new number at each call: where the next claim of the limited tenants starts.
    pub(crate) fn next_rotation(&self) -> u64 {
        self.rotation.fetch_add(1, Ordering::Relaxed)
    }

    /// Reads them again.
    pub(crate) fn refresh(&self, conn: &mut DbConnection) -> Result<()> {
        let now = tenant_run_limited(conn).op("tenant limits read")?;
        let mut tenants = self.tenants.write().unwrap_or_else(PoisonError::into_inner);
        if *tenants.as_ref() != *now.as_slice() {
            log::info!("tenants with a max_running: {now:?}");
            *tenants = now.into();
        }
        Ok(())
    }
}
