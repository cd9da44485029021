//! Frame tests. They all go through [`Frame::read_from`] / [`Frame::read_limited`],
//! the reader production uses, fed by [`Chunked`]: a stream that hands its bytes
//! over in pieces of arbitrary sizes, sometimes after a `Pending`, as a socket does.
use super::*;
use crate::read::{Budget, ReadLimits, PAYLOAD_ALIGN};
use crate::{PeerReq, PeerResp, WireError};
use drove_types::{ErrorKind, ObjectId};
use proptest::prelude::*;
use std::io::ErrorKind as IoKind;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, ReadBuf};

/// A reader over `data` that returns at most `sizes[i]` bytes at its i-th read
/// (cycling), and `Pending` (after waking itself) before every read whose size is
/// odd: the piece boundaries and wake-ups a socket would produce.
struct Chunked {
    data: Vec<u8>,
    pos: usize,
    sizes: Vec<usize>,
    i: usize,
    pending: bool,
}

impl Chunked {
    fn new(data: Vec<u8>, sizes: Vec<usize>) -> Chunked {
        let sizes = if sizes.is_empty() { vec![1] } else { sizes };
        Chunked {
            data,
            pos: 0,
            sizes,
            i: 0,
            pending: false,
        }
    }
}

impl AsyncRead for Chunked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let size = self.sizes[self.i % self.sizes.len()].max(1);
        if size % 2 == 1 && !self.pending {
            self.pending = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.pending = false;
        self.i += 1;
        let n = size.min(buf.remaining()).min(self.data.len() - self.pos);
        let start = self.pos;
        buf.put_slice(&self.data[start..start + n]);
        self.pos += n;
        Poll::Ready(Ok(()))
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Every frame in `data`, read in pieces of `sizes`, up to the end or an error.
fn read_all(data: Vec<u8>, sizes: Vec<usize>) -> std::io::Result<Vec<Frame<PeerResp>>> {
    block_on(async move {
        let mut r = Chunked::new(data, sizes);
        let mut out = Vec::new();
        while let Some((f, _)) = Frame::<PeerResp>::read_from(&mut r).await? {
            out.push(f);
        }
        Ok(out)
    })
}

fn sample() -> Frame<PeerResp> {
    Frame {
        id: 42,
        header: PeerResp::Err(WireError {
            kind: ErrorKind::Corrupt,
            msg: "block 3 of object 7".into(),
        }),
        payload: Bytes::from(vec![0xab; 4096]),
    }
}

fn frame_error(e: &std::io::Error) -> FrameError {
    assert_eq!(e.kind(), IoKind::InvalidData, "{e}");
    FrameError::of(e).cloned().expect("a frame error inside")
}

#[test]
fn test_frame_round_trips_byte_by_byte() {
    let f = sample();
    assert_eq!(
        read_all(f.encode().unwrap().to_vec(), vec![1]).unwrap(),
        [f]
    );
}

#[test]
fn test_parts_share_the_payload_and_read_as_one_frame() {
    let f = sample();
    let parts = f.encode_parts().unwrap();
    assert_eq!(parts.payload.as_ptr(), f.payload.as_ptr(), "payload copied");
    let bytes = [&parts.head[..], &parts.payload[..]].concat();
    assert_eq!(bytes.len(), parts.len());
    assert_eq!(&bytes[..4], b"DRV5", "the newest version on the wire");
    assert_eq!(read_all(bytes, vec![7, 4096]).unwrap(), [f]);
}

#[test]
fn test_cut_off_frame_is_unexpected_eof_and_empty_stream_is_a_clean_end() {
    let bytes = sample().encode().unwrap();
    for cut in [1, PREFIX - 1, PREFIX, PREFIX + 5, bytes.len() - 1] {
        let err = read_all(bytes[..cut].to_vec(), vec![3]).unwrap_err();
        assert_eq!(err.kind(), IoKind::UnexpectedEof, "cut at {cut}: {err}");
    }
    assert!(read_all(Vec::new(), vec![1]).unwrap().is_empty());
}

#[test]
fn test_flipped_bit_is_caught() {
    let mut raw = sample().encode().unwrap().to_vec();
    raw[100] ^= 1;
    let err = read_all(raw, vec![64]).unwrap_err();
    assert_eq!(frame_error(&err), FrameError::BadChecksum);
}

#[test]
fn test_huge_length_is_refused_before_buffering() {
    let mut raw = b"DRV5".to_vec();
    raw.extend_from_slice(&u32::MAX.to_be_bytes());
    raw.extend_from_slice(&[0; 4]);
    let err = read_all(raw, vec![12]).unwrap_err();
    assert_eq!(frame_error(&err), FrameError::BadLength(u32::MAX as usize));
}

#[test]
fn test_version_1_and_future_versions_are_named() {
    for (byte, v) in [
        (b'1', 1u8),
        (b'2', 2),
        (b'3', 3),
        (b'4', 4),
        (b'6', 6),
        (b'9', 9),
    ] {
        let mut raw = sample().encode().unwrap().to_vec();
        raw[3] = byte;
        let err = read_all(raw, vec![100]).unwrap_err();
        assert_eq!(
            frame_error(&err),
            FrameError::Version {
                got: v,
                want: WIRE_VERSION
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("wire version {v} where this node reads version 5")),
            "{msg}"
        );
    }
    // Not a version at all: garbage.
    for byte in [b'0', 0, b' '] {
        let mut raw = sample().encode().unwrap().to_vec();
        raw[3] = byte;
        let err = read_all(raw, vec![100]).unwrap_err();
        assert_eq!(frame_error(&err), FrameError::BadMagic);
    }
}

#[tokio::test]
async fn test_a_frame_over_the_limit_is_refused_after_its_prefix() {
    let bytes = sample().encode().unwrap();
    let limits = ReadLimits {
        max_body: 1000,
        budget: None,
        version: WIRE_VERSION,
    };
    let mut r = &bytes[..];
    let err = Frame::<PeerResp>::read_limited(&mut r, &limits)
        .await
        .unwrap_err();
    assert!(matches!(
        frame_error(&err),
        FrameError::TooLarge { max: 1000, .. }
    ));
    assert_eq!(
        r.len(),
        bytes.len() - PREFIX,
        "nothing read past the prefix"
    );
}

#[tokio::test]
async fn test_the_budget_is_taken_before_the_body_and_given_back() {
    use tokio::io::AsyncWriteExt;
    let budget = Budget::new(MAX_FRAME);
    let big = |id| Frame {
        id,
        header: PeerResp::Data,
        payload: Bytes::from(vec![id as u8; 40 << 20]),
    };
    let (a, b) = (big(1).encode().unwrap(), big(2).encode().unwrap());
    let (mut wa, mut ra) = tokio::io::duplex(1 << 20);
    let (mut wb, mut rb) = tokio::io::duplex(1 << 20);
    let limits = ReadLimits {
        max_body: MAX_FRAME,
        budget: Some(&budget),
        version: WIRE_VERSION,
    };
    let read_a = Frame::<PeerResp>::read_limited(&mut ra, &limits);
    let read_b = Frame::<PeerResp>::read_limited(&mut rb, &limits);
    tokio::pin!(read_a, read_b);
    // Both prefixes arrive; only the first reader gets its 40 MiB.
    wa.write_all(&a[..PREFIX + 100]).await.unwrap();
    wb.write_all(&b[..PREFIX + 100]).await.unwrap();
    assert!(futures_poll(read_a.as_mut()).is_pending());
    assert!(futures_poll(read_b.as_mut()).is_pending());
    assert_eq!(budget.in_use(), a.len() - PREFIX);
    // The second waits, allocating nothing, until the first has its whole frame.
    let write_a = async { wa.write_all(&a[PREFIX + 100..]).await.unwrap() };
    let (got_a, ()) = tokio::join!(&mut read_a, write_a);
    assert_eq!(got_a.unwrap().unwrap().0, big(1));
    assert_eq!(budget.in_use(), 0, "given back when handed on");
    // Now the second reader gets it.
    assert!(futures_poll(read_b.as_mut()).is_pending());
    assert_eq!(budget.in_use(), b.len() - PREFIX);
    let write_b = async { wb.write_all(&b[PREFIX + 100..]).await.unwrap() };
    let (got_b, ()) = tokio::join!(&mut read_b, write_b);
    assert_eq!(got_b.unwrap().unwrap().0, big(2));
    assert_eq!(budget.in_use(), 0);
}

/// Poll a future once.
fn futures_poll<F: std::future::Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    let waker = std::task::Waker::noop();
    f.poll(&mut Context::from_waker(waker))
}

