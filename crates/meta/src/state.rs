//! The cluster metadata itself: the cluster map with its epoch history, the VDI table
//! and the settings, and the commands that change them. This is the replicated state
//! machine's pure core: [`MetaState::apply`] is a plain match with no I/O, so every
//! node that applies the same committed log reaches the same state. Nothing here is on
//! the data path; gateways work from copies of the map and VDI records they hold.
use drove_types::{
    validate_max_lag, validate_name, ClusterMap, Epoch, ErrorKind, NodeId, NodeInfo, NodeState,
    ReplicationMode, VdiId, VdiInfo, WritePolicy, BLOCK_SIZE, MAX_COPIES,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Largest VDI: 1 PiB.
pub const MAX_VDI_SIZE: u64 = 1 << 50;

/// VDI sizes are whole 512-byte sectors.
pub const SECTOR_SIZE: u64 = 512;

/// Largest object size a VDI may ask for: 1 GiB.
pub const MAX_OBJECT_SIZE: u32 = 1 << 30;

/// Longest lock lease: a lock taken for longer could outlive its holder for good
/// (an endless lease once locked a VDI across restarts).
pub const MAX_LEASE_MS: u64 = 10 * 60 * 1000;

/// How far a lock request's clock may be from the time in its log entry.
pub const MAX_CLOCK_SKEW_MS: u64 = 5 * 60 * 1000;

/// Longest hold-down of a node marked down.
pub const MAX_HOLD_DOWN_MS: u64 = 24 * 3600 * 1000;

/// Largest placement weight of a node.
pub const MAX_WEIGHT: u32 = 1_000_000;

/// Most verdicts one [`Command::JudgeNodes`] may carry.
pub const MAX_VERDICTS: usize = 4096;

/// One change of the cluster map, kept forever so recovery can reason about old epochs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// The epoch the change produced.
    pub epoch: Epoch,
    /// When the change was proposed, seconds since the Unix epoch.
    pub at_unix: u64,
    /// What changed, for humans.
    pub change: String,
    /// The map as it was at this epoch: recovery works out from it which objects a
    /// node held at every epoch, including epochs it did not see go by.
    pub map: ClusterMap,
}

/// An epoch change as `drove cluster status` shows it: when and what, without
/// the map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochNote {
    /// The epoch the change produced.
    pub epoch: Epoch,
    /// When the change was proposed, seconds since the Unix epoch.
    pub at_unix: u64,
    /// What changed, for humans.
    pub change: String,
}

impl From<&EpochRecord> for EpochNote {
    fn from(r: &EpochRecord) -> Self {
        EpochNote {
            epoch: r.epoch,
            at_unix: r.at_unix,
            change: r.change.clone(),
        }
    }
}

/// Epoch changes trimmed from the history whose notes are kept for `drove cluster
/// status` (the oldest go first).
pub const MAX_TRIMMED_NOTES: usize = 1024;

/// Which stretch of epochs an epoch history holds: its first and last epochs.
/// The history is contiguous (one record per epoch, trimmed only from the front),
/// so two histories with the same span hold the same records. Its length alone
/// does not say that: trimmed and grown again, a history has its old length and
/// other maps.
pub fn history_span(history: &[EpochRecord]) -> Option<(Epoch, Epoch)> {
    Some((history.first()?.epoch, history.last()?.epoch))
}

/// Cluster-wide settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// Copies of a new VDI that does not ask for a number.
    pub default_copies: u8,
    /// Largest number of Raft voters; further nodes join as learners.
    pub max_voters: usize,
    /// A node whose heartbeats stop for this long is marked down (milliseconds).
    pub down_after_ms: u64,
    /// Recovery copies at most this many MiB per second per node (0: no limit).
    pub recovery_mib_s: u32,
    /// A node a gateway marked down because it went silent stays down at least this
    /// long (milliseconds), even if its heartbeats come back at once: a node that
    /// stalls now and then is not flipped down and up (an epoch and a recovery pass
    /// each time) more than once per hold.
    #[serde(default = "default_hold_down_ms")]
    pub hold_down_ms: u64,
    /// Maintenance flag (`drove cluster set noout on`, Ceph's `noout`): down nodes
    /// are not re-replicated. They are still marked down and left out of reads
    /// and writes; only recovery's background copying of what moved because a
    /// node is down waits. Writes still bring every copy they touch up to date.
    #[serde(default)]
    pub noout: bool,
    /// Recovery stops copying onto a node whose disk is this full or fuller (percent
    /// of its size in use; Ceph's backfillfull ratio): copies that are there only to
    /// restore redundancy must not take the space its clients' writes need. 100:
    /// never held back.
    #[serde(default = "default_backfill_full_pct")]
    pub backfill_full_pct: u8,
}

/// Default of [`Settings::backfill_full_pct`]: 90 %, between the 85 % at which
/// `cluster health` warns of a disk near full and the 95 % at which it is an error.
pub const DEFAULT_BACKFILL_FULL_PCT: u8 = 90;

fn default_backfill_full_pct() -> u8 {
    DEFAULT_BACKFILL_FULL_PCT
}

/// Default of [`Settings::hold_down_ms`]: one minute.
pub const DEFAULT_HOLD_DOWN_MS: u64 = 60_000;

fn default_hold_down_ms() -> u64 {
    DEFAULT_HOLD_DOWN_MS
}

/// Default of [`Settings::down_after_ms`]: 5 s.
pub const DEFAULT_DOWN_AFTER_MS: u64 = 5000;

/// Default of [`Settings::recovery_mib_s`].
pub const DEFAULT_RECOVERY_MIB_S: u32 = 200;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            default_copies: 3,
            max_voters: 3,
            down_after_ms: DEFAULT_DOWN_AFTER_MS,
            recovery_mib_s: DEFAULT_RECOVERY_MIB_S,
            hold_down_ms: DEFAULT_HOLD_DOWN_MS,
            noout: false,
            backfill_full_pct: DEFAULT_BACKFILL_FULL_PCT,
        }
    }
}

/// The write lock of a VDI: a lease held by the gateway node that writes it.
/// Replicas refuse writes that carry an older `generation` (fencing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VdiLock {
    /// The gateway node holding the lock.
    pub owner: NodeId,
    /// Grows by one at every new holder; never reused for a VDI.
    pub generation: u64,
    /// The lease ends at this time (milliseconds since the Unix epoch, holder's clock).
    pub expires_ms: u64,
    /// A node that asked the holder to hand the lock over.
    pub handover_to: Option<NodeId>,
    /// The VDI id the lock covers: a snapshot gives the VDI's name a new id and moves
    /// the lock to it, and a gateway that learns the new id from the lock writes there.
    #[serde(default)]
    pub vdi: VdiId,
    /// Which run of the owner's process holds it (random per start): a node that
    /// restarted is not the holder that may have died mid-write, so it cannot renew
    /// the old lease and gets a new generation once it ends.
    #[serde(default)]
    pub incarnation: u64,
    /// The VDI's home zone as of this grant or renewal: the gateway writes only once
    /// its record of the VDI shows it (placement depends on it).
    #[serde(default)]
    pub home_zone: Option<String>,
    /// The lease length the holder asked for (0 in locks granted before it was
    /// recorded). Renewals through the leader are never longer, and a new leader
    /// keeps every lock alive this long (see [`MetaState::new_term`]).
    #[serde(default)]
    pub lease_ms: u64,
}

