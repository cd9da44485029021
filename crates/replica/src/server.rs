//! The peer side of the transport: accepts connections from other nodes' gateways
//! and applies their requests to the local object store, concurrently, answering
//! out of order. A primary-copy write is also forwarded to the nodes it names, and
//! answered only when they all have it.
//!
//! Every byte from the network is hostile until proven otherwise, so a connection
//! is held to [`ServerLimits`]: it must say hello (same cluster, a wire version in common)
//! within seconds, in one small frame; afterwards it may stay silent for
//! [`PEER_IDLE`], and a frame that has begun must be complete within [`FRAME_STALL`].
//! Memory for frames being received comes from one budget shared by every
//! connection, taken before a body is allocated; the number of connections is
//! capped, in all and per client address, with a share kept for the nodes of the
//! map ([`crate::admission`]); a failed accept is retried ([`crate::accept`]).
//! Garbage on the port closes that connection and nothing else.
//!
//! The port also carries the metadata's internal HTTP routes (Raft, forwarded
//! writes, joins, heartbeats), so that node-to-node traffic has one port and the
//! public admin API has none of it: a connection whose first byte starts an HTTP
//! method (an upper-case letter other than the `D` of every frame's magic) is
//! handed to the [`HttpHandoff`] set with [`PeerServer::set_http`], under the same
//! connection cap.
use bytes::Bytes;
use drove_metrics::Metrics;
use drove_proto::{Budget, Frame, PeerReq, PeerResp, ReadLimits, WireError, MAX_FRAME};
use drove_types::{ClusterId, Result};
use parking_lot::Mutex;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::accept::{Acceptor, LogEvery};
use crate::admission::{ConnLimits, KnownNodes};
use crate::hello::Greeter;
use crate::local::LocalStore;
use crate::stall::WriteDeadline;
use crate::PeerPool;

/// Requests one connection may have in flight.
const MAX_IN_FLIGHT: usize = 256;

/// A connection that sends nothing for this long is closed. Peer pools stop using
/// a connection idle for half of it (see `client.rs`), so the server never closes
/// one under a request that is on its way.
pub const PEER_IDLE: Duration = Duration::from_secs(600);

/// A frame must be received whole within this once its first byte arrived
/// (waiting for the frame budget included). 4 MiB in 30 s needs 140 KB/s.
pub const FRAME_STALL: Duration = Duration::from_secs(30);

/// What one peer server accepts; [`ServerLimits::default`] is what a node uses.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Open connections at most; more are closed at once.
    pub max_conns: usize,
    /// Open connections at most from one address that is not a node of the map
    /// (or loopback): a node joining, or a stranger.
    pub per_client: usize,
    /// Of `max_conns`, how many only the map's nodes and loopback may take.
    pub reserved: usize,
    /// Time to say hello after connecting.
    pub hello: Duration,
    /// Silence after which a connection is closed.
    pub idle: Duration,
    /// Time to receive a frame once begun; also how long a write of answers may
    /// make no progress.
    pub stall: Duration,
    /// Bytes of frames being received, across every connection.
    pub budget: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_conns: 4096,
            per_client: 256,
            reserved: 1024,
            hello: Duration::from_secs(10),
            idle: PEER_IDLE,
            stall: FRAME_STALL,
            budget: 256 << 20,
        }
    }
}

/// A connection of the peer port: TCP, or TLS over TCP.
pub trait PeerIo: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> PeerIo for T {}

