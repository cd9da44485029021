//! The gateway's placement cache: where each object's replicas are on the current
//! map, worked out once per map rather than on every request. Placing an object
//! ranks every node of the map (a hash and a logarithm each), and a gateway asked
//! that for every read and write spent 27 % of `drove sim paper --parallel 44` at 88
//! nodes doing it again for the same objects.
//!
//! A cached answer is exactly [`drove_placement::locate_vdi`]'s: it is kept only
//! for the map the cell holds (the same allocation, held here so that it cannot be
//! reused for another map), and for the VDI's copies and home on that map. A map
//! that is not the cell's current one is placed directly.
use drove_placement::{locate_home, Home};
use drove_types::{ClusterMap, NodeId, ObjectId, VdiInfo};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;

use crate::mapcell::MapCell;

/// Objects remembered at most; the cache starts over when it is full.
const CAPACITY: usize = 1 << 16;

/// One object's replicas for one set of placement inputs.
struct Placed {
    copies: usize,
    home: Option<(String, usize)>,
    nodes: Arc<[NodeId]>,
}

#[derive(Default)]
struct Inner {
    /// The map the entries are for.
    map: Option<Arc<ClusterMap>>,
    by_oid: HashMap<ObjectId, Vec<Placed>>,
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct PlaceCache(RwLock<Inner>);

fn same_home(a: &Option<(String, usize)>, b: Option<&Home<'_>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some((zone, copies)), Some(h)) => zone == h.zone && *copies == h.copies,
        _ => false,
    }
}

impl PlaceCache {
    /// The replicas of `oid` of `vdi` on `map`: [`drove_placement::locate_vdi`].
    pub(crate) fn locate(
        &self,
        cell: &MapCell,
        map: &ClusterMap,
        vdi: &VdiInfo,
        oid: ObjectId,
    ) -> Vec<NodeId> {
        let copies = usize::from(vdi.copies);
        let home = Home::at(vdi, map.epoch);
        {
            let inner = self.0.read();
            if inner.map.as_deref().is_some_and(|m| std::ptr::eq(m, map)) {
                let hit = inner.by_oid.get(&oid).and_then(|v| {
                    v.iter()
                        .find(|p| p.copies == copies && same_home(&p.home, home.as_ref()))
                });
                if let Some(p) = hit {
                    return p.nodes.to_vec();
                }
            }
        }
        let nodes = locate_home(map, oid, copies, home);
        let mut inner = self.0.write();
        if !inner.map.as_deref().is_some_and(|m| std::ptr::eq(m, map)) {
            let current = cell.get();
            if !std::ptr::eq(&*current, map) {
                // An older (or another) map: placed, not remembered.
                return nodes;
            }
            inner.map = Some(current);
            inner.by_oid.clear();
        }
        if inner.by_oid.len() >= CAPACITY {
            inner.by_oid.clear();
        }
        inner.by_oid.entry(oid).or_default().push(Placed {
            copies,
            home: home.map(|h| (h.zone.to_string(), h.copies)),
            nodes: nodes.as_slice().into(),
        });
        nodes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_placement::locate_vdi;
    use drove_types::{Epoch, NodeInfo, NodeState, VdiId};

    fn map(epoch: u64, zones: usize, per_zone: usize) -> ClusterMap {
        let mut m = ClusterMap {
            epoch: Epoch(epoch),
            ..Default::default()
        };
        for z in 0..zones {
            for i in 0..per_zone {
                let id = NodeId((z * per_zone + i + 1) as u64);
                let n = NodeInfo {
                    weight: 100,
                    ..NodeInfo::new(id, format!("z{}", z + 1))
                };
                m.nodes.insert(id, n);
            }
        }
        m
    }

    fn vdi(id: u32, copies: u8, home: Option<&str>) -> VdiInfo {
        VdiInfo {
            home_zone: home.map(str::to_string),
            policy: drove_types::WritePolicy::ZoneSync,
            ..VdiInfo::new(VdiId(id), format!("v{id}"), 1 << 30, 4 << 20, copies)
        }
    }

    #[test]
    fn test_cached_placements_are_locate_vdi_for_every_map_and_home() {
        let cell = MapCell::new(map(5, 4, 22));
        let cache = PlaceCache::default();
        let vdis = [
            vdi(1, 3, None),
            vdi(2, 3, Some("z2")),
            vdi(3, 2, Some("z4")),
        ];
        for round in 0..2 {
            let m = cell.get();
            for v in &vdis {
                for i in 0..200 {
                    let oid = ObjectId::new(v.id, i);
                    assert_eq!(
                        cache.locate(&cell, &m, v, oid),
                        locate_vdi(&m, v, oid),
                        "round {round}, {oid}"
                    );
                }
            }
        }
        // A VDI whose home moves, on the same map: placed for its new home.
        let mut moved = vdis[1].clone();
        moved.home_zone = Some("z3".into());
        let m = cell.get();
        let oid = ObjectId::new(moved.id, 7);
        assert_eq!(
            cache.locate(&cell, &m, &moved, oid),
            locate_vdi(&m, &moved, oid)
        );
        assert_eq!(
            cache.locate(&cell, &m, &vdis[1], oid),
            locate_vdi(&m, &vdis[1], oid)
        );
        // A new map with a node down: nothing of the old one is served.
        let mut next = map(6, 4, 22);
        let first = locate_vdi(&m, &vdis[0], ObjectId::new(vdis[0].id, 0))[0];
        next.nodes.get_mut(&first).unwrap().state = NodeState::Down;
        cell.set(Arc::new(next));
        let m2 = cell.get();
        for i in 0..200 {
            let oid = ObjectId::new(vdis[0].id, i);
            let got = cache.locate(&cell, &m2, &vdis[0], oid);
            assert_eq!(got, locate_vdi(&m2, &vdis[0], oid));
            assert!(!got.contains(&first));
        }
        // The old map, still held by a request in flight, is placed directly.
        let oid = ObjectId::new(vdis[0].id, 0);
        assert_eq!(
            cache.locate(&cell, &m, &vdis[0], oid),
            locate_vdi(&m, &vdis[0], oid)
        );
        assert!(cache.locate(&cell, &m, &vdis[0], oid).contains(&first));
    }
}
