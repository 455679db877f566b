//! What a node remembers between its fair claims (docs/guide/src/tenants.md, "Fair claiming"), per
//! keyword set (a domain's lane claims its own keywords): where the ring of tenants stopped, each
//! participant's pass, whether claims go solo while one participant is alone, and whether the last
//! claim left tenants unvisited that the next must go on to at once.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::driver::{Passes, Pick};
use crate::task::ClaimedTask;

/// How long claims stay fair after they last found several participants.
const SOLO_AFTER: Duration = Duration::from_secs(1);

/// How often a solo claim asks whether another participant has pending tasks: the probe
/// costs a few index reads, a tenth of a chunk's claim in batched mode, so not every claim
/// makes it; a tenant that comes after a second of quiet waits this much longer at most.
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// Passes kept at most per keyword set; past it they start again from 0.
const MAX_PASSES: usize = 10_000;

/// The fair claims' memory, per keyword set.
#[derive(Debug, Default)]
pub(crate) struct FairClaims {
    sets: Mutex<Vec<KeywordSet>>,
}

#[derive(Debug)]
struct KeywordSet {
    keywords: Vec<String>,
    /// The tenant after which the next fair claim starts its ring.
    after: String,
    /// Where the lap that the next fair claim goes on with began, while one is under way:
    /// the last claim came back short with its ring stopped at its bound, so tenants with
    /// tasks due may lie further on.
    lap: Option<String>,
    /// The last claim came back short and more may be due at once: its ring stopped at its
    /// bound, or (solo) it found another participant pending.
    goes_on: bool,
    /// Each participant's pass (`None`: the tasks without a tenant): what this node's claims
    /// served it, over its weight.
    passes: HashMap<Option<String>, f64>,
    /// Claims take this participant's tasks alone; when they last probed for others.
    solo: Option<(Option<String>, Instant)>,
    /// When a claim last found several participants, or a solo claim another pending.
    crowded_at: Option<Instant>,
}

impl KeywordSet {
    fn new(keywords: &[String]) -> KeywordSet {
        KeywordSet {
            keywords: keywords.to_vec(),
            after: String::new(),
            lap: None,
            goes_on: false,
            passes: HashMap::new(),
            solo: None,
            crowded_at: None,
        }
    }

    /// The pass of a participant not seen yet: the least of those seen, so that it neither
    /// waits for the others nor takes a burst ahead of them.
    fn base(&self) -> f64 {
        self.passes
            .values()
            .copied()
            .reduce(f64::min)
            .unwrap_or(0.0)
    }
}

/// How the next claim of a keyword set picks its tasks ([`Pick`], owned).
#[derive(Debug, Clone)]
pub(crate) enum NextPick {
    /// Fair, the ring starting after `after` in the lap begun at `lap`, with the
    /// participants' passes.
    Fair {
        after: String,
        lap: String,
        passes: Passes,
    },
    /// One participant's tasks only; whether to probe for others.
    Solo(Option<String>, bool),
}

impl NextPick {
    pub(crate) fn as_pick(&self) -> Pick<'_> {
        match self {
            NextPick::Fair { after, lap, passes } => Pick::Fair { after, lap, passes },
            NextPick::Solo(tenant, probe) => Pick::Solo {
                tenant: tenant.as_deref(),
                probe: *probe,
            },
        }
    }
}

/// What a claim took, as [`FairClaims::picked`] needs it.
pub(crate) struct Took<'a> {
    pub(crate) page: &'a [ClaimedTask],
    /// The participants' weights (a participant not listed weighs 1).
    pub(crate) weights: &'a [(Option<String>, i32)],
    pub(crate) crowded: bool,
    pub(crate) ring_end: Option<String>,
    /// The ring stopped at its bound ([`crate::driver::Picked::ring_cut`]).
    pub(crate) ring_cut: bool,
    /// The participants that shared a fair claim's page (empty: unknown, or none).
    pub(crate) shared: Vec<Option<String>>,
    /// The most the claim could take.
    pub(crate) limit: usize,
}

/// The participants a page holds, each once: its tenants, and (`None`) the tasks without
/// one.
pub(crate) fn participants(page: &[ClaimedTask]) -> Vec<Option<&str>> {
    let mut seen: Vec<Option<&str>> = page.iter().map(|t| t.context.tenant()).collect();
    seen.sort_unstable();
    seen.dedup();
    seen
}

impl FairClaims {
    fn with_set<T>(&self, keywords: &[String], f: impl FnOnce(&mut KeywordSet) -> T) -> T {
        let mut sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        let i = match sets.iter().position(|s| s.keywords == keywords) {
            Some(i) => i,
            None => {
                sets.push(KeywordSet::new(keywords));
                sets.len() - 1
            }
        };
        f(&mut sets[i])
    }

