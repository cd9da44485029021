//! Tests of the hello's decisions: ranges, clusters, a reused address.
use super::*;

const A: ClusterId = ClusterId(0xaaaa);
const B: ClusterId = ClusterId(0xbbbb);

fn speaker(cluster: ClusterId, node: u32, min: u8, max: u8) -> Speaker {
    Speaker {
        cluster,
        node: NodeId(node.into()),
        wire: WireRange { min, max },
    }
}

/// The whole exchange: the client's hello, the server's answer, the client's check.
fn exchange(client: &Speaker, server: &Speaker) -> (Answer, Result<u8, String>) {
    let (hello, payload) = client.hello();
    let answer = server.answer(&hello, &payload);
    let checked = client.check_reply(server.node, &answer.reply, &answer.payload);
    (answer, checked)
}

#[test]
fn test_same_cluster_talks_the_highest_version_both_speak() {
    let (a, ok) = exchange(&Speaker::new(A, NodeId(1)), &Speaker::new(A, NodeId(2)));
    assert_eq!(a.version, Some(WireRange::BUILD.max));
    assert_eq!(ok, Ok(WireRange::BUILD.max));
    // A node pretending to be of version 4 alone, either way round.
    let old = speaker(A, 1, 4, 4);
    let new = speaker(A, 2, 4, 5);
    assert_eq!(exchange(&old, &new).1, Ok(4));
    assert_eq!(exchange(&new, &old).1, Ok(4));
}

#[test]
fn test_a_version_4_node_sees_the_hello_it_always_saw() {
    // The dialling node names its oldest version and sends the range as payload;
    // a version-4 server compares the version alone and ignores the payload.
    let (hello, payload) = speaker(A, 1, 4, 5).hello();
    assert_eq!(hello.version, 4);
    assert_eq!(payload, vec![4, 5]);
    // A node of version 4 alone sends what version 4 sent: no payload.
    assert!(speaker(A, 1, 4, 4).hello().1.is_empty());
    // Welcoming a version-4 node, the server's hello says version 4, which is what
    // a version-4 client checks for.
    let a = speaker(A, 2, 4, 5).answer(&speaker(A, 1, 4, 4).hello().0, &[]);
    let HelloReply::Welcome(h) = a.reply else {
        panic!("refused a version-4 node: {a:?}");
    };
    assert_eq!(h.version, 4);
}

#[test]
fn test_ranges_that_do_not_overlap_are_refused_naming_both() {
    let old = speaker(A, 1, 4, 4);
    let new = speaker(A, 2, 5, 5);
    let (a, err) = exchange(&old, &new);
    let HelloReply::Refused(why) = &a.reply else {
        panic!("welcomed a node of no common version: {a:?}");
    };
    assert!(
        why.contains("this node speaks drove wire versions 5-5, node 1 speaks 4-4"),
        "{why}"
    );
    assert!(err.unwrap_err().starts_with("refused us: this node speaks"));
    // The other way round, the client names both too, even before the server.
    let (hello, payload) = new.hello();
    let reply = HelloReply::Welcome(Hello {
        version: 4,
        ..hello
    });
    let err = new.check_reply(NodeId(1), &reply, &[]).unwrap_err();
    assert_eq!(err, "speaks drove wire versions 4-4, this node speaks 5-5");
    assert!(!payload.is_empty());
}

#[test]
fn test_a_server_choosing_another_version_than_the_highest_is_refused() {
    let client = speaker(A, 1, 4, 5);
    let reply = HelloReply::Welcome(Hello {
        version: 4,
        cluster: A,
        node: NodeId(2),
    });
    let err = client
        .check_reply(NodeId(2), &reply, &WireRange::BUILD.encode())
        .unwrap_err();
    assert!(err.contains("highest both speak is 5"), "{err}");
}

#[test]
fn test_a_range_not_beginning_at_the_hello_version_is_refused() {
    let server = speaker(A, 2, 4, 5);
    let (hello, _) = speaker(A, 1, 4, 5).hello();
    let a = server.answer(&hello, &[5, 5]);
    assert_eq!(a.version, None);
    let HelloReply::Refused(why) = a.reply else {
        panic!("welcomed");
    };
    assert!(
        why.contains("announced wire versions 5-5 in a hello of version 4"),
        "{why}"
    );
}

#[test]
fn test_another_cluster_is_refused_naming_both() {
    let server = Speaker::new(A, NodeId(2));
    let client = Speaker::new(B, NodeId(1));
    let (a, err) = exchange(&client, &server);
    let HelloReply::Refused(why) = &a.reply else {
        panic!("welcomed another cluster");
    };
    assert!(
        why.contains(&A.to_hex()) && why.contains(&B.to_hex()),
        "{why}"
    );
    let err = err.unwrap_err();
    assert!(
        err.starts_with("refused us: it belongs to cluster"),
        "{err}"
    );
    // A server that welcomes anyone is still caught by the client.
    let welcome = HelloReply::Welcome(Hello {
        version: 5,
        cluster: A,
        node: NodeId(2),
    });
    let err = client
        .check_reply(NodeId(2), &welcome, &WireRange::BUILD.encode())
        .unwrap_err();
    assert!(err.contains(&A.to_hex()), "{err}");
}

#[test]
fn test_a_reused_address_answering_as_another_node_is_refused() {
    let client = Speaker::new(A, NodeId(1));
    let (a, _) = exchange(&client, &Speaker::new(A, NodeId(5)));
    let err = client
        .check_reply(NodeId(2), &a.reply, &a.payload)
        .unwrap_err();
    assert_eq!(err, "answered as node 5");
}
