//! The tenants with a `max_running`, as this node last read them: the heartbeat reads them
//! again at each beat, so a limit set by `outbox tenant set` holds on every node within one
//! heartbeat.

use std::sync::{Arc, PoisonError, RwLock};

use crate::db::DbConnection;
use crate::driver::driver;
use crate::error::{OpContext, Result};

/// The tenants whose tasks are claimed apart, within their `max_running`.
#[derive(Debug, Default)]
pub(crate) struct RunLimits {
    tenants: RwLock<Arc<[String]>>,
}

impl RunLimits {
    /// The tenants with a `max_running` (empty: every claim is the plain one).
    pub(crate) fn tenants(&self) -> Arc<[String]> {
        Arc::clone(&self.tenants.read().unwrap_or_else(PoisonError::into_inner))
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
