//! The simulated network: every node's [`Transport`], on tokio's paused clock.
//!
//! A call to a peer costs what the [`Model`] says: the request's bytes on the
//! sender's link (links are queues: a node sending a lot waits behind itself), the
//! one-way delay between the two zones, the serving cost and the request's bytes
//! on the receiver's disk, and the way back. In between, the receiving node applies
//! the request with drove's own code ([`drove_replica::local::apply_and_forward`],
//! what its peer server runs), forwarding through its own transport.
//!
//! Faults: a crashed node's host answers nothing more (calls to it and from it are
//! given up after the model's `give_up`, as a real pool gives up a silent peer), a
//! zone cut off from the others reaches only itself. A node that restarts is a new
//! incarnation: answers owed by the old one are lost.
use bytes::Bytes;
use drove_proto::{PeerReq, PeerResp, WireError};
use drove_replica::{LocalStore, Transport};
use drove_types::{Error, NodeId, Result};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::model::Model;
use crate::rng::Rng;

/// Request framing on the wire, bytes (header and checksum, roughly a peer frame's).
const FRAME: u64 = 64;

/// tokio's timer fires on whole milliseconds ("operates at millisecond
/// granularity", its `sleep` documentation says).
const TICK_NS: u64 = 1_000_000;

/// The seed of each tick's threshold ([`SimNet::wake`]).
const TICK_SEED: u64 = 0x7469_636b;

/// Bytes moved between nodes since the start (or the last [`SimNet::take_traffic`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Traffic {
    /// Calls made between nodes.
    pub calls: u64,
    /// Bytes sent between nodes, both ways.
    pub bytes: u64,
    /// Of those, bytes that crossed from one zone to another.
    pub cross_zone_bytes: u64,
    /// `List` requests (a node asking another for every object it stores).
    pub lists: u64,
    /// Objects digested for a peer (recovery and checks comparing copies).
    pub digests: u64,
    /// Bytes those digests read from the serving nodes' disks.
    pub digest_read_bytes: u64,
}

/// What a node of the simulated network serves with.
#[derive(Clone)]
struct Endpoint {
    incarnation: u64,
    up: bool,
    local: Arc<LocalStore>,
    transport: Arc<SimTransport>,
    /// Set when this incarnation crashes: what it was serving is never answered.
    dead: Arc<tokio::sync::watch::Sender<bool>>,
}

#[derive(Default)]
struct NetState {
    zone: BTreeMap<NodeId, usize>,
    eps: BTreeMap<NodeId, Endpoint>,
    /// Zones cut off from every other zone.
    cut: BTreeSet<usize>,
    /// When each node's outgoing link is free again.
    link_free: BTreeMap<NodeId, Instant>,
    /// When each node's disk is free again.
    disk_free: BTreeMap<NodeId, Instant>,
    /// Nodes whose disk is slow: what each fsync costs them on top.
    slow: BTreeMap<NodeId, Duration>,
    /// When a node last gave another up as silent: (from, to).
    silenced: BTreeMap<(NodeId, NodeId), Instant>,
    traffic: Traffic,
    incarnations: u64,
}

/// The network between the simulated nodes.
pub struct SimNet {
    model: Model,
    st: Mutex<NetState>,
}

/// How a leg of a call ends.
pub(crate) enum Leg {
    /// It arrives at this instant.
    At(Instant),
    /// It is lost: the caller hears nothing.
    Lost,
}

impl SimNet {
    /// A network with nothing attached yet.
    pub fn new(model: Model) -> Arc<SimNet> {
        Arc::new(SimNet {
            model,
            st: Mutex::new(NetState::default()),
        })
    }

    /// The model the network follows.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Attach (or re-attach, after a restart) node `id` of `zone`, serving from
    /// `local`: a new incarnation, whose transport is returned.
    pub fn attach(
        self: &Arc<Self>,
        id: NodeId,
        zone: usize,
        local: Arc<LocalStore>,
    ) -> Arc<SimTransport> {
        let mut st = self.st.lock();
        st.incarnations += 1;
        let incarnation = st.incarnations;
        let transport = Arc::new(SimTransport {
            me: id,
            incarnation,
            net: self.clone(),
        });
        st.zone.insert(id, zone);
        st.eps.insert(
            id,
            Endpoint {
                incarnation,
                up: true,
                local,
                transport: transport.clone(),
                dead: Arc::new(tokio::sync::watch::Sender::new(false)),
            },
        );
        transport
    }

