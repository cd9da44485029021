//! How one node's metadata service reaches the others: the seam between the
//! metadata and the network.
//!
//! Everything the metadata says to another node (Raft's appends, votes and
//! snapshots, forwarded writes, joins, removals, heartbeats, lease renewals, read
//! indexes, the hello a joining node asks) is one [`NetCall`]: a method and a path
//! on the receiver's internal routes, the sender's cluster id, a JSON body and a
//! time limit; the answer is a status and a JSON body ([`NetAnswer`]). The
//! receiving side is [`crate::Meta::serve`], whatever carried the call. In
//! production the carrier is HTTP(S) on the nodes' peer ports
//! ([`crate::HttpNet`]); in the simulator (crates/sim) it is the simulated network,
//! with its delays, cuts and crashed hosts. Both run this crate's code on either
//! side, openraft included.
use drove_types::ClusterId;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A request's method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// A question (`/meta/hello`).
    Get,
    /// Everything else.
    Post,
}

/// One call to another node's internal routes.
#[derive(Debug, Clone)]
pub struct NetCall {
    /// GET or POST.
    pub method: Method,
    /// `/raft/append`, `/meta/write`, ...
    pub path: String,
    /// The sender's cluster (`None` before it knows it: a joining node's hello).
    pub cluster: Option<ClusterId>,
    /// The JSON body (empty for a GET).
    pub body: Vec<u8>,
    /// How long the caller waits for the answer.
    pub timeout: Duration,
}

/// An answer: the status (200 done; 403 refused for good, another cluster; 404 a
/// route the receiver does not have; 400 a request it refused; 5xx not now) and the
/// body.
#[derive(Debug, Clone)]
pub struct NetAnswer {
    /// HTTP status code.
    pub status: u16,
    /// The body (JSON, except the text of a refusal).
    pub body: Vec<u8>,
}

impl NetAnswer {
    /// Whether the status says the call was done (2xx).
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// A call that got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetError {
    /// Nothing was delivered: refused, unreachable, no route to the address.
    Connect(String),
    /// No answer within the time limit: the receiver may have got the call.
    Timeout(String),
    /// The connection broke after the call was sent, or the answer was garbled:
    /// the receiver may have got it.
    Broken(String),
}

impl NetError {
    /// Whether the receiver may have got the call (and done its work).
    pub fn maybe_delivered(&self) -> bool {
        !matches!(self, NetError::Connect(_))
    }

    /// Whether nobody answered at all (refused, unreachable, or silent): a node
    /// that is down or starting, worth waiting for.
    pub fn is_silence(&self) -> bool {
        matches!(self, NetError::Connect(_) | NetError::Timeout(_))
    }

    /// What happened, for humans.
    pub fn why(&self) -> &str {
        match self {
            NetError::Connect(w) | NetError::Timeout(w) | NetError::Broken(w) => w,
        }
    }
}

/// What [`MetaNet::call`] returns.
pub type NetFuture<'a> = Pin<Box<dyn Future<Output = Result<NetAnswer, NetError>> + Send + 'a>>;

/// The metadata's way to the other nodes.
pub trait MetaNet: Send + Sync + 'static {
    /// Make `call` to the node whose routes are at `to` (its peer address, as the
    /// Raft membership names it; a joining node's hello goes to an admin address).
    fn call<'a>(&'a self, to: &'a str, call: NetCall) -> NetFuture<'a>;

    /// `http` or `https`, for the addresses named in messages and logs.
    fn scheme(&self) -> &'static str {
        "sim"
    }
}