/// Everything the metadata holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    /// The cluster map; its epoch grows by one at every node add, remove or state change.
    pub map: ClusterMap,
    /// Every epoch change, oldest first, back to the last epoch at which every
    /// node was up and clean ([`Command::TrimHistory`]). Shared between states
    /// (an `Arc`): the state machine copies its state at every applied batch of
    /// entries that readers still hold, and this list only changes at an epoch.
    pub epoch_history: Arc<Vec<EpochRecord>>,
    /// What the last changes trimmed from the history were, oldest first, without
    /// their maps (at most [`MAX_TRIMMED_NOTES`]): `drove cluster status` tells the
    /// story of a failure after the cluster is clean again.
    #[serde(default)]
    pub trimmed_notes: Arc<Vec<EpochNote>>,
    /// The VDI table, by name. Shared between states as the history is: a command
    /// that changes no VDI (a lock, a node verdict) copies none.
    pub vdis: Arc<BTreeMap<String, VdiInfo>>,
    /// The id the next VDI gets; ids are never reused.
    pub next_vdi_id: u32,
    /// The id the next joining node gets (the bootstrap node is 1).
    pub next_node_id: u64,
    /// Cluster-wide settings.
    pub settings: Settings,
    /// Write locks, by VDI id.
    pub locks: BTreeMap<VdiId, VdiLock>,
    /// The newest Raft term whose leader's first command has been applied: at that
    /// command every lock was extended (see [`MetaState::new_term`]).
    #[serde(default)]
    pub lease_term: u64,
    /// The last lock generation handed out for each VDI (kept after release).
    pub lock_generations: BTreeMap<VdiId, u64>,
    /// Per VDI, the newest lock generation whose writes are known identical on every
    /// replica: released cleanly after a flush, or repaired by the next holder after
    /// a crash. A holder of generation G whose predecessors are not all settled
    /// (settled < G - 1) must make the replicas identical before serving the VDI.
    #[serde(default)]
    pub settled: BTreeMap<VdiId, u64>,
    /// Nodes removed from the cluster: their ids never come back (a removed node
    /// that restarts must not rejoin with its stale data; it learns it was removed
    /// and stops).
    #[serde(default)]
    pub removed: std::collections::BTreeSet<NodeId>,
    /// Nodes marked down that must stay down until this time (ms since the Unix
    /// epoch; see [`Settings::hold_down_ms`]).
    #[serde(default)]
    pub held_down: BTreeMap<NodeId, u64>,
    /// Locks an operator broke (`drove vdi lock break`), by VDI id: their holder may
    /// not take the lock again while its old lease would have run.
    #[serde(default)]
    pub broken: BTreeMap<VdiId, BrokenLock>,
    /// Admin API tokens by name (`drove token create`): role and secret hash.
    #[serde(default)]
    pub tokens: BTreeMap<String, ApiToken>,
}

/// A write lock an operator broke: the holder it was taken from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokenLock {
    /// The node that held it.
    pub owner: NodeId,
    /// The run of that node's process that held it.
    pub incarnation: u64,
    /// When its lease would have ended (ms since the Unix epoch, holder's clock).
    pub until_ms: u64,
}

impl Default for MetaState {
    fn default() -> Self {
        MetaState {
            map: ClusterMap::default(),
            epoch_history: Arc::default(),
            trimmed_notes: Arc::default(),
            vdis: Arc::default(),
            next_vdi_id: 1,
            next_node_id: 2,
            settings: Settings::default(),
            locks: BTreeMap::new(),
            lease_term: 0,
            lock_generations: BTreeMap::new(),
            settled: BTreeMap::new(),
            removed: std::collections::BTreeSet::new(),
            held_down: BTreeMap::new(),
            broken: BTreeMap::new(),
            tokens: BTreeMap::new(),
        }
    }
}

