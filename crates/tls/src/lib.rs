//! drove's transport security, below every TCP port of a node: a cluster CA that
//! signs node and client certificates ([`ca`]), the PEM files they live in
//! ([`files`]), and the rustls configurations built from those files ([`config`]).
//!
//! ```text
//!   drove cert ca / drove up       ─▶ Ca::generate ─▶ ca-cert.pem, ca-key.pem
//!   drove cert node|client          ─▶ Ca::issue_*   ─▶ server-*.pem | client-*.pem
//!   drove node run --tls-dir DIR    ─▶ config::server_config ─▶ NBD STARTTLS (later: peers, Raft)
//! ```
//!
//! The file names are the ones QEMU's `tls-creds-x509` object reads from its `dir`,
//! so a client directory written here is handed to QEMU as it is.
#![deny(missing_docs)]

pub mod ca;
pub mod config;
mod error;
pub mod files;
pub mod node;
pub mod reload;
mod roots;

pub use ca::{Ca, Issued, NodeNames};
pub use config::{
    client_config, common_name, node_server_config, server_config, ClientAuth, Identity,
};
pub use error::Error;
pub use node::{
    admin_client_config, peer_client_config, peer_server_config, peer_server_name, ALPN_HTTP,
    ALPN_PEER,
};
pub use reload::ReloadingIdentity;

/// The CA certificate (in every directory: the node's, the client's, the CA's).
pub const CA_CERT: &str = "ca-cert.pem";
/// The CA's private key (only in the CA directory).
pub const CA_KEY: &str = "ca-key.pem";
/// A node's certificate (server and client authentication).
pub const SERVER_CERT: &str = "server-cert.pem";
/// A node's private key.
pub const SERVER_KEY: &str = "server-key.pem";
/// A client's certificate (client authentication only).
pub const CLIENT_CERT: &str = "client-cert.pem";
/// A client's private key.
pub const CLIENT_KEY: &str = "client-key.pem";

/// A DNS name every node certificate carries besides its own hosts, so that a node
/// can check "signed by the cluster CA as a node" without knowing the address it
/// dialled (peer traffic, later).
pub const NODE_NAME: &str = "drove-node";

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
