//! One VDI served by this node. Every frontend connection to the same VDI on this
//! node shares one [`Volume`], so a FLUSH on any connection covers writes acknowledged
//! on all of them (that is what makes NBD multi-conn correct).
use bytes::{Bytes, BytesMut};
use drove_replica::Gateway;
use drove_types::{Error, ErrorKind, ObjectId, Result, VdiInfo};
use futures::future::try_join_all;
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::cow::{Cow, Source};
use crate::lock::{LockService, Renewal, WriteLock};
use crate::map::{extents, Extent};
use crate::torn::Torn;

/// How long a write waits for this node to apply a snapshot that moved the VDI's
/// lock to a new id before it gives up.
const NEW_ID_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);
/// The waits before the flush at detach is tried again (then the lock is left to
/// expire unreleased).
const DETACH_SYNC_RETRIES: [std::time::Duration; 3] = [
    std::time::Duration::from_secs(1),
    std::time::Duration::from_secs(2),
    std::time::Duration::from_secs(4),
];

/// Allocation of a run of bytes, for NBD block status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Length of the run.
    pub len: u64,
    /// False: never written (a hole, reads as zeros).
    pub allocated: bool,
}

/// A VDI as a disk.
pub struct Volume {
    /// The record, and the frozen parents of a clone nearest first (empty for a VDI
    /// of its own): one lock, so a reader never pairs a new id with old parents.
    view: RwLock<(VdiInfo, Vec<VdiInfo>)>,
    cow: Cow,
    gateway: Arc<Gateway>,
    /// Objects written since the last successful flush.
    dirty: Mutex<BTreeSet<ObjectId>>,
    /// Ranges whose last write failed and may differ between replicas.
    torn: Torn,
    locks: Arc<dyn LockService>,
    lock: WriteLock,
    /// Clients attached through this node.
    attached: AtomicUsize,
    /// The VDI was deleted (or rolled back): every I/O fails from now on.
    gone: std::sync::atomic::AtomicBool,
    /// Its I/O limits, which frontends hold their clients to ([`Volume::admit`]).
    throttle: crate::Throttle,
}

