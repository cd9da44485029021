//! The metadata as production runs it, on every simulated node: a real
//! [`Meta`] (openraft, drove's log store and state machine on a redb file on the
//! node's simulated metadata disk, a [`MemDisk`]) whose calls to the other nodes
//! go over the simulated network ([`SimMetaNets`]). Node 1 bootstraps the cluster
//! and the others join it through node 1's admin address, as `drove up` starts
//! them; production's voter keeper places `max_voters` 3 voters by zone.
//!
//! What a node runs over its metadata is production's too: following
//! [`Meta::watch`] into its map, catalog and recovery's view
//! ([`drove_daemon::follow_metadata`]), the heartbeats and the leader's failure
//! detector ([`Meta::run_health`]) and the failed-disk mark-down
//! ([`drove_daemon::mark_down_when_failed`]), each started once the node's
//! metadata is ready, as `drove node run` starts them.
//!
//! A crash keeps the metadata disk as it was ([`MemDisk::copy`]: redb commits
//! durably before openraft goes on, so what was committed is there) and shuts the
//! dead run's [`Meta`] down; a restart opens a new [`Meta`] on that copy. A power
//! loss hits the metadata disk too ([`RaftMetas::power_lost`]): it keeps what redb
//! synced and a torn part of the rest. A disk replaced or a failing store hit the
//! object store only: the metadata's disk is another device here (a replaced one
//! would make the node a new node, with a new id, which the fault runs do not
//! model).
use drove_meta::{MemDisk, Meta, MetaConfig};
use drove_objstore::GuardedStore;
use drove_replica::{LocalStore, MapCell, Recoverer};
use drove_types::{Error, NodeId, NodeInfo, Result};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::metanet::SimMetaNets;
use crate::model::Model;
use crate::net::{SimNet, SimTransport};

/// How long a node waits to become a member before it gives up (`drove node
/// run`'s).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Production's default number of metadata voters.
const MAX_VOTERS: usize = drove_meta::DEFAULT_MAX_VOTERS;

/// A node's admin address (its public hello; a joining node asks node 1's).
pub(crate) fn admin_addr(id: u64) -> String {
    format!("127.0.0.1:{}", 20_000 + id)
}

/// A node's peer address (its internal routes: Raft, forwarded writes, heartbeats).
pub(crate) fn peer_addr(id: u64) -> String {
    format!("127.0.0.1:{}", 30_000 + id)
}

/// What a simulated node says of itself to the metadata (addresses nothing
/// connects to but the simulated network).
pub(crate) fn node_info(id: u64, zone: usize) -> NodeInfo {
    NodeInfo {
        weight: 100,
        admin_addr: admin_addr(id),
        peer_addr: peer_addr(id),
        nbd_addr: format!("127.0.0.1:{}", 40_000 + id),
        nbd_socket: format!("/run/drove/sim-{id}.sock"),
        ..NodeInfo::new(NodeId(id), Model::zone_name(zone))
    }
}

/// The real metadata of a simulated cluster: its network and each node's disk.
pub(crate) struct RaftMetas {
    nets: Arc<SimMetaNets>,
    /// The metadata disk each running node writes.
    disks: Mutex<BTreeMap<NodeId, MemDisk>>,
    /// The metadata disks of nodes that are off, as they were at the crash.
    off: Mutex<BTreeMap<NodeId, MemDisk>>,
}

impl RaftMetas {
    pub(crate) fn new(net: Arc<SimNet>) -> RaftMetas {
        RaftMetas {
            nets: SimMetaNets::new(net),
            disks: Mutex::new(BTreeMap::new()),
            off: Mutex::new(BTreeMap::new()),
        }
    }

    /// Open node `id`'s metadata on `transport`'s run: on its disk as a crash left
    /// it, or a new disk (then node 1 bootstraps and the others join through node
    /// 1, and the id the cluster hands out must be `id`).
    pub(crate) async fn open(
        &self,
        id: NodeId,
        zone: usize,
        transport: &SimTransport,
    ) -> Result<Arc<Meta>> {
        let disk = self.off.lock().remove(&id).unwrap_or_default();
        let cfg = MetaConfig {
            data_dir: format!("/nonexistent/sim-{id}").into(),
            addr: peer_addr(id.0),
            // Every node but the first is configured to join it, restarts included.
            join: (id.0 != 1).then(|| admin_addr(1)),
            node: node_info(id.0, zone),
            max_voters: MAX_VOTERS,
            join_timeout: Duration::from_secs(60),
            tls: None,
            routes: None,
        };
        let out = self.nets.for_node(id, transport.incarnation());
        let meta = Meta::open_in_memory(cfg, out, disk.clone()).await?;
        if meta.node_id() != id {
            meta.shutdown().await;
            return Err(Error::invalid(format!(
                "The simulated node {id} was handed node id {} by the metadata",
                meta.node_id()
            )));
        }
        self.nets.register(
            &[peer_addr(id.0), admin_addr(id.0)],
            id,
            transport.incarnation(),
            &meta,
        );
        self.disks.lock().insert(id, disk);
        Ok(meta)
    }

    /// Node `id`'s run crashed: keep its metadata disk as it is now for the next
    /// run, and shut the dead run's metadata down (its calls already go nowhere).
    pub(crate) fn crashed(&self, id: NodeId, meta: &Arc<Meta>) {
        if let Some(d) = self.disks.lock().remove(&id) {
            self.off.lock().insert(id, d.copy());
        }
        let dead = meta.clone();
        tokio::spawn(async move { dead.shutdown().await });
    }

    /// Node `id`, off, lost power: its metadata disk keeps what was synced and,
    /// with the chances `chance` draws, sectors written since. The sectors lost.
    pub(crate) fn power_lost(&self, id: NodeId, chance: &mut dyn FnMut(f64) -> bool) -> usize {
        self.off.lock().get(&id).map_or(0, |d| d.power_loss(chance))
    }
}

/// What `drove node run` starts once its metadata is ready, for a simulated node:
/// following the metadata, recovery, the failed-disk mark-down and the heartbeats
/// (with the leader's failure detector). `ready` is set once they run.
pub(crate) async fn node_tasks(
    meta: Arc<Meta>,
    map: Arc<MapCell>,
    local: Arc<LocalStore>,
    recoverer: Arc<Recoverer>,
    guard: Option<Arc<GuardedStore>>,
    ready: Arc<std::sync::atomic::AtomicBool>,
) {
    if let Err(e) = meta.ready(READY_TIMEOUT).await {
        tracing::warn!(node = %meta.node_id(), "the metadata is not ready: {e}");
        return;
    }
    let removed = Arc::new(tokio::sync::Notify::new());
    let follow =
        drove_daemon::follow_metadata(meta.clone(), map, local, recoverer.clone(), removed);
    let recovery = recoverer.clone().run();
    let clean_of = recoverer;
    let disk = {
        let (meta, guard) = (meta.clone(), guard.clone());
        async move {
            match guard {
                Some(g) => drove_daemon::mark_down_when_failed(meta, g).await,
                None => std::future::pending().await,
            }
        }
    };
    let hb_meta = meta.clone();
    let health = meta.clone().run_health(
        move || {
            guard
                .as_ref()
                .is_none_or(|g| drove_daemon::heartbeat_healthy(&hb_meta, g))
        },
        move || {
            let p = clean_of.progress();
            p.clean.then_some(drove_types::Epoch(p.epoch))
        },
    );
    ready.store(true, std::sync::atomic::Ordering::SeqCst);
    // One task for all: a crash aborts them together.
    futures::join!(follow, recovery, disk, health);
}
