//! What the disk under a lying [`MemStore`](crate::MemStore) has made durable, and
//! how it loses the rest: the simulator's model of a real disk and page cache, as
//! a [`FileStore`](crate::FileStore) sees them.
//!
//! - A change to an object is in the page cache until a flush of the object (a
//!   FileStore's fdatasync): before the first change after a flush, the object's
//!   state is kept as its durable image.
//! - At a power loss, an object changed since its last flush comes back as its
//!   durable image, except that each block written since may have been written back
//!   by the kernel on its own (kept), or torn (data and checksum written apart: the
//!   block reads as corrupt); its version record likewise. An object created whole
//!   (a clone's copy-up, built and synced under another name and renamed in) comes
//!   back whole or not at all; a new object's directory entry may be lost (the
//!   object is then missing); a delete may not have reached the disk (the object
//!   comes back).
//! - A flush can fail ([`Lies::fail_next_flush`]). As Linux's fsync does, it marks
//!   the pages clean without having written them and reports the error once: the
//!   blocks it should have made durable keep their old content at a power loss,
//!   whatever later flushes say, until they are written again.
//! - The disk can be made to hold only so many blocks ([`Lies::capacity`]).
use crate::mem::{Block, Obj};
use drove_types::{Error, ObjectId, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::sync::Arc;

/// Chance that a block written since the last flush reached the disk on its own.
const WRITTEN_BACK: f64 = 0.3;
/// Chance that a block not written back is torn (data and checksum apart).
const TORN: f64 = 0.1;

/// The durable state of a lying disk and its armed faults.
#[derive(Default, Clone)]
pub(crate) struct Lies {
    /// The durable image of each object changed since its last flush (`None`: it
    /// did not exist durably).
    before: BTreeMap<ObjectId, Option<Obj>>,
    /// Of those, the objects replaced whole since (atomically).
    atomic: BTreeSet<ObjectId>,
    /// Blocks a failed flush forgot: their durable content (`None`: a hole),
    /// restored at a power loss until the block is written again.
    doomed: BTreeMap<(ObjectId, u64), Option<Block>>,
    /// The next flush fails.
    pub(crate) fail_next_flush: bool,
    /// Flushes failed so far.
    pub(crate) failed_flushes: u64,
    /// The disk holds at most this many blocks.
    pub(crate) capacity: Option<u64>,
    /// Flushes succeed without making anything durable: a disk (or a stack) that
    /// lies outright, to show that the simulator's checks catch one.
    pub(crate) pretend: bool,
}

impl Lies {
    /// `oid` is about to change; `current` is its state now.
    pub(crate) fn changing(&mut self, oid: ObjectId, current: Option<&Obj>) {
        self.before.entry(oid).or_insert_with(|| current.cloned());
    }

    /// Objects changed since their last flush.
    pub(crate) fn unflushed(&self) -> usize {
        self.before.len()
    }

    /// `blocks` of `oid` are written again: a failed flush's loss of them is over
    /// (the new pages are dirty and a later flush writes them).
    pub(crate) fn rewritten(&mut self, oid: ObjectId, blocks: RangeInclusive<u64>) {
        let (lo, hi) = (*blocks.start(), *blocks.end());
        self.doomed
            .retain(|(o, b), _| *o != oid || *b < lo || *b > hi);
    }

    /// `oid` was replaced whole, atomically.
    pub(crate) fn atomic(&mut self, oid: ObjectId) {
        self.atomic.insert(oid);
    }

    /// Make `oids` (all changed objects when empty) durable, or fail as an fsync
    /// does when one was armed to.
    pub(crate) fn flush(
        &mut self,
        objects: &BTreeMap<ObjectId, Obj>,
        oids: &[ObjectId],
    ) -> Result<()> {
        let picked: Vec<ObjectId> = if oids.is_empty() {
            self.before.keys().copied().collect()
        } else {
            oids.iter()
                .copied()
                .filter(|o| self.before.contains_key(o))
                .collect()
        };
        if self.fail_next_flush {
            self.fail_next_flush = false;
            self.failed_flushes += 1;
            for oid in picked {
                self.atomic.remove(&oid);
                let old = self.before.remove(&oid).flatten();
                let cur = objects.get(&oid);
                for b in changed_blocks(old.as_ref(), cur) {
                    let durable = old.as_ref().and_then(|o| o.blocks.get(&b).cloned());
                    self.doomed.entry((oid, b)).or_insert(durable);
                }
            }
            return Err(Error::io(
                "flush: fsync (injected)",
                std::io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        if self.pretend {
            return Ok(());
        }
        for oid in picked {
            self.before.remove(&oid);
            self.atomic.remove(&oid);
        }
        Ok(())
    }

    /// The power went: every object comes back as the disk has it. Returns how
    /// many objects had unflushed changes.
    pub(crate) fn power_loss(
        &mut self,
        objects: &mut BTreeMap<ObjectId, Obj>,
        chance: &mut dyn FnMut(f64) -> bool,
    ) -> usize {
        let before = std::mem::take(&mut self.before);
        let atomic = std::mem::take(&mut self.atomic);
        let n = before.len();
        for (oid, old) in before {
            let cur = objects.remove(&oid);
            let kept = if atomic.contains(&oid) {
                if chance(WRITTEN_BACK) {
                    cur
                } else {
                    old
                }
            } else {
                tear(old, cur, chance)
            };
            if let Some(o) = kept {
                objects.insert(oid, o);
            }
        }
        for ((oid, b), durable) in std::mem::take(&mut self.doomed) {
            if let Some(o) = objects.get_mut(&oid) {
                match durable {
                    Some(d) => o.blocks.insert(b, d),
                    None => o.blocks.remove(&b),
                };
            }
        }
        n
    }
}

/// The blocks that differ between `a` and `b`.
fn changed_blocks(a: Option<&Obj>, b: Option<&Obj>) -> Vec<u64> {
    let empty = BTreeMap::new();
    let (ab, bb) = (
        a.map_or(&empty, |o| &o.blocks),
        b.map_or(&empty, |o| &o.blocks),
    );
    let keys: BTreeSet<u64> = ab.keys().chain(bb.keys()).copied().collect();
    keys.into_iter()
        .filter(|k| match (ab.get(k), bb.get(k)) {
            (Some(x), Some(y)) => !Arc::ptr_eq(x, y) && x != y,
            (x, y) => x.is_some() != y.is_some(),
        })
        .collect()
}

/// What an object changed since its last flush is after a power loss: its durable
/// image `old` with part of the changes to `cur`.
fn tear(old: Option<Obj>, cur: Option<Obj>, chance: &mut dyn FnMut(f64) -> bool) -> Option<Obj> {
    match (old, cur) {
        // Deleted since: the unlink may not have reached the disk.
        (old, None) => {
            if chance(WRITTEN_BACK) {
                None
            } else {
                old
            }
        }
        // Created since: its directory entry may not have reached the disk.
        (None, Some(cur)) => {
            if chance(0.5) {
                None
            } else {
                Some(mix(Obj::default(), cur, chance))
            }
        }
        (Some(old), Some(cur)) => Some(mix(old, cur, chance)),
    }
}

/// `old` with each block `cur` changed written back, torn, or lost.
fn mix(old: Obj, cur: Obj, chance: &mut dyn FnMut(f64) -> bool) -> Obj {
    let mut out = old.clone();
    for b in changed_blocks(Some(&old), Some(&cur)) {
        if chance(WRITTEN_BACK) {
            match cur.blocks.get(&b) {
                Some(d) => out.blocks.insert(b, d.clone()),
                None => out.blocks.remove(&b),
            };
            out.corrupt.remove(&b);
        } else if chance(TORN) {
            out.corrupt.insert(b);
        }
    }
    if cur.version != old.version && chance(WRITTEN_BACK) {
        out.version = cur.version;
    }
    // Rot and latent errors are the disk's, not the writes': they stay.
    out.corrupt.extend(cur.corrupt.iter().copied());
    out.eio = cur.eio;
    out
}
