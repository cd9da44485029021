//! The seam between the replication logic and the network: how a node reaches its
//! peers. In production that is the TCP [`PeerPool`]; the deterministic simulator
//! (crates/sim) implements it over a simulated network with per-zone latencies,
//! cut links and crashed nodes, and runs the same [`crate::Gateway`],
//! [`crate::Recoverer`] and [`crate::local::apply_and_forward`] over it.
//!
//! A call is one request and its answer; everything the replication logic asks of
//! the network besides calls is what the pool measures (round trips) and what it
//! concluded (a peer went silent).
use bytes::Bytes;
use drove_proto::{PeerReq, PeerResp};
use drove_types::{Epoch, Error, ErrorKind, NodeId, Result};
use futures::future::BoxFuture;
use std::time::Duration;

use crate::PeerPool;

/// How a node sends requests to its peers.
pub trait Transport: Send + Sync + 'static {
    /// This node.
    fn me(&self) -> NodeId;

    /// Send `req` with `payload` to `node` and wait for its answer. A
    /// [`PeerResp::Err`] or [`PeerResp::ForwardFailed`] answer is an error.
    fn call(
        &self,
        node: NodeId,
        req: PeerReq,
        payload: Bytes,
    ) -> BoxFuture<'_, Result<(PeerResp, Bytes)>>;

    /// The smoothed round trip to `node`, once measured.
    fn rtt(&self, node: NodeId) -> Option<Duration>;

    /// A round trip to `node` longer than almost all measured ones, once measured.
    fn rtt_high(&self, node: NodeId) -> Option<Duration>;

    /// Whether `node` was given up as silent (stopped answering, rather than
    /// answered with errors) within `within`.
    fn silent_within(&self, node: NodeId, within: Duration) -> bool;

    /// Whether `node` answers a ping within `within`, even one given up as silent a
    /// moment ago (`epoch`: the caller's map). An error answer is an answer; only
    /// no answer ([`drove_types::ErrorKind::Unavailable`]) is an error.
    fn probe(&self, node: NodeId, epoch: Epoch, within: Duration) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let ping = self.call(node, PeerReq::Ping { epoch }, Bytes::new());
            match tokio::time::timeout(within, ping).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) if e.kind() != ErrorKind::Unavailable => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(Error::unavailable(format!(
                    "Node {node} did not answer a ping within {} ms",
                    within.as_millis()
                ))),
            }
        })
    }
}

impl Transport for PeerPool {
    fn me(&self) -> NodeId {
        PeerPool::me(self)
    }

    fn call(
        &self,
        node: NodeId,
        req: PeerReq,
        payload: Bytes,
    ) -> BoxFuture<'_, Result<(PeerResp, Bytes)>> {
        Box::pin(PeerPool::call(self, node, req, payload))
    }

    fn rtt(&self, node: NodeId) -> Option<Duration> {
        PeerPool::rtt(self, node)
    }

    fn rtt_high(&self, node: NodeId) -> Option<Duration> {
        PeerPool::rtt_high(self, node)
    }

    fn silent_within(&self, node: NodeId, within: Duration) -> bool {
        PeerPool::silent_within(self, node, within)
    }

    /// Past the pool's fail-fast for a silent peer: a fresh dial if need be.
    fn probe(&self, node: NodeId, _epoch: Epoch, within: Duration) -> BoxFuture<'_, Result<()>> {
        Box::pin(PeerPool::probe(self, node, within))
    }
}
