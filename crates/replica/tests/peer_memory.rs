//! Memory held by frames being received is bounded by the server's budget, not by
//! what strangers announce: connections that each begin a 60 MB frame and send
//! 40 MB of it get one frame's worth of memory between them, the rest wait.
//! Alone in its test binary, so that the process's RSS is this test's.
mod wire;

use drove_replica::ServerLimits;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use wire::*;

const CONNS: usize = 6;
const FRAME: usize = 60_000_000;
const SENT: usize = 40_000_000;
const BUDGET: usize = 64 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_announced_frames_do_not_make_the_server_allocate_them_all() {
    let (server, addr, _task) = start(ServerLimits {
        budget: BUDGET,
        stall: Duration::from_secs(60),
        ..ServerLimits::default()
    })
    .await;
    // The prefix of a 60 MB frame ("DRV" and the version the connections were
    // greeted in, 4: a frame of another version would be refused before any read),
    // length, any checksum, a plausible request id and header length, then the rest
    // of 40 MB of it, from one buffer shared by every sender and touched before the
    // baseline.
    let mut bytes = b"DRV".to_vec();
    bytes.push(b'0' + V4);
    bytes.extend_from_slice(&(FRAME as u32).to_be_bytes());
    bytes.extend_from_slice(&[0; 4]);
    bytes.extend_from_slice(&1u64.to_be_bytes());
    bytes.extend_from_slice(&1u32.to_be_bytes());
    bytes.resize(12 + SENT, 0x5a);
    let bytes = bytes::Bytes::from(bytes);
    let mut conns = Vec::new();
    for _ in 0..CONNS {
        conns.push(greeted(addr).await);
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
            s // kept open: the frame stays unfinished
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
    let in_use = server.budget_in_use();
    assert!(in_use <= BUDGET, "budget overdrawn: {in_use}");
    assert_eq!(in_use, FRAME, "one frame's body is taken, the others wait");
    assert_eq!(done.load(Ordering::SeqCst), 1, "only one frame is received");
    // One frame's 40 MB, plus slack for buffers; without the budget this is 240 MB.
    assert!(
        grown < SENT + (32 << 20),
        "the server grew by {} MB for {CONNS} announced frames",
        grown >> 20
    );
    for s in senders {
        s.abort();
    }
}
