//! Keeps the data path in step with the metadata: every applied change swaps in the
//! new cluster map, updates open volumes (resize) and deletes the local objects of
//! VDIs that were deleted. The data path itself never waits on Raft.
//!
//! Deleting objects means listing every object this node stores, so it is done when
//! a VDI left the table, not at every change (a lock taken anywhere in the cluster
//! used to make every node list its whole store), and every [`SWEEP_EVERY`]: a write
//! admitted just before its VDI's delete may land after the sweep that followed it.
use drove_meta::{Meta, MetaState};
use drove_replica::{Catalog, LocalStore, MapCell, Recoverer, View};
use drove_types::{VdiId, VdiInfo};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::exports::VdiExports;

/// Follow the metadata until it shuts down, or until it says this node was removed
/// from the cluster: then `removed` fires and following ends.
pub async fn follow(
    meta: Arc<Meta>,
    map: Arc<MapCell>,
    exports: Arc<VdiExports>,
    local: Arc<LocalStore>,
    recoverer: Arc<Recoverer>,
    removed: Arc<tokio::sync::Notify>,
) {
    follow_with(meta, map, Some(exports), local, recoverer, removed).await;
}

/// [`follow`] for a node that serves no volumes (the simulator's nodes, whose VMs
/// open drove's `Volume` on the gateway themselves): the map, the catalog,
/// recovery's view and the sweep for deleted VDIs' objects, as a daemon keeps them.
pub async fn follow_metadata(
    meta: Arc<Meta>,
    map: Arc<MapCell>,
    local: Arc<LocalStore>,
    recoverer: Arc<Recoverer>,
    removed: Arc<tokio::sync::Notify>,
) {
    follow_with(meta, map, None, local, recoverer, removed).await;
}

async fn follow_with(
    meta: Arc<Meta>,
    map: Arc<MapCell>,
    exports: Option<Arc<VdiExports>>,
    local: Arc<LocalStore>,
    recoverer: Arc<Recoverer>,
    removed: Arc<tokio::sync::Notify>,
) {
    let mut rx = meta.watch();
    let me = meta.node_id();
    let mut handed: BTreeSet<(u32, u64)> = BTreeSet::new();
    // The epoch maps change only at epoch changes and trims: copied then, not at
    // every metadata change.
    let mut history: Arc<Vec<drove_types::ClusterMap>> = Arc::default();
    let mut span = None;
    // Whether a sweep for objects of deleted VDIs is owed, and when the next is due
    // in any case.
    let mut owed = false;
    let mut next_sweep = Instant::now() + SWEEP_EVERY;
    let mut by_id = ById::default();
    loop {
        let state: Arc<MetaState> = rx.borrow_and_update().clone();
        if state.removed.contains(&me) {
            removed.notify_one();
            return;
        }
        let current = Arc::new(state.map.clone());
        map.set(current.clone());
        owed |= by_id.update(&state.vdis);
        // Before recovery sees the new epoch: requests admitted at an epoch are then
        // judged on a catalog at least that new.
        local
            .catalog()
            .publish(catalog_of(&state, current.clone(), &by_id));
        if span != drove_meta::history_span(&state.epoch_history) {
            span = drove_meta::history_span(&state.epoch_history);
            history = Arc::new(state.epoch_history.iter().map(|r| r.map.clone()).collect());
        }
        let view = View {
            map: current,
            vdis: by_id.vdis.clone(),
            history: history.clone(),
            noout: state.settings.noout,
            backfill_full_pct: state.settings.backfill_full_pct,
        };
        recoverer.update(view, state.settings.recovery_mib_s);
        if let Some(exports) = &exports {
            exports.refresh(&state);
            hand_over(&state, me, exports, &by_id, &mut handed);
        }
        if owed || Instant::now() >= next_sweep {
            let done = collect_garbage(&state, by_id.live.clone(), local.store()).await;
            owed = !done;
            next_sweep = Instant::now() + if done { SWEEP_EVERY } else { SWEEP_RETRY };
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() {
                return;
            },
            () = tokio::time::sleep_until(next_sweep) => {}
        }
    }
}

/// The VDI table by id, and what the watcher derives from it, rebuilt only when the
/// metadata's table changed: the table is shared between metadata states (an `Arc`),
/// so most changes (locks, node verdicts) keep the same one, and a lock taken used to
/// copy every VDI record twice on every node.
#[derive(Default)]
struct ById {
    /// The table this was built from.
    from: Option<Arc<BTreeMap<String, VdiInfo>>>,
    /// The VDIs by id (the catalog's and recovery's).
    vdis: Arc<BTreeMap<VdiId, VdiInfo>>,
    /// Their ids.
    live: BTreeSet<u32>,
    /// The snapshots' ids: no generation may write them.
    snapshots: Vec<VdiId>,
}