    /// Crash node `id`: it stops answering, and what it was doing is lost.
    pub fn crash(&self, id: NodeId) {
        if let Some(ep) = self.st.lock().eps.get_mut(&id) {
            ep.up = false;
            ep.dead.send_replace(true);
        }
    }

    /// Forget every node: each endpoint holds its transport, which holds this
    /// network, so a network left attached is never freed, and with it every
    /// node's store (a fault run grew by about 5 MB per seed).
    pub fn detach_all(&self) {
        self.st.lock().eps.clear();
    }

    /// Cut zone `z` off from every other zone (or heal it).
    pub fn set_cut(&self, z: usize, cut: bool) {
        let mut st = self.st.lock();
        if cut {
            st.cut.insert(z);
        } else {
            st.cut.remove(&z);
        }
    }

    /// Make node `id`'s disk slow (every fsync it serves for a peer, a flush or a
    /// FUA write, takes `cost` more on its disk's queue), or fast again.
    pub fn set_slow(&self, id: NodeId, cost: Option<Duration>) {
        let mut st = self.st.lock();
        match cost {
            Some(c) => st.slow.insert(id, c),
            None => st.slow.remove(&id),
        };
    }

    /// Whether node `id` runs.
    pub fn is_up(&self, id: NodeId) -> bool {
        self.st.lock().eps.get(&id).is_some_and(|e| e.up)
    }

    /// Whether zone `z` is cut off.
    pub fn is_cut(&self, z: usize) -> bool {
        self.st.lock().cut.contains(&z)
    }

    /// The traffic since the last call, and start counting again.
    pub fn take_traffic(&self) -> Traffic {
        std::mem::take(&mut self.st.lock().traffic)
    }

    pub(crate) fn alive(&self, id: NodeId, incarnation: u64) -> bool {
        self.st
            .lock()
            .eps
            .get(&id)
            .is_some_and(|e| e.up && e.incarnation == incarnation)
    }

    /// Send `bytes` from `from` to `to`, starting at `now`: queue on the sender's
    /// link, then the delay.
    pub(crate) fn send(&self, from: NodeId, to: NodeId, bytes: u64, now: Instant) -> Leg {
        let mut st = self.st.lock();
        if !st.reaches(from, to) {
            return Leg::Lost;
        }
        let (za, zb) = (st.zone[&from], st.zone[&to]);
        let free = st.link_free.get(&from).copied().unwrap_or(now).max(now);
        let done = free + Model::wire_time(bytes, self.model.nic_bytes_per_s);
        st.link_free.insert(from, done);
        st.traffic.bytes += bytes;
        if za != zb {
            st.traffic.cross_zone_bytes += bytes;
        }
        Leg::At(done + self.model.delay(za, zb))
    }

    /// When node `id` has served a request that arrived at `at`, moving `bytes` to
    /// or from its disk.
    fn serve(&self, id: NodeId, bytes: u64, syncs: bool, at: Instant) -> Instant {
        let slow = match syncs {
            true => self.st.lock().slow.get(&id).copied().unwrap_or_default(),
            false => Duration::ZERO,
        };
        let cost =
            self.model.serve_cost + Model::wire_time(bytes, self.model.disk_bytes_per_s) + slow;
        self.busy(id, cost, at)
    }

    /// Book `cost` of node `id`'s time (a client operation at its gateway, asked at
    /// `now`) on the same queue requests served for peers take; when it is done.
    pub fn busy(&self, id: NodeId, cost: Duration, now: Instant) -> Instant {
        let mut st = self.st.lock();
        let free = st.disk_free.get(&id).copied().unwrap_or(now).max(now);
        let done = free + cost;
        st.disk_free.insert(id, done);
        done
    }

