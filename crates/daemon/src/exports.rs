//! The NBD frontend's view of the cluster: every VDI in the metadata is an export of
//! the same name. All connections to one VDI on this node share one [`Volume`] (see
//! there why multi-conn is then correct).
use async_trait::async_trait;
use bytes::Bytes;
use drove_meta::Meta;
use drove_nbd::{Export, Exports, Extent};
use drove_replica::{Gateway, Membership, Recoverer};
use drove_types::{format_size, Error, Result, VdiInfo};
use drove_volume::{LockService, Volume};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use crate::locks::{now_ms, MetaMembership};

/// The exports of this node: the VDI table, opened lazily.
pub struct VdiExports {
    meta: Arc<Meta>,
    gateway: Arc<Gateway>,
    locks: Arc<dyn LockService>,
    volumes: Mutex<HashMap<String, Arc<Volume>>>,
    recoverer: std::sync::OnceLock<Arc<Recoverer>>,
}

impl VdiExports {
    pub fn new(meta: Arc<Meta>, gateway: Arc<Gateway>, locks: Arc<dyn LockService>) -> Arc<Self> {
        Arc::new(VdiExports {
            meta,
            gateway,
            locks,
            volumes: Mutex::new(HashMap::new()),
            recoverer: std::sync::OnceLock::new(),
        })
    }

    /// The engine that makes replicas identical after a gateway crash.
    pub fn set_recoverer(&self, r: Arc<Recoverer>) {
        let _ = self.recoverer.set(r);
    }

