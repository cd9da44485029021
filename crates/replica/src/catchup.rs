//! Which of this node's object copies are known to be current, and the epoch the node
//! has caught up with. This is what keeps a node that missed writes from serving them:
//!
//! - A copy is *pending* while it may lack acknowledged writes: the node gained the
//!   object in a new epoch, or the node itself was down (a gateway acknowledged writes
//!   without it, which it may only do after the node is marked down), or it just
//!   started and the epoch moved while it was away. Reads of a pending copy are
//!   refused (`StaleEpoch`, so the gateway reads another replica); a write to one
//!   first recovers the object ([`Repair`]).
//! - Writes carry the gateway's epoch. A write from an older epoch is refused with
//!   `StaleEpoch` (the gateway retries on the newer map); one from a newer epoch waits
//!   until this node has worked out its pending set for that epoch.
//! - Per-object locks order writes against recovery copies: writes hold an object
//!   shared, a copy (in or out) exclusively. So a copy served to a recovering node
//!   contains every write this node admitted before it, and writes admitted after
//!   carry the newer epoch and also reach the recovering node.
//!
//! The last epoch at which nothing held here was pending is persisted
//! (`DATA/recovery.json`): a node restarted before the epoch moved is current at once,
//! but only on the host boot that recorded it. Copies are written without fsync, so a
//! host that lost power (or crashed) lost what the node had not flushed: a node whose
//! host booted since its clean epoch was recorded compares every copy it holds with
//! the others before serving it, as after an absence. A node killed on a host that
//! kept running kept its page cache, and its clean epoch stands.
use drove_types::{Epoch, Error, ErrorKind, NodeId, ObjectId, Result};
use futures::future::BoxFuture;
use parking_lot::{Mutex, MutexGuard};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::{watch, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// How long a request from a newer epoch waits for this node to catch up with it.
pub const EPOCH_WAIT: Duration = Duration::from_secs(5);

const STRIPES: usize = 256;

/// Recovers one object here from a current copy elsewhere (implemented by the
/// [`crate::Recoverer`]); the write path calls it for a pending object.
pub trait Repair: Send + Sync {
    /// Make this node's copy of `oid` current.
    fn repair(&self, oid: ObjectId) -> BoxFuture<'_, Result<()>>;

    /// Replace this node's copy of `oid` (`len` bytes) with node `from`'s; from this
    /// node itself, make its copy current as recovery would (it may wait or copy).
    fn repair_from(&self, oid: ObjectId, len: u32, from: NodeId) -> BoxFuture<'_, Result<()>>;

    /// For an object this node has no copy of and does not count pending: whether
    /// it knows there is nothing to have (see `View::absence_unsure`). A node counts an object it gains pending
    /// only when an up node listed a copy; a copy held only by nodes that are down
    /// was never listed, and the object would read as zeros here and take writes
    /// over nothing (found by `drove sim faults --seed 2 --faults cut`: every
    /// copy of an object went to nodes that had none while its holders were marked
    /// down; the writes made there then replaced the holders' copies).
    ///
    /// Judged on the map of `epoch` only: a node whose view has moved on says
    /// nothing (false). Its word on a later map, where it may not be placed on the
    /// object at all, once answered a read made on the earlier one with zeros
    /// (`drove sim faults --seed 121 --time 40s`, with the history trimmed).
    fn absence_known(&self, oid: ObjectId, epoch: Epoch) -> bool;

    /// Make sure of an absence [`Repair::absence_known`] does not know, for a
    /// request made on the map of `epoch`: recover the object (which waits for
    /// the down holders when no up node's copy is known current). `StaleEpoch`
    /// when this node's view has moved past `epoch`: the asker goes again on the
    /// newer map.
    fn confirm_absent(&self, oid: ObjectId, epoch: Epoch) -> BoxFuture<'_, Result<()>>;
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Persisted {
    clean_epoch: u64,
    /// The host's boot the clean epoch was recorded in (Linux's boot id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    boot: Option<String>,
}

/// This host's boot id (`/proc/sys/kernel/random/boot_id`): it changes at every
/// boot, so a node tells a restart of its process from one of its host.
pub fn host_boot_id() -> Option<String> {
    // The real power-loss test (crates/cli/tests/e2e_power_loss.rs) cuts the power
    // of its nodes on a running host: it names a new boot for each restart, as a
    // host that lost power would have.
    if let Some(id) = std::env::var("DROVE_TEST_BOOT_ID")
        .ok()
        .filter(|s| !s.is_empty())
    {
        return Some(id);
    }
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_string()).filter(|s| !s.is_empty())
}

/// Where the node's catch-up state is kept across restarts: `DATA/recovery.json`
/// ([`FileRecord`]), or the simulator's disk.
pub trait Record: Send + Sync {
    /// What was last saved, if anything (or if it can be read).
    fn load(&self) -> Option<Vec<u8>>;
    /// Replace it with `bytes`, durably: it survives a power loss once this
    /// returns `Ok`.
    fn save(&self, bytes: &[u8]) -> std::io::Result<()>;
}

/// A [`Record`] in a file, replaced with
/// [`drove_types::private_fs::replace_durably`] (its user's only, as everything in
/// the data directory).
pub struct FileRecord(pub PathBuf);

impl Record for FileRecord {
    fn load(&self) -> Option<Vec<u8>> {
        std::fs::read(&self.0).ok()
    }

    fn save(&self, bytes: &[u8]) -> std::io::Result<()> {
        drove_types::private_fs::replace_durably(&self.0, bytes)
    }
}

struct Inner {
    /// The epoch whose pending set is installed.
    epoch: Epoch,
    /// Copies here that may lack acknowledged writes.
    pending: HashSet<ObjectId>,
    /// Before the first pending set is installed, nothing is known to be current.
    unknown: bool,
    /// The last epoch at which nothing held here was pending.
    clean_epoch: Epoch,
    /// The host booted since the record was written and this run has not been
    /// clean yet: writes this node took before that boot and had not flushed
    /// may be gone from its copies ([`CatchUp::lost_unflushed`]).
    lost_unflushed: bool,
    /// Copies held here when the host booted (a power loss) and not made current
    /// since: each may still be as the power loss left it (unflushed writes gone,
    /// a block torn) after the node is clean again, for a clean epoch covers only
    /// the copies placed here. A copy the object moved away from stays as it was,
    /// and is asked for as the witness of the epochs it was placed at (`drove sim
    /// faults --meta raft --seed 8017 --time 20s`: node 7, clean again, no longer
    /// sealed its torn leftover, the only copy of its version, and recovery waited
    /// for it for ever). [`CatchUp::lost_unflushed_in`].
    since_boot: HashSet<ObjectId>,
}

/// The catch-up state of this node's store.
pub struct CatchUp {
    inner: Mutex<Inner>,
    epoch_tx: watch::Sender<Epoch>,
    stripes: Vec<std::sync::Arc<RwLock<()>>>,
    record: Option<Box<dyn Record>>,
    /// The host's boot this run started in.
    boot: Option<String>,
    /// False for a store without recovery: every epoch is admitted.
    gated: bool,
}

impl CatchUp {
    /// State persisted at `path` (none: in memory only, for tests). Nothing is
    /// current until [`CatchUp::install`] runs.
    pub fn open(path: Option<PathBuf>) -> CatchUp {
        CatchUp::with_record(
            path.map(|p| Box::new(FileRecord(p)) as Box<dyn Record>),
            None,
        )
    }

    /// State persisted in `record` (none: in memory only), on a host in boot
    /// `boot` ([`host_boot_id`]; `None`: unknown, the record is trusted as it is).
    /// A clean epoch recorded in another boot is not trusted (see the module
    /// doc). Nothing is current until [`CatchUp::install`] runs.
    pub fn with_record(record: Option<Box<dyn Record>>, boot: Option<String>) -> CatchUp {
        let was = record
            .as_ref()
            .and_then(|r| r.load())
            .and_then(|b| serde_json::from_slice::<Persisted>(&b).ok())
            .unwrap_or_default();
        let rebooted = boot.is_some() && was.boot != boot;
        let clean = if rebooted && was.clean_epoch > 0 {
            tracing::warn!(
                clean_epoch = was.clean_epoch,
                "the host booted since this node recorded its clean epoch: what it had not \
                 flushed may be lost, so every copy it holds is compared with the others \
                 before it serves"
            );
            0
        } else {
            was.clean_epoch
        };
        let (epoch_tx, _) = watch::channel(Epoch(0));
        CatchUp {
            inner: Mutex::new(Inner {
                epoch: Epoch(0),
                pending: HashSet::new(),
                unknown: true,
                clean_epoch: Epoch(clean),
                lost_unflushed: rebooted,
                since_boot: HashSet::new(),
            }),
            epoch_tx,
            stripes: (0..STRIPES)
                .map(|_| std::sync::Arc::new(RwLock::new(())))
                .collect(),
            record,
            boot,
            gated: true,
        }
    }

    /// Everything current, every epoch admitted: a store without recovery (tests of
    /// the replication layer alone).
    pub fn all_current() -> CatchUp {
        let mut c = CatchUp::open(None);
        c.gated = false;
        c.install(Epoch(0), HashSet::new());
        c
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// The epoch this node has caught up with.
    pub fn epoch(&self) -> Epoch {
        self.lock().epoch
    }

    /// The persisted last epoch at which nothing here was pending.
    pub fn clean_epoch(&self) -> Epoch {
        self.lock().clean_epoch
    }

    /// Whether the first pending set was installed.
    pub fn known(&self) -> bool {
        !self.lock().unknown
    }

    /// Install the pending set of `epoch` and wake requests waiting for it.
    pub fn install(&self, epoch: Epoch, pending: HashSet<ObjectId>) {
        {
            let mut g = self.lock();
            if g.unknown && g.lost_unflushed {
                // The first pending set after the host booted holds every copy
                // here that the node's own listing named (recovery counts them all
                // pending, its clean epoch being 0; a listing that failed names
                // none, and those copies are neither pending nor unsure: a known
                // gap). It may be every object on the node: kept until each is
                // made current.
                g.since_boot = pending.clone();
            }
            g.epoch = epoch;
            g.pending = pending;
            g.unknown = false;
        }
        self.epoch_tx.send_replace(epoch);
    }

    /// Whether this node's copy of `oid` is known to hold every acknowledged write.
    pub fn is_current(&self, oid: ObjectId) -> bool {
        let g = self.lock();
        !g.unknown && !g.pending.contains(&oid)
    }

    /// Mark `oid` pending (a scrub found it corrupt, a check found it different).
    pub fn mark_pending(&self, oid: ObjectId) {
        self.lock().pending.insert(oid);
    }

    /// Mark `oid` current after a copy.
    pub fn mark_current(&self, oid: ObjectId) {
        let mut g = self.lock();
        g.pending.remove(&oid);
        g.since_boot.remove(&oid);
    }

    /// The pending copies.
    pub fn pending(&self) -> Vec<ObjectId> {
        let mut v: Vec<ObjectId> = self.lock().pending.iter().copied().collect();
        v.sort();
        v
    }

    /// Record that nothing held at `epoch` is pending, on disk first.
    pub fn set_clean(&self, epoch: Epoch) -> Result<()> {
        if let Some(r) = &self.record {
            // While copies held since the host's power loss are still unsure, the
            // record names no boot: a restart of the process in this boot is then
            // taken as the power loss it follows, and compares every copy again,
            // rather than trusting them all (the set is in memory only).
            let boot = match self.lock().since_boot.is_empty() {
                true => self.boot.clone(),
                false => None,
            };
            let body = serde_json::to_vec(&Persisted {
                clean_epoch: epoch.0,
                boot,
            })
            .map_err(|e| Error::new(ErrorKind::Io, format!("encode recovery state: {e}")))?;
            r.save(&body)
                .map_err(|e| Error::io("Cannot write the recovery record", e))?;
        }
        let mut inner = self.lock();
        inner.clean_epoch = epoch;
        inner.lost_unflushed = false;
        Ok(())
    }

    /// Whether writes this node took before its host's last boot and had not
    /// flushed may be gone from its copies: the host booted since the recovery
    /// record was written (a power loss), and the node has not been clean since.
    /// Such a node's own copy then answers for no epoch's writes in recovery: it
    /// took them, but may have lost them (`drove sim faults --seed 205`).
    pub fn lost_unflushed(&self) -> bool {
        self.lock().lost_unflushed
    }

    /// Whether this node's copy of `oid` may lack writes it had not flushed before
    /// its host's last boot: the node has not been clean since that boot
    /// ([`CatchUp::lost_unflushed`]), or the copy was held then and has not been
    /// made current since (a copy no longer placed here stays as it was).
    pub fn lost_unflushed_in(&self, oid: ObjectId) -> bool {
        let g = self.lock();
        g.lost_unflushed || g.since_boot.contains(&oid)
    }

    /// Wait until this node has caught up with `epoch` (bounded by [`EPOCH_WAIT`]);
    /// then refuse a request from an older epoch when `refuse_older`.
    pub async fn admit_epoch(&self, epoch: Epoch, refuse_older: bool) -> Result<()> {
        if !self.gated {
            return Ok(());
        }
        let mut rx = self.epoch_tx.subscribe();
        let known = self.known();
        if !known || *rx.borrow() < epoch {
            let wait = rx.wait_for(|e| *e >= epoch && self.known());
            match tokio::time::timeout(EPOCH_WAIT, wait).await {
                Ok(Ok(_)) => {}
                _ => {
                    return Err(Error::unavailable(format!(
                        "This node has not caught up with epoch {epoch} yet"
                    )))
                }
            }
        }
        let mine = self.epoch();
        if refuse_older && epoch < mine {
            return Err(Error::new(
                ErrorKind::StaleEpoch,
                format!("Request from epoch {epoch}; this node is at epoch {mine}"),
            ));
        }
        Ok(())
    }

    fn stripe(&self, oid: ObjectId) -> std::sync::Arc<RwLock<()>> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        oid.hash(&mut h);
        self.stripes[(h.finish() as usize) % STRIPES].clone()
    }

    /// Hold `oid` for a write (shared with other writes).
    pub async fn write_lock(&self, oid: ObjectId) -> OwnedRwLockReadGuard<()> {
        self.stripe(oid).read_owned().await
    }

    /// Hold `oid` for a copy in or out (no write in flight meanwhile).
    pub async fn copy_lock(&self, oid: ObjectId) -> OwnedRwLockWriteGuard<()> {
        self.stripe(oid).write_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::VdiId;

    #[tokio::test]
    async fn test_pending_copies_are_not_current_and_epochs_gate_requests() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("recovery.json");
        let c = CatchUp::open(Some(path.clone()));
        let o = ObjectId::new(VdiId(1), 0);
        // Nothing is current before the first install.
        assert!(!c.is_current(o));
        c.install(Epoch(3), [o].into_iter().collect());
        assert!(!c.is_current(o));
        assert!(c.is_current(ObjectId::new(VdiId(1), 1)));
        c.mark_current(o);
        assert!(c.is_current(o));
        // Older epochs are refused for writes, allowed otherwise; newer ones wait.
        let e = c.admit_epoch(Epoch(2), true).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::StaleEpoch);
        c.admit_epoch(Epoch(2), false).await.unwrap();
        c.admit_epoch(Epoch(3), true).await.unwrap();
        let waiter = c.admit_epoch(Epoch(4), true);
        let install = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            c.install(Epoch(4), HashSet::new());
        };
        let (r, ()) = tokio::join!(waiter, install);
        r.unwrap();
        // The clean epoch survives a restart.
        c.set_clean(Epoch(4)).unwrap();
        assert_eq!(CatchUp::open(Some(path.clone())).clean_epoch(), Epoch(4));
        // The file is its user's only, whatever the umask.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600, "recovery.json is {mode:o}");
    }

    #[test]
    fn test_a_clean_epoch_recorded_in_another_boot_of_the_host_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("recovery.json");
        let file = || Some(Box::new(FileRecord(path.clone())) as Box<dyn Record>);
        let boot = |b: &str| Some(b.to_string());
        CatchUp::with_record(file(), boot("a"))
            .set_clean(Epoch(7))
            .unwrap();
        // The process restarted, the host did not: its page cache kept every write.
        assert_eq!(
            CatchUp::with_record(file(), boot("a")).clean_epoch(),
            Epoch(7)
        );
        assert!(!CatchUp::with_record(file(), boot("a")).lost_unflushed());
        // The host booted since (a power loss): what was not flushed is gone.
        let after = CatchUp::with_record(file(), boot("b"));
        assert_eq!(after.clean_epoch(), Epoch(0));
        assert!(after.lost_unflushed(), "its own copies vouch for nothing");
        // Clean again in this boot: its copies were recovered and flushed.
        after.set_clean(Epoch(9)).unwrap();
        assert!(!after.lost_unflushed());
        // A record without a boot (written before boots were recorded) is not
        // trusted on a host that knows its boot; an unknown boot trusts it.
        std::fs::write(&path, br#"{"clean_epoch":5}"#).unwrap();
        assert_eq!(
            CatchUp::with_record(file(), boot("a")).clean_epoch(),
            Epoch(0)
        );
        assert_eq!(CatchUp::with_record(file(), None).clean_epoch(), Epoch(5));
    }

    /// A copy held when the host booted stays unsure until it is made current,
    /// even once the node is clean again (a copy no longer placed here: seed 8017);
    /// a copy made current, or any copy on a host that did not boot, is sure.
    #[test]
    fn test_a_copy_held_since_a_power_loss_stays_unsure_until_it_is_made_current() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("recovery.json");
        let file = || Some(Box::new(FileRecord(path.clone())) as Box<dyn Record>);
        let boot = |b: &str| Some(b.to_string());
        let (a, b) = (
            ObjectId::from_u64(0x1_0000_0001),
            ObjectId::from_u64(0x1_0000_0002),
        );
        CatchUp::with_record(file(), boot("a"))
            .set_clean(Epoch(7))
            .unwrap();
        let after = CatchUp::with_record(file(), boot("b"));
        after.install(Epoch(8), [a, b].into_iter().collect());
        assert!(after.lost_unflushed_in(a) && after.lost_unflushed_in(b));
        after.mark_current(a);
        after.set_clean(Epoch(8)).unwrap();
        assert!(!after.lost_unflushed());
        assert!(!after.lost_unflushed_in(a));
        assert!(after.lost_unflushed_in(b), "b is as the power loss left it");
        after.mark_current(b);
        assert!(!after.lost_unflushed_in(b));
        // A restart in the same boot while a copy was still unsure is taken as the
        // power loss it follows.
        let again = CatchUp::with_record(file(), boot("c"));
        again.install(Epoch(9), [a, b].into_iter().collect());
        again.mark_current(a);
        again.set_clean(Epoch(9)).unwrap();
        assert!(again.lost_unflushed_in(b));
        let restarted = CatchUp::with_record(file(), boot("c"));
        assert!(
            restarted.lost_unflushed(),
            "b was unsure when the process stopped"
        );
        restarted.install(Epoch(10), [a, b].into_iter().collect());
        assert!(restarted.lost_unflushed_in(b));
        restarted.mark_current(a);
        restarted.mark_current(b);
        restarted.set_clean(Epoch(10)).unwrap();
        // The same boot, every copy current at the last clean epoch: nothing was
        // lost, nothing is unsure.
        let same = CatchUp::with_record(file(), boot("c"));
        same.install(Epoch(9), [a, b].into_iter().collect());
        assert!(!same.lost_unflushed_in(a) && !same.lost_unflushed_in(b));
    }
}
