//! The open-file cache of a [`FileStore`](crate::FileStore): hot objects keep their
//! two file descriptors open instead of reopening them on every I/O.
//!
//! The cache is split into shards by object id, each behind its own mutex, so I/O to
//! different objects rarely contends. An object's files are opened (or created) and
//! removed only under its shard's lock, which gives two guarantees the store relies
//! on:
//! - there is one handle per object at a time, so the handle's range locks really
//!   are the object's locks;
//! - a delete (unlink under the lock) cannot interleave with an open, so no handle to
//!   an unlinked file is ever put into the cache.
//!
//! Eviction removes the least recently used handle that nobody else holds
//! (`Arc::strong_count == 1`: no I/O in flight, not in the dirty set). Evicting a
//! handle still in use would let a second handle, with its own locks, be opened for
//! the same object. If every handle of a shard is in use the shard grows past its
//! bound until they are released.
use crate::objfile::ObjFile;
use drove_types::{ObjectId, Result};
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Number of shards.
const SHARDS: usize = 16;

struct Shard {
    map: HashMap<ObjectId, Arc<ObjFile>>,
    /// Logical clock for recency.
    tick: u64,
}

/// Open object handles, bounded.
pub(crate) struct FdCache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
}

impl FdCache {
    /// A cache of about `capacity` objects (two descriptors each).
    pub(crate) fn new(capacity: usize) -> FdCache {
        FdCache {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::new(),
                        tick: 0,
                    })
                })
                .collect(),
            per_shard: (capacity / SHARDS).max(1),
        }
    }

    fn shard(&self, oid: ObjectId) -> MutexGuard<'_, Shard> {
        // Fibonacci hashing: consecutive objects of a VDI spread over the shards.
        let h = oid.as_u64().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        let i = (h as usize) % SHARDS;
        self.shards[i].lock()
    }

    /// The handle of `oid`; on a miss, `open` runs under the shard lock and its
    /// result is cached. `Ok(None)` when `open` finds no object.
    pub(crate) fn get(
        &self,
        oid: ObjectId,
        open: impl FnOnce() -> Result<Option<ObjFile>>,
    ) -> Result<Option<Arc<ObjFile>>> {
        let mut shard = self.shard(oid);
        shard.tick += 1;
        let tick = shard.tick;
        if let Some(f) = shard.map.get(&oid) {
            f.last_used.store(tick, Relaxed);
            return Ok(Some(Arc::clone(f)));
        }
        let Some(f) = open()? else {
            return Ok(None);
        };
        f.last_used.store(tick, Relaxed);
        let f = Arc::new(f);
        shard.map.insert(oid, Arc::clone(&f));
        while shard.map.len() > self.per_shard && evict_one(&mut shard.map, oid) {}
        Ok(Some(f))
    }

    /// True if `oid` has an open handle, else the answer of `check`, run under the
    /// shard lock so that it cannot race a create or delete of `oid`.
    pub(crate) fn cached_or(
        &self,
        oid: ObjectId,
        check: impl FnOnce() -> Result<bool>,
    ) -> Result<bool> {
        let shard = self.shard(oid);
        if shard.map.contains_key(&oid) {
            return Ok(true);
        }
        check()
    }

    /// Drop the handle of `oid` and run `f` with it while the shard stays locked,
    /// so no I/O can reopen or recreate the object until `f` returns.
    pub(crate) fn remove_then<R>(
        &self,
        oid: ObjectId,
        f: impl FnOnce(Option<Arc<ObjFile>>) -> R,
    ) -> R {
        let mut shard = self.shard(oid);
        let handle = shard.map.remove(&oid);
        f(handle)
    }

    /// Number of open handles.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }
}

/// Remove the least recently used handle that only the cache holds, other than
/// `keep`; false if there is none.
fn evict_one(map: &mut HashMap<ObjectId, Arc<ObjFile>>, keep: ObjectId) -> bool {
    let victim = map
        .iter()
        .filter(|(oid, f)| **oid != keep && Arc::strong_count(f) == 1)
        .min_by_key(|(_, f)| f.last_used.load(Relaxed))
        .map(|(oid, _)| *oid);
    match victim {
        Some(oid) => map.remove(&oid).is_some(),
        None => false,
    }
}
