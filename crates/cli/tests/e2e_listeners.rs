//! The admin and peer listeners under abuse, with real node processes.
//!
//! A node out of file descriptors keeps its listeners. Its descriptor limit is
//! lowered to 256 and more idle connections than that are opened to its admin and
//! peer ports, so that `accept` fails with EMFILE on both; once they are closed the
//! node must answer on both ports again. (A node once stopped listening on its
//! peer port for good after one failed accept.)
//!
//! A flood of idle connections from other addresses (127.0.0.2 and up, as an
//! attacker with one host and many addresses would send) leaves the operators and
//! the cluster's nodes their room: 1,500 idle connections once made a node's admin
//! API unreachable for as long as they were held.
mod common;
use common::*;
use drove_metrics::Metrics;
use drove_replica::{MapCell, PeerPool, PeerTimeouts};
use drove_types::{ClusterMap, NodeId, NodeInfo};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// What a flood saw of the node.
#[derive(Debug, Default)]
struct FloodStats {
    /// Connections opened.
    opened: u64,
    /// Connections the node closed after holding them at least a second (not
    /// refused at accept).
    held_then_closed: u64,
    /// The longest the node held a connection that it then closed.
    longest: Duration,
}

/// Idle connections to `to`, `per` from each of the addresses `from`: each one the
/// node closes is opened again (at once if the node had held it, 200 ms later if
/// it refused it), until the flood is stopped.
struct Flood {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<FloodStats>,
}

