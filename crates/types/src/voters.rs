//! How the metadata's voters sit in the zones, and what the loss of one zone would
//! do to their majority: a pure function of the cluster map and the voter ids, shared
//! by `drove cluster health` (the daemon judges from it) and `drove node list` /
//! `drove cluster status` (the CLI prints its summary).
use crate::{ClusterMap, NodeId, NodeState};
use std::collections::BTreeMap;

/// The zone a voter missing from the map is counted under.
pub const UNKNOWN_ZONE: &str = "?";

/// The voters by zone and the risks they leave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoterZones {
    /// Voters per zone, zones in name order, ids in order; a voter the map does not
    /// have (a joiner not yet recorded) is under [`UNKNOWN_ZONE`].
    pub zones: BTreeMap<String, Vec<NodeId>>,
    /// The number of voters.
    pub voters: usize,
    /// The voters up in the map.
    pub up: usize,
    /// The zones whose loss alone would leave fewer than a majority of the voters up.
    /// Empty when the map has a single zone (losing it loses everything, data too:
    /// nothing to warn of that placement could change) and when no majority of the
    /// voters is up now (the metadata is stuck already).
    pub fatal: Vec<String>,
    /// The zones with two voters or more, when some zone with a node that may vote
    /// ([`crate::NodeInfo::may_vote`]) has none (the leader moves a vote there).
    pub crowded: Vec<String>,
    /// The zones with a node that may vote and no voter.
    pub without: Vec<String>,
}

impl VoterZones {
    /// Where `voters` sit on `map`.
    pub fn of(map: &ClusterMap, voters: &[NodeId]) -> VoterZones {
        let mut zones: BTreeMap<String, Vec<NodeId>> = BTreeMap::new();
        let mut up = 0;
        for &v in voters {
            let node = map.node(v);
            let zone = node.map_or(UNKNOWN_ZONE, |n| n.zone.as_str());
            zones.entry(zone.to_string()).or_default().push(v);
            if node.is_some_and(|n| n.state == NodeState::Up) {
                up += 1;
            }
        }
        for ids in zones.values_mut() {
            ids.sort_unstable();
            ids.dedup();
        }
        let count = zones.values().map(Vec::len).sum::<usize>();
        let majority = count / 2 + 1;
        let mut all_zones: Vec<&str> = map.nodes.values().map(|n| n.zone.as_str()).collect();
        all_zones.sort_unstable();
        all_zones.dedup();
        let fatal = if all_zones.len() < 2 || up < majority {
            Vec::new()
        } else {
            zones
                .iter()
                .filter(|(zone, ids)| {
                    let lost = ids
                        .iter()
                        .filter(|id| {
                            map.node(**id)
                                .is_some_and(|n| n.state == NodeState::Up && &n.zone == *zone)
                        })
                        .count();
                    up - lost < majority
                })
                .map(|(zone, _)| zone.clone())
                .collect()
        };
        let mut without: Vec<String> = map
            .nodes
            .values()
            .filter(|n| n.may_vote() && !zones.contains_key(&n.zone))
            .map(|n| n.zone.clone())
            .collect();
        without.dedup();
        let crowded = if without.is_empty() {
            Vec::new()
        } else {
            zones
                .iter()
                .filter(|(zone, ids)| ids.len() > 1 && zone.as_str() != UNKNOWN_ZONE)
                .map(|(zone, _)| zone.clone())
                .collect()
        };
        VoterZones {
            zones,
            voters: count,
            up,
            fatal,
            crowded,
            without,
        }
    }

    /// How many voters make a majority.
    pub fn majority(&self) -> usize {
        self.voters / 2 + 1
    }

    /// One line for people: `3 voters in 3 zones: z1 (1), z2 (3), z3 (5)`.
    pub fn summary(&self) -> String {
        let zones: Vec<String> = self
            .zones
            .iter()
            .map(|(zone, ids)| {
                let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
                format!("{zone} ({})", ids.join(", "))
            })
            .collect();
        format!(
            "{} voter{} in {} zone{}: {}",
            self.voters,
            if self.voters == 1 { "" } else { "s" },
            self.zones.len(),
            if self.zones.len() == 1 { "" } else { "s" },
            zones.join(", ")
        )
    }

