//! The node's domains as configured and as `async_domain` overrides them: the heartbeat reads
//! the table (and `async_pause`) at each beat, applies what changed to the slots and the
//! claim plan, and publishes the slots' use in `async_node.domains`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use super::config::QUEUE_PER_THREAD;
use super::domain_rows::{held_keywords, merge, paused_as_now, shared_pool_rows, Merged};
use super::plan::{Plan, PlanLane};
use super::slots::{LaneSpec, Lanes, Share};
use crate::db::DbConnection;
use crate::domain::{validate_domains, Domain, DomainMode, NodeDomains, DEFAULT_DOMAIN};
use crate::driver::{domain_rows, keyword_paused, DomainRow};
use crate::error::{OpContext, Result};

/// A domain's queue when it sets none: [`QUEUE_PER_THREAD`] for each thread it can run on
/// at once — a `MAX n` domain's n (within `default`'s `shared` threads), a `RESERVED n`
/// domain's n and the `shared` threads it borrows — as the node's queue is per thread. A
/// smaller queue makes its claims small, and their round trips the domain's cost.
fn default_queue(domain: &Domain, shared: usize) -> usize {
    let reach = match domain.mode {
        DomainMode::Max => domain.threads.min(shared),
        DomainMode::Reserved => domain.threads + shared,
    };
    QUEUE_PER_THREAD * reach.max(1)
}

/// What the node was started with.
#[derive(Debug, Clone)]
pub(crate) struct Base {
    pub(crate) threads: usize,
    pub(crate) queue: usize,
    pub(crate) task_timeout: Duration,
    pub(crate) commit_batch: usize,
    /// Lock claims: a locked chunk never waits for a slot, so no lane has a queue.
    pub(crate) lock: bool,
    pub(crate) domains: Vec<Domain>,
    pub(crate) registered: Vec<String>,
    /// On the execution pool of a [`crate::Fleet`] of several databases, this database's
    /// part of it: its tasks run on a lane of their own, capped at its share of the threads.
    /// The slots are every database's, so this database's `async_domain` rows may pause
    /// `default` (its lane: its claims stop) but not reshape the slots; its other rows are
    /// ignored.
    pub(crate) share: Option<Share>,
}

/// The node's domains now.
pub(crate) struct DomainControl {
    base: Base,
    lanes: Arc<Lanes>,
    plan: RwLock<Arc<Plan>>,
    /// Whether some lane of the plan has a timeout of its own: read per task, so that a
    /// node without one looks no further.
    watching: AtomicBool,
    /// Whether some lane lists a keyword it no longer claims (paused, or held by a paused
    /// domain): read per task, so that a node with no pause looks no further.
    holding: AtomicBool,
    /// The table's rows and paused keywords last applied.
    applied: Mutex<Option<(Vec<DomainRow>, Vec<String>)>>,
    /// The rows of the last configuration applied whole (the last good one).
    good: Mutex<Vec<DomainRow>>,
}

impl DomainControl {
    /// Applies the configured domains to `lanes`.
    pub(crate) fn new(base: Base, lanes: Arc<Lanes>) -> Result<DomainControl> {
        let control = DomainControl {
            base,
            lanes,
            plan: RwLock::new(Arc::new(Plan {
                lanes: Vec::new(),
                lane_of: HashMap::new(),
                home: 0,
            })),
            watching: AtomicBool::new(false),
            holding: AtomicBool::new(false),
            applied: Mutex::new(None),
            good: Mutex::new(Vec::new()),
        };
        control.apply(&[], &[])?;
        Ok(control)
    }

