//! The gateway: the node serving a VDI, and its single writer. It finds an object's
//! replicas with `placement::locate` on the map it already holds (nothing is asked of
//! the metadata per I/O) and talks to them: the local store by a direct call, the
//! others through the [`PeerPool`].
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
//! - Reads go to the local replica when this node holds one, then to the others in
//!   placement order; a replica that fails (recovering, timed out, checksum
//!   mismatch) is skipped and the next one tried. A VDI that is `Gone` (deleted) is
//!   not read anywhere else.
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
use crate::{MapCell, PeerPool};

/// Coordinates the replicas of the objects of the VDIs this node serves.
pub struct Gateway {
    me: NodeId,
    local: Arc<LocalStore>,
    pool: Arc<PeerPool>,
    map: Arc<MapCell>,
    locks: RangeLocks,
    metrics: Arc<Metrics>,
    membership: std::sync::OnceLock<Arc<dyn Membership>>,
}

/// How a gateway tells the cluster that replicas failed a write it is about to
/// acknowledge without them (implemented over the metadata by the daemon).
pub trait Membership: Send + Sync {
    /// Mark `nodes` down and return once the change is committed; `silent`: they
    /// stopped answering (rather than answered with errors), so they are held down
    /// for the cluster's hold-down.
    fn mark_down(&self, nodes: Vec<NodeId>, why: String, silent: bool)
        -> BoxFuture<'_, Result<()>>;
}

/// How long a gateway waits for its map to move past an epoch a replica refused.
const MAP_WAIT: Duration = Duration::from_secs(5);

