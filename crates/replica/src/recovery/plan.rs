//! Recovery's decisions, as pure functions of the metadata's view and the
//! replicas' digests: which nodes hold an object at an epoch, which may have taken
//! writes since one, where objects would be with every node up (`noout`), whether a
//! disk is too full for background copies, and which copy to recover from. Nothing
//! here does I/O: the engine (recovery.rs) asks the network and the store, and
//! these decide.
use drove_placement::locate_vdi;
use drove_proto::ObjDigest;
use drove_types::{ClusterMap, Epoch, NodeId, NodeState, ObjectId, VdiId, VdiInfo};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What recovery needs from the metadata: the map, the VDIs and every past map.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The current map.
    pub map: Arc<ClusterMap>,
    /// Live VDIs by id (shared with the [`crate::Catalog`] of the same state).
    pub vdis: Arc<BTreeMap<VdiId, VdiInfo>>,
    /// The map of every epoch, oldest first (the epoch history).
    pub history: Arc<Vec<ClusterMap>>,
    /// The maintenance flag `noout`: copies this node holds only because some node
    /// is down are not copied in the background (see [`as_if_up`]).
    pub noout: bool,
    /// Background copying stops while this node's disk is this full or fuller
    /// (percent in use; 0: never). Ceph's backfillfull ratio.
    pub backfill_full_pct: u8,
}

/// Whether a disk `used_pct` percent full is too full for background copies under
/// a backfill-full setting of `limit_pct` (0: no limit).
pub(super) fn backfill_full(used_pct: f64, limit_pct: u8) -> bool {
    limit_pct > 0 && used_pct >= f64::from(limit_pct)
}

/// `map` with every down node up again: where objects would be if no node were
/// down. Under `noout`, a pending copy this node holds on `map` but not on this one
/// is there only because a node is down, and waits (a write to it still recovers
/// it first). Copies a returning or joining node catches up on are on both.
pub(super) fn as_if_up(map: &ClusterMap) -> ClusterMap {
    let mut m = map.clone();
    for n in m.nodes.values_mut() {
        n.state = NodeState::Up;
    }
    m
}

impl View {
    pub(super) fn holds(&self, map: &ClusterMap, node: NodeId, oid: ObjectId) -> bool {
        self.vdis
            .get(&oid.vdi)
            .is_some_and(|v| locate_vdi(map, v, oid).contains(&node))
    }

    /// Every node still in the map that `oid` was placed on at epoch `since` or
    /// later: the nodes that may have taken writes made at those epochs.
    pub(super) fn placed_since(&self, oid: ObjectId, since: Epoch) -> BTreeSet<NodeId> {
        let Some(v) = self.vdis.get(&oid.vdi) else {
            return BTreeSet::new();
        };
        self.history
            .iter()
            .filter(|m| m.epoch >= since)
            .chain(std::iter::once(&*self.map))
            .flat_map(|m| locate_vdi(m, v, oid))
            // A node removed from the map was declared gone: not waited for.
            .filter(|n| self.map.node(*n).is_some())
            .collect()
    }

    /// The maps of epochs after `after` up to the current one.
    pub(super) fn maps_after(&self, after: Epoch) -> Vec<&ClusterMap> {
        self.history.iter().filter(|m| m.epoch > after).collect()
    }

    /// The map at `epoch` (empty before the first epoch).
    pub(super) fn map_at(&self, epoch: Epoch) -> Option<&ClusterMap> {
        self.history.iter().find(|m| m.epoch == epoch)
    }
}

