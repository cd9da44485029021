//! Request and response headers. Bulk data (the bytes of a write, the bytes a read
//! returns) does not go through serde: it travels as the frame's payload.
use drove_types::{Epoch, ErrorKind, NodeId, ObjectId};
use serde::{Deserialize, Serialize};

/// A request from a gateway (or a primary forwarding) to a peer's object store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerReq {
    /// Liveness and round-trip probe.
    Ping,
    /// Read `len` bytes of `oid` at `offset`; the answer is [`PeerResp::Data`].
    Read {
        /// Object.
        oid: ObjectId,
        /// Offset inside the object.
        offset: u64,
        /// Length.
        len: u32,
    },
    /// Write the frame's payload into `oid` at `offset`; with `fua`, make it durable
    /// before answering. `forward` lists nodes the receiver must pass the same write to
    /// (primary-copy replication) and wait for before answering.
    Write {
        /// Object.
        oid: ObjectId,
        /// Offset inside the object.
        offset: u64,
        /// Make durable before answering.
        fua: bool,
        /// Epoch of the sender's cluster map.
        epoch: Epoch,
        /// The gateway's lock generation for the VDI; older ones are refused (fencing).
        generation: u64,
        /// Nodes to forward to (primary-copy); empty for direct writes.
        forward: Vec<NodeId>,
    },
    /// Make `[offset, offset+len)` of `oid` read as zeros (punched, not stored).
    WriteZeroes {
        /// Object.
        oid: ObjectId,
        /// Offset inside the object.
        offset: u64,
        /// Length.
        len: u64,
        /// Make durable before answering.
        fua: bool,
        /// Epoch of the sender's cluster map.
        epoch: Epoch,
        /// The gateway's lock generation for the VDI (fencing).
        generation: u64,
        /// Nodes to forward to (primary-copy).
        forward: Vec<NodeId>,
    },
    /// fsync these objects (all dirty objects if empty).
    Flush {
        /// Objects to make durable.
        oids: Vec<ObjectId>,
    },
    /// Which of these objects exist on the receiver; the answer is [`PeerResp::Exists`].
    Exists {
        /// Objects to look up.
        oids: Vec<ObjectId>,
    },
}

impl PeerReq {
    /// Short name for metrics and logs.
    pub fn op_name(&self) -> &'static str {
        match self {
            PeerReq::Ping => "ping",
            PeerReq::Read { .. } => "read",
            PeerReq::Write { .. } => "write",
            PeerReq::WriteZeroes { .. } => "write_zeroes",
            PeerReq::Flush { .. } => "flush",
            PeerReq::Exists { .. } => "exists",
        }
    }
}

/// An error as it crosses the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    /// Stable kind.
    pub kind: ErrorKind,
    /// Message, including the peer's context.
    pub msg: String,
}

impl From<drove_types::Error> for WireError {
    fn from(e: drove_types::Error) -> Self {
        WireError {
            kind: e.kind(),
            msg: e.to_string(),
        }
    }
}

impl From<WireError> for drove_types::Error {
    fn from(e: WireError) -> Self {
        drove_types::Error::new(e.kind, e.msg)
    }
}

/// A peer's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerResp {
    /// Done; no data.
    Ok,
    /// The frame's payload holds the bytes read.
    Data,
    /// One flag per object asked about, in order.
    Exists(Vec<bool>),
    /// The request failed.
    Err(WireError),
}
