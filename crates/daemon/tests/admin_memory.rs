//! Memory held by request bodies being received is bounded by the admin listener's
//! budget: connections that each announce a 60 MB body and send 40 MB of it get
//! one body's worth of memory between them, the rest wait. Alone in its test
//! binary, so that the process's RSS is this test's.
mod common;

use common::*;
use drove_daemon::http_listen::AdminLimits;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const CONNS: usize = 6;
const BODY: usize = 60_000_000;
const SENT: usize = 40_000_000;
const BUDGET: usize = 64 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_partial_large_bodies_do_not_make_the_node_hold_them_all() {
    let (server, addr, _task) = start(AdminLimits {
        budget: BUDGET,
        body: Duration::from_secs(60),
        ..AdminLimits::default()
    })
    .await;
    let mut bytes =
        format!("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\n\r\n").into_bytes();
    bytes.resize(bytes.len() + SENT, b'r');
    let bytes = bytes::Bytes::from(bytes);
    let mut conns = Vec::new();
    for _ in 0..CONNS {
        conns.push(TcpStream::connect(addr).await.unwrap());
    }
    let before = drove_testkit::rss_bytes(None).expect("this process runs") as usize;
    let done = Arc::new(AtomicUsize::new(0));
    let mut senders = Vec::new();
    for mut s in conns {
        let (bytes, done) = (bytes.clone(), done.clone());
        senders.push(tokio::spawn(async move {
            if s.write_all(&bytes).await.is_ok() {
                done.fetch_add(1, Ordering::SeqCst);
            }
            s // kept open: the body stays unfinished
        }));
    }
    wait_until(
        Duration::from_secs(30),
        "one sender to get its 40 MB in",
        || done.load(Ordering::SeqCst) >= 1,
    )
    .await;
    // Give the others every chance to get in too, if the budget let them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = (drove_testkit::rss_bytes(None).expect("this process runs") as usize)
        .saturating_sub(before);
    assert_eq!(
        server.budget_in_use(),
        BODY,
        "one body is taken, the others wait"
    );
    assert_eq!(done.load(Ordering::SeqCst), 1, "only one body is received");
    // One body's 40 MB, plus slack for buffers; without the budget this is 240 MB.
    assert!(
        grown < SENT + (32 << 20),
        "the server grew by {} MB for {CONNS} partial bodies",
        grown >> 20
    );
    for s in senders {
        s.abort();
    }
}
