//! The client side of the peer transport: one multiplexed TCP connection per peer.
//!
//! Many requests are in flight on a connection at once; each carries an id and the
//! reader task hands each response to the caller waiting for that id. A writer task
//! owns the socket's write half and coalesces queued frames into one write. When the
//! connection breaks, every waiter gets `Unavailable` and the next request dials
//! again. Every wait has a timeout.
//!
//! A new connection starts with a hello naming this node's cluster and wire
//! version; a peer that refuses it (another cluster, another version) is
//! `Unavailable` with its reason. A connection left idle for half the server's
//! [`PEER_IDLE`] is not used again but replaced, so that the server never closes
//! one as a request travels on it.
use bytes::Bytes;
use drove_metrics::Metrics;
use drove_proto::{Frame, Hello, PeerReq, PeerResp};
use drove_types::{ClusterId, Error, NodeId, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::server::PEER_IDLE;
use crate::MapCell;

/// A connection unused for this long is replaced rather than used: the server
/// closes connections silent for [`PEER_IDLE`], and this leaves it a wide margin.
const CLIENT_IDLE: Duration = Duration::from_secs(PEER_IDLE.as_secs() / 2);

/// How long to wait for peers.
#[derive(Debug, Clone, Copy)]
pub struct PeerTimeouts {
    /// TCP connect.
    pub connect: Duration,
    /// One request's answer.
    pub request: Duration,
}

impl Default for PeerTimeouts {
    fn default() -> Self {
        PeerTimeouts {
            connect: Duration::from_secs(2),
            request: Duration::from_secs(10),
        }
    }
}

type Waiter = oneshot::Sender<Frame<PeerResp>>;

struct Conn {
    tx: mpsc::Sender<drove_proto::Encoded>,
    pending: Mutex<HashMap<u64, Waiter>>,
    dead: AtomicBool,
    /// When a request was last sent on it.
    last_used: Mutex<Instant>,
    /// The reader and writer tasks; aborting them closes the socket.
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Conn {
    /// Whether it has carried nothing for `CLIENT_IDLE` and waits for nothing.
    fn idle(&self) -> bool {
        self.last_used.lock().elapsed() >= CLIENT_IDLE && self.pending.lock().is_empty()
    }

    fn take(&self, id: u64) -> Option<Waiter> {
        self.pending.lock().remove(&id)
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
    hello: Hello,
    map: Arc<MapCell>,
    conns: Mutex<HashMap<NodeId, Arc<Conn>>>,
    dial_lock: tokio::sync::Mutex<()>,
    next_id: AtomicU64,
    timeouts: PeerTimeouts,
    metrics: Arc<Metrics>,
    routes: Option<PathBuf>,
    /// The routes file's modification time when last looked at.
    routes_seen: Mutex<Option<std::time::SystemTime>>,
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
        Self::build(Hello::new(cluster, me), map, timeouts, metrics, None)
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
        Self::build(
            Hello::new(cluster, me),
            map,
            timeouts,
            metrics,
            Some(routes),
        )
    }

    fn build(
        hello: Hello,
        map: Arc<MapCell>,
        timeouts: PeerTimeouts,
        metrics: Arc<Metrics>,
        routes: Option<PathBuf>,
    ) -> Arc<Self> {
        Arc::new(PeerPool {
            me: hello.node,
            hello,
            map,
            conns: Mutex::new(HashMap::new()),
            dial_lock: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
            timeouts,
            metrics,
            routes,
            routes_seen: Mutex::new(None),
        })
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

    /// This node.
    pub fn me(&self) -> NodeId {
        self.me
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
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Frame {
            id,
            header: req,
            payload,
        }
        .encode_parts()
        .map_err(|e| Error::invalid(format!("Cannot encode request: {e}")))?;
        let (tx, rx) = oneshot::channel();
        conn.pending.lock().insert(id, tx);
        if conn.tx.send(frame).await.is_err() {
            conn.kill();
            return Err(Error::unavailable(format!(
                "Connection to node {node} closed"
            )));
        }
        match tokio::time::timeout(self.timeouts.request, rx).await {
            Ok(Ok(frame)) => crate::local::into_result(frame.header, frame.payload),
            Ok(Err(_)) => Err(Error::unavailable(format!(
                "Connection to node {node} broke before it answered"
            ))),
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
        // One dial at a time, so a burst of requests opens one connection, not many.
        let _g = self.dial_lock.lock().await;
        if let Some(c) = self.live(node) {
            return Ok(c);
        }
        let map = self.map.get();
        let addr = map
            .node(node)
            .map(|n| n.peer_addr.clone())
            .ok_or_else(|| Error::unavailable(format!("Node {node} is not in the cluster map")))?;
        let addr = self.route(addr);
        let dial = async {
            let mut stream = TcpStream::connect(&addr).await.map_err(|e| {
                Error::unavailable(format!("Cannot connect to node {node} at {addr}"))
                    .with_source(e)
            })?;
            let _ = stream.set_nodelay(true);
            crate::hello::client(&mut stream, &self.hello, node, &addr).await?;
            Ok::<_, Error>(stream)
        };
        let stream = tokio::time::timeout(self.timeouts.connect, dial)
            .await
            .map_err(|_| {
                Error::unavailable(format!(
                    "Connecting to node {node} at {addr} (with the hello) timed out"
                ))
            })??;
        let conn = self.spawn_conn(node, stream);
        self.conns.lock().insert(node, conn.clone());
        Ok(conn)
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

    fn spawn_conn(&self, node: NodeId, stream: TcpStream) -> Arc<Conn> {
        let (rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::channel::<drove_proto::Encoded>(1024);
        let conn = Arc::new(Conn {
            tx,
            pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            last_used: Mutex::new(Instant::now()),
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
        let r = tokio::spawn(async move {
            let mut rd = BufReader::with_capacity(256 << 10, rd);
            while let Ok(Some((frame, n))) = Frame::<PeerResp>::read_from(&mut rd).await {
                metrics.peer_received(&label, n as u64);
                if let Some(w) = rconn.take(frame.id) {
                    let _ = w.send(frame);
                }
            }
            rconn.kill();
        });
        conn.tasks
            .lock()
            .extend([w.abort_handle(), r.abort_handle()]);
        conn
    }
}
