//! Serving HTTP so that it survives abuse: the admin API (CLI calls, `/metrics`) on
//! its listener, and the metadata's Raft and internal routes on the connections of
//! the peer port that speak HTTP.
//!
//! `axum::serve` accepts any number of connections, keeps idle ones for ever and
//! lets a request body grow to its route's limit as slowly as the sender likes:
//! 8 connections each sending a partial 60 MB `/raft/append` body grew a node by
//! 395 MB. So the listener is served here by hand, with hyper's HTTP/1 connection
//! (the admin API speaks nothing else):
//! - the accept loop of the peer server ([`Acceptor`]): a cap on connections in all
//!   ([`AdminLimits::max_conns`]) and per client address
//!   ([`AdminLimits::per_client`]), with a share ([`AdminLimits::reserved`]) that
//!   only loopback and the cluster's nodes may take, so that a flood from other
//!   addresses never locks the operators and the nodes out; an accept error
//!   (EMFILE) retried with backoff instead of ending the loop;
//! - a deadline for the first request ([`AdminLimits::handshake`], from the
//!   accept, the TLS handshake included: `crate::first_head`), so that a connection
//!   that says nothing is closed in seconds, not after the idle time;
//! - hyper's header read timeout, which also runs while a kept-alive connection
//!   waits for its next request: a connection silent for [`AdminLimits::idle`] is
//!   closed; a response the client does not read for as long fails
//!   ([`WriteDeadline`]);
//! - a middleware (`receive_body`) that takes a body's announced length from a
//!   byte budget shared by all connections before reading it, and wants the whole
//!   body within [`AdminLimits::body`]. A body over [`AdminLimits::max_body`] is
//!   refused with 413; one without a length may be at most [`SMALL_BODY`] (411
//!   beyond). Bodies up to [`SMALL_BODY`] do not take from the budget: at most one
//!   per connection is in flight (HTTP/1 serves a connection's requests in turn),
//!   so the connection cap bounds them, and Raft heartbeats and CLI calls are not
//!   queued behind large bodies when the budget is exhausted.
//!
//! A node with certificates serves the admin API over HTTPS only
//! ([`AdminServer::with_tls`]): the TLS handshake must be done within
//! [`AdminLimits::handshake`], and a client that speaks plain HTTP (its first byte
//! is not a TLS handshake record) gets one `400` whose message says how to reach
//! the node, then the connection closes.
use crate::first_head::FirstHead;
use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::{Bytes, BytesMut};
use drove_proto::Budget;
use drove_replica::accept::{Acceptor, LogEvery};
use drove_replica::admission::{ConnLimits, LocalOnly, Trusted};
use drove_replica::stall::WriteDeadline;
use drove_replica::{HttpHandoff, PeerIo};
use futures::StreamExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

/// A body of at most this many bytes needs no length and takes nothing from the
/// budget.
pub const SMALL_BODY: usize = 64 << 10;

/// What the admin listener accepts; [`AdminLimits::default`] is what a node uses.
#[derive(Debug, Clone, Copy)]
pub struct AdminLimits {
    /// Open connections at most; more are closed at once.
    pub max_conns: usize,
    /// Open connections at most from one address other than loopback and the
    /// cluster's nodes.
    pub per_client: usize,
    /// Of `max_conns`, how many only loopback and the cluster's nodes may take.
    pub reserved: usize,
    /// Time from the accept to the end of the first request's head, the TLS
    /// handshake included.
    pub handshake: Duration,
    /// Time allowed for a request's headers, counted from the end of the previous
    /// response (or the connection's start); also how long a response may wait
    /// for the client to read it.
    pub idle: Duration,
    /// Time allowed to receive a body, waiting for the budget included.
    pub body: Duration,
    /// Largest body (the metadata routes take up to 64 MiB: a batch of Raft log
    /// entries or a snapshot).
    pub max_body: usize,
    /// Bytes of bodies being received or handled, across every connection.
    pub budget: usize,
}

impl Default for AdminLimits {
    fn default() -> Self {
        AdminLimits {
            max_conns: 1024,
            per_client: 64,
            reserved: 256,
            handshake: Duration::from_secs(5),
            idle: Duration::from_secs(60),
            body: Duration::from_secs(60),
            max_body: 64 << 20,
            budget: 256 << 20,
        }
    }
}

