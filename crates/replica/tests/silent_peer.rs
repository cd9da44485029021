//! A peer that goes silent without closing its connection, made real: a TCP relay in
//! front of a real peer server stops relaying (as a stopped process's kernel keeps
//! the connection open and answers nothing). The pool gives the peer up within
//! its silence floor instead of the 10 s request timeout, fails fast until the map
//! moves on, and fails requests at once when the map marks the peer down.
mod relay;
mod wire;

use bytes::Bytes;
use drove_metrics::Metrics;
use drove_proto::PeerReq;
use drove_replica::{MapCell, PeerPool, PeerTimeouts, ServerLimits};
use drove_types::{ClusterMap, Epoch, ErrorKind, NodeId, NodeInfo, NodeState};
use relay::Relay;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::*;

fn map_with(addr: SocketAddr, epoch: u64, state: NodeState) -> ClusterMap {
    let mut map = ClusterMap {
        epoch: Epoch(epoch),
        ..Default::default()
    };
    map.nodes.insert(
        SERVER,
        NodeInfo {
            peer_addr: addr.to_string(),
            state,
            ..NodeInfo::new(SERVER, "z1")
        },
    );
    map
}

fn pool(map: Arc<MapCell>, floor: Duration) -> Arc<PeerPool> {
    let timeouts = PeerTimeouts {
        connect: Duration::from_secs(2),
        request: Duration::from_secs(10),
        silence_floor: floor,
    };
    PeerPool::new(NodeId(2), CLUSTER, map, timeouts, Metrics::new())
}

fn ping() -> PeerReq {
    PeerReq::Ping { epoch: Epoch(1) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_silent_peer_is_given_up_within_its_floor_not_the_request_timeout() {
    let (_server, addr, _task) = start(ServerLimits::default()).await;
    let relay = Relay::start(addr).await;
    let map = Arc::new(MapCell::new(map_with(relay.addr, 1, NodeState::Up)));
    let pool = pool(map.clone(), Duration::from_millis(500));
    pool.call(SERVER, ping(), Bytes::new()).await.unwrap();
    // Idle pings measure the round trip.
    wait_until(Duration::from_secs(5), "a measured round trip", || {
        pool.rtt(SERVER).is_some()
    })
    .await;
    assert!(pool.rtt(SERVER).unwrap() < Duration::from_millis(100));

    relay.frozen.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let err = pool.call(SERVER, ping(), Bytes::new()).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("said nothing for"), "{err}");
    assert!(
        took >= Duration::from_millis(450),
        "gave up too soon: {took:?}"
    );
    assert!(
        took < Duration::from_millis(1500),
        "took {took:?}, not ~0.5 s"
    );
    assert!(pool.silent_within(SERVER, Duration::from_secs(5)));
    // While the map has not moved on, asking again fails at once.
    let started = Instant::now();
    let err = pool.call(SERVER, ping(), Bytes::new()).await.unwrap_err();
    assert!(err.to_string().contains("went silent"), "{err}");
    assert!(started.elapsed() < Duration::from_millis(100));

    // The peer answers again and the map moved on (it was marked down, then up):
    // the pool dials it again.
    relay.frozen.store(false, Ordering::SeqCst);
    map.set(Arc::new(map_with(relay.addr, 3, NodeState::Up)));
    pool.call(SERVER, ping(), Bytes::new()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_slow_peer_that_still_answers_pings_is_not_given_up() {
    let (_server, addr, _task) = start(ServerLimits::default()).await;
    let relay = Relay::start(addr).await;
    let map = Arc::new(MapCell::new(map_with(relay.addr, 1, NodeState::Up)));
    let pool = pool(map, Duration::from_millis(300));
    pool.call(SERVER, ping(), Bytes::new()).await.unwrap();
    // Freeze for 200 ms at a time, out of every 250: every exchange is slow, but the
    // peer keeps speaking within the floor.
    let frozen = relay.frozen.clone();
    let flicker = tokio::spawn(async move {
        for _ in 0..16 {
            frozen.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            frozen.store(false, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    for _ in 0..20 {
        pool.call(SERVER, ping(), Bytes::new()).await.unwrap();
    }
    flicker.await.unwrap();
    assert!(!pool.silent_within(SERVER, Duration::from_secs(60)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_requests_to_a_peer_the_map_marks_down_fail_at_once() {
    let (_server, addr, _task) = start(ServerLimits::default()).await;
    let relay = Relay::start(addr).await;
    let map = Arc::new(MapCell::new(map_with(relay.addr, 1, NodeState::Up)));
    // A floor far above the test's patience: only the map can end the wait.
    let pool = pool(map.clone(), Duration::from_secs(8));
    pool.call(SERVER, ping(), Bytes::new()).await.unwrap();
    relay.frozen.store(true, Ordering::SeqCst);
    let p = pool.clone();
    let waiting = tokio::spawn(async move { p.call(SERVER, ping(), Bytes::new()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let marked = Instant::now();
    map.set(Arc::new(map_with(relay.addr, 2, NodeState::Down)));
    let err = waiting.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("marked down"), "{err}");
    assert!(
        marked.elapsed() < Duration::from_millis(500),
        "{:?}",
        marked.elapsed()
    );
}
