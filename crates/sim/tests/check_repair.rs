//! `vdi check --repair` and a client writing the VDI at the same time, on the
//! simulator with drove's own volume, lock service, recovery and replicas.
use bytes::Bytes;
use drove_sim::testing::{attached, first_write, small, OBJECT};
use drove_types::{NodeId, ObjectId};
use std::time::Duration;

/// An operator repairs a VDI whose copies differ while no client has it, and a
/// client attaches and writes during the repair. The repair replaces a copy with
/// another one's (fetched, then written); a write that reached the copy between
/// the two was overwritten there, acknowledged, while the other copies kept it.
/// The repair now holds the VDI's write lock while it runs: the write waits for
/// it (or fails), and an acknowledged write is on every copy.
///
/// The repair runs on the client's node and on another one; it starts at several
/// delays after the client begins to write (which takes the lock first).
#[test]
fn test_a_write_during_a_check_repair_is_kept_on_every_copy() {
    for same_node in [false, true] {
        for us in (0..40).map(|i| i * 500) {
            repair_while_writing(same_node, Duration::from_micros(us));
        }
    }
}

fn repair_while_writing(same_node: bool, delay: Duration) {
    let rt = drove_sim::runtime().unwrap();
    rt.block_on(async {
        let (c, vdi) = small(4).await;
        let os = OBJECT;
        let oid = ObjectId::new(vdi.id, 1);
        let placed = drove_placement::locate_vdi(&c.map(), &vdi, oid);
        let gw = (1..=4).map(NodeId).find(|n| !placed.contains(n)).unwrap();
        let checker = if same_node { gw } else { placed[1] };
        let v = attached(&c, &vdi, gw);
        first_write(&c, &v, u64::from(os), Bytes::from(vec![1u8; os as usize])).await;
        // The client goes; its lock is released.
        v.detach();
        tokio::time::sleep(Duration::from_secs(2)).await;
        c.publish();
        let vdi = c.vdi("v").unwrap();
        assert!(
            c.with_state(|s| !s.locks.contains_key(&vdi.id)),
            "the lock was released at detach"
        );

        // One copy differs (as a gateway crash mid-write leaves it): the repair
        // makes the others take it.
        let odd = c.node(placed[0]).unwrap();
        odd.store.write(oid, 0, &[9u8; 4096]).unwrap();

        v.attach();
        let fives = Bytes::from(vec![5u8; 4096]);
        let write = {
            let (v, fives) = (v.clone(), fives.clone());
            tokio::spawn(async move { v.write(u64::from(os), fives, true).await })
        };
        tokio::time::sleep(delay).await;
        let repair = {
            let n = c.node(checker).unwrap();
            let vdi = vdi.clone();
            tokio::spawn(async move { n.locks.check_and_repair(&n.recoverer, &vdi).await })
        };
        let wrote = write.await.unwrap();
        let repaired = match repair.await.unwrap() {
            Ok(report) => {
                assert_eq!(report.mismatched.len(), 1, "{report:?}");
                assert!(report.mismatched[0].repaired, "{report:?}");
                true
            }
            // The client took the lock first: the repair is refused.
            Err(e) if e.kind() == drove_types::ErrorKind::Locked => false,
            Err(e) => panic!("repair on node {checker}, {delay:?} after the client began: {e}"),
        };
        eprintln!(
            "repair on node {checker}, {delay:?} after the client began: repaired {repaired}, write {:?}",
            wrote.as_ref().map_err(|e| e.to_string())
        );
        if wrote.is_err() {
            // Refused while the repair held the lock: it writes once it is done.
            tokio::time::sleep(Duration::from_secs(1)).await;
            v.write(u64::from(os), fives.clone(), true).await.unwrap();
        }
        v.detach();
        tokio::time::sleep(Duration::from_secs(2)).await;
        for &n in &placed {
            let got = c.node(n).unwrap().store.read(oid, 0, 4096).unwrap();
            assert!(
                got == fives[..],
                "repair on node {checker} (the client's: {same_node}), begun {delay:?} \
                 after the client's write: node {n}'s copy lost the acknowledged write (holds {})",
                got[0]
            );
        }
    });
}
