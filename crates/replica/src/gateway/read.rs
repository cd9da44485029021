//! Reading an object from its replicas. The replicas are tried nearest first
//! ([`read_order`]): this node's own store, then the others of its zone, then the
//! rest by measured round trip. A replica slow to answer is hedged once by the next
//! ([`read_hedged`], after [`hedge_after`]), and each answer is judged ([`judge`]):
//! data of the length asked ends the read, `Gone` and `StaleEpoch` end it at once,
//! any other failure passes it on to the next replica.
use bytes::Bytes;
use drove_proto::{PeerReq, PeerResp};
use drove_types::{ClusterMap, Error, ErrorKind, NodeId, ObjectId, Result, VdiInfo};
use futures::future::{select, Either};
use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use super::{moved, zoned, Gateway};

/// How long a read goes again while every replica it asked answers that its copy is
/// being recovered, before it fails. Right after a whole site's power loss every
/// copy is pending until the nodes have compared them; a VM attached in that
/// moment (no post-crash settle held it back: its writer had let go of the VDI)
/// read EIO 6 ms after its node came up (e2e_power_loss, seed 525460, run 2 of
/// its cuts, replayed with `POWER_LOSS_FILTER=17939:1`).
const RECOVERING_WAIT: Duration = Duration::from_secs(30);

impl Gateway {
    /// The replicas on `map` in the order reads try them: this node first. While
    /// this gateway still owes the copies outside the home zone a write of `oid`
    /// (zone-sync), only the home-zone copies are read: a writer outside the home
    /// zone must read what it wrote.
    pub(super) fn read_order_on(
        &self,
        map: &ClusterMap,
        vdi: &VdiInfo,
        oid: ObjectId,
    ) -> Vec<NodeId> {
        let mut nodes = self.locate(map, vdi, oid);
        if self.lanes.get(vdi.id).is_some_and(|l| l.pending_for(oid)) {
            let near = zoned::home_only(map, vdi, &nodes);
            if !near.is_empty() {
                nodes = near;
            }
        }
        read_order(map, self.me, nodes, |n| self.pool.rtt(n))
    }

