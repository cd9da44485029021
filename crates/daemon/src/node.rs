//! Start-up and shut-down of one node, in the order that works:
//! bind every listener first (so the addresses that go into the cluster map are the
//! real ones), open the metadata, serve the admin API (peers need it to elect a
//! leader), wait until this node is a member, then open the frontends.
use drove_meta::{Meta, MetaConfig};
use drove_metrics::Metrics;
use drove_nbd::Server as NbdServer;
use drove_objstore::{FileStore, ObjectStore};
use drove_replica::admission::KnownNodes;
use drove_replica::catchup::CatchUp;
use drove_replica::{
    Gateway, LocalStore, MapCell, PeerPool, PeerServer, PeerTimeouts, Recoverer, ServerLimits,
};
use drove_types::{Error, NodeId, NodeInfo, NodeState, Result, DEFAULT_OBJECT_SIZE};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

use crate::admin::{self, Admin};
use crate::exports::VdiExports;
use crate::http_listen::{AdminLimits, AdminServer};
use crate::NodeConfig;

/// How long a node waits to become a member before giving up.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

async fn bind(addr: std::net::SocketAddr, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io(format!("Cannot listen on {addr} for {what}"), e))
}

fn local(l: &TcpListener) -> Result<String> {
    l.local_addr()
        .map(|a| a.to_string())
        .map_err(|e| Error::io("Cannot read a listener's address", e))
}

