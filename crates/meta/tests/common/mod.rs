//! Helpers for cluster tests: real `Meta` nodes in one process, each serving its
//! router with axum on its own 127.0.0.1 listener, and a polling `wait_until`.
#![allow(dead_code)]

use drove_meta::{Meta, MetaConfig, MetaState};
#[allow(unused_imports)] // each test binary uses its own part of the kit
pub use drove_testkit::wait_until_async as wait_until;
use drove_types::{NodeId, NodeInfo, NodeState};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a node may take to become ready in these tests.
pub const READY: Duration = Duration::from_secs(20);

/// One running node.
pub struct Node {
    pub meta: Arc<Meta>,
    pub addr: String,
    pub dir: PathBuf,
    pub join: Option<String>,
    stop: oneshot::Sender<()>,
    server: JoinHandle<()>,
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn node_info(addr: &str) -> NodeInfo {
    NodeInfo {
        id: NodeId(0),
        zone: "z1".to_string(),
        weight: 1,
        admin_addr: addr.to_string(),
        peer_addr: "127.0.0.1:1".to_string(),
        nbd_addr: "127.0.0.1:2".to_string(),
        nbd_socket: "/tmp/none.sock".to_string(),
        state: NodeState::Up,
        witness: false,
        ..NodeInfo::new(NodeId(0), "z1")
    }
}

/// Open a node on `listener` and serve its router; does not wait for readiness.
pub async fn start_on(listener: TcpListener, dir: &Path, join: Option<String>) -> Node {
    let addr = listener.local_addr().unwrap().to_string();
    let cfg = MetaConfig {
        data_dir: dir.to_path_buf(),
        addr: addr.clone(),
        join: join.clone(),
        node: node_info(&addr),
        max_voters: 3,
        join_timeout: drove_meta::DEFAULT_JOIN_TIMEOUT,
        tls: None,
        routes: None,
    };
    let meta = Meta::open(cfg).await.expect("open");
    let router = meta.router();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await;
    });
    Node {
        meta,
        addr,
        dir: dir.to_path_buf(),
        join,
        stop,
        server,
    }
}

/// A fresh node on a new port.
pub async fn start(dir: &Path, join: Option<String>) -> Node {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    start_on(listener, dir, join).await
}

/// Reopen a stopped node from its directory on the same port.
pub async fn restart(addr: &str, dir: &Path, join: Option<String>) -> Node {
    let deadline = Instant::now() + Duration::from_secs(5);
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) if Instant::now() < deadline => {
                eprintln!("rebinding {addr}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot rebind {addr}: {e}"),
        }
    };
    start_on(listener, dir, join).await
}

impl Node {
    /// Shut Raft down, then the HTTP server (closing peers' kept-alive connections).
    pub async fn stop(self) -> (String, PathBuf, Option<String>) {
        self.meta.shutdown().await;
        let _ = self.stop.send(());
        let mut server = self.server;
        if tokio::time::timeout(Duration::from_secs(5), &mut server)
            .await
            .is_err()
        {
            server.abort();
        }
        (self.addr, self.dir, self.join)
    }

    pub fn id(&self) -> u64 {
        self.meta.node_id().0
    }
}

/// The id of the leader all `nodes` agree on, once they do.
pub async fn agreed_leader(nodes: &[&Node]) -> u64 {
    agreed_leader_among(nodes, &nodes.iter().map(|n| n.id()).collect::<Vec<_>>()).await
}

/// The id of the leader all `nodes` agree on, once they agree on one of `allowed`
/// (after a restart, nodes first report the leader of their persisted vote).
pub async fn agreed_leader_among(nodes: &[&Node], allowed: &[u64]) -> u64 {
    let mut leader = 0;
    wait_until(
        Duration::from_secs(15),
        "a leader all nodes agree on",
        || {
            let seen: Vec<Option<NodeId>> = nodes.iter().map(|n| n.meta.status().leader).collect();
            match seen[0] {
                Some(l) if allowed.contains(&l.0) && seen.iter().all(|s| *s == Some(l)) => {
                    leader = l.0;
                    true
                }
                _ => false,
            }
        },
    )
    .await;
    leader
}

/// True when every node's state satisfies `f`.
pub fn all(nodes: &[&Node], f: impl Fn(&MetaState) -> bool) -> bool {
    nodes.iter().all(|n| f(&n.meta.state()))
}