    /// The instant to sleep until for a wait the model ends at `t`.
    ///
    /// The simulated clock is tokio's, whose timer fires on whole milliseconds: a
    /// wait ending between two ticks would end at the later one, and a write made
    /// of four waits of 0.1 ms would take 4 ms. Instead each tick has a threshold,
    /// drawn at random (seeded) between 0 and 1 ms: a wait ending later than that
    /// past the tick wakes on the next one, else on this one (at once, when that is
    /// now). So a wait ending a fraction f of the way through wakes late with
    /// chance f and keeps its mean; the queues (links, disks) keep their exact
    /// instants. One threshold per tick keeps the order: of two waits, the one
    /// ending first never wakes last, and the later of two parallel calls wakes
    /// as late as its own end says (independent draws would wake the pair, on
    /// average, later than their mean).
    pub fn wake(&self, t: Instant) -> Instant {
        let off = crate::sim_offset(t);
        let ns = off.as_nanos();
        let past = u64::try_from(ns % u128::from(TICK_NS)).unwrap_or(0);
        if past == 0 {
            return t;
        }
        let tick = u64::try_from(ns / u128::from(TICK_NS)).unwrap_or(u64::MAX);
        let threshold = Rng::new(TICK_SEED ^ tick).below(TICK_NS);
        let floor = t - Duration::from_nanos(past);
        if threshold < past {
            floor + Duration::from_nanos(TICK_NS)
        } else {
            floor.max(Instant::now())
        }
    }

    /// Sleep until the tick [`SimNet::wake`] puts `t` on. Returns `t`: where the
    /// task is in the model's time, whichever tick it woke on.
    pub async fn sleep_to(&self, t: Instant) -> Instant {
        tokio::time::sleep_until(self.wake(t)).await;
        t
    }

    fn endpoint(&self, id: NodeId) -> Option<Endpoint> {
        self.st.lock().eps.get(&id).filter(|e| e.up).cloned()
    }
}

impl NetState {
    fn reaches(&self, a: NodeId, b: NodeId) -> bool {
        let up = |n: NodeId| self.eps.get(&n).is_some_and(|e| e.up);
        let (Some(&za), Some(&zb)) = (self.zone.get(&a), self.zone.get(&b)) else {
            return false;
        };
        up(a) && up(b) && (za == zb || !(self.cut.contains(&za) || self.cut.contains(&zb)))
    }
}

/// Where a task is in the model's time: at `exact`, the instant its last modelled
/// wait ended (it woke on the tick `woke`), if it has not waited on anything since;
/// else now (the tick it last woke on: when that wait ended in the model is not
/// known here). A task goes on from `exact` even when it woke a tick late, so a
/// queue it books next does not stand idle for the rounding.
pub fn resume(exact: Instant, woke: Instant) -> Instant {
    let now = Instant::now();
    if now > woke {
        now
    } else {
        exact
    }
}

/// One incarnation of a node's way to its peers.
pub struct SimTransport {
    me: NodeId,
    incarnation: u64,
    net: Arc<SimNet>,
}

impl SimTransport {
    /// Which run of its node this is (each restart is a new one).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Whether this incarnation still runs.
    pub fn alive(&self) -> bool {
        self.net.alive(self.me, self.incarnation)
    }

    async fn lost(&self, node: NodeId, start: Instant) -> Result<(PeerResp, Bytes)> {
        tokio::time::sleep_until(start + self.net.model.give_up).await;
        self.net
            .st
            .lock()
            .silenced
            .insert((self.me, node), Instant::now());
        Err(Error::unavailable(format!(
            "Node {node} did not answer within {:?}",
            self.net.model.give_up
        )))
    }

