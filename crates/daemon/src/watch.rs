//! Keeps the data path in step with the metadata: every applied change swaps in the
//! new cluster map, updates open volumes (resize) and deletes the local objects of
//! VDIs that were deleted. The data path itself never waits on Raft.
use drove_meta::{Meta, MetaState};
use drove_replica::{Catalog, LocalStore, MapCell, Recoverer, View};
use std::collections::BTreeSet;
use std::sync::Arc;

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
    let mut rx = meta.watch();
    let me = meta.node_id();
    let mut handed: BTreeSet<(u32, u64)> = BTreeSet::new();
    // The epoch maps only grow, at epoch changes: copied once per change, not at
    // every metadata change.
    let mut history: Arc<Vec<drove_types::ClusterMap>> = Arc::default();
    loop {
        let state: Arc<MetaState> = rx.borrow_and_update().clone();
        if state.removed.contains(&me) {
            removed.notify_one();
            return;
        }
        let current = Arc::new(state.map.clone());
        map.set(current.clone());
        // Before recovery sees the new epoch: requests admitted at an epoch are then
        // judged on a catalog at least that new.
        local.catalog().publish(catalog_of(&state, current));
        if history.len() != state.epoch_history.len() {
            history = Arc::new(state.epoch_history.iter().map(|r| r.map.clone()).collect());
        }
        recoverer.update(view_of(&state, &history), state.settings.recovery_mib_s);
        exports.refresh(&state);
        hand_over(&state, me, &exports, &mut handed);
        collect_garbage(&state, local.store()).await;
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// A node asked for the lock of a VDI this node holds: hand it over (once per
/// generation), in the background so the watcher keeps following.
fn hand_over(
    state: &MetaState,
    me: drove_types::NodeId,
    exports: &Arc<VdiExports>,
    handed: &mut BTreeSet<(u32, u64)>,
) {
    for (vdi, lock) in &state.locks {
        let (true, Some(to)) = (lock.owner == me, lock.handover_to) else {
            continue;
        };
        if !handed.insert((vdi.0, lock.generation)) {
            continue;
        }
        let Some(info) = state.vdis.values().find(|v| v.id == *vdi) else {
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

/// Delete local objects whose VDI is no longer in the table. VDI ids are never
/// reused, so an object of an unknown id can only belong to a deleted VDI.
async fn collect_garbage(state: &MetaState, store: &Arc<dyn drove_objstore::ObjectStore>) {
    if state.map.nodes.is_empty() {
        // Not caught up with the log yet: an empty table means nothing.
        return;
    }
    let live: BTreeSet<u32> = state.vdis.values().map(|v| v.id.0).collect();
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
        Ok(0) => {}
        Ok(n) => tracing::info!("deleted {n} objects of deleted VDIs"),
        Err(e) => tracing::warn!("cannot delete objects of deleted VDIs: {e}"),
    }
}

/// What the peer side checks requests against: the VDIs, the generations handed
/// out (every one fences older writers here; a snapshot is frozen, so no generation
/// may write it) and the map.
fn catalog_of(state: &MetaState, map: Arc<drove_types::ClusterMap>) -> Catalog {
    let mut generations = state.lock_generations.clone();
    for v in state.vdis.values().filter(|v| v.snapshot) {
        generations.insert(v.id, u64::MAX);
    }
    Catalog {
        map,
        vdis: state.vdis.values().map(|v| (v.id, v.clone())).collect(),
        next_vdi_id: state.next_vdi_id,
        generations,
    }
}

/// What recovery needs from a metadata state.
fn view_of(state: &MetaState, history: &Arc<Vec<drove_types::ClusterMap>>) -> View {
    View {
        map: Arc::new(state.map.clone()),
        vdis: state.vdis.values().map(|v| (v.id, v.clone())).collect(),
        history: history.clone(),
    }
}
