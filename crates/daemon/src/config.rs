//! What a node is told at start (the `drove node run` flags).
use std::net::SocketAddr;
use std::path::PathBuf;

/// Start-up settings of one node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Data directory: metadata, objects, the NBD socket, the log.
    pub data: PathBuf,
    /// Failure domain.
    pub zone: String,
    /// Placement weight.
    pub weight: u32,
    /// A witness: a metadata voter only. It stores no objects (weight 0, placement
    /// skips it), binds no NBD port or socket (`nbd_listen` and the NBD settings are
    /// unused) and is preferred as its zone's metadata voter.
    pub witness: bool,
    /// Admin HTTP API (and Raft RPC) address.
    pub listen: SocketAddr,
    /// Peer data transport address.
    pub peer_listen: SocketAddr,
    /// NBD TCP address.
    pub nbd_listen: SocketAddr,
    /// Admin address of an existing member to join; none to bootstrap or restart.
    pub join: Option<String>,
    /// Voters of the metadata cluster at most; later nodes are learners.
    pub max_voters: usize,
    /// How long a fresh node keeps trying to reach `join` before it gives up.
    pub join_timeout: std::time::Duration,
    /// Lease of a VDI write lock; a gateway cut off from the metadata stops writing
    /// when it ends, and another node may then take the VDI.
    pub lock_lease: std::time::Duration,
    /// Pause between background scrubs of this node's objects (`None`: never).
    pub scrub_every: Option<std::time::Duration>,
    /// Bytes kept free on the data directory's file system for the node itself
    /// (`None`: [`drove_objstore::default_reserve`] of its size): below that, the
    /// object store refuses writes that need new space.
    pub reserve_space: Option<u64>,
    /// Time an NBD client has for its handshake.
    pub nbd_handshake_timeout: std::time::Duration,
    /// NBD connections open at once, TCP and unix socket together.
    pub nbd_max_connections: usize,
    /// NBD TCP connections open at once from one client address.
    pub nbd_max_connections_per_client: usize,
    /// The group of the NBD unix socket (a name or a number): its members may attach
    /// any VDI through it. `None`: the node's own group.
    pub nbd_socket_group: Option<String>,
    /// Admin API connections open at once; a quarter of them is kept for loopback
    /// and the cluster's nodes.
    pub admin_max_connections: usize,
    /// Admin API connections open at once from one other address.
    pub admin_max_connections_per_client: usize,
    /// Time an admin API connection has for its TLS handshake and first request.
    pub admin_handshake_timeout: std::time::Duration,
    /// Peer port connections open at once; a quarter of them is kept for the
    /// cluster's nodes and loopback.
    pub peer_max_connections: usize,
    /// Peer port connections open at once from one address that is not a node's.
    pub peer_max_connections_per_client: usize,
    /// The node's certificates: `ca-cert.pem`, `server-cert.pem`, `server-key.pem`.
    pub tls_dir: Option<PathBuf>,
    /// TLS on the NBD TCP port (needs `tls_dir` unless off). The unix socket is
    /// always plaintext.
    pub nbd_tls: drove_nbd::TlsMode,
    /// Mutual TLS on the peer port (objects, Raft, internal metadata calls), both
    /// ways, with `tls_dir`'s node certificate; only nodes of the same CA get in.
    /// Without `tls_dir` the peer port is plaintext. Every node of a cluster must
    /// agree.
    pub peer_tls: bool,
    /// The node's admin API token (the content of `--admin-token-file`): with one,
    /// the admin API asks every request for a token ([`crate::auth`]).
    pub admin_token: Option<String>,
    /// With `admin_token`, `/metrics` still answers without one.
    pub open_metrics: bool,
}

impl NodeConfig {
    /// The NBD unix socket path: DATA/nbd.sock.
    pub fn nbd_socket(&self) -> PathBuf {
        self.data.join("nbd.sock")
    }
}
