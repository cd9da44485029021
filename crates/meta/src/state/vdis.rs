//! The VDI table: creating a VDI, growing, renaming and choosing its min-copies,
//! with the checks of a VDI's shape (size, object size, copies). Snapshots, clones
//! and rollback are in `lineage.rs`, deletion in `delete.rs`, write policy and
//! access in `policy.rs`, the home zone in `home.rs`.
use super::{
    invalid, no_vdi, ApplyResult, MetaState, Reply, MAX_OBJECT_SIZE, MAX_VDI_SIZE, SECTOR_SIZE,
};
use drove_types::{
    validate_max_lag, validate_name, ErrorKind, ReplicationMode, VdiId, VdiInfo, WritePolicy,
    BLOCK_SIZE, MAX_COPIES,
};
use std::sync::Arc;

/// Check a VDI size against the sector size, the 1 PiB cap and the object count that
/// fits an object index (`u32`).
pub(super) fn check_size(size: u64, object_size: u32) -> Result<(), (ErrorKind, String)> {
    if size == 0 || !size.is_multiple_of(SECTOR_SIZE) {
        return Err(invalid(format!(
            "Bad VDI size {size}: use a non-zero multiple of {SECTOR_SIZE} bytes"
        )));
    }
    if size > MAX_VDI_SIZE {
        return Err(invalid(format!(
            "VDI size {size} is larger than the 1P limit"
        )));
    }
    if size.div_ceil(u64::from(object_size)) > u64::from(u32::MAX) + 1 {
        return Err(invalid(format!(
            "VDI size {size} needs more than 2^32 objects of {object_size} bytes: use larger objects"
        )));
    }
    Ok(())
}

pub(super) fn check_copies(copies: u8) -> Result<(), (ErrorKind, String)> {
    if copies == 0 || copies > MAX_COPIES {
        return Err(invalid(format!(
            "Bad copies {copies}: use 1 to {MAX_COPIES}"
        )));
    }
    Ok(())
}

impl MetaState {
    /// [`super::Command::ResizeVdi`]: grow only.
    pub(super) fn resize_vdi(&mut self, name: &str, size: u64) -> ApplyResult {
        let Some(vdi) = Arc::make_mut(&mut self.vdis).get_mut(name) else {
            return Err(no_vdi(name));
        };
        check_size(size, vdi.object_size)?;
        if size < vdi.size {
            return Err(invalid(format!(
                "VDI '{name}' is {} bytes: shrinking to {size} is not supported",
                vdi.size,
                name = drove_types::shown(name)
            )));
        }
        vdi.size = size;
        Ok(Reply::Vdi(vdi.clone()))
    }

    /// [`super::Command::GrowVdi`]: a resize to the size plus `by`.
    pub(super) fn grow_vdi(&mut self, name: &str, by: u64) -> ApplyResult {
        let Some(vdi) = self.vdis.get(name) else {
            return Err(no_vdi(name));
        };
        let Some(size) = vdi.size.checked_add(by) else {
            return Err(invalid(format!(
                "VDI '{name}' is {} bytes: {by} more is too large",
                vdi.size,
                name = drove_types::shown(name)
            )));
        };
        self.resize_vdi(name, size)
    }

    /// [`super::Command::SetMinCopies`].
    pub(super) fn set_min_copies(&mut self, name: &str, min_copies: Option<u8>) -> ApplyResult {
        let Some(vdi) = Arc::make_mut(&mut self.vdis).get_mut(name) else {
            return Err(no_vdi(name));
        };
        if let Some(m) = min_copies {
            if m == 0 || m > vdi.copies {
                return Err(invalid(format!(
                    "Bad min-copies {m} for VDI '{name}': use 1 to {}",
                    vdi.copies,
                    name = drove_types::shown(name)
                )));
            }
        }
        vdi.min_copies = min_copies;
        Ok(Reply::Vdi(vdi.clone()))
    }

    /// `Locked` while a writer's lease on VDI `id` runs at `now` (seconds).
    pub(super) fn refuse_if_written(
        &self,
        name: &str,
        id: VdiId,
        now: u64,
    ) -> Result<(), (ErrorKind, String)> {
        match self.locks.get(&id) {
            Some(lock) if lock.expires_ms > now.saturating_mul(1000) => Err((
                ErrorKind::Locked,
                format!(
                    "VDI '{name}' is in use (written through node {}); detach it first",
                    lock.owner,
                    name = drove_types::shown(name)
                ),
            )),
            _ => Ok(()),
        }
    }

