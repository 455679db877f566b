//! The node's claim strategy at run time (see [`crate::strategy`]): its settings, checked;
//! what it publishes and reads at each heartbeat; and what each claim asks of it, the
//! partition of the ids and the room `least_count` leaves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use super::config::{WorkerConfig, MAX_TASK_TIMEOUT};
use crate::db::DbConnection;
use crate::driver::{node_strategies, node_strategy_publish};
use crate::error::{Error, OpContext, Result};
use crate::strategy::{
    least_count_room, partition_of, Member, Partition, Strategy, DEFAULT_WEIGHT, MAX_WEIGHT,
};

/// A node's strategy settings, every default filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StrategySettings {
    pub(crate) strategy: Strategy,
    pub(crate) weight: u32,
    /// How long a task another node owns waits before this one claims it (`id_hash`,
    /// `weight`).
    pub(crate) grace: Duration,
    /// How many tasks more than the least-loaded other node this one may hold
    /// (`least_count`).
    pub(crate) slack: usize,
}

impl StrategySettings {
    /// The settings of `config` on a node of `threads` whose silent peers are dead after
    /// `dead_after`. Fails with [`Error::InvalidConfig`] naming the setting that is out of
    /// range, or that the strategy has no use for (a weight of an `id_hash` node, which
    /// weighs 1; a slack without `least_count`; a grace without a partition).
    pub(crate) fn resolve(
        config: &WorkerConfig,
        threads: usize,
        dead_after: Duration,
    ) -> Result<StrategySettings> {
        let bad =
            |setting: &'static str, reason: String| Err(Error::InvalidConfig { setting, reason });
        let strategy = config.strategy;
        if !(1..=MAX_WEIGHT).contains(&config.weight) {
            return bad(
                "weight",
                format!("must be between 1 and {MAX_WEIGHT}, not {}", config.weight),
            );
        }
        if config.weight != DEFAULT_WEIGHT && strategy != Strategy::Weight {
            return bad(
                "weight",
                format!("applies to the weight strategy only, not {strategy} (an id_hash node weighs 1)"),
            );
        }
        if config.slack.is_some() && strategy != Strategy::LeastCount {
            return bad(
                "slack",
                format!("applies to the least_count strategy only, not {strategy}"),
            );
        }
        if config.slack == Some(0) {
            return bad("slack", "must be at least 1".into());
        }
        if config.strategy_grace.is_some() && !strategy.partitions() {
            return bad(
                "strategy-grace",
                format!("applies to the id_hash and weight strategies only, not {strategy}"),
            );
        }
        let grace = config.strategy_grace.unwrap_or(dead_after);
        if grace.is_zero() || grace > MAX_TASK_TIMEOUT {
            return bad(
                "strategy-grace",
                format!("must be more than 0 and at most 100 years, not {grace:?}"),
            );
        }
        Ok(StrategySettings {
            strategy,
            weight: config.weight,
            grace,
            slack: config.slack.unwrap_or(threads),
        })
    }
}

/// What the node last read of the fleet, for its claims.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct View {
    /// Its share of the ids (`None`: every id).
    partition: Option<Partition>,
    /// The fewest tasks another live node held at its last beat (`None`: none to compare).
    least_other: Option<u64>,
}

/// The node's strategy: its settings, the tasks it holds, and its view of the fleet.
#[derive(Debug)]
pub(crate) struct StrategyControl {
    settings: StrategySettings,
    /// Tasks claimed by this node and not finished yet (the worker's count).
    held: Arc<AtomicU64>,
    /// How recent a heartbeat must be for a node to count as live: the rescue's
    /// `dead_after`.
    live_within: Duration,
    view: RwLock<View>,
}

impl StrategyControl {
    /// A node's strategy of `settings`, counting nodes live whose heartbeat is younger than
    /// `live_within`.
    pub(crate) fn new(settings: StrategySettings, live_within: Duration) -> StrategyControl {
        StrategyControl {
            settings,
            held: Arc::default(),
            live_within,
            view: RwLock::new(View::default()),
        }
    }

