//! The single-writer lock of a VDI, as the volume on the gateway holds it.
//!
//! The lock is a lease in the cluster metadata with a generation number. The volume
//! takes it at the first write, renews it in the background while clients are
//! attached, and gives it up when the last client detaches. Every write carries the
//! generation so replicas can refuse an older holder (fencing). Writes stop once the
//! lease may have run out: its end is counted from *before* the request that granted
//! it, so this node never believes in a lease longer than the metadata does.
//!
//! Hand-over: when another node asks, the holder stops admitting writes, waits for
//! the writes in flight, flushes, and releases; it then refuses writes until every
//! client detaches (so it cannot take the lock back from under the new holder).
use async_trait::async_trait;
use drove_types::clock::Instant;
use drove_types::{Error, ErrorKind, Result, VdiId, VdiInfo};
use parking_lot::Mutex;
use std::time::Duration;
use tokio::sync::{RwLock, RwLockReadGuard};

/// A granted lease.
#[derive(Debug, Clone)]
pub struct Lease {
    /// Lock generation, carried by every write.
    pub generation: u64,
    /// How long the lease lasts from the moment it was asked for.
    pub duration: Duration,
    /// The VDI id the lock covers. It differs from the volume's when a snapshot gave
    /// the VDI's name a new id that this node has not applied yet: writes wait for it.
    pub vdi: VdiId,
    /// The VDI's home zone as of the grant: the first grant sets it, and writes wait
    /// until the volume's record shows it (their placement depends on it).
    pub home_zone: Option<String>,
}

/// What the volume needs from the cluster metadata to hold a VDI's lock.
#[async_trait]
pub trait LockService: Send + Sync {
    /// Take or renew the lock of `vdi` for this node; `ErrorKind::Locked` when another
    /// node holds it.
    async fn acquire(&self, vdi: &VdiInfo) -> Result<Lease>;
    /// Extend the lease of `vdi` held with `generation`. The answer's generation is
    /// the one held now: another one means the lock was lost meanwhile.
    async fn renew(&self, vdi: &VdiInfo, _generation: u64) -> Result<Lease> {
        self.acquire(vdi).await
    }
    /// Give up the lock of `vdi` held with `generation`.
    async fn release(&self, vdi: &VdiInfo, generation: u64) -> Result<()>;
    /// Whether this node has heard from a metadata majority within the last few
    /// seconds: the metadata is there, if slow (a new Raft term, slow fsyncs), and a
    /// write waiting for the lock may wait longer ([`ACQUIRE_PATIENCE_MAX`]).
    fn majority_recent(&self) -> bool {
        false
    }
    /// The last client that wrote `vdi` through this node detached and the lock was
    /// released: an ephemeral clone is deleted now.
    async fn last_writer_gone(&self, _vdi: &VdiInfo) -> Result<()> {
        Ok(())
    }
}

/// How long a write waits for the lock (another node may be detaching right now)
/// before it is refused, once this node has not heard from a metadata majority for
/// that long: a gateway cut off from the majority fails writes within it.
pub const ACQUIRE_PATIENCE: Duration = Duration::from_secs(3);
/// How long a write waits at most while the metadata majority still answers: a new
/// Raft term with slow fsyncs took more than 3 s in the paper bench
/// (bench/results/paper-full-2026-11-24b.md), and a VM's write failed with EIO.
pub const ACQUIRE_PATIENCE_MAX: Duration = Duration::from_secs(30);
/// Writes are refused this long before the lease ends, for clock-rate slack.
const SAFETY: Duration = Duration::from_millis(500);

/// Whether a wait for the lock begun at `started` should end now: past
/// [`ACQUIRE_PATIENCE`] with no recent word from a metadata majority, or past
/// [`ACQUIRE_PATIENCE_MAX`] in any case.
fn out_of_patience(started: Instant, svc: &dyn LockService) -> bool {
    let waited = started.elapsed();
    waited >= ACQUIRE_PATIENCE_MAX || (waited >= ACQUIRE_PATIENCE && !svc.majority_recent())
}

/// `fut`'s output, or `None` once the wait begun at `started` is out of patience
/// (looked at every [`ACQUIRE_PATIENCE`] at first, then every 500 ms).
async fn patiently<T>(
    started: Instant,
    svc: &dyn LockService,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::pin!(fut);
    let mut until = started + ACQUIRE_PATIENCE;
    loop {
        match tokio::time::timeout_at(until, &mut fut).await {
            Ok(v) => return Some(v),
            Err(_) if out_of_patience(started, svc) => return None,
            Err(_) => until = Instant::now() + Duration::from_millis(500),
        }
    }
}

/// The renewal period of a lease of `duration`: a third of it.
fn period_of(duration: Duration) -> Duration {
    (duration / 3).max(Duration::from_millis(100))
}