    pub(super) fn rename_vdi(&mut self, name: &str, to: &str, now: u64) -> ApplyResult {
        validate_name(to).map_err(|e| invalid(e.message().to_string()))?;
        let Some(vdi) = self.vdis.get(name).filter(|_| !drove_types::is_kept(name)) else {
            return Err(no_vdi(name));
        };
        if name == to {
            return Ok(Reply::Vdi(vdi.clone()));
        }
        if self.vdis.contains_key(to) {
            return Err((
                ErrorKind::AlreadyExists,
                format!("VDI '{to}' already exists", to = drove_types::shown(to)),
            ));
        }
        self.refuse_if_written(name, vdi.id, now)?;
        let Some(mut vdi) = Arc::make_mut(&mut self.vdis).remove(name) else {
            return Err(no_vdi(name));
        };
        vdi.name = to.to_string();
        Arc::make_mut(&mut self.vdis).insert(to.to_string(), vdi.clone());
        Ok(Reply::Vdi(vdi))
    }

    pub(super) fn create_vdi(
        &mut self,
        name: &str,
        (size, object_size, copies, mode): (u64, u32, Option<u8>, ReplicationMode),
        created: u64,
        (home_zone, home_copies): (Option<String>, Option<u8>),
        (policy, max_lag_ms, max_lag_bytes): (WritePolicy, Option<u32>, Option<u64>),
        qos: &drove_types::Qos,
    ) -> ApplyResult {
        validate_name(name).map_err(|e| invalid(e.message().to_string()))?;
        qos.validate(true)
            .map_err(|e| invalid(e.message().to_string()))?;
        validate_max_lag(max_lag_ms, max_lag_bytes)
            .map_err(|e| invalid(e.message().to_string()))?;
        // After the limits' checks, as before: a command with two faults gets
        // the same refusal from every build.
        self.check_new_name(name)?;
        if !object_size.is_power_of_two()
            || u64::from(object_size) < BLOCK_SIZE
            || object_size > MAX_OBJECT_SIZE
        {
            return Err(invalid(format!(
                "Bad object size {object_size}: use a power of two from 4K to 1G"
            )));
        }
        check_size(size, object_size)?;
        let copies = copies.unwrap_or(self.settings.default_copies);
        check_copies(copies)?;
        // A witness holds no copy: it does not count.
        let up = self.map.up_nodes().filter(|n| !n.witness).count();
        if usize::from(copies) > up {
            return Err(invalid(format!(
                "copies={copies} needs at least {copies} nodes, the cluster has {up}{}",
                if self.map.nodes.values().any(|n| n.witness) {
                    " (witnesses hold no data)"
                } else {
                    ""
                }
            )));
        }
        if let Some(zone) = &home_zone {
            if !self
                .map
                .nodes
                .values()
                .any(|n| &n.zone == zone && !n.witness)
            {
                let mut zones: Vec<&str> = self
                    .map
                    .nodes
                    .values()
                    .filter(|n| !n.witness)
                    .map(|n| n.zone.as_str())
                    .collect();
                zones.sort_unstable();
                zones.dedup();
                let only_witness = self.map.nodes.values().any(|n| &n.zone == zone);
                return Err(invalid(if only_witness {
                    format!(
                        "Zone '{zone}' holds only a witness, which stores no data; the zones \
                         of data nodes are: {}",
                        zones.join(", ")
                    )
                } else {
                    format!(
                        "No node is in zone '{zone}'; the zones are: {}",
                        zones.join(", ")
                    )
                }));
            }
        }
        if let Some(h) = home_copies {
            if h == 0 || h > copies {
                return Err(invalid(format!(
                    "Bad home copies {h}: use 1 to copies ({copies})"
                )));
            }
        }
        let id = self.next_vdi_id;
        let Some(next) = id.checked_add(1) else {
            return Err((ErrorKind::NoSpace, "No VDI ids left".to_string()));
        };
        let info = VdiInfo {
            mode,
            created,
            home_zone,
            home_copies,
            policy,
            max_lag_ms,
            max_lag_bytes,
            qos: self.settings.default_qos.merged(qos),
            ..VdiInfo::new(VdiId(id), name, size, object_size, copies)
        };
        self.next_vdi_id = next;
        Arc::make_mut(&mut self.vdis).insert(name.to_string(), info.clone());
        Ok(Reply::Vdi(info))
    }
}
