//! A volume over a one-node replication stack in memory.
use super::*;
use crate::lock::Lease;
use async_trait::async_trait;
use drove_metrics::Metrics;
use drove_objstore::MemStore;
use drove_replica::{LocalStore, MapCell, PeerPool, PeerTimeouts};
use drove_types::{ClusterId, ClusterMap, Epoch, NodeId, NodeInfo, VdiId};
use std::time::Duration;

/// Grants every lock at once with generation 1.
struct FreeLocks;

#[async_trait]
impl LockService for FreeLocks {
    async fn acquire(&self, vdi: &VdiInfo) -> Result<Lease> {
        Ok(Lease {
            generation: 1,
            duration: Duration::from_secs(60),
            vdi: vdi.id,
            home_zone: vdi.home_zone.clone(),
        })
    }
    async fn release(&self, _vdi: &VdiInfo, _generation: u64) -> Result<()> {
        Ok(())
    }
}

/// Grants every lock at once with generation 1 and counts the releases.
#[derive(Default)]
struct CountedLocks {
    released: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl LockService for CountedLocks {
    async fn acquire(&self, vdi: &VdiInfo) -> Result<Lease> {
        FreeLocks.acquire(vdi).await
    }
    async fn release(&self, _vdi: &VdiInfo, _generation: u64) -> Result<()> {
        self.released.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

pub(crate) fn one_node_volume() -> Arc<Volume> {
    volume_over(Arc::new(MemStore::new(4 << 20)), Arc::new(FreeLocks))
}

fn volume_over(store: Arc<MemStore>, locks: Arc<dyn LockService>) -> Arc<Volume> {
    volume_and_local(store, locks).0
}

/// The catalog of the one-node stack, with lock generation `generation` handed out.
fn publish(local: &LocalStore, info: &VdiInfo, generation: u64) {
    local.catalog().publish(drove_replica::Catalog {
        map: local.catalog().get().map.clone(),
        vdis: std::sync::Arc::new([(info.id, info.clone())].into()),
        next_vdi_id: 2,
        generations: [(info.id, generation)].into(),
    });
}

fn volume_and_local(
    store: Arc<MemStore>,
    locks: Arc<dyn LockService>,
) -> (Arc<Volume>, Arc<LocalStore>) {
    let me = NodeId(1);
    let mut map = ClusterMap {
        epoch: Epoch(1),
        ..Default::default()
    };
    map.nodes.insert(me, NodeInfo::new(me, "z1"));
    let cell = Arc::new(MapCell::new(map));
    let metrics = Metrics::new();
    let pool = PeerPool::new(
        me,
        ClusterId(1),
        cell.clone(),
        PeerTimeouts::default(),
        metrics.clone(),
    );
    let local = LocalStore::new(store);
    let info = VdiInfo::new(VdiId(1), "v", 16 << 20, 4 << 20, 1);
    local.catalog().publish(drove_replica::Catalog {
        map: cell.get(),
        vdis: std::sync::Arc::new([].into()),
        next_vdi_id: 2,
        generations: [].into(),
    });
    publish(&local, &info, 1);
    let gateway = Gateway::new(me, local.clone(), pool, cell, metrics);
    (Volume::new(info, Vec::new(), gateway, locks), local)
}

/// Detach the last client of a volume that wrote, and wait until the lock is gone.
async fn write_and_detach(vol: &Arc<Volume>) {
    vol.attach();
    vol.write(0, Bytes::from(vec![5u8; 4096]), false)
        .await
        .unwrap();
    assert_eq!(vol.lock.held_generation(), Some(1));
    vol.detach();
    for _ in 0..100 {
        if vol.lock.held_generation().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("the lock is still held 100 s after the last detach");
}

#[tokio::test(start_paused = true)]
async fn test_a_flush_that_fails_at_detach_leaves_the_lock_to_expire_unreleased() {
    let store = Arc::new(MemStore::new(4 << 20));
    let locks = Arc::new(CountedLocks::default());
    let vol = volume_over(store.clone(), locks.clone());
    store.fail_flushes(true);
    write_and_detach(&vol).await;
    // A release would have told the next writer that every copy has every write.
    assert_eq!(locks.released.load(Ordering::SeqCst), 0);
    assert!(!vol.dirty.lock().is_empty(), "kept for a later flush");
}

#[tokio::test(start_paused = true)]
async fn test_a_flush_that_fails_once_at_detach_is_tried_again_then_the_lock_released() {
    let store = Arc::new(MemStore::new(4 << 20));
    let locks = Arc::new(CountedLocks::default());
    let vol = volume_over(store.clone(), locks.clone());
    store.fail_flushes(true);
    let s = store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.fail_flushes(false);
    });
    write_and_detach(&vol).await;
    assert_eq!(locks.released.load(Ordering::SeqCst), 1);
    assert!(vol.dirty.lock().is_empty());
}

#[tokio::test]
async fn test_a_panic_while_holding_the_dirty_set_does_not_lose_written_objects() {
    let vol = one_node_volume();
    // A thread that panics while it holds the dirty set (a std Mutex would be
    // poisoned from then on, and writes were silently left out of it).
    let v = vol.clone();
    let _ = std::thread::spawn(move || {
        let _held = v.dirty.lock();
        panic!("panic while holding the dirty set");
    })
    .join();
    vol.write(4 << 20, Bytes::from(vec![7u8; 4096]), false)
        .await
        .unwrap();
    assert_eq!(
        vol.dirty.lock().iter().copied().collect::<Vec<_>>(),
        vec![ObjectId::new(VdiId(1), 1)],
        "a written object is in the set the next FLUSH makes durable"
    );
    vol.flush().await.unwrap();
    assert!(vol.dirty.lock().is_empty(), "flushed");
}

/// Grants a 3 s lease with generation 1; the call numbered `hang` never answers (a
/// commit stalled behind a slow disk), every other one answers at once.
struct StallingLocks {
    calls: std::sync::atomic::AtomicUsize,
    hang: usize,
}

#[async_trait]
impl LockService for StallingLocks {
    async fn acquire(&self, vdi: &VdiInfo) -> Result<Lease> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == self.hang {
            std::future::pending::<()>().await;
        }
        Ok(Lease {
            duration: Duration::from_secs(3),
            ..FreeLocks.acquire(vdi).await?
        })
    }
    async fn release(&self, _vdi: &VdiInfo, _generation: u64) -> Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn test_a_renewal_that_hangs_does_not_keep_another_from_renewing_the_lease() {
    // Call 0 grants, call 1 (the first renewal, after 1 s) hangs; 0.5 s later
    // another is sent beside it and renews.
    let locks = Arc::new(StallingLocks {
        calls: Default::default(),
        hang: 1,
    });
    let vol = volume_over(Arc::new(MemStore::new(4 << 20)), locks.clone());
    let granted = drove_types::clock::Instant::now();
    vol.write(0, Bytes::from(vec![1u8; 4096]), false)
        .await
        .unwrap();
    let first = vol.lock.write_deadline().expect("a lease");
    assert!(first <= granted + Duration::from_secs(3));
    // Past the first lease's end (at most 2.5 s after the grant, less the margin):
    // still held, by a renewal that came after the hung one.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let now = vol.lock.write_deadline().expect("still a lease");
    assert!(now > first, "renewed");
    assert!(now > drove_types::clock::Instant::now(), "valid now");
    assert!(
        locks.calls.load(Ordering::SeqCst) >= 3,
        "the hung call was not waited for"
    );
}

/// Call 0 grants generation 1 for 1 s; call 1 waits for `go`, then answers
/// generation 2; later calls answer generation 2 at once (the lock taken again by
/// this node after its lease ran out).
struct RegrantLocks {
    calls: std::sync::atomic::AtomicUsize,
    go: tokio::sync::Notify,
}

#[async_trait]
impl LockService for RegrantLocks {
    async fn acquire(&self, vdi: &VdiInfo) -> Result<Lease> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if call == 1 {
            self.go.notified().await;
        }
        Ok(Lease {
            generation: if call == 0 { 1 } else { 2 },
            duration: Duration::from_secs(1),
            ..FreeLocks.acquire(vdi).await?
        })
    }
    async fn release(&self, _vdi: &VdiInfo, _generation: u64) -> Result<()> {
        Ok(())
    }
}

/// Take generation 1 from `svc` (a 1 s lease), start a renewal that waits past the
/// lease's end until `go` of `svc` is notified, let a write take the lock again
/// (generation 2) meanwhile, then let the renewal answer. Returns what the renewal
/// did, the lock and the VDI.
async fn renewal_answered_after_a_regrant<S: LockService + 'static>(
    svc: Arc<S>,
    go: fn(&S) -> &tokio::sync::Notify,
) -> (Renewal, Arc<crate::lock::WriteLock>, VdiInfo) {
    let lock = Arc::new(crate::lock::WriteLock::default());
    let info = one_node_volume().info();
    let (g, _guard) = lock.for_write(&info, svc.as_ref()).await.unwrap();
    assert_eq!(g, 1);
    drop(_guard);
    // A renewal that waits past the lease's end...
    let (l, s, i) = (lock.clone(), svc.clone(), info.clone());
    let renewal = tokio::spawn(async move { l.renew(&i, s.as_ref()).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    // ...while a write takes the lock again (generation 2)...
    let (g, _guard) = lock.for_write(&info, svc.as_ref()).await.unwrap();
    assert_eq!(g, 2);
    drop(_guard);
    // ...then answers.
    go(&svc).notify_one();
    (renewal.await.unwrap(), lock, info)
}

#[tokio::test]
async fn test_a_late_renewal_answering_the_generation_held_now_keeps_the_lock() {
    let svc = Arc::new(RegrantLocks {
        calls: Default::default(),
        go: Default::default(),
    });
    let (r, lock, _) = renewal_answered_after_a_regrant(svc, |s| &s.go).await;
    // Answered with generation 2: a renewal of what is held, not a loss.
    assert!(matches!(r, Renewal::Renewed), "{r:?}");
    assert_eq!(lock.held_generation(), Some(2));
}

/// Like [`RegrantLocks`], with renewals the way the metadata leader answers them:
/// a renewal of a generation that is no longer held is refused (`Locked`).
struct StaleRenewLocks {
    calls: std::sync::atomic::AtomicUsize,
    go: tokio::sync::Notify,
}

#[async_trait]
impl LockService for StaleRenewLocks {
    async fn acquire(&self, vdi: &VdiInfo) -> Result<Lease> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(Lease {
            generation: if call == 0 { 1 } else { 2 },
            duration: Duration::from_secs(1),
            ..FreeLocks.acquire(vdi).await?
        })
    }
    async fn renew(&self, vdi: &VdiInfo, generation: u64) -> Result<Lease> {
        self.go.notified().await;
        if generation != 2 {
            return Err(Error::new(
                ErrorKind::Locked,
                format!("it holds generation 2, not {generation}"),
            ));
        }
        Ok(Lease {
            generation: 2,
            duration: Duration::from_secs(1),
            ..FreeLocks.acquire(vdi).await?
        })
    }
    async fn release(&self, _vdi: &VdiInfo, _generation: u64) -> Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn test_a_late_refusal_of_an_older_generation_does_not_retire_the_one_held_now() {
    let svc = Arc::new(StaleRenewLocks {
        calls: Default::default(),
        go: Default::default(),
    });
    let (r, lock, info) = renewal_answered_after_a_regrant(svc.clone(), |s| &s.go).await;
    // Refused as a renewal of generation 1: tried again, not a loss.
    assert!(matches!(r, Renewal::Failed(_)), "{r:?}");
    assert_eq!(lock.held_generation(), Some(2));
    let (g, _guard) = lock.for_write(&info, svc.as_ref()).await.unwrap();
    assert_eq!(g, 2, "still writing with generation 2");
}

/// Grants after `delay` (a slow metadata: a new Raft term, slow fsyncs) and says
/// whether a metadata majority answered lately.
struct SlowLocks {
    delay: Duration,
    majority: bool,
}

#[async_trait]
impl LockService for SlowLocks {
    async fn acquire(&self, vdi: &VdiInfo) -> Result<Lease> {
        tokio::time::sleep(self.delay).await;
        FreeLocks.acquire(vdi).await
    }
    async fn release(&self, _vdi: &VdiInfo, _generation: u64) -> Result<()> {
        Ok(())
    }
    fn majority_recent(&self) -> bool {
        self.majority
    }
}

#[tokio::test]
async fn test_a_write_waits_longer_for_a_slow_majority_than_for_an_absent_one() {
    use crate::lock::ACQUIRE_PATIENCE;
    let slow = ACQUIRE_PATIENCE + Duration::from_millis(1500);
    let write = |majority| async move {
        let locks = Arc::new(SlowLocks {
            delay: slow,
            majority,
        });
        let vol = volume_over(Arc::new(MemStore::new(4 << 20)), locks);
        let t = std::time::Instant::now();
        let res = vol.write(0, Bytes::from(vec![1u8; 4096]), false).await;
        (res, t.elapsed())
    };
    // The majority answers, slowly: the write waits for the grant and succeeds.
    let (res, took) = write(true).await;
    res.unwrap();
    assert!(took >= slow, "{took:?}");
    // No word from a majority: refused after the short patience, not the grant.
    let (res, took) = write(false).await;
    let e = res.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("majority unreachable"), "{e}");
    assert!(took >= ACQUIRE_PATIENCE && took < slow, "{took:?}");
}

/// A semaphore with no permit to begin with.
struct Gate(tokio::sync::Semaphore);

impl Default for Gate {
    fn default() -> Self {
        Gate(tokio::sync::Semaphore::new(0))
    }
}

/// A lock table like the metadata's, for one VDI: a holder asking again gets its
/// own generation back; a release ends the lock and settles its generation.
/// Releases wait at a gate, so that a test can act while one is on its way.
#[derive(Default)]
struct GatedLocks {
    /// (generation held, last generation granted, generation settled).
    table: parking_lot::Mutex<(Option<u64>, u64, u64)>,
    gate: Gate,
    releasing: tokio::sync::Notify,
    asked: tokio::sync::Notify,
    /// Where a new generation is published, as the metadata's catalog does.
    local: std::sync::OnceLock<Arc<LocalStore>>,
}

#[async_trait]
impl LockService for GatedLocks {
    async fn acquire(&self, vdi: &VdiInfo) -> Result<Lease> {
        self.asked.notify_one();
        let mut t = self.table.lock();
        let generation = match t.0 {
            Some(g) => g,
            None => {
                t.1 += 1;
                t.0 = Some(t.1);
                if let Some(local) = self.local.get() {
                    publish(local, vdi, t.1);
                }
                t.1
            }
        };
        Ok(Lease {
            generation,
            duration: Duration::from_secs(60),
            vdi: vdi.id,
            home_zone: vdi.home_zone.clone(),
        })
    }
    async fn release(&self, _vdi: &VdiInfo, generation: u64) -> Result<()> {
        self.releasing.notify_one();
        self.gate.0.acquire().await.unwrap().forget();
        let mut t = self.table.lock();
        if t.0 == Some(generation) {
            t.0 = None;
            t.2 = generation;
        }
        Ok(())
    }
}

/// The last client detaches; while the volume's release of generation 1 is on its
/// way to the metadata, a client attaches again and writes. Granted generation 1
/// again (the metadata still has it held by this node), it wrote under a lock the
/// release then ended, with generation 1 marked settled: its next renewal would
/// find no lock and refuse every write, and a crash would skip the repair of its
/// writes. Now grants wait for the release, and the write takes generation 2.
#[tokio::test]
async fn test_a_client_attaching_while_the_release_at_detach_is_under_way_writes_under_a_new_lock()
{
    let locks = Arc::new(GatedLocks::default());
    let (vol, local) = volume_and_local(Arc::new(MemStore::new(4 << 20)), locks.clone());
    let _ = locks.local.set(local);
    vol.attach();
    vol.write(0, Bytes::from(vec![5u8; 4096]), false)
        .await
        .unwrap();
    assert_eq!(vol.lock.held_generation(), Some(1));
    let releasing = locks.releasing.notified();
    vol.detach();
    releasing.await;

    vol.attach();
    let asked = locks.asked.notified();
    let write = {
        let vol = vol.clone();
        tokio::spawn(async move { vol.write(4096, Bytes::from(vec![6u8; 4096]), true).await })
    };
    // Before the fix the write asked for the lock at once; now it waits for the
    // release (the wait ends either way).
    let _ = tokio::time::timeout(Duration::from_millis(500), asked).await;
    locks.gate.0.add_permits(1);
    write.await.unwrap().unwrap();
    let (held, _, settled) = *locks.table.lock();
    assert_eq!(
        held,
        vol.lock.held_generation(),
        "the volume writes under a lock the metadata holds for it"
    );
    assert!(
        held.is_some_and(|g| g > settled),
        "held {held:?}, settled {settled}"
    );
}
