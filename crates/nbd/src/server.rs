//! The NBD server: accept loops on TCP and unix sockets, each connection on its own
//! task so that one failing client never disturbs another. Top of the data path: what
//! arrives here goes to `session.rs`, then to the export (the volume layer).
use crate::export::{ClientInfo, Credential, Exports};
use crate::session::ListenerTls;
use crate::{session, Limits, TlsMode};
use drove_metrics::Metrics;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};

/// Serves the exports of one catalogue over NBD.
pub struct Server {
    exports: Arc<dyn Exports>,
    metrics: Arc<Metrics>,
    limits: Limits,
    /// TLS on TCP connections; the unix socket never offers it.
    tcp_tls: ListenerTls,
    /// The connections open now, checked against `limits` at accept.
    admission: Arc<Admission>,
}

/// Connections open now: in all, and per TCP client address.
#[derive(Default)]
struct Open {
    total: usize,
    by_ip: HashMap<IpAddr, usize>,
}

/// What accepting a connection is checked against.
struct Admission {
    open: Mutex<Open>,
    max_total: usize,
    max_per_client: usize,
    /// Connections refused so far (logged at 1, 2, 4, 8, ... so a flood does not
    /// flood the log too).
    refused: AtomicU64,
}

impl Admission {
    fn new(limits: &Limits) -> Arc<Self> {
        Arc::new(Admission {
            open: Mutex::new(Open::default()),
            max_total: limits.max_connections.max(1),
            max_per_client: limits.max_connections_per_client.max(1),
            refused: AtomicU64::new(0),
        })
    }

    /// A place for a connection from `ip` (`None`: the unix socket), or why not.
    fn admit(
        self: &Arc<Self>,
        ip: Option<IpAddr>,
        metrics: &Arc<Metrics>,
    ) -> Result<Admitted, &'static str> {
        let mut o = self.open.lock();
        if o.total >= self.max_total {
            return Err("total");
        }
        if let Some(ip) = ip {
            let n = o.by_ip.entry(ip).or_default();
            if *n >= self.max_per_client {
                return Err("per_client");
            }
            *n += 1;
        }
        o.total += 1;
        metrics.nbd_connection_opened();
        Ok(Admitted {
            admission: Arc::clone(self),
            ip,
            metrics: Arc::clone(metrics),
        })
    }

    /// Count and log a refusal of a connection from `who`.
    fn refused(&self, who: &str, reason: &'static str, metrics: &Metrics) {
        metrics.nbd_connection_refused(reason);
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            let limit = match reason {
                "per_client" => format!("{} open from one address", self.max_per_client),
                _ => format!("{} open in all", self.max_total),
            };
            tracing::warn!(
                client = %who,
                "nbd: connection refused at its limit ({limit}); {n} refused so far \
                 (drove_nbd_connections_refused)"
            );
        }
    }
}

/// A connection's place among the open ones, given back when it ends.
struct Admitted {
    admission: Arc<Admission>,
    ip: Option<IpAddr>,
    metrics: Arc<Metrics>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut o = self.admission.open.lock();
        o.total = o.total.saturating_sub(1);
        if let Some(ip) = self.ip {
            if let Some(n) = o.by_ip.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    o.by_ip.remove(&ip);
                }
            }
        }
        self.metrics.nbd_connection_closed();
    }
}

impl Server {
    /// A server for `exports`, reporting into `metrics`, with default [`Limits`].
    pub fn new(exports: Arc<dyn Exports>, metrics: Arc<Metrics>) -> Self {
        let limits = Limits::default();
        Server {
            exports,
            metrics,
            admission: Admission::new(&limits),
            limits,
            tcp_tls: ListenerTls::off(),
        }
    }

    /// Offer TLS on TCP connections as `mode` says, with `config` (which decides
    /// whether client certificates are required). The unix socket stays plaintext:
    /// its file permissions are its protection.
    pub fn with_tls(mut self, mode: TlsMode, config: Arc<rustls::ServerConfig>) -> Self {
        self.tcp_tls = match mode {
            TlsMode::Off => ListenerTls::off(),
            _ => ListenerTls {
                mode,
                acceptor: Some(tokio_rustls::TlsAcceptor::from(config)),
            },
        };
        self
    }

