//! Real pools and servers of different wire ranges: a pair that shares a version
//! talks the highest one both speak, in both directions; a pair that shares none is
//! refused with an error that names both ranges.
mod wire;

use bytes::Bytes;
use drove_proto::{PeerReq, PeerResp, WireRange};
use drove_replica::ServerLimits;
use drove_types::{Epoch, ErrorKind, NodeId};
use wire::*;

fn range(min: u8, max: u8) -> WireRange {
    WireRange { min, max }
}

fn ping() -> PeerReq {
    PeerReq::Ping { epoch: Epoch(0) }
}

#[tokio::test]
async fn test_pairs_that_share_a_version_talk_the_highest() {
    for (server, client, want) in [
        (range(4, 5), range(4, 5), 5),
        (range(4, 4), range(4, 5), 4),
        (range(4, 5), range(4, 4), 4),
        (range(5, 5), range(4, 5), 5),
    ] {
        let (_server, addr, _task) = start_speaking(ServerLimits::default(), server).await;
        let pool = pool_speaking(CLUSTER, addr, client);
        for _ in 0..3 {
            let (resp, _) = pool.call(SERVER, ping(), Bytes::new()).await.unwrap();
            assert!(matches!(resp, PeerResp::Pong { .. }), "{resp:?}");
        }
        assert_eq!(
            pool.wire_version(SERVER),
            Some(want),
            "server {server}, client {client}"
        );
    }
}

#[tokio::test]
async fn test_pairs_that_share_no_version_are_refused_naming_both_ranges() {
    for (server, client, want) in [
        (
            range(5, 5),
            range(4, 4),
            "refused us: this node speaks drove wire versions 5-5, node 2 speaks 4-4",
        ),
        (
            range(4, 4),
            range(5, 5),
            "refused us: this node speaks drove wire versions 4-4, node 2 speaks 5-5",
        ),
    ] {
        let (logs, _guard) = Logs::capture();
        let (_server, addr, _task) = start_speaking(ServerLimits::default(), server).await;
        let pool = pool_speaking(CLUSTER, addr, client);
        let err = pool.call(SERVER, ping(), Bytes::new()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert!(err.to_string().contains(want), "{err}");
        assert_eq!(pool.wire_version(NodeId(1)), None);
        // Both sides log it: the server as it refuses, the client as it is refused.
        let log = logs.text();
        assert!(log.contains("refused a peer connection"), "{log}");
        assert!(log.contains("peer connection refused"), "{log}");
        assert!(
            log.matches(&want["refused us: ".len()..]).count() >= 2,
            "{log}"
        );
    }
}