/// A change to the metadata, proposed through Raft.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Several commands in one log entry (the leader's group commit), applied in
    /// order, each on its own (one refused leaves the others be); replies
    /// [`Reply::Batch`]. Made only by the leader's batcher: refused from the network,
    /// inside another batch and beyond `MAX_BATCH` (256) commands.
    Batch(Vec<crate::types::Request>),
    /// Hand out a fresh node id; replies [`Reply::NodeId`].
    AllocateNodeId,
    /// Add a node or update its addresses, zone, weight or state. The epoch grows only
    /// when the node is new or its zone, state or weight changed.
    UpsertNode(NodeInfo),
    /// Mark a node up or down; the epoch grows if the state changed.
    SetNodeState {
        /// The node.
        id: NodeId,
        /// Its new state.
        state: NodeState,
        /// Who decided and why, kept in the epoch history.
        #[serde(default)]
        reason: String,
        /// Keep it down for this long (ms) from the entry's time: a gateway marks a
        /// silent node down with the cluster's hold-down.
        #[serde(default)]
        hold_ms: u64,
    },
    /// Forget a node: it leaves the cluster map (one epoch). Only a node that takes
    /// no data (weight 0: drained by `node leave`) or is down; its locks stay, and
    /// count as a dead gateway's.
    RemoveNode {
        /// The node.
        id: NodeId,
    },
    /// The failure detector's verdict on a node, as [`Command::SetNodeState`], but
    /// judged by the leader of Raft term `term` from the heartbeats it received, and
    /// refused when committed in another term: a leader cut off from the majority
    /// judges the others silent, and its write, retried and forwarded once the cut
    /// heals, must not mark down nodes the new leader hears from.
    JudgeNodeState {
        /// The node.
        id: NodeId,
        /// Its new state.
        state: NodeState,
        /// The term of the leadership the verdict was judged in.
        term: u64,
    },
    /// The failure detector's verdicts on several nodes at once, judged as
    /// [`Command::JudgeNodeState`] is (and refused the same way when committed in
    /// another term), making **one** epoch: a datacenter lost makes one epoch, not
    /// one per node (each epoch makes every node work out its recovery again and
    /// list every other node's objects). Refused whole when it names a node twice,
    /// a node not in the cluster, or more than [`MAX_VERDICTS`].
    JudgeNodes {
        /// Each node and its new state.
        verdicts: Vec<(NodeId, NodeState)>,
        /// The term of the leadership the verdicts were judged in.
        term: u64,
    },
    /// Create a VDI; replies [`Reply::Vdi`].
    CreateVdi {
        /// Name, checked with [`drove_types::validate_name`].
        name: String,
        /// Size in bytes: a multiple of 512, at most 1 PiB.
        size: u64,
        /// Copies of each object; `None` takes the cluster default.
        copies: Option<u8>,
        /// Write fan-out mode.
        mode: ReplicationMode,
        /// Object size in bytes: a power of two from 4 KiB to 1 GiB.
        object_size: u32,
        /// Creation time, seconds since the Unix epoch (decided by the proposer).
        now: u64,
        /// The home zone (a zone of a node in the map); `None`: the zone of the first
        /// node to take the write lock.
        #[serde(default)]
        home_zone: Option<String>,
        /// Copies in the home zone, 1..=copies; `None`: min(2, copies).
        #[serde(default)]
        home_copies: Option<u8>,
        /// When writes are acknowledged (entries from before policies read as sync).
        #[serde(default)]
        policy: WritePolicy,
        /// Zone-sync lag bound in milliseconds; `None`: the default.
        #[serde(default)]
        max_lag_ms: Option<u32>,
        /// Zone-sync lag bound in bytes; `None`: the default.
        #[serde(default)]
        max_lag_bytes: Option<u64>,
    },
    /// Delete a VDI by name. Refused while a writer's lease runs, unless `force`.
    DeleteVdi {
        /// Name.
        name: String,
        /// Delete even while a gateway holds the VDI's lock (its writes then fail).
        #[serde(default)]
        force: bool,
    },
    /// Grow a VDI; replies [`Reply::Vdi`] with the new record. Shrinking is refused.
    ResizeVdi {
        /// Name.
        name: String,
        /// New size in bytes.
        size: u64,
    },
    /// Change the copies of VDIs created without an explicit number.
    SetDefaultCopies(u8),
    /// Change the failure-detection timeout, the recovery rate limit and/or the
    /// hold-down of silent nodes.
    SetHealthSettings {
        /// New [`Settings::down_after_ms`] (at least 500).
        down_after_ms: Option<u64>,
        /// New [`Settings::recovery_mib_s`].
        recovery_mib_s: Option<u32>,
        /// New [`Settings::hold_down_ms`] (at most one day).
        #[serde(default)]
        hold_down_ms: Option<u64>,
    },
    /// Set how many replicas must have a VDI's writes while some are down; `None`
    /// restores the default (`copies - 1`, at least 1). Replies [`Reply::Vdi`].
    SetMinCopies {
        /// VDI name.
        name: String,
        /// 1..=copies, or `None`.
        min_copies: Option<u8>,
    },
    /// Change a VDI's write policy and/or its zone-sync lag bounds (what is given;
    /// at least one). Refused for a snapshot (read-only). Replies [`Reply::Vdi`].
    SetVdiPolicy {
        /// VDI name.
        name: String,
        /// New write policy.
        #[serde(default)]
        policy: Option<WritePolicy>,
        /// New lag bound in milliseconds (see [`drove_types::validate_max_lag`]).
        #[serde(default)]
        max_lag_ms: Option<u32>,
        /// New lag bound in bytes.
        #[serde(default)]
        max_lag_bytes: Option<u64>,
        /// Back to the default time bound (refused together with `max_lag_ms`).
        #[serde(default)]
        reset_max_lag_ms: bool,
        /// Back to the default byte bound (refused together with `max_lag_bytes`).
        #[serde(default)]
        reset_max_lag_bytes: bool,
    },
    /// Take or renew a VDI's write lock for `node`; replies [`Reply::Lock`]. Refused
    /// with `Locked` while another node's lease runs.
    AcquireLock {
        /// VDI name.
        vdi: String,
        /// The gateway asking.
        node: NodeId,
        /// The proposer's clock, milliseconds since the Unix epoch.
        now_ms: u64,
        /// Lease length in milliseconds.
        lease_ms: u64,
        /// The asking process's run (see [`VdiLock::incarnation`]).
        #[serde(default)]
        incarnation: u64,
    },
    /// Renewals the leader confirmed without a log entry of their own (see
    /// the lease module), recorded in the lock table: each lock still held by the
    /// same run at the same generation lasts until at least its `until_ms`. Made
    /// by the leader's batcher, ahead of the commands it proposes beside them.
    ExtendLeases {
        /// The renewals, at most one per lock.
        leases: Vec<lease::LeaseExtension>,
    },
    /// The holder of `vdi`'s lock at `generation` made every object's replicas
    /// identical: the writes of every earlier generation are settled.
    MarkSettled {
        /// The VDI id.
        vdi: VdiId,
        /// The holder.
        node: NodeId,
        /// The generation it holds.
        generation: u64,
    },
    /// Give a lock up (idempotent: a lock no longer held with that generation is left).
    ReleaseLock {
        /// VDI name.
        vdi: String,
        /// The holder.
        node: NodeId,
        /// The generation it holds.
        generation: u64,
    },
    /// Ask the holder of a VDI's lock to flush and hand it over to `to`.
    RequestHandover {
        /// VDI name.
        vdi: String,
        /// The node that will take the lock.
        to: NodeId,
    },
    /// Freeze VDI `name` as read-only snapshot `snap` (it keeps the VDI's id and
    /// objects) and give `name` a fresh id whose parent is the snapshot: O(1), no data
    /// moves. Refused while a node other than `by` holds a live lock on `name` (that
    /// gateway must take it, between two writes). The lock moves to the new id.
    /// Replies [`Reply::Vdi`] with `name`'s new record.
    SnapshotVdi {
        /// The VDI.
        name: String,
        /// Name of the snapshot.
        snap: String,
        /// The node proposing.
        by: NodeId,
        /// The proposer's clock, milliseconds since the Unix epoch (lease check).
        now_ms: u64,
    },
    /// Create VDI `name` as a copy-on-write clone of snapshot `snap`. Replies
    /// [`Reply::Vdi`].
    CloneVdi {
        /// The snapshot.
        snap: String,
        /// Name of the clone.
        name: String,
        /// Delete the clone when its last writer detaches.
        ephemeral: bool,
    },
    /// Create several clones of `snap` at once (one log entry: a provider starting
    /// many VMs from one image), all or none. Replies [`Reply::Done`].
    CloneMany {
        /// The snapshot.
        snap: String,
        /// Names of the clones, distinct.
        names: Vec<String>,
        /// Delete each clone when its last writer detaches.
        ephemeral: bool,
    },
    /// Throw away what VDI `name` wrote since snapshot `snap` (one of its ancestors):
    /// `name` gets a fresh id whose parent is `snap`, and its old objects are garbage.
    /// Refused while a live lock is held on `name`. Replies [`Reply::Vdi`].
    RollbackVdi {
        /// The VDI.
        name: String,
        /// The snapshot to go back to.
        snap: String,
        /// The proposer's clock, milliseconds since the Unix epoch.
        now_ms: u64,
    },
    /// `name` now holds every object it reads (its data was copied up from its
    /// parents): it stops reading from them. Replies [`Reply::Vdi`].
    Flattened {
        /// The VDI.
        name: String,
        /// Its id, so a VDI recreated under the same name is left alone.
        id: VdiId,
    },
    /// Delete ephemeral clone `name` if it still has id `id` and no clones of its
    /// own; a no-op otherwise.
    DeleteEphemeral {
        /// Name.
        name: String,
        /// The id the detaching gateway wrote.
        id: VdiId,
    },
    /// Make `zone` the home zone of VDI `name` after its home zone was lost (no node
    /// of it up): objects move there, and a node of `zone` may take the write lock of
    /// a zone-sync VDI again. Refused while the home zone has a node up (hand the VDI
    /// over instead). Replies [`Reply::Vdi`].
    PromoteVdi {
        /// VDI name.
        name: String,
        /// The new home zone.
        zone: String,
    },
    /// Grow a VDI by `by` bytes (`drove vdi resize NAME +SIZE`); replies
    /// [`Reply::Vdi`]. Not idempotent: a retry is applied once through its request id.
    GrowVdi {
        /// Name.
        name: String,
        /// Bytes to add.
        by: u64,
    },
    /// Give a VDI (or a snapshot) another name, also its NBD export name; replies
    /// [`Reply::Vdi`]. Refused while a writer's lease runs: the writer renews its
    /// lock by name. Ids, lineage and data do not change.
    RenameVdi {
        /// Current name.
        name: String,
        /// New name.
        to: String,
    },
    /// Take VDI `vdi`'s write lock from its holder (`drove vdi lock break`): the lock
    /// generation moves past the holder's, so replicas refuse its writes, and the
    /// lock is free for the next writer at once. The holder cannot renew or take it
    /// again until its old lease would have ended. Replies [`Reply::Lock`] with the
    /// lock taken, or [`Reply::Done`] when nobody held it.
    BreakLock {
        /// VDI name.
        vdi: String,
    },
    /// Set (true) or clear the maintenance flag [`Settings::noout`].
    SetNoout(bool),
    /// Change [`Settings::backfill_full_pct`] (1 to 100).
    SetBackfillFull(u8),
    /// Add an admin API token (`drove token create`): a new name, a role and the
    /// SHA-256 (lowercase hex) of a secret no other token has. At most
    /// [`tokens::MAX_TOKENS`].
    AddToken {
        /// Token name (1 to 64 of `[A-Za-z0-9._@-]`, as a client certificate's name).
        name: String,
        /// What it may do.
        role: Role,
        /// SHA-256 of the secret.
        sha256: String,
    },
    /// Remove an admin API token: it is refused from then on.
    RemoveToken {
        /// Token name.
        name: String,
    },
    /// Set which clients may attach a VDI over NBD on TCP, by certificate name
    /// (see [`VdiInfo::nbd_clients`]; empty: any). Replies [`Reply::Vdi`].
    SetVdiAccess {
        /// VDI name.
        name: String,
        /// The whole new list (checked by [`drove_types::validate_client_names`]).
        nbd_clients: Vec<String>,
    },
    /// Forget the epoch history before `keep_from`: the metadata leader saw every
    /// node of that epoch's map up and clean at it (each had made current every
    /// copy placed on it), so every acknowledged write of an earlier epoch is on
    /// every copy that map places, and recovery never needs an earlier map: it
    /// reasons as in a cluster born at `keep_from`. Without it the history, a
    /// whole map per epoch, only grew: every node copied it at each new epoch and
    /// recovery walked it per object. Refused unless `keep_from` is in the history
    /// and every node of its map was up; made by the leader only (refused from
    /// the network, like [`Command::Batch`]).
    TrimHistory {
        /// The oldest epoch kept.
        keep_from: Epoch,
    },
    /// Node `node` started again as run `incarnation`: the write locks an earlier
    /// run of it held end now. That run is dead (one process per data directory),
    /// and after a whole cluster lost power the new term extended every lease, so
    /// without this the next writer waited a whole lease for a holder that will
    /// never renew. The locks stay unsettled: the next holder repairs first.
    ForgetRun {
        /// The node that started.
        node: NodeId,
        /// Its new run.
        incarnation: u64,
    },
}