#[tokio::test]
async fn test_a_large_payload_is_read_page_aligned_and_checked() {
    let payload: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let f = Frame {
        id: 9,
        header: PeerReq::Read {
            oid: ObjectId::from_u64(5),
            offset: 0,
            len: 4 << 20,
            epoch: drove_types::Epoch(3),
        },
        payload: Bytes::from(payload),
    };
    let bytes = f.encode().unwrap();
    // Two frames back to back: the first must not read into the second.
    let two = [&bytes[..], &bytes[..]].concat();
    let mut r = Chunked::new(two, vec![65536, 3, 100_000]);
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
    assert_eq!(frame_error(&err), FrameError::BadChecksum);
    let mut raw = bytes.to_vec();
    raw[PREFIX + 8..PREFIX + 12].copy_from_slice(&u32::MAX.to_be_bytes());
    let err = Frame::<PeerReq>::read_from(&mut &raw[..])
        .await
        .unwrap_err();
    assert_eq!(frame_error(&err), FrameError::BadHeader);
    let err = Frame::<PeerReq>::read_from(&mut &bytes[..bytes.len() - 1])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), IoKind::UnexpectedEof, "{err}");
}

fn any_resp() -> impl Strategy<Value = PeerResp> {
    prop_oneof![
        Just(PeerResp::Ok),
        Just(PeerResp::Data),
        proptest::collection::vec(any::<bool>(), 0..40).prop_map(PeerResp::Exists),
        proptest::collection::vec(any::<u64>(), 0..40)
            .prop_map(|v| PeerResp::List(v.into_iter().map(ObjectId::from_u64).collect())),
        ".{0,200}".prop_map(|msg| PeerResp::Err(WireError {
            kind: ErrorKind::Io,
            msg
        })),
    ]
}

