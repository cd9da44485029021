//! A simulated drove cluster: per node, drove's own [`LocalStore`], [`Gateway`] and
//! [`Recoverer`] over a [`MemStore`] and the [`SimNet`], and its metadata in one of
//! two modes ([`MetaMode`]):
//!
//! - [`MetaMode::Raft`]: every node runs a real [`drove_meta::Meta`], openraft
//!   included, over the simulated network and on a simulated disk, with what
//!   production runs over it (see the `raft` module).
//! - [`MetaMode::Model`]: one metadata state for the cluster, drove's own
//!   [`MetaState`] applied command by command, described below.
//!
//! In the model, the metadata is the real state machine, not openraft. So a
//! command from a node that reaches the metadata (not crashed,
//! not in a zone cut off) is applied after one round trip between zones (a commit
//! by a majority elsewhere), and every node that reaches the metadata sees the new
//! state at once; a node that does not keeps its old one until it does. The
//! majority is assumed to stay on the side with more zones: a fault run never cuts
//! off more than one zone at a time.
use drove_daemon::{MetaLocks, MetaMembership, Settler};
use drove_meta::{Command, Meta, MetaApi, MetaState, Renew, Reply};
use drove_metrics::Metrics;
use drove_objstore::{GuardedStore, MemStore, ObjectStore};
use drove_replica::catchup::CatchUp;
use drove_replica::{Catalog, Gateway, LocalStore, MapCell, Recoverer, View};
use drove_types::{
    ClusterMap, Error, ErrorKind, NodeId, NodeState, ReplicationMode, Result, VdiId, VdiInfo,
    WritePolicy,
};
use drove_volume::LockService;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::disk::NodeDisk;
use crate::model::Model;
use crate::net::{SimNet, SimTransport};

mod meta;
mod raft;
pub use meta::SimMeta;

/// Where a simulated cluster's metadata comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MetaMode {
    /// One [`MetaState`] for the cluster, applied after a modelled commit time.
    #[default]
    Model,
    /// A real [`Meta`] (openraft) on every node, over the simulated network.
    Raft,
}

impl MetaMode {
    /// The mode named `s` (`model`, `raft`).
    pub fn parse(s: &str) -> Option<MetaMode> {
        match s {
            "model" => Some(MetaMode::Model),
            "raft" => Some(MetaMode::Raft),
            _ => None,
        }
    }
}

/// The simulated wall clock starts here (seconds since the Unix epoch), so that a
/// seed gives the same metadata times every run.
const EPOCH_START_S: u64 = 1_800_000_000;

/// The lease of the locks a node's VMs take (`drove node run --lock-lease` is 15 s
/// by default; the fault runs' VMs have always taken 8 s).
pub const LOCK_LEASE: Duration = Duration::from_secs(8);

/// The disks of a simulated cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disks {
    /// drove's `MemStore`: the data is kept and checked (fault runs).
    Memory,
    /// A [`crate::sizestore::SizeStore`]: objects and versions, no bytes (runs that
    /// measure time at scale).
    Model,
}

/// A node's disk: a lying `MemStore` with its recovery record, or a model's store.
enum Disk {
    Memory(NodeDisk),
    Model(Arc<dyn ObjectStore>),
}

/// How often a node looks at its store's latch (crates/daemon/src/disk.rs).
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// One running incarnation of a node.
pub struct SimNode {
    /// The node.
    pub id: NodeId,
    /// Its zone (0-based).
    pub zone: usize,
    /// Its store (behind drove's `GuardedStore` on a memory disk, as a daemon's).
    pub store: Arc<dyn ObjectStore>,
    /// The disk under it when it is a `MemStore` (to flip its blocks, make it lie).
    pub mem: Option<Arc<MemStore>>,
    /// The guard over it, which latches once the disk failed.
    pub guard: Option<Arc<GuardedStore>>,
    disk: Option<NodeDisk>,
    /// Its replica side.
    pub local: Arc<LocalStore>,
    /// Its gateway, through which its clients (VMs) read and write.
    pub gateway: Arc<Gateway>,
    /// Its recovery engine (also `vdi check` and scrub).
    pub recoverer: Arc<Recoverer>,
    /// Its way to its peers.
    pub transport: Arc<SimTransport>,
    /// Its run's metadata: a [`SimMeta`] in the model, its [`Meta`] with openraft.
    pub meta: Arc<dyn MetaApi>,
    /// The model's client, to show it the state.
    sim_meta: Option<Arc<SimMeta>>,
    /// Its real metadata (with openraft).
    pub raft: Option<Arc<Meta>>,
    /// Whether it serves its VMs: with openraft, once its metadata is ready (as a
    /// daemon opens its NBD ports).
    ready: Arc<std::sync::atomic::AtomicBool>,
    /// Its lock service: the daemon's, through [`SimMeta`] (a grant after an
    /// unsettled holder waits for the daemon's [`Settler`]).
    pub locks: Arc<MetaLocks>,
    /// Its post-crash settle: the daemon's.
    pub settler: Arc<Settler>,
    map: Arc<MapCell>,
    tasks: Vec<JoinHandle<()>>,
}