impl Command {
    /// The command's name (its variant), for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::Batch { .. } => "Batch",
            Command::AllocateNodeId => "AllocateNodeId",
            Command::UpsertNode { .. } => "UpsertNode",
            Command::SetNodeState { .. } => "SetNodeState",
            Command::RemoveNode { .. } => "RemoveNode",
            Command::JudgeNodeState { .. } => "JudgeNodeState",
            Command::JudgeNodes { .. } => "JudgeNodes",
            Command::CreateVdi { .. } => "CreateVdi",
            Command::DeleteVdi { .. } => "DeleteVdi",
            Command::ResizeVdi { .. } => "ResizeVdi",
            Command::SetDefaultCopies { .. } => "SetDefaultCopies",
            Command::SetHealthSettings { .. } => "SetHealthSettings",
            Command::SetMinCopies { .. } => "SetMinCopies",
            Command::SetVdiPolicy { .. } => "SetVdiPolicy",
            Command::AcquireLock { .. } => "AcquireLock",
            Command::MarkSettled { .. } => "MarkSettled",
            Command::ExtendLeases { .. } => "ExtendLeases",
            Command::ReleaseLock { .. } => "ReleaseLock",
            Command::RequestHandover { .. } => "RequestHandover",
            Command::SnapshotVdi { .. } => "SnapshotVdi",
            Command::CloneVdi { .. } => "CloneVdi",
            Command::CloneMany { .. } => "CloneMany",
            Command::RollbackVdi { .. } => "RollbackVdi",
            Command::Flattened { .. } => "Flattened",
            Command::DeleteEphemeral { .. } => "DeleteEphemeral",
            Command::PromoteVdi { .. } => "PromoteVdi",
            Command::GrowVdi { .. } => "GrowVdi",
            Command::RenameVdi { .. } => "RenameVdi",
            Command::BreakLock { .. } => "BreakLock",
            Command::SetNoout(_) => "SetNoout",
            Command::SetBackfillFull(_) => "SetBackfillFull",
            Command::AddToken { .. } => "AddToken",
            Command::RemoveToken { .. } => "RemoveToken",
            Command::SetVdiAccess { .. } => "SetVdiAccess",
            Command::TrimHistory { .. } => "TrimHistory",
            Command::ForgetRun { .. } => "ForgetRun",
        }
    }
}

/// What a successful command returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The command took effect (or was already in effect).
    Done,
    /// The node id handed out by [`Command::AllocateNodeId`].
    NodeId(NodeId),
    /// The VDI record after the command.
    Vdi(VdiInfo),
    // Variants are told apart by name in JSON: new ones may go anywhere.
    /// A snapshot was deleted while these VDIs read from it: its name is gone, its
    /// blocks are kept for them (see `state/delete.rs`).
    Kept(Vec<String>),
    /// The lock after the command.
    Lock(VdiLock),
    /// The outcome of each command of a [`Command::Batch`], in order.
    Batch(Vec<ApplyResult>),
}

/// The outcome of applying one command; an error leaves the state untouched.
pub type ApplyResult = Result<Reply, (ErrorKind, String)>;

pub(crate) fn invalid(msg: String) -> (ErrorKind, String) {
    (ErrorKind::Invalid, msg)
}

