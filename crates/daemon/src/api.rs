//! The admin API's request and response bodies, shared by the node and the CLI.
pub use drove_meta::{ClientRequestId, EpochNote, VdiLock, QUORUM_FRESH};

/// The header by which a client names a request (32 hex digits, see
/// [`ClientRequestId`]): the metadata commands it causes are applied at most once
/// however often it is sent, and a repeat answers with the first outcome.
pub const REQUEST_ID_HEADER: &str = "drove-request-id";
use drove_types::{ClusterMap, Epoch, NodeId, ReplicationMode, VdiInfo};
use serde::{Deserialize, Serialize};

/// `POST /api/vdis`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateVdi {
    /// Name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Copies; the cluster default when absent.
    pub copies: Option<u8>,
    /// Write fan-out.
    #[serde(default)]
    pub mode: ReplicationMode,
    /// Replicas a write needs while some are down; the default when absent.
    #[serde(default)]
    pub min_copies: Option<u8>,
    /// Home zone; the first writer's zone when absent.
    #[serde(default)]
    pub home_zone: Option<String>,
    /// Copies in the home zone; min(2, copies) when absent.
    #[serde(default)]
    pub home_copies: Option<u8>,
    /// Write policy and zone-sync lag bounds (the same fields as
    /// `POST /api/vdis/{name}/policy`, at the top level): sync and the defaults (5 s,
    /// 256 MiB) for what is absent.
    #[serde(flatten)]
    pub write: Policy,
    /// I/O limits, over the cluster's default ones (a limit of 0 lifts a default).
    #[serde(default, skip_serializing_if = "drove_types::Qos::is_empty_change")]
    pub qos: drove_types::Qos,
}

/// `POST /api/vdis/{name}/policy`: what to change (at least one). A policy is a
/// string, so that a bad one is refused with the API's own error body.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Policy {
    /// New write policy, `sync` or `zone-sync`.
    #[serde(default)]
    pub policy: Option<String>,
    /// New zone-sync lag bound in milliseconds.
    #[serde(default)]
    pub max_lag_ms: Option<u32>,
    /// New zone-sync lag bound in bytes.
    #[serde(default)]
    pub max_lag_bytes: Option<u64>,
    /// Put the time bound back to its default (`vdi set` only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reset_max_lag_ms: bool,
    /// Put the byte bound back to its default (`vdi set` only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reset_max_lag_bytes: bool,
}

/// `POST /api/vdis/{name}/access`: the whole new NBD access list (certificate
/// common names; empty: any client the TCP port lets in).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Access {
    /// The client names.
    pub nbd_clients: Vec<String>,
}

/// `POST /api/vdis/{name}/min-copies`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MinCopies {
    /// 1..=copies, or `None` for the default (copies - 1, at least 1).
    pub min_copies: Option<u8>,
}

/// `POST /api/vdis/{name}/check`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Check {
    /// Make differing replicas identical.
    #[serde(default)]
    pub repair: bool,
}

/// `GET /api/recovery`: one node's recovery.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Recovery {
    /// The node answering.
    pub node_id: NodeId,
    /// Its progress.
    pub progress: drove_replica::Progress,
    /// Objects stored on the node (0 once a leaving node has drained).
    pub local_objects: u64,
}

/// `POST /api/vdis/{name}/resize`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resize {
    /// New size in bytes (grow only); with `grow`, the bytes to add.
    pub size: u64,
    /// Add `size` to the VDI's size instead of setting it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grow: bool,
}

/// `POST /api/vdis/{name}/rename`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rename {
    /// The new name (also the new NBD export name).
    pub to: String,
}

/// `POST /api/vdis/{name}/lock/break`: what the break did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockBreak {
    /// The lock taken from its holder; `None` when nobody held it.
    pub broken: Option<VdiLock>,
    /// The newest lock generation handed out now: replicas refuse older ones.
    pub fenced_below: u64,
}

