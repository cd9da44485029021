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
        if body_len < ALIGNED_PAYLOAD_MIN {
            let body = read_exactly(r, body_len, 0).await?;
            let frame = Self::from_body(body, want).map_err(invalid)?;
            return Ok(Some((frame, PREFIX + body_len)));
        }
        // A large payload (an object) lands at a page-aligned address of its own,
        // so that the object store can write it to the disk with direct I/O.
        let mut fixed = [0u8; 12];
        r.read_exact(&mut fixed).await?;
        let hlen = u32::from_be_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]) as usize;
        if hlen > body_len - 12 {
            return Err(invalid(FrameError::BadHeader));
        }
        let header = read_exactly(r, hlen, 0).await?;
        let payload = read_exactly(r, body_len - 12 - hlen, PAYLOAD_ALIGN).await?;
        let crc = [&fixed[..], &header, &payload]
            .iter()
            .fold(0, |c, part| crc32c::crc32c_append(c, part));
        if crc != want {
            return Err(invalid(FrameError::BadChecksum));
        }
        let header = postcard::from_bytes(&header).map_err(|_| invalid(FrameError::BadHeader))?;
        let id = u64::from_be_bytes(fixed[..8].try_into().expect("8 bytes"));
        let frame = Frame {
            id,
            header,
            payload,
        };
        Ok(Some((frame, PREFIX + body_len)))
    }
}

/// Frames whose body is at least this long have their payload read on its own,
/// aligned to [`PAYLOAD_ALIGN`].
const ALIGNED_PAYLOAD_MIN: usize = 64 * 1024;

/// The alignment of a large frame's payload in memory (a page: what direct I/O
/// needs).
pub const PAYLOAD_ALIGN: usize = 4096;

/// Read exactly `len` bytes from `r` into a new buffer whose start is aligned to
/// `align` (0 or 1: any). The bytes go into spare capacity: zero-filling a buffer
/// of up to 4 MiB only to overwrite it showed up as a tenth of a node's CPU time
/// during recovery.
async fn read_exactly<R: AsyncRead + Unpin>(
    r: &mut R,
    len: usize,
    align: usize,
) -> std::io::Result<Bytes> {
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
    async fn test_a_large_payload_is_read_page_aligned_and_checked() {
        let payload: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
        let f = Frame {
            id: 9,
            header: sample().header,
            payload: Bytes::from(payload),
        };
        let bytes = f.encode().unwrap();
        // Two frames back to back: the first must not read into the second.
        let two = [&bytes[..], &bytes[..]].concat();
        let mut r = &two[..];
        for _ in 0..2 {
            let (back, n) = Frame::<PeerReq>::read_from(&mut r).await.unwrap().unwrap();
            assert_eq!(n, bytes.len());
            assert_eq!(back, f);
            assert_eq!(back.payload.as_ptr() as usize % PAYLOAD_ALIGN, 0);
        }
        // A flipped payload bit, a header length past the body, a cut-off stream.
        let mut raw = bytes.to_vec();
        let last = raw.len() - 1;
        raw[last - 4] ^= 0x10;
        let err = Frame::<PeerReq>::read_from(&mut &raw[..])
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
        let mut raw = bytes.to_vec();
        raw[PREFIX + 8..PREFIX + 12].copy_from_slice(&u32::MAX.to_be_bytes());
        let err = Frame::<PeerReq>::read_from(&mut &raw[..])
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
        let err = Frame::<PeerReq>::read_from(&mut &bytes[..bytes.len() - 1])
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
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
            let f = Frame { id, header: PeerReq::Read { oid: ObjectId::from_u64(off ^ id), offset: off, len, epoch: Epoch(id) },
                            payload: Bytes::from(payload) };
            let mut buf = BytesMut::from(&f.encode().unwrap()[..]);
            prop_assert_eq!(Frame::<PeerReq>::decode(&mut buf).unwrap().unwrap(), f);
        }
    }
}