pub(crate) fn no_vdi(name: &str) -> (ErrorKind, String) {
    (
        ErrorKind::NotFound,
        format!("No VDI named '{name}'", name = drove_types::shown(name)),
    )
}

/// Check a VDI size against the sector size, the 1 PiB cap and the object count that
/// fits an object index (`u32`).
fn check_size(size: u64, object_size: u32) -> Result<(), (ErrorKind, String)> {
    if size == 0 || !size.is_multiple_of(SECTOR_SIZE) {
        return Err(invalid(format!(
            "Bad VDI size {size}: use a non-zero multiple of {SECTOR_SIZE} bytes"
        )));
    }
    if size > MAX_VDI_SIZE {
        return Err(invalid(format!(
            "VDI size {size} is larger than the 1P limit"
        )));
    }
    if size.div_ceil(u64::from(object_size)) > u64::from(u32::MAX) + 1 {
        return Err(invalid(format!(
            "VDI size {size} needs more than 2^32 objects of {object_size} bytes: use larger objects"
        )));
    }
    Ok(())
}

impl MetaState {
    /// Apply one command at time `now` (seconds since the Unix epoch, decided by the
    /// proposer and carried in the log so every node records the same value).
    /// Deterministic: the result depends only on the state, the command and `now`. On
    /// error the state is unchanged.
    pub fn apply(&mut self, cmd: &Command, now: u64) -> ApplyResult {
        match cmd {
            // Batches are taken apart by the state machine before they get here.
            Command::Batch(_) => Err(invalid("A batch of commands may not hold a batch".into())),
            Command::AllocateNodeId => {
                let id = NodeId(self.next_node_id);
                self.next_node_id += 1;
                Ok(Reply::NodeId(id))
            }
            Command::UpsertNode(node) => {
                check_node(node, self.next_node_id, &self.removed)?;
                self.upsert_node(node, now);
                Ok(Reply::Done)
            }
            Command::SetNodeState {
                id,
                state,
                reason,
                hold_ms,
            } => {
                if *hold_ms > MAX_HOLD_DOWN_MS || reason.len() > 1024 {
                    return Err(invalid(format!(
                        "Bad node verdict: hold {hold_ms} ms (at most {MAX_HOLD_DOWN_MS}), reason of {} bytes (at most 1024)",
                        reason.len()
                    )));
                }
                self.set_node_state(*id, *state, reason, now)?;
                if *state == NodeState::Down && *hold_ms > 0 {
                    self.held_down
                        .insert(*id, now.saturating_mul(1000).saturating_add(*hold_ms));
                }
                Ok(Reply::Done)
            }
            Command::JudgeNodeState { id, state, .. } => {
                self.set_node_state(*id, *state, "by the failure detector", now)?;
                Ok(Reply::Done)
            }
            Command::JudgeNodes { verdicts, .. } => self.judge_nodes(verdicts, now),
            Command::RemoveNode { id } => {
                let Some(node) = self.map.nodes.get(id) else {
                    return Err((ErrorKind::NotFound, format!("No node {id} in the cluster")));
                };
                if node.state == NodeState::Up && node.weight > 0 {
                    return Err((
                        ErrorKind::Invalid,
                        format!(
                            "Node {id} is up and holds data: `drove node leave {id}` drains \
                             it first, then removes it"
                        ),
                    ));
                }
                self.map.nodes.remove(id);
                self.removed.insert(*id);
                self.bump_epoch(now, format!("node {id} removed"));
                Ok(Reply::Done)
            }
            Command::CreateVdi {
                name,
                size,
                copies,
                mode,
                object_size,
                now: created,
                home_zone,
                home_copies,
                policy,
                max_lag_ms,
                max_lag_bytes,
            } => {
                let home = (home_zone.clone(), *home_copies);
                let lag = (*policy, *max_lag_ms, *max_lag_bytes);
                let shape = (*size, *object_size, *copies, *mode);
                self.create_vdi(name, shape, *created, home, lag)
            }
            Command::DeleteVdi { name, force } => self.delete_vdi(name, *force, now),
            Command::ResizeVdi { name, size } => {
                let Some(vdi) = Arc::make_mut(&mut self.vdis).get_mut(name) else {
                    return Err(no_vdi(name));
                };
                check_size(*size, vdi.object_size)?;
                if *size < vdi.size {
                    return Err(invalid(format!(
                        "VDI '{name}' is {} bytes: shrinking to {size} is not supported",
                        vdi.size,
                        name = drove_types::shown(name)
                    )));
                }
                vdi.size = *size;
                Ok(Reply::Vdi(vdi.clone()))
            }
            Command::SetDefaultCopies(copies) => {
                check_copies(*copies)?;
                self.settings.default_copies = *copies;
                Ok(Reply::Done)
            }
            Command::SetHealthSettings {
                down_after_ms,
                recovery_mib_s,
                hold_down_ms,
            } => {
                if let Some(h) = hold_down_ms {
                    if *h > MAX_HOLD_DOWN_MS {
                        return Err(invalid(format!(
                            "Bad hold-down {h} ms: at most {MAX_HOLD_DOWN_MS} ms (a day)"
                        )));
                    }
                }
                if let Some(ms) = down_after_ms {
                    if *ms < 500 {
                        return Err(invalid(format!(
                            "Bad down-after {ms} ms: use at least 500 ms"
                        )));
                    }
                    self.settings.down_after_ms = *ms;
                }
                if let Some(r) = recovery_mib_s {
                    self.settings.recovery_mib_s = *r;
                }
                if let Some(h) = hold_down_ms {
                    self.settings.hold_down_ms = *h;
                }
                Ok(Reply::Done)
            }
            Command::SetMinCopies { name, min_copies } => {
                let Some(vdi) = Arc::make_mut(&mut self.vdis).get_mut(name) else {
                    return Err(no_vdi(name));
                };
                if let Some(m) = min_copies {
                    if *m == 0 || *m > vdi.copies {
                        return Err(invalid(format!(
                            "Bad min-copies {m} for VDI '{name}': use 1 to {}",
                            vdi.copies,
                            name = drove_types::shown(name)
                        )));
                    }
                }
                vdi.min_copies = *min_copies;
                Ok(Reply::Vdi(vdi.clone()))
            }
            Command::SetVdiPolicy {
                name,
                policy,
                max_lag_ms,
                max_lag_bytes,
                reset_max_lag_ms,
                reset_max_lag_bytes,
            } => self.set_vdi_policy(
                name,
                *policy,
                (*max_lag_ms, *reset_max_lag_ms),
                (*max_lag_bytes, *reset_max_lag_bytes),
            ),
            Command::AcquireLock {
                vdi,
                node,
                now_ms,
                lease_ms,
                incarnation,
            } => {
                if *lease_ms == 0 || *lease_ms > MAX_LEASE_MS {
                    return Err(invalid(format!(
                        "Bad lease {lease_ms} ms: use 1 to {MAX_LEASE_MS} ms"
                    )));
                }
                if now_ms.abs_diff(now.saturating_mul(1000)) > MAX_CLOCK_SKEW_MS {
                    return Err(invalid(format!(
                        "Lock request stamped {now_ms} ms, {} ms away from the leader's clock: fix the clocks (NTP)",
                        now_ms.abs_diff(now.saturating_mul(1000))
                    )));
                }
                self.acquire_lock(vdi, *node, *incarnation, *now_ms, *lease_ms)
            }
            Command::ExtendLeases { leases } => self.extend_leases(leases, now),
            Command::MarkSettled {
                vdi,
                node,
                generation,
            } => {
                match self.locks.get(vdi) {
                    Some(l) if l.owner == *node && l.generation == *generation => {}
                    _ => {
                        return Err((
                            ErrorKind::Fenced,
                            format!(
                            "Node {node} does not hold lock generation {generation} of VDI {vdi}"
                        ),
                        ))
                    }
                }
                let s = self.settled.entry(*vdi).or_insert(0);
                *s = (*s).max(generation.saturating_sub(1));
                Ok(Reply::Done)
            }
            Command::ReleaseLock {
                vdi,
                node,
                generation,
            } => {
                let id = self.vdis.get(vdi).ok_or_else(|| no_vdi(vdi))?.id;
                if let Some(l) = self.locks.get(&id) {
                    if l.owner == *node && l.generation == *generation {
                        let to = l.handover_to;
                        self.locks.remove(&id);
                        // Handed to a node of another zone: the home follows it. The
                        // holder drained its lag and flushed before releasing.
                        if let Some(to) = to {
                            self.home_follows_handover(vdi, to, now);
                        }
                        // The holder flushed before releasing: its writes are settled,
                        // if every earlier generation's were.
                        let s = self.settled.entry(id).or_insert(0);
                        if s.saturating_add(1) >= *generation {
                            *s = (*s).max(*generation);
                        }
                    }
                }
                Ok(Reply::Done)
            }
            Command::RequestHandover { vdi, to } => {
                let id = self.vdis.get(vdi).ok_or_else(|| no_vdi(vdi))?.id;
                if !self.map.nodes.contains_key(to) {
                    return Err((ErrorKind::NotFound, format!("No node {to} in the cluster")));
                }
                match self.locks.get_mut(&id) {
                    Some(l) if l.owner != *to => {
                        l.handover_to = Some(*to);
                        Ok(Reply::Lock(l.clone()))
                    }
                    Some(l) => Ok(Reply::Lock(l.clone())),
                    None => {
                        // Nobody writes it (the last writer drained and released):
                        // to a node of another zone, the home moves now.
                        self.home_follows_handover(vdi, *to, now);
                        Ok(Reply::Done)
                    }
                }
            }
            Command::SnapshotVdi {
                name,
                snap,
                by,
                now_ms,
            } => self.snapshot_vdi(name, snap, *by, *now_ms, now),
            Command::CloneVdi {
                snap,
                name,
                ephemeral,
            } => self.clone_vdi(snap, name, *ephemeral, now),
            Command::CloneMany {
                snap,
                names,
                ephemeral,
            } => self.clone_many(snap, names, *ephemeral, now),
            Command::RollbackVdi { name, snap, now_ms } => self.rollback_vdi(name, snap, *now_ms),
            Command::Flattened { name, id } => self.flattened(name, *id),
            Command::DeleteEphemeral { name, id } => self.delete_ephemeral(name, *id),
            Command::PromoteVdi { name, zone } => self.promote_vdi(name, zone, now),
            Command::GrowVdi { name, by } => {
                let Some(vdi) = self.vdis.get(name) else {
                    return Err(no_vdi(name));
                };
                let Some(size) = vdi.size.checked_add(*by) else {
                    return Err(invalid(format!(
                        "VDI '{name}' is {} bytes: {by} more is too large",
                        vdi.size,
                        name = drove_types::shown(name)
                    )));
                };
                let name = name.clone();
                self.apply(&Command::ResizeVdi { name, size }, now)
            }
            Command::RenameVdi { name, to } => self.rename_vdi(name, to, now),
            Command::BreakLock { vdi } => self.break_lock(vdi),
            Command::SetNoout(on) => {
                self.settings.noout = *on;
                Ok(Reply::Done)
            }
            Command::SetBackfillFull(pct) => {
                if !(1..=100).contains(pct) {
                    return Err(invalid(format!(
                        "Bad backfill-full {pct} %: use 1 to 100 (percent of a disk in use)"
                    )));
                }
                self.settings.backfill_full_pct = *pct;
                Ok(Reply::Done)
            }
            Command::AddToken { name, role, sha256 } => {
                self.add_token(name, *role, sha256, now.saturating_mul(1000))
            }
            Command::RemoveToken { name } => self.remove_token(name),
            Command::SetVdiAccess { name, nbd_clients } => self.set_vdi_access(name, nbd_clients),
            Command::TrimHistory { keep_from } => self.trim_history(*keep_from),
            Command::ForgetRun { node, incarnation } => self.forget_run(*node, *incarnation),
        }
    }