    /// The claim plan now.
    pub(crate) fn plan(&self) -> Arc<Plan> {
        Arc::clone(&self.plan.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Whether some domain has a timeout of its own (see [`Plan::watch_of`]).
    pub(crate) fn watching(&self) -> bool {
        self.watching.load(Ordering::Relaxed)
    }

    /// Whether the tasks of `keyword` are held back now (see [`Plan::holds_back`]).
    pub(crate) fn holds_back(&self, keyword: &str) -> bool {
        self.holding.load(Ordering::Relaxed) && self.plan().holds_back(keyword)
    }

    /// Reads `async_domain` and `async_pause` again and applies them if they changed.
    pub(crate) fn refresh(&self, conn: &mut DbConnection) -> Result<()> {
        let rows = domain_rows(conn).op("domain read")?;
        let paused = keyword_paused(conn).op("domain read")?;
        let mut applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        if applied.as_ref() == Some(&(rows.clone(), paused.clone())) {
            return Ok(());
        }
        // Recorded even when it fails, so that a bad row is reported once, not at each beat.
        *applied = Some((rows.clone(), paused.clone()));
        drop(applied);
        // Held before the rows are narrowed for a shared pool: every node holds them.
        let held = held_keywords(&rows);
        let mut good = self.good.lock().unwrap_or_else(PoisonError::into_inner);
        match self.apply_with(&rows, &held, &paused) {
            Ok(()) => {
                *good = rows;
                Ok(())
            }
            // The last good rows stay, with every pause of now: a row this node refuses
            // keeps no keyword claimed that a pause holds.
            Err(refused) => self
                .apply_with(&paused_as_now(&good, &rows), &held, &paused)
                .and(Err(refused)),
        }
    }

    /// Applies the configuration merged with `rows`, with `paused` keywords not claimed, nor
    /// those the rows of paused or released domains hold.
    fn apply(&self, rows: &[DomainRow], paused: &[String]) -> Result<()> {
        self.apply_with(rows, &held_keywords(rows), paused)
    }

    /// Applies the configuration merged with `rows`, with `paused` keywords not claimed, nor
    /// those `held` (the keywords the rows of paused or released domains hold, whether this
    /// node runs those domains or not). A merge that is invalid changes nothing.
    fn apply_with(&self, rows: &[DomainRow], held: &[String], paused: &[String]) -> Result<()> {
        let base = &self.base;
        let shared_rows;
        let rows = if base.share.is_some() {
            shared_rows = shared_pool_rows(rows);
            &shared_rows
        } else {
            rows
        };
        let (default, domains) = merge(&base.domains, rows)?;
        // A released domain's reserved threads are default's until it is resumed.
        let holding: Vec<Domain> = domains
            .iter()
            .map(|d| {
                let mut domain = d.domain.clone();
                if d.released && domain.mode == DomainMode::Reserved {
                    domain.threads = 0;
                }
                domain
            })
            .collect();
        validate_domains(&holding, base.threads)?;
        let reserved: usize = holding
            .iter()
            .filter(|d| d.mode == DomainMode::Reserved)
            .map(|d| d.threads)
            .sum();
        let shared = base.threads.saturating_sub(reserved);
        let registered = |k: &String| base.registered.contains(k);
        let in_use: Vec<&Merged> = domains
            .iter()
            .filter(|d| d.domain.keywords.iter().any(registered))
            .collect();
        let timeout = |t: Option<Duration>| t.unwrap_or(base.task_timeout);
        let lane_paused: Vec<bool> = std::iter::once(default.paused)
            .chain(in_use.iter().map(|d| d.paused || d.released))
            .collect();
        // On a fleet's shared pool, `default` is this database's lane, capped at its share.
        let (threads, queue) = match base.share {
            Some(share) => (share.threads, share.queue),
            None => (base.threads, default.queue.unwrap_or(base.queue)),
        };
        let mut specs = vec![LaneSpec {
            name: DEFAULT_DOMAIN.to_owned(),
            mode: DomainMode::Max,
            threads,
            queue: if base.lock { 0 } else { queue },
            paused: default.paused,
            released: false,
            timeout_ms: millis(timeout(default.timeout)),
        }];
        specs.extend(in_use.iter().map(|d| LaneSpec {
            name: d.domain.name.clone(),
            mode: d.domain.mode,
            threads: d.domain.threads,
            queue: match (base.lock, d.domain.queue) {
                (true, _) => 0,
                (false, Some(queue)) => queue,
                (false, None) => default_queue(&d.domain, shared),
            },
            paused: d.paused || d.released,
            released: d.released,
            timeout_ms: millis(timeout(d.domain.timeout)),
        }));
        let listed: Vec<&String> = in_use.iter().flat_map(|d| &d.domain.keywords).collect();
        let mut lane_listed = vec![base
            .registered
            .iter()
            .filter(|k| !listed.contains(k))
            .cloned()
            .collect::<Vec<_>>()];
        lane_listed.extend(in_use.iter().map(|d| {
            d.domain
                .keywords
                .iter()
                .filter(|k| registered(k))
                .cloned()
                .collect()
        }));
        // Neither a keyword paused on its own nor one a paused domain holds, wherever it runs
        // here.
        let claimable = |k: &&String| !paused.contains(k) && !held.contains(k);
        let mut keywords: Vec<Vec<String>> = lane_listed
            .iter()
            .map(|l| l.iter().filter(claimable).cloned().collect())
            .collect();
        let timeouts: Vec<Option<Duration>> = std::iter::once(default.timeout)
            .chain(in_use.iter().map(|d| d.domain.timeout))
            .collect();
        // A handler's statements may run as long as its domain's timeout: the reply timeout
        // covers it, as it does the task timeout (see `db::reply`).
        for &t in timeouts.iter().flatten() {
            crate::db::reply::cover_task_timeout(t);
        }
        // A paused lane claims nothing.
        for (keywords, paused) in keywords.iter_mut().zip(&lane_paused) {
            if *paused {
                keywords.clear();
            }
        }
        let indexes = match base.share {
            // No domains on a shared pool (its rows are narrowed to `default`'s): only this
            // database's lane is set, never another database's.
            Some(share) => {
                debug_assert_eq!(specs.len(), 1, "no domains on a shared pool");
                let spec = specs.swap_remove(0);
                self.lanes.set(share.lane, spec);
                vec![share.lane]
            }
            None => self.lanes.apply(specs),
        };
        let mut lane_of = HashMap::new();
        for (d, &lane) in in_use.iter().zip(&indexes[1..]) {
            for keyword in &d.domain.keywords {
                lane_of.insert(keyword.clone(), lane);
            }
        }
        let plan = Plan {
            lanes: indexes
                .into_iter()
                .zip(keywords)
                .zip(lane_listed)
                .zip(timeouts)
                .map(|(((lane, keywords), listed), own)| PlanLane {
                    lane,
                    keywords,
                    listed,
                    timeout: timeout(own) * u32::try_from(base.commit_batch).unwrap_or(1),
                    watch: own,
                })
                .collect(),
            lane_of,
            home: base.share.map_or(0, |share| share.lane),
        };
        let mut current = self.plan.write().unwrap_or_else(PoisonError::into_inner);
        if !current.lanes.is_empty() && **current != plan {
            log::info!("domains applied: {:?}", plan.lanes);
        }
        self.watching.store(
            plan.lanes.iter().any(|l| l.watch.is_some()),
            Ordering::Relaxed,
        );
        let holding = plan.lanes.iter().any(|l| l.keywords.len() < l.listed.len());
        *current = Arc::new(plan);
        self.holding.store(holding, Ordering::Relaxed);
        Ok(())
    }

    /// What the node publishes at its heartbeat: its threads and each lane's use (lanes no
    /// longer configured only while they still run or hold tasks).
    pub(crate) fn publication(&self) -> String {
        let plan = self.plan();
        let usage = self.lanes.lock().usage();
        let domains = usage
            .into_iter()
            .enumerate()
            .filter_map(|(i, mut used)| {
                match plan.lanes.iter().find(|l| l.lane == i) {
                    Some(lane) => used.keywords = lane.listed.clone(),
                    // On a fleet's shared pool, the other lanes are the other databases'.
                    None if self.base.share.is_some() => return None,
                    None if used.running + used.queued == 0 => return None,
                    None => {}
                }
                Some(used)
            })
            .collect();
        serde_json::to_string(&NodeDomains {
            threads: self.base.threads,
            domains,
        })
        .expect("domains serialise")
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[path = "domains_tests.rs"]
mod tests;
