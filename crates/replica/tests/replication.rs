//! Three nodes' replication stacks in one process, talking over real TCP on
//! 127.0.0.1 with real file stores: writes reach every replica in both modes, reads
//! survive a dead replica and a corrupted one.
mod common;

use bytes::Bytes;
use common::*;
use drove_metrics::Metrics;
use drove_objstore::{FileStore, ObjectStore};
use drove_replica::{LocalStore, MapCell, PeerPool, PeerServer, PeerTimeouts};
use drove_types::{ClusterMap, NodeId, NodeInfo, ObjectId, ReplicationMode, VdiId, VdiInfo};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_direct_and_primary_copy_writes_reach_every_replica() {
    let nodes = cluster(3).await;
    // 16 objects per mode: each node is the primary of some of them, so the gateway
    // (node 1) is sometimes the primary itself and must forward too.
    for (vid, mode) in [
        (20, ReplicationMode::Direct),
        (21, ReplicationMode::PrimaryCopy),
    ] {
        // Distinct VDIs, so one mode's writes cannot stand in for the other's.
        let v = VdiInfo {
            id: VdiId(vid),
            ..vdi(mode)
        };
        for k in 0..16u32 {
            let oid = ObjectId::new(v.id, k);
            let data = pattern(k as u8 + 1, 10_000);
            nodes[0]
                .gateway
                .write(&v, oid, 4000, data.clone(), true, 1)
                .await
                .unwrap();
            for n in &nodes {
                let got = n.store.read(oid, 4000, 10_000).unwrap();
                assert_eq!(
                    got,
                    data.to_vec(),
                    "node {} replica of {oid} ({mode:?})",
                    n.id
                );
            }
            let got = nodes[2].gateway.read(&v, oid, 4000, 10_000).await.unwrap();
            assert_eq!(got, data);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_read_skips_a_dead_replica_and_a_corrupt_one() {
    let nodes = cluster(3).await;
    let v = vdi(ReplicationMode::Direct);
    let oid = ObjectId::new(v.id, 3);
    let data = pattern(9, 8192);
    nodes[1]
        .gateway
        .write(&v, oid, 0, data.clone(), false, 1)
        .await
        .unwrap();
    nodes[1].gateway.flush(&v, &[oid]).await.unwrap();

    // Corrupt node 1's local copy: its gateway reads locally first, sees the checksum
    // mismatch and takes another replica's copy.
    let dir = nodes[0]._dir.path();
    let mut corrupted = false;
    for entry in walk(dir) {
        let name = entry.file_name().unwrap().to_string_lossy().to_string();
        if name.contains(&oid.to_string()) && !name.ends_with(".crc") {
            let mut b = std::fs::read(&entry).unwrap();
            b[100] ^= 0xff;
            std::fs::write(&entry, b).unwrap();
            corrupted = true;
        }
    }
    assert!(
        corrupted,
        "object file of {oid} not found under {}",
        dir.display()
    );
    assert!(
        nodes[0].store.read(oid, 0, 8192).is_err(),
        "local copy must fail its checksum"
    );
    let got = nodes[0].gateway.read(&v, oid, 0, 8192).await.unwrap();
    assert_eq!(got, data);

    // Stop node 3's peer server: node 1 still reads (from node 2).
    nodes[2].server.abort();
    let got = nodes[0].gateway.read(&v, oid, 0, 8192).await.unwrap();
    assert_eq!(got, data);
    // A write cannot reach every replica: it fails instead of hanging.
    let err = nodes[0]
        .gateway
        .write(&v, oid, 0, data.clone(), false, 1)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), drove_types::ErrorKind::Unavailable, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_exists_reports_written_objects_only() {
    let nodes = cluster(3).await;
    let v = vdi(ReplicationMode::Direct);
    let a = ObjectId::new(v.id, 0);
    let b = ObjectId::new(v.id, 1);
    nodes[0]
        .gateway
        .write(&v, a, 0, pattern(1, 512), false, 1)
        .await
        .unwrap();
    let flags = nodes[1].gateway.exists(&v, &[a, b]).await.unwrap();
    assert_eq!(flags, vec![true, false]);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_routes_file_redirects_peer_connections() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let nodes = cluster(2).await;
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("peer-routes.json");
    // A third pool on node 1 with a routes file; node 2's real address is looked up
    // from a map we build the same way as `cluster` does.
    let real = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap().to_string();
        let dir2 = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(FileStore::open(dir2.path(), 4 << 20).unwrap());
        let cell = Arc::new(MapCell::default());
        let pool = PeerPool::new(
            NodeId(2),
            CLUSTER,
            cell,
            PeerTimeouts::default(),
            Metrics::new(),
        );
        let server = PeerServer::new(LocalStore::new(store), pool, Metrics::new(), CLUSTER);
        tokio::spawn(server.serve(l));
        std::mem::forget(dir2);
        a
    };
    let mut map = ClusterMap::default();
    map.nodes.insert(
        NodeId(2),
        NodeInfo {
            weight: 100,
            peer_addr: real.clone(),
            ..NodeInfo::new(NodeId(2), "z2")
        },
    );
    let timeouts = PeerTimeouts {
        connect: Duration::from_secs(1),
        request: Duration::from_secs(2),
        ..Default::default()
    };
    let pool = PeerPool::with_routes(
        NodeId(1),
        CLUSTER,
        Arc::new(MapCell::new(map)),
        timeouts,
        Metrics::new(),
        routes.clone(),
    );
    // Route to a closed port: the peer is unreachable.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    std::fs::write(&routes, format!("{{\"{real}\": \"{closed}\"}}")).unwrap();
    let err = pool
        .call(
            NodeId(2),
            drove_proto::PeerReq::Ping {
                epoch: drove_types::Epoch(0),
            },
            Bytes::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), drove_types::ErrorKind::Unavailable, "{err}");
    // Route through a forwarder: the call succeeds, and it went through the forwarder.
    let fwd = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fwd_addr = fwd.local_addr().unwrap();
    let counted = Arc::new(AtomicU64::new(0));
    let c2 = counted.clone();
    let upstream = real.clone();
    tokio::spawn(async move {
        let (mut a, _) = fwd.accept().await.unwrap();
        c2.fetch_add(1, Ordering::SeqCst);
        let mut b = tokio::net::TcpStream::connect(upstream).await.unwrap();
        let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
    });
    std::fs::write(&routes, format!("{{\"{real}\": \"{fwd_addr}\"}}")).unwrap();
    pool.call(
        NodeId(2),
        drove_proto::PeerReq::Ping {
            epoch: drove_types::Epoch(0),
        },
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        counted.load(Ordering::SeqCst),
        1,
        "the call went through the forwarder"
    );
    drop(nodes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_old_gateway_is_fenced_after_a_newer_one_wrote() {
    let nodes = cluster(3).await;
    let v = vdi(ReplicationMode::Direct);
    let oid = ObjectId::new(v.id, 0);
    // Gateway on node 1 holds generation 1 and writes.
    nodes[0]
        .gateway
        .write(&v, oid, 0, pattern(1, 4096), false, 1)
        .await
        .unwrap();
    // The lock moves to node 2 (generation 2), which writes.
    publish(&nodes, &[(v.id, 2)]);
    nodes[1]
        .gateway
        .write(&v, oid, 0, pattern(2, 4096), false, 2)
        .await
        .unwrap();
    // Node 1, cut off and unaware, writes again with generation 1: every replica refuses.
    let err = nodes[0]
        .gateway
        .write(&v, oid, 0, pattern(3, 4096), false, 1)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), drove_types::ErrorKind::Fenced, "{err}");
    for n in &nodes {
        assert_eq!(
            n.store.read(oid, 0, 4096).unwrap(),
            pattern(2, 4096).to_vec()
        );
    }
    // A replica that learned generation 3 from the metadata refuses generation 2 too.
    publish(&nodes[2..], &[(v.id, 3)]);
    assert!(nodes[1]
        .gateway
        .write(&v, oid, 0, pattern(4, 4096), false, 2)
        .await
        .is_err());
}
