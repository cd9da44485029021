//! One direction of one proxied connection: bytes read from one socket are written
//! to the other no sooner than the direction's delay after they arrived, in order,
//! and no faster than its bandwidth cap. A reader task timestamps each chunk as it
//! reads it; the writer sleeps until a chunk is due. Up to [`QUEUE`] chunks wait
//! between them (as toxiproxy's latency toxic holds 1,024), so a fast link carries
//! its bandwidth-delay product instead of one chunk per delay.
use bytes::{Bytes, BytesMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio::time::{Duration, Instant};

/// Chunks read and not yet written, per direction.
const QUEUE: usize = 1024;
/// The most one read takes.
const CHUNK: usize = 64 << 10;
/// Under a bandwidth cap, bytes are written in slices of this much of a second.
const SLICE: Duration = Duration::from_millis(100);

/// What shapes one direction of a proxy; changed while connections run (the delay
/// is added to proxies whose connections are open).
#[derive(Debug, Default)]
pub struct Shape {
    /// Delay in microseconds.
    pub delay_us: AtomicU64,
    /// Cap in bytes per second; 0 for none.
    pub rate: AtomicU64,
    /// Bytes read from the source side.
    pub received: AtomicU64,
    /// Bytes written to the destination side.
    pub sent: AtomicU64,
}

/// Copy `from` to `to` as `shape` says until `from` ends (then `to` is shut down
/// for writing, so the other end sees the end too) or either side fails.
pub async fn run(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, shape: Arc<Shape>) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Bytes)>(QUEUE);
    let reader_shape = shape.clone();
    let reader = async move {
        let mut buf = BytesMut::with_capacity(4 * CHUNK);
        loop {
            buf.reserve(CHUNK);
            match from.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    reader_shape.received.fetch_add(n as u64, Ordering::Relaxed);
                    let delay = reader_shape.delay_us.load(Ordering::Relaxed);
                    let due = Instant::now() + Duration::from_micros(delay);
                    if tx.send((due, buf.split().freeze())).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        // When the cap lets the next byte go.
        let mut free_at = Instant::now();
        while let Some((due, data)) = rx.recv().await {
            if due > Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            let rate = shape.rate.load(Ordering::Relaxed);
            let ok = if rate == 0 {
                to.write_all(&data).await.is_ok()
            } else {
                let slice = ((rate as f64 * SLICE.as_secs_f64()) as usize).max(1);
                let mut ok = true;
                for part in data.chunks(slice) {
                    let start = free_at.max(Instant::now());
                    if start > Instant::now() {
                        tokio::time::sleep_until(start).await;
                    }
                    if to.write_all(part).await.is_err() {
                        ok = false;
                        break;
                    }
                    free_at = start + Duration::from_secs_f64(part.len() as f64 / rate as f64);
                }
                ok
            };
            if !ok {
                return;
            }
            shape.sent.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