    /// Replace the per-connection limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.admission = Admission::new(&limits);
        self.limits = limits;
        self
    }

    /// Serve one accepted connection from `client` (its address, for listing who has
    /// an export open) to completion, without TLS (as on the unix socket). Garbage
    /// from the peer ends the connection with an `Err` (never a panic); the caller
    /// logs it.
    pub async fn serve_connection<S>(&self, stream: S, client: &str) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let client = ClientInfo {
            label: client.to_string(),
            credential: Credential::Local,
        };
        self.serve_with(stream, client, &ListenerTls::off()).await
    }

    /// [`Server::serve_connection`] for a TCP connection: TLS as [`Server::with_tls`] set.
    pub async fn serve_tcp_connection<S>(&self, stream: S, client: &str) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let client = ClientInfo {
            label: client.to_string(),
            credential: Credential::Anonymous,
        };
        self.serve_with(stream, client, &self.tcp_tls).await
    }

    async fn serve_with<S>(
        &self,
        stream: S,
        client: ClientInfo,
        tls: &ListenerTls,
    ) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        session::serve(
            stream,
            client,
            self.exports.as_ref(),
            Arc::clone(&self.metrics),
            &self.limits,
            tls,
        )
        .await
    }

    /// Accept TCP connections forever, each on its own task.
    pub async fn serve_tcp(self: Arc<Self>, listener: TcpListener) -> io::Result<()> {
        let mut errors = AcceptErrors::default();
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    errors.reset();
                    let slot = match self.admission.admit(Some(peer.ip()), &self.metrics) {
                        Ok(slot) => slot,
                        Err(reason) => {
                            // Closed unanswered: NBD has no way to say "busy" before
                            // its greeting.
                            drop(stream);
                            self.admission
                                .refused(&peer.to_string(), reason, &self.metrics);
                            continue;
                        }
                    };
                    // Requests and replies are small and latency-bound (the protocol
                    // asks both sides to disable Nagle).
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(%peer, "nbd: TCP_NODELAY failed: {e}");
                    }
                    let me = Arc::clone(&self);
                    tokio::spawn(async move {
                        let _slot = slot;
                        if let Err(e) = me.serve_tcp_connection(stream, &peer.to_string()).await {
                            // One line per connection anyone who reaches the port
                            // opens: limited as warnings are (see CONNECTION_LOG).
                            tracing::info!(
                                target: drove_types::CONNECTION_LOG,
                                %peer,
                                "nbd connection ended: {e}"
                            );
                        }
                    });
                }
                Err(e) => errors.on_error(e).await?,
            }
        }
    }

    /// Accept unix socket connections forever, each on its own task.
    pub async fn serve_unix(self: Arc<Self>, listener: UnixListener) -> io::Result<()> {
        let mut errors = AcceptErrors::default();
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    errors.reset();
                    // Unix clients have no address: name them by their process.
                    let client = match stream.peer_cred().ok().and_then(|c| c.pid()) {
                        Some(pid) => format!("pid {pid} (unix socket)"),
                        None => "unix socket".to_string(),
                    };
                    let slot = match self.admission.admit(None, &self.metrics) {
                        Ok(slot) => slot,
                        Err(reason) => {
                            drop(stream);
                            self.admission.refused(&client, reason, &self.metrics);
                            continue;
                        }
                    };
                    let me = Arc::clone(&self);
                    tokio::spawn(async move {
                        let _slot = slot;
                        if let Err(e) = me.serve_connection(stream, &client).await {
                            // Not limited: the socket's clients are the local ones
                            // its file mode lets in, each line about one of them.
                            tracing::info!("nbd unix connection ended: {e}");
                        }
                    });
                }
                Err(e) => errors.on_error(e).await?,
            }
        }
    }
}

/// Back-off for accept errors. Running out of descriptors or memory, or a connection
/// reset before accept, passes; anything else repeated many times means the listener
/// itself is broken.
#[derive(Default)]
struct AcceptErrors {
    consecutive: u32,
}

impl AcceptErrors {
    fn reset(&mut self) {
        self.consecutive = 0;
    }

    async fn on_error(&mut self, e: io::Error) -> io::Result<()> {
        self.consecutive = self.consecutive.saturating_add(1);
        let transient = matches!(
            e.kind(),
            io::ErrorKind::ConnectionAborted
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::Interrupted
                | io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
        ) || matches!(e.raw_os_error(), Some(12 | 23 | 24 | 105)); // ENOMEM ENFILE EMFILE ENOBUFS
        if !transient && self.consecutive > 10 {
            return Err(e);
        }
        tracing::warn!("nbd accept failed: {e}");
        let backoff = 10u64 << self.consecutive.min(7);
        tokio::time::sleep(Duration::from_millis(backoff)).await;
        Ok(())
    }
}