/// `POST /api/settings`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Settings {
    /// Copies of VDIs created without `--copies`.
    pub default_copies: Option<u8>,
    /// A node silent this long is marked down (milliseconds).
    #[serde(default)]
    pub down_after_ms: Option<u64>,
    /// Recovery rate limit per node, MiB/s (0: none).
    #[serde(default)]
    pub recovery_mib_s: Option<u32>,
    /// How long a node a gateway found silent stays down at least (milliseconds).
    #[serde(default)]
    pub hold_down_ms: Option<u64>,
    /// Maintenance flag: down nodes are not re-replicated while it is set.
    #[serde(default)]
    pub noout: Option<bool>,
    /// Recovery stops copying onto a node whose disk is this full (percent in use).
    #[serde(default)]
    pub backfill_full_pct: Option<u8>,
    /// The I/O limits new VDIs start with; in a request, a change of them (a
    /// limit of 0 lifts it).
    #[serde(default)]
    pub default_qos: Option<drove_types::Qos>,
    /// The cluster's feature level (an answer only; `drove cluster upgrade finish`
    /// raises it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_level: Option<u32>,
}

/// `GET /api/cluster/upgrade` and the answer of `POST /api/cluster/upgrade/finish`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Upgrade {
    /// The cluster's feature level.
    pub feature_level: u32,
    /// The newest level the build of the node that answered knows.
    pub this_build: u32,
    /// The level before `finish` (absent in a status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub was: Option<u32>,
    /// Every node in the map with the level its build knows.
    pub nodes: Vec<NodeLevel>,
}

/// A node's build, as it recorded itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeLevel {
    /// The node.
    pub id: drove_types::NodeId,
    /// Its zone.
    pub zone: String,
    /// The newest cluster feature level its build knows (1: a build from before
    /// levels).
    pub features: u32,
    /// Its build version; empty from a build from before levels.
    pub version: String,
}

pub use drove_meta::{check_token_name, Role};

/// The headers that carry admin API token `token` (`Authorization: Bearer ...`,
/// marked sensitive so debug output never shows it); none without a token. Used by
/// the CLI and by nodes asking each other.
pub fn token_headers(
    token: Option<&str>,
) -> std::result::Result<reqwest::header::HeaderMap, String> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = token {
        let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {t}"))
            .map_err(|_| "The admin API token holds characters an HTTP header cannot carry")?;
        v.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    Ok(headers)
}

/// `POST /api/tokens`: make an admin API token.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenCreate {
    /// Its name (1 to 64 of `[A-Za-z0-9._-]`).
    pub name: String,
    /// What it may do.
    pub role: Role,
}

/// The answer to `POST /api/tokens`: the secret, which nothing stores.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenCreated {
    /// Its name.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The secret to send as `Authorization: Bearer SECRET` (`DROVE_TOKEN`).
    pub token: String,
}

/// One entry of `GET /api/tokens` (never the secret or its hash).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenInfo {
    /// Its name.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// When it was made (ms since the Unix epoch).
    pub created_ms: u64,
}

/// An error body: `{"error": "not_found", "message": "..."}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    /// Error kind (snake case).
    pub error: String,
    /// Human message.
    pub message: String,
}

/// `GET /api/status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// The cluster's identity (made when its first node bootstrapped).
    pub cluster_id: drove_types::ClusterId,
    /// The node answering.
    pub node_id: NodeId,
    /// Metadata leader, if known.
    pub leader: Option<NodeId>,
    /// Raft term.
    pub term: u64,
    /// Metadata voters.
    pub voters: Vec<NodeId>,
    /// Metadata learners.
    pub learners: Vec<NodeId>,
    /// Cluster map.
    pub map: ClusterMap,
    /// The epoch changes, oldest first: every one the history still holds (back
    /// to the last epoch at which every node was up and clean) and, before them,
    /// the last ones trimmed from it (`MAX_TRIMMED_NOTES`), without their maps.
    pub epoch_history: Vec<EpochNote>,
    /// The oldest epoch whose map the history keeps: recovery's memory, trimmed to
    /// the current epoch once every node is up and clean (the changes before it
    /// are in `epoch_history` without their maps).
    #[serde(default)]
    pub maps_from: Option<Epoch>,
    /// Copies of new VDIs by default.
    pub default_copies: u8,
    /// Number of VDIs.
    pub vdi_count: usize,
    /// Milliseconds since the answering node last knew of a working metadata
    /// majority; `None`: not since it started. Beyond a few seconds, the leader,
    /// node states and VDIs above are this node's last view and may be out of date.
    #[serde(default)]
    pub quorum_age_ms: Option<u64>,
    /// The maintenance flag `noout` is set: down nodes are not re-replicated.
    #[serde(default)]
    pub noout: bool,
    /// The cluster's feature level (`drove cluster upgrade`); 1 from a node from
    /// before levels.
    #[serde(default = "base_level")]
    pub feature_level: u32,
}

