//! Deleting a VDI. A snapshot that other VDIs still read from (the disk it was
//! taken of, which goes on as its copy-on-write child, or clones) is deleted the
//! way `rbd snap rm` or ZFS's deferred destroy do it, without copying data: its
//! name goes (and may be reused at once), and its record stays in the table under
//! a key no user can name ([`drove_types::kept_name`]), so that the VDIs reading
//! through it go on finding its objects. It is dropped, and its objects become
//! garbage, once nothing reads from it any more (the readers deleted, flattened or
//! rolled back past it). `drove vdi delete --flatten` still copies its data into
//! the readers instead, freeing its blocks at once.
use drove_types::{is_kept, kept_name, VdiId, VdiInfo};
use std::sync::Arc;

use super::{no_vdi, ApplyResult, MetaState, Reply};

impl MetaState {
    /// [`super::Command::DeleteVdi`]: `force` deletes even while a writer's lease
    /// runs; `now` in seconds.
    pub(super) fn delete_vdi(&mut self, name: &str, force: bool, now: u64) -> ApplyResult {
        if is_kept(name) {
            return Err(no_vdi(name));
        }
        let vdi = self.vdis.get(name).cloned().ok_or_else(|| no_vdi(name))?;
        let readers = self.children_of(vdi.id);
        if !readers.is_empty() {
            // Only snapshots have readers; anything else keeps the old refusal.
            if !vdi.snapshot {
                self.refuse_if_parent(name, vdi.id)?;
            }
            let key = kept_name(vdi.id, name);
            let vdis = Arc::make_mut(&mut self.vdis);
            vdis.remove(name);
            vdis.insert(key.clone(), VdiInfo { name: key, ..vdi });
            let mut shown: Vec<String> = readers.into_iter().filter(|r| !is_kept(r)).collect();
            shown.sort();
            return Ok(Reply::Kept(shown));
        }
        if !force {
            self.refuse_if_written(name, vdi.id, now)?;
        }
        Arc::make_mut(&mut self.vdis).remove(name);
        self.locks.remove(&vdi.id);
        self.broken.remove(&vdi.id);
        self.prune_kept(vdi.parent);
        Ok(Reply::Done)
    }

    /// Drop the kept snapshots nothing reads from any more, from `id` up its
    /// parents: their objects become garbage that every node deletes.
    pub(super) fn prune_kept(&mut self, mut next: Option<VdiId>) {
        while let Some(id) = next {
            let Some((key, parent)) = self
                .vdis
                .iter()
                .find(|(_, v)| v.id == id)
                .map(|(k, v)| (k.clone(), v.parent))
            else {
                return;
            };
            if !is_kept(&key) || !self.children_of(id).is_empty() {
                return;
            }
            Arc::make_mut(&mut self.vdis).remove(&key);
            next = parent;
        }
    }
}
