//! VDI write locks through the cluster metadata: the volume layer's [`LockService`]
//! implemented with Raft commands. The lease is stamped with this node's clock.
use async_trait::async_trait;
use drove_meta::{Command, MetaApi, Reply};
use drove_types::clock::unix_ms as now_ms;
use drove_types::{Error, ErrorKind, Result, VdiInfo};
use drove_volume::{Lease, LockService};
use std::sync::Arc;
use std::time::Duration;

use crate::settle::Settler;

/// Locks held by this node. A lock granted while an earlier holder's writes are
/// unsettled is handed out only once the replicas are made identical (see
/// [`crate::settle`]).
pub struct MetaLocks {
    meta: Arc<dyn MetaApi>,
    lease: Duration,
    settler: Arc<Settler>,
}

impl MetaLocks {
    /// Locks of `lease` through `meta`; a grant after an unsettled holder waits for
    /// `settler`'s repair.
    pub fn new(meta: Arc<dyn MetaApi>, lease: Duration, settler: Arc<Settler>) -> Arc<Self> {
        Arc::new(MetaLocks {
            meta,
            lease,
            settler,
        })
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
                // The grant carries the home zone (the first one sets it, a hand-over
                // to another zone or a promotion moves it).
                Ok(Lease {
                    generation: l.generation,
                    duration: self.lease,
                    vdi: l.vdi,
                    home_zone: l.home_zone,
                })
            }
            other => Err(Error::new(
                ErrorKind::Io,
                format!("Unexpected reply to a lock request: {other:?}"),
            )),
        }
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
        Ok(Lease {
            generation: l.generation,
            duration: if l.lease_ms == 0 {
                self.lease
            } else {
                self.lease.min(granted)
            },
            vdi: l.vdi,
            home_zone: l.home_zone,
        })
    }

    async fn release(&self, vdi: &VdiInfo, generation: u64) -> Result<()> {
        self.meta
            .execute(Command::ReleaseLock {
                vdi: vdi.name.clone(),
                node: self.meta.node_id(),
                generation,
            })
            .await
            .map(|_| ())
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
