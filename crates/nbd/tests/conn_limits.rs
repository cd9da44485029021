//! Connection limits at accept, over real TCP on loopback: one client address gets
//! at most `max_connections_per_client` connections, the node at most
//! `max_connections`; a refused connection is closed before the greeting, counted
//! in the metrics, and a place freed by a closed connection is taken again.
mod common;

use common::MemExports;
use drove_metrics::Metrics;
use drove_nbd::{Exports, Limits, Server};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Connect from `from` (a loopback address) to `to`.
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{from}:0").parse().unwrap()).unwrap();
    s.connect(to).await.unwrap()
}

/// Whether the server greets this connection (a refused one is closed unanswered).
async fn greeted(s: &mut TcpStream) -> bool {
    let mut g = [0u8; 18];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut g)).await,
        Ok(Ok(_))
    ) && &g[..8] == b"NBDMAGIC"
}

#[tokio::test]
async fn test_connections_are_capped_per_client_address_and_in_all() {
    let exports = MemExports::with(&[("d", 1 << 20, "test")]);
    let metrics = Metrics::new();
    let server = Arc::new(
        Server::new(
            Arc::clone(&exports) as Arc<dyn Exports>,
            Arc::clone(&metrics),
        )
        .with_limits(Limits {
            max_connections: 5,
            max_connections_per_client: 3,
            ..Limits::default()
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(&server).serve_tcp(listener));

    // Three from 127.0.0.1 are served; the fourth is closed unanswered.
    let mut a = Vec::new();
    for _ in 0..3 {
        let mut s = connect_from("127.0.0.1", addr).await;
        assert!(greeted(&mut s).await);
        a.push(s);
    }
    let mut extra = connect_from("127.0.0.1", addr).await;
    assert!(
        !greeted(&mut extra).await,
        "a fourth connection from one address"
    );

    // Another address has its own share, up to the total of 5.
    let mut b = Vec::new();
    for _ in 0..2 {
        let mut s = connect_from("127.0.0.2", addr).await;
        assert!(greeted(&mut s).await, "127.0.0.2 refused below both limits");
        b.push(s);
    }
    let mut over = connect_from("127.0.0.3", addr).await;
    assert!(!greeted(&mut over).await, "a sixth connection in all");

    let text = metrics.encode();
    for line in [
        "drove_nbd_connections_refused_total{reason=\"per_client\"} 1",
        "drove_nbd_connections_refused_total{reason=\"total\"} 1",
        "drove_nbd_connections 5",
    ] {
        assert!(text.contains(line), "no '{line}' in:\n{text}");
    }

    // A closed connection gives its place back (once the server has seen it end).
    drop(a.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = connect_from("127.0.0.1", addr).await;
        if greeted(&mut s).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the place of a closed connection was not given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
