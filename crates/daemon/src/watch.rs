//! Keeps the data path in step with the metadata: every applied change swaps in the
//! new cluster map, updates open volumes (resize) and deletes the local objects of
//! VDIs that were deleted. The data path itself never waits on Raft.
use drove_meta::{Meta, MetaState};
use drove_objstore::ObjectStore;
use drove_replica::MapCell;
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::exports::VdiExports;

/// Follow the metadata until it shuts down.
pub async fn follow(
    meta: Arc<Meta>,
    map: Arc<MapCell>,
    exports: Arc<VdiExports>,
    store: Arc<dyn ObjectStore>,
) {
    let mut rx = meta.watch();
    loop {
        let state: Arc<MetaState> = rx.borrow_and_update().clone();
        map.set(Arc::new(state.map.clone()));
        exports.refresh(&state);
        collect_garbage(&state, &store).await;
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Delete local objects whose VDI is no longer in the table. VDI ids are never
/// reused, so an object of an unknown id can only belong to a deleted VDI.
async fn collect_garbage(state: &MetaState, store: &Arc<dyn ObjectStore>) {
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