fn base_level() -> u32 {
    drove_types::BASE_FEATURE_LEVEL
}

/// `GET /api/vdis` and `GET /api/vdis/{name}` query: `consistent=true` first makes
/// the answering node confirm with the metadata leader that it has applied every
/// committed change (a read-index: no log entry), and fails (503) when it cannot.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReadQuery {
    /// Confirm the view with the leader first.
    #[serde(default)]
    pub consistent: bool,
}

/// `GET /api/vdis/{name}`: the record plus what this node can tell about it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VdiDetail {
    /// The record.
    #[serde(flatten)]
    pub info: VdiInfo,
    /// Objects that cover the VDI.
    pub objects: u64,
    /// NBD URIs on the answering node (empty when it is a witness: it serves no NBD).
    pub nbd_tcp: String,
    /// NBD URI through the answering node's unix socket (empty on a witness).
    pub nbd_unix: String,
    /// The write lock, when a gateway holds one.
    pub lock: Option<VdiLock>,
    /// The newest lock generation handed out (0: never written through a lock).
    #[serde(default)]
    pub lock_generation: u64,
    /// The newest generation whose writes are known identical on every replica;
    /// below `lock_generation - 1`, the next holder repairs first.
    #[serde(default)]
    pub settled_generation: u64,
}

/// One client that has a VDI open through a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Client {
    /// The node it is attached through.
    pub node: NodeId,
    /// Who: a TCP address, or the pid of a unix-socket client.
    pub client: String,
    /// Since when, seconds since the Unix epoch.
    pub since_unix: u64,
    /// Whether it has written through this connection.
    pub wrote: bool,
}

/// `GET /api/vdis/{name}/clients`: who has a VDI open, cluster-wide.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VdiClients {
    /// The clients, by node.
    pub clients: Vec<Client>,
    /// Up nodes that did not answer (they may have clients too).
    pub unreachable: Vec<NodeId>,
}

/// `GET /api/local/iostat`: the cumulative I/O of each VDI attached through one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIostat {
    /// The node that counted.
    pub node: NodeId,
    /// When it read its counters, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Each VDI's counters.
    pub vdis: Vec<drove_metrics::VdiIoSample>,
}

/// `GET /api/iostat`: every up node's [`NodeIostat`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterIostat {
    /// The nodes that answered, by id.
    pub nodes: Vec<NodeIostat>,
    /// Up nodes that did not answer (VDIs attached through them are missing).
    pub unreachable: Vec<NodeId>,
}

/// `DELETE /api/vdis/{name}` query.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DeleteQuery {
    /// Delete even while clients have the VDI open (their I/O then fails).
    #[serde(default)]
    pub force: bool,
}

/// `POST /api/vdis/{name}/handover`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Handover {
    /// The node that takes the lock.
    pub to: NodeId,
}

/// `POST /api/vdis/{name}/promote`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Promote {
    /// The zone that becomes the home.
    pub zone: String,
}

/// `POST /api/vdis/{name}/snapshot`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// Name of the snapshot.
    pub snap: String,
}

/// The answer to a snapshot: the frozen image and the VDI that goes on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshotted {
    /// The read-only snapshot (it keeps the VDI's data).
    pub snapshot: VdiInfo,
    /// The VDI, now a copy-on-write child of the snapshot.
    pub vdi: VdiInfo,
}

/// `POST /api/vdis/{snap}/clone`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Clone {
    /// Names of the new VDIs (several: made at once, all or none).
    pub names: Vec<String>,
    /// Delete it when its last writer detaches.
    #[serde(default)]
    pub ephemeral: bool,
}

/// `POST /api/vdis/{name}/rollback`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rollback {
    /// The snapshot to go back to.
    pub snap: String,
}

/// `POST /api/vdis/{name}/flatten`: the answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Flattened {
    /// The VDI, with no parent any more.
    pub vdi: VdiInfo,
    /// Objects copied from its parents.
    pub copied: u64,
}

/// `GET /api/local/objects` query.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ObjectsQuery {
    /// VDI ids (snapshots' or VDIs'), comma-separated numbers.
    pub vdis: String,
}

/// Most VDI ids one `GET /api/local/objects` may name.
pub const MAX_OBJECTS_QUERY_IDS: usize = 1024;

