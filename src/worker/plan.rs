//! The claim plan: what each claim asks for, lane by lane (the keywords of each domain
//! that is not paused, their deadline, their domain's own timeout), and on which lane a
//! task runs. [`super::domains`] makes it from the configured domains and `async_domain`
//! at each heartbeat; the claim loops and the execution read it.

use std::collections::HashMap;
use std::time::Duration;

/// One lane's claim: the keywords its claim asks for (registered here, not paused) and the
/// deadline its tasks get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlanLane {
    pub(crate) lane: usize,
    pub(crate) keywords: Vec<String>,
    /// The lane's keywords registered here, paused or not: what the node publishes as its
    /// domain's keywords.
    pub(crate) listed: Vec<String>,
    pub(crate) timeout: Duration,
    /// The domain's own timeout, when it has one: its handlers are watched for it.
    pub(crate) watch: Option<Duration>,
}

/// What each claim asks for, lane by lane, `default` first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) lanes: Vec<PlanLane>,
    pub(super) lane_of: HashMap<String, usize>,
    /// The lane of the keywords no domain lists: 0, `default`'s, or on a fleet's shared
    /// pool this database's own ([`super::slots::Share`]).
    pub(crate) home: usize,
}

impl Plan {
    /// The lane whose slots a task of `keyword` runs on.
    pub(crate) fn lane_of(&self, keyword: &str) -> usize {
        self.lane_of.get(keyword).copied().unwrap_or(self.home)
    }

    /// The lane a task of `keyword` runs on, and its domain's own timeout, if any.
    pub(crate) fn watch_of(&self, keyword: &str) -> (usize, Option<Duration>) {
        let lane = self.lane_of(keyword);
        let watch = self
            .lanes
            .iter()
            .find(|l| l.lane == lane)
            .and_then(|l| l.watch);
        (lane, watch)
    }

    /// Whether claims are sized lane by lane, each by its lane's room: when some domain
    /// besides `default` is in use, or on a fleet's shared pool (a lane per database).
    /// Otherwise everything runs on `default`, whose claims take the pool's room and
    /// whose claiming thread runs tasks too (CallerRuns, and helping while it waits).
    pub(crate) fn by_lanes(&self) -> bool {
        self.lanes.len() > 1 || self.home != 0
    }

    /// The lanes with keywords to claim.
    pub(crate) fn claiming(&self) -> Vec<usize> {
        self.lanes
            .iter()
            .filter(|l| !l.keywords.is_empty())
            .map(|l| l.lane)
            .collect()
    }

    /// Whether the tasks of `keyword` are held back: its lane lists it (registered here) but
    /// claims it no more, its domain or the keyword itself paused. Such a task that waits in
    /// the queue is given back unstarted when its turn comes.
    pub(crate) fn holds_back(&self, keyword: &str) -> bool {
        self.lanes.iter().any(|l| {
            l.keywords.len() < l.listed.len()
                && l.listed.iter().any(|k| k == keyword)
                && !l.keywords.iter().any(|k| k == keyword)
        })
    }

    /// Every keyword any lane claims (none of a paused lane, nor a paused keyword).
    pub(crate) fn keywords(&self) -> Vec<String> {
        self.lanes
            .iter()
            .flat_map(|l| l.keywords.iter().cloned())
            .collect()
    }
}
