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
        // A frame as large as a batch (a whole object) goes out as it is: copying
        // 4 MiB into the batch buffer costs more than the syscall it would save.
        if first.len() >= BATCH {
            wr.write_all(&first).await?;
            sent(first.len());
            continue;
        }
        batch.clear();
        batch.extend_from_slice(&first);
        let mut large = None;
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(more) if more.len() >= BATCH => {
                    large = Some(more);
                    break;
                }
                Ok(more) => batch.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        wr.write_all(&batch).await?;
        sent(batch.len());
        // After the batch: frames keep their queue order.
        if let Some(frame) = large {
            wr.write_all(&frame).await?;
            sent(frame.len());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn test_small_and_large_frames_go_out_whole_and_in_order() {
        let (tx, rx) = mpsc::channel::<Bytes>(16);
        let frames: Vec<Bytes> = [10, BATCH + 5, 300, 7, BATCH, 1]
            .iter()
            .enumerate()
            .map(|(i, &n)| Bytes::from(vec![i as u8 + 1; n]))
            .collect();
        for f in &frames {
            tx.send(f.clone()).await.unwrap();
        }
        drop(tx);
        let mut out = Vec::new();
        let mut total = 0;
        drain(rx, &mut out, |n| total += n).await.unwrap();
        assert_eq!(out, frames.concat());
        assert_eq!(total, out.len());
    }
}
