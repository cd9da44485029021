//! The VDI record kept in the cluster metadata.
use crate::{Error, ObjectId, Result, VdiId};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Object size of new VDIs: 4 MiB.
pub const DEFAULT_OBJECT_SIZE: u32 = 4 << 20;

/// Largest number of copies a VDI may ask for.
pub const MAX_COPIES: u8 = 5;

/// How a gateway sends a write to the replicas of an object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicationMode {
    /// The gateway sends to every replica in parallel.
    #[default]
    Direct,
    /// The gateway sends to the first replica, which forwards to the others.
    PrimaryCopy,
}

impl fmt::Display for ReplicationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplicationMode::Direct => "direct",
            ReplicationMode::PrimaryCopy => "primary-copy",
        })
    }
}

impl FromStr for ReplicationMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "direct" => Ok(ReplicationMode::Direct),
            "primary-copy" => Ok(ReplicationMode::PrimaryCopy),
            _ => Err(Error::invalid(format!(
                "Unknown replication mode '{s}': use direct or primary-copy"
            ))),
        }
    }
}

/// A virtual disk image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VdiInfo {
    /// Id, unique for the life of the cluster (never reused).
    pub id: VdiId,
    /// Name; also the NBD export name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Object size in bytes.
    pub object_size: u32,
    /// Number of replicas of each object.
    pub copies: u8,
    /// Write fan-out mode.
    pub mode: ReplicationMode,
    /// Creation time, seconds since the Unix epoch.
    pub created: u64,
    /// Replicas that must have a write before it is acknowledged while some are down;
    /// `None` means `copies - 1` (at least 1). See [`VdiInfo::min_copies`].
    #[serde(default)]
    pub min_copies: Option<u8>,
    /// The snapshot this VDI was cloned from: objects it never wrote are read from
    /// there (and from its parent, up the chain). `None` for a VDI of its own.
    #[serde(default)]
    pub parent: Option<VdiId>,
    /// A read-only, frozen image taken with `drove vdi snapshot`; clones read from it.
    #[serde(default)]
    pub snapshot: bool,
    /// Deleted when the last client that wrote it detaches (`vdi clone --ephemeral`).
    #[serde(default)]
    pub ephemeral: bool,
    /// The zone (datacenter) whose nodes hold [`VdiInfo::home_copies`] of its objects,
    /// so that its writer's writes and reads stay there. Set at creation
    /// (`--home-zone`) or by the first node to take the write lock; `None` until then
    /// (placed as without zones' preference).
    #[serde(default)]
    pub home_zone: Option<String>,
    /// Copies kept in the home zone; `None` means min(2, copies). Fewer when the home
    /// zone has fewer up nodes.
    #[serde(default)]
    pub home_copies: Option<u8>,
}

impl VdiInfo {
    /// Replicas that must acknowledge a write: the VDI's setting, or `copies - 1` (at
    /// least 1), never more than `copies`.
    pub fn min_copies(&self) -> u8 {
        self.min_copies
            .unwrap_or(self.copies.saturating_sub(1).max(1))
            .clamp(1, self.copies.max(1))
    }

    /// Number of objects that cover the VDI.
    pub fn object_count(&self) -> u64 {
        self.size.div_ceil(u64::from(self.object_size))
    }

    /// The object holding byte `offset`.
    pub fn object_at(&self, offset: u64) -> ObjectId {
        ObjectId::new(self.id, (offset / u64::from(self.object_size)) as u32)
    }
}

/// Check a VDI name: 1..=128 characters of `[A-Za-z0-9._-]`, not starting with `.` or `-`.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "Bad VDI name '{name}': use 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
        )))
    }
}
