//! Transmission-phase replies on the wire: simple replies, structured chunks (read
//! data, errors, block status), and the shaping of an export's extents into block
//! status descriptors that obey the protocol. Pure functions; the session's writer task
//! sends what these build.
use crate::export::Extent;
use crate::proto::*;
use bytes::{BufMut, Bytes, BytesMut};

/// One complete reply: a header (possibly with small payload) and optional bulk data
/// sent right after it without copying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Header bytes (and any small payload).
    pub head: Bytes,
    /// Bulk data (read contents), possibly empty.
    pub data: Bytes,
}

impl Reply {
    fn head(head: BytesMut) -> Reply {
        Reply {
            head: head.freeze(),
            data: Bytes::new(),
        }
    }

    /// Success without payload. A simple reply is allowed for every command but READ
    /// even when structured replies are in use.
    pub fn ok(cookie: u64) -> Reply {
        Reply::head(simple(cookie, 0))
    }

    /// Failure with `errno`; structured replies also carry `msg` for a human.
    pub fn error(cookie: u64, structured: bool, errno: u32, msg: &str) -> Reply {
        if !structured {
            return Reply::head(simple(cookie, errno));
        }
        let msg = crate::option::truncate(msg);
        // Message length is a u16 field; truncate() keeps it within 4096.
        let mut b = BytesMut::with_capacity(STRUCTURED_HEADER_LEN + 6 + msg.len());
        put_chunk_header(
            &mut b,
            NBD_REPLY_FLAG_DONE,
            NBD_REPLY_TYPE_ERROR,
            cookie,
            6 + msg.len() as u32,
        );
        b.put_u32(errno);
        b.put_u16(msg.len() as u16);
        b.put_slice(msg.as_bytes());
        Reply::head(b)
    }

    /// A successful read of `data` at `offset`: one `OFFSET_DATA` chunk marked done
    /// (we learn of every error before sending), or a simple reply followed by the data.
    pub fn read(cookie: u64, structured: bool, offset: u64, data: Bytes) -> Reply {
        if !structured {
            return Reply {
                head: simple(cookie, 0).freeze(),
                data,
            };
        }
        let mut b = BytesMut::with_capacity(STRUCTURED_HEADER_LEN + 8);
        if data.is_empty() {
            // OFFSET_DATA must describe at least one byte; an empty read is just "done".
            put_chunk_header(&mut b, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, cookie, 0);
            return Reply::head(b);
        }
        // data.len() <= MAX_PAYLOAD, checked before the read was issued.
        let len = 8 + data.len() as u32;
        put_chunk_header(
            &mut b,
            NBD_REPLY_FLAG_DONE,
            NBD_REPLY_TYPE_OFFSET_DATA,
            cookie,
            len,
        );
        b.put_u64(offset);
        Reply {
            head: b.freeze(),
            data,
        }
    }

    /// The one `BLOCK_STATUS` chunk for context `ctx` (we serve a single context, so it
    /// is also the last chunk).
    pub fn block_status(cookie: u64, ctx: u32, descriptors: &[(u32, u32)]) -> Reply {
        let len = 4 + 8 * descriptors.len();
        let mut b = BytesMut::with_capacity(STRUCTURED_HEADER_LEN + len);
        // descriptors.len() <= MAX_EXTENTS, so `len` fits a u32.
        put_chunk_header(
            &mut b,
            NBD_REPLY_FLAG_DONE,
            NBD_REPLY_TYPE_BLOCK_STATUS,
            cookie,
            len as u32,
        );
        b.put_u32(ctx);
        for &(length, flags) in descriptors {
            b.put_u32(length);
            b.put_u32(flags);
        }
        Reply::head(b)
    }

    /// Total bytes on the wire.
    pub fn wire_len(&self) -> usize {
        self.head.len() + self.data.len()
    }
}

fn simple(cookie: u64, errno: u32) -> BytesMut {
    let mut b = BytesMut::with_capacity(SIMPLE_REPLY_LEN);
    b.put_u32(NBD_SIMPLE_REPLY_MAGIC);
    b.put_u32(errno);
    b.put_u64(cookie);
    b
}

fn put_chunk_header(b: &mut BytesMut, flags: u16, ty: u16, cookie: u64, len: u32) {
    b.put_u32(NBD_STRUCTURED_REPLY_MAGIC);
    b.put_u16(flags);
    b.put_u16(ty);
    b.put_u64(cookie);
    b.put_u32(len);
}