/// The admin listener's state.
pub struct AdminServer {
    limits: AdminLimits,
    budget: Budget,
    /// HTTPS only, with this configuration; `None`: plain HTTP.
    tls: Option<TlsAcceptor>,
    /// Which client addresses may take the reserved share.
    trusted: Arc<dyn Trusted>,
    /// Refused connections are logged at most once a second (anyone who reaches
    /// the port could fill the log).
    refusals: parking_lot::Mutex<LogEvery>,
}

/// The first byte of a TLS connection: a handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// The client certificate an HTTPS connection presented (verified against the
/// cluster CA in the handshake), put in each of its requests' extensions for the
/// token check ([`crate::auth`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCert {
    /// Its common name.
    pub name: Option<String>,
    /// Whether it is a node certificate of the cluster (it carries `drove-node`).
    pub node: bool,
}

impl AdminServer {
    /// A server held to `limits`, in plain HTTP, that keeps its reserve for
    /// loopback.
    pub fn new(limits: AdminLimits) -> Arc<Self> {
        Self::with_tls(limits, None, Arc::new(LocalOnly))
    }

    /// A server held to `limits` that speaks HTTPS only, with `tls` (`None`: plain
    /// HTTP), and keeps its reserve for the addresses `trusted` names.
    pub fn with_tls(
        limits: AdminLimits,
        tls: Option<Arc<rustls::ServerConfig>>,
        trusted: Arc<dyn Trusted>,
    ) -> Arc<Self> {
        Arc::new(AdminServer {
            limits,
            budget: Budget::new(limits.budget),
            tls: tls.map(TlsAcceptor::from),
            trusted,
            refusals: parking_lot::Mutex::new(LogEvery::new(Duration::from_secs(1))),
        })
    }

    /// Bytes of the body budget taken now.
    pub fn budget_in_use(&self) -> usize {
        self.budget.in_use()
    }

    /// Serve `router` on `listener` for ever. The connections belong to this
    /// future: dropping it closes them.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, router: Router) {
        let app = self.app(router);
        let limits = ConnLimits {
            max_conns: self.limits.max_conns,
            per_client: self.limits.per_client,
            reserved: self.limits.reserved,
        };
        let mut acceptor = Acceptor::new(listener, limits, self.trusted.clone(), "admin");
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                (stream, peer, slot) = acceptor.accept() => {
                    let me = self.clone();
                    let app = app.clone();
                    let deadline = Instant::now() + self.limits.handshake;
                    conns.spawn(async move {
                        match me.tls.clone() {
                            None => me.serve_conn(app, stream, peer, deadline).await,
                            Some(tls) => me.serve_tls(app, tls, stream, peer, deadline).await,
                        }
                        drop(slot);
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    }

    /// Serve `router` on the connections another listener hands over (the
    /// metadata's internal routes on the peer port), held to the same limits and
    /// body budget; the connection cap is that listener's.
    pub fn handoff(self: Arc<Self>, router: Router) -> Arc<dyn HttpHandoff> {
        let app = self.app(router);
        Arc::new(Handoff { server: self, app })
    }

    /// Serve one connection of an HTTPS-only listener: a TLS handshake and the
    /// first request by `deadline`, then HTTP inside it; a plain HTTP client is
    /// told to use HTTPS.
    async fn serve_tls(
        &self,
        app: Router,
        tls: TlsAcceptor,
        stream: TcpStream,
        peer: SocketAddr,
        deadline: Instant,
    ) {
        let mut first = [0u8; 1];
        match tokio::time::timeout_at(deadline, stream.peek(&mut first)).await {
            Ok(Ok(1)) if first[0] == TLS_HANDSHAKE => {}
            Ok(Ok(1)) => {
                self.refused(peer, "plain HTTP on the HTTPS port, refused");
                return refuse_plain(stream).await;
            }
            // Closed, failed or silent before its first byte.
            _ => return,
        }
        let stream = match tokio::time::timeout_at(deadline, tls.accept(stream)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return self.refused(peer, &format!("TLS handshake failed: {e}")),
            Err(_) => {
                let why = format!("TLS handshake not done in {:?}", self.limits.handshake);
                return self.refused(peer, &why);
            }
        };
        let cert = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| PeerCert {
                name: drove_tls::common_name(c),
                node: drove_tls::node::is_node_cert(c),
            });
        let app = match cert {
            Some(c) => app.layer(axum::Extension(c)),
            None => app,
        };
        self.serve_conn(app, stream, peer, deadline).await
    }

    /// Log a refused connection, unless one was logged less than a second ago.
    fn refused(&self, peer: SocketAddr, why: &str) {
        if let Some(skipped) = self.refusals.lock().ready() {
            tracing::info!(%peer, skipped, "admin API: {why}");
        }
    }

    fn app(self: &Arc<Self>, router: Router) -> Router {
        router.layer(middleware::from_fn_with_state(self.clone(), receive_body))
    }

    /// Serve HTTP on `stream`, its first request's head due by `deadline`.
    fn serve_conn<S: PeerIo + 'static>(
        &self,
        app: Router,
        stream: S,
        peer: SocketAddr,
        deadline: Instant,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let stream = FirstHead::new(stream, deadline);
        let io = TokioIo::new(WriteDeadline::new(stream, self.limits.idle));
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.idle)
            .serve_connection(io, TowerToHyperService::new(app));
        async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, "HTTP connection closed: {e}");
            }
        }
    }
}

