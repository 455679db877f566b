//! The arithmetic of the strategies: which ids a partitioned node owns (seed 002's
//! WeightStrategy, of which `id_hash` is the case of weights 1), and how many tasks a
//! `least_count` node may still take.

/// A live node that partitions the ids (`id_hash` or `weight`), with its weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) id: i64,
    pub(crate) weight: i64,
}

/// The ids a partitioned node claims as their owner: those whose `id mod modulus` lies in
/// `[lo, hi)`; any other due task only once it has been due for `grace_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    pub(crate) modulus: i64,
    pub(crate) lo: i64,
    pub(crate) hi: i64,
    pub(crate) grace_ms: i64,
}

impl Partition {
    /// Whether this node owns the task `id`.
    #[cfg(test)]
    pub(crate) fn owns(&self, id: i64) -> bool {
        (self.lo..self.hi).contains(&id.rem_euclid(self.modulus))
    }

    /// The last remainder this node owns (`hi − 1`), for the claim's `BETWEEN lo AND last`.
    pub(crate) fn last(&self) -> i64 {
        self.hi - 1
    }
}

/// The partition of the node `me` among the partitioned live nodes `members` (`me` counted
/// once, whether listed or not): the members ordered by id, `modulus` the sum of their
/// weights, `me` owning the `me.weight` remainders after the weights of the nodes before it.
/// `None` when `me` owns every id (it is the only member): its claim needs no filter.
pub(crate) fn partition_of(members: &[Member], me: Member, grace_ms: i64) -> Option<Partition> {
    let mut all: Vec<Member> = members.iter().copied().filter(|m| m.id != me.id).collect();
    all.push(me);
    all.sort_by_key(|m| m.id);
    let weight = |m: &Member| m.weight.max(1);
    let modulus: i64 = all.iter().map(weight).sum();
    let lo: i64 = all.iter().take_while(|m| m.id != me.id).map(weight).sum();
    let hi = lo + weight(&me);
    (hi - lo < modulus).then_some(Partition {
        modulus,
        lo,
        hi,
        grace_ms,
    })
}

/// How many more tasks a `least_count` node holding `mine` may claim: up to the least of
/// `others` (the other live nodes' published counts) plus `slack`. `None` when there is no
/// other node to compare with (no limit).
pub(crate) fn least_count_room(
    mine: u64,
    others: impl IntoIterator<Item = u64>,
    slack: u64,
) -> Option<u64> {
    let least = others.into_iter().min()?;
    Some(least.saturating_add(slack).saturating_sub(mine))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(weights: &[(i64, i64)]) -> Vec<Member> {
        weights
            .iter()
            .map(|&(id, weight)| Member { id, weight })
            .collect()
    }

    /// Who owns each remainder `0..modulus`, by node id.
    fn owners(all: &[Member]) -> Vec<i64> {
        let parts: Vec<(i64, Partition)> = all
            .iter()
            .map(|&m| (m.id, partition_of(all, m, 0).expect("several members")))
            .collect();
        let modulus = parts[0].1.modulus;
        (0..modulus)
            .map(|r| {
                let owning: Vec<i64> = parts
                    .iter()
                    .filter(|(_, p)| p.owns(r))
                    .map(|&(id, _)| id)
                    .collect();
                assert_eq!(owning.len(), 1, "remainder {r} has owners {owning:?}");
                owning[0]
            })
            .collect()
    }

    #[test]
    fn id_hash_gives_each_node_its_position() {
        // Three id_hash nodes (weight 1): node ids in order own remainders 0, 1, 2.
        let all = members(&[(42, 1), (7, 1), (19, 1)]);
        assert_eq!(owners(&all), vec![7, 19, 42]);
        let p = partition_of(&all, Member { id: 19, weight: 1 }, 15_000).unwrap();
        assert_eq!((p.modulus, p.lo, p.hi, p.last()), (3, 1, 2, 1));
        assert_eq!(p.grace_ms, 15_000);
        assert!(p.owns(4) && p.owns(1) && !p.owns(3) && !p.owns(5));
    }

    #[test]
    fn weights_give_ranges_in_proportion_as_the_seed_writes() {
        // Seed 002: weights 2, 3, 3, 2 take remainders 0-1 | 2-4 | 5-7 | 8-9.
        let all = members(&[(1, 2), (2, 3), (3, 3), (4, 2)]);
        assert_eq!(owners(&all), vec![1, 1, 2, 2, 2, 3, 3, 3, 4, 4]);
        // Over any run of consecutive ids, each node owns its weight's share.
        let p = partition_of(&all, Member { id: 2, weight: 3 }, 0).unwrap();
        assert_eq!((1..=1000).filter(|&id| p.owns(id)).count(), 300);
    }

    #[test]
    fn id_hash_and_weight_nodes_share_one_ring() {
        // An id_hash node weighs 1 beside weight nodes.
        let all = members(&[(5, 1), (6, 4)]);
        assert_eq!(owners(&all), vec![5, 6, 6, 6, 6]);
    }

    #[test]
    fn the_node_itself_counts_once_listed_or_not() {
        let others = members(&[(1, 1), (3, 1)]);
        let me = Member { id: 2, weight: 1 };
        let unlisted = partition_of(&others, me, 0).unwrap();
        let mut listed = others.clone();
        listed.push(me);
        assert_eq!(partition_of(&listed, me, 0), Some(unlisted));
        assert_eq!((unlisted.modulus, unlisted.lo, unlisted.hi), (3, 1, 2));
    }

    #[test]
    fn ownership_moves_when_nodes_come_and_go() {
        let me = Member { id: 20, weight: 1 };
        let before = partition_of(&members(&[(10, 1), (20, 1), (30, 1)]), me, 0).unwrap();
        assert_eq!((before.modulus, before.lo), (3, 1));
        // Node 10 died: node 20 is first of two.
        let after = partition_of(&members(&[(20, 1), (30, 1)]), me, 0).unwrap();
        assert_eq!((after.modulus, after.lo), (2, 0));
        // Node 25 joined.
        let joined = partition_of(&members(&[(20, 1), (25, 1), (30, 1)]), me, 0).unwrap();
        assert_eq!((joined.modulus, joined.lo), (3, 0));
    }

    #[test]
    fn a_node_alone_owns_everything_and_needs_no_filter() {
        let me = Member { id: 9, weight: 3 };
        assert_eq!(partition_of(&[], me, 0), None);
        assert_eq!(partition_of(&[me], me, 0), None);
    }

    #[test]
    fn a_weight_below_one_counts_as_one() {
        let all = members(&[(1, 0), (2, 1)]);
        assert_eq!(owners(&all), vec![1, 2]);
    }

    #[test]
    fn least_count_room_is_the_least_other_plus_the_slack_less_what_it_holds() {
        assert_eq!(least_count_room(0, [], 4), None, "alone: no limit");
        assert_eq!(least_count_room(0, [0, 0], 4), Some(4));
        assert_eq!(least_count_room(3, [7, 2, 9], 4), Some(3));
        assert_eq!(least_count_room(6, [2], 4), Some(0));
        assert_eq!(least_count_room(10, [2], 4), Some(0), "never negative");
    }
}
