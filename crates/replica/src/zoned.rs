//! Writes across zones: one crossing per remote zone, and the zone-sync policy.
//!
//! - [`Gateway::send_by_zone`] sends a write once into each other zone: the first of
//!   that zone's replicas gets it with the others as its forward list and passes it
//!   on inside its zone. When the relay fails, the zone's replicas are written one by
//!   one, so the failed replica is known (and marked down) as for any write.
//! - Zone-sync ([`Gateway::fan_out_zoned`]): the home-zone replicas are written
//!   synchronously; the write then joins its VDI's lane ([`crate::ship`]) and is
//!   acknowledged. A worker per lane ships it to the replicas in the other zones.
//!   Every write of a zone-sync VDI reaches the far replicas through the lane, so the
//!   lane alone orders them. When a home-zone replica failed, or the home zone has
//!   no replica up, the writer waits for its write to be shipped before answering,
//!   so an acknowledged write is on `min_copies` replicas as under `sync`.
//! - A far replica that fails is marked down as a synchronous write would do (the
//!   home copies count as applied). While that is impossible (no quorum, too few
//!   copies), the entry is retried with back-off and the lag grows until writers
//!   wait at the bound. A write fenced (the lock moved on) or of a VDI gone is given
//!   up: the next writer's crash repair or `vdi check` makes the copies agree.
//! - A hand-over, a snapshot and `drove vdi sync` call [`Gateway::drain`]: it waits
//!   for what was queued before it and makes the far copies durable.
use super::*;
use crate::ship::{Entry, Lane, MAX_FLYING};
use drove_types::ObjVersion;
use futures::stream::{FuturesUnordered, StreamExt};

/// The zone of `node` on `map`.
fn zone_of(map: &ClusterMap, node: NodeId) -> Option<&str> {
    map.node(node).map(|n| n.zone.as_str())
}

/// `nodes` split into those of `vdi`'s home zone and the others, each in the order
/// given. Without a home zone every node is near.
fn split(map: &ClusterMap, vdi: &VdiInfo, nodes: &[NodeId]) -> (Vec<NodeId>, Vec<NodeId>) {
    let Some(home) = vdi.home_at(map.epoch) else {
        return (nodes.to_vec(), Vec::new());
    };
    nodes.iter().partition(|&&n| zone_of(map, n) == Some(home))
}

/// The same error again (one answer standing for a whole zone's replicas).
pub(crate) fn again(e: &Error) -> Error {
    Error::new(e.kind(), e.to_string())
}

/// The replicas of `nodes` in `vdi`'s home zone (all of them without one).
pub(super) fn home_only(map: &ClusterMap, vdi: &VdiInfo, nodes: &[NodeId]) -> Vec<NodeId> {
    split(map, vdi, nodes).0
}

/// Longest pause between tries of a far write that cannot be placed.
const SHIP_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Error kinds after which a shipped write is given up rather than retried.
fn final_kind(k: ErrorKind) -> bool {
    matches!(
        k,
        ErrorKind::Fenced | ErrorKind::Gone | ErrorKind::Locked | ErrorKind::Invalid
    ) || k == ErrorKind::NotFound
}

