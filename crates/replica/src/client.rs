//! The client side of the peer transport: one multiplexed TCP connection per peer.
//!
//! Many requests are in flight on a connection at once; each carries an id and the
//! reader task hands each response to the caller waiting for that id. A writer task
//! owns the socket's write half and coalesces queued frames into one write. When the
//! connection breaks, every waiter gets `Unavailable` and the next request dials
//! again. Every wait has a timeout.
//!
//! Each connection has a watchdog ([`crate::liveness`]): a peer that says nothing
//! while requests wait is pinged, then given up, and its waiters fail at once
//! (instead of after the 10 s request timeout); so is a peer the map marks down.
//! Pings also measure each peer's round trip ([`PeerPool::rtt`]).
//!
//! A new connection starts with a hello naming this node's cluster and wire
//! versions, which chooses the version the connection's frames carry; a peer that
//! refuses it (another cluster, no common version) is `Unavailable` with its
//! reason, logged at most once a second. A connection left idle for half the server's
//! [`PEER_IDLE`] is not used again but replaced, so that the server never closes
//! one as a request travels on it.
use bytes::Bytes;
use drove_metrics::Metrics;
use drove_proto::{Frame, PeerReq, PeerResp, ReadLimits, Speaker};
use drove_types::{ClusterId, Epoch, Error, NodeId, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::TlsConnector;

use crate::accept::LogEvery;
use crate::liveness::{Liveness, Rtt, Verdict, DEFAULT_SILENCE_FLOOR};
use crate::server::{ReadHalf, WriteHalf, PEER_IDLE};
use crate::MapCell;

/// How often a connection's watchdog looks at it.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// How long requests to a peer given up as silent fail at once while the map still
/// shows it up (the gateway has it marked down meanwhile).
pub(crate) const SILENT_FAIL_FAST: Duration = Duration::from_secs(10);

/// How often an idle connection in use is pinged to keep its round trip measured.
const PING_EVERY: Duration = Duration::from_secs(1);

/// A connection unused for this long is replaced rather than used: the server
/// closes connections silent for [`PEER_IDLE`], and this leaves it a wide margin.
const CLIENT_IDLE: Duration = Duration::from_secs(PEER_IDLE.as_secs() / 2);

/// How long to wait for peers.
#[derive(Debug, Clone, Copy)]
pub struct PeerTimeouts {
    /// TCP connect.
    pub connect: Duration,
    /// One request's answer, at most (a silent peer is given up much sooner).
    pub request: Duration,
    /// The least time a peer may say nothing while requests wait on it before it is
    /// given up (more for a peer with a long round trip; see [`crate::liveness`]).
    pub silence_floor: Duration,
}

impl Default for PeerTimeouts {
    fn default() -> Self {
        PeerTimeouts {
            connect: Duration::from_secs(2),
            request: Duration::from_secs(10),
            silence_floor: DEFAULT_SILENCE_FLOOR,
        }
    }
}

type Waiter = oneshot::Sender<Frame<PeerResp>>;

struct Conn {
    tx: mpsc::Sender<drove_proto::Encoded>,
    /// The wire version the hello chose: every frame on it carries this one.
    version: u8,
    /// Waiters by request id, with when each request was sent.
    pending: Mutex<HashMap<u64, (Waiter, Instant)>>,
    dead: AtomicBool,
    /// When a request was last sent on it.
    last_used: Mutex<Instant>,
    /// When the peer last sent anything on it.
    heard: Mutex<Instant>,
    /// The ping out on it, unanswered: its id and when it left.
    probe: Mutex<Option<(u64, Instant)>>,
    /// Why it was given up (silent peer, peer marked down), for the waiters' errors.
    gave_up: Mutex<Option<String>>,
    /// The reader, writer and watchdog tasks; aborting them closes the socket.
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Conn {
    /// Whether it has carried nothing for `CLIENT_IDLE` and waits for nothing.
    fn idle(&self) -> bool {
        self.last_used.lock().elapsed() >= CLIENT_IDLE && self.pending.lock().is_empty()
    }

    fn take(&self, id: u64) -> Option<Waiter> {
        self.pending.lock().remove(&id).map(|(w, _)| w)
    }

    /// When the oldest waiting request was sent.
    fn oldest(&self) -> Option<Instant> {
        self.pending.lock().values().map(|(_, at)| *at).min()
    }

    /// Give the peer up: every waiter fails at once with `why`.
    fn give_up(&self, why: String) {
        *self.gave_up.lock() = Some(why);
        self.close();
    }

    fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        // Dropping the senders wakes every waiter with an error.
        self.pending.lock().clear();
    }

    /// Kill and close the socket now (a route changed).
    fn close(&self) {
        self.kill();
        for h in self.tasks.lock().drain(..) {
            h.abort();
        }
    }
}

/// Connections to every peer, dialled on first use.
pub struct PeerPool {
    me: NodeId,
    /// What this node says when it dials.
    speaker: Speaker,
    /// Hello refusals are logged at most once a second: every request redials.
    refusals: Mutex<LogEvery>,
    map: Arc<MapCell>,
    conns: Mutex<HashMap<NodeId, Arc<Conn>>>,
    /// One dial at a time per peer: a peer that does not answer its connect must
    /// not hold up dials to the others.
    dials: Mutex<HashMap<NodeId, Arc<tokio::sync::Mutex<()>>>>,
    next_id: Arc<AtomicU64>,
    /// Round trips measured by pings, per peer (kept across reconnections).
    rtts: Arc<Mutex<HashMap<NodeId, Rtt>>>,
    /// When each peer was last given up as silent, and the map's epoch then.
    silenced: Arc<Mutex<HashMap<NodeId, (Instant, Epoch)>>>,
    timeouts: PeerTimeouts,
    metrics: Arc<Metrics>,
    routes: Option<PathBuf>,
    /// The routes file's modification time when last looked at.
    routes_seen: Mutex<Option<std::time::SystemTime>>,
    /// Mutual TLS with the peers, once [`PeerPool::set_tls`] set it.
    tls: OnceLock<TlsConnector>,
}

/// How often the routes file is looked at for changes.
const ROUTES_CHECK: Duration = Duration::from_millis(500);

impl PeerPool {
    /// A pool for node `me` of `cluster`, finding peer addresses in `map`.
    pub fn new(
        me: NodeId,
        cluster: ClusterId,
        map: Arc<MapCell>,
        timeouts: PeerTimeouts,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Self::speaking(Speaker::new(cluster, me), map, timeouts, metrics, None)
    }

    /// Like [`PeerPool::new`], with a routes file: a JSON object mapping a peer
    /// address to the address to dial instead (`{"127.0.0.1:7001": "127.0.0.1:9001"}`).
    /// Benchmarks use it to send cross-zone traffic through a WAN delay proxy.
    pub fn with_routes(
        me: NodeId,
        cluster: ClusterId,
        map: Arc<MapCell>,
        timeouts: PeerTimeouts,
        metrics: Arc<Metrics>,
        routes: PathBuf,
    ) -> Arc<Self> {
        Self::speaking(
            Speaker::new(cluster, me),
            map,
            timeouts,
            metrics,
            Some(routes),
        )
    }

    /// A pool for the node `speaker` names, speaking its wire versions (a node's
    /// own, [`drove_proto::WireRange::for_node`]), with an optional routes file.
    pub fn speaking(
        speaker: Speaker,
        map: Arc<MapCell>,
        timeouts: PeerTimeouts,
        metrics: Arc<Metrics>,
        routes: Option<PathBuf>,
    ) -> Arc<Self> {
        Arc::new(PeerPool {
            me: speaker.node,
            speaker,
            refusals: Mutex::new(LogEvery::new(Duration::from_secs(1))),
            map,
            conns: Mutex::new(HashMap::new()),
            dials: Mutex::new(HashMap::new()),
            next_id: Arc::new(AtomicU64::new(1)),
            rtts: Arc::default(),
            silenced: Arc::default(),
            timeouts,
            metrics,
            routes,
            routes_seen: Mutex::new(None),
            tls: OnceLock::new(),
        })
    }

    /// Dial every peer with TLS from now on (before the first dial; set once):
    /// `config` presents this node's certificate and accepts only the cluster's
    /// nodes (see `drove_tls::peer_client_config`).
    pub fn set_tls(&self, config: Arc<rustls::ClientConfig>) {
        let _ = self.tls.set(TlsConnector::from(config));
    }

    /// Look at the routes file for changes every [`ROUTES_CHECK`] and drop the
    /// connections dialled before a change (off the request path: no stat per call).
    pub async fn watch_routes(self: Arc<Self>) {
        if self.routes.is_none() {
            return;
        }
        loop {
            self.check_routes();
            tokio::time::sleep(ROUTES_CHECK).await;
        }
    }

    /// Drop every connection when the routes file changed: connections dialled
    /// before a route was set must not keep bypassing it.
    fn check_routes(&self) {
        let Some(path) = &self.routes else {
            return;
        };
        let mut seen = self.routes_seen.lock();
        let mtime = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if mtime == *seen {
            return;
        }
        *seen = mtime;
        drop(seen);
        for (_, c) in self.conns.lock().drain() {
            c.close();
        }
    }

    /// The cluster map the pool finds its peers in.
    pub(crate) fn map(&self) -> &Arc<MapCell> {
        &self.map
    }

    /// This node.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// The wire versions this node speaks.
    pub fn wire(&self) -> drove_proto::WireRange {
        self.speaker.wire
    }

    /// The wire version of the open connection to `node`, if there is one.
    pub fn wire_version(&self, node: NodeId) -> Option<u8> {
        let conns = self.conns.lock();
        conns
            .get(&node)
            .filter(|c| !c.dead.load(Ordering::SeqCst))
            .map(|c| c.version)
    }

    /// Whether `node` was given up as silent within `within`.
    pub fn silent_within(&self, node: NodeId, within: Duration) -> bool {
        self.silenced
            .lock()
            .get(&node)
            .is_some_and(|(t, _)| t.elapsed() <= within)
    }

    /// The smoothed round trip to `node`, once pings measured it.
    pub fn rtt(&self, node: NodeId) -> Option<Duration> {
        self.rtts.lock().get(&node).and_then(Rtt::smoothed)
    }

    /// A round trip to `node` longer than almost all measured ones (`srtt + 4
    /// rttvar`), once pings measured it: the gateway hedges reads from it.
    pub fn rtt_high(&self, node: NodeId) -> Option<Duration> {
        self.rtts.lock().get(&node).and_then(Rtt::high)
    }

    /// Send `req` with `payload` to `node` and wait for its answer. A
    /// [`PeerResp::Err`] answer is returned as an error.
    pub async fn call(
        &self,
        node: NodeId,
        req: PeerReq,
        payload: Bytes,
    ) -> Result<(PeerResp, Bytes)> {
        let start = Instant::now();
        let op = req.op_name();
        let sent = payload.len() as u64;
        let res = self.call_inner(node, req, payload).await;
        let bytes = match &res {
            Ok((_, p)) => sent + p.len() as u64,
            Err(_) => sent,
        };
        self.metrics
            .peer_client_op(op, bytes, start.elapsed().as_secs_f64(), res.is_ok());
        res
    }

    async fn call_inner(
        &self,
        node: NodeId,
        req: PeerReq,
        payload: Bytes,
    ) -> Result<(PeerResp, Bytes)> {
        let conn = self.conn(node).await?;
        self.call_on(&conn, node, req, payload).await
    }

    /// Ask `node` whether it answers at all, within `within`: a ping on a live
    /// connection or a fresh one, even for a node given up as silent a moment ago
    /// (the gateway asks before marking down a replica whose request failed). An
    /// answer clears the silence; an error answer (a refused epoch) is an answer.
    ///
    /// A dial that gets no answer is tried again after 100 ms, then after twice as
    /// long, and so on within `within`: a SYN lost to a cut that has since healed
    /// would otherwise wait for TCP's own retransmission (1 s).
    pub async fn probe(&self, node: NodeId, within: Duration) -> Result<()> {
        let epoch = self.map.get().epoch;
        let end = tokio::time::Instant::now() + within;
        let mut step = Duration::from_millis(100);
        loop {
            let left = end.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(Error::unavailable(format!(
                    "Node {node} did not answer a ping within {} ms",
                    within.as_millis()
                )));
            }
            let ask = async {
                let conn = self.dial(node).await?;
                self.call_on(&conn, node, PeerReq::Ping { epoch }, Bytes::new())
                    .await
            };
            let answered = match tokio::time::timeout(step.min(left), ask).await {
                Ok(Ok(_)) => true,
                Ok(Err(e)) if e.kind() != drove_types::ErrorKind::Unavailable => true,
                // Refused or reset: nobody listens there now.
                Ok(Err(e)) => return Err(e),
                Err(_) => false,
            };
            if answered {
                self.silenced.lock().remove(&node);
                return Ok(());
            }
            step *= 2;
        }
    }

    async fn call_on(
        &self,
        conn: &Conn,
        node: NodeId,
        req: PeerReq,
        payload: Bytes,
    ) -> Result<(PeerResp, Bytes)> {
        let forward = req.forward().to_vec();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Frame {
            id,
            // What the connection's version has: a peer of an older version is
            // never sent a request it does not know.
            header: req.in_version(conn.version),
            payload,
        }
        .encode_as(conn.version)
        .map_err(|e| Error::invalid(format!("Cannot encode request: {e}")))?;
        let (tx, rx) = oneshot::channel();
        conn.pending.lock().insert(id, (tx, Instant::now()));
        if conn.tx.send(frame).await.is_err() {
            conn.kill();
            return Err(Error::unavailable(format!(
                "Connection to node {node} closed"
            )));
        }
        match tokio::time::timeout(self.timeouts.request, rx).await {
            Ok(Ok(frame)) => {
                if let PeerResp::ForwardFailed {
                    node: behind,
                    silent: true,
                    ..
                } = &frame.header
                {
                    self.heard_silent(node, *behind, &forward);
                }
                crate::local::into_result(frame.header, frame.payload)
            }
            Ok(Err(_)) => Err(Error::unavailable(
                conn.gave_up.lock().clone().unwrap_or_else(|| {
                    format!("Connection to node {node} broke before it answered")
                }),
            )),
            Err(_) => {
                conn.take(id);
                Err(Error::unavailable(format!(
                    "Node {node} did not answer within {:?}",
                    self.timeouts.request
                )))
            }
        }
    }

    async fn conn(&self, node: NodeId) -> Result<Arc<Conn>> {
        if let Some(c) = self.live(node) {
            return Ok(c);
        }
        self.refuse_if_silent(node)?;
        self.dial(node).await
    }

    /// The live connection to `node`, or a new one.
    async fn dial(&self, node: NodeId) -> Result<Arc<Conn>> {
        if let Some(c) = self.live(node) {
            return Ok(c);
        }
        // One dial at a time per peer, so a burst of requests opens one connection.
        let dial_lock = self.dials.lock().entry(node).or_default().clone();
        let _g = dial_lock.lock().await;
        if let Some(c) = self.live(node) {
            return Ok(c);
        }
        let map = self.map.get();
        let addr = map
            .node(node)
            .map(|n| n.peer_addr.clone())
            .ok_or_else(|| Error::unavailable(format!("Node {node} is not in the cluster map")))?;
        let addr = self.route(addr);
        // The kernel of a stopped process still accepts connections: its silence
        // shows at the hello, which a live peer answers within a round trip.
        let live = Liveness::for_peer(
            &self.rtts.lock().get(&node).copied().unwrap_or_default(),
            self.timeouts.silence_floor,
        );
        let dial = async {
            let mut stream = TcpStream::connect(&addr).await.map_err(|e| {
                Error::unavailable(format!("Cannot connect to node {node} at {addr}"))
                    .with_source(e)
            })?;
            let _ = stream.set_nodelay(true);
            let silent = || {
                Error::unavailable(format!(
                    "Node {node} at {addr} accepted a connection but did not answer its hello within {} ms (silent)",
                    live.silent_after.as_millis()
                ))
            };
            let halves: (ReadHalf, WriteHalf, u8) = match self.tls.get() {
                None => {
                    let hello = crate::hello::client(
                        &mut stream,
                        &self.speaker,
                        node,
                        &addr,
                        &self.refusals,
                    );
                    let version = tokio::time::timeout(live.silent_after, hello)
                        .await
                        .map_err(|_| silent())??;
                    let (r, w) = stream.into_split();
                    (Box::new(r), Box::new(w), version)
                }
                Some(tls) => {
                    // Reads buffered below TLS (crate::readahead).
                    let stream = crate::readahead::ReadAhead::new(stream);
                    let shake = tls.connect(drove_tls::peer_server_name(), stream);
                    let mut s = tokio::time::timeout(live.silent_after, shake)
                        .await
                        .map_err(|_| silent())?
                        .map_err(|e| {
                            Error::unavailable(format!(
                                "Node {node} at {addr}: TLS handshake failed: {e}"
                            ))
                        })?;
                    let hello =
                        crate::hello::client(&mut s, &self.speaker, node, &addr, &self.refusals);
                    let version = tokio::time::timeout(live.silent_after, hello)
                        .await
                        .map_err(|_| silent())??;
                    let (r, w) = tokio::io::split(s);
                    (Box::new(r), Box::new(w), version)
                }
            };
            Ok::<_, Error>(halves)
        };
        let (rd, wr, version) = tokio::time::timeout(self.timeouts.connect, dial)
            .await
            .map_err(|_| {
                Error::unavailable(format!(
                    "Connecting to node {node} at {addr} (with the hello) timed out"
                ))
            })??;
        self.metrics.peer_wire_version(&node.to_string(), version);
        if version < self.speaker.wire.max {
            // Mixed versions, as during a rolling upgrade: worth a line per dial.
            tracing::info!(%node, "peer connection in drove wire version {version}, the highest node {node} and this node (versions {}) both speak", self.speaker.wire);
        }
        let conn = self.spawn_conn(node, rd, wr, version);
        self.conns.lock().insert(node, conn.clone());
        Ok(conn)
    }

    /// Fail at once for a node given up as silent while the map has not changed
    /// since: the gateway is having it marked down, and dialling it again would only
    /// wait out another silence. Once the map moved on (it was marked down, and
    /// maybe up again after its catch-up), or the silence is old, dial.
    /// The primary `via` says `node`, to which it passed a write on, went silent. Take
    /// its word (so that writing to `node` directly fails at once rather than after a
    /// silence of its own) only for a node the write named and that this pool has not
    /// itself heard from within its silence floor.
    fn heard_silent(&self, via: NodeId, node: NodeId, forward: &[NodeId]) {
        if !forward.contains(&node) || node == self.me {
            return;
        }
        if let Some(c) = self.live(node) {
            if c.heard.lock().elapsed() < self.timeouts.silence_floor {
                return;
            }
            c.give_up(format!("Node {via} found node {node} silent"));
        }
        tracing::warn!(%node, "node {via} found node {node} silent behind a primary-copy write");
        self.silenced
            .lock()
            .insert(node, (Instant::now(), self.map.get().epoch));
    }

    fn refuse_if_silent(&self, node: NodeId) -> Result<()> {
        let mut silenced = self.silenced.lock();
        let Some(&(at, epoch)) = silenced.get(&node) else {
            return Ok(());
        };
        if self.map.get().epoch == epoch && at.elapsed() < SILENT_FAIL_FAST {
            return Err(Error::unavailable(format!(
                "Node {node} went silent {} ms ago",
                at.elapsed().as_millis()
            )));
        }
        silenced.remove(&node);
        Ok(())
    }

    /// Translate a peer address through the routes file, if one is set and names it.
    /// The file is read at every dial (dials are rare), so it can be written after
    /// the node started.
    fn route(&self, addr: String) -> String {
        let Some(path) = &self.routes else {
            return addr;
        };
        let Ok(bytes) = std::fs::read(path) else {
            return addr;
        };
        match serde_json::from_slice::<HashMap<String, String>>(&bytes) {
            Ok(routes) => routes.get(&addr).cloned().unwrap_or(addr),
            Err(e) => {
                tracing::warn!("ignoring {}: {e}", path.display());
                addr
            }
        }
    }

    fn live(&self, node: NodeId) -> Option<Arc<Conn>> {
        let mut m = self.conns.lock();
        let c = m.get(&node)?;
        if c.idle() {
            c.close();
            m.remove(&node);
            return None;
        }
        if c.dead.load(Ordering::SeqCst) {
            return None;
        }
        // Marked used under the map's lock, so no other caller can find it idle
        // and close it between here and the request being queued.
        *c.last_used.lock() = Instant::now();
        Some(c.clone())
    }

    fn spawn_conn(&self, node: NodeId, rd: ReadHalf, wr: WriteHalf, version: u8) -> Arc<Conn> {
        let (tx, rx) = mpsc::channel::<drove_proto::Encoded>(1024);
        let conn = Arc::new(Conn {
            tx,
            version,
            pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            last_used: Mutex::new(Instant::now()),
            heard: Mutex::new(Instant::now()),
            probe: Mutex::new(None),
            gave_up: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
        });
        let label = node.to_string();
        let metrics = self.metrics.clone();
        let wconn = conn.clone();
        let w = tokio::spawn(async move {
            let _ = crate::writer::drain(rx, wr, |n| metrics.peer_sent(&label, n as u64)).await;
            wconn.kill();
        });
        let rconn = conn.clone();
        let metrics = self.metrics.clone();
        let label = node.to_string();
        let rtts = self.rtts.clone();
        let r = tokio::spawn(async move {
            let mut rd = BufReader::with_capacity(256 << 10, rd);
            let limits = ReadLimits {
                version,
                ..ReadLimits::default()
            };
            while let Ok(Some((frame, n))) = Frame::<PeerResp>::read_limited(&mut rd, &limits).await
            {
                let now = Instant::now();
                *rconn.heard.lock() = now;
                metrics.peer_received(&label, n as u64);
                let probe = *rconn.probe.lock();
                match probe {
                    Some((id, sent)) if id == frame.id => {
                        *rconn.probe.lock() = None;
                        let mut rtts = rtts.lock();
                        let rtt = rtts.entry(node).or_default();
                        rtt.sample(now - sent);
                        if let Some(s) = rtt.smoothed() {
                            metrics.peer_rtt(&label, s.as_secs_f64());
                        }
                    }
                    _ => {
                        if let Some(w) = rconn.take(frame.id) {
                            let _ = w.send(frame);
                        }
                    }
                }
            }
            rconn.kill();
        });
        let watch = tokio::spawn(watchdog(
            Arc::downgrade(&conn),
            node,
            Watch {
                map: self.map.clone(),
                rtts: self.rtts.clone(),
                next_id: self.next_id.clone(),
                floor: self.timeouts.silence_floor,
                metrics: self.metrics.clone(),
                silenced: self.silenced.clone(),
            },
        ));
        conn.tasks
            .lock()
            .extend([w.abort_handle(), r.abort_handle(), watch.abort_handle()]);
        conn
    }
}