    async fn call_inner(
        &self,
        node: NodeId,
        req: PeerReq,
        payload: Bytes,
    ) -> Result<(PeerResp, Bytes)> {
        let start = Instant::now();
        if !self.alive() {
            // A crashed process does nothing more: its tasks wait forever.
            return std::future::pending().await;
        }
        let out = FRAME + payload.len() as u64;
        let arrived = match self.net.send(self.me, node, out, start) {
            Leg::Lost => return self.lost(node, start).await,
            Leg::At(t) => self.net.sleep_to(t).await,
        };
        let Some(ep) = self.net.endpoint(node) else {
            return self.lost(node, start).await;
        };
        let moved = match &req {
            PeerReq::Read { len, .. } => u64::from(*len),
            PeerReq::MendRead { len, .. } => u64::from(*len),
            PeerReq::Fetch { len, .. } => u64::from(*len),
            // A digest reads every object it covers, or only their block
            // checksums (4 bytes per 4 KiB block).
            PeerReq::Digest {
                oids, len, read, ..
            } => {
                let per = if *read {
                    u64::from(*len)
                } else {
                    u64::from(*len).div_ceil(drove_types::BLOCK_SIZE) * 4
                };
                let read = per * oids.len() as u64;
                let mut st = self.net.st.lock();
                st.traffic.digests += oids.len() as u64;
                st.traffic.digest_read_bytes += read;
                read
            }
            _ => payload.len() as u64,
        };
        let syncs = matches!(
            &req,
            PeerReq::Flush { .. }
                | PeerReq::Write { fua: true, .. }
                | PeerReq::WriteZeroes { fua: true, .. }
        );
        let served = self
            .net
            .sleep_to(self.net.serve(node, moved, syncs, arrived))
            .await;
        let woke = Instant::now();
        let serve = drove_replica::local::apply_and_forward(
            &ep.local,
            ep.transport.as_ref(),
            &req,
            payload,
        );
        let mut dead = ep.dead.subscribe();
        // A request its server was still working on when it crashed is never
        // answered (its tasks stop where they are).
        let died = async move {
            let _ = dead.wait_for(|d| *d).await;
        };
        let res = tokio::select! {
            biased;
            r = serve => r,
            () = died => return self.lost(node, start).await,
        };
        let (resp, data) = match res {
            Ok(r) => r,
            Err(e) => (PeerResp::Err(WireError::from(e)), Bytes::new()),
        };
        let mut answered = resume(served, woke);
        if let PeerResp::List(oids) = &resp {
            // A listing walks the store: its cost grows with what it finds.
            let walk =
                self.net.model.list_per_object * u32::try_from(oids.len()).unwrap_or(u32::MAX);
            let walked = self.net.busy(node, walk, answered);
            let at = self.net.sleep_to(walked).await;
            answered = resume(at, Instant::now());
        }
        if !self.net.alive(node, ep.incarnation) {
            return self.lost(node, start).await;
        }
        match self
            .net
            .send(node, self.me, FRAME + data.len() as u64, answered)
        {
            Leg::Lost => return self.lost(node, start).await,
            Leg::At(t) => {
                self.net.sleep_to(t).await;
            }
        }
        if !self.alive() {
            return std::future::pending().await;
        }
        drove_replica::local::into_result(resp, data)
    }
}

impl Transport for SimTransport {
    fn me(&self) -> NodeId {
        self.me
    }

    fn call(
        &self,
        node: NodeId,
        req: PeerReq,
        payload: Bytes,
    ) -> BoxFuture<'_, Result<(PeerResp, Bytes)>> {
        {
            let mut st = self.net.st.lock();
            st.traffic.calls += 1;
            if matches!(req, PeerReq::List { .. }) {
                st.traffic.lists += 1;
            }
        }
        Box::pin(async move {
            let limit = self.net.model.request_timeout;
            match tokio::time::timeout(limit, self.call_inner(node, req, payload)).await {
                Ok(r) => r,
                // A crashed process does nothing more.
                Err(_) if !self.alive() => std::future::pending().await,
                Err(_) => Err(Error::unavailable(format!(
                    "Node {node} did not answer within {limit:?}"
                ))),
            }
        })
    }

    fn rtt(&self, node: NodeId) -> Option<Duration> {
        let st = self.net.st.lock();
        let (za, zb) = (st.zone.get(&self.me)?, st.zone.get(&node)?);
        Some(self.net.model.delay(*za, *zb) * 2)
    }

    fn rtt_high(&self, node: NodeId) -> Option<Duration> {
        self.rtt(node)
            .map(|r| r + r / 4 + Duration::from_micros(500))
    }

    fn silent_within(&self, node: NodeId, within: Duration) -> bool {
        self.net
            .st
            .lock()
            .silenced
            .get(&(self.me, node))
            .is_some_and(|t| t.elapsed() <= within)
    }
}
