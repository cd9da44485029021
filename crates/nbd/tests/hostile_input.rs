//! Errors and hostile input driven over an in-memory stream by a hand-written client:
//! error replies, backend errno mapping, garbage, truncation, oversized options.
mod common;

use common::client::{greet, read_opt_reply, Rep};
use common::fixture::{fixture, within, SIZE};
use drove_nbd::option::encode_option;
use drove_nbd::proto::*;
use drove_nbd::request::Command;
use drove_types::ErrorKind;
use std::io;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn test_write_beyond_end_is_refused_and_payload_skipped() {
    let fx = fixture();
    let (mut c, _h) = fx.go(false, false).await;
    // 4 KiB payload straddling the end: ENOSPC, and the stream must stay in sync.
    c.send(Command::Write, 0, 1, SIZE - 512, 4096, &[0xee; 4096])
        .await
        .unwrap();
    c.send(Command::Write, 0, 2, 0, 512, &[0x11; 512])
        .await
        .unwrap();
    c.send(Command::Read, 0, 3, 0, 512, &[]).await.unwrap();
    let mut reps = Vec::new();
    for _ in 0..3 {
        reps.push(within(c.recv()).await.unwrap());
    }
    reps.sort_by_key(|r| r.cookie());
    assert_eq!(reps[0].error(), NBD_ENOSPC);
    assert_eq!(reps[1].error(), 0);
    assert_eq!(
        reps[2],
        Rep::Simple {
            cookie: 3,
            error: 0,
            data: vec![0x11; 512]
        }
    );
    assert_eq!(fx.exports.get("d").bytes(SIZE - 512, 512), vec![0; 512]);
}

#[tokio::test]
async fn test_invalid_requests_get_einval_with_structured_error() {
    let fx = fixture();
    let (mut c, _h) = fx.go(true, false).await;
    c.send(Command::Read, 0, 1, SIZE, 1, &[]).await.unwrap();
    c.send(Command::Read, 0, 2, 0, MAX_PAYLOAD + 1, &[])
        .await
        .unwrap();
    c.send(Command::Unknown(99), 0, 3, 0, 0, &[]).await.unwrap();
    c.send(Command::Trim, NBD_CMD_FLAG_REQ_ONE, 4, 0, 512, &[])
        .await
        .unwrap();
    // No metadata context was negotiated.
    c.send(Command::BlockStatus, 0, 5, 0, 512, &[])
        .await
        .unwrap();
    for _ in 0..5 {
        match within(c.recv()).await.unwrap() {
            Rep::Chunk {
                flags,
                ty,
                payload,
                cookie,
            } => {
                assert_eq!(
                    (flags, ty),
                    (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR),
                    "cookie {cookie}"
                );
                assert_eq!(&payload[..4], &NBD_EINVAL.to_be_bytes());
                let msg_len = u16::from_be_bytes([payload[4], payload[5]]) as usize;
                assert_eq!(payload.len(), 6 + msg_len);
            }
            other => panic!("expected an error chunk, got {other:?}"),
        }
    }
    let text = fx.metrics.encode();
    assert!(
        text.contains("drove_nbd_ops_total{op=\"read\",result=\"error\"} 2"),
        "{text}"
    );
}

#[tokio::test]
async fn test_backend_errors_map_to_errno() {
    let fx = fixture();
    let (mut c, _h) = fx.go(false, false).await;
    for (kind, errno) in [
        (ErrorKind::Unavailable, NBD_EIO),
        (ErrorKind::NoSpace, NBD_ENOSPC),
    ] {
        *fx.exports.get("d").fail_reads.lock() = Some(kind);
        c.send(Command::Read, 0, 9, 0, 512, &[]).await.unwrap();
        let r = within(c.recv()).await.unwrap();
        assert_eq!(
            r,
            Rep::Simple {
                cookie: 9,
                error: errno,
                data: vec![]
            }
        );
    }
}

