//! What this version answers a node of wire version 1, which sends requests without
//! a hello and refuses any frame that does not begin "DRV1".
//!
//! Version 1 frames have this version's layout with the version byte '1', and a
//! version-1 node decodes an answer as its `PeerResp`, whose `Err(WireError)` is
//! encoded exactly as today's [`PeerResp::Err`] (a test pins the bytes). So the
//! refusal reaches the old node's caller as an ordinary error naming both versions,
//! instead of a connection that closes for no visible reason.
use bytes::Bytes;
use drove_types::ErrorKind;

use crate::frame::{Frame, FrameError};
use crate::{PeerResp, WireError, WireRange};

/// The wire version of the nodes this module answers.
pub const V1: u8 = 1;

/// A version-1 error answer to request `id` from a node that speaks `mine`,
/// naming both.
pub fn v1_refusal(id: u64, mine: WireRange) -> Result<Bytes, FrameError> {
    let msg = format!(
        "Refused: this node speaks drove wire versions {mine}, you speak version {V1}: \
         mixed versions during an upgrade?"
    );
    let frame = Frame {
        id,
        header: PeerResp::Err(WireError {
            kind: ErrorKind::Invalid,
            msg,
        }),
        payload: Bytes::new(),
    };
    let parts = frame.encode_as(V1)?;
    Ok(parts.head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_v1_refusal_has_the_v1_layout_and_peer_resp_err_encoding() {
        let bytes = v1_refusal(0x0102_0304_0506_0708, WireRange::BUILD).unwrap();
        assert_eq!(&bytes[..4], b"DRV1");
        let body_len = u32::from_be_bytes(bytes[4..8].try_into().unwrap()) as usize;
        assert_eq!(body_len, bytes.len() - 12);
        let crc = u32::from_be_bytes(bytes[8..12].try_into().unwrap());
        assert_eq!(
            crc,
            crc32c::crc32c(&bytes[12..]),
            "v1 checks the whole body"
        );
        assert_eq!(&bytes[12..20], &[1, 2, 3, 4, 5, 6, 7, 8], "request id");
        let hlen = u32::from_be_bytes(bytes[20..24].try_into().unwrap()) as usize;
        assert_eq!(hlen, bytes.len() - 24, "no payload");
        let header = &bytes[24..];
        // Pinned: postcard variant 6 (PeerResp::Err), ErrorKind variant 6 (Invalid),
        // then the message as a varint length and UTF-8. Version-1 nodes decode
        // exactly this; if it changes, the refusal no longer reaches them.
        assert_eq!(header[0], 6, "PeerResp::Err");
        assert_eq!(header[1], 6, "ErrorKind::Invalid");
        let msg = std::str::from_utf8(&header[3..]).unwrap();
        assert_eq!(usize::from(header[2]), msg.len(), "one-byte varint length");
        assert!(
            msg.contains("versions 4-5, you speak version 1"),
            "message names both versions: {msg}"
        );
    }
}
