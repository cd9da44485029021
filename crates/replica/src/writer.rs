//! The write side of a peer connection, shared by client and server: one task owns
//! the socket's write half and drains a queue of encoded frames, coalescing whatever
//! is queued (up to 1 MiB) into one write so a burst of small requests costs one
//! syscall, not one each.
use drove_proto::Encoded;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Largest coalesced write.
const BATCH: usize = 1 << 20;

/// Write frames from `rx` to `wr` until the queue closes or a write fails;
/// `sent(n)` is called after each successful write of `n` bytes.
pub async fn drain<W: AsyncWrite + Unpin>(
    mut rx: mpsc::Receiver<Encoded>,
    mut wr: W,
    mut sent: impl FnMut(usize),
) -> std::io::Result<()> {
    let mut batch = Vec::with_capacity(64 << 10);
    while let Some(first) = rx.recv().await {
        batch.clear();
        let mut large = Some(first);
        // Small frames are copied into the batch; a frame as large as a batch (a
        // whole object) follows it, its payload written from where it is: copying
        // 4 MiB costs more than the syscall it would save.
        while let Some(f) = large.take_if(|f| f.len() < BATCH) {
            batch.extend_from_slice(&f.head);
            batch.extend_from_slice(&f.payload);
            if batch.len() >= BATCH {
                break;
            }
            large = rx.try_recv().ok();
        }
        if let Some(f) = &large {
            // Its head rides with the batch; the payload goes on its own.
            batch.extend_from_slice(&f.head);
        }
        wr.write_all(&batch).await?;
        sent(batch.len());
        if let Some(f) = large {
            wr.write_all(&f.payload).await?;
            sent(f.payload.len());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[tokio::test]
    async fn test_small_and_large_frames_go_out_whole_and_in_order() {
        let (tx, rx) = mpsc::channel::<Encoded>(16);
        let frames: Vec<Encoded> = [10, BATCH + 5, 300, 7, BATCH, 1, BATCH - 3, 2]
            .iter()
            .enumerate()
            .map(|(i, &n)| Encoded {
                head: Bytes::from(vec![0xF0 | i as u8; 3]),
                payload: Bytes::from(vec![i as u8 + 1; n]),
            })
            .collect();
        for f in &frames {
            tx.send(f.clone()).await.unwrap();
        }
        drop(tx);
        let mut out = Vec::new();
        let mut total = 0;
        drain(rx, &mut out, |n| total += n).await.unwrap();
        let want: Vec<u8> = frames
            .iter()
            .flat_map(|f| f.head.iter().chain(f.payload.iter()).copied())
            .collect();
        assert_eq!(out, want);
        assert_eq!(total, out.len());
    }
}
