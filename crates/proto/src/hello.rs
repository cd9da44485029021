//! The hello: the first frame each side sends on a peer connection, before any
//! [`crate::PeerReq`]. The dialling node sends a `Frame<Hello>`, the accepting node
//! answers with a `Frame<HelloReply>`: its own hello, or a refusal with the reason,
//! after which it closes the connection. Both frames are in
//! [`crate::HELLO_VERSION`]'s layout whatever the nodes speak.
//!
//! A hello names a wire version, the cluster and the sender; from version 5 on,
//! the frame's payload also carries the range of versions the sender speaks
//! ([`WireRange::encode`]; a version-4 node sent none, and ignores it). The dialling
//! node's hello names its oldest version, so that a version-4 node, which welcomes
//! only a hello of its own version, welcomes exactly the nodes that still speak 4.
//! The accepting node answers with the highest version both speak as its hello's
//! version, and its own range as the payload; the dialling node checks that choice
//! against the two ranges. Nodes whose ranges do not overlap are refused, with a
//! message naming both ranges.
//!
//! The hello keeps a node of another cluster (left running on a reused address) or
//! of versions this one does not speak from exchanging data with it, with a clear
//! reason on both sides. It is not authentication against an attacker (the cluster
//! id is no secret); what bounds a stranger is that, before a valid hello, a server
//! reads nothing over [`HELLO_MAX`] bytes.
//!
//! The decisions are pure functions ([`Speaker::answer`], [`Speaker::check_reply`]);
//! the replica crate's client and server do the I/O. Future versions must keep these
//! two messages decodable, like the frame prefix, so that mismatched versions can
//! still tell each other why they refuse.
use drove_types::{ClusterId, NodeId};
use serde::{Deserialize, Serialize};

use crate::version::WireRange;

/// Largest frame a server reads before a valid hello.
pub const HELLO_MAX: usize = 4096;

/// Who is speaking: the hello's header, in version 4's layout for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// From the dialling node, the oldest wire version it speaks; from the
    /// accepting node, the version the connection uses.
    pub version: u8,
    /// The sender's cluster.
    pub cluster: ClusterId,
    /// The sender's node id.
    pub node: NodeId,
}

/// The accepting side's answer to a [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloReply {
    /// Accepted: the server's own hello.
    Welcome(Hello),
    /// Refused, and why; the connection is closed after this.
    Refused(String),
}

/// What a node says about itself on every peer connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speaker {
    /// Its cluster.
    pub cluster: ClusterId,
    /// Its node id.
    pub node: NodeId,
    /// The wire versions it speaks.
    pub wire: WireRange,
}

/// A server's answer to a hello: the reply, its frame's payload, and the version
/// the connection uses if welcomed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The reply.
    pub reply: HelloReply,
    /// The server's range when welcomed (empty from a node of version 4 alone).
    pub payload: Vec<u8>,
    /// The connection's version, when welcomed.
    pub version: Option<u8>,
}

impl Speaker {
    /// Node `node` of `cluster`, speaking what this build speaks.
    pub fn new(cluster: ClusterId, node: NodeId) -> Speaker {
        Speaker {
            cluster,
            node,
            wire: WireRange::BUILD,
        }
    }

    /// The dialling node's hello and its frame's payload.
    pub fn hello(&self) -> (Hello, Vec<u8>) {
        let h = Hello {
            version: self.wire.min,
            cluster: self.cluster,
            node: self.node,
        };
        (h, self.wire.encode())
    }

    /// The server's (`self`'s) answer to a client's hello `theirs` with `payload`.
    pub fn answer(&self, theirs: &Hello, payload: &[u8]) -> Answer {
        let refuse = |why: String| Answer {
            reply: HelloReply::Refused(why),
            payload: Vec::new(),
            version: None,
        };
        let range = match WireRange::decode(payload) {
            Ok(None) => WireRange::only(theirs.version),
            Ok(Some(r)) if r.min == theirs.version => r,
            Ok(Some(r)) => {
                return refuse(format!(
                    "node {} announced wire versions {r} in a hello of version {}",
                    theirs.node, theirs.version
                ))
            }
            Err(why) => return refuse(format!("node {} {why}", theirs.node)),
        };
        let Some(version) = self.wire.common(&range) else {
            return refuse(format!(
                "this node speaks drove wire versions {}, node {} speaks {range}: \
                 mixed versions during an upgrade?",
                self.wire, theirs.node
            ));
        };
        if theirs.cluster != self.cluster {
            return refuse(format!(
                "it belongs to cluster {}, node {} says it belongs to cluster {}",
                self.cluster, theirs.node, theirs.cluster
            ));
        }
        Answer {
            reply: HelloReply::Welcome(Hello {
                version,
                cluster: self.cluster,
                node: self.node,
            }),
            payload: self.wire.encode(),
            version: Some(version),
        }
    }

    /// Whether the server's `reply` (with its frame's `payload`) to this (the
    /// client's) hello, sent by the node dialled as `dialled`, lets the connection
    /// go on: `Ok` holds the connection's version, `Err` why not.
    pub fn check_reply(
        &self,
        dialled: NodeId,
        reply: &HelloReply,
        payload: &[u8],
    ) -> Result<u8, String> {
        let theirs = match reply {
            HelloReply::Refused(why) => return Err(format!("refused us: {why}")),
            HelloReply::Welcome(h) => h,
        };
        // A version-4 server sends no range: its hello's version is its only one.
        let range = WireRange::decode(payload)?.unwrap_or(WireRange::only(theirs.version));
        let Some(version) = self.wire.common(&range) else {
            return Err(format!(
                "speaks drove wire versions {range}, this node speaks {}",
                self.wire
            ));
        };
        if theirs.version != version {
            return Err(format!(
                "chose drove wire version {}, but the highest both speak is {version}",
                theirs.version
            ));
        }
        if theirs.cluster != self.cluster {
            return Err(format!(
                "belongs to cluster {}, this node to cluster {}",
                theirs.cluster, self.cluster
            ));
        }
        if theirs.node != dialled {
            // The cluster map's address for `dialled` now belongs to another node.
            return Err(format!("answered as node {}", theirs.node));
        }
        Ok(version)
    }
}

#[cfg(test)]
#[path = "hello_tests.rs"]
mod tests;
