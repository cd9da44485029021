//! The objects of a [`FileStore`](crate::FileStore) written since their last flush,
//! so that `flush(&[])` knows what to sync and `flush(oids)` skips clean objects.
//!
//! Invariant, outside the set's lock: `in_dirty` true implies the handle is in the
//! set. Writers set the flag only under the lock, after inserting; a flush clears it
//! before syncing and removes the entry afterwards only if no writer set it again.
//! A write is thus either covered by the sync that follows the clear, or comes after
//! it and re-enters the set. The common case, writing an object that is already
//! dirty, costs one atomic load.
//!
//! The set holds an `Arc` of each handle, which also keeps a dirty object's files
//! out of reach of the fd cache's eviction.
use crate::objfile::ObjFile;
use drove_types::{ObjectId, Result};
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

/// Objects with writes not yet made durable.
pub(crate) struct DirtySet {
    map: Mutex<HashMap<ObjectId, Arc<ObjFile>>>,
}

impl DirtySet {
    /// An empty set.
    pub(crate) fn new() -> DirtySet {
        DirtySet {
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<ObjectId, Arc<ObjFile>>> {
        self.map.lock()
    }

    /// Note that `f` was written (after the write reached the page cache).
    pub(crate) fn mark(&self, f: &Arc<ObjFile>) {
        if f.in_dirty.load(SeqCst) {
            return;
        }
        let mut map = self.lock();
        // `deleted` is set under this lock, so a write racing a delete cannot put
        // the unlinked object back.
        if f.deleted.load(SeqCst) || f.in_dirty.load(SeqCst) {
            return;
        }
        map.insert(f.oid(), Arc::clone(f));
        f.in_dirty.store(true, SeqCst);
    }

    /// The dirty handles among `oids`, or all of them if `oids` is empty.
    pub(crate) fn pick(&self, oids: &[ObjectId]) -> Vec<Arc<ObjFile>> {
        let map = self.lock();
        if oids.is_empty() {
            return map.values().cloned().collect();
        }
        oids.iter()
            .filter_map(|oid| map.get(oid).cloned())
            .collect()
    }

    /// Sync `f` and drop it from the set unless it was written again meanwhile.
    pub(crate) fn sync(&self, f: &Arc<ObjFile>) -> Result<()> {
        f.in_dirty.store(false, SeqCst);
        if let Err(e) = f.sync() {
            // Keep it dirty (the entry may have been removed by a concurrent flush
            // whose sync succeeded, so insert again).
            let mut map = self.lock();
            if !f.deleted.load(SeqCst) {
                map.insert(f.oid(), Arc::clone(f));
                f.in_dirty.store(true, SeqCst);
            }
            return Err(e);
        }
        let mut map = self.lock();
        if !f.in_dirty.load(SeqCst) && map.get(&f.oid()).is_some_and(|cur| Arc::ptr_eq(cur, f)) {
            map.remove(&f.oid());
        }
        Ok(())
    }

    /// Forget `oid`, being deleted; `handle` is its open handle, if any.
    pub(crate) fn forget(&self, oid: ObjectId, handle: Option<&Arc<ObjFile>>) {
        let mut map = self.lock();
        if let Some(f) = handle {
            f.deleted.store(true, SeqCst);
        }
        map.remove(&oid);
    }

    /// Number of dirty objects.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}