/// Payload sizes: mostly small, some past the aligned-payload threshold.
fn any_payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 0..300),
        1 => (64usize * 1024..80 * 1024).prop_map(|n| vec![0x5a; n]),
    ]
}

fn any_frame() -> impl Strategy<Value = Frame<PeerResp>> {
    (any::<u64>(), any_resp(), any_payload()).prop_map(|(id, header, payload)| Frame {
        id,
        header,
        payload: Bytes::from(payload),
    })
}

fn any_sizes() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(1usize..5000, 1..20)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn test_any_frames_round_trip_in_any_pieces(
        frames in proptest::collection::vec(any_frame(), 1..4), sizes in any_sizes())
    {
        let bytes: Vec<u8> = frames.iter().flat_map(|f| f.encode().unwrap().to_vec()).collect();
        prop_assert_eq!(read_all(bytes, sizes).unwrap(), frames);
    }

    #[test]
    fn test_garbage_never_panics_and_is_refused(
        data in proptest::collection::vec(any::<u8>(), 1..600), sizes in any_sizes())
    {
        prop_assert!(read_all(data, sizes).is_err());
    }

    #[test]
    fn test_garbage_behind_a_valid_magic_is_refused(
        version in any::<u8>(), len in 0u32..700, crc in any::<u32>(),
        body in proptest::collection::vec(any::<u8>(), 0..700), sizes in any_sizes())
    {
        let mut data = b"DRV".to_vec();
        data.push(version);
        data.extend_from_slice(&len.to_be_bytes());
        data.extend_from_slice(&crc.to_be_bytes());
        data.extend_from_slice(&body);
        prop_assert!(read_all(data, sizes).is_err());
    }

    #[test]
    fn test_any_flipped_bit_is_refused(frame in any_frame(), bit in any::<usize>(), sizes in any_sizes()) {
        let mut raw = frame.encode().unwrap().to_vec();
        let bit = bit % (raw.len() * 8);
        raw[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(read_all(raw, sizes).is_err(), "bit {} flipped", bit);
    }

    #[test]
    fn test_any_cut_off_frame_is_unexpected_eof(frame in any_frame(), cut in any::<usize>(), sizes in any_sizes()) {
        let raw = frame.encode().unwrap().to_vec();
        let cut = 1 + cut % (raw.len() - 1);
        let err = read_all(raw[..cut].to_vec(), sizes).unwrap_err();
        prop_assert_eq!(err.kind(), IoKind::UnexpectedEof);
    }
}

#[tokio::test]
async fn test_a_frame_reads_only_as_the_version_it_was_written_in() {
    let frame = sample();
    for v in [4u8, 5] {
        let parts = frame.encode_as(v).unwrap();
        let mut bytes = parts.head.to_vec();
        bytes.extend_from_slice(&parts.payload);
        assert_eq!(bytes[3], b'0' + v);
        for want in [4u8, 5] {
            let limits = ReadLimits {
                version: want,
                ..ReadLimits::default()
            };
            let got = Frame::<PeerResp>::read_limited(&mut &bytes[..], &limits).await;
            if want == v {
                assert_eq!(got.unwrap().unwrap().0, frame);
            } else {
                let err = got.unwrap_err();
                assert_eq!(frame_error(&err), FrameError::Version { got: v, want });
            }
        }
    }
}
