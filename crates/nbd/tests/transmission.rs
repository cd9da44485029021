//! The transmission phase driven over an in-memory stream by a hand-written client:
//! concurrency and reply order, flush ordering, block status, both handshake paths.
mod common;

use common::client::{Client, Rep};
use common::fixture::{fixture, within, SIZE};
use common::BLK;
use drove_nbd::proto::*;
use drove_nbd::request::Command;
use std::time::Duration;
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn test_replies_come_back_out_of_order() {
    let fx = fixture();
    *fx.exports.get("d").slow_at.lock() = Some((0, Duration::from_millis(300)));
    let (mut c, _h) = fx.go(true, false).await;
    c.send(Command::Read, 0, 1, 0, 4096, &[]).await.unwrap();
    c.send(Command::Read, 0, 2, 4096, 4096, &[]).await.unwrap();
    let first = within(c.recv()).await.unwrap();
    let second = within(c.recv()).await.unwrap();
    assert_eq!(
        (first.cookie(), second.cookie()),
        (2, 1),
        "the fast read must not wait"
    );
    match second {
        Rep::Chunk {
            flags, ty, payload, ..
        } => {
            assert_eq!(
                (flags, ty),
                (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_OFFSET_DATA)
            );
            assert_eq!(&payload[..8], &0u64.to_be_bytes());
            assert_eq!(payload.len(), 8 + 4096);
        }
        other => panic!("expected OFFSET_DATA, got {other:?}"),
    }
}

#[tokio::test]
async fn test_flush_waits_for_writes_received_before_it() {
    let fx = fixture();
    let disk = fx.exports.get("d");
    *disk.slow_at.lock() = Some((0, Duration::from_millis(300)));
    let (mut c, _h) = fx.go(false, false).await;
    c.send(Command::Write, 0, 1, 0, 4096, &[7; 4096])
        .await
        .unwrap();
    c.send(Command::Flush, 0, 2, 0, 0, &[]).await.unwrap();
    let a = within(c.recv()).await.unwrap();
    let b = within(c.recv()).await.unwrap();
    assert_eq!(
        (a.cookie(), b.cookie()),
        (1, 2),
        "flush replied before the write finished"
    );
    assert_eq!((a.error(), b.error()), (0, 0));
    assert_eq!(
        *disk.flushes.lock(),
        vec![1],
        "flush ran before the write completed"
    );
    assert_eq!(disk.bytes(0, 4), vec![7; 4]);
}

#[tokio::test]
async fn test_block_status_reports_holes_and_data() {
    let fx = fixture();
    let (mut c, _h) = fx.go(true, true).await;
    c.send(
        Command::Write,
        0,
        1,
        BLK,
        2 * BLK as u32,
        &[1; 2 * BLK as usize],
    )
    .await
    .unwrap();
    assert_eq!(within(c.recv()).await.unwrap().error(), 0);
    c.send(Command::BlockStatus, 0, 2, 0, 8 * BLK as u32, &[])
        .await
        .unwrap();
    let Rep::Chunk {
        flags, ty, payload, ..
    } = within(c.recv()).await.unwrap()
    else {
        panic!("block status needs a structured reply");
    };
    assert_eq!(
        (flags, ty),
        (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS)
    );
    let words: Vec<u32> = payload
        .chunks(4)
        .map(|w| u32::from_be_bytes(w.try_into().unwrap()))
        .collect();
    let hz = NBD_STATE_HOLE | NBD_STATE_ZERO;
    assert_eq!(
        words,
        vec![BASE_ALLOCATION_ID, 4096, hz, 8192, 0, 5 * 4096, hz]
    );

    c.send(
        Command::BlockStatus,
        NBD_CMD_FLAG_REQ_ONE,
        3,
        BLK,
        8 * BLK as u32,
        &[],
    )
    .await
    .unwrap();
    let Rep::Chunk { payload, .. } = within(c.recv()).await.unwrap() else {
        panic!()
    };
    assert_eq!(payload.len(), 12, "REQ_ONE gives exactly one descriptor");
}

