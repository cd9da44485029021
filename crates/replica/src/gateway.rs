//! The gateway: the node serving a VDI, and its single writer. It finds an object's
//! replicas with `placement::locate` on the map it already holds (nothing is asked of
//! the metadata per I/O) and talks to them: the local store by a direct call, the
//! others through the [`Transport`] (the TCP [`crate::PeerPool`] in production, a
//! simulated network in the simulator).
//!
//! - Writes are acknowledged when every replica of the VDI's policy has them (with
//!   FUA: has fsynced the object). When some fail but at least the VDI's
//!   `min_copies` applied it, the failed ones are first marked down in the metadata
//!   ([`Membership`]), so they recover before serving the object again; below
//!   `min_copies` the write fails.
//! - Every request carries the epoch of the gateway's map. A replica that is past it
//!   refuses (`StaleEpoch`); the gateway waits for the newer map and sends the
//!   request again to the replicas of that map (reads, exists and flushes too: a node
//!   that no longer holds an object must not answer for it).
//! - Reads go to the nearest replica first ([`read_order`]): the local one when this
//!   node holds one, then those of its zone, then the others by measured round
//!   trip. A replica slow to answer is hedged once: after a delay derived from its
//!   round trip (see [`read`]) the next replica is asked too, and the first good
//!   answer wins. A replica that fails (recovering, timed out, checksum mismatch) is
//!   skipped and the next one tried. A VDI that is `Gone` (deleted) is not read
//!   anywhere else.
use bytes::Bytes;
use drove_metrics::Metrics;
use drove_proto::{PeerReq, PeerResp};
use drove_types::{
    ClusterMap, Epoch, Error, ErrorKind, NodeId, ObjectId, ReplicationMode, Result, VdiInfo,
};
use futures::future::{join_all, BoxFuture};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::local::LocalStore;
use crate::ranges::RangeLocks;
use crate::ship::{Lanes, Op};
use crate::{MapCell, Transport};

#[path = "moved.rs"]
mod moved;
mod read;
#[path = "zoned.rs"]
mod zoned;
pub use crate::ship::Lag;
use read::read_order;
pub(crate) use zoned::again;

/// Coordinates the replicas of the objects of the VDIs this node serves.
pub struct Gateway {
    me: NodeId,
    local: Arc<LocalStore>,
    pool: Arc<dyn Transport>,
    map: Arc<MapCell>,
    locks: RangeLocks,
    metrics: Arc<Metrics>,
    membership: std::sync::OnceLock<Arc<dyn Membership>>,
    /// Zone-sync: the writes the copies outside the home zone are still owed.
    lanes: Lanes,
    /// This gateway, for the lane workers it starts.
    this: std::sync::Weak<Gateway>,
    /// Where objects are placed on the current map.
    placed: crate::placecache::PlaceCache,
    /// Replicas that went silent and answered a ping, and when ([`FORGIVE_FOR`];
    /// tokio's clock, which the simulator drives).
    forgiven: parking_lot::Mutex<std::collections::HashMap<NodeId, tokio::time::Instant>>,
}

/// How a gateway tells the cluster that replicas failed a write it is about to
/// acknowledge without them (implemented over the metadata by the daemon).
pub trait Membership: Send + Sync {
    /// Mark `nodes` down and return once the change is committed; `silent`: they
    /// stopped answering (rather than answered with errors), so they are held down
    /// for the cluster's hold-down. `seen`: the epoch of the map the verdict was
    /// made on; the metadata refuses it (`StaleEpoch`) when this node has been
    /// marked down since.
    fn mark_down(
        &self,
        nodes: Vec<NodeId>,
        why: String,
        silent: bool,
        seen: Epoch,
    ) -> BoxFuture<'_, Result<()>>;
}

/// How long a gateway waits for its map to move past an epoch a replica refused.
const MAP_WAIT: Duration = Duration::from_secs(5);

/// A replica that went silent and answered a ping is spared a mark-down once in
/// this long; failing again within it, it is marked down without a ping.
const FORGIVE_FOR: Duration = Duration::from_secs(5);