    /// A gateway that died while writing `info` left a lock it never released, and
    /// its replicas may differ where no FLUSH covered its writes. Before the VDI is
    /// served again here: wait out that lease (its holder is down or gone quiet) and
    /// make every object's replicas identical. A lock held by a live gateway is left
    /// alone: that is a normal second attachment (reads only, or a hand-over).
    pub async fn settle_crashed_writer(&self, info: &VdiInfo) -> Result<()> {
        let state = self.meta.state();
        let Some(lock) = state.locks.get(&info.id).cloned() else {
            return Ok(());
        };
        let me = self.meta.node_id();
        let holder_up = state
            .map
            .node(lock.owner)
            .is_some_and(|n| n.state == drove_types::NodeState::Up);
        let now = now_ms();
        let expired = lock.expires_ms <= now;
        if lock.owner == me {
            return Ok(());
        }
        // A holder that is up and answers is a live gateway (a second attachment is
        // fine: it reads, or asks for a hand-over). One that does not answer may have
        // died a moment ago, before the failure detector noticed.
        let answers = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            self.gateway.ping(lock.owner),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        if holder_up && !expired && answers {
            return Ok(());
        }
        if !expired {
            let wait = std::time::Duration::from_millis(lock.expires_ms.saturating_sub(now_ms()));
            tracing::info!(vdi = %info.name, holder = %lock.owner, ?wait, "waiting for a dead gateway's lease");
            tokio::time::sleep(wait).await;
        }
        let Some(r) = self.recoverer.get() else {
            return Ok(());
        };
        // Hold the VDI's lock for the repair: the old holder cannot renew its lease
        // and write behind it. The lock stays with this node for its clients (it
        // expires if none writes).
        match self.locks.acquire(info).await {
            Ok(_) => {}
            // Another node took the VDI over meanwhile; it made the replicas identical.
            Err(e) if e.kind() == drove_types::ErrorKind::Locked => return Ok(()),
            // No metadata majority: nobody can write the VDI, so serve reads as they
            // are (replicas may differ only where no FLUSH covered the dead gateway's
            // writes) rather than refuse them.
            Err(e) if e.kind() == drove_types::ErrorKind::Unavailable => {
                tracing::warn!(vdi = %info.name, "serving without the post-crash repair: {e}");
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        let report = r.check(info, true).await?;
        // Replicas that did not answer were not repaired: mark them down, so they
        // recover every copy before serving again.
        let silent: std::collections::BTreeSet<drove_types::NodeId> = report
            .mismatched
            .iter()
            .flat_map(|m| {
                m.replicas
                    .iter()
                    .filter(|v| v.digest.is_none())
                    .map(|v| v.node)
            })
            .collect();
        if !silent.is_empty() {
            let why = format!("did not answer the post-crash check of VDI '{}'", info.name);
            MetaMembership(self.meta.clone())
                .mark_down(silent.into_iter().collect(), why)
                .await?;
        }
        let fixed = report.mismatched.iter().filter(|m| m.repaired).count();
        tracing::info!(
            vdi = %info.name, objects = report.objects, differing = report.mismatched.len(),
            repaired = fixed, "replicas made identical after the previous gateway stopped"
        );
        if fixed < report.mismatched.len() {
            return Err(Error::unavailable(format!(
                "VDI '{}': {} objects have replicas that could not be made identical",
                info.name,
                report.mismatched.len() - fixed
            )));
        }
        Ok(())
    }

    /// The open volume of `name`, if a client attached it here.
    pub fn volume(&self, name: &str) -> Option<Arc<Volume>> {
        self.volumes.lock().get(name).cloned()
    }

    /// Bring open volumes up to date with the VDI table: new sizes, snapshots (the
    /// volume moves to the VDI's new id, whose parent is its old one), flattening;
    /// volumes of deleted or rolled-back VDIs are dropped (their clients' writes then
    /// fail: the lock they would take covers the new id).
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
                _ => false,
            });
    }

    /// The record of VDI `name` in this node's metadata.
    fn record(&self, name: &str) -> Result<(Arc<drove_meta::MetaState>, VdiInfo)> {
        let state = self.meta.state();
        let info = state
            .vdis
            .get(name)
            .ok_or_else(|| Error::not_found(format!("No VDI named '{name}'")))?
            .clone();
        Ok((state, info))
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

#[async_trait]
impl Exports for VdiExports {
    async fn list(&self) -> Result<Vec<(String, String)>> {
        let state = self.meta.state();
        Ok(state
            .vdis
            .values()
            .map(|v| {
                let desc = format!("{} copies={} {}", format_size(v.size), v.copies, v.mode);
                (v.name.clone(), desc)
            })
            .collect())
    }

    async fn open(&self, name: &str) -> Result<Arc<dyn Export>> {
        let (_, info) = self.record(name)?;
        self.settle_crashed_writer(&info).await?;
        let vol = self.volume_or_open(name)?;
        vol.attach();
        Ok(Arc::new(VolumeExport(vol)))
    }
}

/// A [`Volume`] as an NBD export: one per client connection, attached while it lives.
struct VolumeExport(Arc<Volume>);

impl Drop for VolumeExport {
    fn drop(&mut self) {
        self.0.detach();
    }
}

#[async_trait]
impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.0.info().size
    }

    fn read_only(&self) -> bool {
        self.0.info().snapshot
    }

    fn multi_conn(&self) -> bool {
        // Every connection to this VDI on this node shares one Volume, whose FLUSH
        // covers writes acknowledged on any of them.
        true
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes> {
        self.0.read(offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<()> {
        self.0.write(offset, data, fua).await
    }

    async fn write_zeroes(&self, offset: u64, len: u32, fua: bool) -> Result<()> {
        self.0.write_zeroes(offset, u64::from(len), fua).await
    }

    async fn trim(&self, offset: u64, len: u32) -> Result<()> {
        // A trimmed range is undefined afterwards; zeroing it frees the space.
        self.0.write_zeroes(offset, u64::from(len), false).await
    }

    async fn flush(&self) -> Result<()> {
        self.0.flush().await
    }

    async fn block_status(&self, offset: u64, len: u32) -> Result<Vec<Extent>> {
        let runs = self.0.block_status(offset, u64::from(len)).await?;
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
