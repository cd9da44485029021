//! A deadline on an HTTP connection's first request: its head (request line and
//! headers, up to the blank line) must have been read by then, or reading fails
//! with `TimedOut` and hyper closes the connection. Later requests on a kept-alive
//! connection are not concerned (hyper's header timeout, [`AdminLimits::idle`],
//! bounds those).
//!
//! Without it a connection could stay silent for the whole idle time (60 s) before
//! its first byte, or trickle its first request: 1,500 such connections held the
//! admin API's every slot. A client that means it sends its first request at once;
//! a few seconds ([`AdminLimits::handshake`], counted from the accept, the TLS
//! handshake included) is plenty even across the WAN.
//!
//! [`AdminLimits::idle`]: crate::http_listen::AdminLimits::idle
//! [`AdminLimits::handshake`]: crate::http_listen::AdminLimits::handshake
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `S`, whose reads fail once the deadline passed before a whole first request
/// head was read.
pub struct FirstHead<S> {
    inner: S,
    /// Until the first head has been read: when it must have been.
    deadline: Option<Pin<Box<Sleep>>>,
    /// How much of a blank line was seen last: 1 after `\n`, 2 after `\n\r`.
    seen: u8,
}

impl<S> FirstHead<S> {
    /// `inner`, whose first request head must be read by `deadline`.
    pub fn new(inner: S, deadline: Instant) -> FirstHead<S> {
        FirstHead {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep_until(deadline))),
            seen: 0,
        }
    }

    /// Look through `bytes` for the blank line that ends a head (`\r\n\r\n`, or a
    /// bare `\n\n`, which hyper takes too); true once found.
    fn scan(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            self.seen = match (self.seen, b) {
                (1 | 2, b'\n') => return true,
                (_, b'\n') => 1,
                (1, b'\r') => 2,
                _ => 0,
            };
        }
        false
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FirstHead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        // Polled first, so that a read still waiting is woken at the deadline.
        if let Some(deadline) = &mut me.deadline {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no whole first request in time",
                )));
            }
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut me.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            if me.deadline.is_some() && me.scan(&buf.filled()[before..]) {
                me.deadline = None;
            }
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FirstHead<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn test_the_head_ends_at_the_first_blank_line_however_it_is_split() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody";
        for split in 0..head.len() {
            let mut f = FirstHead::new((), Instant::now());
            let (a, b) = head.split_at(split);
            let done = f.scan(a) || f.scan(b);
            assert!(done, "split at {split}");
        }
        let mut f = FirstHead::new((), Instant::now());
        assert!(f.scan(b"GET / HTTP/1.1\nHost: x\n\n"));
        let mut f = FirstHead::new((), Instant::now());
        assert!(!f.scan(b"GET / HTTP/1.1\r\nHost: x\r\n\rX\n"));
    }

    #[tokio::test]
    async fn test_a_first_request_that_does_not_come_whole_in_time_fails_the_read() {
        let soon = || Instant::now() + Duration::from_millis(300);
        // Silent.
        let (_client, server) = tokio::io::duplex(1024);
        let mut f = FirstHead::new(server, soon());
        let e = f.read(&mut [0u8; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // Half a head, then nothing.
        let (mut client, server) = tokio::io::duplex(1024);
        let mut f = FirstHead::new(server, soon());
        client.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
        assert_eq!(f.read(&mut [0u8; 64]).await.unwrap(), 18);
        let e = f.read(&mut [0u8; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // A whole head in time: later reads may wait as long as they like.
        let (mut client, server) = tokio::io::duplex(1024);
        let mut f = FirstHead::new(server, soon());
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(f.read(&mut [0u8; 64]).await.unwrap(), 18);
        tokio::time::sleep(Duration::from_millis(600)).await;
        client.write_all(b"GET /2").await.unwrap();
        assert_eq!(f.read(&mut [0u8; 64]).await.unwrap(), 6);
    }
}