/// `GET /api/local/objects?vdis=ID,ID,...`: the objects of some VDI ids on the
/// answering node (one walk of its store for all of them).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalObjects {
    /// The node answering.
    pub node_id: NodeId,
    /// Object indexes stored, ascending, per VDI id asked for (every id asked for
    /// is there, with no indexes when the node stores none of its objects).
    pub vdis: std::collections::BTreeMap<drove_types::VdiId, Vec<u32>>,
}

/// `GET /api/usage`: what each VDI takes on the answering node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Usage {
    /// The node answering.
    pub node_id: NodeId,
    /// Per VDI id: objects, and bytes allocated on disk.
    pub vdis: Vec<VdiUsage>,
}

/// One VDI's share of one node's store.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VdiUsage {
    /// The VDI.
    pub id: drove_types::VdiId,
    /// Objects stored.
    pub objects: u64,
    /// Bytes allocated on disk.
    pub bytes: u64,
}

/// How healthy something is: `ok`, `warn` or `err` (ordered, worst last).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Nothing to do.
    Ok,
    /// Working, with less margin than it should have (a node down, recovery running).
    Warn,
    /// Not working, or about to lose data if one more thing fails (no metadata
    /// majority, a disk full).
    Err,
}

impl Level {
    /// `OK`, `WARN` or `ERR`, as the CLI prints it.
    pub fn word(self) -> &'static str {
        match self {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Err => "ERR",
        }
    }

    /// The exit code of `drove cluster health`: 0, 1 or 2.
    pub fn exit_code(self) -> i32 {
        match self {
            Level::Ok => 0,
            Level::Warn => 1,
            Level::Err => 2,
        }
    }
}

/// One finding of a health check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthCheck {
    /// How bad.
    pub level: Level,
    /// Which check: `quorum`, `nodes`, `voters`, `upgrade`, `recovery`, `disk`,
    /// `clock`, `lag` or `reach`.
    pub check: String,
    /// What was found, for a person.
    pub message: String,
}

/// `GET /api/health`: the cluster's health as the answering node judges it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// The worst level of the checks.
    pub status: Level,
    /// The node that judged.
    pub node_id: NodeId,
    /// Milliseconds since it last knew of a working metadata majority (`None`: not
    /// since it started).
    pub quorum_age_ms: Option<u64>,
    /// Every check, the worst first; each check that found nothing says so (`ok`).
    pub checks: Vec<HealthCheck>,
}

/// `GET /api/local/health`: what one node says about itself, for `/api/health`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalHealth {
    /// The node answering.
    pub node_id: NodeId,
    /// Its clock, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Its recovery.
    pub recovery: drove_replica::Progress,
    /// Size of the filesystem holding its objects, bytes (`None`: unknown).
    pub disk_bytes: Option<u64>,
    /// Space left there for drove, bytes.
    pub disk_free_bytes: Option<u64>,
    /// Space the node keeps free there for its metadata: below it, writes that need
    /// new space are refused with ENOSPC (`None`: from a node that predates it).
    #[serde(default)]
    pub disk_reserve_bytes: Option<u64>,
    /// The data directory whose file system that is (to name the disk).
    #[serde(default)]
    pub data_dir: Option<String>,
    /// Why the node's metadata service (its openraft core) stopped for good, if it
    /// did: the node then exits so that its service manager restarts it.
    #[serde(default)]
    pub meta_stopped: Option<String>,
    /// Why its disk was judged failed (EIO, a failed fsync), if it was: the node
    /// then serves nothing from it and keeps itself down.
    #[serde(default)]
    pub disk_failed: Option<String>,
    /// The zone-sync lag of each VDI written through it.
    pub lags: Vec<crate::wan::LagReport>,
}

/// `POST /api/bench/locks`: `count` write-lock acquire+release cycles run by the
/// node, one worker per VDI (each named `drove-bench-...`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchLocks {
    /// The VDIs to lock, one worker each.
    pub vdis: Vec<String>,
    /// Cycles in all.
    pub count: usize,
}

/// What a benchmark run on a node measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchResult {
    /// Operations asked for.
    pub count: usize,
    /// Operations that failed.
    pub failed: usize,
    /// Time for all of them.
    pub seconds: f64,
    /// Median latency of the operations that succeeded.
    pub p50_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
    /// The first failure's message.
    #[serde(default)]
    pub first_error: Option<String>,
}
