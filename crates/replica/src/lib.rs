//! Layer 4 and 5 of the data path: replication and the peer transport.
//!
//! ```text
//! volume ──> Gateway ──(local call or Transport)──> PeerServer ──> ObjectStore
//!                 └── placement::locate(map, oid, copies) picks the replicas
//! ```
//! The [`Transport`] is the seam to the network: the TCP [`PeerPool`] in
//! production, a simulated network in the simulator (crates/sim), which runs the
//! gateway, the replica side and recovery unchanged on tokio's paused clock.
//! The [`Gateway`] is the node that serves a VDI; it sends every write to all
//! replicas (direct) or to the first, which forwards (primary-copy), and reads from the
//! nearest replica that answers. The [`PeerServer`] runs on every node and applies
//! requests to the local store ([`local`]), forwarding for primary-copy writes.
//! Its listener and connections are held to limits ([`ServerLimits`]); the accept
//! loop ([`accept`]) and the write deadline ([`stall`]) serve the admin API too.
#![deny(missing_docs)]

pub mod accept;
pub mod admission;
pub mod catalog;
pub mod catchup;
mod check;
mod client;
mod gateway;
mod hello;
pub mod liveness;
pub mod local;
mod mapcell;
mod placecache;
mod ranges;
mod readahead;
pub mod recovery;
mod server;
mod ship;
pub mod stall;
mod throttle;
pub mod transport;
mod writer;

pub use catalog::{Catalog, CatalogCell};
pub use check::{CheckReport, Mismatch, ReplicaView, ScrubReport, ScrubTotals};
pub use client::{PeerPool, PeerTimeouts};
pub use gateway::{Gateway, Lag, Membership};
pub use local::LocalStore;
pub use mapcell::MapCell;
pub use recovery::{Progress, Recoverer, View};
pub use server::{HttpHandoff, PeerIo, PeerServer, ServerLimits, FRAME_STALL, PEER_IDLE};
pub use transport::Transport;
