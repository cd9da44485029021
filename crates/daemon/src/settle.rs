//! Making a VDI's replicas identical after a gateway died mid-write, before anyone
//! serves it again, and recording in the metadata that it was done.
//!
//! The metadata keeps, per VDI, the newest lock generation whose writes are known
//! identical on every replica (`MetaState::settled`): a holder that flushed and
//! released settles its own generation; one that crashed does not. A node granted
//! generation G while the writes of an earlier one are unsettled repairs before its
//! lease is used: it compares every object's replicas, makes the ones that differ
//! identical (`vdi check --repair`), then commits `MarkSettled`. The repair runs in a
//! task of its own, shared by everyone waiting for it, so the NBD handshake's
//! timeout or a write's patience running out does not cancel it (that once left a
//! node holding the lock with the repair skipped for good). If the repairing node
//! dies, the record stays unsettled and the next holder repairs from the start:
//! objects already identical are compared again and left alone.
use drove_meta::{Command, MetaApi, VdiLock};
use drove_replica::{Membership, Recoverer};
use drove_types::{Error, ErrorKind, NodeId, Result, VdiId, VdiInfo};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

use crate::membership::MetaMembership;
use drove_types::clock::unix_ms as now_ms;

type Outcome = Option<std::result::Result<(), (ErrorKind, String)>>;

/// Runs post-crash repairs, one per VDI and generation at a time.
pub struct Settler {
    meta: Arc<dyn MetaApi>,
    lease: Duration,
    recoverer: OnceLock<Arc<Recoverer>>,
    running: Mutex<HashMap<(VdiId, u64), watch::Receiver<Outcome>>>,
}

impl Settler {
    /// A settler committing through `meta`, renewing leases of `lease` while it
    /// repairs.
    pub fn new(meta: Arc<dyn MetaApi>, lease: Duration) -> Arc<Self> {
        Arc::new(Settler {
            meta,
            lease,
            recoverer: OnceLock::new(),
            running: Mutex::new(HashMap::new()),
        })
    }

    /// The engine that compares and repairs replicas (set once at start-up).
    pub fn set_recoverer(&self, r: Arc<Recoverer>) {
        let _ = self.recoverer.set(r);
    }

    /// Whether the writes of every generation before `lock`'s are settled.
    pub fn predecessors_settled(&self, lock: &VdiLock) -> bool {
        let state = self.meta.state();
        let settled = state.settled.get(&lock.vdi).copied().unwrap_or(0);
        settled.saturating_add(1) >= lock.generation
    }