impl SimNode {
    /// The map this node holds.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.map.get()
    }

    /// Whether it serves its VMs (with openraft: once its metadata is ready).
    pub fn serving(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A node's store, opened from its disk.
struct Opened {
    store: Arc<dyn ObjectStore>,
    mem: Option<Arc<MemStore>>,
    guard: Option<Arc<GuardedStore>>,
    disk: Option<NodeDisk>,
}

/// The cluster.
pub struct SimCluster {
    /// The network.
    pub net: Arc<SimNet>,
    object_size: u32,
    disks: Disks,
    meta: Mutex<MetaState>,
    /// With openraft: the newest state a running node held when last asked, the
    /// answer while no node runs (the whole site powered off).
    last_raft_state: Mutex<Arc<MetaState>>,
    /// With openraft: every node's real metadata.
    raft: Option<raft::RaftMetas>,
    nodes: Mutex<BTreeMap<NodeId, Arc<SimNode>>>,
    /// Stores of crashed nodes, as they were at the crash.
    crashed: Mutex<BTreeMap<NodeId, Disk>>,
    /// The epoch history's maps, rebuilt when it grows.
    history: Mutex<Arc<Vec<ClusterMap>>>,
    this: Weak<SimCluster>,
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        self.net.detach_all();
        drove_types::clock::real_wall();
    }
}

impl SimCluster {
    /// A cluster of the model's nodes, all up, with objects of `object_size` bytes
    /// on `disks`. Must run on the simulator's runtime.
    pub fn new(model: Model, object_size: u32, disks: Disks) -> Arc<SimCluster> {
        let net = SimNet::new(model.clone());
        // Lease stamps and the metadata's clock read the simulated wall clock.
        drove_types::clock::simulate_wall(EPOCH_START_S * 1000);
        let c = Arc::new_cyclic(|this| SimCluster {
            net,
            object_size,
            disks,
            meta: Mutex::new(MetaState::default()),
            last_raft_state: Mutex::new(Arc::default()),
            raft: None,
            nodes: Mutex::new(BTreeMap::new()),
            crashed: Mutex::new(BTreeMap::new()),
            history: Mutex::new(Arc::default()),
            this: this.clone(),
        });
        let n = model.nodes() as u64;
        for id in 1..=n {
            if id > 1 {
                c.apply(&Command::AllocateNodeId)
                    .expect("a fresh state hands out node ids");
            }
            // Addresses the metadata checks; nothing connects to them.
            let info = raft::node_info(id, model.zone_of(id));
            c.apply(&Command::UpsertNode(info))
                .expect("a fresh state takes its nodes");
        }
        for id in 1..=n {
            let disk = c.new_disk();
            c.start_node(NodeId(id), disk);
        }
        c.publish();
        c
    }

