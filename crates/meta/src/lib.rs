//! drove's cluster metadata: the cluster map with its epoch history, the VDI table and
//! the settings, kept as a replicated state machine on `openraft` and persisted in a
//! local redb file. Raft RPCs and internal calls between nodes go through one seam,
//! [`MetaNet`] (HTTPS on each node's peer port in production, [`Meta::router`]; the
//! simulated network in the simulator), and are answered by one dispatcher,
//! [`Meta::serve`]. Only metadata goes through Raft, never data: the data
//! path reads the map and VDI records from [`Meta::state`] / [`Meta::watch`] and asks
//! the metadata nothing per I/O.
//!
//! ```text
//!  CLI / daemon ──execute(Command)──► Meta ──(leader? local : POST /meta/write)──► Raft leader
//!                                      │                                            │ replicate
//!   gateways ◄──watch(Arc<MetaState>)──┘◄── StateMachine::apply ◄── committed log ◄─┘
//! ```
#![deny(missing_docs)]

mod api;
mod batch;
mod client_req;
mod db;
mod dedup;
mod forward;
mod health;
mod http;
mod http_net;
mod lease;
mod log_store;
mod mem_disk;
mod membership;
mod meta;
mod net;
mod network;
mod raft_checks;
mod read;
mod remote;
mod runtime;
mod serve;
mod startup;
mod state;
mod state_machine;
#[cfg(test)]
mod store_tests;
mod types;
mod vote_keeper;
mod voters;
mod write;

pub use api::{MetaApi, MetaFuture};
pub use client_req::{in_client_request, with_client_request, ClientRequestId, EXTERNAL_CLIENT};
pub use health::{Heartbeat, QUORUM_FRESH};
pub use http_net::HttpNet;
pub use lease::Renew;
pub use mem_disk::MemDisk;
pub use meta::{random_u64, Meta};
pub use net::{MetaNet, Method, NetAnswer, NetCall, NetError, NetFuture};
pub use state::lease::{LeaseExtension, NEW_LEADER_MARGIN_MS};
pub use state::tokens::{check_token_name, MAX_TOKENS};
pub use state::{
    history_span, ApiToken, ApplyResult, Command, EpochNote, EpochRecord, Judged, MetaState, Reply,
    Role, Settings, VdiLock, DEFAULT_DOWN_AFTER_MS, DEFAULT_RECOVERY_MIB_S, MAX_OBJECT_SIZE,
    MAX_VDI_SIZE, SECTOR_SIZE,
};

use drove_types::{NodeId, NodeInfo};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// How to start the metadata service of one node.
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// The node's data directory; this crate owns `data_dir/meta/`.
    pub data_dir: PathBuf,
    /// `host:port` where [`Meta::router`] (the internal routes) is served: the node's
    /// peer port. Other nodes reach our Raft there; it is this node's Raft address.
    pub addr: String,
    /// Admin `host:port` of any existing member, to join its cluster (its public
    /// hello names its internal address). `None` on a fresh directory bootstraps a
    /// one-voter cluster with node id 1.
    pub join: Option<String>,
    /// This node's zone, weight and addresses (the `id` field is ignored and filled in).
    pub node: NodeInfo,
    /// Largest number of Raft voters; later nodes join as learners.
    pub max_voters: usize,
    /// How long a fresh node keeps trying to reach `join` (to learn the cluster id,
    /// then to get a node id) before [`Meta::open`] gives up with an error.
    pub join_timeout: std::time::Duration,
    /// Mutual TLS for the internal calls to other nodes' peer ports (their Raft,
    /// forwarded writes, joins, heartbeats): `https`, this node's certificate
    /// presented, only the cluster's node certificates accepted. `None`: plain HTTP.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// A routes file (a JSON object: peer address -> address to dial instead) that
    /// internal calls follow like the peer pool does; WAN emulation puts delay
    /// proxies there. Absent or unreadable: no routes.
    pub routes: Option<PathBuf>,
}

/// Default for [`MetaConfig::join_timeout`].
pub const DEFAULT_JOIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Default for [`MetaConfig::max_voters`].
pub const DEFAULT_MAX_VOTERS: usize = 3;

/// Raft status of this node, for `drove cluster status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaStatus {
    /// This node.
    pub node_id: NodeId,
    /// The leader this node currently believes in, if any (right after a restart, the
    /// one of its persisted vote, until an election says otherwise).
    pub leader: Option<NodeId>,
    /// The current Raft term.
    pub term: u64,
    /// Voting members.
    pub voters: Vec<NodeId>,
    /// Non-voting members.
    pub learners: Vec<NodeId>,
    /// Index of the last log entry applied to this node's state (`None` before any).
    pub last_applied_index: Option<u64>,
    /// Milliseconds since this node last knew of a working metadata majority (see
    /// [`Meta::quorum_age`]); `None`: not since it started.
    #[serde(default)]
    pub quorum_age_ms: Option<u64>,
}
