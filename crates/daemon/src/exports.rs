//! The NBD frontend's view of the cluster: every VDI in the metadata is an export of
//! the same name. All connections to one VDI on this node share one [`Volume`] (see
//! there why multi-conn is then correct).
use async_trait::async_trait;
use bytes::Bytes;
use drove_meta::Meta;
use drove_metrics::{Metrics, VdiIo};
use drove_nbd::{ClientInfo, Credential, Export, Exports, Extent};
use drove_replica::Gateway;
use drove_types::{format_size, Error, ErrorKind, Result, VdiInfo};
use drove_volume::{Direction, LockService, Volume};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drove_types::clock::unix_ms as now_ms;
use drove_types::clock::Instant;

/// How long an attach waits for another node's post-crash repair of the VDI.
const SETTLE_PATIENCE: Duration = Duration::from_secs(20);

/// How long an attach waits for the metadata to grant the lock it repairs under.
const ACQUIRE_PATIENCE: Duration = Duration::from_secs(3);

/// How long an attach of a name this node does not know waits for the node to
/// catch up with the cluster's metadata before it answers "no such VDI".
const UNKNOWN_NAME_PATIENCE: Duration = Duration::from_secs(5);

/// The exports of this node: the VDI table, opened lazily.
pub struct VdiExports {
    meta: Arc<Meta>,
    gateway: Arc<Gateway>,
    locks: Arc<dyn LockService>,
    volumes: Mutex<HashMap<String, Arc<Volume>>>,
    /// Where each VDI's I/O through this node is counted (`drove vdi iostat`).
    metrics: Arc<Metrics>,
    /// The clients attached through this node, by connection.
    clients: Arc<Mutex<BTreeMap<u64, Attached>>>,
    next_client: AtomicU64,
}

/// One client connection attached to a VDI here.
#[derive(Debug, Clone)]
struct Attached {
    vdi: String,
    client: String,
    since_unix: u64,
    wrote: bool,
}

impl VdiExports {
    pub fn new(
        meta: Arc<Meta>,
        gateway: Arc<Gateway>,
        locks: Arc<dyn LockService>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(VdiExports {
            meta,
            gateway,
            locks,
            volumes: Mutex::new(HashMap::new()),
            metrics,
            clients: Arc::default(),
            next_client: AtomicU64::new(1),
        })
    }