    /// A cluster of the model's nodes whose metadata is `mode`'s. With openraft,
    /// node 1 bootstraps the metadata and the others join it one after the other,
    /// as `drove up` starts them; the cluster is returned once every node is
    /// ready and the voter keeper placed its voters. Must run on the simulator's
    /// runtime.
    pub async fn with_meta(
        model: Model,
        object_size: u32,
        disks: Disks,
        mode: MetaMode,
    ) -> Result<Arc<SimCluster>> {
        if mode == MetaMode::Model {
            return Ok(SimCluster::new(model, object_size, disks));
        }
        let net = SimNet::new(model.clone());
        drove_types::clock::simulate_wall(EPOCH_START_S * 1000);
        let c = Arc::new_cyclic(|this| SimCluster {
            raft: Some(raft::RaftMetas::new(net.clone())),
            net,
            object_size,
            disks,
            meta: Mutex::new(MetaState::default()),
            last_raft_state: Mutex::new(Arc::default()),
            nodes: Mutex::new(BTreeMap::new()),
            crashed: Mutex::new(BTreeMap::new()),
            history: Mutex::new(Arc::default()),
            this: this.clone(),
        });
        let n = model.nodes() as u64;
        for id in 1..=n {
            let disk = c.new_disk();
            c.start_raft_node(NodeId(id), disk).await?;
            if id == 1 {
                // The others join through it.
                if let Some(m) = c.node(NodeId(1)).and_then(|n| n.raft.clone()) {
                    m.ready(Duration::from_secs(60)).await?;
                }
            }
        }
        let voters = n.min(3) as usize;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let ready = c
                .node_ids()
                .into_iter()
                .all(|id| c.node(id).is_some_and(|n| n.serving()));
            let placed = c
                .leader()
                .is_some_and(|m| m.status().voters.len() == voters);
            if ready && placed {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::unavailable(format!(
                    "The simulated metadata did not form in 120 s (every node ready: {ready}, {voters} voters: {placed})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(c)
    }

    /// Which metadata this cluster runs.
    pub fn meta_mode(&self) -> MetaMode {
        if self.raft.is_some() {
            MetaMode::Raft
        } else {
            MetaMode::Model
        }
    }

    /// With openraft: the metadata of a running node that leads (in its own view,
    /// which a deposed leader cut off may still hold).
    pub fn leader(&self) -> Option<Arc<Meta>> {
        self.running_metas().into_iter().find(|m| {
            let s = m.status();
            s.leader == Some(s.node_id)
        })
    }

    /// With openraft: the metadata of every running node.
    fn running_metas(&self) -> Vec<Arc<Meta>> {
        self.nodes
            .lock()
            .values()
            .filter(|n| n.transport.alive())
            .filter_map(|n| n.raft.clone())
            .collect()
    }

    /// The model.
    pub fn model(&self) -> &Model {
        self.net.model()
    }

    /// Simulated milliseconds since the Unix epoch: the wall clock this cluster's
    /// nodes stamp leases with ([`drove_types::clock::unix_ms`], started at
    /// `EPOCH_START_S` when the cluster was made).
    pub fn now_ms(&self) -> u64 {
        drove_types::clock::unix_ms()
    }

    /// The running incarnation of node `id`.
    pub fn node(&self, id: NodeId) -> Option<Arc<SimNode>> {
        self.nodes.lock().get(&id).cloned()
    }

    /// Every node id.
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.nodes.lock().keys().copied().collect()
    }

    /// The metadata state. With openraft: the state of the running node that
    /// applied the most of the log (every applied entry was committed, so it is
    /// the newest state any node knows). While no node runs, the last such state:
    /// answered empty instead, a write acknowledged as the whole site lost power
    /// was checked against no lock at all (`drove sim faults --seed 5432 --time
    /// 20s --meta raft`). With the model: a copy of the model's state (callers
    /// that need only part of it use [`SimCluster::with_state`], which copies
    /// nothing).
    pub fn state(&self) -> Arc<MetaState> {
        if self.raft.is_none() {
            return Arc::new(self.meta.lock().clone());
        }
        self.raft_state()
    }

    /// With openraft: the newest applied state (see [`SimCluster::state`]),
    /// shared, not copied: the simulator asks it at every simulated write.
    fn raft_state(&self) -> Arc<MetaState> {
        let newest = self
            .running_metas()
            .into_iter()
            .max_by_key(|m| (m.last_applied_index(), std::cmp::Reverse(m.node_id())))
            .map(|m| m.state());
        let mut last = self.last_raft_state.lock();
        match newest {
            Some(st) => {
                *last = st.clone();
                st
            }
            None => last.clone(),
        }
    }

    /// Run `f` on the metadata state (as [`SimCluster::state`] picks it)
    /// without copying it.
    pub fn with_state<R>(&self, f: impl FnOnce(&MetaState) -> R) -> R {
        if self.raft.is_none() {
            return f(&self.meta.lock());
        }
        f(&self.raft_state())
    }

    /// The VDI named `name`.
    pub fn vdi(&self, name: &str) -> Option<VdiInfo> {
        self.with_state(|st| st.vdis.get(name).cloned())
    }

    fn new_disk(&self) -> Disk {
        let size = u64::from(self.object_size);
        match self.disks {
            Disks::Memory => Disk::Memory(NodeDisk::new(size)),
            Disks::Model => Disk::Model(Arc::new(crate::sizestore::SizeStore::new(size))),
        }
    }

    /// Open a node's store on `disk`, as a daemon does.
    fn open_disk(&self, id: NodeId, disk: Disk) -> (Opened, CatchUp) {
        match disk {
            Disk::Memory(d) => {
                let guard = Arc::new(GuardedStore::new(
                    d.mem.clone(),
                    format!("/sim/node-{id}/store"),
                ));
                let catchup = CatchUp::with_record(Some(d.record()), Some(d.boot_id()));
                let opened = Opened {
                    store: guard.clone(),
                    mem: Some(d.mem.clone()),
                    guard: Some(guard),
                    disk: Some(d),
                };
                (opened, catchup)
            }
            Disk::Model(s) => (
                Opened {
                    store: s,
                    mem: None,
                    guard: None,
                    disk: None,
                },
                CatchUp::open(None),
            ),
        }
    }

    /// Start node `id` on `disk` with the model's metadata.
    fn start_node(&self, id: NodeId, disk: Disk) {
        let zone = self.model().zone_of(id.0);
        let (opened, catchup) = self.open_disk(id, disk);
        let local = LocalStore::with_catchup(opened.store.clone(), catchup);
        let transport = self.net.attach(id, zone, local.clone());
        let map = Arc::new(MapCell::new(self.meta.lock().map.clone()));
        let sim_meta = SimMeta::new(
            self.this.clone(),
            id,
            transport.incarnation(),
            Arc::new(self.meta.lock().clone()),
        );
        let node = self.assemble(id, opened, local, transport, map, sim_meta.clone());
        let mut node = node;
        node.sim_meta = Some(sim_meta);
        node.tasks.push(tokio::spawn(node.recoverer.clone().run()));
        if let Some(g) = &node.guard {
            let (cluster, g) = (self.this.clone(), g.clone());
            node.tasks
                .push(tokio::spawn(mark_down_when_failed(cluster, id, g)));
        }
        node.ready.store(true, std::sync::atomic::Ordering::SeqCst);
        self.nodes.lock().insert(id, Arc::new(node));
    }

    /// Start node `id` on `disk` with its real metadata (on the metadata disk its
    /// last run left, or a new one), and what `drove node run` starts over it.
    async fn start_raft_node(&self, id: NodeId, disk: Disk) -> Result<()> {
        let Some(metas) = &self.raft else {
            return Err(Error::invalid("This cluster runs no openraft"));
        };
        let zone = self.model().zone_of(id.0);
        let (opened, catchup) = self.open_disk(id, disk);
        let local = LocalStore::with_catchup(opened.store.clone(), catchup);
        let transport = self.net.attach(id, zone, local.clone());
        let meta = metas.open(id, zone, &transport).await?;
        let map = Arc::new(MapCell::new(meta.state().map.clone()));
        let mut node = self.assemble(id, opened, local, transport, map, meta.clone());
        node.raft = Some(meta.clone());
        node.tasks.push(tokio::spawn(raft::node_tasks(
            meta,
            node.map.clone(),
            node.local.clone(),
            node.recoverer.clone(),
            node.guard.clone(),
            node.ready.clone(),
        )));
        self.nodes.lock().insert(id, Arc::new(node));
        Ok(())
    }

    /// A node's data path and the daemon's lock glue over `meta`.
    fn assemble(
        &self,
        id: NodeId,
        opened: Opened,
        local: Arc<LocalStore>,
        transport: Arc<SimTransport>,
        map: Arc<MapCell>,
        meta: Arc<dyn MetaApi>,
    ) -> SimNode {
        let zone = self.model().zone_of(id.0);
        let gateway = Gateway::new(
            id,
            local.clone(),
            transport.clone(),
            map.clone(),
            Metrics::new(),
        );
        gateway.set_membership(Arc::new(MetaMembership(meta.clone())));
        let recoverer = Recoverer::new(id, local.clone(), transport.clone());
        let settler = Settler::new(meta.clone(), LOCK_LEASE);
        settler.set_recoverer(recoverer.clone());
        let locks = MetaLocks::new(meta.clone(), LOCK_LEASE, settler.clone());
        SimNode {
            id,
            zone,
            store: opened.store,
            mem: opened.mem,
            guard: opened.guard,
            disk: opened.disk,
            local,
            gateway,
            recoverer,
            transport,
            meta,
            sim_meta: None,
            raft: None,
            ready: Arc::default(),
            locks,
            settler,
            map,
            tasks: Vec::new(),
        }
    }

    /// Crash node `id` (kill -9 of its process, or its host lost): it answers
    /// nothing more; its disk keeps what it held.
    pub fn crash(&self, id: NodeId) {
        self.net.crash(id);
        let Some(node) = self.nodes.lock().get(&id).cloned() else {
            return;
        };
        for t in &node.tasks {
            t.abort();
        }
        if let (Some(metas), Some(meta)) = (&self.raft, &node.raft) {
            metas.crashed(id, meta);
        }
        // The disk as it is at the crash: work the dead incarnation still has
        // under way (it never runs again, but a request may be half applied) does
        // not reach the restarted one.
        let disk = match &node.disk {
            Some(d) => Disk::Memory(d.after_crash()),
            None => {
                let Disk::Model(store) = self.new_disk() else {
                    return;
                };
                copy_store(node.store.as_ref(), store.as_ref(), self.object_size);
                Disk::Model(store)
            }
        };
        self.crashed.lock().insert(id, disk);
    }

    /// Start node `id` again after a crash, on the disk it had then.
    pub async fn restart(&self, id: NodeId) {
        let Some(disk) = self.crashed.lock().remove(&id) else {
            return;
        };
        if self.raft.is_none() {
            self.start_node(id, disk);
            self.publish();
            return;
        }
        if let Err(e) = self.start_raft_node(id, disk).await {
            // Its metadata disk opened before: this is a defect of the run.
            tracing::error!(node = %id, "cannot restart: {e}");
        }
    }

    /// Node `id`'s host loses power (its process crashes if it runs): its disks
    /// (objects, and metadata when it runs openraft) keep only what was flushed,
    /// but for what the kernel wrote back on its own, torn at block granularity
    /// (`chance` draws which). It stays off until
    /// [`SimCluster::restart`]. The objects that had unflushed changes.
    pub fn power_off(&self, id: NodeId, chance: &mut dyn FnMut(f64) -> bool) -> usize {
        if self.net.is_up(id) {
            self.crash(id);
        }
        if let Some(metas) = &self.raft {
            let lost = metas.power_lost(id, chance);
            tracing::debug!(node = %id, lost, "metadata disk sectors lost to the power loss");
        }
        match self.crashed.lock().get_mut(&id) {
            Some(Disk::Memory(d)) => d.power_loss(chance),
            _ => 0,
        }
    }

    /// Node `id` (stopped if it runs) gets a new, empty disk in place of its own:
    /// every copy it held is lost for good. It starts with [`SimCluster::restart`].
    pub fn replace_disk(&self, id: NodeId) {
        if self.net.is_up(id) {
            self.crash(id);
        }
        let disk = self.new_disk();
        self.crashed.lock().insert(id, disk);
    }

    /// Run `f` on the disk of node `id` while it is off (a memory disk).
    pub fn with_off_disk(&self, id: NodeId, f: impl FnOnce(&MemStore)) {
        if let Some(Disk::Memory(d)) = self.crashed.lock().get(&id) {
            f(&d.mem);
        }
    }

    /// Whether node `id` runs with a store its guard latched (its disk failed).
    pub fn disk_failed(&self, id: NodeId) -> bool {
        self.node(id)
            .and_then(|n| n.guard.clone())
            .is_some_and(|g| g.failure().is_some())
    }

    /// Whether node `id` is off, crashed or powered off, awaiting a restart.
    pub fn is_off(&self, id: NodeId) -> bool {
        self.crashed.lock().contains_key(&id)
    }

    /// Whether node `id` reaches the metadata's majority.
    pub fn reaches_meta(&self, id: NodeId) -> bool {
        let zone = self.model().zone_of(id.0);
        self.net.is_up(id) && !self.net.is_cut(zone)
    }

    /// Apply `cmd` to the metadata now, as its leader would, and show every node
    /// that reaches the metadata the new state.
    pub fn apply(&self, cmd: &Command) -> Result<Reply> {
        let now_s = self.now_ms() / 1000;
        let res = self.meta.lock().apply(cmd, now_s);
        let epoch = self.epoch();
        match &res {
            Ok(_) => tracing::debug!(epoch, ?cmd, "metadata: applied"),
            Err((_, msg)) => tracing::debug!(epoch, ?cmd, "metadata: refused: {msg}"),
        }
        let reply = res.map_err(|(kind, msg)| Error::new(kind, msg))?;
        self.publish();
        Ok(reply)
    }

    /// `cmd` sent by node `from`: it takes a commit round trip, and fails after the
    /// model's give-up time when `from` does not reach the metadata.
    pub async fn command_from(&self, from: NodeId, cmd: Command) -> Result<Reply> {
        self.commit_from(from, || self.apply(&cmd)).await
    }

    /// A lease renewal from node `from`, as the leader takes it: refused (`Locked`)
    /// unless the lock is still held by that run with that generation when it
    /// commits, then the lease is extended.
    pub async fn renew_from(&self, from: NodeId, r: Renew) -> Result<Reply> {
        self.commit_from(from, || {
            let held = {
                let st = self.meta.lock();
                st.vdis
                    .get(&r.vdi)
                    .and_then(|v| st.locks.get(&v.id))
                    .is_some_and(|l| {
                        l.owner == r.node
                            && l.incarnation == r.incarnation
                            && l.generation == r.generation
                            && l.handover_to.is_none()
                    })
            };
            if !held {
                return Err(Error::new(
                    ErrorKind::Locked,
                    format!("VDI '{}' lost its write lock on node {}", r.vdi, r.node),
                ));
            }
            self.apply(&Command::AcquireLock {
                vdi: r.vdi.clone(),
                node: r.node,
                now_ms: r.now_ms,
                lease_ms: r.lease_ms,
                incarnation: r.incarnation,
            })
        })
        .await
    }

    /// What `from` sends commits after a round trip (`commit`), or fails after the
    /// give-up time when `from` does not reach the metadata.
    async fn commit_from(
        &self,
        from: NodeId,
        commit: impl FnOnce() -> Result<Reply>,
    ) -> Result<Reply> {
        let model = self.model().clone();
        if !self.reaches_meta(from) {
            tokio::time::sleep(model.give_up).await;
            return Err(Error::unavailable(format!(
                "Node {from} does not reach the metadata"
            )));
        }
        tokio::time::sleep(model.commit_time()).await;
        if !self.reaches_meta(from) {
            tokio::time::sleep(model.give_up).await;
            return Err(Error::unavailable(format!(
                "Node {from} lost the metadata before the answer"
            )));
        }
        commit()
    }

    /// Show the current metadata to every node that reaches it: its map, the
    /// catalog its replica side judges requests by, and recovery's view. With
    /// openraft, each node follows its own metadata: nothing to do.
    pub fn publish(&self) {
        if self.raft.is_some() {
            return;
        }
        let st = Arc::new(self.meta.lock().clone());
        let map = Arc::new(st.map.clone());
        let vdis: Arc<BTreeMap<VdiId, VdiInfo>> =
            Arc::new(st.vdis.values().map(|v| (v.id, v.clone())).collect());
        let mut generations = st.lock_generations.clone();
        for v in st.vdis.values().filter(|v| v.snapshot) {
            generations.insert(v.id, u64::MAX);
        }
        let catalog = Catalog {
            map: map.clone(),
            vdis: vdis.clone(),
            next_vdi_id: st.next_vdi_id,
            generations,
        };
        let history = {
            let mut h = self.history.lock();
            let span = drove_meta::history_span(&st.epoch_history);
            if span != h.first().map(|m| m.epoch).zip(h.last().map(|m| m.epoch)) {
                *h = Arc::new(st.epoch_history.iter().map(|r| r.map.clone()).collect());
            }
            h.clone()
        };
        let view = View {
            map: map.clone(),
            vdis,
            history,
            noout: st.settings.noout,
            backfill_full_pct: st.settings.backfill_full_pct,
        };
        let nodes: Vec<Arc<SimNode>> = self.nodes.lock().values().cloned().collect();
        for n in nodes {
            if !self.reaches_meta(n.id) || !n.transport.alive() {
                continue;
            }
            n.map.set(map.clone());
            if let Some(m) = &n.sim_meta {
                m.set_view(st.clone());
            }
            n.local.catalog().publish(catalog.clone());
            n.recoverer.update(view.clone(), st.settings.recovery_mib_s);
        }
    }

    /// The failure detector's round: a node unreachable (crashed, or cut off with
    /// its zone) for the model's `down_after` is marked down; a node marked down
    /// that runs and reaches the metadata again is marked up. `unreachable_since`
    /// carries the detector's memory between rounds. Each verdict command commits
    /// after the model's commit time, one after the other as the leader's detector
    /// sends them: one command per round (`JudgeNodes`), or one per node as before
    /// (then 22 nodes lost take 22 commits, each a new epoch every node works out).
    pub async fn detect(&self, unreachable_since: &mut BTreeMap<NodeId, Instant>) {
        if self.raft.is_some() {
            // Production's detector runs on the metadata leader (Meta::run_health).
            return;
        }
        let now = Instant::now();
        let down_after = self.model().down_after;
        let map = self.meta.lock().map.clone();
        let mut verdicts = Vec::new();
        for n in map.nodes.values() {
            // A node whose disk failed says it is unhealthy in its heartbeats
            // (crates/daemon/src/disk.rs): the detector keeps it down.
            let reachable = self.reaches_meta(n.id) && !self.disk_failed(n.id);
            if reachable {
                unreachable_since.remove(&n.id);
                if n.state == NodeState::Down {
                    verdicts.push((n.id, NodeState::Up));
                }
                continue;
            }
            let since = *unreachable_since.entry(n.id).or_insert(now);
            if n.state == NodeState::Up && now.duration_since(since) >= down_after {
                verdicts.push((n.id, NodeState::Down));
            }
        }
        if verdicts.is_empty() {
            self.trim_history().await;
            return;
        }
        let commit = self.model().commit_time();
        if self.model().batch_verdicts {
            tokio::time::sleep(commit).await;
            let _ = self.apply(&Command::JudgeNodes { verdicts, term: 0 });
        } else {
            for (id, state) in verdicts {
                tokio::time::sleep(commit).await;
                let _ = self.apply(&Command::JudgeNodeState { id, state, term: 0 });
            }
        }
    }

    /// The leader's history trim, as drove's detector makes it from heartbeats:
    /// when every node of the map is up, reaches the metadata and is clean at the
    /// map's epoch, the epoch history is trimmed to that epoch
    /// ([`Command::TrimHistory`]).
    async fn trim_history(&self) {
        let st = self.state();
        let epoch = st.map.epoch;
        if st.epoch_history.first().is_none_or(|r| r.epoch >= epoch) {
            return;
        }
        let clean = st.map.nodes.values().all(|n| {
            n.state == NodeState::Up
                && self.reaches_meta(n.id)
                && self.node(n.id).is_some_and(|x| {
                    let p = x.recoverer.progress();
                    p.clean && p.epoch == epoch.0
                })
        });
        if clean {
            tokio::time::sleep(self.model().commit_time()).await;
            let _ = self.apply(&Command::TrimHistory { keep_from: epoch });
        }
    }

    /// Create a VDI of `size` bytes (with openraft, through a running node's
    /// metadata, as `drove vdi create` does).
    pub async fn create_vdi(
        &self,
        name: &str,
        size: u64,
        home_zone: Option<usize>,
        policy: WritePolicy,
    ) -> Result<VdiInfo> {
        let copies = self.model().copies;
        let cmd = Command::CreateVdi {
            name: name.to_string(),
            size,
            copies: Some(copies),
            mode: ReplicationMode::Direct,
            object_size: self.object_size,
            now: self.now_ms() / 1000,
            home_zone: home_zone.map(Model::zone_name),
            home_copies: None,
            policy,
            max_lag_ms: None,
            max_lag_bytes: None,
            qos: Default::default(),
        };
        let reply = match self.running_metas().first() {
            Some(m) if self.raft.is_some() => m.execute(cmd).await?,
            None if self.raft.is_some() => {
                return Err(Error::unavailable("No node runs to create a VDI"))
            }
            _ => self.apply(&cmd)?,
        };
        match reply {
            Reply::Vdi(v) => Ok(v),
            other => Err(Error::invalid(format!("CreateVdi answered {other:?}"))),
        }
    }

    /// Node `node` takes VDI `name`'s write lock for `lease` through the daemon's
    /// lock service (which settles an earlier holder's writes first); the lock's
    /// generation.
    pub async fn acquire(&self, name: &str, node: NodeId, lease: Duration) -> Result<u64> {
        let vdi = self
            .vdi(name)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("No VDI {name}")))?;
        let n = self
            .node(node)
            .ok_or_else(|| Error::unavailable(format!("No node {node}")))?;
        let locks = MetaLocks::new(n.meta.clone(), lease, n.settler.clone());
        Ok(locks.acquire(&vdi).await?.generation)
    }