    /// [`Command::TrimHistory`].
    fn trim_history(&mut self, keep_from: Epoch) -> ApplyResult {
        let Some(at) = self.epoch_history.iter().position(|r| r.epoch == keep_from) else {
            return Err(invalid(format!(
                "Epoch {keep_from} is not in the epoch history (epochs {} to {})",
                self.epoch_history.first().map_or(0, |r| r.epoch.0),
                self.map.epoch
            )));
        };
        let map = &self.epoch_history[at].map;
        if let Some(n) = map.nodes.values().find(|n| n.state != NodeState::Up) {
            return Err(invalid(format!(
                "Node {} was not up at epoch {keep_from}: the history before it is still needed",
                n.id
            )));
        }
        if at > 0 {
            let notes = Arc::make_mut(&mut self.trimmed_notes);
            notes.extend(self.epoch_history[..at].iter().map(EpochNote::from));
            let extra = notes.len().saturating_sub(MAX_TRIMMED_NOTES);
            notes.drain(..extra);
            Arc::make_mut(&mut self.epoch_history).drain(..at);
        }
        Ok(Reply::Done)
    }

    /// Every epoch change still known, oldest first: the notes of those trimmed
    /// from the history, then the history's.
    pub fn epoch_changes(&self) -> Vec<EpochNote> {
        self.trimmed_notes
            .iter()
            .cloned()
            .chain(self.epoch_history.iter().map(EpochNote::from))
            .collect()
    }

    /// `Locked` while a writer's lease on VDI `id` runs at `now` (seconds).
    pub(super) fn refuse_if_written(
        &self,
        name: &str,
        id: VdiId,
        now: u64,
    ) -> Result<(), (ErrorKind, String)> {
        match self.locks.get(&id) {
            Some(lock) if lock.expires_ms > now.saturating_mul(1000) => Err((
                ErrorKind::Locked,
                format!(
                    "VDI '{name}' is in use (written through node {}); detach it first",
                    lock.owner,
                    name = drove_types::shown(name)
                ),
            )),
            _ => Ok(()),
        }
    }

