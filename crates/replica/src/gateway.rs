//! The gateway: the node serving a VDI, and its single writer. It finds an object's
//! replicas with `placement::locate` on the map it already holds (nothing is asked of
//! the metadata per I/O) and talks to them: the local store by a direct call, the
//! others through the [`PeerPool`].
//!
//! - Writes are acknowledged only when every replica of the VDI's policy has them;
//!   with FUA, only when every replica has fsynced the object.
//! - Reads go to the local replica when this node holds one, then to the others in
//!   placement order; a replica that fails (refused, timed out, checksum mismatch) is
//!   skipped and the next one tried.
use bytes::Bytes;
use drove_metrics::Metrics;
use drove_proto::{PeerReq, PeerResp};
use drove_types::{Error, NodeId, ObjectId, ReplicationMode, Result, VdiInfo};
use futures::future::join_all;
use std::collections::BTreeMap;
use std::sync::Arc;

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
    #[allow(dead_code)]
    metrics: Arc<Metrics>,
}

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
        })
    }

    /// The replicas of `oid`, all of them or an error when too few nodes are up.
    fn replicas(&self, vdi: &VdiInfo, oid: ObjectId) -> Result<Vec<NodeId>> {
        let map = self.map.get();
        let nodes = drove_placement::locate(&map, oid, usize::from(vdi.copies));
        if nodes.len() < usize::from(vdi.copies) {
            return Err(Error::unavailable(format!(
                "VDI '{}' needs {} copies but only {} nodes are up",
                vdi.name,
                vdi.copies,
                nodes.len()
            )));
        }
        Ok(nodes)
    }

    /// The replicas in the order reads try them: this node first.
    fn read_order(&self, vdi: &VdiInfo, oid: ObjectId) -> Vec<NodeId> {
        let map = self.map.get();
        let nodes = drove_placement::locate(&map, oid, usize::from(vdi.copies));
        read_order(&map, self.me, nodes)
    }

    async fn send(&self, node: NodeId, req: PeerReq, payload: Bytes) -> Result<(PeerResp, Bytes)> {
        if node == self.me {
            crate::local::apply_and_forward(&self.local, &self.pool, &req, payload).await
        } else {
            self.pool.call(node, req, payload).await
        }
    }

    /// Read `len` bytes of `oid` at `offset` from the nearest replica that answers.
    pub async fn read(&self, vdi: &VdiInfo, oid: ObjectId, offset: u64, len: u32) -> Result<Bytes> {
        let order = self.read_order(vdi, oid);
        let mut last = Error::unavailable(format!("No node holds object {oid}"));
        for node in order {
            match self
                .send(node, PeerReq::Read { oid, offset, len }, Bytes::new())
                .await
            {
                Ok((_, data)) if data.len() == len as usize => return Ok(data),
                Ok((_, data)) => {
                    last = Error::new(
                        drove_types::ErrorKind::Io,
                        format!("Node {node} returned {} bytes, not {len}", data.len()),
                    );
                }
                Err(e) => {
                    tracing::warn!(%oid, %node, "read failed, trying next replica: {e}");
                    last = e;
                }
            }
        }
        Err(last)
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
        let epoch = self.map.get().epoch;
        let _order = self.locks.lock(oid, offset, data.len() as u64).await;
        self.fan_out(vdi, oid, data, |forward| PeerReq::Write {
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
        let epoch = self.map.get().epoch;
        let _order = self.locks.lock(oid, offset, len).await;
        self.fan_out(vdi, oid, Bytes::new(), |forward| PeerReq::WriteZeroes {
            oid,
            offset,
            len,
            fua,
            epoch,
            generation,
            forward,
        })
        .await
    }

    async fn fan_out(
        &self,
        vdi: &VdiInfo,
        oid: ObjectId,
        payload: Bytes,
        make: impl Fn(Vec<NodeId>) -> PeerReq,
    ) -> Result<()> {
        let replicas = self.replicas(vdi, oid)?;
        match vdi.mode {
            ReplicationMode::Direct => {
                let sends = replicas
                    .iter()
                    .map(|&n| self.send(n, make(Vec::new()), payload.clone()));
                for r in join_all(sends).await {
                    r?;
                }
                Ok(())
            }
            ReplicationMode::PrimaryCopy => {
                let (first, rest) = (replicas[0], replicas[1..].to_vec());
                self.send(first, make(rest), payload).await.map(|_| ())
            }
        }
    }

    /// fsync `oids` on every replica that holds them.
    pub async fn flush(&self, vdi: &VdiInfo, oids: &[ObjectId]) -> Result<()> {
        let mut by_node: BTreeMap<NodeId, Vec<ObjectId>> = BTreeMap::new();
        for &oid in oids {
            for node in self.replicas(vdi, oid)? {
                by_node.entry(node).or_default().push(oid);
            }
        }
        let sends = by_node
            .into_iter()
            .map(|(node, oids)| self.send(node, PeerReq::Flush { oids }, Bytes::new()));
        for r in join_all(sends).await {
            r?;
        }
        Ok(())
    }

    /// Whether each object was ever written, asking the nearest replica of each and
    /// falling back to the next one when a node does not answer.
    pub async fn exists(&self, vdi: &VdiInfo, oids: &[ObjectId]) -> Result<Vec<bool>> {
        let orders: Vec<Vec<NodeId>> = oids.iter().map(|&o| self.read_order(vdi, o)).collect();
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
    use drove_types::{ClusterMap, NodeInfo, NodeState};

    fn map(zones: &[&str]) -> ClusterMap {
        let mut m = ClusterMap::default();
        for (i, z) in zones.iter().enumerate() {
            let id = NodeId(i as u64 + 1);
            m.nodes.insert(
                id,
                NodeInfo {
                    id,
                    zone: z.to_string(),
                    weight: 1,
                    admin_addr: String::new(),
                    peer_addr: String::new(),
                    nbd_addr: String::new(),
                    nbd_socket: String::new(),
                    state: NodeState::Up,
                },
            );
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
