//! Applying a peer request to this node's object store. The store is synchronous
//! (pread/pwrite/fsync), so every call runs on tokio's blocking pool, but those of a
//! store that never blocks (in memory).
use bytes::Bytes;
use drove_objstore::ObjectStore;
use drove_proto::{ObjDigest, PeerReq, PeerResp, MAX_OIDS};
use drove_types::{Epoch, Error, ErrorKind, NodeId, ObjVersion, ObjectId, Result, VdiInfo};
use futures::future::join_all;
use std::sync::{Arc, OnceLock, Weak};
use tokio::sync::OwnedRwLockReadGuard;

use crate::catalog::CatalogCell;
use crate::catchup::{CatchUp, Repair};
use crate::Transport;

/// Writes up to this size without FUA are done on the calling task.
const INLINE_MAX: usize = 64 << 10;

/// Run `f` against the store on the blocking pool (on this task for a store that
/// [never blocks](ObjectStore::never_blocks)).
pub async fn blocking<T: Send + 'static>(
    store: &Arc<dyn ObjectStore>,
    f: impl FnOnce(&dyn ObjectStore) -> Result<T> + Send + 'static,
) -> Result<T> {
    if store.never_blocks() {
        return f(store.as_ref());
    }
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(store.as_ref()))
        .await
        .map_err(|e| Error::new(ErrorKind::Io, format!("Store task failed: {e}")))?
}

/// This node's object store with what it knows of the metadata (to judge requests)
/// and its catch-up state: what every request that reaches this node, from a peer or
/// from its own gateway, is checked against and applied to.
pub struct LocalStore {
    /// This run of the node's process (0: not told).
    incarnation: u64,
    store: Arc<dyn ObjectStore>,
    catalog: CatalogCell,
    catchup: CatchUp,
    repair: OnceLock<Weak<dyn Repair>>,
    /// When the last client read or write (not recovery's) was applied here:
    /// recovery yields to them.
    client_seen: ClientClock,
}

/// The time of the last client operation, as milliseconds since the clock's start
/// plus one (0: none yet), so that an operation costs one atomic store.
struct ClientClock {
    start: tokio::time::Instant,
    last_ms: std::sync::atomic::AtomicU64,
}

