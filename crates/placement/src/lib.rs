//! Placement, layer 3 of the data path: which nodes hold the replicas of an object.
//!
//! ```text
//! volume::map (byte range -> objects) -> placement::locate (object -> nodes) -> replica::gateway
//! ```
//!
//! [`locate`] is a pure function of the cluster map, the object id and the number of
//! copies: no I/O, no clock, no randomness. Every node computes it on its own and all
//! agree, so the map epoch alone says where data lives.
//!
//! # How
//!
//! Weighted rendezvous (highest random weight) hashing. Each eligible node (state
//! [`NodeState::Up`], weight > 0, not a witness) gets a score `weight / -ln(h)` where `h` in (0, 1)
//! is a stable hash of (node id, object id) — see `hash.rs`. The nodes are ranked by
//! score (ties by node id) and replicas are picked from that ranking:
//!
//! 1. walk the ranking and take each node whose zone is not used yet, until there
//!    are `copies` replicas: replicas sit in distinct zones whenever there are at
//!    least `copies` zones;
//! 2. if zones ran out, walk the ranking again and take the highest nodes not taken,
//!    so zones repeat but nodes never do.
//!
//! The first replica is the highest-scoring node overall: the primary.
//!
//! # Why rendezvous
//!
//! Shares follow weights without virtual nodes, and the result for an object only
//! depends on the relative order of scores, each of which depends on one node alone.
//! So adding a node changes an object's replicas only if the new node is among them
//! (it replaces one node), and removing a node changes only the objects it held:
//! movement is the minimum the new shares require (about 1/N of the data for one of
//! N equal nodes). The tests check this.
//!
//! One known cost of the zone rule: a zone competes with the summed weight of its
//! nodes, and picking `copies` zones best-first favours light zones. A node that joins
//! alone in a new zone with copies 3 therefore takes more than its weight's share (at
//! 3 equal zones of 2 nodes each, about 18 % of the slots instead of 1/7 = 14 %), and
//! with fewer zones than copies a new zone must take one replica of every object.
#![deny(missing_docs)]

mod hash;
#[cfg(test)]
mod tests;

use drove_types::{ClusterMap, NodeId, NodeInfo, NodeState, ObjectId, VdiInfo};

/// Copies kept in the home zone when a VDI does not say.
pub const DEFAULT_HOME_COPIES: usize = 2;

/// A VDI's home zone and how many of its copies it wants there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Home<'a> {
    /// The zone.
    pub zone: &'a str,
    /// Copies wanted there (fewer if the zone has fewer eligible nodes).
    pub copies: usize,
}