    /// `count` VMs spread over the zones (VM i in zone i mod zones, on that zone's
    /// nodes in turn), each with a VDI `vm<i>` of `size` bytes homed in its zone under
    /// `policy` and locked by its node (a 600 s lease, the longest there is).
    pub async fn start_vms(
        &self,
        count: usize,
        size: u64,
        policy: WritePolicy,
    ) -> anyhow::Result<Vec<Vm>> {
        let model = self.model().clone();
        let mut vms = Vec::with_capacity(count);
        for i in 0..count {
            let zone = i % model.zones;
            let in_zone = (i / model.zones) % model.nodes_per_zone;
            let node = NodeId((zone * model.nodes_per_zone + in_zone) as u64 + 1);
            let name = format!("vm{i}");
            self.create_vdi(&name, size, Some(zone), policy)
                .await
                .map_err(|e| anyhow::anyhow!("cannot create VDI {name}: {e}"))?;
            let generation = self
                .acquire(&name, node, Duration::from_secs(600))
                .await
                .map_err(|e| anyhow::anyhow!("cannot lock VDI {name}: {e}"))?;
            vms.push(Vm {
                name,
                node,
                generation,
            });
        }
        Ok(vms)
    }

    /// Write the first `size` bytes of every VM's VDI once, 1 MiB at a time, through
    /// its node's gateway, all VMs at once.
    pub async fn fill(&self, vms: &[Vm], size: u64) -> anyhow::Result<()> {
        let object_size = u64::from(self.object_size);
        let fills = vms.iter().map(|vm| async move {
            let vdi = self
                .vdi(&vm.name)
                .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("No VDI {}", vm.name)))?;
            let node = self
                .node(vm.node)
                .ok_or_else(|| Error::unavailable(format!("No node {}", vm.node)))?;
            let data = bytes::Bytes::from(vec![0xa5u8; 1 << 20]);
            let mut off = 0;
            while off < size {
                let oid = drove_types::ObjectId::new(vdi.id, (off / object_size) as u32);
                node.gateway
                    .write(
                        &vdi,
                        oid,
                        off % object_size,
                        data.clone(),
                        false,
                        vm.generation,
                    )
                    .await?;
                off += 1 << 20;
            }
            Ok::<(), Error>(())
        });
        for r in futures::future::join_all(fills).await {
            r.map_err(|e| anyhow::anyhow!("filling the VDIs failed: {e}"))?;
        }
        Ok(())
    }

    /// The metadata's current map.
    pub fn map(&self) -> ClusterMap {
        self.with_state(|st| st.map.clone())
    }

    /// The epochs the metadata went through.
    pub fn epoch(&self) -> u64 {
        self.with_state(|st| st.map.epoch.0)
    }
}