#[tokio::test]
async fn test_bad_request_magic_closes_the_connection() {
    let fx = fixture();
    let (mut c, h) = fx.go(true, false).await;
    c.s.write_all(&[0x55; 28]).await.unwrap();
    let mut rest = Vec::new();
    within(c.s.read_to_end(&mut rest)).await.unwrap();
    let err = within(h).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
}

#[tokio::test]
async fn test_truncated_header_or_payload_closes_the_connection() {
    let fx = fixture();
    let (mut c, h) = fx.go(false, false).await;
    c.s.write_all(&[0x25, 0x60, 0x95, 0x13, 0, 0])
        .await
        .unwrap();
    c.s.shutdown().await.unwrap();
    let err = within(h).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);

    let (mut c, h) = fx.go(false, false).await;
    c.send(Command::Write, 0, 1, 0, 4096, &[1; 100])
        .await
        .unwrap();
    c.s.shutdown().await.unwrap();
    let err = within(h).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    assert_eq!(
        fx.exports.get("d").bytes(0, 100),
        vec![0; 100],
        "half a write must not land"
    );
}

#[tokio::test]
async fn test_handshake_refuses_unknown_flags_bad_magic_and_huge_options() {
    let fx = fixture();
    let (mut s, h) = fx.connect();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).await.unwrap();
    s.write_all(&0xffff_ffffu32.to_be_bytes()).await.unwrap();
    assert!(within(h).await.unwrap().is_err());

    let (mut s, h) = fx.connect();
    greet(&mut s).await.unwrap();
    s.write_all(&[0xaa; 16]).await.unwrap();
    assert!(within(h).await.unwrap().is_err());

    let (mut s, h) = fx.connect();
    greet(&mut s).await.unwrap();
    let mut head = encode_option(NBD_OPT_GO, &[]);
    head[12..16].copy_from_slice(&0x7fff_ffffu32.to_be_bytes());
    s.write_all(&head).await.unwrap();
    assert_eq!(
        within(read_opt_reply(&mut s)).await.unwrap().0,
        NBD_REP_ERR_TOO_BIG
    );
    assert!(within(h).await.unwrap().is_err());
}

#[tokio::test]
async fn test_unknown_export_go_errors_and_negotiation_continues() {
    let fx = fixture();
    let (mut s, _h) = fx.connect();
    greet(&mut s).await.unwrap();
    let mut d = 4u32.to_be_bytes().to_vec();
    d.extend_from_slice(b"nope");
    d.extend_from_slice(&0u16.to_be_bytes());
    s.write_all(&encode_option(NBD_OPT_GO, &d)).await.unwrap();
    let (ty, msg) = within(read_opt_reply(&mut s)).await.unwrap();
    assert_eq!(ty, NBD_REP_ERR_UNKNOWN);
    assert!(String::from_utf8_lossy(&msg).contains("nope"));
    s.write_all(&encode_option(NBD_OPT_LIST, &[]))
        .await
        .unwrap();
    let (ty, d) = within(read_opt_reply(&mut s)).await.unwrap();
    assert_eq!(ty, NBD_REP_SERVER);
    assert_eq!(&d[4..5], b"d");
    assert_eq!(within(read_opt_reply(&mut s)).await.unwrap().0, NBD_REP_ACK);
    s.write_all(&encode_option(NBD_OPT_ABORT, &[]))
        .await
        .unwrap();
    assert_eq!(within(read_opt_reply(&mut s)).await.unwrap().0, NBD_REP_ACK);
}

#[tokio::test]
async fn test_stalled_handshake_times_out() {
    let fx = fixture();
    let limits = drove_nbd::Limits {
        handshake_timeout: std::time::Duration::from_millis(200),
        ..Default::default()
    };
    let server = drove_nbd::Server::new(fx.exports.clone(), fx.metrics.clone()).with_limits(limits);
    let (mut client, side) = tokio::io::duplex(4096);
    let h = tokio::spawn(async move { server.serve_connection(side, "test").await });
    greet(&mut client).await.unwrap();
    // Say nothing more.
    let err = within(h).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
}
