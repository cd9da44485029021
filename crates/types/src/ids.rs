//! Identifier newtypes. An object is named by its VDI and its index in the VDI.
use serde::{Deserialize, Serialize};
use std::fmt;

/// A node of the cluster; also its Raft node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u64);

/// A virtual disk image.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct VdiId(pub u32);

/// The version of the cluster map; grows by one at every membership change.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Epoch(pub u64);

/// The version of one copy of an object: the lock generation and the map epoch of
/// the last write it took (a recovered copy takes its source's). Ordered by
/// generation, then epoch: a newer gateway (higher generation) supersedes an older
/// one, and a gateway's later epochs supersede its earlier ones, since a write is
/// only acknowledged without a replica after that replica is marked down, which
/// moves the epoch. When no copy is known to be current, the highest version holds
/// every acknowledged write. Zero: written before versions existed, or never.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ObjVersion {
    /// The writer's lock generation for the VDI.
    pub generation: u64,
    /// The epoch of the writer's cluster map.
    pub epoch: u64,
}

/// One object of a VDI: bytes `[index * object_size, (index + 1) * object_size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectId {
    /// The VDI the object belongs to.
    pub vdi: VdiId,
    /// Offset in the VDI divided by the object size.
    pub index: u32,
}

impl ObjectId {
    /// The object `index` of `vdi`.
    pub fn new(vdi: VdiId, index: u32) -> Self {
        ObjectId { vdi, index }
    }

    /// A stable 64-bit key (VDI in the high half), used for hashing and file names.
    pub fn as_u64(self) -> u64 {
        (u64::from(self.vdi.0) << 32) | u64::from(self.index)
    }

    /// The inverse of [`ObjectId::as_u64`].
    pub fn from_u64(v: u64) -> Self {
        ObjectId {
            vdi: VdiId((v >> 32) as u32),
            index: v as u32,
        }
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for VdiId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for ObjVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "g{}e{}", self.generation, self.epoch)
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.as_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_object_id_round_trips_through_u64() {
        let oid = ObjectId::new(VdiId(0xdead), 0xbeef);
        assert_eq!(ObjectId::from_u64(oid.as_u64()), oid);
        assert_eq!(oid.to_string(), "0000dead0000beef");
    }
}
