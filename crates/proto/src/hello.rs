//! The hello: the first frame each side sends on a peer connection, before any
//! [`crate::PeerReq`]. The dialling node sends a `Frame<Hello>`, the accepting node
//! answers with a `Frame<HelloReply>`: its own hello, or a refusal with the reason,
//! after which it closes the connection.
//!
//! A hello names the wire version, the cluster and the sender. It keeps a node of
//! another cluster (left running on a reused address) or of another version from
//! exchanging data with this one, with a clear reason on both sides. It is not
//! authentication against an attacker (the cluster id is no secret); what bounds a
//! stranger is that, before a valid hello, a server reads nothing over
//! [`HELLO_MAX`] bytes.
//!
//! The decisions are pure functions ([`Hello::answer`], [`Hello::check_reply`]); the
//! replica crate's client and server do the I/O. Future versions must keep these two
//! messages decodable, like the frame prefix, so that mismatched versions can still
//! tell each other why they refuse.
use drove_types::{ClusterId, NodeId};
use serde::{Deserialize, Serialize};

use crate::frame::WIRE_VERSION;

/// Largest frame a server reads before a valid hello.
pub const HELLO_MAX: usize = 4096;

/// Who is speaking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The wire version the sender speaks.
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

impl Hello {
    /// This build's hello for node `node` of `cluster`.
    pub fn new(cluster: ClusterId, node: NodeId) -> Hello {
        Hello {
            version: WIRE_VERSION,
            cluster,
            node,
        }
    }

    /// The server's answer (`self` is the server's hello) to a client's `theirs`.
    pub fn answer(&self, theirs: &Hello) -> HelloReply {
        if theirs.version != self.version {
            return HelloReply::Refused(format!(
                "this node speaks drove wire version {}, node {} says it speaks {}: \
                 mixed versions during an upgrade?",
                self.version, theirs.node, theirs.version
            ));
        }
        if theirs.cluster != self.cluster {
            return HelloReply::Refused(format!(
                "it belongs to cluster {}, node {} says it belongs to cluster {}",
                self.cluster, theirs.node, theirs.cluster
            ));
        }
        HelloReply::Welcome(*self)
    }

    /// Whether the server's `reply` to this (the client's) hello, sent by the node
    /// dialled as `dialled`, lets the connection go on; `Err` holds why not.
    pub fn check_reply(&self, dialled: NodeId, reply: &HelloReply) -> Result<(), String> {
        let theirs = match reply {
            HelloReply::Refused(why) => return Err(format!("refused us: {why}")),
            HelloReply::Welcome(h) => h,
        };
        if theirs.version != self.version {
            return Err(format!(
                "speaks drove wire version {}, this node speaks {}",
                theirs.version, self.version
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ClusterId = ClusterId(0xaaaa);
    const B: ClusterId = ClusterId(0xbbbb);

    #[test]
    fn test_same_cluster_and_version_is_welcome() {
        let server = Hello::new(A, NodeId(2));
        let reply = server.answer(&Hello::new(A, NodeId(1)));
        assert_eq!(reply, HelloReply::Welcome(server));
        assert_eq!(
            Hello::new(A, NodeId(1)).check_reply(NodeId(2), &reply),
            Ok(())
        );
    }

    #[test]
    fn test_another_cluster_is_refused_naming_both() {
        let server = Hello::new(A, NodeId(2));
        let HelloReply::Refused(why) = server.answer(&Hello::new(B, NodeId(1))) else {
            panic!("welcomed another cluster");
        };
        assert!(
            why.contains(&A.to_hex()) && why.contains(&B.to_hex()),
            "{why}"
        );
        let client = Hello::new(B, NodeId(1));
        let err = client
            .check_reply(NodeId(2), &HelloReply::Refused(why.clone()))
            .unwrap_err();
        assert!(
            err.starts_with("refused us: it belongs to cluster"),
            "{err}"
        );
        // A server that welcomes anyone is still caught by the client.
        let err = client
            .check_reply(NodeId(2), &HelloReply::Welcome(server))
            .unwrap_err();
        assert!(err.contains(&A.to_hex()), "{err}");
    }

    #[test]
    fn test_another_version_is_refused_naming_both() {
        let server = Hello::new(A, NodeId(2));
        let old = Hello {
            version: WIRE_VERSION + 1,
            ..Hello::new(A, NodeId(1))
        };
        let HelloReply::Refused(why) = server.answer(&old) else {
            panic!("welcomed another version");
        };
        assert!(
            why.contains(&format!("version {WIRE_VERSION}"))
                && why.contains(&format!("speaks {}", WIRE_VERSION + 1)),
            "{why}"
        );
        let err = old
            .check_reply(NodeId(2), &HelloReply::Welcome(server))
            .unwrap_err();
        assert!(err.contains("wire version"), "{err}");
    }

    #[test]
    fn test_a_reused_address_answering_as_another_node_is_refused() {
        let client = Hello::new(A, NodeId(1));
        let reply = HelloReply::Welcome(Hello::new(A, NodeId(5)));
        let err = client.check_reply(NodeId(2), &reply).unwrap_err();
        assert_eq!(err, "answered as node 5");
    }
}