/// Run a node until `shutdown` resolves.
pub async fn run(cfg: NodeConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    let socket_gid = crate::nbd_socket::group_id(cfg.nbd_socket_group.as_deref())?;
    // First of all: nothing in the directory is touched unless this node owns it.
    // It is closed to everyone else until the socket in it has its mode.
    let held_dir = crate::datadir::DataDir::acquire(&cfg.data)?;
    // A witness's directory never comes back as a data node's, nor the reverse.
    crate::role::check(&cfg.data, cfg.witness)?;
    // The wire versions this node speaks: the build's, unless a test narrowed them.
    let wire = drove_proto::WireRange::for_node().map_err(Error::invalid)?;
    if wire != drove_proto::WireRange::BUILD {
        tracing::warn!(
            "{}: this node speaks drove wire versions {wire} only (a test hook)",
            drove_proto::version::TEST_RANGE_ENV
        );
    }
    // The cluster feature level this node says it knows: the build's, unless a
    // test lowered it.
    let features = drove_types::level_for_node().map_err(Error::invalid)?;
    if features != drove_types::FEATURE_LEVEL {
        tracing::warn!(
            "{}: this node says it knows cluster feature level {features} only (a test hook)",
            drove_types::TEST_LEVEL_ENV
        );
    }
    // Certificates are checked before anything listens: a node that would serve
    // NBD without the TLS it was told to require must not start at all.
    let nbd_tls = if cfg.witness {
        None
    } else {
        nbd_tls_config(&cfg)?
    };
    let peer_tls = peer_tls_config(&cfg)?;
    let admin_tls = admin_tls_config(&cfg)?;
    let admin_l = bind(cfg.listen, "the admin API").await?;
    let peer_l = bind(cfg.peer_listen, "peers").await?;
    // A witness serves no NBD: no port, no socket, and its data directory stays
    // closed to everyone else.
    let sock = cfg.nbd_socket();
    let nbd_ls = if cfg.witness {
        None
    } else {
        let nbd_l = bind(cfg.nbd_listen, "NBD").await?;
        let unix_l = crate::nbd_socket::bind(&sock, socket_gid)?;
        held_dir.open_to(socket_gid)?;
        Some((nbd_l, unix_l))
    };
    let (nbd_addr, nbd_socket) = match &nbd_ls {
        Some((nbd_l, _)) => (
            local(nbd_l)?,
            std::fs::canonicalize(&sock)
                .unwrap_or(sock.clone())
                .display()
                .to_string(),
        ),
        None => (String::new(), String::new()),
    };

    let info = NodeInfo {
        id: NodeId(0),
        zone: cfg.zone.clone(),
        weight: if cfg.witness { 0 } else { cfg.weight },
        admin_addr: local(&admin_l)?,
        peer_addr: local(&peer_l)?,
        nbd_addr,
        nbd_socket,
        state: NodeState::Up,
        witness: cfg.witness,
        features,
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let meta = Meta::open(MetaConfig {
        data_dir: cfg.data.clone(),
        // The internal routes (Raft, forwarded writes, joins) are on the peer port.
        addr: info.peer_addr.clone(),
        join: cfg.join.clone(),
        node: info.clone(),
        max_voters: cfg.max_voters,
        join_timeout: cfg.join_timeout,
        tls: peer_tls.as_ref().map(|t| t.http.clone()),
        // Internal calls go to peer ports, so they follow the same WAN routes.
        routes: Some(cfg.data.join("peer-routes.json")),
    })
    .await?;
    let me = meta.node_id();
    let metrics = Metrics::new();
    meta.set_metrics(metrics.clone());
    let file_store = FileStore::open_reserving(
        &cfg.data.join("store"),
        u64::from(DEFAULT_OBJECT_SIZE),
        cfg.reserve_space,
    )?;
    let reserve = file_store.reserve();
    // Refuses everything once its disk failed (EIO, a failed fsync): see disk.rs.
    let guarded = crate::disk::guard(
        file_store,
        &cfg.data.join("store"),
        &cfg.data,
        std::env::var_os(crate::disk::FAULTS_ENV),
    );
    let store: Arc<dyn ObjectStore> = guarded.clone();
    let map = Arc::new(MapCell::new(meta.state().map.clone()));
    // DATA/peer-routes.json, when present, redirects peer connections (WAN emulation).
    let pool = PeerPool::speaking(
        drove_proto::Speaker {
            cluster: meta.cluster_id(),
            node: me,
            wire,
        },
        map.clone(),
        PeerTimeouts::default(),
        metrics.clone(),
        Some(cfg.data.join("peer-routes.json")),
    );
    if let Some(t) = &peer_tls {
        pool.set_tls(t.frames.clone());
    }
    let catchup = CatchUp::with_record(
        Some(Box::new(drove_replica::catchup::FileRecord(
            cfg.data.join("recovery.json"),
        ))),
        drove_replica::catchup::host_boot_id(),
    );
    let routes_task = tokio::spawn(pool.clone().watch_routes());
    let local = LocalStore::for_run(store.clone(), catchup, meta.incarnation());
    let gateway = Gateway::new(
        me,
        local.clone(),
        pool.clone(),
        map.clone(),
        metrics.clone(),
    );
    gateway.set_membership(Arc::new(crate::membership::MetaMembership(meta.clone())));
    let recoverer = Recoverer::new(me, local.clone(), pool.clone());
    let settler = crate::settle::Settler::new(meta.clone(), cfg.lock_lease);
    settler.set_recoverer(recoverer.clone());
    let locks = crate::locks::MetaLocks::new(meta.clone(), cfg.lock_lease, settler);
    let exports = VdiExports::new(meta.clone(), gateway, locks.clone(), metrics.clone());

    let admin_router = meta.public_router().merge(admin::router(Admin {
        meta: meta.clone(),
        metrics: metrics.clone(),
        nbd_tcp: info.nbd_addr.clone(),
        nbd_tls: if nbd_tls.is_some() {
            cfg.nbd_tls
        } else {
            drove_nbd::TlsMode::Off
        },
        nbd_socket: info.nbd_socket.clone(),
        recoverer: recoverer.clone(),
        locks,
        exports: exports.clone(),
        http: node_client(
            cfg.admin_token.as_deref(),
            peer_tls.as_ref().map(|t| &t.http),
        )?,
        admin_scheme: if admin_tls.is_some() { "https" } else { "http" },
        store_dir: cfg.data.join("store"),
        disk: guarded.clone(),
        reserve,
        token_sha256: cfg.admin_token.as_deref().map(crate::auth::sha256_hex),
        open_metrics: cfg.open_metrics,
    }));
    let admin_limits = AdminLimits {
        max_conns: cfg.admin_max_connections,
        per_client: cfg.admin_max_connections_per_client,
        reserved: cfg.admin_max_connections / 4,
        handshake: cfg.admin_handshake_timeout,
        ..AdminLimits::default()
    };
    // The reserved shares are for loopback and the nodes of the map.
    let known = KnownNodes::new(map.clone());
    let admin_server = AdminServer::with_tls(admin_limits, admin_tls, known);
    let admin_task = tokio::spawn(admin_server.serve(admin_l, admin_router));
    let peer_server = PeerServer::with_limits(
        local.clone(),
        pool,
        metrics.clone(),
        meta.cluster_id(),
        ServerLimits {
            max_conns: cfg.peer_max_connections,
            per_client: cfg.peer_max_connections_per_client,
            reserved: cfg.peer_max_connections / 4,
            ..ServerLimits::default()
        },
    );
    // Under the peer listener's connection limits; the rest of the admin limits.
    peer_server.set_http(AdminServer::new(admin_limits).handoff(meta.router()));
    if let Some(t) = &peer_tls {
        peer_server.set_tls(t.server.clone());
    }
    let peer_task = tokio::spawn(peer_server.serve(peer_l));

    tracing::info!(node = %me, "waiting to become a member of the cluster");
    meta.ready(READY_TIMEOUT).await?;
    let removed = Arc::new(tokio::sync::Notify::new());
    let watch_task = tokio::spawn(crate::watch::follow(
        meta.clone(),
        map,
        exports.clone(),
        local,
        recoverer.clone(),
        removed.clone(),
    ));
    let recovery_task = tokio::spawn(recoverer.clone().run());
    let scrub_task = tokio::spawn(background_scrub(recoverer.clone(), cfg.scrub_every));
    let clean_of = recoverer.clone();
    let iostat_task = tokio::spawn(crate::iostat::publish(metrics.clone()));
    let build_task = tokio::spawn(crate::upgrade::keep_build_recorded(
        meta.clone(),
        me,
        info.features,
        info.version.clone(),
    ));
    // A full disk does not make the node unhealthy: it stays up and serves reads,
    // and writes that need new space there fail with ENOSPC (see
    // drove_objstore's reserve). Marking it down would move its objects onto disks
    // that fill up in turn.
    // A failed disk does: the node is kept down until it is restarted (disk.rs).
    let disk_task = tokio::spawn(crate::disk::mark_down_when_failed(
        meta.clone(),
        guarded.clone(),
    ));
    let hb_meta = meta.clone();
    let health_task = tokio::spawn(meta.clone().run_health(
        move || crate::disk::heartbeat_healthy(&hb_meta, &guarded),
        move || {
            let p = clean_of.progress();
            p.clean.then_some(drove_types::Epoch(p.epoch))
        },
    ));
    let nbd_tasks = match nbd_ls {
        Some((nbd_l, unix_l)) => {
            let mut nbd = NbdServer::new(exports, metrics).with_limits(drove_nbd::Limits {
                handshake_timeout: cfg.nbd_handshake_timeout,
                max_connections: cfg.nbd_max_connections,
                max_connections_per_client: cfg.nbd_max_connections_per_client,
                ..Default::default()
            });
            if let Some(tls) = nbd_tls {
                nbd = nbd.with_tls(cfg.nbd_tls, tls);
            }
            let nbd = Arc::new(nbd);
            vec![
                tokio::spawn(nbd.clone().serve_tcp(nbd_l)),
                tokio::spawn(nbd.serve_unix(unix_l)),
            ]
        }
        None => Vec::new(),
    };
    if cfg.witness {
        tracing::info!(
            node = %me, zone = %info.zone, admin = %info.admin_addr, peer = %info.peer_addr,
            "witness ready (a metadata voter only: no objects, no NBD)"
        );
    } else {
        tracing::info!(
            node = %me, zone = %info.zone, admin = %info.admin_addr, peer = %info.peer_addr,
            nbd = %info.nbd_addr, socket = %info.nbd_socket, "node ready"
        );
    }
    crate::sd_notify::notify(&format!("READY=1\nSTATUS=node {me} ready"));

    let outcome = tokio::select! {
        () = shutdown => Ok(()),
        why = meta.wait_stopped() => {
            // openraft does not go on after a storage error (a full disk under its
            // log, an I/O error): this process's metadata is dead. Exiting with an
            // error lets the service manager start the node again, which reopens
            // the log once the disk works.
            let why = format!(
                "This node's metadata service stopped: {why}. The node exits so that its \
                 service manager starts it again"
            );
            tracing::error!("{why}");
            Err(Error::unavailable(why))
        }
        () = removed.notified() => {
            let why = format!(
                "This node ({me}) was removed from the cluster (drove node leave/remove): it \
                 stops serving. To bring this host back, empty {} and join it as a new node",
                cfg.data.display()
            );
            tracing::error!("{why}");
            Err(Error::new(drove_types::ErrorKind::Gone, why))
        }
    };
    tracing::info!(node = %me, "shutting down");
    crate::sd_notify::notify("STOPPING=1");
    for t in &nbd_tasks {
        t.abort();
    }
    if !cfg.witness {
        let _ = std::fs::remove_file(&sock);
    }
    // Writes acknowledged without FLUSH may sit in the page cache; a clean stop
    // makes them durable as a disk's cache would on power-off.
    if let Err(e) = drove_replica::local::blocking(&store, |s| s.flush(&[])).await {
        tracing::warn!("final flush failed: {e}");
    }
    meta.shutdown().await;
    watch_task.abort();
    recovery_task.abort();
    routes_task.abort();
    scrub_task.abort();
    health_task.abort();
    disk_task.abort();
    iostat_task.abort();
    build_task.abort();
    peer_task.abort();
    admin_task.abort();
    outcome
}

/// The peer port's mutual TLS, its three sides.
struct PeerTls {
    /// Accepting (frames and HTTP, told apart by ALPN).
    server: Arc<rustls::ServerConfig>,
    /// Dialling for frames (the peer pool).
    frames: Arc<rustls::ClientConfig>,
    /// Dialling for HTTP (the metadata's internal calls).
    http: Arc<rustls::ClientConfig>,
}

/// The peer port's TLS: `None` without certificates or when turned off.
fn peer_tls_config(cfg: &NodeConfig) -> Result<Option<PeerTls>> {
    let Some(dir) = cfg.tls_dir.as_deref().filter(|_| cfg.peer_tls) else {
        return Ok(None);
    };
    let bad = |e: drove_tls::Error| {
        Error::invalid(format!(
            "Bad TLS directory {}: {}",
            dir.display(),
            chain(&e)
        ))
    };
    use drove_tls::{ALPN_HTTP, ALPN_PEER};
    Ok(Some(PeerTls {
        server: drove_tls::peer_server_config(dir, &[ALPN_PEER, ALPN_HTTP]).map_err(bad)?,
        frames: drove_tls::peer_client_config(dir, &[ALPN_PEER]).map_err(bad)?,
        http: drove_tls::peer_client_config(dir, &[ALPN_HTTP]).map_err(bad)?,
    }))
}

/// An error and its sources in one line: callers show the message, not always the
/// source.
fn chain(e: &dyn std::error::Error) -> String {
    let mut why = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        why = format!("{why}: {s}");
        src = s.source();
    }
    why
}

