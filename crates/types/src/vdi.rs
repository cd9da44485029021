//! The VDI record kept in the cluster metadata.
use crate::{Epoch, Error, ObjectId, Result, VdiId};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Object size of new VDIs: 4 MiB.
pub const DEFAULT_OBJECT_SIZE: u32 = 4 << 20;

/// Largest number of copies a VDI may ask for.
pub const MAX_COPIES: u8 = 5;

/// How a gateway sends a write to the replicas of an object. In JSON (the API, the
/// CLI's `--json`, the metadata on disk) as the CLI spells it, `direct` or
/// `primary-copy`; the capitalized names older versions wrote are still read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicationMode {
    /// The gateway sends to every replica in parallel.
    #[default]
    #[serde(alias = "Direct")]
    Direct,
    /// The gateway sends to the first replica, which forwards to the others.
    #[serde(alias = "PrimaryCopy")]
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

/// When a write is acknowledged, for a VDI with a home zone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WritePolicy {
    /// Every copy has the write before it is acknowledged.
    #[default]
    Sync,
    /// The copies in the home zone have it; the others are fed asynchronously, in
    /// write order per object, with a bounded lag ([`VdiInfo::max_lag`]).
    ZoneSync,
}

impl fmt::Display for WritePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WritePolicy::Sync => "sync",
            WritePolicy::ZoneSync => "zone-sync",
        })
    }
}

impl FromStr for WritePolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "sync" => Ok(WritePolicy::Sync),
            "zone-sync" => Ok(WritePolicy::ZoneSync),
            _ => Err(Error::invalid(format!(
                "Unknown write policy '{s}': use sync or zone-sync"
            ))),
        }
    }
}

/// Default bound on a zone-sync VDI's lag in time: 5 s.
pub const DEFAULT_MAX_LAG_MS: u32 = 5_000;
/// Default bound on a zone-sync VDI's lag in bytes: 256 MiB.
pub const DEFAULT_MAX_LAG_BYTES: u64 = 256 << 20;
/// Largest lag bound in time a VDI may set: 10 minutes.
pub const MAX_LAG_MS_LIMIT: u32 = 600_000;
/// Largest lag bound in bytes a VDI may set: 16 GiB (it is held in the writer's
/// memory).
pub const MAX_LAG_BYTES_LIMIT: u64 = 16 << 30;

/// Check lag bounds a request asks for: 1 ms..=10 min and 1 MiB..=16 GiB.
pub fn validate_max_lag(ms: Option<u32>, bytes: Option<u64>) -> Result<()> {
    if let Some(ms) = ms {
        if ms == 0 || ms > MAX_LAG_MS_LIMIT {
            return Err(Error::invalid(format!(
                "Bad lag bound {ms} ms: use 1 ms to {} s",
                MAX_LAG_MS_LIMIT / 1000
            )));
        }
    }
    if let Some(b) = bytes {
        if !(1 << 20..=MAX_LAG_BYTES_LIMIT).contains(&b) {
            return Err(Error::invalid(format!(
                "Bad lag bound {b} bytes: use 1 MiB to {} GiB",
                MAX_LAG_BYTES_LIMIT >> 30
            )));
        }
    }
    Ok(())
}

/// Most client names one VDI's NBD access list holds.
pub const MAX_NBD_CLIENTS: usize = 64;
/// Longest client name: X.509's upper bound on a common name.
pub const MAX_CLIENT_NAME: usize = 64;