/// A VM of a run: the VDI it writes, the node it runs on, the lock it holds.
#[derive(Debug, Clone)]
pub struct Vm {
    /// Its VDI's name.
    pub name: String,
    /// Its node (the VDI's gateway).
    pub node: NodeId,
    /// The lock generation it writes under.
    pub generation: u64,
}

/// What a daemon does once its store failed (crates/daemon/src/disk.rs): mark
/// itself down through the metadata, and again whenever the map shows it up.
async fn mark_down_when_failed(cluster: Weak<SimCluster>, me: NodeId, store: Arc<GuardedStore>) {
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let Some(c) = cluster.upgrade() else { return };
        let Some(f) = store.failure() else { continue };
        let up = c
            .node(me)
            .is_some_and(|n| n.map().node(me).is_some_and(|x| x.state == NodeState::Up));
        if !up {
            continue;
        }
        let cmd = Command::SetNodeState {
            id: me,
            state: NodeState::Down,
            reason: format!("by the node itself: {}", f.first),
            hold_ms: 0,
            judged: None,
        };
        if c.command_from(me, cmd).await.is_err() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Copy every object of `from` (bytes and version) into `to`. Blocks that fail
/// their checksum are left out (the caller marks them failing again).
fn copy_store(from: &dyn ObjectStore, to: &dyn ObjectStore, object_size: u32) {
    for oid in from.list().unwrap_or_default() {
        let version = from.version(oid).unwrap_or_default();
        match from.read(oid, 0, object_size) {
            Ok(d) => {
                let _ = to.create(oid, &d, version);
            }
            Err(_) => {
                for b in 0..u64::from(object_size) / 4096 {
                    if let Ok(d) = from.read(oid, b * 4096, 4096) {
                        let _ = to.write(oid, b * 4096, &d);
                    }
                }
                let _ = to.set_version(oid, version);
            }
        }
    }
}
