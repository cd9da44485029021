//! Request and response headers. Bulk data (the bytes of a write, the bytes a read
//! returns) does not go through serde: it travels as the frame's payload.
use drove_types::{Epoch, ErrorKind, NodeId, ObjVersion, ObjectId};
use serde::{Deserialize, Serialize};

/// Most objects one request may name (a FLUSH of more is sent in parts).
pub const MAX_OIDS: usize = 1 << 16;

/// A request from a gateway (or a primary forwarding) to a peer's object store.
///
/// Every request carries the epoch of the sender's cluster map. A replica refuses a
/// client request (read, write, exists, flush) from an older epoch with
/// `StaleEpoch` (the sender waits for the newer map and asks the replicas of that
/// one: a node that no longer holds an object must not answer for it), and holds one
/// from a newer epoch until it has caught up itself. Recovery's requests may come
/// from older epochs (they reason about them); `List` and `Ping` never wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerReq {
    /// Liveness and round-trip probe.
    Ping {
        /// Epoch of the sender's cluster map.
        epoch: Epoch,
    },
    /// Read `len` bytes of `oid` at `offset`; the answer is [`PeerResp::Data`].
    Read {
        /// Object.
        oid: ObjectId,
        /// Offset inside the object.
        offset: u64,
        /// Length.
        len: u32,
        /// Epoch of the sender's cluster map.
        epoch: Epoch,
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
        /// The epoch the write was acknowledged under, which the copy records as
        /// its version: `epoch`, except for a zone-sync write shipped to a copy
        /// outside the home zone after the map moved on. Never above `epoch`.
        made: Epoch,
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
        /// The epoch the write was acknowledged under, which the copy records as
        /// its version: `epoch`, except for a zone-sync write shipped to a copy
        /// outside the home zone after the map moved on. Never above `epoch`.
        made: Epoch,
    },
    /// fsync these objects (at most [`MAX_OIDS`]; all dirty objects if empty).
    Flush {
        /// Objects to make durable.
        oids: Vec<ObjectId>,
        /// Epoch of the sender's cluster map.
        epoch: Epoch,
    },
    /// Which of these objects (at most [`MAX_OIDS`]) exist on the receiver; the
    /// answer is [`PeerResp::Exists`].
    Exists {
        /// Objects to look up.
        oids: Vec<ObjectId>,
        /// Epoch of the sender's cluster map.
        epoch: Epoch,
    },
    /// Every object the receiver stores; the answer is [`PeerResp::List`].
    List {
        /// Epoch of the sender's cluster map.
        epoch: Epoch,
    },
    /// A digest of each object's content and whether the receiver's copy is current;
    /// the answer is [`PeerResp::Digests`]. `epoch` as for [`PeerReq::Fetch`]. A
    /// receiver already on a later map calls no copy current: its word is for its
    /// own map, which may place the objects elsewhere.
    Digest {
        /// Objects to digest (at most [`MAX_OIDS`]).
        oids: Vec<ObjectId>,
        /// Their size.
        len: u32,
        /// The asker's epoch.
        epoch: Epoch,
        /// Read and verify each copy's data (`vdi check`, and recovery once a
        /// source failed its checksums): the digest then also says whether the
        /// copy is corrupt. Without it the digest comes from the copy's stored
        /// block checksums alone, 4 bytes per 4 KiB block: recovery compares
        /// copies that way, without reading them.
        read: bool,
    },
    /// The whole object (`len` bytes from 0), for recovery. The receiver first waits
    /// until it knows `epoch` and every write it admitted before is applied, so the
    /// copy holds every write acknowledged under earlier epochs. A copy the receiver
    /// does not know to be current is refused with `Recovering` unless `force`.
    Fetch {
        /// Object.
        oid: ObjectId,
        /// Its size.
        len: u32,
        /// The asker's epoch.
        epoch: Epoch,
        /// Take the copy even if the receiver does not know it is current (no better
        /// copy exists anywhere).
        force: bool,
    },
    /// Replace the receiver's copy of `oid` with the copy on node `from` (`vdi check
    /// --repair`: replicas that differ after a gateway crash are made identical).
    Repair {
        /// Object.
        oid: ObjectId,
        /// Its size.
        len: u32,
        /// The node whose copy wins.
        from: NodeId,
        /// The asker's epoch.
        epoch: Epoch,
    },
    /// Replace `oid` by the frame's payload atomically (a clone's copy-up: the
    /// object is either missing or whole after a crash). Fenced like a write.
    Create {
        /// Object.
        oid: ObjectId,
        /// Epoch of the sender's cluster map.
        epoch: Epoch,
        /// The gateway's lock generation for the VDI (fencing).
        generation: u64,
        /// Nodes to forward to (primary-copy).
        forward: Vec<NodeId>,
        /// The epoch the write was acknowledged under, which the copy records as
        /// its version: `epoch`, except for a zone-sync write shipped to a copy
        /// outside the home zone after the map moved on. Never above `epoch`.
        made: Epoch,
    },
    /// Read `len` bytes of the receiver's copy of `oid` at `offset` whatever the
    /// copy's state, pending included, to mend another copy's rotten blocks: the
    /// answer is [`PeerResp::Data`], or `Corrupt` when they fail their checksums.
    /// A [`PeerReq::Read`] of a pending copy is refused, and after a whole-site
    /// power loss every copy is pending (each node's host booted since its clean
    /// epoch): copies torn in one block then asked each other for it forever.
    MendRead {
        /// Object.
        oid: ObjectId,
        /// Offset inside the object.
        offset: u64,
        /// Length.
        len: u32,
        /// The asker's epoch.
        epoch: Epoch,
    },
}