/// Check an NBD access list ([`VdiInfo::nbd_clients`]): at most
/// [`MAX_NBD_CLIENTS`] names, each 1 to [`MAX_CLIENT_NAME`] bytes without control
/// characters, none twice.
pub fn validate_client_names(names: &[String]) -> Result<()> {
    if names.len() > MAX_NBD_CLIENTS {
        return Err(Error::invalid(format!(
            "At most {MAX_NBD_CLIENTS} client names per VDI, not {}",
            names.len()
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for n in names {
        if n.is_empty() || n.len() > MAX_CLIENT_NAME || n.chars().any(char::is_control) {
            return Err(Error::invalid(format!(
                "Bad client name '{}': 1 to {MAX_CLIENT_NAME} bytes without control \
                 characters (the common name of the client's certificate)",
                crate::shown(n)
            )));
        }
        if !seen.insert(n) {
            return Err(Error::invalid(format!(
                "Client name '{n}' is given twice",
                n = crate::shown(n)
            )));
        }
    }
    Ok(())
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
    /// When writes are acknowledged: `sync` (every copy) or `zone-sync` (the
    /// home-zone copies; the others follow within the lag bound).
    #[serde(default)]
    pub policy: WritePolicy,
    /// Zone-sync lag bound in milliseconds; `None` means [`DEFAULT_MAX_LAG_MS`].
    #[serde(default)]
    pub max_lag_ms: Option<u32>,
    /// Zone-sync lag bound in bytes; `None` means [`DEFAULT_MAX_LAG_BYTES`].
    #[serde(default)]
    pub max_lag_bytes: Option<u64>,
    /// The home zones this VDI had before its current one, oldest first: a hand-over
    /// to another zone or a promotion moves the home at a new map epoch, and the
    /// objects are placed by the home of the map's epoch ([`VdiInfo::home_at`]), so
    /// recovery can tell who held what before the move.
    #[serde(default)]
    pub past_homes: Vec<PastHome>,
    /// The clients allowed to attach this VDI over NBD on TCP, by the common name
    /// of their certificate (`drove vdi access`); empty: any client the port lets
    /// in. A plaintext TCP client has no name and is refused when the list is not
    /// empty. The unix socket is not concerned: its file permissions decide. Its
    /// snapshots and clones start with the same list.
    #[serde(default)]
    pub nbd_clients: Vec<String>,
    /// Limits on its clients' I/O ([`crate::Qos`], `drove vdi set --iops-limit`);
    /// unlimited by default and then not written out. Its snapshots and clones
    /// start with the same limits.
    #[serde(default, skip_serializing_if = "crate::Qos::is_unlimited")]
    pub qos: crate::Qos,
}

/// A home zone a VDI had for the maps of epochs before `until`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PastHome {
    /// The zone (`None`: the VDI had none).
    pub zone: Option<String>,
    /// The first epoch at which the next home applies.
    pub until: Epoch,
}

/// Most home moves a VDI record keeps (older ones are dropped with their epochs:
/// placement under maps that old is no longer asked for once recovery is done).
pub const MAX_PAST_HOMES: usize = 16;

impl VdiInfo {
    /// A VDI of its own (no parent, not a snapshot, not ephemeral): `copies` copies
    /// of objects of `object_size` bytes, the default replication mode and write
    /// policy, no home zone, no lag bounds, no NBD client names, created at 0. The
    /// metadata and tests start from it and set the rest with struct update syntax.
    pub fn new(
        id: VdiId,
        name: impl Into<String>,
        size: u64,
        object_size: u32,
        copies: u8,
    ) -> VdiInfo {
        VdiInfo {
            id,
            name: name.into(),
            size,
            object_size,
            copies,
            mode: ReplicationMode::default(),
            created: 0,
            min_copies: None,
            parent: None,
            snapshot: false,
            ephemeral: false,
            home_zone: None,
            home_copies: None,
            policy: WritePolicy::default(),
            max_lag_ms: None,
            max_lag_bytes: None,
            past_homes: Vec::new(),
            nbd_clients: Vec::new(),
            qos: crate::Qos::default(),
        }
    }

    /// Replicas that must acknowledge a write: the VDI's setting, or `copies - 1` (at
    /// least 1), never more than `copies`.
    pub fn min_copies(&self) -> u8 {
        self.min_copies
            .unwrap_or(self.copies.saturating_sub(1).max(1))
            .clamp(1, self.copies.max(1))
    }

    /// The zone-sync lag bounds: (time, bytes). At the bound, writers wait.
    pub fn max_lag(&self) -> (std::time::Duration, u64) {
        (
            std::time::Duration::from_millis(u64::from(
                self.max_lag_ms.unwrap_or(DEFAULT_MAX_LAG_MS),
            )),
            self.max_lag_bytes.unwrap_or(DEFAULT_MAX_LAG_BYTES),
        )
    }

    /// Whether writes are acknowledged by the home-zone copies alone (zone-sync with
    /// a home zone; a VDI without one writes every copy synchronously).
    pub fn zone_sync(&self) -> bool {
        self.policy == WritePolicy::ZoneSync && self.home_zone.is_some()
    }

    /// The home zone that places objects on the map of `epoch`: the one that was
    /// current then.
    pub fn home_at(&self, epoch: Epoch) -> Option<&str> {
        self.past_homes
            .iter()
            .find(|p| epoch < p.until)
            .map_or(self.home_zone.as_deref(), |p| p.zone.as_deref())
    }

    /// The home zone before the current one, if the home ever moved.
    pub fn previous_home(&self) -> Option<&PastHome> {
        self.past_homes.last()
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

/// What the name of a deleted snapshot that other VDIs still read from starts with:
/// its record is kept (under [`kept_name`]) for them, and its name is free again.
/// No VDI name a user gives can start with it ([`validate_name`] refuses a leading
/// `.`).
pub const KEPT_PREFIX: &str = ".deleted-";

/// The table key of deleted snapshot `name` (id `id`), kept for the VDIs that read
/// from it.
pub fn kept_name(id: VdiId, name: &str) -> String {
    format!("{KEPT_PREFIX}{}-{name}", id.0)
}

/// Whether `name` is the key of a deleted snapshot kept for its readers.
pub fn is_kept(name: &str) -> bool {
    name.starts_with(KEPT_PREFIX)
}

/// The name a kept snapshot had (`golden` for `.deleted-5-golden`).
pub fn kept_original(name: &str) -> Option<&str> {
    name.strip_prefix(KEPT_PREFIX)?
        .split_once('-')
        .map(|(_, n)| n)
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
            "Bad VDI name '{name}': use 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-'",
            name = crate::shown(name)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_kept_name_is_no_name_a_user_can_give() {
        let k = kept_name(VdiId(5), "golden");
        assert_eq!(k, ".deleted-5-golden");
        assert!(is_kept(&k) && validate_name(&k).is_err());
        assert_eq!(kept_original(&k), Some("golden"));
        assert_eq!(kept_original(&kept_name(VdiId(7), "a-b")), Some("a-b"));
        assert!(!is_kept("golden") && kept_original("golden").is_none());
    }
}
