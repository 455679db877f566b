//! The claim-strategy flags of the commands that run tasks (see [`crate::strategy`]).

use std::time::Duration;

use clap::Args;

use super::parse_duration;
use crate::strategy::{Strategy, DEFAULT_WEIGHT};
use crate::worker::WorkerConfig;

/// `--strategy` and its settings.
#[derive(Debug, Clone, Args)]
pub struct StrategyArgs {
    /// Which due tasks this node claims: `default` (any, first come); `id_hash` (the ids of
    /// its position among the live id_hash and weight nodes by node id, id mod N; any task
    /// due for longer than --strategy-grace); `least_count` (only while it holds no more than
    /// the least-loaded live node plus --slack); `weight` (as id_hash, a share of the ids in
    /// proportion to --weight).
    #[arg(long, default_value_t = Strategy::Default)]
    strategy: Strategy,
    /// With --strategy weight: this node's weight, 1 to 1000 [default: 1].
    #[arg(long)]
    weight: Option<u32>,
    /// With id_hash or weight: how long a task another node owns must have been due before
    /// this node claims it anyway [default: --dead-after].
    #[arg(long, value_parser = parse_duration)]
    strategy_grace: Option<Duration>,
    /// With least_count: how many tasks more than the least-loaded live node this node may
    /// hold [default: --threads].
    #[arg(long)]
    slack: Option<usize>,
}

impl StrategyArgs {
    /// `config` with these flags (checked when the worker's settings are resolved).
    pub fn apply(&self, config: WorkerConfig) -> WorkerConfig {
        let mut config = config
            .strategy(self.strategy)
            .weight(self.weight.unwrap_or(DEFAULT_WEIGHT));
        config.strategy_grace = self.strategy_grace;
        config.slack = self.slack;
        config
    }
}
