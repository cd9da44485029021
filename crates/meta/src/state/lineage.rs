//! Snapshots, clones and rollback in the VDI table. All of them are O(1): they
//! change records, never data.
//!
//! A snapshot freezes the VDI's current id (and so its objects) under the snapshot's
//! name, read-only, and gives the VDI's name a fresh id whose `parent` is the
//! snapshot. From then on the VDI is a copy-on-write child of the snapshot: objects it
//! has not written are read from the parent chain, and the first write to one copies
//! it up (the volume layer does that). A clone is the same thing under a new name.
//! Rollback gives the VDI a fresh, empty id whose parent is the snapshot; its old
//! id's objects become garbage that every node deletes (ids are never reused).
use drove_types::{validate_name, ErrorKind, NodeId, VdiId, VdiInfo};

use std::sync::Arc;

use super::{invalid, no_vdi, ApplyResult, MetaState, Reply};

impl MetaState {
    /// The next VDI id, or an error when they ran out.
    fn take_vdi_id(&mut self) -> Result<VdiId, (ErrorKind, String)> {
        let id = self.next_vdi_id;
        let Some(next) = id.checked_add(1) else {
            return Err((ErrorKind::NoSpace, "No VDI ids left".to_string()));
        };
        self.next_vdi_id = next;
        Ok(VdiId(id))
    }

    /// `name` is a valid name no VDI has.
    pub(super) fn check_new_name(&self, name: &str) -> Result<(), (ErrorKind, String)> {
        validate_name(name).map_err(|e| invalid(e.message().to_string()))?;
        if self.vdis.contains_key(name) {
            return Err((
                ErrorKind::AlreadyExists,
                format!(
                    "VDI '{name}' already exists",
                    name = drove_types::shown(name)
                ),
            ));
        }
        Ok(())
    }

    /// The VDIs whose parent is `id`, by name.
    pub fn children_of(&self, id: VdiId) -> Vec<String> {
        self.vdis
            .values()
            .filter(|v| v.parent == Some(id))
            .map(|v| v.name.clone())
            .collect()
    }

    /// The parents of `info`, nearest first.
    pub fn ancestors(&self, info: &VdiInfo) -> Vec<VdiInfo> {
        let mut out: Vec<VdiInfo> = Vec::new();
        let mut next = info.parent;
        while let Some(id) = next {
            // A cycle cannot be built by these commands; the bound is a guard anyway.
            if out.len() > self.vdis.len() {
                break;
            }
            let Some(p) = self.vdis.values().find(|v| v.id == id) else {
                break;
            };
            next = p.parent;
            out.push(p.clone());
        }
        out
    }

    /// Refuse to remove VDI `name` (id `id`) while clones read from it: `Invalid`,
    /// since what the request asks cannot be done while they do (`Locked` means
    /// that another node writes the VDI, and the delete waited for that lock to
    /// come free).
    pub(super) fn refuse_if_parent(
        &self,
        name: &str,
        id: VdiId,
    ) -> Result<(), (ErrorKind, String)> {
        let children = self.children_of(id);
        if children.is_empty() {
            return Ok(());
        }
        Err((
            ErrorKind::Invalid,
            format!(
                "VDI '{name}' has clones that read from it: {}. Delete them first, or flatten them (drove vdi delete {name} --flatten)",
                children.join(", "),
                name = drove_types::shown(name)
            ),
        ))
    }

    /// A lock on `id` whose lease still runs at `now_ms`, held by a node other than `by`.
    fn live_lock_of_other(&self, id: VdiId, by: Option<NodeId>, now_ms: u64) -> Option<NodeId> {
        self.locks
            .get(&id)
            .filter(|l| l.expires_ms > now_ms && Some(l.owner) != by)
            .map(|l| l.owner)
    }

    pub(super) fn snapshot_vdi(
        &mut self,
        name: &str,
        snap: &str,
        by: NodeId,
        now_ms: u64,
        now: u64,
    ) -> ApplyResult {
        let old = self.vdis.get(name).cloned().ok_or_else(|| no_vdi(name))?;
        if old.snapshot {
            return Err(invalid(format!(
                "'{name}' is a snapshot already (read-only); clone it to get a disk: drove vdi clone {name} NEW",
                name = drove_types::shown(name)
            )));
        }
        self.check_new_name(snap)?;
        if let Some(owner) = self.live_lock_of_other(old.id, Some(by), now_ms) {
            return Err((
                ErrorKind::Locked,
                format!(
                    "VDI '{name}' is being written through node {owner}: the snapshot must be taken there",
                    name = drove_types::shown(name)
                ),
            ));
        }
        let id = self.take_vdi_id()?;
        let frozen = VdiInfo {
            name: snap.to_string(),
            snapshot: true,
            ephemeral: false,
            created: now,
            ..old.clone()
        };
        let live = VdiInfo {
            id,
            parent: Some(old.id),
            ..old.clone()
        };
        // The writer keeps its lock (and generation) across the snapshot: it now
        // covers the new id.
        if let Some(mut lock) = self.locks.remove(&old.id) {
            lock.vdi = id;
            self.locks.insert(id, lock);
        }
        if let Some(&g) = self.lock_generations.get(&old.id) {
            self.lock_generations.insert(id, g);
        }
        if let Some(&s) = self.settled.get(&old.id) {
            self.settled.insert(id, s);
        }
        if let Some(b) = self.broken.remove(&old.id) {
            self.broken.insert(id, b);
        }
        Arc::make_mut(&mut self.vdis).insert(snap.to_string(), frozen);
        Arc::make_mut(&mut self.vdis).insert(name.to_string(), live.clone());
        Ok(Reply::Vdi(live))
    }

