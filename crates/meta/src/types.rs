//! The Raft type configuration of the metadata: what a log entry carries ([`Request`])
//! and what applying it returns ([`ApplyResult`]). Raft node ids are plain `u64`
//! (openraft needs `Default`, which [`drove_types::NodeId`] does not have); they are
//! converted at the crate boundary.
use crate::state::{ApplyResult, Command};
use openraft::BasicNode;
use serde::{Deserialize, Serialize};

/// Identifies one logical write across retries, so a write retried after an
/// ambiguous failure (leader lost mid-commit, forwarded reply lost) is applied once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestId {
    /// Random per process: distinguishes proposers.
    pub client: u64,
    /// Grows by one per [`crate::Meta::execute`] call.
    pub seq: u64,
}

/// The payload of a normal Raft log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Deduplication key.
    pub id: RequestId,
    /// Proposal time, seconds since the Unix epoch; stamped once so every replica
    /// records the same value.
    pub now: u64,
    /// The change.
    pub cmd: Command,
}

openraft::declare_raft_types!(
    /// Raft types of the drove metadata.
    pub TypeConfig:
        D = Request,
        R = ApplyResult,
        NodeId = u64,
        Node = BasicNode,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = crate::runtime::DroveRuntime,
);

/// The Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;
/// A Raft log entry.
pub type Entry = openraft::Entry<TypeConfig>;
/// A log id.
pub type LogId = openraft::LogId<u64>;
/// Storage errors as openraft wants them.
pub type StorageError = openraft::StorageError<u64>;
/// Membership as stored with its log id.
pub type StoredMembership = openraft::StoredMembership<u64, BasicNode>;
/// Snapshot metadata.
pub type SnapshotMeta = openraft::SnapshotMeta<u64, BasicNode>;