    /// Before VDI `info` is served here, the writes of every earlier lock holder
    /// must be settled (identical on every replica; see [`crate::settle`]).
    /// - Settled, or a live gateway holds the lock with its predecessors settled (a
    ///   second attachment: it reads, or asks for a hand-over): serve.
    /// - A live gateway holds it and is still repairing: wait for its record.
    /// - The holder died (no lease, a lease no one renews, an earlier run of this
    ///   node): wait out its lease, take the lock (which repairs first), and give it
    ///   back unless a client here writes.
    pub async fn settle_crashed_writer(&self, info: &VdiInfo) -> Result<()> {
        let deadline = tokio::time::Instant::now() + SETTLE_PATIENCE;
        let mut rx = self.meta.watch();
        loop {
            let state = self.meta.state();
            let generation = state.lock_generations.get(&info.id).copied().unwrap_or(0);
            let settled = state.settled.get(&info.id).copied().unwrap_or(0);
            if settled >= generation {
                return Ok(());
            }
            let lock = state.locks.get(&info.id).cloned();
            let me = self.meta.node_id();
            let held_here = self.volume(&info.name).is_some_and(|v| v.holds_lock());
            if let Some(l) = &lock {
                // This very process holds it (its clients may be between writes, or
                // its lease lapsed while it is cut off): nothing of a dead writer's
                // to settle once the predecessors are settled.
                let mine = l.owner == me && l.incarnation == self.meta.incarnation();
                if (mine || (l.owner == me && held_here))
                    && settled.saturating_add(1) >= l.generation
                {
                    return Ok(());
                }
                if l.owner != me && self.holder_is_live(&state, l).await {
                    if settled.saturating_add(1) >= l.generation {
                        return Ok(());
                    }
                    // It took the lock to repair: wait for its record.
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        return Err(Error::unavailable(format!(
                            "VDI '{}' is being repaired by node {} after a gateway crash; try again shortly",
                            info.name, l.owner
                        )));
                    }
                    let _ =
                        tokio::time::timeout(left.min(Duration::from_millis(500)), rx.changed())
                            .await;
                    continue;
                }
                let now = now_ms();
                if l.expires_ms > now {
                    let wait = Duration::from_millis(l.expires_ms - now);
                    tracing::info!(vdi = %info.name, holder = %l.owner, ?wait, "waiting for a dead gateway's lease");
                    tokio::time::sleep(wait).await;
                }
            }
            // Taking the lock repairs first (MetaLocks::acquire). Bounded: a node cut
            // off from the metadata majority must answer its clients, not wait out
            // the metadata's own retries (the repair, once started, goes on).
            let taken = tokio::time::timeout(ACQUIRE_PATIENCE, self.locks.acquire(info))
                .await
                .unwrap_or_else(|_| {
                    Err(Error::unavailable(format!(
                        "the metadata did not grant VDI '{}''s lock within {ACQUIRE_PATIENCE:?}",
                        info.name
                    )))
                });
            match taken {
                Ok(lease) => {
                    let writing_here = self.volume(&info.name).is_some_and(|v| v.holds_lock());
                    if !writing_here {
                        // Released cleanly, the repaired state counts as settled.
                        if let Err(e) = self.locks.release(info, lease.generation).await {
                            tracing::warn!(vdi = %info.name, "releasing the lock taken for the repair failed (it will expire): {e}");
                        }
                    }
                    return Ok(());
                }
                // Another node took the VDI over meanwhile: judge again.
                Err(e) if e.kind() == ErrorKind::Locked => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(e);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                // No metadata majority: nobody can write the VDI, so serve reads as
                // they are (replicas may differ only where no FLUSH covered the dead
                // gateway's writes) rather than refuse them. The record stays
                // unsettled, so the next attach that can take the lock repairs.
                Err(e)
                    if matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::OutcomeUnknown) =>
                {
                    tracing::warn!(vdi = %info.name, "serving without the post-crash repair: {e}");
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether `lock`'s holder is a live gateway: its lease runs, the map has it up
    /// and the very run of its process that took the lock answers. One that does
    /// not answer may have died a moment ago, before the failure detector noticed.
    /// One that answers as another run restarted since: after a whole cluster lost
    /// power, every node answers again and the new Raft term extended every lease,
    /// but the writer that held the lock is gone and its writes are not settled
    /// (the lock names the run that took it, [`drove_meta::VdiLock::incarnation`]).
    async fn holder_is_live(
        &self,
        state: &drove_meta::MetaState,
        lock: &drove_meta::VdiLock,
    ) -> bool {
        let up = state
            .map
            .node(lock.owner)
            .is_some_and(|n| n.state == drove_types::NodeState::Up);
        if !up || lock.expires_ms <= now_ms() {
            return false;
        }
        tokio::time::timeout(Duration::from_secs(1), self.gateway.ping(lock.owner))
            .await
            .is_ok_and(|r| matches!(r, Ok(Some(run)) if run == lock.incarnation))
    }

    /// The clients that have VDI `name` open through this node.
    pub fn clients_of(&self, name: &str) -> Vec<crate::api::Client> {
        let node = self.meta.node_id();
        self.clients
            .lock()
            .values()
            .filter(|a| a.vdi == name)
            .map(|a| crate::api::Client {
                node,
                client: a.client.clone(),
                since_unix: a.since_unix,
                wrote: a.wrote,
            })
            .collect()
    }

    /// The gateway every volume of this node writes through.
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// The open volume of `name`, if a client attached it here.
    pub fn volume(&self, name: &str) -> Option<Arc<Volume>> {
        self.volumes.lock().get(name).cloned()
    }

    /// Bring open volumes up to date with the VDI table: new sizes, snapshots (the
    /// volume moves to the VDI's new id, whose parent is its old one), flattening;
    /// volumes of deleted or rolled-back VDIs are dropped and their clients' I/O
    /// fails from then on (`Gone`).
    pub fn refresh(&self, state: &drove_meta::MetaState) {
        self.volumes
            .lock()
            .retain(|name, vol| match state.vdis.get(name) {
                Some(info) if info.id == vol.info().id || info.parent == Some(vol.info().id) => {
                    if *info != vol.info() {
                        vol.set_info(info.clone(), state.ancestors(info));
                    }
                    true
                }
                _ => {
                    vol.set_gone();
                    false
                }
            });
    }

    /// The record of VDI `name` in this node's metadata.
    fn record(&self, name: &str) -> Result<(Arc<drove_meta::MetaState>, VdiInfo)> {
        let state = self.meta.state();
        let info = state
            .vdis
            .get(name)
            .filter(|_| !drove_types::is_kept(name))
            .ok_or_else(|| {
                Error::not_found(format!(
                    "No VDI named '{name}'",
                    name = drove_types::shown(name)
                ))
            })?
            .clone();
        Ok((state, info))
    }

    /// The record of VDI `name`, looked up again after a read barrier when this
    /// node does not know the name: a VDI created through another node a moment
    /// ago may not be applied here yet, and "no such VDI" must not depend on that.
    /// Without a quorum to confirm the view, the answer is the local one.
    async fn current_record(&self, name: &str) -> Result<(Arc<drove_meta::MetaState>, VdiInfo)> {
        match self.record(name) {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if let Err(b) = self.meta.read_barrier(UNKNOWN_NAME_PATIENCE).await {
                    tracing::debug!("attach of unknown VDI '{name}': no read barrier: {b}");
                    return Err(e);
                }
                self.record(name)
            }
            r => r,
        }
    }

    /// The volume of `name` that clients here share, opened if none is.
    pub fn volume_or_open(&self, name: &str) -> Result<Arc<Volume>> {
        let (state, info) = self.record(name)?;
        let mut vols = self.volumes.lock();
        Ok(match vols.get(name) {
            Some(v) if v.info().id == info.id => v.clone(),
            _ => {
                let parents = state.ancestors(&info);
                let v = Volume::new(info, parents, self.gateway.clone(), self.locks.clone());
                vols.insert(name.to_string(), v.clone());
                v
            }
        })
    }
}

/// Whether a client with `credential` may attach `info` (its NBD access list,
/// [`VdiInfo::nbd_clients`]): the unix socket always (its file permissions
/// decide), anyone when the list is empty, else a certificate named in it.
pub(crate) fn may_attach(info: &VdiInfo, credential: &Credential) -> bool {
    match credential {
        Credential::Local => true,
        _ if info.nbd_clients.is_empty() => true,
        Credential::Certificate(Some(cn)) => info.nbd_clients.iter().any(|c| c == cn),
        Credential::Certificate(None) | Credential::Anonymous => false,
    }
}

#[async_trait]
impl Exports for VdiExports {
    async fn list(&self, client: &ClientInfo) -> Result<Vec<(String, String)>> {
        let state = self.meta.state();
        Ok(state
            .vdis
            .values()
            .filter(|v| !drove_types::is_kept(&v.name) && may_attach(v, &client.credential))
            .map(|v| {
                let desc = format!("{} copies={} {}", format_size(v.size), v.copies, v.mode);
                (v.name.clone(), desc)
            })
            .collect())
    }

