//! The cluster map as the data path sees it: the latest copy, swapped in whole when
//! the metadata applies a change. Readers take an `Arc` and never wait on Raft.
use drove_types::ClusterMap;
use parking_lot::RwLock;
use std::sync::Arc;

/// A shared, replaceable cluster map.
#[derive(Default)]
pub struct MapCell(RwLock<Arc<ClusterMap>>);

impl MapCell {
    /// A cell holding `map`.
    pub fn new(map: ClusterMap) -> Self {
        MapCell(RwLock::new(Arc::new(map)))
    }

    /// The current map.
    pub fn get(&self) -> Arc<ClusterMap> {
        self.0.read().clone()
    }

    /// Replace the map.
    pub fn set(&self, map: Arc<ClusterMap>) {
        *self.0.write() = map;
    }
}