/// The copy of an object to recover from, and whether its holder must be asked to
/// send it although it does not know it to be current (`force`): a copy its holder
/// knows to be current, in the order given; else, nobody's copy being known
/// current, the one with the highest version (the last writer's, see
/// [`drove_types::ObjVersion`]), then the latest clean epoch, then the first in
/// order, `me` counted first. A copy's version is what it took; a node's clean epoch
/// only says it had caught up at some epoch, not that it held this object then (a
/// node alone in the map holds nothing and is clean at once), so it only breaks ties.
pub(super) fn pick_source(
    me: NodeId,
    mine: ObjDigest,
    others: &[(NodeId, ObjDigest)],
) -> Option<(NodeId, ObjDigest, bool)> {
    if let Some((n, d)) = others.iter().find(|(_, d)| d.current && !d.corrupt) {
        return Some((*n, *d, false));
    }
    let me = (me, mine);
    std::iter::once(&me)
        .chain(others.iter())
        .filter(|(_, d)| !d.corrupt && d.present)
        .rev()
        .max_by_key(|(_, d)| (d.version, d.clean_epoch))
        .map(|(n, d)| (*n, *d, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::ObjVersion;

    fn d(current: bool, version: (u64, u64), clean: u64, crc: u32) -> ObjDigest {
        ObjDigest {
            present: true,
            current,
            clean_epoch: Epoch(clean),
            crc,
            corrupt: false,
            version: ObjVersion {
                generation: version.0,
                epoch: version.1,
            },
        }
    }

    fn map(epoch: u64, nodes: &[(u64, NodeState)]) -> ClusterMap {
        let nodes = nodes
            .iter()
            .map(|&(id, state)| {
                let info = drove_types::NodeInfo {
                    state,
                    ..drove_types::NodeInfo::new(NodeId(id), format!("z{id}"))
                };
                (NodeId(id), info)
            })
            .collect();
        ClusterMap {
            epoch: Epoch(epoch),
            nodes,
        }
    }

    #[test]
    fn test_backfill_full_holds_back_at_and_past_the_limit() {
        assert!(!backfill_full(89.9, 90));
        assert!(backfill_full(90.0, 90));
        assert!(backfill_full(99.0, 90));
        assert!(!backfill_full(99.9, 100), "100 %: only a full disk");
        assert!(backfill_full(100.0, 100));
        assert!(!backfill_full(100.0, 0), "0: no limit");
        let half = drove_objstore::DiskSpace {
            size: 1000,
            free: 500,
        };
        assert_eq!(half.used_pct(), 50.0);
        let nothing = drove_objstore::DiskSpace { size: 0, free: 0 };
        assert_eq!(nothing.used_pct(), 100.0, "an empty disk has no room");
    }

    #[test]
    fn test_nodes_placed_since_an_epoch_are_waited_for_unless_removed() {
        use NodeState::{Down, Up};
        let oid = ObjectId::new(VdiId(7), 0);
        let vdi = VdiInfo {
            id: VdiId(7),
            name: "t".into(),
            size: 64 << 20,
            object_size: 4 << 20,
            copies: 2,
            mode: drove_types::ReplicationMode::Direct,
            created: 0,
            min_copies: None,
            parent: None,
            snapshot: false,
            ephemeral: false,
            home_zone: None,
            home_copies: None,
            policy: Default::default(),
            max_lag_ms: None,
            max_lag_bytes: None,
            nbd_clients: Vec::new(),
            past_homes: Vec::new(),
        };
        // Epoch 1: three nodes up. Epoch 2: the object's first holder goes down, so
        // the third node takes its place. Epoch 3: that holder is removed.
        let m1 = map(1, &[(1, Up), (2, Up), (3, Up)]);
        let first = drove_placement::locate(&m1, oid, 2);
        let third = NodeId(6 - first.iter().map(|n| n.0).sum::<u64>());
        let mut m2 = m1.clone();
        m2.epoch = Epoch(2);
        m2.nodes.get_mut(&first[0]).unwrap().state = Down;
        let mut m3 = m2.clone();
        m3.epoch = Epoch(3);
        m3.nodes.remove(&first[0]);
        let view = |maps: Vec<ClusterMap>| View {
            map: Arc::new(maps.last().unwrap().clone()),
            vdis: Arc::new(BTreeMap::from([(vdi.id, vdi.clone())])),
            history: Arc::new(maps),
            noout: false,
            backfill_full_pct: 90,
        };
        let v2 = view(vec![m1.clone(), m2.clone()]);
        let all: BTreeSet<NodeId> = [1, 2, 3].map(NodeId).into();
        assert_eq!(v2.placed_since(oid, Epoch(1)), all);
        // Since epoch 2 the first holder took no writes.
        let since2: BTreeSet<NodeId> = [first[1], third].into();
        assert_eq!(v2.placed_since(oid, Epoch(2)), since2);
        // Removed: not waited for, whatever the epoch.
        let v3 = view(vec![m1.clone(), m2.clone(), m3]);
        assert_eq!(v3.placed_since(oid, Epoch(1)), since2);

        // noout: the third node holds the object at epoch 2 only because its first
        // holder is down, so its copy waits; the other holder's copy does not.
        let up2 = as_if_up(&m2);
        assert_eq!(up2.nodes, m1.nodes);
        assert_eq!(up2.epoch, m2.epoch);
        assert!(v2.holds(&m2, third, oid) && !v2.holds(&up2, third, oid));
        assert!(v2.holds(&m2, first[1], oid) && v2.holds(&up2, first[1], oid));
        // The down node itself, back up, holds it again: its catch-up is not held back.
        assert!(v2.holds(&up2, first[0], oid));
    }

    #[test]
    fn test_the_last_writers_copy_wins_over_a_later_clean_epoch() {
        let (n1, n2, n3) = (NodeId(1), NodeId(2), NodeId(3));
        // The e2e_partition case: node 1 (a cut-off old gateway's node) holds a copy
        // of generation 1 and is clean at epoch 6, having held nothing then; nodes 2
        // and 3 took generation 2's writes at epoch 4. Nobody knows its copy current.
        let stale = d(false, (1, 2), 6, 0xAA);
        let newer = d(false, (2, 4), 4, 0xCC);
        let (src, got, force) = pick_source(n1, stale, &[(n2, newer), (n3, newer)]).unwrap();
        assert_eq!((src, got.crc, force), (n2, 0xCC, true));
        // Same generation: the later epoch wins.
        let old_epoch = d(false, (2, 3), 9, 0x11);
        let (src, ..) = pick_source(n1, newer, &[(n2, old_epoch)]).unwrap();
        assert_eq!(src, n1);
        // Equal versions: the later clean epoch, then the first in order (me first).
        let (src, ..) = pick_source(n1, newer, &[(n2, d(false, (2, 4), 5, 1))]).unwrap();
        assert_eq!(src, n2);
        let (src, ..) = pick_source(n1, newer, &[(n2, newer), (n3, newer)]).unwrap();
        assert_eq!(src, n1);
        // A copy known current wins whatever its version, unless it is corrupt;
        // corrupt and missing copies are never sources.
        let current = d(true, (1, 1), 1, 7);
        let (src, _, force) = pick_source(n1, newer, &[(n2, current)]).unwrap();
        assert_eq!((src, force), (n2, false));
        let mut bad = current;
        bad.corrupt = true;
        let mut gone = newer;
        gone.present = false;
        let (src, ..) = pick_source(n1, stale, &[(n2, bad), (n3, gone)]).unwrap();
        assert_eq!(src, n1);
        assert!(pick_source(n1, gone, &[(n2, bad)]).is_none());
    }
}