    async fn open(&self, name: &str, client: &ClientInfo) -> Result<Arc<dyn Export>> {
        let (_, info) = self.current_record(name).await?;
        if !may_attach(&info, &client.credential) {
            // The client learns no more than of a VDI that does not exist; the log
            // says why.
            tracing::warn!(
                vdi = %name, client = %client.label,
                "nbd: attach refused: the client is not on the VDI's access list (drove vdi access)"
            );
            return Err(Error::not_found(format!(
                "No VDI named '{name}'",
                name = drove_types::shown(name)
            )));
        }
        self.settle_crashed_writer(&info).await?;
        let vol = self.volume_or_open(name)?;
        vol.attach();
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        let since_unix = drove_types::clock::unix_secs();
        self.clients.lock().insert(
            id,
            Attached {
                vdi: name.to_string(),
                client: client.label.clone(),
                since_unix,
                wrote: false,
            },
        );
        Ok(Arc::new(VolumeExport {
            vol,
            metrics: self.metrics.clone(),
            io: self.metrics.vdi_io().vdi(name),
            id,
            clients: self.clients.clone(),
            wrote: AtomicBool::new(false),
        }))
    }
}

/// A [`Volume`] as an NBD export: one per client connection, attached (and listed
/// among the node's clients) while it lives.
struct VolumeExport {
    vol: Arc<Volume>,
    /// Where the time requests waited for the VDI's I/O limits is counted.
    metrics: Arc<Metrics>,
    /// This VDI's I/O counters on this node, shared by its connections.
    io: Arc<VdiIo>,
    id: u64,
    clients: Arc<Mutex<BTreeMap<u64, Attached>>>,
    /// Whether the client wrote, known here without taking the table's lock.
    wrote: AtomicBool,
}

impl VolumeExport {
    fn wrote(&self) {
        if !self.wrote.swap(true, Ordering::Relaxed) {
            if let Some(a) = self.clients.lock().get_mut(&self.id) {
                a.wrote = true;
            }
        }
    }

