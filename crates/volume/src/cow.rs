//! Copy-on-write for clones: where an object of a clone is read from, and the copy-up
//! of its first write.
//!
//! A clone (or a VDI after a snapshot) has a chain of frozen parents. An object the
//! clone has written lives under its own id; any other object is read from the
//! nearest parent that has it, or reads as zeros. The first write to an object copies
//! the parent's content up, merged with the write, into the clone's object in one
//! atomic create on each replica, so a crash can never leave an object that is half
//! the parent's and half zeros.
//!
//! What is known about existence is cached: an object that exists keeps existing
//! while its VDI id lives (rollback and delete retire the id); parents are frozen, so
//! their missing objects stay missing. Only the writer (the lock holder) can trust
//! that its own object is still missing, since nobody else may create it; readers on
//! other nodes ask again.
use drove_replica::Gateway;
use drove_types::{ObjectId, Result, VdiId, VdiInfo};
use parking_lot::Mutex;
use std::collections::HashSet;

/// Copy-ups of one object are serialized by one of these stripes.
const STRIPES: usize = 64;

/// Existence cache and copy-up locks of one volume.
pub(crate) struct Cow {
    present: Mutex<HashSet<ObjectId>>,
    /// Missing objects of frozen parents.
    absent_frozen: Mutex<HashSet<ObjectId>>,
    /// Missing objects of the volume's own id, with the lock generation under which
    /// that was seen (only valid while the same lease is held).
    absent_own: Mutex<(u64, HashSet<ObjectId>)>,
    copy_up: Vec<tokio::sync::Mutex<()>>,
}

impl Default for Cow {
    fn default() -> Self {
        Cow {
            present: Mutex::default(),
            absent_frozen: Mutex::default(),
            absent_own: Mutex::default(),
            copy_up: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }
}

/// Where an object of the volume reads from.
pub(crate) enum Source {
    /// The VDI (or parent) that has it.
    Vdi(Box<VdiInfo>),
    /// Nobody wrote it: zeros.
    Zeros,
}

impl Cow {
    fn known(&self, oid: ObjectId, frozen: bool, generation: Option<u64>) -> Option<bool> {
        if self.present.lock().contains(&oid) {
            return Some(true);
        }
        if frozen {
            return self.absent_frozen.lock().contains(&oid).then_some(false);
        }
        let own = self.absent_own.lock();
        (generation == Some(own.0) && own.1.contains(&oid)).then_some(false)
    }

    fn learn(&self, oid: ObjectId, exists: bool, frozen: bool, generation: Option<u64>) {
        if exists {
            self.present.lock().insert(oid);
        } else if frozen {
            self.absent_frozen.lock().insert(oid);
        } else if let Some(g) = generation {
            let mut own = self.absent_own.lock();
            if own.0 != g {
                *own = (g, HashSet::new());
            }
            own.1.insert(oid);
        }
    }

    /// The object was created (copied up) under its own id.
    pub(crate) fn created(&self, oid: ObjectId) {
        self.present.lock().insert(oid);
        self.absent_own.lock().1.remove(&oid);
    }

    /// The volume's id became a frozen parent (a snapshot): what was known missing of
    /// it under the lock stays true for ever.
    pub(crate) fn froze(&self, id: VdiId) {
        let moved: Vec<ObjectId> = std::mem::take(&mut self.absent_own.lock().1)
            .into_iter()
            .filter(|o| o.vdi == id)
            .collect();
        self.absent_frozen.lock().extend(moved);
    }

    /// Whether object `index` of `vdi` exists, from the cache or the replicas.
    async fn has(
        &self,
        gateway: &Gateway,
        vdi: &VdiInfo,
        index: u32,
        generation: Option<u64>,
    ) -> Result<bool> {
        let oid = ObjectId::new(vdi.id, index);
        if let Some(k) = self.known(oid, vdi.snapshot, generation) {
            return Ok(k);
        }
        let exists = gateway
            .exists(vdi, &[oid])
            .await?
            .first()
            .copied()
            .unwrap_or(false);
        self.learn(oid, exists, vdi.snapshot, generation);
        Ok(exists)
    }

    /// Where object `index` of `info` (with `parents`, nearest first) reads from.
    /// `generation`: the lock this node holds, if any.
    pub(crate) async fn source(
        &self,
        gateway: &Gateway,
        info: &VdiInfo,
        parents: &[VdiInfo],
        index: u32,
        generation: Option<u64>,
    ) -> Result<Source> {
        if info.parent.is_none() || self.has(gateway, info, index, generation).await? {
            return Ok(Source::Vdi(Box::new(info.clone())));
        }
        for p in parents {
            // A parent smaller than the clone (the clone grew) has nothing there.
            if u64::from(index) >= p.object_count() {
                continue;
            }
            if self.has(gateway, p, index, None).await? {
                return Ok(Source::Vdi(Box::new(p.clone())));
            }
        }
        Ok(Source::Zeros)
    }

    /// The lock serializing copy-ups of object `index`.
    pub(crate) fn stripe(&self, index: u32) -> &tokio::sync::Mutex<()> {
        &self.copy_up[index as usize % STRIPES]
    }
}
