//! Write ordering across replicas. Two writes in flight at once to the same bytes
//! could reach replica A in one order and replica B in the other, and the replicas
//! would then differ for good. The gateway therefore holds a lock over the 64 KiB
//! chunks a write touches until every replica has answered. Locks are striped
//! (a fixed table, hashed by object and chunk) and always taken in ascending stripe
//! order, so two writes can never wait on each other in a cycle. Writes to disjoint
//! chunks (the common case) proceed in parallel.
use drove_types::ObjectId;
use std::sync::Arc;
use tokio::sync::{Mutex, OwnedMutexGuard};

const CHUNK: u64 = 64 << 10;
const STRIPES: usize = 4096;

/// The first and last chunk `[offset, offset+len)` touches (one chunk when empty).
pub(crate) fn chunk_span(offset: u64, len: u64) -> (u64, u64) {
    (
        offset / CHUNK,
        offset.saturating_add(len.max(1) - 1) / CHUNK,
    )
}

/// A table of striped locks.
pub struct RangeLocks {
    stripes: Vec<Arc<Mutex<()>>>,
}

/// Held while a write is in flight; releases on drop.
pub struct RangeGuard {
    _guards: Vec<OwnedMutexGuard<()>>,
}

impl Default for RangeLocks {
    fn default() -> Self {
        RangeLocks {
            stripes: (0..STRIPES).map(|_| Arc::new(Mutex::new(()))).collect(),
        }
    }
}

impl RangeLocks {
    fn stripe(oid: ObjectId, chunk: u64) -> usize {
        let mut x = oid.as_u64() ^ chunk.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        (x % STRIPES as u64) as usize
    }

    /// Wait until no other write holds any chunk of `[offset, offset+len)` in `oid`.
    pub async fn lock(&self, oid: ObjectId, offset: u64, len: u64) -> RangeGuard {
        let (first, last) = chunk_span(offset, len);
        let mut idx: Vec<usize> = (first..=last).map(|c| Self::stripe(oid, c)).collect();
        idx.sort_unstable();
        idx.dedup();
        let mut guards = Vec::with_capacity(idx.len());
        for i in idx {
            guards.push(self.stripes[i].clone().lock_owned().await);
        }
        RangeGuard { _guards: guards }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::VdiId;
    use std::time::Duration;

    #[tokio::test]
    async fn test_overlapping_writes_wait_disjoint_do_not() {
        let locks = Arc::new(RangeLocks::default());
        let oid = ObjectId::new(VdiId(1), 0);
        let g = locks.lock(oid, 0, 4096).await;
        // Same chunk: must wait.
        let l2 = locks.clone();
        let blocked = tokio::spawn(async move {
            l2.lock(oid, 100, 10).await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!blocked.is_finished());
        // A far chunk of another object: may proceed unless it hashes to a held stripe.
        let other = ObjectId::new(VdiId(2), 5);
        if RangeLocks::stripe(other, 3) != RangeLocks::stripe(oid, 0) {
            tokio::time::timeout(Duration::from_secs(1), locks.lock(other, 3 * CHUNK, 10))
                .await
                .unwrap();
        }
        drop(g);
        tokio::time::timeout(Duration::from_secs(1), blocked)
            .await
            .unwrap()
            .unwrap();
    }
}
