//! Recovery: at every epoch, each node works out which copies it holds may lack
//! acknowledged writes ([`crate::catchup`]) and copies them from a current replica,
//! at a limited rate, with progress for `drove cluster status`. A write that reaches a
//! pending copy recovers that object first (on demand), so writes never wait for the
//! whole pass.
//!
//! Which copies are pending at epoch N, coming from epoch P (the last epoch this node
//! worked out, or after a restart the last epoch it was fully current at):
//! - all of them if the node was down (or absent) in any epoch of (P, N]: a gateway
//!   may have acknowledged writes without it, which it does only after marking it down;
//! - otherwise those it holds at N but did not hold at P or some epoch between (the
//!   epoch history keeps every map, so epochs this node never saw still count).
//!
//! The source of a copy is a replica that knows its own copy is current. When none
//! does (every holder restarted after missing writes), the one with the highest
//! version wins, then a home-zone copy, the latest clean epoch, a node placed at
//! every epoch since the version, this node's own, the first in order
//! ([`plan::pick_source`]); holders may differ on the last ties, which the
//! post-crash settle makes identical.
//!
//! The decisions are pure functions in [`plan`] (what is held where, since when,
//! which copy wins); the progress record is [`progress`]. This file is the pass:
//! what is pending at each epoch, worked through at the limited rate. One object's
//! recovery is [`object`]; mending a copy in place and the hooks writes and catch-up
//! call on demand are [`mend`]. Checking and scrubbing the copies are
//! [`crate::check`].
use bytes::Bytes;
use drove_placement::locate_vdi;
use drove_proto::{PeerReq, PeerResp};
use drove_types::{ClusterMap, Epoch, Error, NodeId, NodeState, ObjectId, Result};
use futures::future::join_all;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::catchup::Repair;
use crate::local::{blocking, DigestBy, LocalStore};
use crate::throttle::TokenBucket;
use crate::Transport;

mod mend;
mod object;
mod plan;
mod progress;
mod rot;

pub(crate) use plan::pick_source;
pub use plan::View;
use plan::{as_if_up, backfill_full};
use progress::Pass;
pub use progress::Progress;

/// How long listing and digest requests wait for a node.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// How a round of [`Recoverer::recover_all`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Nothing left: the epoch is recorded as clean.
    Clean,
    /// Copies are left that a later round may make current (some failed, a newer
    /// view came, or this node is down).
    Again,
    /// Only copies that `noout` holds back are left.
    Waiting,
    /// This node's disk is too full ([`View::backfill_full_pct`]): copying waits
    /// for room, which is looked for again every [`FULL_RECHECK`].
    Full,
}

/// How often recovery held back by a full disk looks again for room.
const FULL_RECHECK: Duration = Duration::from_secs(5);

/// The recovery engine of one node.
pub struct Recoverer {
    me: NodeId,
    pub(crate) local: Arc<LocalStore>,
    pool: Arc<dyn Transport>,
    view_tx: watch::Sender<Arc<View>>,
    /// Who held which object at the last listing (this node included).
    holders: Mutex<HashMap<ObjectId, Vec<NodeId>>>,
    inflight: Mutex<HashMap<ObjectId, Arc<tokio::sync::Mutex<()>>>>,
    pass: Mutex<Pass>,
    limit_mib_s: AtomicU32,
    bucket: Mutex<TokenBucket>,
    /// What this node's scrubs found since it started.
    pub(crate) scrubbed: Mutex<crate::check::ScrubTotals>,
    /// Objects in this node's store at the last count, and when it was made.
    counted: Mutex<Option<(u64, Instant)>>,
    /// Objects this node has no copy of whose absence it knows at an epoch
    /// ([`Repair::absence_known`]).
    absent: Mutex<(Epoch, HashSet<ObjectId>)>,
}

/// Objects whose known absence is remembered per epoch (beyond it, it is worked
/// out again).
const ABSENT_KEPT: usize = 65_536;

/// Unused recovery budget saved up while clients are busy elsewhere.
const BURST: Duration = Duration::from_secs(1);

/// Objects recovered at once by one node.
const PARALLEL: usize = 4;

/// Recovery is limited until clients have left the node alone this long.
const CLIENT_QUIET: Duration = Duration::from_millis(500);

