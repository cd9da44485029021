//! A node out of file descriptors keeps its listeners. Its descriptor limit is
//! lowered to 256 and more idle connections than that are opened to its admin and
//! peer ports, so that `accept` fails with EMFILE on both; once they are closed the
//! node must answer on both ports again. (A node once stopped listening on its
//! peer port for good after one failed accept.)
mod common;
use common::*;
use drove_metrics::Metrics;
use drove_replica::{MapCell, PeerPool, PeerTimeouts};
use drove_types::{ClusterMap, NodeId, NodeInfo};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

const LIMIT: u64 = 256;

/// Open descriptors of process `pid`.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn status(admin: &str) -> Option<drove_daemon::api::Status> {
    let o = run(std::process::Command::new("curl").args([
        "-sf",
        "--max-time",
        "5",
        &format!("http://{admin}/api/status"),
    ]));
    if !o.status.success() {
        return None;
    }
    serde_json::from_slice(&o.stdout).ok()
}

#[test]
fn test_a_node_out_of_file_descriptors_keeps_accepting_on_every_port() {
    if !require(&["curl", "prlimit"]) {
        return;
    }
    let c = Cluster::start(1, 1);
    let n = c.nodes[0].clone();
    let st = status(&n.admin).expect("the node answers /api/status");
    let before = open_fds(n.pid);
    assert!(
        before > 0 && (before as u64) < LIMIT - 64,
        "{before} descriptors open"
    );
    let lim = rustix::process::Rlimit {
        current: Some(LIMIT),
        maximum: Some(LIMIT),
    };
    let pid = rustix::process::Pid::from_raw(n.pid as i32);
    assert!(pid.is_some(), "node pid {}", n.pid);
    rustix::process::prlimit(pid, rustix::process::Resource::Nofile, lim).expect("prlimit");

    // Fill the node's descriptor table with idle admin connections (those it cannot
    // accept wait in the backlog), then knock on the peer port too.
    let mut idle: Vec<TcpStream> = (0..LIMIT + 100)
        .filter_map(|_| TcpStream::connect(&n.admin).ok())
        .collect();
    wait_until(
        Duration::from_secs(20),
        "the node to run out of descriptors",
        || open_fds(n.pid) as u64 >= LIMIT - 2,
    );
    idle.extend((0..20).filter_map(|_| TcpStream::connect(&n.peer).ok()));
    let log_path = std::path::Path::new(&n.data).join("node.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_until(
        Duration::from_secs(20),
        "both listeners to hit EMFILE",
        || {
            let l = log();
            l.contains("admin listener: accept failed")
                && l.contains("peer listener: accept failed")
        },
    );
    drop(idle);

    // Both ports serve again.
    wait_until(Duration::from_secs(30), "the admin API to answer", || {
        status(&n.admin).is_some()
    });
    let mut map = ClusterMap::default();
    let id = NodeId(n.id);
    map.nodes.insert(
        id,
        NodeInfo {
            peer_addr: n.peer.clone(),
            ..NodeInfo::new(id, "z")
        },
    );
    let pool = PeerPool::new(
        NodeId(99),
        st.cluster_id,
        Arc::new(MapCell::new(map)),
        PeerTimeouts::default(),
        Metrics::new(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    wait_until(
        Duration::from_secs(30),
        "the peer port to answer a ping",
        || {
            rt.block_on(pool.call(
                id,
                drove_proto::PeerReq::Ping {
                    epoch: drove_types::Epoch(0),
                },
                bytes::Bytes::new(),
            ))
            .is_ok()
        },
    );
}