/// How long a ping to a replica that went silent may take: enough for a fresh
/// connection (TCP, TLS and hello: three round trips) on a busy machine, short
/// enough that a silent replica is marked down within about 1.5 s of going quiet
/// (1 s of silence floor, this, then the commit).
fn probe_within(rtt_high: Option<Duration>) -> Duration {
    const FLOOR: Duration = Duration::from_millis(300);
    const MAX: Duration = Duration::from_secs(2);
    (FLOOR + rtt_high.unwrap_or_default() * 4).min(MAX)
}

/// The tally of a request some replicas failed ([`Gateway::degrade`]): what the
/// gateway does with it. (A write's tally is not a repair: "settle" is the
/// post-crash repair of a VDI's replicas, see docs/glossary.md.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tally {
    /// Every replica applied it: acknowledge.
    Done,
    /// A replica that went silent answers again: send the request again on the
    /// same map.
    Again,
}

impl Gateway {
    /// A gateway on node `me` over its `local` store.
    pub fn new(
        me: NodeId,
        local: Arc<LocalStore>,
        pool: Arc<dyn Transport>,
        map: Arc<MapCell>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|this| Gateway {
            me,
            local,
            pool,
            map,
            locks: RangeLocks::default(),
            metrics,
            membership: std::sync::OnceLock::new(),
            lanes: Lanes::default(),
            this: this.clone(),
            placed: Default::default(),
            forgiven: Default::default(),
        })
    }

    /// The replicas of `oid` of `vdi` on `map` ([`drove_placement::locate_vdi`]),
    /// remembered for the current map.
    pub(crate) fn locate(&self, map: &ClusterMap, vdi: &VdiInfo, oid: ObjectId) -> Vec<NodeId> {
        self.placed.locate(&self.map, map, vdi, oid)
    }

    /// Let writes proceed with `min_copies` replicas by marking failed ones down.
    /// Without it, a write fails when any replica fails.
    pub fn set_membership(&self, m: Arc<dyn Membership>) {
        let _ = self.membership.set(m);
    }

    /// The replicas of `oid` on `map`, or an error when fewer than the VDI's
    /// `min_copies` nodes are up.
    fn replicas_on(&self, map: &ClusterMap, vdi: &VdiInfo, oid: ObjectId) -> Result<Vec<NodeId>> {
        let nodes = self.locate(map, vdi, oid);
        if nodes.len() < usize::from(vdi.min_copies()) {
            return Err(Error::unavailable(format!(
                "VDI '{}' needs at least {} of its {} copies but only {} nodes are up",
                vdi.name,
                vdi.min_copies(),
                vdi.copies,
                nodes.len()
            )));
        }
        Ok(nodes)
    }

    /// Wait until the map is newer than `epoch` (a replica said it was stale).
    async fn newer_map(&self, epoch: Epoch) -> Result<()> {
        let end = tokio::time::Instant::now() + MAP_WAIT;
        while self.map.get().epoch <= epoch {
            if tokio::time::Instant::now() >= end {
                return Err(Error::unavailable(format!(
                    "Replicas are past epoch {epoch} but this gateway has no newer map"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Whether a request the replicas on `map` applied may be acknowledged: only
    /// when this gateway's map is still `map`. Else a
    /// [`ErrorKind::StaleEpoch`] error sends it again on the new one: a replica that
    /// applied it on `map` may since have been marked down and up again and have
    /// replaced its copy with one without it (a returning node's copies are all
    /// recovered). Writes are idempotent and the range lock keeps them in order.
    pub(crate) fn still_on(&self, map: &ClusterMap) -> Result<()> {
        let now = self.map.get().epoch;
        if now == map.epoch {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::StaleEpoch,
            format!(
                "The map moved from epoch {} to {now} during the request: it goes again",
                map.epoch
            ),
        ))
    }

    /// Accept that `failed` replicas missed a request the others applied: at least
    /// `min_copies` did, and the failed ones are marked down first, so they recover
    /// before serving the object again. Once they are, the request is not
    /// acknowledged yet: a [`ErrorKind::StaleEpoch`] error makes the caller send it
    /// again on the new map. The replicas that applied it did so on an older map,
    /// and may since have been marked down and up again by others and have
    /// replaced their copies with ones that lack it (`drove sim faults --seed 21
    /// --faults cut`: a gateway cut off with its zone wrote to the replicas there,
    /// and marked the others down after the cut healed, by which time the detector
    /// had marked its zone down and up and those copies had been recovered).
    ///
    /// A replica that failed by going silent (a pause, a cut) is first pinged
    /// ([`Gateway::answer_again`]): when it answers now, nothing is marked down and
    /// the request goes again on the same map ([`Tally::Again`]).
    async fn degrade(
        &self,
        vdi: &VdiInfo,
        applied: usize,
        mut failed: Vec<(NodeId, Error)>,
    ) -> Result<Tally> {
        if failed.is_empty() {
            return Ok(Tally::Done);
        }
        // Final for the write: the lock moved, the request is wrong, the VDI is
        // gone, or a replica's disk is full. A full disk is not a failed node:
        // marking it down would only move its objects onto disks that fill up in
        // turn (and a cluster sharing one full disk would mark every node down and
        // fail reads too). The client gets ENOSPC instead (QEMU's werror=enospc
        // pauses the VM) until space is freed.
        let fatal = failed.iter().position(|(_, e)| {
            matches!(
                e.kind(),
                ErrorKind::Locked
                    | ErrorKind::Fenced
                    | ErrorKind::Invalid
                    | ErrorKind::NotFound
                    | ErrorKind::Gone
                    | ErrorKind::NoSpace
            )
        });
        // Before failing the request or marking anything down: a replica that went
        // silent may answer again (also when too few copies applied it to go on).
        if fatal.is_none() && self.answer_again(&failed).await {
            return Ok(Tally::Again);
        }
        let enough = applied >= usize::from(vdi.min_copies());
        let m = self.membership.get().filter(|_| enough && fatal.is_none());
        let Some(m) = m else {
            let i = fatal.unwrap_or(0);
            return Err(failed.swap_remove(i).1);
        };
        let nodes: Vec<NodeId> = failed.iter().map(|(n, _)| *n).collect();
        let silent = nodes
            .iter()
            .any(|&n| self.pool.silent_within(n, Duration::from_secs(10)));
        for &n in &nodes {
            let cause = if self.pool.silent_within(n, Duration::from_secs(10)) {
                "silent"
            } else {
                "error"
            };
            self.metrics.gateway_markdown(&n.to_string(), cause);
        }
        let why = failed
            .iter()
            .map(|(n, e)| format!("node {n}: {e}"))
            .collect::<Vec<_>>()
            .join("; ");
        let why = format!("by gateway node {}: {why}", self.me);
        tracing::warn!(vdi = %vdi.name, "replicas failed, marking them down {why}");
        let seen = self.map.get().epoch;
        m.mark_down(nodes.clone(), why, silent, seen).await?;
        // Reads must not go to them from here on: wait for the map that says so.
        let end = tokio::time::Instant::now() + MAP_WAIT;
        loop {
            let map = self.map.get();
            let all_down = nodes.iter().all(|n| {
                map.node(*n)
                    .is_none_or(|x| x.state != drove_types::NodeState::Up)
            });
            if all_down {
                return Err(Error::new(
                    ErrorKind::StaleEpoch,
                    "Failed replicas were marked down: the request goes again on the new map",
                ));
            }
            if tokio::time::Instant::now() >= end {
                return Err(Error::unavailable(
                    "Failed replicas were marked down but this gateway's map does not show it",
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Whether some replica that failed a request by going silent answers a ping
    /// now, so that the request may go again instead of marking it down: a pause
    /// just past the silence floor, or a cut that healed while the request waited,
    /// must not cost an epoch and a recovery. Only once per node in
    /// [`FORGIVE_FOR`]: a node that fails again soon after answering is marked down.
    /// The others are left to fail again on the resend (at once, for the silent).
    async fn answer_again(&self, failed: &[(NodeId, Error)]) -> bool {
        let recent = |n: NodeId| {
            self.forgiven
                .lock()
                .get(&n)
                .is_some_and(|t| t.elapsed() < FORGIVE_FOR)
        };
        let silent: Vec<NodeId> = failed
            .iter()
            .filter(|(n, e)| {
                e.kind() == ErrorKind::Unavailable
                    && self.pool.silent_within(*n, FORGIVE_FOR)
                    && !recent(*n)
            })
            .map(|(n, _)| *n)
            .collect();
        if silent.is_empty() {
            return false;
        }
        let epoch = self.map.get().epoch;
        let asks = silent.iter().map(|&n| {
            let within = probe_within(self.pool.rtt_high(n));
            async move { (n, self.pool.probe(n, epoch, within).await) }
        });
        let mut again = false;
        for (n, res) in join_all(asks).await {
            match res {
                Ok(()) => {
                    tracing::info!(node = %n, "a replica that went silent answers again: the request goes again, nothing is marked down");
                    self.metrics.gateway_spared(&n.to_string());
                    self.forgiven.lock().insert(n, tokio::time::Instant::now());
                    again = true;
                }
                Err(e) => {
                    tracing::info!(node = %n, "a replica that went silent does not answer a ping: {e}")
                }
            }
        }
        again
    }

    async fn send(&self, node: NodeId, req: PeerReq, payload: Bytes) -> Result<(PeerResp, Bytes)> {
        if node == self.me {
            let (resp, payload) =
                crate::local::apply_and_forward(&self.local, self.pool.as_ref(), &req, payload)
                    .await?;
            crate::local::into_result(resp, payload)
        } else {
            self.pool.call(node, req, payload).await
        }
    }

    /// Whether `node` answers on the peer protocol, and the incarnation of the
    /// process that answered (`None` from a node that does not say).
    pub async fn ping(&self, node: NodeId) -> Result<Option<u64>> {
        let epoch = self.map.get().epoch;
        let (resp, _) = self
            .send(node, PeerReq::Ping { epoch }, Bytes::new())
            .await?;
        Ok(match resp {
            PeerResp::Pong { incarnation } => Some(incarnation),
            _ => None,
        })
    }

    /// Write `data` into `oid` at `offset` on every replica, under lock `generation`.
    pub async fn write(
        self: &Arc<Self>,
        vdi: &VdiInfo,
        oid: ObjectId,
        offset: u64,
        data: Bytes,
        fua: bool,
        generation: u64,
    ) -> Result<()> {
        let order = self.locks.lock(oid, offset, data.len() as u64).await;
        let op = Op::Write { offset, data };
        self.fan_out_ordered(order, vdi, oid, op, fua, generation)
            .await
    }

    /// Make `[offset, offset+len)` of `oid` read as zeros on every replica, under
    /// lock `generation`.
    pub async fn write_zeroes(
        self: &Arc<Self>,
        vdi: &VdiInfo,
        oid: ObjectId,
        offset: u64,
        len: u64,
        fua: bool,
        generation: u64,
    ) -> Result<()> {
        let order = self.locks.lock(oid, offset, len).await;
        let op = Op::Zeroes { offset, len };
        self.fan_out_ordered(order, vdi, oid, op, fua, generation)
            .await
    }

    /// Replace `oid` by `data` on every replica, atomically on each (a clone's
    /// copy-up), under lock `generation`.
    pub async fn create(
        self: &Arc<Self>,
        vdi: &VdiInfo,
        oid: ObjectId,
        data: Bytes,
        generation: u64,
    ) -> Result<()> {
        let order = self.locks.lock(oid, 0, u64::from(vdi.object_size)).await;
        let op = Op::Create { data };
        self.fan_out_ordered(order, vdi, oid, op, false, generation)
            .await
    }

    /// [`Gateway::fan_out`] in a task of its own that holds `order`, the write's
    /// range lock, until every replica answered, even when the caller stops
    /// waiting (a write of several objects that failed on one, a write that
    /// outlived its lease, a client gone). Run in the caller's future, the
    /// fan-out was dropped with it and the range lock given up while its
    /// requests were still on their way: the next write to the same bytes then
    /// went out beside them, and a replica could apply the two in either order,
    /// keeping the older bytes under an acknowledged write.
    async fn fan_out_ordered(
        self: &Arc<Self>,
        order: crate::ranges::RangeGuard,
        vdi: &VdiInfo,
        oid: ObjectId,
        op: Op,
        fua: bool,
        generation: u64,
    ) -> Result<()> {
        let me = self.clone();
        let vdi = vdi.clone();
        tokio::spawn(async move {
            let _order = order;
            me.fan_out(&vdi, oid, op, fua, generation).await
        })
        .await
        .map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("The write of object {oid} stopped: {e}"),
            )
        })?
    }

    /// Send a write to the replicas of `oid` on the current map. A replica past
    /// this map's epoch makes the whole write go again on the newer map (writes are
    /// idempotent, and the range lock keeps overlapping ones in order). A zone-sync
    /// VDI's write (or any write of a VDI whose lane still has writes to ship) goes
    /// by [`Gateway::fan_out_zoned`].
    async fn fan_out(
        &self,
        vdi: &VdiInfo,
        oid: ObjectId,
        op: Op,
        fua: bool,
        generation: u64,
    ) -> Result<()> {
        let payload = op.payload();
        self.metrics.wan().written(match &op {
            Op::Zeroes { len, .. } => *len,
            _ => payload.len() as u64,
        });
        let lagging = self.lanes.get(vdi.id).is_some_and(|l| l.pending());
        if vdi.zone_sync() || lagging {
            return self.fan_out_zoned(vdi, oid, op, fua, generation).await;
        }
        let make = |epoch, forward| op.request(oid, fua, generation, epoch, epoch, forward);
        let mut primary_failed = false;
        loop {
            let map = self.map.get();
            let replicas = self.replicas_on(&map, vdi, oid)?;
            let res = if vdi.mode == ReplicationMode::PrimaryCopy && !primary_failed {
                let (first, rest) = (replicas[0], replicas[1..].to_vec());
                match self
                    .send(first, make(map.epoch, rest), payload.clone())
                    .await
                {
                    Ok(_) => self.still_on(&map),
                    Err(e) if e.kind() == ErrorKind::StaleEpoch => Err(e),
                    Err(e) if matches!(e.kind(), ErrorKind::Fenced | ErrorKind::Gone) => {
                        return Err(e)
                    }
                    Err(e) => {
                        // Some replica failed behind the primary: find out which
                        // by sending to each directly.
                        tracing::debug!(%oid, "primary-copy write failed, going direct: {e}");
                        primary_failed = true;
                        continue;
                    }
                }
            } else {
                let results = self.send_by_zone(&map, &replicas, &make, &payload).await;
                match self.tally(vdi, &replicas, results).await {
                    Ok(Tally::Again) => continue,
                    Ok(Tally::Done) => self.still_on(&map),
                    Err(e) => Err(e),
                }
            };
            match res {
                Err(e) if e.kind() == ErrorKind::StaleEpoch => self.newer_map(map.epoch).await?,
                other => return other,
            }
        }
    }

    /// Tally the answers of `nodes` to one request: success, a retry on a newer
    /// map (`StaleEpoch`), or success without the failed ones when enough applied it.
    async fn tally(
        &self,
        vdi: &VdiInfo,
        nodes: &[NodeId],
        results: Vec<Result<(PeerResp, Bytes)>>,
    ) -> Result<Tally> {
        let mut applied = 0;
        let mut failed = Vec::new();
        for (&n, r) in nodes.iter().zip(results) {
            match r {
                Ok(_) => applied += 1,
                Err(e) if e.kind() == ErrorKind::StaleEpoch => return Err(e),
                Err(e) => failed.push((n, e)),
            }
        }
        self.degrade(vdi, applied, failed).await
    }

    /// fsync `oids` on every replica that holds them; a replica that fails is
    /// marked down when every object still reached `min_copies` replicas. A replica
    /// past this gateway's map makes the whole flush go again on the newer map (the
    /// objects' replicas may have moved).
    /// For a zone-sync VDI that is the home-zone replicas (the others are made
    /// durable by [`Gateway::drain`]); a VDI that stopped being zone-sync first has
    /// its lane drained.
    pub async fn flush(&self, vdi: &VdiInfo, oids: &[ObjectId]) -> Result<()> {
        if !vdi.zone_sync() && self.lanes.get(vdi.id).is_some_and(|l| l.pending()) {
            self.drain(vdi).await?;
        }
        self.flush_where(vdi, oids, zoned::Reach::Acked).await
    }

    /// fsync `oids` on the replicas `reach` picks of each.
    async fn flush_where(
        &self,
        vdi: &VdiInfo,
        oids: &[ObjectId],
        reach: zoned::Reach,
    ) -> Result<()> {
        loop {
            let map = self.map.get();
            match self.flush_on(&map, vdi, oids, reach).await {
                Ok(Tally::Done) => return Ok(()),
                Ok(Tally::Again) => {}
                Err(e) if e.kind() == ErrorKind::StaleEpoch => self.newer_map(map.epoch).await?,
                Err(e) => return Err(e),
            }
        }
    }

    async fn flush_on(
        &self,
        map: &ClusterMap,
        vdi: &VdiInfo,
        oids: &[ObjectId],
        reach: zoned::Reach,
    ) -> Result<Tally> {
        let mut by_node: BTreeMap<NodeId, Vec<ObjectId>> = BTreeMap::new();
        for &oid in oids {
            for node in reach.pick(map, vdi, self.replicas_on(map, vdi, oid)?) {
                by_node.entry(node).or_default().push(oid);
            }
        }
        let nodes: Vec<NodeId> = by_node.keys().copied().collect();
        let sends = by_node.into_iter().map(|(node, oids)| async move {
            // A request names at most MAX_OIDS objects.
            for part in oids.chunks(drove_proto::MAX_OIDS) {
                let req = PeerReq::Flush {
                    oids: part.to_vec(),
                    epoch: map.epoch,
                };
                self.send(node, req, Bytes::new()).await?;
            }
            Ok::<(), Error>(())
        });
        let results = join_all(sends).await;
        let mut failed = Vec::new();
        for (&n, r) in nodes.iter().zip(results) {
            match r {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::StaleEpoch => return Err(e),
                Err(e) => failed.push((n, e)),
            }
        }
        if failed.is_empty() {
            return Ok(Tally::Done);
        }
        // Each object must have reached min_copies of its replicas.
        let bad: Vec<NodeId> = failed.iter().map(|(n, _)| *n).collect();
        let worst = oids
            .iter()
            .map(|&o| {
                self.locate(map, vdi, o)
                    .iter()
                    .filter(|n| !bad.contains(n))
                    .count()
            })
            .min()
            .unwrap_or(0);
        self.degrade(vdi, worst, failed).await
    }

    /// Whether each object was ever written, asking the nearest replica of each and
    /// falling back to the next one when a node does not answer. A replica past this
    /// gateway's map makes the whole question go again on the newer map.
    pub async fn exists(&self, vdi: &VdiInfo, oids: &[ObjectId]) -> Result<Vec<bool>> {
        loop {
            let map = self.map.get();
            let res = match self.exists_on(&map, vdi, oids).await {
                Err(e) if e.kind() == ErrorKind::Recovering && vdi.previous_home().is_some() => {
                    self.exists_moved(&map, vdi, oids).await
                }
                other => other,
            };
            match res {
                Err(e) if e.kind() == ErrorKind::StaleEpoch => self.newer_map(map.epoch).await?,
                other => return other,
            }
        }
    }

    async fn exists_on(
        &self,
        map: &ClusterMap,
        vdi: &VdiInfo,
        oids: &[ObjectId],
    ) -> Result<Vec<bool>> {
        let orders: Vec<Vec<NodeId>> = oids
            .iter()
            .map(|&o| self.read_order_on(map, vdi, o))
            .collect();
        let mut answer: Vec<Option<bool>> = vec![None; oids.len()];
        let mut last_err = None;
        for round in 0..usize::from(vdi.copies) {
            let mut by_node: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
            for (i, order) in orders.iter().enumerate() {
                if answer[i].is_none() {
                    if let Some(&n) = order.get(round) {
                        by_node.entry(n).or_default().push(i);
                    }
                }
            }
            if by_node.is_empty() {
                break;
            }
            let asks = by_node.into_iter().map(|(node, idx)| {
                let req = PeerReq::Exists {
                    oids: idx.iter().map(|&i| oids[i]).collect(),
                    epoch: map.epoch,
                };
                async move { (idx, self.send(node, req, Bytes::new()).await) }
            });
            for (idx, res) in join_all(asks).await {
                match res {
                    Ok((PeerResp::Exists(flags), _)) if flags.len() == idx.len() => {
                        for (i, f) in idx.into_iter().zip(flags) {
                            answer[i] = Some(f);
                        }
                    }
                    Ok(_) => last_err = Some(Error::invalid("Malformed exists answer")),
                    Err(e) if matches!(e.kind(), ErrorKind::StaleEpoch | ErrorKind::Gone) => {
                        return Err(e)
                    }
                    Err(e) => last_err = Some(e),
                }
            }
        }
        answer
            .into_iter()
            .map(|a| {
                a.ok_or_else(|| {
                    last_err
                        .take()
                        .unwrap_or_else(|| Error::unavailable("No replica answered"))
                })
            })
            .collect()
    }
}