impl Recoverer {
    /// The engine of node `me`; it also becomes `local`'s on-demand [`Repair`].
    pub fn new(me: NodeId, local: Arc<LocalStore>, pool: Arc<dyn Transport>) -> Arc<Self> {
        let (view_tx, _) = watch::channel(Arc::new(View::default()));
        let r = Arc::new(Recoverer {
            me,
            local: local.clone(),
            pool,
            view_tx,
            holders: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
            pass: Mutex::new(Pass::new(Epoch(0), 0)),
            limit_mib_s: AtomicU32::new(0),
            bucket: Mutex::new(TokenBucket::new(Instant::now(), BURST)),
            scrubbed: Mutex::new(Default::default()),
            absent: Mutex::new((Epoch(0), HashSet::new())),
            counted: Mutex::new(None),
        });
        let weak: std::sync::Weak<dyn Repair> = Arc::downgrade(&r) as std::sync::Weak<dyn Repair>;
        local.set_repair(weak);
        r
    }

    /// Hand over the metadata's latest view. The run loop wakes only when the map's
    /// epoch or the VDI table changed: other metadata changes (lock renewals every
    /// few seconds) give recovery nothing to do.
    pub fn update(&self, view: View, limit_mib_s: u32) {
        self.limit_mib_s.store(limit_mib_s, Ordering::Relaxed);
        self.view_tx.send_if_modified(|cur| {
            let changed = cur.map.epoch != view.map.epoch
                || cur.noout != view.noout
                || cur.backfill_full_pct != view.backfill_full_pct
                || cur.map.nodes.is_empty() != view.map.nodes.is_empty()
                || !(Arc::ptr_eq(&cur.vdis, &view.vdis) || cur.vdis == view.vdis);
            if changed {
                *cur = Arc::new(view);
            }
            changed
        });
    }

    /// The objects in this node's store, counted again when the last count is
    /// older than `max_age` (a count lists the whole store, so /metrics asks for one
    /// at most once a minute).
    pub async fn object_count(&self, max_age: Duration) -> Result<u64> {
        let last = *self.counted.lock();
        if let Some((n, at)) = last {
            if at.elapsed() < max_age {
                return Ok(n);
            }
        }
        let n = blocking(self.local.store(), |s| s.list().map(|v| v.len() as u64)).await?;
        *self.counted.lock() = Some((n, Instant::now()));
        Ok(n)
    }

    pub(crate) fn view(&self) -> Arc<View> {
        self.view_tx.borrow().clone()
    }

    /// This node's object store.
    pub fn store(&self) -> &Arc<dyn drove_objstore::ObjectStore> {
        self.local.store()
    }

    /// Ask `node` to replace its copy of `oid` with `from`'s; true when it did.
    pub(crate) async fn ask_repair(
        &self,
        node: NodeId,
        oid: ObjectId,
        len: u32,
        from: NodeId,
        epoch: Epoch,
    ) -> bool {
        let res = if node == self.me {
            self.repair_from(oid, len, from).await
        } else {
            let req = PeerReq::Repair {
                oid,
                len,
                from,
                epoch,
            };
            self.pool.call(node, req, Bytes::new()).await.map(|_| ())
        };
        if let Err(e) = &res {
            tracing::warn!(%oid, %node, %from, "repair failed: {e}");
        }
        res.is_ok()
    }

    /// This node's progress.
    pub fn progress(&self) -> Progress {
        let p = self.pass.lock();
        let end = p.finished.unwrap_or_else(Instant::now);
        let elapsed = end.saturating_duration_since(p.started).as_secs_f64();
        let rate = if elapsed > 0.0 {
            p.bytes as f64 / elapsed
        } else {
            0.0
        };
        let left = p.total.saturating_sub(p.done);
        let eta = if left == 0 {
            Some(0.0)
        } else if p.done > 0 && elapsed > 0.0 {
            Some(elapsed / p.done as f64 * left as f64)
        } else {
            None
        };
        Progress {
            epoch: p.epoch.0,
            total: p.total,
            done: p.done,
            failed: p.failed,
            bytes: p.bytes,
            elapsed_s: elapsed,
            rate_bytes_s: rate,
            eta_s: eta,
            clean: p.clean,
            limit_mib_s: self.limit_mib_s.load(Ordering::Relaxed),
            waiting_noout: p.waiting,
            waiting_full: p.waiting_full,
            disk_used_pct: p.disk_used_pct,
        }
    }

