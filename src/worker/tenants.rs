//! The tenants with a `max_running`, as this node last read them: the heartbeat reads them
//! again at each beat, so a limit set by `outbox tenant set` holds on every node within one
//! heartbeat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::db::DbConnection;
use crate::driver::driver;
use crate::driver::Pick;
use crate::error::{OpContext, Result};
use crate::task::ClaimedTask;

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
    /// The keyword sets whose last claim found one participant: their next claim takes that
    /// participant's tasks alone (a statement much cheaper to plan than the fair one) until
    /// a claim finds another participant pending, or none of that one's due.
    solo: Mutex<Vec<Solo>>,
    /// When a claim last found several participants (or a solo claim found another
    /// pending): claims stay fair for [`SOLO_AFTER`] after, so that a tenant whose tasks
    /// come one by one is served by the next claim each time.
    crowded_at: Mutex<Option<Instant>>,
}

/// How long claims stay fair after they last found several participants.
const SOLO_AFTER: Duration = Duration::from_secs(1);

/// How often a solo claim asks whether another participant has pending tasks: the probe
/// costs a few index reads, a tenth of a chunk's claim in batched mode, so not every claim
/// makes it; a tenant that comes after a second of quiet waits this much longer at most.
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// A keyword set whose claims take one participant's tasks alone.
#[derive(Debug)]
struct Solo {
    keywords: Vec<String>,
    tenant: Option<String>,
    probed_at: Instant,
}

/// How the next claim of a set of keywords picks its tasks ([`Pick`], owned).
#[derive(Debug, Clone)]
pub(crate) enum NextPick {
    /// Fair, the ring starting after this tenant.
    Fair(String),
    /// One participant's tasks only; whether to probe for others.
    Solo(Option<String>, bool),
}

impl NextPick {
    pub(crate) fn as_pick(&self) -> Pick<'_> {
        match self {
            NextPick::Fair(after) => Pick::Fair { after },
            NextPick::Solo(tenant, probe) => Pick::Solo {
                tenant: tenant.as_deref(),
                probe: *probe,
            },
        }
    }
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

    /// How the next claim of `keywords` picks: alone for the participant its last claim
    /// found alone, else fairly from where the ring of tenants stopped.
    /// `limited` is the list of tenants with a `max_running` the claim itself passes on.
    pub(crate) fn next_pick(&self, keywords: &[String], limited: &[String]) -> NextPick {
        let mut solo = self.solo.lock().unwrap_or_else(PoisonError::into_inner);
        // A tenant given a `max_running` since is claimed apart: never alone here.
        match solo.iter_mut().find(|s| {
            s.keywords == keywords && s.tenant.as_ref().map_or(true, |t| !limited.contains(t))
        }) {
            Some(s) => {
                let probe = s.probed_at.elapsed() >= PROBE_EVERY;
                if probe {
                    s.probed_at = Instant::now();
                }
                NextPick::Solo(s.tenant.clone(), probe)
            }
            None => NextPick::Fair(
                self.ring
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone(),
            ),
        }
    }

    /// Records what a claim of `keywords` that picked `pick` took: the ring moves on past
    /// the tenants a fair claim served (the next starts after the last of them in ring
    /// order, wrapping past where this one started); a fair claim that found one
    /// participant (or none: then the tasks without a tenant), when none found several for
    /// [`SOLO_AFTER`], makes the next claim solo; a solo claim that found another participant
    /// pending makes it fair again (one that comes back empty stays solo: its participant may
    /// get more, and the probe looks for the others).
    pub(crate) fn picked(
        &self,
        keywords: &[String],
        pick: &NextPick,
        page: &[ClaimedTask],
        crowded: bool,
    ) {
        let mut participants: Vec<Option<&str>> = page.iter().map(|t| t.context.tenant()).collect();
        participants.sort_unstable();
        participants.dedup();
        let mut crowded_at = self
            .crowded_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if crowded || participants.len() > 1 {
            *crowded_at = Some(Instant::now());
        }
        let quiet = crowded_at.map_or(true, |at| at.elapsed() >= SOLO_AFTER);
        drop(crowded_at);
        let alone = match pick {
            NextPick::Fair(start) => {
                let last = participants
                    .iter()
                    .flatten()
                    .max_by_key(|&&tenant| (tenant <= start.as_str(), tenant));
                if let Some(last) = last {
                    *self.ring.lock().unwrap_or_else(PoisonError::into_inner) = (*last).to_owned();
                }
                // Nothing due: the tasks without a tenant are watched alone (the cheapest
                // claim), the probe asking for the rest.
                match participants.as_slice() {
                    [only] if quiet => Some(only.map(str::to_owned)),
                    [] if quiet => Some(None),
                    _ => None,
                }
            }
            NextPick::Solo(..) => {
                if crowded {
                    self.solo
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .retain(|s| s.keywords != keywords);
                }
                return;
            }
        };
        let mut solo = self.solo.lock().unwrap_or_else(PoisonError::into_inner);
        solo.retain(|s| s.keywords != keywords);
        if let Some(tenant) = alone {
            // The first solo claim probes.
            let probed_at = Instant::now()
                .checked_sub(PROBE_EVERY)
                .unwrap_or_else(Instant::now);
            solo.push(Solo {
                keywords: keywords.to_vec(),
                tenant,
                probed_at,
            });
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
