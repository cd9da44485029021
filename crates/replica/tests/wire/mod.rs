//! Shared by the peer-server tests: a real [`PeerServer`] on 127.0.0.1:0 over a
//! memory store, a raw client that speaks the wire protocol byte by byte (as a node
//! of wire version 4 alone: no range in its hello, every frame in version 4), and a
//! log capture for checking what the server says.
#![allow(dead_code)]

use bytes::Bytes;
use drove_metrics::Metrics;
use drove_objstore::MemStore;
use drove_proto::{Frame, Hello, HelloReply, PeerReq, PeerResp, ReadLimits, Speaker, WireRange};
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
    start_speaking(limits, WireRange::BUILD).await
}

/// [`start`] for a server that speaks the wire versions `wire`.
pub async fn start_speaking(
    limits: ServerLimits,
    wire: WireRange,
) -> (Arc<PeerServer>, SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let speaker = Speaker {
        cluster: CLUSTER,
        node: SERVER,
        wire,
    };
    let pool = PeerPool::speaking(
        speaker,
        Arc::new(MapCell::default()),
        PeerTimeouts::default(),
        Metrics::new(),
        None,
    );
    let local = LocalStore::new(Arc::new(MemStore::new(4 << 20)));
    let server = PeerServer::with_limits(local, pool, Metrics::new(), CLUSTER, limits);
    let task = tokio::spawn(server.clone().serve(l));
    (server, addr, task)
}

/// A pool of node 2 of `cluster` that knows node 1 at `addr`.
pub fn pool_for(cluster: ClusterId, addr: SocketAddr) -> Arc<PeerPool> {
    pool_speaking(cluster, addr, WireRange::BUILD)
}

/// [`pool_for`] speaking the wire versions `wire`.
pub fn pool_speaking(cluster: ClusterId, addr: SocketAddr, wire: WireRange) -> Arc<PeerPool> {
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
    let speaker = Speaker {
        cluster,
        node: NodeId(2),
        wire,
    };
    PeerPool::speaking(
        speaker,
        Arc::new(MapCell::new(map)),
        timeouts,
        Metrics::new(),
        None,
    )
}

/// The wire version the raw client speaks (the only one it speaks).
pub const V4: u8 = 4;

/// `frame`'s wire bytes in version 4.
pub fn v4<H: serde::Serialize>(frame: &Frame<H>) -> Vec<u8> {
    let parts = frame.encode_as(V4).unwrap();
    [&parts.head[..], &parts.payload[..]].concat()
}

/// Read one frame of version 4.
pub async fn read_v4<H: serde::de::DeserializeOwned, R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Option<(Frame<H>, usize)>> {
    let limits = ReadLimits {
        version: V4,
        ..ReadLimits::default()
    };
    Frame::read_limited(r, &limits).await
}

/// The hello a node of version 4 sends, from node `node` of `cluster`.
pub fn v4_hello(cluster: ClusterId, node: NodeId) -> Hello {
    Hello {
        version: V4,
        cluster,
        node,
    }
}

/// The wire bytes of a hello from node 9 of `cluster`, a node of version 4.
pub fn hello_bytes(cluster: ClusterId) -> Bytes {
    Bytes::from(v4(&Frame {
        id: 0,
        header: v4_hello(cluster, NodeId(9)),
        payload: Bytes::new(),
    }))
}

/// Connect, say hello as a member of [`CLUSTER`] and check the welcome.
pub async fn greeted(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&hello_bytes(CLUSTER)).await.unwrap();
    let (reply, _) = read_v4::<HelloReply, _>(&mut s).await.unwrap().unwrap();
    // Welcomed in version 4, the highest both speak.
    assert_eq!(reply.header, HelloReply::Welcome(v4_hello(CLUSTER, SERVER)));
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
    s.write_all(&v4(&req)).await.unwrap();
    let (resp, _) = read_v4::<PeerResp, _>(s).await.unwrap().unwrap();
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