    /// Follow the views until the process ends: work out the pending copies of each
    /// new epoch, then recover them.
    pub async fn run(self: Arc<Self>) {
        let mut rx = self.view_tx.subscribe();
        loop {
            let view = rx.borrow_and_update().clone();
            if view.map.nodes.is_empty() {
                // Not caught up with the metadata log yet.
                if rx.changed().await.is_err() {
                    return;
                }
                continue;
            }
            if view.map.epoch != self.local.catchup().epoch() || !self.local.catchup().known() {
                self.transition(&view).await;
            }
            let round = self.recover_all(&view, &rx).await;
            if round == Round::Clean {
                // Copies that moved away go once their new holders have caught up,
                // which they do at their own pace: look again until none is left.
                let left = match self.collect_moved(&view).await {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::warn!("cannot drop copies that moved away: {e}");
                        1
                    }
                };
                if left == 0 {
                    if rx.changed().await.is_err() {
                        return;
                    }
                } else {
                    let _ = tokio::time::timeout(Duration::from_secs(1), rx.changed()).await;
                }
            } else if round == Round::Full {
                // Room comes back when clients delete or trim, or copies move away:
                // nothing tells, so look again a little later.
                let _ = tokio::time::timeout(FULL_RECHECK, rx.changed()).await;
            } else if round == Round::Waiting {
                // Only copies that wait for noout are left: nothing to do until the
                // view changes (noout cleared, a node back, a new epoch).
                if rx.changed().await.is_err() {
                    return;
                }
            } else if !rx.has_changed().unwrap_or(false) {
                // Some copies failed: try again a little later unless the view moves.
                let _ = tokio::time::timeout(Duration::from_secs(1), rx.changed()).await;
            }
        }
    }

    /// A listing or digest request: a node that takes longer than this (cut off but
    /// not yet marked down) is left out rather than waited for.
    async fn short_call(&self, node: NodeId, req: PeerReq) -> Result<(PeerResp, Bytes)> {
        match tokio::time::timeout(CONTROL_TIMEOUT, self.pool.call(node, req, Bytes::new())).await {
            Ok(r) => r,
            Err(_) => Err(Error::unavailable(format!(
                "Node {node} did not answer within {CONTROL_TIMEOUT:?}"
            ))),
        }
    }

    /// Ask every up node what it stores; nodes that do not answer are left out.
    pub(crate) async fn list_all(&self, map: &ClusterMap) -> HashMap<ObjectId, Vec<NodeId>> {
        self.list_answering(map).await.0
    }

    /// Like [`Recoverer::list_all`], also returning the nodes that did not answer.
    pub(crate) async fn list_answering(
        &self,
        map: &ClusterMap,
    ) -> (HashMap<ObjectId, Vec<NodeId>>, Vec<NodeId>) {
        let asks = map.up_nodes().map(|n| n.id).map(|id| async move {
            let res = if id == self.me {
                blocking(self.local.store(), |s| s.list()).await
            } else {
                let list = PeerReq::List { epoch: map.epoch };
                match self.short_call(id, list).await {
                    Ok((PeerResp::List(v), _)) => Ok(v),
                    Ok(_) => Err(Error::invalid("Malformed list answer")),
                    Err(e) => Err(e),
                }
            };
            (id, res)
        });
        let mut out: HashMap<ObjectId, Vec<NodeId>> = HashMap::new();
        let mut silent = Vec::new();
        for (id, res) in join_all(asks).await {
            match res {
                Ok(oids) => {
                    for o in oids {
                        out.entry(o).or_default().push(id);
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %id, "cannot list its objects: {e}");
                    silent.push(id);
                }
            }
        }
        (out, silent)
    }

    /// Work out and install the pending copies of `view`'s epoch.
    async fn transition(&self, view: &View) {
        let cu = self.local.catchup();
        let epoch = view.map.epoch;
        let from = if cu.known() {
            cu.epoch()
        } else {
            cu.clean_epoch()
        };
        let up_at =
            |m: &ClusterMap, id: NodeId| m.node(id).is_some_and(|n| n.state == NodeState::Up);
        let up = |m: &ClusterMap| up_at(m, self.me);
        let later = view.maps_after(from);
        let empty = ClusterMap::default();
        let before = view.map_at(from).unwrap_or(&empty);
        // Down (or absent) at `from` counts too: a node that worked out an epoch in
        // which it was down held nothing then, and knows nothing of its copies.
        let returning = !up(before) || !up(&view.map) || later.iter().any(|m| !up(m));
        let mut listed = self.list_all(&view.map).await;
        if !up(&view.map) {
            // Not asked as an up node, but its own copies are stale all the same.
            match blocking(self.local.store(), |s| s.list()).await {
                Ok(oids) => {
                    for o in oids {
                        listed.entry(o).or_default().push(self.me);
                    }
                }
                Err(e) => tracing::warn!("cannot list this node's objects: {e}"),
            }
        }
        let mut pending: HashSet<ObjectId> = cu.pending().into_iter().collect();
        let local: Vec<ObjectId> = listed
            .iter()
            .filter(|(_, h)| h.contains(&self.me))
            .map(|(o, _)| *o)
            .collect();
        // A peer back since `from` lists what this node could not see while it was
        // away: an object placed here that it holds and this node does not was
        // never heard of here, so this node's "nothing here" says nothing of it.
        // Unchecked, a node on a new disk that worked out its epochs while the
        // only holders were down made its absence current, and replaced their
        // copies with it when they came back (`drove sim faults --seed 3223
        // --time 20s --meta raft`).
        let peer_back =
            |n: NodeId| n != self.me && (!up_at(before, n) || later.iter().any(|m| !up_at(m, n)));
        for (&oid, holders) in listed.iter() {
            if !view.holds(&view.map, self.me, oid) {
                continue;
            }
            let gained = !view.holds(before, self.me, oid)
                || later.iter().any(|m| !view.holds(m, self.me, oid));
            let unheard = !holders.contains(&self.me) && holders.iter().any(|&n| peer_back(n));
            if returning || gained || unheard {
                pending.insert(oid);
            }
        }
        if returning {
            // Copies this node no longer holds are stale too: never a source.
            pending.extend(local);
        }
        let held = pending
            .iter()
            .filter(|&&o| view.holds(&view.map, self.me, o))
            .count();
        tracing::info!(
            node = %self.me, %epoch, from = %from, returning, pending = pending.len(), held,
            "recovery: epoch worked out"
        );
        *self.holders.lock() = listed;
        cu.install(epoch, pending);
        *self.pass.lock() = Pass::new(epoch, held as u64);
    }

    /// Recover every pending copy this node holds (but those `noout` holds back);
    /// [`Round::Clean`] when none is left (then the epoch is recorded as clean).
    /// Stops early when a newer view arrives.
    async fn recover_all(&self, view: &View, rx: &watch::Receiver<Arc<View>>) -> Round {
        use futures::stream::{self, StreamExt};
        let cu = self.local.catchup();
        let all_up = view.noout.then(|| as_if_up(&view.map));
        let mut waiting = 0u64;
        let todo: Vec<ObjectId> = cu
            .pending()
            .into_iter()
            .filter(|&o| view.holds(&view.map, self.me, o))
            .filter(|&o| match &all_up {
                Some(m) if !view.holds(m, self.me, o) => {
                    waiting += 1;
                    false
                }
                _ => true,
            })
            .collect();
        let before = std::mem::replace(&mut self.pass.lock().waiting, waiting);
        if waiting != before {
            tracing::info!(
                node = %self.me, waiting, "recovery: copies held back by noout (they are here only because a node is down)"
            );
        }
        // A few objects at a time: one object is a chain of round trips, disk reads
        // and writes, and one at a time leaves both the network and the disks idle
        // most of the time. The disk's room is looked at before each object: a
        // pass of many objects can fill it.
        let full = std::sync::atomic::AtomicBool::new(self.disk_full(view));
        stream::iter(todo)
            .take_while(|_| {
                let stop = rx.has_changed().unwrap_or(false) || full.load(Ordering::Relaxed);
                futures::future::ready(!stop)
            })
            .for_each_concurrent(PARALLEL, |oid| {
                let full = &full;
                async move {
                    if self.disk_full(view) {
                        full.store(true, Ordering::Relaxed);
                        return;
                    }
                    match self.recover(oid, true).await {
                        Ok(()) => self.count(|p| p.done += 1),
                        Err(e) => {
                            tracing::warn!(me = %self.me, %oid, "recovery of the object failed: {e}");
                            self.count(|p| p.failed += 1);
                        }
                    }
                }
            })
            .await;
        if rx.has_changed().unwrap_or(false) {
            return Round::Again;
        }
        let left = cu
            .pending()
            .into_iter()
            .filter(|&o| view.holds(&view.map, self.me, o))
            .count() as u64;
        let held = if full.load(Ordering::Relaxed) {
            left.saturating_sub(waiting)
        } else {
            0
        };
        let before = std::mem::replace(&mut self.pass.lock().waiting_full, held);
        if (held > 0) != (before > 0) {
            let used = self.pass.lock().disk_used_pct.unwrap_or(0.0);
            if held > 0 {
                tracing::warn!(
                    node = %self.me, held, used_pct = format!("{used:.1}"), backfill_full_pct = view.backfill_full_pct,
                    "recovery: this node's disk is too full, copying waits for room (its objects stay below their copies)"
                );
            } else {
                tracing::info!(node = %self.me, used_pct = format!("{used:.1}"), "recovery: the disk has room again, copying goes on");
            }
        }
        if held > 0 {
            return Round::Full;
        }
        if left > 0 {
            // When all that is left is held back by noout, only a new view (noout
            // cleared, a node back, a new epoch) gives work again.
            return if left <= waiting {
                Round::Waiting
            } else {
                Round::Again
            };
        }
        if !view
            .map
            .node(self.me)
            .is_some_and(|n| n.state == NodeState::Up)
        {
            // A node marked down holds nothing and has nothing to recover, but it is
            // not clean: its copies may all lack writes made since.
            return Round::Again;
        }
        // Copies are written without fsync; they are durable before the node says
        // it is clean (a crash before that makes it recover everything again).
        if let Err(e) = blocking(self.local.store(), |s| s.flush(&[])).await {
            tracing::warn!("cannot flush recovered copies: {e}");
            return Round::Again;
        }
        if let Err(e) = cu.set_clean(view.map.epoch) {
            tracing::warn!("cannot record the clean epoch: {e}");
        }
        self.count(|p| {
            p.clean = true;
            p.finished.get_or_insert_with(Instant::now);
        });
        Round::Clean
    }

    fn count(&self, f: impl FnOnce(&mut Pass)) {
        f(&mut self.pass.lock());
    }

    /// Whether this node's disk is at or past `view`'s backfill-full percent; how
    /// full it is goes into the progress report. A store that cannot tell (no
    /// disk) is never full.
    fn disk_full(&self, view: &View) -> bool {
        let Some(space) = self.local.store().disk_space() else {
            return false;
        };
        let used = space.used_pct();
        self.count(|p| p.disk_used_pct = Some(used));
        backfill_full(used, view.backfill_full_pct)
    }

    fn slot(&self, oid: ObjectId) -> Arc<tokio::sync::Mutex<()>> {
        self.inflight.lock().entry(oid).or_default().clone()
    }

    /// Keep the copy rate under the limit while clients use this node: a token
    /// bucket whose tokens are time. A node no client has used for a moment copies
    /// at full speed (recovery yields to client I/O, it does not idle next to none).
    pub(crate) async fn throttle(&self, bytes: u64) {
        let limit = u64::from(self.limit_mib_s.load(Ordering::Relaxed)) << 20;
        if limit == 0 || !self.clients_active() {
            return;
        }
        let cost = Duration::from_secs_f64(bytes as f64 / limit as f64);
        let wait = self.bucket.lock().take(Instant::now(), cost);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Whether clients did I/O on this node within the last [`CLIENT_QUIET`]. (It
    /// once compared an operation count between calls, which took the first call
    /// after a quiet spell for activity and slowed the first half second of every
    /// idle pass to the limit.)
    fn clients_active(&self) -> bool {
        self.local
            .since_client_op()
            .is_some_and(|d| d < CLIENT_QUIET)
    }

    /// Delete copies this node no longer holds once every holder has a current copy
    /// with the same content or a newer version (written since the copy moved away,
    /// which this one never will be); returns how many such copies are still here.
    async fn collect_moved(&self, view: &View) -> Result<usize> {
        let mut left = 0;
        let local = blocking(self.local.store(), |s| s.list()).await?;
        for oid in local {
            let Some(vdi) = view.vdis.get(&oid.vdi) else {
                continue;
            };
            let placed = locate_vdi(&view.map, vdi, oid);
            if placed.contains(&self.me) || placed.len() < usize::from(vdi.copies) {
                continue;
            }
            // By checksums: the new holders' copies were written by recovery; rot
            // under a checksum is a scrub's to find, as for any copy.
            let by = DigestBy::Checksums;
            let mine = self.local.digest(oid, vdi.object_size, by).await?;
            let ds = self
                .digests_of(&placed, oid, vdi.object_size, view.map.epoch, by)
                .await;
            left += 1;
            let confirmed = ds.len() == placed.len()
                && ds.iter().all(|(_, d)| {
                    d.current
                        && !d.corrupt
                        && (mine.corrupt || d.crc == mine.crc || d.version > mine.version)
                });
            if confirmed {
                let cu = self.local.catchup();
                let _held = cu.copy_lock(oid).await;
                blocking(self.local.store(), move |s| s.delete(oid)).await?;
                cu.mark_current(oid);
                left -= 1;
                tracing::debug!(me = %self.me, %oid, "dropped a copy that moved away");
            }
        }
        Ok(left)
    }
}
