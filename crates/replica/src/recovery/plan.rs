//! Recovery's decisions, as pure functions of the metadata's view and the
//! replicas' digests: which nodes hold an object at an epoch, which may have taken
//! writes since one, where objects would be with every node up (`noout`), whether a
//! disk is too full for background copies, and which copy to recover from. Nothing
//! here does I/O: the engine (recovery.rs) asks the network and the store, and
//! these decide.
use drove_placement::locate_vdi;
use drove_proto::ObjDigest;
use drove_types::{
    ClusterMap, Epoch, NodeId, NodeState, ObjVersion, ObjectId, VdiId, VdiInfo, WritePolicy,
};
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
    /// Whether node `n` is in the zone that was `vdi`'s home at epoch `at` (the
    /// copy recovery and settling prefer among copies of one version), for a
    /// zone-sync VDI. A sync VDI's copies do not lag by zone: a sync write is on
    /// every copy before it is acknowledged, so no copy of it counts as the home
    /// zone's. Counted, a home copy that a power loss had set back (pending, the
    /// same version, its unflushed writes gone) was preferred to a far copy known
    /// current and then replaced the others: three writes acknowledged durable
    /// were lost from every copy (`drove sim faults --seed 209`).
    pub(crate) fn in_home(&self, vdi: &VdiInfo, n: NodeId, at: Epoch) -> bool {
        if vdi.policy != WritePolicy::ZoneSync {
            return false;
        }
        let zone = self.map.node(n).map(|x| x.zone.as_str());
        vdi.home_at(at).is_some_and(|h| zone == Some(h))
    }

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

    /// Whether node `n` was placed on `oid` in every map from epoch `since` on (the
    /// history's maps, then the current one): for a sync VDI, or among the home
    /// copies of a zone-sync one, it took every write and flush acknowledged for
    /// the object since then (a far copy lags: never a proof of durability). A node
    /// marked down meanwhile did not, and missed the flushes acknowledged without
    /// it; after a site's power loss, its copy of the same version may lack a write
    /// they made durable. Only a tie-break: when the copies that hold such a write
    /// were also marked down once, or the object moved off them, none stayed, and
    /// the choice falls back to order (seed 9469's neighbours are not covered).
    pub(crate) fn placed_throughout(&self, oid: ObjectId, n: NodeId, since: Epoch) -> bool {
        let Some(v) = self.vdis.get(&oid.vdi) else {
            return false;
        };
        self.history
            .iter()
            .filter(|m| m.epoch >= since)
            .chain(std::iter::once(&*self.map))
            .all(|m| locate_vdi(m, v, oid).contains(&n))
    }

    /// The nodes recovery of `oid` still waits for, when no copy is known current
    /// and the best copy's last write was made at epoch `since`: for each map from
    /// `since` on, the nodes that took every write acknowledged under it (its
    /// witnesses), unless one of them has `answered`. A sync write is acknowledged
    /// once every node it is placed on has it (a failed one is marked down first
    /// and the write sent again on the new map), so any one of them answers for
    /// that epoch. A zone-sync write is acknowledged once the home zone's copies
    /// have it: only those answer for it, while that zone is still the VDI's home.
    /// Once the home has moved (`drove vdi promote` after losing the zone, or a
    /// move), the writes the old home had not shipped yet are given up, as the
    /// promotion states, and every copy answers for those epochs. A node removed
    /// from the map was declared gone and is not waited for. Asking every node
    /// placed since `since` instead made a sync VDI unwritable from the far zone
    /// after its home zone was lost (e2e_zonesync), where the far copies took every
    /// write.
    #[cfg(test)]
    pub(super) fn unvouched(
        &self,
        oid: ObjectId,
        since: Epoch,
        answered: &dyn Fn(NodeId) -> bool,
    ) -> BTreeSet<NodeId> {
        self.unvouched_by(oid, since, answered, answered, None)
    }

    /// [`View::unvouched`], telling two kinds of answer apart: `answered`, a
    /// witness that answered for its writes, and `sure`, one that also surely
    /// kept them (its host did not lose power since). A map is answered for by a
    /// sure witness, or by an unsure one when every other witness but `me` (this
    /// node, whose answer is all it will ever say) answered too: nothing better
    /// will come (after the whole site lost power every copy is unsure, `drove
    /// sim faults --seed 293`). Else the witnesses that did not answer are waited
    /// for (`--meta raft --seed 1546 --time 20s`: node 8, back from a power loss,
    /// answered for the writes that nodes 4 to 6, crashed with their page cache,
    /// held, and its copy replaced theirs).
    pub(super) fn unvouched_by(
        &self,
        oid: ObjectId,
        since: Epoch,
        answered: &dyn Fn(NodeId) -> bool,
        sure: &dyn Fn(NodeId) -> bool,
        me: Option<NodeId>,
    ) -> BTreeSet<NodeId> {
        let Some(v) = self.vdis.get(&oid.vdi) else {
            return BTreeSet::new();
        };
        let mut out = BTreeSet::new();
        let maps = self.history.iter().filter(|m| m.epoch >= since);
        for m in maps.chain(std::iter::once(&*self.map)) {
            let placed = locate_vdi(m, v, oid);
            let home = match v.policy {
                WritePolicy::ZoneSync if v.home_at(m.epoch) == v.home_zone.as_deref() => {
                    v.home_zone.as_deref()
                }
                _ => None,
            };
            let in_home = |n: &NodeId| home.is_none_or(|h| m.node(*n).is_some_and(|x| x.zone == h));
            let mut witnesses: Vec<NodeId> = placed.iter().copied().filter(in_home).collect();
            if witnesses.is_empty() {
                // No home copy up under this map: its writes went to every copy.
                witnesses = placed;
            }
            witnesses.retain(|n| self.map.node(*n).is_some());
            let vouched = witnesses.iter().any(|&n| answered(n) && sure(n))
                || (witnesses.iter().any(|&n| answered(n))
                    && witnesses.iter().all(|&n| Some(n) == me || answered(n)));
            if !vouched {
                out.extend(witnesses.into_iter().filter(|&n| !answered(n)));
            }
        }
        out
    }

    /// Whether `me`, which has no copy of `oid`, cannot vouch that there is
    /// nothing to have: a node that is down now (so its copy, if any, was never
    /// listed) held the object at an epoch at which `me` did not, or at which `me`
    /// had not yet been up since its last time down. A node up and placed beside it
    /// took every write it took: a write one of them missed was acknowledged only
    /// after that one was marked down.
    pub(super) fn absence_unsure(&self, me: NodeId, oid: ObjectId) -> bool {
        let Some(v) = self.vdis.get(&oid.vdi) else {
            return false;
        };
        let maps = || self.history.iter().chain(std::iter::once(&*self.map));
        let up = |m: &ClusterMap| m.node(me).is_some_and(|n| n.state == NodeState::Up);
        let last_down = maps().filter(|m| !up(m)).map(|m| m.epoch).max();
        let down_now =
            |n: NodeId| n != me && self.map.node(n).is_some_and(|x| x.state != NodeState::Up);
        maps().any(|m| {
            let placed = locate_vdi(m, v, oid);
            let beside = placed.contains(&me) && last_down.is_none_or(|d| m.epoch > d);
            !beside && placed.into_iter().any(down_now)
        })
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

/// What nodes say of their copies of an object, as recovery may use it: a node the
/// object is not placed on now (a holder of an earlier listing) no longer takes its
/// writes, so its copy is never known current, whatever its holder recorded, and a
/// copy missing there says nothing (it was dropped). Taken as current, such a
/// node's "missing" was chosen as the source again and again and refused each time
/// (`drove sim faults --seed 213 --faults cut --time 20s` never became clean).
pub(super) fn as_sources(
    placed: &[NodeId],
    digests: Vec<(NodeId, ObjDigest)>,
) -> Vec<(NodeId, ObjDigest)> {
    digests
        .into_iter()
        .filter_map(|(n, mut d)| {
            if placed.contains(&n) {
                return Some((n, d));
            }
            d.current = false;
            d.present.then_some((n, d))
        })
        .collect()
}

/// The copy of an object to recover from, and whether its holder must be asked to
/// send it although it does not know it to be current (`force`): a copy its holder
/// knows to be current, in the order given, unless it was outside the VDI's home
/// zone when it took its version's writes and a copy of the same or a later
/// version was in it (the latest such is taken, `me` first among equals: the far
/// copy became current while every home copy was down, short of the writes the
/// home zone had not shipped yet; taken, it overwrote them when the home zone came
/// back, `drove sim faults --seed 192 --time 40s` for a home copy of its version,
/// `--seed 272` for a later one, written just before a gateway cut off from the
/// home zone marked its nodes down); else, nobody's copy being known
/// current, the one with the highest version (the last writer's, see
/// [`drove_types::ObjVersion`]), then one `near` says was in the VDI's home zone
/// when it took that version's writes, then the latest clean epoch, then one
/// `stayed` says was placed on the object at every epoch since its version's
/// (a node marked down meanwhile missed the flushes acknowledged without it: after
/// the whole site lost power, its copy of the same version, short of a write they
/// made durable, was taken over one that held it, `drove sim faults --meta raft
/// --seed 9469 --time 20s`), then the first in order, `me` counted first. A version names the epoch and lock of a copy's
/// last write, not the write: copies of one version differ when a zone-sync write
/// reached the home zone and not yet the copy outside it, which lags and never
/// leads (`drove sim faults --seed 824 --time 40s`: the far copy, short of the
/// last writes, was chosen over the home copies of its version). A node's clean
/// epoch only says it had caught up at some epoch, not that it held this object
/// then (a node alone in the map holds nothing and is clean at once), so it only
/// breaks ties.
pub(crate) fn pick_source(
    me: NodeId,
    mine: ObjDigest,
    others: &[(NodeId, ObjDigest)],
    near: &dyn Fn(NodeId, Epoch) -> bool,
    stayed: &dyn Fn(NodeId, Epoch) -> bool,
) -> Option<(NodeId, ObjDigest, bool)> {
    let me = (me, mine);
    if let Some((n, d)) = others.iter().find(|(_, d)| d.current && !d.corrupt) {
        let at = Epoch(d.version.epoch);
        let home = std::iter::once(&me)
            .chain(others.iter())
            .filter(|(m, x)| {
                x.version >= d.version
                    && x.present
                    && !x.corrupt
                    && near(*m, Epoch(x.version.epoch))
            })
            .rev()
            .max_by_key(|(_, x)| x.version);
        return match home {
            Some((m, x)) if !near(*n, at) => Some((*m, *x, !x.current)),
            _ => Some((*n, *d, false)),
        };
    }
    std::iter::once(&me)
        .chain(others.iter())
        .filter(|(_, d)| !d.corrupt && d.present)
        .rev()
        .max_by_key(|(n, d)| {
            let at = Epoch(d.version.epoch);
            (d.version, near(*n, at), d.clean_epoch, stayed(*n, at))
        })
        .map(|(n, d)| (*n, *d, true))
}

/// Whether node `n`'s copy, digest `d`, answers for the writes of its epochs when
/// the best copy that answered is `best` (its node and version): whether the best
/// copy holds every write this one took. A readable copy does; a corrupt one of an
/// earlier version took none the best lacks. One of the same version takes none
/// either, except a zone-sync copy in the VDI's home zone when the best copy was
/// outside it: copies of one version differ there, the far one lagging
/// (`drove sim faults --seed 9420 --time 40s`: both home copies had a block flipped,
/// and the far copy, short of the last writes to another block, was vouched for
/// by them, made itself current and then replaced them).
pub(super) fn vouches(
    n: NodeId,
    d: &ObjDigest,
    best: Option<(NodeId, ObjVersion)>,
    zone_sync: bool,
    near: &dyn Fn(NodeId, Epoch) -> bool,
) -> bool {
    if !d.corrupt {
        return true;
    }
    let Some((b, v)) = best else {
        return false;
    };
    let at = Epoch(v.epoch);
    d.version < v || (d.version == v && !(zone_sync && near(n, at) && !near(b, at)))
}

/// The copies to take the rotten blocks of this node's copy (`mine`, which failed
/// its checksums) from, best first: copies of its version, whatever their own
/// state (a copy with a block flipped still holds the others whole), those in the
/// VDI's home zone when they took that version's writes first (a zone-sync copy
/// outside it lags), then those known current, then the rest in the order given.
/// None when a copy of a later version exists: this one is behind and is
/// recovered whole.
///
/// Replaced whole from a readable copy instead, a home copy with one block flipped
/// took the far copy's, short of the writes not yet shipped, when every home copy
/// had a block flipped (`drove sim faults --seed 9420 --time 40s`).
pub(super) fn mend_order(
    mine: &ObjDigest,
    others: &[(NodeId, ObjDigest)],
    near: &dyn Fn(NodeId, Epoch) -> bool,
) -> Vec<NodeId> {
    if !mine.present
        || others
            .iter()
            .any(|(_, d)| d.present && d.version > mine.version)
    {
        return Vec::new();
    }
    let at = Epoch(mine.version.epoch);
    let mut order: Vec<(NodeId, ObjDigest)> = others
        .iter()
        .filter(|(_, d)| d.present && d.version == mine.version)
        .copied()
        .collect();
    order.sort_by_key(|(n, d)| (!near(*n, at), !d.current));
    order.into_iter().map(|(n, _)| n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No copy counts as the home zone's.
    fn none(_: NodeId, _: Epoch) -> bool {
        false
    }

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
    fn test_of_copies_of_one_version_a_home_zone_one_is_taken_over_a_lagging_far_one() {
        let (n1, n2, n3) = (NodeId(1), NodeId(2), NodeId(3));
        let v = d(false, (1, 18), 20, 7);
        let far_v = d(false, (1, 18), 30, 8);
        let home = |n: NodeId, at: Epoch| n != n1 && at == Epoch(18);
        // n1, outside the home zone, has the later clean epoch and comes first.
        let (src, _, force) = pick_source(n1, far_v, &[(n2, v), (n3, v)], &home, &none).unwrap();
        assert!(src == n2 || src == n3, "{src}");
        assert!(force);
        // Without a home zone the clean epoch still decides.
        assert_eq!(
            pick_source(n1, far_v, &[(n2, v)], &none, &none).unwrap().0,
            n1
        );
        // A higher version outside the home zone still wins.
        let newer = d(false, (1, 19), 5, 9);
        assert_eq!(
            pick_source(n1, newer, &[(n2, v)], &home, &none).unwrap().0,
            n1
        );
        // A far copy known current (made so while the home zone was down) is passed
        // over for a home copy of its version, known current or not...
        let far_current = d(true, (1, 18), 30, 8);
        let (src, _, force) = pick_source(n2, v, &[(n1, far_current)], &home, &none).unwrap();
        assert_eq!((src, force), (n2, true));
        let (src, _, force) =
            pick_source(n3, v, &[(n1, far_current), (n2, v)], &home, &none).unwrap();
        assert_eq!((src, force), (n3, true));
        // ...nor for a later one, which the far copy lacks (seed 272)...
        let later = d(false, (1, 19), 20, 5);
        let home19 = |n: NodeId, at: Epoch| n != n1 && at >= Epoch(18);
        let (src, got, force) =
            pick_source(n2, later, &[(n1, far_current), (n3, later)], &home19, &none).unwrap();
        assert_eq!((src, got.version, force), (n2, later.version, true));
        let (src, got, _) =
            pick_source(n3, v, &[(n1, far_current), (n2, later)], &home19, &none).unwrap();
        assert_eq!(
            (src, got.version),
            (n2, later.version),
            "the latest home copy"
        );
        // ...but not for a home copy of an older version.
        let old = d(false, (1, 17), 30, 6);
        let (src, _, force) = pick_source(n2, old, &[(n1, far_current)], &home, &none).unwrap();
        assert_eq!((src, force), (n1, false));
    }

    #[test]
    fn test_a_node_the_object_moved_away_from_is_never_current_and_its_missing_copy_no_answer() {
        let (n1, n2, n3) = (NodeId(1), NodeId(2), NodeId(3));
        let newer = d(true, (2, 7), 5, 9);
        let older = d(false, (2, 4), 5, 1);
        let gone = ObjDigest {
            present: false,
            ..newer
        };
        let placed = [n1, n2];
        let ds = as_sources(&placed, vec![(n2, older), (n3, newer)]);
        assert_eq!(ds.len(), 2);
        assert!(!ds[1].1.current, "n3 holds an earlier placement's copy");
        // The highest version still wins, fetched by force.
        let (src, _, force) = pick_source(n1, older, &ds, &none, &none).unwrap();
        assert_eq!((src, force), (n3, true));
        // A placed node's copy known current goes first.
        let ds = as_sources(&placed, vec![(n3, newer), (n2, newer)]);
        assert_eq!(pick_source(n1, older, &ds, &none, &none).unwrap().0, n2);
        // A dropped copy on an unplaced node is no answer at all.
        let ds = as_sources(&placed, vec![(n3, gone)]);
        assert!(ds.is_empty());
        let ds = as_sources(&placed, vec![(n2, gone)]);
        assert_eq!(ds.len(), 1);
    }

    #[test]
    fn test_only_a_zone_sync_vdis_copies_count_as_the_home_zones() {
        use NodeState::Up;
        let m = map(3, &[(1, Up), (2, Up)]);
        let mut sync = vdi7();
        sync.home_zone = Some("z1".into());
        let mut zs = sync.clone();
        zs.policy = WritePolicy::ZoneSync;
        let v = view_of(&sync, vec![m.clone()]);
        assert!(
            !v.in_home(&sync, NodeId(1), Epoch(3)),
            "sync: every copy took every write"
        );
        let v = view_of(&zs, vec![m]);
        assert!(v.in_home(&zs, NodeId(1), Epoch(3)));
        assert!(!v.in_home(&zs, NodeId(2), Epoch(3)));
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

    /// VDI 7: 64 MiB of 4 MiB objects, two copies.
    fn vdi7() -> VdiInfo {
        VdiInfo::new(VdiId(7), "t", 64 << 20, 4 << 20, 2)
    }

    fn view_of(vdi: &VdiInfo, maps: Vec<ClusterMap>) -> View {
        View {
            map: Arc::new(maps.last().unwrap().clone()),
            vdis: Arc::new(BTreeMap::from([(vdi.id, vdi.clone())])),
            history: Arc::new(maps),
            noout: false,
            backfill_full_pct: 90,
        }
    }

    #[test]
    fn test_a_missing_copy_is_vouched_for_only_by_a_node_up_and_placed_beside_every_down_holder() {
        use NodeState::{Down, Up};
        let vdi = vdi7();
        let oid = ObjectId::new(VdiId(7), 0);
        // Epoch 1: four nodes up; the object on two of them (a, b).
        let m1 = map(1, &[(1, Up), (2, Up), (3, Up), (4, Up)]);
        let ab = drove_placement::locate(&m1, oid, 2);
        let (a, b) = (ab[0], ab[1]);
        let others: Vec<NodeId> = (1..=4).map(NodeId).filter(|n| !ab.contains(n)).collect();
        // Epoch 2: a goes down (its write failed, say): b was beside it all along.
        let mut m2 = m1.clone();
        m2.epoch = Epoch(2);
        m2.nodes.get_mut(&a).unwrap().state = Down;
        let v2 = view_of(&vdi, vec![m1.clone(), m2.clone()]);
        assert!(!v2.absence_unsure(b, oid), "b took every write a took");
        // The node that gained the object at epoch 2 was not beside a.
        let gained = *drove_placement::locate(&m2, oid, 2)
            .iter()
            .find(|n| **n != b)
            .unwrap();
        assert!(others.contains(&gained));
        assert!(v2.absence_unsure(gained, oid));
        // Epoch 3: b goes down as well; epoch 4: b is back. b was down since it
        // stood beside a, so it no longer vouches (it may have missed a's writes).
        let mut m3 = m2.clone();
        m3.epoch = Epoch(3);
        m3.nodes.get_mut(&b).unwrap().state = Down;
        let mut m4 = m3.clone();
        m4.epoch = Epoch(4);
        m4.nodes.get_mut(&b).unwrap().state = Up;
        let v4 = view_of(&vdi, vec![m1.clone(), m2.clone(), m3, m4]);
        assert!(v4.absence_unsure(b, oid));
        // Nobody down: nothing unheard of.
        let v1 = view_of(&vdi, vec![m1]);
        assert!(!v1.absence_unsure(others[0], oid));
    }

    #[test]
    fn test_an_epoch_is_vouched_for_by_one_node_that_took_all_its_writes() {
        use NodeState::{Down, Up};
        // Two zones: z1 = {1, 3}, z2 = {2, 4}. Epoch 1: all up. Epoch 2: z2 is down.
        let zoned = |epoch: u64, z2: NodeState| {
            let mut m = map(epoch, &[(1, Up), (2, z2), (3, Up), (4, z2)]);
            for (id, n) in m.nodes.iter_mut() {
                n.zone = if id.0 % 2 == 1 { "z1" } else { "z2" }.into();
            }
            m
        };
        let (m1, m2) = (zoned(1, Up), zoned(2, Down));
        let far = |n: NodeId| n.0 % 2 == 1;
        let nobody = |_: NodeId| false;
        let oid = ObjectId::new(VdiId(7), 3);
        let mut sync = vdi7();
        sync.copies = 3;
        sync.home_zone = Some("z2".into());
        let v = view_of(&sync, vec![m1.clone(), m2.clone()]);
        // Sync: every copy took every write, so the far zone's answers do.
        assert!(v.unvouched(oid, Epoch(0), &far).is_empty());
        let all: BTreeSet<NodeId> = [&m1, &m2]
            .into_iter()
            .flat_map(|m| locate_vdi(m, &sync, oid))
            .collect();
        assert_eq!(v.unvouched(oid, Epoch(0), &nobody), all);
        // Zone-sync: only the home copies took every write of epoch 1.
        let mut zs = sync.clone();
        zs.policy = WritePolicy::ZoneSync;
        let v = view_of(&zs, vec![m1.clone(), m2.clone()]);
        let home: BTreeSet<NodeId> = [NodeId(2), NodeId(4)].into();
        assert_eq!(v.unvouched(oid, Epoch(0), &far), home);
        // ...unless the version answered is from epoch 2, when no home copy was up.
        assert!(v.unvouched(oid, Epoch(2), &far).is_empty());
        // Promoted to z1 from epoch 3 on: the old home's unshipped writes are given up.
        zs.home_zone = Some("z1".into());
        zs.past_homes = vec![drove_types::PastHome {
            zone: Some("z2".into()),
            until: Epoch(3),
        }];
        let v = view_of(&zs, vec![m1.clone(), m2.clone(), zoned(3, Down)]);
        assert!(v.unvouched(oid, Epoch(0), &far).is_empty());
        // Nodes removed from the map are not waited for.
        let mut m3 = zoned(3, Down);
        m3.nodes.retain(|id, _| far(*id));
        let v = view_of(&sync, vec![m1, m2, m3]);
        assert!(v.unvouched(oid, Epoch(0), &nobody).iter().all(|&n| far(n)));
    }

    /// An unsure answer (a copy whose host lost power, or a new disk's) answers
    /// for an epoch only when every other witness but this node answered too.
    #[test]
    fn test_an_unsure_answer_counts_only_when_every_other_witness_answered() {
        use NodeState::Up;
        let m1 = map(1, &[(1, Up), (2, Up), (3, Up), (4, Up)]);
        let oid = ObjectId::new(VdiId(7), 3);
        let mut sync = vdi7();
        sync.copies = 3;
        let v = view_of(&sync, vec![m1.clone()]);
        let w: Vec<NodeId> = locate_vdi(&m1, &sync, oid);
        let (a, b, c) = (w[0], w[1], w[2]);
        let only = |set: Vec<NodeId>| move |n: NodeId| set.contains(&n);
        // `a` answered unsure, `b` and `c` did not: both waited for.
        let waited = v.unvouched_by(oid, Epoch(0), &only(vec![a]), &only(vec![]), None);
        assert_eq!(waited, [b, c].into());
        // The same, seen from `b`, which has no better answer of its own: `c`.
        let waited = v.unvouched_by(oid, Epoch(0), &only(vec![a]), &only(vec![]), Some(b));
        assert_eq!(
            waited,
            [b, c].into(),
            "b did not answer for itself: waited for"
        );
        let waited = v.unvouched_by(oid, Epoch(0), &only(vec![a, b]), &only(vec![]), Some(b));
        assert_eq!(waited, [c].into());
        // Every witness answered, all unsure (a site power loss): nothing better.
        let all = only(vec![a, b, c]);
        assert!(v
            .unvouched_by(oid, Epoch(0), &all, &only(vec![]), None)
            .is_empty());
        // Every other witness answered and this one did not (its copy rotten):
        // the unsure answers are all there will be.
        let waited = v.unvouched_by(oid, Epoch(0), &only(vec![a, b]), &only(vec![]), Some(c));
        assert!(waited.is_empty());
        // One sure answer is enough.
        let waited = v.unvouched_by(oid, Epoch(0), &only(vec![a]), &only(vec![a]), None);
        assert!(waited.is_empty());
        // Nobody answered: every witness waited for, this node included.
        let waited = v.unvouched_by(oid, Epoch(0), &only(vec![]), &only(vec![]), Some(c));
        assert_eq!(waited, [a, b, c].into());
    }

    #[test]
    fn test_nodes_placed_since_an_epoch_are_waited_for_unless_removed() {
        use NodeState::{Down, Up};
        let oid = ObjectId::new(VdiId(7), 0);
        let vdi = vdi7();
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
        let view = |maps: Vec<ClusterMap>| view_of(&vdi, maps);
        let v2 = view(vec![m1.clone(), m2.clone()]);
        let all: BTreeSet<NodeId> = [1, 2, 3].map(NodeId).into();
        assert_eq!(v2.placed_since(oid, Epoch(1)), all);
        // Since epoch 2 the first holder took no writes.
        let since2: BTreeSet<NodeId> = [first[1], third].into();
        assert_eq!(v2.placed_since(oid, Epoch(2)), since2);
        // Removed: not waited for, whatever the epoch.
        let v3 = view(vec![m1.clone(), m2.clone(), m3]);
        assert_eq!(v3.placed_since(oid, Epoch(1)), since2);
        // Placed at every epoch since: the other holder from epoch 1, the third
        // node from epoch 2 only, the first holder not after epoch 1.
        assert!(v2.placed_throughout(oid, first[1], Epoch(1)));
        assert!(!v2.placed_throughout(oid, third, Epoch(1)));
        assert!(v2.placed_throughout(oid, third, Epoch(2)));
        assert!(!v2.placed_throughout(oid, first[0], Epoch(1)));

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
        let (src, got, force) =
            pick_source(n1, stale, &[(n2, newer), (n3, newer)], &none, &none).unwrap();
        assert_eq!((src, got.crc, force), (n2, 0xCC, true));
        // Same generation: the later epoch wins.
        let old_epoch = d(false, (2, 3), 9, 0x11);
        let (src, ..) = pick_source(n1, newer, &[(n2, old_epoch)], &none, &none).unwrap();
        assert_eq!(src, n1);
        // Equal versions: the later clean epoch, then the first in order (me first).
        let (src, ..) =
            pick_source(n1, newer, &[(n2, d(false, (2, 4), 5, 1))], &none, &none).unwrap();
        assert_eq!(src, n2);
        let (src, ..) = pick_source(n1, newer, &[(n2, newer), (n3, newer)], &none, &none).unwrap();
        assert_eq!(src, n1);
        // Equal versions and clean epochs (a whole site's power loss): one placed at
        // every epoch since, over a node marked down meanwhile (seed 9469); the
        // clean epoch still comes first.
        let stayed = |n: NodeId, _: Epoch| n == n3;
        let (src, ..) =
            pick_source(n1, newer, &[(n2, newer), (n3, newer)], &none, &stayed).unwrap();
        assert_eq!(src, n3);
        let later = d(false, (2, 4), 5, 1);
        let (src, ..) =
            pick_source(n1, newer, &[(n2, later), (n3, newer)], &none, &stayed).unwrap();
        assert_eq!(src, n2);
        // A copy known current wins whatever its version, unless it is corrupt;
        // corrupt and missing copies are never sources.
        let current = d(true, (1, 1), 1, 7);
        let (src, _, force) = pick_source(n1, newer, &[(n2, current)], &none, &none).unwrap();
        assert_eq!((src, force), (n2, false));
        let mut bad = current;
        bad.corrupt = true;
        let mut gone = newer;
        gone.present = false;
        let (src, ..) = pick_source(n1, stale, &[(n2, bad), (n3, gone)], &none, &none).unwrap();
        assert_eq!(src, n1);
        assert!(pick_source(n1, gone, &[(n2, bad)], &none, &none).is_none());
    }

    #[test]
    fn test_a_flipped_home_copy_of_the_far_copys_version_does_not_vouch_for_it() {
        let (home1, far) = (NodeId(8), NodeId(4));
        let near = |n: NodeId, _: Epoch| n != far;
        let v = ObjVersion {
            generation: 1,
            epoch: 15,
        };
        let mut flipped = d(true, (1, 15), 40, 0);
        flipped.corrupt = true;
        // The far copy is the best readable one: a flipped home copy of its version
        // may hold writes it lacks (zone-sync only).
        assert!(!vouches(home1, &flipped, Some((far, v)), true, &near));
        assert!(vouches(home1, &flipped, Some((far, v)), false, &near));
        // A home copy as the best: one of its version took nothing it lacks.
        assert!(vouches(NodeId(7), &flipped, Some((home1, v)), true, &near));
        // An earlier version vouches; a later one never; a readable copy always.
        let later = ObjVersion {
            generation: 1,
            epoch: 16,
        };
        assert!(vouches(home1, &flipped, Some((far, later)), true, &near));
        let mut newer = flipped;
        newer.version = later;
        assert!(!vouches(home1, &newer, Some((home1, v)), true, &near));
        assert!(!vouches(home1, &flipped, None, true, &near));
        assert!(vouches(
            far,
            &d(false, (1, 15), 15, 9),
            Some((far, v)),
            true,
            &near
        ));
    }

    #[test]
    fn test_rotten_blocks_are_taken_from_home_copies_of_the_same_version_first() {
        let (me, far, home, other) = (NodeId(8), NodeId(4), NodeId(7), NodeId(5));
        let near = |n: NodeId, _: Epoch| n == me || n == home;
        let mut mine = d(true, (1, 15), 40, 0);
        mine.corrupt = true;
        let mut flipped_home = d(true, (1, 15), 40, 0);
        flipped_home.corrupt = true;
        let far_copy = d(true, (1, 15), 40, 0xAB);
        let older = d(false, (1, 9), 9, 0xCD);
        let mut gone = far_copy;
        gone.present = false;
        let got = mend_order(
            &mine,
            &[
                (far, far_copy),
                (other, older),
                (home, flipped_home),
                (NodeId(6), gone),
            ],
            &near,
        );
        assert_eq!(got, vec![home, far], "the home copy first, even flipped");
        // A later version anywhere: mine is behind, recovered whole.
        let newer = d(false, (1, 16), 16, 1);
        assert!(mend_order(&mine, &[(home, flipped_home), (other, newer)], &near).is_empty());
    }
}