    fn rename_vdi(&mut self, name: &str, to: &str, now: u64) -> ApplyResult {
        validate_name(to).map_err(|e| invalid(e.message().to_string()))?;
        let Some(vdi) = self.vdis.get(name).filter(|_| !drove_types::is_kept(name)) else {
            return Err(no_vdi(name));
        };
        if name == to {
            return Ok(Reply::Vdi(vdi.clone()));
        }
        if self.vdis.contains_key(to) {
            return Err((
                ErrorKind::AlreadyExists,
                format!("VDI '{to}' already exists", to = drove_types::shown(to)),
            ));
        }
        self.refuse_if_written(name, vdi.id, now)?;
        let Some(mut vdi) = Arc::make_mut(&mut self.vdis).remove(name) else {
            return Err(no_vdi(name));
        };
        vdi.name = to.to_string();
        Arc::make_mut(&mut self.vdis).insert(to.to_string(), vdi.clone());
        Ok(Reply::Vdi(vdi))
    }

    fn acquire_lock(
        &mut self,
        vdi: &str,
        node: NodeId,
        incarnation: u64,
        now_ms: u64,
        lease_ms: u64,
    ) -> ApplyResult {
        let id = self.vdis.get(vdi).ok_or_else(|| no_vdi(vdi))?.id;
        let expires_ms = now_ms.saturating_add(lease_ms);
        self.refuse_broken_holder(vdi, id, node, incarnation, now_ms)?;
        if let Some(l) = self.locks.get_mut(&id) {
            if l.owner == node && l.incarnation == incarnation {
                if l.handover_to.is_some() {
                    return Err((
                        ErrorKind::Locked,
                        format!(
                            "VDI '{vdi}' is being handed over; node {node} may not renew",
                            vdi = drove_types::shown(vdi)
                        ),
                    ));
                }
                l.expires_ms = l.expires_ms.max(expires_ms);
                l.lease_ms = l.lease_ms.max(lease_ms);
                l.home_zone = self.vdis.get(vdi).and_then(|v| v.home_zone.clone());
                return Ok(Reply::Lock(l.clone()));
            }
            if l.expires_ms > now_ms {
                let hint = match l.handover_to {
                    _ if l.owner == node => {
                        "it was taken by an earlier run of this node; its lease must end first"
                            .to_string()
                    }
                    Some(to) if to == node => "a hand-over to this node is under way".to_string(),
                    _ => format!("ask for a hand-over: drove vdi handover {vdi} --to {node}"),
                };
                return Err((
                    ErrorKind::Locked,
                    format!(
                        "VDI '{vdi}' is being written through node {} (lease for {} ms more); {hint}",
                        l.owner,
                        l.expires_ms - now_ms,
                        vdi = drove_types::shown(vdi)
                    ),
                ));
            }
        }
        let zone = self.map.node(node).map(|n| n.zone.as_str());
        if let Some(why) = self.vdis.get(vdi).and_then(|v| self.needs_promote(v, zone)) {
            return Err((ErrorKind::Locked, why));
        }
        let generation = self.lock_generations.get(&id).copied().unwrap_or(0) + 1;
        self.lock_generations.insert(id, generation);
        self.broken.remove(&id);
        // The first writer's zone becomes the home of a VDI created without one. Only
        // at the first lock: before it nothing was written, so no object moves.
        if generation == 1 {
            let zone = self.map.node(node).map(|n| n.zone.clone());
            if let Some(v) = Arc::make_mut(&mut self.vdis).get_mut(vdi) {
                if v.home_zone.is_none() && !v.snapshot {
                    v.home_zone = zone;
                }
            }
        }
        let lock = VdiLock {
            owner: node,
            generation,
            expires_ms,
            handover_to: None,
            vdi: id,
            incarnation,
            home_zone: self.vdis.get(vdi).and_then(|v| v.home_zone.clone()),
            lease_ms,
        };
        self.locks.insert(id, lock.clone());
        Ok(Reply::Lock(lock))
    }

    fn upsert_node(&mut self, node: &NodeInfo, now: u64) {
        let id = node.id;
        let change = match self.map.nodes.get(&id) {
            None if node.witness => Some(format!("node {id} joined (zone {}, witness)", node.zone)),
            None => Some(format!(
                "node {id} joined (zone {}, weight {})",
                node.zone, node.weight
            )),
            Some(old) => {
                let mut parts = Vec::new();
                if old.zone != node.zone {
                    parts.push(format!("zone {} -> {}", old.zone, node.zone));
                }
                if old.witness != node.witness {
                    parts.push(format!("witness {} -> {}", old.witness, node.witness));
                }
                if old.weight != node.weight {
                    parts.push(format!("weight {} -> {}", old.weight, node.weight));
                }
                if old.state != node.state {
                    parts.push(format!("{:?} -> {:?}", old.state, node.state));
                }
                (!parts.is_empty()).then(|| format!("node {id} {}", parts.join(", ")))
            }
        };
        // Address-only updates (a restarted node on new ports) change no placement, so
        // they are stored without a new epoch.
        self.map.nodes.insert(id, node.clone());
        if let Some(change) = change {
            self.bump_epoch(now, change);
        }
    }

    fn create_vdi(
        &mut self,
        name: &str,
        (size, object_size, copies, mode): (u64, u32, Option<u8>, ReplicationMode),
        created: u64,
        (home_zone, home_copies): (Option<String>, Option<u8>),
        (policy, max_lag_ms, max_lag_bytes): (WritePolicy, Option<u32>, Option<u64>),
    ) -> ApplyResult {
        validate_name(name).map_err(|e| invalid(e.message().to_string()))?;
        validate_max_lag(max_lag_ms, max_lag_bytes)
            .map_err(|e| invalid(e.message().to_string()))?;
        if self.vdis.contains_key(name) {
            return Err((
                ErrorKind::AlreadyExists,
                format!(
                    "VDI '{name}' already exists",
                    name = drove_types::shown(name)
                ),
            ));
        }
        if !object_size.is_power_of_two()
            || u64::from(object_size) < BLOCK_SIZE
            || object_size > MAX_OBJECT_SIZE
        {
            return Err(invalid(format!(
                "Bad object size {object_size}: use a power of two from 4K to 1G"
            )));
        }
        check_size(size, object_size)?;
        let copies = copies.unwrap_or(self.settings.default_copies);
        check_copies(copies)?;
        // A witness holds no copy: it does not count.
        let up = self.map.up_nodes().filter(|n| !n.witness).count();
        if usize::from(copies) > up {
            return Err(invalid(format!(
                "copies={copies} needs at least {copies} nodes, the cluster has {up}{}",
                if self.map.nodes.values().any(|n| n.witness) {
                    " (witnesses hold no data)"
                } else {
                    ""
                }
            )));
        }
        if let Some(zone) = &home_zone {
            if !self
                .map
                .nodes
                .values()
                .any(|n| &n.zone == zone && !n.witness)
            {
                let mut zones: Vec<&str> = self
                    .map
                    .nodes
                    .values()
                    .filter(|n| !n.witness)
                    .map(|n| n.zone.as_str())
                    .collect();
                zones.sort_unstable();
                zones.dedup();
                let only_witness = self.map.nodes.values().any(|n| &n.zone == zone);
                return Err(invalid(if only_witness {
                    format!(
                        "Zone '{zone}' holds only a witness, which stores no data; the zones \
                         of data nodes are: {}",
                        zones.join(", ")
                    )
                } else {
                    format!(
                        "No node is in zone '{zone}'; the zones are: {}",
                        zones.join(", ")
                    )
                }));
            }
        }
        if let Some(h) = home_copies {
            if h == 0 || h > copies {
                return Err(invalid(format!(
                    "Bad home copies {h}: use 1 to copies ({copies})"
                )));
            }
        }
        let id = self.next_vdi_id;
        let Some(next) = id.checked_add(1) else {
            return Err((ErrorKind::NoSpace, "No VDI ids left".to_string()));
        };
        let info = VdiInfo {
            mode,
            created,
            home_zone,
            home_copies,
            policy,
            max_lag_ms,
            max_lag_bytes,
            ..VdiInfo::new(VdiId(id), name, size, object_size, copies)
        };
        self.next_vdi_id = next;
        Arc::make_mut(&mut self.vdis).insert(name.to_string(), info.clone());
        Ok(Reply::Vdi(info))
    }

