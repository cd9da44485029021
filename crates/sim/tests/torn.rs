//! A failed write's objects are made identical on every replica before the lock is
//! given up ([`drove_volume::Volume`]'s mend of torn objects), on the simulator with
//! drove's own volume, gateway and replicas.
use bytes::Bytes;
use drove_sim::testing::{attached, first_write, small, OBJECT};
use drove_types::{NodeId, ObjectId};
use std::time::Duration;

/// A write failed on a full disk (ENOSPC on one replica): its object is torn. The
/// client detaches, so the volume mends the object (reads it from one replica,
/// writes it whole to all), and a client attaches again at once and writes the
/// object. Its acknowledged write must survive the mend: the mend once read the
/// older bytes before that write and wrote them back after it, on every replica
/// (e2e_heal's full-disk test lost an acknowledged 4 MiB so on a busy machine).
///
/// The new client writes at several delays after the detach, so that some write
/// lands between the mend's read and its write back.
#[test]
fn test_a_write_acknowledged_while_the_last_client_s_detach_mends_is_kept() {
    for us in [0, 100, 200, 300, 500, 700, 1000, 1500, 2000, 3000, 5000] {
        mend_then_write(Duration::from_micros(us));
    }
}

fn mend_then_write(delay: Duration) {
    let rt = drove_sim::runtime().unwrap();
    rt.block_on(async {
        let (c, vdi) = small(4).await;
        let os = OBJECT;
        // The client's node holds no copy of the object: the mend reads it over the
        // network, and a write can come between its read and its write back.
        let oid = ObjectId::new(vdi.id, 1);
        let placed = drove_placement::locate_vdi(&c.map(), &vdi, oid);
        let gw = (1..=4).map(NodeId).find(|n| !placed.contains(n)).unwrap();
        let full = placed[2];
        let v = attached(&c, &vdi, gw);
        first_write(&c, &v, 0, Bytes::from(vec![1u8; os as usize])).await;

        // One replica's disk is full: a write that needs new space there fails.
        let mem = c.node(full).unwrap().mem.clone().expect("a memory disk");
        mem.set_capacity(Some(mem.blocks_used()));
        let second = u64::from(os);
        let e = v
            .write(second, Bytes::from(vec![2u8; os as usize]), true)
            .await
            .expect_err("a write onto a full disk fails");
        assert_eq!(e.kind(), drove_types::ErrorKind::NoSpace, "{e}");
        mem.set_capacity(None);

        // The client goes (the mend starts), another comes at once and writes.
        v.detach();
        v.attach();
        tokio::time::sleep(delay).await;
        let new = Bytes::from(vec![3u8; os as usize]);
        v.write(second, new.clone(), true).await.unwrap();
        // Let the mend run out, whatever it does.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let got = v.read(second, os).await.unwrap();
        assert!(
            got == new,
            "written {delay:?} after the detach: the acknowledged write was overwritten by the mend"
        );
        for &n in &placed {
            let store = &c.node(n).unwrap().store;
            let buf = store.read(oid, 0, os).unwrap();
            assert!(
                buf == new[..],
                "written {delay:?} after the detach: node {n}'s copy lost the acknowledged write"
            );
        }
    });
}
