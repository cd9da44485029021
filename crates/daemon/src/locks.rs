//! VDI write locks through the cluster metadata: the volume layer's [`LockService`]
//! implemented with Raft commands. The lease is stamped with this node's clock.
use async_trait::async_trait;
use drove_meta::{Command, MetaApi, Reply, VdiLock};
use drove_replica::{CheckReport, Recoverer};
use drove_types::clock::unix_ms as now_ms;
use drove_types::clock::Instant;
use drove_types::{Error, ErrorKind, Result, VdiId, VdiInfo};
use drove_volume::{Lease, LockService};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::settle::{renew_while_repairing, Settler};

/// Locks held by this node. A lock granted while an earlier holder's writes are
/// unsettled is handed out only once the replicas are made identical (see
/// [`crate::settle`]).
pub struct MetaLocks {
    meta: Arc<dyn MetaApi>,
    lease: Duration,
    settler: Arc<Settler>,
    holds: Mutex<Holds>,
}

/// What this node's volumes and repairs hold, checked and changed under one lock:
/// a grant or renewal is kept only if no repair started meanwhile, and a repair
/// starts only if no volume's lease may still be in use.
#[derive(Default)]
struct Holds {
    /// Until when (at least) a volume here may write under each lock it was
    /// granted or renewed.
    granted: HashMap<VdiId, Instant>,
    /// VDIs whose replicas `vdi check --repair` is making identical here, under
    /// the VDI's lock: no volume here is granted or renews it meanwhile.
    repairing: HashSet<VdiId>,
}

impl MetaLocks {
    /// Locks of `lease` through `meta`; a grant after an unsettled holder waits for
    /// `settler`'s repair.
    pub fn new(meta: Arc<dyn MetaApi>, lease: Duration, settler: Arc<Settler>) -> Arc<Self> {
        Arc::new(MetaLocks {
            meta,
            lease,
            settler,
            holds: Mutex::new(Holds::default()),
        })
    }

    fn repairing(vdi: &VdiInfo) -> Error {
        Error::new(
            ErrorKind::Locked,
            format!(
                "VDI '{}' is being repaired on this node (drove vdi check --repair); \
                 it can be written when the repair is done",
                vdi.name
            ),
        )
    }

    /// Keep a grant or renewal of `vdi`'s lock, answered for a lease of `lease`:
    /// false (not to be used) when a repair took the lock meanwhile.
    fn keep_grant(&self, vdi: &VdiInfo, lease: Duration) -> bool {
        let mut h = self.holds.lock();
        if h.repairing.contains(&vdi.id) {
            return false;
        }
        let until = Instant::now() + lease;
        let t = h.granted.entry(vdi.id).or_insert(until);
        *t = (*t).max(until);
        true
    }

    /// Take `vdi`'s lock for this node and settle an earlier holder's writes.
    async fn grant(&self, vdi: &VdiInfo) -> Result<VdiLock> {
        let reply = self
            .meta
            .execute(Command::AcquireLock {
                vdi: vdi.name.clone(),
                node: self.meta.node_id(),
                now_ms: now_ms(),
                lease_ms: self.lease.as_millis() as u64,
                incarnation: self.meta.incarnation(),
            })
            .await?;
        match reply {
            Reply::Lock(l) => {
                self.settler.after_grant(&l).await?;
                Ok(l)
            }
            other => Err(Error::new(
                ErrorKind::Io,
                format!("Unexpected reply to a lock request: {other:?}"),
            )),
        }
    }

    async fn release_lock(&self, vdi: &VdiInfo, generation: u64) -> Result<()> {
        self.meta
            .execute(Command::ReleaseLock {
                vdi: vdi.name.clone(),
                node: self.meta.node_id(),
                generation,
            })
            .await
            .map(|_| ())
    }

    /// `vdi check --repair`: compare `vdi`'s replicas and make those that differ
    /// identical, holding the VDI's write lock meanwhile (renewed while it runs),
    /// so that no client writes while copies are being replaced. Run without it,
    /// a write that reached a copy between the repair's fetch of another copy
    /// and its replacement of this one was lost on it, acknowledged.
    ///
    /// Refused while a client writes the VDI, here or on another node; a client
    /// that attaches meanwhile waits for the lock (and fails its writes if the
    /// repair outlasts its patience). The lock is released at the end when every
    /// differing object was made identical; else it is left to run out, so that
    /// the next writer repairs first.
    pub async fn check_and_repair(&self, r: &Recoverer, vdi: &VdiInfo) -> Result<CheckReport> {
        let written_through = |node: drove_types::NodeId| {
            Error::new(
                ErrorKind::Locked,
                format!(
                    "VDI '{}' is being written through node {node}: a repair would race its \
                     writes; detach it first",
                    vdi.name
                ),
            )
        };
        // A snapshot is never written: nothing races its repair.
        if vdi.snapshot {
            return r.check(vdi, true).await;
        }
        let state = self.meta.state();
        if let Some(l) = state.locks.get(&vdi.id) {
            if l.owner != self.meta.node_id() && l.expires_ms > now_ms() {
                return Err(written_through(l.owner));
            }
        }
        // Never locked, never written: copies cannot differ, and the first lock
        // would make this node's zone the VDI's home (the first writer's).
        if !state.lock_generations.contains_key(&vdi.id) {
            let report = r.check(vdi, false).await?;
            if report.mismatched.is_empty() {
                return Ok(report);
            }
        }
        drop(state);
        {
            let mut h = self.holds.lock();
            if h.repairing.contains(&vdi.id) {
                return Err(Self::repairing(vdi));
            }
            if h.granted.get(&vdi.id).is_some_and(|&t| t > Instant::now()) {
                return Err(written_through(self.meta.node_id()));
            }
            h.repairing.insert(vdi.id);
        }
        let _done = Repairing(self, vdi.id);
        // The metadata has the last word: another node may have taken the lock
        // since its record here was read.
        let lock = self.grant(vdi).await?;
        tracing::info!(vdi = %vdi.name, generation = lock.generation, "checking and repairing the replicas under the write lock");
        let report = tokio::select! {
            res = r.check(vdi, true) => res?,
            lost = renew_while_repairing(&*self.meta, &vdi.name, self.lease) => return Err(lost),
        };
        if report.mismatched.iter().all(|m| m.repaired) {
            if let Err(e) = self.release_lock(vdi, lock.generation).await {
                tracing::warn!(vdi = %vdi.name, "releasing the lock after the repair failed (it will expire): {e}");
            }
        } else {
            tracing::warn!(vdi = %vdi.name, "not every object was made identical: the lock is left to expire, and the next writer repairs first");
        }
        Ok(report)
    }
}