    /// Read `len` bytes of `oid` at `offset` from the nearest replica that answers:
    /// replicas are asked in [`read_order`], and the first is hedged once by the next
    /// when slow ([`read_hedged`]). A replica past this gateway's map makes the read go
    /// again on the newer map.
    pub async fn read(&self, vdi: &VdiInfo, oid: ObjectId, offset: u64, len: u32) -> Result<Bytes> {
        let mut moved_tries = 0;
        let started = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            let map = self.map.get();
            let order = self.read_order_on(&map, vdi, oid);
            let ask = |node| {
                let req = PeerReq::Read {
                    oid,
                    offset,
                    len,
                    epoch: map.epoch,
                };
                self.send(node, req, Bytes::new())
            };
            let wait = |node| hedge_after(node == self.me, self.pool.rtt_high(node));
            let report = read_hedged(oid, &order, len, wait, ask).await;
            self.count_read(&map, &report);
            match report.result {
                Ok((_, data)) => return Ok(data),
                Err(e) if e.kind() == ErrorKind::StaleEpoch => self.newer_map(map.epoch).await?,
                // The home moved and the new holders are catching up (see moved.rs).
                Err(e)
                    if e.kind() == ErrorKind::Recovering
                        && vdi.previous_home().is_some()
                        && moved_tries < moved::MOVE_TRIES =>
                {
                    moved_tries += 1;
                    if let Some(data) = self.read_before_move(&map, vdi, (oid, offset, len)).await {
                        self.metrics.gateway_read("before-move");
                        return Ok(data);
                    }
                    if moved_tries == moved::MOVE_TRIES {
                        return Err(e);
                    }
                }
                // Every copy is being recovered: wait for one, bounded.
                Err(e)
                    if e.kind() == ErrorKind::Recovering
                        && vdi.previous_home().is_none()
                        && started.elapsed() < RECOVERING_WAIT =>
                {
                    tracing::debug!(%oid, "every copy is being recovered: reading again: {e}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Count a read in the metrics: where its answer came from, and its hedge.
    fn count_read(&self, map: &ClusterMap, report: &ReadReport) {
        if report.hedge.is_some() {
            self.metrics.gateway_hedged_read();
        }
        if report.hedge_won() {
            self.metrics.gateway_hedge_win();
        }
        if let Ok((node, _)) = &report.result {
            let place = Place::of(map, self.me, *node);
            self.metrics.gateway_read(place.label());
        }
    }
}

/// Where a replica sits, seen from the gateway reading it; nearer sorts first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Place {
    /// The gateway's own store: no network at all.
    Local,
    /// Another node of the gateway's zone.
    Zone,
    /// A node of another zone (or any node, for a gateway outside the map).
    Remote,
}

impl Place {
    fn of(map: &ClusterMap, me: NodeId, node: NodeId) -> Place {
        let zone = |n: NodeId| map.node(n).map(|x| x.zone.as_str());
        if node == me {
            Place::Local
        } else if zone(me).is_some() && zone(node) == zone(me) {
            Place::Zone
        } else {
            Place::Remote
        }
    }

    /// Its value of the `where` label of the read metrics.
    fn label(self) -> &'static str {
        match self {
            Place::Local => "local",
            Place::Zone => "zone",
            Place::Remote => "remote",
        }
    }
}

/// Order `replicas` for reading from node `me`: itself, then the nodes of its zone
/// in placement order, then the others by lowest round trip as `rtt` gives it, the
/// unmeasured last in placement order (a stable sort keeps placement order among
/// equals). The zone keeps placement order: round trips within a zone differ by
/// noise, and asking the same replica for the same object keeps its cache warm.
pub(super) fn read_order(
    map: &ClusterMap,
    me: NodeId,
    mut replicas: Vec<NodeId>,
    rtt: impl Fn(NodeId) -> Option<Duration>,
) -> Vec<NodeId> {
    replicas.sort_by_cached_key(|&n| {
        let place = Place::of(map, me, n);
        let rtt = if place == Place::Remote { rtt(n) } else { None };
        (place, rtt.is_none(), rtt)
    });
    replicas
}

/// How long a read waits for the gateway's own store before also asking the next
/// replica. A healthy local read takes well under a millisecond from the page cache
/// and a few for a whole object off an SSD; the hedge moves the read onto the network
/// and another node's disk, so it is kept for a disk that is stuck (a failing drive
/// retrying, a frozen device queue: seconds), which nothing else watches (the
/// pool's silence watchdog only covers peers). 50 ms is well above a busy healthy
/// disk and adds little to a stuck one's read.
const LOCAL_HEDGE_AFTER: Duration = Duration::from_millis(50);

/// The least a read waits for a peer before hedging. On a LAN the round trip (well
/// under 1 ms) says nothing of the peer's disk: 10 ms covers reading a whole 4 MiB
/// object off an SSD and its transfer over 10 GbE (a few ms each), so healthy reads
/// are seldom sent twice, and a stalled peer costs 10 ms rather than the pool's
/// silence floor (1 s).
const HEDGE_FLOOR: Duration = Duration::from_millis(10);

/// The wait for a peer whose round trip is not measured yet (pings measure it within
/// a second of connecting): a WAN round trip fits in it, so a far replica is not
/// hedged for being far.
const UNMEASURED_HEDGE_AFTER: Duration = Duration::from_millis(100);

/// The longest a read waits for a peer before hedging, however erratic its round
/// trips: past a second the guest has waited long enough that another replica's
/// answer is worth its cost.
const HEDGE_CEILING: Duration = Duration::from_secs(1);

/// How long a read waits for a replica before also asking the next one: `local` is
/// the gateway's own store; `high` is a peer's long round trip, `srtt + 4 rttvar`
/// (the peer's RFC 6298 retransmit timeout: longer than nearly all its round trips).
/// Twice `high` leaves the read one such round trip and as long again for the
/// peer's disk and the payload; a healthy peer is seldom that late, and one that is
/// has likely stalled.
fn hedge_after(local: bool, high: Option<Duration>) -> Duration {
    if local {
        return LOCAL_HEDGE_AFTER;
    }
    high.map_or(UNMEASURED_HEDGE_AFTER, |h| {
        (h * 2).clamp(HEDGE_FLOOR, HEDGE_CEILING)
    })
}

/// How one read over the replicas went.
struct ReadReport {
    /// The data and the replica that sent it, or the error that ends the read.
    result: Result<(NodeId, Bytes)>,
    /// The replica a hedge was sent to, if one was.
    hedge: Option<NodeId>,
}

impl ReadReport {
    /// Whether the data came from the hedge rather than the replica it hedged.
    fn hedge_won(&self) -> bool {
        matches!((&self.result, self.hedge), (Ok((from, _)), Some(h)) if *from == h)
    }
}

/// What one replica's answer means for a read.
#[derive(Debug)]
enum Answer {
    /// Data of the length asked: the read is done.
    Data(Bytes),
    /// The read ends: the VDI is gone, or a replica is past the gateway's map (then
    /// no answer on this map can be trusted to come from a current replica).
    Stop(Error),
    /// This replica failed; another may serve.
    Next(Error),
}

/// Judge `node`'s answer `res` to a read of `len` bytes of `oid`.
fn judge(oid: ObjectId, node: NodeId, len: u32, res: Result<(PeerResp, Bytes)>) -> Answer {
    match res {
        Ok((_, data)) if data.len() == len as usize => Answer::Data(data),
        Ok((_, data)) => Answer::Next(Error::new(
            ErrorKind::Io,
            format!("Node {node} returned {} bytes, not {len}", data.len()),
        )),
        Err(e) if matches!(e.kind(), ErrorKind::StaleEpoch | ErrorKind::Gone) => Answer::Stop(e),
        Err(e) => {
            tracing::warn!(%oid, %node, "read failed, trying another replica: {e}");
            Answer::Next(e)
        }
    }
}

/// Read `len` bytes of `oid` from the replicas in `order`, asking each with `ask`.
/// A replica that has not answered within `wait(node)` is hedged: the next one is
/// asked too and the first good answer wins (the other request is dropped). Only one
/// hedge per read, so at most two requests are out; after it, replicas are asked one
/// at a time. `StaleEpoch` and `Gone` end the read at once, whoever sends them.
async fn read_hedged<F, Fut>(
    oid: ObjectId,
    order: &[NodeId],
    len: u32,
    wait: impl Fn(NodeId) -> Duration,
    ask: F,
) -> ReadReport
where
    F: Fn(NodeId) -> Fut,
    Fut: Future<Output = Result<(PeerResp, Bytes)>>,
{
    let mut report = ReadReport {
        result: Err(Error::unavailable(format!("No node holds object {oid}"))),
        hedge: None,
    };
    let mut i = 0;
    while let Some(&node) = order.get(i) {
        let mut first = pin!(ask(node));
        let next = order.get(i + 1).filter(|_| report.hedge.is_none());
        let (from, answer) = match next {
            None => (node, judge(oid, node, len, first.await)),
            Some(&next) => match tokio::time::timeout(wait(node), first.as_mut()).await {
                Ok(res) => (node, judge(oid, node, len, res)),
                Err(_) => {
                    tracing::debug!(%oid, %node, "read slow, hedging with node {next}");
                    report.hedge = Some(next);
                    i += 1;
                    let second = pin!(ask(next));
                    race(oid, len, (node, first), (next, second)).await
                }
            },
        };
        match answer {
            Answer::Data(data) => {
                report.result = Ok((from, data));
                return report;
            }
            Answer::Stop(e) => {
                report.result = Err(e);
                return report;
            }
            Answer::Next(e) => report.result = Err(e),
        }
        i += 1;
    }
    report
}

/// Wait on two outstanding reads of `oid` until one brings data or ends the read; a
/// replica that fails leaves the other to answer. Returns the replica that decided.
async fn race<Fut>(oid: ObjectId, len: u32, a: (NodeId, Fut), b: (NodeId, Fut)) -> (NodeId, Answer)
where
    Fut: Future<Output = Result<(PeerResp, Bytes)>> + Unpin,
{
    let ((na, fa), (nb, fb)) = (a, b);
    let (done, (other, rest)) = match select(fa, fb).await {
        Either::Left((res, fb)) => ((na, res), (nb, fb)),
        Either::Right((res, fa)) => ((nb, res), (na, fa)),
    };
    match judge(oid, done.0, len, done.1) {
        Answer::Next(_) => (other, judge(oid, other, len, rest.await)),
        decided => (done.0, decided),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::{ClusterMap, NodeInfo, VdiId};
    use parking_lot::Mutex;
    use std::collections::HashMap;

    const MS: Duration = Duration::from_millis(1);

    fn map(zones: &[&str]) -> ClusterMap {
        let mut m = ClusterMap::default();
        for (i, z) in zones.iter().enumerate() {
            let id = NodeId(i as u64 + 1);
            m.nodes.insert(id, NodeInfo::new(id, *z));
        }
        m
    }

    fn ids(v: &[u64]) -> Vec<NodeId> {
        v.iter().map(|&i| NodeId(i)).collect()
    }

    #[test]
    fn test_reads_prefer_self_then_own_zone_then_placement_order() {
        let m = map(&["a", "b", "a", "b"]);
        let order = |me, v: &[u64]| read_order(&m, NodeId(me), ids(v), |_| None);
        assert_eq!(order(1, &[4, 3, 1]), ids(&[1, 3, 4]));
        assert_eq!(order(1, &[4, 2, 3]), ids(&[3, 4, 2]));
        assert_eq!(order(2, &[3, 1, 4]), ids(&[4, 3, 1]));
        // A gateway outside the map (not yet joined) keeps placement order.
        assert_eq!(order(9, &[3, 1]), ids(&[3, 1]));
    }

    #[test]
    fn test_other_zones_go_by_round_trip_and_the_unmeasured_last() {
        // Node 1 (zone a) reads; node 6 shares its zone but is slow to reach.
        let m = map(&["a", "b", "c", "d", "e", "a"]);
        let rtts: HashMap<NodeId, Duration> = [(2, 30), (4, 5), (6, 500)]
            .into_iter()
            .map(|(n, ms)| (NodeId(n), ms * MS))
            .collect();
        let rtt = |n| rtts.get(&n).copied();
        let order = |me, v: &[u64]| read_order(&m, NodeId(me), ids(v), rtt);
        assert_eq!(order(1, &[5, 6, 4, 3, 2, 1]), ids(&[1, 6, 4, 2, 5, 3]));
        // Unmeasured replicas keep placement order among themselves.
        assert_eq!(order(1, &[3, 5]), ids(&[3, 5]));
        assert_eq!(order(1, &[5, 3]), ids(&[5, 3]));
        // The gateway's own replica comes first, whatever the round trips say.
        assert_eq!(order(4, &[2, 4]), ids(&[4, 2]));
    }

    #[test]
    fn test_reads_are_counted_by_where_the_replica_sits() {
        let m = map(&["a", "b", "a"]);
        assert_eq!(Place::of(&m, NodeId(1), NodeId(1)), Place::Local);
        assert_eq!(Place::of(&m, NodeId(1), NodeId(3)), Place::Zone);
        assert_eq!(Place::of(&m, NodeId(1), NodeId(2)), Place::Remote);
        assert_eq!(Place::of(&m, NodeId(9), NodeId(2)), Place::Remote);
        let labels = [Place::Local, Place::Zone, Place::Remote].map(Place::label);
        assert_eq!(labels, ["local", "zone", "remote"]);
    }

    #[test]
    fn test_hedge_delay_follows_the_round_trip_within_its_bounds() {
        // The local disk has its own delay, whatever the pool measured.
        assert_eq!(hedge_after(true, None), LOCAL_HEDGE_AFTER);
        assert_eq!(
            hedge_after(true, Some(Duration::from_secs(3))),
            LOCAL_HEDGE_AFTER
        );
        assert_eq!(hedge_after(false, None), UNMEASURED_HEDGE_AFTER);
        // A LAN peer: the floor decides.
        assert_eq!(hedge_after(false, Some(MS / 2)), HEDGE_FLOOR);
        // A WAN peer (srtt 100 ms, rttvar 10 ms): twice its long round trip.
        assert_eq!(hedge_after(false, Some(140 * MS)), 280 * MS);
        assert_eq!(
            hedge_after(false, Some(Duration::from_secs(30))),
            HEDGE_CEILING
        );
    }

    /// A replica's scripted answer to a read: after how long, and data of that
    /// length or an error of that kind.
    type Reply = (u64, std::result::Result<usize, ErrorKind>);

    /// The reads' hedge delay in these tests.
    const WAIT: Duration = Duration::from_millis(20);

    /// Read 16 bytes from the replicas of `script`, in its order, on paused time:
    /// the report, the replicas asked, and how long the read took.
    async fn run(script: &[(u64, Reply)]) -> (ReadReport, Vec<NodeId>, Duration) {
        let replies: HashMap<NodeId, Reply> = script.iter().map(|&(n, r)| (NodeId(n), r)).collect();
        let order: Vec<NodeId> = script.iter().map(|&(n, _)| NodeId(n)).collect();
        let asked = Mutex::new(Vec::new());
        let ask = |node: NodeId| {
            asked.lock().push(node);
            let (after, reply) = replies[&node];
            async move {
                tokio::time::sleep(Duration::from_millis(after)).await;
                match reply {
                    Ok(n) => Ok((PeerResp::Ok, Bytes::from(vec![node.0 as u8; n]))),
                    Err(kind) => Err(Error::new(kind, format!("node {node} scripted"))),
                }
            }
        };
        let oid = ObjectId::new(VdiId(7), 0);
        let start = tokio::time::Instant::now();
        let report = read_hedged(oid, &order, 16, |_| WAIT, ask).await;
        let took = start.elapsed();
        (report, asked.into_inner(), took)
    }

    /// The replica that served `report`, or the kind of its error.
    fn served(report: &ReadReport) -> std::result::Result<u64, ErrorKind> {
        match &report.result {
            Ok((node, data)) => {
                assert_eq!(data.len(), 16);
                assert!(data.iter().all(|&b| u64::from(b) == node.0), "{data:?}");
                Ok(node.0)
            }
            Err(e) => Err(e.kind()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn test_a_prompt_replica_is_not_hedged() {
        let (r, asked, took) = run(&[(1, (5, Ok(16))), (2, (1, Ok(16)))]).await;
        assert_eq!(served(&r), Ok(1));
        assert_eq!((r.hedge, r.hedge_won()), (None, false));
        assert_eq!(asked, ids(&[1]));
        assert_eq!(took, 5 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn test_a_slow_replica_is_hedged_and_the_hedge_wins() {
        let (r, asked, took) = run(&[(1, (1000, Ok(16))), (2, (5, Ok(16)))]).await;
        assert_eq!(served(&r), Ok(2));
        assert_eq!((r.hedge, r.hedge_won()), (Some(NodeId(2)), true));
        assert_eq!(asked, ids(&[1, 2]));
        assert_eq!(took, WAIT + 5 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn test_a_short_answer_from_the_hedge_leaves_the_first_to_answer() {
        let (r, _, took) = run(&[(1, (100, Ok(16))), (2, (5, Ok(15)))]).await;
        assert_eq!(served(&r), Ok(1));
        assert_eq!((r.hedge, r.hedge_won()), (Some(NodeId(2)), false));
        assert_eq!(took, 100 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn test_gone_and_stale_epoch_end_a_hedged_read_whoever_sends_them() {
        // The slow first says Gone before the hedge's data arrives.
        let (r, _, took) = run(&[(1, (50, Err(ErrorKind::Gone))), (2, (200, Ok(16)))]).await;
        assert_eq!(served(&r), Err(ErrorKind::Gone));
        assert_eq!(took, 50 * MS);
        // The hedge says StaleEpoch before the slow first's data arrives, and the
        // third replica is not asked: the read goes again on a newer map.
        let (r, asked, took) = run(&[
            (1, (200, Ok(16))),
            (2, (5, Err(ErrorKind::StaleEpoch))),
            (3, (1, Ok(16))),
        ])
        .await;
        assert_eq!(served(&r), Err(ErrorKind::StaleEpoch));
        assert_eq!(asked, ids(&[1, 2]));
        assert_eq!(took, WAIT + 5 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn test_after_a_failed_hedge_the_rest_are_asked_one_at_a_time() {
        let (r, asked, took) = run(&[
            (1, (30, Err(ErrorKind::Io))),
            (2, (40, Err(ErrorKind::Unavailable))),
            (3, (500, Ok(16))),
            (4, (1, Ok(16))),
        ])
        .await;
        assert_eq!(served(&r), Ok(3));
        assert_eq!((r.hedge, r.hedge_won()), (Some(NodeId(2)), false));
        // Node 3 was slow but not hedged: one hedge per read.
        assert_eq!(asked, ids(&[1, 2, 3]));
        assert_eq!(took, WAIT + 40 * MS + 500 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn test_a_replica_failing_fast_leaves_the_hedge_to_the_next() {
        let (r, asked, took) = run(&[
            (1, (1, Err(ErrorKind::Io))),
            (2, (1000, Ok(16))),
            (3, (5, Ok(16))),
        ])
        .await;
        assert_eq!(served(&r), Ok(3));
        assert_eq!((r.hedge, r.hedge_won()), (Some(NodeId(3)), true));
        assert_eq!(asked, ids(&[1, 2, 3]));
        assert_eq!(took, MS + WAIT + 5 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn test_when_every_replica_fails_the_last_error_is_returned() {
        let (r, asked, _) = run(&[
            (1, (1, Err(ErrorKind::Io))),
            (2, (1, Ok(3))),
            (3, (1, Err(ErrorKind::Unavailable))),
        ])
        .await;
        assert_eq!(served(&r), Err(ErrorKind::Unavailable));
        assert_eq!(asked, ids(&[1, 2, 3]));
        let (r, asked, _) = run(&[]).await;
        assert_eq!(served(&r), Err(ErrorKind::Unavailable));
        assert!(asked.is_empty());
    }
}
