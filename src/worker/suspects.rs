//! Suspects: the tasks processes were running when they died (docs/guide/src/failure.md, "Failure
//! behaviour").
//!
//! A process that dies (abort, OOM, a segfault, `kill -9`) cannot say which of its tasks
//! killed it: rescue charges every one of them a failure, and counts the death in their
//! `suspect` column. A task held by one dying process is claimed as any other (a worker
//! killed by an operator or the OOM killer should not slow its tasks down). From the second,
//! it is a suspect: claimed only alone, one at a time per worker, beside whatever else the
//! worker runs, so that if the process dies again while it runs, the death is charged to it
//! alone. A task that kills its process every time is charged every death and is dead after
//! its max attempts; the tasks that happened to share its pages are charged at most the two
//! deaths that made them suspects, then each runs alone once and completes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::claim::claimed_tasks;
use super::{millis, Worker};
use crate::db::transaction::DiscardBroken;
use crate::driver::{driver, Due};
use crate::error::{OpContext, Result};
use crate::task::ClaimedTask;

/// Whether this worker's database may hold suspects to claim: at first it may (the first
/// claim looks), then as the last rescue pass or claim found.
#[derive(Debug)]
pub(crate) struct Suspects {
    maybe: AtomicBool,
}

impl Default for Suspects {
    fn default() -> Self {
        Suspects {
            maybe: AtomicBool::new(true),
        }
    }
}

impl Suspects {
    /// Some may be due: after a rescue pass that marked some, or found some marked.
    pub(crate) fn found(&self, some: bool) {
        self.maybe.store(some, Ordering::Relaxed);
    }

    fn maybe(&self) -> bool {
        self.maybe.load(Ordering::Relaxed)
    }
}

/// The turn to run a suspect alone, one per worker (per [`crate::Fleet`], whose databases
/// share one process): taken by the claim of a suspect, given back when that claim drops,
/// once its run has ended.
#[derive(Debug, Default)]
pub(crate) struct SoloTurn(Arc<AtomicBool>);

impl SoloTurn {
    /// The turn, if no suspect holds it.
    fn take(&self) -> Option<SoloHold> {
        self.0
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()
            .map(|_| SoloHold(Arc::clone(&self.0)))
    }
}

/// A suspect's hold on its worker's [`SoloTurn`], until dropped.
#[derive(Debug)]
pub(crate) struct SoloHold(Arc<AtomicBool>);

impl Drop for SoloHold {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl Worker {
    /// Claims the first due suspect of `keywords`, to run alone with `timeout`, unless this
    /// process runs one already (or none may be due). The tenants with a `max_running` are
    /// left out: their claims, which count what runs, take their suspects like any task.
    pub(super) fn claim_suspect(
        &self,
        keywords: &[String],
        timeout: Duration,
    ) -> Result<Option<ClaimedTask>> {
        if keywords.is_empty() || !self.services.suspects.maybe() {
            return Ok(None);
        }
        let Some(hold) = self.dispatcher.solo_turn().take() else {
            return Ok(None);
        };
        match self.claim_one_suspect(keywords, timeout)? {
            Some(mut task) => {
                log::info!(
                    "task {}: a suspect (its process died under it), claimed to run alone",
                    task.context.id
                );
                task.solo = Some(Arc::new(hold));
                Ok(Some(task))
            }
            None => {
                self.services.suspects.found(false);
                Ok(None)
            }
        }
    }

    fn claim_one_suspect(
        &self,
        keywords: &[String],
        timeout: Duration,
    ) -> Result<Option<ClaimedTask>> {
        self.ensure_heartbeat_fresh()?;
        let limited = self.services.limits.tenants();
        let mut conn = self.pool.get().op("task claim")?;
        let owner = self.node.id();
        let asked = Instant::now();
        let rows = {
            let _turn = self.writer_turn.take();
            let due = Due {
                keywords,
                partition: self.services.strategy.partition(),
                suspect: Some(true),
            };
            driver(&mut conn)
                .task_claim_suspect(owner, &due, &limited, millis(timeout))
                .discard_broken(&mut conn)
                .op("task claim")?
        };
        self.observers.claimed(asked);
        Ok(claimed_tasks(rows, owner, asked + timeout)
            .into_iter()
            .next())
    }
}
