//! The parts of a VDI whose last write failed after it may have reached some
//! replicas: torn between them.
//!
//! A write that fails (a replica's disk full, the lease running out, a replica
//! refusing) may have been applied by some replicas and not by others, so reads
//! of those bytes could differ from one replica to the next. That is allowed
//! while the client is told the write failed (a disk's sector after a failed
//! write is undefined too), and a later write of the same bytes makes them
//! identical again (QEMU retries a failed write when a VM paused on ENOSPC
//! resumes). But giving the lock up cleanly says every copy has every write: the
//! next writer then skips the post-crash repair. So before a release, a
//! hand-over or a snapshot, the volume makes each torn object identical on every
//! replica first ([`crate::Volume`] reads it from one and writes it whole, client
//! writes waiting meanwhile: a client attached again during a detach's mend
//! could otherwise write between the read and the write back, and lose that
//! write to the older bytes).
use crate::map::Extent;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ops::Range;

/// Byte ranges of objects (by index) written by a write that failed.
#[derive(Default)]
pub(crate) struct Torn {
    ranges: Mutex<BTreeMap<u32, Vec<Range<u64>>>>,
}

impl Torn {
    /// A write of `ex` failed: its bytes may differ between replicas.
    pub(crate) fn record(&self, ex: &[Extent]) {
        let mut r = self.ranges.lock();
        for e in ex {
            r.entry(e.index)
                .or_default()
                .push(e.offset..e.offset + e.len);
        }
    }

    /// A write of `ex` succeeded on every replica: the torn ranges it covers are
    /// whole again.
    pub(crate) fn cover(&self, ex: &[Extent]) {
        let mut r = self.ranges.lock();
        if r.is_empty() {
            return;
        }
        for e in ex {
            let done = e.offset..e.offset + e.len;
            if let Some(v) = r.get_mut(&e.index) {
                v.retain(|t| !(done.start <= t.start && t.end <= done.end));
                if v.is_empty() {
                    r.remove(&e.index);
                }
            }
        }
    }

    /// The objects with torn ranges, in order.
    pub(crate) fn objects(&self) -> Vec<u32> {
        self.ranges.lock().keys().copied().collect()
    }

    /// Whether object `index` has torn ranges still.
    pub(crate) fn is_torn(&self, index: u32) -> bool {
        self.ranges.lock().contains_key(&index)
    }

    /// Object `index` was made identical on every replica.
    pub(crate) fn mended(&self, index: u32) {
        self.ranges.lock().remove(&index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(index: u32, offset: u64, len: u64) -> Extent {
        Extent {
            index,
            offset,
            len,
            buf_offset: 0,
        }
    }

    #[test]
    fn test_a_later_write_covering_a_torn_range_makes_it_whole() {
        let t = Torn::default();
        t.record(&[ex(1, 4096, 4096), ex(2, 0, 8192)]);
        assert_eq!(t.objects(), vec![1, 2]);
        // Another range of object 1, and a part of object 2's: nothing whole yet.
        t.cover(&[ex(1, 0, 4096), ex(2, 0, 4096)]);
        assert_eq!(t.objects(), vec![1, 2]);
        // The same bytes again, and more than them.
        t.cover(&[ex(1, 4096, 4096), ex(2, 0, 1 << 20)]);
        assert!(t.objects().is_empty());
        t.record(&[ex(3, 0, 10)]);
        t.mended(3);
        assert!(t.objects().is_empty());
    }
}
