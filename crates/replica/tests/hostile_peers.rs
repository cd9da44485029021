//! A real peer server on 127.0.0.1 against connections that misbehave: silent,
//! stalled mid-frame, from another cluster or wire version, or too many. Each one is
//! closed (with a reason where one is owed) and the server goes on serving.
mod wire;

use bytes::Bytes;
use drove_proto::{Frame, HelloReply, PeerReq, PeerResp};
use drove_replica::ServerLimits;
use drove_types::{ClusterId, ErrorKind, NodeId};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use wire::*;

const OTHER: ClusterId = ClusterId(0xbad);

fn quick() -> ServerLimits {
    ServerLimits {
        hello: Duration::from_secs(1),
        idle: Duration::from_secs(1),
        stall: Duration::from_secs(1),
        ..ServerLimits::default()
    }
}

#[tokio::test]
async fn test_a_frame_that_stalls_is_closed_after_the_deadline() {
    let (server, addr, _task) = start(ServerLimits {
        idle: Duration::from_secs(60),
        ..quick()
    })
    .await;
    let mut s = greeted(addr).await;
    // A 1 MiB write request of which 1000 bytes arrive, then nothing.
    let req = Frame {
        id: 1,
        header: PeerReq::Ping {
            epoch: drove_types::Epoch(0),
        },
        payload: Bytes::from(vec![7u8; 1 << 20]),
    };
    s.write_all(&v4(&req)[..1000]).await.unwrap();
    let took = closed_within(&mut s, Duration::from_secs(10))
        .await
        .expect("a stalled frame must close its connection");
    assert!(took >= Duration::from_millis(900), "closed early: {took:?}");
    wait_until(
        Duration::from_secs(2),
        "the budget to be given back",
        || server.budget_in_use() == 0,
    )
    .await;
    // The server still serves.
    ping(&mut greeted(addr).await, 2).await;
}

#[tokio::test]
async fn test_silent_connections_are_closed_before_and_after_the_hello() {
    let (_server, addr, _task) = start(quick()).await;
    let mut after = greeted(addr).await;
    ping(&mut after, 1).await;
    let took = closed_within(&mut after, Duration::from_secs(10))
        .await
        .expect("an idle connection must be closed");
    assert!(took >= Duration::from_millis(900), "idle: closed early");
    let mut before = TcpStream::connect(addr).await.unwrap();
    let took = closed_within(&mut before, Duration::from_secs(10))
        .await
        .expect("a connection without a hello must be closed");
    assert!(took >= Duration::from_millis(900), "no hello: closed early");
}