    /// The count of tasks this node holds (claimed, not finished), which the worker keeps
    /// and the heartbeat publishes.
    pub(crate) fn held(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.held)
    }

    /// Publishes this node's strategy, weight and tasks held in its row (`node_id`), then,
    /// unless its strategy is `default`, reads the live nodes' and recomputes its view.
    pub(crate) fn refresh(&self, conn: &mut DbConnection, node_id: i64) -> Result<()> {
        let s = self.settings;
        let held = self.held.load(Ordering::Relaxed);
        node_strategy_publish(
            conn,
            node_id,
            s.strategy.as_str(),
            i32::try_from(s.weight).unwrap_or(i32::MAX),
            i64::try_from(held).unwrap_or(i64::MAX),
        )
        .op("node strategy publish")?;
        if s.strategy == Strategy::Default {
            return Ok(());
        }
        let within = i64::try_from(self.live_within.as_millis()).unwrap_or(i64::MAX);
        let nodes = node_strategies(conn, within).op("node strategy read")?;
        let view = match s.strategy {
            Strategy::LeastCount => View {
                partition: None,
                least_other: nodes
                    .iter()
                    .filter(|n| n.id != node_id)
                    .map(|n| u64::try_from(n.running).unwrap_or(0))
                    .min(),
            },
            _ => {
                let members: Vec<Member> = nodes
                    .iter()
                    .filter_map(|n| {
                        let weight = match n.strategy.parse() {
                            Ok(Strategy::IdHash) => 1,
                            Ok(Strategy::Weight) => i64::from(n.weight),
                            _ => return None,
                        };
                        Some(Member { id: n.id, weight })
                    })
                    .collect();
                let me = Member {
                    id: node_id,
                    weight: match s.strategy {
                        Strategy::Weight => i64::from(s.weight),
                        _ => 1,
                    },
                };
                let grace_ms = i64::try_from(s.grace.as_millis()).unwrap_or(i64::MAX);
                View {
                    partition: partition_of(&members, me, grace_ms),
                    least_other: None,
                }
            }
        };
        let mut current = self.view.write().unwrap_or_else(PoisonError::into_inner);
        if *current != view {
            match view.partition {
                Some(p) if s.strategy.partitions() => log::info!(
                    "node {node_id} ({}): owns the tasks whose id mod {} is in {}..{}",
                    s.strategy,
                    p.modulus,
                    p.lo,
                    p.hi
                ),
                None if s.strategy.partitions() => {
                    log::info!("node {node_id} ({}): owns every task", s.strategy)
                }
                _ => {}
            }
        }
        *current = view;
        Ok(())
    }

    /// This node's share of the ids for its claims (`None`: every id).
    pub(crate) fn partition(&self) -> Option<Partition> {
        self.view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .partition
    }

    /// Under `least_count` with another live node to compare with: the most tasks this node
    /// may hold (the least-loaded other node's plus the slack) and how many it holds.
    pub(crate) fn least_count_bound(&self) -> Option<(u64, u64)> {
        if self.settings.strategy != Strategy::LeastCount {
            return None;
        }
        let least = self
            .view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .least_other?;
        let most = least.saturating_add(self.settings.slack as u64);
        Some((most, self.held.load(Ordering::Relaxed)))
    }

    /// At most how many tasks `limit` lets this node claim now: `limit`, or under
    /// `least_count` no more than takes it to the least-loaded other live node plus the
    /// slack.
    pub(crate) fn cap(&self, limit: usize) -> usize {
        if self.settings.strategy != Strategy::LeastCount {
            return limit;
        }
        let least = self
            .view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .least_other;
        let held = self.held.load(Ordering::Relaxed);
        match least_count_room(held, least, self.settings.slack as u64) {
            None => limit,
            Some(room) => limit.min(usize::try_from(room).unwrap_or(usize::MAX)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(config: WorkerConfig) -> StrategySettings {
        StrategySettings::resolve(&config, 6, Duration::from_secs(15)).unwrap()
    }

    #[test]
    fn the_grace_defaults_to_dead_after_and_the_slack_to_the_threads() {
        let least = settings(WorkerConfig::default().strategy(Strategy::LeastCount));
        assert_eq!((least.slack, least.weight), (6, DEFAULT_WEIGHT));
        let id_hash = settings(WorkerConfig::default().strategy(Strategy::IdHash));
        assert_eq!(id_hash.grace, Duration::from_secs(15));
        let weight = WorkerConfig::default()
            .strategy(Strategy::Weight)
            .weight(5)
            .strategy_grace(Duration::from_secs(2));
        let weight = settings(weight);
        assert_eq!((weight.weight, weight.grace), (5, Duration::from_secs(2)));
    }

    #[test]
    fn least_count_caps_a_claim_at_the_least_other_plus_the_slack_less_what_it_holds() {
        let config = WorkerConfig::default()
            .strategy(Strategy::LeastCount)
            .slack(4);
        let control = StrategyControl::new(settings(config), Duration::from_secs(15));
        // No other node read yet: no limit.
        assert_eq!(control.cap(100), 100);
        assert_eq!(control.least_count_bound(), None);
        control.held().store(3, Ordering::Relaxed);
        control.view.write().unwrap().least_other = Some(2);
        assert_eq!(control.cap(100), 3);
        assert_eq!(control.cap(2), 2);
        assert_eq!(control.least_count_bound(), Some((6, 3)));
        control.held().store(6, Ordering::Relaxed);
        assert_eq!(control.cap(100), 0);
        // Another strategy is never capped.
        let id_hash = StrategyControl::new(
            settings(WorkerConfig::default().strategy(Strategy::IdHash)),
            Duration::from_secs(15),
        );
        id_hash.held().store(1000, Ordering::Relaxed);
        assert_eq!(id_hash.cap(100), 100);
        assert_eq!(id_hash.least_count_bound(), None);
    }
}
