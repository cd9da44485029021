//! A read-ahead buffer under TLS. rustls asks its transport for 4 KiB at a time
//! (`read_tls`), so a 1 MiB frame received over TLS took about 256 `read` system
//! calls; below it, this buffer fills with one call what the socket has, up to
//! [`LARGE`], and hands it out in rustls's small reads. Writes pass straight
//! through.
//!
//! The buffer stays small ([`SMALL`]) until [`GROW_AFTER`] bytes have been read:
//! on the peer port that is past the TLS handshake, so a stranger that cannot
//! finish one never makes a node allocate the large buffer.
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The buffer's size before [`GROW_AFTER`] bytes were read.
pub const SMALL: usize = 4 << 10;
/// Its size after.
pub const LARGE: usize = 64 << 10;
/// Bytes read before the buffer grows.
pub const GROW_AFTER: usize = 16 << 10;

/// `S` with reads buffered (see the module doc).
pub struct ReadAhead<S> {
    inner: S,
    buf: Vec<u8>,
    /// Bytes of `buf` handed out already.
    pos: usize,
    /// Bytes of `buf` filled.
    filled: usize,
    /// Bytes read from `inner` so far (up to [`GROW_AFTER`]).
    seen: usize,
}

impl<S> ReadAhead<S> {
    /// Buffer the reads of `inner`.
    pub fn new(inner: S) -> Self {
        ReadAhead {
            inner,
            buf: Vec::new(),
            pos: 0,
            filled: 0,
            seen: 0,
        }
    }

    /// The buffer's size now.
    fn size(&self) -> usize {
        if self.seen < GROW_AFTER {
            SMALL
        } else {
            LARGE
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if me.pos == me.filled {
            let size = me.size();
            // A read as large as the buffer gains nothing from it.
            if out.remaining() >= size {
                let before = out.filled().len();
                ready!(Pin::new(&mut me.inner).poll_read(cx, out))?;
                me.seen = me.seen.saturating_add(out.filled().len() - before);
                return Poll::Ready(Ok(()));
            }
            if me.buf.len() < size {
                me.buf.resize(size, 0);
            }
            let mut rb = ReadBuf::new(&mut me.buf[..size]);
            ready!(Pin::new(&mut me.inner).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            me.pos = 0;
            me.filled = n;
            me.seen = me.seen.saturating_add(n);
            if n == 0 {
                // End of stream: nothing put into `out` says so.
                return Poll::Ready(Ok(()));
            }
        }
        let n = out.remaining().min(me.filled - me.pos);
        out.put_slice(&me.buf[me.pos..me.pos + n]);
        me.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Bytes written in chunks of every size arrive whole and in order through
    /// reads of every size, across the growth of the buffer, and the end of the
    /// stream is seen; a write goes through to the other side.
    #[tokio::test]
    async fn test_reads_of_any_size_see_every_byte_in_order() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let (a, b) = tokio::io::duplex(8 << 10);
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            let mut a = a;
            let mut i = 0;
            let mut k = 1usize;
            while i < sent.len() {
                let n = (k * 977 % 70_000 + 1).min(sent.len() - i);
                a.write_all(&sent[i..i + n]).await.unwrap();
                i += n;
                k += 1;
            }
            // The other side writes back through the read-ahead.
            let mut back = [0u8; 5];
            a.read_exact(&mut back).await.unwrap();
            assert_eq!(&back, b"hello");
        });
        let mut r = ReadAhead::new(b);
        let mut got = Vec::with_capacity(data.len());
        let mut k = 1usize;
        while got.len() < data.len() {
            let want = k * 613 % 90_000 + 1;
            let mut chunk = vec![0u8; want];
            let n = r.read(&mut chunk).await.unwrap();
            assert!(
                n > 0,
                "end of stream after {} of {} bytes",
                got.len(),
                data.len()
            );
            got.extend_from_slice(&chunk[..n]);
            k += 1;
        }
        assert!(got == data, "the bytes differ");
        assert_eq!(r.buf.len(), LARGE, "the buffer did not grow");
        r.write_all(b"hello").await.unwrap();
        r.flush().await.unwrap();
        writer.await.unwrap();
        let mut rest = [0u8; 16];
        assert_eq!(r.read(&mut rest).await.unwrap(), 0, "no end of stream");
    }

    /// Before the first 16 KiB the buffer stays small.
    #[tokio::test]
    async fn test_the_buffer_stays_small_until_data_has_flowed() {
        let (mut a, b) = tokio::io::duplex(64 << 10);
        a.write_all(&[1u8; 10_000]).await.unwrap();
        let mut r = ReadAhead::new(b);
        let mut one = [0u8; 100];
        r.read_exact(&mut one).await.unwrap();
        assert_eq!(r.buf.len(), SMALL);
    }
}