impl Volume {
    /// A volume for `info` (a clone reads through `parents`, nearest first), doing
    /// I/O through `gateway` and taking the VDI's write lock through `locks`.
    pub fn new(
        info: VdiInfo,
        parents: Vec<VdiInfo>,
        gateway: Arc<Gateway>,
        locks: Arc<dyn LockService>,
    ) -> Arc<Self> {
        Arc::new(Volume {
            throttle: crate::Throttle::new(info.qos),
            view: RwLock::new((info, parents)),
            cow: Cow::default(),
            gateway,
            dirty: Mutex::new(BTreeSet::new()),
            torn: Torn::default(),
            locks,
            lock: WriteLock::default(),
            attached: AtomicUsize::new(0),
            gone: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The VDI was deleted or rolled back under its clients: their I/O fails with
    /// `Gone` from now on (a clone would otherwise go on reading its parent's data,
    /// and a deleted VDI's collected objects would read as zeros).
    pub fn set_gone(&self) {
        self.gone.store(true, Ordering::SeqCst);
    }

    fn not_gone(&self, info: &VdiInfo) -> Result<()> {
        if self.gone.load(Ordering::SeqCst) {
            return Err(Error::new(
                ErrorKind::Gone,
                format!("VDI '{}' was deleted or rolled back", info.name),
            ));
        }
        Ok(())
    }

    /// A client attached.
    pub fn attach(&self) {
        self.attached.fetch_add(1, Ordering::SeqCst);
    }

    /// A client detached; the last one out flushes and gives the lock up.
    pub fn detach(self: &Arc<Self>) {
        if self.attached.fetch_sub(1, Ordering::SeqCst) == 1 {
            let me = self.clone();
            tokio::spawn(async move { me.release_if_idle().await });
        }
    }

    async fn release_if_idle(&self) {
        // The copies in other zones get every write before the lock goes: a next
        // writer's lock generation would fence what is still queued here. A failed
        // flush is tried again a few times (the lease is renewed meanwhile).
        // Deleted, or the lock moved on: nothing is left to bring up to date.
        let moot = |e: &Error| matches!(e.kind(), ErrorKind::Gone | ErrorKind::Fenced);
        let mut synced = self.mend_and_sync().await;
        for wait in DETACH_SYNC_RETRIES {
            let Err(e) = &synced else { break };
            if moot(e) {
                break;
            }
            if self.attached.load(Ordering::SeqCst) != 0 {
                return;
            }
            tracing::warn!(vdi = %self.info().name, "flush at detach failed, again in {wait:?}: {e}");
            tokio::time::sleep(wait).await;
            synced = self.mend_and_sync().await;
        }
        if self.attached.load(Ordering::SeqCst) != 0 {
            return;
        }
        if let Some(g) = self.lock.detach_all().await {
            let info = self.info();
            if let Err(e) = synced {
                if moot(&e) {
                    tracing::debug!(vdi = %info.name, "not released at detach: {e}");
                    return;
                }
                // A release says "every copy has every write, durably" (the next
                // writer skips the repair of generation g): not true now. The lock
                // is left to run out instead; the next writer repairs first.
                tracing::error!(
                    vdi = %info.name,
                    "flush at detach failed ({e}): the lock is not released but left to \
                     expire, so that the next writer brings the copies up to date first"
                );
                return;
            }
            // A client that attached since may write under g (the metadata grants
            // this node its own generation again while the lock is held), or wrote
            // before the drain: g is then not released (a release would end the
            // lock it writes under, and tell the next writer that g's writes are on
            // every copy, durably). Grants wait until the release is committed; one
            // after it takes a new generation.
            let _no_grant = self.lock.hold_grants().await;
            if self.attached.load(Ordering::SeqCst) != 0
                || self.lock.has_lease()
                || !self.torn.objects().is_empty()
                || !self.dirty.lock().is_empty()
            {
                tracing::debug!(vdi = %info.name, "a client attached during the detach: the lock is kept");
                return;
            }
            if let Err(e) = self.locks.release(&info, g).await {
                tracing::warn!(vdi = %info.name, "releasing the lock failed (it will expire): {e}");
            } else if info.ephemeral {
                if let Err(e) = self.locks.last_writer_gone(&info).await {
                    tracing::warn!(vdi = %info.name, "deleting the ephemeral clone failed: {e}");
                }
            }
        }
    }

    /// Another node asked for the lock: stop writing, flush, release.
    pub async fn hand_over(&self, to: &str) -> Result<()> {
        let info = self.info();
        if let Some(g) = self.lock.retire_for_handover(&info, to).await {
            self.mend_torn(g, false).await?;
            self.sync().await?;
            self.locks.release(&info, g).await?;
            tracing::info!(vdi = %info.name, %to, "lock handed over");
        }
        Ok(())
    }

    /// Take the write lock if needed and keep it renewed while clients are attached.
    async fn write_generation(
        self: &Arc<Self>,
        info: &VdiInfo,
    ) -> Result<(u64, tokio::sync::RwLockReadGuard<'_, ()>)> {
        let held = self.lock.for_write(info, self.locks.as_ref()).await?;
        if self.lock.start_renewing() {
            tokio::spawn(Self::keep_renewing(
                Arc::downgrade(self),
                self.locks.clone(),
            ));
        }
        Ok(held)
    }

    /// Renew the write lease while it is held: an attempt once the lease is a third
    /// of the way through, and while none has answered, another every
    /// [`attempt_limit`](WriteLock::attempt_limit) beside those still waiting
    /// (any answer extends the lease; metadata commits can take seconds on a
    /// machine whose disk and CPUs are busy with the VMs' writes). Failures are
    /// logged when they begin and when a renewal succeeds again.
    async fn keep_renewing(weak: std::sync::Weak<Volume>, svc: Arc<dyn LockService>) {
        let failed = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut last_try: Option<drove_types::clock::Instant> = None;
        loop {
            let Some(v) = weak.upgrade() else { return };
            let (tick, limit, lease) = (
                v.lock.period() / 4,
                v.lock.attempt_limit(),
                v.lock.period() * 3,
            );
            match v.lock.renewal_due() {
                None => return,
                Some(true) if last_try.is_none_or(|t| t.elapsed() >= limit) => {
                    last_try = Some(drove_types::clock::Instant::now());
                    let (v, svc, failed) = (v.clone(), svc.clone(), failed.clone());
                    tokio::spawn(async move {
                        let info = v.info();
                        let res =
                            tokio::time::timeout(lease, v.lock.renew(&info, svc.as_ref())).await;
                        let why = match res {
                            Ok(Renewal::Renewed) => {
                                let before = failed.swap(0, Ordering::SeqCst);
                                if before > 0 {
                                    tracing::info!(vdi = %info.name, failed = before, "write lease renewed again");
                                }
                                return;
                            }
                            Ok(Renewal::Stop) => return,
                            Ok(Renewal::Failed(e)) => e.to_string(),
                            Err(_) => format!("no answer within {lease:?}"),
                        };
                        if failed.fetch_add(1, Ordering::SeqCst) == 0 {
                            tracing::warn!(vdi = %info.name, "write lease renewal failed, trying again until the lease ends: {why}");
                        }
                    });
                }
                Some(_) => {}
            }
            drop(v);
            tokio::time::sleep(tick).await;
        }
    }

    /// The VDI record as last seen.
    pub fn info(&self) -> VdiInfo {
        self.view.read().0.clone()
    }

    /// The record and the parents, as one consistent view.
    fn view(&self) -> (VdiInfo, Vec<VdiInfo>) {
        self.view.read().clone()
    }

    /// Take a newer record: a resize, or a snapshot that froze this volume's id as
    /// its parent and gave it a new one.
    pub fn set_info(&self, info: VdiInfo, parents: Vec<VdiInfo>) {
        let old = self.info();
        if info.id != old.id && info.parent == Some(old.id) {
            self.cow.froze(old.id);
            // The snapshot moved the lock (same generation) to the new id.
            if self.lock.vdi() == old.id {
                self.lock.set_vdi(info.id);
            }
        }
        self.throttle.set(info.qos);
        *self.view.write() = (info, parents);
    }

    /// Wait until a client's request of `bytes` bytes going `dir` is within the
    /// VDI's I/O limits ([`drove_types::Qos`]; all clients here share them).
    /// Frontends call it before each request; the volume's own work (imports,
    /// flattening, repair) is not held back. How long the request waited.
    pub async fn admit(&self, dir: crate::Direction, bytes: u64) -> std::time::Duration {
        self.throttle.admit(dir, bytes).await
    }

    /// Take a snapshot between two writes: new writes wait, those in flight finish,
    /// everything acknowledged is flushed, then `propose` freezes the current id in
    /// the metadata and returns the VDI's new record (and parents), which this
    /// volume writes to from then on. A FLUSH boundary, hence crash-consistent.
    pub async fn snapshot_with<F, Fut>(&self, propose: F) -> Result<VdiInfo>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(VdiInfo, Vec<VdiInfo>)>>,
    {
        let _paused = self.lock.pause().await;
        if let Some(g) = self.lock.held_generation() {
            self.mend_torn(g, true).await?;
        }
        self.sync().await?;
        let (info, parents) = propose().await?;
        self.set_info(info.clone(), parents);
        Ok(info)
    }

    /// The view to write under the lock just taken. The lock names the VDI id it
    /// covers: after a snapshot this node has not applied yet, that is a newer id
    /// than the volume's, and writing to the old one would change the snapshot.
    async fn view_for_lock(&self) -> Result<(VdiInfo, Vec<VdiInfo>)> {
        let want = self.lock.vdi();
        let home = self.lock.home_zone();
        let deadline = tokio::time::Instant::now() + NEW_ID_PATIENCE;
        loop {
            let view = self.view();
            // The first grant gives the VDI its home zone, which places its objects:
            // write only once this node's record shows it.
            let placed = home.is_none() || view.0.home_zone == home;
            if (want == drove_types::VdiId::default() || view.0.id == want) && placed {
                return Ok(view);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::unavailable(format!(
                    "VDI '{}' moved to id {want} (a snapshot or rollback) or got its home zone \
                     {home:?}, and this node has not caught up",
                    view.0.name
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    fn check(info: &VdiInfo, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= info.size => Ok(()),
            _ => Err(Error::invalid(format!(
                "Range {offset}+{len} is past the end of VDI '{}' ({} bytes)",
                info.name, info.size
            ))),
        }
    }

    /// Read `len` bytes at `offset`; objects are read in parallel.
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes> {
        let (info, parents) = self.view();
        self.not_gone(&info)?;
        Self::check(&info, offset, u64::from(len))?;
        let ex = extents(u64::from(info.object_size), offset, u64::from(len));
        if ex.len() == 1 {
            return self.read_extent(&info, &parents, ex[0]).await;
        }
        let parts = try_join_all(ex.iter().map(|e| self.read_extent(&info, &parents, *e))).await?;
        let mut out = BytesMut::with_capacity(len as usize);
        for p in parts {
            out.extend_from_slice(&p);
        }
        Ok(out.freeze())
    }

    /// One object's part of a read: from the VDI itself, or for a clone from the
    /// nearest parent that has the object.
    async fn read_extent(&self, info: &VdiInfo, parents: &[VdiInfo], e: Extent) -> Result<Bytes> {
        let from = if info.parent.is_none() {
            info.clone()
        } else {
            let held = self.lock.held_generation();
            match self
                .cow
                .source(&self.gateway, info, parents, e.index, held)
                .await?
            {
                Source::Vdi(v) => *v,
                Source::Zeros => return Ok(Bytes::from(vec![0u8; e.len as usize])),
            }
        };
        let oid = ObjectId::new(from.id, e.index);
        self.gateway.read(&from, oid, e.offset, e.len as u32).await
    }

    /// One object's part of a write (`data`) or zeroing (`None`). A clone's object
    /// that only a parent has is copied up first, merged with this write.
    async fn write_extent(
        &self,
        info: &VdiInfo,
        parents: &[VdiInfo],
        e: Extent,
        data: Option<Bytes>,
        fua: bool,
        generation: u64,
    ) -> Result<()> {
        let oid = ObjectId::new(info.id, e.index);
        if info.parent.is_some()
            && self
                .copy_up(info, parents, e, data.as_ref(), fua, generation)
                .await?
        {
            return Ok(());
        }
        match data {
            Some(d) => {
                self.gateway
                    .write(info, oid, e.offset, d, fua, generation)
                    .await?
            }
            None => {
                self.gateway
                    .write_zeroes(info, oid, e.offset, e.len, fua, generation)
                    .await?
            }
        }
        if info.parent.is_some() {
            self.cow.created(oid);
        }
        Ok(())
    }

    /// Copy object `e.index` up from the parent that has it, with this write merged
    /// in, as one atomic create on each replica. False when there is nothing to copy
    /// (the clone has the object, or no parent has it): the caller writes normally.
    async fn copy_up(
        &self,
        info: &VdiInfo,
        parents: &[VdiInfo],
        e: Extent,
        data: Option<&Bytes>,
        fua: bool,
        generation: u64,
    ) -> Result<bool> {
        let g = Some(generation);
        let gw = &self.gateway;
        let owned = |s: &Source| matches!(s, Source::Vdi(v) if v.id == info.id);
        if owned(&self.cow.source(gw, info, parents, e.index, g).await?) {
            return Ok(false);
        }
        let _one = self.cow.stripe(e.index).lock().await;
        // Another write may have copied it up while this one waited.
        let from = match self.cow.source(gw, info, parents, e.index, g).await? {
            Source::Vdi(v) if v.id == info.id => return Ok(false),
            Source::Vdi(v) => v,
            // Zeroing what no one wrote stores nothing; a write creates the object.
            Source::Zeros => return Ok(data.is_none()),
        };
        let whole = u64::from(info.object_size);
        let mut buf = if e.offset == 0 && e.len == whole {
            BytesMut::zeroed(whole as usize)
        } else {
            let base = gw
                .read(&from, ObjectId::new(from.id, e.index), 0, info.object_size)
                .await?;
            BytesMut::from(&base[..])
        };
        let range = e.offset as usize..(e.offset + e.len) as usize;
        match data {
            Some(d) => buf[range].copy_from_slice(d),
            None => buf[range].fill(0),
        }
        let oid = ObjectId::new(info.id, e.index);
        gw.create(info, oid, buf.freeze(), generation).await?;
        self.cow.created(oid);
        if fua {
            gw.flush(info, &[oid]).await?;
        }
        Ok(true)
    }

    /// Whether this node holds the VDI's write lock now.
    pub fn holds_lock(&self) -> bool {
        self.lock.held_generation().is_some()
    }

    /// Flatten: copy every object the VDI still reads from its parents into its own
    /// id, a few at a time under the write lock, then flush. Returns the objects
    /// copied. The caller then records in the metadata that the VDI has no parent
    /// any more.
    pub async fn copy_up_all(self: &Arc<Self>) -> Result<u64> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let total = self.info().object_count();
        let copied: Vec<bool> = stream::iter(0..total)
            .map(|index| async move {
                let info = self.info();
                let (generation, _in_flight) = self.write_generation(&info).await?;
                let (info, parents) = self.view_for_lock().await?;
                let e = Extent {
                    index: index as u32,
                    offset: 0,
                    len: 0,
                    buf_offset: 0,
                };
                let empty = Bytes::new();
                let up = info.parent.is_some()
                    && self
                        .within_lease(self.copy_up(
                            &info,
                            &parents,
                            e,
                            Some(&empty),
                            false,
                            generation,
                        ))
                        .await?;
                if up {
                    self.mark_dirty(&info, &[e], false);
                }
                Ok::<bool, Error>(up)
            })
            .buffer_unordered(4)
            .try_collect()
            .await?;
        self.flush().await?;
        Ok(copied.iter().filter(|&&c| c).count() as u64)
    }

    fn read_only(info: &VdiInfo) -> Result<()> {
        if info.snapshot {
            return Err(Error::new(
                ErrorKind::Locked,
                format!(
                    "'{}' is a snapshot and read-only: clone it to write (drove vdi clone {} NEW)",
                    info.name, info.name
                ),
            ));
        }
        Ok(())
    }

    /// Run a write, failing it if the lease it was admitted under runs out first
    /// (renewals push the deadline out). A gateway cut off from the metadata thus
    /// stops acknowledging writes within its lease, however long replicas take.
    async fn within_lease<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        tokio::pin!(fut);
        loop {
            let Some(deadline) = self.lock.write_deadline() else {
                return Err(Error::new(
                    drove_types::ErrorKind::Locked,
                    format!(
                        "VDI '{}': the write lock was lost during the write",
                        self.info().name
                    ),
                ));
            };
            tokio::select! {
                res = &mut fut => return res,
                _ = tokio::time::sleep_until(deadline) => {
                    if self.lock.write_deadline().is_some_and(|d| d > deadline) {
                        continue;
                    }
                    return Err(Error::unavailable(format!(
                        "VDI '{}': the write did not complete within the write lock's lease",
                        self.info().name
                    )));
                }
            }
        }
    }

    /// Write `data` at `offset` on every replica; with `fua`, durably.
    pub async fn write(self: &Arc<Self>, offset: u64, data: Bytes, fua: bool) -> Result<()> {
        self.write_fenced(offset, data, fua).await.map(|_| ())
    }

    /// [`Volume::write`], answering the lock generation the write carried (the
    /// simulator checks it against the metadata's lock holder at that moment).
    pub async fn write_fenced(
        self: &Arc<Self>,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> Result<u64> {
        let info = self.info();
        self.not_gone(&info)?;
        Self::read_only(&info)?;
        Self::check(&info, offset, data.len() as u64)?;
        let (generation, _in_flight) = self.write_generation(&info).await?;
        let (info, parents) = self.view_for_lock().await?;
        let ex = extents(u64::from(info.object_size), offset, data.len() as u64);
        let res = self
            .within_lease(try_join_all(ex.iter().map(|e| {
                let start = e.buf_offset as usize;
                let part = data.slice(start..start + e.len as usize);
                self.write_extent(&info, &parents, *e, Some(part), fua, generation)
            })))
            .await;
        self.written(&info, &ex, fua, res.map(|_| ()))
            .map(|()| generation)
    }

    /// Make `[offset, offset+len)` read as zeros (also used for TRIM).
    pub async fn write_zeroes(self: &Arc<Self>, offset: u64, len: u64, fua: bool) -> Result<()> {
        let info = self.info();
        self.not_gone(&info)?;
        Self::read_only(&info)?;
        Self::check(&info, offset, len)?;
        let (generation, _in_flight) = self.write_generation(&info).await?;
        let (info, parents) = self.view_for_lock().await?;
        let ex = extents(u64::from(info.object_size), offset, len);
        let res = self
            .within_lease(try_join_all(ex.iter().map(|e| {
                self.write_extent(&info, &parents, *e, None, fua, generation)
            })))
            .await;
        self.written(&info, &ex, fua, res.map(|_| ()))
    }

    /// Book a write of `ex` that ended with `res`: written objects are dirty until
    /// the next flush; a failed write's bytes are torn (see [`crate::torn`]).
    fn written(&self, info: &VdiInfo, ex: &[Extent], fua: bool, res: Result<()>) -> Result<()> {
        match res {
            Ok(()) => {
                self.torn.cover(ex);
                self.mark_dirty(info, ex, fua);
                Ok(())
            }
            Err(e) => {
                self.torn.record(ex);
                Err(e)
            }
        }
    }

    /// Make every object a failed write may have left different on its replicas
    /// identical again, under lock generation `generation`: read whole from one
    /// replica, written whole to all. Before the lock is given up cleanly, since
    /// a release tells the next writer that every copy has every write.
    ///
    /// No client write of an object may come between its read and its write back:
    /// the older bytes read would overwrite it. Client writes wait meanwhile (one
    /// object's read and write), unless `paused`: the caller stopped them already.
    /// Without that, a client attaching again while the last one's detach was
    /// mending lost an acknowledged 4 MiB on every replica (e2e_heal's full-disk
    /// test on a busy machine: 10 runs of 21; crates/sim/tests/torn.rs).
    async fn mend_torn(&self, generation: u64, paused: bool) -> Result<()> {
        let torn = self.torn.objects();
        if torn.is_empty() {
            return Ok(());
        }
        let (info, parents) = self.view();
        tracing::info!(vdi = %info.name, objects = torn.len(), "making the objects of failed writes identical on every replica");
        let os = u64::from(info.object_size);
        for index in torn {
            let _writes_wait = if paused {
                None
            } else {
                Some(self.lock.pause().await)
            };
            // A client write since may have covered every torn range.
            if !self.torn.is_torn(index) {
                continue;
            }
            let start = u64::from(index) * os;
            if start >= info.size {
                self.torn.mended(index);
                continue;
            }
            let e = Extent {
                index,
                offset: 0,
                len: os.min(info.size - start),
                buf_offset: 0,
            };
            let data = self.read_extent(&info, &parents, e).await?;
            self.write_extent(&info, &parents, e, Some(data), true, generation)
                .await?;
            self.torn.mended(index);
        }
        Ok(())
    }

    /// [`Volume::mend_torn`] under the lock held now (none held: nothing can be
    /// mended, and the caller keeps the lock from being released), then
    /// [`Volume::sync`].
    async fn mend_and_sync(&self) -> Result<drove_replica::Lag> {
        if !self.torn.objects().is_empty() {
            let g = self.lock.held_generation().ok_or_else(|| {
                Error::unavailable(format!(
                    "VDI '{}': failed writes left replicas to make identical, and the lease is gone",
                    self.info().name
                ))
            })?;
            self.mend_torn(g, false).await?;
        }
        self.sync().await
    }

    /// Record written objects. Done after every replica answered and before the
    /// client is answered, so any write acknowledged before a FLUSH arrives is in the
    /// set that FLUSH takes. FUA writes are durable already.
    fn mark_dirty(&self, info: &VdiInfo, ex: &[Extent], fua: bool) {
        if fua {
            return;
        }
        self.dirty
            .lock()
            .extend(ex.iter().map(|e| ObjectId::new(info.id, e.index)));
    }

    /// Make every acknowledged write durable on every replica.
    pub async fn flush(&self) -> Result<()> {
        let info = self.info();
        self.not_gone(&info)?;
        let oids: Vec<ObjectId> = std::mem::take(&mut *self.dirty.lock())
            .into_iter()
            .collect();
        if oids.is_empty() {
            return Ok(());
        }
        let res = self.gateway.flush(&info, &oids).await;
        if res.is_err() {
            // Not durable: keep them for the next flush.
            self.dirty.lock().extend(oids);
        }
        res
    }

    /// Flush, then wait until the copies outside the home zone have every write
    /// acknowledged so far and have made it durable (zone-sync; for `sync` VDIs a
    /// flush). Returns the lag left behind by writes that came in meanwhile.
    pub async fn sync(&self) -> Result<drove_replica::Lag> {
        self.flush().await?;
        let info = self.info();
        self.gateway.drain(&info).await?;
        Ok(self.gateway.lag(info.id))
    }

    /// The VDI's zone-sync lag on this node (zero where it is not written).
    pub fn lag(&self) -> drove_replica::Lag {
        self.gateway.lag(self.info().id)
    }

    /// Allocation of `[offset, offset+len)`, object by object: an object never
    /// written is a hole. Runs of equal state are merged.
    pub async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Allocation>> {
        let (info, parents) = self.view();
        self.not_gone(&info)?;
        Self::check(&info, offset, len)?;
        let ex = extents(u64::from(info.object_size), offset, len);
        let flags = if info.parent.is_none() {
            let oids: Vec<ObjectId> = ex.iter().map(|e| ObjectId::new(info.id, e.index)).collect();
            self.gateway.exists(&info, &oids).await?
        } else {
            let held = self.lock.held_generation();
            let found = try_join_all(ex.iter().map(|e| {
                self.cow
                    .source(&self.gateway, &info, &parents, e.index, held)
            }))
            .await?;
            found.iter().map(|s| matches!(s, Source::Vdi(_))).collect()
        };
        let mut out: Vec<Allocation> = Vec::new();
        for (e, allocated) in ex.iter().zip(flags) {
            match out.last_mut() {
                Some(last) if last.allocated == allocated => last.len += e.len,
                _ => out.push(Allocation {
                    len: e.len,
                    allocated,
                }),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
#[path = "volume_tests.rs"]
mod tests;