/// The admin API's TLS: with certificates (and peer TLS on), HTTPS only. The
/// node's certificate; a client certificate of the CA is checked when one is sent
/// (the CLI of a `drove up` cluster sends one) but not required: tokens say who may do
/// what. Nodes ask each other's admin APIs with their node certificate.
fn admin_tls_config(cfg: &NodeConfig) -> Result<Option<Arc<rustls::ServerConfig>>> {
    let Some(dir) = cfg.tls_dir.as_deref().filter(|_| cfg.peer_tls) else {
        return Ok(None);
    };
    server_config(dir, drove_tls::ClientAuth::Optional).map(Some)
}

/// A server configuration from the node's TLS directory `dir`, or an error that
/// names the directory and why.
fn server_config(
    dir: &std::path::Path,
    auth: drove_tls::ClientAuth,
) -> Result<Arc<rustls::ServerConfig>> {
    drove_tls::node_server_config(dir, auth).map_err(|e| {
        Error::invalid(format!(
            "Bad TLS directory {}: {}",
            dir.display(),
            chain(&e)
        ))
    })
}

/// The TLS configuration of the NBD TCP port: `None` when TLS is off. Clients must
/// present a certificate signed by the cluster CA.
fn nbd_tls_config(cfg: &NodeConfig) -> Result<Option<Arc<rustls::ServerConfig>>> {
    match (&cfg.tls_dir, cfg.nbd_tls) {
        (_, drove_nbd::TlsMode::Off) => Ok(None),
        (None, mode) => Err(Error::invalid(format!(
            "NBD TLS mode {mode:?} needs the node's certificates (--tls-dir)"
        ))),
        (Some(dir), _) => server_config(dir, drove_tls::ClientAuth::Required).map(Some),
    }
}

/// The HTTP client a node asks other nodes' admin APIs with: it sends the node's
/// admin token, which every node of a cluster shares, and speaks HTTPS with its
/// node certificate when `tls` is given (the admin APIs then speak nothing else).
fn node_client(
    token: Option<&str>,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<reqwest::Client> {
    let headers = crate::api::token_headers(token).map_err(Error::invalid)?;
    let mut builder = reqwest::Client::builder()
        .http1_only()
        .default_headers(headers);
    if let Some(tls) = tls {
        builder = builder.use_preconfigured_tls(rustls::ClientConfig::clone(tls));
    }
    builder
        .build()
        .map_err(|e| Error::invalid(format!("Cannot make an HTTP client: {e}")))
}

/// Scrub this node's objects every `every`, paced by the recovery rate limit.
async fn background_scrub(r: Arc<Recoverer>, every: Option<Duration>) {
    let Some(every) = every else {
        return;
    };
    loop {
        tokio::time::sleep(every).await;
        match r.scrub_paced().await {
            Ok(rep) => tracing::info!(
                objects = rep.objects,
                corrupt = rep.corrupt,
                repaired = rep.repaired,
                "background scrub done"
            ),
            Err(e) => tracing::warn!("background scrub failed: {e}"),
        }
    }
}
