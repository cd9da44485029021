//! Block-range locks inside one object.
//!
//! A block's data and its checksum live in two files, so a reader must not see one
//! updated without the other, and two partial-block writers must not both
//! read-modify-write the same checksum. Block `b` is guarded by stripe `b % STRIPES`;
//! an I/O locks the stripes of the blocks it touches, shared for reads and exclusive
//! for writes, always in ascending stripe order so two I/Os cannot deadlock.
//! Writers of different blocks of one object mostly take different stripes and run
//! in parallel; an I/O of `STRIPES` blocks or more takes them all.
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Number of locks per object.
pub(crate) const STRIPES: usize = 16;

/// The range locks of one object. The locks guard no data (`()`), so a poisoned lock
/// carries no broken state and is simply taken over.
pub(crate) struct Stripes([RwLock<()>; STRIPES]);

/// Shared locks on a block range, released on drop.
pub(crate) struct ReadGuards<'a> {
    _guards: [Option<RwLockReadGuard<'a, ()>>; STRIPES],
}

/// Exclusive locks on a block range, released on drop.
pub(crate) struct WriteGuards<'a> {
    _guards: [Option<RwLockWriteGuard<'a, ()>>; STRIPES],
}

impl Stripes {
    /// Unlocked stripes.
    pub(crate) fn new() -> Stripes {
        Stripes(std::array::from_fn(|_| RwLock::new(())))
    }

    /// Lock blocks `first..=last` for reading.
    pub(crate) fn read(&self, first: u64, last: u64) -> ReadGuards<'_> {
        let mask = mask(first, last);
        // array::from_fn runs in index order: ascending lock order.
        ReadGuards {
            _guards: std::array::from_fn(|i| mask[i].then(|| self.0[i].read())),
        }
    }

    /// Lock blocks `first..=last` for writing.
    pub(crate) fn write(&self, first: u64, last: u64) -> WriteGuards<'_> {
        let mask = mask(first, last);
        WriteGuards {
            _guards: std::array::from_fn(|i| mask[i].then(|| self.0[i].write())),
        }
    }
}

/// Which stripes blocks `first..=last` map to.
fn mask(first: u64, last: u64) -> [bool; STRIPES] {
    let mut mask = [false; STRIPES];
    if last.saturating_sub(first) >= STRIPES as u64 - 1 {
        return [true; STRIPES];
    }
    for b in first..=last {
        mask[(b % STRIPES as u64) as usize] = true;
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn test_mask_covers_touched_blocks_only() {
        let m = mask(17, 18);
        assert_eq!(m.iter().filter(|x| **x).count(), 2);
        assert!(m[1] && m[2]);
        let m = mask(15, 16);
        assert!(m[15] && m[0]);
        assert_eq!(mask(3, 3 + STRIPES as u64 - 1), [true; STRIPES]);
        assert_eq!(mask(0, 1000), [true; STRIPES]);
    }

    #[test]
    fn test_writer_excludes_overlapping_reader_but_not_disjoint() {
        let s = Arc::new(Stripes::new());
        let w = s.write(0, 0);
        // A disjoint range can be taken while block 0 is held.
        drop(s.write(1, 1));
        let s2 = Arc::clone(&s);
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let _r = s2.read(0, 2);
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        drop(w);
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        t.join().unwrap();
    }
}