/// What one renewal attempt did.
#[derive(Debug)]
pub enum Renewal {
    /// The lease was extended.
    Renewed,
    /// It could not be renewed now (no metadata majority, a timeout): try again;
    /// writes stop when the lease ends.
    Failed(Error),
    /// Renewing should stop: the lock was lost, released or retired.
    Stop,
}

#[derive(Debug, Default)]
struct Held {
    generation: u64,
    vdi: VdiId,
    home_zone: Option<String>,
    valid_until: Option<Instant>,
    duration: Duration,
    /// Why writes are refused until every client detaches.
    retired: Option<String>,
    renewing: bool,
}

/// Lock state of one volume.
#[derive(Default)]
pub struct WriteLock {
    held: Mutex<Held>,
    /// Writes hold it shared while in flight; hand-over takes it exclusively.
    in_flight: RwLock<()>,
    acquiring: tokio::sync::Mutex<()>,
}

impl WriteLock {
    fn snapshot(&self) -> Held {
        let h = self.held.lock();
        Held {
            retired: h.retired.clone(),
            home_zone: h.home_zone.clone(),
            ..*h
        }
    }

    fn update(&self, f: impl FnOnce(&mut Held)) {
        f(&mut self.held.lock());
    }

    fn usable(h: &Held) -> Result<Option<u64>> {
        if let Some(why) = &h.retired {
            return Err(Error::new(ErrorKind::Locked, why.clone()));
        }
        Ok(match h.valid_until {
            Some(t) if Instant::now() + SAFETY < t => Some(h.generation),
            _ => None,
        })
    }