    pub(super) fn clone_vdi(
        &mut self,
        snap: &str,
        name: &str,
        ephemeral: bool,
        now: u64,
    ) -> ApplyResult {
        let parent = self
            .vdis
            .get(snap)
            .filter(|_| !drove_types::is_kept(snap))
            .cloned()
            .ok_or_else(|| no_vdi(snap))?;
        if !parent.snapshot {
            return Err(invalid(format!(
                "'{snap}' is not a snapshot, and a clone must read from a frozen image: take one first (drove vdi snapshot {snap} SNAP), then clone SNAP",
                snap = drove_types::shown(snap)
            )));
        }
        self.check_new_name(name)?;
        let id = self.take_vdi_id()?;
        let info = VdiInfo {
            id,
            name: name.to_string(),
            created: now,
            parent: Some(parent.id),
            snapshot: false,
            ephemeral,
            // A clone's own objects live where its first writer is (a golden image in
            // one datacenter serves VMs in all of them); reads of the snapshot's
            // objects go by the snapshot's home.
            home_zone: None,
            ..parent
        };
        Arc::make_mut(&mut self.vdis).insert(name.to_string(), info.clone());
        Ok(Reply::Vdi(info))
    }

    pub(super) fn clone_many(
        &mut self,
        snap: &str,
        names: &[String],
        ephemeral: bool,
        now: u64,
    ) -> ApplyResult {
        // Check everything first: an error must leave the table untouched.
        let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
        if distinct.len() != names.len() {
            return Err(invalid("The clone names repeat one another".to_string()));
        }
        for n in names {
            self.check_new_name(n)?;
        }
        if names.len() as u64 > u64::from(u32::MAX - self.next_vdi_id) {
            return Err((ErrorKind::NoSpace, "No VDI ids left".to_string()));
        }
        for n in names {
            self.clone_vdi(snap, n, ephemeral, now)?;
        }
        Ok(Reply::Done)
    }

    pub(super) fn rollback_vdi(&mut self, name: &str, snap: &str, now_ms: u64) -> ApplyResult {
        let old = self.vdis.get(name).cloned().ok_or_else(|| no_vdi(name))?;
        let target = self
            .vdis
            .get(snap)
            .filter(|_| !drove_types::is_kept(snap))
            .cloned()
            .ok_or_else(|| no_vdi(snap))?;
        if old.snapshot {
            return Err(invalid(format!(
                "'{name}' is a snapshot (read-only): roll back the VDI it was taken of",
                name = drove_types::shown(name)
            )));
        }
        if !self.ancestors(&old).iter().any(|a| a.id == target.id) {
            return Err(invalid(format!(
                "'{snap}' is not a snapshot of '{name}' (see drove vdi tree)",
                name = drove_types::shown(name),
                snap = drove_types::shown(snap)
            )));
        }
        if let Some(owner) = self.live_lock_of_other(old.id, None, now_ms) {
            return Err((
                ErrorKind::Locked,
                format!(
                    "VDI '{name}' is in use (written through node {owner}); detach it first",
                    name = drove_types::shown(name)
                ),
            ));
        }
        let id = self.take_vdi_id()?;
        let info = VdiInfo {
            id,
            size: target.size,
            parent: Some(target.id),
            ..old.clone()
        };
        self.locks.remove(&old.id);
        Arc::make_mut(&mut self.vdis).insert(name.to_string(), info.clone());
        self.prune_kept(old.parent);
        Ok(Reply::Vdi(info))
    }

    pub(super) fn flattened(&mut self, name: &str, id: VdiId) -> ApplyResult {
        let vdi = Arc::make_mut(&mut self.vdis)
            .get_mut(name)
            .ok_or_else(|| no_vdi(name))?;
        if vdi.id != id {
            return Err((
                ErrorKind::Unavailable,
                format!(
                    "VDI '{name}' changed (snapshot or rollback) while it was flattened; flatten it again",
                    name = drove_types::shown(name)
                ),
            ));
        }
        let parent = vdi.parent.take();
        let out = vdi.clone();
        self.prune_kept(parent);
        Ok(Reply::Vdi(out))
    }

    pub(super) fn delete_ephemeral(&mut self, name: &str, id: VdiId) -> ApplyResult {
        let Some(vdi) = self.vdis.get(name) else {
            return Ok(Reply::Done);
        };
        if vdi.id != id || !vdi.ephemeral || !self.children_of(id).is_empty() {
            return Ok(Reply::Done);
        }
        let parent = vdi.parent;
        Arc::make_mut(&mut self.vdis).remove(name);
        self.locks.remove(&id);
        self.prune_kept(parent);
        Ok(Reply::Done)
    }
}
