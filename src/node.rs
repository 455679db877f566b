//! The heartbeat: a node proves it is alive by updating its `async_node` row, with the
//! database clock, on a connection of its own (outside the work pool, so that a saturated
//! pool cannot starve it).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::db::{DatabaseUrl, DbConnection};
use crate::driver::driver;
use crate::error::{Error, Result};

/// One node's heartbeat.
pub(crate) struct Heartbeat {
    url: DatabaseUrl,
    node_id: i64,
    /// The heartbeat's own connection (reopened after a failure), and whether the last
    /// attempt failed (to log changes of state only).
    conn: Mutex<(Option<DbConnection>, bool)>,
    /// When a heartbeat last succeeded (the registration counts as one). Apart from `conn`
    /// so that the claim path never waits for a slow heartbeat.
    last_ok: Mutex<Instant>,
}

impl Heartbeat {
    pub(crate) fn new(url: DatabaseUrl, node_id: i64) -> Self {
        Heartbeat {
            url,
            node_id,
            conn: Mutex::new((None, false)),
            last_ok: Mutex::new(Instant::now()),
        }
    }

    /// Records one heartbeat, reconnecting first if the last attempt failed. Logs once when
    /// heartbeats start failing and once when they recover.
    pub(crate) fn run_once(&self) -> Result<()> {
        let mut guard = self.conn.lock().expect("heartbeat connection lock");
        let (slot, failing) = &mut *guard;
        let result = (|| {
            if slot.is_none() {
                *slot = Some(self.url.connect()?);
            }
            let conn = slot.as_mut().expect("connected above");
            match driver(conn).node_heartbeat(self.node_id) {
                Ok(1) => Ok(()),
                Ok(_) => Err(Error::Runtime(format!(
                    "node {} is missing from async_node",
                    self.node_id
                ))),
                Err(source) => Err(Error::Database {
                    operation: "node heartbeat",
                    source,
                }),
            }
        })();
        match &result {
            Ok(()) => {
                *self.last_ok.lock().expect("heartbeat time lock") = Instant::now();
                if *failing {
                    log::warn!("node {}: heartbeat recovered", self.node_id);
                }
                *failing = false;
            }
            Err(e) => {
                // A fresh connection next time: this one may be dead.
                *slot = None;
                if !*failing {
                    log::error!("node {}: heartbeat failed: {e}", self.node_id);
                }
                *failing = true;
            }
        }
        result
    }

    /// The node this heartbeat is for.
    pub(crate) fn node_id(&self) -> i64 {
        self.node_id
    }

    /// Time since the last successful heartbeat.
    pub(crate) fn since_last_ok(&self) -> Duration {
        self.last_ok.lock().expect("heartbeat time lock").elapsed()
    }
}
