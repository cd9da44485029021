//! [`Meta`]: one node's handle on the metadata service. It owns the Raft instance, the
//! background task that bootstraps or joins the cluster, and the HTTP client used to
//! reach other members. Opening is split from readiness ([`Meta::open`] then
//! [`Meta::ready`]) because peers need this node's router served to elect a leader.
use crate::db::{keys, Db, DbError};
use crate::log_store::LogStore;
use crate::net::MetaNet;
use crate::network::Network;
use crate::startup::{allocate_node_id, ask_cluster_id, Progress};
use crate::state::MetaState;
use crate::state_machine::StateMachine;
use crate::types::{Raft, RequestId};
use crate::{MetaConfig, MetaStatus};
use drove_types::clock::Instant;
use drove_types::{ClusterId, Error, NodeId, Result};
use parking_lot::Mutex;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long `open` waits for the redb file lock (held by a previous instance of this
/// node in the same process that is still shutting down).
const DB_LOCK_WAIT: Duration = Duration::from_secs(10);

/// The metadata service of one node.
pub struct Meta {
    pub(crate) id: u64,
    /// The cluster this node belongs to; messages from any other are refused.
    pub(crate) cluster: ClusterId,
    pub(crate) cfg: MetaConfig,
    /// The join member's internal address, learnt from its hello on a first start.
    join_internal: Option<String>,
    pub(crate) raft: Raft,
    state_rx: watch::Receiver<Arc<MetaState>>,
    pub(crate) client: crate::remote::Client,
    client_id: u64,
    seq: AtomicU64,
    /// Serializes membership changes on the leader, so two joins racing cannot both
    /// see room for one more voter.
    pub(crate) membership_lock: tokio::sync::Mutex<()>,
    pub(crate) progress: watch::Sender<Progress>,
    /// The background tasks: startup, and the leader's voter placement.
    startup_task: Mutex<Vec<JoinHandle<()>>>,
    closed: AtomicBool,
    pub(crate) health: crate::health::Health,
    /// Group commit of this node's proposals (see [`crate::batch`]).
    pub(crate) batch: crate::batch::Batcher,
    /// This node's writes on their way to the leader (see [`crate::forward`]).
    pub(crate) forward: crate::forward::Forwarder,
    /// The node's metrics, once [`Meta::set_metrics`] gave them.
    metrics: crate::batch::MetricsCell,
    /// Lease renewals confirmed while leading (see [`crate::lease`]).
    pub(crate) leases: Arc<crate::lease::Leases>,
}

/// Seconds since the Unix epoch on this node's wall clock (the simulator's on its
/// thread: [`drove_types::clock`]).
pub(crate) fn unix_now() -> u64 {
    drove_types::clock::unix_secs()
}

/// This node's clock, milliseconds since the Unix epoch (0 if before 1970).
pub(crate) fn unix_now_ms() -> u64 {
    drove_types::clock::unix_ms()
}

/// A random id for this process's requests (seeded on a simulator's thread:
/// [`drove_types::random`]).
pub fn random_u64() -> u64 {
    drove_types::random::u64()
}

fn db_error(what: &str, e: DbError) -> Error {
    Error::new(drove_types::ErrorKind::Io, format!("{what}: {e}"))
}

async fn open_db(path: &Path) -> Result<Db> {
    let deadline = Instant::now() + DB_LOCK_WAIT;
    loop {
        match Db::open(path) {
            Ok(db) => return Ok(db),
            Err(e) if e.is_already_open() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(db_error(&format!("Cannot open {}", path.display()), e)),
        }
    }
}

/// The cluster id of this data directory: the stored one; else a new one for a node
/// that bootstraps a cluster, or `joined` (the cluster's at the join address) for a
/// node that joins one. Stored before anything else, so a node restarted half-way
/// keeps its cluster.
async fn cluster_id(db: &Db, has_node_id: bool, joined: Option<ClusterId>) -> Result<ClusterId> {
    let stored: Option<ClusterId> = db
        .get(keys::CLUSTER_ID)
        .map_err(|e| db_error("Cannot read the cluster id", e))?;
    let id = match (stored, joined) {
        (Some(id), _) => return Ok(id),
        (None, _) if has_node_id => {
            return Err(Error::invalid(
                "This data directory was made by a drove version without cluster ids; \
                 recreate the cluster (drove is not released yet: there is no upgrade path)",
            ))
        }
        (None, None) => {
            let mut bytes = [0u8; 16];
            drove_types::random::fill(&mut bytes);
            let id = ClusterId(u128::from_be_bytes(bytes));
            tracing::info!(cluster = %id, "new cluster id");
            id
        }
        (None, Some(id)) => {
            tracing::info!(cluster = %id, "joining cluster");
            id
        }
    };
    db.put(keys::CLUSTER_ID, &id)
        .await
        .map_err(|e| db_error("Cannot store the cluster id", e))?;
    Ok(id)
}

fn raft_config() -> Result<Arc<openraft::Config>> {
    let config = openraft::Config {
        cluster_name: "drove-meta".to_string(),
        // openraft 0.9 reads these three as follows (core/raft_core.rs, engine):
        // the leader sends a heartbeat on its tick, every 1.5 heartbeat intervals;
        // a follower that knows a leader votes for nobody else until
        // `election_timeout_max` (the leader lease) has passed since it last heard
        // from it, and stands for election itself after the lease plus a random
        // `election_timeout_min..max`, looked at on the same tick. With 1500-3000 ms
        // a dead leader was replaced 4.5-6 s after its last heartbeat, and every
        // write that had skipped its replica waited that long for the mark-down
        // (bench/results/pause-2026-11-27.md). Now: heartbeats every 150 ms, a new
        // leader 0.6-0.85 s after the last one, and a follower stands after 4
        // ticks without a word from a live leader (with fio and two CPU hogs on
        // this 2-core machine at a load average of 10: one election in 5 minutes,
        // none in another 3; no mark-down in either).
        //
        // openraft also takes the heartbeat interval as the time an append may
        // take to be answered; a slower one is retried after the network's
        // back-off. Follower fsyncs of 0.5-1 s were seen while 32 VMs wrote at full
        // speed on a 2-core machine: commits then wait for the retried appends,
        // which is the price of failing over in under a second.
        heartbeat_interval: 100,
        election_timeout_min: 250,
        election_timeout_max: 350,
        install_snapshot_timeout: 5000,
        // JSON-encoded chunks must stay well under the HTTP body limit.
        snapshot_max_chunk_size: 256 << 10,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(1000),
        ..Default::default()
    };
    let config = config
        .validate()
        .map_err(|e| Error::invalid(format!("Bad Raft configuration: {e}")))?;
    Ok(Arc::new(config))
}

impl Meta {
    /// Start this node's metadata service and return at once; [`Meta::ready`] waits
    /// until it has joined the cluster. On a fresh directory with no join address it
    /// bootstraps a one-voter cluster as node 1; with a join address it first gets a
    /// node id from that cluster (so the join address must answer); on an existing
    /// directory it reuses the persisted id, log, vote and snapshot.
    pub async fn open(cfg: MetaConfig) -> Result<Arc<Meta>> {
        let net = crate::HttpNet::new(cfg.tls.clone(), cfg.routes.clone())?;
        Meta::open_on(cfg, net).await
    }

    /// [`Meta::open`], reaching the other nodes through `net` (see [`MetaNet`]).
    pub async fn open_on(cfg: MetaConfig, net: Arc<dyn MetaNet>) -> Result<Arc<Meta>> {
        let dir = cfg.data_dir.join("meta");
        // The metadata names every VDI and holds its keys' wrappings: its user only.
        drove_types::private_fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("Cannot create {}", dir.display()), e))?;
        let db = open_db(&dir.join("raft.redb")).await?;
        Meta::start(cfg, net, db).await
    }

    /// [`Meta::open_on`] with the metadata's file on `disk`, in memory (a simulated
    /// node's disk); `cfg.data_dir` is not used.
    pub async fn open_in_memory(
        cfg: MetaConfig,
        net: Arc<dyn MetaNet>,
        disk: crate::MemDisk,
    ) -> Result<Arc<Meta>> {
        let db = Db::open_mem(disk).map_err(|e| db_error("Cannot open the metadata disk", e))?;
        Meta::start(cfg, net, db).await
    }

    async fn start(cfg: MetaConfig, net: Arc<dyn MetaNet>, db: Db) -> Result<Arc<Meta>> {
        let mut client = crate::remote::Client { net, cluster: None };
        // Node-made request ids keep the top bit clear (clients' have it set).
        let client_id = random_u64() & !crate::client_req::EXTERNAL_CLIENT;
        let stored: Option<u64> = db
            .get(keys::NODE_ID)
            .map_err(|e| db_error("Cannot read the node id", e))?;
        // A first start with a join address asks that member's public hello for the
        // cluster id and for where its internal routes are (its peer port).
        let joining = match (&cfg.join, stored) {
            (Some(join), None) => {
                let deadline = Instant::now() + cfg.join_timeout;
                let hello = ask_cluster_id(&client, join, deadline).await?;
                let internal = hello.internal.clone().unwrap_or_else(|| join.clone());
                tracing::info!(join, %internal, "the member at {join} serves its internal routes at {internal}");
                Some((hello.cluster, internal))
            }
            _ => None,
        };
        let cluster = cluster_id(&db, stored.is_some(), joining.as_ref().map(|j| j.0)).await?;
        let join_internal = joining.map(|j| j.1);
        // Every internal call from here on names the cluster; receivers refuse others.
        client.cluster = Some(cluster);
        let id = match (stored, &cfg.join) {
            (Some(id), _) => id,
            (None, None) => 1,
            (None, Some(_)) => {
                let deadline = Instant::now() + cfg.join_timeout;
                let at = join_internal.as_deref().unwrap_or_default();
                allocate_node_id(&client, at, client_id, deadline).await?
            }
        };
        if stored.is_none() {
            // Persisted before Raft starts: a restart must come back as the same node.
            db.put(keys::NODE_ID, &id)
                .await
                .map_err(|e| db_error("Cannot store the node id", e))?;
            tracing::info!(node = id, "metadata node id assigned");
        }
        let (sm, state_rx) = StateMachine::open(db.clone())
            .map_err(|e| db_error("Cannot load the metadata snapshot", e))?;
        let raft = Raft::new(
            id,
            raft_config()?,
            Network::new(client.clone()),
            LogStore::new(db),
            sm,
        )
        .await
        .map_err(|e| Error::unavailable(format!("Cannot start metadata Raft: {e}")))?;
        let (progress, _) = watch::channel(Progress::Pending("starting".to_string()));
        let metrics = crate::batch::MetricsCell::default();
        let leases = Arc::new(crate::lease::Leases::default());
        let meta = Arc::new(Meta {
            id,
            cluster,
            cfg,
            join_internal,
            raft: raft.clone(),
            state_rx,
            forward: crate::forward::Forwarder::new(
                client.clone(),
                crate::write::FORWARD_TIMEOUT,
                metrics.clone(),
            ),
            client,
            client_id,
            seq: AtomicU64::new(1),
            membership_lock: tokio::sync::Mutex::new(()),
            progress,
            startup_task: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            health: Default::default(),
            batch: crate::batch::Batcher::new(
                raft,
                random_u64() & !crate::client_req::EXTERNAL_CLIENT,
                metrics.clone(),
                leases.clone(),
            ),
            metrics,
            leases,
        });
        let tasks = vec![
            tokio::spawn(meta.clone().run_startup()),
            tokio::spawn(meta.clone().run_vote_keeper()),
        ];
        *meta.startup_task.lock() = tasks;
        Ok(meta)
    }

    /// Wait until this node is a member of a cluster with a leader and has recorded
    /// its own addresses in the map. The work goes on in the background after a
    /// timeout; the error says where it stands.
    pub async fn ready(&self, timeout: Duration) -> Result<()> {
        let mut rx = self.progress.subscribe();
        let waited = tokio::time::timeout(timeout, async {
            let p = rx.wait_for(|p| !matches!(p, Progress::Pending(_))).await;
            p.map(|p| p.clone())
        })
        .await;
        match waited {
            Ok(Ok(Progress::Ready)) => Ok(()),
            Ok(Ok(Progress::Failed(why))) => Err(Error::new(drove_types::ErrorKind::Gone, why)),
            Ok(_) => Err(Error::unavailable("Metadata service stopped")),
            Err(_) => {
                let why = match &*self.progress.borrow() {
                    Progress::Pending(why) => why.clone(),
                    other => format!("{other:?}"),
                };
                Err(Error::unavailable(format!(
                    "Metadata not ready after {}s: {why}",
                    timeout.as_secs()
                )))
            }
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        NodeId(self.id)
    }

    /// The cluster this node belongs to.
    pub fn cluster_id(&self) -> ClusterId {
        self.cluster
    }

    /// This run of the node's process (random at every start): locks it takes carry
    /// it, so a restarted node never renews a lock its previous run held.
    pub fn incarnation(&self) -> u64 {
        self.client_id
    }

    /// The internal HTTP routes of the metadata service, under `/raft/` (Raft RPCs)
    /// and `/meta/` (forwarded writes, joins, heartbeats): served on the node's peer
    /// port, never on the public admin API.
    pub fn router(self: &Arc<Self>) -> axum::Router {
        crate::http::router(self.clone())
    }

    /// The one metadata route of the public admin API: `GET /meta/hello` (cluster id,
    /// node id and internal address), which a joining node asks its `--join` address.
    pub fn public_router(self: &Arc<Self>) -> axum::Router {
        crate::http::public_router(self.clone())
    }

    /// The latest state applied on this node (an `Arc` clone).
    pub fn state(&self) -> Arc<MetaState> {
        self.state_rx.borrow().clone()
    }

    /// A receiver that sees every newly applied state.
    pub fn watch(&self) -> watch::Receiver<Arc<MetaState>> {
        self.state_rx.clone()
    }

    /// Report into the node's metrics from now on (commits, commands).
    pub fn set_metrics(&self, metrics: Arc<drove_metrics::Metrics>) {
        let _ = self.metrics.set(metrics);
    }

    /// Count one lease renewal answered by this node as leader.
    pub(crate) fn count_renewal(&self, outcome: &str) {
        if let Some(m) = self.metrics.get() {
            m.meta().command("RenewLease", outcome);
        }
    }

    /// Bring the Raft gauges of the node's metrics up to date (at each scrape).
    pub fn publish_metrics(&self) {
        let Some(m) = self.metrics.get() else { return };
        let r = self.raft.metrics().borrow().clone();
        let leader = r.current_leader.unwrap_or(0);
        let quorum = self
            .quorum_age()
            .is_some_and(|a| a < crate::health::QUORUM_FRESH);
        m.meta().raft(
            r.last_applied.map_or(0, |l| l.index),
            r.current_term,
            leader,
            quorum,
        );
    }

    /// The index of the last log entry this node applied: [`Meta::status`]'s
    /// `last_applied_index` without copying the whole Raft metrics (the simulator
    /// asks it at every simulated write).
    pub fn last_applied_index(&self) -> Option<u64> {
        self.raft.metrics().borrow().last_applied.map(|l| l.index)
    }

    /// Raft status of this node.
    pub fn status(&self) -> MetaStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        MetaStatus {
            node_id: NodeId(self.id),
            leader: m.current_leader.map(NodeId),
            term: m.current_term,
            voters: membership.voter_ids().map(NodeId).collect(),
            learners: membership.learner_ids().map(NodeId).collect(),
            last_applied_index: m.last_applied.map(|l| l.index),
            quorum_age_ms: self.quorum_age().map(|a| a.as_millis() as u64),
        }
    }

    /// Take a snapshot of the state and drop the log entries it covers. Members that
    /// fall behind (or join) later receive the snapshot instead of the full log.
    pub async fn compact(&self) -> Result<()> {
        let stopped =
            |e: &dyn std::fmt::Display| Error::unavailable(format!("Metadata Raft stopped: {e}"));
        let applied = self.raft.metrics().borrow().last_applied;
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| stopped(&e))?;
        let m = self
            .raft
            .wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.snapshot >= applied, "snapshot built")
            .await
            .map_err(|e| Error::unavailable(format!("Snapshot not built: {e}")))?;
        if let Some(snap) = m.snapshot {
            self.raft
                .trigger()
                .purge_log(snap.index)
                .await
                .map_err(|e| stopped(&e))?;
        }
        Ok(())
    }

    /// Stop Raft and the background work. Further calls fail with `Unavailable`.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let tasks = std::mem::take(&mut *self.startup_task.lock());
        for task in tasks {
            task.abort();
        }
        self.progress.send_if_modified(|p| {
            let pending = matches!(p, Progress::Pending(_));
            if pending {
                *p = Progress::Stopped;
            }
            pending
        });
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(node = self.id, "metadata Raft did not stop cleanly: {e}");
        }
        tracing::info!(node = self.id, "metadata service stopped");
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    pub(crate) fn next_request_id(&self) -> RequestId {
        RequestId {
            client: self.client_id,
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Where a call meant for the leader goes: the leader's address `hint` given by
    /// the previous try, else the leader this node follows.
    pub(crate) fn to_leader(&self, hint: Option<String>) -> ToLeader {
        if self.is_closed() {
            return ToLeader::Closed;
        }
        let leader = self.leader();
        let here = match &hint {
            Some(addr) => *addr == self.cfg.addr,
            None => leader.as_ref().is_some_and(|(id, _)| *id == self.id),
        };
        if here {
            return ToLeader::Here;
        }
        match hint.or(leader.map(|(_, addr)| addr)) {
            Some(addr) => ToLeader::There(addr),
            None => ToLeader::Unknown,
        }
    }

    /// The Raft address (internal routes) of member `id`, from this node's copy of the
    /// membership.
    pub(crate) fn raft_addr(&self, id: u64) -> Option<String> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let node = m.membership_config.membership().get_node(&id)?;
        Some(node.addr.clone())
    }

    /// The leader this node follows: `(id, Raft address)`.
    pub(crate) fn leader(&self) -> Option<(u64, String)> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let id = m.current_leader?;
        let node = m.membership_config.membership().get_node(&id)?;
        Some((id, node.addr.clone()))
    }

    /// Internal addresses to ask for the leader: the join member's (on a first
    /// start), then the other members this node knows from its own copy of the
    /// membership.
    pub(crate) fn contact_points(&self) -> Vec<String> {
        let mut out: Vec<String> = self.join_internal.iter().cloned().collect();
        let m = self.raft.metrics();
        let m = m.borrow();
        for (id, node) in m.membership_config.membership().nodes() {
            if *id != self.id && node.addr != self.cfg.addr && !out.contains(&node.addr) {
                out.push(node.addr.clone());
            }
        }
        out
    }

    /// Whether this node is a voter registered under its configured address.
    pub(crate) fn is_voter_here(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        membership.voter_ids().any(|v| v == self.id)
            && membership
                .get_node(&self.id)
                .is_some_and(|n| n.addr == self.cfg.addr)
    }
}

/// See [`Meta::to_leader`].
pub(crate) enum ToLeader {
    /// This node's metadata service has stopped.
    Closed,
    /// This node (it leads, or was named the leader).
    Here,
    /// The node at this admin address.
    There(String),
    /// No leader known yet.
    Unknown,
}

impl ToLeader {
    /// The try to make when no leader is known: wait and ask again.
    pub(crate) fn no_leader<T>() -> crate::remote::Attempt<T> {
        crate::remote::Attempt::Retry {
            hint: None,
            why: "no leader known".to_string(),
        }
    }
}