struct Handoff {
    server: Arc<AdminServer>,
    app: Router,
}

impl HttpHandoff for Handoff {
    fn serve(
        &self,
        stream: Box<dyn PeerIo>,
        peer: SocketAddr,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let deadline = Instant::now() + self.server.limits.handshake;
        Box::pin(
            self.server
                .serve_conn(self.app.clone(), stream, peer, deadline),
        )
    }
}

/// Receive a request's body within the limits (see the module doc), then hand the
/// request on with the body in memory. The budget is held until the handler is
/// done with it.
async fn receive_body(
    State(server): State<Arc<AdminServer>>,
    req: Request,
    next: Next,
) -> Response {
    let limits = &server.limits;
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    let announced = req.body().size_hint().exact();
    let (cap, from_budget) = match announced.map(|n| usize::try_from(n).unwrap_or(usize::MAX)) {
        Some(n) if n > limits.max_body => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "A request body of {n} bytes is over the limit of {}",
                    limits.max_body
                ),
            )
        }
        Some(n) if n > SMALL_BODY => (n, n),
        Some(n) => (n, 0),
        None => (SMALL_BODY, 0),
    };
    let (parts, body) = req.into_parts();
    let receive = async {
        let taken = match from_budget {
            0 => None,
            n => Some(server.budget.take(n).await.map_err(|e| {
                refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("Cannot receive a body: {e}"),
                )
            })?),
        };
        let bytes = collect(body, cap, announced.is_none()).await?;
        Ok::<_, Response>((taken, bytes))
    };
    let (taken, bytes) = match tokio::time::timeout(limits.body, receive).await {
        Err(_) => {
            return refuse(
                StatusCode::REQUEST_TIMEOUT,
                format!("The request body did not arrive within {:?}", limits.body),
            )
        }
        Ok(Err(refusal)) => return refusal,
        Ok(Ok(received)) => received,
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    drop(taken);
    response
}

/// The body, at most `cap` bytes (allocated up front: the length is known and
/// paid for, or small).
async fn collect(body: Body, cap: usize, unannounced: bool) -> Result<Bytes, Response> {
    let mut buf = BytesMut::with_capacity(cap);
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            refuse(
                StatusCode::BAD_REQUEST,
                format!("Cannot read the request body: {e}"),
            )
        })?;
        if buf.len() + chunk.len() > cap {
            // hyper checks an announced length itself; this is a body without one.
            let status = if unannounced {
                StatusCode::LENGTH_REQUIRED
            } else {
                StatusCode::PAYLOAD_TOO_LARGE
            };
            return Err(refuse(
                status,
                format!("A request body over {cap} bytes needs a Content-Length"),
            ));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// What a plain HTTP client of an HTTPS-only admin API is told.
pub const HTTPS_ONLY: &str = "This node's admin API speaks HTTPS only (the node has TLS \
    certificates): give the CLI the cluster's CA certificate with DROVE_CA=FILE or --ca FILE \
    (a cluster of drove up: DIR/tls, which also holds a client certificate), or use \
    https:// with that CA (any tool: the node's certificate carries the name drove-node)";

/// Answer a plain HTTP request on an HTTPS-only listener with one 400 that says so,
/// then close. The request head is read first (briefly, at most 16 KiB) so that
/// closing does not reset the connection before the client reads the answer.
async fn refuse_plain(mut stream: TcpStream) {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while head.len() < 16 << 10 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let body = serde_json::to_vec(&crate::api::ApiError {
        error: "invalid".to_string(),
        message: HTTPS_ONLY.to_string(),
    })
    .unwrap_or_default();
    let head = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&body).await?;
        stream.shutdown().await
    })
    .await;
}

fn refuse(status: StatusCode, message: String) -> Response {
    let body = crate::api::ApiError {
        error: "invalid".to_string(),
        message,
    };
    (status, axum::Json(body)).into_response()
}