impl Gateway {
    /// Send one request (made by `make` for an epoch and a forward list) to each of
    /// `nodes`, crossing into each zone other than this node's once. Answers come in
    /// the order of `nodes`.
    pub(super) async fn send_by_zone(
        &self,
        map: &ClusterMap,
        nodes: &[NodeId],
        make: &(dyn Fn(Epoch, Vec<NodeId>) -> PeerReq + Sync),
        payload: &Bytes,
    ) -> Vec<Result<(PeerResp, Bytes)>> {
        let mine = zone_of(map, self.me);
        // Groups of indexes into `nodes`: one per node of this zone (or of no known
        // zone), one per other zone.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut by_zone: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, &n) in nodes.iter().enumerate() {
            match zone_of(map, n) {
                Some(z) if Some(z) != mine => match by_zone.get(z) {
                    Some(&g) => groups[g].push(i),
                    None => {
                        by_zone.insert(z, groups.len());
                        groups.push(vec![i]);
                    }
                },
                _ => groups.push(vec![i]),
            }
        }
        let sends = groups.into_iter().map(|g| async move {
            let far = zone_of(map, nodes[g[0]]) != mine;
            if far {
                self.metrics.wan().cross_zone(payload.len() as u64);
            }
            if g.len() == 1 {
                let n = nodes[g[0]];
                let r = self.send(n, make(map.epoch, Vec::new()), payload.clone()).await;
                return vec![(g[0], r)];
            }
            let relay = nodes[g[0]];
            let rest: Vec<NodeId> = g[1..].iter().map(|&i| nodes[i]).collect();
            match self.send(relay, make(map.epoch, rest), payload.clone()).await {
                Ok(r) => g.iter().map(|&i| (i, Ok(r.clone()))).collect(),
                Err(e) if matches!(e.kind(), ErrorKind::StaleEpoch | ErrorKind::Fenced | ErrorKind::Gone) => {
                    g.iter().map(|&i| (i, Err(again(&e)))).collect()
                }
                Err(e) => {
                    tracing::debug!(%relay, "relayed write failed, writing the zone's replicas one by one: {e}");
                    let one = g.iter().map(|&i| async move {
                        if far {
                            self.metrics.wan().cross_zone(payload.len() as u64);
                        }
                        let r = self
                            .send(nodes[i], make(map.epoch, Vec::new()), payload.clone())
                            .await;
                        (i, r)
                    });
                    join_all(one).await
                }
            }
        });
        let mut out: Vec<Option<Result<(PeerResp, Bytes)>>> =
            (0..nodes.len()).map(|_| None).collect();
        for group in join_all(sends).await {
            for (i, r) in group {
                out[i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::unavailable("No answer"))))
            .collect()
    }

    /// A zone-sync write: the home-zone replicas now, the others through the lane.
    pub(super) async fn fan_out_zoned(
        &self,
        vdi: &VdiInfo,
        oid: ObjectId,
        op: Op,
        fua: bool,
        generation: u64,
    ) -> Result<()> {
        let payload = op.payload();
        let make = |epoch, forward| op.request(oid, fua, generation, epoch, epoch, forward);
        loop {
            let map = self.map.get();
            let replicas = self.replicas_on(&map, vdi, oid)?;
            let (near, far) = split(&map, vdi, &replicas);
            let results = self.send_by_zone(&map, &near, &make, &payload).await;
            let mut near_ok = 0;
            let mut failed = Vec::new();
            let mut stale = None;
            for (&n, r) in near.iter().zip(results) {
                match r {
                    Ok(_) => near_ok += 1,
                    Err(e) if e.kind() == ErrorKind::StaleEpoch => stale = Some(e),
                    Err(e) => failed.push((n, e)),
                }
            }
            if stale.is_some() {
                self.newer_map(map.epoch).await?;
                continue;
            }
            if let Some(i) = failed.iter().position(|(_, e)| final_kind(e.kind())) {
                return Err(failed.swap_remove(i).1);
            }
            if far.is_empty() {
                let tallied = match self.degrade(vdi, near_ok, failed).await {
                    Ok(Tally::Again) => continue,
                    Ok(Tally::Done) => self.still_on(&map),
                    Err(e) => Err(e),
                };
                match tallied {
                    Err(e) if e.kind() == ErrorKind::StaleEpoch => {
                        self.newer_map(map.epoch).await?;
                        continue;
                    }
                    other => return other,
                }
            }
            // Wait for the far copies when the near ones are not enough on their own,
            // or when the VDI is no longer zone-sync (its lane is being emptied).
            let wait = !failed.is_empty() || near_ok == 0 || !vdi.zone_sync();
            let lane = self.lanes.lane(vdi.id);
            let on_wait = || self.metrics.wan().throttled();
            let shipped = Op::clone(&op);
            let (done, start) = lane
                .push(
                    Arc::new(vdi.clone()),
                    oid,
                    shipped,
                    ObjVersion {
                        generation,
                        epoch: map.epoch.0,
                    },
                    near_ok,
                    wait,
                    on_wait,
                )
                .await;
            if start {
                self.start_lane(vdi.id, lane);
            }
            let Some(done) = done else {
                match self.still_on(&map) {
                    Err(_) => {
                        self.newer_map(map.epoch).await?;
                        continue;
                    }
                    ok => return ok,
                }
            };
            let far_res = done
                .await
                .unwrap_or_else(|_| Err(Error::unavailable("The zone-sync shipper stopped")));
            far_res?;
            // The far copies have it (or the failed ones were marked down with the
            // near copies counted): tally the near failures with them counted too.
            let tallied = match self.degrade(vdi, near_ok + far.len(), failed).await {
                Ok(Tally::Again) => continue,
                Ok(Tally::Done) => self.still_on(&map),
                Err(e) => Err(e),
            };
            match tallied {
                Err(e) if e.kind() == ErrorKind::StaleEpoch => {
                    self.newer_map(map.epoch).await?;
                }
                other => return other,
            }
        }
    }

    /// Start the worker that ships lane `id`'s writes.
    fn start_lane(&self, id: drove_types::VdiId, lane: Arc<Lane>) {
        let Some(gw) = self.this.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            gw.run_lane(lane).await;
            tracing::trace!(vdi = %id, "zone-sync lane idle");
        });
    }

    /// Ship a lane's writes until it is empty.
    async fn run_lane(self: Arc<Self>, lane: Arc<Lane>) {
        let mut flying = FuturesUnordered::new();
        loop {
            let room = MAX_FLYING.saturating_sub(flying.len());
            if room > 0 {
                match lane.take(room) {
                    None => return,
                    Some(batch) => {
                        for e in batch {
                            let gw = self.clone();
                            flying.push(async move {
                                let res = gw.ship(&e).await;
                                (e, res)
                            });
                        }
                    }
                }
            }
            if flying.is_empty() {
                // Everything queued waits behind something; nothing is in flight
                // only when the queue is empty (take said None), so this is a
                // transient between pushes: look again shortly.
                lane.moved(Duration::from_millis(5)).await;
                continue;
            }
            if let Some((e, res)) = flying.next().await {
                if let Err(err) = &res {
                    tracing::warn!(oid = %e.oid, "zone-sync write given up: {err}");
                } else {
                    self.metrics.wan().shipped(e.op.payload().len() as u64);
                }
                lane.finish(e, &res);
            }
        }
    }

    /// Write entry `e` to its object's replicas outside the home zone on the current
    /// map, until they have it, the failed ones are marked down, or it is final.
    async fn ship(&self, e: &Entry) -> Result<()> {
        let mut backoff = Duration::from_millis(100);
        let payload = e.op.payload();
        let make = |epoch, forward| {
            e.op.request(e.oid, false, e.generation, epoch, e.made, forward)
        };
        loop {
            let map = self.map.get();
            let all = self.locate(&map, &e.vdi, e.oid);
            let (near, far) = split(&map, &e.vdi, &all);
            if far.is_empty() {
                return Ok(());
            }
            let results = self.send_by_zone(&map, &far, &make, &payload).await;
            let mut applied = e.near_applied.min(near.len());
            let mut failed = Vec::new();
            let mut stale = false;
            for (&n, r) in far.iter().zip(results) {
                match r {
                    Ok(_) => applied += 1,
                    Err(err) if err.kind() == ErrorKind::StaleEpoch => stale = true,
                    Err(err) => failed.push((n, err)),
                }
            }
            let res = if stale {
                self.newer_map(map.epoch).await
            } else {
                match self.degrade(&e.vdi, applied, failed).await {
                    Ok(Tally::Done) => return Ok(()),
                    Ok(Tally::Again) => continue,
                    Err(err) => Err(err),
                }
            };
            if let Err(err) = res {
                if final_kind(err.kind()) {
                    return Err(err);
                }
                tracing::debug!(oid = %e.oid, "zone-sync write to retry: {err}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(SHIP_BACKOFF_MAX);
            }
        }
    }

    /// Wait until every write of VDI `vdi` queued before this call reached the
    /// replicas outside its home zone, then make them durable there.
    pub async fn drain(&self, vdi: &VdiInfo) -> Result<()> {
        let Some(lane) = self.lanes.get(vdi.id) else {
            return Ok(());
        };
        let mark = lane.mark();
        while !lane.passed(mark) {
            lane.moved(Duration::from_millis(50)).await;
        }
        if let Some((n, first)) = lane.given_up_before(mark) {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "VDI '{}': {n} write(s) acknowledged here could not be shipped to the \
                     copies outside the home zone (first: {first}); the home-zone copies \
                     have them, `drove vdi check {}` shows which copies differ",
                    vdi.name, vdi.name
                ),
            ));
        }
        let oids = lane.take_shipped();
        if oids.is_empty() {
            return Ok(());
        }
        let res = self.flush_where(vdi, &oids, Reach::Far).await;
        if res.is_err() {
            lane.unflushed(oids);
        }
        res
    }

    /// VDI `id`'s zone-sync lag on this gateway.
    pub fn lag(&self, id: drove_types::VdiId) -> Lag {
        self.lanes.get(id).map(|l| l.lag()).unwrap_or_default()
    }

    /// Every VDI's lag on this gateway, by id.
    pub fn lags(&self) -> Vec<(drove_types::VdiId, Lag)> {
        self.lanes.lags()
    }

    /// Forget VDI `id`'s lane if it has nothing left to ship.
    pub fn forget_idle_lane(&self, id: drove_types::VdiId) {
        self.lanes.forget_idle(id);
    }
}

/// Which replicas a flush reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reach {
    /// What acknowledged the writes: for a zone-sync VDI the home-zone replicas (all
    /// of them when the home zone has none up).
    Acked,
    /// The replicas outside the home zone.
    Far,
}

impl Reach {
    /// The replicas of `nodes` (an object's, on `map`) this reach covers.
    pub(super) fn pick(self, map: &ClusterMap, vdi: &VdiInfo, nodes: Vec<NodeId>) -> Vec<NodeId> {
        match self {
            Reach::Acked if !vdi.zone_sync() => nodes,
            Reach::Acked => {
                let (near, _) = split(map, vdi, &nodes);
                if near.is_empty() {
                    nodes
                } else {
                    near
                }
            }
            Reach::Far => split(map, vdi, &nodes).1,
        }
    }
}
