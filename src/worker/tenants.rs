//! The tenants with a `max_running`, as this node last read them: the heartbeat reads them
//! again at each beat, so a limit set by `outbox tenant set` holds on every node within one
//! heartbeat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crate::db::DbConnection;
use crate::driver::driver;
use crate::error::{OpContext, Result};

/// The tenants whose tasks are claimed apart, within their `max_running`.
#[derive(Debug, Default)]
pub(crate) struct RunLimits {
    tenants: RwLock<Arc<[String]>>,
    /// Counts claims, to alternate which kind each serves first.
    turn: AtomicU64,
    /// Counts claims of the limited tenants, to rotate which tenant each serves first.
    rotation: AtomicU64,
    /// Where the next claim starts its ring of tenants (README, "Fair claiming"): after
    /// the tenant the last claim served last.
    ring: Mutex<String>,
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

    /// Where the next claim's ring of tenants starts (after this tenant; `""`: the first).
    pub(crate) fn ring_start(&self) -> String {
        self.ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Moves the ring on past the tenants a claim that started after `start` served: the
    /// next claim starts after the last of them in ring order (wrapping past `start`).
    pub(crate) fn ring_served<'t>(&self, start: &str, served: impl Iterator<Item = &'t str>) {
        let last = served.max_by_key(|&tenant| (tenant <= start, tenant));
        if let Some(last) = last {
            *self.ring.lock().unwrap_or_else(PoisonError::into_inner) = last.to_owned();
        }
    }

    /// Reads them again.
    pub(crate) fn refresh(&self, conn: &mut DbConnection) -> Result<()> {
        let now = driver(conn).tenant_run_limited().op("tenant limits read")?;
        let mut tenants = self.tenants.write().unwrap_or_else(PoisonError::into_inner);
        if *tenants.as_ref() != *now.as_slice() {
            log::info!("tenants with a max_running: {now:?}");
            *tenants = now.into();
        }
        Ok(())
    }
}
