//! Shared by the peer-server tests: a real [`PeerServer`] on 127.0.0.1:0 over a
//! memory store, a raw client that speaks the wire protocol byte by byte, and a
//! log capture for checking what the server says.
#![allow(dead_code)]

use bytes::Bytes;
use drove_metrics::Metrics;
use drove_objstore::MemStore;
use drove_proto::{Frame, Hello, HelloReply, PeerReq, PeerResp};
use drove_replica::{LocalStore, MapCell, PeerPool, PeerServer, PeerTimeouts, ServerLimits};
#[allow(unused_imports)] // each test binary uses its own part of the kit
pub use drove_testkit::wait_until_async as wait_until;
use drove_types::{ClusterId, ClusterMap, NodeId, NodeInfo};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The server's cluster.
pub const CLUSTER: ClusterId = ClusterId(0x5e77e7);
/// The server's node id.
pub const SERVER: NodeId = NodeId(1);

/// A peer server with `limits`, serving until the returned task is dropped.
pub async fn start(
    limits: ServerLimits,
) -> (Arc<PeerServer>, SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let pool = PeerPool::new(
        SERVER,
        CLUSTER,
        Arc::new(MapCell::default()),
        PeerTimeouts::default(),
        Metrics::new(),
    );
    let local = LocalStore::new(Arc::new(MemStore::new(4 << 20)));
    let server = PeerServer::with_limits(local, pool, Metrics::new(), CLUSTER, limits);
    let task = tokio::spawn(server.clone().serve(l));
    (server, addr, task)
}

/// A pool of node 2 of `cluster` that knows node 1 at `addr`.
pub fn pool_for(cluster: ClusterId, addr: SocketAddr) -> Arc<PeerPool> {
    let mut map = ClusterMap::default();
    map.nodes.insert(
        SERVER,
        NodeInfo {
            peer_addr: addr.to_string(),
            ..NodeInfo::new(SERVER, "z1")
        },
    );
    let timeouts = PeerTimeouts {
        connect: Duration::from_secs(2),
        request: Duration::from_secs(2),
        ..Default::default()
    };
    PeerPool::new(
        NodeId(2),
        cluster,
        Arc::new(MapCell::new(map)),
        timeouts,
        Metrics::new(),
    )
}

/// The wire bytes of a hello from node 9 of `cluster`.
pub fn hello_bytes(cluster: ClusterId) -> Bytes {
    Frame {
        id: 0,
        header: Hello::new(cluster, NodeId(9)),
        payload: Bytes::new(),
    }
    .encode()
    .unwrap()
}

/// Connect, say hello as a member of [`CLUSTER`] and check the welcome.
pub async fn greeted(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&hello_bytes(CLUSTER)).await.unwrap();
    let (reply, _) = Frame::<HelloReply>::read_from(&mut s)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        reply.header,
        HelloReply::Welcome(Hello::new(CLUSTER, SERVER))
    );
    s
}

/// Send a ping as request `id` on `s` and wait for its answer.
pub async fn ping(s: &mut TcpStream, id: u64) {
    let req = Frame {
        id,
        header: PeerReq::Ping {
            epoch: drove_types::Epoch(0),
        },
        payload: Bytes::new(),
    };
    s.write_all(&req.encode().unwrap()).await.unwrap();
    let (resp, _) = Frame::<PeerResp>::read_from(s).await.unwrap().unwrap();
    assert_eq!(resp.id, id);
    // A ping is answered with the node's incarnation (a test server's is 0).
    assert!(
        matches!(resp.header, PeerResp::Pong { .. }),
        "{:?}",
        resp.header
    );
}

/// Wait for the server to close `s`: the time it took, or `None` if it is still
/// open after `limit`. Whatever the server sends first is read and dropped.
pub async fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match tokio::time::timeout_at((start + limit).into(), s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// Everything logged on this thread while the guard lives (tests on a current-thread
/// runtime: the server's tasks run on the test's thread).
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let w = logs.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        (logs, tracing::subscriber::set_default(sub))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