impl Flood {
    fn start(to: SocketAddr, from: Vec<String>, per: usize) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let stats = Arc::new(parking_lot::Mutex::new(FloodStats::default()));
                let mut tasks = Vec::new();
                for addr in &from {
                    for _ in 0..per {
                        let (addr, stop, stats) = (addr.clone(), stopped.clone(), stats.clone());
                        // Started 2,000 a second: a burst of thousands of SYNs at
                        // once overflows the listener's queue, and the connections
                        // the kernel drops then retry for seconds.
                        let after = Duration::from_micros(500) * tasks.len() as u32;
                        tasks.push(tokio::spawn(async move {
                            tokio::time::sleep(after).await;
                            hold(to, addr, stop, stats).await
                        }));
                    }
                }
                for t in tasks {
                    t.await.unwrap();
                }
                let seen = std::mem::take(&mut *stats.lock());
                seen
            })
        });
        Flood { stop, thread }
    }

    fn stop(self) -> FloodStats {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// One of a flood's connections, from `from`, held open for as long as the node
/// lets it, and opened again.
async fn hold(
    to: SocketAddr,
    from: String,
    stop: Arc<AtomicBool>,
    stats: Arc<parking_lot::Mutex<FloodStats>>,
) {
    use tokio::io::AsyncReadExt;
    while !stop.load(Ordering::Relaxed) {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
        let conn = tokio::time::timeout(Duration::from_secs(5), sock.connect(to)).await;
        let Ok(Ok(mut conn)) = conn else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        stats.lock().opened += 1;
        let start = Instant::now();
        let mut buf = [0u8; 1024];
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            match tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf)).await {
                Err(_) | Ok(Ok(1..)) => continue,
                Ok(Ok(0)) | Ok(Err(_)) => break,
            }
        }
        let held = start.elapsed();
        if held >= Duration::from_secs(1) {
            // Held, then timed out: opened again at once, to take the place back
            // before anyone else can.
            let mut s = stats.lock();
            s.held_then_closed += 1;
            s.longest = s.longest.max(held);
        } else {
            // Refused: again a little later (not a busy loop on two cores).
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// 127.0.0.2, 127.0.0.3, ...: `n` addresses of another host.
fn other_hosts(n: usize) -> Vec<String> {
    (2..2 + n).map(|i| format!("127.0.0.{i}")).collect()
}

fn log_lines(n: &Node) -> usize {
    let path = std::path::Path::new(&n.data).join("node.log");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

#[test]
fn test_an_admin_port_flood_from_other_addresses_leaves_the_cli_working() {
    let c = Cluster::start_with(tempfile::tempdir().unwrap(), 3, 3, &["--tls", "--auth"]);
    let n = c.nodes[0].clone();
    let before = open_fds(n.pid);
    let lines_before = log_lines(&n);
    // 2,000 idle connections from 20 addresses: past the 1,024 of all the admin
    // port holds, 100 from each of them where 64 may stay.
    let flood = Flood::start(n.admin.parse().unwrap(), other_hosts(20), 100);
    wait_until(
        Duration::from_secs(30),
        "the flood to fill its share",
        || open_fds(n.pid) >= before + 700,
    );
    let start = Instant::now();
    let mut most = 0;
    let (mut calls, mut slowest) = (0, Duration::ZERO);
    // The operator's calls (from 127.0.0.1), beside the flood, for 12 s: more than
    // twice the time a connection has for its TLS handshake and first request.
    while start.elapsed() < Duration::from_secs(12) {
        let t = Instant::now();
        let o = c.drove(0, &["cluster", "status"]);
        let took = t.elapsed();
        assert!(
            o.status.success(),
            "cluster status beside the flood: {}",
            text(&o)
        );
        assert!(
            took < Duration::from_secs(5),
            "cluster status took {took:?}"
        );
        (calls, slowest) = (calls + 1, slowest.max(took));
        most = most.max(open_fds(n.pid));
    }
    let stats = flood.stop();
    eprintln!(
        "flood: {stats:?}; {calls} cluster status calls beside it, the slowest {slowest:?}; \
         the node had at most {most} descriptors open, {before} before"
    );
    // At most the shared part (768 of 1,024) from other addresses.
    assert!(
        most <= before + 800,
        "{most} descriptors open with the flood, {before} before"
    );
    // Idle ones were closed after the handshake time (5 s), not the idle time (60 s).
    assert!(stats.held_then_closed > 100, "{stats:?}");
    assert!(stats.longest < Duration::from_secs(10), "{stats:?}");
    // And the flood did not flood the log: refusals and failed handshakes are
    // logged at most once a second.
    let added = log_lines(&n) - lines_before;
    eprintln!("{added} lines logged by node 1 during the flood");
    assert!(added < 120, "{added} log lines during the flood");
}

#[test]
fn test_a_peer_port_flood_from_other_addresses_leaves_room_for_the_nodes() {
    if !require(&["qemu-io"]) {
        return;
    }
    let mut c = Cluster::start_with(tempfile::tempdir().unwrap(), 3, 3, &["--tls", "--auth"]);
    c.create_vdi("pf", "16M", &[]);
    let out = qemu_io(&c.nodes[0].uri("pf"), &["write -P 0x42 0 8M".to_string()]);
    assert!(!out.contains("failed"), "{out}");
    let n = c.nodes[0].clone();
    let before = open_fds(n.pid);
    // 4,352 idle connections from 17 addresses: past the 4,096 of all the peer port
    // holds, 256 from each where 256 may stay, 3,072 in all.
    let flood = Flood::start(n.peer.parse().unwrap(), other_hosts(17), 256);
    wait_until(
        Duration::from_secs(60),
        "the flood to fill its share",
        || open_fds(n.pid) >= before + 2900,
    );
    // Node 2 starts again: it must reach node 1's peer port, through the flood, for
    // its metadata and for the VDI's replicas.
    c.kill(1);
    let restarted = Instant::now();
    c.restart(1);
    // `vdi check` through node 2 compares the copies of every object on all three
    // nodes, node 1's through its peer port.
    let mut report = serde_json::Value::Null;
    wait_until(
        Duration::from_secs(30),
        "node 2 to check the VDI on every node",
        || {
            let o = c.drove(1, &["vdi", "check", "pf", "--json"]);
            report = serde_json::from_slice(&o.stdout).unwrap_or_default();
            report["objects"].as_u64() >= Some(2)
                && report["identical"] == report["objects"]
                && report["degraded"] == 0
        },
    );
    let took = restarted.elapsed();
    let most = open_fds(n.pid);
    let stats = flood.stop();
    eprintln!(
        "flood: {stats:?}; node 1 had {most} descriptors open, {before} before; node 2 \
         restarted and checked the VDI on every node in {took:?}: {report}"
    );
    assert!(most <= before + 3100, "{most} descriptors, {before} before");
}