#[tokio::test]
async fn test_export_name_path_with_simple_replies() {
    let fx = fixture();
    let (s, _h) = fx.connect();
    let mut c = Client::export_name(s, "d").await.unwrap();
    assert_eq!(c.size, SIZE);
    let expect =
        NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA | NBD_FLAG_CAN_MULTI_CONN;
    assert_eq!(c.flags & expect, expect);
    assert_eq!(c.flags & NBD_FLAG_SEND_DF, 0, "DF needs structured replies");
    c.send(Command::Write, NBD_CMD_FLAG_FUA, 1, 100, 3, b"abc")
        .await
        .unwrap();
    assert_eq!(within(c.recv()).await.unwrap().error(), 0);
    c.send(Command::Read, 0, 2, 99, 5, &[]).await.unwrap();
    assert_eq!(
        within(c.recv()).await.unwrap(),
        Rep::Simple {
            cookie: 2,
            error: 0,
            data: b"\0abc\0".to_vec()
        }
    );
    c.send(
        Command::WriteZeroes,
        NBD_CMD_FLAG_FAST_ZERO,
        3,
        0,
        4096,
        &[],
    )
    .await
    .unwrap();
    c.send(Command::Cache, 0, 4, 0, 4096, &[]).await.unwrap();
    for _ in 0..2 {
        assert_eq!(within(c.recv()).await.unwrap().error(), 0);
    }
    assert_eq!(fx.exports.get("d").bytes(100, 3), vec![0; 3]);
}

#[tokio::test]
async fn test_disc_finishes_in_flight_requests_then_closes() {
    let fx = fixture();
    *fx.exports.get("d").slow_at.lock() = Some((0, Duration::from_millis(200)));
    let (mut c, h) = fx.go(false, false).await;
    c.send(Command::Write, 0, 1, 0, 8, &[5; 8]).await.unwrap();
    c.send(Command::Disc, 0, 2, 0, 0, &[]).await.unwrap();
    assert_eq!(
        within(c.recv()).await.unwrap(),
        Rep::Simple {
            cookie: 1,
            error: 0,
            data: vec![]
        }
    );
    let mut rest = Vec::new();
    within(c.s.read_to_end(&mut rest)).await.unwrap();
    assert!(rest.is_empty());
    within(h).await.unwrap().unwrap();
    assert_eq!(fx.exports.get("d").bytes(0, 8), vec![5; 8]);
}

#[tokio::test]
async fn test_many_concurrent_requests_are_bounded_and_all_answered() {
    let fx = fixture();
    let (mut c, _h) = fx.go(true, false).await;
    // More requests than the in-flight limit, each with a distinct pattern.
    for i in 0..200u64 {
        let off = (i % 256) * BLK;
        c.send(
            Command::Write,
            0,
            i,
            off,
            BLK as u32,
            &[i as u8; BLK as usize],
        )
        .await
        .unwrap();
    }
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let r = within(c.recv()).await.unwrap();
        assert_eq!(r.error(), 0);
        assert!(seen.insert(r.cookie()), "duplicate reply");
    }
    assert_eq!(seen.len(), 200);
    assert_eq!(fx.exports.get("d").bytes(199 * BLK, 4), vec![199; 4]);
}

#[tokio::test]
async fn test_tight_limits_still_answer_everything() {
    let fx = fixture();
    let limits = drove_nbd::Limits {
        max_requests: 1,
        max_buffered_bytes: 1024,
        ..Default::default()
    };
    let server = drove_nbd::Server::new(fx.exports.clone(), fx.metrics.clone()).with_limits(limits);
    let (client, side) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move { server.serve_connection(side, "test").await });
    let mut c = Client::go(client, "d", true, false).await.unwrap();
    // Writes larger than the whole byte budget, and more of them than the slot limit.
    for i in 0..8u64 {
        c.send(Command::Write, 0, i, i * 8192, 8192, &[i as u8 + 1; 8192])
            .await
            .unwrap();
    }
    c.send(Command::Read, 0, 100, 7 * 8192, 8192, &[])
        .await
        .unwrap();
    let mut last = None;
    for _ in 0..9 {
        let r = within(c.recv()).await.unwrap();
        assert_eq!(r.error(), 0);
        last = Some(r);
    }
    match last {
        Some(Rep::Chunk {
            cookie: 100,
            payload,
            ..
        }) => assert_eq!(&payload[8..], &[8u8; 8192][..]),
        other => panic!("expected the read last (one slot serializes), got {other:?}"),
    }
}