    /// How the next claim of `keywords` picks: alone for the participant its claims found
    /// alone, else fairly from where the ring stopped. `limited` is the list of tenants with
    /// a `max_running` the claim itself passes on: such a tenant is never claimed alone.
    pub(crate) fn next_pick(&self, keywords: &[String], limited: &[String]) -> NextPick {
        self.with_set(keywords, |set| {
            if let Some((tenant, probed_at)) = &mut set.solo {
                if tenant.as_ref().map_or(true, |t| !limited.contains(t)) {
                    let probe = probed_at.elapsed() >= PROBE_EVERY;
                    if probe {
                        *probed_at = Instant::now();
                    }
                    return NextPick::Solo(tenant.clone(), probe);
                }
            }
            let base = set.base();
            let mut passes = Passes {
                base,
                none: set.passes.get(&None).copied().unwrap_or(base),
                ..Passes::default()
            };
            for (tenant, pass) in &set.passes {
                if let Some(tenant) = tenant {
                    passes.tenants.push(tenant.clone());
                    passes.values.push(*pass);
                }
            }
            NextPick::Fair {
                after: set.after.clone(),
                lap: set.lap.clone().unwrap_or_else(|| set.after.clone()),
                passes,
            }
        })
    }

    /// Whether the last claim of `keywords` came back short with more possibly due at once:
    /// its ring of tenants stopped at its bound (the most one statement walks) before it
    /// came round to where its lap began, or, taking one participant's tasks alone, it found
    /// another pending. The claim is then made again at once, going on from where it
    /// stopped, before the node concludes that nothing is due (`drain` ends on that, and
    /// `run` waits for its next poll): each lap ends where it began, so this ends too.
    pub(crate) fn goes_on(&self, keywords: &[String]) -> bool {
        self.with_set(keywords, |set| set.goes_on)
    }

    /// Records what a claim of `keywords` that picked `pick` took.
    ///
    /// A fair claim adds each task's 1/weight to its participant's pass; moves the ring on
    /// past the tenants it served (after the last of them in ring order), or, when its page
    /// was not full, past every tenant it walked; and, when one participant shared it (or
    /// none: then the tasks without a tenant are watched) and no claim of these keywords
    /// was shared by several for [`SOLO_AFTER`], makes the next claim solo. A fair claim
    /// whose page was not full and whose ring stopped at its bound makes the next go on in
    /// its lap, fair ([`FairClaims::goes_on`]). A solo claim that found another participant
    /// pending makes the next fair again (at once, when its page was not full).
    pub(crate) fn picked(&self, keywords: &[String], pick: &NextPick, took: Took<'_>) {
        self.with_set(keywords, |set| {
            let participants = participants(took.page);
            let short = took.page.len() < took.limit;
            if took.crowded || took.shared.len() > 1 {
                set.crowded_at = Some(Instant::now());
            }
            let (start, lap) = match pick {
                NextPick::Solo(..) => {
                    if took.crowded {
                        set.solo = None;
                    }
                    set.goes_on = took.crowded && short;
                    return;
                }
                NextPick::Fair { after, lap, passes } => {
                    // The participants that shared it keep their passes (one first seen
                    // starts at the base); the others are forgotten, and come back at the
                    // base. Each task served adds its participant's 1/weight.
                    if !took.shared.is_empty() {
                        set.passes.retain(|p, _| took.shared.contains(p));
                        for p in &took.shared {
                            set.passes.entry(p.clone()).or_insert(passes.base);
                        }
                    }
                    for task in took.page {
                        let key = task.context.tenant().map(str::to_owned);
                        let weight = took
                            .weights
                            .iter()
                            .find(|(p, _)| *p == key)
                            .map_or(1, |&(_, w)| w.max(1));
                        let pass = set.passes.entry(key).or_insert(passes.base);
                        *pass += 1.0 / f64::from(weight);
                    }
                    (after, lap)
                }
            };
            if set.passes.len() > MAX_PASSES {
                set.passes.clear();
            }
            let last_served = participants
                .iter()
                .flatten()
                .max_by_key(|&&tenant| (tenant <= start.as_str(), tenant))
                .map(|t| (*t).to_owned());
            // The lap goes on from the ring's end, unless the ring ended on the lap's start:
            // the lap is done.
            let goes_on =
                short && took.ring_cut && took.ring_end.as_ref().is_some_and(|end| end != lap);
            set.lap = goes_on.then(|| lap.clone());
            set.goes_on = goes_on;
            let moved_to = if short {
                took.ring_end.or(last_served)
            } else {
                last_served
            };
            if let Some(tenant) = moved_to {
                set.after = tenant;
            }
            // A lap under way stays fair: a participant found alone so far may not be.
            let quiet = !goes_on && set.crowded_at.map_or(true, |at| at.elapsed() >= SOLO_AFTER);
            set.solo = match (took.shared.len(), participants.as_slice()) {
                (1, [only]) if quiet => Some(only.map(str::to_owned)),
                (0, []) if quiet => Some(None),
                _ => None,
            }
            // The first solo claim probes.
            .map(|tenant| {
                let probed_at = Instant::now()
                    .checked_sub(PROBE_EVERY)
                    .unwrap_or_else(Instant::now);
                (tenant, probed_at)
            });
        });
    }
}
