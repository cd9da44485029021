//! The `voters` finding of `drove cluster health`: where the metadata voters sit in
//! the zones and what the loss of one zone would do to their majority. A pure
//! function of the cluster map and the voter ids ([`drove_types::VoterZones`] does
//! the counting), said only when the map has more than one zone (with one zone,
//! losing it loses the data too: nothing placement could change).
//!
//! - WARN for each zone whose loss alone would leave fewer than a majority of the
//!   voters up: `losing zone z1 would stop the metadata: it holds 2 of 3 voters`.
//!   Two datacenters alone always have one (a majority of an odd number of voters
//!   sits in one of them); a witness in a third zone takes it away.
//! - WARN for each zone with two voters or more while a zone with a node that may
//!   vote (a data node that is up and not draining, or a witness) has none: the
//!   leader moves such a vote within seconds, so a lasting warning means it cannot.
//! - Else one OK line: the voters by zone, and that any one zone may be lost.
use drove_types::{ClusterMap, NodeId, NodeState, VoterZones};

use crate::api::{HealthCheck, Level};

const CHECK: &str = "voters";

/// The findings of the voter placement of `voters` on `map` (none when `voters` is
/// empty, i.e. not known, or the map has fewer than two zones).
pub(crate) fn voters(map: &ClusterMap, voters: &[NodeId]) -> Vec<HealthCheck> {
    let mut zones: Vec<&str> = map.nodes.values().map(|n| n.zone.as_str()).collect();
    zones.sort_unstable();
    zones.dedup();
    if voters.is_empty() || zones.len() < 2 {
        return Vec::new();
    }
    let v = VoterZones::of(map, voters);
    let mut out = Vec::new();
    if v.up < v.majority() {
        out.push(warn(format!("{}: {}", v.summary(), v.risk())));
    }
    let down = v.voters - v.up;
    let already = match down {
        0 => String::new(),
        1 => " (1 other is down already)".to_string(),
        d => format!(" ({d} others are down already)"),
    };
    let data_zones = {
        let mut z: Vec<&str> = map
            .nodes
            .values()
            .filter(|n| !n.witness)
            .map(|n| n.zone.as_str())
            .collect();
        z.sort_unstable();
        z.dedup();
        z.len()
    };
    let witness = map.nodes.values().any(|n| n.witness);
    let hint = if data_zones == 2 && !witness {
        "; two zones cannot both be lost safely: add a witness in a third zone \
         (`drove node run --witness --zone Z3`), the majority then survives either"
    } else {
        ""
    };
    for zone in &v.fatal {
        let held = v.zones.get(zone).map_or(0, |ids| {
            ids.iter()
                .filter(|id| map.node(**id).is_some_and(|n| n.state == NodeState::Up))
                .count()
        });
        out.push(warn(format!(
            "losing zone {zone} would stop the metadata: it holds {held} of {} voters{already}{hint}",
            v.voters
        )));
    }
    for zone in &v.crowded {
        let held = v.zones.get(zone).map_or(0, Vec::len);
        out.push(warn(format!(
            "zone {zone} holds {held} of the {} voters while zone{} {} (with a node that may \
             vote) {} none: the metadata leader moves a vote there, so a lasting warning \
             means it cannot",
            v.voters,
            if v.without.len() == 1 { "" } else { "s" },
            v.without.join(", "),
            if v.without.len() == 1 {
                "holds"
            } else {
                "hold"
            },
        )));
    }
    if out.is_empty() {
        out.push(HealthCheck {
            level: Level::Ok,
            check: CHECK.to_string(),
            message: format!("{}: {}", v.summary(), v.risk()),
        });
    }
    out
}

