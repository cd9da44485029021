//! `drove vdi lock break`: an operator takes a VDI's write lock from a holder that
//! cannot give it back (a hung host, a gateway cut off from its clients), as
//! `rbd lock rm` with a blocklist does for Ceph.
//!
//! Fencing comes first and needs no message to the holder: the break hands out the
//! next lock generation to nobody, and replicas refuse writes carrying an older
//! generation than the newest handed out. A replica that admits a write of the next
//! holder (a newer generation still) has learnt the bar, so from then on it refuses
//! the old holder: no write of the old holder lands after one of the new holder's on
//! any replica. The old holder's writes that were in flight at the break may have
//! reached some replicas and not others; the next holder finds the VDI unsettled
//! (its predecessors' generations are not all settled) and makes the replicas
//! identical before serving it, as after a crash.
//!
//! The holder still renews its lease every third of it. Its next renewal must not
//! take the lock back, so its (node, run) is remembered until its old lease would
//! have ended and refused in that window: the renewal fails and the holder stops
//! writing. Its clients get errors; nothing it acknowledged before the break is lost.
use drove_types::{ErrorKind, NodeId, VdiId};

use super::{invalid, no_vdi, ApplyResult, BrokenLock, MetaState, Reply};

impl MetaState {
    /// Break `vdi`'s lock (see the module doc).
    pub(super) fn break_lock(&mut self, vdi: &str) -> ApplyResult {
        let v = self.vdis.get(vdi).ok_or_else(|| no_vdi(vdi))?;
        if v.snapshot {
            return Err(invalid(format!(
                "'{vdi}' is a snapshot: it is read-only and has no write lock",
                vdi = drove_types::shown(vdi)
            )));
        }
        let id = v.id;
        let Some(lock) = self.locks.remove(&id) else {
            return Ok(Reply::Done);
        };
        // The next generation goes to nobody: it fences the holder.
        let bar = self
            .lock_generations
            .get(&id)
            .copied()
            .unwrap_or(0)
            .max(lock.generation);
        self.lock_generations.insert(id, bar.saturating_add(1));
        self.broken.insert(
            id,
            BrokenLock {
                owner: lock.owner,
                incarnation: lock.incarnation,
                until_ms: lock.expires_ms,
            },
        );
        Ok(Reply::Lock(lock))
    }

    /// `Locked` for the holder whose lock of `vdi` (id `id`) was broken, while its old
    /// lease would still run at `now_ms`. The next grant forgets the break.
    pub(super) fn refuse_broken_holder(
        &self,
        vdi: &str,
        id: VdiId,
        node: NodeId,
        incarnation: u64,
        now_ms: u64,
    ) -> Result<(), (ErrorKind, String)> {
        let Some(b) = self.broken.get(&id) else {
            return Ok(());
        };
        if b.owner == node && b.incarnation == incarnation && now_ms < b.until_ms {
            return Err((
                ErrorKind::Locked,
                format!(
                    "VDI '{vdi}': the write lock of node {node} was broken by an operator \
                     (drove vdi lock break); its clients must attach again",
                    vdi = drove_types::shown(vdi)
                ),
            ));
        }
        Ok(())
    }
}
