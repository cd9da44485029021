//! The admin HTTP listener against clients that misbehave: silent, slow with their
//! headers or body, too many (from one address or from many), or sending bodies too
//! large or without a length.
mod common;

use common::*;
use drove_daemon::http_listen::{AdminLimits, SMALL_BODY};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn quick() -> AdminLimits {
    AdminLimits {
        idle: Duration::from_secs(1),
        body: Duration::from_secs(1),
        ..AdminLimits::default()
    }
}

#[tokio::test]
async fn test_silent_and_slow_connections_are_closed_after_the_idle_time() {
    let (_server, addr, _task) = start(quick()).await;
    // Says nothing; sends half a request line; is kept alive after a request.
    let silent = TcpStream::connect(addr).await.unwrap();
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /status HTTP/1.1\r\nHost:")
        .await
        .unwrap();
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut kept).await, (200, "ok".to_string()));
    // All three at once, from the same start: each was last heard from just now.
    let mut silent = silent;
    let limit = Duration::from_secs(10);
    let (a, b, c) = tokio::join!(
        closed_within(&mut silent, limit),
        closed_within(&mut slow, limit),
        closed_within(&mut kept, limit)
    );
    for (what, took) in [("silent", a), ("slow headers", b), ("kept alive", c)] {
        let took = took.unwrap_or_else(|| panic!("{what}: still open"));
        assert!(
            took >= Duration::from_millis(500),
            "{what}: closed early: {took:?}"
        );
    }
    assert_eq!(
        exchange(addr, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .0,
        200
    );
}

#[tokio::test]
async fn test_connections_over_the_cap_are_closed_at_once() {
    let (_server, addr, _task) = start(AdminLimits {
        max_conns: 2,
        ..AdminLimits::default()
    })
    .await;
    let get = b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut a = TcpStream::connect(addr).await.unwrap();
    a.write_all(get).await.unwrap();
    assert_eq!(response(&mut a).await.0, 200);
    let mut b = TcpStream::connect(addr).await.unwrap();
    b.write_all(get).await.unwrap();
    assert_eq!(response(&mut b).await.0, 200);
    let mut over = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_within(&mut over, Duration::from_secs(3))
            .await
            .is_some(),
        "a third connection must be closed (the idle time is 60 s)"
    );
    // The first two are still served; a slot comes back when one closes.
    a.write_all(get).await.unwrap();
    assert_eq!(response(&mut a).await.0, 200);
    drop(b);
    let mut tries = 0;
    loop {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(get).await.unwrap();
        if closed_within(&mut c, Duration::from_millis(200))
            .await
            .is_none()
        {
            break;
        }
        tries += 1;
        assert!(tries < 50, "no slot came back");
    }
}

#[tokio::test]
async fn test_bodies_too_large_or_without_a_length_are_refused() {
    let (server, addr, _task) = start(AdminLimits {
        max_body: 1 << 20,
        ..AdminLimits::default()
    })
    .await;
    // Over the limit: refused from the headers alone.
    let (status, body) = exchange(
        addr,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n",
    )
    .await;
    assert_eq!(status, 413, "{body}");
    // Chunked, small: fine. Chunked, over SMALL_BODY: a length is required.
    let (status, body) = exchange(
        addr,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "5"));
    let mut raw = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..(SMALL_BODY / 1024 + 2) {
        raw.extend_from_slice(b"400\r\n");
        raw.extend_from_slice(&[b'a'; 1024]);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let (status, body) = exchange(addr, &raw).await;
    assert_eq!(status, 411, "{body}");
    // Within the limit with a length: served, and the budget is given back.
    let mut raw = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 500000\r\n\r\n".to_vec();
    raw.resize(raw.len() + 500_000, b'b');
    assert_eq!(exchange(addr, &raw).await, (200, "500000".to_string()));
    assert_eq!(server.budget_in_use(), 0);
}

#[tokio::test]
async fn test_a_body_that_does_not_arrive_in_time_is_refused_and_its_budget_freed() {
    let (server, addr, _task) = start(quick()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        .await
        .unwrap();
    s.write_all(&[b'c'; 1000]).await.unwrap();
    wait_until(
        Duration::from_secs(2),
        "the body to take its budget",
        || server.budget_in_use() == 1_000_000,
    )
    .await;
    let (status, body) = response(&mut s).await;
    assert_eq!(status, 408, "{body}");
    assert_eq!(server.budget_in_use(), 0);
}

#[tokio::test]
async fn test_a_connection_without_its_first_request_is_closed_after_the_handshake_time() {
    let (_server, addr, _task) = start(AdminLimits {
        handshake: Duration::from_secs(1),
        ..AdminLimits::default()
    })
    .await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut trickle = TcpStream::connect(addr).await.unwrap();
    trickle
        .write_all(b"GET /status HTTP/1.1\r\n")
        .await
        .unwrap();
    // A first request in time: the connection is then kept for the idle time (60 s).
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut kept).await, (200, "ok".to_string()));
    let limit = Duration::from_secs(10);
    let (a, b) = tokio::join!(
        closed_within(&mut silent, limit),
        closed_within(&mut trickle, limit)
    );
    for (what, took) in [("silent", a), ("first request unfinished", b)] {
        let took = took.unwrap_or_else(|| panic!("{what}: still open after {limit:?}"));
        assert!(
            took >= Duration::from_millis(500) && took < Duration::from_secs(5),
            "{what}: closed after {took:?}"
        );
    }
    kept.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut kept).await, (200, "ok".to_string()));
}

#[tokio::test]
async fn test_a_flood_from_other_addresses_is_capped_per_address_and_leaves_loopback_room() {
    let (_server, addr, _task) = start(AdminLimits {
        max_conns: 8,
        per_client: 2,
        reserved: 2,
        ..AdminLimits::default()
    })
    .await;
    let get = b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut flood = Vec::new();
    // Two from each address are held; a third from one is closed at once.
    for from in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
        for _ in 0..2 {
            let mut s = connect_from(from, addr).await;
            s.write_all(get).await.unwrap();
            assert_eq!(response(&mut s).await.0, 200, "from {from}");
            flood.push(s);
        }
        let mut third = connect_from(from, addr).await;
        assert!(
            closed_within(&mut third, Duration::from_secs(3))
                .await
                .is_some(),
            "a third connection from {from} was kept"
        );
    }
    // Six held from other addresses: all the shared part. A new address is refused.
    let mut fourth = connect_from("127.0.0.5", addr).await;
    assert!(
        closed_within(&mut fourth, Duration::from_secs(3))
            .await
            .is_some(),
        "the part kept for loopback was given to 127.0.0.5"
    );
    // Loopback gets the two kept for it, at once.
    let mut ops = Vec::new();
    for _ in 0..2 {
        let mut s = connect_from("127.0.0.1", addr).await;
        s.write_all(get).await.unwrap();
        assert_eq!(response(&mut s).await.0, 200);
        ops.push(s);
    }
}
