//! Reads go to the nearest replica and a slow one is hedged, over real TCP: every
//! node sits behind a freezable relay (a frozen relay is a node that stopped
//! answering but keeps its connections open). A read whose nearest replica is
//! frozen is served by the next one after the hedge delay, long before the pool's
//! silence floor would give the frozen node up; the gateway's metrics say where
//! each read was served and count the hedge.
mod common;
mod relay;
mod relayed;

use common::*;
use drove_replica::PeerTimeouts;
use drove_types::{NodeId, ObjectId, ReplicationMode};
use relay::Relay;
use std::sync::atomic::Ordering;

use std::time::{Duration, Instant};

/// The pool's silence floor here: far above what a hedged read may take, so only
/// the hedge can serve a read whose first replica is frozen.
const SILENCE_FLOOR: Duration = Duration::from_secs(5);

/// A cluster of one node per zone in `zones`, every node reached through its own
/// relay (by its peers too), on map epoch 2.
async fn relayed_cluster(zones: &[&str]) -> (Vec<TestNode>, Vec<Relay>) {
    let timeouts = PeerTimeouts {
        connect: Duration::from_secs(2),
        request: Duration::from_secs(10),
        silence_floor: SILENCE_FLOOR,
    };
    relayed::relayed_cluster(zones, timeouts).await
}

/// The first object of `vdi` whose replicas are `want` (in any order).
fn object_on(nodes: &[TestNode], vdi: &drove_types::VdiInfo, want: &[u64]) -> ObjectId {
    let map = nodes[0].map.get();
    (0..1000)
        .map(|k| ObjectId::new(vdi.id, k))
        .find(|&oid| {
            let mut got = drove_placement::locate(&map, oid, usize::from(vdi.copies));
            got.sort();
            got == want.iter().map(|&i| NodeId(i)).collect::<Vec<_>>()
        })
        .expect("some object has these replicas")
}

/// The value of the metric line `name` (with its labels) in `text`, if present.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_frozen_zone_replica_is_hedged_and_the_next_one_serves() {
    // Node 2 shares node 1's zone: node 1 reads from it first.
    let (nodes, relays) = relayed_cluster(&["za", "za", "z3", "z4"]).await;
    let v = vdi(ReplicationMode::Direct);
    let oid = object_on(&nodes, &v, &[2, 3, 4]);
    let data = pattern(5, 8192);
    let gw = &nodes[0];
    gw.gateway
        .write(&v, oid, 0, data.clone(), false, 1)
        .await
        .unwrap();

    relays[1].frozen.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let got = gw.gateway.read(&v, oid, 0, 8192).await.unwrap();
    let took = started.elapsed();
    assert_eq!(got, data);
    // Node 2 answers nothing and the pool waits 5 s before giving it up: only the
    // hedge (after 10-100 ms) can have served the read this soon.
    assert!(took < Duration::from_millis(900), "read took {took:?}");
    let text = gw.metrics.encode();
    assert_eq!(
        metric(&text, "drove_gateway_hedged_reads_total"),
        Some(1),
        "{text}"
    );
    assert_eq!(
        metric(&text, "drove_gateway_hedge_wins_total"),
        Some(1),
        "{text}"
    );
    assert_eq!(
        metric(&text, r#"drove_gateway_reads_total{where="remote"}"#),
        Some(1),
        "{text}"
    );
    assert_eq!(
        metric(&text, r#"drove_gateway_reads_total{where="zone"}"#),
        None,
        "{text}"
    );
    assert!(
        !gw.pool.silent_within(NodeId(2), Duration::from_secs(60)),
        "the frozen node was given up: the read did not need its silence"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_read_of_the_gateways_own_replica_counts_as_local() {
    let (nodes, relays) = relayed_cluster(&["z1", "z2", "z3"]).await;
    let v = vdi(ReplicationMode::Direct);
    let oid = object_on(&nodes, &v, &[1, 2, 3]);
    let data = pattern(8, 4096);
    let gw = &nodes[0];
    gw.gateway
        .write(&v, oid, 4096, data.clone(), false, 1)
        .await
        .unwrap();
    // The other replicas answer nothing: should a busy machine delay the local read
    // past its hedge delay, the hedge still cannot serve it.
    relays[1].frozen.store(true, Ordering::SeqCst);
    relays[2].frozen.store(true, Ordering::SeqCst);
    let got = gw.gateway.read(&v, oid, 4096, 4096).await.unwrap();
    assert_eq!(got, data);
    let text = gw.metrics.encode();
    assert_eq!(
        metric(&text, r#"drove_gateway_reads_total{where="local"}"#),
        Some(1),
        "{text}"
    );
    for other in ["zone", "remote"] {
        let name = format!(r#"drove_gateway_reads_total{{where="{other}"}}"#);
        assert_eq!(metric(&text, &name), None, "{text}");
    }
    assert_eq!(
        metric(&text, "drove_gateway_hedge_wins_total"),
        Some(0),
        "{text}"
    );
}