    /// The generation to write with, taking or renewing the lease if needed. The
    /// returned guard must be held until the write has been answered.
    pub async fn for_write(
        &self,
        vdi: &VdiInfo,
        svc: &dyn LockService,
    ) -> Result<(u64, RwLockReadGuard<'_, ()>)> {
        let guard = self.in_flight.read().await;
        if let Some(g) = Self::usable(&self.snapshot())? {
            return Ok((g, guard));
        }
        // The whole acquisition, queueing behind another one included, is bounded: a
        // gateway cut off from the metadata majority fails writes within the
        // patience instead of holding them for the metadata's own timeouts; while
        // the majority still answers, it waits up to the longer patience.
        let started = Instant::now();
        let no_lock = || {
            let waited = started.elapsed().as_secs_f64();
            if svc.majority_recent() {
                Error::unavailable(format!(
                    "VDI '{}': could not take the write lock within {waited:.1} s (the metadata majority answers, but slowly)",
                    vdi.name
                ))
            } else {
                Error::unavailable(format!(
                    "VDI '{}': could not take the write lock within {waited:.1} s (metadata majority unreachable?)",
                    vdi.name
                ))
            }
        };
        let _one = patiently(started, svc, self.acquiring.lock())
            .await
            .ok_or_else(no_lock)?;
        if let Some(g) = Self::usable(&self.snapshot())? {
            return Ok((g, guard));
        }
        // A refusal seen while waiting is the better answer when time runs out.
        let mut refused: Option<Error> = None;
        loop {
            let asked = Instant::now();
            let res = match patiently(started, svc, svc.acquire(vdi)).await {
                Some(r) => r,
                None => return Err(refused.unwrap_or_else(no_lock)),
            };
            match res {
                Ok(lease) => {
                    self.update(|h| {
                        h.generation = lease.generation;
                        h.vdi = lease.vdi;
                        h.home_zone = lease.home_zone.clone();
                        h.duration = lease.duration;
                        h.valid_until = Some(asked + lease.duration);
                    });
                    return Ok((lease.generation, guard));
                }
                // Another node holds the lock: it may be detaching right now, but a
                // live holder is not waited for beyond the short patience.
                Err(e) if e.kind() == ErrorKind::Locked && started.elapsed() < ACQUIRE_PATIENCE => {
                    refused = Some(e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Until when writes under the current lease may be acknowledged (`None`: no
    /// lease). A write still unanswered then fails instead of being acknowledged late.
    pub fn write_deadline(&self) -> Option<Instant> {
        let h = self.snapshot();
        if h.retired.is_some() {
            return None;
        }
        h.valid_until.map(|t| t - SAFETY)
    }

    /// The generation of a lease this node holds and may write under now.
    pub fn held_generation(&self) -> Option<u64> {
        Self::usable(&self.snapshot()).ok().flatten()
    }

    /// The VDI id the held lock covers (`VdiId(0)` when unknown).
    pub fn vdi(&self) -> VdiId {
        self.snapshot().vdi
    }

    /// The VDI's home zone as of the grant (`None` when it has none, or unknown).
    pub fn home_zone(&self) -> Option<String> {
        self.snapshot().home_zone
    }

    /// The lock moved to `vdi` with the snapshot this node took.
    pub fn set_vdi(&self, vdi: VdiId) {
        self.update(|h| h.vdi = vdi);
    }

    /// Stop writes for a moment (a snapshot): waits for those in flight; new ones wait
    /// until the guard is dropped.
    pub async fn pause(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.in_flight.write().await
    }

    /// Whether a background renewal should start (and mark it started).
    pub fn start_renewing(&self) -> bool {
        let mut start = false;
        self.update(|h| {
            if !h.renewing && h.valid_until.is_some() && h.retired.is_none() {
                h.renewing = true;
                start = true;
            }
        });
        start
    }

    /// One renewal attempt.
    pub async fn renew(&self, vdi: &VdiInfo, svc: &dyn LockService) -> Renewal {
        let h = self.snapshot();
        if h.valid_until.is_none() || h.retired.is_some() {
            self.update(|h| h.renewing = false);
            return Renewal::Stop;
        }
        let asked = Instant::now();
        match svc.renew(vdi, h.generation).await {
            // The generation held when the attempt began, or the one held now (a
            // write took the lock again while this attempt waited and the lease
            // ran out meanwhile): the answer renews what is held.
            Ok(lease)
                if lease.generation == h.generation
                    || lease.generation == self.snapshot().generation =>
            {
                self.update(|h| {
                    // Never shorter: an earlier attempt may answer after a later one.
                    // A lease given up meanwhile (the last client detached, a
                    // hand-over) is not brought back: its release is on its way, and
                    // writes acknowledged under it would follow the release.
                    let Some(t) = h.valid_until else { return };
                    h.valid_until = Some(t.max(asked + lease.duration));
                    h.vdi = lease.vdi;
                });
                Renewal::Renewed
            }
            Ok(lease) => {
                // Someone else held it in between: ours is gone.
                self.retire(format!(
                    "VDI '{}' lost its lock (generation {} replaced by {})",
                    vdi.name, h.generation, lease.generation
                ));
                Renewal::Stop
            }
            // The lock was given up and taken again (a new generation) while this
            // attempt waited: the answer is about the one before. Try again with
            // the generation held now.
            Err(e)
                if e.kind() == ErrorKind::Locked && self.snapshot().generation != h.generation =>
            {
                Renewal::Failed(e)
            }
            Err(e) if e.kind() == ErrorKind::Locked => {
                self.retire(format!("VDI '{}' lost its lock: {e}", vdi.name));
                Renewal::Stop
            }
            // No metadata majority: keep trying; writes stop when the lease ends.
            Err(e) => Renewal::Failed(e),
        }
    }

    /// How long to wait for a renewal attempt before sending another beside it: a
    /// commit slowed by a busy disk or a leader change must not use up the lease
    /// with one attempt (a lease of 15 s renewed every 5 s has room for four).
    pub fn attempt_limit(&self) -> Duration {
        (self.period() / 2).max(Duration::from_millis(50))
    }

    /// Whether a renewal is due: the lease was granted (or last renewed, counting
    /// from when that was asked) a [`period`](Self::period) ago or more. `None`
    /// when there is nothing to renew (no lease, retired).
    pub fn renewal_due(&self) -> Option<bool> {
        let h = self.snapshot();
        if h.retired.is_some() {
            return None;
        }
        let asked = h.valid_until? - h.duration;
        Some(asked.elapsed() >= period_of(h.duration))
    }

    /// The renewal period: a third of the lease.
    pub fn period(&self) -> Duration {
        period_of(self.snapshot().duration)
    }

    fn retire(&self, why: String) {
        self.update(|h| {
            h.retired = Some(why);
            h.valid_until = None;
            h.renewing = false;
        });
    }

    /// Stop writing for a hand-over: no new writes, wait for those in flight. Returns
    /// the generation to release, if the lock was held.
    pub async fn retire_for_handover(&self, vdi: &VdiInfo, to: &str) -> Option<u64> {
        self.update(|h| {
            h.retired = Some(format!(
                "VDI '{}' was handed over to node {to}; this client can no longer write",
                vdi.name
            ))
        });
        let _drained = self.in_flight.write().await;
        let mut gen = None;
        self.update(|h| {
            if h.valid_until.take().is_some() {
                gen = Some(h.generation);
            }
            h.renewing = false;
        });
        gen
    }

    /// Keep this node from taking the lock while the guard lives (a release is
    /// being committed: the metadata would grant this node's own generation again,
    /// and the release would then end a lock a client writes under).
    pub async fn hold_grants(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.acquiring.lock().await
    }

    /// Whether this node holds a lease (valid or run out) it has not given up.
    pub fn has_lease(&self) -> bool {
        self.snapshot().valid_until.is_some()
    }

    /// Every client detached: give the lock up and forget any retirement. Returns
    /// the generation to release, if the lock was held.
    pub async fn detach_all(&self) -> Option<u64> {
        let _drained = self.in_flight.write().await;
        let mut gen = None;
        self.update(|h| {
            if h.valid_until.take().is_some() {
                gen = Some(h.generation);
            }
            h.retired = None;
            h.renewing = false;
        });
        gen
    }
}