impl ById {
    /// Follow `table`; whether a sweep for objects of deleted VDIs is due because of
    /// it ([`sweep_due`]: it is the first table, or a VDI left since the one before).
    fn update(&mut self, table: &Arc<BTreeMap<String, VdiInfo>>) -> bool {
        if self.from.as_ref().is_some_and(|f| Arc::ptr_eq(f, table)) {
            return false;
        }
        let live: BTreeSet<u32> = table.values().map(|v| v.id.0).collect();
        let due = sweep_due(self.from.is_some().then_some(&self.live), &live);
        self.vdis = Arc::new(table.values().map(|v| (v.id, v.clone())).collect());
        self.live = live;
        self.snapshots = table
            .values()
            .filter(|v| v.snapshot)
            .map(|v| v.id)
            .collect();
        self.from = Some(table.clone());
        due
    }
}

/// The longest time between two sweeps for objects of deleted VDIs.
const SWEEP_EVERY: Duration = Duration::from_secs(600);
/// When a sweep could not be made (the node is catching up, the store failed), it is
/// tried again at the next change or after this long.
const SWEEP_RETRY: Duration = Duration::from_secs(5);

/// Whether objects of deleted VDIs must be looked for, going from a table with the
/// VDI ids `before` (`None`: no table yet) to one with `live`: at the first table, and
/// when a VDI of the one before is gone. VDIs that only appeared need none. A sweep
/// owed and not yet made stays owed (see [`follow`]), so comparing each table with
/// the one just before misses no deletion.
fn sweep_due(before: Option<&BTreeSet<u32>>, live: &BTreeSet<u32>) -> bool {
    before.is_none_or(|b| !b.is_subset(live))
}

/// A node asked for the lock of a VDI this node holds: hand it over (once per
/// generation), in the background so the watcher keeps following.
fn hand_over(
    state: &MetaState,
    me: drove_types::NodeId,
    exports: &Arc<VdiExports>,
    by_id: &ById,
    handed: &mut BTreeSet<(u32, u64)>,
) {
    for (vdi, lock) in &state.locks {
        let (true, Some(to)) = (lock.owner == me, lock.handover_to) else {
            continue;
        };
        if !handed.insert((vdi.0, lock.generation)) {
            continue;
        }
        let Some(info) = by_id.vdis.get(vdi) else {
            continue;
        };
        let Some(vol) = exports.volume(&info.name) else {
            continue;
        };
        tokio::spawn(async move {
            if let Err(e) = vol.hand_over(&to.to_string()).await {
                tracing::warn!("hand-over to node {to} failed: {e}");
            }
        });
    }
}

/// Delete local objects whose VDI is not in `live`, the ids of the table. VDI ids are
/// never reused, so an object of an unknown id can only belong to a deleted VDI.
/// Whether the sweep was made (not before the node knows the cluster, nor when the
/// store failed).
async fn collect_garbage(
    state: &MetaState,
    live: BTreeSet<u32>,
    store: &Arc<dyn drove_objstore::ObjectStore>,
) -> bool {
    if state.map.nodes.is_empty() {
        // Not caught up with the log yet: an empty table means nothing.
        return false;
    }
    let next = state.next_vdi_id;
    let res = drove_replica::local::blocking(store, move |s| {
        let mut removed = 0usize;
        for oid in s.list()? {
            if oid.vdi.0 < next && !live.contains(&oid.vdi.0) {
                s.delete(oid)?;
                removed += 1;
            }
        }
        Ok(removed)
    })
    .await;
    match res {
        Ok(0) => true,
        Ok(n) => {
            tracing::info!("deleted {n} objects of deleted VDIs");
            true
        }
        Err(e) => {
            tracing::warn!("cannot delete objects of deleted VDIs: {e}");
            false
        }
    }
}

/// What the peer side checks requests against: the VDIs, the generations handed
/// out (every one fences older writers here; a snapshot is frozen, so no generation
/// may write it) and the map.
fn catalog_of(state: &MetaState, map: Arc<drove_types::ClusterMap>, by_id: &ById) -> Catalog {
    let mut generations = state.lock_generations.clone();
    for &id in &by_id.snapshots {
        generations.insert(id, u64::MAX);
    }
    Catalog {
        map,
        vdis: by_id.vdis.clone(),
        next_vdi_id: state.next_vdi_id,
        generations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    #[test]
    fn test_a_sweep_is_due_first_and_when_a_vdi_left_the_table_only() {
        assert!(sweep_due(None, &ids(&[])), "the first state is swept");
        assert!(
            !sweep_due(Some(&ids(&[1, 2])), &ids(&[1, 2])),
            "nothing changed"
        );
        assert!(
            !sweep_due(Some(&ids(&[1, 2])), &ids(&[1, 2, 3])),
            "a VDI created leaves nothing behind"
        );
        assert!(
            sweep_due(Some(&ids(&[1, 2])), &ids(&[2, 3])),
            "VDI 1 was deleted"
        );
        assert!(
            sweep_due(Some(&ids(&[1])), &ids(&[])),
            "the last VDI was deleted"
        );
    }
}
