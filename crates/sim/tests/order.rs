//! Writes to the same bytes reach the replicas one after the other, even when the
//! caller of the first stops waiting for it, on the simulator with drove's own
//! gateway and replicas.
use bytes::Bytes;
use drove_sim::testing::small;
use drove_types::{NodeId, ObjectId};
use std::time::Duration;

/// A write's caller gives up on it while one replica is still writing it (a write
/// of several objects that failed on another object, a write that outlived its
/// lease, a client gone). A second write of the same bytes must not go out before
/// the first has been answered by every replica: the gateway's range lock once
/// went with the first write's dropped future, the second went out beside the
/// first, and a replica could apply them in either order (a real replica serves
/// each request in a task of its own), keeping the first write's bytes under the
/// second, acknowledged one.
///
/// The simulated replica serves its requests in order, so the bytes do end right
/// here either way; what is checked is the rule: while the slow replica has not
/// answered the first write, a fast replica has not seen the second.
#[test]
fn test_a_write_given_up_by_its_caller_keeps_the_next_write_of_its_bytes_waiting() {
    let rt = drove_sim::runtime().unwrap();
    rt.block_on(async {
        let (c, vdi) = small(4).await;
        let oid = ObjectId::new(vdi.id, 1);
        let placed = drove_placement::locate_vdi(&c.map(), &vdi, oid);
        let gw = (1..=4).map(NodeId).find(|n| !placed.contains(n)).unwrap();
        let (slow, fast) = (placed[0], placed[1]);
        let generation = c.acquire("v", gw, Duration::from_secs(600)).await.unwrap();
        c.publish();
        let vdi = c.vdi("v").unwrap();
        let gateway = c.node(gw).unwrap().gateway.clone();

        // Every synced write takes the slow replica 2 s more.
        c.net.set_slow(slow, Some(Duration::from_secs(2)));
        let ones = Bytes::from(vec![1u8; 4096]);
        let first = tokio::time::timeout(
            Duration::from_millis(100),
            gateway.write(&vdi, oid, 0, ones.clone(), true, generation),
        )
        .await;
        assert!(first.is_err(), "the first write waits for the slow replica");

        let twos = Bytes::from(vec![2u8; 4096]);
        let second = {
            let (gateway, vdi) = (gateway.clone(), vdi.clone());
            let twos = twos.clone();
            tokio::spawn(async move { gateway.write(&vdi, oid, 0, twos, false, generation).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let at_fast = c.node(fast).unwrap().store.read(oid, 0, 4096).unwrap();
        assert!(
            at_fast == ones[..],
            "the second write reached node {fast} while node {slow} was still writing the first"
        );
        second.await.unwrap().unwrap();
        for &n in &placed {
            let got = c.node(n).unwrap().store.read(oid, 0, 4096).unwrap();
            assert!(got == twos[..], "node {n} does not hold the last write");
        }
    });
}