#[tokio::test]
async fn test_a_hello_from_another_cluster_is_refused_logged_and_closed() {
    let (logs, _guard) = Logs::capture();
    let (_server, addr, _task) = start(ServerLimits::default()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&hello_bytes(OTHER)).await.unwrap();
    let (reply, _) = read_v4::<HelloReply, _>(&mut s).await.unwrap().unwrap();
    let HelloReply::Refused(why) = reply.header else {
        panic!("welcomed another cluster: {reply:?}");
    };
    assert!(
        why.contains(&CLUSTER.to_hex()) && why.contains(&OTHER.to_hex()),
        "{why}"
    );
    assert!(closed_within(&mut s, Duration::from_secs(5))
        .await
        .is_some());
    let log = logs.text();
    assert!(
        log.contains("refused a peer connection") && log.contains(&OTHER.to_hex()),
        "{log}"
    );
    // A pool of the other cluster gets the reason as its error.
    let err = pool_for(OTHER, addr)
        .call(
            NodeId(1),
            PeerReq::Ping {
                epoch: drove_types::Epoch(0),
            },
            Bytes::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "Node 1 at {addr} refused us: it belongs to cluster {CLUSTER}"
        )),
        "{msg}"
    );
    // A pool of the right cluster is served.
    pool_for(CLUSTER, addr)
        .call(
            NodeId(1),
            PeerReq::Ping {
                epoch: drove_types::Epoch(0),
            },
            Bytes::new(),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn test_a_frame_over_the_hello_limit_is_refused_unread() {
    let (server, addr, _task) = start(ServerLimits::default()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    // A well-formed 1 MiB request instead of a hello: closed after its prefix.
    let req = Frame {
        id: 1,
        header: PeerReq::Ping {
            epoch: drove_types::Epoch(0),
        },
        payload: Bytes::from(vec![1u8; 1 << 20]),
    };
    let _ = s.write_all(&v4(&req)).await;
    assert!(closed_within(&mut s, Duration::from_secs(5))
        .await
        .is_some());
    assert_eq!(server.budget_in_use(), 0);
}

#[tokio::test]
async fn test_connections_over_the_cap_are_closed_at_once() {
    let (logs, _guard) = Logs::capture();
    let (_server, addr, _task) = start(ServerLimits {
        max_conns: 2,
        ..ServerLimits::default()
    })
    .await;
    let mut a = greeted(addr).await;
    let mut b = greeted(addr).await;
    let mut over = TcpStream::connect(addr).await.unwrap();
    // Closed long before the 10 s a connection has to say hello.
    assert!(closed_within(&mut over, Duration::from_secs(3))
        .await
        .is_some());
    assert!(
        logs.text()
            .contains("closing new connections: 2 connections open"),
        "{}",
        logs.text()
    );
    ping(&mut a, 1).await;
    ping(&mut b, 2).await;
    // A slot comes back when a connection ends.
    drop(a);
    let mut c = loop {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&hello_bytes(CLUSTER)).await.unwrap();
        if let Ok(Some(_)) = read_v4::<HelloReply, _>(&mut s).await {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    ping(&mut c, 3).await;
}

#[tokio::test]
async fn test_a_version_1_node_is_refused_with_an_error_it_can_read() {
    let (logs, _guard) = Logs::capture();
    let (_server, addr, _task) = start(ServerLimits::default()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    // What a version-1 node sends: a request straight away, magic "DRV1".
    let mut req = Frame {
        id: 77,
        header: PeerReq::Ping {
            epoch: drove_types::Epoch(0),
        },
        payload: Bytes::new(),
    }
    .encode()
    .unwrap()
    .to_vec();
    req[3] = b'1';
    s.write_all(&req).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_end(&mut s, &mut answer),
    )
    .await
    .expect("answered and closed")
    .unwrap();
    assert_eq!(&answer[..4], b"DRV1", "in version 1's format");
    // Version 1's layout is this version's but for the version digit.
    answer[3] = b'0' + V4;
    let (resp, _) = read_v4::<PeerResp, _>(&mut &answer[..])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.id, 77, "answers the request's id");
    let PeerResp::Err(e) = resp.header else {
        panic!("not an error: {resp:?}");
    };
    assert!(
        e.msg.contains("versions 4-5, you speak version 1"),
        "{}",
        e.msg
    );
    let log = logs.text();
    assert!(
        log.contains("Peer speaks drove wire version 1, this node speaks versions 4-5"),
        "{log}"
    );
}

#[tokio::test]
async fn test_a_hello_frame_of_another_version_is_refused_naming_both() {
    let (_server, addr, _task) = start(ServerLimits::default()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut hello = hello_bytes(CLUSTER).to_vec();
    hello[3] = b'7';
    s.write_all(&hello).await.unwrap();
    let (reply, _) = read_v4::<HelloReply, _>(&mut s).await.unwrap().unwrap();
    let HelloReply::Refused(why) = reply.header else {
        panic!("welcomed a hello of version 7's layout");
    };
    assert!(
        why.contains("wire version 7, this node speaks versions 4-5"),
        "{why}"
    );
}

#[tokio::test]
async fn test_a_node_of_no_common_version_is_refused_logged_naming_both_ranges() {
    let (logs, _guard) = Logs::capture();
    let (_server, addr, _task) = start(ServerLimits::default()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    // A future node that speaks versions 6-7: its hello, in the frozen layout.
    let hello = Frame {
        id: 0,
        header: drove_proto::Hello {
            version: 6,
            cluster: CLUSTER,
            node: NodeId(9),
        },
        payload: Bytes::from_static(&[6, 7]),
    };
    s.write_all(&v4(&hello)).await.unwrap();
    let (reply, _) = read_v4::<HelloReply, _>(&mut s).await.unwrap().unwrap();
    let HelloReply::Refused(why) = reply.header else {
        panic!("welcomed a node of versions 6-7");
    };
    let want = "this node speaks drove wire versions 4-5, node 9 speaks 6-7";
    assert!(why.contains(want), "{why}");
    assert!(closed_within(&mut s, Duration::from_secs(5))
        .await
        .is_some());
    let log = logs.text();
    assert!(log.contains(want), "{log}");
}

#[tokio::test]
async fn test_the_client_names_a_peer_that_speaks_another_version_or_hangs_up() {
    // A node that broke the hello's frozen layout answers in its own format; a
    // version-1 node hangs up.
    for (answer, want) in [
        (
            &b"DRV7\0\0\0\x20\0\0\0\0"[..],
            "answered our hello in drove wire version 7, this node speaks versions 4-5",
        ),
        (
            &b""[..],
            "closed the connection without answering our hello",
        ),
    ] {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 256];
            let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
            let _ = s.write_all(answer).await;
        });
        let err = pool_for(CLUSTER, addr)
            .call(
                NodeId(1),
                PeerReq::Ping {
                    epoch: drove_types::Epoch(0),
                },
                Bytes::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert!(err.to_string().contains(want), "{err}");
    }
}

/// MendRead is a request of wire version 5: a node that said hello as a node of
/// version 4 and then sends one (no real version-4 node can) is answered with an
/// error naming both versions, logged, and nothing is read; the connection stays
/// up for the requests its version has.
#[tokio::test]
async fn test_a_mend_read_on_a_version_4_connection_is_refused() {
    let (logs, _guard) = Logs::capture();
    let (_server, addr, _task) = start(ServerLimits::default()).await;
    let mut s = greeted(addr).await;
    let mend = Frame {
        id: 7,
        header: PeerReq::MendRead {
            oid: drove_types::ObjectId::new(drove_types::VdiId(1), 0),
            offset: 0,
            len: 4096,
            epoch: drove_types::Epoch(0),
        },
        payload: Bytes::new(),
    };
    s.write_all(&v4(&mend)).await.unwrap();
    let (resp, _) = read_v4::<PeerResp, _>(&mut s).await.unwrap().unwrap();
    assert_eq!(resp.id, 7);
    let PeerResp::Err(e) = resp.header else {
        panic!("answered a mend_read on a version-4 connection: {resp:?}");
    };
    assert_eq!(e.kind, ErrorKind::Invalid, "{e:?}");
    let want = "mend_read is a request of drove wire version 5, this connection speaks version 4";
    assert!(e.msg.contains(want), "{}", e.msg);
    assert!(resp.payload.is_empty());
    ping(&mut s, 8).await;
    let log = logs.text();
    assert!(log.contains(want), "{log}");
}
