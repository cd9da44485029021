//! The write side of a peer connection, shared by client and server: one task owns
//! the socket's write half and drains a queue of encoded frames, coalescing whatever
//! is queued (up to 1 MiB) into one write so a burst of small requests costs one
//! syscall, not one each.
use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Largest coalesced write.
const BATCH: usize = 1 << 20;

/// Write frames from `rx` to `wr` until the queue closes or a write fails;
/// `sent(n)` is called after each successful write of `n` bytes.
pub async fn drain<W: AsyncWrite + Unpin>(
    mut rx: mpsc::Receiver<Bytes>,
    mut wr: W,
    mut sent: impl FnMut(usize),
) -> std::io::Result<()> {
    let mut batch = Vec::with_capacity(64 << 10);
    while let Some(first) = rx.recv().await {
        batch.clear();
        batch.extend_from_slice(&first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(more) => batch.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        wr.write_all(&batch).await?;
        sent(batch.len());
    }
    Ok(())
}