impl<'a> Home<'a> {
    /// The home of `vdi` today, if it has one.
    pub fn of(vdi: &'a VdiInfo) -> Option<Home<'a>> {
        Self::zoned(vdi, vdi.home_zone.as_deref())
    }

    /// The home of `vdi` on the map of `epoch` (see [`VdiInfo::home_at`]).
    pub fn at(vdi: &'a VdiInfo, epoch: drove_types::Epoch) -> Option<Home<'a>> {
        Self::zoned(vdi, vdi.home_at(epoch))
    }

    fn zoned(vdi: &'a VdiInfo, zone: Option<&'a str>) -> Option<Home<'a>> {
        zone.map(|zone| Home {
            zone,
            copies: vdi
                .home_copies
                .map_or(DEFAULT_HOME_COPIES, usize::from)
                .min(usize::from(vdi.copies)),
        })
    }
}

/// The replicas of object `oid` of `vdi`: [`locate_home`] with the VDI's copies and
/// the home zone it had at `map`'s epoch. Every caller that has the VDI's record
/// places through this.
pub fn locate_vdi(map: &ClusterMap, vdi: &VdiInfo, oid: ObjectId) -> Vec<NodeId> {
    locate_home(map, oid, usize::from(vdi.copies), Home::at(vdi, map.epoch))
}

/// Where `oid` was placed on `map` under the home `vdi` had before its current one
/// (empty if its home never moved): the copies a move to a new home copies from,
/// still read while the new holders catch up.
pub fn locate_before_move(map: &ClusterMap, vdi: &VdiInfo, oid: ObjectId) -> Vec<NodeId> {
    match vdi.previous_home() {
        Some(p) => locate_home(
            map,
            oid,
            usize::from(vdi.copies),
            Home::zoned(vdi, p.zone.as_deref()),
        ),
        None => Vec::new(),
    }
}

/// Whether `node` holds one of the replicas of object `oid` of `vdi`.
pub fn is_holder_vdi(map: &ClusterMap, vdi: &VdiInfo, oid: ObjectId, node: NodeId) -> bool {
    locate_vdi(map, vdi, oid).contains(&node)
}

/// Ordered replica nodes for `oid`: first is the "primary". Returns min(copies, up nodes) ids, distinct.
///
/// "Up nodes" are the nodes that may hold data: state [`NodeState::Up`], weight
/// greater than zero and not a witness. Replicas are in distinct zones when the up nodes span at least
/// `copies` zones (see the crate doc for the exact rule). An empty map or
/// `copies == 0` gives an empty list.
pub fn locate(map: &ClusterMap, oid: ObjectId, copies: usize) -> Vec<NodeId> {
    locate_home(map, oid, copies, None)
}

/// [`locate`] for an object whose VDI has a home zone: the best `home.copies` nodes of
/// that zone first (fewer if it has fewer up nodes; the first of them is the primary),
/// then one node per other zone, best zones first, then the best nodes left outside
/// the home zone, then any left. Without a home, exactly [`locate`].
///
/// Moves on a join: every step walks one fixed ranking and a node is skipped or taken
/// by its own zone and rank alone, so a joining node that is not picked leaves every
/// step as it was; one that is picked takes one slot, pushing out at most one node.
/// An object's replicas therefore change only when the new node is among them, and
/// then by one node (property-tested below for maps with and without home zones).
pub fn locate_home(
    map: &ClusterMap,
    oid: ObjectId,
    copies: usize,
    home: Option<Home<'_>>,
) -> Vec<NodeId> {
    let mut ranked = scored(map, oid);
    let want = copies.min(ranked.len());
    // The passes walk the ranking from the top and nearly always end within its
    // first few nodes: order only a prefix (the order is total, so the prefix is
    // exactly the full ranking's), and the whole list when they walk past it.
    if ranked.len() > RANK_PREFIX {
        ranked.select_nth_unstable_by(RANK_PREFIX - 1, by_rank);
        ranked[..RANK_PREFIX].sort_by(by_rank);
        if let Some(picked) = pick(&ranked[..RANK_PREFIX], want, home, true) {
            return picked;
        }
    }
    ranked.sort_by(by_rank);
    pick(&ranked, want, home, false).expect("the whole ranking always gives an answer")
}

/// Every node that may hold data (up, weight above zero, not a witness) with its
/// score for `oid`, in no order.
fn scored(map: &ClusterMap, oid: ObjectId) -> Vec<(f64, &NodeInfo)> {
    let key = oid.as_u64();
    map.nodes
        .values()
        .filter(|n| n.state == NodeState::Up && n.weight > 0 && !n.witness)
        .map(|n| (hash::score(n.id.0, n.weight, key), n))
        .collect()
}

/// The ranking's order: highest score first; equal scores (astronomically rare) by
/// ascending id so the order is total and the same everywhere.
fn by_rank(a: &(f64, &NodeInfo), b: &(f64, &NodeInfo)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.id.cmp(&b.1.id))
}

/// How many of the best-ranked nodes [`locate_home`] orders before it needs them all.
const RANK_PREFIX: usize = 24;

/// The passes of [`locate_home`] over `ranked` (best first). With `prefix`, `ranked`
/// is only the top of the ranking: `None` when a pass would have walked past it,
/// since the nodes after it might then change the answer.
fn pick(
    ranked: &[(f64, &NodeInfo)],
    want: usize,
    home: Option<Home<'_>>,
    prefix: bool,
) -> Option<Vec<NodeId>> {
    let mut picked: Vec<NodeId> = Vec::with_capacity(want);
    let mut taken = vec![false; ranked.len()];
    let mut zones: Vec<&str> = Vec::with_capacity(want);

    // Pass 0: the home zone's share, its best nodes first.
    if let Some(home) = home {
        let quota = home.copies.min(want);
        for (i, (_, node)) in ranked.iter().enumerate() {
            if picked.len() == quota {
                break;
            }
            if node.zone == home.zone {
                picked.push(node.id);
                taken[i] = true;
            }
        }
        if prefix && picked.len() < quota {
            return None;
        }
        zones.push(home.zone);
    }
    // Pass 1: at most one replica per zone, best first.
    for (i, (_, node)) in ranked.iter().enumerate() {
        if picked.len() == want {
            break;
        }
        if !zones.contains(&node.zone.as_str()) {
            zones.push(node.zone.as_str());
            picked.push(node.id);
            taken[i] = true;
        }
    }
    if prefix && picked.len() < want {
        return None;
    }
    // Pass 2: fewer zones than copies; fill with the best nodes not yet taken, those
    // outside the home zone first (it has its share).
    let home_zone = home.map(|h| h.zone);
    for outside_first in [true, false] {
        for (i, (_, node)) in ranked.iter().enumerate() {
            if picked.len() == want {
                break;
            }
            let skip = outside_first && Some(node.zone.as_str()) == home_zone;
            if !taken[i] && !skip {
                picked.push(node.id);
                taken[i] = true;
            }
        }
    }
    Some(picked)
}

/// Whether `node` holds one of the `copies` replicas of `oid` under `map`.
pub fn is_holder(map: &ClusterMap, oid: ObjectId, copies: usize, node: NodeId) -> bool {
    locate(map, oid, copies).contains(&node)
}