/// Shape an export's extents for a request of `len > 0` bytes into `(length, flags)`
/// descriptors the protocol accepts: nonzero lengths, adjacent equal states merged,
/// total no more than `len` (so every length fits 32 bits), at most [`MAX_EXTENTS`],
/// exactly one with `req_one`. A backend that returned nothing usable gets one
/// descriptor of status 0 over the whole range, which the protocol says is always safe.
pub fn descriptors(extents: &[Extent], len: u32, req_one: bool) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut covered: u32 = 0;
    for e in extents {
        let left = len - covered;
        if left == 0 {
            break;
        }
        let take = u32::try_from(e.length.min(u64::from(left))).unwrap_or(left);
        if take == 0 {
            continue;
        }
        let flags = state_flags(e);
        let full = out.len() >= MAX_EXTENTS;
        match out.last_mut() {
            // Sum stays <= len, so it cannot overflow.
            Some(last) if last.1 == flags => last.0 += take,
            _ if full => break,
            _ => out.push((take, flags)),
        }
        covered += take;
    }
    if out.is_empty() {
        out.push((len, 0));
    }
    if req_one {
        out.truncate(1);
    }
    out
}

fn state_flags(e: &Extent) -> u32 {
    let mut f = 0;
    if e.hole {
        f |= NBD_STATE_HOLE;
    }
    if e.zero {
        f |= NBD_STATE_ZERO;
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ext(length: u64, hole: bool) -> Extent {
        Extent {
            length,
            hole,
            zero: hole,
        }
    }

    #[test]
    fn test_simple_and_structured_read_bytes() {
        let r = Reply::read(5, false, 0, Bytes::from_static(b"abc"));
        assert_eq!(
            &r.head[..],
            &[0x67, 0x44, 0x66, 0x98, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]
        );
        assert_eq!(&r.data[..], b"abc");
        let r = Reply::read(5, true, 512, Bytes::from_static(b"abc"));
        assert_eq!(&r.head[..4], &[0x66, 0x8e, 0x33, 0xef]);
        assert_eq!(&r.head[4..8], &[0, 1, 0, 1], "flags DONE, type OFFSET_DATA");
        assert_eq!(&r.head[16..20], &11u32.to_be_bytes());
        assert_eq!(&r.head[20..28], &512u64.to_be_bytes());
        assert_eq!(r.wire_len(), 31);
        let r = Reply::read(5, true, 0, Bytes::new());
        assert_eq!(&r.head[4..8], &[0, 1, 0, 0], "NONE chunk");
        assert_eq!(r.head.len(), 20);
    }

    #[test]
    fn test_error_replies() {
        let r = Reply::error(1, false, NBD_EIO, "bad");
        assert_eq!(&r.head[4..8], &5u32.to_be_bytes());
        let r = Reply::error(1, true, NBD_EINVAL, "bad");
        assert_eq!(&r.head[4..8], &[0, 1, 0x80, 1]);
        assert_eq!(&r.head[16..20], &9u32.to_be_bytes());
        assert_eq!(&r.head[20..24], &22u32.to_be_bytes());
        assert_eq!(&r.head[24..26], &3u16.to_be_bytes());
        assert_eq!(&r.head[26..], b"bad");
    }

    #[test]
    fn test_block_status_chunk() {
        let r = Reply::block_status(9, 1, &[(4096, 0), (8192, 3)]);
        assert_eq!(&r.head[4..8], &[0, 1, 0, 5]);
        assert_eq!(&r.head[16..20], &20u32.to_be_bytes());
        assert_eq!(&r.head[20..24], &1u32.to_be_bytes());
        assert_eq!(&r.head[24..28], &4096u32.to_be_bytes());
        assert_eq!(&r.head[36..40], &3u32.to_be_bytes());
    }

    #[test]
    fn test_descriptors_clip_merge_and_req_one() {
        let e = [
            ext(4096, false),
            ext(0, true),
            ext(4096, false),
            ext(1 << 40, true),
        ];
        assert_eq!(descriptors(&e, 10000, false), vec![(8192, 0), (1808, 3)]);
        assert_eq!(descriptors(&e, 10000, true), vec![(8192, 0)]);
        assert_eq!(descriptors(&e, 100, false), vec![(100, 0)]);
        assert_eq!(descriptors(&[], 100, false), vec![(100, 0)]);
        assert_eq!(descriptors(&[ext(0, true)], 7, true), vec![(7, 0)]);
    }

    proptest! {
        #[test]
        fn test_descriptors_obey_protocol(
            lens in proptest::collection::vec((0u64..100_000, any::<bool>()), 0..50),
            len in 1u32..200_000,
            req_one in any::<bool>(),
        ) {
            let e: Vec<Extent> = lens.iter().map(|&(l, h)| ext(l, h)).collect();
            let d = descriptors(&e, len, req_one);
            prop_assert!(!d.is_empty());
            prop_assert!(d.iter().all(|&(l, _)| l > 0));
            let total: u64 = d.iter().map(|&(l, _)| u64::from(l)).sum();
            prop_assert!(total <= u64::from(len));
            if req_one {
                prop_assert_eq!(d.len(), 1);
            }
            prop_assert!(d.windows(2).all(|w| w[0].1 != w[1].1));
        }
    }
}