/// Ends a repair's hold on its VDI, however the repair ends.
struct Repairing<'a>(&'a MetaLocks, VdiId);

impl Drop for Repairing<'_> {
    fn drop(&mut self) {
        self.0.holds.lock().repairing.remove(&self.1);
    }
}

/// How long since this node last heard from a metadata majority a write waiting
/// for the lock still waits: the cluster's failure timeout (`drove cluster config
/// --down-after`, 5 s by default), at least [`drove_meta::QUORUM_FRESH`]. A
/// metadata as silent as a node the cluster does not call down yet is slow (a new
/// Raft term behind a 4 s fsync in the paper bench), not gone; a gateway cut off
/// for longer fails its writes.
pub(crate) fn majority_window(down_after_ms: u64) -> std::time::Duration {
    std::time::Duration::from_millis(down_after_ms).max(drove_meta::QUORUM_FRESH)
}

#[async_trait]
impl LockService for MetaLocks {
    fn majority_recent(&self) -> bool {
        let window = majority_window(self.meta.state().settings.down_after_ms);
        self.meta.quorum_age().is_some_and(|a| a < window)
    }

    async fn acquire(&self, vdi: &VdiInfo) -> Result<Lease> {
        if self.holds.lock().repairing.contains(&vdi.id) {
            return Err(Self::repairing(vdi));
        }
        let l = self.grant(vdi).await?;
        // A repair that began meanwhile was granted the same lock (this node's):
        // it is the repair's until it is done.
        if !self.keep_grant(vdi, self.lease) {
            return Err(Self::repairing(vdi));
        }
        // The grant carries the home zone (the first one sets it, a hand-over
        // to another zone or a promotion moves it).
        Ok(Lease {
            generation: l.generation,
            duration: self.lease,
            vdi: l.vdi,
            home_zone: l.home_zone,
        })
    }

    /// Renewed with the leader, without a log entry (see `drove_meta::Renew`). A
    /// lock the leader no longer finds held by this run answers `Locked`, and the
    /// volume stops writing.
    async fn renew(&self, vdi: &VdiInfo, generation: u64) -> Result<Lease> {
        let l = self
            .meta
            .renew_lock(drove_meta::Renew {
                vdi: vdi.name.clone(),
                node: self.meta.node_id(),
                incarnation: self.meta.incarnation(),
                generation,
                now_ms: now_ms(),
                lease_ms: self.lease.as_millis() as u64,
            })
            .await?;
        // Never longer than the leader granted (it caps a renewal at the lease the
        // lock was taken with).
        let granted = Duration::from_millis(l.lease_ms);
        let duration = if l.lease_ms == 0 {
            self.lease
        } else {
            self.lease.min(granted)
        };
        if !self.keep_grant(vdi, duration) {
            // Not `Locked`: that would retire the volume for good. Its lease runs
            // out (a repair starts only once it has), and a write then waits for
            // the lock.
            return Err(Error::unavailable(format!(
                "VDI '{}' is being repaired on this node: not renewed",
                vdi.name
            )));
        }
        Ok(Lease {
            generation: l.generation,
            duration,
            vdi: l.vdi,
            home_zone: l.home_zone,
        })
    }

    async fn release(&self, vdi: &VdiInfo, generation: u64) -> Result<()> {
        {
            let mut h = self.holds.lock();
            // A volume whose lease ran out gives up the generation the repair
            // was granted again (this node's): the repair ends it.
            if h.repairing.contains(&vdi.id) {
                return Err(Self::repairing(vdi));
            }
            h.granted.remove(&vdi.id);
        }
        self.release_lock(vdi, generation).await
    }

    async fn last_writer_gone(&self, vdi: &VdiInfo) -> Result<()> {
        tracing::info!(vdi = %vdi.name, "deleting the ephemeral clone: its last writer detached");
        self.meta
            .execute(Command::DeleteEphemeral {
                name: vdi.name.clone(),
                id: vdi.id,
            })
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod window_tests {
    use super::majority_window;
    use std::time::Duration;

    #[test]
    fn test_a_lock_wait_lasts_the_failure_timeout_and_at_least_3_s() {
        assert_eq!(majority_window(15_000), Duration::from_secs(15));
        assert_eq!(majority_window(5_000), Duration::from_secs(5));
        assert_eq!(majority_window(500), drove_meta::QUORUM_FRESH);
    }
}
