//! The frame: every peer message on the wire.
//!
//! ```text
//! magic u32 "DRV1" | body_len u32 | crc32c u32 | body
//! body = id u64 | header_len u32 | header (postcard) | payload (raw bytes)
//! ```
//! All integers are big-endian. The crc32c covers the whole body, so a flipped bit on
//! the wire (or garbage sent to the port) is caught before anything is decoded. A frame
//! larger than [`MAX_FRAME`] is refused before it is buffered.
use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{de::DeserializeOwned, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};

const MAGIC: u32 = u32::from_be_bytes(*b"DRV1");
const PREFIX: usize = 12;

/// Largest body accepted: a 32 MiB payload plus headers, with room to spare.
pub const MAX_FRAME: usize = 64 << 20;

/// Why bytes on the wire are not a frame. Any of these closes the connection.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The first four bytes are not the magic.
    BadMagic,
    /// The announced length is over [`MAX_FRAME`] or too short to hold a body.
    BadLength(usize),
    /// The checksum does not match.
    BadChecksum,
    /// The header does not decode as the expected message.
    BadHeader,
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::BadMagic => write!(f, "Bad frame magic"),
            FrameError::BadLength(n) => write!(f, "Bad frame length {n}"),
            FrameError::BadChecksum => write!(f, "Frame checksum mismatch"),
            FrameError::BadHeader => write!(f, "Frame header does not decode"),
        }
    }
}

impl std::error::Error for FrameError {}

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

/// A frame's wire bytes in two parts, sent one after the other: everything up to the
/// payload, and the payload itself, which is never copied (a 4 MiB object copied
/// into the frame buffer was a tenth of a node's CPU time during recovery).
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

    /// Encode into wire bytes, the payload left where it is.
    pub fn encode_parts(&self) -> Result<Encoded, FrameError> {
        let header = postcard::to_stdvec(&self.header).map_err(|_| FrameError::BadHeader)?;
        let body_len = 8 + 4 + header.len() + self.payload.len();
        if body_len > MAX_FRAME {
            return Err(FrameError::BadLength(body_len));
        }
        let mut head = BytesMut::with_capacity(PREFIX + 12 + header.len());
        head.put_u32(MAGIC);
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

impl<H: DeserializeOwned> Frame<H> {
    /// Decode one frame from the front of `buf` if it holds a whole one; the bytes
    /// used are removed. `Ok(None)`: more bytes are needed.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<Self>, FrameError> {
        if buf.len() < PREFIX {
            return Ok(None);
        }
        let body_len = check_prefix(&buf[..PREFIX])?;
        if buf.len() < PREFIX + body_len {
            buf.reserve(PREFIX + body_len - buf.len());
            return Ok(None);
        }
        let want = u32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]);
        buf.advance(PREFIX);
        let body = buf.split_to(body_len).freeze();
        Self::from_body(body, want).map(Some)
    }

    fn from_body(mut body: Bytes, want_crc: u32) -> Result<Self, FrameError> {
        if crc32c::crc32c(&body) != want_crc {
            return Err(FrameError::BadChecksum);
        }
        let id = body.get_u64();
        let hlen = body.get_u32() as usize;
        if hlen > body.len() {
            return Err(FrameError::BadHeader);
        }
        let header_bytes = body.split_to(hlen);
        let header = postcard::from_bytes(&header_bytes).map_err(|_| FrameError::BadHeader)?;
        Ok(Frame {
            id,
            header,
            payload: body,
        })
    }

    /// Read one frame from `r`. `Ok(None)` at a clean end of stream between frames.
    pub async fn read_from<R: AsyncRead + Unpin>(
        r: &mut R,
    ) -> std::io::Result<Option<(Self, usize)>> {
        let mut prefix = [0u8; PREFIX];
        match r.read_exact(&mut prefix).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let body_len = check_prefix(&prefix).map_err(invalid)?;
        let want = u32::from_be_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]);
        // Read into spare capacity: zero-filling a buffer of up to 4 MiB only to
        // overwrite it showed up as a tenth of a node's CPU time during recovery.
        let mut body = BytesMut::with_capacity(body_len);
        let mut rest = (&mut *r).take(body_len as u64);
        while body.len() < body_len {
            if rest.read_buf(&mut body).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        let frame = Self::from_body(body.freeze(), want).map_err(invalid)?;
        Ok(Some((frame, PREFIX + body_len)))
    }
}