impl ClientClock {
    fn new() -> Self {
        ClientClock {
            start: tokio::time::Instant::now(),
            last_ms: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    fn tick(&self) {
        self.last_ms
            .store(self.now_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    fn since_last(&self) -> Option<std::time::Duration> {
        match self.last_ms.load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            last => Some(std::time::Duration::from_millis(
                self.now_ms().saturating_sub(last),
            )),
        }
    }
}

impl LocalStore {
    /// Wrap `store`, every copy current (no recovery: tests and single nodes).
    pub fn new(store: Arc<dyn ObjectStore>) -> Arc<Self> {
        Self::with_catchup(store, CatchUp::all_current())
    }

    /// Wrap `store` with the catch-up state recovery maintains.
    pub fn with_catchup(store: Arc<dyn ObjectStore>, catchup: CatchUp) -> Arc<Self> {
        Self::for_run(store, catchup, 0)
    }

    /// [`LocalStore::with_catchup`] for the run `incarnation` of the node's process
    /// (random at every start; the write locks it takes carry it): a ping is
    /// answered with it, so a node can tell a lock holder's own run from a later
    /// one that restarted since.
    pub fn for_run(store: Arc<dyn ObjectStore>, catchup: CatchUp, incarnation: u64) -> Arc<Self> {
        Arc::new(LocalStore {
            incarnation,
            store,
            catalog: CatalogCell::default(),
            catchup,
            repair: OnceLock::new(),
            client_seen: ClientClock::new(),
        })
    }

    /// Who recovers a pending object when a write reaches it (set once at start-up).
    pub fn set_repair(&self, repair: Weak<dyn Repair>) {
        let _ = self.repair.set(repair);
    }

    /// The object store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The metadata this node checks requests against (VDIs, lock generations, map);
    /// nothing is admitted until the first one is published.
    pub fn catalog(&self) -> &CatalogCell {
        &self.catalog
    }

    /// How long ago the last client read or write was applied here (None: none
    /// yet), to the millisecond.
    pub fn since_client_op(&self) -> Option<std::time::Duration> {
        self.client_seen.since_last()
    }

    /// Which copies here are current, and the epoch caught up with.
    pub fn catchup(&self) -> &CatchUp {
        &self.catchup
    }

    fn not_current(oid: ObjectId) -> Error {
        Error::new(
            ErrorKind::Recovering,
            format!("This node's copy of object {oid} is being recovered"),
        )
    }

    /// The record of `oid`'s VDI, checking that `[offset, offset + len)` lies in the
    /// object: a request may not name a VDI that does not exist or bytes past an
    /// object's end.
    async fn vdi_for(&self, oid: ObjectId, offset: u64, len: u64) -> Result<VdiInfo> {
        let vdi = self.catalog.vdi(oid.vdi).await?;
        match offset.checked_add(len) {
            Some(end) if end <= u64::from(vdi.object_size) => Ok(vdi),
            _ => Err(Error::invalid(format!(
                "Range {offset}+{len} is outside object {oid} ({} bytes)",
                vdi.object_size
            ))),
        }
    }

    /// Check that `oids` is a list a request may carry and that every object's VDI
    /// exists and has objects of `len` bytes (`None`: any size).
    async fn check_oids(&self, oids: &[ObjectId], len: Option<u32>) -> Result<()> {
        check_count(oids)?;
        let mut seen = std::collections::BTreeSet::new();
        for oid in oids {
            if seen.insert(oid.vdi) {
                let vdi = self.catalog.vdi(oid.vdi).await?;
                if len.is_some_and(|l| l != vdi.object_size) {
                    return Err(Error::invalid(format!(
                        "Objects of VDI {} are {} bytes, not {}",
                        oid.vdi,
                        vdi.object_size,
                        len.unwrap_or(0)
                    )));
                }
            }
        }
        Ok(())
    }

    /// Admit a write (or zero, or create) of `oid` from the gateway holding lock
    /// `generation` on a map of `epoch`: refuse an older generation (fencing), then
    /// hold the object, recovering a pending copy first.
    async fn admit_write(
        &self,
        oid: ObjectId,
        epoch: Epoch,
        generation: u64,
    ) -> Result<OwnedRwLockReadGuard<()>> {
        self.catalog.admit_generation(oid.vdi, generation).await?;
        self.catchup.admit_epoch(epoch, true).await?;
        let mut confirmed = false;
        loop {
            let guard = self.catchup.write_lock(oid).await;
            if self.catchup.is_current(oid) {
                if confirmed || self.store.exists(oid)? {
                    return Ok(guard);
                }
                drop(guard);
                self.confirm_absent(oid, epoch).await?;
                confirmed = true;
                continue;
            }
            drop(guard);
            self.repair_now(oid).await?;
        }
    }

    /// The recovery engine, once set and while it lives.
    fn repairer(&self) -> Option<Arc<dyn Repair>> {
        self.repair.get().and_then(Weak::upgrade)
    }

    /// Recover this node's pending copy of `oid` now, before a request that
    /// needs it current; without a recovery engine the copy stays not current.
    async fn repair_now(&self, oid: ObjectId) -> Result<()> {
        match self.repairer() {
            Some(r) => r.repair(oid).await,
            None => Err(Self::not_current(oid)),
        }
    }

    /// Admit a flush of `oid`: a FLUSH answered says every write this node took
    /// before it is durable here, which a pending copy cannot say (its host may
    /// have lost power since, and its unflushed writes with it), so the copy is
    /// recovered first, as before a write. Answered from a copy a power loss had set
    /// back, a FLUSH counted write 799 durable on node 9, which had lost it, and
    /// after the whole site lost power every copy took node 9's (`drove sim faults
    /// --seed 265`).
    async fn admit_flush(&self, oid: ObjectId) -> Result<()> {
        if self.catchup.is_current(oid) {
            return Ok(());
        }
        self.repair_now(oid).await
    }

    /// Whether this node's copy of `oid` is current as far as it knows: not pending
    /// and, when it has no copy at all (`present` false), its absence known
    /// ([`Repair::absence_known`]).
    fn knows_current(&self, oid: ObjectId, present: bool) -> bool {
        self.catchup.is_current(oid)
            && (present
                || self
                    .repairer()
                    .is_none_or(|r| r.absence_known(oid, self.catchup.epoch())))
    }

    /// Make sure of the absence of `oid`, of which this node has no copy
    /// ([`Repair::confirm_absent`]).
    async fn confirm_absent(&self, oid: ObjectId, epoch: Epoch) -> Result<()> {
        match self.repairer() {
            Some(r) => r.confirm_absent(oid, epoch).await,
            None => Ok(()),
        }
    }

    /// Admit a read of `oid`: its copy here must be current, and a missing copy's
    /// absence known (made sure of first).
    async fn admit_read(&self, oid: ObjectId, epoch: Epoch) -> Result<()> {
        if self.catchup.is_current(oid) && !self.store.exists(oid)? {
            self.confirm_absent(oid, epoch).await?;
        }
        if !self.catchup.is_current(oid) {
            return Err(Self::not_current(oid));
        }
        Ok(())
    }

    /// Apply `req` (with its `payload`) here. Forwarding is not done here.
    pub async fn apply(&self, req: &PeerReq, payload: Bytes) -> Result<(PeerResp, Bytes)> {
        let store = &self.store;
        if matches!(
            req,
            PeerReq::Read { .. }
                | PeerReq::Write { .. }
                | PeerReq::WriteZeroes { .. }
                | PeerReq::Create { .. }
                | PeerReq::Flush { .. }
        ) {
            self.client_seen.tick();
        }
        match req {
            PeerReq::Ping { .. } => Ok((
                PeerResp::Pong {
                    incarnation: self.incarnation,
                },
                Bytes::new(),
            )),
            &PeerReq::Read {
                oid,
                offset,
                len,
                epoch,
            } => {
                self.vdi_for(oid, offset, u64::from(len)).await?;
                self.catchup.admit_epoch(epoch, true).await?;
                self.admit_read(oid, epoch).await?;
                let data = blocking(store, move |s| s.read_bytes(oid, offset, len)).await?;
                Ok((PeerResp::Data, data))
            }
            &PeerReq::Write {
                oid,
                offset,
                fua,
                epoch,
                generation,
                made,
                ..
            } => {
                self.vdi_for(oid, offset, payload.len() as u64).await?;
                let v = version(epoch, made, generation)?;
                let _held = self.admit_write(oid, epoch, generation).await?;
                if !fua && payload.len() <= INLINE_MAX {
                    // A small write without FUA lands in the page cache and takes a few
                    // microseconds; handing it to the blocking pool and back costs more
                    // than that in thread wake-ups, so it runs here. Anything that can
                    // wait on the disk (FUA, fsync, large writes) still goes to the pool.
                    // (Setting an unchanged version costs a comparison.)
                    store.write_versioned(oid, offset, &payload, v)?;
                    return Ok((PeerResp::Ok, Bytes::new()));
                }
                blocking(store, move |s| {
                    s.write_versioned(oid, offset, &payload, v)?;
                    if fua {
                        s.flush(&[oid])?;
                    }
                    Ok(())
                })
                .await?;
                Ok((PeerResp::Ok, Bytes::new()))
            }
            &PeerReq::WriteZeroes {
                oid,
                offset,
                len,
                fua,
                epoch,
                generation,
                made,
                ..
            } => {
                self.vdi_for(oid, offset, len).await?;
                let v = version(epoch, made, generation)?;
                let _held = self.admit_write(oid, epoch, generation).await?;
                blocking(store, move |s| {
                    s.write_zeroes(oid, offset, len)?;
                    s.raise_version(oid, v)?;
                    if fua {
                        s.flush(&[oid])?;
                    }
                    Ok(())
                })
                .await?;
                Ok((PeerResp::Ok, Bytes::new()))
            }
            &PeerReq::Create {
                oid,
                epoch,
                generation,
                made,
                ..
            } => {
                let vdi = self.vdi_for(oid, 0, payload.len() as u64).await?;
                if payload.len() as u64 != u64::from(vdi.object_size) {
                    return Err(Error::invalid(format!(
                        "Create of object {oid} carries {} bytes, not the whole object ({})",
                        payload.len(),
                        vdi.object_size
                    )));
                }
                let v = version(epoch, made, generation)?;
                let _held = self.admit_write(oid, epoch, generation).await?;
                blocking(store, move |s| s.create(oid, &payload, v)).await?;
                Ok((PeerResp::Ok, Bytes::new()))
            }
            PeerReq::Flush { oids, epoch } => {
                // An fsync of any object is harmless: only the count is checked.
                check_count(oids)?;
                self.catchup.admit_epoch(*epoch, true).await?;
                for &oid in oids {
                    self.admit_flush(oid).await?;
                }
                let oids = oids.clone();
                blocking(store, move |s| s.flush(&oids)).await?;
                Ok((PeerResp::Ok, Bytes::new()))
            }
            PeerReq::Exists { oids, epoch } => {
                self.check_oids(oids, None).await?;
                self.catchup.admit_epoch(*epoch, true).await?;
                if let Some(&o) = oids.iter().find(|&&o| !self.catchup.is_current(o)) {
                    return Err(Self::not_current(o));
                }
                let oids = oids.clone();
                let found = blocking(store, move |s| {
                    oids.iter()
                        .map(|&o| s.exists(o))
                        .collect::<Result<Vec<_>>>()
                })
                .await?;
                Ok((PeerResp::Exists(found), Bytes::new()))
            }
            PeerReq::List { .. } => {
                let oids = blocking(store, |s| s.list()).await?;
                Ok((PeerResp::List(oids), Bytes::new()))
            }
            &PeerReq::Digest {
                ref oids,
                len,
                epoch,
                read,
            } => {
                self.check_oids(oids, Some(len)).await?;
                self.catchup.admit_epoch(epoch, false).await?;
                // "Current" is this node's word on its own map: to an asker on an
                // earlier one, which may place the object elsewhere, it says nothing.
                // A node no longer placed on an object, with no copy and nothing
                // pending, answered an asker two epochs behind that its absence was
                // current, and the asker, which had the object to recover from nodes
                // then down, made its own absence current over the writes those held
                // (`drove sim faults --seed 700 --time 40s`).
                let same_map = self.catalog.get().map.epoch == epoch;
                let mut out = Vec::with_capacity(oids.len());
                for &oid in oids {
                    let mut d = self.digest(oid, len, DigestBy::from_wire(read)).await?;
                    d.current &= same_map;
                    out.push(d);
                }
                Ok((PeerResp::Digests(out), Bytes::new()))
            }
            &PeerReq::MendRead {
                oid,
                offset,
                len,
                epoch,
            } => {
                self.vdi_for(oid, offset, u64::from(len)).await?;
                self.catchup.admit_epoch(epoch, false).await?;
                // No write half applied: the copy as it stands between writes.
                let _held = self.catchup.copy_lock(oid).await;
                let data = blocking(store, move |s| s.read_bytes(oid, offset, len)).await?;
                Ok((PeerResp::Data, data))
            }
            &PeerReq::Fetch {
                oid,
                len,
                epoch,
                force,
            } => {
                self.check_oids(&[oid], Some(len)).await?;
                self.catchup.admit_epoch(epoch, false).await?;
                let _held = self.catchup.copy_lock(oid).await;
                if !force && !self.catchup.is_current(oid) {
                    return Err(Self::not_current(oid));
                }
                let (data, present, version) = blocking(store, move |s| {
                    let present = s.exists(oid)?;
                    Ok((s.read(oid, 0, len)?, present, s.version(oid)?))
                })
                .await?;
                if !force && !self.knows_current(oid, present) {
                    return Err(Self::not_current(oid));
                }
                Ok((PeerResp::Object { present, version }, Bytes::from(data)))
            }
            &PeerReq::Repair {
                oid,
                len,
                from,
                epoch,
            } => {
                self.check_oids(&[oid], Some(len)).await?;
                if self.catalog.get().map.node(from).is_none() {
                    return Err(Error::invalid(format!(
                        "Repair of object {oid} from node {from}, which is not in the cluster"
                    )));
                }
                self.catchup.admit_epoch(epoch, false).await?;
                match self.repairer() {
                    Some(r) => r.repair_from(oid, len, from).await?,
                    None => return Err(Error::invalid("This node does not repair objects")),
                }
                Ok((PeerResp::Ok, Bytes::new()))
            }
        }
    }

    /// This node's view of `oid` (`len` bytes long), with no write in flight.
    pub async fn digest(&self, oid: ObjectId, len: u32, by: DigestBy) -> Result<ObjDigest> {
        let _held = self.catchup.copy_lock(oid).await;
        let clean_epoch = self.catchup.clean_epoch();
        let since_boot = self.catchup.lost_unflushed_in(oid);
        let (present, crc, corrupt, version) = blocking(&self.store, move |s| {
            if !s.exists(oid)? {
                let zeros = drove_objstore::zeros_content_crc(len);
                return Ok((false, zeros, false, ObjVersion::default()));
            }
            let version = s.version(oid)?;
            if by == DigestBy::Checksums {
                return Ok((true, s.content_crc(oid, len)?, false, version));
            }
            match s.read(oid, 0, len) {
                Ok(data) => Ok((true, drove_objstore::content_crc(&data), false, version)),
                Err(e) if e.kind() == ErrorKind::Corrupt => Ok((true, 0, true, version)),
                Err(e) => Err(e),
            }
        })
        .await?;
        let current = self.knows_current(oid, present);
        Ok(ObjDigest {
            present,
            current,
            // A copy held since the host's power loss and not made current since
            // is as unsure for the others as it is here (a copy no longer placed
            // here stays so after the node is clean again): with the node's clean
            // epoch it would answer alone for the epochs it took writes in, and
            // win the tie on clean epoch over copies that kept their page cache.
            clean_epoch: if since_boot && !current {
                Epoch(0)
            } else {
                clean_epoch
            },
            crc,
            corrupt,
            version,
        })
    }
}

/// How a digest looks at a copy ([`LocalStore::digest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestBy {
    /// From the copy's stored block checksums alone (4 bytes per 4 KiB block):
    /// what recovery compares copies by. A block whose data rotted under its
    /// checksum is not seen (a read, which then goes to another copy, or a scrub
    /// finds it), so the copy is never called corrupt.
    Checksums,
    /// Read the data and verify every block: the digest says whether the copy is
    /// corrupt (`vdi check`, scrub, and recovery once a source failed).
    Reading,
}

impl DigestBy {
    /// From a [`PeerReq::Digest`]'s `read`.
    pub fn from_wire(read: bool) -> DigestBy {
        if read {
            DigestBy::Reading
        } else {
            DigestBy::Checksums
        }
    }

    /// As a [`PeerReq::Digest`]'s `read`.
    pub fn to_wire(self) -> bool {
        self == DigestBy::Reading
    }
}

/// Refuse a list of more objects than a request may name.
fn check_count(oids: &[ObjectId]) -> Result<()> {
    if oids.len() > MAX_OIDS {
        return Err(Error::invalid(format!(
            "A request names {} objects; at most {MAX_OIDS} are allowed",
            oids.len()
        )));
    }
    Ok(())
}

/// The version a write of lock `generation`, sent on a map of `epoch` and
/// acknowledged under the map of `made`, gives an object; a write claiming to be
/// made after the map it was sent on is refused.
fn version(epoch: Epoch, made: Epoch, generation: u64) -> Result<ObjVersion> {
    if made > epoch {
        return Err(Error::invalid(format!(
            "A write made at epoch {made} was sent on the map of epoch {epoch}, an earlier one"
        )));
    }
    Ok(ObjVersion {
        generation,
        epoch: made.0,
    })
}

/// Turn a response into a result: a [`PeerResp::Err`] or [`PeerResp::ForwardFailed`]
/// becomes an [`Error`].
pub fn into_result(resp: PeerResp, payload: Bytes) -> Result<(PeerResp, Bytes)> {
    match resp {
        PeerResp::Err(e) => Err(e.into()),
        PeerResp::ForwardFailed { node, err, .. } => Err(Error::new(
            err.kind,
            format!("Passing the write on to node {node} failed: {}", err.msg),
        )),
        other => Ok((other, payload)),
    }
}

/// Apply `req` here and, for a primary-copy write, pass it on to the nodes it names at
/// the same time; the answer is an error if this node or any of them failed. Used by
/// the peer server and by a gateway that is itself the primary. The forward list is
/// checked first: only the object's other replicas, each once (a list naming one
/// node 2,000 times once made this node send it 2,000 writes). A replica that failed
/// behind this node is named in a [`PeerResp::ForwardFailed`] answer (after this
/// node's own failure, if any), so the sender learns which one and whether it went
/// silent.
pub async fn apply_and_forward(
    local: &LocalStore,
    pool: &dyn Transport,
    req: &PeerReq,
    payload: Bytes,
) -> Result<(PeerResp, Bytes)> {
    // A witness holds no objects: placement never names it, so whoever sends it a
    // write is wrong (or hostile).
    if matches!(
        req,
        PeerReq::Write { .. }
            | PeerReq::WriteZeroes { .. }
            | PeerReq::Create { .. }
            | PeerReq::Repair { .. }
    ) && local
        .catalog
        .get()
        .map
        .node(pool.me())
        .is_some_and(|n| n.witness)
    {
        tracing::warn!(op = req.op_name(), "refused: this node is a witness");
        return Err(Error::invalid(format!(
            "Node {} is a witness: it holds no objects, and refuses a {}",
            pool.me(),
            req.op_name()
        )));
    }
    let (oid, forward) = match req {
        PeerReq::Write { oid, forward, .. }
        | PeerReq::WriteZeroes { oid, forward, .. }
        | PeerReq::Create { oid, forward, .. } => (*oid, forward.clone()),
        _ => return local.apply(req, payload).await,
    };
    if forward.is_empty() {
        return local.apply(req, payload).await;
    }
    local.catchup.admit_epoch(req.epoch(), true).await?;
    let vdi = local.catalog.vdi(oid.vdi).await?;
    check_forward(
        &local.catalog.get().map,
        pool.me(),
        oid,
        &vdi,
        req.epoch(),
        &forward,
    )?;
    let onward = strip_forward(req);
    let remote = forward
        .iter()
        .map(|&n| pool.call(n, onward.clone(), payload.clone()));
    let (local, remote) = tokio::join!(local.apply(req, payload.clone()), join_all(remote));
    let answer = local?;
    for (&node, r) in forward.iter().zip(remote) {
        if let Err(e) = r {
            let silent = pool.silent_within(node, crate::client::SILENT_FAIL_FAST);
            let resp = PeerResp::ForwardFailed {
                node,
                silent,
                err: e.into(),
            };
            return Ok((resp, Bytes::new()));
        }
    }
    Ok(answer)
}

/// A primary-copy forward list is acceptable when it names only replicas of `oid` on
/// `map` other than this node `me`, each once. A list that does not fit a map newer
/// than the sender's is answered `StaleEpoch` (the sender retries on the newer map);
/// one that does not fit the sender's own epoch is refused and logged.
fn check_forward(
    map: &drove_types::ClusterMap,
    me: NodeId,
    oid: ObjectId,
    vdi: &VdiInfo,
    epoch: Epoch,
    forward: &[NodeId],
) -> Result<()> {
    let placed = drove_placement::locate_vdi(map, vdi, oid);
    let mut seen = std::collections::BTreeSet::new();
    let bad = forward.len() >= usize::from(vdi.copies)
        || forward
            .iter()
            .any(|n| *n == me || !seen.insert(*n) || !placed.contains(n));
    if !bad {
        return Ok(());
    }
    if epoch < map.epoch {
        return Err(Error::new(
            ErrorKind::StaleEpoch,
            format!(
                "Forward list of object {oid} is for epoch {epoch}; this node is at epoch {}",
                map.epoch
            ),
        ));
    }
    let shown: Vec<String> = forward.iter().take(8).map(|n| n.to_string()).collect();
    tracing::warn!(%oid, %epoch, forward = forward.len(), "refused a write whose forward list is not the object's replicas");
    Err(Error::invalid(format!(
        "Forward list [{}{}] ({} nodes) of object {oid} is not its other replicas at epoch {epoch}",
        shown.join(", "),
        if forward.len() > 8 { ", ..." } else { "" },
        forward.len()
    )))
}

fn strip_forward(req: &PeerReq) -> PeerReq {
    let mut r = req.clone();
    match &mut r {
        PeerReq::Write { forward, .. }
        | PeerReq::WriteZeroes { forward, .. }
        | PeerReq::Create { forward, .. } => forward.clear(),
        _ => {}
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn test_the_time_since_a_client_op_counts_from_the_op_not_from_a_look() {
        let local = LocalStore::new(Arc::new(drove_objstore::MemStore::new(4 << 20)));
        assert_eq!(local.since_client_op(), None, "no client op yet");
        // Recovery's own requests are not client operations.
        local
            .apply(&PeerReq::Ping { epoch: Epoch(0) }, Bytes::new())
            .await
            .unwrap();
        assert_eq!(local.since_client_op(), None);
        let flush = PeerReq::Flush {
            oids: vec![],
            epoch: Epoch(0),
        };
        local.apply(&flush, Bytes::new()).await.unwrap();
        assert!(local.since_client_op().unwrap() < Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(120)).await;
        // The first look after a quiet spell sees the spell, not a fresh op.
        assert!(local.since_client_op().unwrap() >= Duration::from_millis(110));
        local.apply(&flush, Bytes::new()).await.unwrap();
        assert!(local.since_client_op().unwrap() < Duration::from_millis(100));
    }
}
