//! DIR/cluster.json, written by `drove up` for a local cluster: how `drove down`,
//! the benchmarks and scripts find every node it started.
use serde::{Deserialize, Serialize};

/// One node of a local cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    /// Node id.
    pub id: u64,
    /// Zone name.
    pub zone: String,
    /// Admin (HTTP) address.
    pub admin: String,
    /// Peer (node-to-node) address.
    pub peer: String,
    /// NBD over TCP, `nbd://host:port`.
    pub nbd_tcp: String,
    /// NBD unix socket path.
    pub nbd_unix: String,
    /// Data directory.
    pub data: String,
    /// Process id.
    pub pid: u32,
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFile {
    /// Nodes in start order.
    pub nodes: Vec<NodeEntry>,
}
