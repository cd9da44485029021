//! A write deadline: a stream whose writes make no progress for a while fails with
//! `TimedOut` instead of waiting forever. A peer (or an HTTP client) that sends
//! requests but never reads the answers would otherwise hold its connection, and
//! every answer queued for it, for good. Reads pass through untouched: waiting for
//! the next request is the caller's business (idle timeouts).
use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `io` whose writes fail after `limit` without progress.
pub struct WriteDeadline<IO> {
    io: IO,
    limit: Duration,
    /// Started by the first write that could not proceed; cleared by progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<IO> WriteDeadline<IO> {
    /// Wrap `io`.
    pub fn new(io: IO, limit: Duration) -> Self {
        WriteDeadline {
            io,
            limit,
            stalled: None,
        }
    }

    /// What a pending write becomes: still pending, or `TimedOut` once stalled
    /// for `limit`.
    fn on_pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the other side read nothing for {limit:?}"),
            )));
        }
        Poll::Pending
    }

    fn on_ready<T>(&mut self, r: std::io::Result<T>) -> Poll<std::io::Result<T>> {
        self.stalled = None;
        Poll::Ready(r)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        match Pin::new(&mut me.io).poll_write(cx, buf) {
            Poll::Ready(r) => me.on_ready(r),
            Poll::Pending => me.on_pending(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        match Pin::new(&mut me.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => me.on_ready(r),
            Poll::Pending => me.on_pending(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        match Pin::new(&mut me.io).poll_flush(cx) {
            Poll::Ready(r) => me.on_ready(r),
            Poll::Pending => me.on_pending(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        match Pin::new(&mut me.io).poll_shutdown(cx) {
            Poll::Ready(r) => me.on_ready(r),
            Poll::Pending => me.on_pending(cx),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for WriteDeadline<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn test_a_reader_that_stops_reading_fails_the_write_after_the_limit() {
        let (a, mut b) = tokio::io::duplex(1024);
        let mut w = WriteDeadline::new(a, Duration::from_millis(200));
        // Progress resets the clock: 4 KiB through a 1 KiB pipe, read slowly.
        let slow_reader = async {
            let mut buf = [0u8; 1024];
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                tokio::io::AsyncReadExt::read_exact(&mut b, &mut buf)
                    .await
                    .unwrap();
            }
        };
        let (r, ()) = tokio::join!(w.write_all(&[1u8; 4096]), slow_reader);
        r.unwrap();
        // Nobody reads any more: the write fails once it stalled for the limit.
        let start = std::time::Instant::now();
        let err = w.write_all(&[2u8; 4096]).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(start.elapsed() >= Duration::from_millis(200));
    }
}
