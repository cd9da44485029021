//! The changes to the metadata, as proposed through Raft ([`Command`]), and what
//! applying one returns ([`Reply`]). `Command` is the Raft log's on-disk format: every
//! entry holds one as serde JSON, and a node reads back entries written by older
//! builds, so a variant's name and its fields' names are a format (fields added later
//! carry `#[serde(default)]`). `command_tests.rs` holds the bytes each variant
//! serializes to. What each command does is in the handler of its area
//! (`membership.rs`, `vdis.rs`, `locks.rs`, `settings.rs`, ...), reached through
//! [`super::MetaState::apply`].
use super::lease::LeaseExtension;
use super::{Role, VdiLock};
use drove_types::{
    Epoch, ErrorKind, NodeId, NodeInfo, NodeState, Qos, ReplicationMode, VdiId, VdiInfo,
    WritePolicy,
};
use serde::{Deserialize, Serialize};

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
        /// A gateway's verdict: who judged and on which map. From feature level 3
        /// the verdict is refused when its judge is down now or was marked down
        /// at an epoch after that map (or the map is older than the epoch history):
        /// a gateway cut off with its zone judges the nodes across the cut silent,
        /// and its verdict, committed once the cut heals, must not mark down
        /// nodes that took other gateways' writes meanwhile (`drove sim faults
        /// --meta raft --seed 105 --time 20s` with the gateway fan-out: two home
        /// copies of a zone-sync VDI marked down 3 s late, a write lost). From
        /// level 4, a verdict on a node of another zone is refused too when another
        /// node of the judge's zone was marked down since that map (seed 4181).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        judged: Option<Judged>,
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
    /// a node not in the cluster, or more than [`super::MAX_VERDICTS`].
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
        /// I/O limits, over the cluster's default ([`super::Settings::default_qos`]):
        /// a change of it ([`Qos::merged`]).
        #[serde(default, skip_serializing_if = "Qos::is_empty_change")]
        qos: Qos,
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
        /// New [`super::Settings::down_after_ms`] (at least 500).
        down_after_ms: Option<u64>,
        /// New [`super::Settings::recovery_mib_s`].
        recovery_mib_s: Option<u32>,
        /// New [`super::Settings::hold_down_ms`] (at most one day).
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
        leases: Vec<LeaseExtension>,
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
    /// Set (true) or clear the maintenance flag [`super::Settings::noout`].
    SetNoout(bool),
    /// Change [`super::Settings::backfill_full_pct`] (1 to 100).
    SetBackfillFull(u8),
    /// Add an admin API token (`drove token create`): a new name, a role and the
    /// SHA-256 (lowercase hex) of a secret no other token has. At most
    /// [`super::tokens::MAX_TOKENS`].
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
    /// Change a VDI's I/O limits ([`VdiInfo::qos`]): `qos` is a change, applied
    /// with [`Qos::merged`] (a limit of 0 lifts it). A snapshot's limits are its
    /// clones' start, so it may be changed too. Replies [`Reply::Vdi`].
    SetVdiQos {
        /// VDI name.
        name: String,
        /// The change.
        qos: Qos,
    },
    /// Change the I/O limits new VDIs get when they do not set their own
    /// ([`super::Settings::default_qos`]), as [`Command::SetVdiQos`] changes a VDI's.
    SetDefaultQos(Qos),
    /// Raise the cluster's feature level to `level` (`drove cluster upgrade
    /// finish`): refused unless every node in the map knows it (an older build could
    /// not read the commands the level allows) and it is higher than today's.
    FinishUpgrade {
        /// The new level.
        level: u32,
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
            Command::SetVdiQos { .. } => "SetVdiQos",
            Command::SetDefaultQos(_) => "SetDefaultQos",
            Command::TrimHistory { .. } => "TrimHistory",
            Command::ForgetRun { .. } => "ForgetRun",
            Command::FinishUpgrade { .. } => "FinishUpgrade",
        }
    }

    /// The cluster feature level the command needs (`drove_types::FEATURE_LEVEL`):
    /// a node of an older build could not read it, or would drop part of it.
    pub fn feature_level(&self) -> u32 {
        match self {
            Command::Batch(reqs) => reqs
                .iter()
                .map(|r| r.cmd.feature_level())
                .max()
                .unwrap_or(drove_types::BASE_FEATURE_LEVEL),
            Command::SetVdiQos { .. } | Command::SetDefaultQos(_) => 2,
            Command::CreateVdi { qos, .. } if !qos.is_empty_change() => 2,
            Command::FinishUpgrade { level } => *level,
            _ => drove_types::BASE_FEATURE_LEVEL,
        }
    }
}

/// Who judged a node's state and on which map ([`Command::SetNodeState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Judged {
    /// The node whose gateway judged.
    pub by: NodeId,
    /// The epoch of the map it judged on.
    pub seen: Epoch,
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
