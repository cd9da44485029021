//! drove's NBD server: layer 1 of the data path. QEMU (or any NBD client) connects over
//! a unix socket or TCP, negotiates an export with the fixed newstyle handshake, and
//! sends requests that the server runs concurrently against an [`Export`] (in drove,
//! the volume layer), answering out of order.
//!
//! ```text
//!   socket ─▶ session (handshake glue) ─▶ handshake::Negotiation   (sans-IO)
//!                  │
//!                  ▼
//!             transmit (reader ─▶ task per request ─▶ writer)
//!                  │        request::Request::check / reply::Reply (sans-IO)
//!                  ▼
//!             exec ─▶ Export::{read,write,flush,..} ─▶ volume layer
//! ```
//!
//! Wire encoding and decoding (`proto`, `option`, `handshake`, `request`, `reply`)
//! are pure functions over bytes, public so tests, fuzzers and tools can drive them;
//! `session`, `transmit` and `server` are the tokio glue. On TCP the server may offer
//! or require TLS (`NBD_OPT_STARTTLS`, [`TlsMode`]); the unix socket never does.
#![deny(missing_docs)]

mod barrier;
mod errno;
mod exec;
mod export;
pub mod handshake;
pub mod option;
pub mod proto;
pub mod reply;
pub mod request;
mod server;
mod session;
mod transmit;
mod wire;

pub use errno::errno_for;
pub use export::{ClientInfo, Credential, Export, Exports, Extent};
pub use handshake::TlsMode;
pub use server::Server;

use std::time::Duration;

/// Per-connection limits, so that one client cannot take the node's memory or tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Requests in flight per connection (further requests are not read until one
    /// completes and its reply is written).
    pub max_requests: usize,
    /// READ and WRITE payload bytes held per connection, in requests and unsent
    /// replies. A request larger than this takes the whole budget.
    pub max_buffered_bytes: usize,
    /// Time allowed from accept to the end of option haggling.
    pub handshake_timeout: Duration,
    /// Connections open at once, TCP and unix socket together; more are closed at
    /// accept.
    pub max_connections: usize,
    /// TCP connections open at once from one client address; more are closed at
    /// accept, so that one client cannot take the others' share.
    pub max_connections_per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_requests: 64,
            max_buffered_bytes: 128 << 20,
            handshake_timeout: Duration::from_secs(30),
            max_connections: 4096,
            max_connections_per_client: 256,
        }
    }
}
