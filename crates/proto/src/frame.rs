//! The frame: every peer message on the wire, and the sans-IO core that parses it.
//!
//! ```text
//! "DRV" | version u8 | body_len u32 | crc32c u32 | body
//! body = id u64 | header_len u32 | header (postcard) | payload (raw bytes)
//! ```
//! All integers are big-endian. The fourth byte is the wire version as an ASCII digit
//! (`b'0' + version`): version 1 frames began with the constant magic "DRV1", which
//! reads as version 1 under this layout, so a node of this version recognises an
//! older peer and says so instead of calling its frames garbage. A connection's
//! frames carry the version its two ends chose in the hello (see
//! [`crate::version`]); a reader is told that version ([`crate::ReadLimits`]) and
//! refuses a frame of another with [`FrameError::Version`]. The prefix layout above
//! is what every version must keep, so that any two versions can at least name
//! each other.
//!
//! The crc32c covers the whole body, so a flipped bit on the wire (or garbage sent to
//! the port) is caught before anything is decoded. A frame larger than the reader's
//! limit ([`MAX_FRAME`] at most) is refused before anything is buffered.
//!
//! Parsing is split into pure steps ([`Prefix::parse`], [`Fixed::parse`],
//! [`Frame::assemble`]) driven by the one reader production uses,
//! [`Frame::read_from`] / [`Frame::read_limited`] in [`crate::read`]; the property
//! tests drive that reader.
use bytes::{BufMut, Bytes, BytesMut};
use serde::{de::DeserializeOwned, Serialize};

/// The newest wire version this build speaks.
pub const WIRE_VERSION: u8 = crate::version::WireRange::BUILD.max;

const MAGIC: [u8; 3] = *b"DRV";

/// Bytes before the body: magic, version, length, checksum.
pub const PREFIX: usize = 12;

/// The body's fixed part: request id and header length.
pub(crate) const FIXED: usize = 12;

/// Largest body accepted: a 32 MiB payload plus headers, with room to spare.
pub const MAX_FRAME: usize = 64 << 20;

/// Why bytes on the wire are not a frame. Any of these closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first bytes are not "DRV" and a version digit.
    #[error("Not a drove frame (bad magic)")]
    BadMagic,
    /// The frame is of another wire version than the reader expects.
    #[error("Peer sent a frame of drove wire version {got} where this node reads version {want}")]
    Version {
        /// The frame's version.
        got: u8,
        /// The version the reader expects.
        want: u8,
    },
    /// The announced length is over [`MAX_FRAME`] or too short to hold a body.
    #[error("Bad frame length {0}")]
    BadLength(usize),
    /// The announced length is over what the reader accepts here.
    #[error("Frame of {len} bytes is over the limit of {max} here")]
    TooLarge {
        /// Announced body length.
        len: usize,
        /// The reader's limit.
        max: usize,
    },
    /// The checksum does not match.
    #[error("Frame checksum mismatch")]
    BadChecksum,
    /// The header does not decode as the expected message.
    #[error("Frame header does not decode")]
    BadHeader,
}

impl FrameError {
    /// The frame error inside an I/O error returned by the reader, if it is one.
    pub fn of(e: &std::io::Error) -> Option<&FrameError> {
        e.get_ref().and_then(|inner| inner.downcast_ref())
    }
}

/// One decoded message: request id, header and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<H> {
    /// Matches a response to its request.
    pub id: u64,
    /// The message.
    pub header: H,
    /// Bulk data, possibly empty.
    pub payload: Bytes,
}

/// A frame's wire bytes in two parts: everything up to the payload, and the payload
/// itself, shared with the frame rather than copied into an encode buffer (a 4 MiB
/// object copied into the frame buffer was a tenth of a node's CPU time during
/// recovery). The peer connection's writer (drove-replica's `writer.rs`) still
/// copies small frames, payload included, into one batch per syscall, and TLS copies
/// every byte into its records; only a payload as large as a batch goes to the
/// socket from where it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded {
    /// Prefix, request id and header.
    pub head: Bytes,
    /// The payload, shared with the frame it came from.
    pub payload: Bytes,
}

impl Encoded {
    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    /// Whether there are none (never, for an encoded frame).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<H: Serialize> Frame<H> {
    /// Encode into wire bytes.
    pub fn encode(&self) -> Result<Bytes, FrameError> {
        let parts = self.encode_parts()?;
        let mut buf = BytesMut::with_capacity(parts.len());
        buf.put_slice(&parts.head);
        buf.put_slice(&parts.payload);
        Ok(buf.freeze())
    }