fn warn(message: String) -> HealthCheck {
    HealthCheck {
        level: Level::Warn,
        check: CHECK.to_string(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::NodeInfo;

    /// `nodes` as (id, zone); a zone starting with `w` holds a witness.
    fn map(nodes: &[(u64, &str)]) -> ClusterMap {
        let mut m = ClusterMap::default();
        for &(id, zone) in nodes {
            let mut n = NodeInfo::new(NodeId(id), zone);
            if zone.starts_with('w') {
                n.witness = true;
                n.weight = 0;
            }
            m.nodes.insert(NodeId(id), n);
        }
        m
    }

    fn ids(v: &[u64]) -> Vec<NodeId> {
        v.iter().map(|&i| NodeId(i)).collect()
    }

    fn said(checks: &[HealthCheck]) -> Vec<(Level, &str)> {
        checks
            .iter()
            .map(|c| (c.level, c.message.as_str()))
            .collect()
    }

    #[test]
    fn test_two_datacenters_without_a_witness_warn_naming_the_zone_with_the_majority() {
        let m = map(&[(1, "z1"), (2, "z2"), (3, "z1"), (4, "z2")]);
        let c = voters(&m, &ids(&[1, 2, 3]));
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].level, Level::Warn);
        assert_eq!(c[0].check, "voters");
        assert!(
            c[0].message.starts_with(
                "losing zone z1 would stop the metadata: it holds 2 of 3 voters; two zones \
                 cannot both be lost safely: add a witness"
            ),
            "{c:?}"
        );
    }

    #[test]
    fn test_two_datacenters_and_a_witness_voting_one_each_are_ok() {
        let m = map(&[(1, "z1"), (2, "z2"), (3, "z1"), (4, "z2"), (5, "w3")]);
        let c = voters(&m, &ids(&[1, 2, 5]));
        assert_eq!(
            said(&c),
            [(
                Level::Ok,
                "3 voters in 3 zones: w3 (5), z1 (1), z2 (2): the loss of any one zone keeps \
                 a majority"
            )]
        );
        // The witness has joined and not yet taken its vote: z1 is crowded and fatal
        // (no hint: the witness is there).
        let c = voters(&m, &ids(&[1, 2, 3]));
        assert_eq!(
            said(&c),
            [
                (
                    Level::Warn,
                    "losing zone z1 would stop the metadata: it holds 2 of 3 voters"
                ),
                (
                    Level::Warn,
                    "zone z1 holds 2 of the 3 voters while zone w3 (with a node that may vote) \
                     holds none: the metadata leader moves a vote there, so a lasting warning \
                     means it cannot"
                )
            ]
        );
    }

    #[test]
    fn test_a_zone_lost_makes_each_survivor_the_last_straw_and_no_majority_is_said() {
        let mut m = map(&[(1, "z1"), (2, "z2"), (3, "z3"), (4, "z1")]);
        for id in [1, 4] {
            m.nodes.get_mut(&NodeId(id)).unwrap().state = NodeState::Down;
        }
        let c = voters(&m, &ids(&[1, 2, 3]));
        assert_eq!(
            said(&c),
            [
                (
                    Level::Warn,
                    "losing zone z2 would stop the metadata: it holds 1 of 3 voters (1 other is \
                     down already)"
                ),
                (
                    Level::Warn,
                    "losing zone z3 would stop the metadata: it holds 1 of 3 voters (1 other is \
                     down already)"
                )
            ]
        );
        m.nodes.get_mut(&NodeId(2)).unwrap().state = NodeState::Down;
        let c = voters(&m, &ids(&[1, 2, 3]));
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].level, Level::Warn);
        assert!(c[0]
            .message
            .ends_with("only 1 of the 3 voters are up: no majority"));
    }

    #[test]
    fn test_one_zone_or_no_known_voters_say_nothing() {
        let m = map(&[(1, "z1"), (2, "z1"), (3, "z1")]);
        assert!(voters(&m, &ids(&[1, 2, 3])).is_empty());
        let m = map(&[(1, "z1"), (2, "z2"), (3, "z3")]);
        assert!(voters(&m, &[]).is_empty());
        assert_eq!(voters(&m, &ids(&[1, 2, 3]))[0].level, Level::Ok);
    }
}