/// The reading half of a peer connection.
pub(crate) type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a peer connection.
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// Who serves the connections of the peer port that speak HTTP.
pub trait HttpHandoff: Send + Sync + 'static {
    /// Serve `stream` (nothing read from it yet) until it closes.
    fn serve(
        &self,
        stream: Box<dyn PeerIo>,
        peer: SocketAddr,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// What the first byte of a connection says it speaks.
#[derive(Debug, PartialEq, Eq)]
enum Speaks {
    /// drove frames (or garbage, which the hello refuses).
    Frames,
    /// An HTTP request line.
    Http,
    /// Nothing within the hello time, or closed.
    Nothing,
}

/// Look at (without taking) the first byte of `stream`, waiting at most `wait`.
async fn sniff(stream: &TcpStream, wait: Duration) -> Speaks {
    let mut first = [0u8; 1];
    match tokio::time::timeout(wait, stream.peek(&mut first)).await {
        Ok(Ok(1)) if first[0].is_ascii_uppercase() && first[0] != b'D' => Speaks::Http,
        Ok(Ok(1)) => Speaks::Frames,
        _ => Speaks::Nothing,
    }
}

/// Serves this node's object store to its peers.
pub struct PeerServer {
    local: Arc<LocalStore>,
    pool: Arc<PeerPool>,
    metrics: Arc<Metrics>,
    limits: ServerLimits,
    budget: Budget,
    greeter: Greeter,
    http: OnceLock<Arc<dyn HttpHandoff>>,
    tls: OnceLock<TlsAcceptor>,
}

impl PeerServer {
    /// A server over `local` for a node of `cluster`, with the default limits;
    /// `pool` (whose node id is this node's) forwards primary-copy writes.
    pub fn new(
        local: Arc<LocalStore>,
        pool: Arc<PeerPool>,
        metrics: Arc<Metrics>,
        cluster: ClusterId,
    ) -> Arc<Self> {
        Self::with_limits(local, pool, metrics, cluster, ServerLimits::default())
    }

    /// [`PeerServer::new`] with other limits.
    pub fn with_limits(
        local: Arc<LocalStore>,
        pool: Arc<PeerPool>,
        metrics: Arc<Metrics>,
        cluster: ClusterId,
        limits: ServerLimits,
    ) -> Arc<Self> {
        let greeter = Greeter {
            mine: drove_proto::Speaker {
                cluster,
                node: pool.me(),
                wire: pool.wire(),
            },
            wait: limits.hello,
            log: Mutex::new(LogEvery::new(Duration::from_secs(1))),
        };
        Arc::new(PeerServer {
            local,
            pool,
            metrics,
            limits,
            budget: Budget::new(limits.budget),
            greeter,
            http: OnceLock::new(),
            tls: OnceLock::new(),
        })
    }

    /// Require mutual TLS on every connection from now on (before serving; set
    /// once): `config` accepts only the cluster's nodes and offers the ALPN
    /// protocols of frames and of HTTP (see `drove_tls::peer_server_config`).
    pub fn set_tls(&self, config: Arc<rustls::ServerConfig>) {
        let _ = self.tls.set(TlsAcceptor::from(config));
    }

    /// Hand the connections that speak HTTP to `http` (set once; without it they
    /// are refused like any other garbage).
    pub fn set_http(&self, http: Arc<dyn HttpHandoff>) {
        let _ = self.http.set(http);
    }

    /// Bytes of the frame budget taken by frames being received now.
    pub fn budget_in_use(&self) -> usize {
        self.budget.in_use()
    }

    /// Accept connections for ever. The connections belong to this future: dropping
    /// it (a node shutting down) closes every one of them.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let limits = ConnLimits {
            max_conns: self.limits.max_conns,
            per_client: self.limits.per_client,
            reserved: self.limits.reserved,
        };
        let known = KnownNodes::new(self.pool.map().clone());
        let mut acceptor = Acceptor::new(listener, limits, known, "peer");
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                (stream, peer, slot) = acceptor.accept() => {
                    let me = self.clone();
                    conns.spawn(async move {
                        if let Err(e) = me.serve_conn(stream, peer).await {
                            tracing::debug!(%peer, "peer connection closed: {e}");
                        }
                        drop(slot);
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    }

    async fn serve_conn(
        self: Arc<Self>,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> std::io::Result<()> {
        let _ = stream.set_nodelay(true);
        if let Some(tls) = self.tls.get() {
            // Everything is TLS: the handshake (a node certificate of this cluster)
            // within the hello time, then ALPN says frames or HTTP.
            // rustls reads 4 KiB at a time: buffered below it, a large frame takes
            // a few system calls instead of one per 4 KiB.
            let stream = crate::readahead::ReadAhead::new(stream);
            let s = match tokio::time::timeout(self.limits.hello, tls.accept(stream)).await {
                Err(_) => {
                    tracing::debug!(%peer, "peer connection closed: no TLS handshake within {:?}", self.limits.hello);
                    return Ok(());
                }
                Ok(Err(e)) => {
                    self.greeter
                        .log(peer, &format!("TLS handshake failed: {e}"));
                    return Ok(());
                }
                Ok(Ok(s)) => s,
            };
            if s.get_ref().1.alpn_protocol() == Some(drove_tls::ALPN_HTTP) {
                if let Some(http) = self.http.get() {
                    http.serve(Box::new(s), peer).await;
                }
                return Ok(());
            }
            let (rd, wr) = tokio::io::split(s);
            return self.serve_frames(Box::new(rd), Box::new(wr), peer).await;
        }
        if let Some(http) = self.http.get() {
            match sniff(&stream, self.limits.hello).await {
                Speaks::Http => {
                    http.serve(Box::new(stream), peer).await;
                    return Ok(());
                }
                Speaks::Nothing => {
                    tracing::debug!(%peer, "peer connection closed: nothing within {:?}", self.limits.hello);
                    return Ok(());
                }
                Speaks::Frames => {}
            }
        }
        let (rd, wr) = stream.into_split();
        self.serve_frames(Box::new(rd), Box::new(wr), peer).await
    }

    async fn serve_frames(
        self: Arc<Self>,
        mut rd: ReadHalf,
        mut wr: WriteHalf,
        peer: SocketAddr,
    ) -> std::io::Result<()> {
        // Unbuffered until the hello is accepted: a stranger gets no 256 KiB buffer.
        let greeted = self
            .greeter
            .greet(&mut rd, &mut wr, peer, &self.budget)
            .await?;
        let Some((theirs, version)) = greeted else {
            return Ok(());
        };
        tracing::debug!(%peer, node = %theirs.node, version, "peer connection open");
        let (tx, rx) = mpsc::channel::<drove_proto::Encoded>(1024);
        let wr = WriteDeadline::new(wr, self.limits.stall);
        let mut writer = tokio::spawn(crate::writer::drain(rx, wr, |_| {}));
        let rd = BufReader::with_capacity(256 << 10, rd);
        let result = tokio::select! {
            r = self.clone().read_requests(rd, tx, peer, version) => r,
            // The writer stops on an error or a stalled write (the peer does not
            // read its answers): stop reading requests too.
            w = &mut writer => return w.unwrap_or_else(|e| Err(std::io::Error::other(e))),
        };
        // The reader is done and its sender dropped: the writer ends once every
        // request in flight has been answered.
        let _ = writer.await;
        result
    }

    /// Read requests and start each one, until the connection ends, idles out or
    /// stalls in the middle of a frame.
    async fn read_requests(
        self: Arc<Self>,
        mut rd: BufReader<ReadHalf>,
        tx: mpsc::Sender<drove_proto::Encoded>,
        peer: SocketAddr,
        version: u8,
    ) -> std::io::Result<()> {
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let limits = ReadLimits {
            max_body: MAX_FRAME,
            budget: Some(&self.budget),
            version,
        };
        loop {
            match tokio::time::timeout(self.limits.idle, rd.fill_buf()).await {
                Err(_) => {
                    tracing::debug!(%peer, "peer connection closed: idle for {:?}", self.limits.idle);
                    return Ok(());
                }
                Ok(Ok([])) => return Ok(()),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e),
            }
            let read = Frame::<PeerReq>::read_limited(&mut rd, &limits);
            let frame = match tokio::time::timeout(self.limits.stall, read).await {
                Err(_) => {
                    tracing::info!(%peer, "peer connection closed: a frame took over {:?}", self.limits.stall);
                    return Ok(());
                }
                Ok(Ok(Some((f, _)))) => f,
                Ok(Ok(None)) => return Ok(()),
                Ok(Err(e)) => return Err(e),
            };
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                return Ok(());
            };
            let me = self.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let reply = me.handle(frame, version, peer).await;
                let _ = tx.send(reply).await;
                drop(permit);
            });
        }
    }

    /// Answer one request, in the connection's wire `version`; a request of a
    /// later version than the connection's is refused (no node of that version
    /// sends one).
    async fn handle(
        &self,
        frame: Frame<PeerReq>,
        version: u8,
        peer: SocketAddr,
    ) -> drove_proto::Encoded {
        let start = Instant::now();
        let op = frame.header.op_name();
        let in_bytes = frame.payload.len() as u64;
        let since = frame.header.since();
        let res = if since > version {
            let msg = format!(
                "{op} is a request of drove wire version {since}, this connection speaks version {version}"
            );
            tracing::warn!(%peer, "refused a peer request: {msg}");
            Err(drove_types::Error::invalid(msg))
        } else {
            self.apply(&frame.header, frame.payload).await
        };
        let (header, payload) = match res {
            Ok(r) => r,
            Err(e) => (PeerResp::Err(WireError::from(e)), Bytes::new()),
        };
        let ok = !matches!(header, PeerResp::Err(_) | PeerResp::ForwardFailed { .. });
        self.metrics.peer_server_op(
            op,
            in_bytes + payload.len() as u64,
            start.elapsed().as_secs_f64(),
            ok,
        );
        let reply = Frame {
            id: frame.id,
            header,
            payload,
        };
        match reply.encode_as(version) {
            Ok(b) => b,
            Err(e) => {
                let fallback = Frame {
                    id: frame.id,
                    header: PeerResp::Err(WireError {
                        kind: drove_types::ErrorKind::Io,
                        msg: format!("Cannot encode reply: {e}"),
                    }),
                    payload: Bytes::new(),
                };
                fallback.encode_as(version).unwrap_or_default()
            }
        }
    }

    async fn apply(&self, req: &PeerReq, payload: Bytes) -> Result<(PeerResp, Bytes)> {
        crate::local::apply_and_forward(&self.local, self.pool.as_ref(), req, payload).await
    }
}
