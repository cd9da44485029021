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
//! which copy wins); the progress record is [`progress`]; this file is the engine
//! that asks the network and the store and acts on them.
use bytes::Bytes;
use drove_placement::locate_vdi;
use drove_proto::{ObjDigest, PeerReq, PeerResp};
use drove_types::{
    ClusterMap, Epoch, Error, ErrorKind, NodeId, NodeState, ObjectId, Result, WritePolicy,
    BLOCK_SIZE,
};
use futures::future::{join_all, BoxFuture};
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

mod plan;
mod progress;

pub(crate) use plan::pick_source;
pub use plan::View;
use plan::{as_if_up, as_sources, backfill_full, mend_order, vouches};
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

    /// Make this node's copy of `oid` current (one copy of an object at a time).
    ///
    /// The copies are compared by their block checksums, not read: a node coming
    /// back from a crash holds thousands of copies, nearly all as good as the
    /// others', and reading each on every replica to say so (the digest used to
    /// read and checksum the whole object) made its return read three times what
    /// it held (`drove sim dc-loss --return-after 60s`). A source whose data
    /// fails its checksums when sent is found then, and the choice is made again
    /// with digests that read every copy, which see it corrupt.
    pub(crate) async fn recover(&self, oid: ObjectId, limited: bool) -> Result<()> {
        let slot = self.slot(oid);
        let _one = slot.lock().await;
        match self.recover_by(oid, limited, DigestBy::Checksums).await {
            Err(e) if e.kind() == ErrorKind::Corrupt => {
                tracing::info!(me = %self.me, %oid, "recovery: a copy failed its checksums, comparing the copies again by reading them: {e}");
                self.recover_by(oid, limited, DigestBy::Reading).await
            }
            res => res,
        }
    }

    /// Recover this node's copy of `oid`, whose data a read found rotten under
    /// its checksums (a scrub): the copies are compared by reading them. Compared
    /// by checksums, the rotten copy looks as good as the others (the rot is under
    /// them) and was kept (e2e_heal's scrub tests: `repaired=1`, and the byte
    /// still flipped).
    ///
    /// The copy is read again once the slot is this call's: a recovery that
    /// compared by checksums may have had it first and marked the copy current,
    /// its rot unseen, and this call then returned at once, the copy still rotten,
    /// and the scrub counted it repaired (`drove sim faults --seed 1628 --time
    /// 40s`: node 3 was catching up when it scrubbed).
    pub(crate) async fn recover_rotten(&self, oid: ObjectId, len: u32) -> Result<()> {
        let slot = self.slot(oid);
        let _one = slot.lock().await;
        if !self
            .local
            .digest(oid, len, DigestBy::Reading)
            .await?
            .corrupt
        {
            return Ok(());
        }
        self.local.catchup().mark_pending(oid);
        self.recover_by(oid, false, DigestBy::Reading).await
    }

    /// [`Recoverer::recover`] with the copies' digests taken `by` checksums or by
    /// reading them; the caller holds the object's slot.
    async fn recover_by(&self, oid: ObjectId, limited: bool, by: DigestBy) -> Result<()> {
        let cu = self.local.catchup();
        if cu.is_current(oid) {
            return Ok(());
        }
        let view = self.view();
        let Some(vdi) = view.vdis.get(&oid.vdi) else {
            // A deleted VDI: no write can come; its objects are collected.
            cu.mark_current(oid);
            return Ok(());
        };
        let len = vdi.object_size;
        let placed = locate_vdi(&view.map, vdi, oid);
        let mut others: Vec<NodeId> = self.holders.lock().get(&oid).cloned().unwrap_or_default();
        others.extend(placed.iter().copied());
        others.retain(|&n| {
            n != self.me && view.map.node(n).is_some_and(|x| x.state == NodeState::Up)
        });
        // Current holders first, in placement order.
        others.sort_by_key(|n| placed.iter().position(|p| p == n).unwrap_or(usize::MAX));
        others.dedup();
        // A copy this node does not have at all (it gained the object): fetch it
        // from the first holder that knows its copy is current, without comparing
        // digests first (each digest reads the whole object on its holder).
        if !blocking(self.local.store(), move |s| s.exists(oid)).await? {
            // Only from a node it is placed on: another's copy no longer takes writes.
            for &src in others.iter().filter(|n| placed.contains(n)) {
                match self.copy(oid, len, src, false, limited).await {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        tracing::debug!(me = %self.me, %oid, node = %src, "direct fetch failed: {e}")
                    }
                }
            }
        }
        // Every answer counts as one (a node that dropped its copy holds no write
        // the others lack); only some are sources.
        let mut digests = self.digests_of(&others, oid, len, view.map.epoch, by).await;
        // A host that lost power since its last clean epoch (or since this copy
        // was last made current: a leftover, seed 8017) reads its own copy: a
        // write the power loss cut may have left a block whose data and checksum
        // disagree, which the checksums alone do not show. Digested by checksums,
        // such a copy, the only one of its version, was made current as it stood,
        // and every read of the block failed (e2e_power_loss, seed 639504).
        let mine_by = if cu.lost_unflushed_in(oid) {
            DigestBy::Reading
        } else {
            by
        };
        let mut mine = self.local.digest(oid, len, mine_by).await?;
        // A copy in the VDI's home zone when it took its version's writes.
        let near = |n: NodeId, at: Epoch| view.in_home(vdi, n, at);
        if mine.corrupt && mine.present {
            // Whether this copy is alone in its version is for every node placed
            // since to say, those the object has left too: unasked, node 8 (no copy,
            // placed at epoch 11 and no longer) kept node 7 from sealing its torn
            // copy, the only one of its version, and recovery never ended
            // (`drove sim faults --seed 1416 --time 20s --meta raft`).
            let since = Epoch(mine.version.epoch);
            self.ask_unasked(&view, oid, len, since, by, &mut digests)
                .await;
        }
        if mine.corrupt
            && self
                .mend(
                    oid,
                    len,
                    &mine,
                    &as_sources(&placed, digests.clone()),
                    self.alone_in_version(&view, oid, &mine, &digests),
                    &near,
                )
                .await
        {
            mine = self.local.digest(oid, len, mine_by).await?;
        }
        let stayed = |n: NodeId, at: Epoch| view.placed_throughout(oid, n, at);
        let mut source = pick_source(
            self.me,
            mine,
            &as_sources(&placed, digests.clone()),
            &near,
            &stayed,
        );
        if !matches!(source, Some((_, _, false))) {
            // Nobody's copy is known current. The best copy that answered holds every
            // acknowledged write only if, for every epoch since its last one, a node
            // that took every write of that epoch answered too ([`View::unvouched`]);
            // else wait (the pass is retried) rather than make a
            // stale copy current, which would then overwrite the newer one when its
            // node comes back. Up nodes among them that were not asked (they no
            // longer hold the object) are asked now.
            let since = |s: &Option<(NodeId, ObjDigest, bool)>| {
                s.map_or(Epoch(0), |(_, d, _)| Epoch(d.version.epoch))
            };
            if self
                .ask_unasked(&view, oid, len, since(&source), by, &mut digests)
                .await
            {
                source = pick_source(
                    self.me,
                    mine,
                    &as_sources(&placed, digests.clone()),
                    &near,
                    &stayed,
                );
            }
            // A higher version found among them only narrows the set; a current copy
            // found among them ends the question.
            // A corrupt copy of a later version than the best readable one holds
            // writes that copy lacks: it does not answer for its epochs (`drove sim
            // faults --seed 242 --time 40s`: a flipped copy of a later version
            // vouched for a source without its writes). One of the same or an
            // earlier version holds none the best copy lacks, and does.
            let best = source.map(|(n, d, _)| (n, d.version));
            let zone_sync = vdi.policy == WritePolicy::ZoneSync;
            // Whether node `n` answered with a copy that answers for its epochs'
            // writes ([`vouches`]), and whether it surely kept them: a copy whose
            // host lost power since it took writes may lack the unflushed ones.
            // This node's own, so (node 9, back from a power loss with its copy's
            // version, the peers that took the write after it down, vouched for
            // its own stale copy, made it current, and the others recovered from
            // it: `drove sim faults --seed 205`, two writes lost), and another's while that node has not been clean since it
            // started (it reports clean epoch 0 until its own recovery is done,
            // which decides for it). An epoch whose witnesses all answered, unsure
            // or not, has no better answer anywhere: waiting, after the whole site
            // lost power, nodes 2 and 3 each took an epoch's writes alone while
            // the other was down, and neither ever made its copy current
            // (`--seed 293`, also `--seed 91`).
            let answered = |n: NodeId| {
                if n == self.me {
                    return vouches(n, &mine, best, zone_sync, &near);
                }
                digests
                    .iter()
                    .any(|(m, d)| *m == n && vouches(n, d, best, zone_sync, &near))
            };
            let sure = |n: NodeId| {
                if n == self.me {
                    return !cu.lost_unflushed_in(oid);
                }
                digests
                    .iter()
                    .any(|(m, d)| *m == n && !unsure_since_boot(d))
            };
            let silent = view.unvouched_by(oid, since(&source), &answered, &sure, Some(self.me));
            if !silent.is_empty() && !matches!(source, Some((_, _, false))) {
                // Those that answered with a copy failing its checksums are asked to
                // mend it: waiting is for them, and nothing else repairs a copy
                // known current until a scrub reads it.
                let epoch = view.map.epoch;
                for (n, _) in digests
                    .iter()
                    .filter(|(n, d)| d.corrupt && silent.contains(n))
                {
                    let req = PeerReq::Repair {
                        oid,
                        len,
                        from: *n,
                        epoch,
                    };
                    if let Err(e) = self.short_call(*n, req).await {
                        tracing::debug!(me = %self.me, %oid, node = %n, "no mend: {e}");
                    }
                }
                return Err(Error::unavailable(format!(
                    "No copy of object {oid} is known current, and nodes {silent:?}, which \
                     took writes since the best copy's last one, do not answer: waiting \
                     for them"
                )));
            }
        }
        tracing::debug!(
            me = %self.me, %oid, ?placed, ?mine,
            digests = ?digests, source = ?source.map(|s| (s.0, s.2)),
            "recovery: copies compared"
        );
        let Some((src, d, force)) = source else {
            // No copy anywhere else: this one (or nothing) is all there is.
            cu.mark_current(oid);
            return Ok(());
        };
        if src == self.me || (d.crc == mine.crc && !mine.corrupt && d.present == mine.present) {
            if d.version != mine.version && src != self.me {
                // Same content: take the source's version, as a copy would.
                let v = d.version;
                let _held = cu.copy_lock(oid).await;
                blocking(self.local.store(), move |s| s.set_version(oid, v)).await?;
            }
            cu.mark_current(oid);
            return Ok(());
        }
        self.copy(oid, len, src, force, limited).await
    }

    /// Ask for their digests the up nodes `oid` was placed on since epoch `since`
    /// that are not among `digests` (nor this node): those that may have taken
    /// writes and were not asked, because the object has left them. Their answers
    /// join `digests`; whether there were any to ask.
    async fn ask_unasked(
        &self,
        view: &View,
        oid: ObjectId,
        len: u32,
        since: Epoch,
        by: DigestBy,
        digests: &mut Vec<(NodeId, ObjDigest)>,
    ) -> bool {
        let unasked: Vec<NodeId> = view
            .placed_since(oid, since)
            .into_iter()
            .filter(|&n| n != self.me && !digests.iter().any(|(m, _)| *m == n))
            .filter(|&n| view.map.node(n).is_some_and(|x| x.state == NodeState::Up))
            .collect();
        if unasked.is_empty() {
            return false;
        }
        let more = self
            .digests_of(&unasked, oid, len, view.map.epoch, by)
            .await;
        digests.extend(more);
        true
    }

    /// Whether this node's copy `mine` is the only copy of the latest version
    /// while its host lost power since its last clean epoch: every node the
    /// object was placed on since that version's epoch answered (`digests`), with
    /// an earlier version or none. A block of it failing its checksums is then as
    /// the power loss left an unflushed write (see [`Recoverer::mend`]): no other
    /// copy holds that write, and the copies of earlier versions lack it.
    fn alone_in_version(
        &self,
        view: &View,
        oid: ObjectId,
        mine: &ObjDigest,
        digests: &[(NodeId, ObjDigest)],
    ) -> bool {
        if !mine.present || !self.local.catchup().lost_unflushed_in(oid) {
            return false;
        }
        if digests
            .iter()
            .any(|(_, d)| d.present && d.version >= mine.version)
        {
            return false;
        }
        view.placed_since(oid, Epoch(mine.version.epoch))
            .into_iter()
            .all(|n| n == self.me || digests.iter().any(|(m, _)| *m == n))
    }

    /// Rewrite the blocks of this node's copy of `oid` that fail their checksums
    /// with the same blocks of other copies of its version (see [`mend_order`]),
    /// keeping its version; whether every rotten block was mended. The caller
    /// holds the object's slot and the copy is pending, so writes to it wait.
    /// `alone`: the copy is the only one of the latest version on a host that lost
    /// power ([`Recoverer::alone_in_version`]); every failing block is sealed.
    async fn mend(
        &self,
        oid: ObjectId,
        len: u32,
        mine: &ObjDigest,
        others: &[(NodeId, ObjDigest)],
        alone: bool,
        near: &(dyn Fn(NodeId, Epoch) -> bool + Sync),
    ) -> bool {
        let order = mend_order(mine, others, near);
        // A home copy whose host lost power: a block failing here is most likely a
        // write the power loss cut, and the far copy of the same version may lack
        // even the write before it, acknowledged durable. When every other home copy
        // asked fails the block too, it is sealed as it stands rather than taken
        // from the far copy: taken from there, both home copies torn at one block
        // after the whole site lost power, write 1382 was replaced by the far
        // copy's 1233 everywhere (`drove sim faults --seed 1306 --time 20s --meta
        // raft`). A home copy that cannot answer (its disk failed) leaves the far
        // copy as the fallback: refused it, a home copy with one block flipped was
        // replaced whole by the far copy, short of two durable writes (`--seed
        // 3016`).
        let at = Epoch(mine.version.epoch);
        let seal_before_far = self.local.catchup().lost_unflushed_in(oid) && near(self.me, at);
        if order.is_empty() && !alone {
            return false;
        }
        let blocks = u64::from(len) / BLOCK_SIZE;
        let rotten = blocking(self.local.store(), move |s| {
            let mut bad = Vec::new();
            for b in 0..blocks {
                match s.read(oid, b * BLOCK_SIZE, BLOCK_SIZE as u32) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::Corrupt => bad.push(b),
                    Err(e) => return Err(e),
                }
            }
            Ok(bad)
        })
        .await;
        let rotten = match rotten {
            Ok(r) if !r.is_empty() => r,
            Ok(_) => return false,
            Err(e) => {
                tracing::warn!(me = %self.me, %oid, "cannot read the copy to mend it: {e}");
                return false;
            }
        };
        let epoch = self.view().map.epoch;
        let mut got = Vec::with_capacity(rotten.len());
        let mut sealed = Vec::new();
        for b in rotten {
            let mut found = None;
            // Whether every other copy of the version fails this block too.
            let mut torn_everywhere = true;
            // Other home copies that fail the block as torn.
            let mut torn_home = 0;
            for &n in &order {
                if seal_before_far && torn_everywhere && torn_home > 0 && !near(n, at) {
                    break;
                }
                // Whatever the copy's state: after a whole-site power loss every
                // copy is pending, and a plain read of one is refused. A node of
                // wire version 4 has no MendRead: the pool sends it the plain read
                // it knows (PeerReq::in_version), which its pending copy refuses.
                let req = PeerReq::MendRead {
                    oid,
                    offset: b * BLOCK_SIZE,
                    len: BLOCK_SIZE as u32,
                    epoch,
                };
                match self.short_call(n, req).await {
                    Ok((PeerResp::Data, data)) if data.len() as u64 == BLOCK_SIZE => {
                        found = Some((n, data));
                        break;
                    }
                    Ok(_) => torn_everywhere = false,
                    Err(e) => {
                        let torn = e.kind() == ErrorKind::Corrupt;
                        torn_everywhere &= torn;
                        torn_home += usize::from(torn && near(n, at));
                        tracing::debug!(me = %self.me, %oid, node = %n, block = b, "no block to mend with: {e}")
                    }
                }
            }
            let Some((n, data)) = found else {
                if torn_everywhere {
                    // Every copy fails the block: a power loss of their nodes kept a
                    // write's data or its checksum from every disk (they are written
                    // one after the other and synced by the flush that follows; the
                    // write was not acknowledged durable). Rot does not strike every
                    // copy of a block at once. The block is sealed as this copy holds
                    // it: the old write, the new one, or a mix of the two by sector
                    // (the disk tears an unflushed write there), what a client may
                    // read of a disk after losing an unflushed write. The other copies
                    // then mend from this one, or are replaced by the copy recovery
                    // picks. So too when this copy is `alone` in its version (no
                    // copy to ask): the copies of earlier versions lack the write;
                    // and when every home copy asked fails it (`seal_before_far`).
                    sealed.push(b);
                    continue;
                }
                tracing::warn!(me = %self.me, %oid, block = b, "no copy of the version holds the block whole: not mended");
                return false;
            };
            got.push((b, n, data));
        }
        let cu = self.local.catchup();
        let _held = cu.copy_lock(oid).await;
        let from: Vec<(u64, NodeId)> = got.iter().map(|(b, n, _)| (*b, *n)).collect();
        let resealed = sealed.clone();
        let written = blocking(self.local.store(), move |s| {
            for (b, _, data) in &got {
                s.write(oid, b * BLOCK_SIZE, data)?;
            }
            for b in &resealed {
                let data = s.read_unverified(oid, *b)?;
                s.write(oid, b * BLOCK_SIZE, &data)?;
            }
            s.flush(&[oid])
        })
        .await;
        match written {
            Ok(()) => {
                if !from.is_empty() {
                    tracing::info!(me = %self.me, %oid, blocks = ?from, "recovery: mended the copy's rotten blocks (block, from)");
                }
                if !sealed.is_empty() {
                    tracing::warn!(me = %self.me, %oid, blocks = ?sealed, "recovery: every copy of the version fails these blocks, as a write cut by a power loss leaves them: sealed as this copy holds them");
                }
                true
            }
            Err(e) => {
                tracing::warn!(me = %self.me, %oid, "cannot mend the copy: {e}");
                false
            }
        }
    }

    pub(crate) async fn digests_of(
        &self,
        nodes: &[NodeId],
        oid: ObjectId,
        len: u32,
        epoch: Epoch,
        by: DigestBy,
    ) -> Vec<(NodeId, ObjDigest)> {
        let asks = nodes.iter().map(|&n| async move {
            let req = PeerReq::Digest {
                oids: vec![oid],
                len,
                epoch,
                read: by.to_wire(),
            };
            match self.short_call(n, req).await {
                Ok((PeerResp::Digests(d), _)) if d.len() == 1 => Some((n, d[0])),
                Ok(_) => None,
                Err(e) => {
                    tracing::debug!(me = %self.me, %oid, node = %n, "no digest: {e}");
                    None
                }
            }
        });
        join_all(asks).await.into_iter().flatten().collect()
    }

    /// Replace the local copy of `oid` with `src`'s and mark it current.
    async fn copy(
        &self,
        oid: ObjectId,
        len: u32,
        src: NodeId,
        force: bool,
        limited: bool,
    ) -> Result<()> {
        let epoch = self.view().map.epoch;
        let req = PeerReq::Fetch {
            oid,
            len,
            epoch,
            force,
        };
        let t0 = Instant::now();
        let (resp, data) = self.pool.call(src, req, Bytes::new()).await?;
        let fetch_ms = t0.elapsed().as_millis();
        let PeerResp::Object { present, version } = resp else {
            return Err(Error::invalid(format!(
                "Node {src} sent a malformed answer for object {oid}"
            )));
        };
        if data.len() != len as usize {
            return Err(Error::invalid(format!(
                "Node {src} sent {} bytes of object {oid}, not {len}",
                data.len()
            )));
        }
        if !present {
            // "Missing" is an answer only from a node the object is placed on now. A
            // node it moved away from (a holder of an earlier listing) has dropped
            // its copy and, holding nothing, is not behind on it either: taken as a
            // source, its "missing" deleted the last good copies (found by the
            // simulator, `drove sim faults --seed 213`).
            let view = self.view();
            let placed = view
                .vdis
                .get(&oid.vdi)
                .is_some_and(|v| locate_vdi(&view.map, v, oid).contains(&src));
            if !placed {
                return Err(Error::unavailable(format!(
                    "Node {src} no longer holds object {oid}: not a source"
                )));
            }
        }
        if limited {
            self.throttle(data.len() as u64).await;
        }
        let cu = self.local.catchup();
        let _held = cu.copy_lock(oid).await;
        // Flushed before the copy counts as current, in a bulk pass too: other
        // nodes take its version as a promise of every write up to it. Flushed
        // only at the end of the pass (the disk writing it back meanwhile), a copy
        // torn by a power loss kept its version without its blocks and was chosen
        // as the source over the copies that had the writes (`drove sim faults
        // --seed 263 --time 20s --meta raft`: nodes 7 and 8, recovered without a
        // flush before the whole site lost power, replaced node 1's copy, and
        // writes acknowledged durable were gone).
        let written = blocking(self.local.store(), move |s| {
            let n = if present {
                s.replace(oid, &data, version)?
            } else {
                // Missing there, so missing here: a clone's missing object reads its
                // parent's data, an all-zero one does not.
                s.delete(oid)?;
                0
            };
            s.flush(&[oid])?;
            Ok(n)
        })
        .await?;
        cu.mark_current(oid);
        self.count(|p| p.bytes += written);
        tracing::debug!(me = %self.me, %oid, from = %src, bytes = written, fetch_ms, write_ms = t0.elapsed().as_millis() - fetch_ms, "object recovered");
        Ok(())
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

impl Recoverer {
    fn note_absent(&self, epoch: Epoch, oid: ObjectId) {
        let mut a = self.absent.lock();
        if a.0 != epoch {
            *a = (epoch, HashSet::new());
        }
        if a.1.len() < ABSENT_KEPT {
            a.1.insert(oid);
        }
    }
}

impl Repair for Recoverer {
    fn repair(&self, oid: ObjectId) -> BoxFuture<'_, Result<()>> {
        Box::pin(self.recover(oid, false))
    }

    fn absence_known(&self, oid: ObjectId, at: Epoch) -> bool {
        let view = self.view();
        let epoch = view.map.epoch;
        if epoch != at {
            return false;
        }
        {
            let a = self.absent.lock();
            if a.0 == epoch && a.1.contains(&oid) {
                return true;
            }
        }
        // A host that lost power since its last clean epoch may have lost a copy
        // it had not flushed (one recovery wrote, or one created by a write not
        // yet flushed): until it is clean again its "nothing here" says nothing,
        // and the object is recovered first (a read of it here would otherwise
        // answer zeros for writes another copy has). Asked before the walk over
        // the epoch history below, which it makes moot.
        if self.local.catchup().lost_unflushed() || view.absence_unsure(self.me, oid) {
            return false;
        }
        self.note_absent(epoch, oid);
        true
    }

    fn confirm_absent(&self, oid: ObjectId, at: Epoch) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let epoch = self.view().map.epoch;
            if epoch > at {
                return Err(Error::new(
                    ErrorKind::StaleEpoch,
                    format!(
                        "Request from epoch {at}; this node is at epoch {epoch}, on whose \
                         map it answers for its absent copy of object {oid}"
                    ),
                ));
            }
            if self.absence_known(oid, epoch) {
                return Ok(());
            }
            tracing::debug!(me = %self.me, %oid, "no copy here and a node that held it is down: recovering it first");
            self.local.catchup().mark_pending(oid);
            self.recover(oid, false).await?;
            self.note_absent(epoch, oid);
            Ok(())
        })
    }

    fn repair_from(&self, oid: ObjectId, len: u32, from: NodeId) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            if from == self.me {
                // This copy is to win: one not known current is recovered first, as
                // any would be. Marked current as it stood, it once replaced the
                // copies of nodes that took later writes and were not asked
                // (`drove sim faults --seed 672 --time 40s`). One that fails its
                // checksums is recovered as a scrub's would be, its rotten blocks
                // mended from the other copies: known current, it was left as it
                // was.
                let d = self.local.digest(oid, len, DigestBy::Reading).await?;
                if d.corrupt {
                    return self.recover_rotten(oid, len).await;
                }
                return self.recover(oid, false).await;
            }
            let slot = self.slot(oid);
            let _one = slot.lock().await;
            self.copy(oid, len, from, true, false).await
        })
    }
}