fn check_prefix(p: &[u8]) -> Result<usize, FrameError> {
    if u32::from_be_bytes([p[0], p[1], p[2], p[3]]) != MAGIC {
        return Err(FrameError::BadMagic);
    }
    let body_len = u32::from_be_bytes([p[4], p[5], p[6], p[7]]) as usize;
    if !(12..=MAX_FRAME).contains(&body_len) {
        return Err(FrameError::BadLength(body_len));
    }
    Ok(body_len)
}

fn invalid(e: FrameError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PeerReq, PeerResp};
    use drove_types::{Epoch, NodeId, ObjectId, VdiId};
    use proptest::prelude::*;

    fn sample() -> Frame<PeerReq> {
        Frame {
            id: 42,
            header: PeerReq::Write {
                oid: ObjectId::new(VdiId(3), 7),
                offset: 4096,
                fua: true,
                epoch: Epoch(9),
                generation: 4,
                forward: vec![NodeId(2), NodeId(3)],
            },
            payload: Bytes::from(vec![0xab; 4096]),
        }
    }

    #[test]
    fn test_frame_round_trips() {
        let f = sample();
        let mut buf = BytesMut::from(&f.encode().unwrap()[..]);
        let back = Frame::<PeerReq>::decode(&mut buf).unwrap().unwrap();
        assert_eq!(back, f);
        assert!(buf.is_empty());
    }

    #[test]
    fn test_parts_share_the_payload_and_decode_as_one_frame() {
        let f = sample();
        let parts = f.encode_parts().unwrap();
        assert_eq!(parts.payload.as_ptr(), f.payload.as_ptr(), "payload copied");
        let mut buf = BytesMut::from(&parts.head[..]);
        buf.extend_from_slice(&parts.payload);
        assert_eq!(buf.len(), parts.len());
        let back = Frame::<PeerReq>::decode(&mut buf).unwrap().unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn test_partial_frame_needs_more() {
        let bytes = sample().encode().unwrap();
        let mut buf = BytesMut::from(&bytes[..bytes.len() - 1]);
        assert_eq!(Frame::<PeerReq>::decode(&mut buf).unwrap(), None);
    }

    #[test]
    fn test_flipped_bit_is_caught() {
        let bytes = sample().encode().unwrap();
        let mut raw = bytes.to_vec();
        raw[100] ^= 1;
        let mut buf = BytesMut::from(&raw[..]);
        assert_eq!(
            Frame::<PeerReq>::decode(&mut buf),
            Err(FrameError::BadChecksum)
        );
    }

    #[test]
    fn test_huge_length_is_refused_before_buffering() {
        let mut raw = MAGIC.to_be_bytes().to_vec();
        raw.extend_from_slice(&u32::MAX.to_be_bytes());
        raw.extend_from_slice(&[0; 4]);
        let mut buf = BytesMut::from(&raw[..]);
        assert!(matches!(
            Frame::<PeerReq>::decode(&mut buf),
            Err(FrameError::BadLength(_))
        ));
    }

    #[tokio::test]
    async fn test_read_from_stream() {
        let f = Frame {
            id: 1,
            header: PeerResp::Exists(vec![true, false]),
            payload: Bytes::new(),
        };
        let bytes = f.encode().unwrap();
        let mut r = &bytes[..];
        let (back, n) = Frame::<PeerResp>::read_from(&mut r).await.unwrap().unwrap();
        assert_eq!(back, f);
        assert_eq!(n, bytes.len());
        assert!(Frame::<PeerResp>::read_from(&mut r)
            .await
            .unwrap()
            .is_none());
    }

    proptest! {
        #[test]
        fn test_garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut buf = BytesMut::from(&data[..]);
            let _ = Frame::<PeerReq>::decode(&mut buf);
        }

        #[test]
        fn test_any_request_round_trips(id in any::<u64>(), off in any::<u64>(), len in any::<u32>(),
                                        payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let f = Frame { id, header: PeerReq::Read { oid: ObjectId::from_u64(off ^ id), offset: off, len },
                            payload: Bytes::from(payload) };
            let mut buf = BytesMut::from(&f.encode().unwrap()[..]);
            prop_assert_eq!(Frame::<PeerReq>::decode(&mut buf).unwrap().unwrap(), f);
        }
    }
}
