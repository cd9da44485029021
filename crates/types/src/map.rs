//! The cluster map: every node with its zone, weight, addresses and state, versioned
//! by an epoch. Placement is a pure function of this map.
use crate::{Epoch, NodeId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Whether a node takes part in placement. In JSON `up` or `down`; the capitalized
/// names older versions wrote (metadata on disk, Raft log) are still read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Serving; holds replicas.
    #[serde(alias = "Up")]
    Up,
    /// Marked down by the membership logic.
    #[serde(alias = "Down")]
    Down,
}

/// One node as the cluster knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node's id (also its Raft id).
    pub id: NodeId,
    /// Failure domain: rack or datacenter.
    pub zone: String,
    /// Relative capacity; equal weights hold equal shares.
    pub weight: u32,
    /// `host:port` of the admin HTTP API (also carries Raft RPCs).
    pub admin_addr: String,
    /// `host:port` of the peer data transport.
    pub peer_addr: String,
    /// `host:port` of the NBD TCP listener.
    pub nbd_addr: String,
    /// Path of the NBD unix socket on the node's host.
    pub nbd_socket: String,
    /// Up or down.
    pub state: NodeState,
    /// A witness (`drove node run --witness`): a metadata voter only, usually in a
    /// zone of its own (a third site), that stores no objects (weight 0, never placed
    /// on) and serves no NBD (no NBD address or socket). The voter placement prefers
    /// it as its zone's voter. Absent in JSON when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub witness: bool,
    /// The newest cluster feature level the node's build knows
    /// ([`crate::FEATURE_LEVEL`]); 0 (absent in JSON) from a build older than
    /// feature levels, which knows level 1 ([`NodeInfo::feature_level`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub features: u32,
    /// The node's build version (`drove --version`); empty (absent in JSON) from a
    /// build older than feature levels.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl NodeInfo {
    /// Node `id` in `zone`: up, weight 1, no addresses, of this build's feature level
    /// and version. Tests and simulations set
    /// the fields they need on top (`NodeInfo { weight: 100, ..NodeInfo::new(..) }`).
    pub fn new(id: NodeId, zone: impl Into<String>) -> NodeInfo {
        NodeInfo {
            id,
            zone: zone.into(),
            weight: 1,
            admin_addr: String::new(),
            peer_addr: String::new(),
            nbd_addr: String::new(),
            nbd_socket: String::new(),
            state: NodeState::Up,
            witness: false,
            features: crate::FEATURE_LEVEL,
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// The newest cluster feature level the node's build knows (level 1 for a build
    /// older than levels).
    pub fn feature_level(&self) -> u32 {
        self.features.max(crate::BASE_FEATURE_LEVEL)
    }

    /// Whether the node may hold a metadata vote: up, and a data node that is not
    /// draining (weight above zero) or a witness.
    pub fn may_vote(&self) -> bool {
        self.state == NodeState::Up && (self.weight > 0 || self.witness)
    }
}

/// All nodes, keyed by id, at one epoch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Version of this map.
    pub epoch: Epoch,
    /// Every node ever joined and not removed.
    pub nodes: BTreeMap<NodeId, NodeInfo>,
}

impl ClusterMap {
    /// The nodes that take part in placement, in id order.
    pub fn up_nodes(&self) -> impl Iterator<Item = &NodeInfo> {
        self.nodes.values().filter(|n| n.state == NodeState::Up)
    }

    /// One node by id.
    pub fn node(&self, id: NodeId) -> Option<&NodeInfo> {
        self.nodes.get(&id)
    }

    /// Whether node `id` is a witness.
    pub fn is_witness(&self, id: NodeId) -> bool {
        self.node(id).is_some_and(|n| n.witness)
    }

    /// The number of distinct zones among up nodes.
    pub fn zone_count(&self) -> usize {
        let mut zones: Vec<&str> = self.up_nodes().map(|n| n.zone.as_str()).collect();
        zones.sort_unstable();
        zones.dedup();
        zones.len()
    }
}
