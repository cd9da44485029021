//! Golden files of the peer protocol: frames the previous release (5def163, wire
//! version 4) wrote, checked in as bytes (tests/golden/peer_v4.txt). This build
//! must read each as the same message in version 4, and write the same bytes when
//! it talks version 4, or a node of the last release could no longer talk to it.
use bytes::Bytes;
use drove_proto::{Frame, Hello, HelloReply, PeerReq, PeerResp, ReadLimits};
use drove_types::{ClusterId, Epoch, NodeId, ObjectId, VdiId};
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;

const GOLDEN: &str = include_str!("golden/peer_v4.txt");

fn golden(name: &str) -> Vec<u8> {
    let hex = GOLDEN
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('\t'))
        .unwrap_or_else(|| panic!("no golden frame {name}"));
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// `name`'s bytes read as one frame of version 4 with nothing left over, and
/// `want` written in version 4 as exactly those bytes.
fn check<H: Serialize + DeserializeOwned + PartialEq + Debug>(name: &str, want: Frame<H>) {
    let bytes = golden(name);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let limits = ReadLimits {
        version: 4,
        ..ReadLimits::default()
    };
    let mut r = &bytes[..];
    let (got, used) = rt
        .block_on(Frame::<H>::read_limited(&mut r, &limits))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .unwrap_or_else(|| panic!("{name}: no frame"));
    assert_eq!(used, bytes.len(), "{name}: the whole frame");
    assert_eq!(got, want, "{name}");
    let written = want.encode_as(4).unwrap();
    assert_eq!(
        [&written.head[..], &written.payload[..]].concat(),
        bytes,
        "{name}: written in version 4 as the last release wrote it"
    );
}

#[test]
fn test_the_last_releases_hello_and_its_answers_read_and_write_as_before() {
    let cluster = ClusterId(0x5e77e7);
    let hello = |node| Hello {
        version: 4,
        cluster,
        node: NodeId(node),
    };
    fn frame<H>(header: H) -> Frame<H> {
        Frame {
            id: 0,
            header,
            payload: Bytes::new(),
        }
    }
    check("hello", frame(hello(9)));
    check("welcome", frame(HelloReply::Welcome(hello(1))));
    check("refused", frame(HelloReply::Refused("no".into())));
}

#[test]
fn test_the_last_releases_requests_and_answers_read_and_write_as_before() {
    check(
        "read",
        Frame {
            id: 42,
            header: PeerReq::Read {
                oid: ObjectId::new(VdiId(7), 3),
                offset: 4096,
                len: 8,
                epoch: Epoch(5),
            },
            payload: Bytes::new(),
        },
    );
    check(
        "data",
        Frame {
            id: 42,
            header: PeerResp::Data,
            payload: Bytes::from_static(b"drove v4"),
        },
    );
}
