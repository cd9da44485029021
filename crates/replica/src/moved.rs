//! Reading a VDI whose home zone just moved (a hand-over to another zone, a
//! promotion). The move changes where every object is placed at once, and the new
//! holders recover their copies in the background from the old ones. Until they
//! have, every new holder of an object may answer "recovering"; the read then goes
//! to the copies placed under the previous home, which recovery drops only once
//! every new holder is current.
//!
//! That fallback is sound only while no write reached the object since the move and
//! the old copy still exists. Both are checked after the old copy answered: every
//! replica placed now must still answer "recovering". A write reaching a placed
//! replica makes it current first (so none was acknowledged), and the old holder
//! deletes its copy only once every placed one is current (so the answer came from
//! a copy that existed). Otherwise the caller asks again, now of the placed ones.
use super::*;

/// How often a read or existence question falls back to the old copies and finds
/// the new ones caught up meanwhile before it gives up.
pub(super) const MOVE_TRIES: usize = 3;

impl Gateway {
    /// The nodes `oid` was placed on under `vdi`'s previous home and is not placed
    /// on now, nearest first.
    fn before_move(&self, map: &ClusterMap, vdi: &VdiInfo, oid: ObjectId) -> Vec<NodeId> {
        let now = self.locate(map, vdi, oid);
        let old: Vec<NodeId> = drove_placement::locate_before_move(map, vdi, oid)
            .into_iter()
            .filter(|n| !now.contains(n))
            .collect();
        read_order(map, self.me, old, |n| self.pool.rtt(n))
    }

    /// Whether every replica of `oid` placed on `map` still answers that its copy is
    /// being recovered.
    async fn all_recovering(&self, map: &ClusterMap, vdi: &VdiInfo, oid: ObjectId) -> bool {
        let placed = self.locate(map, vdi, oid);
        let asks = placed.iter().map(|&node| {
            let req = PeerReq::Exists {
                oids: vec![oid],
                epoch: map.epoch,
            };
            self.send(node, req, Bytes::new())
        });
        let answers = join_all(asks).await;
        !answers.is_empty()
            && answers
                .iter()
                .all(|a| matches!(a, Err(e) if e.kind() == ErrorKind::Recovering))
    }

    /// Read from the copies placed before the home moved (the placed ones answered
    /// "recovering"). `None`: no old copy answered, or a placed one caught up
    /// meanwhile (ask the placed ones again).
    pub(super) async fn read_before_move(
        &self,
        map: &ClusterMap,
        vdi: &VdiInfo,
        (oid, offset, len): (ObjectId, u64, u32),
    ) -> Option<Bytes> {
        let req = PeerReq::Read {
            oid,
            offset,
            len,
            epoch: map.epoch,
        };
        self.ask_before_move(map, vdi, oid, req, |_, data| {
            (data.len() == len as usize).then_some(data)
        })
        .await
    }

    /// Whether `oid` was ever written, asked of the copies placed before the home
    /// moved, as [`Gateway::read_before_move`] reads them.
    pub(super) async fn exists_before_move(
        &self,
        map: &ClusterMap,
        vdi: &VdiInfo,
        oid: ObjectId,
    ) -> Option<bool> {
        let req = PeerReq::Exists {
            oids: vec![oid],
            epoch: map.epoch,
        };
        self.ask_before_move(map, vdi, oid, req, |resp, _| match resp {
            PeerResp::Exists(f) if f.len() == 1 => Some(f[0]),
            _ => None,
        })
        .await
    }

    /// Ask the copies of `oid` placed before the home moved, nearest first, until
    /// one gives an answer `accept` takes; keep it only if every replica placed now
    /// still answers "recovering" (see the module doc).
    async fn ask_before_move<T>(
        &self,
        map: &ClusterMap,
        vdi: &VdiInfo,
        oid: ObjectId,
        req: PeerReq,
        accept: impl Fn(PeerResp, Bytes) -> Option<T>,
    ) -> Option<T> {
        for node in self.before_move(map, vdi, oid) {
            match self.send(node, req.clone(), Bytes::new()).await {
                Ok((resp, data)) => {
                    if let Some(answer) = accept(resp, data) {
                        let fresh = self.all_recovering(map, vdi, oid).await;
                        tracing::debug!(%oid, %node, fresh, "asked a copy placed before the home moved");
                        return fresh.then_some(answer);
                    }
                }
                Err(e) => tracing::debug!(%oid, %node, "old copy not asked: {e}"),
            }
        }
        None
    }

    /// [`Gateway::exists_on`] for a VDI whose home moved: objects whose every placed
    /// replica is recovering are asked of the old copies.
    pub(super) async fn exists_moved(
        &self,
        map: &ClusterMap,
        vdi: &VdiInfo,
        oids: &[ObjectId],
    ) -> Result<Vec<bool>> {
        let mut out = Vec::with_capacity(oids.len());
        for &oid in oids {
            let mut tries = 0;
            let found = loop {
                match self.exists_on(map, vdi, &[oid]).await {
                    Ok(f) => break f[0],
                    Err(e) if e.kind() == ErrorKind::Recovering && tries < MOVE_TRIES => {
                        tries += 1;
                        if let Some(f) = self.exists_before_move(map, vdi, oid).await {
                            break f;
                        }
                    }
                    Err(e) => return Err(e),
                }
            };
            out.push(found);
        }
        Ok(out)
    }
}
