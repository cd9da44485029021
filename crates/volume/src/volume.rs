//! One VDI served by this node. Every frontend connection to the same VDI on this
//! node shares one [`Volume`], so a FLUSH on any connection covers writes acknowledged
//! on all of them (that is what makes NBD multi-conn correct).
use bytes::{Bytes, BytesMut};
use drove_replica::Gateway;
use drove_types::{Error, ObjectId, Result, VdiInfo};
use futures::future::try_join_all;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::lock::{LockService, WriteLock};
use crate::map::extents;

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
    info: RwLock<VdiInfo>,
    gateway: Arc<Gateway>,
    /// Objects written since the last successful flush.
    dirty: Mutex<BTreeSet<ObjectId>>,
    locks: Arc<dyn LockService>,
    lock: WriteLock,
    /// Clients attached through this node.
    attached: AtomicUsize,
}

impl Volume {
    /// A volume for `info`, doing I/O through `gateway` and taking the VDI's write
    /// lock through `locks`.
    pub fn new(info: VdiInfo, gateway: Arc<Gateway>, locks: Arc<dyn LockService>) -> Arc<Self> {
        Arc::new(Volume {
            info: RwLock::new(info),
            gateway,
            dirty: Mutex::new(BTreeSet::new()),
            locks,
            lock: WriteLock::default(),
            attached: AtomicUsize::new(0),
        })
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
        if let Err(e) = self.flush().await {
            tracing::warn!(vdi = %self.info().name, "flush at detach failed: {e}");
        }
        if self.attached.load(Ordering::SeqCst) != 0 {
            return;
        }
        if let Some(g) = self.lock.detach_all().await {
            let info = self.info();
            if let Err(e) = self.locks.release(&info, g).await {
                tracing::warn!(vdi = %info.name, "releasing the lock failed (it will expire): {e}");
            }
        }
    }

    /// Another node asked for the lock: stop writing, flush, release.
    pub async fn hand_over(&self, to: &str) -> Result<()> {
        let info = self.info();
        if let Some(g) = self.lock.retire_for_handover(&info, to).await {
            self.flush().await?;
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
            let weak = Arc::downgrade(self);
            let svc = self.locks.clone();
            tokio::spawn(async move {
                loop {
                    let period = match weak.upgrade() {
                        Some(v) => v.lock.period(),
                        None => return,
                    };
                    tokio::time::sleep(period).await;
                    let Some(v) = weak.upgrade() else { return };
                    if !v.lock.renew(&v.info(), svc.as_ref()).await {
                        return;
                    }
                }
            });
        }
        Ok(held)
    }

    /// The VDI record as last seen.
    pub fn info(&self) -> VdiInfo {
        match self.info.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Take a newer record (after a resize).
    pub fn set_info(&self, info: VdiInfo) {
        match self.info.write() {
            Ok(mut g) => *g = info,
            Err(p) => *p.into_inner() = info,
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
        let info = self.info();
        Self::check(&info, offset, u64::from(len))?;
        let ex = extents(u64::from(info.object_size), offset, u64::from(len));
        if ex.len() == 1 {
            let e = ex[0];
            let oid = ObjectId::new(info.id, e.index);
            return self.gateway.read(&info, oid, e.offset, len).await;
        }
        let parts = try_join_all(ex.iter().map(|e| {
            let oid = ObjectId::new(info.id, e.index);
            self.gateway.read(&info, oid, e.offset, e.len as u32)
        }))
        .await?;
        let mut out = BytesMut::with_capacity(len as usize);
        for p in parts {
            out.extend_from_slice(&p);
        }
        Ok(out.freeze())
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
                _ = tokio::time::sleep_until(deadline.into()) => {
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
        let info = self.info();
        Self::check(&info, offset, data.len() as u64)?;
        let (generation, _in_flight) = self.write_generation(&info).await?;
        let ex = extents(u64::from(info.object_size), offset, data.len() as u64);
        self.within_lease(try_join_all(ex.iter().map(|e| {
            let oid = ObjectId::new(info.id, e.index);
            let start = e.buf_offset as usize;
            let part = data.slice(start..start + e.len as usize);
            self.gateway
                .write(&info, oid, e.offset, part, fua, generation)
        })))
        .await?;
        self.mark_dirty(&info, &ex, fua);
        Ok(())
    }

    /// Make `[offset, offset+len)` read as zeros (also used for TRIM).
    pub async fn write_zeroes(self: &Arc<Self>, offset: u64, len: u64, fua: bool) -> Result<()> {
        let info = self.info();
        Self::check(&info, offset, len)?;
        let (generation, _in_flight) = self.write_generation(&info).await?;
        let ex = extents(u64::from(info.object_size), offset, len);
        self.within_lease(try_join_all(ex.iter().map(|e| {
            let oid = ObjectId::new(info.id, e.index);
            self.gateway
                .write_zeroes(&info, oid, e.offset, e.len, fua, generation)
        })))
        .await?;
        self.mark_dirty(&info, &ex, fua);
        Ok(())
    }

    /// Record written objects. Done after every replica answered and before the
    /// client is answered, so any write acknowledged before a FLUSH arrives is in the
    /// set that FLUSH takes. FUA writes are durable already.
    fn mark_dirty(&self, info: &VdiInfo, ex: &[crate::map::Extent], fua: bool) {
        if fua {
            return;
        }
        if let Ok(mut d) = self.dirty.lock() {
            d.extend(ex.iter().map(|e| ObjectId::new(info.id, e.index)));
        }
    }

    /// Make every acknowledged write durable on every replica.
    pub async fn flush(&self) -> Result<()> {
        let info = self.info();
        let oids: Vec<ObjectId> = match self.dirty.lock() {
            Ok(mut d) => std::mem::take(&mut *d).into_iter().collect(),
            Err(_) => return Err(Error::invalid("Dirty set poisoned")),
        };
        if oids.is_empty() {
            return Ok(());
        }
        let res = self.gateway.flush(&info, &oids).await;
        if res.is_err() {
            // Not durable: keep them for the next flush.
            if let Ok(mut d) = self.dirty.lock() {
                d.extend(oids);
            }
        }
        res
    }

    /// Allocation of `[offset, offset+len)`, object by object: an object never
    /// written is a hole. Runs of equal state are merged.
    pub async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Allocation>> {
        let info = self.info();
        Self::check(&info, offset, len)?;
        let ex = extents(u64::from(info.object_size), offset, len);
        let oids: Vec<ObjectId> = ex.iter().map(|e| ObjectId::new(info.id, e.index)).collect();
        let flags = self.gateway.exists(&info, &oids).await?;
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
