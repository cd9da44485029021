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

/// The identity of one cluster, made at random when its first node bootstraps (like
/// Ceph's fsid). Every node-to-node message carries it, so a node left running from
/// another cluster (a deleted one whose ports were reused) is refused, not obeyed.
/// Not a secret: it names a cluster, it does not authenticate anyone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterId(pub u128);

impl ClusterId {
    /// The text form: 32 lower-case hex digits.
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }

    /// Parse the text form (32 hex digits, any case).
    pub fn from_hex(s: &str) -> Option<ClusterId> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(ClusterId)
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for ClusterId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for ClusterId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ClusterId::from_hex(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("bad cluster id '{s}'")))
    }
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
    fn test_cluster_id_text_round_trips_and_junk_is_refused() {
        let id = ClusterId(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
        assert_eq!(id.to_hex(), "0123456789abcdeffedcba9876543210");
        assert_eq!(ClusterId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(
            ClusterId::from_hex("0123456789ABCDEFFEDCBA9876543210"),
            Some(id)
        );
        for bad in [
            "",
            "12",
            "+123456789abcdeffedcba987654321",
            "0123456789abcdeffedcba98765432100",
        ] {
            assert_eq!(ClusterId::from_hex(bad), None, "{bad}");
        }
    }

    #[test]
    fn test_object_id_round_trips_through_u64() {
        let oid = ObjectId::new(VdiId(0xdead), 0xbeef);
        assert_eq!(ObjectId::from_u64(oid.as_u64()), oid);
        assert_eq!(oid.to_string(), "0000dead0000beef");
    }
}