/// Whether a peer's answer comes from a node that has not been clean since it
/// started, with nothing to show it kept its page cache: a copy, or the absence of
/// one, not known current, on a node whose clean epoch is 0 (a host back from a
/// power loss reports 0 until its recovery is done; so does a new node, whose
/// copies were fetched from others, and a node on a new, empty disk, whose "none
/// here" says nothing of the writes the old disk took: `drove sim faults --meta
/// raft --seed 9679 --time 20s` took such an answer as the witness of an epoch,
/// and a copy that lost a write to a power loss replaced the one copy holding it).
fn unsure_since_boot(d: &ObjDigest) -> bool {
    !d.current && d.clean_epoch == Epoch(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node not clean since it started (clean epoch 0, its copy not known
    /// current) answers unsure, with a copy or with none (seed 9679: "none here"
    /// from a new, empty disk); a clean node's answer, or a copy known current, is
    /// sure.
    #[test]
    fn test_an_answer_from_a_node_not_clean_since_it_started_is_unsure_copy_or_none() {
        let d = |present, current, clean| ObjDigest {
            present,
            current,
            clean_epoch: Epoch(clean),
            crc: 0,
            corrupt: false,
            version: Default::default(),
        };
        assert!(unsure_since_boot(&d(true, false, 0)));
        assert!(
            unsure_since_boot(&d(false, false, 0)),
            "none here, new disk"
        );
        assert!(!unsure_since_boot(&d(false, false, 9)));
        assert!(!unsure_since_boot(&d(true, false, 9)));
        assert!(!unsure_since_boot(&d(true, true, 0)));
    }
}