    /// What the loss of one zone does, in one line for people: which zones' loss
    /// would stop the metadata, or that any one zone can be lost.
    pub fn risk(&self) -> String {
        if self.up < self.majority() {
            return format!(
                "only {} of the {} voters are up: no majority",
                self.up, self.voters
            );
        }
        match self.fatal.as_slice() {
            [] if self.zones.len() < 2 => {
                "the voters share one zone: losing it stops the metadata".to_string()
            }
            [] => "the loss of any one zone keeps a majority".to_string(),
            [z] => format!("the loss of zone {z} would lose the majority"),
            zs => format!(
                "the loss of any one of zones {} would lose the majority",
                zs.join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeInfo;

    /// `nodes` as (id, zone); witnesses weight 0.
    fn map(nodes: &[(u64, &str)]) -> ClusterMap {
        let mut m = ClusterMap::default();
        for &(id, zone) in nodes {
            m.nodes.insert(NodeId(id), NodeInfo::new(NodeId(id), zone));
        }
        m
    }

    fn ids(v: &[u64]) -> Vec<NodeId> {
        v.iter().map(|&i| NodeId(i)).collect()
    }

    #[test]
    fn test_two_voters_in_one_zone_make_that_zone_fatal_and_crowded_when_another_has_none() {
        // The layout: zones joined one at a time, the first three nodes vote.
        let m = map(&[
            (1, "z1"),
            (2, "z1"),
            (3, "z2"),
            (4, "z2"),
            (5, "z3"),
            (6, "z3"),
        ]);
        let v = VoterZones::of(&m, &ids(&[1, 2, 3]));
        assert_eq!(v.fatal, vec!["z1".to_string()]);
        assert_eq!(v.crowded, vec!["z1".to_string()]);
        assert_eq!(v.without, vec!["z3".to_string()]);
        assert_eq!(v.summary(), "3 voters in 2 zones: z1 (1, 2), z2 (3)");
        assert_eq!(v.risk(), "the loss of zone z1 would lose the majority");
        // One per zone: nothing to say.
        let v = VoterZones::of(&m, &ids(&[1, 3, 5]));
        assert!(v.fatal.is_empty() && v.crowded.is_empty() && v.without.is_empty());
        assert_eq!(v.risk(), "the loss of any one zone keeps a majority");
    }

    #[test]
    fn test_two_zones_cannot_both_be_safe_and_a_witness_makes_them() {
        let mut m = map(&[(1, "z1"), (2, "z1"), (3, "z2"), (4, "z2")]);
        let v = VoterZones::of(&m, &ids(&[1, 2, 3]));
        assert_eq!(v.fatal, vec!["z1".to_string()]);
        // Every zone has a voter: crowded is not said (nothing to move it to).
        assert!(v.crowded.is_empty() && v.without.is_empty());
        m.nodes.insert(
            NodeId(5),
            NodeInfo {
                weight: 0,
                witness: true,
                ..NodeInfo::new(NodeId(5), "w")
            },
        );
        let v = VoterZones::of(&m, &ids(&[1, 2, 3]));
        assert_eq!(v.without, vec!["w".to_string()]);
        assert_eq!(v.crowded, vec!["z1".to_string()]);
        let v = VoterZones::of(&m, &ids(&[1, 3, 5]));
        assert!(v.fatal.is_empty() && v.crowded.is_empty(), "{v:?}");
        // Five voters 2 + 2 + 1: either datacenter may go.
        let v = VoterZones::of(&m, &ids(&[1, 2, 3, 4, 5]));
        assert!(v.fatal.is_empty(), "{v:?}");
    }

    #[test]
    fn test_down_voters_count_as_lost_already() {
        let mut m = map(&[(1, "z1"), (2, "z2"), (3, "z3")]);
        m.nodes.get_mut(&NodeId(1)).unwrap().state = NodeState::Down;
        let v = VoterZones::of(&m, &ids(&[1, 2, 3]));
        assert_eq!(v.up, 2);
        // With z1 gone, z2 or z3 is the last straw.
        assert_eq!(v.fatal, vec!["z2".to_string(), "z3".to_string()]);
        assert_eq!(
            v.risk(),
            "the loss of any one of zones z2, z3 would lose the majority"
        );
        m.nodes.get_mut(&NodeId(2)).unwrap().state = NodeState::Down;
        let v = VoterZones::of(&m, &ids(&[1, 2, 3]));
        assert!(v.fatal.is_empty());
        assert_eq!(v.risk(), "only 1 of the 3 voters are up: no majority");
        // A down node, and a draining one, may not vote: no zone lacks a voter for them.
        let mut m = map(&[(1, "z1"), (2, "z1"), (3, "z2"), (4, "z3")]);
        m.nodes.get_mut(&NodeId(4)).unwrap().weight = 0;
        let v = VoterZones::of(&m, &ids(&[1, 2, 3]));
        assert!(v.without.is_empty() && v.crowded.is_empty(), "{v:?}");
    }

    #[test]
    fn test_one_zone_is_not_a_zone_risk_and_unknown_voters_are_shown() {
        let m = map(&[(1, "z1"), (2, "z1"), (3, "z1")]);
        let v = VoterZones::of(&m, &ids(&[1, 2, 3]));
        assert!(v.fatal.is_empty());
        assert_eq!(
            v.risk(),
            "the voters share one zone: losing it stops the metadata"
        );
        let v = VoterZones::of(&m, &ids(&[1, 7]));
        assert_eq!(v.summary(), "2 voters in 2 zones: ? (7), z1 (1)");
        assert_eq!(v.up, 1);
    }
}