/// Watch one connection until it dies: ping a peer that is quiet while requests
/// wait, give up one that stays silent or that the map marks down, and ping an idle
/// peer now and then to keep its round trip measured.
/// What a connection's watchdog shares with its pool.
struct Watch {
    map: Arc<MapCell>,
    rtts: Arc<Mutex<HashMap<NodeId, Rtt>>>,
    next_id: Arc<AtomicU64>,
    floor: Duration,
    metrics: Arc<Metrics>,
    silenced: Arc<Mutex<HashMap<NodeId, (Instant, Epoch)>>>,
}

async fn watchdog(conn: std::sync::Weak<Conn>, node: NodeId, w: Watch) {
    let Watch {
        map,
        rtts,
        next_id,
        floor,
        metrics,
        silenced,
    } = w;
    let mut last_ping = Instant::now();
    loop {
        let asleep = Instant::now();
        tokio::time::sleep(WATCH_EVERY).await;
        // Woken far too late: this process was starved, and the peer's answers may
        // sit unread in the socket. Let the reader run before judging anyone.
        let stalled = asleep.elapsed() > WATCH_EVERY * 4;
        let Some(conn) = conn.upgrade() else { return };
        if conn.dead.load(Ordering::SeqCst) {
            return;
        }
        let marked_down = map
            .get()
            .node(node)
            .is_none_or(|n| n.state != drove_types::NodeState::Up);
        if marked_down {
            conn.give_up(format!("Node {node} is marked down"));
            return;
        }
        let live = Liveness::for_peer(&rtts.lock().get(&node).copied().unwrap_or_default(), floor);
        let now = Instant::now();
        // A ping unanswered for a whole silence is forgotten, so another can go.
        let probing = match *conn.probe.lock() {
            Some((_, sent)) => now.duration_since(sent) < live.silent_after,
            None => false,
        };
        let heard = *conn.heard.lock();
        let oldest = conn.oldest();
        let idle_ping = oldest.is_none()
            && !probing
            && now.duration_since(last_ping) >= PING_EVERY
            && conn.last_used.lock().elapsed() < CLIENT_IDLE;
        match live.judge(now, oldest, heard, probing) {
            Verdict::Silent(_) if stalled => continue,
            Verdict::Silent(quiet) => {
                let why = format!(
                    "Node {node} said nothing for {} ms while requests waited (silent: stopped or cut off?)",
                    quiet.as_millis()
                );
                tracing::warn!(%node, "{why}");
                metrics.peer_silent(&node.to_string());
                silenced
                    .lock()
                    .insert(node, (Instant::now(), map.get().epoch));
                conn.give_up(why);
                return;
            }
            Verdict::Probe => ping(&conn, &next_id, now),
            Verdict::Wait if idle_ping => ping(&conn, &next_id, now),
            Verdict::Wait => continue,
        }
        last_ping = now;
    }
}

/// Send a ping on `conn` without waiting for room (a full queue means requests are
/// flowing; the peer's answers to them say enough).
fn ping(conn: &Conn, next_id: &AtomicU64, now: Instant) {
    let id = next_id.fetch_add(1, Ordering::Relaxed);
    let frame = Frame {
        id,
        header: PeerReq::Ping {
            epoch: drove_types::Epoch(0),
        },
        payload: Bytes::new(),
    };
    if let Ok(encoded) = frame.encode_as(conn.version) {
        if conn.tx.try_send(encoded).is_ok() {
            *conn.probe.lock() = Some((id, now));
        }
    }
}