    /// Encode into wire bytes of [`WIRE_VERSION`], the payload left where it is.
    pub fn encode_parts(&self) -> Result<Encoded, FrameError> {
        self.encode_as(WIRE_VERSION)
    }

    /// Encode with `version`'s prefix: the version a connection chose, the hello's
    /// ([`crate::version::HELLO_VERSION`]), or version 1's (whose layout is the same;
    /// see [`crate::legacy`]).
    pub fn encode_as(&self, version: u8) -> Result<Encoded, FrameError> {
        let header = postcard::to_stdvec(&self.header).map_err(|_| FrameError::BadHeader)?;
        let body_len = FIXED + header.len() + self.payload.len();
        if body_len > MAX_FRAME {
            return Err(FrameError::BadLength(body_len));
        }
        let mut head = BytesMut::with_capacity(PREFIX + FIXED + header.len());
        head.put_slice(&MAGIC);
        head.put_u8(b'0' + version);
        head.put_u32(body_len as u32);
        head.put_u32(0); // checksum, filled in below
        head.put_u64(self.id);
        head.put_u32(header.len() as u32);
        head.put_slice(&header);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head[PREFIX..]), &self.payload);
        head[8..12].copy_from_slice(&crc.to_be_bytes());
        Ok(Encoded {
            head: head.freeze(),
            payload: self.payload.clone(),
        })
    }
}

/// What a frame's first [`PREFIX`] bytes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    /// Length of the body that follows.
    pub body_len: usize,
    /// The body's expected crc32c.
    pub crc: u32,
}

impl Prefix {
    /// Check the magic, the version (`want`) and the length (at most `max_body`,
    /// itself capped at [`MAX_FRAME`]). The version is checked before the length: a
    /// peer of another version is named as such whatever its frames look like.
    pub fn parse(p: &[u8; PREFIX], want: u8, max_body: usize) -> Result<Prefix, FrameError> {
        if p[..3] != MAGIC || p[3] <= b'0' {
            return Err(FrameError::BadMagic);
        }
        let got = p[3] - b'0';
        if got != want {
            return Err(FrameError::Version { got, want });
        }
        let body_len = u32::from_be_bytes([p[4], p[5], p[6], p[7]]) as usize;
        if !(FIXED..=MAX_FRAME).contains(&body_len) {
            return Err(FrameError::BadLength(body_len));
        }
        let max = max_body.min(MAX_FRAME);
        if body_len > max {
            return Err(FrameError::TooLarge { len: body_len, max });
        }
        let crc = u32::from_be_bytes([p[8], p[9], p[10], p[11]]);
        Ok(Prefix { body_len, crc })
    }
}

/// What the body's first [`FIXED`] bytes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixed {
    /// Request id.
    pub id: u64,
    /// Length of the postcard header.
    pub header_len: usize,
    /// Length of the payload after it.
    pub payload_len: usize,
}

impl Fixed {
    /// Split the body of `prefix` into header and payload; the header must fit.
    pub fn parse(f: &[u8; FIXED], prefix: &Prefix) -> Result<Fixed, FrameError> {
        let mut id = [0u8; 8];
        id.copy_from_slice(&f[..8]);
        let header_len = u32::from_be_bytes([f[8], f[9], f[10], f[11]]) as usize;
        let room = prefix.body_len - FIXED;
        if header_len > room {
            return Err(FrameError::BadHeader);
        }
        Ok(Fixed {
            id: u64::from_be_bytes(id),
            header_len,
            payload_len: room - header_len,
        })
    }
}

impl<H: DeserializeOwned> Frame<H> {
    /// Check the whole body's checksum and decode the header: the last step of
    /// parsing, once every byte of the body is in memory.
    pub fn assemble(
        prefix: &Prefix,
        fixed_bytes: &[u8; FIXED],
        fixed: &Fixed,
        header: &[u8],
        payload: Bytes,
    ) -> Result<Self, FrameError> {
        let crc = [fixed_bytes, header, &payload[..]]
            .iter()
            .fold(0, |c, part| crc32c::crc32c_append(c, part));
        if crc != prefix.crc {
            return Err(FrameError::BadChecksum);
        }
        let header = postcard::from_bytes(header).map_err(|_| FrameError::BadHeader)?;
        Ok(Frame {
            id: fixed.id,
            header,
            payload,
        })
    }
}

#[cfg(test)]
#[path = "frame_tests.rs"]
mod tests;
