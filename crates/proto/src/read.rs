//! Reading frames from a byte stream: the thin I/O driver around the pure parsing
//! steps of [`crate::frame`], and the limits a server puts on it.
//!
//! A body is allocated only after its length passed the reader's limit and, when a
//! [`Budget`] is given, after that many bytes were taken from it: a length read
//! from the network is untrusted, and a node must not reserve 64 MiB because a
//! stranger said so. The budget is given back when the frame is handed on.
use bytes::{BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::frame::{Fixed, Frame, FrameError, Prefix, FIXED, MAX_FRAME, PREFIX, WIRE_VERSION};

/// Frames whose body is at least this long have their payload read on its own,
/// aligned to [`PAYLOAD_ALIGN`].
const ALIGNED_PAYLOAD_MIN: usize = 64 * 1024;

/// The alignment of a large frame's payload in memory (a page: what direct I/O
/// needs).
pub const PAYLOAD_ALIGN: usize = 4096;

/// Memory shared by every connection of a server for frames being received.
#[derive(Debug)]
pub struct Budget {
    sem: Semaphore,
    total: usize,
    /// Bytes granted to readers now. Not `total - available permits`: a waiting
    /// reader is handed free permits before it has all it asked for.
    granted: AtomicUsize,
}

/// Bytes taken from a [`Budget`], given back when dropped.
#[derive(Debug)]
pub struct Taken<'a> {
    budget: &'a Budget,
    n: usize,
    _permit: SemaphorePermit<'a>,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.budget.granted.fetch_sub(self.n, Ordering::Relaxed);
    }
}

impl Budget {
    /// A budget of `bytes` (at least one largest frame, so that any frame the
    /// reader accepts can eventually be received).
    pub fn new(bytes: usize) -> Budget {
        let total = bytes.clamp(MAX_FRAME, Semaphore::MAX_PERMITS);
        Budget {
            sem: Semaphore::new(total),
            total,
            granted: AtomicUsize::new(0),
        }
    }

    /// Bytes taken by frames being received now.
    pub fn in_use(&self) -> usize {
        self.granted.load(Ordering::Relaxed)
    }

    /// The whole budget.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Take `n` bytes (at most [`Budget::total`]), waiting until they are free.
    pub async fn take(&self, n: usize) -> std::io::Result<Taken<'_>> {
        // More than the whole budget would wait for ever. Frames never ask for it
        // (n <= MAX_FRAME <= total, checked by the prefix).
        if n > self.total {
            return Err(invalid(FrameError::TooLarge {
                len: n,
                max: self.total,
            }));
        }
        let count = u32::try_from(n).map_err(|_| invalid(FrameError::BadLength(n)))?;
        let permit = self
            .sem
            .acquire_many(count)
            .await
            .map_err(|_| std::io::Error::other("frame budget closed"))?;
        self.granted.fetch_add(n, Ordering::Relaxed);
        Ok(Taken {
            budget: self,
            n,
            _permit: permit,
        })
    }
}

/// What a reader accepts.
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits<'a> {
    /// Largest body (capped at [`MAX_FRAME`]).
    pub max_body: usize,
    /// Where a body's memory is taken from before it is allocated; `None`: anywhere.
    pub budget: Option<&'a Budget>,
    /// The wire version every frame must carry (the connection's, or the hello's).
    pub version: u8,
}

impl Default for ReadLimits<'_> {
    fn default() -> Self {
        ReadLimits {
            max_body: MAX_FRAME,
            budget: None,
            version: WIRE_VERSION,
        }
    }
}

impl<H: DeserializeOwned> Frame<H> {
    /// Read one frame of [`WIRE_VERSION`] from `r`, up to [`MAX_FRAME`]. `Ok(None)` at a clean end of
    /// stream between frames. Errors: I/O errors as they are, a cut-off frame as
    /// `UnexpectedEof`, a bad frame as `InvalidData` holding a [`FrameError`]
    /// (see [`FrameError::of`]). Returns the frame and its size on the wire.
    pub async fn read_from<R: AsyncRead + Unpin>(
        r: &mut R,
    ) -> std::io::Result<Option<(Self, usize)>> {
        Self::read_limited(r, &ReadLimits::default()).await
    }

    /// [`Frame::read_from`] within `limits`. On [`FrameError::Version`] and
    /// [`FrameError::TooLarge`], `r` is left just after the prefix.
    pub async fn read_limited<R: AsyncRead + Unpin>(
        r: &mut R,
        limits: &ReadLimits<'_>,
    ) -> std::io::Result<Option<(Self, usize)>> {
        let Some(raw) = read_prefix(r).await? else {
            return Ok(None);
        };
        let prefix = Prefix::parse(&raw, limits.version, limits.max_body).map_err(invalid)?;
        // Held until the frame is handed on: it covers the header and the payload.
        let _taken = match limits.budget {
            Some(b) => Some(b.take(prefix.body_len).await?),
            None => None,
        };
        let mut fixed_bytes = [0u8; FIXED];
        r.read_exact(&mut fixed_bytes).await?;
        let fixed = Fixed::parse(&fixed_bytes, &prefix).map_err(invalid)?;
        let header = read_exactly(r, fixed.header_len, 0).await?;
        // A large payload (an object) lands at a page-aligned address of its own,
        // so that the object store can write it to the disk with direct I/O.
        let align = if prefix.body_len >= ALIGNED_PAYLOAD_MIN {
            PAYLOAD_ALIGN
        } else {
            0
        };
        let payload = read_exactly(r, fixed.payload_len, align).await?;
        let frame =
            Frame::assemble(&prefix, &fixed_bytes, &fixed, &header, payload).map_err(invalid)?;
        Ok(Some((frame, PREFIX + prefix.body_len)))
    }
}

/// The prefix, or `None` if the stream ends before its first byte (a clean end);
/// an end inside it is `UnexpectedEof`.
async fn read_prefix<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<[u8; PREFIX]>> {
    let mut p = [0u8; PREFIX];
    let mut have = 0;
    while have < PREFIX {
        match r.read(&mut p[have..]).await? {
            0 if have == 0 => return Ok(None),
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => have += n,
        }
    }
    Ok(Some(p))
}

/// Read exactly `len` bytes from `r` into a new buffer whose start is aligned to
/// `align` (0 or 1: any). The bytes go into spare capacity: zero-filling a buffer
/// of up to 4 MiB only to overwrite it showed up as a tenth of a node's CPU time
/// during recovery.
async fn read_exactly<R: AsyncRead + Unpin>(
    r: &mut R,
    len: usize,
    align: usize,
) -> std::io::Result<Bytes> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    let mut buf = BytesMut::with_capacity(len + align.saturating_sub(1));
    let pad = match align {
        0 | 1 => 0,
        a => (a - buf.as_ptr() as usize % a) % a,
    };
    buf.put_bytes(0, pad);
    let mut rest = (&mut *r).take(len as u64);
    while buf.len() < pad + len {
        if rest.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf.freeze().slice(pad..))
}

fn invalid(e: FrameError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}