    fn set_node_state(
        &mut self,
        id: NodeId,
        state: NodeState,
        reason: &str,
        now: u64,
    ) -> Result<(), (ErrorKind, String)> {
        let Some(node) = self.map.nodes.get_mut(&id) else {
            return Err((ErrorKind::NotFound, format!("No node {id} in the cluster")));
        };
        if node.state != state {
            let mut change = format!("node {id} {:?} -> {:?}", node.state, state);
            if !reason.is_empty() {
                change.push_str(&format!(" ({reason})"));
            }
            node.state = state;
            self.bump_epoch(now, change);
        }
        if state == NodeState::Up {
            self.held_down.remove(&id);
        }
        Ok(())
    }

    /// Apply the failure detector's verdicts on several nodes in one epoch (none
    /// when no state changes); nothing when one of them is refused.
    fn judge_nodes(&mut self, verdicts: &[(NodeId, NodeState)], now: u64) -> ApplyResult {
        if verdicts.is_empty() || verdicts.len() > MAX_VERDICTS {
            return Err(invalid(format!(
                "A batch of node verdicts holds {} verdicts: give 1 to {MAX_VERDICTS}",
                verdicts.len()
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (id, _) in verdicts {
            if !seen.insert(*id) {
                return Err(invalid(format!("Node {id} is judged twice in one batch")));
            }
            if !self.map.nodes.contains_key(id) {
                return Err((ErrorKind::NotFound, format!("No node {id} in the cluster")));
            }
        }
        let mut changed = Vec::new();
        for &(id, state) in verdicts {
            let Some(node) = self.map.nodes.get_mut(&id) else {
                continue;
            };
            if node.state != state {
                changed.push(format!("node {id} {:?} -> {:?}", node.state, state));
                node.state = state;
            }
            if state == NodeState::Up {
                self.held_down.remove(&id);
            }
        }
        if !changed.is_empty() {
            let n = changed.len();
            let mut change: String = changed
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            if n > 8 {
                change.push_str(&format!(" and {} more", n - 8));
            }
            change.push_str(" (by the failure detector)");
            self.bump_epoch(now, change);
        }
        Ok(Reply::Done)
    }

    fn bump_epoch(&mut self, now: u64, change: String) {
        self.map.epoch = Epoch(self.map.epoch.0 + 1);
        Arc::make_mut(&mut self.epoch_history).push(EpochRecord {
            epoch: self.map.epoch,
            at_unix: now,
            change,
            map: self.map.clone(),
        });
    }
}

/// A node record must name an allocated id, a valid zone, a sane weight and
/// addresses of the form host:port.
fn check_node(
    node: &NodeInfo,
    next_node_id: u64,
    removed: &std::collections::BTreeSet<NodeId>,
) -> Result<(), (ErrorKind, String)> {
    let id = node.id;
    if id.0 == 0 || id.0 >= next_node_id {
        return Err(invalid(format!("Node id {id} was never handed out")));
    }
    if removed.contains(&id) {
        return Err((
            ErrorKind::Gone,
            format!(
                "Node {id} was removed from the cluster; to bring this host back, empty its \
                 data directory and join it as a new node"
            ),
        ));
    }
    if validate_name(&node.zone).is_err() {
        return Err(invalid(format!(
            "Bad zone name '{}'",
            drove_types::shown(&node.zone)
        )));
    }
    if node.weight > MAX_WEIGHT {
        return Err(invalid(format!(
            "Bad weight {}: at most {MAX_WEIGHT}",
            node.weight
        )));
    }
    if node.witness && node.weight != 0 {
        return Err(invalid(format!(
            "Node {id} is a witness with weight {}: a witness holds no data (weight 0)",
            node.weight
        )));
    }
    if node.witness && !(node.nbd_addr.is_empty() && node.nbd_socket.is_empty()) {
        return Err(invalid(format!(
            "Node {id} is a witness with an NBD address: a witness serves no NBD"
        )));
    }
    let nbd = (!node.witness).then_some(("NBD", &node.nbd_addr));
    for (what, addr) in [("admin", &node.admin_addr), ("peer", &node.peer_addr)]
        .into_iter()
        .chain(nbd)
    {
        if addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(format!("Bad {what} address '{addr}' of node {id}")));
        }
    }
    if node.nbd_socket.len() > 4096 {
        return Err(invalid(format!("NBD socket path of node {id} is too long")));
    }
    Ok(())
}

fn check_copies(copies: u8) -> Result<(), (ErrorKind, String)> {
    if copies == 0 || copies > MAX_COPIES {
        return Err(invalid(format!(
            "Bad copies {copies}: use 1 to {MAX_COPIES}"
        )));
    }
    Ok(())
}

mod delete;
mod home;
pub(crate) mod lease;
mod lineage;
mod lock_break;
mod policy;
pub mod tokens;

pub use tokens::{ApiToken, Role};

#[cfg(test)]
mod tests;

#[cfg(test)]
#[path = "state/lock_tests.rs"]
pub(crate) mod lock_tests;

#[cfg(test)]
#[path = "state/lineage_tests.rs"]
mod lineage_tests;

#[cfg(test)]
#[path = "state/policy_tests.rs"]
mod policy_tests;

#[cfg(test)]
#[path = "state/home_tests.rs"]
mod home_tests;

#[cfg(test)]
#[path = "state/lease_tests.rs"]
mod lease_tests;

#[cfg(test)]
#[path = "state/token_tests.rs"]
mod token_tests;

#[cfg(test)]
#[path = "state/command_tests.rs"]
mod command_tests;