impl Gateway {
    /// A gateway on node `me` over its `local` store.
    pub fn new(
        me: NodeId,
        local: Arc<LocalStore>,
        pool: Arc<PeerPool>,
        map: Arc<MapCell>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Gateway {
            me,
            local,
            pool,
            map,
            locks: RangeLocks::default(),
            metrics,
            membership: std::sync::OnceLock::new(),
        })
    }

    /// Let writes proceed with `min_copies` replicas by marking failed ones down.
    /// Without it, a write fails when any replica fails.
    pub fn set_membership(&self, m: Arc<dyn Membership>) {
        let _ = self.membership.set(m);
    }

    /// The replicas of `oid` on `map`, or an error when fewer than the VDI's
    /// `min_copies` nodes are up.
    fn replicas_on(&self, map: &ClusterMap, vdi: &VdiInfo, oid: ObjectId) -> Result<Vec<NodeId>> {
        let nodes = drove_placement::locate_vdi(map, vdi, oid);
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

    /// Accept that `failed` replicas missed a request the others applied: at least
    /// `min_copies` did, and the failed ones are marked down first, so they recover
    /// before serving the object again.
    async fn degrade(
        &self,
        vdi: &VdiInfo,
        applied: usize,
        mut failed: Vec<(NodeId, Error)>,
    ) -> Result<()> {
        if failed.is_empty() {
            return Ok(());
        }
        let fatal = failed.iter().position(|(_, e)| {
            matches!(
                e.kind(),
                ErrorKind::Locked
                    | ErrorKind::Fenced
                    | ErrorKind::Invalid
                    | ErrorKind::NotFound
                    | ErrorKind::Gone
            )
        });
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
        m.mark_down(nodes.clone(), why, silent).await?;
        // Reads must not go to them from here on: wait for the map that says so.
        let end = tokio::time::Instant::now() + MAP_WAIT;
        loop {
            let map = self.map.get();
            let all_down = nodes.iter().all(|n| {
                map.node(*n)
                    .is_none_or(|x| x.state != drove_types::NodeState::Up)
            });
            if all_down {
                return Ok(());
            }
            if tokio::time::Instant::now() >= end {
                return Err(Error::unavailable(
                    "Failed replicas were marked down but this gateway's map does not show it",
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The replicas on `map` in the order reads try them: this node first.
    fn read_order_on(&self, map: &ClusterMap, vdi: &VdiInfo, oid: ObjectId) -> Vec<NodeId> {
        let nodes = drove_placement::locate_vdi(map, vdi, oid);
        read_order(map, self.me, nodes)
    }

    async fn send(&self, node: NodeId, req: PeerReq, payload: Bytes) -> Result<(PeerResp, Bytes)> {
        if node == self.me {
            let (resp, payload) =
                crate::local::apply_and_forward(&self.local, &self.pool, &req, payload).await?;
            crate::local::into_result(resp, payload)
        } else {
            self.pool.call(node, req, payload).await
        }
    }

    /// Whether `node` answers on the peer protocol.
    pub async fn ping(&self, node: NodeId) -> Result<()> {
        let epoch = self.map.get().epoch;
        self.send(node, PeerReq::Ping { epoch }, Bytes::new())
            .await
            .map(|_| ())
    }

    /// Read `len` bytes of `oid` at `offset` from the nearest replica that answers.
    pub async fn read(&self, vdi: &VdiInfo, oid: ObjectId, offset: u64, len: u32) -> Result<Bytes> {
        loop {
            let map = self.map.get();
            let mut last = Error::unavailable(format!("No node holds object {oid}"));
            for node in self.read_order_on(&map, vdi, oid) {
                let req = PeerReq::Read {
                    oid,
                    offset,
                    len,
                    epoch: map.epoch,
                };
                match self.send(node, req, Bytes::new()).await {
                    Ok((_, data)) if data.len() == len as usize => return Ok(data),
                    Ok((_, data)) => {
                        last = Error::new(
                            drove_types::ErrorKind::Io,
                            format!("Node {node} returned {} bytes, not {len}", data.len()),
                        );
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::StaleEpoch | ErrorKind::Gone) => {
                        last = e;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(%oid, %node, "read failed, trying next replica: {e}");
                        last = e;
                    }
                }
            }
            match last.kind() {
                ErrorKind::StaleEpoch => self.newer_map(map.epoch).await?,
                _ => return Err(last),
            }
        }
    }

    /// Write `data` into `oid` at `offset` on every replica, under lock `generation`.
    pub async fn write(
        &self,
        vdi: &VdiInfo,
        oid: ObjectId,
        offset: u64,
        data: Bytes,
        fua: bool,
        generation: u64,
    ) -> Result<()> {
        let _order = self.locks.lock(oid, offset, data.len() as u64).await;
        self.fan_out(vdi, oid, data, |epoch, forward| PeerReq::Write {
            oid,
            offset,
            fua,
            epoch,
            generation,
            forward,
        })
        .await
    }

    /// Make `[offset, offset+len)` of `oid` read as zeros on every replica, under
    /// lock `generation`.
    pub async fn write_zeroes(
        &self,
        vdi: &VdiInfo,
        oid: ObjectId,
        offset: u64,
        len: u64,
        fua: bool,
        generation: u64,
    ) -> Result<()> {
        let _order = self.locks.lock(oid, offset, len).await;
        self.fan_out(vdi, oid, Bytes::new(), |epoch, forward| {
            PeerReq::WriteZeroes {
                oid,
                offset,
                len,
                fua,
                epoch,
                generation,
                forward,
            }
        })
        .await
    }

    /// Replace `oid` by `data` on every replica, atomically on each (a clone's
    /// copy-up), under lock `generation`.
    pub async fn create(
        &self,
        vdi: &VdiInfo,
        oid: ObjectId,
        data: Bytes,
        generation: u64,
    ) -> Result<()> {
        let _order = self.locks.lock(oid, 0, u64::from(vdi.object_size)).await;
        self.fan_out(vdi, oid, data, |epoch, forward| PeerReq::Create {
            oid,
            epoch,
            generation,
            forward,
        })
        .await
    }

    /// Send a write to the replicas of `oid` on the current map. A replica past
    /// this map's epoch makes the whole write go again on the newer map (writes are
    /// idempotent, and the range lock keeps overlapping ones in order).
    async fn fan_out(
        &self,
        vdi: &VdiInfo,
        oid: ObjectId,
        payload: Bytes,
        make: impl Fn(Epoch, Vec<NodeId>) -> PeerReq,
    ) -> Result<()> {
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
                    Ok(_) => return Ok(()),
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
                let sends = replicas
                    .iter()
                    .map(|&n| self.send(n, make(map.epoch, Vec::new()), payload.clone()));
                let results = join_all(sends).await;
                self.settle(vdi, &replicas, results).await
            };
            match res {
                Err(e) if e.kind() == ErrorKind::StaleEpoch => self.newer_map(map.epoch).await?,
                other => return other,
            }
        }
    }

    /// Judge the answers of `nodes` to one request: success, a retry on a newer
    /// map (`StaleEpoch`), or success without the failed ones when enough applied it.
    async fn settle(
        &self,
        vdi: &VdiInfo,
        nodes: &[NodeId],
        results: Vec<Result<(PeerResp, Bytes)>>,
    ) -> Result<()> {
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
    pub async fn flush(&self, vdi: &VdiInfo, oids: &[ObjectId]) -> Result<()> {
        loop {
            let map = self.map.get();
            match self.flush_on(&map, vdi, oids).await {
                Err(e) if e.kind() == ErrorKind::StaleEpoch => self.newer_map(map.epoch).await?,
                other => return other,
            }
        }
    }

    async fn flush_on(&self, map: &ClusterMap, vdi: &VdiInfo, oids: &[ObjectId]) -> Result<()> {
        let mut by_node: BTreeMap<NodeId, Vec<ObjectId>> = BTreeMap::new();
        for &oid in oids {
            for node in self.replicas_on(map, vdi, oid)? {
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
            return Ok(());
        }
        // Each object must have reached min_copies of its replicas.
        let bad: Vec<NodeId> = failed.iter().map(|(n, _)| *n).collect();
        let worst = oids
            .iter()
            .map(|&o| {
                drove_placement::locate_vdi(map, vdi, o)
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
            match self.exists_on(&map, vdi, oids).await {
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

/// Order `replicas` for reading from node `me`: itself, then nodes of its zone, then
/// the others, each group in placement order (a stable sort keeps it).
fn read_order(map: &drove_types::ClusterMap, me: NodeId, mut replicas: Vec<NodeId>) -> Vec<NodeId> {
    let my_zone = map.node(me).map(|n| n.zone.as_str());
    replicas.sort_by_key(|&n| {
        if n == me {
            0
        } else if map.node(n).map(|x| x.zone.as_str()) == my_zone {
            1
        } else {
            2
        }
    });
    replicas
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::{ClusterMap, NodeInfo};

    fn map(zones: &[&str]) -> ClusterMap {
        let mut m = ClusterMap::default();
        for (i, z) in zones.iter().enumerate() {
            let id = NodeId(i as u64 + 1);
            m.nodes.insert(id, NodeInfo::new(id, *z));
        }
        m
    }

    #[test]
    fn test_reads_prefer_self_then_own_zone_then_placement_order() {
        let m = map(&["a", "b", "a", "b"]);
        let ids = |v: &[u64]| v.iter().map(|&i| NodeId(i)).collect::<Vec<_>>();
        assert_eq!(read_order(&m, NodeId(1), ids(&[4, 3, 1])), ids(&[1, 3, 4]));
        assert_eq!(read_order(&m, NodeId(1), ids(&[4, 2, 3])), ids(&[3, 4, 2]));
        assert_eq!(read_order(&m, NodeId(2), ids(&[3, 1, 4])), ids(&[4, 3, 1]));
        // A gateway outside the map (not yet joined) keeps placement order.
        assert_eq!(read_order(&m, NodeId(9), ids(&[3, 1])), ids(&[3, 1]));
    }
}