    /// This node was granted `lock`: make the replicas identical first if an earlier
    /// holder's writes are not settled. Returns once the repair is recorded.
    pub async fn after_grant(self: &Arc<Self>, lock: &VdiLock) -> Result<()> {
        if self.predecessors_settled(lock) {
            return Ok(());
        }
        let key = (lock.vdi, lock.generation);
        let mut rx = {
            let mut running = self.running.lock();
            match running.get(&key) {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    running.insert(key, rx.clone());
                    let me = self.clone();
                    let lock = lock.clone();
                    tokio::spawn(async move {
                        let res = me.repair(&lock).await;
                        if let Err(e) = &res {
                            tracing::warn!(vdi = %lock.vdi, generation = lock.generation, "post-crash repair failed: {e}");
                        }
                        me.running.lock().remove(&(lock.vdi, lock.generation));
                        let _ = tx.send(Some(res.map_err(|e| (e.kind(), e.to_string()))));
                    });
                    rx
                }
            }
        };
        let done = rx
            .wait_for(|o| o.is_some())
            .await
            .map_err(|_| Error::unavailable("The post-crash repair task stopped"))?;
        match done.clone() {
            Some(Ok(())) => Ok(()),
            Some(Err((kind, msg))) => Err(Error::new(kind, msg)),
            None => Err(Error::unavailable("The post-crash repair task stopped")),
        }
    }

    /// The repair itself, under `lock`, renewing its lease meanwhile.
    async fn repair(&self, lock: &VdiLock) -> Result<()> {
        let info = self
            .meta
            .state()
            .vdis
            .values()
            .find(|v| v.id == lock.vdi)
            .cloned()
            .ok_or_else(|| {
                Error::new(ErrorKind::Gone, format!("VDI id {} was deleted", lock.vdi))
            })?;
        let r = self
            .recoverer
            .get()
            .ok_or_else(|| Error::unavailable("This node cannot repair replicas yet"))?;
        tracing::info!(vdi = %info.name, generation = lock.generation, "an earlier writer stopped without settling its writes: making the replicas identical");
        // The lease must not run out under the repair: another node could then take
        // the VDI and write while replicas are being replaced.
        tokio::select! {
            res = self.check_and_repair(r, &info) => res?,
            lost = renew_while_repairing(&*self.meta, &info.name, self.lease) => return Err(lost),
        }
        self.meta
            .execute(Command::MarkSettled {
                vdi: lock.vdi,
                node: self.meta.node_id(),
                generation: lock.generation,
            })
            .await?;
        Ok(())
    }

    async fn check_and_repair(&self, r: &Recoverer, info: &VdiInfo) -> Result<()> {
        // The map the check is judged on: a verdict made on it is refused if this
        // node was marked down since (see `MetaMembership`).
        let seen = self.meta.state().map.epoch;
        let report = r.check(info, true).await?;
        // Replicas that did not answer were not repaired: mark them down, so they
        // recover every copy before serving again.
        let silent: BTreeSet<NodeId> = report
            .mismatched
            .iter()
            .flat_map(|m| {
                m.replicas
                    .iter()
                    .filter(|v| v.digest.is_none())
                    .map(|v| v.node)
            })
            .collect();
        if !silent.is_empty() {
            let why = format!("did not answer the post-crash check of VDI '{}'", info.name);
            MetaMembership(self.meta.clone())
                .mark_down(silent.into_iter().collect(), why, false, seen)
                .await?;
        }
        let fixed = report.mismatched.iter().filter(|m| m.repaired).count();
        tracing::info!(
            vdi = %info.name, objects = report.objects, differing = report.mismatched.len(),
            repaired = fixed, "replicas made identical after the previous gateway stopped"
        );
        if fixed < report.mismatched.len() {
            return Err(Error::unavailable(format!(
                "VDI '{}': {} objects have replicas that could not be made identical",
                info.name,
                report.mismatched.len() - fixed
            )));
        }
        Ok(())
    }
}

/// Renew this node's lease on `vdi` every third of it; returns (the error to stop
/// the repair with) once the lease may have run out without a renewal.
pub(crate) async fn renew_while_repairing(meta: &dyn MetaApi, vdi: &str, lease: Duration) -> Error {
    let mut valid_until = tokio::time::Instant::now() + lease;
    loop {
        tokio::time::sleep(lease / 3).await;
        let asked = tokio::time::Instant::now();
        let cmd = Command::AcquireLock {
            vdi: vdi.to_string(),
            node: meta.node_id(),
            now_ms: now_ms(),
            lease_ms: lease.as_millis() as u64,
            incarnation: meta.incarnation(),
        };
        match tokio::time::timeout_at(valid_until, meta.execute(cmd)).await {
            Ok(Ok(_)) => valid_until = asked + lease,
            Ok(Err(e))
                if !matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::OutcomeUnknown) =>
            {
                return Error::new(
                    e.kind(),
                    format!(
                        "VDI '{vdi}': the lock was lost during the post-crash repair: {e}",
                        vdi = drove_types::shown(vdi)
                    ),
                )
            }
            Ok(Err(e)) => tracing::warn!(%vdi, "cannot renew the lease during the post-crash repair: {e}"),
            Err(_) => {
                return Error::unavailable(format!(
                    "VDI '{vdi}': the lease ran out during the post-crash repair (metadata unreachable?)",
                    vdi = drove_types::shown(vdi)
                ))
            }
        }
        if tokio::time::Instant::now() >= valid_until {
            return Error::unavailable(format!(
                "VDI '{vdi}': the lease ran out during the post-crash repair",
                vdi = drove_types::shown(vdi)
            ));
        }
    }
}
