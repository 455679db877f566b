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
//!
//! Here is what the claim of a suspect and the rescue pass share: whether suspects may be
//! due, and the worker's turn to run one; the claim itself is [`super::claim`]'s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::task::SoloHold;

/// Whether this worker's database may hold suspects to claim: at first it may (the first
/// claim looks), then as the last rescue pass or claim found; and whether a claim passed
/// them over because another database of the process held the turn.
#[derive(Debug)]
pub(crate) struct Suspects {
    maybe: AtomicBool,
    passed_over: AtomicBool,
}

impl Default for Suspects {
    fn default() -> Self {
        Suspects {
            maybe: AtomicBool::new(true),
            passed_over: AtomicBool::new(false),
        }
    }
}

impl Suspects {
    /// Some may be due: after a rescue pass that marked some, or found some marked.
    pub(crate) fn found(&self, some: bool) {
        self.maybe.store(some, Ordering::Relaxed);
    }

    pub(crate) fn maybe(&self) -> bool {
        self.maybe.load(Ordering::Relaxed)
    }

    /// A claim looked for suspects while the turn was taken.
    pub(crate) fn passed_over(&self) {
        self.passed_over.store(true, Ordering::SeqCst);
    }

    /// Whether a claim passed suspects over since the last call.
    pub(crate) fn take_passed_over(&self) -> bool {
        self.passed_over.swap(false, Ordering::SeqCst)
    }
}

/// The turn to run a suspect alone, one per worker (per [`crate::Fleet`], whose databases
/// share one process): taken by the claim of a suspect, given back when that claim drops,
/// once its run has ended.
#[derive(Debug, Default)]
pub(crate) struct SoloTurn(Arc<AtomicBool>);

impl SoloTurn {
    /// Whether a suspect holds the turn.
    pub(crate) fn taken(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// The turn, if no suspect holds it.
    pub(crate) fn take(&self) -> Option<SoloHold> {
        self.0
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()
            .map(|_| SoloHold(Arc::clone(&self.0)))
    }
}