/// One replica's view of one object, for recovery and `vdi check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjDigest {
    /// The object exists on the replica.
    pub present: bool,
    /// The replica knows its copy to be current (it is not waiting for recovery).
    pub current: bool,
    /// The last epoch at which the replica had recovered everything it held.
    pub clean_epoch: Epoch,
    /// The content digest of the copy (`drove_objstore::content_crc`: crc32c of
    /// its blocks' checksums; a missing object as zeros); 0 when unreadable.
    pub crc: u32,
    /// The copy failed its block checksums (known only from a digest that read
    /// the data).
    pub corrupt: bool,
    /// The version of the copy's last write (zero when missing).
    pub version: ObjVersion,
}

impl PeerReq {
    /// The epoch of the sender's map.
    pub fn epoch(&self) -> Epoch {
        match self {
            PeerReq::Ping { epoch }
            | PeerReq::Read { epoch, .. }
            | PeerReq::Write { epoch, .. }
            | PeerReq::WriteZeroes { epoch, .. }
            | PeerReq::Flush { epoch, .. }
            | PeerReq::Exists { epoch, .. }
            | PeerReq::List { epoch }
            | PeerReq::Digest { epoch, .. }
            | PeerReq::Fetch { epoch, .. }
            | PeerReq::Repair { epoch, .. }
            | PeerReq::Create { epoch, .. }
            | PeerReq::MendRead { epoch, .. } => *epoch,
        }
    }

    /// The replicas a primary-copy write is to be passed on to (empty otherwise).
    pub fn forward(&self) -> &[NodeId] {
        match self {
            PeerReq::Write { forward, .. }
            | PeerReq::WriteZeroes { forward, .. }
            | PeerReq::Create { forward, .. } => forward,
            _ => &[],
        }
    }

    /// The first wire version that has this request: 5 for [`PeerReq::MendRead`],
    /// 4 for every other (see [`crate::version`]).
    pub fn since(&self) -> u8 {
        match self {
            PeerReq::MendRead { .. } => 5,
            _ => 4,
        }
    }

    /// This request as it is sent on a connection of wire `version`: itself when
    /// the version has it. A [`PeerReq::MendRead`] to a node of version 4 goes as
    /// the plain [`PeerReq::Read`] such a node was always sent to mend a block (its
    /// pending copies refuse it, as they always did); version 4 has no MendRead,
    /// and a real node of it could not even decode one.
    pub fn in_version(self, version: u8) -> PeerReq {
        match self {
            PeerReq::MendRead {
                oid,
                offset,
                len,
                epoch,
            } if version < 5 => PeerReq::Read {
                oid,
                offset,
                len,
                epoch,
            },
            req => req,
        }
    }

    /// Short name for metrics and logs.
    pub fn op_name(&self) -> &'static str {
        match self {
            PeerReq::Ping { .. } => "ping",
            PeerReq::Read { .. } => "read",
            PeerReq::Write { .. } => "write",
            PeerReq::WriteZeroes { .. } => "write_zeroes",
            PeerReq::Flush { .. } => "flush",
            PeerReq::Exists { .. } => "exists",
            PeerReq::List { .. } => "list",
            PeerReq::Digest { .. } => "digest",
            PeerReq::Fetch { .. } => "fetch",
            PeerReq::Repair { .. } => "repair",
            PeerReq::Create { .. } => "create",
            PeerReq::MendRead { .. } => "mend_read",
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
    /// The answer to [`PeerReq::Fetch`]: the payload holds the whole object.
    Object {
        /// The object exists on the sender (a missing one is sent as zeros).
        present: bool,
        /// The version of the sender's copy.
        version: ObjVersion,
    },
    /// One flag per object asked about, in order.
    Exists(Vec<bool>),
    /// The objects a node stores.
    List(Vec<ObjectId>),
    /// One digest per object asked about, in order.
    Digests(Vec<ObjDigest>),
    /// The request failed.
    Err(WireError),
    /// A primary-copy write failed on `node`, one of the replicas the primary passed it
    /// on to (`silent`: that node said nothing for the primary's whole silence time,
    /// rather than answering an error). The sender then writes to each replica
    /// directly, and need not wait out the same silence itself.
    ForwardFailed {
        /// The replica that failed.
        node: NodeId,
        /// It failed by saying nothing.
        silent: bool,
        /// Its error, as the primary saw it.
        err: WireError,
    },
    // Variants are encoded by position on the wire: new ones go at the end.
    /// The answer to [`PeerReq::Ping`]: the run of the answering process (random
    /// at every start), so that a lock's holder is known alive only in the run
    /// that took the lock.
    Pong {
        /// The answering process's incarnation (0: unknown).
        incarnation: u64,
    },
}
