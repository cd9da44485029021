//! Writes across zones over real TCP, every node behind a freezable relay: a
//! zone-sync write is acknowledged by the home zone while the other zone is frozen,
//! reaches it in order once it thaws, and a writer waits at the lag bound; any
//! write crosses into a remote zone once (a relay there passes it on).
mod common;
mod relay;
mod relayed;

use common::*;
use drove_replica::PeerTimeouts;
use drove_types::{ObjectId, ReplicationMode, VdiInfo, WritePolicy};
use relay::Relay;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Zones: nodes 1 and 2 at home, 3 and 4 far; copies 4 (every node holds every
/// object), 2 at home.
const ZONES: [&str; 4] = ["home", "home", "far", "far"];

fn zoned_vdi(policy: WritePolicy, max_lag_ms: u32, max_lag_bytes: u64) -> VdiInfo {
    VdiInfo {
        copies: 4,
        home_zone: Some("home".into()),
        home_copies: Some(2),
        policy,
        max_lag_ms: Some(max_lag_ms),
        max_lag_bytes: Some(max_lag_bytes),
        ..vdi(ReplicationMode::Direct)
    }
}

/// The nodes of [`ZONES`], each behind its relay, all knowing `v`.
async fn cluster_of(v: &VdiInfo) -> (Vec<TestNode>, Vec<Relay>) {
    let timeouts = PeerTimeouts {
        connect: Duration::from_secs(2),
        request: Duration::from_secs(30),
        silence_floor: Duration::from_secs(20),
    };
    let (nodes, relays) = relayed::relayed_cluster(&ZONES, timeouts).await;
    for n in &nodes {
        let map = n.map.get();
        let mut c = catalog(&map, &[]);
        Arc::make_mut(&mut c.vdis).insert(v.id, v.clone());
        n.local.catalog().publish(c);
    }
    (nodes, relays)
}

fn freeze(relays: &[Relay], far: bool) {
    for r in &relays[2..] {
        r.frozen.store(far, Ordering::SeqCst);
    }
}

fn stored(node: &TestNode, oid: ObjectId, len: usize) -> Option<Vec<u8>> {
    if !node.store.exists(oid).unwrap() {
        return None;
    }
    Some(node.store.read(oid, 0, len as u32).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_zone_sync_is_acknowledged_at_home_and_reaches_the_far_zone_in_order() {
    let v = zoned_vdi(WritePolicy::ZoneSync, 60_000, 256 << 20);
    let (nodes, relays) = cluster_of(&v).await;
    let gw = &nodes[0].gateway;
    let oid = ObjectId::new(v.id, 3);
    // Warm the connections, then cut the far zone off (frozen, not closed).
    gw.write(&v, oid, 0, pattern(0, 4096), false, 1)
        .await
        .unwrap();
    gw.drain(&v).await.unwrap();
    freeze(&relays, true);
    let start = Instant::now();
    // Twenty writes over the same 8 KiB, then a sequential run after them: 224 KiB,
    // within the first allowance a lane has before it measured a rate (256 KiB).
    for seed in 1..=20u8 {
        gw.write(&v, oid, 0, pattern(seed, 8192), false, 1)
            .await
            .unwrap();
    }
    for i in 0..16u64 {
        let at = 65536 + i * 4096;
        gw.write(&v, oid, at, pattern(i as u8, 4096), false, 1)
            .await
            .unwrap();
    }
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "36 writes acknowledged without the far zone in {took:?}"
    );
    let lag = gw.lag(v.id);
    assert!(
        lag.writes > 0 && lag.bytes >= 8192,
        "a lag while far is frozen: {lag:?}"
    );
    let want = stored(&nodes[0], oid, 65536 + 16 * 4096).unwrap();
    assert_eq!(
        stored(&nodes[1], oid, want.len()).unwrap(),
        want,
        "home copies agree"
    );
    assert_ne!(
        stored(&nodes[2], oid, want.len()),
        Some(want.clone()),
        "far is behind"
    );
    // Thaw: everything arrives, the last of the overlapping writes last.
    freeze(&relays, false);
    tokio::time::timeout(Duration::from_secs(20), gw.drain(&v))
        .await
        .expect("the far zone caught up")
        .unwrap();
    assert_eq!(gw.lag(v.id).writes, 0);
    for far in &nodes[2..] {
        assert_eq!(
            stored(far, oid, want.len()).unwrap(),
            want,
            "node {}",
            far.id
        );
    }
    // Every write crossed into the far zone once at most (node 3 relayed to node 4;
    // the sequential run was merged, so less).
    let text = nodes[0].metrics.encode();
    let written = count(&text, "drove_gateway_written_bytes_total");
    let crossed = count(&text, "drove_gateway_cross_zone_bytes_total");
    assert_eq!(written, 4096 + 20 * 8192 + 16 * 4096);
    assert!(crossed <= written, "crossed {crossed} of {written}");
    // The first of the twenty was in flight when the zone froze; each later one
    // took the place of the queued one before it, so two of them crossed, and the
    // far copies hold the last.
    let shipped = count(&text, "drove_zone_sync_shipped_bytes_total");
    assert!(
        (2 * 8192 + 16 * 4096..20 * 8192).contains(&shipped),
        "shipped {shipped}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_writer_waits_at_the_lag_bound_and_goes_on_when_the_far_zone_thaws() {
    // 1 MiB and 2 s; the far zone freezes before the lane measured a rate, so its
    // first allowance (256 KiB) binds before either.
    let v = zoned_vdi(WritePolicy::ZoneSync, 2_000, 1 << 20);
    let (nodes, relays) = cluster_of(&v).await;
    let gw = nodes[0].gateway.clone();
    gw.write(&v, ObjectId::new(v.id, 0), 0, pattern(1, 4096), false, 1)
        .await
        .unwrap();
    gw.drain(&v).await.unwrap();
    freeze(&relays, true);
    let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (g2, v2, a2) = (gw.clone(), v.clone(), acked.clone());
    // 64 KiB writes, each to its own place: 4 MiB in all.
    let writer = tokio::spawn(async move {
        for i in 0..64u64 {
            let oid = ObjectId::new(v2.id, (i / 16) as u32);
            let at = (i % 16) * 65536;
            g2.write(&v2, oid, at, pattern(i as u8, 65536), false, 1)
                .await
                .unwrap();
            a2.fetch_add(1, Ordering::SeqCst);
        }
    });
    let mut worst = 0;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        worst = worst.max(gw.lag(v.id).bytes);
    }
    let stuck = acked.load(Ordering::SeqCst);
    assert!(stuck < 64, "the writer waits while the far zone is frozen");
    assert!(worst <= 256 << 10, "lag {worst} within the first allowance");
    assert!(
        stuck >= 3,
        "it got as far as the first allowance: {stuck} writes of 64 KiB"
    );
    let text = nodes[0].metrics.encode();
    assert!(count(&text, "drove_zone_sync_throttled_writes_total") >= 1);
    freeze(&relays, false);
    tokio::time::timeout(Duration::from_secs(30), writer)
        .await
        .expect("the writer finished after the thaw")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), gw.drain(&v))
        .await
        .unwrap()
        .unwrap();
    for i in 0..4u32 {
        let oid = ObjectId::new(v.id, i);
        let home = stored(&nodes[0], oid, 1 << 20).unwrap();
        for n in &nodes[1..] {
            assert_eq!(
                stored(n, oid, 1 << 20).unwrap(),
                home,
                "node {} object {i}",
                n.id
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_sync_write_crosses_into_a_remote_zone_once_and_waits_for_it() {
    let v = zoned_vdi(WritePolicy::Sync, 5_000, 256 << 20);
    let (nodes, relays) = cluster_of(&v).await;
    let gw = nodes[0].gateway.clone();
    let oid = ObjectId::new(v.id, 1);
    gw.write(&v, oid, 0, pattern(9, 65536), false, 1)
        .await
        .unwrap();
    for n in &nodes {
        assert_eq!(
            stored(n, oid, 65536).unwrap(),
            pattern(9, 65536).to_vec(),
            "node {} has it on acknowledgement",
            n.id
        );
    }
    let text = nodes[0].metrics.encode();
    assert_eq!(
        count(&text, "drove_gateway_cross_zone_bytes_total"),
        65536,
        "one copy into the far zone, relayed there"
    );
    assert_eq!(gw.lag(v.id).writes, 0, "sync keeps no lag");
    // With the far zone frozen, a sync write waits for it.
    freeze(&relays, true);
    let (g2, v2) = (gw.clone(), v.clone());
    let w = tokio::spawn(async move { g2.write(&v2, oid, 0, pattern(10, 4096), false, 1).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!w.is_finished(), "sync waits for the far copies");
    freeze(&relays, false);
    tokio::time::timeout(Duration::from_secs(20), w)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_writer_outside_the_home_zone_reads_home_copies_while_its_zone_lags() {
    // Copies 3: both home nodes and one far node. The writer is node 3 (far zone);
    // the object's far copy is node 4, frozen: the write is shipped there later.
    let v = VdiInfo {
        copies: 3,
        ..zoned_vdi(WritePolicy::ZoneSync, 60_000, 256 << 20)
    };
    let (nodes, relays) = cluster_of(&v).await;
    let map = nodes[0].map.get();
    let oid = (0..1000)
        .map(|k| ObjectId::new(v.id, k))
        .find(|&o| drove_placement::locate_vdi(&map, &v, o).contains(&drove_types::NodeId(4)))
        .expect("an object with a copy on node 4");
    let gw = nodes[2].gateway.clone();
    gw.write(&v, oid, 0, pattern(1, 4096), false, 1)
        .await
        .unwrap();
    gw.drain(&v).await.unwrap();
    relays[3].frozen.store(true, Ordering::SeqCst);
    gw.write(&v, oid, 0, pattern(2, 4096), false, 1)
        .await
        .unwrap();
    assert!(gw.lag(v.id).writes > 0, "node 4 has not got it");
    // Node 4 is the reader's zone copy, but it is owed a write: the read goes home,
    // without waiting on node 4 (no hedge).
    let got = gw.read(&v, oid, 0, 4096).await.unwrap();
    assert_eq!(got, pattern(2, 4096));
    let text = nodes[2].metrics.encode();
    assert_eq!(
        count(&text, "drove_gateway_hedged_reads_total"),
        0,
        "{text}"
    );
    assert_eq!(
        count(&text, r#"drove_gateway_reads_total{where="remote"}"#),
        1
    );
    relays[3].frozen.store(false, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(20), gw.drain(&v))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored(&nodes[3], oid, 4096).unwrap(),
        pattern(2, 4096).to_vec()
    );
    // Nothing owed any more: the zone copy serves again.
    gw.read(&v, oid, 0, 4096).await.unwrap();
    let text = nodes[2].metrics.encode();
    assert_eq!(
        count(&text, r#"drove_gateway_reads_total{where="zone"}"#),
        1
    );
}
