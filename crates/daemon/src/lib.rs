//! A drove node: one process, one data directory. [`run`] binds the listeners,
//! opens the metadata (openraft) and the object store, and serves:
//!
//! ```text
//! NBD (TCP + DIR/nbd.sock) ─> exports ─> Volume ─> Gateway ─┬─> local ObjectStore
//!                                                           └─> PeerPool ─TCP─> PeerServer (other nodes)
//! admin HTTP: /api/* (CLI), /metrics (Prometheus), /raft/* + /meta/* (metadata)
//! ```
#![deny(missing_docs)]

mod admin;
mod auth;
mod bench;
pub use bench::BENCH_PREFIX;
pub mod api;
mod clients;
mod config;
mod datadir;
mod disk;
mod exports;
mod first_head;
mod health;
mod health_voters;
pub mod http_listen;
pub mod iostat;
mod lineage;
mod locks;
mod membership;
mod nbd_socket;
mod node;
mod ops_metrics;
mod rejection;
mod role;
mod sd_notify;
mod settle;
mod upgrade;
pub mod wan;
mod watch;

pub use config::NodeConfig;
/// What a node runs beside its data path, over its metadata: production's, which
/// the simulator's nodes run too (the failed-disk mark-down and heartbeat verdict,
/// and following the metadata into the map, catalog and recovery's view).
pub use disk::{heartbeat_healthy, mark_down_when_failed};
pub use drove_nbd::TlsMode;
/// The daemon's lock service, mark-downs and post-crash settle, over any
/// [`drove_meta::MetaApi`]: the simulator runs them too.
pub use locks::MetaLocks;
pub use membership::MetaMembership;
pub use node::run;
pub use settle::Settler;
pub use watch::follow_metadata;
