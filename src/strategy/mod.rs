//! Claim strategies (seed 002): which of the due tasks a node claims, chosen per node.
//!
//! Every node publishes its strategy, its weight and how many tasks it holds (claimed and not
//! finished) at each heartbeat, in its `async_node` row, and reads the other live nodes'
//! (those whose heartbeat is younger than the rescue's `dead_after`) at the same time:
//!
//! - [`Strategy::Default`] — first come, first served: the node claims any due task.
//! - [`Strategy::IdHash`] and [`Strategy::Weight`] — the *partitioned* nodes (the live nodes
//!   of either strategy), ordered by node id, share the task ids: with `M` the sum of their
//!   weights (an `id_hash` node weighs 1), a node owns the ids whose `id mod M` lies in
//!   `[w, w + its weight)`, `w` the weights of the nodes before it. It claims the due tasks it
//!   owns, and any task due for longer than its grace period (default: the rescue's
//!   `dead_after`): a bucket whose owner died, is not yet noticed, lacks the keyword's
//!   handler or is behind waits at most that long. Ownership moves as nodes come and go,
//!   at each heartbeat.
//! - [`Strategy::LeastCount`] — the node claims only while it holds fewer tasks than the
//!   least-loaded other live node (as published at its last heartbeat) plus its slack
//!   (default: its threads), and its page is at most the difference.
//!
//! A strategy only narrows the same atomic claim statement (a filter on the ids, a smaller
//! page): no strategy can make two nodes run one task.

mod partition;

use std::fmt;
use std::str::FromStr;

pub(crate) use partition::{least_count_room, partition_of, Member, Partition};

/// A node's weight when it sets none (the weight of every `id_hash` node).
pub const DEFAULT_WEIGHT: u32 = 1;
/// The largest weight a node may have.
pub const MAX_WEIGHT: u32 = 1000;

/// How a node chooses among the due tasks (see the [module](self)).
///
/// ```
/// use outbox::strategy::Strategy;
///
/// let strategy: Strategy = "id_hash".parse().unwrap();
/// assert_eq!(strategy, Strategy::IdHash);
/// assert_eq!(strategy.to_string(), "id_hash");
/// assert!("round_robin".parse::<Strategy>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// Any due task, first come first served.
    #[default]
    Default,
    /// The tasks whose `id mod N` is this node's position among the N partitioned live
    /// nodes (affinity), and any task due for longer than the grace period.
    IdHash,
    /// Only while this node holds no more than the least-loaded other live node plus a slack.
    LeastCount,
    /// A share of the ids in proportion to this node's weight among the partitioned live
    /// nodes, and any task due for longer than the grace period.
    Weight,
}

impl Strategy {
    /// Every strategy, in the order the CLI lists them.
    pub const ALL: [Strategy; 4] = [
        Strategy::Default,
        Strategy::IdHash,
        Strategy::LeastCount,
        Strategy::Weight,
    ];

    /// The name stored in `async_node.strategy` and written on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Default => "default",
            Strategy::IdHash => "id_hash",
            Strategy::LeastCount => "least_count",
            Strategy::Weight => "weight",
        }
    }

    /// Whether a node of this strategy owns a share of the task ids (`id_hash`, `weight`).
    pub fn partitions(self) -> bool {
        matches!(self, Strategy::IdHash | Strategy::Weight)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .into_iter()
            .find(|strategy| strategy.as_str() == s)
            .ok_or_else(|| {
                format!("unknown strategy {s:?}: expected default, id_hash, least_count or weight")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for strategy in Strategy::ALL {
            assert_eq!(strategy.as_str().parse::<Strategy>(), Ok(strategy));
        }
        assert!("".parse::<Strategy>().is_err());
        assert!("ID_HASH".parse::<Strategy>().is_err());
        assert!(Strategy::IdHash.partitions() && Strategy::Weight.partitions());
        assert!(!Strategy::Default.partitions() && !Strategy::LeastCount.partitions());
    }
}