    /// Wait until a request of `bytes` bytes going `dir` is within the VDI's I/O
    /// limits, counting the wait (the node's metric, and the VDI's throttled time
    /// in `vdi iostat`). The VDI's latency figures start after it: they are the
    /// storage's.
    async fn admit(&self, dir: Direction, bytes: u64) {
        let waited = self.vol.admit(dir, bytes).await;
        if !waited.is_zero() {
            let op = match dir {
                Direction::Read => "read",
                Direction::Write => "write",
            };
            self.metrics.qos_throttled(op, waited.as_secs_f64());
            self.io.throttled(waited);
        }
    }

    /// Run `op`, a write of `len` bytes (data, zeroes or a trim; `data` bytes of
    /// it count against a bytes/s limit), held to the VDI's limits, noted as this
    /// client's and counted in the VDI's I/O.
    async fn counted_write(
        &self,
        len: u64,
        data: u64,
        op: impl std::future::Future<Output = Result<()>>,
    ) -> Result<()> {
        self.admit(Direction::Write, data).await;
        self.wrote();
        let start = Instant::now();
        let r = op.await;
        self.io.write(len, start.elapsed().as_secs_f64(), r.is_ok());
        r
    }
}

impl Drop for VolumeExport {
    fn drop(&mut self) {
        self.clients.lock().remove(&self.id);
        self.vol.detach();
    }
}

#[async_trait]
impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.vol.info().size
    }

    fn read_only(&self) -> bool {
        self.vol.info().snapshot
    }

    fn multi_conn(&self) -> bool {
        // Every connection to this VDI on this node shares one Volume, whose FLUSH
        // covers writes acknowledged on any of them.
        true
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes> {
        self.admit(Direction::Read, u64::from(len)).await;
        let start = Instant::now();
        let r = self.vol.read(offset, len).await;
        self.io
            .read(u64::from(len), start.elapsed().as_secs_f64(), r.is_ok());
        r
    }

    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<()> {
        let len = data.len() as u64;
        self.counted_write(len, len, self.vol.write(offset, data, fua))
            .await
    }

    async fn write_zeroes(&self, offset: u64, len: u32, fua: bool) -> Result<()> {
        let len = u64::from(len);
        self.counted_write(len, 0, self.vol.write_zeroes(offset, len, fua))
            .await
    }

    async fn trim(&self, offset: u64, len: u32) -> Result<()> {
        let len = u64::from(len);
        // A trimmed range is undefined afterwards; zeroing it frees the space.
        self.counted_write(len, 0, self.vol.write_zeroes(offset, len, false))
            .await
    }

    async fn flush(&self) -> Result<()> {
        self.io.flush();
        self.vol.flush().await
    }

    async fn block_status(&self, offset: u64, len: u32) -> Result<Vec<Extent>> {
        let runs = self.vol.block_status(offset, u64::from(len)).await?;
        Ok(runs
            .into_iter()
            .map(|r| Extent {
                length: r.len,
                hole: !r.allocated,
                zero: !r.allocated,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::VdiId;

    fn vdi(clients: &[&str]) -> VdiInfo {
        VdiInfo {
            nbd_clients: clients.iter().map(|c| c.to_string()).collect(),
            ..VdiInfo::new(VdiId(1), "d", 1 << 30, drove_types::DEFAULT_OBJECT_SIZE, 3)
        }
    }

    #[test]
    fn test_an_access_list_lets_in_the_named_certificates_and_the_unix_socket() {
        let cert = |n: &str| Credential::Certificate(Some(n.to_string()));
        let open = vdi(&[]);
        for c in [
            Credential::Local,
            Credential::Anonymous,
            Credential::Certificate(None),
            cert("x"),
        ] {
            assert!(may_attach(&open, &c), "{c:?} refused by an empty list");
        }
        let listed = vdi(&["host-a", "backup"]);
        assert!(may_attach(&listed, &Credential::Local));
        assert!(may_attach(&listed, &cert("host-a")));
        assert!(may_attach(&listed, &cert("backup")));
        for c in [
            Credential::Anonymous,
            Credential::Certificate(None),
            cert("host-b"),
            cert("HOST-A"),
            cert("host-a "),
        ] {
            assert!(!may_attach(&listed, &c), "{c:?} let in");
        }
    }
}
