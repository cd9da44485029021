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
    /// A witness (`drove up --witness`): a metadata voter only, with no NBD
    /// (`nbd_tcp` and `nbd_unix` are empty). Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub witness: bool,
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
    /// The node's TLS directory (`drove node run --tls-dir`), for a cluster started
    /// by `drove up` (unless --no-tls).
    #[serde(default)]
    pub tls_dir: Option<String>,
    /// The admin API token file (`drove node run --admin-token-file`), for a
    /// cluster started with `drove up --auth`; the CLI sends its content when
    /// DROVE_TOKEN_FILE names it.
    #[serde(default)]
    pub admin_token_file: Option<String>,
}

/// The certificates of a cluster started by `drove up` (unless --no-tls).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterTls {
    /// DIR/tls: the CA and a client certificate, in the layout QEMU's
    /// `tls-creds-x509,endpoint=client,dir=` and libnbd's `tls-certificates=` read.
    pub dir: String,
    /// The CA certificate.
    pub ca_cert: String,
    /// The CA key (it signs more certificates: `drove cert node|client --ca DIR`).
    pub ca_key: String,
    /// A client certificate of the CA (CN `drove-client`).
    pub client_cert: String,
    /// Its key.
    pub client_key: String,
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFile {
    /// Nodes in start order.
    pub nodes: Vec<NodeEntry>,
    /// The cluster's certificates, when NBD runs over TLS.
    #[serde(default)]
    pub tls: Option<ClusterTls>,
}
